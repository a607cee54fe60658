"""Compiled blocks and the cache, on the large random-weight FLUX-class model (overhead.py's).

Four configurations, interleaved per repetition (order alternating, as in overhead.py), each
ratio against the uncompiled, uncached run of the same repetition:

- uncached: the model as loaded;
- cache: ApplyMagCache that skips (overhead.py's "magcache skipping" settings);
- compiled blocks: Compile Blocks (StepCache), no cache;
- compiled blocks + cache: Compile Blocks, then the same ApplyMagCache.

Every configuration attends through ComfyUI's PyTorch attention (its ``optimized_attention_override``
patch point), what a GPU gets: on a CPU ComfyUI otherwise picks its sub-quadratic attention, which
reads the free memory inside each block, and dynamo recompiles whenever that number changes.
The first run of each compiled configuration compiles (its time is reported apart, as compile
time); the timed runs reuse the compiled code, and the dynamo frames compiled during them are
counted (0 expected).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

import comfy.ldm.modules.attention
import torch
from comfy.patcher_extension import WrappersMP
from torch._dynamo.utils import counters

from harness import sampling as harness_sampling

from .overhead import TIMER_WRAPPER_KEY, CallTimer, OverheadSpec, build_model, run_stats, timed_sampler
from .runner import PUBLISHED_VARIANT

NAMES = ["uncached", "cache", "compiled blocks", "compiled blocks + cache"]


def pytorch_attention(func: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
    return comfy.ldm.modules.attention.attention_pytorch(*args, **kwargs)


def run_compiled(spec: OverheadSpec, progress: Callable[[str], None], backend: str = "inductor") -> dict:
    progress(f"== compiled blocks ({backend}) and the cache: {spec.describe()}, PyTorch attention, "
             f"{spec.reps} interleaved repetitions")
    compile_blocks = harness_sampling.pack("nodes.compile_nodes").compile_blocks
    base = build_model(spec)
    base.model_options["transformer_options"]["optimized_attention_override"] = pytorch_attention
    sample = timed_sampler(spec)

    def make(name: str, timer: CallTimer) -> tuple[Any, str | None]:
        model = base.clone()
        model.add_wrapper_with_key(WrappersMP.DIFFUSION_MODEL, TIMER_WRAPPER_KEY, timer)
        node_id = None
        if name.endswith("cache"):
            model, node_id = harness_sampling.apply(model, "magcache", threshold=spec.skip_threshold,
                                                    max_consecutive_skips=spec.skip_k, retention_ratio=0.2,
                                                    variant=PUBLISHED_VARIANT)
        if name.startswith("compiled"):
            model = compile_blocks(model, backend)
        return model, node_id

    torch._dynamo.reset()
    timers = {name: CallTimer() for name in NAMES}
    models = {name: make(name, timers[name]) for name in NAMES}
    info: dict[str, dict] = {name: {} for name in NAMES}
    outputs: dict[str, torch.Tensor] = {}
    for name in NAMES:  # warm-up; the compiled ones compile here
        model, node_id = models[name]
        frames = counters["frames"]["total"]
        seconds, outputs[name] = sample(model)
        timers[name].take()
        info[name]["first_run_seconds"] = seconds
        info[name]["first_run_compiled_frames"] = counters["frames"]["total"] - frames
        if node_id is not None:
            info[name].update(run_stats(node_id))
        progress(f"   first run {name}: {seconds:.1f} s, {info[name]['first_run_compiled_frames']} frames compiled "
                 f"{info[name].get('summary', '')}")
    times: dict[str, list[float]] = {name: [] for name in NAMES}
    call_medians: dict[str, list[float]] = {name: [] for name in NAMES}
    frames_before = counters["frames"]["total"]
    for rep in range(spec.reps):
        for name in NAMES if rep % 2 == 0 else NAMES[::-1]:
            seconds, _ = sample(models[name][0])
            times[name].append(seconds)
            call_medians[name].append(statistics.median(timers[name].take()))
        progress(f"   rep {rep + 1}/{spec.reps}: " + ", ".join(f"{n} {times[n][-1]:.2f} s" for n in NAMES))
    timed_frames = counters["frames"]["total"] - frames_before

    def max_abs_diff(a: str, b: str) -> float:
        return float((outputs[a] - outputs[b]).abs().max())

    results = {}
    for name in NAMES:
        ratios = [a / b for a, b in zip(times["uncached"], times[name], strict=True)]  # speedups
        results[name] = {
            "seconds": times[name], "median_seconds": statistics.median(times[name]),
            "speedups": ratios, "median_speedup": statistics.median(ratios),
            "call_median_seconds": call_medians[name],
            "median_call_speedup": statistics.median(
                a / b for a, b in zip(call_medians["uncached"], call_medians[name], strict=True)),
            **info[name],
        }
    out = {
        "spec": {"hidden": spec.hidden, "depth": spec.depth, "single": spec.single, "latent_side": spec.latent_side,
                 "steps": spec.steps, "cfg": spec.cfg, "reps": spec.reps},
        "description": spec.describe() + ", PyTorch attention", "backend": backend,
        "results": results, "frames_compiled_while_timed": timed_frames,
        "max_abs_diff": {"compiled blocks vs uncached": max_abs_diff("compiled blocks", "uncached"),
                         "compiled blocks + cache vs cache": max_abs_diff("compiled blocks + cache", "cache"),
                         "output scale (max abs, uncached)": float(outputs["uncached"].abs().max())},
    }
    progress(table(out))
    return out


def table(out: dict) -> str:
    lines = [f"Compiled blocks and the cache ({out['backend']}): {out['description']}",
             "| configuration | first run (s) | frames compiled | median run (s) | speedup (median) | "
             "per model call | block stack ran |",
             "|---|---|---|---|---|---|---|"]
    for name, r in out["results"].items():
        ran = (f"{r['calls_computed']}/{r['calls_computed'] + r['calls_skipped']} calls"
               if "calls_computed" in r else "every call")
        lines.append(f"| {name} | {r['first_run_seconds']:.1f} | {r['first_run_compiled_frames']} | "
                     f"{r['median_seconds']:.2f} | {r['median_speedup']:.2f}x | {r['median_call_speedup']:.2f}x | "
                     f"{ran} |")
    diffs = out["max_abs_diff"]
    lines.append(f"frames compiled during the timed runs: {out['frames_compiled_while_timed']}; max |difference|: "
                 + ", ".join(f"{k} {v:.2e}" for k, v in diffs.items()))
    return "\n".join(lines)
