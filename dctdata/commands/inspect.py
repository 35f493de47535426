"""`dctdata inspect OUT`: a PNG with original | reconstruction | error | radial power spectrum for a few
samples of a packed dataset's `dct` field.

The manifest keeps no originals. When the manifest's recorded source (or `--original`) is a .npy,
or a .npz with a member named like the field, the originals are read from it (memory-mapped,
pickle-free) and the error map and PSNR are shown; otherwise the figure shows the reconstruction
and its spectrum only, and says so.
"""

from __future__ import annotations

import logging
import os
import re

import numpy as np
import torch

from dctdata.errors import DctDataError

log = logging.getLogger(__name__)


def register(sub) -> None:
    p = sub.add_parser("inspect", help="PNG: original vs reconstruction vs error (+ spectrum) for a few samples")
    p.add_argument("out", metavar="OUT", help="packed dataset (directory or URL with manifest.json)")
    p.add_argument("--field", default=None, help="dct field to show (default: the only dct field)")
    p.add_argument("--samples", type=int, default=3, help="how many samples (evenly spaced)")
    p.add_argument("--channels", type=int, default=1, help="channels shown per sample")
    p.add_argument("--original", default=None, metavar="NPY", help="read originals from this .npy/.npz instead of the manifest's source")
    p.add_argument("--png", default=None, help="output PNG (default: OUT/inspect.png, or ./inspect.png for URLs)")
    p.set_defaults(func=_main)


def _read_originals(path: str, field: str, indices: list[int], shape: tuple[int, ...], channels_last: bool) -> np.ndarray | None:
    """Originals (n, C, H, W) float64 from a .npy/.npz source, or None when they cannot be matched."""
    if not os.path.isfile(path):
        return None
    if path.endswith(".npy"):
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    elif path.endswith(".npz"):
        with np.load(path, allow_pickle=False) as z:
            names = {re.sub(r"[^A-Za-z0-9_]", "_", k): k for k in z.files}
            if field not in names:
                return None
            arr = z[names[field]]
    else:
        return None
    x = np.asarray(arr[indices], dtype=np.float64)
    if channels_last and x.ndim == 4:
        x = np.moveaxis(x, -1, 1)
    if x.ndim == 3:
        x = x[:, None]
    if tuple(x.shape[1:]) != tuple(shape):
        log.warning("originals in %s have per-sample shape %s, not the field's %s: not shown", path, x.shape[1:], shape)
        return None
    return x


def inspect_dataset(out: str, png: str, field: str | None = None, samples: int = 3, channels: int = 1, original: str | None = None) -> tuple[str, bool]:
    """Decode a few samples of a packed dataset and draw the figure. Returns (png path, originals shown)."""
    from dctdata.api import open_dataset
    from dctdata.format import read_manifest
    from dctdata.inspect_plot import inspect_figure
    from dctdata.layer import Decompress

    if samples < 1 or channels < 1:
        raise DctDataError(f"--samples/--channels: expected >= 1. Got {samples}/{channels}")
    manifest = read_manifest(out)
    f = manifest.field(field, kind="dct") if field is None else manifest.field(field)
    if f.kind != "dct":
        raise DctDataError(f"--field {f.name}: expected a dct field. Got kind {f.kind!r}")
    ds = open_dataset(out, as_dict=True)
    n = len(ds)
    indices = sorted({int(i) for i in np.linspace(0, n - 1, min(samples, n))})
    if hasattr(ds, "__getitem__"):
        coeffs = [ds[i][f.name] for i in indices]
    else:  # iterable (webdataset): the first samples in stream order
        coeffs, indices = [], list(range(min(samples, n)))
        for s in ds:
            coeffs.append(s[f.name])
            if len(coeffs) == len(indices):
                break
    batch = torch.stack([torch.as_tensor(c) for c in coeffs])
    with torch.inference_mode():
        rec = Decompress(f.codec, normalize=False)(batch).numpy()
    src = original or manifest.pack.get("source")
    org = None
    if isinstance(src, str):
        org = _read_originals(src, f.name, indices, f.shape, bool(manifest.pack.get("channels_last")))
    c = min(channels, rec.shape[1])
    items_rec = rec[:, :c].reshape(-1, *rec.shape[2:])
    items_org = None if org is None else org[:, :c].reshape(-1, *org.shape[2:])
    titles = [f"{f.name} sample {i} channel {ch}" for i in indices for ch in range(c)]
    path = inspect_figure(items_org, items_rec, png, titles)
    return path, org is not None


def _main(args) -> int:
    png = args.png
    if png is None:
        png = os.path.join(args.out, "inspect.png") if os.path.isdir(args.out) else "inspect.png"
    path, shown = inspect_dataset(args.out, png, args.field, args.samples, args.channels, args.original)
    print(f"wrote {path}")
    if not shown:
        print("originals not available (source is not a readable .npy/.npz; pass --original): reconstruction and spectrum only")
    return 0
