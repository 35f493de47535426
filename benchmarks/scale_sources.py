"""Cheap, deterministic `module:callable` sources for the scale benchmarks (no disk for the source).

    PYTHONPATH=benchmarks dctdata pack scale_sources:fields_1gb OUT ...   # what `python -m benchmarks scale` runs

Each sample is a smooth random field plus noise, float32 (1, 256, 256) = 256 KiB, a pure function of
its index (so any process/Dask worker generates the same bytes). Generation costs ~1 ms per sample,
so pack timings measure the pack, not the generator.
"""

from __future__ import annotations

import numpy as np
import torch.utils.data

SIZE = 256
SAMPLE_BYTES = SIZE * SIZE * 4


class Fields(torch.utils.data.Dataset):
    def __init__(self, n: int, size: int = SIZE, seed: int = 0) -> None:
        self.n, self.size, self.seed = int(n), int(size), int(seed)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        if not 0 <= i < self.n:
            raise IndexError(i)
        rng = np.random.default_rng([self.seed, i])
        y = np.linspace(0, 2 * np.pi, self.size, dtype=np.float32)
        ky, kx, py, px = rng.uniform(0.5, 4.0, 4).astype(np.float32)
        smooth = np.sin(ky * y + py)[:, None] * np.cos(kx * y + px)[None, :]
        noise = rng.standard_normal((self.size, self.size), dtype=np.float32)
        return {"image": (smooth + np.float32(0.05) * noise)[None], "label": np.int64(i % 10)}


def fields(n: int = 256) -> Fields:
    return Fields(n)


def fields_256mb() -> Fields:
    return Fields((256 << 20) // SAMPLE_BYTES)


def fields_1gb() -> Fields:
    return Fields((1 << 30) // SAMPLE_BYTES)


def fields_8gb() -> Fields:
    return Fields((8 << 30) // SAMPLE_BYTES)
