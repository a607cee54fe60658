"""Robustness in the real ComfyUI: randomized run sequences with interrupts, and a memory soak.

The driver and its checks are in harness/fuzz.py. CI runs a bounded budget with a fixed seed;
``./dev fuzz --runs N --seed S`` runs more and prints the same report. STEPCACHE_FUZZ_RUNS and
STEPCACHE_FUZZ_SEED change the test's budget and seed.
"""

from __future__ import annotations

import os

import pytest

RUNS = int(os.environ.get("STEPCACHE_FUZZ_RUNS", "40"))
SEED = int(os.environ.get("STEPCACHE_FUZZ_SEED", "2026"))
MiB = 1 << 20


@pytest.fixture(scope="module")
def fuzz(host):
    from harness import fuzz

    return fuzz


def test_random_run_sequences_never_fail_leak_or_carry_state(fuzz):
    report = fuzz.run_sequence(RUNS, SEED)
    print(report.summary())
    assert report.runs == RUNS
    assert report.cached_runs > 0 and report.identical_checks > 0 and report.interrupted > 0, report.summary()
    assert report.tightened > 0, report.summary()  # a level above its reference CFG scale was drawn
    assert not report.failures, report.summary()


def test_the_sequence_draws_every_tiny_model_of_the_registry_and_names_what_it_cannot(fuzz, host):
    tiny = host.test_module("tiny_models").FAMILIES
    pack = [family.name for family in host.pack_module("families").FAMILIES]
    covered = fuzz.coverage()
    cached_models = [name for name, spec in tiny.items() if spec.family in pack]
    assert set(covered.tiny_models) | {n.split(" ")[0] for n in covered.tiny_models_not_built} == set(cached_models)
    assert set(covered.tiny_models) == {name for name in cached_models if tiny[name].available()}
    assert {tiny[name].family for name in covered.per_family} | set(covered.families_not_covered) == set(pack)
    # Frame counts vary for video models only; image models on 5-D latents (Qwen-Image) take one.
    assert covered.video == {name for name in covered.tiny_models
                             if tiny[name].is_video and tiny[name].latent_spatial[0] > 1}
    assert "qwen_image" not in covered.video and "wan21" in covered.video
    # What it cannot build is in the report, by name.
    summary = fuzz.Report(covered=covered).summary()
    assert all(name in summary for name in covered.families_not_covered + covered.tiny_models_not_built)


def test_outputs_are_compared_bit_for_bit_with_nan_in_the_same_places(fuzz):
    import torch

    a = torch.tensor([1.0, float("nan"), 3.0])
    assert fuzz.same_output(a, a.clone())
    assert not fuzz.same_output(a, torch.tensor([1.0, float("nan"), 3.0 + 1e-6]))
    assert not fuzz.same_output(a, torch.tensor([1.0, 2.0, 3.0]))
    assert not fuzz.same_output(a, torch.tensor([float("nan"), float("nan"), 3.0]))
    assert not fuzz.same_output(a, a.double())


def test_a_diverging_model_is_still_judged_for_carried_over_state(fuzz, host):
    """The tiny FlowRVS model gives NaN unpatched with an ancestral sampler (0.30.0 fuzz); a cached
    run reused after another run must still equal a freshly patched one, NaN for NaN."""
    import torch

    from harness.sampling import Job, apply, published_variant, tiny

    builder = tiny()
    if "wan21_flowrvs" not in builder.FAMILIES or not builder.FAMILIES["wan21_flowrvs"].available():
        pytest.skip("this ComfyUI has no FlowRVS class")
    model = builder.build_model("wan21_flowrvs", seed=0)
    job = Job("wan21_flowrvs", sampler="euler_ancestral", steps=16)
    assert torch.isnan(job.run(model)).any()  # the premise: the unpatched model diverges here
    inputs = dict(threshold=0.3, max_consecutive_skips=3, variant=published_variant(model))
    reused, _ = apply(model, "magcache", **inputs)
    Job("wan21_flowrvs", steps=12).run(reused)  # an earlier run of another shape of schedule
    fresh, _ = apply(model, "magcache", **inputs)
    assert fuzz.same_output(job.run(reused), job.run(fresh))


def test_two_hundred_runs_with_changing_shapes_hold_no_memory(fuzz):
    soak = fuzz.soak(runs=200)
    print(soak.summary())
    assert soak.windowed > 0, soak.summary()  # the per-window caches are soaked too
    assert soak.pack_objects_end == 0, soak.summary()
    assert soak.tensors_end <= soak.tensors_after_warmup, soak.summary()
    assert soak.rss_end - soak.rss_after_warmup < 64 * MiB, soak.summary()


def test_library_use_with_autograd_leaves_nothing_heavy_behind(host):
    """ComfyUI used as a library runs uni_pc with autograd on (its executor uses inference mode),
    and copies of transformer_options made during the run can then stay in reference cycles
    through the autograd graph that the collector cannot free. Whatever of the run stays alive
    that way must hold no tensor and no model."""
    import gc

    from harness import sampling

    runtime = sampling.pack("nodes.runtime")
    model = sampling.tiny().build_model("sd3", seed=0)
    # Weights that require grad, as a library user's (training, a model of their own) do: ComfyUI
    # 0.3.75 built every model that way, 0.30.0 turns grad off when it builds one.
    model.model.diffusion_model.requires_grad_(True)
    patched, _ = sampling.apply(model, "teacache", threshold=5.0, max_consecutive_skips=100)
    out = sampling.Job("sd3", steps=12, sampler="uni_pc").run(patched)
    assert out.requires_grad  # the library path this test is about
    del out
    gc.collect()
    for run in (o for o in gc.get_objects() if isinstance(o, runtime.ActiveRun)):
        assert run.diffusion_model is None and run.call is runtime.PASSTHROUGH
        assert not run.cache._entries and not run.cache.held_tensors()
