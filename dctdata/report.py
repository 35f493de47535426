"""What a manifest says about a pack, as numbers: per-field sizes and ratios (`dctdata info`) and a
whole-pack summary (pack summary, demo, examples). One place, so every table means the same."""

from __future__ import annotations

import math
from typing import Any

from dctdata.format.fields import SIDE_SUFFIX, FieldSpec, user_fields
from dctdata.format.manifest import Manifest


def derived_masks(m: Manifest) -> frozenset[str]:
    """Names of the validity masks a pack made itself (`--nan mask`: `<field>_valid`): not source data, so
    no ratio counts them as such. A mask the source held (`--valid FIELD=MASKFIELD`) is source data."""
    named = {f.valid for f in m.fields if f.coded and f.valid is not None}
    explicit = m.pack.get("valid") if isinstance(m.pack.get("valid"), dict) else {}
    return frozenset(named - set(explicit.values()))


def manifest_size(m: Manifest) -> int:
    """Bytes of the manifest as a pack writes it (`write_manifest` writes exactly `to_json()`)."""
    return len(m.to_json().encode("utf-8"))


def disk_bytes(m: Manifest, manifest_bytes: int | None = None) -> int:
    """Every byte of the pack on disk: the stored files the manifest lists (data, zarr.json metadata,
    shards) and the manifest itself (`manifest_bytes`: its file's size where known, else as written)."""
    return m.stored_bytes + (manifest_size(m) if manifest_bytes is None else manifest_bytes)


def field_rows(m: Manifest) -> list[dict[str, Any]]:
    """Per field: stored bytes (files under `<field>/`; None when fields share files, as in webdataset
    shards), ratio vs float32 and vs the source dtype, transfer ratio, error figures. Label fields get
    no ratios (None): a scalar per sample against its chunk and index overhead means nothing; nor do the
    masks a pack made (`derived_masks`): they are not source data."""
    rows = []
    derived = derived_masks(m)
    for f in user_fields(m.fields):
        own = (f.name + "/", f.name + SIDE_SUFFIX + "/")  # a dct field's side partner is part of it
        stored = sum(e["bytes"] for k, e in m.checksums.items() if k.startswith(own)) or None
        n_values = math.prod(f.shape) * m.samples
        ratios = bool(stored) and f.kind_type.ratios and f.name not in derived
        rows.append(
            {
                "field": f,
                "stored": stored,
                "ratio_f32": 4 * n_values / stored if ratios else None,
                "ratio_src": f.source_sample_bytes * m.samples / stored if ratios else None,
                "transfer": f.kind_type.transfer_ratio(f),
                "stats": m.stats.get(f.name),
            }
        )
    return rows


def pack_summary(m: Manifest, manifest_bytes: int | None = None) -> dict[str, Any]:
    """Stored size, ratios, transfer ratio and PSNR of a whole packed dataset, from its manifest. The
    stored size is every byte on disk (`disk_bytes`: the manifest and zarr metadata included); the ratios
    set the source's bytes (as float32, and in its own dtypes) against it, without the masks the pack
    made (`derived_masks`). The transfer ratio is the source as float32 over the bytes sent to the
    device, masks included (they are sent)."""
    stored = disk_bytes(m, manifest_bytes)
    derived = derived_masks(m)
    f32 = src = coeff = 0.0
    for f in user_fields(m.fields):
        numel = math.prod(f.shape)
        coeff += 4 * numel / f.codec.transfer_ratio if f.coded else f.source_sample_bytes
        if f.name in derived:
            continue
        f32 += 4 * numel
        src += f.source_sample_bytes
    dct = [m.stats[f.name] for f in m.fields if f.coded and f.name in m.stats]
    return {
        "stored_bytes": stored,
        "source_bytes": m.samples * src,
        "ratio_f32": m.samples * f32 / stored if stored else None,
        "ratio_src": m.samples * src / stored if stored else None,
        "transfer": f32 / coeff,
        "psnr_min": min((s.psnr_min for s in dct), default=None),
        "psnr_median": min((s.psnr_median for s in dct), default=None),
        "settings": {f.name: f"cf={f.codec.cf} {f.codec.mask} {f.codec.dtype}" for f in m.fields if f.coded},
    }


def fidelity_line(m: Manifest) -> str | None:
    """What a pack packed without any fidelity flag promises, for its summary: the default target its float
    fields were calibrated to (`default_target_psnr` in the manifest's pack entry) and the per-sample floor
    each records, and which fields are stored exactly. None when the pack named a fidelity setting."""
    target = m.pack.get("default_target_psnr")
    names = m.pack.get("cf"), m.pack.get("mask"), m.pack.get("quant"), m.pack.get("target_psnr")
    bounds = m.pack.get("max_error"), m.pack.get("max_rel_error")
    if any(v is not None for v in (*names, *bounds)):
        return None
    dct = [f for f in user_fields(m.fields) if f.coded]
    # where the default target could not be calibrated, every frequency is kept as float32 (near-exact)
    near = [f.name for f in dct if target is not None and f.codec.cf == 8 and f.codec.dtype == "float32"]
    lossy = [f for f in dct if f.name not in near]
    exact = [f.name for f in user_fields(m.fields) if not f.coded]
    parts = []
    if near:
        parts.append(
            f"{', '.join(near)} kept near-exact (every frequency as float32: the default target "
            f"{num(target, '{:g}')} dB could not be calibrated on these samples)"
        )
    if lossy and target is not None:
        floors = [f"{f.name} {f.codec.min_psnr:.2f} dB" for f in lossy if f.codec.min_psnr is not None]
        parts.append(
            f"default target {num(target, '{:g}')} dB for {', '.join(f.name for f in lossy)}"
            + (f" (per-sample floor {', '.join(floors)})" if floors else "")
            + "; --target-psnr DB chooses another"
        )
    elif lossy:  # dct fields without a recorded default target (a source's own kind, an older pack)
        parts.append(f"{', '.join(f.name for f in lossy)} coded with the settings above")
    if exact:
        parts.append(f"{', '.join(exact)} stored exactly")
    return "no fidelity flag: " + "; ".join(parts)


def stage_name(lossless) -> str:
    """A field's lossless stage as a reader would name it: `dctdata_ctxrans` (the entropy coder, which
    only dctdata decodes), `zstd-19`, `blosc zstd-5`, or `none` (plain arrays other zarr readers read):
    the stage's `display_name`."""
    from dctdata.stages import get_stage

    return get_stage(lossless or None).display_name


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
    if not field.coded or field.codec.depth is not None:
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
