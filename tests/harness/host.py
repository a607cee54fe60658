"""Boots the real ComfyUI in this process (CPU) with this pack and the test-only nodes loaded."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import pathlib
import re
import sys
import tempfile
from dataclasses import dataclass
from types import ModuleType

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
TEST_NODES_DIR = pathlib.Path(__file__).resolve().parent / "comfy_test_nodes"
# The folder name a user's custom_nodes/ would hold the pack under.
PACK_FOLDER_NAME = "comfyui-stepcache"
TEST_NODES_FOLDER_NAME = "stepcache_test_nodes"


def comfyui_dir() -> pathlib.Path:
    value = os.environ.get("COMFYUI_DIR")
    if not value:
        raise RuntimeError("COMFYUI_DIR is not set: run the tests through ./dev test, which installs the host")
    path = pathlib.Path(value).resolve()
    if not (path / "comfy" / "model_patcher.py").is_file():
        raise RuntimeError(f"COMFYUI_DIR={path} is not a ComfyUI tree")
    return path


def comfyui_version() -> str:
    """The version of the ComfyUI tree under test, from its comfyui_version.py (what its server
    reports in /system_stats)."""
    text = (comfyui_dir() / "comfyui_version.py").read_text()
    match = re.search(r'^__version__ = "([^"]+)"', text, re.MULTILINE)
    if match is None:
        raise RuntimeError(f"no __version__ in {comfyui_dir() / 'comfyui_version.py'}")
    return match.group(1)


def make_base_directory(prefix: str, test_nodes: bool = True) -> pathlib.Path:
    """A ComfyUI --base-directory whose custom_nodes/ holds this pack (and the test-only nodes)."""
    base = pathlib.Path(tempfile.mkdtemp(prefix=prefix))
    custom_nodes = base / "custom_nodes"
    custom_nodes.mkdir()
    (custom_nodes / PACK_FOLDER_NAME).symlink_to(REPO_ROOT, target_is_directory=True)
    if test_nodes:
        (custom_nodes / TEST_NODES_FOLDER_NAME).symlink_to(TEST_NODES_DIR, target_is_directory=True)
    for sub in ("models/diffusion_models", "input", "output", "user", "temp"):
        (base / sub).mkdir(parents=True, exist_ok=True)
    return base


@dataclass(frozen=True)
class Host:
    base_directory: pathlib.Path
    pack: ModuleType
    test_nodes: ModuleType

    def pack_module(self, dotted: str) -> ModuleType:
        """A submodule of the pack as ComfyUI loaded it, e.g. ``pack_module("cache_core.policies")``."""
        import importlib

        return importlib.import_module(f"{self.pack.__name__}.{dotted}")

    def test_module(self, dotted: str) -> ModuleType:
        import importlib

        return importlib.import_module(f"{self.test_nodes.__name__}.{dotted}")


# "cpu" (the default) or "auto": ComfyUI picks its device, as a user's start-up does.
HOST_DEVICE_VARIABLE = "STEPCACHE_HOST_DEVICE"


@functools.cache
def boot() -> Host:
    """Import ComfyUI (on CPU unless STEPCACHE_HOST_DEVICE says otherwise) and load the custom nodes
    exactly as ComfyUI's start-up does."""
    root = comfyui_dir()
    base = make_base_directory("stepcache-inproc-")
    sys.path.insert(0, str(root))

    from comfy.cli_args import args  # parsing of sys.argv stays off (comfy.options default)

    # Before comfy.model_management is imported. Only the GPU check (./dev bench --gpu) asks for
    # ComfyUI's own device choice.
    args.cpu = os.environ.get(HOST_DEVICE_VARIABLE, "cpu") == "cpu"
    args.base_directory = str(base)
    args.disable_auto_launch = True
    # `nodes` puts comfy/ on sys.path; importing this first keeps `utils` resolving to ComfyUI's
    # utils/ package (main.py does the same).
    # isort: off
    import utils.extra_config  # noqa: F401
    import nodes
    # isort: on

    # Tiny models run faster on one thread, and tests then do not fight other processes for cores.
    import torch

    torch.set_num_threads(1)
    logging.getLogger().setLevel(logging.INFO)
    asyncio.run(nodes.init_extra_nodes(init_custom_nodes=True, init_api_nodes=False))

    custom_nodes = base / "custom_nodes"
    pack = sys.modules.get(str(custom_nodes / PACK_FOLDER_NAME).replace(".", "_x_"))
    test_nodes = sys.modules.get(str(custom_nodes / TEST_NODES_FOLDER_NAME).replace(".", "_x_"))
    if pack is None or test_nodes is None or "ApplyTeaCache" not in nodes.NODE_CLASS_MAPPINGS:
        raise RuntimeError("ComfyUI did not load the pack or the test nodes; see the log above")
    return Host(base_directory=base, pack=pack, test_nodes=test_nodes)
