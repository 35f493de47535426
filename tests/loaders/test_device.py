"""Device path: to_device on nested batches, DevicePrefetcher (CPU here, CUDA when present), with_decompress."""

from __future__ import annotations

import warnings
from collections import OrderedDict, namedtuple

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

import dctdata
from dctdata import CodecSpec, DctDataError, Decompress
from dctdata.loaders.device import AugmentOnDevice, DevicePrefetcher, pin, resolve_device, to_device, with_decompress

cuda = pytest.mark.cuda  # skipped without a CUDA device (conftest.py)
Pair = namedtuple("Pair", "coeffs label")


def _nested():
    return {
        "coeffs": torch.randint(-128, 127, (2, 1, 4, 9, 4), dtype=torch.int8),
        "parts": [torch.randn(2, 3, dtype=torch.float16), (torch.tensor([True, False]), torch.arange(2))],
        "pair": Pair(torch.zeros(2, dtype=torch.bfloat16), torch.ones(2, dtype=torch.int64)),
        "meta": {"name": "x", "n": 3, "none": None},
    }


def _assert_same(a, b, device):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and b.device.type == torch.device(device).type
        assert b.dtype == a.dtype and torch.equal(a, b.cpu())
    elif isinstance(a, dict):
        assert type(b) is type(a) and a.keys() == b.keys()
        for k in a:
            _assert_same(a[k], b[k], device)
    elif isinstance(a, (list, tuple)):
        assert type(b) is type(a) and len(a) == len(b)
        for x, y in zip(a, b):
            _assert_same(x, y, device)
    else:
        assert a == b


# to_device -------------------------------------------------------------------------------------
def test_to_device_nested_keeps_structure_and_dtypes():
    batch = _nested()
    out = to_device(batch, "cpu")
    _assert_same(batch, out, "cpu")
    assert isinstance(out["pair"], Pair) and out["pair"].label.dtype == torch.int64


def test_to_device_keeps_mapping_type():
    batch = OrderedDict(b=torch.ones(1), a=torch.zeros(1))
    out = to_device(batch, torch.device("cpu"))
    assert type(out) is OrderedDict and list(out) == ["b", "a"]


def test_to_device_bare_tensor_and_passthrough():
    t = torch.arange(5, dtype=torch.int16)
    assert to_device(t, "cpu").dtype == torch.int16
    assert to_device(None, "cpu") is None
    assert to_device("label", "cpu") == "label"


def test_resolve_device():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(None).type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(DctDataError, match=r"device: expected a device name such as 'cpu' or 'cuda:0'. Got 'gpu0'"):
        resolve_device("gpu0")
    with pytest.raises(TypeError, match=r"device: expected a torch.device"):
        resolve_device(1.5)
    with pytest.raises(TypeError, match=r"device: expected a torch.device"):
        to_device(torch.ones(1), True)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error when CUDA is missing")
def test_cuda_requested_without_cuda():
    with pytest.raises(
        DctDataError, match=r"device: expected an available device. Got 'cuda' but CUDA is not available"
    ):
        DevicePrefetcher([torch.ones(1)], "cuda")


# DevicePrefetcher on CPU -------------------------------------------------------------------------
def test_prefetcher_cpu_len_and_two_epochs():
    x = torch.randn(10, 1, 4, 9, 4)
    y = torch.arange(10)
    loader = DataLoader(TensorDataset(x, y), batch_size=3, shuffle=False)
    pf = DevicePrefetcher(loader, "cpu")
    assert len(pf) == 4
    for _ in range(2):  # each iter() is a fresh epoch
        batches = list(pf)
        assert len(batches) == 4
        assert torch.equal(torch.cat([b[0] for b in batches]), x)
        assert torch.equal(torch.cat([b[1] for b in batches]), y)
    assert "device=cpu" in repr(pf)


def test_prefetcher_with_pinned_dataloader_on_cpu():
    q = torch.randint(-100, 100, (12, 1, 2, 4, 2), dtype=torch.int8)
    labels = torch.arange(12)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "pin_memory set but no accelerator" on CPU-only machines
        loader = DataLoader(TensorDataset(q, labels), batch_size=4, pin_memory=True, num_workers=0)
        out = list(DevicePrefetcher(loader, "cpu"))
    assert [b[0].dtype for b in out] == [torch.int8] * 3
    assert torch.equal(torch.cat([b[0] for b in out]), q)
    assert torch.equal(torch.cat([b[1] for b in out]), labels)


def test_prefetcher_dict_batches_from_workers():
    class Dicts(torch.utils.data.Dataset):
        def __len__(self):
            return 6

        def __getitem__(self, i):
            return {"coeffs": torch.full((2, 3), i, dtype=torch.int8), "label": i}

    loader = DataLoader(Dicts(), batch_size=2, num_workers=2)
    out = list(DevicePrefetcher(loader, "cpu"))
    assert [b["label"].tolist() for b in out] == [[0, 1], [2, 3], [4, 5]]
    assert all(b["coeffs"].dtype == torch.int8 for b in out)


def test_prefetcher_len_needs_a_sized_loader():
    class Stream(IterableDataset):
        def __iter__(self):
            yield from (torch.ones(1) for _ in range(3))

    gen = (torch.ones(1) for _ in range(2))
    pf = DevicePrefetcher(gen, "cpu")
    with pytest.raises(TypeError, match=r"len\(DevicePrefetcher\): expected a loader with a length. Got generator"):
        len(pf)
    assert len(list(pf)) == 2
    assert len(list(DevicePrefetcher(DataLoader(Stream(), batch_size=None), "cpu"))) == 3


def test_prefetcher_rejects_non_iterable():
    with pytest.raises(TypeError, match=r"loader: expected an iterable such as a torch DataLoader. Got int"):
        DevicePrefetcher(3, "cpu")


# with_decompress / AugmentOnDevice ---------------------------------------------------------------
def _coeff_batch(spec: CodecSpec, n: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.rand(n, *spec.sample_shape)
    q, overflow = dctdata.encode(x, spec)
    assert overflow == 0
    return x, q


@pytest.fixture
def v2():
    """torchvision.transforms.v2, imported by the tests that use it: importing it is seconds of every test
    process's collection otherwise."""
    from torchvision.transforms import v2

    return v2


def test_with_decompress_equals_manual_pipeline(v2):
    spec = CodecSpec(cf=4, channels=3, height=20, width=28)
    _, q = _coeff_batch(spec)
    model = nn.Conv2d(3, 2, 3)
    norm = v2.Normalize([0.5, 0.4, 0.3], [0.2, 0.25, 0.3])
    net = with_decompress(Decompress(spec), model, transforms=norm)
    assert list(dict(net.named_children())) == ["decompress", "augment", "model"]
    assert net.model is model
    torch.testing.assert_close(net(q), model(norm(Decompress(spec)(q))))
    plain = with_decompress(Decompress(spec), model)
    assert list(dict(plain.named_children())) == ["decompress", "model"]
    torch.testing.assert_close(plain(q), model(Decompress(spec)(q)))


def test_train_transforms_only_in_training_mode(v2):
    spec = CodecSpec(cf=8, channels=1, height=8, width=16)
    x, q = _coeff_batch(spec, n=2)
    net = with_decompress(Decompress(spec), nn.Identity(), train_transforms=v2.RandomHorizontalFlip(p=1.0))
    torch.testing.assert_close(net.train()(q), torch.flip(x, dims=[-1]), atol=1e-5, rtol=0)
    torch.testing.assert_close(net.eval()(q), x, atol=1e-5, rtol=0)


def test_per_sample_augmentation_draws_per_sample(v2):
    torch.manual_seed(0)
    x = torch.arange(16.0).reshape(1, 1, 1, 16).repeat(64, 1, 1, 1)
    batched = AugmentOnDevice(train=v2.RandomHorizontalFlip(p=0.5))(x)
    flipped = (batched[:, 0, 0, 0] == 15).tolist()
    assert all(flipped) or not any(flipped)  # one decision for the whole batch
    per = AugmentOnDevice(train=v2.RandomHorizontalFlip(p=0.5), per_sample=True)(x)
    flipped = (per[:, 0, 0, 0] == 15).tolist()
    assert any(flipped) and not all(flipped)


def test_with_decompress_trains_through_prefetcher(v2):
    torch.manual_seed(0)
    spec = CodecSpec(cf=4, channels=1, height=16, width=16, dtype="int8", steps=[[0.05] * 16])
    x = torch.rand(32, 1, 16, 16)
    y = (x.mean(dim=(1, 2, 3)) > 0.5).long()
    q, _ = dctdata.encode(x, spec)
    loader = DataLoader(TensorDataset(q, y), batch_size=8, shuffle=True)
    net = with_decompress(
        Decompress(spec), nn.Sequential(nn.Flatten(), nn.Linear(256, 2)), transforms=v2.Normalize([0.5], [0.3])
    )
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    grads = []
    for coeffs, label in DevicePrefetcher(loader, "cpu"):
        assert coeffs.dtype == torch.int8
        loss = nn.functional.cross_entropy(net(coeffs), label)
        opt.zero_grad()
        loss.backward()
        grads.append(net.model[1].weight.grad.abs().sum().item())
        opt.step()
    assert len(grads) == 4 and all(g > 0 for g in grads)


def test_with_decompress_errors():
    spec = CodecSpec(cf=2, height=8, width=8)
    with pytest.raises(
        TypeError, match=r"decompressor: expected an nn.Module such as dctdata.Decompress. Got CodecSpec"
    ):
        with_decompress(spec, nn.Identity())
    with pytest.raises(TypeError, match=r"model: expected an nn.Module. Got function"):
        with_decompress(Decompress(spec), lambda x: x)
    with pytest.raises(
        TypeError, match=r"transforms: expected a callable such as a torchvision.transforms.v2 transform. Got str"
    ):
        with_decompress(Decompress(spec), nn.Identity(), transforms="normalize")


# CUDA ------------------------------------------------------------------------------------------
@pytest.mark.cuda
@cuda
def test_prefetcher_cuda_matches_cpu_and_overlaps():
    torch.manual_seed(0)
    x = torch.randint(-128, 127, (40, 3, 8, 16, 8), dtype=torch.int8)
    y = torch.arange(40)
    loader = DataLoader(TensorDataset(x, y), batch_size=8, pin_memory=True)
    pf = DevicePrefetcher(loader, "cuda")
    for _ in range(2):
        got = []
        for coeffs, _label in pf:
            assert coeffs.is_cuda and coeffs.dtype == torch.int8
            got.append((coeffs.float() * 2).to(torch.int32))  # work on the default stream right away
        torch.cuda.synchronize()
        assert torch.equal(torch.cat(got).cpu(), x.to(torch.int32) * 2)


@pytest.mark.cuda
@cuda
def test_prefetcher_cuda_pins_unpinned_batches_and_nested():
    batch = _nested()
    out = list(DevicePrefetcher([batch, batch], "cuda"))
    torch.cuda.synchronize()
    for b in out:
        _assert_same(batch, b, "cuda")
    assert pin({"a": torch.ones(2)})["a"].is_pinned()


@pytest.mark.cuda
@cuda
def test_with_decompress_on_cuda(v2):
    spec = CodecSpec(cf=4, channels=3, height=32, width=32)
    _x, q = _coeff_batch(spec)
    net = with_decompress(Decompress(spec), nn.Identity(), transforms=v2.Normalize([0.5] * 3, [0.25] * 3)).cuda()
    out = net(to_device(q, "cuda"))
    assert out.is_cuda
    torch.testing.assert_close(out.cpu(), (Decompress(spec)(q) - 0.5) / 0.25, atol=1e-4, rtol=1e-4)


# Example ---------------------------------------------------------------------------------------
def test_device_pipeline_example_runs(capsys):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "examples" / "device_pipeline.py"
    spec = importlib.util.spec_from_file_location("device_pipeline_example", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    acc = module.main(
        ["--device", "cpu", "--train", "128", "--test", "64", "--epochs", "2", "--batch-size", "32", "--cf", "4"]
    )
    out = capsys.readouterr().out
    assert "transfer ratio" in out and "epoch 2: train loss" in out and "on cpu" in out
    assert 0.0 <= acc <= 1.0
    losses = [float(line.split()[-1]) for line in out.splitlines() if line.startswith("epoch")]
    assert losses[1] < losses[0]
