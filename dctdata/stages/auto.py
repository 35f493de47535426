"""The pack setting "auto": per dct field, the stage that stores its quantized coefficients in the fewest
bytes, model included. A policy over two stages, not a stage.

Why these two (the measurements are in docs/benchmarks/entropy.md and docs/benchmarks/design.md): on
quantized coefficients of package-shipped images and SciML fields the entropy coder stores less than zstd-19 on
most sets, encodes faster than zstd-9 and decodes fast enough for the loaders; zstd-19 wins on periodic
textures its long matches catch, and decodes faster. So integer coefficients get the smaller of the two
(a tie goes to zstd-19, the faster to decode); float coefficients, arrays and labels get zstd-9 (packing
speed; masks and labels are a small share of a pack).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dctdata.stages.ctxrans import CtxransStage, estimate
from dctdata.stages.zstd import DEFAULT_CONFIG, max_stage

AUTO = "auto"
AUTO_HELP = f"{AUTO} (default: per dct field the smaller of the entropy coder and zstd-19)"
FIT_VALUES = 1 << 22  # coefficients the entropy coder's model is fitted on (evenly spaced samples)


class Auto:
    """ "auto" where calibration asks a stage: the same two calls (`Stage.estimate_size`, `Stage.choose`)."""

    def estimate_size(self, q: np.ndarray, cf: int, mask: str, integer: bool) -> int:
        """The entropy coder's one-pass estimate for integer planes, zstd-19's bytes for others."""
        return estimate(q, cf, mask, integer)

    def choose(self, q: np.ndarray, cf: int, mask: str, integer: bool, compare_values: int) -> dict[str, Any]:
        """The stage config of a dct field from its quantized calibration coefficients q (B, C, Hb, K, Wb): for
        integers the coder fitted on a few million of them (evenly spaced samples), unless zstd-19 stores a
        bounded share (`compare_values` coefficients: zstd-19 encodes slowly) in no more bytes, the model's
        share counted; zstd-9 for float coefficients; zstd-19 for volume blocks the coder cannot code."""
        from dctdata.entropy.ctxrans import supports

        if not integer:
            return dict(DEFAULT_CONFIG)
        if not supports(cf, mask):
            return max_stage().get_config()
        per = max(1, q[0].size)
        pick = np.unique(np.linspace(0, len(q) - 1, max(1, min(len(q), FIT_VALUES // per))).astype(int))
        sub = q[: max(1, compare_values // per)]
        best, cost = None, 0.0
        for stage in (max_stage(), CtxransStage.fit(q[pick], cf, mask)):  # ties: the first
            c = len(stage.encode(sub)) + stage.model_nbytes() * len(sub) / len(q)
            if best is None or c < cost:
                best, cost = stage, c
        return best.get_config()
