"""Issue 12, "calibration speed": pack time and settings-search time on the 40-frame TIFF case, before and after.

    python -m benchmarks calibration-time --before-python PATH [--frames 40] [--size 492x656] [--target-psnr 40]
        [--repeat 1] [--tty-check] [--json PATH] [--workdir DIR]

The case: 40 frames of the optical_damage stand-in (`dctdata.datasets.optical_damage`, 492 x 656
uint16), written as 16-bit TIFFs (tifffile; the image-folder source reads them with Pillow as I;16) in
class subfolders `intact/` and `damaged/` as the real set has them (the label becomes a `label` field).
Then, for each interpreter (`--before-python`, a python whose `import dctdata` is the version before
this wave, and this one), one after the other, alternating which goes first on every repeat:

1. `python -m dctdata pack FOLDER OUT --target-psnr T` (a fresh OUT, cwd a temporary folder outside any
   checkout, stderr captured, so no terminal): its wall time, and what it wrote on stderr;
2. the settings search alone: that version's `calibrate_report(x, quant=None, target_psnr=T)` on the
   pack's calibration subset (`dctdata.preprocess.pack.calibration_indices`: all 40 frames here), timed
   inside a subprocess of that interpreter (neither version's manifest records the search time, so both
   are measured the same way);
3. what the pack reached: the dataset PSNR of all frames (the project's: each frame against its own range),
   decoded by that version's own reader and `decompressor()`; the manifest's per-frame minimum and
   median; and the stored bytes (every file the manifest lists plus manifest.json).

`--tty-check` also runs this version's pack on a pseudo-terminal and says whether the "calibrate image"
progress bar appeared (the bar is only drawn when stderr is a terminal). Times are wall-clock on
whatever machine runs this; the load average before and after is printed with them.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import termios
import time
from typing import Any

import numpy as np
import torch

from dctdata.datasets import OPTICAL_SHAPE, optical_damage
from dctdata.encoder.calibrate import dataset_psnr
from dctdata.preprocess.plan import calibration_indices

SEARCH = r"""
import json, sys, time
import numpy as np, torch
from dctdata.encoder.calibrate import calibrate_report
x = torch.from_numpy(np.load(sys.argv[1], allow_pickle=False))
t0 = time.perf_counter()
r = calibrate_report(x, quant=None, target_psnr=float(sys.argv[2]))
seconds = time.perf_counter() - t0
s = r.spec
print(json.dumps({"seconds": seconds, "setting": f"cf={s.cf} {s.mask} {s.dtype}",
                  "evaluations": getattr(r, "evaluations", None), "candidates": len(r.candidates),
                  "psnr": r.dataset_psnr}))
"""
DECODE = r"""
import sys
import numpy as np, torch
import dctdata
from torch.utils.data import default_collate
ds = dctdata.open_dataset(sys.argv[1])
batch = default_collate([ds[i] for i in range(len(ds))])
with torch.inference_mode():
    x_hat = ds.decompressor()(batch[0])
np.save(sys.argv[2], x_hat.numpy().astype(np.float32))
"""


def write_frames(folder: str, n: int, shape: tuple[int, int]) -> np.ndarray:
    """n optical_damage frames as 16-bit TIFFs in class subfolders (sorted names, as the source reads
    them); returns the frames (N, 1, H, W) in the source's reading order."""
    import tifffile

    ds = optical_damage(n=n, shape=shape)
    samples = [ds[i] for i in range(n)]
    order = []
    for cls, label in (("damaged", 1), ("intact", 0)):
        os.makedirs(os.path.join(folder, cls), exist_ok=True)
        for i, s in enumerate(samples):
            if int(s["label"]) == label:
                tifffile.imwrite(os.path.join(folder, cls, f"frame-{i:03d}.tif"), s["image"][0])
                order.append(s["image"])
    return np.stack(order)


THREADS: int | None = None  # --threads: torch/BLAS threads of every child run (None: their defaults)


def child_env(threads: int | None) -> dict[str, str]:
    """The environment of a child run of another install: no PYTHONPATH/PYTHONHOME of this one, and with
    `threads` the torch/BLAS thread count (torch reads OMP_NUM_THREADS for its intra-op pool, as the BLAS does)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    if threads is not None:
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))
    return env


def _python_run(python: str, args: list[str], cwd: str) -> subprocess.CompletedProcess:
    return subprocess.run([python, *args], cwd=cwd, capture_output=True, text=True, env=child_env(THREADS))


def _last_line(proc: subprocess.CompletedProcess, what: str) -> str:
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"{what}: exit {proc.returncode}: {tail}")
    return proc.stdout.strip().splitlines()[-1]


def stored_bytes(out: str) -> tuple[int, dict[str, Any]]:
    """(the bytes of every file of the pack, the manifest) of a pack of any format version: counted on disk,
    since format 8 lists no zarr.json and writes its checksum entries as "<digest>:<bytes>" strings."""
    with open(os.path.join(out, "manifest.json")) as fh:
        manifest = json.load(fh)
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(out) for f in fs), manifest


def run_version(label: str, python: str, folder: str, subset: str, frames: np.ndarray, target: float, tmp: str):
    """Pack, search and decode with one interpreter; returns its row."""
    out = os.path.join(tmp, f"{label}.dct")
    shutil.rmtree(out, ignore_errors=True)
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = _python_run(python, ["-m", "dctdata", "pack", folder, out, "--target-psnr", f"{target:g}"], tmp)
    pack_s = time.perf_counter() - t0
    if not os.path.exists(os.path.join(out, "manifest.json")):  # the pack itself failed
        _last_line(proc, f"{label} pack")
    size, manifest = stored_bytes(out)
    search = json.loads(_last_line(_python_run(python, ["-c", SEARCH, subset, f"{target:g}"], tmp), f"{label} search"))
    rec = os.path.join(tmp, f"{label}-x_hat.npy")
    dec = _python_run(python, ["-c", DECODE, out, rec], tmp)
    psnr, decode_error = None, None
    if dec.returncode == 0:
        x_hat = np.load(rec, allow_pickle=False)
        psnr = dataset_psnr(torch.from_numpy(frames.astype(np.float32)), torch.from_numpy(x_hat))
        os.remove(rec)
    else:  # reported in the table, not hidden: the pack's own reader could not read it back
        decode_error = (dec.stderr.strip().splitlines() or ["no output"])[-1][:200]
    field = next(f for f in manifest["fields"] if f["kind"] == "dct")
    codec, stats = field["codec"], manifest["stats"][field["name"]]
    row = {
        "version": label,
        "python": python,
        "pack_seconds": pack_s,
        "search_seconds": search["seconds"],
        "search": search,
        "setting": f"cf={codec['cf']} {codec['mask']} {codec['dtype']}",
        "lossless": field["lossless"].get("id"),
        "psnr": psnr,
        "decode_error": decode_error,
        "psnr_min": stats["psnr_min"],
        "psnr_median": stats["psnr_median"],
        "stored_bytes": size,
        "ratio_source": frames.nbytes / size,
        "stderr_lines": [line for line in proc.stderr.replace("\r", "\n").splitlines() if line.strip()],
        "stdout": proc.stdout.strip(),
        "exit": proc.returncode,  # a pack can be committed and the CLI still fail afterwards (its summary)
        "load_before": load,
        "load_after": os.getloadavg()[0],
    }
    shutil.rmtree(out)
    return row


def tty_check(folder: str, target: float, tmp: str) -> dict[str, Any]:
    """Run this version's pack with stdout and stderr on a pseudo-terminal; did the bar appear?"""
    out = os.path.join(tmp, "tty.dct")
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # a 0-column terminal hides tqdm
    cmd = [sys.executable, "-m", "dctdata", "pack", folder, out, "--target-psnr", f"{target:g}"]
    proc = subprocess.Popen(cmd, cwd=tmp, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave)
    os.close(slave)
    chunks: list[bytes] = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    status = proc.wait()
    shutil.rmtree(out, ignore_errors=True)
    text = b"".join(chunks).decode(errors="replace")
    return {"exit": status, "calibrate_bar": "calibrate image" in text, "output_chars": len(text)}


def _db(v) -> str:
    return "-" if v is None else f"{v:.2f}"


def table(rows: list[dict[str, Any]]) -> str:
    head = [
        "dctdata",
        "run",
        "pack wall s",
        "settings search s",
        "chosen",
        "dataset PSNR dB",
        "frame PSNR min / median",
        "stored bytes",
        "ratio vs uint16",
        "stderr lines",
        "load avg before/after",
    ]
    lines = ["| " + " | ".join(head) + " |", "|---|---:|" + "---:|" * 2 + "---|" + "---:|" * 6]
    for r in rows:
        lines.append(
            f"| {r['version']} | {r['run']} | {r['pack_seconds']:.1f} | {r['search_seconds']:.1f} | "
            f"{r['setting']} {r['lossless']} | {_db(r['psnr'])} | {_db(r['psnr_min'])} / {_db(r['psnr_median'])} | "
            f"{r['stored_bytes']:,} | {r['ratio_source']:.1f} | {len(r['stderr_lines'])} | "
            f"{r['load_before']:.1f} / {r['load_after']:.1f} |"
        )
    return "\n".join(lines)


def speedups(rows: list[dict[str, Any]]) -> dict[str, float]:
    def med(version: str, key: str) -> float:
        return float(np.median([r[key] for r in rows if r["version"] == version]))

    return {k: med("before", k) / med("current", k) for k in ("pack_seconds", "search_seconds")}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks calibration-time", description=__doc__.splitlines()[0])
    p.add_argument("--before-python", required=True, help="a python whose `import dctdata` is the old version")
    p.add_argument("--frames", type=int, default=40)
    p.add_argument("--size", default="x".join(map(str, OPTICAL_SHAPE)), help="frame HxW (default the real 492x656)")
    p.add_argument("--target-psnr", type=float, default=40.0)
    p.add_argument("--repeat", type=int, default=1, help="runs of each version, alternating which goes first")
    p.add_argument("--tty-check", action="store_true", help="also run this version's pack on a pseudo-terminal")
    p.add_argument("--json", help="write every number here")
    p.add_argument("--workdir", help="where the frames and packs go (default: a temporary folder, removed)")
    p.add_argument("--threads", type=int, help="torch/BLAS threads of both versions' runs (default: theirs)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    global THREADS
    THREADS = args.threads
    with tempfile.TemporaryDirectory(prefix="calibration-time-", dir=args.workdir) as tmp:
        folder = os.path.join(tmp, "frames")
        frames = write_frames(folder, args.frames, tuple(int(v) for v in args.size.split("x")))
        n, c, h, w = frames.shape
        idx = calibration_indices(n, c * h * w)
        subset = os.path.join(tmp, "subset.npy")
        np.save(subset, frames[idx].astype(np.float32))
        versions = [("before", args.before_python), ("current", sys.executable)]
        rows = []
        for run in range(args.repeat):
            for label, python in versions if run % 2 == 0 else versions[::-1]:
                row = run_version(label, python, folder, subset, frames, args.target_psnr, tmp)
                rows.append({"run": run + 1, **row})
                print(f"{label} run {run + 1}: pack {row['pack_seconds']:.1f} s", file=sys.stderr, flush=True)
        tty = tty_check(folder, args.target_psnr, tmp) if args.tty_check else None
    speed = speedups(rows)
    lines = [
        f"{n} frames {h}x{w} uint16 ({frames.nbytes / 1e6:.1f} MB) as 16-bit TIFFs, `python -m dctdata pack FOLDER OUT "
        f"--target-psnr {args.target_psnr:g}`; settings search = `calibrate_report(x, quant=None, target_psnr="
        f"{args.target_psnr:g})` on the pack's {len(idx)}-frame calibration subset; {os.cpu_count()} CPU(s), "
        f"{'default' if args.threads is None else args.threads} thread(s)",
        "",
        table(rows),
        "",
        f"Speed-up (median before / median current): pack {speed['pack_seconds']:.1f}x, settings search "
        f"{speed['search_seconds']:.1f}x",
    ]
    for r in rows:
        if r["decode_error"]:
            lines.append(f"- {r['version']} run {r['run']}: reading the pack back failed: {r['decode_error']}")
        if r["exit"] != 0:
            lines.append(f"- {r['version']} run {r['run']}: the pack was written but the command exited {r['exit']}")
        if r["stderr_lines"]:
            lines.append(
                f"- {r['version']} run {r['run']} stderr (captured, no terminal): {r['stderr_lines'][-1][:160]}"
            )
    if tty is not None:
        lines.append(
            f"- on a pseudo-terminal the current pack {'drew' if tty['calibrate_bar'] else 'did not draw'} the "
            f"'calibrate image' progress bar (exit status {tty['exit']})"
        )
    print("\n".join(lines))
    payload = {
        "config": {k: v for k, v in vars(args).items() if k != "json"},
        "frames": [n, c, h, w],
        "calibration_subset": len(idx),
        "rows": rows,
        "speedup": speed,
        "tty": tty,
    }
    payload = json.loads(json.dumps(payload, default=float), parse_constant=lambda v: None)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(payload, fh, indent=1)
            fh.write("\n")
    return payload


if __name__ == "__main__":
    main()
