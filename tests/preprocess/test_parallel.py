"""Parallel packing on Dask: byte-identical to a serial pack; clear errors without Dask or with bad settings."""

from __future__ import annotations

import builtins

import pytest
from sample_fields import OPTS, N, files

import dctdata
from dctdata.cli import main
from dctdata.errors import DctDataError


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["zarr", "webdataset"])
def test_dask_pack_is_byte_identical_to_serial(labelled_source, tmp_path, fmt):
    kw = dict(format=fmt, quant="int8", cf=6, quiet=True, writer_options=OPTS[fmt])
    m1 = dctdata.pack(labelled_source, tmp_path / "serial", **kw)
    m2 = dctdata.pack(labelled_source, tmp_path / "dask", workers=2, **kw)
    assert m1.to_json() == m2.to_json()
    a, b = files(tmp_path / "serial"), files(tmp_path / "dask")
    assert sorted(a) == sorted(b) and len(a) > 4
    assert all(a[k] == b[k] for k in a)
    ds = dctdata.open_dataset(tmp_path / "dask")
    assert main(["verify", str(tmp_path / "dask")]) == 0
    assert ds.manifest.samples == N


def test_parallel_needs_dask(labelled_source, tmp_path, monkeypatch):
    real = builtins.__import__

    def no_dask(name, *a, **k):
        if name.startswith("dask"):
            raise ImportError("No module named 'dask'")
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_dask)
    with pytest.raises(
        DctDataError,
        match=r"--workers N>1/--scheduler: expected dask.distributed to be installed \(pip install 'dctdata\[dask\]'\)",
    ):
        dctdata.pack(labelled_source, tmp_path / "a", workers=2, quiet=True)
    assert not (tmp_path / "a").exists()


def test_bad_parallel_settings(labelled_source, tmp_path):
    with pytest.raises(DctDataError, match="--workers: expected a positive int. Got 0"):
        dctdata.pack(labelled_source, tmp_path / "a", workers=0)
    with pytest.raises(DctDataError, match="--workers/--scheduler: expected one of them"):
        dctdata.pack(labelled_source, tmp_path / "a", workers=2, scheduler="tcp://127.0.0.1:1")
    with pytest.raises(DctDataError, match="--resume: expected a local OUT directory"):
        dctdata.pack(labelled_source, "memory://bucket/x", resume=True)


@pytest.mark.slow
def test_dask_pack_of_masked_data_is_byte_identical_to_serial(tmp_path):
    """The mask fields the pack makes (nan="mask") travel with the job to the workers."""
    import numpy as np
    from sample_fields import smooth_fields

    x = smooth_fields(N, 2, 24, 24, noise="normal")
    x[::3, :, :, :5] = np.nan
    np.save(tmp_path / "x.npy", x)
    kw = dict(nan="mask", cf=6, quant="int8", quiet=True, writer_options=OPTS["zarr"])
    m1 = dctdata.pack(tmp_path / "x.npy", tmp_path / "serial", **kw)
    m2 = dctdata.pack(tmp_path / "x.npy", tmp_path / "dask", workers=2, **kw)
    assert m1.names == ("image", "image_valid") and m1.to_json() == m2.to_json()
    assert files(tmp_path / "serial") == files(tmp_path / "dask")
