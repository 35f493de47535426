"""Hostile and changing sources (issue 30, round two): one regression test per finding, each reproducing it
from scratch.

1: an HDF5 (or NetCDF-4) file may not make a pack read other local files unless the user opts in.
2: `--resume` refuses a source that changed since the interrupted run (its identity, then its values).
12: an .npy source truncated while being packed is an error naming it, not SIGBUS.
15: float64 values that float32 cannot carry are refused with the true reason.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import h5py
import numpy as np
import pytest

import dctdata
from dctdata.cli import main
from dctdata.errors import DctDataError
from dctdata.preprocess.commit import partial_dir

PY = sys.executable


def _no_out(tmp_path, name="out"):
    return not (tmp_path / name).exists() and not os.path.exists(partial_dir(str(tmp_path / name)))


# 1: data outside the HDF5 file -------------------------------------------------------------------------------
@pytest.fixture
def secret(tmp_path):
    path = tmp_path / "secret_key.txt"
    path.write_bytes(b"-----BEGIN OPENSSH PRIVATE KEY-----\n" + bytes(8 * 64 - 36))
    return path


def _images(f, n=8):
    f.create_dataset("image", data=np.random.default_rng(0).standard_normal((n, 8, 8)).astype(np.float32))


OUTSIDE = r"expected data stored inside the HDF5 file\. Got {} .*pass --allow-external \(Python: allow_external=True\)"


def test_1_external_storage_is_refused_unless_the_user_opts_in(tmp_path, secret, capsys):
    evil = tmp_path / "evil.h5"
    with h5py.File(evil, "w") as f:
        _images(f)
        f.create_dataset("meta", shape=(8, 64), dtype="u1", external=[(str(secret), 0, 8 * 64)])
    expected = r"evil\.h5\[meta\]: " + OUTSIDE.format(rf"external storage in {re.escape(str(secret))}")
    with pytest.raises(DctDataError, match=expected):
        dctdata.pack(evil, tmp_path / "out", cf=4, quiet=True)
    assert _no_out(tmp_path)
    assert main(["pack", str(evil), str(tmp_path / "out"), "--cf", "4"]) == 1
    err = capsys.readouterr().err
    assert re.search(expected, err) and "Traceback" not in err
    # the opt-in, by keyword and by flag: the file is trusted, its external data is packed
    dctdata.pack(evil, tmp_path / "trusted", cf=4, quiet=True, allow_external=True)
    meta = np.stack([s["meta"].numpy() for s in dctdata.open_dataset(tmp_path / "trusted", as_dict=True)])
    assert meta.tobytes() == secret.read_bytes()
    assert main(["pack", str(evil), str(tmp_path / "cli"), "--cf", "4", "--allow-external", "--quiet"]) == 0


def test_1_a_fifo_as_external_storage_is_refused_before_it_is_opened(tmp_path):
    fifo = tmp_path / "fifo"
    evil = tmp_path / "evil.h5"
    with h5py.File(evil, "w") as f:
        _images(f)
        f.create_dataset("meta", shape=(8, 64), dtype="u1", external=[(str(fifo), 0, 8 * 64)])
    os.mkfifo(fifo)  # opening it would block the pack forever: the check must come first
    code = f"import dctdata; dctdata.pack({str(evil)!r}, {str(tmp_path / 'out')!r}, cf=4, quiet=True)"
    r = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and re.search(OUTSIDE.format("external storage in .*fifo"), r.stderr), r.stderr


def test_1_a_virtual_dataset_mapping_another_file_is_refused(tmp_path):
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as g:
        g["private"] = np.arange(8 * 64, dtype=np.uint8).reshape(8, 64)
    layout = h5py.VirtualLayout(shape=(8, 64), dtype="u1")
    layout[:] = h5py.VirtualSource(str(other), "private", shape=(8, 64))
    evil = tmp_path / "evil.h5"
    with h5py.File(evil, "w") as f:
        _images(f)
        f.create_virtual_dataset("meta", layout)
    with pytest.raises(DctDataError, match=r"evil\.h5\[meta\]: " + OUTSIDE.format("a virtual dataset mapping .*other")):
        dctdata.pack(evil, tmp_path / "out", cf=4, quiet=True)
    assert _no_out(tmp_path)
    dctdata.pack(evil, tmp_path / "trusted", cf=4, quiet=True, allow_external=True)
    assert dctdata.open_dataset(tmp_path / "trusted").manifest.names == ("image", "meta")


def test_1_a_virtual_dataset_inside_the_file_is_fine(tmp_path):
    path = tmp_path / "vds.h5"
    with h5py.File(path, "w") as f:
        _images(f)
        f["raw"] = np.arange(8 * 4, dtype=np.int16).reshape(8, 4)
        layout = h5py.VirtualLayout(shape=(8, 4), dtype="i2")
        layout[:] = h5py.VirtualSource(".", "raw", shape=(8, 4))
        f.create_virtual_dataset("view", layout)
    dctdata.pack(path, tmp_path / "out", cf=4, quiet=True)
    got = np.stack([s["view"].numpy() for s in dctdata.open_dataset(tmp_path / "out", as_dict=True)])
    np.testing.assert_array_equal(got, np.arange(8 * 4, dtype=np.int16).reshape(8, 4))


def test_1_an_external_link_is_refused_when_packed_and_followed_on_opt_in(tmp_path):
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as g:
        g["private"] = np.arange(8 * 64, dtype=np.uint8).reshape(8, 64)
    evil = tmp_path / "evil.h5"
    with h5py.File(evil, "w") as f:
        _images(f)
        f["meta"] = h5py.ExternalLink(str(other), "/private")
    with pytest.raises(DctDataError, match=r"evil\.h5\[meta\]: " + OUTSIDE.format("an external link to .*other")):
        dctdata.pack(evil, tmp_path / "out", cf=4, quiet=True)
    dctdata.pack(evil, tmp_path / "only_image", cf=4, quiet=True, key="image")  # the link is not read: fine
    dctdata.pack(evil, tmp_path / "trusted", cf=4, quiet=True, allow_external=True)
    got = np.stack([s["meta"].numpy() for s in dctdata.open_dataset(tmp_path / "trusted", as_dict=True)])
    np.testing.assert_array_equal(got, np.arange(8 * 64, dtype=np.uint8).reshape(8, 64))


def test_1_a_netcdf4_file_with_external_storage_is_refused(tmp_path, secret):
    evil = tmp_path / "evil.nc"
    with h5py.File(evil, "w") as f:  # NetCDF-4 is HDF5: the same library follows the same external storage
        _images(f)
        f.create_dataset("meta", shape=(8, 64), dtype="u1", external=[(str(secret), 0, 8 * 64)])
    with pytest.raises(DctDataError, match=r"evil\.nc\[meta\]: " + OUTSIDE.format("external storage in")):
        dctdata.pack(evil, tmp_path / "out", cf=4, quiet=True)
    assert _no_out(tmp_path)


# 2: --resume after the source changed ------------------------------------------------------------------------
def _interrupted(tmp_path, monkeypatch, source, parts=2):
    """Pack `source` into tmp_path/out with 8-sample parts, interrupted (KeyboardInterrupt) after `parts`."""
    import dctdata.preprocess.pack as pack_mod

    real, done = pack_mod.run_part, []

    def run_part(*args, **kwargs):
        if len(done) == parts:
            raise KeyboardInterrupt
        done.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(pack_mod, "run_part", run_part)
    with pytest.raises(KeyboardInterrupt):
        # in this process (workers=1): the count of parts before the interruption is this one's
        dctdata.pack(source, tmp_path / "out", cf=4, quiet=True, workers=1, writer_options={"shard_samples": 8})
    monkeypatch.setattr(pack_mod, "run_part", real)
    assert os.path.isdir(partial_dir(str(tmp_path / "out")))


def _resume(tmp_path, source):
    return dctdata.pack(source, tmp_path / "out", cf=4, quiet=True, resume=True, writer_options={"shard_samples": 8})


def _fields(seed, n=48):
    return np.random.default_rng(seed).standard_normal((n, 1, 16, 16)).astype(np.float32)


def test_2_resume_refuses_a_regenerated_source(tmp_path, monkeypatch, capsys):
    src = tmp_path / "x.npy"
    np.save(src, _fields(0))
    _interrupted(tmp_path, monkeypatch, src)
    np.save(src, _fields(1))  # the data is regenerated, same shape
    expected = (
        rf"--resume: expected the source the interrupted pack read \({re.escape(str(src))}: \d+ bytes, modified at "
        r"\d+ ns\)\. Got \d+ bytes, modified at \d+ ns \(the source changed since: run without --resume"
    )
    with pytest.raises(DctDataError, match=expected):
        _resume(tmp_path, src)
    assert os.path.isdir(partial_dir(str(tmp_path / "out"))) and not (tmp_path / "out").exists()  # nothing lost
    assert main(["pack", str(src), str(tmp_path / "out"), "--cf", "4", "--resume"]) == 1
    assert "Traceback" not in capsys.readouterr().err


def test_2_resume_refuses_changed_values_behind_the_same_size_and_mtime(tmp_path, monkeypatch):
    src = tmp_path / "x.npy"
    np.save(src, _fields(0))
    _interrupted(tmp_path, monkeypatch, src)
    st = os.stat(src)
    x = _fields(0)
    x[3] += 1  # sample 3, inside the first journaled part
    np.save(src, x)
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))  # as cp -p / rsync -t would leave it
    expected = (
        r"--resume: expected the source values the interrupted pack read for samples 0\.\.7\. Got different values "
        r"of field\(s\) image \(the source changed since"
    )
    with pytest.raises(DctDataError, match=expected):
        _resume(tmp_path, src)


def test_2_resume_refuses_a_changed_directory_source(tmp_path, monkeypatch):
    src = tmp_path / "samples"
    src.mkdir()
    x = _fields(0, n=24)
    for i in range(24):
        np.save(src / f"{i:03d}.npy", x[i])
    _interrupted(tmp_path, monkeypatch, src, parts=1)
    np.save(src / "020.npy", x[20] + 1)  # a sample the interrupted pack had not read yet
    with pytest.raises(
        DctDataError, match=r"--resume: expected the source .*: \d+ files, listing crc32 \d+\)\. Got \d+ files"
    ):
        _resume(tmp_path, src)


def test_2_resume_of_an_unchanged_source_gives_the_fresh_pack(tmp_path, monkeypatch):
    src = tmp_path / "x.npy"
    np.save(src, _fields(0))
    _interrupted(tmp_path, monkeypatch, src)
    resumed = _resume(tmp_path, src)
    fresh = dctdata.pack(src, tmp_path / "fresh", cf=4, quiet=True, writer_options={"shard_samples": 8})
    assert resumed.checksums == fresh.checksums  # the same bytes


# 12: a source truncated while being packed -------------------------------------------------------------------
TRUNCATE_AFTER_FIRST_PART = """
import sys
import dctdata.format.zarr.layout as layout
import dctdata.preprocess.pack as pack_mod
from dctdata.cli import main
layout.SHARD_SOURCE_BYTES = 1 << 16  # parts of 64 KiB of source: several parts
real = pack_mod.run_part
def run_part(*args, **kwargs):
    out = real(*args, **kwargs)
    with open(sys.argv[1], "r+b") as fh:  # a pipeline starts rewriting the source: truncate first
        fh.truncate(4096)
    return out
pack_mod.run_part = run_part
sys.exit(main(["pack", sys.argv[1], sys.argv[2], "--cf", "4", "--lossless", "zstd:1", "--quiet"]))
"""


def test_12_an_npy_truncated_while_being_packed_is_an_error_not_sigbus(tmp_path):
    src = tmp_path / "x.npy"
    np.save(src, np.random.default_rng(0).standard_normal((256, 1, 16, 16)).astype(np.float32))  # 4 parts
    r = subprocess.run(
        [PY, "-c", textwrap.dedent(TRUNCATE_AFTER_FIRST_PART), str(src), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    expected = (
        rf"{re.escape(str(src))}: expected \d+ bytes of samples \d+\.\.\d+\. Got 0 \(the file was truncated while"
    )
    assert r.returncode == 1, (r.returncode, r.stderr)  # -7 was SIGBUS
    assert re.search(expected, r.stderr) and "Traceback" not in r.stderr, r.stderr


def test_12_a_fortran_order_npy_is_refused_naming_the_fix(tmp_path):
    np.save(tmp_path / "f.npy", np.asfortranarray(np.zeros((4, 8, 8), np.float32)))
    with pytest.raises(DctDataError, match=r"f\.npy: expected a C-order array \(read by rows\)\. Got Fortran order"):
        dctdata.pack(tmp_path / "f.npy", tmp_path / "out", cf=4, quiet=True)


# 15: float64 values float32 cannot carry ---------------------------------------------------------------------
CARRY = (
    r"sample 0: field 'image' channel 0: expected values float32 can carry \(the codec computes in float32\)\. "
    r"Got float64 values near 1e\+15 that vary by [\d.]+: float32 rounds them by up to [\d.e+]+, "
    r"[\d.e+]+% of their range \(subtract the offset first, or keep the field exact: --field image=array\)"
)


def _offset(n=8):
    return 1e15 + np.random.default_rng(0).standard_normal((n, 1, 16, 16))  # float64


@pytest.mark.parametrize("settings", [{"cf": 4}, {"target_psnr": 40}], ids=["fixed", "target_psnr"])
def test_15_float64_values_float32_cannot_carry_are_refused_with_the_true_reason(tmp_path, settings):
    with pytest.raises(DctDataError, match=CARRY):  # packed "fine" before; --target-psnr said "only constant items"
        dctdata.pack(_offset(), tmp_path / "out", quiet=True, **settings)
    assert _no_out(tmp_path)


def test_15_the_cli_and_the_stream_writer_refuse_them_too(tmp_path, capsys):
    np.save(tmp_path / "x.npy", _offset())
    assert main(["pack", str(tmp_path / "x.npy"), str(tmp_path / "out"), "--target-psnr", "40", "--quiet"]) == 1
    err = capsys.readouterr().err
    assert re.search(re.escape(str(tmp_path / "x.npy")) + " " + CARRY, err) and "Traceback" not in err, err
    with pytest.raises(DctDataError, match=r"<Writer> " + CARRY.replace("image", "u")):
        with dctdata.Writer(tmp_path / "w", cf=4, quiet=True) as w:
            for s in _offset():
                w.write({"u": s})
    assert _no_out(tmp_path, "w")


@pytest.mark.parametrize("settings", [{"cf": 4}, {"target_psnr": 40}], ids=["fixed", "target_psnr"])
def test_15_finite_values_past_float32_are_named_by_magnitude_not_as_nan(tmp_path, settings):
    x = np.random.default_rng(0).standard_normal((8, 1, 16, 16))
    x[3, 0, 2, 2] = 1e300
    with pytest.raises(
        DctDataError, match=r"sample 3: field 'image': expected \|x\| <= 4\.25e\+37 .*Got max \|x\| = 1e\+300"
    ):
        dctdata.pack(x, tmp_path / "out", quiet=True, **settings)


def test_15_float64_data_float32_carries_still_packs_and_the_offset_fix_works(tmp_path):
    x = _offset()
    m = dctdata.pack(x - 1e15, tmp_path / "centered", cf=4, quiet=True)  # the fix the message names
    ds = dctdata.open_dataset(tmp_path / "centered")
    y = ds.decompressor()(ds[0:8][0]).numpy()
    assert m.samples == 8 and np.abs(y - (x - 1e15)).max() < 0.5 * np.ptp(x - 1e15)
    exact = dctdata.pack(x, tmp_path / "exact", fields=["image=array"], quiet=True)  # or kept exact
    assert exact.samples == 8
    assert np.array_equal(np.stack([np.asarray(s[0]) for s in dctdata.open_dataset(tmp_path / "exact")]), x)
