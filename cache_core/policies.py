"""Skip/compute decisions: TeaCache, MagCache, and the measuring policy of calibration runs.

A policy is built for one sampling run (it precomputes per-step tables from the run's schedule)
together with the run's estimator, and keeps the decision state of each conditioning entry (each
CFG branch, and each area or mask conditioning batched beside it) in its own state object, which
it creates and resets. Decisions are taken once per step and entry, in plain Python floats; the
only tensor work is the TeaCache signal, which the caller reduces to one float per entry.

**The error follows the estimator.** Both rules estimate what skipping costs from a model of the
residual's path between computed steps: MagCache from its calibrated magnitude (and, when
measured, angle) curve, TeaCache from its accumulated, rescaled input change. Reusing the last
residual errs by how far the path moved since the last computed step (the first difference);
a forecast errs by how far it left the forecast's curve (for a first-order forecast, the second
difference). So a rule applies the estimator's own weights to its path model,
error = |z(t) - sum_i w_i z(t_i)| (relative to the last computed |z|), which for reuse is
exactly the published rule. What the path model cannot see (a residual that turns where its
calibration measured none) is what the first-block check of run_cache.py measures instead.
"""

from __future__ import annotations

import cmath
import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field

from .estimators import Estimator, ReuseEstimator
from .ratios import MagRatios
from .schedule import RunSchedule


@dataclass
class EntryState:
    """Decision state of one conditioning entry over one run; each policy extends it."""

    branch: int  # 0 = cond, 1 = uncond (ComfyUI's cond_or_uncond)
    decided_step: int = -1
    skip: bool = False  # the outcome for ``decided_step``
    consecutive_skips: int = 0
    steps_computed: int = 0
    steps_skipped: int = 0
    # One character per decided step: "C" computed, "S" skipped (for the log, UI and tests).
    outcomes: list[str] = field(default_factory=list)
    # A decision asked for ahead of the model call (separate CFG branches), kept for the call.
    wanted_step: int = -1
    want: bool = False
    # The last computed steps (as many as the estimator keeps residuals), oldest first.
    computed_steps: list[int] = field(default_factory=list)

    def clear_accumulated(self) -> None:
        """Called at each computed step: what the policy accumulated since the last one starts over."""

    def trace(self) -> dict:
        return {}


class CachePolicy(ABC):
    """Decides, per step and conditioning entry, whether the block stack may be skipped."""

    name: str = ""
    state_type: type[EntryState] = EntryState
    # The decision needs the TeaCache signal of the call itself (so it cannot be taken ahead).
    uses_signal: bool = False
    # The decision needs the estimator's error measured at each computed step (``observe``).
    measures_error: bool = False
    # ... and measures it on the guided residual when a call holds both CFG branches.
    measures_guided: bool = False
    # Measuring per branch, each branch's error is charged at least this share of the guided
    # residual's error (0: its own alone). See MeasuredErrorPolicy.
    guided_error_weight: float = 0.0

    def __init__(self, schedule: RunSchedule, estimator: Estimator | None = None) -> None:
        self.schedule = schedule
        self.estimator = estimator or ReuseEstimator()
        self.times = schedule.step_times
        self.never_skips_because: str | None = None  # set by policies that cannot skip at all
        self.guidance_note: str | None = None  # how the run's CFG scale changed the settings, if it did
        self.feedback_note: str | None = None  # how a run without skip feedback changed them, if it did
        self.space_note: str | None = None  # how caching in output space changed them, if it did

    @property
    @abstractmethod
    def can_skip(self) -> bool:
        """False when the settings can never skip (threshold 0): the run then does no cache work."""

    def new_state(self, branch: int) -> EntryState:
        return self.state_type(branch=branch)

    def use_guidance_scale(self, cfg: float | None) -> None:
        """The run's CFG scale (None where the guider has none), told once before the first step;
        a policy whose tolerance depends on it adapts here."""
        return None  # the published rules' thresholds hold at any scale

    def use_feedback(self, active: bool) -> None:
        """Whether the run's skip feedback runs (cache_core/feedback.py), told once before the first
        step; a policy whose tolerance counts on it adapts here."""
        return None

    def use_output_space(self) -> None:
        """The model is cached in output space (the whole model call is the stack), told once before the
        first step; a policy whose tolerance was chosen in the block stack's space adapts here."""
        return None

    def decide(self, entry: EntryState, step: int, signal: float | None) -> bool:
        """``wants_skip`` once per step: a decision taken ahead of the call is not taken twice."""
        if entry.wanted_step != step:
            entry.want = self.wants_skip(entry, step, signal)
            entry.wanted_step = step
        return entry.want

    @abstractmethod
    def wants_skip(self, entry: EntryState, step: int, signal: float | None) -> bool:
        """Update the entry's accumulators for this step; True if it may skip the block stack."""

    def record(self, entry: EntryState, step: int, skipped: bool) -> None:
        """The outcome of the step for this entry (a batch computes if any entry in it must)."""
        entry.decided_step = step
        entry.skip = skipped
        entry.outcomes.append("S" if skipped else "C")
        if skipped:
            entry.consecutive_skips += 1
            entry.steps_skipped += 1
            return
        entry.consecutive_skips = 0
        entry.steps_computed += 1
        entry.clear_accumulated()
        computed = entry.computed_steps
        if computed and computed[-1] == step:
            return
        computed.append(step)
        if len(computed) > self.estimator.residuals_kept:
            del computed[0]
        self.computed(entry, step)

    def computed(self, entry: EntryState, step: int) -> None:  # noqa: B027 (an optional hook)
        """Hook for policies that remember something of each computed step."""

    def observe(self, entry: EntryState, gap: float, error: float) -> None:  # noqa: B027 (optional)
        """The estimator's relative error measured at the entry's last computed step, which lay
        ``gap`` (model time) past its anchors; only policies that ``measures_error`` get it."""

    def estimate_weights(self, entry: EntryState, step: int) -> tuple[float, ...]:
        """The estimator's weights for skipping ``step``, on the entry's last computed steps."""
        times = self.times
        return self.estimator.weights([times[s] for s in entry.computed_steps], times[step])


def evaluate_polynomial(coefficients: Sequence[float], x: float) -> float:
    """numpy.poly1d order: highest power first."""
    value = 0.0
    for coefficient in coefficients:
        value = value * x + coefficient
    return value


@dataclass
class TeaCacheState(EntryState):
    # Rescaled relative change accumulated since the last computed step (what reuse gets wrong).
    accumulated: float = 0.0
    # The path: rescaled change accumulated over the whole run, now and at the computed steps.
    path: float = 0.0
    path_at_computed: list[float] = field(default_factory=list)

    def clear_accumulated(self) -> None:
        self.accumulated = 0.0

    def trace(self) -> dict:
        return {"accumulated": self.accumulated, "path": self.path}


class TeaCachePolicy(CachePolicy):
    """TeaCache (Liu et al., "Timestep Embedding Tells: It's Time to Cache", ali-vilab/TeaCache).

    Each step adds poly(x) to an accumulator, x being the relative L1 change of the first block's
    modulated input since the previous step; while the accumulator stays under the threshold the
    step reuses the cached residual, and crossing it computes and resets. The run's first and last
    steps always compute, as in the reference scripts; steps outside [start, end) (progress) and
    the ``max_consecutive_skips``-th skip in a row compute too.

    With a forecast, the accumulated changes are a path D(t) (how far the residual moved, in
    TeaCache's rescaled units, taken as one direction: a scalar signal has no other) and the error
    is |D(t) - sum_i w_i D(t_i)| over the estimator's weights w_i; for reuse that is the
    accumulator itself.
    """

    name = "TeaCache"
    state_type = TeaCacheState
    uses_signal = True

    def __init__(
        self,
        schedule: RunSchedule,
        threshold: float,
        coefficients: Sequence[float] | None,
        start: float = 0.0,
        end: float = 1.0,
        max_consecutive_skips: int = 3,
        estimator: Estimator | None = None,
    ) -> None:
        super().__init__(schedule, estimator)
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

    def rescale(self, signal: float) -> float:
        if self.coefficients is None:
            return signal
        return evaluate_polynomial(self.coefficients, signal)

    def wants_skip(self, entry: TeaCacheState, step: int, signal: float | None) -> bool:
        if signal is None:
            return False
        change = self.rescale(signal)
        entry.path += change
        if not self.active[step]:
            return False
        entry.accumulated += change
        if self.estimator.is_reuse:
            error = entry.accumulated
        else:
            weights = self.estimate_weights(entry, step)
            past = entry.path_at_computed[len(entry.path_at_computed) - len(weights):]
            error = abs(entry.path - sum(w * d for w, d in zip(weights, past, strict=True)))
        return error < self.threshold and entry.consecutive_skips < self.max_consecutive_skips

    def computed(self, entry: TeaCacheState, step: int) -> None:
        entry.path_at_computed.append(entry.path)
        if len(entry.path_at_computed) > self.estimator.residuals_kept:
            del entry.path_at_computed[0]


@dataclass
class MagCacheState(EntryState):
    # Product of magnitude ratios, angle turned and accumulated error since the last computed step.
    ratio: float = 1.0
    angle: float = 0.0
    error: float = 0.0

    def clear_accumulated(self) -> None:
        self.ratio = 1.0
        self.angle = 0.0
        self.error = 0.0

    def trace(self) -> dict:
        return {"error": self.error}


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

    That distance is |z(t) - z(t1)| / |z(t1)| for the residual's path in the plane,
    z(t) = m(t) e^(i a(t)) (calibrated magnitude m, accumulated angle a). With a forecast, each
    skipped step adds |z(t) - sum_i w_i z(t_i)| / |z(t_last)| instead: the estimator's own error on
    the calibrated path.
    """

    name = "MagCache"
    state_type = MagCacheState

    def __init__(
        self,
        schedule: RunSchedule,
        ratios: MagRatios,
        threshold: float,
        max_consecutive_skips: int,
        retention_ratio: float,
        estimator: Estimator | None = None,
    ) -> None:
        super().__init__(schedule, estimator)
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
        self.paths = tuple(self._path(branch) for branch in range(len(self.gammas)))

    def _path(self, branch: int) -> tuple[complex, ...]:
        """z at every step of the run: cumulative log magnitude and angle, as one complex number."""
        log_magnitude = angle = 0.0
        path = []
        for step, gamma in enumerate(self.gammas[branch]):
            if step:
                log_magnitude += math.log(gamma)
                angle += self.angles[branch][step] if self.angles is not None else 0.0
            path.append(cmath.rect(math.exp(log_magnitude), angle))
        return tuple(path)

    @property
    def can_skip(self) -> bool:
        return self.threshold > 0.0 and self.max_consecutive_skips > 0 and not all(self.retained)

    def wants_skip(self, entry: MagCacheState, step: int, signal: float | None) -> bool:
        if self.retained[step]:
            return False
        branch = min(entry.branch, len(self.gammas) - 1)
        if self.estimator.is_reuse or not entry.computed_steps:
            entry.ratio *= self.gammas[branch][step]
            if self.angles is None:
                entry.error += abs(1.0 - entry.ratio)
            else:
                entry.angle += self.angles[branch][step]
                ratio = entry.ratio
                entry.error += math.sqrt((1.0 - ratio) ** 2 + 2.0 * ratio * (1.0 - math.cos(entry.angle)))
        else:
            path = self.paths[branch]
            weights = self.estimate_weights(entry, step)
            anchors = entry.computed_steps[len(entry.computed_steps) - len(weights):]
            forecast = sum(w * path[s] for w, s in zip(weights, anchors, strict=True))
            entry.error += abs(path[step] - forecast) / abs(path[anchors[-1]])
        return entry.error <= self.threshold and entry.consecutive_skips < self.max_consecutive_skips


@dataclass
class MeasuredState(EntryState):
    # The run's own error model for this entry, error = rate * gap ** growth (gap in model time
    # from the last computed step), from the estimator errors measured at its computed steps.
    rate: float | None = None
    growth: float = 1.0
    # The latest measurements' (gap, error), oldest first: as many as the rule's rate follows.
    recent: list[tuple[float, float]] = field(default_factory=list)

    def trace(self) -> dict:
        return {"rate": self.rate, "growth": self.growth, "error": self.recent[-1][1] if self.recent else 0.0}


class MeasuredErrorPolicy(CachePolicy):
    """Skipping controlled by the run's measured error, with no table (adaptive step-size control).

    Every computed step measures what the estimator would have returned there, so the error a skip
    makes is known, free, at each computed step: the relative L1 error of the residual the sampler
    uses (the CFG-combined one when the call holds both branches; see ``RunCache``). From those
    measurements the run fits its own model error = rate * gap ** growth (``observe``), and a step
    is skipped while the predicted error of skipping it stays within ``tolerance``, at most
    ``max_consecutive_skips`` in a row, after the retained head. A measurement over the tolerance
    raises the rate at once, so the next run of skips is shorter; the rate falls back only as
    measurements come in lower.

    ``growth`` starts at ``prior_growth`` and follows the measurements once two of them bridge
    different gaps (clamped, so one noisy pair cannot promise long skips).

    ``rate_memory``: the rate is the largest that fits one of the latest ``rate_memory`` measurements, so
    after a transient (the errors early in a run fall fast) the rule skips only once that many
    measurements have come in lower (docs/experiments.md section 23: on some images one early skip of
    a predicted error just within the tolerance loses 25 dB). ``transient_fall`` (0: off) limits that
    to the transient: the rate follows the largest of the latest ``rate_memory`` only while one of the latest
    ``rate_memory + 1`` rates is more than ``transient_fall`` times the latest, and the latest alone
    once the errors have settled (section 25).

    ``guided_error_weight`` (per-branch measurement only): each branch's error is charged as at least
    that share of the guided residual's error, a net for models where the guidance scale amplifies the
    branches' errors more than it did on the models the tolerance was chosen on (docs/experiments.md
    section 21).

    ``guidance_reference``: the CFG scale the tolerance was chosen at. A run at a higher scale gets
    the tolerance times (reference / cfg) ** ``guidance_power``, since the sampler's
    cfg * cond - (cfg - 1) * uncond carries each branch's error amplified by up to cfg (docs/experiments.md
    section 19); a lower scale keeps it. With ``rate_memory`` 2 the rule is cautious enough that a milder
    power holds at cfg 7, where 1 nearly stops skipping (the levels use 0.75; 0.5 missed once; section 24).

    ``tolerance_without_feedback``: the tolerance of a run whose skip feedback does not run (``use_feedback``),
    scaled by the guidance scale as ``tolerance`` is; None keeps ``tolerance``. A skip's error that is not fed
    back stays in the sample, and multistep samplers carry it on into later steps (section 31).

    ``output_space_factor``: where the model is cached in output space (``use_output_space``), the
    tolerance times this. The relative error of output minus input can read lower there, for the same
    damage to the image, than the block stack's residual's does (section 33).
    """

    name = "measured error"
    state_type = MeasuredState
    measures_error = True

    def __init__(
        self,
        schedule: RunSchedule,
        tolerance: float,
        max_consecutive_skips: int,
        retention_ratio: float,
        estimator: Estimator | None = None,
        prior_growth: float = 1.0,
        growth_range: tuple[float, float] = (1.0, 2.0),
        guided: bool = True,
        guidance_reference: float | None = None,
        guided_error_weight: float = 0.0,
        rate_memory: int = 1,
        guidance_power: float = 1.0,
        transient_fall: float = 0.0,
        tolerance_without_feedback: float | None = None,
        output_space_factor: float = 1.0,
    ) -> None:
        super().__init__(schedule, estimator)
        self.output_space_factor = output_space_factor
        self.tolerance = tolerance
        self.tolerance_without_feedback = tolerance_without_feedback
        self.chosen_tolerance = tolerance  # before the run's guidance scale or feedback scaled it
        self.guided_error_weight = 0.0 if guided else guided_error_weight
        self.guidance_reference = guidance_reference
        self.guidance_power = guidance_power
        self.rate_memory = max(1, rate_memory)
        self.transient_fall = max(0.0, transient_fall)
        # Measure on the guided residual where the call holds both CFG branches (else per entry).
        self.measures_guided = guided
        self.max_consecutive_skips = max_consecutive_skips
        self.prior_growth = prior_growth
        self.growth_range = growth_range
        self.retained = tuple(
            schedule.step_midpoint(step) <= retention_ratio + 1e-9 for step in range(schedule.steps)
        )
        self.last_step = schedule.steps - 1

    @property
    def can_skip(self) -> bool:
        return self.tolerance > 0.0 and self.max_consecutive_skips > 0 and not all(self.retained)

    def new_state(self, branch: int) -> MeasuredState:
        return MeasuredState(branch=branch, growth=self.prior_growth)

    def use_guidance_scale(self, cfg: float | None) -> None:
        reference = self.guidance_reference
        if reference is not None and cfg is not None and cfg > reference:
            factor = (reference / cfg) ** self.guidance_power
            self.tolerance *= factor
            self.guidance_note = f"tolerance x{factor:.2f} at cfg {cfg:g}"

    def use_feedback(self, active: bool) -> None:
        without = self.tolerance_without_feedback
        if active or without is None or self.chosen_tolerance <= 0.0 or without == self.chosen_tolerance:
            return
        factor = without / self.chosen_tolerance
        self.tolerance *= factor
        self.feedback_note = f"tolerance x{factor:.2f} without it"

    def use_output_space(self) -> None:
        if self.output_space_factor == 1.0:
            return
        self.tolerance *= self.output_space_factor
        self.space_note = f"tolerance x{self.output_space_factor:.2f} in output space"

    def observe(self, entry: MeasuredState, gap: float, error: float) -> None:
        """A measurement: skipping the step just computed, ``gap`` past its anchors, would have
        erred by ``error``."""
        if not (gap > 0.0 and math.isfinite(error)):
            return
        low, high = self.growth_range
        if entry.recent and entry.recent[-1][1] > 0.0 and error > 0.0:
            last_gap, last_error = entry.recent[-1]
            ratio = gap / last_gap
            if ratio > 1.25 or ratio < 0.8:
                fitted = math.log(error / last_error) / math.log(ratio)
                entry.growth = min(high, max(low, 0.5 * (entry.growth + fitted)))
        entry.recent.append((gap, error))
        del entry.recent[:-(self.rate_memory + 1)]  # one more than the memory tells a transient from a settled run
        rates = [measured / measured_gap**entry.growth for measured_gap, measured in entry.recent]
        if self.transient_fall and max(rates) <= self.transient_fall * rates[-1]:
            entry.rate = rates[-1]  # settled: the latest measurement alone
        else:
            entry.rate = max(rates[-self.rate_memory:])

    def wants_skip(self, entry: MeasuredState, step: int, signal: float | None) -> bool:
        if self.retained[step] or step >= self.last_step or entry.rate is None or not entry.computed_steps:
            return False
        if entry.consecutive_skips >= self.max_consecutive_skips:
            return False
        gap = self.times[step] - self.times[entry.computed_steps[-1]]
        return entry.rate * gap**entry.growth <= self.tolerance


class NeverSkipPolicy(CachePolicy):
    """Computes every step: calibration runs (recording the TeaCache signal when asked), and runs
    whose method has nothing to skip with (``never_skips_because`` says why)."""

    name = "calibration"

    def __init__(self, schedule: RunSchedule, record_signal: bool = False, reason: str | None = None,
                 name: str | None = None) -> None:
        super().__init__(schedule)
        self.uses_signal = record_signal
        self.never_skips_because = reason
        if name is not None:  # a cache method that cannot skip this run (its statistics say which)
            self.name = name

    @property
    def can_skip(self) -> bool:
        return False

    def wants_skip(self, entry: EntryState, step: int, signal: float | None) -> bool:
        return False
