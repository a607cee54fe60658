"""TeaCache's signal and calibration with reference images in the conditioning, including the
``index_timestep_zero`` reference mode of ComfyUI 0.30.0: the default of Qwen-Image-Edit-2511
(its checkpoints carry an ``__index_timestep_zero__`` marker) and an option for FLUX.2 (the
"Edit Model Reference Method" node).

In that mode the model appends the reference tokens to the image stream and modulates them with
timestep 0: FLUX.2's blocks get two modulations per sample (image, references), Qwen's get the
embeddings of the real timesteps followed by those of timestep 0. The signal is the first block's
modulated input of the sampled image's tokens alone.
"""

from __future__ import annotations

import logging

import pytest
import torch

STEPS = 12


def has_timestep_zero_mode() -> bool:
    from comfy_extras.nodes_flux import FluxKontextMultiReferenceLatentMethod

    (method,) = [i for i in FluxKontextMultiReferenceLatentMethod.define_schema().inputs
                 if i.id == "reference_latents_method"]
    return "index_timestep_zero" in method.options


@pytest.fixture(scope="module")
def timestep_zero(host):
    if not has_timestep_zero_mode():
        pytest.skip("this ComfyUI has no index_timestep_zero reference mode")


def flux2_klein(tiny):
    """The tiny FLUX.2 without guidance embedding, as FLUX.2 [klein] checkpoints are (with one,
    ComfyUI's own forward cannot take index_timestep_zero: it doubles the timesteps, not the
    guidance)."""
    template = tiny.FAMILIES["flux2"].template
    shapes = {k: v for k, v in template.shapes.items() if not k.startswith("guidance_in.")}
    model = tiny.model_builder.build_from_template(tiny.model_builder.Template(shapes, template.overlay), seed=0)
    assert type(model.model).__name__ == "Flux2" and not model.model.diffusion_model.params.guidance_embed
    return model


def qwen_2511(tiny):
    """The tiny Qwen-Image with the marker key of Qwen-Image-Edit-2511 checkpoints: ComfyUI's
    detection then sets index_timestep_zero as the model's default reference method."""
    template = tiny.FAMILIES["qwen_image"].template
    marked = tiny.model_builder.Template({**template.shapes, "__index_timestep_zero__": (0,)}, template.overlay)
    model = tiny.model_builder.build_from_template(marked, seed=0)
    assert model.model.diffusion_model.default_ref_method == "index_timestep_zero"
    return model


class ReferenceJob:
    """KSampler on a tiny model whose conditioning (both branches) carries a reference latent."""

    def __init__(self, tiny, family: str, method: str | None) -> None:
        from harness.sampling import Job

        self.job = Job(family, steps=STEPS)
        reference = torch.randn(self.job.latent()["samples"].shape, generator=torch.Generator().manual_seed(9))
        extra = {"reference_latents": [reference]} | ({"reference_latents_method": method} if method else {})
        positive, negative = self.job.conds()
        self.positive = [[c, {**values, **extra}] for c, values in positive]
        self.negative = [[c, {**values, **extra}] for c, values in negative]
        self.image_tokens = self.tokens(tiny, family)

    @staticmethod
    def tokens(tiny, family: str) -> int:
        spatial = tiny.FAMILIES[family].latent_spatial
        patch = 2 if family.startswith("qwen") else 1
        return (spatial[-2] // patch) * (spatial[-1] // patch)

    def run(self, model) -> torch.Tensor:
        import nodes

        job = self.job
        return nodes.common_ksampler(model, job.seed, job.steps, job.cfg, job.sampler, job.scheduler,
                                     self.positive, self.negative, job.latent())[0]["samples"]


def flux2_signal(block, args: dict, tokens: int) -> torch.Tensor:
    # Written out from ComfyUI's Flux DoubleStreamBlock: modulation index 0 is the image's.
    (img_mod1, _), _ = args["vec"]
    assert img_mod1.shift.shape[1] == 2  # the mode is on: image and reference modulations
    normed = torch.nn.functional.layer_norm(args["img"][:, :tokens], args["img"].shape[-1:], eps=1e-6)
    return normed * (1 + img_mod1.scale[:, :1]) + img_mod1.shift[:, :1]


def qwen_signal(block, args: dict, tokens: int) -> torch.Tensor:
    # Written out from ComfyUI's Qwen block: the first rows of vec are the real timesteps'.
    img, temb = args["img"], args["vec"]
    assert temb.shape[0] == 2 * img.shape[0]  # the mode is on: real and zero timesteps
    shift, scale = block.img_mod(temb[: img.shape[0]]).chunk(2, dim=-1)[0].chunk(3, dim=-1)[:2]
    normed = torch.nn.functional.layer_norm(img[:, :tokens], img.shape[-1:], eps=1e-6)
    return normed * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)


CASES = {
    "flux2_klein": ("flux2", "index_timestep_zero", flux2_signal),
    "qwen_image_edit_2511": ("qwen_image", None, qwen_signal),  # the checkpoint's default mode
}


def build(tiny, case: str):
    return qwen_2511(tiny) if case == "qwen_image_edit_2511" else flux2_klein(tiny)


@pytest.mark.parametrize("case", sorted(CASES))
def test_teacache_skips_on_the_image_tokens_signal_in_index_timestep_zero_mode(host, timestep_zero, case, caplog):
    from harness.sampling import install, stats, tiny

    family, method, expected_signal = CASES[case]
    model = build(tiny(), case)
    job = ReferenceJob(tiny(), family, method)
    uncached = job.run(model)
    patched, node_id = install(model, "teacache", threshold=0.5, max_consecutive_skips=3, record_trace=True)
    dit = patched.model_options["transformer_options"]["patches_replace"]["dit"]
    head = dit[("double_block", 0)]
    block = (model.model.diffusion_model.double_blocks if family == "flux2"
             else model.model.diffusion_model.transformer_blocks)[0]
    recorded = []

    def record(args: dict, extra: dict) -> dict:
        recorded.append(expected_signal(block, args, job.image_tokens).clone())
        return head(args, extra)

    record.__wrapped__ = head  # it wraps the pack's hook, and says so: the run still caches
    dit[("double_block", 0)] = record
    with caplog.at_level(logging.WARNING, logger="stepcache"):
        out = job.run(patched)
    run = stats(node_id)
    assert run["disabled_reason"] is None, run  # no shape error: the run was cached
    assert run["calls_skipped"] > 0 and torch.isfinite(out).all()
    assert not torch.equal(out, uncached)
    assert not [r for r in caplog.records if "cache failed" in r.getMessage()]
    # The cache's signal is the relative L1 change of the image tokens' modulated input, per row of
    # the batch (one model call per euler step, cond and uncond batched; the trace lists a call's
    # entries in row order).
    assert len(recorded) == STEPS
    compared = 0
    for step in range(1, STEPS):
        for row, entry in enumerate(t for t in run["trace"] if t["step"] == step):
            if entry["signal"] is None:
                continue
            previous, current = recorded[step - 1][row], recorded[step][row]
            expected = ((current - previous).abs().mean() / previous.abs().mean()).item()
            assert entry["signal"] == pytest.approx(expected, rel=1e-4), (step, row, entry)
            compared += 1
    assert compared >= STEPS


@pytest.mark.parametrize("case", sorted(CASES))
def test_teacache_calibrate_measures_in_index_timestep_zero_mode(host, timestep_zero, case):
    from harness.sampling import apply, stats, tiny

    family, method, _ = CASES[case]
    model = build(tiny(), case)
    job = ReferenceJob(tiny(), family, method)
    node = host.pack_module("nodes.calibrate_nodes").TeaCacheCalibrate
    inner = job.job
    latent, calibration, report = node.execute(
        model, inner.seed, inner.steps, inner.cfg, inner.sampler, inner.scheduler, job.positive, job.negative,
        inner.latent(), inner.denoise, False).result
    assert torch.equal(latent["samples"], job.run(model))  # a KSampler that measures
    assert calibration.coefficients is not None and len(calibration.coefficients) == 5
    assert len(calibration.fit_points) == (STEPS - 1) * 2  # every later step, both CFG branches
    assert all(x > 0 for x, _ in calibration.fit_points)
    assert "TeaCache coefficients" in report
    patched, node_id = apply(model, "teacache", threshold=1.0, coefficients=calibration)
    job.run(patched)
    assert stats(node_id)["constants"] == f"this model's calibration of {calibration.created}"
    assert stats(node_id)["disabled_reason"] is None
