"""cache_core on its own (no ComfyUI): schedule lookup, ratio curves, retention, the residual arithmetic."""

from __future__ import annotations

import math

import pytest
import torch


def test_step_of_uses_the_schedule_not_call_counts(core):
    schedule = core.RunSchedule.from_sigmas([1.0, 0.8, 0.5, 0.2, 0.0])
    assert [schedule.step_of(s) for s in (1.0, 0.8, 0.5, 0.2)] == [0, 1, 2, 3]
    # Second-order samplers evaluate between schedule sigmas: that is part of the current step.
    assert [schedule.step_of(s) for s in (0.9, 0.6, 0.3, 0.1, 0.0001)] == [0, 1, 2, 3, 3]
    assert schedule.step_of(0.0) == 3 and schedule.step_of(5.0) == 0
    # float32 round trips of a schedule sigma stay on that step.
    assert schedule.step_of(float(torch.tensor(0.8, dtype=torch.float32))) == 1


def shifted_flow_percent_to_sigma(percent: float, shift: float = 3.0) -> float:
    """A flow model's percent -> sigma with a time shift (the shape of SD3's and Wan's), for a
    mapping that is not the identity; tests/test_run_scope.py checks a real ComfyUI model's."""
    t = 1.0 - percent
    return shift * t / (1 + (shift - 1) * t)


def test_progress_inverts_percent_to_sigma(core):
    for percent in (0.0, 0.1, 0.37, 0.5, 0.93):
        sigma = shifted_flow_percent_to_sigma(percent)
        assert core.schedule.progress_of_sigma(sigma, shifted_flow_percent_to_sigma) == pytest.approx(percent, abs=1e-9)
    assert core.schedule.progress_of_sigma(0.0, shifted_flow_percent_to_sigma) == 1.0


def test_ratio_table_at_its_own_step_count_is_the_table(core):
    table = [1.0, 1.2, 1.1, 1.05, 1.0, 0.98, 0.95, 0.9]
    ratios = core.MagRatios.from_table(table, calibrated_steps=8, interleaved=False)
    schedule = core.RunSchedule.from_sigmas([1 - i / 8 for i in range(9)])
    assert ratios.per_step(schedule, 0) == pytest.approx(table, rel=1e-12)


def test_fewer_steps_get_the_product_of_the_ratios_they_span(core):
    table = [1.0, 1.2, 1.1, 1.05, 1.0, 0.98, 0.95, 0.9]
    ratios = core.MagRatios.from_table(table, calibrated_steps=8, interleaved=False)
    half = core.RunSchedule.from_sigmas([1 - i / 4 for i in range(5)])
    expected = [1.0, table[1] * table[2], table[3] * table[4], table[5] * table[6]]
    assert ratios.per_step(half, 0) == pytest.approx(expected, rel=1e-12)
    # A partial schedule (denoise 0.5) reads the part of the curve at its noise levels.
    tail = core.RunSchedule(sigmas=(0.5, 0.375, 0.25, 0.125, 0.0), progress=(0.5, 0.625, 0.75, 0.875, 1.0))
    assert ratios.per_step(tail, 0) == pytest.approx([1.0, table[5], table[6], table[7]], rel=1e-9)


def test_interleaved_tables_split_into_cond_and_uncond(core):
    table = [1.0, 1.0, 1.3, 1.2, 0.9, 0.8]
    ratios = core.MagRatios.from_table(table, calibrated_steps=3, interleaved=True)
    schedule = core.RunSchedule.from_sigmas([1.0, 2 / 3, 1 / 3, 0.0])
    assert ratios.per_step(schedule, 0) == pytest.approx([1.0, 1.3, 0.9])
    assert ratios.per_step(schedule, 1) == pytest.approx([1.0, 1.2, 0.8])


@pytest.mark.parametrize("bad", [[1.0, 1.1], [1.0, -1.0, 1.0], [1.0, float("nan"), 1.0], [1.0, 0.0, 1.0]])
def test_malformed_ratio_tables_are_refused(core, bad):
    with pytest.raises(ValueError):
        core.MagRatios.from_table(bad, calibrated_steps=3, interleaved=False)


def test_magcache_retention_matches_the_reference_rounding(core):
    ratios = core.MagRatios.from_table([1.0] * 10, calibrated_steps=10, interleaved=False)
    for steps in range(10, 61):
        schedule = core.RunSchedule.from_sigmas([1 - i / steps for i in range(steps + 1)])
        for retention in (0.0, 0.1, 0.15, 0.2, 0.25, 0.3, 0.5):
            policy = core.MagCachePolicy(schedule, ratios, 0.1, 2, retention)
            # diffusers / MagCache: retention_step = int(retention_ratio * num_inference_steps + 0.5)
            assert sum(policy.retained) == int(retention * steps + 0.5), (steps, retention)


def test_teacache_zero_threshold_never_skips(core):
    schedule = core.RunSchedule.from_sigmas([1 - i / 20 for i in range(21)])
    # A polynomial that is negative near 0 would "skip" at threshold 0 if 0 were not special.
    policy = core.TeaCachePolicy(schedule, 0.0, (0.0, 0.0, 0.0, 1.0, -0.5), max_consecutive_skips=5)
    assert not policy.can_skip
    cache = core.RunCache(schedule, policy)
    assert not cache.enabled


def make_cache(core, steps=12, **policy_kwargs):
    schedule = core.RunSchedule.from_sigmas([1 - i / steps for i in range(steps + 1)])
    ratios = core.MagRatios.from_table([1.0] * steps, calibrated_steps=steps, interleaved=False)
    policy = core.MagCachePolicy(schedule, ratios, threshold=1.0, max_consecutive_skips=100, retention_ratio=0.0)
    return schedule, core.RunCache(schedule, policy, **policy_kwargs)


def test_a_skipped_call_returns_input_plus_the_last_residual(core):
    schedule, cache = make_cache(core)
    keys, branches = ("cond-uuid", "uncond-uuid"), (0, 1)
    x0 = torch.randn(2, 5, 3)
    sigma0 = torch.tensor([schedule.sigmas[0]] * 2)
    call = cache.begin(sigma0, keys, branches, x0)
    assert not call.skip and call.stack_input is not x0 and torch.equal(call.stack_input, x0)
    out0 = x0 * 2 + 1
    cache.finish(call, out0)

    x1 = torch.randn(2, 5, 3)
    x1_before = x1.clone()
    call = cache.begin(torch.tensor([schedule.sigmas[1]] * 2), keys, branches, x1)
    assert call.skip
    assert torch.equal(call.cached_output, x1_before + (out0 - x0))
    assert torch.equal(x1, x1_before)  # the call's own input is never written to

    # Another shape (e.g. another resolution) has no residual yet: it computes.
    call = cache.begin(torch.tensor([schedule.sigmas[2]] * 2), keys, branches, torch.randn(2, 7, 3))
    assert not call.skip
    stats = cache.close()
    assert stats.calls_skipped == 1 and stats.calls_computed == 2
    assert stats.rows_skipped == 2 and stats.rows_computed == 4
    assert [b.pattern for b in stats.branches] == ["CSC", "CSC"]
    assert not cache._entries and not cache.held_tensors()


def test_an_entry_that_misses_a_step_is_retired_and_starts_over(core):
    """Context windows that move (ComfyUI's uniform schedules): a key without a call at the previous
    step loses its residuals when the next step starts, and computes when it comes back; the
    statistics still count every call of it."""
    schedule, cache = make_cache(core)
    x = torch.randn(1, 4, 2)

    def call(step, key):
        made = cache.begin(torch.tensor([schedule.sigmas[step]]), (key,), (0,), x)
        if not made.skip:
            cache.finish(made, x + step + 1)
        return made.skip

    assert [call(0, "a"), call(0, "b")] == [False, False]
    assert [call(1, "a"), call(1, "b")] == [True, True]
    assert call(2, "a")  # "b" has no call at step 2
    assert len(cache.held_tensors()) == 2
    assert call(3, "a") and len(cache.held_tensors()) == 1  # step 3 began: "b" was retired
    assert not call(4, "b")  # back, without residuals: it computes first
    assert call(5, "a") is False  # "a" had no call at step 4: retired too
    stats = cache.close()
    (cond,) = stats.branches
    assert cond.entries == 4 and cond.steps_computed + cond.steps_skipped == 8
    assert cond.pattern == "CSSS"  # the entry with the most steps: the first "a"
    assert not cache.held_tensors()


def test_offloaded_residuals_come_back_to_the_input_device(core):
    schedule, cache = make_cache(core, cache_device=torch.device("cpu"))
    x0 = torch.randn(1, 4, 2)
    call = cache.begin(torch.tensor([schedule.sigmas[0]]), ("k",), (0,), x0)
    cache.finish(call, x0 + 3)
    call = cache.begin(torch.tensor([schedule.sigmas[1]]), ("k",), (0,), x0)
    assert call.skip and torch.equal(call.cached_output, x0 + 3)


def test_a_batch_computes_when_any_entry_must(core):
    steps = 12
    schedule = core.RunSchedule.from_sigmas([1 - i / steps for i in range(steps + 1)])
    ratios = core.MagRatios.from_table([1.0, 1.0] + [1.0, 1.5] * (steps - 1), calibrated_steps=steps, interleaved=True)
    policy = core.MagCachePolicy(schedule, ratios, threshold=0.3, max_consecutive_skips=100, retention_ratio=0.0)
    cache = core.RunCache(schedule, policy)
    x = torch.randn(2, 3, 4)
    for step in range(4):
        call = cache.begin(torch.tensor([schedule.sigmas[step]] * 2), ("c", "u"), (0, 1), x)
        if not call.skip:
            cache.finish(call, x + 1)
    stats = cache.close()
    cond, uncond = stats.branches
    # The uncond ratios (1.5 per step) exceed the threshold at once, so every call computes.
    assert cond.pattern == uncond.pattern == "CCCC"
    assert math.isclose(stats.stack_speedup, 1.0)


def test_measured_turning_adds_to_the_magcache_error(core):
    """With measured cosine distances the error is the cached residual's relative distance,
    sqrt((1 - ratio)^2 + 2 ratio (1 - cos angle)); without them, the paper's |1 - ratio|."""
    steps = 8
    schedule = core.RunSchedule.from_sigmas([1 - i / steps for i in range(steps + 1)])
    positions = [i / steps for i in range(steps)]
    ratios = [1.0] + [0.98] * (steps - 1)
    distances = [0.0] + [0.002] * (steps - 1)
    plain = core.MagRatios.from_measured([ratios], positions)
    turning = core.MagRatios.from_measured([ratios], positions, cosine_distances=[distances])
    assert not plain.has_angles and turning.has_angles
    angle = math.acos(1 - 0.002)
    assert turning.angles_per_step(schedule, 0) == pytest.approx([0.0] + [angle] * (steps - 1))
    half = core.RunSchedule.from_sigmas([1 - i / 4 for i in range(5)])
    assert turning.angles_per_step(half, 0) == pytest.approx([0.0] + [2 * angle] * 3)

    policy_plain = core.MagCachePolicy(schedule, plain, 10.0, 100, 0.0)
    policy_turning = core.MagCachePolicy(schedule, turning, 10.0, 100, 0.0)
    entry_plain, entry_turning = policy_plain.new_state(0), policy_turning.new_state(0)
    for step in (1, 2):
        policy_plain.wants_skip(entry_plain, step, None)
        policy_turning.wants_skip(entry_turning, step, None)
    assert entry_plain.error == pytest.approx(abs(1 - 0.98) + abs(1 - 0.98**2))
    expected = sum(math.sqrt((1 - r) ** 2 + 2 * r * (1 - math.cos(a)))
                   for r, a in ((0.98, angle), (0.98**2, 2 * angle)))
    assert entry_turning.error == pytest.approx(expected)
    assert entry_turning.error > entry_plain.error


def test_the_shared_passthrough_call_cannot_be_changed(core):
    import importlib

    run_cache = importlib.import_module(f"{core.__name__}.run_cache")
    with pytest.raises(AttributeError, match="never changes"):
        run_cache.PASSTHROUGH.skip = True
    assert run_cache.PASSTHROUGH.skip is False
    run_cache.StackCall(skip=False).skip = True  # calls of a run are its own to fill in
