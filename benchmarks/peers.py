"""The peers of the rate-distortion bench, each swept over its own quality knob.

Each sample is compressed on its own (each channel too, unless the codec codes colour itself), with
its own headers, and the bytes are summed: what storing the pack sample by sample would cost. Every
codec runs on one thread.

- ZFP fixed-accuracy (zfpy): tolerance 2^-k x the item's range, k = -1..14.
- SZ3 (imagecodecs, absolute bound): r x the item's range, r = 10^-0.75 .. 10^-5.
- SPERR (imagecodecs, PSNR mode, header kept): targets 5..65 dB (it lands far above low targets on
  smooth images).
- JPEG 2000 (imagecodecs/OpenJPEG, raw J2K codestream, irreversible 9/7, `level` = target PSNR
  20..72.5 dB), two variants, the better one counts at each PSNR:
  "native": 8-bit items as uint8 (RGB with the codec's colour transform);
  "uint16": each sample (each channel, or the three colours of an 8-bit RGB item together) mapped to
  uint16 over its own [min, max], 8 bytes counted for the min and range. 8-bit items need it: the
  irreversible path tops out below 40 dB against the small ranges of tiles.
- JPEG (Pillow/libjpeg, optimized Huffman tables, quality 5..100), 8-bit items only, 4:4:4 and 4:2:0
  chroma for RGB, the better one counts.

A peer whose library is missing is skipped with one line (`missing`).
"""

from __future__ import annotations

import dataclasses
import importlib
import io
import time
from collections.abc import Callable

import numpy as np

from benchmarks.curves import Point, pack_psnr


@dataclasses.dataclass(frozen=True)
class Peer:
    name: str
    label: str
    module: str  # the Python package it needs
    curves: Callable[[np.ndarray, bool], dict[str, list[Point]]]  # (pack, 8-bit) -> curve name -> points
    codec: str | None = None  # imagecodecs codec it needs (imagecodecs.<codec>.available)

    def missing(self) -> str | None:
        """Why this peer cannot run here (one line), or None."""
        try:
            module = importlib.import_module(self.module)
        except ImportError:
            return f"{self.label} skipped: {self.module} is not installed (pip install 'dctdata[bench]')"
        if self.codec is not None and not getattr(getattr(module, self.codec, None), "available", False):
            return f"{self.label} skipped: this {self.module} build has no {self.codec} codec"
        return None


class _Timer:
    """Summed encode and decode seconds of one sweep point."""

    def __init__(self) -> None:
        self.encode_s = 0.0
        self.decode_s = 0.0

    def encode(self, fn, *args, **kwargs) -> bytes:
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        self.encode_s += time.perf_counter() - t0
        return out

    def decode(self, fn, *args, **kwargs):
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        self.decode_s += time.perf_counter() - t0
        return out


def _ranges(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(range, min) per item (N, C) in float64; a constant item gets a tiny range (no division by 0)."""
    flat = x.reshape(*x.shape[:2], -1).astype(np.float64)
    lo = flat.min(-1)
    return np.maximum(flat.max(-1) - lo, 1e-30), lo


def _per_item(
    x: np.ndarray, setting: str, encode: Callable[[np.ndarray, int, int], bytes], decode: Callable[[bytes], np.ndarray]
) -> Point:
    """Each channel of each sample coded on its own; bytes summed, PSNR of the whole pack."""
    timer = _Timer()
    total, rec = 0, np.empty(x.shape, np.float64)
    for i in range(x.shape[0]):
        for j in range(x.shape[1]):
            blob = timer.encode(encode, np.ascontiguousarray(x[i, j]), i, j)
            total += len(blob)
            rec[i, j] = timer.decode(decode, blob)
    return Point(setting, total, pack_psnr(x, rec), timer.encode_s, timer.decode_s)


def zfp_curves(x: np.ndarray, u8: bool) -> dict[str, list[Point]]:
    import zfpy

    rng, _ = _ranges(x)
    points = []
    for k in range(-1, 15):
        tol = 2.0**-k
        points.append(
            _per_item(
                x,
                f"tolerance 2^{-k}·range",
                lambda a, i, j, tol=tol: zfpy.compress_numpy(a, tolerance=tol * rng[i, j]),
                zfpy.decompress_numpy,
            )
        )
    return {"zfp": points}


def sz3_curves(x: np.ndarray, u8: bool) -> dict[str, list[Point]]:
    import imagecodecs

    rng, _ = _ranges(x)
    points = []
    for e in np.arange(0.75, 5.01, 0.25):
        rel = float(10.0**-e)
        points.append(
            _per_item(
                x,
                f"abs {rel:.3g}·range",
                lambda a, i, j, rel=rel: imagecodecs.sz3_encode(a, mode="abs", abs=float(rel * rng[i, j])),
                lambda b: imagecodecs.sz3_decode(b, x.shape[2:], np.float32),
            )
        )
    return {"sz3": points}


def sperr_curves(x: np.ndarray, u8: bool) -> dict[str, list[Point]]:
    import imagecodecs

    points = []
    for target in np.arange(5.0, 66.0, 2.5):
        t = float(target)
        points.append(
            _per_item(
                x,
                f"psnr {t:g}",
                lambda a, i, j, t=t: imagecodecs.sperr_encode(a.astype(np.float64), t, "psnr", numthreads=1),
                lambda b: imagecodecs.sperr_decode(b, numthreads=1),
            )
        )
    return {"sperr": points}


J2K_LEVELS = tuple(float(v) for v in np.arange(20.0, 72.6, 2.5))


def _j2k(image: np.ndarray, level: float, timer: _Timer) -> tuple[int, np.ndarray]:
    """One J2K codestream of a (H, W) or (H, W, 3) image: (bytes, decoded as float64 in the same layout)."""
    import imagecodecs

    blob = timer.encode(
        imagecodecs.jpeg2k_encode, image, level=level, codecformat="j2k", mct=image.ndim == 3, numthreads=1
    )
    return len(blob), timer.decode(imagecodecs.jpeg2k_decode, blob, numthreads=1).astype(np.float64)


def _colour_groups(x: np.ndarray, u8: bool) -> list[list[int]]:
    """Channels coded together: the three colours of an 8-bit RGB item, otherwise each channel alone."""
    c = x.shape[1]
    return [list(range(c))] if u8 and c == 3 else [[j] for j in range(c)]


def _image(a: np.ndarray) -> np.ndarray:
    """(k, H, W) -> (H, W) or (H, W, 3), as the image codecs take them."""
    return np.ascontiguousarray(a[0] if a.shape[0] == 1 else a.transpose(1, 2, 0))


def _unimage(a: np.ndarray) -> np.ndarray:
    return a[None] if a.ndim == 2 else a.transpose(2, 0, 1)


def j2k_native(x: np.ndarray, level: float) -> Point:
    """8-bit samples coded as uint8."""
    native = np.clip(np.round(x), 0, 255).astype(np.uint8)
    timer, total, rec = _Timer(), 0, np.empty(x.shape, np.float64)
    for i in range(x.shape[0]):
        for group in _colour_groups(x, True):
            size, out = _j2k(_image(native[i, group]), level, timer)
            total += size
            rec[i, group] = _unimage(out)
    return Point(f"uint8 level {level:g}", total, pack_psnr(x, rec), timer.encode_s, timer.decode_s)


def j2k_uint16(x: np.ndarray, level: float, u8: bool) -> Point:
    """Each coding unit mapped to uint16 over its own [min, max]; 8 bytes each for min and range."""
    timer, total, rec = _Timer(), 0, np.empty(x.shape, np.float64)
    for i in range(x.shape[0]):
        for group in _colour_groups(x, u8):
            a = x[i, group].astype(np.float64)
            lo, span = float(a.min()), max(float(a.max() - a.min()), 1e-30)
            u = np.round((a - lo) / span * 65535).astype(np.uint16)
            size, out = _j2k(_image(u), level, timer)
            total += size + 8
            rec[i, group] = _unimage(out) / 65535 * span + lo
    return Point(f"uint16 level {level:g}", total, pack_psnr(x, rec), timer.encode_s, timer.decode_s)


def j2k_curves(x: np.ndarray, u8: bool) -> dict[str, list[Point]]:
    out = {"j2k-uint16": [j2k_uint16(x, t, u8) for t in J2K_LEVELS]}
    if u8:
        out["j2k-native"] = [j2k_native(x, t) for t in J2K_LEVELS]
    return out


JPEG_QUALITIES = (5, 10, 20, 30, 40, 50, 60, 70, 75, 80, 85, 90, 93, 95, 97, 98, 99, 100)


def jpeg_point(x: np.ndarray, quality: int, subsampling: int) -> Point:
    """Pillow JPEG of 8-bit samples (grey or RGB), one file per sample."""
    from PIL import Image

    native = np.clip(np.round(x), 0, 255).astype(np.uint8)
    timer, total, rec = _Timer(), 0, np.empty(x.shape, np.float64)
    for i in range(x.shape[0]):
        buf = io.BytesIO()
        timer.encode(
            Image.fromarray(_image(native[i])).save,
            buf,
            format="JPEG",
            quality=quality,
            subsampling=subsampling,
            optimize=True,
        )
        total += buf.tell()
        rec[i] = _unimage(timer.decode(lambda b: np.asarray(Image.open(io.BytesIO(b))), buf.getvalue()))
    chroma = {0: "4:4:4", 2: "4:2:0"}[subsampling]
    return Point(f"q{quality} {chroma}", total, pack_psnr(x, rec), timer.encode_s, timer.decode_s)


def jpeg_curves(x: np.ndarray, u8: bool) -> dict[str, list[Point]]:
    if not u8 or x.shape[1] not in (1, 3):
        return {}
    out = {"jpeg-444": [jpeg_point(x, q, 0) for q in JPEG_QUALITIES]}
    if x.shape[1] == 3:
        out["jpeg-420"] = [jpeg_point(x, q, 2) for q in JPEG_QUALITIES]
    return out


PEERS: dict[str, Peer] = {
    "zfp": Peer("zfp", "ZFP fixed-accuracy", "zfpy", zfp_curves),
    "sz3": Peer("sz3", "SZ3", "imagecodecs", sz3_curves, "SZ3"),
    "sperr": Peer("sperr", "SPERR", "imagecodecs", sperr_curves, "SPERR"),
    "j2k": Peer("j2k", "JPEG 2000", "imagecodecs", j2k_curves, "JPEG2K"),
    "jpeg": Peer("jpeg", "JPEG (8-bit items)", "PIL", jpeg_curves),
}
# The best of these, per pack and PSNR, is "the best peer" (JPEG and ZFP are shown on their own).
BEST_PEERS = ("sperr", "j2k", "sz3")
