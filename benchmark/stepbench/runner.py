"""The sweep on the reference image model: sampling, configurations, timing, stats and memory probes.

Everything runs through ComfyUI's own KSampler (``nodes.common_ksampler``) on the model
``demo.models.load_model("image")`` builds; the pack's nodes run as ComfyUI runs them
(``harness.sampling.apply``), the native EasyCache/LazyCache nodes through their own V3 classes.
"""

from __future__ import annotations

import gc
import logging
import re
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import nodes
import torch
from comfy.patcher_extension import WrappersMP

from harness import host as host_module
from harness import sampling as harness_sampling

from . import metrics
from .configs import Config, Pair, Plan, SamplerSetting

KIND = "image"
COPY_WRAPPER_KEY = "stepbench-bf16-cast-copy"
PROBE_WRAPPER_KEY = "stepbench-memory-probe"
# The "published" rows: the FLUX.1 tables, which the pack gives the reference model only by name.
PUBLISHED_VARIANT = "flux.1-dev"
NATIVE_START, NATIVE_END = 0.15, 0.95  # the native nodes' defaults
LOGGER = logging.getLogger("stepbench")


def pack(dotted: str) -> Any:
    return host_module.boot().pack_module(dotted)


# --- native nodes: the log line, the bf16-cast copy ------------------------------------------

class NativeLog(logging.Handler):
    """Catches the native nodes' per-run line "EasyCache - skipped N/M steps (...)"."""

    PATTERN = re.compile(r"(EasyCache|LazyCache) - skipped (\d+)/(\d+) steps")

    def __init__(self) -> None:
        super().__init__(level=logging.INFO)
        self.last: tuple[str, int, int] | None = None

    def emit(self, record: logging.LogRecord) -> None:
        match = self.PATTERN.search(record.getMessage())
        if match:
            self.last = (match[1], int(match[2]), int(match[3]))

    def take(self) -> tuple[str, int, int]:
        last, self.last = self.last, None
        if last is None:
            raise RuntimeError("the native node logged no 'skipped N/M steps' line for this run")
        return last


def copy_input_wrapper(executor: Any, *args: Any, **kwargs: Any) -> Any:
    """DIFFUSION_MODEL wrapper, outermost: hands the model a copy of its input, as the bf16 cast
    in ``BaseModel._apply_model`` does on a bf16 GPU run. EasyCache adds its cached difference
    into that input in place (``x += diff``); on an fp32 CPU host the input is the very tensor
    the sampler then uses as ``model_input`` in ``calculate_denoised``, so without this copy the
    native node's output is wrong in a way no GPU user sees."""
    return executor(args[0].clone(), *args[1:], **kwargs)


# --- memory probe ----------------------------------------------------------------------------

@dataclass
class Memory:
    """Bytes of tensors the cache holds between sampler evaluations (max over the run), the
    largest single residual/difference tensor (which a computed call holds twice for a moment:
    the new one is built before the old is dropped), and residual bytes per CFG branch."""

    held: int = 0
    transient: int = 0
    residual_per_branch: int = 0
    tensors: dict[str, list[int]] = field(default_factory=dict)

    @property
    def peak(self) -> int:
        return self.held + self.transient

    def as_dict(self) -> dict:
        return {"held_bytes": self.held, "transient_bytes": self.transient, "peak_bytes": self.peak,
                "residual_per_branch_bytes": self.residual_per_branch,
                "tensor_shapes": {k: list(v) for k, v in self.tensors.items()}}


def _storage(t: torch.Tensor) -> tuple[int, int]:
    storage = t.untyped_storage()
    return storage.data_ptr(), storage.nbytes()


class MemoryProbe:
    """PREDICT_NOISE wrapper registered outermost on the probed clone: after each sampler
    evaluation it reads what the cache holds (never writes anything). Only used on an untimed run."""

    def __init__(self, method: str) -> None:
        self.method = method
        self.memory = Memory()
        self.run_key = pack("nodes.runtime").RUN_KEY

    def __call__(self, executor: Any, *args: Any, **kwargs: Any) -> Any:
        out = executor(*args, **kwargs)
        options = (args[2] if len(args) > 2 else kwargs.get("model_options", {})).get("transformer_options", {})
        if self.method in ("teacache", "magcache"):
            self._read_pack(options.get(self.run_key))
        else:
            self._read_native(options.get("easycache"))
        return out

    def _account(self, residuals: list[tuple[str, torch.Tensor, int]], others: list[tuple[str, torch.Tensor]]) -> None:
        seen: dict[int, int] = {}
        biggest = 0
        per_branch = 0
        for name, tensor, branches in residuals:
            ptr, nbytes = _storage(tensor)
            seen[ptr] = nbytes
            biggest = max(biggest, nbytes)
            per_branch = max(per_branch, tensor.numel() * tensor.element_size() // max(branches, 1))
            self.memory.tensors[name] = list(tensor.shape)
        for name, tensor in others:
            ptr, nbytes = _storage(tensor)
            seen[ptr] = nbytes
            self.memory.tensors[name] = list(tensor.shape)
        mem = self.memory
        mem.held = max(mem.held, sum(seen.values()))
        mem.transient = max(mem.transient, biggest)
        mem.residual_per_branch = max(mem.residual_per_branch, per_branch)

    def _read_pack(self, run: Any) -> None:
        if run is None:
            return
        residuals, others = [], []
        # RunCache._stores: call layout (tuple of conditioning entries) -> ResidualStore (read only).
        for layout, store in run.cache._stores.items():
            if store.residual is not None:
                residuals.append((f"residual {len(layout)} entries", store.residual, len(layout)))
            if store.previous_signal is not None:
                others.append((f"teacache signal {len(layout)} entries", store.previous_signal))
            if store._host_buffer is not None:
                others.append(("offload buffer", store._host_buffer))
        self._account(residuals, others)

    def _read_native(self, holder: Any) -> None:
        if holder is None:
            return
        residuals, others = [], []
        diffs = getattr(holder, "uuid_cache_diffs", None)
        if diffs:  # EasyCache: one difference per conditioning uuid, views of one tensor
            groups: dict[int, list[torch.Tensor]] = {}
            for t in diffs.values():
                groups.setdefault(_storage(t)[0], []).append(t)
            for group in groups.values():
                residuals.append((f"cache diff per uuid ({len(group)} views of one tensor)", group[0], 1))
        cache_diff = getattr(holder, "cache_diff", None)
        if isinstance(cache_diff, torch.Tensor):  # LazyCache: one difference of the CFG-combined output
            residuals.append(("cache diff (CFG-combined)", cache_diff, 1))
        for name in ("x_prev_subsampled", "output_prev_subsampled", "output_prev_norm"):
            t = getattr(holder, name, None)
            if isinstance(t, torch.Tensor):
                others.append((name, t))
        self._account(residuals, others)


# --- the reference model ---------------------------------------------------------------------

class Bench:
    """The reference model, its conditioning, and how each configuration is built and run."""

    def __init__(self) -> None:
        self.models = pack("demo.models")
        self.pixels = pack("demo.pixels")
        self.calibrate_nodes = pack("nodes.calibrate_nodes")
        self.runtime = pack("nodes.runtime")
        self.base = self.models.load_model(KIND)
        self.native_log = NativeLog()
        logging.getLogger().addHandler(self.native_log)

    # sampling

    def sample(self, model: Any, pair: Pair, setting: SamplerSetting) -> torch.Tensor:
        positive = self.models.conditioning(KIND, pair.class_index, pair.batch)
        negative = self.models.conditioning(KIND, None, pair.batch)
        latent = self.models.empty_latent(KIND, pair.batch)
        return nodes.common_ksampler(model, pair.seed, setting.steps, setting.cfg, setting.sampler,
                                     setting.scheduler, positive, negative, latent)[0]["samples"]

    def timed(self, model: Any, pair: Pair, setting: SamplerSetting) -> tuple[float, torch.Tensor]:
        gc.collect()
        start = time.perf_counter()
        latent = self.sample(model, pair, setting)
        return time.perf_counter() - start, latent

    def decode(self, latent: torch.Tensor) -> torch.Tensor:
        return self.pixels.latent_to_image(latent)

    # calibration

    def calibrate(self, method: str, setting: SamplerSetting, classes: list[int], seed: int) -> tuple[Any, float]:
        """MagCacheCalibrate/TeaCacheCalibrate's measurement (not saved to disk), on a batch of
        the calibration classes; returns the Calibration and the seconds it took."""
        positive = self.models.conditioning(KIND, classes)
        negative = self.models.conditioning(KIND, None, len(classes))
        latent = self.models.empty_latent(KIND, len(classes))
        node = "MagCacheCalibrate" if method == "magcache" else "TeaCacheCalibrate"
        start = time.perf_counter()
        _, calibration = self.calibrate_nodes.measure(
            node, method, self.base, seed, setting.steps, setting.cfg, setting.sampler, setting.scheduler,
            positive, negative, latent, 1.0)
        return calibration, time.perf_counter() - start

    # configurations

    def build(self, config: Config, calibrations: dict[str, Any], probe: MemoryProbe | None = None
              ) -> tuple[Any, str | None]:
        """The MODEL for this configuration (a clone; ``self.base`` is never changed), and the
        pack node id whose statistics to read."""
        if config.method == "uncached":
            return self.base, None
        model = self.base.clone()
        if probe is not None:  # first, so it is outermost (LazyCache wraps PREDICT_NOISE too)
            model.add_wrapper_with_key(WrappersMP.PREDICT_NOISE, PROBE_WRAPPER_KEY, probe)
        if config.is_pack:
            inputs: dict[str, Any] = {"threshold": config.threshold, "max_consecutive_skips": config.k}
            if config.method == "magcache":
                inputs["retention_ratio"] = config.retention
            if config.constants == "calibrated":
                inputs["ratios" if config.method == "magcache" else "coefficients"] = calibrations[config.method]
            else:  # the reference model is no published checkpoint: FLUX.1-dev's constants, chosen by name
                inputs["variant"] = PUBLISHED_VARIANT
            patched, node_id = harness_sampling.apply(model, config.method, **inputs)
            settings = self.runtime.installed_settings(patched)
            uses_own = settings.ratios is not None or settings.coefficients is not None
            if uses_own != (config.constants == "calibrated"):
                raise RuntimeError(f"{config.label}: the node did not use the intended constants "
                                   "(a saved calibration in the user directory?)")
            return patched, node_id
        if not config.as_is:
            model.add_wrapper_with_key(WrappersMP.DIFFUSION_MODEL, COPY_WRAPPER_KEY, copy_input_wrapper)
        node_class = nodes.NODE_CLASS_MAPPINGS["EasyCache" if config.method == "easycache" else "LazyCache"]
        patched = harness_sampling.node_clone(node_class, {}).execute(
            model, reuse_threshold=config.threshold, start_percent=NATIVE_START, end_percent=NATIVE_END,
            verbose=False).result[0]
        if not config.as_is:
            outer = patched.get_all_wrappers(WrappersMP.DIFFUSION_MODEL)
            if not outer or outer[0] is not copy_input_wrapper:
                raise RuntimeError("the input-copy wrapper is not the outermost DIFFUSION_MODEL wrapper")
        return patched, None

    def skip_counts(self, config: Config, node_id: str | None, setting: SamplerSetting) -> dict:
        """Block-stack evaluations of the run that just ended: skipped and total."""
        if config.is_pack:
            stats = harness_sampling.stats(node_id)
            return {"skipped": stats["calls_skipped"], "total": stats["calls_computed"] + stats["calls_skipped"],
                    "disabled_reason": stats["disabled_reason"],
                    "patterns": {b["branch"]: b["pattern"] for b in stats["branches"]}}
        if config.is_native:
            _, skipped, total = self.native_log.take()
            return {"skipped": skipped, "total": total}  # a skipped step skips the whole model
        return {"skipped": 0, "total": setting.steps}


# --- the sweep -----------------------------------------------------------------------------

def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def run_config(bench: Bench, config: Config, plan: Plan, setting: SamplerSetting, calibrations: dict[str, Any],
               references: dict[Pair, tuple[torch.Tensor, torch.Tensor]]) -> dict:
    """One configuration over every pair: an untimed probed run (memory, warm-up), then per pair
    ``reps`` interleaved (uncached, cached) runs."""
    memory = None
    if config.method != "uncached":
        probe = MemoryProbe(config.method)
        probed, probed_node = bench.build(config, calibrations, probe)
        bench.sample(probed, plan.pairs[0], setting)
        bench.skip_counts(config, probed_node, setting)  # consume its log line
        memory = probe.memory.as_dict()
    model, node_id = bench.build(config, calibrations)
    per_pair = []
    ratios: list[float] = []
    deterministic = True
    for pair in plan.pairs:
        ref_latent, ref_images = references[pair]
        output = None
        times_a, times_b = [], []
        counts = None
        for _ in range(plan.reps):
            ta, la = bench.timed(bench.base, pair, setting)
            tb, lb = bench.timed(model, pair, setting)
            counts = bench.skip_counts(config, node_id, setting)
            deterministic &= torch.equal(la, ref_latent)
            if output is None:
                output = lb
            else:
                deterministic &= torch.equal(lb, output)
            times_a.append(ta)
            times_b.append(tb)
            ratios.append(tb / ta)
        quality = metrics.compare(ref_images, bench.decode(output))
        per_pair.append({
            "pair": pair.name, "class": pair.class_index, "seed": pair.seed,
            "psnr": [q[0] for q in quality], "ssim": [q[1] for q in quality],
            "seconds_uncached": times_a, "seconds_cached": times_b, **counts,
        })
    psnrs = [v for p in per_pair for v in p["psnr"]]
    ssims = [v for p in per_pair for v in p["ssim"]]
    skipped = sum(p["skipped"] for p in per_pair)
    total = sum(p["total"] for p in per_pair)
    computed = total - skipped
    return {
        "label": config.label, "line": config.line, "method": config.method, "constants": config.constants,
        "threshold": config.threshold, "k": config.k, "retention": config.retention, "as_is": config.as_is,
        "skip_fraction": skipped / total if total else 0.0,
        "block_speedup": total / computed if computed else float("inf"),
        "wall_ratio": _median(ratios), "wall_speedup": 1.0 / _median(ratios),
        "wall_ratios": ratios,
        "psnr_worst": min(psnrs), "psnr_mean": metrics.finite_mean(psnrs),
        "ssim_worst": min(ssims), "ssim_mean": statistics.fmean(ssims),
        "deterministic": deterministic, "memory": memory, "pairs": per_pair,
        "disabled_reasons": sorted({str(p.get("disabled_reason")) for p in per_pair if p.get("disabled_reason")}),
    }


def run_setting(bench: Bench, plan: Plan, setting: SamplerSetting, progress: Callable[[str], None]) -> dict:
    progress(f"== {setting.name} ({setting.scheduler}); {len(plan.pairs)} pairs x {plan.reps} reps")
    references = {}
    for pair in plan.pairs:
        latent = bench.sample(bench.base, pair, setting)
        references[pair] = (latent, bench.decode(latent))
    calibrations: dict[str, Any] = {}
    calibration_info = {}
    for method in ("magcache", "teacache"):
        calibration, seconds = bench.calibrate(method, setting, plan.calibration_classes, plan.calibration_seed)
        calibrations[method] = calibration
        calibration_info[method] = {"seconds": seconds, "summary": calibration.summary()}
        progress(f"   calibrated {method} on classes {plan.calibration_classes} seed {plan.calibration_seed} "
                 f"({seconds:.1f} s)")
    results = []
    for config in plan.configs():
        start = time.perf_counter()
        result = run_config(bench, config, plan, setting, calibrations, references)
        results.append(result)
        progress(f"   {config.label:<58} skip {result['skip_fraction']:6.1%}  stack {result['block_speedup']:.2f}x  "
                 f"wall {result['wall_speedup']:.2f}x  PSNR worst {result['psnr_worst']:6.2f} mean "
                 f"{result['psnr_mean']:6.2f}  SSIM worst {result['ssim_worst']:.4f}  ({time.perf_counter() - start:.0f} s)")
    return {"setting": {"name": setting.name, "key": setting.key, "sampler": setting.sampler,
                        "steps": setting.steps, "cfg": setting.cfg, "scheduler": setting.scheduler},
            "calibration": calibration_info, "results": results}


__all__ = ["Bench", "MemoryProbe", "NativeLog", "copy_input_wrapper", "run_config", "run_setting"]
