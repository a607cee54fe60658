"""Test-only ComfyUI nodes (never shipped): tiny models and conditioning without a text encoder.

ComfyUI has no core node that makes conditioning without a text encoder, and its Flux detection
cannot load tiny checkpoints, so API tests build both here, from ComfyUI's own model classes.
"""

from __future__ import annotations

from comfy_api.latest import ComfyExtension, io

from .tiny_models import FAMILIES, build_model, conditioning, empty_latent, tiny_controlnet

FAMILY_NAMES = sorted(FAMILIES)


class TinyModel(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="StepCacheTestTinyModel",
            category="stepcache/testing",
            inputs=[
                io.Combo.Input("family", options=FAMILY_NAMES),
                io.Int.Input("seed", default=0, min=0, max=2**31 - 1),
            ],
            outputs=[io.Model.Output()],
        )

    @classmethod
    def execute(cls, family: str, seed: int) -> io.NodeOutput:
        return io.NodeOutput(build_model(family, seed))


class TinyConditioning(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="StepCacheTestConditioning",
            category="stepcache/testing",
            inputs=[
                io.Combo.Input("family", options=FAMILY_NAMES),
                io.Int.Input("seed", default=0, min=0, max=2**31 - 1),
                io.Int.Input("batch", default=1, min=1, max=16),
            ],
            outputs=[io.Conditioning.Output()],
        )

    @classmethod
    def execute(cls, family: str, seed: int, batch: int) -> io.NodeOutput:
        return io.NodeOutput(conditioning(family, seed, batch))


class TinyLatent(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="StepCacheTestLatent",
            category="stepcache/testing",
            inputs=[
                io.Combo.Input("family", options=FAMILY_NAMES),
                io.Int.Input("batch", default=1, min=1, max=16),
                io.Int.Input("scale", default=1, min=1, max=8),
                io.Int.Input("frames", default=0, min=0, max=64, tooltip="video length; 0 keeps the default"),
            ],
            outputs=[io.Latent.Output()],
        )

    @classmethod
    def execute(cls, family: str, batch: int, scale: int, frames: int) -> io.NodeOutput:
        return io.NodeOutput(empty_latent(family, batch, scale, frames or None))


class LatentSink(io.ComfyNode):
    """An output node that keeps nothing: stands in for VAE decode + save when an example
    workflow runs on a tiny model (which has no VAE), and reports the latent's shape."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="StepCacheTestLatentSink",
            category="stepcache/testing",
            inputs=[io.Latent.Input("samples")],
            outputs=[],
            is_output_node=True,
        )

    @classmethod
    def execute(cls, samples: dict) -> io.NodeOutput:
        latent = samples["samples"]
        return io.NodeOutput(ui={"latent_shape": [list(latent.shape)],
                                 "finite": [bool(latent.isfinite().all())]})


class ShiftingBlockPatch:
    """Another pack's block patch, as PuLID- or IP-Adapter-style packs put them on: it runs the
    block and then mixes its image stream's channels (adds ``strength`` times the stream with its
    channels reversed, which no later normalisation removes), counting its calls."""

    def __init__(self, strength: float) -> None:
        self.strength = strength
        self.calls = 0

    def __deepcopy__(self, memo: dict) -> ShiftingBlockPatch:
        return self  # ComfyUI copies model options (0.3.75): keep one counter per patch

    def __call__(self, args: dict, extra: dict) -> dict:
        self.calls += 1
        out = dict(extra["original_block"](args))
        img = out["img"]
        out["img"] = img + self.strength * img.flip(-1)
        return out


class BlockPatch(io.ComfyNode):
    """Puts a ``ShiftingBlockPatch`` on one block of the model (``patches_replace["dit"]``)."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="StepCacheTestBlockPatch",
            category="stepcache/testing",
            inputs=[
                io.Model.Input("model"),
                io.Combo.Input("kind", options=["double_block", "single_block"]),
                io.Int.Input("index", default=0, min=0, max=63),
                io.Float.Input("strength", default=0.5, min=-4.0, max=4.0),
            ],
            outputs=[io.Model.Output()],
        )

    @classmethod
    def execute(cls, model: object, kind: str, index: int, strength: float) -> io.NodeOutput:
        patched = model.clone()
        patched.set_model_patch_replace(ShiftingBlockPatch(strength), "dit", kind, index)
        return io.NodeOutput(patched)


class TinyControlNet(io.ComfyNode):
    """A tiny ControlNet for a FLUX, Qwen-Image or SD3 model (``tiny_models.tiny_controlnet``): stands in
    for ControlNetLoader when an example workflow runs on a tiny model."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="StepCacheTestTinyControlNet",
            category="stepcache/testing",
            inputs=[
                io.Model.Input("model"),
                io.Int.Input("seed", default=0, min=0, max=2**31 - 1),
                io.Int.Input("union_modes", default=0, min=0, max=16),
            ],
            outputs=[io.ControlNet.Output()],
        )

    @classmethod
    def execute(cls, model: object, seed: int, union_modes: int) -> io.NodeOutput:
        return io.NodeOutput(tiny_controlnet(model, seed, union_modes))


class TestNodes(ComfyExtension):
    async def get_node_list(self) -> list[type[io.ComfyNode]]:
        return [TinyModel, TinyConditioning, TinyLatent, LatentSink, BlockPatch, TinyControlNet]


async def comfy_entrypoint() -> ComfyExtension:
    return TestNodes()
