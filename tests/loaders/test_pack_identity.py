"""decode="device": stored bytes carry their pack's identity and codec (`dctdata.decoder.wire.PackCodec`), so a batch
holding samples of several packs (a ConcatDataset of zarr packs, a ChainDataset of webdataset packs, two packs
paired through DecodeAhead) decodes each sample from its own pack's bytes with its own pack's codec: the
values decode="cpu" gives through each pack's own layer. Before, stream keys ((field, chunk), the sample
index) were the same in every pack, and a layer decoded another pack's bytes with its own steps."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest
import torch
from torch.utils.data import ChainDataset, ConcatDataset, DataLoader, StackDataset

import dctdata
from dctdata.decoder.wire import MixedStoredBatch, StoredBatch, collate, merge_stored
from dctdata.errors import DctDataError
from dctdata.format.reader import pack_identity
from dctdata.loaders.decode_ahead import DecodeAhead

N = 6
ZSTD = {"id": "zstd", "level": 3}
GOLDEN = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data")


def _smooth(seed: int, size: int = 32) -> np.ndarray:
    x = np.random.default_rng(seed).normal(size=(N, 1, size, size)).cumsum(-1).cumsum(-2)
    return x.astype(np.float32)


@pytest.fixture(scope="module")
def packs(tmp_path_factory):
    """Two packs of one field name, stage and shape, with different steps (PSNR 30 and 50), both formats."""
    root = tmp_path_factory.mktemp("identity")
    out = {}
    for fmt in ("zarr", "webdataset"):
        for name, seed, psnr in (("a", 0, 30), ("b", 1, 50)):
            path = root / f"{fmt}-{name}"
            kw = {"writer_options": {"samples_per_shard": 4}} if fmt == "webdataset" else {}
            dctdata.pack(_smooth(seed), path, format=fmt, target_psnr=psnr, lossless=ZSTD, quiet=True, **kw)
            out[fmt, name] = path
    out["wide"] = root / "wide"  # another sample shape
    dctdata.pack(_smooth(2, 48), out["wide"], target_psnr=40, lossless=ZSTD, quiet=True)
    return out


def _open(path, decode):
    m = dctdata.format.read_manifest(path)
    extra = {"shuffle": False} if m.storage == "webdataset" else {}
    return dctdata.open_dataset(path, decode=decode, **extra)


def _expected(packs, fmt):
    """Each pack's samples as its own layer decodes its decode="cpu" coefficients."""
    out = []
    for name in ("a", "b"):
        ds = _open(packs[fmt, name], "cpu")
        (q,) = next(iter(DataLoader(ds, batch_size=N)))
        out.append(ds.decompressor()(q))
    return torch.cat(out)


@pytest.mark.parametrize("which", ["a", "b"])
def test_a_concat_of_zarr_packs_decodes_each_sample_from_its_own_pack(packs, which):
    a, b = (_open(packs["zarr", n], "device") for n in ("a", "b"))
    (batch,) = next(iter(DataLoader(ConcatDataset([a, b]), batch_size=2 * N)))
    assert isinstance(batch, MixedStoredBatch) and len(batch) == 2 * N and len(batch.parts) == 2
    layer = (a if which == "a" else b).decompressor()  # either pack's layer: each part with its own codec
    assert torch.equal(layer(batch), _expected(packs, "zarr"))
    assert batch.indices == tuple(range(N)) * 2
    # a batch straddling the packs, in shuffled order, and out=
    order = [7, 0, 11, 3, 6]
    mixed = collate([ConcatDataset([a, b])[i] for i in order])[0]
    buf = torch.empty(len(order), 1, 32, 32)
    assert layer(mixed, out=buf) is buf and torch.equal(buf, _expected(packs, "zarr")[order])


def test_a_chain_of_webdataset_packs_decodes_each_sample_from_its_own_pack(packs):
    a, b = (_open(packs["webdataset", n], "device") for n in ("a", "b"))
    (batch,) = next(iter(DataLoader(ChainDataset([a, b]), batch_size=2 * N)))
    assert isinstance(batch, MixedStoredBatch)
    assert torch.equal(b.decompressor()(batch), _expected(packs, "webdataset"))


@pytest.mark.parametrize("fmt", ["zarr", "webdataset"])
def test_decode_ahead_pairs_two_packs(packs, fmt):
    """StackDataset(a, b) (streams: their loaders zipped): both fields are named "image". A dict by field, one
    layer, or layers by position: each pack decodes with its own codec; the layer given sets the output settings
    (dtype)."""
    a, b = (_open(packs[fmt, n], "device") for n in ("a", "b"))
    want = _expected(packs, fmt)
    if fmt == "zarr":
        loader = DataLoader(StackDataset(a, b), batch_size=4)
    else:  # streams have no StackDataset: their loaders zipped
        loader = list(zip(DataLoader(a, batch_size=4), DataLoader(b, batch_size=4)))
    for layers in ({"image": a.decompressor()}, a.decompressor(), [a.decompressor(), b.decompressor()]):
        got = [(xa, xb) for (xa,), (xb,) in DecodeAhead(loader, layers, group=2)]
        assert torch.equal(torch.cat([x for x, _ in got]), want[:N])
        assert torch.equal(torch.cat([x for _, x in got]), want[N:])
    wide = a.decompressor(dtype=torch.float64)
    got = [xb for (_,), (xb,) in DecodeAhead(loader, {"image": wide}, group=3)]
    assert all(x.dtype == torch.float64 for x in got)
    cpu_b = _open(packs[fmt, "b"], "cpu")
    (q,) = next(iter(DataLoader(cpu_b, batch_size=N)))
    assert torch.equal(torch.cat(got), cpu_b.decompressor(dtype=torch.float64)(q))


def test_decode_ahead_layers_by_position_must_cover_every_stored_value(packs):
    a, b = (_open(packs["zarr", n], "device") for n in ("a", "b"))
    loader = DataLoader(StackDataset(a, b), batch_size=4)
    with pytest.raises(
        DctDataError,
        match=r"stored value 1 \(field 'image'\): expected a decompressor for it in "
        r"layers\. Got 1 layers for positions 0\.\.0",
    ):
        list(DecodeAhead(loader, [a.decompressor()]))
    with pytest.raises(TypeError, match=r"layers: expected Decompress layers by position\. Got \[1\]"):
        DecodeAhead(loader, [a.decompressor(), torch.nn.Identity()])


def test_merged_groups_of_two_packs_decode_each_with_its_own_codec(packs):
    a, b = (_open(packs["zarr", n], "device") for n in ("a", "b"))
    ba, bb = collate([a[i] for i in range(N)])[0], collate([b[i] for i in range(N)])[0]
    merged, counts = merge_stored([ba, bb, ba])
    assert isinstance(merged, MixedStoredBatch) and counts == [N, N, N] and len(merged.parts) == 2
    want = _expected(packs, "zarr")
    assert torch.equal(a.decompressor()(merged), torch.cat([want[:N], want[N:], want[:N]]))
    again, _ = merge_stored([merged, merged])  # mixed batches merge too
    assert torch.equal(b.decompressor()(again), torch.cat([want[:N], want[N:], want[:N]] * 2))


def test_a_layer_refuses_to_give_another_packs_coefficients_naming_both(packs):
    a, b = (_open(packs["zarr", n], "device") for n in ("a", "b"))
    bb = collate([b[i] for i in range(2)])[0]
    with pytest.raises(
        DctDataError,
        match=r"field 'image': stored bytes of pack '.*zarr-b' \(sha256:[0-9a-f]{12}\), "
        r"whose codec differs from this decompressor's \(pack '.*zarr-a' \(sha256:",
    ):
        a.decompressor().decode_stored(bb)
    mixed = collate([a[0], b[0]])[0]
    with pytest.raises(DctDataError, match=r"a stored batch of several packs \(pack '.*zarr-a' .*, pack '.*zarr-b' "):
        a.decompressor().decode_stored(mixed)
    wire = b.decompressor().decode_stored(bb)  # its own pack's: as before
    assert (wire[0] if isinstance(wire, tuple) else wire).shape[0] == 2


def test_packs_of_different_sample_shapes_in_one_batch_are_refused_naming_both(packs):
    a, wide = _open(packs["zarr", "a"], "device"), _open(packs["wide"], "device")
    mixed = collate([a[0], wide[0]])[0]
    assert isinstance(mixed, MixedStoredBatch)
    with pytest.raises(
        DctDataError,
        match=r"a stored batch mixing pack '.*zarr-a' .* \(samples \(1, 32, 32\)\) and "
        r"pack '.*wide' .* \(samples \(1, 48, 48\)\): expected one sample shape",
    ):
        a.decompressor()(mixed)


def test_two_forms_of_one_pack_are_still_refused(packs):
    import dataclasses

    a = _open(packs["zarr", "a"], "device")
    (s0,), (s1,) = a[0], a[1]
    s1.form = dataclasses.replace(s1.form, rows=s1.form.rows + 1)
    with pytest.raises(
        DctDataError,
        match=r"expected one field's samples of one form per pack\. Got two forms of "
        r"field 'image' of pack '.*zarr-a'",
    ):
        collate([s0, s1])


def test_the_identity_is_the_packs_and_travels_with_its_bytes(packs):
    a1, a2, b = (
        _open(packs["zarr", "a"], "device"),
        _open(packs["zarr", "a"], "device"),
        _open(packs["zarr", "b"], "device"),
    )
    assert a1[0][0].form.pack == a2[0][0].form.pack != b[0][0].form.pack
    assert a1[0][0].form.pack == pack_identity(a1.manifest) and a1[0][0].form.pack.startswith("sha256:")
    seal = dctdata.format.read_manifest(packs["zarr", "a"])
    assert a1[0][0].form.pack == pack_identity(seal)
    # two opens of one pack: one part (its streams shared), a worker's pickled batch keeps its codec
    batch = collate([a1[0][0], a2[1][0]])
    assert isinstance(batch, StoredBatch)
    back = pickle.loads(pickle.dumps(batch))
    assert back.form == batch.form and back.form.codec.spec == a1.manifest.field("image").codec
    assert torch.equal(b.decompressor()(back), a1.decompressor()(batch))


@pytest.mark.parametrize("golden", ["golden_v1", os.path.join("golden_wds_v4", "ctx")])
def test_packs_written_before_identities_get_one_from_their_manifest(golden):
    path = os.path.join(GOLDEN, golden)
    ds = _open(path, "device")
    sample = next(iter(ds))
    stored = [v for v in (sample if isinstance(sample, (tuple, list)) else [sample]) if hasattr(v, "form")]
    assert stored and stored[0].form.pack == pack_identity(ds.manifest)
    layer = ds.decompressor()
    cpu = _open(path, "cpu")
    q = next(iter(DataLoader(cpu, batch_size=2)))
    got = next(iter(DataLoader(ds, batch_size=2)))
    k = next(i for i, v in enumerate(got) if isinstance(v, (StoredBatch, MixedStoredBatch)))
    assert torch.equal(layer(got[k]), cpu.decompressor()(q[k]))
