"""Residuals of one conditioning entry over a run, and the weighted sum every estimator returns.

Hot path. A ``ResidualHistory`` holds at most ``capacity`` residuals (the estimator's order + 1)
in slots allocated once per run (again only if the entry's shape changes, which forgets its
history). A computed call writes its residual straight into the oldest slot, so nothing else is
allocated per call and the cache never holds more than ``capacity`` residuals per entry. With
``cache_device`` the slots live there (pinned host memory for an accelerator's residuals) and are
copied back asynchronously when used.

``estimate`` adds the estimator's weighted sum of the kept residuals to the stack input: reuse
(weights (1.0,)) is the single addition the pack always did; any other weights accumulate in
float32, so a half-precision residual's small differences are not rounded away.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

# Calls closer than this in model time (progress) count as the same point: Heun's second
# evaluation and the next step's first sit at the same sigma.
SAME_TIME = 1e-7


class ResidualHistory:
    """The last ``capacity`` residuals of one entry and the model times of their calls."""

    __slots__ = ("_order", "capacity", "offload_device", "slots", "times")

    def __init__(self, capacity: int, offload_device: torch.device | None = None) -> None:
        self.capacity = capacity
        self.offload_device = offload_device
        self.slots: list[torch.Tensor] = []
        self._order: list[int] = []  # slot indices, oldest first
        self.times: list[float] = []  # model time of each kept residual, oldest first

    @property
    def count(self) -> int:
        return len(self._order)

    def fits(self, like: torch.Tensor) -> bool:
        """True when a residual for a call shaped like ``like`` is kept."""
        return bool(self._order) and self.slots[0].shape == like.shape

    def residuals(self) -> list[torch.Tensor]:
        """The kept residuals, oldest first (on the cache device)."""
        return [self.slots[i] for i in self._order]

    def slot_for(self, like: torch.Tensor, time: float) -> torch.Tensor:
        """The tensor the residual of a call at ``time`` goes into; ``commit`` makes it part of the
        history. A call at the time of the newest residual replaces it; one earlier than that
        (a sampler going back up in noise) starts the history over."""
        if self.slots and (self.slots[0].shape != like.shape or self.slots[0].dtype != like.dtype):
            self.clear()
        if self.times and time <= self.times[-1] + SAME_TIME:
            if time < self.times[-1] - SAME_TIME:
                self._order.clear()
                self.times.clear()
            else:
                return self.slots[self._order[-1]]
        for index, slot in enumerate(self.slots):  # one the history no longer uses
            if index not in self._order:
                return slot
        if len(self.slots) < self.capacity:
            device = self.offload_device if self.offload_device is not None else like.device
            self.slots.append(torch.empty(like.shape, dtype=like.dtype, device=device,
                                          pin_memory=device.type == "cpu" and like.device.type == "cuda"))
            return self.slots[-1]
        return self.slots[self._order[0]]

    def commit(self, slot: torch.Tensor, time: float) -> None:
        index = next(i for i, s in enumerate(self.slots) if s is slot)
        if self._order and self._order[-1] == index:
            self.times[-1] = time  # replaced the newest
            return
        if index in self._order:
            position = self._order.index(index)
            del self._order[position]
            del self.times[position]
        self._order.append(index)
        self.times.append(time)

    def keep(self, residual: torch.Tensor, time: float) -> torch.Tensor:
        """Store an already computed residual (its own tensor, e.g. on another device)."""
        slot = self.slot_for(residual, time)
        slot.copy_(residual, non_blocking=True)
        self.commit(slot, time)
        return slot

    def clear(self) -> None:
        self.slots.clear()
        self._order.clear()
        self.times.clear()


def weighted_sum(tensors: Sequence[torch.Tensor], weights: Sequence[float], device: torch.device) -> torch.Tensor:
    """sum(w_i t_i) on ``device``, in float32 (a fresh tensor)."""
    accumulator: torch.Tensor | None = None
    for tensor, weight in zip(tensors, weights, strict=True):
        tensor = tensor.to(device, non_blocking=True)  # no-op where it already is
        if accumulator is None:
            accumulator = (torch.mul(tensor, weight) if tensor.dtype == torch.float32
                           else tensor.to(torch.float32).mul_(weight))
        else:
            accumulator.add_(tensor, alpha=weight)
    assert accumulator is not None
    return accumulator


def estimate(stack_input: torch.Tensor, tensors: Sequence[torch.Tensor], weights: Sequence[float],
             out: torch.Tensor | None = None) -> torch.Tensor:
    """stack_input + sum(w_i t_i), in the stack input's dtype (into ``out`` when given). The
    weights apply to the newest ``len(weights)`` tensors."""
    if len(weights) == 1 and weights[0] == 1.0:  # reuse: one addition, exactly as before
        residual = tensors[-1].to(stack_input.device, non_blocking=True)
        return torch.add(stack_input, residual, out=out)
    accumulator = weighted_sum(tensors[len(tensors) - len(weights):], weights, stack_input.device)
    if out is None:
        out = torch.empty_like(stack_input)
    return torch.add(stack_input, accumulator, out=out)
