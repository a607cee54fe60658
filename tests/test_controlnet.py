"""ControlNet with the cache: the residual a computed call keeps leaves out what ComfyUI adds of a
ControlNet's outputs between the blocks, and a skipped call adds the current step's outputs, as
ComfyUI does. Tiny ControlNets are ComfyUI's own ControlNet classes for FLUX, Qwen-Image and SD3
at tiny sizes (``tiny_models.tiny_controlnet``), applied with ComfyUI's ControlNetApplyAdvanced;
every family that takes ControlNet outputs also gets ``tiny_models.fixed_control``, a ControlBase
with fixed outputs (ComfyUI has no ControlNet class for HunyuanVideo, Chroma or Lens)."""

from __future__ import annotations

import pytest
import torch

FORCED_SKIPS = {"threshold": 100.0, "max_consecutive_skips": 100, "retention_ratio": 0.0}
SKIPPING = {"threshold": 0.3, "max_consecutive_skips": 3, "retention_ratio": 0.1, "variant": "flux.1-dev"}
# The tiny models ComfyUI has a ControlNet class for (tiny_models.tiny_controlnet).
CONTROLNET_CLASSES = ["flux", "qwen_image", "sd3"]


def flux_ratios():
    from harness.sampling import pack

    return pack("families.published_magcache").FLUX_DEV


@pytest.fixture(scope="module")
def flux(host):
    return host.test_module("tiny_models").build_model("flux", seed=0)


@pytest.fixture(scope="module")
def controlnet(host, flux):
    return host.test_module("tiny_models").tiny_controlnet(flux, seed=3)


def hint_image(latent: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """An RGB IMAGE at the latent's pixel size (VAE stride 8), as a preprocessor would give."""
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(latent.shape[0], latent.shape[2] * 8, latent.shape[3] * 8, 3, generator=gen)


def with_controlnet(conds: tuple[list, list], controlnet, hint: torch.Tensor, strength: float = 0.3,
                    start: float = 0.0, end: float = 1.0) -> tuple[list, list]:
    import nodes

    positive, negative = conds
    return tuple(nodes.ControlNetApplyAdvanced().apply_controlnet(positive, negative, controlnet, hint, strength,
                                                                  start, end)[:2])


def with_control(conds: tuple[list, list], control) -> tuple[list, list]:
    """Both prompts with ``control`` (a ControlBase) on every entry, as Apply ControlNet puts it."""
    return tuple([[c, {**extra, "control": control}] for c, extra in entries] for entries in conds)


def sample(job, model, conds: tuple[list, list]) -> torch.Tensor:
    import nodes

    positive, negative = conds
    return nodes.common_ksampler(model, job.seed, job.steps, job.cfg, job.sampler, job.scheduler, positive, negative,
                                 job.latent())[0]["samples"]


def psnr(output: torch.Tensor, reference: torch.Tensor) -> float:
    return float(10 * torch.log10(reference.abs().max() ** 2 / (output - reference).pow(2).mean()))


@pytest.mark.parametrize("family", CONTROLNET_CLASSES)
def test_threshold_zero_is_bit_identical_and_the_run_skips(host, baselines, family):
    from harness.sampling import Job, install, stats

    tiny = host.test_module("tiny_models")
    model, plain = baselines[family]
    controlnet = tiny.tiny_controlnet(model, seed=3)
    job = Job(family)
    conds = with_controlnet(job.conds(), controlnet, tiny.controlnet_hint(controlnet, job.latent()["samples"]))
    reference = sample(job, model, conds)
    assert not torch.allclose(reference, plain)  # the ControlNet changes the output
    exact, _ = install(model, "magcache", threshold=0.0, ratios=flux_ratios())
    assert torch.equal(sample(job, exact, conds), reference)
    # The compute path (every residual kept, less the control added between the blocks) too.
    measuring, node_id = install(model, "calibration")
    assert torch.equal(sample(job, measuring, conds), reference)
    assert stats(node_id)["calls_computed"] == job.steps
    skipping, node_id = install(model, "magcache", threshold=0.3, max_consecutive_skips=3, retention_ratio=0.1,
                                ratios=flux_ratios())
    assert sample(job, skipping, conds).isfinite().all()
    result = stats(node_id)
    assert result["disabled_reason"] is None and result["calls_skipped"] > 0


def test_a_controlled_run_skips_and_stays_as_close_to_uncached_as_a_run_without(host):
    """The demo image model (trained dynamics) at the `fast` level, with and without a ControlNet: both
    hold the level's promise. (One image's PSNR at a level moves by a few dB with any change of content,
    docs/experiments.md sections 17-18, so the two are not compared with each other.)"""
    from harness.sampling import apply, stats

    models = host.pack_module("demo.models")
    model = models.load_model("image")
    controlnet = host.test_module("tiny_models").tiny_controlnet(model, seed=3)
    latent = models.empty_latent("image")
    plain = (models.conditioning("image", 2), models.conditioning("image", None))
    controlled = with_controlnet(plain, controlnet, hint_image(latent["samples"]), strength=0.1)

    def run(patched, conds):
        import nodes

        return nodes.common_ksampler(patched, 7, 30, 4.0, "euler", "simple", *conds, latent)[0]["samples"]

    cached, node_id = apply(model, "magcache", quality="fast")
    results = {}
    for name, conds in (("plain", plain), ("controlled", controlled)):
        reference = run(model, conds)
        out = run(cached, conds)
        results[name] = (psnr(out, reference), stats(node_id)["calls_skipped"], reference)
    assert psnr(results["controlled"][2], results["plain"][2]) < 30  # the ControlNet does change the image
    assert results["controlled"][1] > 0 and stats(node_id)["disabled_reason"] is None
    promise = host.pack_module("cache_core.quality").LEVELS["fast"].worst_db
    assert min(results["controlled"][0], results["plain"][0]) >= promise, results


def test_a_controlnet_that_starts_or_stops_partway_makes_its_step_compute(flux, controlnet):
    from harness.sampling import Job, install, stats

    job = Job("flux", steps=16)
    conds = with_controlnet(job.conds(), controlnet, hint_image(job.latent()["samples"]), start=0.0, end=0.5)
    cached, node_id = install(flux, "magcache", threshold=0.3, max_consecutive_skips=8, retention_ratio=0.1,
                              variant="flux.1-dev", record_trace=True)
    out = sample(job, cached, conds)
    result = stats(node_id)
    restarts = [event for event in result["trace"] if "restart" in event]
    assert len(restarts) == 1 and 0 < restarts[0]["step"] < job.steps, restarts
    assert "ControlNet" in restarts[0]["restart"]
    step = restarts[0]["step"]
    assert all(branch["pattern"][step] == "C" for branch in result["branches"]), (step, result["branches"])
    assert result["disabled_reason"] is None and result["calls_skipped"] > 0 and out.isfinite().all()
    sample(job, cached, with_controlnet(job.conds(), controlnet, hint_image(job.latent()["samples"])))
    assert not [event for event in stats(node_id)["trace"] if "restart" in event]  # acting throughout


def test_union_and_chained_controlnets(host, flux, controlnet):
    """An InstantX-Union-style ControlNet (a mode picked with ComfyUI's SetUnionControlNetType,
    a latent hint) chained with an XLabs-style one that stops halfway: ComfyUI merges their outputs;
    threshold 0 is bit-identical, the run skips, and the step where the second stops computes."""
    from comfy_extras.nodes_controlnet import SetUnionControlNetType

    from harness.sampling import Job, apply, execute_node, install, stats

    job = Job("flux", steps=16)
    latent = job.latent()["samples"]
    union = host.test_module("tiny_models").tiny_controlnet(flux, seed=4, union_modes=8)
    union = execute_node(SetUnionControlNetType, control_net=union, type="depth")[0]
    latent_hint = torch.randn(latent.shape, generator=torch.Generator().manual_seed(1)).movedim(1, -1)
    conds = with_controlnet(job.conds(), union, latent_hint, strength=0.3)
    conds = with_controlnet(conds, controlnet, hint_image(latent), strength=0.3, end=0.6)
    reference = sample(job, flux, conds)
    exact, _ = apply(flux, "magcache", **{**SKIPPING, "threshold": 0.0})
    assert torch.equal(sample(job, exact, conds), reference)
    cached, node_id = install(flux, "magcache", threshold=0.3, max_consecutive_skips=8, retention_ratio=0.1,
                              variant="flux.1-dev", record_trace=True)
    out = sample(job, cached, conds)
    result = stats(node_id)
    assert result["disabled_reason"] is None and result["calls_skipped"] > 0 and out.isfinite().all()
    assert len([event for event in result["trace"] if "restart" in event]) == 1


def test_removing_the_controlnet_between_runs_leaves_nothing_behind(flux, controlnet):
    """A/B/A: the same cached model without, with, then without the ControlNet; the third run
    equals the first exactly."""
    from harness.sampling import Job, apply, stats

    job = Job("flux")
    cached, node_id = apply(flux, "magcache", **SKIPPING)
    first = job.run(cached)
    skipped = stats(node_id)["calls_skipped"]
    sample(job, cached, with_controlnet(job.conds(), controlnet, hint_image(job.latent()["samples"])))
    assert stats(node_id)["calls_skipped"] > 0
    assert torch.equal(job.run(cached), first) and stats(node_id)["calls_skipped"] == skipped


def test_every_controlled_family_adds_the_current_control_on_a_skipped_call(host, baselines, controlled_family):
    """Forced skips on each family whose ControlNet outputs the cache keeps apart (with ComfyUI's
    ControlNet class where it has one, else a fixed ControlBase): a computed call keeps output -
    input - (the control added between its blocks), and a skipped call returns input + that
    residual + the control of its own step."""
    from harness.sampling import Job, apply, pack, patterns

    model, _ = baselines[controlled_family]
    family = pack("families").family_for(model.model)
    control_key = pack("nodes.runtime").CONTROL_KEY
    job = Job(controlled_family)
    patched, node_id = apply(model, "magcache", ratios=flux_ratios(), **FORCED_SKIPS)
    dit = patched.model_options["transformer_options"]["patches_replace"]["dit"]
    keys = family.block_keys(model.model.diffusion_model)
    head_hook, tail_hook = dit[keys[0]], dit[keys[-1]]
    inputs, outputs, added = [], [], []

    def head_probe(args, extra):
        inputs.append(args["img"].clone())  # before any block or control addition writes into it
        return head_hook(args, extra)

    def tail_probe(args, extra):
        out = tail_hook(args, extra)
        tokens = inputs[-1].shape[1]
        options = args["transformer_options"]
        outputs.append(family.image_part(keys[-1][0], out["img"], tokens, options).clone())
        # ComfyUI adds entry i of the family's list after block i; the tail's own comes after it.
        step_control = options.get(control_key)
        total = torch.zeros_like(inputs[-1])
        if step_control is None:
            added.append(total)
            return out
        for kind, index in keys[:-1]:
            total += step_control[family.control_lists[kind]][index]
        added.append(total)
        return out

    head_probe.__wrapped__, tail_probe.__wrapped__ = head_hook, tail_hook
    dit[keys[0]], dit[keys[-1]] = head_probe, tail_probe
    tiny = host.test_module("tiny_models")
    if controlled_family in CONTROLNET_CLASSES:  # ComfyUI's own ControlNet class
        controlnet = tiny.tiny_controlnet(model, seed=3)
        conds = with_controlnet(job.conds(), controlnet, tiny.controlnet_hint(controlnet, job.latent()["samples"]))
    else:
        job.run(patched)  # without a ControlNet: how long the image stream is
        control = tiny.fixed_control(tokens=inputs[0].shape[1])
        conds = with_control(job.conds(), control)
    inputs.clear()
    outputs.clear()
    added.clear()
    sample(job, patched, conds)
    pattern = patterns(node_id)["cond"]
    assert pattern.startswith("CS"), pattern
    assert not torch.allclose(added[1], added[0])  # each step has its own control
    residual = None
    for step, outcome in enumerate(pattern):
        if outcome == "C":
            residual = outputs[step] - inputs[step] - added[step]
        else:
            expected = inputs[step] + residual + added[step]
            assert torch.allclose(outputs[step], expected, atol=1e-5, rtol=1e-5), (step, pattern)


def test_a_family_that_takes_no_controlnet_it_knows_samples_uncached_with_the_reason(host, baselines):
    from harness.sampling import Job, apply, stats

    model, _ = baselines["wan21"]
    control = host.test_module("tiny_models").fixed_control()
    job = Job("wan21")
    conds = with_control(job.conds(), control)
    patched, node_id = apply(model, "magcache", ratios=flux_ratios(), **FORCED_SKIPS)
    reference = sample(job, model, conds)
    assert torch.equal(sample(job, patched, conds), reference)
    result = stats(node_id)
    assert "ControlNet" in result["disabled_reason"] and result["calls_skipped"] == 0


def test_output_space_families_keep_the_control_inside_the_cached_output(host, baselines):
    """In output space the whole model output is cached, ControlNet effect and all, and nothing is
    added after it: the run caches."""
    from harness.sampling import Job, apply, stats

    model, _ = baselines["lumina2"]
    control = host.test_module("tiny_models").fixed_control()
    job = Job("lumina2")
    conds = with_control(job.conds(), control)
    patched, node_id = apply(model, "magcache", ratios=flux_ratios(), **FORCED_SKIPS)
    assert sample(job, patched, conds).isfinite().all()
    result = stats(node_id)
    assert result["disabled_reason"] is None and result["calls_skipped"] > 0
