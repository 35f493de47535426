"""The pack setting "auto": integer coefficients get the smaller of the fitted entropy coder and zstd-19
(the model's bytes counted; a tie to zstd-19), float coefficients zstd-9; calibration asks it as it asks a
stage."""

import numpy as np
import pytest

import dctdata.stages.auto as auto
from dctdata.calibrate import SUB_VALUES
from dctdata.stages import AUTO, DEFAULT_CODEC, ZSTD_MAX, Auto, CtxransStage, for_setting, get_stage

CF, MASK = 3, "square"


def smooth(n=64, seed=0) -> np.ndarray:
    """Coefficients of smooth fields: mostly small, the entropy coder's home ground."""
    return np.random.default_rng(seed).laplace(0, 0.3, (n, 1, 6, CF * CF, 8)).round().astype(np.int8)


def periodic(n=16) -> np.ndarray:
    """One short pattern repeated: long matches, zstd's home ground."""
    tile = np.random.default_rng(1).integers(-60, 60, (1, 1, 1, CF * CF, 8), dtype=np.int8)
    return np.ascontiguousarray(np.broadcast_to(tile, (n, 1, 6, CF * CF, 8)))


def test_the_setting_names_the_policy_or_a_stage():
    assert isinstance(for_setting(AUTO), Auto) and for_setting(ZSTD_MAX) is get_stage(ZSTD_MAX)
    assert for_setting(None).get_config() == {} and for_setting({}).get_config() == {}


def test_floats_get_zstd9():
    assert Auto().choose(smooth().astype(np.float32), CF, MASK, False, SUB_VALUES) == DEFAULT_CODEC


def test_integers_get_the_smaller_stage_model_included():
    q = smooth()
    chosen = Auto().choose(q, CF, MASK, True, SUB_VALUES)
    coder = CtxransStage.fit(q, CF, MASK)
    assert chosen == coder.get_config()
    assert len(coder.encode(q)) + coder.model_nbytes() < len(get_stage(ZSTD_MAX).encode(q))
    assert Auto().choose(periodic(), CF, MASK, True, SUB_VALUES) == ZSTD_MAX


def test_a_tie_goes_to_zstd19(monkeypatch):
    monkeypatch.setattr(CtxransStage, "model_nbytes", lambda self: 0)
    q = smooth()
    size = len(get_stage(ZSTD_MAX).encode(q))
    monkeypatch.setattr(CtxransStage, "encode", lambda self, data: b"\0" * size)
    assert Auto().choose(q, CF, MASK, True, SUB_VALUES) == ZSTD_MAX
    monkeypatch.setattr(CtxransStage, "encode", lambda self, data: b"\0" * (size - 1))
    assert Auto().choose(q, CF, MASK, True, SUB_VALUES)["id"] == CtxransStage.codec_id


@pytest.mark.parametrize("integer", [True, False])
def test_calibration_sizes_like_the_entropy_coder(integer):
    q = smooth()
    if not integer:
        q = q.astype(np.float32)
    assert Auto().estimate_size(q, CF, MASK, integer) == CtxransStage.fit(smooth(), CF, MASK).estimate_size(
        q, CF, MASK, integer
    )


def test_the_fit_is_on_evenly_spaced_samples(monkeypatch):
    monkeypatch.setattr(auto, "FIT_VALUES", 2 * smooth()[0].size)
    seen = []
    fit = CtxransStage.fit.__func__
    monkeypatch.setattr(
        CtxransStage, "fit", classmethod(lambda cls, q, cf, mask: seen.append(len(q)) or fit(cls, q, cf, mask))
    )
    Auto().choose(smooth(), CF, MASK, True, SUB_VALUES)
    assert seen == [2]
