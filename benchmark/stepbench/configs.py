"""What the benchmark runs: models, sampler settings, evaluation/calibration sets and cache configurations."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from harness import sampling as harness_sampling

PACK_METHODS = ("teacache", "magcache")
NATIVE_METHODS = ("easycache", "lazycache")
KINDS = ("image", "video")  # the reference models (demo.models.load_model)


@dataclass(frozen=True)
class Variant:
    """The Apply nodes' shared inputs (estimator, CFG branches, first-block check)."""

    estimator: str = "reuse"
    order: int = 1
    damping: float = 0.5
    branches: str = "together"
    check: str = "off"  # "off" | "hindsight" | "first_block"
    tolerance: float = 0.1
    # ApplyMagCache skip_rule: "magnitude" | "planned" (calibrated constants only) | "measured"
    rule: str = "magnitude"

    @property
    def suffix(self) -> str:
        """How a method line names it ("" for the published method: reuse, no check)."""
        parts = [self.rule] if self.rule != "magnitude" else []
        if self.estimator == "forecast":
            parts.append(f"forecast o{self.order}")
        elif self.estimator == "damped_forecast":
            parts.append(f"damped {self.damping:g}")
        elif self.estimator != "reuse":
            parts.append(self.estimator.replace("_", " "))
        if self.branches == "separate":
            parts.append("separate CFG")
        if self.check != "off":
            parts.append(f"{self.check.replace('_', '-')} {self.tolerance:g}")
        return " + ".join(parts)

    def inputs(self) -> dict:
        return {"estimator": self.estimator, "forecast_order": self.order, "forecast_damping": self.damping,
                "cfg_branches": self.branches, "check": self.check, "check_tolerance": self.tolerance,
                **({"skip_rule": self.rule} if self.rule != "magnitude" else {})}


def parse_variant(spec: str) -> Variant:
    """``<estimator>[,o=N][,d=X][,separate][,hindsight=X|,first_block=X][,planned|,measured]``,
    e.g. ``damped_forecast,d=0.3,separate,hindsight=0.05`` or ``forecast,planned``."""
    name, *options = [token.strip() for token in spec.split(",")]
    if name not in harness_sampling.pack("cache_core.estimators").ESTIMATORS:
        raise ValueError(f"unknown estimator {name!r} in variant {spec!r}")
    fields: dict = {"estimator": name}
    for option in options:
        key, _, value = option.partition("=")
        if key == "o":
            fields["order"] = int(value)
        elif key == "d":
            fields["damping"] = float(value)
        elif key == "separate":
            fields["branches"] = "separate"
        elif key in ("planned", "measured"):
            fields["rule"] = key
        elif key in ("hindsight", "first_block"):
            fields["check"] = key
            fields["tolerance"] = float(value)
        else:
            raise ValueError(f"unknown option {option!r} in variant {spec!r}")
    return Variant(**fields)


DEFAULT_VARIANT = Variant()
# What the sweeps combine the thresholds with (``--variants``).
VARIANT_PRESETS: dict[str, list[Variant]] = {
    "reuse": [DEFAULT_VARIANT],
    # Every registered estimator's examples (cache_core/estimators).
    "estimators": [Variant(s.name, order=s.order, damping=s.damping)
                   for s in harness_sampling.pack("cache_core.estimators").examples()],
    "all": [
        DEFAULT_VARIANT, Variant("forecast"), Variant("forecast", order=2), Variant("damped_forecast"),
        Variant(branches="separate"), Variant("forecast", branches="separate"),
        Variant("damped_forecast", branches="separate"),
        Variant(check="hindsight"), Variant("damped_forecast", check="hindsight"),
        Variant("damped_forecast", branches="separate", check="hindsight"),
        Variant("damped_forecast", check="first_block"),
        Variant(rule="planned"), Variant("forecast", rule="planned"),
    ],
}


@dataclass(frozen=True)
class SamplerSetting:
    sampler: str
    steps: int
    cfg: float
    scheduler: str = "simple"

    @property
    def name(self) -> str:
        return f"{self.sampler} {self.steps} steps cfg {self.cfg:g}"

    @property
    def key(self) -> str:
        return f"{self.sampler}-{self.steps}"


@dataclass(frozen=True)
class Pair:
    """One evaluation prompt (class) and seed; ``batch`` rows of that class per run."""

    class_index: int
    seed: int
    batch: int = 1

    @property
    def name(self) -> str:
        return f"class {self.class_index} seed {self.seed}"


@dataclass(frozen=True)
class Config:
    """One cache configuration. ``constants``: "published" (FLUX.1-dev's published numbers, chosen
    with the node's variant input) or "calibrated" (this model's MagCacheCalibrate/TeaCacheCalibrate) for the
    pack; None for the native nodes and uncached. ``as_is``: a native node without the
    bf16-cast copy of its input (a diagnostic row only)."""

    method: str  # "uncached" | "teacache" | "magcache" | "easycache" | "lazycache"
    threshold: float = 0.0
    constants: str | None = None
    k: int | None = None  # max_consecutive_skips (pack)
    retention: float | None = None  # MagCache retention_ratio
    as_is: bool = False
    variant: Variant = DEFAULT_VARIANT  # pack only

    @property
    def is_pack(self) -> bool:
        return self.method in PACK_METHODS

    @property
    def is_native(self) -> bool:
        return self.method in NATIVE_METHODS

    @property
    def line(self) -> str:
        """The method line this configuration belongs to (plot legend, summary tables)."""
        names = {"uncached": "uncached", "teacache": "StepCache TeaCache", "magcache": "StepCache MagCache",
                 "easycache": "EasyCache (native)", "lazycache": "LazyCache (native)"}
        name = names[self.method]
        if self.constants:
            name += f" ({self.constants})"
        if self.as_is:
            name += " as-is, no input copy"
        if self.is_pack and self.variant.suffix:
            name += " + " + self.variant.suffix
        return name

    @property
    def label(self) -> str:
        if self.method == "uncached":
            return "uncached"
        parts = [self.line, f"thr {self.threshold:g}"]
        if self.k is not None:
            parts.append(f"K={self.k}")
        if self.retention is not None:
            parts.append(f"ret {self.retention:g}")
        return ", ".join(parts)


@dataclass
class Plan:
    kinds: list[str]
    settings: list[SamplerSetting]
    pairs: list[Pair]
    calibration_classes: list[int]
    calibration_seed: int
    teacache_thresholds: list[float]
    teacache_k: int
    magcache_thresholds: list[float]
    magcache_ks: list[int]
    magcache_retention: float
    native_thresholds: list[float]
    planned_thresholds: list[float]  # error budgets of ApplyMagCache's planned rule
    reps: int  # 0: quality only (no timing)
    variants: list[Variant] = field(default_factory=lambda: [DEFAULT_VARIANT])
    diagnostic_as_is: bool = True
    only: str | None = None  # a regular expression the configuration labels must match
    methods: tuple[str, ...] = PACK_METHODS + NATIVE_METHODS
    constants: tuple[str, ...] = ("published", "calibrated")
    notes: list[str] = field(default_factory=list)

    @property
    def quality_only(self) -> bool:
        return self.reps == 0

    def configs(self) -> list[Config]:
        # uncached against itself: the timing noise floor (nothing to time in a quality-only run)
        out: list[Config] = [] if self.quality_only else [Config("uncached")]
        for constants in self.constants:
            for variant in self.variants:
                if variant.rule == "planned":  # MagCache only, on this model's calibration
                    if "magcache" in self.methods and constants == "calibrated":
                        out += [Config("magcache", t, constants, k=k, retention=self.magcache_retention,
                                       variant=variant) for k in self.magcache_ks for t in self.planned_thresholds]
                    continue
                if "teacache" in self.methods:
                    out += [Config("teacache", t, constants, k=self.teacache_k, variant=variant)
                            for t in self.teacache_thresholds]
                if "magcache" in self.methods:
                    out += [Config("magcache", t, constants, k=k, retention=self.magcache_retention, variant=variant)
                            for k in self.magcache_ks for t in self.magcache_thresholds]
        for method in NATIVE_METHODS:
            if method in self.methods:
                out += [Config(method, t) for t in self.native_thresholds]
        if self.diagnostic_as_is and "easycache" in self.methods:
            out.append(Config("easycache", 0.2, as_is=True))
        if self.only:
            pattern = re.compile(self.only)
            out = [c for c in out if c.method == "uncached" or pattern.search(c.label)]
        return out


N_CLASSES = 10


def make_plan(quick: bool, classes: int | None, seeds: int | None, batch: int, reps: int | None,
              cfg: float, samplers: list[str] | None, kinds: list[str] | None = None, variants: str | None = None,
              only: str | None = None, methods: list[str] | None = None, constants: list[str] | None = None,
              teacache_thresholds: list[float] | None = None, magcache_thresholds: list[float] | None = None,
              magcache_ks: list[int] | None = None, variant_specs: list[str] | None = None,
              planned_thresholds: list[float] | None = None, magcache_retention: float | None = None) -> Plan:
    """The sweep. Evaluation uses classes 0..n-1 and seeds 0..s-1; calibration uses the next
    classes (disjoint from evaluation while there are enough) and its own seed. ``reps`` 0 is a
    quality-only sweep (no interleaved timing)."""
    n_classes = classes or (2 if quick else 4)
    n_seeds = seeds or (1 if quick else 2)
    settings = [SamplerSetting("euler", 30, cfg), SamplerSetting("dpmpp_2m", 20, cfg)]
    if samplers:
        settings = [s for s in settings if s.sampler in samplers]
    pairs = [Pair(c, seed, batch) for c in range(n_classes) for seed in range(n_seeds)]
    calibration = [(n_classes + i) % N_CLASSES for i in range(4)]
    notes = []
    if set(calibration) & set(range(n_classes)):
        notes.append("calibration classes overlap the evaluation classes (too many classes asked); "
                     "the calibration seed is still distinct")
    common = {
        "kinds": list(kinds or KINDS), "variants": VARIANT_PRESETS[variants or ("reuse" if quick else "all")],
        "only": only, "methods": tuple(methods or PACK_METHODS + NATIVE_METHODS),
        "constants": tuple(constants or ("published", "calibrated")), "notes": notes,
    }
    if quick:
        plan = Plan(settings=settings, pairs=pairs, calibration_classes=calibration, calibration_seed=10_000,
                    teacache_thresholds=[0.2, 0.4], teacache_k=3,
                    magcache_thresholds=[0.02, 0.08], magcache_ks=[2], magcache_retention=0.2,
                    native_thresholds=[0.05, 0.2], planned_thresholds=[0.5, 1.5], reps=1 if reps is None else reps,
                    diagnostic_as_is=True, **common)
    else:
        plan = Plan(settings=settings, pairs=pairs, calibration_classes=calibration, calibration_seed=10_000,
                    teacache_thresholds=[0.1, 0.12, 0.15, 0.2, 0.25, 0.3, 0.4, 0.6, 1.0], teacache_k=3,
                    magcache_thresholds=[0.005, 0.01, 0.02, 0.03, 0.05, 0.08, 0.15], magcache_ks=[2, 3, 4],
                    magcache_retention=0.2, native_thresholds=[0.02, 0.05, 0.08, 0.12, 0.2, 0.3, 0.5, 0.8],
                    planned_thresholds=[0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0], reps=2 if reps is None else reps,
                    **common)
    if teacache_thresholds:
        plan.teacache_thresholds = teacache_thresholds
    if magcache_thresholds:
        plan.magcache_thresholds = magcache_thresholds
    if magcache_ks:
        plan.magcache_ks = magcache_ks
    if planned_thresholds:
        plan.planned_thresholds = planned_thresholds
    if magcache_retention is not None:
        plan.magcache_retention = magcache_retention
    if variant_specs:
        plan.variants = [parse_variant(spec) for spec in variant_specs]
    return plan
