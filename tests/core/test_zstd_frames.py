"""zstd streams as frames (dctdata.stages.zstd_frames): several frames per sample, the checked walk over frame and block
headers that guards nvCOMP's decoder, the batch frame table, the multi-frame CPU decode, and fuzzed streams."""

import io
import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dctdata.errors import DctDataError, IntegrityError
from dctdata.stages.zstd_frames import (
    BLOCK_MAX,
    MAGIC,
    Frame,
    FrameTable,
    aligned_offsets,
    decode_frames,
    encode_frames,
    frame_table,
    walk,
)

zstandard = pytest.importorskip("zstandard")


def coefficients(n: int, seed: int = 0) -> bytes:
    """int8 Laplacian values, like quantized DCT coefficients."""
    return np.random.default_rng(seed).laplace(0, 6, n).clip(-127, 127).astype(np.int8).tobytes()


@pytest.mark.parametrize("n, frame_bytes", [(300_000, 65_536), (65_536, 65_536), (10, 4), (1, 1 << 20)])
def test_encode_frames_writes_standard_frames_of_the_asked_size(n, frame_bytes):
    raw = coefficients(n)
    stream = encode_frames(raw, 19, frame_bytes)
    frames = walk(stream)
    assert [f.size for f in frames] == [min(frame_bytes, n - i) for i in range(0, n, frame_bytes)]
    assert frames[0].start == 0 and frames[-1].end == len(stream)
    assert all(a.end == b.start for a, b in itertools.pairwise(frames))
    assert decode_frames(stream, n).tobytes() == raw
    # a standard zstd stream: the reference library's stream reader decodes the concatenated frames
    reader = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(stream), read_across_frames=True)
    assert reader.read() == raw


@pytest.mark.parametrize(
    "stream, size",
    [
        (zstandard.ZstdCompressor(level=19).compress(coefficients(200_000)), 200_000),  # compressed blocks
        (zstandard.ZstdCompressor(level=3).compress(bytes(1_000_000)), 1_000_000),  # RLE-heavy
        (zstandard.ZstdCompressor(level=1).compress(np.random.default_rng(1).bytes(300_000)), 300_000),  # raw blocks
        (zstandard.ZstdCompressor(level=3, write_checksum=True).compress(b"abc" * 1000), 3000),  # checksum
        (zstandard.ZstdCompressor(level=3).compress(b"x" * 300), 300),  # 2-byte content size field (+256)
    ],
)
def test_walk_reads_frames_the_reference_library_writes(stream, size):
    assert walk(stream) == [Frame(0, len(stream), size)]
    assert decode_frames(stream, size).tobytes() == zstandard.ZstdDecompressor().decompress(stream)


def test_empty_content_is_one_frame_of_zero_bytes():
    stream = encode_frames(b"", 19)
    assert walk(stream) == [Frame(0, len(stream), 0)] and decode_frames(stream, 0).size == 0


def flipped(stream: bytes, at: int, value: int) -> bytes:
    b = bytearray(stream)
    b[at] = value
    return bytes(b)


FRAME = zstandard.ZstdCompressor(level=19).compress(coefficients(5000))  # single-segment: FHD, 2-byte size, blocks
FHD = FRAME[4]


@pytest.mark.parametrize(
    "stream, match",
    [
        (b"", "expected zstd frames. Got 0 bytes"),
        (FRAME[:5], "byte 0: expected a zstd frame. Got 5 trailing bytes"),
        (b"\x50\x2a\x4d\x18" + FRAME[4:], "Got magic 0x184D2A50 \\(skippable frames"),
        (flipped(FRAME, 4, FHD | 0x08), "the reserved bit of the frame header descriptor set"),
        (flipped(FRAME, 4, FHD | 0x01), "a dictionary id"),
        (zstandard.ZstdCompressor(level=3, write_content_size=False).compress(b"a" * 100), "no declared content size"),
        (FRAME[:7], "a truncated frame header|a block header past the end"),
        (FRAME[:-1], "a block past the end"),
        (FRAME + FRAME[:3], f"byte {len(FRAME)}: expected a zstd frame. Got 3 trailing bytes"),
        (FRAME + b"\x00" * 8, f"byte {len(FRAME)}: expected a zstd frame. Got magic"),
    ],
)
def test_walk_refuses_what_is_not_a_checked_frame(stream, match):
    with pytest.raises(IntegrityError, match=match):
        walk(stream, "sample 3")


def handmade(content_size: int, blocks: list[tuple[int, int, int]], checksum: bool = False) -> bytes:
    """A frame with a 4-byte content size and the given (last, type, size) block headers (payloads zero)."""
    fhd = (2 << 6) | (1 << 5) | (int(checksum) << 2)
    out = bytearray(MAGIC.to_bytes(4, "little") + bytes([fhd]) + content_size.to_bytes(4, "little"))
    for last, kind, size in blocks:
        out += (last | (kind << 1) | (size << 3)).to_bytes(3, "little")
        out += bytes(1 if kind == 1 else size)
    return bytes(out) + (bytes(4) if checksum else b"")


@pytest.mark.parametrize(
    "stream, match",
    [
        (handmade(10, [(1, 3, 10)]), "a reserved block type at byte 9"),
        (handmade(10, [(1, 0, BLOCK_MAX + 1)]), f"a block of {BLOCK_MAX + 1} bytes at byte 9"),
        (handmade(BLOCK_MAX + 1, [(1, 2, 100)]), f"declared content size of {BLOCK_MAX + 1} bytes that its 1 blocks"),
        (handmade(20, [(0, 0, 10), (1, 1, 5)]), "declared content size of 20 bytes that its 2 blocks cannot hold"),
        (handmade(10, [(1, 0, 10)], checksum=True)[:-2], "a truncated checksum"),
    ],
)
def test_walk_checks_block_headers(stream, match):
    with pytest.raises(IntegrityError, match=match):
        walk(stream)


def test_handmade_frames_that_are_well_formed_walk():
    assert walk(handmade(15, [(0, 0, 10), (1, 1, 5)], checksum=True)) == [Frame(0, 9 + 13 + 4 + 4, 15)]


def test_frame_table_of_a_batch_with_one_and_several_frames_per_sample():
    raws = [coefficients(1000, s) for s in range(3)]
    streams = [encode_frames(raws[0], 19), encode_frames(raws[1], 19, 300), encode_frames(raws[2], 19, 999)]
    offsets = np.concatenate([[0], np.cumsum([len(s) for s in streams])])
    table = frame_table(b"".join(streams), offsets, 1000)
    assert table.samples.tolist() == [0, 1, 1, 1, 1, 2, 2]
    assert table.sizes.tolist() == [1000, 300, 300, 300, 100, 999, 1]
    assert table.starts[0] == 0 and table.ends[-1] == offsets[-1] and len(table) == 7
    buf = b"".join(streams)
    for f in range(len(table)):  # every frame decodes on its own to its declared size
        part = zstandard.ZstdDecompressor().decompress(buf[table.starts[f] : table.ends[f]])
        assert len(part) == table.sizes[f]


def test_frame_table_names_the_sample_whose_frames_do_not_add_up():
    good, short = encode_frames(coefficients(1000), 19), encode_frames(coefficients(999), 19)
    with pytest.raises(IntegrityError, match=r"batch 7: sample 1: expected zstd frames declaring 1000 bytes. Got 999"):
        frame_table(good + short, [0, len(good), len(good) + len(short)], 1000, "batch 7")
    with pytest.raises(IntegrityError, match=r"batch: sample 1: byte 0: expected a zstd frame. Got magic"):
        frame_table(good + bytes(20), [0, len(good), len(good) + 20], 1000)
    with pytest.raises(DctDataError, match="expected offsets within the buffer's"):
        frame_table(good, [0, len(good) + 1], 1000)
    with pytest.raises(DctDataError, match="offsets: expected non-decreasing offsets"):
        frame_table(good, [len(good), 0], 1000)
    with pytest.raises(DctDataError, match="offsets: expected N\\+1 integer offsets"):
        frame_table(good, [[0, 1]], 1000)


def test_one_frame_per_sample_table_and_aligned_offsets():
    table = FrameTable.one_per_sample([0, 5, 5, 12], 64)
    assert table.starts.tolist() == [0, 5, 5] and table.ends.tolist() == [5, 5, 12]
    assert table.sizes.tolist() == [64] * 3 and table.samples.tolist() == [0, 1, 2]
    assert aligned_offsets([5, 8, 0, 9], 8).tolist() == [0, 8, 16, 16, 32]


def test_decode_frames_refuses_other_sizes_and_bad_blocks():
    stream = encode_frames(coefficients(5000), 19, 2048)
    with pytest.raises(IntegrityError, match=r"expected zstd frames declaring 4999 bytes. Got 5000"):
        decode_frames(stream, 4999)
    frames = walk(stream)
    bad = bytearray(stream)
    bad[frames[1].start + 20 : frames[1].start + 60] = bytes(40)  # inside a compressed block of frame 1
    with pytest.raises(IntegrityError, match=f"byte {frames[1].start}: expected"):
        decode_frames(bytes(bad), 5000)
    with pytest.raises(DctDataError, match=r"frame_bytes: expected a positive int. Got 0"):
        encode_frames(b"abc", 19, 0)


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_fuzzed_streams_raise_integrity_errors_or_decode_within_bounds(data):
    """Mutated, truncated and extended multi-frame streams: the walk and the CPU decode either refuse them with an
    IntegrityError or return frames inside the stream and exactly the declared bytes."""
    raw = coefficients(3000, data.draw(st.integers(0, 3)))
    stream = bytearray(encode_frames(raw, data.draw(st.sampled_from([1, 19])), data.draw(st.sampled_from([700, 4096]))))
    for _ in range(data.draw(st.integers(1, 4))):
        op = data.draw(st.sampled_from(["flip", "cut", "extend"]))
        if op == "flip" and stream:
            at = data.draw(st.integers(0, len(stream) - 1))
            stream[at] = data.draw(st.integers(0, 255))
        elif op == "cut":
            stream = stream[: data.draw(st.integers(0, len(stream)))]
        else:
            stream += bytes(data.draw(st.lists(st.integers(0, 255), max_size=12)))
    try:
        frames = walk(bytes(stream))
    except IntegrityError:
        return
    assert frames[0].start == 0 and frames[-1].end == len(stream)
    assert all(0 <= f.start < f.end <= len(stream) and f.size >= 0 for f in frames)
    total = sum(f.size for f in frames)
    if total > 1 << 20:
        return  # a flipped size field; the readers' declared-size check refuses it before any decode
    try:
        out = decode_frames(bytes(stream), total)
    except IntegrityError:
        return
    assert out.size == total
