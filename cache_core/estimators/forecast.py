"""Forecast: extrapolate the stack residual in model time through the last computed calls.

Order 1 keeps two residuals and continues the straight line through them,
r(t) = r1 + (r1 - r0) (t - t1) / (t1 - t0); order 2 keeps three and continues the parabola.
Reusing is exact for a constant residual and errs by the first difference over the gap; a
first-order forecast is exact for a residual that moves at constant velocity and errs by the
second difference (the curvature of the path times the gap squared). It pays at short skip runs;
over long ones the extrapolation overshoots (see damped.py). Until enough calls have computed it
uses the points it has (one point: reuse).
"""

from __future__ import annotations

from collections.abc import Sequence

from .base import Estimator, EstimatorSpec, lagrange_weights

MAX_ORDER = 2


class ForecastEstimator(Estimator):
    name = "forecast"
    examples = tuple(EstimatorSpec("forecast", order=order) for order in range(1, MAX_ORDER + 1))

    def __init__(self, order: int = 1) -> None:
        if not 1 <= order <= MAX_ORDER:
            raise ValueError(f"forecast order must be 1 to {MAX_ORDER}, got {order}")
        self.order = order

    @classmethod
    def from_spec(cls, spec: EstimatorSpec) -> ForecastEstimator:
        return cls(spec.order)

    @property
    def planned_model(self) -> int | None:
        return 1 if self.order == 1 else None

    @property
    def residuals_kept(self) -> int:
        return self.order + 1

    @property
    def error_order(self) -> int:
        return self.order + 1

    def weights(self, times: Sequence[float], target: float) -> tuple[float, ...]:
        return lagrange_weights(times, target)

    def describe(self) -> str:
        return f"forecast (order {self.order})"
