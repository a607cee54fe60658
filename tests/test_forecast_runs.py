"""Estimators, separate CFG branches and the first-block check in ComfyUI's real samplers, on every
family (tiny random-weight models; the reference model's quality is the benchmark's business)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch

# Parametrized over the tiny model registry (tests/conftest.py): ``tiny_family`` is every tiny
# model this ComfyUI builds.

# The Apply nodes' shared inputs, each variant away from the defaults.
VARIANTS = {
    "forecast o1": dict(estimator="forecast"),
    "forecast o2": dict(estimator="forecast", forecast_order=2),
    "damped": dict(estimator="damped_forecast", forecast_damping=0.3),
    "separate": dict(cfg_branches="separate"),
    # A check no step passes: every call runs its head block, then computes from its output.
    "strict first-block": dict(check="first_block", check_tolerance=0.0),
    "lenient first-block": dict(check="first_block", check_tolerance=10.0),
    "hindsight": dict(estimator="forecast", check="hindsight", check_tolerance=0.3),
    "all": dict(estimator="damped_forecast", cfg_branches="separate", check="hindsight", check_tolerance=10.0),
}
FORCED_SKIP = dict(threshold=5.0, max_consecutive_skips=100, retention_ratio=0.0)


def caches_in_output_space(family: str) -> bool:
    from harness.sampling import pack, tiny

    return pack("families").family_for(tiny().build_model(family, seed=0).model).caches_in_output_space


def ratios_for(family: str) -> dict:
    from harness.sampling import pack

    return {"ratios": pack("families.published_magcache").FLUX_DEV}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_threshold_0_is_bit_identical_with_any_estimator(baselines, tiny_family, variant):
    from harness.sampling import Job, apply, stats

    family = tiny_family
    model, expected = baselines[family]
    for method, extra in (("teacache", {}), ("magcache", ratios_for(family))):
        patched, node_id = apply(model, method, threshold=0.0, **extra, **VARIANTS[variant])
        assert torch.equal(Job(family).run(patched), expected), method
        assert stats(node_id)["rows_skipped"] == 0


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_family_skips_with_every_estimator(baselines, tiny_family, variant, caplog):
    """Forced skipping with each variant: it skips, the output is finite and exactly what a freshly
    patched model gives (nothing carries over), and the statistics add up."""
    from harness.sampling import Job, apply, stats

    family = tiny_family
    model, expected = baselines[family]
    inputs = {**FORCED_SKIP, **ratios_for(family), **VARIANTS[variant]}
    patched, node_id = apply(model, "magcache", **inputs)
    job = Job(family)
    with caplog.at_level(logging.INFO, logger="stepcache"):
        first = job.run(patched)
        second = job.run(patched)
    fresh, _ = apply(model, "magcache", **inputs)
    assert torch.isfinite(first).all()
    assert torch.equal(first, second) and torch.equal(first, job.run(fresh))
    run = stats(node_id)
    assert run["disabled_reason"] is None
    for branch in run["branches"]:
        assert branch["steps_computed"] + branch["steps_skipped"] == job.steps
    variant_inputs = VARIANTS[variant]
    head_check = variant_inputs.get("check") == "first_block"
    checks = head_check and not caches_in_output_space(family)
    if head_check and not checks:
        assert any("first-block check needs block hooks" in r.getMessage() for r in caplog.records)
    if checks and variant_inputs["check_tolerance"] == 0.0:
        # Every check fails: each call ran its head block and went on from its output, exactly.
        assert run["rows_skipped"] == 0 and torch.equal(first, expected)
        assert run["refused"] > 0
    else:
        assert run["rows_skipped"] > 0 and not torch.equal(first, expected)
        assert run["rows_checked"] == (run["rows_skipped"] if checks else 0)
    assert not any(r.levelno >= logging.WARNING for r in caplog.records if r.name == "stepcache")


class BranchSpy:
    """A model_function_wrapper that records which CFG branches each model call carries."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, ...]] = []

    def __deepcopy__(self, memo: dict) -> BranchSpy:
        return self

    def __call__(self, apply_model: Any, params: dict) -> torch.Tensor:
        self.calls.append(tuple(params["cond_or_uncond"]))
        return apply_model(params["input"], params["timestep"], **params["c"])


def drifting_cond_ratios(steps: int) -> Any:
    """cond's residual grows 50% a step (it must compute), uncond's holds (it may skip)."""
    from harness.sampling import pack

    return pack("cache_core").MagRatios.from_table([1.0, 1.0] + [1.5, 1.0] * (steps - 1), calibrated_steps=steps,
                                                   interleaved=True)


@pytest.mark.parametrize("family", ["flux", "wan21", "lumina2"])
def test_separate_branches_compute_only_the_branch_that_must(baselines, family):
    from harness.sampling import Job, apply, stats

    model, _ = baselines[family]
    job = Job(family, steps=12, batch=2)
    inputs = dict(threshold=0.3, max_consecutive_skips=100, retention_ratio=0.0, ratios=drifting_cond_ratios(12))
    together, together_node = apply(model, "magcache", **inputs)
    job.run(together)
    assert stats(together_node)["rows_skipped"] == 0  # cond must compute, so the batch does

    separate, node_id = apply(model, "magcache", **inputs, cfg_branches="separate")
    spy = BranchSpy()
    separate.set_model_unet_function_wrapper(spy)
    out = job.run(separate)
    assert torch.isfinite(out).all()
    run = stats(node_id)
    patterns = {b["branch"]: b["pattern"] for b in run["branches"]}
    assert patterns["cond"] == "C" * 12 and patterns["uncond"] == "C" + "S" * 11
    # Each skipped uncond step: its own call, 2 rows (batch 2) skipped; cond computed alone.
    assert run["rows_skipped"] == 11 * 2 and run["rows_computed"] == (12 + 1) * 2
    assert spy.calls.count((1,)) == 11 and spy.calls.count((0,)) == 11
    assert [sorted(c) for c in spy.calls if len(c) == 2] == [[0, 1]]  # step 0, batched as ComfyUI does


def test_separate_branches_with_area_conditioning_and_cfg_1(baselines):
    """Several entries in one branch (area conds) move together; cfg 1 has one branch, no split.

    For area conds ComfyUI adds to the negative a copy of each positive area entry, uuid and all
    (samplers.create_cond_with_same_area_if_none): an entry is its uuid *and* its branch, else the
    cond and uncond copies would share one state (and one residual)."""
    from harness.sampling import Job, apply, stats

    model, _ = baselines["flux"]
    job = Job("flux", steps=12)
    positive, negative = job.conds()
    (context, extra), = positive
    areas = [[context, {**extra, "area": (8, 16, y, 0), "strength": 1.0}] for y in (0, 8)]
    inputs = dict(threshold=0.3, max_consecutive_skips=100, retention_ratio=0.0, ratios=drifting_cond_ratios(12),
                  cfg_branches="separate")
    patched, node_id = apply(model, "magcache", **inputs)
    import nodes

    out = nodes.common_ksampler(patched, job.seed, job.steps, 3.0, "euler", "simple", areas, negative,
                                job.latent())[0]["samples"]
    assert torch.isfinite(out).all()
    run = stats(node_id)
    cond, uncond = run["branches"]
    # uncond: the negative itself and a copy of each positive area entry
    assert cond["entries"] == 2 and uncond["entries"] == 3
    assert cond["pattern"] == "C" * 12 and cond["steps_computed"] == 2 * 12
    assert uncond["steps_skipped"] == 3 * 11 and run["rows_skipped"] == 3 * 11

    patched, node_id = apply(model, "magcache", **inputs)
    spy = BranchSpy()
    patched.set_model_unet_function_wrapper(spy)
    Job("flux", steps=12, cfg=1.0).run(patched)
    assert set(spy.calls) == {(0,)} and [b["branch"] for b in stats(node_id)["branches"]] == ["cond"]


def test_teacache_separate_branches_decide_from_their_own_signal(baselines):
    from harness.sampling import Job, apply, stats

    model, _ = baselines["flux"]
    patched, node_id = apply(model, "teacache", threshold=0.3, cfg_branches="separate", estimator="forecast")
    spy = BranchSpy()
    patched.set_model_unet_function_wrapper(spy)
    Job("flux", steps=12).run(patched)
    assert set(spy.calls) == {(0,), (1,)}  # every evaluation: one call per branch
    run = stats(node_id)
    assert run["rows_skipped"] > 0 and run["calls_computed"] + run["calls_skipped"] == 2 * 12


def test_the_first_block_check_runs_the_head_block_and_counts_it(baselines):
    from harness.sampling import Job, apply, stats

    model, _ = baselines["flux"]
    blocks = len(model.model.diffusion_model.double_blocks) + len(model.model.diffusion_model.single_blocks)
    strict, strict_node = apply(model, "magcache", **FORCED_SKIP, **ratios_for("flux"), check="first_block",
                                check_tolerance=1e-6)
    Job("flux").run(strict)
    assert stats(strict_node)["rows_skipped"] == 0  # random weights: the head block never agrees that closely
    lenient, node_id = apply(model, "magcache", **FORCED_SKIP, **ratios_for("flux"), check="first_block",
                             check_tolerance=10.0)
    Job("flux").run(lenient)
    run = stats(node_id)
    assert run["rows_checked"] == run["rows_skipped"] > 0 and run["head_cost"] == pytest.approx(1 / blocks)
    total = run["rows_computed"] + run["rows_skipped"]
    assert run["row_speedup"] == pytest.approx(total / (run["rows_computed"] + run["rows_skipped"] / blocks), rel=1e-4)


def test_damped_forecast_is_first_order_whatever_forecast_order_says(host):
    """forecast_order applies to estimator forecast only (a relation between two inputs would be
    listed under both by ComfyUI's validation): damped_forecast samples the same with either."""
    from harness.sampling import Job, apply, tiny

    model = tiny().build_model("flux", seed=0)
    outputs = []
    for order in (1, 2):
        patched, _ = apply(model, "magcache", **FORCED_SKIP, **ratios_for("flux"), estimator="damped_forecast",
                           forecast_order=order)
        outputs.append(Job("flux").run(patched))
    assert torch.equal(*outputs)
