"""Stable Diffusion 3 and 3.5 (MMDiT), in comfy/ldm/modules/diffusionmodules/mmdit.py.

Blocks: ``joint_blocks`` as ``double_block`` keys (img, txt in; new tensors out; the last block
returns txt = None). MMDiT has no DIFFUSION_MODEL wrapper; the block hooks and the OUTER_SAMPLE
wrapper are all the cache needs. No TeaCache or MagCache constants are published for SD3/SD3.5.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import torch

from .base import Family, Variant, modulate


class SD3Family(Family):
    # ComfyUI adds a ControlNet's outputs after each joint block (its "output" list).
    control_lists: ClassVar[Mapping[str, str]] = {"double_block": "output"}

    block_lists: ClassVar[Mapping[str, str]] = {"double_block": "joint_blocks"}

    def teacache_signal(self, diffusion_model: torch.nn.Module, args: dict) -> torch.Tensor:
        x_block = diffusion_model.joint_blocks[0].x_block
        img = args["img"]
        modulations = x_block.adaLN_modulation(args["vec"])
        # 6 chunks, or 9 where the block has a second self-attention (SD3.5 medium).
        shift, scale = modulations.chunk(modulations.shape[1] // img.shape[-1], dim=1)[:2]
        return modulate(x_block.norm1(img), shift.unsqueeze(1), scale.unsqueeze(1))


SD3 = SD3Family(name="sd3", model_classes=("SD3",), variants=(Variant("sd3", "SD3"),))
