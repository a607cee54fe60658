"""ApplyTeaCache and ApplyMagCache: MODEL in, MODEL out (ComfyUI V3 node schema).

``quality`` is the knob a user sees: at a level (cache_core/quality.py) both nodes run the
measured-error rule, which needs no table, so they serve every cached family alike. At ``custom``
each node builds its own method (cache_core.methods) from the expert inputs, exactly as given;
those inputs are "advanced" where the host's schema has that (0.30.0), folded away in the UI.

Saved workflows: inputs added later come last and are optional. ``quality`` defaults to ``custom``
in ``execute``, so an API graph saved without it runs as saved; the web extension does the same for
UI workflows saved without it (web/stepcache.js), while a node placed anew starts at the default
level. The estimator inputs' defaults at custom: ApplyMagCache the damped forecast with the
hindsight check at 0.06 (docs/experiments.md section 11), ApplyTeaCache reuse without a check.
"""

from __future__ import annotations

import dataclasses
import logging

from comfy_api.latest import io

from .. import families
from ..cache_core import EstimatorSpec, MagCacheConfig, MagRatios, MethodConfig, TeaCacheConfig
from ..cache_core.calibration import Calibration
from ..cache_core.estimators import ESTIMATORS, MAX_ORDER
from ..cache_core.methods import SKIP_RULES
from ..cache_core.quality import CUSTOM, DEFAULT_LEVEL, LEVELS, QUALITY_OPTIONS
from . import calibration_store
from .runtime import CacheSettings, install
from .types import CATEGORY, MagRatiosType, TeaCacheCoefficientsType
from .validation import ADVANCED, Choice, check_related, finite_range

LOGGER = logging.getLogger("stepcache")

CACHE_DEVICE_TOOLTIP = (
    "Where cached residuals live between steps. main_device: beside the model (fastest). "
    "offload_device: in system memory, copied over when used; for when accelerator memory is short."
)
VARIANT_TOOLTIP = (
    "quality custom: which published constants to use. auto: those measured on the loaded model's "
    "architecture. Pick one for checkpoints that share an architecture, or for a fine-tune of a published one."
)


ESTIMATOR_OPTIONS = list(ESTIMATORS)  # the registry (cache_core/estimators)
CFG_BRANCH_OPTIONS = ["together", "separate"]
CHECK_OPTIONS = ["off", "hindsight", "first_block"]

# Each node's defaults for the shared estimator and check inputs (schema and execute alike).
TEACACHE_ESTIMATOR, TEACACHE_CHECK = "reuse", "off"
MAGCACHE_ESTIMATOR, MAGCACHE_CHECK = "damped_forecast", "hindsight"
CHECK_TOLERANCE = 0.06


QUALITY_TOOLTIP = (
    "How close to uncached sampling the result stays: lossless, high, balanced or fast. The cache measures "
    "its own error and skips as many steps as the level allows (with euler or ddim it also corrects skips "
    "afterwards). custom: the expert inputs, exactly as set."
)


MODEL_TOOLTIP = "The diffusion model to cache (place after LoRAs, before the sampler)."


def quality_input() -> Choice:
    """The one knob, last among the inputs so that workflows saved before it keep their values."""
    return Choice("quality", options=QUALITY_OPTIONS, default=DEFAULT_LEVEL, optional=True, tooltip=QUALITY_TOOLTIP)


def at_quality_level(node: str, model: object, quality: str, cache_device: str, node_id: str | None,
                     connected: object | None) -> io.NodeOutput:
    """Either Apply node at a quality level: the measured-error rule at that level's settings."""
    level = LEVELS.get(quality)
    if level is None:
        raise ValueError(f"{node}: quality must be one of {', '.join(QUALITY_OPTIONS)}, got {quality!r}")
    family = resolve_family(model, node)
    if family is None:
        return io.NodeOutput(model)
    if connected is not None:
        LOGGER.info("[StepCache] %s: quality %s measures its own error and does not use the connected constants; "
                    "set quality to custom to use them", node, quality)
    else:
        method = "teacache" if node == "ApplyTeaCache" else "magcache"
        if calibration_store.find(method, calibration_store.model_identity(model, family, "auto")) is not None:
            LOGGER.info("[StepCache] %s: quality %s measures its own error and does not use this model's saved "
                        "calibration (quality custom does)", node, quality)
    settings = CacheSettings(method=level.config(), family=family.name, cache_device=cache_device, node_id=node_id)
    return io.NodeOutput(install(model, settings, family))


def estimator_inputs(estimator: str, check: str) -> list:
    """The expert inputs both Apply nodes share, after their own, with this node's defaults for
    ``estimator`` and ``check``."""
    return [
        Choice(
            "estimator", options=ESTIMATOR_OPTIONS, default=estimator, optional=True, **ADVANCED,
            tooltip="quality custom: what a skipped step uses for the blocks' output. reuse: the last computed "
            "residual. forecast: extrapolates it. damped_forecast: leans back to reuse over long gaps. "
            "optimal_linear: weights solved from a connected calibration.",
        ),
        io.Int.Input("forecast_order", default=1, min=1, max=MAX_ORDER, optional=True, **ADVANCED,
                     tooltip="estimator forecast: 1 extrapolates a line through the last two computed steps, "
                     "2 a parabola through three. optimal_linear: combines order + 1 computed steps."),
        io.Float.Input("forecast_damping", default=0.5, **finite_range(0.0, 1.0), step=0.05, optional=True,
                       **ADVANCED,
                       tooltip="estimator damped_forecast: how fast the forecast's step shrinks as the gap grows. "
                       "0 is the plain forecast, 1 is reuse."),
        Choice(
            "cfg_branches", options=CFG_BRANCH_OPTIONS, default="together", optional=True, **ADVANCED,
            tooltip="quality custom: together skips cond and uncond only when both may. separate runs them as "
            "separate calls when only one may skip (the guidance scale multiplies that branch's error).",
        ),
        Choice(
            "check", options=CHECK_OPTIONS, default=check, optional=True, **ADVANCED,
            tooltip="quality custom: a check that can refuse a skip. hindsight: skips only while the error "
            "measured at the last computed step is within check_tolerance (free). first_block: runs the first "
            "block and compares it with the forecast (costs one block per skip).",
        ),
        io.Float.Input("check_tolerance", default=CHECK_TOLERANCE, **finite_range(0.0, 10.0), step=0.005,
                       optional=True, **ADVANCED,
                       tooltip="check: the largest relative error (mean absolute error over mean absolute value "
                       "of the residual) at which a skip goes ahead. Lower is more faithful and slower."),
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


def with_constants(config: MethodConfig, node: str, model: object, family: families.Family, connected: object | None,
                   variant: str, table: type, field: str, makers: str) -> tuple[MethodConfig, Calibration | None]:
    """``config`` with the constants this node gives it, in order: a connected calibration of this
    model, else (at ``variant: auto``) a saved one, else a connected table (``field``, of type
    ``table``: made by ``makers``); without any, the run takes the published constants."""
    calibration, source = calibration_for(config, node, model, family, connected, variant)
    if calibration is not None:
        return config.with_calibration(calibration, source), calibration
    if connected is not None:
        if not isinstance(connected, table):
            raise ValueError(f"{node}: {field} must come from {makers}, got {type(connected).__name__}")
        return dataclasses.replace(config, **{field: connected}), None
    return config, None


def window_problem(start_percent: float, end_percent: float) -> str | None:
    if not start_percent < end_percent:
        return f"start_percent ({start_percent}) must be below end_percent ({end_percent})"
    return None


def check_planned(config: MagCacheConfig, calibration: Calibration | None) -> None:
    """The planned rule runs on this model's measured skip errors, for the estimators it can plan."""
    if calibration is None:
        raise ValueError("ApplyMagCache: skip_rule planned needs this model's calibration: connect "
                         "MagCacheCalibrate's ratios output (or save one with it), or use skip_rule magnitude")
    if config.error_models is None and config.estimator.build().error_model is None:
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
                "Skips the transformer block stack on steps where it can be estimated from the steps "
                "computed before. Set quality; custom runs TeaCache (skips while the first block's input "
                "changes little) with the inputs as set."
            ),
            inputs=[
                io.Model.Input("model", tooltip=MODEL_TOOLTIP),
                io.Float.Input(
                    "threshold", default=0.4, **finite_range(0.0, 10.0), step=0.01, **ADVANCED,
                    tooltip="quality custom: accumulated (rescaled) input change below which a step is skipped. "
                    "0 never skips. Published: FLUX 0.4 (about 1.8x) to 0.8; Wan 2.1 0.05-0.2.",
                ),
                io.Float.Input("start_percent", default=0.0, **finite_range(0.0, 1.0), step=0.01, **ADVANCED,
                               tooltip="quality custom: skipping starts at this point of the denoising."),
                io.Float.Input("end_percent", default=1.0, **finite_range(0.0, 1.0), step=0.01, **ADVANCED,
                               tooltip="quality custom: skipping stops at this point of the denoising."),
                io.Int.Input("max_consecutive_skips", default=3, min=1, max=100, **ADVANCED,
                             tooltip="quality custom: at most this many steps in a row reuse the cache."),
                Choice("cache_device", options=["main_device", "offload_device"],
                       default="main_device", tooltip=CACHE_DEVICE_TOOLTIP),
                Choice("variant", options=variant_options("teacache"), default="auto", **ADVANCED,
                       tooltip=VARIANT_TOOLTIP, optional=True),
                TeaCacheCoefficientsType.Input(
                    "coefficients", optional=True,
                    tooltip="quality custom: a polynomial from TeaCacheCalibrate (or typed in) in place of the "
                    "published one. Without it, one saved for this model is used."),
                *estimator_inputs(TEACACHE_ESTIMATOR, TEACACHE_CHECK),
                quality_input(),
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
                check: str = TEACACHE_CHECK, check_tolerance: float = CHECK_TOLERANCE,
                quality: str = CUSTOM) -> io.NodeOutput:
        # quality's default here is custom: an API graph saved before it existed runs as it was saved.
        if quality != CUSTOM:
            return at_quality_level("ApplyTeaCache", model, quality, cache_device, cls.hidden.unique_id, coefficients)
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
        config, _ = with_constants(config, "ApplyTeaCache", model, family, coefficients, variant, tuple,
                                   "coefficients", "TeaCacheCalibrate or TeaCacheCoefficientsFromText")
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
                "Skips the transformer block stack on steps where it can be estimated from the steps "
                "computed before. Set quality; custom runs MagCache (published or calibrated magnitude "
                "ratios) with the inputs as set."
            ),
            inputs=[
                io.Model.Input("model", tooltip=MODEL_TOOLTIP),
                io.Float.Input("threshold", default=0.06, **finite_range(0.0, 2.0), step=0.001, **ADVANCED,
                               tooltip="quality custom: accumulated magnitude error allowed while skipping. 0 never "
                               "skips; higher is faster and less faithful."),
                io.Int.Input("max_consecutive_skips", default=2, min=1, max=100, **ADVANCED,
                             tooltip="quality custom: K in the paper, at most this many steps in a row skipped."),
                io.Float.Input("retention_ratio", default=0.2, **finite_range(0.0, 1.0), step=0.01, **ADVANCED,
                               tooltip="quality custom: the first part of the denoising always computes (it lays "
                               "out the image)."),
                Choice("cache_device", options=["main_device", "offload_device"],
                       default="main_device", tooltip=CACHE_DEVICE_TOOLTIP),
                Choice("variant", options=variant_options("magcache"), default="auto", **ADVANCED,
                       tooltip=VARIANT_TOOLTIP, optional=True),
                MagRatiosType.Input(
                    "ratios", optional=True,
                    tooltip="quality custom: ratios from MagCacheCalibrate (or typed in) in place of the published "
                    "ones. Without them, a calibration saved for this model is used."),
                *estimator_inputs(MAGCACHE_ESTIMATOR, MAGCACHE_CHECK),
                Choice(
                    "skip_rule", options=list(SKIP_RULES), default="magnitude", optional=True, **ADVANCED,
                    tooltip="quality custom: magnitude, the published rule. planned: steps chosen per run against "
                    "this model's calibration, threshold being the error budget (0.5-2). measured: the run's own "
                    "measured error, threshold being its tolerance; no table needed.",
                ),
                quality_input(),
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
                skip_rule: str = "magnitude", quality: str = CUSTOM) -> io.NodeOutput:
        # quality's default here is custom: an API graph saved before it existed runs as it was saved.
        if quality != CUSTOM:
            return at_quality_level("ApplyMagCache", model, quality, cache_device, cls.hidden.unique_id, ratios)
        family = resolve_family(model, "ApplyMagCache")
        if family is None:
            return io.NodeOutput(model)
        variant = chosen_variant(family, variant, "magcache", "ApplyMagCache")
        config = MagCacheConfig(
            threshold=threshold, max_consecutive_skips=max_consecutive_skips, retention_ratio=retention_ratio,
            skip_rule=skip_rule,
            **shared_settings(estimator, forecast_order, forecast_damping, cfg_branches, check, check_tolerance),
        )
        config, calibration = with_constants(config, "ApplyMagCache", model, family, ratios, variant, MagRatios,
                                             "ratios", "MagCacheCalibrate or MagCacheRatiosFromText")
        if skip_rule == "planned":
            check_planned(config, calibration)
        candidates = family.possible_variants(model.model) if variant == "auto" else (family.variant(variant),)
        if skip_rule == "magnitude" and config.ratios is None and not any(v.magcache is not None for v in candidates):
            what = family.resolve_variant(model.model, families.RunContext()).label
            raise ValueError(
                f"ApplyMagCache: no MagCache ratios are published for this model ({family.name} / {what}). Set "
                "quality to a level (they need no ratios), or measure ratios once with MagCacheCalibrate and "
                "connect its ratios output here, or choose a published checkpoint with the variant input."
            )
        settings = CacheSettings(method=config, family=family.name, variant=variant, cache_device=cache_device,
                                 node_id=cls.hidden.unique_id)
        return io.NodeOutput(install(model, settings, family))
