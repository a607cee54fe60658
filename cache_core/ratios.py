"""MagCache magnitude ratios as a curve over model time, resampled to any run's steps.

A ratio table holds, per calibrated step k, gamma_k = mean over tokens of ||r_k|| / ||r_{k-1}||,
the change in magnitude of the block stack's residual r from one step to the next. Tables are
measured at one step count; a run may use another, or only part of the schedule.

The table is turned into a cumulative log-magnitude curve L(progress) = sum of log gamma up to
that point in model time, interpolated linearly between calibrated steps. A run step s then gets
gamma = exp(L(progress_s) - L(progress_{s-1})): at the calibrated step count this is the table
itself; with fewer steps each step spans several calibrated steps and gets their product (the
residual magnitude changes by that much between the two steps), where nearest-neighbour
resampling would understate the change; a partial schedule (denoise < 1, the second expert of a
two-stage graph) reads the part of the curve at its own noise levels.

A calibration measured by this pack also knows how much the residual's *direction* turns from step
to step (its cosine distance). Those angles form a second cumulative curve, read the same way;
published tables have none.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from .schedule import RunSchedule


@dataclass(frozen=True)
class RatioCurve:
    """Cumulative log magnitude of one CFG branch, at the progress of each calibrated step."""

    positions: tuple[float, ...]
    cumulative_log: tuple[float, ...]
    # Cumulative angle (radians) the residual turned through, when measured.
    cumulative_angle: tuple[float, ...] | None = None

    @classmethod
    def from_ratios(cls, ratios: Sequence[float], positions: Sequence[float],
                    cosine_distances: Sequence[float] | None = None) -> RatioCurve:
        if len(ratios) != len(positions) or len(ratios) < 2:
            raise ValueError("a ratio curve needs one position per ratio and at least two steps")
        if any(not (math.isfinite(r) and r > 0.0) for r in ratios):
            raise ValueError("magnitude ratios must be finite and positive")
        if any(b <= a for a, b in itertools.pairwise(positions)):
            raise ValueError("ratio positions must increase")
        # Entry 0 is the padding of the first step (no previous residual).
        cumulative = list(itertools.accumulate(math.log(r) if i else 0.0 for i, r in enumerate(ratios)))
        angles = None
        if cosine_distances is not None:
            if len(cosine_distances) != len(ratios) or any(not (0.0 <= d <= 2.0) for d in cosine_distances):
                raise ValueError("cosine distances must lie in [0, 2], one per ratio")
            angles = tuple(itertools.accumulate(math.acos(1.0 - d) if i else 0.0
                                                for i, d in enumerate(cosine_distances)))
        return cls(tuple(float(p) for p in positions), tuple(cumulative), angles)

    def _interpolate(self, values: tuple[float, ...], progress: float) -> float:
        """Linear between calibrated steps and extrapolated past either end."""
        positions = self.positions
        index = bisect.bisect_right(positions, progress) - 1
        index = min(max(index, 0), len(positions) - 2)
        x0, x1 = positions[index], positions[index + 1]
        y0, y1 = values[index], values[index + 1]
        return y0 + (y1 - y0) * (progress - x0) / (x1 - x0)

    def log_magnitude(self, progress: float) -> float:
        return self._interpolate(self.cumulative_log, progress)

    def ratio_between(self, progress_from: float, progress_to: float) -> float:
        return math.exp(self.log_magnitude(progress_to) - self.log_magnitude(progress_from))

    def angle_between(self, progress_from: float, progress_to: float) -> float:
        if self.cumulative_angle is None:
            return 0.0
        turned = self._interpolate(self.cumulative_angle, progress_to) - self._interpolate(
            self.cumulative_angle, progress_from)
        return max(turned, 0.0)


@dataclass(frozen=True)
class MagRatios:
    """Magnitude-ratio curves: one shared by all branches, or one per CFG branch (cond, uncond)."""

    curves: tuple[RatioCurve, ...]
    calibrated_steps: int
    source: str = ""

    @classmethod
    def from_table(
        cls, values: Sequence[float], calibrated_steps: int, interleaved: bool, source: str = ""
    ) -> MagRatios:
        """A published table: one entry per step, or per call with cond/uncond interleaved.

        The calibration run is taken as a full, evenly spaced denoising (as in the published
        scripts), so entry k sits at progress k / calibrated_steps.
        """
        values = [float(v) for v in values]
        branches = [values[0::2], values[1::2]] if interleaved else [values]
        for branch in branches:
            if len(branch) != calibrated_steps:
                raise ValueError(
                    f"a ratio table for {calibrated_steps} steps needs {calibrated_steps} entries per branch, "
                    f"got {len(branch)}"
                )
        positions = [k / calibrated_steps for k in range(calibrated_steps)]
        curves = tuple(RatioCurve.from_ratios(branch, positions) for branch in branches)
        return cls(curves, calibrated_steps, source)

    @classmethod
    def from_measured(
        cls, per_branch: Sequence[Sequence[float]], positions: Sequence[float], source: str = "",
        cosine_distances: Sequence[Sequence[float]] | None = None,
    ) -> MagRatios:
        """Ratios (and optionally cosine distances) measured on a run whose steps sat at ``positions``."""
        distances = cosine_distances if cosine_distances is not None else [None] * len(per_branch)
        curves = tuple(
            RatioCurve.from_ratios(branch, positions, d) for branch, d in zip(per_branch, distances, strict=True)
        )
        return cls(curves, len(positions), source)

    @property
    def has_angles(self) -> bool:
        return all(curve.cumulative_angle is not None for curve in self.curves)

    @property
    def branch_count(self) -> int:
        return len(self.curves)

    def curve(self, branch: int) -> RatioCurve:
        return self.curves[min(branch, len(self.curves) - 1)]

    def per_step(self, schedule: RunSchedule, branch: int) -> tuple[float, ...]:
        """gamma for every step of ``schedule`` (1.0 for its first step, which has no predecessor)."""
        curve = self.curve(branch)
        progress = schedule.progress
        later = (curve.ratio_between(progress[step - 1], progress[step]) for step in range(1, schedule.steps))
        return (1.0, *later)

    def angles_per_step(self, schedule: RunSchedule, branch: int) -> tuple[float, ...]:
        """The angle the residual turns through in each step (0.0 without measured angles)."""
        curve = self.curve(branch)
        progress = schedule.progress
        later = (curve.angle_between(progress[step - 1], progress[step]) for step in range(1, schedule.steps))
        return (0.0, *later)
