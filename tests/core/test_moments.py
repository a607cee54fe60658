"""Optimal linear prediction from a calibration's residual moments (cache_core/moments.py and the
optimal_linear estimator): the closed-form weights and errors, their interpolation to other step
counts, the recorder that measures the moments, the planner that charges them, and the JSON."""

from __future__ import annotations

import importlib

import numpy as np
import pytest
import torch


@pytest.fixture
def moments(core):
    return importlib.import_module(core.__name__ + ".moments")


def path_gram(path: torch.Tensor) -> np.ndarray:
    """G_ij = mean over values of r_i r_j, as the recorder averages it."""
    flat = path.reshape(path.shape[0], -1).double()
    return (flat @ flat.T / flat.shape[1]).numpy()


def expected_error(gram: np.ndarray, weights, anchors: list[int], target: int) -> float:
    """Relative L2 error of any weights on the anchors, from the Gram matrix."""
    w = np.asarray(weights)
    g = gram[np.ix_(anchors, [target])][:, 0]
    square = gram[target, target] - 2 * w @ g + w @ gram[np.ix_(anchors, anchors)] @ w
    return float(np.sqrt(max(square, 0.0) / gram[target, target]))


def test_on_a_straight_path_the_optimal_weights_are_the_forecast_and_err_nothing(core, moments):
    progress = [(i / 10) ** 1.2 for i in range(10)]  # unevenly spaced
    a, b = torch.randn(64), torch.randn(64)
    path = torch.stack([a + b * p for p in progress])
    fitted = moments.ResidualMoments.from_gram(progress, path_gram(path))
    for anchors, target in (([3, 4], 5), ([2, 4], 7), ([6, 7], 9)):
        weights, error = fitted.predict([progress[i] for i in anchors], progress[target])
        forecast = core.estimators.lagrange_weights([progress[i] for i in anchors], progress[target])
        assert weights == pytest.approx(forecast, abs=1e-3)
        assert error < 1e-3


def test_the_optimal_weights_beat_reuse_and_the_forecast_on_a_rough_path(core, moments):
    """On a path with noise around a trend, the closed-form weights err less than reuse and the
    first-order forecast (by the same Gram arithmetic), and their error is what they predict."""
    generator = torch.Generator().manual_seed(0)
    progress = [i / 12 for i in range(12)]
    a, b = torch.randn(4096, generator=generator), torch.randn(4096, generator=generator)
    path = torch.stack([a + b * p + 0.3 * torch.randn(4096, generator=generator) for p in progress])
    gram = path_gram(path)
    fitted = moments.ResidualMoments.from_gram(progress, gram)
    for anchors, target in (([4, 5], 6), ([4, 5], 8), ([7, 9], 11)):
        times = [progress[i] for i in anchors]
        weights, error = fitted.predict(times, progress[target])
        assert error == pytest.approx(expected_error(gram, weights, anchors, target), rel=1e-3, abs=1e-6)
        assert error <= expected_error(gram, (0.0, 1.0), anchors, target) + 1e-9
        forecast = core.estimators.lagrange_weights(times, progress[target])
        assert error <= expected_error(gram, forecast, anchors, target) + 1e-9


def test_the_moments_interpolate_to_another_step_count(moments):
    """At the calibrated steps the Gram comes back exactly; between them it is a blend, and a run
    at another step count gets weights close to those of the nearest calibrated gaps."""
    progress = [i / 20 for i in range(20)]
    a, b, c = torch.randn(256), torch.randn(256), torch.randn(256)
    path = torch.stack([a + b * p + c * p * p for p in progress])
    gram = path_gram(path)
    fitted = moments.ResidualMoments.from_gram(progress, gram)
    assert fitted.gram(progress) == pytest.approx(gram / gram.diagonal().max(), rel=1e-6, abs=1e-12)
    assert fitted.validate() is None
    # 30 steps on the same path: a smooth path, so the interpolated prediction is still near exact.
    weights, error = fitted.predict([0.5, 0.5333], 0.5667)
    assert error < 0.02
    assert sum(weights) == pytest.approx(1.0, abs=0.05)


def test_the_estimator_solves_once_per_gap_and_falls_back_without_a_calibration(core, moments):
    estimators = core.estimators
    progress = [i / 8 for i in range(8)]
    a, b = torch.randn(32), torch.randn(32)
    fitted = moments.ResidualMoments.from_gram(progress, path_gram(torch.stack([a + b * p for p in progress])))
    calibrated = estimators.EstimatorSpec("optimal_linear", moments=fitted).build()
    assert calibrated.residuals_kept == 2 and "calibrated" in calibrated.describe()
    assert calibrated.weights([0.25, 0.375], 0.5) == pytest.approx((-1.0, 2.0), abs=1e-3)
    assert len(calibrated._solved) == 1
    calibrated.weights([0.25, 0.375], 0.5)
    assert len(calibrated._solved) == 1
    assert calibrated.error_model.order == 1
    plain = estimators.EstimatorSpec("optimal_linear").build()
    damped = estimators.EstimatorSpec("damped_forecast", damping=0.5).build()
    assert plain.weights([0.25, 0.375], 0.625) == damped.weights([0.25, 0.375], 0.625)
    assert plain.error_model is None and "no calibration" in plain.describe()


def test_the_planner_charges_the_exact_errors(core, moments):
    """plan_skips with the moments' error model: within the budget, by the model's own errors,
    and more skips for a larger budget."""
    planning = core.planning
    generator = torch.Generator().manual_seed(1)
    progress = [i / 16 for i in range(16)]
    a, b = torch.randn(512, generator=generator), torch.randn(512, generator=generator)
    path = torch.stack([a + b * p + 0.05 * torch.randn(512, generator=generator) for p in progress])
    model = moments.MomentErrorModel(moments.ResidualMoments.from_gram(progress, path_gram(path)), order=1)
    retained = [i < 3 for i in range(16)]
    skipped_counts = []
    for budget in (0.05, 0.3, 1.0):
        plan = planning.plan_skips(progress, model, budget, 3, retained)
        computed = [s for s, skipped in enumerate(plan) if not skipped]
        spent = sum(model.error(progress[s], [progress[c] for c in computed if c < s])
                    for s, skipped in enumerate(plan) if skipped)
        assert spent <= budget + 1e-12
        skipped_counts.append(sum(plan))
    assert skipped_counts == sorted(skipped_counts) and skipped_counts[-1] > skipped_counts[0]


def test_the_recorder_measures_the_moments_of_the_combined_residual(core):
    calibration = importlib.import_module(core.__name__ + ".calibration")
    schedule = core.RunSchedule(sigmas=tuple(1.0 - i / 6 for i in range(7)), progress=tuple(i / 6 for i in range(7)))
    recorder = calibration.ResidualRecorder(cfg=3.0)
    recorder.start(schedule)
    cond = [torch.randn(2, 8, 4) for _ in range(6)]
    uncond = [torch.randn(2, 8, 4) for _ in range(6)]
    for step in range(6):
        recorder.residual(step, (0, 1), torch.cat([cond[step], uncond[step]]))
    recorder.finish()
    measured = recorder.moments()
    combined = torch.stack([3.0 * c - 2.0 * u for c, u in zip(cond, uncond, strict=True)])
    flat = combined.reshape(6, 2, -1).double()
    gram = torch.einsum("irn,jrn->ij", flat, flat).numpy() / (2 * flat.shape[2])
    assert measured.gram(schedule.progress[:6]) == pytest.approx(gram / gram.diagonal().max(), rel=1e-6)


def test_a_calibration_keeps_its_moments_through_json_and_refuses_broken_ones(core, moments):
    calibration = importlib.import_module(core.__name__ + ".calibration")
    progress = tuple(i / 12 for i in range(12))
    path = torch.stack([torch.randn(16) + p for p in progress])
    fitted = moments.ResidualMoments.from_gram(progress, path_gram(path))
    records = tuple(calibration.StepRecord(step=s, branch=0, magnitude_ratio=1.0, ratio_spread=0.0,
                                           cosine_distance=0.01, residual_change=0.1) for s in range(1, 12))
    made = calibration.Calibration(
        method="magcache", model=calibration.ModelIdentity("flux", "flux", "Flux", 64, "f" * 64),
        schedule=calibration.ScheduleInfo(12, "euler", "simple", 1.0, progress), records=records, moments=fitted)
    again = calibration.Calibration.from_json(made.to_json())
    assert again.moments == fitted
    method = core.MagCacheConfig(threshold=0.1, estimator=core.EstimatorSpec("optimal_linear"))
    assert method.with_calibration(again).estimator.moments == fitted
    old = made.to_json() | {"version": 2}
    del old["moments"]
    assert calibration.Calibration.from_json(old).moments is None
    for broken, message in (
        (lambda m: m.update(coordinates=m["coordinates"][:-1]), "every step"),
        (lambda m: m["coordinates"][2].pop(), "one row per step"),
        (lambda m: m["coordinates"][0].__setitem__(0, float("nan")), "not finite"),
        (lambda m: m["progress"].reverse(), "must increase"),
    ):
        data = made.to_json()
        data["moments"] = {key: [list(r) if isinstance(r, tuple) else r for r in value]
                           for key, value in data["moments"].items()}
        broken(data["moments"])
        with pytest.raises(calibration.CalibrationError, match=message):
            calibration.Calibration.from_json(data)
