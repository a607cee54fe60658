"""Qwen-Image and Qwen-Image-Edit, and Mage-Flow (Qwen's blocks), in comfy/ldm/qwen_image and
comfy/ldm/mage_flow.

Blocks: ``transformer_blocks`` as ``double_block`` keys, new tensors out (not in place). Qwen's
``patches["double_block"]`` run between blocks and may change the stream; the tail of a skipped
call replaces it, so nothing they add is counted twice. Reference images (Edit) are extra tokens
at the end of ``img``; in the ``index_timestep_zero`` reference mode (Qwen-Image-Edit-2511's
default, ComfyUI 0.30.0) they are modulated with timestep 0 and ``vec`` holds the real timesteps'
embeddings followed by the zero timesteps'.

MagCache ratios are published for Qwen-Image and Qwen-Image-Edit (60 blocks of width 3072, one
architecture: a reference latent in the conditioning tells Edit); no TeaCache coefficients.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import torch

from . import published_magcache as magcache
from .base import Architecture, Family, RunContext, Variant, image_tokens, in_features, modulate


class QwenImageFamily(Family):
    # ComfyUI adds a ControlNet's outputs after each block (its "input" list).
    control_lists: ClassVar[Mapping[str, str]] = {"double_block": "input"}

    def detect_variant(self, model: torch.nn.Module, run: RunContext) -> str:
        if type(model).__name__ in self.class_variants:
            return self.class_variants[type(model).__name__]
        # Edit is the same architecture; its conditioning carries the image being edited.
        return "qwen-image-edit" if run.has_cond_key("reference_latents") else "qwen-image"

    def shape(self, diffusion_model: torch.nn.Module) -> dict[str, object]:
        return {"width": diffusion_model.inner_dim, "blocks": len(diffusion_model.transformer_blocks),
                "in_channels": in_features(diffusion_model.img_in)}

    block_lists: ClassVar[Mapping[str, str]] = {"double_block": "transformer_blocks"}

    def teacache_signal(self, diffusion_model: torch.nn.Module, args: dict) -> torch.Tensor:
        return mmdit_modulated_input(diffusion_model.transformer_blocks[0], args)


def mmdit_modulated_input(block: torch.nn.Module, args: dict) -> torch.Tensor:
    """(1 + scale) * img_norm1(img) + shift of a block whose ``img_mod(vec)`` gives (shift, scale,
    gate) of attention then feed-forward: Qwen-Image's block, and Lens's."""
    img, temb = args["img"], args["vec"]
    if temb.shape[0] != img.shape[0]:
        # index_timestep_zero: the first rows are the sampled image's timesteps; the reference
        # tokens after the image's (timestep 0, the same on every step) would only dilute the signal.
        temb = temb[: img.shape[0]]
        img = img[:, :image_tokens(args)]
    shift, scale, _ = block.img_mod(temb).chunk(2, dim=-1)[0].chunk(3, dim=-1)
    return modulate(block.img_norm1(img), shift.unsqueeze(1), scale.unsqueeze(1))


QWEN_IMAGE_ARCHITECTURE = Architecture("QwenImage", {"width": 3072, "blocks": 60, "in_channels": 64})

QWEN_IMAGE = QwenImageFamily(
    name="qwen_image",
    model_classes=("QwenImage", "MageFlow"),
    variants=(
        Variant("qwen-image", "Qwen-Image", QWEN_IMAGE_ARCHITECTURE, magcache=magcache.QWEN_IMAGE),
        Variant("qwen-image-edit", "Qwen-Image-Edit", QWEN_IMAGE_ARCHITECTURE, magcache=magcache.QWEN_IMAGE_EDIT),
        Variant("mage-flow", "Mage-Flow"),
    ),
    class_variants={"MageFlow": "mage-flow"},
    architecture_name="qwen-image-architecture model",
)
