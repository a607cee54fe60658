"""Published constants reach only the models they were measured on, and every run says which it used.

The full-size architectures are ComfyUI's own model classes built on the meta device (no memory,
no weights): each tiny template's checkpoint keys go through ComfyUI's detection as usual, and the
release's sizes (widths, depths, heads) are laid over detection's config, as the template's own
overlay does for the tiny sizes. So the shapes the pack compares are the ones ComfyUI builds for
the real checkpoints, on every supported version.
"""

from __future__ import annotations

import logging
import pathlib

import pytest

TEMPLATES = pathlib.Path(__file__).resolve().parent / "harness" / "comfy_test_nodes" / "templates"

FLUX1 = {"hidden_size": 3072, "depth": 19, "depth_single_blocks": 38, "num_heads": 24, "axes_dim": [16, 56, 56],
         "vec_in_dim": 768, "context_in_dim": 4096}
WAN_1_3B = {"dim": 1536, "ffn_dim": 8960, "num_heads": 12, "num_layers": 30, "text_dim": 4096}
WAN_14B = {"dim": 5120, "ffn_dim": 13824, "num_heads": 40, "num_layers": 40, "text_dim": 4096}
HUNYUAN_T2V = {"hidden_size": 3072, "depth": 20, "depth_single_blocks": 40, "num_heads": 24,
               "axes_dim": [16, 56, 56], "vec_in_dim": 768, "context_in_dim": 4096}

# name -> (tiny template, the release's sizes, ComfyUI class to build (None: detection's))
FULL_SIZE = {
    "FLUX.1-dev": ("flux", FLUX1, None),
    "FLUX.1-schnell": ("flux", FLUX1 | {"guidance_embed": False}, "FluxSchnell"),
    "FLUX.1-Fill-dev": ("flux", FLUX1 | {"in_channels": 96, "out_channels": 16}, "FluxInpaint"),
    "LongCat-Image": ("flux", FLUX1 | {"guidance_embed": False, "vec_in_dim": None, "context_in_dim": 3584},
                      "LongCatImage"),
    "Chroma": ("chroma", {"hidden_size": 3072, "depth": 19, "depth_single_blocks": 38, "num_heads": 24,
                          "axes_dim": [16, 56, 56], "context_in_dim": 4096, "out_dim": 3072, "hidden_dim": 5120,
                          "n_layers": 5}, None),
    "Wan2.1-T2V-1.3B": ("wan21", WAN_1_3B, None),
    "Wan2.1-T2V-14B": ("wan21", WAN_14B, None),
    "Wan2.1-I2V-14B": ("wan21_i2v", WAN_14B, None),
    "Wan2.2-I2V-A14B": ("wan21", WAN_14B | {"in_dim": 36}, None),
    "Wan2.1-VACE-1.3B": ("wan21_vace", WAN_1_3B, None),
    "Wan2.1-VACE-14B": ("wan21_vace", WAN_14B, None),
    "Wan2.2-TI2V-5B": ("wan22_5b", {"dim": 3072, "ffn_dim": 14336, "num_heads": 24, "num_layers": 30,
                                    "text_dim": 4096}, None),
    "HunyuanVideo-T2V": ("hunyuan_video", HUNYUAN_T2V, None),
    "HunyuanVideo-I2V": ("hunyuan_video", HUNYUAN_T2V | {"in_channels": 33}, "HunyuanVideoI2V"),
    "HunyuanVideo-1.5": ("hunyuan_video15", {"hidden_size": 2048, "depth": 54, "num_heads": 16,
                                             "axes_dim": [16, 56, 56]}, None),
    "Qwen-Image": ("qwen_image", {"num_layers": 60, "num_attention_heads": 24, "attention_head_dim": 128,
                                  "axes_dims_rope": [16, 56, 56], "joint_attention_dim": 3584}, None),
    "LTX-Video-2B": ("ltxv", {"num_layers": 28, "num_attention_heads": 32, "attention_head_dim": 64,
                              "cross_attention_dim": 2048, "caption_channels": 4096}, None),
    "LTX-Video-13B": ("ltxv", {"num_layers": 48, "num_attention_heads": 32, "attention_head_dim": 128,
                               "cross_attention_dim": 4096, "caption_channels": 4096}, None),
    # What detection fills for every Mochi checkpoint; the tiny template's overlay shrinks it.
    "Mochi-1-preview": ("mochi", {"depth": 48, "num_heads": 24, "hidden_size_x": 3072, "hidden_size_y": 1536,
                                  "mlp_ratio_x": 4.0, "t5_feat_dim": 4096}, None),
}

LATENT_480P = (1, 16, 21, 60, 104)
LATENT_720P = (1, 16, 21, 90, 160)
REFERENCE = {"positive": [{"reference_latents": []}]}

# (model, run context) -> the variant auto resolves it to
EXPECTED = [
    ("FLUX.1-dev", {}, "flux.1-dev"),
    ("FLUX.1-dev", {"conds": REFERENCE}, "flux.1-kontext"),
    ("FLUX.1-schnell", {}, "flux.1-schnell"),
    ("FLUX.1-Fill-dev", {}, "flux-architecture"),
    ("LongCat-Image", {}, "longcat-image"),
    ("LongCat-Image", {"conds": REFERENCE}, "longcat-image"),
    ("Chroma", {}, "chroma"),
    ("Wan2.1-T2V-1.3B", {}, "wan2.1-t2v-1.3b"),
    ("Wan2.1-T2V-14B", {}, "wan2.1-t2v-14b"),
    ("Wan2.1-I2V-14B", {"latent_shape": LATENT_480P}, "wan2.1-i2v-480p"),
    ("Wan2.1-I2V-14B", {"latent_shape": LATENT_720P}, "wan2.1-i2v-720p"),
    ("Wan2.2-I2V-A14B", {}, "wan-architecture"),
    ("Wan2.1-VACE-1.3B", {}, "wan2.1-vace-1.3b"),
    ("Wan2.1-VACE-14B", {}, "wan2.1-vace-14b"),
    ("Wan2.2-TI2V-5B", {}, "wan2.2-ti2v-5b-t2v"),
    ("Wan2.2-TI2V-5B", {"has_denoise_mask": True}, "wan2.2-ti2v-5b-i2v"),
    ("HunyuanVideo-T2V", {"latent_shape": (1, 16, 19, 90, 160)}, "hunyuanvideo-720p"),
    ("HunyuanVideo-T2V", {"latent_shape": (1, 16, 19, 68, 120)}, "hunyuanvideo-544p"),
    ("HunyuanVideo-I2V", {}, "hunyuanvideo-i2v"),
    ("HunyuanVideo-1.5", {"steps": 20}, "hunyuanvideo1.5-20step"),
    ("HunyuanVideo-1.5", {"steps": 50}, "hunyuanvideo1.5-40step"),
    ("Qwen-Image", {}, "qwen-image"),
    ("Qwen-Image", {"conds": REFERENCE}, "qwen-image-edit"),
    ("LTX-Video-2B", {}, "ltx-video"),
    ("LTX-Video-13B", {}, "ltxv-architecture"),
    ("Mochi-1-preview", {}, "mochi-1-preview"),
]


@pytest.fixture(scope="module")
def full_size(host):
    """name -> the full-size model (ComfyUI's BaseModel) on the meta device, built once."""
    import comfy.supported_models
    import torch

    builder = host.pack_module("demo.model_builder")
    built = {}

    def get(name: str):
        if name not in built:
            template_name, sizes, config_class = FULL_SIZE[name]
            if config_class and not hasattr(comfy.supported_models, config_class):
                pytest.skip(f"this ComfyUI has no {config_class} class")
            template = builder.Template.load(TEMPLATES / f"{template_name}.json")
            state_dict = {k: torch.empty(shape, device="meta") for k, shape in template.shapes.items()}
            config = builder.model_config(state_dict, {**template.overlay, **sizes}, config_class)
            config.set_inference_dtype(torch.bfloat16, None)
            built[name] = config.get_model({}, "", device="meta")
        return built[name]

    return get


@pytest.mark.parametrize(("model", "context", "variant"), EXPECTED,
                         ids=[f"{m}-{v}" for m, _, v in EXPECTED])
def test_auto_gives_published_constants_only_to_their_architecture(host, full_size, model, context, variant):
    families = host.pack_module("families")
    base_model = full_size(model)
    family = families.family_for(base_model)
    resolved = family.resolve_variant(base_model, families.RunContext(**context))
    assert resolved.name == variant, family.shape(base_model.diffusion_model)
    if resolved is family.generic:
        assert resolved.published("teacache") is None and resolved.published("magcache") is None
        assert resolved.label.endswith("-architecture model (not a published checkpoint)")


def test_flux1_dev_gets_the_flux1_tables_and_says_whose_they_are(host, full_size):
    families = host.pack_module("families")
    dev = families.FLUX.resolve_variant(full_size("FLUX.1-dev"), families.RunContext())
    assert dev.magcache is host.pack_module("families.published_magcache").FLUX_DEV
    assert dev.describe_published("magcache") == "published FLUX.1-dev ratios (Zehong-Ma/MagCache)"
    assert dev.describe_published("teacache") == "published FLUX.1-dev coefficients (ali-vilab/TeaCache)"


def test_magcache_on_auto_is_possible_only_where_some_published_table_fits(host, full_size):
    """What ApplyMagCache checks at the node: a variant the model may resolve to has ratios."""
    families = host.pack_module("families")

    def has_ratios(name: str) -> bool:
        model = full_size(name)
        return any(v.magcache is not None for v in families.family_for(model).possible_variants(model))

    assert has_ratios("FLUX.1-dev") and has_ratios("Wan2.1-I2V-14B") and has_ratios("Qwen-Image")
    assert not has_ratios("FLUX.1-schnell") and not has_ratios("LongCat-Image") and not has_ratios("FLUX.1-Fill-dev")
    assert not has_ratios("Wan2.2-I2V-A14B") and not has_ratios("LTX-Video-2B")
    # Wan 2.2 A14B cannot be told from other shapes; its own table is chosen by name, and fits it.
    a14b = full_size("Wan2.2-I2V-A14B")
    assert families.WAN.has_architecture(a14b, families.WAN.variant("wan2.2-i2v-a14b"))
    assert not families.WAN.has_architecture(full_size("Wan2.1-T2V-14B"), families.WAN.variant("wan2.2-i2v-a14b"))


def test_every_published_table_names_its_checkpoint_and_architecture(host):
    families = host.pack_module("families")
    published = [v for f in families.FAMILIES for v in f.variants if v.teacache or v.magcache]
    assert len(published) >= 15
    for variant in published:
        assert variant.checkpoint and variant.architecture is not None, variant.name
        for method in ("teacache", "magcache"):
            if variant.published(method) is not None:
                assert variant.describe_published(method).startswith(f"published {variant.checkpoint} ")
    with pytest.raises(ValueError, match="architecture"):
        families.Variant("borrowed", teacache=published[0].teacache)


def test_teacache_on_a_model_without_published_coefficients_runs_unscaled_and_says_so(host, caplog):
    from harness.sampling import Job, apply, stats

    flux = host.test_module("tiny_models").build_model("flux", seed=0)
    with caplog.at_level(logging.WARNING, logger="stepcache"):
        patched, node_id = apply(flux, "teacache", threshold=0.2)
        Job("flux").run(patched)
    run = stats(node_id)
    assert run["label"] == "flux / flux-architecture model (not a published checkpoint)"
    assert run["constants"] == "none: unscaled signal"
    assert run["summary"].startswith("TeaCache (none: unscaled signal): ")
    (warning,) = [r.getMessage() for r in caplog.records if r.name == "stepcache"]
    assert "unscaled signal" in warning and "TeaCacheCalibrate" in warning


def test_magcache_settings_without_ratios_sample_uncached_with_the_reason(host):
    """What the run does if settings reach it without any ratios (ApplyMagCache refuses such a model
    at the node; settings installed directly, as a library user may, get here)."""
    import torch

    from harness.sampling import Job, install, stats

    flux = host.test_module("tiny_models").build_model("flux", seed=0)
    patched, node_id = install(flux, "magcache", threshold=5.0, max_consecutive_skips=10)
    job = Job("flux")
    assert torch.equal(job.run(patched), job.run(flux))
    run = stats(node_id)
    assert run["method"] == "MagCache" and run["constants"] == "none" and run["calls_skipped"] == 0
    assert run["disabled_reason"] == ("no MagCache ratios for this model (flux-architecture model (not a published "
                                      "checkpoint)); calibrate it with MagCacheCalibrate")
