"""The fused C decode kernel (dctdata.decoder.fused, dctdata/decoder/_synth.c): the reference's values for every wire
dtype,
codec version, mask, CF and cropped size, its AVX2 and portable inner loops alike, `out=`, the cases it
leaves to the torch kernels, and the errors its checks raise."""

import importlib.util
import sys

import numpy as np
import pytest
import torch
from decode_checks import check_decompress
from hypothesis import given, settings
from hypothesis import strategies as st
from test_cpu_kernel import one_thread, spec_for, spy_on, wire_of  # noqa: F401 (one_thread: autouse)
from test_layer import v2_wire

import dctdata
import dctdata.codec.transform as transform
import dctdata.decoder.fused as fused
from dctdata import Decompress
from dctdata.decoder.wire import split_wire
from dctdata.encoder.quantize import decode_reference

pytestmark = pytest.mark.skipif(not fused.available(), reason="dctdata.decoder._synth is not built")


@pytest.fixture(autouse=True)
def any_cpu(monkeypatch):
    """Decompress takes the kernel on any CPU here, so its wiring is tested where AVX2 is missing too."""
    monkeypatch.setattr(fused, "REQUIRE_VECTOR", False)


@pytest.fixture
def calls(monkeypatch):
    """Counts calls of the fused kernel."""
    return spy_on(monkeypatch, fused, "synthesize")


def torch_kernel(layer, wire, monkeypatch):
    """The same layer on the chunked torch kernel."""
    with monkeypatch.context() as m:
        m.setattr(fused, "ENABLED", False)
        return layer(wire)


def both_isas(spec, wire):
    """The AVX2 (where present) and portable inner loops agree to float32 rounding; non-temporal stores
    write the same values."""
    q, side = split_wire(wire, spec)
    q = q if q.dim() == 5 else q.unsqueeze(0)
    args = (q, fused.tables_for(spec), spec.cf, spec.mask, (spec.height, spec.width))
    vec = fused.synthesize(*args, side=side)
    plain = fused.synthesize(*args, side=side, portable=True)
    assert torch.equal(fused.synthesize(*args, side=side, stream=True), vec)
    torch.testing.assert_close(vec, plain, atol=1e-5 * max(1.0, float(plain.abs().max())), rtol=1e-5)


@pytest.mark.parametrize("cf", range(1, 9))
@pytest.mark.parametrize("mask", ["square", "triangle"])
@pytest.mark.parametrize("hw", [(29, 43), (32, 64), (70, 9)])  # cropped; block-aligned (full lane groups); narrow
@pytest.mark.parametrize("wire", ["int8", "int16", "float32"])
def test_fused_kernel_equals_the_reference_and_the_torch_kernel(cf, mask, hw, wire, calls, monkeypatch):
    spec = spec_for(cf, mask, height=hw[0], width=hw[1], wire=wire)
    if wire == "float32":
        spec = spec.replace(steps=None)
    q = wire_of(spec)
    out = check_decompress(spec, q)
    assert calls, "the fused kernel did not run in eager CPU mode"
    torch.testing.assert_close(out, torch_kernel(Decompress(spec), q, monkeypatch), atol=1e-5, rtol=1e-5)
    both_isas(spec, q)


@pytest.mark.parametrize("wire", ["float16", "bfloat16"])
@pytest.mark.parametrize("normalized, offsets", [(False, False), (True, True)])
def test_half_wires_and_every_bias(wire, normalized, offsets, calls):
    spec = spec_for(5, wire=wire, normalized=normalized, offsets=offsets, channels=3).replace(steps=None)
    check_decompress(spec, wire_of(spec))
    assert calls


@pytest.mark.parametrize(
    "rotation, side, weighted",
    [(True, True, False), (False, True, False), (True, False, False), (False, False, False), (True, True, True)],
)
def test_v2_recon_rotation_and_side(rotation, side, weighted, calls, monkeypatch):
    spec, (q, s) = v2_wire(weighted=weighted)  # weighted: codec v3's channel weights in the rotation table
    spec = spec.replace(rotation=spec.rotation if rotation else None)
    if not side:
        spec = spec.replace(side=None, min_psnr=None)
    wire = (q, s) if side else q
    out = check_decompress(spec, wire)
    assert calls
    ref = torch_kernel(Decompress(spec), wire, monkeypatch)
    torch.testing.assert_close(out, ref, atol=1e-6 * float(ref.abs().max()), rtol=1e-5)
    both_isas(spec, wire)


@pytest.mark.parametrize("b, channels", [(1, 1), (5, 3), (2, 4)])
def test_batch_and_channel_counts(b, channels, calls):
    spec = spec_for(3, "triangle", channels=channels, height=17, width=130)
    q = wire_of(spec, b=b)
    out = check_decompress(spec, q)
    assert calls
    torch.testing.assert_close(Decompress(spec)(q[0]), out[0])  # unbatched


def test_an_empty_batch():
    spec = spec_for(4)
    q = torch.zeros(0, *spec.coeff_shape, dtype=torch.int16)
    out = fused.synthesize(q, fused.tables_for(spec), 4, "square", (spec.height, spec.width))
    assert out.shape == (0, *spec.sample_shape)


def test_out_buffers_contiguous_and_strided(calls):
    spec = spec_for(6)
    q = wire_of(spec)
    layer = Decompress(spec)
    ref = layer(q)
    buf = torch.full_like(ref, float("nan"))
    assert layer(q, out=buf) is buf and len(calls) == 2
    torch.testing.assert_close(buf, ref)
    wide = torch.full((3, 2, spec.height, spec.width + 5), float("nan"))
    strided = wide[..., : spec.width]  # not contiguous: the torch kernel writes it
    assert layer(q, out=strided) is strided and len(calls) == 2
    torch.testing.assert_close(strided, ref)
    assert torch.isnan(wide[..., spec.width :]).all()


def test_non_contiguous_coefficients_are_copied(calls):
    spec = spec_for(4)
    q = wire_of(spec)
    strided = q.transpose(0, 1).contiguous().transpose(0, 1)
    assert not strided.is_contiguous()
    torch.testing.assert_close(Decompress(spec)(strided), Decompress(spec)(q))
    assert len(calls) == 2


@pytest.mark.parametrize(
    "case",
    ["float64 output", "bfloat16 output", "float64 coefficients", "autograd", "disabled"],
)
def test_cases_left_to_the_torch_kernels(case, calls, monkeypatch):
    spec = spec_for(4, wire="float32", offsets=False).replace(steps=None)
    q = wire_of(spec)
    dtype = {"float64 output": torch.float64, "bfloat16 output": torch.bfloat16}.get(case, torch.float32)
    if case == "float64 coefficients":
        q = q.double()
    if case == "autograd":
        q = q.requires_grad_()
    if case == "disabled":
        monkeypatch.setattr(fused, "ENABLED", False)
    out = Decompress(spec, dtype=dtype)(q)
    assert not calls
    ref = decode_reference(q.detach().float(), spec)
    torch.testing.assert_close(out.detach().double(), ref, atol=1e-2 if dtype == torch.bfloat16 else 1e-4, rtol=0)


@pytest.mark.parametrize("threads, b, min_bytes", [(2, 1, 1), (2, 2, 1), (3, 4, 1), (4, 3, 1), (4, 4, None)])
def test_several_threads_split_the_batch_and_match_one_thread(threads, b, min_bytes, monkeypatch):
    spec, (q, side) = v2_wire(b=b)
    one = Decompress(spec)((q, side))
    if min_bytes is not None:  # these outputs are small: let every sample be a run
        monkeypatch.setattr(fused, "SPLIT_MIN_BYTES", min_bytes)
    runs = min(threads, b) if min_bytes is not None else 1  # a small call is not worth the pool
    parts = []
    real = fused._synth

    class Recorder:  # the C module's calls: one per run of samples
        def __getattr__(self, name):
            return getattr(real, name)

        def synthesize(self, q, *args):
            parts.append(q.shape[0])
            return real.synthesize(q, *args)

    monkeypatch.setattr(fused, "_synth", Recorder())
    torch.set_num_threads(threads)
    out = torch.full_like(one, float("nan"))
    assert Decompress(spec)((q, side), out=out) is out
    assert sorted(parts) == sorted([b * (i + 1) // runs - b * i // runs for i in range(runs)])
    assert torch.equal(out, one)  # same kernel, same arithmetic per sample: bit-identical
    assert torch.equal(Decompress(spec)((q, side)), one)  # a fresh output too


def test_without_avx2_decompress_keeps_the_torch_kernel(calls, monkeypatch):
    monkeypatch.setattr(fused, "REQUIRE_VECTOR", True)
    monkeypatch.setattr(fused, "_VECTOR_ISA", "portable")
    spec = spec_for(4)
    check_decompress(spec, wire_of(spec))
    assert not calls


def test_the_environment_turns_it_off(monkeypatch):
    """The module reads DCTDATA_FUSED_KERNEL when it is imported: a fresh copy of it, imported with the variable
    at 0 (in this process: a new interpreter would spend its time importing torch), is not available."""
    monkeypatch.setenv("DCTDATA_FUSED_KERNEL", "0")
    spec = importlib.util.spec_from_file_location("fused_off", fused.__file__)
    fresh = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "fused_off", fresh)  # its dataclasses look their module up
    spec.loader.exec_module(fresh)
    assert fresh.ENABLED is False and fresh.available() is False
    assert fused.available() == (fused._synth is not None)  # the imported module is untouched


def test_bad_arguments_are_clear_errors():
    spec = spec_for(4)
    q = wire_of(spec)
    t = fused.tables_for(spec)
    size = (spec.height, spec.width)
    with pytest.raises(TypeError, match=r"coeffs: expected a torch.Tensor. Got ndarray"):
        fused.synthesize(q.numpy(), t, 4, "square", size)
    with pytest.raises(
        TypeError, match=r"coeffs: expected int8, int16, float16, bfloat16 or float32 .*Got torch.int32"
    ):
        fused.synthesize(q.int(), t, 4, "square", size)
    with pytest.raises(dctdata.DctDataError, match=r"tables: expected K = 10 for cf=4 mask='triangle'. Got 16"):
        fused.synthesize(q, t, 4, "triangle", size)
    with pytest.raises(dctdata.DctDataError, match=r"expected shape \(3, 2, 4, 16, 6\). Got \(3, 2, 4, 16, 5\)"):
        fused.synthesize(q[..., :5], t, 4, "square", size)
    with pytest.raises(dctdata.DctDataError, match=r"expected shape \(B, C, Hb, K, Wb\). Got \(2, 4, 16, 6\)"):
        fused.synthesize(q[0], t, 4, "square", size)
    with pytest.raises(dctdata.DctDataError, match="out: expected a contiguous float32 tensor"):
        fused.synthesize(q, t, 4, "square", size, out=torch.empty(3, 2, *size, dtype=torch.float64))
    with pytest.raises(dctdata.DctDataError, match=r"out: expected shape \(3, 2, 29, 43\). Got \(3, 2, 29, 42\)"):
        fused.synthesize(q, t, 4, "square", size, out=torch.empty(3, 2, 29, 42))
    with pytest.raises(dctdata.DctDataError, match=r"side: these tables .* take no side information"):
        fused.synthesize(q, t, 4, "square", size, side=torch.ones(3, 2, 2))
    with pytest.raises(TypeError, match=r"tables: expected dctdata.decoder.fused.Tables .* Got dict"):
        fused.synthesize(q, {}, 4, "square", size)
    bad = fused.Tables(t.a.double(), t.d, None, None, None, None)
    with pytest.raises(
        dctdata.DctDataError, match=r"tables.a: expected a contiguous float32 tensor of shape \(2, 16\)"
    ):
        fused.synthesize(q, bad, 4, "square", size)
    with pytest.raises(dctdata.DctDataError, match="tables: expected scale and shift both or neither"):
        fused.synthesize(q, fused.Tables(t.a, t.d, None, None, torch.ones(2), None), 4, "square", size)
    with pytest.raises(dctdata.DctDataError, match=r"tables: expected scale and shift of shape \(2,\). Got \(3,\)"):
        fused.synthesize(q, fused.Tables(t.a, t.d, None, None, torch.ones(3), torch.ones(3)), 4, "square", size)
    spec2, (q2, side) = v2_wire()
    t2 = fused.tables_for(spec2)
    with pytest.raises(dctdata.DctDataError, match=r"side: expected shape \(4, 3, 2\). Got \(4, 3, 1\)"):
        fused.synthesize(q2, t2, spec2.cf, spec2.mask, (spec2.height, spec2.width), side=side[..., :1])


def test_the_c_code_checks_its_buffers_itself():
    """A call past the Python checks still cannot make the kernel index outside its buffers."""
    from dctdata.decoder import _synth

    q = np.zeros((1, 1, 2, 4, 2), np.int16)
    out = np.zeros((1, 1, 16, 16), np.float32)
    a = d = np.ones(4, np.float32)
    shape = (1, 1, 2, 4, 2, 16, 16)
    _synth.synthesize(q, 1, out, shape, 2, 0, a, d, None, None, None, None)
    with pytest.raises(ValueError, match="coefficient or output buffer size does not match the shape"):
        _synth.synthesize(q, 1, out[:, :, :15], shape, 2, 0, a, d, None, None, None, None)
    with pytest.raises(ValueError, match="coefficient or output buffer size does not match the shape"):
        _synth.synthesize(q.astype(np.int8), 1, out, shape, 2, 0, a, d, None, None, None, None)
    with pytest.raises(ValueError, match=r"shape \(B, C, Hb, K, Wb, H, W\) is inconsistent"):
        _synth.synthesize(q, 1, out, (1, 1, 2, 4, 2, 16, 17), 2, 0, a, d, None, None, None, None)
    with pytest.raises(ValueError, match=r"cf must be in 1..8"):
        _synth.synthesize(q, 1, out, shape, 9, 0, a, d, None, None, None, None)
    with pytest.raises(ValueError, match="tables A and D must hold C \\* K float32"):
        _synth.synthesize(q, 1, out, shape, 2, 0, a[:3], d, None, None, None, None)
    with pytest.raises(ValueError, match="M holds 8 bytes, expected 4"):
        _synth.synthesize(q, 1, out, shape, 2, 0, a, d, None, np.ones(2, np.float32), None, None)
    with pytest.raises(ValueError, match="alpha and beta come together"):
        _synth.synthesize(q, 1, out, shape, 2, 0, a, d, None, None, np.ones(1, np.float32), None)
    with pytest.raises(ValueError, match="qkind must be"):
        _synth.synthesize(q, 3, out, shape, 2, 0, a, d, None, None, None, None)


@settings(max_examples=40, deadline=None)
@given(
    cf=st.integers(1, 8),
    triangle=st.booleans(),
    h=st.integers(1, 40),
    w=st.integers(1, 90),
    b=st.integers(1, 3),
    c=st.integers(1, 3),
    wire=st.sampled_from([torch.int8, torch.int16, torch.float32]),
    portable=st.booleans(),
    stream=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_random_shapes_match_the_portable_graph(cf, triangle, h, w, b, c, wire, portable, stream, seed):
    mask = "triangle" if triangle else "square"
    k = transform.num_kept(cf, mask)
    hb, wb = transform.grid_shape(h, w)
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(b, c, hb, k, wb, generator=g) * 50).to(wire)
    tables = fused.Tables(torch.rand(c, k, generator=g) + 0.5, torch.randn(c, k, generator=g), None, None, None, None)
    out = fused.synthesize(q, tables, cf, mask, (h, w), portable=portable, stream=stream)
    coef = q.double() * tables.a.double().reshape(1, c, 1, k, 1) + tables.d.double().reshape(1, c, 1, k, 1)
    wcol, _, trows = transform.fold_basis(cf, mask, c)
    ref = transform.synthesize_portable(coef, wcol, trows, mask, (h, w))
    torch.testing.assert_close(out.double(), ref, atol=1e-4 * max(1.0, float(ref.abs().max())), rtol=0)


def test_large_outputs_stream_and_ask_for_huge_pages_with_the_same_values():
    """Past `STREAM_ABOVE_BYTES` and `HUGEPAGES_ABOVE_BYTES` (a fresh output) the values do not change."""
    size = (1024, 1280)
    b = -(-fused.STREAM_ABOVE_BYTES // (size[0] * size[1] * 4))
    assert b * size[0] * size[1] * 4 >= max(fused.STREAM_ABOVE_BYTES, fused.HUGEPAGES_ABOVE_BYTES)
    spec = spec_for(4, channels=1, height=size[0], width=size[1])
    q = (torch.randn(b, *spec.coeff_shape, generator=torch.Generator().manual_seed(3)) * 100).to(torch.int16)
    tables = fused.tables_for(spec)
    big = fused.synthesize(q, tables, 4, "square", size)
    small = torch.cat([fused.synthesize(q[i : i + 1], tables, 4, "square", size) for i in range(b)])
    assert torch.equal(big, small)


def test_without_the_extension_the_torch_kernel_runs(monkeypatch):
    spec = spec_for(4)
    q = wire_of(spec)
    ref = Decompress(spec)(q)
    monkeypatch.setattr(fused, "_synth", None)
    assert not fused.available() and fused.vector_isa() is None
    chunked = spy_on(monkeypatch, transform, "synthesize_chunked")
    torch.testing.assert_close(Decompress(spec)(q), ref, atol=1e-5, rtol=1e-5)
    assert chunked
    with pytest.raises(dctdata.DctDataError, match=r"fused kernel: dctdata.decoder._synth is not built \(reinstall"):
        fused.synthesize(q, fused.tables_for(spec), 4, "square", (spec.height, spec.width))


@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::torch.jit.TracerWarning")
def test_vmap_export_compile_trace_and_onnx_never_see_the_fused_kernel(monkeypatch, tmp_path):
    spec = spec_for(5, mask="triangle")
    q = wire_of(spec)
    layer = Decompress(spec).eval()
    ref = layer(q)

    def refuse(*args, **kwargs):
        raise AssertionError("the fused kernel ran inside a traced or exported graph")

    monkeypatch.setattr(fused, "synthesize", refuse)
    torch.testing.assert_close(torch.func.vmap(layer)(q), ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(torch.export.export(layer, (q,)).module()(q), ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(torch.jit.trace(layer, (q,), check_trace=False)(q), ref, atol=1e-5, rtol=1e-5)
    torch._dynamo.reset()
    compiled = torch.compile(layer, backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(q), ref, atol=1e-5, rtol=1e-5)
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    path = tmp_path / "decompress.onnx"
    torch.onnx.export(layer, (q,), str(path), input_names=["coeffs"], dynamo=True)
    (out,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"coeffs": q.numpy()})
    torch.testing.assert_close(torch.from_numpy(out), ref, atol=1e-4, rtol=1e-5)
