"""Quality against the uncached output: PSNR and SSIM on decoded images (or videos) in [0, 1]."""

from __future__ import annotations

import math
import statistics

import torch


def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    """PSNR in dB (inf when identical) of two images [H, W, 3] (or videos [T, H, W, 3]) in [0, 1]."""
    mse = float(((a.double() - b.double()) ** 2).mean())
    return math.inf if mse == 0.0 else 10.0 * math.log10(1.0 / mse)


def _gaussian_window(size: int = 11, sigma: float = 1.5) -> torch.Tensor:
    x = torch.arange(size, dtype=torch.float64) - (size - 1) / 2
    g = torch.exp(-(x**2) / (2 * sigma**2))
    g = g / g.sum()
    return torch.outer(g, g)


def ssim(a: torch.Tensor, b: torch.Tensor) -> float:
    """Mean SSIM (Wang et al. 2004: 11x11 Gaussian window, sigma 1.5, K1 0.01, K2 0.03, data
    range 1), per RGB channel over the valid window positions, averaged over channels."""
    x = a.double().permute(2, 0, 1).unsqueeze(1)  # [3, 1, H, W]
    y = b.double().permute(2, 0, 1).unsqueeze(1)
    size = min(11, x.shape[-1], x.shape[-2])
    window = _gaussian_window(size).to(x).reshape(1, 1, size, size)

    def blur(t: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.conv2d(t, window)

    c1, c2 = 0.01**2, 0.03**2
    mx, my = blur(x), blur(y)
    vx = blur(x * x) - mx * mx
    vy = blur(y * y) - my * my
    cov = blur(x * y) - mx * my
    s = ((2 * mx * my + c1) * (2 * cov + c2)) / ((mx * mx + my * my + c1) * (vx + vy + c2))
    return float(s.mean())


def compare(reference: torch.Tensor, images: torch.Tensor) -> list[tuple[float, float]]:
    """(PSNR, SSIM) per image of a batch [B, H, W, 3], or per video of a batch [B, T, H, W, 3]
    (PSNR over the whole clip, SSIM the mean over its frames)."""
    if reference.ndim == 5:
        return [(psnr(r, v), statistics.fmean(ssim(rf, vf) for rf, vf in zip(r, v, strict=True)))
                for r, v in zip(reference, images, strict=True)]
    return [(psnr(r, i), ssim(r, i)) for r, i in zip(reference, images, strict=True)]


def finite_mean(values: list[float]) -> float:
    """Mean, with identical images (inf dB) counted as 100 dB so a mean stays finite."""
    return statistics.fmean(min(v, 100.0) for v in values)
