"""Shared fixtures: the real ComfyUI host, booted once per test session."""

from __future__ import annotations

import pytest

from harness import host as host_module


@pytest.fixture(scope="session")
def host() -> host_module.Host:
    return host_module.boot()


@pytest.fixture(scope="session")
def server():
    """One real ComfyUI server for the session's API tests."""
    from harness.server import ComfyServer

    with ComfyServer() as running:
        yield running
