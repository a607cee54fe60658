"""What one sampling run computed and skipped."""

from __future__ import annotations

from dataclasses import dataclass, field

BRANCH_NAMES = {0: "cond", 1: "uncond"}


@dataclass(frozen=True)
class BranchStats:
    """Steps of one CFG branch (summed over its conditioning entries, e.g. several area conds)."""

    branch: str
    entries: int
    steps_computed: int
    steps_skipped: int
    # Per step of the branch's first entry: "C" computed, "S" skipped.
    pattern: str = ""

    @property
    def steps(self) -> int:
        return self.steps_computed + self.steps_skipped


@dataclass(frozen=True)
class RunStats:
    """Outcome of one sampling run: per-branch steps, and block-stack evaluations (model calls)."""

    method: str
    steps: int
    branches: tuple[BranchStats, ...] = ()
    calls_computed: int = 0
    calls_skipped: int = 0
    disabled_reason: str | None = None
    # Which constants the decisions used and where they came from, e.g. "published FLUX.1-dev
    # ratios (Zehong-Ma/MagCache)" or "none: unscaled signal"; None for measuring runs.
    constants: str | None = None
    trace: tuple[dict, ...] = field(default=(), repr=False)

    @property
    def stack_speedup(self) -> float:
        """Block-stack evaluations without the cache divided by those with it."""
        total = self.calls_computed + self.calls_skipped
        return total / self.calls_computed if self.calls_computed else 1.0

    def summary(self) -> str:
        method = f"{self.method} ({self.constants})" if self.constants else self.method
        if self.disabled_reason:
            return f"{method}: skipping off for this run ({self.disabled_reason}); {self.steps} steps computed"
        parts = [
            f"{b.branch}: skipped {b.steps_skipped}/{b.steps} steps" + (f" ({b.entries} entries)" if b.entries > 1 else "")
            for b in self.branches
        ]
        calls = self.calls_computed + self.calls_skipped
        return (
            f"{method}: " + ", ".join(parts or ["no model calls"])
            + f"; block stack ran {self.calls_computed}/{calls} calls ({self.stack_speedup:.2f}x)"
        )

    def as_dict(self) -> dict:
        """JSON-ready, for the UI and the API (/history)."""
        extra = {"trace": list(self.trace)} if self.trace else {}
        return extra | {
            "method": self.method,
            "steps": self.steps,
            "branches": [
                {"branch": b.branch, "entries": b.entries, "steps_computed": b.steps_computed,
                 "steps_skipped": b.steps_skipped, "pattern": b.pattern}
                for b in self.branches
            ],
            "calls_computed": self.calls_computed,
            "calls_skipped": self.calls_skipped,
            "stack_speedup": round(self.stack_speedup, 4),
            "disabled_reason": self.disabled_reason,
            "constants": self.constants,
            "summary": self.summary(),
        }
