"""`WebWindowDataset`: the time windows of a webdataset pack of trajectories, as `WindowDataset` serves them
from a zarr pack (same windows, same numbers, same items), streamed shard by shard.

**Which worker serves which window.** A window's *home shard* is the shard holding its first frame. Windows
are numbered in frame order (trajectory after trajectory, start step after start step), so each shard's
windows are a contiguous run of window numbers, and the windows are dealt exactly as `DCTWebDataset` deals
samples (`dctdata.loaders.wds_plan` with each shard's window count in place of its sample count): whole home
shards to ranks and workers when there are enough, shuffled in a buffer seeded by (seed, epoch, rank,
worker), batches of the rank's stream otherwise, the `even_split` of several ranks under `make_loader`.
Every window is served exactly once per epoch across ranks and workers, and a resumed loader fast-forwards
by position without reading.

**Reads by frame.** Frames are stored once. A worker reads a shard (whole, verified) when a window it serves
needs one of its frames, and drops it once no later window of its pass needs one. A window near the end of
its home shard whose later frames lie in the next shard makes its worker read that shard too: pack with a
shard size that is a multiple of the trajectory length (`--samples-per-shard`) so that no trajectory, and so
no window, crosses shards and each shard is read once per epoch.

**Decoded once.** The worker decodes frames in groups (the distinct frames of its next windows, with the
pack's `Decompress` on the CPU), keeps each decoded frame while a window it has taken in (entered in its
shuffle buffer or about to be) still needs it, and cuts the windows from them: a frame shared by the windows
of a trajectory is decoded once per pass (again only if the buffer dropped it before a later window needed
it). With `decode="device"` frames stay stored and the batch's distinct frames are decoded on the device
(`dctdata.loaders.window_decode`).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from dctdata.errors import DctDataError
from dctdata.format.manifest import Manifest
from dctdata.loaders import wds_plan
from dctdata.loaders.wds_dataset import _STAT_OK, _STAT_SAMPLES, DCTWebDataset, _Stream
from dctdata.loaders.windows import _Windows, window_options

# frames decoded together: the distinct new frames of the next windows, up to this many (one Decompress call)
DECODE_GROUP = 32

__all__ = ["WebWindowDataset", "open_web_windows"]


def open_web_windows(path_or_url, manifest: Manifest, shards: Any, **kwargs: Any) -> WebWindowDataset:
    """`dctdata.open_dataset` with window options on a webdataset pack: the whole pack (a window can need
    frames of any shard)."""
    if shards is not None:
        raise DctDataError(
            f"{path_or_url}: n_steps_input/n_steps_output/dt_stride: expected the whole pack (a window can need "
            f"frames of any shard). Got a list of {len(shards)} shard files (open the pack's directory or URL)"
        )
    return WebWindowDataset(path_or_url, manifest=manifest, **kwargs)


class WebWindowDataset(_Windows, DCTWebDataset):
    """Windows over a webdataset pack of trajectories (see the module docstring). Takes `DCTWebDataset`'s
    keywords (shuffle, seed, buffer_size, rank, world_size, cache_dir, decode, ...) and `WindowDataset`'s
    window options; `seed` also seeds a stride range's draws."""

    def __init__(self, path_or_url: str | os.PathLike, *, manifest: Manifest | None = None, **kwargs: Any) -> None:
        options = window_options(kwargs)
        if kwargs.get("on_error", "raise") != "raise":
            raise DctDataError(
                f"on_error={kwargs['on_error']!r}: expected 'raise' for windows (a window needs all its frames)"
            )
        kwargs.pop("as_dict", None)
        DCTWebDataset.__init__(self, path_or_url, manifest=manifest, as_dict=True, **kwargs)
        self._setup(**options)
        shard_starts = np.array([e["start"] for e in self.shards], dtype=np.int64)
        ends = shard_starts + np.array([e["samples"] for e in self.shards], dtype=np.int64)
        if len(self.shards) != len(self.reader.all_shards):
            raise DctDataError(
                f"{self.root}: windows: expected every shard of the pack. Got {len(self.shards)} of "
                f"{len(self.reader.all_shards)} (a window can need frames of any shard)"
            )
        self._frame_starts = shard_starts
        home = np.searchsorted(ends, self.first_frames(), side="right")  # the shard of each window's first frame
        self._window_counts = np.bincount(home, minlength=len(self.shards)).astype(np.int64)
        self._window_starts = np.concatenate([[0], np.cumsum(self._window_counts)[:-1]]).astype(np.int64)

    # the plan counts windows per home shard ---------------------------------------------------------
    def _sizes(self) -> list[int]:
        return self._window_counts.tolist()

    def _starts(self) -> list[int]:
        return self._window_starts.tolist()

    @property
    def samples(self) -> int:
        """Windows of the pack, over all ranks."""
        return len(self)

    def __len__(self) -> int:
        """Windows this rank yields per epoch (all of them for one rank)."""
        rank, world = self._node()
        return wds_plan.rank_size(self._sizes(), self.split(self.epoch, rank, world))

    @property
    def read_stats(self) -> dict[str, Any]:
        """`DCTWebDataset.stats` (shards read, windows served), summed over the DataLoader workers: `stats`
        is the pack's field statistics here, as for `WindowDataset`."""
        return DCTWebDataset.stats.fget(self)  # type: ignore[attr-defined]

    @property
    def windows(self) -> int:
        """Windows of the pack, over all ranks."""
        return int(self.first[-1])

    def field_decompressor(self, name: str):
        return DCTWebDataset.decompressor(self, name)

    def decompressor(self, field: str | None = None, **kwargs: Any):
        return _Windows.decompressor(self, field, **kwargs)

    def __iter__(self) -> _WindowStream:
        from torch.utils.data import get_worker_info
        from webdataset.utils import pytorch_worker_info

        rank, world = self._node()
        _, _, worker, num_workers = pytorch_worker_info()
        info = get_worker_info()
        if info is not None:
            worker, num_workers = info.id, info.num_workers
        split = self.split(self.epoch, rank, world, worker, num_workers)
        return _WindowStream(self, split, *wds_plan.worker_plan(self._sizes(), self._starts(), split))

    def __repr__(self) -> str:
        return (
            f"WebWindowDataset({self.root!r}, windows={self.windows}, shards={len(self.shards)}, "
            f"n_steps_input={self.n_steps_input}, n_steps_output={self.n_steps_output}, dt_stride={self.min_dt_stride}"
            + (f"..{self.max_dt_stride}" if self.max_dt_stride > self.min_dt_stride else "")
            + ")"
        )


class _WindowStream(_Stream):
    """One (rank, worker)'s pass over its windows: `_Stream`'s order, entry positions and resume, with
    windows entering instead of samples (see the module docstring). A window's frames are counted (`refs`)
    from the group decode that made them until the window is yielded; a frame is dropped at 0."""

    def __init__(self, ds: WebWindowDataset, split: wds_plan.Split, order: np.ndarray, entry: np.ndarray) -> None:
        super().__init__(ds, split, order, entry)
        self.wds = ds
        self.loc, self.frames = _window_places(ds, entry)  # (entries, 3) locate() rows, (entries, T) frames
        self._cache: dict[int, Any] = {}  # frame -> decoded (*spatial, F) array, or {field: StoredSample}
        self._scalar: dict[int, np.ndarray] = {}
        self._refs: dict[int, int] = {}
        self._counted = 0  # entry positions below it have their frames counted (or were yielded before a resume)
        self._need_last: np.ndarray | None = None

    def __next__(self):
        while self.position < len(self.order):
            p = self.position
            self.position += 1
            k = int(self.entry_pos[p])
            while self._next_entry <= k:
                self._enter(self._next_entry)
                self._next_entry += 1
            home = int(self.shard_of[k])
            self._counts[self.ds.shards[home]["index"], _STAT_SAMPLES] += 1
            return self._window(k)
        for s in list(self._open):
            self._release(s)
        raise StopIteration

    def _enter(self, e: int) -> None:
        """Window at entry position e enters: its frames decoded (a group at a time) unless yielded before a
        resume."""
        if self.yield_pos[e] < self._floor or e < self._counted:
            return
        self._fill(e)

    def _last_need(self) -> np.ndarray:
        """Per shard: the last entry position (not yielded before a resume) that needs one of its frames."""
        if self._need_last is None:
            last = np.full(len(self.ds.shards), -1, np.int64)
            live = np.nonzero(self.yield_pos >= self._floor)[0]
            if len(live):
                lo = np.searchsorted(self.wds._frame_starts, self.frames[live].min(axis=1), side="right") - 1
                hi = np.searchsorted(self.wds._frame_starts, self.frames[live].max(axis=1), side="right") - 1
                for d in range(int((hi - lo).max()) + 1):
                    np.maximum.at(last, np.minimum(lo + d, hi), live)
            self._need_last = last
        return self._need_last

    def _fill(self, e: int) -> None:
        """Count the frames of entries e.. (until DECODE_GROUP new frames) and decode the new ones together."""
        new: list[int] = []
        seen: set[int] = set()
        end = e
        while end < len(self.entry) and len(new) < DECODE_GROUP:
            if self.yield_pos[end] >= self._floor:
                for f in self.frames[end].tolist():
                    if f not in self._cache and f not in seen:
                        seen.add(f)
                        new.append(f)
                    self._refs[f] = self._refs.get(f, 0) + 1
            end += 1
        self._counted = end
        if new:
            new.sort()
            samples = [self._read(f) for f in new]
            fields, scalars = self.wds._decode(samples)
            for r, f in enumerate(new):
                self._cache[f] = fields[r]
                if scalars is not None:
                    self._scalar[f] = scalars[r]
        last = self._last_need()
        for s in list(self._open):
            if last[s] < end:
                self._release(s)

    def _read(self, frame: int) -> dict[str, Any]:
        """Frame `frame`'s stored values (a dict by field), from its shard (read when first needed)."""
        ds = self.wds
        s = int(np.searchsorted(ds._frame_starts, frame, side="right") - 1)
        reader = self._open.get(s)
        if reader is None:
            reader = self._open[s] = ds.reader.open_unit(self._units[s])
        return ds._make(reader.sample(frame - int(ds._frame_starts[s]), ds._stored))

    def _window(self, k: int) -> dict[str, Any]:
        """The item of the window at entry position k, cut from the cached frames (then uncounted)."""
        frames = self.frames[k].tolist()
        ds = self.wds
        scalars = np.stack([self._scalar[f] for f in frames]) if ds._scalars else None
        rows = np.arange(len(frames))
        if ds.decode == "device":
            item = ds._item([self._cache[f] for f in frames], scalars, tuple(self.loc[k].tolist()), rows, frames)
        else:
            item = ds._item(np.stack([self._cache[f] for f in frames]), scalars, tuple(self.loc[k].tolist()), rows)
        for f in frames:
            n = self._refs[f] - 1
            if n:
                self._refs[f] = n
            else:
                del self._refs[f], self._cache[f]
                self._scalar.pop(f, None)
        return item

    def _release(self, s: int) -> None:
        if self._open.pop(s, None) is not None:
            self._counts[self.ds.shards[s]["index"], _STAT_OK] += 1

    def load_state_dict(self, state) -> None:
        super().load_state_dict(state)
        self._cache.clear()
        self._scalar.clear()
        self._refs.clear()
        self._counted = 0
        self._need_last = None


def _window_places(ds: WebWindowDataset, windows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`locate()` of windows `windows` as (n, 3) rows (trajectory, start, stride) and their (n, T) frame numbers,
    vectorized unless strides are drawn (a draw per window)."""
    t = ds.n_steps_input + ds.output_steps
    if ds.max_dt_stride > ds.min_dt_stride:
        loc = np.array([ds.locate(int(j)) for j in windows], dtype=np.int64).reshape(-1, 3)
    else:
        j = np.asarray(windows, dtype=np.int64)
        k = np.searchsorted(ds.first, j, side="right") - 1
        start = j - ds.first[k]
        if ds.full_trajectory_mode and ds.start_output_steps_at_t >= 0:
            start = np.full_like(start, ds.start_output_steps_at_t - ds.n_steps_input * ds.min_dt_stride)
        loc = np.stack([k, start, np.full_like(k, ds.min_dt_stride)], axis=1)
    frames = ds.offsets[loc[:, 0]][:, None] + loc[:, 1:2] + loc[:, 2:3] * np.arange(t, dtype=np.int64)[None, :]
    return loc, frames
