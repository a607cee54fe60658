"""Estimators: what a skipped call returns, one module each (see base.py for the interface).

To add one: write ``cache_core/estimators/<name>.py`` with an ``Estimator`` subclass (its weights,
``from_spec`` if it has knobs, ``examples``, ``planned_model``) and register it in ``ESTIMATORS``
below. Nothing else changes: the Apply nodes offer what the registry lists, the fuzz and the
benchmark sweep its examples, the run cache applies any estimator's weights the same way, and the
skip rules apply them to their model of the residual's path.
"""

from __future__ import annotations

from .base import Estimator, EstimatorSpec, lagrange_weights
from .damped import DampedEstimator, damped_gain
from .forecast import MAX_ORDER, ForecastEstimator
from .optimal_linear import OptimalLinearEstimator
from .reuse import ReuseEstimator

ESTIMATORS: dict[str, type[Estimator]] = {
    estimator.name: estimator
    for estimator in (ReuseEstimator, ForecastEstimator, DampedEstimator, OptimalLinearEstimator)
}


def build(spec: EstimatorSpec) -> Estimator:
    try:
        estimator = ESTIMATORS[spec.name]
    except KeyError:
        raise ValueError(f"unknown estimator {spec.name!r}; one of {', '.join(ESTIMATORS)}") from None
    return estimator.from_spec(spec)


def examples() -> list[EstimatorSpec]:
    """Every registered estimator's example settings, in registry order."""
    return [spec for estimator in ESTIMATORS.values() for spec in estimator.examples]

__all__ = [
    "ESTIMATORS",
    "MAX_ORDER",
    "DampedEstimator",
    "Estimator",
    "EstimatorSpec",
    "ForecastEstimator",
    "OptimalLinearEstimator",
    "ReuseEstimator",
    "build",
    "damped_gain",
    "examples",
    "lagrange_weights",
]
