"""Chroma and Chroma Radiance, in comfy/ldm/chroma (FLUX.1-schnell derived, true CFG).

Flux's block layout (single stream = cat(txt, img)); ``vec`` carries each block's own modulations.
Chroma can be told to skip some blocks (``skip_mmdit``/``skip_dit``): those get no hook call, so
they are left out of the stack here. MagCache ratios are published for Chroma (latent space, the
FLUX.1-schnell shape: 19 + 38 blocks of width 3072); no TeaCache coefficients, and nothing for
Chroma Radiance (pixel space).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import torch

from . import published_magcache as magcache
from .base import Architecture, BlockKey, Family, Variant, in_features
from .flux import double_block_modulated_input


class ChromaFamily(Family):
    # ComfyUI adds a ControlNet's outputs after each double block ("input") and single block ("output").
    control_lists: ClassVar[Mapping[str, str]] = {"double_block": "input", "single_block": "output"}

    def shape(self, diffusion_model: torch.nn.Module) -> dict[str, object]:
        return {
            "width": diffusion_model.hidden_size,
            "double_blocks": len(diffusion_model.double_blocks),
            "single_blocks": len(diffusion_model.single_blocks),
            "in_channels": diffusion_model.in_channels,
            "context_in": in_features(diffusion_model.txt_in),
        }

    def block_keys(self, diffusion_model: torch.nn.Module) -> list[BlockKey]:
        skip_double = set(getattr(diffusion_model, "skip_mmdit", ()))
        skip_single = set(getattr(diffusion_model, "skip_dit", ()))
        return [("double_block", i) for i in range(len(diffusion_model.double_blocks)) if i not in skip_double] + [
            ("single_block", i) for i in range(len(diffusion_model.single_blocks)) if i not in skip_single
        ]

    def teacache_signal(self, diffusion_model: torch.nn.Module, args: dict) -> torch.Tensor:
        return double_block_modulated_input(diffusion_model.double_blocks[0], args)


CHROMA_SHAPE = {"width": 3072, "double_blocks": 19, "single_blocks": 38, "in_channels": 64, "context_in": 4096}

CHROMA = ChromaFamily(
    name="chroma",
    model_classes=("Chroma", "ChromaRadiance"),
    single_stream="txt_img",
    variants=(
        Variant("chroma", "Chroma", Architecture("Chroma", CHROMA_SHAPE), magcache=magcache.CHROMA),
        Variant("chroma-radiance", "Chroma Radiance"),
    ),
    class_variants={"ChromaRadiance": "chroma-radiance"},
    architecture_name="chroma-architecture model",
)
