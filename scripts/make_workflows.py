"""Writes the example workflows, each described once here, in both of ComfyUI's formats.

    python scripts/make_workflows.py          # (re)write example_workflows/*.json and api/*.json
    python scripts/make_workflows.py --check  # exit 1 if a committed file differs from this output

* ``example_workflows/<name>.json``: the UI (LiteGraph, version 0.4) format that ComfyUI's
  template browser lists for a custom pack (it globs ``example_workflows/*.json``, not
  subfolders) and that *Open* / drag-and-drop load;
* ``example_workflows/api/<name>.json``: the API format (``POST /prompt``, ``scripts/demo.py``),
  the same nodes under the same ids, without the frontend-only note.

Both come from one description so they cannot drift; tests/test_example_workflows.py checks the
committed files equal this script's output, every node and widget against the real ComfyUI, and
runs every API graph on the server with tiny stand-in models. Every node gets a title of its own,
the same in both formats (clients address nodes by title), and the layout keeps free the room the
web extension's panels take after a run (tests/test_browser.py checks it in the frontend's node
renderings). Standard library only.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
UI_DIR = REPO_ROOT / "example_workflows"
API_DIR = UI_DIR / "api"

# A seed widget is followed in the UI by its "control after generate" value. "fixed" keeps the
# seed between runs, so bypassing the cache node (Ctrl+B) gives the uncached image to compare.
SEED_CONTROL = "fixed"


@dataclass(frozen=True)
class NodeSpec:
    """What the UI format needs of a node type: its sockets and its widgets, in ComfyUI's order.

    ``widgets`` are the inputs the frontend shows as widgets (INT, FLOAT, STRING, BOOLEAN, combos,
    optional ones included), in INPUT_TYPES order; ``seeded`` ones get a control value after them.
    ``title`` is the node's title in both formats unless a graph gives it one of its own. The test
    checks every spec against the node's real INPUT_TYPES / RETURN_TYPES on each ComfyUI version.
    Output nodes list no outputs: ComfyUI 0.30.0 gave some (SaveImage, PreviewAny, ...) an
    output that 0.3.75 has not, and a UI node without an "outputs" entry takes its node's own.
    """

    title: str
    inputs: tuple[tuple[str, str], ...] = ()
    widgets: tuple[str, ...] = ()
    outputs: tuple[tuple[str, str], ...] = ()
    seeded: tuple[str, ...] = ()
    width: int = 320
    # Height the pack's web extension adds below the widgets after a run (web/stepcache.js: the
    # stats panel of the Apply nodes, the ratio plot of the calibrate nodes), kept free in the layout.
    panel: int = 0


# The optional inputs both Apply nodes share (nodes/apply_nodes.py), and each node's defaults.
TEACACHE_SHARED_DEFAULTS = {"estimator": "reuse", "forecast_order": 1, "forecast_damping": 0.5,
                            "cfg_branches": "together", "check": "off", "check_tolerance": 0.06}
MAGCACHE_SHARED_DEFAULTS = {**TEACACHE_SHARED_DEFAULTS, "estimator": "damped_forecast", "check": "hindsight"}
ESTIMATOR_WIDGETS = tuple(TEACACHE_SHARED_DEFAULTS)

# Room for the web extension's panels (graph units, measured in both node renderings of
# tests/test_browser.py with two CFG branches, plus a margin).
STATS_PANEL = 120
PLOT_PANEL = 190

SPECS: dict[str, NodeSpec] = {
    # core loaders and encoders
    "UNETLoader": NodeSpec("Load Diffusion Model", widgets=("unet_name", "weight_dtype"),
                           outputs=(("MODEL", "MODEL"),)),
    "CLIPLoader": NodeSpec("Load Text Encoder", widgets=("clip_name", "type", "device"), outputs=(("CLIP", "CLIP"),)),
    "DualCLIPLoader": NodeSpec("Load Text Encoders", widgets=("clip_name1", "clip_name2", "type", "device"),
                               outputs=(("CLIP", "CLIP"),)),
    "VAELoader": NodeSpec("Load VAE", widgets=("vae_name",), outputs=(("VAE", "VAE"),)),
    "CLIPTextEncode": NodeSpec("Prompt", inputs=(("clip", "CLIP"),), widgets=("text",),
                               outputs=(("CONDITIONING", "CONDITIONING"),), width=420),
    "ConditioningZeroOut": NodeSpec("Conditioning Zero Out", inputs=(("conditioning", "CONDITIONING"),),
                                    outputs=(("CONDITIONING", "CONDITIONING"),)),
    "ControlNetLoader": NodeSpec("Load ControlNet Model", widgets=("control_net_name",),
                                 outputs=(("CONTROL_NET", "CONTROL_NET"),)),
    "SetUnionControlNetType": NodeSpec("ControlNet Union Type", inputs=(("control_net", "CONTROL_NET"),),
                                       widgets=("type",), outputs=(("CONTROL_NET", "CONTROL_NET"),)),
    "LoadImage": NodeSpec("Load Image", widgets=("image",), outputs=(("IMAGE", "IMAGE"), ("MASK", "MASK"))),
    "ControlNetApplyAdvanced": NodeSpec("Apply ControlNet",
        inputs=(("positive", "CONDITIONING"), ("negative", "CONDITIONING"), ("control_net", "CONTROL_NET"),
                ("image", "IMAGE"), ("vae", "VAE")),
        widgets=("strength", "start_percent", "end_percent"),
        outputs=(("positive", "CONDITIONING"), ("negative", "CONDITIONING"))),
    "FluxGuidance": NodeSpec("Flux Guidance", inputs=(("conditioning", "CONDITIONING"),), widgets=("guidance",),
                             outputs=(("CONDITIONING", "CONDITIONING"),)),
    # latents and model sampling
    "EmptySD3LatentImage": NodeSpec("Empty Latent Image", widgets=("width", "height", "batch_size"),
                                    outputs=(("LATENT", "LATENT"),)),
    "EmptyFlux2LatentImage": NodeSpec("Empty Flux 2 Latent", widgets=("width", "height", "batch_size"),
                                      outputs=(("LATENT", "LATENT"),)),
    "EmptyHunyuanLatentVideo": NodeSpec("Empty Latent Video", widgets=("width", "height", "length", "batch_size"),
                                        outputs=(("LATENT", "LATENT"),)),
    "ModelSamplingSD3": NodeSpec("Model Sampling (shift)", inputs=(("model", "MODEL"),), widgets=("shift",),
                                 outputs=(("MODEL", "MODEL"),)),
    "ModelSamplingAuraFlow": NodeSpec("Model Sampling (shift)", inputs=(("model", "MODEL"),), widgets=("shift",),
                                      outputs=(("MODEL", "MODEL"),)),
    # ComfyUI 0.30.0's widgets; 0.3.75 has the first six (its frontend and server skip the rest).
    "WanContextWindowsManual": NodeSpec("Wan Context Windows", inputs=(("model", "MODEL"),),
        widgets=("context_length", "context_overlap", "context_schedule", "context_stride", "closed_loop",
                 "fuse_method", "freenoise", "retain_first_frame", "split_conds_to_windows"),
        outputs=(("MODEL", "MODEL"),)),
    # samplers
    "KSampler": NodeSpec("KSampler",
        inputs=(("model", "MODEL"), ("positive", "CONDITIONING"), ("negative", "CONDITIONING"),
                ("latent_image", "LATENT")),
        widgets=("seed", "steps", "cfg", "sampler_name", "scheduler", "denoise"),
        outputs=(("LATENT", "LATENT"),), seeded=("seed",)),
    "KSamplerAdvanced": NodeSpec("KSampler (Advanced)",
        inputs=(("model", "MODEL"), ("positive", "CONDITIONING"), ("negative", "CONDITIONING"),
                ("latent_image", "LATENT")),
        widgets=("add_noise", "noise_seed", "steps", "cfg", "sampler_name", "scheduler", "start_at_step",
                 "end_at_step", "return_with_leftover_noise"),
        outputs=(("LATENT", "LATENT"),), seeded=("noise_seed",)),
    "RandomNoise": NodeSpec("Random Noise", widgets=("noise_seed",),
                            outputs=(("NOISE", "NOISE"),), seeded=("noise_seed",)),
    "KSamplerSelect": NodeSpec("Sampler", widgets=("sampler_name",), outputs=(("SAMPLER", "SAMPLER"),)),
    "Flux2Scheduler": NodeSpec("Flux 2 Scheduler", widgets=("steps", "width", "height"),
                               outputs=(("SIGMAS", "SIGMAS"),)),
    "BasicGuider": NodeSpec("Basic Guider", inputs=(("model", "MODEL"), ("conditioning", "CONDITIONING")),
                            outputs=(("GUIDER", "GUIDER"),)),
    "SamplerCustomAdvanced": NodeSpec("Sampler Custom (Advanced)",
        inputs=(("noise", "NOISE"), ("guider", "GUIDER"), ("sampler", "SAMPLER"), ("sigmas", "SIGMAS"),
                ("latent_image", "LATENT")),
        outputs=(("output", "LATENT"), ("denoised_output", "LATENT"))),
    # decode and save
    "VAEDecode": NodeSpec("VAE Decode", inputs=(("samples", "LATENT"), ("vae", "VAE")), outputs=(("IMAGE", "IMAGE"),)),
    "VAEDecodeTiled": NodeSpec("VAE Decode (Tiled)", inputs=(("samples", "LATENT"), ("vae", "VAE")),
                               widgets=("tile_size", "overlap", "temporal_size", "temporal_overlap"),
                               outputs=(("IMAGE", "IMAGE"),)),
    "SaveImage": NodeSpec("Save Image", inputs=(("images", "IMAGE"),), widgets=("filename_prefix",), width=400),
    "SaveAnimatedWEBP": NodeSpec("Save Animated WEBP", inputs=(("images", "IMAGE"),),
                                 widgets=("filename_prefix", "fps", "lossless", "quality", "method"), width=400),
    "PreviewAny": NodeSpec("Preview as Text", inputs=(("source", "*"),), width=400),
    # this pack
    "ApplyMagCache": NodeSpec("Apply MagCache",
        inputs=(("model", "MODEL"), ("ratios", "MAG_RATIOS")),
        widgets=("threshold", "max_consecutive_skips", "retention_ratio", "cache_device", "variant",
                 *ESTIMATOR_WIDGETS, "skip_rule", "quality"),
        outputs=(("MODEL", "MODEL"),), panel=STATS_PANEL),
    "ApplyTeaCache": NodeSpec("Apply TeaCache",
        inputs=(("model", "MODEL"), ("coefficients", "TEACACHE_COEFFICIENTS")),
        widgets=("threshold", "start_percent", "end_percent", "max_consecutive_skips", "cache_device", "variant",
                 *ESTIMATOR_WIDGETS, "quality"),
        outputs=(("MODEL", "MODEL"),), panel=STATS_PANEL),
    "MagCacheCalibrate": NodeSpec("MagCache Calibrate",
        inputs=(("model", "MODEL"), ("positive", "CONDITIONING"), ("negative", "CONDITIONING"),
                ("latent_image", "LATENT")),
        widgets=("seed", "steps", "cfg", "sampler_name", "scheduler", "denoise", "save_calibration"),
        outputs=(("LATENT", "LATENT"), ("MAG_RATIOS", "MAG_RATIOS"), ("STRING", "STRING")), seeded=("seed",),
        panel=PLOT_PANEL),
    "StepCacheDemoModel": NodeSpec("StepCache Demo Model", widgets=("kind",), outputs=(("MODEL", "MODEL"),)),
    "StepCacheDemoPrompt": NodeSpec("StepCache Demo Prompt", widgets=("kind", "subject", "batch_size"),
                                    outputs=(("CONDITIONING", "CONDITIONING"),)),
    "StepCacheDemoLatent": NodeSpec("StepCache Demo Empty Latent", widgets=("kind", "batch_size", "frames"),
                                    outputs=(("LATENT", "LATENT"),)),
    "StepCacheDemoDecode": NodeSpec("StepCache Demo Decode", inputs=(("samples", "LATENT"),),
                                    outputs=(("IMAGE", "IMAGE"),)),
    # frontend-only: never in the API format
    "MarkdownNote": NodeSpec("Note", widgets=("text",), width=440),
}

# Nodes the frontend draws but never sends to the server.
FRONTEND_ONLY = frozenset({"MarkdownNote", "Note"})

COLUMN_WIDTH = 500
NODE_TITLE_HEIGHT = 30  # drawn above a node's pos
# Between a node (and its panel) and the next node's title: also room for the rows of the Nodes 2.0
# rendering, which makes some nodes about 20 units taller than the size stored here.
NODE_GAP = 50
GROUP_PADDING = 12
GROUP_TITLE_HEIGHT = 34
TOP = 100


@dataclass(frozen=True)
class Out:
    """Output ``slot`` of ``node``: passed as an input value it becomes a link."""

    node: Node
    slot: int = 0


@dataclass
class Node:
    id: int
    type: str
    values: dict[str, Any]
    title: str
    column: int
    pos: tuple[int, int] = (0, 0)
    size: tuple[int, int] = (0, 0)
    extra: dict[str, Any] = field(default_factory=dict)

    def out(self, slot: int = 0) -> Out:
        return Out(self, slot)

    @property
    def spec(self) -> NodeSpec:
        return SPECS[self.type]


@dataclass
class Workflow:
    name: str
    nodes: list[Node] = field(default_factory=list)
    groups: dict[int, str] = field(default_factory=dict)  # column -> group title

    def add(self, type_: str, column: int, title: str | None = None, **values: Any) -> Node:
        spec = SPECS[type_]
        known = {name for name, _ in spec.inputs} | set(spec.widgets)
        unknown = set(values) - known
        missing = set(spec.widgets) - set(values)
        if unknown or missing:
            raise ValueError(f"{self.name}: {type_}: unknown inputs {sorted(unknown)}, missing {sorted(missing)}")
        title = title or spec.title
        if any(other.title == title for other in self.nodes):
            # Clients address nodes by title (and users read them): give the second one its own.
            raise ValueError(f"{self.name}: two nodes titled {title!r}")
        node = Node(id=len(self.nodes) + 1, type=type_, values=values, title=title, column=column)
        self.nodes.append(node)
        return node

    def note(self, text: str) -> Node:
        # A column of its own left of the graph: what users read first, outside the groups.
        node = self.add("MarkdownNote", -1, title="About this workflow", text=text.strip() + "\n")
        node.extra = {"color": "#432", "bgcolor": "#653"}
        return node

    # layout ------------------------------------------------------------------------------

    def layout(self) -> None:
        """Columns left to right in data-flow order (the note first), nodes stacked in each, with
        room below a node for the panel the web extension gives it after a run."""
        tops: dict[int, int] = {}
        for node in self.nodes:
            spec = node.spec
            sockets = max(len(spec.inputs), len(spec.outputs))
            rows = sockets + len(spec.widgets) + len(spec.seeded)
            height = 30 + 24 * rows
            if node.type == "CLIPTextEncode":
                height = max(height, 200)
            if node.type in FRONTEND_ONLY:
                # Tall enough for the rendered text (about 60 characters a line at this width).
                text = node.values["text"]
                height = 40 + 20 * sum(1 + len(line) // 60 for line in text.splitlines())
            if node.type in ("SaveImage", "SaveAnimatedWEBP", "PreviewAny", "LoadImage"):
                height = max(height, 300)  # an image preview (Load Image: and its upload button)
            x = 40 + (node.column + 1) * COLUMN_WIDTH
            y = tops.get(node.column, TOP)
            node.pos, node.size = (x, y), (spec.width, height)
            tops[node.column] = y + height + spec.panel + NODE_GAP + NODE_TITLE_HEIGHT

    def group_list(self) -> list[dict]:
        groups = []
        for column, title in sorted(self.groups.items()):
            members = [n for n in self.nodes if n.column == column and n.type not in FRONTEND_ONLY]
            left = min(n.pos[0] for n in members) - GROUP_PADDING
            top = min(n.pos[1] for n in members) - NODE_TITLE_HEIGHT - GROUP_PADDING - GROUP_TITLE_HEIGHT
            right = max(n.pos[0] + n.size[0] for n in members) + GROUP_PADDING
            bottom = max(n.pos[1] + n.size[1] + n.spec.panel for n in members) + GROUP_PADDING
            groups.append({"id": len(groups) + 1, "title": title, "bounding": [left, top, right - left, bottom - top],
                           "color": "#3f789e", "font_size": 24, "flags": {}})
        return groups

    # the two formats ---------------------------------------------------------------------

    def ui(self) -> dict:
        self.layout()
        links: list[list] = []
        incoming: dict[tuple[int, str], int] = {}
        outgoing: dict[tuple[int, int], list[int]] = {}
        for node in self.nodes:
            names = [name for name, _ in node.spec.inputs]
            for name, value in node.values.items():
                if isinstance(value, Out):
                    link_id = len(links) + 1
                    source_type = value.node.spec.outputs[value.slot][1]
                    links.append([link_id, value.node.id, value.slot, node.id, names.index(name), source_type])
                    incoming[(node.id, name)] = link_id
                    outgoing.setdefault((value.node.id, value.slot), []).append(link_id)
        ui_nodes = []
        # Execution order as the frontend stores it: a node after everything it reads from.
        order = {node.id: i for i, node in enumerate(self.topological())}
        for node in self.nodes:
            spec = node.spec
            entry: dict[str, Any] = {
                "id": node.id, "type": node.type, "pos": list(node.pos), "size": list(node.size), "flags": {},
                "order": order[node.id], "mode": 0,
            }
            entry["title"] = node.title
            if spec.inputs:
                entry["inputs"] = [{"name": name, "type": type_, "link": incoming.get((node.id, name))}
                                   for name, type_ in spec.inputs]
            if spec.outputs:
                entry["outputs"] = []
                for slot, (name, type_) in enumerate(spec.outputs):
                    targets = outgoing.get((node.id, slot), [])
                    entry["outputs"].append({"name": name, "type": type_, "links": targets,
                                             **({"slot_index": slot} if targets else {})})
            entry["properties"] = {} if node.type in FRONTEND_ONLY else {"Node name for S&R": node.type}
            widgets: list[Any] = []
            for name in spec.widgets:
                widgets.append(node.values[name])
                if name in spec.seeded:
                    widgets.append(SEED_CONTROL)
            if widgets:
                entry["widgets_values"] = widgets
            entry.update(node.extra)
            ui_nodes.append(entry)
        return {
            # A stable id per workflow name, so regenerating changes nothing.
            "id": str(uuid.uuid5(uuid.NAMESPACE_URL, f"comfyui-stepcache/example_workflows/{self.name}")),
            "revision": 0,
            "last_node_id": len(self.nodes),
            "last_link_id": len(links),
            "nodes": ui_nodes,
            "links": links,
            "groups": self.group_list(),
            "config": {},
            "extra": {"ds": {"scale": 0.75, "offset": [0, 0]}},
            "version": 0.4,
        }

    def api(self) -> dict:
        graph = {}
        for node in self.nodes:
            if node.type in FRONTEND_ONLY:
                continue
            inputs = {name: [str(value.node.id), value.slot] if isinstance(value, Out) else value
                      for name, value in node.values.items()}
            graph[str(node.id)] = {"class_type": node.type, "inputs": inputs,
                                   "_meta": {"title": node.title}}
        return graph

    def topological(self) -> list[Node]:
        done: list[Node] = []
        seen: set[int] = set()

        def visit(node: Node) -> None:
            if node.id in seen:
                return
            seen.add(node.id)
            for value in node.values.values():
                if isinstance(value, Out):
                    visit(value.node)
            done.append(node)

        for node in self.nodes:
            visit(node)
        return done


# The graphs ------------------------------------------------------------------------------

MAGCACHE_DEFAULTS = {"threshold": 0.06, "max_consecutive_skips": 2, "retention_ratio": 0.2,
                     "cache_device": "main_device", "variant": "auto", **MAGCACHE_SHARED_DEFAULTS,
                     "skip_rule": "magnitude", "quality": "balanced"}

TUNING_MAGCACHE = """
**Tuning**: set `quality` on Apply MagCache: `lossless`, `high`, `balanced` (the default) or
`fast`. The cache measures its own error as it runs and skips as many steps as the level allows;
no table or calibration is needed. Keep the seed fixed and bypass the cache node (Ctrl+B) to
compare with the uncached result. The console line `[StepCache] ...: skipped N/M steps ... (x.xx x)`
says what each run skipped. `quality: custom` runs the published MagCache rule with the node's
expert inputs (threshold, K, retention, estimator, check) exactly as set.
"""

TUNING_TEACACHE = """
**Tuning** (Apply TeaCache, at `quality: custom`, which runs TeaCache itself): raise `threshold`
for more speed, lower it for fidelity; 0 never skips. A quality level (`lossless` to `fast`)
instead runs the same measured-error rule as Apply MagCache. `start_percent` / `end_percent` limit
skipping to part of the denoising, `max_consecutive_skips` caps skips in a row. Keep the seed fixed
and bypass the cache node (Ctrl+B) to compare with the uncached result; the console line
`[StepCache] ...` says what each run skipped.
"""

SPEEDUP_SOURCE = ("MagCache paper (Zehong-Ma/MagCache), quality/speed tables, same GPU per row; "
                  "see also docs/benchmark.md")


def flux1_models_and_prompt(w: Workflow) -> tuple:
    """FLUX.1 [dev]'s loaders (group 0) and a guided prompt with its zeroed negative (group 1):
    model, VAE, guided, negative."""
    unet = w.add("UNETLoader", 0, unet_name="flux1-dev.safetensors", weight_dtype="default")
    clip = w.add("DualCLIPLoader", 0, clip_name1="clip_l.safetensors", clip_name2="t5xxl_fp16.safetensors",
                 type="flux", device="default")
    vae = w.add("VAELoader", 0, vae_name="ae.safetensors")
    text = w.add("CLIPTextEncode", 1, title="Prompt", clip=clip.out(),
                 text="a red fox reading a newspaper in a sunlit cafe, film photograph")
    guided = w.add("FluxGuidance", 1, conditioning=text.out(), guidance=3.5)
    negative = w.add("ConditioningZeroOut", 1, title="Negative (unused at cfg 1)", conditioning=text.out())
    return unet, vae, guided, negative


def flux1_dev_magcache() -> Workflow:
    w = Workflow("flux1_dev_magcache")
    w.groups = {0: "Load models", 1: "Prompt and latent", 2: "Step cache", 3: "Sample and save"}
    unet, vae, guided, negative = flux1_models_and_prompt(w)
    latent = w.add("EmptySD3LatentImage", 1, width=1024, height=1024, batch_size=1)
    cache = w.add("ApplyMagCache", 2, model=unet.out(), **MAGCACHE_DEFAULTS)
    sampler = w.add("KSampler", 3, model=cache.out(), positive=guided.out(), negative=negative.out(),
                    latent_image=latent.out(), seed=42, steps=28, cfg=1.0, sampler_name="euler",
                    scheduler="simple", denoise=1.0)
    decode = w.add("VAEDecode", 3, samples=sampler.out(), vae=vae.out())
    w.add("SaveImage", 3, images=decode.out(), filename_prefix="stepcache/flux1_dev")
    w.note(f"""
## FLUX.1 [dev] with MagCache

Text to image with **Apply MagCache** between the model loader and the KSampler. It runs at
`quality: balanced`, which needs no table; at `quality: custom` the published FLUX.1-dev ratios are
picked from the loaded model (`variant: auto`).

**Files** (ComfyUI/models/...):
- `diffusion_models/flux1-dev.safetensors` (black-forest-labs/FLUX.1-dev)
- `text_encoders/clip_l.safetensors`, `text_encoders/t5xxl_fp16.safetensors`
  (comfyanonymous/flux_text_encoders; t5xxl_fp8_e4m3fn.safetensors also works)
- `vae/ae.safetensors`

**Expected speedup**: published MagCache on FLUX.1-dev at 1024x1024: 2.57x (slow) to 2.82x
(fast) [{SPEEDUP_SOURCE}]. Those figures are for the published rule at its fast settings
(`quality: custom`, threshold 0.24, K 5, retention 0.1, as in the official MagCache4FLUX script);
the quality levels' figures on the reference models are in docs/benchmark.md.
{TUNING_MAGCACHE}""")
    return w


def flux1_dev_controlnet_magcache() -> Workflow:
    w = Workflow("flux1_dev_controlnet_magcache")
    w.groups = {0: "Load models", 1: "Prompt, control and latent", 2: "Step cache", 3: "Sample and save"}
    unet, vae, guided, negative = flux1_models_and_prompt(w)
    controlnet = w.add("ControlNetLoader", 0, control_net_name="FLUX.1-dev-ControlNet-Union-Pro-2.0.safetensors")
    union = w.add("SetUnionControlNetType", 1, control_net=controlnet.out(), type="depth")
    control_image = w.add("LoadImage", 1, title="Control image (a depth map)", image="depth.png")
    controlled = w.add("ControlNetApplyAdvanced", 1, positive=guided.out(), negative=negative.out(),
                       control_net=union.out(), image=control_image.out(), vae=vae.out(), strength=0.7,
                       start_percent=0.0, end_percent=0.8)
    latent = w.add("EmptySD3LatentImage", 1, width=1024, height=1024, batch_size=1)
    cache = w.add("ApplyMagCache", 2, model=unet.out(), **MAGCACHE_DEFAULTS)
    sampler = w.add("KSampler", 3, model=cache.out(), positive=controlled.out(0), negative=controlled.out(1),
                    latent_image=latent.out(), seed=42, steps=28, cfg=1.0, sampler_name="euler",
                    scheduler="simple", denoise=1.0)
    decode = w.add("VAEDecode", 3, samples=sampler.out(), vae=vae.out())
    w.add("SaveImage", 3, images=decode.out(), filename_prefix="stepcache/flux1_dev_controlnet")
    w.note(f"""
## FLUX.1 [dev] with a ControlNet and MagCache

A depth ControlNet (a Union ControlNet set to `depth`) guides the image; **Apply MagCache** sits
between the model loader and the KSampler as usual. On a skipped step the transformer blocks do not
run and that step's ControlNet output is added as ComfyUI adds it; the ControlNet itself runs every
step. It stops at 80% of the run (`end_percent`): that step computes, and the cache goes on after.

**Files** (ComfyUI/models/...):
- `diffusion_models/flux1-dev.safetensors` (black-forest-labs/FLUX.1-dev)
- `text_encoders/clip_l.safetensors`, `text_encoders/t5xxl_fp16.safetensors`
- `vae/ae.safetensors`
- `controlnet/FLUX.1-dev-ControlNet-Union-Pro-2.0.safetensors`
  (Shakker-Labs/FLUX.1-dev-ControlNet-Union-Pro-2.0; any FLUX ControlNet works)
- a depth map as `depth.png` in ComfyUI/input (or any control image its type expects)
{TUNING_MAGCACHE}""")
    return w


def flux2_models_and_prompt(w: Workflow) -> tuple:
    """FLUX.2 [dev]'s loaders (group 0) and a guided prompt (group 1): model, VAE, text, guided."""
    unet = w.add("UNETLoader", 0, unet_name="flux2_dev_fp8mixed.safetensors", weight_dtype="default")
    clip = w.add("CLIPLoader", 0, clip_name="mistral_3_small_flux2_fp8.safetensors", type="flux2",
                 device="default")
    vae = w.add("VAELoader", 0, vae_name="flux2-vae.safetensors")
    text = w.add("CLIPTextEncode", 1, title="Prompt", clip=clip.out(),
                 text="a lighthouse on a basalt cliff at dusk, waves, long exposure photograph")
    guided = w.add("FluxGuidance", 1, conditioning=text.out(), guidance=4.0)
    return unet, vae, text, guided


def flux2_dev_teacache() -> Workflow:
    w = Workflow("flux2_dev_teacache")
    w.groups = {0: "Load models", 1: "Prompt and latent", 2: "Step cache", 3: "Sample and save"}
    unet, vae, _text, guided = flux2_models_and_prompt(w)
    latent = w.add("EmptyFlux2LatentImage", 1, width=1024, height=1024, batch_size=1)
    cache = w.add("ApplyTeaCache", 2, model=unet.out(), threshold=0.1, start_percent=0.0, end_percent=1.0,
                  max_consecutive_skips=3, cache_device="main_device", variant="auto",
                  **TEACACHE_SHARED_DEFAULTS, quality="custom")
    noise = w.add("RandomNoise", 3, noise_seed=42)
    guider = w.add("BasicGuider", 3, model=cache.out(), conditioning=guided.out())
    sampler_select = w.add("KSamplerSelect", 3, sampler_name="euler")
    sigmas = w.add("Flux2Scheduler", 3, steps=28, width=1024, height=1024)
    sampler = w.add("SamplerCustomAdvanced", 4, noise=noise.out(), guider=guider.out(),
                    sampler=sampler_select.out(), sigmas=sigmas.out(), latent_image=latent.out())
    decode = w.add("VAEDecode", 4, samples=sampler.out(0), vae=vae.out())
    w.add("SaveImage", 4, images=decode.out(), filename_prefix="stepcache/flux2_dev")
    w.groups[4] = "Decode and save"
    w.note(f"""
## FLUX.2 [dev] with TeaCache

Text to image with the custom-sampler chain (BasicGuider, Flux2Scheduler, SamplerCustomAdvanced)
and **Apply TeaCache** on the model the guider samples.

**Files** (ComfyUI/models/...):
- `diffusion_models/flux2_dev_fp8mixed.safetensors`
- `text_encoders/mistral_3_small_flux2_fp8.safetensors` (or the bf16 file)
- `vae/flux2-vae.safetensors`

(all in Comfy-Org/flux2-dev on Hugging Face)

**Expected speedup**: FLUX.2 has no published TeaCache coefficients, so the cache runs on the
unscaled change of the first block's input (one warning per run says so) and needs a smaller
threshold than FLUX.1's 0.4; no published figure, see docs/benchmark.md for how speed follows
skipped steps. For calibrated constants use **flux2_dev_calibrate_magcache**.
{TUNING_TEACACHE}""")
    return w


def flux2_dev_calibrate_magcache() -> Workflow:
    w = Workflow("flux2_dev_calibrate_magcache")
    w.groups = {0: "Load models", 1: "Prompt and latent", 2: "Calibrate (first run)", 3: "Sample with the cache"}
    unet, vae, text, guided = flux2_models_and_prompt(w)
    negative = w.add("ConditioningZeroOut", 1, title="Negative (unused at cfg 1)", conditioning=text.out())
    latent = w.add("EmptyFlux2LatentImage", 1, width=1024, height=1024, batch_size=1)
    calibrate = w.add("MagCacheCalibrate", 2, model=unet.out(), positive=guided.out(), negative=negative.out(),
                      latent_image=latent.out(), seed=7, steps=28, cfg=1.0, sampler_name="euler",
                      scheduler="simple", denoise=1.0, save_calibration=True)
    w.add("PreviewAny", 2, title="Calibration report", source=calibrate.out(2))
    cache = w.add("ApplyMagCache", 3, model=unet.out(), ratios=calibrate.out(1), **MAGCACHE_DEFAULTS)
    sampler = w.add("KSampler", 3, model=cache.out(), positive=guided.out(), negative=negative.out(),
                    latent_image=latent.out(), seed=42, steps=28, cfg=1.0, sampler_name="euler",
                    scheduler="simple", denoise=1.0)
    decode = w.add("VAEDecode", 4, samples=sampler.out(), vae=vae.out())
    w.add("SaveImage", 4, images=decode.out(), filename_prefix="stepcache/flux2_dev_calibrated")
    w.groups[4] = "Decode and save"
    w.note("""
## Calibrate MagCache for a model (FLUX.2 [dev] here)

FLUX.2 has no published MagCache ratios, so **MagCache Calibrate** measures them: it samples like
a KSampler (its LATENT is the uncached image) and records, per step, how the block stack's
residual magnitude changes. Its `ratios` output feeds **Apply MagCache**, which the KSampler then
samples with. The same graph works for any supported model (swap the loaders), e.g. a fine-tune.

`save_calibration` keeps the ratios in `ComfyUI/user/stepcache/calibrations/`, tied to this
model's weights: after the first run you can delete the calibrate nodes and Apply MagCache finds
the saved calibration by itself, also after a restart. Ratios are resampled to any step count.
Calibrating costs one extra uncached sampling run, once per model.

**Files**: as flux2_dev_teacache (Comfy-Org/flux2-dev): `diffusion_models/flux2_dev_fp8mixed.safetensors`,
`text_encoders/mistral_3_small_flux2_fp8.safetensors`, `vae/flux2-vae.safetensors`.

**Expected speedup**: with a calibration the decisions are those of the published method; see
docs/benchmark.md (calibrated vs published constants on the built-in model).
""" + TUNING_MAGCACHE)
    return w


def _wan_loaders(w: Workflow, unet_names: list[str], unet_titles: tuple[str | None, ...] = (None,)
                 ) -> tuple[list[Node], Node, Node]:
    unets = [w.add("UNETLoader", 0, title=title, unet_name=name, weight_dtype="default")
             for name, title in zip(unet_names, unet_titles, strict=True)]
    clip = w.add("CLIPLoader", 0, clip_name="umt5_xxl_fp8_e4m3fn_scaled.safetensors", type="wan",
                 device="default")
    vae = w.add("VAELoader", 0, vae_name="wan_2.1_vae.safetensors")
    return unets, clip, vae


WAN_NEGATIVE = ("blurry, low quality, static, overexposed, jpeg artifacts, deformed, extra fingers, "
                "watermark, subtitles, still picture, messy background")


def _wan21_sample_and_save(w: Workflow, model: Node, positive: Node, negative: Node, latent: Node, vae: Node,
                           prefix: str) -> None:
    """Wan 2.1's sampling (uni_pc, 30 steps, cfg 6) and an animated WEBP (group 3)."""
    sampler = w.add("KSampler", 3, model=model.out(), positive=positive.out(), negative=negative.out(),
                    latent_image=latent.out(), seed=42, steps=30, cfg=6.0, sampler_name="uni_pc",
                    scheduler="simple", denoise=1.0)
    decode = w.add("VAEDecode", 3, samples=sampler.out(), vae=vae.out())
    w.add("SaveAnimatedWEBP", 3, images=decode.out(), filename_prefix=prefix, fps=16.0, lossless=False, quality=90,
          method="default")


def wan21_t2v_magcache() -> Workflow:
    w = Workflow("wan21_t2v_magcache")
    w.groups = {0: "Load models", 1: "Prompt and latent", 2: "Step cache", 3: "Sample and save"}
    (unet,), clip, vae = _wan_loaders(w, ["wan2.1_t2v_1.3B_fp16.safetensors"])
    positive = w.add("CLIPTextEncode", 1, title="Prompt", clip=clip.out(),
                     text="a corgi running along a beach at sunset, waves splashing, tracking shot")
    negative = w.add("CLIPTextEncode", 1, title="Negative prompt", clip=clip.out(), text=WAN_NEGATIVE)
    latent = w.add("EmptyHunyuanLatentVideo", 1, width=832, height=480, length=33, batch_size=1)
    cache = w.add("ApplyMagCache", 2, model=unet.out(), **MAGCACHE_DEFAULTS)
    shifted = w.add("ModelSamplingSD3", 2, model=cache.out(), shift=8.0)
    _wan21_sample_and_save(w, shifted, positive, negative, latent, vae, "stepcache/wan21_t2v")
    w.note(f"""
## Wan 2.1 text to video (1.3B) with MagCache

**Apply MagCache** between the loader and the model-sampling shift; the variant
(`wan2.1-t2v-1.3b`, or `-14b` for the 14B file) is detected from the model. Cond and uncond
(cfg 6) are cached per branch and decide together.

**Files** (Comfy-Org/Wan_2.1_ComfyUI_repackaged):
- `diffusion_models/wan2.1_t2v_1.3B_fp16.safetensors` (or `wan2.1_t2v_14B_fp16.safetensors`)
- `text_encoders/umt5_xxl_fp8_e4m3fn_scaled.safetensors`
- `vae/wan_2.1_vae.safetensors`

**Expected speedup**: published MagCache on Wan 2.1 1.3B: 2.14x (slow) to 2.68x (fast); TeaCache
1.59x to 2.14x [{SPEEDUP_SOURCE}].
{TUNING_MAGCACHE}""")
    return w


def wan21_t2v_context_windows_magcache() -> Workflow:
    w = Workflow("wan21_t2v_context_windows_magcache")
    w.groups = {0: "Load models", 1: "Prompt and latent", 2: "Context windows and step cache", 3: "Sample and save"}
    (unet,), clip, vae = _wan_loaders(w, ["wan2.1_t2v_1.3B_fp16.safetensors"])
    positive = w.add("CLIPTextEncode", 1, title="Prompt", clip=clip.out(),
                     text="a sailboat crossing a wide bay from dawn to midday, slow aerial tracking shot")
    negative = w.add("CLIPTextEncode", 1, title="Negative prompt", clip=clip.out(), text=WAN_NEGATIVE)
    latent = w.add("EmptyHunyuanLatentVideo", 1, width=832, height=480, length=161, batch_size=1)
    windows = w.add("WanContextWindowsManual", 2, model=unet.out(), context_length=81, context_overlap=30,
                    context_schedule="standard_static", context_stride=1, closed_loop=False, fuse_method="pyramid",
                    freenoise=True, retain_first_frame=False, split_conds_to_windows=False)
    cache = w.add("ApplyMagCache", 2, model=windows.out(), **MAGCACHE_DEFAULTS)
    shifted = w.add("ModelSamplingSD3", 2, model=cache.out(), shift=8.0)
    _wan21_sample_and_save(w, shifted, positive, negative, latent, vae, "stepcache/wan21_t2v_long")
    w.note(f"""
## A long Wan 2.1 video (161 frames) in context windows, with MagCache

**Wan Context Windows** (ComfyUI's node) samples the 161 frames in windows of 81 frames that
overlap by 30: the model runs once per window and step, and the windows' outputs are blended.
**Apply MagCache** caches each window on its own (its own residuals and skip decisions), so every
window skips; the order of the two nodes does not matter. `standard_static` and `batched` keep
their windows for the whole run; `standard_uniform` moves some windows from step to step (a
moved window computes once, then caches again); `looped_uniform` moves them all at every step, so
the cache leaves such runs uncached and says why.

**Memory**: per window and CFG branch the cache keeps the residuals its estimator uses (2 for the
default damped forecast, 1 for reuse), each the size of that window's hidden states; see the README.

**Files** (Comfy-Org/Wan_2.1_ComfyUI_repackaged):
- `diffusion_models/wan2.1_t2v_1.3B_fp16.safetensors`
- `text_encoders/umt5_xxl_fp8_e4m3fn_scaled.safetensors`
- `vae/wan_2.1_vae.safetensors`

**Expected speedup**: not measured with context windows yet. Without them, published MagCache
on Wan 2.1 1.3B gives 2.14x (slow) to 2.68x (fast) [{SPEEDUP_SOURCE}].
{TUNING_MAGCACHE}""")
    return w


def wan22_t2v_two_stage_magcache() -> Workflow:
    w = Workflow("wan22_t2v_two_stage_magcache")
    w.groups = {0: "Load models (two experts)", 1: "Prompt and latent", 2: "Step cache per expert",
                3: "High noise, then low noise", 4: "Decode and save"}
    (high, low), clip, vae = _wan_loaders(w, ["wan2.2_t2v_high_noise_14B_fp8_scaled.safetensors",
                                              "wan2.2_t2v_low_noise_14B_fp8_scaled.safetensors"],
                                          ("Load Diffusion Model (high noise)", "Load Diffusion Model (low noise)"))
    positive = w.add("CLIPTextEncode", 1, title="Prompt", clip=clip.out(),
                     text="a paper boat drifting down a rain-soaked street, reflections, slow dolly shot")
    negative = w.add("CLIPTextEncode", 1, title="Negative prompt", clip=clip.out(), text=WAN_NEGATIVE)
    latent = w.add("EmptyHunyuanLatentVideo", 1, width=640, height=640, length=81, batch_size=1)
    stage_cache = {**MAGCACHE_DEFAULTS, "variant": "wan2.2-t2v-a14b"}
    high_cache = w.add("ApplyMagCache", 2, title="Apply MagCache (high noise)", model=high.out(), **stage_cache)
    high_shift = w.add("ModelSamplingSD3", 2, title="Model Sampling (high noise)", model=high_cache.out(), shift=8.0)
    low_cache = w.add("ApplyMagCache", 2, title="Apply MagCache (low noise)", model=low.out(), **stage_cache)
    low_shift = w.add("ModelSamplingSD3", 2, title="Model Sampling (low noise)", model=low_cache.out(), shift=8.0)
    first = w.add("KSamplerAdvanced", 3, title="KSampler (high noise, steps 0-10)", model=high_shift.out(),
                  positive=positive.out(), negative=negative.out(), latent_image=latent.out(),
                  add_noise="enable", noise_seed=42, steps=20, cfg=3.5, sampler_name="euler",
                  scheduler="simple", start_at_step=0, end_at_step=10, return_with_leftover_noise="enable")
    second = w.add("KSamplerAdvanced", 3, title="KSampler (low noise, steps 10-20)", model=low_shift.out(),
                   positive=positive.out(), negative=negative.out(), latent_image=first.out(),
                   add_noise="disable", noise_seed=0, steps=20, cfg=3.5, sampler_name="euler",
                   scheduler="simple", start_at_step=10, end_at_step=10000, return_with_leftover_noise="disable")
    decode = w.add("VAEDecode", 4, samples=second.out(), vae=vae.out())
    w.add("SaveAnimatedWEBP", 4, images=decode.out(), filename_prefix="stepcache/wan22_t2v", fps=16.0,
          lossless=False, quality=90, method="default")
    w.note("""
## Wan 2.2 A14B text to video, two experts, each with its own cache

The high-noise expert samples steps 0-10 of a 20-step schedule, the low-noise expert steps 10-20
(KSamplerAdvanced). Each expert gets its **own Apply MagCache**: every sampling run builds its
cache from its own part of the schedule, and the `wan2.2-t2v-a14b` ratios span the whole
denoising, so each stage reads the part that matches its noise levels. Set `variant` by hand:
A14B has the Wan 2.1 14B architecture and cannot be told apart from it.

**Files** (Comfy-Org/Wan_2.2_ComfyUI_Repackaged):
- `diffusion_models/wan2.2_t2v_high_noise_14B_fp8_scaled.safetensors`
- `diffusion_models/wan2.2_t2v_low_noise_14B_fp8_scaled.safetensors`
- `text_encoders/umt5_xxl_fp8_e4m3fn_scaled.safetensors`
- `vae/wan_2.1_vae.safetensors`

**Expected speedup**: no published figure for the two-stage graph; see docs/benchmark.md. Each
stage is a separate run of 10 steps (runs under 10 steps sample uncached), so keep 20+ steps.
""" + TUNING_MAGCACHE)
    return w


def hunyuan_video_magcache() -> Workflow:
    w = Workflow("hunyuan_video_magcache")
    w.groups = {0: "Load models", 1: "Prompt and latent", 2: "Step cache", 3: "Sample and save"}
    unet = w.add("UNETLoader", 0, unet_name="hunyuan_video_t2v_720p_bf16.safetensors", weight_dtype="default")
    clip = w.add("DualCLIPLoader", 0, clip_name1="clip_l.safetensors",
                 clip_name2="llava_llama3_fp8_scaled.safetensors", type="hunyuan_video", device="default")
    vae = w.add("VAELoader", 0, vae_name="hunyuan_video_vae_bf16.safetensors")
    text = w.add("CLIPTextEncode", 1, title="Prompt", clip=clip.out(),
                 text="a hot air balloon rising over snowy mountains at sunrise, cinematic aerial shot")
    guided = w.add("FluxGuidance", 1, conditioning=text.out(), guidance=6.0)
    negative = w.add("ConditioningZeroOut", 1, title="Negative (unused at cfg 1)", conditioning=text.out())
    latent = w.add("EmptyHunyuanLatentVideo", 1, width=848, height=480, length=73, batch_size=1)
    cache = w.add("ApplyMagCache", 2, model=unet.out(), **MAGCACHE_DEFAULTS)
    shifted = w.add("ModelSamplingSD3", 2, model=cache.out(), shift=7.0)
    sampler = w.add("KSampler", 3, model=shifted.out(), positive=guided.out(), negative=negative.out(),
                    latent_image=latent.out(), seed=42, steps=30, cfg=1.0, sampler_name="euler",
                    scheduler="simple", denoise=1.0)
    decode = w.add("VAEDecodeTiled", 3, samples=sampler.out(), vae=vae.out(), tile_size=256, overlap=64,
                   temporal_size=64, temporal_overlap=8)
    w.add("SaveAnimatedWEBP", 3, images=decode.out(), filename_prefix="stepcache/hunyuan_video", fps=24.0,
          lossless=False, quality=90, method="default")
    w.note(f"""
## HunyuanVideo (T2V 720p checkpoint) with MagCache

Guidance-distilled (FluxGuidance 6, cfg 1): one model call per step. The published 720p or 544p
ratios are chosen from the latent height (`variant: auto`).

**Files** (Comfy-Org/HunyuanVideo_repackaged):
- `diffusion_models/hunyuan_video_t2v_720p_bf16.safetensors`
- `text_encoders/clip_l.safetensors`, `text_encoders/llava_llama3_fp8_scaled.safetensors`
- `vae/hunyuan_video_vae_bf16.safetensors`

**Expected speedup**: published MagCache on HunyuanVideo 540p: 2.25x (slow) to 2.63x (fast);
TeaCache 1.63x to 2.26x [{SPEEDUP_SOURCE}].
{TUNING_MAGCACHE}""")
    return w


def qwen_image_magcache() -> Workflow:
    w = Workflow("qwen_image_magcache")
    w.groups = {0: "Load models", 1: "Prompt and latent", 2: "Step cache", 3: "Sample and save"}
    unet = w.add("UNETLoader", 0, unet_name="qwen_image_fp8_e4m3fn.safetensors", weight_dtype="default")
    clip = w.add("CLIPLoader", 0, clip_name="qwen_2.5_vl_7b_fp8_scaled.safetensors", type="qwen_image",
                 device="default")
    vae = w.add("VAELoader", 0, vae_name="qwen_image_vae.safetensors")
    positive = w.add("CLIPTextEncode", 1, title="Prompt", clip=clip.out(),
                     text='a hand-painted shop sign that reads "StepCache Bakery", warm morning light')
    negative = w.add("CLIPTextEncode", 1, title="Negative prompt", clip=clip.out(), text="")
    latent = w.add("EmptySD3LatentImage", 1, width=1328, height=1328, batch_size=1)
    cache = w.add("ApplyMagCache", 2, model=unet.out(), **MAGCACHE_DEFAULTS)
    shifted = w.add("ModelSamplingAuraFlow", 2, model=cache.out(), shift=3.1)
    sampler = w.add("KSampler", 3, model=shifted.out(), positive=positive.out(), negative=negative.out(),
                    latent_image=latent.out(), seed=42, steps=30, cfg=2.5, sampler_name="euler",
                    scheduler="simple", denoise=1.0)
    decode = w.add("VAEDecode", 3, samples=sampler.out(), vae=vae.out())
    w.add("SaveImage", 3, images=decode.out(), filename_prefix="stepcache/qwen_image")
    w.note("""
## Qwen-Image with MagCache

Text to image at cfg 2.5 (cond and uncond cached per branch). The published Qwen-Image ratios
are used (`variant: auto`; Qwen-Image-Edit is told apart by its reference latent).

**Files** (Comfy-Org/Qwen-Image_ComfyUI):
- `diffusion_models/qwen_image_fp8_e4m3fn.safetensors`
- `text_encoders/qwen_2.5_vl_7b_fp8_scaled.safetensors`
- `vae/qwen_image_vae.safetensors`

**Expected speedup**: no published figure in a comparable table; see docs/benchmark.md.
""" + TUNING_MAGCACHE)
    return w


def _demo_inputs(w: Workflow, subject: str) -> tuple[Node, Node, Node, Node]:
    model = w.add("StepCacheDemoModel", 0, kind="image")
    positive = w.add("StepCacheDemoPrompt", 0, title="Prompt", kind="image", subject=subject, batch_size=4)
    negative = w.add("StepCacheDemoPrompt", 0, title="Negative", kind="image", subject="(unconditional)",
                     batch_size=4)
    latent = w.add("StepCacheDemoLatent", 0, kind="image", batch_size=4, frames=0)
    return model, positive, negative, latent


def _demo_sample_and_save(w: Workflow, model: Node, positive: Node, negative: Node, latent: Node,
                          prefix: str) -> None:
    """KSampler (euler 30 steps, cfg 4), the demo decoder and SaveImage, in group 2."""
    sampler = w.add("KSampler", 2, model=model.out(), positive=positive.out(), negative=negative.out(),
                    latent_image=latent.out(), seed=1000, steps=30, cfg=4.0, sampler_name="euler",
                    scheduler="simple", denoise=1.0)
    decode = w.add("StepCacheDemoDecode", 2, samples=sampler.out())
    w.add("SaveImage", 2, images=decode.out(), filename_prefix=prefix)


DEMO_FILES = """
**Files**: none. The built-in model (2.3 M parameters, a FLUX-architecture model trained on simple
shapes, shipped with the pack) runs on a CPU in seconds.
"""


def demo_image_magcache() -> Workflow:
    w = Workflow("demo_image_magcache")
    w.groups = {0: "Built-in model, no downloads", 1: "Step cache", 2: "Sample and save"}
    model, positive, negative, latent = _demo_inputs(w, "disc")
    cache = w.add("ApplyMagCache", 1, model=model.out(), **{**MAGCACHE_DEFAULTS, "variant": "flux.1-dev"})
    _demo_sample_and_save(w, cache, positive, negative, latent, "stepcache_demo_magcache")
    w.note(f"""
## StepCache demo: MagCache on the built-in model

Try the cache with nothing to download. Apply MagCache runs at `quality: balanced`: it measures
its own error as it samples, so the demo model (FLUX.1's architecture, no published checkpoint)
needs no table. At `quality: custom` the node's expert inputs apply; there `variant: flux.1-dev`
chooses FLUX.1-dev's published MagCache ratios by hand. The calibrate demo measures the model's own.
{DEMO_FILES}
**Expected speedup**: measured on this model in docs/benchmark.md (its block stack is a small
share of each step, so wall time gains less than on real models). `./dev demo` runs this graph
headless, with and without the cache.
{TUNING_MAGCACHE}""")
    return w


def demo_image_teacache() -> Workflow:
    w = Workflow("demo_image_teacache")
    w.groups = {0: "Built-in model, no downloads", 1: "Step cache", 2: "Sample and save"}
    model, positive, negative, latent = _demo_inputs(w, "disc")
    cache = w.add("ApplyTeaCache", 1, model=model.out(), threshold=0.2, start_percent=0.0, end_percent=1.0,
                  max_consecutive_skips=3, cache_device="main_device", variant="flux.1-dev",
                  **TEACACHE_SHARED_DEFAULTS, quality="custom")
    _demo_sample_and_save(w, cache, positive, negative, latent, "stepcache_demo")
    w.note(f"""
## StepCache demo: TeaCache on the built-in model

Try the cache with nothing to download. The demo model has FLUX.1's architecture but is no
published checkpoint; `variant: flux.1-dev` chooses FLUX.1-dev's published TeaCache polynomial by
hand (with `auto` it would run on the unscaled signal, which needs a smaller threshold).
{DEMO_FILES}
**Expected speedup**: measured on this model in docs/benchmark.md.
{TUNING_TEACACHE}""")
    return w


def demo_image_calibrate_magcache() -> Workflow:
    w = Workflow("demo_image_calibrate_magcache")
    w.groups = {0: "Built-in model, no downloads", 1: "Calibrate", 2: "Sample with the cache"}
    model, positive, negative, latent = _demo_inputs(w, "ring")
    calibrate = w.add("MagCacheCalibrate", 1, model=model.out(), positive=positive.out(),
                      negative=negative.out(), latent_image=latent.out(), seed=7, steps=30, cfg=4.0,
                      sampler_name="euler", scheduler="simple", denoise=1.0, save_calibration=True)
    w.add("PreviewAny", 1, title="Calibration report", source=calibrate.out(2))
    cache = w.add("ApplyMagCache", 2, model=model.out(), ratios=calibrate.out(1), threshold=0.1,
                  max_consecutive_skips=3, retention_ratio=0.2, cache_device="main_device", variant="auto",
                  **MAGCACHE_SHARED_DEFAULTS, skip_rule="magnitude", quality="custom")
    _demo_sample_and_save(w, cache, positive, negative, latent, "stepcache_calibrated")
    w.note(f"""
## StepCache demo: calibrate MagCache, then sample with it

**MagCache Calibrate** samples the built-in model once and measures its MagCache ratios (averaged
over the batch of 4); its `ratios` output feeds **Apply MagCache**, which the KSampler samples
with at `quality: custom` (the quality levels measure their own error and use no calibration).
The report shows the measured ratios. With `save_calibration` on, the calibration is also saved,
to `ComfyUI/user/stepcache/calibrations/magcache-<family>-<fingerprint>.json`, and Apply
MagCache at `quality: custom` and `variant: auto` uses it for this model from then on, without the
link; delete that file (the report names it) to stop using it.
{DEMO_FILES}
{TUNING_MAGCACHE}""")
    return w


WORKFLOWS: tuple[Callable[[], Workflow], ...] = (
    flux1_dev_magcache, flux1_dev_controlnet_magcache, flux2_dev_teacache, flux2_dev_calibrate_magcache,
    wan21_t2v_magcache, wan21_t2v_context_windows_magcache, wan22_t2v_two_stage_magcache, hunyuan_video_magcache,
    qwen_image_magcache,
    demo_image_magcache, demo_image_teacache, demo_image_calibrate_magcache,
)


def dumps(data: dict) -> str:
    return json.dumps(data, indent=1, ensure_ascii=False) + "\n"


def expected_files() -> dict[pathlib.Path, str]:
    """Every file this script writes, with its content."""
    files = {}
    for make in WORKFLOWS:
        workflow = make()
        files[UI_DIR / f"{workflow.name}.json"] = dumps(workflow.ui())
        files[API_DIR / f"{workflow.name}.json"] = dumps(workflow.api())
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only compare with the committed files")
    args = parser.parse_args(argv)
    stale = []
    for path, text in expected_files().items():
        current = path.read_text() if path.exists() else None
        if current == text:
            continue
        stale.append(path.relative_to(REPO_ROOT))
        if not args.check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    verb = "differ from the generator" if args.check else "written"
    for path in stale:
        print(f"{path}: {verb}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
