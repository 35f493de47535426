r"""The entropy stage (dctdata.entropy.ctxrans): round trips, config round trips, and untrusted-input
behaviour (fuzzing).

    pytest -q tests/core/test_entropy.py                              # ~20 s on one core
    CTXCODER_FUZZ_EXAMPLES=200000 pytest -q tests/core/test_entropy.py -k fuzz     # longer fuzzing

The decoder's contract on bytes it did not write: raise CtxCodecError (a ValueError) or return an
array of exactly the declared shape and dtype; never crash, hang, or read/write out of bounds. To check
the last point, run the fuzz tests against an ASan/UBSan build of the kernel in place of the installed
one (then reinstall: `pip install -e .`):

    SO=$(python -c "import dctdata.entropy._ctxrans as k; print(k.__file__)")
    gcc -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=undefined -std=c99 -shared -fPIC \
        -I$(python -c "import sysconfig; print(sysconfig.get_paths()['include'])") dctdata/entropy/_ctxrans.c \
        dctdata/entropy/ctxrans_core.c -o $SO
    LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libubsan.so)" \
        ASAN_OPTIONS=detect_leaks=0 pytest -q -p no:cacheprovider tests/core/test_entropy.py
"""

from __future__ import annotations

import base64
import contextlib
import functools
import json
import math
import os
import time
import zlib

import numpy as np
import pytest
from ctx_streams import MUTATIONS, leb128, mutate, read_leb128
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dctdata.codec.transform import kept_frequencies
from dctdata.entropy import _ctxrans
from dctdata.entropy.ctxrans import SEGMENT, SEGMENT_BYTES, SEGMENT_V3, CtxCodec, CtxCodecError, decoder_settings

FUZZ_EXAMPLES = int(os.environ.get("CTXCODER_FUZZ_EXAMPLES", "3000"))
RNG = np.random.default_rng(1234)
# The kernel's decoders of mode 2 on this machine (decoder_settings): the vector decoder with each kind of
# table lookup, then the scalar one
DECODERS = ((True, True), (True, False), (False, None))


def laplace_coeffs(shape, dtype=np.int8, scale=3.0, dc_scale=40.0, rng=RNG):
    """Synthetic quantized coefficients: Laplacian AC shrinking with frequency, smooth-ish DC."""
    b, c, hb, k, wb = shape
    decay = scale / (1.0 + np.arange(k))[None, None, None, :, None]
    q = rng.laplace(0, 1, shape) * decay
    dc = np.cumsum(rng.laplace(0, dc_scale / 8, (b, c, hb, wb)), axis=-1)
    q[:, :, :, 0, :] = dc
    info = np.iinfo(dtype)
    return np.clip(np.rint(q), info.min, info.max).astype(dtype)


def fitted(shape, dtype=np.int8, cf=None, mask="square", **kw):
    k = shape[3]
    if cf is None:
        cf = round(k**0.5)
    q = laplace_coeffs(shape, dtype, **kw)
    return CtxCodec.fit(q, cf, mask), q


def fitted_case(shape, dtype, features, rng, scale=3.0):
    """A codec fitted (with `features`: only their first layout) on laplace_coeffs whose later channels are
    half the first (so that sign flips pay), and the array."""
    q = laplace_coeffs(shape, dtype, scale=scale, rng=rng)
    if shape[1] > 1:
        q[:, 1:] = np.clip(q[:, :1].astype(np.int32) // 2, np.iinfo(dtype).min, np.iinfo(dtype).max)
    cf = round(shape[3] ** 0.5)
    if features is None:
        return CtxCodec.fit(q, cf, "square"), q
    return CtxCodec.fit(q, cf, "square", features=features, _first_only=True)[0], q


def lanes_encode(codec, q):
    """q in the 16-lane layout (mode 2), whatever its size: the codec picks it for large arrays only."""
    q = np.ascontiguousarray(q)
    return _ctxrans.encode(codec._blob, q, q.shape, q.itemsize, 2)


def segments_encode(codec, q, nseg=None):
    """q as segments of block rows (mode 3; by default as many as it has rows, at most 3), whatever its size."""
    q = np.ascontiguousarray(q)
    return _ctxrans.encode(codec._blob, q, q.shape, q.itemsize, 3, nseg or min(3, q.shape[2]))


def roundtrip(codec, q):
    buf = codec.encode(q)
    assert isinstance(buf, bytes)
    out = codec.decode(buf, q.shape, q.dtype)
    assert out.dtype == q.dtype and out.shape == q.shape
    np.testing.assert_array_equal(out, q)
    return buf


# ------------------------------------------------------------------------------------------ round trips
@pytest.mark.parametrize("dtype", [np.int8, np.int16])
@pytest.mark.parametrize(
    "cf,mask",
    [(1, "square"), (2, "square"), (3, "triangle"), (4, "square"), (5, "triangle"), (8, "square"), (8, "triangle")],
)
@pytest.mark.parametrize(
    "b,c,hb,wb", [(1, 1, 1, 1), (1, 1, 1, 5), (1, 1, 4, 1), (2, 1, 8, 10), (1, 3, 3, 4), (3, 2, 2, 2)]
)
def test_roundtrip_shapes(dtype, cf, mask, b, c, hb, wb):
    k = len(kept_frequencies(cf, mask))
    q = laplace_coeffs((b, c, hb, k, wb), dtype)
    codec = CtxCodec.fit(q, cf, mask)
    roundtrip(codec, q)
    roundtrip(codec, q[:1])  # B = 1
    # a model fitted on other data still round-trips (only the size suffers)
    roundtrip(codec, laplace_coeffs((b, c, hb, k, wb), dtype, scale=30.0, dc_scale=500.0))


@pytest.mark.parametrize("dtype", [np.int8, np.int16])
def test_all_zero_and_constant(dtype):
    codec, _ = fitted((8, 1, 4, 16, 4), dtype)  # 8 samples: with 2, the all-zero context may be barely fitted
    z = np.zeros((1, 1, 4, 16, 4), dtype)
    buf = roundtrip(codec, z)
    assert len(buf) <= 48  # 256 zeros cost the stream's fixed bytes and a few more
    roundtrip(codec, np.full((1, 1, 4, 16, 4), 7, dtype))
    # an all-zero calibration set gives a valid model too
    codec0 = CtxCodec.fit(np.zeros((3, 1, 2, 16, 2), dtype), 4, "square")
    roundtrip(codec0, laplace_coeffs((1, 1, 2, 16, 2), dtype))


def test_int16_extremes():
    codec, _ = fitted((2, 2, 4, 16, 4), np.int16)
    info = np.iinfo(np.int16)
    for fill in (info.min, info.max):
        roundtrip(codec, np.full((1, 2, 4, 16, 4), fill, np.int16))
    q = RNG.choice(np.array([info.min, info.max, 0, -1, 1], np.int16), (2, 2, 5, 16, 7))
    roundtrip(codec, q)  # DC residuals up to 65535 and alternating signs
    q = RNG.integers(info.min, info.max + 1, (1, 2, 3, 16, 3), dtype=np.int16)
    buf = roundtrip(codec, q)
    assert buf[0] == 1 and len(buf) == q.nbytes + 1  # incompressible -> raw mode, never larger


def test_int8_extremes_and_random():
    codec, _ = fitted((2, 3, 4, 9, 4), np.int8)
    info = np.iinfo(np.int8)
    q = RNG.choice(np.array([info.min, info.max, 0], np.int8), (1, 3, 4, 9, 4))
    roundtrip(codec, q)
    roundtrip(codec, RNG.integers(-128, 128, (2, 3, 4, 9, 4), dtype=np.int8))


def test_fewer_channels_than_model():
    codec, q = fitted((2, 3, 4, 16, 4), np.int8)
    roundtrip(codec, np.ascontiguousarray(q[:, :1]))


def test_decode_into_out_and_module_fit():
    from dctdata.entropy import ctxrans as ctxcoder

    q = laplace_coeffs((4, 2, 3, 9, 5), np.int16)
    cfg = ctxcoder.fit(q, 3, "square")
    codec = CtxCodec.from_config(json.loads(json.dumps(cfg)))
    batch = np.zeros((4, 2, 3, 9, 5), np.int16)
    for i in range(4):  # decode each sample's stream straight into a slice of a batch buffer
        r = codec.decode(codec.encode(q[i : i + 1]), out=batch[i : i + 1])
        assert r.base is batch or r is batch[i : i + 1] or np.shares_memory(r, batch)
    np.testing.assert_array_equal(batch, q)
    with pytest.raises(CtxCodecError):
        codec.decode(codec.encode(q[:1]), out=batch[:, :1])  # not contiguous
    check_decode(codec, codec.encode(q[:1]), (1, 2, 3, 9, 5), np.int8)  # other dtype: error or garbage of that shape
    ro = np.zeros((1, 2, 3, 9, 5), np.int16)
    ro.flags.writeable = False
    with pytest.raises(CtxCodecError):
        codec.decode(codec.encode(q[:1]), out=ro)


def test_non_contiguous_input():
    codec, q = fitted((4, 1, 4, 16, 6), np.int8)
    view = q[::2]
    assert True
    roundtrip(codec, view)


def test_multichannel_sign_flip_used_and_saves():
    rng = np.random.default_rng(7)
    base = laplace_coeffs((4, 1, 8, 16, 8), np.int16, rng=rng).astype(np.int32)
    q = np.concatenate([base, base // 2, -base // 3], axis=1).astype(np.int16)  # correlated signs
    codec = CtxCodec.fit(q, 4, "square")
    assert codec.layout.sign_flip, "expected the cross-channel sign model to be chosen"
    roundtrip(codec, q)
    plain = CtxCodec.fit(q, 4, "square", layouts=[{**_layout_of(codec), "sign_flip": ()}])
    assert len(codec.encode(q)) < len(plain.encode(q))


def _layout_of(codec):
    cfg = codec.get_config()
    return {
        k: cfg[k]
        for k in ("freq_classes", "lt_mode", "wide", "channel_groups", "edges_in", "edges_lt", "edges_ch", "edges_dc")
    }


@pytest.mark.parametrize("features", [(), ("top",), ("ch", "sign"), ("top", "wide", "ch", "sign"), ("lt", "wide")])
def test_fit_options_roundtrip(features):
    q = laplace_coeffs((3, 2, 6, 16, 6), np.int8)
    codec = CtxCodec.fit(q, 4, "square", features=features)
    cfg = codec.get_config()
    assert cfg["wide"] <= ("wide" in features) and (not cfg["sign_flip"] or "sign" in features)
    assert (not cfg["edges_ch"] or "ch" in features) and (not cfg["edges_lt"] or set(features) & {"top", "lt"})
    roundtrip(codec, q)
    for lt_mode in ("lt", "top"):
        for wide in (False, True):
            lay = {**_layout_of(codec), "lt_mode": lt_mode, "wide": wide}
            c2 = CtxCodec.fit(q, 4, "square", layouts=[lay])
            roundtrip(c2, q)


def test_fit_keeps_high_frequencies_apart_at_high_rates():
    """Coefficients of a tight bound: the first AC frequency in the hundreds, the last ones near 10. The default
    edges, scaled to the first, put every later frequency's s_in in one bucket; fit takes the octave edges
    instead, and they store fewer bytes than the default edges on the same data."""
    from dctdata.entropy.ctxrans import DEFAULT_EDGES_IN, OCTAVE_EDGES_IN, edge_scale, scaled_edges

    rng = np.random.default_rng(11)
    b, hb, k, wb = 4, 8, 64, 16
    spread = 600.0 * (1.0 + np.arange(k)) ** -1.3  # 600 at k = 0, about 3 at k = 63
    level = np.exp(rng.normal(0, 0.7, (b, 1, hb, 1, wb)))  # local activity the contexts can see
    q = np.rint(rng.laplace(0, 1, (b, 1, hb, k, wb)) * spread[None, None, None, :, None] * level).astype(np.int16)
    codec = CtxCodec.fit(q, 8, "square")
    edges = codec.get_config()["edges_in"]
    scale = edge_scale(float(np.abs(q[:, :, :, 1:2].astype(np.int32)).mean()))
    assert edges == list(scaled_edges(OCTAVE_EDGES_IN, scale))
    roundtrip(codec, q)
    default = list(scaled_edges(DEFAULT_EDGES_IN, scale))
    plain = CtxCodec.fit(q, 8, "square", layouts=[{**_layout_of(codec), "edges_in": default}])
    assert len(codec.encode(q)) < len(plain.encode(q))


def test_estimate_bytes_close_to_real():
    q = laplace_coeffs((4, 1, 8, 16, 8), np.int8)
    codec = CtxCodec.fit(q, 4, "square")
    real = sum(len(codec.encode(q[i : i + 1])) for i in range(len(q))) + len(
        json.dumps(codec.get_config(), separators=(",", ":"))
    )
    est = CtxCodec.estimate_bytes(q, 4, "square")
    # the starting layout's estimate: above what the layout search and the coder store, and close to it
    assert 1 <= est / real < 1.15


# ------------------------------------------------------------------------------------------ config
def test_config_json_roundtrip_and_size():
    codec, q = fitted((4, 3, 6, 25, 6), np.int8)
    cfg = codec.get_config()
    text = json.dumps(cfg)
    again = CtxCodec.from_config(json.loads(text))
    assert again == codec and again.get_config() == cfg
    buf = codec.encode(q)
    assert again.encode(q) == buf
    np.testing.assert_array_equal(again.decode(buf, q.shape, q.dtype), q)
    assert len(json.dumps(cfg, separators=(",", ":"))) < 20000
    assert cfg["id"] == CtxCodec.codec_id


def test_config_rejects_malformed():
    codec, _ = fitted((2, 1, 4, 16, 4), np.int8)
    good = codec.get_config()
    bad_cases = [
        {**good, "id": "zstd"},
        {**good, "version": 99},
        {k: v for k, v in good.items() if k != "params"},
        {**good, "extra": 1},
        {**good, "cf": 9},
        {**good, "cf": True},
        {**good, "mask": "circle"},
        {**good, "channels": 0},
        {**good, "freq_classes": "zz"},
        {**good, "lt_mode": "left"},
        {**good, "wide": "yes"},
        {**good, "edges_in": [3, 2]},
        {**good, "edges_in": []},
        {**good, "edges_in": [1, 5000]},
        {**good, "edges_dc": "1,2"},
        {**good, "channel_groups": [5]},
        {**good, "channel_groups": [0, 0]},
        {**good, "sign_flip": [300]},
        {**good, "params": "!!!"},
        {**good, "params": base64.b64encode(zlib.compress(b"\x00" * 3)).decode()},
        {**good, "params": base64.b64encode(b"not zlib").decode()},
        {**good, "table_crc": good["table_crc"] ^ 1},
        "not a mapping",
    ]
    for cfg in bad_cases:
        with pytest.raises(CtxCodecError):
            CtxCodec.from_config(cfg)


def test_config_params_any_bytes_are_safe():
    """Every parameter byte value builds valid tables: a hostile model decodes garbage, not crashes."""
    codec, q = fitted((2, 1, 4, 16, 4), np.int8)
    cfg = codec.get_config()
    n = 2 * codec.layout.nctx
    for seed in range(20):
        raw = np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()
        c2 = CtxCodec(codec.layout, np.frombuffer(raw, np.uint8)[0::2], np.frombuffer(raw, np.uint8)[1::2])
        cfg2 = {**cfg, "params": base64.b64encode(zlib.compress(raw)).decode(), "table_crc": c2.table_crc}
        c3 = CtxCodec.from_config(cfg2)
        buf = c3.encode(q)
        np.testing.assert_array_equal(c3.decode(buf, q.shape, q.dtype), q)
        try:  # the stream of another model: error or garbage of the right shape
            out = c3.decode(codec.encode(q), q.shape, q.dtype)
            assert out.shape == q.shape and out.dtype == q.dtype
        except CtxCodecError:
            pass


def test_vectorised_tables_bit_identical():
    from dctdata.entropy.ctxrans import MTOT, _freqs, _freqs_many

    rng = np.random.default_rng(5)
    iz = np.concatenate([rng.integers(0, 256, 3000), [0, 0, 255, 255, 128, 1, 254]])
    ir = np.concatenate([rng.integers(0, 256, 3000), [0, 255, 0, 255, 0, 254, 1]])
    f = _freqs_many(iz, ir)
    for k in range(len(iz)):
        assert tuple(f[k].tolist()) == _freqs(int(iz[k]), int(ir[k]))
    assert (f.sum(1) == MTOT).all() and (f >= 1).all()


def test_fit_fast_paths_match_the_plain_computations(monkeypatch):
    """The fit's shortcuts (unique tables by a row mix, search starts by one binary search, cached tables, the
    used contexts only) give exactly what the plain numpy computations give, the mix's collision fallback too."""
    from dctdata.entropy import ctxrans as cr

    rng = np.random.default_rng(6)
    iz = rng.integers(0, 256, 400).astype(np.uint8)
    ir = rng.integers(0, 256, 400).astype(np.uint8)
    iz[::3], ir[::3] = 7, 9  # repeated pairs: shared tables
    cum = cr._cum_tables(iz, ir)
    f = cr._freqs_many(iz.astype(np.int64), ir.astype(np.int64))
    np.testing.assert_array_equal(cum[:, 1:], np.cumsum(f, 1))  # cached rows == freshly built ones
    np.testing.assert_array_equal(cr._cum_tables(iz, ir), cum)
    want_u, want_i = np.unique(cum, axis=0, return_inverse=True)
    got_u, got_i = cr._unique_rows(cum)
    np.testing.assert_array_equal(got_u, want_u)
    np.testing.assert_array_equal(got_i, want_i.reshape(-1))
    monkeypatch.setattr(cr, "_ROW_MIX", np.zeros(cr.NTOK + 1, np.uint64))  # every row mixes alike: fallback
    got_u, got_i = cr._unique_rows(cum)
    np.testing.assert_array_equal(got_u, want_u)
    np.testing.assert_array_equal(got_i, want_i.reshape(-1))
    probes = np.arange(1 << 8, dtype=np.int64) << (cr.SCALE - 8)
    for tables in (want_u, want_u[:, ::-1].copy()):  # increasing tables, and decreasing ones (plain path)
        plain = (tables[:, 1:, None].astype(np.int64) <= probes[None, None, :]).sum(1).clip(0, cr.NTOK - 1)
        np.testing.assert_array_equal(cr._search_starts(tables, probes), plain)
    h = np.zeros((300, cr.NTOK), np.int64)
    h[rng.integers(0, 300, 40), rng.integers(0, cr.NTOK, 40)] = rng.integers(1, 500, 40)
    nlp, _ = cr._token_logp_table()
    used = cr._used(h)
    assert 0 < len(used) < len(h)
    cz, crr = cr._param_costs(h[used])
    np.testing.assert_allclose(crr, h[used, 1:] @ nlp.T, rtol=1e-12)
    for precision in (0, 3):
        iz2, ir2, bits = cr._fit_params(h, precision, (cz, crr))
        empty = h.sum(1) == 0
        assert (iz2[empty] == 128).all() and (ir2[empty] == 0).all() and (bits[empty] == 0).all()
        assert (iz2 % (1 << precision) == 0).all() and (ir2 % (1 << precision) == 0).all()
        full = cr._param_costs(h)  # every context, empty ones included: the same choice
        np.testing.assert_array_equal(cr._fit_params(h, precision, (full[0][used], full[1][used]))[0], iz2)
        dense = -(h * np.log2(np.diff(cr._cum_tables(iz2, ir2).astype(np.float64), axis=1) / cr.MTOT)).sum()
        assert cr._table_bits(h, iz2, ir2) == pytest.approx(dense, rel=1e-12)


# ------------------------------------------------------------------------------------------ arguments
def test_decode_argument_errors():
    codec, q = fitted((1, 1, 4, 16, 4), np.int8)
    buf = codec.encode(q)
    for shape in [
        (1, 1, 4, 16),
        (1, 1, 4, 9, 4),
        (1, 2, 4, 16, 4),
        (0, 1, 4, 16, 4),
        (1, 1, -4, 16, 4),
        (1 << 20, 1 << 20, 1 << 20, 16, 1),
        "abc",
        (1, 1, 4, 16, 4.5j),
    ]:
        with pytest.raises(CtxCodecError):
            codec.decode(buf, shape, np.int8)
    for dtype in (np.float32, np.uint8, "int32", "nonsense"):
        with pytest.raises(CtxCodecError):
            codec.decode(buf, q.shape, dtype)
    with pytest.raises(CtxCodecError):
        codec.decode(12345, q.shape, np.int8)
    with pytest.raises(CtxCodecError):
        codec.decode(b"", q.shape, np.int8)
    with pytest.raises(CtxCodecError):  # right bytes, wrong declared size: never silently reshaped
        codec.decode(buf, (1, 1, 4, 16, 5), np.int8)
    with pytest.raises(CtxCodecError):
        codec.encode(q.astype(np.float32))
    with pytest.raises(TypeError):
        codec.encode(q.tolist())


def test_kernel_rejects_malformed_blob():
    codec, q = fitted((1, 1, 2, 16, 2), np.int8)
    out = np.empty(q.shape, np.int8)
    buf = codec.encode(q)
    blob = bytearray(codec._blob)
    for bad in (bytes(blob[:-1]), b"\x00" * 20, bytes(blob[:4]) + b"\xff" * (len(blob) - 4)):
        with pytest.raises(ValueError):
            _ctxrans.decode(bad, buf, out, q.shape, 1)


# ------------------------------------------------------------------------------------------ 16 lanes (mode 2)
LANE_CASES = [
    ((1, 1, 4, 16, 32), np.int8, None, 3.0),  # whole vector steps
    ((2, 1, 3, 9, 13), np.int8, None, 3.0),  # runs that start and end inside a vector
    ((1, 1, 3, 64, 5), np.int8, None, 0.3),  # short runs of a sparse array
    ((1, 1, 2, 16, 300), np.int16, None, 3.0),  # rows split into runs of 256
    ((1, 3, 3, 9, 37), np.int8, None, 3.0),  # channels whose signs are coded as flips (scalar runs)
    ((1, 2, 2, 9, 270), np.int8, ("lt", "wide", "ch", "sign"), 3.0),  # left-neighbour contexts (scalar)
    ((1, 1, 4, 25, 40), np.int16, None, 40.0),  # large magnitudes: raw bits up to 17 per coefficient
    ((1, 2, 3, 16, 24), np.int16, ("top", "wide", "ch", "sign"), 3.0),  # every context of the vector loop
    ((2, 1, 2, 9, 19), np.int8, ("wide",), 3.0),  # no "top" context
]


@pytest.mark.parametrize("shape, dtype, features, scale", LANE_CASES)
def test_lanes_round_trip_through_both_decoders(shape, dtype, features, scale):
    codec, q = fitted_case(shape, dtype, features, np.random.default_rng(shape[-1]), scale)
    if shape[1] == 3:  # the vector decoder's sign-flip steps are what this case is for
        assert codec.layout.flags & 8  # F_SFLIP
    buf = lanes_encode(codec, q)
    assert buf[0] == 2
    for simd, gather in DECODERS:
        with decoder_settings(simd, gather):
            out = codec.decode(buf, q.shape, q.dtype)
        np.testing.assert_array_equal(out, q)


def test_the_vector_decoders_lookups_default_to_scalar_loads_on_amd_only():
    """Eight scalar loads decode 13-17% faster than the gather instruction on AMD EPYC (Zen 4); elsewhere the
    instruction stays (not measured). set_gather returns the setting it replaces (with no argument: the current
    one); decoder_settings puts both settings back, also after an error."""
    try:
        with open("/proc/cpuinfo") as f:
            vendor = next((line.split(":")[1].strip() for line in f if line.startswith("vendor_id")), None)
    except OSError:
        vendor = None
    if vendor is None:
        pytest.skip("no /proc/cpuinfo vendor_id to compare the default with")
    default, simd = _ctxrans.set_gather(), _ctxrans.set_simd()
    assert default is (vendor != "AuthenticAMD")
    assert _ctxrans.set_gather() is default  # asking does not change it
    with pytest.raises(RuntimeError, match="inside"), decoder_settings(simd=False, gather=not default):
        assert _ctxrans.set_gather() is (not default) and _ctxrans.set_simd() is False
        raise RuntimeError("inside")
    assert _ctxrans.set_gather() is default and _ctxrans.set_simd() is simd
    try:
        assert _ctxrans.set_gather(not default) is default and _ctxrans.set_gather(default) is (not default)
    finally:
        _ctxrans.set_gather(default)


def test_lanes_layout_costs_its_header_and_little_more():
    """16 states of 4 bytes against 2 of 8: 48 header bytes; 16-bit words: a little precision."""
    codec, q = fitted((1, 1, 16, 64, 32), np.int8)
    two, lanes = codec.encode(q[:, :, :4]), lanes_encode(codec, q[:, :, :4])
    assert two[0] == 0 and lanes[0] == 2
    assert len(two) < len(lanes) <= len(two) * 1.005 + 48


def test_codec_writes_lanes_for_large_arrays_only():
    codec, q = fitted((1, 1, 1, 16, 1024), np.int8)  # 16384 coefficients (LANES_MIN) in one block row: no segments
    assert codec.get_config()["version"] == 3
    big, small = codec.encode(q), codec.encode(np.ascontiguousarray(q[..., :512]))
    assert big[0] == 2 and small[0] == 0
    np.testing.assert_array_equal(codec.decode(big, q.shape, q.dtype), q)
    # a version 1 config (a pack written before) keeps writing what dctdata before this reads; it reads both
    old = codec.with_streams(version=1)
    assert old.get_config()["version"] == 1 and old.encode(q)[0] == 0
    np.testing.assert_array_equal(old.decode(big, q.shape, q.dtype), q)


def test_codec_writes_segments_for_arrays_of_two_segments_or_more():
    """Version 3 cuts arrays of 2 * segment coefficients or more into one segment per `segment` (mode 3, at most one
    per block row): SEGMENT for a fresh fit, SEGMENT_V3 for a version 3 config that names none (the packs written
    before the length was recorded); a version 2 config keeps writing mode 2, and every codec reads them all."""
    fit, q = fitted((1, 1, 32, 64, 32), np.int8)  # a 256x256 sample at CF 8: 65536 coefficients
    assert fit.segment == SEGMENT == 8192 and fit.get_config()["segment"] == 8192
    codec = fit.with_streams(segment_bytes=0)  # segments by coefficients alone (the bound has its own test)
    assert codec.stream_mode(q.shape) == (3, 8) and codec.stream_mode((1, 1, 2, 64, 128)) == (3, 2)
    assert codec.stream_mode((1, 1, 1, 64, 1024)) == (2, 0)  # one block row: one segment at most
    assert codec.stream_mode((1, 1, 8, 64, 31)) == (0, 0)  # 15872 coefficients: below two segments (and LANES_MIN)
    old = CtxCodec.from_config({k: v for k, v in fit.get_config().items() if not k.startswith("segment")})
    assert old.segment == SEGMENT_V3 == 16384 and old.segment_bytes == 0
    assert not {"segment", "segment_bytes"} & set(old.get_config())
    assert old.stream_mode(q.shape) == (3, 4) and old.stream_mode((1, 1, 8, 64, 63)) == (2, 0)
    short = codec.with_streams(segment=4096)
    assert short.stream_mode(q.shape) == (3, 16) and CtxCodec.from_config(short.get_config()) == short
    v2 = codec.with_streams(version=2)
    lanes = v2.encode(q)
    assert lanes[0] == 2 and "segment" not in v2.get_config()
    sizes = []
    for c, count in ((old, 4), (codec, 8), (short, 16)):
        buf = c.encode(q)
        assert buf[0] == 3 and buf[1] == count  # mode, LEB128 segment count
        sizes.append(len(buf))
        for reader in (old, codec, short, v2):  # the decoder reads the count from the stream
            np.testing.assert_array_equal(reader.decode(buf, q.shape, q.dtype), q)
        np.testing.assert_array_equal(c.decode(lanes, q.shape, q.dtype), q)
    assert len(lanes) < sizes[0] < sizes[1] < sizes[2]  # each segment's states and header, its first row's contexts


def test_segment_length_is_checked():
    codec, q = fitted((1, 1, 4, 16, 40), np.int8)
    config = codec.get_config()
    with pytest.raises(CtxCodecError, match=r"config segment: expected only in a version 3 config\. Got version 2"):
        CtxCodec.from_config({**config, "version": 2})
    for bad in (0, 1000, 1 << 25, 8192.0, True, "8192", None):
        with pytest.raises(CtxCodecError, match=r"config segment: expected coefficients per segment, an int in "):
            CtxCodec.from_config({**config, "segment": bad})
    for bad in (-1, 1 << 31, 6000.0, False, "6000", None):
        with pytest.raises(CtxCodecError, match=r"config segment_bytes: expected stream bytes per added segment, an "):
            CtxCodec.from_config({**config, "segment_bytes": bad})
    with pytest.raises(
        CtxCodecError, match=r"config segment_bytes: expected only in a version 3 config\. Got version 1"
    ):
        CtxCodec.from_config({k: v for k, v in config.items() if k != "segment"} | {"version": 1})
    with pytest.raises(
        CtxCodecError, match=r"^segment_bytes: expected stream bytes per added segment, an int in \[0, "
    ):
        codec.with_streams(segment_bytes=-5)
    with pytest.raises(CtxCodecError, match=r"^segment: expected coefficients per segment, an int in \[1024, "):
        CtxCodec.fit(q, 4, "square", segment=512)
    with pytest.raises(CtxCodecError, match=r"version: expected one of \(1, 2, 3\)\. Got 4"):
        codec.with_streams(version=4)
    with pytest.raises(
        CtxCodecError, match=r"config: expected keys .*\(and \['segment', 'segment_bytes'\] in version 3\)"
    ):
        CtxCodec.from_config({**config, "segments": 4})
    fitted_short = CtxCodec.fit(q, 4, "square", segment=2048, segment_bytes=0)
    again = CtxCodec.from_config(fitted_short.get_config())
    assert (again.segment, again.segment_bytes) == (2048, 0) and again == fitted_short


def _segment_count(buf: bytes) -> int:
    assert buf[0] == 3
    return buf[1]  # LEB128, one byte below 128


def test_segment_bytes_bounds_the_added_segments():
    """Beyond the first version 3 count (one per 16384 coefficients), one segment per `segment_bytes` bytes of the
    stream as the model estimates it (no trial encode): a dense sample gets every segment its coefficients allow, a
    sparse one keeps what version 3 wrote (mode 2 where that was one segment), so its bytes do not grow; every
    stream decodes with every codec of the model."""
    rng = np.random.default_rng(5)
    dense = np.clip(rng.laplace(0, 12, (1, 1, 32, 64, 32)), -127, 127).astype(np.int8)
    sparse = np.trunc(dense / 60).astype(np.int8)  # 1 in 150 coefficients not 0
    small = np.ascontiguousarray(sparse[:, :, :, :, :12])  # 24576 coefficients: below two first-release segments
    fit = CtxCodec.fit(np.concatenate([dense, sparse]), 8, "square")
    assert fit.segment_bytes == SEGMENT_BYTES == 6000 and fit.get_config()["segment_bytes"] == 6000
    free, first = fit.with_streams(segment_bytes=0), fit.with_streams(segment=SEGMENT_V3, segment_bytes=0)
    for q, base in ((dense, 4), (sparse, 4), (small, 1)):
        unbounded, bounded = free.encode(q), fit.encode(q)
        estimate = fit.estimate(q)  # the stream in the most segments, from the model's code lengths (sampled rows)
        # within 2% of the stream, or a few symbols of a sparse one: far below a segment's 6000 bytes
        assert abs(estimate - len(unbounded)) <= max(0.02 * len(unbounded), 200) and free.estimate(q) == estimate
        cap = base + estimate // 6000
        assert fit.stream_mode(q.shape)[1] == _segment_count(unbounded) == min(q.shape[2], q.size // 8192)
        if cap >= _segment_count(unbounded):
            assert bounded == unbounded
        elif cap >= 2:
            assert _segment_count(bounded) == cap and len(bounded) < len(unbounded)
        else:
            assert bounded == first.encode(q) and bounded[0] == 2 and len(bounded) < len(unbounded)
        for reader in (fit, free, first):
            np.testing.assert_array_equal(reader.decode(bounded, q.shape, q.dtype), q)
    assert _segment_count(fit.encode(dense)) == 8 and _segment_count(fit.encode(sparse)) == 4
    assert fit.encode(small)[0] == 2


@pytest.mark.parametrize("shape, dtype", [((1, 3, 7, 9, 20), np.int16), ((2, 1, 5, 16, 300), np.int8)])
def test_segments_round_trip_for_every_count(shape, dtype):
    """Every segment count from 1 to Hb, with channels (sign flips across channels stay inside a segment), two
    arrays in one stream, rows split into runs; each segment starts without a row above."""
    codec, q = fitted_case(shape, dtype, None, np.random.default_rng(shape[2]))
    for nseg in range(1, shape[2] + 1):
        buf = segments_encode(codec, q, nseg)
        assert buf[0] == 3
        for simd, gather in DECODERS:
            with decoder_settings(simd, gather):
                np.testing.assert_array_equal(codec.decode(buf, q.shape, q.dtype), q)


def test_segments_errors_name_the_problem_and_the_segment():
    codec, q = fitted((1, 1, 6, 16, 40), np.int8)
    buf = segments_encode(codec, q, 3)  # rows 0-1, 2-3, 4-5 (2 segments would be rows 0-2 and 3-5)
    # the header: mode, count, three lengths
    p, lens = 2, []
    for _ in range(3):
        v, p = read_leb128(buf, p)
        lens.append(v)
    body = buf[p:]
    assert sum(lens) == len(body)
    with pytest.raises(ValueError, match="ctxrans: encode needs 1 to Hb segments"):
        _ctxrans.encode(codec._blob, q, q.shape, 1, 3, 7)
    for bad, message in (
        (b"\x03" + leb128(0) + body, r"ctxrans: corrupt stream \(bad segment count\)"),
        (b"\x03" + leb128(7) + body, r"ctxrans: corrupt stream \(bad segment count\)"),  # more than Hb = 6
        (b"\x03\x03" + b"\xff" * 5 + body, r"ctxrans: corrupt stream \(bad segment length\)"),
        (b"\x03\x03" + b"".join(map(leb128, lens)) + body[:-1], r"ctxrans: truncated stream \(segments beyond"),
        (b"\x03\x03" + b"".join(map(leb128, lens)) + body + b"\x00", r"segments do not fill the stream"),
        (
            b"\x03\x02" + b"".join(map(leb128, lens[:2])) + body[: lens[0] + lens[1]],
            r"^ctxrans: segment 0 of 2: truncated",
        ),
        (b"\x03\x03" + b"".join(map(leb128, lens)) + b"\x03" + body[1:], r"ctxrans: segment 0 of 3: bad stream header"),
    ):
        with pytest.raises(CtxCodecError, match=message):
            codec.decode(bad, q.shape, q.dtype)
    cut = bytearray(buf)
    cut[p + lens[0] + 70] ^= 0xFF  # a rANS word of segment 1
    with pytest.raises(CtxCodecError, match=r"^ctxrans: segment 1 of 3: (corrupt|truncated) stream"):
        codec.decode(bytes(cut), q.shape, q.dtype)


def test_lanes_kernel_errors():
    codec, q = fitted((1, 1, 4, 16, 32), np.int8)
    with pytest.raises(ValueError, match="encode mode must be 0, 2 or 3"):
        _ctxrans.encode(codec._blob, q, q.shape, 1, 1)
    buf = lanes_encode(codec, q)
    with pytest.raises(CtxCodecError, match="bad stream header"):
        codec.decode(b"\x07" + buf[1:], q.shape, q.dtype)
    with pytest.raises(CtxCodecError, match="bad stream header"):
        codec.decode(buf[:40], q.shape, q.dtype)  # shorter than the 16 states
    with pytest.raises(CtxCodecError, match="bad initial state"):
        codec.decode(buf[:1] + b"\xff\xff\x00\x00" + buf[5:], q.shape, q.dtype)  # a state below 2^16
    with pytest.raises(CtxCodecError, match=r"does not end cleanly|truncated|bit section"):
        codec.decode(buf[:1] + b"\x00\x00\x01\x00" + buf[5:], q.shape, q.dtype)  # valid but wrong state


def test_config_from_a_newer_dctdata_says_upgrade():
    codec, _ = fitted((1, 1, 2, 16, 4), np.int8)
    with pytest.raises(
        CtxCodecError, match=r"version 1 or 2 or 3. Got 'dctdata_ctxrans' 4: written by a newer dctdata"
    ):
        CtxCodec.from_config({**codec.get_config(), "version": 4})
    for bad in (0, True, 2.0, "2"):
        with pytest.raises(CtxCodecError, match="expected id 'dctdata_ctxrans' version 1 or 2 or 3"):
            CtxCodec.from_config({**codec.get_config(), "version": bad})


# ------------------------------------------------------------------------------------------ fuzzing
_CASES = [
    ((1, 1, 3, 16, 4), np.int8, None),
    ((1, 3, 4, 9, 5), np.int8, None),
    ((1, 2, 3, 25, 3), np.int16, None),
    ((2, 1, 1, 1, 7), np.int16, None),
    ((1, 1, 8, 64, 10), np.int8, None),
    ((1, 3, 2, 9, 260), np.int8, None),
    ((1, 1, 2, 16, 300), np.int16, None),
    ((1, 2, 2, 9, 270), np.int8, ("lt", "wide", "ch", "sign")),
]


def _corpus():
    """A few valid streams of different kinds (int8/int16, C=1/3, tiny/medium, sign flips). The wide ones
    (Wb > 256) make the decoder split block rows into runs, take its unchecked path for the runs that
    have room and the checked one near the end; the last is fitted with the left-neighbour ("lt") and
    "wide" contexts, whose decoder walk is the generic one. Each array comes in mode 0 and mode 2; those of more
    than one block row also in mode 3 (segments), after all the pairs."""
    items = []
    for shape, dtype, features in _CASES:
        codec, q = fitted_case(shape, dtype, features, np.random.default_rng(len(items)))
        if features is not None:
            assert codec.layout.lt_mode == "lt" and codec.layout.wide
        items.append((codec, q, codec.encode(q)))
        items.append((codec, q, lanes_encode(codec, q)))  # the same array in the 16-lane layout
    # and in segments of block rows (mode 3), after the pairs
    items += [(codec, q, segments_encode(codec, q)) for codec, q, _ in items[::2] if q.shape[2] > 1]
    return items


@functools.cache
def corpus() -> list:
    """The corpus, built on first use (fitting its codecs at import time cost every test process's collection
    seconds, with or without these tests selected)."""
    return _corpus()


# len(corpus()), known before fitting (the hypothesis strategies below take it): each case in mode 0 and mode 2,
# those of more than one block row in mode 3 too (test_corpus_round_trips checks it)
CORPUS_SIZE = 2 * len(_CASES) + sum(shape[2] > 1 for shape, _, _ in _CASES)


def check_decode(codec, buf, shape, dtype):
    """The contract above, and the decoders (DECODERS) agree: the same error or the same array;
    `decode_many` of the stream twice decodes both or neither, to the same array."""
    outcomes = []
    for simd, gather in DECODERS:
        t = time.perf_counter()
        with decoder_settings(simd, gather):
            try:
                out = codec.decode(buf, shape, dtype)
            except CtxCodecError as exc:
                out = str(exc)
        assert time.perf_counter() - t < 1.0, "decoder took too long (hang?)"
        if not isinstance(out, str):
            assert out.shape == tuple(shape) and out.dtype == np.dtype(dtype)
        outcomes.append(out)
    for other in outcomes[1:]:
        if isinstance(outcomes[0], str) or isinstance(other, str):
            assert other == outcomes[0]
        else:
            np.testing.assert_array_equal(other, outcomes[0])
    twice = np.empty((2, *shape), dtype)
    decoded = codec.decode_many([buf, buf], twice)
    if isinstance(outcomes[0], str):
        assert decoded == 0
    else:
        assert decoded == 2
        np.testing.assert_array_equal(twice[0], outcomes[0])
        np.testing.assert_array_equal(twice[1], outcomes[0])


def test_every_truncation_raises():
    for codec, q, buf in corpus():
        for n in range(len(buf)):
            with pytest.raises(CtxCodecError):
                codec.decode(buf[:n], q.shape, q.dtype)
        with pytest.raises(CtxCodecError):  # trailing garbage is not silently ignored
            codec.decode(buf + b"\x00", q.shape, q.dtype)


def test_lying_section_length():
    for codec, q, buf in corpus():
        if buf[0] not in (0, 2):
            continue
        head = 1 + (16 if buf[0] == 0 else 64)
        _, end = read_leb128(buf, head)  # the rANS words' length
        for v in (0, 1, len(buf), len(buf) * 1000, 2**35):
            check_decode(codec, buf[:head] + leb128(v) + buf[end:], q.shape, q.dtype)
        check_decode(codec, buf[:head] + b"\xff" * 12, q.shape, q.dtype)  # unterminated LEB128


@pytest.mark.slow
@settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=False)
@given(which=st.integers(0, CORPUS_SIZE - 1), **MUTATIONS)
def test_fuzz_mutated_streams(which, edits, cut, insert):
    codec, q, buf = corpus()[which]
    check_decode(codec, mutate(buf, edits, cut, insert), q.shape, q.dtype)


@settings(max_examples=max(200, FUZZ_EXAMPLES // 10), deadline=None, suppress_health_check=list(HealthCheck))
@given(
    which=st.integers(0, CORPUS_SIZE - 1),
    data=st.binary(min_size=0, max_size=300),
    mode=st.sampled_from([b"", b"\x00", b"\x01", b"\x02"]),
)
def test_fuzz_random_bytes(which, data, mode):
    codec, q, _ = corpus()[which]
    check_decode(codec, mode + data, q.shape, q.dtype)
    # and with a wrong but plausible declared shape
    b, c, hb, k, wb = q.shape
    check_decode(codec, mode + data, (b, c, hb + 1, k, wb), q.dtype)


def test_decode_many_decodes_in_order_and_counts_up_to_the_first_bad_stream():
    codec, q, _ = corpus()[8]
    assert q.shape == (1, 1, 8, 64, 10) and q.dtype == np.int8
    rng = np.random.default_rng(5)
    arrays = [np.clip(q.astype(np.int16) + rng.integers(-2, 3, q.shape), -127, 127).astype(np.int8) for _ in range(4)]
    bufs = [codec.encode(a) if k % 2 else lanes_encode(codec, a) for k, a in enumerate(arrays)]  # both layouts
    out = np.zeros((4, *q.shape), np.int8)
    assert codec.decode_many(bufs, out) == 4
    for k, a in enumerate(arrays):
        np.testing.assert_array_equal(out[k], a)
    for bad in range(4):
        broken = list(bufs)
        broken[bad] = b"\x07" + broken[bad][1:]  # not a stream mode
        out[:] = 0
        assert codec.decode_many(broken, out) == bad
        for k in range(bad):  # the ones before it are decoded
            np.testing.assert_array_equal(out[k], arrays[k])
        with pytest.raises(CtxCodecError, match=r"ctxrans: bad stream header"):
            codec.decode(broken[bad], q.shape, q.dtype)
    assert codec.decode_many([], np.zeros((0, *q.shape), np.int8)) == 0


def test_decode_many_refuses_bad_arguments():
    codec, q, buf = corpus()[8]
    out = np.zeros((2, *q.shape), np.int8)
    with pytest.raises(TypeError, match=r"bufs: expected a list or tuple of bytes-like objects\. Got int"):
        codec.decode_many(5, out)
    with pytest.raises(CtxCodecError, match=r"bufs: expected bytes-like objects \(a bytes-like object is required"):
        codec.decode_many([buf, 7], out)
    with pytest.raises(CtxCodecError, match=r"out: expected shape \(len\(bufs\)=3, B, C, Hb, K, Wb\)\. Got \(2, 1, 1,"):
        codec.decode_many([buf] * 3, out)
    with pytest.raises(CtxCodecError, match=r"out: expected a writeable C-contiguous numpy array"):
        codec.decode_many([buf] * 2, out[:, :, :, :, :, :5])
    with pytest.raises(CtxCodecError, match=r"shape: expected K=64 and C <= 1\. Got \(1, 1, 8, 9, 10\)"):
        codec.decode_many([buf] * 2, np.zeros((2, 1, 1, 8, 9, 10), np.int8))


def test_corpus_round_trips():
    """Every corpus stream decodes to its array (the wide ones through runs of both decoder paths)."""
    assert len(corpus()) == CORPUS_SIZE
    pairs = 2 * len(_CASES)
    modes = [buf[0] for _, _, buf in corpus()[:pairs]]
    assert set(modes[0::2]) == {0}  # coded, not the raw fallback
    assert modes[1::2].count(2) >= len(modes) // 2 - 1  # the tiniest one's 16 states may not pay: raw
    assert {buf[0] for _, _, buf in corpus()[pairs:]} <= {1, 3} and [b[0] for _, _, b in corpus()[pairs:]].count(3) >= 5
    for codec, q, buf in corpus():
        np.testing.assert_array_equal(codec.decode(buf, q.shape, q.dtype), q)


@settings(max_examples=max(200, FUZZ_EXAMPLES // 10), deadline=None, suppress_health_check=list(HealthCheck))
@given(
    which=st.integers(0, CORPUS_SIZE - 1),
    edits=st.lists(st.tuples(st.floats(0.0, 1.0, exclude_max=True), st.integers(0, 255)), min_size=1, max_size=40),
)
def test_fuzz_kernel_model_bytes(which, edits):
    """The kernel's in-memory model with arbitrary bytes after its header (bucket tables, table indexes,
    frequency and search-start tables: what a bug in the model builder could hand it) still decodes
    inside its buffers: a ValueError or an array, never a crash (the ASan build checks the reads)."""
    codec, q, buf = corpus()[which]
    blob = bytearray(codec._blob)
    head = 6 * 4
    for at, val in edits:
        blob[head + int(at * (len(blob) - head))] = val
    out = np.empty(q.shape, q.dtype)
    t = time.perf_counter()
    with contextlib.suppress(ValueError):
        _ctxrans.decode(bytes(blob), buf, out, q.shape, q.dtype.itemsize)
    assert time.perf_counter() - t < 1.0


# Streams written by the kernel before its decoder was rewritten (branch i13: same stored format,
# version 1), with the configs they were written under: C=2 (top, ch and sign-flip contexts) and C=1 (top).
GOLDEN = [
    (
        (2, 2),
        '{"id":"dctdata_ctxrans","version":1,"cf":3,"mask":"square","channels":2,"freq_classes":"uv","lt_mode":"top",'
        '"wide":false,"sign_flip":[128,0],"channel_groups":[0,0],"edges_in":[1,2,3,5,7,11,17],"edges_lt":[1,3,7],'
        '"edges_ch":[1,3],"edges_dc":[1,2,4,8,16,32,64],"params":"eNrdUdEKgkAQHAjLSsGMLN/6sf6gICytuDSNHnoL+mG73bM87'
        "Ioe6iUW9obd25mbvdkQgJPjb2Ik/XgKY5o/8LuAV5qqPAuJ9C5oXx7CkqfqbglRaVW5uh+PFU8ssWAd1UmCBPAXk43M20EqqxH/Atwl"
        "c4BvHjXlNfMUDUd7m+5lvYvMiv+kOl3SLZQL7X+FQ5XIJXzWeOYBq/uU047mN6zzZwHo/u+x66d02s1NZy0YWQ5WjfUZtRHxVP9emN+"
        'ft1ekbjU12RWuL7jKH77THDfhCeWT","table_crc":2737821076}',
        "eNoBYQGe/gD0/+G/AgAAALlYa9/0MQAA/AFZ2TQ0A1utZKPlEyxR6D8wSNsbTQbozsAlv9K7x7mGq2BanqOxGPCKJaNQ58RN3DVkxF7F"
        "KqFfJRkwKCpxAqIZtE+nM91sY4+/XVeVT5jkjVhRUEL2VfOhe83cWDTg4RUIam/tjGQ5ZkvU9HaT2NnJcPG2MyA9F5tp7o5cN5CUh/Hi"
        "LaCQJBjtI5Y7oeaXiZmwLCQPJeaoHUeSPfftzP8P+oj0QCFCkaFjpcruDGvbhg6HDT9RPi8QlYZ8c0/B71p3+x8ERUC6zfjdl4mggfW2"
        "/A622WWzQAaQ0gt9wppaiiBJgkf5/pmbMN+jUz1w8DSK8pgzx0Xvp33VqcIxAAAAAKBNm7RpU5s2tWlTW5va2mprq9dWr61er16vr9f3"
        "9X0BAAAAACZt2qRNm9q0qa1NbW1qa6utrV5bvV69Xl+vr9f39Z0AAAAAAAAAAAAADuOroA==",
    ),
    (
        (1, 3),
        '{"id":"dctdata_ctxrans","version":1,"cf":3,"mask":"square","channels":1,"freq_classes":"uv","lt_mode":"top",'
        '"wide":false,"sign_flip":[],"channel_groups":[0],"edges_in":[1,2,3,5,7,11,17],"edges_lt":[1,3,7],'
        '"edges_ch":[],"edges_dc":[1,2,4,8,16,32,64],"params":"eNpLlWxgYBBoYKAWrBYFmifKgFOeQYIBaGMD3EYGMQbZChEGhnx'
        "xBoky4VJuBj4GAWTdKewMXCD3VXFVMtRzAWneYp42oHimOINwFQdQvyTYPAyYwVPCAaKLWMrB/ArWWob/QLoJiP8T4Y9StnpWsH6GDj"
        'C/HqiLGH0AORhOpA==","table_crc":2299699519}',
        "eNpj+PLfqOsKIwPDy4u+nC9DGRjeMJqG7Vh5KOjY/qKg6do6Vz+1/Zmeep4jWe91+4f/GS+0BdWSfY5UG5WnTzsq9qTkravXpKlePOsi"
        "TWTV3206sIL186Y696qbK060aijpcLt+N1vF/3krX7O13azNSq+8rvgV+oWGmgeFhho9vhTfYlguq1q51sm23etFTuad+W/uHC026pjh"
        "l2lz382jcV7CmruCj328d7fUugm9WGD9TWzOydMnJkxSubM9SHbS/rDQ0DyX0FBpX+crfMaZLgZO+7uq7wVuO5hh2JnzxppXaFJdl9QX"
        "vdOHjh6IeL9WxDReMa5SfHbi4j3yzhweL6rWlEvEVC40kOQzZACCBb6zt2QGzzbbmhkcPfvWrazs1dfD1q+NWx+3fv31719rGUFq1HJv"
        "LfGdfWvLyrW+ublAFWvXxkXvjdsbFw9WwwpSssT31hZPZFMQat6//m0FACMHqyY=",
    ),
]


def _golden_q(c, hb):
    i = np.arange(c * hb * 9 * 40).reshape(1, c, hb, 9, 40)
    q = ((i * 7919) % 23 - 11) // (1 + i // 40 % 9)
    q[:, :, :, 0] = (i[:, :, :, 0] % 40) * 3 - 60
    if c > 1:
        q[:, 1] = q[:, 0] // 2
    return q.astype(np.int8)


@pytest.mark.parametrize("dims, config, stream", GOLDEN)
def test_streams_written_before_decode_the_same(dims, config, stream):
    """The stored format did not change: streams the earlier kernel wrote decode to their arrays, and the
    encoder still writes the same bytes."""
    q = _golden_q(*dims)
    codec = CtxCodec.from_config(json.loads(config))
    buf = zlib.decompress(base64.b64decode(stream))
    np.testing.assert_array_equal(codec.decode(buf, q.shape, q.dtype), q)
    assert codec.encode(q) == buf


@pytest.mark.parametrize(
    "shape, dtype, mask",
    [
        ((1, 1, 64, 36, 64), np.int8, "square"),  # sampled rows
        ((2, 3, 32, 16, 40), np.int16, "square"),  # channels: sign flips, batch of two
        ((1, 1, 4, 6, 512, 8), np.int8, "cube"),  # a volume: every row
    ],
)
def test_estimate_is_within_two_percent_of_the_stream(shape, dtype, mask):
    """`estimate` (what `encode` sets the segment count by) against the stream in the most segments: within 2%."""
    rng = np.random.default_rng(len(shape) + shape[1])
    flat = (shape[0], shape[1], math.prod(shape[2:-2]), shape[-2], shape[-1])
    q = laplace_coeffs(flat, dtype, rng=rng).reshape(shape)
    if shape[1] > 1:
        q[:, 1:] = q[:, :1] // 2
    codec = CtxCodec.fit(q, 8 if mask == "cube" else round(shape[-2] ** 0.5), mask).with_streams(segment_bytes=0)
    stream = codec.encode(q)
    assert stream[0] == 3 and _segment_count(stream) == codec.stream_mode(codec._rows(q.shape))[1]
    assert abs(codec.estimate(q) / len(stream) - 1) < 0.02
