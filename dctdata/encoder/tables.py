"""What a codec table costs in the manifest against what it saves on the coefficients (issue 46: calibration
minimises the whole pack, tables included).

A table is stored once per pack, the coefficients once per sample: on a large set a per-frequency table pays for
itself many times over, on a single small volume its bytes can outweigh what it saves. The reconstruction
offsets (`recon`, C x K in steps, `dctdata.encoder.calibrate.fit_recon`) are weighed here: per channel, either
one offset per frequency or one offset for every frequency (a constant row, which the manifest's packed form
stores as one number), whichever makes the smaller pack by this estimate (by a margin, `MARGIN`):

- saved on the coefficients: at the same steps, the per-frequency offsets lower the channel's squared error
  from D1 to D0, which a fine quantizer would otherwise pay for with 0.5 log2(D1 / D0) bits per coefficient
  (over every coefficient of the dataset the channel holds);
- the table's cost: its row as the manifest stores it (`dctdata.format.fields.table_json`: base64 of zlib of
  float32) less the constant row's (one number).
"""

from __future__ import annotations

import json
import math

import numpy as np
import torch

from dctdata.codec.spec import f32
from dctdata.format.fields import table_json

# The saving is a high-rate estimate, and near a tie the choice would flip from one landing step to the next (the
# search compares settings on one choice and lands on the other): a row becomes one value only where its table
# costs this many times what it saves.
MARGIN = 2.0


def table_bytes(table) -> int:
    """Bytes a (C, K) table takes in the manifest: its JSON as `dctdata.format.fields.table_json` writes it (one
    number per channel when every row is constant, else base64 of zlib of float32, or the numbers of a small
    table), of the float32 values the codec keeps; None or an empty table costs nothing."""
    if table is None:
        return 0
    rows = np.asarray(table, dtype="<f4").reshape(len(table), -1)
    if rows.size == 0:
        return 0
    values = [[f32(v) for v in row] for row in rows.tolist()]
    return len(json.dumps(table_json(values), separators=(",", ":")))


def packed_bytes(row) -> int:
    """Bytes one table row takes in the manifest (`table_bytes` of a one-channel table)."""
    return table_bytes([list(row)])


def choose_recon(
    v: torch.Tensor, q: torch.Tensor, delta: torch.Tensor, steps: torch.Tensor, sse: torch.Tensor, coefficients: float
) -> torch.Tensor:
    """Per channel, the per-frequency offsets `delta` or one offset for all frequencies (see the module docstring).

    Args:
        v: Coefficients over their steps (R, C, K, Wb), as quantized.
        q: The quantized values (R, C, K, Wb).
        delta: The per-frequency offsets in steps (C, K), rounded as stored (`fit_recon`).
        steps: The steps (C, K) of the coefficients.
        sse: (C,) the channel's squared error on these coefficients with `delta`, dropped frequencies included.
        coefficients: How many coefficients of one channel the whole dataset holds (R x K x Wb scaled up).

    Returns:
        The (C, K) offsets to store: a row of `delta`, or a constant row (the mean shift over the channel's
        nonzero values, rounded as `delta` is).
    """
    nz = q != 0
    a = torch.where(nz, q.abs() - v.abs(), torch.zeros_like(v)).double()  # the shift each nonzero value wants
    n = nz.sum((0, 3)).double()  # (C, K)
    s1, s2 = a.sum((0, 3)), a.pow(2).sum((0, 3))
    flat = (torch.round(s1.sum(1) / n.sum(1).clamp(min=1) * 100) / 100).clamp(-0.99, 0.99)  # (C,)
    step2 = steps.double().pow(2)

    def err(d: torch.Tensor) -> torch.Tensor:  # (C,) squared error of the nonzero values with offsets d (C, K)
        return ((s2 - 2 * d * s1 + n * d * d) * step2).sum(1)

    d = delta.double()
    extra = (err(flat[:, None].expand_as(d)) - err(d)).clamp(min=0)  # what the constant row adds
    out = d.clone()
    for c in range(d.shape[0]):
        d0 = float(sse[c])
        saved = coefficients / 16 * math.log2((d0 + float(extra[c])) / d0) if d0 > 0 else math.inf
        cost = packed_bytes(d[c].tolist()) - packed_bytes([float(flat[c])] * d.shape[1])
        if saved < cost / MARGIN:
            out[c] = flat[c]
    return out.to(delta.dtype)
