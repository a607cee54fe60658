"""demo/model_builder.py: models load from checkpoint-format state dicts through ComfyUI's detection."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module")
def builder(host):
    return host.pack_module("demo.model_builder")


@pytest.fixture(scope="module")
def flux_template(host):
    return host.test_module("tiny_models").FAMILIES["flux"].template


def test_a_missing_weight_is_an_error_not_uninitialised_memory(builder, flux_template):
    state = builder.random_state_dict(flux_template, seed=0)
    del state["double_blocks.1.img_attn.proj.weight"]
    with pytest.raises(ValueError, match=r"lacks weights .*double_blocks\.1\.img_attn\.proj\.weight"):
        builder.build_model(state, flux_template.overlay)


def test_the_model_holds_exactly_the_given_weights(builder, flux_template):
    state = builder.random_state_dict(flux_template, seed=5)
    model = builder.build_model(state, flux_template.overlay)
    assert builder.checkpoint_state_dict(model, flux_template).keys() == state.keys()
    assert all(torch.equal(v, state[k]) for k, v in builder.checkpoint_state_dict(model, flux_template).items())


def test_the_overlay_sets_what_detection_cannot_see(builder, flux_template):
    state = builder.random_state_dict(flux_template, seed=0)
    detected = builder.model_config(state)  # FLUX.1's 24 heads of 128 and RoPE axes: 64 / 128 = 0 heads
    assert detected.unet_config["num_heads"] != flux_template.overlay["num_heads"]
    config = builder.model_config(state, flux_template.overlay)
    assert config.unet_config["num_heads"] == 2 and list(config.unet_config["axes_dim"]) == [8, 12, 12]


def test_an_explicit_class_overrides_a_sibling_detection_would_pick(builder, host):
    """The demo image model has no guidance embedding: detection says FluxSchnell (another
    schedule); it was trained, and is built, as Flux."""
    models = host.pack_module("demo.models")
    template = models.SPECS["image"].template
    state = models.init_state_dict("image", seed=0)
    assert type(builder.model_config(state, template.overlay)).__name__ == "FluxSchnell"
    assert type(builder.model_config(state, template.overlay, "Flux")).__name__ == "Flux"
    with pytest.raises(ValueError, match="no model class 'NoSuchModel'"):
        builder.model_config(state, template.overlay, "NoSuchModel")


def test_templates_round_trip_through_their_json(host, flux_template, tmp_path):
    path = tmp_path / "flux.json"
    path.write_text(flux_template.to_json())
    # (the instance the test nodes load by path, whose Template class the template is of)
    assert host.test_module("tiny_models").model_builder.Template.load(path) == flux_template


def test_random_weights_are_seeded_and_scaled(builder, flux_template):
    a = builder.random_state_dict(flux_template, seed=1)
    assert all(torch.equal(v, builder.random_state_dict(flux_template, seed=1)[k]) for k, v in a.items())
    assert not torch.equal(a["img_in.weight"], builder.random_state_dict(flux_template, seed=2)["img_in.weight"])
    assert torch.equal(a["double_blocks.0.img_attn.norm.key_norm.scale"], torch.ones(32))
    assert 0.5 < float(a["img_in.weight"].std() * 64**0.5) < 1.5  # fan-in 64
