"""`DecodeAhead` with a `Decompress` layer (`DecompressBatches`): a group of `decode="device"` loader batches
merged into one decode (one launch of the stage's device decoder, one layer call), checked once, handed back
batch by batch with the stored fields decoded: the arrays of the per-batch decode bit for bit, other fields
untouched, a refused sample named when its group is finished. Here on the CPU; on CUDA in the GPU checks."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from test_device_decode import _flip, _open, _tamper, packs  # noqa: F401 - the packs fixture

import dctdata
from dctdata.decoder.wire import MixedStoredBatch, StoredBatch, collate, merge_stored
from dctdata.errors import DctDataError, IntegrityError
from dctdata.loaders.decode_ahead import DecodeAhead, DecompressBatches
from dctdata.loaders.distributed import make_loader


def _loader(path, batch=8):
    ds = _open(path, decode="device")
    return ds, list(make_loader(ds, batch_size=batch, shuffle=False))


@pytest.mark.parametrize("name", ["zarr-ctx", "zarr-ctx-1", "zarr-zstd", "wds-ctx", "wds-bf16"])
@pytest.mark.parametrize("group", [1, 3])
def test_groups_decode_like_each_batch(packs, name, group):  # noqa: F811
    ds, batches = _loader(packs / name, batch=6)
    layer = ds.decompressor("image")
    got = list(DecodeAhead(batches, layer, group=group))
    assert len(got) == len(batches)
    assert group == 1 or len(batches) % group  # a last, partial group too
    for a, b in zip(batches, got):
        assert isinstance(a["image"], StoredBatch) and isinstance(b["image"], torch.Tensor)
        assert torch.equal(b["image"], layer(a["image"]))
        assert torch.equal(b["label"], a["label"]) and torch.equal(b["image_valid"], a["image_valid"])


def test_a_dict_of_layers_by_field_and_tuple_batches(packs):  # noqa: F811
    ds, batches = _loader(packs / "zarr-ctx")
    layer = ds.decompressor("image")
    as_tuples = [(b["image"], b["label"]) for b in batches]
    got = list(DecodeAhead(as_tuples, {"image": layer}, group=2))
    assert [type(g) for g in got] == [tuple] * len(batches)
    for (img, label), b in zip(got, batches):
        assert torch.equal(img, layer(b["image"])) and torch.equal(label, b["label"])
    with pytest.raises(DctDataError, match=r"field 'image': expected a decompressor for it in layers. Got \['mask'\]"):
        list(DecodeAhead(as_tuples, {"mask": layer}, group=2))


def test_a_refused_sample_is_named_when_its_group_is_finished(packs, tmp_path):  # noqa: F811
    _tamper(packs / "zarr-ctx-1", tmp_path / "z", _flip(2), reseal=True)  # passes its crc32c: only decoding tells
    ds = _open(tmp_path / "z", decode="device")
    batches = [collate(ds.__getitems__([2, 3])), collate(ds.__getitems__([0, 1]))]
    decoder = DecompressBatches(ds.decompressor())
    pending = decoder.start(batches, 4)  # queued: nothing is read back yet
    with pytest.raises(IntegrityError, match=r"field 'image' sample 0: expected dctdata_ctxrans-coded bytes"):
        decoder.finish(pending)


def test_merge_stored_keeps_each_samples_row_and_side(packs):  # noqa: F811
    ds = _open(packs / "zarr-ctx", decode="device")  # chunks of several samples: batches pick rows
    a, b = collate(ds.__getitems__([1, 2])), collate(ds.__getitems__([5, 0, 7]))
    merged, counts = merge_stored([a["image"], b["image"]])
    assert counts == [2, 3] and merged.indices == (1, 2, 5, 0, 7)
    assert merged.offsets.device.type == "cpu" and int(merged.offsets[-1]) == merged.data.numel()
    layer = ds.decompressor("image")
    assert torch.equal(layer(merged), torch.cat([layer(a["image"]), layer(b["image"])]))


def test_merge_and_group_errors(packs):  # noqa: F811
    ds = _open(packs / "zarr-ctx", decode="device")
    other = _open(packs / "zarr-zstd", decode="device")
    a, b = collate(ds.__getitems__([0])), collate(other.__getitems__([0]))
    merged, counts = merge_stored([a["image"], b["image"]])  # two packs: one part each, with its own codec
    assert isinstance(merged, MixedStoredBatch) and counts == [1, 1] and len(merged.parts) == 2
    form = dataclasses.replace(a["image"].form, rows=a["image"].form.rows + 1)  # another form of the same pack
    with pytest.raises(
        DctDataError,
        match=r"stored batches: expected one field's batches of one form per pack\. "
        r"Got two forms of field 'image' of pack '.*zarr-ctx' \(sha256:",
    ):
        merge_stored([a["image"], dataclasses.replace(a["image"], form=form)])
    with pytest.raises(DctDataError, match=r"stored batches: expected at least one to merge. Got none"):
        merge_stored([])
    with pytest.raises(TypeError, match=r"stored batches: expected dctdata.decoder.wire.StoredBatch. Got Tensor"):
        merge_stored([torch.zeros(1)])
    with pytest.raises(TypeError, match=r"layers: expected a Decompress layer \(ds.decompressor\(\)\). Got int"):
        DecompressBatches(3)
    decoder = DecompressBatches(ds.decompressor())
    with pytest.raises(DctDataError, match=r"batches 0..1: expected the same stored fields in each. Got \[1, 0\]"):
        decoder.start([a, {"label": a["label"]}], 0)


def test_offsets_stay_on_the_host_when_a_batch_moves(packs):  # noqa: F811
    ds = _open(packs / "zarr-ctx", decode="device")
    batch = collate(ds.__getitems__([0, 1]))["image"]
    moved = batch.apply(lambda t: t.to("meta"))  # any device but the host
    assert moved.data.device.type == "meta" and moved.offsets.device.type == "cpu"
    assert torch.equal(moved.offsets, batch.offsets)


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["zarr-ctx", "zarr-ctx-1", "zarr-zstd", "wds-ctx"])
def test_cuda_groups_decode_like_each_batch_on_the_device(packs, name):  # noqa: F811
    from dctdata.loaders.device import DevicePrefetcher

    ds = _open(packs / name, decode="device")
    layer = ds.decompressor("image").to("cuda")
    loader = make_loader(ds, batch_size=6, shuffle=False, num_workers=2, pin_memory=True)
    want = [layer(b["image"]) for b in DevicePrefetcher(loader, "cuda")]
    got = list(DecodeAhead(DevicePrefetcher(loader, "cuda"), layer, group=3))
    assert len(got) == len(want)
    for a, b in zip(want, got):
        assert b["image"].device.type == "cuda" and torch.equal(a, b["image"])


@pytest.mark.cuda
def test_cuda_a_refused_sample_is_named_when_its_group_is_finished(packs, tmp_path):  # noqa: F811
    _tamper(packs / "zarr-ctx-1", tmp_path / "z", _flip(2), reseal=True)
    ds = _open(tmp_path / "z", decode="device")
    batches = [collate(ds.__getitems__([2, 3])), collate(ds.__getitems__([0, 1]))]
    batches = [{k: (v.to("cuda") if hasattr(v, "to") else v) for k, v in b.items()} for b in batches]
    decoder = DecompressBatches(ds.decompressor().to("cuda"))
    with pytest.raises(IntegrityError, match=r"field 'image' sample 0: expected dctdata_ctxrans-coded bytes"):
        decoder.finish(decoder.start(batches, 0))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_hostile_correction_rows_are_named_when_their_group_is_finished(tmp_path, device):
    """A bounded field's correction rows (`dctdata.decoder.corrections`) are checked with the group's other checks at
    finish, not read back when the group is queued; the message names the sample in the pack."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    x = np.cumsum(np.cumsum(np.random.default_rng(4).standard_normal((6, 1, 24, 32)), -1), -2).astype(np.float32)
    dctdata.pack(x, tmp_path / "b", max_rel_error=1e-3, quiet=True)
    ds = _open(tmp_path / "b", decode="device")
    layer = ds.decompressor().to(device)
    spec = layer.spec
    a, b = (collate(ds.__getitems__(i)) for i in ([4, 5], [0, 1]))
    a, b = ({k: (v.to(device) if hasattr(v, "to") else v) for k, v in t.items()} for t in (a, b))
    assert spec.corrections is not None and a["image"].side is not None  # the worker read the side values
    bad = a["image"].side.clone()
    bad[1, spec.channels, 1] = spec.corrections + 1
    decoder = DecompressBatches(layer)
    pending = decoder.start([dict(a, image=a["image"].with_side(bad)), b], 0)  # queued: no error yet
    with pytest.raises(IntegrityError, match=r"coeffs: sample 5: corrections: .* count outside"):
        decoder.finish(pending)
    got = decoder.finish(decoder.start([a, b], 0))
    assert torch.equal(got[0]["image"], layer(a["image"])) and torch.equal(got[1]["image"], layer(b["image"]))
