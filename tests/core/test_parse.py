"""dctdata.parse and dctdata.kinds: the one place values are validated, with the project's messages."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dctdata.errors import DctDataError, FormatError
from dctdata.kinds import FIELD_KINDS, FieldKind
from dctdata.parse import (
    is_int,
    is_number,
    parse_choice,
    parse_int,
    parse_number,
    parse_object,
    parse_optional_int,
    parse_size,
)


def test_ints_are_never_bools():
    assert is_int(3) and is_int(np.int64(3)) and not is_int(True) and not is_int(np.bool_(True)) and not is_int(3.0)
    assert is_number(2.5) and is_number(np.float32(1)) and not is_number(False) and not is_number("1")


def test_parse_int_bounds_and_messages():
    assert parse_int(np.int16(5), "n", minimum=1) == 5 and type(parse_int(np.int16(5), "n")) is int
    with pytest.raises(TypeError, match=r"^n: expected an int >= 1\. Got True$"):
        parse_int(True, "n", minimum=1)
    with pytest.raises(DctDataError, match=r"^cf: expected an int in 1\.\.8\. Got 9$"):
        parse_int(9, "cf", minimum=1, maximum=8)
    with pytest.raises(FormatError, match=r"^samples: expected a count\. Got '3'$"):
        parse_int("3", "samples", expected="a count", type_error=FormatError)
    with pytest.raises(TypeError, match="unexpected keywords"):
        parse_int(1, "n", minimun=1)
    assert parse_optional_int(None, "n", minimum=1) is None


def test_parse_number_rejects_non_finite_and_out_of_range():
    assert parse_number(40, "db", above=0, below=200) == 40.0
    for bad in (0, 200, float("nan"), float("inf")):
        with pytest.raises(DctDataError, match=r"db: expected a finite number > 0 and < 200\. Got"):
            parse_number(bad, "db", above=0, below=200)
    with pytest.raises(TypeError, match=r"db: expected dB\. Got '40'"):
        parse_number("40", "db", expected="dB")
    assert parse_number(0.0, "f", minimum=0.0) == 0.0


def test_parse_choice_and_object():
    assert parse_choice("zarr", "--format", ("zarr", "webdataset")) == "zarr"
    with pytest.raises(DctDataError, match=r"--format: expected one of \('zarr', 'webdataset'\)\. Got 'tar'"):
        parse_choice("tar", "--format", ("zarr", "webdataset"))
    assert parse_object({"a": 1}, "x", {"a"}, {"b"}) == {"a": 1}
    with pytest.raises(FormatError, match=r"x: expected keys \['a', 'b'\]\. Got unknown keys \['c'\]"):
        parse_object({"a": 1, "c": 2}, "x", {"a"}, {"b"}, error=FormatError)
    with pytest.raises(DctDataError, match=r"x: expected keys \['a'\]\. Got missing keys \['a'\]"):
        parse_object({}, "x", {"a"})
    with pytest.raises(DctDataError, match=r"x: expected a JSON object\. Got \[1\]"):
        parse_object([1], "x", {"a"})


def test_field_kind_is_one_type_that_reads_and_writes_its_name():
    assert FIELD_KINDS == ("dct", "array", "label")
    assert FieldKind.parse("dct") is FieldKind.DCT and FieldKind.parse(FieldKind.LABEL) is FieldKind.LABEL
    assert FieldKind.DCT == "dct" and f"{FieldKind.ARRAY}" == "array" and repr(FieldKind.LABEL) == "'label'"
    assert json.dumps({"kind": FieldKind.DCT}) == '{"kind": "dct"}'
    with pytest.raises(DctDataError, match=r"kind: expected one of \('dct', 'array', 'label'\)\. Got 'jpeg'"):
        FieldKind.parse("jpeg")


@pytest.mark.parametrize(
    "text, n",
    [(4096, 4096), ("4096", 4096), ("1MiB", 1 << 20), ("256 MiB", 256 << 20), ("64k", 65536), ("2G", 2 << 30),
     ("1.5 GB", 1_500_000_000), ("2KB", 2000), ("10b", 10), (" 3 kib ", 3072)],
)  # fmt: skip
def test_parse_size_reads_units_as_help_writes_them(text, n):
    assert parse_size(text, "--max-shard-size") == n


def test_parse_size_errors():
    for bad in ("lots", "1 XB", "-1", "", "1.2.3", "MiB"):
        with pytest.raises(DctDataError, match=r"--max-shard-size: expected a size in bytes such as 4096"):
            parse_size(bad, "--max-shard-size")
    with pytest.raises(TypeError, match="cache_limit: expected a size"):
        parse_size(1.5, "cache_limit")
    with pytest.raises(DctDataError, match=r"cache_limit: expected a size .* >= 1. Got '0'"):
        parse_size("0", "cache_limit", minimum=1)
