"""The lossless stage: configs round-trip bytes exactly, zarr gets spec codecs, bad configs fail."""

import numpy as np
import pytest
import torch
import zarr
import zarr.codecs as zc

import dctdata
from dctdata.calibrate import calibrate
from dctdata.lossless import DEFAULT_CODEC, get_codec, parse_codec_config, zarr_compressors


def quantized():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 2, 64, 48, generator=g, dtype=torch.float64).cumsum(-1).cumsum(-2).float()
    spec = calibrate(x, quant=None, target_psnr=40)
    (q, _side), _ = dctdata.encode(x, spec)
    return q.contiguous().numpy()


@pytest.mark.parametrize(
    "config",
    [
        DEFAULT_CODEC,
        {"id": "zstd", "level": 1},
        {"id": "blosc", "cname": "zstd", "clevel": 5, "shuffle": 2},
        {"id": "zlib", "level": 6},
    ],
)
def test_codecs_round_trip_exactly_and_compress(config):
    q = quantized()
    codec = get_codec(config)
    blob = codec.encode(q)
    back = np.frombuffer(codec.decode(blob), dtype=q.dtype).reshape(q.shape)
    np.testing.assert_array_equal(back, q)
    assert len(blob) < q.nbytes / 2


def test_default_is_zstd_and_maps_to_the_zarr_spec_codec():
    assert DEFAULT_CODEC["id"] == "zstd"
    (c,) = zarr_compressors(DEFAULT_CODEC)
    assert isinstance(c, zc.ZstdCodec) and c.level == DEFAULT_CODEC["level"]
    (b,) = zarr_compressors({"id": "blosc", "cname": "zstd", "clevel": 5, "shuffle": 1})
    assert isinstance(b, zc.BloscCodec) and b.shuffle.value == "shuffle"
    (gz,) = zarr_compressors({"id": "gzip", "level": 4})
    assert isinstance(gz, zc.GzipCodec)
    assert zarr_compressors(None) == ()


def test_zarr_array_with_default_codec_round_trips(tmp_path):
    q = quantized()
    a = zarr.create_array(
        tmp_path / "a.zarr",
        shape=q.shape,
        dtype=q.dtype,
        chunks=(1, *q.shape[1:]),
        compressors=zarr_compressors(DEFAULT_CODEC),
    )
    a[:] = q
    np.testing.assert_array_equal(zarr.open_array(tmp_path / "a.zarr")[:], q)


def test_non_spec_codec_falls_back_to_numcodecs_wrapper():
    with pytest.warns(UserWarning):
        (c,) = zarr_compressors({"id": "zlib", "level": 3})
    assert not isinstance(c, (zc.ZstdCodec, zc.BloscCodec, zc.GzipCodec))


def test_bad_configs():
    with pytest.raises(dctdata.DctDataError, match="codec: expected a numcodecs config"):
        parse_codec_config({"level": 3})
    with pytest.raises(dctdata.DctDataError, match="numcodecs cannot build"):
        parse_codec_config({"id": "no-such-codec"})
    assert get_codec(None) is None and parse_codec_config(None) == {}


def test_empty_config_means_no_lossless_stage():
    from dctdata.lossless import get_codec, zarr_compressors

    assert get_codec({}) is None and get_codec(None) is None
    assert zarr_compressors({}) == ()
