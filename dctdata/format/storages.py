"""The registry of storages: a name (the manifest's `storage`, the pack's `--format`) -> everything asked of
it: its reader and writer classes (`dctdata.format.reader.StorageReader`, `dctdata.format.base.PartWriter`),
the loaders' dataset and time-window classes `open_dataset` returns, its writer options (each with its
`dctdata pack` flag and help), how it splits a pack into files and how a summary names them.

Adding a storage is a `format/<name>/` package with a reader and a writer, a dataset class in the loaders,
and one `register` call here; nothing else compares storage names or spells a storage's options. Classes
are named "module:Class" and imported on first use, so reading a manifest does not import every storage's
dependencies, and the core names the loaders' classes without importing them (`dctdata.api`, which joins
the core and the loaders, loads them: `load`).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from dctdata.errors import DctDataError
from dctdata.parse import parse_size

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


class ReaderClass(Protocol):
    """What callers ask of a storage's reader class, a `dctdata.format.reader.StorageReader` subclass (that
    module imports this one through the manifest: named by its shape, not imported): whether it reads samples
    at random, a stream's manifest (storages that read streams) and an instance over a pack (`open_reader`)."""

    random_access: bool

    def stream_manifest(self, url: str, storage_options: Mapping[str, Any] | None = None) -> Any: ...

    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...


@dataclasses.dataclass(frozen=True)
class Option:
    """A writer option of a storage, declared once: the writer's keyword (and `writer_options`' key), its
    help (what `dctdata pack --help` prints after the storage's name), the flag's argparse `type` and
    `metavar`, its `default` (what the flag's absence means: the writer's own default, None where the
    writer derives it from the pack, as the help says; a flag left at it is not passed on) and `parse`: how
    a given value, a flag's text or a Python value, becomes the writer's (None: as given, the writer checks
    it; called with the value and the flag, which its errors name). `flag` "" derives `--name-with-dashes`."""

    name: str
    help: str
    type: Callable[[str], Any] = str
    metavar: str = "N"
    default: Any = None
    parse: Callable[[Any, str], Any] | None = None
    flag: str = ""

    @property
    def cli_flag(self) -> str:
        """The option's `dctdata pack` flag."""
        return self.flag or "--" + self.name.replace("_", "-")

    def value(self, value: Any) -> Any:
        """`value` as the writer takes it (`parse` applied)."""
        return value if self.parse is None else self.parse(value, self.cli_flag)


@dataclasses.dataclass(frozen=True)
class Storage:
    """A storage's name, where its classes live ("module:Class": reader and writer in `format/<name>/`, the
    dataset and the time windows `open_dataset` returns in `dctdata.loaders`, which only `dctdata.api` loads:
    the core never imports the loaders), its writer options, and what callers outside its package ask of it
    instead of comparing names: a summary for `--format`'s help, whether it writes size-capped shards (one
    file a part) or one file a field a part, and whether it reads a shell `pipe:` stream (no manifest is
    read first)."""

    name: str
    reader_path: str
    writer_path: str
    dataset_path: str = ""
    windows_path: str = ""
    summary: str = ""
    options: tuple[Option, ...] = ()
    sharded: bool = False
    streams: bool = False
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
        return int(load(self.derived_path)(manifest)) if self.derived_path else 0

    @property
    def reader(self) -> ReaderClass:  # a `dctdata.format.reader.StorageReader` class
        cls: ReaderClass = load(self.reader_path)
        return cls

    @property
    def writer(self) -> Callable[..., PartWriter]:
        cls: Callable[..., PartWriter] = load(self.writer_path)
        return cls

    def option(self, name: str) -> Option | None:
        """The writer option `name` (None: this storage has none of that name)."""
        return next((o for o in self.options if o.name == name), None)

    def writer_options(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """`given` (option -> value) checked against this storage's options and parsed as its writer takes
        them. An option another storage has is an error naming that storage's flags (`--format` chose
        another); one no storage has (only `writer_options` can hold one) names this storage's options."""
        out = {}
        for name, value in given.items():
            option = self.option(name)
            if option is None:
                owner = next((s for s in _REGISTRY.values() if s.option(name) is not None), None)
                if owner is not None:
                    flags = "/".join(o.cli_flag for o in owner.options)
                    raise DctDataError(
                        f"{flags}: expected --format {owner.name}. Got --format {self.name} (storage {self.name!r} "
                        f"has no writer option {name!r})"
                    )
                mine = ", ".join(o.name for o in self.options) or "none"
                raise DctDataError(
                    f"writer_options: expected the options of storage {self.name!r} ({mine}). Got {name!r}, which "
                    "no storage has"
                )
            out[name] = option.value(value)
        return out


_REGISTRY: dict[str, Storage] = {}


def register(
    name: str,
    reader: str,
    writer: str,
    *,
    dataset: str = "",
    windows: str = "",
    summary: str = "",
    options: Sequence[Option] = (),
    sharded: bool = False,
    streams: bool = False,
    derived: str = "",
) -> Storage:
    """Register a storage: everything asked of it, its classes given as "module:Class" (see `Storage`).

    Args:
        name: The manifest's `storage` and the pack's `--format` value.
        reader: Its `dctdata.format.reader.StorageReader` class, in `format/<name>/`.
        writer: Its `dctdata.format.base.PartWriter` class, in `format/<name>/`; it takes `options` as keywords.
        dataset: The loaders' dataset class `open_dataset` returns for its packs.
        windows: The loaders' time windows over its packs of trajectories (`open_dataset`'s window options).
        summary: A few words for `--format`'s help ("random access").
        options: Its writer's options; each becomes a `dctdata pack` flag and a `writer_options` key.
        sharded: It writes size-capped shards, one file a part (else one file a field a part).
        streams: It reads a shell `pipe:` stream without a manifest first.
        derived: The "module:function" counting the bytes of the files it stores that its manifest does
            not list (`Storage.derived_bytes`).

    Returns:
        The `Storage` registered.

    Raises:
        DctDataError: An option's name or flag is another storage's (`dctdata pack` has one flag per option).
    """
    storage = Storage(name, reader, writer, dataset, windows, summary, tuple(options), sharded, streams, derived)
    taken = {k: s.name for s in _REGISTRY.values() if s.name != name for o in s.options for k in (o.name, o.cli_flag)}
    for o in storage.options:
        for k in (o.name, o.cli_flag):
            if k in taken:
                raise DctDataError(f"storage {name!r}: option {k}: expected a name of its own. Got one of {taken[k]!r}")
    _REGISTRY[name] = storage
    return storage


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


def streaming() -> Storage:
    """The storage that reads a shell `pipe:` stream (`open_dataset("pipe:...")`)."""
    found = [s for s in _REGISTRY.values() if s.streams]
    if not found:
        raise DctDataError(f"pipe: expected a storage that reads a stream. Got none of {names()}")
    return found[0]


def options() -> tuple[tuple[Storage, Option], ...]:
    """Every storage's writer options with their storage, in registration order."""
    return tuple((s, o) for s in _REGISTRY.values() for o in s.options)


def option_help(option: str) -> str:
    """The help of the writer option `option` as `dctdata pack --help` prints it: "<storage>: <help>"."""
    storage, found = next(((s, o) for s, o in options() if o.name == option), (None, None))
    if storage is None or found is None:
        raise DctDataError(f"{option}: expected a storage's writer option. Got one no storage has")
    return f"{storage.name}: {found.help}"


def options_summary() -> str:
    """Each storage's writer options by name (`writer_options`' help)."""
    return "; ".join(f"{s.name} {', '.join(o.name for o in s.options)}" for s in _REGISTRY.values() if s.options)


def format_help() -> str:
    """`--format`'s help: each storage and its summary, the first the default."""
    said = [f"{s.name} ({s.summary}{', default' if i == 0 else ''})" for i, s in enumerate(_REGISTRY.values())]
    return " or ".join(said)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add every storage's writer options to `dctdata pack`'s parser, a group per storage (dest: the option's
    name)."""
    for storage in _REGISTRY.values():
        if not storage.options:
            continue
        group = parser.add_argument_group(f"{storage.name} writer options", f"with --format {storage.name}")
        for o in storage.options:
            group.add_argument(
                o.cli_flag,
                dest=o.name,
                default=o.default,
                type=o.type,
                metavar=o.metavar,
                help=f"{storage.name}: {o.help}".replace("%", "%%"),  # argparse formats help with %
            )


def make_writer(name: str, options: Mapping[str, Any] | None = None) -> PartWriter:
    """The writer of storage `name` with its options (max_shard_size, chunk_samples, ...; `storage_options`
    for a URL is the pack's, not a writer option)."""
    storage = get(name, "--format")
    given = dict(options or {})
    extra = {"storage_options": given.pop("storage_options")} if "storage_options" in given else {}
    return storage.writer(**storage.writer_options(given), **extra)


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


def load(path: str) -> Any:
    """The class (or function) named by "module:Class"."""
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


register(
    "zarr",
    "dctdata.format.zarr.reader:ZarrReader",
    "dctdata.format.zarr.writer:ZarrWriter",
    dataset="dctdata.loaders.zarr_dataset:DCTZarrDataset",
    windows="dctdata.loaders.windows:open_windows",
    summary="random access",
    options=(
        Option(
            "chunk_samples",
            "samples per inner chunk, what a random read decodes (default: per field, a power of two of at most "
            "16 KiB stored, at least one sample)",
            type=int,
        ),
        Option(
            "shard_samples",
            "samples per shard file, every field's, a multiple of --chunk-samples (default: a power of two of at "
            "most 32 MiB stored and 128 MiB of source)",
            type=int,
        ),
    ),
    derived="dctdata.format.zarr.layout:derived_bytes",
)
register(
    "webdataset",
    "dctdata.format.webdataset.reader:WebDatasetReader",
    "dctdata.format.webdataset.writer:WebDatasetWriter",
    dataset="dctdata.loaders.wds_dataset:DCTWebDataset",
    windows="dctdata.loaders.wds_windows:open_web_windows",
    summary="streaming shards",
    options=(
        Option(
            "max_shard_size",
            "cap on each .tar shard, in bytes or with a unit: 64MiB, '1.5 GB' (default 256 MiB)",
            metavar="SIZE",
            parse=parse_size,
        ),
        Option(
            "samples_per_shard",
            "samples per shard (default: as many as fit the cap, and at least 16 shards for a set of 16 samples or "
            "more, so ranks x DataLoader workers each get whole shards)",
            type=int,
        ),
        Option(
            "samples_per_member",
            "samples per tar member, 1..256 (default: about 256 KiB of source per member, 1 for larger samples, at "
            "most 1/16 of the set; each member costs a 512-byte tar header and padding)",
            type=int,
            metavar="K",
        ),
    ),
    sharded=True,
    streams=True,
)
