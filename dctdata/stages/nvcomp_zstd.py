"""zstd on the GPU with nvCOMP: the zstd stage's device decoder (what its `device_decoder()` hook returns).

`device_decoder(device)` gives the function the readers' `decode="device"` path calls with one batch's
streams. Underneath, `decode_batch(buffer, offsets, sample_shape, dtype)` decodes a collated batch (one uint8
CUDA buffer, (N+1) offsets) of standard zstd streams, one sample each, in one nvCOMP call, into an
(N, *sample_shape) tensor on the buffer's device, and returns it with a `DecodeStatus`. Needs the `gpu` extra
(`pip install 'dctdata[gpu]'`: nvidia-nvcomp-cu13, which brings nvidia-libnvcomp-cu13; a CUDA 12 build of
torch takes nvidia-nvcomp-cu12 instead); without it every entry point raises `MissingExtraError` naming the
extra.

Why nvCOMP: it is NVIDIA's maintained GPU codec library and decodes standard zstd frames bit-exactly
(`BitstreamKind.RAW`), so packs need no new format. What it cannot do, and how this module copes:
- Its decoder is undefined on invalid input (nvcomp/zstd.h; no error is guaranteed). Only checked bytes may
  reach it: the readers verify crc32c and declared sizes in the workers, and `zstd_frames.frame_table` walks
  each stream's frame and block headers and checks the declared sizes add up to the sample (also in the
  workers, on the host). `DecodeStatus` then compares the sizes nvCOMP reports with the declared ones: a
  last check, not a defence against hostile bytes.
- Each call has a fixed cost of milliseconds whatever its size (issue 28), so one call per loader batch of
  32 caps a loader far below the CPU path.
  `ZstdBatches` merges several batches' streams into one call, and `dctdata.loaders.decode_ahead.DecodeAhead`
  drives it with the next group's call queued before this group's batches are handed out.
- Input, output and temporary buffers must be 8-byte aligned (`nvcompZstdRequiredDecompressionAlignment`):
  streams at other offsets are copied to aligned ones on the device first (collate with
  `zstd_frames.aligned_offsets` to avoid it), and outputs that would start unaligned are decoded into a
  padded buffer and compacted.
- One zstd frame is one unit of its parallel work: a large sample stored as one frame decodes serially;
  `zstd_frames.encode_frames` writes it as several (whether that pays is measured by benchmarks/gpu_layer.py).
There is no CPU fallback in nvCOMP for zstd: off CUDA, decode with the zstd stage's CPU decoder.
"""

from __future__ import annotations

import importlib
import logging
import math
from collections import OrderedDict
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt
import torch

from dctdata.errors import DctDataError, IntegrityError, MissingExtraError
from dctdata.stages.zstd_frames import FrameTable, Offsets, _offsets, aligned_offsets

log = logging.getLogger(__name__)

INSTALL = "pip install 'dctdata[gpu]'"
ALIGNMENT = 8  # nvcomp/zstd.h nvcompZstdRequiredDecompressionAlignment: input, output and temporary buffers
DEVICE_TYPES = ("cuda",)  # devices nvCOMP decodes on
CONFIGS_PER_DECODER = 16  # decompression configs kept per codec (one per distinct list of frame sizes)


def nvcomp() -> ModuleType:
    """The `nvidia.nvcomp` module; a MissingExtraError naming the `gpu` extra where it is not installed."""
    try:
        return importlib.import_module("nvidia.nvcomp")
    except ImportError as exc:
        raise MissingExtraError(
            f"zstd on the GPU needs nvCOMP: {INSTALL} (installs nvidia-nvcomp-cu13; with a CUDA 12 build of torch, "
            f"pip install nvidia-nvcomp-cu12). Importing nvidia.nvcomp failed: {exc}"
        ) from exc


def available() -> bool:
    """True when nvCOMP imports (a CUDA device is a separate condition)."""
    try:
        nvcomp()
    except MissingExtraError:
        return False
    return True


class DecodeStatus:
    """What nvCOMP reported for a call: the decoded size of every frame, compared with its declared size.
    Reading it waits for the decode (a stream synchronization), so it is read when first asked."""

    def __init__(
        self, actual: Callable[[], Sequence[int]], expected: npt.NDArray[Any], samples: npt.NDArray[Any]
    ) -> None:
        self._actual = actual
        self.expected = np.asarray(expected, dtype=np.int64)
        self.samples = np.asarray(samples, dtype=np.int64)
        self._sizes: npt.NDArray[Any] | None = None

    @property
    def sizes(self) -> npt.NDArray[Any]:
        """Decoded bytes per frame, as nvCOMP reported them (waits for the decode)."""
        if self._sizes is None:
            self._sizes = np.asarray(list(self._actual()), dtype=np.int64).reshape(-1)
            if len(self._sizes) != len(self.expected):
                raise DctDataError(
                    f"nvCOMP: expected sizes of {len(self.expected)} frames. Got {len(self._sizes)} (a different "
                    "nvidia-nvcomp release?)"
                )
        return self._sizes

    def failed(self) -> list[int]:
        """The samples with a frame that did not decode to its declared size."""
        return sorted(set(self.samples[self.sizes != self.expected].tolist()))

    def check(self, where: str = "batch", name: Callable[[int], str] | None = None) -> None:
        """Raise an IntegrityError naming the failed samples (`name(i)`, default "sample i") under `where`."""
        bad = self.failed()
        if not bad:
            return
        name = name or (lambda i: f"sample {i}")
        got = {i: int(self.sizes[self.samples == i].sum()) for i in bad[:8]}
        want = {i: int(self.expected[self.samples == i].sum()) for i in bad[:8]}
        listed = ", ".join(f"{name(i)} ({got[i]} of {want[i]} bytes)" for i in bad[:8])
        more = f" and {len(bad) - 8} more" if len(bad) > 8 else ""
        raise IntegrityError(
            f"{where}: expected nvCOMP to decode every zstd frame to its declared size. Got short or long frames "
            f"in {listed}{more}"
        )


class _Decoder:
    """One nvCOMP zstd codec bound to one device and stream, with its reusable decompression configs (building
    one reads the frame headers back from the device: a synchronization, paid once per list of frame sizes)."""

    def __init__(self, module: ModuleType, device: torch.device, stream: int) -> None:
        self.nv = module
        self.stream = stream
        self.codec = module.Codec(
            algorithm="Zstd", device_id=device.index or 0, cuda_stream=stream, bitstream_kind=module.BitstreamKind.RAW
        )
        self.configs: OrderedDict[bytes, object] = OrderedDict()
        self.into_out = True  # decode straight into our buffer (decode(out=...)); off if this nvCOMP refuses it

    def config(self, srcs: Any, sizes: npt.NDArray[Any]) -> object:  # nvCOMP's arrays and config
        key = sizes.tobytes()
        cfg = self.configs.get(key)
        if cfg is None:
            cfg = self.codec.decompression_config(srcs)
            if len(self.configs) >= CONFIGS_PER_DECODER:
                self.configs.popitem(last=False)
            self.configs[key] = cfg
        else:
            self.configs.move_to_end(key)
        return cfg

    def decode(
        self,
        data: torch.Tensor,
        starts: npt.NDArray[Any],
        in_sizes: npt.NDArray[Any],
        buf: torch.Tensor,
        out_starts: npt.NDArray[Any],
        sizes: npt.NDArray[Any],
    ) -> Callable[[], Sequence[int]]:
        """Queue the decode of frames data[starts[f] : +in_sizes[f]] into buf[out_starts[f] : +sizes[f]]; returns
        the function that reads the decoded sizes (waiting for the decode)."""
        nv = self.nv
        srcs = nv.as_arrays(data, starts.tolist(), in_sizes.tolist(), cuda_stream=self.stream)
        cfg = self.config(srcs, sizes)
        if self.into_out:
            dsts = nv.as_arrays(buf, out_starts.tolist(), sizes.tolist(), cuda_stream=self.stream)
            try:
                result = self.codec.decode(srcs, out=dsts, decompression_config=cfg)
            except TypeError as exc:  # an nvCOMP without the `out=` batch overload: copy from its outputs
                log.warning("nvCOMP decode(out=...) refused (%s); copying from nvCOMP's own outputs instead", exc)
                self.into_out = False
            else:
                return lambda: result.buffer_sizes
        result = self.codec.decode(srcs, data_type="|u1", decompression_config=cfg)
        sizes_out = list(result.buffer_sizes)
        for f, (start, size) in enumerate(zip(out_starts.tolist(), sizes_out)):
            n = min(int(size), int(sizes[f]))
            if n:
                buf[start : start + n].copy_(torch.from_dlpack(result[f])[:n])
        return lambda: sizes_out


_DECODERS: dict[tuple[int, int], _Decoder] = {}


def _decoder(device: torch.device) -> _Decoder:
    """The codec for `device` and its current stream (nvCOMP binds a codec to a stream at construction)."""
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    key = (device.index or 0, stream)
    decoder = _DECODERS.get(key)
    if decoder is None:
        try:
            decoder = _DECODERS[key] = _Decoder(nvcomp(), device, stream)
        except MissingExtraError:
            raise
        except Exception as exc:  # driver/runtime mismatches surface here
            why = f"{type(exc).__name__}: {exc}"
            raise DctDataError(f"nvCOMP: could not create a zstd codec on {device}: {why}") from exc
    return decoder


def decode_frames(
    data: torch.Tensor, table: FrameTable, out: torch.Tensor | None = None
) -> tuple[torch.Tensor, DecodeStatus]:
    """Decode the frames of `table` (byte ranges of `data`, a contiguous uint8 CUDA buffer) in one nvCOMP call into
    one uint8 tensor of their contents back to back (`out` when given). Returns (bytes, DecodeStatus).

    The frames must have been checked on the host (`zstd_frames.frame_table`): nvCOMP is undefined on others."""
    nvcomp()  # MissingExtraError first
    if not isinstance(data, torch.Tensor) or data.dtype != torch.uint8 or data.dim() != 1 or not data.is_contiguous():
        raise TypeError(f"buffer: expected a contiguous 1-D uint8 torch.Tensor. Got {_describe(data)}")
    if data.device.type not in DEVICE_TYPES:
        raise DctDataError(
            f"buffer: expected a CUDA tensor (nvCOMP decodes on the GPU; decode on the CPU with the zstd stage's "
            f"CPU decoder). Got one on {data.device}"
        )
    starts, ends, sizes = (np.asarray(t, dtype=np.int64) for t in table[:3])
    if not (len(starts) == len(ends) == len(sizes) == len(table.samples)):
        raise DctDataError("frames: expected starts, ends, sizes and samples of one length")
    if len(starts) and (starts.min() < 0 or ends.max() > data.numel() or (ends < starts).any() or sizes.min() < 1):
        raise DctDataError(
            f"frames: expected byte ranges within the buffer's {data.numel()} bytes and at least 1 decoded byte "
            "per frame"
        )
    dense = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    total = int(dense[-1])
    if out is not None and (
        not isinstance(out, torch.Tensor) or out.dtype != torch.uint8 or out.numel() != total
        or not out.is_contiguous() or out.device != data.device
    ):  # fmt: skip
        raise DctDataError(
            f"out: expected a contiguous uint8 tensor of {total} bytes on {data.device}. Got {_describe(out)}"
        )
    if len(starts) == 0:
        return (out if out is not None else data.new_empty(0)), DecodeStatus(lambda: [], sizes, table.samples)
    in_sizes = ends - starts
    if data.data_ptr() % ALIGNMENT or (starts % ALIGNMENT).any():
        data, starts = _realigned(data, starts, in_sizes)
    aligned = bool((dense[:-1] % ALIGNMENT == 0).all())
    out_starts = dense[:-1] if aligned else aligned_offsets(sizes, ALIGNMENT)[:-1]
    if aligned:
        buf = out if out is not None else torch.empty(total, dtype=torch.uint8, device=data.device)
    else:
        buf = torch.empty(int(out_starts[-1] + sizes[-1]), dtype=torch.uint8, device=data.device)
    if buf.data_ptr() % ALIGNMENT:
        raise DctDataError(f"out: expected an {ALIGNMENT}-byte aligned buffer for nvCOMP. Got address {buf.data_ptr()}")
    decoder = _decoder(data.device)
    try:
        actual = decoder.decode(data, starts, in_sizes, buf, out_starts, sizes)
    except (DctDataError, TypeError):
        raise
    except Exception as exc:  # nvCOMP reports launch and size problems as RuntimeError/ValueError
        raise DctDataError(f"nvCOMP zstd decode of {len(starts)} frames failed: {type(exc).__name__}: {exc}") from exc
    if not aligned:
        packed = _compacted(buf, out_starts, sizes, total)
        buf = packed if out is None else out.copy_(packed)
    return buf, DecodeStatus(actual, sizes, table.samples)


def decode_batch(
    buffer: torch.Tensor,
    offsets: Offsets,
    sample_shape: Sequence[int],
    dtype: torch.dtype,
    frames: FrameTable | None = None,
) -> tuple[torch.Tensor, DecodeStatus]:
    """Decode a collated batch: sample i is the zstd stream buffer[offsets[i] : offsets[i+1]] and decodes to one
    `sample_shape` array of `dtype` (C order, the zstd stage's raw bytes). Returns ((N, *sample_shape) tensor on
    the buffer's device, DecodeStatus); call `status.check()` (it waits for the decode) before trusting the
    values. `frames` (from `zstd_frames.frame_table`, in the workers) lists the frames of each sample (several,
    or streams placed with padding between them); without it each stream is one frame spanning its offsets.
    Offsets stay on the host (a CUDA tensor of them costs a synchronization). Streams at offsets that are not
    multiples of ALIGNMENT are first copied to aligned ones on the device."""
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype: expected a torch.dtype. Got {dtype!r}")
    shape = tuple(int(s) for s in sample_shape)
    if not shape or min(shape) < 1:
        raise DctDataError(f"sample_shape: expected positive sizes. Got {tuple(sample_shape)}")
    sample_bytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    off = _offsets(offsets)
    n = len(off) - 1
    table = FrameTable.one_per_sample(off, sample_bytes) if frames is None else frames
    samples = np.asarray(table.samples, dtype=np.int64)
    if len(samples) and (samples.min() < 0 or samples.max() >= n or (np.diff(samples) < 0).any()):
        raise DctDataError(f"frames: expected the frames of samples 0..{n - 1} in order")
    per_sample = np.bincount(samples, weights=np.asarray(table.sizes, dtype=np.float64), minlength=n)
    if (per_sample != sample_bytes).any():
        i = int(np.flatnonzero(per_sample != sample_bytes)[0])
        got = int(per_sample[i])
        raise DctDataError(f"frames: sample {i}: expected frames declaring {sample_bytes} bytes. Got {got}")
    flat, status = decode_frames(buffer, table)
    return flat.view(dtype).view(n, *shape), status


def device_decoder(device: torch.device | str) -> Callable[..., torch.Tensor] | None:
    """What the zstd stage's `device_decoder(device)` hook returns (`dctdata.decoder.stored.decode_stored` calls it for
    `decode="device"`): on CUDA, `decode(buffer, offsets, sample_shape, dtype, where=None)` -> the
    (S, *sample_shape) tensor of the S streams, decoded by nvCOMP and checked (an IntegrityError names
    `where(k)`, default "stream k", of a stream that decoded short or long); None on other devices, where the
    CPU decoder runs. On CUDA without nvCOMP: MissingExtraError naming the `gpu` extra."""
    if torch.device(device).type not in DEVICE_TYPES:
        return None
    nvcomp()
    return _decode_streams


def _decode_streams(
    buffer: torch.Tensor,
    offsets: Offsets,
    sample_shape: Sequence[int],
    dtype: torch.dtype | npt.DTypeLike,
    where: Callable[[int], str] | None = None,
) -> torch.Tensor:
    if not isinstance(dtype, torch.dtype):
        dtype = torch.from_numpy(np.zeros(0, np.dtype(dtype))).dtype  # numpy's (little-endian) dtype
    values, status = decode_batch(buffer, offsets, sample_shape, dtype)
    status.check("zstd device decode (nvCOMP)", where or (lambda k: f"stream {k}"))
    return values


class Streams(NamedTuple):
    """One loader batch of one field's stored streams: `data` (uint8, collated), `offsets` ((N+1), on the host) and
    optionally the `frames` of its samples (`zstd_frames.frame_table`); what `ZstdBatches` merges."""

    data: torch.Tensor
    offsets: Offsets
    frames: FrameTable | None = None


class _Pending(NamedTuple):
    values: torch.Tensor
    status: DecodeStatus
    counts: list[int]
    first: int
    done: torch.cuda.Event | None  # the CUDA event recorded after the decode on the side stream, or None off CUDA


class ZstdBatches:
    """Decodes the streams of several loader batches in one nvCOMP call (`start`) and hands the decoded samples
    back batch by batch (`finish`, which checks the status): the group decoder `DecodeAhead` drives.

    On CUDA the decode runs on a side stream of its own, after the work queued so far on the current stream (the
    batches' copies), so it can overlap the model's work on the group before; `finish` makes the current stream
    wait for it. `decode` is `decode_batch` (tests pass a CPU stand-in); `device` is where merged host buffers
    go."""

    def __init__(
        self,
        sample_shape: Sequence[int],
        dtype: torch.dtype,
        device: torch.device | str | None = None,
        decode: Callable[..., tuple[torch.Tensor, DecodeStatus]] = decode_batch,
    ) -> None:
        self.sample_shape = tuple(int(s) for s in sample_shape)
        self.dtype = dtype
        self.device = None if device is None else torch.device(device)
        self.decode = decode
        self.sample_bytes = math.prod(self.sample_shape) * torch.empty((), dtype=dtype).element_size()
        self._streams: dict[torch.device, torch.cuda.Stream] = {}

    def start(self, batches: Sequence[Streams], first: int = 0) -> _Pending:
        """Queue one decode of `batches` (numbered from `first` in errors)."""
        data, offsets, frames, counts = merge(batches, self.sample_bytes)
        if self.device is not None and data.device != self.device:
            data = data.to(self.device, non_blocking=True)
        if data.device.type != "cuda":
            values, status = self.decode(data, offsets, self.sample_shape, self.dtype, frames)
            return _Pending(values, status, counts, first, None)
        side = self._streams.get(data.device)
        if side is None:
            side = self._streams[data.device] = torch.cuda.Stream(data.device)
        side.wait_stream(torch.cuda.current_stream(data.device))  # the batches' bytes are there
        with torch.cuda.stream(side):
            values, status = self.decode(data, offsets, self.sample_shape, self.dtype, frames)
            done = torch.cuda.Event()
            done.record(side)
        data.record_stream(side)  # allocated on the current stream, read on the side one
        return _Pending(values, status, counts, first, done)

    def finish(self, pending: _Pending) -> list[torch.Tensor]:
        """The decoded samples of each batch of `pending`, after checking nvCOMP's status (waits for the decode)."""
        if pending.done is not None:
            pending.done.synchronize()
            current = torch.cuda.current_stream(pending.values.device)
            current.wait_event(pending.done)
            pending.values.record_stream(current)  # allocated on the side stream, used on the current one
        bounds = np.concatenate([[0], np.cumsum(pending.counts)])

        def name(i: int) -> str:
            j = int(np.searchsorted(bounds, i, side="right")) - 1
            return f"batch {pending.first + j} sample {i - int(bounds[j])}"

        pending.status.check("zstd device decode", name)
        return list(torch.split(pending.values, pending.counts))


def merge(
    batches: Sequence[Streams], sample_bytes: int
) -> tuple[torch.Tensor, npt.NDArray[Any], FrameTable, list[int]]:
    """One buffer, offsets and frame table for several batches' streams, and the sample count of each batch. Each
    batch's bytes start at a multiple of ALIGNMENT (zero padding between batches), so the frame table, not the
    offsets (sample i starts at offsets[i]; the last entry is the buffer's end), says where streams end."""
    if not batches:
        raise DctDataError("batches: expected at least one batch to decode")
    parts, offsets, tables, counts = [], [], [], []
    byte_base = sample_base = 0
    for s in batches:
        if not isinstance(s, Streams):
            raise TypeError(f"batches: expected dctdata.stages.nvcomp_zstd.Streams. Got {type(s).__name__}")
        off = _offsets(s.offsets)
        n = len(off) - 1
        if off[-1] > s.data.numel():
            raise DctDataError(f"batch: expected offsets within its {s.data.numel()} bytes. Got {off[-1]}")
        table = FrameTable.one_per_sample(off, sample_bytes) if s.frames is None else s.frames
        tables.append(
            FrameTable(table.starts + byte_base, table.ends + byte_base, table.sizes, table.samples + sample_base)
        )
        offsets.append(off[:-1] + byte_base)
        pad = -s.data.numel() % ALIGNMENT
        parts.append(s.data)
        if pad:
            parts.append(s.data.new_zeros(pad))
        byte_base += s.data.numel() + pad
        sample_base += n
        counts.append(n)
    data = parts[0] if len(parts) == 1 else torch.cat(parts)
    merged = FrameTable(*(np.concatenate([getattr(t, f) for t in tables]) for f in FrameTable._fields))
    offsets.append(np.array([byte_base], np.int64))
    return data, np.concatenate(offsets), merged, counts


def _realigned(
    data: torch.Tensor, starts: npt.NDArray[Any], sizes: npt.NDArray[Any]
) -> tuple[torch.Tensor, npt.NDArray[Any]]:
    """The frames copied on the device to a fresh buffer where each starts at a multiple of ALIGNMENT."""
    new_starts = aligned_offsets(sizes, ALIGNMENT)
    total = int(sizes.sum())
    dev = data.device
    counts = torch.as_tensor(sizes, device=dev)
    dense = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    pos = torch.arange(total, device=dev)
    src = pos + torch.repeat_interleave(torch.as_tensor(starts - dense, device=dev), counts, output_size=total)
    dst = pos + torch.repeat_interleave(torch.as_tensor(new_starts[:-1] - dense, device=dev), counts, output_size=total)
    out = torch.zeros(max(int(new_starts[-1]), 1), dtype=torch.uint8, device=dev)
    out[dst] = data[src]
    return out, new_starts[:-1]


def _compacted(buf: torch.Tensor, out_starts: npt.NDArray[Any], sizes: npt.NDArray[Any], total: int) -> torch.Tensor:
    """Frames decoded at aligned offsets of `buf`, packed back to back (one gather on the device)."""
    dev = buf.device
    dense = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    shift = torch.as_tensor(out_starts - dense, device=dev)
    pos = torch.arange(total, device=dev)
    return buf[pos + torch.repeat_interleave(shift, torch.as_tensor(sizes, device=dev), output_size=total)]


def use_torch_allocator(enabled: bool = True) -> None:
    """Route nvCOMP's device allocations (temporary buffers) through torch's caching allocator, or back to
    nvCOMP's own (`enabled=False`). For measuring whether allocation is part of nvCOMP's fixed cost per call
    (benchmarks/gpu_layer.py); process-wide."""
    nvcomp().set_device_allocator(_TorchBlock if enabled else None)


class _TorchBlock:
    """A device allocation for nvCOMP from torch's caching allocator, on the stream nvCOMP asked for (freed
    blocks are reused in that stream's order)."""

    __slots__ = ("ptr", "tensor")

    def __init__(self, nbytes: int, stream: Any) -> None:  # nvCOMP's stream
        device = torch.device("cuda", stream.device)
        ts = torch.cuda.default_stream(device) if stream.is_special else torch.cuda.ExternalStream(stream.ptr, device)
        with torch.cuda.stream(ts):
            self.tensor = torch.empty(max(1, int(nbytes)), dtype=torch.uint8, device=device)
        self.ptr = self.tensor.data_ptr()


def _describe(t: object) -> str:
    if isinstance(t, torch.Tensor):
        return f"{t.dtype} tensor of shape {tuple(t.shape)} on {t.device}"
    return type(t).__name__
