"""Every tiny model family samples for real through ComfyUI's KSampler path (common_ksampler).

The family list is the registry in harness/comfy_test_nodes/tiny_models.py (tests/conftest.py
parametrizes ``tiny_family`` from it), and every family of the pack must have a tiny model.
"""

from __future__ import annotations

import torch

CFG = 3.0  # > 1, so every step runs the batched cond + uncond pass


def _sample(model, positive: list, negative: list, latent: dict, seed: int = 42) -> torch.Tensor:
    import nodes

    return nodes.common_ksampler(model, seed, 4, CFG, "euler", "simple", positive, negative, latent)[0]["samples"]


def test_every_family_of_the_pack_has_a_tiny_model(host):
    tiny = host.test_module("tiny_models")
    pack_families = {family.name for family in host.pack_module("families").FAMILIES}
    with_tiny_model = {spec.family for spec in tiny.FAMILIES.values()}
    assert pack_families <= with_tiny_model, f"no tiny model of {sorted(pack_families - with_tiny_model)}"
    unknown = sorted(with_tiny_model - pack_families)
    assert with_tiny_model <= pack_families, f"tiny models of unknown families {unknown}"


def test_comfyui_detects_the_tiny_checkpoint_as_its_class(host, tiny_family):
    family = tiny_family
    # ComfyUI's own detection picks the class from the template's keys and shapes (e.g. WAN22_T2V
    # by its 48 latent channels), so the tiny model is the variant the family name claims.
    tiny = host.test_module("tiny_models")
    spec = tiny.FAMILIES[family]
    state_dict = tiny.random_state_dict(family, 0)
    if spec.template.config_class is not None:
        # Detection keys these classes on the release's own sizes (LongCat-Image's text width,
        # Z-Image's and Kandinsky 5 image's widths) or reads no sizes (PixelDiT); the tiny
        # template names its class, as a loader that knows the model would.
        assert spec.template.config_class == spec.config_class
        assert family in {"longcat_image", "kandinsky5_image", "zimage_pixel", "pixeldit"}
    config = tiny.model_builder.model_config(state_dict, spec.template.overlay, spec.template.config_class)
    assert type(config).__name__ == spec.config_class


def test_tiny_family_samples_deterministically(host, tiny_family):
    family = tiny_family
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
