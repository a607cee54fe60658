"""./dev, the entry point: ``./dev test`` runs the suite once against each supported ComfyUI."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess

import pytest

from harness.host import REPO_ROOT, comfyui_dir


def private_host_root() -> pathlib.Path | None:
    """The host root this session's ComfyUI was installed under by scripts/host.sh, if it was."""
    host = comfyui_dir().parent
    return host.parent if re.fullmatch(r"host-\d+\.\d+\.\d+-[0-9a-f]{12}", host.name) else None


def supported_versions() -> list[str]:
    text = (REPO_ROOT / "scripts" / "host.sh").read_text()
    return re.search(r"^SUPPORTED_COMFYUI=\((.*)\)$", text, re.MULTILINE).group(1).split()


def test_dev_test_runs_every_supported_version_once():
    """Each version gets its own host (the first one's exported COMFYUI_DIR once made every later
    version test the first again)."""
    root = private_host_root()
    if root is None:
        pytest.skip("this session runs against a ComfyUI of the user's own (COMFYUI_DIR), not the private hosts")
    env = {k: v for k, v in os.environ.items()
           if k not in {"COMFYUI_DIR", "COMFYUI_PYTHON", "COMFYUI_VERSION", "STEPCACHE_COMFYUI"}}
    env["STEPCACHE_HOST_ROOT"] = str(root)
    done = subprocess.run([str(REPO_ROOT / "dev"), "test", "--collect-only", "-q", "tests/core"], cwd=REPO_ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    tested = re.findall(r"^=== the test suite against ComfyUI (\S+) \((.*)\)$", done.stderr, re.MULTILINE)
    assert [version for version, _ in tested] == supported_versions()
    assert len({tree for _, tree in tested}) == len(tested)  # a tree of its own per version
