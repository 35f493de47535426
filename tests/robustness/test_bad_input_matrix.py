"""The bad-input matrix: every CLI and API entry point against bad files, bad data, bad
settings, hand-edited manifests and bad OUT paths.

Each case either must fail cleanly or (for odd-but-valid input) succeed correctly:
- error cases: non-zero exit, one error line naming the problem (regex), no traceback, and nothing
  half-written: the directory tree the case ran in is unchanged (no OUT, no temporary sibling).
  argparse's own errors are the one exception to "one line": usage + one error line, exit 2.
  `dctdata verify` reports problems one per line on stdout (exit 1); that is its contract.
- ok cases: exit 0 / a return value, checked by the case.

Run as a script to print the counts table of docs/robustness.md:
    python tests/robustness/test_bad_input_matrix.py
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

if __name__ == "__main__":  # run as a script (prints the table): find the helpers beside conftest.py
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from pack_checks import reseal
from sample_fields import smooth_fields

import dctdata
from dctdata.cli import main
from dctdata.errors import DctDataError
from dctdata.format import FORMAT_VERSION
from dctdata.stages import ids

CASES: list[Case] = []


@dataclasses.dataclass
class Case:
    entry: str  # entry point (table row)
    problem: str  # what is wrong (test id)
    build: Callable[[Path], Any]  # tmp -> list of CLI args, or a zero-argument callable (API)
    match: str | None = None  # regex the error must match; None = the case must succeed
    check: Callable[[Path, Any], None] | None = None  # extra checks of a success

    @property
    def id(self) -> str:
        return f"{self.entry}: {self.problem}"


def case(entry, problem, match=None, check=None):
    def deco(build):
        CASES.append(Case(entry, problem, build, match, check))
        return build

    return deco


# Data ------------------------------------------------------------------------------------------
def fields(n, c=1, h=16, w=16, seed=0, offset=20.0, amp=10.0):
    return smooth_fields(n, c, h, w, seed, offset, amp, noise="normal")


def npy(tmp, arr, name="x.npy", **kw):
    np.save(tmp / name, arr, **kw)
    return tmp / name


def packed(tmp, fmt="zarr", n=6, name="ds"):
    src = npy(tmp, fields(n), name="src.npy")
    labels = np.arange(n, dtype=np.int64)
    np.savez(tmp / "src.npz", image=np.load(src), label=labels)
    opts = {"chunk_samples": 2, "shard_samples": 2} if fmt == "zarr" else {"samples_per_shard": 2}
    dctdata.pack(tmp / "src.npz", tmp / name, format=fmt, cf=4, quant="int8", quiet=True, writer_options=opts)
    return tmp / name


def edit_manifest(root, fn):
    p = Path(root) / "manifest.json"
    d = json.loads(p.read_text())
    fn(d)
    p.write_text(json.dumps(reseal(d)))
    return root


def pack_args(src, out, *extra):
    return ["pack", src, out, "--quiet", *extra]


# pack: one block per source kind ----------------------------------------------------------------
@case("pack .npy", "missing file", r"nope\.npy: expected an existing file")
def _(t):
    return pack_args(t / "nope.npy", t / "out")


@case("pack .npy", "truncated file", r"x\.npy: expected \d+ bytes .*truncated")
def _(t):
    p = npy(t, fields(4))
    p.write_bytes(p.read_bytes()[:-50])
    return pack_args(p, t / "out")


@case("pack .npy", "garbage header", r"x\.npy: expected a \.npy array\. Got an unreadable header")
def _(t):
    (t / "x.npy").write_bytes(b"not an npy file at all" * 10)
    return pack_args(t / "x.npy", t / "out")


@case("pack .npy", "directory named .npy", r"x\.npy: expected per-sample \.npy/\.npz files or .*images.*Got none")
def _(t):
    (t / "x.npy").mkdir()
    return pack_args(t / "x.npy", t / "out")


@case("pack .npy", "object dtype (pickle)", r"o\.npy: expected a numeric array\. Got dtype object")
def _(t):
    return pack_args(npy(t, np.array([np.zeros(3), np.zeros(4)], dtype=object), "o.npy", allow_pickle=True), t / "out")


@case("pack .npy", "complex dtype", r"field 'image': expected a numeric dtype\. Got complex64")
def _(t):
    return pack_args(npy(t, np.zeros((3, 8, 8), np.complex64)), t / "out")


@case("pack .npy", "string dtype", r"x\.npy: expected a numeric array\. Got dtype <U3")
def _(t):
    return pack_args(npy(t, np.array([["abc"]] * 3)), t / "out")


@case("pack .npy", "bool images forced to dct", r"field 'image': expected numbers for kind dct\. Got bool")
def _(t):
    return pack_args(npy(t, np.zeros((3, 8, 8), bool)), t / "out", "--field", "image=dct")


def _check_kind(kind, n):
    def check(t, _):
        m = dctdata.format.read_manifest(t / "out")
        assert m.samples == n and m.field("image").kind == kind

    return check


@case("pack .npy", "bool images (stored exactly as array)", check=_check_kind("array", 3))
def _(t):
    return pack_args(npy(t, np.random.default_rng(0).random((3, 8, 8)) > 0.5), t / "out")


@case("pack .npy", "int64 images (array by default)", check=_check_kind("array", 3))
def _(t):
    return pack_args(npy(t, np.arange(3 * 64, dtype=np.int64).reshape(3, 8, 8)), t / "out")


@case("pack .npy", "int64 images as dct", check=_check_kind("dct", 3))
def _(t):
    return pack_args(
        npy(t, (np.arange(3 * 64, dtype=np.int64) * 1000).reshape(3, 8, 8)), t / "out", "--field", "image=dct"
    )


@case("pack .npy", "zero samples", r"x\.npy: expected at least one sample\. Got 0")
def _(t):
    return pack_args(npy(t, np.zeros((0, 8, 8), np.float32)), t / "out")


@case("pack .npy", "0-d array", r"x\.npy: expected an array with samples on the first axis\. Got a 0-d array")
def _(t):
    return pack_args(npy(t, np.float32(3)), t / "out")


@case("pack .npy", "4-D samples as dct", r"field 'image': expected 1, 2 or 3 dims per sample for kind dct")
def _(t):
    return pack_args(npy(t, np.zeros((2, 2, 2, 8, 8), np.float32)), t / "out")


@case("pack .npy", "one sample", check=_check_kind("dct", 1))
def _(t):
    return pack_args(npy(t, fields(1)), t / "out")


@case("pack .npy", "one sample with --target-psnr", check=_check_kind("dct", 1))
def _(t):
    return pack_args(npy(t, fields(1)), t / "out", "--quant", "int8", "--target-psnr", "40")


def _check_huge(t, _):
    ds = dctdata.open_dataset(t / "out")
    assert ds.manifest.field("image").shape == (1, 4096, 4096) and ds.manifest.stats["image"].psnr_min > 30


@case("pack .npy", "huge single sample 1x4096x4096", check=_check_huge)
def _(t):
    yy, xx = np.meshgrid(
        np.linspace(0, 1, 4096, dtype=np.float32), np.linspace(0, 1, 4096, dtype=np.float32), indexing="ij"
    )
    return pack_args(npy(t, (np.sin(9 * xx) * np.cos(7 * yy))[None]), t / "out", "--cf", "4", "--quant", "fp16")


@case("pack .npy", "NaN in a dct field", r"x\.npy sample 2: field 'image': expected finite values.*Got NaN/Inf")
def _(t):
    x = fields(4)
    x[2, 0, 3, 3] = np.nan
    return pack_args(npy(t, x), t / "out")


@case(
    "pack .npy", "Inf in the calibration subset", r"x\.npy sample 1: field 'image': expected finite values.*Got NaN/Inf"
)
def _(t):
    x = fields(4)
    x[1, 0, 0, 0] = -np.inf
    return pack_args(npy(t, x), t / "out", "--quant", "int8", "--target-psnr", "40")


@case("pack .npy", "--nan fill=inf", r"nan: expected a finite fill value")
def _(t):
    return pack_args(npy(t, fields(2)), t / "out", "--nan", "fill=inf")


def _check_constant(t, _):
    m = dctdata.format.read_manifest(t / "out")
    s = m.stats["image"]
    assert s.psnr_min is None and s.psnr_median is None and s.max_abs_error < 1e-4  # no -inf/NaN PSNR
    ds = dctdata.open_dataset(t / "out")
    x_hat = ds.decompressor()(ds[0 : len(ds)][0])
    assert torch.allclose(x_hat, torch.full_like(x_hat, 5.0), atol=1e-4)


@case("pack .npy", "constant images (zero range)", check=_check_constant)
def _(t):
    return pack_args(npy(t, np.full((4, 16, 16), 5.0, np.float32)), t / "out")


@case(
    "pack .npy",
    "constant images with --target-psnr",
    r"expected at least one item .* with max > min\. Got only constant items",
)
def _(t):
    return pack_args(npy(t, np.full((4, 16, 16), 5.0, np.float32)), t / "out", "--quant", "int8", "--target-psnr", "40")


def _check_mixed_constant(t, _):
    s = dctdata.format.read_manifest(t / "out").stats["image"]
    assert s.psnr_min is not None and np.isfinite(s.psnr_min) and s.psnr_min > 30


@case("pack .npy", "some constant images with --target-psnr", check=_check_mixed_constant)
def _(t):
    x = fields(6)
    x[::2] = 7.0
    return pack_args(npy(t, x), t / "out", "--quant", "int8", "--target-psnr", "40")


@case(
    "pack .npy",
    "values near float32 max",
    r"x\.npy sample 1: field 'image': expected \|x\| <= 4\.25e\+37 .*Got max \|x\| = 3e\+38",
)
def _(t):
    x = fields(3)
    x[1, 0, 0, 0] = 3e38
    return pack_args(npy(t, x), t / "out")


@case(
    "pack .npy", "values near float32 max, calibrated", r"x\.npy sample 0: field 'image': expected \|x\| <= 4\.25e\+37"
)
def _(t):
    return pack_args(npy(t, fields(3) * 1e37), t / "out", "--quant", "int8", "--target-psnr", "40")


def _check_large(t, _):
    s = dctdata.format.read_manifest(t / "out").stats["image"]
    assert s.psnr_min > 40 and np.isfinite(s.max_abs_error)


@case("pack .npy", "large but safe values (1e36)", check=_check_large)
def _(t):
    return pack_args(npy(t, fields(3) * 1e36), t / "out", "--cf", "8")


def _check_subnormal(t, _):
    s = dctdata.format.read_manifest(t / "out").stats["image"]
    assert s.psnr_min >= 39.6 and s.max_abs_error < 1e-40  # per-sample (range, mid) makes tiny values ordinary


@case("pack .npy", "subnormal values with --target-psnr", check=_check_subnormal)
def _(t):
    return pack_args(npy(t, fields(3, offset=0) * 1e-40), t / "out", "--quant", "int8", "--target-psnr", "40")


@case("pack .npy", "fp16 overflow with --strict", r"field 'image': expected no float16 overflow \(--strict\)")
def _(t):
    return pack_args(npy(t, fields(3) * 1e6), t / "out", "--quant", "fp16", "--strict")


# settings that make no sense
@case("pack settings", "--cf 9", r"cf: expected an int in 1\.\.8\. Got 9")
def _(t):
    return pack_args(npy(t, fields(2)), t / "out", "--cf", "9")


@case("pack settings", "--cf 0", r"cf: expected an int in 1\.\.8\. Got 0")
def _(t):
    return pack_args(npy(t, fields(2)), t / "out", "--cf", "0")


@case("pack settings", "--quant int4 (argparse)", r"argument --quant: invalid choice: 'int4'")
def _(t):
    return pack_args(npy(t, fields(2)), t / "out", "--quant", "int4")


@case("pack settings", "--mask circle (argparse)", r"argument --mask: invalid choice: 'circle'")
def _(t):
    return pack_args(npy(t, fields(2)), t / "out", "--mask", "circle")


@case(
    "pack settings",
    "--lossless pickle",
    r"--lossless: expected one of: auto, zstd, zstd:LEVEL \(LEVEL in 1\.\.22\).*\. Got 'pickle'",
)
def _(t):
    return pack_args(npy(t, fields(2)), t / "out", "--lossless", "pickle")


@case("pack settings", "--lossless zstd:23", r"--lossless: expected one of: auto, zstd, zstd:LEVEL .*Got 'zstd:23'")
def _(t):
    return pack_args(npy(t, fields(2)), t / "out", "--lossless", "zstd:23")


@case("pack settings", "--target-psnr 0", r"--target-psnr: expected a positive number of dB\. Got 0")
def _(t):
    return pack_args(npy(t, fields(2)), t / "out", "--target-psnr", "0")


@case("pack settings", "--target-psnr nan", r"--target-psnr: expected a positive number of dB\. Got nan")
def _(t):
    return pack_args(npy(t, fields(2)), t / "out", "--target-psnr", "nan")


@case("pack settings", "--target-psnr 500", r"target_psnr: expected a PSNR in dB between 0 and 200\. Got 500")
def _(t):
    return pack_args(npy(t, fields(2)), t / "out", "--target-psnr", "500")


@case(
    "pack settings",
    "unreachable target for --cf 1 --quant int8",
    r"target_psnr: expected a target these settings .*can reach.*lower the target",
)
def _(t):
    return pack_args(npy(t, fields(4)), t / "out", "--cf", "1", "--quant", "int8", "--target-psnr", "90")


@case("pack settings", "--field image=label on images", r"field 'image': expected one scalar per sample for kind label")
def _(t):
    return pack_args(npy(t, fields(2)), t / "out", "--field", "image=label")


@case(
    "pack settings", "--field label=dct on scalars", r"field 'label': expected 1, 2 or 3 dims per sample for kind dct"
)
def _(t):
    np.savez(t / "d.npz", image=fields(2), label=np.arange(2))
    return pack_args(t / "d.npz", t / "out", "--field", "label=dct")


@case("pack settings", "--field without =", r"--field: expected NAME=dct\|array\|label")
def _(t):
    return pack_args(npy(t, fields(2)), t / "out", "--field", "image")


@case(
    "pack settings",
    "--max-shard-size with zarr",
    r"--max-shard-size/--samples-per-shard/--samples-per-member: expected --format webdataset",
)
def _(t):
    return pack_args(npy(t, fields(2)), t / "out", "--max-shard-size", "100000")


@case("pack settings", "--samples-per-shard 0", r"samples_per_shard: expected a positive int")
def _(t):
    return pack_args(npy(t, fields(2)), t / "out", "--format", "webdataset", "--samples-per-shard", "0")


@case("pack settings", "--workers 0", r"--workers: expected a positive int\. Got 0")
def _(t):
    return pack_args(npy(t, fields(2)), t / "out", "--workers", "0")


@case("pack settings", "--format parquet", r"--format: expected one of \('zarr', 'webdataset'\)\. Got 'parquet'")
def _(t):
    return pack_args(npy(t, fields(2)), t / "out", "--format", "parquet")


# .npz
@case("pack .npz", "truncated zip", r"d\.npz: expected a readable \.npz")
def _(t):
    np.savez(t / "d.npz", image=fields(4))
    raw = (t / "d.npz").read_bytes()
    (t / "d.npz").write_bytes(raw[: len(raw) // 2])
    return pack_args(t / "d.npz", t / "out")


@case("pack .npz", "members of different lengths", r"d\.npz: expected every array to have the same sample count")
def _(t):
    np.savez(t / "d.npz", image=fields(4), label=np.arange(3))
    return pack_args(t / "d.npz", t / "out")


@case("pack .npz", "object member (pickle)", r"d\.npz\[image\]: expected a numeric array\. Got dtype object")
def _(t):
    np.savez(t / "d.npz", image=np.array([{"a": 1}, None], dtype=object))
    return pack_args(t / "d.npz", t / "out")


@case("pack .npz", "empty archive", r"d\.npz: expected at least one array in the \.npz")
def _(t):
    np.savez(t / "d.npz")
    return pack_args(t / "d.npz", t / "out")


@case("pack .npz", "zero samples", r"d\.npz: expected at least one sample\. Got 0")
def _(t):
    np.savez(t / "d.npz", image=np.zeros((0, 8, 8), np.float32))
    return pack_args(t / "d.npz", t / "out")


# directories of per-sample files
@case("pack dir", "ragged .npy samples", r"2\.npy: field 'image': expected .*\(8, 8\).*Got \(8, 9\)")
def _(t):
    (t / "d").mkdir()
    for i, shape in enumerate([(8, 8), (8, 8), (8, 9)]):
        np.save(t / "d" / f"{i}.npy", np.ones(shape, np.float32))
    return pack_args(t / "d", t / "out")


@case("pack dir", "empty directory", r"d: expected per-sample \.npy/\.npz files or PNG/JPEG/TIFF images.*Got none")
def _(t):
    (t / "d").mkdir()
    return pack_args(t / "d", t / "out")


@case("pack dir", "mixed .npy and .npz", r"d: expected per-sample files of one kind \(\.npy or \.npz\)\. Got both")
def _(t):
    (t / "d").mkdir()
    np.save(t / "d" / "0.npy", np.ones((8, 8), np.float32))
    np.savez(t / "d" / "1.npz", image=np.ones((8, 8), np.float32))
    return pack_args(t / "d", t / "out")


@case("pack dir", "pickled .npy among samples", r"1\.npy: expected a numeric array\. Got dtype object")
def _(t):
    (t / "d").mkdir()
    np.save(t / "d" / "0.npy", np.ones((8, 8), np.float32))
    np.save(t / "d" / "1.npy", np.array([None, 1], dtype=object), allow_pickle=True)
    return pack_args(t / "d", t / "out")


@case("pack dir", ".npz sample missing a field", r"1\.npz: expected field 'label'")
def _(t):
    (t / "d").mkdir()
    np.savez(t / "d" / "0.npz", image=np.ones((8, 8), np.float32), label=np.int64(1))
    np.savez(t / "d" / "1.npz", image=np.ones((8, 8), np.float32))
    return pack_args(t / "d", t / "out")


@case("pack dir", "truncated .npz sample", r"1\.npz: expected a readable pickle-free \.npz file")
def _(t):
    (t / "d").mkdir()
    for i in range(2):
        np.savez(t / "d" / f"{i}.npz", image=np.ones((8, 8), np.float32))
    raw = (t / "d" / "1.npz").read_bytes()
    (t / "d" / "1.npz").write_bytes(raw[:40])
    return pack_args(t / "d", t / "out")


# HDF5
@case("pack HDF5", "truncated file", r"d\.h5: expected a readable HDF5 file")
def _(t):
    import h5py

    with h5py.File(t / "d.h5", "w") as fh:
        fh["a"] = fields(4)
    raw = (t / "d.h5").read_bytes()
    (t / "d.h5").write_bytes(raw[:1000])
    return pack_args(t / "d.h5", t / "out")


@case("pack HDF5", "string dataset", r"d\.h5\[names\]: expected a numeric dataset")
def _(t):
    import h5py

    with h5py.File(t / "d.h5", "w") as fh:
        fh["a"] = fields(2)
        fh["names"] = np.array([b"a", b"b"])
    return pack_args(t / "d.h5", t / "out")


@case("pack HDF5", "datasets of different lengths", r"d\.h5: expected every field to have the same sample count")
def _(t):
    import h5py

    with h5py.File(t / "d.h5", "w") as fh:
        fh["a"] = fields(3)
        fh["b"] = np.arange(2)
    return pack_args(t / "d.h5", t / "out")


@case("pack HDF5", "no datasets", r"d\.h5: expected at least one HDF5 dataset\. Got none")
def _(t):
    import h5py

    with h5py.File(t / "d.h5", "w") as fh:
        fh.create_group("empty")
    return pack_args(t / "d.h5", t / "out")


@case("pack HDF5", "--key that does not exist", r"d\.h5: --key 'b': expected one of \['a'\]")
def _(t):
    import h5py

    with h5py.File(t / "d.h5", "w") as fh:
        fh["a"] = fields(2)
    return pack_args(t / "d.h5", t / "out", "--key", "b")


@case(
    "pack HDF5",
    "(N, 32, 32, 1) without --channels-last",
    r"field 'images': expected \(C, H, W\) per sample .*Got \(32, 32, 1\).*use --channels-last",
)
def _(t):
    import h5py

    with h5py.File(t / "d.h5", "w") as fh:
        fh["images"] = np.moveaxis(fields(3, 1, 32, 32), 1, -1)
    return pack_args(t / "d.h5", t / "out")


def _check_layout(shape):
    def check(t, _):
        assert dctdata.format.read_manifest(t / "out").field("images").shape == shape

    return check


@case("pack HDF5", "(N, 32, 32, 1) with --channels-last", check=_check_layout((1, 32, 32)))
def _(t):
    import h5py

    with h5py.File(t / "d.h5", "w") as fh:
        fh["images"] = np.moveaxis(fields(3, 1, 32, 32), 1, -1)
    return pack_args(t / "d.h5", t / "out", "--channels-last")


@case("pack HDF5", "(N, 32, 32, 1) kept as it is with --no-channels-last", check=_check_layout((32, 32, 1)))
def _(t):
    import h5py

    with h5py.File(t / "d.h5", "w") as fh:
        fh["images"] = np.moveaxis(fields(3, 1, 32, 32), 1, -1)
    return pack_args(t / "d.h5", t / "out", "--no-channels-last")


# NetCDF and zarr stores (xarray)
def _store(t, kind="nc", **variables):
    import xarray as xr

    n = 4
    data = variables or {"t2m": (("time", "lat", "lon"), fields(n, 1, 16, 24)[:, 0])}
    ds = xr.Dataset(data, coords={"time": np.arange(n).astype("datetime64[h]")})
    if kind == "nc":
        ds.to_netcdf(t / "era.nc", engine="h5netcdf")
        return t / "era.nc"
    ds.to_zarr(t / "era.zarr", mode="w", consolidated=False)
    return t / "era.zarr"


@case("pack NetCDF", "unknown variable", r"era\.nc: --variables 'z500': expected one of the data variables \['t2m'\]")
def _(t):
    return pack_args(_store(t), t / "out", "--variables", "t2m,z500")


@case("pack NetCDF", "unknown sample dimension", r"era\.nc: --sample-dim 'tme': expected one of the dimensions")
def _(t):
    return pack_args(_store(t), t / "out", "--sample-dim", "tme")


@case(
    "pack NetCDF",
    "variable without the sample dimension",
    r"variable 'lsm': expected dimension 'time' \(--sample-dim\)\. Got dims \['lat', 'lon'\]",
)
def _(t):
    x = fields(4, 1, 16, 24)[:, 0]
    return pack_args(
        _store(t, t2m=(("time", "lat", "lon"), x), lsm=(("lat", "lon"), x[0])),
        t / "out",
        *("--variables", "t2m,lsm", "--sample-dim", "time"),
    )


@case(
    "pack zarr store",
    "--stack of variables with different shapes",
    r"--stack x: expected variables with the same per-sample dims and sizes\. Got .*sst \('lat2', 'lon2'\) \(8, 12\)",
)
def _(t):
    return pack_args(
        _store(
            t,
            "zarr",
            t2m=(("time", "lat", "lon"), fields(4, 1, 16, 24)[:, 0]),
            sst=(("time", "lat2", "lon2"), fields(4, 1, 8, 12)[:, 0]),
        ),
        t / "out",
        "--stack",
        "x",
    )


@case("pack zarr store", "unreadable store", r"bad\.zarr: expected a readable zarr store")
def _(t):
    (t / "bad.zarr").mkdir()
    (t / "bad.zarr" / "zarr.json").write_text("{not json")
    return pack_args(t / "bad.zarr", t / "out")


@case(
    "pack .npy",
    "--variables on a .npy",
    r"--sample-dim/--variables/--stack: expected a NetCDF file or zarr store\. Got .*x\.npy",
)
def _(t):
    return pack_args(npy(t, fields(2)), t / "out", "--variables", "a")


@case("pack NetCDF", "all-NaN sample with --nan mask", r"sample 2 .*field 't2m' channel 0: expected at least one valid")
def _(t):
    x = fields(4, 1, 16, 24)[:, 0]
    x[2] = np.nan
    return pack_args(_store(t, t2m=(("time", "lat", "lon"), x)), t / "out", "--nan", "mask")


# masked data and per-field targets
@case("pack .npz", "NaN where the explicit mask says valid", r"field 'image': expected finite values where the mask")
def _(t):
    x = fields(3)
    x[1, 0, 3, 3] = np.nan
    np.savez(t / "m.npz", image=x, ok=np.ones((3, 16, 16), np.uint8))
    return pack_args(t / "m.npz", t / "out", "--valid", "image=ok")


@case("pack .npz", "--valid names a float mask", r"field 'image': valid field 'ok': expected an array field of bool")
def _(t):
    np.savez(t / "m.npz", image=fields(3), ok=np.ones((3, 16, 16), np.float32))
    return pack_args(t / "m.npz", t / "out", "--valid", "image=ok", "--field", "ok=array")


@case("pack .npz", "--valid names no field", r"--valid image=nope: expected a mask field among the source's fields")
def _(t):
    np.savez(t / "m.npz", image=fields(3))
    return pack_args(t / "m.npz", t / "out", "--valid", "image=nope")


@case(
    "pack .npz",
    "--nan mask with a field already named FIELD_valid",
    r"field 'image_valid': expected no source field of that name with --nan mask",
)
def _(t):
    np.savez(t / "m.npz", image=fields(3), image_valid=np.ones((3, 16, 16), np.uint8))
    return pack_args(t / "m.npz", t / "out", "--nan", "mask")


@case("pack .npz", "--target-psnr for an unknown field", r"--target-psnr clean: expected one of the source's fields")
def _(t):
    np.savez(t / "m.npz", noisy=fields(3), label=np.arange(3))
    return pack_args(t / "m.npz", t / "out", "--target-psnr", "noisy=40,clean=45")


@case("pack .npz", "--target-psnr for a label field", r"--target-psnr label: expected a dct field\. Got kind 'label'")
def _(t):
    np.savez(t / "m.npz", noisy=fields(3), label=np.arange(3))
    return pack_args(t / "m.npz", t / "out", "--target-psnr", "noisy=40,label=45")


@case("pack .npz", "--target-psnr that is not a number", r"--target-psnr: expected DB or NAME=DB")
def _(t):
    np.savez(t / "m.npz", noisy=fields(3))
    return pack_args(t / "m.npz", t / "out", "--target-psnr", "noisy=forty")


# image folders
@case("pack images", "not really a PNG", r"0\.png: expected a readable PNG/JPEG/TIFF image")
def _(t):
    (t / "imgs").mkdir()
    (t / "imgs" / "0.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    return pack_args(t / "imgs", t / "out")


@case("pack images", "truncated PNG", r"1\.png: expected a readable PNG/JPEG/TIFF image")
def _(t):
    from PIL import Image

    (t / "imgs").mkdir()
    for i in range(2):
        Image.fromarray((fields(1, h=64, w=64)[0, 0] * 5).astype(np.uint8)).save(t / "imgs" / f"{i}.png")
    raw = (t / "imgs" / "1.png").read_bytes()
    (t / "imgs" / "1.png").write_bytes(raw[: len(raw) // 2])
    return pack_args(t / "imgs", t / "out")


@case("pack images", "images of different sizes", r"1\.png: field 'image': expected .*\(1, 16, 16\).*Got \(1, 16, 17\)")
def _(t):
    from PIL import Image

    (t / "imgs").mkdir()
    Image.fromarray(np.zeros((16, 16), np.uint8)).save(t / "imgs" / "0.png")
    Image.fromarray(np.zeros((16, 17), np.uint8)).save(t / "imgs" / "1.png")
    return pack_args(t / "imgs", t / "out")


@case(
    "pack images",
    "images both at top level and in class folders",
    r"imgs: expected images either at the top level or in class subfolders",
)
def _(t):
    from PIL import Image

    (t / "imgs" / "cat").mkdir(parents=True)
    Image.fromarray(np.zeros((8, 8), np.uint8)).save(t / "imgs" / "0.png")
    Image.fromarray(np.zeros((8, 8), np.uint8)).save(t / "imgs" / "cat" / "1.png")
    return pack_args(t / "imgs", t / "out")


@case(
    "pack images", "multi-page TIFF", r"stack\.tif: expected a single-page image \(one sample per file\)\. Got 3 pages"
)
def _(t):
    from PIL import Image

    (t / "imgs").mkdir()
    pages = [Image.fromarray(np.full((8, 8), 40 * i, np.uint8)) for i in range(3)]
    pages[0].save(t / "imgs" / "stack.tif", save_all=True, append_images=pages[1:])
    return pack_args(t / "imgs", t / "out")


def _check_big_endian(t, result):
    got = dctdata.open_dataset(t / "out", shuffle=False)
    assert [int(s[1]) for s in got] == [i * 2**40 for i in range(4)]


@case("pack .npz", "big-endian fields (webdataset)", check=_check_big_endian)
def _(t):
    np.savez(t / "be.npz", image=fields(4).astype(">f4"), label=np.arange(4).astype(">i8") * 2**40)
    return pack_args(t / "be.npz", t / "out", "--format", "webdataset")


# module:callable
_MODULE = """
import numpy as np
class Raising:
    def __len__(self): return 3
    def __getitem__(self, i):
        if i == 1: raise KeyError('boom')
        return np.ones((8, 8), np.float32)
class Ragged:
    def __len__(self): return 2
    def __getitem__(self, i): return np.ones((8, 8 + i), np.float32)
class Objects:
    def __len__(self): return 2
    def __getitem__(self, i): return {'image': np.ones((8, 8), np.float32), 'meta': {'a': i}}
def raising(): return Raising()
def ragged(): return Ragged()
def objects(): return Objects()
def broken(): raise RuntimeError('cannot open dataset')
def notds(): return 42
value = 3
"""


def _module(t, attr):
    name = f"badmod_{abs(hash(str(t))) % 10**8}"
    (t / f"{name}.py").write_text(_MODULE)
    sys.path.insert(0, str(t))
    return [*pack_args(f"{name}:{attr}", t / "out")]


@case("pack module:callable", "module not importable", r"nomodule_xyz:make: expected an importable module:callable")
def _(t):
    return pack_args("nomodule_xyz:make", t / "out")


@case(
    "pack module:callable", "attribute missing", r"expected badmod_\d+ to define nothing\. Got no attribute 'nothing'"
)
def _(t):
    return _module(t, "nothing")


@case("pack module:callable", "not callable", r"expected a callable returning a map-style dataset\. Got int")
def _(t):
    return _module(t, "value")


@case(
    "pack module:callable",
    "callable raises",
    r"expected the callable to return a dataset\. Got RuntimeError: cannot open dataset",
)
def _(t):
    return _module(t, "broken")


@case(
    "pack module:callable",
    "returns a non-dataset",
    r"expected a map-style dataset \(__len__ and __getitem__\)\. Got int",
)
def _(t):
    return _module(t, "notds")


@case(
    "pack module:callable",
    "__getitem__ raises",
    r"sample 1: expected dataset\[1\] to return a sample\. Got KeyError: 'boom'",
)
def _(t):
    return _module(t, "raising")


@case("pack module:callable", "ragged items", r"sample 1: field 'image': expected .*\(8, 8\).*Got \(8, 9\)")
def _(t):
    return _module(t, "ragged")


@case(
    "pack module:callable",
    "item holds a dict (object)",
    r"field 'meta': expected numeric arrays, tensors, numbers or PIL images\. Got dict",
)
def _(t):
    return _module(t, "objects")


# OUT paths
@case("pack OUT", "OUT exists (directory)", r"out: expected an OUT path that does not exist.*--overwrite")
def _(t):
    (t / "out").mkdir()
    (t / "out" / "keep.txt").write_text("mine")
    return pack_args(npy(t, fields(2)), t / "out")


@case(
    "pack OUT",
    "a file in the way (OUT is a file)",
    r"out: expected an OUT path that does not exist\. Got an existing path",
)
def _(t):
    (t / "out").write_text("mine")
    return pack_args(npy(t, fields(2)), t / "out")


@case("pack OUT", "OUT under a regular file", r"expected an existing parent directory\. Got a file in the way at .*/f")
def _(t):
    (t / "f").write_text("x")
    return pack_args(npy(t, fields(2)), t / "f" / "out")


@case(
    "pack OUT",
    "OUT deep under a regular file",
    r"expected an existing parent directory\. Got a file in the way at .*/f/a",
)
def _(t):
    (t / "f").write_text("x")
    return pack_args(npy(t, fields(2)), t / "f" / "a" / "out")


def _check_parents_made(t, _):
    assert len(dctdata.open_dataset(t / "nodir" / "out")) == 2


@case("pack OUT", "parent directory missing (made, as mkdir -p)", check=_check_parents_made)
def _(t):
    return pack_args(npy(t, fields(2)), t / "nodir" / "out")


@case("pack OUT", "OUT is the source (--overwrite)", r"x\.npy: expected an OUT path outside the source")
def _(t):
    p = npy(t, fields(2))
    return pack_args(p, p, "--overwrite")


@case("pack OUT", "OUT holds the source (--overwrite)", r"d: expected an OUT path outside the source")
def _(t):
    (t / "d").mkdir()
    np.save(t / "d" / "0.npy", fields(1)[0])
    return pack_args(t / "d" / "0.npy", t / "d", "--overwrite")


@case(
    "pack OUT",
    "unwritable location (/proc)",
    r"/proc/dctdata_matrix_out: expected an OUT whose folder /proc can be written\. Got (No such file or directory|"
    r"Permission denied|Read-only)",
)
def _(t):
    return pack_args(npy(t, fields(2)), "/proc/dctdata_matrix_out")


@case("pack OUT", "webdataset OUT exists", r"out: expected an OUT path that does not exist")
def _(t):
    (t / "out").mkdir()
    return pack_args(npy(t, fields(2)), t / "out", "--format", "webdataset")


def _check_overwrite(t, _):
    assert len(dctdata.open_dataset(t / "out")) == 3


@case("pack OUT", "OUT is a pack, with --overwrite", check=_check_overwrite)
def _(t):
    dctdata.pack(fields(2), t / "out", cf=4, quiet=True)
    return pack_args(npy(t, fields(3)), t / "out", "--overwrite")


@case(
    "pack OUT",
    "OUT is a folder of other files, with --overwrite",
    r"out: --overwrite: expected a dctdata pack .* Got a folder of 1 entry without a manifest\.json \(nothing was "
    r"deleted",
)
def _(t):
    (t / "out").mkdir()
    (t / "out" / "old.txt").write_text("old")
    return pack_args(npy(t, fields(3)), t / "out", "--overwrite")


_HELD_LOCKS: list = []  # locks held by "another pack" for the duration of the run


@case("pack OUT", "another pack writing the same OUT", r"out: expected no other pack writing here\. Got a lock held")
def _(t):
    from dctdata.preprocess.commit import OutLock

    _HELD_LOCKS.append(OutLock(str(t / "out")).acquire())  # released (and its file removed) when collected
    return pack_args(npy(t, fields(2)), t / "out")


# Readers: info, verify, inspect, open_dataset --------------------------------------------------
_READERS = {
    "info": lambda p: ["info", p],
    "verify": lambda p: ["verify", p],
    "inspect": lambda p: ["inspect", p, "--png", Path(p).parent / "x.png"] if Path(p).is_dir() else ["inspect", p],
    "open_dataset": lambda p: lambda: _first(dctdata.open_dataset(p)),
}


def _first(ds):
    """First sample: `ds[0]` for the map-style zarr dataset, the first yielded one for webdataset."""
    return ds[0] if isinstance(ds, torch.utils.data.IterableDataset) is False else next(iter(ds))


def _manifest_case(problem, match, setup, readers=tuple(_READERS), fmt="zarr"):
    for r in readers:

        def build(t, setup=setup, r=r):
            root = packed(t, fmt)
            setup(root)
            return _READERS[r](root)

        CASES.append(Case(r, f"{problem} ({fmt})", build, match))


_manifest_case(
    "no dataset", r"expected a dctdata manifest \(manifest\.json\)\. Got no such file", lambda r: shutil.rmtree(r)
)
_manifest_case(
    "manifest deleted",
    r"expected a dctdata manifest \(manifest\.json\)\. Got no such file",
    lambda r: (r / "manifest.json").unlink(),
)
_manifest_case(
    "manifest is a directory",
    r"manifest\.json: expected a readable dctdata manifest\. Got SpecialFileError: .*expected a regular file\. Got a "
    r"directory",
    lambda r: ((r / "manifest.json").unlink(), (r / "manifest.json").mkdir()),
)
_manifest_case(
    "manifest truncated",
    r"expected a JSON manifest\. Got unreadable JSON",
    lambda r: (r / "manifest.json").write_bytes((r / "manifest.json").read_bytes()[:100]),
)
_manifest_case(
    "manifest not UTF-8",
    r"expected a JSON manifest\. Got unreadable JSON",
    lambda r: (r / "manifest.json").write_bytes(b"\xff\xfe{}"),
)
_manifest_case(
    "manifest of a newer format version",
    rf"version: expected <= {FORMAT_VERSION} .*upgrade dctdata",
    lambda r: edit_manifest(r, lambda d: d.update(version=FORMAT_VERSION + 1)),
)
_manifest_case(
    "manifest missing a key", r"Got missing keys \['fields'\]", lambda r: edit_manifest(r, lambda d: d.pop("fields"))
)
_manifest_case(
    "manifest samples is a string",
    r"samples: expected an int >= 0\. Got '6'",
    lambda r: edit_manifest(r, lambda d: d.update(samples="6")),
)
_manifest_case(
    "manifest codec cf is a float",
    r"field 'image': codec: cf: expected an int in 1\.\.8\. Got 4\.0",
    lambda r: edit_manifest(r, lambda d: d["fields"][0]["codec"].update(cf=4.0)),
)
_manifest_case(
    "manifest codec precision is not float64",
    r"field 'image': codec: precision: expected one of \('float64',\)\. Got 'float16'",
    lambda r: edit_manifest(r, lambda d: d["fields"][0]["codec"].update(precision="float16")),
)
_manifest_case(
    "manifest codec precision without side values",
    r"field 'image': codec: precision: expected side information \(side='range_mid'\) to carry float64 values",
    lambda r: edit_manifest(
        r, lambda d: (d["fields"][0]["codec"].pop("side", None), d["fields"][0]["codec"].update(precision="float64"))
    ),
)
_manifest_case(
    "manifest checksum path escapes the dataset",
    r"checksums\['\.\./\.\./etc/passwd'\]: expected a relative path inside the dataset",
    lambda r: edit_manifest(r, lambda d: d["checksums"].update({"../../etc/passwd": {"sha256": "0" * 64, "bytes": 1}})),
)
_manifest_case(
    "manifest layout path escapes the dataset",
    r"layout\.arrays\['image'\]\.path: expected a plain identifier",
    lambda r: edit_manifest(r, lambda d: d["layout"]["arrays"]["image"].update(path="../x")),
    readers=("verify", "inspect", "open_dataset"),
)
_manifest_case(
    "manifest shapes disagree with the arrays",
    r"field 'image': expected zarr array \(6, 1, 3, 16, 2\) int8\. Got \(6, 1, 2, 16, 2\)",
    lambda r: edit_manifest(
        r, lambda d: (d["fields"][0].update(shape=[1, 24, 16]), d["fields"][0]["codec"].update(height=24))
    ),
    readers=("verify", "inspect", "open_dataset"),
)
_manifest_case(
    "manifest sample count disagrees with the arrays",
    # the side values kept in the manifest (version 4) hold 6 samples: the first thing that disagrees
    r"layout\.arrays\['image__side'\]\.inline: expected 40 bytes \(5 samples of \(1, 2\) float32\)\. Got 48",
    lambda r: edit_manifest(r, lambda d: d.update(samples=5)),  # the same 3 shard files, one sample fewer
    readers=("verify", "inspect", "open_dataset"),
)
_manifest_case(
    "manifest sample count needs shard files the pack lacks",
    r"layout\.arrays\['image'\]: expected 4 shard files listed in checksums \(8 samples, 2 per shard\)\. Got 3",
    lambda r: edit_manifest(r, lambda d: d.update(samples=8)),
    readers=("verify", "inspect", "open_dataset"),
)
_manifest_case(
    "manifest of a newer format version",
    rf"version: expected <= {FORMAT_VERSION} .*upgrade dctdata",
    lambda r: edit_manifest(r, lambda d: d.update(version=FORMAT_VERSION + 1)),
    fmt="webdataset",
)
_manifest_case(
    "manifest shard name escapes the dataset",
    r"expected a (plain '\.tar' file name|relative path inside the dataset)",
    lambda r: edit_manifest(r, lambda d: d["layout"]["shards"][0].update(name="../evil.tar")),
    readers=("verify", "open_dataset"),
    fmt="webdataset",
)
_manifest_case(
    "manifest sample count disagrees with the shards",
    r"layout\.shards: expected sample counts summing to 7\. Got 6",
    lambda r: edit_manifest(r, lambda d: d.update(samples=7)),
    readers=("verify", "open_dataset"),
    fmt="webdataset",
)
_manifest_case(
    "manifest shapes disagree with the shards",
    r"samples? \d+(\.\.\d+)? field 'image': expected int8 \((\d+, )?1, 3, 16, 2\)\. Got int8 \((\d+, )?1, 2, 16, 2\)",
    lambda r: edit_manifest(
        r, lambda d: (d["fields"][0].update(shape=[1, 24, 16]), d["fields"][0]["codec"].update(height=24))
    ),
    readers=("verify", "open_dataset"),
    fmt="webdataset",
)


@case("inspect", "--field on a non-dct field", r"label")
def _(t):
    return ["inspect", packed(t), "--field", "label", "--png", t / "x.png"]


@case("open_dataset", "not a path", r"path_or_url: expected a path or URL string, or a list of shard files\. Got int")
def _(t):
    return lambda: dctdata.open_dataset(3)


@case("open_dataset", "pipe: URL without opt-in", r"Got a shell 'pipe:' URL, which runs a command")
def _(t):
    return lambda: dctdata.open_dataset(f"pipe:cat {t}/{{}}")


@case("open_dataset", "on_error='ignore'", r"on_error: expected 'raise' or 'skip'")
def _(t):
    root = packed(t)
    return lambda: dctdata.open_dataset(root, on_error="ignore")


@case("open_dataset", "index out of range", r"index 6 out of range")
def _(t):
    root = packed(t)
    return lambda: dctdata.open_dataset(root)[6]


@case("open_dataset", "brace list matching no shard", r"expected shard names of this pack .*Got 100 listed, none")
def _(t):
    root = packed(t, "webdataset")
    return lambda: dctdata.open_dataset(f"{root}/shard-{{000100..000199}}.tar")


@case("open_dataset", "empty shard list", r"shards: expected at least one shard file\. Got an empty list")
def _(t):
    return lambda: dctdata.open_dataset([])


@case("open_dataset", "shard list of a zarr pack", r"a list of shard files: expected a webdataset pack")
def _(t):
    root = packed(t)
    return lambda: dctdata.open_dataset([root / "shard-000000.tar"])


@case("open_dataset", "cache_dir not writable", r"cache_dir .*/file/c: expected a writable directory\. Got ")
def _(t):
    root = packed(t, "webdataset")
    (t / "file").write_text("x")
    return lambda: dctdata.open_dataset(root, cache_dir=t / "file" / "c")


@case("open_dataset", "cache_limit below the largest shard", r"cache_limit: expected at least the largest shard")
def _(t):
    root = packed(t, "webdataset")
    return lambda: dctdata.open_dataset(root, cache_dir=t / "c", cache_limit="1KiB")


def _check_slice(t, batch):
    coefficients, side = batch[0]  # the dct field: a (coefficients, side) pair, each stacked
    assert coefficients.shape[0] == side.shape[0] == 2 and batch[1].tolist() == [1, 2]


@case("open_dataset", "ds[1:3] (a slice)", check=_check_slice)
def _(t):
    root = packed(t)
    return lambda: dctdata.open_dataset(root)[1:3]


def _special_shard(kind: str, fmt: str):
    """Replace the first shard with a FIFO, or a link to /dev/zero or to a copy outside the pack."""

    def setup(root):
        shard = root / ("image/c.0.0.0.0.0" if fmt == "zarr" else "shard-000000.tar")
        outside = root.parent / "outside.bin"
        outside.write_bytes(shard.read_bytes())
        shard.unlink()
        if kind == "fifo":
            os.mkfifo(shard)
        else:
            shard.symlink_to("/dev/zero" if kind == "dev_zero" else outside)

    return setup


for _fmt in ("zarr", "webdataset"):
    _manifest_case(
        "manifest names the pickle codec",
        rf"field 'label': lossless: expected one of {re.escape(str(ids()))}\. Got 'pickle'",
        lambda r: edit_manifest(r, lambda d: d["fields"][-1].update(lossless={"id": "pickle"})),
        fmt=_fmt,
    )
    _manifest_case(
        "manifest claims 10^12 samples",
        r"(expected 500000000000 shard files listed in checksums|expected at least \d+ bytes for \d+ samples)",
        lambda r: edit_manifest(
            r,
            lambda d: (
                d.update(samples=10**12),
                d["layout"]["shards"][-1].update(samples=10**12 - 4) if "shards" in d["layout"] else None,
            ),
        ),
        readers=("verify", "inspect", "open_dataset"),
        fmt=_fmt,
    )
    for _kind, _got in (("fifo", "a FIFO"), ("dev_zero", "a character device"), ("link_out", "a link to")):
        _manifest_case(
            f"first shard is {_kind.replace('_', ' ')}",
            rf"expected a (regular file|file inside the pack)\. Got {_got}",
            _special_shard(_kind, _fmt),
            readers=("verify", "open_dataset"),
            fmt=_fmt,
        )
_manifest_case(
    "shard name with a NUL byte",
    r"layout\.shards\[0\]\.name: expected a plain '\.tar' file name",
    lambda r: edit_manifest(r, lambda d: d["layout"]["shards"][0].update(name="shard-\x00.tar")),
    readers=("verify", "open_dataset"),
    fmt="webdataset",
)


# make_loader and its state_dict -------------------------------------------------------------------
def _loader(root, **kw):
    from dctdata.loaders.distributed import make_loader

    return make_loader(dctdata.open_dataset(root), batch_size=2, **kw)


def _state(root, epoch=1, **kw):
    from dctdata.loaders.distributed import set_epoch

    loader = _loader(root, **kw)
    set_epoch(loader, epoch)
    next(iter(loader))
    return loader.state_dict()


@case("make_loader", "batch_size 0", r"batch_size: expected a positive int\. Got 0")
def _(t):
    from dctdata.loaders.distributed import make_loader

    root = packed(t)
    return lambda: make_loader(dctdata.open_dataset(root), batch_size=0)


@case("make_loader", "state_dict of another pack", r"state_dict: expected a state of the pack at .*another pack")
def _(t):
    state = _state(packed(t, "webdataset", name="a"))
    other = packed(t, "webdataset", n=8, name="b")
    return lambda: _loader(other).load_state_dict(state)


@case("make_loader", "state_dict then another epoch", r"set_epoch\(4\): expected epoch 1, the epoch of the loaded")
def _(t):
    from dctdata.loaders.distributed import set_epoch

    root = packed(t, "webdataset")
    state = _state(root)

    def resume():
        loader = _loader(root)
        loader.load_state_dict(state)
        set_epoch(loader, 4)

    return resume


@case("make_loader", "state_dict of another batch size", r"Got batch_size=2 \(here 3\)")
def _(t):
    from dctdata.loaders.distributed import make_loader

    root = packed(t)
    state = _state(root)
    return lambda: make_loader(dctdata.open_dataset(root), batch_size=3).load_state_dict(state)


@case("make_loader", "state_dict that is not one", r"state_dict: expected the state_dict\(\) of a dctdata make_loader")
def _(t):
    root = packed(t)
    return lambda: _loader(root).load_state_dict({"epoch": 3})


# Python objects, iterables and the Writer ------------------------------------------------------
def _obj(entry, problem, match, fn):
    """An API case: `fn(tmp)` runs the pack (OUT is tmp/out: nothing may be left there)."""
    CASES.append(Case(entry, problem, lambda t, fn=fn: lambda: fn(t), match))


def _ragged():
    for i in range(6):
        yield {"image": fields(1, 1, 16, 16 if i < 4 else 17)[0]}


_obj(
    "pack objects",
    "an int",
    r"source: expected a path, URL or module:callable string, a NumPy array",
    lambda t: dctdata.pack(3, t / "out"),
)
_obj(
    "pack objects",
    "dict with arrays of different lengths",
    r"expected every field to have the same sample count",
    lambda t: dctdata.pack({"a": fields(3), "b": np.arange(2)}, t / "out"),
)
_obj(
    "pack objects",
    "an array with --scheduler",
    r"--scheduler/--resume: expected a path, URL or module:callable source",
    lambda t: dctdata.pack(fields(3), t / "out", scheduler="tcp://127.0.0.1:1"),
)
_obj(
    "pack objects",
    "an object dtype array",
    r"source: expected a numeric array\. Got dtype object",
    lambda t: dctdata.pack(np.array([None, None]), t / "out"),
)
_obj(
    "pack iterables",
    "shapes change mid-way",
    r"sample 4: field 'image': expected shape \(1, 16, 16\) like sample 0\. Got \(1, 16, 17\)",
    lambda t: dctdata.pack(_ragged(), t / "out", cf=4),
)
_obj(
    "pack iterables",
    "shapes change mid-way, after the calibration window",
    r"sample 4: field 'image': expected shape \(1, 16, 16\) like sample 0\. Got \(1, 16, 17\)",
    lambda t: dctdata.pack(_ragged(), t / "out", target_psnr=35, calibration=fields(8)),
)
_obj(
    "pack iterables",
    "a field appears mid-way",
    r"sample 2: expected fields \['image'\] like sample 0\. Got \['extra', 'image'\]",
    lambda t: dctdata.pack(
        ({"image": x, **({"extra": x} if i == 2 else {})} for i, x in enumerate(fields(4))), t / "out", cf=4
    ),
)
_obj(
    "pack iterables",
    "empty generator",
    r"out: expected at least one sample\. Got 0",
    lambda t: dctdata.pack((x for x in []), t / "out"),
)
_obj(
    "pack iterables",
    "shorter than its length",
    r"out: expected 5 samples \(samples=\)\. Got 3",
    lambda t: dctdata.pack((x for x in fields(3)), t / "out", length=5, cf=4),
)
_obj(
    "pack iterables",
    "an all-NaN sample",
    r"sample 1: field 'image': expected finite values in a dct field",
    lambda t: dctdata.pack((x * np.nan if i == 1 else x for i, x in enumerate(fields(3))), t / "out", cf=4),
)
_obj(
    "pack iterables",
    "strings as samples",
    r"sample 0: field 'image': expected numeric arrays, tensors, numbers or PIL images\. Got str",
    lambda t: dctdata.pack(iter(["a", "b"]), t / "out"),
)


def _writer(t, items, **kw):
    with dctdata.Writer(t / "out", **kw) as w:
        for s in items:
            w.write(s)
    return w.manifest


def _raises_inside(t):
    with dctdata.Writer(t / "out", cf=4) as w:
        for s in fields(70):  # more than one encoding batch
            w.write(s)
        raise DctDataError("user code: stop")


_obj(
    "Writer",
    "an exception inside the with block",
    r"user code: stop",
    _raises_inside,
)
_obj(
    "Writer",
    "shapes change mid-way",
    r"sample 4: field 'image': expected shape \(1, 16, 16\) like sample 0",
    lambda t: _writer(t, _ragged(), cf=4),
)
_obj(
    "Writer",
    "more samples than samples=",
    r"sample 3: expected 3 samples \(samples=\)\. Got more",
    lambda t: _writer(t, fields(4), samples=3, cf=4),
)
_obj("Writer", "no samples", r"out: expected at least one sample\. Got 0", lambda t: _writer(t, []))
_obj(
    "Writer",
    "an all-NaN channel with nan='mask'",
    r"sample 2: field 'image' channel 0: expected at least one valid \(finite, unmasked\) pixel",
    lambda t: _writer(t, [x if i != 2 else x * np.nan for i, x in enumerate(fields(4))], nan="mask", cf=4),
)
_obj(
    "Writer",
    "attrs for an unknown field",
    r"attrs: expected field names \['image'\]\. Got 'nope'",
    lambda t: _writer(t, fields(2), cf=4, attrs={"nope": {"units": "K"}}),
)
_obj(
    "Writer",
    "coords of the wrong length",
    r"coords\['time'\]: values: expected one per sample \(3\)\. Got 2",
    lambda t: _writer(t, fields(3), cf=4, coords={"time": np.arange(2)}),
)


# Codec API -------------------------------------------------------------------------------------
_SPEC = dict(cf=2, height=8, width=8)


def _api(entry, problem, match, fn):
    CASES.append(Case(entry, problem, lambda t, fn=fn: fn, match))


_api(
    "compress",
    "complex tensor",
    r"x: expected a floating tensor .*Got torch\.complex64",
    lambda: dctdata.compress(torch.ones(8, 8, dtype=torch.complex64), cf=4),
)
_api(
    "compress",
    "int64 tensor",
    r"x: expected a floating tensor .*Got torch\.int64",
    lambda: dctdata.compress(torch.ones(8, 8, dtype=torch.int64), cf=4),
)
_api(
    "compress",
    "bool tensor",
    r"x: expected a floating tensor .*Got torch\.bool",
    lambda: dctdata.compress(torch.ones(8, 8, dtype=torch.bool), cf=4),
)
_api(
    "compress",
    "numpy array",
    r"x: expected a torch\.Tensor",
    lambda: dctdata.compress(np.ones((8, 8), np.float32), cf=4),
)
_api("compress", "1-D tensor", r"x: expected rank >= 2", lambda: dctdata.compress(torch.ones(8), cf=4))
_api(
    "compress",
    "empty image",
    r"x: expected H, W >= 1\. Got shape \(0, 8\)",
    lambda: dctdata.compress(torch.ones(0, 8), cf=4),
)
_api(
    "compress",
    "cf as a string",
    r"cf: expected an int in 1\.\.8\. Got '4'",
    lambda: dctdata.compress(torch.ones(8, 8), cf="4"),
)
_api(
    "compress",
    "unknown mask",
    r"mask: expected one of \('square', 'triangle'\)",
    lambda: dctdata.compress(torch.ones(8, 8), cf=4, mask="circle"),
)
_api(
    "decompress",
    "size disagrees with coefficients",
    r"coeffs: expected shape .*size \(16, 8\)\. Got \(1, 4, 1\)",
    lambda: dctdata.decompress(torch.ones(1, 4, 1), cf=2, size=(16, 8)),
)
_api(
    "decompress",
    "negative size",
    r"size: expected H >= 1\. Got -8",
    lambda: dctdata.decompress(torch.ones(1, 4, 1), cf=2, size=(-8, 8)),
)
_api(
    "Decompress",
    "a dict instead of a CodecSpec",
    r"spec: expected a dctdata\.CodecSpec\. Got dict",
    lambda: dctdata.Decompress(dict(_SPEC)),
)
_api(
    "Decompress",
    "numpy input",
    r"coeffs: expected a torch\.Tensor\. Got ndarray",
    lambda: dctdata.Decompress(dctdata.CodecSpec(**_SPEC))(np.ones((1, 1, 1, 4, 1))),
)
_api(
    "Decompress",
    "wrong coefficient shape",
    r"coeffs: expected shape \(B, 1, 1, 4, 1\)",
    lambda: dctdata.Decompress(dctdata.CodecSpec(**_SPEC))(torch.ones(2, 1, 1, 9, 1)),
)
_api(
    "Decompress",
    "complex coefficients",
    r"coeffs: expected int8, int16, float16, bfloat16, float32 or float64 coefficients",
    lambda: dctdata.Decompress(dctdata.CodecSpec(**_SPEC))(torch.ones(1, 1, 1, 4, 1, dtype=torch.complex64)),
)
_api(
    "encode",
    "NaN with an int8 wire dtype",
    r"coefficients: expected finite values\. Got 4 NaN/Inf",
    lambda: dctdata.encode(
        torch.full((1, 8, 8), float("nan")), dctdata.CodecSpec(**_SPEC, dtype="int8", steps=[[1.0] * 4])
    ),
)
_api(
    "encode",
    "|x| beyond float32 max / 8",
    r"coefficients: expected finite values\. Got \d+ NaN/Inf .*float32 max / 8",
    lambda: dctdata.encode(torch.full((1, 8, 8), 3e38), dctdata.CodecSpec(**_SPEC)),
)
_api(
    "encode",
    "sample shape disagrees with the spec",
    r"sample: expected shape \(\.\.\., 1, 8, 8\)",
    lambda: dctdata.encode(torch.ones(1, 8, 9), dctdata.CodecSpec(**_SPEC)),
)
for _cfg, _match in [
    ({**_SPEC, "cf": "2"}, r"cf: expected an int in 1\.\.8\. Got '2'"),
    ({**_SPEC, "height": 0}, r"height: expected a positive int\. Got 0"),
    ({**_SPEC, "width": 8.0}, r"width: expected a positive int\. Got 8\.0"),
    ({**_SPEC, "dtype": "int4"}, r"dtype: expected one of .*Got 'int4'"),
    ({**_SPEC, "dtype": "int8"}, r"steps: expected a \(C x K\) table for integer dtype 'int8'\. Got None"),
    ({**_SPEC, "steps": [[1, 2]]}, r"steps: expected shape \(1, 4\)\. Got \(1, 2\)"),
    ({**_SPEC, "steps": [[1, 2, 3, float("nan")]]}, r"steps: expected finite values"),
    ({**_SPEC, "steps": [[1, 2, 3, 0]]}, r"steps: expected values > 0"),
    ({**_SPEC, "steps": [[1e-320] * 4]}, r"steps: expected values representable in float32"),
    ({**_SPEC, "offsets": [[1e300] * 4]}, r"offsets: expected values representable in float32"),
    ({**_SPEC, "steps": "abc"}, r"steps: expected nested numbers of shape \(1, 4\)"),
    ({**_SPEC, "mean": [0.0]}, r"mean/std: expected both or neither"),
    ({**_SPEC, "mean": [0.0], "std": [0.0]}, r"std: expected values > 0"),
    ({**_SPEC, "block": 16}, r"block: expected 8\. Got 16"),
    ({**_SPEC, "extra": 1}, r"CodecSpec config: unknown keys \['extra'\]"),
    ({"cf": 2, "height": 8}, r"CodecSpec config: missing keys \['width'\]"),
    ([1, 2], r"CodecSpec config: expected a mapping\. Got list"),
]:
    _api("CodecSpec.from_dict", json.dumps(_cfg)[:60], _match, lambda c=_cfg: dctdata.CodecSpec.from_dict(c))
for _raw, _match in [
    (b"", r"expected a JSON manifest"),
    (b"[" * 100000, r"expected a JSON manifest\. Got unreadable JSON: RecursionError"),
    (
        b'{"format": "dctdata", "version": ' + b"9" * 5000 + b"}",
        r"expected a JSON manifest\. Got unreadable JSON: ValueError",
    ),
    (b'{"format": "dctdata", "version": 1}', r"Got missing keys"),
    (b'{"format": "dctdata", "version": true}', rf"version: expected an int in 1\.\.{FORMAT_VERSION}\. Got True"),
    (b'"manifest"', r"expected a JSON object"),
]:
    _api(
        "Manifest parsing",
        _raw[:40].decode(errors="replace") + ("..." if len(_raw) > 40 else ""),
        _match,
        lambda r=_raw: dctdata.format.parse_manifest(r),
    )


# The harness -----------------------------------------------------------------------------------
def _snapshot(root: Path) -> dict[str, int]:
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for n in dirs + files:
            p = os.path.join(dirpath, n)
            out[os.path.relpath(p, root)] = -1 if os.path.isdir(p) else os.path.getsize(p)
    return out


def run_case(c: Case, tmp: Path) -> tuple[bool, str]:
    """(handled cleanly, why not). Runs in `tmp` (chdir), so nothing may be written elsewhere."""
    old_cwd, old_path = os.getcwd(), list(sys.path)
    os.chdir(tmp)
    try:
        target = c.build(tmp)
        before = _snapshot(tmp)
        if callable(target):
            try:
                result = target()
            except (DctDataError, TypeError, IndexError) as exc:
                if c.match is None:
                    return False, f"raised {type(exc).__name__}: {exc}"
                msg = str(exc)
                if "\n" in msg or not re.search(c.match, msg):
                    return False, f"message {msg!r} does not match {c.match!r}"
                return (True, "") if _snapshot(tmp) == before else (False, "files changed")
            except Exception as exc:  # counted, not raised
                return False, f"raised {type(exc).__name__} (not a DctDataError/TypeError): {exc}"
            if c.match is not None:
                return False, f"no error (returned {type(result).__name__})"
            if c.check:
                c.check(tmp, result)
            return True, ""
        argv = [str(a) for a in target]
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = main(argv)
            except SystemExit as exc:  # argparse
                rc = exc.code
            except Exception as exc:
                return False, f"traceback: {type(exc).__name__}: {exc}"
        out, err = out.getvalue(), err.getvalue()
        if c.match is None:
            if rc != 0:
                return False, f"exit {rc}: {err.strip()[-300:]}"
            if c.check:
                c.check(tmp, None)
            return True, ""
        if rc in (0, None):
            return False, f"exit 0, expected an error matching {c.match!r}"
        if "Traceback" in err + out:
            return False, "traceback printed"
        if argv[0] == "verify" and rc == 1 and not err.strip():
            text = out  # verify: one FAIL line per problem, then a summary line
            ok = re.search(c.match, text) and all(
                line.startswith(("FAIL ", "dctdata verify: ")) for line in text.strip().splitlines()
            )
        else:
            lines = err.strip().splitlines()
            argparse_error = rc == 2 and lines and lines[0].startswith("usage:")
            ok = (len(lines) == 1 or argparse_error) and re.search(c.match, lines[-1] if lines else "")
            text = err
        if not ok:
            return False, f"exit {rc}, output {text.strip()[-400:]!r} does not match {c.match!r} in one line"
        after = _snapshot(tmp)
        if after != before:
            return False, f"files changed: {sorted(set(after) ^ set(before))[:5]}"
        return True, ""
    finally:
        os.chdir(old_cwd)
        sys.path[:] = old_path


@pytest.mark.parametrize("c", CASES, ids=[c.id for c in CASES])
def test_matrix(c, tmp_path):
    ok, why = run_case(c, tmp_path)
    assert ok, why


def test_matrix_covers_every_entry_point():
    entries = {c.entry.split(" ")[0] for c in CASES}
    assert {
        "pack",
        "info",
        "verify",
        "inspect",
        "open_dataset",
        "make_loader",
        "compress",
        "decompress",
        "Decompress",
        "encode",
        "CodecSpec.from_dict",
        "Manifest",
        "Writer",
    } <= entries


def table() -> str:
    """Run the whole matrix; markdown table of cases tried / handled cleanly per entry point."""
    rows: dict[str, list[int]] = {}
    failures = []
    for c in CASES:
        with tempfile.TemporaryDirectory() as tmp:
            ok, why = run_case(c, Path(tmp))
        r = rows.setdefault(c.entry, [0, 0])
        r[0] += 1
        r[1] += ok
        if not ok:
            failures.append(f"- {c.id}: {why}")
    lines = ["| entry point | cases tried | handled cleanly |", "|---|---:|---:|"]
    lines += [f"| {k} | {v[0]} | {v[1]} |" for k, v in rows.items()]
    lines.append(f"| **total** | **{sum(v[0] for v in rows.values())}** | **{sum(v[1] for v in rows.values())}** |")
    return "\n".join(lines + (["", *failures] if failures else []))


if __name__ == "__main__":
    print(table())
