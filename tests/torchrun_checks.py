"""Two ranks under torchrun (gloo, CPU), for the loaders' distributed tests: the test gives the body of a script,
which opens its packs under `sys.argv[1]` and fills `out` (a JSON-able dict); each rank's `out` comes back."""

from __future__ import annotations

import json
import os
import subprocess
import sys

# `rank` and `out` are the body's; the body starts at the left margin
_PROLOGUE = """
import json, os, sys
import torch, torch.distributed as dist
import dctdata
from dctdata.loaders.distributed import make_loader, set_epoch

dist.init_process_group("gloo")
rank = dist.get_rank()
out = {}
"""
_EPILOGUE = """
with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as fh:
    json.dump(out, fh)
dist.barrier()
dist.destroy_process_group()
"""
# two ranks on this machine; --standalone: a free port of its own, not the fixed 29500 (the suite runs one
# process a core, and another test may be launching at the same time)
TORCHRUN = [sys.executable, *["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]]
# the launcher's own variables: a test run under torchrun must not hand them to the ranks it starts
_LAUNCH_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def run_ranks(body: str, workdir, timeout: float) -> list[dict]:
    """Run `body` on 2 ranks with `workdir` as sys.argv[1] (the script is written there too); each rank's `out`."""
    script = os.path.join(workdir, "ddp.py")
    with open(script, "w") as fh:
        fh.write(_PROLOGUE + body.strip("\n") + "\n" + _EPILOGUE)
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCH_ENV}
    r = subprocess.run([*TORCHRUN, script, str(workdir)], capture_output=True, text=True, timeout=timeout, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    ranks = []
    for i in range(2):
        with open(os.path.join(workdir, f"rank{i}.json")) as fh:
            ranks.append(json.load(fh))
    return ranks
