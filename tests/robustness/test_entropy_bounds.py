"""The entropy decoder's work and memory are bounded by the stream, not by the shape it is told to expect
(issue 30 item 6): a declared shape is refused before its array is allocated when the stream cannot hold it
(`ctxrans.max_coefficients`, derived in ctxrans_core.c), and a stream that runs out stops where it ran out
instead of walking the rest of the declared shape. Each test asserts what the decoder did (the error, where it
stopped, what it allocated), not how long it took."""

from __future__ import annotations

import re
import tracemalloc

import numpy as np
import pytest
from ctx_streams import leb128, read_leb128

from dctdata.entropy import _ctxrans
from dctdata.entropy.ctxrans import (
    DEFAULT_EDGES_DC,
    DEFAULT_EDGES_IN,
    DEFAULT_EDGES_LT,
    CtxCodec,
    CtxCodecError,
    max_coefficients,
)
from dctdata.errors import IntegrityError
from dctdata.stages import get_stage


@pytest.fixture(scope="module")
def small():
    """The issue's case: a codec and an 811-byte-class stream of 2 x 4 x 64 x 4 int8 coefficients. The layout
    is fixed (fit's starting one), so the stream, and which of its sections runs out first under a larger
    declared shape, does not move with fit's choices."""
    q = np.random.default_rng(0).integers(-3, 4, (2, 1, 4, 64, 4)).astype(np.int8)
    layout = dict(
        freq_classes="uv", lt_mode="top", wide=False, channel_groups=[0], edges_in=DEFAULT_EDGES_IN,
        edges_lt=DEFAULT_EDGES_LT, edges_ch=(), edges_dc=DEFAULT_EDGES_DC,
    )  # fmt: skip
    codec = CtxCodec.fit(q, 8, "square", layouts=[layout])
    return codec, q, codec.encode(q)


def test_a_shape_the_stream_cannot_hold_is_refused_before_allocating(small):
    codec, _, buf = small
    gib = (1, 1, 1 << 12, 64, 1 << 12)  # 1 Gi coefficients
    tracemalloc.start()
    try:
        with pytest.raises(
            CtxCodecError,
            match=rf"ctxrans: a stream of {len(buf)} bytes cannot hold 1073741824 coefficients "
            rf"\(at most {max_coefficients(len(buf))}\)",
        ):
            codec.decode(buf, gib, np.int8)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20  # the 1 GiB output array was never allocated


def test_the_refusal_names_the_sample_through_the_lossless_stage(small):
    codec, _, buf = small
    with pytest.raises(IntegrityError, match=r"sample 7 of field 'image': .*cannot hold 1073741824 coefficients"):
        get_stage(codec.get_config()).decode(buf, (1, 1, 1 << 12, 64, 1 << 12), np.int8, "sample 7 of field 'image'")


def test_the_kernel_refuses_it_too(small):
    """The C decoder checks the bound itself (for a caller that brings its own output buffer), before reading
    the stream's header."""
    codec, _, buf = small
    shape = (1, 1, 10, 64, 1000)
    n = int(np.prod(shape))
    assert n > max_coefficients(4)
    out = np.full(n, 7, np.int8)
    with pytest.raises(ValueError, match=rf"^ctxrans: a stream of 4 bytes cannot hold {n} coefficients \(at most"):
        _ctxrans.decode(codec._blob, buf[:4], out, shape, 1)
    assert (out == 7).all()  # nothing written


def test_a_stream_that_runs_out_stops_where_it_ran_out(small):
    """Declared shapes the stream could hold in principle but does not: the decoder stops at the first block row
    or run after its words or bits end, and says where, instead of decoding the whole declared array."""
    codec, q, buf = small
    for shape, what in (((1, 1, 3000, 64, 64), "raw bits"), ((1, 1, 8, 64, 300), "rANS words")):
        total = int(np.prod(shape))
        assert total <= max_coefficients(len(buf))
        with pytest.raises(CtxCodecError, match=rf"ctxrans: truncated stream \(its {what} ran out by coefficient"):
            codec.decode(buf, shape, np.int8)
        try:
            codec.decode(buf, shape, np.int8)
        except CtxCodecError as exc:
            at, of = map(int, re.search(r"by coefficient (\d+) of (\d+)", str(exc)).groups())
        assert of == total
        assert at <= q.size + 2 * 64 * 300  # within a block row of what the stream holds
        assert at < total // 50


def _sections(buf: bytes) -> tuple[bytes, bytes, bytes]:
    """A mode 0/2 stream as (mode byte + states, rANS words, raw bits)."""
    head = 1 + (16 if buf[0] == 0 else 64)
    nr, p = read_leb128(buf, head)
    return buf[:head], buf[p : p + nr], buf[p + nr :]


def test_streams_whose_sections_end_early_stop_early_in_both_layouts():
    """Streams of a large array with their words or their bits cut to a third (the header made consistent):
    each error says where the decoder stopped, well before the end of the array."""
    rng = np.random.default_rng(3)
    q = np.clip(np.rint(rng.laplace(0, 2, (1, 1, 64, 16, 64))), -127, 127).astype(np.int8)
    codec = CtxCodec.fit(q, 4, "square")
    for mode in (0, 2):
        buf = _ctxrans.encode(codec._blob, q, q.shape, 1, mode)
        assert buf[0] == mode
        head, words, bits = _sections(buf)
        short_words = words[: len(words) // 3 // 4 * 4]
        for cut, what in (
            (head + leb128(len(words)) + words + bits[: len(bits) // 3], "raw bits"),
            (head + leb128(len(short_words)) + short_words + bits, "rANS words|raw bits"),
        ):
            with pytest.raises(CtxCodecError, match=rf"truncated stream \(its ({what}) ran out by coefficient") as info:
                codec.decode(cut, q.shape, q.dtype)
            at, of = map(int, re.search(r"by coefficient (\d+) of (\d+)", str(info.value)).groups())
            assert of == q.size and at < q.size * 0.6


def test_decode_many_stops_at_a_stream_that_cannot_hold_its_shape(small):
    codec, q, buf = small
    out = np.zeros((2, *q.shape), np.int8)
    assert codec.decode_many([buf, buf], out) == 2
    np.testing.assert_array_equal(out[1], q)
    assert codec.decode_many([buf, buf[:4]], out) == 1  # the second is refused (4 bytes cannot hold 2,048)


@pytest.mark.parametrize("dtype", [np.int8, np.int16])
@pytest.mark.parametrize("shape", [(1, 1, 32, 64, 32), (1, 3, 64, 64, 64), (2, 1, 256, 64, 256)])
def test_the_most_compressible_arrays_stay_inside_the_bound(dtype, shape):
    """All-zero arrays, fitted on themselves (every token at the largest frequency a table allows), are the
    densest streams the coder writes: they must decode, and their coefficients per byte sit well below the
    bound's 2^14 (about 6,500 at the largest size here)."""
    z = np.zeros(shape, dtype)
    codec = CtxCodec.fit(z, 8, "square")
    buf = codec.encode(z)
    assert z.size <= max_coefficients(len(buf))
    assert z.size / len(buf) < 0.5 * (1 << 14)
    np.testing.assert_array_equal(codec.decode(buf, z.shape, z.dtype), z)


def test_the_bound_is_linear_in_the_stream_length():
    assert max_coefficients(0) == 1 << 19
    assert max_coefficients(811) == (1 << 19) + 811 * (1 << 14)
    assert max_coefficients(-5) == 1 << 19
