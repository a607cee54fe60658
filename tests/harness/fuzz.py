"""Randomized run sequences and a memory soak, in the real ComfyUI (in-process, tiny models).

A sequence draws runs at random (seeded, so a failure replays) across families, cache methods and
thresholds, steps, resolution, batch, frame count, cfg, sampler, scheduler, denoise, KSamplerAdvanced
ranges, another pack's block patch put on before or after the Apply node (the test-only
StepCacheTestBlockPatch, on the first or last block), ComfyUI's context windows on tiny video models
(either node, every schedule it offers, before or after the Apply node), and interrupts by ComfyUI's own mechanism
(``interrupt_current_processing``, which the next ComfyUI op turns into
``InterruptProcessingException``, as the server's /interrupt does). Patched models are reused
across runs, so whatever a run leaves behind meets every later run.

After every run it checks:
- no exception, except the interrupt it asked for;
- threshold 0, or a run the cache declines (fewer than 10 steps, another pack's patch put on
  after the Apply node, the looped_uniform context schedule): output bit-identical to the
  unpatched model (with that patch, those windows);
- a caching run: output bit-identical to a freshly patched model doing the same run (a difference
  is a *stale-state mismatch*: something carried over from an earlier run);
- the run's statistics agree with its schedule (steps, branches, computed + skipped per branch: one
  per step, or with context windows one per window and step);
- nothing of the cache survives the run (no live run state, no residual store).

``./dev fuzz`` runs a larger budget and the 200-run soak from the command line; the tests run a
CI-sized budget. Import after ``host.boot()``.
"""

from __future__ import annotations

import functools
import gc
import logging
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import comfy.context_windows
import comfy.model_management
import comfy.patcher_extension
import comfy_extras.nodes_context_windows
import psutil
import torch

from . import sampling

SAMPLERS = ["euler", "euler_ancestral", "heun", "dpmpp_2m", "dpmpp_2s_ancestral", "uni_pc", "lcm"]
SCHEDULERS = ["simple", "normal", "karras", "exponential", "sgm_uniform", "beta"]
# Thresholds: 0 (never skip), a moderate one, and one that skips nearly everything.
THRESHOLDS = {"teacache": [0.0, 0.3, 5.0], "magcache": [0.0, 0.1, 5.0]}
# The Apply nodes' shared inputs: (estimator, forecast_order, forecast_damping).
# (The registry's examples: an estimator registered in cache_core/estimators is drawn as it is added.)
ESTIMATORS = [(spec.name, spec.order, spec.damping) for spec in sampling.pack("cache_core.estimators").examples()]
CFG_BRANCHES = ["together", "separate"]
# The quality knob: custom (the expert inputs as drawn) half the time, else a level.
QUALITIES = ["custom", "custom", "custom", "lossless", "high", "balanced", "fast"]
# 6 is above the scale the levels were chosen at (quality.REFERENCE_CFG), where they tighten.
CFG_SCALES = [1.0, 3.0, 3.0, 6.0]
# Checks: off, or (check, tolerance) strict (most checked steps compute) and lenient (most skip).
CHECKS = [("off", 0.1), ("off", 0.1), ("first_block", 0.05), ("first_block", 10.0), ("hindsight", 0.05),
          ("hindsight", 10.0)]
# Another pack's block patch: none (most runs), or put on before / after the Apply node, on the
# stack's first or last block.
FOREIGN_PATCHES = [None, None, None, ("before", 0), ("before", -1), ("after", 0), ("after", -1)]
# A ControlNet (start, end percent) on the tiny FLUX, which the tests have a ControlNet for.
CONTROLNET_CHANCE = 0.2
CONTROLNETS = [(0.0, 1.0), (0.0, 0.5), (0.3, 1.0)]
# ComfyUI's context windows (a share of runs switch to a text-to-video model: the plain tiny Wan
# half the time, else another family's): the node (the Wan node on Wan only), where it goes (before
# or after the Apply node), its schedule (every one the node offers), and the window length and
# overlap in latent frames, on a video long enough to be windowed.
CONTEXT_WINDOWS_SHARE = 0.3
WINDOWED_MODEL = "wan21"
OTHER_WINDOWED_MODELS = ["hunyuan_video", "ltxv", "mochi", "cosmos1", "kandinsky5", "cogvideox"]
WINDOW_NODES = {"ContextWindowsManual": comfy_extras.nodes_context_windows.ContextWindowsManualNode,
                "WanContextWindowsManual": comfy_extras.nodes_context_windows.WanContextWindowsManualNode}
WINDOW_SCHEDULES = [option for option in next(
    i for i in comfy_extras.nodes_context_windows.ContextWindowsManualNode.GET_SCHEMA().inputs
    if i.id == "context_schedule").options]
REFUSED_SCHEDULES = ("looped_uniform",)  # nodes/runtime.py: context_windows_refused
WINDOWED_FRAMES = [3, 5, 7]
SOAKED_WINDOWED_MODELS = (WINDOWED_MODEL, *OTHER_WINDOWED_MODELS)
SOAKED_WINDOW_SCHEDULES = [schedule for schedule in WINDOW_SCHEDULES if schedule not in REFUSED_SCHEDULES]
# Samplers that evaluate the model between the schedule's sigmas (dpmpp_2s_ancestral's midpoints).
SUBSTEP_SAMPLERS = ("dpmpp_2s_ancestral",)
MIN_STEPS_TO_CACHE = 10
INTERRUPT_WRAPPER_KEY = "stepcache-fuzz-interrupt"


@dataclass(frozen=True)
class Coverage:
    """Which tiny models a sequence draws from, derived from the registries: every tiny model this
    ComfyUI can build (tests/harness/comfy_test_nodes/tiny_models.py) whose pack family is in
    families.FAMILIES; and what is left out, with why, so that nothing is dropped silently."""

    tiny_models: tuple[str, ...]
    video: frozenset[str]
    # One tiny model per pack family (its first registered one): what the soak cycles through.
    per_family: tuple[str, ...]
    # Pack families without a tiny model this ComfyUI can build, and tiny models it cannot build.
    families_not_covered: tuple[str, ...]
    tiny_models_not_built: tuple[str, ...]

    def summary(self) -> str:
        return "\n".join([
            f"tiny models drawn: {len(self.tiny_models)} of {len(self.per_family)} pack families",
            "pack families without a tiny model this ComfyUI builds: "
            + (", ".join(self.families_not_covered) or "none"),
            "tiny models this ComfyUI cannot build: " + (", ".join(self.tiny_models_not_built) or "none"),
        ])


def same_output(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-identical, NaN included: the same NaN positions and equal values elsewhere. A tiny
    random-weight model can diverge (the unpatched FlowRVS one gives NaN with ancestral samplers),
    and NaN never equals NaN, so ``torch.equal`` alone could not judge such runs at all."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    nan = torch.isnan(a)
    return torch.equal(nan, torch.isnan(b)) and torch.equal(a[~nan], b[~nan])


def takes_frames(spec: Any) -> bool:
    """A video model: a 5-D latent whose tiny model has more than one frame (image models that
    ComfyUI runs on 5-D latents, e.g. Qwen-Image, have one)."""
    return spec.is_video and spec.latent_spatial[0] > 1


def coverage() -> Coverage:
    tiny = sampling.tiny()
    pack_families = [family.name for family in sampling.pack("families").FAMILIES]
    drawn, not_built, first = [], [], {}
    for name, spec in tiny.FAMILIES.items():
        if spec.family not in pack_families:
            continue  # a model the pack does not cache (the UNet used by fallback tests)
        if not spec.available():
            not_built.append(f"{name} (this ComfyUI has no {spec.config_class} or cannot drive it)")
            continue
        drawn.append(name)
        first.setdefault(spec.family, name)
    return Coverage(
        # Frame counts vary only for video models: image models on 5-D latents take one frame.
        tiny_models=tuple(drawn), video=frozenset(n for n in drawn if takes_frames(tiny.FAMILIES[n])),
        per_family=tuple(first[f] for f in pack_families if f in first),
        families_not_covered=tuple(f for f in pack_families if f not in first),
        tiny_models_not_built=tuple(not_built),
    )


@dataclass(frozen=True)
class RunSpec:
    family: str
    method: str
    threshold: float
    estimator: tuple[str, int, float]
    cfg_branches: str
    check: tuple[str, float]
    steps: int
    cfg: float
    sampler: str
    scheduler: str
    denoise: float
    batch: int
    scale: int
    frames: int | None
    advanced: tuple[int, int] | None  # KSamplerAdvanced (start_step, last_step)
    interrupt_after: int | None  # interrupt once this many steps have completed
    seed: int
    quality: str = "custom"  # at a level, the expert inputs (threshold, estimator, ...) are not used
    foreign_patch: tuple[str, int] | None = None  # ("before" | "after", block position)
    controlnet: tuple[float, float] | None = None  # a ControlNet's start and end percent
    # (node, "before" | "after" the Apply node, schedule, length, overlap in latent frames)
    context_windows: tuple[str, str, str, int, int] | None = None

    @property
    def never_skips(self) -> bool:
        """Settings that can never skip (threshold 0 at quality custom): bit-identical to unpatched."""
        return self.quality == "custom" and self.threshold == 0.0

    @property
    def schedule_steps(self) -> int:
        """Steps in the schedule the sampler actually runs."""
        if self.advanced is not None:
            start, end = self.advanced
            return min(end, self.steps) - start
        return self.steps

    def job(self) -> sampling.Job:
        control = {} if self.controlnet is None else {"controlnet": controlnet_for(self.family),
                                                      "control_percent": self.controlnet}
        return sampling.Job(self.family, seed=self.seed, steps=self.steps, cfg=self.cfg, sampler=self.sampler,
                            scheduler=self.scheduler, denoise=self.denoise, batch=self.batch, scale=self.scale,
                            frames=self.frames, **control)

    def run(self, model: Any) -> torch.Tensor:
        """As ComfyUI's executor runs a node: under torch.inference_mode (execution.py)."""
        job = self.job()
        with torch.inference_mode():
            if self.advanced is None:
                return job.run(model)
            return job.run_advanced(model, *self.advanced)


@functools.cache
def controlnet_for(family: str) -> Any:
    return sampling.tiny().tiny_controlnet(sampling.tiny().build_model(family, seed=0), seed=3)


def windows_take_substeps() -> bool:
    """Whether this ComfyUI's context windows take a model call between the schedule's sigmas: 0.30.0
    keeps the last step's windows, 0.3.75 raises ("No sample_sigmas matched current timestep"),
    uncached as much as cached, so the fuzz does not draw such samplers with windows there."""
    handler = comfy.context_windows.IndexListContextHandler(
        context_schedule=comfy.context_windows.get_matching_context_schedule(WINDOW_SCHEDULES[0]),
        fuse_method=comfy.context_windows.get_matching_fuse_method("pyramid"), context_length=2, dim=2)
    try:
        handler.set_step(torch.tensor([0.5]), {"transformer_options": {"sample_sigmas": torch.tensor([1.0, 0.0])}})
    except Exception:
        return False
    return True


def draw(rng: random.Random, covered: Coverage) -> RunSpec:
    family = rng.choice(covered.tiny_models)
    windows = None
    if WINDOWED_MODEL in covered.tiny_models and rng.random() < CONTEXT_WINDOWS_SHARE:
        others = [name for name in OTHER_WINDOWED_MODELS if name in covered.tiny_models]
        family = WINDOWED_MODEL if not others or rng.random() < 0.5 else rng.choice(others)
        length = rng.choice([2, 3])
        window_node = rng.choice(list(WINDOW_NODES)) if family == WINDOWED_MODEL else "ContextWindowsManual"
        windows = (window_node, rng.choice(["before", "after"]), rng.choice(WINDOW_SCHEDULES),
                   length, rng.randrange(0, length))
    controlnet = None
    if windows is None and rng.random() < CONTROLNET_CHANCE:
        family, controlnet = "flux", rng.choice(CONTROLNETS)
    method = rng.choice(["teacache", "magcache"])
    steps = rng.choice([6, 10, 12, 14, 16])
    advanced = None
    if rng.random() < 0.2:
        start = rng.randrange(0, 4)
        advanced = (start, rng.randrange(start + 1, steps + 1))
    return RunSpec(
        family=family, method=method, threshold=rng.choice(THRESHOLDS[method]), estimator=rng.choice(ESTIMATORS),
        cfg_branches=rng.choice(CFG_BRANCHES), check=rng.choice(CHECKS), steps=steps,
        cfg=rng.choice(CFG_SCALES), scheduler=rng.choice(SCHEDULERS),
        sampler=rng.choice(SAMPLERS if windows is None or windows_take_substeps()
                           else [s for s in SAMPLERS if s not in SUBSTEP_SAMPLERS]),
        denoise=rng.choice([1.0, 1.0, 0.6]) if advanced is None else 1.0,
        # ComfyUI's windows slice the timestep by frame index (context_windows.get_tensor), which
        # only a batch of one survives.
        batch=rng.choice([1, 1, 2]) if windows is None else 1,
        scale=rng.choice([1, 1, 2]),
        frames=(rng.choice(WINDOWED_FRAMES) if windows is not None
                else rng.choice([None, 2, 3]) if family in covered.video else None),
        advanced=advanced,
        interrupt_after=rng.randrange(1, max(2, steps - 1)) if rng.random() < 0.15 else None,
        seed=rng.randrange(1000), quality=rng.choice(QUALITIES), foreign_patch=rng.choice(FOREIGN_PATCHES),
        controlnet=controlnet,
        context_windows=windows,
    )


@dataclass
class Report:
    runs: int = 0
    interrupted: int = 0
    interrupted_at_next_node: int = 0  # of those: every remaining call skipped in output space
    cached_runs: int = 0
    identical_checks: int = 0
    families: Counter = field(default_factory=Counter)
    foreign_patches: Counter = field(default_factory=Counter)  # runs with another pack's patch, by placement
    controlnets: Counter = field(default_factory=Counter)  # runs with a ControlNet, by start-end percent
    context_windows: Counter = field(default_factory=Counter)  # runs with context windows, by schedule
    guidance_scales: Counter = field(default_factory=Counter)  # runs by CFG scale
    tightened: int = 0  # runs at a level whose tolerance the CFG scale tightened
    exceptions: list[str] = field(default_factory=list)
    stale_state_mismatches: list[str] = field(default_factory=list)
    uncached_mismatches: list[str] = field(default_factory=list)
    stats_errors: list[str] = field(default_factory=list)
    leaks: list[str] = field(default_factory=list)
    rss_start: int = 0
    rss_peak: int = 0
    rss_end: int = 0
    seconds: float = 0.0
    covered: Coverage | None = None

    @property
    def failures(self) -> list[str]:
        return self.exceptions + self.stale_state_mismatches + self.uncached_mismatches + self.stats_errors + self.leaks

    def summary(self) -> str:
        mib = 1 << 20
        return "\n".join([
            f"runs {self.runs} ({self.cached_runs} caching, {self.interrupted} interrupted "
            f"({self.interrupted_at_next_node} of them only at the next node), "
            f"{self.identical_checks} checked bit-identical to unpatched) in {self.seconds:.0f} s",
            *([self.covered.summary()] if self.covered is not None else []),
            "tiny models: " + ", ".join(f"{k} {v}" for k, v in sorted(self.families.items())),
            "another pack's block patch: "
            + (", ".join(f"{k} Apply {v}" for k, v in sorted(self.foreign_patches.items())) or "none drawn"),
            "ControlNet (start-end percent): "
            + (", ".join(f"{k}: {v}" for k, v in sorted(self.controlnets.items())) or "none drawn"),
            "context windows: "
            + (", ".join(f"{k} {v}" for k, v in sorted(self.context_windows.items())) or "none drawn"),
            "CFG scales: " + ", ".join(f"{k:g} {v}" for k, v in sorted(self.guidance_scales.items()))
            + f" ({self.tightened} runs at a level tightened by the scale)",
            f"exceptions: {len(self.exceptions)}",
            f"stale-state mismatches: {len(self.stale_state_mismatches)}",
            f"uncached runs not identical to unpatched: {len(self.uncached_mismatches)}",
            f"statistics inconsistent with the schedule: {len(self.stats_errors)}",
            f"cache state surviving a run: {len(self.leaks)}",
            f"process memory (RSS): start {self.rss_start / mib:.0f} MiB, peak {self.rss_peak / mib:.0f} MiB, "
            f"end {self.rss_end / mib:.0f} MiB (drift {(self.rss_end - self.rss_start) / mib:+.0f} MiB)",
            *(f"  FAIL {f}" for f in self.failures[:20]),
        ])


class Driver:
    """Holds the unpatched models and the reused patched ones across a sequence."""

    def __init__(self) -> None:
        self.tiny = sampling.tiny()
        self.test_nodes = sampling.test_nodes()
        self.runtime = sampling.pack("nodes.runtime")
        self.run_cache = sampling.pack("cache_core.run_cache")
        self.history = sampling.pack("cache_core.history")
        self.reference_cfg = sampling.pack("cache_core.quality").REFERENCE_CFG
        self.levels = sampling.pack("cache_core.quality").LEVELS
        self.families = sampling.pack("families")
        self.borrowed_ratios = sampling.pack("families.published_magcache").FLUX_DEV
        self.base: dict[str, Any] = {}
        self.patched: dict[tuple, tuple[Any, str]] = {}
        self.interrupted_at_next_node = False

    def base_model(self, family: str) -> Any:
        if family not in self.base:
            self.base[family] = self.tiny.build_model(family, seed=0)
        return self.base[family]

    def foreign_block(self, spec: RunSpec) -> tuple[str, int] | None:
        """The block key the spec's foreign patch goes on (None: no patch, or no block hooks)."""
        model = self.base_model(spec.family)
        keys = self.families.family_for(model.model).block_keys(model.model.diffusion_model)
        return keys[spec.foreign_patch[1]] if spec.foreign_patch is not None and keys else None

    def with_foreign_patch(self, model: Any, spec: RunSpec) -> Any:
        key = self.foreign_block(spec)
        if key is None:
            return model
        return self.test_nodes.BlockPatch.execute(model, kind=key[0], index=key[1], strength=0.25).result[0]

    def with_windows(self, model: Any, spec: RunSpec) -> Any:
        """The spec's context windows put on ``model`` (the Wan node takes pixel frames: 4 per latent
        frame, and one more for the length)."""
        if spec.context_windows is None:
            return model
        node, _, schedule, length, overlap = spec.context_windows
        inputs = (dict(context_length=length, context_overlap=overlap, dim=2) if node == "ContextWindowsManual"
                  else dict(context_length=4 * (length - 1) + 1, context_overlap=4 * overlap))
        return sampling.execute_node(WINDOW_NODES[node], model=model, context_schedule=schedule, **inputs)[0]

    def windows_before(self, spec: RunSpec) -> bool:
        return spec.context_windows is not None and spec.context_windows[1] == "before"

    def window_calls(self, spec: RunSpec) -> int:
        """Calls per branch over the run: one per step, with context windows one per window and step
        (the handler's windows for each step; none where the video fits one window)."""
        steps = spec.schedule_steps
        if spec.context_windows is None:
            return steps
        handler = self.with_windows(self.base_model(spec.family), spec).model_options["context_handler"]
        if spec.frames <= handler.context_length:
            return steps
        total = 0
        for step in range(steps):
            handler._step = step  # what the handler's set_step finds for the step's sigma
            total += len(handler.context_schedule.func(spec.frames, handler, {}))
        return total

    def declined(self, spec: RunSpec) -> bool:
        """Runs the cache samples uncached (the output is then the unpatched model's)."""
        return (spec.schedule_steps < MIN_STEPS_TO_CACHE or spec.never_skips
                or (self.foreign_block(spec) is not None and spec.foreign_patch[0] == "after")
                or (spec.context_windows is not None and spec.context_windows[2] in REFUSED_SCHEDULES))

    def unpatched(self, spec: RunSpec) -> Any:
        """The model without the cache: with the foreign patch and the context windows, if the spec
        has them."""
        return self.with_windows(self.with_foreign_patch(self.base_model(spec.family), spec), spec)

    def apply(self, spec: RunSpec) -> tuple[Any, str]:
        estimator, order, damping = spec.estimator
        inputs: dict[str, Any] = {"threshold": spec.threshold, "estimator": estimator, "forecast_order": order,
                                  "forecast_damping": damping, "cfg_branches": spec.cfg_branches,
                                  "check": spec.check[0], "check_tolerance": spec.check[1],
                                  "quality": spec.quality}
        family = self.families.family_for(self.base_model(spec.family).model)
        if spec.method == "magcache":
            # Tiny models are no published checkpoint: a published table chosen by name where the
            # family has one, else FLUX.1-dev's (only the mechanics matter on random weights).
            published = [v.name for v in family.variants if v.magcache is not None]
            if published:
                inputs["variant"] = published[0]
            else:
                inputs["ratios"] = self.borrowed_ratios
        if spec.threshold >= 5.0:
            inputs["max_consecutive_skips"] = 100
            if spec.method == "magcache":
                inputs["retention_ratio"] = 0.0
        before = spec.foreign_patch is not None and spec.foreign_patch[0] == "before"
        model = self.base_model(spec.family)
        if self.windows_before(spec):
            model = self.with_windows(model, spec)
        model = self.with_foreign_patch(model, spec) if before else model
        patched, node_id = sampling.apply(model, spec.method, **inputs)
        patched = patched if before else self.with_foreign_patch(patched, spec)
        return (patched if self.windows_before(spec) else self.with_windows(patched, spec)), node_id

    def reused(self, spec: RunSpec) -> tuple[Any, str]:
        key = (spec.family, spec.method, spec.threshold, spec.estimator, spec.cfg_branches, spec.check, spec.quality,
               spec.foreign_patch, spec.context_windows)
        if key not in self.patched:
            self.patched[key] = self.apply(spec)
        return self.patched[key]

    def live_cache_objects(self) -> list[str]:
        gc.collect()
        kinds = (self.runtime.ActiveRun, self.run_cache.RunCache, self.run_cache.Entry,
                 self.history.ResidualHistory)
        return [type(o).__name__ for o in gc.get_objects() if isinstance(o, kinds)]

    def tightened(self, spec: RunSpec) -> bool:
        """A run at a quality level above the CFG scale the levels were chosen at: its tolerance tightens."""
        return spec.quality != "custom" and spec.cfg > self.reference_cfg

    def check_stats(self, spec: RunSpec, node_id: str) -> str | None:
        run = sampling.stats(node_id)
        steps = spec.schedule_steps
        # Runs the cache declines report their reason and no branches (nothing was decided).
        declined = self.declined(spec)
        branches = set() if declined else {"cond", "uncond"} if spec.cfg > 1.0 else {"cond"}
        problems = []
        if run["steps"] != steps:
            problems.append(f"steps {run['steps']} != {steps}")
        if (run["disabled_reason"] is not None) != declined:
            problems.append(f"disabled_reason {run['disabled_reason']!r} for {steps} steps")
        if {b["branch"] for b in run["branches"]} != branches:
            problems.append(f"branches {[b['branch'] for b in run['branches']]}")
        calls = self.window_calls(spec)
        for b in run["branches"]:
            # With context windows the pattern is one window's (a window that moved has a shorter one).
            pattern_ok = len(b["pattern"]) == steps if spec.context_windows is None else 0 < len(b["pattern"]) <= steps
            if b["steps_computed"] + b["steps_skipped"] != calls or not pattern_ok:
                problems.append(f"branch {b['branch']}: {b['steps_computed']} + {b['steps_skipped']} for {calls} "
                                f"calls, pattern {b['pattern']!r}")
        if (run["calls_skipped"] or run["rows_skipped"]) and declined:
            problems.append(f"a declined run skipped {run['calls_skipped']} calls")
        if not run["rows_checked"] <= run["rows_skipped"] or (run["rows_skipped"] > 0) != (run["calls_skipped"] > 0):
            problems.append(f"rows: {run['rows_skipped']} skipped, {run['rows_checked']} checked, "
                            f"{run['calls_skipped']} calls skipped")
        # A level above the scale it was chosen at tightens its tolerance and says so; nothing else does.
        if self.tightened(spec) != (f"at cfg {spec.cfg:g}" in (run["constants"] or "")):
            problems.append(f"constants {run['constants']!r} at quality {spec.quality}, cfg {spec.cfg:g}")
        # A level that feeds skips' error back says whether this run's sampler allows it; only then
        # does it correct, and at most once per computed call.
        level = self.levels.get(spec.quality)
        feeds_back = level is not None and level.feedback and not declined
        if feeds_back != ("skip feedback" in (run["constants"] or "")) or run["feedback_corrections"] > (
                run["calls_computed"] if "skip feedback on" in (run["constants"] or "") else 0):
            problems.append(f"feedback: {run['feedback_corrections']} corrections, constants {run['constants']!r}")
        if run["rows_checked"] and spec.check[0] != "first_block":
            problems.append(f"{run['rows_checked']} rows checked with the check off")
        return "; ".join(problems) or None

    def one_run(self, spec: RunSpec, report: Report) -> None:
        report.runs += 1
        report.families[spec.family] += 1
        if spec.foreign_patch is not None:
            report.foreign_patches[spec.foreign_patch[0]] += 1
        if spec.controlnet is not None:
            report.controlnets["{:g}-{:g}".format(*spec.controlnet)] += 1
        if spec.context_windows is not None:
            report.context_windows[spec.context_windows[2]] += 1
        report.guidance_scales[spec.cfg] += 1
        patched, node_id = self.reused(spec)
        try:
            output = self.run_interruptible(spec, patched)
        except Exception as error:  # the sequence goes on: every failure is reported, not just the first
            report.exceptions.append(f"{spec}: {type(error).__name__}: {error}")
            return
        finally:
            leaked = self.live_cache_objects()
            if leaked or self.runtime.RUN_KEY in patched.model_options["transformer_options"]:
                report.leaks.append(f"{spec}: {Counter(leaked)}")
        if output is None:
            report.interrupted += 1
            report.interrupted_at_next_node += self.interrupted_at_next_node
            return
        if (problem := self.check_stats(spec, node_id)) is not None:
            report.stats_errors.append(f"{spec}: {problem}")
        report.tightened += self.tightened(spec)
        if self.declined(spec):
            report.identical_checks += 1
            if not same_output(output, spec.run(self.unpatched(spec))):
                report.uncached_mismatches.append(str(spec))
            return
        report.cached_runs += 1
        fresh, _ = self.apply(spec)
        if not same_output(output, spec.run(fresh)):
            report.stale_state_mismatches.append(str(spec))

    def run_interruptible(self, spec: RunSpec, model: Any) -> torch.Tensor | None:
        """The run; None when it was interrupted as asked. The interrupt is ComfyUI's own: the flag
        that /interrupt sets, raised by the next ComfyUI op. It is set from the sampler's own step
        callback once ``interrupt_after`` steps have completed, wrapped in through ComfyUI's
        SAMPLER_SAMPLE wrapper: every step reaches that callback, while the progress hook the
        server uses is throttled (since ComfyUI 0.30.0, to one update per 100 ms)."""
        self.interrupted_at_next_node = False
        if spec.interrupt_after is None or spec.interrupt_after >= spec.schedule_steps:
            return spec.run(model)

        def interrupt_after_steps(executor: Any, model_wrap: Any, sigmas: Any, extra_args: Any, callback: Any,
                                  *args: Any, **kwargs: Any) -> Any:
            def step_done(step: int, *callback_args: Any) -> None:
                if step + 1 == spec.interrupt_after:
                    comfy.model_management.interrupt_current_processing(True)
                if callback is not None:
                    callback(step, *callback_args)

            return executor(model_wrap, sigmas, extra_args, step_done, *args, **kwargs)

        model = model.clone()
        model.add_wrapper_with_key(comfy.patcher_extension.WrappersMP.SAMPLER_SAMPLE, INTERRUPT_WRAPPER_KEY,
                                   interrupt_after_steps)
        try:
            output = spec.run(model)
            # A run whose remaining model calls were all skipped in output space runs no ComfyUI op
            # after the flag is set, so it finishes; ComfyUI's executor raises the interrupt before
            # the next node (nodes.before_node_execution), as here.
            requested = comfy.model_management.processing_interrupted()
            self.interrupted_at_next_node = requested
            comfy.model_management.throw_exception_if_processing_interrupted()
        except comfy.model_management.InterruptProcessingException:
            return None
        finally:
            comfy.model_management.interrupt_current_processing(False)
        raise AssertionError(f"asked to interrupt after step {spec.interrupt_after}, the step callback never did "
                             f"(flag {requested}); the run finished: {output.shape}")


def run_sequence(runs: int, seed: int) -> Report:
    """``runs`` random runs drawn from ``seed``."""
    logging.getLogger("stepcache").setLevel(logging.ERROR)  # one line per run would drown the report
    rng = random.Random(seed)
    driver = Driver()
    covered = coverage()
    report = Report(covered=covered)
    process = psutil.Process()
    started = time.perf_counter()
    report.rss_start = report.rss_peak = process.memory_info().rss
    for _ in range(runs):
        driver.one_run(draw(rng, covered), report)
        report.rss_peak = max(report.rss_peak, process.memory_info().rss)
    report.rss_end = process.memory_info().rss
    report.seconds = time.perf_counter() - started
    logging.getLogger("stepcache").setLevel(logging.NOTSET)
    return report


@dataclass
class SoakReport:
    runs: int
    rss_after_warmup: int
    rss_peak: int
    rss_end: int
    tensors_after_warmup: int
    tensors_end: int
    pack_objects_end: int
    seconds: float
    rss_checkpoints: list[int]  # every 50 runs
    cached: bool = True
    families: tuple[str, ...] = ()
    warmup: int = 0
    windowed: int = 0  # runs in ComfyUI's context windows

    def summary(self) -> str:
        mib = 1 << 20
        what = "cached" if self.cached else "uncached (control)"
        return (f"soak, {what}: {self.runs} runs over {len(self.families)} tiny models ({', '.join(self.families)}) "
                f"({self.windowed} in context windows) "
                f"in {self.seconds:.0f} s; RSS after {self.warmup} warm-up runs {self.rss_after_warmup / mib:.0f} MiB, "
                f"peak {self.rss_peak / mib:.0f} MiB, end {self.rss_end / mib:.0f} MiB "
                f"(drift {(self.rss_end - self.rss_after_warmup) / mib:+.1f} MiB); live torch tensors after warm-up "
                f"{self.tensors_after_warmup}, at the end {self.tensors_end}; cache objects alive at the end "
                f"{self.pack_objects_end}; RSS every 50 runs: "
                + ", ".join(f"{r / mib:.0f}" for r in self.rss_checkpoints) + " MiB")


def live_tensor_count() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if isinstance(o, torch.Tensor))


def soak(runs: int = 200, warmup: int = 20, seed: int = 0, cached: bool = True) -> SoakReport:
    """Consecutive cached runs on the same patched models with shapes changing every run
    (``cached=False``: the same runs on the unpatched models, the allocator's own drift). The runs
    cycle through one tiny model per pack family; every model is built, and every family has run
    twice, before the warm-up's measurement, so later growth is the runs' own."""
    logging.getLogger("stepcache").setLevel(logging.ERROR)
    rng = random.Random(seed)
    driver = Driver()
    soaked = coverage().per_family
    warmup = max(warmup, 2 * len(soaked))
    specs = []
    for index in range(runs):
        family = soaked[index % len(soaked)]
        # Settings change with each pass over the families, so each family meets every one. Scale
        # stays at most 2, the largest the tiny models' learned position tables take (SD3, Cosmos).
        turn = index // len(soaked)
        video = takes_frames(driver.tiny.FAMILIES[family])
        # Every other pass puts ComfyUI's context windows on the families that take them, so the
        # per-window caches are soaked too (one schedule after another, before or after the node).
        windows = None
        if family in SOAKED_WINDOWED_MODELS and turn % 2 == 1:
            windows = ("ContextWindowsManual", ("before", "after")[(turn // 2) % 2],
                       SOAKED_WINDOW_SCHEDULES[(turn // 2) % len(SOAKED_WINDOW_SCHEDULES)], 2, 1)
        specs.append(RunSpec(
            family=family, method=("magcache", "teacache")[turn % 2], threshold=5.0,
            estimator=ESTIMATORS[turn % len(ESTIMATORS)], cfg_branches=CFG_BRANCHES[(turn // 2) % 2],
            check=CHECKS[turn % len(CHECKS)], steps=10, cfg=3.0, sampler="euler", scheduler="simple", denoise=1.0,
            batch=rng.choice([1, 2, 3]) if windows is None else 1, scale=rng.choice([1, 2]),
            frames=rng.choice(WINDOWED_FRAMES) if windows else rng.choice([1, 2, 4]) if video else None,
            advanced=None, interrupt_after=None, seed=index, context_windows=windows,
        ))
    models = [driver.reused(spec)[0] if cached else driver.unpatched(spec) for spec in specs]
    process = psutil.Process()
    started = time.perf_counter()
    rss_after_warmup = tensors_after_warmup = rss_peak = 0
    checkpoints = []
    for index, (spec, model) in enumerate(zip(specs, models, strict=True)):
        spec.run(model)
        if (index + 1) % 50 == 0:
            checkpoints.append(process.memory_info().rss)
        if index + 1 == warmup:
            rss_after_warmup = process.memory_info().rss
            tensors_after_warmup = live_tensor_count()
        rss_peak = max(rss_peak, process.memory_info().rss)
    logging.getLogger("stepcache").setLevel(logging.NOTSET)
    return SoakReport(runs, rss_after_warmup, rss_peak, process.memory_info().rss, tensors_after_warmup,
                      live_tensor_count(), len(driver.live_cache_objects()), time.perf_counter() - started,
                      checkpoints, cached, soaked, warmup, sum(spec.context_windows is not None for spec in specs))
