"""Array files: `.npy` (read by rows with positional reads, pickle-free), `.npz` (members streamed row by
row from the zip), and directories of per-sample `.npy`/`.npz` files.
"""

from __future__ import annotations

import os
import zipfile
from typing import Any

import numpy as np

from dctdata.errors import DctDataError
from dctdata.preprocess.sources.base import Source, field_name


# .npy ----------------------------------------------------------------------------------------------
def _npy_header(fh, where: str) -> tuple[tuple[int, ...], bool, np.dtype]:
    try:
        version = np.lib.format.read_magic(fh)
        reader = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = reader(fh)
    except (ValueError, OSError, EOFError) as exc:
        raise DctDataError(f"{where}: expected a .npy array. Got an unreadable header ({exc})") from exc
    if dtype.hasobject or dtype.kind in "OUSVMm":
        raise DctDataError(
            f"{where}: expected a numeric array. Got dtype {dtype} (object/pickle, string or structured arrays are "
            "never loaded)"
        )
    return tuple(shape), fortran, dtype


def load_npy(path: str, mmap: bool = True) -> np.ndarray:
    """Validated, pickle-free .npy load (memory-mapped by default); truncation named, not mis-read."""
    with open(path, "rb") as fh:
        shape, _, dtype = _npy_header(fh, path)
        offset = fh.tell()
    need = offset + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    size = os.path.getsize(path)
    if size < need:
        raise DctDataError(
            f"{path}: expected {need} bytes for a {dtype} array of shape {shape}. Got {size} (truncated file)"
        )
    try:
        return np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except (ValueError, OSError) as exc:
        raise DctDataError(f"{path}: cannot read .npy: {exc}") from exc


class NpyRows:
    """A C-order .npy file's rows, sliced like an array (`rows[a:b]`) and read with positional reads.

    Why not a memory map (what this replaced): a mapped file that is truncated while the pack reads it (a
    pipeline regenerating its data with np.save) kills the packer with SIGBUS: no message, no traceback. A
    read that comes back short is an error naming the file instead. The page cache serves both alike."""

    def __init__(self, path: str, shape: tuple[int, ...], dtype: np.dtype, offset: int) -> None:
        self.path, self.shape, self.dtype, self.offset = path, tuple(shape), np.dtype(dtype), offset
        self.ndim = len(self.shape)
        self.row = int(np.prod(self.shape[1:], dtype=np.int64)) * self.dtype.itemsize
        self._fd: int | None = None
        self._pid: int | None = None

    def __len__(self) -> int:
        return self.shape[0]

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_fd": None, "_pid": None}

    def __getitem__(self, index) -> np.ndarray:
        if not isinstance(index, slice):
            raise TypeError(f"{self.path}: expected a slice of rows. Got {type(index).__name__}")
        start, stop, step = index.indices(self.shape[0])
        if step != 1:
            raise TypeError(f"{self.path}: expected a contiguous slice of rows. Got step {step}")
        n = max(0, stop - start)
        out = np.empty((n, *self.shape[1:]), dtype=self.dtype)
        view = memoryview(out.reshape(-1).view(np.uint8)) if out.size else memoryview(b"")
        at, pos = 0, self.offset + start * self.row
        while at < len(view):
            got = os.preadv(self._file(), [view[at:]], pos + at)
            if got == 0:
                raise DctDataError(
                    f"{self.path}: expected {n * self.row} bytes of samples {start}..{stop - 1}. Got {at} "
                    "(the file was truncated while being packed)"
                )
            at += got
        return out

    def _file(self) -> int:
        if self._pid != os.getpid():
            self._fd, self._pid = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)), os.getpid()
        return self._fd

    def close(self) -> None:
        if self._fd is not None and self._pid == os.getpid():
            os.close(self._fd)
        self._fd = self._pid = None


class ArraySource(Source):
    """Fields backed by sliceable arrays with samples on axis 0 (.npy rows, HDF5 datasets)."""

    def __init__(self, description: str, arrays: dict[str, Any], owner: Any = None) -> None:
        self.description = description
        self.arrays = arrays
        self.owner = owner
        lengths = {k: a.shape[0] if a.ndim else None for k, a in arrays.items()}
        for k, n in lengths.items():
            if n is None:
                raise DctDataError(f"{description}: field {k!r}: expected samples on the first axis. Got a 0-d array")
        if len(set(lengths.values())) > 1:
            raise DctDataError(f"{description}: expected every field to have the same sample count. Got {lengths}")
        self.n = next(iter(lengths.values())) if lengths else 0

    def __len__(self) -> int:
        return self.n

    def probe(self):
        if self.n == 0:
            raise DctDataError(f"{self.description}: expected at least one sample. Got 0")
        return {k: (tuple(a.shape[1:]), np.dtype(a.dtype)) for k, a in self.arrays.items()}

    def read_batch(self, start, stop):
        return {k: np.asarray(a[start:stop]) for k, a in self.arrays.items()}

    def sample(self, index):
        return {k: v[0] for k, v in self.read_batch(index, index + 1).items()}

    def close(self):
        if self.owner is not None:
            self.owner.close()


def npy_source(path: str) -> ArraySource:
    with open(path, "rb") as fh:
        shape, fortran, dtype = _npy_header(fh, path)
        offset = fh.tell()
    if not shape:
        raise DctDataError(f"{path}: expected an array with samples on the first axis. Got a 0-d array")
    if fortran and len(shape) > 1:
        raise DctDataError(
            f"{path}: expected a C-order array (read by rows). Got Fortran order (save np.ascontiguousarray(x))"
        )
    need = offset + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    size = os.path.getsize(path)
    if size < need:
        raise DctDataError(
            f"{path}: expected {need} bytes for a {dtype} array of shape {shape}. Got {size} (truncated file)"
        )
    rows = NpyRows(path, shape, dtype, offset)
    return ArraySource(path, {"image": rows}, owner=rows)


# .npz (streamed row by row from the zip members) -------------------------------------------------
class NpzSource(Source):
    random_access = False

    def __init__(self, path: str) -> None:
        self.description = path
        self.path = path
        try:
            with zipfile.ZipFile(path) as zf:
                members = [m for m in zf.namelist() if m.endswith(".npy")]
                self.headers = {}
                for m in members:
                    with zf.open(m) as fh:
                        shape, fortran, dtype = _npy_header(fh, f"{path}[{m[:-4]}]")
                    if fortran and len(shape) > 1:
                        raise DctDataError(
                            f"{path}[{m[:-4]}]: expected a C-order array (streamed by rows). Got Fortran order"
                        )
                    if not shape:
                        raise DctDataError(f"{path}[{m[:-4]}]: expected samples on the first axis. Got a 0-d array")
                    self.headers[m] = (shape, dtype)
        except (zipfile.BadZipFile, OSError, EOFError) as exc:
            raise DctDataError(f"{path}: expected a readable .npz (zip) file. Got {exc}") from exc
        if not members:
            raise DctDataError(f"{path}: expected at least one array in the .npz. Got none")
        self.names = {m: field_name(m[:-4]) for m in members}
        lengths = {self.names[m]: h[0][0] for m, h in self.headers.items()}
        if len(set(lengths.values())) > 1:
            raise DctDataError(f"{path}: expected every array to have the same sample count. Got {lengths}")
        self.n = next(iter(lengths.values()))

    def __len__(self):
        return self.n

    def probe(self):
        if self.n == 0:
            raise DctDataError(f"{self.path}: expected at least one sample. Got 0")
        return {self.names[m]: (tuple(s[1:]), d) for m, (s, d) in self.headers.items()}

    def batches(self, batch_size, start=0, stop=None):
        stop = self.n if stop is None else min(stop, self.n)
        try:
            with zipfile.ZipFile(self.path) as zf:
                handles = {}
                for m in self.headers:
                    fh = zf.open(m)
                    _npy_header(fh, self.path)
                    handles[m] = fh
                row = {m: int(np.prod(s[1:], dtype=np.int64)) * d.itemsize for m, (s, d) in self.headers.items()}
                for m, fh in handles.items():
                    _read_exact(fh, row[m] * start, f"{self.path}[{m[:-4]}]", start)
                for a in range(start, stop, batch_size):
                    b = min(a + batch_size, stop)
                    out = {}
                    for m, fh in handles.items():
                        shape, dtype = self.headers[m]
                        raw = _read_exact(fh, row[m] * (b - a), f"{self.path}[{m[:-4]}]", a)
                        out[self.names[m]] = np.frombuffer(raw, dtype=dtype).reshape((b - a, *shape[1:]))
                    yield a, out
        except (zipfile.BadZipFile, OSError, EOFError) as exc:
            raise DctDataError(f"{self.path}: expected a readable .npz (zip) file. Got {exc}") from exc

    def read_batch(self, start, stop):
        return next(self.batches(stop - start, start, stop))[1]


def _read_exact(fh, n: int, where: str, sample: int) -> bytes:
    raw = fh.read(n)
    if len(raw) != n:
        raise DctDataError(f"{where}: expected {n} more bytes at sample {sample}. Got {len(raw)} (truncated file)")
    return raw


# Directory of per-sample files -------------------------------------------------------------------
class FileDirSource(Source):
    def __init__(self, path: str, files: list[str]) -> None:
        self.description = path
        self.files = files

    def __len__(self):
        return len(self.files)

    def where(self, index):
        return self.files[index]

    def sample(self, index):
        f = self.files[index]
        if f.endswith(".npy"):
            return {"image": np.asarray(load_npy(f, mmap=False))}
        out = {}
        try:
            with np.load(f, allow_pickle=False) as npz:
                for k in npz.files:
                    arr = npz[k]
                    if arr.dtype.kind in "OUSVMm":
                        raise DctDataError(f"{f}[{k}]: expected a numeric array. Got dtype {arr.dtype}")
                    out[field_name(k)] = arr
        except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
            if isinstance(exc, DctDataError):
                raise
            raise DctDataError(f"{f}: expected a readable pickle-free .npz file. Got {exc}") from exc
        return out
