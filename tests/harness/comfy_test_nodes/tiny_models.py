"""Tiny models of each supported family, built with ComfyUI's own model classes.

Weights are random (seeded): they prove mechanics, not image quality. Each entry gives the
``comfy.supported_models`` class, a small ``unet_config``, the latent shape and a conditioning
maker, so a test can sample any family through ComfyUI's real samplers in well under a second.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

import comfy.model_patcher
import comfy.supported_models


@dataclass(frozen=True)
class TinyFamily:
    name: str
    config_class: str  # attribute of comfy.supported_models
    unet_config: dict
    latent_channels: int
    latent_spatial: tuple[int, ...]  # (H, W) for images, (T, H, W) for video
    context_dim: int
    context_tokens: int = 8
    # Extra conditioning values (pooled output, guidance, ...) for a batch of this size.
    extra_cond: Callable[[int, torch.Generator], dict] = field(default=lambda batch, gen: {})

    @property
    def is_video(self) -> bool:
        return len(self.latent_spatial) == 3


def _flux_extra(batch: int, gen: torch.Generator) -> dict:
    return {"pooled_output": torch.randn(batch, 32, generator=gen), "guidance": 3.5}


FAMILIES: dict[str, TinyFamily] = {}


def register(family: TinyFamily) -> TinyFamily:
    FAMILIES[family.name] = family
    return family


register(TinyFamily(
    name="flux",
    config_class="Flux",
    unet_config=dict(
        image_model="flux", in_channels=16, out_channels=16, vec_in_dim=32, context_in_dim=64,
        hidden_size=64, mlp_ratio=4.0, num_heads=2, depth=2, depth_single_blocks=2,
        axes_dim=[8, 12, 12], theta=10000, patch_size=2, qkv_bias=True, guidance_embed=True,
    ),
    latent_channels=16, latent_spatial=(16, 16), context_dim=64, extra_cond=_flux_extra,
))

register(TinyFamily(
    name="wan21",
    config_class="WAN21_T2V",
    unet_config=dict(
        image_model="wan2.1", model_type="t2v", dim=128, ffn_dim=256, num_heads=1, num_layers=2,
        in_dim=16, out_dim=16, freq_dim=256, text_dim=4096, patch_size=(1, 2, 2), window_size=(-1, -1),
        qk_norm=True, cross_attn_norm=True, eps=1e-6,
    ),
    latent_channels=16, latent_spatial=(3, 8, 8), context_dim=4096,
))


def random_state_dict(model: torch.nn.Module, seed: int) -> dict[str, torch.Tensor]:
    """Seeded weights with sane scales: fan-in scaled matrices, unit norm weights, small vectors."""
    gen = torch.Generator().manual_seed(seed)
    state = {}
    for name, tensor in model.state_dict().items():
        shape = tensor.shape
        if tensor.ndim >= 2:
            fan_in = max(1, tensor[0].numel())
            value = torch.randn(shape, generator=gen) / fan_in**0.5
        elif "norm" in name and name.endswith(("weight", "scale")):
            value = torch.ones(shape)
        else:
            value = 0.02 * torch.randn(shape, generator=gen)
        state[name] = value.to(tensor.dtype) if tensor.is_floating_point() else tensor
    return state


def build_model(family: str, seed: int = 0) -> comfy.model_patcher.ModelPatcher:
    spec = FAMILIES[family]
    config = getattr(comfy.supported_models, spec.config_class)(dict(spec.unet_config))
    config.set_inference_dtype(torch.float32, None)
    model = config.get_model({}, "")
    model.load_model_weights(random_state_dict(model.diffusion_model, seed), "")
    model.eval()
    device = torch.device("cpu")
    return comfy.model_patcher.ModelPatcher(model, load_device=device, offload_device=device)


def conditioning(family: str, seed: int = 0, batch: int = 1, tokens: int | None = None) -> list:
    spec = FAMILIES[family]
    gen = torch.Generator().manual_seed(seed)
    n_tokens = tokens or spec.context_tokens
    context = torch.randn(batch, n_tokens, spec.context_dim, generator=gen)
    return [[context, spec.extra_cond(batch, gen)]]


def empty_latent(family: str, batch: int = 1, scale: int = 1, frames: int | None = None) -> dict:
    """An empty latent; ``scale`` multiplies the spatial size, ``frames`` sets the video length."""
    spec = FAMILIES[family]
    spatial = list(spec.latent_spatial)
    spatial[-2] *= scale
    spatial[-1] *= scale
    if spec.is_video and frames is not None:
        spatial[0] = frames
    return {"samples": torch.zeros(batch, spec.latent_channels, *spatial)}
