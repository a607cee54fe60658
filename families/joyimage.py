"""JoyImage (ComfyUI 0.30.0), in comfy/ldm/joyimage.

Dual-stream blocks: ``double_blocks`` as ``double_block`` keys; ``img`` (the sampled image's tokens
then any reference images'), ``txt``, ``vec`` = the projected timestep, (batch, 6, width); new
tensors out. The TeaCache signal is the first block's modulated image input. No constants are
published for JoyImage.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import torch

from .base import Family, Variant, modulate


class JoyImageFamily(Family):
    block_lists: ClassVar[Mapping[str, str]] = {"double_block": "double_blocks"}

    def teacache_signal(self, diffusion_model: torch.nn.Module, args: dict) -> torch.Tensor:
        block = diffusion_model.double_blocks[0]
        shift, scale = block.img_mod(args["vec"])[:2]
        return modulate(block.img_norm1(args["img"]), shift.unsqueeze(1), scale.unsqueeze(1))


JOYIMAGE = JoyImageFamily(name="joyimage", model_classes=("JoyImage",), variants=(Variant("joyimage", "JoyImage"),))
