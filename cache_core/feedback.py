"""Skip feedback: a skipped call's error, estimated once the next call computes, taken back out of
the sample at that call (docs/experiments.md sections 27-28).

A skipped call returns an estimate of the model's denoised output. When the next call of the same
conditioning computes, the real outputs on both sides of the skipped run give a far better estimate
of what the skipped calls should have returned: their interpolation. The sampler's update is linear
in the model's outputs, so the error the skips left in the sample can be cancelled by changing the
computed call's output: by the skips' error (output minus interpolation), weighted by how much the
next sample moves with each call's output, over how much it moves with this call's.

Those weights come from running the sampler itself on scalars (``SamplerResponse.measure``), so no
table of samplers is kept. Feedback is used only where that run shows a deterministic sampler that
makes one model call per step and keeps no history of earlier outputs (Euler and the like): there
it brings the levels closer to uncached at equal speed; on multistep samplers (dpmpp_2m) it did not
(sections 27-28).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

import torch

# A denoiser: (x, sigma) -> denoised, in the sampler-function convention of k-diffusion.
Denoiser = Callable[..., torch.Tensor]
# Runs the sampler of a sampling run on ``x`` with the given denoiser and returns its result.
SamplerRun = Callable[[Denoiser, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class SamplerResponse:
    """``weights[i][k]``: how far the sample the sampler holds before call ``i`` (``i`` = the
    number of steps: its result) moves per unit of the denoised output at call ``k``."""

    weights: tuple[tuple[float, ...], ...]

    @classmethod
    def measure(cls, run_sampler: SamplerRun, steps: int) -> SamplerResponse | str:
        """The response of the sampler ``run_sampler`` runs (``sampler_weights``), or why feedback
        cannot serve it."""
        weights = sampler_weights(run_sampler, steps)
        if isinstance(weights, str):
            return weights
        response = cls(weights)
        if not response.single_step:
            return "the sampler is multistep (it reuses earlier outputs)"
        return response

    @property
    def single_step(self) -> bool:
        """Each step moves the sample by its own call's output only: every earlier call's weight is
        scaled by one common factor from one sample to the next (Euler's sigma ratio)."""
        rows = self.weights
        for call in range(1, len(rows) - 1):
            before, after = rows[call], rows[call + 1]
            scale = max(range(call), key=lambda k: abs(before[k]))
            if before[scale] == 0.0:
                continue
            factor = after[scale] / before[scale]
            size = max(abs(w) for w in after[:call]) + abs(factor) * max(abs(w) for w in before[:call])
            # Relative, with a floor for rows that are rounding noise (the last step's: x = denoised).
            if any(abs(after[k] - factor * before[k]) > 1e-9 * size + 1e-12 for k in range(call)):
                return False
        return True


def sampler_weights(run_sampler: SamplerRun, steps: int) -> tuple[tuple[float, ...], ...] | str:
    """``SamplerResponse.weights`` of any deterministic sampler that calls the model once per step,
    or why not: the sampler run on ``steps`` + 1 scalars whose denoiser returns 1 in row ``k`` at
    call ``k`` and 0 elsewhere (row ``steps``: always 0), so each row's result is its call's weight."""
    results = []
    for seed in (0, 1):  # a sampler that draws noise answers differently to another seed
        calls: list[torch.Tensor] = []

        def denoiser(x: torch.Tensor, sigma: torch.Tensor, *_: object, calls: list = calls, **__: object
                     ) -> torch.Tensor:
            calls.append(x[:, 0].clone())
            output = torch.zeros_like(x)
            if len(calls) <= steps:
                output[len(calls) - 1] = 1.0
            return output

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            result = run_sampler(denoiser, torch.zeros(steps + 1, 1, dtype=torch.float64))
        if len(calls) != steps:
            return f"the sampler makes {len(calls)} model calls for {steps} steps"
        results.append(torch.stack([*calls, result.reshape(steps + 1, -1)[:, 0]]))
    if not torch.equal(results[0], results[1]):
        return "the sampler adds noise"
    samples = results[0]
    weights = samples[:, :steps] - samples[:, steps:]  # less the all-zero row: the weights alone
    return tuple(tuple(float(w) for w in row) for row in weights.tolist())


@dataclass
class _Stream:
    """One conditioning's calls: its latest computed output and the skipped outputs since."""

    last_step: int
    anchor: tuple[float, torch.Tensor] | None = None  # (sigma, denoised) of the latest computed call
    skipped: list[tuple[int, float, torch.Tensor]] = field(default_factory=list)  # (step, sigma, denoised) since


class SkipFeedback:
    """One sampling run's feedback: ``output`` sees every model call's denoised output and returns
    what the sampler gets. Holds one output per conditioning plus the skipped ones since its latest
    computed call; ``forget`` (the model changed) and ``close`` drop them."""

    def __init__(self, response: SamplerResponse, sigmas: tuple[float, ...]) -> None:
        self.weights = response.weights
        self.sigmas = sigmas
        self.corrected = 0  # computed calls whose output took skips' error back out
        self._streams: dict[Hashable, _Stream] = {}
        self._step = -1

    @torch.no_grad()
    def output(self, key: Hashable, step: int, skipped: bool, denoised: torch.Tensor) -> torch.Tensor:
        if step != self._step:  # a conditioning not called at the previous step (a moved window) is gone
            self._step = step
            self._streams = {k: s for k, s in self._streams.items() if s.last_step >= step - 1}
        stream = self._streams.get(key)
        if stream is None or stream.last_step != step - 1:
            stream = self._streams[key] = _Stream(step)
        stream.last_step = step
        sigma = self.sigmas[step]
        if skipped:
            if stream.anchor is not None:
                stream.skipped.append((step, sigma, denoised))
            return denoised
        result = denoised
        if stream.skipped and stream.anchor is not None:
            result = self._corrected(step, sigma, denoised, stream.anchor, stream.skipped)
        stream.anchor, stream.skipped = (sigma, denoised), []
        return result

    def _corrected(self, step: int, sigma: float, denoised: torch.Tensor, anchor: tuple[float, torch.Tensor],
                   skipped: list[tuple[int, float, torch.Tensor]]) -> torch.Tensor:
        row = self.weights[step + 1]
        own = row[step]
        if not math.isfinite(own) or abs(own) < 1e-12:
            return denoised
        anchor_sigma, anchor_output = anchor
        change = None
        for skipped_step, skipped_sigma, skipped_output in skipped:
            # The skipped call's error against the line between the computed outputs around it.
            position = (skipped_sigma - anchor_sigma) / (sigma - anchor_sigma)
            error = skipped_output - torch.lerp(anchor_output, denoised, position)
            term = error.mul_(row[skipped_step] / own)
            change = term if change is None else change.add_(term)
        self.corrected += 1
        return denoised - change

    def forget(self) -> None:
        """The model changed during the run: outputs before and after it do not interpolate."""
        self._streams = {}

    close = forget


__all__ = ["SamplerResponse", "SamplerRun", "SkipFeedback", "sampler_weights"]
