"""The measured-error rule on its own (no ComfyUI): what the quality levels run.

Every computed call measures what the estimator would have returned for it; the rule fits the
run's error growth from those measurements and skips while the predicted error of a skip is within
the tolerance.
"""

from __future__ import annotations

import torch


def measured_run(core, steps=12, tolerance=0.1, k=3, retention=0.0, estimator="forecast", cfg=None,
                 guidance_reference=None, guided=True, guided_error_weight=0.0, guidance_power=1.0,
                 tolerance_without_feedback=None, output_space_factor=1.0):
    schedule = core.RunSchedule.from_sigmas([1 - i / steps for i in range(steps + 1)])
    policy = core.policies.MeasuredErrorPolicy(schedule, tolerance, k, retention,
                                               estimator=core.EstimatorSpec(estimator).build(),
                                               guidance_reference=guidance_reference, guided=guided,
                                               guided_error_weight=guided_error_weight,
                                               guidance_power=guidance_power,
                                               tolerance_without_feedback=tolerance_without_feedback,
                                               output_space_factor=output_space_factor)
    return schedule, core.RunCache(schedule, policy, cfg=cfg)


def sigma(schedule, step, rows=1):
    return torch.tensor([schedule.sigmas[step]] * rows)


def drive(cache, schedule, residual_at, keys=("c",), branches=(0,)):
    """Run every step with a stack whose residual is ``residual_at(step, entry index)``; returns
    the pattern and, per skipped step, the estimate's error against that residual."""
    errors = {}
    for step in range(schedule.steps):
        x = torch.randn(len(keys), 8, 4)
        true = torch.cat([residual_at(step, i).expand(1, 8, 4) for i in range(len(keys))])
        call = cache.begin(sigma(schedule, step, len(keys)), keys, branches, x)
        if call.skip:
            errors[step] = float((call.cached_output - x - true).abs().mean() / true.abs().mean())
        else:
            cache.finish(call, x + true)
    return cache.close(), errors


def test_a_residual_the_forecast_follows_exactly_skips_up_to_k_after_the_first_measurement(core):
    schedule, cache = measured_run(core, tolerance=0.05, k=3)
    stats, errors = drive(cache, schedule, lambda step, _: torch.tensor(1.0 + 0.5 * step / 12))
    # Two computed steps anchor the forecast, the third measures it (error 0): then runs of 3 skips,
    # and the last step always computes.
    assert stats.branches[0].pattern == "CCCSSSCSSSCC"
    assert max(errors.values()) < 1e-5


def test_a_measured_error_over_the_tolerance_stops_the_skips(core):
    # The residual turns sharply at every step: the measured error stays far over the tolerance.
    schedule, cache = measured_run(core, tolerance=0.05, k=3)
    stats, _ = drive(cache, schedule, lambda step, _: torch.tensor((-1.0) ** step * (1 + step)))
    assert stats.branches[0].pattern == "C" * 12


def test_the_tolerance_bounds_the_error_of_the_skips_it_allows(core):
    """A residual on a curve: the skips the rule allows err by about the tolerance at most, and a
    larger tolerance allows more skips."""
    curve = lambda step, _: torch.tensor(1.0 + (step / 12) ** 2 * 3)  # noqa: E731
    skipped = []
    for tolerance in (0.01, 0.05, 0.2):
        schedule, cache = measured_run(core, tolerance=tolerance, k=4)
        stats, errors = drive(cache, schedule, curve)
        assert all(e <= 2 * tolerance for e in errors.values()), (tolerance, errors)
        skipped.append(stats.branches[0].steps_skipped)
    assert skipped == sorted(skipped) and skipped[-1] > skipped[0]


def test_tolerance_zero_never_skips(core):
    _, cache = measured_run(core, tolerance=0.0)
    assert not cache.enabled
    assert "never skip" in cache.disabled_reason


def test_both_cfg_branches_are_measured_on_the_guided_residual_and_decide_together(core):
    """With the guidance scale known, a call holding cond and uncond measures the error of
    cfg * cond - (cfg - 1) * uncond: here each branch alone is forecast badly, but their errors
    cancel in the guided residual, so both skip, at the same steps."""
    cfg = 3.0

    def residual(step, index):
        wobble = 0.3 * (-1.0) ** step  # what the forecast cannot follow, in both branches alike
        if index == 0:
            return torch.tensor(1.0 + 0.1 * step + wobble)
        return torch.tensor(1.5 + 0.1 * step + wobble * cfg / (cfg - 1))

    schedule, cache = measured_run(core, tolerance=0.05, k=1, cfg=cfg)
    stats, _ = drive(cache, schedule, residual, keys=("c", "u"), branches=(0, 1))
    cond, uncond = stats.branches
    assert cond.pattern == uncond.pattern and cond.steps_skipped > 0
    # Without the guidance scale each branch is measured alone, and the wobble refuses every skip.
    schedule, cache = measured_run(core, tolerance=0.05, k=1)
    stats, _ = drive(cache, schedule, residual, keys=("c", "u"), branches=(0, 1))
    assert stats.branches[0].steps_skipped == 0


def test_a_higher_guidance_scale_than_the_reference_tightens_the_tolerance_in_proportion(core):
    """The sampler's cfg * cond - (cfg - 1) * uncond carries each branch's error amplified by about
    cfg, so a level chosen at cfg 4 runs at cfg 8 with half its tolerance; at or below the reference,
    without a guidance scale, or without a reference, the tolerance is as given."""
    for cfg, reference, tolerance in ((8.0, 4.0, 0.05), (4.0, 4.0, 0.1), (2.0, 4.0, 0.1), (None, 4.0, 0.1),
                                      (8.0, None, 0.1)):
        _, cache = measured_run(core, tolerance=0.1, cfg=cfg, guidance_reference=reference)
        assert abs(cache.policy.tolerance - tolerance) < 1e-12, (cfg, reference)
        assert cache.policy.guidance_note == ("tolerance x0.50 at cfg 8" if tolerance == 0.05 else None)


def test_the_guidance_power_sets_how_far_a_higher_scale_tightens_the_tolerance(core):
    """x (reference / cfg) ** power: at power 0.5 a run at four times the reference scale gets half
    the tolerance; at the reference scale the power changes nothing."""
    for cfg, power, tolerance in ((16.0, 0.5, 0.05), (16.0, 1.0, 0.025), (4.0, 0.5, 0.1)):
        _, cache = measured_run(core, tolerance=0.1, cfg=cfg, guidance_reference=4.0, guidance_power=power)
        assert abs(cache.policy.tolerance - tolerance) < 1e-12, (cfg, power)


def test_a_run_without_skip_feedback_gets_its_own_tolerance_scaled_as_the_guidance_scales_it(core):
    """Where the feedback does not run the tolerance is ``tolerance_without_feedback``, times the
    guidance factor; where it runs, or with none set, the tolerance is untouched and nothing is noted."""
    for active, without, cfg, tolerance, note in (
        (False, 0.05, None, 0.05, "tolerance x0.50 without it"),
        (False, 0.05, 8.0, 0.025, "tolerance x0.50 without it"),
        (True, 0.05, 8.0, 0.05, None),
        (False, None, None, 0.1, None),
        (False, 0.1, None, 0.1, None),
    ):
        _, cache = measured_run(core, tolerance=0.1, cfg=cfg, guidance_reference=4.0,
                                tolerance_without_feedback=without)
        cache.policy.use_feedback(active)
        assert abs(cache.policy.tolerance - tolerance) < 1e-12, (active, without, cfg)
        assert cache.policy.feedback_note == note, (active, without, cfg)


def test_output_space_takes_its_factor_on_top_of_the_other_scalings(core):
    """Cached in output space, the tolerance (already scaled for the guidance and a missing feedback) is
    times ``output_space_factor``, and the run says so; a factor of 1 leaves it and notes nothing."""
    for factor, tolerance in ((0.5, 0.0125), (1.0, 0.025)):
        _, cache = measured_run(core, tolerance=0.1, cfg=8.0, guidance_reference=4.0,
                                tolerance_without_feedback=0.05, output_space_factor=factor)
        cache.policy.use_feedback(False)
        cache.policy.use_output_space()
        assert abs(cache.policy.tolerance - tolerance) < 1e-12, factor
        assert cache.policy.space_note == ("tolerance x0.50 in output space" if factor == 0.5 else None), factor


def test_a_tightened_tolerance_skips_fewer_steps(core):
    curve = lambda step, _: torch.tensor(1.0 + (step / 12) ** 2 * 3)  # noqa: E731
    skipped = {}
    for cfg in (4.0, 16.0):
        schedule, cache = measured_run(core, tolerance=0.2, k=4, cfg=cfg, guidance_reference=4.0)
        stats, errors = drive(cache, schedule, curve)
        assert all(e <= 2 * 0.2 * 4.0 / cfg for e in errors.values()), (cfg, errors)
        skipped[cfg] = stats.branches[0].steps_skipped
    assert skipped[16.0] < skipped[4.0], skipped


def test_measured_per_branch_each_branch_is_charged_at_least_its_share_of_the_guided_error(core):
    """Each branch alone is forecast well, but their small errors do not cancel in cfg * cond -
    (cfg - 1) * uncond, which is also smaller than either: the guided residual's error is large.
    Per branch alone, the rule skips; with the guided error counted at half, it does not; without a
    guidance scale there is no guided residual to measure, and the weight changes nothing."""
    cfg = 3.0

    def residual(step, index):
        wobble = 0.02 * (-1.0) ** step
        return torch.tensor(1.0 + 0.1 * step + wobble if index == 0 else 1.4 + 0.1 * step - wobble)

    skipped = {}
    for weight, scale in ((0.0, cfg), (0.5, cfg), (0.5, None)):
        schedule, cache = measured_run(core, tolerance=0.1, k=1, cfg=scale, guided=False,
                                       guided_error_weight=weight)
        stats, _ = drive(cache, schedule, residual, keys=("c", "u"), branches=(0, 1))
        skipped[weight, scale] = stats.branches[0].steps_skipped
    assert skipped[0.0, cfg] > 0 and skipped[0.5, cfg] == 0 and skipped[0.5, None] == skipped[0.0, cfg], skipped


def test_the_guided_share_charges_each_branch_the_larger_of_its_own_and_the_guided_error(core):
    measurement = core.measurement
    history = core.history
    kept = [history.ResidualHistory(1), history.ResidualHistory(1)]
    for h, value in zip(kept, (1.0, 2.0), strict=True):
        h.keep(torch.full((1, 4), value), 0.0)
    residual = torch.cat([torch.full((1, 4), 1.1), torch.full((1, 4), 2.0)])  # cond off by 0.1, uncond exact
    reuse = lambda times, time: [1.0]  # noqa: E731
    cfg = 3.0
    own_cond = 0.1 / 1.1
    guided = cfg * 0.1 / abs(cfg * 1.1 - (cfg - 1) * 2.0)  # 0.3 / 0.7
    for weight, expected in ((None, (guided, guided)), (0.5, (max(own_cond, 0.5 * guided), 0.5 * guided)),
                             (0.0, (own_cond, 0.0))):
        measured = [measurement.MeasuredError(), measurement.MeasuredError()]
        measurement.measure_estimator_error(kept, [0, 1], measured, residual.clone(), 1.0, reuse,
                                            needs_full_history=False, cfg=cfg, guided_weight=weight)
        got = tuple(m.read()[0] for m in measured)
        assert all(abs(g - e) < 1e-6 for g, e in zip(got, expected, strict=True)), (weight, got, expected)


def test_with_a_rate_memory_the_rule_waits_for_that_many_low_measurements_after_a_high_one(core):
    schedule = core.RunSchedule.from_sigmas([1 - i / 12 for i in range(13)])

    def rates(memory, errors, fall=0.0):
        policy = core.policies.MeasuredErrorPolicy(schedule, 0.1, 3, 0.0, rate_memory=memory, transient_fall=fall)
        entry = policy.new_state(0)
        seen = []
        for error in errors:
            policy.observe(entry, 0.5, error)
            seen.append(entry.rate)
        return seen

    transient = [0.4, 0.01, 0.02, 0.01]
    # The latest measurement alone: the default, what lossless, high and quality: custom run.
    assert rates(1, transient) == [0.8, 0.02, 0.04, 0.02]
    # The largest of the latest two: one low measurement after a high one does not lower the rate.
    assert rates(2, transient) == [0.8, 0.8, 0.04, 0.04]
    # ... only while one of the latest three is over twice the latest (balanced, fast): once the
    # 0.8 has left them the errors have settled, and the latest alone counts again.
    assert rates(2, transient, fall=2.0) == [0.8, 0.8, 0.04, 0.02]
    settled = [0.1, 0.12, 0.1]
    assert rates(2, settled) == [0.2, 0.24, 0.24]
    assert rates(2, settled, fall=2.0) == [0.2, 0.24, 0.2]
