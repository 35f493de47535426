"""What a manifest says about a pack, as numbers: per-field sizes and ratios (`dctdata info`) and a
whole-pack summary (pack summary, demo, examples). One place, so every table means the same."""

from __future__ import annotations

import math
from typing import Any

from dctdata.format.fields import SIDE_SUFFIX, FieldSpec, user_fields
from dctdata.format.manifest import Manifest
from dctdata.kinds import FieldKind


def field_rows(m: Manifest) -> list[dict[str, Any]]:
    """Per field: stored bytes (files under `<field>/`; None when fields share files, as in webdataset
    shards), ratio vs float32 and vs the source dtype, transfer ratio, error figures. Label fields get
    no ratios (None): a scalar per sample against its chunk and index overhead means nothing."""
    rows = []
    for f in user_fields(m.fields):
        own = (f.name + "/", f.name + SIDE_SUFFIX + "/")  # a dct field's side partner is part of it
        stored = sum(e["bytes"] for k, e in m.checksums.items() if k.startswith(own)) or None
        n_values = math.prod(f.shape) * m.samples
        ratios = bool(stored) and f.kind is not FieldKind.LABEL
        rows.append(
            {
                "field": f,
                "stored": stored,
                "ratio_f32": 4 * n_values / stored if ratios else None,
                "ratio_src": f.source_sample_bytes * m.samples / stored if ratios else None,
                "transfer": None
                if f.kind is FieldKind.LABEL
                else f.codec.transfer_ratio
                if f.is_dct
                else 4 * math.prod(f.shape) / max(1, f.stored_sample_bytes),
                "stats": m.stats.get(f.name),
            }
        )
    return rows


def pack_summary(m: Manifest) -> dict[str, Any]:
    """Stored size, ratios, transfer ratio and PSNR of a whole packed dataset, from its manifest."""
    stored = m.stored_bytes
    f32 = src = coeff = 0.0
    for f in user_fields(m.fields):
        numel = math.prod(f.shape)
        f32 += 4 * numel
        src += f.source_sample_bytes
        coeff += 4 * numel / f.codec.transfer_ratio if f.is_dct else f.source_sample_bytes
    dct = [m.stats[f.name] for f in m.fields if f.kind is FieldKind.DCT and f.name in m.stats]
    return {
        "stored_bytes": stored,
        "ratio_f32": m.samples * f32 / stored if stored else None,
        "ratio_src": m.samples * src / stored if stored else None,
        "transfer": f32 / coeff,
        "psnr_min": min((s.psnr_min for s in dct), default=None),
        "psnr_median": min((s.psnr_median for s in dct), default=None),
        "settings": {f.name: f"cf={f.codec.cf} {f.codec.mask} {f.codec.dtype}" for f in m.fields if f.is_dct},
    }


def num(v: float | None, fmt: str = "{:.2f}") -> str:
    """A table cell: '-' for unknown, 'exact' for an infinite PSNR."""
    if v is None:
        return "-"
    if v == math.inf:
        return "exact"
    return fmt.format(v)


VOLUME_HINT_CHANNELS = 8  # a 2-D field with this many channels may be a volume


def volume_hint(field: FieldSpec) -> str | None:
    """A line offering --dims 3 for a 2-D dct field whose channels may be a third spatial axis: at least
    VOLUME_HINT_CHANNELS channels of at least 8 x 8, or channels that are one source dimension (an xarray
    variable's level or depth). None otherwise."""
    if not field.is_dct or field.codec.depth is not None:
        return None
    c, h, w = field.shape
    source_dims = field.attrs.get("dims") if isinstance(field.attrs.get("dims"), list) else []
    one_axis = len(source_dims) == 3 and "variable" not in str(source_dims[0])  # not stacked variables
    if c < 2 or min(h, w) < 8 or (c < VOLUME_HINT_CHANNELS and not one_axis):
        return None
    return (
        f"{field.name}: {c} channels of {h} x {w}: if they are a third spatial axis (depth, levels, slices, time), "
        f"--dims 3 (dims=3) packs each sample as a ({c}, {h}, {w}) volume of 8x8x8 blocks"
    )
