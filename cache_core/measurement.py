"""The estimator's error, measured at a computed call: the one thing "measured" means in the run cache.

A computed call has its real residual, so what the estimator would have returned for it (from the
residuals kept before it) can be compared with the truth for free. The hindsight check vetoes skips
with it and the measured-error rule (``policies.MeasuredErrorPolicy``) decides from it.

The error is the relative L1 error of the worst row, on a strided sample of each row (so measuring
costs little memory on large models), left as a 0-d tensor that the next decision reads: one host
sync per measurement, at a point where the sampler waits anyway.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from . import history as history_ops
from .history import ResidualHistory

# Residuals are compared on at most this many values per row.
SAMPLES_PER_ROW = 8192


class MeasuredError:
    """One conditioning entry's last measurement: the error and the model time it bridged."""

    __slots__ = ("error", "gap")

    def __init__(self) -> None:
        self.error: torch.Tensor | float | None = None  # a 0-d tensor until read
        self.gap = 0.0

    def read(self) -> tuple[float | None, bool]:
        """The error (synced once), and whether this read is the first since it was measured."""
        if isinstance(self.error, torch.Tensor):
            self.error = float(self.error)
            return self.error, True
        return self.error, False

    def clear(self) -> None:
        self.error = None


def sample_rows(tensor: torch.Tensor, rows: int) -> torch.Tensor:
    """[rows, n] view of ``tensor``, strided down to about SAMPLES_PER_ROW values per row; the
    stride is coprime with the last dimension so every channel is sampled."""
    flat = tensor.reshape(rows, -1)
    stride = max(1, flat.shape[1] // SAMPLES_PER_ROW)
    while stride > 1 and math.gcd(stride, tensor.shape[-1]) != 1:
        stride += 1
    return flat[:, ::stride]


def relative_error(error: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """max over rows of mean|error| / mean|reference| ([rows, n] tensors): a 0-d tensor."""
    return (error.abs().mean(dim=1) / reference.abs().mean(dim=1).float().clamp_min(1e-12)).max()


def measure_estimator_error(
    histories: Sequence[ResidualHistory],
    branches: Sequence[int],
    measurements: Sequence[MeasuredError],
    residual: torch.Tensor,
    time: float,
    weights: Callable[[Sequence[float], float], Sequence[float]],
    needs_full_history: bool,
    cfg: float | None,
    added: torch.Tensor | None = None,
    guided_weight: float | None = None,
) -> None:
    """Measure, for each entry of a computed call (its rows of ``residual``, in order), the error
    the estimator's ``weights`` over its kept residuals would have made at ``time``. With ``cfg``,
    a call holding both CFG branches is measured on the guided residual cfg * cond - (cfg - 1) *
    uncond, and both branches get that one value; or, with ``guided_weight``, each branch gets the
    larger of its own error and that share of the guided one. An entry without what the estimate
    needs (or, with ``needs_full_history``, without all the residuals the estimator keeps) gets None.

    ``added``: what the host added between the blocks and the residual leaves out (ControlNet
    outputs); the error is relative to the stack's whole change of the stream, residual + added, as
    it is on a run without them."""
    rows = residual.shape[0] // len(histories)
    parts = [sample_rows(residual[i * rows:(i + 1) * rows], rows) for i in range(len(histories))]
    scales = parts if added is None else [
        part + sample_rows(added[i * rows:(i + 1) * rows], rows) for i, part in enumerate(parts)]
    errors: list[torch.Tensor | None] = []
    for kept, part, measurement in zip(histories, parts, measurements, strict=True):
        if not kept.fits(residual[:rows]) or time <= kept.times[-1] + history_ops.SAME_TIME or (
                needs_full_history and kept.count < kept.capacity):
            errors.append(None)
            continue
        measurement.gap = time - kept.times[-1]
        anchors = [sample_rows(r, rows) for r in kept.residuals()]
        errors.append(history_ops.weighted_sum(anchors, weights(kept.times, time), part.device).sub_(part))
    both = cfg is not None and sorted(branches) == [0, 1] and all(e is not None for e in errors)
    # Each entry's own error (unless both get the guided one), taken before the combination below
    # reuses the error tensors in place.
    own = [None if error is None or (both and guided_weight is None) else relative_error(error, scale)
           for error, scale in zip(errors, scales, strict=True)]
    if both:
        cond, uncond = branches.index(0), branches.index(1)
        error = errors[cond].mul_(cfg).sub_(errors[uncond], alpha=cfg - 1.0)
        guided = scales[cond].float().mul(cfg).sub_(scales[uncond].float(), alpha=cfg - 1.0)
        combined = relative_error(error, guided)
        if guided_weight is None:
            own = [combined] * len(own)
        else:
            charged = combined.mul_(guided_weight)
            own = [torch.maximum(e, charged) for e in own]
    for measurement, error in zip(measurements, own, strict=True):
        measurement.error = error


__all__ = ["SAMPLES_PER_ROW", "MeasuredError", "measure_estimator_error", "relative_error", "sample_rows"]
