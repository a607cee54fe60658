"""Optimal linear prediction: the least-squares weights for a calibrated model's residual path.

A calibration of this pack stores the second moments of the model's residual path in model time
(cache_core/moments.py). From them, the weights on the kept residuals that minimise the expected
squared error of the skipped step's residual follow in closed form, for any anchors and target, and
so does that error (the planned rule charges it: ``error_model``). Where the path is smooth the
weights extrapolate like a forecast; where it is rough they shrink towards reuse, on their own.

Without a calibration there is nothing to solve with: it then forecasts as the damped forecast
does, and says so in the run's log line.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..moments import MomentErrorModel, ResidualMoments
from .base import Estimator, EstimatorSpec
from .damped import DampedEstimator

# How many computed residuals the weights combine by default (the forecast order + 1).
ANCHORS = 2


class OptimalLinearEstimator(Estimator):
    name = "optimal_linear"
    examples = (EstimatorSpec("optimal_linear"),)

    @classmethod
    def from_spec(cls, spec: EstimatorSpec) -> OptimalLinearEstimator:
        return cls(spec.moments, anchors=spec.order + 1)

    def __init__(self, moments: ResidualMoments | None = None, anchors: int = ANCHORS) -> None:
        self.moments = moments
        self.anchors = anchors
        self._fallback = DampedEstimator(0.5) if moments is None else None
        if anchors < 1:
            raise ValueError(f"the optimal linear estimate needs at least one anchor, got {anchors}")
        # Solved once per (anchors, target) of a run: a few per step.
        self._solved: dict[tuple[tuple[float, ...], float], tuple[float, ...]] = {}

    @property
    def residuals_kept(self) -> int:
        return self.anchors if self.moments is not None else 2

    @property
    def error_order(self) -> int:
        return 2

    @property
    def planned_model(self) -> int:
        return 1  # a calibration without moments plans it as a first-order forecast

    @property
    def error_model(self) -> MomentErrorModel | None:
        return MomentErrorModel(self.moments, self.anchors - 1) if self.moments is not None else None

    def weights(self, times: Sequence[float], target: float) -> tuple[float, ...]:
        if self._fallback is not None:
            return self._fallback.weights(times, target)
        key = (tuple(times), target)
        weights = self._solved.get(key)
        if weights is None:
            weights = self._solved[key] = self.moments.predict(times, target)[0]
        return weights

    def describe(self) -> str:
        if self.moments is None:
            return "optimal linear (no calibration connected: damped forecast 0.5)"
        return f"optimal linear ({self.anchors} anchors, calibrated)"
