"""Reading a webdataset pack with webdataset's own pipeline instead of dctdata's loader (the layout is in
docs/guides/field-kinds-and-webdataset.md):

    import webdataset as wds
    from dctdata.loaders import WdsDecoder

    dec = WdsDecoder("pack/")
    ds = wds.WebDataset(dec.urls, shardshuffle=False).decode(dec.handler).compose(dec.samples)
    for sample in ds:  # {"__key__": "000000007", "image": float32 tensor (C, H, W), "label": tensor(7), ...}
        ...

`handler` is a webdataset decoder handler: it turns each member of a grouped pack (manifest version 5)
into its (K, ...) array, checked against the manifest, and leaves other keys to webdataset. `samples`
is a pipeline stage: it splits each group into its K samples (dropping the zero rows that pad a pack's
last group) and, with `decode=True`, turns a dct field's coefficients and side values into the field's
values with `dctdata.Decompress`, the same tensors `open_dataset(pack).decompressor(field)` gives.

Why by hand: webdataset knows `.npy` but neither a bytes codec's `.npy.zst` nor the entropy coder's
`.ctx`, and it yields one dict per tar key; a pack's members hold K samples each.

Unlike `open_dataset`, this reads shards as webdataset does: shard bytes are not checked against the
manifest's sha256 (each member is still checked for its dtype and shape, and every decoder of stored
bytes is bounded by the size the manifest gives).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np
import torch

from dctdata.errors import DctDataError, IntegrityError
from dctdata.format.fields import SIDE_SUFFIX, user_fields
from dctdata.format.location import MANIFEST_NAME, join
from dctdata.format.webdataset.layout import group_members, group_name, sample_key, samples_per_member, shard_list
from dctdata.format.webdataset.reader import Files, WebDatasetReader, codecs_for, group_member


class WdsDecoder:
    """What webdataset's pipeline needs to read the pack at `path` (a directory or fsspec URL prefix):
    `urls` (its shards in order), `handler` (for `.decode`) and `samples` (for `.compose`)."""

    def __init__(
        self, path: str | os.PathLike, storage_options: Mapping[str, Any] | None = None, decode: bool = True
    ) -> None:
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path: expected a pack's directory or URL. Got {type(path).__name__}")
        self.root = os.fspath(path)
        self.manifest = Files(self.root, storage_options).manifest()
        where = join(self.root, MANIFEST_NAME)
        if self.manifest.storage != WebDatasetReader.storage:
            raise DctDataError(f"{where}: expected a webdataset pack. Got storage {self.manifest.storage!r}")
        k = samples_per_member(self.manifest.layout, where)
        if k is None:
            raise DctDataError(
                f"{where}: expected a pack with one array per member (manifest version 5, "
                f"layout.samples_per_member). Got version {self.manifest.version} per-sample members: read it with "
                "dctdata.open_dataset, or repack it"
            )
        self.k, self.decode = k, bool(decode)
        self.urls = [join(self.root, s["name"]) for s in shard_list(self.manifest, where)]
        self.codecs = codecs_for(self.manifest.fields)
        # webdataset lower-cases member suffixes and hands handlers "." + suffix
        members = group_members(self.manifest.fields)
        self._members = {"." + group_name(f, side).lower(): (f, side) for f, side in members}
        self._partner = {f.name[: -len(SIDE_SUFFIX)]: f for f, side in members if side}  # dct field -> its side
        self._layers: dict[str, Any] = {}

    def handler(self, key: str, data: bytes) -> np.ndarray | None:
        """webdataset decoder handler: a member of this pack -> its (K, *stored_shape) array; None (left to
        webdataset's other handlers) for any other suffix."""
        member = self._members.get(key.lower())
        if member is None:
            return None
        f, side = member
        where = f"webdataset member {key[1:]!r}"
        return group_member(f, None if side else self.codecs[f.name], memoryview(data), self.k, where)

    def samples(self, groups: Iterable[Mapping[str, Any]]) -> Iterator[dict[str, Any]]:
        """webdataset pipeline stage (`.compose(dec.samples)`): decoded groups -> one dict per sample, keyed
        by field name (plus `__key__` and `__url__`)."""
        for group in groups:
            key = group.get("__key__")
            if not isinstance(key, str) or not key.isdigit():
                raise IntegrityError(f"{group.get('__url__')}: expected a numeric sample key. Got {key!r}")
            first = int(key)
            rows = min(self.k, self.manifest.samples - first)
            if rows <= 0 or first % self.k:
                raise IntegrityError(
                    f"{group.get('__url__')}: key {key}: expected a group's first sample, a multiple of {self.k} "
                    f"below {self.manifest.samples}. Got {first}"
                )
            values = {f.name: self._field(group, f, rows) for f in user_fields(self.manifest.fields)}
            for r in range(rows):
                out = {"__key__": sample_key(first + r), "__url__": group.get("__url__")}
                out.update({name: v[r] for name, v in values.items()})
                yield out

    def _array(self, group: Mapping[str, Any], f, side: bool) -> np.ndarray:
        name = group_name(f, side).lower()
        if name not in group:
            raise IntegrityError(
                f"{group.get('__url__')}: key {group.get('__key__')}: expected member {name!r}. Got none"
            )
        arr = group[name]
        if not isinstance(arr, np.ndarray):
            raise DctDataError(
                f"{group.get('__url__')}: member {name!r}: expected an array from WdsDecoder.handler. Got "
                f"{type(arr).__name__} (pass dec.handler to .decode())"
            )
        return arr

    def _field(self, group: Mapping[str, Any], f, rows: int) -> Any:
        """The group's first `rows` values of user field f: decoded through `Decompress` (a dct field with
        `decode`), else the stored values as tensors (a dct field's as (coefficients, side values))."""
        arr = np.ascontiguousarray(self._array(group, f, False)[:rows])
        if not f.coded:
            return [f.kind_type.decode(f, a) for a in arr]
        q = torch.from_numpy(arr)
        partner = self._partner.get(f.name)
        side = None
        if partner is not None:
            side = torch.from_numpy(np.ascontiguousarray(self._array(group, partner, True)[:rows]))
        if not self.decode:
            return list(q) if side is None else list(zip(q, side))
        layer = self._layers.get(f.name)
        if layer is None:  # the field's kind owns its decoder (the model side's layer: only this stage needs it)
            layer = self._layers[f.name] = f.kind_type.layer(f)
        with torch.no_grad():
            return f.kind_type.decode(f, q if side is None else (q, side), layer)
