"""`python -m benchmarks fit-speed`: the context coder's fit time inside a default pack (`lossless="auto"`), and the
whole pack's time and bytes, for sets from tiny to large, beside an older source tree in the same run (issue 44).

    python -m benchmarks fit-speed [--before TREE] [--sets tiny,fields,fmri,big] [--big-slices 256] [--json PATH]

Each set is packed by `dctdata.pack(x, out, max_rel_error=1e-3, quiet=True)` in a fresh subprocess per version
(after a one-slice pack that loads the imports), this checkout's first, then `--before`'s (a source tree of the
older version with its C extensions built in place, put first on PYTHONPATH). `fit` is the wall time of every
`CtxCodec.fit` call of that pack (the settings search's estimates and the stage's fit), `calls` their number;
`stored` the bytes of every file the pack wrote, `chunks` an MD5 of the files but the JSON ones (the same digest:
the same coded bytes). The sets:
- `tiny`: 4 x 2 x 16 x 16 float32 normal noise;
- `fields`: 16 smooth 64 x 64 float32 fields with a little noise;
- `fmri`: the 48 int16 96 x 128 slices of nibabel's example4d (`tests/shipped_images.fmri_slices`; needs nibabel);
- `big`: `--big-slices` smooth 512 x 512 float32 slices (256: 256 MiB).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SETS = ("tiny", "fields", "fmri", "big")

# Runs in the subprocess: argv = set name, big slices, work folder; prints one JSON line.
_CHILD = r"""
import hashlib, json, os, sys, time
import numpy as np
import dctdata
from dctdata.entropy import ctxrans

which, slices, work = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rng = np.random.default_rng(0)
if which == "tiny":
    x = rng.standard_normal((4, 2, 16, 16)).astype(np.float32)
elif which == "fields":
    t = np.linspace(0, 6.28, 64)
    x = np.stack([np.sin(t[:, None] * (1 + i % 4)) * np.cos(t[None, :] * (1 + i // 4))
                  + 0.01 * rng.standard_normal((64, 64)) for i in range(16)]).astype(np.float32)
elif which == "fmri":
    sys.path.insert(0, sys.argv[4])
    from shipped_images import fmri_slices
    x = fmri_slices()
else:
    t = np.linspace(0, 20, 512, dtype=np.float32)
    base = np.sin(t[:, None]) * np.cos(1.3 * t[None, :])
    x = np.empty((slices, 512, 512), np.float32)
    for i in range(slices):
        x[i] = base * (1 + 0.01 * i) + 0.05 * np.sin(0.1 * i + t[None, :] * 3)
dctdata.pack(x[:1], os.path.join(work, "warm.zarr"), max_rel_error=1e-3, quiet=True)
acc = [0.0, 0]
orig = ctxrans.CtxCodec.fit.__func__
def timed(cls, *a, **k):
    t0 = time.perf_counter()
    try:
        return orig(cls, *a, **k)
    finally:
        acc[0] += time.perf_counter() - t0
        acc[1] += 1
ctxrans.CtxCodec.fit = classmethod(timed)
out = os.path.join(work, "out.zarr")
t0 = time.perf_counter()
dctdata.pack(x, out, max_rel_error=1e-3, quiet=True)
seconds = time.perf_counter() - t0
digest, stored = hashlib.md5(), 0
for r, _, fs in sorted(os.walk(out)):
    for f in sorted(fs):
        data = open(os.path.join(r, f), "rb").read()
        stored += len(data)
        if not f.endswith(".json"):
            digest.update(data)
print(json.dumps({"set": which, "shape": list(x.shape), "fit_s": acc[0], "calls": acc[1], "pack_s": seconds,
                  "stored": stored, "chunks": digest.hexdigest()[:12], "raw": x.nbytes}))
"""


def run_one(which: str, slices: int, tree: Path | None, work: Path) -> dict:
    """One pack of one set in a fresh interpreter: this checkout's dctdata, or `tree`'s put first on PYTHONPATH."""
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(tree), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    work.mkdir(parents=True, exist_ok=True)
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, which, str(slices), str(work), str(ROOT / "tests")],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode:
        raise RuntimeError(f"fit-speed {which} ({tree or 'this checkout'}): {out.stderr.strip()[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(prog="python -m benchmarks fit-speed", description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--before", type=Path, default=None, help="source tree of the older version (default: %(default)s: none)"
    )
    ap.add_argument("--sets", default="tiny,fields,fmri", help=f"comma-separated, of {SETS} (default: %(default)s)")
    ap.add_argument(
        "--big-slices", type=int, default=256, help="512 x 512 slices of the big set (default: %(default)s)"
    )
    ap.add_argument("--workdir", type=Path, default=None, help="scratch folder (default: %(default)s: a temporary one)")
    ap.add_argument("--json", type=Path, default=None, help="write the rows here (default: %(default)s)")
    args = ap.parse_args(argv)
    sets = [s for s in args.sets.split(",") if s]
    bad = sorted(set(sets) - set(SETS))
    if bad:
        ap.error(f"--sets: expected names of {SETS}. Got {bad}")
    import tempfile

    rows = []
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        for which in sets:
            versions = [("this", None)] + ([("before", args.before)] if args.before else [])
            for label, tree in versions:
                row = {"version": label, **run_one(which, args.big_slices, tree, Path(tmp) / f"{which}-{label}")}
                rows.append(row)
                print(
                    f"{which:7s} {label:7s} {tuple(row['shape'])!s:18s} fit {row['fit_s']:7.2f} s "
                    f"({row['calls']} calls)  pack {row['pack_s']:7.2f} s  stored {row['stored']} B  "
                    f"chunks {row['chunks']}",
                    flush=True,
                )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return rows
