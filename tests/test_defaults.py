"""What a user gets without tuning: the Apply nodes' defaults.

A node placed anew runs at the default quality level (tests/test_quality.py). At quality custom,
ApplyMagCache's expert inputs default to the damped forecast with the hindsight check; ApplyTeaCache
keeps reuse without a check (docs/experiments.md section 11 has the sweep behind both choices).

- A node placed in the UI takes the schema's defaults; an API graph that leaves the optional inputs
  out takes ``execute``'s. They must be the same, except ``quality``: a graph without it was saved
  before it existed and runs at custom, its inputs as saved.
- On the reference image model (euler 30 steps, cfg 4; 16 images: classes 0-3 x seeds 0-3, half of
  them never used to choose the settings), ApplyMagCache's custom defaults with FLUX.1-dev's published
  ratios keep the worst image at >= 30 dB PSNR against uncached while skipping at least 35% of the
  block-stack rows, where the published method at the same threshold (reuse, no check) falls below
  30 dB.
"""

from __future__ import annotations

import inspect
import math

import pytest
import torch

STEPS, CFG, SAMPLER, SCHEDULER = 30, 4.0, "euler", "simple"
CLASSES, SEEDS = [0, 1, 2, 3], [0, 1, 2, 3]
MIN_WORST_PSNR = 30.0
MIN_ROWS_SKIPPED = 0.35  # the sweep measured 40.0% (1.67x)


@pytest.mark.parametrize("name", ["ApplyMagCache", "ApplyTeaCache"])
def test_a_graph_without_the_optional_inputs_gets_the_schema_defaults(host, name):
    from harness.sampling import schema_defaults

    node = getattr(host.pack_module("nodes.apply_nodes"), name)
    parameters = inspect.signature(node.execute).parameters
    optional = [i.id for i in node.GET_SCHEMA().inputs if i.optional and getattr(i, "default", None) is not None]
    assert "quality" in optional, "the node lost its quality input"
    assert parameters["quality"].default == "custom" != schema_defaults(node)["quality"]
    optional.remove("quality")
    for input_id in optional:
        assert parameters[input_id].default == schema_defaults(node)[input_id], (
            f"{name}.{input_id}: the schema says {schema_defaults(node)[input_id]!r}, an API graph without it "
            f"gets {parameters[input_id].default!r}")


def test_custom_defaults_build_the_damped_forecast_with_the_hindsight_check(host):
    from harness import sampling
    from harness.sampling import schema_defaults

    apply_nodes = host.pack_module("nodes.apply_nodes")
    installed = host.pack_module("nodes.runtime").installed_settings
    flux = host.test_module("tiny_models").build_model("flux", seed=0)
    custom = {"quality": "custom"}
    mag, _ = sampling.apply(flux, "magcache",
                            **{**schema_defaults(apply_nodes.ApplyMagCache), "variant": "flux.1-dev", **custom})
    tea, _ = sampling.apply(flux, "teacache", **{**schema_defaults(apply_nodes.ApplyTeaCache), **custom})
    mag_config, tea_config = installed(mag).method, installed(tea).method
    assert (mag_config.estimator.name, mag_config.check) == ("damped_forecast", "hindsight")
    assert (tea_config.estimator.name, tea_config.check) == ("reuse", None)


def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    mse = float(((a.double() - b.double()) ** 2).mean())
    return math.inf if mse == 0 else 10 * math.log10(1.0 / mse)


def test_magcache_custom_defaults_keep_30_db_on_the_reference_model(host):
    import nodes

    from harness import sampling
    from harness.sampling import schema_defaults

    models = host.pack_module("demo.models")
    pixels = host.pack_module("demo.pixels")
    model = models.load_model("image")
    defaults = {**schema_defaults(host.pack_module("nodes.apply_nodes").ApplyMagCache), "quality": "custom"}

    def run(patched, class_index: int, seed: int) -> torch.Tensor:
        """One image, as the benchmark samples it (batch 1: its noise depends on the seed only)."""
        positive = models.conditioning("image", class_index, 1)
        negative = models.conditioning("image", None, 1)
        return pixels.latent_to_image(nodes.common_ksampler(
            patched, seed, STEPS, CFG, SAMPLER, SCHEDULER, positive, negative,
            models.empty_latent("image", 1))[0]["samples"])

    pairs = [(c, seed) for c in CLASSES for seed in SEEDS]
    references = {pair: run(model, *pair) for pair in pairs}

    def measure(**inputs) -> tuple[float, float]:
        """(worst PSNR over the 16 images, fraction of block-stack rows skipped)."""
        psnrs, skipped, total = [], 0, 0
        for pair in pairs:
            patched, node_id = sampling.apply(model, "magcache", **{**defaults, "variant": "flux.1-dev", **inputs})
            image = run(patched, *pair)
            stats = sampling.stats(node_id)
            assert stats["disabled_reason"] is None
            skipped += stats["rows_skipped"]
            total += stats["rows_skipped"] + stats["rows_computed"]
            psnrs.append(psnr(references[pair], image))
        return min(psnrs), skipped / total

    worst, skipped = measure()
    published_worst, published_skipped = measure(estimator="reuse", check="off")
    figures = (f"defaults: worst {worst:.2f} dB, {skipped:.1%} rows skipped; published method at the same "
               f"threshold: worst {published_worst:.2f} dB, {published_skipped:.1%} skipped")
    assert worst >= MIN_WORST_PSNR and skipped >= MIN_ROWS_SKIPPED, figures
    assert published_worst < MIN_WORST_PSNR, "the published method reaches 30 dB here now: " + figures
