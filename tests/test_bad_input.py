"""Bad input over the HTTP API: every widget of every node of the pack, with out-of-range,
wrong-type, empty, NaN/infinite and malformed values, comes back from POST /prompt as ComfyUI's
validation error for that node (HTTP 400 with node_errors), reported once, under the input it is
about (or under the inputs of the one rule that relates it to others), and the server keeps serving.

The widgets and their ranges come from the server's own /object_info, so a new input is covered
without editing this file. Each node sits in a small graph that is valid as it stands (checked by
running it once), then one value at a time is made bad.
"""

from __future__ import annotations

import copy
import json
import math
import pathlib

import pytest

from harness.host import comfyui_version
from harness.server import PromptRejected

pytestmark = pytest.mark.server

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACK_MODULE = "custom_nodes.comfyui-stepcache"

# The rules that relate several inputs of a node: a bad value of one of them may be listed under
# each input of its rule (ComfyUI lists a node's own check under every input the check takes).
# Every other bad value is listed under its own input alone.
RELATED_INPUTS = {
    "ApplyTeaCache": {"start_percent", "end_percent"},
    "MagCacheRatiosFromText": {"text", "calibrated_steps", "interleaved"},
    "StepCacheDemoPrompt": {"kind", "subject"},
}

# Strings a user can paste into the text nodes that are not valid lists for them.
BAD_RATIO_TEXT = ["", "   ", "abc", "1.0, 0.9, x", "1.0, nan, 0.9", "1.0, inf", "1.0, -0.5, 0.9", "1.0"]
BAD_COEFFICIENT_TEXT = ["", "abc", "1.0", "1, nan", "1, inf", "1; 2"]


def tiny_sampling(cache: dict | None = None, steps: int = 10) -> dict:
    """Tiny Flux, KSampler, SaveLatent; ``cache`` (node id -> node) goes between model and sampler."""
    graph = {
        "model": {"class_type": "StepCacheTestTinyModel", "inputs": {"family": "flux", "seed": 0}},
        "pos": {"class_type": "StepCacheTestConditioning", "inputs": {"family": "flux", "seed": 1, "batch": 1}},
        "neg": {"class_type": "StepCacheTestConditioning", "inputs": {"family": "flux", "seed": 2, "batch": 1}},
        "latent": {"class_type": "StepCacheTestLatent",
                   "inputs": {"family": "flux", "batch": 1, "scale": 1, "frames": 0}},
        "sampler": {"class_type": "KSampler", "inputs": {
            "model": ["model", 0], "positive": ["pos", 0], "negative": ["neg", 0], "latent_image": ["latent", 0],
            "seed": 7, "steps": steps, "cfg": 3.0, "sampler_name": "euler", "scheduler": "simple", "denoise": 1.0}},
        "save": {"class_type": "SaveLatent", "inputs": {"samples": ["sampler", 0], "filename_prefix": "bad-input"}},
    }
    if cache:
        graph |= cache
        graph["sampler"]["inputs"]["model"] = [next(iter(cache)), 0]
    return graph


def apply_node(class_type: str, **extra: object) -> dict:
    widgets = {
        "ApplyTeaCache": {"threshold": 0.4, "start_percent": 0.0, "end_percent": 1.0, "max_consecutive_skips": 3,
                          "cache_device": "main_device", "variant": "auto"},
        # The tiny model is no published checkpoint: FLUX.1-dev's ratios, chosen by name.
        "ApplyMagCache": {"threshold": 0.06, "max_consecutive_skips": 2, "retention_ratio": 0.2,
                          "cache_device": "main_device", "variant": "flux.1-dev"},
    }[class_type]
    return {"class_type": class_type, "inputs": {"model": ["model", 0], **widgets, **extra}}


def calibrate_graph(class_type: str) -> dict:
    graph = tiny_sampling()
    graph["sampler"] = {"class_type": class_type, "inputs": {
        **graph["sampler"]["inputs"], "save_calibration": False}}
    return graph


def base_graphs() -> dict[str, tuple[dict, str]]:
    """Per node class: a valid graph holding it, and the id of the node under test."""
    demo = json.loads((ROOT / "example_workflows" / "api" / "demo_image_magcache.json").read_text())
    graphs = {
        "ApplyTeaCache": (tiny_sampling({"node": apply_node("ApplyTeaCache")}), "node"),
        "ApplyMagCache": (tiny_sampling({"node": apply_node("ApplyMagCache")}), "node"),
        "MagCacheCalibrate": (calibrate_graph("MagCacheCalibrate"), "sampler"),
        "TeaCacheCalibrate": (calibrate_graph("TeaCacheCalibrate"), "sampler"),
    }
    ratios = "1.0, 0.98, 0.97, 0.97, 0.96, 0.96, 0.95, 0.95, 0.94, 0.94"
    graphs["MagCacheRatiosFromText"] = (tiny_sampling({
        "cache": apply_node("ApplyMagCache", ratios=["node", 0]),
        "node": {"class_type": "MagCacheRatiosFromText",
                 "inputs": {"text": ratios, "calibrated_steps": 10, "interleaved": False}}}), "node")
    graphs["TeaCacheCoefficientsFromText"] = (tiny_sampling({
        "cache": apply_node("ApplyTeaCache", coefficients=["node", 0]),
        "node": {"class_type": "TeaCacheCoefficientsFromText", "inputs": {"text": "1.0, 0.0"}}}), "node")
    graphs["StepCacheCompileBlocks"] = (tiny_sampling({
        "cache": apply_node("ApplyMagCache", model=["node", 0]),
        "node": {"class_type": "StepCacheCompileBlocks", "inputs": {"model": ["model", 0], "backend": "inductor"}}}),
        "node")
    for node_id, node in demo.items():
        if node["class_type"].startswith("StepCacheDemo"):
            graphs.setdefault(node["class_type"], (demo, node_id))
    return graphs


def bad_values(class_type: str, name: str, spec: list) -> list:
    kind, options = spec[0], (spec[1] if len(spec) > 1 else {})
    if isinstance(kind, list) or kind == "COMBO":
        return ["no-such-option", 7, ""]
    if kind in ("INT", "FLOAT"):
        values = ["abc", "", None]
        if "min" in options:
            values.append(options["min"] - 1)
        if "max" in options:
            values.append(options["max"] + 1)
        if kind == "FLOAT":
            values += [math.nan, math.inf, -math.inf]
        return values
    if kind == "STRING":
        return {"MagCacheRatiosFromText": BAD_RATIO_TEXT,
                "TeaCacheCoefficientsFromText": BAD_COEFFICIENT_TEXT}.get(class_type, [])
    return []  # BOOLEAN: ComfyUI turns any value into a bool; links: not widgets


@pytest.fixture(scope="module")
def pack_inputs(server) -> dict[str, dict]:
    info = server.get("/object_info")
    return {name: {**node["input"].get("required", {}), **node["input"].get("optional", {})}
            for name, node in info.items() if node["python_module"] == PACK_MODULE}


def test_every_pack_node_has_a_base_graph(pack_inputs):
    assert set(pack_inputs) == set(base_graphs())


@pytest.mark.parametrize("class_type", sorted(base_graphs()))
def test_bad_widget_values_are_refused_for_that_node(server, pack_inputs, class_type):
    graph, node_id = base_graphs()[class_type]
    entry = server.run(graph, timeout=300)  # the graph is valid as it stands
    assert entry["status"]["status_str"] == "success", entry["status"]

    widgets = {name: spec for name, spec in pack_inputs[class_type].items() if name in graph[node_id]["inputs"]
               and not isinstance(graph[node_id]["inputs"][name], list)}
    checked = 0
    for name, spec in widgets.items():
        for value in bad_values(class_type, name, spec):
            bad = copy.deepcopy(graph)
            bad[node_id]["inputs"][name] = value
            with pytest.raises(PromptRejected) as rejected:
                server.queue(bad)
            where = f"{class_type}.{name} = {value!r}"
            assert_reported_once(rejected.value.body, node_id, name, class_type, where)
            checked += 1
    assert checked >= len(widgets) - sum(1 for s in widgets.values() if s[0] == "BOOLEAN")
    assert server.get("/system_stats")["system"]["comfyui_version"] == comfyui_version()


def assert_reported_once(body: dict, node_id: str, name: str, class_type: str, where: str) -> None:
    """One error per input, under ``name`` and at most the other inputs of its rule."""
    assert list(body["node_errors"]) == [node_id], f"{where}: {body}"
    errors = body["node_errors"][node_id]["errors"]
    inputs = [error["extra_info"]["input_name"] for error in errors]
    assert len(inputs) == len(set(inputs)), f"{where}: the same input reported twice: {errors}"
    related = RELATED_INPUTS.get(class_type, set())
    allowed = related if name in related else {name}
    assert name in inputs and set(inputs) <= allowed, f"{where}: reported under {inputs}: {errors}"
    text = " ".join(f"{e['message']} {e['details']}" for e in errors)
    assert name in text, f"{where}: the error does not name the input: {text}"


# A value each input takes on its own, in a combination the node's rule refuses.
RULE_VIOLATIONS = {
    "ApplyTeaCache": {"start_percent": 0.8, "end_percent": 0.2},
    "MagCacheRatiosFromText": {"text": "1.0, 0.98, 0.97", "calibrated_steps": 0, "interleaved": True},
    "StepCacheDemoPrompt": {"kind": "video", "subject": "disc"},
}


@pytest.mark.parametrize("class_type", sorted(RULE_VIOLATIONS))
def test_a_rule_between_inputs_is_reported_under_those_inputs_only(server, class_type):
    graph, node_id = base_graphs()[class_type]
    bad = copy.deepcopy(graph)
    bad[node_id]["inputs"] |= RULE_VIOLATIONS[class_type]
    with pytest.raises(PromptRejected) as rejected:
        server.queue(bad)
    body = rejected.value.body
    assert list(body["node_errors"]) == [node_id], body
    errors = body["node_errors"][node_id]["errors"]
    assert sorted(error["extra_info"]["input_name"] for error in errors) == sorted(RELATED_INPUTS[class_type])
    assert len({error["details"].split(" - ", 1)[1] for error in errors}) == 1, errors  # one message


def test_the_server_still_runs_a_good_cached_graph_afterwards(server):
    entry = server.run(tiny_sampling({"node": apply_node("ApplyMagCache")}, steps=12))
    assert entry["status"]["status_str"] == "success", entry["status"]

