"""Every tiny model family samples for real through ComfyUI's KSampler path (common_ksampler).

The family list is spelled out so collection needs no ComfyUI import; the first test keeps it in
step with the registry in harness/comfy_test_nodes/tiny_models.py.
"""

from __future__ import annotations

import pytest
import torch

FAMILY_NAMES = [
    "chroma",
    "cosmos_predict2",
    "flux",
    "flux2",
    "hidream",
    "hunyuan_video",
    "hunyuan_video15",
    "ltxv",
    "lumina2",
    "qwen_image",
    "sd3",
    "wan21",
    "wan21_i2v",
    "wan21_vace",
    "wan22_5b",
]

CFG = 3.0  # > 1, so every step runs the batched cond + uncond pass


def _sample(model, positive: list, negative: list, latent: dict, seed: int = 42) -> torch.Tensor:
    import nodes

    return nodes.common_ksampler(model, seed, 4, CFG, "euler", "simple", positive, negative, latent)[0]["samples"]


def test_every_registered_family_is_covered(host):
    tiny = host.test_module("tiny_models")
    assert sorted(tiny.FAMILIES) == FAMILY_NAMES


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_comfyui_detects_the_tiny_checkpoint_as_its_class(host, family):
    # ComfyUI's own detection picks the class from the template's keys and shapes (e.g. WAN22_T2V
    # by its 48 latent channels), so the tiny model is the variant the family name claims.
    tiny = host.test_module("tiny_models")
    spec = tiny.FAMILIES[family]
    assert spec.template.config_class is None  # nothing forced: what a user's UNETLoader would get
    config = tiny.model_builder.model_config(tiny.random_state_dict(family, 0), spec.template.overlay)
    assert type(config).__name__ == spec.config_class


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_tiny_family_samples_deterministically(host, family):
    tiny = host.test_module("tiny_models")
    model = tiny.build_model(family, seed=0)
    positive = tiny.conditioning(family, seed=1)
    negative = tiny.conditioning(family, seed=2)
    latent = tiny.empty_latent(family)

    first = _sample(model, positive, negative, latent)
    second = _sample(model, positive, negative, latent)

    assert first.shape == latent["samples"].shape
    assert torch.isfinite(first).all()
    assert first.abs().sum() > 0
    assert torch.equal(first, second)
    # The text conditioning reaches the model: another prompt gives another result.
    other = _sample(model, tiny.conditioning(family, seed=3), negative, latent)
    assert not torch.equal(first, other)
