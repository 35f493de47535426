"""dctdata.preprocess.sources directly: every source kind gives the same samples through `sample`,
`batches` and `take`, streams rather than loads, and names what is wrong."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
from PIL import Image
from sample_fields import poisson_fields

from dctdata.errors import DctDataError
from dctdata.preprocess.sources import ChannelsLast, field_name, open_source

X = poisson_fields(7, 2, 10, 12)
LABELS = np.arange(7, dtype=np.int64) * 3


def _same(src, expected: dict[str, np.ndarray]) -> None:
    """The three ways of reading agree with the arrays the source was written from."""
    assert len(src) == 7
    assert {k: (s, d) for k, (s, d) in src.probe().items()} == {k: (v.shape[1:], v.dtype) for k, v in expected.items()}
    got = {k: [] for k in expected}
    for a, batch in src.batches(3):
        assert a % 3 == 0
        for k, v in batch.items():
            got[k].append(v)
    for k, v in expected.items():
        np.testing.assert_array_equal(np.concatenate(got[k]), v)
        np.testing.assert_array_equal(src.take([1, 5])[k], v[[1, 5]])


def test_npy_is_read_by_rows_never_whole(tmp_path):
    from dctdata.preprocess.sources.arrays import NpyRows

    np.save(tmp_path / "x.npy", X)
    src = open_source(tmp_path / "x.npy")
    _same(src, {"image": X})
    assert isinstance(src.arrays["image"], NpyRows)  # positional reads of the rows asked for, no memory map
    assert src.where(4).endswith("x.npy sample 4")


def test_npz_streams_rows_and_names_fields(tmp_path):
    np.savez(tmp_path / "d.npz", **{"my image": X, "label": LABELS})
    src = open_source(tmp_path / "d.npz")
    assert not src.random_access
    _same(src, {"my_image": X, "label": LABELS})


def test_directory_of_npz_in_name_order(tmp_path):
    for i in range(7):
        np.savez(tmp_path / f"{i:02d}.npz", image=X[i], label=LABELS[i])
    _same(open_source(tmp_path), {"image": X, "label": LABELS})


def test_hdf5_nested_keys_and_channels_last(tmp_path):
    with h5py.File(tmp_path / "d.h5", "w") as f:
        f["group/images"] = np.moveaxis(X, 1, -1)
        f["other"] = LABELS
    src = open_source(tmp_path / "d.h5", key="group/images", channels_last=True)
    assert isinstance(src, ChannelsLast)
    _same(src, {"group_images": X})
    with pytest.raises(DctDataError, match=r"d\.h5: --key 'nope': expected one of \['group/images', 'other'\]"):
        open_source(tmp_path / "d.h5", key="nope")


def test_image_folder_with_classes(tmp_path):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 65535, (7, 10, 12), dtype=np.uint16)
    for i, img in enumerate(images):
        folder = tmp_path / ("a" if i < 3 else "b")
        folder.mkdir(exist_ok=True)
        Image.fromarray(img).save(folder / f"{i}.png")
    src = open_source(tmp_path)
    _same(src, {"image": images[:, None], "label": np.array([0, 0, 0, 1, 1, 1, 1])})
    assert src.default_kinds == {"image": "dct"}


def test_callable_items_named_by_position(tmp_path, monkeypatch):
    (tmp_path / "mysrc.py").write_text(
        "import numpy as np\n"
        "X = np.arange(7 * 6, dtype=np.float32).reshape(7, 1, 2, 3)\n"
        "class D:\n    def __len__(self): return 7\n    def __getitem__(self, i): return X[i], i * 3\n"
        "def make(): return D()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    src = open_source("mysrc:make")
    x = np.arange(7 * 6, dtype=np.float32).reshape(7, 1, 2, 3)
    _same(src, {"image": x, "label": LABELS})


def test_field_names_become_identifiers():
    assert field_name("/a/b c") == "a_b_c" and field_name("3d") == "f_3d" and field_name("ok_1") == "ok_1"


def test_unknown_kinds_and_misplaced_key_are_named(tmp_path):
    (tmp_path / "x.csv").write_text("1\n")
    with pytest.raises(DctDataError, match=r"x\.csv: expected a \.npy, \.npz, HDF5 .*Got an unknown source kind"):
        open_source(tmp_path / "x.csv")
    np.save(tmp_path / "x.npy", X)
    with pytest.raises(DctDataError, match=r"--key: expected an HDF5 source"):
        open_source(tmp_path / "x.npy", key="a")
    with pytest.raises(DctDataError, match=r"nope\.npy: expected an existing file or directory"):
        open_source(tmp_path / "nope.npy")
    with pytest.raises(TypeError, match="source: expected a path, URL or module:callable string, a NumPy array"):
        open_source(3)
