"""Time windows over a pack of trajectories (`dctdata.loaders.windows`), checked against The Well's own
`WellDataset` on the same files where `the_well` is installed.

`the_well` is not in the dev extras (it pins an old fsspec): install it with
`pip install --no-deps the-well einops pyyaml` to run the comparisons."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import dctdata
from dctdata.datasets.well import write_well_file
from dctdata.errors import DctDataError, FormatError
from dctdata.loaders.distributed import make_loader
from dctdata.loaders.windows import WindowDataset, windows_per_trajectory


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """A folder of two Well files (3 and 2 shallow-water trajectories of 20 steps, 32x32: a scalar, a
    vector and a constant field) and its pack at 40 dB."""
    d = tmp_path_factory.mktemp("well")
    raw = d / "train"
    raw.mkdir()
    write_well_file(raw / "a.h5", n_traj=3, n_steps=20, size=32, seed=0)
    write_well_file(raw / "b.h5", n_traj=2, n_steps=20, size=32, seed=1)
    m = dctdata.pack(str(raw), d / "sw.zarr", target_psnr=40, quiet=True)
    return raw, d / "sw.zarr", m


def _psnr(got: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """PSNR of every frame and channel of (T, x, y, F) windows, against the reference's value range (a
    constant reference channel: infinite when decoded exactly, else -inf)."""
    ref, got = ref.double(), got.double()
    span = ref.amax(dim=(1, 2)) - ref.amin(dim=(1, 2))
    mse = ((got - ref) ** 2).mean(dim=(1, 2))
    psnr = 10 * torch.log10(span**2 / mse)
    return torch.where(span == 0, torch.where(mse == 0, torch.inf, -torch.inf), psnr)


def _floor(m) -> float:
    return min(float(f.codec.min_psnr) for f in m.fields if f.is_dct)


@pytest.mark.parametrize(
    "options",
    [
        dict(n_steps_input=4, n_steps_output=1),
        dict(n_steps_input=2, n_steps_output=3, min_dt_stride=2, max_dt_stride=2),
        dict(n_steps_input=1, full_trajectory_mode=True),
        dict(n_steps_input=2, full_trajectory_mode=True, start_output_steps_at_t=6, max_rollout_steps=5),
    ],
    ids=["4in1out", "stride2", "rollout", "rollout_at6"],
)
def test_same_windows_as_welldataset(packed, options):
    the_well = pytest.importorskip("the_well.data")
    raw, pack, m = packed
    well = the_well.WellDataset(path=str(raw), **options)
    ours = dctdata.open_dataset(pack, **options)
    assert isinstance(ours, WindowDataset)
    assert len(ours) == len(well) > 0
    floor = _floor(m)
    assert floor >= 39.0  # the pack's per-sample floor for its 40 dB target
    for i in range(len(well)):
        ref = well[i]
        _, file_idx, sample_idx, time_idx, dt = well._load_one_sample(i)
        k, start, stride = ours.locate(i)  # the order mapping: same trajectory, start step and stride
        assert ours.trajectories[k][:2] == (file_idx, sample_idx) and (start, stride) == (time_idx, dt)
        got = ours[i]
        assert list(got) == list(ref)
        for key in ref:
            assert got[key].shape == ref[key].shape, key
            assert got[key].dtype == ref[key].dtype, key
        for key in ("input_fields", "output_fields"):
            assert _psnr(got[key], ref[key]).min() >= floor - 0.01, (i, key)  # every frame and channel
        for key in set(ref) - {"input_fields", "output_fields"}:
            torch.testing.assert_close(got[key], ref[key], rtol=1e-6, atol=0), key


def test_normalization_matches_welldataset_zscore(packed):
    the_well = pytest.importorskip("the_well.data")
    import yaml
    from the_well.data.normalization import ZScoreNormalization

    raw, pack, m = packed
    ours = dctdata.open_dataset(pack, n_steps_input=2, n_steps_output=1, normalization="zscore")
    stats_path = raw.parent / "stats.yaml"
    stats = ours.stats
    stats_path.write_text(yaml.safe_dump(stats))
    well = the_well.WellDataset(
        path=str(raw),
        n_steps_input=2,
        n_steps_output=1,
        use_normalization=True,
        normalization_type=ZScoreNormalization,
        normalization_path=str(stats_path),
    )
    plain = dctdata.open_dataset(pack, n_steps_input=2, n_steps_output=1)
    for i in (0, 7, len(ours) - 1):
        got, ref = ours[i], well[i]
        # a per-channel affine map keeps each frame's PSNR: the floor holds in normalized units too
        assert _psnr(got["input_fields"], ref["input_fields"]).min() >= _floor(m) - 0.01
        torch.testing.assert_close(got["constant_fields"], ref["constant_fields"], rtol=1e-5, atol=1e-5)
        assert not torch.allclose(got["input_fields"], plain[i]["input_fields"])


def test_rms_normalization_matches_welldataset(packed):
    the_well = pytest.importorskip("the_well.data")
    import yaml
    from the_well.data.normalization import RMSNormalization

    raw, pack, m = packed
    ours = dctdata.open_dataset(pack, n_steps_input=1, n_steps_output=1, normalization="rms")
    plain = dctdata.open_dataset(pack, n_steps_input=1, n_steps_output=1)
    stats_path = raw.parent / "stats_rms.yaml"
    stats_path.write_text(yaml.safe_dump(ours.stats))
    well = the_well.WellDataset(
        path=str(raw),
        n_steps_input=1,
        n_steps_output=1,
        use_normalization=True,
        normalization_type=RMSNormalization,
        normalization_path=str(stats_path),
    )
    rms = torch.tensor([ours.stats["rms"]["height"], *ours.stats["rms"]["velocity"]], dtype=torch.float32)
    for i in (1, len(ours) // 2):
        got, ref = ours[i], well[i]
        assert _psnr(got["output_fields"], ref["output_fields"]).min() >= _floor(m) - 0.01
        torch.testing.assert_close(got["constant_fields"], ref["constant_fields"], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got["input_fields"] * rms, plain[i]["input_fields"], rtol=1e-5, atol=1e-7)


def test_window_count_and_order_without_the_well(packed):
    """The mapping written out: trajectory after trajectory, start steps 0..W-1, W = S - dt*(n_in+n_out-1)."""
    _, pack, m = packed
    ds = dctdata.open_dataset(pack, n_steps_input=3, n_steps_output=2, dt_stride=2)
    per = windows_per_trajectory(20, 3, 2, 2)
    assert per == 20 - 2 * 4 and len(ds) == 5 * per
    assert ds.locate(per + 3) == (1, 3, 2)
    np.testing.assert_array_equal(ds.frame_indices(per + 3), 20 + 3 + 2 * np.arange(5))
    assert ds.locate(-1) == (4, per - 1, 2)
    assert ds.field_names == ["height", "velocity_x", "velocity_y"]
    assert ds.constant_field_names == ["bathymetry"]
    assert ds.stats["mean"]["height"] == pytest.approx(
        m.pack["source_info"]["trajectories"]["stats"]["height"]["mean"][0]
    )


def test_a_batch_reads_and_decodes_each_frame_once(packed, monkeypatch):
    _, pack, _ = packed
    ds = dctdata.open_dataset(pack, n_steps_input=4, n_steps_output=1)
    asked = []
    inner = ds.frames.__getitems__
    monkeypatch.setattr(ds.frames, "__getitems__", lambda idx: asked.append(list(idx)) or inner(idx))
    items = ds.__getitems__([0, 1, 2, 3])  # windows 0..3 of trajectory 0 share frames 0..7
    assert asked == [list(range(8))]
    for i, item in enumerate(items):
        torch.testing.assert_close(item["input_fields"], ds[i]["input_fields"])
    assert items[1]["input_fields"][0].equal(items[0]["input_fields"][1])  # one decode, shared


def test_stride_range_draws_are_seeded_by_epoch(packed):
    _, pack, _ = packed
    ds = dctdata.open_dataset(pack, n_steps_input=1, n_steps_output=1, dt_stride=(1, 4))
    assert len(ds) == 5 * windows_per_trajectory(20, 1, 1, 1)
    first = [ds.locate(i) for i in range(len(ds))]
    strides = {dt for _, _, dt in first}
    assert strides <= {1, 2, 3, 4} and len(strides) > 1
    for _, start, dt in first:
        assert start + dt * 1 < 20  # the window stays in its trajectory
    assert [ds.locate(i) for i in range(len(ds))] == first  # same epoch: same draws (a resumed run)
    ds.set_epoch(1)
    assert [ds.locate(i) for i in range(len(ds))] != first


def test_make_loader_serves_every_window_once_across_ranks(packed):
    _, pack, _ = packed
    seen = []
    for rank in range(2):
        ds = dctdata.open_dataset(pack, n_steps_input=2, n_steps_output=1)
        loader = make_loader(ds, batch_size=8, rank=rank, world_size=2, shuffle=True, seed=3)
        for batch in loader:
            assert batch["input_fields"].shape[1:] == (2, 32, 32, 3)
            # each window's time grid starts at 0; its first input frame identifies it with the frames' order
            seen += [round(float(v), 6) for v in batch["input_fields"][:, 0].sum(dim=(1, 2, 3))]
    ds = dctdata.open_dataset(pack, n_steps_input=2, n_steps_output=1)
    assert len(ds) % 2 == 0 and len(seen) == len(ds)
    everything = sorted(round(float(ds[i]["input_fields"][0].sum()), 6) for i in range(len(ds)))
    assert sorted(seen) == everything


def test_loader_resumes_mid_epoch(packed):
    _, pack, _ = packed
    ds = dctdata.open_dataset(pack, n_steps_input=2, n_steps_output=1)
    loader = make_loader(ds, batch_size=6, seed=1)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    rest = [b["output_fields"] for b in it]
    again = make_loader(dctdata.open_dataset(pack, n_steps_input=2, n_steps_output=1), batch_size=6, seed=1)
    again.load_state_dict(state)
    resumed = [b["output_fields"] for b in again]
    assert len(resumed) == len(rest) > 0
    for a, b in zip(resumed, rest):
        torch.testing.assert_close(a, b)


def test_errors(packed, tmp_path):
    _raw, pack, _ = packed
    flat = tmp_path / "flat.zarr"
    dctdata.pack(np.random.default_rng(0).random((4, 16, 16), dtype=np.float32), flat, quiet=True)
    with pytest.raises(DctDataError, match=r"expected a pack of trajectories .* Got a pack of independent samples"):
        dctdata.open_dataset(flat, n_steps_input=2)
    with pytest.raises(DctDataError, match=r"trajectory 0 \(file a\.h5 trajectory 0\): expected at least 21 steps"):
        dctdata.open_dataset(pack, n_steps_input=20, n_steps_output=1)
    with pytest.raises(DctDataError, match=r"dt_stride: expected min <= max. Got min 3, max 2"):
        dctdata.open_dataset(pack, dt_stride=(3, 2))
    with pytest.raises(DctDataError, match=r"full_trajectory_mode: expected one stride. Got a stride range 1..2"):
        dctdata.open_dataset(pack, dt_stride=(1, 2), full_trajectory_mode=True)
    with pytest.raises(DctDataError, match=r"normalization: expected one of \('zscore', 'rms'\)"):
        dctdata.open_dataset(pack, n_steps_input=2, normalization="minmax")
    with pytest.raises(TypeError, match="dt_stride: expected an int or a"):
        dctdata.open_dataset(pack, dt_stride="2")
    with pytest.raises(DctDataError, match="decode: expected one of"):
        dctdata.open_dataset(pack, n_steps_input=2, decode="gpu")
    with pytest.raises(DctDataError, match="on_error='skip': expected 'raise' for windows"):
        dctdata.open_dataset(pack, n_steps_input=2, on_error="skip")
    with pytest.raises(IndexError, match="window 999 out of range"):
        dctdata.open_dataset(pack, n_steps_input=2)[999]


def _write_3d(path, n_traj=2, n_steps=6, size=16):
    """A minimal 3-D Well file: one scalar field of travelling waves on a periodic cube."""
    import h5py

    c = (np.arange(size, dtype=np.float32) + 0.5) / size
    X, Y, Z = np.meshgrid(c, c, c, indexing="ij")
    t = np.arange(n_steps, dtype=np.float32) * 0.05
    data = np.stack(
        [
            np.stack([np.sin(2 * np.pi * (X + Y * (j + 1) - s)) * np.cos(2 * np.pi * Z) for s in t])
            for j in range(n_traj)
        ]
    ).astype(np.float32)
    with h5py.File(path, "w") as f:
        f.attrs.update(dataset_name="waves3d", grid_type="cartesian", n_spatial_dims=3, n_trajectories=n_traj)
        f.attrs["simulation_parameters"] = []
        dims = f.create_group("dimensions")
        dims.attrs["spatial_dims"] = ["x", "y", "z"]
        for name, values in (("time", t), ("x", c), ("y", c), ("z", c)):
            dims.create_dataset(name, data=values).attrs["sample_varying"] = False
        f.create_group("boundary_conditions")
        f.create_group("scalars").attrs["field_names"] = []
        g = f.create_group("t0_fields")
        g.attrs["field_names"] = ["wave"]
        d = g.create_dataset("wave", data=data)
        d.attrs.update(dim_varying=[True, True, True], sample_varying=True, time_varying=True)
        f.create_group("t1_fields").attrs["field_names"] = []
        f.create_group("t2_fields").attrs["field_names"] = []


def test_3d_well_data_packs_with_3d_blocks(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    _write_3d(raw / "w.h5")
    with pytest.raises(DctDataError, match=r"--dims 2: expected the data's spatial dims. Got 3-D frames .*--dims 3"):
        dctdata.pack(str(raw), tmp_path / "no.zarr", quiet=True)
    m = dctdata.pack(str(raw), tmp_path / "w.zarr", dims=3, quiet=True)  # no target: no calibration, fast
    assert m.field("wave").shape == (1, 16, 16, 16)
    ds = dctdata.open_dataset(tmp_path / "w.zarr", n_steps_input=2, n_steps_output=1)
    assert len(ds) == 2 * windows_per_trajectory(6, 2, 1, 1)
    item = ds[3]
    assert item["input_fields"].shape == (2, 16, 16, 16, 1) and item["space_grid"].shape == (16, 16, 16, 3)
    assert item["boundary_conditions"].tolist() == [[1.0, 1.0]] * 3  # open: no boundary groups
    the_well = pytest.importorskip("the_well.data")
    well = the_well.WellDataset(path=str(raw), n_steps_input=2, n_steps_output=1)
    assert len(well) == len(ds)
    for i in range(len(ds)):
        ref, got = well[i], ds[i]
        assert {k: v.shape for k, v in got.items()} == {k: v.shape for k, v in ref.items()}
        psnr = _psnr(got["output_fields"].flatten(1, 2), ref["output_fields"].flatten(1, 2))
        assert psnr.min() >= m.stats["wave"].psnr_min - 0.01  # each frame: at least the pack's worst sample


def test_a_netcdf_style_series_packed_along_time_serves_windows(tmp_path):
    """A store packed with --sample-dim time is one trajectory: windows over its samples, time values in
    seconds from the first, the grid from its coordinates; no statistics to normalize with."""
    xr = pytest.importorskip("xarray")
    rng = np.random.default_rng(0)
    times = np.array("2020-01-01T00", dtype="datetime64[ns]") + np.arange(12) * np.timedelta64(6, "h")
    lat, lon = np.linspace(-10, 10, 16), np.linspace(0, 30, 32)
    base = np.sin(lat[:, None] / 5) * np.cos(lon[None, :] / 7)
    t2m = np.stack([base * (1 + 0.1 * k) + 0.01 * rng.standard_normal(base.shape) for k in range(12)])
    ds = xr.Dataset(
        {"t2m": (("time", "lat", "lon"), t2m.astype(np.float32))}, coords={"time": times, "lat": lat, "lon": lon}
    )
    dctdata.pack(ds, tmp_path / "era.zarr", sample_dim="time", quiet=True)
    win = dctdata.open_dataset(tmp_path / "era.zarr", n_steps_input=3, n_steps_output=2)
    assert len(win) == 12 - 5 + 1 and win.field_names == ["t2m"]
    item = win[2]
    assert item["input_fields"].shape == (3, 16, 32, 1) and item["output_fields"].shape == (2, 16, 32, 1)
    ref = t2m[2:5]
    assert np.abs(item["input_fields"][..., 0].numpy() - ref).max() < 0.05 * (ref.max() - ref.min())
    assert item["space_grid"].shape == (16, 32, 2) and item["space_grid"][0, -1].tolist() == pytest.approx([-10, 30])
    full = dctdata.open_dataset(tmp_path / "era.zarr", n_steps_input=1, n_steps_output=1, normalize_time_grid=False)
    assert full[3]["input_time_grid"].tolist() == [3 * 6 * 3600.0]
    with pytest.raises(FormatError, match="normalization: expected statistics of field 't2m'"):
        dctdata.open_dataset(tmp_path / "era.zarr", n_steps_input=1, normalization="zscore")


def test_device_decode_of_a_target_pack_is_the_cpu_decode(packed):
    """decode="device" on the 40 dB pack (its calibrated codec): a batch's distinct frames cross once and
    `ds.decompressor()` gives the decode="cpu" batch bit for bit, z-scored as the dataset says."""
    _, pack, _ = packed
    opts = dict(n_steps_input=3, n_steps_output=1, normalization="zscore")
    cpu = dctdata.open_dataset(pack, **opts)
    dev = dctdata.open_dataset(pack, decode="device", **opts)
    want = next(iter(make_loader(cpu, batch_size=8, shuffle=False)))
    batch = next(iter(make_loader(dev, batch_size=8, shuffle=False)))
    assert batch["frames"]["ids"].tolist() == list(range(11))  # windows 0..7 of trajectory 0: frames 0..10
    got = dev.decompressor()(batch)
    assert list(got) == list(want)
    for key in want:
        assert torch.equal(got[key], want[key]), key


@pytest.mark.parametrize("group", [1, 4])
def test_decode_ahead_decodes_window_batches_like_the_decompressor(packed, group, monkeypatch):
    """`DecodeAhead(loader, ds.decompressor(), group)` on decode="device" windows: each group's distinct frames
    decoded in one merged call per field, each batch then normalized and gathered: the batches the decompressor
    gives one at a time, bit for bit, a last partial group too; a batch of samples instead is named."""
    from dctdata.loaders.decode_ahead import DecodeAhead

    _, pack, _ = packed
    opts = dict(n_steps_input=2, n_steps_output=2, normalization="zscore")
    dev = dctdata.open_dataset(pack, decode="device", **opts)
    batches = list(make_loader(dev, batch_size=16, shuffle=False))
    assert group == 1 or len(batches) % group  # a last, partial group
    decode = dev.decompressor()
    want = [decode(b) for b in batches]
    calls = []
    for layer in decode.layers.values():
        deferred = layer.forward_stored_deferred
        monkeypatch.setattr(layer, "forward_stored_deferred", lambda b, d=deferred: calls.append(b) or d(b))
    got = list(DecodeAhead(batches, decode, group=group))
    assert len(got) == len(want) == len(batches)
    n_groups = -(-len(batches) // group)
    assert len(calls) == n_groups * len(decode.layers)  # one merged decode per field and group
    assert sum(len(c) for c in calls) == sum(len(b["frames"]["ids"]) for b in batches) * len(decode.layers)
    for g, w in zip(got, want):
        assert list(g) == list(w) and "frames" not in g
        for key in w:
            assert torch.equal(g[key], w[key]), key
    samples = [{"image": torch.zeros(2, 4, 4)}]
    with pytest.raises(
        DctDataError, match=r"batch 0: expected a batch of decode='device' windows .* Got keys \['image'\]"
    ):
        list(DecodeAhead(samples, decode))
