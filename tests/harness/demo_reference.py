"""Fixed-seed samples of the committed demo models, summarised small enough to commit.

``tests/test_demo_models.py`` samples the demo image and video models with these settings on the
ComfyUI the suite runs on and compares with ``tests/reference/demo_models.json``: the committed
weights must load and sample the same on every supported version. After retraining a model::

    ./dev py -m harness.demo_reference      # rewrites tests/reference/demo_models.json

The summary of a latent is, per sample and channel, its average over a 4x4 grid of tiles (for
video also over the two halves of the clip): enough to show a wrong schedule, class, head count
or weight, small enough to read in a diff.
"""

from __future__ import annotations

import json
import pathlib
import sys

import torch

from harness import host as host_module

REFERENCE_PATH = pathlib.Path(__file__).resolve().parents[1] / "reference" / "demo_models.json"
SETTINGS = {
    "image": {"classes": [0, 4, 9], "seed": 7, "steps": 20, "cfg": 4.0},
    "video": {"classes": [0, 4], "seed": 3, "steps": 20, "cfg": 4.0},
}


def summarise(latent: torch.Tensor) -> torch.Tensor:
    if latent.ndim == 5:  # [B, C, T, H, W] -> [B, C, 2, 4, 4]
        return torch.nn.functional.adaptive_avg_pool3d(latent.double(), (2, 4, 4))
    return torch.nn.functional.adaptive_avg_pool2d(latent.double(), (4, 4))  # [B, C, 4, 4]


def compute() -> dict[str, torch.Tensor]:
    """The summaries on this ComfyUI: euler, "simple", CFG with the null embedding as negative."""
    booted = host_module.boot()
    models, preview = booted.pack_module("demo.models"), booted.pack_module("demo.preview")
    out = {}
    for kind, settings in SETTINGS.items():
        model = models.load_model(kind)
        latent = preview.sample(model, kind, settings["classes"], seed=settings["seed"], steps=settings["steps"],
                                cfg=settings["cfg"])
        out[kind] = summarise(latent)
    return out


def load() -> dict[str, torch.Tensor]:
    raw = json.loads(REFERENCE_PATH.read_text())
    return {kind: torch.tensor(raw[kind]["summary"], dtype=torch.float64) for kind in SETTINGS}


def main() -> int:
    summaries = compute()
    version = host_module.comfyui_version()
    data = {"comfyui_version": version,
            **{kind: {**SETTINGS[kind], "summary": summaries[kind].round(decimals=5).tolist()} for kind in SETTINGS}}
    # One line per sample, so that a diff shows which one moved.
    text = json.dumps(data, separators=(",", ":"))
    REFERENCE_PATH.write_text(text.replace("]]],[[[", "]]],\n[[[") + "\n")
    print(f"wrote {REFERENCE_PATH} on ComfyUI {version}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
