"""Compile Blocks (StepCache): torch.compile each transformer block, so the cache keeps working.

ComfyUI's TorchCompileModel compiles the whole diffusion model: one graph per call, so nothing
can decide between blocks, and the Apply nodes sample uncached beside it (nodes/runtime.py says
so). This node compiles each block of the stack on its own and swaps the compiled blocks in for
the duration of each model call, through the APPLY_MODEL wrapper under ComfyUI's own compile key
(what ``comfy_api.torch_helpers.set_torch_compile_wrapper(model, keys=[...])`` does): the code
between blocks, the pack's block hooks included, stays in Python, so a skipped step runs no
compiled code at all and a computed step runs the compiled blocks. The node records its wrapper
in the model's options; the cache accepts a compile wrapper only while it is that one.

Why not that helper itself: it hands every key the same ``options`` dict, and torch.compile pops
``guard_filter_fn`` out of it, so only the first block would get the filter. The filter leaves out
guards on ``transformer_options`` (as ComfyUI's TorchCompileModel does from 0.30.0): that dict
carries per-run tensors (the run's sigmas) that would otherwise recompile blocks for every new
step count.

Every block of a kind shares its class's code, so dynamo compiles it once per kind and input
shape (parameters are graph inputs); a second new shape makes the sizes dynamic (torch.compile's
automatic dynamic shapes), after which new sizes do not recompile.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import comfy.utils
import torch
from comfy.patcher_extension import WrappersMP
from comfy_api.latest import io

from .. import families
from .runtime import BLOCK_COMPILE_KEY, COMPILE_WRAPPER_KEY
from .types import CATEGORY
from .validation import Choice

LOGGER = logging.getLogger("stepcache")

BACKENDS = ["inductor", "cudagraphs"]  # TorchCompileModel's choices
COMPILE_KWARGS_KEY = "torch_compile_kwargs"  # comfy_api.torch_helpers.torch_compile.TORCH_COMPILE_KWARGS


@dataclass(frozen=True)
class BlockCompile:
    """What Compile Blocks put on a model: its APPLY_MODEL wrapper (a plain function, so clones
    that deep-copy model_options keep the same one) and the blocks it compiles."""

    wrapper: Callable[..., Any]
    keys: tuple[str, ...]
    backend: str


def without_transformer_options_guards(guard_entries: list[Any]) -> list[bool]:
    """torch.compile's ``guard_filter_fn``: keep every guard except those on transformer_options."""
    return ["transformer_options" not in entry.name for entry in guard_entries]


def swap_in_wrapper(compiled: dict[str, torch.nn.Module]) -> Callable[..., Any]:
    """APPLY_MODEL wrapper: the compiled modules stand in for the model's own during the call."""

    def apply_model_with_compiled_blocks(executor: Any, *args: Any, **kwargs: Any) -> Any:
        model = executor.class_obj
        originals = {}
        try:
            for key, module in compiled.items():
                originals[key] = comfy.utils.set_attr(model, key, module)
            return executor(*args, **kwargs)
        finally:
            for key, module in originals.items():
                comfy.utils.set_attr(model, key, module)

    return apply_model_with_compiled_blocks


def clone_for_compile(model: Any) -> Any:
    """A clone that is not a dynamic-VRAM patcher where ComfyUI has those (0.30.0: weights streamed
    and cast on the fly, which its own TorchCompileModel also avoids by cloning with
    ``disable_dynamic``); 0.3.75's clone has no such option and its patchers are never dynamic."""
    if "disable_dynamic" in inspect.signature(model.clone).parameters:
        return model.clone(disable_dynamic=True)
    return model.clone()


def compile_blocks(model: Any, backend: str = "inductor") -> Any:
    """A clone of ``model`` (a ModelPatcher) whose transformer blocks run compiled, one by one,
    while it samples. Raises ValueError for a model whose family has no block stack the pack hooks."""
    family = families.family_for(model.model)
    keys = family.block_module_keys(model.model.diffusion_model) if family is not None else []
    if not keys:
        name = type(model.model).__name__
        raise ValueError(
            f"Compile Blocks (StepCache): {name} is not a model whose transformer blocks this pack hooks "
            f"one by one, so there is nothing it can compile block by block; use ComfyUI's TorchCompileModel "
            f"(the cache then samples uncached beside it)")
    patched = clone_for_compile(model)
    if patched.get_wrappers(WrappersMP.APPLY_MODEL, COMPILE_WRAPPER_KEY):
        LOGGER.info("[StepCache] Compile Blocks replaces the model's whole-model torch.compile with one per block")
        patched.remove_wrappers_with_key(WrappersMP.APPLY_MODEL, COMPILE_WRAPPER_KEY)
    # A fresh options dict per block: torch.compile pops the filter out of the one it is given.
    compiled = {key: torch.compile(patched.get_model_object(key), backend=backend,
                                   options={"guard_filter_fn": without_transformer_options_guards})
                for key in keys}
    wrapper = swap_in_wrapper(compiled)
    patched.add_wrapper_with_key(WrappersMP.APPLY_MODEL, COMPILE_WRAPPER_KEY, wrapper)
    patched.model_options[COMPILE_KWARGS_KEY] = {"backend": backend, "keys": list(keys)}
    patched.model_options[BLOCK_COMPILE_KEY] = BlockCompile(wrapper, tuple(keys), backend)
    return patched


class CompileBlocks(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="StepCacheCompileBlocks",
            display_name="Compile Blocks (StepCache)",
            category=CATEGORY,
            description=(
                "torch.compile for a cached model: compiles each transformer block on its own (under ComfyUI's "
                "compile key, as its compile helper does for chosen keys) instead of the whole model, so Apply "
                "TeaCache / Apply MagCache keep skipping steps. Use it in place of TorchCompileModel, "
                "before or after the Apply node. The first run of each new resolution or batch compiles."
            ),
            inputs=[
                io.Model.Input("model", tooltip="A FLUX, Wan, HunyuanVideo, Qwen-Image, ... model (one the cache "
                               "hooks block by block)."),
                Choice("backend", options=BACKENDS, default="inductor",
                       tooltip="torch.compile backend, as in TorchCompileModel."),
            ],
            outputs=[io.Model.Output()],
        )

    @classmethod
    def execute(cls, model: Any, backend: str) -> io.NodeOutput:
        return io.NodeOutput(compile_blocks(model, backend))


COMPILE_NODES = [CompileBlocks]
