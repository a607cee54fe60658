"""The prepared GPU check: ``./dev bench --gpu``, one large GPU, a few minutes (CI never runs it).

Real-size geometry with random weights in bf16: FLUX.1-dev (a 1024x1024 image) and Wan 2.1 14B
(832x480, 17 frames), euler, cfg 1 (one model call per step). Random weights make the cache skip
whatever it is allowed to, so the skip patterns are forced through the public inputs: Apply
MagCache with reuse, no check and the largest threshold skips every step that
``max_consecutive_skips`` allows after the retained head. Per model, configurations interleaved
(order alternating per repetition, as in overhead.py):

- wall time against rows: K 1, 2, 3 forced; each run's speedup beside its rows speedup (calls of
  the block stack uncached / cached). The blocks dominate a large model's step, so wall time
  should follow rows within a few percent;
- the cost per model call when nothing is skipped: the published method and the measured-error
  rule (which also measures the estimator's error at every computed call), each at a tolerance
  that never skips, against the unpatched model; the median over each run's calls, timed between
  CUDA synchronisations;
- Compile Blocks (StepCache), alone and with the cache at K 2 (FLUX.1 only: inductor compiles);
- what the cache holds between calls (the MemoryProbe), beside the size of one residual, and the
  peak GPU memory of each configuration;
- two references for where a skipped step's time goes: every block replaced by identity through
  ComfyUI's own ``patches_replace`` (what the model costs outside its block stack), and each run's
  time outside its model calls (the sampler's own work), from which the model calls' own speedup.

On a GPU machine without network or ComfyUI, scripts/gpu-bundle.sh and scripts/gpu-check.sh run it.

``--gpu-geometry tiny`` runs the same on CPU at test size with the eager backend
(tests/test_gpu_check.py), so the plumbing is checked where there is no GPU.
"""

from __future__ import annotations

import gc
import json
import pathlib
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import comfy.model_management
import comfy.model_patcher
import nodes
import torch
from comfy.patcher_extension import WrappersMP

from harness import host as host_module
from harness import sampling as harness_sampling

from .geometry import FLUX1_DEV, WAN21_14B, FluxGeometry, WanGeometry
from .overhead import TIMER_WRAPPER_KEY
from .runner import PROBE_WRAPPER_KEY, PUBLISHED_VARIANTS, MemoryProbe

NEVER_SKIPS = 1e-9
IDENTITY = "every block replaced by identity"  # the floor of a skipped call
FORCES_SKIPS = 2.0  # ApplyMagCache's largest threshold: every skip K allows is taken on random weights


@dataclass(frozen=True)
class GpuCase:
    name: str
    kind: str  # "image" or "video": which published variant names the constants
    geometry: FluxGeometry | WanGeometry
    latent: tuple[int, ...]
    context_tokens: int
    steps: int
    compile: bool

    def describe(self) -> str:
        return (f"{self.geometry.describe()}, latent {'x'.join(map(str, self.latent))}, "
                f"{self.context_tokens} text tokens, euler {self.steps} steps, cfg 1")


REAL = [
    GpuCase("FLUX.1-dev", "image", FLUX1_DEV, (1, 16, 128, 128), 512, 20, compile=True),
    GpuCase("Wan 2.1 14B", "video", WAN21_14B, (1, 16, 5, 60, 104), 512, 12, compile=False),
]
TINY = [
    GpuCase("tiny FLUX.1", "image", FluxGeometry(hidden=256, double=1, single=2, context_dim=64, pooled_dim=32),
            (1, 16, 16, 16), 8, 12, compile=True),
    GpuCase("tiny Wan 2.1", "video", WanGeometry(dim=256, ffn=512, layers=2), (1, 16, 2, 8, 8), 8, 12, compile=False),
]
GEOMETRIES = {"real": REAL, "tiny": TINY}


class SyncedCallTimer:
    """DIFFUSION_MODEL wrapper: the seconds of each model call, between device synchronisations
    (the benchmark's, outside the pack: the pack's own work stays inside the timed span)."""

    def __init__(self, device: torch.device) -> None:
        self.sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        self.calls: list[float] = []

    def __call__(self, executor: Any, *args: Any, **kwargs: Any) -> Any:
        self.sync()
        start = time.perf_counter()
        out = executor(*args, **kwargs)
        self.sync()
        self.calls.append(time.perf_counter() - start)
        return out

    def take(self) -> list[float]:
        calls, self.calls = self.calls, []
        return calls


def random_model(case: GpuCase, dtype: torch.dtype, seed: int = 0) -> comfy.model_patcher.ModelPatcher:
    """The case's model with seeded random weights in ``dtype``, built without a checkpoint in
    memory: the model is made from the template's shapes (detection reads meta tensors), then each
    weight is filled in place from one random pool, scaled like demo/model_builder.py's weights.
    Cycling a pool is fine for timing and keeps a 12-14B model's set-up to seconds."""
    builder = host_module.boot().pack_module("demo.model_builder")
    template = case.geometry.template(builder)
    meta = {k: torch.empty(shape, device="meta") for k, shape in template.shapes.items()}
    config = builder.model_config(meta, template.overlay, template.config_class)
    config.set_inference_dtype(dtype, None)
    model = config.get_model({}, "")
    pool = torch.randn(1 << 20, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        for index, (name, weight) in enumerate(model.diffusion_model.named_parameters()):
            if weight.ndim < 2 and "norm" in name and name.endswith(("weight", "scale")):
                weight.fill_(1.0)
                continue
            scale = weight[0].numel() ** -0.5 if weight.ndim >= 2 else 0.02
            values = pool.roll(-(index * 7919) % pool.numel()) * scale
            flat = weight.view(-1)
            for offset in range(0, flat.numel(), pool.numel()):
                chunk = flat[offset:offset + pool.numel()]
                chunk.copy_(values[:chunk.numel()])
    model.eval()
    return comfy.model_patcher.ModelPatcher(model, load_device=comfy.model_management.get_torch_device(),
                                            offload_device=torch.device("cpu"))


def _conditioning(case: GpuCase, seed: int) -> list:
    gen = torch.Generator().manual_seed(seed)
    context_dim = case.geometry.context_dim if isinstance(case.geometry, FluxGeometry) else 4096
    extra = {"pooled_output": torch.randn(1, case.geometry.pooled_dim, generator=gen)} \
        if isinstance(case.geometry, FluxGeometry) else {}
    return [[torch.randn(1, case.context_tokens, context_dim, generator=gen), extra]]


def _identity_block(args: dict, extra: dict) -> dict:
    return harness_sampling.pack("nodes.runtime").passthrough(args)  # what a skipped block returns


def identity_blocks(model: Any) -> tuple[Any, None]:
    """Every block of the stack replaced by one that returns its input, through ComfyUI's own
    ``patches_replace``: what a model call costs outside its block stack, the floor of a skipped call."""
    family = harness_sampling.pack("families").family_for(model.model)
    for kind, index in family.block_keys(model.model.diffusion_model):
        model.set_model_patch_replace(_identity_block, "dit", kind, index)
    return model, None


def configurations(case: GpuCase, backend: str) -> dict[str, Callable[[Any], tuple[Any, str | None]]]:
    """name -> how to make that configuration from a clone of the model."""
    variant = PUBLISHED_VARIANTS[case.kind]
    compile_blocks = harness_sampling.pack("nodes.compile_nodes").compile_blocks

    def forced(k: int) -> Callable[[Any], tuple[Any, str | None]]:
        return lambda m: harness_sampling.apply(m, "magcache", quality="custom", threshold=FORCES_SKIPS,
                                                max_consecutive_skips=k, retention_ratio=0.2, variant=variant)

    made: dict[str, Callable[[Any], tuple[Any, str | None]]] = {
        "unpatched": lambda m: (m, None),
        "no-skip, published method": lambda m: harness_sampling.apply(
            m, "magcache", quality="custom", threshold=NEVER_SKIPS, variant=variant),
        "no-skip, measured rule": lambda m: harness_sampling.apply(
            m, "magcache", quality="custom", skip_rule="measured", threshold=NEVER_SKIPS,
            estimator="damped_forecast", variant=variant),
        **{f"K {k} forced": forced(k) for k in (1, 2, 3)},
        IDENTITY: identity_blocks,
    }
    if case.compile:
        made["compiled blocks"] = lambda m: (compile_blocks(m, backend), None)
        made["compiled blocks + K 2 forced"] = lambda m: (lambda pm: (compile_blocks(pm[0], backend), pm[1]))(
            forced(2)(m))
    return made


def run_case(case: GpuCase, dtype: torch.dtype, reps: int, backend: str, progress: Callable[[str], None]) -> dict:
    device = comfy.model_management.get_torch_device()
    progress(f"== {case.name}: {case.describe()}, {dtype}, {device}, {reps} interleaved repetitions")
    started = time.perf_counter()
    base = random_model(case, dtype)
    progress(f"   built in {time.perf_counter() - started:.1f} s")
    positive, negative = _conditioning(case, 1), _conditioning(case, 2)
    latent = {"samples": torch.zeros(case.latent)}

    def sample(model: Any) -> float:
        gc.collect()
        start = time.perf_counter()
        nodes.common_ksampler(model, 0, case.steps, 1.0, "euler", "simple", positive, negative, latent)
        return time.perf_counter() - start  # the samples come back to the CPU: the run has finished

    makers = configurations(case, backend)
    names = list(makers)
    timers = {name: SyncedCallTimer(device) for name in names}
    models: dict[str, tuple[Any, str | None]] = {}
    info: dict[str, dict] = {name: {} for name in names}
    for name in names:  # untimed first run: loads, compiles, and reads what the cache holds
        clone = base.clone()
        clone.add_wrapper_with_key(WrappersMP.DIFFUSION_MODEL, TIMER_WRAPPER_KEY, timers[name])
        probe = MemoryProbe("magcache")
        if name != "unpatched":
            clone.add_wrapper_with_key(WrappersMP.PREDICT_NOISE, PROBE_WRAPPER_KEY, probe)
        models[name] = makers[name](clone)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        seconds = sample(models[name][0])
        if device.type == "cuda":
            info[name]["peak_gpu_bytes"] = torch.cuda.max_memory_allocated(device)
        timers[name].take()
        info[name]["first_run_seconds"] = seconds
        node_id = models[name][1]
        if node_id is not None:
            stats = harness_sampling.stats(node_id)
            info[name].update(calls_computed=stats["calls_computed"], calls_skipped=stats["calls_skipped"],
                              summary=stats["summary"], held_bytes=probe.memory.held,
                              residual_bytes=probe.memory.residual_per_branch)
        progress(f"   first run {name}: {seconds:.1f} s {info[name].get('summary', '')}")
    times: dict[str, list[float]] = {name: [] for name in names}
    call_medians: dict[str, list[float]] = {name: [] for name in names}
    fast_calls: dict[str, list[float]] = {name: [] for name in names}  # the skipped calls (the fastest ones)
    outside_calls: dict[str, list[float]] = {name: [] for name in names}  # the run's time outside model calls
    for rep in range(reps):
        for name in names if rep % 2 == 0 else names[::-1]:
            times[name].append(sample(models[name][0]))
            calls = timers[name].take()
            call_medians[name].append(statistics.median(calls))
            outside_calls[name].append(times[name][-1] - sum(calls))
            skipped = len(calls) if name == IDENTITY else info[name].get("calls_skipped", 0)
            if skipped:
                fast_calls[name].extend(sorted(calls)[:skipped])
        progress(f"   rep {rep + 1}/{reps}: " + ", ".join(f"{n} {times[n][-1]:.2f} s" for n in names))
    results = {}
    for name in names:
        speedups = [a / b for a, b in zip(times["unpatched"], times[name], strict=True)]
        call_ratios = [b / a for a, b in zip(call_medians["unpatched"], call_medians[name], strict=True)]
        entry = {"seconds": times[name], "median_speedup": statistics.median(speedups),
                 "median_call_ratio": statistics.median(call_ratios),
                 "median_call_seconds": statistics.median(call_medians[name]),
                 "outside_calls_seconds": statistics.median(outside_calls[name]), **info[name]}
        if fast_calls[name]:
            entry["skipped_call_seconds"] = statistics.median(fast_calls[name])
        if info[name].get("calls_computed"):
            entry["rows_speedup"] = (info[name]["calls_computed"] + info[name]["calls_skipped"]) / info[name][
                "calls_computed"]
            entry["wall_over_rows"] = entry["median_speedup"] / entry["rows_speedup"]
        results[name] = entry
    del models, base
    comfy.model_management.unload_all_models()
    gc.collect()
    comfy.model_management.soft_empty_cache()
    return {"case": case.name, "description": case.describe(), "dtype": str(dtype), "device": str(device),
            "results": results}


def table(out: dict) -> str:
    lines = [f"{out['case']}: {out['description']}, {out['dtype']} on {out['device']}", "",
             "| configuration | block stack ran | rows speedup | wall speedup (median) | wall / rows | "
             "model calls speedup | per model call vs unpatched | a skipped call | run outside model calls | "
             "held between calls | peak GPU memory |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    unpatched = out["results"]["unpatched"]
    unpatched_calls = statistics.median(unpatched["seconds"]) - unpatched["outside_calls_seconds"]
    for name, r in out["results"].items():
        # The time in model calls alone: the sampler's own work around them (set-up, noise, the
        # steps' arithmetic) does not shrink with rows, so it is taken out here to show the calls'.
        calls_speedup = unpatched_calls / (statistics.median(r["seconds"]) - r["outside_calls_seconds"])
        ran = (f"{r['calls_computed']}/{r['calls_computed'] + r['calls_skipped']}" if "calls_computed" in r
               else "every call")
        rows = f"{r['rows_speedup']:.2f}x" if "rows_speedup" in r else "-"
        ratio = f"{r['wall_over_rows']:.3f}" if "wall_over_rows" in r else "-"
        held = f"{r['held_bytes'] / 2**20:.1f} MiB" if "held_bytes" in r else "-"
        peak = f"{r['peak_gpu_bytes'] / 2**30:.2f} GiB" if "peak_gpu_bytes" in r else "-"
        skipped = f"{r['skipped_call_seconds'] * 1e3:.2f} ms" if "skipped_call_seconds" in r else "-"
        lines.append(f"| {name} | {ran} | {rows} | {r['median_speedup']:.3f}x | {ratio} | {calls_speedup:.3f}x | "
                     f"{r['median_call_ratio']:.4f} | {skipped} | {r['outside_calls_seconds'] * 1e3:.0f} ms | "
                     f"{held} | {peak} |")
    return "\n".join(lines)


def run_gpu_check(geometry: str, reps: int, out_dir: pathlib.Path, progress: Callable[[str], None]) -> list[dict]:
    """Runs every case of ``geometry`` ("real" or "tiny"); writes gpu.md and gpu.json to ``out_dir``."""
    cuda = torch.cuda.is_available() and comfy.model_management.get_torch_device().type == "cuda"
    if geometry == "real" and not cuda:
        raise SystemExit("./dev bench --gpu needs a CUDA GPU (about 60 GiB free for Wan 2.1 14B in bf16); "
                         "--gpu-geometry tiny runs the same check on CPU at test size")
    dtype = torch.bfloat16 if cuda else torch.float32
    backend = "inductor" if cuda else "eager"
    out_dir.mkdir(parents=True, exist_ok=True)
    outs = []
    for case in GEOMETRIES[geometry]:  # written after each case: a run cut short keeps what it measured
        outs.append(run_case(case, dtype, reps, backend, progress))
        (out_dir / "gpu.json").write_text(json.dumps(outs, indent=1))
        (out_dir / "gpu.md").write_text("\n\n".join(table(o) for o in outs) + "\n")
        progress(table(outs[-1]))
    return outs
