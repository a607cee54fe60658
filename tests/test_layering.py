"""The pack's layering, read from the source with ``ast`` (nothing is imported, no ComfyUI):

- cache_core/ imports nothing of ComfyUI and nothing outside itself beyond torch, numpy and the
  standard library (it is the algorithm, testable and reusable without a host);
- families/ import only cache_core from the pack (and may import ComfyUI, torch, numpy);
- nothing in the pack imports nodes/ (the ComfyUI adapter) except the package root.

The pack reaches its own modules by relative imports only (ComfyUI loads it under a name made
from its folder path), so an absolute import is always another package: ``import nodes`` is
ComfyUI's nodes.py, never the pack's nodes/.
"""

from __future__ import annotations

import ast
import pathlib
import sys
from typing import NamedTuple

import pytest

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
PACK_PACKAGES = ("cache_core", "families", "nodes", "demo")
STDLIB = set(sys.stdlib_module_names)
NUMERIC = {"torch", "numpy"}


class Import(NamedTuple):
    name: str  # pack-relative dotted path ("cache_core.policies") or absolute module name
    in_pack: bool  # a relative import, i.e. a module of the pack
    line: int


def imports_of(source: str, package: tuple[str, ...]) -> list[Import]:
    """Every import of a module of ``package`` (a path of folders under the repository root),
    also those inside functions."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [Import(alias.name, False, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            found.append(Import(node.module, False, node.lineno))
        elif isinstance(node, ast.ImportFrom):
            if node.level - 1 > len(package):
                raise ValueError(f"line {node.lineno}: a relative import above the pack")
            base = list(package[: len(package) - (node.level - 1)])
            names = [node.module] if node.module else [alias.name for alias in node.names]
            found += [Import(".".join([*base, name]), True, node.lineno) for name in names]
    return found


def module_imports(path: pathlib.Path) -> list[Import]:
    return imports_of(path.read_text(), path.parent.relative_to(REPO_ROOT).parts)


def pack_files(*packages: str) -> list[pathlib.Path]:
    return [p for package in packages for p in sorted((REPO_ROOT / package).rglob("*.py"))]


def rel(path: pathlib.Path) -> str:
    return str(path.relative_to(REPO_ROOT))


def test_relative_imports_resolve_to_pack_modules():
    source = "from . import a, b\nfrom .base import X\nfrom ..cache_core import y\nimport nodes\nfrom torch import nn\n"
    assert imports_of(source, ("families",)) == [
        Import("families.a", True, 1), Import("families.b", True, 1), Import("families.base", True, 2),
        Import("cache_core", True, 3), Import("nodes", False, 4), Import("torch", False, 5),
    ]
    with pytest.raises(ValueError):
        imports_of("from ... import x\n", ("families",))


@pytest.mark.parametrize("path", pack_files("cache_core"), ids=rel)
def test_cache_core_imports_only_torch_numpy_the_stdlib_and_itself(path):
    for imported in module_imports(path):
        top = imported.name.split(".")[0]
        allowed = top == "cache_core" if imported.in_pack else top in STDLIB | NUMERIC | {"__future__"}
        assert allowed, f"{rel(path)}:{imported.line} imports {imported.name}"


@pytest.mark.parametrize("path", pack_files("families"), ids=rel)
def test_families_import_only_cache_core_from_the_pack(path):
    for imported in module_imports(path):
        top = imported.name.split(".")[0]
        if imported.in_pack:
            assert top in {"families", "cache_core"}, f"{rel(path)}:{imported.line} imports {imported.name}"
        else:
            assert top in STDLIB | NUMERIC | {"__future__"} or top.startswith("comfy"), \
                f"{rel(path)}:{imported.line} imports {imported.name}"


@pytest.mark.parametrize("path", pack_files("cache_core", "families", "demo"), ids=rel)
def test_nothing_but_the_package_root_imports_nodes(path):
    for imported in module_imports(path):
        assert not (imported.in_pack and imported.name.split(".")[0] == "nodes"), \
            f"{rel(path)}:{imported.line} imports the adapter ({imported.name})"


def test_the_package_root_is_the_only_importer_of_nodes():
    importers = {rel(p) for p in [REPO_ROOT / "__init__.py", *pack_files(*PACK_PACKAGES)]
                 if p.parent.name != "nodes"
                 and any(i.in_pack and i.name.split(".")[0] == "nodes" for i in module_imports(p))}
    assert importers == {"__init__.py"}
