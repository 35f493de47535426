"""Top-level Python API mirroring the CLI: `dctdata.pack(...)`, `dctdata.Writer(...)` and
`dctdata.open_dataset(...)`.

All import their implementation lazily (`Writer` through the module `__getattr__`), so the core never
imports `dctdata.preprocess`/`dctdata.loaders` at import time. `pack`'s keywords are written out (an IDE
and a type checker see each one) and are `dctdata.settings.PackSettings`' fields, which a test checks.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

from dctdata.errors import DctDataError
from dctdata.format import Manifest, read_manifest, storages
from dctdata.format.location import shard_selection
from dctdata.settings import PackSettings
from dctdata.stages import AUTO

SETTINGS = frozenset(PackSettings.names())


def pack(
    source: Any,
    out: str | os.PathLike,
    *,
    format: str = "zarr",
    cf: int | None = None,
    mask: str | None = None,
    dims: int | None = None,
    quant: str | None = None,
    target_psnr: float | str | Mapping[str, float] | None = None,
    max_error: float | str | Mapping[str, float] | None = None,
    max_rel_error: float | str | Mapping[str, float] | None = None,
    fields: Mapping[str, str] | Sequence[str] | None = None,
    key: str | Sequence[str] | None = None,
    channels_last: bool | None = None,
    nan: str | float = "error",
    valid: Mapping[str, str] | Sequence[str] | None = None,
    sample_dim: str | None = None,
    variables: str | Sequence[str] | None = None,
    stack: str | None = None,
    allow_external: bool = False,
    codec: Mapping[str, Any] | str | None = AUTO,
    strict: bool = False,
    overwrite: bool = False,
    quiet: bool = False,
    workers: int | None = None,
    scheduler: str | None = None,
    device: str = "cpu",
    resume: bool = False,
    max_shard_size: int | str | None = None,
    samples_per_shard: int | None = None,
    samples_per_member: int | None = None,
    calibration: Any = None,
    length: int | None = None,
    writer_options: Mapping[str, Any] | None = None,
    storage_options: Mapping[str, Any] | None = None,
    settings: PackSettings | None = None,
) -> Manifest:
    """Pack SOURCE into a dataset at OUT; returns the manifest written.

    SOURCE: a path or URL (.npy, .npz, HDF5, NetCDF, zarr store, a directory of per-sample files or
    images), a module:callable, or a Python object: a NumPy array or torch tensor (samples first), a
    dict of arrays (a field each), an xarray.Dataset, a map-style dataset, or an iterable/generator of
    samples (dicts, tuples or arrays; `length=` when known).

    The keywords are the fields of `dctdata.PackSettings` (the CLI's flags in snake_case; each field's
    help says what it does), or pass `settings=PackSettings(...)` instead of them."""
    from dctdata.preprocess.pack import pack as _pack

    given = {k: v for k, v in locals().items() if k in SETTINGS}
    return _pack(source, out, PackSettings.resolve(settings, given, "pack"))


def open_dataset(path_or_url: str | os.PathLike | list, **kwargs: Any):
    """Open a packed dataset: a map-style `DCTZarrDataset` for a storage read at random (zarr), the
    iterable `DCTWebDataset` for one read shard by shard (webdataset); the manifest's storage says which
    (`dctdata.format.storages`). `path_or_url` is the pack's directory or URL, its
    manifest.json, or (webdataset) a list or brace expression of its shard files, e.g.
    `.../shard-{000000..000015}.tar`, with the manifest beside them. Keywords go to that class (e.g.
    as_dict, on_error, storage_options; cache_dir and cache_limit for webdataset). decode: "cpu" (the
    default: the workers decode the lossless stage, coefficients cross) or "device" (the workers check
    the stored bytes, those cross, and `ds.decompressor()` decodes them where it runs; `dctdata.wire`).
    A shell `pipe:` URL can only be a webdataset stream and is refused there unless the caller passes
    allow_pipe=True.
    sha256: the manifest's sha256 (`dctdata info` prints it) to pin a pack fetched from elsewhere: a
    manifest with any other bytes is refused (its checksums then pin every stored file).
    A pack of trajectories (The Well's layout) opened with n_steps_input, n_steps_output, dt_stride
    (min_dt_stride, max_dt_stride), full_trajectory_mode, ...: its time windows as The Well's
    WellDataset serves them (`dctdata.loaders.windows.WindowDataset`)."""
    from dctdata.loaders.windows import WINDOW_OPTIONS

    sha256 = kwargs.pop("sha256", None)
    if isinstance(path_or_url, (str, os.PathLike)) and os.fspath(path_or_url).startswith("pipe:"):
        from dctdata.loaders.wds_dataset import DCTWebDataset

        if sha256 is not None:
            raise DctDataError(f"sha256: expected a local path or URL pack. Got a pipe: stream {path_or_url}")
        return DCTWebDataset(path_or_url, **kwargs)
    root, shards = shard_selection(path_or_url)
    manifest = read_manifest(root, storage_options=kwargs.get("storage_options"), sha256=sha256)
    if WINDOW_OPTIONS & kwargs.keys():  # time windows over a pack of trajectories
        from dctdata.loaders.windows import open_windows

        return open_windows(path_or_url, manifest, shards, **kwargs)
    if storages.get(manifest.storage).reader.random_access:  # map-style over random access
        from dctdata.loaders.zarr_dataset import DCTZarrDataset

        if shards is not None or "cache_dir" in kwargs:
            what = "a list of shard files" if shards is not None else "cache_dir"
            raise DctDataError(
                f"{root}: {what}: expected a webdataset pack (tar shards). Got a {manifest.storage} pack, which is "
                "opened by its directory or URL and read by byte range"
            )
        return DCTZarrDataset(path_or_url, manifest=manifest, **kwargs)
    try:  # iterable over a storage read shard by shard
        from dctdata.loaders.wds_dataset import DCTWebDataset
    except ModuleNotFoundError as exc:
        raise DctDataError(
            f"{path_or_url}: expected a loader for storage {manifest.storage!r}. Got none in this build "
            "(dctdata.loaders.wds_dataset is missing)"
        ) from exc
    return DCTWebDataset(path_or_url, manifest=manifest, **kwargs)


def __getattr__(name: str):
    if name == "Writer":  # the incremental writer: `with dctdata.Writer(out, **settings) as w: w.write(sample)`
        from dctdata.preprocess.writer import Writer

        return Writer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
