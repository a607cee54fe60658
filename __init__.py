"""StepCache: TeaCache and MagCache step caching for diffusion transformers in ComfyUI.

ComfyUI loads this folder from custom_nodes/ and calls ``comfy_entrypoint`` (V3 node API).
"""

from .nodes import comfy_entrypoint

WEB_DIRECTORY = "./web"

__all__ = ["WEB_DIRECTORY", "comfy_entrypoint"]
