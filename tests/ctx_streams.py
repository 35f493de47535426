"""Entropy-coded streams for the entropy coder's tests.

For the GPU decoder's tests (the lane emulator on the CPU, the kernel on CUDA): streams of real coefficients,
SciML-like synthetic fields and scikit-image's shipped photos, transformed by dctdata, quantized with a step per
frequency, and coded by a `CtxCodec` fitted on them in each stream mode (versions 1, 2, 3 write modes 0, 2, 3;
noise forces the raw copy, mode 1). For every decoder's hostile-stream tests: LEB128 fields (the stream's
section and segment lengths) written and read back, and the byte mutations the fuzz tests apply."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import strategies as st

import dctdata
from dctdata.entropy.ctxrans import CtxCodec


def quantized(x: np.ndarray, cf: int, step: float, dtype) -> np.ndarray:
    """float (N, C, H, W) -> (N, C, Hb, K, Wb) coefficients quantized with step * (1 + k / 8) for plane k."""
    c = dctdata.compress(torch.from_numpy(np.ascontiguousarray(x, np.float32)), cf=cf).numpy()
    k = c.shape[3]
    q = np.rint(c / (step * (1 + np.arange(k) / 8.0))[None, None, None, :, None])
    info = np.iinfo(dtype)
    return np.ascontiguousarray(np.clip(q, info.min, info.max).astype(dtype))


def tiles(name: str, size: int, n: int) -> np.ndarray:
    """n tiles of size x size of a scikit-image photo (camera: grey, astronaut: RGB), float32 (N, C, size, size)."""
    from shipped_images import sample_images

    img = np.asarray(sample_images((name,), include_sklearn=False)[name], dtype=np.float32)
    img = img[None] if img.ndim == 2 else img.transpose(2, 0, 1)
    _, h, w = img.shape
    corners = [(i, j) for i in range(0, h - size + 1, size) for j in range(0, w - size + 1, size)]
    return np.stack([img[:, i : i + size, j : j + size] for i, j in corners[:n]])


def real_sets() -> list[tuple[str, CtxCodec, np.ndarray]]:
    """(name, codec fitted on q, q (N, C, Hb, K, Wb)): int8 synthetic fields at 256x256 (CF 8: 65536 coefficients,
    mode 3 from version 3; CF 4: 16384 coefficients), int16 photos (grey 256x256, RGB 128x128: 49152
    coefficients, with sign flips across channels), each with the starting layout of `fit` (the "top" context and,
    for RGB, "ch" and "sign"), and the RGB one again with the left-block ("lt") and "wide" contexts."""
    from sci_fields import micrographs, synthetic_fields

    atoms = synthetic_fields(n=3, size=256, kinds=("atoms",))["atoms"]
    sets = [  # (name, q, fit options)
        ("em int8 256", quantized(micrographs(3, 256), 8, 2.0, np.int8), {}),
        ("atoms int8 256 cf4", quantized(atoms, 4, 0.02, np.int8), {}),
        ("camera int16 256", quantized(tiles("camera", 256, 3), 8, 0.5, np.int16), {}),
        ("astronaut int16 128", quantized(tiles("astronaut", 128, 3), 8, 0.5, np.int16), {}),
    ]
    out = []
    for name, q, kw in sets:
        out.append((name, CtxCodec.fit(q, round(q.shape[3] ** 0.5), "square", _first_only=True, **kw)[0], q))
    name, _, q = out[-1]
    lt = CtxCodec.fit(q, 8, "square", features=("lt", "wide", "ch", "sign"), _first_only=True)[0]
    assert lt.layout.lt_mode == "lt" and lt.layout.wide and lt.layout.flags & 8
    out.append((name + " lt+wide", lt, q))
    return out


def versioned(codec: CtxCodec, version: int, segment: int | None = None) -> CtxCodec:
    """The same model under another config version (1: mode 0 streams, 2: mode 2, 3: mode 3 for large samples) and
    segment length (None: the codec's)."""
    return codec.with_streams(version=version, segment=segment)


def encode_samples(codec: CtxCodec, q: np.ndarray) -> list[bytes]:
    """One stream per sample (B = 1), as the packs store them."""
    return [codec.encode(q[i : i + 1]) for i in range(len(q))]


def batch(bufs: list[bytes]) -> tuple[torch.Tensor, torch.Tensor]:
    """Streams back to back in one uint8 buffer, and their N + 1 offsets."""
    offsets = torch.zeros(len(bufs) + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(torch.tensor([len(b) for b in bufs], dtype=torch.int64), 0)
    data = b"".join(bufs)
    buffer = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.zeros(0, dtype=torch.uint8)
    return buffer, offsets


def leb128(v: int) -> bytes:
    """v as an unsigned LEB128 field, as the stream headers write their lengths."""
    out = bytearray()
    while True:
        out.append((v & 0x7F) | (0x80 if v > 0x7F else 0))
        v >>= 7
        if not v:
            return bytes(out)


def read_leb128(buf: bytes, p: int) -> tuple[int, int]:
    """The LEB128 field at buf[p:]: its value, and the position after it."""
    v, shift = 0, 0
    while True:
        v |= (buf[p] & 0x7F) << shift
        shift += 7
        p += 1
        if not buf[p - 1] & 0x80:
            return v, p


# the edits a mutation fuzz test draws (hypothesis strategies; `mutate` applies them)
MUTATIONS = dict(
    edits=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=6),
    cut=st.one_of(st.none(), st.integers(0, 10**6)),
    insert=st.one_of(st.none(), st.tuples(st.integers(0, 10**6), st.binary(min_size=1, max_size=8))),
)


def mutate(buf: bytes, edits, cut, insert) -> bytes:
    """buf with bytes overwritten (positions wrap around), then bytes inserted, then its tail cut off."""
    b = bytearray(buf)
    for pos, val in edits:
        b[pos % len(b)] = val
    if insert is not None:
        pos = insert[0] % (len(b) + 1)
        b[pos:pos] = insert[1]
    if cut is not None:
        del b[cut % (len(b) + 1) :]
    return bytes(b)
