"""The registry is the allow-list of what a manifest may name (numcodecs can build codecs whose decoder
runs pickle): configs naming anything else fail, a stage is built once per process per config, `{}` is
the raw stage, `--lossless` spellings come from the registered stages, and registering checks what the
readers rely on (new ids, suffixes and spellings)."""

import json
import pathlib

import numpy as np
import pytest

import dctdata
import dctdata.stages.registry as registry
from dctdata.format import parse_manifest
from dctdata.stages import (
    AUTO,
    RAW,
    BytesStage,
    RawStage,
    ZstdStage,
    get_stage,
    ids,
    option_spellings,
    parse_config,
    parse_option,
    register,
)

GOLDEN = pathlib.Path(__file__).resolve().parents[1] / "data" / "golden_v1" / "manifest.json"


def test_bad_configs():
    with pytest.raises(dctdata.DctDataError, match="codec: expected a numcodecs config"):
        parse_config({"level": 3})
    with pytest.raises(dctdata.DctDataError, match="codec: expected a numcodecs config"):
        parse_config("zstd")
    for name in ("no-such-codec", "zlib", "pickle", "json2"):
        with pytest.raises(dctdata.DctDataError, match=rf"codec: expected one of .*Got '{name}' \(a manifest may not"):
            parse_config({"id": name})
    with pytest.raises(dctdata.DctDataError, match=r"lossless: expected one of"):
        parse_config({"id": "pickle"}, "lossless")
    for _ in range(2):  # a config that fails to build is never cached: it fails every time
        with pytest.raises(
            dctdata.DctDataError, match=r"codec: expected a blosc config .*Got \{'id': 'blosc', 'no_such"
        ):
            get_stage({"id": "blosc", "no_such_option": 1})


def test_a_manifest_may_name_only_registered_stages():
    d = json.loads(GOLDEN.read_text())
    parse_manifest(json.dumps(d).encode(), "golden")  # as shipped: fine
    d["fields"][1]["lossless"] = {"id": "pickle"}
    with pytest.raises(dctdata.FormatError, match=r"field 'mask': lossless: expected one of .*Got 'pickle'"):
        parse_manifest(json.dumps(d).encode(), "golden")


def test_empty_config_means_the_raw_stage():
    assert get_stage({}) is RAW and get_stage(None) is RAW and parse_config(None) == {} == parse_config({})
    assert isinstance(RAW, RawStage) and RAW.get_config() == {} and RAW.member_suffix == "npy"
    with pytest.raises(dctdata.IntegrityError, match=r"^x: expected 8 bytes of int16 \(4,\)\. Got 7"):
        RAW.decode(b"\0" * 7, (4,), np.int16, "x")


def test_a_stage_is_built_once_per_process_per_config(monkeypatch):
    built = []
    monkeypatch.setattr(registry, "_BUILT", {})
    original = ZstdStage.from_config.__func__
    monkeypatch.setattr(ZstdStage, "from_config", classmethod(lambda cls, c: built.append(c) or original(cls, c)))
    a = get_stage({"id": "zstd", "level": 4})
    assert get_stage({"id": "zstd", "level": 4}) is a and parse_config({"id": "zstd", "level": 4})
    assert get_stage({"id": "zstd", "level": 5}) is not a
    # in its own key order: a stage gives back its config exactly as given (the manifest's bytes)
    b = get_stage({"level": 4, "id": "zstd"})
    assert list(b.get_config()) == ["level", "id"] and list(a.get_config()) == ["id", "level"]
    assert built == [{"id": "zstd", "level": 4}, {"id": "zstd", "level": 5}, {"level": 4, "id": "zstd"}]


class _Fake(BytesStage):
    """A stage as a plugin would add it: numcodecs' zlib behind the registry."""

    codec_id = "test_fake_zlib"
    member_suffix = "npy.fakez"
    decode_bytes_per_us = 100
    option = "fakez"
    option_spellings = ("fakez",)
    option_help = "fakez (a test stage)"

    @classmethod
    def from_config(cls, config):
        return cls(config, cls._numcodecs({"id": "zlib", "level": 1}))

    @classmethod
    def from_option(cls, arg):
        return {"id": cls.codec_id} if arg is None else None


@pytest.fixture
def fake(monkeypatch):
    monkeypatch.setattr(registry, "_STAGES", dict(registry._STAGES))
    monkeypatch.setattr(registry, "_BUILT", {})
    register(_Fake)
    return _Fake


def test_registering_a_stage_is_all_a_new_stage_needs(fake):
    assert ids()[-1] == fake.codec_id and option_spellings()[-1] == "fakez"
    assert parse_option("fakez") == {"id": fake.codec_id} and parse_config({"id": fake.codec_id})
    with pytest.raises(dctdata.DctDataError, match=r"expected one of: auto, zstd, .*fakez\. Got 'fakez:1'"):
        parse_option("fakez:1")
    assert "fakez (a test stage)" in registry.option_help()


def test_registering_checks_ids_suffixes_and_spellings(fake):
    with pytest.raises(dctdata.DctDataError, match=r"register: expected a new codec_id\. Got 'test_fake_zlib'"):
        register(fake)
    with pytest.raises(TypeError, match="register: expected a Stage subclass"):
        register(dict)
    for attrs, message in (
        ({"codec_id": "b", "member_suffix": "npy.fakez"}, r"b: expected a new member suffix\. Got 'npy\.fakez'"),
        ({"codec_id": "c", "member_suffix": "npy"}, r"c: expected a new member suffix\. Got 'npy'"),
        ({"codec_id": "d", "member_suffix": "d", "option": "fakez"}, r"d: expected a new option spelling"),
        ({"codec_id": "e", "member_suffix": "e", "option": AUTO}, r"e: expected a new option spelling"),
    ):
        with pytest.raises(dctdata.DctDataError, match=f"register: {message}"):
            register(type("Other", (fake,), attrs))
    assert ids()[-1] == fake.codec_id  # nothing half-registered


def test_option_types():
    assert parse_option(" auto ") == AUTO
    with pytest.raises(TypeError, match=r"--lossless: expected a string such as 'auto' or 'zstd'. Got int"):
        parse_option(9)
    with pytest.raises(dctdata.DctDataError, match=r"^--codec: expected one of: auto, zstd, .*Got 'auto:1'"):
        parse_option("auto:1", "--codec")


def test_the_cli_help_lists_every_selectable_stage(capsys):
    from dctdata.cli import main

    with pytest.raises(SystemExit):
        main(["pack", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--lossless " + "|".join(s.split(" ")[0] for s in option_spellings()) in help_text
    # the flag's help is the registry's: auto's, then each selectable stage's own, as the stages word it
    # (settings escapes a % for argparse, which undoes it); each selectable stage's help names its spelling
    assert "lossless stage: " + " ".join(registry.option_help().split()) in help_text
    selectable = [s for s in registry._STAGES.values() if s.option is not None]
    assert {s.option for s in selectable} >= {"zstd", "lz4"}
    assert all(s.option_help.startswith(s.option + " (") for s in selectable)
