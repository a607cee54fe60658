"""Every supported family, through ComfyUI's real samplers: detection, exactness, skip arithmetic."""

from __future__ import annotations

import pytest
import torch

# Parametrized over the tiny model registry (tests/conftest.py): ``tiny_family`` is every tiny
# model, ``block_family`` those whose pack family drives the block stack through block hooks,
# ``output_space_family`` those it caches in output space. Each tiny model names the pack family
# and variant that must be detected for it.


def tiny_spec(family: str):
    from harness.sampling import tiny

    return tiny().FAMILIES[family]


def flux_ratios():
    from harness.sampling import pack

    return pack("families.published_magcache").FLUX_DEV


def test_family_and_variant_are_detected(baselines, tiny_family):
    from harness.sampling import Job, apply, pack, stats

    model, _ = baselines[tiny_family]
    patched, node_id = apply(model, "magcache", threshold=0.05, ratios=flux_ratios())
    Job(tiny_family).run(patched)
    spec = tiny_spec(tiny_family)
    pack_family = pack("families").family_for(model.model)
    assert pack_family.name == spec.family
    # Tiny models are no published checkpoint: in a family with published constants they are its
    # generic variant ("... (not a published checkpoint)"), elsewhere named after their class.
    assert stats(node_id)["label"] == f"{spec.family} / {pack_family.variant(spec.variant).label}"
    assert stats(node_id)["constants"] == "connected ratios input"


def test_threshold_zero_is_bit_identical_to_the_unpatched_model(baselines, tiny_family):
    family = tiny_family
    from harness.sampling import Job, apply, stats

    model, expected = baselines[family]
    for method, extra in (("teacache", {}), ("magcache", {"ratios": flux_ratios()})):
        patched, node_id = apply(model, method, threshold=0.0, **extra)
        assert torch.equal(Job(family).run(patched), expected), method
        assert stats(node_id)["calls_skipped"] == 0


def test_measuring_every_residual_leaves_the_output_bit_identical(baselines, tiny_family):
    """The compute path (private copy of the stack input, residual kept) changes nothing."""
    family = tiny_family
    from harness.sampling import Job, install, stats

    model, expected = baselines[family]
    patched, node_id = install(model, "calibration")
    assert torch.equal(Job(family).run(patched), expected)
    run_stats = stats(node_id)
    assert run_stats["calls_skipped"] == 0 and run_stats["calls_computed"] == 12


def test_a_forced_skip_applies_exactly_input_plus_last_residual(baselines, block_family):
    """Record the stack's input and output around the pack's own head and tail hooks.

    wan21_vace adds a VACE hint into the stream after its first block on every call; its skipped
    calls still return exactly input + residual, so the hint is not counted twice.
    """
    from harness.sampling import Job, apply, pack, patterns

    family = block_family
    model, _ = baselines[family]
    patched, node_id = apply(model, "magcache", threshold=100.0, max_consecutive_skips=100,
                             retention_ratio=0.0, ratios=flux_ratios())
    dit = patched.model_options["transformer_options"]["patches_replace"]["dit"]
    pack_family = pack("families").family_for(model.model)
    keys = pack_family.block_keys(model.model.diffusion_model)
    head_key, tail_key = keys[0], keys[-1]
    head_hook, tail_hook = dit[head_key], dit[tail_key]
    inputs, outputs = [], []

    def head_probe(args, extra):
        inputs.append(args["img"].clone())  # before any block writes into it
        return head_hook(args, extra)

    def tail_probe(args, extra):
        out = tail_hook(args, extra)
        tokens = inputs[-1].shape[1]
        # (where ComfyUI reads the image tokens: test_a_skipped_call_hands_comfyui_...)
        outputs.append(pack_family.image_part(tail_key[0], out["img"], tokens, args["transformer_options"]).clone())
        return out

    # The probes wrap the pack's hooks, and say so (__wrapped__), so the run still caches.
    head_probe.__wrapped__, tail_probe.__wrapped__ = head_hook, tail_hook
    dit[head_key] = head_probe
    dit[tail_key] = tail_probe
    Job(family).run(patched)
    pattern = patterns(node_id)["cond"]
    assert pattern.startswith("CS"), pattern
    residual = outputs[0] - inputs[0]
    assert residual.abs().max() > 0
    assert torch.equal(outputs[1], inputs[1] + residual)
    # Every later skipped step reuses the residual of the last computed one.
    last_residual = residual
    for step, outcome in enumerate(pattern):
        if outcome == "C":
            last_residual = outputs[step] - inputs[step]
        else:
            assert torch.equal(outputs[step], inputs[step] + last_residual), step


def test_output_space_fallback_skips_the_whole_model(baselines, output_space_family):
    """Families without block hooks: a skipped call returns model input + cached output residual."""
    family = output_space_family
    import comfy.patcher_extension

    from harness.sampling import Job, apply, patterns

    model, _ = baselines[family]
    probed = model.clone()
    calls = []

    def probe(executor, *args, **kwargs):
        out = executor(*args, **kwargs)
        calls.append((args[0].clone(), out.clone()))
        return out

    # Registered before the cache's own wrapper, so it sees what the cache returns.
    probed.add_wrapper_with_key(comfy.patcher_extension.WrappersMP.DIFFUSION_MODEL, "probe", probe)
    patched, node_id = apply(probed, "magcache", threshold=100.0, max_consecutive_skips=100,
                             retention_ratio=0.0, ratios=flux_ratios())
    Job(family).run(patched)
    pattern = patterns(node_id)["cond"]
    assert pattern.startswith("CS") and pattern.count("S") >= 8, pattern
    last_residual = None
    for (x, out), outcome in zip(calls, pattern, strict=True):
        x = x[:, :out.shape[1]]  # the latent; channels after it are concatenated conditioning (Kandinsky 5)
        if outcome == "C":
            last_residual = out - x
        else:
            assert torch.equal(out, x + last_residual)


def test_wan22_s2v_is_cached_where_comfyui_hands_its_blocks_transformer_options(host):
    """ComfyUI 0.30.0 passes Wan 2.2 S2V's blocks transformer_options, 0.3.75 does not: there the
    run samples uncached and says why (the tiny model is left out of the generic tests)."""
    import comfy.supported_models

    from harness.sampling import Job, apply, stats

    if not hasattr(comfy.supported_models, "WAN22_S2V"):
        pytest.skip("this ComfyUI has no Wan 2.2 S2V")
    tiny = host.test_module("tiny_models")
    model = tiny.build_model("wan22_s2v", seed=0)
    job = Job("wan22_s2v")
    expected = job.run(model)
    patched, node_id = apply(model, "magcache", threshold=5.0, max_consecutive_skips=100, retention_ratio=0.0,
                             ratios=flux_ratios())
    out = job.run(patched)
    run = stats(node_id)
    assert run["label"] == "wan / wan2.2-s2v"
    if tiny.blocks_get_transformer_options("wan22_s2v"):
        assert run["disabled_reason"] is None and run["calls_skipped"] >= 8, run
        assert not torch.equal(out, expected)
    else:
        assert run["disabled_reason"] == ("the model's blocks never reached the cache: this ComfyUI passes them "
                                          "no transformer_options"), run
        assert torch.equal(out, expected)


def test_every_model_class_of_this_comfyui_is_cached_and_tested_or_unsupported_with_a_reason(host):
    """The survey of comfy.model_base, against the ComfyUI under test: a class is cached by one
    family (and has a tiny model here) or listed in families.UNSUPPORTED with why."""
    import inspect

    import comfy.model_base

    families = host.pack_module("families")
    present = {name for name, cls in vars(comfy.model_base).items()
               if inspect.isclass(cls) and issubclass(cls, comfy.model_base.BaseModel)
               and cls.__module__ == comfy.model_base.__name__}
    cached = [name for family in families.FAMILIES for name in family.model_classes]
    assert len(cached) == len(set(cached)), "a class in two families"
    assert not set(cached) & set(families.UNSUPPORTED)
    assert all(reason for reason in families.UNSUPPORTED.values())
    unknown = present - set(cached) - set(families.UNSUPPORTED)
    assert not unknown, f"classes of this ComfyUI in neither list: {sorted(unknown)}"
    tiny = host.test_module("tiny_models")
    import comfy.supported_models

    built = {type(tiny.build_model(name).model).__name__ for name, spec in tiny.FAMILIES.items()
             if hasattr(comfy.supported_models, spec.config_class)}
    untested = (present & set(cached)) - built
    assert not untested, f"cached classes without a tiny model: {sorted(untested)}"


def test_a_skipped_call_hands_comfyui_the_stack_input_plus_the_kept_residual(baselines, single_stream_family):
    """What ComfyUI itself takes out of the stream after the stack (the final layer's input) is,
    on a skipped call, the stack input + the residual ComfyUI took out on the last computed call;
    found without the pack's own idea of where the image tokens sit (single-stream layouts differ
    between ComfyUI versions: HunyuanVideo's is cat(txt, img) in 0.30.0, cat(img, txt) before)."""
    from harness.sampling import Job, apply, pack, patterns

    family = single_stream_family
    model, _ = baselines[family]
    diffusion_model = model.model.diffusion_model
    patched, node_id = apply(model, "magcache", threshold=100.0, max_consecutive_skips=100,
                             retention_ratio=0.0, ratios=flux_ratios())
    dit = patched.model_options["transformer_options"]["patches_replace"]["dit"]
    head_key = pack("families").family_for(model.model).block_keys(model.model.diffusion_model)[0]
    head_hook = dit[head_key]
    inputs, finals = [], []

    def head_probe(args, extra):
        inputs.append(args["img"].clone())
        return head_hook(args, extra)

    head_probe.__wrapped__ = head_hook
    dit[head_key] = head_probe
    final_layer = getattr(diffusion_model, "final_layer", None)
    if final_layer is not None:
        handle = final_layer.register_forward_pre_hook(lambda module, args: finals.append(args[0].clone()))
    else:  # ChromaRadiance: forward_orig returns the image tokens to its pixel decoder
        forward_orig = diffusion_model.forward_orig

        def watched(*args, **kwargs):
            out = forward_orig(*args, **kwargs)
            finals.append(out.clone())
            return out

        diffusion_model.forward_orig = watched
    try:
        Job(family).run(patched)
    finally:
        if final_layer is not None:
            handle.remove()
        else:
            del diffusion_model.forward_orig
    pattern = patterns(node_id)["cond"]
    assert pattern.startswith("CS") and len(finals) == len(inputs), pattern
    assert finals[0].shape == inputs[0].shape
    residual = None
    for step, outcome in enumerate(pattern):
        if outcome == "C":
            residual = finals[step] - inputs[step]
        else:
            assert torch.allclose(finals[step], inputs[step] + residual, atol=1e-5, rtol=1e-5), step


@pytest.mark.parametrize("sampler", ["euler", "dpmpp_2m"])
def test_a_level_in_output_space_takes_a_tighter_tolerance_and_says_so(baselines, output_space_family, sampler):
    """The levels were chosen in the block stack's space: cached in output space, a run takes the level's
    tolerance times OUTPUT_SPACE_FACTOR, with any sampler, and its statistics say so."""
    from harness.sampling import Job, apply, pack, stats

    factor = pack("cache_core.quality").OUTPUT_SPACE_FACTOR
    model, _ = baselines[output_space_family]
    patched, node_id = apply(model, "magcache", quality="fast")
    Job(output_space_family, sampler=sampler).run(patched)
    assert f"tolerance x{factor:.2f} in output space" in stats(node_id)["constants"]


def test_a_level_in_the_block_stack_keeps_its_tolerance(baselines, block_family):
    from harness.sampling import Job, apply, stats

    model, _ = baselines[block_family]
    patched, node_id = apply(model, "magcache", quality="fast")
    Job(block_family, sampler="dpmpp_2m").run(patched)
    assert "output space" not in stats(node_id)["constants"]
