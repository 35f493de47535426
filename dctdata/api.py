"""Top-level Python API mirroring the CLI: `dctdata.pack(...)`, `dctdata.Writer(...)` and
`dctdata.open_dataset(...)`.

All import their implementation lazily (`Writer` through the module `__getattr__`), so the core never
imports `dctdata.preprocess`/`dctdata.loaders` at import time. `pack`'s keywords are written out (an IDE
and a type checker see each one) and are `dctdata.settings.PackSettings`' fields, which a test checks; they
are passed on by name (no `locals()`), and a test checks that each keyword reaches its field.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from dctdata.errors import DctDataError
from dctdata.format import Manifest, read_manifest, storages
from dctdata.format.location import shard_selection
from dctdata.settings import UNSET, PackSettings
from dctdata.stages import AUTO


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
    time_dim: str | None = None,
    variables: str | Sequence[str] | None = None,
    stack: str | None = None,
    allow_external: bool = False,
    lossless: Mapping[str, Any] | str | None = AUTO,
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
    codec: Any = UNSET,
) -> Manifest:
    """Pack SOURCE into a dataset at OUT; returns the manifest written.

    SOURCE: a path or URL (.npy, .npz, HDF5, NetCDF, zarr store, a directory of per-sample files or
    images), a module:callable, or a Python object: a NumPy array or torch tensor (samples first), a
    dict of arrays (a field each), an xarray.Dataset, a map-style dataset, or an iterable/generator of
    samples (dicts, tuples or arrays; `length=` when known).

    The keywords are the fields of `dctdata.PackSettings` (the CLI's flags in snake_case; each field's
    help says what it does), or pass `settings=PackSettings(...)` instead of them.

    Args:
        source: What to pack (see above): a path or URL, a module:callable or a Python object.
        out: The dataset to write: a directory or fsspec URL (`storage_options` for credentials).
        format: zarr (random access, default) or webdataset (streaming shards).
        cf: chop factor 1..8 (default 4 with other settings but no --target-psnr).
        mask: kept-frequency mask (default square; volumes: cube = square, tetra = triangle: u + v + w < CF).
        dims: spatial dims of a dct sample: 2 ((H, W) or (C, H, W), default) or 3 (volumes: (D, H, W) or (C, D, H, W) as
            8x8x8 blocks).
        quant: coefficient dtype (default none = fp32).
        target_psnr: calibrate steps (and free knobs) to reach this PSNR (per channel, over valid pixels); per field:
            noisy=40,clean=45 (a bare DB sets the fields not named). With no fidelity flag at all (--cf, --mask,
            --quant, --target-psnr, --max-error, --max-rel-error) float fields get 40 and integer fields stay exact.
        max_error: pointwise bound: every decoded value within E of the source, in the field's units, checked on every
            sample at pack time (SZ3/ZFP's absolute mode); per field: u=0.01,p=2 (a bare E sets the fields not named).
        max_rel_error: pointwise bound relative to each sample channel's value range (1e-3: within 0.1% of the range);
            with --max-error the smaller bound holds.
        fields: override a field's kind (dct|array|label).
        key: HDF5 dataset(s) to pack (repeat or comma-separate).
        channels_last: per-sample arrays are (H, W, C): move C first (--no-channels-last: keep a layout that looks
            channels-last as it is).
        nan: NaN/Inf in dct fields: error (default); mask: fill smoothly and store the validity mask as FIELD_valid;
            fill=VALUE: a constant, no mask.
        valid: the source field MASKFIELD (nonzero = valid) is FIELD's validity mask (repeat for more fields).
        sample_dim: NetCDF/zarr: the dimension that becomes samples (e.g. time).
        time_dim: NetCDF/zarr: pack the variables as trajectories along DIM (every frame once; the dims before it name
            the trajectories), so open_dataset's window options serve time windows over them.
        variables: NetCDF/zarr: data variables to pack (default: all).
        stack: NetCDF/zarr: stack the variables as the channels of one field NAME (default: a field each).
        allow_external: HDF5/NetCDF-4: let the source read data from other files (external storage, virtual datasets,
            external links); only for a file you trust.
        lossless: lossless stage: auto (default: per dct field the smaller of the entropy coder and zstd-19), zstd
            (zstd-19, the read-speed choice: more bytes than the entropy coder, decoded faster in the loader workers),
            zstd:LEVEL (1..22), lz4 (numcodecs' LZ4: the fastest decode, the most bytes).
        strict: fail on any quantization overflow.
        overwrite: replace an existing OUT (only once the new one is complete).
        quiet: no progress bar or summary.
        workers: pack on N worker processes of this machine (default: its cores; 1: in this process).
        scheduler: pack on an existing Dask cluster (tcp://host:8786); workers must see SOURCE and OUT.
        device: where the transform, quantization and error figures run: cpu (default) or a CUDA device (cuda, cuda:1);
            with cuda the entropy coder runs on --workers CPU threads, overlapped with the device.
        resume: finish an interrupted pack of the same settings (redo only unfinished parts).
        max_shard_size: webdataset: cap on each .tar shard, in bytes or with a unit: 64MiB, '1.5 GB' (default 256 MiB).
        samples_per_shard: webdataset: samples per shard (default: as many as fit the cap, and at least 16 shards for a
            set of 16 samples or more, so ranks x DataLoader workers each get whole shards).
        samples_per_member: webdataset: samples per tar member, 1..256 (default: about 256 KiB of source per member, 1
            for larger samples, at most 1/16 of the set; each member costs a 512-byte tar header and padding).
        calibration: an explicit calibration set (anything `pack` takes) instead of the source's samples.
        length: the sample count of an iterable source.
        writer_options: the storage writer's options: zarr chunk_samples, shard_samples; webdataset max_shard_size,
            samples_per_shard, samples_per_member.
        storage_options: fsspec options for a URL OUT (s3://..., credentials, endpoint).
        settings: A `PackSettings` with every setting at once, instead of the keywords above.
        codec: Deprecated: the old name of `lossless` (taken with a DeprecationWarning).

    Returns:
        The `Manifest` written at OUT (`dctdata.format.Manifest`).

    Raises:
        DctDataError: A setting is invalid, the source cannot be read or does not match the settings, OUT exists
            without `overwrite=True`, or (with `strict=True`) a coefficient overflowed.
        TypeError: A setting has the wrong type.
    """
    from dctdata.preprocess.pack import pack as _pack

    given = dict(
        format=format, cf=cf, mask=mask, dims=dims, quant=quant, target_psnr=target_psnr, max_error=max_error,
        max_rel_error=max_rel_error, fields=fields, key=key, channels_last=channels_last, nan=nan, valid=valid,
        sample_dim=sample_dim, time_dim=time_dim, variables=variables, stack=stack, allow_external=allow_external,
        lossless=lossless, strict=strict, overwrite=overwrite, quiet=quiet, workers=workers, scheduler=scheduler,
        device=device, resume=resume, max_shard_size=max_shard_size, samples_per_shard=samples_per_shard,
        samples_per_member=samples_per_member, calibration=calibration, length=length, writer_options=writer_options,
        storage_options=storage_options, codec=codec,
    )  # fmt: skip
    return _pack(source, out, PackSettings.resolve(settings, given, "pack"))


def open_dataset(path_or_url: str | os.PathLike | list, **kwargs: Any) -> Any:  # a loaders dataset class (Returns:)
    """Open a packed dataset: a map-style `DCTZarrDataset` for a storage read at random (zarr), the
    iterable `DCTWebDataset` for one read shard by shard (webdataset); the manifest's storage says which
    (`dctdata.format.storages`). `path_or_url` is the pack's directory or URL, its
    manifest.json, or (webdataset) a list or brace expression of its shard files, e.g.
    `.../shard-{000000..000015}.tar`, with the manifest beside them. Keywords go to that class (e.g.
    as_dict, on_error, storage_options; cache_dir and cache_limit for webdataset); the read options
    (decode, on_error, cache_dir, cache_limit, read_threads) can come as one `ReadOptions`. decode: "cpu" (the
    default: the workers decode the lossless stage, coefficients cross) or "device" (the workers check
    the stored bytes, those cross, and `ds.decompressor()` decodes them where it runs; `dctdata.decoder.wire`).
    A shell `pipe:` URL can only be a webdataset stream and is refused there unless the caller passes
    allow_pipe=True; with window options it serves the windows (every shard is fetched by its own command).
    sha256: the manifest's sha256 (`dctdata info` prints it) to pin a pack fetched from elsewhere: a
    manifest with any other bytes is refused (its checksums then pin every stored file).
    A pack of trajectories (The Well's layout) opened with n_steps_input, n_steps_output, dt_stride
    (min_dt_stride, max_dt_stride), full_trajectory_mode, ...: its time windows as The Well's
    WellDataset serves them (`dctdata.loaders.windows.WindowDataset` over zarr, the iterable
    `dctdata.loaders.wds_windows.WebWindowDataset` over webdataset; decode="device" too).

    Args:
        path_or_url: The pack's directory or URL, its manifest.json, or (webdataset) a list or brace expression of
            its shard files.
        **kwargs: The keywords of the dataset class the storage picks (listed below), and `sha256`.

    Keyword Args:
        sha256 (str): The manifest's expected sha256 (`dctdata info` prints it); any other manifest bytes are
            refused. Not for `pipe:` streams.
        options (ReadOptions): How the pack is read, in one object checked once (`dctdata.ReadOptions`: decode,
            on_error, cache_dir, cache_limit, read_threads), instead of those keywords.
        decode (str): "cpu" (default: the workers decode the lossless stage) or "device" (the stored bytes cross;
            `ds.decompressor()` decodes them).
        as_dict (bool): Yield each sample as a dict by field name instead of a tuple in manifest order.
        on_error (str): "raise" (default: a bad chunk or shard raises `IntegrityError`) or "skip" (bad samples or
            shards are logged, counted and dropped).
        read_threads (int): zarr only: the most threads that decode one batch's chunks (1: none; default:
            `DCTDATA_READ_THREADS`, else torch's threads).
        storage_options (dict): fsspec options for a URL pack (credentials, endpoint).
        manifest (Manifest): An already read `Manifest` of the pack (skips reading it again).
        fields (list[str]): zarr only: the fields to read (default: all; a field's partners come with it).
        shuffle (bool): webdataset only: shuffle the shard order and mix samples in a buffer (default True).
        seed (int): webdataset only: the seed of the order, a pure function of (seed, epoch).
        buffer_size (int): webdataset only: samples in each worker's shuffle buffer.
        initial (int): webdataset only: samples the buffer holds before the first is yielded (default:
            min(buffer_size, 100)).
        split_by_node (bool): webdataset only: deal shards to ranks (default True); False gives every rank all
            shards.
        rank (int): webdataset only: this process's rank (default: from the environment or torch.distributed).
        world_size (int): webdataset only: the number of ranks (with `rank`).
        allow_pipe (bool): webdataset only: accept a shell `pipe:CMD` URL (it runs CMD).
        cache_dir (str | os.PathLike): webdataset only: keep fetched shards in this local cache (sha256-checked on
            reuse).
        cache_limit (int | str): webdataset only: the cache's size cap, in bytes or with a unit (default 50 GiB).
        n_steps_input (int): a pack of trajectories: frames in (with the other window options below, the
            pack's time windows as a `WindowDataset`, The Well's `WellDataset` items).
        n_steps_output (int): a pack of trajectories: frames out.
        dt_stride (int): a pack of trajectories: the step between frames (or min_dt_stride / max_dt_stride).

    Returns:
        (DCTZarrDataset | DCTWebDataset | WindowDataset | WebWindowDataset): A `DCTZarrDataset` (map-style) for a
            zarr pack, a `DCTWebDataset` (iterable) for a webdataset pack; with window options a `WindowDataset`
            (zarr) or a `WebWindowDataset` (webdataset).

    Raises:
        DctDataError: The manifest is missing or invalid, its sha256 differs from `sha256`, a keyword does not
            fit the pack's storage (shard files or cache_dir for a zarr pack, read_threads for a webdataset
            pack), a read option has a bad value, or read options come both as keywords and as `options=`.
        IntegrityError: Stored bytes fail their checksum (with `on_error="raise"`).
        TypeError: A keyword the dataset class does not take, a read option of the wrong type, or `options`
            not a `ReadOptions`.
    """
    from dctdata.loaders.options import READ_OPTIONS, ReadOptions
    from dctdata.loaders.windows import WINDOW_OPTIONS

    sha256 = kwargs.pop("sha256", None)
    given = {k: kwargs.pop(k) for k in READ_OPTIONS if k in kwargs}
    options = ReadOptions.resolve(kwargs.pop("options", None), given, "open_dataset")  # checked once, here
    if isinstance(path_or_url, (str, os.PathLike)) and os.fspath(path_or_url).startswith("pipe:"):
        if sha256 is not None:
            raise DctDataError(f"sha256: expected a local path or URL pack. Got a pipe: stream {path_or_url}")
        streaming = storages.streaming()
        if WINDOW_OPTIONS & kwargs.keys():  # windows over the stream's shards, each fetched by its own command (the
            # manifest too, read by the dataset after its allow_pipe check)
            return _loader(streaming, "windows")(path_or_url, None, None, **options.changed(), **kwargs)
        return _loader(streaming, "dataset")(path_or_url, options=options, **kwargs)
    root, shards = shard_selection(path_or_url)
    manifest = read_manifest(root, storage_options=kwargs.get("storage_options"), sha256=sha256)
    storage = storages.get(manifest.storage)  # its dataset classes, from the registry
    if WINDOW_OPTIONS & kwargs.keys():  # time windows over a pack of trajectories
        return _loader(storage, "windows")(path_or_url, manifest, shards, **options.changed(), **kwargs)
    if not storage.sharded and (shards is not None or options.cache_dir is not None):
        what = "a list of shard files" if shards is not None else "cache_dir"
        raise DctDataError(
            f"{root}: {what}: expected a {'|'.join(storages.sharded())} pack (tar shards). Got a {manifest.storage} "
            "pack, which is opened by its directory or URL and read by byte range"
        )
    return _loader(storage, "dataset")(path_or_url, manifest=manifest, options=options, **kwargs)


def _loader(storage: storages.Storage, what: str) -> Any:
    """The loaders' class the registry names for `storage`: its dataset (`cls(path_or_url, manifest=, options=,
    **kwargs)`; no manifest for a `pipe:` stream) or its time windows (`f(path_or_url, manifest, shards,
    **kwargs)`). Loaded here, where the core and the loaders join: the core only names them."""
    path = storage.dataset_path if what == "dataset" else storage.windows_path
    if not path:
        raise DctDataError(f"storage {storage.name!r}: expected a {what} class in the loaders. Got none registered")
    try:
        return storages.load(path)
    except ModuleNotFoundError as exc:
        raise DctDataError(
            f"storage {storage.name!r}: expected its {what} ({path}). Got none in this build ({exc})"
        ) from exc


def __getattr__(name: str) -> Any:
    if name == "Writer":  # the incremental writer: `with dctdata.Writer(out, **settings) as w: w.write(sample)`
        from dctdata.preprocess.writer import Writer

        return Writer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
