"""Model families: one module per family describes how ComfyUI runs it and its published constants.

A model belongs to the family that lists its exact ComfyUI class (``comfy.model_base``) name; a
class no family lists is never cached (a subclass may change the forward the hooks rely on).
``UNSUPPORTED`` says why for every other class of ComfyUI's model_base; classes that a ComfyUI
version does not have simply never occur there.

To add a family: write ``families/<name>.py`` with a ``Family`` (see base.py for what it declares),
add it to ``FAMILIES`` below, and add a tiny model of it to tests/harness/comfy_test_nodes/
tiny_models.py; the generic tests then cover it.
"""

from __future__ import annotations

import torch

from .base import METHOD_CONSTANTS, Architecture, BlockKey, Family, RunContext, TeaCacheCoefficients, Variant
from .chroma import CHROMA
from .flux import FLUX, FLUX2
from .hunyuan_video import HUNYUAN_VIDEO
from .joyimage import JOYIMAGE
from .lens import LENS
from .ltxv import LTXV
from .mochi import MOCHI
from .output_space import AURAFLOW, COGVIDEOX, COSMOS, HIDREAM, KANDINSKY5, KREA2, LUMINA2, PIXELDIT
from .qwen_image import QWEN_IMAGE
from .sd3 import SD3
from .wan import WAN

FAMILIES: tuple[Family, ...] = (
    FLUX, FLUX2, CHROMA, WAN, HUNYUAN_VIDEO, QWEN_IMAGE, LTXV, SD3, LENS, JOYIMAGE, MOCHI, LUMINA2, HIDREAM,
    COSMOS, KANDINSKY5, KREA2, PIXELDIT, COGVIDEOX, AURAFLOW,
)

_UNET = "a UNet"
_AUDIO = "an audio model"
_3D = "a 3D-shape model"
_NOT_DIFFUSION = "not a diffusion model (detection, segmentation or depth)"
_NO_PATCH_POINT = "its forward has no patch point: no DIFFUSION_MODEL wrapper, no block patches"
_NOT_YET = "not implemented yet: no family module or tiny-model test"

# Every other class of ComfyUI's comfy.model_base (0.3.75 and 0.30.0), and why it is not cached.
UNSUPPORTED: dict[str, str] = {
    "BaseModel": _UNET + " (SD 1.x / 2.x)",
    "SD21UNCLIP": _UNET, "SDXLRefiner": _UNET, "SDXL": _UNET, "SVD_img2vid": _UNET, "SV3D_u": _UNET,
    "SV3D_p": _UNET, "Stable_Zero123": _UNET, "SD_X4Upscaler": _UNET, "Lotus": _UNET,
    "SD15_instructpix2pix": _UNET, "SDXL_instructpix2pix": _UNET,
    "StableCascade_C": "Stable Cascade stage C, a UNet-style prior",
    "StableCascade_B": "Stable Cascade stage B, a UNet",
    "StableAudio1": _AUDIO, "StableAudio3": _AUDIO, "ACEStep": _AUDIO, "ACEStep15": _AUDIO,
    "Hunyuan3Dv2": _3D, "Hunyuan3Dv2_1": _3D, "TripoSplat": _3D, "MiniMaxH3": (
        "an audio-video model: its latent is a nested (video, audio) pair sampled on two shifted schedules"),
    "RT_DETR_v4": _NOT_DIFFUSION, "SAM3": _NOT_DIFFUSION, "DepthAnything3": _NOT_DIFFUSION,
    "PixArt": _NO_PATCH_POINT, "Omnigen2": _NO_PATCH_POINT, "Boogu": _NO_PATCH_POINT, "ErnieImage": _NO_PATCH_POINT,
    "HunyuanDiT": "its block patches get no transformer_options and it has no DIFFUSION_MODEL wrapper",
    "LTXAV": "an audio-video model (LTX-2): its blocks carry a (video, audio) pair of streams",
    "WAN21_CausalAR": "autoregressive: ComfyUI runs its blocks frame block by frame block with KV caches, "
                      "outside any patch point",
    "SeedVR2": "one-step video restoration: no step to skip",
    "HunyuanVideo15_SR_Distilled": "a step-distilled super-resolution stage (a few steps: nothing to skip)",
    "Ideogram4": "ComfyUI fixes its sizes (4608 wide, 53248-wide text features), so no tiny model can "
                 "test the cache on it",
    "HiDreamO1": "its transformer is a Qwen3-VL language model run on token ids with its own prompt KV "
                 "cache; " + _NOT_YET,
    "PiD": "a pixel decoder / upscaler of other models' latents; " + _NOT_YET,
}

_BY_CLASS = {name: family for family in FAMILIES for name in family.model_classes}


def family_for(model: torch.nn.Module) -> Family | None:
    """The family of ComfyUI's BaseModel ``model``, by its exact class name."""
    return _BY_CLASS.get(type(model).__name__)


def unsupported_reason(model: torch.nn.Module) -> str:
    name = type(model).__name__
    if name in UNSUPPORTED:
        return f"{name} is not a supported diffusion transformer ({UNSUPPORTED[name]})"
    return f"{name} is not a supported diffusion transformer"


__all__ = [
    "FAMILIES",
    "METHOD_CONSTANTS",
    "UNSUPPORTED",
    "Architecture",
    "BlockKey",
    "Family",
    "RunContext",
    "TeaCacheCoefficients",
    "Variant",
    "family_for",
    "unsupported_reason",
]
