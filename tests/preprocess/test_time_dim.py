"""`--time-dim` (`pack(time_dim=...)`): a NetCDF/zarr variable with a time dimension packs as trajectories,
every frame once (the dims before time name the trajectories), so the window options of `open_dataset`
serve time windows over it, from zarr and webdataset packs alike; the errors name the file and the dims."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import dctdata
from dctdata.cli import main
from dctdata.decoder.wire import collate
from dctdata.errors import DctDataError
from dctdata.loaders.decode_ahead import DecodeAhead
from dctdata.loaders.windows import windows_per_trajectory

xr = pytest.importorskip("xarray")

M, T, H, W = 3, 10, 16, 24


def ensemble() -> xr.Dataset:
    """An ensemble forecast: t2m and u (member, time, lat, lon), a per-frame scalar `mean_t` (member, time)."""
    rng = np.random.default_rng(0)
    times = np.array("2020-01-01T00", dtype="datetime64[ns]") + np.arange(T) * np.timedelta64(6, "h")
    lat, lon = np.linspace(-10, 10, H), np.linspace(0, 30, W)
    base = np.sin(lat[:, None] / 5) * np.cos(lon[None, :] / 7)
    t2m = np.stack(
        [[base * (1 + 0.1 * k) + m + 0.01 * rng.standard_normal(base.shape) for k in range(T)] for m in range(M)]
    )
    u = 0.5 * t2m[:, :, ::-1] + 1
    return xr.Dataset(
        {
            "t2m": (("member", "time", "lat", "lon"), t2m.astype(np.float32), {"units": "K"}),
            "u": (("member", "time", "lat", "lon"), u.astype(np.float32)),
            "mean_t": (("member", "time"), t2m.mean(axis=(2, 3)).astype(np.float32)),
        },
        coords={"time": times, "lat": lat, "lon": lon},
    )


@pytest.fixture(scope="module")
def nc(tmp_path_factory):
    path = tmp_path_factory.mktemp("time-dim") / "ens.nc"
    ensemble().to_netcdf(path)
    return path


def test_time_dim_packs_trajectories_and_serves_windows(nc, tmp_path):
    src = ensemble()
    out = tmp_path / "ens.zarr"
    assert main(["pack", str(nc), str(out), "--time-dim", "time", "--cf", "4", "--quiet"]) == 0
    m = dctdata.format.read_manifest(out)
    assert m.samples == M * T and m.pack["time_dim"] == "time"  # every frame of every member once
    ds = dctdata.open_dataset(out, n_steps_input=3, n_steps_output=2)
    per = windows_per_trajectory(T, 3, 2, 1)
    assert len(ds) == M * per and ds.field_names == ["t2m", "u"]
    for i in range(len(ds)):
        k, start, dt = ds.locate(i)
        assert (k, start, dt) == (i // per, i % per, 1)  # trajectory = member, never crossed
    item = ds[per + 4]  # member 1, steps 4..8
    ref = np.stack([src["t2m"].values[1, 4:7], src["u"].values[1, 4:7]], -1)
    span = ref.max() - ref.min()
    assert item["input_fields"].shape == (3, H, W, 2) and item["output_fields"].shape == (2, H, W, 2)
    assert np.abs(item["input_fields"].numpy() - ref).max() < 0.05 * span
    assert item["input_scalars"].shape == (3, 1)  # the per-frame scalar, stored exactly
    np.testing.assert_array_equal(item["input_scalars"][:, 0].numpy(), src["mean_t"].values[1, 4:7])
    assert item["input_time_grid"].tolist() == [0.0, 6 * 3600.0, 12 * 3600.0]
    assert item["space_grid"].shape == (H, W, 2) and item["space_grid"][-1, 0].tolist() == pytest.approx([10, 0])
    assert item["boundary_conditions"].tolist() == [[1.0, 1.0], [1.0, 1.0]]


def test_time_dim_webdataset_windows_are_the_zarr_windows(nc, tmp_path):
    dctdata.pack(nc, tmp_path / "z", time_dim="time", variables="t2m", cf=4, quiet=True)
    dctdata.pack(
        nc, tmp_path / "w", time_dim="time", variables="t2m", cf=4, format="webdataset", quiet=True,
        writer_options={"samples_per_shard": 7},
    )  # fmt: skip
    zarr = dctdata.open_dataset(tmp_path / "z", n_steps_input=2, n_steps_output=1, dt_stride=2)
    wds = dctdata.open_dataset(tmp_path / "w", n_steps_input=2, n_steps_output=1, dt_stride=2, shuffle=False)
    got = list(wds)
    assert len(got) == len(zarr) == M * windows_per_trajectory(T, 2, 1, 2)
    for i, item in enumerate(got):
        assert torch.equal(item["input_fields"], zarr[i]["input_fields"])
        assert torch.equal(item["output_fields"], zarr[i]["output_fields"])


def test_time_dim_without_trajectory_dims_is_one_trajectory(tmp_path):
    one = ensemble().isel(member=0).drop_vars("mean_t")
    dctdata.pack(one, tmp_path / "one", time_dim="time", cf=4, quiet=True)
    ds = dctdata.open_dataset(tmp_path / "one", n_steps_input=4, n_steps_output=1)
    assert len(ds) == windows_per_trajectory(T, 4, 1, 1) and ds.trajectories == [(0, 0, T)]


def test_time_dim_errors(nc, tmp_path):
    with pytest.raises(
        DctDataError,
        match=r"ens\.nc: --time-dim 'step': expected one of the dimensions \['member', 'time', 'lat', 'lon'\]\. "
        "Got no such dimension",
    ):
        dctdata.pack(nc, tmp_path / "a", time_dim="step", quiet=True)
    with pytest.raises(DctDataError, match="--time-dim 'time' and --sample-dim 'time': expected one of them"):
        dctdata.pack(nc, tmp_path / "b", time_dim="time", sample_dim="time", quiet=True)
    mixed = ensemble()
    mixed["v"] = (("time", "member", "lat", "lon"), np.zeros((T, M, H, W), np.float32))
    with pytest.raises(DctDataError, match=r"expected the same trajectory dims .* Got t2m \['member'\], .* v \[\]"):
        dctdata.pack(mixed, tmp_path / "c", time_dim="time", quiet=True)
    lines = ensemble().isel(lat=0)
    with pytest.raises(DctDataError, match=r"variable 't2m': expected frames of at least 2 dims after 'time'"):
        dctdata.pack(lines, tmp_path / "d", time_dim="time", quiet=True)
    with pytest.raises(DctDataError, match="--time-dim: expected a name"):
        dctdata.pack(nc, tmp_path / "e", time_dim="", quiet=True)
    with pytest.raises(DctDataError, match=r"expected a NetCDF/zarr source or an xarray.Dataset"):
        dctdata.pack(np.zeros((4, 8, 8), np.float32), tmp_path / "f", time_dim="time", quiet=True)
    with pytest.raises(DctDataError, match=r"expected an HDF5/NetCDF/zarr source. Got an iterable"):
        dctdata.pack(({"x": np.zeros((8, 8))} for _ in range(2)), tmp_path / "g", time_dim="time", quiet=True)


def test_time_dim_integer_variable_windows_on_the_device(tmp_path):
    """A variable stored as it is (`--field level=array`, not dct): its frames cross as they are with decode="device",
    beside the dct variable's stored bytes, and the decoded batch is the decode="cpu" batch."""
    src = ensemble().drop_vars("mean_t")
    src["level"] = (("member", "time", "lat", "lon"), (src["t2m"].values * 10).astype(np.int16))
    dctdata.pack(
        src, tmp_path / "z", time_dim="time", variables="level,t2m", cf=4, fields={"level": "array"}, quiet=True
    )
    cpu = dctdata.open_dataset(tmp_path / "z", n_steps_input=2, n_steps_output=1)
    dev = dctdata.open_dataset(tmp_path / "z", n_steps_input=2, n_steps_output=1, decode="device")
    assert cpu.field_names == ["level", "t2m"]  # the field stored as it is first: the frames keyed by pack still
    want = cpu.__getitems__([0, 1, 2])
    batch = collate(dev.__getitems__([0, 1, 2]))
    assert isinstance(batch["frames"]["stored"]["level"], torch.Tensor)  # stored as it is
    got = dev.decompressor()(batch)
    for key in ("input_fields", "output_fields"):
        assert torch.equal(got[key], torch.stack([w[key] for w in want])), key
    np.testing.assert_array_equal(got["input_fields"][1, 0, ..., 0].numpy(), src["level"].values[0, 1])
    batches = [batch, collate(dev.__getitems__([3, 4]))]
    ahead = list(DecodeAhead(batches, dev.decompressor(), group=2))  # the stored-as-is frames pass through
    for a, b in zip(ahead, batches):
        assert torch.equal(a["input_fields"], dev.decompressor()(b)["input_fields"])
    dctdata.pack(src, tmp_path / "a", time_dim="time", variables="level", fields={"level": "array"}, quiet=True)
    raw = dctdata.open_dataset(tmp_path / "a", n_steps_input=2, n_steps_output=1, decode="device")
    ahead = list(DecodeAhead([collate(raw.__getitems__([0, 1]))], raw.decompressor()))  # nothing to decode
    np.testing.assert_array_equal(ahead[0]["output_fields"][1, 0, ..., 0].numpy(), src["level"].values[0, 3])


@pytest.mark.parametrize("normalization", ["zscore", "rms"])
def test_time_dim_statistics_and_normalization(nc, tmp_path, normalization):
    """A --time-dim pack records The Well source's statistics (numpy's over every frame of every member, and of
    the differences between consecutive frames within a member), so normalization works: the normalized
    windows are the plain windows normalized by hand with them, on the CPU and through `ds.decompressor()`."""
    src = ensemble()
    out = tmp_path / "ens.zarr"
    dctdata.pack(nc, out, time_dim="time", cf=4, quiet=True)
    stats = dctdata.format.read_manifest(out).pack["source_info"]["trajectories"]["stats"]
    for name in ("t2m", "u", "mean_t"):
        assert_numpy_stats(stats[name], src[name].values)
    opts = {"n_steps_input": 2, "n_steps_output": 1}
    plain = dctdata.open_dataset(out, **opts)
    ds = dctdata.open_dataset(out, normalization=normalization, **opts)
    assert ds.stats["mean"]["t2m"] == stats["t2m"]["mean"][0]
    key = "std" if normalization == "zscore" else "rms"
    shift = np.array([stats[f]["mean"][0] if normalization == "zscore" else 0.0 for f in ("t2m", "u")], np.float32)
    scale = np.array([stats[f][key][0] for f in ("t2m", "u")], np.float32)
    for i in (0, 7, len(ds) - 1):
        got, ref = ds[i], plain[i]
        for part in ("input_fields", "output_fields"):
            np.testing.assert_allclose(got[part].numpy(), (ref[part].numpy() - shift) / scale, rtol=1e-5, atol=1e-5)
    dev = dctdata.open_dataset(out, normalization=normalization, decode="device", **opts)
    batch = dev.decompressor()(collate(dev.__getitems__([0, 1, 2])))
    want = torch.stack([ds[i]["input_fields"] for i in (0, 1, 2)])
    torch.testing.assert_close(batch["input_fields"], want, rtol=1e-5, atol=1e-5)


def assert_numpy_stats(got: dict, values: np.ndarray) -> None:
    """`got` (one channel's recorded statistics) is numpy's over (member, time, ...) `values`, NaNs left out."""
    a = values.astype(np.float64)
    d = np.diff(a, axis=1)  # along time, within a member
    want = {"mean": np.nanmean(a), "std": np.nanstd(a), "rms": np.sqrt(np.nanmean(a * a))}
    want |= {"mean_delta": np.nanmean(d), "std_delta": np.nanstd(d), "rms_delta": np.sqrt(np.nanmean(d * d))}
    for key, value in want.items():
        assert got[key] == pytest.approx([value], rel=1e-9, abs=1e-12), key


def test_time_dim_statistics_across_read_batches_and_nans(monkeypatch):
    """The statistics pass reads a trajectory a batch at a time (here one frame a batch): the difference across
    two batches counts, and a NaN (a missing value) is left out of the values and of its two differences."""
    from dctdata.preprocess.sources.xarray_store import XarraySource

    src = ensemble()
    src["t2m"].values[1, 3, 2, 5] = np.nan
    whole = XarraySource(src, time_dim="time").info["trajectories"]["stats"]
    monkeypatch.setattr("dctdata.preprocess.sources.xarray_store.STATS_BATCH_BYTES", 1)
    batched = XarraySource(src, time_dim="time").info["trajectories"]["stats"]
    for name in ("t2m", "u", "mean_t"):
        assert_numpy_stats(batched[name], src[name].values)
        for key, value in whole[name].items():
            assert batched[name][key] == pytest.approx(value, rel=1e-12), (name, key)
