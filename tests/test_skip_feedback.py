"""Skip feedback in real sampling runs (cache_core/feedback.py, nodes/runtime.py).

At a level that feeds back, a computed call after skipped ones takes the skips' estimated error
back out of the sample, where the run's sampler allows it: ComfyUI's own sampler, run on scalars,
must show one model call per step, no noise and no history (euler, ddim). Everywhere else the run
says why not and samples exactly as without feedback.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch


@pytest.fixture(scope="module")
def quality(host):
    return host.pack_module("cache_core.quality")


@pytest.fixture
def without_feedback(quality, monkeypatch):
    """Makes every level run without feedback: at its own tolerance (the levels as they were before
    it), or ``as_where_it_cannot_run`` at the tolerance it has where the sampler allows none."""
    def switch_off(as_where_it_cannot_run: bool = False) -> None:
        for name, level in list(quality.LEVELS.items()):
            tolerance = level.tolerance
            if as_where_it_cannot_run and level.tolerance_without_feedback is not None:
                tolerance = level.tolerance_without_feedback
            monkeypatch.setitem(quality.LEVELS, name, dataclasses.replace(
                level, feedback=False, tolerance=tolerance, tolerance_without_feedback=None))
    return switch_off


def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    mse = float(((a.double() - b.double()) ** 2).mean())
    return math.inf if mse == 0 else 10 * math.log10(1.0 / mse)


def test_the_default_level_feeds_back(quality):
    assert quality.LEVELS[quality.DEFAULT_LEVEL].feedback
    assert quality.LEVELS[quality.DEFAULT_LEVEL].config().feedback


@pytest.fixture(scope="module")
def reference_image(host):
    """The trained reference image model, and a run of it through ComfyUI's KSampler."""
    import nodes

    models = host.pack_module("demo.models")
    pixels = host.pack_module("demo.pixels")
    model = models.load_model("image")

    def run(patched, class_index: int, seed: int, sampler: str = "euler", steps: int = 30) -> torch.Tensor:
        positive = models.conditioning("image", class_index, 1)
        negative = models.conditioning("image", None, 1)
        return pixels.latent_to_image(nodes.common_ksampler(
            patched, seed, steps, 4.0, sampler, "simple", positive, negative,
            models.empty_latent("image", 1))[0]["samples"])

    return model, run


@pytest.mark.slow
def test_at_euler_feedback_brings_the_default_level_closer_to_uncached(reference_image, quality, without_feedback):
    """8 images on the reference image model, euler 30 steps, cfg 4: the mean PSNR against uncached
    rises by more than 2 dB at the same work (docs/experiments.md section 28 has the figures)."""
    from harness import sampling

    model, run = reference_image
    pairs = [(c, s) for c in range(4) for s in range(2)]
    references = {pair: run(model, *pair) for pair in pairs}
    figures = {}
    for feeds_back in (True, False):
        if not feeds_back:
            without_feedback()
        patched, node_id = sampling.apply(model, "magcache", quality=quality.DEFAULT_LEVEL)
        psnrs, corrections, rows = [], 0, 0
        for pair in pairs:
            psnrs.append(psnr(references[pair], run(patched, *pair)))
            stats = sampling.stats(node_id)
            assert ("skip feedback on" in stats["constants"]) == feeds_back, stats["constants"]
            corrections += stats["feedback_corrections"]
            rows += stats["rows_computed"]
        figures[feeds_back] = (sum(psnrs) / len(psnrs), min(psnrs), corrections, rows)
    on, off = figures[True], figures[False]
    assert on[2] > 0 and off[2] == 0, figures
    assert on[0] > off[0] + 2.0, figures
    assert on[1] >= quality.LEVELS[quality.DEFAULT_LEVEL].worst_db, figures


@pytest.mark.parametrize(("sampler", "reason"), [
    ("dpmpp_2m", "multistep"), ("deis", "multistep"), ("uni_pc", "could not be run on its own"),
])
def test_where_the_sampler_does_not_allow_it_the_run_is_as_without_feedback(reference_image, quality,
                                                                           without_feedback, sampler, reason):
    from harness import sampling

    model, run = reference_image
    steps = 20 if sampler == "dpmpp_2m" else 30
    fed, node_id = sampling.apply(model, "magcache", quality=quality.DEFAULT_LEVEL)
    with_level = run(fed, 1, 1, sampler, steps)
    stats = sampling.stats(node_id)
    assert "skip feedback off" in stats["constants"] and reason in stats["constants"], stats["constants"]
    level = quality.LEVELS[quality.DEFAULT_LEVEL]
    factor = level.tolerance_without_feedback / level.tolerance
    assert f"(tolerance x{factor:.2f} without it)" in stats["constants"], stats["constants"]
    assert stats["feedback_corrections"] == 0 and stats["calls_skipped"] > 0, stats["summary"]
    without_feedback(as_where_it_cannot_run=True)
    plain, _ = sampling.apply(model, "magcache", quality=quality.DEFAULT_LEVEL)
    assert torch.equal(with_level, run(plain, 1, 1, sampler, steps))


@pytest.mark.slow
def test_separate_cfg_branches_feed_back_per_branch(reference_image, quality):
    """With cfg_branches separate, a call may hold one branch only: the feedback keys each call by
    the conditioning it holds, so the run corrects and holds the level's promise on this image."""
    from harness import sampling

    model, run = reference_image
    reference = run(model, 2, 0)
    patched, node_id = sampling.apply(model, "magcache", quality=quality.DEFAULT_LEVEL, cfg_branches="separate")
    cached = run(patched, 2, 0)
    stats = sampling.stats(node_id)
    assert stats["feedback_corrections"] > 0 and stats["calls_skipped"] > 0, stats["summary"]
    assert psnr(reference, cached) >= quality.LEVELS[quality.DEFAULT_LEVEL].worst_db


def test_context_windows_feed_back_per_window(host, quality):
    """The reference video model with ComfyUI's context windows (static windows: each keeps its key
    from step to step): each window's calls are corrected on their own, and the run stays close to
    the uncached windowed run."""
    import nodes
    from comfy_extras import nodes_context_windows

    from harness import sampling
    from harness.sampling import execute_node

    models = host.pack_module("demo.models")
    model = models.load_model("video")
    windowed = execute_node(nodes_context_windows.ContextWindowsManualNode, model=model, context_length=5,
                            context_overlap=2, context_schedule="standard_static", dim=2)[0]

    def run(patched) -> torch.Tensor:
        return nodes.common_ksampler(patched, 0, 30, 4.0, "euler", "simple", models.conditioning("video", 0, 1),
                                     models.conditioning("video", None, 1),
                                     models.empty_latent("video", 1))[0]["samples"]

    reference = run(windowed)
    patched, node_id = sampling.apply(windowed, "magcache", quality=quality.DEFAULT_LEVEL)
    cached = run(patched)
    stats = sampling.stats(node_id)
    assert "skip feedback on" in stats["constants"], stats["constants"]
    assert stats["feedback_corrections"] > 0 and stats["branches"][0]["entries"] > 1, stats["summary"]
    scale = float(reference.abs().max())
    assert psnr(reference / scale, cached / scale) > 30.0


@pytest.mark.slow
def test_a_controlnet_that_stops_partway_starts_the_feedback_over(reference_image, quality, host, monkeypatch):
    """The trained demo ControlNet acting on the first half of the run: at the step it stops the
    cache forgets its residuals and the feedback its outputs (no line drawn across the change); the
    run corrects on both sides and holds the level's promise."""
    import nodes

    from harness import sampling

    models = host.pack_module("demo.models")
    pixels = host.pack_module("demo.pixels")
    demo_controlnet = host.pack_module("demo.controlnet")
    model, _ = reference_image
    controlnet = demo_controlnet.load(model)

    def run(patched) -> torch.Tensor:
        positive, negative = nodes.ControlNetApplyAdvanced().apply_controlnet(
            models.conditioning("image", 2, 1), models.conditioning("image", None, 1), controlnet,
            demo_controlnet.hint_image(2, 1000), 1.0, 0.0, 0.5)[:2]
        return pixels.latent_to_image(nodes.common_ksampler(
            patched, 0, 30, 4.0, "euler", "simple", positive, negative, models.empty_latent("image", 1))[0]["samples"])

    reference = run(model)
    patched, node_id = sampling.apply(model, "magcache", quality=quality.DEFAULT_LEVEL)
    runtime = host.pack_module("nodes.runtime")
    options = patched.model_options["transformer_options"]
    options[runtime.SETTINGS_KEY] = dataclasses.replace(options[runtime.SETTINGS_KEY], record_trace=True)
    feedback_class = host.pack_module("cache_core.feedback").SkipFeedback
    forgotten = []
    original_forget = feedback_class.forget
    monkeypatch.setattr(feedback_class, "forget", lambda self: (forgotten.append(self), original_forget(self)))
    cached = run(patched)
    stats = sampling.stats(node_id)
    restarts = [event for event in stats["trace"] if "restart" in event]
    assert len(restarts) == 1 and len(forgotten) == 1, (restarts, forgotten)
    assert stats["feedback_corrections"] > 0 and "skip feedback on" in stats["constants"], stats["summary"]
    assert psnr(reference, cached) >= quality.LEVELS[quality.DEFAULT_LEVEL].worst_db
