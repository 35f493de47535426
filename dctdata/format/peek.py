"""A few stored samples of one field, for looking at a pack (`dctdata inspect`) without a DataLoader:
evenly spaced ones where the storage reads at random (zarr), else the first ones in stream order
(webdataset)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from dctdata.errors import DctDataError
from dctdata.format import storages
from dctdata.format.fields import FieldSpec, with_partners
from dctdata.format.location import manifest_location
from dctdata.format.manifest import Manifest
from dctdata.format.reader import StorageReader, batch_values


def peek(
    path_or_url: str, manifest: Manifest, field: FieldSpec, count: int, storage_options: Mapping[str, Any] | None = None
) -> tuple[list[int], Any]:
    """(sample indices, their values of `field` batched: a tensor, or the (coefficients, side) pair)."""
    root, _ = manifest_location(path_or_url)
    n = min(count, manifest.samples)
    fields = with_partners(manifest.fields, [field.name])
    reader: StorageReader = storages.open_reader(root, manifest, fields, storage_options)
    if reader.random_access:
        indices = sorted({int(i) for i in np.linspace(0, manifest.samples - 1, n)})
        (value,) = batch_values(fields, reader.read_samples(fields, indices))
        return indices, value
    parts: list[Any] = []
    got = 0
    for unit in reader.units():
        if got >= n:
            break
        for _, values in reader.read_unit(unit, n - got):  # the unit's first n - got samples
            if isinstance(values, DctDataError):  # a bad batch inside the unit
                raise values
            (value,) = values
            parts.append(value)
            got += len(_first(value))
            break
    if isinstance(parts[0], tuple):
        value = tuple(torch.cat([p[k] for p in parts]) for k in range(len(parts[0])))
    else:
        value = torch.cat(parts)
    return list(range(len(_first(value)))), value


def _first(value: torch.Tensor | tuple[torch.Tensor, ...]) -> torch.Tensor:
    return value[0] if isinstance(value, tuple) else value
