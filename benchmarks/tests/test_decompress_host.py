"""`python -m benchmarks decompress-host`: the layer's Python per call on the fused CUDA path, with no GPU."""

from __future__ import annotations

import json

from benchmarks import decompress_host
from dctdata.decoder import fused_cuda


def test_decompress_host_times_both_codecs_through_the_fused_path(tmp_path, capsys, monkeypatch):
    launches = []
    real = decompress_host._NoLaunch.__getitem__
    monkeypatch.setattr(decompress_host._NoLaunch, "__getitem__", lambda self, g: launches.append(g) or real(self, g))
    out = tmp_path / "host.json"
    assert decompress_host.main(["--cf", "2", "--size", "16", "--batch", "2", "--calls", "3", "--repeat", "2",
                                 "--out", str(out)]) == 0  # fmt: skip
    got = json.loads(out.read_text())["us_per_call"]
    assert set(got) == {"v1", "v2"} and all(v > 0 for v in got.values())
    assert len(launches) == 2 * (20 + 2 * 3)  # every call reached the (stubbed) kernel launch: warm-up and timed
    printed = capsys.readouterr().out
    assert "v1:" in printed and "v2:" in printed and "v1 / v2:" in printed


def test_stubbed_launch_restores_the_kernel_module():
    before = fused_cuda._kernel_module, fused_cuda.usable
    with decompress_host.stubbed_launch():
        assert fused_cuda.usable(None, None, None) is True
    assert (fused_cuda._kernel_module, fused_cuda.usable) == before
