"""What one sampling run computed and skipped."""

from __future__ import annotations

from dataclasses import dataclass, field

BRANCH_NAMES = {0: "cond", 1: "uncond"}


def branch_name(branch: int) -> str:
    """What reports call a CFG branch (ComfyUI's cond_or_uncond index)."""
    return BRANCH_NAMES.get(branch, f"branch {branch}")


@dataclass(frozen=True)
class BranchStats:
    """Steps of one CFG branch (summed over its conditioning entries, e.g. several area conds)."""

    branch: str
    entries: int
    steps_computed: int
    steps_skipped: int
    # Per step of the branch's entry with the most steps (its first, but for context windows that
    # moved): "C" computed, "S" skipped.
    pattern: str = ""

    @property
    def steps(self) -> int:
        return self.steps_computed + self.steps_skipped


@dataclass(frozen=True)
class RunStats:
    """Outcome of one sampling run: per-branch steps, and block-stack work.

    Work is counted in block-stack *rows*: batch rows times calls, what an accelerator pays (a call
    of cond and uncond batched is 2 rows per image). With the first-block check, a skipped row
    whose head block ran costs ``head_cost`` of a row (the head block's share of the stack)."""

    method: str
    steps: int
    branches: tuple[BranchStats, ...] = ()
    calls_computed: int = 0
    calls_skipped: int = 0
    rows_computed: int = 0
    rows_skipped: int = 0
    rows_checked: int = 0
    head_cost: float = 0.0
    check: str | None = None
    refused: int = 0  # decisions to skip that the check turned into computing
    estimator: str = "reuse"
    disabled_reason: str | None = None
    # Which constants the decisions used and where they came from, e.g. "published FLUX.1-dev
    # ratios (Zehong-Ma/MagCache)" or "none: unscaled signal"; None for measuring runs.
    constants: str | None = None
    feedback_corrections: int = 0  # computed calls that took earlier skips' error back out
    trace: tuple[dict, ...] = field(default=(), repr=False)

    @property
    def stack_speedup(self) -> float:
        """Block-stack evaluations (model calls) without the cache divided by those with it."""
        total = self.calls_computed + self.calls_skipped
        return total / self.calls_computed if self.calls_computed else 1.0

    @property
    def row_speedup(self) -> float:
        """Block-stack rows without the cache divided by the rows computed, counting the head
        blocks run by the first-block check at their share of a row."""
        total = self.rows_computed + self.rows_skipped
        work = self.rows_computed + self.rows_checked * self.head_cost
        return total / work if work else 1.0

    def summary(self) -> str:
        method = self.method if self.estimator == "reuse" else f"{self.method} + {self.estimator}"
        if self.constants:
            method += f" ({self.constants})"
        if self.disabled_reason:
            return f"{method}: skipping off for this run ({self.disabled_reason}); {self.steps} steps computed"
        parts = [
            f"{b.branch}: skipped {b.steps_skipped}/{b.steps} steps"
            + (f" ({b.entries} entries)" if b.entries > 1 else "")
            for b in self.branches
        ]
        calls = self.calls_computed + self.calls_skipped
        rows = self.rows_computed + self.rows_skipped
        checked = (f", {self.rows_checked} checked by the first block (+{self.head_cost:.2g} row each)"
                   if self.rows_checked else "")
        if self.check:
            checked += f", {self.refused} skips refused by the {self.check.replace('_', '-')} check"
        if self.feedback_corrections:
            checked += f", skips' error fed back at {self.feedback_corrections} calls"
        return (
            f"{method}: " + ", ".join(parts or ["no model calls"])
            + f"; block stack ran {self.calls_computed}/{calls} calls, {self.rows_computed}/{rows} rows{checked}"
            + f" ({self.row_speedup:.2f}x)"
        )

    def as_dict(self) -> dict:
        """JSON-ready, for the UI and the API (/history)."""
        extra = {"trace": list(self.trace)} if self.trace else {}
        return extra | {
            "method": self.method,
            "estimator": self.estimator,
            "steps": self.steps,
            "branches": [
                {"branch": b.branch, "entries": b.entries, "steps_computed": b.steps_computed,
                 "steps_skipped": b.steps_skipped, "pattern": b.pattern}
                for b in self.branches
            ],
            "calls_computed": self.calls_computed,
            "calls_skipped": self.calls_skipped,
            "rows_computed": self.rows_computed,
            "rows_skipped": self.rows_skipped,
            "rows_checked": self.rows_checked,
            "head_cost": round(self.head_cost, 6),
            "check": self.check,
            "refused": self.refused,
            "feedback_corrections": self.feedback_corrections,
            "stack_speedup": round(self.stack_speedup, 4),
            "row_speedup": round(self.row_speedup, 4),
            "disabled_reason": self.disabled_reason,
            "constants": self.constants,
            "summary": self.summary(),
        }
