"""cache_core on its own (no ComfyUI): estimators, the residual history, skip rules that follow the estimator,
separate CFG branches and the first-block check (no sampler involved; see test_forecast_runs.py
for the same in ComfyUI's real samplers)."""

from __future__ import annotations

import pytest
import torch


def uneven_schedule(core):
    """Six steps, unevenly spaced in model time (progress), as real schedules are."""
    return core.RunSchedule(sigmas=(1.0, 0.8, 0.5, 0.4, 0.1, 0.05, 0.0),
                            progress=(0.0, 0.1, 0.35, 0.5, 0.8, 0.9, 1.0))


def flat_ratios(core, steps):
    return core.MagRatios.from_table([1.0] * steps, calibrated_steps=steps, interleaved=False)


# Estimators -------------------------------------------------------------------------------


def test_forecasts_reproduce_a_path_of_their_order_in_model_time(core):
    estimators = core.estimators
    times = [0.1, 0.3, 0.45]
    paths = {1: lambda t: 2.0 - 3.0 * t, 2: lambda t: 1.0 + t - 4.0 * t * t}
    for order, path in paths.items():
        kept = times[-(order + 1):]
        weights = estimators.ForecastEstimator(order).weights(kept, 0.7)
        assert sum(w * path(t) for w, t in zip(weights, kept, strict=True)) == pytest.approx(path(0.7))
    # Reuse is the last residual, whatever the times.
    assert estimators.ReuseEstimator().weights(times, 0.7) == (1.0,)
    # Early in a run (one residual kept) every estimator reuses it.
    for estimator in (estimators.ForecastEstimator(1), estimators.ForecastEstimator(2),
                      estimators.DampedEstimator(0.5)):
        assert estimator.weights([0.2], 0.5) == pytest.approx((1.0,))


def test_damped_forecast_runs_from_the_forecast_to_reuse_and_stays_bounded(core):
    estimators = core.estimators
    times = [0.1, 0.3]
    forecast = estimators.ForecastEstimator(1).weights(times, 0.7)
    assert estimators.DampedEstimator(0.0).weights(times, 0.7) == pytest.approx(forecast)
    assert estimators.DampedEstimator(1.0).weights(times, 0.7) == pytest.approx((0.0, 1.0))
    # damping 0.5: one interval ahead the forecast moves phi = 0.5 of the last difference, and
    # however long the gap, never more than phi / (1 - phi) = 1 difference.
    gains = [-estimators.DampedEstimator(0.5).weights([0.0, 0.1], 0.1 + 0.1 * h)[0] for h in (0.5, 1, 2, 4, 50)]
    assert gains == sorted(gains) and gains[1] == pytest.approx(0.5) and gains[-1] <= 1.0 + 1e-12
    for h in (0.5, 1, 2, 4):
        assert sum(estimators.DampedEstimator(0.5).weights([0.0, 0.1], 0.1 + 0.1 * h)) == pytest.approx(1.0)


def test_estimator_specs_build_what_they_name(core):
    spec = core.EstimatorSpec
    assert spec().build().is_reuse
    assert spec("forecast", order=2).build().residuals_kept == 3
    assert spec("damped_forecast", damping=0.3).build().residuals_kept == 2
    with pytest.raises(ValueError, match="unknown estimator"):
        spec("psychic").build()
    with pytest.raises(ValueError, match="order"):
        spec("forecast", order=3).build()


# The residual history -----------------------------------------------------------------------


def test_history_keeps_at_most_its_capacity_in_fixed_slots(core):
    history = core.history.ResidualHistory(2)
    like = torch.zeros(1, 4, 3)
    slot_ids = set()
    for i in range(6):
        slot = history.slot_for(like, 0.1 * i)
        slot.fill_(i)
        history.commit(slot, 0.1 * i)
        slot_ids.add(id(slot))
    assert len(history.slots) == 2 and len(slot_ids) == 2  # allocated once, then reused
    assert [float(r[0, 0, 0]) for r in history.residuals()] == [4.0, 5.0]
    assert history.times == pytest.approx([0.4, 0.5])
    # A call at the newest residual's time (Heun's second evaluation) replaces it ...
    slot = history.slot_for(like, 0.5)
    slot.fill_(9)
    history.commit(slot, 0.5)
    assert [float(r[0, 0, 0]) for r in history.residuals()] == [4.0, 9.0]
    # ... one earlier in model time starts over, and another shape forgets everything.
    slot = history.slot_for(like, 0.2)
    history.commit(slot, 0.2)
    assert history.count == 1 and history.times == [0.2]
    history.slot_for(torch.zeros(2, 4, 3), 0.6)
    assert history.count == 0


def test_forecast_arithmetic_keeps_half_precision_differences(core):
    """A forecast of bf16 residuals accumulates in float32: the result is the exact weighted sum
    rounded once, where adding the terms in bf16 rounds after every addition."""
    generator = torch.Generator().manual_seed(0)
    x = (torch.randn(4, 512, generator=generator) * 4).bfloat16()
    r0 = (torch.randn(4, 512, generator=generator) * 30).bfloat16()
    r1 = (r0.float() + torch.randn(4, 512, generator=generator) * 0.5).bfloat16()
    weights = (-0.75, 1.75)
    out = core.history.estimate(x, [r0, r1], weights)
    exact = (x.double() + weights[0] * r0.double() + weights[1] * r1.double()).bfloat16()
    assert out.dtype == torch.bfloat16 and torch.equal(out, exact)
    naive = x + (r0 * weights[0] + r1 * weights[1])  # all in bf16
    assert not torch.equal(naive, exact)  # what the float32 accumulation avoids
    # Reuse is the single addition it always was.
    assert torch.equal(core.history.estimate(x, [r0, r1], (1.0,)), x + r1)


# Runs -----------------------------------------------------------------------------------------


def magcache_run(core, schedule, estimator="reuse", order=1, ratios=None, threshold=100.0, retention=0.0, **kw):
    policy = core.MagCachePolicy(schedule, ratios or flat_ratios(core, schedule.steps), threshold, 100, retention,
                                 estimator=core.EstimatorSpec(estimator, order=order).build())
    return core.RunCache(schedule, policy, **kw)


def sigma(schedule, step, rows=1):
    return torch.tensor([schedule.sigmas[step]] * rows)


@pytest.mark.parametrize("estimator", ["reuse", "forecast", "damped_forecast"])
def test_a_skipped_call_returns_the_estimate_at_its_model_time(core, estimator):
    """The residual moves linearly in model time (progress) across unevenly spaced steps: a
    first-order forecast returns it exactly, reuse returns the last one, the damped forecast lies
    between them."""
    schedule = uneven_schedule(core)
    times = schedule.step_times
    a, b = torch.randn(2, 8, 4), torch.randn(2, 8, 4)
    cache = magcache_run(core, schedule, estimator, retention=0.25)  # steps 0 and 1 compute
    outputs = {}
    for step in range(5):
        x = torch.randn(2, 8, 4)
        call = cache.begin(sigma(schedule, step, 2), ("c", "u"), (0, 1), x)
        if call.skip:
            outputs[step] = (x, call.cached_output)
        else:
            cache.finish(call, x + a + b * times[step])
    assert sorted(outputs) == [2, 3, 4]
    for step, (x, cached) in outputs.items():
        exact, reused = x + a + b * times[step], x + a + b * times[1]
        if estimator == "forecast":
            torch.testing.assert_close(cached, exact)
        elif estimator == "reuse":
            torch.testing.assert_close(cached, reused)
        else:
            h = (times[step] - times[1]) / (times[1] - times[0])
            gain = core.estimators.damped_gain(h, 0.5)
            torch.testing.assert_close(cached, x + a + b * (times[1] + gain * (times[1] - times[0])))
    stats = cache.close()
    assert stats.rows_computed == 4 and stats.rows_skipped == 6 and stats.estimator != ""


def test_the_magcache_error_follows_the_estimator(core):
    """A residual whose magnitude grows linearly in model time: reusing it errs by how far it
    grew, a first-order forecast not at all; so at one threshold the forecast skips more."""
    steps = 20
    schedule = core.RunSchedule.from_sigmas([1 - i / steps for i in range(steps + 1)])
    magnitude = [1.0 + 2.0 * i / steps for i in range(steps)]
    ratios = core.MagRatios.from_table([1.0] + [magnitude[i] / magnitude[i - 1] for i in range(1, steps)],
                                       calibrated_steps=steps, interleaved=False)
    errors = {}
    for name in ("reuse", "forecast"):
        policy = core.MagCachePolicy(schedule, ratios, 10.0, 100, 0.0, estimator=core.EstimatorSpec(name).build())
        state = policy.new_state(0)
        for step in range(6):
            policy.decide(state, step, None)
            policy.record(state, step, skipped=step >= 2)
        errors[name] = state.error
    expected_reuse = sum(abs(magnitude[s] / magnitude[1] - 1) for s in range(2, 6))
    assert errors["reuse"] == pytest.approx(expected_reuse)
    assert errors["forecast"] == pytest.approx(0.0, abs=1e-12)

    patterns = {}
    for name in ("reuse", "forecast"):
        cache = magcache_run(core, schedule, name, ratios=ratios, threshold=0.15)
        for step in range(steps):
            call = cache.begin(sigma(schedule, step), ("c",), (0,), torch.zeros(1, 2, 2))
            if not call.skip:
                cache.finish(call, torch.full((1, 2, 2), magnitude[step]))
        patterns[name] = cache.close().branches[0].pattern
    assert patterns["forecast"].count("S") > patterns["reuse"].count("S") > 0, patterns


def test_the_teacache_error_follows_the_estimator(core):
    """A constant rate of change: reuse accumulates it, a first-order forecast follows it."""
    steps = 12
    schedule = core.RunSchedule.from_sigmas([1 - i / steps for i in range(steps + 1)])
    patterns = {}
    for name in ("reuse", "forecast"):
        policy = core.TeaCachePolicy(schedule, 0.25, None, max_consecutive_skips=100,
                                     estimator=core.EstimatorSpec(name).build())
        state = policy.new_state(0)
        pattern = ""
        for step in range(steps):
            skip = policy.decide(state, step, 0.1 if step else None)
            policy.record(state, step, skip)
            pattern += "S" if skip else "C"
        patterns[name] = pattern
    assert patterns["reuse"] == "CSSCSSCSSCSC"  # 0.1, 0.2 under 0.25; 0.3 computes; the last step computes
    assert patterns["forecast"] == "CSSC" + "S" * 7 + "C"  # once two steps computed, the path is known


def test_separate_branches_compute_only_the_branch_that_must(core):
    steps = 8
    schedule = core.RunSchedule.from_sigmas([1 - i / steps for i in range(steps + 1)])
    # cond's residual grows fast (it must compute), uncond's holds (it may skip).
    ratios = core.MagRatios.from_table([1.0, 1.0] + [1.5, 1.0] * (steps - 1), calibrated_steps=steps,
                                       interleaved=True)
    cache = magcache_run(core, schedule, ratios=ratios, threshold=0.3)
    x = torch.randn(2, 3, 4)
    call = cache.begin(sigma(schedule, 0, 2), ("c", "u"), (0, 1), x)
    cache.finish(call, x + 1)
    assert cache.plan_branches(sigma(schedule, 1, 2), [["c"], ["u"]]) == [[0], [1]]
    cond = cache.begin(sigma(schedule, 1, 2), ("c",), (0,), x[:1])
    assert not cond.skip
    cache.finish(cond, x[:1] + 5)
    uncond = cache.begin(sigma(schedule, 1, 2), ("u",), (1,), x[1:])
    assert uncond.skip and torch.equal(uncond.cached_output, x[1:] + 1)
    # Residuals are kept per entry: a batched call after the split uses both.
    assert cache.plan_branches(sigma(schedule, 2, 2), [["c"], ["u"]]) == [[0], [1]]
    stats = cache.close()
    assert stats.rows_computed == 3 and stats.rows_skipped == 1
    assert [b.pattern for b in stats.branches] == ["CC", "CS"]

    # Together, the batch computes because cond must.
    cache = magcache_run(core, schedule, ratios=ratios, threshold=0.3)
    for step in range(2):
        call = cache.begin(sigma(schedule, step, 2), ("c", "u"), (0, 1), x)
        assert not call.skip
        cache.finish(call, x + 1)
    # Nothing to split when both decide alike, or with one branch (cfg 1).
    assert cache.plan_branches(sigma(schedule, 3, 2), [["c"], []]) is None


def test_teacache_branches_each_get_their_own_call(core):
    steps = 12
    schedule = core.RunSchedule.from_sigmas([1 - i / steps for i in range(steps + 1)])
    policy = core.TeaCachePolicy(schedule, 0.3, None)
    cache = core.RunCache(schedule, policy)
    assert cache.plan_branches(sigma(schedule, 3), [["c"], ["u"]]) == [[0], [1]]
    cache.disable("test")
    assert cache.plan_branches(sigma(schedule, 3), [["c"], ["u"]]) is None


def test_the_first_block_check_skips_only_where_the_head_block_agrees(core):
    schedule = core.RunSchedule.from_sigmas([1 - i / 8 for i in range(9)])
    cache = magcache_run(core, schedule, check=core.checks.FirstBlockCheck(0.1), head_cost=0.25)
    head = torch.randn(1, 6, 4)

    def call_at(step: int, head_scale: float) -> object:
        x = torch.randn(1, 6, 4)
        call = cache.begin(sigma(schedule, step), ("c",), (0,), x)
        call = cache.after_head(call, x + head * head_scale)
        if not call.skip:
            cache.finish(call, x + 2)
        return call, x

    call, _ = call_at(0, 1.0)  # no residual yet: computes, keeps the head block's residual
    assert not call.skip and not call.checking
    call, x = call_at(1, 1.0)  # the head block's residual as forecast (reuse): skips
    assert call.skip
    torch.testing.assert_close(call.cached_output, x + 2)
    call, _ = call_at(2, 3.0)  # the head block's residual moved: computes
    assert not call.skip
    stats = cache.close()
    assert stats.branches[0].pattern == "CSC"
    assert stats.rows_checked == 1 and stats.head_cost == 0.25
    assert stats.row_speedup == pytest.approx(3 / (2 + 0.25))


def test_no_branch_keeps_more_than_order_plus_one_residuals(core):
    """Layouts change during a run (batched, then a branch alone): each conditioning entry still
    keeps at most the estimator's order + 1 residuals, in slots allocated once."""
    steps = 16
    schedule = core.RunSchedule.from_sigmas([1 - i / steps for i in range(steps + 1)])
    for name, order, bound in (("reuse", 1, 1), ("forecast", 1, 2), ("forecast", 2, 3), ("damped_forecast", 1, 2)):
        policy = core.policies.NeverSkipPolicy(schedule)
        policy.estimator = core.EstimatorSpec(name, order=order).build()
        cache = core.RunCache(schedule, policy, calibrating=True)
        for step in range(steps):
            layouts = [(("c", "u"), (0, 1))] if step % 3 else [(("c",), (0,)), (("u",), (1,))]
            for keys, branches in layouts:
                x = torch.randn(len(keys), 4, 2)
                call = cache.begin(sigma(schedule, step, len(keys)), keys, branches, x)
                cache.finish(call, x + step)
            per_branch = {}
            for kind, branch, _ in cache.held_tensors():
                per_branch[branch] = per_branch.get(branch, 0) + (kind == "residual")
            assert max(per_branch.values()) <= bound, (name, order, step, per_branch)
        assert {len(e.history.slots) for e in cache._entries.values()} == {bound}
        cache.close()


def test_offloaded_history_feeds_the_forecast(core):
    """cache_device on another device than the stack: residuals are computed beside the stack,
    copied into the kept slots, and brought back for the estimate. (This machine has no
    accelerator; an explicit CPU device index stands in for the other device.)"""
    schedule = uneven_schedule(core)
    other = torch.device("cpu", 0)
    cache = magcache_run(core, schedule, "forecast", retention=0.25, cache_device=other)
    assert other != torch.device("cpu")
    times = schedule.step_times
    a, b = torch.randn(1, 4, 2), torch.randn(1, 4, 2)
    for step in range(3):
        x = torch.randn(1, 4, 2)
        call = cache.begin(sigma(schedule, step), ("c",), (0,), x)
        if call.skip:
            torch.testing.assert_close(call.cached_output, x + a + b * times[step])
        else:
            cache.finish(call, x + a + b * times[step])
    (entry,) = cache._entries.values()
    assert entry.history.count == 2 and entry.history.offload_device == other
    assert cache.close().rows_skipped == 1


@pytest.mark.parametrize(("jump", "pattern", "refused"), [(1.0, "CCCSSS", 0), (5.0, "CCCCSS", 1)])
def test_the_hindsight_check_refuses_a_skip_after_a_wrong_estimate(core, jump, pattern, refused):
    """Every computed call measures what the estimator would have returned for it; a skip is
    refused right after an estimate that was off by more than the tolerance."""
    steps = 6
    schedule = core.RunSchedule.from_sigmas([1 - i / steps for i in range(steps + 1)])
    cache = magcache_run(core, schedule, retention=0.5, check=core.checks.HindsightCheck(0.1))  # 0-2 compute
    residuals = {0: 1.0, 1: 1.0, 2: jump, 3: jump}
    for step in range(steps):
        x = torch.randn(1, 3, 2)
        call = cache.begin(sigma(schedule, step), ("c",), (0,), x)
        if not call.skip:
            cache.finish(call, x + residuals[step])
    (entry,) = cache._entries.values()
    stats = cache.close()
    assert stats.branches[0].pattern == pattern and stats.refused == refused and stats.check == "hindsight"
    assert entry.measured.error is None  # freed with the run


def test_the_hindsight_check_scales_the_measured_error_to_the_gap(core):
    """The error measured over one gap predicts a skip's error over another by the estimator's
    order of error: reuse errs in proportion to the gap, a first-order forecast to its square."""
    check = core.checks.HindsightCheck(0.1)
    for order, allowed_two_steps_on in ((1, True), (2, False)):  # reuse, forecast
        assert check.allows_at_decision(0.03, 0.1, 0.1, order)  # one step on: 0.03
        # two steps on: 0.06 (reuse) or 0.12 (forecast)
        assert check.allows_at_decision(0.03, 0.1, 0.2, order) is allowed_two_steps_on
    assert check.allows_at_decision(None, 0.0, 0.2, 2)  # nothing measured yet
    assert core.checks.FirstBlockCheck(0.1).allows_at_decision(5.0, 0.1, 0.2, 2)  # not its point


def test_a_measured_error_is_read_once(core):
    """The measurement stays a tensor until the next decision reads it (the one host sync), and
    that read is the only one reported fresh, so the policy observes each measurement once."""
    measured = core.measurement.MeasuredError()
    assert measured.read() == (None, False)
    measured.error = torch.tensor(0.25)
    assert measured.read() == (0.25, True)
    assert measured.read() == (0.25, False)
