"""What a manifest says about a pack, as numbers: per-field sizes and ratios (`dctdata info`) and a
whole-pack summary (pack summary, demo, examples). One place, so every table means the same."""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from dctdata.errors import DctDataError
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


# Fidelity over time (trajectory packs) -----------------------------------------------------------------
# A trajectory pack (The Well, PDEBench, --time-dim) records its error figures per field, channel and time
# step (in bins of `step_width` steps, at most STEP_BINS of them, so long trajectories keep the manifest
# small) in the pack entry FIDELITY_OVER_TIME; reports split them into step ranges. One frame is one item.
FIDELITY_OVER_TIME = "fidelity_over_time"
TRAJECTORY_INFO = "trajectories"  # the pack's source_info key of the trajectory record (frame offsets)
STEP_BINS = 128
DEFAULT_STEP_RANGES = 4
FLOOR_SLACK_DB = 1e-6  # the floor is recorded at float32 precision; the figures are float64
# columns of a step bin, per channel: frames; frames with a finite PSNR, the lowest PSNR (+inf: exact), their
# PSNR sum; frames with a relative L2 error, its sum and largest; frames below the per-sample floor
FRAMES, N_PSNR, PSNR_MIN, PSNR_SUM, N_REL, REL_SUM, REL_MAX, BELOW = range(8)


def trajectory_offsets(source_info: Any) -> np.ndarray | None:
    """The first frame of every trajectory of a trajectory pack and the frame count last (its record's frame
    offsets), or None for a pack of independent samples."""
    info = source_info.get(TRAJECTORY_INFO) if isinstance(source_info, dict) else None
    if not isinstance(info, dict) or not isinstance(info.get("offsets"), list) or len(info["offsets"]) < 2:
        return None
    return np.asarray(info["offsets"], dtype=np.int64)


def frame_steps(offsets: np.ndarray, first: int, n: int) -> np.ndarray:
    """The time steps of frames first..first + n - 1 within their trajectories (computed per batch: an array of
    every frame's step would cost 8 bytes a frame in every worker)."""
    frames = np.arange(first, first + n, dtype=np.int64)
    return frames - offsets[np.searchsorted(offsets, frames, side="right") - 1]


class StepFigures:
    """Per dct field, channel and bin of `width` time steps: the columns above. Filled frame by frame (`add`:
    the pack's parts, `dctdata verify --source`), merged over parts, kept in the manifest (`record`,
    `from_manifest`), split into step ranges (`rows`)."""

    def __init__(self, channels: Mapping[str, int], bins: int, width: int = 1, steps: int | None = None) -> None:
        self.width, self.bins = int(width), int(bins)
        self.steps = self.bins * self.width if steps is None else int(steps)  # the longest trajectory's steps
        self.table = {name: self._empty(self.bins, c) for name, c in channels.items()}

    @staticmethod
    def _empty(bins: int, channels: int) -> np.ndarray:
        t = np.zeros((bins, channels, 8), dtype=np.float64)
        t[..., PSNR_MIN] = np.inf
        return t

    @classmethod
    def for_trajectories(cls, channels: Mapping[str, int], offsets: np.ndarray) -> StepFigures:
        """Bins for the trajectories whose frame offsets are `offsets`: one a step, or wider past STEP_BINS steps
        (every part of a pack bins alike)."""
        n = max(1, int(np.diff(offsets).max()))
        width = -(-n // STEP_BINS)
        return cls(channels, -(-n // width), width, n)

    def add(self, name: str, steps: np.ndarray, psnr: np.ndarray, rel: np.ndarray, below: np.ndarray | None) -> None:
        """Frames at time `steps` (B,) of field `name`: per channel their PSNR, relative L2 error (B, C; NaN:
        none) and whether each is below the floor (B, C bool, or None: no floor)."""
        t = self.table[name]
        b = np.asarray(steps, dtype=np.int64) // self.width
        for c in range(t.shape[1]):
            p, r = psnr[:, c], rel[:, c]
            has, fin, hr = ~np.isnan(p), np.isfinite(p), ~np.isnan(r)
            np.add.at(t[:, c, FRAMES], b, 1)
            np.add.at(t[:, c, N_PSNR], b[fin], 1)
            np.add.at(t[:, c, PSNR_SUM], b[fin], p[fin])
            np.minimum.at(t[:, c, PSNR_MIN], b[has], p[has])
            np.add.at(t[:, c, N_REL], b[hr], 1)
            np.add.at(t[:, c, REL_SUM], b[hr], r[hr])
            np.maximum.at(t[:, c, REL_MAX], b[hr], r[hr])
            if below is not None:
                np.add.at(t[:, c, BELOW], b, below[:, c].astype(np.float64))

    def to_json(self) -> dict[str, Any]:
        """The figures as a part's result carries them (JSON, journaled)."""
        fields = {k: v.tolist() for k, v in self.table.items()}
        return {"width": self.width, "bins": self.bins, "steps": self.steps, "fields": fields}

    @classmethod
    def merged(cls, parts: list[dict[str, Any] | None]) -> StepFigures | None:
        """The figures of a whole pack from its parts' `to_json` (None unless every part has them: a part journaled
        by an older version, resumed, has none, and figures of some frames would pass for all of them)."""
        given = [p for p in parts if p]
        if not given or len(given) != len(parts):
            return None
        out = cls({}, given[0]["bins"], given[0]["width"], given[0].get("steps"))
        for p in given:
            for name, rows in p["fields"].items():
                t = np.asarray(rows, dtype=np.float64)
                if name not in out.table:
                    out.table[name] = t
                    continue
                o = out.table[name]
                for col in (FRAMES, N_PSNR, PSNR_SUM, N_REL, REL_SUM, BELOW):
                    o[..., col] += t[..., col]
                o[..., PSNR_MIN] = np.minimum(o[..., PSNR_MIN], t[..., PSNR_MIN])
                o[..., REL_MAX] = np.maximum(o[..., REL_MAX], t[..., REL_MAX])
        return out

    def record(self) -> dict[str, Any]:
        """The manifest's record: per field, bin and channel [frames, frames with a finite PSNR, PSNR min (None:
        no frame has one), their mean, frames with a relative L2 error, its mean and max, frames below the floor],
        PSNRs rounded down and errors up."""
        from dctdata.format.manifest import figure

        fields = {}
        for name, t in self.table.items():
            rows = []
            for bin_ in t:
                row = []
                for frames, n, lo, s, nr, rs, rm, below in bin_.tolist():
                    row.append(
                        [
                            int(frames),
                            int(n),
                            None if lo == np.inf and n == 0 else figure(lo, "down"),
                            figure(s / n, "down") if n else None,
                            int(nr),
                            figure(rs / nr, "up") if nr else None,
                            figure(rm, "up") if nr else None,
                            int(below),
                        ]
                    )
                rows.append(row)
            fields[name] = rows
        return {"steps": self.steps, "step_width": self.width, "fields": fields}

    @classmethod
    def from_manifest(cls, m: Manifest) -> StepFigures | None:
        """The figures a trajectory pack recorded (None: none recorded)."""
        rec = m.pack.get(FIDELITY_OVER_TIME)
        if not isinstance(rec, dict) or not isinstance(rec.get("fields"), dict) or not rec["fields"]:
            return None
        first = next(iter(rec["fields"].values()))
        out = cls({}, len(first), int(rec.get("step_width", 1)), rec.get("steps"))
        for name, rows in rec["fields"].items():
            t = cls._empty(len(rows), len(rows[0]) if rows else 0)
            for i, row in enumerate(rows):
                for c, (frames, n, lo, mean, nr, rmean, rmax, below) in enumerate(row):
                    lo = math.inf if lo in (None, "inf") else float(lo)
                    t[i, c] = [frames, n, lo, n * (mean or 0.0), nr, nr * (rmean or 0.0), rmax or 0.0, below]
            out.table[name] = t
        return out

    def rows(self, ranges: list[tuple[int, int]], fields: list[FieldSpec] | None = None) -> list[dict[str, Any]]:
        """One row per field, channel and step range [a, b) (each widened to whole bins): frames, PSNR min and
        mean, relative L2 mean and max, frames below the floor. `fields`: their channel names and floors."""
        specs = {f.name: f for f in fields or ()}
        out = []
        for name, t in self.table.items():
            f = specs.get(name)
            given = f.attrs.get("channels") if f is not None else None
            names: list[Any] = given if isinstance(given, list) else []
            floor = f.codec.min_psnr if f is not None and f.codec is not None else None
            for c in range(t.shape[1]):
                for a, b in ranges:
                    lo, hi = a // self.width, -(-b // self.width)
                    part = t[lo:hi, c]
                    if not len(part):
                        continue
                    n, nr = part[:, N_PSNR].sum(), part[:, N_REL].sum()
                    low = part[:, PSNR_MIN].min()
                    out.append(
                        {
                            "field": name,
                            "channel": c,
                            "name": names[c] if c < len(names) else None,
                            "steps": (lo * self.width, min(hi * self.width, self.steps)),
                            "frames": int(part[:, FRAMES].sum()),
                            "psnr_min": None if low == np.inf and n == 0 else float(low),
                            "psnr_mean": float(part[:, PSNR_SUM].sum() / n) if n else None,
                            "rel_l2_mean": float(part[:, REL_SUM].sum() / nr) if nr else None,
                            "rel_l2_max": float(part[:, REL_MAX].max()) if nr else None,
                            "below": int(part[:, BELOW].sum()),
                            "floor": floor,
                        }
                    )
        return out


def step_ranges(spec: Any, steps: int) -> list[tuple[int, int]]:
    """Step ranges [a, b) over trajectories of `steps` steps: None (DEFAULT_STEP_RANGES near-equal ranges), a
    count N, or 'A:B,C:D' (B left out: to the end; the CLI's --step-ranges) / a list of (A, B) pairs."""
    if spec is None or isinstance(spec, int) or (isinstance(spec, str) and spec.strip().isdigit()):
        n = DEFAULT_STEP_RANGES if spec is None else int(spec)
        if n < 1:
            raise DctDataError(f"--step-ranges: expected a count >= 1 or ranges A:B,C:D. Got {spec!r}")
        n = min(n, steps)
        edges = [round(i * steps / n) for i in range(n + 1)]
        return [(a, b) for a, b in itertools.pairwise(edges) if b > a]
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    out = []
    for item in items:
        try:
            a, b = item.split(":") if isinstance(item, str) else item
            a, b = int(a), steps if b in ("", None) else int(b)
        except (TypeError, ValueError):
            raise DctDataError(
                f"--step-ranges: expected a count or ranges of steps A:B,C:D (B left out: to the end). Got {spec!r}"
            ) from None
        if a >= steps:
            raise DctDataError(
                f"--step-ranges: expected ranges that start before step {steps} (the longest trajectory has {steps} "
                f"steps). Got a range from step {a} in {spec!r}"
            )
        if not 0 <= a < b:
            raise DctDataError(f"--step-ranges: expected 0 <= A < B in each range A:B. Got {a}:{b} in {spec!r}")
        out.append((a, min(b, steps)))
    return out


def time_table(rows: list[dict[str, Any]]) -> list[str]:
    """The rows of `StepFigures.rows` as a markdown table (pack summary, info, verify)."""
    lines = [
        "| field | channel | steps | frames | PSNR min dB | PSNR mean dB | rel. L2 mean | rel. L2 max | below floor |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        ch = f"{r['channel']}" + (f" {r['name']}" if r["name"] else "")
        floor = "-" if r["floor"] is None else f"{r['below']} (floor {r['floor']:.2f} dB)"
        lines.append(
            f"| {r['field']} | {ch} | {r['steps'][0]}..{r['steps'][1] - 1} | {r['frames']} | {num(r['psnr_min'])} | "
            f"{num(r['psnr_mean'])} | {num(r['rel_l2_mean'], '{:.4g}')} | {num(r['rel_l2_max'], '{:.4g}')} | {floor} |"
        )
    return lines


def floor_problems(figures: StepFigures, fields: list[FieldSpec], source: str = "recorded at pack time") -> list[str]:
    """One line per field, channel and step bin holding frames below the field's per-sample floor."""
    out = []
    for r in figures.rows([(i * figures.width, (i + 1) * figures.width) for i in range(figures.bins)], fields):
        if r["below"] and r["floor"] is not None:
            ch = f"channel {r['channel']}" + (f" ({r['name']})" if r["name"] else "")
            out.append(
                f"field {r['field']!r} {ch} steps {r['steps'][0]}..{r['steps'][1] - 1}: expected every frame's PSNR >= "
                f"the floor {r['floor']:.2f} dB. Got {r['below']} frame(s) below, the lowest {num(r['psnr_min'])} dB "
                f"({source})"
            )
    return out


def time_lines(m: Manifest, ranges: Any = None) -> list[str]:
    """The table of a trajectory pack's recorded figures per field, channel and step range (`step_ranges`
    of `ranges`); [] for a pack without them."""
    figures = StepFigures.from_manifest(m)
    if figures is None:
        return []
    return time_table(figures.rows(step_ranges(ranges, figures.steps), list(m.fields)))
