"""Wan 2.1 and 2.2 (T2V, I2V, TI2V-5B, VACE, and models built on them), in comfy/ldm/wan.

Blocks: ``blocks`` as ``double_block`` keys; each gets ``img``, ``txt``, ``vec`` = e0 (the projected
time modulation), ``pe`` and returns ``img``. VACE, Animate and HuMo add into the hidden states
between blocks; the tail of a skipped call replaces the stream, so those additions are not
counted twice. Wan 2.2 S2V hands its blocks no transformer_options and is not supported.
"""

from __future__ import annotations

import torch

from . import published_magcache as magcache
from . import published_teacache as teacache
from .base import BlockKey, Family, RunContext, Variant

# Latent area (H x W, VAE stride 8) halfway between 480p (60 x 104) and 720p (90 x 160).
I2V_720P_MIN_LATENT_AREA = (60 * 104 + 90 * 160) // 2


class WanFamily(Family):
    def detect_variant(self, model: torch.nn.Module, run: RunContext) -> str:
        classes = {cls.__name__ for cls in type(model).__mro__}
        diffusion_model = model.diffusion_model
        small = diffusion_model.dim <= 1536
        if "WAN22" in classes:  # TI2V-5B
            return "wan2.2-ti2v-5b-i2v" if run.has_denoise_mask else "wan2.2-ti2v-5b-t2v"
        if "WAN21_Vace" in classes:
            return "wan2.1-vace-1.3b" if small else "wan2.1-vace-14b"
        if getattr(diffusion_model, "img_emb", None) is not None:  # I2V: CLIP-vision image embedding
            area = run.latent_shape[-1] * run.latent_shape[-2] if run.latent_shape else 0
            return "wan2.1-i2v-720p" if area >= I2V_720P_MIN_LATENT_AREA else "wan2.1-i2v-480p"
        return "wan2.1-t2v-1.3b" if small else "wan2.1-t2v-14b"

    def block_keys(self, diffusion_model: torch.nn.Module) -> list[BlockKey]:
        return [("double_block", i) for i in range(len(diffusion_model.blocks))]

    def teacache_signal(self, diffusion_model: torch.nn.Module, args: dict) -> torch.Tensor:
        # The published Wan coefficients ("ret" mode) were fitted on e0 itself.
        return args["vec"]


WAN = WanFamily(
    name="wan",
    model_classes=("WAN21", "WAN21_Vace", "WAN21_Camera", "WAN21_HuMo", "WAN22_Animate", "WAN22"),
    variants=(
        Variant("wan2.1-t2v-1.3b", teacache=teacache.WAN21_T2V_1_3B, magcache=magcache.WAN21_T2V_1_3B),
        Variant("wan2.1-t2v-14b", teacache=teacache.WAN21_T2V_14B, magcache=magcache.WAN21_T2V_14B),
        Variant("wan2.1-i2v-480p", teacache=teacache.WAN21_I2V_480P, magcache=magcache.WAN21_I2V_480P),
        Variant("wan2.1-i2v-720p", teacache=teacache.WAN21_I2V_720P, magcache=magcache.WAN21_I2V_720P),
        Variant("wan2.1-vace-1.3b", teacache=teacache.WAN21_T2V_1_3B, magcache=magcache.WAN21_VACE_1_3B),
        # The official VACE-14B script reuses the T2V-14B ratios (MagCache4Wan2.1 L1144).
        Variant("wan2.1-vace-14b", teacache=teacache.WAN21_T2V_14B, magcache=magcache.WAN21_T2V_14B),
        # Same architecture as Wan 2.1 14B: chosen with the variant override, not detected.
        Variant("wan2.2-t2v-a14b", magcache=magcache.WAN22_T2V_A14B),
        Variant("wan2.2-i2v-a14b", magcache=magcache.WAN22_I2V_A14B),
        Variant("wan2.2-ti2v-5b-t2v", magcache=magcache.WAN22_TI2V_5B_T2V),
        Variant("wan2.2-ti2v-5b-i2v", magcache=magcache.WAN22_TI2V_5B_I2V),
    ),
    notes="Wan 2.2 A14B has the Wan 2.1 14B architecture: pick its variant with the override.",
)
