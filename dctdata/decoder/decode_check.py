"""Decode a batch of coefficients and name the samples that do not decode to finite values: the one
check `dctdata verify` runs on every sample (tampered steps or coefficients can decode to inf/NaN even
when every checksum holds)."""

from __future__ import annotations

import torch

from dctdata.decoder.layer import Decompress


def nonfinite_samples(layer: Decompress, coeffs: object) -> list[int]:
    """Positions in the batched wire value `coeffs` (coefficients (B, C, Hb, K, Wb), or the pair with the side
    information, as `dctdata.decoder.wire` defines) whose decoded samples hold NaN or inf."""
    with torch.inference_mode():
        x = layer(coeffs)
    return (~torch.isfinite(x.flatten(1)).all(1)).nonzero().flatten().tolist()
