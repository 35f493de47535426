"""The `dctdata inspect` figure, drawn with Pillow (no plotting dependency).

One row per item (one channel of one sample): original | reconstruction | |error| map | radially
averaged power spectrum of both (log power vs spatial frequency), so a scientist can see what the
low-pass and the quantizer did to their data: the spectrum shows where the reconstruction falls off.
Without originals a row is reconstruction | spectrum. With a validity mask, invalid pixels are drawn
in a flat blue-grey, left out of the error map, the grey scale and the PSNR (valid pixels against
their range), and the spectra use the fill the pack stored (originals' holes take the reconstruction).
"""

from __future__ import annotations

import os

import numpy as np
import torch

from dctdata.codec.metrics import psnr
from dctdata.errors import DctDataError
from dctdata.format.atomic import atomic_write

TILE = 224
PAD = 24
BAR = 22  # room under each row for the error map's colour bar
INVALID_RGB = (70, 80, 110)


def radial_power_spectrum(img: np.ndarray, bins: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(frequency in cycles/pixel, mean |FFT|^2 in each radial bin) of a 2-D array, mean removed."""
    a = np.asarray(img, dtype=np.float64)
    if a.ndim != 2:
        raise DctDataError(f"spectrum: expected a 2-D array (H, W). Got shape {a.shape}")
    p = np.abs(np.fft.fft2(a - a.mean())) ** 2 / a.size
    fy = np.fft.fftfreq(a.shape[0])[:, None]
    fx = np.fft.fftfreq(a.shape[1])[None, :]
    r = np.sqrt(fy**2 + fx**2)
    bins = bins or max(4, min(a.shape) // 2)
    edges = np.linspace(0, 0.5, bins + 1)
    which = np.digitize(r.ravel(), edges) - 1
    ok = (which >= 0) & (which < bins) & (r.ravel() > 0)  # the DC term is ~0 after mean removal: leave it out
    total = np.bincount(which[ok], weights=p.ravel()[ok], minlength=bins)
    count = np.bincount(which[ok], minlength=bins)
    return (edges[:-1] + edges[1:]) / 2, np.where(count > 0, total / np.maximum(count, 1), np.nan)


def _heat(u8: np.ndarray) -> np.ndarray:
    """uint8 levels -> RGB: black -> red -> yellow -> white (error maps and their colour bar)."""
    v = u8.astype(int)
    return np.stack([np.clip(3 * v, 0, 255), np.clip(3 * v - 255, 0, 255), np.clip(3 * v - 510, 0, 255)], -1).astype(
        np.uint8
    )


def _colour_bar(hi: float):
    """The error map's scale: a heat gradient from 0 to `hi`, labelled at both ends."""
    from PIL import Image, ImageDraw

    bar = Image.new("RGB", (TILE, BAR), "white")
    ramp = np.linspace(0, 255, TILE).astype(np.uint8)
    bar.paste(Image.fromarray(np.repeat(_heat(ramp)[None], 7, 0), "RGB"), (0, 1))
    d = ImageDraw.Draw(bar)
    d.text((0, 9), "0", fill="black")
    label = f"{hi:.3g}"
    d.text((TILE - 6 * len(label) - 2, 9), label, fill="black")
    return bar


def _to_tile(a: np.ndarray, lo: float, hi: float, cmap: str = "gray", valid: np.ndarray | None = None):
    from PIL import Image

    scale = 255.0 / (hi - lo) if hi > lo else 0.0
    a = np.asarray(a, dtype=np.float64)
    u8 = np.clip(np.nan_to_num((a - lo) * scale, nan=0.0), 0, 255).astype(np.uint8)
    if cmap == "heat":  # black -> red -> yellow -> white, for error maps
        im = Image.fromarray(_heat(u8), "RGB")
    else:
        im = Image.fromarray(u8, "L").convert("RGB")
    if valid is not None and not valid.all():
        rgb = np.array(im)
        rgb[~valid] = INVALID_RGB
        im = Image.fromarray(rgb, "RGB")
    h, w = u8.shape
    s = TILE / max(h, w)
    return im.resize((max(1, round(w * s)), max(1, round(h * s))), Image.NEAREST)


def _spectrum_tile(curves: list[tuple[str, np.ndarray, np.ndarray, str]]):
    from PIL import Image, ImageDraw

    im = Image.new("RGB", (TILE, TILE), "white")
    d = ImageDraw.Draw(im)
    m = 22
    vals = np.concatenate([np.log10(c[2][np.isfinite(c[2]) & (c[2] > 0)]) for c in curves] or [np.zeros(1)])
    if vals.size == 0:
        vals = np.zeros(1)
    lo, hi = float(vals.min()), float(vals.max())
    hi = hi if hi > lo else lo + 1
    d.rectangle([m, 4, TILE - 4, TILE - m], outline="black")
    for i, (label, f, p, colour) in enumerate(curves):
        ok = np.isfinite(p) & (p > 0)
        xs = m + f[ok] / 0.5 * (TILE - 4 - m)
        ys = TILE - m - (np.log10(p[ok]) - lo) / (hi - lo) * (TILE - m - 8)
        if len(xs) > 1:
            # earlier curves drawn wider, so a reconstruction on top of its original leaves both visible
            d.line(list(zip(xs.tolist(), ys.tolist())), fill=colour, width=2 + 2 * (len(curves) - 1 - i))
        d.text((TILE - 90, 8 + 12 * i), label, fill=colour)
    d.text((m, TILE - m + 4), "0", fill="black")
    d.text((TILE - 60, TILE - m + 4), "0.5 cyc/px", fill="black")
    d.text((2, 4), f"1e{hi:.0f}", fill="black")
    d.text((2, TILE - m - 10), f"1e{lo:.0f}", fill="black")
    return im


def inspect_figure(
    originals: np.ndarray | None,
    reconstructions: np.ndarray,
    path: str | os.PathLike,
    titles: list[str] | None = None,
    valid: np.ndarray | None = None,
) -> str:
    """Write the figure for items (S, H, W) to `path` (PNG); returns the path.

    originals may be None (reconstruction and its spectrum only). Each row's error map has its own colour
    scale, 0 -> black to the row's max |error| -> white, drawn as a colour bar under it; titles give each
    row's PSNR when originals exist.
    valid: bool (S, H, W), True where a pixel counts (None: all).
    """
    from PIL import Image, ImageDraw

    rec = np.asarray(reconstructions, dtype=np.float64)
    if rec.ndim != 3 or rec.shape[0] < 1:
        raise DctDataError(f"reconstructions: expected items of shape (S, H, W) with S >= 1. Got {rec.shape}")
    org = None
    if originals is not None:
        org = np.asarray(originals, dtype=np.float64)
        if org.shape != rec.shape:
            raise DctDataError(f"originals: expected the reconstructions' shape {rec.shape}. Got {org.shape}")
    if titles is not None and len(titles) != rec.shape[0]:
        raise DctDataError(f"titles: expected {rec.shape[0]} titles (one per item). Got {len(titles)}")
    if valid is not None:
        valid = np.asarray(valid, dtype=bool)
        if valid.shape != rec.shape:
            raise DctDataError(f"valid: expected the reconstructions' shape {rec.shape}. Got {valid.shape}")
    cols = (
        ["original", "reconstruction", "|error|", "radial power spectrum"]
        if org is not None
        else ["reconstruction", "radial power spectrum"]
    )
    width = PAD + len(cols) * (TILE + PAD)
    height = PAD + rec.shape[0] * (TILE + 2 * PAD + BAR)
    fig = Image.new("RGB", (width, height), "white")
    d = ImageDraw.Draw(fig)
    for j, name in enumerate(cols):
        d.text((PAD + j * (TILE + PAD), 6), name, fill="black")
    for i in range(rec.shape[0]):
        y = PAD + i * (TILE + 2 * PAD + BAR) + PAD
        r = rec[i]
        v = None if valid is None else valid[i]
        ref = org[i] if org is not None else r
        shown = ref if v is None else ref[v]
        lo, hi = (float(shown.min()), float(shown.max())) if shown.size else (0.0, 1.0)
        tiles = []
        label = titles[i] if titles else f"item {i}"
        if org is not None:
            o = org[i] if v is None else np.where(v, org[i], r)  # holes: the stored fill (no NaN in the FFT)
            err = np.abs(o - r)
            db = float(
                psnr(
                    torch.as_tensor(o, dtype=torch.float64),
                    torch.as_tensor(r, dtype=torch.float64),
                    valid=None if v is None else torch.as_tensor(v),
                )
            )
            label += f"   PSNR {db:.1f} dB, max |error| {err.max():.3g}" + ("" if v is None else " (valid pixels)")
            tiles += [
                _to_tile(org[i], lo, hi, valid=v),
                _to_tile(r, lo, hi, valid=v),
                _to_tile(err, 0.0, float(err.max()), "heat", valid=v),
            ]
            f, p_org = radial_power_spectrum(o)
            _, p_rec = radial_power_spectrum(r)
            curves = [("original", f, p_org, "#1f77b4"), ("reconstr.", f, p_rec, "#d62728")]
        else:
            tiles.append(_to_tile(r, lo, hi, valid=v))
            f, p_rec = radial_power_spectrum(r)
            curves = [("reconstr.", f, p_rec, "#d62728")]
        tiles.append(_spectrum_tile(curves))
        d.text((PAD, y - PAD + 6), label, fill="black")
        for j, t in enumerate(tiles):
            fig.paste(t, (PAD + j * (TILE + PAD), y))
        if org is not None:  # the error map's scale, under it
            fig.paste(_colour_bar(float(err.max())), (PAD + 2 * (TILE + PAD), y + TILE + 2))
    return atomic_write(path, lambda fh: fig.save(fh, format="PNG"))
