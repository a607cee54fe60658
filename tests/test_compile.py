"""torch.compile and the cache together: Compile Blocks (StepCache) compiles each transformer block.

The inductor tests compile for real on this machine's CPU (a C compiler is all inductor needs).
Compiles are counted as dynamo's converted frames (``torch._dynamo.utils.counters``), per model
call of a run, so a compile is seen in the call that caused it.

The tiny models here attend through ComfyUI's PyTorch attention (``optimized_attention_override``,
ComfyUI's public patch point): on a CPU ComfyUI otherwise picks its sub-quadratic attention,
which asks for the free memory inside the block, so dynamo breaks the graph there and guards on
that number; it recompiles whenever the machine's free memory changes, cache or not. A GPU gets
PyTorch attention anyway.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

STEPS = 20
MAGCACHE = dict(threshold=0.3)  # published table chosen by name; skips about half of 20 steps here


def pytorch_attention(func: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
    import comfy.ldm.modules.attention

    return comfy.ldm.modules.attention.attention_pytorch(*args, **kwargs)


def compiles() -> int:
    from torch._dynamo.utils import counters

    return counters["frames"]["total"]


@dataclass
class CompileSpy:
    """A model_function_wrapper: for every model call, whether the cache skipped it and how many
    frames dynamo compiled during it. Shared by clones (ComfyUI deep-copies model_options)."""

    calls: list[tuple[bool, int]] = field(default_factory=list)

    def __deepcopy__(self, memo: dict) -> CompileSpy:
        return self

    def __call__(self, apply_model: Any, params: dict) -> torch.Tensor:
        run = params["c"]["transformer_options"].get("stepcache_run")
        skipped_before = run.cache.calls_skipped if run is not None else 0
        compiled_before = compiles()
        out = apply_model(params["input"], params["timestep"], **params["c"])
        skipped = run is not None and run.cache.calls_skipped > skipped_before
        self.calls.append((skipped, compiles() - compiled_before))
        return out

    def take(self) -> list[tuple[bool, int]]:
        calls, self.calls = self.calls, []
        return calls


def tiny_model(family: str) -> Any:
    from harness.sampling import tiny

    model = tiny().build_model(family, seed=0)
    model.model_options["transformer_options"]["optimized_attention_override"] = pytorch_attention
    return model


def job(family: str, **changes: Any) -> Any:
    from harness.sampling import Job

    return Job(family, steps=changes.pop("steps", STEPS), frames=3 if family == "wan21" else None, **changes)


def compile_node(model: Any, backend: str = "inductor") -> Any:
    """Compile Blocks (StepCache) as ComfyUI runs it."""
    from harness.sampling import execute_node, pack

    return execute_node(pack("nodes.compile_nodes").CompileBlocks, model=model, backend=backend)[0]


@pytest.fixture(autouse=True, scope="module")
def fresh_dynamo(host):
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def cached_pair(family: str, method: str = "magcache", **inputs: Any) -> tuple[Any, Any, str]:
    """(uncompiled cached model, the same with Compile Blocks after it, node id)."""
    from harness.sampling import apply, published_variant

    model = tiny_model(family)
    patched, node_id = apply(model, method, variant=published_variant(model, method), **inputs)
    return patched, compile_node(patched), node_id


def test_compiled_blocks_cache_as_uncompiled_and_compile_once_per_shape(host):
    from harness.sampling import apply, patterns, published_variant, stats

    patched, compiled, node_id = cached_pair("flux", **MAGCACHE)
    spy = CompileSpy()
    compiled.set_model_unet_function_wrapper(spy)

    def run(model: Any, **changes: Any) -> tuple[torch.Tensor, dict, list[tuple[bool, int]]]:
        out = job("flux", **changes).run(model)
        return out, stats(node_id), spy.take()

    reference, reference_stats, _ = run(patched)
    reference_patterns = patterns(node_id)
    out, run_stats, calls = run(compiled)
    assert run_stats["disabled_reason"] is None
    assert patterns(node_id) == reference_patterns and run_stats["calls_skipped"] == reference_stats["calls_skipped"]
    assert run_stats["calls_skipped"] >= 5
    torch.testing.assert_close(out, reference, rtol=1e-4, atol=1e-4)
    # The first call computes and compiles each block class (double, single) once; no later call
    # compiles, skipped or computed.
    first_compiles = calls[0][1]
    assert not calls[0][0] and first_compiles == 2, calls
    assert [c for _, c in calls[1:]] == [0] * (len(calls) - 1), calls
    assert sum(skipped for skipped, _ in calls) == run_stats["calls_skipped"]

    # Nothing of a run's cache reaches a compiled graph: the same run, other step counts and the
    # other method compile nothing.
    for changes in ({}, {"steps": 30}, {"steps": 12}):
        out, run_stats, calls = run(compiled, **changes)
        assert run_stats["calls_skipped"] >= 3 and sum(c for _, c in calls) == 0, (changes, calls)
    teacache, tea_id = apply(tiny_model("flux"), "teacache", variant=published_variant(patched, "teacache"),
                             threshold=0.6)
    tea_reference = job("flux").run(teacache)
    tea_out = job("flux").run(compile_node(teacache))
    assert stats(tea_id)["calls_skipped"] >= 5
    torch.testing.assert_close(tea_out, tea_reference, rtol=1e-4, atol=1e-4)

    # A new batch or resolution compiles again in its first call, once per block class; the next
    # new size of the same dimension finds dynamic shapes and compiles nothing.
    for changes, expected in (({"batch": 2}, first_compiles), ({"scale": 2}, first_compiles),
                              ({"scale": 3}, 0), ({"batch": 3}, 0)):
        out, run_stats, calls = run(compiled, **changes)
        assert run_stats["disabled_reason"] is None and run_stats["calls_skipped"] >= 5
        assert torch.isfinite(out).all()
        assert calls[0][1] == expected and sum(c for _, c in calls[1:]) == 0, (changes, calls)


def test_compiled_wan_blocks_cache_as_uncompiled(host):
    from harness.sampling import patterns, stats

    patched, compiled, node_id = cached_pair("wan21", **MAGCACHE)
    spy = CompileSpy()
    compiled.set_model_unet_function_wrapper(spy)
    reference = job("wan21").run(patched)
    reference_patterns = patterns(node_id)
    out = job("wan21").run(compiled)
    assert stats(node_id)["disabled_reason"] is None and stats(node_id)["calls_skipped"] >= 5
    assert patterns(node_id) == reference_patterns
    torch.testing.assert_close(out, reference, rtol=1e-4, atol=1e-4)
    calls = spy.take()
    # Wan's first block sees a strided view of the patch embedding, the others a contiguous
    # stream: one class, two layouts, both compiled in the first call; nothing after it.
    assert calls[0][1] >= 1 and sum(c for _, c in calls[1:]) == 0, calls
    job("wan21").run(compiled)
    assert sum(c for _, c in spy.take()) == 0


def test_every_block_family_caches_the_same_with_compiled_blocks(host, block_family):
    """Dynamo captures every hooked family's blocks (backend eager: dynamo's capture and guards
    without inductor's code generation, which the tests above cover)."""
    from harness.sampling import Job, apply, pack, patterns, stats

    model = tiny_model(block_family)
    family = pack("families").family_for(model.model)
    keys = family.block_module_keys(model.model.diffusion_model)
    modules = [model.get_model_object(key) for key in keys]
    assert len(keys) == len(family.block_keys(model.model.diffusion_model)) == len({id(m) for m in modules})
    assert all(isinstance(m, torch.nn.Module) for m in modules)

    forced = dict(threshold=5.0, max_consecutive_skips=3, retention_ratio=0.0,
                  ratios=pack("families.published_magcache").FLUX_DEV)
    patched, node_id = apply(model, "magcache", **forced)
    run = Job(block_family, steps=12)
    reference = run.run(patched)
    reference_patterns = patterns(node_id)
    torch._dynamo.reset()  # families share block classes (and so dynamo's compiled code): start afresh
    before = compiles()
    out = run.run(compile_node(patched, backend="eager"))
    assert compiles() > before, "no block was compiled"
    assert stats(node_id)["disabled_reason"] is None and stats(node_id)["calls_skipped"] > 0
    assert patterns(node_id) == reference_patterns
    torch.testing.assert_close(out, reference, rtol=1e-4, atol=1e-4)


def test_a_whole_model_compile_is_refused_with_the_fix_named(host):
    from comfy.patcher_extension import WrappersMP
    from comfy_api.torch_helpers import set_torch_compile_wrapper

    from harness.sampling import Job, apply, pack, published_variant, stats

    patched, blocks, node_id = cached_pair("flux", **MAGCACHE)
    whole = patched.clone()
    set_torch_compile_wrapper(whole, backend="eager")  # what TorchCompileModel does
    Job("flux", steps=STEPS).run(whole)
    reason = stats(node_id)["disabled_reason"]
    assert "whole model" in reason and "Compile Blocks (StepCache)" in reason
    assert stats(node_id)["calls_skipped"] == 0

    # TorchCompileModel after Compile Blocks replaces its wrapper: refused again.
    after = blocks.clone()
    set_torch_compile_wrapper(after, backend="eager")
    Job("flux", steps=STEPS).run(after)
    assert "Compile Blocks (StepCache)" in stats(node_id)["disabled_reason"]

    # Compile Blocks before the Apply node: the cache runs.
    first = compile_node(tiny_model("flux"), backend="eager")
    cached_after, after_id = apply(first, "magcache", variant=published_variant(first), **MAGCACHE)
    Job("flux", steps=STEPS).run(cached_after)
    assert stats(after_id)["disabled_reason"] is None and stats(after_id)["calls_skipped"] >= 5

    # Compile Blocks after TorchCompileModel re-keys the compile to the blocks: the cache runs.
    rekeyed = pack("nodes.compile_nodes").compile_blocks(whole, backend="eager")
    runtime = pack("nodes.runtime")
    assert len(rekeyed.get_wrappers(WrappersMP.APPLY_MODEL, runtime.COMPILE_WRAPPER_KEY)) == 1
    Job("flux", steps=STEPS).run(rekeyed)
    assert stats(node_id)["disabled_reason"] is None and stats(node_id)["calls_skipped"] >= 5


def test_compile_blocks_refuses_a_model_without_hooked_blocks(host):
    from harness.sampling import tiny

    for model in (tiny().build_model("lumina2", seed=0), tiny().build_sd15_unet()):
        with pytest.raises(ValueError, match="nothing it can compile block by block"):
            compile_node(model)
