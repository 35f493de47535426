"""Hostile packs, concurrent writers and bounded resources (issue 16): one regression test per finding,
each reproducing it from scratch.

S: a pack someone else wrote must not make dctdata write outside it or run code.
D: nothing lost or silently wrong (concurrent packs, edited zarr.json, odd inputs).
H: every read is bounded in memory and time (bombs, huge manifests, special files, stalled servers).
B: errors, not tracebacks.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from pack_checks import read_all, rehash, reseal, verify

import dctdata
from dctdata.cli import main
from dctdata.errors import DctDataError, IntegrityError
from dctdata.stages import ids

N = 10


@pytest.fixture(scope="module")
def packs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("packs")
    rng = np.random.default_rng(0)
    x = (20 + 5 * rng.standard_normal((N, 1, 16, 16))).astype(np.float32)
    np.savez(tmp / "src.npz", image=x, label=np.arange(N, dtype=np.int64))
    dctdata.pack(
        tmp / "src.npz", tmp / "zarr", cf=4, quiet=True, writer_options={"chunk_samples": 2, "shard_samples": 4}
    )
    dctdata.pack(
        tmp / "src.npz",
        tmp / "webdataset",
        format="webdataset",
        cf=4,
        quiet=True,
        writer_options={"samples_per_shard": 4},
    )
    return tmp


@pytest.fixture(params=["zarr", "webdataset"])
def pack(request, packs, tmp_path) -> Path:
    """A fresh copy of a small pack in each format."""
    return Path(shutil.copytree(packs / request.param, tmp_path / request.param))


def edit_manifest(root: Path, edit) -> None:
    m = json.loads((root / "manifest.json").read_text())
    edit(m)
    (root / "manifest.json").write_text(json.dumps(reseal(m)))


# S1: inspect never writes through a link planted in a directory ------------------------------------
def test_s1_inspect_never_follows_a_link_at_its_temporary_or_final_name(packs, tmp_path):
    victim = tmp_path / "bashrc"
    victim.write_text("keep me\n")
    pack = Path(shutil.copytree(packs / "zarr", tmp_path / "pack"))
    png = pack / "inspect.png"  # the old default place: inside a downloaded pack
    for planted in (pack / "inspect.png.tmp", png):
        planted.symlink_to(victim)
        assert main(["inspect", str(pack), "--png", str(png), "--samples", "1"]) == 0
        assert victim.read_text() == "keep me\n"
        assert not png.is_symlink() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        png.unlink()
        if planted.is_symlink():
            planted.unlink()
    assert not [p.name for p in pack.iterdir() if p.name.startswith(".inspect.png")]  # no temporaries left


def test_s1_manifest_write_ignores_a_link_at_the_temporary_name(packs, tmp_path):
    from dctdata.format import read_manifest, write_manifest

    victim = tmp_path / "victim"
    victim.write_text("keep me\n")
    pack = Path(shutil.copytree(packs / "zarr", tmp_path / "pack"))
    (pack / "manifest.json.tmp").symlink_to(victim)
    write_manifest(read_manifest(pack), pack)
    assert victim.read_text() == "keep me\n" and read_manifest(pack).samples == N


# S2: a manifest may only name allow-listed lossless stages --------------------------------------------
@pytest.mark.parametrize("codec_id", ["pickle", "zlib", "json"])
def test_s2_manifest_naming_a_codec_off_the_allow_list_is_refused(pack, capsys, codec_id):
    def edit(m):
        m["fields"][-1]["lossless"] = {"id": codec_id}

    edit_manifest(pack, edit)
    expected = rf"field 'label': lossless: expected one of {re.escape(str(ids()))}\. Got '{codec_id}'"
    with pytest.raises(DctDataError, match=expected):
        dctdata.open_dataset(pack)
    rc, text = verify(capsys, pack)
    assert rc == 1 and re.search(expected, text), text


# D3: a semantically valid zarr.json edit is caught by its recorded checksum -----------------------------
def test_d3_chunk_separator_edit_in_zarr_json_is_an_integrity_error(packs, tmp_path, capsys):
    pack = Path(shutil.copytree(packs / "zarr", tmp_path / "zarr"))
    meta = pack / "image" / "zarr.json"
    text = meta.read_text()
    assert '"separator":"."' in text.replace(" ", "")
    meta.write_text(text.replace('"separator": "."', '"separator": "/"').replace('"separator":"."', '"separator":"/"'))
    with pytest.raises(IntegrityError, match=r"image/zarr\.json"):
        read_all(dctdata.open_dataset(pack))
    rc, out = verify(capsys, pack)
    assert rc == 1 and "image/zarr.json" in out


# D1: two packs into one OUT: the second is refused, the first finishes intact --------------------------
HOLD_LOCK = """
import sys, numpy as np, dctdata
w = dctdata.Writer(sys.argv[1], cf=4)
w.write({"image": np.zeros((16, 16), np.float32)})
print("ready", flush=True)
sys.stdin.readline()
w.close()
print("closed", flush=True)
"""


def test_d1_a_second_pack_into_the_same_out_is_refused(packs, tmp_path, capsys):
    import subprocess
    import sys

    out = tmp_path / "out"
    first = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(out)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert first.stdout.readline().strip() == "ready"  # another process is writing OUT
        busy = r"out: expected no other pack writing here\. Got a lock held on .*\.out\.lock"
        with pytest.raises(DctDataError, match=busy):
            dctdata.pack(packs / "src.npz", out, cf=4, quiet=True)
        with pytest.raises(DctDataError, match=busy):
            dctdata.pack(packs / "src.npz", out, cf=4, quiet=True, overwrite=True, resume=True)
        with pytest.raises(DctDataError, match=busy):
            dctdata.Writer(out, cf=4)
        assert main(["pack", str(packs / "src.npz"), str(out), "--cf", "4"]) == 1
        err = capsys.readouterr().err
        assert re.search(busy, err) and "Traceback" not in err
        first.stdin.write("\n")
        first.stdin.flush()
        assert first.stdout.readline().strip() == "closed" and first.wait(60) == 0
    finally:
        first.kill()
    assert len(dctdata.open_dataset(out)) == 1  # the first pack committed, nothing of the refused ones
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # lock file and partial directory gone
    with pytest.raises(DctDataError, match="expected an OUT path that does not exist"):
        dctdata.pack(packs / "src.npz", out, cf=4, quiet=True)  # checked again under the lock


def test_d1_a_killed_pack_leaves_no_stale_lock(packs, tmp_path):
    import subprocess
    import sys

    out = tmp_path / "out"
    first = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(out)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert first.stdout.readline().strip() == "ready"
    first.kill()  # kill -9: the kernel drops the lock
    first.wait(60)
    assert (tmp_path / ".out.lock").exists()
    dctdata.pack(packs / "src.npz", out, cf=4, quiet=True)
    assert len(dctdata.open_dataset(out)) == N and not (tmp_path / ".out.lock").exists()


# D4: a multi-page TIFF is refused, never cut to its first page ------------------------------------------
def test_d4_multi_page_tiff_is_refused_not_cut_to_its_first_page(tmp_path, capsys):
    from PIL import Image

    pages = [Image.fromarray(np.full((16, 16), 40 * i, np.uint8)) for i in range(3)]
    (tmp_path / "imgs").mkdir()
    pages[0].save(tmp_path / "imgs" / "a.tif")
    pages[0].save(tmp_path / "imgs" / "stack.tif", save_all=True, append_images=pages[1:])
    expected = r"stack\.tif: expected a single-page image \(one sample per file\)\. Got 3 pages"
    with pytest.raises(DctDataError, match=expected):
        dctdata.pack(tmp_path / "imgs", tmp_path / "out", cf=4, quiet=True)
    assert main(["pack", str(tmp_path / "imgs"), str(tmp_path / "out2")]) == 1
    assert re.search(expected, capsys.readouterr().err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["imgs"]  # nothing half-written
    with Image.open(tmp_path / "imgs" / "stack.tif") as im:  # a PIL item from a map-style dataset too
        with pytest.raises(DctDataError, match=r"sample 0.*expected a single-page image.*Got 3 pages"):
            dctdata.pack([im], tmp_path / "out3", cf=4, quiet=True)


# D5: big-endian arrays pack as native values, and a big-endian member still reads -------------------------
@pytest.mark.parametrize("fmt", ["zarr", "webdataset"])
def test_d5_big_endian_fields_pack_and_read_back_exactly(tmp_path, capsys, fmt):
    rng = np.random.default_rng(0)
    image = (20 + 5 * rng.standard_normal((6, 1, 16, 16))).astype(">f4")
    label, aux = np.arange(6).astype(">i8") * 2**40, rng.standard_normal((6, 3)).astype(">f8")
    np.savez(tmp_path / "be.npz", image=image, label=label, aux=aux)
    dctdata.pack(tmp_path / "be.npz", tmp_path / "out", format=fmt, cf=4, quiet=True)
    ds = dctdata.open_dataset(tmp_path / "out", **({"shuffle": False} if fmt == "webdataset" else {}))
    got = read_all(ds)
    assert [int(s[1]) for s in got] == label.tolist()
    assert np.array_equal(np.stack([s[2].numpy() for s in got]), aux)
    rc, text = verify(capsys, tmp_path / "out")
    assert rc == 0 and text.startswith("OK"), text


def test_d5_a_big_endian_npy_member_decodes_to_native_values():
    from dctdata.format.npy import decode_npy, encode_npy

    arr = decode_npy(encode_npy(np.arange(5).astype(">i8") * 2**40), "m")
    assert arr.dtype.isnative and arr.dtype.name == "int64"
    assert torch.from_numpy(arr).tolist() == [i * 2**40 for i in range(5)]


# A hostile HTTP server: endless, stalled, silent, truncated and failing answers -------------------------
class HostileServer:
    """Serves `directory` on 127.0.0.1 like a plain web server, except for the paths in `modes`:
    "endless" (200, no length, zeros forever), "stall" (headers and half the body, then nothing),
    "silent" (never answers), "truncated" (fewer bytes than Content-Length, then close), "500"."""

    def __init__(self, directory: Path, modes: dict[str, str]) -> None:
        import http.server
        import threading

        self.directory, self.modes, self.stop = directory, modes, threading.Event()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_HEAD(self) -> None:
                self._answer(body=False)

            def do_GET(self) -> None:
                try:
                    self._answer(body=True)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up, as it should
                    pass

            def _answer(self, body: bool) -> None:
                rel = self.path.lstrip("/")
                mode = outer.modes.get(rel)
                if mode == "silent":
                    outer.stop.wait(120)
                    return
                if mode == "500":
                    self.send_error(500)
                    return
                if mode == "endless":
                    self.send_response(200)
                    self.end_headers()
                    while body and not outer.stop.is_set():
                        self.wfile.write(b" " * 65536)
                    return
                path = outer.directory / rel
                if not path.is_file():
                    self.send_error(404)
                    return
                data, status = path.read_bytes(), 200
                ranged = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range") or "")
                if ranged:  # zarr reads shard indexes and chunks by byte range
                    a, b = int(ranged.group(1)), int(ranged.group(2) or len(data) - 1)
                    data, status = data[a : b + 1], 206
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if not body:
                    return
                if mode in ("stall", "truncated"):
                    self.wfile.write(data[: len(data) // 2])
                    self.wfile.flush()
                    if mode == "stall":
                        outer.stop.wait(120)
                    return
                self.wfile.write(data)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()


# H2: manifest reads are bounded ---------------------------------------------------------------------------
def test_h2_an_endless_http_manifest_stops_at_the_size_limit(pack, capsys, monkeypatch):
    import dctdata.format.manifest as manifest_mod

    monkeypatch.setattr(manifest_mod, "MAX_MANIFEST_BYTES", 1 << 20)
    with HostileServer(pack, {"manifest.json": "endless"}) as url:
        expected = r"manifest\.json: expected a manifest of at most 1048576 bytes\. Got more"
        with pytest.raises(DctDataError, match=expected):
            dctdata.open_dataset(url)
        assert main(["info", url]) == 1
        err = capsys.readouterr().err
        assert re.search(expected, err) and "Traceback" not in err


def test_h2_a_huge_local_manifest_is_refused_before_it_is_parsed(pack, monkeypatch):
    import dctdata.format.manifest as manifest_mod

    text = (pack / "manifest.json").read_text()
    (pack / "manifest.json").write_text(text + " " * (2 << 20))  # valid JSON, 2 MiB of trailing spaces
    monkeypatch.setattr(manifest_mod, "MAX_MANIFEST_BYTES", 1 << 20)
    with pytest.raises(DctDataError, match=r"manifest\.json: expected a manifest of at most 1048576 bytes"):
        dctdata.open_dataset(pack)
    monkeypatch.setattr(manifest_mod, "MAX_MANIFEST_BYTES", 4 << 20)
    assert len(dctdata.open_dataset(pack)) == N


# H3: a sample count the stored files cannot hold is refused at open --------------------------------------
def raise_count(root: Path, samples: int, in_zarr_json: bool) -> None:
    """Claim `samples` samples: in the manifest (and the last webdataset shard's count), and with
    `in_zarr_json` in every array's zarr.json too, checksums recomputed."""
    m = json.loads((root / "manifest.json").read_text())
    extra = samples - m["samples"]
    m["samples"] = samples
    if m["storage"] == "webdataset":
        m["layout"]["shards"][-1]["samples"] += extra
    elif in_zarr_json:
        for name in m["layout"]["arrays"]:
            meta = json.loads((root / name / "zarr.json").read_text())
            meta["shape"][0] = samples
            data = json.dumps(meta).encode()
            (root / name / "zarr.json").write_bytes(data)
            m["checksums"][f"{name}/zarr.json"] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    (root / "manifest.json").write_text(json.dumps(reseal(m)))


@pytest.mark.parametrize("in_zarr_json", [False, True])
def test_h3_a_trillion_samples_over_three_shards_is_refused_at_open(pack, capsys, in_zarr_json):
    raise_count(pack, 10**12, in_zarr_json)
    expected = (
        r"layout\.arrays\['image'\]: expected 250000000000 shard files listed in checksums \(1000000000000 samples, "
        r"\d+ per shard\)\. Got 3"
        if pack.name == "zarr"
        else r"layout\.shards\[2\]: expected at least \d+ bytes for 999999999992 samples of \d tar members each"
        r"( per \d+ samples)?\. Got \d+ bytes"
    )
    with pytest.raises(DctDataError, match=expected):
        dctdata.open_dataset(pack)
    rc, text = verify(capsys, pack)  # before: verify looped for 47 minutes
    assert rc == 1 and re.search(expected, text), text


# H4: only regular files inside the pack are opened --------------------------------------------------------
class deadline:
    """Fail (instead of hanging the suite) when the block runs past `seconds` (SIGALRM, main thread)."""

    def __init__(self, seconds: int) -> None:
        self.seconds = seconds

    def __enter__(self):
        import signal

        def fail(*_):
            raise TimeoutError(f"still running after {self.seconds} s (a read that never ends)")

        self.old = signal.signal(signal.SIGALRM, fail)
        signal.alarm(self.seconds)

    def __exit__(self, *exc) -> None:
        import signal

        signal.alarm(0)
        signal.signal(signal.SIGALRM, self.old)


SHARD = {"zarr": "image/c.1.0.0.0.0", "webdataset": "shard-000001.tar"}


@pytest.mark.parametrize("special", ["fifo", "dev_zero", "link_out"])
def test_h4_special_files_and_links_out_of_the_pack_are_refused(pack, tmp_path, capsys, special):
    import os

    shard = pack / SHARD[pack.name]
    outside = tmp_path / "outside.bin"
    outside.write_bytes(shard.read_bytes())  # the right bytes, but not inside the pack
    shard.unlink()
    if special == "fifo":
        os.mkfifo(shard)
    else:
        shard.symlink_to("/dev/zero" if special == "dev_zero" else outside)
    got = {"fifo": "a FIFO", "dev_zero": "a character device", "link_out": "a link to"}[special]
    expected = rf"{re.escape(SHARD[pack.name])}.*expected a (regular file|file inside the pack)\. Got {got}"
    kw = {"shuffle": False} if pack.name == "webdataset" else {}
    with deadline(60):
        with pytest.raises(IntegrityError, match=expected):
            read_all(dctdata.open_dataset(pack, **kw))
        skip = dctdata.open_dataset(pack, on_error="skip", **kw)
        assert len(read_all(skip)) == N - 4  # that shard's samples skipped, the rest read
        rc, text = verify(capsys, pack)
    assert rc == 1 and re.search(expected, text), text


def test_h4_a_fifo_or_device_manifest_is_refused(pack):
    import os

    (pack / "manifest.json").unlink()
    os.mkfifo(pack / "manifest.json")
    with deadline(60), pytest.raises(DctDataError, match=r"manifest\.json.*expected a regular file\. Got a FIFO"):
        dctdata.open_dataset(pack)


# H5 and B1: remote reads time out, and say what went wrong ---------------------------------------------------
def read_url(url: str, fmt: str, **kw):
    return read_all(dctdata.open_dataset(url, **({"shuffle": False} if fmt == "webdataset" else {}), **kw))


@pytest.mark.parametrize(
    "mode, cause",
    [
        ("stall", r"no answer in time .*storage_options=\{'timeout': seconds\} sets the idle limit"),
        ("500", r"(ClientResponseError|HTTP).*500"),
        ("truncated", r"(ClientPayloadError|ContentLengthError|Response payload is not completed|expected \d+ bytes)"),
    ],
)
def test_h5_b1_a_failing_shard_server_is_an_integrity_error_that_says_why(pack, mode, cause):
    options = {"storage_options": {"timeout": 1}}
    with HostileServer(pack, {SHARD[pack.name]: mode}) as url, deadline(60):
        with pytest.raises(IntegrityError, match=re.escape(SHARD[pack.name]) + ".*" + cause) as info:
            read_url(url, pack.name, **options)
        assert "no such file" not in str(info.value) and "missing" not in str(info.value)
        skip = read_url(url, pack.name, on_error="skip", **options)  # B1: skip mode skips it too
        assert len(skip) == N - 4


def test_h5_a_silent_server_times_out_naming_the_manifest(pack, capsys):
    import time

    with HostileServer(pack, {"manifest.json": "silent"}) as url, deadline(60):
        t = time.monotonic()
        with pytest.raises(
            DctDataError, match=r"manifest\.json: expected a readable dctdata manifest\. Got .*no answer"
        ):
            dctdata.open_dataset(url, storage_options={"timeout": 1})
        assert time.monotonic() - t < 30
    with pytest.raises(DctDataError, match=r"storage_options\['timeout'\]: expected seconds > 0 or None\. Got -1"):
        dctdata.open_dataset("http://127.0.0.1:9/x", storage_options={"timeout": -1})


def test_b1_verify_over_a_truncating_server_prints_problems_not_a_traceback(pack, capsys):
    with HostileServer(pack, {SHARD[pack.name]: "truncated"}) as url, deadline(60):
        rc, text = verify(capsys, url)
    assert rc == 1 and SHARD[pack.name] in text, text


# B3: a decompression bomb image is a clear error naming the file ------------------------------------------
def test_b3_decompression_bomb_image_is_a_clear_error(tmp_path, capsys, monkeypatch):
    from PIL import Image

    (tmp_path / "imgs").mkdir()
    Image.fromarray(np.zeros((64, 64), np.uint8)).save(tmp_path / "imgs" / "bomb.png")
    # Pillow refuses images over 2 * MAX_IMAGE_PIXELS (179 M by default): lower the limit instead of
    # writing a 179-megapixel file
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    expected = r"bomb\.png: expected an image of at most 2000 pixels \(Pillow's decompression-bomb limit"
    with pytest.raises(DctDataError, match=expected):
        dctdata.pack(tmp_path / "imgs", tmp_path / "out", cf=4, quiet=True)
    assert main(["pack", str(tmp_path / "imgs"), str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert re.search(expected, err) and "Traceback" not in err


# B2: threads sharing a fresh zarr dataset open it once, safely --------------------------------------------
def _read_after(barrier, ds, i: int, labels: dict, errors: list) -> None:
    barrier.wait()  # every thread makes the lazy first open at once
    try:
        labels[i] = int(ds[i % N][1])
    except Exception as exc:  # any failure is the finding
        errors.append(repr(exc))


def test_b2_threads_sharing_a_fresh_zarr_dataset_all_read_correctly(packs, monkeypatch):
    import random
    import threading
    import time

    from dctdata.format.zarr.reader import ZarrReader

    slow, opens = ZarrReader._read_metadata, []

    def slow_metadata(self):  # a remote store's uneven latency: the first opens overlap and end apart
        opens.append(1)
        time.sleep(random.random() * 0.05)
        return slow(self)

    monkeypatch.setattr(ZarrReader, "_read_metadata", slow_metadata)
    threads_per_dataset, rounds = 16, 10
    for _ in range(rounds):
        ds, opens[:] = dctdata.open_dataset(packs / "zarr"), []
        barrier, errors, labels = threading.Barrier(threads_per_dataset), [], {}
        threads = [
            threading.Thread(target=_read_after, args=(barrier, ds, i, labels, errors))
            for i in range(threads_per_dataset)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors[:3]
        assert labels == {i: i % N for i in range(threads_per_dataset)}
        assert len(opens) == 1  # one first open; the other threads waited for it instead of redoing it


# B4: --resume recovers from a stop at any point of the commit -----------------------------------------------
def test_b4_resume_after_a_stop_just_before_the_rename_commits_the_finished_pack(packs, tmp_path, monkeypatch):
    from sample_fields import files

    import dctdata.preprocess.commit as commit_mod
    from dctdata.preprocess.commit import partial_dir

    real = commit_mod.rename_into_place

    def stopped(tmp, out):
        raise KeyboardInterrupt  # Ctrl-C (or a kill) after the manifest, before the rename

    monkeypatch.setattr(commit_mod, "rename_into_place", stopped)
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        dctdata.pack(packs / "src.npz", out, cf=4, quiet=True)
    part = Path(partial_dir(str(out)))
    assert not out.exists() and (part / "manifest.json").exists()  # finished, not renamed
    monkeypatch.setattr(commit_mod, "rename_into_place", real)
    with pytest.raises(DctDataError, match=r"--resume: expected the settings of the interrupted pack\. Got different"):
        dctdata.pack(packs / "src.npz", out, cf=6, quiet=True, resume=True)
    m = dctdata.pack(packs / "src.npz", out, cf=4, quiet=True, resume=True)
    assert m.samples == N and not part.exists()
    dctdata.pack(packs / "src.npz", tmp_path / "ref", cf=4, quiet=True)
    assert files(out) == files(tmp_path / "ref")


def test_b4_overwrite_works_for_an_out_name_near_the_length_limit(packs, tmp_path):
    out = tmp_path / ("o" * 246)  # .OUT.partial is then 255 bytes, the most a name may have
    dctdata.pack(packs / "src.npz", out, cf=4, quiet=True)
    dctdata.pack(packs / "src.npz", out, cf=6, quiet=True, overwrite=True)
    assert dctdata.open_dataset(out).manifest.pack["cf"] == 6
    assert sorted(p.name for p in tmp_path.iterdir()) == [out.name]


# D2: a zarr reader during an --overwrite repack sees one pack or fails ------------------------------------------
def test_d2_a_reader_never_mixes_the_old_and_the_new_pack(packs, tmp_path):
    out = tmp_path / "out"
    dctdata.pack(packs / "src.npz", out, cf=4, quiet=True, writer_options={"chunk_samples": 2, "shard_samples": 4})
    np.savez(tmp_path / "new.npz", image=np.ones((N, 1, 16, 16), np.float32), label=np.arange(100, 100 + N))
    old = dctdata.open_dataset(out)
    assert int(old[0][1]) == 0  # the old pack's first shards are open
    dctdata.pack(tmp_path / "new.npz", out, cf=4, quiet=True, overwrite=True)  # replaced mid-epoch
    got = []
    with pytest.raises(IntegrityError, match=r"out: expected the pack this reader opened\. Got another directory"):
        for i in range(N):
            got.append(int(old[i][1]))
    assert got == list(range(len(got)))  # what it read before failing is all the old pack's
    fresh = dctdata.open_dataset(out)
    assert [int(fresh[i][1]) for i in range(N)] == list(range(100, 100 + N))
    import copy  # a DataLoader worker started after the repack (a copy through __getstate__) refuses too

    with pytest.raises(IntegrityError, match=r"expected the pack this reader opened"):
        copy.deepcopy(old)[N - 1]


# B5: odd values are errors, not tracebacks or huge allocations -------------------------------------------------
def test_b5_nul_byte_in_a_shard_name_is_a_format_error(packs, tmp_path, capsys):
    pack = Path(shutil.copytree(packs / "webdataset", tmp_path / "webdataset"))
    edit_manifest(pack, lambda m: m["layout"]["shards"][1].update(name="shard-\x00001.tar"))
    with pytest.raises(DctDataError, match=r"layout\.shards\[1\]\.name: expected a plain '\.tar' file name"):
        dctdata.open_dataset(pack)
    rc, text = verify(capsys, pack)
    assert rc == 1 and "expected a plain '.tar' file name" in text


def test_b5_a_manifest_declaring_millions_of_channels_is_refused(packs, tmp_path):
    pack = Path(shutil.copytree(packs / "zarr", tmp_path / "zarr"))

    def edit(m):
        m["fields"][0]["codec"]["channels"] = 30_000_000
        m["fields"][0]["shape"][0] = 30_000_000

    edit_manifest(pack, edit)
    with pytest.raises(DctDataError, match=r"channels: expected a positive int \(at most \d+\)\. Got 30000000"):
        dctdata.open_dataset(pack).decompressor()  # refused with the manifest (was a 15 GB allocation)


def test_b5_a_tensor_of_indices_is_a_type_error(packs):
    ds = dctdata.open_dataset(packs / "zarr")
    assert int(ds[torch.tensor(3)][1]) == 3
    with pytest.raises(
        TypeError, match=r"index: expected an int, a 0-d tensor or a slice .*Got a tensor of shape \(2,\)"
    ):
        ds[torch.tensor([1, 2])]
    assert [int(s[1]) for s in ds.__getitems__(torch.tensor([1, 2]).tolist())] == [1, 2]


@pytest.mark.parametrize("fmt", ["zarr", "webdataset"])
def test_b5_epochs_and_seeds_past_int64_are_refused(packs, fmt):
    from dctdata.loaders.distributed import make_loader, set_epoch

    loader = make_loader(dctdata.open_dataset(packs / fmt), batch_size=2)
    with pytest.raises(
        DctDataError, match=r"set_epoch: epoch: expected an int in 0\.\.\d+\. Got 1180591620717411303424"
    ):
        set_epoch(loader, 2**70)
    with pytest.raises(DctDataError, match=r"set_epoch: epoch: expected an int in 0\.\.\d+"):
        loader.set_epoch(2**70)
    with pytest.raises(DctDataError, match=r"seed: expected an int in 0\.\.\d+\. Got 1180591620717411303424"):
        make_loader(dctdata.open_dataset(packs / fmt), batch_size=2, seed=2**70)
    set_epoch(loader, 2**62)  # the largest epoch still iterates
    assert len(next(iter(loader))[1]) == 2


# H1: a zstd bomb is refused from its header, before it inflates ---------------------------------------------
def zstd_bomb(size: int) -> bytes:
    """A valid zstd frame declaring and holding `size` zero bytes, built from RLE blocks (4 bytes per
    128 KiB), so the test never holds the decoded bytes itself."""
    block = 1 << 17
    out = bytearray(b"\x28\xb5\x2f\xfd\xe0" + size.to_bytes(8, "little"))  # single segment, 8-byte content size
    left = size
    while left:
        n = min(block, left)
        left -= n
        out += ((n << 3) | (1 << 1) | (left == 0)).to_bytes(3, "little") + b"\x00"  # RLE block of n zeros
    return bytes(out)


def peak_rss() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def test_h1_zstd_bomb_frame_decodes_as_zstd(tmp_path):
    import numcodecs

    assert numcodecs.Zstd().decode(zstd_bomb(300_000)) == bytes(300_000)  # the helper makes real frames


def replace_member(shard: Path, member: str, data: bytes) -> None:
    import io
    import tarfile

    src = io.BytesIO(shard.read_bytes())
    out = io.BytesIO()
    with tarfile.open(fileobj=src) as tin, tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tout:
        for info in tin.getmembers():
            body = data if info.name == member else tin.extractfile(info).read()
            info.size = len(body)
            tout.addfile(info, io.BytesIO(body))
    shard.write_bytes(out.getvalue())


def rehash_shard(root: Path, name: str) -> None:
    data = (root / name).read_bytes()
    entry = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}

    def edit(m):
        m["checksums"][name] = entry
        for s in m["layout"]["shards"]:
            if s["name"] == name:
                s.update(entry)

    edit_manifest(root, edit)


def rebuild_zarr_shard_chunk0(shard: Path, chunk: bytes, chunks_per_shard: int) -> None:
    """Replace inner chunk 0 of a zarr shard (zstd then crc32c; index at the end, crc32c'd)."""
    import google_crc32c

    raw = shard.read_bytes()
    n = 16 * chunks_per_shard
    index = np.frombuffer(raw[-n - 4 : -4], "<u8").reshape(chunks_per_shard, 2)
    chunks = [raw[int(o) : int(o) + int(b)] for o, b in index]
    chunks[0] = chunk + google_crc32c.value(chunk).to_bytes(4, "little")
    body, entries = b"", []
    for c in chunks:
        entries.append((len(body), len(c)))
        body += c
    idx = np.asarray(entries, "<u8").tobytes()
    shard.write_bytes(body + idx + google_crc32c.value(idx).to_bytes(4, "little"))


BOMB = 2 << 30  # 2 GiB declared, 64 KiB stored


def test_h1_a_bomb_member_in_a_webdataset_shard_is_refused_from_its_header(packs, tmp_path, capsys):
    pack = Path(shutil.copytree(packs / "webdataset", tmp_path / "webdataset"))
    with tarfile.open(pack / "shard-000001.tar") as tf:  # the shard's first label member (one per group)
        label = next(t.name for t in tf if t.name.endswith(".label.npy.zst"))
    replace_member(pack / "shard-000001.tar", label, zstd_bomb(BOMB))
    rehash_shard(pack, "shard-000001.tar")  # a tamperer who recomputes checksums
    before = peak_rss()
    first = int(label.split(".")[0])
    with pytest.raises(
        IntegrityError,
        match=rf"samples? {first}(\.\.\d+)? field 'label': expected a stream of at most \d+ decoded bytes",
    ):
        read_all(dctdata.open_dataset(pack, shuffle=False))
    rc, text = verify(capsys, pack)
    assert rc == 1 and "expected a stream of at most" in text, text
    assert peak_rss() - before < 256 << 20  # was ~2 GB before any size check


def test_h1_a_bomb_chunk_in_a_zarr_shard_is_refused_from_its_header(packs, tmp_path, capsys):
    pack = Path(shutil.copytree(packs / "zarr", tmp_path / "zarr"))
    rebuild_zarr_shard_chunk0(pack / "label" / "c.1", zstd_bomb(BOMB), chunks_per_shard=2)
    rehash(pack, "label/c.1")
    before = peak_rss()
    with pytest.raises(IntegrityError, match=r"label/c\.1.*expected a stream of .*decoded bytes\. Got one declaring"):
        read_all(dctdata.open_dataset(pack))
    rc, text = verify(capsys, pack)
    assert rc == 1 and "decoded bytes" in text, text
    assert peak_rss() - before < 256 << 20  # was ~3 GB (decoded twice)


# A pinned manifest hash: a tampered pack with recomputed checksums is refused -----------------------------------
def test_open_dataset_with_a_pinned_manifest_sha256(pack, capsys):
    assert main(["info", str(pack)]) == 0
    pinned = re.search(r"manifest sha256: ([0-9a-f]{64})", capsys.readouterr().out).group(1)
    assert pinned == hashlib.sha256((pack / "manifest.json").read_bytes()).hexdigest()
    assert len(read_all(dctdata.open_dataset(pack, sha256=pinned))) == N
    edit_manifest(pack, lambda m: m["stats"]["image"].update(psnr_min=99.0))  # any change, checksums intact
    with pytest.raises(IntegrityError, match=r"manifest\.json: expected the pinned manifest \(sha256 [0-9a-f]{16}"):
        dctdata.open_dataset(pack, sha256=pinned)
    with pytest.raises(DctDataError, match=r"sha256: expected the manifest's sha256, 64 lowercase hex digits"):
        dctdata.open_dataset(pack, sha256="abc")


def test_b5_ctrl_c_while_the_cli_starts_is_one_line(monkeypatch, capsys):
    import subprocess
    import sys

    import dctdata.cli as cli

    probe = "import sys, dctdata.cli; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True).stdout.strip() == "False"

    def interrupted(*args):  # Ctrl-C while the commands (and torch) are imported
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "build_parser", interrupted)
    assert cli.main(["info", "x"]) == 130
    err = capsys.readouterr().err
    assert err == "dctdata: interrupted\n"
