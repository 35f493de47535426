"""The throughput benchmarks' table code, run small on the CPU: `gpu` (which skips without
CUDA; its loader rows: test_bench_gpu.py), the read-path table of `loader` and the peers of `stream`."""

from __future__ import annotations

import pytest
import torch

from benchmarks import gpu
from benchmarks.__main__ import main
from dctdata.stages import ZSTD_MAX


def test_gpu_bench_skips_in_one_line_without_cuda(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["gpu"]) == 0
    assert capsys.readouterr().out == "bench gpu: skipped: no CUDA device (torch.cuda.is_available() is False)\n"


def test_gpu_decode_table_on_the_cpu():
    rows = gpu.decode_rows(
        "cpu", sizes=(16, 24), cfs=(2, 8), dtypes=("float32", "bfloat16"), repeat=1, batch_bytes=1 << 16
    )
    assert [(r["size"], r["cf"], r["dtype"], r["codec"]) for r in rows][:4] == [
        (16, 2, "float32", "v1"), (16, 2, "float32", "v2"), (16, 2, "bfloat16", "v1"), (16, 2, "bfloat16", "v2")
    ]  # fmt: skip
    for r in rows:
        item = 4 if r["dtype"] == "float32" else 2
        assert r["batch"] == (1 << 16) // (r["size"] ** 2 * item)
        assert r["GBps"] == pytest.approx(r["batch"] * r["size"] ** 2 * item / (r["ms"] / 1e3) / 1e9)
        assert r["Gpix"] == pytest.approx(r["GBps"] / item)
    table = gpu.format_decode_rows(rows)
    assert table.splitlines()[2].startswith("| 16² | 2 | float32 | v1 | 64 |") and len(table.splitlines()) == 18


def test_read_path_table():
    from benchmarks.loader import format_batch_rows, run_batch_bench

    rows = run_batch_bench(n=48, size=32, batch=8, target_psnr=35, rounds=1, batches=2)
    names = [r["name"] for r in rows]
    assert names[0].startswith("dctdata zarr reader, default pack (") and names[0].endswith(", 1 thread")
    assert names[1].startswith(names[0].removesuffix("1 thread")) and names[1].endswith(" threads")
    zpack = f"dctdata zarr reader, --lossless zstd pack (zstd-{ZSTD_MAX['level']}) (coefficients)"  # what users pack
    assert {f"{zpack}, 1 thread", f"{zpack}, {names[1].rsplit(', ', 1)[1]}"} <= set(names)
    for path in ("tensorstore, raw float32 zarr", "tensorstore, same zstd pack (no missing-chunk check)"):
        assert {f"{path}, 1 thread", f"{path}, default concurrency"} <= set(names)
    assert {r["threads"] for r in rows} == {"1", "all"} and rows[1]["threads"] == "all"
    assert all(r["ms"] > 0 for r in rows)
    raw = next(r for r in rows if r["name"] == "zarr-python, raw float32 zarr")
    assert raw["bytes_per_sample"] > 32 * 32 * 4  # raw float32 plus zarr metadata
    table = format_batch_rows(rows).splitlines()
    assert sum("| 1.00x |" in line for line in table if "tensorstore, raw" in line) == 2  # one base per setting


def test_stream_table_counts_http_bytes(tmp_path):
    from benchmarks.stream import format_rows, run_stream_bench

    rows, _meta = run_stream_bench(
        n=32, size=32, samples_per_shard=8, workers=0, batch=8, epochs=1, rate=100e6, decode=False, only=["webdataset"]
    )
    by = {r["name"]: r for r in rows}
    assert set(by) == {
        "dctdata webdataset (coefficients)",
        "dctdata zarr (coefficients)",
        "dctdata webdataset, --lossless zstd (coefficients)",
        "dctdata zarr, --lossless zstd (coefficients)",
        "raw float32 .npy shards (webdataset)",
    }
    assert all(r["samples"] == 32 and r["local_sps"] > 0 and r["http_sps"] > 0 for r in rows)
    for name in ("dctdata webdataset (coefficients)", "dctdata webdataset, --lossless zstd (coefficients)"):
        wds = by[name]
        assert wds["http_per_sample"] == pytest.approx(wds["stored_per_sample"], rel=0.01)  # whole shards, once
    assert "| 1.00x |" in format_rows(rows, 100e6)


def test_loopback_counts_a_body_before_the_client_has_it(tmp_path):
    """Once a client has read a response, `bytes_sent` holds it: a reset() after the read never leaves the bytes
    to be counted into the next epoch (test_stream_table_counts_http_bytes failed under load that way). The
    count's lock is held back after the first (request) use until the client has had a second to finish."""
    import threading
    import urllib.request

    from loopback import LoopbackServer

    (tmp_path / "f.bin").write_bytes(bytes(1000))

    class GateLock:
        def __init__(self):
            self.inner, self.uses, self.gate = threading.Lock(), 0, threading.Event()

        def __enter__(self):
            self.uses += 1
            if self.uses > 1:  # the body's count: held back
                self.gate.wait(10)
            self.inner.acquire()

        def __exit__(self, *exc):
            self.inner.release()

    got = {}
    with LoopbackServer(tmp_path) as srv:
        srv._server.lock = lock = GateLock()

        def client():
            got["body"] = urllib.request.urlopen(f"{srv.url}/f.bin", timeout=20).read()
            got["counted"] = srv.bytes_sent

        t = threading.Thread(target=client)
        t.start()
        t.join(1.0)
        lock.gate.set()
        t.join(20)
    assert len(got["body"]) == 1000 and got["counted"] == 1000


def test_stream_local_epochs_alternate_after_one_untimed_epoch():
    from benchmarks.stream import _time_alternating

    log = []

    class Data:
        def __init__(self, name):
            self.name = name

        def set_epoch(self, e):
            log.append((self.name, e))

    class Loader:
        sampler = None

        def __init__(self, name, per_batch):
            self.dataset, self.per_batch = Data(name), per_batch

        def __iter__(self):
            epoch = log[-1][1]
            return iter([torch.zeros(self.per_batch + epoch)] * 2)  # later epochs: more samples

    got = _time_alternating({n: (lambda n=n, k=k: Loader(n, k), lambda b: b) for n, k in (("a", 3), ("b", 5))}, 2)
    assert log == [("a", 0), ("b", 0), ("a", 1), ("b", 1), ("a", 2), ("b", 2)]
    assert got["a"][0] in (8, 10) and got["b"][0] in (12, 14)  # each loader's best timed epoch, never epoch 0
    assert all(sps > 0 for _, sps in got.values())


def test_read_path_cases_take_turns_in_blocks_on_different_batches():
    from benchmarks.loader import _time_interleaved

    log = []
    picks = list(range(10, 16))
    cases = {name: (lambda i, name=name: log.append((name, i, torch.get_num_threads())), None, t) for name, t in
             (("a", 1), ("b", 2), ("c", 1))}  # fmt: skip
    before = torch.get_num_threads()
    try:
        times = _time_interleaved(cases, picks, block=2)
    finally:
        torch.set_num_threads(before)
    turns = [name for _ in range(3) for name in "abc" for _ in range(3)]
    assert [n for n, _, _ in log] == turns  # turns of one untimed and two timed batches
    assert all(t == {"a": 1, "b": 2, "c": 1}[n] for n, _, t in log)  # each under its thread setting
    timed = [entry for k, entry in enumerate(log) if k % 3]
    for name in "abc":  # every case times every batch once
        assert sorted(i for n, i, _ in timed if n == name) == picks and len(times[name]) == len(picks)
    for turn in range(0, len(timed), 2):  # a turn's batches differ from the turn before's
        if turn:
            assert not {i for _, i, _ in timed[turn : turn + 2]} & {i for _, i, _ in timed[turn - 2 : turn]}
