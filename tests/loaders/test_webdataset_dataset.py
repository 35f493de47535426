"""DCTWebDataset: exactly once per epoch, epoch-seeded order, integrity while streaming, sources."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tarfile

import numpy as np
import pytest
import torch
from pack_checks import reseal as reseal_manifest
from sample_fields import poisson_fields as fields
from servers import serve

import dctdata
from dctdata.api import open_dataset
from dctdata.cli import main
from dctdata.errors import DctDataError, IntegrityError
from dctdata.format.webdataset import reader
from dctdata.format.webdataset.reader import writer_tar_members
from dctdata.loaders.wds_dataset import DCTWebDataset
from dctdata.verify import verify_dataset

N = 36


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    path = tmp_path_factory.mktemp("src") / "src.npz"
    np.savez(path, image=fields(N), label=np.arange(N, dtype=np.int64))
    return path


@pytest.fixture(scope="module")
def packed(src, tmp_path_factory):
    out = tmp_path_factory.mktemp("packs") / "wds"
    dctdata.pack(
        src,
        out,
        format="webdataset",
        quant="int8",
        target_psnr=35,
        quiet=True,
        writer_options={"samples_per_shard": 4, "samples_per_member": 2},  # two groups of members a shard
    )
    return out


@pytest.fixture
def copy(packed, tmp_path):
    """A private copy to damage."""
    dst = tmp_path / "wds"
    shutil.copytree(packed, dst)
    return dst


def labels(it):
    return [int(s[1]) for s in it]


def loader(ds, workers, **kw):
    return torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers, **kw)


# Exactly once, order ------------------------------------------------------------------------------
@pytest.mark.parametrize("workers", [0, 1, 2, 3])
def test_exactly_once_per_epoch(packed, workers):
    ds = DCTWebDataset(packed, buffer_size=8)
    for epoch in (0, 1):
        ds.set_epoch(epoch)
        got = labels(loader(ds, workers))
        assert sorted(got) == list(range(N))
    assert len(ds) == N


@pytest.mark.parametrize("workers", [0, 2])
def test_two_ranks_partition_the_epoch(packed, workers):
    for epoch in (0, 3):
        seen = []
        for rank in (0, 1):
            ds = DCTWebDataset(packed, rank=rank, world_size=2, buffer_size=8)
            ds.set_epoch(epoch)
            got = labels(loader(ds, workers))
            assert len(got) == len(ds)  # per-rank length: this rank's shards this epoch
            seen += got
        assert sorted(seen) == list(range(N))


@pytest.mark.parametrize("buffer", [1, 8, 1000])
def test_a_worker_holds_one_shard_and_a_buffer_of_samples(packed, buffer):
    """Samples are decoded in stream order just ahead of need, so memory stays one shard's bytes plus the
    shuffle buffer's decoded samples, however long a sample lingers in the buffer."""
    stream = iter(DCTWebDataset(packed, buffer_size=buffer))
    most_open = most_decoded = 0
    for _ in stream:
        most_open = max(most_open, len(stream._open))
        most_decoded = max(most_decoded, len(stream._decoded))
    assert most_open == 1 and most_decoded <= buffer
    assert stream._open == {} and stream._decoded == {}


def test_order_is_a_function_of_seed_and_epoch(packed):
    def order(epoch, seed=0, workers=2):
        ds = DCTWebDataset(packed, seed=seed, buffer_size=8)
        ds.set_epoch(epoch)
        return labels(loader(ds, workers))

    assert order(1) == order(1)
    assert order(1) != order(2)
    assert order(1) != order(1, seed=5)
    assert order(4, workers=0) == order(4, workers=0)


def test_set_epoch_reaches_persistent_workers(packed):
    ds = DCTWebDataset(packed, buffer_size=8)
    dl = loader(ds, 2, persistent_workers=True)
    first = labels(dl)
    ds.set_epoch(1)
    second = labels(dl)
    fresh = DCTWebDataset(packed, buffer_size=8)
    fresh.set_epoch(1)
    assert sorted(second) == list(range(N)) and second != first
    assert second == labels(loader(fresh, 2))


def test_no_shuffle_is_sample_order(packed):
    assert labels(DCTWebDataset(packed, shuffle=False)) == list(range(N))


@pytest.mark.parametrize("world, workers", [(3, 4), (10, 2), (12, 1)])
def test_fewer_shards_than_ranks_times_workers_still_exactly_once(packed, world, workers, caplog):
    """9 shards for 12, 20 or 12 readers: the sample-level fallback split, with a warning naming the fix."""
    seen = []
    for rank in range(world):
        ds = DCTWebDataset(packed, rank=rank, world_size=world, buffer_size=8)
        got = [i for w in range(workers) for i in ds.indices_for(0, rank, world, w, workers)]
        assert len(got) == len(ds)
        seen += got
    assert sorted(seen) == list(range(N))
    with caplog.at_level("WARNING"):
        got = labels(DCTWebDataset(packed, rank=0, world_size=world, buffer_size=8))
    assert sorted(got) == sorted(DCTWebDataset(packed, rank=0, world_size=world).indices_for(0, 0, world))
    if world > 9:
        assert "9 shards for" in caplog.text and "--samples-per-shard" in caplog.text


@pytest.mark.slow  # torch's DataLoader takes ~10 s to shut its workers down after a worker error
def test_errors_surface_through_dataloader_workers(copy):
    flip_byte(copy / "shard-000003.tar")
    with pytest.raises(Exception, match=r"shard-000003.tar: expected sha256"):
        list(loader(DCTWebDataset(copy), 2))


# Samples -----------------------------------------------------------------------------------------
def test_samples_match_zarr_decoding(src, packed, tmp_path):
    z = dctdata.pack(src, tmp_path / "z", format="zarr", quant="int8", target_psnr=35, quiet=True)
    zds = open_dataset(tmp_path / "z")
    wds = open_dataset(packed, as_dict=True)
    assert isinstance(wds, DCTWebDataset)
    assert wds.manifest.fields == z.fields
    zs = zds.__getitems__(list(range(N)))
    for s in wds:
        i = int(s["label"])
        assert s["label"].shape == () and s["label"].dtype == torch.int64
        q, side = s["image"]  # coefficients and the per-sample (range, mid) side information
        assert q.dtype == torch.int8 and tuple(q.shape) == z.field("image").stored_shape
        assert side.dtype == torch.float32 and tuple(side.shape) == (1, 2)
        assert torch.equal(q, zs[i][0][0]) and torch.equal(side, zs[i][0][1])
    x = wds.decompressor()(torch.utils.data.default_collate([zs[0][0]]))
    assert tuple(x.shape) == (1, 1, 24, 40)


def test_bad_arguments(packed, tmp_path):
    with pytest.raises(DctDataError, match="on_error: expected 'raise' or 'skip'"):
        DCTWebDataset(packed, on_error="ignore")
    with pytest.raises(DctDataError, match="rank/world_size: expected both or neither"):
        DCTWebDataset(packed, rank=0)
    with pytest.raises(DctDataError, match="expected 0 <= rank < world_size"):
        DCTWebDataset(packed, rank=2, world_size=2)
    with pytest.raises(DctDataError, match=r"epoch: expected an int in 0\.\.\d+\. Got -1"):
        DCTWebDataset(packed).set_epoch(-1)
    with pytest.raises(DctDataError, match="buffer_size: expected an int >= 1"):
        DCTWebDataset(packed, buffer_size=0)
    with pytest.raises(DctDataError, match="expected a dct field"):
        DCTWebDataset(packed).decompressor("label")
    with pytest.raises(DctDataError, match="expected a dctdata manifest"):
        DCTWebDataset(tmp_path)


# Integrity ---------------------------------------------------------------------------------------
def flip_byte(path, offset=700):
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize("damage, what", [(flip_byte, "corrupted"), (truncate, "truncated")])
def test_bad_shard_detected_by_iteration_and_verify(copy, damage, what, capsys):
    damage(copy / "shard-000003.tar")
    with pytest.raises(IntegrityError, match=f"shard-000003.tar: expected .*samples 12..15.*{what}"):
        list(DCTWebDataset(copy))
    problems, summary = verify_dataset(copy)
    assert len(problems) == 1 and "shard-000003.tar" in problems[0] and what in problems[0]
    assert summary["decoded"] == N - 4
    assert main(["verify", str(copy)]) == 1
    assert "shard-000003.tar" in capsys.readouterr().out


@pytest.mark.parametrize("workers", [0, 2])
def test_skip_mode_counts_bad_shards(copy, workers):
    flip_byte(copy / "shard-000003.tar")
    truncate(copy / "shard-000007.tar")
    ds = DCTWebDataset(copy, on_error="skip")
    got = labels(loader(ds, workers))
    assert sorted(got) == [i for i in range(N) if not 12 <= i < 16 and not 28 <= i < 32]
    st = ds.stats
    assert st["shards_skipped"] == 2 and st["samples_skipped"] == 8 and st["shards_read"] == 7
    assert st["bad_shards"] == ["shard-000003.tar", "shard-000007.tar"]
    assert st["samples"] == N - 8


def rewrite_shard(root, name, extra_members):
    """Rebuild shard `name` with extra tar members and fix the manifest to match (the hash passes)."""
    path = root / name
    buf = io.BytesIO()
    with tarfile.open(path) as src, tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as dst:
        for extra_name, payload in extra_members:
            ti = tarfile.TarInfo(extra_name)
            ti.size = len(payload)
            dst.addfile(ti, io.BytesIO(payload))
        for m in src.getmembers():
            dst.addfile(m, src.extractfile(m))
    reseal(root, name, buf.getvalue())


def reseal(root, name, data):
    """Write shard `name` and fix the manifest's size and sha256 to match it."""
    (root / name).write_bytes(data)
    mpath = root / "manifest.json"
    m = json.loads(mpath.read_text())
    for s in m["layout"]["shards"]:
        if s["name"] == name:
            s["bytes"], s["sha256"] = len(data), hashlib.sha256(data).hexdigest()
    m["checksums"][name] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    mpath.write_text(json.dumps(reseal_manifest(m)))


@pytest.mark.parametrize("member", ["../evil.npy", "/abs/evil.npy", "sub/000000000.label.npy"])
def test_unsafe_tar_members_rejected(copy, member):
    rewrite_shard(copy, "shard-000000.tar", [(member, b"x")])
    with pytest.raises(IntegrityError, match=r"shard-000000.tar: tar member .*expected a plain file name"):
        list(DCTWebDataset(copy))
    problems, _ = verify_dataset(copy)
    assert len(problems) == 1 and "plain file name" in problems[0]


def test_writer_made_shards_are_indexed_without_tarfile(packed, monkeypatch):
    data = (packed / "shard-000000.tar").read_bytes()
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        members = [(m.name, m.isreg(), m.type, m.offset_data, m.size) for m in tf]
    assert len(members) == 6 and writer_tar_members(memoryview(data)) == members  # 2 groups x (image, side, label)
    monkeypatch.setattr(reader.tarfile, "open", None)  # the reader never needs it for the writer's shards
    assert sorted(labels(DCTWebDataset(packed))) == list(range(N))


@pytest.mark.parametrize(
    "fmt, change",
    [
        (tarfile.USTAR_FORMAT, {"mtime": 1}),
        (tarfile.USTAR_FORMAT, {"uname": "someone"}),
        (tarfile.GNU_FORMAT, {}),
        (tarfile.PAX_FORMAT, {"pax_headers": {"comment": "x"}}),
    ],
)
def test_other_tar_forms_still_read_through_tarfile(copy, packed, fmt, change):
    path = copy / "shard-000000.tar"
    buf = io.BytesIO()
    with tarfile.open(path) as src, tarfile.open(fileobj=buf, mode="w", format=fmt) as dst:
        for m in src.getmembers():
            payload = src.extractfile(m).read()
            for k, v in change.items():
                setattr(m, k, v)
            dst.addfile(m, io.BytesIO(payload))
    reseal(copy, "shard-000000.tar", buf.getvalue())
    assert writer_tar_members(memoryview(buf.getvalue())) is None
    got, want = list(DCTWebDataset(copy, shuffle=False)), list(DCTWebDataset(packed, shuffle=False))
    assert len(got) == N and all(torch.equal(a[1], b[1]) for a, b in zip(got, want))
    assert all(torch.equal(a[0][0], b[0][0]) and torch.equal(a[0][1], b[0][1]) for a, b in zip(got, want))


def test_bad_header_checksums_keep_tarfiles_errors(copy):
    data = bytearray((copy / "shard-000000.tar").read_bytes())
    data[5] ^= 1  # the first member's name: its header checksum no longer matches
    reseal(copy, "shard-000000.tar", bytes(data))
    with pytest.raises(
        IntegrityError, match=r"shard-000000\.tar: expected a readable tar \(samples 0\.\.3\)\. Got ReadError"
    ):
        list(DCTWebDataset(copy, shuffle=False))
    data[5] ^= 1
    third = writer_tar_members(memoryview(bytes(data)))[3][3] - 512  # the second group's first header
    data[third + 5] ^= 1  # tarfile ends the archive at a bad header after the first: the key check names it
    reseal(copy, "shard-000000.tar", bytes(data))
    with pytest.raises(IntegrityError, match=r"shard-000000\.tar: expected sample keys .* in order \(samples 0\.\.3\)"):
        list(DCTWebDataset(copy, shuffle=False))


def test_epochs_do_not_rebuild_codecs(packed, monkeypatch):
    from dctdata.stages import stage_classes

    ds = DCTWebDataset(packed)
    built = []
    for cls in stage_classes():
        monkeypatch.setattr(cls, "from_config", classmethod(lambda cls, config: built.append(config)))
    for epoch in range(2):
        ds.set_epoch(epoch)
        assert sorted(labels(ds)) == list(range(N))
    assert built == []


def test_unexpected_member_rejected(copy):
    rewrite_shard(copy, "shard-000001.tar", [("000000004.other.npy", b"x")])
    with pytest.raises(IntegrityError, match=r"shard-000001.tar: tar member '000000004.other.npy': expected"):
        list(DCTWebDataset(copy, shuffle=False))


# Sources -----------------------------------------------------------------------------------------
@pytest.fixture
def http_root(packed):
    with serve(packed) as url:
        yield url


@pytest.mark.parametrize("workers", [0, 2])
def test_streams_from_http(http_root, workers):
    ds = open_dataset(http_root)
    assert isinstance(ds, DCTWebDataset) and len(ds) == N
    assert sorted(labels(loader(ds, workers))) == list(range(N))
    assert verify_dataset(http_root)[0] == []


def test_http_missing_shard_names_it(packed, tmp_path):
    shutil.copytree(packed, tmp_path / "p")
    os.remove(tmp_path / "p" / "shard-000002.tar")
    with serve(tmp_path / "p") as url:
        with pytest.raises(IntegrityError, match=r"shard-000002.tar: expected a shard \(samples 8..11\)"):
            list(DCTWebDataset(url, shuffle=False))


def test_pipe_urls_refused_unless_opted_in(packed):
    url = f"pipe:cat {packed}/{{}}"
    with pytest.raises(DctDataError, match="Got a shell 'pipe:' URL"):
        DCTWebDataset(url)
    with pytest.raises(DctDataError, match="with '\\{\\}' where the file name goes"):
        DCTWebDataset(f"pipe:cat {packed}/manifest.json", allow_pipe=True)
    ds = DCTWebDataset(url, allow_pipe=True)
    assert sorted(labels(ds)) == list(range(N))


def test_zarr_pack_refused(src, tmp_path):
    dctdata.pack(src, tmp_path / "z", format="zarr", quiet=True)
    with pytest.raises(DctDataError, match=r"expected a webdataset dataset. Got storage 'zarr'"):
        DCTWebDataset(tmp_path / "z")


def test_open_dataset_refuses_pipe_urls_with_the_explicit_message():
    with pytest.raises(
        dctdata.DctDataError, match=r"Got a shell 'pipe:' URL, which runs a command \(pass allow_pipe=True to opt in\)"
    ):
        dctdata.open_dataset("pipe:cat /tmp/x/{}")


def test_indexing_a_stream_says_to_iterate_or_use_zarr(tmp_path):
    dctdata.pack(fields(4, 1, 16, 16), tmp_path / "w", format="webdataset", cf=4, quiet=True)
    ds = open_dataset(tmp_path / "w")
    with pytest.raises(
        TypeError, match=r"DCTWebDataset\[0\]: expected iteration .* pack with --format zarr for ds\[i\]"
    ):
        ds[0]
    assert len(list(ds)) == 4  # iterating is what works
