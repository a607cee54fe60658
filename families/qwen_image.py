"""Qwen-Image and Qwen-Image-Edit, in comfy/ldm/qwen_image.

Blocks: ``transformer_blocks`` as ``double_block`` keys, new tensors out (not in place). Qwen's
``patches["double_block"]`` run between blocks and may change the stream; the tail of a skipped
call replaces it, so nothing they add is counted twice.
"""

from __future__ import annotations

import torch

from . import published_magcache as magcache
from .base import BlockKey, Family, RunContext, Variant, modulate


class QwenImageFamily(Family):
    def detect_variant(self, model: torch.nn.Module, run: RunContext) -> str:
        # Edit is the same architecture; its conditioning carries the image being edited.
        return "qwen-image-edit" if run.has_cond_key("reference_latents") else "qwen-image"

    def block_keys(self, diffusion_model: torch.nn.Module) -> list[BlockKey]:
        return [("double_block", i) for i in range(len(diffusion_model.transformer_blocks))]

    def teacache_signal(self, diffusion_model: torch.nn.Module, args: dict) -> torch.Tensor:
        block = diffusion_model.transformer_blocks[0]
        img_mod1 = block.img_mod(args["vec"]).chunk(2, dim=-1)[0]
        shift, scale, _ = img_mod1.chunk(3, dim=-1)
        return modulate(block.img_norm1(args["img"]), shift.unsqueeze(1), scale.unsqueeze(1))


QWEN_IMAGE = QwenImageFamily(
    name="qwen_image",
    model_classes=("QwenImage",),
    variants=(
        Variant("qwen-image", magcache=magcache.QWEN_IMAGE),
        Variant("qwen-image-edit", magcache=magcache.QWEN_IMAGE_EDIT),
    ),
    notes="No published TeaCache coefficients for Qwen-Image.",
)
