"""The estimator interface: what a skipped call returns in place of the block stack's residual.

An estimator sees, per conditioning entry, the residuals (stack output minus stack input) of the
last computed calls and where they sit in model time, and the model time of the skipped call;
steps are not evenly spaced, so every formula works in model time, never in step counts.

Every estimator here is linear in the kept residuals: it returns one weight per residual, and
the run cache forms sum(w_i r_i) (cache_core/history.py). Two things follow from that:

- the hot path is shared and the same for every estimator (one weighted sum, fp32 accumulation
  for half-precision residuals); adding an estimator never touches it;
- a skip rule can tell what an estimator gets wrong without any tensor: applied to a model of the
  residual's path (MagCache's calibrated magnitude and angle curves, TeaCache's accumulated
  change), the same weights give the estimator's error (policies.py).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from ..moments import ResidualMoments


@dataclass(frozen=True)
class EstimatorSpec:
    """What a node chose (tensor-free, deep-copied with the model): the estimator and its knobs."""

    name: str = "reuse"
    order: int = 1  # forecast only
    damping: float = 0.5  # damped_forecast only
    # optimal_linear only: a calibration's residual moments (set from the connected calibration).
    moments: ResidualMoments | None = field(default=None, repr=False, compare=False)

    def build(self) -> Estimator:
        from . import build  # the registry (estimators/__init__.py)

        return build(self)


class Estimator(ABC):
    """Weights on the kept residuals of one entry. Stateless: one instance serves a whole run.

    Registered in ``estimators.ESTIMATORS`` by ``name``; the nodes offer, and the fuzz and the
    benchmark sweep, what the registry lists (``examples``)."""

    name: ClassVar[str]
    # Settings the fuzz and the benchmark's estimator sweep try (at least the default).
    examples: ClassVar[tuple[EstimatorSpec, ...]] = ()

    @classmethod
    def from_spec(cls, spec: EstimatorSpec) -> Estimator:
        """The estimator a node's choice describes."""
        return cls()

    @property
    def planned_model(self) -> int | None:
        """Which of a calibration's error models the planned rule charges this estimator with:
        reuse's (0), a first-order forecast's (1), or None where it has none."""
        return None

    @property
    def error_model(self) -> object | None:
        """An error model of its own for the planned rule (planning.plan_skips: ``order`` and
        ``error(target, anchors)``), used before the calibration's fitted ones; None: none."""
        return None

    @property
    @abstractmethod
    def residuals_kept(self) -> int:
        """How many residuals per entry it needs kept (its order + 1); the cache keeps no more."""

    @abstractmethod
    def weights(self, times: Sequence[float], target: float) -> tuple[float, ...]:
        """Weights on the kept residuals at ``times`` (oldest first, strictly increasing, at
        least one; fewer than ``residuals_kept`` early in a run) for the residual at ``target``."""

    @property
    def error_order(self) -> int:
        """How the error grows with the gap it bridges: as gap^error_order for a smooth path."""
        return 1

    @property
    def is_reuse(self) -> bool:
        """True when the estimate is always the last residual itself (weights (1.0,))."""
        return False

    def describe(self) -> str:
        return self.name


def lagrange_weights(times: Sequence[float], target: float) -> tuple[float, ...]:
    """The polynomial through (times[i], r_i), evaluated at ``target``, as weights on the r_i.

    With two points this is the first-order forecast r1 + (r1 - r0) (t - t1) / (t1 - t0); with
    three the second-order one. The times are distinct by construction (computed calls sit at
    distinct sigmas).
    """
    out = []
    for i, ti in enumerate(times):
        weight = 1.0
        for j, tj in enumerate(times):
            if j != i:
                weight *= (target - tj) / (ti - tj)
        out.append(weight)
    return tuple(out)
