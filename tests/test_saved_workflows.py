"""Saved workflows keep loading: variant options the Apply nodes once offered still validate over
POST /prompt and run, as the variant whose published constants they used, with a warning that
names it.

The families work (published constants only for the architecture they were measured on) removed
four options: ApplyTeaCache flux.1-schnell, wan2.1-vace-1.3b and wan2.1-vace-14b, and
ApplyMagCache flux.1-schnell. Each had borrowed another checkpoint's constants (FLUX.1-dev's, and
Wan 2.1 T2V's of the same size).
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.server

# node, legacy option, tiny model to run it on, the variant it runs as, whose constants are named.
LEGACY = [
    ("ApplyTeaCache", "flux.1-schnell", "flux", "flux.1-dev",
     "published FLUX.1-dev coefficients (ali-vilab/TeaCache), chosen with the variant input"),
    ("ApplyMagCache", "flux.1-schnell", "flux", "flux.1-dev",
     "published FLUX.1-dev ratios (Zehong-Ma/MagCache), chosen with the variant input"),
    ("ApplyTeaCache", "wan2.1-vace-1.3b", "wan21_vace", "wan2.1-t2v-1.3b",
     "published Wan2.1-T2V-1.3B coefficients (ali-vilab/TeaCache), chosen with the variant input"),
    ("ApplyTeaCache", "wan2.1-vace-14b", "wan21_vace", "wan2.1-t2v-14b",
     "published Wan2.1-T2V-14B coefficients (ali-vilab/TeaCache), chosen with the variant input"),
]

WIDGETS = {
    "ApplyTeaCache": {"threshold": 0.4, "start_percent": 0.0, "end_percent": 1.0, "max_consecutive_skips": 3,
                      "cache_device": "main_device"},
    "ApplyMagCache": {"threshold": 0.06, "max_consecutive_skips": 2, "retention_ratio": 0.2,
                      "cache_device": "main_device"},
}


def graph(node: str, variant: str, family: str) -> dict:
    """A saved API graph: tiny model, the Apply node with ``variant``, KSampler, SaveLatent."""
    return {
        "model": {"class_type": "StepCacheTestTinyModel", "inputs": {"family": family, "seed": 0}},
        "pos": {"class_type": "StepCacheTestConditioning", "inputs": {"family": family, "seed": 1, "batch": 1}},
        "neg": {"class_type": "StepCacheTestConditioning", "inputs": {"family": family, "seed": 2, "batch": 1}},
        "latent": {"class_type": "StepCacheTestLatent",
                   "inputs": {"family": family, "batch": 1, "scale": 1, "frames": 0}},
        "cache": {"class_type": node, "inputs": {"model": ["model", 0], **WIDGETS[node], "variant": variant}},
        "sampler": {"class_type": "KSampler", "inputs": {
            "model": ["cache", 0], "positive": ["pos", 0], "negative": ["neg", 0], "latent_image": ["latent", 0],
            "seed": 7, "steps": 12, "cfg": 3.0, "sampler_name": "euler", "scheduler": "simple", "denoise": 1.0}},
        "save": {"class_type": "SaveLatent", "inputs": {"samples": ["sampler", 0], "filename_prefix": "legacy"}},
    }


@pytest.mark.parametrize(("node", "legacy", "family", "replacement", "constants"), LEGACY,
                         ids=[f"{n}-{v}" for n, v, *_ in LEGACY])
def test_a_legacy_variant_option_validates_and_runs_as_the_variant_it_used(server, node, legacy, family,
                                                                         replacement, constants):
    options = server.get(f"/object_info/{node}")[node]["input"]["optional"]["variant"]
    assert legacy in options[0] if isinstance(options[0], list) else legacy in options[1]["options"]
    prompt_id = server.queue(graph(node, legacy, family))  # PromptRejected (HTTP 400) if it did not validate
    entry = server.wait(prompt_id, timeout=300)
    assert entry["status"]["status_str"] == "success", entry["status"]
    (run,) = server.get(f"/stepcache/stats?prompt_id={prompt_id}")
    assert run["node"] == "cache" and run["constants"] == constants
    warning = (f"[StepCache] {node}: variant '{legacy}' is a legacy option; using '{replacement}', whose "
               "published")
    assert warning in server.log()


def test_the_same_run_with_the_replacement_named_gives_the_same_latent(server):
    """A legacy option is exactly its replacement: same constants, same skips, same output."""
    import torch
    from safetensors.torch import load_file

    latents = []
    for variant in ("flux.1-schnell", "flux.1-dev"):
        saved = graph("ApplyTeaCache", variant, "flux")
        saved["save"]["inputs"]["filename_prefix"] = f"legacy-same/{variant}"
        before = set(server.output_files())
        assert server.run(saved, timeout=300)["status"]["status_str"] == "success"
        (written,) = [p for p in server.output_files() if p not in before and p.suffix == ".latent"]
        latents.append(load_file(str(written))["latent_tensor"])
    assert torch.equal(*latents)


def test_a_legacy_option_of_another_family_is_still_refused_at_run_time(server):
    prompt_id = server.queue(graph("ApplyTeaCache", "wan2.1-vace-1.3b", "flux"))
    entry = server.wait(prompt_id, timeout=300)
    assert entry["status"]["status_str"] == "error"
    (error,) = [m[1] for m in entry["status"]["messages"] if m[0] == "execution_error"]
    assert error["node_id"] == "cache"
    assert "variant 'wan2.1-vace-1.3b' is not a flux model" in error["exception_message"]
