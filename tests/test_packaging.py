"""The pack is ready for the Comfy Registry: the metadata comfy-cli reads, and what it points at."""

from __future__ import annotations

import ast
import pathlib
import re
import sys

import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_registry_metadata_is_complete_and_well_formed():
    meta = project()
    name, version = meta["project"]["name"], meta["project"]["version"]
    # The registry's rules for a node id: under 100 characters, starts with a letter, only
    # alphanumerics and single - _ . separators.
    assert len(name) < 100 and re.fullmatch(r"[A-Za-z][A-Za-z0-9]*([-_.][A-Za-z0-9]+)*", name)
    assert re.fullmatch(r"\d+\.\d+\.\d+", version)
    assert (ROOT / meta["project"]["license"]["file"]).is_file()
    assert meta["project"]["urls"]["Repository"].startswith("https://")
    comfy = meta["tool"]["comfy"]
    assert comfy["PublisherId"] and comfy["DisplayName"]
    assert re.fullmatch(r">=\d+\.\d+\.\d+", comfy["requires-comfyui"])


def test_the_icon_url_names_a_file_in_the_repository():
    icon = project()["tool"]["comfy"]["Icon"]
    repository = project()["project"]["urls"]["Repository"].removeprefix("https://github.com/")
    prefix = f"https://raw.githubusercontent.com/{repository}/main/"
    assert icon.startswith(prefix)
    path = ROOT / icon.removeprefix(prefix)
    assert path.is_file() and path.read_text().lstrip().startswith("<svg")


def test_runtime_dependencies_are_what_the_shipped_code_imports():
    """Shipped code (not tests, demo training or benchmark) imports only the declared packages."""
    declared = {re.split(r"[<>=~ ]", d)[0] for d in project()["project"]["dependencies"]}
    host_provided = {"comfy", "comfy_api", "nodes", "server", "folder_paths", "aiohttp"}
    shipped = [p for folder in ("cache_core", "families", "nodes") for p in (ROOT / folder).rglob("*.py")]
    shipped.append(ROOT / "__init__.py")
    imported = set()
    for path in shipped:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                imported.add(node.module.split(".")[0])

    third_party = {m for m in imported if m not in sys.stdlib_module_names and m != "__future__"}
    assert third_party <= declared | host_provided, third_party - declared - host_provided
