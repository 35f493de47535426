"""slstr_cloud stand-in: 6 reflectances in 0-1 and 3 brightness temperatures in K (~220-310, cold
cloud tops) with NaN outside the swath, and the cloud mask `bayes` {0, 1}.
"""

from __future__ import annotations

import numpy as np

from dctdata.datasets.base import (
    SyntheticDataset,
    as_shape,
    check_rng,
    fractal_noise,
    grid,
)

SLSTR_CHANNELS = (
    "S1 0.55um",
    "S2 0.66um",
    "S3 0.87um",
    "S4 1.375um",
    "S5 1.61um",
    "S6 2.25um",
    "S7 3.7um",
    "S8 10.8um",
    "S9 12um",
)


# slstr_cloud ---------------------------------------------------------------------------------------
def cloud_field(
    rng: np.random.Generator,
    size: int | tuple[int, int] = 256,
    nan_border: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """A Sentinel-3 SLSTR-like daytime scene: (image float32 (9, H, W), cloud mask uint8 (H, W)).

    Channels S1-S6 are reflectances in [0, 1] (ocean dark, land bright in the near infrared, cloud
    bright in the visible and darker in the SWIR; S4 at 1.375 um sees only high cloud); S7-S9 are
    brightness temperatures in K (surface 285-310 K, cloud tops 220-265 K; S7 at 3.7 um adds reflected
    sunlight over cloud). Cloud optical depth is 1/f^2 fractal noise above a coverage threshold;
    the mask is optical depth above 0.3. With `nan_border`, one side beyond a slanted swath edge is NaN
    in every channel and 0 in the mask.
    """
    rng = check_rng(rng)
    h, w = as_shape("size", size, minimum=8)
    land_n, cloud_n, top_n, surf_n = fractal_noise(rng, (h, w), beta=3.2, count=4)
    cloud_n = 0.7 * cloud_n + 0.3 * fractal_noise(rng, (h, w), beta=2.0)[0]  # rough edges on smooth decks
    land = land_n > np.quantile(land_n, 1.0 - rng.uniform(0.0, 0.6))
    coverage = rng.uniform(0.15, 0.65)
    thr = float(np.quantile(cloud_n, 1.0 - coverage))
    tau = np.clip(cloud_n - thr, 0.0, None) * rng.uniform(6.0, 15.0)  # optical depth
    alpha = 1.0 - np.exp(-tau)  # cloud opacity
    high = np.clip(0.5 + 0.35 * top_n, 0.0, 1.0)  # 0 low cloud, 1 high cloud
    # Reflectances: surface mix, then cloud on top, then illumination across the swath.
    ocean_r = np.array([0.06, 0.04, 0.02, 0.004, 0.01, 0.005], np.float32)
    land_r = np.array([0.08, 0.10, 0.30, 0.01, 0.25, 0.15], np.float32)
    cloud_r = np.array([0.75, 0.73, 0.70, 0.0, 0.45, 0.28], np.float32)
    veg = np.clip(0.5 + 0.25 * surf_n, 0.1, 1.0)
    surf = np.where(land[None], land_r[:, None, None] * (0.6 + 0.6 * veg[None]), ocean_r[:, None, None])
    cr = cloud_r[:, None, None] * (0.8 + 0.2 * np.clip(tau / 5.0, 0.0, 1.0))[None]
    cr[3] = 0.35 * high * np.clip(tau / 3.0, 0.0, 1.0)  # 1.375 um: water vapour hides all but high cloud
    refl = (1.0 - alpha[None]) * surf + alpha[None] * cr
    y, x = grid((h, w))
    refl *= (0.85 + 0.15 * np.cos(rng.uniform(-0.6, 0.6) + 1.2 * (x / w - 0.5)))[None]
    refl += np.float32(0.004) * rng.standard_normal(refl.shape, dtype=np.float32)
    refl = np.clip(refl, 0.0, 1.0)
    # Brightness temperatures.
    t_ocean = rng.uniform(285.0, 298.0)
    t_surf = np.where(land, t_ocean + rng.uniform(2.0, 10.0) + 3.0 * surf_n, t_ocean + 0.8 * surf_n)
    t_top = 265.0 - 45.0 * high + 2.0 * top_n
    bt11 = (1.0 - alpha) * t_surf + alpha * t_top
    bt12 = bt11 - (0.8 + 1.5 * alpha * high)
    bt37 = bt11 + 12.0 * alpha * (1.0 - 0.5 * high) + 1.0
    bts = np.stack([bt37, bt11, bt12]) + np.float32(0.1) * rng.standard_normal((3, h, w), dtype=np.float32)
    image = np.concatenate([refl, bts]).astype(np.float32, copy=False)
    mask = (tau > 0.3).astype(np.uint8)
    if nan_border:
        # A slanted swath edge entering from the left or right, 4-20 % of the width.
        frac = rng.uniform(0.04, 0.2)
        slope = rng.uniform(-0.15, 0.15)
        edge = w * frac + slope * (y - h / 2.0)
        outside = x < edge if rng.random() < 0.5 else (w - 1 - x) < edge
        outside = np.broadcast_to(outside, (h, w))
        image[:, outside] = np.nan
        mask[outside] = 0
    return image, mask


class SLSTRCloud(SyntheticDataset):
    """slstr_cloud-like scenes: `refs` (6, H, W), `bts` (3, H, W) float32 with NaN borders, `bayes` uint8 (1, H, W)."""

    kind = "slstr_cloud"
    fields = {"refs": "dct", "bts": "dct", "bayes": "array"}

    def __init__(self, n: int = 16, size: int | tuple[int, int] = 256, seed: int = 0, nan_border: bool = True) -> None:
        super().__init__(n, seed)
        self.size = as_shape("size", size)
        if not isinstance(nan_border, bool):
            raise TypeError(f"nan_border: expected a bool. Got {nan_border!r}")
        self.nan_border = nan_border

    def sample(self, rng, index):
        image, mask = cloud_field(rng, self.size, nan_border=self.nan_border)
        return {"refs": image[:6], "bts": image[6:], "bayes": mask[None]}

    def _params(self):
        return {"size": self.size, "nan_border": self.nan_border}


def slstr_cloud(n: int = 16, size: int | tuple[int, int] = 256, seed: int = 0, nan_border: bool = True) -> SLSTRCloud:
    """`dctdata pack dctdata.datasets:slstr_cloud OUT --nan mask --field bayes=array`."""
    return SLSTRCloud(n=n, size=size, seed=seed, nan_border=nan_border)
