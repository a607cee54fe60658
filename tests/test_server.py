"""The real ComfyUI HTTP server runs graphs with this pack and the test nodes loaded."""

from __future__ import annotations

import pytest
import torch

from harness.host import comfyui_version

pytestmark = pytest.mark.server


def read_latent(path) -> torch.Tensor:
    """A latent file written by ComfyUI's SaveLatent node."""
    from safetensors.torch import load_file

    return load_file(str(path))["latent_tensor"]


def tiny_graph(family: str, steps: int = 4, cfg: float = 3.0) -> dict:
    return {
        "model": {"class_type": "StepCacheTestTinyModel", "inputs": {"family": family, "seed": 0}},
        "pos": {"class_type": "StepCacheTestConditioning", "inputs": {"family": family, "seed": 1, "batch": 1}},
        "neg": {"class_type": "StepCacheTestConditioning", "inputs": {"family": family, "seed": 2, "batch": 1}},
        "latent": {"class_type": "StepCacheTestLatent",
                   "inputs": {"family": family, "batch": 1, "scale": 1, "frames": 0}},
        "sampler": {"class_type": "KSampler", "inputs": {
            "model": ["model", 0], "positive": ["pos", 0], "negative": ["neg", 0], "latent_image": ["latent", 0],
            "seed": 7, "steps": steps, "cfg": cfg, "sampler_name": "euler", "scheduler": "simple", "denoise": 1.0}},
        "save": {"class_type": "SaveLatent",
                 "inputs": {"samples": ["sampler", 0], "filename_prefix": f"latents/{family}"}},
    }


def test_server_is_the_host_comfyui_with_the_pack(server):
    stats = server.get("/system_stats")
    assert stats["system"]["comfyui_version"] == comfyui_version()
    info = server.get("/object_info")
    assert "StepCacheTestTinyModel" in info and "EasyCache" in info
    assert {"ApplyTeaCache", "ApplyMagCache", "MagCacheCalibrate", "TeaCacheCalibrate"} <= info.keys()


def test_api_prompt_runs_to_completion_and_writes_output(server):
    before = set(server.output_files())
    entry = server.run(tiny_graph("flux"))
    assert entry["status"]["status_str"] == "success", entry["status"]
    written = [p for p in server.output_files() if p not in before and p.suffix == ".latent"]
    assert len(written) == 1
    latent = read_latent(written[0])
    assert latent.shape == (1, 16, 16, 16)
    assert torch.isfinite(latent).all() and latent.abs().sum() > 0


def test_tiny_wan_checkpoint_loads_through_the_real_unet_loader(server, host):
    from safetensors.torch import save_file

    tiny = host.test_module("tiny_models")
    model = tiny.build_model("wan21", seed=3)
    state = {k: v.contiguous() for k, v in model.model.diffusion_model.state_dict().items()}
    save_file(state, str(server.base_directory / "models" / "diffusion_models" / "tiny_wan.safetensors"))

    graph = tiny_graph("wan21")
    graph["model"] = {"class_type": "UNETLoader",
                      "inputs": {"unet_name": "tiny_wan.safetensors", "weight_dtype": "default"}}
    before = set(server.output_files())
    entry = server.run(graph)
    assert entry["status"]["status_str"] == "success", entry["status"]
    (written,) = [p for p in server.output_files() if p not in before and p.suffix == ".latent"]
    latent = read_latent(written)
    assert latent.shape == (1, 16, 3, 8, 8)
    assert torch.isfinite(latent).all()


GENERIC_FLUX = "flux / flux-architecture model (not a published checkpoint)"
CHOSEN_FLUX_RATIOS = "published FLUX.1-dev ratios (Zehong-Ma/MagCache), chosen with the variant input"


def test_cached_graph_over_http_reports_its_stats(server):
    graph = tiny_graph("flux", steps=12)
    graph["cache"] = {"class_type": "ApplyMagCache", "inputs": {
        "model": ["model", 0], "threshold": 0.5, "max_consecutive_skips": 4, "retention_ratio": 0.1,
        "cache_device": "main_device", "variant": "flux.1-dev"}}
    graph["sampler"]["inputs"]["model"] = ["cache", 0]
    prompt_id = server.queue(graph)
    entry = server.wait(prompt_id)
    assert entry["status"]["status_str"] == "success", entry["status"]
    (run,) = server.get(f"/stepcache/stats?prompt_id={prompt_id}")
    # The label says what the model is; the constants, whose they are and that they were chosen.
    assert run["node"] == "cache" and run["label"] == GENERIC_FLUX
    assert run["constants"] == CHOSEN_FLUX_RATIOS
    assert {b["branch"] for b in run["branches"]} == {"cond", "uncond"}
    assert run["calls_computed"] + run["calls_skipped"] == 12 and run["calls_skipped"] > 0
    # The graph leaves the optional inputs out, as API clients do: it gets the node's defaults.
    assert (f"[StepCache] {GENERIC_FLUX}: MagCache + damped forecast (damping 0.5) ({CHOSEN_FLUX_RATIOS}): "
            "cond: skipped") in server.log()
    assert run["estimator"] == "damped forecast (damping 0.5)" and "refused by the hindsight check" in server.log()


def test_a_model_without_published_ratios_is_refused_by_applymagcache_on_auto(server):
    graph = tiny_graph("flux", steps=12)
    graph["cache"] = {"class_type": "ApplyMagCache", "inputs": {
        "model": ["model", 0], "threshold": 0.5, "max_consecutive_skips": 4, "retention_ratio": 0.1,
        "cache_device": "main_device", "variant": "auto"}}
    graph["sampler"]["inputs"]["model"] = ["cache", 0]
    prompt_id = server.queue(graph)
    entry = server.wait(prompt_id)
    assert entry["status"]["status_str"] == "error"
    (error,) = [m[1] for m in entry["status"]["messages"] if m[0] == "execution_error"]
    assert error["node_id"] == "cache" and not server.get(f"/stepcache/stats?prompt_id={prompt_id}")
    assert f"no MagCache ratios are published for this model ({GENERIC_FLUX})" in error["exception_message"]


def test_stats_name_the_node_of_this_prompt_when_another_had_equal_inputs(server):
    """ComfyUI reuses a node's cached output for equal inputs across prompts; the patched model
    carries its node id, so the Apply nodes must not be shared between node ids."""
    graph = tiny_graph("flux", steps=12, cfg=2.0)
    cache = {"class_type": "ApplyMagCache", "inputs": {
        "model": ["model", 0], "threshold": 0.5, "max_consecutive_skips": 4, "retention_ratio": 0.1,
        "cache_device": "main_device", "variant": "flux.1-dev"}}
    for node_id in ("first-cache", "second-cache"):
        other = {k: v for k, v in graph.items()} | {node_id: cache}
        other["sampler"] = {**graph["sampler"], "inputs": {**graph["sampler"]["inputs"], "model": [node_id, 0]}}
        prompt_id = server.queue(other)
        assert server.wait(prompt_id)["status"]["status_str"] == "success"
        assert [run["node"] for run in server.get(f"/stepcache/stats?prompt_id={prompt_id}")] == [node_id]


def test_bad_widget_values_are_validation_errors_and_the_server_keeps_serving(server):
    from harness.server import PromptRejected

    graph = tiny_graph("flux", steps=12)
    graph["cache"] = {"class_type": "ApplyTeaCache", "inputs": {
        "model": ["model", 0], "threshold": -1.0, "start_percent": 0.9, "end_percent": 0.1,
        "max_consecutive_skips": 3, "cache_device": "main_device"}}
    graph["sampler"]["inputs"]["model"] = ["cache", 0]
    with pytest.raises(PromptRejected) as rejected:
        server.queue(graph)
    errors = rejected.value.body["node_errors"]["cache"]["errors"]
    text = " ".join(e["details"] + e["message"] for e in errors)
    assert "threshold" in text and "start_percent" in text
    assert server.get("/system_stats")["system"]["comfyui_version"] == comfyui_version()


def api_workflows() -> list:
    import pathlib

    # The demo graphs need no model files; the real-model ones run with tiny stand-ins in
    # tests/test_example_workflows.py.
    return sorted((pathlib.Path(__file__).resolve().parents[1] / "example_workflows" / "api").glob("demo_*.json"))


@pytest.mark.parametrize("path", api_workflows(), ids=lambda p: p.stem)
def test_every_api_example_workflow_runs_with_the_cache(server, path):
    import json

    graph = json.loads(path.read_text())
    prompt_id = server.queue(graph)
    entry = server.wait(prompt_id, timeout=300)
    assert entry["status"]["status_str"] == "success", entry["status"]
    runs = server.get(f"/stepcache/stats?prompt_id={prompt_id}")
    cached = [run for run in runs if run["method"] != "calibration"]  # calibration runs never skip
    assert cached and all(run["disabled_reason"] is None for run in runs)
    assert all(run["calls_skipped"] > 0 for run in cached)


def test_a_saved_calibration_is_found_again_by_a_new_server_process():
    from harness.server import ComfyServer

    graph = tiny_graph("flux", steps=12)
    graph["model"]["inputs"]["seed"] = 21  # a model no other test calibrates
    graph["sampler"] = {"class_type": "MagCacheCalibrate", "inputs": {
        "model": ["model", 0], "positive": ["pos", 0], "negative": ["neg", 0], "latent_image": ["latent", 0],
        "seed": 3, "steps": 12, "cfg": 3.0, "sampler_name": "euler", "scheduler": "simple", "denoise": 1.0,
        "save_calibration": True}}
    with ComfyServer() as first:
        entry = first.run(graph)
        assert entry["status"]["status_str"] == "success", entry["status"]
        report = entry["outputs"]["sampler"]["text"][0]
        assert "saved to" in report
        base = first.base_directory

    applied = tiny_graph("flux", steps=12)
    applied["model"]["inputs"]["seed"] = 21
    applied["cache"] = {"class_type": "ApplyMagCache", "inputs": {
        "model": ["model", 0], "threshold": 0.2, "max_consecutive_skips": 3, "retention_ratio": 0.1,
        "cache_device": "main_device"}}
    applied["sampler"]["inputs"]["model"] = ["cache", 0]
    with ComfyServer(base_directory=base) as second:
        entry = second.run(applied)
        assert entry["status"]["status_str"] == "success", entry["status"]
        assert "ApplyMagCache: using this model's saved calibration" in second.log()


def test_the_readme_headless_example_runs_and_prints_the_cache_stats(server, tmp_path):
    """The README's standard-library client, exactly as printed there, against the real server."""
    import pathlib
    import re
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parents[1]
    blocks = re.findall(r"```python\n(# headless-example.*?)```", (root / "README.md").read_text(), re.S)
    assert len(blocks) == 1, "the README's headless example block is missing"
    script = tmp_path / "headless.py"
    script.write_text(blocks[0])
    done = subprocess.run([sys.executable, str(script), "example_workflows/api/demo_image_magcache.json"],
                          cwd=root, env={"COMFY_URL": server.url, "PATH": ""}, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "status: success" in done.stdout
    summary = re.search(r"node \S+: measured error \+ damped forecast \(damping 0.5\) \(quality balanced: none "
                        r"needed \(the run measures its own error\); skip feedback on\): "
                        r".*block stack ran (\d+)/(\d+) calls", done.stdout)
    assert summary, done.stdout
    computed, total = map(int, summary.groups())
    assert 0 < computed < total  # the demo workflow does skip
    patterns = dict(re.findall(r"  (\w+): ([CS]+)\n", done.stdout))
    assert patterns.keys() == {"cond", "uncond"}, done.stdout
    assert all(p.count("C") == computed for p in patterns.values())
