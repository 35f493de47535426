"""Types of the lane emulator (`_ctxlanes.c`: the GPU decoder's source built as C), its method table."""

from typing import Any

import numpy.typing as npt

def decode_batch(
    model: npt.NDArray[Any],
    buf: npt.NDArray[Any],
    offsets: npt.NDArray[Any],
    out: npt.NDArray[Any],
    sample_shape: tuple[int, ...],
    itemsize: int,
    units_per_sample: int,
    status: npt.NDArray[Any],
    /,
) -> None: ...
