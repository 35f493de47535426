"""`DCTZarrDataset`: map-style random access to a zarr-stored dctdata dataset.

`ds[i]` is a tuple of tensors in manifest field order (`as_dict=True`: a dict); `dct` fields come
out as their stored coefficients (C, Hb, K, Wb) in the wire dtype, to be decoded on the device by
`ds.decompressor()` (the model's first layer). `__getitems__` serves a DataLoader batch with one
read per run of consecutive indices per field.

Process safety: zarr v3 runs an asyncio loop in a background thread; a handle opened in one process
must not be used in a forked child. The zarr group is opened lazily, once per process (keyed by pid),
and dropped when the dataset is pickled (spawn), so DataLoader workers under fork and spawn each
open their own.

Integrity: zarr reads a missing shard, and a chunk whose entry in a shard's index is empty, as fill
values. So the first time a process touches a shard, this dataset reads the shard's index (the
16 bytes x chunks-per-shard + crc32c at its end: one small ranged read, no hashing of the data),
checks its crc32c, and checks that every chunk holding samples has an entry that lies inside the
file; a missing shard, a missing chunk, a truncated shard or a damaged index raises `IntegrityError`
naming the file and samples. Corrupted chunks fail their crc32c inside zarr and are re-raised the
same way; unreadable zarr.json metadata too. `on_error="skip"` drops bad samples from
`__getitems__` batches instead (logged and counted in `ds.skipped`).
"""

from __future__ import annotations

import logging
import os
import warnings
from typing import Any, Sequence

import numpy as np
import torch

from dctdata.errors import DctDataError, IntegrityError
from dctdata.format import FieldSpec, Manifest, is_url, join, manifest_location, read_manifest, zarr_layout, zarr_shard_key
from dctdata.layer import Decompress

log = logging.getLogger(__name__)
# Fields whose whole stored array is at most this big are read once per process and kept in memory
# (labels, small targets), so random access does not decompress a chunk per sample for them.
CACHE_BYTES = 16 << 20


shard_key = zarr_shard_key


class DCTZarrDataset(torch.utils.data.Dataset):
    def __init__(
        self,
        path_or_url: str | os.PathLike,
        *,
        fields: Sequence[str] | None = None,
        as_dict: bool = False,
        on_error: str = "raise",
        storage_options: dict[str, Any] | None = None,
        manifest: Manifest | None = None,
    ) -> None:
        if on_error not in ("raise", "skip"):
            raise DctDataError(f"on_error: expected 'raise' or 'skip'. Got {on_error!r}")
        self.root, _ = manifest_location(path_or_url)
        self.manifest = manifest if manifest is not None else read_manifest(path_or_url, storage_options=storage_options)
        if self.manifest.storage != "zarr":
            raise DctDataError(f"{self.root}: expected a zarr dataset. Got storage {self.manifest.storage!r} (use dctdata.open_dataset)")
        names = self.manifest.names if fields is None else tuple(fields)
        self.fields: tuple[FieldSpec, ...] = tuple(self.manifest.field(n) for n in names)
        self.as_dict = bool(as_dict)
        self.on_error = on_error
        self.storage_options = dict(storage_options or {})
        self.skipped = 0
        self.layout = zarr_layout(self.manifest, self.fields, where=join(self.root, "manifest.json"))
        self._pid: int | None = None

    # Per-process state ---------------------------------------------------------------------------
    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        for k in ("_arrays", "_cache", "_shards_ok", "_no_cache", "_fs", "_index_specs"):
            state.pop(k, None)
        state["_pid"] = None
        return state

    def _ensure_open(self) -> None:
        if self._pid == os.getpid():
            return
        import zarr

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # numcodecs-in-zarr-v3 notice
            try:
                if is_url(self.root):
                    group = zarr.open_group(self.root, mode="r", storage_options=self.storage_options or None)
                else:
                    group = zarr.open_group(self.root, mode="r")
            except Exception as exc:  # noqa: BLE001 - zarr raises many types on missing/damaged metadata
                raise IntegrityError(
                    f"{join(self.root, 'zarr.json')}: expected readable zarr v3 group metadata. Got {type(exc).__name__}: {exc}"
                ) from exc
            self._arrays = {}
            arrays = {}
            for f in self.fields:
                path = self.layout[f.name]["path"]
                try:
                    arrays[f.name] = group[path]
                except KeyError as exc:
                    raise IntegrityError(f"{join(self.root, path, 'zarr.json')}: field {f.name!r}: expected zarr array {path!r}. Got none") from exc
                except Exception as exc:  # noqa: BLE001
                    raise IntegrityError(
                        f"{join(self.root, path, 'zarr.json')}: field {f.name!r}: expected readable zarr array metadata. "
                        f"Got {type(exc).__name__}: {exc}"
                    ) from exc
        for f in self.fields:
            arr = arrays[f.name]
            expect = (self.manifest.samples, *f.stored_shape)
            if tuple(arr.shape) != expect or arr.dtype != np.dtype(f.stored_dtype):
                raise IntegrityError(
                    f"{self.root}: field {f.name!r}: expected zarr array {expect} {f.stored_dtype}. Got {arr.shape} {arr.dtype}"
                )
            self._arrays[f.name] = arr
        self._index_specs = {f.name: _shard_index_spec(self._arrays[f.name], f, self.layout[f.name], self.root) for f in self.fields}
        if is_url(self.root):
            import fsspec

            self._fs, self._fs_root = fsspec.core.url_to_fs(self.root, **self.storage_options)
        else:
            self._fs, self._fs_root = None, self.root
        self._cache: dict[str, np.ndarray] = {}
        self._shards_ok: set[str] = set()
        self._no_cache: set[str] = set()
        self._pid = os.getpid()

    # Reading -------------------------------------------------------------------------------------
    def _check_shards(self, f: FieldSpec, a: int, b: int) -> None:
        shard = self.layout[f.name]["shard"]
        ndim = 1 + len(f.stored_shape)
        for s in range(a // shard, (b - 1) // shard + 1):
            key = shard_key(self.layout[f.name]["path"], s, ndim)
            if key in self._shards_ok:
                continue
            self._check_shard_index(f, s, key)
            self._shards_ok.add(key)

    def _check_shard_index(self, f: FieldSpec, s: int, key: str) -> None:
        """Read shard `s`'s index (a small ranged read) and check it: crc32c, and an in-file entry for
        every chunk that holds samples. zarr would read a missing shard or an empty entry as zeros."""
        shard, chunk = self.layout[f.name]["shard"], self.layout[f.name]["chunk"]
        n = self.manifest.samples
        lo, hi = s * shard, min((s + 1) * shard, n) - 1
        where = f"{join(self.root, key)}: field {f.name!r} samples {lo}..{hi}"
        per_shard, at_end = self._index_specs[f.name]
        index_bytes = 16 * per_shard + 4
        path = self._fs_root.rstrip("/") + "/" + key
        try:
            if self._fs is not None:
                size = self._fs.size(path)
                start = size - index_bytes if at_end else 0
                tail = self._fs.cat_file(path, start=max(start, 0), end=max(start, 0) + index_bytes) if size >= index_bytes else b""
            else:
                size = os.path.getsize(path)
                with open(path, "rb") as fh:
                    fh.seek(max(size - index_bytes, 0) if at_end else 0)
                    tail = fh.read(index_bytes)
        except FileNotFoundError as exc:
            raise IntegrityError(f"{where}: expected a shard file. Got none (missing)") from exc
        except OSError as exc:
            raise IntegrityError(f"{where}: expected a readable shard file. Got {type(exc).__name__}: {exc}") from exc
        if len(tail) < index_bytes:
            raise IntegrityError(f"{where}: expected a shard of at least {index_bytes} bytes (its index). Got {size} bytes (truncated)")
        import google_crc32c

        body, crc = bytes(tail[:-4]), int.from_bytes(tail[-4:], "little")
        if google_crc32c.value(body) != crc:
            raise IntegrityError(f"{where}: expected a shard index with a valid crc32c. Got a damaged index (corrupted or truncated shard)")
        entries = np.frombuffer(body, dtype="<u8").reshape(per_shard, 2)
        data_end = size - index_bytes if at_end else size
        data_start = 0 if at_end else index_bytes
        for c in range(min(per_shard, -(-(n - lo) // chunk))):  # chunks that hold samples
            off, nbytes = int(entries[c, 0]), int(entries[c, 1])
            c_lo, c_hi = lo + c * chunk, min(lo + (c + 1) * chunk, n) - 1
            if off == nbytes == 2**64 - 1:
                raise IntegrityError(
                    f"{join(self.root, key)}: field {f.name!r} samples {c_lo}..{c_hi} (chunk {c_lo // chunk}): "
                    "expected a stored chunk. Got an empty shard-index entry (missing chunk; zarr would read fill values)"
                )
            if off < data_start or off + nbytes > data_end:
                raise IntegrityError(
                    f"{join(self.root, key)}: field {f.name!r} samples {c_lo}..{c_hi} (chunk {c_lo // chunk}): "
                    f"expected a chunk inside the shard's {size} bytes. Got bytes {off}..{off + nbytes} (truncated shard)"
                )

    def _read(self, f: FieldSpec, a: int, b: int) -> np.ndarray:
        """Stored samples [a, b) of a field, integrity-checked."""
        arr = self._arrays[f.name]
        if f.name in self._cache:
            return self._cache[f.name][a:b]
        small = f.kind != "dct" and f.stored_sample_bytes * self.manifest.samples <= CACHE_BYTES
        if small and f.name not in self._no_cache:
            try:
                self._check_shards(f, 0, self.manifest.samples)
                self._cache[f.name] = self._guarded(f, 0, self.manifest.samples, lambda: arr[:])
                return self._cache[f.name][a:b]
            except IntegrityError:
                self._no_cache.add(f.name)  # read only what is asked, so the error names those samples
        self._check_shards(f, a, b)
        return self._guarded(f, a, b, lambda: arr[a:b])

    def _guarded(self, f: FieldSpec, a: int, b: int, fn):
        try:
            return fn()
        except IntegrityError:
            raise
        except Exception as exc:  # zarr/numcodecs raise ValueError/RuntimeError on bad bytes
            chunk = self.layout[f.name]["chunk"]
            shard = self.layout[f.name]["shard"]
            lo, hi = a, b
            for c0 in range(a - a % chunk, b, chunk):  # locate the first bad chunk
                c1 = min(c0 + chunk, self.manifest.samples)
                try:
                    self._arrays[f.name][c0:c1]
                except Exception:  # noqa: BLE001
                    lo, hi = c0, c1
                    break
            key = shard_key(f.name, lo // shard, 1 + len(f.stored_shape))
            raise IntegrityError(
                f"{join(self.root, key)}: field {f.name!r} samples {lo}..{hi - 1} (chunk {lo // chunk}): "
                f"expected intact stored data. Got {type(exc).__name__}: {exc}"
            ) from exc

    def _index(self, i: object) -> int:
        if isinstance(i, torch.Tensor):
            i = i.item()
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
            raise TypeError(f"index: expected an int. Got {type(i).__name__}")
        n = self.manifest.samples
        j = int(i) + n if i < 0 else int(i)
        if not 0 <= j < n:
            raise IndexError(f"index {i} out of range for a dataset of {n} samples")
        return j

    def _make(self, values: list[torch.Tensor]):
        if self.as_dict:
            return {f.name: v for f, v in zip(self.fields, values)}
        return tuple(values)

    def _read_runs(self, idx: list[int]) -> dict[int, list[torch.Tensor]]:
        order = sorted(set(idx))
        runs, start = [], 0
        for k in range(1, len(order) + 1):
            if k == len(order) or order[k] != order[k - 1] + 1:
                runs.append((order[start], order[k - 1] + 1))
                start = k
        out: dict[int, list[torch.Tensor]] = {i: [] for i in order}
        for a, b in runs:
            for f in self.fields:
                t = f.to_tensor(self._read(f, a, b))
                for j in range(a, b):
                    out[j].append(t[j - a])
        return out

    def __len__(self) -> int:
        return self.manifest.samples

    def __getitem__(self, i):
        self._ensure_open()
        j = self._index(i)
        return self._make(self._read_runs([j])[j])

    def __getitems__(self, indices: Sequence[int]) -> list:
        self._ensure_open()
        idx = [self._index(i) for i in indices]
        try:
            got = self._read_runs(idx)
        except IntegrityError:
            if self.on_error == "raise":
                raise
            got = {}
            for j in sorted(set(idx)):
                try:
                    got.update(self._read_runs([j]))
                except IntegrityError as exc:
                    self.skipped += 1
                    log.warning("skipping sample %d: %s", j, exc)
        return [self._make(got[j]) for j in idx if j in got]

    # Decoding ------------------------------------------------------------------------------------
    def decompressor(self, field: str | None = None, **kwargs) -> Decompress:
        """The `Decompress` layer for a dct field (the only one when `field` is None)."""
        return Decompress.from_manifest(self.manifest, field, **kwargs)

    def __repr__(self) -> str:
        fields = ", ".join(f"{f.name}:{f.kind}{list(f.shape)}" for f in self.fields)
        return f"DCTZarrDataset({self.root!r}, samples={len(self)}, fields=[{fields}])"


def _shard_index_spec(arr, f: FieldSpec, layout: dict, root: str) -> tuple[int, bool]:
    """(chunks per shard, index at the end?) from the array's sharding codec, cross-checked with the
    manifest's layout; anything else than what the dctdata writer makes is an IntegrityError."""
    from zarr.codecs import Crc32cCodec, ShardingCodec

    codecs = getattr(arr.metadata, "codecs", ())
    sharding = codecs[0] if len(codecs) == 1 and isinstance(codecs[0], ShardingCodec) else None
    where = join(root, layout["path"], "zarr.json")
    if sharding is None or not any(isinstance(c, Crc32cCodec) for c in sharding.index_codecs):
        raise IntegrityError(f"{where}: field {f.name!r}: expected a sharded array with a crc32c shard index. Got codecs {codecs!r}")
    shard_shape = tuple(arr.metadata.chunk_grid.chunk_shape)
    chunk_shape = tuple(sharding.chunk_shape)
    if shard_shape[0] != layout["shard"] or chunk_shape[0] != layout["chunk"] or shard_shape[1:] != chunk_shape[1:]:
        raise IntegrityError(
            f"{where}: field {f.name!r}: expected shards of {layout['shard']} and chunks of {layout['chunk']} samples "
            f"(manifest layout). Got shard shape {shard_shape} and chunk shape {chunk_shape}"
        )
    return layout["shard"] // layout["chunk"], str(getattr(sharding.index_location, "value", sharding.index_location)) == "end"


def open_zarr_dataset(path_or_url, **kwargs) -> DCTZarrDataset:
    return DCTZarrDataset(path_or_url, **kwargs)
