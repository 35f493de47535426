"""CodecSpec: validation, derived sizes, JSON config round trip."""

import json

import pytest

import dctdata
from dctdata import CodecSpec


def full_spec():
    return CodecSpec(
        cf=3,
        mask="triangle",
        channels=2,
        height=61,
        width=77,
        dtype="int8",
        steps=[[0.5] * 6, [0.25] * 6],
        offsets=[[1.0] + [0.0] * 5, [2.0] + [0.0] * 5],
        mean=[0.5, 1.5],
        std=[2.0, 3.0],
    )


@pytest.mark.parametrize("spec", [CodecSpec(cf=4, height=8, width=8), full_spec()])
def test_json_config_round_trips_and_equality_is_config_equality(spec):
    config = json.loads(json.dumps(spec.to_dict()))
    again = CodecSpec.from_dict(config)
    assert again == spec and hash(again) == hash(spec)
    assert again.to_dict() == spec.to_dict()
    assert CodecSpec.from_dict({**config, "height": spec.height + 1}) != spec


def test_derived_shapes_and_transfer_ratio():
    spec = CodecSpec(cf=4, height=61, width=77, channels=3, dtype="int8", steps=[[1.0] * 16] * 3)
    assert spec.kept == 16 and spec.grid == (8, 10)
    assert spec.coeff_shape == (3, 8, 16, 10)
    assert spec.sample_shape == (3, 61, 77)
    # 61*77 float32 pixels vs 8*10 blocks * 16 int8 coefficients (padding costs a little)
    assert spec.transfer_ratio == pytest.approx(61 * 77 * 32 / (8 * 10 * 16 * 8))
    assert CodecSpec(cf=4, height=64, width=64).transfer_ratio == pytest.approx(64 / 16)


@pytest.mark.parametrize(
    "alias, name", [("none", "float32"), ("fp16", "float16"), ("bf16", "bfloat16"), ("float16", "float16")]
)
def test_quant_aliases_normalize_to_wire_dtypes(alias, name):
    assert CodecSpec(cf=2, height=8, width=8, dtype=alias).dtype == name


@pytest.mark.parametrize(
    "kwargs, err, msg",
    [
        ({"cf": 9}, dctdata.DctDataError, r"cf: expected an int in 1\.\.8\. Got 9"),
        ({"mask": "disk"}, dctdata.DctDataError, r"mask: expected one of"),
        ({"height": 0}, dctdata.DctDataError, r"height: expected a positive int\. Got 0"),
        ({"channels": 1.5}, TypeError, r"channels: expected a positive int"),
        ({"dtype": "int4"}, dctdata.DctDataError, r"dtype: expected one of .* Got 'int4'"),
        ({"dtype": "int8"}, dctdata.DctDataError, r"steps: expected a \(C x K\) table for integer dtype 'int8'"),
        ({"steps": [[1.0] * 3]}, dctdata.DctDataError, r"steps: expected shape \(1, 4\)\. Got \(1, 3\)"),
        ({"steps": [[1.0, 0.0, 1.0, 1.0]]}, dctdata.DctDataError, r"steps: expected values > 0"),
        ({"steps": [[1.0, float("nan"), 1.0, 1.0]]}, dctdata.DctDataError, r"steps: expected finite values"),
        ({"mean": [0.0]}, dctdata.DctDataError, r"mean/std: expected both or neither"),
        ({"std": [0.0], "mean": [0.0]}, dctdata.DctDataError, r"std: expected values > 0"),
        ({"block": 16}, dctdata.DctDataError, r"block: expected 8\. Got 16"),
        ({"steps": "abc"}, TypeError, r"steps: expected nested numbers of shape \(1, 4\)"),
    ],
)
def test_invalid_specs_are_clear_errors(kwargs, err, msg):
    base = dict(cf=2, height=8, width=8)
    with pytest.raises(err, match=msg):
        CodecSpec(**{**base, **kwargs})


def test_from_dict_rejects_unknown_and_missing_keys():
    config = CodecSpec(cf=2, height=8, width=8).to_dict()
    with pytest.raises(dctdata.DctDataError, match=r"unknown keys \['colour'\]"):
        CodecSpec.from_dict({**config, "colour": "red"})
    config.pop("height")
    with pytest.raises(dctdata.DctDataError, match=r"missing keys \['height'\]"):
        CodecSpec.from_dict(config)
    with pytest.raises(TypeError, match="expected a mapping"):
        CodecSpec.from_dict([1, 2])


def test_spec_is_frozen():
    spec = CodecSpec(cf=2, height=8, width=8)
    with pytest.raises(AttributeError):
        spec.cf = 3
