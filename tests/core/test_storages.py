"""`dctdata.format.storages`: the registry is where a storage's name meets its reader and writer, and the
reader interface (`dctdata.format.reader`) is what verify and the loaders use."""

from __future__ import annotations

import ast
import dataclasses
import pathlib

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

ROOT = pathlib.Path(__file__).resolve().parents[2]


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
    q, _side = batches[0][1][0]
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


def _storage_name_comparisons(path: pathlib.Path, names: set[str]) -> list[str]:
    """`x == "zarr"`, `x != "webdataset"`, `x in ("zarr", ...)`: a comparison with a storage's name."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        consts = [c for s in sides for c in ([s] if isinstance(s, ast.Constant) else getattr(s, "elts", []))]
        hit = sorted({c.value for c in consts if isinstance(c, ast.Constant) and c.value in names})
        if hit:
            found.append(f"{path}:{node.lineno}: {hit}")
    return found


def test_no_storage_name_compared_outside_its_package():
    """Callers ask the registry (`storages.get(name).sharded`, a reader's `storage`, `random_access`) instead
    of comparing names, so adding a storage is one package and one registration."""
    names = set(storages.names())
    found = []
    for folder in ("dctdata", "preprocess", "loaders"):
        for path in (ROOT / folder).rglob("*.py"):
            if (ROOT / "dctdata" / "format") in path.parents:
                continue
            found += _storage_name_comparisons(path, names)
    assert not found, found


def test_the_storage_name_check_catches_each_form(tmp_path):
    path = tmp_path / "x.py"
    for source in ('if fmt == "zarr": pass\n', 'ok = "webdataset" != fmt\n', 'ok = fmt in ("zarr", "x")\n'):
        path.write_text(source)
        assert _storage_name_comparisons(path, set(storages.names())), source
    path.write_text('fmt = "zarr"\nok = fmt == "zarrs"\n')
    assert not _storage_name_comparisons(path, set(storages.names()))


def test_a_storage_answers_what_callers_ask():
    wds, zarr = storages.get("webdataset"), storages.get("zarr")
    assert storages.sharded() == ("webdataset",) and wds.sharded and not zarr.sharded
    assert wds.files(3, 4) == 3 and zarr.files(3, 4) == 12
