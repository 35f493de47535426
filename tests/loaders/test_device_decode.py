"""`open_dataset(path, decode="device")`: the workers check a dct field's stored bytes and hand them over;
a batch is one `StoredBatch` (one byte buffer + offsets + side values); `ds.decompressor()` decodes the
lossless stage where it runs, then the layer. Here the decoder runs on the CPU (the main process) and
on CUDA where there is one: the arrays are those of `decode="cpu"` bit for bit, for both storages, both
lossless stages, side values and masks, with workers, resume, the prefetcher and torchrun."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile

import numpy as np
import pytest
import torch
from pack_checks import rehash
from sample_fields import smooth_fields
from torchrun_checks import run_ranks

import dctdata
from dctdata.decoder.wire import StoredBatch, collate
from dctdata.errors import DctDataError, IntegrityError
from dctdata.loaders.device import DevicePrefetcher
from dctdata.loaders.distributed import make_loader, set_epoch
from dctdata.stages import get_stage

N = 40
ZSTD = {"id": "zstd", "level": 19}
# name -> (format, pack settings): the entropy coder (auto picks it here) and zstd, side values in the
# entropy coder's member and inside a zstd member, zarr chunks of several samples and of one, bfloat16
PACKS = {
    "zarr-ctx": ("zarr", dict(target_psnr=35)),
    "zarr-ctx-1": ("zarr", dict(target_psnr=35, writer_options={"chunk_samples": 1})),
    "zarr-zstd": ("zarr", dict(target_psnr=35, lossless=ZSTD)),
    "wds-ctx": ("webdataset", dict(target_psnr=35)),
    "wds-ctx-1": ("webdataset", dict(target_psnr=35, writer_options={"samples_per_member": 1})),
    "wds-zstd": ("webdataset", dict(target_psnr=35, lossless=ZSTD)),
    "wds-bf16": ("webdataset", dict(cf=4, quant="bf16")),
}


def _source(tmp) -> str:
    """Two-channel fields with a few NaNs (`nan="mask"` adds a validity mask field) and a label."""
    x = smooth_fields(N, 2, 24, 40, seed=3)
    x[5, 0, :3, :4] = np.nan
    path = os.path.join(tmp, "src.npz")
    np.savez(path, image=x, label=np.arange(N, dtype=np.int64))
    return path


@pytest.fixture(scope="session")
def packs(tmp_path_factory):
    """The seven packs of PACKS (read only: a test that edits one edits a copy), made once per test process:
    test_decode_groups takes them too, and a module-scoped fixture was packed again for each module and each
    time a process came back to one of them."""
    root = tmp_path_factory.mktemp("device-decode")
    src = _source(root)
    for name, (fmt, kw) in PACKS.items():
        kw = dict(kw)
        if fmt == "webdataset":
            kw["writer_options"] = {"samples_per_shard": 8, **kw.get("writer_options", {})}
        dctdata.pack(src, root / name, format=fmt, nan="mask", quiet=True, **kw)
    return root


def _open(path, **kw):
    m = dctdata.format.read_manifest(path)
    extra = {"shuffle": False} if m.storage == "webdataset" else {}
    return dctdata.open_dataset(path, as_dict=True, **extra, **kw)


def _batches(path, decode, **kw):
    ds = _open(path, decode=decode)
    return ds, list(make_loader(ds, batch_size=8, shuffle=False, **kw))


def _to(wire, device):
    """A decode="cpu" wire value (coefficients, or the (coefficients, side) pair) on `device`."""
    return tuple(t.to(device) for t in wire) if isinstance(wire, (tuple, list)) else wire.to(device)


def _equal(a, b) -> bool:
    if isinstance(a, (tuple, list)):  # a DataLoader collates a (coefficients, side) pair into a list
        return isinstance(b, (tuple, list)) and len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return torch.equal(a.cpu(), b.cpu())


def _same(cpu_batches, dev_batches, layer, device="cpu"):
    """Each device batch decodes to the cpu batch's coefficients (and side values) and arrays, bit for bit;
    labels and masks are equal."""
    assert len(cpu_batches) == len(dev_batches)
    layer = layer.to(device)
    for a, b in zip(cpu_batches, dev_batches):
        assert isinstance(b["image"], StoredBatch)
        assert torch.equal(a["label"], b["label"]) and torch.equal(a["image_valid"], b["image_valid"])
        assert _equal(layer.decode_stored(b["image"].to(device)), a["image"])
        want = layer(_to(a["image"], device))
        got = layer(b["image"].to(device))
        assert got.device.type == device and torch.equal(got, want)


@pytest.mark.parametrize("name", sorted(PACKS))
def test_device_decode_is_cpu_decode_bit_for_bit(packs, name):
    _ds, cpu = _batches(packs / name, "cpu")
    dev_ds, dev = _batches(packs / name, "device")
    assert {"image", "image_valid", "label"} == set(cpu[0])
    _same(cpu, dev, dev_ds.decompressor("image"))
    batch = dev[0]["image"]
    assert batch.data.dtype == torch.uint8 and batch.data.dim() == 1 and batch.offsets.dtype == torch.int64
    assert batch.offsets[0] == 0 and batch.offsets[-1] == batch.data.numel() == batch.data.nbytes
    assert batch.nbytes == sum(t.nbytes for t in (batch.data, batch.offsets, batch.side) if t is not None) + (
        0 if batch.rows is None else batch.rows.nbytes
    )
    assert len(batch) == 8 and batch.indices == tuple(range(8))


def _wds_stream_bytes(root) -> int:
    """Bytes of every stored stream of `image` in a webdataset pack: its members (version 5: the side values
    are a member of their own, `image__side.npy`; version 4: less the side values the entropy coder's
    member starts with)."""
    m = dctdata.format.read_manifest(root)
    f = m.field("image")
    grouped = "samples_per_member" in m.layout
    side = f.codec.channels * 2 * 4 if f.lossless.get("id") == "dctdata_ctxrans" and not grouped else 0
    total = 0
    for e in m.layout["shards"]:
        with tarfile.open(root / e["name"]) as tf:
            total += sum(t.size - side for t in tf if ".image." in t.name)
    return total


def _zarr_stream_bytes(root) -> int:
    """Bytes of every stored chunk of `image` in a zarr pack, less their crc32c."""
    m = dctdata.format.read_manifest(root)
    chunk = m.layout["arrays"]["image"]["chunk"]
    total = 0
    for rel in (r for r in m.checksums if r.startswith("image/c.")):
        raw = (root / rel).read_bytes()
        n = m.layout["arrays"]["image"]["shard"] // chunk  # index entries (the writer puts the index last)
        index = np.frombuffer(raw[-(16 * n + 4) : -4], "<u8").reshape(-1, 2)
        total += int(sum(b - 4 for o, b in index.tolist() if o != 2**64 - 1))
    return total


@pytest.mark.parametrize("name", ["wds-ctx-1", "zarr-ctx-1"])
def test_the_entropy_kernels_program_decodes_like_the_cpu_decoder(packs, name, monkeypatch):
    """decode="device" through the entropy stage's device hook running the lane emulator (the CUDA kernel's source
    compiled as C): decode="cpu"'s arrays bit for bit, every batch through the hook. The kernel decodes streams of
    one sample: a pack of one sample per member or chunk (streams of several, grouped webdataset members and zarr
    chunks, decode on the host; `test_device_decode_is_cpu_decode_bit_for_bit` covers them)."""
    from dctdata.stages import CtxransStage
    from dctdata.stages.ctxrans import CtxransDeviceDecoder

    calls = []

    class Emulated(CtxransDeviceDecoder):
        def decode_batch(self, buffer, offsets, sample_shape, dtype):
            calls.append(len(offsets) - 1)
            return super().decode_batch(buffer, offsets, sample_shape, dtype)

    monkeypatch.setattr(CtxransStage, "device_decoder", lambda self, device: Emulated(self.codec, emulate=True))
    _, cpu = _batches(packs / name, "cpu")
    ds, dev = _batches(packs / name, "device")
    _same(cpu, dev, ds.decompressor("image"))
    assert sum(calls) == 2 * N  # each batch decoded twice by _same


LAZY_EMULATOR = """
import sys

import dctdata
from dctdata.loaders.distributed import make_loader

ds = dctdata.open_dataset(sys.argv[1], as_dict=True, decode="device")
layer = ds.decompressor("image")
for b in make_loader(ds, batch_size=8, shuffle=False):
    layer(b["image"])
print("dctdata.entropy.device" in sys.modules, "dctdata.entropy._ctxlanes" in sys.modules)
"""


def test_the_device_decode_path_never_imports_the_lane_emulator(packs):
    """The lane emulator (`_ctxlanes`, the kernel's source built as C) runs only when asked for (`emulate=True`,
    the CPU stand-in of the kernel); a decode="device" user decodes through `dctdata.entropy.device` without
    loading it."""
    run = subprocess.run(
        [sys.executable, "-c", LAZY_EMULATOR, str(packs / "zarr-ctx-1")], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["True", "False"]  # the device decoder ran; its emulator was not imported


@pytest.mark.parametrize("name", ["wds-ctx", "wds-zstd", "zarr-ctx-1", "zarr-zstd"])
def test_bytes_crossing_are_the_stored_bytes(packs, name):
    _, dev = _batches(packs / name, "device")
    crossed = sum(b["image"].data.numel() for b in dev)
    stored = _wds_stream_bytes(packs / name) if name.startswith("wds") else _zarr_stream_bytes(packs / name)
    assert crossed == stored  # each stream once: a zarr chunk of several samples of a batch crosses once
    per_sample = sum(b["image"].nbytes for b in dev) / N
    coefficients = _open(packs / name).manifest.field("image").stored_sample_bytes
    assert per_sample < coefficients  # what crossed with decode="cpu" (the coefficient tensor)


def test_decode_setting_is_checked(packs):
    with pytest.raises(DctDataError, match=r"decode: expected one of \('cpu', 'device'\)\. Got 'gpu'"):
        dctdata.open_dataset(packs / "zarr-ctx", decode="gpu")
    with pytest.raises(DctDataError, match=r"decode: expected one of \('cpu', 'device'\)\. Got 'GPU'"):
        dctdata.open_dataset(packs / "wds-ctx", decode="GPU")
    with pytest.raises(TypeError, match=r"decode: expected 'cpu' or 'device'. Got bool"):
        dctdata.open_dataset(packs / "zarr-ctx", decode=True)
    assert dctdata.open_dataset(packs / "zarr-ctx").decode == "cpu"


def test_plain_dataloader_and_slices_give_stored_batches(packs):
    ds = _open(packs / "zarr-ctx", decode="device")
    cpu = _open(packs / "zarr-ctx")
    layer = ds.decompressor()
    loader = torch.utils.data.DataLoader(ds, batch_size=8)  # torch's default collate knows stored samples
    for k, b in enumerate(loader):
        assert isinstance(b["image"], StoredBatch)
        assert torch.equal(layer(b["image"]), layer(cpu[8 * k : 8 * k + 8]["image"]))
    assert torch.equal(layer(ds[3:11]["image"]), layer(cpu[3:11]["image"]))
    empty = ds[5:5]["image"]
    assert isinstance(empty, StoredBatch) and len(empty) == 0
    assert layer(empty).shape == (0, 2, 24, 40)
    one = ds[7]["image"]  # one sample: collate it to decode it
    assert torch.equal(layer(collate([one])), layer(cpu[7:8]["image"]))


def test_a_batch_of_repeated_and_unordered_samples(packs):
    ds, cpu = _open(packs / "zarr-ctx", decode="device"), _open(packs / "zarr-ctx")
    idx = [9, 3, 9, 36, 4]  # samples 3 and 4 share a chunk; 9 twice
    b = collate(ds.__getitems__(idx))["image"]
    assert b.rows is not None and b.streams < len(idx)
    layer = ds.decompressor()
    assert torch.equal(layer(b), layer(collate(cpu.__getitems__(idx))["image"]))


@pytest.mark.parametrize("name", ["zarr-ctx", "zarr-zstd"])
@pytest.mark.parametrize("batch_size", [3, 5])
def test_batches_that_end_inside_a_chunk(packs, name, batch_size):
    """A batch of a chunk's first samples (samples 0..4 of a chunk of 8) keeps its rows table: its stream decodes
    to the chunk's 8 rows, of which the batch's are picked (the pairing once taken for "stream k is sample k")."""
    ds, cpu = _open(packs / name, decode="device"), _open(packs / name)
    assert ds.manifest.layout["arrays"]["image"]["chunk"] % batch_size  # batches end inside chunks
    layer = ds.decompressor()
    loader = make_loader(ds, batch_size=batch_size, shuffle=False)
    wanted = make_loader(cpu, batch_size=batch_size, shuffle=False)
    first = next(iter(loader))["image"]
    assert first.streams == 1 and first.rows is not None and first.rows.tolist() == list(range(batch_size))
    for a, b in zip(wanted, loader):
        q, side = layer.decode_stored(b["image"])
        assert q.shape[0] == side.shape[0] == len(b["image"]) == len(a["label"])
        assert _equal((q, side), a["image"]) and torch.equal(layer(b["image"]), layer(a["image"]))


@pytest.mark.slow
@pytest.mark.parametrize("context", ["fork", "spawn"])
@pytest.mark.parametrize("name", ["zarr-ctx", "wds-zstd"])
def test_workers(packs, name, context):
    _, cpu = _batches(packs / name, "cpu")
    ds, dev = _batches(packs / name, "device", num_workers=2, multiprocessing_context=context)
    _same(cpu, dev, ds.decompressor())


@pytest.mark.parametrize("name", ["zarr-zstd", "wds-ctx"])
def test_resume_mid_epoch(packs, name):
    ds = _open(packs / name, decode="device")
    layer = ds.decompressor()

    def loader():
        out = make_loader(_open(packs / name, decode="device"), batch_size=4, num_workers=2, seed=5)
        set_epoch(out, 2)
        return out

    whole = [(b["label"], layer(b["image"])) for b in loader()]
    first = loader()
    it = iter(first)
    head = [next(it) for _ in range(3)]
    state = json.loads(json.dumps(first.state_dict()))
    del it, first
    resumed = loader()
    resumed.load_state_dict(state)
    got = [(b["label"], layer(b["image"])) for b in head + list(resumed)]
    assert sorted(int(v) for lab, _ in got for v in lab) == list(range(N))
    by_label = {int(v): x for lab, y in whole for v, x in zip(lab, y)}
    for lab, y in got:
        for v, x in zip(lab, y):
            assert torch.equal(x, by_label[int(v)])


def test_prefetcher_moves_stored_batches(packs):
    ds = _open(packs / "wds-zstd", decode="device")
    loader = make_loader(ds, batch_size=8, shuffle=False)
    layer = ds.decompressor()
    _, cpu = _batches(packs / "wds-zstd", "cpu")
    got = list(DevicePrefetcher(loader, "cpu"))
    assert all(isinstance(b["image"], StoredBatch) for b in got)
    for a, b in zip(cpu, got):
        assert torch.equal(layer(a["image"]), layer(b["image"]))


def _tamper(src, dst, edit, reseal=False) -> None:
    """A copy of zarr pack `src` at `dst` whose first `image` chunk went through `edit(body)` (a bytearray
    without its crc32c, changed in place); `reseal`: its crc32c recomputed too (a tamperer). The manifest's
    checksum is always updated, so only the chunk's own checks can tell."""
    import google_crc32c

    shutil.copytree(src, dst)
    m = dctdata.format.read_manifest(dst)
    rel = next(r for r in m.checksums if r.startswith("image/c.0."))
    raw = bytearray((dst / rel).read_bytes())
    n = m.layout["arrays"]["image"]["shard"] // m.layout["arrays"]["image"]["chunk"]  # the index is last
    off, size = (int(v) for v in np.frombuffer(bytes(raw[-(16 * n + 4) : -4]), "<u8").reshape(-1, 2)[0])
    body = raw[off : off + size - 4]
    edit(body)
    raw[off : off + size - 4] = body
    if reseal:
        raw[off + size - 4 : off + size] = google_crc32c.value(bytes(body)).to_bytes(4, "little")
    (dst / rel).write_bytes(bytes(raw))
    rehash(dst, rel)


def _flip(k: int):
    def edit(body: bytearray) -> None:
        body[k] ^= 0x5A

    return edit


def test_a_corrupt_chunk_never_reaches_the_decoder(packs, tmp_path, caplog):
    _tamper(packs / "zarr-ctx-1", tmp_path / "z", _flip(40))
    ds = _open(tmp_path / "z", decode="device")
    with pytest.raises(IntegrityError, match=r"field 'image' samples 0\.\.0 \(chunk 0\): expected intact stored data"):
        ds.__getitems__([0, 1, 2])
    skipping = _open(tmp_path / "z", decode="device", on_error="skip")
    batch = collate(skipping.__getitems__([0, 1, 2]))
    assert batch["image"].indices == (1, 2) and skipping.skipped == 1  # named and dropped in the worker
    assert "skipping sample 0" in caplog.text
    cpu = _open(packs / "zarr-ctx-1")
    layer = skipping.decompressor()
    assert torch.equal(layer(batch["image"]), layer(cpu[1:3]["image"]))


def _bump_declared_size(body: bytearray) -> None:
    """Add one to the Frame_Content_Size of the zstd frame `body` (RFC 8878 3.1.1), nothing else."""
    codec = get_stage(ZSTD)
    before = codec.declared_size(body)
    fhd = body[4]
    at = 5 + (0 if (fhd >> 5) & 1 else 1) + (0, 1, 2, 4)[fhd & 3]
    body[at] ^= 0x01
    assert codec.declared_size(body) not in (None, before)


def test_a_zstd_frame_declaring_another_size_is_refused_in_the_worker(packs, tmp_path):
    _tamper(packs / "zarr-zstd", tmp_path / "z", _bump_declared_size, reseal=True)  # its crc32c holds
    with pytest.raises(IntegrityError, match=r"\(chunk 0\): expected a stream of \d+ decoded bytes\. Got one of"):
        _open(tmp_path / "z", decode="device").__getitems__([0])


def test_a_sealed_bad_entropy_stream_is_named_by_the_decoder(packs, tmp_path):
    _tamper(packs / "zarr-ctx-1", tmp_path / "z", _flip(2), reseal=True)  # passes its crc32c: only decoding tells
    ds = _open(tmp_path / "z", decode="device")
    batch = collate(ds.__getitems__([0, 1]))["image"]
    with pytest.raises(IntegrityError, match=r"field 'image' sample 0: expected dctdata_ctxrans-coded bytes"):
        ds.decompressor()(batch)


def test_a_webdataset_member_declaring_another_size_is_skipped_with_its_shard(packs, tmp_path):
    shutil.copytree(packs / "wds-zstd", tmp_path / "w")
    shard = tmp_path / "w" / "shard-000001.tar"
    raw = bytearray(shard.read_bytes())
    with tarfile.open(fileobj=io.BytesIO(bytes(raw))) as tf:
        member = next(t for t in tf if t.name.endswith(".image.npy.zst"))
    body = raw[member.offset_data : member.offset_data + member.size]
    _bump_declared_size(body)  # the member's sha256 is resealed below: only the worker's size check tells
    raw[member.offset_data : member.offset_data + member.size] = body
    shard.write_bytes(bytes(raw))
    rehash(tmp_path / "w", "shard-000001.tar")
    bad = r"shard-000001\.tar: samples? 8(\.\.\d+)? field 'image': expected a stream of"
    with pytest.raises(IntegrityError, match=bad):
        list(_open(tmp_path / "w", decode="device"))
    ds = _open(tmp_path / "w", decode="device", on_error="skip")
    labels = [int(s["label"]) for s in ds]
    assert labels == [i for i in range(N) if not 8 <= i < 16] and ds.stats["bad_shards"] == ["shard-000001.tar"]


def test_decompressor_refuses_a_batch_it_cannot_decode(packs):
    ds = _open(packs / "zarr-ctx", decode="device")
    batch = collate(ds.__getitems__([0, 1]))["image"]
    other = _open(packs / "zarr-zstd").decompressor()
    # the bytes carry their pack's codec: another pack's layer decodes them with it, not with its own stage
    assert torch.equal(other(batch), ds.decompressor()(batch))
    with pytest.raises(
        DctDataError,
        match=r"stored bytes of pack '.*zarr-ctx' \(sha256:.*\), whose codec differs "
        r"from this decompressor's \(pack '.*zarr-zstd' \(sha256:",
    ):
        other.decode_stored(batch)  # its coefficients would be another codec's
    bare = dataclasses.replace(batch, form=dataclasses.replace(batch.form, pack=None, codec=None))  # made by hand
    with pytest.raises(DctDataError, match=r"expected streams of this decompressor's lossless stage 'zstd'"):
        other(bare)
    with pytest.raises(TypeError, match=r"a StoredBatch needs the layer of its dataset"):
        dctdata.Decompress(ds.manifest.field("image").codec)(batch)
    with pytest.raises(DctDataError, match=r"field 'image': stored batch: expected side values\. Got none"):
        ds.decompressor()(dataclasses.replace(batch, side=None))


DDP_BODY = """
for name in ("zarr-ctx", "wds-zstd"):
    ds = dctdata.open_dataset(os.path.join(sys.argv[1], name), as_dict=True, decode="device")
    layer = ds.decompressor()
    loader = make_loader(ds, batch_size=4, num_workers=2, seed=3)
    set_epoch(loader, 1)
    out[name] = {int(v): layer(b["image"])[k].sum().item() for b in loader for k, v in enumerate(b["label"])}
"""


@pytest.mark.slow
def test_torchrun_device_decode(packs, tmp_path):
    for name in ("zarr-ctx", "wds-zstd"):
        os.symlink(packs / name, tmp_path / name)
    ranks = run_ranks(DDP_BODY, tmp_path, timeout=300)
    for name in ("zarr-ctx", "wds-zstd"):
        cpu = _open(packs / name)
        layer = cpu.decompressor()
        want = {}
        for b in make_loader(cpu, batch_size=8, shuffle=False):
            want.update({int(v): layer(b["image"])[k].sum().item() for k, v in enumerate(b["label"])})
        got = {int(k): v for r in ranks for k, v in r[name].items()}
        assert sorted(int(k) for r in ranks for k in r[name]) == list(range(N))  # exactly once over ranks
        assert got == want


@pytest.mark.cuda
@pytest.mark.parametrize("name", sorted(PACKS))
def test_cuda_device_decode_is_cpu_decode_bit_for_bit(packs, name):
    _, cpu = _batches(packs / name, "cpu")
    ds, dev = _batches(packs / name, "device", num_workers=2, pin_memory=True)
    assert all(b["image"].is_pinned() for b in dev)
    _same(cpu, dev, ds.decompressor(), device="cuda")


@pytest.mark.cuda
def test_cuda_prefetcher_carries_stored_batches(packs):
    ds = _open(packs / "zarr-ctx", decode="device")
    layer = ds.decompressor().to("cuda")
    _, cpu = _batches(packs / "zarr-ctx", "cpu")
    got = list(DevicePrefetcher(make_loader(ds, batch_size=8, shuffle=False), "cuda"))
    for a, b in zip(cpu, got):
        assert b["image"].device.type == "cuda"
        assert torch.equal(layer(b["image"]), layer(_to(a["image"], "cuda")))
