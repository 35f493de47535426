"""The functional `dctdata.decompress` takes the fused kernels where `Decompress` does (the C kernel on plain
CPU tensors in eager mode, the Triton kernel on CUDA) and equals its previous path, the torch kernels of
`transform.decompress`. Measured (AVX2 loop, the cases of the first test): at most 2.9e-7 x the output's
largest magnitude (float32 sums in another order); the tests allow 1e-6 x."""

import pytest
import torch

import dctdata
import dctdata.decoder.fused as fused
import dctdata.decoder.fused_cuda as fused_cuda

needs_fused = pytest.mark.skipif(not fused.available(), reason="dctdata.decoder._synth is not built")


@pytest.fixture(autouse=True)
def any_cpu(monkeypatch):
    """The fused C kernel runs on any CPU here (the AVX2 requirement is a speed choice)."""
    monkeypatch.setattr(fused, "REQUIRE_VECTOR", False)


@pytest.fixture
def fused_calls(monkeypatch):
    seen = []
    real = fused.synthesize
    monkeypatch.setattr(fused, "synthesize", lambda *a, **k: seen.append(1) or real(*a, **k))
    return seen


def previous_path(y, cf, size, mask, monkeypatch):
    """`decompress` as it was before the fused kernels: the torch kernels only."""
    with monkeypatch.context() as m:
        m.setattr(fused, "ENABLED", False)
        m.setattr(fused_cuda, "ENABLED", False)
        return dctdata.decompress(y, cf, size, mask)


def assert_same(a, b, rel=1e-6):
    torch.testing.assert_close(a, b, atol=rel * max(1.0, float(b.abs().max())), rtol=0)


@needs_fused
@pytest.mark.parametrize("cf", range(1, 9))
@pytest.mark.parametrize("mask", ["square", "triangle"])
@pytest.mark.parametrize("lead, size", [((), (29, 43)), ((3,), (32, 64)), ((2, 2), (9, 70))])
def test_fused_path_equals_the_previous_path(cf, mask, lead, size, fused_calls, monkeypatch):
    x = 10 * torch.rand(*lead, *size, generator=torch.Generator().manual_seed(cf)) - 5
    y = dctdata.compress(x, cf, mask)
    out = dctdata.decompress(y, cf, size, mask)
    assert fused_calls, "the fused C kernel did not run in eager CPU mode"
    assert out.shape == (*lead, *size) and out.dtype == torch.float32
    assert_same(out, previous_path(y, cf, size, mask, monkeypatch))
    if cf == 8 and mask == "square":  # all coefficients kept: the inverse of compress
        torch.testing.assert_close(out, x, atol=1e-5, rtol=0)


@needs_fused
@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16, torch.int16])
def test_every_input_dtype_equals_the_previous_path(dtype, fused_calls, monkeypatch):
    y = (40 * dctdata.compress(torch.rand(2, 3, 24, 40), 4)).to(dtype)
    out = dctdata.decompress(y, 4, (24, 40))
    assert fused_calls and out.dtype == torch.float32
    assert_same(out, previous_path(y, 4, (24, 40), "square", monkeypatch))


@needs_fused
def test_several_threads_split_the_batch_with_the_same_values(monkeypatch):
    monkeypatch.setattr(fused, "SPLIT_MIN_BYTES", 1 << 10)  # small outputs split too
    previous = torch.get_num_threads()
    y = dctdata.compress(torch.rand(8, 64, 64), 3)
    one = dctdata.decompress(y, 3, (64, 64))
    try:
        torch.set_num_threads(2)
        two = dctdata.decompress(y, 3, (64, 64))
    finally:
        torch.set_num_threads(previous)
    torch.testing.assert_close(two, one, atol=0, rtol=0)


def test_autograd_compile_and_export_keep_the_torch_kernels(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a fused kernel ran where autograd or a traced graph needs the torch kernels")

    monkeypatch.setattr(fused, "synthesize", refuse)
    y = dctdata.compress(torch.rand(2, 16, 24), 3).requires_grad_(True)
    dctdata.decompress(y, 3, (16, 24)).square().sum().backward()
    assert y.grad is not None and y.grad.abs().sum() > 0

    class Layer(torch.nn.Module):
        def forward(self, c):
            return dctdata.decompress(c, 3, (16, 24))

    c = y.detach()
    exported = torch.export.export(Layer(), (c,))
    ops = {str(n.target) for n in exported.graph.nodes if n.op == "call_function"}
    assert any("matmul" in op or "bmm" in op or "mm" in op for op in ops), ops
    monkeypatch.undo()
    assert_same(exported.module()(c), dctdata.decompress(c, 3, (16, 24)))


def test_errors_are_unchanged():
    with pytest.raises(TypeError, match=r"coeffs: expected a torch.Tensor of shape \(\.\.\., Hb, K, Wb\)"):
        dctdata.decompress([1.0], 2, (8, 8))
    with pytest.raises(dctdata.DctDataError, match=r"coeffs: expected shape \(\.\.\., Hb, K, Wb\) = \(\.\.\., 2, 4, 1"):
        dctdata.decompress(torch.ones(1, 4, 1), cf=2, size=(16, 8))


@pytest.mark.cuda
@pytest.mark.parametrize("mask", ["square", "triangle"])
def test_cuda_takes_the_triton_kernel_and_equals_cpu(mask, monkeypatch):
    calls = []
    real = fused_cuda.synthesize
    monkeypatch.setattr(fused_cuda, "synthesize", lambda *a, **k: calls.append(1) or real(*a, **k))
    y = dctdata.compress(torch.rand(3, 2, 61, 1030), 5, mask)
    gpu = dctdata.decompress(y.cuda(), 5, (61, 1030), mask)
    assert calls and gpu.is_cuda and fused_cuda.broken() is None
    assert_same(gpu.cpu(), dctdata.decompress(y, 5, (61, 1030), mask), rel=1e-5)
