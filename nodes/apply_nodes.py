"""ApplyTeaCache and ApplyMagCache: MODEL in, MODEL out (ComfyUI V3 node schema).

Each builds its method's settings object (cache_core.methods) and installs it; the inputs both
share (estimator, separate CFG branches, check) come last and are optional, so saved workflows from
before they existed still load. ApplyMagCache's defaults for them are the damped forecast with the
hindsight check at tolerance 0.06 (docs/experiments.md section 11: the worst case stays >= 30 dB on
both reference models and both samplers, where reuse without a check fell to 22.8-27.0 dB);
ApplyTeaCache keeps reuse without a check, which did better at its published threshold.
"""

from __future__ import annotations

import dataclasses
import logging

from comfy_api.latest import io

from .. import families
from ..cache_core import EstimatorSpec, MagCacheConfig, MagRatios, MethodConfig, TeaCacheConfig
from ..cache_core.calibration import Calibration
from ..cache_core.estimators import MAX_ORDER
from ..cache_core.methods import SKIP_RULES
from . import calibration_store
from .runtime import CacheSettings, install
from .types import CATEGORY, MagRatiosType, TeaCacheCoefficientsType
from .validation import Choice, check_related, finite_range

LOGGER = logging.getLogger("stepcache")

CACHE_DEVICE_TOOLTIP = (
    "Where cached residuals live between steps. main_device: beside the model (fastest). "
    "offload_device: in system memory, copied over when used; for when accelerator memory is short."
)
VARIANT_TOOLTIP = (
    "Which published constants to use. auto uses them only where the loaded model has the architecture "
    "they were measured on (telling e.g. Kontext from dev by the run); pick one for checkpoints that "
    "share an architecture (Wan 2.2 A14B vs Wan 2.1 14B) or to use a checkpoint's constants for its fine-tune."
)


ESTIMATOR_OPTIONS = ["reuse", "forecast", "damped_forecast"]
CFG_BRANCH_OPTIONS = ["together", "separate"]
CHECK_OPTIONS = ["off", "hindsight", "first_block"]

# Each node's defaults for the shared estimator and check inputs (schema and execute alike).
TEACACHE_ESTIMATOR, TEACACHE_CHECK = "reuse", "off"
MAGCACHE_ESTIMATOR, MAGCACHE_CHECK = "damped_forecast", "hindsight"
CHECK_TOLERANCE = 0.06
DEFAULTS_NOTE = (
    f" Apply MagCache's defaults are {MAGCACHE_ESTIMATOR} with the {MAGCACHE_CHECK} check at tolerance "
    f"{CHECK_TOLERANCE:g} (before: reuse, off): on the pack's reference models they keep the worst image at "
    ">= 30 dB where the old ones did not. Set reuse and off for the published method."
)


def estimator_inputs(estimator: str, check: str) -> list:
    """The optional inputs both Apply nodes share, after their own, with this node's defaults for
    ``estimator`` and ``check``."""
    return [
        Choice(
            "estimator", options=ESTIMATOR_OPTIONS, default=estimator, optional=True,
            tooltip="What a skipped step uses in place of the block stack's output. reuse: the last computed "
            "step's residual (the published methods). forecast: extrapolates the residual in model time "
            "through the last computed steps (keeps forecast_order + 1 residuals per CFG branch). "
            "damped_forecast: a first-order forecast that leans back towards reuse as a run of skipped "
            "steps grows (keeps 2). The skip rule's error estimate follows the choice. "
            f"Default here: {estimator}." + DEFAULTS_NOTE,
        ),
        io.Int.Input("forecast_order", default=1, min=1, max=MAX_ORDER, optional=True,
                     tooltip="estimator forecast: 1 continues a straight line through the last two computed "
                     "steps, 2 a parabola through the last three (one more residual kept per CFG branch). "
                     "damped_forecast is always first order."),
        io.Float.Input("forecast_damping", default=0.5, **finite_range(0.0, 1.0), step=0.05, optional=True,
                       tooltip="estimator damped_forecast: how fast the forecast's step shrinks as the gap "
                       "grows. 0 is the plain first-order forecast, 1 is reuse."),
        Choice(
            "cfg_branches", options=CFG_BRANCH_OPTIONS, default="together", optional=True,
            tooltip="together: cond and uncond (batched by ComfyUI) skip only when both may. separate: when "
            "one may skip and the other must compute, they run as separate calls and only the one that "
            "must computes (TeaCache: every step, as each branch decides from its own signal). The guidance "
            "scale multiplies the error of a branch skipped alone, so at high cfg this can cost more than "
            "it saves.",
        ),
        Choice(
            "check", options=CHECK_OPTIONS, default=check, optional=True,
            tooltip="A check against real computation that can refuse a skip the rule allows. hindsight: "
            "every computed step measures what the estimator would have got wrong there (free); a branch "
            "skips only while that error, scaled to the gap the skip bridges, is at most check_tolerance. "
            "first_block: a step the rule would "
            "skip first runs the first block and compares its output with the estimator's forecast of it; "
            "it skips only if they agree within check_tolerance (costs one block per skipped step; not "
            "available where a model family has no block hooks). "
            f"Default here: {check}." + DEFAULTS_NOTE,
        ),
        io.Float.Input("check_tolerance", default=CHECK_TOLERANCE, **finite_range(0.0, 10.0), step=0.005,
                       optional=True,
                       tooltip="check: the largest relative error (mean absolute error over mean absolute "
                       "value of the residual) at which a skip goes ahead. Lower is more faithful and slower. "
                       f"Default {CHECK_TOLERANCE:g} (before: 0.1); if the run's statistics show most skips "
                       "refused on your model, raise it."),
    ]


def shared_settings(estimator: str, forecast_order: int, forecast_damping: float, cfg_branches: str,
                    check: str, check_tolerance: float) -> dict:
    """MethodConfig fields from the shared inputs."""
    return {
        "estimator": EstimatorSpec(estimator, order=forecast_order, damping=forecast_damping),
        "separate_branches": cfg_branches == "separate",
        "check": None if check == "off" else check,
        "check_tolerance": check_tolerance,
    }


LEGACY_VARIANT_NOTE = (
    " The last names of the list are older options kept so that saved workflows load; each runs as the "
    "variant whose constants it used, and the log names it."
)


def variant_options(kind: str) -> list[str]:
    """auto, the variants with published constants for ``kind``, then the legacy names saved
    workflows may hold (so that they still validate; see ``chosen_variant``)."""
    names = ["auto"]
    for family in families.FAMILIES:
        names += [v.name for v in family.variants if getattr(v, kind) is not None]
    for family in families.FAMILIES:
        names += [old for old in family.legacy_variants.get(kind, {}) if old not in names]
    return names


def resolve_family(model: object, node: str) -> families.Family | None:
    family = families.family_for(model.model)
    if family is None:
        LOGGER.warning("[StepCache] %s: %s; the model passes through uncached",
                       node, families.unsupported_reason(model.model))
    return family


def check_variant(family: families.Family, variant: str, node: str) -> None:
    if variant != "auto" and variant not in family.variant_names:
        raise ValueError(
            f"{node}: variant '{variant}' is not a {family.name} model (this model's variants: "
            f"{', '.join(family.variant_names)}); choose one of those or auto"
        )


def chosen_variant(family: families.Family, variant: str, method: str, node: str) -> str:
    """The variant to run with: a legacy option (one a saved workflow may hold) becomes the variant
    whose published constants it used, with a warning naming it; any other is checked as it is."""
    replacement = family.legacy_variants.get(method, {}).get(variant)
    if replacement is None:
        check_variant(family, variant, node)
        return variant
    LOGGER.warning("[StepCache] %s: variant '%s' is a legacy option; using '%s', whose published %s it used "
                   "(choose '%s' to silence this)", node, variant, replacement,
                   families.METHOD_CONSTANTS[method], replacement)
    return replacement


def calibration_for(config: MethodConfig, node: str, model: object, family: families.Family, given: object | None,
                    variant: str = "auto") -> tuple[Calibration | None, str | None]:
    """The calibration to use: the one connected (checked against this model), else a saved one
    unless published constants were chosen by name; and what to call it in the statistics."""
    if given is not None and not isinstance(given, Calibration):
        return None, None  # a plain table or polynomial, not tied to a model
    method = config.calibration_method
    identity = calibration_store.model_identity(model, family, "auto")
    if given is not None:
        if given.method != method:
            raise ValueError(f"{node}: that is a {given.method} calibration; connect a {method} one")
        mismatch = given.model.mismatch(identity)
        if mismatch:
            raise ValueError(f"{node}: this calibration cannot be used here: {mismatch}. "
                             f"Calibrate this model ({config.calibrate_node}).")
        return given, f"this model's calibration of {given.created}"
    saved = calibration_store.find(method, identity) if variant == "auto" else None
    if saved is None:
        return None, None
    LOGGER.info("[StepCache] %s: using this model's saved calibration of %s (%d steps)",
                node, saved.created, saved.schedule.steps)
    return saved, f"this model's saved calibration of {saved.created}"


def window_problem(start_percent: float, end_percent: float) -> str | None:
    if not start_percent < end_percent:
        return f"start_percent ({start_percent}) must be below end_percent ({end_percent})"
    return None


def check_planned(config: MagCacheConfig, calibration: Calibration | None) -> None:
    """The planned rule runs on this model's measured skip errors, for the estimators it can plan."""
    if calibration is None:
        raise ValueError("ApplyMagCache: skip_rule planned needs this model's calibration: connect "
                         "MagCacheCalibrate's ratios output (or save one with it), or use skip_rule magnitude")
    if config.error_models is None:
        raise ValueError(f"ApplyMagCache: the calibration of {calibration.created} has no skip errors (it was "
                         "made by an older version of this pack); calibrate again for skip_rule planned")
    if config.estimator.name == "forecast" and config.estimator.order != 1:
        raise ValueError("ApplyMagCache: skip_rule planned plans first-order forecasts; set forecast_order to 1")


class ApplyTeaCache(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="ApplyTeaCache",
            display_name="Apply TeaCache",
            category=CATEGORY,
            description=(
                "Skips the transformer block stack on steps where the first block's modulated input "
                "changed little since the last computed step, reusing that step's residual. The "
                "model family and its published coefficients are detected from the model."
            ),
            inputs=[
                io.Model.Input("model", tooltip="The diffusion model to cache (place after LoRAs, before the sampler)."),
                io.Float.Input(
                    "threshold", default=0.4, **finite_range(0.0, 10.0), step=0.01,
                    tooltip="Accumulated (rescaled) change below which a step is skipped. 0 never skips. "
                    "Published settings: FLUX 0.4 (about 1.8x) to 0.8 (2.25x); Wan 2.1 and others need "
                    "far smaller values (0.05-0.2). Higher is faster and less faithful.",
                ),
                io.Float.Input("start_percent", default=0.0, **finite_range(0.0, 1.0), step=0.01,
                               tooltip="Skipping starts at this point of the denoising (model time)."),
                io.Float.Input("end_percent", default=1.0, **finite_range(0.0, 1.0), step=0.01,
                               tooltip="Skipping stops at this point of the denoising (model time)."),
                io.Int.Input("max_consecutive_skips", default=3, min=1, max=100,
                             tooltip="At most this many steps in a row reuse the cache."),
                Choice("cache_device", options=["main_device", "offload_device"],
                       default="main_device", tooltip=CACHE_DEVICE_TOOLTIP),
                Choice("variant", options=variant_options("teacache"), default="auto",
                       tooltip=VARIANT_TOOLTIP + LEGACY_VARIANT_NOTE, optional=True),
                TeaCacheCoefficientsType.Input(
                    "coefficients", optional=True,
                    tooltip="A polynomial from TeaCacheCalibrate (or typed in); overrides the published one. "
                    "Without it, a calibration saved for this model is used when there is one."),
                *estimator_inputs(TEACACHE_ESTIMATOR, TEACACHE_CHECK),
            ],
            outputs=[io.Model.Output()],
            hidden=[io.Hidden.unique_id],
            # The node id is baked into the patched model (for its statistics), so ComfyUI must not
            # hand this node's cached output to another node with equal inputs: ComfyUI 0.3.75 puts
            # the unique id of V3 nodes into the cache key only for not-idempotent ones.
            not_idempotent=True,
        )

    @classmethod
    def validate_inputs(cls, start_percent: float, end_percent: float) -> bool | str:
        # Only the window's two inputs: ComfyUI lists the answer under each input taken here.
        return check_related(cls, window_problem, start_percent=start_percent, end_percent=end_percent)

    @classmethod
    def execute(cls, model: object, threshold: float, start_percent: float, end_percent: float,
                max_consecutive_skips: int, cache_device: str, variant: str = "auto",
                coefficients: Calibration | tuple[float, ...] | None = None, estimator: str = TEACACHE_ESTIMATOR,
                forecast_order: int = 1, forecast_damping: float = 0.5, cfg_branches: str = "together",
                check: str = TEACACHE_CHECK, check_tolerance: float = CHECK_TOLERANCE) -> io.NodeOutput:
        problem = window_problem(start_percent, end_percent)  # linked values are only known now
        if problem is not None:
            raise ValueError(f"ApplyTeaCache: {problem}")
        family = resolve_family(model, "ApplyTeaCache")
        if family is None:
            return io.NodeOutput(model)
        variant = chosen_variant(family, variant, "teacache", "ApplyTeaCache")
        config = TeaCacheConfig(
            threshold=threshold, max_consecutive_skips=max_consecutive_skips, start_percent=start_percent,
            end_percent=end_percent,
            **shared_settings(estimator, forecast_order, forecast_damping, cfg_branches, check, check_tolerance),
        )
        calibration, source = calibration_for(config, "ApplyTeaCache", model, family, coefficients, variant)
        if calibration is not None:
            config = config.with_calibration(calibration, source)
        elif coefficients is not None:
            if not isinstance(coefficients, tuple):
                raise ValueError("ApplyTeaCache: coefficients must come from TeaCacheCalibrate or "
                                 f"TeaCacheCoefficientsFromText, got {type(coefficients).__name__}")
            config = dataclasses.replace(config, coefficients=coefficients)
        settings = CacheSettings(method=config, family=family.name, variant=variant, cache_device=cache_device,
                                 node_id=cls.hidden.unique_id)
        return io.NodeOutput(install(model, settings, family))


class ApplyMagCache(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="ApplyMagCache",
            display_name="Apply MagCache",
            category=CATEGORY,
            description=(
                "Skips the transformer block stack while the calibrated drift of its residual's "
                "magnitude stays under the threshold, reusing the last computed step's residual. "
                "Uses the published ratios of the detected model, or a calibration from MagCacheCalibrate."
            ),
            inputs=[
                io.Model.Input("model", tooltip="The diffusion model to cache (place after LoRAs, before the sampler)."),
                io.Float.Input("threshold", default=0.06, **finite_range(0.0, 2.0), step=0.001,
                               tooltip="Accumulated magnitude error allowed while skipping. 0 never skips; "
                               "higher is faster and less faithful."),
                io.Int.Input("max_consecutive_skips", default=2, min=1, max=100,
                             tooltip="K in the paper: at most this many steps in a row reuse the cache."),
                io.Float.Input("retention_ratio", default=0.2, **finite_range(0.0, 1.0), step=0.01,
                               tooltip="The first part of the denoising always computes (it lays out the image)."),
                Choice("cache_device", options=["main_device", "offload_device"],
                       default="main_device", tooltip=CACHE_DEVICE_TOOLTIP),
                Choice("variant", options=variant_options("magcache"), default="auto",
                       tooltip=VARIANT_TOOLTIP + LEGACY_VARIANT_NOTE, optional=True),
                MagRatiosType.Input(
                    "ratios", optional=True,
                    tooltip="Magnitude ratios from MagCacheCalibrate (or typed in); override the published ones. "
                    "Without them, a calibration saved for this model is used when there is one."),
                *estimator_inputs(MAGCACHE_ESTIMATOR, MAGCACHE_CHECK),
                Choice(
                    "skip_rule", options=list(SKIP_RULES), default="magnitude", optional=True,
                    tooltip="magnitude: the published MagCache rule (skip while the calibrated drift of the "
                    "residual's magnitude stays within threshold). planned: at the start of each run, choose "
                    "the fewest computed steps whose skips add up to at most threshold of relative error, "
                    "as measured on this model by MagCacheCalibrate (connect it, or save it); threshold is "
                    "then the run's total error budget (about 0.5 to 2). Plans reuse and first-order "
                    "forecasts (estimator reuse, forecast with forecast_order 1, damped_forecast).",
                ),
            ],
            outputs=[io.Model.Output()],
            hidden=[io.Hidden.unique_id],
            # The node id is baked into the patched model (for its statistics), so ComfyUI must not
            # hand this node's cached output to another node with equal inputs: ComfyUI 0.3.75 puts
            # the unique id of V3 nodes into the cache key only for not-idempotent ones.
            not_idempotent=True,
        )

    @classmethod
    def execute(cls, model: object, threshold: float, max_consecutive_skips: int, retention_ratio: float,
                cache_device: str, variant: str = "auto",
                ratios: Calibration | MagRatios | None = None, estimator: str = MAGCACHE_ESTIMATOR,
                forecast_order: int = 1, forecast_damping: float = 0.5, cfg_branches: str = "together",
                check: str = MAGCACHE_CHECK, check_tolerance: float = CHECK_TOLERANCE,
                skip_rule: str = "magnitude") -> io.NodeOutput:
        family = resolve_family(model, "ApplyMagCache")
        if family is None:
            return io.NodeOutput(model)
        variant = chosen_variant(family, variant, "magcache", "ApplyMagCache")
        config = MagCacheConfig(
            threshold=threshold, max_consecutive_skips=max_consecutive_skips, retention_ratio=retention_ratio,
            skip_rule=skip_rule,
            **shared_settings(estimator, forecast_order, forecast_damping, cfg_branches, check, check_tolerance),
        )
        calibration, source = calibration_for(config, "ApplyMagCache", model, family, ratios, variant)
        if calibration is not None:
            config = config.with_calibration(calibration, source)
        elif ratios is not None:
            if not isinstance(ratios, MagRatios):
                raise ValueError("ApplyMagCache: ratios must come from MagCacheCalibrate or MagCacheRatiosFromText, "
                                 f"got {type(ratios).__name__}")
            config = dataclasses.replace(config, ratios=ratios)
        if skip_rule == "planned":
            check_planned(config, calibration)
        candidates = family.possible_variants(model.model) if variant == "auto" else (family.variant(variant),)
        if config.ratios is None and not any(v.magcache is not None for v in candidates):
            what = family.resolve_variant(model.model, families.RunContext()).label
            raise ValueError(
                f"ApplyMagCache: no MagCache ratios are published for this model ({family.name} / {what}). Measure "
                "them once with MagCacheCalibrate and connect its ratios output here, or, for a fine-tune of a "
                "published checkpoint, choose that checkpoint with the variant input."
            )
        settings = CacheSettings(method=config, family=family.name, variant=variant, cache_device=cache_device,
                                 node_id=cls.hidden.unique_id)
        return io.NodeOutput(install(model, settings, family))
