"""`dctdata.format.kinds`: each field kind owns its checks, encode, decode and description, registered by name,
and no module outside the kind modules compares kind names (adding a kind is a `FieldKind` member and one class)."""

from __future__ import annotations

import ast
import dataclasses
import pathlib

import numpy as np
import pytest
import torch

from dctdata.codec.spec import CodecSpec
from dctdata.errors import DctDataError
from dctdata.format import FieldSpec, FieldStats, Manifest, kinds
from dctdata.kinds import FieldKind
from dctdata.report import num

ROOT = pathlib.Path(__file__).resolve().parents[2]
# The kind modules: the names (the manifest's) and their behaviour. Nothing else names a kind to branch on.
KIND_MODULES = (ROOT / "dctdata" / "kinds.py", ROOT / "dctdata" / "format" / "kinds.py")
KIND_NAMES = {k.value for k in FieldKind}


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
    stats = FieldStats(31.5, 33.25, 0.125, 2, 32.0, None, 0.5)
    line = dct.kind_type.summary(dct, stats, num)
    assert line.startswith(" cf=4 square float32 zstd: PSNR min 31.50 / median 33.25 / dataset 32.00 dB")
    assert line.endswith("max error 0.125, overflow 2, 50.0% valid pixels")
    assert arr.kind_type.summary(arr, stats, num) == ""


def test_the_only_coded_field_is_found_by_the_manifest():
    fields = (_dct(), FieldSpec("y", "label", (), "int64"))
    m = Manifest(storage="zarr", samples=1, fields=fields)
    assert m.coded_field().name == "x" and m.coded_field("y").name == "y"
    two = Manifest(storage="zarr", samples=1, fields=(*fields, dataclasses.replace(_dct(), name="z")))
    with pytest.raises(DctDataError, match=r"expected a field name; this dataset has 2 dct fields \['x', 'z'\]"):
        two.coded_field()


def kind_name_uses(path: pathlib.Path) -> list[str]:
    """Where a module names a kind to branch on: `FieldKind.DCT`, `.is_dct`, `kind == "dct"`, `x.kind in ("dct",
    ...)`, `kind="label"` (a comparison or keyword whose other side says `kind`)."""
    found = []
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            member = isinstance(node.value, ast.Name) and node.value.id == "FieldKind" and node.attr.isupper()
            if member or node.attr == "is_dct":
                found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            consts = [c for s in sides for c in ([s] if isinstance(s, ast.Constant) else getattr(s, "elts", []))]
            named = {c.value for c in consts if isinstance(c, ast.Constant) and c.value in KIND_NAMES}
            if named and any("kind" in ast.unparse(s) for s in sides if not isinstance(s, ast.Constant)):
                found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.keyword) and node.arg == "kind":
            if isinstance(node.value, ast.Constant) and node.value.value in KIND_NAMES:
                found.append(f"{path.name}:{node.lineno}: kind={node.value.value!r}")
    return found


def test_no_kind_name_compared_outside_the_kind_modules():
    """Callers ask the field's kind (`f.kind_type.describe(f)`, `f.coded`, `kinds.CODED`) instead of comparing
    names, so a new kind is one class in `dctdata.format.kinds`, not a branch in every module."""
    found = []
    for folder in ("dctdata", "preprocess", "loaders"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path not in KIND_MODULES:
                found += kind_name_uses(path)
    assert not found, found


def test_the_kind_name_check_catches_each_form(tmp_path):
    path = tmp_path / "x.py"
    for source in (
        "if f.kind is FieldKind.DCT: pass\n",
        "ok = f.is_dct\n",
        'ok = f.kind == "label"\n',
        'ok = "array" != spec.kind\n',
        'ok = kind in ("dct", "x")\n',
        'f = m.field(None, kind="dct")\n',
    ):
        path.write_text(source)
        assert kind_name_uses(path), source
    path.write_text('ok = meta.get("node_type") != "array"\nok = dtype.kind == "b"\nfields = {"image": "dct"}\n')
    assert not kind_name_uses(path)
