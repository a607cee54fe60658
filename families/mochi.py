"""Genmo Mochi 1, in comfy/ldm/genmo/joint_model.

Blocks: ``blocks`` as ``double_block`` keys (asymmetric dual-stream: a wide video stream ``img``,
a narrower text stream ``txt``); ``vec`` = timestep embedding plus pooled text, (batch, width);
new tensors out (not in place). The last block leaves ``txt`` as it came, and nothing reads
``txt`` after the stack. AsymmDiTJoint has no DIFFUSION_MODEL wrapper; the block hooks and the
OUTER_SAMPLE wrapper are all the cache needs.

TeaCache coefficients are published for Mochi 1 preview (48 blocks of width 3072 on the 12-channel
latent), fitted on the first block's modulated video input at 64 steps; no MagCache ratios.
ComfyUI's detection fills every Mochi checkpoint with those sizes, so any Mochi it loads has them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import torch
import torch.nn.functional as F
from comfy.ldm.common_dit import rms_norm

from . import published_teacache as teacache
from .base import Architecture, Family, Variant


class MochiFamily(Family):
    block_lists: ClassVar[Mapping[str, str]] = {"double_block": "blocks"}

    def shape(self, diffusion_model: torch.nn.Module) -> dict[str, object]:
        return {"width": diffusion_model.hidden_size_x, "text_width": diffusion_model.hidden_size_y,
                "blocks": len(diffusion_model.blocks), "in_channels": diffusion_model.in_channels}

    def teacache_signal(self, diffusion_model: torch.nn.Module, args: dict) -> torch.Tensor:
        # Mochi's pre-attention norm has a scale and no shift: rms_norm(x) * (1 + scale), with the
        # scale the first of the four chunks of mod_x(silu(c)), as the published fit measured it.
        block = diffusion_model.blocks[0]
        scale = block.mod_x(F.silu(args["vec"])).chunk(4, dim=1)[0]
        return rms_norm(args["img"]) * (1 + scale.unsqueeze(1))


MOCHI = MochiFamily(
    name="mochi",
    model_classes=("GenmoMochi",),
    variants=(Variant("mochi-1-preview", "Mochi 1 preview",
                      Architecture("GenmoMochi", {"width": 3072, "text_width": 1536, "blocks": 48,
                                                  "in_channels": 12}),
                      teacache=teacache.MOCHI),),
    architecture_name="mochi-architecture model",
)
