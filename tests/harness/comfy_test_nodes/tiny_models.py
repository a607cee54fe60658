"""Tiny models of each supported family, built with ComfyUI's own model classes.

Weights are random (seeded): they prove mechanics, not image quality. Each entry gives the
``comfy.supported_models`` class, a small ``unet_config``, the latent shape and a conditioning
maker, so a test can sample any family through ComfyUI's real samplers in well under a second.

Each config keeps the block *layout* of the real model (which block kinds exist, token order,
modulation style, hard-wired dimensions) and shrinks only widths and depths, so hooks that work
here meet the same call structure as on the full-size checkpoints.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace

import comfy.model_patcher
import comfy.supported_models
import torch

# extra_cond(batch, tokens, generator) -> extra conditioning values (pooled output, guidance,
# attention masks, ...) for a batch of this size and a text context of this many tokens.
ExtraCond = Callable[[int, int, torch.Generator], dict]


def _no_extra(batch: int, tokens: int, gen: torch.Generator) -> dict:
    return {}


@dataclass(frozen=True)
class TinyFamily:
    name: str
    config_class: str  # attribute of comfy.supported_models
    unet_config: dict
    latent_channels: int
    # (H, W) for 4-D latents; (T, H, W) for 5-D ones: video models, and the image models that
    # ComfyUI runs on 5-D latents with T=1 (Qwen-Image, Cosmos-Predict2).
    latent_spatial: tuple[int, ...]
    context_dim: int
    context_tokens: int = 8
    extra_cond: ExtraCond = field(default=_no_extra)

    @property
    def is_video(self) -> bool:
        """True when the latent is 5-D (B, C, T, H, W)."""
        return len(self.latent_spatial) == 3


FAMILIES: dict[str, TinyFamily] = {}


def register(family: TinyFamily) -> TinyFamily:
    FAMILIES[family.name] = family
    return family


def _pooled(dim: int, **extra: object) -> ExtraCond:
    """A CLIP-style pooled output of width ``dim`` plus constant extras such as guidance.

    ``dim=0`` gives ``pooled_output=None``: that family's text encoder has no pooled vector, but
    ComfyUI's encode_adm still reads the key (KeyError without it)."""

    def make(batch: int, tokens: int, gen: torch.Generator) -> dict:
        pooled = torch.randn(batch, dim, generator=gen) if dim else None
        return {"pooled_output": pooled, **extra}

    return make


# --- Flux family: double blocks then single blocks over cat(txt, img) ------------------------

register(TinyFamily(
    name="flux",
    config_class="Flux",
    unet_config=dict(
        image_model="flux", in_channels=16, out_channels=16, vec_in_dim=32, context_in_dim=64,
        hidden_size=64, mlp_ratio=4.0, num_heads=2, depth=2, depth_single_blocks=2,
        axes_dim=[8, 12, 12], theta=10000, patch_size=2, qkv_bias=True, guidance_embed=True,
    ),
    latent_channels=16, latent_spatial=(16, 16), context_dim=64, extra_cond=_pooled(32, guidance=3.5),
))

# Flux.2: 128-channel latent at patch 1, shared ("global") modulation computed once outside the
# blocks, SiLU-gated MLPs, no biases, 4 RoPE axes. ComfyUI pads the text to 512 tokens.
register(TinyFamily(
    name="flux2",
    config_class="Flux2",
    unet_config=dict(
        image_model="flux2", in_channels=128, out_channels=128, vec_in_dim=None, context_in_dim=64,
        hidden_size=64, mlp_ratio=3.0, num_heads=2, depth=2, depth_single_blocks=2,
        axes_dim=[8, 8, 8, 8], theta=2000, patch_size=1, qkv_bias=False, guidance_embed=True,
        global_modulation=True, mlp_silu_act=True, ops_bias=False, default_ref_method="index",
        ref_index_scale=10.0,
    ),
    latent_channels=128, latent_spatial=(8, 8), context_dim=64, extra_cond=_pooled(0, guidance=4.0),
))

# Chroma: Flux blocks without per-block modulation; an "approximator" MLP makes all modulation
# vectors at once. Its input width (64 = 16 timestep + 16 guidance + 32 index) is hard-coded,
# and its output width must equal hidden_size. Patch size 2 with in_channels already patchified.
register(TinyFamily(
    name="chroma",
    config_class="Chroma",
    unet_config=dict(
        image_model="chroma", in_channels=64, out_channels=64, context_in_dim=64, hidden_size=64,
        mlp_ratio=4.0, num_heads=2, depth=2, depth_single_blocks=2, axes_dim=[8, 12, 12],
        theta=10000, patch_size=2, qkv_bias=True, in_dim=64, out_dim=64, hidden_dim=64, n_layers=2,
    ),
    latent_channels=16, latent_spatial=(16, 16), context_dim=64, extra_cond=_pooled(0),
))

# --- HunyuanVideo: Flux-like blocks, but single blocks run over cat(img, txt) -----------------

register(TinyFamily(
    name="hunyuan_video",
    config_class="HunyuanVideo",
    unet_config=dict(
        image_model="hunyuan_video", in_channels=16, out_channels=16, vec_in_dim=32,
        context_in_dim=64, hidden_size=64, mlp_ratio=4.0, num_heads=2, depth=2,
        depth_single_blocks=2, axes_dim=[8, 12, 12], theta=256, patch_size=[1, 2, 2],
        qkv_bias=True, guidance_embed=True, byt5=False, meanflow=False,
        use_cond_type_embedding=False, vision_in_dim=None,
    ),
    latent_channels=16, latent_spatial=(3, 8, 8), context_dim=64, extra_cond=_pooled(32, guidance=6.0),
))

# HunyuanVideo 1.5: only double blocks (the real model has 54 and no single blocks), patch 1,
# 32-channel latent plus a 33-channel image/mask concat (in_channels 65), no pooled vector.
# vision_in_dim=1152 is what ComfyUI keys the class on; byt5 (glyph text) is left out.
register(TinyFamily(
    name="hunyuan_video15",
    config_class="HunyuanVideo15",
    unet_config=dict(
        image_model="hunyuan_video", in_channels=65, out_channels=32, vec_in_dim=None,
        context_in_dim=64, hidden_size=64, mlp_ratio=4.0, num_heads=2, depth=2,
        depth_single_blocks=0, axes_dim=[8, 12, 12], theta=256, patch_size=[1, 1, 1],
        qkv_bias=True, guidance_embed=False, byt5=False, meanflow=False,
        use_cond_type_embedding=True, vision_in_dim=1152,
    ),
    latent_channels=32, latent_spatial=(2, 4, 4), context_dim=64, extra_cond=_pooled(0),
))

# --- Other MMDiT-style image models -----------------------------------------------------------

# Qwen-Image: one kind of dual-stream block; in_channels is the 2x2-packed latent (16 * 4).
register(TinyFamily(
    name="qwen_image",
    config_class="QwenImage",
    unet_config=dict(
        image_model="qwen_image", patch_size=2, in_channels=64, out_channels=16, num_layers=2,
        attention_head_dim=32, num_attention_heads=2, joint_attention_dim=64,
        axes_dims_rope=(8, 12, 12),
    ),
    latent_channels=16, latent_spatial=(1, 16, 16), context_dim=64,
))

# SD3: MMDiT joint blocks; the width is 64 * depth by construction and the last block's
# context stream is "pre_only". A small learned position table keeps the model tiny.
register(TinyFamily(
    name="sd3",
    config_class="SD3",
    unet_config=dict(
        in_channels=16, out_channels=16, depth=2, patch_size=2, input_size=None,
        adm_in_channels=32, pos_embed_scaling_factor=None, pos_embed_max_size=16, num_patches=256,
        context_embedder_config={"target": "torch.nn.Linear", "params": {"in_features": 64, "out_features": 128}},
        x_block_self_attn_layers=[],
    ),
    latent_channels=16, latent_spatial=(16, 16), context_dim=64, extra_cond=_pooled(32),
))

# Lumina 2: single-stream blocks over cat(caption, image) after separate refiner stacks;
# no dit block patches. multiple_of rounds the FFN up to 256, which is still small.
register(TinyFamily(
    name="lumina2",
    config_class="Lumina2",
    unet_config=dict(
        image_model="lumina2", patch_size=2, in_channels=16, dim=64, cap_feat_dim=64, n_layers=2,
        n_refiner_layers=2, n_heads=2, n_kv_heads=1, qk_norm=True, axes_dims=[8, 12, 12],
        axes_lens=[300, 512, 512], rope_theta=10000.0, ffn_dim_multiplier=4.0,
    ),
    latent_channels=16, latent_spatial=(16, 16), context_dim=64,
))


def _hidream_extra(batch: int, tokens: int, gen: torch.Generator) -> dict:
    # Llama hidden states of every selected layer: (batch, layers, tokens, width); each block
    # reads the layer llama_layers[block] of it (see HIDREAM_LLAMA_LAYERS).
    llama = torch.randn(batch, len(HIDREAM_LLAMA_LAYERS), tokens, 64, generator=gen)
    return {"pooled_output": torch.randn(batch, 32, generator=gen), "conditioning_llama3": llama}


# One llama layer per block: num_layers + num_single_layers entries.
HIDREAM_LLAMA_LAYERS = [0, 1, 2, 3]

# HiDream: dual-stream then single-stream blocks with MoE feed-forwards; no dit block patches.
register(TinyFamily(
    name="hidream",
    config_class="HiDream",
    unet_config=dict(
        image_model="hidream", patch_size=2, in_channels=16, out_channels=16, num_layers=2,
        num_single_layers=2, attention_head_dim=32, num_attention_heads=2,
        caption_channels=[64, 64], text_emb_dim=32, num_routed_experts=4, num_activated_experts=2,
        axes_dims_rope=[16, 8, 8], max_resolution=[128, 128], llama_layers=HIDREAM_LLAMA_LAYERS,
    ),
    latent_channels=16, latent_spatial=(16, 16), context_dim=64, extra_cond=_hidream_extra,
))

# Cosmos-Predict2 (text-to-image): self/cross-attention blocks over a (B, T, H, W, D) grid with
# AdaLN-LoRA modulation; no dit block patches.
register(TinyFamily(
    name="cosmos_predict2",
    config_class="CosmosT2IPredict2",
    unet_config=dict(
        image_model="cosmos_predict2", max_img_h=240, max_img_w=240, max_frames=128,
        in_channels=16, out_channels=16, patch_spatial=2, patch_temporal=1,
        concat_padding_mask=True, model_channels=64, num_blocks=2, num_heads=2,
        crossattn_emb_channels=64, pos_emb_cls="rope3d", pos_emb_learnable=True,
        pos_emb_interpolation="crop", min_fps=1, max_fps=30, use_adaln_lora=True,
        adaln_lora_dim=32, extra_per_block_abs_pos_emb=False, rope_h_extrapolation_ratio=4.0,
        rope_w_extrapolation_ratio=4.0, rope_t_extrapolation_ratio=1.0,
        extra_h_extrapolation_ratio=1.0, extra_w_extrapolation_ratio=1.0,
        extra_t_extrapolation_ratio=1.0, rope_enable_fps_modulation=False,
    ),
    latent_channels=16, latent_spatial=(1, 16, 16), context_dim=64,
))


def _ltxv_extra(batch: int, tokens: int, gen: torch.Generator) -> dict:
    # LTXVModel.forward takes attention_mask positionally, so the T5 mask is required.
    return {"attention_mask": torch.ones(batch, tokens, dtype=torch.long)}


# LTX-Video: single-stream blocks with cross-attention to the text; the blocks update the image
# tokens in place. cross_attention_dim must equal heads * head_dim (the caption projection's width).
register(TinyFamily(
    name="ltxv",
    config_class="LTXV",
    unet_config=dict(
        image_model="ltxv", in_channels=128, cross_attention_dim=64, attention_head_dim=32,
        num_attention_heads=2, caption_channels=64, num_layers=2,
    ),
    latent_channels=128, latent_spatial=(2, 4, 4), context_dim=64, extra_cond=_ltxv_extra,
))

# --- Wan ------------------------------------------------------------------------------------

_WAN_BASE = dict(
    image_model="wan2.1", model_type="t2v", dim=128, ffn_dim=256, num_heads=1, num_layers=2,
    in_dim=16, out_dim=16, freq_dim=256, text_dim=4096, patch_size=(1, 2, 2), window_size=(-1, -1),
    qk_norm=True, cross_attn_norm=True, eps=1e-6,
)

register(TinyFamily(
    name="wan21",
    config_class="WAN21_T2V",
    unet_config=dict(_WAN_BASE),
    latent_channels=16, latent_spatial=(3, 8, 8), context_dim=4096,
))

# VACE: vace_in_dim is fixed by ComfyUI's default VACE conditioning (32 frame + 64 mask
# channels); one VACE block on a two-block trunk adds a hint after block 0 only, so hinted and
# plain blocks alternate as in the real 1.3B layout (15 VACE blocks on 30).
register(TinyFamily(
    name="wan21_vace",
    config_class="WAN21_Vace",
    unet_config=dict(_WAN_BASE, text_dim=64, model_type="vace", vace_layers=1, vace_in_dim=96),
    latent_channels=16, latent_spatial=(3, 8, 8), context_dim=64,
))

# Wan 2.2 TI2V-5B layout: 48-channel latent in and out.
register(TinyFamily(
    name="wan22_5b",
    config_class="WAN22_T2V",
    unet_config=dict(_WAN_BASE, text_dim=64, in_dim=48, out_dim=48),
    latent_channels=48, latent_spatial=(3, 8, 8), context_dim=64,
))


def _wan_i2v_extra(batch: int, tokens: int, gen: torch.Generator) -> dict:
    # CLIP-vision tokens (257 x 1280 as from ViT-H) become extra context before the text; the
    # start-image concat is left to ComfyUI's default (zeros plus mask).
    clip = SimpleNamespace(penultimate_hidden_states=torch.randn(batch, 257, 1280, generator=gen))
    return {"clip_vision_output": clip}


# Wan 2.1 I2V: in_dim 36 = 16 noise + 4 mask + 16 image channels; image cross-attention.
register(TinyFamily(
    name="wan21_i2v",
    config_class="WAN21_I2V",
    unet_config=dict(_WAN_BASE, text_dim=64, model_type="i2v", in_dim=36),
    latent_channels=16, latent_spatial=(3, 8, 8), context_dim=64, extra_cond=_wan_i2v_extra,
))


def random_state_dict(model: torch.nn.Module, seed: int) -> dict[str, torch.Tensor]:
    """Seeded weights with sane scales: fan-in scaled matrices, unit norm weights, small vectors."""
    gen = torch.Generator().manual_seed(seed)
    state = {}
    for name, tensor in model.state_dict().items():
        shape = tensor.shape
        if tensor.ndim >= 2:
            fan_in = max(1, tensor[0].numel())
            value = torch.randn(shape, generator=gen) / fan_in**0.5
        elif "norm" in name and name.endswith(("weight", "scale")):
            value = torch.ones(shape)
        else:
            value = 0.02 * torch.randn(shape, generator=gen)
        state[name] = value.to(tensor.dtype) if tensor.is_floating_point() else tensor
    return state


def build_model(family: str, seed: int = 0) -> comfy.model_patcher.ModelPatcher:
    spec = FAMILIES[family]
    config = getattr(comfy.supported_models, spec.config_class)(dict(spec.unet_config))
    config.set_inference_dtype(torch.float32, None)
    model = config.get_model({}, "")
    model.load_model_weights(random_state_dict(model.diffusion_model, seed), "")
    model.eval()
    device = torch.device("cpu")
    return comfy.model_patcher.ModelPatcher(model, load_device=device, offload_device=device)


def conditioning(family: str, seed: int = 0, batch: int = 1, tokens: int | None = None) -> list:
    spec = FAMILIES[family]
    gen = torch.Generator().manual_seed(seed)
    n_tokens = tokens or spec.context_tokens
    context = torch.randn(batch, n_tokens, spec.context_dim, generator=gen)
    return [[context, spec.extra_cond(batch, n_tokens, gen)]]


def empty_latent(family: str, batch: int = 1, scale: int = 1, frames: int | None = None) -> dict:
    """An empty latent; ``scale`` multiplies the spatial size, ``frames`` sets the video length."""
    spec = FAMILIES[family]
    spatial = list(spec.latent_spatial)
    spatial[-2] *= scale
    spatial[-1] *= scale
    if spec.is_video and frames is not None:
        spatial[0] = frames
    return {"samples": torch.zeros(batch, spec.latent_channels, *spatial)}


# A model the pack does not cache (an SD1.5 UNet), to show it passes through untouched.
SD15_UNET_CONFIG = {
    "use_checkpoint": False, "image_size": 32, "in_channels": 4, "out_channels": 4, "model_channels": 32,
    "num_res_blocks": [1], "channel_mult": [1], "transformer_depth": [0], "transformer_depth_output": [0, 0],
    "transformer_depth_middle": 0, "use_spatial_transformer": True, "legacy": False, "adm_in_channels": None,
    "use_linear_in_transformer": False, "context_dim": 32, "num_heads": 1, "num_head_channels": -1,
    "use_temporal_resblock": False, "use_temporal_attention": False,
}


def build_sd15_unet(seed: int = 0) -> comfy.model_patcher.ModelPatcher:
    config = comfy.supported_models.SD15(dict(SD15_UNET_CONFIG))
    config.set_inference_dtype(torch.float32, None)
    model = config.get_model({}, "")
    model.load_model_weights(random_state_dict(model.diffusion_model, seed), "")
    model.eval()
    device = torch.device("cpu")
    return comfy.model_patcher.ModelPatcher(model, load_device=device, offload_device=device)


def build_flux_controlnet(seed: int = 0) -> object:
    """A tiny FLUX ControlNet (InstantX style, latent hint) around ComfyUI's ControlNetFlux."""
    import comfy.controlnet
    import comfy.ldm.flux.controlnet
    import comfy.ops

    config = {k: v for k, v in FAMILIES["flux"].unet_config.items() if k != "image_model"}
    control_model = comfy.ldm.flux.controlnet.ControlNetFlux(
        latent_input=True, operations=comfy.ops.disable_weight_init, **config
    )
    control_model.load_state_dict(random_state_dict(control_model, seed))
    return comfy.controlnet.ControlNet(
        control_model, compression_ratio=1, latent_format=None, load_device=torch.device("cpu"),
        manual_cast_dtype=None, extra_conds=["y", "guidance"],
    )
