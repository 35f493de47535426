"""`python -m benchmarks rd`: compression ratio at equal PSNR, dctdata against ZFP, SZ3, SPERR, JPEG 2000 and JPEG.

Items are arrays that ship inside installed packages and synthetic SciML stand-ins (`benchmarks.items`),
each packed as small tiles and whole. dctdata's points are real packs at a sweep of `--target-psnr`
(`benchmarks.ours`); each peer sweeps its own knob (`benchmarks.peers`). PSNR is the project's:
per item (channel of a sample) against its own range, and a pack's PSNR the dataset-level
10 log10(1 / mean(MSE / range^2)). CR = float32 bytes / every stored byte. log(CR) is interpolated
linearly in PSNR at each level (`benchmarks.curves`); per pack the ratio of our CR to the peer's,
then geometric means over packs, overall and per group.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from collections.abc import Callable

import torch
from tqdm import tqdm

from benchmarks.curves import Point, best_of, cr_at, geomean
from benchmarks.items import MAX_TILES, MODES, Pack, load_items, packs_of
from benchmarks.ours import TARGETS, dctdata_points
from benchmarks.peers import BEST_PEERS, PEERS
from dctdata.errors import DctDataError
from dctdata.parse import parse_choice, parse_int, parse_number

LEVELS = (35.0, 40.0, 45.0)
OURS = "dctdata"
BEST = "best"  # the best of BEST_PEERS, per pack and level
GROUPS: dict[str, Callable[[PackResult], bool]] = {
    "all packs": lambda r: True,
    "tiles": lambda r: r.mode == "tiles",
    "whole items": lambda r: r.mode == "whole",
    "single-channel": lambda r: r.shape[0] == 1,
    "multi-channel": lambda r: r.shape[0] > 1,
}


@dataclasses.dataclass
class PackResult:
    """Every point of every codec on one pack; curves are named "<codec>" or "<codec>-<variant>"."""

    name: str
    mode: str
    group: str
    samples: int
    shape: tuple[int, int, int]  # (C, H, W) of a sample
    raw_bytes: int
    curves: dict[str, list[Point]]

    def cr(self, codec: str, level: float) -> float:
        """CR at `level` dB of a codec (its best variant there), or of the best of BEST_PEERS; NaN if unknown."""
        if codec == BEST:
            return best_of([self.cr(p, level) for p in BEST_PEERS])
        return best_of(
            [
                cr_at(points, self.raw_bytes, level)
                for curve, points in self.curves.items()
                if curve == codec or curve.startswith(codec + "-")
            ]
        )


@dataclasses.dataclass
class Config:
    items: list[str] | None = None
    modes: tuple[str, ...] = MODES
    peers: tuple[str, ...] = tuple(PEERS)
    targets: tuple[float, ...] = TARGETS
    levels: tuple[float, ...] = LEVELS
    max_tiles: int = MAX_TILES
    threads: int = 1

    def __post_init__(self) -> None:
        self.modes = tuple(dict.fromkeys(parse_choice(m, "--modes", MODES) for m in self.modes))
        self.peers = tuple(dict.fromkeys(parse_choice(p, "--peers", PEERS) for p in self.peers))
        self.targets = _numbers(self.targets, "--targets")
        self.levels = _numbers(self.levels, "--levels")
        self.max_tiles = parse_int(self.max_tiles, "--max-tiles", minimum=1, type_error=DctDataError)
        self.threads = parse_int(self.threads, "--threads", minimum=1, type_error=DctDataError)
        if not self.modes:
            raise DctDataError(f"--modes: expected at least one of {MODES}. Got none")
        if len(self.targets) < 2:
            raise DctDataError(f"--targets: expected at least two PSNR targets (a curve). Got {list(self.targets)}")


def _numbers(values, option: str) -> tuple[float, ...]:
    out = tuple(sorted({parse_number(v, option, above=0, type_error=DctDataError) for v in values}))
    if not out:
        raise DctDataError(f"{option}: expected at least one positive number of dB. Got none")
    return out


def run_rd(config: Config, on_pack: Callable[[PackResult], None] | None = None) -> tuple[list[PackResult], list[str]]:
    """Every pack's curves, plus one line per peer or item skipped. `on_pack` sees each pack as it is done."""
    torch.set_num_threads(config.threads)
    missing = {p: PEERS[p].missing() for p in config.peers}
    notes = [line for line in missing.values() if line]
    peers = [PEERS[p] for p in config.peers if missing[p] is None]
    items, skipped = load_items(config.items)
    notes += skipped
    if not items:
        raise DctDataError("items: expected at least one item whose package is installed. Got none")
    packs = packs_of(items, config.modes, config.max_tiles)
    results = []
    with tqdm(total=len(packs) * (1 + len(peers)), desc="bench rd", unit="curve", leave=False) as bar:
        for pack in packs:
            bar.set_postfix_str(f"{pack.name} dctdata")
            curves = {OURS: dctdata_points(pack.x, config.targets)}
            bar.update()
            for peer in peers:
                bar.set_postfix_str(f"{pack.name} {peer.name}")
                curves.update(peer.curves(pack.x, pack.item.u8))
                bar.update()
            result = _result(pack, curves)
            results.append(result)
            if on_pack is not None:
                on_pack(result)
    return results, notes


def _result(pack: Pack, curves: dict[str, list[Point]]) -> PackResult:
    n, c, h, w = pack.x.shape
    return PackResult(pack.name, pack.mode, pack.item.group, n, (c, h, w), pack.raw_bytes, curves)


# Summaries ---------------------------------------------------------------------------------------------
def ratios(results: list[PackResult], peer: str, level: float, group: str = "all packs") -> list[float]:
    """Our CR over the peer's, one per pack of the group where both reach `level`."""
    keep = GROUPS[group]
    out = []
    for r in results:
        ours, theirs = r.cr(OURS, level), r.cr(peer, level)
        if keep(r) and math.isfinite(ours) and math.isfinite(theirs):
            out.append(ours / theirs)
    return out


def speeds(results: list[PackResult], codec: str) -> tuple[float, float]:
    """(encode, decode) MB/s of float32 data over every successful point of the codec, all packs together."""
    raw = enc = dec = 0.0
    for r in results:
        for curve, points in r.curves.items():
            if curve == codec or curve.startswith(codec + "-"):
                for p in points:
                    if p.bytes:
                        raw, enc, dec = raw + r.raw_bytes, enc + p.encode_s, dec + p.decode_s
    mbps = lambda s: raw / s / 1e6 if s > 0 else math.nan  # noqa: E731
    return mbps(enc), mbps(dec)


def _label(codec: str) -> str:
    if codec == OURS:
        return "dctdata (pack at --target-psnr)"
    if codec == BEST:
        return "best of " + ", ".join(PEERS[p].label for p in BEST_PEERS)
    return PEERS[codec].label


def _f(v: float, digits: int = 2) -> str:
    return "-" if not math.isfinite(v) else f"{v:.{digits}f}"


def codec_table(results: list[PackResult], peers: tuple[str, ...], levels: tuple[float, ...]) -> str:
    """One row per peer: geometric mean over packs of our CR / its CR at each level (> 1: we store less)."""
    head = ["codec", *(f"ours/codec {lv:g} dB" for lv in levels), "packs", "encode MB/s", "decode MB/s"]
    rows = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    shown = [OURS, *peers] + ([BEST] if any(p in peers for p in BEST_PEERS) else [])
    for codec in shown:
        gm = [geomean(ratios(results, codec, lv)) for lv in levels]
        counts = "/".join(str(len(ratios(results, codec, lv))) for lv in levels)
        enc, dec = speeds(results, codec) if codec != BEST else (math.nan, math.nan)
        rows.append(f"| {_label(codec)} | " + " | ".join(map(_f, gm)) + f" | {counts} | {_f(enc, 1)} | {_f(dec, 1)} |")
    return "\n".join(rows)


def group_table(results: list[PackResult], peers: tuple[str, ...], levels: tuple[float, ...]) -> str:
    """Per group of packs: our CR over ZFP's and over the best peer's, geometric means."""
    against = [p for p in ("zfp", BEST) if p in peers or (p == BEST and any(b in peers for b in BEST_PEERS))]
    head = ["packs", "n"] + [f"vs {'ZFP' if p == 'zfp' else 'best peer'} {lv:g} dB" for p in against for lv in levels]
    rows = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for group, keep in GROUPS.items():
        n = sum(1 for r in results if keep(r))
        if n:
            cells = [_f(geomean(ratios(results, p, lv, group))) for p in against for lv in levels]
            rows.append(f"| {group} | {n} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def pack_table(results: list[PackResult], peers: tuple[str, ...], level: float) -> str:
    """CR of every codec on every pack at one level ("-": the sweep does not reach it)."""
    best = any(p in peers for p in BEST_PEERS)
    head = ["pack", "samples", "C", OURS, *(PEERS[p].label for p in peers)] + (["ours/best peer"] if best else [])
    rows = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for r in results:
        cells = [_f(r.cr(c, level), 1) for c in (OURS, *peers)]
        if best:
            cells.append(_f(r.cr(OURS, level) / r.cr(BEST, level)))
        rows.append(f"| {r.name} | {r.samples} | {r.shape[0]} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


# JSON --------------------------------------------------------------------------------------------------
def _clean(value):
    """NaN/inf -> None (strict JSON), tuples -> lists."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def to_json(config: Config, results: list[PackResult], notes: list[str]) -> dict:
    """Every point of every pack, the settings and the summary numbers."""
    codecs = [OURS, *config.peers, BEST]
    return _clean(
        {
            "config": dataclasses.asdict(config),
            "notes": notes,
            "summary": {
                group: {
                    codec: {f"{lv:g}": geomean(ratios(results, codec, lv, group)) for lv in config.levels}
                    for codec in codecs
                }
                for group in GROUPS
            },
            "packs": [
                {
                    **dataclasses.asdict(r),
                    "cr": {c: {f"{lv:g}": r.cr(c, lv) for lv in config.levels} for c in codecs},
                }
                for r in results
            ],
        }
    )


def write_json(path: str, config: Config, results: list[PackResult], notes: list[str]) -> None:
    """Write atomically (a temporary sibling, then rename), so an interrupted run leaves the last good file."""
    tmp = f"{path}.partial"
    with open(tmp, "w") as f:
        json.dump(to_json(config, results, notes), f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def report(config: Config, results: list[PackResult], notes: list[str], per_pack: bool, seconds: float) -> str:
    """The markdown the command prints: the codec table, the group table, optionally every pack."""
    items = len({r.name.split("/")[0] for r in results})
    lines = [
        f"{items} item(s), {len(results)} pack(s) ({', '.join(config.modes)}; tiles of 60x76, at most "
        f"{config.max_tiles}); dctdata targets {', '.join(f'{t:g}' for t in config.targets)} dB; "
        f"torch {torch.__version__}, {config.threads} thread(s); {seconds:.0f} s",
        "",
        "Our compression ratio over each codec's at equal dataset PSNR (geometric mean over packs; > 1: dctdata "
        "stores fewer bytes). packs: how many reach each level with both codecs. Speeds are MB/s of float32 over "
        "every sweep point; dctdata's encode is the whole `dctdata.pack` (calibration included), its decode "
        "reading the pack back plus `Decompress`.",
        "",
        codec_table(results, config.peers, config.levels),
        "",
        group_table(results, config.peers, config.levels),
    ]
    if per_pack:
        for lv in config.levels:
            lines += ["", f"Compression ratio vs float32 at {lv:g} dB:", "", pack_table(results, config.peers, lv)]
    lines += [f"- {n}" for n in notes]
    return "\n".join(lines)


def timed_run(config: Config, json_path: str | None = None) -> tuple[list[PackResult], list[str], float]:
    """run_rd, writing the JSON after every pack when asked (a long run keeps what it has measured)."""
    t0 = time.perf_counter()
    done: list[PackResult] = []

    def save(result: PackResult) -> None:
        done.append(result)
        if json_path:
            write_json(json_path, config, done, [])

    results, notes = run_rd(config, on_pack=save)
    if json_path:
        write_json(json_path, config, results, notes)
    return results, notes, time.perf_counter() - t0
