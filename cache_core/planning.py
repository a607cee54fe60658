"""Planned skipping: the computed steps of a run chosen up front, against measured errors.

A calibration run sees every step's residual, so it can measure what an estimator would get
wrong at step t from the computed steps before it, directly, for gaps of several steps
(``SkipError``). The error is measured on what the sampler uses, the CFG-combined residual
cfg * cond - (cfg - 1) * uncond: errors of the two branches partly cancel there, and the
guidance scale amplifies the rest.

Those measurements are summarised as an error model over model time (``ErrorModel``): the
relative error of skipping step t with gap ``forward`` (progress from the last computed step to
t) and, for a forecast, ``back`` (progress between its two anchors) is

    error = kappa(progress_t) * forward ** alpha * back ** beta

with kappa a curve over progress and alpha, beta fitted once per model (least squares in logs).
Because it is a curve in progress, a calibration at one step count serves any other.

At the start of a run, ``plan_skips`` finds by dynamic programming the fewest computed steps whose
skipped steps sum to at most the error budget (the threshold), with at most K skipped in a row and
the retained head computed. Decisions then cost one table lookup per step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .estimators import Estimator
from .policies import CachePolicy, EntryState
from .schedule import RunSchedule

# Gaps measured by a calibration: skipped steps up to this far past the last computed one, with
# the forecast's anchors one or two steps apart.
MEASURED_FORWARD = 4
MEASURED_BACK = 2
# Planning cost grows with K; longer runs of skips are not planned.
MAX_PLANNED_SKIPS = 8


@dataclass(frozen=True)
class SkipError:
    """What skipping ``step`` would have cost in one calibration run: the relative L2 error of the
    CFG-combined residual, ``order`` 0 (reuse of step - forward) or 1 (the line through
    step - forward - back and step - forward)."""

    step: int
    order: int
    forward: int
    back: int
    error: float


@dataclass(frozen=True)
class ErrorModel:
    """error = kappa(progress) * forward ** alpha * back ** beta (forward, back in progress)."""

    order: int
    positions: tuple[float, ...]  # progress of the calibrated steps that have a kappa
    log_kappa: tuple[float, ...]
    alpha: float
    beta: float

    @classmethod
    def fit(cls, errors: Sequence[SkipError], progress: Sequence[float], order: int) -> ErrorModel | None:
        """Least squares in logs, one kappa per measured step; None with too few measurements."""
        rows = [e for e in errors if e.order == order and e.error > 0.0 and math.isfinite(e.error)]
        steps = sorted({e.step for e in rows})
        if len(steps) < 2 or len({(e.forward, e.back) for e in rows}) < 2:
            return None
        column = {step: i for i, step in enumerate(steps)}
        slopes = 2 if order else 1
        design = np.zeros((len(rows), len(steps) + slopes))
        target = np.empty(len(rows))
        for i, e in enumerate(rows):
            forward = progress[e.step] - progress[e.step - e.forward]
            design[i, column[e.step]] = 1.0
            design[i, len(steps)] = math.log(forward)
            if order:
                back = progress[e.step - e.forward] - progress[e.step - e.forward - e.back]
                design[i, len(steps) + 1] = math.log(back)
            target[i] = math.log(e.error)
        solution = np.linalg.lstsq(design, target, rcond=None)[0]
        beta = float(solution[len(steps) + 1]) if order else 0.0
        return cls(order, tuple(float(progress[s]) for s in steps), tuple(float(v) for v in solution[:len(steps)]),
                   float(solution[len(steps)]), beta)

    def kappa(self, progress: float) -> float:
        """Interpolated linearly in log between calibrated steps, held flat past either end."""
        return math.exp(float(np.interp(progress, self.positions, self.log_kappa)))

    def error(self, target: float, anchors: Sequence[float]) -> float:
        """Relative error of skipping the step at progress ``target`` from computed steps at
        ``anchors`` (oldest first); with fewer anchors than the order needs, the lower order's."""
        forward = max(target - anchors[-1], 1e-9)
        value = self.kappa(target) * forward ** self.alpha
        if self.order and len(anchors) > 1:
            value *= max(anchors[-1] - anchors[-2], 1e-9) ** self.beta
        return value


def plan_skips(times: Sequence[float], model: ErrorModel, budget: float, max_consecutive: int,
               retained: Sequence[bool]) -> tuple[bool, ...]:
    """Which steps to skip: the fewest computed steps whose skipped steps' errors (``model``, on the
    run's step ``times``) sum to at most ``budget``; step 0 and retained steps always compute.

    State: the last (order + 1) computed steps. For each state and number of computed steps the
    least total error is kept; the answer is the smallest count that fits the budget."""
    steps = len(times)
    if steps == 0:
        return ()
    k = min(max_consecutive, MAX_PLANNED_SKIPS)
    keep = model.order + 1
    # best[(state, computed)] = (error, previous key); state = tuple of computed steps, newest last
    start = ((0,), 1)
    best: dict[tuple[tuple[int, ...], int], tuple[float, tuple | None]] = {start: (0.0, None)}
    frontier = {start}
    finals: list[tuple[int, float, tuple]] = []
    for _ in range(steps):  # each round computes one more step
        following: set = set()
        for key in sorted(frontier):
            state, computed = key
            error_so_far = best[key][0]
            last = state[-1]
            anchors = [times[s] for s in state]
            gap_error = 0.0
            for next_step in range(last + 1, min(last + k + 2, steps + 1)):
                if next_step == steps:  # the run ends with skipped steps
                    finals.append((computed, error_so_far + gap_error, key))
                    break
                candidate = ((*state, next_step)[-keep:], computed + 1)
                total = error_so_far + gap_error
                if total <= budget and (candidate not in best or total < best[candidate][0]):
                    best[candidate] = (total, key)
                    following.add(candidate)
                if retained[next_step]:
                    break  # it cannot be skipped, so no later step can be the next computed one
                gap_error += model.error(times[next_step], anchors)
                if gap_error + error_so_far > budget:
                    break
        frontier = following
        if not frontier:
            break
    fitting = [f for f in finals if f[1] <= budget]
    *_, key = min(fitting, key=lambda f: (f[0], f[1]))
    computed_steps = set()
    while key is not None:
        computed_steps.add(key[0][-1])
        key = best[key][1]
    return tuple(step not in computed_steps for step in range(steps))


class PlannedPolicy(CachePolicy):
    """Skips the steps ``plan_skips`` chose for this run, for every conditioning entry alike (the
    errors were measured on the CFG-combined residual, so the branches skip together)."""

    name = "MagCache (planned)"

    def __init__(self, schedule: RunSchedule, model: ErrorModel, budget: float, max_consecutive_skips: int,
                 retention_ratio: float, estimator: Estimator | None = None) -> None:
        super().__init__(schedule, estimator)
        self.budget = budget
        retained = [schedule.step_midpoint(step) <= retention_ratio + 1e-9 for step in range(schedule.steps)]
        self.plan = (plan_skips(self.times[:schedule.steps], model, budget, max_consecutive_skips, retained)
                     if budget > 0.0 else (False,) * schedule.steps)
        if budget > 0.0 and not any(self.plan):
            self.never_skips_because = (f"an error budget of {budget:g} allows no skip in this run's "
                                        f"{schedule.steps} steps (raise the threshold)")

    @property
    def can_skip(self) -> bool:
        return any(self.plan)

    def wants_skip(self, entry: EntryState, step: int, signal: float | None) -> bool:
        return self.plan[step] and bool(entry.computed_steps)


def model_order(estimator: Estimator) -> int | None:
    """The error model that plans for an estimator (``Estimator.planned_model``)."""
    return estimator.planned_model


__all__ = ["MAX_PLANNED_SKIPS", "MEASURED_BACK", "MEASURED_FORWARD", "ErrorModel", "PlannedPolicy", "SkipError",
           "model_order", "plan_skips"]
