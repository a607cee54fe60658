"""Reuse: a skipped call gets the last computed residual unchanged (TeaCache's and MagCache's own
estimate, and the pack's behaviour before estimators existed). Keeps one residual per entry."""

from __future__ import annotations

from collections.abc import Sequence

from .base import Estimator, EstimatorSpec

REUSE_WEIGHTS = (1.0,)


class ReuseEstimator(Estimator):
    name = "reuse"
    examples = (EstimatorSpec("reuse"),)

    @property
    def planned_model(self) -> int:
        return 0

    @property
    def residuals_kept(self) -> int:
        return 1

    @property
    def is_reuse(self) -> bool:
        return True

    def weights(self, times: Sequence[float], target: float) -> tuple[float, ...]:
        return REUSE_WEIGHTS
