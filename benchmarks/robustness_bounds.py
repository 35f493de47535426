"""What each resource bomb of issue 30 costs a reader now: peak RSS growth and the longest block.

    python -m benchmarks robustness-bounds            # every case, a Markdown table
    python -m benchmarks robustness-bounds --json out.json --case http_drip

The packs and hostile servers are made once in this process; each case then runs in a fresh child
process, which first does the same call on an honest pack (so imports, codec tables and thread pools are
in its baseline), then the hostile call. "RSS growth" is how far the hostile call raised the child's peak
resident memory (ru_maxrss) above that baseline; "block" is how long the call ran before it returned or
raised. The servers run here, not in the child, so their buffers are not counted. Tests assert the
behaviour (tests/robustness/test_hostile_*.py); this script measures it, for docs/robustness.md.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

CAP = 512 << 20  # what an endless answer sends at most (the reader must stop long before)


# Hostile packs ---------------------------------------------------------------------------------------------
def _reseal(root: str, edit) -> None:
    from dctdata.format.manifest import manifest_seal

    path = os.path.join(root, "manifest.json")
    m = json.load(open(path))
    edit(m)
    m["seal"] = manifest_seal(m)
    json.dump(m, open(path, "w"))


def _rehash(m: dict, root: str, rel: str) -> None:
    data = open(os.path.join(root, rel), "rb").read()
    m["checksums"][rel] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}


def make_packs(tmp: str) -> dict[str, str]:
    """The honest packs and their hostile copies; returns {name: path}."""
    import dctdata

    rng = np.random.default_rng(0)
    y = np.cumsum(np.cumsum(rng.standard_normal((64, 3, 64, 64)), 2), 3).astype(np.float32)
    np.save(f"{tmp}/img.npy", y)
    out = {"zarr": f"{tmp}/zarr", "webdataset": f"{tmp}/webdataset"}
    dctdata.pack(f"{tmp}/img.npy", out["zarr"], target_psnr=35, quant="int8", quiet=True)
    dctdata.pack(f"{tmp}/img.npy", out["webdataset"], format="webdataset", target_psnr=35, quant="int8", quiet=True)

    out["chunk_bomb"] = shutil.copytree(out["zarr"], f"{tmp}/chunk_bomb")  # item 5: chunk = shard = 2^22

    def chunk(m):
        m["layout"]["arrays"]["image"] = {"chunk": 1 << 22, "shard": 1 << 22}
        zj = json.load(open(f"{tmp}/chunk_bomb/image/zarr.json"))
        zj["chunk_grid"]["configuration"]["chunk_shape"][0] = 1 << 22
        zj["codecs"][0]["configuration"]["chunk_shape"][0] = 1 << 22
        json.dump(zj, open(f"{tmp}/chunk_bomb/image/zarr.json", "w"))
        _rehash(m, f"{tmp}/chunk_bomb", "image/zarr.json")

    _reseal(out["chunk_bomb"], chunk)
    out["shape_bomb"] = f"{tmp}/shape_bomb"  # item 17: a (2^20, 2^20) array field
    x = rng.standard_normal((10, 1, 16, 16)).astype(np.float32)
    np.savez(f"{tmp}/src.npz", image=x, label=np.arange(10))
    dctdata.pack(f"{tmp}/src.npz", out["shape_bomb"], cf=4, quiet=True)
    _reseal(out["shape_bomb"], lambda m: m["fields"][-1].update(kind="array", shape=[1 << 20, 1 << 20]))
    out["size_liar"] = shutil.copytree(out["webdataset"], f"{tmp}/size_liar")  # item 7: cached shards claimed 4 GiB

    def lie(m):
        from dctdata.format.compact import unpack_checksum

        m["checksums"] = {k: {**unpack_checksum(e, k), "bytes": 4 << 30} for k, e in m["checksums"].items()}
        for s in m["layout"]["shards"]:
            s.pop("bytes", None)

    _reseal(out["size_liar"], lie)
    out["entropy_bomb"] = shutil.copytree(out["webdataset"], f"{tmp}/entropy_bomb")  # item 6: 3 x 16384^2 declared

    def huge(m):
        f = m["fields"][0]
        f["shape"] = [3, 16384, 16384]
        f["codec"].update(height=16384, width=16384)

    _reseal(out["entropy_bomb"], huge)
    return out


# Hostile servers -------------------------------------------------------------------------------------------
class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a) -> None:
        pass

    def do_GET(self) -> None:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self._answer(True)

    def do_HEAD(self) -> None:
        self._answer(False)

    def _answer(self, body: bool) -> None:
        srv, rel = self.server, self.path.lstrip("/")
        path = os.path.join(srv.root, rel)
        if not os.path.isfile(path):
            self.send_error(404)
            return
        data = open(path, "rb").read()
        honest = rel.endswith(("zarr.json", "manifest.json"))
        ranged = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range") or "")
        if srv.mode in ("endless", "endless206") and not honest:
            self.send_response(206 if srv.mode == "endless206" and ranged else 200)
            if srv.mode == "endless206" and ranged:
                self.send_header("Content-Range", f"bytes {ranged.group(1)}-{len(data) - 1}/{len(data)}")
            self.send_header("Connection", "close")
            self.end_headers()
            sent, block = 0, bytes(1 << 20)
            while body and sent < CAP:
                self.wfile.write(block)
                sent += len(block)
            return
        if srv.mode == "drip":
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            for i in range(len(data) if body else 0):
                self.wfile.write(data[i : i + 1])
                self.wfile.flush()
                time.sleep(1.5)
            return
        if ranged and srv.mode != "norange":
            a, b = int(ranged.group(1)), int(ranged.group(2) or len(data) - 1)
            data = data[a : b + 1]
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {a}-{a + len(data) - 1}/{os.path.getsize(path)}")
        else:
            self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)


def serve(root: str, mode: str) -> str:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads, srv.root, srv.mode = True, root, mode
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{srv.server_address[1]}"


def serve_stdlib(root: str) -> str:
    """`python -m http.server`: no Range support."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *a) -> None:
            pass

    handler = functools.partial(Quiet, directory=root)
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{srv.server_address[1]}"


# The cases (run in a child) ---------------------------------------------------------------------------------
def _read_all(ds) -> int:
    return sum(1 for _ in ds) if not hasattr(ds, "__getitems__") else len(ds.__getitems__(list(range(len(ds)))))


def case_calls(name: str, env: dict) -> tuple:
    """(issue item, what it does, honest call, hostile call) of a case."""
    import dctdata

    p = env["packs"]
    if name == "zarr_chunk_bomb":
        return 5, "a chunk declared as 2^22 samples (1 GiB decoded)", \
            lambda: dctdata.open_dataset(p["zarr"])[0], lambda: dctdata.open_dataset(p["chunk_bomb"])[0]  # fmt: skip
    if name == "array_shape_bomb":
        return 17, "an array field declared (2^20, 2^20)", \
            lambda: dctdata.open_dataset(p["zarr"])[0], lambda: dctdata.open_dataset(p["shape_bomb"])[0]  # fmt: skip
    if name in ("http_endless_200", "http_endless_206"):
        ds = dctdata.open_dataset(env["urls"][name])  # manifest and zarr.json are served honestly
        honest = dctdata.open_dataset(env["urls"]["http_honest"])
        what = f"range requests answered {name[-3:]} with an endless body, batch of 2"
        return 4, what, lambda: honest.__getitems__([0, 5]), lambda: ds.__getitems__([0, 5])
    if name == "http_no_range":
        return 14, "a server without Range support (python -m http.server), one sample", \
            lambda: dctdata.open_dataset(env["urls"]["http_honest"])[0], \
            lambda: dctdata.open_dataset(env["urls"][name])[0]  # fmt: skip
    if name == "http_drip":
        return 8, "a server dripping the manifest, 1 byte / 1.5 s, timeout=2 s (deadline 10 s)", \
            lambda: dctdata.open_dataset(env["urls"]["http_honest"], storage_options={"timeout": 2}), \
            lambda: dctdata.open_dataset(env["urls"][name], storage_options={"timeout": 2})  # fmt: skip
    if name == "cache_fifo":
        cache = env["fifo_cache"]
        return 7, "a FIFO at every shard's name in cache_dir, one epoch", \
            lambda: _read_all(dctdata.open_dataset(p["webdataset"], shuffle=False)), \
            lambda: _read_all(dctdata.open_dataset(p["webdataset"], cache_dir=cache, shuffle=False))  # fmt: skip
    if name == "cache_size_lie":
        cache = env["good_cache"]
        return 7, "cached shards claimed 4 GiB each by a manifest, one epoch", \
            lambda: _read_all(dctdata.open_dataset(p["webdataset"], cache_dir=cache, shuffle=False)), \
            lambda: _read_all(dctdata.open_dataset(p["size_liar"], cache_dir=cache, shuffle=False,
                                                   cache_limit=64 << 30))  # fmt: skip
    if name == "entropy_shape_bomb":
        lossless = json.load(open(os.path.join(p["webdataset"], "manifest.json")))["fields"][0].get("lossless")
        stage = (lossless or {}).get("id")
        what = f"a webdataset sample's shape edited to 3 x 16384 x 16384 (stage {stage}), first sample"
        return 6, what, lambda: next(iter(dctdata.open_dataset(p["webdataset"], shuffle=False))), \
            lambda: next(iter(dctdata.open_dataset(p["entropy_bomb"], shuffle=False)))  # fmt: skip
    if name == "zarr_reopen_fds":

        def reopen():
            for _ in range(100):
                dctdata.open_dataset(p["zarr"]).__getitems__([0, 9, 17, 30])
            return f"{len(os.listdir('/proc/self/fd'))} fds open"

        return 9, "100 x (open_dataset, read a batch) of a zarr pack", lambda: reopen(), reopen
    if name == "manifest_too_big":
        import xarray as xr

        x = np.zeros((8, 16, 16), np.float32)
        small = xr.Dataset({"t2m": (("time", "y", "x"), x, {"history": "h"})})
        big = xr.Dataset({"t2m": (("time", "y", "x"), x, {"history": "h" * (65 << 20)})})
        out = os.path.join(env["tmp"], "too_big")

        def pack(ds):
            return lambda: dctdata.pack(ds, out, cf=4, quiet=True, sample_dim="time", overwrite=True)

        return 10, "pack --overwrite of a source with a 65 MiB attribute", pack(small), pack(big)
    raise SystemExit(f"unknown case {name!r}")


CASES = ("zarr_chunk_bomb", "array_shape_bomb", "entropy_shape_bomb", "http_endless_200", "http_endless_206",
         "http_no_range", "http_drip",
         "cache_fifo", "cache_size_lie", "zarr_reopen_fds", "manifest_too_big")  # fmt: skip


def run_case(name: str, env: dict) -> dict:
    import resource

    item, what, honest, hostile = case_calls(name, env)
    try:
        honest()
    except Exception as exc:  # reported, the hostile call is what is measured
        print(f"honest call failed: {exc}", file=sys.stderr)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t = time.perf_counter()
    try:
        got = hostile()
        outcome = f"returned ({got})" if isinstance(got, str) else "returned"
    except Exception as exc:  # the outcome is what is reported
        outcome = f"{type(exc).__name__}: {str(exc)[:150]}"
    block = time.perf_counter() - t
    grow = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024
    return {"case": name, "item": item, "what": what, "outcome": outcome, "rss_growth_mib": round(grow, 1),
            "block_s": round(block, 2)}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks robustness-bounds", description=__doc__.splitlines()[0])
    ap.add_argument("--case", action="append", choices=CASES, help="run only these cases (default: all)")
    ap.add_argument("--json", default=None, help="also write the rows as JSON here")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:  # in the child: one case, the environment from the parent
        env = json.loads(os.environ["ROBUSTNESS_BOUNDS_ENV"])
        print(json.dumps(run_case(args.child, env)))
        return
    tmp = tempfile.mkdtemp(prefix="robustness-bounds-")
    try:
        packs = make_packs(tmp)
        urls = {
            "http_honest": serve(packs["zarr"], "ok"),
            "http_endless_200": serve(packs["zarr"], "endless"),
            "http_endless_206": serve(packs["zarr"], "endless206"),
            "http_no_range": serve_stdlib(packs["zarr"]),
            "http_drip": serve(packs["webdataset"], "drip"),
        }
        fifo_cache, good_cache = os.path.join(tmp, "fifo_cache"), os.path.join(tmp, "good_cache")
        os.makedirs(fifo_cache)
        from dctdata.format.compact import unpack_checksum

        for k, e in json.load(open(os.path.join(packs["webdataset"], "manifest.json")))["checksums"].items():
            os.mkfifo(os.path.join(fifo_cache, unpack_checksum(e, k)["sha256"] + ".tar"))
        env = {"tmp": tmp, "packs": packs, "urls": urls, "fifo_cache": fifo_cache, "good_cache": good_cache}
        rows = []
        for name in args.case or CASES:
            r = subprocess.run(
                [sys.executable, __file__, "--child", name],
                env={**os.environ, "ROBUSTNESS_BOUNDS_ENV": json.dumps(env)},
                capture_output=True,
                text=True,
                timeout=900,
            )
            if r.returncode:
                raise SystemExit(f"{name}: the child failed:\n{r.stderr[-3000:]}")
            rows.append(json.loads(r.stdout.strip().splitlines()[-1]))
            print(f"{name}: {rows[-1]}", file=sys.stderr)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("| item | bomb | outcome | peak RSS growth | longest block |\n|---:|---|---|---:|---:|")
    for r in rows:
        outcome = r["outcome"].split(":")[0] if not r["outcome"].startswith("returned") else r["outcome"]
        print(f"| {r['item']} | {r['what']} | {outcome} | {r['rss_growth_mib']:.0f} MiB | {r['block_s']:.2f} s |")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
