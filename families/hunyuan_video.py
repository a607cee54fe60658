"""HunyuanVideo 1.0 (T2V, I2V) and 1.5, in comfy/ldm/hunyuan_video.

Flux-style blocks (in place), but the single-block stream is cat(img, txt): image tokens first.
HunyuanVideo 1.5 has double blocks only.
"""

from __future__ import annotations

import torch

from . import published_magcache as magcache
from . import published_teacache as teacache
from .base import BlockKey, Family, RunContext, Variant
from .flux import double_block_modulated_input

# Latent height (VAE stride 8) halfway between 544p (68) and 720p (90).
MIN_720P_LATENT_HEIGHT = 79


class HunyuanVideoFamily(Family):
    def detect_variant(self, model: torch.nn.Module, run: RunContext) -> str:
        if any(cls.__name__ == "HunyuanVideo15" for cls in type(model).__mro__):
            # Two published tables, measured at 20 and 40 steps: the nearer one.
            return "hunyuanvideo1.5-20step" if (run.steps or 40) <= 30 else "hunyuanvideo1.5-40step"
        height = run.latent_shape[-2] if run.latent_shape else 0
        return "hunyuanvideo-720p" if height >= MIN_720P_LATENT_HEIGHT else "hunyuanvideo-544p"

    def block_keys(self, diffusion_model: torch.nn.Module) -> list[BlockKey]:
        return [("double_block", i) for i in range(len(diffusion_model.double_blocks))] + [
            ("single_block", i) for i in range(len(diffusion_model.single_blocks))
        ]

    def teacache_signal(self, diffusion_model: torch.nn.Module, args: dict) -> torch.Tensor:
        return double_block_modulated_input(diffusion_model.double_blocks[0], args)


HUNYUAN_VIDEO = HunyuanVideoFamily(
    name="hunyuan_video",
    model_classes=("HunyuanVideo", "HunyuanVideoI2V", "HunyuanVideoSkyreelsI2V", "HunyuanVideo15"),
    single_stream="img_txt",
    variants=(
        Variant("hunyuanvideo-720p", teacache=teacache.HUNYUAN_VIDEO, magcache=magcache.HUNYUAN_VIDEO_720P),
        Variant("hunyuanvideo-544p", teacache=teacache.HUNYUAN_VIDEO, magcache=magcache.HUNYUAN_VIDEO_544P),
        Variant("hunyuanvideo1.5-20step", magcache=magcache.HUNYUAN_VIDEO15_20),
        Variant("hunyuanvideo1.5-40step", magcache=magcache.HUNYUAN_VIDEO15_40),
    ),
)
