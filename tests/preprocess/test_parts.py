"""dctdata.preprocess.parts: one part encodes its samples with the shared specs, measures what it stored,
and hands the writer stored arrays; data problems name the samples."""

from __future__ import annotations

import numpy as np
import pytest
from sample_fields import poisson_fields

from dctdata.codec.spec import CodecSpec
from dctdata.errors import DctDataError, OverflowCountError
from dctdata.format import FieldSpec
from dctdata.preprocess.masking import NanPolicy
from dctdata.preprocess.parts import PartJob, check_finite, run_part


class Recorder:
    """A writer that keeps what it is given."""

    def write_part(self, root, fields, n, index, start, stop, batches):
        self.batches = [dict(b) for b in batches]
        return {"files": {}}


def job(tmp_path, x, spec, **kw):
    np.savez(tmp_path / "s.npz", image=x, label=np.arange(len(x), dtype=np.int64))
    specs = (FieldSpec("image", "dct", x.shape[1:], "float32", spec), FieldSpec("label", "label", (), "int64"))
    args = dict(nan=NanPolicy(), strict=False, writer=Recorder(), root=str(tmp_path), samples=len(x))
    args.update(kw)
    return PartJob(str(tmp_path / "s.npz"), {}, specs, **args)


def test_a_part_stores_coefficients_and_measures_them(tmp_path):
    x = poisson_fields(10, 1, 16, 24)
    j = job(tmp_path, x, CodecSpec(cf=4, height=16, width=24, dtype="float32"))
    res = run_part(j, 1, 2, 9)
    assert (res["index"], res["start"], res["stop"]) == (1, 2, 9)
    stored = np.concatenate([b["image"] for b in j.writer.batches])
    assert stored.shape == (7, 1, 2, 16, 3) and stored.dtype == np.float32
    assert np.concatenate([b["label"] for b in j.writer.batches]).tolist() == list(range(2, 9))
    (psnr,) = res["stats"]["psnr"]["image"]  # one channel: a PSNR per sample
    assert len(psnr) == 7 and all(20 < p < 80 for p in psnr) and res["stats"]["max_error"]["image"][0] > 0


def test_overflow_is_counted_or_refused_with_strict(tmp_path):
    x = poisson_fields(4, 1, 8, 8)
    spec = CodecSpec(cf=2, height=8, width=8, dtype="int8", steps=[[0.01] * 4])  # far too fine for int8
    assert run_part(job(tmp_path, x, spec), 0, 0, 4)["stats"]["overflow"]["image"] > 0
    with pytest.raises(OverflowCountError, match=r"s\.npz sample 0\.\.3: field 'image': expected no int8 overflow"):
        run_part(job(tmp_path, x, spec, strict=True), 0, 0, 4)


def test_nan_is_filled_only_when_asked(tmp_path):
    x = poisson_fields(3, 1, 8, 8)
    x[1, 0, 2, 2] = np.nan
    spec = CodecSpec(cf=8, height=8, width=8)
    with pytest.raises(DctDataError, match=r"s\.npz sample 1: field 'image': expected finite values"):
        run_part(job(tmp_path, x, spec), 0, 0, 3)
    assert run_part(job(tmp_path, x, spec, nan=NanPolicy("fill", 0.0)), 0, 0, 3)["stats"]["nan_filled"] == 1


def test_check_finite_refuses_values_the_dct_would_overflow():
    x = np.full((2, 1, 8, 8), 1e38, np.float32)
    with pytest.raises(DctDataError, match=r"sample 0: field 'f': expected \|x\| <= .* Got max \|x\| = 1e\+38"):
        check_finite(x, "f", None, lambda j: f"sample {j}")


def test_a_part_reports_progress_per_batch(tmp_path, monkeypatch):
    import dctdata.preprocess.parts as parts

    monkeypatch.setattr(parts, "BATCH_BYTES", 2 * (8 * 8 * 4 + 8))  # two samples (image and label) a batch
    x = poisson_fields(7, 1, 8, 8)
    seen = []
    run_part(job(tmp_path, x, CodecSpec(cf=4, height=8, width=8)), 0, 1, 6, progress=seen.append)
    assert seen == [2, 2, 1]


@pytest.mark.parametrize("big", [1e38, -1e38])
def test_a_part_names_the_sample_past_the_float32_bound(tmp_path, big):
    x = poisson_fields(3, 1, 8, 8)
    x[2, 0, 1, 1] = big  # finite, but the DCT would overflow float32: the largest |x| of either sign
    with pytest.raises(
        DctDataError, match=r"s\.npz sample 2: field 'image': expected \|x\| <= .* Got max \|x\| = 1e\+38"
    ):
        run_part(job(tmp_path, x, CodecSpec(cf=8, height=8, width=8)), 0, 0, 3)
