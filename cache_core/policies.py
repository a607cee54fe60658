"""Skip/compute decisions of TeaCache and MagCache.

A policy is built for one sampling run (it precomputes per-step tables from the run's schedule)
and keeps its accumulators in an ``EntryState`` per conditioning entry: each CFG branch, and each
area or mask conditioning batched beside it, decides from its own history. Decisions are taken
once per step and entry, in plain Python floats; the only tensor work is the TeaCache signal,
which the caller reduces to one float per entry.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field

from .ratios import MagRatios
from .schedule import RunSchedule


@dataclass
class EntryState:
    """Decision state of one conditioning entry over one run."""

    branch: int  # 0 = cond, 1 = uncond (ComfyUI's cond_or_uncond)
    decided_step: int = -1
    skip: bool = False  # the outcome for ``decided_step``
    consecutive_skips: int = 0
    steps_computed: int = 0
    steps_skipped: int = 0
    # One character per decided step: "C" computed, "S" skipped (for the log, UI and tests).
    outcomes: list[str] = field(default_factory=list)
    # TeaCache: rescaled relative change accumulated since the last computed step.
    accumulated: float = 0.0
    # MagCache: product of magnitude ratios, angle turned and accumulated error since the last
    # computed step.
    ratio: float = 1.0
    angle: float = 0.0
    error: float = 0.0


class CachePolicy(ABC):
    """Decides, per step and conditioning entry, whether the block stack may be skipped."""

    name: str = ""

    def __init__(self, schedule: RunSchedule) -> None:
        self.schedule = schedule

    @property
    @abstractmethod
    def can_skip(self) -> bool:
        """False when the settings can never skip (threshold 0): the run then does no cache work."""

    def needs_signal(self, step: int) -> bool:
        """Whether ``wants_skip`` for this step uses the TeaCache input-change signal (the run cache
        evaluates the signal only then)."""
        return False

    @abstractmethod
    def wants_skip(self, entry: EntryState, step: int, signal: float | None) -> bool:
        """Update the entry's accumulators for this step; True if it may reuse the cached residual."""

    def record(self, entry: EntryState, step: int, skipped: bool) -> None:
        """The outcome of the step for this entry (a batch computes if any entry in it must)."""
        entry.decided_step = step
        entry.skip = skipped
        entry.outcomes.append("S" if skipped else "C")
        if skipped:
            entry.consecutive_skips += 1
            entry.steps_skipped += 1
        else:
            entry.consecutive_skips = 0
            entry.steps_computed += 1
            entry.accumulated = 0.0
            entry.ratio = 1.0
            entry.angle = 0.0
            entry.error = 0.0


def evaluate_polynomial(coefficients: Sequence[float], x: float) -> float:
    """numpy.poly1d order: highest power first."""
    value = 0.0
    for coefficient in coefficients:
        value = value * x + coefficient
    return value


class TeaCachePolicy(CachePolicy):
    """TeaCache (Liu et al., "Timestep Embedding Tells: It's Time to Cache", ali-vilab/TeaCache).

    Each step adds poly(x) to an accumulator, x being the relative L1 change of the first block's
    modulated input since the previous step; while the accumulator stays under the threshold the
    step reuses the cached residual, and crossing it computes and resets. The run's first and last
    steps always compute, as in the reference scripts; steps outside [start, end) (progress) and
    the ``max_consecutive_skips``-th skip in a row compute too.
    """

    name = "TeaCache"

    def __init__(
        self,
        schedule: RunSchedule,
        threshold: float,
        coefficients: Sequence[float] | None,
        start: float = 0.0,
        end: float = 1.0,
        max_consecutive_skips: int = 3,
    ) -> None:
        super().__init__(schedule)
        self.threshold = threshold
        # None: the raw signal (no published rescaling for this model).
        self.coefficients = tuple(coefficients) if coefficients is not None else None
        self.max_consecutive_skips = max_consecutive_skips
        last = schedule.steps - 1
        self.active = tuple(
            0 < step < last and start <= schedule.progress[step] < end for step in range(schedule.steps)
        )

    @property
    def can_skip(self) -> bool:
        return self.threshold > 0.0 and self.max_consecutive_skips > 0 and any(self.active)

    def needs_signal(self, step: int) -> bool:
        # The signal of an inactive step still becomes the next step's reference.
        return True

    def rescale(self, signal: float) -> float:
        if self.coefficients is None:
            return signal
        return evaluate_polynomial(self.coefficients, signal)

    def wants_skip(self, entry: EntryState, step: int, signal: float | None) -> bool:
        if not self.active[step] or signal is None:
            return False
        entry.accumulated += self.rescale(signal)
        return entry.accumulated < self.threshold and entry.consecutive_skips < self.max_consecutive_skips


class MagCachePolicy(CachePolicy):
    """MagCache (Ma et al., "Magnitude-aware Cache", Zehong-Ma/MagCache).

    While skipping, the expected residual magnitude drifts by the calibrated ratio gamma of each
    step: ratio *= gamma, error += |1 - ratio|. A step is skipped while the error stays within the
    threshold and at most K steps in a row are skipped. The first ``retention_ratio`` of the
    denoising always computes: a step is retained when its midpoint lies there, which for a full
    evenly spaced run is the first round(retention_ratio * steps) steps, as in the paper's code.

    With ratios calibrated by this pack, the residual's measured turn per step is used too: after
    turning through an angle a, the cached residual is off by the relative distance
    sqrt((1 - ratio)^2 + 2 ratio (1 - cos a)), which is |1 - ratio| when the direction holds (as
    published tables assume), and that is what the error accumulates. Magnitude alone misses how
    much a residual's direction moves; on the project's reference model it was the larger part.
    """

    name = "MagCache"

    def __init__(
        self,
        schedule: RunSchedule,
        ratios: MagRatios,
        threshold: float,
        max_consecutive_skips: int,
        retention_ratio: float,
    ) -> None:
        super().__init__(schedule)
        self.threshold = threshold
        self.max_consecutive_skips = max_consecutive_skips
        self.gammas = tuple(ratios.per_step(schedule, branch) for branch in range(ratios.branch_count))
        self.angles = (
            tuple(ratios.angles_per_step(schedule, branch) for branch in range(ratios.branch_count))
            if ratios.has_angles else None
        )
        self.retained = tuple(
            schedule.step_midpoint(step) <= retention_ratio + 1e-9 for step in range(schedule.steps)
        )

    @property
    def can_skip(self) -> bool:
        return self.threshold > 0.0 and self.max_consecutive_skips > 0 and not all(self.retained)

    def wants_skip(self, entry: EntryState, step: int, signal: float | None) -> bool:
        if self.retained[step]:
            return False
        branch = min(entry.branch, len(self.gammas) - 1)
        entry.ratio *= self.gammas[branch][step]
        if self.angles is None:
            entry.error += abs(1.0 - entry.ratio)
        else:
            entry.angle += self.angles[branch][step]
            ratio = entry.ratio
            entry.error += math.sqrt((1.0 - ratio) ** 2 + 2.0 * ratio * (1.0 - math.cos(entry.angle)))
        return entry.error <= self.threshold and entry.consecutive_skips < self.max_consecutive_skips


class NeverSkipPolicy(CachePolicy):
    """Computes every step (calibration runs), measuring the TeaCache signal when asked."""

    name = "measure"

    def __init__(self, schedule: RunSchedule, measure_signal: bool = False, name: str | None = None) -> None:
        super().__init__(schedule)
        self.measure_signal = measure_signal
        if name is not None:  # a cache method that cannot skip this run (its statistics say which)
            self.name = name

    @property
    def can_skip(self) -> bool:
        return False

    def needs_signal(self, step: int) -> bool:
        return self.measure_signal

    def wants_skip(self, entry: EntryState, step: int, signal: float | None) -> bool:
        return False
