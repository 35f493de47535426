"""torchrun: every sample exactly once per epoch across 2 ranks x 2 workers, both formats."""

from __future__ import annotations

import pytest
from sample_fields import OPTS, N
from torchrun_checks import run_ranks

import dctdata

DDP_BODY = """
for name in ("zarr", "wds"):
    ds = dctdata.open_dataset(os.path.join(sys.argv[1], name), as_dict=True)
    loader = make_loader(ds, batch_size=4, num_workers=2, seed=3)
    seen = {}
    for epoch in range(2):
        set_epoch(loader, epoch)
        seen[epoch] = [int(v) for b in loader for v in b["label"]]
    out[name] = seen
"""


@pytest.mark.slow
def test_torchrun_every_sample_once_per_epoch(labelled_source, tmp_path):
    dctdata.pack(labelled_source, tmp_path / "zarr", quiet=True, writer_options=OPTS["zarr"])
    dctdata.pack(labelled_source, tmp_path / "wds", format="webdataset", quiet=True, writer_options=OPTS["webdataset"])
    ranks = run_ranks(DDP_BODY, tmp_path, timeout=180)
    for name in ("zarr", "wds"):
        for epoch in ("0", "1"):
            got = [ranks[i][name][epoch] for i in range(2)]
            assert all(got), f"{name} epoch {epoch}: a rank got nothing"
            assert sorted(got[0] + got[1]) == list(range(N)), f"{name} epoch {epoch}: not exactly once"
        assert ranks[0][name]["0"] != ranks[0][name]["1"]  # set_epoch reshuffles
