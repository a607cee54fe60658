"""The headline table: each quality level on both reference models and both samplers, beside the
fastest setting of ComfyUI's native EasyCache and LazyCache that holds the same worst case.

Quality-only (rows of the block stack, deterministic; valid on a busy machine). The levels run as
a user gets them: Apply MagCache with nothing but ``quality`` set (``variant: auto``, no table, no
calibration). Evaluation: the image model on classes 0-3 x seeds 0-3 (16 images), the video model
on classes 0-3 x seeds 0-1 (8 clips), cfg 4; worst and mean PSNR of the decoded output against
uncached.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import pathlib
import re
from collections.abc import Callable, Iterator
from typing import Any

from harness import sampling as harness_sampling

from . import metrics
from .configs import Config, Pair, SamplerSetting
from .runner import Bench

SETTINGS = (SamplerSetting("euler", 30, 4.0), SamplerSetting("dpmpp_2m", 20, 4.0))
# The levels were chosen on two sets: the headline set (the README's figures) and a second set of
# other classes and seeds (--second-set). Each level is the fastest setting whose worst case held its
# promise on both (docs/experiments.md section 18).
PAIRS = {"image": [Pair(c, s) for c in range(4) for s in range(4)],
         "video": [Pair(c, s) for c in range(4) for s in range(2)]}
SECOND_SET = {"image": [Pair(c, s) for c in range(4, 10) for s in (10, 11)],
              "video": [Pair(c, s) for c in range(4, 8) for s in (10, 11)]}
# Held out (--held-out), looked at only after the levels were chosen: every class, seeds neither set has.
HELD_OUT = {"image": [Pair(c, s) for c in range(10) for s in (30, 31)],
            "video": [Pair(c, 30) for c in range(8)]}
SETS = {"headline": PAIRS, "second": SECOND_SET, "held-out": HELD_OUT}
HEADINGS = {"headline": " (the headline)", "second": " on the second set they were chosen on",
            "held-out": " on held-out images and clips"}
NATIVE_THRESHOLDS = (0.02, 0.05, 0.08, 0.12, 0.2, 0.3, 0.5)
START, END = "<!-- levels:start -->", "<!-- levels:end -->"


def describe_pairs(pairs: dict[str, list[Pair]], kinds: tuple[str, ...] = ("image", "video")) -> str:
    def span(values: set[int]) -> str:
        return f"{min(values)}-{max(values)}" if len(values) > 1 else str(min(values))

    parts = []
    for kind, noun in (("image", "images"), ("video", "clips")):
        if kind not in kinds:
            continue
        classes, seeds = {p.class_index for p in pairs[kind]}, {p.seed for p in pairs[kind]}
        seed_word = "seeds" if len(seeds) > 1 else "seed"
        parts.append(f"{kind} model: {len(pairs[kind])} {noun} (classes {span(classes)} x {seed_word} {span(seeds)})")
    return ", ".join(parts)


def run_setting(bench: Bench, model: Any, node_id: str | None, config: Config, setting: SamplerSetting,
            references: dict) -> dict:
    """Rows speedup, worst and mean PSNR, and the first pair's skip pattern, over the pairs."""
    psnrs: list[float] = []
    rows_total = rows_computed = 0
    pattern = None
    for pair, reference in references.items():
        latent = bench.sample(model, pair, setting)
        counts = bench.skip_counts(config, node_id, setting, pair)
        rows_total += counts["rows_total"]
        rows_computed += counts["rows_total"] - counts["rows_skipped"] + counts["rows_checked"] * counts["head_cost"]
        if pattern is None:
            pattern = counts.get("patterns", {}).get("cond")
        psnrs += [p for p, _ in metrics.compare(reference, bench.decode(latent))]
    return {"rows": rows_total / rows_computed, "worst": min(psnrs), "mean": metrics.finite_mean(psnrs),
            "pattern": pattern}


# --context-windows: the video model sampled in ComfyUI's Context Windows (standard_static), two
# windows over its 8 latent frames; the references are the uncached windowed runs.
WINDOWS = dict(context_length=5, context_overlap=2, dim=2, context_schedule="standard_static")


@contextlib.contextmanager
def cached_in_output_space(model: Any) -> Iterator[str]:
    """While open, the pack caches ``model``'s class as it caches the families without block hooks
    (families/output_space.py: Z-Image, HiDream, Kandinsky 5, Cosmos, ...): the whole model call is
    the stack, its residual is output minus input. Yields the stand-in family's name."""
    families = harness_sampling.pack("families")
    output_space = harness_sampling.pack("families.output_space")
    model_class = type(model.model).__name__
    name = f"{model_class.lower()} in output space"
    stand_in = output_space.OutputSpaceFamily(
        name=name, model_classes=(model_class,), variants=(harness_sampling.pack("families.base").Variant(name),))
    by_class = families._BY_CLASS  # the registry family_for reads; restored on exit
    own = by_class[model_class]
    by_class[model_class] = stand_in
    try:
        yield name
    finally:
        by_class[model_class] = own


def sampler_settings(cfg: float | None = None, steps: int | None = None,
                     scheduler: str | None = None) -> list[SamplerSetting]:
    """The levels table's sampler settings, with what is given in place of their own."""
    changes = {"cfg": cfg, "steps": steps, "scheduler": scheduler}
    return [dataclasses.replace(setting, **{key: value for key, value in changes.items() if value is not None})
            for setting in SETTINGS]


def run_levels(kinds: list[str], samplers: list[str] | None, progress: Callable[[str], None],
               pair_set: str = "headline", context_windows: bool = False, cfg: float | None = None,
               weights: dict[str, pathlib.Path] | None = None, steps: int | None = None,
               scheduler: str | None = None, output_space: bool = False) -> dict:
    """``cfg``: another guidance scale than the settings' own (cfg 4, where the levels were chosen).
    ``weights``: by kind, another trained model than the reference one (the levels were not chosen on it).
    ``steps``, ``scheduler``: another step count (every sampler) or ComfyUI scheduler than the settings' own.
    ``output_space``: the models cached as the families without block hooks are (``cached_in_output_space``);
    the native caches are left out there (they cache in output space anyway: the headline table has them)."""
    weights = weights or {}
    levels = harness_sampling.pack("cache_core.quality").LEVELS
    pairs = SETS[pair_set]
    settings = sampler_settings(cfg, steps, scheduler)
    if context_windows:
        kinds = [kind for kind in kinds if kind == "video"]
    out: dict = {"levels": {name: level.worst_db for name, level in levels.items()}, "cells": [],
                 "pairs": describe_pairs(pairs, tuple(kinds)), "set": pair_set, "context_windows": context_windows,
                 "cfg": settings[0].cfg, "scheduler": settings[0].scheduler, "output_space": output_space,
                 "weights": {kind: str(path) for kind, path in weights.items()}}
    for kind in kinds:
        bench = Bench(kind, weights.get(kind))
        with cached_in_output_space(bench.base) if output_space else contextlib.nullcontext():
            _run_kind(bench, kind, levels, pairs[kind], settings, samplers, progress, context_windows,
                      output_space, out["cells"])
        bench.close()
    return out


def _run_kind(bench: Bench, kind: str, levels: dict, pairs: list[Pair], settings: list[SamplerSetting],
              samplers: list[str] | None, progress: Callable[[str], None], context_windows: bool,
              output_space: bool, cells: list[dict]) -> None:
    """One model's cells: every level, and the native caches at every threshold, per sampler setting."""
    base = bench.base
    if context_windows:
        from comfy_extras.nodes_context_windows import ContextWindowsManualNode

        base = harness_sampling.execute_node(ContextWindowsManualNode, model=base, **WINDOWS)[0]
    for setting in settings:
        if samplers and setting.sampler not in samplers:
            continue
        references = {pair: bench.decode(bench.sample(base, pair, setting)) for pair in pairs}
        cell: dict = {"kind": kind, "setting": setting.key, "levels": {}, "native": {}}
        for name in levels:
            model, node_id = harness_sampling.apply(base.clone(), "magcache", quality=name)
            result = run_setting(bench, model, node_id, Config("magcache"), setting, references)
            cell["levels"][name] = result
            progress(f"{kind} {setting.key} {name}: {result['rows']:.2f}x, {result['worst']:.2f} / "
                     f"{result['mean']:.2f} dB")
        for method in ("easycache", "lazycache"):
            cell["native"][method] = []
            if context_windows or output_space:
                continue  # the pack's levels only: each window cached on its own; natives as in the headline
            for threshold in NATIVE_THRESHOLDS:
                config = Config(method, threshold=threshold)
                model, _ = bench.build(config, {})
                result = {"threshold": threshold, **run_setting(bench, model, None, config, setting, references)}
                cell["native"][method].append(result)
                progress(f"{kind} {setting.key} {method} {threshold}: {result['rows']:.2f}x, "
                         f"{result['worst']:.2f} dB")
        cells.append(cell)


def best_native(results: list[dict], worst_db: float) -> dict | None:
    """The fastest native setting whose worst case holds ``worst_db``."""
    held = [r for r in results if r["worst"] >= worst_db and r["rows"] > 1.0]
    return max(held, key=lambda r: r["rows"]) if held else None


def markdown(data: dict, command: str) -> str:
    cells = data["cells"]
    names = [f"{c['kind']}, {c['setting'].replace('-', ' ')}" for c in cells]
    windows = data.get("context_windows", False)
    output_space = data.get("output_space", False)
    levels_only = windows or output_space  # no native rows
    evaluated = data.get("pairs", describe_pairs(PAIRS))
    if windows:
        evaluated += (" in ComfyUI's Context Windows (length 5, overlap 2, standard_static: two windows), "
                      "against the uncached windowed runs")
    if output_space:
        evaluated += (", cached in output space as the families without block hooks are (Z-Image, HiDream, "
                      "Kandinsky 5, ...: the whole model call is skipped, its residual is output minus input)")
    native = ("" if levels_only else " Native: the fastest reuse_threshold of "
              f"{list(NATIVE_THRESHOLDS)} whose worst case holds the level's promise (- where none does).")
    heading = " in context windows" if windows else HEADINGS[data.get("set", "headline")]
    if output_space:
        heading = " in output space" + ("" if data.get("set", "headline") == "headline" else heading)
    if data.get("weights"):
        heading = " on another trained model" + ("" if data.get("set", "headline") == "headline" else heading)
        evaluated += "; models: " + ", ".join(f"{kind} `{pathlib.Path(path).name}`"
                                               for kind, path in data["weights"].items())
    out = [
        "## Quality levels" + heading,
        "",
        f"Made by `{command}`. Row speedup of the {'model calls' if output_space else 'block stack'}, worst / mean "
        "PSNR (dB) against uncached; "
        f"{evaluated}, cfg {data.get('cfg', SETTINGS[0].cfg):g}, scheduler {data.get('scheduler', 'simple')}. "
        "The pack: Apply MagCache with only `quality` set "
        "(`variant: auto`, no table, no calibration)." + native,
        "",
        "| level (promise) | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(cells),
    ]
    for name, promise in data["levels"].items():
        row = []
        for cell in cells:
            r = cell["levels"][name]
            mark = "" if r["worst"] >= promise else " (**missed**)"
            row.append(f"{r['rows']:.2f}x, {r['worst']:.2f} / {r['mean']:.2f}{mark}")
        out.append(f"| **{name}** (>= {promise:g} dB) | " + " | ".join(row) + " |")
        for method, label in (("easycache", "EasyCache"), ("lazycache", "LazyCache")):
            if levels_only:
                break
            row = []
            for cell in cells:
                best = best_native(cell["native"][method], promise)
                row.append("-" if best is None else
                           f"{best['rows']:.2f}x, {best['worst']:.2f} / {best['mean']:.2f} (thr {best['threshold']:g})")
            out.append(f"| {label} at >= {promise:g} dB | " + " | ".join(row) + " |")
    out += ["", "Skip patterns of the first image or clip (C computed, S skipped):", ""]
    for cell, label in zip(cells, names, strict=True):
        patterns = ", ".join(f"{name} `{r['pattern']}`" for name, r in cell["levels"].items())
        out.append(f"- {label}: {patterns}")
    return "\n".join(out) + "\n"


def write(data: dict, command: str, out_dir: pathlib.Path, docs: pathlib.Path | None) -> str:
    text = markdown(data, command)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "levels.json").write_text(json.dumps(data, indent=1))
    (out_dir / "levels.md").write_text(text)
    if docs is not None:
        current = docs.read_text() if docs.exists() else ""
        block = f"{START}\n{text}{END}"
        if START in current:
            current = re.sub(re.escape(START) + ".*?" + re.escape(END), lambda _: block, current, flags=re.S)
        else:
            current = block + "\n\n" + current
        docs.write_text(current)
    return text
