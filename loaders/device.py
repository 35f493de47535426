"""Getting batches onto the accelerator without stalling it, and putting `Decompress` in front of a model.

The compact coefficients are what crosses the host-device link; they become arrays on the device,
inside the model. Three pieces:

- `to_device(batch, device)`: move a (nested tuple / list / dict / namedtuple) batch of tensors,
  keeping dtypes (int8 coefficients stay int8 on the wire: that is the point), non-blocking.
- `DevicePrefetcher(loader, device)`: iterate a DataLoader with the next batch already in flight.
  On CUDA the copy of batch i+1 runs on a side stream while the model works on batch i, from pinned
  memory so it is truly asynchronous; the consumer's stream waits on the copy and the tensors are
  marked with `record_stream`, so the caching allocator does not recycle their memory too early.
  On other devices it simply moves each batch (on CPU that is a no-op).
- `with_decompress(decompressor, model, transforms=None, train_transforms=None)`: the model with its
  first layer, ``nn.Sequential(decompress, transforms, model)``. torchvision ``transforms.v2``
  modules work on the decoded (B, C, H, W) batch on the device. `train_transforms` (augmentations)
  only run in training mode; `transforms` (e.g. `Normalize`) always run.

Typical loop::

    ds = dctdata.open_dataset("train.zarr")
    loader = DataLoader(ds, batch_size=64, shuffle=True, num_workers=4, pin_memory=True)
    net = with_decompress(ds.decompressor(), MyNet(), transforms=v2.Normalize(mean, std),
                          train_transforms=v2.RandomHorizontalFlip()).to(device)
    for epoch in range(epochs):
        for coeffs, label in DevicePrefetcher(loader, device):
            loss = F.cross_entropy(net(coeffs), label)
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch
from torch import nn

from dctdata.decoder.wire import STORED_TYPES
from dctdata.errors import DctDataError
from dctdata.parse import is_int

__all__ = ["AugmentOnDevice", "DevicePrefetcher", "pin", "resolve_device", "to_device", "with_decompress"]


def resolve_device(device: torch.device | str | int | None = None) -> torch.device:
    """A torch.device from a name/index; None means CUDA when available, else CPU.

    Refuses a CUDA device that is not there (rather than failing later inside a worker).
    """
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not isinstance(device, (torch.device, str)) and not is_int(device):
        raise TypeError(
            f"device: expected a torch.device, a name such as 'cpu' or 'cuda:0', or an index. Got {device!r}"
        )
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError) as exc:
        raise DctDataError(f"device: expected a device name such as 'cpu' or 'cuda:0'. Got {device!r}") from exc
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise DctDataError(f"device: expected an available device. Got {device!r} but CUDA is not available")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise DctDataError(f"device: expected a CUDA index below {torch.cuda.device_count()}. Got {device!r}")
    return dev


def map_leaves(batch: Any, fn: Callable[[Any], Any]) -> Any:
    """fn applied to every leaf of a nested tuple/list/dict/namedtuple batch (tensors, stored batches, numbers,
    strings...), the containers rebuilt with their types."""
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # namedtuple
        return type(batch)(*(map_leaves(b, fn) for b in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(map_leaves(b, fn) for b in batch)
    if isinstance(batch, Mapping):
        items = {k: map_leaves(v, fn) for k, v in batch.items()}
        try:
            return type(batch)(items)
        except TypeError:  # a Mapping type that cannot be built from a dict
            return items
    return fn(batch)


def _map(batch: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """Apply fn to every tensor in a nested tuple/list/dict/namedtuple, keeping the container types."""

    def leaf(value):
        if isinstance(value, torch.Tensor):
            return fn(value)
        if isinstance(value, STORED_TYPES):  # decode="device": its buffer, offsets, rows and side (each pack's)
            return value.apply(fn)
        return value  # numbers, strings, None, numpy arrays: left as they are

    return map_leaves(batch, leaf)


def _tensors(batch: Any) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    _map(batch, lambda t: out.append(t) or t)
    return out


def to_device(batch: Any, device: torch.device | str, non_blocking: bool = True) -> Any:
    """Move every tensor in a nested batch to `device` with its dtype unchanged; other leaves pass through.

    `non_blocking=True` only overlaps with computation when the source is pinned (see `pin`).
    """
    dev = device if isinstance(device, torch.device) else resolve_device(device)
    return _map(batch, lambda t: t.to(dev, non_blocking=non_blocking))


def pin(batch: Any) -> Any:
    """Page-lock the CPU tensors of a batch (already pinned ones are kept); needs CUDA."""
    return _map(batch, lambda t: t if t.device.type != "cpu" or t.is_pinned() else t.pin_memory())


class DevicePrefetcher:
    """Iterate `loader` with batches on `device`; on CUDA the next batch is copied while this one is used.

    len() is the loader's; each `iter()` starts a new pass over the loader (one per epoch). With
    `pin_memory=True` unpinned CPU tensors are pinned before the copy (set `pin_memory=True` on the
    DataLoader instead to pin in its background thread, which is cheaper).

    Args:
        loader: The loader to iterate (e.g. a DataLoader `make_loader` returned).
        device: Where batches go (default: the current CUDA device if any, else the CPU).
        non_blocking: Copy asynchronously (CUDA, pinned memory).
        pin_memory: Pin unpinned CPU tensors before the copy.

    Raises:
        TypeError: `loader` is not iterable or `device` has the wrong type.
        DctDataError: `device` is not a device name or is not available.
    """

    def __init__(
        self,
        loader: Iterable,
        device: torch.device | str | int | None = None,
        non_blocking: bool = True,
        pin_memory: bool = True,
    ) -> None:
        if not isinstance(loader, Iterable):
            raise TypeError(f"loader: expected an iterable such as a torch DataLoader. Got {type(loader).__name__}")
        self.loader = loader
        self.device = resolve_device(device)
        self.non_blocking = bool(non_blocking)
        self.pin_memory = bool(pin_memory) and self.device.type == "cuda"

    def __len__(self) -> int:
        try:
            return len(self.loader)  # type: ignore[arg-type]
        except TypeError:
            raise TypeError(
                f"len(DevicePrefetcher): expected a loader with a length. Got {type(self.loader).__name__} without "
                "__len__"
            ) from None

    def __iter__(self) -> Iterator[Any]:
        if self.device.type == "cuda":
            return self._iter_cuda()
        return (to_device(batch, self.device, self.non_blocking) for batch in self.loader)

    def _iter_cuda(self) -> Iterator[Any]:
        stream = torch.cuda.Stream(device=self.device)
        batches = iter(self.loader)

        def load() -> Any:
            try:
                batch = next(batches)
            except StopIteration:
                return _END
            if self.pin_memory:
                batch = pin(batch)
            with torch.cuda.stream(stream):
                return to_device(batch, self.device, self.non_blocking)

        nxt = load()
        while nxt is not _END:
            current = torch.cuda.current_stream(self.device)
            current.wait_stream(stream)  # the copy of this batch has finished before the model reads it
            batch = nxt
            for t in _tensors(batch):
                if t.device.type == "cuda":
                    t.record_stream(current)  # memory allocated on the side stream, used on this one
            nxt = load()  # start the next copy before handing this batch over
            yield batch

    def __repr__(self) -> str:
        return f"DevicePrefetcher(device={self.device}, non_blocking={self.non_blocking}, pin_memory={self.pin_memory})"


_END = object()


class AugmentOnDevice(nn.Module):
    """Transforms on the decoded batch: `train` only in training mode, then `always` in every mode.

    torchvision v2 transforms draw one set of random parameters per call, so on a batch every sample
    gets the same flip/crop; `per_sample=True` calls `train` once per sample instead (slower, a
    Python loop over the batch).
    """

    def __init__(self, always: Callable | None = None, train: Callable | None = None, per_sample: bool = False) -> None:
        super().__init__()
        for name, t in (("transforms", always), ("train_transforms", train)):
            if t is not None and not callable(t):
                raise TypeError(
                    f"{name}: expected a callable such as a torchvision.transforms.v2 transform. Got {type(t).__name__}"
                )
        # nn.Module transforms (all of v2) register as submodules, so .to(device) reaches their tensors.
        self.always = always
        self.train_tf = train
        self.per_sample = bool(per_sample)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and self.train_tf is not None:
            x = torch.stack([self.train_tf(s) for s in x]) if self.per_sample else self.train_tf(x)
        if self.always is not None:
            x = self.always(x)
        return x


def with_decompress(
    decompressor: nn.Module,
    model: nn.Module,
    transforms: Callable | None = None,
    train_transforms: Callable | None = None,
    per_sample: bool = False,
) -> nn.Sequential:
    """``nn.Sequential(decompress, [augment], model)``: a model that eats coefficient batches.

    `decompressor` is a `dctdata.Decompress` (e.g. `ds.decompressor()`); the transforms see the
    decoded (B, C, H, W) float batch on the model's device. Submodules are named `decompress`,
    `augment` (only when there are transforms) and `model`, so `seq.model` is the original network.
    """
    if not isinstance(decompressor, nn.Module):
        raise TypeError(
            f"decompressor: expected an nn.Module such as dctdata.Decompress. Got {type(decompressor).__name__}"
        )
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected an nn.Module. Got {type(model).__name__}")
    parts: OrderedDict[str, nn.Module] = OrderedDict(decompress=decompressor)
    if transforms is not None or train_transforms is not None:
        parts["augment"] = AugmentOnDevice(transforms, train_transforms, per_sample)
    parts["model"] = model
    return nn.Sequential(parts)
