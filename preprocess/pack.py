"""The pack orchestrator for sources with random access: source -> per-field encoding -> a Writer ->
manifest last.

    pack(source, out, settings)        # settings: a dctdata.settings.PackSettings

Steps: open the source (`dctdata.preprocess.sources`: a path, URL or module:callable, or a Python
object: array, tensor, dict of arrays, xarray.Dataset, map-style dataset), plan the fields
(`dctdata.preprocess.plan`: kinds, CodecSpecs, calibration once on the client, validity masks), then
write the dataset as *parts* (`dctdata.preprocess.parts`): sample ranges that each own whole output
files (a zarr shard of every field; one webdataset tar). A part validates shapes/dtypes/NaN, fills
masked pixels, encodes `dct` fields with `dctdata.encode`, decodes them again to measure PSNR (per
channel of each sample, over its valid pixels, against their value range) and max error, counts
overflows and hands the stored arrays to the writer. Parts run on forked worker processes, one a core
by default (`workers=N`; 1, or a single part, runs them in this process), or as tasks on an existing Dask
cluster (`scheduler=ADDRESS`; `dctdata.preprocess.parallel`); the bytes are the same either way. The
manifest is written last, by the client. Iterables without random access (generators) are packed
through the incremental `Writer` (`dctdata.preprocess.writer`), to the same format.

Atomic commit (`dctdata.preprocess.commit`): a local OUT is written into the temporary sibling
`.OUT.partial`, renamed to OUT only when everything worked; a data error removes it. An interruption
(kill -9, Ctrl-C, a lost worker) leaves it with a progress journal (`dctdata.preprocess.journal`), and
`resume=True` (`--resume`) redoes only the parts whose files are missing or fail their journaled
sha256. OUT may also be an fsspec URL (s3://bucket/prefix, ...; `storage_options`): data files are
written in place and the manifest, written last, is the commit.

Defaults: without any fidelity setting, float dct fields are calibrated to `plan.DEFAULT_TARGET_PSNR`
and integer fields are stored exactly; with some setting but no target PSNR: cf=4, mask square, quant none
(fp32): 16 of 64 frequencies kept, a 4x smaller tensor on the device. With `target_psnr`, calibration
chooses whatever of cf/mask/quant is left None (smallest stored size that reaches the target); per-field
targets as in `plan`.

Writers (one per storage format, `dctdata.format.make_writer`) implement the part interface of
`dctdata.format.base`; they never compute error figures and never write the manifest: the orchestrator
does both.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
from typing import Any

import torch

from dctdata.errors import DctDataError
from dctdata.format import Manifest, is_url, make_writer, storages
from dctdata.format.manifest import check_manifest_size, entry_sizes
from dctdata.preprocess import device_pack
from dctdata.preprocess import parallel as parallel_mod
from dctdata.preprocess.commit import (
    check_not_source,
    check_out,
    commit,
    finished_partial,
    lock_out,
    partial_dir,
    remove_manifest,
    rename_into_place,
)
from dctdata.preprocess.journal import JOURNAL_NAME, Journal, source_identity
from dctdata.preprocess.parts import PartJob, run_part, source_digest
from dctdata.preprocess.plan import build_manifest, plan
from dctdata.preprocess.sources import describe, is_path, is_sample_iterable, open_source
from dctdata.settings import PackSettings

log = logging.getLogger(__name__)


def pack(source: Any, out: str | os.PathLike, settings: PackSettings) -> Manifest:  # noqa: C901 (over the limit: to split)
    """Pack SOURCE into a dctdata dataset at OUT under `settings`; returns the manifest written (see the
    module docstring; `dctdata.pack` is the public front, with every setting as a keyword)."""
    s = settings
    workers, scheduler, resume, overwrite, quiet = s.workers, s.scheduler, s.resume, s.overwrite, s.quiet
    calibration, length = s.calibration, s.length
    device = None if s.device == "cpu" else device_pack.torch_device(s.device)  # a clear error without CUDA
    if not is_path(source) and (scheduler is not None or resume):
        raise DctDataError(
            f"--scheduler/--resume: expected a path, URL or module:callable source (a cluster's workers and a "
            f"resumed pack reopen the source by name). Got a Python object {describe(source)}"
        )
    if length is not None and not is_sample_iterable(source):
        raise DctDataError(f"length: expected an iterable source (others know their length). Got {describe(source)}")
    if is_sample_iterable(source):
        from dctdata.preprocess.writer import pack_iterable

        if device is not None:
            raise DctDataError(
                f"--device {s.device}: expected a source with random access (an iterable is packed by the "
                f"incremental Writer, on the CPU). Got {describe(source)}"
            )

        return pack_iterable(source, out, settings)
    if scheduler is not None:
        parallel_mod.require_dask()
    storage_options = dict(s.storage_options or {})
    if isinstance(out, (str, os.PathLike)):  # first: with --overwrite, OUT holding the source is the worse mistake
        check_not_source(source, os.fspath(out))
    out = check_out(out, overwrite, storage_options)
    url = is_url(out)
    if resume and url:
        raise DctDataError(
            f"--resume: expected a local OUT directory (the progress journal lives in its temporary sibling). Got {out}"
        )
    writer_options = settings.writer_config
    options = dict(writer_options)
    if url:
        options["storage_options"] = storage_options
    record = {"source": describe(source), **settings.record(), "writer_options": writer_options}

    lock = lock_out(out, overwrite, storage_options)  # one pack per local OUT, held until the commit
    try:
        src = open_source(source, **settings.source_options)
        cal = None if calibration is None else open_source(calibration, **settings.source_options)
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    root = out if url else partial_dir(out)
    journal = None
    owned = url  # whether an error may delete root (never a partial pack we could not read)
    keep_partial = False
    try:
        n = len(src)
        record["samples"] = n
        writer = make_writer(settings.format, options)
        specs = None
        if not url and os.path.isdir(root):
            if resume and not os.path.exists(os.path.join(root, JOURNAL_NAME)):
                finished = finished_partial(root, record)
                if finished is not None:  # stopped between its last step and the rename
                    log.warning("%s: --resume: the pack had finished; committing it", root)
                    rename_into_place(root, out)
                    return finished
                log.warning("%s: --resume: no progress journal (stopped before its first part); starting over", root)
                shutil.rmtree(root)
            elif resume:
                journal = Journal.resume(root, record, source_identity(source))
                specs, derived = journal.specs, journal.derived
                owned = True
            else:
                log.warning("%s: discarding an unfinished pack (use --resume to continue it)", root)
                shutil.rmtree(root)
        elif resume:
            log.warning("%s: --resume: no unfinished pack to resume; starting from the beginning", out)
        if specs is None:
            specs, derived = plan(src, settings, cal, quiet=quiet)
            check_manifest_estimate(specs, src.coords, writer.plan(specs, n), settings.format)
            if url:
                remove_manifest(out, storage_options)  # an --overwrite target stops being a dataset now
            else:
                os.makedirs(root)
                owned = True
            writer.open(root, specs, n)
            if not url:
                journal = Journal.start(root, record, specs, derived, source_identity(source))
        parts = writer.plan(specs, n)
        results: dict[int, dict] = journal.verified(parts) if journal is not None else {}
        if results:
            log.info("resuming: %d of %d parts already done and verified", len(results), len(parts))
        job = PartJob(
            source if not is_path(source) else os.fspath(source), settings.source_options, specs, settings.nan_policy,
            settings.strict, writer, root, n, derived, threads=1,
        )  # fmt: skip
        if results:  # the source values the kept parts read must be the same now
            try:
                results = journal.check_source(results, lambda a, b: source_digest(job, a, b, src))
            except DctDataError:
                owned = False  # refused: the partial pack stays as it was (its source may come back)
                raise
        todo = [(i, a, b) for i, (a, b) in enumerate(parts) if i not in results]
        keep_partial = not url and is_path(source)  # from here on an interruption leaves resumable work
        _run(
            job,
            todo,
            results,
            journal,
            src=src,
            workers=workers,
            scheduler=scheduler,
            quiet=quiet,
            total=len(parts),
            done=len(results),
            device=device,
        )
        ordered = [results[i] for i in range(len(parts))]
        result = writer.finish(root, specs, n, ordered)
        manifest = build_manifest(
            settings, record, specs, ordered, result, n, coords=src.coords, info=src.info, where=src.where
        )
        commit(manifest, root, out, storage_options, before_rename=None if journal is None else journal.remove)
        keep_partial = False
        owned = False
        return manifest
    except DctDataError:
        keep_partial = False  # a data or settings problem: a rerun starts over anyway
        raise
    finally:
        src.close()
        if cal is not None:
            cal.close()
        if keep_partial:
            log.warning("%s: pack interrupted; rerun the same command with --resume to finish it", root)
        elif owned and not url and os.path.isdir(root):
            shutil.rmtree(root, ignore_errors=True)
        if lock is not None:
            lock.release()


# Bytes of a stored file's entries in a manifest (its checksum, a webdataset shard's layout entry): 110-160
# as written. The estimate errs low, so only a pack certain to fail is refused before packing (the commit
# checks the exact size).
FILE_ENTRY_BYTES = 100


def check_manifest_estimate(specs, coords, parts: list, storage: str) -> None:
    """Refuse, before packing, a pack whose manifest would be past what readers open (`check_manifest_size`):
    its fields (attributes included) and coordinates are known now, and each part adds a file per field
    (zarr) or one shard (webdataset)."""
    known = {"fields": [f.to_dict() for f in specs], "coords": dict(coords or {})}
    files = storages.get(storage, "--format").files(len(parts), len(specs))
    sizes = [*entry_sizes(known), (files * FILE_ENTRY_BYTES, f"the entries of {files} stored files")]
    check_manifest_size(sum(n for n, _ in sizes), sizes, estimated=True)


def _run(
    job: PartJob,
    todo,
    results: dict,
    journal,
    *,
    src,
    workers,
    scheduler,
    quiet: bool,
    total: int,
    done: int,
    device=None,
) -> None:
    """Run the parts in `todo` (here, on forked workers, on a Dask cluster, or with the transform on `device`:
    `dctdata.preprocess.device_pack`), journaling each as it finishes. The bar counts the source's bytes
    (MB/s and the time left): per batch in one process, per part from workers or the device pipeline."""
    from tqdm.auto import tqdm

    from dctdata.format.fields import user_fields

    per = sum(f.source_sample_bytes for f in user_fields(job.specs) if f.name not in job.derived)  # a sample read
    kept = sum(r["stop"] - r["start"] for r in results.values())  # resumed: verified parts
    bar = tqdm(
        total=job.samples * per, initial=kept * per, unit="B", unit_scale=True, unit_divisor=1000, desc="pack",
        disable=quiet or not sys.stderr.isatty(), leave=False,
    )  # fmt: skip
    local = parallel_mod.local_workers(workers, len(todo))
    serial = device is None and scheduler is None and local <= 1

    def finished(res: dict) -> None:
        results[res["index"]] = res
        if journal is not None:
            journal.record(res)
        if not serial:
            bar.update((res["stop"] - res["start"]) * per)

    try:
        if device is not None:
            threads = torch.get_num_threads()
            try:
                device_pack.run_parts(job, todo, src, device, finished, device_pack.writer_threads(workers))
            finally:
                torch.set_num_threads(threads)
        elif scheduler is not None:
            parallel_mod.run_parts(job, todo, workers=None, scheduler=scheduler, on_done=finished)
        elif local > 1:
            parallel_mod.run_parts_local(job, todo, src=src, workers=local, on_done=finished, run=run_part)
        else:
            threads = torch.get_num_threads()
            try:
                for i, a, b in todo:
                    finished(run_part(job, i, a, b, src=src, progress=lambda k: bar.update(k * per)))
            finally:
                torch.set_num_threads(threads)
    finally:
        bar.close()
