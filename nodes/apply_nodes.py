"""ApplyTeaCache and ApplyMagCache: MODEL in, MODEL out (ComfyUI V3 node schema)."""

from __future__ import annotations

import logging

from comfy_api.latest import io

from .. import families
from ..cache_core import MagRatios
from ..cache_core.calibration import Calibration
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


def variant_options(kind: str) -> list[str]:
    names = ["auto"]
    for family in families.FAMILIES:
        names += [v.name for v in family.variants if getattr(v, kind) is not None]
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


def calibration_for(method: str, node: str, model: object, family: families.Family, given: object | None,
                    variant: str = "auto") -> tuple[Calibration | None, str | None]:
    """The calibration to use: the one connected (checked against this model), else a saved one
    unless published constants were chosen by name; and what to call it in the statistics."""
    if given is not None and not isinstance(given, Calibration):
        return None, None  # a plain table or polynomial, not tied to a model
    identity = calibration_store.model_identity(model, family, "auto")
    if given is not None:
        if given.method != method:
            raise ValueError(f"{node}: that is a {given.method} calibration; connect a {method} one")
        mismatch = given.model.mismatch(identity)
        if mismatch:
            raise ValueError(f"{node}: this calibration cannot be used here: {mismatch}. "
                             f"Calibrate this model ({'MagCacheCalibrate' if method == 'magcache' else 'TeaCacheCalibrate'}).")
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
                       tooltip=VARIANT_TOOLTIP, optional=True),
                TeaCacheCoefficientsType.Input(
                    "coefficients", optional=True,
                    tooltip="A polynomial from TeaCacheCalibrate (or typed in); overrides the published one. "
                    "Without it, a calibration saved for this model is used when there is one."),
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
                coefficients: Calibration | tuple[float, ...] | None = None) -> io.NodeOutput:
        problem = window_problem(start_percent, end_percent)  # linked values are only known now
        if problem is not None:
            raise ValueError(f"ApplyTeaCache: {problem}")
        family = resolve_family(model, "ApplyTeaCache")
        if family is None:
            return io.NodeOutput(model)
        check_variant(family, variant, "ApplyTeaCache")
        calibration, source = calibration_for("teacache", "ApplyTeaCache", model, family, coefficients, variant)
        if calibration is not None:
            coefficients = calibration.coefficients
        elif coefficients is not None and not isinstance(coefficients, tuple):
            raise ValueError("ApplyTeaCache: coefficients must come from TeaCacheCalibrate or "
                             f"TeaCacheCoefficientsFromText, got {type(coefficients).__name__}")
        settings = CacheSettings(
            method="teacache", family=family.name, variant=variant, threshold=threshold,
            max_consecutive_skips=max_consecutive_skips, start_percent=start_percent,
            end_percent=end_percent, coefficients=coefficients, constants_source=source,
            cache_device=cache_device, node_id=cls.hidden.unique_id,
        )
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
                       tooltip=VARIANT_TOOLTIP, optional=True),
                MagRatiosType.Input(
                    "ratios", optional=True,
                    tooltip="Magnitude ratios from MagCacheCalibrate (or typed in); override the published ones. "
                    "Without them, a calibration saved for this model is used when there is one."),
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
                ratios: Calibration | MagRatios | None = None) -> io.NodeOutput:
        family = resolve_family(model, "ApplyMagCache")
        if family is None:
            return io.NodeOutput(model)
        check_variant(family, variant, "ApplyMagCache")
        calibration, source = calibration_for("magcache", "ApplyMagCache", model, family, ratios, variant)
        if calibration is not None:
            ratios = calibration.mag_ratios()
        elif ratios is not None and not isinstance(ratios, MagRatios):
            raise ValueError("ApplyMagCache: ratios must come from MagCacheCalibrate or MagCacheRatiosFromText, "
                             f"got {type(ratios).__name__}")
        candidates = family.possible_variants(model.model) if variant == "auto" else (family.variant(variant),)
        if ratios is None and not any(v.magcache is not None for v in candidates):
            what = family.resolve_variant(model.model, families.RunContext()).label
            raise ValueError(
                f"ApplyMagCache: no MagCache ratios are published for this model ({family.name} / {what}). Measure "
                "them once with MagCacheCalibrate and connect its ratios output here, or, for a fine-tune of a "
                "published checkpoint, choose that checkpoint with the variant input."
            )
        settings = CacheSettings(
            method="magcache", family=family.name, variant=variant, threshold=threshold,
            max_consecutive_skips=max_consecutive_skips, retention_ratio=retention_ratio,
            ratios=ratios, constants_source=source, cache_device=cache_device, node_id=cls.hidden.unique_id,
        )
        return io.NodeOutput(install(model, settings, family))
