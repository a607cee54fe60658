"""Checks against real computation that can refuse a skip the skip rule allows (one class each).

A check is built for a run from the node's choice (``build_check``) and asked by the run cache at
one of two points:

- before the call (``allows_at_decision``): ``HindsightCheck``. Every computed call measures what
  the estimator would have returned for it (cache_core/measurement.py: free, the call computed
  anyway); an entry skips only while that last measured error, scaled to the gap the skip bridges,
  is within the tolerance.
- after the head block (``allows_after_head``): ``FirstBlockCheck``. A call the rule would skip
  first runs the head block for real and compares its residual with the estimator's forecast of it
  (``head_errors``); the skip goes ahead only where they agree within the tolerance, else the call
  computes, continuing from the head block's output, so nothing runs twice. Costs one block per
  checked call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import ClassVar

import torch

from . import history as history_ops
from .history import ResidualHistory


class Check:
    """Refuses skips whose error, measured against real computation, exceeds ``tolerance``."""

    name: ClassVar[str]
    # The head block runs before the call is decided (and its residuals are kept per entry).
    runs_head_first: ClassVar[bool] = False
    # Computed calls measure the estimator's error for it.
    measures_error: ClassVar[bool] = False

    def __init__(self, tolerance: float) -> None:
        self.tolerance = tolerance

    def allows_at_decision(self, measured: float | None, measured_gap: float, gap: float, error_order: int) -> bool:
        """Before the call: may an entry skip, given its last measured error?"""
        return True


class HindsightCheck(Check):
    name = "hindsight"
    measures_error = True

    def allows_at_decision(self, measured: float | None, measured_gap: float, gap: float, error_order: int) -> bool:
        """The error a skip bridging ``gap`` would make, predicted from the one measured over
        ``measured_gap``: it grows as (gap / measured_gap)^p, p the estimator's order of error (1
        for reuse, 2 for a first-order forecast). Nothing measured yet allows the skip."""
        if measured is None:
            return True
        if gap > 0.0 and measured_gap > 0.0:
            measured *= (gap / measured_gap) ** error_order
        return measured <= self.tolerance


class FirstBlockCheck(Check):
    name = "first_block"
    runs_head_first = True

    @staticmethod
    def head_errors(heads: Sequence[ResidualHistory], residuals: Sequence[torch.Tensor], time: float,
                    weights: Callable[[Sequence[float], float], Sequence[float]]) -> list[float] | None:
        """Per entry, the relative L1 error of the estimator's forecast of its head-block residual
        (from the head residuals kept at its computed calls) against the real one; None where an
        entry has none of this shape."""
        errors = []
        for head, residual in zip(heads, residuals, strict=True):
            if not head.fits(residual):
                return None
            forecast = history_ops.weighted_sum(head.residuals(), weights(head.times, time), residual.device)
            errors.append((forecast - residual).abs().mean() / residual.abs().mean().clamp_min(1e-12))
        return torch.stack(errors).float().tolist()  # the one host sync of a check

    def allows_after_head(self, head_errors: Sequence[float]) -> bool:
        """Every entry's head-block forecast agreed with the real head block."""
        return all(error <= self.tolerance for error in head_errors)


CHECKS: dict[str, type[Check]] = {check.name: check for check in (HindsightCheck, FirstBlockCheck)}


def build_check(name: str | None, tolerance: float) -> Check | None:
    """The check a node chose (None: off)."""
    if name is None:
        return None
    try:
        return CHECKS[name](tolerance)
    except KeyError:
        raise ValueError(f"unknown check {name!r}; one of {', '.join(CHECKS)}") from None


__all__ = ["CHECKS", "Check", "FirstBlockCheck", "HindsightCheck", "build_check"]
