"""Synthetic volumes with the spectra of scientific fields, for `--dims 3` packs, the 3-D bench items and the
volume example. Each generator returns float32 (N, D, H, W) samples, deterministic in its seed, periodic
(spectral synthesis on the FFT grid).

- `power_law_field`: a Gaussian random field whose power spectrum falls as |k|^-beta (beta = 11/3: the
  3-D spectrum of a passive scalar in Kolmogorov turbulence, E(k) ~ k^-5/3), with a large-scale roll-off
  so the largest mode does not swamp the rest (cosmology density boxes, porous media, cloud fields).
- `velocity_component`: one component of a solenoidal random velocity field with a von Karman energy
  spectrum, E(k) ~ k^4 / (1 + (k/k0)^2)^(17/6) exp(-(k eta)^2): a k^-5/3 inertial range between an energy
  peak and a dissipative cut-off (a DNS snapshot's u_x).
- `advected_scalar`: a scalar blob field advected by a smooth divergence-free flow (semi-Lagrangian steps)
  and diffused (exactly, in Fourier space): the filaments and fronts of mixing that a GRF lacks.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
import torch


def _box(size: int | tuple[int, int, int]) -> tuple[int, int, int]:
    """(D, H, W) of a cube side or a box."""
    d, h, w = (size,) * 3 if isinstance(size, int) else size
    return d, h, w


def _wavenumbers(size: tuple[int, int, int]) -> torch.Tensor:
    """|k| on the FFT grid of a (D, H, W) box, in cycles per box (float64)."""
    d, h, w = size
    kd, kh, kw = (torch.fft.fftfreq(n, 1.0 / n, dtype=torch.float64) for n in (d, h, w))
    return (kd[:, None, None] ** 2 + kh[None, :, None] ** 2 + kw[None, None, :] ** 2).sqrt()


def _filtered_noise(gen: torch.Generator, size: tuple[int, ...], amplitude: torch.Tensor) -> torch.Tensor:
    noise = torch.randn(size, generator=gen, dtype=torch.float64)
    return torch.fft.ifftn(torch.fft.fftn(noise) * amplitude).real


def power_law_field(
    n: int = 4, size: int | tuple[int, int, int] = 48, beta: float = 11 / 3, k0: float = 2.0, seed: int = 0
) -> npt.NDArray[np.float32]:
    """(n, D, H, W) Gaussian random fields with power spectrum (|k|^2 + k0^2)^(-beta/2) (see the module doc)."""
    box = _box(size)
    gen = torch.Generator().manual_seed(seed)
    k = _wavenumbers(box)
    amp = (k**2 + k0**2) ** (-beta / 4)
    amp[0, 0, 0] = 0.0
    return np.stack([_filtered_noise(gen, box, amp).numpy() for _ in range(n)]).astype(np.float32)


def velocity_component(
    n: int = 4, size: int | tuple[int, int, int] = 48, k0: float = 3.0, eta: float = 0.05, seed: int = 1
) -> npt.NDArray[np.float32]:
    """(n, D, H, W) u_x of solenoidal random velocity fields with a von Karman spectrum (see the module doc);
    `eta` is the dissipative cut-off as a fraction of the box (k eta = 1 at k = 1 / eta cycles)."""
    box = _box(size)
    gen = torch.Generator().manual_seed(seed)
    d, h, w = box
    kd, kh, kw = (torch.fft.fftfreq(m, 1.0 / m, dtype=torch.float64) for m in (d, h, w))
    kvec = torch.stack(torch.broadcast_tensors(kd[:, None, None], kh[None, :, None], kw[None, None, :]))
    k = kvec.pow(2).sum(0).sqrt()
    energy = k**4 / (1 + (k / k0) ** 2) ** (17 / 6) * torch.exp(-((k * eta) ** 2))
    # a 3-D field with energy spectrum E(k) has |u_hat(k)|^2 ~ E(k) / (4 pi k^2)
    amp = torch.where(k > 0, (energy / (4 * math.pi * k.clamp(min=1e-12) ** 2)).sqrt(), torch.zeros_like(k))
    out = []
    for _ in range(n):
        u = torch.fft.fftn(torch.randn(3, *box, generator=gen, dtype=torch.float64), dim=(1, 2, 3)) * amp
        # project out the compressive part: u <- u - k (k . u) / |k|^2
        div = (kvec * u).sum(0) / k.clamp(min=1e-12) ** 2
        u = u - kvec * div
        out.append(torch.fft.ifftn(u[2], dim=(0, 1, 2)).real.numpy())  # the component along W
    return np.stack(out).astype(np.float32)


def advected_scalar(
    n: int = 4, size: int | tuple[int, int, int] = 48, steps: int = 12, dissipation: float = 10.0, seed: int = 2
) -> npt.NDArray[np.float32]:
    """(n, D, H, W) scalars mixed by a smooth flow: smooth blobs, `steps` semi-Lagrangian advection steps by
    the curl of a random large-scale vector potential (divergence-free), each followed by exact diffusion
    (over all steps, wavenumber `dissipation` (cycles per box) decays by 1/e)."""
    box = _box(size)
    gen = torch.Generator().manual_seed(seed)
    k = _wavenumbers(box)
    out = []
    for _ in range(n):
        c = _filtered_noise(gen, box, torch.exp(-((k / 2.5) ** 2)))
        c = torch.tanh(3 * c / c.std()).float()  # sharp-edged blobs: the fronts a mixing scalar has
        potential = torch.stack([_filtered_noise(gen, box, torch.exp(-((k / 2.0) ** 2))) for _ in range(3)])
        vel = _curl(potential)
        vel = (vel / vel.abs().max() * 1.5).float()  # at most 1.5 voxels per step
        decay = torch.exp(-((k / dissipation) ** 2) / steps)
        for _ in range(steps):
            c = _advect(c, vel)
            c = torch.fft.ifftn(torch.fft.fftn(c.double()) * decay).real.float()
        out.append(c.numpy())
    return np.stack(out).astype(np.float32)


def _curl(a: torch.Tensor) -> torch.Tensor:
    """Curl of a (3, D, H, W) periodic vector field (components along D, H, W), by central differences."""

    def diff(f: torch.Tensor, axis: int) -> torch.Tensor:
        return (torch.roll(f, -1, axis) - torch.roll(f, 1, axis)) / 2

    ad, ah, aw = a
    return torch.stack([diff(aw, 1) - diff(ah, 2), diff(ad, 2) - diff(aw, 0), diff(ah, 0) - diff(ad, 1)])


def _advect(c: torch.Tensor, vel: torch.Tensor) -> torch.Tensor:
    """One semi-Lagrangian step: c(x) <- c(x - v(x)), trilinear and periodic (eight gathers: they ran faster
    than grid_sample in 3-D on the CPU; docs/benchmarks/design.md)."""
    size = c.shape
    grids = torch.meshgrid(*(torch.arange(m, dtype=c.dtype) for m in size), indexing="ij")
    dep = [torch.remainder(g - v, m) for g, v, m in zip(grids, vel, size)]
    lo = [p.floor().long() for p in dep]
    frac = [p - i for p, i in zip(dep, lo)]
    flat = c.reshape(-1)
    out = torch.zeros_like(c)
    for corner in range(8):
        idx: torch.Tensor | int = 0
        weight: torch.Tensor | float = 1.0
        for axis, m in enumerate(size):
            up = (corner >> (2 - axis)) & 1
            i = torch.remainder(lo[axis] + up, m)
            idx = idx * m + i
            weight = weight * (frac[axis] if up else 1 - frac[axis])
        out += weight * flat[idx]
    return out
