"""Types of the entropy coder's C kernel (`_ctxrans.c`, its method table): what its callers are checked against."""

from collections.abc import Sequence
from typing import Any, TypeAlias

import numpy.typing as npt

_Bytes: TypeAlias = bytes | bytearray | memoryview | npt.NDArray[Any]

NTOK: int
D: int
SCALE: int
NFEAT: int
LUTB: int
MAGIC: int
TABPAD: int
MODE_LANES: int
MODE_SEGMENTS: int

def encode(
    model: npt.NDArray[Any],
    q: npt.NDArray[Any],
    shape: Sequence[int],
    itemsize: int,
    mode: int = ...,
    nseg: int = ...,
    /,
) -> bytes: ...
def decode(
    model: npt.NDArray[Any], buf: _Bytes, out: npt.NDArray[Any], shape: Sequence[int], itemsize: int, /
) -> None: ...
def decode_many(
    model: npt.NDArray[Any], bufs: Sequence[_Bytes], out: npt.NDArray[Any], shape: Sequence[int], itemsize: int, /
) -> int: ...
def set_simd(on: bool = ..., /) -> bool: ...
def set_gather(instruction: bool = ..., /) -> bool: ...
def max_coefficients(nbytes: int, /) -> int: ...
def contexts(
    model: npt.NDArray[Any],
    q: npt.NDArray[Any],
    shape: Sequence[int],
    itemsize: int,
    ctx_out: npt.NDArray[Any],
    tok_out: npt.NDArray[Any],
    /,
) -> int: ...
def estimate(
    model: npt.NDArray[Any],
    q: npt.NDArray[Any],
    shape: Sequence[int],
    itemsize: int,
    cost: npt.NDArray[Any],
    every: int = ...,
    run: int = ...,
    /,
) -> tuple[int, int]: ...
