"""The Apply nodes as a ComfyUI user meets them: settings, bad input, runs that must not skip."""

from __future__ import annotations

import logging

import pytest
import torch


@pytest.fixture(scope="module")
def flux(host):
    return host.test_module("tiny_models").build_model("flux", seed=0)


def test_the_input_model_is_left_untouched(flux):
    from harness.sampling import Job, apply

    before = Job("flux").run(flux)
    patched, _ = apply(flux, "teacache", threshold=0.5)
    assert patched is not flux
    assert "patches_replace" not in flux.model_options["transformer_options"]
    Job("flux").run(patched)
    assert torch.equal(Job("flux").run(flux), before)


def test_an_unsupported_model_passes_through_with_one_warning(host, caplog):
    from harness.sampling import apply

    unet = host.test_module("tiny_models").build_sd15_unet()
    with caplog.at_level(logging.WARNING, logger="stepcache"):
        out, _ = apply(unet, "teacache")
    assert out is unet
    warnings = [r for r in caplog.records if r.name == "stepcache"]
    assert len(warnings) == 1 and "not a supported diffusion transformer" in warnings[0].getMessage()


def test_magcache_without_published_ratios_asks_for_a_calibration(host):
    from harness.sampling import apply

    flux2 = host.test_module("tiny_models").build_model("flux2", seed=0)
    with pytest.raises(ValueError, match="MagCacheCalibrate"):
        apply(flux2, "magcache")


def test_a_variant_of_another_family_is_refused(flux):
    from harness.sampling import apply

    with pytest.raises(ValueError, match="not a flux model"):
        apply(flux, "teacache", variant="wan2.1-t2v-14b")


def test_a_variant_override_is_used_and_reported_as_the_users_choice(flux):
    from harness.sampling import Job, apply, stats

    patched, node_id = apply(flux, "magcache", variant="flux.1-kontext")
    Job("flux").run(patched)
    run_stats = stats(node_id)
    # The label still says what the model is: not FLUX.1 Kontext, whose shape it does not have.
    assert run_stats["label"] == "flux / flux-architecture model (not a published checkpoint)"
    assert run_stats["constants"] == ("published FLUX.1-Kontext-dev ratios (Zehong-Ma/MagCache), "
                                      "chosen with the variant input")
    assert run_stats["calls_skipped"] > 0


def test_start_after_end_is_a_validation_error(host):
    nodes = host.pack_module("nodes.apply_nodes")
    message = nodes.ApplyTeaCache.validate_inputs(start_percent=0.8, end_percent=0.2)
    assert isinstance(message, str) and "start_percent" in message
    assert nodes.ApplyTeaCache.validate_inputs(start_percent=0.1, end_percent=0.9) is True


def test_widget_ranges_refuse_negative_thresholds(host):
    nodes = host.pack_module("nodes.apply_nodes")
    for node in (nodes.ApplyTeaCache, nodes.ApplyMagCache):
        inputs = node.INPUT_TYPES()["required"]
        assert inputs["threshold"][1]["min"] == 0.0
        assert inputs["max_consecutive_skips"][1]["min"] == 1


def run_disabled(model, job, **apply_inputs):
    from harness.sampling import apply, pack, stats

    variant = pack("families").family_for(model.model).variants[0].name  # published ratios, chosen by hand
    patched, node_id = apply(model, "magcache", threshold=5.0, max_consecutive_skips=50, retention_ratio=0.0,
                             variant=variant, **apply_inputs)
    return job.run(patched), stats(node_id)


def test_few_step_runs_sample_uncached_and_say_why(flux):
    from harness.sampling import Job

    job = Job("flux", steps=6)
    out, run_stats = run_disabled(flux, job)
    assert "only 6 steps" in run_stats["disabled_reason"]
    assert torch.equal(out, job.run(flux))


def test_torch_compile_turns_skipping_off_with_a_clear_reason(flux):
    from comfy_api.torch_helpers import set_torch_compile_wrapper

    from harness.sampling import Job, apply, stats

    patched, node_id = apply(flux, "teacache", threshold=1.0)
    compiled = patched.clone()
    set_torch_compile_wrapper(compiled, backend="eager")
    out = Job("flux").run(compiled)
    assert "torch.compile" in stats(node_id)["disabled_reason"]
    assert torch.allclose(out, Job("flux").run(flux), atol=1e-5)


def test_reapplying_replaces_the_cache_and_keeps_another_packs_block_patch(flux):
    from harness.sampling import Job, apply, stats

    calls = []

    def other_pack_patch(args, extra):
        calls.append(1)
        return extra["original_block"](args)

    with_other = flux.clone()
    with_other.set_model_patch_replace(other_pack_patch, "dit", "double_block", 1)
    once, _ = apply(with_other, "teacache", threshold=0.5)
    twice, node_id = apply(once, "magcache", threshold=0.3, max_consecutive_skips=3, retention_ratio=0.1,
                           variant="flux.1-dev")
    hook = twice.model_options["transformer_options"]["patches_replace"]["dit"][("double_block", 1)]
    assert hook.previous is other_pack_patch
    Job("flux").run(twice)
    run_stats = stats(node_id)
    assert run_stats["method"] == "MagCache" and run_stats["calls_skipped"] > 0
    # The other pack's patch runs exactly on the computed calls, once each.
    assert len(calls) == run_stats["calls_computed"]
