"""What both dataset kinds share (`dctdata.loaders.base`): class names from the source, and a
decompressor clamped to the source's range on request."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import dctdata
from dctdata.errors import DctDataError, FormatError
from dctdata.loaders.base import ClampToRange


@pytest.fixture(scope="module")
def frames(tmp_path_factory):
    """16-bit speckle-like frames near the bottom of their range (quantization error dips below 0),
    in class folders."""
    from PIL import Image

    root = tmp_path_factory.mktemp("frames")
    rng = np.random.default_rng(0)
    for c, cls in enumerate(("damaged", "intact")):
        (root / "src" / cls).mkdir(parents=True)
        for i in range(3):
            frame = rng.exponential(400.0 + 200 * c, (40, 48)).astype(np.uint16)
            Image.fromarray(frame).save(root / "src" / cls / f"{i}.png")
    for fmt in ("zarr", "webdataset"):
        dctdata.pack(root / "src", root / fmt, format=fmt, quant="int8", target_psnr=25, quiet=True)
    return root


@pytest.mark.parametrize("fmt", ["zarr", "webdataset"])
def test_classes_come_from_the_source(frames, fmt):
    ds = dctdata.open_dataset(frames / fmt)
    assert ds.classes == ["damaged", "intact"]
    assert ds.class_to_idx == {"damaged": 0, "intact": 1}


def test_no_classes_is_none_and_a_bad_list_is_a_format_error(tmp_path):
    np.save(tmp_path / "x.npy", np.random.default_rng(0).random((2, 8, 8), np.float32))
    dctdata.pack(tmp_path / "x.npy", tmp_path / "p", quiet=True)
    ds = dctdata.open_dataset(tmp_path / "p")
    assert ds.classes is None and ds.class_to_idx is None
    object.__setattr__(ds.manifest, "pack", {**ds.manifest.pack, "source_info": {"classes": "cat"}})
    with pytest.raises(FormatError, match=r"pack.source_info.classes: expected a list of names. Got 'cat'"):
        _ = ds.classes


def test_clamp_to_the_uint16_source_range(frames):
    ds = dctdata.open_dataset(frames / "zarr")
    coeffs = ds[0:6][0]
    plain = ds.decompressor()(coeffs)
    assert float(plain.min()) < 0  # the surprise: a uint16 frame decodes to negative values
    clamped = ds.decompressor(clamp=True)
    assert isinstance(clamped[1], ClampToRange)
    out = clamped(coeffs)
    assert float(out.min()) >= 0 and float(out.max()) <= 65535
    assert torch.equal(out, plain.clamp(0, 65535))
    assert torch.equal(ds.decompressor(clamp=(10, 500))(coeffs), plain.clamp(10, 500))


def test_clamp_follows_normalization_and_refuses_what_has_no_range(frames, tmp_path):
    ds = dctdata.open_dataset(frames / "zarr")
    image = ds.manifest.field("image")
    normalized = dataclasses.replace(image, codec=image.codec.replace(mean=(100.0,), std=(50.0,)))
    fields = tuple(normalized if f.name == "image" else f for f in ds.manifest.fields)  # the side partner kept
    ds.manifest = dataclasses.replace(ds.manifest, fields=fields)
    layer = ds.decompressor(clamp=True)  # output is (x - 100) / 50: so are the bounds
    assert layer[1].low.flatten().tolist() == [-2.0]
    assert layer[1].high.flatten().tolist() == [pytest.approx((65535 - 100) / 50)]
    np.save(tmp_path / "f.npy", np.random.default_rng(0).random((2, 8, 8), np.float32))
    dctdata.pack(tmp_path / "f.npy", tmp_path / "f", quiet=True)
    floats = dctdata.open_dataset(tmp_path / "f")
    with pytest.raises(DctDataError, match=r"clamp=True: expected a field with an integer source dtype .*Got field "):
        floats.decompressor(clamp=True)
    with pytest.raises(DctDataError, match=r"clamp: expected low <= high. Got \(5, 1\)"):
        floats.decompressor(clamp=(5, 1))
    with pytest.raises(TypeError, match="clamp: expected True, False or a \\(low, high\\) pair"):
        floats.decompressor(clamp="yes")
