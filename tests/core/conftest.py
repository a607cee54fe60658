"""cache_core on its own: no ComfyUI is booted or imported for these tests.

cache_core depends on torch, numpy and the standard library only (tests/test_layering.py holds
that), so it is loaded here as a package of its own, straight from its folder, and the tests run
in a second or two.
"""

from __future__ import annotations

import importlib.util
import pathlib
import sys
from types import ModuleType

import pytest

CACHE_CORE_DIR = pathlib.Path(__file__).resolve().parents[2] / "cache_core"
PACKAGE_NAME = "stepcache_cache_core"


def load_cache_core() -> ModuleType:
    if PACKAGE_NAME not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            PACKAGE_NAME, CACHE_CORE_DIR / "__init__.py", submodule_search_locations=[str(CACHE_CORE_DIR)])
        module = importlib.util.module_from_spec(spec)
        sys.modules[PACKAGE_NAME] = module
        spec.loader.exec_module(module)
    return sys.modules[PACKAGE_NAME]


@pytest.fixture(scope="session")
def core() -> ModuleType:
    return load_cache_core()
