"""Volumes: the 8x8x8 block DCT (dctdata.codec.transform3d), volume CodecSpecs, and their first layer
(dctdata.decoder.volume.VolumeDecompress): the fused C kernel and the portable matmul graph against the float64
reference for every wire dtype, mask, CF and cropped size; autograd, torch.export, ONNX, CUDA."""

import itertools
import math

import pytest
import torch
from decode_checks import check_decompress

import dctdata
import dctdata.decoder.fused as fused
from dctdata import CodecSpec, Decompress
from dctdata.codec import transform3d as t3
from dctdata.decoder.volume import VolumeDecompress
from dctdata.encoder.quantize import decode_reference, encode

V2_OPS = {
    "_to_copy", "add", "mul", "sub", "sign", "select", "view", "reshape", "matmul", "mm", "bmm", "expand",
    "unsqueeze", "squeeze", "transpose", "permute", "cat", "slice", "clone", "contiguous", "alias", "stack",
    "unsafe_view", "_assert_tensor_metadata", "to", "lift_fresh_copy", "detach_", "div", "neg", "sym_size",
    "new_zeros", "zeros", "copy",
}  # fmt: skip


def smooth(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).cumsum(-1).cumsum(-2).cumsum(-3)


def reference_coefficients(x: torch.Tensor, cf: int, mask: str) -> torch.Tensor:
    """(N, D, H, W) -> (N, Db, Hb, K, Wb) with the dense (K, 512) basis, in float64."""
    v = t3.pad_to_blocks(x.double())
    n, d, h, w = v.shape
    blocks = (
        v.reshape(n, d // 8, 8, h // 8, 8, w // 8, 8).permute(0, 1, 3, 5, 2, 4, 6).reshape(n, d // 8, h // 8, -1, 512)
    )
    return (blocks @ t3.basis(cf, mask).T).permute(0, 1, 2, 4, 3)


def volume_spec(dtype="int8", cf=4, mask="cube", channels=2, size=(13, 9, 21), **kw):
    k = t3.num_kept(cf, mask)
    if dtype in ("int8", "int16"):
        base = 0.02 if dtype == "int8" else 0.0005
        kw.setdefault("steps", [[base * (1 + 0.01 * i) for i in range(k)] for _ in range(channels)])
    d, h, w = size
    return CodecSpec(cf=cf, mask=mask, channels=channels, depth=d, height=h, width=w, dtype=dtype, **kw)


def v3_wire(dtype="int8", cf=4, mask="cube", channels=2, size=(13, 9, 21), batch=3, **kw):
    """A calibrated-style volume spec (dead zone, recon, rotation, side values) and an encoded batch."""
    k = t3.num_kept(cf, mask)
    if channels > 1:
        a = math.pi / 7
        kw.setdefault("rotation", [[math.cos(a), math.sin(a)], [-math.sin(a), math.cos(a)]])
    if dtype in ("int8", "int16"):
        kw.setdefault("theta", 0.4)
        kw.setdefault("recon", [[0.05 + 0.001 * i for i in range(k)] for _ in range(channels)])
    spec = volume_spec(dtype, cf, mask, channels, size, side="range_mid", **kw)
    x = smooth(batch, channels, *size) * torch.tensor([1.0, 300.0][:channels]).reshape(1, -1, 1, 1, 1)
    wire, _ = encode(x, spec)
    return spec, wire, x


# transform3d ------------------------------------------------------------------------------------
@pytest.mark.parametrize("cf", range(1, 9))
def test_kept_frequencies_of_both_masks(cf):
    cube, tetra = t3.kept_frequencies(cf, "cube"), t3.kept_frequencies(cf, "tetra")
    assert len(cube) == cf**3 and len(tetra) == cf * (cf + 1) * (cf + 2) // 6
    assert cube[0] == tetra[0] == (0, 0, 0)
    assert all(u + v + w < cf for u, v, w in tetra) and list(cube) == sorted(cube)
    assert t3.kept_frequencies(cf, "square") == cube and t3.kept_frequencies(cf, "triangle") == tetra


def test_basis_is_orthonormal():
    b = t3.basis(8, "cube")
    torch.testing.assert_close(b @ b.T, torch.eye(512, dtype=torch.float64))


@pytest.mark.parametrize("mask", ["cube", "tetra"])
@pytest.mark.parametrize("cf", [1, 3, 8])
@pytest.mark.parametrize("size", [(13, 9, 17), (8, 8, 8), (1, 1, 1), (2, 30, 3)])
def test_compress_equals_the_dense_basis_and_decompress_inverts_it(mask, cf, size):
    x = smooth(2, *size)
    y = t3.compress(x, cf, mask)
    db, hb, wb = t3.grid_shape(*size)
    assert y.shape == (2, db, hb, t3.num_kept(cf, mask), wb) and y.dtype == torch.float32
    ref = reference_coefficients(x, cf, mask)
    torch.testing.assert_close(y.double(), ref, atol=1e-4 * float(ref.abs().max()), rtol=0)
    back = t3.decompress(ref.float(), cf, size, mask)
    dense = (ref.permute(0, 1, 2, 4, 3) @ t3.basis(cf, mask)).reshape(2, db, hb, wb, 8, 8, 8)
    dense = dense.permute(0, 1, 4, 2, 5, 3, 6).reshape(2, db * 8, hb * 8, wb * 8)[:, : size[0], : size[1], : size[2]]
    torch.testing.assert_close(back.double(), dense, atol=1e-4 * float(dense.abs().max()), rtol=0)
    if cf == 8 and mask == "cube":
        torch.testing.assert_close(back, x, atol=1e-4 * float(x.abs().max()), rtol=0)


def test_symmetric_padding_mirrors_the_volume():
    x = torch.arange(3.0).reshape(1, 3, 1, 1).expand(1, 3, 1, 1)
    padded = t3.pad_to_blocks(x, "symmetric")
    assert padded.shape == (1, 8, 8, 8)
    assert padded[0, :, 0, 0].tolist() == [0, 1, 2, 2, 1, 0, 0, 1]
    assert t3.pad_to_blocks(x, "edge")[0, :, 0, 0].tolist() == [0, 1, 2, 2, 2, 2, 2, 2]
    with pytest.raises(
        dctdata.DctDataError, match=r"pad: expected one of \('edge', 'symmetric', 'extend'\). Got 'zero'"
    ):
        t3.pad_to_blocks(x, "zero")


def test_extend_padding_fills_each_axis_from_the_last_block_alone():
    x = smooth(1, 9, 13, 20, seed=4)  # D: r = 1, H: r = 5, W: r = 4
    padded = t3.pad_to_blocks(x)  # the default
    assert padded.shape == (1, 16, 16, 24) and torch.equal(padded[:, :9, :13, :20], x)
    assert torch.equal(padded[:, :9, :13, 20:], x[..., [19, 18, 17, 16]])  # mirrored inside the block
    assert torch.equal(padded[:, :9, 13:, :20], x[:, :, [12, 11, 10], :])
    assert torch.equal(padded[:, 9:], padded[:, 8:9].expand(1, 7, 16, 24))  # one known slice: repeated
    want = reference_coefficients(x, 4, "cube").float()
    torch.testing.assert_close(t3.compress(x, 4, "cube"), want, atol=1e-5 * float(want.abs().max()), rtol=0)


def test_transform_errors_name_what_was_expected():
    with pytest.raises(dctdata.DctDataError, match=r"mask: expected one of \('cube', 'tetra'\).*Got 'round'"):
        t3.kept_frequencies(4, "round")
    with pytest.raises(TypeError, match="mask: expected one of"):
        t3.parse_mask3(3)
    with pytest.raises(dctdata.DctDataError, match=r"expected rank >= 3 with shape \(\.\.\., D, H, W\)"):
        t3.compress(torch.zeros(4, 4), 4)
    with pytest.raises(TypeError, match="expected a floating tensor"):
        t3.compress(torch.zeros(4, 4, 4, dtype=torch.int32), 4)
    with pytest.raises(dctdata.DctDataError, match=r"expected D, H, W >= 1"):
        t3.compress(torch.zeros(0, 4, 4), 4)
    with pytest.raises(
        dctdata.DctDataError, match=r"expected shape \(\.\.\., Db, Hb, K, Wb\) = \(\.\.\., 1, 1, 8, 1\)"
    ):
        t3.decompress(torch.zeros(1, 1, 9, 1), 2, (8, 8, 8))
    with pytest.raises(TypeError, match=r"size: expected a triple \(D, H, W\)"):
        t3.decompress(torch.zeros(1, 1, 8, 1), 2, (8, 8))
    with pytest.raises(dctdata.DctDataError, match=r"size: expected W >= 1. Got 0"):
        t3.decompress(torch.zeros(1, 1, 8, 1), 2, (8, 8, 0))


# CodecSpec ---------------------------------------------------------------------------------------
def test_volume_spec_shapes_and_round_trip():
    spec = volume_spec("int8", cf=3, mask="tetra", channels=2, size=(13, 9, 21), side="range_mid", theta=0.4)
    assert spec.dims == 3 and spec.version == 3 and spec.kept == 10
    assert spec.grid == (2, 2, 3) and spec.coeff_shape == (2, 2, 2, 10, 3) and spec.rows_shape == (2, 4, 10, 3)
    assert spec.sample_shape == (2, 13, 9, 21) and spec.size == (13, 9, 21)
    assert spec.to_dict()["depth"] == 13
    assert CodecSpec.from_dict(spec.to_dict()) == spec
    assert spec.transfer_ratio == pytest.approx(2 * 13 * 9 * 21 * 32 / (2 * 2 * 2 * 10 * 3 * 8 + 2 * 64))
    flat = CodecSpec(cf=4, height=8, width=8)
    assert flat.dims == 2 and "depth" not in flat.to_dict() and flat.rows_shape == flat.coeff_shape


def test_volume_spec_accepts_the_2d_mask_names_and_refuses_others():
    assert volume_spec("float32", mask="square").mask == "cube"
    assert volume_spec("float32", mask="triangle").mask == "tetra"
    with pytest.raises(dctdata.DctDataError, match=r"mask: expected one of \('cube', 'tetra'\)"):
        volume_spec("float32", mask="diamond")
    with pytest.raises(dctdata.DctDataError, match=r"mask: expected one of \('square', 'triangle'\)"):
        CodecSpec(cf=4, height=8, width=8, mask="cube")
    with pytest.raises(dctdata.DctDataError, match=r"depth: expected a positive int. Got 0"):
        CodecSpec(cf=4, depth=0, height=8, width=8)
    with pytest.raises(dctdata.DctDataError, match=r"steps: expected shape \(1, 64\)"):
        CodecSpec(cf=4, depth=8, height=8, width=8, dtype="int8", steps=[[0.1] * 16])
    with pytest.raises(dctdata.DctDataError, match=r"expected at most 4294967296 values per sample. Got 2 x 2048"):
        CodecSpec(cf=4, channels=2, depth=2048, height=2048, width=1024)


# The layer --------------------------------------------------------------------------------------
def paths(monkeypatch, fused_on: bool):
    monkeypatch.setattr(fused, "ENABLED", fused_on)
    monkeypatch.setattr(fused, "REQUIRE_VECTOR", False)


@pytest.mark.parametrize("fused_on", [True, False], ids=["fused", "portable"])
@pytest.mark.parametrize(
    "dtype, cf, mask, size",
    [
        ("int8", 4, "cube", (13, 9, 21)),
        ("int8", 8, "tetra", (8, 16, 8)),
        ("int16", 8, "cube", (3, 70, 11)),
        ("int16", 1, "tetra", (1, 1, 9)),
        ("float32", 8, "cube", (17, 5, 65)),
        ("float16", 2, "tetra", (9, 9, 9)),
        ("bfloat16", 5, "tetra", (16, 8, 24)),
    ],
)
def test_calibrated_style_layer_equals_the_float64_reference(monkeypatch, fused_on, dtype, cf, mask, size):
    paths(monkeypatch, fused_on)
    spec, wire, x = v3_wire(dtype, cf, mask, size=size)
    layer = Decompress(spec)
    assert isinstance(layer, VolumeDecompress) and isinstance(layer, Decompress)
    assert fused.usable(wire[0], torch.float32, None) == fused_on
    out = check_decompress(spec, wire, atol=2e-6)
    torch.testing.assert_close(Decompress(spec)((wire[0][1], wire[1][1])), out[1])  # unbatched pair
    if dtype == "int16" and cf == 8:  # fine steps, every frequency: the decode is close to the original
        assert float((out - x).abs().max()) < 0.01 * float(x.amax() - x.amin())


@pytest.mark.parametrize("fused_on", [True, False], ids=["fused", "portable"])
@pytest.mark.parametrize("normalized", [False, True])
def test_plain_specs_with_offsets_and_normalization_equal_the_reference(monkeypatch, fused_on, normalized):
    paths(monkeypatch, fused_on)
    kw = dict(mean=[0.5, -2.0], std=[2.0, 0.25]) if normalized else {}
    k = t3.num_kept(3, "tetra")
    spec = volume_spec("int16", cf=3, mask="tetra", offsets=[[1.0] + [0.1] * (k - 1)] * 2, **kw)
    q = torch.randint(-300, 300, (2, *spec.coeff_shape), dtype=torch.int16)
    check_decompress(spec, q, atol=2e-6)
    f = volume_spec("float32", cf=4)
    check_decompress(f, torch.randn(2, *f.coeff_shape), atol=2e-6)


def test_fused_kernel_avx2_and_portable_loops_agree():
    if not fused.available():
        pytest.skip("dctdata.decoder._synth is not built")
    spec, (q, side), _ = v3_wire("int8", 8, "cube", size=(12, 17, 70))
    tables = fused.tables_for(spec)
    a = fused.synthesize_volume(q, tables, spec.cf, spec.mask, spec.size, side=side)
    b = fused.synthesize_volume(q, tables, spec.cf, spec.mask, spec.size, side=side, portable=True)
    torch.testing.assert_close(a, b, atol=1e-5 * float(a.abs().max()), rtol=0)
    out = torch.full((3, *spec.sample_shape), float("nan"))
    c = fused.synthesize_volume(q, tables, spec.cf, spec.mask, spec.size, out=out, side=side, stream=True)
    assert c is out and torch.equal(c, a)


def test_fused_kernel_checks_what_it_indexes():
    if not fused.available():
        pytest.skip("dctdata.decoder._synth is not built")
    spec, (q, side), _ = v3_wire("int8", 4, "tetra")
    tables = fused.tables_for(spec)
    with pytest.raises(dctdata.DctDataError, match=r"tables: expected K = 35 for cf=5 mask='tetra'. Got 20"):
        fused.synthesize_volume(q, tables, 5, "tetra", spec.size, side=side)
    with pytest.raises(dctdata.DctDataError, match=r"coeffs: expected shape \(B, C, Db, Hb, K, Wb\). Got"):
        fused.synthesize_volume(q[0], tables, 4, "tetra", spec.size, side=side[0])
    with pytest.raises(dctdata.DctDataError, match=r"coeffs: expected shape \(3, 2, 2, 2, 20, 4\)"):
        fused.synthesize_volume(q, tables, 4, "tetra", (13, 9, 30), side=side)
    with pytest.raises(dctdata.DctDataError, match=r"out: expected shape \(3, 2, 13, 9, 21\)"):
        fused.synthesize_volume(q, tables, 4, "tetra", spec.size, out=torch.empty(3, 2, 13, 9, 20), side=side)
    with pytest.raises(ValueError, match="inconsistent"):  # the C checks too
        fused._synth.synthesize3(
            q.numpy(), 0, torch.empty(3, 2, 13, 9, 21).numpy(), (3, 2, 2, 2, 20, 3, 40, 9, 21), 4, 1,
            tables.a.numpy(), tables.d.numpy(), None, None, None, None,
        )  # fmt: skip


def test_layer_out_buffer_and_output_dtypes(monkeypatch):
    paths(monkeypatch, True)
    spec, wire, _ = v3_wire("int8", 4, "cube")
    layer = Decompress(spec)
    ref = layer(wire)
    buf = torch.empty_like(ref)
    assert layer(wire, out=buf) is buf and torch.equal(buf, ref)
    for dt in (torch.float64, torch.bfloat16, torch.float16):
        got = Decompress(spec, dtype=dt)(wire)
        assert got.dtype == dt
        torch.testing.assert_close(got.float(), ref, atol=1e-2 * float(ref.abs().max()), rtol=0)
    with pytest.raises(dctdata.DctDataError, match=r"out: expected shape \(3, 2, 13, 9, 21\)"):
        layer(wire, out=torch.empty(3, 2, 13, 9, 20))


def test_layer_errors_name_the_expected_form():
    spec, (q, side), _ = v3_wire("int8", 4, "cube")
    layer = Decompress(spec)
    with pytest.raises(dctdata.DctDataError, match=r"expected shape \(B, 2, 2, 2, 64, 3\) = \(B, C, Db, Hb, K, Wb\)"):
        layer((q[..., :2], side))
    with pytest.raises(TypeError, match=r"expected the pair \(coefficients, side\)"):
        layer(q)
    # the wire dtypes only, as the 2-D layer: uint8 would read int8's -1 as 255 and decode silently wrong
    for bad in (q.bool(), q.view(torch.uint8), q.to(torch.int32), q.to(torch.int64), q.to(torch.complex64)):
        wire_only = rf"expected int8, int16, .* \(the wire dtypes; this spec's is int8\)\. Got {bad.dtype}"
        with pytest.raises(TypeError, match=wire_only):
            layer((bad, side))
    with pytest.raises(dctdata.DctDataError, match="expected a volume spec"):
        VolumeDecompress(CodecSpec(cf=4, height=8, width=8))
    assert "size=(13, 9, 21)" in repr(layer) and "rotation" in repr(layer)


def test_encode_checks_the_volume_shape():
    spec = volume_spec("int8", cf=2)
    with pytest.raises(dctdata.DctDataError, match=r"expected shape \(\.\.\., 2, 13, 9, 21\) = \(\.\.\., C, D, H, W\)"):
        encode(torch.zeros(1, 2, 9, 21), spec)


def test_gradcheck_through_the_portable_graph(monkeypatch):
    spec, (q, side), _ = v3_wire("int8", 3, "tetra", size=(9, 5, 10), batch=1)
    layer = Decompress(spec, dtype=torch.float64)
    y = torch.where(q == 0, 1, q).double().requires_grad_(True)  # recon * sign(q) has no derivative at q = 0
    assert bool((y != 0).all()) and torch.autograd.gradcheck(lambda t: layer((t, side)), (y,), eps=1e-6, atol=1e-5)


def test_torch_export_uses_only_matmul_class_ops():
    spec, (q, side), _ = v3_wire("int8", 3, "tetra")
    layer = Decompress(spec).eval()
    exported = torch.export.export(layer, ((q, side),))
    ops = {str(n.target).split(".")[1] for n in exported.graph.nodes if n.op == "call_function"}
    assert ops and ops <= V2_OPS, ops - V2_OPS
    ref = layer((q, side))
    torch.testing.assert_close(exported.module()((q, side)), ref, atol=1e-5 * float(ref.abs().max()), rtol=0)


def test_onnx_export_runs_in_onnxruntime_with_the_same_result(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    spec, (q, side), _ = v3_wire("int16", 4, "cube")
    layer = Decompress(spec).eval()
    path = tmp_path / "volume.onnx"
    torch.onnx.export(layer, ((q, side),), str(path), input_names=["coeffs", "side"], dynamo=True)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (out,) = session.run(None, {"coeffs": q.numpy(), "side": side.numpy()})
    ref = layer((q, side))
    torch.testing.assert_close(torch.from_numpy(out), ref, atol=1e-5 * float(ref.abs().max()), rtol=1e-5)


@pytest.mark.slow
def test_torch_compile_matches_eager():
    spec, wire, _ = v3_wire("int8", 4, "tetra")
    layer = Decompress(spec)
    ref = layer(wire)
    torch.testing.assert_close(torch.compile(layer)(wire), ref, atol=1e-5 * float(ref.abs().max()), rtol=0)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype, cf, mask", list(itertools.product(["int8", "int16"], [2, 8], ["cube", "tetra"])))
def test_volume_layer_on_cuda_matches_the_reference(dtype, cf, mask):
    spec, (q, side), _ = v3_wire(dtype, cf, mask, size=(21, 33, 40))
    ref = decode_reference((q, side), spec).float()
    gpu = Decompress(spec).cuda()((q.cuda(), side.cuda()))
    assert gpu.is_cuda and gpu.shape == ref.shape and gpu.dtype == torch.float32
    torch.testing.assert_close(gpu.cpu(), ref, atol=2e-6 * float(ref.abs().max()), rtol=0)
    half = Decompress(spec, dtype=torch.bfloat16).to("cuda", torch.bfloat16)((q.cuda(), side.cuda()))
    assert half.dtype == torch.bfloat16
    torch.testing.assert_close(half.float().cpu(), ref, atol=2e-2 * float(ref.abs().max()), rtol=0)
    compiled = torch.compile(Decompress(spec).cuda())
    torch.testing.assert_close(compiled((q.cuda(), side.cuda())).cpu(), ref, atol=2e-6 * float(ref.abs().max()), rtol=0)
