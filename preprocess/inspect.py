"""`dctdata inspect`: original | reconstruction | error | radial power spectrum for the worst few samples
of a packed dataset's `dct` field (every channel, or one), as one PNG.

The manifest keeps no originals: they are read back from the recorded source (or `original=`) through
the same source readers `pack` uses, in the pack's layout (`--key`, `--channels-last`, `--sample-dim`,
`--variables`, `--stack`): .npy/.npz, HDF5, image folders, NetCDF/zarr stores, and, when the caller
passes them as `original=`, a module:callable or a Python object (array, dict, xarray.Dataset,
map-style dataset). When the source is gone or does not match, the figure shows the reconstruction
and its spectrum only, and says so.

Masked fields: pixels outside the validity mask (the pack's mask field, and non-finite originals) are
drawn in a flat colour, left out of the error map, and the PSNR in each row is over valid pixels
against their range, as everywhere else.
"""

from __future__ import annotations

import logging
import math
import os

import numpy as np
import torch

from dctdata.codec.metrics import psnr
from dctdata.decoder.layer import Decompress
from dctdata.errors import DctDataError
from dctdata.format.kinds import CODED
from dctdata.format.manifest import read_manifest
from dctdata.format.peek import peek
from dctdata.preprocess.inspect_figure import inspect_figure
from dctdata.preprocess.parts import mask_batch
from dctdata.preprocess.sources import is_path, open_source

log = logging.getLogger(__name__)


SOURCE_OPTIONS = ("key", "channels_last", "sample_dim", "time_dim", "variables", "stack")
SCAN_SAMPLES = 256  # samples searched for the worst ones ...
SCAN_VALUES = 1 << 24  # ... at most this many values (decoded and read back) in all


def read_originals(
    source: object, field: str, indices: list[int], shape: tuple[int, ...], options: dict
) -> np.ndarray | None:
    """Originals (n, C, H, W) float64 from a source opened with the pack's source options, or None when
    they cannot be matched."""
    if source is None:
        return None
    name = source if is_path(source) else type(source).__name__
    try:
        src = open_source(source, **options)
    except (DctDataError, OSError, ImportError, TypeError) as exc:
        log.warning("originals not readable from %s: %s", name, exc)
        return None
    try:
        if len(src) <= max(indices) or field not in src.probe():
            return None
        x = np.asarray(src.take(indices)[field], dtype=np.float64)
    except (DctDataError, OSError) as exc:
        log.warning("originals not readable from %s: %s", name, exc)
        return None
    finally:
        src.close()
    if 1 < x.ndim <= len(shape) and tuple(x.shape[1:]) == tuple(shape)[len(shape) + 1 - x.ndim :]:
        x = x.reshape(len(x), *shape)  # (H, W), 1-D or (D, H, W) samples of a (1, H, W), (1, 1, L) or volume field
    if tuple(x.shape[1:]) != tuple(shape):
        log.warning("originals in %s have per-sample shape %s, not the field's %s: not shown", name, x.shape[1:], shape)
        return None
    return x


def _followable(source: object) -> bool:
    """The manifest's source is only followed to an existing local path: a module:callable runs code,
    and a downloaded pack's manifest must never choose code to run (nor a URL to fetch)."""
    return isinstance(source, str) and os.path.exists(source)


def inspect_dataset(
    out: str,
    png: str,
    field: str | None = None,
    samples: int = 3,
    channels: int | None = None,
    original: object = None,
    channel: int | None = None,
    scan: int = SCAN_SAMPLES,
) -> tuple[str, bool]:
    """Decode a few samples of a packed dataset and draw the figure. Returns (png path, originals shown).

    Which samples: with the originals at hand, the `samples` worst (lowest PSNR of any shown channel)
    among up to `scan` samples (evenly spaced in a zarr pack, the first ones of a webdataset stream;
    fewer when samples are large, SCAN_VALUES in all), since the worst is what a scientist checks before
    trusting a pack; without originals, evenly spaced ones. Which channels: all (default), the first
    `channels`, or only `channel`. `original`: where the originals are (a path, URL, module:callable or
    Python object) when not at the recorded source."""
    if samples < 1 or (channels is not None and channels < 1) or scan < 1:
        raise DctDataError(f"--samples/--channels/--scan: expected >= 1. Got {samples}/{channels}/{scan}")
    manifest = read_manifest(out)
    if field is None:
        dct = [f.name for f in manifest.fields if f.coded]
        if len(dct) > 1:
            raise DctDataError(f"--field: expected one of the dct fields {dct} (this pack has {len(dct)}). Got none")
    f = manifest.coded_field(field)
    if not f.coded:
        raise DctDataError(f"--field {f.name}: expected a {CODED} field. Got kind {f.kind!r}")
    c_all = f.shape[0]
    if channel is not None and not 0 <= channel < c_all:
        raise DctDataError(f"--channel: expected a channel of field {f.name!r}, 0..{c_all - 1}. Got {channel}")
    shown = [channel] if channel is not None else list(range(min(channels or c_all, c_all)))
    src = original if original is not None else manifest.pack.get("source")
    if original is None and not _followable(src):
        src = None
    options = {k: manifest.pack.get(k) for k in SOURCE_OPTIONS}
    options["channels_last"] = bool(options["channels_last"])
    count = max(samples, min(scan, SCAN_VALUES // max(1, math.prod(f.shape)))) if src is not None else samples
    indices, coeffs = peek(out, manifest, f, count)
    with torch.inference_mode():
        rec = Decompress(f.codec, normalize=False)(coeffs).numpy()
    valid = None
    if f.valid is not None:
        mask_indices, masks = peek(out, manifest, manifest.field(f.valid), count)
        if mask_indices == indices:
            valid = mask_batch(masks.numpy(), f.shape)
    org = read_originals(src, f.name, indices, f.shape, options)
    if org is not None and not np.isfinite(org).all():
        finite = np.isfinite(org)
        valid = finite if valid is None else valid & finite
    pick = list(range(len(indices)))
    if org is not None and len(indices) > samples:
        scores = psnr(
            torch.from_numpy(org[:, shown]),
            torch.from_numpy(rec[:, shown].astype(np.float64)),
            dims=rec.ndim - 2,  # a volume's PSNR is over the whole (D, H, W) item
            valid=None if valid is None else torch.from_numpy(np.ascontiguousarray(valid[:, shown])),
        )
        worst = torch.nan_to_num(scores, nan=math.inf).amin(1)
        pick = sorted(torch.argsort(worst, stable=True)[:samples].tolist())
    elif len(indices) > samples:
        pick = sorted({int(i) for i in np.linspace(0, len(indices) - 1, samples)})
    indices = [indices[j] for j in pick]
    rec, org = rec[pick][:, shown], None if org is None else org[pick][:, shown]
    valid = None if valid is None else np.ascontiguousarray(valid[pick][:, shown])
    depth = f.codec.depth
    if depth is not None:  # a volume (C, D, H, W): the figure shows its middle slice along D
        mid = depth // 2
        rec, org = rec[:, :, mid], None if org is None else org[:, :, mid]
        valid = None if valid is None else np.ascontiguousarray(valid[:, :, mid])
    items_rec = rec.reshape(-1, *rec.shape[2:])
    items_org = None if org is None else org.reshape(-1, *org.shape[2:])
    items_valid = None if valid is None else valid.reshape(-1, *rec.shape[2:])
    names = f.attrs.get("channels") if isinstance(f.attrs.get("channels"), list) else None
    where = f" slice {depth // 2} of {depth}" if depth is not None else ""
    titles = [
        f"{f.name} sample {i} channel {ch}{where}" + (f" ({names[ch]})" if names and ch < len(names) else "")
        for i in indices
        for ch in shown
    ]
    path = inspect_figure(items_org, items_rec, png, titles, valid=items_valid)
    return path, org is not None
