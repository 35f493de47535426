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


UNEVEN_BODY = """
# a step per batch as DDP takes it: an all-reduce every rank must join (a rank with one batch fewer hangs it)
ds = dctdata.open_dataset(os.path.join(sys.argv[1], "wds"), as_dict=True)
for name, kw in (("shuffled", {}), ("ordered", {"shuffle": False}), ("drop_last", {"drop_last": True})):
    loader = make_loader(ds, batch_size=4, num_workers=2, seed=5, **kw)
    seen, steps = {}, {}
    for epoch in range(3):
        set_epoch(loader, epoch)
        labels, n = [], 0
        for b in loader:
            dist.all_reduce(torch.ones(1))
            labels += [int(v) for v in b["label"]]
            n += 1
        seen[epoch], steps[epoch] = labels, [n, len(loader)]
    out[name] = {"seen": seen, "steps": steps}
"""


@pytest.mark.slow
def test_torchrun_uneven_shards_every_rank_the_same_steps(labelled_source, tmp_path):
    """Shards of 7 samples (64 = 9 x 7 + 1): whole shards dealt to 2 ranks give them 35 and 29 samples, and the
    rank with more batches hung in the all-reduce of its extra step. Split at sample level, both ranks take 32:
    the same steps every epoch and every sample exactly once (32 is a multiple of 4: nothing repeats, nothing
    dropped)."""
    opts = {"samples_per_shard": 7}
    dctdata.pack(labelled_source, tmp_path / "wds", format="webdataset", quiet=True, writer_options=opts)
    ranks = run_ranks(UNEVEN_BODY, tmp_path, timeout=300)
    for name in ("shuffled", "ordered", "drop_last"):
        for epoch in ("0", "1", "2"):
            steps = [ranks[i][name]["steps"][epoch] for i in range(2)]
            assert steps[0] == steps[1] == [8, 8], f"{name} epoch {epoch}: steps (yielded, len) per rank {steps}"
            got = [ranks[i][name]["seen"][epoch] for i in range(2)]
            assert sorted(got[0] + got[1]) == list(range(N)), f"{name} epoch {epoch}: not exactly once"
        assert ranks[0][name]["seen"]["0"] != ranks[0][name]["seen"]["1"] or name == "ordered"
    assert ranks[0]["ordered"]["seen"]["0"] == list(range(32))  # the first rank's run, in order
