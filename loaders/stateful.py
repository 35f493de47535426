"""`PackLoader`: the DataLoader `make_loader` returns. It is torchdata's `StatefulDataLoader`
(`state_dict()` / `load_state_dict()` resume mid-epoch, with workers) plus what a dctdata pack adds:

- **`len(loader)` is the batches it yields.** For a webdataset pack each worker batches its own
  samples, so the count comes from the dataset's plan (`DCTWebDataset.batches`), not ceil(len / batch).
- **The state names what it belongs to.** `state_dict()` is `{"dctdata": {...}, "loader": <torchdata
  state>}`; the first part holds the pack's fingerprint, the epoch and the split settings (rank, world
  size, workers, batch size, shuffle, seed, drop_last). `load_state_dict()` refuses a state of another
  pack or other settings with one `DctDataError`, restores the epoch, and then the next epoch set with
  `set_epoch` must be that one until the resumed epoch has started (another epoch would replay the
  wrong order). The torchdata half is checked too (`loader_state.check_loader_state`): counts, types
  and one snapshot per worker, as `state_dict()` makes them.
- **How resuming works (deterministic replay).** torchdata checkpoints each worker's dataset
  iterator. A webdataset worker's state is its position in a plan that is a pure function of (seed,
  epoch, split), so a resumed worker fast-forwards without reading skipped shards. A zarr pack's
  `DistributedSampler` is fast-forwarded by torchdata itself (same seed and epoch, same indices).
  Shuffle buffers are not snapshotted: they are replayed, which needs no more memory than training.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

from torch.utils.data import IterableDataset
from torchdata.stateful_dataloader import StatefulDataLoader

from dctdata.errors import DctDataError
from dctdata.loaders.loader_state import check_loader_state
from dctdata.parse import SEED_MAX, parse_int

STATE_VERSION = 1
_SETTINGS = ("rank", "world_size", "num_workers", "batch_size", "drop_last", "shuffle", "seed")


class PackLoader(StatefulDataLoader):
    """A StatefulDataLoader over a dctdata dataset (see the module docstring). Built by `make_loader`."""

    def __init__(self, dataset: Any, *, split: Mapping[str, Any], **kwargs: Any) -> None:
        with warnings.catch_warnings():  # torchdata 0.11 calls torch.set_vital, deprecated since torch 2.10
            warnings.filterwarnings("ignore", message="'set_vital' is deprecated")
            super().__init__(dataset, **kwargs)
        self._split = dict(split)
        self._resume_epoch: int | None = None

    # Length ----------------------------------------------------------------------------------------
    def __len__(self) -> int:
        if isinstance(self.dataset, IterableDataset) and hasattr(self.dataset, "batches"):
            n = self.dataset.batches(self.batch_size, self.num_workers, self.drop_last)
            self._IterableDataset_len_called = n  # torch warns when more batches than this come
            return n
        return super().__len__()

    # Epochs ----------------------------------------------------------------------------------------
    @property
    def epoch(self) -> int:
        """The epoch whose order the next iteration yields."""
        holder = self.dataset if isinstance(self.dataset, IterableDataset) else self.sampler
        return int(getattr(holder, "epoch", 0))

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch of the sampler or dataset; refused while a loaded mid-epoch state of another
        epoch waits to be resumed."""
        epoch = parse_int(epoch, "set_epoch: epoch", minimum=0, maximum=SEED_MAX)
        if self._resume_epoch is not None and epoch != self._resume_epoch:
            raise DctDataError(
                f"set_epoch({epoch}): expected epoch {self._resume_epoch}, the epoch of the loaded state_dict (it "
                f"resumes in the middle of epoch {self._resume_epoch}). Got another epoch count: iterate the resumed "
                "epoch first, or save the epoch with the state"
            )
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)

    def __iter__(self):
        iterator = super().__iter__()
        self._resume_epoch = None
        return iterator

    # State -----------------------------------------------------------------------------------------
    def _identity(self) -> dict[str, Any]:
        ds = self.dataset
        return {
            "version": STATE_VERSION,
            "pack": getattr(ds, "fingerprint", None),
            "root": str(getattr(ds, "root", "")),
            **{k: self._split.get(k) for k in _SETTINGS},
        }

    def state_dict(self) -> dict[str, Any]:
        """{"dctdata": pack, epoch and split settings, "loader": torchdata's state}: plain ints, strings,
        bools and dicts (JSON-serialisable)."""
        return {"dctdata": {**self._identity(), "epoch": self.epoch}, "loader": super().state_dict()}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Resume from `state_dict()` of a loader over the same pack with the same settings."""
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"state_dict: expected a dict from loader.state_dict(). Got {type(state_dict).__name__}")
        ours, loader = state_dict.get("dctdata"), state_dict.get("loader")
        if not isinstance(ours, Mapping) or not isinstance(loader, Mapping) or "epoch" not in ours:
            raise DctDataError(
                "state_dict: expected the state_dict() of a dctdata make_loader loader ({'dctdata': ..., 'loader': "
                f"...}}). Got keys {sorted(map(str, state_dict))}"
            )
        here = self._identity()
        if ours.get("version") != STATE_VERSION:
            raise DctDataError(f"state_dict: expected state version {STATE_VERSION}. Got {ours.get('version')!r}")
        if ours.get("pack") != here["pack"]:
            raise DctDataError(
                f"state_dict: expected a state of the pack at {here['root']} (fingerprint {here['pack']}). Got a state "
                f"of another pack ({ours.get('root')}, fingerprint {ours.get('pack')})"
            )
        changed = [k for k in _SETTINGS if ours.get(k) != here[k]]
        if changed:
            diff = ", ".join(f"{k}={ours.get(k)!r} (here {here[k]!r})" for k in changed)
            raise DctDataError(f"state_dict: expected a state saved with this loader's settings. Got {diff}")
        epoch = ours["epoch"]
        if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
            raise DctDataError(f"state_dict: epoch: expected an int >= 0. Got {epoch!r}")
        iterable = isinstance(self.dataset, IterableDataset)
        check_loader_state(
            loader,
            workers=self.num_workers,
            batch_size=self.batch_size or 1,
            epoch_samples=len(self.dataset) if iterable else len(self.sampler),
            iterable=iterable,
            epoch=epoch,
            rank=int(self._split.get("rank") or 0),
        )
        self._resume_epoch = None
        self.set_epoch(epoch)
        finished = bool(loader.get("_iterator_finished", False))
        self._resume_epoch = None if finished else epoch
        super().load_state_dict(dict(loader))
