"""Opening a webdataset pack as webdataset users do: by its manifest.json, a list of shard files, or a
brace expression of them (locally and over HTTP), with the manifest found beside them."""

from __future__ import annotations

import pytest
from sample_fields import N
from servers import serve

import dctdata
from dctdata.errors import DctDataError
from dctdata.loaders.wds_dataset import DCTWebDataset


@pytest.fixture(scope="module")
def pack(labelled_source, tmp_path_factory):
    out = tmp_path_factory.mktemp("packs") / "wds"
    dctdata.pack(labelled_source, out, format="webdataset", quiet=True)  # 16 shards of 4 samples
    return out


def labels(ds):
    return sorted(int(s[1]) for s in ds)


def test_brace_expression_of_every_shard_opens_the_pack(pack):
    ds = dctdata.open_dataset(f"{pack}/shard-{{000000..000015}}.tar")
    assert isinstance(ds, DCTWebDataset) and len(ds) == N and len(ds.shards) == 16
    assert labels(ds) == list(range(N))


def test_a_brace_subset_or_a_list_opens_those_shards_only(pack):
    sub = dctdata.open_dataset(f"{pack}/shard-{{000002..000004}}.tar")
    assert len(sub) == 12 and labels(sub) == list(range(8, 20))
    listed = dctdata.open_dataset([pack / "shard-000001.tar", str(pack / "shard-000000.tar")])
    assert labels(listed) == list(range(8))  # manifest order, whatever order they were listed in
    one = dctdata.open_dataset(str(pack / "shard-000015.tar"))
    assert labels(one) == list(range(60, 64))
    assert sub.fingerprint != dctdata.open_dataset(pack).fingerprint  # a resume state names the selection


def test_manifest_path_and_url_open_the_pack(pack):
    assert labels(dctdata.open_dataset(pack / "manifest.json")) == list(range(N))
    with serve(pack) as url:
        assert labels(dctdata.open_dataset(f"{url}/manifest.json")) == list(range(N))
        url.clear()
        ds = dctdata.open_dataset(f"{url}/shard-{{000000..000003}}.tar")
        assert labels(ds) == list(range(16))
        assert not any("shard-000004" in p for p in url.requests)  # unlisted shards are never fetched


def test_brace_list_matching_no_shard_is_one_error(pack):
    with pytest.raises(
        DctDataError,
        match=r"manifest.json: expected shard names of this pack \(16 shards, shard-000000.tar..shard-000015.tar\). "
        r"Got 100 listed, none of them",
    ):
        dctdata.open_dataset(f"{pack}/shard-{{000100..000199}}.tar")
    with pytest.raises(DctDataError, match=r"Got 3 listed, 1 that are not: \['shard-000016.tar'\]"):
        dctdata.open_dataset(f"{pack}/shard-{{000014..000016}}.tar")


def test_bad_shard_lists(pack, labelled_source, tmp_path):
    with pytest.raises(DctDataError, match=r"shards: expected at least one shard file. Got an empty list"):
        dctdata.open_dataset([])
    with pytest.raises(DctDataError, match="expected shard files of one pack"):
        dctdata.open_dataset([pack / "shard-000000.tar", tmp_path / "shard-000001.tar"])
    with pytest.raises(DctDataError, match=r"expected a '.tar' shard file of a webdataset pack"):
        dctdata.open_dataset([pack / "manifest.json"])
    with pytest.raises(TypeError, match=r"shards: expected path or URL strings. Got int"):
        dctdata.open_dataset([3])
    with pytest.raises(DctDataError, match="expected a dctdata manifest"):
        dctdata.open_dataset(f"{tmp_path}/shard-{{000000..000003}}.tar")  # no pack beside them
    dctdata.pack(labelled_source, tmp_path / "z", format="zarr", quiet=True)
    with pytest.raises(DctDataError, match="a list of shard files: expected a webdataset pack"):
        dctdata.open_dataset(f"{tmp_path}/z/shard-{{000000..000003}}.tar")
