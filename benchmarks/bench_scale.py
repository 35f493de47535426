"""Scale benchmarks for issue 7: pack throughput with 1 and 2 Dask workers (and byte identity), peak
RSS of `dctdata pack` for a 1 GiB and an 8 GiB generated source, and RSS per DataLoader worker.

    python -m benchmarks scale throughput [--size 1gb] [--format zarr]
    python -m benchmarks scale rss
    python -m benchmarks scale loader

Sources are `benchmarks/scale_sources.py` callables (generated on the fly; no disk for the source).
Outputs go to a temporary directory that is deleted afterwards. Settings: --quant int8 --cf 4.
"""

from __future__ import annotations

import argparse
import contextlib
import filecmp
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SIZES = {"256mb": 256 << 20, "1gb": 1 << 30, "8gb": 8 << 30}
PACK = ["--quant", "int8", "--cf", "4", "--quiet"]


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": HERE + os.pathsep + os.environ.get("PYTHONPATH", "")}


def run_pack(size: str, out: str, *extra: str) -> tuple[float, int]:
    """(wall seconds, peak RSS bytes of the pack process tree's largest process) of one `dctdata pack`."""
    import psutil

    cmd = [sys.executable, "-m", "dctdata", "pack", f"scale_sources:fields_{size}", out, *PACK, *extra]
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, env=_env())
    peak = {"main": 0, "children": 0}

    def watch():
        p = psutil.Process(proc.pid)
        while proc.poll() is None:
            try:
                peak["main"] = max(peak["main"], p.memory_info().rss)
                kids = p.children(recursive=True)
                peak["children"] = max([peak["children"], *(k.memory_info().rss for k in kids)])
            except psutil.Error:
                pass
            time.sleep(0.05)

    th = threading.Thread(target=watch, daemon=True)
    th.start()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    th.join()
    dt = time.perf_counter() - t
    if proc.returncode:
        raise SystemExit(f"pack failed: {' '.join(cmd)}")
    return dt, max(usage.ru_maxrss * 1024, peak["main"]), peak["children"]


def same_tree(a: str, b: str) -> bool:
    cmp = filecmp.dircmp(a, b)
    if cmp.left_only or cmp.right_only or cmp.funny_files:
        return False
    _, mismatch, errors = filecmp.cmpfiles(a, b, cmp.common_files, shallow=False)
    return (
        not mismatch and not errors and all(same_tree(os.path.join(a, d), os.path.join(b, d)) for d in cmp.common_dirs)
    )


def throughput(size: str, fmt: str, repeat: int) -> None:
    mb = SIZES[size] / 1e6
    with tempfile.TemporaryDirectory() as tmp:
        best = {}
        for r in range(repeat):
            for w in (1, 2):
                out = os.path.join(tmp, f"w{w}")
                shutil.rmtree(out, ignore_errors=True)
                dt, _, _ = run_pack(size, out, "--workers", str(w), "--format", fmt)
                print(f"  run {r}: --workers {w}: {dt:.2f} s = {mb / dt:.1f} MB/s of source", flush=True)
                best[w] = min(best.get(w, dt), dt)
        print(
            f"{fmt} {size}: 1 worker {mb / best[1]:.1f} MB/s, 2 workers {mb / best[2]:.1f} MB/s, ratio "
            f"{best[1] / best[2]:.2f}x (best of {repeat})"
        )
        print("byte-identical:", same_tree(os.path.join(tmp, "w1"), os.path.join(tmp, "w2")))


def rss(fmt: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for size in ("1gb", "8gb"):
            out = os.path.join(tmp, size)
            dt, peak, _ = run_pack(size, out, "--format", fmt)
            print(
                f"{fmt} {size}: peak RSS {peak / 2**20:.0f} MiB, {dt:.1f} s ({SIZES[size] / 1e6 / dt:.1f} MB/s)",
                flush=True,
            )
            shutil.rmtree(out)


def loader(workers: int) -> None:
    import psutil
    import torch

    import dctdata

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "ds")
        run_pack("1gb", out)
        ds = dctdata.open_dataset(out)
        dl = torch.utils.data.DataLoader(ds, batch_size=64, shuffle=True, num_workers=workers)
        me = psutil.Process()
        peak, n, t = {}, 0, time.perf_counter()
        for batch in dl:
            n += len(batch[0])
            for k in me.children():
                with contextlib.suppress(psutil.Error):
                    peak[k.pid] = max(peak.get(k.pid, 0), k.memory_info().rss)
        dt = time.perf_counter() - t
        print(
            f"zarr 1gb loader: {n} samples in {dt:.1f} s; main RSS {me.memory_info().rss / 2**20:.0f} MiB; "
            f"per-worker peak RSS {[round(v / 2**20) for v in peak.values()]} MiB"
        )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks scale", description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["throughput", "rss", "loader"])
    ap.add_argument("--size", default="1gb", choices=list(SIZES))
    ap.add_argument("--format", default="zarr")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args(argv)
    if a.what == "throughput":
        throughput(a.size, a.format, a.repeat)
    elif a.what == "rss":
        rss(a.format)
    else:
        loader(a.workers)


if __name__ == "__main__":
    main()
