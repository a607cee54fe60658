"""ControlNet runs: each quality level on the image reference model without a ControlNet, with a
small trained one and with a random one (``./dev bench --controlnet``).

Both are ComfyUI's FLUX ControlNet class at the reference model's width, one double and one single
block, applied with ComfyUI's ControlNetApplyAdvanced. The trained one (demo/controlnet.py, a
"tile" ControlNet: the hint is the layout of another rendered image of the class) at strength 1;
the random one (seeded weights, the test harness's ``tiny_controlnet``) at strength 0.1 with a
seeded random RGB hint. What is measured is the pack, not the ControlNet: rows of the block stack
and worst / mean PSNR against the uncached run of the same graph, 16 images, both samplers, cfg 4.
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

from . import metrics
from .configs import Config, Pair, SamplerSetting
from .levels import PAIRS, SETTINGS, run_setting
from .runner import Bench

RANDOM_STRENGTH = 0.1
LEVELS = ("high", "balanced", "fast")
CONTROLNETS = ("none", "trained", "random")


class ControlledBench(Bench):
    """The image reference model, sampled with a ControlNet on both CFG branches."""

    def __init__(self, which: str) -> None:
        super().__init__("image")
        self.which = which
        if which == "trained":
            self.controlnet = self.models_controlnet().load(self.base)
        else:
            self.controlnet = harness_host.boot().test_module("tiny_models").tiny_controlnet(self.base, seed=3)

    @staticmethod
    def models_controlnet() -> Any:
        return harness_sampling.pack("demo.controlnet")

    def hint(self, pair: Pair, samples: torch.Tensor) -> torch.Tensor:
        if self.which == "trained":
            return self.models_controlnet().hint_image(pair.class_index, 1000 + pair.seed).repeat(pair.batch, 1, 1, 1)
        return torch.rand(pair.batch, samples.shape[2] * 8, samples.shape[3] * 8, 3,
                          generator=torch.Generator().manual_seed(1000 + pair.seed))

    def sample(self, model: Any, pair: Pair, setting: SamplerSetting) -> torch.Tensor:
        positive = self.models.conditioning(self.kind, pair.class_index, pair.batch)
        negative = self.models.conditioning(self.kind, None, pair.batch)
        latent = self.models.empty_latent(self.kind, pair.batch)
        strength = 1.0 if self.which == "trained" else RANDOM_STRENGTH
        positive, negative = nodes.ControlNetApplyAdvanced().apply_controlnet(
            positive, negative, self.controlnet, self.hint(pair, latent["samples"]), strength, 0.0, 1.0)[:2]
        return nodes.common_ksampler(model, pair.seed, setting.steps, setting.cfg, setting.sampler,
                                     setting.scheduler, positive, negative, latent)[0]["samples"]


def run_controlnet(progress: Callable[[str], None]) -> dict:
    cells = []
    for which in CONTROLNETS:
        bench = Bench("image") if which == "none" else ControlledBench(which)
        for setting in SETTINGS:
            references = {pair: bench.decode(bench.sample(bench.base, pair, setting)) for pair in PAIRS["image"]}
            cell = {"controlnet": which, "setting": setting.key, "levels": {}}
            if which != "none":  # how much the ControlNet changes the image: its uncached runs against plain ones
                plain = Bench.sample
                cell["effect"] = min(p for pair, reference in references.items() for p, _ in metrics.compare(
                    reference, bench.decode(plain(bench, bench.base, pair, setting))))
            for name in LEVELS:
                model, node_id = harness_sampling.apply(bench.base.clone(), "magcache", quality=name)
                cell["levels"][name] = result = run_setting(bench, model, node_id, Config("magcache"), setting,
                                                            references)
                progress(f"{which} {setting.key} {name}: {result['rows']:.2f}x, "
                         f"{result['worst']:.2f} / {result['mean']:.2f} dB")
            cells.append(cell)
        bench.close()
    return {"random_strength": RANDOM_STRENGTH, "cells": cells}


def markdown(data: dict, command: str) -> str:
    settings = [s.key for s in SETTINGS]
    by_key = {(c["setting"], c["controlnet"]): c for c in data["cells"]}
    out = [
        "## With a ControlNet",
        "",
        f"Made by `{command}`. The image reference model without a ControlNet, with a small trained one "
        "(demo/controlnet.py, strength 1) and with a random one (strength "
        f"{data['random_strength']:g}); each against its own uncached run. Row speedup of the block stack, worst / "
        "mean PSNR (dB), 16 images, cfg 4. How much each ControlNet changes the image (worst PSNR of its "
        "uncached runs against the plain ones): "
        + ", ".join(f"{which} {by_key[(s, which)]['effect']:.1f} dB on {s.replace('-', ' ')}"
                    for which in CONTROLNETS[1:] for s in settings) + ".",
        "",
        "| level | " + " | ".join(f"{s.replace('-', ' ')}, {which}" for s in settings for which in CONTROLNETS) + " |",
        "|---|" + "---|" * (len(CONTROLNETS) * len(settings)),
    ]
    for name in LEVELS:
        row = []
        for setting in settings:
            for which in CONTROLNETS:
                r = by_key[(setting, which)]["levels"][name]
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
