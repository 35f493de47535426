"""What both dataset kinds share: the first layer for a field, the sample container, the source's
metadata (coordinates, field attributes, validity masks), the repr."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from dctdata.format.coords import decode_coord
from dctdata.format.fields import FieldSpec
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
        f = self.manifest.field(field, kind="dct" if field is None else None)
        return dict(f.attrs)

    def valid_field(self, field: str | None = None) -> str | None:
        """Name of the field holding the validity mask of a dct field (True/nonzero = valid), or None when
        every pixel is valid. Its values come with each sample, like any field."""
        return self.manifest.field(field, kind="dct" if field is None else None).valid

    def _make(self, values: Sequence[torch.Tensor]):
        if self.as_dict:
            return {f.name: v for f, v in zip(self.fields, values)}
        return tuple(values)

    def _describe(self, **extra: Any) -> str:
        fields = ", ".join(f"{f.name}:{f.kind}{list(f.shape)}" for f in self.fields)
        more = "".join(f", {k}={v}" for k, v in extra.items())
        return f"{type(self).__name__}({self.root!r}, samples={self.manifest.samples}{more}, fields=[{fields}])"
