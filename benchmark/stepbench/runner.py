"""The sweep on a reference model: sampling, configurations, timing, stats and memory probes.

Everything runs through ComfyUI's own KSampler (``nodes.common_ksampler``) on the model
``demo.models.load_model(kind)`` builds ("image" or "video"); the pack's nodes run as ComfyUI runs them
(``harness.sampling.apply``), the native EasyCache/LazyCache nodes through their own V3 classes.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import pathlib
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

COPY_WRAPPER_KEY = "stepbench-bf16-cast-copy"
PROBE_WRAPPER_KEY = "stepbench-memory-probe"
# The "published" rows: the FLUX.1 tables, which the pack gives the reference model only by name.
# The reference models are no published checkpoints: the Apply nodes' variant input names the
# published constants they are measured with.
PUBLISHED_VARIANTS = {"image": "flux.1-dev", "video": "wan2.1-t2v-1.3b"}
PUBLISHED_VARIANT = PUBLISHED_VARIANTS["image"]
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
    # The pack: the most residuals (slots) one CFG branch (conditioning entry) keeps at once.
    residuals_per_branch: int = 0
    tensors: dict[str, list[int]] = field(default_factory=dict)

    @property
    def peak(self) -> int:
        return self.held + self.transient

    def as_dict(self) -> dict:
        return {"held_bytes": self.held, "transient_bytes": self.transient, "peak_bytes": self.peak,
                "residual_per_branch_bytes": self.residual_per_branch,
                "residuals_per_branch": self.residuals_per_branch,
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
        slots: dict[int, int] = {}
        # RunCache.held_tensors(): (kind, branch, tensor) of every conditioning entry (read only).
        for kind, branch, tensor in run.cache.held_tensors():
            if kind == "residual":
                residuals.append((f"residual slot (branch {branch})", tensor, 1))
                slots[branch] = slots.get(branch, 0) + 1
            else:
                others.append((f"{kind} (branch {branch})", tensor))
        self.memory.residuals_per_branch = max(self.memory.residuals_per_branch, *slots.values(), 0)
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
    """A reference model, its conditioning, and how each configuration is built and run."""

    def __init__(self, kind: str = "image", weights: pathlib.Path | None = None) -> None:
        """``weights``: another trained model of the kind (``./dev train KIND --out``) than the reference one."""
        self.kind = kind
        self.models = pack("demo.models")
        self.pixels = pack("demo.pixels")
        self.calibrate_nodes = pack("nodes.calibrate_nodes")
        self.runtime = pack("nodes.runtime")
        self.base = self.models.load_model(kind, weights)
        self.native_log = NativeLog()
        logging.getLogger().addHandler(self.native_log)

    def close(self) -> None:
        logging.getLogger().removeHandler(self.native_log)

    # sampling

    def sample(self, model: Any, pair: Pair, setting: SamplerSetting) -> torch.Tensor:
        positive = self.models.conditioning(self.kind, pair.class_index, pair.batch)
        negative = self.models.conditioning(self.kind, None, pair.batch)
        latent = self.models.empty_latent(self.kind, pair.batch)
        return nodes.common_ksampler(model, pair.seed, setting.steps, setting.cfg, setting.sampler,
                                     setting.scheduler, positive, negative, latent)[0]["samples"]

    def timed(self, model: Any, pair: Pair, setting: SamplerSetting) -> tuple[float, torch.Tensor]:
        gc.collect()
        start = time.perf_counter()
        latent = self.sample(model, pair, setting)
        return time.perf_counter() - start, latent

    def decode(self, latent: torch.Tensor) -> torch.Tensor:
        """Images [B, H, W, 3] or videos [B, T, H, W, 3] in [0, 1]."""
        if self.kind == "video":
            return self.pixels.latent_to_video(latent)
        return self.pixels.latent_to_image(latent)

    # calibration

    def calibrate(self, method: str, setting: SamplerSetting, classes: list[int], seed: int) -> tuple[Any, float]:
        """MagCacheCalibrate/TeaCacheCalibrate's measurement (not saved to disk), on a batch of
        the calibration classes; returns the Calibration and the seconds it took."""
        positive = self.models.conditioning(self.kind, classes)
        negative = self.models.conditioning(self.kind, None, len(classes))
        latent = self.models.empty_latent(self.kind, len(classes))
        config = pack("cache_core.methods").CALIBRATED_METHODS[method]
        start = time.perf_counter()
        _, calibration = self.calibrate_nodes.run_calibration(
            config.calibrate_node, config, self.base, seed, setting.steps, setting.cfg, setting.sampler,
            setting.scheduler, positive, negative, latent, 1.0)
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
            inputs: dict[str, Any] = {"threshold": config.threshold, "max_consecutive_skips": config.k,
                                      **config.variant.inputs()}
            if config.method == "magcache":
                inputs["retention_ratio"] = config.retention
            if config.constants == "calibrated":
                inputs["ratios" if config.method == "magcache" else "coefficients"] = calibrations[config.method]
            else:
                inputs["variant"] = PUBLISHED_VARIANTS[self.kind]
            patched, node_id = harness_sampling.apply(model, config.method, **inputs)
            settings = self.runtime.installed_settings(patched)
            uses_own = (getattr(settings.method, "ratios", None) is not None
                        or getattr(settings.method, "coefficients", None) is not None)
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

    def skip_counts(self, config: Config, node_id: str | None, setting: SamplerSetting, pair: Pair) -> dict:
        """Block-stack work of the run that just ended: evaluations (model calls) and rows (batch
        rows x calls) skipped and total, and rows whose head block ran for the first-block check."""
        if config.is_pack:
            stats = harness_sampling.stats(node_id)
            return {"skipped": stats["calls_skipped"], "total": stats["calls_computed"] + stats["calls_skipped"],
                    "rows_skipped": stats["rows_skipped"], "rows_total": stats["rows_computed"] + stats["rows_skipped"],
                    "rows_checked": stats["rows_checked"], "head_cost": stats["head_cost"],
                    "disabled_reason": stats["disabled_reason"],
                    "patterns": {b["branch"]: b["pattern"] for b in stats["branches"]}}
        rows_per_call = pair.batch * (2 if setting.cfg > 1.0 else 1)  # cond and uncond batched
        if config.is_native:
            _, skipped, total = self.native_log.take()
            # a skipped step skips the whole model, every row of it
            return {"skipped": skipped, "total": total, "rows_skipped": skipped * rows_per_call,
                    "rows_total": total * rows_per_call, "rows_checked": 0, "head_cost": 0.0}
        return {"skipped": 0, "total": setting.steps, "rows_skipped": 0, "rows_total": setting.steps * rows_per_call,
                "rows_checked": 0, "head_cost": 0.0}


# --- the sweep -----------------------------------------------------------------------------

def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def run_config(bench: Bench, config: Config, plan: Plan, setting: SamplerSetting, calibrations: dict[str, Any],
               references: dict[Pair, tuple[torch.Tensor, torch.Tensor]]) -> dict:
    """One configuration over every pair: an untimed probed run (memory, warm-up), then per pair
    ``reps`` interleaved (uncached, cached) runs, or one cached run when the plan is quality-only."""
    memory = None
    if config.method != "uncached":
        probe = MemoryProbe(config.method)
        probed, probed_node = bench.build(config, calibrations, probe)
        bench.sample(probed, plan.pairs[0], setting)
        bench.skip_counts(config, probed_node, setting, plan.pairs[0])  # consume its log line
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
            counts = bench.skip_counts(config, node_id, setting, pair)
            deterministic &= torch.equal(la, ref_latent)
            if output is None:
                output = lb
            else:
                deterministic &= torch.equal(lb, output)
            times_a.append(ta)
            times_b.append(tb)
            ratios.append(tb / ta)
        if plan.quality_only:
            output = bench.sample(model, pair, setting)
            counts = bench.skip_counts(config, node_id, setting, pair)
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
    rows_total = sum(p["rows_total"] for p in per_pair)
    rows_computed = rows_total - sum(p["rows_skipped"] for p in per_pair)
    # The first-block check's head blocks, each at its share of a row.
    rows_work = rows_computed + sum(p["rows_checked"] * p["head_cost"] for p in per_pair)
    wall_ratio = _median(ratios) if ratios else None
    return {
        "label": config.label, "line": config.line, "method": config.method, "constants": config.constants,
        "threshold": config.threshold, "k": config.k, "retention": config.retention, "as_is": config.as_is,
        "variant": dataclasses.asdict(config.variant),
        "skip_fraction": skipped / total if total else 0.0,
        "block_speedup": total / computed if computed else float("inf"),
        "rows_total": rows_total, "rows_computed": rows_computed,
        "rows_checked": sum(p["rows_checked"] for p in per_pair),
        "row_skip_fraction": 1.0 - rows_computed / rows_total if rows_total else 0.0,
        "row_speedup": rows_total / rows_work if rows_work else float("inf"),
        "wall_ratio": wall_ratio, "wall_speedup": 1.0 / wall_ratio if wall_ratio else None,
        "wall_ratios": ratios,
        "psnr_worst": min(psnrs), "psnr_mean": metrics.finite_mean(psnrs),
        "ssim_worst": min(ssims), "ssim_mean": statistics.fmean(ssims),
        "deterministic": deterministic, "memory": memory, "pairs": per_pair,
        "disabled_reasons": sorted({str(p.get("disabled_reason")) for p in per_pair if p.get("disabled_reason")}),
    }


def run_setting(bench: Bench, plan: Plan, setting: SamplerSetting, progress: Callable[[str], None]) -> dict:
    mode = "quality only" if plan.quality_only else f"{plan.reps} reps"
    progress(f"== {bench.kind} model, {setting.name} ({setting.scheduler}); {len(plan.pairs)} pairs, {mode}")
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
        wall = "" if result["wall_speedup"] is None else f"wall {result['wall_speedup']:.2f}x  "
        progress(f"   {config.label:<78} rows {result['row_speedup']:.2f}x  {wall}"
                 f"PSNR worst {result['psnr_worst']:6.2f} "
                 f"mean {result['psnr_mean']:6.2f}  ({time.perf_counter() - start:.0f} s)")
    return {"kind": bench.kind,
            "setting": {"name": setting.name, "key": setting.key, "sampler": setting.sampler,
                        "steps": setting.steps, "cfg": setting.cfg, "scheduler": setting.scheduler},
            "calibration": calibration_info, "results": results}


__all__ = ["Bench", "MemoryProbe", "NativeLog", "copy_input_wrapper", "run_config", "run_setting"]
