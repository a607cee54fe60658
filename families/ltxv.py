"""LTX-Video, in comfy/ldm/lightricks.

Blocks: ``transformer_blocks`` as ``double_block`` keys (single stream with cross-attention),
updated in place. ``vec`` is the adaLN timestep embedding, per token when a noise mask is set.

TeaCache coefficients are published for LTX-Video 0.9.1 (the 2B shape: 28 blocks of width 2048,
which the later 2B releases share); no MagCache ratios. LTX-2 (audio and video, LTXAV) is not
supported: its blocks carry a (video, audio) pair of streams.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import torch
from comfy.ldm.common_dit import rms_norm

from . import published_teacache as teacache
from .base import Architecture, Family, Variant, in_features, modulate


class LTXVFamily(Family):
    def shape(self, diffusion_model: torch.nn.Module) -> dict[str, object]:
        return {"width": diffusion_model.inner_dim, "blocks": len(diffusion_model.transformer_blocks),
                "in_channels": in_features(diffusion_model.patchify_proj)}

    block_lists: ClassVar[Mapping[str, str]] = {"double_block": "transformer_blocks"}

    def teacache_signal(self, diffusion_model: torch.nn.Module, args: dict) -> torch.Tensor:
        block = diffusion_model.transformer_blocks[0]
        img, timestep = args["img"], args["vec"]
        table = block.scale_shift_table.to(device=img.device, dtype=img.dtype)
        ada = table[None, None] + timestep.reshape(img.shape[0], timestep.shape[1], table.shape[0], -1)
        return modulate(rms_norm(img), ada[:, :, 0], ada[:, :, 1])


LTXV = LTXVFamily(
    name="ltxv",
    model_classes=("LTXV",),
    variants=(Variant("ltx-video", "LTX-Video 0.9.1",
                      Architecture("LTXV", {"width": 2048, "blocks": 28, "in_channels": 128}),
                      teacache=teacache.LTXV),),
    architecture_name="ltx-video-architecture model",
)
