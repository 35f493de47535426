"""Which zstd level for stored coefficients: bytes, encode and decode speed of each level on the same
coefficients, so the `--lossless zstd` default (zstd-19) and the array fields' zstd-9 rest on a measurement.

    python -m benchmarks zstd-levels [--sets em,atoms,beam,camera,astronaut] [--levels 1,3,9,12,13,16,19,22]
        [--samples 64] [--size 256] [--target-psnr 40] [--repeat 5] [--json PATH]

The sets are those of benchmarks/entropy_decode_speed.py (`load_set`), each packed by the product
(`dctdata.pack(..., target_psnr=T)`) and its stored integer coefficients read back; every level then codes
them one stream per sample, as a pack stores them, through numcodecs' Zstd (the pack's codec). Decode is
`dctdata.stages.Stage.decode` (the readers' per-chunk call). One thread; every pass times every level in
turn (encode, then decode), best of `--repeat` passes. Columns: stored bytes per sample and against
zstd-9, encode and decode MB/s of float32-equivalent output (samples x C x H x W x 4 bytes / s, per core),
and the decode speed against zstd-9 as the median over passes of their time ratio in the same pass.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

from benchmarks.entropy_decode_speed import add_set_arguments, check_set_arguments, packed_coefficients, run_sets
from dctdata.stages import DEFAULT_CODEC, get_stage
from dctdata.stages.zstd import LEVELS as ZSTD_LEVELS

SETS = ("em", "atoms", "beam", "camera", "astronaut")
LEVELS = (1, 3, 9, 12, 13, 16, 19, 22)
BASE = 9  # the array fields' level, the reference of the ratio columns


def measure_set(name: str, x: np.ndarray, levels: tuple[int, ...], target_psnr: float, repeat: int, workdir: str):
    """Rows of one set: one per level."""
    ds, field, q = packed_coefficients(name, x, target_psnr, workdir)
    n = ds.manifest.samples
    shape = (1, *q.shape[1:])
    samples = [np.ascontiguousarray(q[i : i + 1]) for i in range(n)]
    codecs = {level: get_stage(dict(DEFAULT_CODEC, level=level)) for level in levels}
    enc: dict[int, list[float]] = {level: [] for level in levels}
    dec: dict[int, list[float]] = {level: [] for level in levels}
    streams: dict[int, list[bytes]] = {}
    for _ in range(repeat):
        for level, codec in codecs.items():
            t0 = time.perf_counter()
            streams[level] = [codec.encode(s) for s in samples]
            enc[level].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            got = [codec.decode(b, shape, q.dtype, f"{name} zstd-{level}") for b in streams[level]]
            dec[level].append(time.perf_counter() - t0)
            if not all(np.array_equal(g, s) for g, s in zip(got, samples)):
                raise RuntimeError(f"{name}: zstd-{level} did not decode to the coefficients")
    floats = n * int(np.prod(field.shape)) * 4
    base_bytes = sum(map(len, streams[BASE])) / n if BASE in streams else None
    rows = []
    for level in levels:
        # paired: zstd-9's decode time over this level's in the same pass, median over passes
        paired = float(np.median([b / t for b, t in zip(dec[BASE], dec[level])])) if base_bytes else None
        stored = sum(map(len, streams[level])) / n
        rows.append(
            {
                "set": name,
                "level": level,
                "dtype": str(q.dtype),
                "samples": n,
                "sample_shape": list(field.shape),
                "bytes_per_sample": stored,
                "bytes_vs_base": stored / base_bytes if base_bytes else None,
                "encode_seconds": min(enc[level]),
                "decode_seconds": min(dec[level]),
                "encode_mb_s": floats / min(enc[level]) / 1e6,
                "decode_mb_s": floats / min(dec[level]) / 1e6,
                "decode_vs_base": paired,
            }
        )
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        f"| set | dtype | level | stored B/sample | bytes vs zstd-{BASE} | encode MB/s (float32, 1 core) "
        f"| decode MB/s (float32, 1 core) | decode speed vs zstd-{BASE} (median of passes) |"
    )
    lines = [head, "|" + "---|" * 8]
    fmt = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    for r in rows:
        lines.append(
            f"| {r['set']} | {r['dtype']} | zstd-{r['level']} | {r['bytes_per_sample']:.0f} | "
            f"{fmt(r['bytes_vs_base'])} | {r['encode_mb_s']:.0f} | {r['decode_mb_s']:.0f} | "
            f"{fmt(r['decode_vs_base'])} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="python -m benchmarks zstd-levels", description=__doc__.split("\n\n")[0])
    add_set_arguments(p, SETS)
    p.add_argument("--levels", default=",".join(map(str, LEVELS)))
    a = p.parse_args(argv)
    check_set_arguments(a)
    words = [w.strip() for w in a.levels.split(",") if w.strip()]
    if not words or not all(w.isdigit() and ZSTD_LEVELS[0] <= int(w) <= ZSTD_LEVELS[1] for w in words):
        raise SystemExit(f"--levels: expected zstd levels in {ZSTD_LEVELS[0]}..{ZSTD_LEVELS[1]}. Got {a.levels!r}")
    levels = tuple(dict.fromkeys(int(w) for w in words))

    def measure(name: str, x: np.ndarray, workdir: str) -> list[dict[str, Any]]:
        return measure_set(name, x, levels, a.target_psnr, a.repeat, workdir)

    return run_sets(a, measure, table)


if __name__ == "__main__":
    main()
