"""The registry of storages: a name (the manifest's `storage`, the pack's `--format`) -> its reader and
writer classes (`dctdata.format.reader.StorageReader`, `dctdata.format.base.PartWriter`).

Adding a storage is a `format/<name>/` package with a reader and a writer and one `register` call
here; nothing else compares storage names. Classes are imported on first use, so reading a manifest
does not import every storage's dependencies.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from dctdata.errors import DctDataError

if TYPE_CHECKING:
    from dctdata.format.base import PartWriter
    from dctdata.format.fields import FieldSpec


class PackManifest(Protocol):
    """What the registry reads of a `dctdata.format.manifest.Manifest` (which imports the registry: named here by
    its shape, not imported)."""

    @property
    def storage(self) -> str: ...

    @property
    def layout(self) -> Mapping[str, Any]: ...

    @property
    def checksums(self) -> Mapping[str, Any]: ...


@dataclasses.dataclass(frozen=True)
class Storage:
    """A storage's name, where its reader and writer classes live ("module:Class"), and what callers
    outside its package ask of it instead of comparing names: whether it writes size-capped shards (one
    file a part, the shard flags of `pack` apply) or one file a field a part."""

    name: str
    reader_path: str
    writer_path: str
    sharded: bool = False
    derived_path: str = ""  # "module:function" of the bytes of files it stores and the manifest does not list

    def files(self, parts: int, fields: int) -> int:
        """Stored files a pack of `parts` parts and `fields` fields writes."""
        return parts * (1 if self.sharded else fields)

    def describe_files(self, manifest: PackManifest) -> str:
        """The pack's stored files for a summary line: its shards where sharded, else its files."""
        shards = manifest.layout.get("shards") if self.sharded else None
        return f"{len(shards)} shards" if isinstance(shards, list) else f"{len(manifest.checksums)} files"

    def derived_bytes(self, manifest: PackManifest) -> int:
        """Bytes of the files a pack of this storage stores besides those its manifest lists (format 8's zarr.json
        files, which a reader rebuilds from the manifest)."""
        return int(_load(self.derived_path)(manifest)) if self.derived_path else 0

    @property
    def reader(self) -> Callable[..., Any]:  # a `dctdata.format.reader.StorageReader` class
        cls: Callable[..., Any] = _load(self.reader_path)
        return cls

    @property
    def writer(self) -> Callable[..., PartWriter]:
        cls: Callable[..., PartWriter] = _load(self.writer_path)
        return cls


_REGISTRY: dict[str, Storage] = {}


def register(name: str, reader: str, writer: str, *, sharded: bool = False, derived: str = "") -> None:
    """Register a storage by name with its reader and writer classes given as "module:Class" (`derived`: the
    "module:function" counting the bytes of the files it stores unlisted, `Storage.derived_bytes`)."""
    _REGISTRY[name] = Storage(name, reader, writer, sharded, derived)


def sharded() -> tuple[str, ...]:
    """The names of the storages that write size-capped shards (where `pack`'s shard flags apply)."""
    return tuple(n for n, s in _REGISTRY.items() if s.sharded)


def names() -> tuple[str, ...]:
    """The registered storages' names, in registration order."""
    return tuple(_REGISTRY)


def get(name: object, what: str = "storage") -> Storage:
    """The registered storage `name`; anything else is a DctDataError naming the choices (`what` names
    the setting in it: "--format", a manifest's "storage")."""
    if not isinstance(name, str) or name not in _REGISTRY:
        raise DctDataError(f"{what}: expected one of {names()}. Got {name!r}")
    return _REGISTRY[name]


def make_writer(name: str, options: Mapping[str, Any] | None = None) -> PartWriter:
    """The writer of storage `name` with its options (max_shard_size, chunk_samples, ...)."""
    return get(name, "--format").writer(**dict(options or {}))


def open_reader(
    root: str,
    manifest: PackManifest,
    fields: Sequence[FieldSpec] | None = None,
    storage_options: Mapping[str, Any] | None = None,
    **options: Any,
) -> Any:  # a `dctdata.format.reader.StorageReader` (that module imports this one through the manifest)
    """The reader of `manifest`'s storage over the pack at `root` (options go to its class: shards and
    cache for webdataset)."""
    return get(manifest.storage).reader(root, manifest, fields, storage_options, **options)


def _load(path: str) -> Any:  # the class named by "module:Class"
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


register(
    "zarr",
    "dctdata.format.zarr.reader:ZarrReader",
    "dctdata.format.zarr.writer:ZarrWriter",
    derived="dctdata.format.zarr.layout:derived_bytes",
)
register(
    "webdataset",
    "dctdata.format.webdataset.reader:WebDatasetReader",
    "dctdata.format.webdataset.writer:WebDatasetWriter",
    sharded=True,
)
