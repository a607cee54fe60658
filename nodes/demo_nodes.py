"""Nodes for the built-in demo models (demo/): try the cache without downloading anything.

The models are small FLUX-architecture (image) and Wan-2.1-architecture (video) transformers the
project trained on generated shapes; a class name stands in for the text prompt, and a fixed
invertible map turns latents into pixels.
"""

from __future__ import annotations

import functools

from comfy_api.latest import io

from ..demo import data, models, pixels
from .types import CATEGORY as PACK_CATEGORY
from .validation import Choice, check_related

CATEGORY = f"{PACK_CATEGORY}/demo"
KINDS = ["image", "video"]
UNCONDITIONAL = "(unconditional)"
SUBJECTS = [UNCONDITIONAL, *sorted(set(data.IMAGE_CLASSES) | set(data.VIDEO_CLASSES))]


@functools.cache
def _model(kind: str) -> object:
    return models.load_model(kind)


class DemoModel(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="StepCacheDemoModel",
            display_name="StepCache Demo Model",
            category=CATEGORY,
            description="A small trained FLUX-class image model or Wan-class video model that ships with the pack.",
            inputs=[Choice("kind", options=KINDS, default="image",
                                   tooltip="image: FLUX-class, 32x32 pixels; video: Wan-2.1-class, a few frames.")],
            outputs=[io.Model.Output()],
        )

    @classmethod
    def execute(cls, kind: str) -> io.NodeOutput:
        return io.NodeOutput(_model(kind).clone())


def subject_problem(kind: str, subject: str) -> str | None:
    if subject != UNCONDITIONAL and subject not in models.CLASSES.get(kind, ()):
        return f"the {kind} demo model knows {', '.join(models.CLASSES.get(kind, ()))}, not '{subject}'"
    return None


class DemoPrompt(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="StepCacheDemoPrompt",
            display_name="StepCache Demo Prompt",
            category=CATEGORY,
            description="Conditioning for one class of the demo model (its stand-in for a text prompt). "
            f"{UNCONDITIONAL} is the negative for classifier-free guidance.",
            inputs=[
                Choice("kind", options=KINDS, default="image", tooltip="Which demo model this is for."),
                Choice("subject", options=SUBJECTS, default="disc",
                       tooltip="image: " + ", ".join(data.IMAGE_CLASSES)
                       + "; video: " + ", ".join(data.VIDEO_CLASSES)),
                io.Int.Input("batch_size", default=1, min=1, max=64, tooltip="Match the latent's batch size."),
            ],
            outputs=[io.Conditioning.Output()],
        )

    @classmethod
    def validate_inputs(cls, kind: str, subject: str) -> bool | str:
        # Only the two inputs the rule relates: ComfyUI lists the answer under each input taken here.
        return check_related(cls, subject_problem, kind=kind, subject=subject)

    @classmethod
    def execute(cls, kind: str, subject: str, batch_size: int) -> io.NodeOutput:
        problem = subject_problem(kind, subject)  # linked values are only known now
        if problem is not None:
            raise ValueError(f"StepCacheDemoPrompt: {problem}")
        index = None if subject == UNCONDITIONAL else models.CLASSES[kind].index(subject)
        return io.NodeOutput(models.conditioning(kind, index, batch_size))


class DemoLatent(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="StepCacheDemoLatent",
            display_name="StepCache Demo Empty Latent",
            category=CATEGORY,
            inputs=[
                Choice("kind", options=KINDS, default="image", tooltip="Which demo model this is for."),
                io.Int.Input("batch_size", default=1, min=1, max=64, tooltip="Images (or videos) per run."),
                io.Int.Input("frames", default=0, min=0, max=64, tooltip="video latent frames; 0 = as trained"),
            ],
            outputs=[io.Latent.Output()],
        )

    @classmethod
    def execute(cls, kind: str, batch_size: int, frames: int) -> io.NodeOutput:
        return io.NodeOutput(models.empty_latent(kind, batch_size, frames or None))


class DemoDecode(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="StepCacheDemoDecode",
            display_name="StepCache Demo Decode",
            category=CATEGORY,
            description="Latent to pixels for the demo models (an exact linear map, no VAE). "
            "Video frames come out as a batch of images.",
            inputs=[io.Latent.Input("samples", tooltip="A LATENT from a sampler run of a demo model.")],
            outputs=[io.Image.Output()],
        )

    @classmethod
    def execute(cls, samples: dict) -> io.NodeOutput:
        latent = samples["samples"]
        if latent.ndim == 5:
            video = pixels.latent_to_video(latent)  # [B, T, H, W, 3]
            return io.NodeOutput(video.reshape(-1, *video.shape[2:]))
        return io.NodeOutput(pixels.latent_to_image(latent))


DEMO_NODES = [DemoModel, DemoPrompt, DemoLatent, DemoDecode]
