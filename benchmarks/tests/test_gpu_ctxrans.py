"""`benchmarks/gpu_ctxrans.py` (the GPU entropy decoder's benchmark) runs its checks on the CPU, through the lane
emulator, so its one GPU run has no surprises in its own logic."""

from __future__ import annotations

import importlib.util
import json
import pathlib

from dctdata.entropy.ctxrans import SEGMENT

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "gpu_ctxrans.py"


def test_the_gpu_benchmark_runs_its_checks_on_the_cpu(tmp_path):
    """benchmarks/gpu_ctxrans.py --quick --device cpu: the pack, the bit-exactness check, the hostile streams and
    the JSON the GPU run writes, through the lane emulator."""
    spec = importlib.util.spec_from_file_location("gpu_ctxrans", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "r.json"
    result = bench.main(["--quick", "--device", "cpu", "--segment", "4096", "16384", "--out", str(out)])
    assert result["bit_exact"] and result["hostile_ok"]
    saved = json.loads(out.read_text())
    assert saved["sample_shape"] == [1, 32, 64, 32] and saved["dtype"] == "int8" and saved["pack_segment"] == SEGMENT
    rows = [(r["layout"], r["mode"], r["segment"], r["units_per_sample"]) for r in saved["rows"]]
    assert rows == [
        ("mode 3, segment 4096", 3, 4096, 16),
        ("mode 3, segment 16384", 3, 16384, 4),
        ("mode 2 (one unit a sample)", 2, None, 1),
    ]
    b = {r["segment"]: r["bytes_per_sample"] for r in saved["rows"]}
    assert b[None] < b[16384] < b[4096]
    assert saved["hostile"]["streams"] == 40 and saved["hostile"]["oversized_refused"] == 2
    assert 0 < saved["hostile"]["failed"] <= 40
