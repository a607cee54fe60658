"""The cache state of one sampling run.

Created when a run starts, from that run's schedule, and closed when it ends; nothing in it
outlives the run. Per model call it decides compute or skip for the whole block stack; per call
layout it keeps the tensors:

- a *call layout* is the tuple of conditioning entries a model call carries (cond and uncond
  batched together, or one of them alone when ComfyUI evaluates them separately): its cached
  residual (stack output minus stack input, rows in that order) and, for TeaCache, the previous
  signal. A layout seen for the first time, or with another shape, computes.
- each *conditioning entry* keeps its own accumulators (``policies.EntryState``). A call skips
  only if every entry in it may skip; otherwise the batch computes and every entry in it counts
  the step as computed, with a fresh residual.

Hot path: one host sync per sampler evaluation (the current sigma, to find the step), one more
per TeaCache decision (the signal), one copy of the stack input and one subtraction per computed
call; a skipped call is one addition. Nothing else allocates per call.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from .policies import CachePolicy, EntryState
from .schedule import RunSchedule
from .stats import BRANCH_NAMES, BranchStats, RunStats


class ResidualStore:
    """Tensors of one call layout, optionally kept on another device (``cache_device``)."""

    __slots__ = ("_host_buffer", "offload_device", "previous_signal", "residual")

    def __init__(self, offload_device: torch.device | None) -> None:
        self.offload_device = offload_device
        self.residual: torch.Tensor | None = None
        self.previous_signal: torch.Tensor | None = None
        self._host_buffer: torch.Tensor | None = None

    def keep(self, residual: torch.Tensor) -> None:
        device = self.offload_device
        if device is None or residual.device == device:
            self.residual = residual
            return
        buffer = self._host_buffer
        if buffer is None or buffer.shape != residual.shape or buffer.dtype != residual.dtype:
            # Pinned, so the copies both ways run asynchronously on the accelerator's stream.
            buffer = torch.empty(
                residual.shape, dtype=residual.dtype, device=device, pin_memory=residual.device.type == "cuda"
            )
            self._host_buffer = buffer
        buffer.copy_(residual, non_blocking=True)
        self.residual = buffer

    def residual_like(self, stack_input: torch.Tensor) -> torch.Tensor | None:
        residual = self.residual
        if residual is None or residual.shape != stack_input.shape:
            return None
        if residual.device != stack_input.device:
            residual = residual.to(stack_input.device, non_blocking=True)
        return residual

    def relative_changes(self, signal: torch.Tensor, chunks: int) -> list[float] | None:
        """Per chunk (entry), mean|s - s_prev| / mean|s_prev|; remembers ``signal`` for next time."""
        previous, self.previous_signal = self.previous_signal, signal
        if previous is None or previous.shape != signal.shape or signal.shape[0] % chunks:
            return None
        current = signal.reshape(chunks, -1)
        before = previous.reshape(chunks, -1)
        change = (current - before).abs().mean(dim=1) / before.abs().mean(dim=1)
        return change.float().tolist()  # the one host sync of a TeaCache decision

    def clear(self) -> None:
        self.residual = self.previous_signal = self._host_buffer = None


@dataclass
class StackCall:
    """One model call, from the head of the block stack to its tail."""

    skip: bool
    store: ResidualStore | None = None
    layout: tuple = ()
    branches: tuple[int, ...] = ()
    # Compute: a private copy of the stack input (blocks of several families write into theirs).
    stack_input: torch.Tensor | None = None
    # Skip: stack input + cached residual, the stack's output for this call.
    cached_output: torch.Tensor | None = None


PASSTHROUGH = StackCall(skip=False)


class RunObserver(Protocol):
    """Sees what a measuring run computes (calibration recorders implement it)."""

    def start(self, schedule: RunSchedule) -> None: ...

    def signal_changes(self, step: int, branches: tuple[int, ...], changes: list[float]) -> None: ...

    def residual(self, step: int, branches: tuple[int, ...], residual: torch.Tensor) -> None: ...


class RunCache:
    """Decisions and residuals of one sampling run. Call ``close`` when the run ends."""

    def __init__(
        self,
        schedule: RunSchedule,
        policy: CachePolicy,
        *,
        cache_device: torch.device | None = None,
        measure: bool = False,
        record_trace: bool = False,
    ) -> None:
        self.schedule = schedule
        self.policy = policy
        self.cache_device = cache_device
        # Measuring runs (calibration) compute residuals every step without ever skipping.
        self.measure = measure
        self.disabled_reason: str | None = (
            None if (policy.can_skip or measure) else "these settings never skip (threshold 0)"
        )
        self.trace: list[dict] | None = [] if record_trace else None
        self.observer: RunObserver | None = None
        self._entries: dict[Hashable, EntryState] = {}
        self._stores: dict[tuple, ResidualStore] = {}
        self._sigma_tensor: torch.Tensor | None = None
        self._sigma_step = 0
        self.calls_computed = 0
        self.calls_skipped = 0
        self.current_step = 0

    @property
    def enabled(self) -> bool:
        return self.disabled_reason is None

    def disable(self, reason: str) -> None:
        """Stop skipping for the rest of the run (logged once by the caller)."""
        if self.disabled_reason is None:
            self.disabled_reason = reason
            for store in self._stores.values():
                store.clear()

    def step_of(self, sigma: torch.Tensor) -> int:
        # ComfyUI hands every call of one sampler evaluation the same sigma tensor: one sync each.
        if sigma is not self._sigma_tensor:
            self._sigma_tensor = sigma
            self._sigma_step = self.schedule.step_of(float(sigma.reshape(-1)[0]))
        return self._sigma_step

    def _entry(self, key: Hashable, branch: int) -> EntryState:
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = EntryState(branch=branch)
        return entry

    def begin(
        self,
        sigma: torch.Tensor,
        keys: Sequence[Hashable],
        branches: Sequence[int],
        stack_input: torch.Tensor,
        signal: Callable[[], torch.Tensor] | None = None,
    ) -> StackCall:
        """At the head of the stack: decide this call, and prepare what its tail needs."""
        if not self.enabled:
            return PASSTHROUGH
        step = self.current_step = self.step_of(sigma)
        layout = tuple(keys)
        store = self._stores.get(layout)
        if store is None:
            store = self._stores[layout] = ResidualStore(self.cache_device)
        entries = [self._entry(key, branch) for key, branch in zip(keys, branches, strict=True)]
        undecided = [e for e in entries if e.decided_step != step]

        wants = [e.skip for e in entries]
        if undecided:
            policy = self.policy
            changes = None
            if signal is not None and policy.needs_signal(step):
                changes = store.relative_changes(signal(), len(entries))
                if changes is not None and self.observer is not None:
                    self.observer.signal_changes(step, tuple(branches), changes)
            for index, entry in enumerate(entries):
                if entry.decided_step != step:
                    change = changes[index] if changes is not None else None
                    wants[index] = policy.wants_skip(entry, step, change)
                    if self.trace is not None:
                        self.trace.append({
                            "step": step, "key": str(keys[index]), "branch": entry.branch, "signal": change,
                            "accumulated": entry.accumulated, "error": entry.error, "wants_skip": wants[index],
                        })

        residual = store.residual_like(stack_input) if all(wants) and not self.measure else None
        skip = residual is not None
        for entry in undecided:
            self.policy.record(entry, step, skip)

        if skip:
            self.calls_skipped += 1
            return StackCall(skip=True, store=store, cached_output=stack_input + residual)
        self.calls_computed += 1
        return StackCall(
            skip=False, store=store, layout=layout, branches=tuple(branches), stack_input=stack_input.clone()
        )

    def finish(self, call: StackCall, stack_output: torch.Tensor) -> None:
        """At the tail of a computed call: keep stack output - stack input."""
        if call.store is None or call.stack_input is None:
            return
        stack_input, call.stack_input = call.stack_input, None
        if stack_output.shape != stack_input.shape:
            call.store.residual = None  # this layout cannot be cached; it keeps computing
            return
        residual = torch.sub(stack_output, stack_input, out=stack_input)  # reuses the copy's memory
        if self.observer is not None:
            self.observer.residual(self.current_step, call.branches, residual)
        call.store.keep(residual)

    def stats(self) -> RunStats:
        by_branch: dict[int, list[EntryState]] = {}
        for entry in self._entries.values():
            by_branch.setdefault(entry.branch, []).append(entry)
        branches = tuple(
            BranchStats(
                branch=BRANCH_NAMES.get(branch, f"branch {branch}"),
                entries=len(entries),
                steps_computed=sum(e.steps_computed for e in entries),
                steps_skipped=sum(e.steps_skipped for e in entries),
                pattern="".join(entries[0].outcomes),
            )
            for branch, entries in sorted(by_branch.items())
        )
        return RunStats(
            method=self.policy.name,
            steps=self.schedule.steps,
            branches=branches,
            calls_computed=self.calls_computed,
            calls_skipped=self.calls_skipped,
            disabled_reason=self.disabled_reason,
            trace=tuple(self.trace or ()),
        )

    def close(self) -> RunStats:
        """Free every tensor of the run and return its statistics."""
        stats = self.stats()
        for store in self._stores.values():
            store.clear()
        self._stores.clear()
        self._entries.clear()
        self._sigma_tensor = None
        self.trace = None
        return stats
