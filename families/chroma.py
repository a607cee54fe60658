"""Chroma and Chroma Radiance, in comfy/ldm/chroma (FLUX.1-schnell derived, true CFG).

Flux's block layout (single stream = cat(txt, img)); ``vec`` carries each block's own modulations.
Chroma can be told to skip some blocks (``skip_mmdit``/``skip_dit``): those get no hook call, so
they are left out of the stack here.
"""

from __future__ import annotations

import torch

from . import published_magcache as magcache
from .base import BlockKey, Family, Variant
from .flux import double_block_modulated_input


class ChromaFamily(Family):
    def block_keys(self, diffusion_model: torch.nn.Module) -> list[BlockKey]:
        skip_double = set(getattr(diffusion_model, "skip_mmdit", ()))
        skip_single = set(getattr(diffusion_model, "skip_dit", ()))
        return [("double_block", i) for i in range(len(diffusion_model.double_blocks)) if i not in skip_double] + [
            ("single_block", i) for i in range(len(diffusion_model.single_blocks)) if i not in skip_single
        ]

    def teacache_signal(self, diffusion_model: torch.nn.Module, args: dict) -> torch.Tensor:
        return double_block_modulated_input(diffusion_model.double_blocks[0], args)


CHROMA = ChromaFamily(
    name="chroma",
    model_classes=("Chroma", "ChromaRadiance"),
    single_stream="txt_img",
    variants=(Variant("chroma", magcache=magcache.CHROMA),),
    notes="No published TeaCache coefficients for Chroma.",
)
