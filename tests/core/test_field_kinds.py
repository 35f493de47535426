"""`dctdata.format.kinds`: each field kind owns its checks, encode, decode and description, registered by name
(adding a kind is a `FieldKind` member and one class)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dctdata.codec.spec import CodecSpec
from dctdata.errors import DctDataError
from dctdata.format import FieldSpec, kinds
from dctdata.kinds import FieldKind


def _dct(shape=(1, 16, 16), **codec) -> FieldSpec:
    c, h, w = shape
    return FieldSpec("x", "dct", shape, "float32", CodecSpec(cf=4, channels=c, height=h, width=w, **codec))


def test_every_kind_is_registered_by_name():
    assert set(kinds.names()) == set(FieldKind)
    for k in FieldKind:
        assert kinds.get(k) is kinds.get(k.value) and kinds.get(k).kind is k
    assert [k for k in FieldKind if kinds.get(k).coded] == [kinds.CODED]
    assert not kinds.get(kinds.EXACT).coded
    with pytest.raises(DctDataError, match=r"kind: expected one of \('dct', 'array', 'label'\)\. Got 'jpeg'"):
        kinds.get("jpeg")
    with pytest.raises(TypeError, match=r"register: expected a Kind\. Got str"):
        kinds.register("dct")


def test_a_field_spec_is_checked_by_its_kind():
    with pytest.raises(DctDataError, match=r"field 'y': shape: expected \(\) for a label field"):
        FieldSpec("y", "label", (2,), "int64")
    with pytest.raises(DctDataError, match=r"field 'y': codec: expected None for a array field"):
        FieldSpec("y", "array", (1, 16, 16), "float32", _dct().codec)
    with pytest.raises(DctDataError, match=r"field 'x': codec: expected a CodecSpec for a dct field\. Got None"):
        FieldSpec("x", "dct", (1, 16, 16), "float32")
    with pytest.raises(DctDataError, match=r"field 'x': dtype: expected a numeric dtype for a dct field"):
        FieldSpec("x", "dct", (1, 16, 16), "bool", _dct().codec)
    f = _dct()
    assert f.coded and f.is_dct and f.kind_type is kinds.get("dct")
    assert not FieldSpec("y", "label", (), "int64").coded


def test_source_checks_name_the_field():
    with pytest.raises(DctDataError, match=r"src: field 'y': expected one scalar per sample for kind label"):
        kinds.get("label").check_source("y", (3,), np.dtype("int64"), "src")
    with pytest.raises(DctDataError, match=r"src: field 'm': expected numbers for kind dct\. Got bool"):
        kinds.get("dct").check_source("m", (8, 8), np.dtype("bool"), "src")
    kinds.get("array").check_source("m", (8, 8), np.dtype("bool"), "src")  # anything numeric is stored exactly


def test_exact_kinds_store_and_decode_values_as_given():
    f = FieldSpec("a", "array", (3,), "int64")
    big = np.arange(6, dtype=">i8").reshape(2, 3)
    stored = f.kind_type.store(f, big, "sample 4")
    assert stored.dtype == np.dtype("<i8") and np.array_equal(stored, big)
    with pytest.raises(DctDataError, match=r"sample 4: field 'a': expected dtype int64 like sample 0\. Got int32"):
        f.kind_type.store(f, big.astype(np.int32), "sample 4")
    decoded = f.kind_type.decode(f, stored[0])
    assert isinstance(decoded, torch.Tensor) and decoded.tolist() == [0, 1, 2]
    assert f.kind_type.layer(f) is None and f.kind_type.batch_shape(f, 2) == (3,)


def test_the_coded_kind_decodes_through_its_layer():
    f = _dct((1, 16, 16))
    assert f.kind_type.batch_shape(f, 3) == (16, 16) and f.kind_type.batch_shape(f, 4) == (1, 16, 16)
    with pytest.raises(TypeError, match=r"field 'x': a dct field is stored by the encoder"):
        f.kind_type.store(f, np.zeros((1, 16, 16), np.float32), "sample 0")
    layer = f.kind_type.layer(f)
    x = torch.linspace(0, 1, 256).reshape(1, 1, 16, 16)
    from dctdata.encoder.quantize import encode

    wire, _ = encode(x, f.codec)
    out = f.kind_type.decode(f, wire, layer)
    assert out.shape == (1, 1, 16, 16) and float((out - x).abs().max()) < 0.05
    assert f.kind_type.decode(f, wire) is wire  # without a layer, the stored value as it is


def test_kinds_describe_themselves():
    dct, label = _dct(), FieldSpec("y", "label", (), "int64")
    arr = FieldSpec("a", "array", (4, 4), "uint8")
    assert dct.kind_type.describe(dct) == "cf=4 square float32"
    bounded = _dct(dtype="int8", steps=[[0.01] * 16], side="range_mid", max_error=0.01)
    assert bounded.kind_type.describe(bounded).startswith("cf=4 square int8, --max-error 0.01")
    assert arr.kind_type.describe(arr) == label.kind_type.describe(label) == "exact"
    assert dct.kind_type.transfer_ratio(dct) == dct.codec.transfer_ratio
    assert arr.kind_type.transfer_ratio(arr) == 4.0 and label.kind_type.transfer_ratio(label) is None
    assert not label.kind_type.ratios and arr.kind_type.ratios
