"""The quality knob of both Apply nodes (cache_core/quality.py).

- A node placed anew runs at the default level; a workflow saved before the knob existed (no
  ``quality`` value) runs its expert inputs exactly as saved.
- A level needs no published table or calibration: Apply MagCache at ``variant: auto`` serves every
  cached family, including models nothing was published for.
- On the reference image model every level holds the worst-case PSNR it promises, and each level
  is faster than the one above it (the same figures, for both reference models and both samplers,
  come from ``./dev bench``: docs/benchmark.md).
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch


@pytest.fixture(scope="module")
def quality(host):
    return host.pack_module("cache_core.quality")


@pytest.fixture(scope="module")
def apply_nodes(host):
    return host.pack_module("nodes.apply_nodes")


def installed_method(host, model):
    return host.pack_module("nodes.runtime").installed_settings(model).method


def test_levels_run_from_most_to_least_faithful(quality):
    levels = list(quality.LEVELS.values())
    assert [level.name for level in levels] == ["lossless", "high", "balanced", "fast"]
    assert quality.QUALITY_OPTIONS[-1] == "custom" and quality.DEFAULT_LEVEL in quality.LEVELS
    for finer, coarser in itertools.pairwise(levels):
        assert finer.worst_db > coarser.worst_db and finer.tolerance < coarser.tolerance


@pytest.mark.parametrize(("node", "method"), [("ApplyMagCache", "magcache"), ("ApplyTeaCache", "teacache")])
def test_a_node_placed_anew_runs_the_default_level_and_a_saved_one_runs_as_saved(host, quality, apply_nodes,
                                                                                node, method):
    from harness import sampling
    from harness.sampling import schema_defaults

    flux = host.test_module("tiny_models").build_model("flux", seed=0)
    defaults = schema_defaults(getattr(apply_nodes, node))
    assert defaults["quality"] == quality.DEFAULT_LEVEL
    placed, _ = sampling.apply(flux, method, **defaults)
    config = installed_method(host, placed)
    assert config.level == quality.DEFAULT_LEVEL and config == quality.LEVELS[quality.DEFAULT_LEVEL].config()
    # A saved graph has the expert inputs and no quality: they run as they were saved.
    saved = {k: v for k, v in defaults.items() if k != "quality"}
    saved_model, _ = sampling.apply(flux, method, **{**saved, "threshold": 0.123, "variant": "flux.1-dev"})
    config = installed_method(host, saved_model)
    assert config.display_name == {"magcache": "MagCache", "teacache": "TeaCache"}[method]
    assert config.threshold == 0.123


def test_every_cached_family_runs_at_every_level_with_variant_auto(host):
    """No published table is needed: a tiny model (no published checkpoint) of every family this
    ComfyUI builds, at variant auto, runs at the most and the least faithful level. Random weights
    make the residual jump from step to step, which the levels measure and refuse to skip; the same
    rule at a tolerance far above those jumps (skip_rule measured, quality custom) skips."""
    from harness import fuzz, sampling

    covered = fuzz.coverage()
    tiny = sampling.tiny()
    assert len(covered.per_family) >= 8, covered.summary()
    for name in covered.per_family:
        model = tiny.build_model(name, seed=0)
        frames = 2 if fuzz.takes_frames(tiny.FAMILIES[name]) else None
        job = sampling.Job(name, seed=3, steps=12, cfg=3.0, frames=frames)
        for level in ("lossless", "fast", "custom"):
            custom = {"skip_rule": "measured", "threshold": 50.0, "max_consecutive_skips": 3}
            inputs = custom if level == "custom" else {}
            patched, node_id = sampling.apply(model, "magcache", variant="auto", quality=level, **inputs)
            out = job.run(patched)
            stats = sampling.stats(node_id)
            assert torch.isfinite(out).all(), (name, level)
            assert stats["disabled_reason"] is None and stats["method"] == "measured error", (name, stats)
            if level == "custom":
                assert stats["rows_skipped"] > 0, (name, stats["branches"])


def test_a_level_ignores_a_connected_calibration_and_says_so(host, caplog):
    from harness import sampling

    flux = host.test_module("tiny_models").build_model("flux", seed=0)
    ratios = host.pack_module("families.published_magcache").FLUX_DEV
    with caplog.at_level("INFO", logger="stepcache"):
        patched, _ = sampling.apply(flux, "magcache", ratios=ratios, quality="high")
    assert installed_method(host, patched).level == "high"
    assert any("does not use the connected constants" in r.getMessage() for r in caplog.records)


def test_an_unknown_level_is_refused(host):
    from harness import sampling

    flux = host.test_module("tiny_models").build_model("flux", seed=0)
    with pytest.raises(ValueError, match="quality must be one of"):
        sampling.apply(flux, "magcache", quality="ultra")


def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    mse = float(((a.double() - b.double()) ** 2).mean())
    return math.inf if mse == 0 else 10 * math.log10(1.0 / mse)


@pytest.mark.slow
@pytest.mark.parametrize("cfg", [4.0, 7.0])
def test_every_level_holds_its_promise_on_the_reference_image_model(host, quality, cfg):
    """16 images (classes 0-3 x seeds 0-3), euler 30 steps, at variant auto: the worst image is at
    or above the level's promise, and each level skips at least as much as the one above it. At cfg
    4, where the levels were chosen, and at cfg 7, where their tolerances tighten (without that the
    default level's worst image is at 24.6 dB there)."""
    import nodes

    from harness import sampling

    models = host.pack_module("demo.models")
    pixels = host.pack_module("demo.pixels")
    model = models.load_model("image")

    def run(patched, class_index: int, seed: int) -> torch.Tensor:
        positive = models.conditioning("image", class_index, 1)
        negative = models.conditioning("image", None, 1)
        return pixels.latent_to_image(nodes.common_ksampler(
            patched, seed, 30, cfg, "euler", "simple", positive, negative,
            models.empty_latent("image", 1))[0]["samples"])

    pairs = [(c, s) for c in range(4) for s in range(4)]
    references = {pair: run(model, *pair) for pair in pairs}
    figures, speedups = [], []
    for level in quality.LEVELS.values():
        patched, node_id = sampling.apply(model, "magcache", quality=level.name)
        psnrs, rows, computed = [], 0, 0
        for pair in pairs:
            psnrs.append(psnr(references[pair], run(patched, *pair)))
            stats = sampling.stats(node_id)
            # The run says when the guidance scale tightened the level (the log line and the node's panel).
            tightened = f"tolerance x{(quality.REFERENCE_CFG / 7.0) ** level.guidance_power:.2f} at cfg 7"
            assert (tightened in stats["constants"]) == (cfg == 7.0), (tightened, stats["constants"])
            rows += stats["rows_computed"] + stats["rows_skipped"]
            computed += stats["rows_computed"]
        speedups.append(rows / computed)
        figures.append(f"{level.name}: {rows / computed:.2f}x, worst {min(psnrs):.2f} dB (promise {level.worst_db})")
    summary = "; ".join(figures)
    for level, line in zip(quality.LEVELS.values(), figures, strict=True):
        assert float(line.split("worst ")[1].split(" dB")[0]) >= level.worst_db, summary
    assert speedups == sorted(speedups) and speedups[0] < speedups[-1], summary


def test_a_saved_calibration_made_worse_on_purpose_changes_nothing_at_a_level(host, caplog):
    """A level measures its own error and never uses a calibration, so a saved one cannot make it
    slower (or worse) than it is without: a calibration whose ratios say "nothing ever changes"
    makes quality custom skip every step it may, and leaves the level's output bit for bit."""
    import json
    import logging

    from harness.sampling import Job, apply, calibrate, stats

    model = host.test_module("tiny_models").build_model("flux", seed=21)
    job = Job("flux", steps=14)
    level_inputs = {"quality": "fast"}
    before = job.run(apply(model, "magcache", **level_inputs)[0])

    store = host.pack_module("nodes.calibration_store")
    _, calibration, _ = calibrate("MagCacheCalibrate", model, job, save=True)
    path = store.calibration_path("magcache", calibration.model)
    data = json.loads(path.read_text())
    for record in data["measures"]:
        record["magnitude_ratio"], record["cosine_distance"] = 1.0, 0.0
    path.write_text(json.dumps(data))
    try:
        custom, node_id = apply(model, "magcache", threshold=0.05, max_consecutive_skips=100, retention_ratio=0.0,
                                estimator="reuse", check="off")
        job.run(custom)
        assert stats(node_id)["constants"].startswith("this model's saved calibration")
        assert stats(node_id)["calls_skipped"] >= job.steps - 3  # the bad calibration bites at custom
        with caplog.at_level(logging.INFO, logger="stepcache"):
            leveled, node_id = apply(model, "magcache", **level_inputs)
        assert any("does not use this model's saved calibration" in r.getMessage() for r in caplog.records)
        after = job.run(leveled)
        assert "measures its own error" in stats(node_id)["constants"]
        assert torch.equal(before, after)
    finally:
        path.unlink()


def test_separate_cfg_branches_cost_nothing_under_the_measured_rule(host):
    """The measured rule measures both branches on the guided residual and decides them together,
    so cfg_branches separate never splits a call: the same steps skip, the output is the same."""
    from harness.sampling import Job, apply, patterns

    model = host.test_module("tiny_models").build_model("flux", seed=0)
    job = Job("flux", steps=16, cfg=4.0)
    outputs, seen = [], []
    for branches in ("together", "separate"):
        patched, node_id = apply(model, "magcache", skip_rule="measured", threshold=50.0, max_consecutive_skips=2,
                                 cfg_branches=branches, estimator="damped_forecast")
        outputs.append(job.run(patched))
        seen.append(patterns(node_id))
    assert seen[0] == seen[1] and "S" in seen[0]["cond"] and seen[0]["cond"] == seen[0]["uncond"]
    assert torch.equal(outputs[0], outputs[1])
