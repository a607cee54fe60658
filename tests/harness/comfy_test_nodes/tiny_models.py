"""Tiny models of each supported family, loaded by ComfyUI like a user's checkpoint.

Weights are random (seeded): they prove mechanics, not image quality. Each family has a
*template* in ``templates/<name>.json``: the checkpoint keys and shapes of a small instance, in the
checkpoint format of the real release, and the overlay of sizes ComfyUI's detection cannot read
from shapes (head counts, RoPE axes, ...). ``build_model`` fills it with seeded values and loads
it through ``demo/model_builder.py``: ComfyUI's own detection makes the config and its own
loader converts the keys, so the same template builds on every supported ComfyUI version (see
that module for why). The registry below adds the latent shape and a conditioning maker, so a
test can sample any family through ComfyUI's real samplers in well under a second.

Each template keeps the block *layout* of the real model (which block kinds exist, token order,
modulation style, hard-wired dimensions) and shrinks only widths and depths, so hooks that work
here meet the same call structure as on the full-size checkpoints.

Adding a tiny model of a new family:

1. Pick the smallest config that keeps the real layout (the comments below say what each
   family hard-wires), and write its template on the oldest supported ComfyUI that has the
   class (its module keys are the checkpoint format)::

       STEPCACHE_COMFYUI=0.3.75 ./dev py -m harness.tiny_template <ComfyUI class> '<config JSON>' \
           > tests/harness/comfy_test_nodes/templates/<name>.json

   (or write the JSON by hand from a real checkpoint's keys with shrunk shapes). The tool keeps
   only the config entries detection gets wrong in the overlay, and checks that detection picks
   the class (``--explicit-class`` names it in the template where detection picks a sibling).
2. ``register(TinyFamily(name=..., config_class=..., family=..., variant=..., latent_channels=...,
   latent_spatial=..., context_dim=..., extra_cond=...))`` below, with whatever extra
   conditioning the model reads; ``family`` and ``variant`` are what the pack must detect.
3. ``./dev test tests/test_tiny_families.py tests/test_families.py``: every registered family is
   built, sampled and checked against the pack's family registry on each supported ComfyUI (the
   test lists come from this registry); a family of the pack without a tiny model fails there. A
   model class that only newer ComfyUI versions have is skipped on older ones by
   ``TinyFamily.available`` (feature detection, not version numbers).
"""

from __future__ import annotations

import functools
import importlib.util
import pathlib
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType, SimpleNamespace

import comfy.model_patcher
import comfy.supported_models
import torch

TEMPLATES_DIR = pathlib.Path(__file__).resolve().parent / "templates"
REPO_ROOT = pathlib.Path(__file__).resolve().parents[3]


def _load_model_builder() -> ModuleType:
    """demo/model_builder.py, the pack's one model builder. ComfyUI loads these test nodes as a
    package of their own, beside the pack, so it is loaded by path (it imports only ComfyUI and
    torch), once per process."""
    name = "stepcache_model_builder"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "demo" / "model_builder.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


model_builder = _load_model_builder()

# extra_cond(batch, tokens, generator) -> extra conditioning values (pooled output, guidance,
# attention masks, ...) for a batch of this size and a text context of this many tokens.
ExtraCond = Callable[[int, int, torch.Generator], dict]


def _no_extra(batch: int, tokens: int, gen: torch.Generator) -> dict:
    return {}


@dataclass(frozen=True)
class TinyFamily:
    name: str
    config_class: str  # the comfy.supported_models class detection must pick for the template
    family: str  # the pack's family (families.FAMILIES) that must claim the model
    # The variant the pack must detect for a 12-step run (tests/test_families.py). A tiny model is
    # no published checkpoint: in a family with published constants it is the generic variant.
    variant: str
    latent_channels: int
    # (H, W) for 4-D latents; (T, H, W) for 5-D ones: video models, and the image models that
    # ComfyUI runs on 5-D latents with T=1 (Qwen-Image, Cosmos-Predict2).
    latent_spatial: tuple[int, ...]
    context_dim: int
    context_tokens: int = 8
    extra_cond: ExtraCond = field(default=_no_extra)
    # What else this ComfyUI must do for the cache to drive the model (feature detection), when
    # having the class is not enough: Wan 2.2 S2V's blocks get transformer_options from 0.30.0 on.
    requires: Callable[[], bool] | None = None

    @property
    def is_video(self) -> bool:
        """True when the latent is 5-D (B, C, T, H, W)."""
        return len(self.latent_spatial) == 3

    @property
    def template(self) -> model_builder.Template:
        return _template(self.name)

    def available(self) -> bool:
        """Whether this ComfyUI has the model class (some families exist only in newer ones) and
        does what ``requires`` asks."""
        return hasattr(comfy.supported_models, self.config_class) and (self.requires is None or self.requires())


@functools.cache
def _template(name: str) -> model_builder.Template:
    return model_builder.Template.load(TEMPLATES_DIR / f"{name}.json")


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
    family="flux", variant="flux-architecture",
    latent_channels=16, latent_spatial=(16, 16), context_dim=64, extra_cond=_pooled(32, guidance=3.5),
))

# Flux.2: 128-channel latent at patch 1, shared ("global") modulation computed once outside the
# blocks, SiLU-gated MLPs, no biases, 4 RoPE axes. ComfyUI pads the text to 512 tokens.
register(TinyFamily(
    name="flux2",
    config_class="Flux2",
    family="flux2", variant="flux.2",
    latent_channels=128, latent_spatial=(8, 8), context_dim=64, extra_cond=_pooled(0, guidance=4.0),
))

# LongCat-Image (ComfyUI 0.30.0): FLUX.1's blocks without guidance embedding or pooled vector,
# text from Qwen2.5-VL. Detection keys the class on that text width (3584; 64 here), so the
# template names the class.
register(TinyFamily(
    name="longcat_image",
    config_class="LongCatImage",
    family="flux", variant="longcat-image",
    latent_channels=16, latent_spatial=(16, 16), context_dim=64,
))

# Chroma: Flux blocks without per-block modulation; an "approximator" MLP makes all modulation
# vectors at once. Its input width (64 = 16 timestep + 16 guidance + 32 index) is hard-coded,
# and its output width must equal hidden_size. Patch size 2 with in_channels already patchified.
register(TinyFamily(
    name="chroma",
    config_class="Chroma",
    family="chroma", variant="chroma-architecture",
    latent_channels=16, latent_spatial=(16, 16), context_dim=64, extra_cond=_pooled(0),
))

# Chroma Radiance: Chroma's blocks in pixel space: RGB patchified 4 x 4 here (16 in the real
# model) in, and a small per-pixel "NeRF" MLP head after the blocks that decodes each patch.
register(TinyFamily(
    name="chroma_radiance",
    config_class="ChromaRadiance",
    family="chroma", variant="chroma-radiance",
    latent_channels=3, latent_spatial=(32, 32), context_dim=64, extra_cond=_pooled(0),
))

# --- HunyuanVideo: Flux-like blocks, but single blocks run over cat(img, txt) -----------------

register(TinyFamily(
    name="hunyuan_video",
    config_class="HunyuanVideo",
    family="hunyuan_video", variant="hunyuan_video-architecture",
    latent_channels=16, latent_spatial=(3, 8, 8), context_dim=64, extra_cond=_pooled(32, guidance=6.0),
))

# HunyuanVideo I2V (in_channels 33 = 16 noise + 16 start-image + 1 mask) and SkyReels I2V (32:
# noise + start image): HunyuanVideo's blocks with the image concatenated to the input. The concat
# is left to ComfyUI's default (zeros, and the mask), as a run without a start image gets it.
register(TinyFamily(
    name="hunyuan_video_i2v",
    config_class="HunyuanVideoI2V",
    family="hunyuan_video", variant="hunyuanvideo-i2v",
    latent_channels=16, latent_spatial=(3, 8, 8), context_dim=64, extra_cond=_pooled(32, guidance=6.0),
))
register(TinyFamily(
    name="hunyuan_video_skyreels_i2v",
    config_class="HunyuanVideoSkyreelsI2V",
    family="hunyuan_video", variant="skyreels-i2v",
    latent_channels=16, latent_spatial=(3, 8, 8), context_dim=64, extra_cond=_pooled(32, guidance=6.0),
))

# HunyuanVideo 1.5: only double blocks (the real model has 54 and no single blocks), patch 1,
# 32-channel latent plus a 33-channel image/mask concat (in_channels 65), no pooled vector.
# vision_in_dim=1152 is what ComfyUI keys the class on; byt5 (glyph text) is left out.
register(TinyFamily(
    name="hunyuan_video15",
    config_class="HunyuanVideo15",
    family="hunyuan_video", variant="hunyuan_video-architecture",
    latent_channels=32, latent_spatial=(2, 4, 4), context_dim=64, extra_cond=_pooled(0),
))

# HunyuanImage 2.1: HunyuanVideo's blocks at patch 1 on a 64-channel 2-D latent, no pooled
# vector. Its refiner samples a 32-channel 3-D latent that ComfyUI packs into 64 channels (frame
# pairs), and takes the image to refine as 64 more.
register(TinyFamily(
    name="hunyuan_image21",
    config_class="HunyuanImage21",
    family="hunyuan_video", variant="hunyuanimage2.1",
    latent_channels=64, latent_spatial=(8, 8), context_dim=64, extra_cond=_pooled(0),
))
register(TinyFamily(
    name="hunyuan_image21_refiner",
    config_class="HunyuanImage21Refiner",
    family="hunyuan_video", variant="hunyuanimage2.1-refiner",
    latent_channels=32, latent_spatial=(1, 8, 8), context_dim=64, extra_cond=_pooled(0),
))

# --- Other MMDiT-style image models -----------------------------------------------------------

# Qwen-Image: one kind of dual-stream block; in_channels is the 2x2-packed latent (16 * 4).
register(TinyFamily(
    name="qwen_image",
    config_class="QwenImage",
    family="qwen_image", variant="qwen_image-architecture",
    latent_channels=16, latent_spatial=(1, 16, 16), context_dim=64,
))

# Mage-Flow (ComfyUI 0.30.0): Qwen-Image's blocks at patch 1 on FLUX.2's 128-channel latent.
register(TinyFamily(
    name="mage_flow",
    config_class="MageFlow",
    family="qwen_image", variant="mage-flow",
    latent_channels=128, latent_spatial=(8, 8), context_dim=64,
))

# Lens (ComfyUI 0.30.0): Qwen-style blocks on FLUX.2's 32-channel latent packed 2x2 (128
# channels in); the text is several encoder layers side by side (4 x 16 wide here).
register(TinyFamily(
    name="lens",
    config_class="Lens",
    family="lens", variant="lens",
    latent_channels=128, latent_spatial=(8, 8), context_dim=64,
))

# JoyImage (ComfyUI 0.30.0): dual-stream blocks on Wan 2.1's 16-channel latent (5-D, one frame),
# a per-block modulation table added to the projected timestep. One head of the real head width
# (128, RoPE axes 16/56/56): ComfyUI's RoPE for this model fails at smaller head widths.
register(TinyFamily(
    name="joyimage",
    config_class="JoyImage",
    family="joyimage", variant="joyimage",
    latent_channels=16, latent_spatial=(1, 16, 16), context_dim=64,
))

# SD3: MMDiT joint blocks; the width is 64 * depth by construction and the last block's
# context stream is "pre_only". A small learned position table keeps the model tiny.
register(TinyFamily(
    name="sd3",
    config_class="SD3",
    family="sd3", variant="sd3",
    latent_channels=16, latent_spatial=(16, 16), context_dim=64, extra_cond=_pooled(32),
))

# Lumina 2: single-stream blocks over cat(caption, image) after separate refiner stacks;
# no dit block patches. multiple_of rounds the FFN up to 256, which is still small.
register(TinyFamily(
    name="lumina2",
    config_class="Lumina2",
    family="lumina2", variant="lumina2",
    latent_channels=16, latent_spatial=(16, 16), context_dim=64,
))

# Z-Image pixel space (ComfyUI 0.30.0): the Z-Image transformer on 4 x 4 RGB patches, an MLP
# decoder per patch. Z-Image's modulation needs a width of at least 256; detection keys the class
# on the real width (3840), so the template names it.
register(TinyFamily(
    name="zimage_pixel",
    config_class="ZImagePixelSpace",
    family="lumina2", variant="z-image-pixel-space",
    latent_channels=3, latent_spatial=(32, 32), context_dim=64,
))


def _hidream_extra(batch: int, tokens: int, gen: torch.Generator) -> dict:
    # Llama hidden states of every selected layer: (batch, layers, tokens, width); each block
    # reads the layer llama_layers[block] of it (the template's overlay: one layer per block).
    layers = len(_template("hidream").overlay["llama_layers"])
    llama = torch.randn(batch, layers, tokens, 64, generator=gen)
    return {"pooled_output": torch.randn(batch, 32, generator=gen), "conditioning_llama3": llama}


# HiDream: dual-stream then single-stream blocks with MoE feed-forwards; no dit block patches.
register(TinyFamily(
    name="hidream",
    config_class="HiDream",
    family="hidream", variant="hidream",
    latent_channels=16, latent_spatial=(16, 16), context_dim=64, extra_cond=_hidream_extra,
))

# Cosmos 1 (CosmosVideo, text to video): blocks of self-attention, cross-attention and MLP over
# a (T, H, W, B, D) grid with AdaLN-LoRA, 3-D RoPE and learned per-block position tables, sized
# by max_img_h/w and max_frames (32 x 32 x 8 here: 240 x 240 x 128 in the real model). No dit
# block patches.
register(TinyFamily(
    name="cosmos1",
    config_class="CosmosT2V",
    family="cosmos", variant="cosmos",
    latent_channels=16, latent_spatial=(2, 8, 8), context_dim=64,
))

# Cosmos-Predict2 (text-to-image): self/cross-attention blocks over a (B, T, H, W, D) grid with
# AdaLN-LoRA modulation; no dit block patches.
register(TinyFamily(
    name="cosmos_predict2",
    config_class="CosmosT2IPredict2",
    family="cosmos", variant="cosmos",
    latent_channels=16, latent_spatial=(1, 16, 16), context_dim=64,
))


# Anima (ComfyUI 0.30.0): Cosmos-Predict2's DiT plus an LLM adapter that turns Qwen3 hidden states
# and T5 token ids into its text; the adapter has fixed sizes (1024 wide, a 32128-token embedding:
# the bulk of this model). Without token ids the text goes to the DiT as it is, as here.
register(TinyFamily(
    name="anima",
    config_class="Anima",
    family="cosmos", variant="anima",
    latent_channels=16, latent_spatial=(1, 16, 16), context_dim=64,
))


# Kandinsky 5 (ComfyUI 0.30.0): video, with an image-to-video concat of 16 + 1 channels that the
# model takes on every call (visual_embed_dim 132 = 33 x 2 x 2); image (Kandinsky5Image, named:
# detection keys it on the real width) without. A pooled text vector (768 wide; 32 here).
register(TinyFamily(
    name="kandinsky5",
    config_class="Kandinsky5",
    family="kandinsky5", variant="kandinsky5",
    latent_channels=16, latent_spatial=(3, 8, 8), context_dim=64, extra_cond=_pooled(32),
))
register(TinyFamily(
    name="kandinsky5_image",
    config_class="Kandinsky5Image",
    family="kandinsky5", variant="kandinsky5-image",
    latent_channels=16, latent_spatial=(16, 16), context_dim=64, extra_cond=_pooled(32),
))


# Krea 2 (ComfyUI 0.30.0): single-stream blocks on Wan 2.1's latent (5-D, one frame), text from
# several encoder layers side by side (2 x 32 here) fused by its own small transformer.
register(TinyFamily(
    name="krea2",
    config_class="Krea2",
    family="krea2", variant="krea2",
    latent_channels=16, latent_spatial=(1, 16, 16), context_dim=64,
))


# PixelDiT (ComfyUI 0.30.0): patch-level then pixel-level transformer blocks on RGB (4 x 4
# patches here). Its checkpoints keep their keys under "core." with fused pixel-block
# modulations that ComfyUI splits on load; the template's keys are the module's under that prefix,
# and it names the class (detection returns no sizes for it).
register(TinyFamily(
    name="pixeldit",
    config_class="PixelDiTT2I",
    family="pixeldit", variant="pixeldit",
    latent_channels=3, latent_spatial=(32, 32), context_dim=64,
))


# CogVideoX (ComfyUI 0.30.0): an expert-transformer video model with v-prediction on a discrete
# (DDPM) schedule; 3-D RoPE as in the 5B models, text padded to its own length (8 here).
register(TinyFamily(
    name="cogvideox",
    config_class="CogVideoX_T2V",
    family="cogvideox", variant="cogvideox",
    latent_channels=16, latent_spatial=(3, 8, 8), context_dim=64,
))


# AuraFlow: MMDiT joint then single blocks on SDXL's 4-channel latent; detection keys the class on
# its text width (2048, kept), a learned position table (64 patches here).
register(TinyFamily(
    name="auraflow",
    config_class="AuraFlow",
    family="auraflow", variant="auraflow",
    latent_channels=4, latent_spatial=(16, 16), context_dim=2048,
))


def _t5_mask(batch: int, tokens: int, gen: torch.Generator) -> dict:
    # LTXVModel.forward and Mochi's AsymmDiTJoint.forward take attention_mask positionally, so the
    # T5 mask is required (Mochi pools its text with it; ComfyUI sums it into num_tokens).
    return {"attention_mask": torch.ones(batch, tokens, dtype=torch.long)}


# LTX-Video: single-stream blocks with cross-attention to the text; the blocks update the image
# tokens in place. cross_attention_dim must equal heads * head_dim (the caption projection's width).
register(TinyFamily(
    name="ltxv",
    config_class="LTXV",
    family="ltxv", variant="ltxv-architecture",
    latent_channels=128, latent_spatial=(2, 4, 4), context_dim=64, extra_cond=_t5_mask,
))

# Genmo Mochi: asymmetric dual-stream blocks (text half as wide as video; the last block leaves the
# text as it is) on a 12-channel video latent. ComfyUI's detection reads no sizes for Mochi, and its
# block asserts width x mlp_ratio_x = 12288 (3072 x 4 in the real model), so the overlay holds the
# sizes and mlp_ratio_x 192 at width 64 (an 8192-wide feed-forward, most of the 3.3 M weights).
register(TinyFamily(
    name="mochi",
    config_class="GenmoMochi",
    family="mochi", variant="mochi-architecture",
    latent_channels=12, latent_spatial=(3, 8, 8), context_dim=64, extra_cond=_t5_mask,
))

# --- Wan ------------------------------------------------------------------------------------

# Wan 2.1 T2V at dim 128 (one head of 128, as the real models' head width), two layers.
register(TinyFamily(
    name="wan21",
    config_class="WAN21_T2V",
    family="wan", variant="wan-architecture",
    latent_channels=16, latent_spatial=(3, 8, 8), context_dim=4096,
))

# VACE: vace_in_dim is fixed by ComfyUI's default VACE conditioning (32 frame + 64 mask
# channels); one VACE block on a two-block trunk adds a hint after block 0 only, so hinted and
# plain blocks alternate as in the real 1.3B layout (15 VACE blocks on 30).
register(TinyFamily(
    name="wan21_vace",
    config_class="WAN21_Vace",
    family="wan", variant="wan-architecture",
    latent_channels=16, latent_spatial=(3, 8, 8), context_dim=64,
))

# Wan 2.2 TI2V-5B layout: 48-channel latent in and out.
register(TinyFamily(
    name="wan22_5b",
    config_class="WAN22_T2V",
    family="wan", variant="wan-architecture",
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
    family="wan", variant="wan-architecture",
    latent_channels=16, latent_spatial=(3, 8, 8), context_dim=64, extra_cond=_wan_i2v_extra,
))


# Wan Fun Camera (in_dim 32 = 16 noise + 16 start-image channels; image cross-attention) and
# Wan 2.2 Animate (36, as I2V; five layers, the fewest that give it a face-adapter block), with
# CLIP-vision tokens as I2V. HuMo: Wan T2V blocks with an audio cross-attention. What they add
# before the blocks (camera poses, face and pose videos, audio, reference frames) is optional and
# left out: its sizes are fixed to pixel and audio resolutions, and the blocks and the hooks'
# call structure are the same without it. HuMo's audio projection and Animate's motion encoder
# have fixed widths (about 40 M weights each, the bulk of these models).
register(TinyFamily(
    name="wan21_camera",
    config_class="WAN21_Camera",
    family="wan", variant="wan-camera",
    latent_channels=16, latent_spatial=(3, 8, 8), context_dim=64, extra_cond=_wan_i2v_extra,
))
register(TinyFamily(
    name="wan21_humo",
    config_class="WAN21_HuMo",
    family="wan", variant="wan2.1-humo",
    latent_channels=16, latent_spatial=(3, 8, 8), context_dim=64,
))
register(TinyFamily(
    name="wan22_animate",
    config_class="WAN22_Animate",
    family="wan", variant="wan2.2-animate",
    latent_channels=16, latent_spatial=(3, 8, 8), context_dim=64, extra_cond=_wan_i2v_extra,
))


def _wan_s2v_extra(batch: int, tokens: int, gen: torch.Generator) -> dict:
    # Wav2Vec features as ComfyUI's WanSoundImageToVideo hands them on: (batch, 25 encoder layers,
    # audio width, 4 per latent frame); 40 covers up to 10 latent frames (the model takes the
    # first 4 x frames). The audio is injected into the stream after the blocks it names.
    return {"audio_embed": torch.randn(batch, 25, 32, 40, generator=gen)}


@functools.cache
def blocks_get_transformer_options(family: str) -> bool:
    """Whether this ComfyUI hands the first block patch of the tiny ``family`` model its
    transformer_options: one direct call of the diffusion model with a recording patch."""
    spec = FAMILIES[family]
    seen = []

    def probe(args: dict, extra: dict) -> dict:
        seen.append("transformer_options" in args)
        return extra["original_block"](args)

    model = build_model(family).model
    gen = torch.Generator().manual_seed(0)
    x = torch.zeros(1, spec.latent_channels, *spec.latent_spatial)
    context = torch.randn(1, spec.context_tokens, spec.context_dim, generator=gen)
    options = {"patches_replace": {"dit": {("double_block", 0): probe}}}
    with torch.no_grad():
        model.diffusion_model(x, torch.tensor([0.5]), context, transformer_options=options)
    return bool(seen) and all(seen)


# Wan 2.2 S2V: Wan blocks plus a causal audio encoder whose features are added into the stream
# after blocks 0 and 1 (audio_inject_layers). ComfyUI 0.3.75 hands these blocks no
# transformer_options, so the cache drives them only from 0.30.0 on (tests/test_families.py checks
# both).
register(TinyFamily(
    name="wan22_s2v",
    config_class="WAN22_S2V",
    family="wan", variant="wan2.2-s2v",
    latent_channels=16, latent_spatial=(3, 8, 8), context_dim=64, extra_cond=_wan_s2v_extra,
    requires=lambda: blocks_get_transformer_options("wan22_s2v"),
))


def _scail_pose(batch: int, tokens: int, gen: torch.Generator) -> dict:
    # A half-resolution pose video (3 frames of 4 x 4): its tokens follow the image's in the stream.
    return {"pose_video_latent": torch.randn(batch, 16, 3, 4, 4, generator=gen)}


# Wan variants of ComfyUI 0.30.0 on the same blocks: SCAIL and SCAIL-2 (character animation:
# 20 input channels; SCAIL here with pose tokens appended to the stream), WanDancer (36 channels,
# image-to-video concat) and FlowRVS (video to mask, sampled from the video latent itself). Their
# other extra inputs are left out; the blocks and the hooks' call structure are the same with them.
register(TinyFamily(
    name="wan21_scail", config_class="WAN21_SCAIL", family="wan", variant="wan2.1-scail",
    latent_channels=16, latent_spatial=(3, 8, 8), context_dim=64, extra_cond=_scail_pose,
))
register(TinyFamily(
    name="wan21_scail2", config_class="WAN21_SCAIL2", family="wan", variant="wan2.1-scail2",
    latent_channels=16, latent_spatial=(3, 8, 8), context_dim=64,
))
register(TinyFamily(
    name="wan22_wandancer", config_class="WAN22_WanDancer", family="wan", variant="wan2.2-wandancer",
    latent_channels=16, latent_spatial=(3, 8, 8), context_dim=64,
))
register(TinyFamily(
    name="wan21_flowrvs", config_class="WAN21_FlowRVS", family="wan", variant="wan2.1-flowrvs",
    latent_channels=16, latent_spatial=(3, 8, 8), context_dim=64,
))


def random_state_dict(family: str, seed: int) -> dict[str, torch.Tensor]:
    """The family's tiny checkpoint with seeded values (model_builder.random_state_dict)."""
    return model_builder.random_state_dict(FAMILIES[family].template, seed)


def build_model(family: str, seed: int = 0) -> comfy.model_patcher.ModelPatcher:
    """The family's tiny model with seeded random weights, loaded as ComfyUI loads a checkpoint."""
    return model_builder.build_from_template(FAMILIES[family].template, seed)


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


# A model the pack does not cache (an SD1.5 UNet), to show it passes through untouched. Its
# template names the class: no released SD1.5 is this small, so detection matches no class.
def build_sd15_unet(seed: int = 0) -> comfy.model_patcher.ModelPatcher:
    return model_builder.build_from_template(_template("sd15_unet"), seed)


def tiny_controlnet(model: comfy.model_patcher.ModelPatcher, seed: int = 0, union_modes: int = 0) -> object:
    """A tiny ControlNet for ``model`` (a FLUX, Qwen-Image or SD3 architecture: the tiny models or the
    demo image model), made as ComfyUI's ControlNet loaders make theirs: ComfyUI's ControlNet class
    for that architecture, configured like the model (its width, heads and inputs) with one block
    (FLUX: one double and one single), inside a ``comfy.controlnet.ControlNet``. Seeded random
    weights, output projections included, so it changes what the model makes. (ComfyUI's loaders
    cannot make ones this small: their detection fixes the head size.)

    FLUX without ``union_modes``: XLabs-style, an RGB image hint (``controlnet_hint``). FLUX with
    ``union_modes`` > 0 (InstantX Union style; ComfyUI's SetUnionControlNetType picks the mode),
    Qwen-Image (InstantX) and SD3: a latent hint, as their loaders' ControlNets take one once a VAE
    encoded the image (these take the latent directly: no VAE in the tests)."""
    import comfy.controlnet
    import comfy.ops

    config = dict(model.model.model_config.unet_config)
    operations = comfy.ops.disable_weight_init
    latent_hint = {"compression_ratio": 1}
    architecture = type(model.model).__name__
    if architecture == "QwenImage":
        import comfy.ldm.qwen_image.controlnet

        control_model = comfy.ldm.qwen_image.controlnet.QwenImageControlNetModel(
            operations=operations, **dict(config, num_layers=1))
        kwargs = {**latent_hint, "extra_conds": []}
    elif architecture == "SD3":
        import comfy.cldm.mmdit

        control_model = comfy.cldm.mmdit.ControlNet(num_blocks=1, control_latent_channels=config["in_channels"],
                                                    operations=operations, **config)
        kwargs = latent_hint
    else:
        import comfy.ldm.flux.controlnet

        union = {"latent_input": True, "num_union_modes": union_modes} if union_modes else {}
        control_model = comfy.ldm.flux.controlnet.ControlNetFlux(
            operations=operations, **union, **dict(config, depth=1, depth_single_blocks=1))
        kwargs = {**(latent_hint if union_modes else {}), "extra_conds": ["y", "guidance"]}
    control_model.load_state_dict(model_builder.random_state_dict(model_builder.template_of(control_model.state_dict()),
                                                                  seed))
    return comfy.controlnet.ControlNet(control_model, load_device=torch.device("cpu"), **kwargs)


def controlnet_hint(controlnet: object, latent: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """An IMAGE for ``controlnet`` (from ``tiny_controlnet``) at ``latent``'s size: RGB at the pixel
    size (VAE stride 8) for one that takes images, else the latent's own shape, channels last."""
    gen = torch.Generator().manual_seed(seed)
    if controlnet.compression_ratio == 1:
        return torch.randn(latent.shape, generator=gen).movedim(1, -1)
    return torch.rand(latent.shape[0], latent.shape[-2] * 8, latent.shape[-1] * 8, 3, generator=gen)


def fixed_control(tokens: int = 1, blocks: int = 64, scale: float = 0.05) -> object:
    """A ControlNet stand-in for families ComfyUI has no ControlNet class for in the tests (or none
    at all): a ``comfy.controlnet.ControlBase`` whose outputs are fixed per block, sigma and token,
    in both of the lists ComfyUI's forwards read ("input" and "output"), ``tokens`` long (the image
    stream's length: some forwards add them to the whole stream) and one channel wide (ComfyUI
    broadcasts them over the width). ``calls`` counts its evaluations."""
    import comfy.controlnet

    pattern = torch.randn(1, tokens, 1, generator=torch.Generator().manual_seed(tokens))

    class Fixed(comfy.controlnet.ControlBase):
        def __init__(self) -> None:
            super().__init__()
            self.calls = 0

        def get_control(self, x_noisy: torch.Tensor, t: torch.Tensor, cond: dict, batched_number: int,
                        transformer_options: dict) -> dict:
            self.calls += 1
            wave = torch.sin(3.0 * t.reshape(-1)[0].float()).item()
            rows = pattern.to(x_noisy).expand(x_noisy.shape[0], -1, -1)
            outputs = [scale * (1 + index % 3) * wave * rows for index in range(blocks)]
            return {"input": outputs, "output": list(outputs), "middle": []}

        def copy(self) -> comfy.controlnet.ControlBase:
            return self

    return Fixed()
