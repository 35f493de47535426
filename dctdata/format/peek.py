"""A few stored samples of one field, for looking at a pack (`dctdata inspect`) without a DataLoader:
evenly spaced ones from random-access zarr, the first ones in stream order from webdataset."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import torch

from dctdata.format.fields import FieldSpec
from dctdata.format.location import manifest_location
from dctdata.format.manifest import Manifest
from dctdata.format.webdataset.layout import shard_list
from dctdata.format.webdataset.reader import Files, ShardReader
from dctdata.format.zarr.reader import ZarrReader


def peek(
    path_or_url: str, manifest: Manifest, field: FieldSpec, count: int, storage_options: Mapping[str, Any] | None = None
) -> tuple[list[int], torch.Tensor]:
    """(sample indices, their stored values of `field` stacked as tensors)."""
    root, loc = manifest_location(path_or_url)
    n = manifest.samples
    if manifest.storage == "zarr":
        reader = ZarrReader(root, manifest, (field,), storage_options)
        indices = sorted({int(i) for i in np.linspace(0, n - 1, min(count, n))})
        return indices, torch.stack([field.to_tensor(reader.read(field, i, i + 1))[0] for i in indices])
    files = Files(root, storage_options)
    k = manifest.fields.index(field)
    values: list[torch.Tensor] = []
    for entry in shard_list(manifest, loc):
        shard = ShardReader(files, entry, manifest.fields)
        for j in range(len(shard)):
            if len(values) == min(count, n):
                break
            values.append(shard.decode(j)[k])
        if len(values) == min(count, n):
            break
    return list(range(len(values))), torch.stack(values)
