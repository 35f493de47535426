"""`dctdata.format.storages`: the registry is where a storage's name meets its reader and writer, and the
reader interface (`dctdata.format.reader`) is what verify and the loaders use."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import pathlib

import numpy as np
import pytest
from sample_fields import smooth_fields

import dctdata
from dctdata.cli import build_parser, main
from dctdata.errors import DctDataError
from dctdata.format import read_manifest, storages
from dctdata.format.reader import StorageReader, Unit
from dctdata.format.webdataset.reader import WebDatasetReader
from dctdata.format.zarr.reader import ZarrReader
from dctdata.format.zarr.writer import ZarrWriter
from dctdata.loaders.zarr_dataset import DCTZarrDataset
from dctdata.settings import PackSettings

ROOT = pathlib.Path(__file__).resolve().parents[2]


class EchoReader(ZarrReader):
    """A storage registered for the test: a zarr pack read under another name."""

    storage = "echo"


class EchoWriter(ZarrWriter):
    """The test storage's writer: zarr's, with an option of its own that it records as it is made."""

    storage = "echo"
    options = (*ZarrWriter.options, "echo_level")
    made: list[int | None] = []

    def __init__(self, echo_level: int = 5, **options):
        super().__init__(**options)
        self.echo_level = echo_level
        EchoWriter.made.append(echo_level)


class EchoDataset(DCTZarrDataset):
    """The test storage's dataset class (what `open_dataset` returns for its packs)."""


def _level(value, flag):
    if not isinstance(value, (int, str)) or not str(value).isdigit():
        raise DctDataError(f"{flag}: expected a level 0..9. Got {value!r}")
    return int(value)


@pytest.fixture
def echo(monkeypatch):
    """A storage "echo" registered for one test (the registry is restored after it)."""
    monkeypatch.setattr(storages, "_REGISTRY", dict(storages._REGISTRY))
    monkeypatch.setattr(EchoWriter, "made", [])
    return storages.register(
        "echo",
        f"{__name__}:EchoReader",
        f"{__name__}:EchoWriter",
        dataset=f"{__name__}:EchoDataset",
        summary="zarr under another name",
        options=(
            storages.Option(
                "echo_level", "how loud the writer is (recorded)", type=int, metavar="L", default=5, parse=_level
            ),
        ),
    )


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


def _storage_name_literals(path: pathlib.Path, names: set[str]) -> list[str]:
    """A string that is a storage's name (`"zarr"`), other than the default of a parameter called `format`
    (`pack(..., format="zarr")`: the default storage, as a user reads it in the signature)."""
    tree = ast.parse(path.read_text(), str(path))
    defaults = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            positional = [*a.posonlyargs, *a.args][-len(a.defaults) :] if a.defaults else []
            pairs = [*zip(positional, a.defaults), *zip(a.kwonlyargs, a.kw_defaults)]
            defaults |= {id(d) for arg, d in pairs if d is not None and arg.arg == "format"}
    return [
        f"{path}:{n.lineno}: {n.value!r}"
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and n.value in names and id(n) not in defaults
    ]


def test_no_storage_named_outside_its_package_and_the_registry():
    """Beyond comparisons: no module outside `format/` spells a storage's name (its options' flags and help,
    `--format`'s help and choices come from the registry). The demo, which packs both storages to compare
    them as a user would, is the one exception."""
    names = set(storages.names())
    found = []
    for folder in ("dctdata", "preprocess", "loaders"):
        for path in (ROOT / folder).rglob("*.py"):
            if (ROOT / "dctdata" / "format") in path.parents or (ROOT / "dctdata" / "demo") in path.parents:
                continue
            found += _storage_name_literals(path, names)
    assert not found, found


def _storage_imports(path: pathlib.Path, names: set[str]) -> list[str]:
    """Imports of a storage's package (`dctdata.format.zarr...`, `from dctdata.format import webdataset`)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module:
            modules = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        else:
            continue
        hit = [
            m for m in modules if any(m == f"dctdata.format.{n}" or m.startswith(f"dctdata.format.{n}.") for n in names)
        ]
        found += [f"{path}:{node.lineno}: {m}" for m in hit]
    return found


def test_only_the_loaders_import_a_storage_package():
    """Outside `format/`, only the loaders (which hold each storage's dataset classes) import a storage's
    package; the rest (verify, the CLI, the API, the packer) go through the registry and the interfaces."""
    names = set(storages.names())
    found = []
    for folder in ("dctdata", "preprocess"):
        for path in (ROOT / folder).rglob("*.py"):
            if (ROOT / "dctdata" / "format") not in path.parents:
                found += _storage_imports(path, names)
    assert not found, found
    path = ROOT / "loaders" / "wds_dataset.py"
    assert _storage_imports(path, names), "the check reads imports"  # a loader of webdataset packs does


def test_the_storage_literal_check_catches_a_name_but_not_a_format_default(tmp_path):
    path = tmp_path / "x.py"
    path.write_text('def pack(x, *, format="zarr"):\n    return {"webdataset": 1}\n')
    assert _storage_name_literals(path, set(storages.names())) == [f"{path}:2: 'webdataset'"]


def test_every_registered_class_lives_where_the_layers_allow():
    """Reader and writer in the storage's own `format/<name>/` package; dataset and time windows in the
    loaders (the import graph cannot see these edges: `dctdata.api` loads them by name)."""
    for s in storages._REGISTRY.values():
        assert s.reader_path.startswith(f"dctdata.format.{s.name}.") and s.writer_path.startswith(
            f"dctdata.format.{s.name}."
        )
        for path in (s.dataset_path, s.windows_path):
            assert path.startswith("dctdata.loaders.") and callable(storages.load(path)), path
        assert isinstance(s.reader.random_access, bool)


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


def pack_parser() -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["pack"]


def pack_help() -> str:
    return pack_parser().format_help()


def test_a_registered_storage_gets_its_flags_and_its_options_reach_its_writer(tmp_path, echo, capsys):
    text = pack_help()
    assert "echo writer options" in text and "--echo-level L" in text
    assert "echo: how loud the writer is (recorded)" in " ".join(text.split())
    np.save(tmp_path / "x.npy", smooth_fields(6, 1, 16, 16))
    argv = ["pack", tmp_path / "x.npy", tmp_path / "p", "--format", "echo", "--echo-level", "3", "--cf", "4"]
    assert main([str(a) for a in argv] + ["--quiet", "--workers", "1"]) == 0
    assert EchoWriter.made and set(EchoWriter.made) == {3}  # the flag's value reached the writer
    m = read_manifest(tmp_path / "p")
    assert m.storage == "echo"
    ds = dctdata.open_dataset(tmp_path / "p")  # the dataset class is the storage's
    assert type(ds) is EchoDataset and len(ds) == 6
    # Python: the same option in writer_options, parsed by the storage's declaration
    EchoWriter.made.clear()
    dctdata.pack(
        smooth_fields(4, 1, 16, 16),
        tmp_path / "q",
        format="echo",
        writer_options={"echo_level": "7"},
        quiet=True,
        workers=1,
    )
    assert set(EchoWriter.made) == {7}
    # without the flag (its default) nothing is passed: the writer's own default
    EchoWriter.made.clear()
    assert main([str(a) for a in argv[:5]] + ["--cf", "4", "--quiet", "--workers", "1", "--overwrite"]) == 0
    assert set(EchoWriter.made) == {5}
    assert PackSettings.from_args(pack_parser().parse_args(["x.npy", "out", "--format", "echo"])).writer_config == {}


def test_an_option_a_storage_does_not_have_is_one_error_naming_both(tmp_path, echo, capsys):
    x = smooth_fields(4, 1, 16, 16)
    with pytest.raises(
        DctDataError,
        match=r"^--echo-level: expected --format echo\. Got --format zarr \(storage 'zarr' has no writer option "
        r"'echo_level'\)$",
    ):
        dctdata.pack(x, tmp_path / "a", writer_options={"echo_level": 1}, quiet=True)
    with pytest.raises(
        DctDataError,
        match=r"^writer_options: expected the options of storage 'echo' \(echo_level\)\. Got 'chunk', which no "
        r"storage has$",
    ):
        dctdata.pack(x, tmp_path / "b", format="echo", writer_options={"chunk": 2}, quiet=True)
    with pytest.raises(DctDataError, match=r"^--echo-level: expected a level 0\.\.9\. Got 'loud'$"):
        dctdata.pack(x, tmp_path / "c", format="echo", writer_options={"echo_level": "loud"}, quiet=True)
    np.save(tmp_path / "x.npy", x)
    rc = main(["pack", str(tmp_path / "x.npy"), str(tmp_path / "d"), "--format", "webdataset", "--echo-level", "2"])
    assert rc == 1
    err = capsys.readouterr().err
    assert "--echo-level: expected --format echo. Got --format webdataset (storage 'webdataset' has no writer " in err
    assert EchoWriter.made == [] and not any((tmp_path / n).exists() for n in "abcd")


def test_a_storage_option_is_registered_once():
    with pytest.raises(
        DctDataError, match=r"^storage 'other': option --max-shard-size: expected a name of its own\. Got "
    ):
        storages.register("other", "x:R", "x:W", options=(storages.Option("shard_cap", "x", flag="--max-shard-size"),))
    with pytest.raises(
        DctDataError, match=r"^storage 'other': option chunk_samples: expected a name of its own\. Got "
    ):
        storages.register("other", "x:R", "x:W", options=(storages.Option("chunk_samples", "x"),))
    assert "other" not in storages.names()


def test_the_pack_flags_and_their_help_are_the_registrys():
    wds = storages.get("webdataset")
    assert [o.cli_flag for o in wds.options] == ["--max-shard-size", "--samples-per-shard", "--samples-per-member"]
    assert [o.cli_flag for o in storages.get("zarr").options] == ["--chunk-samples", "--shard-samples"]
    assert storages.format_help() == "zarr (random access, default) or webdataset (streaming shards)"
    text = " ".join(pack_help().split())
    for storage, option in storages.options():
        assert f"{option.cli_flag} {option.metavar} {storage.name}: {option.help}" in text
    assert wds.option("max_shard_size").value("64MiB") == 64 << 20 and wds.option("nope") is None


def test_open_dataset_takes_its_classes_from_the_registry(tmp_path, monkeypatch):
    dctdata.pack(smooth_fields(4, 1, 16, 16), tmp_path / "z", cf=4, quiet=True)
    zarr = storages.get("zarr")
    monkeypatch.setitem(storages._REGISTRY, "zarr", dataclasses.replace(zarr, dataset_path=f"{__name__}:EchoDataset"))
    assert type(dctdata.open_dataset(tmp_path / "z")) is EchoDataset
    broken = dataclasses.replace(zarr, dataset_path="dctdata.loaders.no_such_module:X")
    monkeypatch.setitem(storages._REGISTRY, "zarr", broken)
    with pytest.raises(
        DctDataError, match=r"^storage 'zarr': expected its dataset \(dctdata\.loaders\.no_such_module:X\)"
    ):
        dctdata.open_dataset(tmp_path / "z")


def test_verify_reads_a_pipe_stream_through_the_storage_that_streams(tmp_path):
    from dctdata.verify import verify_dataset

    dctdata.pack(smooth_fields(6, 1, 16, 16), tmp_path / "w", format="webdataset", cf=4, quiet=True)
    assert storages.streaming().name == "webdataset"
    url = f"pipe:cat {tmp_path / 'w'}/{{}}"
    problems, summary = verify_dataset(url, allow_pipe=True)
    assert problems == [] and summary["samples"] == 6 and summary["decoded"] == 6
    with pytest.raises(DctDataError, match=r"Got a shell 'pipe:' URL, which runs a command \(pass allow_pipe=True"):
        verify_dataset(url)
