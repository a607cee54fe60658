"""Families without usable block hooks: cached in output space through the DIFFUSION_MODEL wrapper.

Their forwards never look at ``patches_replace["dit"]`` (Lumina 2 / Z-Image, HiDream, Cosmos,
Anima, CogVideoX, Ideogram 4, Krea 2, PixelDiT) or hand their blocks arguments the hooks do not
take (Kandinsky 5's ``x``/``time_embed``, HiDream-O1, whose own prompt cache block patches
disable), so the block stack cannot be skipped from outside. They are cached one level up
instead: the "stack" is the whole diffusion model, its residual is model output minus model input
(the latent's channels of it; the same trick as ComfyUI's EasyCache), and a skipped step returns
input + cached residual without running the model at all. The TeaCache signal is the relative
change of the model's input (no published coefficients fit it); MagCache needs a calibration
measured in this same space. No constants are published for any of them in this space.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import torch

from .base import Family, Variant


class OutputSpaceFamily(Family):
    block_lists: ClassVar[Mapping[str, str]] = {}  # no block hooks: the whole model is the stack

    @property
    def caches_in_output_space(self) -> bool:
        return True

    def teacache_signal(self, diffusion_model: torch.nn.Module, args: dict) -> torch.Tensor:
        raise NotImplementedError("output-space families use the model input as the signal")


# Lumina Image 2.0 and Z-Image share ComfyUI's Lumina2 class; Z-Image's pixel-space model
# (ComfyUI 0.30.0) decodes RGB patches with an MLP instead of the final layer.
LUMINA2 = OutputSpaceFamily(
    name="lumina2", model_classes=("Lumina2", "ZImagePixelSpace"),
    variants=(Variant("lumina2", "Lumina Image 2.0 / Z-Image"), Variant("z-image-pixel-space", "Z-Image pixel space")),
    class_variants={"Lumina2": "lumina2", "ZImagePixelSpace": "z-image-pixel-space"},
)
HIDREAM = OutputSpaceFamily(name="hidream", model_classes=("HiDream",), variants=(Variant("hidream", "HiDream-I1"),))
# Anima (ComfyUI 0.30.0) is Cosmos-Predict2's DiT with an LLM adapter for its text.
COSMOS = OutputSpaceFamily(
    name="cosmos", model_classes=("CosmosVideo", "CosmosPredict2", "Anima"),
    variants=(Variant("cosmos", "Cosmos"), Variant("anima", "Anima")),
    class_variants={"Anima": "anima"},
)
KANDINSKY5 = OutputSpaceFamily(
    name="kandinsky5", model_classes=("Kandinsky5", "Kandinsky5Image"),
    variants=(Variant("kandinsky5", "Kandinsky 5 video"), Variant("kandinsky5-image", "Kandinsky 5 image")),
    class_variants={"Kandinsky5": "kandinsky5", "Kandinsky5Image": "kandinsky5-image"},
)
KREA2 = OutputSpaceFamily(name="krea2", model_classes=("Krea2",), variants=(Variant("krea2", "Krea 2"),))
PIXELDIT = OutputSpaceFamily(name="pixeldit", model_classes=("PixelDiTT2I",),
                             variants=(Variant("pixeldit", "PixelDiT"),))
COGVIDEOX = OutputSpaceFamily(name="cogvideox", model_classes=("CogVideoX",),
                              variants=(Variant("cogvideox", "CogVideoX"),))
AURAFLOW = OutputSpaceFamily(name="auraflow", model_classes=("AuraFlow",), variants=(Variant("auraflow", "AuraFlow"),))
