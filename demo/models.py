"""The demo models: small Flux (image) and Wan 2.1 T2V (video) transformers, trained on demo.data.

Loaded like a user's checkpoint (``demo/model_builder.py``: ComfyUI's own detection, key
conversion, ``comfy.supported_models.Flux`` / ``WAN21_T2V`` and ``ModelPatcher``), so KSampler,
model sampling, latent formats and the pack's cache hooks meet exactly what they meet on a real
checkpoint, on every supported ComfyUI version. Only widths and depths are small. The weights in
``demo/weights/<kind>.safetensors`` are produced by ``demo/train.py``; ``demo/templates/<kind>.json``
holds each model's checkpoint keys and shapes (the order training draws its initial values in),
the sizes ComfyUI's detection cannot read from shapes (the overlay) and the model class.

Conditioning is a fixed, seeded embedding per class in place of a text encoder's output: a few
context tokens (plus a pooled vector for Flux). One more seeded embedding is the "null" prompt
that training drops to, so classifier-free guidance (``cfg > 1`` with the null embedding as the
negative) works as with a real text encoder.
"""

from __future__ import annotations

import functools
import json
import pathlib
from collections.abc import Sequence
from dataclasses import dataclass

import comfy.model_patcher
import numpy as np
import safetensors
import safetensors.torch
import torch

from . import data, model_builder

WEIGHTS_DIR = pathlib.Path(__file__).resolve().parent / "weights"
TEMPLATES_DIR = pathlib.Path(__file__).resolve().parent / "templates"
CLASSES = {"image": data.IMAGE_CLASSES, "video": data.VIDEO_CLASSES}


@dataclass(frozen=True)
class Spec:
    kind: str
    context_dim: int
    pooled_dim: int | None  # Flux's "pooled_output" (vec_in_dim); Wan has none
    context_tokens: int
    latent_spatial: tuple[int, ...]  # (h, w) or (T, h, w)
    embedding_seed: int

    @property
    def template(self) -> model_builder.Template:
        return _template(self.kind)

    @property
    def config_class(self) -> str:
        return self.template.config_class


# image: a Flux (hidden 128, 4 heads, 2 double + 4 single blocks, no guidance embedding);
# video: a Wan 2.1 T2V (dim 128, 2 heads, 4 layers, text width 64). See demo/templates/.
SPECS = {
    "image": Spec(
        kind="image", context_dim=64, pooled_dim=32, context_tokens=4,
        latent_spatial=(data.IMAGE_SIZE // 2, data.IMAGE_SIZE // 2), embedding_seed=1001,
    ),
    "video": Spec(
        kind="video", context_dim=64, pooled_dim=None, context_tokens=4,
        latent_spatial=(data.VIDEO_FRAMES, data.IMAGE_SIZE // 2, data.IMAGE_SIZE // 2), embedding_seed=2002,
    ),
}


@functools.cache
def _template(kind: str) -> model_builder.Template:
    return model_builder.Template.load(TEMPLATES_DIR / f"{kind}.json")


def weights_path(kind: str) -> pathlib.Path:
    return WEIGHTS_DIR / f"{kind}.safetensors"


def build_model(kind: str, state_dict: dict[str, torch.Tensor] | None = None) -> comfy.model_patcher.ModelPatcher:
    """The model on CPU in float32, from checkpoint-format weights. Without ``state_dict`` the
    weights are whatever ``init_state_dict`` (training start) would give: pass it explicitly to
    say which."""
    template = SPECS[kind].template
    if state_dict is None:
        state_dict = init_state_dict(kind, seed=0)
    return model_builder.build_model(state_dict, template.overlay, template.config_class)


def init_state_dict(kind: str, seed: int) -> dict[str, torch.Tensor]:
    """Training start, in the checkpoint format: Xavier matrices, zero biases, unit norm scales,
    and zero output layers and modulation (adaLN-Zero for Flux, a zero head for Wan) so every
    block starts as identity. ComfyUI builds its layers without initialising them
    (comfy.ops.disable_weight_init)."""
    gen = torch.Generator().manual_seed(seed)
    state = {}
    for name, shape in SPECS[kind].template.shapes.items():
        tensor = torch.empty(shape)
        zero = (
            name.startswith("final_layer.")  # Flux LastLayer: adaLN modulation and projection
            or ".img_mod." in name or ".txt_mod." in name or ".modulation.lin." in name  # Flux adaLN
            or name.startswith("head.head.")  # Wan output projection
        )
        if zero:
            value = torch.zeros_like(tensor)
        elif name.endswith("modulation"):  # Wan's learned modulation offsets (1, k, dim)
            value = torch.randn(tensor.shape, generator=gen) / tensor.shape[-1] ** 0.5
        elif tensor.ndim >= 2:
            fan_out, fan_in = tensor.shape[0], tensor[0].numel()
            bound = (6.0 / (fan_in + fan_out)) ** 0.5
            value = (torch.rand(tensor.shape, generator=gen) * 2 - 1) * bound
        elif name.endswith(("scale", "weight")):  # norms
            value = torch.ones_like(tensor)
        else:
            value = torch.zeros_like(tensor)
        state[name] = value
    return state


def checkpoint_state_dict(kind: str, model: comfy.model_patcher.ModelPatcher,
                          module_state: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """The demo model's weights (or ``module_state``) in the checkpoint format of its template:
    what save_weights writes, so that every supported ComfyUI loads the file."""
    return model_builder.checkpoint_state_dict(model, SPECS[kind].template, module_state)


def save_weights(kind: str, state_dict: dict[str, torch.Tensor], path: pathlib.Path, dtype: torch.dtype,
                 extra_metadata: dict[str, str] | None = None) -> None:
    spec = SPECS[kind]
    metadata = {
        "demo_kind": kind,
        "config_class": spec.config_class,
        "overlay": json.dumps(spec.template.overlay),
        "classes": json.dumps(list(CLASSES[kind])),
        **(extra_metadata or {}),
    }
    tensors = {k: v.detach().to(dtype).contiguous() for k, v in state_dict.items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    safetensors.torch.save_file(tensors, str(path), metadata=metadata)


def read_weights(path: pathlib.Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    with safetensors.safe_open(str(path), framework="pt") as f:
        metadata = f.metadata() or {}
        tensors = {k: f.get_tensor(k).to(torch.float32) for k in f.keys()}  # noqa: SIM118
    return tensors, metadata


def load_model(kind: str, path: pathlib.Path | str | None = None) -> comfy.model_patcher.ModelPatcher:
    """The trained model of this kind ("image" or "video") from its safetensors file."""
    state_dict, metadata = read_weights(pathlib.Path(path) if path else weights_path(kind))
    if metadata.get("demo_kind") != kind:
        raise ValueError(f"{path} holds a {metadata.get('demo_kind')!r} model, not {kind!r}")
    if metadata.get("config_class", SPECS[kind].config_class) != SPECS[kind].config_class:
        raise ValueError(f"{path} holds a {metadata['config_class']} model, not {SPECS[kind].config_class}")
    return build_model(kind, state_dict)


def random_model(kind: str, seed: int = 0) -> comfy.model_patcher.ModelPatcher:
    """Same architecture, untrained weights with non-zero outputs (for tests that must fail on it):
    the training start with every matrix drawn at random instead."""
    state = init_state_dict(kind, seed=0)
    gen = torch.Generator().manual_seed(seed)
    for name, shape in SPECS[kind].template.shapes.items():
        if len(shape) >= 2:
            state[name] = torch.randn(shape, generator=gen) / torch.Size(shape[1:]).numel() ** 0.5
    return build_model(kind, state)


# --- conditioning -------------------------------------------------------------------------------

@functools.cache
def embeddings(kind: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Seeded class embeddings, row ``len(CLASSES[kind])`` being the null embedding:
    context [n + 1, tokens, context_dim] and pooled [n + 1, pooled_dim] (None for video)."""
    spec = SPECS[kind]
    gen = torch.Generator().manual_seed(spec.embedding_seed)
    n = len(CLASSES[kind]) + 1
    context = torch.randn(n, spec.context_tokens, spec.context_dim, generator=gen)
    pooled = torch.randn(n, spec.pooled_dim, generator=gen) if spec.pooled_dim else None
    return context, pooled


def null_index(kind: str) -> int:
    return len(CLASSES[kind])


def embedding_batch(kind: str, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Context (and pooled) rows for these indices (class indices, or ``null_index``)."""
    context, pooled = embeddings(kind)
    return context[indices], (pooled[indices] if pooled is not None else None)


def conditioning(kind: str, class_index: int | Sequence[int | None] | None, batch: int = 1) -> list:
    """ComfyUI CONDITIONING for this class; ``None`` gives the null embedding (CFG's negative).

    A sequence of class indices gives one row per entry (a batch of mixed classes; ``batch``
    is then ignored)."""
    if isinstance(class_index, (list, tuple, torch.Tensor, np.ndarray)):
        rows = [null_index(kind) if k is None else int(k) for k in class_index]
    else:
        rows = [null_index(kind) if class_index is None else int(class_index)] * batch
    if not all(0 <= k <= null_index(kind) for k in rows):
        raise IndexError(f"class index out of range for {kind}: {class_index}")
    context, pooled = embedding_batch(kind, torch.tensor(rows, dtype=torch.long))
    extra = {"pooled_output": pooled} if SPECS[kind].pooled_dim else {}
    return [[context, extra]]


def empty_latent(kind: str, batch: int = 1, frames: int | None = None) -> dict:
    """A ComfyUI LATENT of zeros at the trained size (``frames`` changes the video length)."""
    spatial = list(SPECS[kind].latent_spatial)
    if kind == "video" and frames is not None:
        spatial[0] = frames
    return {"samples": torch.zeros(batch, 16, *spatial)}


def parameter_count(model: comfy.model_patcher.ModelPatcher) -> int:
    return sum(p.numel() for p in model.model.diffusion_model.parameters())
