"""The synthetic SciML volumes (`dctdata.datasets.volumes`): deterministic in their seed, the spectra they claim,
and the structure that makes them different test data (fronts in the advected scalar)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dctdata.datasets.volumes import advected_scalar, power_law_field, velocity_component


def shell_spectrum(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(k, power in the spherical shell |k| in [k - 0.5, k + 0.5)) of a cubic periodic volume."""
    n = x.shape[0]
    p = np.abs(np.fft.fftn(x)) ** 2
    f = np.fft.fftfreq(n, 1.0 / n)
    k = np.sqrt(f[:, None, None] ** 2 + f[None, :, None] ** 2 + f[None, None, :] ** 2)
    shells = np.rint(k).astype(int)
    power = np.bincount(shells.ravel(), p.ravel()) / np.maximum(np.bincount(shells.ravel()), 1)
    return np.arange(len(power)), power


@pytest.mark.parametrize("make", [power_law_field, velocity_component, advected_scalar])
def test_shapes_dtypes_and_determinism(make):
    a = make(n=2, size=(12, 16, 20), seed=5)
    assert a.shape == (2, 12, 16, 20) and a.dtype == np.float32 and np.isfinite(a).all()
    np.testing.assert_array_equal(a, make(n=2, size=(12, 16, 20), seed=5))
    assert not np.allclose(a, make(n=2, size=(12, 16, 20), seed=6))
    assert not np.allclose(a[0], a[1]) and a.std() > 0


def test_power_law_field_has_the_kolmogorov_scalar_slope():
    """Shell-averaged power per mode falls as |k|^-beta (beta = 11/3) above the roll-off k0."""
    x = power_law_field(n=1, size=48, seed=0)[0].astype(np.float64)
    k, power = shell_spectrum(x)
    band = (k >= 6) & (k <= 18)
    slope = np.polyfit(np.log(k[band]), np.log(power[band]), 1)[0]
    assert slope == pytest.approx(-11 / 3, abs=0.35)
    steeper = power_law_field(n=1, size=48, beta=5.0, seed=0)[0].astype(np.float64)
    slope5 = np.polyfit(np.log(k[band]), np.log(shell_spectrum(steeper)[1][band]), 1)[0]
    assert slope5 == pytest.approx(-5.0, abs=0.35)


def test_velocity_component_has_an_energy_peak_and_a_dissipative_cutoff():
    x = velocity_component(n=1, size=48, k0=3.0, eta=0.05, seed=1)[0].astype(np.float64)
    k, power = shell_spectrum(x)
    energy = power * k**2  # E(k) ~ 4 pi k^2 |u_hat|^2
    assert 2 <= int(np.argmax(energy[1:24])) + 1 <= 5  # the peak near k0
    inertial = np.polyfit(np.log(k[6:12]), np.log(energy[6:12]), 1)[0]
    assert -2.6 < inertial < -1.0  # a k^-5/3 range, bent by the cut-off
    # the cut-off exp(-(k eta)^2): the same noise with eta doubled keeps exp(-(20 * 0.1)^2 + (20 * 0.05)^2) = e^-3
    # of the energy at 20 cycles and nearly all of it at 3
    y = velocity_component(n=1, size=48, k0=3.0, eta=0.1, seed=1)[0].astype(np.float64)
    damped = shell_spectrum(y)[1] * k**2
    assert damped[20] / energy[20] == pytest.approx(np.exp(-3.0), rel=0.35)
    assert damped[3] / energy[3] == pytest.approx(np.exp(-(0.3**2) + 0.15**2), rel=0.05)


def test_advected_scalar_has_sharper_fronts_than_a_gaussian_field():
    """Mixing stretches blobs into filaments: heavy-tailed gradients (kurtosis well above a Gaussian field's 3)."""
    s = advected_scalar(n=1, size=32, steps=8, seed=2)[0]
    g = power_law_field(n=1, size=32, seed=2)[0]

    def gradient_kurtosis(v):
        d = np.diff(v, axis=2).ravel().astype(np.float64)
        d = d - d.mean()
        return float(np.mean(d**4) / np.mean(d**2) ** 2)

    assert gradient_kurtosis(s) > gradient_kurtosis(g) + 1.0
    assert np.abs(s).max() <= 1.0 + 1e-5  # tanh-bounded blobs stay bounded under advection and diffusion
    t = torch.from_numpy(s)
    assert float(t.std()) > 0.1
