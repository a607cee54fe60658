"""Damped forecast: a first-order forecast whose step shrinks geometrically as the gap grows.

Measure the gap in units of the last computed interval, h = (t - t1) / (t1 - t0). A first-order
forecast moves h times the last difference d = r1 - r0; the damped one moves
kappa(h) = phi + phi^2 + ... + phi^h = phi (1 - phi^h) / (1 - phi), with phi = 1 - damping (the
damped trend of exponential smoothing, continued to fractional h): close to h for a short gap, it
never goes beyond phi / (1 - phi) intervals however long the run of skipped steps, so a long run
degrades towards reuse instead of overshooting. damping 0 is the plain first-order forecast,
damping 1 is reuse. Two residuals per entry.
"""

from __future__ import annotations

from collections.abc import Sequence

from .base import Estimator, EstimatorSpec


def damped_gain(h: float, phi: float) -> float:
    """kappa(h) = sum_{j=1..h} phi^j, continued to real h >= 0."""
    if phi >= 1.0:
        return h
    if phi <= 0.0:
        return 0.0
    return phi * (1.0 - phi**h) / (1.0 - phi)


class DampedEstimator(Estimator):
    name = "damped_forecast"
    examples = (EstimatorSpec("damped_forecast", damping=0.5),)

    @classmethod
    def from_spec(cls, spec: EstimatorSpec) -> DampedEstimator:
        return cls(spec.damping)

    @property
    def planned_model(self) -> int:
        return 1  # errs less than the plain first-order forecast on long gaps

    def __init__(self, damping: float = 0.5) -> None:
        if not 0.0 <= damping <= 1.0:
            raise ValueError(f"damping must lie in [0, 1], got {damping}")
        self.damping = damping
        self.phi = 1.0 - damping

    @property
    def residuals_kept(self) -> int:
        return 2

    @property
    def error_order(self) -> int:
        return 2  # a first-order forecast over the short gaps the check allows

    def weights(self, times: Sequence[float], target: float) -> tuple[float, ...]:
        if len(times) < 2:
            return (1.0,)
        t0, t1 = times[-2], times[-1]
        gain = damped_gain(max(target - t1, 0.0) / (t1 - t0), self.phi)
        return (-gain, 1.0 + gain)

    def describe(self) -> str:
        return f"damped forecast (damping {self.damping:g})"
