"""Run scope: every sampling run gets its own cache state, built from its own schedule, and frees it.

All runs go through ComfyUI's real KSampler / KSamplerAdvanced paths on tiny random-weight models.
The cache is forced to skip (MagCache with a huge threshold and no limit on consecutive skips), so
a state leak, a wrong step index or a branch mix-up shows in the outputs or in the statistics.

Families: flux (double + single blocks over cat(txt, img)), wan21 (5-D video latents) and lumina2
(no block hooks: cached in output space through the DIFFUSION_MODEL wrapper); hunyuan_video where
a test needs cond and uncond in separate calls (lumina2's conditioning cannot be split that way
without changing the model input).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
import torch

FAMILIES = ["flux", "wan21", "lumina2"]
VIDEO_FAMILIES = {"wan21", "hunyuan_video"}
# Families ComfyUI gives no block hooks: cached in output space (a DIFFUSION_MODEL wrapper).
OUTPUT_SPACE = {"lumina2"}
# Huge threshold, no limit on consecutive skips, no retention: every step wants to skip, so a run
# computes only where it has no residual of its own yet (its first step) and then skips nearly
# everything. A residual left over from an earlier run would be used at once (step 0), and any
# misplaced residual shows in the output.
FORCED_SKIP = dict(threshold=5.0, max_consecutive_skips=100, retention_ratio=0.0)
STEPS = 12


# Helpers -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def h(host: Any) -> SimpleNamespace:
    """The harness and the pack's modules, imported once the host has booted."""
    import comfy.model_management
    import nodes

    from harness import sampling

    return SimpleNamespace(
        sampling=sampling,
        Job=sampling.Job,
        nodes=nodes,
        runtime=sampling.pack("nodes.runtime"),
        run_cache=sampling.pack("cache_core.run_cache"),
        flux_dev=sampling.pack("families.published_magcache").FLUX_DEV,
        interrupt=comfy.model_management.InterruptProcessingException,
    )


@pytest.fixture
def log(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger="stepcache")
    return caplog


def assert_no_cache_warnings(log: pytest.LogCaptureFixture) -> None:
    """The cache logged its runs (so the capture works) and never gave up or warned."""
    records = [r for r in log.records if r.name.startswith("stepcache")]
    assert any("[StepCache]" in r.getMessage() for r in records), "no run was reported"
    problems = [r.getMessage() for r in records if r.levelno >= logging.WARNING]
    assert not problems, problems


def build(h: SimpleNamespace, family: str, seed: int = 0) -> Any:
    return h.sampling.tiny().build_model(family, seed)


def forced(h: SimpleNamespace, model: Any, family: str, **overrides: Any) -> tuple[Any, str]:
    """ApplyMagCache (the node's own execute) with settings that skip nearly every step. Tiny models
    are no published checkpoint: they get FLUX.1-dev's table as a connected input (only the
    mechanics matter)."""
    inputs: dict[str, Any] = {**FORCED_SKIP, "ratios": h.flux_dev, **overrides}
    return h.sampling.apply(model, "magcache", **inputs)


def fresh_forced(h: SimpleNamespace, family: str, **overrides: Any) -> tuple[Any, str]:
    return forced(h, build(h, family), family, **overrides)


def stats(h: SimpleNamespace, node_id: str) -> dict:
    return h.sampling.stats(node_id)


def patterns(h: SimpleNamespace, node_id: str) -> dict[str, str]:
    return h.sampling.patterns(node_id)


def assert_run_skipped(h: SimpleNamespace, node_id: str, steps: int, branches: set[str]) -> dict[str, str]:
    """The node's last run was cached, consistent, and skipped steps on every branch."""
    run = stats(h, node_id)
    assert run["disabled_reason"] is None, run["disabled_reason"]
    assert run["steps"] == steps
    found = patterns(h, node_id)
    assert set(found) == branches
    for branch in run["branches"]:
        assert branch["steps_computed"] + branch["steps_skipped"] == steps, branch
        assert len(branch["pattern"]) == steps, branch
        assert branch["steps_skipped"] > 0, branch
        assert branch["pattern"][0] == "C", branch  # nothing cached yet at a run's first step
    return found


def sample(h: SimpleNamespace, job: Any, model: Any, negative: list | None = None) -> torch.Tensor:
    """KSampler like ``Job.run``, optionally with another negative conditioning."""
    positive, default_negative = job.conds()
    return h.nodes.common_ksampler(
        model, job.seed, job.steps, job.cfg, job.sampler, job.scheduler, positive,
        default_negative if negative is None else negative, job.latent(), denoise=job.denoise,
    )[0]["samples"]


@dataclass
class ModelCall:
    branches: tuple[int, ...]
    run: Any
    step: int
    skipped: bool
    sigma: float  # the sigma of the call
    schedule: tuple[float, ...]  # the run's sigmas as ComfyUI hands them to the model (sample_sigmas)


@dataclass
class Spy:
    """A model_function_wrapper: sees every model call of a run, skipped or computed.

    ``after(call, output, transformer_options)`` runs after each call. Shared, not copied, by
    clones of the model (ComfyUI deep-copies model_options on clone).
    """

    after: Callable[[ModelCall, torch.Tensor, dict], None] | None = None
    calls: list[ModelCall] = field(default_factory=list)

    def __deepcopy__(self, memo: dict) -> Spy:
        return self

    def __call__(self, apply_model: Callable[..., torch.Tensor], params: dict) -> torch.Tensor:
        options = params["c"]["transformer_options"]
        run = options.get("stepcache_run")
        skipped_before = run.cache.calls_skipped if run is not None else 0
        output = apply_model(params["input"], params["timestep"], **params["c"])
        call = ModelCall(
            branches=tuple(params["cond_or_uncond"]),
            run=run,
            step=run.cache.current_step if run is not None else -1,
            skipped=run is not None and run.cache.calls_skipped > skipped_before,
            sigma=float(options["sigmas"].reshape(-1)[0]),
            schedule=tuple(float(s) for s in options["sample_sigmas"].reshape(-1)),
        )
        self.calls.append(call)
        if self.after is not None:
            self.after(call, output, options)
        return output


def spy_on(model: Any, spy: Spy) -> Spy:
    model.set_model_unet_function_wrapper(spy)
    return spy


# 1. No state carries over between runs -------------------------------------------------------


def other_runs(h: SimpleNamespace, family: str) -> Iterator[tuple[str, Any]]:
    """Runs B, each differing from A = Job(family, steps=12) in one respect."""
    job = h.Job
    yield "resolution x2", job(family, scale=2)
    yield "batch 2", job(family, batch=2)
    if family in VIDEO_FAMILIES:
        yield "5 frames", job(family, frames=5)
    yield "15 steps", job(family, steps=15)
    yield "sampler heun", job(family, sampler="heun")
    yield "cfg 1", job(family, cfg=1.0)
    yield "all at once", job(family, scale=2, batch=2, steps=10, sampler="dpmpp_2m", cfg=5.0,
                             frames=2 if family in VIDEO_FAMILIES else None)


@pytest.mark.parametrize("family", FAMILIES)
def test_no_state_carries_over_between_runs(h, log, family):
    model = build(h, family)
    patched, node = forced(h, model, family)
    run_a = h.Job(family, steps=STEPS)

    first_a = run_a.run(patched)
    pattern_a = assert_run_skipped(h, node, STEPS, {"cond", "uncond"})

    for label, run_b in other_runs(h, family):
        out_b = run_b.run(patched)
        branches = {"cond"} if run_b.cfg == 1.0 else {"cond", "uncond"}
        pattern_b = assert_run_skipped(h, node, run_b.steps, branches)
        assert out_b.shape == run_b.latent()["samples"].shape, label

        fresh, fresh_node = fresh_forced(h, family)
        expected = run_b.run(fresh)
        assert patterns(h, fresh_node) == pattern_b, label
        assert torch.equal(out_b, expected), f"{label}: differs from the same run on a freshly patched model"

    second_a = run_a.run(patched)
    assert patterns(h, node) == pattern_a
    assert torch.equal(first_a, second_a), "run A changed after the other runs"
    assert_no_cache_warnings(log)


# 2. A patched and an unpatched clone of one model, used alternately ----------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_patched_and_unpatched_clones_do_not_interfere(h, log, family):
    model = build(h, family)
    job = h.Job(family, steps=STEPS)
    reference = job.run(model)  # before any patching

    patched, node = forced(h, model, family)
    plain = model.clone()
    patched_outputs, plain_outputs = [], []
    for _ in range(2):
        patched_outputs.append(job.run(patched))
        assert_run_skipped(h, node, STEPS, {"cond", "uncond"})
        plain_outputs.append(job.run(plain))
        plain_outputs.append(job.run(model))  # the model the patch was applied to

    for output in plain_outputs:
        assert torch.equal(output, reference)
    assert torch.equal(patched_outputs[0], patched_outputs[1])
    # The cache really changed the patched runs (it skipped), so the equalities above mean something.
    assert not torch.equal(patched_outputs[0], reference)
    assert_no_cache_warnings(log)


# 3. State is freed when a run ends by an exception or an interrupt -------------------------------

FAIL_AT_STEP = 5


class Tripwire:
    """Raises ``error`` once a run reaches FAIL_AT_STEP (while ``armed``); remembers the runs seen."""

    def __init__(self, error: type[Exception]) -> None:
        self.error = error
        self.armed = True
        self.runs: list[Any] = []

    def check(self, run: Any) -> None:
        if run is None:
            return
        if not any(run is r for r in self.runs):
            self.runs.append(run)
        if self.armed and run.cache.current_step == FAIL_AT_STEP:
            raise self.error(f"test failure at step {FAIL_AT_STEP}")


def install_tripwire(h: SimpleNamespace, patched: Any, tripwire: Tripwire) -> None:
    """Block families: a hook of ours on the head block, around the pack's (which it calls, so the
    chain stays), raising once the head has begun the call: the rest of the stack never runs.
    Output-space families (no block hooks): a model_function_wrapper, raising after the call."""
    dit = patched.model_options["transformer_options"].get("patches_replace", {}).get("dit", {})
    head_hooks = [(key, hook) for key, hook in dit.items() if isinstance(hook, h.runtime.BlockHook) and hook.is_head]
    if not head_hooks:
        spy_on(patched, Spy(after=lambda call, output, options: tripwire.check(call.run)))
        return
    (kind, index), pack_hook = head_hooks[0]

    def failing_head(args: dict, extra: dict) -> dict:
        out = pack_hook(args, extra)
        tripwire.check(args["transformer_options"].get(h.runtime.RUN_KEY))
        return out

    failing_head.__wrapped__ = pack_hook  # it wraps the pack's hook, and says so: the cache stays on
    patched.set_model_patch_replace(failing_head, "dit", kind, index)


@pytest.mark.parametrize("error", ["interrupt", "exception"])
@pytest.mark.parametrize("family", FAMILIES)
def test_state_is_freed_when_a_run_fails(h, family, error):
    error_type = h.interrupt if error == "interrupt" else RuntimeError
    patched, node = fresh_forced(h, family)
    tripwire = Tripwire(error_type)
    install_tripwire(h, patched, tripwire)
    job = h.Job(family, steps=STEPS)

    with pytest.raises(error_type, match="test failure"):
        job.run(patched)

    assert len(tripwire.runs) == 1
    run = tripwire.runs[0]
    assert run.cache._entries == {}
    assert run.cache.held_tensors() == []
    assert run.call is h.run_cache.PASSTHROUGH
    assert h.runtime.RUN_KEY not in patched.model_options["transformer_options"]
    # The failed run was still reported, up to the step it reached.
    failed = stats(h, node)
    assert failed["steps"] == STEPS
    assert all(len(b["pattern"]) == FAIL_AT_STEP + 1 for b in failed["branches"]), failed["branches"]

    tripwire.armed = False
    after = job.run(patched)
    assert len(tripwire.runs) == 2 and tripwire.runs[1] is not run  # a new ActiveRun
    pattern = assert_run_skipped(h, node, STEPS, {"cond", "uncond"})
    fresh, fresh_node = fresh_forced(h, family)
    assert torch.equal(after, job.run(fresh))
    assert patterns(h, fresh_node) == pattern


# 4. The step index comes from the schedule, whatever the sampler ---------------------------------

SAMPLER_CALLS_PER_STEP = {
    "euler": 1, "heun": 2, "dpmpp_2s_ancestral": 2, "dpmpp_sde": 2, "uni_pc": 1, "dpmpp_2m": 1,
}


@pytest.mark.parametrize("sampler", list(SAMPLER_CALLS_PER_STEP))
@pytest.mark.parametrize("family", FAMILIES)
def test_step_index_comes_from_the_schedule(h, log, family, sampler):
    patched, node = fresh_forced(h, family)
    spy = spy_on(patched, Spy())
    with torch.inference_mode():  # as ComfyUI's executor runs every node (uni_pc has no no_grad)
        h.Job(family, steps=STEPS, sampler=sampler).run(patched)

    run = stats(h, node)
    assert_run_skipped(h, node, STEPS, {"cond", "uncond"})
    calls = len(spy.calls)
    assert run["calls_computed"] + run["calls_skipped"] == calls
    assert all(call.branches in ((0, 1), (1, 0)) for call in spy.calls)  # one batched call per evaluation
    if SAMPLER_CALLS_PER_STEP[sampler] > 1:
        assert calls > STEPS  # several model calls per step ...
    else:
        assert calls == STEPS
    steps = [call.step for call in spy.calls]
    assert steps == sorted(steps)  # ... mapped to steps that never go back
    assert set(steps) == set(range(STEPS))  # and cover every step of the run
    for call in spy.calls:
        # The step whose interval of the run's own schedule holds the call's sigma (a call at a
        # schedule sigma starts that step), not a count of calls.
        high, low = call.schedule[call.step], call.schedule[call.step + 1]
        assert high * (1 + 1e-5) >= call.sigma > low * (1 + 1e-5), (call.step, call.sigma, call.schedule)
    assert_no_cache_warnings(log)


def test_uni_pc_caches_with_autograd_on(h, log):
    """ComfyUI used as a library (no executor, so no inference_mode): ComfyUI's uni_pc, unlike the
    k-diffusion samplers, does not turn autograd off, and the tiny model's weights require grad.
    The cache must still work there (it is a sampling optimisation, grad mode is not its concern)."""
    patched, node = fresh_forced(h, "flux")
    assert torch.is_grad_enabled()
    h.Job("flux", steps=STEPS, sampler="uni_pc").run(patched)
    assert_run_skipped(h, node, STEPS, {"cond", "uncond"})
    assert_no_cache_warnings(log)


# 5. CFG branches: cfg 1, batched cond + uncond, separate calls -----------------------------------


def unbatchable_negative(family: str, negative: list) -> list:
    """The same model input, in a form ComfyUI cannot batch with the positive.

    flux / hunyuan_video: the model reads y[:, :vec_in_dim], so a pooled vector 8 columns wider
    whose first columns are the original gives the same input but another cond shape.
    wan21: the text context, every token twice: cross-attention (the only reader of the context)
    gives the same result, but the context has another length.
    """
    (context, extra), = negative
    if family == "wan21":
        return [[torch.cat((context, context), dim=1), dict(extra)]]
    pooled = extra["pooled_output"]
    wider = torch.cat((pooled, torch.randn(pooled.shape[0], 8, generator=torch.Generator().manual_seed(7))), dim=1)
    return [[context, {**extra, "pooled_output": wider}]]


def test_cfg_1_runs_only_the_cond_branch(h, log):
    for family in FAMILIES:
        patched, node = fresh_forced(h, family)
        spy = spy_on(patched, Spy())
        h.Job(family, steps=STEPS, cfg=1.0).run(patched)
        assert_run_skipped(h, node, STEPS, {"cond"})
        assert {call.branches for call in spy.calls} == {(0,)}
    assert_no_cache_warnings(log)


@pytest.mark.parametrize("family", ["flux", "wan21", "hunyuan_video"])
def test_cond_and_uncond_batched_or_separate_decide_alike(h, log, family):
    job = h.Job(family, steps=STEPS, cfg=3.0)

    batched_model, batched_node = fresh_forced(h, family)
    batched_spy = spy_on(batched_model, Spy())
    batched = sample(h, job, batched_model)
    batched_patterns = assert_run_skipped(h, batched_node, STEPS, {"cond", "uncond"})
    assert batched_patterns["cond"] == batched_patterns["uncond"]  # MagCache decisions are data-independent
    assert all(len(call.branches) == 2 for call in batched_spy.calls)

    separate_model, separate_node = fresh_forced(h, family)
    separate_spy = spy_on(separate_model, Spy())
    _, negative = job.conds()
    separate = sample(h, job, separate_model, unbatchable_negative(family, negative))
    assert sorted(call.branches for call in separate_spy.calls) == sorted(
        [(0,), (1,)] * len(batched_spy.calls)
    ), "cond and uncond were not evaluated in separate calls"
    assert assert_run_skipped(h, separate_node, STEPS, {"cond", "uncond"}) == batched_patterns
    run = stats(h, separate_node)
    assert run["calls_computed"] + run["calls_skipped"] == 2 * len(batched_spy.calls)
    torch.testing.assert_close(separate, batched, atol=1e-4, rtol=0)
    assert_no_cache_warnings(log)


# 6. Partial schedules: KSamplerAdvanced, denoise < 1, two-stage graphs ---------------------------


def test_progress_inverts_a_real_models_percent_to_sigma(h):
    """Progress is read back from a sigma through the model's own percent_to_sigma (the pack's
    schedule module; tests/core checks the arithmetic on a synthetic mapping)."""
    schedule = h.sampling.pack("cache_core.schedule")
    percent_to_sigma = build(h, "flux").get_model_object("model_sampling").percent_to_sigma
    for percent in (0.0, 0.1, 0.37, 0.5, 0.93):
        sigma = float(percent_to_sigma(percent))
        assert schedule.progress_of_sigma(sigma, percent_to_sigma) == pytest.approx(percent, abs=1e-9)
    assert schedule.progress_of_sigma(0.0, percent_to_sigma) == 1.0


@pytest.mark.parametrize("family", FAMILIES)
def test_partial_schedules(h, log, family):
    patched, node = fresh_forced(h, family)
    out = h.Job(family, steps=20).run_advanced(patched, 5, 15)
    assert torch.isfinite(out).all()
    assert_run_skipped(h, node, 10, {"cond", "uncond"})

    out = h.Job(family, steps=STEPS, denoise=0.5).run(patched)
    assert torch.isfinite(out).all()
    assert_run_skipped(h, node, STEPS, {"cond", "uncond"})
    assert_no_cache_warnings(log)


def test_two_stage_graph_has_one_cache_per_expert(h, log):
    """Wan 2.2 A14B style: a high-noise expert for steps [0, 10) of 20, a low-noise one for [10, 20)."""
    settings = dict(retention_ratio=0.2)
    high, high_node = forced(h, build(h, "wan21", seed=0), "wan21", **settings)
    low, low_node = forced(h, build(h, "wan21", seed=1), "wan21", **settings)
    assert high_node != low_node
    job = h.Job("wan21", steps=20)

    stage1 = job.run_advanced(high, 0, 10, add_noise=True, leftover_noise=True)
    high_patterns = assert_run_skipped(h, high_node, 10, {"cond", "uncond"})
    stage2 = job.run_advanced(low, 10, 20, add_noise=False, latent={"samples": stage1})
    low_patterns = assert_run_skipped(h, low_node, 10, {"cond", "uncond"})

    assert stats(h, high_node)["steps"] == stats(h, low_node)["steps"] == 10
    assert torch.isfinite(stage2).all() and not torch.equal(stage1, stage2)
    for branch in ("cond", "uncond"):
        # Stage 1 covers progress [0, 0.5): its first 20% of the denoising (4 of 20 steps) computes.
        assert high_patterns[branch].startswith("CCCCS"), high_patterns
        # Stage 2 starts at progress 0.5: nothing to retain, only its first step (no residual yet).
        assert low_patterns[branch].startswith("CS"), low_patterns
    assert_no_cache_warnings(log)


# 7. Each CFG branch keeps its own residual ------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_each_branch_keeps_its_own_residual(h, log, family):
    batch = 2
    job = h.Job(family, steps=STEPS, batch=batch)
    patched, node = fresh_forced(h, family)
    block_family = family not in OUTPUT_SPACE
    checked: list[int] = []

    def check_rows(call: ModelCall, output: torch.Tensor, options: dict) -> None:
        if not call.skipped:
            return
        assert len(call.branches) == 2
        cond, uncond = (call.run.cache._entries[(key, branch, 0)].history.residuals()[-1]
                        for key, branch in zip(options["uuids"], options["cond_or_uncond"], strict=True))
        assert cond.shape[0] == uncond.shape[0] == batch
        assert not torch.equal(cond, uncond), "cond and uncond share a residual"
        if block_family:
            cached = call.run.call.cached_output
            assert cached is not None and cached.shape[0] == 2 * batch
            assert not torch.equal(cached[:batch], cached[batch:])
        checked.append(call.step)

    spy_on(patched, Spy(after=check_rows))
    batched = job.run(patched)
    assert_run_skipped(h, node, STEPS, {"cond", "uncond"})
    assert len(checked) >= STEPS // 2, checked

    same_negative = h.Job(family, steps=STEPS, batch=batch, negative_seed=job.positive_seed)
    plain, _ = fresh_forced(h, family)
    assert not torch.equal(batched, same_negative.run(plain))
    assert_no_cache_warnings(log)
