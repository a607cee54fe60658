"""Estimators: what a skipped call returns, one module each (see base.py for the interface).

To add one: write ``cache_core/estimators/<name>.py`` with an ``Estimator`` subclass and register
it in ``ESTIMATORS`` below with how it is built from an ``EstimatorSpec``. Nothing else changes:
the run cache applies any estimator's weights the same way, and the skip rules apply them to
their model of the residual's path.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .base import Estimator, lagrange_weights
from .damped import DampedEstimator, damped_gain
from .forecast import MAX_ORDER, ForecastEstimator
from .reuse import ReuseEstimator


@dataclass(frozen=True)
class EstimatorSpec:
    """What a node chose (tensor-free, deep-copied with the model): the estimator and its knobs."""

    name: str = "reuse"
    order: int = 1  # forecast only
    damping: float = 0.5  # damped_forecast only

    def build(self) -> Estimator:
        try:
            factory = ESTIMATORS[self.name]
        except KeyError:
            raise ValueError(f"unknown estimator {self.name!r}; one of {', '.join(ESTIMATORS)}") from None
        return factory(self)


ESTIMATORS: dict[str, Callable[[EstimatorSpec], Estimator]] = {
    ReuseEstimator.name: lambda spec: ReuseEstimator(),
    ForecastEstimator.name: lambda spec: ForecastEstimator(spec.order),
    DampedEstimator.name: lambda spec: DampedEstimator(spec.damping),
}

__all__ = [
    "ESTIMATORS",
    "MAX_ORDER",
    "DampedEstimator",
    "Estimator",
    "EstimatorSpec",
    "ForecastEstimator",
    "ReuseEstimator",
    "damped_gain",
    "lagrange_weights",
]
