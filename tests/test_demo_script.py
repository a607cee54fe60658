"""scripts/demo.py, what ``./dev demo`` runs: the real server, an example workflow cached and uncached."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from harness.host import REPO_ROOT

pytestmark = pytest.mark.server


def test_the_demo_runs_a_workflow_given_by_a_relative_path(tmp_path):
    """A relative --workflow is read from the caller's directory (it crashed in relative_to)."""
    env = {k: v for k, v in os.environ.items() if k != "STEPCACHE_CALLER_CWD"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT / "tests"), env.get("PYTHONPATH", "")])
    workflow = pathlib.Path("..") / "example_workflows" / "api" / "demo_image_teacache.json"
    done = subprocess.run(
        [sys.executable, "-P", str(REPO_ROOT / "scripts" / "demo.py"), "--workflow", str(workflow),
         "--rounds", "1", "--out", str(tmp_path / "out")],
        cwd=REPO_ROOT / "tests", env=env, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "workflow example_workflows/api/demo_image_teacache.json" in done.stdout
    assert "Cache (flux / " in done.stdout and "TeaCache" in done.stdout
    assert "Output vs uncached: PSNR" in done.stdout
    assert len(list((tmp_path / "out").glob("demo_cached_*.png"))) >= 1
