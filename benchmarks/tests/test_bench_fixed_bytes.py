"""`python -m benchmarks fixed-bytes`: its parts add up to the pack's files."""

from __future__ import annotations

import os

import numpy as np

import dctdata
from benchmarks import fixed_bytes


def test_the_parts_add_up_to_the_pack(tmp_path):
    x = np.random.default_rng(0).standard_normal((1, 1, 12, 20, 20)).cumsum(-1).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "p"
    dctdata.pack(str(tmp_path / "x.npy"), out, dims=3, target_psnr=35, quiet=True, workers=1)
    p = fixed_bytes.parts(str(out))
    on_disk = sum(os.path.getsize(os.path.join(r, n)) for r, _, ns in os.walk(out) for n in ns)
    assert p["total"] == on_disk == p["coefficients"] + p["fixed"]
    named = ("model params", "checksums", "seal", "tables", "manifest rest")
    assert sum(p[k] for k in named) == p["manifest.json"] and p["manifest rest"] > 0
    assert p["fixed"] == p["manifest.json"] + p["zarr.json"] and p["checksums"] > 0 and p["seal"] > 0
