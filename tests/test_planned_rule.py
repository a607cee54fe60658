"""ApplyMagCache's planned rule in the real ComfyUI: a calibration measures skip errors, the rule
plans each run's computed steps from them at that run's own step count, and bad setups are
refused when the node runs, with the fix named."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def flux(host):
    return host.test_module("tiny_models").build_model("flux", seed=11)


@pytest.fixture(scope="module")
def calibration(host, flux):
    from harness.sampling import Job, calibrate

    return calibrate("MagCacheCalibrate", flux, Job("flux", steps=16))[1]


def test_a_calibration_measures_what_skipping_costs_on_the_guided_residual(calibration):
    assert calibration.cfg == pytest.approx(calibration.cfg) and calibration.cfg > 1.0
    measured = {(e.step, e.order) for e in calibration.skip_errors}
    # Every step after the first has reuse errors, every step after the second forecast errors.
    assert {s for s, order in measured if order == 0} == set(range(1, 16))
    assert {s for s, order in measured if order == 1} == set(range(2, 16))
    assert all(e.error > 0.0 for e in calibration.skip_errors)
    for order in (0, 1):
        model = calibration.error_model(order)
        assert model is not None and 0.0 < model.alpha < 4.0


def test_a_calibration_measures_the_residual_paths_moments_at_every_step(calibration):
    """The second moments of the guided residual between every pair of steps: a valid Gram matrix
    over the calibrated schedule, from which the optimal_linear weights are solved."""
    import numpy as np

    moments = calibration.moments
    assert moments is not None and moments.validate() is None
    assert moments.progress == calibration.schedule.progress
    gram = moments.gram(moments.progress)
    assert np.all(np.linalg.eigvalsh(gram) > -1e-9) and np.all(np.diag(gram) > 0.0)
    weights, error = moments.predict(moments.progress[8:10], moments.progress[10])
    assert len(weights) == 2 and 0.0 <= error < 1.0


@pytest.mark.parametrize("estimator", ["reuse", "forecast", "optimal_linear"])
def test_runs_skip_the_planned_steps_at_any_step_count(host, flux, calibration, estimator):
    from harness.sampling import Job, apply, stats

    planning = host.pack_module("cache_core.planning")
    for steps in (12, 16, 30):
        skipped = []
        for budget in (0.5, 5.0, 50.0):
            patched, node_id = apply(flux, "magcache", threshold=budget, max_consecutive_skips=3,
                                     retention_ratio=0.2, ratios=calibration, skip_rule="planned",
                                     estimator=estimator)
            Job("flux", steps=steps).run(patched)
            run = stats(node_id)
            assert run["method"] == planning.PlannedPolicy.name
            if run["disabled_reason"] is not None:
                assert "allows no skip" in run["disabled_reason"]
                skipped.append(0)
                continue
            cond, uncond = (b["pattern"] for b in run["branches"])
            assert cond == uncond and len(cond) == steps  # the branches skip together
            assert "SSSS" not in cond and cond.startswith("CC")
            skipped.append(cond.count("S"))
        # A larger budget skips more.
        assert skipped == sorted(skipped) and skipped[0] < skipped[-1], (steps, skipped)


def test_a_budget_too_small_for_any_skip_says_so(host, flux, calibration):
    from harness.sampling import Job, apply, stats

    patched, node_id = apply(flux, "magcache", threshold=1e-6, ratios=calibration, skip_rule="planned")
    Job("flux", steps=12).run(patched)
    assert "allows no skip in this run's 12 steps" in stats(node_id)["disabled_reason"]


def test_budget_zero_never_skips_and_is_bit_identical(host, flux, calibration):
    import torch

    from harness.sampling import Job, apply, stats

    job = Job("flux", steps=12)
    patched, node_id = apply(flux, "magcache", threshold=0.0, ratios=calibration, skip_rule="planned")
    assert torch.equal(job.run(patched), job.run(flux))
    assert all("S" not in b["pattern"] for b in stats(node_id)["branches"] or [{"pattern": ""}])


def test_the_planned_rule_without_this_models_calibration_is_refused(host, flux):
    from harness.sampling import apply

    with pytest.raises(ValueError, match="skip_rule planned needs this model's calibration"):
        apply(flux, "magcache", threshold=1.0, variant="flux.1-dev", skip_rule="planned")


def test_an_old_calibration_without_skip_errors_asks_for_a_new_one(host, flux, calibration):
    import dataclasses

    from harness.sampling import apply

    old = dataclasses.replace(calibration, skip_errors=(), cfg=None)
    with pytest.raises(ValueError, match="calibrate again"):
        apply(flux, "magcache", threshold=1.0, ratios=old, skip_rule="planned")
    with pytest.raises(ValueError, match="forecast_order to 1"):
        apply(flux, "magcache", threshold=1.0, ratios=calibration, skip_rule="planned", estimator="forecast",
              forecast_order=2)
