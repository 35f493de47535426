"""Files a pack writes take the process umask like any other file (issue 31): the manifest, the shards
and zarr files, and the `inspect` PNG, under umask 022 and 027."""

from __future__ import annotations

import os
import stat

import numpy as np
import pytest
from sample_fields import poisson_fields

import dctdata
from dctdata.format.atomic import atomic_write
from dctdata.preprocess.inspect import inspect_dataset


@pytest.fixture(params=[0o022, 0o027])
def umask(request):
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


def _modes(root) -> dict[str, int]:
    out = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = os.path.join(dirpath, name)
            out[os.path.relpath(path, root)] = stat.S_IMODE(os.stat(path).st_mode)
    return out


@pytest.mark.parametrize("fmt", ["zarr", "webdataset"])
def test_every_file_of_a_pack_takes_the_umask(tmp_path, umask, fmt):
    src = tmp_path / "f.npy"
    np.save(src, poisson_fields(4, h=16, w=16)[:, 0])
    out = tmp_path / "out"
    dctdata.pack(str(src), str(out), format=fmt, target_psnr=35, quiet=True)
    modes = _modes(out)
    assert "manifest.json" in modes and len(modes) > 1
    assert modes == {k: 0o666 & ~umask for k in modes}, modes
    png, _ = inspect_dataset(str(out), str(tmp_path / "fig.png"), samples=1)
    assert stat.S_IMODE(os.stat(png).st_mode) == 0o666 & ~umask


def test_atomic_write_takes_the_umask_and_leaves_no_temporary(tmp_path, umask):
    path = atomic_write(tmp_path / "a.json", b"{}")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o666 & ~umask
    with pytest.raises(RuntimeError, match="boom"):
        atomic_write(tmp_path / "b.json", lambda fh: (_ for _ in ()).throw(RuntimeError("boom")))
    assert sorted(os.listdir(tmp_path)) == ["a.json"]
