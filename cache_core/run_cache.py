"""The cache state of one sampling run.

Created when a run starts, from that run's schedule, and closed when it ends; nothing in it
outlives the run. Per model call it decides compute or skip for the whole block stack; per
conditioning entry (each CFG branch, and each area or mask conditioning batched beside it) it
keeps the decision state (the policy's) and the residuals (stack output minus stack input) of the
last computed calls, as many as the estimator uses, in that entry's rows:

- a call skips only if every entry in it may skip and has a residual for this shape; otherwise
  the batch computes and every entry in it counts the step as computed, with a fresh residual.
  Because residuals are kept per entry, a branch computed in a batched call can be skipped in a
  call of its own and the other way round (``plan_branches``: separate CFG branches).
- an entry without a call at the previous step (a context window that moved: entries are keyed
  by window too) is retired when the next step starts: its tensors are freed, its counts kept.
- a skipped call returns stack input + the estimator's weighted sum of the entry's residuals at
  the call's model time (``history.estimate``).
- a check against real computation can veto a skip the policy wants (``check``,
  cache_core/checks.py): the first-block check runs the head block first (``after_head``), the
  hindsight check reads the error measured at the entry's last computed call.
- computed calls measure the estimator's error when the check or the policy needs it
  (cache_core/measurement.py): what the estimator would have returned for the call, against its residual, per
  entry, or on the guided residual cfg * cond - (cfg - 1) * uncond for a policy that decides from
  it (the measured-error rule: the branches' errors partly cancel there, and cfg amplifies the rest).

Hot path: one host sync per sampler evaluation (the current sigma, to find the step), one more
per TeaCache decision (the signal), per checked call (the head block's error) and per computed
call with the hindsight check (its measured error, read at the next decision); one copy of the
stack input and one subtraction per entry (into its preallocated slot) per computed call; a
skipped call is one addition per entry for reuse, one weighted sum (float32) per entry for a
forecast.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from . import history as history_ops
from .checks import Check
from .history import ResidualHistory
from .measurement import MeasuredError, measure_estimator_error, sample_rows
from .policies import CachePolicy, EntryState
from .schedule import RunSchedule
from .stats import BranchStats, RunStats, branch_name


class Entry:
    """One conditioning entry of the run: its decision state and its kept residuals."""

    __slots__ = ("branch", "called_step", "head", "history", "key", "measured", "signal", "state")

    def __init__(self, key: Hashable, branch: int, state: EntryState, history: ResidualHistory,
                 head: ResidualHistory | None) -> None:
        self.key = key
        self.branch = branch
        self.state = state
        self.history = history
        self.head = head  # head-block residuals of the same computed calls (first-block check)
        self.signal: torch.Tensor | None = None  # TeaCache: its rows of the last call's signal
        self.measured = MeasuredError()  # the estimator's error at the last computed call
        self.called_step = -1  # the last step with a call of this entry

    def clear(self) -> None:
        self.history.clear()
        if self.head is not None:
            self.head.clear()
        self.signal = None
        self.measured.clear()


@dataclass(eq=False)
class StackCall:
    """One model call, from the head of the block stack to its tail."""

    skip: bool
    entries: tuple[Entry, ...] = ()
    step: int = 0
    time: float = 0.0  # model time of the call
    # Compute (and check): a private copy of the stack input (blocks of several families write
    # into theirs).
    stack_input: torch.Tensor | None = None
    # Skip: the stack's output for this call.
    cached_output: torch.Tensor | None = None
    # The head block must run before the call is decided (``RunCache.after_head``).
    checking: bool = False
    # First-block check on: the head block's residual rows of a computed call, sampled.
    head_residuals: list[torch.Tensor] | None = None

    @property
    def rows(self) -> int:
        """Batch rows per entry."""
        return self.stack_input.shape[0] // len(self.entries) if self.stack_input is not None else 0


class _SealedCall(StackCall):
    """A StackCall that refuses changes once sealed: the one ``PASSTHROUGH`` every run shares."""

    def __setattr__(self, name: str, value: object) -> None:
        if getattr(self, "sealed", False):
            raise AttributeError(f"PASSTHROUGH is shared by every run and never changes (set {name})")
        object.__setattr__(self, name, value)


# The call that decides nothing (outside a run, or the cache disabled): the blocks just run.
PASSTHROUGH = _SealedCall(skip=False)
PASSTHROUGH.sealed = True


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
        calibrating: bool = False,
        record_trace: bool = False,
        observer: RunObserver | None = None,
        check: Check | None = None,
        head_cost: float = 0.0,
        cfg: float | None = None,
    ) -> None:
        self.schedule = schedule
        self.policy = policy
        policy.use_guidance_scale(cfg)
        self.estimator = policy.estimator
        self.cache_device = cache_device
        # Calibration runs compute residuals every step without ever skipping.
        self.calibrating = calibrating
        self.observer = observer
        if observer is not None:
            observer.start(schedule)
        # The check (cache_core/checks.py, or None), and the head block's share of the stack's
        # work (first-block check).
        self.check = check
        self.head_cost = head_cost
        # Computed calls measure the estimator's error (the hindsight check, or a policy that
        # decides from it); with the guidance scale known, a call holding both CFG branches
        # measures it on what the sampler uses, cfg * cond - (cfg - 1) * uncond.
        self.measures_error = (check is not None and check.measures_error) or policy.measures_error
        measures_guided = policy.measures_guided or policy.guided_error_weight > 0.0
        self.cfg = cfg if measures_guided and cfg is not None and cfg != 1.0 else None
        self.guided_error_weight = None if policy.measures_guided else policy.guided_error_weight
        self.refused = 0  # decisions to skip that a check turned into computing
        reason = None
        if not (policy.can_skip or calibrating):
            reason = policy.never_skips_because or "these settings never skip (threshold 0)"
        self.disabled_reason: str | None = reason
        self.trace: list[dict] | None = [] if record_trace else None
        self._entries: dict[Hashable, Entry] = {}
        # Entries that missed a step (a context window that moved): their tensors are freed, their
        # counts stay in the statistics.
        self._retired: list[EntryState] = []
        self._called_step = -1  # the step of the latest call
        self._sigma_tensor: torch.Tensor | None = None
        self._sigma_value = 0.0
        self._sigma_step = 0
        self.calls_computed = 0
        self.calls_skipped = 0
        self.rows_computed = 0
        self.rows_skipped = 0
        self.rows_checked = 0  # skipped rows whose head block ran (the check's cost)
        self.current_step = 0

    @property
    def enabled(self) -> bool:
        return self.disabled_reason is None

    @property
    def runs_head_first(self) -> bool:
        """The first-block check is on: the head block runs before a call is decided."""
        return self.check is not None and self.check.runs_head_first

    def disable(self, reason: str) -> None:
        """Stop skipping for the rest of the run (logged once by the caller)."""
        if self.disabled_reason is None:
            self.disabled_reason = reason
            for entry in self._entries.values():
                entry.clear()

    def restart(self, step: int, reason: str) -> None:
        """The model changed during the run (its weights, at ``step``): every kept residual is
        forgotten, so the next call of each entry computes."""
        for entry in self._entries.values():
            entry.clear()
        if self.trace is not None:
            self.trace.append({"step": step, "restart": reason})

    def step_of(self, sigma: torch.Tensor) -> int:
        # ComfyUI hands every call of one sampler evaluation the same sigma tensor: one sync each.
        if sigma is not self._sigma_tensor:
            self._sigma_tensor = sigma
            self._sigma_value = float(sigma.reshape(-1)[0])
            self._sigma_step = self.schedule.step_of(self._sigma_value)
        return self._sigma_step

    def _enter_step(self, step: int) -> None:
        """At the first call of a step: an entry without a call at the previous one (a context
        window that moved; ComfyUI's uniform schedules shift windows by the step) is retired, its
        residuals freed; its key, if it comes back, starts as a new entry that computes first.
        Residuals and policy state then always cover consecutive steps, and the cache holds the
        windows of two steps at most."""
        previous, self._called_step = self._called_step, step
        if previous < 0 or previous == step:
            return
        for key, entry in list(self._entries.items()):
            if entry.called_step != previous:
                entry.clear()
                self._retired.append(entry.state)
                del self._entries[key]

    def _entry(self, key: Hashable, branch: int) -> Entry:
        entry = self._entries.get(key)
        if entry is None:
            capacity = self.estimator.residuals_kept
            entry = self._entries[key] = Entry(
                key, branch, self.policy.new_state(branch), ResidualHistory(capacity, self.cache_device),
                ResidualHistory(capacity) if self.runs_head_first else None)
        entry.called_step = self._called_step  # only ever asked for the current step's calls
        return entry

    # Separate CFG branches ---------------------------------------------------------------

    def plan_branches(self, sigma: torch.Tensor, branch_keys: Sequence[Sequence[Hashable]]) -> list[list[int]] | None:
        """Before a sampler evaluation: which CFG branches (indices into ``branch_keys``, each the
        conditioning entries of one branch) to evaluate in separate model calls so that a branch
        that may skip does not compute because another must. Returns the groups, computing ones
        first, or None for one call as usual.

        A policy that decides from the call's own signal (TeaCache) cannot decide ahead: then every
        branch gets a call of its own and decides there."""
        present = [index for index, keys in enumerate(branch_keys) if keys]
        if not self.enabled or self.calibrating or len(present) < 2:
            return None
        if self.policy.uses_signal:
            return [[index] for index in present]
        step = self.step_of(sigma)
        self._enter_step(step)
        skipping, computing = [], []
        for index in present:
            entries = [self._entry(key, index) for key in branch_keys[index]]
            wants = all(
                (e.state.skip if e.state.decided_step == step else self._decide(e, step, None))
                and e.history.count > 0
                for e in entries
            )
            (skipping if wants else computing).append(index)
        if not skipping or not computing:
            return None
        return [computing, skipping]

    def _decide(self, entry: Entry, step: int, signal: float | None) -> bool:
        """The policy's wish for this step, vetoed by the hindsight check (once per step)."""
        state = entry.state
        if state.wanted_step == step:
            return state.want
        measured, fresh = entry.measured.read()
        if fresh:
            self.policy.observe(state, entry.measured.gap, measured)
        want = self.policy.decide(state, step, signal)
        if want and self.check is not None:
            gap = self.schedule.step_times[step] - entry.history.times[-1] if entry.history.count else 0.0
            if not self.check.allows_at_decision(measured, entry.measured.gap, gap, self.estimator.error_order):
                want = state.want = False
                self.refused += 1
        return want

    def sigma_value(self, sigma: torch.Tensor) -> float:
        """The call's sigma as a number (read once per sampler evaluation, with its step)."""
        self.step_of(sigma)
        return self._sigma_value

    # The block stack ---------------------------------------------------------------------

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
        if step != self._called_step:
            self._enter_step(step)
        time = self.schedule.time_of(self._sigma_value, step)
        entries = tuple(self._entry(key, branch) for key, branch in zip(keys, branches, strict=True))
        if stack_input.shape[0] % len(entries):
            raise ValueError(f"a batch of {stack_input.shape[0]} rows cannot hold {len(entries)} entries")
        rows = stack_input.shape[0] // len(entries)
        undecided = [e for e in entries if e.state.decided_step != step]

        wants = [e.state.skip for e in entries]
        if undecided:
            changes: list[float | None] | None = None
            if signal is not None and self.policy.uses_signal:
                changes = self._signal_changes(entries, signal(), step, branches)
            for index, entry in enumerate(entries):
                if entry.state.decided_step != step:
                    change = changes[index] if changes is not None else None
                    wants[index] = self._decide(entry, step, change)
                    if self.trace is not None:
                        self.trace.append({"step": step, "key": str(keys[index]), "branch": entry.branch,
                                           "signal": change, "wants_skip": wants[index],
                                           "measured": entry.measured.error, **entry.state.trace()})

        row_like = stack_input[:rows]
        skip = all(wants) and not self.calibrating and all(e.history.fits(row_like) for e in entries)
        if skip and self.runs_head_first and undecided:
            return StackCall(skip=False, entries=entries, step=step, time=time, stack_input=stack_input.clone(),
                             checking=True)
        for entry in undecided:
            self.policy.record(entry.state, step, skip)
        if skip:
            self.calls_skipped += 1
            self.rows_skipped += stack_input.shape[0]
            return StackCall(skip=True, entries=entries, step=step, time=time,
                             cached_output=self._estimate(entries, stack_input, rows, time))
        self.calls_computed += 1
        self.rows_computed += stack_input.shape[0]
        return StackCall(skip=False, entries=entries, step=step, time=time, stack_input=stack_input.clone())

    def after_head(self, call: StackCall, head_output: torch.Tensor) -> StackCall:
        """First-block check, after the head block ran on a call: its residual goes with the
        call, and a call being checked is decided (skip: the returned call carries the output)."""
        stack_input = call.stack_input
        entries = call.entries
        rows = call.rows
        if head_output.shape != stack_input.shape:
            call.head_residuals = None
            if call.checking:  # cannot check this shape: compute
                return self._checked(call, skip=False)
            return call
        residuals = [
            torch.sub(sample_rows(head_output[i * rows:(i + 1) * rows], rows),
                      sample_rows(stack_input[i * rows:(i + 1) * rows], rows))
            for i in range(len(entries))
        ]
        call.head_residuals = residuals
        if not call.checking:
            return call
        heads = [entry.head for entry in entries]
        errors = (self.check.head_errors(heads, residuals, call.time, self.estimator.weights)
                  if all(head is not None for head in heads) else None)
        if errors is None:
            return self._checked(call, skip=False)
        if self.trace is not None:
            self.trace.append({"step": call.step, "check_errors": errors})
        skip = self.check.allows_after_head(errors)
        self.refused += not skip
        return self._checked(call, skip=skip)

    def _checked(self, call: StackCall, skip: bool) -> StackCall:
        call.checking = False
        for entry in call.entries:
            if entry.state.decided_step != call.step:
                self.policy.record(entry.state, call.step, skip)
        rows = call.stack_input.shape[0]
        if not skip:
            self.calls_computed += 1
            self.rows_computed += rows
            return call
        self.calls_skipped += 1
        self.rows_skipped += rows
        self.rows_checked += rows
        output = self._estimate(call.entries, call.stack_input, call.rows, call.time)
        return StackCall(skip=True, entries=call.entries, step=call.step, time=call.time, cached_output=output)

    def _estimate(self, entries: Sequence[Entry], stack_input: torch.Tensor, rows: int, time: float) -> torch.Tensor:
        weights = self.estimator.weights
        if len(entries) == 1:
            kept = entries[0].history
            return history_ops.estimate(stack_input, kept.residuals(), weights(kept.times, time))
        output = torch.empty_like(stack_input)
        for index, entry in enumerate(entries):
            kept = entry.history
            part = slice(index * rows, (index + 1) * rows)
            history_ops.estimate(stack_input[part], kept.residuals(), weights(kept.times, time), out=output[part])
        return output

    def _signal_changes(self, entries: Sequence[Entry], signal: torch.Tensor, step: int,
                        branches: Sequence[int]) -> list[float | None]:
        """Per entry, mean|s - s_prev| / mean|s_prev| of its rows; remembers them for next time."""
        rows = signal.shape[0] // len(entries)
        measured, which = [], []
        for index, entry in enumerate(entries):
            current = signal[index * rows:(index + 1) * rows]
            previous, entry.signal = entry.signal, current
            if previous is not None and previous.shape == current.shape:
                measured.append((current - previous).abs().mean() / previous.abs().mean())
                which.append(index)
        changes: list[float | None] = [None] * len(entries)
        if measured:
            for index, value in zip(which, torch.stack(measured).float().tolist(), strict=True):  # one sync
                changes[index] = value
            if self.observer is not None:
                self.observer.signal_changes(step, tuple(branches[i] for i in which),
                                             [changes[i] for i in which])
        return changes

    def finish(self, call: StackCall, stack_output: torch.Tensor, added: torch.Tensor | None = None) -> None:
        """At the tail of a computed call: keep each entry's stack output - stack input.

        ``added``: what the host added into the stream between the blocks on this call (a
        ControlNet's outputs), which a skipped call adds anew: kept out of the residual, but part of
        the stack's change of the stream that the measured error is relative to."""
        if call.stack_input is None or not call.entries:
            return
        rows = call.rows
        stack_input, call.stack_input = call.stack_input, None
        head_residuals, call.head_residuals = call.head_residuals, None
        if stack_output.shape != stack_input.shape or (added is not None and added.shape != stack_input.shape):
            for entry in call.entries:  # this shape cannot be cached; it keeps computing
                entry.clear()
            return
        # Residuals kept on another device (cache_device), measured, or less what was added, are
        # computed here first, into the copy.
        offloaded = self.cache_device is not None and self.cache_device != stack_output.device
        residual = (torch.sub(stack_output, stack_input, out=stack_input)
                    if offloaded or self.measures_error or added is not None else None)
        if added is not None:
            residual.sub_(added)
        if self.measures_error:  # before any slot is overwritten: the estimate uses them
            # (a rule that decides from the measurement waits for one of the estimate it skips with)
            measure_estimator_error(
                [e.history for e in call.entries], [e.branch for e in call.entries],
                [e.measured for e in call.entries], residual, call.time, self.estimator.weights,
                needs_full_history=self.policy.measures_error, cfg=self.cfg, added=added,
                guided_weight=self.guided_error_weight)
        for index, entry in enumerate(call.entries):
            part = slice(index * rows, (index + 1) * rows)
            kept = entry.history
            slot = kept.slot_for(stack_input[part], call.time)
            if residual is None:
                torch.sub(stack_output[part], stack_input[part], out=slot)
            else:
                slot.copy_(residual[part], non_blocking=True)
            entry.history.commit(slot, call.time)
            if entry.head is not None:
                if head_residuals is not None:
                    entry.head.keep(head_residuals[index], call.time)
                else:
                    entry.head.clear()
            if self.observer is not None:
                self.observer.residual(call.step, (entry.branch,),
                                       residual[part] if residual is not None else slot)

    # Results -----------------------------------------------------------------------------

    def held_tensors(self) -> list[tuple[str, int, torch.Tensor]]:
        """What the cache holds now: (kind, branch, tensor) for every residual slot, head-block
        residual and TeaCache signal (for the benchmark's memory probe; read only)."""
        out = []
        for entry in self._entries.values():
            out += [("residual", entry.branch, slot) for slot in entry.history.slots]
            if entry.head is not None:
                out += [("head residual", entry.branch, slot) for slot in entry.head.slots]
            if entry.signal is not None:
                out.append(("teacache signal", entry.branch, entry.signal))
        return out

    def stats(self) -> RunStats:
        by_branch: dict[int, list[EntryState]] = {}
        for state in [entry.state for entry in self._entries.values()] + self._retired:
            by_branch.setdefault(state.branch, []).append(state)
        branches = tuple(
            BranchStats(
                branch=branch_name(branch),
                entries=len(states),
                steps_computed=sum(s.steps_computed for s in states),
                steps_skipped=sum(s.steps_skipped for s in states),
                # the entry with the most steps (context windows: a window that never moved)
                pattern="".join(max(states, key=lambda state: len(state.outcomes)).outcomes),
            )
            for branch, states in sorted(by_branch.items())
        )
        return RunStats(
            method=self.policy.name,
            estimator=self.estimator.describe(),
            steps=self.schedule.steps,
            branches=branches,
            calls_computed=self.calls_computed,
            calls_skipped=self.calls_skipped,
            rows_computed=self.rows_computed,
            rows_skipped=self.rows_skipped,
            rows_checked=self.rows_checked,
            head_cost=self.head_cost if self.runs_head_first else 0.0,
            check=self.check.name if self.check is not None else None,
            refused=self.refused,
            disabled_reason=self.disabled_reason,
            trace=tuple(self.trace or ()),
        )

    def close(self) -> RunStats:
        """Free every tensor of the run and return its statistics."""
        stats = self.stats()
        for entry in self._entries.values():
            entry.clear()
        self._entries.clear()
        self._retired.clear()
        self._sigma_tensor = None
        self.trace = None
        return stats
