"""HunyuanVideo 1.0 (T2V, I2V), HunyuanVideo 1.5 and HunyuanImage 2.1, in comfy/ldm/hunyuan_video.

Flux-style blocks (in place), but the single-block stream is cat(img, txt): image tokens first.
HunyuanVideo 1.5 has double blocks only; HunyuanImage 2.1 is the same model on 2-D latents.

Published constants: TeaCache and MagCache for HunyuanVideo T2V (720p and 544p tables, told by
the latent height), MagCache for HunyuanVideo 1.5 (tables measured at 20 and 40 steps, the nearer
one). None for the I2V models, SkyReels I2V or HunyuanImage 2.1. The 1.5 super-resolution model
(HunyuanVideo15_SR_Distilled) is step-distilled and not supported.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import torch

from . import published_magcache as magcache
from . import published_teacache as teacache
from .base import Architecture, Family, RunContext, Variant
from .flux import double_block_modulated_input

# Latent height (VAE stride 8) halfway between 544p (68) and 720p (90).
MIN_720P_LATENT_HEIGHT = 79


class HunyuanVideoFamily(Family):
    # ComfyUI adds a ControlNet's outputs after each double block ("input") and single block ("output").
    control_lists: ClassVar[Mapping[str, str]] = {"double_block": "input", "single_block": "output"}

    def detect_variant(self, model: torch.nn.Module, run: RunContext) -> str:
        model_class = type(model).__name__
        if model_class in self.class_variants:
            return self.class_variants[model_class]
        if model_class == "HunyuanVideo15":
            # Two published tables, measured at 20 and 40 steps: the nearer one.
            return "hunyuanvideo1.5-20step" if (run.steps or 40) <= 30 else "hunyuanvideo1.5-40step"
        height = run.latent_shape[-2] if run.latent_shape else 0
        return "hunyuanvideo-720p" if height >= MIN_720P_LATENT_HEIGHT else "hunyuanvideo-544p"

    def shape(self, diffusion_model: torch.nn.Module) -> dict[str, object]:
        return {
            "width": diffusion_model.hidden_size,
            "double_blocks": len(diffusion_model.double_blocks),
            "single_blocks": len(diffusion_model.single_blocks),
            "in_channels": diffusion_model.in_channels,
        }

    def teacache_signal(self, diffusion_model: torch.nn.Module, args: dict) -> torch.Tensor:
        return double_block_modulated_input(diffusion_model.double_blocks[0], args)


T2V = Architecture("HunyuanVideo", {"width": 3072, "double_blocks": 20, "single_blocks": 40, "in_channels": 16})
V15 = Architecture("HunyuanVideo15", {"width": 2048, "double_blocks": 54, "single_blocks": 0, "in_channels": 65})

HUNYUAN_VIDEO = HunyuanVideoFamily(
    name="hunyuan_video",
    model_classes=("HunyuanVideo", "HunyuanVideoI2V", "HunyuanVideoSkyreelsI2V", "HunyuanVideo15",
                   "HunyuanImage21", "HunyuanImage21Refiner"),
    single_stream="img_txt",
    variants=(
        Variant("hunyuanvideo-720p", "HunyuanVideo T2V (720p)", T2V, teacache=teacache.HUNYUAN_VIDEO,
                magcache=magcache.HUNYUAN_VIDEO_720P),
        Variant("hunyuanvideo-544p", "HunyuanVideo T2V (544p)", T2V, teacache=teacache.HUNYUAN_VIDEO,
                magcache=magcache.HUNYUAN_VIDEO_544P),
        Variant("hunyuanvideo1.5-20step", "HunyuanVideo 1.5 (20 steps)", V15, magcache=magcache.HUNYUAN_VIDEO15_20),
        Variant("hunyuanvideo1.5-40step", "HunyuanVideo 1.5 (40 steps)", V15, magcache=magcache.HUNYUAN_VIDEO15_40),
        Variant("hunyuanvideo-i2v", "HunyuanVideo I2V"),
        Variant("skyreels-i2v", "SkyReels I2V"),
        Variant("hunyuanimage2.1", "HunyuanImage 2.1"),
        Variant("hunyuanimage2.1-refiner", "HunyuanImage 2.1 refiner"),
    ),
    class_variants={"HunyuanVideoI2V": "hunyuanvideo-i2v", "HunyuanVideoSkyreelsI2V": "skyreels-i2v",
                    "HunyuanImage21": "hunyuanimage2.1", "HunyuanImage21Refiner": "hunyuanimage2.1-refiner"},
    architecture_name="hunyuanvideo-architecture model",
)
