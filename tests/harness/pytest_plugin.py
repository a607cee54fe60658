"""pytest plugin (loaded with ``-p harness.pytest_plugin``): the repository root is a plain folder.

The root is a ComfyUI custom-node package whose ``__init__.py`` imports ComfyUI, so pytest must
not import it as a test package before a test boots the host; the harness loads it the way
ComfyUI does (harness/host.py).
"""

from __future__ import annotations

import pathlib

import pytest

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.hookimpl(tryfirst=True)
def pytest_collect_directory(path: pathlib.Path, parent: pytest.Collector) -> pytest.Collector | None:
    if path == REPO_ROOT:
        return pytest.Dir.from_parent(parent, path=path)
    return None
