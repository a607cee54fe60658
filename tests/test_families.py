"""Every supported family, through ComfyUI's real samplers: detection, exactness, skip arithmetic."""

from __future__ import annotations

import pytest
import torch

# Every tiny model (tests/harness/comfy_test_nodes/tiny_models.py); each names the pack family
# and variant it must be detected as.
FAMILIES = [
    "chroma", "cosmos_predict2", "flux", "flux2", "hidream", "hunyuan_video", "hunyuan_video15", "ltxv",
    "lumina2", "qwen_image", "sd3", "wan21", "wan21_i2v", "wan21_vace", "wan22_5b",
]
OUTPUT_SPACE = {"lumina2", "hidream", "cosmos_predict2"}


def test_every_tiny_family_is_listed(host):
    assert sorted(host.test_module("tiny_models").FAMILIES) == FAMILIES


@pytest.fixture(scope="module")
def baselines(host):
    """Unpatched output of each family (12 steps, cfg 3) and its model."""
    from harness.sampling import Job, tiny

    out = {}
    for family in FAMILIES:
        model = tiny().build_model(family, seed=0)
        out[family] = (model, Job(family).run(model))
    return out


def flux_ratios():
    from harness.sampling import pack

    return pack("families.published_magcache").FLUX_DEV


@pytest.mark.parametrize("family", FAMILIES)
def test_family_and_variant_are_detected(baselines, family):
    from harness.sampling import Job, apply, pack, stats, tiny

    model, _ = baselines[family]
    patched, node_id = apply(model, "magcache", threshold=0.05, ratios=flux_ratios())
    Job(family).run(patched)
    spec = tiny().FAMILIES[family]
    pack_family = pack("families").family_for(model.model)
    assert pack_family.name == spec.family
    assert stats(node_id)["label"] == f"{spec.family} / {pack_family.variant(spec.variant).label}"
    assert stats(node_id)["constants"] == "connected ratios input"


@pytest.mark.parametrize("family", FAMILIES)
def test_threshold_zero_is_bit_identical_to_the_unpatched_model(baselines, family):
    from harness.sampling import Job, apply, stats

    model, expected = baselines[family]
    for method, extra in (("teacache", {}), ("magcache", {"ratios": flux_ratios()})):
        patched, node_id = apply(model, method, threshold=0.0, **extra)
        assert torch.equal(Job(family).run(patched), expected), method
        assert stats(node_id)["calls_skipped"] == 0


@pytest.mark.parametrize("family", FAMILIES)
def test_measuring_every_residual_leaves_the_output_bit_identical(baselines, family):
    """The compute path (private copy of the stack input, residual kept) changes nothing."""
    from harness.sampling import Job, install, stats

    model, expected = baselines[family]
    patched, node_id = install(model, "measure")
    assert torch.equal(Job(family).run(patched), expected)
    run_stats = stats(node_id)
    assert run_stats["calls_skipped"] == 0 and run_stats["calls_computed"] == 12


def image_part(stream: torch.Tensor, tokens: int, layout: str | None) -> torch.Tensor:
    if layout == "txt_img":
        return stream[:, -tokens:]
    if layout == "img_txt":
        return stream[:, :tokens]
    return stream


@pytest.mark.parametrize("family", sorted(set(FAMILIES) - OUTPUT_SPACE))
def test_a_forced_skip_applies_exactly_input_plus_last_residual(baselines, family):
    """Record the stack's input and output around the pack's own head and tail hooks.

    wan21_vace adds a VACE hint into the stream after its first block on every call; its skipped
    calls still return exactly input + residual, so the hint is not counted twice.
    """
    from harness.sampling import Job, apply, pack, patterns

    model, _ = baselines[family]
    patched, node_id = apply(model, "magcache", threshold=100.0, max_consecutive_skips=100,
                             retention_ratio=0.0, ratios=flux_ratios())
    dit = patched.model_options["transformer_options"]["patches_replace"]["dit"]
    keys = pack("families").family_for(model.model).block_keys(model.model.diffusion_model)
    layout = pack("families").family_for(model.model).single_stream
    head_key, tail_key = keys[0], keys[-1]
    head_hook, tail_hook = dit[head_key], dit[tail_key]
    inputs, outputs = [], []

    def head_probe(args, extra):
        inputs.append(args["img"].clone())  # before any block writes into it
        return head_hook(args, extra)

    def tail_probe(args, extra):
        out = tail_hook(args, extra)
        tokens = inputs[-1].shape[1]
        outputs.append(image_part(out["img"], tokens, layout if tail_key[0] == "single_block" else None).clone())
        return out

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


@pytest.mark.parametrize("family", sorted(OUTPUT_SPACE))
def test_output_space_fallback_skips_the_whole_model(baselines, family):
    """Families without block hooks: a skipped call returns model input + cached output residual."""
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
        if outcome == "C":
            last_residual = out - x
        else:
            assert torch.equal(out, x + last_residual)
