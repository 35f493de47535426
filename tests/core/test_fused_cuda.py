"""The fused CUDA decode kernel (dctdata.decoder.fused_cuda, dctdata/decoder/_triton_synth.py).

Without a GPU: its values under Triton's interpreter (TRITON_INTERPRET=1, on CPU tensors; tiny sizes, the
interpreter runs about a second per program) against the reference decoder and the eager layer, its masks
(nothing written outside `out`, crops, several strips per block row, batches split over launches), the
layer's wiring, the fallback when the kernel fails and the argument checks (the compile of each kernel
variant to sm_90 machine code, without a driver, is in benchmarks/tests/test_kernel_sass.py). With a GPU
(`-m cuda`): the layer on CUDA takes the kernel and equals the reference for every wire and output dtype, codec
version and mask.

Measured agreement on this file's interpreter cases: at most 2.5e-7 x the output's largest magnitude against
the eager layer and against the float64 reference decoder (a few float32 ulps; the sums run in another
order), so the tests allow 1e-6 x it. Not bit-exact with the eager layer on any device: its matmuls sum in
cuBLAS's or BLAS's order. On CUDA the kernel's
fused multiply-adds round differently again: 1e-5 x, as the existing CUDA parity tests.
"""

import dataclasses
import math

import pytest
import torch
from decode_checks import check_decompress
from gpu_fakes import forget_kernel, interpreted_kernel

import dctdata
import dctdata.decoder.fused as fused
import dctdata.decoder.fused_cuda as fused_cuda
from dctdata import CodecSpec, Decompress
from dctdata.decoder.wire import split_wire
from dctdata.encoder.quantize import decode_reference

triton = pytest.importorskip("triton")


@pytest.fixture
def interpreted(monkeypatch):
    """The kernel module under Triton's interpreter (runs on CPU tensors)."""
    yield interpreted_kernel(monkeypatch)
    forget_kernel()


def v2_spec(cf=3, mask="square", channels=2, height=11, width=19, wire="int8", rotation=True, normalized=True):
    """A version-2 codec with every stage: dead zone, recon offsets, rotation, per-sample side, normalization."""
    k = dctdata.num_kept(cf, mask)
    th = 0.5
    rot = [[math.cos(th), -math.sin(th)], [math.sin(th), math.cos(th)]] if rotation and channels == 2 else None
    norm = dict(mean=[0.2 * (c + 1) for c in range(channels)], std=[0.5 * (c + 1) for c in range(channels)])
    return CodecSpec(
        cf=cf, mask=mask, channels=channels, height=height, width=width, dtype=wire, theta=0.4, side="range_mid",
        steps=[[0.02 * (1 + 0.1 * i) for i in range(k)] for _ in range(channels)],
        offsets=[[0.3] + [0.01] * (k - 1) for _ in range(channels)],
        recon=[[0.1 + 0.01 * i for i in range(k)] for _ in range(channels)], rotation=rot,
        **(norm if normalized else {}),
    )  # fmt: skip


def v1_spec(cf=3, mask="square", channels=2, height=11, width=19, wire="int16"):
    k = dctdata.num_kept(cf, mask)
    base = 0.2 if wire == "int8" else 0.002  # 3 rand() + 1 data: DC up to ~32, AC ~ +-6
    return CodecSpec(
        cf=cf, mask=mask, channels=channels, height=height, width=width, dtype=wire,
        steps=None if wire.startswith("float") else [[base * (1 + 0.1 * i) for i in range(k)]] * channels,
        offsets=[[4.0 + c] + [0.01 * i for i in range(1, k)] for c in range(channels)],
        mean=[0.5 + c for c in range(channels)], std=[0.25 * (c + 1) for c in range(channels)],
    )  # fmt: skip


def wire_of(spec, b=2, seed=0):
    x = 3 * torch.rand(b, *spec.sample_shape, generator=torch.Generator().manual_seed(seed)) + 1
    wire, overflow = dctdata.encode(x, spec)
    assert overflow == 0
    return wire


def kernel(spec, wire, dtype=torch.float32, out=None):
    q, side = split_wire(wire, spec)
    tables = fused_cuda.device_tables(fused.tables_for(spec), q.device, spec.cf, spec.mask)
    return fused_cuda.synthesize(q, tables, spec.cf, spec.mask, (spec.height, spec.width), out, side, dtype)


def assert_matches(out, spec, wire, rel=1e-6):
    """`out` equals the reference decoder and the eager layer within `rel` x the output's largest magnitude."""
    ref = decode_reference(wire, spec).float()
    scale = max(1.0, float(ref.abs().max()))
    torch.testing.assert_close(out.float(), ref, atol=rel * scale, rtol=0)
    torch.testing.assert_close(out.float(), Decompress(spec)(wire), atol=rel * scale, rtol=0)


@pytest.mark.parametrize(
    "spec",
    [
        v1_spec(3, "square"),
        v1_spec(4, "triangle", channels=1, wire="float16"),
        v2_spec(3, "square"),
        v2_spec(4, "triangle", channels=1, wire="int16", normalized=False),
        v2_spec(8, "square", channels=1, height=8, width=9),
    ],
    ids=["v1-int16-square", "v1-float16-triangle", "v2-rotation-square", "v2-triangle", "v2-cf8"],
)
def test_kernel_equals_the_reference_and_the_eager_layer(spec, interpreted):
    wire = wire_of(spec)
    assert_matches(kernel(spec, wire), spec, wire)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_outputs_are_the_float32_result_rounded(dtype, interpreted):
    spec = v2_spec(2, channels=1, height=8, width=12)
    wire = wire_of(spec, b=1)
    full = kernel(spec, wire)
    half = kernel(spec, wire, dtype=dtype)
    assert half.dtype == dtype
    if dtype == torch.float16:
        torch.testing.assert_close(half, full.to(dtype), atol=0, rtol=0)
    else:  # the interpreter's float32 -> bfloat16 cast truncates (the GPU's rounds to nearest): within one bf16 ulp
        torch.testing.assert_close(half.float(), full, atol=0, rtol=2**-7)


def test_nothing_is_written_outside_out_and_strips_cover_wide_rows(interpreted):
    """A 530-wide sample has 67 block columns: two strips of 64 blocks (two warps'), the second one cropped."""
    assert fused_cuda.launch_config(67) == (64, 2) and fused_cuda.launch_config(32) == (32, 1)
    spec = v1_spec(2, channels=1, height=5, width=530, wire="int8")
    wire = wire_of(spec, b=1)
    n = math.prod(spec.sample_shape)
    guard = torch.full((n + 64,), -7.0)
    out = guard[32 : 32 + n].view(1, *spec.sample_shape)
    assert kernel(spec, wire, out=out) is out
    assert (guard[:32] == -7.0).all() and (guard[32 + n :] == -7.0).all()
    assert_matches(out, spec, wire)


def test_a_batch_over_the_grid_limit_is_launched_in_runs_of_samples(interpreted, monkeypatch):
    spec = v1_spec(2, channels=1, height=8, width=8, wire="int8")
    wire = wire_of(spec, b=3)
    launches = []
    real = interpreted.synthesize_kernel

    class Counting:
        def __getitem__(self, grid):
            launches.append(grid)
            return real[grid]

    monkeypatch.setattr(interpreted, "synthesize_kernel", Counting())
    monkeypatch.setattr(fused_cuda, "MAX_PROGRAMS", 2)  # one program per sample here: runs of 2 samples
    out = kernel(spec, wire)
    assert launches == [(2,), (1,)]
    assert_matches(out, spec, wire)


def test_the_layer_runs_the_kernel_where_usable(interpreted, monkeypatch):
    """The layer's wiring (tables, side, out=, unbatched input), with the kernel made usable on CPU tensors."""
    calls = []
    real = fused_cuda.synthesize
    monkeypatch.setattr(fused_cuda, "usable", lambda q, dtype, out: True)
    monkeypatch.setattr(fused_cuda, "synthesize", lambda *a, **k: calls.append(1) or real(*a, **k))
    spec = v2_spec(2, channels=2, height=9, width=10)
    q, side = wire_of(spec)
    layer = Decompress(spec)
    buf = torch.empty(2, *spec.sample_shape)
    assert layer((q, side), out=buf) is buf
    single = layer((q[1], side[1]))
    assert len(calls) == 2 and single.shape == spec.sample_shape
    monkeypatch.setattr(fused_cuda, "usable", lambda q, dtype, out: False)
    eager = layer((q, side))
    scale = float(eager.abs().max())
    torch.testing.assert_close(buf, eager, atol=1e-6 * scale, rtol=0)
    torch.testing.assert_close(single, eager[1], atol=1e-6 * scale, rtol=0)
    assert fused_cuda.broken() is None


def test_a_failing_kernel_is_switched_off_and_the_torch_paths_run(monkeypatch, caplog):
    monkeypatch.setattr(fused_cuda, "_broken", None)
    monkeypatch.setattr(fused_cuda, "usable", lambda q, dtype, out: fused_cuda.broken() is None)

    def fail(*args, **kwargs):
        raise RuntimeError("ptxas fatal: unsupported GPU architecture")

    monkeypatch.setattr(fused_cuda, "synthesize", fail)
    spec = v1_spec(2, channels=1, height=8, width=8)
    q = wire_of(spec)
    with caplog.at_level("WARNING", logger="dctdata.decoder.fused_cuda"):
        out = Decompress(spec)(q)
    assert "RuntimeError: ptxas fatal" in fused_cuda.broken()
    assert "portable graph from now on" in caplog.text
    assert not fused_cuda.available()
    check_decompress(spec, q)
    torch.testing.assert_close(out, Decompress(spec)(q))


def test_argument_errors_propagate_from_the_guard(monkeypatch):
    monkeypatch.setattr(fused_cuda, "_broken", None)

    def bad(*args, **kwargs):
        raise dctdata.DctDataError("coeffs: expected shape")

    with pytest.raises(dctdata.DctDataError, match="coeffs: expected shape"):
        fused_cuda.guarded(bad)
    assert fused_cuda.broken() is None


def test_usable_only_on_plain_cuda_tensors_in_eager_mode():
    q = torch.zeros(1, 1, 1, 4, 1, dtype=torch.int8)
    assert not fused_cuda.usable(q, torch.float32, None)  # CPU tensor
    meta = torch.zeros(1, 1, 1, 4, 1, dtype=torch.int8, device="meta")
    assert not fused_cuda.usable(meta, torch.float32, None)


@pytest.mark.parametrize(
    "change, error, match",
    [
        (dict(q=lambda q: q[:, :, :1]), dctdata.DctDataError, r"coeffs: expected shape \(2, 2, 2, 9, 3\)"),
        (dict(q=lambda q: q.double()), TypeError, r"coeffs: expected one of .* Got torch.float64"),
        (dict(dtype=torch.float64), TypeError, r"dtype: expected one of .* Got torch.float64"),
        (dict(side=lambda s: s[:1]), dctdata.DctDataError, r"side: expected shape \(2, 2, 2\)"),
        (dict(out=torch.empty(2, 2, 11, 19, dtype=torch.float16)), dctdata.DctDataError, r"out: expected a contig"),
        (dict(out=torch.empty(2, 2, 11, 18)), dctdata.DctDataError, r"out: expected shape \(2, 2, 11, 19\)"),
        (dict(mask="triangle"), dctdata.DctDataError, r"tables: built for cf=3 mask='square'; expected cf=3 mask='tri"),
    ],
)
def test_argument_errors(change, error, match):
    spec = v2_spec(3)
    q, side = wire_of(spec)
    tables = fused_cuda.device_tables(fused.tables_for(spec), "cpu", spec.cf, spec.mask)
    args = dict(q=q, mask=spec.mask, side=side, out=None, dtype=torch.float32)
    for key, value in change.items():
        args[key] = value(args[key]) if callable(value) else value
    with pytest.raises(error, match=match):
        fused_cuda.synthesize(args["q"], tables, 3, args["mask"], (11, 19), args["out"], args["side"], args["dtype"])


def test_side_with_v1_tables_and_misplaced_tables_are_errors():
    spec = v1_spec(2, channels=1, height=8, width=8)
    q = wire_of(spec)
    tables = fused_cuda.device_tables(fused.tables_for(spec), "cpu", spec.cf, spec.mask)
    with pytest.raises(dctdata.DctDataError, match="side: these tables \\(a v1 spec\\) take no side information"):
        fused_cuda.synthesize(q, tables, 2, "square", (8, 8), side=torch.ones(2, 1, 2))
    with pytest.raises(TypeError, match=r"tables: expected dctdata.decoder.fused_cuda.DeviceTables"):
        fused_cuda.synthesize(q, fused.tables_for(spec), 2, "square", (8, 8))
    with pytest.raises(TypeError, match=r"tables: expected dctdata.decoder.fused.Tables"):
        fused_cuda.device_tables("tables", "cpu", 2, "square")
    wrong = fused_cuda.device_tables(fused.tables_for(spec), "meta", spec.cf, spec.mask)
    with pytest.raises(dctdata.DctDataError, match=r"tables.columns: expected a contiguous float32 tensor on cpu"):
        fused_cuda.synthesize(q, wrong, 2, "square", (8, 8))


@pytest.mark.parametrize("cf, mask", [(2, "square"), (3, "triangle"), (5, "square"), (8, "triangle")])
def test_column_tables_hold_each_kept_coefficient_once_at_its_row_and_column(cf, mask):
    """DeviceTables.columns[c, v, j, u] is table j's entry of frequency (u, v), and 0 where the mask drops it:
    a, d - r and 2 r for a v2 codec (the kernel's form of the sign term), a and d for v1."""
    spec = v2_spec(cf, mask)
    kept = dctdata.codec.transform.kept_frequencies(cf, mask)
    dropped = torch.ones(cf, fused_cuda.padded_rows(cf), dtype=torch.bool)
    for u, v in kept:
        dropped[v, u] = False
    assert int(dropped.sum()) == cf * fused_cuda.padded_rows(cf) - len(kept)
    for make in (v2_spec, v1_spec):
        tables = fused.tables_for(make(cf, mask))
        want = (tables.a, tables.d) if make is v1_spec else (tables.a, tables.d - tables.r, 2 * tables.r)
        cols = fused_cuda.device_tables(tables, "cpu", cf, mask).columns
        assert cols.shape == (spec.channels, cf, len(want), fused_cuda.padded_rows(cf))
        for j, table in enumerate(want):
            for k, (u, v) in enumerate(kept):
                torch.testing.assert_close(cols[:, v, j, u], table[:, k].float(), rtol=0, atol=0)
        assert bool((cols.permute(0, 2, 1, 3)[:, :, dropped] == 0).all())


def test_half_sign_tables_give_the_dead_zone_reconstruction():
    """The kernel's sign term: with d' = d - r, r' = 2 r and s = clamp(q / 2 + 1/2, 0, 1), a q + d' + r' s is
    a q + d + r sign(q) for every integer q (the saturating form the kernel compiles to), to float32 rounding."""
    spec = v2_spec(5, "square")
    tables = fused.tables_for(spec)
    cols = fused_cuda.device_tables(tables, "cpu", 5, "square").columns
    a, d2, r2 = (cols[:, :, j, :].double() for j in range(3))
    index = fused_cuda.column_index(5, "square")  # [v, u] -> k
    a0, d0, r0 = (t.double()[:, index.clamp(min=0)] for t in (tables.a, tables.d, tables.r))
    kept = index >= 0
    for q in range(-3, 4):
        s = min(max(q * 0.5 + 0.5, 0.0), 1.0)
        sign = (q > 0) - (q < 0)
        got = (a * q + d2 + r2 * s)[:, kept]
        want = (a0 * q + d0 + r0 * sign)[:, kept]
        scale = float(want.abs().max()) + float(r0.abs().max())
        torch.testing.assert_close(got, want, atol=1e-6 * scale, rtol=0)


def test_device_table_errors_name_the_table_and_what_was_expected():
    spec = v2_spec(3)
    tables = fused.tables_for(spec)
    with pytest.raises(dctdata.DctDataError, match=r"tables: expected K = 6 for cf=3 mask='triangle'. Got 9"):
        fused_cuda.device_tables(tables, "cpu", 3, "triangle")
    good = fused_cuda.device_tables(tables, "cpu", 3, "square")
    with pytest.raises(dctdata.DctDataError, match=r"tables.columns: expected a \(C, CF, NT, UP\) float32 tensor"):
        dataclasses.replace(good, columns=good.columns[0])
    with pytest.raises(
        dctdata.DctDataError,
        match=r"tables.columns: expected a contiguous float32 tensor of shape "
        r"\(2, 3, 3, 4\) on cpu. Got torch.float32 \(2, 3, 3, 2\)",
    ):
        dataclasses.replace(good, columns=good.columns[..., :2].contiguous())
    with pytest.raises(
        dctdata.DctDataError, match=r"tables.columns: expected 2 \(a, d\) or 3 \(a, d - r, 2 r\) tables. Got 1"
    ):
        dataclasses.replace(good, columns=good.columns[:, :, :1].contiguous())
    with pytest.raises(dctdata.DctDataError, match=r"tables.m: expected a contiguous float32 tensor of shape \(2, 2\)"):
        dataclasses.replace(good, m=good.m.double())
    with pytest.raises(dctdata.DctDataError, match="tables: expected scale and shift both or neither"):
        dataclasses.replace(good, shift=None)


# --- on a CUDA device (run with `pytest -m cuda`) -------------------------------------------------------------


@pytest.fixture
def cuda_kernel_calls(monkeypatch):
    """Counts calls of the fused CUDA kernel; fails the test if it was switched off."""
    if fused_cuda.broken():
        pytest.fail(f"the fused CUDA kernel is switched off: {fused_cuda.broken()}")
    calls = []
    real = fused_cuda.synthesize
    monkeypatch.setattr(fused_cuda, "synthesize", lambda *a, **k: calls.append(1) or real(*a, **k))
    yield calls
    assert fused_cuda.broken() is None, fused_cuda.broken()


def to_cuda(wire):
    return tuple(t.cuda() for t in wire) if isinstance(wire, tuple) else wire.cuda()


@pytest.mark.cuda
@pytest.mark.parametrize("cf", [1, 3, 8])
@pytest.mark.parametrize("mask", ["square", "triangle"])
@pytest.mark.parametrize("codec", ["v1-int8", "v1-int16", "v1-float32", "v1-bfloat16", "v2-int8", "v2-rot-int16"])
def test_cuda_layer_takes_the_kernel_and_equals_the_reference(cf, mask, codec, cuda_kernel_calls):
    version, *_, wire_name = codec.split("-")
    if version == "v1":
        spec = v1_spec(cf, mask, channels=3, height=37, width=1100, wire=wire_name)  # 138 block columns: 3 strips
    else:
        spec = v2_spec(cf, mask, channels=2 if "rot" in codec else 1, height=37, width=1100, wire=wire_name)
    wire = wire_of(spec, b=5)
    out = check_decompress(spec, to_cuda(wire), atol=1e-5)
    assert cuda_kernel_calls and out.is_cuda
    cpu = Decompress(spec)(wire)
    torch.testing.assert_close(out.cpu(), cpu, atol=1e-5 * max(1.0, float(cpu.abs().max())), rtol=0)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cuda_half_outputs(dtype, cuda_kernel_calls):
    spec = v2_spec(4, channels=2, height=64, width=64, normalized=True)
    wire = wire_of(spec, b=4)
    out = Decompress(spec, dtype=dtype).to("cuda", dtype)(to_cuda(wire))
    ref = decode_reference(wire, spec).float()
    assert out.dtype == dtype and cuda_kernel_calls
    torch.testing.assert_close(out.float().cpu(), ref, atol=1e-2 * float(ref.abs().max()), rtol=1e-2)


@pytest.mark.cuda
def test_cuda_out_buffer_big_batch_and_launch_runs(cuda_kernel_calls, monkeypatch):
    spec = v2_spec(3, channels=2, height=256, width=256)
    wire = wire_of(spec, b=16)
    layer = Decompress(spec).cuda()
    buf = torch.empty(16, *spec.sample_shape, device="cuda")
    assert layer(to_cuda(wire), out=buf) is buf
    strips = -(-32 // fused_cuda.launch_config(32)[0])
    monkeypatch.setattr(fused_cuda, "MAX_PROGRAMS", 2 * (2 * 32 * strips))  # 2 x (channels x block rows x strips)
    again = layer(to_cuda(wire))
    torch.testing.assert_close(again, buf, atol=0, rtol=0)
    ref = decode_reference(wire, spec).float()
    torch.testing.assert_close(buf.cpu(), ref, atol=1e-5 * float(ref.abs().max()), rtol=0)


@pytest.mark.cuda
def test_cuda_compile_autograd_and_export_keep_the_portable_graph(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the fused CUDA kernel ran where the portable graph must")

    spec = v2_spec(3, channels=2, height=24, width=40)
    q, side = to_cuda(wire_of(spec))
    layer = Decompress(spec).cuda()
    eager = layer((q, side))
    monkeypatch.setattr(fused_cuda, "synthesize", refuse)
    compiled = torch.compile(layer)((q, side))
    torch.testing.assert_close(compiled, eager, atol=1e-5 * float(eager.abs().max()), rtol=0)
    f = v1_spec(3, channels=1, height=16, width=16, wire="float32")
    x = to_cuda(wire_of(f)).requires_grad_(True)
    Decompress(f).cuda()(x).sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
