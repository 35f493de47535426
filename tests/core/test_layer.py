"""Decompress: the first layer. Folded dequantization/normalization, dtypes, autograd, compile, ONNX."""

import numpy as np
import pytest
import torch
from decode_checks import check_decompress

import dctdata
from dctdata import CodecSpec, Decompress
from dctdata.decoder.wire import split_wire
from dctdata.errors import DctDataError

# aten ops the version-2 affine pass may add to the matmul path: elementwise only, no gather or loops
V2_OPS = {
    "_to_copy", "add", "mul", "sub", "sign", "select", "view", "reshape", "matmul", "mm", "bmm", "expand",
    "unsqueeze", "squeeze", "transpose", "permute", "cat", "slice", "clone", "contiguous", "alias",
    "unsafe_view", "_assert_tensor_metadata", "to", "lift_fresh_copy", "detach_", "div", "neg", "sym_size",
}  # fmt: skip


def make_spec(dtype="float32", cf=4, mask="square", channels=2, height=29, width=43, quantized=True, normalized=False):
    k = dctdata.num_kept(cf, mask)
    kw = {}
    if quantized:
        base = 0.1 if dtype == "int8" else 0.002  # rand() data: DC ~ 4 +- 2, AC ~ +-2
        kw["steps"] = [[base * (1 + 0.1 * i) for i in range(k)] for c in range(channels)]
        kw["offsets"] = [[4.0] + [0.0] * (k - 1) for c in range(channels)]
    if normalized:
        kw["mean"] = [0.5 + c for c in range(channels)]
        kw["std"] = [0.25 * (c + 1) for c in range(channels)]
    return CodecSpec(cf=cf, mask=mask, channels=channels, height=height, width=width, dtype=dtype, **kw)


def batch(spec, b=3, seed=0):
    x = torch.rand(b, *spec.sample_shape, generator=torch.Generator().manual_seed(seed))
    q, overflow = dctdata.encode(x, spec)
    assert overflow == 0
    return x, q


@pytest.mark.parametrize("wire", ["float32", "float16", "bfloat16", "int8", "int16"])
@pytest.mark.parametrize("mask", ["square", "triangle"])
@pytest.mark.parametrize("normalized", [False, True])
def test_layer_equals_reference_chain_for_every_wire_dtype(wire, mask, normalized):
    spec = make_spec(wire, mask=mask, quantized=wire.startswith("int"), normalized=normalized)
    _, q = batch(spec)
    assert q.dtype == spec.torch_dtype
    check_decompress(spec, q)


@pytest.mark.parametrize("out_dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_output_dtype_is_the_requested_one(out_dtype):
    spec = make_spec("int16")
    _, q = batch(spec)
    check_decompress(spec, q, dtype=out_dtype)


def test_unbatched_input_gives_unbatched_output():
    spec = make_spec("int8")
    _, q = batch(spec, b=2)
    layer = Decompress(spec)
    torch.testing.assert_close(layer(q[1]), layer(q)[1])


def test_int16_decode_is_close_to_the_original():
    spec = make_spec("int16", cf=8, quantized=True)
    spec = spec.replace(steps=[[1e-3] * 64] * 2, offsets=None)
    x, q = batch(spec)
    assert float((Decompress(spec)(q) - x).abs().max()) < 5e-3


def test_normalization_is_folded_not_a_separate_pass():
    spec = make_spec("float32", quantized=False, normalized=True)
    _x, q = batch(spec)
    out = Decompress(spec)(q)
    raw = Decompress(spec, normalize=False)(q)
    mean = torch.tensor(spec.mean).reshape(1, -1, 1, 1)
    std = torch.tensor(spec.std).reshape(1, -1, 1, 1)
    torch.testing.assert_close(out, (raw - mean) / std, atol=1e-5, rtol=0)
    # the folded weights are buffers that do not end up in checkpoints
    assert Decompress(spec).state_dict() == {}


def test_gradcheck_through_the_layer():
    spec = make_spec("float32", cf=3, mask="triangle", height=11, width=13, quantized=True, normalized=True)
    q = torch.randn(2, *spec.coeff_shape, dtype=torch.float64, requires_grad=True)
    layer = Decompress(spec, dtype=torch.float64)
    assert torch.autograd.gradcheck(layer, (q,), eps=1e-6, atol=1e-5)


def test_layer_in_a_model_trains():
    spec = make_spec("float32", quantized=False, height=16, width=16, channels=1)
    x, q = batch(spec, b=4)
    torch.manual_seed(0)
    model = torch.nn.Sequential(Decompress(spec), torch.nn.Conv2d(1, 1, 3, padding=1))
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    losses = []
    for _ in range(40):
        opt.zero_grad()
        loss = (model(q) - x).pow(2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


@pytest.mark.slow
def test_torch_compile_matches_eager():
    spec = make_spec("int8", normalized=True)
    _, q = batch(spec)
    layer = Decompress(spec)
    compiled = torch.compile(layer)
    torch.testing.assert_close(compiled(q), layer(q), atol=1e-5, rtol=1e-5)


def test_torch_export_uses_only_matmul_class_ops():
    spec = make_spec("int8", mask="triangle", normalized=True)
    _, q = batch(spec)
    exported = torch.export.export(Decompress(spec), (q,))
    ops = {str(n.target) for n in exported.graph.nodes if n.op == "call_function"}
    allowed = (
        "matmul",
        "mm",
        "bmm",
        "view",
        "reshape",
        "transpose",
        "permute",
        "expand",
        "unsqueeze",
        "squeeze",
        "cat",
        "stack",
        "new_zeros",
        "zeros",
        "ones",
        "full",
        "add",
        "slice",
        "clone",
        "contiguous",
        "_to_copy",
        "to",
        "alias",
        "unsafe_view",
        "_assert",
        "sym_size",
        "copy",
    )
    assert ops, "export produced no ops"
    bad = [op for op in ops if not any(a in op for a in allowed)]
    assert not bad, bad
    torch.testing.assert_close(exported.module()(q), Decompress(spec)(q))


def test_onnx_export_runs_in_onnxruntime_with_the_same_result(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    spec = make_spec("int16", mask="triangle", normalized=True)
    _, q = batch(spec)
    layer = Decompress(spec).eval()
    path = tmp_path / "decompress.onnx"
    torch.onnx.export(layer, (q,), str(path), input_names=["coeffs"], output_names=["images"], dynamo=True)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (out,) = session.run(None, {"coeffs": q.numpy()})
    torch.testing.assert_close(torch.from_numpy(out), layer(q), atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize(
    "shape, msg",
    [
        ((3, 2, 4, 16, 6), r"expected shape \(B, 2, 4, 16, 6\) = \(B, C, Hb, K, Wb\) .* Got \(3, 2, 4, 16, 6\)"),
        ((2, 4, 9, 6), r"Got \(2, 4, 9, 6\)"),
        ((16,), r"Got \(16,\)"),
    ],
)
def test_coefficient_shape_mismatch_is_a_clear_error(shape, msg):
    spec = make_spec("float32", quantized=False)  # expects (C=2, Hb=4, K=16, Wb=6)
    if shape == (3, 2, 4, 16, 6):
        shape = (3, 2, 4, 9, 6)
        msg = r"expected shape \(B, 2, 4, 16, 6\) = \(B, C, Hb, K, Wb\) for cf=4 .* Got \(3, 2, 4, 9, 6\)"
    with pytest.raises(dctdata.DctDataError, match=msg):
        Decompress(spec)(torch.zeros(shape))


def test_wrong_types_are_type_errors():
    spec = make_spec("float32", quantized=False)
    with pytest.raises(TypeError, match=r"spec: expected a dctdata.CodecSpec"):
        Decompress({"cf": 4})
    with pytest.raises(TypeError, match="dtype: expected one of"):
        Decompress(spec, dtype=torch.int8)
    with pytest.raises(TypeError, match="coeffs: expected int8, int16, float16, bfloat16, float32 or float64 coeff"):
        Decompress(spec)(torch.zeros(1, *spec.coeff_shape, dtype=torch.bool))
    with pytest.raises(TypeError, match=r"coeffs: expected a torch.Tensor"):
        Decompress(spec)([1, 2])


@pytest.mark.cuda
def test_cpu_cuda_parity():
    spec = make_spec("int8", mask="triangle", normalized=True)
    _, q = batch(spec, b=8)
    cpu = Decompress(spec)(q)
    gpu = check_decompress(spec, q.cuda())
    torch.testing.assert_close(gpu.cpu(), cpu, atol=1e-4, rtol=1e-5)
    x = torch.rand(4, 3, 61, 77, device="cuda")
    torch.testing.assert_close(dctdata.compress(x, 5).cpu(), dctdata.compress(x.cpu(), 5), atol=1e-4, rtol=1e-5)


def test_decompressor_from_a_packed_dataset_and_non_dct_fields(tmp_path):
    import numpy as np

    rng = np.random.default_rng(0)
    src = tmp_path / "src.npz"
    np.savez(src, image=rng.random((4, 1, 12, 20), dtype=np.float32), label=np.arange(4, dtype=np.int64))
    dctdata.pack(str(src), str(tmp_path / "out"), cf=3, quiet=True)
    ds = dctdata.open_dataset(str(tmp_path / "out"))
    layer = ds.decompressor()
    assert isinstance(layer, Decompress) and layer.spec.cf == 3 and layer.spec.sample_shape == (1, 12, 20)
    assert ds.decompressor("image").spec == layer.spec
    with pytest.raises(
        dctdata.DctDataError, match=r"field 'label': expected a dct field for decompressor\(\)\. Got kind 'label'"
    ):
        ds.decompressor("label")


def v2_wire(channels=3, b=4, seed=1, weighted=False):
    """A real version-2 codec (dead zone, recon offset, per-sample side, KLT rotation) and its wire. The
    calibration lands a rotated setting with channel weights (codec v3); without `weighted` they are
    dropped (the same steps, a version-2 spec), with it the landed v3 spec is kept."""
    from sci_fields import synthetic_fields

    from dctdata.encoder.calibrate import calibrate_report

    fields = synthetic_fields(n=8, size=48, seed=seed)
    x = torch.from_numpy(np.stack([fields[k][:, 0] for k in ("atoms", "beam", "clouds")][:channels], axis=1))
    x = x + torch.linspace(0, 1, channels).reshape(1, -1, 1, 1) * x  # correlated channels: rotation pays
    spec = calibrate_report(x, quant=None, target_psnr=40, rotation=True).spec
    assert spec.rotation is not None and (spec.weights is not None) == (spec.version == 3)
    if not weighted:
        spec = spec.replace(weights=None)
    wire, overflow = dctdata.encode(x[:b], spec)
    assert overflow == 0 and isinstance(wire, tuple)
    return spec, wire


@pytest.mark.parametrize("weighted", [False, True])
def test_v2_layer_with_side_and_rotation_equals_the_reference(weighted):
    spec, wire = v2_wire(weighted=weighted)
    assert spec.side == "range_mid" and spec.rotation is not None and spec.recon is not None
    assert spec.version == (3 if weighted else 2) and (spec.weights is not None) == weighted
    out = check_decompress(spec, wire)
    torch.testing.assert_close(Decompress(spec)((wire[0][1], wire[1][1])), out[1])  # unbatched pair
    with pytest.raises(TypeError, match=r"expected the pair \(coefficients, side\)"):
        Decompress(spec)(wire[0])  # a side codec needs its side


def test_split_wire_checks_the_pair_in_every_batch_form():
    """The batch case compares ints only (it runs on every call); other leading axes take the general check."""
    spec, (q, side) = v2_wire()
    rows = spec.side_rows
    one = q[0]
    assert split_wire((q, side), spec)[1] is side and split_wire([one, side[0]], spec)[0] is one
    two = (q.unsqueeze(0).expand(2, *q.shape), side.unsqueeze(0).expand(2, *side.shape))
    assert split_wire(two, spec)[1].shape == (2, *side.shape)
    bad = [
        (q, side[:1]),  # one side row too few samples
        (q, side[:, :1] if rows > 1 else side.expand(-1, 2, -1)),  # wrong rows
        (q, side[..., :1]),  # (range, mid) cut
        (two[0], side),  # leading axes differ
        (q[0], side),  # unbatched coefficients, batched side
    ]
    for pair in bad:
        with pytest.raises(DctDataError, match=rf"side: expected shape \(\.\.\., {rows}, 2\) matching coefficients"):
            split_wire(pair, spec)
    for wrong in ((q,), (q, side, side), (q, side.numpy()), "coeffs"):
        with pytest.raises(TypeError, match=r"coeffs: expected the pair \(coefficients, side\) of torch.Tensors"):
            split_wire(wrong, spec)


@pytest.mark.cuda
def test_v2_layer_on_cuda_matches_cpu():
    spec, (q, side) = v2_wire()
    cpu = Decompress(spec)((q, side))
    gpu = Decompress(spec).cuda()((q.cuda(), side.cuda()))
    assert gpu.is_cuda and gpu.shape == cpu.shape
    torch.testing.assert_close(gpu.cpu(), cpu, atol=1e-5 * float(cpu.abs().max()), rtol=1e-5)
    half = Decompress(spec, dtype=torch.bfloat16).to("cuda", torch.bfloat16)((q.cuda(), side.cuda()))
    assert half.dtype == torch.bfloat16
    torch.testing.assert_close(half.float().cpu(), cpu, atol=2e-2 * float(cpu.abs().max()), rtol=2e-2)


def test_v2_layer_exports_and_runs_in_onnxruntime(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    spec, (q, side) = v2_wire()
    layer = Decompress(spec).eval()
    exported = torch.export.export(layer, ((q, side),))
    ops = {str(n.target).split(".")[1] for n in exported.graph.nodes if n.op == "call_function"}
    assert ops <= V2_OPS, ops - V2_OPS
    path = tmp_path / "decompress_v2.onnx"
    torch.onnx.export(layer, ((q, side),), str(path), input_names=["coeffs", "side"], dynamo=True)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (out,) = session.run(None, {"coeffs": q.numpy(), "side": side.numpy()})
    ref = layer((q, side))  # float32 rounding relative to the channel ranges (up to 1e5 here)
    torch.testing.assert_close(torch.from_numpy(out), ref, atol=1e-6 * float(ref.abs().max()), rtol=1e-5)
