"""One settings object per caching method: what a node chose, and how a run's policy is built.

A ``MethodConfig`` is tensor-free and frozen (it is deep-copied with every clone of the model). At
the start of a sampling run it builds that run's policy, with the run's estimator, from the run's
schedule and the detected variant's published constants; it also knows what a calibration of
its method holds and how it is used. The adapter (nodes/) never asks which method it has.

Every method shares the estimator-level choices:

- ``estimator``: what a skipped call returns (cache_core/estimators);
- ``separate_branches``: CFG branches are evaluated in calls of their own when one may skip and
  another must compute (``RunCache.plan_branches``), instead of the batch computing for both;
- ``check`` and ``check_tolerance``: a check against real computation that can veto a skip:
  "first_block" or "hindsight" (cache_core/checks.py), None off.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Protocol

from .calibration import CalibrationError, fit_teacache_polynomial, teacache_fit_points
from .estimators import EstimatorSpec
from .planning import ErrorModel, PlannedPolicy, model_order
from .policies import CachePolicy, MagCachePolicy, MeasuredErrorPolicy, NeverSkipPolicy, TeaCachePolicy
from .ratios import MagRatios
from .schedule import RunSchedule

LOGGER = logging.getLogger("stepcache")


class PublishedConstants(Protocol):
    """A model variant's published constants (families.Variant)."""

    name: str
    label: str
    teacache: Any  # .values (poly1d coefficients) and .warmup, or None
    magcache: MagRatios | None

    def describe_published(self, method: str) -> str | None:
        """E.g. "published FLUX.1-dev ratios (Zehong-Ma/MagCache)"; None when there are none."""


@dataclass(frozen=True, kw_only=True)
class MethodConfig(ABC):
    estimator: EstimatorSpec = field(default_factory=EstimatorSpec)
    separate_branches: bool = False
    check: str | None = None
    check_tolerance: float = 0.1
    # Where connected constants (a calibration, a typed-in table) came from, for the statistics.
    constants_source: str | None = None
    # Take a skip's estimated error back out of the sample at the next computed call, where the
    # sampler allows it (cache_core/feedback.py).
    feedback: bool = False

    # The tag of this method's calibrations (saved files, the MAG_RATIOS / TEACACHE_COEFFICIENTS
    # sockets), its name in logs, and the node that calibrates it; None where it has none.
    calibration_method: ClassVar[str | None] = None
    display_name: ClassVar[str] = ""
    calibrate_node: ClassVar[str | None] = None
    # Calibration runs compute every step and report what they measured.
    calibrates: ClassVar[bool] = False

    @abstractmethod
    def build_policy(self, schedule: RunSchedule, constants: PublishedConstants) -> CachePolicy:
        """This run's policy (and estimator)."""

    def with_calibration(self, calibration: Any, source: str | None = None) -> MethodConfig:
        """These settings using a calibration of this model (``calibration.Calibration``), described
        in the statistics as ``source``."""
        raise CalibrationError(f"{self.display_name} takes no calibration")

    def describe_constants(self, variant: PublishedConstants, chosen: bool) -> str | None:
        """Which constants a run with ``variant``'s published ones uses, and where they came from;
        ``chosen``: the variant was named with the node's variant input. None for measuring runs."""
        return None

    def _describe(self, given: object | None, variant: PublishedConstants, chosen: bool, kind: str) -> str | None:
        if given is not None:
            return self.constants_source or f"connected {kind} input"
        published = variant.describe_published(self.calibration_method)
        if published is None:
            return None
        return published + (", chosen with the variant input" if chosen else "")

    def _estimator_for(self, calibration: Any) -> EstimatorSpec:
        """The estimator choice, given the calibration's residual moments (optimal_linear solves
        its weights from them; the others ignore them)."""
        return replace(self.estimator, moments=calibration.moments)

    @classmethod
    def fitted(cls, records: Sequence[Any]) -> dict:
        """Fields a calibration of this method computes from its measurements (see calibration.py)."""
        return {}

    @classmethod  # noqa: B027 (nothing to check by default)
    def check_calibration(cls, calibration: Any) -> None:
        """Raise CalibrationError if a calibration of this method misses what the method needs."""


@dataclass(frozen=True, kw_only=True)
class TeaCacheConfig(MethodConfig):
    threshold: float
    start_percent: float = 0.0
    end_percent: float = 1.0
    max_consecutive_skips: int = 3
    coefficients: tuple[float, ...] | None = None  # None: the variant's published polynomial

    calibration_method: ClassVar[str | None] = "teacache"
    display_name: ClassVar[str] = "TeaCache"
    calibrate_node: ClassVar[str | None] = "TeaCacheCalibrate"

    def build_policy(self, schedule: RunSchedule, constants: PublishedConstants) -> CachePolicy:
        published = constants.teacache
        coefficients = self.coefficients or (published.values if published else None)
        if coefficients is None:
            LOGGER.warning("[StepCache] TeaCache: no published coefficients fit this model (%s); it runs on the "
                           "unscaled signal. Calibrate it with TeaCacheCalibrate for better results.", constants.label)
        start = max(self.start_percent, published.warmup if published and not self.coefficients else 0.0)
        return TeaCachePolicy(schedule, self.threshold, coefficients, start, self.end_percent,
                              self.max_consecutive_skips, estimator=self.estimator.build())

    def with_calibration(self, calibration: Any, source: str | None = None) -> TeaCacheConfig:
        self.check_calibration(calibration)
        return replace(self, coefficients=calibration.coefficients, constants_source=source,
                       estimator=self._estimator_for(calibration))

    def describe_constants(self, variant: PublishedConstants, chosen: bool) -> str:
        return self._describe(self.coefficients, variant, chosen, "coefficients") or "none: unscaled signal"

    @classmethod
    def fitted(cls, records: Sequence[Any]) -> dict:
        points = teacache_fit_points(records)
        return {"coefficients": fit_teacache_polynomial(points), "fit_points": points}

    @classmethod
    def check_calibration(cls, calibration: Any) -> None:
        import math

        if calibration.coefficients is None or len(calibration.coefficients) < 2:
            raise CalibrationError("a TeaCache calibration needs its fitted coefficients")
        if not all(math.isfinite(c) for c in calibration.coefficients):
            raise CalibrationError("the TeaCache coefficients are not finite")
        if not calibration.fit_points or not all(math.isfinite(v) for p in calibration.fit_points for v in p):
            raise CalibrationError("a TeaCache calibration needs the finite points it was fitted on")


SKIP_RULES = ("magnitude", "planned", "measured")


@dataclass(frozen=True, kw_only=True)
class MagCacheConfig(MethodConfig):
    """``skip_rule`` "magnitude": the published rule (accumulated drift of the calibrated residual
    magnitude, within ``threshold``). "planned": the computed steps are chosen at the start of each
    run against this model's measured skip errors (cache_core/planning.py), ``threshold`` being the
    run's total error budget; it needs a calibration of this pack (``error_models``)."""

    threshold: float
    max_consecutive_skips: int = 2
    retention_ratio: float = 0.2
    ratios: MagRatios | None = None  # None: the variant's published table
    skip_rule: str = "magnitude"
    # The planned rule's error models from this model's calibration: (reuse, first-order forecast).
    error_models: tuple[ErrorModel | None, ErrorModel | None] | None = None

    calibration_method: ClassVar[str | None] = "magcache"
    display_name: ClassVar[str] = "MagCache"
    calibrate_node: ClassVar[str | None] = "MagCacheCalibrate"

    def build_policy(self, schedule: RunSchedule, constants: PublishedConstants) -> CachePolicy:
        ratios = self.ratios or constants.magcache
        if self.skip_rule == "measured":
            return MeasuredErrorConfig(
                tolerance=self.threshold, max_consecutive_skips=self.max_consecutive_skips,
                retention_ratio=self.retention_ratio, estimator=self.estimator,
            ).build_policy(schedule, constants)
        if self.skip_rule == "planned":
            estimator = self.estimator.build()
            order = model_order(estimator)
            model = estimator.error_model or (
                self.error_models[order] if self.error_models and order is not None else None)
            if model is None:
                return NeverSkipPolicy(schedule, name=PlannedPolicy.name, reason=(
                    "the planned rule needs skip errors measured by MagCacheCalibrate on this model"))
            return PlannedPolicy(schedule, model, self.threshold, self.max_consecutive_skips, self.retention_ratio,
                                 estimator=estimator)
        if ratios is None:
            return NeverSkipPolicy(schedule, name=MagCachePolicy.name, reason=(
                f"no MagCache ratios for this model ({constants.label}); calibrate it with MagCacheCalibrate"))
        return MagCachePolicy(schedule, ratios, self.threshold, self.max_consecutive_skips, self.retention_ratio,
                              estimator=self.estimator.build())

    def with_calibration(self, calibration: Any, source: str | None = None) -> MagCacheConfig:
        self.check_calibration(calibration)
        models = (calibration.error_model(0), calibration.error_model(1))
        return replace(self, ratios=calibration.mag_ratios(), constants_source=source,
                       error_models=models if any(models) else None, estimator=self._estimator_for(calibration))

    def describe_constants(self, variant: PublishedConstants, chosen: bool) -> str:
        return self._describe(self.ratios, variant, chosen, "ratios") or "none"


@dataclass(frozen=True, kw_only=True)
class MeasuredErrorConfig(MethodConfig):
    """Skipping controlled by the run's own measured error (``MeasuredErrorPolicy``): no table, no
    calibration, so it serves every family. What the quality levels run (cache_core/quality.py)."""

    tolerance: float
    max_consecutive_skips: int = 3
    retention_ratio: float = 0.2
    growth: float = 1.0  # prior exponent of the error's growth with the gap (fitted up to 2)
    guided: bool = True  # measure on the guided residual (both CFG branches decide together)
    # Measuring per branch: charge each branch at least this share of the guided residual's error.
    guided_error_weight: float = 0.0
    # The CFG scale the tolerance was chosen at: higher scales tighten it (MeasuredErrorPolicy).
    guidance_reference: float | None = None
    guidance_power: float = 1.0  # ... by the factor (reference / cfg) ** guidance_power
    # The error model follows the largest rate of this many latest measurements (MeasuredErrorPolicy).
    rate_memory: int = 1
    # ... only while the errors fall by more than this factor (the transient); 0: always.
    transient_fall: float = 0.0
    # The tolerance of a run whose sampler allows no skip feedback (``feedback`` set); None: ``tolerance``.
    tolerance_without_feedback: float | None = None
    # The tolerance times this where the model is cached in output space (MeasuredErrorPolicy).
    output_space_factor: float = 1.0
    level: str | None = None  # the quality level these settings are, for the statistics

    display_name: ClassVar[str] = "measured error"

    def build_policy(self, schedule: RunSchedule, constants: PublishedConstants) -> CachePolicy:
        return MeasuredErrorPolicy(schedule, self.tolerance, self.max_consecutive_skips, self.retention_ratio,
                                   estimator=self.estimator.build(), guided=self.guided,
                                   prior_growth=self.growth, growth_range=(self.growth, 2.0),
                                   guidance_reference=self.guidance_reference,
                                   guided_error_weight=self.guided_error_weight, rate_memory=self.rate_memory,
                                   guidance_power=self.guidance_power, transient_fall=self.transient_fall,
                                   tolerance_without_feedback=self.tolerance_without_feedback,
                                   output_space_factor=self.output_space_factor)

    def describe_constants(self, variant: PublishedConstants, chosen: bool) -> str:
        where = f"quality {self.level}: " if self.level else ""
        return where + "none needed (the run measures its own error)"


@dataclass(frozen=True, kw_only=True)
class CalibrationRunConfig(MethodConfig):
    """A calibration run: computes every step and shows it to the run's recorder."""

    record_signal: bool = True
    calibrates: ClassVar[bool] = True
    display_name: ClassVar[str] = "calibration"

    def build_policy(self, schedule: RunSchedule, constants: PublishedConstants) -> CachePolicy:
        return NeverSkipPolicy(schedule, record_signal=self.record_signal)


# Calibration tag -> the method it calibrates.
CALIBRATED_METHODS: dict[str, type[MethodConfig]] = {
    config.calibration_method: config for config in (MagCacheConfig, TeaCacheConfig)
}

__all__ = [
    "CALIBRATED_METHODS",
    "SKIP_RULES",
    "CalibrationError",
    "CalibrationRunConfig",
    "MagCacheConfig",
    "MeasuredErrorConfig",
    "MethodConfig",
    "PublishedConstants",
    "TeaCacheConfig",
]
