"""`.npy` bytes in and out, strictly: the element format of webdataset shards.

numpy writes the header as a Python dict literal and parses it back with ast.literal_eval. Shard bytes
are untrusted, and CPython 3.11's AST construction has a recursion-depth bookkeeping bug (gh-106905)
that can turn a later, valid parse into a SystemError. We only ever read headers in the exact form
numpy writes, so we match that form strictly instead, and numeric dtypes only (never objects, so
never pickle).
"""

from __future__ import annotations

import functools
import io
import math
import re
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from dctdata.errors import IntegrityError

_NPY_MAGIC = b"\x93NUMPY"
_NPY_HEADER_RE = re.compile(
    r"\{'descr': '([<>|=][biuf][0-9]{1,2})', 'fortran_order': (False|True), "
    r"'shape': \(((?:[0-9]+, )*[0-9]+,?|)\), \} *\n"
)


@functools.lru_cache(maxsize=256)
def npy_size(shape: tuple[int, ...], dtype: str) -> int:
    """Bytes of the .npy of an array of this shape and dtype (numpy's header length is fixed by them)."""
    dt = np.dtype(dtype)
    buf = io.BytesIO()
    header = {"descr": np.lib.format.dtype_to_descr(dt), "fortran_order": False, "shape": tuple(shape)}
    np.lib.format.write_array_header_1_0(buf, header)
    return len(buf.getvalue()) + math.prod(shape) * dt.itemsize


@functools.lru_cache(maxsize=256)
def npy_header(shape: tuple[int, ...], dtype: str) -> bytes:
    """The header bytes `encode_npy` writes before an array of this shape and dtype."""
    dt = np.dtype(dtype)
    return encode_npy(np.zeros(shape, dt))[: npy_size(shape, dtype) - math.prod(shape) * dt.itemsize]


def encode_npy(arr: npt.NDArray[Any]) -> bytes:
    """Array -> .npy bytes in C order, so the bytes depend on the values only (never pickle)."""
    buf = io.BytesIO()
    # np.ascontiguousarray would make a 0-d array 1-d; copy(order="C") keeps it.
    np.save(buf, arr if arr.flags.c_contiguous else arr.copy(order="C"), allow_pickle=False)
    return buf.getvalue()


def decode_npy(raw: bytes | bytearray | memoryview, where: str) -> npt.NDArray[Any]:
    """`.npy` bytes -> a writable numeric array. Strict: the header form numpy writes, numeric dtypes
    only, and exactly the data bytes the header promises."""
    arr, rest = split_npy(raw, where)
    if len(rest):
        raise IntegrityError(
            f"{where}: expected {arr.nbytes} data bytes for {arr.dtype} {arr.shape}. Got {arr.nbytes + len(rest)}"
        )
    return arr


_CACHED_HEADER = 256  # numpy pads headers to 64 or 128 bytes; longer ones are parsed every time


@functools.lru_cache(maxsize=64)
def _parse_header(header: str) -> tuple[np.dtype[Any], tuple[int, ...], Literal["C", "F"]] | None:
    """(dtype, shape, order) of a header in the form numpy writes, else None. Cached: the members of a
    field share one header, and parsing it again is a visible share of decoding a small zstd-coded sample."""
    m = _NPY_HEADER_RE.fullmatch(header)
    if m is None:
        return None
    shape = tuple(int(v) for v in m.group(3).replace(",", " ").split())
    return np.dtype(m.group(1)), shape, "F" if m.group(2) == "True" else "C"


def split_npy(raw: bytes | bytearray | memoryview, where: str) -> tuple[npt.NDArray[Any], memoryview]:
    """The first `.npy` of `raw` (strictly, as `decode_npy`) and the bytes after it: a member may hold
    two arrays back to back (a dct field's coefficients, then its per-sample side information)."""
    b = memoryview(raw).cast("B")
    if len(b) < 10 or bytes(b[:6]) != _NPY_MAGIC:
        raise IntegrityError(f"{where}: expected .npy bytes. Got no .npy magic")
    major = b[6]
    if major == 1:
        start, hlen = 10, int.from_bytes(b[8:10], "little")
    elif major in (2, 3):
        start, hlen = 12, int.from_bytes(b[8:12], "little")
    else:
        raise IntegrityError(f"{where}: expected .npy format version 1, 2 or 3. Got {major}")
    header = bytes(b[start : start + hlen]).decode("latin1")
    parsed = _parse_header(header) if len(header) <= _CACHED_HEADER else _parse_header.__wrapped__(header)
    if parsed is None:
        if "'descr': '|O'" in header:
            raise IntegrityError(
                f"{where}: expected a numeric .npy array. Got an object array, which only pickle could load"
            )
        raise IntegrityError(f"{where}: expected a numeric .npy header as numpy writes it. Got {header[:80]!r}")
    dtype, shape, order = parsed
    count = math.prod(shape)
    need = count * dtype.itemsize
    data = b[start + hlen :]
    if len(data) < need:
        raise IntegrityError(f"{where}: expected {need} data bytes for {dtype} {shape}. Got {len(data)}")
    # a copy in native byte order: torch (and every consumer) refuses big-endian arrays
    native = dtype.newbyteorder("=")
    arr = np.frombuffer(data[:need], dtype=dtype, count=count).reshape(shape, order=order).astype(native, order="C")
    return arr, data[need:]
