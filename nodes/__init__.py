"""The ComfyUI adapter: node schemas and the wiring of cache_core into ComfyUI's patch points."""

from __future__ import annotations

import logging
import sys

from comfy_api.latest import ComfyExtension, io

from .apply_nodes import ApplyMagCache, ApplyTeaCache
from .calibrate_nodes import CALIBRATION_NODES
from .compile_nodes import COMPILE_NODES
from .demo_nodes import DEMO_NODES
from .reporting import register_routes

LOGGER = logging.getLogger("stepcache")


def warn_about_taken_node_ids(node_list: list[type[io.ComfyNode]]) -> None:
    """ComfyUI lets the pack loaded last silently replace a node id; say so when one is taken.

    (A public SDXL/OmniGen2 MagCache pack also registers ``MagCacheCalibrate``.)
    """
    registry = getattr(sys.modules.get("nodes"), "NODE_CLASS_MAPPINGS", {})
    for node_cls in node_list:
        node_id = node_cls.GET_SCHEMA().node_id
        if node_id in registry and registry[node_id] is not node_cls:
            owner = getattr(registry[node_id], "RELATIVE_PYTHON_MODULE", "ComfyUI")
            LOGGER.warning("[StepCache] node id %s is already registered by %s; this pack's node replaces it "
                           "(workflows made for the other pack's node will not validate)", node_id, owner)


class StepCacheExtension(ComfyExtension):
    async def get_node_list(self) -> list[type[io.ComfyNode]]:
        node_list = [ApplyTeaCache, ApplyMagCache, *CALIBRATION_NODES, *COMPILE_NODES, *DEMO_NODES]
        warn_about_taken_node_ids(node_list)
        return node_list


async def comfy_entrypoint() -> ComfyExtension:
    register_routes()
    return StepCacheExtension()
