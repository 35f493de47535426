"""--resume: a pack killed with kill -9 resumes to the same bytes; redone parts are exactly the unfinished
or damaged ones; a journal of other settings is refused."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from sample_fields import OPTS, N, files

import dctdata
from dctdata.errors import DctDataError
from dctdata.preprocess.commit import partial_dir
from dctdata.preprocess.journal import JOURNAL_NAME


def journal_parts(out):
    try:
        with open(os.path.join(partial_dir(str(out)), JOURNAL_NAME)) as fh:
            return sum(1 for line in fh if '"kind": "part"' in line)
    except FileNotFoundError:
        return 0


SLOW_SOURCE = """
import time, numpy as np
class Slow:
    def __len__(self): return 64
    def __getitem__(self, i):
        if not 0 <= i < 64: raise IndexError(i)
        time.sleep(0.03)
        rng = np.random.default_rng(i)
        return {"image": rng.standard_normal((1, 24, 24)).astype(np.float32), "label": np.int64(i)}
def make(): return Slow()
"""


def _kill_then_resume(tmp_path, cmd_for):
    (tmp_path / "slow_src.py").write_text(SLOW_SOURCE)
    out = tmp_path / "out"
    proc = subprocess.Popen(cmd_for(out, resume=False), cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 60
    while journal_parts(out) < 3 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = journal_parts(out)
    assert 3 <= done < 8 and not out.exists(), f"expected an interrupted pack; got {done} parts journaled"
    part = partial_dir(str(out))
    before = {k: os.stat(os.path.join(part, k)).st_mtime_ns for k in files(part) if k != JOURNAL_NAME}
    # corrupt one finished file: --resume must notice (sha256) and redo that part
    with open(os.path.join(part, JOURNAL_NAME)) as fh:
        first = json.loads(fh.readlines()[1])["result"]
    bad = sorted(first["files"])[0]
    with open(os.path.join(part, bad), "r+b") as fh:
        fh.seek(-1, 2)
        last = fh.read(1)
        fh.seek(-1, 2)
        fh.write(bytes([last[0] ^ 0xFF]))
    r = subprocess.run(cmd_for(out, resume=True), cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    after = {k: os.stat(out / k).st_mtime_ns for k in before if (out / k).exists()}
    kept = [k for k in before if k != bad and after.get(k) == before[k]]
    assert len(kept) >= 2  # finished parts were not rewritten
    assert after[bad] != before[bad]  # the corrupted one was
    return out


def _reference(tmp_path, fmt):
    sys.path.insert(0, str(tmp_path))
    try:
        cwd = os.getcwd()
        os.chdir(tmp_path)
        dctdata.pack("slow_src:make", tmp_path / "ref", format=fmt, quiet=True, writer_options=OPTS[fmt])
    finally:
        os.chdir(cwd)
        sys.path.remove(str(tmp_path))
        sys.modules.pop("slow_src", None)
    return tmp_path / "ref"


@pytest.mark.slow
def test_kill9_then_resume_cli_webdataset(tmp_path):
    def cmd(out, resume):
        c = [
            sys.executable,
            *["-m", "dctdata", "pack", "slow_src:make"],
            str(out),
            *["--format", "webdataset", "--samples-per-shard", "8", "--quiet"],
        ]
        return c + (["--resume"] if resume else [])

    out = _kill_then_resume(tmp_path, cmd)
    assert files(out) == files(_reference(tmp_path, "webdataset"))


@pytest.mark.slow
def test_kill9_then_resume_zarr(tmp_path):
    def cmd(out, resume):
        code = (
            f"import dctdata; dctdata.pack('slow_src:make', {str(out)!r}, quiet=True, resume={resume!r}, "
            "writer_options={'shard_samples': 8})"
        )
        return [sys.executable, "-c", code]

    out = _kill_then_resume(tmp_path, cmd)
    assert files(out) == files(_reference(tmp_path, "zarr"))


def test_resume_refuses_other_settings_and_keeps_the_partial(labelled_source, tmp_path):
    out = tmp_path / "a"
    part = partial_dir(str(out))
    os.makedirs(part)
    with open(os.path.join(part, JOURNAL_NAME), "w") as fh:
        fh.write(json.dumps({"kind": "header", "settings": {"source": "other.npz"}, "fields": []}) + "\n")
    with pytest.raises(
        DctDataError, match=r"--resume: expected the settings of the interrupted pack. Got different .*source"
    ):
        dctdata.pack(labelled_source, out, resume=True, quiet=True)
    assert os.path.isdir(part)
    os.remove(os.path.join(part, JOURNAL_NAME))  # killed before its journal: nothing to resume, starts over
    m = dctdata.pack(labelled_source, out, resume=True, quiet=True)
    assert m.samples == N and not os.path.exists(part)


def test_resume_of_nothing_is_a_fresh_pack(labelled_source, tmp_path):
    m = dctdata.pack(
        labelled_source, tmp_path / "a", resume=True, quiet=True, format="webdataset", writer_options=OPTS["webdataset"]
    )
    ref = dctdata.pack(
        labelled_source, tmp_path / "b", quiet=True, format="webdataset", writer_options=OPTS["webdataset"]
    )
    assert files(tmp_path / "a") == files(tmp_path / "b") and m == ref
