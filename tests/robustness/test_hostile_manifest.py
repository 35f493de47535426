"""Hostile manifests and what a pack commits (issue 30, round two): one regression test per finding, each
reproducing it from scratch.

3: the manifest seals what decoding depends on; one changed character is refused on every read.
5: a declared chunk is bounded by the sample count and a byte cap (reader, verify and writer).
10: a manifest past the readers' cap is never committed (refused before packing when it can be told).
11: `--overwrite` of an OUT that is a symlink replaces the pack it points to, atomically.
16: a full disk names the file, prints no second traceback, and leaves a resumable pack.
(reproducer 11 of the issue's folder) every file a pack writes takes the user's umask, the manifest too.
17: array and label fields have a shape bound like dct fields.
"""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from pack_checks import as_version, read_all, reseal, verify

import dctdata
from dctdata.cli import main
from dctdata.errors import DctDataError, FormatError, IntegrityError
from dctdata.format import FORMAT_VERSION
from dctdata.preprocess.commit import partial_dir

N = 10


@pytest.fixture(scope="module")
def packs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("packs")
    rng = np.random.default_rng(0)
    x = np.cumsum(np.cumsum(rng.standard_normal((N, 2, 16, 16)), 2), 3).astype(np.float32)
    np.savez(tmp / "src.npz", image=x, label=np.arange(N, dtype=np.int64))
    opts = {"chunk_samples": 2, "shard_samples": 4}
    dctdata.pack(tmp / "src.npz", tmp / "zarr", target_psnr=35, quant="int8", quiet=True, writer_options=opts)
    dctdata.pack(tmp / "src.npz", tmp / "webdataset", format="webdataset", cf=4, quiet=True)
    return tmp


@pytest.fixture(params=["zarr", "webdataset"])
def pack(request, packs, tmp_path) -> Path:
    return Path(shutil.copytree(packs / request.param, tmp_path / request.param))


def _text_edit(root: Path, pattern: str, change) -> None:
    """Change the manifest's text in place at the first match of `pattern` (group 1), not resealed."""
    text = (root / "manifest.json").read_text()
    m = re.search(pattern, text)
    assert m, pattern
    (root / "manifest.json").write_text(text[: m.start(1)] + change(m.group(1)) + text[m.end(1) :])


def _json_edit(root: Path, edit, sealed: bool = False) -> None:
    m = json.loads((root / "manifest.json").read_text())
    edit(m)
    (root / "manifest.json").write_text(json.dumps(reseal(m) if sealed else m))


SEAL = (  # version 8 writes the digest as base64url (versions 5-7: "sha256:" + hex)
    r"manifest\.json: seal: expected [A-Za-z0-9_-]{23}\.\.\. \(the sha256 of the manifest's fields, codecs, layout, "
    r"checksums and sample count as written\)\. Got [A-Za-z0-9_-]{23}\.\.\. \(the manifest was changed or damaged"
)


# 3: the manifest seals itself ---------------------------------------------------------------------------------
def test_3_one_changed_digit_of_a_quantization_step_is_refused_on_every_read(packs, tmp_path, capsys):
    root = Path(shutil.copytree(packs / "zarr", tmp_path / "p"))
    _text_edit(root, r'"steps":\[+\d\.(\d)', lambda d: str((int(d) + 1) % 10))  # 44 dB became 27 dB before
    with pytest.raises(IntegrityError, match=SEAL):
        dctdata.open_dataset(root)
    rc, text = verify(capsys, root)
    assert rc == 1 and re.search(SEAL, text), text
    assert main(["info", str(root)]) == 1 and re.search(SEAL, capsys.readouterr().err)


def _table(m):
    codec = m["fields"][0]["codec"]
    if codec.get("steps"):  # one step of a (C,) or (C, K) table, 1.5 times larger
        row = codec["steps"] if not isinstance(codec["steps"][0], list) else codec["steps"][0]
        row[0] *= 1.5
    else:
        codec["cf"] = 3


def _samples(m):
    m["samples"] -= 1
    if m["storage"] == "webdataset":
        m["layout"]["shards"][-1]["samples"] -= 1


def _coords(m):
    m["coords"] = {"t": {"dim": "sample", "sample": True, "dtype": "int64", "values": list(range(N)), "attrs": {}}}


@pytest.mark.parametrize(
    "edit",
    [
        _table,
        lambda m: next(f for f in m["fields"] if f["name"] == "label")["lossless"].update(level=3),
        lambda m: m["layout"].update(note="x"),
        lambda m: m["checksums"].update({k: "A" * 43 + ":" + v.split(":")[1] for k, v in m["checksums"].items()}),
        _samples,
    ],
    ids=["a table value", "the lossless stage", "the layout", "a checksum", "the sample count"],
)
def test_3_any_edit_of_a_sealed_entry_is_refused(pack, capsys, edit):
    _json_edit(pack, edit)
    with pytest.raises(IntegrityError, match=SEAL):
        dctdata.open_dataset(pack)
    rc, text = verify(capsys, pack)
    assert rc == 1 and re.search(SEAL, text), text


def test_3_coordinates_are_sealed(packs, tmp_path):
    import xarray as xr

    x = np.random.default_rng(0).standard_normal((N, 16, 16)).astype(np.float32)
    ds = xr.Dataset({"t2m": (("time", "y", "x"), x)}, coords={"time": np.arange(N).astype("datetime64[D]")})
    dctdata.pack(ds, tmp_path / "p", cf=4, quiet=True, sample_dim="time")
    _text_edit(tmp_path / "p", r'"1970-01-0(2)', lambda d: "3")  # the second sample's date
    with pytest.raises(IntegrityError, match=SEAL):
        dctdata.open_dataset(tmp_path / "p")


def test_3_descriptive_entries_stay_outside_the_seal(pack):
    def edit(m):
        m["dctdata_version"] = "0.0.0-edited"
        m["pack"]["source"] = "elsewhere.npy"
        m["stats"]["image"]["psnr_min"] = 1.0

    _json_edit(pack, edit)
    ds = dctdata.open_dataset(pack)
    assert ds.manifest.dctdata_version == "0.0.0-edited" and ds.manifest.stats["image"].psnr_min == 1.0


def test_3_older_unsealed_versions_still_read_and_a_seal_present_must_match(pack):
    assert json.loads((pack / "manifest.json").read_text())["version"] == FORMAT_VERSION == 8
    before = read_all(dctdata.open_dataset(pack, **({"shuffle": False} if pack.name == "webdataset" else {})))
    _json_edit(pack, lambda m: (m.pop("seal"), as_version(m, 4)))  # as an older release wrote it
    after = read_all(dctdata.open_dataset(pack, **({"shuffle": False} if pack.name == "webdataset" else {})))
    assert len(after) == len(before) == N
    _json_edit(pack, lambda m: m.update(seal="sha256:" + "0" * 64))
    with pytest.raises(FormatError, match=r"expected keys .*Got unknown keys \['seal'\]"):
        dctdata.open_dataset(pack)
    _json_edit(pack, lambda m: (m.pop("seal"), as_version(m, 5)))  # version 5 written without the seal
    assert len(read_all(dctdata.open_dataset(pack, **({"shuffle": False} if pack.name == "webdataset" else {})))) == N
    _json_edit(pack, lambda m: m.update(seal=7))
    with pytest.raises(IntegrityError, match=r"seal: expected sha256:[0-9a-f]{16}.*Got int"):
        dctdata.open_dataset(pack)


def test_3_a_resealed_edit_reads_and_a_pinned_sha256_still_refuses_it(pack):
    """The seal catches damage, not a tamperer who reseals: `sha256=` pins a pack against that."""
    digest = __import__("hashlib").sha256((pack / "manifest.json").read_bytes()).hexdigest()
    _json_edit(pack, lambda m: m["layout"].update(note="x"), sealed=True)
    dctdata.open_dataset(pack)
    with pytest.raises(IntegrityError, match=r"expected the pinned manifest"):
        dctdata.open_dataset(pack, sha256=digest)


# 5: chunks bounded by the sample count and a byte cap -----------------------------------------------------------
def test_5_a_chunk_of_four_million_samples_is_refused_at_open_and_by_verify(packs, tmp_path, capsys):
    root = Path(shutil.copytree(packs / "zarr", tmp_path / "p"))
    _json_edit(root, lambda m: m["layout"]["arrays"]["image"].update(chunk=1 << 22, shard=1 << 22), sealed=True)
    expected = (
        r"layout\.arrays\['image'\]\.chunk: expected chunks of one sample, or of at most 16777216 bytes and fewer than "
        r"twice the 10 samples \(or at most 131072 bytes\)\. Got 4194304 samples = \d+ bytes"
    )
    with pytest.raises(FormatError, match=expected):
        dctdata.open_dataset(root)
    rc, text = verify(capsys, root)
    assert rc == 1 and re.search(expected, text), text


def test_5_a_chunk_past_the_sample_count_is_refused_above_the_small_cap(packs, tmp_path, monkeypatch):
    import dctdata.format.zarr.layout as layout

    root = Path(shutil.copytree(packs / "zarr", tmp_path / "p"))
    monkeypatch.setattr(layout, "SMALL_CHUNK_BYTES", 64)  # the samples here are small: scale the cap down
    _json_edit(root, lambda m: m["layout"]["arrays"]["label"].update(chunk=32, shard=32), sealed=True)
    with pytest.raises(FormatError, match=r"\['label'\]\.chunk: expected chunks .*Got 32 samples = 256 bytes"):
        dctdata.open_dataset(root)


def test_5_the_writer_refuses_the_chunks_the_reader_would_and_keeps_small_ones(tmp_path):
    x = np.zeros((N, 1, 8, 8), np.float32)
    with pytest.raises(DctDataError, match=r"chunk_samples: field 'image': expected chunks of one sample, or of at"):
        dctdata.pack(x, tmp_path / "big", cf=4, quiet=True, writer_options={"chunk_samples": 1 << 20})
    assert not (tmp_path / "big").exists()
    dctdata.pack(x, tmp_path / "small", cf=4, quiet=True, writer_options={"chunk_samples": 1024})  # 64 KiB: fine
    assert len(read_all(dctdata.open_dataset(tmp_path / "small"))) == N


# 17: array and label fields have a shape bound ---------------------------------------------------------------------
@pytest.mark.parametrize("shape", [[1 << 20, 1 << 20], [1 << 31, 1 << 31], [1] * 33])
def test_17_a_huge_declared_array_shape_is_a_format_error_at_open(pack, capsys, shape):
    def edit(m):
        label = next(f for f in m["fields"] if f["name"] == "label")
        label.update(kind="array", shape=shape)

    _json_edit(pack, edit, sealed=True)
    expected = r"field 'label': shape: expected at most 32 dims and 4294967296 values per sample\. Got \["
    with pytest.raises(FormatError, match=expected):
        dctdata.open_dataset(pack)
    rc, text = verify(capsys, pack)
    assert rc == 1 and re.search(expected, text), text


# 10: a manifest the readers would refuse is never committed -------------------------------------------------------
def test_10_a_huge_attribute_is_refused_before_packing_and_the_old_pack_stays(tmp_path, monkeypatch):
    import xarray as xr

    import dctdata.format.manifest as manifest_mod

    out = tmp_path / "train.dct"
    dctdata.pack(np.zeros((4, 1, 16, 16), np.float32), out, cf=4, quiet=True)
    monkeypatch.setattr(manifest_mod, "MAX_MANIFEST_BYTES", 64 << 10)  # 64 KiB stands for 64 MiB
    x = np.random.default_rng(0).standard_normal((8, 16, 16)).astype(np.float32)
    ds = xr.Dataset({"t2m": (("time", "y", "x"), x, {"units": "K", "history": "h" * (65 << 10)})})
    expected = (
        r"manifest: expected at most 65536 bytes \(the most a reader opens\)\. Got about \d+ bytes, mostly "
        r"fields\['t2m'\] 0\.1 MiB.*nothing was committed"
    )
    with pytest.raises(DctDataError, match=expected):
        dctdata.pack(ds, out, cf=4, quiet=True, sample_dim="time", overwrite=True)
    assert len(dctdata.open_dataset(out)) == 4 and not os.path.exists(partial_dir(str(out)))


@pytest.mark.parametrize("fmt", ["zarr", "webdataset"])
def test_10_a_manifest_found_too_big_at_the_commit_replaces_nothing(tmp_path, monkeypatch, fmt):
    import dctdata.format.manifest as manifest_mod
    import dctdata.preprocess.pack as pack_mod

    out = tmp_path / "train.dct"
    dctdata.pack(np.zeros((4, 1, 16, 16), np.float32), out, cf=4, quiet=True)
    x = np.random.default_rng(0).standard_normal((64, 1, 16, 16)).astype(np.float32)
    opts = {"samples_per_shard": 1} if fmt == "webdataset" else {"shard_samples": 1}  # many files, many entries
    size = len(dctdata.pack(x, tmp_path / "probe", format=fmt, cf=4, quiet=True, writer_options=opts).to_json())
    monkeypatch.setattr(manifest_mod, "MAX_MANIFEST_BYTES", size - 1)
    monkeypatch.setattr(pack_mod, "FILE_ENTRY_BYTES", 0)  # the estimate misses it: the commit must not
    with pytest.raises(DctDataError, match=rf"manifest: expected at most {size - 1} bytes .*Got {size} bytes, mostly"):
        dctdata.pack(x, out, format=fmt, cf=4, quiet=True, writer_options=opts, overwrite=True)
    assert len(dctdata.open_dataset(out)) == 4 and not os.path.exists(partial_dir(str(out)))
    # the incremental Writer commits through the same check
    monkeypatch.setattr(manifest_mod, "MAX_MANIFEST_BYTES", size // 2)
    with pytest.raises(DctDataError, match=r"manifest: expected at most"):
        with dctdata.Writer(tmp_path / "w", format=fmt, cf=4, writer_options=opts) as w:
            for s in x:
                w.write(s)
    assert not (tmp_path / "w").exists()


# 11: --overwrite of a symlinked OUT -------------------------------------------------------------------------------
def test_11_overwrite_through_a_symlink_replaces_the_pack_it_points_to(tmp_path, capsys):
    (tmp_path / "disk").mkdir()
    target = tmp_path / "disk" / "train.dct"
    link = tmp_path / "train.dct"
    dctdata.pack(np.zeros((4, 1, 16, 16), np.float32), target, cf=4, quiet=True)
    link.symlink_to(target)
    with pytest.raises(DctDataError, match=r"expected an OUT path that does not exist\. Got an existing path"):
        dctdata.pack(np.ones((6, 1, 16, 16), np.float32), link, cf=4, quiet=True)
    dctdata.pack(np.ones((6, 1, 16, 16), np.float32), link, cf=4, quiet=True, overwrite=True)
    assert link.is_symlink() and os.readlink(link) == str(target)  # the link stays, and names the new pack
    assert len(dctdata.open_dataset(link)) == len(dctdata.open_dataset(target)) == 6
    assert sorted(p.name for p in tmp_path.iterdir()) == ["disk", "train.dct"]  # nothing left beside either
    assert sorted(p.name for p in (tmp_path / "disk").iterdir()) == ["train.dct"]
    np.save(tmp_path / "x.npy", np.ones((3, 1, 16, 16), np.float32))
    assert main(["pack", str(tmp_path / "x.npy"), str(link), "--cf", "4", "--overwrite", "--quiet"]) == 0
    assert link.is_symlink() and len(dctdata.open_dataset(target)) == 3


# The manifest's mode (reproducer 11): files take the user's umask -------------------------------------------------
@pytest.mark.parametrize("umask", [0o022, 0o007])
@pytest.mark.parametrize("fmt", ["zarr", "webdataset"])
def test_every_file_of_a_pack_and_a_cache_entry_take_the_umask(tmp_path, fmt, umask):
    old = os.umask(umask)
    try:
        dctdata.pack(np.zeros((4, 1, 16, 16), np.float32), tmp_path / "out", format=fmt, cf=4, quiet=True)
        if fmt == "webdataset":
            read_all(dctdata.open_dataset(tmp_path / "out", cache_dir=tmp_path / "cache", shuffle=False))
    finally:
        os.umask(old)
    files = [p for p in (tmp_path / "out").rglob("*") if p.is_file()]
    files += [p for p in (tmp_path / "cache").glob("*") if p.is_file()] if fmt == "webdataset" else []
    assert tmp_path / "out" / "manifest.json" in files and (fmt == "zarr" or any("cache" in str(p) for p in files))
    modes = {str(p.relative_to(tmp_path)): oct(p.stat().st_mode & 0o777) for p in files}
    assert set(modes.values()) == {oct(0o666 & ~umask)}, modes  # the manifest was 0600 whatever the umask


def test_atomic_write_takes_the_umask_and_never_follows_a_planted_link(tmp_path):
    from dctdata.format.atomic import atomic_write, create_exclusive

    old = os.umask(0o027)
    try:
        atomic_write(tmp_path / "a.json", b"{}")
        fd, name = create_exclusive(str(tmp_path), "x")
        os.close(fd)
    finally:
        os.umask(old)
    assert (tmp_path / "a.json").stat().st_mode & 0o777 == 0o640 and os.stat(name).st_mode & 0o777 == 0o640
    (tmp_path / "secret").write_bytes(b"keep")
    os.symlink(tmp_path / "secret", tmp_path / "b.json")
    atomic_write(tmp_path / "b.json", b"new")  # the link is replaced, not written through
    assert (tmp_path / "secret").read_bytes() == b"keep" and (tmp_path / "b.json").read_bytes() == b"new"
    assert not (tmp_path / "b.json").is_symlink()


# 16: a full disk ------------------------------------------------------------------------------------------------------
def _limited():
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (12 << 10, 12 << 10))  # any file past 12 KiB: EFBIG, as a full disk


@pytest.mark.parametrize("fmt", [pytest.param("webdataset", marks=pytest.mark.slow), "zarr"])
def test_16_a_full_disk_names_the_file_and_the_pack_resumes(tmp_path, fmt):
    x = np.cumsum(np.cumsum(np.random.default_rng(5).standard_normal((48, 2, 64, 64)), 2), 3).astype(np.float32)
    np.save(tmp_path / "src.npy", x)
    cmd = [sys.executable, "-m", "dctdata", "pack", str(tmp_path / "src.npy"), str(tmp_path / "out"), "--format", fmt,
           "--cf", "8", "--lossless", "zstd:1", "--quiet"]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=_limited, timeout=600)
    assert r.returncode == 1, r.stderr
    partial = re.escape(partial_dir(str(tmp_path / "out")))
    assert re.search(rf"dctdata pack: error: File too large: {partial}/\S+", r.stderr), r.stderr
    assert "Traceback" not in r.stderr and "Exception ignored" not in r.stderr, r.stderr
    r = subprocess.run([*cmd, "--resume"], capture_output=True, text=True, timeout=600)  # room again: it finishes
    assert r.returncode == 0, r.stderr
    assert main(["verify", str(tmp_path / "out")]) == 0
