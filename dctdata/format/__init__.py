"""The packed-dataset format: everything writers and readers share (FFCV's one format module, split
by job; MosaicML Streaming's `format/<kind>/` packages for the storages).

- `manifest`: the versioned manifest.json (the commit and the only thing a reader trusts).
- `fields`: `FieldSpec`, one field of every sample, and how it is stored.
- `location`, `checksum`, `npy`: paths and URLs, sha256, strict `.npy` bytes.
- `base`: the writer interface; `reader`: the reader interface; `storages`: the registry of storages
  (name -> reader and writer); `zarr/` and `webdataset/`: layout, reader and writer of each storage.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dctdata.format import storages
from dctdata.format.base import PartWriter, Writer
from dctdata.format.fields import SAMPLE_DTYPES, FieldSpec
from dctdata.format.location import MANIFEST_NAME, check_relative_path, is_url, join, manifest_location
from dctdata.format.manifest import (
    FORMAT_NAME,
    FORMAT_VERSION,
    STORAGES,
    ChannelStats,
    FieldStats,
    Manifest,
    parse_manifest,
    read_manifest,
    write_manifest,
    write_manifest_url,
)
from dctdata.kinds import FIELD_KINDS, FieldKind


def make_writer(storage: str, options: Mapping[str, Any] | None = None) -> PartWriter:
    """The writer of a storage format with its options (max_shard_size, chunk_samples, ...)."""
    return storages.make_writer(storage, options)


__all__ = [
    "FIELD_KINDS",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "MANIFEST_NAME",
    "SAMPLE_DTYPES",
    "STORAGES",
    "ChannelStats",
    "FieldKind",
    "FieldSpec",
    "FieldStats",
    "Manifest",
    "PartWriter",
    "Writer",
    "check_relative_path",
    "is_url",
    "join",
    "make_writer",
    "manifest_location",
    "parse_manifest",
    "read_manifest",
    "write_manifest",
    "write_manifest_url",
]
