"""ControlNet runs: each quality level on the image reference model with and without a small fixed
ControlNet (``./dev bench --controlnet``).

The ControlNet is ComfyUI's FLUX ControlNet class at the reference model's width, one double and
one single block, seeded random weights (the test harness's ``tiny_controlnet``), applied with
ComfyUI's ControlNetApplyAdvanced at strength 0.1 to a seeded random RGB hint per image. What is
measured is the pack, not the ControlNet: rows of the block stack and worst / mean PSNR against the
uncached run of the same graph (controlled against controlled, plain against plain), 16 images,
both samplers, cfg 4.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Callable
from typing import Any

import nodes
import torch

from harness import host as harness_host
from harness import sampling as harness_sampling

from .configs import Config, Pair, SamplerSetting
from .levels import PAIRS, SETTINGS, run_setting
from .runner import Bench

STRENGTH = 0.1
LEVELS = ("high", "balanced", "fast")


class ControlledBench(Bench):
    """The image reference model, sampled with the ControlNet on both CFG branches."""

    def __init__(self) -> None:
        super().__init__("image")
        self.controlnet = harness_host.boot().test_module("tiny_models").tiny_controlnet(self.base, seed=3)

    def sample(self, model: Any, pair: Pair, setting: SamplerSetting) -> torch.Tensor:
        positive = self.models.conditioning(self.kind, pair.class_index, pair.batch)
        negative = self.models.conditioning(self.kind, None, pair.batch)
        latent = self.models.empty_latent(self.kind, pair.batch)
        samples = latent["samples"]
        hint = torch.rand(pair.batch, samples.shape[2] * 8, samples.shape[3] * 8, 3,
                          generator=torch.Generator().manual_seed(1000 + pair.seed))
        positive, negative = nodes.ControlNetApplyAdvanced().apply_controlnet(
            positive, negative, self.controlnet, hint, STRENGTH, 0.0, 1.0)[:2]
        return nodes.common_ksampler(model, pair.seed, setting.steps, setting.cfg, setting.sampler,
                                     setting.scheduler, positive, negative, latent)[0]["samples"]


def run_controlnet(progress: Callable[[str], None]) -> dict:
    cells = []
    for controlled in (False, True):
        bench = ControlledBench() if controlled else Bench("image")
        for setting in SETTINGS:
            references = {pair: bench.decode(bench.sample(bench.base, pair, setting)) for pair in PAIRS["image"]}
            cell = {"controlled": controlled, "setting": setting.key, "levels": {}}
            for name in LEVELS:
                model, node_id = harness_sampling.apply(bench.base.clone(), "magcache", quality=name)
                cell["levels"][name] = result = run_setting(bench, model, node_id, Config("magcache"), setting,
                                                            references)
                progress(f"{'controlled' if controlled else 'plain'} {setting.key} {name}: {result['rows']:.2f}x, "
                         f"{result['worst']:.2f} / {result['mean']:.2f} dB")
            cells.append(cell)
        bench.close()
    return {"strength": STRENGTH, "cells": cells}


def markdown(data: dict, command: str) -> str:
    settings = [s.key for s in SETTINGS]
    out = [
        "## ControlNet",
        "",
        f"Made by `{command}`. The image reference model with a small fixed ControlNet (ComfyUI's FLUX "
        f"ControlNet class, strength {data['strength']:g}) and without; each against its own uncached run. "
        "Row speedup of the block stack, worst / mean PSNR (dB), 16 images, cfg 4.",
        "",
        "| level | " + " | ".join(f"{s.replace('-', ' ')}, {kind}" for s in settings
                                  for kind in ("plain", "ControlNet")) + " |",
        "|---|" + "---|" * (2 * len(settings)),
    ]
    by_key = {(c["setting"], c["controlled"]): c for c in data["cells"]}
    for name in LEVELS:
        row = []
        for setting in settings:
            for controlled in (False, True):
                r = by_key[(setting, controlled)]["levels"][name]
                row.append(f"{r['rows']:.2f}x, identical" if r["worst"] == float("inf") else
                           f"{r['rows']:.2f}x, {r['worst']:.2f} / {r['mean']:.2f}")
        out.append(f"| {name} | " + " | ".join(row) + " |")
    return "\n".join(out) + "\n"


def write(data: dict, command: str, out_dir: pathlib.Path) -> str:
    text = markdown(data, command)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "controlnet.json").write_text(json.dumps(data, indent=1))
    (out_dir / "controlnet.md").write_text(text)
    return text
