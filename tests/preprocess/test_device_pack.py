"""`--device cuda`: the device pack (dctdata.preprocess.device_pack). CI has no GPU, so most tests run the
device path's own code on CPU tensors (`torch_device` replaced) and check it stores what the CPU pack stores;
the `cuda` tests run it on a GPU, where rounding at quantization boundaries may differ."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
from pack_checks import difference
from sample_fields import poisson_fields

import dctdata
from dctdata.cli import main
from dctdata.errors import DctDataError
from dctdata.preprocess import device_pack
from dctdata.settings import PackSettings

SMALL = {"shard_samples": 8, "chunk_samples": 4}  # several parts, so several writer threads have work


@pytest.fixture
def on_cpu(monkeypatch):
    """The device path with torch CPU tensors; counts the samples its device encode took."""
    monkeypatch.setattr(device_pack, "torch_device", lambda name: torch.device("cpu"))
    monkeypatch.setattr(device_pack, "batch_size", lambda specs: 3)  # several batches a part, the last one short
    calls = []
    real = device_pack.DeviceEncoder.encode_field  # the device route's; its CPU route is a plain Encoder's

    def counted(self, f, xt, *args):
        calls.append(len(xt))
        return real(self, f, xt, *args)

    monkeypatch.setattr(device_pack.DeviceEncoder, "encode_field", counted)
    return calls


def files(root) -> dict[str, bytes]:
    out = {}
    for d, _, names in os.walk(root):
        for n in names:
            p = os.path.join(d, n)
            out[os.path.relpath(p, root)] = open(p, "rb").read()
    return out


def same_pack(a, b) -> None:
    fa, fb = files(a), files(b)
    assert sorted(fa) == sorted(fb)
    for rel in fa:
        if rel == "manifest.json":
            ma, mb = json.loads(fa[rel]), json.loads(fb[rel])
            assert ma == mb
        else:
            assert fa[rel] == fb[rel], rel


@pytest.mark.parametrize(
    "kw",
    [dict(target_psnr=40), dict(cf=4, quant="int8"), dict(cf=3, quant="int16", lossless={"id": "zstd", "level": 3})],
    ids=["target", "fixed", "zstd"],
)
def test_the_device_path_stores_the_cpu_packs_bytes(tmp_path, on_cpu, kw):
    x = poisson_fields(16, 2, 24, 40)
    cpu = dctdata.pack(x, tmp_path / "cpu.dct", quiet=True, writer_options=SMALL, **kw)
    dev = dctdata.pack(x, tmp_path / "dev.dct", quiet=True, writer_options=SMALL, device="cuda", workers=3, **kw)
    assert sum(on_cpu) == len(x)  # every batch went through the device encode, none through the CPU route
    same_pack(tmp_path / "cpu.dct", tmp_path / "dev.dct")
    assert dev.fields[0].codec == cpu.fields[0].codec
    diff = difference(tmp_path / "cpu.dct", tmp_path / "dev.dct")
    assert diff["coefficients"] == len(x) * np.prod(cpu.fields[0].codec.coeff_shape)
    # on a GPU the share may be above 0 (rounding at quantization boundaries): the bound the bench reports
    assert diff["differing"] <= 1e-3 * diff["coefficients"]
    a, b = diff["bytes"]
    assert abs(a - b) <= 0.005 * a


def test_a_webdataset_device_pack_is_the_cpu_packs(tmp_path, on_cpu):
    x = poisson_fields(24, 1, 24, 24)
    kw = dict(format="webdataset", target_psnr=40, quiet=True, samples_per_shard=8)
    dctdata.pack(x, tmp_path / "cpu.dct", **kw)
    dctdata.pack(x, tmp_path / "dev.dct", device="cuda", workers=2, **kw)
    assert sum(on_cpu) == len(x) and len(files(tmp_path / "dev.dct")) == 4  # three shards and the manifest
    same_pack(tmp_path / "cpu.dct", tmp_path / "dev.dct")


def fail_writing_part(monkeypatch, part: int):
    """The zarr writer fails ("disk full") when it writes part `part`; returns what puts the writer back."""
    from dctdata.format.zarr.writer import ZarrWriter

    real = ZarrWriter.write_part

    def failing(self, root, fields, n, index, *args):
        if index == part:
            raise OSError("disk full (test)")
        return real(self, root, fields, n, index, *args)

    monkeypatch.setattr(ZarrWriter, "write_part", failing)
    return lambda: monkeypatch.setattr(ZarrWriter, "write_part", real)


def test_an_interrupted_device_pack_resumes_to_the_cpu_packs_bytes(tmp_path, on_cpu, monkeypatch):
    np.save(tmp_path / "x.npy", poisson_fields(40, 1, 16, 16))
    kw = dict(cf=4, quant="int8", quiet=True, writer_options=SMALL)
    dctdata.pack(tmp_path / "x.npy", tmp_path / "cpu.dct", **kw)
    writes_again = fail_writing_part(monkeypatch, 3)
    with pytest.raises(OSError, match=r"disk full \(test\)"):
        dctdata.pack(tmp_path / "x.npy", tmp_path / "dev.dct", device="cuda", workers=2, **kw)
    assert (tmp_path / ".dev.dct.partial").is_dir()
    writes_again()
    dctdata.pack(tmp_path / "x.npy", tmp_path / "dev.dct", device="cuda", resume=True, **kw)
    same_pack(tmp_path / "cpu.dct", tmp_path / "dev.dct")


@pytest.mark.slow
def test_bounded_packs_take_the_cpu_route_with_their_corrections(tmp_path, on_cpu):
    x = poisson_fields(8, 1, 16, 16)
    kw = dict(max_rel_error=0.02, quant="int16", quiet=True, writer_options=SMALL)
    m = dctdata.pack(x, tmp_path / "cpu.dct", **kw)
    dctdata.pack(x, tmp_path / "dev.dct", device="cuda", **kw)
    assert m.fields[0].codec.corrections is not None and sum(on_cpu) == 0
    same_pack(tmp_path / "cpu.dct", tmp_path / "dev.dct")


def test_integer_sources_convert_on_the_device_like_on_the_cpu(tmp_path, on_cpu):
    f = poisson_fields(12, 1, 32, 32)
    x = ((f - f.min()) / np.ptp(f) * 60000 + 2000).astype(np.uint16)
    x[0, 0, 0, :4] = [0, 65535, 32768, 40000]  # past int16: the upload's unwrap must restore them
    dctdata.pack(x, tmp_path / "cpu.dct", quiet=True, target_psnr=45, writer_options=SMALL)
    dctdata.pack(x, tmp_path / "dev.dct", quiet=True, target_psnr=45, writer_options=SMALL, device="cuda")
    assert sum(on_cpu) == len(x)
    same_pack(tmp_path / "cpu.dct", tmp_path / "dev.dct")


def test_batches_with_non_finite_values_take_the_cpu_route(tmp_path, on_cpu):
    x = poisson_fields(16, 1, 24, 24)
    x[9, 0, 3, 3] = np.nan
    dctdata.pack(x, tmp_path / "cpu.dct", quiet=True, cf=4, quant="int8", nan="mask", writer_options=SMALL)
    dctdata.pack(
        x, tmp_path / "dev.dct", quiet=True, cf=4, quant="int8", nan="mask", writer_options=SMALL, device="cuda"
    )
    assert sum(on_cpu) == 0  # the derived mask field: the CPU Encoder, unchanged
    same_pack(tmp_path / "cpu.dct", tmp_path / "dev.dct")


def test_a_data_error_stops_the_pipeline_with_the_cpu_packs_message(tmp_path, on_cpu):
    x = poisson_fields(40, 1, 16, 16)
    x[29, 0, 1, 1] = np.inf
    with pytest.raises(DctDataError, match=r"sample 29: field 'x': expected finite values in a dct field"):
        dctdata.pack({"x": x}, tmp_path / "dev.dct", quiet=True, cf=4, writer_options=SMALL, device="cuda")
    assert not (tmp_path / "dev.dct").exists() and not (tmp_path / ".dev.dct.partial").exists()


def test_a_writer_error_stops_the_pipeline(tmp_path, on_cpu, monkeypatch):
    fail_writing_part(monkeypatch, 2)
    with pytest.raises(OSError, match=r"disk full \(test\)"):
        dctdata.pack(
            poisson_fields(64, 1, 16, 16), tmp_path / "d.dct", quiet=True, cf=4, writer_options=SMALL, device="cuda"
        )


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error when CUDA is missing")
def test_without_cuda_a_device_pack_is_one_clear_error(tmp_path, capsys):
    x = poisson_fields(4, 1, 16, 16)
    with pytest.raises(
        DctDataError, match=r"--device cuda: expected a CUDA device \(torch.cuda.is_available\(\)\)\. Got none"
    ):
        dctdata.pack(x, tmp_path / "o.dct", quiet=True, device="cuda")
    assert not (tmp_path / "o.dct").exists()
    np.save(tmp_path / "x.npy", x)
    assert main(["pack", str(tmp_path / "x.npy"), str(tmp_path / "o.dct"), "--device", "cuda:1", "--quiet"]) == 1
    assert "--device cuda:1: expected a CUDA device" in capsys.readouterr().err


@pytest.mark.parametrize(
    "kw, error, message",
    [
        (
            dict(device="tpu"),
            DctDataError,
            r"--device: expected cpu, cuda or cuda:N \(a CUDA device index\)\. Got 'tpu'",
        ),
        (dict(device="cuda:x"), DctDataError, r"--device: expected cpu, cuda or cuda:N .*Got 'cuda:x'"),
        (dict(device=0), TypeError, r"device: expected 'cpu', 'cuda' or 'cuda:N'\. Got 0 of type int"),
        (
            dict(device="cuda", scheduler="tcp://h:8786"),
            DctDataError,
            r"--device cuda/--scheduler: expected one of them .*Got scheduler='tcp://h:8786'",
        ),
    ],
)
def test_device_settings_are_checked(kw, error, message):
    with pytest.raises(error, match=message):
        PackSettings(**kw)


def test_an_iterable_source_is_refused_on_a_device(tmp_path, on_cpu):
    with pytest.raises(DctDataError, match=r"--device cuda: expected a source with random access"):
        dctdata.pack(iter(poisson_fields(4, 1, 16, 16)), tmp_path / "o.dct", quiet=True, device="cuda", length=4)


def test_writer_threads_follow_workers():
    assert device_pack.writer_threads(3) == 3
    assert device_pack.writer_threads(None) == max(1, (os.cpu_count() or 2) - 1)


def near_cpu_pack(tmp_path, kw) -> dict:
    """Pack the same fields on the CPU and with the device path; check the device pack is the CPU pack up to
    rounding at quantization boundaries and keeps its promises; returns the difference."""
    x = poisson_fields(24, 1, 32, 32)
    cpu = dctdata.pack(x, tmp_path / "cpu.dct", quiet=True, writer_options=SMALL, **kw)
    dev = dctdata.pack(x, tmp_path / "dev.dct", quiet=True, writer_options=SMALL, device="cuda", **kw)
    assert dev.fields[0].codec == cpu.fields[0].codec  # calibration chose the same codec
    diff = difference(tmp_path / "cpu.dct", tmp_path / "dev.dct")
    assert diff["differing"] <= 1e-3 * diff["coefficients"] and diff["largest"] <= 1
    a, b = diff["bytes"]
    assert abs(a - b) <= 0.005 * a
    codec = dev.fields[0].codec
    ds = dctdata.open_dataset(tmp_path / "dev.dct")
    layer = ds.decompressor()
    y = np.stack([layer(ds[i][0]).double().numpy() for i in range(len(ds))])
    err = np.abs(y - x).reshape(len(x), -1)
    rng = np.ptp(x.reshape(len(x), -1), axis=1)
    if codec.min_psnr is not None:  # the floor, on every sample, from the device pack's own decode
        psnr = 10 * np.log10(rng**2 / (err**2).mean(1))
        assert psnr.min() >= codec.min_psnr - 1e-3
    if codec.max_rel_error is not None:
        assert (err.max(1) <= codec.max_rel_error * rng * (1 + 1e-6)).all()
    return diff


def test_the_promises_hold_on_the_device_path(tmp_path, on_cpu):
    diff = near_cpu_pack(tmp_path, dict(target_psnr=40))
    assert diff["differing"] == 0 and sum(on_cpu) == 24  # on CPU tensors: the same arithmetic, the same bytes


@pytest.mark.cuda
@pytest.mark.parametrize(
    "kw", [dict(target_psnr=40), dict(cf=4, quant="int8"), dict(target_psnr=35, max_rel_error=0.02)]
)
def test_a_cuda_pack_is_the_cpu_pack_up_to_rounding(tmp_path, kw):
    near_cpu_pack(tmp_path, kw)


def test_pinned_copies_keep_every_dct_field_exact(monkeypatch):
    # pin_memory needs CUDA: here the copy into the pinned buffer is checked with an ordinary one
    real = torch.empty
    monkeypatch.setattr(device_pack.torch, "empty", lambda *a, pin_memory=False, **kw: real(*a, **kw))
    batch = {
        "u": np.array([[0, 40000, 65535]], np.uint16),
        "f": np.arange(6, dtype=np.float32).reshape(2, 3),
        "d": np.ones((1, 2), np.float64),  # float64: left for the CPU route's float32 check
        "label": np.arange(3),
    }
    out = device_pack._pinned(batch, {"u", "f", "d"})
    assert isinstance(out["u"], torch.Tensor) and out["u"].dtype == torch.uint16
    assert out["u"].numpy().tolist() == [[0, 40000, 65535]]
    assert isinstance(out["f"], torch.Tensor) and np.array_equal(out["f"].numpy(), batch["f"])
    assert isinstance(out["d"], np.ndarray) and isinstance(out["label"], np.ndarray)


@pytest.mark.cuda
def test_a_cuda_pack_of_uint16_frames_is_the_cpu_pack_up_to_rounding(tmp_path):
    f = poisson_fields(16, 1, 64, 64)
    x = ((f - f.min()) / np.ptp(f) * 60000 + 2000).astype(np.uint16)  # past int16: the upload's unwrap
    dctdata.pack(x, tmp_path / "cpu.dct", quiet=True, target_psnr=45, writer_options=SMALL)
    dctdata.pack(x, tmp_path / "dev.dct", quiet=True, target_psnr=45, writer_options=SMALL, device="cuda")
    diff = difference(tmp_path / "cpu.dct", tmp_path / "dev.dct")
    assert diff["differing"] <= 1e-3 * diff["coefficients"] and diff["largest"] <= 1
    a, b = diff["bytes"]
    assert abs(a - b) <= 0.005 * a


def test_device_pack_records_the_figures_per_time_step(tmp_path, on_cpu):
    """A trajectory pack on the device records the CPU pack's fidelity over time (issue 47)."""
    from dctdata.datasets.well import write_well_file

    write_well_file(tmp_path / "a.h5", n_traj=2, n_steps=8, size=16, seed=0)
    kw = dict(cf=4, quant="int8", quiet=True)
    cpu = dctdata.pack(str(tmp_path / "a.h5"), tmp_path / "cpu.dct", workers=1, **kw)
    dev = dctdata.pack(str(tmp_path / "a.h5"), tmp_path / "dev.dct", device="cuda", workers=2, **kw)
    assert sum(on_cpu) > 0  # the device route encoded
    record = dev.pack["fidelity_over_time"]
    assert record == cpu.pack["fidelity_over_time"] and record["steps"] == 8
    assert sorted(record["fields"]) == ["height", "velocity"] and len(record["fields"]["velocity"]) == 8
