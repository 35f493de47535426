"""Parallel packing: forked workers (every core by default) and a Dask cluster give the bytes of a serial
pack; clear errors without Dask or with bad settings."""

from __future__ import annotations

import builtins

import numpy as np
import pytest
from sample_fields import OPTS, N, files

import dctdata
from dctdata.cli import main
from dctdata.errors import DctDataError
from dctdata.preprocess import parallel
from dctdata.settings import PackSettings


@pytest.mark.parametrize("fmt", ["zarr", "webdataset"])
def test_forked_workers_pack_is_byte_identical_to_one_process(labelled_source, tmp_path, fmt, monkeypatch):
    kw = dict(format=fmt, quant="int8", cf=6, quiet=True, writer_options=OPTS[fmt])
    started = []
    real = parallel.run_parts_local
    monkeypatch.setattr(parallel, "run_parts_local", lambda *a, **k: started.append(k["workers"]) or real(*a, **k))
    m1 = dctdata.pack(labelled_source, tmp_path / "one", workers=1, **kw)
    assert started == []  # workers=1: the parts run in this process
    m2 = dctdata.pack(labelled_source, tmp_path / "two", workers=2, **kw)
    assert started == [2]  # 8 parts: two forked workers ran them
    assert m1.to_json() == m2.to_json()
    a, b = files(tmp_path / "one"), files(tmp_path / "two")
    assert sorted(a) == sorted(b) and len(a) > 4
    assert all(a[k] == b[k] for k in a)
    assert main(["verify", str(tmp_path / "two")]) == 0
    assert dctdata.open_dataset(tmp_path / "two").manifest.samples == N


def test_an_in_memory_source_packs_on_forked_workers(tmp_path):
    """Forked workers inherit an array (no name to reopen it by): the same bytes as one process."""
    x = np.random.default_rng(0).standard_normal((24, 1, 16, 16)).astype(np.float32)
    kw = dict(quant="int8", cf=4, quiet=True, writer_options={"shard_samples": 4})
    dctdata.pack(x, tmp_path / "one", workers=1, **kw)
    dctdata.pack(x, tmp_path / "three", workers=3, **kw)
    assert files(tmp_path / "one") == files(tmp_path / "three")


def test_workers_default_to_the_cores(monkeypatch):
    assert PackSettings().workers is None  # resolved when the pack runs: every core this process may use
    monkeypatch.setattr(parallel.os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    assert parallel.cores() == 3
    assert parallel.local_workers(None, 10) == 3
    assert parallel.local_workers(None, 2) == 2  # never more workers than parts
    assert parallel.local_workers(None, 1) == 1  # one part: in this process
    assert parallel.local_workers(5, 10) == 5
    monkeypatch.delattr(parallel.os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(parallel.os, "cpu_count", lambda: 6)
    assert parallel.cores() == 6
    monkeypatch.setattr(parallel.multiprocessing, "get_all_start_methods", lambda: ["spawn"])
    assert parallel.local_workers(None, 10) == 1  # no fork: in this process


def test_a_failing_part_on_a_worker_raises_its_error(tmp_path):
    x = np.ones((16, 1, 8, 8), dtype=np.float32)
    x[13, 0, 2, 2] = 1e38  # past the float32 DCT bound, in the fourth part
    with pytest.raises(DctDataError, match=r"sample 13: field .*expected \|x\| <= "):
        dctdata.pack(x, tmp_path / "o", workers=2, cf=4, quant="int8", quiet=True, writer_options={"shard_samples": 4})
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_dask_pack_is_byte_identical_to_serial(labelled_source, tmp_path):
    from dask.distributed import LocalCluster

    kw = dict(quant="int8", cf=6, quiet=True, writer_options=OPTS["zarr"])
    m1 = dctdata.pack(labelled_source, tmp_path / "serial", workers=1, **kw)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as cluster:
        m2 = dctdata.pack(labelled_source, tmp_path / "dask", scheduler=cluster.scheduler_address, **kw)
    assert m1.to_json() == m2.to_json()
    assert files(tmp_path / "serial") == files(tmp_path / "dask")


def test_parallel_needs_dask(labelled_source, tmp_path, monkeypatch):
    real = builtins.__import__

    def no_dask(name, *a, **k):
        if name.startswith("dask"):
            raise ImportError("No module named 'dask'")
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_dask)
    with pytest.raises(
        DctDataError,
        match=r"--scheduler: expected dask.distributed to be installed \(pip install 'dctdata\[dask\]'\)",
    ):
        dctdata.pack(labelled_source, tmp_path / "a", scheduler="tcp://127.0.0.1:1", quiet=True)
    dctdata.pack(labelled_source, tmp_path / "b", workers=2, quiet=True, writer_options=OPTS["zarr"])  # no Dask needed
    assert not (tmp_path / "a").exists()


def test_bad_parallel_settings(labelled_source, tmp_path):
    with pytest.raises(DctDataError, match=r"--workers: expected a positive int. Got 0"):
        dctdata.pack(labelled_source, tmp_path / "a", workers=0)
    with pytest.raises(DctDataError, match="--workers/--scheduler: expected one of them"):
        dctdata.pack(labelled_source, tmp_path / "a", workers=2, scheduler="tcp://127.0.0.1:1")
    with pytest.raises(DctDataError, match="--scheduler/--resume: expected a path, URL or module:callable source"):
        dctdata.pack(np.zeros((4, 8, 8), np.float32), tmp_path / "a", scheduler="tcp://127.0.0.1:1")
    with pytest.raises(DctDataError, match="--resume: expected a local OUT directory"):
        dctdata.pack(labelled_source, "memory://bucket/x", resume=True)


@pytest.mark.slow
def test_parallel_pack_of_masked_data_is_byte_identical_to_serial(tmp_path):
    """The mask fields the pack makes (nan="mask") travel with the job to the workers."""
    import numpy as np
    from sample_fields import smooth_fields

    x = smooth_fields(N, 2, 24, 24, noise="normal")
    x[::3, :, :, :5] = np.nan
    np.save(tmp_path / "x.npy", x)
    kw = dict(nan="mask", cf=6, quant="int8", quiet=True, writer_options=OPTS["zarr"])
    m1 = dctdata.pack(tmp_path / "x.npy", tmp_path / "serial", workers=1, **kw)
    m2 = dctdata.pack(tmp_path / "x.npy", tmp_path / "dask", workers=2, **kw)
    assert m1.names == ("image", "image_valid") and m1.to_json() == m2.to_json()
    assert files(tmp_path / "serial") == files(tmp_path / "dask")


def test_a_worker_that_dies_is_an_error_not_a_hang(tmp_path, monkeypatch):
    import os
    from concurrent.futures.process import BrokenProcessPool

    import dctdata.preprocess.pack as pack_mod

    monkeypatch.setattr(pack_mod, "run_part", lambda *a, **k: os._exit(3))  # killed mid-part (out of memory)
    x = np.random.default_rng(0).standard_normal((16, 1, 8, 8)).astype(np.float32)
    with pytest.raises(BrokenProcessPool):
        dctdata.pack(x, tmp_path / "o", workers=2, cf=4, quant="int8", quiet=True, writer_options={"shard_samples": 4})
    assert not (tmp_path / "o").exists()


def _error_classes() -> list[type]:
    """Every error class of the package a pack's worker may raise (they cross the fork pickled)."""
    import importlib
    import pkgutil

    for m in pkgutil.walk_packages(dctdata.__path__, "dctdata."):
        if not m.name.endswith("__main__") and ".cuda" not in m.name:
            try:
                importlib.import_module(m.name)
            except ImportError:  # an optional extra
                pass
    out, todo = [], [DctDataError]
    while todo:
        cls = todo.pop()
        out.append(cls)
        todo.extend(cls.__subclasses__())
    return out


def test_every_error_a_worker_raises_comes_back_whole():
    """An error whose constructor takes more than a message (BoundError: sample, channel) must survive the
    pickle a forked worker sends it back in; otherwise the pool reports a worker 'terminated abruptly'."""
    import inspect
    import pickle

    checked = 0
    for cls in _error_classes():
        params = [p for p in inspect.signature(cls.__init__).parameters.values() if p.name != "self"]
        if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
            args = ("sample 3: field 'x': expected within 1e-06",)
        else:
            args = ("sample 3: field 'x': expected within 1e-06", *tuple(range(1, len(params))))
        err = cls(*args)
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is cls and str(back) == str(err), cls
        assert vars(back) == vars(err), cls
        checked += 1
    assert checked >= 5


def test_a_bound_error_in_a_worker_reaches_the_caller(tmp_path, monkeypatch):
    """A sample no encoding holds within its bound (noise at 1e-6 among integers, whose lattice calibration
    chose), packed on 2 forked workers: the BoundError naming it."""
    from dctdata.encoder.bounds import BoundError

    x = np.round(np.random.default_rng(0).uniform(0, 200, size=(24, 1, 16, 16)))  # float32 holds these
    x[-1] = np.random.default_rng(1).uniform(0, 200, size=(1, 16, 16))  # outside the calibration set (the first
    # 8 samples): found by the part that encodes it, on a worker
    started = []
    real = parallel.run_parts_local
    monkeypatch.setattr(parallel, "run_parts_local", lambda *a, **k: started.append(k["workers"]) or real(*a, **k))
    with pytest.raises(BoundError, match=r"sample 23: field 'image': expected \|decoded - x\| <= 1e-06"):
        dctdata.pack(
            x, tmp_path / "p", max_error=1e-6, calibration=x[:8], workers=2, writer_options={"shard_samples": 4},
            lossless={"id": "zstd", "level": 1}, quiet=True,
        )  # fmt: skip
    assert started == [2]  # the parts ran on forked workers
    assert not (tmp_path / "p").exists()
