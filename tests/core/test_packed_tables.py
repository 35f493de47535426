"""Manifest version 6: a dct codec's large tables (steps, offsets, recon) are stored as base64 of zlib of their
float32 values; the same numbers come back, older manifests may not hold them, and a damaged blob is named."""

from __future__ import annotations

import base64
import json
import zlib

import numpy as np
import pytest

from dctdata.codec.spec import CodecSpec
from dctdata.codec.transform3d import num_kept
from dctdata.errors import FormatError
from dctdata.format import FieldSpec
from dctdata.format.fields import PACK_MIN_VALUES, TABLES_VERSION, pack_tables, unpack_tables


def _volume_field(channels: int = 2) -> FieldSpec:
    """A volume codec with per-frequency steps (int8 floors on a few frequencies) and reconstruction offsets."""
    k = num_kept(8, "cube")
    rng = np.random.default_rng(0)
    steps = np.full((channels, k), 0.03, np.float32)
    steps[:, rng.choice(k, 40, replace=False)] = rng.uniform(0.03, 0.2, 40).astype(np.float32)
    recon = np.round(rng.uniform(-0.2, 0.2, (channels, k)) * 100) / 100
    spec = CodecSpec(cf=8, mask="cube", depth=25, height=41, width=33, channels=channels, dtype="int8",
                     steps=steps.tolist(), recon=recon.tolist(), theta=0.4, side="range_mid")  # fmt: skip
    return FieldSpec("vol", "dct", (channels, 25, 41, 33), "int16", spec, {"id": "zstd", "level": 19})


def test_large_tables_are_packed_and_read_back_exactly():
    f = _volume_field()
    packed, plain = f.to_dict(), f.to_dict(packed=False)
    assert set(packed["codec"]["steps"]) == {"f32z"} and set(packed["codec"]["recon"]) == {"f32z"}
    assert isinstance(plain["codec"]["steps"], list)
    assert len(json.dumps(packed)) < len(json.dumps(plain)) / 4
    back = FieldSpec.from_dict(json.loads(json.dumps(packed)), version=TABLES_VERSION)
    assert back == f and back.codec.steps == f.codec.steps and back.codec.recon == f.codec.recon
    assert FieldSpec.from_dict(plain, version=TABLES_VERSION) == f  # a version 6 reader reads lists too


def test_small_and_per_channel_tables_stay_numbers():
    spec = CodecSpec(cf=2, height=16, width=16, dtype="int8", steps=[[0.1, 0.2, 0.3, 0.4]], recon=[[0.0] * 4])
    assert spec.kept < PACK_MIN_VALUES
    d = pack_tables(spec.to_dict())
    assert d["steps"] == [[0.1, 0.2, 0.3, 0.4]] and d["recon"] == [0.0]  # constant rows: one value per channel
    per_channel = CodecSpec(cf=8, height=16, width=16, dtype="int8", steps=[0.1]).to_dict()
    assert pack_tables(per_channel) == per_channel


def test_an_older_manifest_may_not_hold_packed_tables():
    d = _volume_field().to_dict()
    with pytest.raises(FormatError, match=r"codec: steps: expected a list of numbers in a version 5 manifest"):
        FieldSpec.from_dict(d, version=TABLES_VERSION - 1)


def _blob(raw: bytes) -> dict:
    return {"f32z": base64.b64encode(zlib.compress(raw)).decode()}


@pytest.mark.parametrize(
    "table, message",
    [
        ({"f32z": "not base64!"}, r"steps: expected base64 of zlib-compressed float32 values"),
        ({"f32z": base64.b64encode(b"plain bytes").decode()}, r"steps: expected base64 of zlib-compressed float32"),
        ({"f32z": 7}, r"steps: expected \{'f32z': base64 text\} and an int channels"),
        ({"f32z": "", "shape": [2, 512]}, r"steps: expected \{'f32z': base64 text\}"),
        (_blob(b"\0" * 6), r"steps: expected one zlib stream of 2 rows of at most 512 float32 values\. Got 6 bytes"),
        (_blob(b"\0" * (2 * 513 * 4)), r"of at most 512 float32 values\. Got 4097 bytes"),  # a bomb stops early
        ({"f32z": base64.b64encode(zlib.compress(b"\0" * 8)[:-3]).decode()}, r"a stream that does not end there"),
    ],
)
def test_a_damaged_table_is_named(table, message):
    d = _volume_field().to_dict()
    d["codec"]["steps"] = table
    with pytest.raises(FormatError, match=message):
        FieldSpec.from_dict(d, version=TABLES_VERSION)


def test_unpacking_leaves_plain_codecs_alone():
    plain = _volume_field().to_dict(packed=False)["codec"]
    assert unpack_tables(plain, TABLES_VERSION) is plain and unpack_tables(None, 1) is None
