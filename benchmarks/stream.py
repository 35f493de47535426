"""`python -m benchmarks stream`: DataLoader samples/s of dctdata packs against the peers, from a local
directory and from a loopback HTTP server throttled to a bandwidth (a stand-in for an object store).

One synthetic set (`benchmarks.loader.synthetic`, float32 (1, S, S)) is stored as a dctdata
webdataset pack, a dctdata zarr pack (calibrated int8 at a target PSNR) and, raw float32, by each peer
of `benchmarks.loader_peers` (webdataset .npy shards, zarr via tensorstore and zarr-python, LitData and
MosaicML Streaming where installed). Each is read for `epochs` shuffled epochs through
`DataLoader(num_workers=W, batch_size=B)`; rows report the best epoch's samples/s locally and over
HTTP (peers without an HTTP reader: "-"), the stored bytes per sample and the body bytes the server
sent per sample delivered. Locally every loader first runs one untimed epoch, then the timed epochs
of all loaders alternate, one round at a time, so every row sees the same machine states; over HTTP
(one throttled server per row) and for the "+ Decompress" rows, each row's epochs run in turn.

"coefficients only" rows stop at what the loader yields: coefficients for dctdata, float32 arrays for
the peers (the device's side is excluded). The "+ Decompress" rows also decode on the CPU in the main
process, once with torch's default thread count there and once with `balance_threads(W)` (the cores
the workers leave free), to show what oversubscription costs.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import time
import warnings
from collections.abc import Callable

import numpy as np
import torch
from loopback import LoopbackServer

from benchmarks.loader import synthetic  # one generator for both loader benches
from benchmarks.loader_peers import peers


def _first_tensor(batch) -> torch.Tensor:
    while not isinstance(batch, torch.Tensor):
        batch = next(iter(batch.values())) if isinstance(batch, dict) else batch[0]
    return batch


def _epoch(loader, to_output: Callable) -> tuple[int, float]:
    n, t0 = 0, time.perf_counter()
    with torch.inference_mode():
        for batch in loader:
            n += to_output(batch).shape[0]
    return n, time.perf_counter() - t0


def _stored_bytes(root: str) -> int:
    skip = {"manifest.json", "shards.txt"}
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(root) for f in fs if f not in skip)


def _time(make_loader: Callable, to_output: Callable, epochs: int, server: LoopbackServer | None):
    """(samples per epoch, best samples/s, server bytes per sample delivered or None)."""
    from dctdata.loaders.distributed import set_epoch

    loader = make_loader()
    best, count, sent = float("inf"), 0, None
    for e in range(epochs):
        set_epoch(loader, e)
        if server is not None:
            server.reset()
        count, dt = _epoch(loader, to_output)
        if server is not None and count:
            sent = server.bytes_sent / count
        best = min(best, dt)
    return count, count / best if count else 0.0, sent


def _time_alternating(cases: dict[str, tuple[Callable, Callable]], epochs: int) -> dict[str, tuple[int, float]]:
    """{name: (samples per epoch, best samples/s)} for local loaders `cases` (name: (make_loader,
    to_output)), timed side by side: every loader runs one untimed epoch first (its persistent workers
    start), then each round times one epoch of every loader in turn, so all rows see the machine in the
    same states (a shared machine's speed moves within minutes; one row after another did not)."""
    from dctdata.loaders.distributed import set_epoch

    loaders = {name: make() for name, (make, _) in cases.items()}  # their workers end with this call
    best = {name: (0, float("inf")) for name in cases}
    for e in range(epochs + 1):
        for name, loader in loaders.items():
            set_epoch(loader, e)
            count, dt = _epoch(loader, cases[name][1])
            if e and dt < best[name][1]:
                best[name] = (count, dt)
    return {name: (count, count / dt if count else 0.0) for name, (count, dt) in best.items()}


def run_stream_bench(
    n=512,
    size=256,
    samples_per_shard=64,
    workers=2,
    batch=32,
    epochs=2,
    quant="int8",
    target_psnr=40.0,
    rate=25e6,
    decode=True,
    only=None,
):
    """Rows of dicts: name, samples, local_sps, http_sps, stored_per_sample, http_per_sample (bytes);
    and a dict of facts (codec, threads, sha256 rate). `rate` caps the HTTP server in bytes/s; `only`
    keeps the rows whose name contains one of its strings."""
    import dctdata
    from dctdata.loaders.distributed import make_loader
    from dctdata.loaders.threads import balance_threads
    from dctdata.loaders.wds_dataset import DCTWebDataset
    from dctdata.loaders.zarr_dataset import DCTZarrDataset
    from dctdata.stages import ZSTD_MAX

    warnings.filterwarnings("ignore", message=".*worker processes in total.*")
    warnings.filterwarnings("ignore", message=".*NumPy array is not writable.*")  # the peers' read-only arrays
    logging.getLogger("asyncio").setLevel(logging.CRITICAL)  # aiohttp sessions closed at exit, not errors
    default_threads = torch.get_num_threads()
    rows = []
    with tempfile.TemporaryDirectory() as d:
        x = synthetic(n, size)
        src = os.path.join(d, "src.npy")
        np.save(src, x)
        common = dict(quant=quant, target_psnr=target_psnr, quiet=True)
        m = dctdata.pack(
            src,
            os.path.join(d, "wds"),
            format="webdataset",
            writer_options={"samples_per_shard": samples_per_shard},
            **common,
        )
        dctdata.pack(src, os.path.join(d, "zarr"), format="zarr", **common)
        zstd = dict(common, lossless=dict(ZSTD_MAX))  # `--lossless zstd`: bytes traded for decode speed
        wds_zstd = {"samples_per_shard": samples_per_shard}
        dctdata.pack(src, os.path.join(d, "wds-zstd"), format="webdataset", writer_options=wds_zstd, **zstd)
        dctdata.pack(src, os.path.join(d, "zarr-zstd"), format="zarr", **zstd)
        cases = []  # (name, directory under d, open(root) -> loader factory, to_output, http?)

        def loader_for(ds, map_style):
            if map_style:
                return lambda: make_loader(ds, batch, num_workers=workers, persistent_workers=workers > 0)
            return lambda: torch.utils.data.DataLoader(
                ds, batch_size=batch, num_workers=workers, persistent_workers=workers > 0
            )

        coeffs = lambda b: b[0][0] if isinstance(b[0], (list, tuple)) else b[0]  # noqa: E731 - (q, side) pairs
        wds_loader = lambda r: loader_for(DCTWebDataset(r, buffer_size=256), False)  # noqa: E731
        zarr_loader = lambda r: loader_for(DCTZarrDataset(r), True)  # noqa: E731
        for suffix, stage in (("", ""), (", --lossless zstd", "-zstd")):
            cases.append((f"dctdata webdataset{suffix}", f"wds{stage}", wds_loader, coeffs, True))
            cases.append((f"dctdata zarr{suffix}", f"zarr{stage}", zarr_loader, coeffs, True))
        for p in peers():
            if only and not any(o in p.name for o in only):
                continue
            out = os.path.join(d, p.name.split()[-1].strip("()").lower())
            p.write(x, out, samples_per_shard)
            cases.append(
                (
                    p.name,
                    os.path.relpath(out, d),
                    lambda r, p=p: loader_for(p.open(r, batch), p.map_style),
                    _first_tensor,
                    p.http,
                )
            )
        makers = {name: (open_loader(os.path.join(d, rel)), output) for name, rel, open_loader, output, _ in cases}
        local = _time_alternating(makers, epochs)
        for name, rel, open_loader, to_output, http in cases:
            root = os.path.join(d, rel)
            count, local_sps = local[name]
            http_sps = sent = None
            if http and rate is not None:
                with LoopbackServer(d, rate=rate) as server:  # one per case: no connection outlives its case
                    _, http_sps, sent = _time(open_loader(f"{server.url}/{rel}"), to_output, epochs, server)
            rows.append(
                {
                    "name": name + (" (coefficients)" if name.startswith("dctdata") else ""),
                    "samples": count,
                    "local_sps": local_sps,
                    "http_sps": http_sps,
                    "stored_per_sample": _stored_bytes(root) / n,
                    "http_per_sample": sent,
                }
            )
        if decode:  # the CPU decode in the main process, with the default and the balanced thread count
            for threads_label, set_threads in (
                (f"torch default, {default_threads}", lambda: torch.set_num_threads(default_threads)),
                ("balance_threads", lambda: balance_threads(workers)),
            ):
                set_threads()
                label = (
                    f"{threads_label} thread(s)"
                    if "default" in threads_label
                    else f"{torch.get_num_threads()} thread(s), balance_threads({workers})"
                )
                for name, rel, ds in (
                    ("dctdata webdataset", "wds", DCTWebDataset(os.path.join(d, "wds"), buffer_size=256)),
                    ("dctdata zarr", "zarr", DCTZarrDataset(os.path.join(d, "zarr"))),
                ):
                    layer = ds.decompressor()
                    count, sps, _ = _time(
                        loader_for(ds, rel == "zarr"), lambda b, layer=layer: layer(b[0]), epochs, None
                    )
                    rows.append(
                        {
                            "name": f"{name} + Decompress on CPU (main: {label})",
                            "samples": count,
                            "local_sps": sps,
                            "http_sps": None,
                            "stored_per_sample": _stored_bytes(os.path.join(d, rel)) / n,
                            "http_per_sample": None,
                        }
                    )
            torch.set_num_threads(default_threads)
    blob = os.urandom(32 << 20)
    t0 = time.perf_counter()
    hashlib.sha256(blob).hexdigest()
    meta = {
        "n": n,
        "size": size,
        "codec": m.fields[0].codec,
        "shards": len(m.layout["shards"]),
        "default_threads": default_threads,
        "sha_GBps": len(blob) / (time.perf_counter() - t0) / 1e9,
    }
    return rows, meta


def format_rows(rows, rate=25e6) -> str:
    base = next((r for r in rows if r["name"].startswith("raw float32 .npy shards")), None)
    http = f"HTTP {rate / 1e6:g} MB/s" if rate else "HTTP"
    lines = [
        f"| source | samples/epoch | local samples/s | vs raw webdataset | {http} samples/s | vs raw webdataset | "
        f"stored KiB/sample | {http}: KiB sent/sample |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def ratio(r, key):
        if base is None or r[key] is None or not base[key]:
            return "-"
        return f"{r[key] / base[key]:.2f}x"

    for r in rows:
        hs = "-" if r["http_sps"] is None else f"{r['http_sps']:.0f}"
        sent = "-" if r["http_per_sample"] is None else f"{r['http_per_sample'] / 1024:.1f}"
        lines.append(
            f"| {r['name']} | {r['samples']} | {r['local_sps']:.0f} | {ratio(r, 'local_sps')} | {hs} | "
            f"{ratio(r, 'http_sps')} | {r['stored_per_sample'] / 1024:.1f} | {sent} |"
        )
    return "\n".join(lines)
