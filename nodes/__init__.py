"""The ComfyUI adapter: node schemas and the wiring of cache_core into ComfyUI's patch points."""

from __future__ import annotations

from comfy_api.latest import ComfyExtension, io

from .apply_nodes import ApplyMagCache, ApplyTeaCache
from .calibrate_nodes import CALIBRATION_NODES
from .demo_nodes import DEMO_NODES
from .reporting import register_routes


class StepCacheExtension(ComfyExtension):
    async def get_node_list(self) -> list[type[io.ComfyNode]]:
        return [ApplyTeaCache, ApplyMagCache, *CALIBRATION_NODES, *DEMO_NODES]


async def comfy_entrypoint() -> ComfyExtension:
    register_routes()
    return StepCacheExtension()
