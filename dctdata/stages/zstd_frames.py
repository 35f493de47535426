"""Standard zstd streams as frames: write a sample as several frames, walk and check a stream's frames, and the
frame table a batched GPU decoder takes (`dctdata.stages.nvcomp_zstd`).

Why: nvCOMP decodes a batch of independent zstd frames in parallel, one frame per unit of work, so one large
sample stored as one frame decodes serially, and several frames per sample (each declaring its size) can
spread it (`benchmarks/gpu_layer.py` measures whether that pays). A stream of concatenated frames is still
standard zstd: `zstd -d` and python-zstandard's stream reader decode it to the concatenated contents.

Why by hand: neither python-zstandard (its one-shot decompress stops after the first frame and
`read_across_frames` is not implemented) nor numcodecs lists a stream's frames with their byte ranges, and
nvCOMP's zstd decoder is undefined on invalid input: only streams whose structure was checked here (frame
headers, block headers inside the stream, declared content sizes adding up to the expected bytes) and whose
bytes were checked by the readers (crc32c, declared sizes) may reach it. The walk reads headers only (one
3-byte header per block of at most 128 KiB); it does not prove the compressed blocks decode.

Format: RFC 8878, section 3.1.1 (frame header: magic 0xFD2FB528, descriptor, window, dictionary id, content
size; blocks: 3-byte little-endian header = last flag, type, size; optional 4-byte checksum).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, TypeAlias

import numpy as np
import numpy.typing as npt

from dctdata.errors import DctDataError, IntegrityError
from dctdata.stages.base import Stream, byte_view

if TYPE_CHECKING:
    import torch

# A batch's (N+1) stream offsets: a list, a numpy array or a CPU tensor.
Offsets: TypeAlias = "Sequence[int] | npt.NDArray[Any] | torch.Tensor"

MAGIC = 0xFD2FB528
BLOCK_MAX = 128 << 10  # RFC 8878 Block_Maximum_Size: no block regenerates or stores more
FRAME_BYTES = 64 << 10  # nvCOMP's zstd header encourages 64 KiB chunks
RAW, RLE, COMPRESSED, RESERVED = 0, 1, 2, 3


class Frame(NamedTuple):
    """One frame of a stream: bytes [start, end) of it, decoding to `size` bytes."""

    start: int
    end: int
    size: int


def walk(stream: Stream, where: str = "stream") -> list[Frame]:
    """The frames of a zstd stream, checked: each starts with the zstd magic, declares its content size, uses no
    dictionary and no reserved bits, has well-formed block headers whose blocks lie inside it, and the frames
    cover the stream exactly. Anything else is an IntegrityError naming `where` and the byte offset."""
    data = byte_view(stream)
    if len(data) == 0:
        raise IntegrityError(f"{where}: expected zstd frames. Got 0 bytes")
    frames = [_frame(data, 0, where)]
    while frames[-1].end < len(data):
        frames.append(_frame(data, frames[-1].end, where))
    return frames


def _frame(data: memoryview, start: int, where: str) -> Frame:
    """The frame that starts at byte `start` of `data`, checked (see `walk`)."""
    n = len(data)

    def bad(what: str) -> IntegrityError:
        return IntegrityError(f"{where}: byte {start}: expected a zstd frame. Got {what}")

    if n - start < 6:
        raise bad(f"{n - start} trailing bytes")
    magic = int.from_bytes(data[start : start + 4], "little")
    if magic != MAGIC:
        raise bad(f"magic 0x{magic:08X} (skippable frames and other formats are not written by dctdata)")
    fhd = data[start + 4]
    fcs_flag, single, checksum = fhd >> 6, (fhd >> 5) & 1, (fhd >> 2) & 1
    if (fhd >> 3) & 1:
        raise bad("the reserved bit of the frame header descriptor set")
    if fhd & 3:
        raise bad("a dictionary id (dictionaries are not supported)")
    fcs_width = (1 if single else 0, 2, 4, 8)[fcs_flag]
    if fcs_width == 0:
        raise bad("no declared content size (write frames with write_content_size=True)")
    at = start + 5 + (0 if single else 1)
    if at + fcs_width > n:
        raise bad("a truncated frame header")
    size = int.from_bytes(data[at : at + fcs_width], "little") + (256 if fcs_width == 2 else 0)
    at += fcs_width
    blocks, stored_limit, last = 0, 0, 0
    while not last:
        if at + 3 > n:
            raise bad(f"a block header past the end ({n} bytes)")
        header = int.from_bytes(data[at : at + 3], "little")
        last, kind, block = header & 1, (header >> 1) & 3, header >> 3
        if kind == RESERVED:
            raise bad(f"a reserved block type at byte {at}")
        if block > BLOCK_MAX:
            raise bad(f"a block of {block} bytes at byte {at} (at most {BLOCK_MAX})")
        at += 3 + (1 if kind == RLE else block)
        if at > n:
            raise bad(f"a block past the end ({n} bytes)")
        blocks += 1
        stored_limit += BLOCK_MAX if kind == COMPRESSED else block
    if size > stored_limit:
        raise bad(f"a declared content size of {size} bytes that its {blocks} blocks cannot hold")
    at += 4 * checksum
    if at > n:
        raise bad(f"a truncated checksum ({n} bytes)")
    return Frame(start, at, size)


class FrameTable(NamedTuple):
    """The frames of a batch of streams collated into one buffer: frame f is bytes [starts[f], ends[f]) of the
    buffer, decodes to sizes[f] bytes and belongs to sample samples[f] (frames of a sample are consecutive, in
    order). int64 numpy arrays."""

    starts: npt.NDArray[Any]
    ends: npt.NDArray[Any]
    sizes: npt.NDArray[Any]
    samples: npt.NDArray[Any]

    @classmethod
    def one_per_sample(cls, offsets: Offsets, sample_bytes: int) -> FrameTable:
        """The table of streams that are one frame each (what the zstd stage writes today), from the buffer's
        (N+1) offsets; it trusts the offsets (check streams with `frame_table` before they reach a decoder)."""
        off = _offsets(offsets)
        n = len(off) - 1
        return cls(off[:-1].copy(), off[1:].copy(), np.full(n, sample_bytes, np.int64), np.arange(n, dtype=np.int64))

    def __len__(self) -> int:  # frames
        return len(self.starts)


def frame_table(buffer: Stream, offsets: Offsets, sample_bytes: int, where: str = "batch") -> FrameTable:
    """Walk and check every sample's stream in `buffer` (bytes [offsets[i], offsets[i+1]) for sample i): its frames
    must declare `sample_bytes` in total. Runs on the host, before the bytes reach a device decoder (a DataLoader
    worker, beside the readers' checksums). An IntegrityError names the sample."""
    data = byte_view(buffer)
    off = _offsets(offsets)
    if off[0] < 0 or off[-1] > len(data):
        raise DctDataError(f"{where}: expected offsets within the buffer's {len(data)} bytes. Got {off[0]}..{off[-1]}")
    starts, ends, sizes, samples = [], [], [], []
    for i in range(len(off) - 1):
        frames = walk(data[off[i] : off[i + 1]], f"{where}: sample {i}")
        total = sum(f.size for f in frames)
        if total != sample_bytes:
            raise IntegrityError(
                f"{where}: sample {i}: expected zstd frames declaring {sample_bytes} bytes. Got {total} in "
                f"{len(frames)} frame(s)"
            )
        for f in frames:
            starts.append(off[i] + f.start)
            ends.append(off[i] + f.end)
            sizes.append(f.size)
            samples.append(i)
    return FrameTable(*(np.asarray(x, dtype=np.int64) for x in (starts, ends, sizes, samples)))


def _offsets(offsets: Offsets) -> npt.NDArray[Any]:
    """(N+1) non-decreasing int64 offsets from a list, numpy array or CPU tensor."""
    if hasattr(offsets, "detach"):
        offsets = offsets.detach().cpu().numpy()
    off = np.asarray(offsets)
    if off.ndim != 1 or len(off) < 1 or not np.issubdtype(off.dtype, np.integer):
        raise DctDataError(f"offsets: expected N+1 integer offsets. Got {off.dtype} of shape {off.shape}")
    off = off.astype(np.int64)
    if (np.diff(off) < 0).any():
        raise DctDataError("offsets: expected non-decreasing offsets")
    return off


def encode_frames(raw: Stream, level: int, frame_bytes: int = FRAME_BYTES) -> bytes:
    """`raw` as consecutive zstd frames of `frame_bytes` of content each (the last one shorter), each declaring
    its size: one standard zstd stream whose frames a batched GPU decoder takes as independent units."""
    import zstandard

    if not isinstance(frame_bytes, int) or isinstance(frame_bytes, bool) or frame_bytes < 1:
        raise DctDataError(f"frame_bytes: expected a positive int. Got {frame_bytes!r}")
    data = byte_view(raw)
    compressor = zstandard.ZstdCompressor(level=level, write_content_size=True)
    if len(data) == 0:
        return compressor.compress(b"")
    return b"".join(compressor.compress(data[i : i + frame_bytes]) for i in range(0, len(data), frame_bytes))


def decode_frames(stream: Stream, size: int, where: str = "stream") -> npt.NDArray[Any]:
    """The `size` bytes of a checked stream of one or more frames (`walk`), decoded on the CPU into one array:
    each frame into its slice, never more than it declares."""
    import zstandard

    frames = walk(stream, where)
    total = sum(f.size for f in frames)
    if total != size:
        raise IntegrityError(f"{where}: expected zstd frames declaring {size} bytes. Got {total}")
    data = byte_view(stream)
    out = np.empty(size, np.uint8)
    dctx = zstandard.ZstdDecompressor()
    at = 0
    for f in frames:
        try:
            part = dctx.decompress(data[f.start : f.end], max_output_size=f.size, allow_extra_data=False)
        except zstandard.ZstdError as exc:
            raise IntegrityError(f"{where}: byte {f.start}: expected a decodable zstd frame. Got {exc}") from exc
        if len(part) != f.size:
            raise IntegrityError(f"{where}: byte {f.start}: expected {f.size} decoded bytes. Got {len(part)}")
        out[at : at + f.size] = np.frombuffer(part, np.uint8)
        at += f.size
    return out


def aligned_offsets(sizes: Sequence[int] | npt.NDArray[Any], alignment: int) -> npt.NDArray[Any]:
    """(N+1) offsets that place consecutive pieces of `sizes` bytes at multiples of `alignment` (a collated
    buffer that needs no realignment before nvCOMP: see `nvcomp_zstd.ALIGNMENT`)."""
    padded = -(-np.asarray(sizes, dtype=np.int64) // alignment) * alignment
    offsets: npt.NDArray[Any] = np.concatenate([[0], np.cumsum(padded)]).astype(np.int64)
    return offsets
