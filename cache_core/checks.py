"""Checks against real computation that can refuse a skip the skip rule allows (one class each).

A check is built for a run from the node's choice (``build_check``) and asked by the run cache:

- ``HindsightCheck``: every computed call measures what the estimator would have returned for it
  (``RunCache._measure``: free, the call computed anyway); an entry skips only while that last
  measured error, scaled to the gap the skip bridges, is within the tolerance.
- ``FirstBlockCheck``: a call the rule would skip first runs the head block for real and compares
  its residual with the estimator's forecast of it (``RunCache.after_head``); the skip goes ahead
  only where they agree within the tolerance, else the call computes, continuing from the head
  block's output, so nothing runs twice. Costs one block per checked call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar


class Check:
    """Refuses skips whose error, measured against real computation, exceeds ``tolerance``."""

    name: ClassVar[str]
    # The head block runs before the call is decided (and its residuals are kept per entry).
    runs_head_first: ClassVar[bool] = False
    # Computed calls measure the estimator's error for it.
    measures_error: ClassVar[bool] = False

    def __init__(self, tolerance: float) -> None:
        self.tolerance = tolerance


class HindsightCheck(Check):
    name = "hindsight"
    measures_error = True

    def allows(self, measured: float | None, measured_gap: float, gap: float, error_order: int) -> bool:
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

    def allows(self, head_errors: Sequence[float]) -> bool:
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
