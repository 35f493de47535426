"""Loaders and the first layer under hostile input (issue 30, round two): one regression test per finding.

9: a zarr dataset closes its file descriptors (collected, `close()`, `with`): reopening never runs out.
13: the whole loader state_dict is checked, torchdata's half too: one DctDataError for any edit.
18: `Decompress` refuses coefficient dtypes the spec does not name.
"""

from __future__ import annotations

import copy
import gc
import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
import torch

import dctdata
from dctdata.errors import DctDataError

N = 64


@pytest.fixture(scope="module")
def packs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("packs")
    x = np.random.default_rng(0).standard_normal((N, 1, 16, 16)).astype(np.float32)
    np.save(tmp / "x.npy", x)
    dctdata.pack(tmp / "x.npy", tmp / "zarr", cf=4, quiet=True, writer_options={"shard_samples": 8})
    dctdata.pack(tmp / "x.npy", tmp / "webdataset", format="webdataset", cf=4, quiet=True)
    return tmp


# 9: file descriptors ------------------------------------------------------------------------------------------
def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors in /proc")
def test_9_reopening_a_zarr_dataset_leaks_no_descriptors(packs):
    def once():
        ds = dctdata.open_dataset(packs / "zarr")
        ds.__getitems__([0, 9, 17, 30])

    once()
    gc.collect()
    before = _open_fds()
    for _ in range(50):
        once()
    gc.collect()
    assert _open_fds() <= before  # was 6-8 more per open (other tests' leftovers may close meanwhile: <=)
    gc.collect()
    before = _open_fds()
    ds = dctdata.open_dataset(packs / "zarr")
    ds.__getitems__([0, 9, 17, 30])
    assert _open_fds() > before
    ds.close()  # now, without waiting for the collector
    assert _open_fds() <= before
    assert len(ds.__getitems__([1, 2])) == 2  # a closed dataset opens again when read
    reopened = _open_fds()
    with dctdata.open_dataset(packs / "zarr") as ds2:
        ds2.__getitems__([40, 50])
    assert _open_fds() <= reopened  # the with block closed what it opened
    del ds
    gc.collect()
    assert _open_fds() <= before


REOPEN_UNDER_A_LOW_LIMIT = """
import resource, sys
import dctdata
resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
for i in range(300):
    ds = dctdata.open_dataset(sys.argv[1])
    assert len(ds.__getitems__([0, 9, 17, 30])) == 4
print("ok", i + 1)
"""


@pytest.mark.slow
def test_9_three_hundred_reopens_fit_in_64_descriptors(packs):
    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(REOPEN_UNDER_A_LOW_LIMIT), str(packs / "zarr")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0 and r.stdout.strip() == "ok 300", r.stderr[-2000:]


# 13: the torchdata half of a loader state ------------------------------------------------------------------------
def _loader(packs, fmt, workers):
    from dctdata.loaders.distributed import make_loader

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return make_loader(dctdata.open_dataset(packs / fmt), batch_size=4, num_workers=workers, shuffle=True, seed=1)


def _count(batches) -> int:
    n = 0
    for b in batches:
        while isinstance(b, (list, tuple)):
            b = b[0]
        n += len(b)
    return n


@pytest.fixture(scope="module")
def states(packs):
    """{(format, workers): the state after 3 of 16 batches}."""
    out = {}
    for fmt in ("zarr", "webdataset"):
        for workers in (0, 2):
            loader = _loader(packs, fmt, workers)
            it = iter(loader)
            for _ in range(3):
                next(it)
            out[fmt, workers] = loader.state_dict()
            del it
    return out


def _main(state, workers):
    return state["loader"] if workers == 0 else state["loader"]["_snapshot"]["_main_snapshot"]


def _set(path):
    def edit(state, workers, value):
        d = _main(state, workers)
        for k in path[:-1]:
            d = d[k]
        d[path[-1]] = value

    return edit


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize(
    "edit, value, where, expected",
    [
        (_set(["_sampler_iter_state", "samples_yielded"]), -8, "_sampler_iter_state.samples_yielded",
         r"an int in 0\.\.64\. Got -8"),  # replayed the epoch
        (_set(["_sampler_iter_state", "samples_yielded"]), 13, "_sampler_iter_state.samples_yielded",
         r"whole batches of 4 \(or the epoch's 64 samples\)\. Got 13"),  # skipped a sample
        (_set(["_sampler_iter_state", "samples_yielded"]), 10**12, "_sampler_iter_state.samples_yielded",
         r"an int in 0\.\.64\. Got 1000000000000"),  # a bare StopIteration
        (_set(["_sampler_iter_state", "samples_yielded"]), "x", "_sampler_iter_state.samples_yielded",
         r"an int in 0\.\.64\. Got 'x'"),  # a TypeError
        (_set(["_sampler_iter_yielded"]), 9, "_sampler_iter_yielded", r"3 batches for 12 samples\. Got 9"),
        (_set(["_sampler_iter_state"]), None, "_sampler_iter_state", r"a dict\. Got NoneType"),
    ],
)  # fmt: skip
def test_13_tampered_sampler_counts_are_refused(packs, states, workers, edit, value, where, expected):
    state = copy.deepcopy(states["zarr", workers])
    edit(state, workers, value)
    prefix = "" if workers == 0 else r"_snapshot\._main_snapshot\."
    with pytest.raises(DctDataError, match=rf"state_dict: loader state {prefix}{where}: expected {expected}"):
        _loader(packs, "zarr", workers).load_state_dict(state)


@pytest.mark.parametrize("fmt", ["zarr", "webdataset"])
@pytest.mark.parametrize(
    "edit, expected",
    [
        (lambda s: s["_snapshot"]["_main_snapshot"].update(_num_workers=5),
         r"_snapshot\._main_snapshot\._num_workers: expected 2 \(this loader's num_workers\)\. Got 5"),
        (lambda s: s["_snapshot"].update(_worker_snapshots={}),
         r"_snapshot\._worker_snapshots: expected one snapshot per worker \['worker_0', 'worker_1'\]\. Got \[\]"),
        (lambda s: s["_snapshot"]["_worker_snapshots"].pop("worker_1"),
         r"_snapshot\._worker_snapshots: expected one snapshot per worker .*Got \['worker_0'\]"),  # samples twice
        (lambda s: s["_snapshot"]["_main_snapshot"].update(_base_seed="s"),
         r"_snapshot\._main_snapshot\._base_seed: expected an int in 0\.\.2\*\*64-1\. Got 's'"),  # a dead worker
        (lambda s: s["_snapshot"].update(_last_yielded_worker_id=7),
         r"_snapshot\._last_yielded_worker_id: expected a worker id in 0\.\.1\. Got 7"),
        (lambda s: s["_snapshot"]["_worker_snapshots"]["worker_1"].update(worker_id=0),
         r"_snapshot\._worker_snapshots\.worker_1\.worker_id: expected 1\. Got 0"),
        (lambda s: s.update(extra=1), r"\(the 'loader' entry\): expected keys .*unknown \['extra'\]"),
    ],
)  # fmt: skip
def test_13_tampered_worker_snapshots_are_refused(packs, states, fmt, edit, expected):
    state = copy.deepcopy(states[fmt, 2])
    edit(state["loader"])
    with pytest.raises(DctDataError, match=rf"state_dict: loader state {expected}"):
        _loader(packs, fmt, 2).load_state_dict(state)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize(
    "key, value, expected",
    [
        ("position", -1, r"position: expected an int in 0\.\.64\. Got -1"),
        ("position", 10**9, r"position: expected an int in 0\.\.64\. Got 1000000000"),
        ("epoch", 3, r"epoch: expected 0\. Got 3"),
        ("worker", 5, r"worker: expected [01]\. Got 5"),
    ],
)
def test_13_a_tampered_webdataset_worker_position_is_refused(packs, states, workers, key, value, expected):
    state = copy.deepcopy(states["webdataset", workers])
    loader = state["loader"]
    fetcher = loader["fetcher_state"] if workers == 0 else loader["_snapshot"]["_worker_snapshots"]["worker_0"][
        "fetcher_state"]  # fmt: skip
    fetcher["dataset_iter_state"][key] = value
    with pytest.raises(DctDataError, match=rf"state_dict: loader state .*dataset_iter_state\.{expected}"):
        _loader(packs, "webdataset", workers).load_state_dict(state)


@pytest.mark.parametrize("fmt", ["zarr", "webdataset"])
@pytest.mark.parametrize("workers", [0, 2])
def test_13_an_intact_state_resumes_exactly_the_rest_of_the_epoch(packs, states, fmt, workers):
    loader = _loader(packs, fmt, workers)
    loader.load_state_dict(copy.deepcopy(states[fmt, workers]))
    assert _count(loader) == N - 12


# 18: coefficient dtypes -----------------------------------------------------------------------------------------------
def test_18_decompress_refuses_coefficient_dtypes_the_spec_does_not_name():
    spec = dctdata.CodecSpec(cf=4, height=16, width=16, dtype="int8", steps=[0.5])
    layer = dctdata.Decompress(spec)
    q = torch.randint(-100, 100, (2, *spec.coeff_shape), dtype=torch.int8)
    want = layer(q)
    for dtype in (torch.uint8, torch.int32, torch.int64, torch.uint16, torch.bool, torch.complex64):
        expected = rf"float32 or float64 coefficients \(the wire dtypes; this spec's is int8\)\. Got {dtype}"
        with pytest.raises(TypeError, match=r"coeffs: expected int8, int16, float16, bfloat16, " + expected):
            layer(q.to(dtype))
    for dtype in (torch.int16, torch.float32, torch.float64, torch.float16, torch.bfloat16):  # the same values
        torch.testing.assert_close(layer(q.to(dtype)), want, rtol=0, atol=1e-4)
