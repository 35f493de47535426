"""The blosc stage: numcodecs' blosc frames round-trip exactly, its declared size bounds decoding, its
zarr.json entry is what zarr-python writes, and its webdataset members keep the suffix they always had."""

import numpy as np
import pytest
import zarr
import zarr.codecs as zc

from dctdata.errors import DctDataError, IntegrityError
from dctdata.format import FieldSpec
from dctdata.format.webdataset import entry_name
from dctdata.format.zarr.metadata import check_chunk_codecs, parse_array_json
from dctdata.stages import BloscStage, ZstdStage, get_stage

CONFIG = {"id": "blosc", "cname": "zstd", "clevel": 5, "shuffle": 2}


def test_round_trips_exactly_and_compresses():
    q = np.random.default_rng(0).integers(-3, 4, (4, 2, 8, 16, 6)).astype(np.int16)
    stage = get_stage(CONFIG)
    blob = stage.encode(q)
    np.testing.assert_array_equal(stage.decode(blob, q.shape, q.dtype, "x"), q)
    assert len(blob) < q.nbytes / 2 and isinstance(stage, BloscStage)


def test_decoding_is_bounded_by_the_header():
    stage = get_stage({"id": "blosc", "cname": "lz4", "clevel": 5, "shuffle": 1})
    blob = stage.encode(np.arange(100, dtype=np.uint8))
    assert stage.declared_size(blob) == 100
    assert stage.declared_size(blob + b"\0") is None  # blosc reads the header's length whatever the buffer holds
    with pytest.raises(
        IntegrityError, match=r"chunk 3: expected a stream of 200 decoded bytes\. Got one declaring 100"
    ):
        stage.decode(blob, (200,), np.uint8, "chunk 3")
    with pytest.raises(IntegrityError, match=r"chunk 3: expected .*damaged or truncated header"):
        stage.decode(blob[:-5], (100,), np.uint8, "chunk 3")
    with pytest.raises(IntegrityError, match=r"chunk 3: expected .*damaged or truncated header"):
        stage.decode(blob[:10], (100,), np.uint8, "chunk 3")  # shorter than a header


def test_zarr_python_arrays_have_the_codecs_the_reader_expects(tmp_path):
    path = tmp_path / "a.zarr"
    codec = zc.BloscCodec(cname="zstd", clevel=5, shuffle="shuffle", typesize=2)
    zarr.create_array(
        path, shape=(4, 8), dtype="int16", chunks=(4, 8), shards=(4, 8), compressors=(codec, zc.Crc32cCodec())
    )[:] = np.arange(32).reshape(4, 8)
    meta = parse_array_json((path / "zarr.json").read_bytes(), "a")
    check_chunk_codecs(meta, {"id": "blosc", "cname": "zstd", "clevel": 5, "shuffle": 1, "typesize": 2}, "a", "a")
    with pytest.raises(IntegrityError, match=r"expected chunk codecs \['bytes', 'blosc', 'crc32c'\]"):
        check_chunk_codecs(meta, {"id": "blosc", "cname": "lz4", "shuffle": 1, "typesize": 2}, "a", "a")


def test_members_keep_the_suffix_blosc_packs_always_had():
    """Written as `.npy.zst` since the first release (any bytes codec was): kept so packs stay the same
    bytes; the reader takes the stage from the manifest, never from the suffix."""
    assert entry_name("label", CONFIG) == "label.npy.zst" == entry_name("label", ZstdStage.default_config())
    assert BloscStage.shares_suffix and not ZstdStage.shares_suffix


@pytest.mark.parametrize(
    "change",
    [{"clevel": "5"}, {"clevel": 10}, {"shuffle": 3}, {"shuffle": "bit"}, {"typesize": 0}, {"blocksize": -1},
     {"cname": "brotli"}, {"cname": 3}, {"filters": []}],
)  # fmt: skip
def test_a_manifests_config_of_other_types_is_refused_when_read(change):
    with pytest.raises(DctDataError, match=r"^field 'x': lossless: expected a blosc config .*Got \{'id': 'blosc'"):
        FieldSpec("x", "array", (3,), "int16", lossless={**CONFIG, **change})
