"""What both dataset kinds share: the first layer for a field (optionally clamped to the source's
range), the class names a source gave, the sample container, the source's metadata (coordinates, field
attributes, validity masks), the pack's fingerprint and the repr."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from dctdata.decoder.layer import Decompress
from dctdata.decoder.wire import PackCodec
from dctdata.errors import DctDataError, FormatError
from dctdata.format.coords import decode_coord
from dctdata.format.fields import FieldSpec, assemble, user_fields, with_side
from dctdata.format.manifest import Manifest
from dctdata.format.reader import pack_identity


class ClampToRange(nn.Module):
    """Clamp decoded values to per-channel [low, high] (C,) bounds: quantization error can push an
    integer source's values past its range (a uint16 frame decoding to -1025)."""

    def __init__(self, low: Sequence[float], high: Sequence[float]) -> None:
        super().__init__()
        self.register_buffer("low", torch.tensor(low, dtype=torch.float32).view(-1, 1, 1), persistent=False)
        self.register_buffer("high", torch.tensor(high, dtype=torch.float32).view(-1, 1, 1), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.clamp(x, self.low.to(x), self.high.to(x))

    def extra_repr(self) -> str:
        return f"low={self.low.flatten().tolist()}, high={self.high.flatten().tolist()}"


class PackedDataset:
    """Mixin over a manifest: `decompressor()`, `classes`, samples as tuples or dicts, a fingerprint
    (what a loader's state_dict is checked against) and a readable repr."""

    manifest: Manifest
    fields: tuple[FieldSpec, ...]
    root: str
    as_dict: bool

    def decompressor(
        self, field: str | None = None, clamp: bool | tuple[float, float] = False, **kwargs: Any
    ) -> nn.Module:
        """The `Decompress` layer for a dct field (the only one when `field` is None).

        clamp=True also clamps its output to the range of an integer source dtype (uint16: 0..65535);
        clamp=(low, high) to that range in source units. Either way the result is
        `nn.Sequential(Decompress, ClampToRange)`, with the bounds normalized like the output when the
        codec normalizes."""
        layer = Decompress.from_manifest(self.manifest, field, **kwargs)
        f = self.manifest.coded_field(field)
        # its pack, for messages naming the packs of stored bytes it is given (`dctdata.decoder.wire.PackCodec`)
        layer.pack_codec = PackCodec(pack_identity(self.manifest), str(self.root), f.codec, f.lossless)
        if clamp is False or clamp is None:
            return layer
        if clamp is True:
            if not np.issubdtype(np.dtype(f.dtype), np.integer):
                raise DctDataError(
                    f"clamp=True: expected a field with an integer source dtype to take the range from. Got field "
                    f"{f.name!r} of {f.dtype} (pass clamp=(low, high))"
                )
            info = np.iinfo(np.dtype(f.dtype))
            low, high = float(info.min), float(info.max)
        elif isinstance(clamp, (tuple, list)) and len(clamp) == 2 and all(isinstance(v, (int, float)) for v in clamp):
            low, high = float(clamp[0]), float(clamp[1])
            if not low <= high:
                raise DctDataError(f"clamp: expected low <= high. Got {tuple(clamp)}")
        else:
            raise TypeError(f"clamp: expected True, False or a (low, high) pair of numbers. Got {clamp!r}")
        channels = f.codec.channels
        mean, std = f.codec.mean, f.codec.std
        if mean is not None and layer.normalize:
            lows = [(low - m) / s for m, s in zip(mean, std)]
            highs = [(high - m) / s for m, s in zip(mean, std)]
        else:
            lows, highs = [low] * channels, [high] * channels
        return nn.Sequential(layer, ClampToRange(lows, highs))

    @property
    def classes(self) -> list[str] | None:
        """Class names the source gave (image-folder subfolders, a torchvision dataset's `classes`), in
        label order; None when it gave none."""
        info = self.manifest.pack.get("source_info") or {}
        classes = info.get("classes") if isinstance(info, dict) else None
        if classes is None:
            return None
        if not isinstance(classes, list) or not all(isinstance(c, str) for c in classes):
            raise FormatError(f"{self.root}: pack.source_info.classes: expected a list of names. Got {classes!r}")
        return list(classes)

    @property
    def class_to_idx(self) -> dict[str, int] | None:
        """{class name: label}, as torchvision's ImageFolder has it; None without class names."""
        classes = self.classes
        return None if classes is None else {c: i for i, c in enumerate(classes)}

    @property
    def fingerprint(self) -> str:
        """A short hash of the manifest (and of the shards opened): two datasets with the same
        fingerprint yield the same samples in the same order for the same settings."""
        h = hashlib.sha256(self.manifest.to_json().encode())
        for entry in getattr(self, "shards", ()):
            h.update(entry["name"].encode())
        return h.hexdigest()[:16]

    @property
    def coords(self) -> dict[str, np.ndarray]:
        """The source's 1-D coordinates (e.g. of a NetCDF/zarr store): name -> numpy array (datetime64 for
        times). A coordinate along the sample axis has one value per sample in pack order, so for a
        map-style dataset `ds.coords["time"][i]` is sample i's time; a webdataset stream yields samples
        shuffled, so pair them by index only through a field packed with them."""
        return {name: decode_coord(entry) for name, entry in self.manifest.coords.items()}

    def attrs(self, field: str | None = None) -> dict[str, Any]:
        """What the source said about a field (units, long_name, its dims; a stacked field: its channels
        and each variable's attributes); the only dct field when `field` is None."""
        f = self.manifest.coded_field(field)
        return dict(f.attrs)

    def valid_field(self, field: str | None = None) -> str | None:
        """Name of the field holding the validity mask of a dct field (True/nonzero = valid), or None when
        every pixel is valid. Its values come with each sample, like any field."""
        return self.manifest.coded_field(field).valid

    def _make(self, values: Sequence[torch.Tensor]):
        """A sample for the user from the stored values of `self.fields` (a dct field with side information
        becomes its (coefficients, side) pair)."""
        values = assemble(self.fields, values)
        if self.as_dict:
            return {f.name: v for f, v in zip(user_fields(self.fields), values)}
        return tuple(values)

    def _make_many(self, columns: Sequence[Sequence[torch.Tensor]]) -> list:
        """The samples of a batch, `columns[i][k]` being field i's stored value of sample k: what `_make`
        gives for each sample, with `assemble`'s pairing worked out once for the batch (on the fields'
        positions) instead of once per sample."""
        plan = assemble(self.fields, range(len(self.fields)))  # a position, or a (coefficients, side) pair
        keys = [f.name for f in user_fields(self.fields)]
        samples = []
        for k in range(len(columns[0]) if columns else 0):
            values = [
                with_side(columns[p[0]][k], columns[p[1]][k]) if isinstance(p, tuple) else columns[p][k] for p in plan
            ]
            samples.append(dict(zip(keys, values)) if self.as_dict else tuple(values))
        return samples

    def _describe(self, **extra: Any) -> str:
        fields = ", ".join(f"{f.name}:{f.kind}{list(f.shape)}" for f in user_fields(self.fields))
        more = "".join(f", {k}={v}" for k, v in extra.items())
        return f"{type(self).__name__}({self.root!r}, samples={self.manifest.samples}{more}, fields=[{fields}])"
