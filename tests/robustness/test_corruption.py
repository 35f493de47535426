"""Corruption: flipped bytes, truncation and deletion of every kind of file in both formats
are detected by `dctdata verify` and by the loaders (error by default, skip-and-count on request),
and a zarr chunk missing inside an existing shard never reads as the fill value.

Run as a script to measure what the per-shard index check costs the zarr loader:
    python tests/test_corruption.py
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import google_crc32c
import numpy as np
import pytest
from pack_checks import read_all, rehash, reseal, verify

import dctdata
from dctdata.errors import DctDataError, FormatError, IntegrityError

N = 10


def source(tmp: Path, zeros_first: bool = False) -> Path:
    rng = np.random.default_rng(0)
    x = (20 + 5 * rng.standard_normal((N, 1, 16, 16))).astype(np.float32)
    if zeros_first:
        x[:2] = 0.0  # the first chunk's coefficients are all zero: must still be stored
    np.savez(tmp / "src.npz", image=x, label=np.arange(N, dtype=np.int64))
    return tmp / "src.npz"


@pytest.fixture(scope="module")
def packs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("packs")
    src = source(tmp)
    dctdata.pack(
        src, tmp / "zarr", cf=4, quant="int8", quiet=True, writer_options={"chunk_samples": 2, "shard_samples": 4}
    )
    dctdata.pack(src, tmp / "wds", format="webdataset", cf=4, quiet=True, writer_options={"samples_per_shard": 4})
    return tmp


@pytest.fixture
def zcopy(packs, tmp_path):
    return Path(shutil.copytree(packs / "zarr", tmp_path / "zarr"))


@pytest.fixture
def wcopy(packs, tmp_path):
    return Path(shutil.copytree(packs / "wds", tmp_path / "wds"))


def flip(path: Path, offset: int | None = None) -> None:
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2 if offset is None else offset] ^= 0xFF
    path.write_bytes(bytes(raw))


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])


def delete(path: Path) -> None:
    path.unlink()


DAMAGE = {"flip": flip, "truncate": truncate, "delete": delete}


# Every file of both formats x every damage -----------------------------------------------------
ZARR_FILES = ["manifest.json", "zarr.json", "image/zarr.json", "label/zarr.json", "image/c.1.0.0.0.0", "label/c.2"]
WDS_FILES = ["manifest.json", "shard-000001.tar"]


@pytest.mark.parametrize("damage", list(DAMAGE))
@pytest.mark.parametrize("rel", ZARR_FILES)
def test_zarr_damage_is_detected(zcopy, capsys, rel, damage):
    DAMAGE[damage](zcopy / rel)
    rc, text = verify(capsys, zcopy)
    assert rc == 1 and rel.split("/")[-1] in text, text
    with pytest.raises(DctDataError, match=rel.replace(".", r"\.")):
        read_all(dctdata.open_dataset(zcopy))


@pytest.mark.parametrize("damage", list(DAMAGE))
@pytest.mark.parametrize("rel", WDS_FILES)
def test_webdataset_damage_is_detected(wcopy, capsys, rel, damage):
    DAMAGE[damage](wcopy / rel)
    rc, text = verify(capsys, wcopy)
    assert rc == 1 and rel in text, text
    with pytest.raises(DctDataError, match=rel.replace(".", r"\.")):
        read_all(dctdata.open_dataset(wcopy, shuffle=False))


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_zarr_skip_mode_counts_bad_samples(zcopy, damage):
    DAMAGE[damage](zcopy / "image" / "c.1.0.0.0.0")  # samples 4..7
    ds = dctdata.open_dataset(zcopy, on_error="skip")
    got = [int(s[1]) for s in read_all(ds)]
    lost = sorted(set(range(N)) - set(got))
    assert set(lost) <= {4, 5, 6, 7} and len(lost) == ds.skipped  # only that shard's samples, each counted
    # a flipped byte spoils one chunk (crc32c); a truncated or deleted shard all of its samples
    assert ds.skipped == (2 if damage == "flip" else 4)


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_webdataset_skip_mode_counts_bad_shards(wcopy, damage):
    DAMAGE[damage](wcopy / "shard-000001.tar")  # samples 4..7
    ds = dctdata.open_dataset(wcopy, on_error="skip", shuffle=False)
    assert sorted(int(s[1]) for s in read_all(ds)) == [0, 1, 2, 3, 8, 9]
    assert ds.stats["shards_skipped"] == 1 and ds.stats["samples_skipped"] == 4


# A chunk missing inside an existing shard ---------------------------------------------------------
def empty_chunk_entry(shard: Path, chunk: int, chunks_per_shard: int) -> None:
    """Hand-edit a zarr shard index: mark inner chunk `chunk` as absent (offset = nbytes = 2^64-1) and
    re-seal the index crc32c, exactly as zarr marks a chunk it never wrote."""
    raw = bytearray(shard.read_bytes())
    n = 16 * chunks_per_shard
    index = bytearray(raw[-n - 4 : -4])
    index[16 * chunk : 16 * chunk + 16] = b"\xff" * 16
    raw[-n - 4 :] = bytes(index) + google_crc32c.value(bytes(index)).to_bytes(4, "little")
    shard.write_bytes(bytes(raw))


def test_missing_chunk_inside_a_shard_is_not_fill_value(zcopy, capsys):
    import zarr

    empty_chunk_entry(zcopy / "image" / "c.1.0.0.0.0", chunk=1, chunks_per_shard=2)  # samples 6..7
    assert not zarr.open_array(zcopy / "image", mode="r")[6:8].any()  # what plain zarr gives: silent zeros
    ds = dctdata.open_dataset(zcopy)
    with pytest.raises(
        IntegrityError,
        match=r"image/c\.1\.0\.0\.0\.0: field 'image' samples 6\.\.7 \(chunk 3\): expected a stored chunk\. "
        r"Got an empty shard-index entry",
    ):
        ds[6]
    skip = dctdata.open_dataset(zcopy, on_error="skip")
    assert len(skip.__getitems__(list(range(N)))) == N - 4 and skip.skipped == 4  # the shard is unusable as a whole
    rehash(zcopy, "image/c.1.0.0.0.0")  # even with a matching checksum, verify's decode catches it
    rc, text = verify(capsys, zcopy)
    assert rc == 1 and "expected a stored chunk" in text


def test_chunk_entry_pointing_past_the_file_is_truncation(zcopy):
    shard = zcopy / "image" / "c.0.0.0.0.0"
    raw = bytearray(shard.read_bytes())
    index = bytearray(raw[-36:-4])
    index[0:8] = (len(raw) + 100).to_bytes(8, "little")
    raw[-36:] = bytes(index) + google_crc32c.value(bytes(index)).to_bytes(4, "little")
    shard.write_bytes(bytes(raw))
    with pytest.raises(
        IntegrityError, match=r"samples 0\.\.1 \(chunk 0\): expected a chunk inside the shard's \d+ bytes"
    ):
        dctdata.open_dataset(zcopy)[0]


def test_all_zero_chunks_are_stored_not_elided(tmp_path, capsys):
    """Regression: the zarr writer reopened arrays without write_empty_chunks, so all-zero shards were
    never written (the pack failed) and an all-zero chunk would have read as 'missing'."""
    src = source(tmp_path, zeros_first=True)
    dctdata.pack(src, tmp_path / "z", cf=4, quiet=True, writer_options={"chunk_samples": 2, "shard_samples": 4})
    np.save(tmp_path / "zeros.npy", np.zeros((3, 8, 8), np.float32))
    dctdata.pack(tmp_path / "zeros.npy", tmp_path / "z0", quiet=True)
    for root in ("z", "z0"):
        rc, text = verify(capsys, tmp_path / root)
        assert rc == 0, text
    ds = dctdata.open_dataset(tmp_path / "z")
    assert not ds[0][0].any() and ds[5][0].any()


def test_layout_disagreeing_with_zarr_metadata(zcopy):
    m = json.loads((zcopy / "manifest.json").read_text())
    m["layout"]["arrays"]["image"]["chunk"] = 4  # the same shard files, other chunks
    (zcopy / "manifest.json").write_text(json.dumps(reseal(m)))
    with pytest.raises(
        IntegrityError,
        match=r"image/zarr\.json: field 'image': expected shards of 4 and chunks of 4 samples .*Got shard shape \(4,",
    ):
        dctdata.open_dataset(zcopy)[0]
    m["layout"]["arrays"]["image"].update(chunk=2, shard=8)  # a shard size the listed files contradict
    (zcopy / "manifest.json").write_text(json.dumps(reseal(m)))
    with pytest.raises(
        FormatError,
        match=r"layout\.arrays\['image'\]: expected 2 shard files listed in checksums \(10 samples, 8 per shard\)",
    ):
        dctdata.open_dataset(zcopy)


# Cost of the shard-index check ------------------------------------------------------------------
def bench(n: int = 4096, size: int = 64, repeats: int = 5) -> None:  # pragma: no cover - run by hand
    """Samples/s of a full pass (batches of 64, fresh dataset each pass so every shard index is read)
    with the check and with it disabled."""
    import tempfile

    from dctdata.format.zarr.reader import ZarrReader

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        x = (np.random.default_rng(0).standard_normal((n, 1, size, size)) + 20).astype(np.float32)
        np.save(tmp / "x.npy", x)
        dctdata.pack(
            tmp / "x.npy",
            tmp / "z",
            cf=4,
            quant="int8",
            quiet=True,
            writer_options={"chunk_samples": 16, "shard_samples": 64},
        )

        def one_pass():
            ds = dctdata.open_dataset(tmp / "z")
            t = time.perf_counter()
            for a in range(0, n, 64):
                ds.__getitems__(list(range(a, a + 64)))
            return n / (time.perf_counter() - t)

        original = ZarrReader._check_shard_index
        rows = []
        for label, patch in (("index check (default)", original), ("no check", lambda self, f, s, key: None)):
            ZarrReader._check_shard_index = patch
            try:
                rates = sorted(one_pass() for _ in range(repeats))
            finally:
                ZarrReader._check_shard_index = original
            rows.append((label, rates[len(rates) // 2]))
        print(
            f"{n} samples 1x{size}x{size} int8 cf=4, {n // 64} shards, batches of 64, median of {repeats} fresh passes"
        )
        for label, rate in rows:
            print(f"| {label} | {rate:,.0f} samples/s |")
        print(f"overhead: {100 * (rows[1][1] / rows[0][1] - 1):+.1f}%")


if __name__ == "__main__" and sys.argv[1:] in ([], ["bench"]):  # pragma: no cover
    bench()
