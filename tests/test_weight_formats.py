"""Weight formats people load: fp8 weights (UNETLoader's ``weight_dtype`` fp8_e4m3fn / fp8_e5m2,
computed through ComfyUI's manual cast) and bf16 / fp16 models, with both caches.

Each tiny model is built as UNETLoader builds a user's file in that format (``model_builder``
with the weight dtype and, where a GPU would cast fp8 weights to a half-precision compute dtype,
that compute dtype). Per format the cached run must skip, stay finite, stay as close to the
uncached run of the same format as the float32 model's cached run is to its own, and keep its
residuals in the compute dtype (half the memory of float32 in bf16 / fp16). A forecast's weighted
sum of half-precision residuals is done in float32 (``cache_core/history.py``): checked against a
float64 reference, and against what the same sum in the residuals' own dtype would lose.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

FAMILIES = ["flux", "wan21"]
# name -> (weight dtype, compute dtype; None: ComfyUI's choice for this device, as UNETLoader's).
FORMATS = {
    "fp8_e4m3fn": (torch.float8_e4m3fn, None),  # UNETLoader on this CPU: cast to float32
    "fp8_e4m3fn+bf16": (torch.float8_e4m3fn, torch.bfloat16),  # what a GPU with bf16 does
    "fp8_e5m2+fp16": (torch.float8_e5m2, torch.float16),
    "bf16": (torch.bfloat16, torch.bfloat16),
    "fp16": (torch.float16, torch.float16),
}
METHODS = {
    # Published constants chosen by name (tiny models are no published checkpoint), thresholds
    # that skip about half the steps of a 20-step run on these models.
    "magcache": dict(threshold=0.3),
    "teacache": dict(threshold=0.6),
}
STEPS = 20


def build(family: str, weight_format: str) -> Any:
    from harness.sampling import tiny

    weight_dtype, compute_dtype = FORMATS[weight_format] if weight_format != "fp32" else (torch.float32, None)
    t = tiny()
    return t.model_builder.build_from_template(t.FAMILIES[family].template, seed=0, dtype=weight_dtype,
                                               compute_dtype=compute_dtype)


def job(family: str) -> Any:
    from harness.sampling import Job

    return Job(family, steps=STEPS, frames=3 if family == "wan21" else None)


def compute_dtype_of(model: Any) -> torch.dtype:
    return model.model.manual_cast_dtype or model.model.get_dtype()


def spy_on_tail(patched: Any, runtime: Any) -> list[tuple[torch.dtype, list[torch.dtype]]]:
    """Wraps the pack's tail block hook: after each call of the tail, (dtype of the stream the
    tail returned, dtypes of every residual slot the run's cache holds)."""
    seen: list[tuple[torch.dtype, list[torch.dtype]]] = []
    dit = patched.model_options["transformer_options"]["patches_replace"]["dit"]
    (kind, index), pack_hook = next((key, hook) for key, hook in dit.items()
                                    if isinstance(hook, runtime.BlockHook) and hook.is_tail)

    def tail(args: dict, extra: dict) -> dict:
        out = pack_hook(args, extra)
        run = args["transformer_options"].get(runtime.RUN_KEY)
        if run is not None:
            stream = next(v for v in out.values() if isinstance(v, torch.Tensor))
            seen.append((stream.dtype, [t.dtype for k, _, t in run.cache.held_tensors() if k == "residual"]))
        return out

    tail.__wrapped__ = pack_hook  # it wraps the pack's hook, and says so: the run still caches
    patched.set_model_patch_replace(tail, "dit", kind, index)
    return seen


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref.float()).abs().mean() / ref.float().abs().mean())


@pytest.fixture(scope="module")
def fp32_errors(host) -> dict[tuple[str, str], float]:
    """Per family and method: the float32 model's cached run against its uncached run."""
    from harness.sampling import apply, published_variant

    errors = {}
    for family in FAMILIES:
        model = build(family, "fp32")
        ref = job(family).run(model)
        for method, inputs in METHODS.items():
            patched, _ = apply(model, method, variant=published_variant(model, method), **inputs)
            errors[family, method] = relative_error(job(family).run(patched), ref)
    return errors


@pytest.mark.parametrize("method", list(METHODS))
@pytest.mark.parametrize("weight_format", list(FORMATS))
@pytest.mark.parametrize("family", FAMILIES)
def test_a_weight_format_caches_in_its_compute_dtype(host, fp32_errors, family, weight_format, method):
    from harness.sampling import apply, pack, published_variant, stats

    runtime = pack("nodes.runtime")
    model = build(family, weight_format)
    weight_dtype, wanted_compute = FORMATS[weight_format]
    weights = [p.dtype for n, p in model.model.diffusion_model.named_parameters() if n.endswith("qkv.weight")
               or n.endswith("self_attn.q.weight")]
    assert weights and set(weights) == {weight_dtype}, "the model does not hold weights in this format"
    compute = compute_dtype_of(model)
    if wanted_compute is not None:
        assert compute == wanted_compute

    ref = job(family).run(model)
    patched, node_id = apply(model, method, variant=published_variant(model, method), **METHODS[method])
    seen = spy_on_tail(patched, runtime)
    out = job(family).run(patched)

    run_stats = stats(node_id)
    assert run_stats["disabled_reason"] is None
    assert run_stats["calls_skipped"] >= 5, run_stats["summary"]
    assert torch.isfinite(out).all()
    # As close to this format's uncached run as the float32 model's cached run is to its own (the
    # format's rounding may move it a little either way).
    error = relative_error(out, ref)
    assert error <= 1.25 * fp32_errors[family, method] + 0.01, (error, fp32_errors[family, method])
    # The stream and every residual slot are in the compute dtype: no float32 copies of a
    # half-precision model's residuals, no fp8 residuals from fp8 weights.
    assert seen, "the tail hook never ran inside a run"
    assert {stream for stream, _ in seen} == {compute}
    slot_dtypes = {d for _, slots in seen for d in slots}
    assert slot_dtypes == {compute}, slot_dtypes


@pytest.mark.parametrize("family", FAMILIES)
def test_a_forecast_caches_an_fp8_model_computed_in_bf16(host, family):
    from harness.sampling import apply, pack, published_variant, stats

    runtime = pack("nodes.runtime")
    forecast = dict(estimator="forecast", forecast_order=2, **METHODS["magcache"])
    errors = {}
    for weight_format in ("fp32", "fp8_e4m3fn+bf16"):
        model = build(family, weight_format)
        ref = job(family).run(model)
        patched, node_id = apply(model, "magcache", variant=published_variant(model), **forecast)
        seen = spy_on_tail(patched, runtime)
        out = job(family).run(patched)
        assert "MagCache + forecast (order 2)" in stats(node_id)["summary"]
        assert stats(node_id)["calls_skipped"] >= 5
        assert torch.isfinite(out).all()
        # Three residuals per CFG branch (order 2), each in the compute dtype.
        slots = max(seen, key=lambda s: len(s[1]))[1]
        assert len(slots) == 3 * 2 and set(slots) == {compute_dtype_of(model)}, slots
        errors[weight_format] = relative_error(out, ref)
    # The forecast does in bf16 what it does in float32: as close to its format's uncached run.
    assert errors["fp8_e4m3fn+bf16"] <= 1.25 * errors["fp32"] + 0.01, errors


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_forecasts_arithmetic_is_float32(host, dtype):
    """``history.estimate`` with forecast weights on half-precision residuals: every value is the
    float64 result rounded once to the output dtype (within half a unit in the last place, ties
    either way), where the same sum done in the residuals' dtype rounds at every term."""
    from harness.sampling import pack

    history = pack("cache_core.history")
    forecast = pack("cache_core.estimators.forecast")
    gen = torch.Generator().manual_seed(0)
    shape = (2, 256, 64)
    stack_input = (4 * torch.randn(shape, generator=gen)).to(dtype)
    base = torch.randn(shape, generator=gen)
    drift = 0.05 * torch.randn(shape, generator=gen)
    # Three residuals along a smooth path in model time, stored in the compute dtype.
    times = [0.30, 0.42, 0.50]
    residuals = [(base + drift * t * 10).to(dtype) for t in times]
    weights = forecast.ForecastEstimator(order=2).weights(times, 0.61)
    assert len(weights) == 3 and any(abs(w - round(w)) > 1e-3 for w in weights)

    exact = stack_input.double() + sum(w * r.double() for w, r in zip(weights, residuals, strict=True))
    # Half the spacing of the output dtype's values at each exact value, plus float32's own slack
    # (relative to the terms summed, which may cancel).
    magnitude = stack_input.double().abs() + sum(abs(w) * r.double().abs() for w, r in zip(weights, residuals,
                                                                                           strict=True))
    _, exponent = torch.frexp(exact)
    half_ulp = 0.5 * torch.finfo(dtype).eps * torch.exp2(exponent.double() - 1) + 1e-6 * magnitude

    def beyond_half_ulp(result: torch.Tensor) -> float:
        return float(((result.double() - exact).abs() > half_ulp).double().mean())

    out = history.estimate(stack_input, residuals, weights)
    assert out.dtype == dtype
    assert beyond_half_ulp(out) == 0.0
    in_dtype = stack_input + sum(torch.mul(r, w) for w, r in zip(weights, residuals, strict=True))
    assert beyond_half_ulp(in_dtype) > 0.05  # what the check would catch
