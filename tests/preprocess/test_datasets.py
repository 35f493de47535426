"""Synthetic SciML stand-ins: shapes, dtypes, ranges, determinism, and that they carry real structure."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import dctdata.datasets as S
from dctdata import DctDataError

FACTORY_CASES = {
    "em_denoise": dict(n=3, size=64),
    "optical_damage": dict(n=3),
    "slstr_cloud": dict(n=3, size=48),
    "cifar_like": dict(n=20),
}


def _equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k], equal_nan=a[k].dtype.kind == "f") for k in a)


# Shapes, dtypes, ranges --------------------------------------------------------------------------
def test_em_denoise_sample():
    ds = S.em_denoise()
    assert len(ds) == 64 and ds.fields == {"noisy": "dct", "clean": "dct"}
    s = ds[0]
    for k in ("noisy", "clean"):
        assert s[k].shape == (1, 256, 256) and s[k].dtype == np.float32
        assert np.isfinite(s[k]).all() and s[k].min() >= 0.0
    assert 0.5 < s["clean"].max() <= 1.2
    assert (s["noisy"] == 0).mean() > (s["clean"] == 0).mean()  # dead pixels
    assert not np.array_equal(s["noisy"], s["clean"])


def test_em_noisy_is_integer_counts_over_dose():
    rng = np.random.default_rng(5)
    clean = S.lattice_field(rng, 64)
    noisy = S.noisy_observation(rng, clean, dose=37.0, beam=S.beam_profile(rng, 64), dead_fraction=0.0)
    counts = noisy.astype(np.float64) * 37.0
    np.testing.assert_allclose(counts, np.rint(counts), atol=1e-3)


def test_poisson_statistics():
    rng = np.random.default_rng(0)
    clean = np.full((256, 256), 0.5, dtype=np.float32)
    dose = 40.0
    counts = S.noisy_observation(rng, clean, dose, dead_fraction=0.0).astype(np.float64) * dose
    lam = 0.5 * dose  # mean = variance = 20 counts
    assert abs(counts.mean() - lam) < 0.1
    assert abs(counts.var() - lam) < 0.6
    beam = np.linspace(0.2, 1.0, 256, dtype=np.float32)[None, :].repeat(256, 0)
    counts = S.noisy_observation(rng, clean, dose, beam=beam, dead_fraction=0.0).astype(np.float64) * dose
    left, right = counts[:, :32], counts[:, -32:]  # the beam makes mean and variance grow together
    assert right.mean() > 3 * left.mean()
    assert abs(left.var() / left.mean() - 1) < 0.15 and abs(right.var() / right.mean() - 1) < 0.15


def test_dead_pixels_fraction():
    rng = np.random.default_rng(1)
    clean = np.full((200, 200), 1.0, dtype=np.float32)
    noisy = S.noisy_observation(rng, clean, dose=1000.0, dead_fraction=0.01)
    assert 0.007 < (noisy == 0).mean() < 0.013


def _first_order_peaks(field: np.ndarray, a: float, theta: float, scale: float = 1.0) -> list[float]:
    """|FFT| at the six first-order reciprocal vectors of a triangular lattice (constant a, angle theta),
    |g| = 2 / (sqrt(3) a) cycles/px every 60 deg; `scale` probes a ring of another radius."""
    n = field.shape[0]
    spec = np.abs(np.fft.fftshift(np.fft.fft2(field - field.mean())))
    g = scale * 2.0 / (np.sqrt(3.0) * a) * n
    out = []
    for k in range(6):
        phi = theta + np.pi / 6 + k * np.pi / 3
        y, x = round(n / 2 + g * np.sin(phi)), round(n / 2 + g * np.cos(phi))
        out.append(float(spec[y - 1 : y + 2, x - 1 : x + 2].max()))
    return out


def test_lattice_has_hexagonal_fft_peaks():
    rng = np.random.default_rng(3)
    a, theta = 12.0, 0.3
    field = S.lattice_field(rng, 256, spacing=a, angle=theta)
    peaks = _first_order_peaks(field, a, theta)
    between = _first_order_peaks(field, a, theta, scale=0.7)
    spec = np.abs(np.fft.fft2(field - field.mean()))
    assert min(peaks) > 10 * max(between)
    assert np.median(peaks) > 20 * np.median(spec)


def test_lattice_spacing_sets_period():
    for a, other in ((9.0, 14.0), (14.0, 9.0)):
        field = S.lattice_field(np.random.default_rng(4), 128, spacing=a, angle=0.0)
        assert min(_first_order_peaks(field, a, 0.0)) > 5 * max(_first_order_peaks(field, other, 0.0))


def test_optical_damage_sample():
    ds = S.optical_damage(n=4)
    s = ds[0]
    assert s["image"].shape == (1, 492, 656) and s["image"].dtype == np.uint16
    assert s["label"].dtype == np.int64 and s["label"].shape == () and int(s["label"]) in (0, 1)
    img = s["image"]
    assert img.max() > 10000  # uses the 16-bit range, far beyond 8 bits
    assert img.min() < 1000  # dark background outside the beam
    assert 492 % 8 and not 656 % 8  # non-multiple-of-8 height on purpose


def test_speckle_is_speckled_and_damage_darkens():
    rng = np.random.default_rng(7)
    frame = S.speckle_beam(rng, (256, 256), peak=30000.0).astype(np.float64)
    centre = frame[96:160, 96:160]
    assert centre.std() / centre.mean() > 0.2  # speckle contrast, not a smooth beam
    clean = S.speckle_beam(np.random.default_rng(11), (256, 256), damage_spots=0, peak=30000.0).astype(np.float64)
    hurt = S.speckle_beam(np.random.default_rng(11), (256, 256), damage_spots=4, peak=30000.0).astype(np.float64)
    assert not np.array_equal(clean, hurt)
    assert ((hurt - clean) < -2000).sum() > 20  # dark sites


def test_optical_damage_labels_follow_fraction():
    assert all(int(S.optical_damage(n=10, damaged=0.0)[i]["label"]) == 0 for i in range(10))
    assert all(int(S.optical_damage(n=10, damaged=1.0)[i]["label"]) == 1 for i in range(10))


def test_slstr_sample():
    ds = S.slstr_cloud(n=4, size=(96, 128))
    assert ds.fields == {"refs": "dct", "bts": "dct", "bayes": "array"}
    s = ds[1]
    refs, bts, mask = s["refs"], s["bts"], s["bayes"]
    assert refs.shape == (6, 96, 128) and bts.shape == (3, 96, 128) and mask.shape == (1, 96, 128)
    assert refs.dtype == bts.dtype == np.float32 and mask.dtype == np.uint8
    assert np.nanmin(refs) >= 0.0 and np.nanmax(refs) <= 1.0
    assert np.nanmin(bts) > 200.0 and np.nanmax(bts) < 320.0
    assert set(np.unique(mask)) <= {0, 1}


def test_slstr_nan_border_is_a_swath_edge():
    image, mask = S.cloud_field(np.random.default_rng(2), 128)
    nan = np.isnan(image)
    assert nan.any()
    assert (nan == nan[0]).all()  # the same pixels in every channel
    cols = nan[0].mean(axis=0)
    assert cols[0] == 1.0 or cols[-1] == 1.0  # touches the left or the right edge
    assert cols.mean() < 0.3
    assert (mask[nan[0]] == 0).all()
    image, _ = S.cloud_field(np.random.default_rng(2), 128, nan_border=False)
    assert np.isfinite(image).all()


def test_slstr_clouds_are_cold_and_bright():
    image, mask = S.cloud_field(np.random.default_rng(9), 256, nan_border=False)
    cloud, clear = mask.astype(bool), ~mask.astype(bool)
    assert 0.05 < cloud.mean() < 0.9
    bt11, vis = image[7], image[0]
    assert bt11[cloud].mean() < bt11[clear].mean() - 10.0
    assert vis[cloud].mean() > vis[clear].mean() + 0.2
    assert bt11[cloud].min() < 250.0  # cold cloud tops


def test_cifar_sample():
    ds = S.cifar_like(n=30)
    s = ds[13]
    assert s["image"].shape == (3, 32, 32) and s["image"].dtype == np.uint8
    assert s["label"].dtype == np.int64 and int(s["label"]) == 3
    assert np.bincount([int(ds[i]["label"]) for i in range(30)], minlength=10).tolist() == [3] * 10


def test_cifar_classes_are_learnable():
    def arrays(ds):
        x = np.stack([ds[i]["image"] for i in range(len(ds))]).reshape(len(ds), -1).astype(np.float32) / 255
        return x, np.array([int(ds[i]["label"]) for i in range(len(ds))])

    xtr, ytr = arrays(S.cifar_like(n=600, seed=0))
    xte, yte = arrays(S.cifar_like(n=300, seed=1))
    means = np.stack([xtr[ytr == c].mean(0) for c in range(10)])
    pred = np.argmin(((xte[:, None] - means[None]) ** 2).sum(-1), axis=1)
    assert (pred == yte).mean() > 0.3  # chance is 0.1


# Determinism -------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(FACTORY_CASES))
def test_determinism_per_index(name):
    kw = FACTORY_CASES[name]
    a, b = S.FACTORIES[name](**kw), S.FACTORIES[name](**kw)
    forward = [a[i] for i in range(len(a))]
    backward = [b[i] for i in reversed(range(len(b)))][::-1]
    assert all(_equal(x, y) for x, y in zip(forward, backward))
    assert not _equal(forward[0], forward[1])
    assert _equal(a[-1], forward[-1])
    other = S.FACTORIES[name](**{**kw, "seed": 1})
    assert not _equal(other[0], forward[0])


def test_determinism_across_processes_and_pickle():
    ds = S.em_denoise(n=4, size=32)
    clone = pickle.loads(pickle.dumps(ds))
    assert _equal(clone[2], ds[2])
    loader = DataLoader(ds, batch_size=2, num_workers=2)
    batches = list(loader)
    expected = torch.from_numpy(np.stack([ds[i]["noisy"] for i in range(4)]))
    assert torch.equal(torch.cat([b["noisy"] for b in batches]), expected)


def test_dataset_kinds_do_not_share_streams():
    assert not np.array_equal(
        S.em_denoise(n=1, size=32, seed=0).rng(0).random(4), S.slstr_cloud(n=1, seed=0).rng(0).random(4)
    )


def test_factory_accepts_cli_strings():
    ds = S.em_denoise(n="2", size="32x48", seed="3")
    assert len(ds) == 2 and ds[0]["noisy"].shape == (1, 32, 48)
    assert _equal(ds[1], S.em_denoise(n=2, size=(32, 48), seed=3)[1])
    assert S.optical_damage(n=1, damaged="0")[0]["label"] == 0
    assert "EMDenoise(n=2" in repr(ds)


def test_collates_with_default_collate():
    batch = next(iter(DataLoader(S.cifar_like(n=8), batch_size=4)))
    assert batch["image"].shape == (4, 3, 32, 32) and batch["image"].dtype == torch.uint8
    assert batch["label"].tolist() == [0, 1, 2, 3]


# Errors -----------------------------------------------------------------------------------------
def test_index_errors():
    ds = S.cifar_like(n=5)
    with pytest.raises(IndexError, match=r"cifar_like: expected an index in \[-5, 5\). Got 5"):
        ds[5]
    with pytest.raises(IndexError, match="Got -6"):
        ds[-6]
    with pytest.raises(TypeError, match=r"expected an integer index. Got str"):
        ds["0"]
    assert _equal(ds[np.int64(2)], ds[2])


def test_argument_errors():
    with pytest.raises(DctDataError, match=r"n: expected an integer >= 1. Got 0"):
        S.em_denoise(n=0)
    with pytest.raises(DctDataError, match=r"n: expected an integer >= 1. Got 'ten'"):
        S.em_denoise(n="ten")
    with pytest.raises(TypeError, match=r"seed: expected an integer >= 0. Got 1.5"):
        S.cifar_like(seed=1.5)
    with pytest.raises(DctDataError, match=r"seed: expected an integer >= 0. Got -1"):
        S.cifar_like(seed=-1)
    with pytest.raises(DctDataError, match=r"size: expected an int or a pair \(H, W\). Got \(1, 2, 3\)"):
        S.slstr_cloud(size=(1, 2, 3))
    with pytest.raises(DctDataError, match=r"size\[1\]: expected an integer >= 8. Got 4"):
        S.slstr_cloud(size=(64, 4))
    with pytest.raises(DctDataError, match=r"damaged: expected a number in \[0, 1\]. Got 2"):
        S.optical_damage(damaged=2)
    with pytest.raises(TypeError, match="nan_border: expected a bool"):
        S.slstr_cloud(nan_border="yes")


def test_function_errors():
    rng = np.random.default_rng(0)
    with pytest.raises(TypeError, match=r"rng: expected a numpy.random.Generator"):
        S.lattice_field(0, 64)
    with pytest.raises(DctDataError, match=r"spacing: expected a lattice constant > 1 pixel. Got 0.5"):
        S.lattice_field(rng, 64, spacing=0.5)
    clean = np.ones((8, 8), np.float32)
    with pytest.raises(DctDataError, match=r"dose: expected counts per unit intensity > 0. Got 0"):
        S.noisy_observation(rng, clean, dose=0)
    with pytest.raises(DctDataError, match=r"beam: expected shape \(8, 8\)"):
        S.noisy_observation(rng, clean, dose=10.0, beam=np.ones((4, 4), np.float32))
    with pytest.raises(DctDataError, match="clean: expected finite intensities >= 0"):
        S.noisy_observation(rng, -clean, dose=10.0)
    with pytest.raises(TypeError, match=r"clean: expected a numpy array. Got list"):
        S.noisy_observation(rng, [[1.0]], dose=10.0)
    with pytest.raises(DctDataError, match=r"label: expected a class in 0..9. Got 10"):
        S.cifar_image(rng, 10)
    with pytest.raises(DctDataError, match=r"damage_spots: expected an integer >= 0. Got -1"):
        S.speckle_beam(rng, 64, damage_spots=-1)
