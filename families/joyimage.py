"""JoyImage (ComfyUI 0.30.0), in comfy/ldm/joyimage.

Dual-stream blocks: ``double_blocks`` as ``double_block`` keys; ``img`` (the sampled image's tokens
then any reference images'), ``txt``, ``vec`` = the projected timestep, (batch, 6, width); new
tensors out. The TeaCache signal is the first block's modulated image input. No constants are
published for JoyImage.
"""

from __future__ import annotations

import torch

from .base import BlockKey, Family, Variant, modulate


class JoyImageFamily(Family):
    def block_keys(self, diffusion_model: torch.nn.Module) -> list[BlockKey]:
        return [("double_block", i) for i in range(len(diffusion_model.double_blocks))]

    def teacache_signal(self, diffusion_model: torch.nn.Module, args: dict) -> torch.Tensor:
        block = diffusion_model.double_blocks[0]
        shift, scale = block.img_mod(args["vec"])[:2]
        return modulate(block.img_norm1(args["img"]), shift.unsqueeze(1), scale.unsqueeze(1))


JOYIMAGE = JoyImageFamily(name="joyimage", model_classes=("JoyImage",), variants=(Variant("joyimage", "JoyImage"),))
