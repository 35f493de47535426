r"""The GPU decoder of the entropy stage (dctdata.entropy.device, ctxrans_lanes.h): the NVRTC compile check, and
its lane emulator (the kernel's source built as C) bit for bit against the CPU decoder on real and fuzzed streams
of every stream mode; the same checks on a CUDA device where there is one (marked `cuda`).

    pytest -q tests/core/test_ctxrans_kernel.py                                   # no GPU: ~1 min on one core
    CTXLANES_FUZZ_EXAMPLES=20000 pytest -q tests/core/test_ctxrans_kernel.py -k fuzz  # longer fuzzing
    pytest -q -m cuda tests/core/test_ctxrans_kernel.py                           # on a GPU

The emulator must never read outside a sample's bytes or write outside its output: run the fuzz tests against
an ASan/UBSan build of it (each fuzzed stream is decoded alone, in a buffer of exactly its bytes; then reinstall
with `pip install -e .`):

    SO=$(python -c "import dctdata.entropy._ctxlanes as k; print(k.__file__)")
    gcc -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=undefined -std=c99 -shared -fPIC \
        -I$(python -c "import sysconfig; print(sysconfig.get_paths()['include'])") dctdata/entropy/_ctxlanes.c \
        dctdata/entropy/ctxrans_core.c -o $SO
    PYTHONMALLOC=malloc LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libubsan.so)" \
        ASAN_OPTIONS=detect_leaks=0 pytest -q -p no:cacheprovider tests/core/test_ctxrans_kernel.py -k "fuzz or hostile"

On a GPU, `benchmarks/gpu_ctxrans.py --quick` under `compute-sanitizer --tool memcheck` does the same for the
kernel (see its docstring).
"""

from __future__ import annotations

import os
import re

import numpy as np
import pytest
import torch
from ctx_streams import MUTATIONS, batch, encode_samples, mutate, real_sets, versioned
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dctdata.entropy import _ctxrans, device
from dctdata.entropy.ctxrans import SEGMENT, SEGMENT_RANGE, SEGMENT_V3, CtxCodec, CtxCodecError
from dctdata.errors import DctDataError, IntegrityError

FUZZ_EXAMPLES = int(os.environ.get("CTXLANES_FUZZ_EXAMPLES", "1500"))
HAVE_CUDA = torch.cuda.is_available()


def cpu_key(message: str) -> int:
    """The status a CPU error message corresponds to: its code, | (1 + segment) << 8 inside a segment."""
    return device.status_of(message)


def cpu_decode(codec: CtxCodec, buf: bytes, shape, dtype) -> np.ndarray | int:
    """The CPU decoder's array, or its error as a status key."""
    try:
        return codec.decode(buf, (1, *shape), dtype)[0]
    except CtxCodecError as exc:
        return cpu_key(str(exc))


def emulate(codec: CtxCodec, bufs: list[bytes], shape, dtype) -> tuple[np.ndarray, np.ndarray]:
    buffer, offsets = batch(bufs)
    out, status = device.decode_batch(codec, buffer, offsets, shape, dtype)
    return out.numpy(), status.numpy()


def check_same(codec: CtxCodec, bufs: list[bytes], shape, dtype, run=emulate) -> list[int]:
    """`run` (the emulator, or the kernel) decodes each stream to the CPU decoder's array, or fails with its
    error (and zeros); the statuses."""
    out, status = run(codec, bufs, shape, dtype)
    assert out.shape == (len(bufs), *shape) and status.shape == (len(bufs),)
    for i, buf in enumerate(bufs):
        want = cpu_decode(codec, buf, shape, dtype)
        if isinstance(want, int):
            assert status[i] == want, (i, device.describe(int(status[i])), device.describe(want))
            assert not out[i].any()
        else:
            assert status[i] == 0, (i, device.describe(int(status[i])))
            np.testing.assert_array_equal(out[i], want)
    return status.tolist()


@pytest.fixture(scope="module")
def sets():
    return real_sets()


# -------------------------------------------------------------------------------------------- NVRTC
def test_the_kernel_compiles_with_nvrtc():
    """The CUDA source compiles to PTX on a machine without a GPU: both entry points, with the warp-synchronous
    instructions it is written with (ballots, shuffles, warp barriers with explicit masks)."""
    pytest.importorskip("cuda.bindings.nvrtc", reason="cuda-python (cuda-bindings) is not installed")
    ptx = device.compile_kernel("compute_90").decode()
    for entry in ("ctxrans_decode_i8", "ctxrans_decode_i16"):
        assert f".entry {entry}(" in ptx
    for instruction in ("vote.sync.ballot.b32", "shfl.sync.idx.b32", "bar.warp.sync", "popc.b32", "atom.global.min"):
        assert instruction in ptx, instruction


def test_nvrtc_errors_carry_its_log(monkeypatch):
    pytest.importorskip("cuda.bindings.nvrtc", reason="cuda-python (cuda-bindings) is not installed")
    monkeypatch.setattr(device, "kernel_source", lambda: "__global__ void broken( {")
    with pytest.raises(DctDataError, match=r"NVRTC could not compile ctxrans_lanes.h for compute_90: .*error"):
        device.compile_kernel("compute_90")


# -------------------------------------------------------------------------------------------- real streams
@pytest.mark.parametrize(
    "version, segment", [(1, None), (2, None), (3, SEGMENT_V3), (3, SEGMENT), (3, 4096), (3, 2048), (3, 1024)]
)
def test_emulator_decodes_real_streams_as_the_cpu_does(sets, version, segment):
    """Photos and fields packed in each stream mode: mode 0 (version 1), 2, and 3 (segments of each length the
    benchmarks sweep; with the first version 3 packs' 16384 the 256x256 CF 4 set of 16384 coefficients stays
    mode 2; at 1024 the 256x256 CF 8 samples are a segment a block row), every sample one stream of a batch."""
    modes, units = set(), set()
    for _, codec, q in sets:
        c = versioned(codec, version, segment)
        bufs = encode_samples(c, q)
        modes |= {b[0] for b in bufs}
        units.add(device.units_per_sample(c, q.shape[1:]))
        assert check_same(c, bufs, q.shape[1:], q.dtype) == [0] * len(q)
    assert modes == ({1: {0}, 2: {2}}[version] if version < 3 else {2, 3} if segment == SEGMENT_V3 else {3})
    assert max(units) == {1: 1, 2: 1}.get(version, min(32, 65536 // (segment or 1)))


def test_raw_streams_and_raw_segments():
    """Mode 1 (noise does not compress: the raw copy), and mode 3 with raw segments beside coded ones."""
    rng = np.random.default_rng(7)
    q = rng.integers(-30000, 30000, (2, 1, 8, 16, 256), dtype=np.int16)
    q[1, :, :4] = 0  # its first segments compress, its last ones do not
    codec = CtxCodec.fit(q, 4, "square", _first_only=True)[0]
    noise, half = codec.encode(q[:1]), codec.encode(q[1:])
    assert noise[0] == 1 and half[0] == 3
    assert check_same(codec, [noise, half], q.shape[1:], q.dtype) == [0, 0]


@pytest.mark.parametrize("nseg", [1, 2, 3, 5, 8])
def test_every_segment_count_and_units_per_sample(sets, nseg):
    """Segments that do not divide the rows evenly, fewer or more segments than units: a unit takes segments
    u, u + units, ... (the codec's own count sets the units; these streams use other counts)."""
    _name, codec, q = sets[3]  # RGB, sign flips
    assert q.shape[1] == 3 and codec.layout.flags & 8
    bufs = [_ctxrans.encode(codec._blob, q[i : i + 1], (1, *q.shape[1:]), 2, 3, nseg) for i in range(len(q))]
    assert check_same(codec, bufs, q.shape[1:], q.dtype) == [0] * len(q)


def test_a_batch_mixes_modes_and_empty_streams(sets):
    _, codec, q = sets[0]
    bufs = [versioned(codec, v).encode(q[i : i + 1]) for i, v in enumerate((1, 2, 3))] + [b""]
    assert check_same(codec, bufs, q.shape[1:], q.dtype) == [0, 0, 0, 1]


# -------------------------------------------------------------------------------------------- hostile streams
def _fuzz_corpus():
    """Small streams of every mode and layout: fast to decode many times."""
    rng = np.random.default_rng(11)
    items = []
    for shape, dtype, features in [
        ((1, 1, 6, 16, 20), np.int8, None),  # mode 0 / 2 / 3
        ((1, 3, 4, 9, 17), np.int16, None),  # channels, sign flips
        ((1, 2, 4, 9, 18), np.int8, ("lt", "wide", "ch", "sign")),  # serial AC planes
        ((1, 1, 3, 4, 260), np.int16, None),  # rows split into runs of 256
    ]:
        b, c, hb, k, wb = shape
        q = np.clip(np.rint(rng.laplace(0, 3, shape) / (1 + np.arange(k))[None, None, None, :, None]), -100, 100)
        q[:, :, :, 0] = np.cumsum(rng.integers(-5, 6, (b, c, hb, wb)), -1)
        if c > 1:
            q[:, 1:] = q[:, :1] // 2
        q = q.astype(dtype)
        kw = {"features": features} if features else {}
        codec = CtxCodec.fit(q, round(k**0.5), "square", _first_only=True, **kw)[0]
        for mode, nseg in ((0, 0), (2, 0), (3, min(3, hb))):
            items.append((codec, q, _ctxrans.encode(codec._blob, q, q.shape, q.itemsize, mode, nseg)))
        shortest = codec.with_streams(segment=SEGMENT_RANGE[0])  # the shortest segments a config may name
        if shortest.stream_mode(q.shape)[0] == 3:
            items.append((shortest, q, shortest.encode(q)))
    assert {buf[0] for _, _, buf in items} == {0, 2, 3} and len(items) == 13
    return items


CORPUS = _fuzz_corpus()


def _one(codec, q, buf):
    status = check_same(codec, [buf], q.shape[1:], q.dtype)
    return status[0]


def test_every_truncation_fails_as_the_cpu_does():
    for codec, q, buf in CORPUS:
        statuses = {_one(codec, q, buf[:n]) for n in range(len(buf))}
        assert 0 not in statuses
        assert _one(codec, q, buf + b"\x00") != 0


@pytest.mark.slow
@settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(which=st.integers(0, len(CORPUS) - 1), **MUTATIONS)
def test_fuzz_mutated_streams(which, edits, cut, insert):
    codec, q, buf = CORPUS[which]
    b = mutate(buf, edits, cut, insert)
    status = _one(codec, q, b)
    _out, cpu_status = device.decode_batch(codec, *batch([b]), q.shape[1:], q.dtype, cpu_decoder=True)
    assert cpu_status.tolist() == [status]  # the CPU stand-in agrees


@settings(max_examples=max(200, FUZZ_EXAMPLES // 5), deadline=None, suppress_health_check=list(HealthCheck))
@given(
    which=st.integers(0, len(CORPUS) - 1),
    data=st.binary(min_size=0, max_size=300),
    mode=st.sampled_from([b"", b"\x00", b"\x01", b"\x02", b"\x03", b"\x03\x02", b"\x03\x03"]),
)
def test_fuzz_random_bytes(which, data, mode):
    codec, q, _ = CORPUS[which]
    _one(codec, q, mode + data)


@settings(max_examples=max(100, FUZZ_EXAMPLES // 10), deadline=None, suppress_health_check=list(HealthCheck))
@given(
    cuts=st.lists(st.integers(-5, 10**4), min_size=2, max_size=6),
    data=st.binary(min_size=0, max_size=2000),
)
def test_fuzz_hostile_offsets(cuts, data):
    """Offsets out of order, negative or past the buffer: those samples fail with status 16 (the others decode
    what their bytes hold), nothing is read outside the buffer."""
    codec, q, _ = CORPUS[0]
    buffer = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.zeros(0, dtype=torch.uint8)
    offsets = torch.tensor(cuts, dtype=torch.int64)
    out, status = device.decode_batch(codec, buffer, offsets, q.shape[1:], np.int8)
    for i in range(len(cuts) - 1):
        a, b = cuts[i], cuts[i + 1]
        if a < 0 or b < a or b > len(data):
            assert status[i] == 16 and not out[i].any()
        else:
            want = cpu_decode(codec, data[a:b], q.shape[1:], np.int8)
            assert status[i] == (want if isinstance(want, int) else 0)


def test_hostile_declared_shapes_and_statuses():
    """A stream decoded as a far larger sample fails at once (the declared size bound) or where it runs out;
    raise_for_status names the first bad sample and counts the others."""
    codec, q, buf = CORPUS[2]  # mode 3
    big = (q.shape[1], 4096, q.shape[3], 4096)
    _out, status = device.decode_batch(codec, *batch([buf]), big, q.dtype)
    assert status.tolist() == [2] and device.describe(2).startswith("ctxrans: the stream cannot hold")
    wider = (q.shape[1], q.shape[2] * 40, q.shape[3], q.shape[4])
    st_ = check_same(codec, [buf, buf], wider, q.dtype)
    assert st_[0] == st_[1] != 0
    with pytest.raises(IntegrityError, match=r"^sample 0: expected a dctdata_ctxrans stream\. Got ctxrans: .*"
                                             r"\(1 more samples of the batch failed\)"):  # fmt: skip
        device.raise_for_status(torch.tensor(st_, dtype=torch.int32))
    with pytest.raises(IntegrityError, match=r"^image 7: expected a dctdata_ctxrans stream\. Got ctxrans: segment 1: "):
        device.raise_for_status(torch.tensor([0, (2 << 8) | 8], dtype=torch.int32), where=lambda i: f"image {i + 6}")
    device.raise_for_status(torch.zeros(3, dtype=torch.int32))  # nothing to raise


# -------------------------------------------------------------------------------------------- the API
def test_decode_batch_refuses_bad_arguments():
    codec, q, buf = CORPUS[0]
    buffer, offsets = batch([buf])
    shape = q.shape[1:]
    with pytest.raises(TypeError, match=r"codec: expected a CtxCodec\. Got dict"):
        device.decode_batch({}, buffer, offsets, shape, np.int8)
    with pytest.raises(TypeError, match=r"buffer, offsets: expected torch tensors\. Got bytes, Tensor"):
        device.decode_batch(codec, buf, offsets, shape, np.int8)
    with pytest.raises(CtxCodecError, match=r"buffer: expected a 1-D uint8 tensor\. Got torch.int8 of shape"):
        device.decode_batch(codec, buffer.view(torch.int8), offsets, shape, np.int8)
    with pytest.raises(CtxCodecError, match=r"offsets: expected a 1-D int64 tensor of N \+ 1 byte offsets"):
        device.decode_batch(codec, buffer, offsets.int(), shape, np.int8)
    with pytest.raises(CtxCodecError, match=r"offsets: expected a 1-D int64 tensor of N \+ 1 byte offsets"):
        device.decode_batch(codec, buffer, offsets[:0], shape, np.int8)
    with pytest.raises(CtxCodecError, match=r"sample_shape: expected \(C, Hb, K, Wb\) with K=16 and C <= 1\. Got"):
        device.decode_batch(codec, buffer, offsets, (1, 6, 9, 20), np.int8)
    with pytest.raises(TypeError, match=r"sample_shape: expected 4 ints \(C, Hb, K, Wb\)\. Got 5"):
        device.decode_batch(codec, buffer, offsets, 5, np.int8)
    for bad in (np.float32, "uint8", torch.int32, "nope"):
        with pytest.raises(CtxCodecError, match=r"dtype: expected int8 or int16\. Got"):
            device.decode_batch(codec, buffer, offsets, shape, bad)
    out, status = device.decode_batch(codec, buffer, offsets[:1], shape, torch.int8)  # no samples
    assert out.shape == (0, *shape) and status.shape == (0,)
    for dt in (np.int8, "int8", torch.int8, np.dtype("int8")):
        out, status = device.decode_batch(codec, buffer, offsets, shape, dt)
        assert out.dtype == torch.int8 and status.tolist() == [0]


def test_plan_launch_fits_shared_memory():
    """H100/H200-like limits: one unit a block; the model in shared memory while one copy a block still keeps the
    batch's units resident at once, else read through the caches; rows too wide go to global scratch."""
    h = {"sms": 132, "smem_block": 232448, "smem_sm": 233472, "regs": 208}
    small = device.plan_launch(128, 76 << 10, 64, 32, **h)
    assert small.units_per_block == 1 and small.smem_tables and small.smem_rows and small.blocks == 128
    assert small.smem_bytes == (76 << 10) + 4 * 64 * 32 + 128
    two_a_sm = device.plan_launch(264, 76 << 10, 64, 32, **h)  # two 76 KB copies fit an SM: all resident
    assert two_a_sm.smem_tables and two_a_sm.blocks == 264
    big = device.plan_launch(1024, 76 << 10, 64, 32, **h)  # more units than copies of the model fit: caches
    assert big.units_per_block == 1 and not big.smem_tables and big.smem_rows and big.blocks == 1024
    huge_model = device.plan_launch(64, 240 << 10, 64, 32, **h)
    assert not huge_model.smem_tables and huge_model.smem_rows
    wide = device.plan_launch(64, 76 << 10, 64, 1024, **h)
    assert not wide.smem_rows and wide.smem_tables
    for p in (small, two_a_sm, big, huge_model, wide):
        assert p.smem_bytes <= h["smem_block"] and p.threads == 16 * p.units_per_block == 16


def test_status_words_match_the_kernel_source():
    """The status table here and the CL_ST_* codes of ctxrans_lanes.h are the same list."""
    src = device.kernel_source()
    codes = dict((int(v), n) for n, v in re.findall(r"CL_ST_(\w+) = (\d+),?\s*/\*", src))
    assert sorted(codes) == sorted(device.STATUS) == list(range(1, 17))
    assert (
        device.status_of("ctxrans: segment 2 of 4: truncated stream (its raw bits ran out by coefficient 5 of 9)")
        == (3 << 8) | 9
    )
    with pytest.raises(ValueError, match="not a ctxrans stream error"):
        device.status_of("ctxrans: out of memory")


# -------------------------------------------------------------------------------------------- CUDA
def _on_cuda(codec, bufs, shape, dtype):
    buffer, offsets = batch(bufs)
    out, status = device.decode_batch(codec, buffer.cuda(), offsets.cuda(), shape, dtype)
    torch.cuda.synchronize()
    assert out.device.type == "cuda" and status.device.type == "cuda"
    return out.cpu().numpy(), status.cpu().numpy()


@pytest.mark.cuda
@pytest.mark.parametrize(
    "version, segment", [(1, None), (2, None), (3, SEGMENT_V3), (3, SEGMENT), (3, 4096), (3, 1024)]
)
def test_kernel_decodes_real_streams_as_the_cpu_does(sets, version, segment):
    for _, codec, q in sets:
        c = versioned(codec, version, segment)
        assert check_same(c, encode_samples(c, q), q.shape[1:], q.dtype, run=_on_cuda) == [0] * len(q)


@pytest.mark.cuda
def test_kernel_agrees_with_the_emulator_on_hostile_streams():
    """Truncations and mutations of every corpus stream, in one batch per stream kind: the kernel's statuses and
    arrays are the emulator's (and so the CPU decoder's)."""
    rng = np.random.default_rng(3)
    for codec, q, buf in CORPUS:
        bufs = [buf[:n] for n in range(0, len(buf), max(1, len(buf) // 40))]
        for _ in range(60):
            b = bytearray(buf)
            for _ in range(int(rng.integers(1, 4))):
                b[int(rng.integers(len(b)))] = int(rng.integers(256))
            bufs.append(bytes(b))
        ref_out, ref_status = emulate(codec, bufs, q.shape[1:], q.dtype)
        out, status = _on_cuda(codec, bufs, q.shape[1:], q.dtype)
        np.testing.assert_array_equal(status, ref_status)
        np.testing.assert_array_equal(out, ref_out)
        assert (status != 0).sum() >= 40


@pytest.mark.cuda
@pytest.mark.parametrize("upb", [1, 2, 8])
@pytest.mark.parametrize("smem_tables, smem_rows", [(True, True), (True, False), (False, True), (False, False)])
def test_kernel_in_every_launch_layout(sets, monkeypatch, upb, smem_tables, smem_rows):
    """The model and the row buffers in shared memory or read from global memory, 1 to 8 units a block (two units
    in a warp): the same arrays (RGB with sign flips, and the left-block contexts' serial planes)."""
    monkeypatch.setattr(
        device,
        "plan_launch",
        lambda units, blob, K, Wb, *a: device.make_plan(units, blob, K, Wb, upb, smem_tables, smem_rows),
    )
    for _, codec, q in sets[3:]:
        assert check_same(codec, encode_samples(codec, q), q.shape[1:], q.dtype, run=_on_cuda) == [0] * len(q)


@pytest.mark.cuda
def test_kernel_on_a_non_default_stream(sets):
    _, codec, q = sets[0]
    bufs = encode_samples(codec, q)
    buffer, offsets = batch(bufs)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        out, status = device.decode_batch(codec, buffer.cuda(), offsets.cuda(), q.shape[1:], q.dtype)
    s.synchronize()
    assert status.cpu().tolist() == [0] * len(q)
    np.testing.assert_array_equal(out.cpu().numpy(), q)
