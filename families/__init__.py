"""Model families: one module per family describes how ComfyUI runs it and its published constants.

To add a family: write ``families/<name>.py`` with a ``Family`` (see base.py for what it declares),
add it to ``FAMILIES`` below, and add a tiny model of it to tests/harness/comfy_test_nodes/
tiny_models.py; the generic tests then cover it.
"""

from __future__ import annotations

import torch

from .base import BlockKey, Family, RunContext, TeaCacheCoefficients, Variant
from .chroma import CHROMA
from .flux import FLUX, FLUX2
from .hunyuan_video import HUNYUAN_VIDEO
from .ltxv import LTXV
from .output_space import COSMOS, HIDREAM, LUMINA2
from .qwen_image import QWEN_IMAGE
from .sd3 import SD3
from .wan import WAN

FAMILIES: tuple[Family, ...] = (
    FLUX, FLUX2, CHROMA, WAN, HUNYUAN_VIDEO, QWEN_IMAGE, LTXV, SD3, LUMINA2, HIDREAM, COSMOS,
)

# ComfyUI model classes with a DiT that the cache cannot drive, and why.
UNSUPPORTED: dict[str, str] = {
    "WAN22_S2V": "Wan 2.2 S2V passes no transformer_options to its blocks",
}

_BY_CLASS = {name: family for family in FAMILIES for name in family.model_classes}


def family_for(model: torch.nn.Module) -> Family | None:
    """The family of ComfyUI's BaseModel ``model``, by its most derived known class."""
    for cls in type(model).__mro__:
        if cls.__name__ in UNSUPPORTED:
            return None
        family = _BY_CLASS.get(cls.__name__)
        if family is not None:
            return family
    return None


def unsupported_reason(model: torch.nn.Module) -> str:
    for cls in type(model).__mro__:
        if cls.__name__ in UNSUPPORTED:
            return UNSUPPORTED[cls.__name__]
    return f"{type(model).__name__} is not a supported diffusion transformer"


__all__ = [
    "FAMILIES",
    "BlockKey",
    "Family",
    "RunContext",
    "TeaCacheCoefficients",
    "Variant",
    "family_for",
    "unsupported_reason",
]
