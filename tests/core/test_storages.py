"""`dctdata.format.storages`: the registry is where a storage's name meets its reader and writer, and the
reader interface (`dctdata.format.reader`) is what verify and the loaders use."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from sample_fields import smooth_fields

import dctdata
from dctdata.errors import DctDataError
from dctdata.format import read_manifest, storages
from dctdata.format.reader import StorageReader, Unit
from dctdata.format.webdataset.reader import WebDatasetReader
from dctdata.format.zarr.reader import ZarrReader
from dctdata.format.zarr.writer import ZarrWriter


class EchoReader(ZarrReader):
    """A storage registered for the test: a zarr pack read under another name."""

    storage = "echo"


def test_names_classes_and_errors():
    assert storages.names() == ("zarr", "webdataset")
    assert storages.get("zarr").reader is ZarrReader and storages.get("zarr").writer is ZarrWriter
    assert storages.get("webdataset").reader is WebDatasetReader
    assert ZarrReader.random_access and not WebDatasetReader.random_access
    assert WebDatasetReader.units_hash_files and not ZarrReader.units_hash_files
    with pytest.raises(DctDataError, match=r"--format: expected one of \('zarr', 'webdataset'\)\. Got 'parquet'"):
        storages.make_writer("parquet")
    with pytest.raises(DctDataError, match=r"storage: expected one of \('zarr', 'webdataset'\)\. Got 3"):
        storages.get(3)


def test_a_registered_storage_is_read_through_its_reader(tmp_path, monkeypatch):
    x = smooth_fields(6, 1, 16, 16)
    m = dctdata.pack(x, tmp_path / "p", cf=4, quant="int8", quiet=True)
    monkeypatch.setitem(storages._REGISTRY, "echo", storages.Storage("echo", f"{__name__}:EchoReader", "x:y"))
    reader = storages.open_reader(str(tmp_path / "p"), m)
    assert type(reader) is ZarrReader
    echo = storages.open_reader(str(tmp_path / "p"), dataclasses.replace(m, storage="echo"))
    assert type(echo) is EchoReader and isinstance(echo, StorageReader)
    (unit,) = echo.units()
    assert unit == Unit(str(tmp_path / "p"), 0, 6, ("image",), "image")
    batches = list(echo.read_unit(unit, 64))
    assert [first for first, _ in batches] == list(range(0, 6, m.layout["arrays"]["image"]["chunk"]))
    q, side = batches[0][1][0]
    np.testing.assert_array_equal(q.numpy(), reader.read(m.field("image"), 0, len(q)))


def test_a_webdataset_reader_has_no_random_access(tmp_path):
    dctdata.pack(smooth_fields(4, 1, 16, 16), tmp_path / "w", format="webdataset", quiet=True)
    m = read_manifest(tmp_path / "w")
    reader = storages.open_reader(str(tmp_path / "w"), m)
    assert [u.stop - u.start for u in reader.units()] == [e["samples"] for e in m.layout["shards"]]
    with pytest.raises(DctDataError, match=r"expected a storage with random access \(zarr\) to read samples by index"):
        reader.read_samples(m.fields, [0])
    assert reader.check_files() == []  # its shards are hashed as they are read
    assert reader.file_samples("shard-000000.tar") == " (samples 0..0)"
