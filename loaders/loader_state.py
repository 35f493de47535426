"""The torchdata half of a `PackLoader` state, checked before torchdata sees it.

`StatefulDataLoader.load_state_dict` trusts what it is given: a negative sample count replays the epoch,
a count that is not a whole number of batches skips samples, a deleted worker snapshot restarts that
worker's epoch (its samples come twice), and other edits end in a bare StopIteration, AssertionError,
TypeError or a dead worker. A checkpoint is a file that can be damaged or edited, so `check_loader_state`
compares the state with what this loader's own `state_dict()` makes (torchdata 0.11's layout: the keys,
their types, one snapshot per worker, counts that fit the epoch) and refuses anything else with one
`DctDataError` naming the entry. Hand-written: torchdata has no validator of its own.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from dctdata.errors import DctDataError

SEED_BITS = 64
# Entries of a loader state with and without workers, and of a worker's snapshot (torchdata 0.11).
_MAIN = {"_IterableDataset_len_called", "_index_sampler_state", "_sampler_iter_state", "_sampler_iter_yielded",
         "_shared_seed"}  # fmt: skip
_NO_WORKERS = _MAIN | {"_iterator_finished", "_num_yielded", "dataset_state", "fetcher_state"}
_WITH_WORKERS = {"_iterator_finished", "_snapshot", "_steps_since_snapshot"}
_SNAPSHOT = {"_last_yielded_worker_id", "_main_snapshot", "_snapshot_step", "_worker_snapshots"}
_WORKER = {"dataset_state", "fetcher_state", "worker_id"}
_ITER_STATE = {"epoch", "position", "rank", "worker", "workers"}


class _Bad(Exception):
    """One entry of the state is not what `state_dict()` makes: (where, expected, got)."""


def check_loader_state(
    state: object,
    *,
    workers: int,
    batch_size: int,
    epoch_samples: int,
    iterable: bool,
    epoch: int,
    rank: int,
) -> None:
    """Refuse a torchdata state that this loader's `state_dict()` could not have made (module docstring).
    `epoch_samples`: the samples this rank's sampler yields in an epoch (map-style) or the dataset's length
    (iterable: each worker's exact count is checked by the worker)."""
    try:
        _check(state, workers, batch_size, epoch_samples, iterable, epoch, rank)
    except _Bad as bad:
        where, expected, got = bad.args
        raise DctDataError(
            f"state_dict: loader state {where}: expected {expected}. Got {got} (a damaged or edited checkpoint: "
            "resume from an intact state_dict(), or start the epoch over)"
        ) from None


def _check(state, workers, batch_size, epoch_samples, iterable, epoch, rank) -> None:
    if workers == 0:
        main = _keys(state, "", _NO_WORKERS)
        _flag(main, "", "_iterator_finished")
        _count(main, "", "_num_yielded")
        _sampler(main, "", batch_size, epoch_samples, iterable)
        if _count(main, "", "_num_yielded") != main["_sampler_iter_yielded"] and not iterable:
            raise _Bad("_num_yielded", f"the batches the sampler yielded ({main['_sampler_iter_yielded']})",
                       main["_num_yielded"])  # fmt: skip
        _worker_state(main, "", 0, 1, iterable, epoch, rank, epoch_samples)
        return
    top = _keys(state, "", _WITH_WORKERS)
    _flag(top, "", "_iterator_finished")
    _count(top, "", "_steps_since_snapshot")
    snap = _keys(top["_snapshot"], "_snapshot.", _SNAPSHOT)
    _count(snap, "_snapshot.", "_snapshot_step")
    last = snap["_last_yielded_worker_id"]
    if not _is_int(last) or not 0 <= last < workers:
        raise _Bad("_snapshot._last_yielded_worker_id", f"a worker id in 0..{workers - 1}", repr(last))
    main = _keys(snap["_main_snapshot"], "_snapshot._main_snapshot.", _MAIN | {"_base_seed", "_num_workers"})
    at = "_snapshot._main_snapshot."
    if main["_num_workers"] != workers or not _is_int(main["_num_workers"]):
        raise _Bad(at + "_num_workers", f"{workers} (this loader's num_workers)", repr(main["_num_workers"]))
    seed = main["_base_seed"]
    if not _is_int(seed) or not 0 <= seed < 1 << SEED_BITS:
        raise _Bad(at + "_base_seed", f"an int in 0..2**{SEED_BITS}-1", repr(seed))
    _sampler(main, at, batch_size, epoch_samples, iterable)
    snaps = snap["_worker_snapshots"]
    names = [f"worker_{i}" for i in range(workers)]
    if not isinstance(snaps, Mapping) or sorted(snaps) != sorted(names):
        got = sorted(map(str, snaps)) if isinstance(snaps, Mapping) else type(snaps).__name__
        raise _Bad("_snapshot._worker_snapshots", f"one snapshot per worker {names}", got)
    for i, name in enumerate(names):
        w = _keys(snaps[name], f"_snapshot._worker_snapshots.{name}.", _WORKER)
        if w["worker_id"] != i or not _is_int(w["worker_id"]):
            raise _Bad(f"_snapshot._worker_snapshots.{name}.worker_id", str(i), repr(w["worker_id"]))
        _worker_state(w, f"_snapshot._worker_snapshots.{name}.", i, workers, iterable, epoch, rank, epoch_samples)


def _keys(d: object, at: str, keys: set[str]) -> Mapping[str, Any]:
    if not isinstance(d, Mapping):
        raise _Bad(at.rstrip(".") or "(the 'loader' entry)", "a dict", type(d).__name__)
    if set(d) != keys:
        missing, unknown = sorted(keys - set(d)), sorted(map(str, set(d) - keys))
        raise _Bad(at.rstrip(".") or "(the 'loader' entry)", f"keys {sorted(keys)}",
                   f"missing {missing}, unknown {unknown}")  # fmt: skip
    return d


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _count(d: Mapping, at: str, key: str, maximum: int | None = None) -> int:
    v = d[key]
    if not _is_int(v) or v < 0 or (maximum is not None and v > maximum):
        expected = "an int >= 0" if maximum is None else f"an int in 0..{maximum}"
        raise _Bad(at + key, expected, repr(v))
    return v


def _flag(d: Mapping, at: str, key: str) -> None:
    if not isinstance(d[key], bool):
        raise _Bad(at + key, "True or False", repr(d[key]))


def _sampler(main: Mapping, at: str, batch_size: int, epoch_samples: int, iterable: bool) -> None:
    """The sampler's counts: whole batches of this rank's epoch (map-style), or plain counts (an iterable
    dataset's sampler only counts, the workers hold the position)."""
    for key in ("_IterableDataset_len_called", "_shared_seed"):
        if main[key] is not None and not _is_int(main[key]):
            raise _Bad(at + key, "an int or None", repr(main[key]))
    if main["_index_sampler_state"] is not None and not isinstance(main["_index_sampler_state"], Mapping):
        raise _Bad(at + "_index_sampler_state", "a dict or None", repr(main["_index_sampler_state"]))
    it = _keys(main["_sampler_iter_state"], at + "_sampler_iter_state.", {"samples_yielded"})
    batches = _count(main, at, "_sampler_iter_yielded")
    if iterable:
        _count(it, at + "_sampler_iter_state.", "samples_yielded")
        return
    n = _count(it, at + "_sampler_iter_state.", "samples_yielded", maximum=epoch_samples)
    if n % batch_size and n != epoch_samples:
        raise _Bad(at + "_sampler_iter_state.samples_yielded",
                   f"whole batches of {batch_size} (or the epoch's {epoch_samples} samples)", n)  # fmt: skip
    if batches != math.ceil(n / batch_size):
        raise _Bad(at + "_sampler_iter_yielded", f"{math.ceil(n / batch_size)} batches for {n} samples", batches)


def _worker_state(w: Mapping, at: str, worker: int, workers: int, iterable, epoch, rank, epoch_samples) -> None:
    """A worker's dataset and fetcher state: none for a map-style dataset; for a webdataset pack its
    position in this epoch's plan, for this rank and worker."""
    if w["dataset_state"] is not None:
        raise _Bad(at + "dataset_state", "None", type(w["dataset_state"]).__name__)
    if not iterable:
        if w["fetcher_state"] is not None:
            raise _Bad(at + "fetcher_state", "None (a map-style dataset)", type(w["fetcher_state"]).__name__)
        return
    f = _keys(w["fetcher_state"], at + "fetcher_state.", {"dataset_iter_state", "fetcher_ended"})
    _flag(f, at + "fetcher_state.", "fetcher_ended")
    s = _keys(f["dataset_iter_state"], at + "fetcher_state.dataset_iter_state.", _ITER_STATE)
    here = {"epoch": epoch, "rank": rank, "worker": worker, "workers": max(1, workers)}
    for key, value in here.items():
        if s[key] != value or not _is_int(s[key]):
            raise _Bad(f"{at}fetcher_state.dataset_iter_state.{key}", repr(value), repr(s[key]))
    _count(s, at + "fetcher_state.dataset_iter_state.", "position", maximum=epoch_samples)
