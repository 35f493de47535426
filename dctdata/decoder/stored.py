"""Stored bytes of a dct field on the wire (`open_dataset(..., decode="device")`): the checks a stream
passes in the worker before it may leave, and the decode that finishes it where the decompressor runs.

- `check_stream` (in the worker, after the chunk's crc32c or the shard's sha256): a bytes codec's
  header declares exactly the bytes the stream must decode to, a raw stream has them. The entropy
  coder's streams have no header to check; its decoder is bounded to the output's size and names a bad
  stream (every decoder of stored bytes is fuzzed), so nothing corrupt is decoded past its bounds.
- `decode_stored(codec_config, buffer, offsets, sample_shape, dtype)`: the streams of one buffer through
  the lossless stage, on the buffer's device (`Stage.decode_batch`): the stage's `DeviceDecoder` where it
  has one for that device (the entropy coder: CUDA and CPU; zstd: CUDA, through nvCOMP), else its host
  decoders, the result copied back to the device (blosc, LZ4, raw).
- `decode_batch(batch, lossless, spec)`: a `StoredBatch` -> (coefficients, side), what `Decompress`
  then takes: the stage's decode, the .npy headers a webdataset member holds checked, the coefficients
  and in-stream side values cut out, byte order, each sample's row picked. `decode_batch_deferred` is the
  same with its checks returned instead of run (nothing read back from the device until they are).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from dctdata.codec.spec import CodecSpec
from dctdata.decoder.wire import StoredBatch, StreamForm, stage_key
from dctdata.errors import DctDataError, IntegrityError
from dctdata.stages import get_stage
from dctdata.stages.base import Stage, Stream


def check_stream(codec: Stage, stream: Stream, decoded: int, where: str | Callable[[], str]) -> None:
    """Refuse a stream whose header does not declare exactly `decoded` bytes (a raw stream: is not that
    long), as its stage checks it (`Stage.check_stream`). `where` (or `where()`) names the stream."""
    codec.check_stream(stream, decoded, where)


def decode_stored(
    codec_config: Mapping[str, Any] | None,
    buffer: torch.Tensor,
    offsets: torch.Tensor,
    sample_shape: Sequence[int],
    dtype: str | np.dtype[Any],
    where: Callable[[int], str] | None = None,
) -> torch.Tensor:
    """(S, *sample_shape) of numpy `dtype` (as a tensor) from the S streams buffer[offsets[k]:offsets[k+1]]
    through the lossless stage `codec_config`, on `buffer`'s device. A stream that does not decode to
    exactly that raises IntegrityError naming `where(k)`."""
    name = (lambda k: f"stream {k}") if where is None else where
    return get_stage(codec_config).decode_batch(buffer, offsets, sample_shape, np.dtype(dtype), where=name)


def decode_batch(
    batch: StoredBatch, lossless: Mapping[str, Any] | None, spec: CodecSpec
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(coefficients (N, C, Hb, K, Wb) in the wire dtype, side (N, C, 2) or None) of a stored batch, on
    its device."""
    q, side, checks = decode_batch_deferred(batch, lossless, spec)
    for check in checks:
        check()
    return q, side


def decode_batch_deferred(
    batch: StoredBatch, lossless: Mapping[str, Any] | None, spec: CodecSpec
) -> tuple[torch.Tensor, torch.Tensor | None, list[Callable[[], None]]]:
    """`decode_batch` without reading anything back from the batch's device: (coefficients, side, checks), valid
    once every one of `checks` (functions of no argument that raise IntegrityError naming the sample) has
    returned. What `DecodeAhead` uses to queue several batches before waiting for any."""
    form = batch.form
    if form.stage != stage_key(lossless):
        raise DctDataError(
            f"field {form.field!r}: stored batch: expected streams of this decompressor's lossless stage "
            f"{dict(lossless or {}).get('id', 'none')!r}. Got another stage's (a batch of another field or pack?)"
        )
    if tuple(form.shape) != tuple(spec.coeff_shape):
        raise DctDataError(
            f"field {form.field!r}: stored batch: expected coefficients {tuple(spec.coeff_shape)}. Got {form.shape}"
        )
    where = _namer(batch)
    rows_check = _check_rows(batch)
    dtype = np.dtype(form.dtype).newbyteorder("<")
    stage = get_stage(lossless)
    if form.raw:
        q, verdict = stage.decode_batch_deferred(batch.data, batch.offsets, (form.rows, *form.shape), dtype, where)
        checks = [rows_check, verdict.check]
        side = None
    else:
        raw, verdict = stage.decode_batch_deferred(batch.data, batch.offsets, (form.decoded,), np.uint8, where)
        checks = [rows_check, verdict.check, _expected_check(raw, form, where)]
        q = _cut(raw, form.at, form.rows * form.sample_bytes, _torch_dtype(dtype))
        side = None
        if form.side_at is not None:
            sd = spec.decode_dtype  # the stored side values' dtype (float64 for a float64 decode)
            nbytes = spec.side_rows * 2 * sd.itemsize
            side = _cut(raw, form.side_at, nbytes, sd).reshape(-1, spec.side_rows, 2)
    if not form.little and dtype.itemsize > 1:  # a big-endian zarr array: swap each value's bytes
        q = q.contiguous().view(torch.uint8).reshape(*q.shape, dtype.itemsize).flip(-1).contiguous()
        q = q.view(_torch_dtype(dtype)).squeeze(-1)
    q = q.reshape(-1, *form.shape)
    if batch.rows is not None:  # clamped: a row out of range is named by rows_check, never read past the streams
        rows = batch.rows.to(q.device).clamp(0, max(len(q) - 1, 0))
        q = q.index_select(0, rows)
        side = None if side is None else side.index_select(0, rows)
    if q.dtype != spec.torch_dtype:  # bfloat16 coefficients are stored as their uint16 bits
        q = q.view(spec.torch_dtype)
    return q, batch.side if batch.side is not None else side, checks


def _check_rows(batch: StoredBatch) -> Callable[[], None]:
    """The batch's row table against its streams: one row per sample, each inside the streams' decoded rows,
    and every stream the row of some sample (an offsets table with an entry too many reads as an empty stream
    of no sample). What the host holds is checked now, raising `IntegrityError`; rows on an accelerator are
    tested there and read back when the returned check is called (rows past the streams are clamped before
    they are used, so nothing reads outside them meanwhile)."""
    form, n = batch.form, len(batch.indices)
    total = batch.streams * form.rows
    field = f"field {form.field!r} stored batch"
    if batch.rows is None:
        if total != n:
            raise IntegrityError(
                f"{field}: expected {n} decoded rows (one per sample {list(batch.indices)[:8]}): offsets of "
                f"{n // max(form.rows, 1)} streams of {form.rows} row(s) each. Got {batch.streams} streams "
                f"({len(batch.offsets)} offsets) holding {total} rows"
            )
        return lambda: None
    rows = batch.rows
    if rows.dim() != 1 or len(rows) != n or rows.dtype.is_floating_point or rows.dtype == torch.bool:
        raise IntegrityError(
            f"{field}: expected an integer row per sample ({n},). Got {tuple(rows.shape)} {rows.dtype} rows"
        )
    outside = (rows < 0) | (rows >= total)
    used = torch.zeros(max(batch.streams, 0), dtype=torch.bool, device=rows.device)
    inside = rows[~outside] if rows.device.type == "cpu" else rows.clamp(0, max(total - 1, 0))
    used.index_fill_(0, torch.div(inside, max(form.rows, 1), rounding_mode="floor"), True)

    def check() -> None:
        bad = outside.cpu()
        if bool(bad.any()):
            k = bad.nonzero().flatten().tolist()
            said = ", ".join(f"sample {batch.indices[j]} at row {int(rows[j])}" for j in k[:4])
            raise IntegrityError(
                f"{field}: expected each sample's row in [0, {total}) ({batch.streams} streams of {form.rows} "
                f"row(s)). Got {len(k)} outside: {said}"
            )
        idle = (~used.cpu()).nonzero().flatten().tolist()
        if idle:
            raise IntegrityError(
                f"{field}: expected every stream to hold a row of the batch's samples {list(batch.indices)[:8]}. "
                f"Got stream(s) {idle[:4]} of {batch.streams} holding none (an offsets table of "
                f"{len(batch.offsets)} entries with some too many?)"
            )

    if rows.device.type == "cpu":
        check()  # before any stream is decoded: an empty stream of no sample would be reported as damaged
    return check


def _torch_dtype(dtype: np.dtype[Any]) -> torch.dtype:
    return torch.from_numpy(np.zeros(0, dtype)).dtype


def _cut(raw: torch.Tensor, at: int, nbytes: int, dtype: torch.dtype) -> torch.Tensor:
    """Bytes [at, at + nbytes) of each decoded stream (rows of `raw`), viewed as `dtype`."""
    return raw[:, at : at + nbytes].contiguous().view(dtype)


def _expected_check(raw: torch.Tensor, form: StreamForm, where: Callable[[int], str]) -> Callable[[], None]:
    """A check that each decoded stream holds `form.expect`'s bytes (its .npy headers) at their offsets: the
    comparison is queued now, read when the check is called."""
    found = []
    for at, expected in form.expect:
        want = torch.frombuffer(bytearray(expected), dtype=torch.uint8).to(raw.device)
        found.append((at, expected, (raw[:, at : at + len(expected)] != want).any(1)))

    def check() -> None:
        for at, expected, bad in found:
            if bool(bad.any()):
                k = int(bad.nonzero()[0, 0])
                raise IntegrityError(
                    f"{where(k)}: expected the .npy header {expected[:60]!r}... of {form.dtype} {form.shape} at "
                    f"byte {at} of its decoded member. Got other bytes"
                )

    return check


def _namer(batch: StoredBatch) -> Callable[[int], str]:
    """Stream k's description for messages: its field and samples."""

    def where(k: int) -> str:
        if batch.rows is None:
            samples = [batch.indices[k]]
        else:
            rows = batch.rows.tolist()
            lo, hi = k * batch.form.rows, (k + 1) * batch.form.rows
            samples = [i for i, r in zip(batch.indices, rows) if lo <= r < hi]
        if not samples:  # a stream no sample of the batch reads (`_check_rows` names the table)
            return f"field {batch.form.field!r} stream {k} of {batch.streams} (no sample's row)"
        said = f"sample {samples[0]}" if len(samples) == 1 else f"samples {samples}"
        return f"field {batch.form.field!r} {said}"

    return where
