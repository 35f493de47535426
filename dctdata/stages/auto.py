"""The pack setting "auto": per dct field, the stage that stores its quantized coefficients in the fewest
bytes, model included. A policy over two stages, not a stage.

Why these two (the measurements are in docs/benchmarks/entropy.md and docs/benchmarks/design.md): on
quantized coefficients of package-shipped images and SciML fields the entropy coder stores less than zstd-19 on
most sets, encodes faster than zstd-9 and decodes fast enough for the loaders; zstd-19 wins on periodic
textures its long matches catch, and decodes faster. So integer coefficients get the smaller of the two
(a tie goes to zstd-19, the faster to decode); float coefficients, arrays and labels get zstd-9 (packing
speed; masks and labels are a small share of a pack).

Both are sized as the writer stores them: one stream per chunk of `writer_chunk` samples (the zarr
writer's default inner chunk; a chunk is the unit zstd's matches cannot cross), on a few evenly spaced
chunks of the calibration subset (`SAMPLE_CHUNKS`, scaled to the subset; the two stages code the same
chunks, so the comparison is paired). Sized as one stream over the subset instead, zstd-19 found matches
across samples that per-chunk frames never see, and "auto" chose it where it stored far more.

zstd-19 is only run where it could win: it encodes slowly (on a large field's subset, more time than the
rest of calibration), and its bytes never fell far below zstd-1's on the same chunks of the `rd` bench sets
(docs/benchmarks/design.md has the shares). So where the entropy coder (its model counted) stores at most
`SURE` x zstd-1's bytes, zstd-19 would have to store less than that share of zstd-1's to win, below every
share measured; it is not tried, and the choice is the one sizing it would have made. Elsewhere both are
sized as above.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import numpy.typing as npt

from dctdata.stages.ctxrans import CtxransStage, estimate
from dctdata.stages.zstd import DEFAULT_CONFIG, ZstdStage, max_stage

AUTO = "auto"
AUTO_HELP = f"{AUTO} (default: per dct field the smaller of the entropy coder and zstd-19)"
FIT_VALUES = 1 << 22  # coefficients the entropy coder's model is fitted on (evenly spaced samples)
SAMPLE_CHUNKS = 8  # writer chunks each stage codes to decide (evenly spaced over the subset)
# The decoded bytes of a zarr inner chunk the writer aims at (`dctdata.format.zarr.layout.CHUNK_BYTES`, which a
# test keeps equal: the format imports the stages, so this module cannot import it).
CHUNK_BYTES = 16 << 10
FAST_LEVEL = 1  # the zstd level whose bytes bound zstd-19's from below (see the module docstring)
SURE = 0.62  # the entropy coder at or below this share of zstd-1's bytes stores less than zstd-19 would


def writer_chunk(sample_bytes: int) -> int:
    """Samples per stored stream of a field whose samples take `sample_bytes` before the lossless stage: the
    zarr writer's default inner chunk (a power of two, at least one sample; a webdataset member is one
    sample, the same wherever a sample is 8 KiB or more)."""
    return 1 << (max(1, CHUNK_BYTES // max(1, int(sample_bytes))).bit_length() - 1)


def chunked_bytes(
    stage: Any, q: npt.NDArray[Any], chunks: int | None = SAMPLE_CHUNKS, values: int | None = None
) -> float:
    """Bytes `stage` stores q (B, C, Hb, K, Wb) in, one stream per writer chunk (`writer_chunk`): every chunk
    coded (`chunks=None`), or `chunks` evenly spaced ones scaled to all of q. `values` bounds the coefficients
    coded (at least one chunk; a chunk larger than that is coded on its first block rows, or a volume's first
    planes of blocks, and scaled)."""
    b = len(q)
    if b == 0:
        return 0.0
    per = max(1, q[0].size)
    chunk = writer_chunk(q[0].nbytes)
    starts = list(range(0, b, chunk))
    if chunks is not None:
        keep = max(1, min(len(starts), chunks, (values or 1 << 62) // (per * chunk)))
        starts = [starts[int(i)] for i in np.unique(np.linspace(0, len(starts) - 1, keep).round())]
    coded, nbytes = 0, 0
    for lo in starts:
        part = q[lo : lo + chunk]
        rows = part.shape[2]
        if values is not None and part.size > values and rows > 1:  # block rows (a volume's block planes)
            rows = max(1, values // max(1, part.size // rows))
        nbytes += len(stage.encode(np.ascontiguousarray(part[:, :, :rows]))) * part.shape[2] / rows
        coded += len(part)
    return nbytes * b / coded


def stored_bytes(stage: Any, q: npt.NDArray[Any], values: int) -> float:
    """The bytes a pack stores q (B, C, Hb, K, Wb) in with `stage` (calibration's report): every writer chunk
    coded, or with zstd at level 10 and above (it encodes slowly; never over the whole subset) `SAMPLE_CHUNKS`
    of them scaled (at most `values` coefficients)."""
    slow = stage.get_config().get("id") == "zstd" and stage.get_config().get("level", 0) >= 10
    return chunked_bytes(stage, q, SAMPLE_CHUNKS, values) if slow else chunked_bytes(stage, q, None)


class Auto:
    """ "auto" where calibration asks a stage: the same two calls (`Stage.estimate_size`, `Stage.choose`)."""

    def estimate_size(self, q: npt.NDArray[Any], cf: int, mask: str, integer: bool) -> int:
        """The entropy coder's one-pass estimate for integer planes, zstd-19's bytes for others."""
        return estimate(q, cf, mask, integer)

    def choose(self, q: npt.NDArray[Any], cf: int, mask: str, integer: bool, compare_values: int) -> dict[str, Any]:
        """The stage config of a dct field from its quantized calibration coefficients q (B, C, Hb, K, Wb): for
        integers the coder fitted on a few million of them (evenly spaced samples), unless zstd-19 stores the
        same few writer chunks (`chunked_bytes`: at most `SAMPLE_CHUNKS` of them and `compare_values`
        coefficients, since zstd-19 encodes slowly) in no more bytes, the model's bytes counted over the
        subset; zstd-9 for float coefficients; zstd-19 for volume blocks the coder cannot code."""
        from dctdata.entropy.ctxrans import supports

        if not integer:
            return dict(DEFAULT_CONFIG)
        if not supports(cf, mask):
            return max_stage().get_config()
        per = max(1, q[0].size)
        pick = np.unique(np.linspace(0, len(q) - 1, max(1, min(len(q), FIT_VALUES // per))).astype(int))
        coder = CtxransStage.fit(q[pick], cf, mask)
        coded = chunked_bytes(coder, q, SAMPLE_CHUNKS, compare_values) + coder.model_nbytes()
        if coded <= SURE * chunked_bytes(fast_stage(), q, SAMPLE_CHUNKS, compare_values):
            return coder.get_config()  # zstd-19 cannot store less (see the module docstring)
        slow = max_stage()  # a tie goes to zstd-19
        return (slow if chunked_bytes(slow, q, SAMPLE_CHUNKS, compare_values) <= coded else coder).get_config()


@functools.lru_cache(maxsize=1)
def fast_stage() -> ZstdStage:
    """zstd at FAST_LEVEL: its bytes bound zstd-19's from below in "auto"'s choice."""
    return ZstdStage.from_config({**DEFAULT_CONFIG, "level": FAST_LEVEL})
