"""A few stored samples of one field, for looking at a pack (`dctdata inspect`) without a DataLoader:
evenly spaced ones from random-access zarr, the first ones in stream order from webdataset."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import torch

from dctdata.format.fields import FieldSpec, assemble, with_partners
from dctdata.format.location import manifest_location
from dctdata.format.manifest import Manifest
from dctdata.format.webdataset.layout import shard_list
from dctdata.format.webdataset.reader import Files, ShardReader
from dctdata.format.zarr.reader import ZarrReader


def peek(
    path_or_url: str, manifest: Manifest, field: FieldSpec, count: int, storage_options: Mapping[str, Any] | None = None
) -> tuple[list[int], Any]:
    """(sample indices, their values of `field` batched: a tensor, or the (coefficients, side) pair)."""
    root, loc = manifest_location(path_or_url)
    n = manifest.samples
    fields = with_partners(manifest.fields, [field.name])
    rows: list[list[torch.Tensor]] = []
    if manifest.storage == "zarr":
        reader = ZarrReader(root, manifest, fields, storage_options)
        indices = sorted({int(i) for i in np.linspace(0, n - 1, min(count, n))})
        rows = [[g.to_tensor(reader.read(g, i, i + 1))[0] for g in fields] for i in indices]
    else:
        files = Files(root, storage_options)
        at = [manifest.fields.index(g) for g in fields]
        for entry in shard_list(manifest, loc):
            shard = ShardReader(files, entry, manifest.fields)
            for j in range(min(len(shard), min(count, n) - len(rows))):
                values = shard.decode(j)
                rows.append([values[k] for k in at])
            if len(rows) == min(count, n):
                break
        indices = list(range(len(rows)))
    (value,) = assemble(fields, [torch.stack([r[k] for r in rows]) for k in range(len(fields))])
    return indices, value
