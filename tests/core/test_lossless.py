"""The lossless stage: allow-listed configs round-trip bytes exactly, decoding is bounded to the
expected array, the zarr.json dctdata writes names the same spec codecs zarr-python writes (so zstd and
blosc packs, old and new, read with any zarr v3 reader), bad configs fail."""

import numpy as np
import pytest
import torch
import zarr
import zarr.codecs as zc

import dctdata
from dctdata.calibrate import calibrate
from dctdata.errors import IntegrityError
from dctdata.format.zarr.metadata import check_chunk_codecs, parse_array_json
from dctdata.lossless import DEFAULT_CODEC, ZSTD_MAX, decode_array, encode_array, get_codec, parse_codec_config


def quantized():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 2, 64, 48, generator=g, dtype=torch.float64).cumsum(-1).cumsum(-2).float()
    spec = calibrate(x, quant=None, target_psnr=40)
    (q, _side), _ = dctdata.encode(x, spec)
    return q.contiguous().numpy()


@pytest.mark.parametrize(
    "config", [DEFAULT_CODEC, ZSTD_MAX, {"id": "zstd", "level": 1}, {"id": "blosc", "cname": "zstd", "shuffle": 2}]
)
def test_codecs_round_trip_exactly_and_compress(config):
    q = quantized()
    codec = get_codec(config)
    blob = encode_array(codec, q)
    np.testing.assert_array_equal(decode_array(codec, blob, q.shape, q.dtype, "x"), q)
    assert len(blob) < q.nbytes / 2


@pytest.mark.parametrize("config", [DEFAULT_CODEC, {"id": "blosc", "cname": "lz4", "clevel": 5, "shuffle": 1}])
def test_decoding_is_bounded_to_the_expected_array(config):
    codec = get_codec(config)
    blob = encode_array(codec, np.arange(100, dtype=np.uint8))
    with pytest.raises(
        IntegrityError, match=r"chunk 3: expected a stream of 200 decoded bytes\. Got one declaring 100"
    ):
        decode_array(codec, blob, (200,), np.uint8, "chunk 3")  # shorter than expected: never half-filled
    with pytest.raises(IntegrityError, match=r"chunk 3: expected a stream of 50 decoded bytes\. Got one declaring 100"):
        decode_array(codec, blob, (50,), np.uint8, "chunk 3")
    with pytest.raises(IntegrityError, match=r"chunk 3: expected .*(Got undecodable|damaged or truncated header)"):
        decode_array(codec, blob[:-5], (100,), np.uint8, "chunk 3")  # truncated


def test_zstd_decode_takes_one_whole_frame_and_nothing_after_it():
    codec = get_codec(DEFAULT_CODEC)
    blob = encode_array(codec, np.arange(100, dtype=np.uint8))
    got = decode_array(codec, blob, (100,), np.uint8, "chunk 3")
    assert got.flags.writeable and got.flags.c_contiguous  # callers may write into what they read
    got[0] = 7
    assert decode_array(codec, blob, (100,), np.uint8, "chunk 3")[0] == 0
    for tail in (blob, b"\0"):
        said = rf"Got undecodable bytes \(ZstdError: compressed input contains {len(tail)} bytes of unused data"
        with pytest.raises(IntegrityError, match=rf"chunk 3: expected zstd-coded bytes of uint8 \(100,\)\. {said}"):
            decode_array(codec, blob + tail, (100,), np.uint8, "chunk 3")  # a second frame or trailing bytes
    with pytest.raises(IntegrityError, match=r"chunk 3: expected zstd-coded bytes of uint8 \(100,\)\. Got undecodable"):
        decode_array(codec, blob[:30] + blob[31:], (100,), np.uint8, "chunk 3")  # a byte gone from the frame


@pytest.mark.parametrize(
    "lossless, zarr_codec",
    [
        (DEFAULT_CODEC, zc.ZstdCodec(level=DEFAULT_CODEC["level"])),
        ({"id": "blosc", "cname": "zstd", "clevel": 5, "shuffle": 1, "typesize": 2}, None),
    ],
)
def test_zarr_python_arrays_have_the_codecs_the_reader_expects(tmp_path, lossless, zarr_codec):
    """Version-1 packs were written by zarr-python: their zarr.json must pass the same check."""
    if zarr_codec is None:
        zarr_codec = zc.BloscCodec(cname="zstd", clevel=5, shuffle="shuffle", typesize=2)
    path = tmp_path / "a.zarr"
    zarr.create_array(
        path, shape=(4, 8), dtype="int16", chunks=(4, 8), shards=(4, 8), compressors=(zarr_codec, zc.Crc32cCodec())
    )[:] = np.arange(32).reshape(4, 8)
    meta = parse_array_json((path / "zarr.json").read_bytes(), "a")
    check_chunk_codecs(meta, lossless, "a", "a")
    with pytest.raises(IntegrityError, match=r"a: field 'a': expected chunk codecs \['bytes', 'zstd', 'crc32c'\]"):
        check_chunk_codecs(meta, {"id": "zstd", "level": 2}, "a", "a")


def test_bad_configs():
    with pytest.raises(dctdata.DctDataError, match="codec: expected a numcodecs config"):
        parse_codec_config({"level": 3})
    for name in ("no-such-codec", "zlib", "pickle"):
        with pytest.raises(dctdata.DctDataError, match=rf"codec: expected one of .*Got '{name}' \(a manifest may not"):
            parse_codec_config({"id": name})
    assert get_codec(None) is None and parse_codec_config(None) == {}


def test_a_codec_is_built_once_per_process_per_config(monkeypatch):
    import dctdata.lossless as lossless

    built = []
    construct = lossless._construct
    monkeypatch.setattr(lossless, "_BUILT", {})
    monkeypatch.setattr(lossless, "_construct", lambda config: built.append(config) or construct(config))
    a = get_codec({"id": "zstd", "level": 4})
    assert get_codec({"level": 4, "id": "zstd"}) is a and parse_codec_config({"id": "zstd", "level": 4})
    assert get_codec({"id": "zstd", "level": 5}) is not a
    assert built == [{"id": "zstd", "level": 4}, {"id": "zstd", "level": 5}]
    for _ in range(2):  # a config that fails to build is never cached: it fails every time
        with pytest.raises(dctdata.DctDataError, match="codec: numcodecs cannot build"):
            get_codec({"id": "blosc", "no_such_option": 1})


def test_a_zstd_frame_comes_back_read_only_without_a_copy_when_asked():
    q = quantized()
    codec = get_codec(ZSTD_MAX)
    buf = encode_array(codec, q)
    a = decode_array(codec, buf, q.shape, q.dtype, "x")
    b = decode_array(codec, buf, q.shape, q.dtype, "x", writeable=False)
    assert a.flags.writeable and not b.flags.writeable and np.array_equal(a, q) and np.array_equal(b, q)
    with pytest.raises(IntegrityError, match=r"^x: expected a stream of \d+ decoded bytes"):
        decode_array(codec, buf, (q.size + 1,), q.dtype, "x", writeable=False)


def test_empty_config_means_no_lossless_stage():
    assert get_codec({}) is None and get_codec(None) is None
