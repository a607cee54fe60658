"""ComfyUI's context windows (ContextWindowsManual, WanContextWindowsManual) on a tiny Wan.

The handler evaluates the model once per window and step (comfy/context_windows.py); the cache
keys each conditioning entry by its window too, so every window skips with its own residuals.
Every schedule the nodes offer on this ComfyUI is either cached (CACHED) or refused with its
reason (REFUSED); a schedule a newer ComfyUI adds fails test_every_offered_schedule_is_known.
"""

from __future__ import annotations

import itertools

import pytest
import torch

CACHED = ("standard_static", "standard_uniform", "batched")
# looped_uniform shifts every window at every step: no window has a residual of the previous step.
REFUSED = ("looped_uniform",)

# 9 latent frames, windows of 5 with an overlap of 2, in each node's units (the Wan node takes
# pixel frames: 17 -> 5 latent frames, an overlap of 8 -> 2).
FRAMES = 9
NODE_INPUTS = {
    "ContextWindowsManual": dict(context_length=5, context_overlap=2, dim=2),
    "WanContextWindowsManual": dict(context_length=17, context_overlap=8),
}
# Run B of the A/B/A sequence: another window length and count, on another video length.
OTHER_INPUTS = {
    "ContextWindowsManual": dict(context_length=3, context_overlap=1, dim=2),
    "WanContextWindowsManual": dict(context_length=9, context_overlap=4),
}
FORCED = dict(threshold=100.0, max_consecutive_skips=100, retention_ratio=0.0)


def node(name):
    from comfy_extras import nodes_context_windows

    return {"ContextWindowsManual": nodes_context_windows.ContextWindowsManualNode,
            "WanContextWindowsManual": nodes_context_windows.WanContextWindowsManualNode}[name]


def with_windows(model, node_name: str, schedule: str, inputs: dict | None = None):
    from harness.sampling import execute_node

    inputs = NODE_INPUTS[node_name] if inputs is None else inputs
    return execute_node(node(node_name), model=model, context_schedule=schedule, **inputs)[0]


def offered_schedules(node_name: str) -> list[str]:
    schema_input = next(i for i in node(node_name).GET_SCHEMA().inputs if i.id == "context_schedule")
    return list(schema_input.options)


def windows_per_step(windowed, frames: int, steps: int) -> list[set[tuple[int, ...]]]:
    """The windows ComfyUI's schedule evaluates at each step of a run."""
    handler = windowed.model_options["context_handler"]
    windows = []
    for step in range(steps):
        handler._step = step  # what the handler's set_step finds for the step's sigma
        windows.append({tuple(window) for window in handler.context_schedule.func(frames, handler, {})})
    handler._step = 0
    return windows


def window_calls(windowed, frames: int, steps: int) -> int:
    """How many window evaluations a run makes (one per window and step)."""
    return sum(len(windows) for windows in windows_per_step(windowed, frames, steps))


@pytest.fixture(scope="module")
def wan(host):
    return host.test_module("tiny_models").build_model("wan21", seed=0)


@pytest.fixture(scope="module")
def job(host):
    from harness.sampling import Job

    return Job("wan21", frames=FRAMES)


def magcache(model, **inputs):
    from harness.sampling import apply, published_variant

    return apply(model, "magcache", variant=published_variant(model), **inputs)


@pytest.mark.parametrize("node_name", list(NODE_INPUTS))
def test_every_offered_schedule_is_known(host, node_name):
    assert sorted(offered_schedules(node_name)) == sorted(CACHED + REFUSED)


@pytest.mark.parametrize("node_name", list(NODE_INPUTS))
@pytest.mark.parametrize("schedule", CACHED)
def test_threshold_zero_and_a_measuring_run_equal_the_uncached_windowed_run(wan, job, node_name, schedule):
    from harness.sampling import install, stats

    windowed = with_windows(wan, node_name, schedule)
    uncached = job.run(windowed)
    zero, _ = magcache(windowed, threshold=0.0)
    assert torch.equal(job.run(zero), uncached)
    # A calibration's measuring run keeps every window's residuals and computes every call.
    measuring, node_id = install(windowed, "calibration")
    assert torch.equal(job.run(measuring), uncached)
    assert stats(node_id)["calls_computed"] == window_calls(windowed, FRAMES, job.steps)


@pytest.mark.parametrize("node_name", list(NODE_INPUTS))
@pytest.mark.parametrize("schedule", CACHED)
def test_each_window_skips_with_its_own_residual(wan, job, node_name, schedule):
    """Around the pack's head and tail hooks, record each window call's stack input and output: a
    skipped call returns exactly its input + the last residual of the same window (windows'
    residuals differ, so one shared residual would fail), and the statistics count window calls."""
    from harness.sampling import pack, stats

    windowed = with_windows(wan, node_name, schedule)
    patched, node_id = magcache(windowed, **FORCED)
    dit = patched.model_options["transformer_options"]["patches_replace"]["dit"]
    keys = pack("families").family_for(wan.model).block_keys(wan.model.diffusion_model)
    head_hook, tail_hook = dit[keys[0]], dit[keys[-1]]
    calls = []

    def head_probe(args, extra):
        window = args["transformer_options"]["context_window"]
        calls.append([(tuple(window.index_list), getattr(window, "causal_anchor_index", None)),
                      args["img"].clone(), None])
        return head_hook(args, extra)

    def tail_probe(args, extra):
        out = tail_hook(args, extra)
        calls[-1][2] = out["img"].clone()
        return out

    head_probe.__wrapped__, tail_probe.__wrapped__ = head_hook, tail_hook
    dit[keys[0]], dit[keys[-1]] = head_probe, tail_probe
    out = job.run(patched)
    run_stats = stats(node_id)
    assert run_stats["disabled_reason"] is None
    total = window_calls(windowed, FRAMES, job.steps)
    assert len(calls) == total
    assert run_stats["calls_computed"] + run_stats["calls_skipped"] == total
    assert run_stats["calls_skipped"] > 0 and torch.isfinite(out).all()
    # cond and uncond share each window's call: each counts every window call as a step.
    assert [b["steps_computed"] + b["steps_skipped"] for b in run_stats["branches"]] == [total, total]

    last_residual: dict = {}
    reused = 0
    for window, stack_input, stack_output in calls:
        residual = stack_output - stack_input
        previous = last_residual.get(window)
        if previous is not None and torch.equal(stack_output, stack_input + previous):
            reused += 1
        else:
            last_residual[window] = residual
    assert reused == run_stats["calls_skipped"]
    residuals = list(last_residual.values())
    tokens = min(r.shape[1] for r in residuals)  # windows with the causal fix frame hold more
    assert len(residuals) > 1
    pairs = [(a, b) for i, a in enumerate(residuals) for b in residuals[i + 1:]]
    assert not any(torch.equal(a[:, :tokens], b[:, :tokens]) for a, b in pairs)


@pytest.mark.parametrize("node_name", list(NODE_INPUTS))
@pytest.mark.parametrize("schedule", REFUSED)
def test_looped_windows_sample_uncached_and_say_why(wan, job, node_name, schedule):
    from harness.sampling import stats

    windowed = with_windows(wan, node_name, schedule)
    patched, node_id = magcache(windowed, **FORCED)
    out = job.run(patched)
    assert "looped_uniform" in stats(node_id)["disabled_reason"]
    assert torch.equal(out, job.run(windowed))


@pytest.mark.parametrize("node_name", list(NODE_INPUTS))
@pytest.mark.parametrize("cache_first", [True, False], ids=["cache-then-windows", "windows-then-cache"])
def test_a_b_a_with_another_window_count_leaves_no_state(wan, job, node_name, cache_first):
    """Run A, then B with other windows (length, count, schedule, video length) and a run without
    windows, then A again: the second A equals the first exactly."""
    from dataclasses import replace

    from harness.sampling import stats

    def model_for(schedule, inputs=None):
        if cache_first:
            cached, _ = magcache(wan, **FORCED)
            return with_windows(cached, node_name, schedule, inputs)
        return magcache(with_windows(wan, node_name, schedule, inputs), **FORCED)[0]

    run_a = model_for("standard_static")
    first = job.run(run_a)
    job_b = replace(job, frames=FRAMES - 2)
    job_b.run(model_for("standard_uniform", OTHER_INPUTS[node_name]))
    job_b.run(model_for("batched", OTHER_INPUTS[node_name]))
    plain, node_id = magcache(wan, **FORCED)
    job.run(plain)
    assert stats(node_id)["calls_skipped"] > 0
    assert torch.equal(job.run(run_a), first)
    assert torch.equal(job.run(model_for("standard_static")), first)


@pytest.mark.parametrize("schedule", CACHED)
def test_memory_holds_the_windows_of_two_steps_at_most(wan, job, schedule):
    """Residual slots alive during the run, read at each window call's tail: one per window and
    branch (reuse keeps one residual) for the windows of the current and the previous step, so
    windows that moved are freed; with fixed windows exactly those of one step."""
    from harness.sampling import pack

    runtime = pack("nodes.runtime")
    windowed = with_windows(wan, "ContextWindowsManual", schedule)
    patched, _ = magcache(windowed, **FORCED)
    dit = patched.model_options["transformer_options"]["patches_replace"]["dit"]
    keys = pack("families").family_for(wan.model).block_keys(wan.model.diffusion_model)
    tail_hook = dit[keys[-1]]
    held = []

    def tail_probe(args, extra):
        out = tail_hook(args, extra)
        slots = [t for kind, _, t in args["transformer_options"][runtime.RUN_KEY].cache.held_tensors()
                 if kind == "residual"]
        held.append(len(slots))
        return out

    tail_probe.__wrapped__ = tail_hook
    dit[keys[-1]] = tail_probe
    job.run(patched)
    per_step = windows_per_step(windowed, FRAMES, job.steps)
    two_steps = max(len(a | b) for a, b in itertools.pairwise(per_step))
    assert max(held) <= 2 * two_steps  # cond and uncond
    if all(windows == per_step[0] for windows in per_step):
        assert max(held) == 2 * len(per_step[0])


def test_a_context_handler_of_another_kind_is_refused(host):
    """Windows without ComfyUI's index lists cannot be told apart: such runs sample uncached."""
    from harness.sampling import pack

    class OtherHandler:
        pass

    reason = pack("nodes.runtime").context_windows_refused(OtherHandler())
    assert reason is not None and "OtherHandler" in reason


# Inputs ComfyUI 0.30.0 added to ContextWindowsManual (0.3.75 lacks them: skipped there).
NEWER_INPUTS = [dict(causal_window_fix=False), dict(freenoise=True), dict(split_conds_to_windows=True)]


@pytest.mark.parametrize("extra", NEWER_INPUTS, ids=lambda extra: next(iter(extra)))
def test_the_newer_window_inputs_cache_too(wan, job, extra):
    from harness.sampling import stats

    declared = {i.id for i in node("ContextWindowsManual").GET_SCHEMA().inputs}
    if not set(extra) <= declared:
        pytest.skip(f"this ComfyUI's ContextWindowsManual has no {next(iter(extra))}")
    windowed = with_windows(wan, "ContextWindowsManual", "standard_static",
                            {**NODE_INPUTS["ContextWindowsManual"], **extra})
    uncached = job.run(windowed)
    zero, _ = magcache(windowed, threshold=0.0)
    assert torch.equal(job.run(zero), uncached)
    patched, node_id = magcache(windowed, **FORCED)
    first = job.run(patched)
    assert stats(node_id)["calls_skipped"] > 0 and not torch.equal(first, uncached)
    assert torch.equal(job.run(patched), first)


def pytest_generate_tests(metafunc):
    """The tiny Wan models beside the plain one that this ComfyUI builds (I2V, VACE, camera, 2.2 5B,
    HuMo, ...)."""
    if "wan_variant" in metafunc.fixturenames:
        from harness import host as host_module

        tiny = host_module.boot().test_module("tiny_models")
        metafunc.parametrize("wan_variant", [
            name for name, spec in tiny.FAMILIES.items()
            if spec.family == "wan" and name != "wan21" and spec.available() and spec.latent_spatial[0] > 1])


def uncached_windowed_run(job, windowed, model, name: str) -> torch.Tensor:
    """The uncached windowed run. Where it fails on this ComfyUI itself (conditioning a model
    without resize_cond_for_context_window cannot slice per window, as on 0.3.75), the test is
    skipped; where the model can slice, the failure stands."""
    try:
        return job.run(windowed)
    except RuntimeError as error:
        if hasattr(model.model, "resize_cond_for_context_window"):
            raise
        pytest.skip(f"this ComfyUI's context windows fail on {name} uncached: {error}")


def assert_skips_per_window(windowed, job, patched, node_id: str) -> None:
    """A run of ``patched`` skips, each window of the schedule is an entry of every branch, and a
    second run repeats the first."""
    from harness.sampling import stats

    first = job.run(patched)
    run_stats = stats(node_id)
    windows = len(windows_per_step(windowed, FRAMES, 1)[0])
    assert windows > 1 and run_stats["calls_skipped"] > 0, run_stats["summary"]
    assert all(b["entries"] == windows for b in run_stats["branches"]), run_stats["branches"]
    assert torch.equal(job.run(patched), first)


def assert_the_measured_rule_caches_per_window(windowed, job, uncached: torch.Tensor) -> None:
    """With the measured-error rule the levels run (no table): a measuring run that never skips
    equals the uncached windowed run; at its largest tolerance (random weights err far more than a
    trained model) it skips per window."""
    from harness.sampling import apply

    never, _ = apply(windowed, "magcache", quality="custom", skip_rule="measured", threshold=0.0)
    assert torch.equal(job.run(never), uncached)
    patched, node_id = apply(windowed, "magcache", quality="custom", skip_rule="measured", threshold=2.0,
                             max_consecutive_skips=3, retention_ratio=0.0)
    assert_skips_per_window(windowed, job, patched, node_id)


def test_the_other_tiny_wan_models_cache_per_window(host, wan_variant):
    """Their extra conditioning (an image to extend, VACE frames, camera poses) is sliced per window
    by ComfyUI. ComfyUI 0.3.75, whose models have no resize_cond_for_context_window, cannot slice
    some of it (its own uncached run fails): skipped there."""
    from harness.sampling import Job, apply

    model = host.test_module("tiny_models").build_model(wan_variant, seed=0)
    windowed = with_windows(model, "WanContextWindowsManual", "standard_static")
    job = Job(wan_variant, frames=FRAMES)
    uncached = uncached_windowed_run(job, windowed, model, wan_variant)
    # A published Wan table chosen by name (only the mechanics matter on random weights).
    variant = next(v.name for v in host.pack_module("families").family_for(model.model).variants if v.magcache)
    zero, _ = apply(windowed, "magcache", threshold=0.0, variant=variant)
    assert torch.equal(job.run(zero), uncached)
    patched, node_id = apply(windowed, "magcache", variant=variant, **FORCED)
    assert_skips_per_window(windowed, job, patched, node_id)


def other_video_families() -> list[str]:
    """The tiny video models of families other than Wan that this ComfyUI builds, with frames
    enough to window (HunyuanVideo, LTX-Video, Mochi, Cosmos, Kandinsky 5, CogVideoX, ...)."""
    from harness import host as host_module

    tiny = host_module.boot().test_module("tiny_models")
    return [name for name, spec in tiny.FAMILIES.items()
            if spec.is_video and spec.family != "wan" and spec.latent_spatial[0] > 1 and spec.available()]


@pytest.mark.parametrize("video_model", other_video_families())
def test_other_video_families_cache_per_window(host, video_model):
    """ContextWindowsManual on the time axis of every other video family (HunyuanVideo's I2V and
    1.5 conditioning fail in 0.3.75's own windowed run: skipped there)."""
    from harness.sampling import Job

    model = host.test_module("tiny_models").build_model(video_model, seed=0)
    windowed = with_windows(model, "ContextWindowsManual", "standard_static")
    job = Job(video_model, frames=FRAMES)
    assert_the_measured_rule_caches_per_window(windowed, job, uncached_windowed_run(job, windowed, model, video_model))


@pytest.mark.parametrize("retain_first_frame", [False, True], ids=["plain", "retain-first-frame"])
def test_ltxv_context_windows_cache_per_window(host, retain_first_frame):
    """LTXV Context Windows (ComfyUI 0.30.0; lengths in pixel frames, 8 per latent frame, and the
    option to keep the first latent frame in every window), on the tiny LTX-Video."""
    from comfy_extras import nodes_context_windows

    from harness.sampling import Job, execute_node

    ltxv_node = getattr(nodes_context_windows, "LTXVContextWindowsNode", None)
    if ltxv_node is None:
        pytest.skip("this ComfyUI has no LTXV Context Windows node")
    model = host.test_module("tiny_models").build_model("ltxv", seed=0)
    # 41 pixel frames -> windows of 6 latent frames, an overlap of 16 -> 2, over 9 latent frames.
    windowed = execute_node(ltxv_node, model=model, context_length=41, context_overlap=16,
                            context_schedule="standard_static", fuse_method="pyramid", freenoise=False,
                            retain_first_frame=retain_first_frame)[0]
    job = Job("ltxv", frames=FRAMES)
    assert_the_measured_rule_caches_per_window(windowed, job, job.run(windowed))
