"""`PackSettings` is the one declaration of the pack settings: `dctdata.pack`'s keywords, `dctdata.Writer`'s
and the flags of `dctdata pack` agree with its fields (names, types, defaults), the CLI's values become the
same settings as Python's, and the ways a caller can get them wrong each raise one clear error."""

from __future__ import annotations

import argparse
import dataclasses
import inspect

import numpy as np
import pytest

import dctdata
from dctdata.cli import build_parser
from dctdata.errors import DctDataError
from dctdata.format import storages
from dctdata.settings import OPTION_SETTINGS, NanPolicy, PackSettings, Targets, flag_of

FIELDS = {f.name: f for f in dataclasses.fields(PackSettings)}
WRITER_ONLY = {"samples", "attrs", "coords", "settings", "description"}  # the Writer's own keywords
DEPRECATED = {"codec"}  # old spellings still taken (`dctdata.settings.RENAMED`)


def keywords(function) -> dict[str, inspect.Parameter]:
    return {n: p for n, p in inspect.signature(function).parameters.items() if p.kind is p.KEYWORD_ONLY}


def pack_parser() -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["pack"]


def test_every_field_is_a_pack_keyword_with_its_type_and_default():
    params = keywords(dctdata.pack)
    assert set(params) == set(FIELDS) | {"settings"} | DEPRECATED
    assert list(inspect.signature(dctdata.pack).parameters)[:2] == ["source", "out"]
    for name, f in FIELDS.items():
        assert params[name].default == f.default, name
        assert params[name].annotation == f.type, name  # both modules use postponed annotations: the same text


def test_the_writer_takes_the_fields_that_apply_to_a_stream():
    params = keywords(dctdata.Writer.__init__)
    writer_fields = {n for n, f in FIELDS.items() if f.metadata["writer"]}
    assert set(params) == writer_fields | WRITER_ONLY | DEPRECATED
    assert writer_fields == set(PackSettings.names(writer=True))
    stream_only = {
        "key",
        "sample_dim",
        "time_dim",
        "variables",
        "stack",
        "allow_external",
        "workers",
        "scheduler",
        "device",
        "resume",
    }
    assert stream_only | {"length"} == set(FIELDS) - writer_fields
    for name in writer_fields:
        assert params[name].default == FIELDS[name].default, name
        assert params[name].annotation == FIELDS[name].type, name


class Captured(Exception):
    """Raised by a stand-in `PackSettings.resolve`: the keywords `pack`/`Writer` passed on."""


@pytest.mark.parametrize("target, names", [("pack", PackSettings.names()), ("Writer", PackSettings.names(writer=True))])
def test_each_keyword_reaches_its_field(monkeypatch, target, names):
    """`pack` and `Writer` pass their keywords on by name (no `locals()`): each value, a distinct object, must
    arrive under its own name, none left out (a keyword dropped would silently keep its default)."""

    def resolve(settings, given, where):
        raise Captured(given)

    monkeypatch.setattr(PackSettings, "resolve", staticmethod(resolve))
    values = {name: object() for name in (*names, *DEPRECATED)}
    with pytest.raises(Captured) as caught:
        if target == "pack":
            dctdata.pack("source", "out", **values)
        else:
            dctdata.Writer("out", **values)
    given = caught.value.args[0]
    assert given.keys() == values.keys()
    assert all(given[k] is v for k, v in values.items())


def test_an_unknown_keyword_is_a_type_error_naming_it(tmp_path):
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'target_pnsr'"):
        dctdata.pack(np.zeros((2, 8, 8), np.float32), tmp_path / "out", target_pnsr=40)
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'workers'"):
        dctdata.Writer(tmp_path / "w", workers=2)  # a setting of pack only: not a Writer keyword
    assert not (tmp_path / "out").exists() and not (tmp_path / "w").exists()


def test_every_field_with_a_flag_is_a_cli_option_and_every_option_a_field():
    """The flags are the fields' and the storages' writer options' (`dctdata.format.storages`); the writer
    options that are also fields (`OPTION_SETTINGS`) take their flag and help from their storage."""
    options = {a.dest: a for a in pack_parser()._actions if a.option_strings and a.dest != "help"}
    flagged = {n: f for n, f in FIELDS.items() if flag_of(f) is not None}
    storage_options = {o.name: (s, o) for s, o in storages.options()}
    assert set(options) == set(flagged) | set(storage_options) and not set(flagged) & set(storage_options)
    assert {n for n, f in FIELDS.items() if flag_of(f) is None} == {
        "calibration",
        "length",
        "writer_options",
        "storage_options",
        *OPTION_SETTINGS,
    }
    assert set(OPTION_SETTINGS) <= set(storage_options)
    for name, f in flagged.items():
        action = options[name]
        assert flag_of(f) in action.option_strings
        assert action.default == f.default, name
        assert action.help.replace("%%", "%") == f.metadata["help"]
    for name, (storage, option) in storage_options.items():
        action = options[name]
        assert action.option_strings == [option.cli_flag] and action.default == option.default, name
        assert action.help.replace("%%", "%") == f"{storage.name}: {option.help}"
        if name in OPTION_SETTINGS:  # the keyword's help is its flag's
            assert FIELDS[name].metadata["help"] == f"{storage.name}: {option.help}"
    assert flag_of(FIELDS["fields"]) == "--field" and flag_of(FIELDS["lossless"]) == "--lossless"
    assert flag_of(FIELDS["target_psnr"]) == "--target-psnr"


def test_every_field_is_documented():
    for name, f in FIELDS.items():
        assert len(f.metadata["help"].split()) >= 4, f"{name} needs a help text"


def test_the_cli_defaults_are_the_python_defaults():
    args = pack_parser().parse_args(["src.npy", "out"])
    assert PackSettings.from_args(args) == PackSettings()


def test_every_flag_lands_in_its_field():
    argv = [
        "src.nc",
        "out",
        "--format",
        "webdataset",
        "--cf",
        "5",
        "--mask",
        "triangle",
        "--quant",
        "int8",
        "--target-psnr",
        "noisy=40,clean=45",
        "--field",
        "m=array",
        "--field",
        "n=label",
        "--key",
        "a",
        "--key",
        "b",
        "--no-channels-last",
        "--nan",
        "fill=0",
        "--valid",
        "x=m",
        "--sample-dim",
        "time",
        "--variables",
        "u,v",
        "--stack",
        "uv",
        "--allow-external",
        "--lossless",
        "zstd:5",
        "--strict",
        "--overwrite",
        "--quiet",
        "--workers",
        "2",
        "--resume",
        "--max-shard-size",
        "64MiB",
        "--samples-per-shard",
        "8",
    ]
    s = PackSettings.from_args(pack_parser().parse_args(argv))
    assert (s.format, s.cf, s.mask, s.quant, s.target_psnr) == (
        "webdataset",
        5,
        "triangle",
        "int8",
        "noisy=40,clean=45",
    )
    assert s.fields == ["m=array", "n=label"] and s.key == ["a", "b"] and s.channels_last is False
    assert (s.nan, s.valid, s.sample_dim, s.variables, s.stack) == ("fill=0", ["x=m"], "time", "u,v", "uv")
    assert s.allow_external is True and s.source_options["allow_external"] is True
    assert s.lossless == {"id": "zstd", "level": 5} and s.strict and s.overwrite and s.quiet and s.resume
    assert (s.workers, s.scheduler, s.max_shard_size, s.samples_per_shard) == (2, None, "64MiB", 8)
    # the parsed forms the pack works with
    assert s.targets == Targets(None, {"noisy": 40.0, "clean": 45.0})
    assert {k: str(v) for k, v in s.overrides.items()} == {"m": "array", "n": "label"}
    assert s.nan_policy == NanPolicy("fill", 0.0) and s.valid_masks == {"x": "m"}
    assert s.writer_config == {"max_shard_size": 64 << 20, "samples_per_shard": 8}
    assert s.lossless_stage == {"id": "zstd", "level": 5} and s.dtype == "int8"


def test_the_record_is_the_manifests_pack_entry():
    s = PackSettings(target_psnr={"noisy": 40}, fields={"m": "array"}, nan="mask", quant="int8")
    assert s.record() == {
        "format": "zarr",
        "cf": None,
        "mask": None,
        "quant": "int8",
        "target_psnr": {"noisy": 40.0},
        "max_error": None,
        "max_rel_error": None,
        "fields": {"m": "array"},
        "key": None,
        "channels_last": False,
        "nan": "mask",
        "valid": {},
        "sample_dim": None,
        "time_dim": None,
        "variables": None,
        "stack": None,
        "codec": "auto",
        "dims": 2,
    }


def test_dims_and_the_volume_masks():
    args = pack_parser().parse_args(["src.nc", "out", "--dims", "3", "--mask", "tetra"])
    s = PackSettings.from_args(args)
    assert (s.dims, s.mask, s.record()["dims"], s.source_options["dims"]) == (3, "tetra", 3, 3)
    with pytest.raises(DctDataError, match=r"--mask cube: expected --dims 3 \(a volume mask"):
        PackSettings(mask="cube")
    with pytest.raises(DctDataError, match=r"--dims: expected 2 or 3"):
        PackSettings(dims=4)


def test_settings_are_frozen_and_exported():
    s = dctdata.PackSettings(cf=4)
    assert dctdata.PackSettings is PackSettings
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.cf = 5
    assert dataclasses.replace(s, cf=6).cf == 6
    with pytest.raises(TypeError):
        PackSettings(4)  # keywords only


def test_settings_object_packs_what_the_keywords_pack(tmp_path):
    x = np.random.default_rng(0).random((4, 1, 16, 16), dtype=np.float32)
    a = dctdata.pack(x, tmp_path / "a", cf=3, quant="fp16", quiet=True)
    b = dctdata.pack(x, tmp_path / "b", settings=PackSettings(cf=3, quant="fp16", quiet=True))
    assert a.fields == b.fields and a.pack == b.pack
    with dctdata.Writer(tmp_path / "w", settings=PackSettings(cf=3, quant="fp16")) as w:
        for sample in x:
            w.write(sample)
    assert w.manifest.fields == a.fields


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (
            dict(settings=PackSettings(), cf=4),
            dctdata.DctDataError,
            r"pack: expected the settings as keywords or as "
            r"settings=PackSettings\(\.\.\.\)\. Got both \(settings= and cf=\)",
        ),
        (dict(settings={"cf": 4}), TypeError, r"pack: settings: expected a PackSettings\. Got dict"),
        (
            dict(max_shard_size="1MiB"),
            dctdata.DctDataError,
            r"--max-shard-size/--samples-per-shard/--samples-per-member: expected --format webdataset\. Got "
            r"--format zarr",
        ),
        (
            dict(format="webdataset", max_shard_size="huge"),
            dctdata.DctDataError,
            r"--max-shard-size: expected a size in bytes",
        ),
        (
            dict(format="webdataset", samples_per_shard=4, writer_options={"samples_per_shard": 8}),
            dctdata.DctDataError,
            r"samples_per_shard: expected it once\. Got samples_per_shard=4 and writer_options "
            r"\{'samples_per_shard': 8\}",
        ),
        (dict(writer_options=[("a", 1)]), TypeError, r"writer_options: expected a mapping\. Got list"),
        (dict(workers=0), dctdata.DctDataError, r"--workers: expected a positive int\. Got 0"),
    ],
)
def test_bad_settings_are_one_clear_error(tmp_path, kwargs, error, message):
    with pytest.raises(error, match=message):
        dctdata.pack(np.zeros((2, 8, 8), np.float32), tmp_path / "out", quiet=True, **kwargs)
    assert not (tmp_path / "out").exists()


def test_the_writer_refuses_what_only_pack_takes(tmp_path):
    with pytest.raises(dctdata.DctDataError, match=r"Writer: workers: expected a setting that applies to a stream"):
        dctdata.Writer(tmp_path / "w", settings=PackSettings(workers=2))
    with pytest.raises(dctdata.DctDataError, match=r"Writer: expected the settings as keywords or as settings="):
        dctdata.Writer(tmp_path / "w", cf=4, settings=PackSettings())
    assert not (tmp_path / "w").exists()


def test_shard_settings_from_python_reach_the_webdataset_writer(tmp_path):
    x = np.random.default_rng(1).random((10, 1, 16, 16), dtype=np.float32)
    m = dctdata.pack(x, tmp_path / "a", format="webdataset", samples_per_shard=4, cf=4, quiet=True)
    assert [s["samples"] for s in m.layout["shards"]] == [4, 4, 2]
    with dctdata.Writer(tmp_path / "w", format="webdataset", samples_per_shard=5, cf=4) as w:
        for sample in x:
            w.write(sample)
    assert [s["samples"] for s in w.manifest.layout["shards"]] == [5, 5]


def test_bounds_parse_like_targets_and_are_recorded():
    s = PackSettings(max_error="0.5,p=2", max_rel_error={"t": 1e-3})
    assert s.bounds.get("p") == {"max_error": 2.0} and s.bounds.get("u") == {"max_error": 0.5}
    assert s.bounds.get("t") == {"max_error": 0.5, "max_rel_error": 1e-3}
    assert s.bounds.named == {"p": "--max-error", "t": "--max-rel-error"} and bool(s.bounds)
    assert not PackSettings().bounds
    rec = s.record()
    assert rec["max_error"] == {"*": 0.5, "p": 2.0} and rec["max_rel_error"] == {"t": 1e-3}


def test_the_old_spelling_codec_is_taken_with_a_warning_naming_lossless(tmp_path):
    """`lossless` was `codec` (which is also a FieldSpec's CodecSpec): the old keyword still works from
    PackSettings, pack and Writer, warns at the caller's line, and cannot be given with the new one."""
    zstd = {"id": "zstd", "level": 3}
    message = r"codec= is deprecated: the setting is now called lossless="
    with pytest.warns(DeprecationWarning, match="PackSettings: " + message) as caught:
        s = PackSettings(codec=zstd, cf=4)
    assert caught[0].filename == __file__  # the warning names the caller's line
    assert s == PackSettings(lossless=zstd, cf=4) and s.lossless_stage == zstd and s.record()["codec"] == zstd
    x = np.random.default_rng(2).random((3, 1, 16, 16), dtype=np.float32)
    with pytest.warns(DeprecationWarning, match="pack: " + message) as caught:
        m = dctdata.pack(x, tmp_path / "p", cf=4, codec=zstd, quiet=True)
    assert caught[0].filename == __file__
    assert m.field("image").lossless == zstd
    with pytest.warns(DeprecationWarning, match="Writer: " + message) as caught:
        w = dctdata.Writer(tmp_path / "w", cf=4, codec=zstd)
    assert caught[0].filename == __file__
    with w:
        for sample in x:
            w.write(sample)
    assert w.manifest.fields == m.fields
    both = r"expected lossless= alone\. Got both lossless= and its old spelling codec="
    with pytest.warns(DeprecationWarning), pytest.raises(DctDataError, match="pack: " + both):
        dctdata.pack(x, tmp_path / "b", codec=zstd, lossless={"id": "zstd", "level": 9})
    with pytest.warns(DeprecationWarning), pytest.raises(DctDataError, match="PackSettings: " + both):
        PackSettings(codec=zstd, lossless=None)
    assert not (tmp_path / "b").exists()
    assert dataclasses.replace(s, cf=5).lossless == zstd  # replace() does not see the old keyword
