"""The cache inside ComfyUI: settings on the model, run scope, and the block hooks.

How it plugs in (ComfyUI's public patch points only, nothing of ComfyUI's code copied):

- ``install`` clones the MODEL and stores a tensor-free ``CacheSettings`` in its
  transformer_options, an OUTER_SAMPLE wrapper, and a ``patches_replace["dit"]`` hook on every
  block of the stack (families without block hooks get a DIFFUSION_MODEL wrapper instead, which
  caches the whole model's output; see families/output_space.py). With separate CFG branches, a
  CALC_COND_BATCH wrapper also splits a sampler evaluation into one call per group of branches
  when one branch may skip and another must compute.
- ``outer_sample_wrapper`` runs once per sampling run: it builds a fresh ``ActiveRun`` from that
  run's own sigmas, model and conditioning, puts it in the run's transformer_options, and in
  ``finally`` reports and frees it, also on errors and interrupts. Outside a run the hooks only
  call the original blocks, so a model patched here and an unpatched clone of it never interfere.
- the head block hook asks the run's ``RunCache`` to compute or skip the call; on a skip the
  blocks pass their inputs through and the tail returns stack input + the estimated residual,
  which also discards anything added to the stream between blocks (VACE hints and the like),
  since the residuals already contain what was added on the computed steps. With the first-block
  check the head block runs first and the run cache decides from its output.

The method (TeaCache, MagCache, a calibration's measuring run) is a ``cache_core.methods``
settings object that builds its own policy and estimator; nothing here depends on which it is.
A calibration's recorder travels with the measuring model's OUTER_SAMPLE wrapper into its run.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import comfy.model_management
import torch
from comfy.patcher_extension import WrappersMP

from .. import families
from ..cache_core import MethodConfig, RunCache, RunSchedule, StackCall
from ..cache_core.checks import build_check
from ..cache_core.feedback import SamplerResponse, SkipFeedback
from ..cache_core.run_cache import PASSTHROUGH, RunObserver
from ..cache_core.stats import RunStats
from .reporting import report

LOGGER = logging.getLogger("stepcache")

SETTINGS_KEY = "stepcache"  # transformer_options: the node's settings (no tensors: clones deep-copy them)
RUN_KEY = "stepcache_run"  # transformer_options during a sampling run: its ActiveRun
CONTROL_KEY = "stepcache_control"  # transformer_options of one model call: its ControlNet outputs
WRAPPER_KEY = "stepcache"
COMPILE_WRAPPER_KEY = "torch.compile"  # comfy_api.torch_helpers.torch_compile.COMPILE_KEY
# model_options: the compile wrapper Compile Blocks (StepCache) installed (nodes/compile_nodes.py)
BLOCK_COMPILE_KEY = "stepcache_block_compile"
# ComfyUI's own step caches (comfy_extras/nodes_easycache.py), by their OUTER_SAMPLE wrapper key.
NATIVE_CACHES = {"easycache": "EasyCache", "lazycache": "LazyCache"}

# Below this many steps a skipped step costs more quality than it saves (distilled 4-8 step
# models): such runs sample uncached and say so.
MIN_STEPS_TO_CACHE = 10


@dataclass(frozen=True)
class CacheSettings:
    """What an Apply node chose. Deep-copied with every clone of the model: tensor-free."""

    method: MethodConfig  # the method, its thresholds and constants, estimator, branches, check
    family: str
    variant: str = "auto"
    cache_device: str = "main_device"
    node_id: str | None = None
    record_trace: bool = False


class ActiveRun:
    """One sampling run's cache, reachable from every hook through transformer_options."""

    def __init__(self, cache: RunCache, family: families.Family, label: str, constants: str | None,
                 diffusion_model: torch.nn.Module, use_signal: bool, latent_channels: int = 0,
                 scheduled_hooks: list[Any] | None = None,
                 control_ranges: list[tuple[float, float]] | None = None,
                 feedback: SkipFeedback | None = None) -> None:
        self.cache = cache
        self.family = family
        # Output space: the model input's leading channels are the latent it predicts for; any after
        # them are concatenated conditioning (an image to extend, a mask), the same on every step.
        self.latent_channels = latent_channels
        self.label = label  # what the model is, e.g. "flux / flux.1-dev"
        self.constants = constants  # which constants the run uses, and where they came from
        self.diffusion_model = diffusion_model
        self.use_signal = use_signal
        self.call: StackCall = PASSTHROUGH
        # ComfyUI hooks whose keyframes change their strength during the run, and the strengths
        # the kept residuals were computed at.
        self.scheduled_hooks: list[Any] = scheduled_hooks or []
        self.hook_strengths: tuple[float, ...] | None = None
        # ControlNets: the blocks after which ComfyUI adds their outputs inside the stack (all but
        # the tail, after which it adds them to what the tail returns), and the sigma ranges
        # (high, low) of those that act on part of the run only, and which of them act now.
        self.control_keys = family.block_keys(diffusion_model)[:-1]
        self.control_ranges = control_ranges or []
        self.controls_acting: tuple[bool, ...] | None = None
        # Skip feedback (cache_core/feedback.py): the APPLY_MODEL wrapper hands it every call's output.
        self.feedback = feedback

    def release(self) -> RunStats:
        """End of the run: free every tensor and drop the model, and return the statistics.

        Copies of transformer_options made during the run still name this object; ComfyUI used as
        a library with autograd on (uni_pc) can keep such copies in reference cycles through the
        autograd graph that Python's collector cannot free, so nothing heavy may hang off it.
        """
        stats = self.cache.close()
        self.call = PASSTHROUGH
        self.diffusion_model = None
        self.scheduled_hooks = []
        if self.feedback is not None:
            stats = dataclasses.replace(stats, feedback_corrections=self.feedback.corrected)
            self.feedback.close()
            self.feedback = None
        return stats

    def check_reached(self) -> None:
        """After a finished run: if its steps never reached the hooks (a ComfyUI that hands a
        model's blocks no transformer_options, e.g. Wan 2.2 S2V before 0.30.0), say so."""
        cache = self.cache
        if cache.enabled and cache.schedule.steps and not cache.calls_computed + cache.calls_skipped:
            reason = "the model's blocks never reached the cache: this ComfyUI passes them no transformer_options"
            LOGGER.warning("[StepCache] %s: %s; the run was uncached", self.label, reason)
            cache.disable(reason)

    # Block hooks ---------------------------------------------------------------------------

    def run_block(self, hook: BlockHook, args: dict, extra: dict) -> dict:
        if hook.is_head:
            self.call = PASSTHROUGH
            if self.cache.enabled:
                signal = partial(self.family.teacache_signal, self.diffusion_model, args) if self.use_signal else None
                self.call = self._begin(args["transformer_options"], args["img"], signal)
            if self.cache.runs_head_first and self.call.stack_input is not None:
                return self._run_checked_head(hook, args, extra)
        call = self.call
        if call.skip:
            return self._skipped_output(hook, args, call.cached_output) if hook.is_tail else passthrough(args)
        out = hook.run_original(args, extra)
        if hook.is_tail and call.stack_input is not None:
            self._finish_stack(call, hook, args, out["img"])
        return out

    def _run_checked_head(self, hook: BlockHook, args: dict, extra: dict) -> dict:
        """First-block check: the head block runs, then the run cache decides from its output."""
        out = hook.run_original(args, extra)
        head_output = self.family.image_part(hook.kind, out["img"], self.call.stack_input.shape[1],
                                             args["transformer_options"])
        call = self.call = self._after_head(self.call, head_output)
        if call.skip:
            # The head block's real output goes on; the blocks after it pass it through and the tail
            # replaces the stream with the estimate.
            return self._skipped_output(hook, args, call.cached_output) if hook.is_tail else out
        if hook.is_tail and call.stack_input is not None:
            self._finish_stack(call, hook, args, out["img"])
        return out

    def _finish_stack(self, call: StackCall, hook: BlockHook, args: dict, stream: torch.Tensor) -> None:
        """The tail of a computed call: its image tokens, and what ComfyUI added of a ControlNet's
        outputs between the blocks, which the kept residual leaves out (a skipped call adds it anew)."""
        options = args["transformer_options"]
        output = self.family.image_part(hook.kind, stream, call.stack_input.shape[1], options)
        self._finish(call, output, self._control_added(options, output))

    @torch.no_grad()
    def _control_added(self, options: dict, like: torch.Tensor) -> torch.Tensor | None:
        """This call's ControlNet outputs as ComfyUI adds them between the stack's blocks; None
        without a ControlNet (the APPLY_MODEL wrapper hands them over in CONTROL_KEY)."""
        control = options.get(CONTROL_KEY)
        if control is None:
            return None
        return self.family.control_sum(control, self.control_keys, like)

    def run_model(self, executor: Any, x: torch.Tensor, options: dict, args: tuple, kwargs: dict) -> torch.Tensor:
        """Output-space caching of the whole diffusion model (families without block hooks).
        The TeaCache signal is the model input's latent itself."""
        call = PASSTHROUGH
        if self.cache.enabled:
            if 0 < self.latent_channels < x.shape[1]:
                x = x[:, :self.latent_channels]
            call = self._begin(options, x, partial(torch.Tensor.detach, x) if self.use_signal else None)
        self.call = call
        if call.skip:
            return call.cached_output
        out = executor(*args, **kwargs)
        if call.stack_input is not None:
            self._finish(call, out)
        return out

    # The cache's own tensor work never needs autograd (and out= ops refuse it): samplers such as
    # uni_pc run without no_grad when ComfyUI is used as a library.
    @torch.no_grad()
    def _begin(self, options: dict, stack_input: torch.Tensor,
               signal: Callable[[], torch.Tensor] | None) -> StackCall:
        try:
            if self.scheduled_hooks:
                self._follow_hook_keyframes(options["sigmas"])
            if self.control_ranges:
                self._follow_controls(options["sigmas"])
            branches = options.get("cond_or_uncond") or (0,)
            keys = entry_keys(options.get("uuids") or [None] * len(branches), branches,
                              window_key(options.get("context_window")))
            return self.cache.begin(options["sigmas"], keys, branches, stack_input, signal)
        except Exception as error:  # never break sampling over the cache
            self._give_up(error)
            return PASSTHROUGH

    def _follow_hook_keyframes(self, sigma: torch.Tensor) -> None:
        """A hook keyframe changed a strength (ComfyUI switches keyframes before the step's model
        calls): residuals computed at the old weights stand for nothing now, so the cache forgets
        them and this step computes."""
        strengths = tuple(float(hook.strength) for hook in self.scheduled_hooks)
        if self.hook_strengths is not None and strengths != self.hook_strengths:
            self._restart(sigma, "a hook keyframe changed a strength")
        self.hook_strengths = strengths

    def _follow_controls(self, sigma: torch.Tensor) -> None:
        """A ControlNet starts or stops acting (its start/end percent): the kept residuals were
        computed with the old set acting on the blocks, so the cache forgets them and this step
        computes. As ComfyUI decides it: acting while low <= sigma <= high."""
        value = self.cache.sigma_value(sigma)
        acting = tuple(low <= value <= high for high, low in self.control_ranges)
        if self.controls_acting is not None and acting != self.controls_acting:
            self._restart(sigma, "a ControlNet starts or stops")
        self.controls_acting = acting

    def _restart(self, sigma: torch.Tensor, reason: str) -> None:
        self.cache.restart(self.cache.step_of(sigma), reason)
        if self.feedback is not None:
            self.feedback.forget()

    def fed_back(self, denoised: torch.Tensor) -> torch.Tensor:
        """A model call's denoised output as the sampler gets it: after a skip, with the skip's
        estimated error taken back out (the APPLY_MODEL wrapper, once the call's blocks ran)."""
        call = self.call
        if self.feedback is None or not call.entries:  # a call the cache did not decide
            return denoised
        try:
            return self.feedback.output(tuple(entry.key for entry in call.entries), call.step, call.skip, denoised)
        except Exception:  # never break sampling over the feedback
            LOGGER.warning("[StepCache] %s: the skip feedback failed; it is off for the rest of this run",
                           self.family.name, exc_info=True)
            self.feedback = None
            return denoised

    @torch.no_grad()
    def _after_head(self, call: StackCall, head_output: torch.Tensor) -> StackCall:
        try:
            return self.cache.after_head(call, head_output)
        except Exception as error:
            self._give_up(error)
            return PASSTHROUGH

    def plan_branches(self, conds: list, sigma: torch.Tensor, window: Any = None) -> list[list[int]] | None:
        """Separate CFG branches: the groups of branches to evaluate in calls of their own
        (``window``: the context window being evaluated, if any)."""
        if not self.cache.enabled:
            return None
        try:
            uuids = [[c.get("uuid") for c in (branch or ())] for branch in conds]
            if any(uuid is None for branch in uuids for uuid in branch):
                return None
            keys = [entry_keys(branch, [index] * len(branch), window_key(window)) for index, branch in enumerate(uuids)]
            return self.cache.plan_branches(sigma, keys)
        except Exception as error:
            self._give_up(error)
            return None

    @torch.no_grad()
    def _finish(self, call: StackCall, stack_output: torch.Tensor, added: torch.Tensor | None = None) -> None:
        try:
            self.cache.finish(call, stack_output, added)
        except Exception as error:
            self._give_up(error)

    def _give_up(self, error: Exception) -> None:
        LOGGER.warning("[StepCache] %s: the cache failed (%r); the rest of this run samples uncached",
                       self.family.name, error, exc_info=True)
        self.cache.disable(f"cache error: {error!r}")

    @torch.no_grad()
    def _skipped_output(self, hook: BlockHook, args: dict, cached: torch.Tensor) -> dict:
        """The tail of a skipped call: stack input + estimated residual, plus this call's ControlNet
        outputs where ComfyUI adds them between the blocks (the residual holds none)."""
        options = args["transformer_options"]
        added = self._control_added(options, cached)
        out = passthrough(args)
        out["img"] = self.family.with_image(hook.kind, args["img"], cached if added is None else added.add_(cached),
                                            options)
        return out


def entry_keys(uuids: list, branches: list[int] | tuple[int, ...], window: tuple | None = None) -> list[tuple]:
    """A key per conditioning entry of a call: (uuid, branch, occurrence), and the context window's
    key where the call evaluates one. The uuid alone is not unique: for area conditioning ComfyUI
    gives the other branch a copy of an entry, uuid and all
    (samplers.create_cond_with_same_area_if_none), so both branches' entries carry it."""
    seen: dict[tuple, int] = {}
    keys = []
    for uuid, branch in zip(uuids, branches, strict=True):
        occurrence = seen.get((uuid, branch), 0)
        seen[(uuid, branch)] = occurrence + 1
        keys.append((uuid, branch, occurrence) if window is None else (uuid, branch, occurrence, window))
    return keys


def window_key(window: Any) -> tuple | None:
    """What tells ComfyUI's context windows apart (transformer_options["context_window"], an
    IndexListContextWindow): the latent frames it holds, and the frame before them that
    causal_window_fix (ComfyUI 0.30.0) puts in front. Each window then has entries of its own."""
    if window is None:
        return None
    return tuple(window.index_list), getattr(window, "causal_anchor_index", None)


def passthrough(args: dict) -> dict:
    """A skipped block returns its stream arguments unchanged."""
    return {key: args[key] for key in ("img", "txt") if key in args}


class BlockHook:
    """A ``patches_replace["dit"]`` entry. Holds no tensors (it is deep-copied with the model);
    chains to the hook another pack put on the same block, if any."""

    def __init__(self, kind: str, is_head: bool, is_tail: bool, previous: Any = None) -> None:
        self.kind = kind
        self.is_head = is_head
        self.is_tail = is_tail
        self.previous = previous

    def __call__(self, args: dict, extra: dict) -> dict:
        options = args.get("transformer_options")
        run = options.get(RUN_KEY) if options is not None else None
        if run is None:
            return self.run_original(args, extra)
        return run.run_block(self, args, extra)

    def run_original(self, args: dict, extra: dict) -> dict:
        if self.previous is not None:
            return self.previous(args, extra)
        return extra["original_block"](args)


def diffusion_model_wrapper(executor: Any, *args: Any, **kwargs: Any) -> Any:
    """DIFFUSION_MODEL wrapper for families without block hooks."""
    options = kwargs.get("transformer_options")
    if not isinstance(options, dict):
        options = args[-1] if args and isinstance(args[-1], dict) else {}
    run = options.get(RUN_KEY)
    if run is None:
        return executor(*args, **kwargs)
    return run.run_model(executor, args[0], options, args, kwargs)


def apply_model_wrapper(executor: Any, x: torch.Tensor, t: torch.Tensor, c_concat: Any = None, c_crossattn: Any = None,
                        control: dict | None = None, transformer_options: dict | None = None, **kwargs: Any) -> Any:
    """APPLY_MODEL wrapper (BaseModel.apply_model's arguments): hands a call's ControlNet outputs
    to the block hooks, which take them out of the residual they keep and add them on a skip, and
    the call's denoised output to the run's skip feedback."""
    transformer_options = {} if transformer_options is None else transformer_options  # apply_model's default
    run = transformer_options.get(RUN_KEY)
    if run is None:
        return executor(x, t, c_concat, c_crossattn, control, transformer_options, **kwargs)
    if control is not None:
        transformer_options = {**transformer_options, CONTROL_KEY: control}
    if run.feedback is None:
        return executor(x, t, c_concat, c_crossattn, control, transformer_options, **kwargs)
    run.call = PASSTHROUGH
    return run.fed_back(executor(x, t, c_concat, c_crossattn, control, transformer_options, **kwargs))


def calc_cond_batch_wrapper(executor: Any, model: Any, conds: list, x_in: torch.Tensor, timestep: torch.Tensor,
                            model_options: dict, *args: Any, **kwargs: Any) -> list:
    """CALC_COND_BATCH wrapper (separate CFG branches): when the run cache asks for it, one
    sampler evaluation becomes a call per group of branches (those that compute first), each
    through ComfyUI's own cond batching; the branches' outputs are put back together."""
    options = model_options.get("transformer_options", {})
    run = options.get(RUN_KEY)
    groups = run.plan_branches(conds, timestep, options.get("context_window")) if run is not None else None
    if groups is None:
        return executor(model, conds, x_in, timestep, model_options, *args, **kwargs)
    outputs = [None] * len(conds)
    for group in groups:
        part = [branch if index in group else None for index, branch in enumerate(conds)]
        result = executor(model, part, x_in, timestep, model_options, *args, **kwargs)
        for index in group:
            outputs[index] = result[index]
    return outputs


# Run scope -------------------------------------------------------------------------------


class OuterSampleWrapper:
    """OUTER_SAMPLE wrapper: one fresh ActiveRun per sampling run, freed when it ends.

    ``observer`` (a calibration's recorder) is handed to every run of the model it was installed
    on; wrappers are shared between clones, never deep-copied, so it reaches the run as is."""

    def __init__(self, observer: RunObserver | None = None) -> None:
        self.observer = observer

    def __call__(self, executor: Any, *args: Any, **kwargs: Any) -> Any:
        guider = executor.class_obj
        options = guider.model_options.setdefault("transformer_options", {})
        settings = options.get(SETTINGS_KEY)
        if settings is None or RUN_KEY in options:
            return executor(*args, **kwargs)
        try:
            run = start_run(settings, guider, *args, observer=self.observer, **kwargs)
        except Exception:
            LOGGER.warning("[StepCache] could not set up the cache; this run samples uncached", exc_info=True)
            run = None
        if run is None:
            return executor(*args, **kwargs)
        options[RUN_KEY] = run
        try:
            out = executor(*args, **kwargs)
            run.check_reached()
            return out
        finally:
            options.pop(RUN_KEY, None)
            finish_run(settings, run, run.release())


outer_sample_wrapper = OuterSampleWrapper()


def finish_run(settings: CacheSettings, run: ActiveRun, stats: RunStats) -> None:
    report(settings.node_id, run.label, dataclasses.replace(stats, constants=run.constants))


def start_run(settings: CacheSettings, guider: Any, noise: torch.Tensor, latent_image: torch.Tensor,
              sampler: Any, sigmas: torch.Tensor, denoise_mask: torch.Tensor | None = None,
              *args: Any, observer: RunObserver | None = None, **kwargs: Any) -> ActiveRun | None:
    patcher = guider.model_patcher
    model = patcher.model
    family = families.family_for(model)
    if family is None or family.name != settings.family:
        LOGGER.warning("[StepCache] the model is not the %s model the cache was set up for; uncached",
                       settings.family)
        return None
    model_sampling = patcher.get_model_object("model_sampling")
    schedule = RunSchedule.from_sigmas(sigmas.reshape(-1).tolist(), model_sampling.percent_to_sigma)
    context = families.RunContext(
        conds=getattr(guider, "conds", None), latent_shape=tuple(latent_image.shape),
        steps=schedule.steps, has_denoise_mask=denoise_mask is not None,
    )
    detected = family.resolve_variant(model, context)
    chosen = family.variant(settings.variant) if settings.variant != "auto" else None
    # The label says what the model is: a chosen variant only where the model has its architecture
    # (e.g. Wan 2.2 A14B, which cannot be told from Wan 2.1 14B).
    shown = chosen if chosen is not None and family.has_architecture(model, chosen) else detected
    method = settings.method
    policy = method.build_policy(schedule, chosen or detected)
    constants = method.describe_constants(chosen or detected, chosen is not None)
    blocks = len(family.block_keys(model.diffusion_model))
    check = build_check(method.check, method.check_tolerance)
    if check is not None and check.runs_head_first and not blocks:
        LOGGER.info("[StepCache] %s: the first-block check needs block hooks, which ComfyUI does not give "
                    "this family; it is off for this model", family.name)
        check = None
    cache = RunCache(
        schedule, policy, cache_device=resolve_cache_device(settings.cache_device), calibrating=method.calibrates,
        record_trace=settings.record_trace, observer=observer, check=check,
        head_cost=1.0 / blocks if blocks else 0.0, cfg=guidance_scale(guider),
    )
    if policy.guidance_note:
        constants = f"{constants}; {policy.guidance_note}" if constants else policy.guidance_note
    reason = reason_not_to_skip(settings, guider, schedule, family)
    if reason is not None:
        cache.disable(reason)
    feedback = None
    if method.feedback and cache.enabled:
        feedback, note = skip_feedback(sampler, schedule)
        policy.use_feedback(feedback is not None)
        if policy.feedback_note:
            note = f"{note} ({policy.feedback_note})"
        constants = f"{constants}; {note}" if constants else note
    if family.caches_in_output_space and cache.enabled:
        policy.use_output_space()  # the levels were chosen in the block stack's space
        if policy.space_note:
            constants = f"{constants}; {policy.space_note}" if constants else policy.space_note
    use_signal = policy.uses_signal and cache.enabled
    label = f"{family.name} / {shown.label}"
    latent_channels = model.latent_format.latent_channels if family.caches_in_output_space else 0
    conds = getattr(guider, "conds", None) or {}
    return ActiveRun(cache, family, label, constants, model.diffusion_model, use_signal, latent_channels,
                     scheduled_hooks(conds), control_ranges(conds, model_sampling.percent_to_sigma), feedback)


def skip_feedback(sampler: Any, schedule: RunSchedule) -> tuple[SkipFeedback | None, str]:
    """The run's skip feedback, from its sampler run on scalars (a KSAMPLER's k-diffusion-style
    sampler function), or None where the sampler does not allow it; and what the log says."""
    sampler_function = getattr(sampler, "sampler_function", None)
    if sampler_function is None:
        return None, "skip feedback off: the sampler cannot be run on its own"
    sigmas = torch.tensor(schedule.sigmas, dtype=torch.float64)
    options = getattr(sampler, "extra_options", None) or {}

    def run_sampler(denoiser: Callable[..., torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        return sampler_function(denoiser, x, sigmas, extra_args={}, callback=None, disable=True, **options)

    try:
        response = SamplerResponse.measure(run_sampler, schedule.steps)
    except Exception as error:  # a sampler that needs more than a denoiser (a model, its options)
        LOGGER.debug("[StepCache] the sampler could not be run on scalars", exc_info=True)
        return None, f"skip feedback off: the sampler could not be run on its own ({type(error).__name__})"
    if isinstance(response, str):
        return None, f"skip feedback off: {response}"
    return SkipFeedback(response, schedule.sigmas), "skip feedback on"


def guidance_scale(guider: Any) -> float | None:
    """The run's CFG scale where the guider has one (ComfyUI's CFGGuider), else None."""
    cfg = getattr(guider, "cfg", None)
    return float(cfg) if isinstance(cfg, (int, float)) else None


def reason_not_to_skip(settings: CacheSettings, guider: Any, schedule: RunSchedule,
                       family: families.Family) -> str | None:
    """Runs where skipping would be wrong or pointless sample uncached, with one logged reason."""
    if settings.method.calibrates:
        return None
    if schedule.steps < MIN_STEPS_TO_CACHE:
        return f"only {schedule.steps} steps: skipping would cost quality for little time"
    conds = getattr(guider, "conds", None) or {}
    if (not family.control_lists and not family.caches_in_output_space
            and any(c.get("control") is not None for entries in conds.values() for c in entries or ())):
        return (f"ComfyUI adds a ControlNet's outputs between the {family.name} model's blocks in a way the "
                "cache cannot keep apart from the residuals it reuses")
    windows = context_windows_refused(guider.model_options.get("context_handler"))
    if windows is not None:
        return windows
    if compiled_whole(guider.model_patcher):
        return ("torch.compile of the whole model (TorchCompileModel) is on: its graphs cannot take per-step "
                "skip decisions; put Compile Blocks (StepCache) in its place, which compiles each transformer "
                "block and leaves the decisions between them to the cache")
    for key, name in NATIVE_CACHES.items():
        if guider.model_patcher.get_wrappers(WrappersMP.OUTER_SAMPLE, key):
            return (f"ComfyUI's {name} is also on this model: two step caches would reuse each other's "
                    f"stale outputs; remove one of them")
    return replaced_hook(guider, family, guider.model_patcher.model.diffusion_model)


def control_ranges(conds: dict, percent_to_sigma: Callable[[float], float]) -> list[tuple[float, float]]:
    """The sigma ranges (high, low) of the run's ControlNets (each chained one too) that act on
    part of the run only (a start or end percent), as ComfyUI's ControlBase.pre_run computes them,
    rounded to float32 as its comparison with the model's sigma is made."""
    ranges: list[tuple[float, float]] = []
    seen: set[int] = set()
    for entries in conds.values():
        for cond in entries or ():
            control = cond.get("control")
            while control is not None and id(control) not in seen:
                seen.add(id(control))
                start, end = getattr(control, "timestep_percent_range", (0.0, 1.0))
                if (start, end) != (0.0, 1.0):
                    bounds = torch.tensor([percent_to_sigma(start), percent_to_sigma(end)], dtype=torch.float32)
                    ranges.append((float(bounds[0]), float(bounds[1])))
                control = getattr(control, "previous_controlnet", None)
    return ranges


# ComfyUI's context schedule that shifts every window at every step (comfy/context_windows.py).
LOOPED_SCHEDULE = "looped_uniform"


def context_windows_refused(handler: Any) -> str | None:
    """Context windows are cached per window (``window_key``) for ComfyUI's index-list windows,
    except where no window's residual can serve its next step."""
    if handler is None:
        return None
    schedule = getattr(handler, "context_schedule", None)
    if schedule is None:
        return f"context windows of another kind ({type(handler).__name__}) than ComfyUI's index lists"
    if getattr(schedule, "name", None) == LOOPED_SCHEDULE:
        return (f"the {LOOPED_SCHEDULE} context schedule moves every window at every step, so no window's "
                "residual could serve its next step; standard_static, standard_uniform and batched are cached")
    return None


def scheduled_hooks(conds: dict) -> list[Any]:
    """The hooks on the run's conditioning (ComfyUI's hooks: a LoRA or model weights hooked to a
    prompt) whose keyframes change their strength during sampling."""
    found: list[Any] = []
    for entries in conds.values():
        for cond in entries or ():
            for hook in getattr(cond.get("hooks"), "hooks", ()):
                keyframes = getattr(getattr(hook, "hook_keyframe", None), "keyframes", ())
                if len({float(keyframe.strength) for keyframe in keyframes}) > 1 and hook not in found:
                    found.append(hook)
    return found


def wraps_block_hook(patch: Any) -> bool:
    """The cache's hook itself, or a patch that wraps it and says so the Python way (the hook as its
    ``__wrapped__``, as ``functools.wraps`` sets it), so the hook still runs for its block."""
    for _ in range(16):  # a chain of wrappers, never a cycle
        if isinstance(patch, BlockHook):
            return True
        patch = getattr(patch, "__wrapped__", None)
        if patch is None:
            return False
    return False


def replaced_hook(guider: Any, family: families.Family, diffusion_model: torch.nn.Module) -> str | None:
    """A block whose hook another node replaced after the Apply node (its own patch on the same
    block): the cache would not see that block, so a skip could drop the patch's effect or return a
    stale output. Such a run computes every step. (A patch put on before Apply is chained: it runs
    on every computed step, inside the cached residual. One put on after that wraps the hook, with
    the hook as its ``__wrapped__``, keeps the cache.)"""
    patches = guider.model_options.get("transformer_options", {}).get("patches_replace", {}).get("dit", {})
    for kind, index in family.block_keys(diffusion_model):
        if not wraps_block_hook(patches.get((kind, index))):
            return (f"another node replaced the cache's hook on {kind} {index} after the Apply node; "
                    "place the Apply node after it, so its patch runs inside the cache")
    return None


def compiled_whole(model: Any) -> bool:
    """True when a torch.compile wrapper is on the model that is not Compile Blocks (StepCache)'s
    own (block by block, hence compatible): TorchCompileModel's, or one added after it."""
    wrappers = model.get_wrappers(WrappersMP.APPLY_MODEL, COMPILE_WRAPPER_KEY)
    if not wrappers:
        return False
    ours = model.model_options.get(BLOCK_COMPILE_KEY)
    return ours is None or len(wrappers) != 1 or wrappers[0] is not ours.wrapper


def resolve_cache_device(choice: str) -> torch.device | None:
    if choice == "offload_device":
        return comfy.model_management.unet_offload_device()
    return None


# Installing ------------------------------------------------------------------------------


def install(model: Any, settings: CacheSettings, family: families.Family,
            observer: RunObserver | None = None) -> Any:
    """A clone of ``model`` (a ComfyUI ModelPatcher) with the cache hooks; ``model`` is untouched.
    ``observer``: a calibration's recorder, shown every run of the clone."""
    patched = model.clone()
    for wrapper_type in (WrappersMP.OUTER_SAMPLE, WrappersMP.DIFFUSION_MODEL, WrappersMP.CALC_COND_BATCH,
                         WrappersMP.APPLY_MODEL):
        patched.remove_wrappers_with_key(wrapper_type, WRAPPER_KEY)
    patched.model_options.setdefault("transformer_options", {})[SETTINGS_KEY] = settings
    wrapper = outer_sample_wrapper if observer is None else OuterSampleWrapper(observer)
    patched.add_wrapper_with_key(WrappersMP.OUTER_SAMPLE, WRAPPER_KEY, wrapper)
    if settings.method.separate_branches:
        patched.add_wrapper_with_key(WrappersMP.CALC_COND_BATCH, WRAPPER_KEY, calc_cond_batch_wrapper)

    keys = family.block_keys(patched.model.diffusion_model)
    if not keys:
        patched.add_wrapper_with_key(WrappersMP.DIFFUSION_MODEL, WRAPPER_KEY, diffusion_model_wrapper)
        if settings.method.feedback:
            patched.add_wrapper_with_key(WrappersMP.APPLY_MODEL, WRAPPER_KEY, apply_model_wrapper)
        return patched
    if family.control_lists or settings.method.feedback:
        patched.add_wrapper_with_key(WrappersMP.APPLY_MODEL, WRAPPER_KEY, apply_model_wrapper)
    existing = patched.model_options["transformer_options"].get("patches_replace", {}).get("dit", {})
    for position, (kind, index) in enumerate(keys):
        previous = existing.get((kind, index))
        if isinstance(previous, BlockHook):  # ours, from an earlier Apply node: replace it
            previous = previous.previous
        hook = BlockHook(kind, is_head=position == 0, is_tail=position == len(keys) - 1, previous=previous)
        patched.set_model_patch_replace(hook, "dit", kind, index)
    return patched


def installed_settings(model: Any) -> CacheSettings | None:
    return model.model_options.get("transformer_options", {}).get(SETTINGS_KEY)


__all__ = [
    "RUN_KEY",
    "SETTINGS_KEY",
    "ActiveRun",
    "BlockHook",
    "CacheSettings",
    "OuterSampleWrapper",
    "calc_cond_batch_wrapper",
    "install",
    "installed_settings",
    "outer_sample_wrapper",
]
