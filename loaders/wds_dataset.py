"""`DCTWebDataset`: stream a webdataset-stored dctdata dataset (tar shards) as a torch IterableDataset.

Samples are tuples of tensors in manifest field order (`as_dict=True`: a dict), decoded exactly like
`DCTZarrDataset`: a `dct` field is its stored coefficient tensor (C, Hb, K, Wb) in the wire dtype
(bfloat16 viewed back from its uint16 bits), `array` fields as stored, labels as 0-d tensors. Decode
on the device with `ds.decompressor()`.

Order and splitting (every sample exactly once per epoch):
- The shard list of the manifest is permuted by a generator seeded with (seed, epoch) - the same
  permutation in every rank and worker - then dealt round-robin to ranks (`perm[rank::world]`) and,
  within a rank, to DataLoader workers (`[worker::num_workers]`). Each worker streams its shards and
  mixes their samples in a shuffle buffer (`webdataset.shuffle`, `buffer_size` samples) seeded with
  (seed, epoch, rank, worker). So for a fixed world size and worker count the order is a pure
  function of (seed, epoch). Call `ds.set_epoch(e)` before each epoch (as with DistributedSampler;
  without it every epoch repeats epoch 0's order). The epoch lives in shared memory, so it also
  reaches `persistent_workers=True` workers.
- rank/world size come from the `rank=`/`world_size=` arguments, else webdataset's
  `pytorch_worker_info` (RANK/WORLD_SIZE env or an initialized torch.distributed). `split_by_node=False`
  gives every rank all shards.
- Fewer shards than ranks x workers is an error (whole shards are the unit of work, so some workers
  would get nothing and the split could not be balanced): repack with smaller shards or use fewer
  workers. A sample-level split was not chosen because it would make every worker read every shard.
- `len(ds)` is the number of samples *this rank* yields in the current epoch: the manifest count on
  one rank; with several ranks the sum over the shards dealt to this rank, which can differ between
  ranks by up to about one shard (DDP users: `torch.distributed.algorithms.Join`, or repack with
  `--samples-per-shard` so shard counts divide evenly).

Integrity (verify, then yield): each shard is read whole into memory (one shard per worker at a time;
shards are capped at --max-shard-size, 256 MiB by default), its byte count and sha256 are checked
against the manifest while it is read, and its tar member names/keys/fields are checked, all before
its first sample is yielded. So a corrupted or truncated shard never yields garbage and never yields
part of itself: with `on_error="raise"` (default) it raises `IntegrityError` naming the shard; with
`on_error="skip"` the shard is skipped, logged and counted in `ds.stats` (shared across workers).
Tar members that are not plain files, have absolute paths, `..` or any directory part are rejected.
Data that passes the hash but fails to decode (only possible with a buggy writer) raises naming the
shard and sample (skip mode drops the rest of that shard and counts it).

Sources: a local directory or a URL prefix opened with fsspec (http(s)://, s3://, ...; pass
`storage_options`). Shell `pipe:` URLs are refused unless `allow_pipe=True`; then `pipe:CMD` must
contain `{}`, replaced by the file name relative to the dataset (`manifest.json`, `shard-000000.tar`).
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import random
import re
import tarfile
from typing import Any, Iterator, Mapping

import numpy as np
import torch
import webdataset as wds
from webdataset.utils import pytorch_worker_info

from dctdata.errors import DctDataError, FormatError, IntegrityError
from dctdata.format import MANIFEST_NAME, FieldSpec, Manifest, decode_npy, entry_name, is_url, join, manifest_location, parse_manifest, sample_key
from dctdata.layer import Decompress
from dctdata.lossless import get_codec

log = logging.getLogger(__name__)

READ_BLOCK = 4 << 20
_MEMBER_RE = re.compile(r"^(\d+)\.([A-Za-z_][A-Za-z0-9_]*\.npy(?:\.zst)?)$")
_STAT_OK, _STAT_SKIPPED, _STAT_SAMPLES, _STAT_LOST = 0, 1, 2, 3


# Opening files ------------------------------------------------------------------------------------
def _check_location(path_or_url: str | os.PathLike, allow_pipe: bool) -> str:
    if not isinstance(path_or_url, (str, os.PathLike)):
        raise TypeError(f"path_or_url: expected a path or URL string. Got {type(path_or_url).__name__}")
    s = os.fspath(path_or_url)
    if s.startswith("pipe:"):
        if not allow_pipe:
            raise DctDataError(
                f"{s}: expected a local path or an http(s)/fsspec URL. Got a shell 'pipe:' URL, which runs a command "
                "(pass allow_pipe=True to opt in)"
            )
        if "{}" not in s:
            raise DctDataError(f"{s}: expected a pipe: command with '{{}}' where the file name goes. Got none")
    return s


class _Files:
    """Opens files of one dataset by relative name: local, fsspec URL, or an opted-in pipe: command."""

    def __init__(self, root: str, storage_options: Mapping[str, Any] | None) -> None:
        self.root = root
        self.storage_options = dict(storage_options or {})

    def location(self, rel: str) -> str:
        if self.root.startswith("pipe:"):
            return self.root.replace("{}", rel)
        return join(self.root, rel)

    def open(self, rel: str):
        loc = self.location(rel)
        if self.root.startswith("pipe:"):
            return wds.gopen(loc, "rb")
        if is_url(loc):
            import fsspec

            # Sequential reads: stream http(s) bodies instead of issuing range requests per block.
            options = {"block_size": 0, **self.storage_options} if loc.startswith(("http://", "https://")) else self.storage_options
            return fsspec.open(loc, "rb", **options).open()
        return open(loc, "rb")


def _load_manifest(files: _Files) -> Manifest:
    loc = files.location(MANIFEST_NAME)
    try:
        with files.open(MANIFEST_NAME) as fh:
            raw = fh.read()
    except FileNotFoundError as exc:
        raise FormatError(f"{loc}: expected a dctdata manifest ({MANIFEST_NAME}). Got no such file") from exc
    except OSError as exc:
        raise FormatError(f"{loc}: expected a readable dctdata manifest. Got {type(exc).__name__}: {exc}") from exc
    return parse_manifest(raw, loc)


def _shard_list(m: Manifest, where: str) -> list[dict[str, Any]]:
    """Validated shard entries with their first sample index added (`start`)."""
    shards = m.layout.get("shards") if isinstance(m.layout, Mapping) else None
    if not isinstance(shards, list):
        raise FormatError(f"{where}: layout.shards: expected a list of {{name, samples, bytes, sha256}}. Got {shards!r}")
    out, start = [], 0
    for i, s in enumerate(shards):
        if not isinstance(s, Mapping) or not {"name", "samples", "bytes", "sha256"} <= set(s):
            raise FormatError(f"{where}: layout.shards[{i}]: expected {{name, samples, bytes, sha256}}. Got {s!r}")
        name = s["name"]
        if not isinstance(name, str) or "/" in name or "\\" in name or name in ("", ".", "..") or not name.endswith(".tar"):
            raise FormatError(f"{where}: layout.shards[{i}].name: expected a plain '.tar' file name. Got {name!r}")
        n = s["samples"]
        if isinstance(n, bool) or not isinstance(n, int) or n < 0 or not isinstance(s["bytes"], int):
            raise FormatError(f"{where}: layout.shards[{i}]: expected int samples and bytes. Got {s!r}")
        out.append({"index": i, "name": name, "samples": n, "bytes": s["bytes"], "sha256": s["sha256"], "start": start})
        start += n
    if start != m.samples:
        raise FormatError(f"{where}: layout.shards: expected sample counts summing to {m.samples}. Got {start}")
    return out


# One shard: read + verify + index, then decode samples ------------------------------------------
class _Shard:
    """A shard read whole and verified (size, sha256, member names, keys, fields) before use."""

    def __init__(self, files: _Files, entry: Mapping[str, Any], fields: tuple[FieldSpec, ...], codecs: dict) -> None:
        self.entry, self.fields, self.codecs = entry, fields, codecs
        self.where = files.location(entry["name"])
        first, last = entry["start"], entry["start"] + entry["samples"] - 1
        self.span = f"samples {first}..{last}"
        self.data = self._read(files)
        self.samples = self._index()

    def _read(self, files: _Files) -> memoryview:
        expected, h, parts, n = self.entry["bytes"], hashlib.sha256(), [], 0
        try:
            with files.open(self.entry["name"]) as fh:
                while n <= expected:  # one block past the expected size is enough to call it too long
                    block = fh.read(min(READ_BLOCK, expected + 1 - n))
                    if not block:
                        break
                    h.update(block)
                    parts.append(block)
                    n += len(block)
        except FileNotFoundError as exc:
            raise IntegrityError(f"{self.where}: expected a shard ({self.span}). Got no such file") from exc
        except OSError as exc:
            raise IntegrityError(f"{self.where}: expected a readable shard ({self.span}). Got {type(exc).__name__}: {exc}") from exc
        if n != expected:
            what = "truncated" if n < expected else "too long"
            raise IntegrityError(f"{self.where}: expected {expected} bytes ({self.span}). Got {n}{'+' if n > expected else ''} bytes ({what})")
        digest = h.hexdigest()
        if digest != self.entry["sha256"]:
            raise IntegrityError(f"{self.where}: expected sha256 {self.entry['sha256']} ({self.span}). Got {digest} (corrupted)")
        return memoryview(b"".join(parts))

    def _index(self) -> list[dict[str, tuple[int, int]]]:
        """[{entry suffix: (offset, size)}] per sample, after checking every member header."""
        want = {entry_name(f.name, bool(f.lossless)) for f in self.fields}
        samples: list[dict[str, tuple[int, int]]] = []
        keys: list[str] = []
        try:
            with tarfile.open(fileobj=io.BytesIO(self.data), mode="r:") as tf:
                for m in tf:
                    name = m.name
                    if name.startswith("/") or os.path.isabs(name) or ".." in re.split(r"[/\\]", name) or "/" in name or "\\" in name:
                        raise IntegrityError(f"{self.where}: tar member {name!r}: expected a plain file name. Got an absolute path, '..' or a directory part")
                    if not m.isreg():
                        raise IntegrityError(f"{self.where}: tar member {name!r}: expected a regular file. Got tar type {m.type!r}")
                    match = _MEMBER_RE.match(name)
                    if not match or match.group(2) not in want:
                        raise IntegrityError(f"{self.where}: tar member {name!r}: expected '<key>.<field entry>' with entries {sorted(want)}")
                    key, suffix = match.groups()
                    if not keys or keys[-1] != key:
                        keys.append(key)
                        samples.append({})
                    if suffix in samples[-1]:
                        raise IntegrityError(f"{self.where}: sample key {key}: expected one {suffix!r}. Got a duplicate")
                    samples[-1][suffix] = (m.offset_data, m.size)
        except tarfile.TarError as exc:
            raise IntegrityError(f"{self.where}: expected a readable tar ({self.span}). Got {type(exc).__name__}: {exc}") from exc
        expected = [sample_key(self.entry["start"] + j) for j in range(self.entry["samples"])]
        if keys != expected:
            raise IntegrityError(f"{self.where}: expected sample keys {expected[:1]}..{expected[-1:]} in order ({self.span}). Got {keys[:1]}..{keys[-1:]} ({len(keys)} keys)")
        for key, s in zip(keys, samples):
            if set(s) != want:
                raise IntegrityError(f"{self.where}: sample key {key}: expected entries {sorted(want)}. Got {sorted(s)}")
        return samples

    def decode(self, j: int) -> list[torch.Tensor]:
        """Tensors of sample j of this shard, in field order."""
        out = []
        for f in self.fields:
            off, size = self.samples[j][entry_name(f.name, bool(f.lossless))]
            raw = self.data[off : off + size]
            where = f"{self.where}: sample {self.entry['start'] + j} field {f.name!r}"
            try:
                codec = self.codecs[f.name]
                raw = codec.decode(raw) if codec is not None else raw
            except Exception as exc:  # noqa: BLE001 - any decoder failure is a data error naming the sample
                raise IntegrityError(f"{where}: expected {f.lossless.get('id')}-compressed .npy bytes. Got undecodable bytes ({type(exc).__name__}: {exc})") from exc
            arr = decode_npy(raw, where)
            if arr.dtype.name != f.stored_dtype or tuple(arr.shape) != f.stored_shape:
                raise IntegrityError(f"{where}: expected {f.stored_dtype} {f.stored_shape}. Got {arr.dtype.name} {tuple(arr.shape)}")
            out.append(f.to_tensor(arr))
        return out


# The dataset -------------------------------------------------------------------------------------
class DCTWebDataset(torch.utils.data.IterableDataset):
    """Iterable dataset over webdataset shards of a dctdata pack (see the module docstring)."""

    def __init__(
        self,
        path_or_url: str | os.PathLike,
        *,
        shuffle: bool = True,
        seed: int = 0,
        buffer_size: int = 1000,
        initial: int | None = None,
        as_dict: bool = False,
        on_error: str = "raise",
        split_by_node: bool = True,
        rank: int | None = None,
        world_size: int | None = None,
        storage_options: Mapping[str, Any] | None = None,
        allow_pipe: bool = False,
        manifest: Manifest | None = None,
    ) -> None:
        super().__init__()
        if on_error not in ("raise", "skip"):
            raise DctDataError(f"on_error: expected 'raise' or 'skip'. Got {on_error!r}")
        for name, v, lo in (("seed", seed, 0), ("buffer_size", buffer_size, 1)):
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"{name}: expected an int. Got {v!r}")
            if v < lo:
                raise DctDataError(f"{name}: expected an int >= {lo}. Got {v}")
        if (rank is None) != (world_size is None):
            raise DctDataError(f"rank/world_size: expected both or neither. Got rank={rank!r} world_size={world_size!r}")
        if world_size is not None:
            if isinstance(world_size, bool) or not isinstance(world_size, int) or isinstance(rank, bool) or not isinstance(rank, int):
                raise TypeError(f"rank/world_size: expected ints. Got rank={rank!r} world_size={world_size!r}")
            if world_size < 1 or not 0 <= rank < world_size:
                raise DctDataError(f"rank/world_size: expected 0 <= rank < world_size. Got rank={rank} world_size={world_size}")
        s = _check_location(path_or_url, allow_pipe)
        self.root = s if s.startswith("pipe:") else manifest_location(s)[0]
        self._files = _Files(self.root, storage_options)
        self.manifest = manifest if manifest is not None else _load_manifest(self._files)
        if self.manifest.storage != "webdataset":
            raise DctDataError(f"{self.root}: expected a webdataset dataset. Got storage {self.manifest.storage!r} (use dctdata.open_dataset)")
        self.shards = _shard_list(self.manifest, self._files.location(MANIFEST_NAME))
        self.fields = self.manifest.fields
        self.shuffle, self.seed, self.buffer_size = bool(shuffle), seed, buffer_size
        self.initial = min(buffer_size, 100) if initial is None else initial
        self.as_dict, self.on_error, self.split_by_node = bool(as_dict), on_error, bool(split_by_node)
        self.rank, self.world_size = rank, world_size
        # Shared memory: set_epoch reaches persistent workers, and workers' counts reach ds.stats.
        self._epoch = torch.zeros(1, dtype=torch.int64).share_memory_()
        self._counts = torch.zeros(len(self.shards), 4, dtype=torch.int64).share_memory_()

    # Epochs and splitting ------------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration's order the one of `epoch` (a pure function of seed and epoch)."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise DctDataError(f"epoch: expected an int >= 0. Got {epoch!r}")
        self._epoch[0] = epoch

    @property
    def epoch(self) -> int:
        return int(self._epoch[0])

    def _node(self) -> tuple[int, int]:
        if not self.split_by_node:
            return 0, 1
        if self.world_size is not None:
            return self.rank, self.world_size
        rank, world, _, _ = pytorch_worker_info()
        return rank, world

    def _permutation(self, epoch: int) -> list[int]:
        order = list(range(len(self.shards)))
        if self.shuffle:
            np.random.default_rng([self.seed, epoch]).shuffle(order)
        return order

    def shards_for(self, epoch: int, rank: int, world_size: int, worker: int = 0, num_workers: int = 1) -> list[dict[str, Any]]:
        """The shard entries one (rank, worker) reads in `epoch`, in reading order."""
        n = len(self.shards)
        if 0 < n < world_size * num_workers:
            raise DctDataError(
                f"{self.root}: expected at least {world_size * num_workers} shards for {world_size} rank(s) x {num_workers} "
                f"DataLoader worker(s) (whole shards are split between them). Got {n} shards "
                "(repack with a smaller --max-shard-size or --samples-per-shard, or use fewer workers)"
            )
        return [self.shards[i] for i in self._permutation(epoch)[rank::world_size][worker::num_workers]]

    def __len__(self) -> int:
        rank, world = self._node()
        if world == 1:
            return self.manifest.samples
        return sum(s["samples"] for s in self.shards_for(self.epoch, rank, world))

    # Iteration -----------------------------------------------------------------------------------
    def __iter__(self) -> Iterator:
        rank, world = self._node()
        _, _, worker, num_workers = pytorch_worker_info()
        info = torch.utils.data.get_worker_info()
        if info is not None:
            worker, num_workers = info.id, info.num_workers
        epoch = self.epoch
        shards = self.shards_for(epoch, rank, world, worker, num_workers)
        stages = [lambda: iter(shards), self._samples]
        if self.shuffle:
            state = np.random.SeedSequence([self.seed, epoch, rank, worker]).generate_state(2)
            rng = random.Random(int(state[0]) << 32 | int(state[1]))
            stages.append(wds.shuffle(self.buffer_size, self.initial, rng=rng))
        stages.append(self._make)
        return iter(wds.DataPipeline(*stages))

    def _codecs(self) -> dict:
        return {f.name: get_codec(f.lossless) for f in self.fields}

    def _skip(self, entry: Mapping[str, Any], exc: Exception, done: int = 0) -> None:
        self._counts[entry["index"], _STAT_SKIPPED] += 1
        self._counts[entry["index"], _STAT_LOST] += entry["samples"] - done
        log.warning("skipping shard %s: %s", entry["name"], exc)

    def _samples(self, shards) -> Iterator[list[torch.Tensor]]:
        codecs = self._codecs()
        for entry in shards:
            try:
                shard = _Shard(self._files, entry, self.fields, codecs)
            except DctDataError as exc:
                if self.on_error == "raise":
                    raise
                self._skip(entry, exc)
                continue
            done = 0
            try:
                for j in range(entry["samples"]):
                    values = shard.decode(j)
                    done += 1
                    yield values
            except IntegrityError as exc:
                if self.on_error == "raise":
                    raise
                self._skip(entry, exc, done)
            else:
                self._counts[entry["index"], _STAT_OK] += 1
            finally:
                self._counts[entry["index"], _STAT_SAMPLES] += done
            del shard

    def _make(self, samples):
        names = self.manifest.names
        for values in samples:
            yield dict(zip(names, values)) if self.as_dict else tuple(values)

    # Reporting and decoding ----------------------------------------------------------------------
    @property
    def stats(self) -> dict[str, Any]:
        """Counts since creation, summed over this process and its DataLoader workers."""
        c = self._counts
        skipped = c[:, _STAT_SKIPPED] > 0
        return {
            "shards_read": int(c[:, _STAT_OK].sum()),
            "shards_skipped": int(c[:, _STAT_SKIPPED].sum()),
            "samples": int(c[:, _STAT_SAMPLES].sum()),
            "samples_skipped": int(c[:, _STAT_LOST].sum()),
            "bad_shards": [s["name"] for s in self.shards if skipped[s["index"]]],
        }

    def decompressor(self, field: str | None = None, **kwargs) -> Decompress:
        """The `Decompress` layer for a dct field (the only one when `field` is None)."""
        return Decompress.from_manifest(self.manifest, field, **kwargs)

    def __repr__(self) -> str:
        fields = ", ".join(f"{f.name}:{f.kind}{list(f.shape)}" for f in self.fields)
        return f"DCTWebDataset({self.root!r}, samples={self.manifest.samples}, shards={len(self.shards)}, fields=[{fields}])"


# dctdata verify ----------------------------------------------------------------------------------
def verify_webdataset(
    path_or_url: str | os.PathLike, decode: bool = True, storage_options: Mapping[str, Any] | None = None, allow_pipe: bool = False
) -> tuple[list[str], dict[str, Any]]:
    """(problems, summary) for `dctdata verify`: every shard's size and sha256, its tar structure and
    sample keys, counts, and (decode=True) every sample decoded and run through `Decompress` (finite).
    Each problem is one line naming the shard and its samples."""
    ds = DCTWebDataset(path_or_url, shuffle=False, split_by_node=False, storage_options=storage_options, allow_pipe=allow_pipe)
    codecs = ds._codecs()
    layers = {f.name: Decompress(f.codec) for f in ds.fields if f.kind == "dct"} if decode else {}
    problems: list[str] = []
    decoded = 0
    for entry in ds.shards:
        try:
            shard = _Shard(ds._files, entry, ds.fields, codecs)
            if decode:
                for a in range(0, entry["samples"], 64):
                    batch = [shard.decode(j) for j in range(a, min(a + 64, entry["samples"]))]
                    for k, f in enumerate(ds.fields):
                        if f.name not in layers:
                            continue
                        with torch.inference_mode():
                            x = layers[f.name](torch.stack([b[k] for b in batch]))
                        bad = (~torch.isfinite(x.flatten(1)).all(1)).nonzero().flatten().tolist()
                        problems += [f"{shard.where}: sample {entry['start'] + a + j} field {f.name!r}: expected finite decoded values. Got NaN/Inf" for j in bad]
                    decoded += len(batch)
        except DctDataError as exc:
            problems.append(str(exc))
    summary = {"samples": ds.manifest.samples, "files": len(ds.shards), "decoded": decoded if decode else None, "fields": len(ds.fields)}
    if decode and decoded != ds.manifest.samples and not problems:
        problems.append(f"{ds.root}: expected {ds.manifest.samples} samples. Got {decoded}")
    return problems, summary
