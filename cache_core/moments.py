"""Second moments of the residual path, from a calibration: optimal linear prediction in closed form.

A calibration run sees every step's residual r_i. Their inner products G_ij = <r_i, r_j> (of the
CFG-combined residual cfg * cond - (cfg - 1) * uncond, the one the sampler uses, averaged over the
batch rows, on a strided sample) give, for any set A of computed anchor steps and a skipped step t,
the least-squares weights of the best linear estimate sum_a w_a r_a of r_t, and its error:

    w = G_AA^-1 g_At,    expected squared error = G_tt - g_At . w    (relative: divided by G_tt)

Both are exact on the calibration's own run; on other prompts and seeds they hold as far as the
path's geometry does (the bet every calibrated cache makes). Reuse and the forecasts are fixed
weightings that ignore how the path really bends; these weights follow it, and shrink towards
reuse where the path is rough. Both branches get the same weights, so the guided estimate is the
optimal one of the guided residual.

The second moments determine the path up to a rotation, so they are stored as the path itself in
an orthonormal basis of its span (G = C C^T, one row of C per calibrated step), and a run at other
steps gets the path interpolated in model time (a cubic through the calibrated steps), which keeps
G a valid Gram matrix and a smooth path smooth. So a calibration at one sampler and step count
serves others.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

# Tikhonov regularisation of G_AA, relative to its diagonal: adjacent residuals correlate above
# 0.99, so the system is near singular without it.
RIDGE = 1e-9


@dataclass(frozen=True)
class ResidualMoments:
    """The residual path's second moments over model time, as the path's coordinates in an
    orthonormal basis of its span (tensor-free, saved in the calibration's JSON)."""

    progress: tuple[float, ...]  # model time of each calibrated step, increasing
    coordinates: tuple[tuple[float, ...], ...]  # one row per step: G = C C^T (scaled: max norm 1)

    @classmethod
    def from_gram(cls, progress: Sequence[float], gram: np.ndarray) -> ResidualMoments:
        gram = np.asarray(gram, dtype=np.float64)
        gram = (gram + gram.T) / (2.0 * max(float(np.max(np.diag(gram))), 1e-300))
        values, vectors = np.linalg.eigh(gram)
        kept = values > values[-1] * 1e-12  # drop the numerically null directions
        coordinates = vectors[:, kept] * np.sqrt(values[kept])
        return cls(tuple(float(p) for p in progress), tuple(tuple(float(v) for v in row) for row in coordinates))

    def validate(self) -> str | None:
        """What is wrong with these moments, or None."""
        steps = len(self.progress)
        if steps < 3 or len(self.coordinates) != steps:
            return "the residual moments must cover every step of the schedule"
        width = len(self.coordinates[0])
        if width == 0 or any(len(row) != width for row in self.coordinates):
            return "the residual coordinates must be a table with one row per step"
        values = (*self.progress, *(v for row in self.coordinates for v in row))
        if not all(math.isfinite(v) for v in values):
            return "the residual moments are not finite"
        if any(b <= a for a, b in zip(self.progress, self.progress[1:], strict=False)):
            return "the residual moments' model times must increase"
        if any(not any(row) for row in self.coordinates):
            return "a step's residual has no magnitude"
        return None

    # -- interpolated to any model time --------------------------------------------------------

    @cached_property
    def _curve(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The calibrated steps, their coordinates and the curve's tangents there (computed once)."""
        grid = np.asarray(self.progress)
        table = np.asarray(self.coordinates)
        return grid, table, np.gradient(table, grid, axis=0, edge_order=1)

    def path(self, times: Sequence[float]) -> np.ndarray:
        """The path's coordinates at ``times``: a cubic Hermite curve through the calibrated steps
        with Catmull-Rom tangents (exact at them), held flat past either end."""
        grid, table, tangents = self._curve
        t = np.clip(np.asarray(times, dtype=np.float64), grid[0], grid[-1])
        lower = np.clip(np.searchsorted(grid, t, side="right") - 1, 0, len(grid) - 2)
        width = grid[lower + 1] - grid[lower]
        u = ((t - grid[lower]) / width)[:, None]
        h00, h10 = 2 * u**3 - 3 * u**2 + 1, u**3 - 2 * u**2 + u
        h01, h11 = -2 * u**3 + 3 * u**2, u**3 - u**2
        return (h00 * table[lower] + h10 * width[:, None] * tangents[lower]
                + h01 * table[lower + 1] + h11 * width[:, None] * tangents[lower + 1])

    def gram(self, times: Sequence[float]) -> np.ndarray:
        """G between the residuals at ``times`` (up to one common scale)."""
        coordinates = self.path(times)
        return coordinates @ coordinates.T

    def predict(self, anchors: Sequence[float], target: float) -> tuple[tuple[float, ...], float]:
        """The least-squares weights on the residuals at ``anchors`` for the one at ``target``, and
        the relative L2 error they are expected to make."""
        gram = self.gram([*anchors, target])
        count = len(anchors)
        system = gram[:count, :count]
        system = system + RIDGE * np.trace(system) / count * np.eye(count)
        weights = np.linalg.solve(system, gram[:count, count])
        residual_variance = max(gram[count, count] - float(weights @ gram[:count, count]), 0.0)
        return tuple(float(w) for w in weights), math.sqrt(residual_variance / gram[count, count])


@dataclass(frozen=True)
class MomentErrorModel:
    """The planned rule's error model from a calibration's moments: the exact expected relative
    error of the optimal weights from the last ``order + 1`` computed steps (planning.plan_skips)."""

    moments: ResidualMoments
    order: int
    _errors: dict = field(default_factory=dict, compare=False, repr=False)  # the planner asks each many times

    def error(self, target: float, anchors: Sequence[float]) -> float:
        key = (target, tuple(anchors[-(self.order + 1):]))
        error = self._errors.get(key)
        if error is None:
            error = self._errors[key] = self.moments.predict(key[1], target)[1]
        return error


__all__ = ["RIDGE", "MomentErrorModel", "ResidualMoments"]
