"""benchmarks/gpu_layer.py runs its tables' code on a CPU: the Triton kernel under the interpreter (made usable
on CPU tensors) and nvCOMP's stand-in, at tiny sizes, so the one GPU run of the script has no surprises in its
own logic; without CUDA `main` prints one line and writes the JSON it says."""

import importlib.util
import json
import pathlib

import pytest
import torch
from gpu_fakes import forget_kernel, install_fake_nvcomp, interpreted_kernel

import dctdata.decoder.fused as fused
import dctdata.decoder.fused_cuda as fused_cuda

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "gpu_layer.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("gpu_layer_bench", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_decode_table_on_cpu(bench, monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.setattr(fused, "REQUIRE_VECTOR", False)
    interpreted_kernel(monkeypatch)
    try:
        monkeypatch.setattr(fused_cuda, "usable", lambda q, dtype, out: fused_cuda.ENABLED)
        cpu = torch.device("cpu")
        rows = bench.decode_rows([16], [2], ["float32", "bfloat16"], 1, cpu, batch_bytes=2 * 16 * 16 * 4)
    finally:
        forget_kernel()
    keys = [(r["size"], r["cf"], r["dtype"], r["batch"]) for r in rows]
    assert keys == [(16, 2, "float32", 2), (16, 2, "bfloat16", 4)]
    for r in rows:
        for codec in ("v1", "v2"):
            assert r[f"{codec}_fused_ran"] and r[f"{codec}_eager_GBps"] > 0 and r[f"{codec}_fused_GBps"] > 0
            assert r[f"{codec}_max_rel_diff"] < (1e-5 if r["dtype"] == "float32" else 2e-2)
    table = bench.format_decode_rows(rows)
    assert table.count("\n") == 3 and "| 16² | 2 | bfloat16 | 4 |" in table
    assert fused_cuda.synthesize.__module__ == "dctdata.decoder.fused_cuda" and fused_cuda.ENABLED  # restored


def test_decode_table_reports_a_kernel_that_did_not_run(bench, monkeypatch):
    monkeypatch.setattr(fused, "REQUIRE_VECTOR", False)
    rows = bench.decode_rows([16], [2], ["float32"], 1, torch.device("cpu"), batch_bytes=16 * 16 * 4)
    assert rows[0]["v2_error"] == "the fused kernel did not run" and "v2_fused_GBps" not in rows[0]
    assert "the fused kernel did not run" in bench.format_decode_rows(rows)


def test_nvcomp_table_on_cpu(bench, monkeypatch, capsys):
    fake = install_fake_nvcomp(monkeypatch)
    rows, meta = bench.nvcomp_rows([2, 4], 2, torch.device("cpu"), small=256, big=1024)
    cases = [(r["case"], r["samples"], r.get("frames")) for r in rows]
    assert cases[:5] == [
        ("256 B samples, 1 frame each", 2, 2),
        ("256 B samples, 1 frame each", 4, 4),
        ("256 B, torch allocator", 32, 32),
        ("256 B, torch allocator", 256, 256),
        ("256 B, unaligned streams", 256, 256),
    ]
    assert ("1 KiB samples, 1 frame each", 64, 64) in cases and ("1 KiB samples, 4 frames of 256 B", 64, 256) in cases
    assert all("error" not in r and r["bit_exact"] for r in rows), [r for r in rows if "error" in r]
    assert meta == {"nvcomp": "6.0.0-fake", "alignment": 8}
    assert fake.allocator is None  # the torch allocator rows set it back
    out = capsys.readouterr().out
    assert out.count("| case |") == 1 and out.count("| yes |") == len(rows)


def test_nvcomp_table_without_the_extra_and_main_without_cuda(bench, monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(__import__("sys").modules, "nvidia.nvcomp", None)
    with pytest.raises(ImportError, match=r"pip install 'dctdata\[gpu\]'"):
        bench.nvcomp_rows([2], 1, torch.device("cpu"))
    if torch.cuda.is_available():
        pytest.skip("main runs the GPU tables here")
    path = tmp_path / "out.json"
    assert bench.main(["--out", str(path)]) == 0
    assert "skipped: no CUDA device" in capsys.readouterr().out
    assert json.loads(path.read_text())["skipped"] == "no CUDA device"
