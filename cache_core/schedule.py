"""A sampling run's schedule: the step of any model call, and each step's place in model time.

ComfyUI passes no step index to the model. The step comes from the run's own sigmas, not from
counting calls: samplers call the model once, twice or more per step (heun, dpmpp_2s, uni_pc),
cond and uncond arrive batched or in separate calls, and KSamplerAdvanced, denoise < 1 and
two-stage graphs hand each run only part of the full schedule.

"Progress" is the position of a sigma in the model's whole denoising, in [0, 1] (0 = pure noise),
the inverse of ComfyUI's ``model_sampling.percent_to_sigma``. Per-step constants (MagCache ratios,
retention, start/end percents) are looked up by progress, so a partial schedule gets the part of a
table that matches its noise levels.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

PercentToSigma = Callable[[float], float]


def progress_of_sigma(sigma: float, percent_to_sigma: PercentToSigma, iterations: int = 48) -> float:
    """Invert the model's monotonically decreasing ``percent_to_sigma`` by bisection."""
    if sigma <= 0.0:
        return 1.0
    if sigma >= float(percent_to_sigma(0.0)):
        return 0.0
    low, high = 0.0, 1.0  # percent_to_sigma(low) > sigma >= percent_to_sigma(high)
    for _ in range(iterations):
        middle = 0.5 * (low + high)
        if float(percent_to_sigma(middle)) > sigma:
            low = middle
        else:
            high = middle
    return 0.5 * (low + high)


@dataclass(frozen=True)
class RunSchedule:
    """The schedule of one sampling run.

    ``sigmas`` has ``steps + 1`` entries, descending; ``progress[i]`` is the model-time position of
    ``sigmas[i]``.
    """

    sigmas: tuple[float, ...]
    progress: tuple[float, ...]
    # Negated step sigmas, ascending, for bisect.
    _search_keys: tuple[float, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_search_keys", tuple(-s for s in self.sigmas[:-1]))

    @classmethod
    def from_sigmas(cls, sigmas: Sequence[float], percent_to_sigma: PercentToSigma | None = None) -> RunSchedule:
        """Without ``percent_to_sigma`` the run is taken as a full, evenly spaced denoising."""
        values = tuple(float(s) for s in sigmas)
        if len(values) < 2:
            raise ValueError("a sampling run needs at least two sigmas")
        if percent_to_sigma is None:
            steps = len(values) - 1
            progress = tuple(i / steps for i in range(steps + 1))
        else:
            progress = tuple(progress_of_sigma(s, percent_to_sigma) for s in values)
        return cls(values, progress)

    @property
    def steps(self) -> int:
        return len(self.sigmas) - 1

    def step_of(self, sigma: float) -> int:
        """The step whose interval [sigmas[i], sigmas[i+1]) holds ``sigma``.

        A call exactly at a schedule sigma belongs to that step; calls between two schedule sigmas
        (second-order samplers) belong to the step they are part of.
        """
        tolerance = 1e-5 * max(abs(sigma), 1e-6)
        count = bisect.bisect_right(self._search_keys, -(sigma - tolerance))
        return min(max(count - 1, 0), self.steps - 1)

    @property
    def step_times(self) -> tuple[float, ...]:
        """Model time of each step's first call: its progress (what estimators extrapolate in)."""
        return self.progress[:-1]

    def time_of(self, sigma: float, step: int) -> float:
        """Model time of a call at ``sigma`` within ``step``: progress, linear in sigma inside the
        step (second-order samplers evaluate between schedule sigmas)."""
        high, low = self.sigmas[step], self.sigmas[step + 1]
        if sigma >= high or high <= low:
            return self.progress[step]
        if sigma <= low:
            return self.progress[step + 1]
        return self.progress[step] + (self.progress[step + 1] - self.progress[step]) * (high - sigma) / (high - low)

    def step_midpoint(self, step: int) -> float:
        """Progress at the middle of a step; used for "the first fraction of the denoising"."""
        return 0.5 * (self.progress[step] + self.progress[step + 1])
