"""The chunked CPU decode kernel: same values as the portable graph, `out=`, and the dispatch that keeps
compile, export, ONNX and autograd on the portable graph. The fused C kernel (which `Decompress` takes
first where it applies) is off here; tests/core/test_fused_kernel.py covers it."""

import pytest
import torch
from decode_checks import check_decompress
from test_layer import make_spec, v2_wire

import dctdata
import dctdata.codec.transform as transform
import dctdata.decoder.fused as fused
from dctdata import Decompress
from dctdata.encoder.quantize import decode_reference


def spec_for(cf, mask="square", channels=2, height=29, width=43, wire="int16", normalized=True, offsets=True):
    """test_layer's spec, with offsets on every kept frequency (not only DC) when `offsets`."""
    spec = make_spec(wire, cf, mask, channels, height, width, quantized=True, normalized=normalized)
    table = [[4.0 + c] + [0.01 * i for i in range(1, spec.kept)] for c in range(channels)]
    return spec.replace(offsets=table if offsets else None)


def wire_of(spec, b=3, seed=0):
    x = torch.rand(b, *spec.sample_shape, generator=torch.Generator().manual_seed(seed))
    q, overflow = dctdata.encode(x, spec)
    assert overflow == 0
    return q


@pytest.fixture(autouse=True)
def one_thread():
    """The chunked kernel runs with one intra-op thread (the portable graph with more)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(autouse=True)
def torch_kernels(monkeypatch):
    """The torch kernels under test: the fused C kernel stays off."""
    monkeypatch.setattr(fused, "ENABLED", False)


def spy_on(monkeypatch, module, name: str) -> list:
    """Replaces `module.name` by a wrapper that appends to the returned list on each call."""
    seen = []
    real = getattr(module, name)

    def spy(*args, **kwargs):
        seen.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, spy)
    return seen


@pytest.fixture
def calls(monkeypatch):
    """Counts calls of the chunked kernel."""
    return spy_on(monkeypatch, transform, "synthesize_chunked")


@pytest.fixture
def no_chunked(monkeypatch):
    """The chunked kernel raises: whatever runs must take the portable graph."""

    def refuse(*args, **kwargs):
        raise AssertionError("the chunked CPU kernel ran where the portable graph must")

    monkeypatch.setattr(transform, "synthesize_chunked", refuse)


def portable(layer, wire, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(transform, "eager_cpu", lambda *t: False)
        return layer(wire)


@pytest.mark.parametrize("cf", [2, 4, 5, 8])  # both orientations of the first matmul
@pytest.mark.parametrize("mask", ["square", "triangle"])
@pytest.mark.parametrize("hw", [(29, 43), (32, 48)])  # cropped and block-aligned
@pytest.mark.parametrize("chunk", [1, 1 << 20])  # one block row per step; whole images per step
def test_chunked_kernel_equals_the_portable_graph_and_the_reference(cf, mask, hw, chunk, calls, monkeypatch):
    monkeypatch.setattr(transform, "CHUNK_BYTES", chunk)
    spec = spec_for(cf, mask, height=hw[0], width=hw[1])
    q = wire_of(spec)
    layer = Decompress(spec)
    out = check_decompress(spec, q)
    assert calls, "the chunked kernel did not run in eager CPU mode"
    torch.testing.assert_close(out, portable(layer, q, monkeypatch), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("wire", ["float32", "float16", "bfloat16", "int8"])
@pytest.mark.parametrize("normalized, offsets", [(False, False), (True, False), (False, True)])
def test_chunked_kernel_for_every_wire_and_bias(wire, normalized, offsets, calls, monkeypatch):
    spec = spec_for(5, wire=wire, normalized=normalized, offsets=offsets, channels=1)
    if not wire.startswith("int"):
        spec = spec.replace(steps=None)
    q = wire_of(spec)
    out = check_decompress(spec, q)
    assert calls
    torch.testing.assert_close(out, portable(Decompress(spec), q, monkeypatch), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_chunked_kernel_output_dtypes(dtype, calls, monkeypatch):
    spec = spec_for(8, height=32, width=48)
    q = wire_of(spec)
    out = check_decompress(spec, q, dtype=dtype)
    assert calls
    torch.testing.assert_close(out, portable(Decompress(spec, dtype=dtype), q, monkeypatch))


def test_float64_coefficients_compute_in_float64(calls, monkeypatch):
    spec = spec_for(4, wire="float32", offsets=False).replace(steps=None)
    q = torch.randn(2, *spec.coeff_shape, dtype=torch.float64)
    layer = Decompress(spec)
    out = layer(q)
    assert calls and out.dtype == torch.float32
    torch.testing.assert_close(out, portable(layer, q, monkeypatch), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("weighted", [False, True])  # codec v3's channel weights: the same kernel
@pytest.mark.parametrize("chunk", [1, 1 << 20])  # the affine pass per block row (side sliced per sample)
def test_v2_spec_takes_the_chunked_kernel(chunk, weighted, calls, monkeypatch):
    monkeypatch.setattr(transform, "CHUNK_BYTES", chunk)
    spec, wire = v2_wire(weighted=weighted)
    out = check_decompress(spec, wire)
    assert calls
    ref = portable(Decompress(spec), wire, monkeypatch)
    torch.testing.assert_close(out, ref, atol=1e-6 * float(ref.abs().max()), rtol=1e-5)


def test_several_threads_take_the_portable_graph(calls):
    spec = spec_for(4)
    q = wire_of(spec)
    layer = Decompress(spec)
    one = layer(q)
    assert len(calls) == 1
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        buf = torch.empty_like(one)
        assert layer(q, out=buf) is buf
    finally:
        torch.set_num_threads(previous)
    assert len(calls) == 1
    torch.testing.assert_close(buf, one, atol=1e-5, rtol=1e-5)


def test_out_receives_the_result_and_is_returned():
    spec = spec_for(4)
    q = wire_of(spec)
    layer = Decompress(spec)
    buf = torch.full((3, *spec.sample_shape), float("nan"))
    assert layer(q, out=buf) is buf
    torch.testing.assert_close(buf, layer(q))
    one = torch.empty(spec.sample_shape)
    assert layer(q[1], out=one) is one
    torch.testing.assert_close(one, buf[1])
    half = torch.empty(3, *spec.sample_shape, dtype=torch.bfloat16)
    Decompress(spec, dtype=torch.bfloat16)(q, out=half)
    torch.testing.assert_close(half, Decompress(spec, dtype=torch.bfloat16)(q))


def test_out_on_the_portable_path_keeps_autograd():
    spec = spec_for(3, wire="float32", offsets=False).replace(steps=None)
    q = torch.randn(2, *spec.coeff_shape, requires_grad=True)
    buf = torch.empty(2, *spec.sample_shape)
    out = Decompress(spec)(q, out=buf)
    assert out is buf and out.grad_fn is not None
    out.sum().backward()
    assert q.grad is not None and q.grad.abs().sum() > 0


def test_bad_out_is_a_clear_error():
    spec = spec_for(4)
    q = wire_of(spec)
    layer = Decompress(spec)
    with pytest.raises(TypeError, match=r"out: expected a torch.Tensor. Got ndarray"):
        layer(q, out=torch.empty(3, *spec.sample_shape).numpy())
    with pytest.raises(TypeError, match=r"out: expected dtype torch.float32 on cpu .* Got torch.float64 on cpu"):
        layer(q, out=torch.empty(3, *spec.sample_shape, dtype=torch.float64))
    with pytest.raises(dctdata.DctDataError, match=r"out: expected shape \(3, 2, 29, 43\)\. Got \(2, 2, 29, 43\)"):
        layer(q, out=torch.empty(2, *spec.sample_shape))


def test_vmap_takes_the_portable_graph(monkeypatch):
    spec = spec_for(4)
    q = wire_of(spec)
    layer = Decompress(spec)
    ref = layer(q)
    monkeypatch.setattr(transform, "synthesize_chunked", None)  # calling it would raise
    torch.testing.assert_close(torch.func.vmap(layer)(q), ref)


def test_autograd_takes_the_portable_graph(no_chunked):
    spec = spec_for(4)
    q = wire_of(spec).to(torch.float32).requires_grad_()
    out = Decompress(spec)(q)
    assert out.grad_fn is not None


@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::torch.jit.TracerWarning")
def test_export_and_compile_take_the_portable_graph(no_chunked, monkeypatch):
    spec = spec_for(5, mask="triangle")
    q = wire_of(spec)
    layer = Decompress(spec)
    with monkeypatch.context() as m:
        m.setattr(transform, "eager_cpu", lambda *t: False)
        ref = layer(q)
    exported = torch.export.export(layer, (q,))
    torch.testing.assert_close(exported.module()(q), ref)
    traced = torch.jit.trace(layer, (q,), check_trace=False)
    torch.testing.assert_close(traced(q), ref)
    torch._dynamo.reset()
    compiled = torch.compile(layer, backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(q), ref)


def test_onnx_export_takes_the_portable_graph(tmp_path, request):
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    spec = spec_for(6, height=32, width=48)
    q = wire_of(spec)
    ref = decode_reference(q, spec).to(torch.float32)
    layer = Decompress(spec).eval()
    request.getfixturevalue("no_chunked")
    path = tmp_path / "decompress.onnx"
    torch.onnx.export(layer, (q,), str(path), input_names=["coeffs"], dynamo=True)
    (out,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"coeffs": q.numpy()})
    torch.testing.assert_close(torch.from_numpy(out), ref, atol=1e-4, rtol=1e-5)
