"""The zarr reader decodes a batch's chunks on torch's threads: the same arrays and the same errors as one
thread, no pool in a one-thread process (a loader worker) or with DCTDATA_READ_THREADS=1, and a fork
child that reads on its own pool."""

from __future__ import annotations

import multiprocessing
import shutil
import threading

import numpy as np
import pytest
import torch
from sample_fields import smooth_fields

import dctdata
from dctdata import pool
from dctdata.errors import DctDataError, IntegrityError
from dctdata.format.zarr import reader as zarr_reader

N = 24


@pytest.fixture(scope="module")
def packs(tmp_path_factory):
    """The default pack (the entropy coder on the coefficients) and a zstd-9 one, 2 samples per chunk."""
    tmp = tmp_path_factory.mktemp("threads")
    np.savez(tmp / "src.npz", image=smooth_fields(N, 1, 64, 64, seed=1), label=np.arange(N) * 3)
    common = {
        "quant": "int8",
        "target_psnr": 35,
        "quiet": True,
        "writer_options": {"chunk_samples": 2, "shard_samples": 8},
    }
    for name, kw in (("ctx", {}), ("zstd", {"lossless": {"id": "zstd", "level": 9}})):
        dctdata.pack(tmp / "src.npz", tmp / name, **common, **kw)
    return tmp


@pytest.fixture
def threads(monkeypatch):
    """Sets torch's threads (restored afterwards) with every batch worth threading; records the threads
    that decoded chunks and the runs each batch was split into."""
    before = torch.get_num_threads()
    monkeypatch.delenv("DCTDATA_READ_THREADS", raising=False)
    monkeypatch.setattr(zarr_reader, "THREAD_MIN_US", 1e-9)
    monkeypatch.setattr(zarr_reader, "HANDOFF_US", 1e-9)
    seen = {"decoders": set(), "runs": [], "rows": []}
    decode, split = zarr_reader._FieldPlan.decode, zarr_reader.run_split

    def recording_decode(self, *args):
        seen["decoders"].add(threading.get_ident())
        return decode(self, *args)

    def recording_split(part, count, runs):
        seen["runs"].append(runs)
        return split(part, count, runs)

    def recording_rows(self, data, *args):
        seen["decoders"].add(threading.get_ident())
        seen["rows"].append(len(data))
        return decode_rows(self, data, *args)

    decode_rows = zarr_reader._FieldPlan.decode_rows
    monkeypatch.setattr(zarr_reader._FieldPlan, "decode_rows", recording_rows)
    monkeypatch.setattr(zarr_reader._FieldPlan, "decode", recording_decode)
    monkeypatch.setattr(zarr_reader, "run_split", recording_split)

    def use(n):
        torch.set_num_threads(n)
        for v in seen.values():
            v.clear()
        return seen

    yield use
    torch.set_num_threads(before)


def read(root, idx):
    ds = dctdata.open_dataset(root)
    return ds.reader.read_samples(ds.fields, idx), ds


@pytest.mark.parametrize("name, stage", [("ctx", "dctdata_ctxrans"), ("zstd", "zstd")])
def test_threaded_and_one_thread_reads_are_identical(packs, threads, name, stage):
    idx = [17, 3, 4, 9, 22, 0, 3, 11, 12, 5]  # 8 chunks of 2 samples, out of order, a repeat
    seen = threads(1)
    one, ds = read(packs / name, idx)
    assert ds.manifest.field("image").lossless["id"] == stage
    assert set(seen["runs"]) == {1} and len(seen["decoders"]) == 1
    seen = threads(3)
    got, _ = read(packs / name, idx)
    assert 3 in seen["runs"] and len(seen["decoders"]) >= 2  # the pool's threads decoded chunks
    assert got.keys() == one.keys()
    for f in one:
        assert got[f].dtype == one[f].dtype and got[f].tobytes() == one[f].tobytes(), f
    assert got["label"].tolist() == [3 * i for i in idx]


def damage_chunks(root, crc=(), stream=()):
    """Flip a byte of each chunk in `crc` (its crc32c then fails) and set the stream mode of each chunk in
    `stream` to one the decoder refuses, its crc32c recomputed (only the decoder can catch it)."""
    import google_crc32c

    ds = dctdata.open_dataset(root, fields=["image"])
    ds.reader.ensure_open()
    per_shard = ds.reader._plans["image"].chunks_per_shard
    for c in (*crc, *stream):
        s, k = divmod(c, per_shard)
        off, nbytes = (int(v) for v in ds.reader._load_indexes([(ds.fields[0], s)])[("image", s)][k])
        path = root / "image" / f"c.{s}.0.0.0.0"
        raw = bytearray(path.read_bytes())
        if c in crc:
            raw[off + nbytes // 2] ^= 0xFF
        else:
            raw[off] = 0x07
            raw[off + nbytes - 4 : off + nbytes] = google_crc32c.value(bytes(raw[off : off + nbytes - 4])).to_bytes(
                4, "little"
            )
        path.write_bytes(bytes(raw))


def damaged_copy(packs, tmp_path, chunks):
    """A copy of the zstd pack with one stored byte flipped in each of the image field's `chunks`."""
    root = shutil.copytree(packs / "zstd", tmp_path / "zstd")
    damage_chunks(root, crc=chunks)
    return root, dctdata.open_dataset(root, fields=["image"]).fields


def test_a_corrupt_chunk_mid_batch_raises_the_one_thread_error(packs, threads, tmp_path):
    root, fields = damaged_copy(packs, tmp_path, [5])  # samples 10..11, in shard 1
    idx = list(range(0, N, 2))  # 12 chunks: the bad one is the 6th, in the second of 4 runs
    messages = []
    for n in (1, 4):
        seen = threads(n)
        with pytest.raises(IntegrityError, match=r"c\.1\.0\.0\.0\.0: field 'image' samples 10\.\.11 \(chunk 5\)") as e:
            dctdata.open_dataset(root, fields=["image"]).reader.read_samples(fields, idx)
        assert max(seen["runs"]) == n
        messages.append(str(e.value))
    assert messages[0] == messages[1] and "crc32c (corrupted)" in messages[0]


def test_the_first_bad_chunk_in_batch_order_is_named(packs, threads, tmp_path):
    """Chunks 3 and 4 are bad. Split in runs, chunk 4 starts a run and fails before chunk 3, the last of the
    run before it, is reached: chunk 3 is still the one named, as with one thread."""
    root, fields = damaged_copy(packs, tmp_path, [3, 4])
    for n in (1, 2, 4):
        seen = threads(n)
        with pytest.raises(IntegrityError, match=r"samples 6\.\.7 \(chunk 3\)"):
            dctdata.open_dataset(root, fields=["image"]).reader.read_samples(fields, list(range(16))[::-1])
        assert max(seen["runs"]) == n
        with pytest.raises(IntegrityError, match=r"samples 8\.\.9 \(chunk 4\)"):
            dctdata.open_dataset(root, fields=["image"]).reader.read_samples(fields, list(range(8, 16)))


def test_one_torch_thread_or_the_env_switch_never_uses_the_pool(packs, threads, monkeypatch):
    def no_pool(*args, **kwargs):
        raise AssertionError("the pool was used")

    monkeypatch.setattr(pool, "ThreadPoolExecutor", no_pool)
    idx = list(range(N))
    want = None
    for n, env in ((1, None), (4, "1"), (4, " 1 ")):
        if env is not None:
            monkeypatch.setenv("DCTDATA_READ_THREADS", env)
        monkeypatch.setattr(pool, "_POOL", None)
        seen = threads(n)
        got, _ = read(packs / "ctx", idx)
        assert set(seen["runs"]) == {1} and len(seen["decoders"]) == 1
        want = got if want is None else want
        assert got["image"].tobytes() == want["image"].tobytes()
    monkeypatch.setenv("DCTDATA_READ_THREADS", "2")
    assert zarr_reader.decode_threads(10, 1e6) == 2  # a cap, not a floor: torch's 4 threads are capped at 2
    torch.set_num_threads(1)
    assert zarr_reader.decode_threads(10, 1e6) == 1


def test_the_read_threads_option_caps_the_threads_before_the_environment(packs, threads, monkeypatch):
    idx = list(range(N))
    monkeypatch.setenv("DCTDATA_READ_THREADS", "3")
    seen = threads(4)
    ds = dctdata.open_dataset(packs / "ctx", read_threads=1)
    got = ds.reader.read_samples(ds.fields, idx)
    assert set(seen["runs"]) == {1} and len(seen["decoders"]) == 1
    seen = threads(4)
    ds = dctdata.open_dataset(packs / "ctx", read_threads=2)
    assert ds.reader.read_samples(ds.fields, idx)["image"].tobytes() == got["image"].tobytes()
    assert set(seen["runs"]) == {2}
    assert zarr_reader.decode_threads(10, 1e6, 2) == 2 and zarr_reader.decode_threads(10, 1e6) == 3


def test_small_batches_stay_on_one_thread(threads, monkeypatch):
    threads(8)
    monkeypatch.setattr(zarr_reader, "THREAD_MIN_US", 100)  # the module's values (the fixture lowered them)
    monkeypatch.setattr(zarr_reader, "HANDOFF_US", 25)
    assert zarr_reader.decode_threads(1, 1e9) == 1  # one chunk
    assert zarr_reader.decode_threads(32, 150) == 1  # too little work to pay for a second thread
    assert zarr_reader.decode_threads(32, 450) == 4
    assert zarr_reader.decode_threads(32, 1e9) == 8


def test_many_cores_take_only_the_threads_whose_handoff_pays(threads, monkeypatch):
    threads(16)
    monkeypatch.setattr(zarr_reader, "THREAD_MIN_US", 100)
    monkeypatch.setattr(zarr_reader, "HANDOFF_US", 25)
    # W / n + 25 n is least at n = sqrt(W / 25): 1,600 us of work pays for 8 threads, not 16
    assert zarr_reader.decode_threads(32, 1_600) == 8
    assert zarr_reader.decode_threads(32, 2_080) == 9  # a zstd-9 batch of 32 chunks of 64 KiB (estimated)
    assert zarr_reader.decode_threads(32, 10_480) == 16  # the entropy coder's: all 16 cores pay
    assert zarr_reader.decode_threads(32, 6_399) == 15


@pytest.fixture(scope="module")
def one_sample_chunks(tmp_path_factory):
    """The default pack (the entropy coder) in one-sample chunks: an increasing batch decodes in runs."""
    tmp = tmp_path_factory.mktemp("runs")
    np.savez(tmp / "src.npz", image=smooth_fields(N, 1, 64, 64, seed=2), label=np.arange(N) * 3)
    one = {"chunk_samples": 1, "shard_samples": 8}
    dctdata.pack(tmp / "src.npz", tmp / "ctx1", quant="int8", target_psnr=35, quiet=True, writer_options=one)
    return tmp / "ctx1"


def read_chunk_by_chunk(root, idx):
    """`read` with the runs turned off: every chunk decoded on its own (the reference)."""
    ds = dctdata.open_dataset(root)
    ds.reader.ensure_open()
    ds.reader._plans["image"].runs = False
    return ds.reader.read_samples(ds.fields, idx)


def test_runs_of_one_sample_chunks_decode_as_chunk_by_chunk(one_sample_chunks, threads):
    idx = [0, 2, 3, 4, 5, 9, 10, 16, 17, 23]  # increasing: chunk k fills row k, over three shards
    for n in (1, 3):
        seen = threads(n)
        got, ds = read(one_sample_chunks, idx)
        assert ds.manifest.field("image").lossless["id"] == "dctdata_ctxrans" and ds.reader._plans["image"].runs
        assert sum(seen["rows"]) == len(idx) and len(seen["rows"]) == n  # one kernel call per thread's run
        assert (len(seen["decoders"]) >= 2) == (n > 1)  # a pool thread free again may take a second run
        want = read_chunk_by_chunk(one_sample_chunks, idx)
        assert got["image"].tobytes() == want["image"].tobytes() and got["label"].tolist() == [3 * i for i in idx]
        assert len({got["image"][k].tobytes() for k in range(len(idx))}) == len(idx)  # rows differ
    shuffled, seen = [9, 2, 17], threads(1)  # not increasing: chunk by chunk
    got, _ = read(one_sample_chunks, shuffled)
    assert (
        seen["rows"] == []
        and got["image"].tobytes() == read_chunk_by_chunk(one_sample_chunks, shuffled)["image"].tobytes()
    )


def test_the_first_bad_chunk_of_a_run_is_named_whichever_check_fails(one_sample_chunks, threads, tmp_path):
    root = shutil.copytree(one_sample_chunks, tmp_path / "ctx1")
    damage_chunks(root, crc=[5], stream=[3, 6])
    refused = r"expected dctdata_ctxrans-coded bytes of int8 \(1, 1, 8, 64, 8\)\. Got ctxrans: bad stream header"
    cases = [  # (batch, the chunk named, its fault)
        (list(range(8)), 3, refused),  # the decoder's fault before a crc32c fault
        ([4, 5, 6, 7], 5, r"expected intact stored data\. Got a chunk failing its crc32c \(corrupted\)"),  # and after
        ([4, 6, 7], 6, refused),
    ]
    for n in (1, 3):
        threads(n)
        for idx, chunk, fault in cases:
            with pytest.raises(
                IntegrityError,
                match=rf"c\.0\.0\.0\.0\.0: field 'image' samples {chunk}\.\.{chunk} \(chunk {chunk}\): {fault}",
            ) as e:
                read(root, idx)
            with pytest.raises(IntegrityError) as one:
                read_chunk_by_chunk(root, idx)
            assert str(e.value) == str(one.value)
    skip = dctdata.open_dataset(root, on_error="skip")
    assert [int(s[-1]) // 3 for s in skip.__getitems__(list(range(8)))] == [0, 1, 2, 4, 7] and skip.skipped == 3


@pytest.mark.parametrize("value", ["0", "two", "-1", "1.5"])
def test_a_bad_thread_setting_is_one_error(packs, threads, monkeypatch, value):
    threads(2)
    monkeypatch.setenv("DCTDATA_READ_THREADS", value)
    said = rf"DCTDATA_READ_THREADS: expected an int >= 1 \(1: no threads\)\. Got '{value}'"
    with pytest.raises(DctDataError, match=said):
        read(packs / "zstd", [0, 5, 9])


def _child_reads(root, idx, queue):
    try:
        torch.set_num_threads(2)
        got, _ = read(root, idx)
        queue.put((got["image"].tobytes(), pool.pool_threads(), threading.active_count()))
    except BaseException as exc:  # reported to the parent
        queue.put(repr(exc))


def test_a_fork_child_reads_on_its_own_pool(packs, threads):
    idx = list(range(0, N, 2))
    threads(2)
    want, _ = read(packs / "ctx", idx)  # the parent's pool now exists
    assert pool.pool_threads() >= 1
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_child_reads, args=(packs / "ctx", idx, queue))
    child.start()
    try:
        result = queue.get(timeout=60)  # a child stuck on the parent's dead pool threads never answers
        child.join(timeout=60)
    finally:
        child.kill()
    assert child.exitcode == 0 and not isinstance(result, str), result
    data, child_pool, _ = result
    assert data == want["image"].tobytes()
    assert child_pool == 1  # the child built its own pool: 2 threads is the caller plus one
