"""Issue 7: Dask-parallel packs are byte-identical to serial ones, kill -9 + --resume, torchrun
exactly-once for both formats, object stores (S3 via moto, HTTP) for reading and writing."""

from __future__ import annotations

import builtins
import functools
import http.server
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import dctdata
from dctdata.cli import main
from dctdata.errors import DctDataError
from dctdata.preprocess.journal import JOURNAL_NAME
from dctdata.preprocess.pack import partial_dir

N = 64
OPTS = {"zarr": {"shard_samples": 8}, "webdataset": {"samples_per_shard": 8}}


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    d = tmp_path_factory.mktemp("src")
    rng = np.random.default_rng(0)
    y = np.linspace(0, 6, 24, dtype=np.float32)
    image = (np.sin(y)[None, :, None] * np.cos(y)[None, None, :] + 0.1 * rng.standard_normal((N, 24, 24))).astype(np.float32)
    np.savez(d / "d.npz", image=image, label=np.arange(N, dtype=np.int64))
    return d / "d.npz"


def files(root):
    out = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = os.path.join(dirpath, name)
            with open(path, "rb") as fh:
                out[os.path.relpath(path, root)] = fh.read()
    return out


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["zarr", "webdataset"])
def test_dask_pack_is_byte_identical_to_serial(source, tmp_path, fmt):
    kw = dict(format=fmt, quant="int8", cf=6, quiet=True, writer_options=OPTS[fmt])
    m1 = dctdata.pack(source, tmp_path / "serial", **kw)
    m2 = dctdata.pack(source, tmp_path / "dask", workers=2, **kw)
    assert m1.to_json() == m2.to_json()
    a, b = files(tmp_path / "serial"), files(tmp_path / "dask")
    assert sorted(a) == sorted(b) and len(a) > 4
    assert all(a[k] == b[k] for k in a)
    ds = dctdata.open_dataset(tmp_path / "dask")
    assert main(["verify", str(tmp_path / "dask")]) == 0
    assert ds.manifest.samples == N


def test_parallel_needs_dask(source, tmp_path, monkeypatch):
    real = builtins.__import__

    def no_dask(name, *a, **k):
        if name.startswith("dask"):
            raise ImportError("No module named 'dask'")
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_dask)
    with pytest.raises(DctDataError, match=r"--workers N>1/--scheduler: expected dask.distributed to be installed \(pip install 'dctdata\[dask\]'\)"):
        dctdata.pack(source, tmp_path / "a", workers=2, quiet=True)
    assert not (tmp_path / "a").exists()


def test_bad_parallel_settings(source, tmp_path):
    with pytest.raises(DctDataError, match="--workers: expected a positive int. Got 0"):
        dctdata.pack(source, tmp_path / "a", workers=0)
    with pytest.raises(DctDataError, match="--workers/--scheduler: expected one of them"):
        dctdata.pack(source, tmp_path / "a", workers=2, scheduler="tcp://127.0.0.1:1")
    with pytest.raises(DctDataError, match="--resume: expected a local OUT directory"):
        dctdata.pack(source, "memory://bucket/x", resume=True)


# --resume -----------------------------------------------------------------------------------------
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
        c = [sys.executable, "-m", "dctdata", "pack", "slow_src:make", str(out), "--format", "webdataset", "--samples-per-shard", "8", "--quiet"]
        return c + (["--resume"] if resume else [])

    out = _kill_then_resume(tmp_path, cmd)
    assert files(out) == files(_reference(tmp_path, "webdataset"))


@pytest.mark.slow
def test_kill9_then_resume_zarr(tmp_path):
    def cmd(out, resume):
        code = (
            "import dctdata; dctdata.pack('slow_src:make', %r, quiet=True, resume=%r, writer_options={'shard_samples': 8})"
            % (str(out), resume)
        )
        return [sys.executable, "-c", code]

    out = _kill_then_resume(tmp_path, cmd)
    assert files(out) == files(_reference(tmp_path, "zarr"))


def test_resume_refuses_other_settings_and_keeps_the_partial(source, tmp_path):
    out = tmp_path / "a"
    part = partial_dir(str(out))
    os.makedirs(part)
    with open(os.path.join(part, JOURNAL_NAME), "w") as fh:
        fh.write(json.dumps({"kind": "header", "settings": {"source": "other.npz"}, "fields": []}) + "\n")
    with pytest.raises(DctDataError, match=r"--resume: expected the settings of the interrupted pack. Got different .*source"):
        dctdata.pack(source, out, resume=True, quiet=True)
    assert os.path.isdir(part)
    os.remove(os.path.join(part, JOURNAL_NAME))
    with pytest.raises(DctDataError, match=r"--resume: expected a progress journal"):
        dctdata.pack(source, out, resume=True, quiet=True)
    m = dctdata.pack(source, out, quiet=True)  # without --resume: starts over
    assert m.samples == N and not os.path.exists(part)


def test_resume_of_nothing_is_a_fresh_pack(source, tmp_path):
    m = dctdata.pack(source, tmp_path / "a", resume=True, quiet=True, format="webdataset", writer_options=OPTS["webdataset"])
    ref = dctdata.pack(source, tmp_path / "b", quiet=True, format="webdataset", writer_options=OPTS["webdataset"])
    assert files(tmp_path / "a") == files(tmp_path / "b") and m == ref


# torchrun ----------------------------------------------------------------------------------------
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
def test_torchrun_every_sample_once_per_epoch(source, tmp_path):
    dctdata.pack(source, tmp_path / "zarr", quiet=True, writer_options=OPTS["zarr"])
    dctdata.pack(source, tmp_path / "wds", format="webdataset", quiet=True, writer_options=OPTS["webdataset"])
    (tmp_path / "ddp.py").write_text(DDP_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(tmp_path / "ddp.py"), str(tmp_path)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{i}.json").read_text()) for i in range(2)]
    for name in ("zarr", "wds"):
        for epoch in ("0", "1"):
            got = [ranks[i][name][epoch] for i in range(2)]
            assert all(got), f"{name} epoch {epoch}: a rank got nothing"
            assert sorted(got[0] + got[1]) == list(range(N)), f"{name} epoch {epoch}: not exactly once"
        assert ranks[0][name]["0"] != ranks[0][name]["1"]  # set_epoch reshuffles


# object stores ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def s3():
    pytest.importorskip("s3fs")
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    opts = {"key": "testing", "secret": "testing", "client_kwargs": {"endpoint_url": f"http://{host}:{port}", "region_name": "eu-west-1"}}
    import s3fs

    fs = s3fs.S3FileSystem(**opts)
    fs.mkdir("dctdata-test", region_name="eu-west-1")
    yield opts
    server.stop()


@pytest.mark.parametrize("fmt", ["zarr", "webdataset"])
def test_pack_to_s3_and_read_back(source, tmp_path, s3, fmt):
    import s3fs

    url = f"s3://dctdata-test/{fmt}"
    m = dctdata.pack(source, url, format=fmt, quant="int8", cf=6, quiet=True, writer_options=OPTS[fmt], storage_options=s3)
    local = dctdata.pack(source, tmp_path / "local", format=fmt, quant="int8", cf=6, quiet=True, writer_options=OPTS[fmt])
    assert m.checksums == local.checksums  # same bytes as a local pack
    fs = s3fs.S3FileSystem(**s3)
    fs.invalidate_cache()
    for rel, entry in m.checksums.items():
        assert fs.info(f"dctdata-test/{fmt}/{rel}")["size"] == entry["bytes"]
    ds = dctdata.open_dataset(url, storage_options=s3)
    labels = sorted(int(s[1]) for s in (ds if fmt == "webdataset" else (ds[i] for i in range(len(ds)))))
    assert labels == list(range(N))
    with pytest.raises(DctDataError, match="expected an OUT prefix without a dataset. Got an existing manifest.json"):
        dctdata.pack(source, url, format=fmt, quiet=True, storage_options=s3)


def test_s3_prefix_without_manifest_is_refused(s3):
    import s3fs

    from dctdata.errors import FormatError

    fs = s3fs.S3FileSystem(**s3)
    fs.pipe("dctdata-test/half/shard-000000.tar", b"x" * 10)  # data written, manifest (the commit) not yet
    with pytest.raises(FormatError, match=r"half/manifest.json: expected a dctdata manifest \(manifest.json\). Got no such file"):
        dctdata.open_dataset("s3://dctdata-test/half", storage_options=s3)


class RangeHandler(http.server.SimpleHTTPRequestHandler):
    """http.server plus byte ranges (zarr reads shard indexes with range requests, as real servers allow)."""

    def log_message(self, *args):
        pass

    def send_head(self):
        rng = self.headers.get("Range")
        path = self.translate_path(self.path)
        if not rng or not os.path.isfile(path):
            return super().send_head()
        with open(path, "rb") as fh:
            data = fh.read()
        a, _, b = rng.removeprefix("bytes=").partition("-")
        start, stop = (len(data) - int(b), len(data)) if a == "" else (int(a), min(len(data), int(b) + 1 if b else len(data)))
        self.send_response(206)
        self.send_header("Content-Range", f"bytes {start}-{stop - 1}/{len(data)}")
        self.send_header("Content-Length", str(stop - start))
        self.end_headers()
        import io

        return io.BytesIO(data[start:stop])


@pytest.fixture
def http_root(tmp_path):
    handler = functools.partial(RangeHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield tmp_path, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_read_both_formats_over_http(source, http_root):
    root, url = http_root
    for fmt in ("zarr", "webdataset"):
        dctdata.pack(source, root / fmt, format=fmt, quiet=True, writer_options=OPTS[fmt])
        ds = dctdata.open_dataset(f"{url}/{fmt}")
        it = ds if fmt == "webdataset" else (ds[i] for i in range(len(ds)))
        assert sorted(int(s[1]) for s in it) == list(range(N))
