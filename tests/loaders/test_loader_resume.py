"""Mid-epoch resume through make_loader's state_dict()/load_state_dict() (torchdata's StatefulDataLoader
protocol): exactly once for both formats with DataLoader workers and 2 ranks, after a kill -9 of a
training loop, without re-reading consumed shards; states of another pack, epoch or setting refused."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from sample_fields import N
from servers import serve

import dctdata
from dctdata.errors import DctDataError
from dctdata.loaders.distributed import make_loader, set_epoch

FORMATS = ("zarr", "webdataset")


@pytest.fixture(scope="module")
def packs(labelled_source, tmp_path_factory):
    root = tmp_path_factory.mktemp("packs")
    for fmt in FORMATS:
        dctdata.pack(labelled_source, root / fmt, format=fmt, quiet=True)
    return root


def labels(batches):
    return [int(v) for _, label in batches for v in label]


def loader_for(root, workers=0, rank=None, world=None, **kw):
    ds = dctdata.open_dataset(root)
    return make_loader(ds, batch_size=4, num_workers=workers, rank=rank, world_size=world, seed=7, **kw)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("stop", [1, 3])
def test_resume_mid_epoch_exactly_once_with_two_ranks(packs, fmt, workers, stop):
    seen = []
    for rank in (0, 1):
        first = loader_for(packs / fmt, workers, rank, 2)
        set_epoch(first, 3)
        it = iter(first)
        before = labels(next(it) for _ in range(stop))
        state = json.loads(json.dumps(first.state_dict()))  # plain JSON: no pickle needed to checkpoint
        del it, first
        resumed = loader_for(packs / fmt, workers, rank, 2)
        resumed.load_state_dict(state)
        assert resumed.epoch == 3  # the epoch comes back with the state
        after = labels(resumed)
        assert not set(before) & set(after)
        seen += before + after
    assert sorted(seen) == list(range(N))
    # and the next epoch is a whole one again
    again = loader_for(packs / fmt, workers, 1, 2)  # state is rank 1's
    again.load_state_dict(state)
    list(again)
    set_epoch(again, 4)
    assert len(labels(again)) == (len(again.dataset) if fmt == "webdataset" else N // 2)


def test_resume_does_not_fetch_consumed_shards(packs):
    """Deterministic replay: fast-forwarding reads nothing, so shards already consumed are not requested."""
    with serve(packs) as url:
        first = loader_for(f"{url}/webdataset", shuffle=False)  # 16 shards of 4 samples, batch 4
        it = iter(first)
        assert labels(next(it) for _ in range(10)) == list(range(40))
        state = first.state_dict()
        resumed = loader_for(f"{url}/webdataset", shuffle=False)
        resumed.load_state_dict(state)
        url.clear()
        assert labels(resumed) == list(range(40, N))
        fetched = sorted({p.rsplit("/", 1)[1] for p in url.requests if p.endswith(".tar")})  # HEAD + GET each
        assert fetched == [f"shard-{i:06d}.tar" for i in range(10, 16)]


@pytest.fixture
def state(packs):
    first = loader_for(packs / "webdataset", rank=0, world=2)
    set_epoch(first, 2)
    it = iter(first)
    next(it)
    return first.state_dict()


def test_state_of_another_pack_is_refused(packs, state, tmp_path, labelled_source):
    dctdata.pack(labelled_source, tmp_path / "other", format="webdataset", cf=3, quiet=True)
    with pytest.raises(
        DctDataError, match=r"state_dict: expected a state of the pack at .*Got a state of another pack"
    ):
        loader_for(tmp_path / "other", rank=0, world=2).load_state_dict(state)
    with pytest.raises(DctDataError, match="state_dict: expected a state of the pack"):
        loader_for(packs / "zarr", rank=0, world=2).load_state_dict(state)


def test_state_of_another_epoch_is_refused(packs, state):
    resumed = loader_for(packs / "webdataset", rank=0, world=2)
    resumed.load_state_dict(state)
    with pytest.raises(DctDataError, match=r"set_epoch\(5\): expected epoch 2, the epoch of the loaded state_dict"):
        set_epoch(resumed, 5)
    set_epoch(resumed, 2)  # the same epoch is fine
    assert len(labels(resumed)) == len(resumed.dataset) - 4
    set_epoch(resumed, 5)  # once the resumed epoch has started, any epoch


def test_state_of_other_settings_or_no_state_is_refused(packs, state):
    with pytest.raises(DctDataError, match=r"Got rank=0 \(here 1\)"):
        loader_for(packs / "webdataset", rank=1, world=2).load_state_dict(state)
    with pytest.raises(DctDataError, match=r"Got num_workers=0 \(here 2\)"):
        loader_for(packs / "webdataset", workers=2, rank=0, world=2).load_state_dict(state)
    with pytest.raises(DctDataError, match=r"state_dict: expected the state_dict\(\) of a dctdata make_loader"):
        loader_for(packs / "webdataset").load_state_dict({"_num_yielded": 3})
    with pytest.raises(TypeError, match="state_dict: expected a dict"):
        loader_for(packs / "webdataset").load_state_dict([1])
    bad = {**state, "dctdata": {**state["dctdata"], "epoch": -1}}
    with pytest.raises(DctDataError, match="state_dict: epoch: expected an int >= 0"):
        loader_for(packs / "webdataset", rank=0, world=2).load_state_dict(bad)


TRAIN = """
import json, os, sys, time
import dctdata
from dctdata.loaders.distributed import make_loader, set_epoch

pack, ckpt = sys.argv[1], sys.argv[2]
loader = make_loader(dctdata.open_dataset(pack), batch_size=4, num_workers=2, seed=11)
seen, start = [], 0
if os.path.exists(ckpt):  # resume: the loader state and what was trained on, committed together
    with open(ckpt) as fh:
        saved = json.load(fh)
    loader.load_state_dict(saved["loader"])
    seen, start = saved["seen"], saved["epoch"]
for epoch in range(start, 2):
    set_epoch(loader, epoch)
    for _, label in loader:
        seen.append([epoch, label.tolist()])
        tmp = ckpt + ".tmp"
        with open(tmp, "w") as fh:
            json.dump({"loader": loader.state_dict(), "seen": seen, "epoch": epoch}, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, ckpt)
        print(len(seen), flush=True)
        time.sleep(0.05)
print("done", flush=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS)
def test_kill_9_mid_epoch_then_resume_delivers_the_rest_exactly_once(packs, fmt, tmp_path):
    script, ckpt = tmp_path / "train.py", tmp_path / "ckpt.json"
    script.write_text(TRAIN)
    cmd = [sys.executable, str(script), str(packs / fmt), str(ckpt)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    steps = 0
    while steps < 6 and time.time() < deadline:  # 6 of the 16 batches of epoch 0
        line = proc.stdout.readline()
        assert line, proc.stderr.read()[-3000:]
        steps = int(line)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    killed = json.loads(ckpt.read_text())["seen"]
    assert 6 <= len(killed) < 16, "expected a kill in the middle of epoch 0"
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0 and r.stdout.strip().endswith("done"), r.stderr[-3000:]
    seen = json.loads(ckpt.read_text())["seen"]
    assert seen[: len(killed)] == killed
    for epoch in (0, 1):
        got = [v for e, batch in seen if e == epoch for v in batch]
        assert sorted(got) == list(range(N)), f"epoch {epoch}: not exactly once after the kill"
