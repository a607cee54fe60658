"""The planned rule on its own: the error model fitted to measured skip errors, the plan found by
dynamic programming (against exhaustive search), the recorder's measurements, and the JSON of a
calibration that carries them."""

from __future__ import annotations

import importlib
import itertools
import math
import random

import pytest
import torch


@pytest.fixture
def calibration(core):
    return importlib.import_module(core.__name__ + ".calibration")


def synthetic_errors(planning, progress, kappa, alpha, beta):
    """Skip errors that follow error = kappa(p) * forward^alpha * back^beta exactly."""
    errors = []
    for step in range(1, len(progress)):
        for forward in range(1, planning.MEASURED_FORWARD + 1):
            if step - forward < 0:
                break
            gap = progress[step] - progress[step - forward]
            errors.append(planning.SkipError(step, 0, forward, 0, kappa(progress[step]) * gap ** alpha))
            for back in range(1, planning.MEASURED_BACK + 1):
                if step - forward - back < 0:
                    break
                spacing = progress[step - forward] - progress[step - forward - back]
                errors.append(planning.SkipError(step, 1, forward, back,
                                                 kappa(progress[step]) * gap ** alpha * spacing ** beta))
    return errors


def test_the_error_model_recovers_the_exponents_and_curve_it_was_measured_with(core):
    planning = core.planning
    progress = [(i / 20) ** 1.3 for i in range(20)]  # unevenly spaced, as real schedules are

    def kappa(p):
        return 0.5 + 2.0 * (1.0 - p) ** 2

    errors = synthetic_errors(planning, progress, kappa, 1.1, 0.2)
    for order, beta in ((0, 0.0), (1, 0.2)):
        model = planning.ErrorModel.fit([e for e in errors if e.order == order or order], progress, order)
        assert model.alpha == pytest.approx(1.1, abs=1e-6)
        assert model.beta == pytest.approx(beta, abs=1e-6)
        # Between calibrated steps too, and so at another step count.
        assert model.error(0.5, [0.3, 0.4]) == pytest.approx(
            kappa(0.5) * 0.1 ** 1.1 * (0.1 ** beta if order else 1.0), rel=0.05)


def test_the_error_model_needs_measurements(core):
    planning = core.planning
    assert planning.ErrorModel.fit([], [0.0, 0.5], 0) is None


def brute_force(planning, times, model, budget, k, retained):
    """The fewest computed steps within the budget, by trying every pattern."""
    steps = len(times)
    best = None
    for pattern in itertools.product((False, True), repeat=steps - 1):
        skip = (False, *pattern)
        if any(s and r for s, r in zip(skip, retained, strict=True)):
            continue
        if any(all(skip[i:i + k + 1]) for i in range(steps - k)):
            continue
        error, computed = 0.0, []
        for step, skipped in enumerate(skip):
            if skipped:
                error += model.error(times[step], [times[s] for s in computed[-(model.order + 1):]])
            else:
                computed.append(step)
        if error <= budget and (best is None or len(computed) < best[0]):
            best = (len(computed), error)
    return best


@pytest.mark.parametrize("order", [0, 1])
def test_the_plan_is_the_fewest_computed_steps_within_the_budget(core, order):
    planning = core.planning
    rng = random.Random(order)
    times = [(i / 11) ** 1.2 for i in range(11)]
    model = planning.ErrorModel(order, tuple(times), tuple(math.log(rng.uniform(0.2, 3.0)) for _ in times),
                                alpha=1.1, beta=0.3 if order else 0.0)
    retained = [i < 2 for i in range(11)]
    for budget in (0.0, 0.1, 0.3, 0.8, 2.0):
        for k in (1, 2, 3):
            plan = planning.plan_skips(times, model, budget, k, retained)
            computed = [s for s, skipped in enumerate(plan) if not skipped]
            error = sum(model.error(times[s], [times[c] for c in computed if c < s][-(order + 1):])
                        for s, skipped in enumerate(plan) if skipped)
            expected = brute_force(planning, times, model, budget, k, retained)
            assert len(computed) == expected[0], (budget, k, plan)
            assert error <= budget + 1e-12
            assert not any(plan[:2])
            assert not any(all(plan[i:i + k + 1]) for i in range(len(plan) - k))


def test_the_recorder_measures_skip_errors_on_the_cfg_combined_residual(core, calibration):
    """A combined residual that moves on a straight line in progress: reuse errs by the step, a
    first-order forecast not at all; with cond = uncond the guidance scale cancels out."""
    schedule = core.RunSchedule(sigmas=tuple(1.0 - i / 6 for i in range(7)), progress=tuple(i / 6 for i in range(7)))
    recorder = calibration.ResidualRecorder(cfg=4.0)
    recorder.start(schedule)
    base, slope = torch.randn(1, 8, 4), torch.randn(1, 8, 4)
    for step in range(6):
        residual = base + slope * (step / 6)
        recorder.residual(step, (0, 1), torch.cat([residual, residual]))
    recorder.finish()
    errors = {(e.step, e.order, e.forward, e.back): e.error for e in recorder.skip_errors}
    assert (5, 0, 4, 0) in errors and (5, 1, 2, 2) in errors
    for (step, order, forward, _), error in errors.items():
        residual = base + slope * (step / 6)
        if order:
            assert error == pytest.approx(0.0, abs=1e-5)
        else:
            expected = (slope * (forward / 6)).norm() / residual.norm()
            assert error == pytest.approx(float(expected), rel=1e-4)


def test_a_calibration_keeps_its_skip_errors_through_json_and_old_ones_still_load(core, calibration):
    progress = tuple(i / 12 for i in range(12))
    records = tuple(calibration.StepRecord(step=s, branch=0, magnitude_ratio=1.0, ratio_spread=0.0,
                                             cosine_distance=0.01, residual_change=0.1) for s in range(1, 12))
    errors = tuple(synthetic_errors(core.planning, progress, lambda p: 1.0, 1.0, 0.1))
    made = calibration.Calibration(
        method="magcache", model=calibration.ModelIdentity("flux", "flux", "Flux", 64, "f" * 64),
        schedule=calibration.ScheduleInfo(12, "euler", "simple", 1.0, progress), records=records,
        skip_errors=errors, cfg=4.0)
    again = calibration.Calibration.from_json(made.to_json())
    assert again.skip_errors == errors and again.cfg == 4.0
    assert again.error_model(1).alpha == pytest.approx(1.0, abs=1e-6)
    old = made.to_json() | {"version": 1}
    del old["skip_errors"], old["cfg"]
    assert calibration.Calibration.from_json(old).error_model(0) is None
    bad = made.to_json()
    bad["skip_errors"][0]["error"] = float("nan")
    with pytest.raises(core.methods.CalibrationError, match="non-finite skip error"):
        calibration.Calibration.from_json(bad)
