"""Shared fixtures: the real ComfyUI host, booted once per test session.

Tests that take a ``tiny_family``, ``block_family`` or ``output_space_family`` argument run once per
tiny model of the registry (harness/comfy_test_nodes/tiny_models.py) that this ComfyUI can build:
every one, those whose pack family drives the block stack through block hooks, and those it
caches in output space. The lists come from the registries themselves (collecting such a test
boots ComfyUI), so a new tiny model is tested without editing a test.
"""

from __future__ import annotations

import pytest

from harness import host as host_module

FAMILY_ARGUMENTS = ("tiny_family", "block_family", "output_space_family", "controlled_family", "single_stream_family")


@pytest.fixture(scope="session")
def host() -> host_module.Host:
    return host_module.boot()


@pytest.fixture(scope="session")
def server():
    """One real ComfyUI server for the session's API tests."""
    from harness.server import ComfyServer

    with ComfyServer() as running:
        yield running


@pytest.fixture(scope="module")
def baselines(host):
    """Unpatched output of each family (12 steps, cfg 3) and its model, built on first use."""
    from harness.sampling import Job, tiny

    class Baselines(dict):
        def __missing__(self, family: str) -> tuple:
            model = tiny().build_model(family, seed=0)
            self[family] = (model, Job(family).run(model))
            return self[family]

    return Baselines()


def tiny_family_names(kind: str = "tiny_family") -> list[str]:
    """The registry's tiny models this ComfyUI has the class of, optionally only those whose pack
    family caches through block hooks (``block_family``), in output space, or through block hooks
    with ControlNet outputs kept apart (``controlled_family``) or with single-stream blocks
    (``single_stream_family``)."""
    booted = host_module.boot()
    tiny = booted.test_module("tiny_models")
    pack_families = {family.name: family for family in booted.pack_module("families").FAMILIES}
    names = []
    for name, spec in sorted(tiny.FAMILIES.items()):
        if not spec.available():
            continue
        family = pack_families.get(spec.family)
        output_space = family is not None and family.caches_in_output_space
        if kind in ("controlled_family", "single_stream_family"):
            if family is not None and (family.control_lists if kind == "controlled_family"
                                       else family.single_stream):
                names.append(name)
        elif kind == "tiny_family" or (kind == "output_space_family") == output_space:
            names.append(name)
    return names


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    for argument in FAMILY_ARGUMENTS:
        if argument in metafunc.fixturenames:
            metafunc.parametrize(argument, tiny_family_names(argument))
