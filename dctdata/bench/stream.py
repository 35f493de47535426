"""`dctdata bench stream`: samples/s streaming webdataset shards through DataLoader into Decompress.

One synthetic set (`dctdata.bench.loader.synthetic`, float32 (1, S, S)) stored four ways and read for one
epoch each through `DataLoader(num_workers=W, batch_size=B)`, every batch turned into the float32
(B, 1, S, S) tensor a model consumes (in the main process):
- dctdata webdataset shards, local directory (DCTWebDataset: sha256-verified, shuffled) -> Decompress;
- the same shards over a loopback HTTP server (http.server on 127.0.0.1, fsspec streaming);
- dctdata zarr (DCTZarrDataset, shuffled sampler) -> Decompress;
- raw float32 `.npy` shards (webdataset's own WebDataset pipeline, shard+sample shuffle, np.load).
Reported per row: samples/s (best of --epochs), stored bytes per sample, and sha256's share of a
verified epoch (hashing rate measured here on the same bytes).
"""

from __future__ import annotations

import functools
import hashlib
import http.server
import io
import os
import tempfile
import threading
import time

import numpy as np
import torch

from dctdata.bench.loader import synthetic  # one generator for both loader benches


def _raw_shards(x: np.ndarray, out: str, per_shard: int) -> None:
    from webdataset import TarWriter

    os.makedirs(out)
    for s, a in enumerate(range(0, len(x), per_shard)):
        with TarWriter(os.path.join(out, f"raw-{s:06d}.tar"), encoder=False, mtime=0) as tw:
            for i in range(a, min(a + per_shard, len(x))):
                buf = io.BytesIO()
                np.save(buf, x[i], allow_pickle=False)
                tw.write({"__key__": f"{i:09d}", "x.npy": buf.getvalue()})


def _raw_dataset(root: str):
    import webdataset as wds

    urls = sorted(os.path.join(root, f) for f in os.listdir(root))

    def load(sample):
        return torch.from_numpy(np.load(io.BytesIO(sample["x.npy"]), allow_pickle=False))

    return wds.DataPipeline(
        wds.SimpleShardList(urls, seed=0),
        wds.split_by_worker,
        wds.tarfile_to_samples(),
        wds.shuffle(256, 64),
        wds.map(load),
    )


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def _epoch(loader, to_model) -> tuple[int, float]:
    n, t0 = 0, time.perf_counter()
    with torch.inference_mode():
        for batch in loader:
            x = to_model(batch)
            n += x.shape[0]
    return n, time.perf_counter() - t0


def _stored_bytes(root: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(root) for f in fs if f != "manifest.json")


def run_stream_bench(
    n=512, size=256, samples_per_shard=64, workers=2, batch=32, epochs=2, quant="int8", target_psnr=40.0, threads=1
):
    """Rows of dicts: name, samples, samples_s, bytes_per_sample, sha_share (None where not verified)."""
    import dctdata
    from dctdata.loaders.wds_dataset import DCTWebDataset
    from dctdata.loaders.zarr_dataset import DCTZarrDataset

    torch.set_num_threads(threads)
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
        _raw_shards(x, os.path.join(d, "raw"), samples_per_shard)
        blob = os.urandom(64 << 20)
        t0 = time.perf_counter()
        hashlib.sha256(blob).hexdigest()
        sha_rate = len(blob) / (time.perf_counter() - t0)

        server = http.server.ThreadingHTTPServer(
            ("127.0.0.1", 0), functools.partial(_Quiet, directory=os.path.join(d, "wds"))
        )
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        url = f"http://127.0.0.1:{server.server_address[1]}"
        try:
            cases = []
            wds_local = DCTWebDataset(os.path.join(d, "wds"), buffer_size=256)
            layer = wds_local.decompressor()
            decode = lambda b: layer(b[0])  # noqa: E731
            cases.append(("dctdata webdataset, local", wds_local, decode, {}, os.path.join(d, "wds"), True))
            cases.append(
                (
                    "dctdata webdataset, HTTP loopback",
                    DCTWebDataset(url, buffer_size=256),
                    decode,
                    {},
                    os.path.join(d, "wds"),
                    True,
                )
            )
            zds = DCTZarrDataset(os.path.join(d, "zarr"))
            zlayer = zds.decompressor()
            cases.append(
                (
                    "dctdata zarr (map-style, shuffled)",
                    zds,
                    lambda b: zlayer(b[0]),
                    {"shuffle": True},
                    os.path.join(d, "zarr"),
                    False,
                )
            )
            cases.append(
                (
                    "raw float32 .npy shards (webdataset)",
                    _raw_dataset(os.path.join(d, "raw")),
                    lambda b: b,
                    {},
                    os.path.join(d, "raw"),
                    False,
                )
            )
            for name, ds, to_model, kw, root, verified in cases:
                loader = torch.utils.data.DataLoader(
                    ds, batch_size=batch, num_workers=workers, persistent_workers=workers > 0, **kw
                )
                best, count = float("inf"), 0
                for e in range(epochs):
                    if hasattr(ds, "set_epoch"):
                        ds.set_epoch(e)
                    count, dt = _epoch(loader, to_model)
                    best = min(best, dt)
                stored = _stored_bytes(root)
                rows.append(
                    {
                        "name": name,
                        "samples": count,
                        "samples_s": count / best,
                        "bytes_per_sample": stored / n,
                        # sha256 work per epoch, spread over the workers, as a share of the epoch time
                        "sha_share": (stored / sha_rate / workers) / best if verified else None,
                    }
                )
        finally:
            server.shutdown()
            server.server_close()
            thread.join(timeout=5)
    meta = {
        "n": n,
        "size": size,
        "codec": m.fields[0].codec,
        "sha_GBps": sha_rate / 1e9,
        "shards": len(m.layout["shards"]),
    }
    return rows, meta


def format_rows(rows) -> str:
    lines = [
        "| source | samples/epoch | samples/s | stored KiB/sample | sha256 share of epoch |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        share = "-" if r["sha_share"] is None else f"{100 * r['sha_share']:.1f}%"
        lines.append(
            f"| {r['name']} | {r['samples']} | {r['samples_s']:.0f} | {r['bytes_per_sample'] / 1024:.1f} | {share} |"
        )
    return "\n".join(lines)
