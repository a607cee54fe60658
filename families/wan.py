"""Wan 2.1 and 2.2 (T2V, I2V, TI2V-5B, VACE, and the models ComfyUI builds on the same blocks), in
comfy/ldm/wan.

Blocks: ``blocks`` as ``double_block`` keys; each gets ``img``, ``txt``, ``vec`` = e0 (the projected
time modulation), ``pe`` and returns ``img``. VACE, Animate, HuMo and S2V (audio) add into the
hidden states between blocks; the tail of a skipped call replaces the stream, so those additions
are not counted twice. Reference and pose tokens (S2V, SCAIL) are part of the stream.

Published constants exist for Wan 2.1 T2V 1.3B/14B, I2V 14B 480p/720p, VACE 1.3B/14B and Wan 2.2
TI2V-5B (told apart by class, width, input channels and, for I2V, the latent size). Wan 2.2 A14B
has the Wan 2.1 14B architecture and cannot be told from it: pick its variant with the override.
Camera, HuMo, Animate, S2V, FlowRVS, SCAIL, SCAIL-2 and WanDancer have none. ComfyUI 0.30.0's
causal autoregressive Wan (WAN21_CausalAR) runs its blocks without patch points: not supported.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import torch

from . import published_magcache as magcache
from . import published_teacache as teacache
from .base import Architecture, Family, RunContext, Variant

# Latent area (H x W, VAE stride 8) halfway between 480p (60 x 104) and 720p (90 x 160).
I2V_720P_MIN_LATENT_AREA = (60 * 104 + 90 * 160) // 2
SMALL_WIDTH = 1536  # Wan 2.1 1.3B; the 14B models are 5120 wide


class WanFamily(Family):
    def detect_variant(self, model: torch.nn.Module, run: RunContext) -> str:
        model_class = type(model).__name__
        if model_class in self.class_variants:
            return self.class_variants[model_class]
        shape = self.shape(model.diffusion_model)
        small = shape["width"] <= SMALL_WIDTH
        if model_class == "WAN22":  # TI2V-5B
            return "wan2.2-ti2v-5b-i2v" if run.has_denoise_mask else "wan2.2-ti2v-5b-t2v"
        if model_class == "WAN21_Vace":
            return "wan2.1-vace-1.3b" if small else "wan2.1-vace-14b"
        if shape["image_embedding"]:  # I2V: CLIP-vision image embedding
            area = run.latent_shape[-1] * run.latent_shape[-2] if run.latent_shape else 0
            return "wan2.1-i2v-720p" if area >= I2V_720P_MIN_LATENT_AREA else "wan2.1-i2v-480p"
        return "wan2.1-t2v-1.3b" if small else "wan2.1-t2v-14b"

    def shape(self, diffusion_model: torch.nn.Module) -> dict[str, object]:
        image_embedding = getattr(diffusion_model, "img_emb", None)
        return {
            "width": diffusion_model.dim,
            "blocks": len(diffusion_model.blocks),
            "in_channels": diffusion_model.patch_embedding.in_channels,
            "image_embedding": image_embedding is not None,
            # First-last-frame models add position embeddings to the image embedding.
            "first_last_frame": getattr(image_embedding, "emb_pos", None) is not None,
        }

    block_lists: ClassVar[Mapping[str, str]] = {"double_block": "blocks"}

    def teacache_signal(self, diffusion_model: torch.nn.Module, args: dict) -> torch.Tensor:
        # The published Wan coefficients ("ret" mode) were fitted on e0 itself.
        return args["vec"]


def wan_shape(model_class: str, width: int, blocks: int, in_channels: int,
              image_embedding: bool = False) -> Architecture:
    return Architecture(model_class, {"width": width, "blocks": blocks, "in_channels": in_channels,
                                      "image_embedding": image_embedding, "first_last_frame": False})


T2V_1_3B = wan_shape("WAN21", 1536, 30, 16)
T2V_14B = wan_shape("WAN21", 5120, 40, 16)
I2V_14B = wan_shape("WAN21", 5120, 40, 36, image_embedding=True)
TI2V_5B = wan_shape("WAN22", 3072, 30, 48)

WAN = WanFamily(
    name="wan",
    model_classes=("WAN21", "WAN21_Vace", "WAN21_Camera", "WAN21_HuMo", "WAN22_Animate", "WAN22", "WAN22_S2V",
                   "WAN21_FlowRVS", "WAN21_SCAIL", "WAN21_SCAIL2", "WAN22_WanDancer"),
    variants=(
        Variant("wan2.1-t2v-1.3b", "Wan2.1-T2V-1.3B", T2V_1_3B, teacache=teacache.WAN21_T2V_1_3B,
                magcache=magcache.WAN21_T2V_1_3B),
        Variant("wan2.1-t2v-14b", "Wan2.1-T2V-14B", T2V_14B, teacache=teacache.WAN21_T2V_14B,
                magcache=magcache.WAN21_T2V_14B),
        Variant("wan2.1-i2v-480p", "Wan2.1-I2V-14B-480P", I2V_14B, teacache=teacache.WAN21_I2V_480P,
                magcache=magcache.WAN21_I2V_480P),
        Variant("wan2.1-i2v-720p", "Wan2.1-I2V-14B-720P", I2V_14B, teacache=teacache.WAN21_I2V_720P,
                magcache=magcache.WAN21_I2V_720P),
        # TeaCache published nothing for VACE; MagCache's VACE-14B script uses the T2V-14B ratios
        # (MagCache4Wan2.1 L1144), so those are VACE-14B's published ratios.
        Variant("wan2.1-vace-1.3b", "Wan2.1-VACE-1.3B", wan_shape("WAN21_Vace", 1536, 30, 16),
                magcache=magcache.WAN21_VACE_1_3B),
        Variant("wan2.1-vace-14b", "Wan2.1-VACE-14B", wan_shape("WAN21_Vace", 5120, 40, 16),
                magcache=magcache.WAN21_T2V_14B),
        # Same architectures as Wan 2.1 14B T2V and a 36-channel T2V: chosen with the variant
        # override, never detected.
        Variant("wan2.2-t2v-a14b", "Wan2.2-T2V-A14B", T2V_14B, magcache=magcache.WAN22_T2V_A14B, by_name_only=True),
        Variant("wan2.2-i2v-a14b", "Wan2.2-I2V-A14B", wan_shape("WAN21", 5120, 40, 36),
                magcache=magcache.WAN22_I2V_A14B, by_name_only=True),
        Variant("wan2.2-ti2v-5b-t2v", "Wan2.2-TI2V-5B (text to video)", TI2V_5B, magcache=magcache.WAN22_TI2V_5B_T2V),
        Variant("wan2.2-ti2v-5b-i2v", "Wan2.2-TI2V-5B (image to video)", TI2V_5B, magcache=magcache.WAN22_TI2V_5B_I2V),
        Variant("wan-camera", "Wan Fun Camera"),
        Variant("wan2.1-humo", "HuMo"),
        Variant("wan2.2-animate", "Wan2.2-Animate"),
        Variant("wan2.2-s2v", "Wan2.2-S2V"),
        Variant("wan2.1-flowrvs", "FlowRVS"),
        Variant("wan2.1-scail", "SCAIL"),
        Variant("wan2.1-scail2", "SCAIL-2"),
        Variant("wan2.2-wandancer", "WanDancer"),
    ),
    class_variants={
        "WAN21_Camera": "wan-camera", "WAN21_HuMo": "wan2.1-humo", "WAN22_Animate": "wan2.2-animate",
        "WAN22_S2V": "wan2.2-s2v", "WAN21_FlowRVS": "wan2.1-flowrvs", "WAN21_SCAIL": "wan2.1-scail",
        "WAN21_SCAIL2": "wan2.1-scail2", "WAN22_WanDancer": "wan2.2-wandancer",
    },
    architecture_name="wan-architecture model",
    # Before the variants knew their architectures, TeaCache on VACE borrowed the T2V coefficients
    # of the same size (MagCache's VACE variants stay: their ratios are published).
    legacy_variants={"teacache": {"wan2.1-vace-1.3b": "wan2.1-t2v-1.3b", "wan2.1-vace-14b": "wan2.1-t2v-14b"}},
)
