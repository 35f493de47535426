"""The functional decode, `dctdata.decompress`: coefficients -> images through the kernels `Decompress` takes.

(..., Hb, K, Wb) coefficients of plain (unquantized) frequencies go through the layers' kernel dispatch
(`dctdata.decoder.kernels`): the fused Triton kernel on CUDA and the fused C kernel on plain CPU tensors in
eager mode, each with unit dequantization tables (one channel, step 1, offset 0); everywhere else
(autograd, torch.compile, torch.export, ONNX, other devices, or where the kernels are off) through
`transform.decompress`, the torch kernels, which stays the reference path of `quantize.decode_reference`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

import dctdata.decoder.fused as fused
import dctdata.decoder.fused_cuda as fused_cuda
import dctdata.decoder.kernels as kernels
from dctdata.codec.transform import check_coeff_grid, num_kept, parse_size
from dctdata.codec.transform import decompress as torch_decompress

__all__ = ["decompress"]


def decompress(coeffs: torch.Tensor, cf: int, size: tuple[int, int], mask: str = "square") -> torch.Tensor:
    """(..., Hb, K, Wb) coefficients -> (..., H, W) float32 image (inverse DCT, crop padding).

    Args:
        coeffs: Coefficients (..., Hb, K, Wb) as `compress` returns them.
        cf: The chop factor 1..8: frequencies u, v < cf are candidates.
        size: The image size (H, W) to crop to.
        mask: "square" (u, v < cf: cf^2 kept) or "triangle" (u + v < cf: cf(cf+1)/2 kept).

    Returns:
        The float32 images (..., H, W), on `coeffs`' device.

    Raises:
        TypeError: `coeffs` is not a torch.Tensor.
        DctDataError: `coeffs`' last three axes do not match (Hb, K, Wb) for `size`, `cf` and `mask`.
    """
    if not isinstance(coeffs, torch.Tensor):
        raise TypeError(f"coeffs: expected a torch.Tensor of shape (..., Hb, K, Wb). Got {type(coeffs).__name__}")
    size = parse_size(size)
    k = num_kept(cf, mask)
    check_coeff_grid(tuple(coeffs.shape), k, size, "coeffs")
    *lead, hb, _, wb = coeffs.shape
    y = coeffs.reshape(-1, 1, hb, k, wb)
    if y.dtype not in fused_cuda.WIRES:
        y = y.to(torch.float32)
    img = kernels.decode(_Plain(cf, mask, size), y, torch.float32, cf, mask, size)
    return img.reshape(*lead, *size)


@dataclass(frozen=True)
class _Plain:
    """The decode of plain coefficients as `kernels.decode` takes it (`kernels.Source`): unit tables for the
    fused kernels, `transform.decompress` as the torch graph."""

    cf: int
    mask: str
    size: tuple[int, int]

    def _tables(self) -> fused.Tables:
        return _tables(self.cf, self.mask)

    def _tables_on(self, device: torch.device) -> fused_cuda.DeviceTables:
        return _device_tables(self.cf, self.mask, device)

    def _portable(
        self, q: torch.Tensor, side: torch.Tensor | None, out: torch.Tensor | None, dtype: torch.dtype
    ) -> torch.Tensor:
        return torch_decompress(q, self.cf, self.size, self.mask)


@functools.cache
def _tables(cf: int, mask: str) -> fused.Tables:
    """The fused kernels' tables of plain coefficients: one channel, step 1, offset 0."""
    k = num_kept(cf, mask)
    return fused.Tables(torch.ones(1, k), torch.zeros(1, k), None, None, None, None)


@functools.cache
def _device_tables(cf: int, mask: str, device: torch.device) -> fused_cuda.DeviceTables:
    """`_tables` on `device`, copied there once."""
    return fused_cuda.device_tables(_tables(cf, mask), device, cf, mask)
