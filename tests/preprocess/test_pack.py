"""A pack's planning (dctdata.preprocess.plan): field kinds, the calibration subset, the settings parsers,
and the atomic commit's temporary sibling, tested on their own (the whole pack runs through the CLI tests)."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest
from sample_fields import poisson_fields

from dctdata.errors import DctDataError
from dctdata.kinds import FieldKind
from dctdata.preprocess.commit import partial_dir
from dctdata.preprocess.masking import NanPolicy
from dctdata.preprocess.plan import (
    CALIBRATION_SAMPLES,
    DEFAULT_TARGET_PSNR,
    FEW_VALUES,
    calibration_indices,
    default_kind,
    field_plan,
    parse_field_overrides,
    parse_nan,
    plan_fields,
)
from dctdata.preprocess.sources import open_source
from dctdata.settings import PackSettings


def test_default_kinds():
    assert default_kind((8, 8), np.dtype("float32")) is FieldKind.DCT
    assert default_kind((), np.dtype("int64")) is FieldKind.LABEL
    assert default_kind((8, 8), np.dtype("uint8")) is FieldKind.ARRAY  # masks stay exact
    assert default_kind((5,), np.dtype("float64")) is FieldKind.ARRAY


def test_with_a_target_integer_fields_of_few_values_stay_exact_and_say_why(tmp_path):
    """Issue 31's rule: with a lossy setting integer fields are dct, except masks and label maps (at most
    FEW_VALUES distinct values on the calibration subset), which a user expects back exactly."""
    rng = np.random.default_rng(0)
    elevations = (rng.standard_normal((8, 16, 16)).cumsum(-1) * 50).astype(np.int16)  # hundreds of values
    classes = rng.integers(0, FEW_VALUES, (8, 16, 16)).astype(np.int16)  # every class value present
    classes[0].flat[:FEW_VALUES] = np.arange(FEW_VALUES)
    more = classes.copy()
    more[0, 1, 0] = FEW_VALUES  # one value more: no longer "few"
    np.savez(tmp_path / "s.npz", dem=elevations, mask=(elevations > 0).astype(np.uint8), classes=classes, more=more)
    src = open_source(tmp_path / "s.npz")
    common = dict(target_psnr=40, lossless={"id": "zstd", "level": 9})
    specs = {f.name: f for f in plan_fields(src, PackSettings(**common))[0]}
    kinds = {n: specs[n].kind for n in ("dem", "mask", "classes", "more")}
    assert kinds == {"dem": "dct", "mask": "array", "classes": "array", "more": "dct"}
    assert specs["mask"].reason == (
        "uint8 samples holding 2 distinct values on the calibration subset (a mask or label map), stored exactly "
        "(--field mask=dct codes them)"
    )
    assert f"holding {FEW_VALUES} distinct values" in specs["classes"].reason
    assert specs["dem"].reason.startswith("int16 samples of 2-D with a lossy setting")
    forced = {f.name: f for f in plan_fields(src, PackSettings(fields={"mask": "dct"}, **common))[0]}
    assert forced["mask"].kind is FieldKind.DCT and forced["mask"].reason == "--field mask=dct"
    plain = {f.name: f for f in plan_fields(src, PackSettings(**{**common, "target_psnr": None}))[0]}
    assert plain["dem"].kind is FieldKind.ARRAY and plain["more"].kind is FieldKind.ARRAY  # no lossy setting


def test_calibration_subset_is_evenly_spaced_and_sized_by_values():
    small = calibration_indices(10_000, 32 * 32)
    assert len(small) == (1 << 22) // (32 * 32) and small[0] == 0 and small[-1] == 9_999
    big = calibration_indices(10_000, 1024 * 1024)
    assert len(big) == CALIBRATION_SAMPLES and np.all(np.diff(big) > 0)
    assert calibration_indices(5, 16) == [0, 1, 2, 3, 4]


def test_plan_fields_kinds_overrides_and_specs(tmp_path):
    np.savez(
        tmp_path / "s.npz", image=poisson_fields(8, 2, 16, 16), mask=np.ones((8, 16, 16), np.uint8), y=np.arange(8)
    )
    src = open_source(tmp_path / "s.npz")
    common = dict(lossless={"id": "zstd", "level": 9})
    specs = {f.name: f for f in plan_fields(src, PackSettings(**common))[0]}
    assert (specs["image"].kind, specs["mask"].kind, specs["y"].kind) == ("dct", "array", "label")
    assert specs["image"].shape == (2, 16, 16)
    assert specs["image"].codec.min_psnr is not None  # no fidelity flag: calibrated to the default target's floor
    explicit = {f.name: f for f in plan_fields(src, PackSettings(cf=4, **common))[0]}
    assert explicit["image"].codec.cf == 4 and explicit["image"].codec.dtype == "float32"  # --cf alone: as asked
    forced = {
        f.name: f for f in plan_fields(src, PackSettings(fields={"mask": "array", "image": "array"}, **common))[0]
    }
    assert forced["image"].kind is FieldKind.ARRAY and forced["image"].codec is None
    with pytest.raises(DctDataError, match=r"--field nope: expected one of the source's fields"):
        plan_fields(src, PackSettings(fields={"nope": "dct"}, **common))


def test_settings_parsers():
    assert parse_nan("error") == NanPolicy("error") and parse_nan("mask") == NanPolicy("mask")
    assert parse_nan("fill=-1.5") == NanPolicy("fill", -1.5) and parse_nan(0) == NanPolicy("fill", 0.0)
    for bad in ("zero", "fill=nan", "fill=x"):
        with pytest.raises(DctDataError, match="nan: expected"):
            parse_nan(bad)
    assert parse_field_overrides(["a=array", "b=dct"]) == {"a": FieldKind.ARRAY, "b": FieldKind.DCT}
    with pytest.raises(DctDataError, match=r"--field a: expected kind dct, array or label\. Got 'jpeg'"):
        parse_field_overrides({"a": "jpeg"})
    with pytest.raises(DctDataError, match=r"--field: expected NAME=dct\|array\|label\. Got 'a'"):
        parse_field_overrides(["a"])


def test_partial_dir_is_a_hidden_sibling(tmp_path):
    out = str(tmp_path / "out.dct")
    assert partial_dir(out) == os.path.join(str(tmp_path), ".out.dct.partial")


def test_the_pack_bar_counts_source_bytes(tmp_path, monkeypatch, capsys):
    """On a terminal the pack's bar shows bytes read per second and the time left (tqdm's B/s and ETA)."""
    import sys

    import dctdata

    x = poisson_fields(6, 1, 16, 16)
    np.save(tmp_path / "x.npy", x)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    dctdata.pack(str(tmp_path / "x.npy"), str(tmp_path / "o.dct"), cf=4, quant="int16")
    err = capsys.readouterr().err
    assert "pack:" in err and "B/s" in err and f"/{x.nbytes / 1e3:.2f}k " in err  # the total: the bytes read


def test_field_plan_resolves_the_settings_once():
    """A dct field's plan (`field_plan`): the defaults filled in where nothing is searched, the knobs left free
    where a target or a bound is, the default target where no fidelity setting is named."""
    fixed = field_plan(PackSettings(quant="fp16"), "u", (1, 16, 16))
    assert (fixed.cf, fixed.mask, fixed.dtype, fixed.target, fixed.calibrates) == (4, "square", "float16", None, False)
    assert fixed.fixed_spec().cf == 4 and fixed.stage == {"id": "zstd", "level": 9}  # "auto" without calibration
    target = field_plan(PackSettings(target_psnr="u=35"), "u", (2, 16, 16))
    assert (target.cf, target.mask, target.target, target.calibrates, target.fallback) == (
        None,
        None,
        35.0,
        True,
        False,
    )
    assert field_plan(PackSettings(target_psnr="u=35"), "v", (1, 8, 8)).target is None
    ints = field_plan(PackSettings(quant="int8"), "u", (1, 8, 8))
    assert (ints.cf, ints.mask, ints.calibrates) == (4, "square", True)  # integer steps come from calibration
    bound = field_plan(PackSettings(max_error="u=0.1"), "u", (1, 8, 8))
    assert (bound.cf, bound.bound, bound.calibrates) == (None, {"max_error": 0.1}, True)
    default = field_plan(PackSettings(), "u", (1, 8, 8))
    assert (default.target, default.fallback) == (DEFAULT_TARGET_PSNR, True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        default.cf = 3
