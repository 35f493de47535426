"""The first layer for volumes: `Decompress` of a spec with a depth (samples (C, D, H, W), 8x8x8 blocks).

`Decompress(spec)` returns this subclass when `spec.depth` is set, so a model, `ds.decompressor()` and
`Decompress.from_manifest` need nothing new. It takes the field's value as a DataLoader collates it: the
coefficient batch (B, C, Db, Hb, K, Wb) in the wire dtype, or the pair (coefficients, side), or a
`StoredBatch` (decode="device"), and returns (B, C, D, H, W) in `dtype` on the input's device.

Two paths with the same math, chosen by the decode's kernel dispatch (`dctdata.decoder.kernels`):
- portable (CUDA, autograd, torch.compile, torch.export, ONNX): one affine pass over the coefficient tensor
  (dequantization with the dead zone's reconstruction offsets, the C x C inverse rotation as a small
  matmul, the per-sample (range, mid) and normalization as a multiply-add; a constant is
  sqrt(512) times itself on the DC term), then the three synthesis matmuls of `transform3d.synthesize`.
  Only matmul/reshape/transpose/cat ops plus those few elementwise ones. The affine pass is kept for every
  spec (2-D folds a plain spec's steps into its weights instead): it reads a tensor of K/512 of the output,
  and one code path is what CUDA and ONNX see.
- fused CPU (plain CPU tensors in eager mode, float32 output): the C kernel
  (`dctdata.decoder.fused.synthesize_volume`, `_synth.c`), which dequantizes, mixes channels, applies the per-sample
  values and runs the 8x8x8 inverse DCT per group of 8 neighbouring blocks in registers and L1, writing each
  output voxel once.
"""

from __future__ import annotations

from dctdata.decoder.layer import DC_GAIN, VolumeDecompress

__all__ = ["DC_GAIN", "VolumeDecompress"]
