"""The markdown for docs/benchmarks/ from one `python -m benchmarks gpu --json` run: the device, the date,
the command, the loader rows (`decode="cpu"` beside `decode="device"`, raw float32, nvJPEG), issue 28's
must-show figures and the decode table, all from that one JSON file, so the page shows one run.

    python -m benchmarks gpu --sizes 256 1024 --cf 2 4 8 --repeat 10 --json gpu_out/bench_gpu.json
    python -m benchmarks gpu-doc-table gpu_out/bench_gpu.json > section.md
"""

from __future__ import annotations

import argparse
import json
import os

from dctdata.errors import DctDataError

KEYS = ("device", "date", "command", "settings", "decode_rows", "pipeline_rows", "must_show", "complete")


def load(path: str) -> dict:
    """The run recorded at `path`, checked to be what `python -m benchmarks gpu --json` writes."""
    with open(path, encoding="utf-8") as fh:
        try:
            run = json.load(fh)
        except json.JSONDecodeError as exc:
            raise DctDataError(f"{path}: expected JSON from `python -m benchmarks gpu --json`. Got {exc}") from None
    missing = [k for k in KEYS if k not in run] if isinstance(run, dict) else list(KEYS)
    if missing:
        raise DctDataError(
            f"{path}: expected the JSON `python -m benchmarks gpu --json` writes (keys {', '.join(KEYS)}). "
            f"Got one without {', '.join(missing)}"
        )
    return run


def render(run: dict, decode: bool = True) -> str:
    """The section for docs/benchmarks/ (markdown)."""
    from benchmarks.gpu import format_must_show, format_pipeline_rows

    s = run["settings"]
    rows = run["pipeline_rows"]
    took = run.get("seconds", {}).get("total")
    commit = f" (commit `{run['commit']}`)" if run.get("commit") else ""
    lines = [
        f'## decode="device" on {run["device"]}',
        "",
        f"- **Command:** `{run['command']}`",
        f"- **Machine:** {run['device']}, {run.get('cpus', '?')} CPU cores, torch {run.get('torch', '?')}",
        f"- **Recorded:** {run['date']}{commit}" + ("" if took is None else f"; the run took {took:.0f} s"),
    ]
    if not run["complete"]:
        lines.append(f"- **Incomplete:** the run stopped after {len(rows)} loader rows; the figures below are those.")
    lines += [
        "",
        f"{s['samples']} synthetic 1×{s['size']}² micrographs (8-bit range) packed at {s['target_psnr']:g} dB, read "
        f"through `make_loader(pin_memory=True)` → `DevicePrefetcher` → float32 model input; each epoch reads "
        f"max({s['epoch_samples']}, 4 × workers × batch) samples (no sample twice in a batch), best of "
        f"{s['epochs']} epochs after one untimed. B/sample to device is counted on the batches that crossed "
        '(coefficient tensors with `decode="cpu"`, `StoredBatch.nbytes` with `decode="device"`, the JPEG bytes); '
        f"decode ms/batch is the median time of the decode call ({run.get('timer', 'CUDA events')} around "
        "`ds.decompressor()`, `decode_jpeg`; for the `DecodeAhead` rows, a group's decode time on its side stream "
        "over its batches).",
        "",
        format_pipeline_rows(rows) if rows else "No loader rows were recorded.",
        "",
        "Issue 28's must-show figures from this run:",
        "",
        format_must_show(run["must_show"]) if run["must_show"] else "None could be computed from this run.",
    ]
    if decode and run["decode_rows"]:
        lines += [
            "",
            "`Decompress` GB/s of output, int8 coefficients in, batches of about 64 MB of output, 50 calls "
            "queued between two CUDA events (the device's rate):",
            "",
        ]
        lines.append(decode_table(run["decode_rows"]))
    return "\n".join(lines) + "\n"


def decode_table(rows: list[dict]) -> str:
    """One line per size and CF: GB/s of each dtype and codec, and v2 over v1."""
    dtypes = list(dict.fromkeys(r["dtype"] for r in rows))
    codecs = list(dict.fromkeys(r["codec"] for r in rows))
    by = {(r["size"], r["cf"], r["dtype"], r["codec"]): r["GBps"] for r in rows}
    cols = [(d, c) for d in dtypes for c in codecs]
    ratio = "v1" in codecs and "v2" in codecs
    head = ["size", "CF", *(f"{d} {c}" for d, c in cols), *([f"{d} v2/v1" for d in dtypes] if ratio else [])]
    lines = ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for size, cf in dict.fromkeys((r["size"], r["cf"]) for r in rows):
        cells = [f"{size}²", str(cf), *(_gbps(by.get((size, cf, d, c))) for d, c in cols)]
        if ratio:
            for d in dtypes:
                v1, v2 = by.get((size, cf, d, "v1")), by.get((size, cf, d, "v2"))
                cells.append("—" if not v1 or v2 is None else f"{v2 / v1:.2f}x")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _gbps(v) -> str:
    return "—" if v is None else f"{v:.1f}"


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(prog="python -m benchmarks gpu-doc-table", description=__doc__.split("\n\n")[0])
    ap.add_argument("json", metavar="IN.json", help="what `python -m benchmarks gpu --json IN.json` wrote")
    ap.add_argument("--out", metavar="PATH", help="write the markdown here (default: print it)")
    ap.add_argument("--no-decode", action="store_true", help="leave out the Decompress GB/s table")
    args = ap.parse_args(argv)
    text = render(load(args.json), decode=not args.no_decode)
    if args.out:
        tmp = f"{args.out}.tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, args.out)
    else:
        print(text, end="")
    return text
