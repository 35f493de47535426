"""The local shard cache of remote webdataset packs (`cache_dir=`): the second epoch comes from disk
with no HTTP request, the cache stays under its size limit (LRU), a damaged copy is fetched again, and
an unwritable or full cache directory is one clear error."""

from __future__ import annotations

import errno
import os

import pytest
import torch
from sample_fields import N
from servers import serve

import dctdata
from dctdata.errors import DctDataError
from dctdata.format import cache as cache_module
from dctdata.format.cache import ShardCache


@pytest.fixture(scope="module")
def pack(labelled_source, tmp_path_factory):
    out = tmp_path_factory.mktemp("packs") / "wds"
    dctdata.pack(labelled_source, out, format="webdataset", quiet=True)  # 16 shards of 4 samples
    return out


@pytest.fixture
def url(pack):
    with serve(pack) as u:
        yield u


def shard_requests(url):
    return [p for p in url.requests if p.endswith(".tar")]


def epoch(ds, workers=0, e=0):
    ds.set_epoch(e)
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers)
    return sorted(int(s[1]) for s in loader)


@pytest.mark.parametrize("workers", [0, 2])
def test_second_epoch_is_served_from_disk_without_http(url, tmp_path, workers):
    ds = dctdata.open_dataset(url, cache_dir=tmp_path / "cache")
    assert epoch(ds, workers, 0) == list(range(N))
    assert len({p for p in shard_requests(url)}) == 16
    assert len(os.listdir(tmp_path / "cache")) == 16
    url.clear()
    assert epoch(ds, workers, 1) == list(range(N))
    assert url.requests == []  # not one request: every shard came from the cache
    again = dctdata.open_dataset(url, cache_dir=tmp_path / "cache")  # a new job reuses it too
    url.clear()
    assert epoch(again, workers, 2) == list(range(N)) and shard_requests(url) == []


def test_cache_is_bounded_least_recently_used_first(url, pack, tmp_path):
    sizes = [e["bytes"] for e in dctdata.format.read_manifest(pack).layout["shards"]]
    limit = sum(sizes[:5]) + sizes[0] // 2  # room for 5 shards
    ds = dctdata.open_dataset(url, cache_dir=tmp_path / "c", cache_limit=limit, shuffle=False)
    assert epoch(ds) == list(range(N))
    kept = sorted(os.listdir(tmp_path / "c"))
    assert len(kept) == 5 and sum(os.path.getsize(tmp_path / "c" / k) for k in kept) <= limit
    shas = [e["sha256"] for e in dctdata.format.read_manifest(pack).layout["shards"]]
    assert kept == sorted(f"{s}.tar" for s in shas[-5:])  # the last five read are the ones kept
    url.clear()
    assert epoch(ds) == list(range(N))
    assert len({p for p in shard_requests(url)}) == 16  # a full pass through a too-small cache refetches
    assert sum(os.path.getsize(tmp_path / "c" / k) for k in os.listdir(tmp_path / "c")) <= limit


def test_damaged_cached_copy_is_fetched_again(url, tmp_path, caplog):
    ds = dctdata.open_dataset(url, cache_dir=tmp_path / "c")
    epoch(ds)
    victim = sorted((tmp_path / "c").iterdir())[3]
    good = victim.read_bytes()
    data = bytearray(good)
    data[700] ^= 0xFF
    victim.write_bytes(bytes(data))
    url.clear()
    with caplog.at_level("WARNING"):
        assert epoch(ds, e=1) == list(range(N))
    assert "fails its size or sha256 check" in caplog.text
    assert len({p for p in shard_requests(url)}) == 1  # only the damaged one
    assert ShardCache(tmp_path / "c").get(victim.stem, len(good)) == good  # and its good copy is back


def test_unwritable_cache_dir_is_one_error(url, tmp_path):
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(DctDataError, match=r"cache_dir .*file/cache: expected a writable directory. Got "):
        dctdata.open_dataset(url, cache_dir=tmp_path / "file" / "cache")
    if os.geteuid() != 0:  # root writes anywhere
        (tmp_path / "ro").mkdir(mode=0o500)
        with pytest.raises(DctDataError, match=r"cache_dir .*ro: expected a writable directory. Got PermissionError"):
            dctdata.open_dataset(url, cache_dir=tmp_path / "ro")


def test_full_cache_dir_is_one_error(url, pack, tmp_path, monkeypatch):
    largest = max(e["bytes"] for e in dctdata.format.read_manifest(pack).layout["shards"])
    with pytest.raises(DctDataError, match=rf"cache_limit: expected at least the largest shard \({largest} bytes\)"):
        dctdata.open_dataset(url, cache_dir=tmp_path / "c", cache_limit="1KiB")

    class Usage:
        free = 100

    monkeypatch.setattr(cache_module.shutil, "disk_usage", lambda path: Usage)
    with pytest.raises(DctDataError, match=r"cache_dir .*: expected room for the largest shard .* Got 100 bytes free"):
        dctdata.open_dataset(url, cache_dir=tmp_path / "c")
    monkeypatch.undo()

    ds = dctdata.open_dataset(url, cache_dir=tmp_path / "d")

    def no_space(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(cache_module.os, "fdopen", no_space)  # the disk fills up mid-epoch
    with pytest.raises(DctDataError, match=r"cache_dir .*d: expected room to write .*\(cache disk is full\)"):
        epoch(ds)
    assert [p for p in os.listdir(tmp_path / "d") if p.startswith(".part-")] == []  # no half-written file


def test_cache_dir_is_refused_for_zarr_packs(labelled_source, tmp_path):
    dctdata.pack(labelled_source, tmp_path / "z", format="zarr", quiet=True)
    with pytest.raises(DctDataError, match="cache_dir: expected a webdataset pack"):
        dctdata.open_dataset(tmp_path / "z", cache_dir=tmp_path / "c")
