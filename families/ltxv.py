"""LTX-Video, in comfy/ldm/lightricks.

Blocks: ``transformer_blocks`` as ``double_block`` keys (single stream with cross-attention),
updated in place. ``vec`` is the adaLN timestep embedding, per token when a noise mask is set.
"""

from __future__ import annotations

import torch
from comfy.ldm.common_dit import rms_norm

from . import published_teacache as teacache
from .base import BlockKey, Family, Variant, modulate


class LTXVFamily(Family):
    def block_keys(self, diffusion_model: torch.nn.Module) -> list[BlockKey]:
        return [("double_block", i) for i in range(len(diffusion_model.transformer_blocks))]

    def teacache_signal(self, diffusion_model: torch.nn.Module, args: dict) -> torch.Tensor:
        block = diffusion_model.transformer_blocks[0]
        img, timestep = args["img"], args["vec"]
        table = block.scale_shift_table.to(device=img.device, dtype=img.dtype)
        ada = table[None, None] + timestep.reshape(img.shape[0], timestep.shape[1], table.shape[0], -1)
        return modulate(rms_norm(img), ada[:, :, 0], ada[:, :, 1])


LTXV = LTXVFamily(
    name="ltxv",
    model_classes=("LTXV",),
    variants=(Variant("ltx-video", teacache=teacache.LTXV),),
    notes="No published MagCache ratios for LTX-Video.",
)
