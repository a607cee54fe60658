"""FLUX.1 (dev, schnell, Kontext), LongCat-Image and FLUX.2, in ComfyUI's comfy/ldm/flux.

Blocks: ``double_blocks`` then ``single_blocks``; the single-block stream is cat(txt, img), so the
image tokens are its tail. Double blocks add into their ``img`` argument in place. FLUX.2 passes
precomputed modulations as ``vec``. Reference images (Kontext, FLUX.2 editing) are extra tokens at
the end of ``img``; in ComfyUI's ``index_timestep_zero`` reference mode (FLUX.2) they are
modulated with timestep 0, so ``vec`` then holds two modulations per sample (image, references).

Published constants exist for FLUX.1-dev and FLUX.1-Kontext-dev only (same architecture; a
reference latent in the conditioning tells Kontext). FLUX.1-schnell, LongCat-Image (a FLUX
architecture without guidance or pooled vector, 0.30.0 and later) and FLUX.2 have none.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import torch
from comfy.ldm.flux.layers import apply_mod

from . import published_magcache as magcache
from . import published_teacache as teacache
from .base import Architecture, Family, RunContext, Variant, image_tokens, in_features, modulate


class FluxFamily(Family):
    # ComfyUI adds a ControlNet's outputs after each double block ("input") and single block ("output").
    control_lists: ClassVar[Mapping[str, str]] = {"double_block": "input", "single_block": "output"}

    def detect_variant(self, model: torch.nn.Module, run: RunContext) -> str:
        if type(model).__name__ in self.class_variants:
            return self.class_variants[type(model).__name__]
        # Kontext is FLUX.1-dev's architecture; what tells it apart is a reference image in the
        # conditioning (ComfyUI's ReferenceLatent / FluxKontext nodes).
        if run.has_cond_key("reference_latents"):
            return "flux.1-kontext"
        return "flux.1-dev" if self.shape(model.diffusion_model)["guidance_in"] else "flux.1-schnell"

    def shape(self, diffusion_model: torch.nn.Module) -> dict[str, object]:
        return {
            "width": diffusion_model.hidden_size,
            "double_blocks": len(diffusion_model.double_blocks),
            "single_blocks": len(diffusion_model.single_blocks),
            "in_channels": in_features(diffusion_model.img_in),
            "context_in": in_features(diffusion_model.txt_in),
            "vector_in": in_features(getattr(diffusion_model, "vector_in", None)),
            "guidance_in": in_features(getattr(diffusion_model, "guidance_in", None)) is not None,
        }

    def teacache_signal(self, diffusion_model: torch.nn.Module, args: dict) -> torch.Tensor:
        return double_block_modulated_input(diffusion_model.double_blocks[0], args)


def double_block_modulated_input(block: torch.nn.Module, args: dict) -> torch.Tensor:
    """The image stream as the first attention of a Flux-style double block sees it:
    (1 + scale) * LayerNorm(img) + shift. Shared by FLUX.1/.2, Chroma and HunyuanVideo."""
    if block.modulation:
        img_mod1, _ = block.img_mod(args["vec"])
    else:  # FLUX.2 and Chroma hand the blocks ((img_mod1, img_mod2), (txt_mod1, txt_mod2))
        (img_mod1, _), _ = args["vec"]
    img, ranges = args["img"], args.get("modulation_dims_img")
    if ranges is None and img_mod1.shift.shape[1] > 1:
        # index_timestep_zero: modulation 0 is the sampled image's, its tokens come first; the
        # reference tokens (timestep 0, the same on every step) would only dilute the signal.
        img = img[:, :image_tokens(args)]
        return modulate(block.img_norm1(img), img_mod1.shift[:, :1], img_mod1.scale[:, :1])
    # apply_mod handles HunyuanVideo's per-token modulation ranges; it writes into its input,
    # which here is a fresh LayerNorm output.
    return apply_mod(block.img_norm1(img), 1 + img_mod1.scale, img_mod1.shift, ranges)


# What FLUX.1-dev and -Kontext-dev are in ComfyUI (and the constants were measured on): 19 double
# and 38 single blocks of width 3072, 16-channel latents patchified 2x2, T5 (4096) and CLIP (768).
FLUX1_SHAPE = {"width": 3072, "double_blocks": 19, "single_blocks": 38, "in_channels": 64,
               "context_in": 4096, "vector_in": 768}
FLUX1_DEV = Architecture("Flux", FLUX1_SHAPE | {"guidance_in": True})

FLUX = FluxFamily(
    name="flux",
    model_classes=("Flux", "LongCatImage"),
    single_stream="txt_img",
    variants=(
        Variant("flux.1-dev", "FLUX.1-dev", FLUX1_DEV, teacache=teacache.FLUX, magcache=magcache.FLUX_DEV),
        Variant("flux.1-kontext", "FLUX.1-Kontext-dev", FLUX1_DEV, teacache=teacache.FLUX_KONTEXT,
                magcache=magcache.FLUX_KONTEXT),
        # Guidance-distilled for 1-4 steps, without guidance embedding; nothing was published for it.
        Variant("flux.1-schnell", "FLUX.1-schnell", Architecture("Flux", FLUX1_SHAPE | {"guidance_in": False})),
        Variant("longcat-image", "LongCat-Image"),
    ),
    class_variants={"LongCatImage": "longcat-image"},
    architecture_name="flux-architecture model",
    # Before the variants knew their architectures, flux.1-schnell borrowed FLUX.1-dev's constants.
    legacy_variants={"teacache": {"flux.1-schnell": "flux.1-dev"}, "magcache": {"flux.1-schnell": "flux.1-dev"}},
)

FLUX2 = FluxFamily(
    name="flux2",
    model_classes=("Flux2",),
    single_stream="txt_img",
    variants=(Variant("flux.2", "FLUX.2"),),
    class_variants={"Flux2": "flux.2"},
    architecture_name="flux.2-architecture model",
)
