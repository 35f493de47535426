"""The wire value of a `dct` field: what a packed dataset yields for it and `Decompress` takes.

A coefficient tensor (..., C, Hb, K, Wb), or the pair (coefficients, side) when the field's spec carries
per-sample side information (side (..., C, 2) float32 = [range, mid] per channel). A DataLoader
collates the pair into a pair of batched tensors, so the first layer takes the batch unchanged.
"""

from __future__ import annotations

import torch

from dctdata.errors import DctDataError
from dctdata.spec import CodecSpec


def split_wire(wire, spec: CodecSpec, name: str = "coeffs") -> tuple[torch.Tensor, torch.Tensor | None]:
    """(coefficients, side or None) from a field's wire value, checking it has the spec's form."""
    if spec.side is None:
        if not isinstance(wire, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor. Got {type(wire).__name__}")
        return wire, None
    if not isinstance(wire, (tuple, list)) or len(wire) != 2 or not all(isinstance(t, torch.Tensor) for t in wire):
        raise TypeError(
            f"{name}: expected the pair (coefficients, side) of torch.Tensors the field yields (its spec has "
            f"per-sample side information). Got {type(wire).__name__}"
        )
    q, side = wire
    if tuple(side.shape[-2:]) != (spec.channels, 2) or tuple(side.shape[:-2]) != tuple(q.shape[:-4]):
        raise DctDataError(
            f"side: expected shape (..., {spec.channels}, 2) matching coefficients {tuple(q.shape)}. Got "
            f"{tuple(side.shape)}"
        )
    return q, side
