"""Object stores: pack to S3 (moto on 127.0.0.1) and read back; a prefix without its manifest (the commit)
is refused; both formats read over HTTP with range requests; a forked worker cannot stall the parent's
connections."""

from __future__ import annotations

import gc
import multiprocessing
import os

import pytest
from sample_fields import OPTS, N
from servers import serve

import dctdata
from dctdata.errors import DctDataError


@pytest.fixture(scope="module")
def s3():
    pytest.importorskip("s3fs")
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    opts = {
        "key": "testing",
        "secret": "testing",
        "client_kwargs": {"endpoint_url": f"http://{host}:{port}", "region_name": "eu-west-1"},
    }
    import s3fs

    fs = s3fs.S3FileSystem(**opts)
    fs.mkdir("dctdata-test", region_name="eu-west-1")
    yield opts
    server.stop()


@pytest.mark.parametrize("fmt", [pytest.param("zarr", marks=pytest.mark.slow), "webdataset"])
def test_pack_to_s3_and_read_back(labelled_source, tmp_path, s3, fmt):
    import s3fs

    url = f"s3://dctdata-test/{fmt}"
    m = dctdata.pack(
        labelled_source, url, format=fmt, quant="int8", cf=6, quiet=True, writer_options=OPTS[fmt], storage_options=s3
    )
    local = dctdata.pack(
        labelled_source, tmp_path / "local", format=fmt, quant="int8", cf=6, quiet=True, writer_options=OPTS[fmt]
    )
    assert m.checksums == local.checksums  # same bytes as a local pack
    fs = s3fs.S3FileSystem(**s3)
    fs.invalidate_cache()
    for rel, entry in m.checksums.items():
        assert fs.info(f"dctdata-test/{fmt}/{rel}")["size"] == entry["bytes"]
    ds = dctdata.open_dataset(url, storage_options=s3)
    labels = sorted(int(s[1]) for s in (ds if fmt == "webdataset" else (ds[i] for i in range(len(ds)))))
    assert labels == list(range(N))
    with pytest.raises(DctDataError, match=r"expected an OUT prefix without a dataset. Got an existing manifest.json"):
        dctdata.pack(labelled_source, url, format=fmt, quiet=True, storage_options=s3)


def test_s3_prefix_without_manifest_is_refused(s3):
    import s3fs

    from dctdata.errors import FormatError

    fs = s3fs.S3FileSystem(**s3)
    fs.pipe("dctdata-test/half/shard-000000.tar", b"x" * 10)  # data written, manifest (the commit) not yet
    with pytest.raises(
        FormatError, match=r"half/manifest.json: expected a dctdata manifest \(manifest.json\). Got no such file"
    ):
        dctdata.open_dataset("s3://dctdata-test/half", storage_options=s3)


def test_read_both_formats_over_http(labelled_source, tmp_path):
    with serve(tmp_path) as url:
        for fmt in ("zarr", "webdataset"):
            dctdata.pack(labelled_source, tmp_path / fmt, format=fmt, quiet=True, writer_options=OPTS[fmt])
            ds = dctdata.open_dataset(f"{url}/{fmt}")
            it = ds if fmt == "webdataset" else (ds[i] for i in range(len(ds)))
            assert sorted(int(s[1]) for s in it) == list(range(N))


def _read_manifest_and_collect(url: str) -> None:
    dctdata.format.read_manifest(url, storage_options={"timeout": 5})  # fsspec drops the parent's instances
    gc.collect()  # and their finalizers close the parent's pooled connections, as a worker's GC would


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_worker_does_not_stall_the_parents_http_connections(labelled_source, tmp_path):
    # A DataLoader worker shares the parent's epoll instance: before the fix, the worker's cleanup of its
    # copies of the parent's connections unregistered them there and the parent's next read on one waited
    # out the idle timeout ("no answer in time"), as a second open_dataset after an epoch with workers did.
    dctdata.pack(labelled_source, tmp_path / "wds", format="webdataset", quiet=True)
    with serve(tmp_path / "wds") as url:
        first = dctdata.format.read_manifest(url, storage_options={"timeout": 5})  # leaves a pooled connection
        child = multiprocessing.get_context("fork").Process(target=_read_manifest_and_collect, args=(url,))
        child.start()
        child.join(60)
        assert child.exitcode == 0
        url.clear()
        again = dctdata.format.read_manifest(url, storage_options={"timeout": 5})
        assert again.checksums == first.checksums and url.requests == ["/manifest.json"]
