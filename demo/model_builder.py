"""Build a ComfyUI MODEL from a checkpoint-format state dict, the way ComfyUI loads a user's file.

One builder for the demo models (demo/models.py, nodes/demo_nodes.py), the tests' tiny models
(tests/harness/comfy_test_nodes/tiny_models.py) and the benchmark's larger model
(benchmark/stepbench/overhead.py).

Why it starts from a state dict and not from a hand-written config: the config a model class
takes is ComfyUI's internal business and changes between versions (0.30.0 requires
``txt_ids_dims`` for Flux and Chroma, ``vec_in_dim`` for Chroma, ``meanflow_sum`` for
HunyuanVideo, none of which 0.3.75 knew). The *checkpoint format*, the keys and shapes of the
files people download, is the most stable interface ComfyUI has: every version must keep loading
last year's files, so each one fills its own config from them (``comfy.model_detection``) and
converts their keys to its own modules (``process_unet_state_dict``, e.g. Flux's Q/K norm
``.scale`` -> ``.weight`` in 0.30.0). Building from a checkpoint-format state dict therefore
builds the model exactly as UNETLoader would, on every version, with nothing version-specific
here. The steps:

1. ``comfy.model_detection.detect_unet_config(state_dict, "")`` fills the config from the shapes.
2. An *overlay* sets what detection cannot read from shapes or hard-codes for the full-size
   release (Flux's head count and RoPE axes, Wan's text width, ...). It names sizes of the
   architecture, never fields of ComfyUI's config, so it stays valid when ComfyUI adds fields.
3. The model class (``comfy.supported_models``) is detection's match, or named explicitly where
   detection would pick a sibling that samples differently (the demo image model was trained as
   ``Flux``; without guidance embedding detection says ``FluxSchnell``, another model sampling).
4. ``set_inference_dtype``, ``get_model``, ``load_model_weights`` (ComfyUI's own key conversion)
   and ``ModelPatcher``, as ``comfy.sd.load_diffusion_model_state_dict`` does. A weight the
   state dict lacks is an error here (ComfyUI only logs it, and the model would sample from
   uninitialised memory). A key the model does not take is left to ComfyUI, as for a user's
   file: versions drop unused weights (0.30.0's Lumina 2 has no ``norm_final``), and real
   checkpoints keep them.

Models without trained weights (the tests' tiny models, the benchmark's) are described by a
:class:`Template`: checkpoint key -> shape, the overlay and the class, committed as JSON and filled
with seeded values by :func:`random_state_dict`. They then load exactly like a user's checkpoint.

This module imports only ComfyUI, torch and the standard library, so that the test-only nodes
(which ComfyUI loads as a separate package) can load it by path.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import comfy.model_detection
import comfy.model_management
import comfy.model_patcher
import comfy.supported_models
import torch


@dataclass(frozen=True)
class Template:
    """A model without weights: checkpoint key -> shape (in the order the values are drawn),
    the overlay onto detection's config, and the ``comfy.supported_models`` class (None: detect)."""

    shapes: dict[str, tuple[int, ...]]
    overlay: dict[str, Any] = field(default_factory=dict)
    config_class: str | None = None

    @classmethod
    def load(cls, path: pathlib.Path | str) -> Template:
        raw = json.loads(pathlib.Path(path).read_text())
        return cls(shapes={k: tuple(v) for k, v in raw["shapes"].items()}, overlay=raw.get("overlay", {}),
                   config_class=raw.get("config_class"))

    def to_json(self) -> str:
        """The committed form: one line per tensor, so that diffs stay readable."""
        head = json.dumps({"config_class": self.config_class, "overlay": self.overlay})[:-1]
        rows = ",\n".join(f"    {json.dumps(k)}: {json.dumps(list(v))}" for k, v in self.shapes.items())
        return f'{head}, "shapes": {{\n{rows}\n}}}}\n'


def template_of(state_dict: Mapping[str, torch.Tensor], overlay: Mapping[str, Any] | None = None,
                config_class: str | None = None) -> Template:
    return Template({k: tuple(v.shape) for k, v in state_dict.items()}, dict(overlay or {}), config_class)


def random_state_dict(template: Template, seed: int) -> dict[str, torch.Tensor]:
    """Seeded float32 weights with sane scales, drawn in template order: matrices and kernels
    randn / sqrt(fan_in), norm weights (``*norm*.weight`` / ``.scale``) one, other vectors
    0.02 * randn."""
    gen = torch.Generator().manual_seed(seed)
    state = {}
    for name, shape in template.shapes.items():
        if len(shape) >= 2:
            fan_in = max(1, int(torch.Size(shape[1:]).numel()))
            state[name] = torch.randn(shape, generator=gen) / fan_in**0.5
        elif "norm" in name and name.endswith(("weight", "scale")):
            state[name] = torch.ones(shape)
        else:
            state[name] = 0.02 * torch.randn(shape, generator=gen)
    return state


def model_config(state_dict: Mapping[str, torch.Tensor], overlay: Mapping[str, Any] | None = None,
                 config_class: str | None = None) -> Any:
    """ComfyUI's model config (a ``comfy.supported_models`` instance) for this checkpoint-format
    state dict: detection's config with the overlay on top, of the named or the detected class."""
    unet_config = comfy.model_detection.detect_unet_config(dict(state_dict), "")
    if unet_config is None:
        raise ValueError("ComfyUI does not recognise this state dict as a diffusion model checkpoint")
    unet_config.update(overlay or {})
    if config_class is None:
        config = comfy.model_detection.model_config_from_unet_config(unet_config, state_dict)
        if config is None:
            raise ValueError(f"no ComfyUI model class matches the detected config {unet_config}")
        return config
    cls = getattr(comfy.supported_models, config_class, None)
    if cls is None:
        raise ValueError(f"this ComfyUI has no model class {config_class!r} (comfy.supported_models)")
    return cls(unet_config)


def build_model(state_dict: Mapping[str, torch.Tensor], overlay: Mapping[str, Any] | None = None,
                config_class: str | None = None, dtype: torch.dtype = torch.float32,
                load_device: torch.device | None = None,
                offload_device: torch.device | None = None,
                compute_dtype: torch.dtype | None = None) -> comfy.model_patcher.ModelPatcher:
    """A ModelPatcher (CPU unless told otherwise) holding exactly these weights, in ``dtype``.

    ``compute_dtype``: the dtype weights are cast to for computing (ComfyUI's manual cast, as for
    fp8 weights); None lets ComfyUI choose for the load device, as UNETLoader does (none for
    float32 weights). Raises ValueError when the state dict lacks a weight of the model ComfyUI
    builds from it."""
    config = model_config(state_dict, overlay, config_class)
    if compute_dtype is None:
        compute_dtype = comfy.model_management.unet_manual_cast(
            dtype, load_device or torch.device("cpu"), config.supported_inference_dtypes)
    config.set_inference_dtype(dtype, None if compute_dtype == dtype else compute_dtype)
    model = config.get_model(dict(state_dict), "")
    missing: list[str] = []

    def record(module: torch.nn.Module, incompatible: Any) -> None:
        missing.extend(incompatible.missing_keys)

    hook = model.diffusion_model.register_load_state_dict_post_hook(record)
    try:
        model.load_model_weights(dict(state_dict), "")  # ComfyUI converts keys here; it pops from the dict
    finally:
        hook.remove()
    if missing:
        shown = ", ".join(missing[:6]) + (f" and {len(missing) - 6} more" if len(missing) > 6 else "")
        raise ValueError(f"{type(config).__name__}: the state dict lacks weights of the model ComfyUI built: {shown}")
    model.eval()
    cpu = torch.device("cpu")
    return comfy.model_patcher.ModelPatcher(model, load_device=load_device or cpu,
                                            offload_device=offload_device or cpu)


def build_from_template(template: Template, seed: int = 0,
                        state_dict: Mapping[str, torch.Tensor] | None = None,
                        **kwargs: Any) -> comfy.model_patcher.ModelPatcher:
    """The template's model with seeded random weights (or the given checkpoint-format ones)."""
    if state_dict is None:
        state_dict = random_state_dict(template, seed)
    return build_model(state_dict, template.overlay, template.config_class, **kwargs)


def checkpoint_state_dict(patcher: comfy.model_patcher.ModelPatcher, template: Template,
                          module_state: Mapping[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """The model's weights (or ``module_state``, a state dict of its diffusion model) under the
    template's checkpoint keys, for saving a file every supported ComfyUI loads.

    ComfyUI's load-time conversion (``process_unet_state_dict``) is run on placeholders and
    inverted; a conversion that does more than rename keys raises instead of guessing."""
    placeholders = {k: torch.empty(0) for k in template.shapes}
    converted = patcher.model.model_config.process_unet_state_dict(dict(placeholders))
    checkpoint_key = {id(v): k for k, v in placeholders.items()}
    if len(converted) != len(placeholders) or any(id(v) not in checkpoint_key for v in converted.values()):
        raise ValueError("ComfyUI's key conversion for this model is not a renaming; cannot invert it")
    module_state = patcher.model.diffusion_model.state_dict() if module_state is None else module_state
    missing = set(converted) ^ set(module_state)
    if missing:
        raise ValueError(f"the model's keys and the template's differ: {sorted(missing)[:6]}")
    return {checkpoint_key[id(v)]: module_state[k] for k, v in converted.items()}
