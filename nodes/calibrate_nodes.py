"""In-graph calibration: MagCacheCalibrate, TeaCacheCalibrate, and ratios/coefficients from text.

A calibrate node is a KSampler that measures: it runs the same sampling (ComfyUI's own
``common_ksampler``) with the cache hooks computing every step, outputs the LATENT, the
calibration (for ApplyMagCache's ``ratios`` / ApplyTeaCache's ``coefficients``) and a readable
STRING, and saves the calibration under ComfyUI's user directory, where the Apply nodes find it
again for the same model.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging

import comfy.samplers
import nodes as comfy_nodes
from comfy_api.latest import io

from .. import families
from ..cache_core import CalibrationRunConfig, MagCacheConfig, MethodConfig, TeaCacheConfig
from ..cache_core.calibration import (
    Calibration,
    CalibrationError,
    ResidualRecorder,
    ScheduleInfo,
    fit_teacache_polynomial,
)
from ..cache_core.ratios import MagRatios
from ..cache_core.stats import branch_name
from . import calibration_store
from .runtime import CacheSettings, install
from .types import CATEGORY, MagRatiosType, TeaCacheCoefficientsType
from .validation import Choice, check_related, finite_range

LOGGER = logging.getLogger("stepcache")


def sampling_inputs() -> list:
    """KSampler's own inputs, so a calibrate node drops in where the KSampler was."""
    return [
        io.Model.Input("model", tooltip="The model to calibrate (after any LoRA, before any cache node)."),
        io.Int.Input("seed", default=0, min=0, max=0xFFFFFFFFFFFFFFFF, control_after_generate=True,
                     tooltip="Noise seed, as in KSampler."),
        io.Int.Input("steps", default=30, min=2, max=10000,
                     tooltip="Calibrate at the step count you sample with (ratios are resampled to other counts)."),
        io.Float.Input("cfg", default=4.0, **finite_range(0.0, 100.0), step=0.1, round=0.01,
                       tooltip="Classifier-free guidance, as in KSampler; above 1 both CFG branches are measured."),
        Choice("sampler_name", options=comfy.samplers.KSampler.SAMPLERS, default="euler",
               tooltip="Sampler, as in KSampler; the one you will sample with."),
        Choice("scheduler", options=comfy.samplers.KSampler.SCHEDULERS, default="simple",
               tooltip="Scheduler, as in KSampler; the one you will sample with."),
        io.Conditioning.Input("positive", tooltip="Positive conditioning, as in KSampler."),
        io.Conditioning.Input("negative", tooltip="Negative conditioning, as in KSampler."),
        io.Latent.Input("latent_image", tooltip="A batch of several latents gives averaged, steadier measurements."),
        io.Float.Input("denoise", default=1.0, **finite_range(0.0, 1.0), step=0.01,
                       tooltip="As in KSampler; calibrate a full denoise (1.0) unless you only ever sample "
                       "partial ones."),
        io.Boolean.Input("save_calibration", default=True,
                         tooltip="Save under ComfyUI's user directory; the Apply node then finds it for this model."),
    ]


def detect_variant(family: families.Family, model: object, positive: list, negative: list,
                   latent_image: dict, steps: int) -> str:
    context = families.RunContext(
        conds={"positive": [c[1] for c in positive], "negative": [c[1] for c in negative]},
        latent_shape=tuple(latent_image["samples"].shape), steps=steps,
        has_denoise_mask=latent_image.get("noise_mask") is not None,
    )
    return family.resolve_variant(model.model, context).name


def run_calibration(node: str, method: type[MethodConfig], model: object, seed: int, steps: int, cfg: float,
                    sampler_name: str, scheduler: str, positive: list, negative: list, latent_image: dict,
                    denoise: float, node_id: str | None = None) -> tuple[dict, Calibration]:
    """Sample once with every step computed and measured; returns the LATENT and the calibration
    of ``method`` (a MethodConfig class with a calibration, e.g. MagCacheConfig).

    The run reports its statistics under ``node_id`` (the calibrate node's), like an Apply node's."""
    family = families.family_for(model.model)
    if family is None:
        raise ValueError(f"{node}: {families.unsupported_reason(model.model)}; there is nothing to calibrate")
    recorder = ResidualRecorder(channels_last=not family.caches_in_output_space, cfg=cfg)
    settings = CacheSettings(method=CalibrationRunConfig(), family=family.name, node_id=node_id)
    measuring = install(model, settings, family, observer=recorder)
    (latent,) = comfy_nodes.common_ksampler(measuring, seed, steps, cfg, sampler_name, scheduler, positive,
                                            negative, latent_image, denoise=denoise)
    if recorder.schedule is None:
        raise ValueError(f"{node}: the sampler never ran the model, so nothing was measured")
    recorder.finish()
    variant = detect_variant(family, model, positive, negative, latent_image, steps)
    records = tuple(recorder.records)
    schedule = ScheduleInfo(
        steps=recorder.schedule.steps, sampler=sampler_name, scheduler=scheduler, denoise=denoise,
        progress=recorder.schedule.progress[:-1],
    )
    identity = calibration_store.model_identity(model, family, variant)
    created = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    try:
        calibration = Calibration(method=method.calibration_method, model=identity, schedule=schedule,
                                  records=records, created=created, skip_errors=tuple(recorder.skip_errors),
                                  cfg=cfg, moments=recorder.moments(), **method.fitted(records))
        method.check_calibration(calibration)
    except CalibrationError as error:
        raise ValueError(f"{node}: the measurement cannot be used: {error}") from error
    return latent, calibration


def node_id_of(node: type[io.ComfyNode]) -> str | None:
    """The id of the graph node running; None when called as a library, outside ComfyUI's executor."""
    return node.hidden.unique_id if node.hidden is not None else None


def finish(node: str, calibration: Calibration, save_calibration: bool) -> tuple[str, dict]:
    """The report text, and the node's UI output (shown by web/stepcache.js)."""
    text = calibration.summary()
    if save_calibration:
        path = calibration_store.save(calibration)
        text += f"\nsaved to {path}"
        LOGGER.info("[StepCache] %s: saved %s", node, path)
    series = [{"branch": branch_name(b), "ratios": calibration.per_step(b, "magnitude_ratio", 1.0)}
              for b in calibration.branches]
    return text, {"text": [text], "stepcache_ratios": series}


class MagCacheCalibrate(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="MagCacheCalibrate",
            display_name="MagCache Calibrate",
            category=CATEGORY,
            description=(
                "A KSampler that measures: it samples normally while recording, per step and CFG branch, "
                "how the block stack's residual magnitude changes. Connect 'ratios' to ApplyMagCache, or "
                "just keep save_calibration on: ApplyMagCache then uses it for this model automatically."
            ),
            inputs=sampling_inputs(),
            outputs=[io.Latent.Output("LATENT"), MagRatiosType.Output("ratios"), io.String.Output("report")],
            hidden=[io.Hidden.unique_id],
        )

    @classmethod
    def execute(cls, model: object, seed: int, steps: int, cfg: float, sampler_name: str, scheduler: str,
                positive: list, negative: list, latent_image: dict, denoise: float,
                save_calibration: bool) -> io.NodeOutput:
        latent, calibration = run_calibration("MagCacheCalibrate", MagCacheConfig, model, seed, steps, cfg,
                                              sampler_name, scheduler, positive, negative, latent_image, denoise,
                                              node_id_of(cls))
        report, ui = finish("MagCacheCalibrate", calibration, save_calibration)
        return io.NodeOutput(latent, calibration, report, ui=ui)


class TeaCacheCalibrate(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="TeaCacheCalibrate",
            display_name="TeaCache Calibrate",
            category=CATEGORY,
            description=(
                "A KSampler that measures: it records, per step, the change of the first block's modulated "
                "input against the change of the block stack's residual, and fits TeaCache's degree-4 "
                "rescaling polynomial. Chain several (add_to) to fit over more runs."
            ),
            inputs=[
                *sampling_inputs(),
                TeaCacheCoefficientsType.Input(
                    "add_to", optional=True,
                    tooltip="An earlier TeaCacheCalibrate of the same model: fit over both runs' measurements."),
            ],
            outputs=[io.Latent.Output("LATENT"), TeaCacheCoefficientsType.Output("coefficients"),
                     io.String.Output("report")],
            hidden=[io.Hidden.unique_id],
        )

    @classmethod
    def execute(cls, model: object, seed: int, steps: int, cfg: float, sampler_name: str, scheduler: str,
                positive: list, negative: list, latent_image: dict, denoise: float, save_calibration: bool,
                add_to: Calibration | None = None) -> io.NodeOutput:
        latent, calibration = run_calibration("TeaCacheCalibrate", TeaCacheConfig, model, seed, steps, cfg,
                                              sampler_name, scheduler, positive, negative, latent_image, denoise,
                                              node_id_of(cls))
        if add_to is not None:
            calibration = merge("TeaCacheCalibrate", add_to, calibration)
        report, ui = finish("TeaCacheCalibrate", calibration, save_calibration)
        return io.NodeOutput(latent, calibration, report, ui=ui)


def merge(node: str, earlier: Calibration, latest: Calibration) -> Calibration:
    """Refit over the points of both (the latest run's schedule and measures are kept)."""
    if not isinstance(earlier, Calibration) or earlier.method != "teacache":
        raise ValueError(f"{node}: add_to must come from another TeaCacheCalibrate")
    mismatch = earlier.model.mismatch(latest.model)
    if mismatch:
        raise ValueError(f"{node}: cannot add to that calibration: {mismatch}")
    points = earlier.fit_points + latest.fit_points
    return dataclasses.replace(latest, coefficients=fit_teacache_polynomial(points), fit_points=points,
                               runs=earlier.runs + latest.runs)


def parse_numbers(text: str) -> list[float]:
    cleaned = text.replace("[", " ").replace("]", " ").replace(",", " ").split()
    if not cleaned:
        raise ValueError("the list is empty")
    try:
        values = [float(v) for v in cleaned]
    except ValueError as error:
        raise ValueError(f"not a list of numbers ({error})") from error
    return values


def ratios_from_text(ratios: str, calibrated_steps: int, interleaved: bool) -> MagRatios:
    values = parse_numbers(ratios)
    per_branch = len(values) // 2 if interleaved else len(values)
    steps = calibrated_steps or per_branch
    if interleaved and len(values) % 2:
        raise ValueError(f"an interleaved (cond, uncond) list needs an even length, got {len(values)} values")
    return MagRatios.from_table(values, steps, interleaved, source="ratios entered as text")


def ratio_text_problem(text: str, calibrated_steps: int, interleaved: bool) -> str | None:
    try:
        ratios_from_text(text, calibrated_steps, interleaved)
    except ValueError as error:
        return f"ratios: {error}"
    return None


class MagCacheRatiosFromText(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="MagCacheRatiosFromText",
            display_name="MagCache Ratios (text)",
            category=CATEGORY,
            description="A published mag_ratios list, pasted as text, for ApplyMagCache's ratios input.",
            inputs=[
                io.String.Input("text", multiline=True, default="",
                                tooltip="Comma- or space-separated ratios, one per step (or per call, interleaved)."),
                io.Int.Input("calibrated_steps", default=0, min=0, max=10000,
                             tooltip="The step count the list was measured at; 0 = one entry per step."),
                io.Boolean.Input("interleaved", default=False,
                                 tooltip="The list alternates cond, uncond entries (CFG models in MagCache's code)."),
            ],
            outputs=[MagRatiosType.Output("ratios")],
        )

    @classmethod
    def validate_inputs(cls, text: str, calibrated_steps: int, interleaved: bool) -> bool | str:
        # The three together make the table: ComfyUI lists the answer under each of them.
        return check_related(cls, ratio_text_problem, text=text, calibrated_steps=calibrated_steps,
                             interleaved=interleaved)

    @classmethod
    def execute(cls, text: str, calibrated_steps: int, interleaved: bool) -> io.NodeOutput:
        return io.NodeOutput(ratios_from_text(text, calibrated_steps, interleaved))


def coefficients_from_text(coefficients: str) -> tuple[float, ...]:
    values = parse_numbers(coefficients)
    if len(values) < 2:
        raise ValueError("a polynomial needs at least 2 coefficients")
    if any(v != v or v in (float("inf"), float("-inf")) for v in values):
        raise ValueError("coefficients must be finite")
    return tuple(values)


def coefficient_text_problem(text: str) -> str | None:
    try:
        coefficients_from_text(text)
    except ValueError as error:
        return f"coefficients: {error}"
    return None


class TeaCacheCoefficientsFromText(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="TeaCacheCoefficientsFromText",
            display_name="TeaCache Coefficients (text)",
            category=CATEGORY,
            description="A TeaCache rescaling polynomial (numpy poly1d order, highest power first) as text.",
            inputs=[io.String.Input("text", multiline=False, default="",
                                    tooltip="Comma- or space-separated coefficients, highest power first.")],
            outputs=[TeaCacheCoefficientsType.Output("coefficients")],
        )

    @classmethod
    def validate_inputs(cls, text: str) -> bool | str:
        return check_related(cls, coefficient_text_problem, text=text)

    @classmethod
    def execute(cls, text: str) -> io.NodeOutput:
        return io.NodeOutput(coefficients_from_text(text))


CALIBRATION_NODES = [MagCacheCalibrate, TeaCacheCalibrate, MagCacheRatiosFromText, TeaCacheCoefficientsFromText]
