"""A small U-Net (two poolings) shared by the em_denoise and slstr_cloud examples."""

from __future__ import annotations

import torch
from torch import nn


def _conv(cin: int, cout: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, padding=1),
        nn.BatchNorm2d(cout),
        nn.ReLU(inplace=True),
        nn.Conv2d(cout, cout, 3, padding=1),
        nn.BatchNorm2d(cout),
        nn.ReLU(inplace=True),
    )


class UNet(nn.Module):
    """in -> [w] -> pool -> [2w] -> pool -> [4w] -> up -> [2w] -> up -> [w] -> 1x1 -> out.
    Input height and width must be multiples of 4."""

    def __init__(self, cin: int, cout: int, width: int = 16) -> None:
        super().__init__()
        w = width
        self.e1, self.e2, self.mid = _conv(cin, w), _conv(w, 2 * w), _conv(2 * w, 4 * w)
        self.u2, self.d2 = nn.ConvTranspose2d(4 * w, 2 * w, 2, 2), _conv(4 * w, 2 * w)
        self.u1, self.d1 = nn.ConvTranspose2d(2 * w, w, 2, 2), _conv(2 * w, w)
        self.head = nn.Conv2d(w, cout, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.e1(x)
        b = self.e2(nn.functional.max_pool2d(a, 2))
        c = self.mid(nn.functional.max_pool2d(b, 2))
        b = self.d2(torch.cat([self.u2(c), b], 1))
        return self.head(self.d1(torch.cat([self.u1(b), a], 1)))
