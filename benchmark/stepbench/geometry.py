"""Checkpoint-format templates of FLUX.1 and Wan 2.1 at any size, for random-weight models.

A template (demo/model_builder.py's ``Template``) is the checkpoint's keys and shapes plus the sizes
ComfyUI's detection cannot see; the model is then built through detection like a user's
checkpoint. Real geometries (``FLUX1_DEV``, ``WAN21_14B``) are the released models' sizes, read
from their published configs (black-forest-labs/FLUX.1-dev, Wan-AI/Wan2.1-T2V-14B).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Shapes = list[tuple[str, tuple[int, ...]]]


def _linear(name: str, out: int, inp: int) -> Shapes:
    return [(f"{name}.weight", (out, inp)), (f"{name}.bias", (out,))]


@dataclass(frozen=True)
class FluxGeometry:
    hidden: int = 3072
    double: int = 19
    single: int = 38
    head_dim: int = 128
    context_dim: int = 4096  # T5-XXL
    pooled_dim: int = 768  # CLIP-L
    guidance: bool = True  # FLUX.1-dev's distilled guidance input

    def template(self, builder: Any) -> Any:
        """FLUX.1's released format, which every supported ComfyUI loads, sampled as ``Flux``.
        Detection cannot read the head count or RoPE axes from the shapes: the overlay gives them."""
        h, mlp, d = self.hidden, 4 * self.hidden, self.head_dim

        def qk_norm(prefix: str) -> Shapes:
            return [(f"{prefix}.norm.query_norm.scale", (d,)), (f"{prefix}.norm.key_norm.scale", (d,))]

        shapes = [*_linear("img_in", h, 16 * 4), *_linear("time_in.in_layer", h, 256),
                  *_linear("time_in.out_layer", h, h), *_linear("vector_in.in_layer", h, self.pooled_dim),
                  *_linear("vector_in.out_layer", h, h), *_linear("txt_in", h, self.context_dim)]
        if self.guidance:
            shapes += [*_linear("guidance_in.in_layer", h, 256), *_linear("guidance_in.out_layer", h, h)]
        for i in range(self.double):
            for stream in ("img", "txt"):
                b = f"double_blocks.{i}.{stream}"
                shapes += [*_linear(f"{b}_mod.lin", 6 * h, h), *_linear(f"{b}_attn.qkv", 3 * h, h),
                           *qk_norm(f"{b}_attn"), *_linear(f"{b}_attn.proj", h, h), *_linear(f"{b}_mlp.0", mlp, h),
                           *_linear(f"{b}_mlp.2", h, mlp)]
        for i in range(self.single):
            b = f"single_blocks.{i}"
            shapes += [*_linear(f"{b}.linear1", 3 * h + mlp, h), *_linear(f"{b}.linear2", h, h + mlp),
                       *qk_norm(b), *_linear(f"{b}.modulation.lin", 3 * h, h)]
        shapes += [*_linear("final_layer.linear", 16 * 4, h), *_linear("final_layer.adaLN_modulation.1", 2 * h, h)]
        # Older ComfyUI (0.3.75) assumes FLUX.1's 24 heads whatever the width: always say how many.
        axes = [16, 56, 56] if d == 128 else [d // 4, 3 * d // 8, 3 * d // 8]
        overlay = {"num_heads": h // d, "axes_dim": axes}
        return builder.Template(dict(shapes), overlay=overlay, config_class="Flux")

    def describe(self) -> str:
        return (f"FLUX.1 geometry: hidden {self.hidden}, {self.hidden // self.head_dim} heads of {self.head_dim}, "
                f"{self.double} double + {self.single} single blocks")


@dataclass(frozen=True)
class WanGeometry:
    dim: int = 5120
    ffn: int = 13824
    layers: int = 40

    def template(self, builder: Any) -> Any:
        """Wan 2.1 text-to-video's released format; detection reads every size from the shapes
        (heads of 128), the text width (UMT5-XXL, 4096) comes as an overlay."""
        d = self.dim
        shapes: Shapes = [("patch_embedding.weight", (d, 16, 1, 2, 2)), ("patch_embedding.bias", (d,)),
                          *_linear("text_embedding.0", d, 4096), *_linear("text_embedding.2", d, d),
                          *_linear("time_embedding.0", d, 256), *_linear("time_embedding.2", d, d),
                          *_linear("time_projection.1", 6 * d, d)]
        for i in range(self.layers):
            b = f"blocks.{i}"
            shapes.append((f"{b}.modulation", (1, 6, d)))
            for attn in ("self_attn", "cross_attn"):
                for proj in "qkvo":
                    shapes += _linear(f"{b}.{attn}.{proj}", d, d)
                shapes += [(f"{b}.{attn}.norm_q.weight", (d,)), (f"{b}.{attn}.norm_k.weight", (d,))]
            shapes += [(f"{b}.norm3.weight", (d,)), (f"{b}.norm3.bias", (d,)),
                       *_linear(f"{b}.ffn.0", self.ffn, d), *_linear(f"{b}.ffn.2", d, self.ffn)]
        shapes += [("head.modulation", (1, 2, d)), *_linear("head.head", 64, d)]
        return builder.Template(dict(shapes), overlay={"text_dim": 4096}, config_class=None)

    def describe(self) -> str:
        return f"Wan 2.1 geometry: dim {self.dim}, {self.dim // 128} heads, ffn {self.ffn}, {self.layers} blocks"


FLUX1_DEV = FluxGeometry()
WAN21_14B = WanGeometry()
