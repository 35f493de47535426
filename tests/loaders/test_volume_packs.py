"""Volumes end to end: `dims=3` / `--dims 3` packs of synthetic turbulence-like volumes in both storages, read back
by the loaders and decoded by the dataset's own first layer (`ds.decompressor()`, `VolumeDecompress`), with
decode="cpu" and decode="device" (the stored streams cross and the layer decodes them), on the CPU and (marked
`cuda`) on a GPU; the Writer, the CLI's flag and hint, NaN masks and the errors a user can hit.

    pytest -q tests/loaders/test_volume_packs.py
    pytest -q -m cuda tests/loaders/test_volume_packs.py       # on a GPU
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

import dctdata
from dctdata.cli import main
from dctdata.datasets.volumes import advected_scalar, power_law_field, velocity_component
from dctdata.decoder.wire import StoredBatch
from dctdata.encoder.calibrate import dataset_psnr
from dctdata.errors import DctDataError
from dctdata.format.manifest import VOLUMES_VERSION

SIZE = (20, 24, 28)  # not multiples of 8: padded like the 2-D case


@pytest.fixture(scope="module")
def volumes() -> np.ndarray:
    """(4, D, H, W) float32: two power-law density fields and two velocity components."""
    return np.concatenate([power_law_field(n=2, size=SIZE), velocity_component(n=2, size=SIZE)])


@pytest.fixture(scope="module")
def packs(volumes, tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("volume-packs")
    out = {}
    for fmt in ("zarr", "webdataset"):
        out[fmt] = str(root / fmt)
        dctdata.pack(volumes, out[fmt], dims=3, format=fmt, target_psnr=40, quiet=True)
    return out


def psnr(x: np.ndarray, y: np.ndarray) -> float:
    """Dataset PSNR of (N, C, D, H, W) volumes, each (sample, channel) volume one item."""
    items = lambda a: torch.from_numpy(np.asarray(a, np.float32).reshape(*a.shape[:2], -1, a.shape[-1]))  # noqa: E731
    return dataset_psnr(items(x), items(y))


def all_samples(ds, decode_device=None):
    """Every sample's coefficients batched as a DataLoader collates them, and the keys order (webdataset streams
    samples in its own order: matched back by value)."""
    loader = torch.utils.data.DataLoader(ds, batch_size=len(ds) if hasattr(ds, "__len__") else 4)
    return next(iter(loader))[0]


def match(volumes: np.ndarray, decoded: np.ndarray) -> np.ndarray:
    """decoded rows reordered to volumes' order (each to the volume it is closest to)."""
    order = [int(np.argmin([np.mean((d - v) ** 2) for v in volumes])) for d in decoded]
    assert sorted(order) == list(range(len(volumes)))
    return decoded[np.argsort(order)]


@pytest.mark.parametrize("fmt", ["zarr", "webdataset"])
@pytest.mark.parametrize("decode", ["cpu", "device"])
def test_packed_volumes_decode_through_the_first_layer(volumes, packs, fmt, decode):
    ds = dctdata.open_dataset(packs[fmt], decode=decode)
    f = ds.manifest.field(kind="dct")
    assert ds.manifest.version >= VOLUMES_VERSION
    assert f.shape == (1, *SIZE) and f.codec.depth == SIZE[0] and f.codec.mask in ("cube", "tetra")
    assert f.lossless["id"] == "dctdata_ctxrans"  # the entropy coder takes 8x8x8 blocks (cube up to cf 8)
    batch = all_samples(ds)
    assert isinstance(batch, StoredBatch) == (decode == "device")
    layer = ds.decompressor()
    assert type(layer).__name__ == "VolumeDecompress"
    with torch.inference_mode():
        out = layer(batch)
    assert out.shape == (len(volumes), 1, *SIZE) and out.dtype == torch.float32
    rec = match(volumes, out[:, 0].numpy())
    achieved = psnr(volumes[:, None], rec[:, None])
    assert achieved >= 39.5  # the calibration's target, less its margin
    assert abs(achieved - ds.manifest.stats[f.name].psnr_dataset) < 0.05  # what the manifest says it achieved


def test_volume_packs_are_smaller_than_the_same_data_as_2d_channels(volumes, packs, tmp_path):
    """The same volumes packed as today's 2-D layout (D channels of 8x8 blocks) at the same target."""
    flat = dctdata.pack(volumes, tmp_path / "flat", target_psnr=40, quiet=True)
    vol = dctdata.open_dataset(packs["zarr"]).manifest
    assert flat.field(kind="dct").shape == (SIZE[0], *SIZE[1:]) and flat.field(kind="dct").codec.depth is None
    assert vol.stored_bytes < flat.stored_bytes


def test_writer_packs_volumes(volumes, tmp_path):
    out = tmp_path / "w"
    with dctdata.Writer(out, dims=3, target_psnr=35, quiet=True) as w:
        for v in volumes:
            w.write({"rho": v, "label": 1})
    ds = dctdata.open_dataset(out, as_dict=True)
    assert ds.manifest.field("rho").shape == (1, *SIZE)
    rec = ds.decompressor("rho")(ds[0 : len(ds)]["rho"]).numpy()
    assert psnr(volumes[:, None], rec) >= 34.5


def test_channels_of_volumes_and_nan_masks(tmp_path):
    """(N, C, D, H, W) samples of two channels; NaN voxels with --nan mask are filled in 3-D and masked."""
    x = np.stack([advected_scalar(n=3, size=(16, 16, 24), steps=4), power_law_field(n=3, size=(16, 16, 24))], 1)
    x[0, 0, 3:9, 2:5, 10:20] = np.nan
    m = dctdata.pack(x, tmp_path / "nan", dims=3, nan="mask", target_psnr=38, quiet=True)
    f = m.field(kind="dct")
    assert f.shape == (2, 16, 16, 24) and f.valid is not None
    ds = dctdata.open_dataset(tmp_path / "nan", as_dict=True)
    batch = ds[0 : len(ds)]
    valid = np.asarray(batch[f.valid], bool)
    assert valid.shape == x.shape and not valid[0, 0, 3:9, 2:5, 10:20].any() and valid.sum() == np.isfinite(x).sum()
    rec = ds.decompressor()(batch[f.name]).numpy()
    assert np.isfinite(rec).all()
    err = np.abs(rec - np.nan_to_num(x))[valid]
    assert err.max() < 0.2 * (np.nanmax(x) - np.nanmin(x))


def test_user_errors_name_what_was_expected(volumes, tmp_path):
    with pytest.raises(DctDataError, match=r"expected 1, 2 or 3 dims per sample .* \(a volume\? --dims 3 packs"):
        dctdata.pack(volumes[:, None], tmp_path / "a", quiet=True)  # (N, 1, D, H, W) without dims=3
    with pytest.raises(DctDataError, match=r"expected 3 or 4 dims per sample for kind dct with --dims 3"):
        dctdata.pack(volumes[:, None, None], tmp_path / "b", dims=3, quiet=True)
    with pytest.raises(DctDataError, match=r"--mask tetra: expected --dims 3"):
        dctdata.pack(volumes, tmp_path / "c", mask="tetra", quiet=True)
    with pytest.raises(DctDataError, match=r"--dims: expected 2 or 3"):
        dctdata.pack(volumes, tmp_path / "d", dims=1, quiet=True)
    assert not [p for p in os.listdir(tmp_path) if not p.startswith(".")]  # nothing half-written


def test_cli_dims_flag_and_the_volume_hint(volumes, tmp_path, capsys):
    src = tmp_path / "v.npy"
    np.save(src, volumes)
    assert main(["pack", str(src), str(tmp_path / "flat"), "--cf", "4", "--quant", "int8"]) == 0
    out = capsys.readouterr().out
    assert f"hint: image: {SIZE[0]} channels of {SIZE[1]} x {SIZE[2]}" in out and "--dims 3" in out
    rc = main(
        ["pack", str(src), str(tmp_path / "vol"), "--dims", "3", "--mask", "tetra", "--cf", "6", "--quant", "int8"]
    )
    out = capsys.readouterr().out
    assert rc == 0 and "hint" not in out and "cf=6 tetra int8" in out
    manifest = json.loads((tmp_path / "vol" / "manifest.json").read_text())
    assert manifest["version"] >= VOLUMES_VERSION and manifest["pack"]["dims"] == 3


@pytest.mark.cuda
@pytest.mark.parametrize("fmt", ["zarr", "webdataset"])
@pytest.mark.parametrize("decode", ["cpu", "device"])
def test_packed_volumes_decode_on_cuda_as_on_the_cpu(volumes, packs, fmt, decode):
    ds = dctdata.open_dataset(packs[fmt], decode=decode)
    batch = all_samples(ds)
    layer = ds.decompressor()
    with torch.inference_mode():
        cpu = layer(batch)
        gpu_batch = batch.to("cuda") if isinstance(batch, StoredBatch) else [t.cuda() for t in batch]
        gpu = layer.cuda()(gpu_batch)
    assert gpu.is_cuda and gpu.shape == cpu.shape
    torch.testing.assert_close(gpu.cpu(), cpu, atol=2e-5 * float(cpu.abs().max()), rtol=0)


def test_netcdf_and_hdf5_variables_with_a_level_axis(tmp_path):
    """A (time, level, lat, lon) NetCDF variable is one volume a time step with --sample-dim time --dims 3; two
    such variables --stack as the channels of one field; an HDF5 (N, D, H, W) dataset packs like the array."""
    import h5py
    import xarray as xr

    u = power_law_field(n=3, size=(8, 16, 24), seed=7)
    v = velocity_component(n=3, size=(8, 16, 24), seed=8)
    dims = ("time", "level", "lat", "lon")
    xr.Dataset({"u": (dims, u), "v": (dims, v)}, coords={"time": np.arange(3)}).to_netcdf(
        tmp_path / "run.nc", engine="h5netcdf"
    )
    m = dctdata.pack(
        tmp_path / "run.nc", tmp_path / "nc", dims=3, sample_dim="time", stack="uv", target_psnr=40, quiet=True
    )
    f = m.field("uv")
    assert f.shape == (2, 8, 16, 24) and f.codec.depth == 8
    ds = dctdata.open_dataset(tmp_path / "nc", as_dict=True)
    rec = ds.decompressor("uv")(ds[0:3]["uv"]).numpy()
    assert psnr(np.stack([u, v], 1), rec) >= 39.5
    with h5py.File(tmp_path / "v.h5", "w") as h5:
        h5["rho"] = u
    m = dctdata.pack(tmp_path / "v.h5", tmp_path / "h5", dims=3, key="rho", target_psnr=40, quiet=True)
    assert m.field("rho").shape == (1, 8, 16, 24) and m.field("rho").codec.depth == 8


@pytest.mark.parametrize("fmt", ["zarr", "webdataset"])
def test_volume_packs_keep_a_pointwise_bound(volumes, tmp_path, fmt):
    """Volumes take --max-rel-error like images: every value of every sample within 1e-3 of its item's range,
    with corrections for the values a coarser step misses, in both storages."""
    x = volumes[:6].copy()
    x[2, 3, 4, 5] += 50 * x[2].std()  # an outlier
    out = tmp_path / fmt
    m = dctdata.pack(x, out, dims=3, format=fmt, max_rel_error=1e-3, quiet=True)
    f = m.fields[0]
    assert f.codec.depth is not None and f.codec.max_rel_error == 1e-3 and f.codec.corrections is not None
    ds = dctdata.open_dataset(out, as_dict=True, **({"shuffle": False} if fmt == "webdataset" else {}))
    items = [ds[i] for i in range(len(ds))] if fmt == "zarr" else list(ds)
    field = f.name
    q = torch.stack([it[field][0] for it in items])
    side = torch.stack([it[field][1] for it in items])
    y = ds.decompressor(field, normalize=False)((q, side)).double().numpy()[:, 0]
    xd = x.astype(np.float64)
    rng = xd.reshape(len(x), -1).max(1) - xd.reshape(len(x), -1).min(1)
    err = np.abs(y - xd).reshape(len(x), -1).max(1)
    assert (err <= 1e-3 * rng).all(), err / rng
