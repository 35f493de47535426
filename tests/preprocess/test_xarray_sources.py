"""NetCDF files and zarr stores through xarray: variables as fields or stacked as channels, the sample
dimension's coordinates and the variables' attributes in the manifest and back from the dataset, local
paths and URLs, masked variables, and constant memory for a store larger than the memory allowed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from sample_fields import files, smooth_fields
from servers import serve

import dctdata
import dctdata.codec.metrics
from dctdata.cli import main
from dctdata.preprocess.inspect import inspect_dataset

xr = pytest.importorskip("xarray")

T, H, W = 10, 24, 40


def era(missing: bool = False):
    """An ERA5-like Dataset: t2m, u10 (time, lat, lon) with units, sst with NaN over land."""
    t2m = 270 + smooth_fields(T, 1, H, W, seed=1, amp=15, noise="normal")[:, 0]
    u10 = smooth_fields(T, 1, H, W, seed=2, offset=0, amp=8, noise="normal")[:, 0]
    sst = t2m - 3
    if missing:
        sst[:, :, :9] = np.nan
    return xr.Dataset(
        {
            "t2m": (("time", "lat", "lon"), t2m, {"units": "K", "long_name": "2 metre temperature"}),
            "u10": (("time", "lat", "lon"), u10, {"units": "m s**-1"}),
            "sst": (("time", "lat", "lon"), sst, {"units": "K"}),
        },
        coords={
            "time": np.datetime64("2020-01-01T00", "ns") + np.arange(T) * np.timedelta64(6, "h"),
            "lat": ("lat", np.linspace(60, 30, H), {"units": "degrees_north"}),
            "lon": ("lon", np.linspace(-10, 30, W), {"units": "degrees_east"}),
        },
    )


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("stores")
    ds = era()
    ds.to_netcdf(tmp / "era.nc", engine="h5netcdf")
    ds.to_zarr(tmp / "era.zarr", mode="w", zarr_format=2, consolidated=True)
    return tmp, ds


def test_netcdf_variables_as_fields_with_coords_and_units(stores, tmp_path):
    tmp, ref = stores
    out = tmp_path / "o"
    assert main(["pack", str(tmp / "era.nc"), str(out), "--sample-dim", "time", "--variables", "t2m,u10",
                 "--target-psnr", "40", "--quiet"]) == 0  # fmt: skip
    ds = dctdata.open_dataset(out, as_dict=True)
    assert ds.manifest.names == ("t2m", "u10")
    assert np.array_equal(ds.coords["time"], ref.time.values) and ds.coords["time"].dtype.kind == "M"
    assert (
        np.allclose(ds.coords["lat"], ref.lat.values) and ds.manifest.coords["lat"]["attrs"]["units"] == "degrees_north"
    )
    assert ds.attrs("t2m")["units"] == "K" and ds.attrs("t2m")["dims"] == ["lat", "lon"]
    assert ds.attrs("u10") == {"units": "m s**-1", "variable": "u10", "dims": ["lat", "lon"]}
    for name in ("t2m", "u10"):
        x_hat = ds.decompressor(name)(ds[0:T][name])
        scores = dctdata.codec.metrics.psnr(torch.from_numpy(ref[name].values[:, None]), x_hat)
        assert dctdata.codec.metrics.pooled_psnr(scores) >= 40
    rc = main(["info", str(out)])
    assert rc == 0


def test_zarr_store_stacked_as_channels_equals_the_netcdf_pack(stores, tmp_path):
    tmp, ref = stores
    args = ["--variables", "u10,t2m", "--stack", "x", "--cf", "6", "--quiet"]
    assert main(["pack", str(tmp / "era.zarr"), str(tmp_path / "z"), *args]) == 0
    assert main(["pack", str(tmp / "era.nc"), str(tmp_path / "n"), *args]) == 0
    fz, fn = files(tmp_path / "z"), files(tmp_path / "n")
    mz, mn = json.loads(fz.pop("manifest.json")), json.loads(fn.pop("manifest.json"))
    assert fz == fn and mz["coords"] == mn["coords"] and mz["fields"] == mn["fields"]
    ds = dctdata.open_dataset(tmp_path / "z")
    f = ds.manifest.field("x")
    assert f.shape == (2, H, W) and ds.attrs("x")["channels"] == ["u10", "t2m"]
    assert ds.attrs("x")["variables"]["t2m"]["units"] == "K"
    x_hat = ds.decompressor()(ds[0:T][0])
    expect = np.stack([ref.u10.values, ref.t2m.values], 1)
    assert torch.allclose(x_hat, torch.from_numpy(expect), atol=0.05 * 15)


def test_sample_dim_last_and_an_xarray_object_with_missing_values(tmp_path):
    ds = era(missing=True).transpose("lat", "lon", "time")
    m = dctdata.pack(ds, tmp_path / "o", sample_dim="time", variables=["sst"], nan="mask", cf=8, quiet=True)
    assert m.field("sst").shape == (1, H, W) and m.field("sst").valid == "sst_valid"
    back = dctdata.open_dataset(tmp_path / "o", as_dict=True)
    sample = back[4]
    assert torch.equal(sample["sst_valid"][0], torch.from_numpy(np.isfinite(ds.sst.values[:, :, 4])))
    assert back.coords["time"][4] == ds.time.values[4]
    assert m.stats["sst"].psnr_min > 60  # cf 8, float32: near exact on the valid pixels


def test_zarr_store_over_http(stores, tmp_path):
    tmp, ref = stores
    with serve(tmp) as url:
        m = dctdata.pack(f"{url}/era.zarr", tmp_path / "o", variables="t2m", cf=8, quiet=True)
    assert m.pack["source"].startswith("http://127.0.0.1") and m.samples == T
    assert np.array_equal(dctdata.open_dataset(tmp_path / "o").coords["time"], ref.time.values)


def test_inspect_reads_originals_from_the_store(stores, tmp_path):
    tmp, _ = stores
    dctdata.pack(str(tmp / "era.nc"), tmp_path / "o", variables="u10,t2m", stack="x", cf=4, quiet=True)
    png, shown = inspect_dataset(str(tmp_path / "o"), str(tmp_path / "i.png"), samples=2, channels=2)
    assert shown and os.path.getsize(png) > 0


@pytest.mark.slow
def test_a_store_larger_than_the_memory_allowed_packs_in_constant_memory(tmp_path):
    """A 512 MiB zarr store (written chunk by chunk with dask) packs with a peak RSS growth under 384 MiB,
    measured in a fresh process (ru_maxrss after the imports vs after the pack; about 290 MiB measured,
    the same for a 256 MiB store: one read batch, one zarr shard of coefficients, zarr's buffers)."""
    import dask.array as da

    t, h, w = 2048, 256, 256  # float32: 512 MiB
    yy, xx = np.meshgrid(np.linspace(0, 3, h, dtype=np.float32), np.linspace(0, 3, w, dtype=np.float32), indexing="ij")

    def block(b, block_info=None):
        start = block_info[0]["array-location"][0][0]
        k = np.arange(start, start + b.shape[0], dtype=np.float32)[:, None, None]
        return 280 + 10 * np.sin(xx[None] + 0.01 * k) * np.cos(yy[None] - 0.02 * k)

    data = da.map_blocks(block, da.zeros((t, h, w), dtype=np.float32, chunks=(16, h, w)), dtype=np.float32)
    store = tmp_path / "big.zarr"
    xr.Dataset({"t2m": (("time", "lat", "lon"), data)}, coords={"time": np.arange(t)}).to_zarr(
        store, mode="w", zarr_format=2, consolidated=True
    )
    script = textwrap.dedent(
        f"""
        import resource, json, dctdata, xarray, dask, zarr, torch
        from dctdata.preprocess import pack, writer
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        m = dctdata.pack({str(store)!r}, {str(tmp_path / "out")!r}, cf=4, quiet=True)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(json.dumps({{"base_kib": base, "peak_kib": peak, "samples": m.samples}}))
        """
    )
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    grew_mib = (got["peak_kib"] - got["base_kib"]) / 1024
    assert got["samples"] == t
    assert grew_mib < 384, f"peak RSS grew by {grew_mib:.0f} MiB packing a 512 MiB store"


def test_stacked_variables_with_levels_are_channels_of_each_level(tmp_path):
    x = smooth_fields(4 * 3, 1, 16, 24, noise="normal")[:, 0].reshape(4, 3, 16, 24)
    ds = xr.Dataset(
        {"t": (("time", "level", "lat", "lon"), x), "q": (("time", "level", "lat", "lon"), x + 1)},
        coords={"level": [850, 500, 250]},
    )
    m = dctdata.pack(ds, tmp_path / "o", stack="tq", cf=8, quiet=True)
    f = m.field("tq")
    assert f.shape == (6, 16, 24) and f.attrs["channels"] == ["t[0]", "t[1]", "t[2]", "q[0]", "q[1]", "q[2]"]
    assert f.attrs["dims"] == ["variable*level", "lat", "lon"] and m.coords["level"]["values"] == [850, 500, 250]
    back = dctdata.open_dataset(tmp_path / "o")
    x_hat = back.decompressor()(back[2][0][None])[0].numpy()
    assert np.allclose(x_hat[:3], x[2], atol=1e-3) and np.allclose(x_hat[3:], x[2] + 1, atol=1e-3)
