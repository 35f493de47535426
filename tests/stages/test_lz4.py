"""The LZ4 stage, added through the registry alone: `--lossless lz4` packs read back in both storages
(and with zarr-python), its size header bounds decoding, anything around one stream is refused."""

import tracemalloc

import numpy as np
import pytest
import zarr
import zarr.codecs as zc
from zarr.codecs.numcodecs import LZ4 as ZarrLZ4

import dctdata
from dctdata.cli import main
from dctdata.errors import DctDataError, IntegrityError
from dctdata.format.webdataset import entry_name
from dctdata.format.zarr.metadata import check_chunk_codecs, parse_array_json
from dctdata.stages import get_stage, ids, parse_option
from dctdata.stages.lz4 import LZ4Stage

CONFIG = {"id": "lz4", "acceleration": 1}


def test_registered_and_spelled_by_the_registry():
    assert "lz4" in ids() and parse_option("lz4") == CONFIG and isinstance(get_stage(CONFIG), LZ4Stage)
    with pytest.raises(DctDataError, match=r"--lossless: expected one of: .*, lz4\. Got 'lz4:2'"):
        parse_option("lz4:2")
    for bad in (0, -1, "2", True):
        with pytest.raises(DctDataError, match=r"codec: expected an lz4 acceleration of 1 or more"):
            get_stage({"id": "lz4", "acceleration": bad})
    assert entry_name("image", CONFIG) == "image.npy.lz4"


def test_round_trips_and_decodes_bounded_by_its_header():
    stage = get_stage(CONFIG)
    a = np.arange(1000, dtype=np.int16)
    blob = stage.encode(a)
    assert (
        stage.declared_size(blob) == 2000 == int.from_bytes(blob[:4], "little") and stage.declared_size(b"abc") is None
    )
    assert np.array_equal(stage.decode(blob, a.shape, a.dtype, "x"), a)
    with pytest.raises(IntegrityError, match=r"^c 1: expected a stream of 4000 decoded bytes\. Got one declaring 2000"):
        stage.decode(blob, (2000,), np.int16, "c 1")  # a stream shorter than the array: never half-filled
    for bad in (blob + b"\0", blob + blob, blob[:-1]):  # anything around one stream
        with pytest.raises(
            IntegrityError, match=r"^c 1: expected lz4-coded bytes of int16 \(1000,\)\. Got undecodable"
        ):
            stage.decode(bad, a.shape, a.dtype, "c 1")
    lying = (2000).to_bytes(4, "little") + bytes(stage.encode(a[:500]))[4:]  # header says more than the data holds
    with pytest.raises(IntegrityError, match=r"^c 1: .*expected to decompress 2000, got 1000"):
        stage.decode(lying, a.shape, a.dtype, "c 1")


def test_a_header_declaring_a_bomb_is_refused_before_decoding():
    stage = get_stage(CONFIG)
    bomb = (2**31 - 1).to_bytes(4, "little") + bytes(stage.encode(np.zeros(64, np.uint8)))[4:]
    tracemalloc.start()
    try:
        with pytest.raises(
            IntegrityError, match=r"^m: expected a stream of at most 4096 decoded bytes\. Got one declaring 2147483647"
        ):
            stage.decode_bounded(bomb, 4096, "m")
        with pytest.raises(
            IntegrityError, match=r"^c: expected a stream of 64 decoded bytes\. Got one declaring 2147483647"
        ):
            stage.decode(bomb, (64,), np.uint8, "c")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 16


def test_the_size_bound_holds_on_incompressible_bytes():
    stage = get_stage(CONFIG)
    rng = np.random.default_rng(0)
    for n in (0, 1, 255, 1000, 65536, 300_000):
        assert len(stage.encode(rng.integers(0, 256, n, dtype=np.uint8))) <= stage.max_encoded_size(n)


@pytest.mark.filterwarnings("ignore:Numcodecs codecs are not in the Zarr version 3 specification")
def test_zarr_python_arrays_have_the_codecs_the_reader_expects(tmp_path):
    path = tmp_path / "a.zarr"
    zarr.create_array(
        path,
        shape=(4, 8),
        dtype="int16",
        chunks=(4, 8),
        shards=(4, 8),
        compressors=(ZarrLZ4(acceleration=1), zc.Crc32cCodec()),
    )[:] = np.arange(32).reshape(4, 8)
    meta = parse_array_json((path / "zarr.json").read_bytes(), "a")
    check_chunk_codecs(meta, CONFIG, "a", "a")
    with pytest.raises(IntegrityError, match=r"expected chunk codecs \['bytes', 'numcodecs.lz4', 'crc32c'\]"):
        check_chunk_codecs(meta, {"id": "lz4", "acceleration": 2}, "a", "a")


@pytest.mark.parametrize("storage", ["zarr", "webdataset"])
def test_cli_lossless_lz4_packs_and_reads_back(tmp_path, storage):
    x = np.random.default_rng(1).normal(size=(6, 1, 24, 32)).cumsum(-1).cumsum(-2).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "out"
    args = ["pack", str(tmp_path / "x.npy"), str(out), "--format", storage, "--quant", "int8", "--cf", "4"]
    assert main([*args, "--lossless", "lz4", "--quiet"]) == 0
    assert main(["verify", str(out)]) == 0
    ds = dctdata.open_dataset(out)
    assert ds.manifest.field("image").lossless == CONFIG  # its side partner stays zstd-9, as always
    py = dctdata.pack(x, tmp_path / "py", format=storage, quant="int8", cf=4, lossless=CONFIG, quiet=True)
    assert py.checksums == ds.manifest.checksums  # the same pack, from Python
