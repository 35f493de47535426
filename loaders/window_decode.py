"""Windows with `decode="device"`: the window datasets (`dctdata.loaders.windows`) hand over each window's
frames as their checked stored bytes (`WindowFrames`: one `StoredSample` per frame and field, with the frames'
numbers); the collate of a batch keeps each distinct frame once (`collate_frames`: windows of one trajectory
share most of their frames), and `WindowDecompress` (`ds.decompressor()`) decodes those frames once on its
device, normalizes them, and gathers WellDataset's `input_fields`/`output_fields` from them.

    ds = dctdata.open_dataset(pack, n_steps_input=4, n_steps_output=1, decode="device")
    loader = make_loader(ds, batch_size=16, num_workers=4, pin_memory=True)
    decode = ds.decompressor().to("cuda")
    for batch in DevicePrefetcher(loader, "cuda"):
        batch = decode(batch)            # {"input_fields": (16, 4, x, y, F), "output_fields": ..., ...}

`DecodeAhead(loader, ds.decompressor(), group=8)` decodes `group` window batches per call as it does sample
batches: their distinct frames merged into one launch per field (`DecompressBatches`), then each batch
normalized and gathered (`WindowDecompress.start`/`finish`).

A collated batch's `frames` is a plain dict, so the prefetcher and the DataLoader's pin-memory thread move it
like any batch: {"stored": {field: StoredBatch of the distinct frames}, "rows": int64 (B, T), which distinct
frame is step t of window b, "ids": int64 (n,), the distinct frames' numbers in the pack}.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from dctdata.decoder.wire import STORED_TYPES, StoredSample, collate_stored
from dctdata.errors import DctDataError

__all__ = ["WindowDecompress", "WindowFrames", "collate_frames"]


class WindowFrames:
    """One window's stored frames: `ids` the frames' numbers in the pack (inputs then outputs), `samples` one
    {field: StoredSample} per frame. A frame shared by windows is one and the same dict, so pickling a list
    of items (a batch leaving a worker uncollated) carries its bytes once."""

    __slots__ = ("ids", "samples")

    def __init__(self, ids: tuple[int, ...], samples: list[dict[str, StoredSample]]) -> None:
        self.ids, self.samples = ids, samples

    def __len__(self) -> int:
        return len(self.ids)

    def __repr__(self) -> str:
        return f"WindowFrames(frames={list(self.ids)})"


def collate_frames(windows: Sequence[WindowFrames]) -> dict[str, Any]:
    """The stored frames of a batch of windows: each distinct frame once (see the module docstring)."""
    if not windows:
        raise DctDataError("window frames: expected at least one window to collate. Got none")
    position: dict[tuple[Any, int], int] = {}
    distinct: list[dict[str, StoredSample]] = []
    ids: list[int] = []
    rows = []
    for w in windows:
        row = []
        for f, sample in zip(w.ids, w.samples):
            pack = next((v.form.pack for v in sample.values() if isinstance(v, StoredSample)), None)
            p = position.get((pack, f))
            if p is None:
                p = position[(pack, f)] = len(distinct)
                distinct.append(sample)
                ids.append(f)
            row.append(p)
        rows.append(row)
    if len({len(r) for r in rows}) != 1:
        raise DctDataError(
            f"window frames: expected windows of one length. Got lengths {sorted({len(r) for r in rows})}"
        )
    stored = {}
    for name in distinct[0]:
        values = [d[name] for d in distinct]  # a dct field's stored samples; a field stored as it is: tensors
        stored[name] = collate_stored(values) if isinstance(values[0], StoredSample) else torch.stack(values)
    return {
        "stored": stored,
        "rows": torch.tensor(rows, dtype=torch.int64),
        "ids": torch.tensor(ids, dtype=torch.int64),
    }


def _collate_frames_fn(batch, *, collate_fn_map=None) -> dict[str, Any]:
    return collate_frames(batch)


try:  # torch's default collate (and dctdata.decoder.wire.collate, which copies its map) collates window frames
    from torch.utils.data._utils.collate import default_collate_fn_map

    default_collate_fn_map.setdefault(WindowFrames, _collate_frames_fn)
except ImportError:  # pragma: no cover - a torch without the collate map
    pass


class WindowDecompress(nn.Module):
    """A batch of `decode="device"` windows decoded where the module is: each distinct frame of the batch
    decoded once by its fields' `Decompress` layers, normalized (the dataset's `normalization`), moved
    channels last and gathered into `input_fields` (B, n_in, *spatial, F) and `output_fields` (B, n_out,
    *spatial, F); the batch's other keys pass through. `layers` maps every time-varying field to its
    `Decompress` layer, or to None for a field stored as it is (not dct: its values cross as they are).
    `forward` also takes the collated `frames` dict alone
    and then returns the pair (input_fields, output_fields).

    It is also a group decoder of `DecodeAhead` (`start(batches, first)`, `finish(pending)`): the group's
    stored frames go through `DecompressBatches` (one merged decode per field, checked once when the group
    is finished), and each batch, its frames now decoded arrays, is normalized and gathered here."""

    def __init__(
        self,
        layers: Mapping[str, nn.Module | None],
        n_steps_input: int,
        n_spatial: int,
        norm: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> None:
        super().__init__()
        self.names = list(layers)
        self.layers = nn.ModuleDict({n: m for n, m in layers.items() if m is not None})
        self.n_steps_input, self.n_spatial = int(n_steps_input), int(n_spatial)
        self._batches: Any = None  # the `DecompressBatches` of `start` (made on its first call)
        self.register_buffer("shift", None if norm is None else norm[0].clone(), persistent=False)
        self.register_buffer("scale", None if norm is None else norm[1].clone(), persistent=False)

    def frames(self, frames: Mapping[str, Any]) -> torch.Tensor:
        """The distinct frames of a collated `frames` dict, decoded: (n, *spatial, F) float32."""
        stored = frames["stored"]
        missing = [n for n in self.names if n not in stored]
        if missing:
            raise DctDataError(f"window frames: expected the stored fields {self.names}. Got {sorted(stored)}")
        parts = []
        for name in self.names:
            value = stored[name]  # stored bytes, or already decoded (a field stored as it is; `DecodeAhead`)
            x = self.layers[name](value).float() if isinstance(value, STORED_TYPES) else value.float()
            parts.append(x.unsqueeze(1) if x.ndim == 1 + self.n_spatial else x)
        x = torch.cat(parts, dim=1)  # (n, F, *spatial)
        if self.shift is not None:
            x = (x - self.shift.to(x.device)) / self.scale.to(x.device)
        return x.movedim(1, -1)

    def forward(self, batch: Mapping[str, Any]):
        if "stored" in batch and "rows" in batch:  # the frames dict alone
            x = self.frames(batch)
            w = x[batch["rows"].to(x.device)]
            return w[:, : self.n_steps_input], w[:, self.n_steps_input :]
        if not isinstance(batch, Mapping) or "frames" not in batch:
            raise DctDataError(
                "WindowDecompress: expected a batch of decode='device' windows (a dict with 'frames'). Got "
                + (f"keys {sorted(batch)}" if isinstance(batch, Mapping) else type(batch).__name__)
            )
        inputs, outputs = self(batch["frames"])
        return {"input_fields": inputs, "output_fields": outputs, **{k: v for k, v in batch.items() if k != "frames"}}

    def start(self, batches: list, first: int = 0) -> Any:
        """`DecodeAhead`'s call: queue the decode of the stored frames of `batches` (numbered from `first`),
        every dct field's frames of the group in one merged decode."""
        from dctdata.loaders.decode_ahead import DecompressBatches

        for i, b in enumerate(batches):
            if not isinstance(b, Mapping) or "frames" not in b:
                got = f"keys {sorted(b)}" if isinstance(b, Mapping) else type(b).__name__
                raise DctDataError(
                    f"batch {first + i}: expected a batch of decode='device' windows (a dict with 'frames'). Got {got}"
                )
        if not len(self.layers):  # every field stored as it is: nothing to decode ahead
            return list(batches)
        if self._batches is None:
            self._batches = DecompressBatches(dict(self.layers))
        return self._batches, self._batches.start(list(batches), first)

    def finish(self, pending: Any) -> list:
        """The group's batches as `forward` returns them (waits for the decode and checks it)."""
        if isinstance(pending, list):
            return [self(b) for b in pending]
        decoder, group = pending
        return [self(b) for b in decoder.finish(group)]
