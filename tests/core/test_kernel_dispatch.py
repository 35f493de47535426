"""One kernel dispatch (`dctdata.decoder.kernels`) for the three decode sites: the functional decode, the 2-D
layer and the volume layer each go through its registry, and its choice follows the documented rules
(device, dtypes, eager mode, availability)."""

import pytest
import torch

import dctdata
import dctdata.decoder.fused as fused
import dctdata.decoder.fused_cuda as fused_cuda
import dctdata.decoder.kernels as kernels
from dctdata.codec.spec import CodecSpec
from dctdata.decoder.layer import Decompress, VolumeDecompress
from dctdata.errors import DctDataError

needs_fused = pytest.mark.skipif(not fused.available(), reason="dctdata.decoder._synth is not built")


def plane_spec() -> CodecSpec:
    k = 16
    return CodecSpec(cf=4, height=20, width=28, dtype="int8", steps=((0.05,) * k,), offsets=((0.0,) * k,))


def volume_spec() -> CodecSpec:
    k = 27
    return CodecSpec(cf=3, depth=9, height=10, width=11, dtype="int16", mask="cube", steps=((0.1,) * k,),
                     offsets=((0.0,) * k,))  # fmt: skip


@pytest.fixture
def spy(monkeypatch):
    """A kernel tried first for both sample kinds: records each call and returns samples full of 7."""
    calls = []

    def run(source, q, side, out, dtype, cf, mask, size):
        calls.append((source, tuple(q.shape), dtype, cf, mask, tuple(size)))
        img = torch.full((q.shape[0], q.shape[1], *size), 7.0, dtype=dtype)
        return img if out is None else out.copy_(img)

    kernel = kernels.Kernel("spy", lambda q, dtype, out: True, run)
    for dims in (2, 3):
        monkeypatch.setitem(kernels._REGISTRY, dims, [kernel, *kernels._REGISTRY[dims]])
    return calls


def test_the_functional_decode_goes_through_the_dispatch(spy):
    coeffs = torch.randn(2, 3, 3, 16, 4)  # (..., Hb, K, Wb) for cf 4 and size (20, 28)
    img = dctdata.decompress(coeffs, 4, (20, 28))
    assert img.shape == (2, 3, 20, 28) and bool((img == 7).all())
    (source, shape, dtype, cf, mask, size) = spy[0]
    assert (
        len(spy) == 1
        and shape == (6, 1, 3, 16, 4)
        and (dtype, cf, mask, size) == (torch.float32, 4, "square", (20, 28))
    )
    assert all(callable(getattr(source, m)) for m in ("_tables", "_tables_on", "_portable"))  # a kernels.Source


def test_the_2d_layer_goes_through_the_dispatch(spy):
    spec = plane_spec()
    layer = Decompress(spec, dtype=torch.bfloat16)
    q = torch.randint(-50, 50, (2, *spec.coeff_shape), dtype=torch.int8)
    img = layer(q)
    assert img.dtype == torch.bfloat16 and bool((img == 7).all())
    out = torch.empty(2, *spec.sample_shape, dtype=torch.bfloat16)
    assert layer(q, out=out) is out and bool((out == 7).all())
    assert [c[0] for c in spy] == [layer, layer] and spy[0][1:] == (
        (2, 1, 3, 16, 4),
        torch.bfloat16,
        4,
        "square",
        (20, 28),
    )


def test_the_volume_layer_goes_through_the_dispatch(spy):
    spec = volume_spec()
    layer = Decompress(spec)
    assert isinstance(layer, VolumeDecompress)
    q = torch.randint(-50, 50, (2, *spec.coeff_shape), dtype=torch.int16)
    img = layer(q)
    assert img.shape == (2, *spec.sample_shape) and bool((img == 7).all())
    assert len(spy) == 1 and spy[0][0] is layer and spy[0][3:] == (3, "cube", (9, 10, 11))


def test_the_registered_kernels_and_their_order():
    assert kernels.kernels(2) == ("fused_cuda", "fused_cpu", "torch")
    assert kernels.kernels(3) == ("fused_cpu", "torch")  # no CUDA kernel for volumes: they take the torch graph
    doc = kernels.__doc__
    assert all(f"`{name}`" in doc for name in ("fused_cuda", "fused_cpu", "torch"))


@needs_fused
def test_choice_rules_on_cpu(monkeypatch):
    monkeypatch.setattr(fused, "REQUIRE_VECTOR", False)  # the AVX2 requirement is a speed choice
    q = torch.randint(-50, 50, (2, 1, 3, 16, 4), dtype=torch.int8)
    for dims in (2, 3):
        assert kernels.choose(dims, q, torch.float32) == "fused_cpu"
        assert kernels.choose(dims, q.to(torch.bfloat16), torch.float32) == "fused_cpu"
        assert kernels.choose(dims, q, torch.float16) == "torch"  # the C kernel writes float32 only
        assert kernels.choose(dims, q, torch.float64) == "torch"
        assert kernels.choose(dims, q.to(torch.float64), torch.float32) == "torch"  # float64 coefficients
        out = torch.empty(2, 1, 20, 56)[..., ::2]
        assert kernels.choose(dims, q, torch.float32, out) == "torch"  # a strided out
        grad = q.to(torch.float32).requires_grad_()
        assert kernels.choose(dims, grad, torch.float32) == "torch"  # autograd to record
        with torch.no_grad():
            assert kernels.choose(dims, grad, torch.float32) == "fused_cpu"
    monkeypatch.setattr(fused, "ENABLED", False)  # DCTDATA_FUSED_KERNEL=0
    assert kernels.choose(2, q, torch.float32) == "torch"


def test_a_cpu_tensor_never_takes_the_cuda_kernel(monkeypatch):
    monkeypatch.setattr(fused_cuda, "available", lambda: True)
    monkeypatch.setattr(fused, "ENABLED", False)
    q = torch.randint(-50, 50, (2, 1, 3, 16, 4), dtype=torch.int8)
    assert kernels.choose(2, q, torch.float32) == "torch"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_choice_rules_on_cuda(monkeypatch):
    q = torch.randint(-50, 50, (2, 1, 3, 16, 4), dtype=torch.int8, device="cuda")
    expected = "fused_cuda" if fused_cuda.available() else "torch"
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        assert kernels.choose(2, q, dtype) == expected
    assert kernels.choose(2, q, torch.float64) == "torch"
    assert kernels.choose(3, q, torch.float32) == "torch"
    monkeypatch.setattr(fused_cuda, "ENABLED", False)  # DCTDATA_TRITON_KERNEL=0
    assert kernels.choose(2, q, torch.float32) == "torch"


def test_a_kernel_that_fails_to_launch_hands_over_to_the_next(monkeypatch):
    spec = plane_spec()
    q = torch.randint(-50, 50, (2, *spec.coeff_shape), dtype=torch.int8)
    expected = Decompress(spec)(q)
    tried = []
    broken = kernels.Kernel("broken", lambda q, dtype, out: True, lambda *args: tried.append(1))  # returns None
    monkeypatch.setitem(kernels._REGISTRY, 2, list(kernels._REGISTRY[2]))
    kernels.register(2, broken, before="fused_cuda")
    assert kernels.kernels(2) == ("broken", "fused_cuda", "fused_cpu", "torch")
    assert torch.equal(Decompress(spec)(q), expected) and tried == [1]


def test_register_replaces_a_kernel_of_the_same_name(monkeypatch):
    monkeypatch.setitem(kernels._REGISTRY, 3, list(kernels._REGISTRY[3]))
    kernels.register(3, kernels.Kernel("mine", lambda q, dtype, out: False, lambda *args: None))
    kernels.register(3, kernels.Kernel("mine", lambda q, dtype, out: False, lambda *args: None), before="fused_cpu")
    assert kernels.kernels(3) == ("mine", "fused_cpu", "torch")


def test_register_and_choose_errors_name_what_was_expected():
    with pytest.raises(TypeError, match=r"kernel: expected a dctdata.decoder.kernels.Kernel. Got function"):
        kernels.register(2, lambda q: q)
    with pytest.raises(DctDataError, match=r"before: expected one of \['fused_cuda', 'fused_cpu', 'torch'\]. Got 'x'"):
        kernels.register(2, kernels.Kernel("k", lambda q, dtype, out: False, lambda *args: None), before="x")
    with pytest.raises(DctDataError, match=r"dims: expected one of \[2, 3\] \(2-D samples or volumes\). Got 4"):
        kernels.choose(4, torch.zeros(1), torch.float32)


def test_decode_names_the_batch_when_no_kernel_decodes_it(monkeypatch):
    failing = kernels.Kernel("failing", lambda q, dtype, out: True, lambda *args: None)
    monkeypatch.setitem(kernels._REGISTRY, 2, [failing])  # no torch kernel to fall back on
    q = torch.zeros(2, 1, 3, 16, 4, dtype=torch.int8)
    with pytest.raises(DctDataError, match=r"decode: no kernel decoded coefficients torch.int8 \(2, 1, 3, 16, 4\)"):
        kernels.decode(None, q, torch.float32, 4, "square", (20, 28))
