"""The benchmark's evaluation sets: the levels were chosen on the headline set and a second set of
other content (``./dev bench --levels --second-set``); the held-out set (``--held-out``) shares no
seed with either, so it is noise the choice never saw, and every set stays within each reference
model's classes."""

from __future__ import annotations


def test_the_held_out_set_shares_no_seed_with_the_sets_the_levels_were_chosen_on(host):
    from stepbench import levels

    models = host.pack_module("demo.models")
    for kind in ("image", "video"):
        headline = {(p.class_index, p.seed) for p in levels.PAIRS[kind]}
        second = {(p.class_index, p.seed) for p in levels.SECOND_SET[kind]}
        held = {(p.class_index, p.seed) for p in levels.HELD_OUT[kind]}
        assert second and held, kind
        # The second set is other content, not only other noise.
        assert not {c for c, _ in headline} & {c for c, _ in second}, kind
        assert not {s for _, s in headline | second} & {s for _, s in held}, kind
        assert {c for c, _ in held} == set(range(len(models.CLASSES[kind]))), kind  # every class, held out
        assert max(c for c, _ in headline | second) < len(models.CLASSES[kind]), kind
    assert levels.describe_pairs(levels.PAIRS) == (
        "image model: 16 images (classes 0-3 x seeds 0-3), video model: 8 clips (classes 0-3 x seeds 0-1)")
    assert levels.describe_pairs(levels.SECOND_SET) == (
        "image model: 12 images (classes 4-9 x seeds 10-11), video model: 8 clips (classes 4-7 x seeds 10-11)")
    assert levels.describe_pairs(levels.HELD_OUT) == (
        "image model: 20 images (classes 0-9 x seeds 30-31), video model: 8 clips (classes 0-7 x seed 30)")


def test_the_levels_bench_takes_another_trained_model_in_place_of_the_reference_one(host, tmp_path):
    """``./dev bench --levels --weights image=PATH``: the levels on a model they were not chosen on."""
    import torch
    from stepbench import levels
    from stepbench.runner import Bench

    models = host.pack_module("demo.models")
    state_dict, _ = models.read_weights(models.weights_path("image"))
    name = next(iter(state_dict))
    state_dict[name] = state_dict[name] + 1.0
    other = tmp_path / "image_other.safetensors"
    models.save_weights("image", state_dict, other, dtype=state_dict[name].dtype)
    reference_bench, bench = Bench("image"), Bench("image", other)
    try:
        reference = models.checkpoint_state_dict("image", reference_bench.base)[name]
        loaded = models.checkpoint_state_dict("image", bench.base)[name]
    finally:
        reference_bench.close()
        bench.close()
    assert torch.equal(loaded, state_dict[name]) and not torch.equal(loaded, reference)
    data = {"levels": {"balanced": 29.0}, "cells": [], "pairs": "image model: 1 image", "set": "headline",
            "cfg": 4.0, "weights": {"image": str(other)}}
    text = levels.markdown(data, "./dev bench --levels --weights image=image_other.safetensors")
    assert "## Quality levels on another trained model" in text and "image `image_other.safetensors`" in text


def test_the_levels_bench_runs_at_another_step_count_and_scheduler(host):
    """``./dev bench --levels --steps N --scheduler NAME``: every sampler setting takes them, the rest stays."""
    from stepbench import levels

    own = levels.sampler_settings()
    assert [(s.sampler, s.steps, s.cfg, s.scheduler) for s in own] == [
        ("euler", 30, 4.0, "simple"), ("dpmpp_2m", 20, 4.0, "simple")]
    changed = levels.sampler_settings(steps=50, scheduler="beta")
    assert [(s.sampler, s.steps, s.cfg, s.scheduler) for s in changed] == [
        ("euler", 50, 4.0, "beta"), ("dpmpp_2m", 50, 4.0, "beta")]
    assert [s.cfg for s in levels.sampler_settings(cfg=7.0)] == [7.0, 7.0]
    data = {"levels": {"balanced": 29.0}, "cells": [], "pairs": "image model: 1 image", "set": "headline",
            "cfg": 4.0, "scheduler": "beta"}
    assert "cfg 4, scheduler beta." in levels.markdown(data, "./dev bench --levels --scheduler beta")


def test_the_levels_bench_caches_the_reference_model_in_output_space_while_asked(host):
    """``./dev bench --levels --output-space``: the reference model cached as the families without block
    hooks are (the whole model call is skipped), and as its own family again afterwards."""
    from stepbench import levels
    from stepbench.configs import Pair, SamplerSetting
    from stepbench.runner import Bench

    from harness import sampling

    families = host.pack_module("families")
    bench = Bench("image")
    try:
        assert families.family_for(bench.base.model) is families.FLUX
        with levels.cached_in_output_space(bench.base) as name:
            family = families.family_for(bench.base.model)
            assert family.caches_in_output_space and family.name == name == "flux in output space"
            model, node_id = sampling.apply(bench.base.clone(), "magcache", quality="fast")
            bench.sample(model, Pair(0, 0), SamplerSetting("euler", 12, 4.0))
            stats = sampling.stats(node_id)
            assert stats["label"].startswith("flux in output space / ") and stats["calls_skipped"] > 0
        assert families.family_for(bench.base.model) is families.FLUX
    finally:
        bench.close()
    data = {"levels": {"balanced": 29.0}, "cells": [], "pairs": "image model: 1 image", "set": "headline",
            "cfg": 4.0, "output_space": True}
    text = levels.markdown(data, "./dev bench --levels --output-space")
    assert "## Quality levels in output space" in text and "Native:" not in text
    assert "Row speedup of the model calls" in text
