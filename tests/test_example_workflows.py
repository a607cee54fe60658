"""The example workflows users open: valid for the real ComfyUI, in step with their generator, and
runnable end to end on the real server.

UI files (example_workflows/*.json) are what the template browser lists and the frontend loads;
their API twins (example_workflows/api/) are what POST /prompt takes. Both are written by
scripts/make_workflows.py. The real-model graphs run here with their loaders swapped for the tiny
test models of the same family (the test host has no model files); the cache nodes, samplers and
stages stay as users have them.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import pathlib
import sys
from typing import Any

import pytest

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
UI_DIR = REPO_ROOT / "example_workflows"
API_DIR = UI_DIR / "api"
UI_FILES = sorted(UI_DIR.glob("*.json"))
API_FILES = sorted(API_DIR.glob("*.json"))

# Drawn by the frontend, never sent to the server (no backend class).
FRONTEND_ONLY = {"Note", "MarkdownNote"}
WIDGET_TYPES = {"INT", "FLOAT", "STRING", "BOOLEAN", "COMBO"}
CACHE_NODES = {"ApplyMagCache", "ApplyTeaCache"}

# Which tiny test model stands in for each real-model workflow. Wan 2.2 A14B has the Wan 2.1 14B
# architecture; the workflow picks its variant by hand, which the tiny Wan 2.1 model takes too.
TINY_FAMILY = {
    "flux1_dev_magcache": "flux",
    "flux1_dev_controlnet_magcache": "flux",
    "flux2_dev_teacache": "flux2",
    "flux2_dev_calibrate_magcache": "flux2",
    "wan21_t2v_magcache": "wan21",
    "wan21_t2v_context_windows_magcache": "wan21",
    "wan22_t2v_two_stage_magcache": "wan21",
    "hunyuan_video_magcache": "hunyuan_video",
    "qwen_image_magcache": "qwen_image",
}
# The variant auto detects for each workflow's real checkpoint at the workflow's size. A tiny
# stand-in is no published checkpoint (auto gives it no published constants), so its graph names
# that variant, as a user would for a fine-tune.
REAL_VARIANT = {
    "flux1_dev_magcache": "flux.1-dev",
    "flux1_dev_controlnet_magcache": "flux.1-dev",
    "wan21_t2v_magcache": "wan2.1-t2v-1.3b",
    "wan21_t2v_context_windows_magcache": "wan2.1-t2v-1.3b",
    "hunyuan_video_magcache": "hunyuanvideo-544p",  # 848 x 480: the 544p table
    "qwen_image_magcache": "qwen-image",
}
# The demo graphs need no downloads and run unchanged in tests/test_server.py.
DEMO_PREFIX = "demo_"
# Pixels per latent cell of each empty-latent node, to ask it for the tiny model's latent size.
LATENT_STRIDE = {"EmptySD3LatentImage": 8, "EmptyFlux2LatentImage": 16, "EmptyHunyuanLatentVideo": 8}
FILE_LOADERS = {"UNETLoader", "CLIPLoader", "DualCLIPLoader", "VAELoader"}
# Widgets naming the user's files, which are not on this host.
MODEL_FILE_WIDGETS = {"unet_name", "clip_name", "clip_name1", "clip_name2", "vae_name", "control_net_name", "image"}
DECODERS = {"VAEDecode", "VAEDecodeTiled"}
# Widgets a newer ComfyUI appended to a node that the older one lacks: the older frontend assigns
# widgets_values by position and ignores what is left over, its server ignores undeclared inputs.
LATER_WIDGETS = {"WanContextWindowsManual": ("freenoise", "retain_first_frame", "split_conds_to_windows")}
# Context windows of 2 latent frames that overlap by 1, on the tiny model's 3 (the Wan node takes
# pixel frames).
TINY_WINDOWS = {"WanContextWindowsManual": (5, 4), "ContextWindowsManual": (2, 1)}


def load_generator() -> Any:
    spec = importlib.util.spec_from_file_location("make_workflows", REPO_ROOT / "scripts" / "make_workflows.py")
    module = importlib.util.module_from_spec(spec)
    # dataclasses resolve the script's string annotations through sys.modules.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def type_name(kind: Any) -> str:
    """An input or output type as a string (V3 nodes give str enums, combos a list of options)."""
    if isinstance(kind, list):
        return "COMBO"
    return str(getattr(kind, "value", kind))


def input_specs(node_class: type) -> list[tuple[str, str, dict]]:
    """(name, type, options) of every input, required first, as the frontend orders them."""
    spec = node_class.INPUT_TYPES()
    specs = []
    for section in ("required", "optional"):
        for name, entry in spec.get(section, {}).items():
            options = dict(entry[1]) if len(entry) > 1 and isinstance(entry[1], dict) else {}
            if isinstance(entry[0], list):
                options.setdefault("options", entry[0])
            specs.append((name, type_name(entry[0]), options | {"required": section == "required"}))
    return specs


def is_widget(kind: str, options: dict) -> bool:
    return kind in WIDGET_TYPES and not options.get("forceInput")


def widget_names(node_class: type) -> list[tuple[str, bool]]:
    """(widget name, has a control_after_generate value after it), in widgets_values order."""
    return [(name, bool(options.get("control_after_generate")))
            for name, kind, options in input_specs(node_class) if is_widget(kind, options)]


def ui_to_api(ui: dict, classes: dict) -> dict:
    """What the frontend queues for a UI workflow (its 'Export (API)'), from the real node inputs."""
    links = {link[0]: link for link in ui["links"]}
    graph = {}
    for node in ui["nodes"]:
        if node["type"] in FRONTEND_ONLY:
            continue
        values = list(node.get("widgets_values", []))
        inputs: dict[str, Any] = {}
        for name, control in widget_names(classes[node["type"]]):
            inputs[name] = values.pop(0)
            if control:
                values.pop(0)
        for slot in node.get("inputs", []):
            if slot["link"] is not None:
                link = links[slot["link"]]
                inputs[slot["name"]] = [str(link[1]), link[2]]
        graph[str(node["id"])] = {"class_type": node["type"], "inputs": inputs}
    return graph


@pytest.fixture(scope="module")
def classes(host) -> dict:
    import nodes

    return nodes.NODE_CLASS_MAPPINGS


# The files ---------------------------------------------------------------------------------


def test_committed_workflows_are_the_generators_output():
    expected = load_generator().expected_files()
    stale = [str(p.relative_to(REPO_ROOT)) for p, text in expected.items()
             if not p.exists() or p.read_text() != text]
    assert not stale, f"run scripts/make_workflows.py and commit: {stale}"
    # A hand-added file would have no twin and no generator entry.
    assert set(UI_FILES) | set(API_FILES) == set(expected)


def test_every_ui_workflow_has_an_api_twin_and_one_family_per_real_model_graph():
    assert [p.name for p in UI_FILES] == [p.name for p in API_FILES]
    real = {p.stem for p in UI_FILES if not p.stem.startswith(DEMO_PREFIX)}
    assert real == set(TINY_FAMILY)


def test_the_template_browser_lists_the_ui_workflows_only(server):
    """ComfyUI lists custom_nodes/<pack>/example_workflows/*.json: the api/ twins are not templates."""
    from harness.host import PACK_FOLDER_NAME

    templates = server.get("/workflow_templates")
    assert sorted(templates[PACK_FOLDER_NAME]) == sorted(p.stem for p in UI_FILES)
    name = UI_FILES[0].name
    served = server.get(f"/api/workflow_templates/{PACK_FOLDER_NAME}/{name}")
    assert served == json.loads(UI_FILES[0].read_text())


# UI format against the real nodes --------------------------------------------------------------


@pytest.mark.parametrize("path", UI_FILES, ids=lambda p: p.stem)
def test_ui_workflow_is_valid_for_the_real_comfyui(path, classes):
    ui = json.loads(path.read_text())
    assert ui["version"] == 0.4
    assert {"nodes", "links", "groups", "last_node_id", "last_link_id"} <= ui.keys()
    nodes_by_id = {node["id"]: node for node in ui["nodes"]}
    assert len(nodes_by_id) == len(ui["nodes"]) and max(nodes_by_id) <= ui["last_node_id"]
    assert len({link[0] for link in ui["links"]}) == len(ui["links"])
    assert max((link[0] for link in ui["links"]), default=0) <= ui["last_link_id"]
    assert sum(node["type"] in FRONTEND_ONLY for node in ui["nodes"]) >= 1, "every workflow explains itself"

    for node in ui["nodes"]:
        where = f"{path.stem} node {node['id']} ({node['type']})"
        if node["type"] in FRONTEND_ONLY:
            assert isinstance(node["widgets_values"][0], str) and node["widgets_values"][0].strip()
            continue
        assert node["type"] in classes, f"{where}: no such node in this ComfyUI with the pack loaded"
        node_class = classes[node["type"]]
        specs = {name: (kind, options) for name, kind, options in input_specs(node_class)}

        # Sockets: real non-widget inputs, same type; every required one connected.
        sockets = node.get("inputs", [])
        for slot in sockets:
            kind, options = specs[slot["name"]]
            assert not is_widget(kind, options) and slot["type"] == kind, f"{where}: input {slot['name']}"
        connected = {slot["name"] for slot in sockets if slot["link"] is not None}
        required = {name for name, (kind, options) in specs.items()
                    if options["required"] and not is_widget(kind, options)}
        assert required <= connected, f"{where}: unconnected {required - connected}"

        # Widgets: one value per widget input (+ the seed's control value), each one allowed.
        widgets = widget_names(node_class)
        values = list(node.get("widgets_values", []))
        later = [name for name in LATER_WIDGETS.get(node["type"], ()) if name not in specs]
        assert len(values) == len(widgets) + sum(control for _, control in widgets) + len(later), \
            f"{where}: widgets_values"
        for name, control in widgets:
            value = values.pop(0)
            kind, options = specs[name]
            if control:
                assert values.pop(0) in ("fixed", "increment", "decrement", "randomize"), where
            if kind == "COMBO" and name not in MODEL_FILE_WIDGETS:  # users' files are not on this host
                assert value in options["options"], f"{where}: {name}={value!r}"
            if kind in ("INT", "FLOAT"):
                assert isinstance(value, (int, float)) and not isinstance(value, bool), f"{where}: {name}"
                assert options.get("min", value) <= value <= options.get("max", value), f"{where}: {name}"
            if kind == "BOOLEAN":
                assert isinstance(value, bool), f"{where}: {name}"

        if "outputs" in node:
            outputs = [output["type"] for output in node["outputs"]]
            assert outputs == [type_name(t) for t in node_class.RETURN_TYPES], f"{where}: outputs"
        else:
            # The frontend gives the node its definition's outputs. Only for output nodes, which
            # link nothing onwards and gained outputs in 0.30.0 (SaveImage, PreviewAny, ...).
            assert getattr(node_class, "OUTPUT_NODE", False), f"{where}: outputs"

    # Links: both ends agree, types match (or the input takes anything).
    for link_id, origin, origin_slot, target, target_slot, kind in ui["links"]:
        output = nodes_by_id[origin]["outputs"][origin_slot]
        slot = nodes_by_id[target]["inputs"][target_slot]
        assert link_id in output["links"] and slot["link"] == link_id
        assert output["type"] == kind and slot["type"] in (kind, "*")
    referenced = {slot["link"] for n in ui["nodes"] for slot in n.get("inputs", []) if slot["link"] is not None}
    referenced |= {i for n in ui["nodes"] for out in n.get("outputs", []) for i in out["links"]}
    assert referenced == {link[0] for link in ui["links"]}


@pytest.mark.parametrize("path", UI_FILES, ids=lambda p: p.stem)
def test_every_node_has_a_unique_human_title_the_same_in_both_formats(path, classes):
    """Clients address nodes by title (issue 13): one title per node, what the UI shows, in both files."""
    import nodes

    ui = json.loads(path.read_text())
    api = json.loads((API_DIR / path.name).read_text())
    titles = [node.get("title") for node in ui["nodes"]]
    assert all(titles), f"{path.stem}: untitled nodes: {[n['type'] for n in ui['nodes'] if not n.get('title')]}"
    assert len(set(titles)) == len(titles), f"{path.stem}: titles used twice: {sorted(titles)}"
    for node in ui["nodes"]:
        if node["type"] in FRONTEND_ONLY:
            continue
        assert api[str(node["id"])]["_meta"]["title"] == node["title"]
        # A class id is not a title, unless the node's own display name is its id (KSampler).
        display_name = nodes.NODE_DISPLAY_NAME_MAPPINGS.get(node["type"], node["type"])
        assert node["title"] != node["type"] or display_name == node["type"], f"{path.stem}: {node['title']}"


@pytest.mark.parametrize("path", UI_FILES, ids=lambda p: p.stem)
def test_api_twin_is_the_ui_workflow_as_the_frontend_queues_it(path, classes):
    ui = json.loads(path.read_text())
    api = json.loads((API_DIR / path.name).read_text())
    stripped = {node_id: {k: v for k, v in node.items() if k != "_meta"} for node_id, node in api.items()}
    for node in stripped.values():  # what this ComfyUI's frontend queues of a newer node's inputs
        declared = {name for name, _, _ in input_specs(classes[node["class_type"]])}
        node["inputs"] = {k: v for k, v in node["inputs"].items()
                          if k in declared or k not in LATER_WIDGETS.get(node["class_type"], ())}
    assert stripped == ui_to_api(ui, classes)


# Running them ------------------------------------------------------------------------------


def tiny_graph(graph: dict, family: str, tiny_spatial: tuple[int, ...]) -> dict:
    """The graph with its model files replaced by the tiny test model of ``family``.

    Diffusion models become StepCacheTestTinyModel (one seed per loader: two Wan 2.2 experts stay two
    models), text encoding StepCacheTestConditioning, empty latents ask for the tiny latent size,
    and VAE decoding an output node that keeps nothing (what it fed is dropped). A ControlNet becomes
    a tiny one for the (first) tiny model, its image an EmptyImage of the tiny size, and it takes no
    VAE. Everything else (cache nodes, model sampling, guidance, samplers, stages, ControlNet
    application) is the user's graph, unchanged.
    """
    graph = copy.deepcopy(graph)
    height, width = tiny_spatial[-2:]
    frames = tiny_spatial[0] if len(tiny_spatial) == 3 else 1
    loaders = 0
    for node_id, node in sorted(graph.items(), key=lambda item: int(item[0])):
        kind, inputs = node["class_type"], node["inputs"]
        if kind == "UNETLoader":
            graph[node_id] = {"class_type": "StepCacheTestTinyModel", "inputs": {"family": family, "seed": loaders}}
            loaders += 1
        elif kind == "CLIPTextEncode":
            graph[node_id] = {"class_type": "StepCacheTestConditioning",
                              "inputs": {"family": family, "seed": int(node_id), "batch": 1}}
        elif kind in LATENT_STRIDE:
            inputs["width"], inputs["height"] = width * LATENT_STRIDE[kind], height * LATENT_STRIDE[kind]
            if "length" in inputs:
                inputs["length"] = (frames - 1) * 4 + 1
        elif kind == "Flux2Scheduler":  # its shift follows the image size
            inputs["width"], inputs["height"] = width * 16, height * 16
        elif kind in TINY_WINDOWS:
            inputs["context_length"], inputs["context_overlap"] = TINY_WINDOWS[kind]
        elif kind in DECODERS:
            graph[node_id] = {"class_type": "StepCacheTestLatentSink", "inputs": {"samples": inputs["samples"]}}
        elif kind == "ControlNetLoader":
            (model_id, *_) = sorted((i for i, n in graph.items() if n["class_type"] in ("UNETLoader",
                                     "StepCacheTestTinyModel")), key=int)
            graph[node_id] = {"class_type": "StepCacheTestTinyControlNet",
                              "inputs": {"model": [model_id, 0], "seed": 0, "union_modes": 0}}
        elif kind == "LoadImage":
            graph[node_id] = {"class_type": "EmptyImage", "inputs": {"width": width * 8, "height": height * 8,
                                                                     "batch_size": 1, "color": 0x808080}}
        elif kind == "ControlNetApplyAdvanced":
            inputs.pop("vae", None)
    # Drop the file loaders and whatever consumed a decoded image (savers, video muxers).
    dropped = {node_id for node_id, node in graph.items() if node["class_type"] in FILE_LOADERS}
    while True:
        more = {node_id for node_id, node in graph.items() if node_id not in dropped and any(
            isinstance(v, list) and len(v) == 2 and v[0] in dropped for v in node["inputs"].values())}
        if not more:
            break
        dropped |= more
    return {node_id: node for node_id, node in graph.items() if node_id not in dropped}


def steps_of(graph: dict, node_id: str) -> int:
    """Steps of the sampling run that the cache node ``node_id`` feeds (its sampler's share)."""
    for node in graph.values():
        inputs = node["inputs"]
        model = inputs.get("model")
        if not (isinstance(model, list) and model[0] in (node_id, *follow(graph, node_id))):
            continue
        if node["class_type"] == "KSamplerAdvanced":
            return min(inputs["end_at_step"], inputs["steps"]) - inputs["start_at_step"]
        if node["class_type"] in ("KSampler", "MagCacheCalibrate"):
            return inputs["steps"]
        if node["class_type"] == "BasicGuider":
            (scheduler,) = [n for n in graph.values() if n["class_type"] == "Flux2Scheduler"]
            return scheduler["inputs"]["steps"]
    raise AssertionError(f"no sampler reads cache node {node_id}")


def follow(graph: dict, node_id: str) -> list[str]:
    """Model nodes fed, directly or not, by ``node_id`` (e.g. ModelSamplingSD3 after the cache)."""
    found = [other for other, node in graph.items()
             if node["class_type"].startswith("ModelSampling") and node["inputs"]["model"][0] == node_id]
    return found + [deeper for other in found for deeper in follow(graph, other)]


REAL_API_FILES = [p for p in API_FILES if not p.stem.startswith(DEMO_PREFIX)]


@pytest.mark.server
@pytest.mark.parametrize("path", REAL_API_FILES, ids=lambda p: p.stem)
def test_api_workflow_runs_on_the_server_with_tiny_models(path, server, host):
    family = TINY_FAMILY[path.stem]
    tiny = host.test_module("tiny_models")
    original = json.loads(path.read_text())
    graph = tiny_graph(original, family, tiny.FAMILIES[family].latent_spatial)
    assert not {node["class_type"] for node in graph.values()} & (FILE_LOADERS | DECODERS | {"CLIPTextEncode"})
    cache_ids = {node_id for node_id, node in graph.items() if node["class_type"] in CACHE_NODES}
    assert cache_ids == {i for i, n in original.items() if n["class_type"] in CACHE_NODES}, "the user's cache nodes"
    for node_id in cache_ids:
        if graph[node_id]["inputs"].get("variant") == "auto" and path.stem in REAL_VARIANT:
            graph[node_id]["inputs"]["variant"] = REAL_VARIANT[path.stem]

    prompt_id = server.queue(graph)
    entry = server.wait(prompt_id, timeout=120)
    assert entry["status"]["status_str"] == "success", entry["status"]
    sinks = [out for out in entry["outputs"].values() if "latent_shape" in out]
    assert sinks and all(out["finite"] == [True] for out in sinks)

    runs = server.get(f"/stepcache/stats?prompt_id={prompt_id}")
    cached = [run for run in runs if run["method"] != "calibration"]  # a calibration run never skips
    assert sorted(run["node"] for run in cached) == sorted(cache_ids), runs
    for run in cached:
        assert run["disabled_reason"] is None, run
        assert run["steps"] == steps_of(original, run["node"]), run
        assert run["calls_computed"] > 0
        if {node["class_type"] for node in graph.values()} & set(TINY_WINDOWS):
            assert all(branch["entries"] == 2 for branch in run["branches"]), run  # one per window
        cache = graph[run["node"]]
        level = cache["inputs"].get("quality", "custom")
        if level != "custom":
            # A level measures its own error; random weights jump from step to step, so it may
            # skip nothing here (tests/test_quality.py measures what levels do on a trained model).
            assert run["method"] == "measured error" and run["constants"].startswith(f"quality {level}:"), run
        elif cache["class_type"] == "ApplyMagCache" and "ratios" not in cache["inputs"]:
            # With published ratios MagCache wants skips by the table, whatever the weights; the
            # default hindsight check may refuse them, as random weights do not evolve smoothly.
            # (Ratios calibrated on a random tiny model may allow no skip at the workflow's threshold.)
            assert run["calls_skipped"] + run["refused"] > 0, run
            assert run["constants"].startswith("published ") and run["constants"].endswith(
                ", chosen with the variant input"), run
    if any(node["class_type"] == "MagCacheCalibrate" for node in graph.values()):
        assert [run["method"] for run in runs].count("calibration") == 1
