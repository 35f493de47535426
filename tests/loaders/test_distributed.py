"""torchrun: every sample exactly once per epoch across 2 ranks x 2 workers, both formats."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from sample_fields import OPTS, N

import dctdata

DDP_SCRIPT = """
import json, os, sys
import torch, torch.distributed as dist
import dctdata
from dctdata.loaders.distributed import make_loader, set_epoch

dist.init_process_group("gloo")
rank = dist.get_rank()
out = {}
for name in ("zarr", "wds"):
    ds = dctdata.open_dataset(os.path.join(sys.argv[1], name), as_dict=True)
    loader = make_loader(ds, batch_size=4, num_workers=2, seed=3)
    seen = {}
    for epoch in range(2):
        set_epoch(loader, epoch)
        seen[epoch] = [int(v) for b in loader for v in b["label"]]
    out[name] = seen
with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as fh:
    json.dump(out, fh)
dist.barrier()
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_torchrun_every_sample_once_per_epoch(labelled_source, tmp_path):
    dctdata.pack(labelled_source, tmp_path / "zarr", quiet=True, writer_options=OPTS["zarr"])
    dctdata.pack(labelled_source, tmp_path / "wds", format="webdataset", quiet=True, writer_options=OPTS["webdataset"])
    (tmp_path / "ddp.py").write_text(DDP_SCRIPT)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    }
    cmd = [
        sys.executable,
        *"-m torch.distributed.run --standalone --nproc_per_node 2".split(),
        str(tmp_path / "ddp.py"),
        str(tmp_path),
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{i}.json").read_text()) for i in range(2)]
    for name in ("zarr", "wds"):
        for epoch in ("0", "1"):
            got = [ranks[i][name][epoch] for i in range(2)]
            assert all(got), f"{name} epoch {epoch}: a rank got nothing"
            assert sorted(got[0] + got[1]) == list(range(N)), f"{name} epoch {epoch}: not exactly once"
        assert ranks[0][name]["0"] != ranks[0][name]["1"]  # set_epoch reshuffles
