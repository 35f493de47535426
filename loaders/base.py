"""What both dataset kinds share: the first layer for a field, the sample container, the repr."""

from __future__ import annotations

from typing import Any, Sequence

import torch

from dctdata.format.fields import FieldSpec, assemble, user_fields
from dctdata.format.manifest import Manifest
from dctdata.layer import Decompress


class PackedDataset:
    """Mixin over a manifest: `decompressor()`, samples as tuples or dicts, and a readable repr."""

    manifest: Manifest
    fields: tuple[FieldSpec, ...]
    root: str
    as_dict: bool

    def decompressor(self, field: str | None = None, **kwargs: Any) -> Decompress:
        """The `Decompress` layer for a dct field (the only one when `field` is None)."""
        return Decompress.from_manifest(self.manifest, field, **kwargs)

    def _make(self, values: Sequence[torch.Tensor]):
        """A sample for the user from the stored values of `self.fields` (a dct field with side information
        becomes its (coefficients, side) pair)."""
        values = assemble(self.fields, values)
        if self.as_dict:
            return {f.name: v for f, v in zip(user_fields(self.fields), values)}
        return tuple(values)

    def _describe(self, **extra: Any) -> str:
        fields = ", ".join(f"{f.name}:{f.kind}{list(f.shape)}" for f in user_fields(self.fields))
        more = "".join(f", {k}={v}" for k, v in extra.items())
        return f"{type(self).__name__}({self.root!r}, samples={self.manifest.samples}{more}, fields=[{fields}])"
