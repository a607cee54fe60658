"""Does a generated image look like its class? A small, transparent class probe for demo images.

Hand-made features that ignore position and colour (the things the data randomises within a
class) and see geometry: an edge-orientation histogram (from the colour structure tensor), the
share of edge pixels, and the area, compactness and solidity of the foreground (everything that
differs from the background colour, estimated from the border). A softmax regression on these,
fitted to freshly drawn training data, scores each sample; ``accuracy`` is the share of samples
whose most likely class is the one they were generated for.

Pure noise, blur or a wrong shape lands in the wrong class or spreads its probability, so the
probe separates a model that learned the data from one that did not. It reads images in
ComfyUI's IMAGE layout ([N, H, W, 3] in [0, 1]).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from . import data

ORIENTATION_BINS = 8


def _blur(x: np.ndarray) -> np.ndarray:
    """[1, 2, 1] / 4 binomial blur over H and W (edge-replicated)."""
    for axis in (1, 2):
        pad = [(0, 0)] * x.ndim
        pad[axis] = (1, 1)
        p = np.pad(x, pad, mode="edge")
        n = x.shape[axis]
        x = (np.take(p, range(0, n), axis) + 2 * np.take(p, range(1, n + 1), axis)
             + np.take(p, range(2, n + 2), axis)) / 4
    return x


def features(images: np.ndarray | torch.Tensor) -> np.ndarray:
    """[N, H, W, 3] -> [N, F] float64 features."""
    x = images.detach().cpu().numpy() if isinstance(images, torch.Tensor) else np.asarray(images)
    x = _blur(_blur(x.astype(np.float64)))  # ragged sample edges should not read as texture
    n = x.shape[0]
    # colour structure tensor from central differences
    gx = np.zeros_like(x)
    gy = np.zeros_like(x)
    gx[:, :, 1:-1] = (x[:, :, 2:] - x[:, :, :-2]) / 2
    gy[:, 1:-1] = (x[:, 2:] - x[:, :-2]) / 2
    jxx, jyy, jxy = (gx * gx).sum(-1), (gy * gy).sum(-1), (gx * gy).sum(-1)
    energy = jxx + jyy
    angle = np.arctan2(2 * jxy, jxx - jyy)  # doubled orientation angle in (-pi, pi]
    bins = ((angle + np.pi) / (2 * np.pi) * ORIENTATION_BINS).astype(int) % ORIENTATION_BINS
    hist = np.zeros((n, ORIENTATION_BINS))
    for b in range(ORIENTATION_BINS):
        hist[:, b] = (energy * (bins == b)).reshape(n, -1).sum(1)
    total = energy.reshape(n, -1).sum(1) + 1e-8
    hist /= total[:, None]
    # coherence: how line-like the gradients are overall (stripes ~1, random ~0)
    coherence = np.hypot((jxx - jyy).reshape(n, -1).sum(1), 2 * jxy.reshape(n, -1).sum(1)) / total

    peak = energy.reshape(n, -1).max(1)[:, None, None] + 1e-8
    edge = energy > 0.2 * peak
    edge_frac = edge.reshape(n, -1).mean(1)

    # foreground: pixels far from the border's median colour
    border = np.concatenate([x[:, 0], x[:, -1], x[:, :, 0], x[:, :, -1]], axis=1)  # N, 4W, 3
    bg = np.median(border, axis=1)
    dist = np.linalg.norm(x - bg[:, None, None], axis=-1)
    fg = dist > 0.5 * (dist.reshape(n, -1).max(1)[:, None, None] + 1e-8)
    area = fg.reshape(n, -1).mean(1)
    compact = edge.reshape(n, -1).sum(1) / np.sqrt(fg.reshape(n, -1).sum(1) + 1.0)
    # solidity: foreground share of its bounding box
    solidity = np.zeros(n)
    for i in range(n):
        ys, xs = np.nonzero(fg[i])
        if len(ys):
            box = (ys.max() - ys.min() + 1) * (xs.max() - xs.min() + 1)
            solidity[i] = len(ys) / box
    # residual noise: how far pixels are from piecewise-smooth (a 3x3 median would remove it)
    lap = np.abs(4 * x[:, 1:-1, 1:-1] - x[:, :-2, 1:-1] - x[:, 2:, 1:-1] - x[:, 1:-1, :-2] - x[:, 1:-1, 2:])
    roughness = lap.mean((1, 2, 3)) / (np.sqrt(total / x[0, ..., 0].size) + 1e-3)
    return np.column_stack([hist, coherence, edge_frac, area, compact, solidity, roughness])


@dataclass
class Probe:
    kind: str
    mean: np.ndarray
    std: np.ndarray
    weight: torch.Tensor  # [F, C]
    bias: torch.Tensor  # [C]

    def probabilities(self, images: np.ndarray | torch.Tensor) -> np.ndarray:
        f = torch.from_numpy((features(images) - self.mean) / self.std).float()
        return torch.softmax(f @ self.weight + self.bias, -1).numpy()

    def predict(self, images: np.ndarray | torch.Tensor) -> np.ndarray:
        return self.probabilities(images).argmax(-1)

    def accuracy(self, images: np.ndarray | torch.Tensor, labels: np.ndarray | list[int]) -> float:
        return float((self.predict(images) == np.asarray(labels)).mean())


def fit(per_class: int = 120, seed: int = 777, l2: float = 1e-3, wobble: float = 1.0) -> Probe:
    """Softmax regression on the features of ``per_class`` fresh images of each image class,
    half of them with roughened edges (``wobble`` pixels) so imperfect samples still read as
    their class."""
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(len(data.IMAGE_CLASSES)), per_class)
    images = np.stack([data.render_image(int(k), rng, wobble * (i % 2)) for i, k in enumerate(labels)])
    f = features(images)
    mean, std = f.mean(0), f.std(0) + 1e-6
    x = torch.from_numpy((f - mean) / std).float()
    y = torch.from_numpy(labels).long()
    n_classes = len(data.IMAGE_CLASSES)
    weight = torch.zeros(x.shape[1], n_classes, requires_grad=True)
    bias = torch.zeros(n_classes, requires_grad=True)
    opt = torch.optim.LBFGS([weight, bias], lr=1.0, max_iter=300, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(x @ weight + bias, y) + l2 * (weight**2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    return Probe("image", mean, std, weight.detach(), bias.detach())
