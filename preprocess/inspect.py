"""`dctdata inspect`: original | reconstruction | error | radial power spectrum for a few samples of a
packed dataset's `dct` field, as one PNG.

The manifest keeps no originals: they are read back from the recorded source (or `original=`) through
the same source readers `pack` uses, in the pack's layout (`--key`, `--channels-last`). When the source
is gone or does not match, the figure shows the reconstruction and its spectrum only, and says so.
"""

from __future__ import annotations

import logging
import os

import numpy as np
import torch

from dctdata.errors import DctDataError
from dctdata.format.manifest import read_manifest
from dctdata.format.peek import peek
from dctdata.kinds import FieldKind
from dctdata.layer import Decompress
from dctdata.preprocess.inspect_figure import inspect_figure
from dctdata.preprocess.sources import open_source

log = logging.getLogger(__name__)


def read_originals(
    source: str, field: str, indices: list[int], shape: tuple[int, ...], key, channels_last: bool
) -> np.ndarray | None:
    """Originals (n, C, H, W) float64 from a source, or None when they cannot be matched."""
    if not isinstance(source, str):
        return None
    try:
        src = open_source(source, key=key, channels_last=channels_last)
    except (DctDataError, OSError, ImportError) as exc:
        log.warning("originals not readable from %s: %s", source, exc)
        return None
    try:
        if len(src) <= max(indices) or field not in src.probe():
            return None
        x = np.asarray(src.take(indices)[field], dtype=np.float64)
    except (DctDataError, OSError) as exc:
        log.warning("originals not readable from %s: %s", source, exc)
        return None
    finally:
        src.close()
    if x.ndim == 3:
        x = x[:, None]
    if tuple(x.shape[1:]) != tuple(shape):
        log.warning(
            "originals in %s have per-sample shape %s, not the field's %s: not shown", source, x.shape[1:], shape
        )
        return None
    return x


def inspect_dataset(
    out: str, png: str, field: str | None = None, samples: int = 3, channels: int = 1, original: str | None = None
) -> tuple[str, bool]:
    """Decode a few samples of a packed dataset and draw the figure. Returns (png path, originals shown)."""
    if samples < 1 or channels < 1:
        raise DctDataError(f"--samples/--channels: expected >= 1. Got {samples}/{channels}")
    manifest = read_manifest(out)
    f = manifest.field(field, kind=FieldKind.DCT) if field is None else manifest.field(field)
    if not f.is_dct:
        raise DctDataError(f"--field {f.name}: expected a dct field. Got kind {f.kind!r}")
    indices, coeffs = peek(out, manifest, f, samples)
    with torch.inference_mode():
        rec = Decompress(f.codec, normalize=False)(coeffs).numpy()
    # The manifest's source is only followed to an existing path: a module:callable runs code, and a
    # downloaded pack's manifest must never choose code to run. The user may name one with `original`.
    src = original if original is not None else manifest.pack.get("source")
    if original is None and not (isinstance(src, str) and os.path.exists(src)):
        src = None
    org = read_originals(
        src, f.name, indices, f.shape, manifest.pack.get("key"), bool(manifest.pack.get("channels_last"))
    )
    c = min(channels, rec.shape[1])
    items_rec = rec[:, :c].reshape(-1, *rec.shape[2:])
    items_org = None if org is None else org[:, :c].reshape(-1, *org.shape[2:])
    titles = [f"{f.name} sample {i} channel {ch}" for i in indices for ch in range(c)]
    path = inspect_figure(items_org, items_rec, png, titles)
    return path, org is not None
