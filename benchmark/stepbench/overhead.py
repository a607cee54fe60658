"""What the pack costs when it skips nothing, on a larger random-weight FLUX-class model.

The model is built like the tests' tiny ones, by demo/model_builder.py from a checkpoint in
FLUX.1's released format (``flux_template`` below) with seeded random weights, only wide and deep
enough that the block stack dominates a step. Configurations, interleaved
per repetition (A B C D, A B C D, ...):

- A: the unpatched model;
- B: ApplyMagCache with threshold 1e-9: the cache is installed and active (stack input copied,
  residual kept on every call) but never skips; the published method (reuse, no check);
- B': the same with ApplyMagCache's defaults (damped forecast, hindsight check: every computed
  call also measures the estimator's error there);
- C: ApplyTeaCache with threshold 1e-9: the same, plus the TeaCache signal on every call;
- D: ApplyMagCache that does skip, to see how wall time tracks block evaluations when the
  blocks dominate.

Besides each run's wall time, an outermost DIFFUSION_MODEL wrapper (on every configuration,
the unpatched one included, so they all carry it) times each model call: the pack's per-call
work (the sigma lookup, the stack-input copy, the residual, TeaCache's signal) all happens
inside it, and the median over a run's calls shrugs off the load spikes that whole-run times
on a shared machine do not.

The order alternates between repetitions (A B C D, then D C B A, ...) so that a machine slowing
down or speeding up over a repetition does not favour the configurations run later in it; each
ratio is against the unpatched run of the same repetition.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import comfy.model_patcher
import nodes
import torch
from comfy.patcher_extension import WrappersMP

from harness import host as host_module
from harness import sampling as harness_sampling

from .geometry import FluxGeometry
from .report import NO_SKIP_NAMES
from .runner import PROBE_WRAPPER_KEY, PUBLISHED_VARIANT, MemoryProbe

NO_SKIP_THRESHOLD = 1e-9
TIMER_WRAPPER_KEY = "stepbench-call-timer"


class CallTimer:
    """DIFFUSION_MODEL wrapper recording the seconds of every model call (CPU: no sync needed)."""

    def __init__(self) -> None:
        self.calls: list[float] = []

    def __call__(self, executor: Any, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        out = executor(*args, **kwargs)
        self.calls.append(time.perf_counter() - start)
        return out

    def take(self) -> list[float]:
        calls, self.calls = self.calls, []
        return calls


@dataclass(frozen=True)
class OverheadSpec:
    hidden: int = 512
    depth: int = 4
    single: int = 8
    latent_side: int = 64  # latent H = W; image tokens = (side / 2) ** 2
    steps: int = 10
    cfg: float = 1.0
    reps: int = 6
    skip_threshold: float = 0.1
    skip_k: int = 3
    context_tokens: int = 8

    @property
    def image_tokens(self) -> int:
        return (self.latent_side // 2) ** 2

    def describe(self) -> str:
        return (f"random-weight Flux, hidden {self.hidden}, {self.hidden // 64} heads, depth {self.depth} double + "
                f"{self.single} single blocks, {self.image_tokens} image tokens + {self.context_tokens} text tokens, "
                f"euler {self.steps} steps, cfg {self.cfg:g}, fp32 CPU")


def flux_template(spec: OverheadSpec, builder: Any) -> Any:
    """A checkpoint in FLUX.1's format of this width and depth, with heads of 64, small text
    inputs and no guidance embedding, sampled as ``Flux`` (detection would say FluxSchnell, whose
    schedule differs)."""
    return FluxGeometry(hidden=spec.hidden, double=spec.depth, single=spec.single, head_dim=64, context_dim=64,
                        pooled_dim=32, guidance=False).template(builder)


def build_model(spec: OverheadSpec, seed: int = 0) -> comfy.model_patcher.ModelPatcher:
    builder = host_module.boot().pack_module("demo.model_builder")
    return builder.build_from_template(flux_template(spec, builder), seed)


def _conditioning(spec: OverheadSpec, seed: int) -> list:
    gen = torch.Generator().manual_seed(seed)
    context = torch.randn(1, spec.context_tokens, 64, generator=gen)
    return [[context, {"pooled_output": torch.randn(1, 32, generator=gen)}]]


def timed_sampler(spec: OverheadSpec) -> Callable[[Any], tuple[float, torch.Tensor]]:
    """A function that samples ``spec``'s run (euler, fixed conditioning) on a model: (seconds, latent)."""
    positive, negative = _conditioning(spec, 1), _conditioning(spec, 2)
    latent = {"samples": torch.zeros(1, 16, spec.latent_side, spec.latent_side)}

    def sample(model: Any) -> tuple[float, torch.Tensor]:
        gc.collect()
        start = time.perf_counter()
        out = nodes.common_ksampler(model, 0, spec.steps, spec.cfg, "euler", "simple", positive, negative,
                                    latent)[0]["samples"]
        return time.perf_counter() - start, out

    return sample


def run_stats(node_id: str) -> dict:
    """What an Apply node's last run did: calls computed and skipped, why it was off, its summary."""
    stats = harness_sampling.stats(node_id)
    return {key: stats[key] for key in ("calls_computed", "calls_skipped", "disabled_reason", "summary")}


def run_overhead(spec: OverheadSpec, progress: Callable[[str], None]) -> dict:
    progress(f"== no-skip overhead: {spec.describe()}, {spec.reps} interleaved repetitions")
    base = build_model(spec)
    sample = timed_sampler(spec)

    def make(name: str, probe: MemoryProbe | None = None, timer: CallTimer | None = None) -> tuple[Any, str | None]:
        model = base.clone()
        if timer is not None:
            model.add_wrapper_with_key(WrappersMP.DIFFUSION_MODEL, TIMER_WRAPPER_KEY, timer)
        if name == "unpatched":
            return model, None
        if probe is not None:
            model.add_wrapper_with_key(WrappersMP.PREDICT_NOISE, PROBE_WRAPPER_KEY, probe)
        # The model is FLUX.1-format but no published checkpoint: FLUX.1-dev's constants by name.
        if name == "magcache no-skip":
            return harness_sampling.apply(model, "magcache", threshold=NO_SKIP_THRESHOLD, max_consecutive_skips=2,
                                          retention_ratio=0.2, variant=PUBLISHED_VARIANT)
        if name == "magcache defaults no-skip":
            defaults = harness_sampling.schema_defaults(harness_sampling.pack("nodes.apply_nodes").ApplyMagCache)
            return harness_sampling.apply(model, "magcache", **{**defaults, "threshold": NO_SKIP_THRESHOLD,
                                                                "variant": PUBLISHED_VARIANT})
        if name == "teacache no-skip":
            return harness_sampling.apply(model, "teacache", threshold=NO_SKIP_THRESHOLD, max_consecutive_skips=3,
                                          variant=PUBLISHED_VARIANT)
        return harness_sampling.apply(model, "magcache", threshold=spec.skip_threshold,
                                      max_consecutive_skips=spec.skip_k, retention_ratio=0.2, variant=PUBLISHED_VARIANT)

    names = ["unpatched", *NO_SKIP_NAMES, "magcache skipping"]
    info: dict[str, dict] = {name: {} for name in names}
    outputs: dict[str, torch.Tensor] = {}
    # Untimed warm-up, with the memory probe on the cached ones.
    for name in names:
        probe = MemoryProbe(name.split()[0]) if name != "unpatched" else None
        model, node_id = make(name, probe)
        seconds, outputs[name] = sample(model)
        if node_id is not None:
            info[name].update(run_stats(node_id))
            info[name]["memory"] = probe.memory.as_dict()
        progress(f"   warm-up {name}: {seconds:.1f} s {info[name].get('summary', '')}")
    timers = {name: CallTimer() for name in names}
    models = {name: make(name, timer=timers[name]) for name in names}
    times: dict[str, list[float]] = {name: [] for name in names}
    call_medians: dict[str, list[float]] = {name: [] for name in names}
    for rep in range(spec.reps):
        for name in names if rep % 2 == 0 else names[::-1]:
            model, node_id = models[name]
            seconds, _ = sample(model)
            times[name].append(seconds)
            call_medians[name].append(statistics.median(timers[name].take()))
            if node_id is not None and name.endswith("no-skip"):
                stats = harness_sampling.stats(node_id)
                if stats["calls_skipped"] or stats["disabled_reason"]:
                    raise RuntimeError(f"{name} was meant to be active and skip nothing: {stats['summary']}")
        progress(f"   rep {rep + 1}/{spec.reps}: " + ", ".join(f"{n} {times[n][-1]:.2f} s" for n in names))
    results = {}
    for name in names:
        ratios = [b / a for a, b in zip(times["unpatched"], times[name], strict=True)]
        entry = {"seconds": times[name], "ratios": ratios, "median_ratio": statistics.median(ratios),
                 "mean_ratio": statistics.fmean(ratios),
                 "stderr_ratio": statistics.stdev(ratios) / len(ratios) ** 0.5 if len(ratios) > 1 else None,
                 "median_seconds": statistics.median(times[name]), "call_median_seconds": call_medians[name],
                 "call_ratios": [b / a for a, b in zip(call_medians["unpatched"], call_medians[name], strict=True)],
                 **info[name]}
        entry["median_call_ratio"] = statistics.median(entry["call_ratios"])
        if name != "unpatched":
            entry["identical_to_unpatched"] = bool(torch.equal(outputs[name], outputs["unpatched"]))
        if "calls_computed" in info[name]:
            total = info[name]["calls_computed"] + info[name]["calls_skipped"]
            entry["block_speedup"] = total / max(info[name]["calls_computed"], 1)
        results[name] = entry
    for name in names[1:]:
        r = results[name]
        progress(f"   {name}: wall ratio {r['median_ratio']:.4f} (median of {len(r['ratios'])}; "
                 f"min {min(r['ratios']):.4f} max {max(r['ratios']):.4f}); per-call median ratio "
                 f"{r['median_call_ratio']:.4f}")
    return {"spec": asdict(spec), "description": spec.describe(), "image_tokens": spec.image_tokens,
            "results": results}
