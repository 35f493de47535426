"""dctdata.preprocess.journal: the --resume journal keeps calibrated specs and finished parts, survives a
line cut short by kill -9, and trusts a part only while its files keep their journaled sha256."""

from __future__ import annotations

import json
import os

import pytest

from dctdata.codec.spec import CodecSpec
from dctdata.errors import DctDataError
from dctdata.format import FieldSpec
from dctdata.format.checksum import sha256_file
from dctdata.preprocess.journal import JOURNAL_NAME, Journal

SPECS = (
    FieldSpec(
        "image", "dct", (1, 8, 8), "float32", CodecSpec(cf=2, height=8, width=8, dtype="int8", steps=[[0.5] * 4])
    ),
    FieldSpec("label", "label", (), "int64"),
)
SETTINGS = {"source": "s.npz", "format": "zarr", "target_psnr": 40}


def part(root, i, payload: bytes) -> dict:
    rel = f"image/c.{i}.0.0.0.0"
    os.makedirs(os.path.join(root, "image"), exist_ok=True)
    with open(os.path.join(root, rel), "wb") as fh:
        fh.write(payload)
    sha, size = sha256_file(os.path.join(root, rel))
    return {"index": i, "start": 4 * i, "stop": 4 * i + 4, "files": {rel: {"sha256": sha, "bytes": size}}, "stats": {}}


def test_round_trip_of_specs_and_parts(tmp_path):
    j = Journal.start(str(tmp_path), SETTINGS, SPECS)
    for i in range(3):
        j.record(part(str(tmp_path), i, bytes([i]) * 10))
    back = Journal.resume(str(tmp_path), dict(SETTINGS))
    assert back.specs == SPECS and back.derived == ()
    assert sorted(back.verified([(0, 4), (4, 8), (8, 12)])) == [0, 1, 2]


def test_a_line_cut_short_is_ignored(tmp_path):
    j = Journal.start(str(tmp_path), SETTINGS, SPECS)
    j.record(part(str(tmp_path), 0, b"a" * 10))
    with open(tmp_path / JOURNAL_NAME, "a") as fh:
        fh.write('{"kind": "part", "result": {"index": 1, "st')  # killed mid-write
    assert sorted(Journal.resume(str(tmp_path), SETTINGS).parts) == [0]


def test_changed_files_and_other_plans_are_redone(tmp_path):
    j = Journal.start(str(tmp_path), SETTINGS, SPECS)
    for i in range(3):
        j.record(part(str(tmp_path), i, bytes([i]) * 10))
    with open(tmp_path / "image" / "c.1.0.0.0.0", "r+b") as fh:
        fh.write(b"\xff")
    os.remove(tmp_path / "image" / "c.2.0.0.0.0")
    assert sorted(j.verified([(0, 4), (4, 8), (8, 12)])) == [0]
    assert j.verified([(0, 5)]) == {}  # a different plan: nothing carries over


def test_other_settings_or_no_journal_refused(tmp_path):
    Journal.start(str(tmp_path), SETTINGS, SPECS)
    with pytest.raises(
        DctDataError, match=r"expected the settings of the interrupted pack\. Got different target_psnr"
    ):
        Journal.resume(str(tmp_path), {**SETTINGS, "target_psnr": 45})
    os.remove(tmp_path / JOURNAL_NAME)
    with pytest.raises(DctDataError, match=r"--resume: expected a progress journal"):
        Journal.resume(str(tmp_path), SETTINGS)


def test_journal_lines_are_json(tmp_path):
    Journal.start(str(tmp_path), SETTINGS, SPECS).record(part(str(tmp_path), 0, b"x"))
    lines = [json.loads(line) for line in (tmp_path / JOURNAL_NAME).read_text().splitlines()]
    assert [d["kind"] for d in lines] == ["header", "part"] and lines[0]["fields"][0]["codec"]["dtype"] == "int8"


def test_the_mask_fields_a_pack_makes_are_journaled(tmp_path):
    specs = (
        FieldSpec("image", "dct", (1, 8, 8), "float32", SPECS[0].codec, valid="image_valid"),
        FieldSpec("image_valid", "array", (1, 8, 8), "bool"),
    )
    Journal.start(str(tmp_path), SETTINGS, specs, ("image_valid",))
    back = Journal.resume(str(tmp_path), dict(SETTINGS))
    assert back.specs == specs and back.derived == ("image_valid",)


def test_parts_another_format_version_wrote_are_redone(tmp_path, caplog):
    """A journal of a dctdata before format 8 (its header has no format version): its one-chunk files had a
    shard index that this version's zarr metadata does not describe, so its parts are redone."""
    j = Journal.start(str(tmp_path), SETTINGS, SPECS)
    j.record(part(str(tmp_path), 0, b"a" * 10))
    lines = (tmp_path / JOURNAL_NAME).read_text().splitlines()
    header = json.loads(lines[0])
    assert sorted(Journal.resume(str(tmp_path), SETTINGS).parts) == [0]  # the same version: kept
    del header["format_version"]
    (tmp_path / JOURNAL_NAME).write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    with caplog.at_level("WARNING"):
        assert Journal.resume(str(tmp_path), SETTINGS).parts == {}
    assert "written for another format version; redoing them" in caplog.text
