"""`ReadOptions`: the read options (decode, on_error, the shard cache, read threads) as one frozen object,
checked once; `open_dataset(path, options=...)` and the datasets take it, and their keywords build it."""

from __future__ import annotations

import dataclasses
import pickle

import pytest
import torch

import dctdata
from dctdata.errors import DctDataError
from dctdata.loaders.options import READ_OPTIONS, ReadOptions
from dctdata.loaders.wds_dataset import DCTWebDataset
from dctdata.loaders.zarr_dataset import DCTZarrDataset


@pytest.fixture(scope="module")
def packs(labelled_source, tmp_path_factory):
    out = tmp_path_factory.mktemp("packs")
    dctdata.pack(labelled_source, out / "zarr", format="zarr", quiet=True)
    dctdata.pack(labelled_source, out / "wds", format="webdataset", quiet=True)
    return out


def test_defaults_and_what_is_held():
    o = ReadOptions()
    assert (o.decode, o.on_error, o.cache_dir, o.cache_limit, o.read_threads) == ("cpu", "raise", None, 50 << 30, None)
    assert READ_OPTIONS == ("decode", "on_error", "cache_dir", "cache_limit", "read_threads")
    assert ReadOptions(cache_limit="1 MiB").cache_limit == 1 << 20  # held as bytes
    assert ReadOptions(cache_limit="1 MiB") == ReadOptions(cache_limit=1 << 20)
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.decode = "device"
    assert ReadOptions(decode="device", read_threads=2).changed() == {"decode": "device", "read_threads": 2}
    assert ReadOptions(cache_limit="50GiB").changed() == {}


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"decode": 1}, r"decode: expected 'cpu' or 'device'. Got int"),
        ({"on_error": None}, r"on_error: expected 'raise' or 'skip'. Got NoneType"),
        ({"cache_dir": 3}, r"cache_dir: expected a local directory path or None. Got int"),
        ({"cache_limit": 1.5}, r"cache_limit: expected a size in bytes such as 4096"),
        ({"read_threads": "2"}, r"read_threads: expected an int >= 1 or None. Got str"),
        ({"read_threads": True}, r"read_threads: expected an int >= 1 or None. Got bool"),
    ],
)
def test_a_wrong_type_is_a_type_error_naming_the_option(kw, message):
    with pytest.raises(TypeError, match=message):
        ReadOptions(**kw)


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"decode": "gpu"}, r"decode: expected one of \('cpu', 'device'\). Got 'gpu'"),
        ({"on_error": "ignore"}, r"on_error: expected 'raise' or 'skip'. Got 'ignore'"),
        ({"cache_limit": "0"}, r"cache_limit: expected a size in bytes .* >= 1. Got '0'"),
        ({"cache_limit": "lots"}, r"cache_limit: expected a size in bytes such as 4096.* Got 'lots'"),
        ({"read_threads": 0}, r"read_threads: expected an int >= 1 \(1: no threads\) or None. Got 0"),
    ],
)
def test_a_bad_value_is_a_dctdata_error_naming_the_option(kw, message):
    with pytest.raises(DctDataError, match=message):
        ReadOptions(**kw)


def test_resolve_takes_keywords_or_the_object_not_both():
    o = ReadOptions(on_error="skip")
    assert ReadOptions.resolve(None, {"on_error": "skip"}, "f") == o
    assert ReadOptions.resolve(o, {"on_error": "raise", "cache_limit": "50 GiB"}, "f") is o  # defaults beside it
    with pytest.raises(DctDataError, match=r"f: expected the read options as keywords or as options=ReadOptions"):
        ReadOptions.resolve(o, {"decode": "device"}, "f")
    with pytest.raises(TypeError, match=r"f: options: expected a dctdata.ReadOptions. Got dict"):
        ReadOptions.resolve({"decode": "cpu"}, {}, "f")


def test_open_dataset_takes_the_object_and_the_keywords_alike(packs):
    for kind, cls in (("zarr", DCTZarrDataset), ("wds", DCTWebDataset)):
        by_keywords = dctdata.open_dataset(packs / kind, on_error="skip", decode="device")
        by_object = dctdata.open_dataset(packs / kind, options=ReadOptions(on_error="skip", decode="device"))
        for ds in (by_keywords, by_object):
            assert isinstance(ds, cls) and ds.options == ReadOptions(on_error="skip", decode="device")
            assert (ds.on_error, ds.decode) == ("skip", "device")
    assert dctdata.ReadOptions is ReadOptions and dctdata.loaders.ReadOptions is ReadOptions
    zarr = dctdata.open_dataset(packs / "zarr", options=ReadOptions())
    keyed = dctdata.open_dataset(packs / "zarr")
    a, b = torch.utils._pytree.tree_leaves(zarr[3]), torch.utils._pytree.tree_leaves(keyed[3])
    assert len(a) == len(b) >= 2 and all(torch.equal(x, y) for x, y in zip(a, b))


def test_open_dataset_refuses_both_and_options_that_do_not_fit_the_storage(packs, tmp_path):
    with pytest.raises(DctDataError, match=r"open_dataset: expected the read options as keywords or as options="):
        dctdata.open_dataset(packs / "zarr", options=ReadOptions(), on_error="skip")
    with pytest.raises(TypeError, match=r"open_dataset: options: expected a dctdata.ReadOptions. Got dict"):
        dctdata.open_dataset(packs / "zarr", options={"decode": "cpu"})
    with pytest.raises(DctDataError, match=r"on_error: expected 'raise' or 'skip'. Got 'ignore'"):
        dctdata.open_dataset(packs / "wds", on_error="ignore")
    with pytest.raises(DctDataError, match=r"cache_dir: expected a webdataset pack"):
        dctdata.open_dataset(packs / "zarr", options=ReadOptions(cache_dir=tmp_path / "c"))
    with pytest.raises(DctDataError, match=r"cache_dir: expected a webdataset pack"):
        DCTZarrDataset(packs / "zarr", options=ReadOptions(cache_dir=tmp_path / "c"))
    with pytest.raises(DctDataError, match=r"read_threads: expected a zarr pack .*Got read_threads=2 for a webdata"):
        dctdata.open_dataset(packs / "wds", read_threads=2)


def test_the_cache_and_thread_options_reach_the_readers(packs, tmp_path):
    wds = dctdata.open_dataset(packs / "wds", options=ReadOptions(cache_dir=tmp_path / "c", cache_limit="64 MiB"))
    assert wds.reader.files.cache.limit == 64 << 20 and wds.reader.files.cache.directory == str(tmp_path / "c")
    zarr = dctdata.open_dataset(packs / "zarr", read_threads=1)
    assert zarr.reader.read_threads == 1 and zarr.options.read_threads == 1
    assert pickle.loads(pickle.dumps(zarr.reader)).read_threads == 1  # a spawned worker's copy keeps it
    assert dctdata.open_dataset(packs / "zarr").reader.read_threads is None
