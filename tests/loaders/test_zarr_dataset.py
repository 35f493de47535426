"""DCTZarrDataset: indexing, batched reads, DataLoader workers under fork and spawn, fsspec URLs, and
integrity (a corrupted or missing chunk raises and `dctdata verify` names it)."""

from __future__ import annotations

import multiprocessing as mp

import numpy as np
import pytest
import torch

import dctdata
from dctdata.cli import main
from dctdata.errors import IntegrityError


def make(tmp_path, n=23, chunk=2, shard=4):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 2, 12, 17)).astype(np.float32).cumsum(-1)
    labels = np.arange(n) * 3
    np.savez(tmp_path / "d.npz", image=x, label=labels)
    out = tmp_path / "ds"
    dctdata.pack(
        tmp_path / "d.npz", out, cf=8, quiet=True, writer_options={"chunk_samples": chunk, "shard_samples": shard}
    )
    return out, x, labels


def test_indexing_and_batches(tmp_path):
    out, x, labels = make(tmp_path)
    ds = dctdata.open_dataset(out)
    assert len(ds) == 23 and "DCTZarrDataset" in repr(ds)
    img, lab = ds[-1]
    assert int(lab) == labels[-1] and img.shape == ds.manifest.field("image").stored_shape
    batch = ds.__getitems__([5, 3, 4, 20, 5])
    assert [int(b[1]) for b in batch] == [15, 9, 12, 60, 15]
    assert all(torch.equal(b[0], ds[i][0]) for b, i in zip(batch, [5, 3, 4, 20, 5]))
    dec = ds.decompressor()(torch.stack([b[0] for b in batch]))
    np.testing.assert_allclose(dec.numpy(), x[[5, 3, 4, 20, 5]], atol=1e-4)
    with pytest.raises(IndexError, match="out of range"):
        ds[23]
    with pytest.raises(TypeError, match=r"index: expected an int or a slice. Got str"):
        ds["a"]
    with pytest.raises(dctdata.DctDataError, match="expected a dct field"):
        ds.decompressor("label")
    with pytest.raises(dctdata.DctDataError, match="field: expected one of"):
        ds.decompressor("nope")
    with pytest.raises(dctdata.DctDataError, match="on_error: expected 'raise' or 'skip'"):
        dctdata.open_dataset(out, on_error="ignore")
    d = dctdata.open_dataset(out, as_dict=True, fields=["label"])
    assert d[2] == {"label": torch.tensor(6)}


def test_slices_are_collated_batches(tmp_path):
    out, x, labels = make(tmp_path)
    ds = dctdata.open_dataset(out)
    coeffs, lab = ds[0:4]  # a batch, as a DataLoader collates it: straight into the decompressor
    assert coeffs.shape == (4, *ds.manifest.field("image").stored_shape) and lab.tolist() == list(labels[:4])
    np.testing.assert_allclose(ds.decompressor()(coeffs).numpy(), x[:4], atol=1e-4)
    assert ds[-3:].__getitem__(1).tolist() == list(labels[-3:])
    assert ds[20:2:-6][1].tolist() == [60, 42, 24]
    empty = ds[5:5]
    assert empty[0].shape == (0, *coeffs.shape[1:]) and empty[0].dtype == coeffs.dtype and empty[1].shape == (0,)
    d = dctdata.open_dataset(out, as_dict=True)[1:3]
    assert set(d) == {"image", "label"} and d["label"].tolist() == [3, 6]


@pytest.mark.parametrize("method", ["fork", pytest.param("spawn", marks=pytest.mark.slow)])
def test_dataloader_workers(tmp_path, method):
    if method not in mp.get_all_start_methods():
        pytest.skip(f"no {method} start method here")
    out, x, _labels = make(tmp_path)
    ds = dctdata.open_dataset(out)
    ds[0]  # open zarr in the parent first: a forked child must not reuse it
    loader = torch.utils.data.DataLoader(
        ds,
        batch_size=5,
        shuffle=True,
        num_workers=2,
        multiprocessing_context=method,
        generator=torch.Generator().manual_seed(0),
    )
    layer = ds.decompressor()
    seen = {}
    for img, lab in loader:
        for im, lb in zip(layer(img), lab):
            seen[int(lb) // 3] = im.numpy()
    assert sorted(seen) == list(range(23))
    np.testing.assert_allclose(np.stack([seen[i] for i in range(23)]), x, atol=1e-4)


def test_fsspec_url(tmp_path):
    import fsspec

    out, x, labels = make(tmp_path)
    fs = fsspec.filesystem("memory")
    fs.put(str(out), "/dctdata_test_ds", recursive=True)
    try:
        ds = dctdata.open_dataset("memory://dctdata_test_ds")
        assert [int(ds[i][1]) for i in range(len(ds))] == labels.tolist()
        np.testing.assert_allclose(ds.decompressor()(ds[7][0]).numpy(), x[7], atol=1e-4)
        fs.rm("/dctdata_test_ds/image/c.3.0.0.0.0")
        with pytest.raises(
            IntegrityError, match=r"image/c\.3\.0\.0\.0\.0: field 'image' samples 12\.\.15: expected a shard file"
        ):
            dctdata.open_dataset("memory://dctdata_test_ds")[13]
    finally:
        fs.rm("/dctdata_test_ds", recursive=True)


def _flip(path, offset=40):
    raw = bytearray(path.read_bytes())
    raw[offset] ^= 0xFF
    path.write_bytes(bytes(raw))


def test_corrupted_chunk_fails_verify_and_read(tmp_path, capsys):
    out, _x, _labels = make(tmp_path)
    assert main(["verify", str(out)]) == 0
    assert "OK" in capsys.readouterr().out
    _flip(out / "image" / "c.2.0.0.0.0")
    ds = dctdata.open_dataset(out)
    with pytest.raises(
        IntegrityError, match=r"c\.2\.0\.0\.0\.0: field 'image' samples 8\.\.9 \(chunk 4\): expected intact stored data"
    ):
        ds[8]
    assert int(ds[2][1]) == 6  # other shards still read
    assert main(["verify", str(out)]) == 1
    text = capsys.readouterr().out
    assert "image/c.2.0.0.0.0: expected sha256" in text and "samples 8..11" in text
    skip = dctdata.open_dataset(out, on_error="skip")
    got = skip.__getitems__([7, 8, 9, 12])
    assert [int(g[1]) for g in got] == [21, 36] and skip.skipped == 2  # 8 and 9 share the bad chunk


def _as_list(batch):
    return batch


@pytest.mark.parametrize("context", ["fork", pytest.param("spawn", marks=pytest.mark.slow)])
def test_skipped_count_reaches_the_main_process_from_workers(tmp_path, context):
    """on_error="skip" in DataLoader workers: `ds.skipped` in the main process counts what the workers dropped
    (it stayed 0: each worker counted in its own copy)."""
    out, _x, labels = make(tmp_path)
    _flip(out / "image" / "c.2.0.0.0.0")  # samples 8..9 (one chunk) fail their checksum
    ds = dctdata.open_dataset(out, on_error="skip")
    loader = torch.utils.data.DataLoader(
        ds, batch_size=4, num_workers=2, multiprocessing_context=context, collate_fn=_as_list
    )
    seen = sorted(int(s[1]) for batch in loader for s in batch)
    assert seen == [v for i, v in enumerate(labels.tolist()) if i not in (8, 9)] and ds.skipped == 2
    assert sum(len(b) for b in loader) == len(ds) - 2 and ds.skipped == 4  # a second epoch adds its own


def test_missing_shard_is_not_fill_value(tmp_path, capsys):
    out, _x, _labels = make(tmp_path)
    (out / "image" / "c.5.0.0.0.0").unlink()
    ds = dctdata.open_dataset(out)
    with pytest.raises(IntegrityError, match=r"samples 20\.\.22: expected a shard file\. Got none \(missing\)"):
        ds[21]
    assert main(["verify", str(out)]) == 1
    assert (
        "c.5.0.0.0.0: expected a stored file. Got none (missing) (field 'image', samples 20..22)"
        in capsys.readouterr().out
    )


def test_verify_and_info_on_non_datasets(tmp_path, capsys):
    assert main(["verify", str(tmp_path / "nothing")]) == 1
    assert "expected a dctdata manifest" in capsys.readouterr().err
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "manifest.json").write_text("{not json")
    assert main(["info", str(tmp_path / "bad")]) == 1
    assert "expected a JSON manifest" in capsys.readouterr().err
