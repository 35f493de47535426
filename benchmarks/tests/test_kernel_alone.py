"""`python -m benchmarks kernel-alone`: the parts that run without a GPU (arguments, tables, formatting)."""

from __future__ import annotations

import pytest
import torch

import dctdata
from benchmarks import kernel_alone
from benchmarks.gpu import v2_spec
from dctdata.decoder import fused, fused_cuda


def test_kernel_argument_names_label_path_and_table_form(tmp_path):
    path = tmp_path / "old.py"
    path.write_text("synthesize_kernel = None\n")
    assert kernel_alone.parse_kernel(f"old={path}:plain") == ("old", str(path), True)
    assert kernel_alone.parse_kernel(f"new={path}") == ("new", str(path), False)


@pytest.mark.parametrize("text", ["old", "=x.py", "old="])
def test_kernel_argument_without_label_or_path_is_refused(text):
    with pytest.raises(dctdata.DctDataError, match=r"--kernel: expected LABEL=PATH or LABEL=PATH:plain"):
        kernel_alone.parse_kernel(text)


def test_missing_kernel_file_is_named(tmp_path):
    with pytest.raises(dctdata.DctDataError, match=r"--kernel old: no such kernel file: .*nothing\.py"):
        kernel_alone.parse_kernel(f"old={tmp_path / 'nothing.py'}")


def test_file_without_the_kernel_is_named(tmp_path):
    path = tmp_path / "empty.py"
    path.write_text("x = 1\n")
    with pytest.raises(dctdata.DctDataError, match=r"--kernel e: .*empty\.py defines no synthesize_kernel"):
        kernel_alone.load_kernel("e", str(path))


def test_plain_tables_undo_the_half_sign_form():
    spec = v2_spec(4, 32)
    tables = fused.tables_for(spec)
    plain = kernel_alone.plain_tables(fused_cuda.device_tables(tables, "cpu", 4, spec.mask))
    index = fused_cuda.column_index(4, spec.mask)
    kept = index >= 0
    for j, table in enumerate((tables.a, tables.d, tables.r)):
        want = table.float()[:, index.clamp(min=0)]
        torch.testing.assert_close(plain.columns[:, :, j, :][:, kept], want[:, kept], atol=1e-6, rtol=0)


def test_without_cuda_it_says_so_and_exits_0(capsys, monkeypatch):
    monkeypatch.setattr(kernel_alone, "skip_reason", lambda device: "no CUDA device")
    assert kernel_alone.main([]) == 0
    assert "kernel-alone: skipped (no CUDA device)" in capsys.readouterr().out


def test_rows_are_formatted_in_pairs_with_their_ratio():
    rows = [dict(size=256, cf=8, dtype="float32", codec=c, kernel="k", batch=256, us=us, GBps=gb, diff=0.0)
            for c, us, gb in (("v1", 40.0, 1600.0), ("v2", 50.0, 1280.0))]  # fmt: skip
    text = kernel_alone.format_rows(rows)
    assert "| 256² | 8 | float32 | k | 40.0 | 50.0 | 1600 | 1280 | 0.800 |" in text
