"""The zstd stage: numcodecs' frames round-trip exactly, decoding takes one whole frame of the expected
size and nothing after it, the zarr.json dctdata writes names the spec codec zarr-python writes (so zstd
packs, old and new, read with any zarr v3 reader), `--lossless zstd[:LEVEL]` spells its configs."""

import numpy as np
import pytest
import torch
import zarr
import zarr.codecs as zc

import dctdata
from dctdata.encoder.calibrate import calibrate
from dctdata.errors import IntegrityError
from dctdata.format.zarr.metadata import check_chunk_codecs, parse_array_json
from dctdata.stages import DEFAULT_CODEC, ZSTD_MAX, ZstdStage, get_stage, parse_option


def quantized():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 2, 64, 48, generator=g, dtype=torch.float64).cumsum(-1).cumsum(-2).float()
    spec = calibrate(x, quant=None, target_psnr=40)
    (q, _side), _ = dctdata.encode(x, spec)
    return q.contiguous().numpy()


@pytest.mark.parametrize("config", [DEFAULT_CODEC, ZSTD_MAX, {"id": "zstd", "level": 1}])
def test_levels_round_trip_exactly_and_compress(config):
    q = quantized()
    stage = get_stage(config)
    blob = stage.encode(q)
    np.testing.assert_array_equal(stage.decode(blob, q.shape, q.dtype, "x"), q)
    assert len(blob) < q.nbytes / 2 and isinstance(stage, ZstdStage)


def test_decoding_is_bounded_to_the_expected_array():
    stage = get_stage(DEFAULT_CODEC)
    blob = stage.encode(np.arange(100, dtype=np.uint8))
    assert stage.declared_size(blob) == 100 and stage.declared_size(blob[:4]) is None
    with pytest.raises(
        IntegrityError, match=r"chunk 3: expected a stream of 200 decoded bytes\. Got one declaring 100"
    ):
        stage.decode(blob, (200,), np.uint8, "chunk 3")  # shorter than expected: never half-filled
    with pytest.raises(IntegrityError, match=r"chunk 3: expected a stream of 50 decoded bytes\. Got one declaring 100"):
        stage.decode(blob, (50,), np.uint8, "chunk 3")
    with pytest.raises(IntegrityError, match=r"chunk 3: expected .*Got undecodable"):
        stage.decode(blob[:-5], (100,), np.uint8, "chunk 3")  # truncated
    with pytest.raises(
        IntegrityError, match=r"^m: expected a stream of at most 99 decoded bytes\. Got one declaring 100"
    ):
        stage.decode_bounded(blob, 99, "m")
    assert bytes(stage.decode_bounded(blob, 100, "m")) == bytes(range(100))


def test_decode_takes_one_whole_frame_and_nothing_after_it():
    stage = get_stage(DEFAULT_CODEC)
    blob = stage.encode(np.arange(100, dtype=np.uint8))
    got = stage.decode(blob, (100,), np.uint8, "chunk 3")
    assert got.flags.writeable and got.flags.c_contiguous  # callers may write into what they read
    got[0] = 7
    assert stage.decode(blob, (100,), np.uint8, "chunk 3")[0] == 0
    for tail in (blob, b"\0"):
        said = rf"Got undecodable bytes \(ZstdError: compressed input contains {len(tail)} bytes of unused data"
        with pytest.raises(IntegrityError, match=rf"chunk 3: expected zstd-coded bytes of uint8 \(100,\)\. {said}"):
            stage.decode(blob + tail, (100,), np.uint8, "chunk 3")  # a second frame or trailing bytes
    with pytest.raises(IntegrityError, match=r"chunk 3: expected zstd-coded bytes of uint8 \(100,\)\. Got undecodable"):
        stage.decode(blob[:30] + blob[31:], (100,), np.uint8, "chunk 3")  # a byte gone from the frame


def test_a_frame_comes_back_read_only_without_a_copy_when_asked():
    q = quantized()
    stage = get_stage(ZSTD_MAX)
    buf = stage.encode(q)
    a = stage.decode(buf, q.shape, q.dtype, "x")
    b = stage.decode(buf, q.shape, q.dtype, "x", writeable=False)
    assert a.flags.writeable and not b.flags.writeable and np.array_equal(a, q) and np.array_equal(b, q)
    with pytest.raises(IntegrityError, match=r"^x: expected a stream of \d+ decoded bytes"):
        stage.decode(buf, (q.size + 1,), q.dtype, "x", writeable=False)


def test_the_size_bound_is_zstd_compressbound():
    stage = get_stage(DEFAULT_CODEC)
    rng = np.random.default_rng(0)
    for n in (0, 1, 1000, 128 * 1024 - 1, 128 * 1024, 300_000):
        noise = rng.integers(0, 256, n, dtype=np.uint8)  # incompressible: the worst case
        assert len(stage.encode(noise)) <= stage.max_encoded_size(n)
    assert stage.max_encoded_size(300_000) == 300_000 + (300_000 >> 8) + 64


def test_zarr_python_arrays_have_the_codecs_the_reader_expects(tmp_path):
    """Version-1 packs were written by zarr-python: their zarr.json must pass the same check."""
    path = tmp_path / "a.zarr"
    codec = zc.ZstdCodec(level=DEFAULT_CODEC["level"])
    zarr.create_array(
        path, shape=(4, 8), dtype="int16", chunks=(4, 8), shards=(4, 8), compressors=(codec, zc.Crc32cCodec())
    )[:] = np.arange(32).reshape(4, 8)
    meta = parse_array_json((path / "zarr.json").read_bytes(), "a")
    check_chunk_codecs(meta, DEFAULT_CODEC, "a", "a")
    with pytest.raises(IntegrityError, match=r"a: field 'a': expected chunk codecs \['bytes', 'zstd', 'crc32c'\]"):
        check_chunk_codecs(meta, {"id": "zstd", "level": 2}, "a", "a")


def test_lossless_option_spells_zstd_configs():
    assert parse_option("zstd") == ZSTD_MAX == {"id": "zstd", "level": 19}
    assert parse_option(" zstd:3 ") == {"id": "zstd", "level": 3}
    assert parse_option("zstd:22") == {"id": "zstd", "level": 22}
    for bad in ("zstd:0", "zstd:23", "zstd:x", "zstd:"):
        with pytest.raises(dctdata.DctDataError, match=rf"--lossless: expected one of: .*zstd:LEVEL .*Got '{bad}'"):
            parse_option(bad)


@pytest.mark.parametrize(
    "config", [{"id": "zstd", "level": "9"}, {"id": "zstd", "level": None}, {"id": "zstd", "level": True},
               {"id": "zstd", "checksum": "yes"}, {"id": "zstd", "level": 9, "window": 1}],
)  # fmt: skip
def test_a_manifests_config_of_other_types_is_refused_when_read(config):
    with pytest.raises(
        dctdata.DctDataError, match=r"^field 'x': lossless: expected a zstd config .*Got \{'id': 'zstd'"
    ):
        dctdata.format.FieldSpec("x", "array", (3,), "int16", lossless=config)
    assert get_stage({"id": "zstd", "level": -5, "checksum": True}).zarr_codec(2)["configuration"] == {
        "level": -5,
        "checksum": True,
    }


def test_a_stream_leaves_a_worker_only_as_one_well_formed_frame_of_the_expected_size():
    """`check_stream` (decode="device", in the worker) keeps from nvCOMP, which is undefined on invalid input,
    everything the CPU decoder would refuse: another declared size, a second frame, a block past the end."""
    stage = get_stage(ZSTD_MAX)
    blob = stage.encode(np.arange(4096, dtype=np.int16) % 7)
    stage.check_stream(blob, 8192, "chunk 1")
    with pytest.raises(IntegrityError, match=r"^chunk 1: expected a stream of 4096 decoded bytes\. Got one of 8192"):
        stage.check_stream(blob, 4096, "chunk 1")
    with pytest.raises(IntegrityError, match=r"^chunk 1: expected one zstd frame \(the writer makes one\)\. Got 2"):
        stage.check_stream(blob + blob, 8192, lambda: "chunk 1")
    with pytest.raises(IntegrityError, match=r"^chunk 1: byte 0: expected a zstd frame\. Got a block past the end"):
        stage.check_stream(blob[:-2], 8192, "chunk 1")
