"""`python -m benchmarks edge-blocks`: its arms pack what they say and leave calibration as it was."""

from __future__ import annotations

import dctdata.encoder.calibrate as cal
from benchmarks import edge_blocks


def test_each_arm_packs_its_choice_and_restores_calibration(tmp_path):
    x, dims = edge_blocks.sets([])["MRI volume 25x41x33 (dims 3)"]  # r = 1 along every axis
    before = cal.DEFAULT_PAD, cal.CodecSpec, cal.choose_recon, cal._pack_bytes
    rows = {arm: edge_blocks.pack_arm(x, dims, str(tmp_path), arm, 40.0) for arm in edge_blocks.ARMS}
    assert (cal.DEFAULT_PAD, cal.CodecSpec, cal.choose_recon, cal._pack_bytes) == before
    for r in rows.values():
        assert 0 < r["fixed"] < r["bytes"] and r["psnr"] >= 39.5  # each landed on the target
    assert rows["extend"]["bytes"] < rows["before"]["bytes"]  # the fill from the block's own voxels pays
    assert rows["now"]["fixed"] < rows["before"]["fixed"]  # one reconstruction value where a row does not pay
