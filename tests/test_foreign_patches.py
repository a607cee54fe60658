"""Other packs' block patches (PuLID-, IP-Adapter- or regional-prompt-style ``patches_replace["dit"]``
entries) beside the cache, put on with a test-only node (``StepCacheTestBlockPatch``):

- put on before the Apply node, the patch is chained: it runs on every computed step, exactly once
  per computed call, and its effect is part of the cached residual, so skipped steps keep it;
- put on after the Apply node, it replaces the cache's hook on that block: the cache could not see
  that block, so the run computes every step, with the reason in the statistics, and its output is
  the patched model's own.

Each on the first, a middle and the last block of the stack, where the cache's hooks differ."""

from __future__ import annotations

import pytest
import torch

SKIPPING = {"threshold": 0.3, "max_consecutive_skips": 3, "retention_ratio": 0.1, "variant": "flux.1-dev"}


@pytest.fixture(scope="module")
def flux(host):
    return host.test_module("tiny_models").build_model("flux", seed=0)


@pytest.fixture(scope="module")
def block_keys(host, flux):
    family = host.pack_module("families").family_for(flux.model)
    keys = family.block_keys(flux.model.diffusion_model)
    return {"first": keys[0], "middle": keys[len(keys) // 2], "last": keys[-1]}


def put_patch(host, model, key, strength: float = 0.5):
    """The test-only node's MODEL, and the patch it put on."""
    kind, index = key
    patched = host.test_nodes.BlockPatch.execute(model, kind=kind, index=index, strength=strength).result[0]
    return patched, patched.model_options["transformer_options"]["patches_replace"]["dit"][key]


def distance(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().mean())


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_a_patch_put_on_before_apply_runs_on_every_computed_step_inside_the_residual(host, flux, block_keys, where):
    from harness.sampling import Job, apply, stats

    job = Job("flux")
    with_patch, patch = put_patch(host, flux, block_keys[where])
    reference = job.run(with_patch)  # the patched model, uncached
    plain = job.run(flux)
    patch.calls = 0
    cached, node_id = apply(with_patch, "magcache", **SKIPPING)
    out = job.run(cached)
    run = stats(node_id)
    assert run["disabled_reason"] is None and run["calls_skipped"] > 0
    assert patch.calls == run["calls_computed"]  # once per computed call, never on a skipped one
    # Skipped steps keep the patch's effect: the output is nearer the patched model's than the
    # patch's own effect is large.
    assert distance(out, reference) < 0.5 * distance(reference, plain)
    exact, _ = apply(with_patch, "magcache", **{**SKIPPING, "threshold": 0.0})
    assert torch.equal(job.run(exact), reference)


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_a_patch_put_on_after_apply_makes_the_run_compute_every_step(host, flux, block_keys, where):
    from harness.sampling import Job, apply, stats

    job = Job("flux")
    uncached, uncached_patch = put_patch(host, flux, block_keys[where])
    reference = job.run(uncached)
    cached, node_id = apply(flux, "magcache", **SKIPPING)
    patched_after, patch = put_patch(host, cached, block_keys[where])
    out = job.run(patched_after)
    run = stats(node_id)
    kind, index = block_keys[where]
    assert f"replaced the cache's hook on {kind} {index}" in run["disabled_reason"]
    assert run["calls_skipped"] == 0 and patch.calls == uncached_patch.calls >= job.steps
    assert torch.equal(out, reference)


def test_a_hook_keyframe_that_changes_a_strength_makes_its_step_compute_afresh(host, flux):
    """ComfyUI's hooks: another model's weights hooked to the prompt (as a scheduled LoRA is), with
    keyframes that change the hook's strength halfway. Residuals computed at the old weights are
    forgotten at the step where the strength changes, which computes; the run still caches around
    it, and at threshold 0 it is bit-identical to uncached."""
    import comfy.hooks
    import nodes

    from harness.sampling import Job, apply, install, stats

    job = Job("flux", steps=16)
    other = host.test_module("tiny_models").build_model("flux", seed=5)
    hooks = comfy.hooks.create_hook_model_as_lora(comfy.hooks.get_patch_weights_from_model(other), None, 1.0, 1.0)

    def run(model, keyframes: list[tuple[float, float]]) -> torch.Tensor:
        group = comfy.hooks.HookKeyframeGroup()
        for strength, start in keyframes:
            group.add(comfy.hooks.HookKeyframe(strength=strength, start_percent=start))
        scheduled = hooks.clone()
        scheduled.set_keyframes_on_hooks(group)
        positive, negative = job.conds()
        positive = comfy.hooks.set_hooks_for_conditioning(positive, scheduled)
        return nodes.common_ksampler(model, job.seed, job.steps, job.cfg, job.sampler, job.scheduler,
                                     positive, negative, job.latent())[0]["samples"]

    schedule = [(1.0, 0.0), (0.2, 0.5)]
    reference = run(flux, schedule)
    assert not torch.allclose(reference, job.run(flux))  # the hook does change the model
    cached, node_id = install(flux, "magcache", threshold=0.3, max_consecutive_skips=8, retention_ratio=0.1,
                              variant="flux.1-dev", record_trace=True)
    out = run(cached, schedule)
    result = stats(node_id)
    restarts = [event for event in result["trace"] if "restart" in event]
    assert len(restarts) == 1 and 0 < restarts[0]["step"] < job.steps, restarts
    step = restarts[0]["step"]
    assert result["disabled_reason"] is None and result["calls_skipped"] > 0
    assert all(branch["pattern"][step] == "C" for branch in result["branches"]), (step, result["branches"])
    assert out.isfinite().all()
    exact, _ = apply(flux, "magcache", **{**SKIPPING, "threshold": 0.0})
    assert torch.equal(run(exact, schedule), reference)
    run(cached, [(0.6, 0.0), (0.6, 0.5)])  # keyframes that keep one strength: nothing to forget
    assert not [event for event in stats(node_id)["trace"] if "restart" in event]


def test_a_patch_put_on_after_apply_that_wraps_the_hook_keeps_the_cache(host, flux, block_keys):
    """A pack that wraps the hook it finds (and names it ``__wrapped__``, as functools.wraps does)
    leaves the cache's hook running for that block, so the run still caches."""
    import functools

    from harness.sampling import Job, apply, stats

    cached, node_id = apply(flux, "magcache", **SKIPPING)
    key = block_keys["last"]
    hook = cached.model_options["transformer_options"]["patches_replace"]["dit"][key]
    calls = []

    @functools.wraps(hook)
    def wrapping(args: dict, extra: dict) -> dict:
        calls.append(1)
        return hook(args, extra)

    wrapped = cached.clone()
    wrapped.set_model_patch_replace(wrapping, "dit", *key)
    out = Job("flux").run(wrapped)
    run = stats(node_id)
    assert run["disabled_reason"] is None and run["calls_skipped"] > 0
    assert len(calls) == run["calls_computed"] + run["calls_skipped"]  # it sees every call; the hook decides
    assert torch.equal(out, Job("flux").run(cached))
