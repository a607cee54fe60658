"""The cache combined with what else sits on a model in real graphs: LoRA weight patches,
ModelSampling shift nodes, ComfyUI's own EasyCache/LazyCache, and models unloaded or rebuilt
between runs. (TorchCompileModel is in test_nodes.py, ControlNet in test_controlnet.py, context windows
in test_context_windows.py, another pack's block patches in test_foreign_patches.py.)

"Forced" caching below skips nearly every step (huge threshold, no limit on consecutive skips),
so any mix-up shows in the output.
"""

from __future__ import annotations

import logging

import pytest
import torch

FORCED = dict(threshold=5.0, max_consecutive_skips=100, retention_ratio=0.0)
FORCED_TEACACHE = dict(threshold=5.0, max_consecutive_skips=100)


@pytest.fixture(scope="module")
def tiny(host):
    return host.test_module("tiny_models")


@pytest.fixture
def log(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger="stepcache")
    return caplog


def magcache(model, **inputs):
    """ApplyMagCache with a published table chosen by name (tiny models are no published checkpoint)."""
    from harness.sampling import apply, published_variant

    return apply(model, "magcache", variant=published_variant(model), **inputs)


def with_lora(model, seed: int = 5):
    """A LoRA-style weight patch (a low-rank diff) on one attention weight, as LoraLoader adds."""
    key = "diffusion_model.double_blocks.0.img_attn.qkv.weight"
    weight = model.model.state_dict()[key]
    gen = torch.Generator().manual_seed(seed)
    up, down = torch.randn(weight.shape[0], 2, generator=gen), torch.randn(2, weight.shape[1], generator=gen)
    patched = model.clone()
    assert patched.add_patches({key: (0.05 * up @ down,)}, 1.0) == [key]
    return patched


@pytest.mark.parametrize("order", ["lora_then_cache", "cache_then_lora"])
def test_lora_before_or_after_the_cache_node(tiny, order):
    from harness.sampling import Job, stats

    base = tiny.build_model("flux", seed=0)
    job = Job("flux")
    lora_reference = job.run(with_lora(base))
    assert not torch.equal(lora_reference, job.run(base))  # the LoRA does change the output

    if order == "lora_then_cache":
        never, _ = magcache(with_lora(base), threshold=0.0)
        forced, node = magcache(with_lora(base), **FORCED)
    else:
        never = with_lora(magcache(base, threshold=0.0)[0])
        forced_cache, node = magcache(base, **FORCED)
        forced = with_lora(forced_cache)
    assert torch.equal(job.run(never), lora_reference)
    out = job.run(forced)
    assert stats(node)["calls_skipped"] > 0
    # Both orders give the same model: LoRA'd weights, cached blocks.
    other, _ = magcache(with_lora(base), **FORCED)
    assert torch.equal(out, job.run(other))


@pytest.mark.parametrize("family, method, shift_node, shift", [
    ("flux", "magcache", "ModelSamplingFlux", {"max_shift": 1.15, "base_shift": 0.5, "width": 256, "height": 256}),
    ("sd3", "teacache", "ModelSamplingSD3", {"shift": 6.0}),
])
def test_model_sampling_shift_before_or_after_the_cache_node(tiny, family, method, shift_node, shift):
    import nodes

    from harness.sampling import Job, apply, published_variant, stats

    def shifted(model):
        return nodes.NODE_CLASS_MAPPINGS[shift_node]().patch(model, **shift)[0]

    base = tiny.build_model(family, seed=0)
    job = Job(family)
    reference = job.run(shifted(base))
    assert not torch.equal(reference, job.run(base))
    variant = {"variant": published_variant(base)} if method == "magcache" else {}
    assert torch.equal(job.run(apply(shifted(base), method, threshold=0.0, **variant)[0]), reference)
    assert torch.equal(job.run(shifted(apply(base, method, threshold=0.0, **variant)[0])), reference)

    forced = FORCED if method == "magcache" else FORCED_TEACACHE
    after, node_after = apply(shifted(base), method, **forced, **variant)
    before, node_before = apply(base, method, **forced, **variant)
    out_after, out_before = job.run(after), job.run(shifted(before))
    assert torch.equal(out_after, out_before)  # the cache reads the shifted schedule either way
    assert stats(node_after)["calls_skipped"] > 0
    assert stats(node_after)["branches"] == stats(node_before)["branches"]


@pytest.mark.parametrize("native", ["EasyCache", "LazyCache"])
def test_comfyuis_own_cache_on_the_same_model_turns_ours_off_with_the_reason(tiny, log, native):
    import nodes

    from harness.sampling import Job, stats

    base = tiny.build_model("flux", seed=0)
    native_node = nodes.NODE_CLASS_MAPPINGS[native]
    for order in ("native_first", "ours_first"):
        if order == "native_first":
            model, node = magcache(native_node.execute(base, 0.2, 0.15, 0.95, False).result[0], **FORCED)
        else:
            ours, node = magcache(base, **FORCED)
            model = native_node.execute(ours, 0.2, 0.15, 0.95, False).result[0]
        log.clear()
        Job("flux").run(model)
        run = stats(node)
        assert native in (run["disabled_reason"] or ""), run
        assert run["calls_skipped"] == 0
        assert any(native in r.getMessage() for r in log.records if r.name == "stepcache")


def test_a_model_unloaded_between_runs_caches_the_same(tiny):
    import comfy.model_management

    from harness.sampling import Job, stats

    base = tiny.build_model("wan21", seed=0)
    patched, node = magcache(base, **FORCED)
    job = Job("wan21", frames=3)
    first = job.run(patched)
    pattern = stats(node)["branches"]
    comfy.model_management.unload_all_models()
    comfy.model_management.soft_empty_cache()
    assert torch.equal(job.run(patched), first)
    assert stats(node)["branches"] == pattern


def test_a_rebuilt_model_with_the_same_weights_caches_the_same(tiny):
    """What a reload from disk gives: a new ModelPatcher; nothing of the old one's runs is used."""
    from harness.sampling import Job, apply

    job = Job("flux", steps=12)
    first, _ = apply(tiny.build_model("flux", seed=0), "teacache", threshold=5.0, max_consecutive_skips=100)
    out = job.run(first)
    rebuilt, _ = apply(tiny.build_model("flux", seed=0), "teacache", threshold=5.0, max_consecutive_skips=100)
    assert torch.equal(job.run(rebuilt), out)
    other_weights, _ = apply(tiny.build_model("flux", seed=1), "teacache", threshold=5.0, max_consecutive_skips=100)
    assert not torch.equal(job.run(other_weights), out)
