"""Microsoft Lens (ComfyUI 0.30.0), in comfy/ldm/lens.

Qwen-Image-style dual-stream blocks: ``transformer_blocks`` as ``double_block`` keys, ``img``,
``txt``, ``vec`` = the timestep embedding, new tensors out. The TeaCache signal is the first
block's modulated image input, as for Qwen-Image. No constants are published for Lens.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import torch

from .base import Family, Variant
from .qwen_image import mmdit_modulated_input


class LensFamily(Family):
    # ComfyUI adds a ControlNet's outputs after each block (its "input" list).
    control_lists: ClassVar[Mapping[str, str]] = {"double_block": "input"}

    block_lists: ClassVar[Mapping[str, str]] = {"double_block": "transformer_blocks"}

    def teacache_signal(self, diffusion_model: torch.nn.Module, args: dict) -> torch.Tensor:
        return mmdit_modulated_input(diffusion_model.transformer_blocks[0], args)


LENS = LensFamily(name="lens", model_classes=("Lens",), variants=(Variant("lens", "Lens"),))
