"""`dctdata.decoder.stored`: the worker's checks of a stored stream and the decode of a `StoredBatch` on its device
(byte order, rows shared by samples, in-stream side values and .npy headers), on hand-made streams."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
import zstandard

from dctdata.codec.spec import CodecSpec
from dctdata.decoder.stored import check_stream, decode_batch, decode_stored
from dctdata.decoder.wire import StoredSample as S
from dctdata.decoder.wire import StreamForm, collate_stored, stage_key
from dctdata.errors import DctDataError, IntegrityError
from dctdata.format.npy import encode_npy, npy_header, npy_size
from dctdata.stages import RAW, get_stage

SPEC = CodecSpec(cf=2, mask="square", channels=1, height=8, width=16, dtype="int16", steps=[[1.0] * 4])
SHAPE = SPEC.coeff_shape  # (1, 1, 4, 2)
ZSTD = {"id": "zstd", "level": 3}


def _values(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(-3000, 3000, (n, *SHAPE)).astype(np.int16)


def test_decode_stored_decodes_each_stream_of_the_buffer():
    q = _values(3)
    streams = [zstandard.ZstdCompressor().compress(v.tobytes()) for v in q]
    data = torch.frombuffer(bytearray(b"".join(streams)), dtype=torch.uint8)
    offsets = torch.tensor(np.cumsum([0] + [len(s) for s in streams]), dtype=torch.int64)
    out = decode_stored(ZSTD, data, offsets, SHAPE, "<i2")
    assert out.shape == (3, *SHAPE) and torch.equal(out, torch.from_numpy(q))
    with pytest.raises(IntegrityError, match=r"stream 0: expected a stream of 8 decoded bytes\. Got one declaring 16"):
        decode_stored(ZSTD, data, offsets, (1, 1, 2, 2), "<i2")


def test_big_endian_chunks_of_several_samples_decode_to_native_values():
    q = _values(4, seed=1)  # two chunks of two samples, stored big-endian without a codec (a foreign zarr)
    chunks = [q[0:2].astype(">i2").tobytes(), q[2:4].astype(">i2").tobytes()]
    form = StreamForm("x", stage_key({}), SHAPE, "int16", rows=2, decoded=len(chunks[0]), little=False)
    samples = [S(chunks[i // 2], i // 2, i % 2, form, i) for i in (3, 0, 2)]  # any order; two from chunk 1
    batch = collate_stored(samples)
    assert batch.streams == 2 and batch.rows.tolist() == [1, 2, 0]
    got, side = decode_batch(batch, {}, SPEC)
    assert side is None and torch.equal(got, torch.from_numpy(q[[3, 0, 2]]))


def test_the_first_samples_of_a_chunk_keep_their_rows():
    """A batch of a chunk's first rows, in order, still says which rows: the chunk decodes to all of its rows."""
    q = _values(4, seed=2)
    form = StreamForm("x", stage_key({}), SHAPE, "int16", rows=4, decoded=q.nbytes)
    batch = collate_stored([S(q.tobytes(), 0, i, form, i) for i in range(2)])
    assert batch.rows.tolist() == [0, 1]
    got, _ = decode_batch(batch, {}, SPEC)
    assert torch.equal(got, torch.from_numpy(q[:2]))
    whole = collate_stored([S(q.tobytes(), 0, i, form, i) for i in range(4)])
    assert whole.rows is None and torch.equal(decode_batch(whole, {}, SPEC)[0], torch.from_numpy(q))


def test_an_npy_member_with_side_values_in_its_stream():
    spec = CodecSpec(
        cf=2, mask="square", channels=1, height=8, width=16, dtype="int16", steps=[[1.0] * 4], side="range_mid"
    )
    q, side = _values(2, seed=2), np.array([[[3.0, 1.5]], [[2.0, -1.0]]], np.float32)
    members = [zstandard.ZstdCompressor().compress(encode_npy(a) + encode_npy(s)) for a, s in zip(q, side)]
    head, side_head = npy_header(SHAPE, "int16"), npy_header((1, 2), "float32")
    at = npy_size(SHAPE, "int16")
    form = StreamForm(
        "x",
        stage_key(ZSTD),
        SHAPE,
        "int16",
        decoded=at + npy_size((1, 2), "float32"),
        at=len(head),
        side_at=at + len(side_head),
        expect=((0, head), (at, side_head)),
    )
    batch = collate_stored([S(m, k, 0, form, k) for k, m in enumerate(members)])
    got_q, got_side = decode_batch(batch, ZSTD, spec)
    assert torch.equal(got_q, torch.from_numpy(q)) and torch.equal(got_side, torch.from_numpy(side))
    other = zstandard.ZstdCompressor().compress(encode_npy(q[0].astype(np.uint16)) + encode_npy(side[0]))
    bad = collate_stored([S(members[0], 0, 0, form, 7), S(other, 1, 0, form, 8)])  # same sizes, other header
    with pytest.raises(IntegrityError, match=r"field 'x' sample 8: expected the \.npy header"):
        decode_batch(bad, ZSTD, spec)


def test_a_batch_of_another_stage_or_shape_is_refused():
    q = _values(1)
    form = StreamForm("x", stage_key({}), SHAPE, "int16", decoded=q.nbytes)
    batch = collate_stored([S(q.tobytes(), 0, 0, form, 0)])
    with pytest.raises(DctDataError, match=r"field 'x': stored batch: expected streams of this decompressor's"):
        decode_batch(batch, ZSTD, SPEC)
    other = CodecSpec(cf=2, mask="square", channels=1, height=8, width=24, dtype="int16", steps=[[1.0] * 4])
    with pytest.raises(DctDataError, match=r"field 'x': stored batch: expected coefficients \(1, 1, 4, 3\)"):
        decode_batch(batch, {}, other)


def test_check_stream_refuses_a_declared_size_that_is_not_the_expected_one():
    codec = get_stage(ZSTD)
    frame = zstandard.ZstdCompressor().compress(bytes(64))
    check_stream(codec, frame, 64, "here")  # passes
    with pytest.raises(IntegrityError, match=r"here: expected a stream of 65 decoded bytes\. Got one of 64"):
        check_stream(codec, frame, 65, "here")
    with pytest.raises(IntegrityError, match=r"there: expected a stream of 64 decoded bytes\. Got a damaged"):
        check_stream(codec, frame[:3], 64, lambda: "there")
    with pytest.raises(IntegrityError, match=r"raw: expected a stream of 8 decoded bytes\. Got one of 7"):
        check_stream(RAW, bytes(7), 8, "raw")


def test_collating_mixed_samples_is_refused():
    q = _values(2)
    a = StreamForm("x", stage_key({}), SHAPE, "int16", decoded=16)
    b = StreamForm("y", stage_key({}), SHAPE, "int16", decoded=16)
    with pytest.raises(DctDataError, match=r"expected one field's samples of one form"):
        collate_stored([S(q[0].tobytes(), 0, 0, a, 0), S(q[1].tobytes(), 1, 0, b, 1)])
    with pytest.raises(DctDataError, match=r"expected side values for all or none"):
        collate_stored([S(q[0].tobytes(), 0, 0, a, 0, torch.zeros(1, 2)), S(q[1].tobytes(), 1, 0, a, 1)])
    with pytest.raises(DctDataError, match=r"expected at least one to collate"):
        collate_stored([])


@pytest.mark.parametrize("stage", [{}, ZSTD])
@pytest.mark.parametrize("rows", [1, 2, 4])  # a webdataset member per sample, zarr chunks of 2 and 4 samples
def test_a_row_table_that_does_not_fit_its_streams_is_named(stage, rows):
    """Rows past the streams, negative rows, a table of the wrong length and an offsets table with an entry too
    many: each an IntegrityError naming the field and the samples, never a bare IndexError or "samples []"."""
    q = _values(4, seed=3)
    pack = get_stage(stage)
    chunks = [pack.encode(q[a : a + rows].tobytes()) for a in range(0, 4, rows)]
    form = StreamForm("x", stage_key(stage), SHAPE, "int16", rows=rows, decoded=rows * q[0].nbytes)
    batch = collate_stored([S(chunks[i // rows], i // rows, i % rows, form, 10 + i) for i in (3, 0, 2)])
    assert torch.equal(decode_batch(batch, stage, SPEC)[0], torch.from_numpy(q[[3, 0, 2]]))
    total = batch.streams * rows
    for bad_rows, shown in (([0, 1, total], f"sample 12 at row {total}"), ([0, -1, 1], "sample 10 at row -1")):
        bad = dataclasses.replace(batch, rows=torch.tensor(bad_rows))
        with pytest.raises(
            IntegrityError, match=rf"field 'x' stored batch: expected each sample's row in \[0, {total}\).* {shown}"
        ):
            decode_batch(bad, stage, SPEC)
    for bad_rows in (torch.tensor([0, 1]), torch.tensor([0.0, 1.0, 2.0]), torch.zeros(3, 1, dtype=torch.int64)):
        with pytest.raises(IntegrityError, match=r"field 'x' stored batch: expected an integer row per sample \(3,\)"):
            decode_batch(dataclasses.replace(batch, rows=bad_rows), stage, SPEC)
    extra = dataclasses.replace(batch, offsets=torch.cat([batch.offsets, batch.offsets[-1:]]))
    with pytest.raises(
        IntegrityError,
        match=r"expected (every stream to hold a row of the batch's samples|3 decoded rows \(one per sample) "
        r"\[13, 10, 12\]",
    ):
        decode_batch(extra, stage, SPEC)
    whole = collate_stored([S(chunks[i // rows], i // rows, i % rows, form, i) for i in range(4)])
    assert whole.rows is None
    for offsets in (torch.cat([whole.offsets, whole.offsets[-1:]]), whole.offsets[:-1]):
        with pytest.raises(IntegrityError, match=r"expected 4 decoded rows \(one per sample \[0, 1, 2, 3\]\)"):
            decode_batch(dataclasses.replace(whole, offsets=offsets), stage, SPEC)


def test_a_layer_refuses_the_stored_bytes_of_a_field_that_is_not_dct():
    """Stored bytes carry their field's codec; a field that is not dct has none to decode coefficients with."""
    from dctdata.decoder.layer import Decompress
    from dctdata.decoder.wire import PackCodec, StoredBatch

    codec = PackCodec("sha256:" + "0" * 64, "other.pack", None, {})
    form = StreamForm("label", stage_key({}), (1,), "int64", decoded=8, pack=codec.pack, codec=codec)
    with pytest.raises(TypeError, match=r"stored bytes of field 'label' of pack 'other\.pack' .*not a dct"):
        Decompress(SPEC)(StoredBatch.empty(form))
