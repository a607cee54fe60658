"""FLUX.1 (dev, schnell, Kontext) and FLUX.2, in ComfyUI's comfy/ldm/flux.

Blocks: ``double_blocks`` then ``single_blocks``; the single-block stream is cat(txt, img), so the
image tokens are its tail. Double blocks add into their ``img`` argument in place. FLUX.2 passes
precomputed modulations as ``vec``.
"""

from __future__ import annotations

import torch
from comfy.ldm.flux.layers import apply_mod

from . import published_magcache as magcache
from . import published_teacache as teacache
from .base import BlockKey, Family, RunContext, Variant


class FluxFamily(Family):
    def detect_variant(self, model: torch.nn.Module, run: RunContext) -> str:
        if self.name == "flux2":
            return "flux.2"
        # Kontext is FLUX.1-dev's architecture; what tells it apart is a reference image in the
        # conditioning (ComfyUI's ReferenceLatent / FluxKontext nodes).
        if run.has_cond_key("reference_latents"):
            return "flux.1-kontext"
        if not model.diffusion_model.params.guidance_embed:
            return "flux.1-schnell"
        return "flux.1-dev"

    def block_keys(self, diffusion_model: torch.nn.Module) -> list[BlockKey]:
        return [("double_block", i) for i in range(len(diffusion_model.double_blocks))] + [
            ("single_block", i) for i in range(len(diffusion_model.single_blocks))
        ]

    def teacache_signal(self, diffusion_model: torch.nn.Module, args: dict) -> torch.Tensor:
        return double_block_modulated_input(diffusion_model.double_blocks[0], args)


def double_block_modulated_input(block: torch.nn.Module, args: dict) -> torch.Tensor:
    """The image stream as the first attention of a Flux-style double block sees it:
    (1 + scale) * LayerNorm(img) + shift. Shared by FLUX.1/.2, Chroma and HunyuanVideo."""
    if block.modulation:
        img_mod1, _ = block.img_mod(args["vec"])
    else:  # FLUX.2 and Chroma hand the blocks ((img_mod1, img_mod2), (txt_mod1, txt_mod2))
        (img_mod1, _), _ = args["vec"]
    # apply_mod handles HunyuanVideo's per-token modulation ranges; it writes into its input,
    # which here is a fresh LayerNorm output.
    return apply_mod(block.img_norm1(args["img"]), 1 + img_mod1.scale, img_mod1.shift,
                     args.get("modulation_dims_img"))


FLUX = FluxFamily(
    name="flux",
    model_classes=("Flux",),
    single_stream="txt_img",
    variants=(
        Variant("flux.1-dev", teacache=teacache.FLUX, magcache=magcache.FLUX_DEV, teacache_threshold=0.4),
        Variant("flux.1-schnell", teacache=teacache.FLUX, magcache=magcache.FLUX_DEV, teacache_threshold=0.4),
        Variant("flux.1-kontext", teacache=teacache.FLUX_KONTEXT, magcache=magcache.FLUX_KONTEXT),
    ),
)

FLUX2 = FluxFamily(
    name="flux2",
    model_classes=("Flux2",),
    single_stream="txt_img",
    variants=(Variant("flux.2"),),
    notes="No published TeaCache or MagCache constants for FLUX.2.",
)
