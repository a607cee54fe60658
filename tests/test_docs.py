"""The README and docs/ read as documents: every relative link and image points at a file of the
repository, and every #anchor at a heading of its target (GitHub's heading slugs)."""

from __future__ import annotations

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: pathlib.Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {slug(m.group(1)) for m in re.finditer(r"(?m)^#{1,6} (.+)$", text)}


def links(path: pathlib.Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return [m.group(1) for m in LINK.finditer(text) if not re.match(r"[a-z]+:", m.group(1))]


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_and_anchor_resolves(document):
    broken = []
    for target in links(document):
        file_part, _, anchor = target.partition("#")
        path = (document.parent / file_part).resolve() if file_part else document
        if not path.exists():
            broken.append(f"{target}: no file {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            broken.append(f"{target}: no heading #{anchor} in {path.relative_to(ROOT)}")
    assert not broken, f"{document.relative_to(ROOT)}: " + "; ".join(broken)


def test_the_readme_is_a_users_guide_of_about_250_lines():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 270
    assert readme.splitlines()[2:6] == [
        "```bash",
        "./dev demo   # headless ComfyUI run of an example workflow with the cache, on a built-in model",
        "./dev test   # the whole test suite, against a real ComfyUI 0.30.0 and then 0.3.75 (what CI runs)",
        "```",
    ]
    headings = re.findall(r"(?m)^## (.+)$", readme)
    for section in ("Install", "Quick start", "Quality: the one knob", "Nodes", "Supported models", "Calibrating",
                    "Troubleshooting", "Headless use (HTTP API)"):
        assert section in headings, section
