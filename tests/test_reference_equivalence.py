"""The algorithms against their references, on real ComfyUI runs of a tiny FLUX model.

- MagCache: the compute/skip sequence equals diffusers' own MagCache hooks
  (diffusers.hooks.mag_cache) for the same ratios, threshold, K, retention and step count.
- TeaCache: the signal, its accumulation and the decisions equal a hand computation of the
  published formula on the modulated inputs recorded during the run.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

# Zehong-Ma/MagCache MagCache4FLUX/magcache_flux.py:L459 (also diffusers' FLUX_MAG_RATIOS)
FLUX_RATIOS = [1.0, 1.21094, 1.11719, 1.07812, 1.0625, 1.03906, 1.03125, 1.03906, 1.02344, 1.03125, 1.02344,
               0.98047, 1.01562, 1.00781, 1.0, 1.00781, 1.0, 1.00781, 1.0, 1.0, 0.99609, 0.99609,
               0.98047, 0.98828, 0.96484, 0.95703, 0.93359, 0.89062]
FLUX_TEACACHE = [4.98651651e02, -2.83781631e02, 5.58554382e01, -3.82021401e00, 2.64230861e-01]


def diffusers_magcache_pattern(threshold: float, max_skip_steps: int, retention_ratio: float, steps: int,
                               ratios: list[float]) -> str:
    """Run diffusers' MagCache on a tiny diffusers FLUX transformer; "C"/"S" per step."""
    from diffusers import FluxTransformer2DModel
    from diffusers.hooks import MagCacheConfig, apply_mag_cache

    torch.manual_seed(0)
    model = FluxTransformer2DModel(
        patch_size=1, in_channels=8, num_layers=2, num_single_layers=2, attention_head_dim=8,
        num_attention_heads=2, joint_attention_dim=16, pooled_projection_dim=8, guidance_embeds=False,
        axes_dims_rope=(2, 2, 4),
    ).eval()
    apply_mag_cache(model, MagCacheConfig(
        threshold=threshold, max_skip_steps=max_skip_steps, retention_ratio=retention_ratio,
        num_inference_steps=steps, mag_ratios=ratios,
    ))
    computed: list[int] = []
    model.transformer_blocks[0].attn.register_forward_pre_hook(lambda *_: computed.append(1))
    hidden = torch.randn(1, 16, 8)
    pattern = ""
    with torch.no_grad():
        for step in range(steps):
            before = len(computed)
            model(hidden_states=hidden, encoder_hidden_states=torch.randn(1, 4, 16),
                  pooled_projections=torch.randn(1, 8), timestep=torch.tensor([1.0 - step / steps]),
                  img_ids=torch.zeros(16, 3), txt_ids=torch.zeros(4, 3))
            pattern += "C" if len(computed) > before else "S"
    return pattern


@pytest.mark.parametrize(
    ("threshold", "max_skips", "retention"),
    [(0.06, 2, 0.2), (0.12, 3, 0.2), (0.24, 5, 0.1), (0.03, 1, 0.0), (0.5, 4, 0.25)],
)
def test_magcache_decisions_equal_diffusers(host, threshold, max_skips, retention):
    from harness.sampling import Job, apply, pack, patterns, tiny, uniform_sigmas

    steps = len(FLUX_RATIOS)
    expected = diffusers_magcache_pattern(threshold, max_skips, retention, steps, FLUX_RATIOS)
    assert "S" in expected and "C" in expected

    ratios = pack("cache_core").MagRatios.from_table(FLUX_RATIOS, steps, interleaved=False)
    model = tiny().build_model("flux", seed=0)
    patched, node_id = apply(model, "magcache", threshold=threshold, max_consecutive_skips=max_skips,
                             retention_ratio=retention, ratios=ratios)
    # cfg 1: one model call per step, as in diffusers' pipeline for FLUX.
    Job("flux", cfg=1.0, steps=steps).run_sigmas(patched, uniform_sigmas(patched, steps))
    assert patterns(node_id) == {"cond": expected}


def test_teacache_signal_and_decisions_equal_the_published_formula(host):
    from harness.sampling import Job, install, stats, tiny

    model = tiny().build_model("flux", seed=0)
    block = model.model.diffusion_model.double_blocks[0]
    recorded: list[torch.Tensor] = []

    def record_modulated_input(args: dict, extra: dict) -> dict:
        # The paper's signal, written out here: (1 + scale) * LayerNorm(img) + shift of block 0.
        shift, scale = block.img_mod.lin(torch.nn.functional.silu(args["vec"]))[:, None, :].chunk(6, dim=-1)[:2]
        normed = torch.nn.functional.layer_norm(args["img"], args["img"].shape[-1:], eps=1e-6)
        recorded.append((normed * (1 + scale) + shift).clone())
        return hook(args, extra)

    job = Job("flux", cfg=1.0, steps=20)
    threshold, max_skips = 0.3, 3
    patched, node_id = install(model, "teacache", threshold=threshold, max_consecutive_skips=max_skips,
                               variant="flux.1-dev", record_trace=True)
    dit = patched.model_options["transformer_options"]["patches_replace"]["dit"]
    hook = dit[("double_block", 0)]
    record_modulated_input.__wrapped__ = hook  # it wraps the pack's hook, and says so: the run still caches
    dit[("double_block", 0)] = record_modulated_input
    job.run(patched)
    trace = stats(node_id)["trace"]
    assert len(recorded) == job.steps == len(trace)

    rescale = np.poly1d(FLUX_TEACACHE)
    accumulated, consecutive, pattern = 0.0, 0, ""
    for step in range(job.steps):
        signal = None
        if step > 0:
            previous, current = recorded[step - 1], recorded[step]
            signal = ((current - previous).abs().mean() / previous.abs().mean()).item()
            assert trace[step]["signal"] == pytest.approx(signal, rel=1e-5)
        if step in (0, job.steps - 1):
            skip = False
        else:
            accumulated += rescale(signal)
            assert trace[step]["accumulated"] == pytest.approx(accumulated, rel=1e-5)
            skip = accumulated < threshold and consecutive < max_skips
        pattern += "S" if skip else "C"
        consecutive = consecutive + 1 if skip else 0
        if not skip:
            accumulated = 0.0
    assert "S" in pattern and pattern.count("C") > 2, pattern
    assert stats(node_id)["branches"][0]["pattern"] == pattern
