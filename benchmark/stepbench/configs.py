"""What the benchmark runs: sampler settings, evaluation/calibration sets and cache configurations."""

from __future__ import annotations

from dataclasses import dataclass, field

PACK_METHODS = ("teacache", "magcache")
NATIVE_METHODS = ("easycache", "lazycache")


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
    reps: int
    diagnostic_as_is: bool = True
    notes: list[str] = field(default_factory=list)

    def configs(self) -> list[Config]:
        out: list[Config] = [Config("uncached")]  # uncached against itself: the timing noise floor
        for constants in ("published", "calibrated"):
            out += [Config("teacache", t, constants, k=self.teacache_k) for t in self.teacache_thresholds]
            out += [Config("magcache", t, constants, k=k, retention=self.magcache_retention)
                    for k in self.magcache_ks for t in self.magcache_thresholds]
        for method in NATIVE_METHODS:
            out += [Config(method, t) for t in self.native_thresholds]
        if self.diagnostic_as_is:
            out.append(Config("easycache", 0.2, as_is=True))
        return out


N_CLASSES = 10


def make_plan(quick: bool, classes: int | None, seeds: int | None, batch: int, reps: int | None,
              cfg: float, samplers: list[str] | None) -> Plan:
    """The sweep. Evaluation uses classes 0..n-1 and seeds 0..s-1; calibration uses the next
    classes (disjoint from evaluation while there are enough) and its own seed."""
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
    if quick:
        return Plan(settings, pairs, calibration, 10_000,
                    teacache_thresholds=[0.2, 0.4], teacache_k=3,
                    magcache_thresholds=[0.02, 0.08], magcache_ks=[2], magcache_retention=0.2,
                    native_thresholds=[0.05, 0.2], reps=reps or 1, diagnostic_as_is=True, notes=notes)
    return Plan(settings, pairs, calibration, 10_000,
                teacache_thresholds=[0.1, 0.12, 0.15, 0.2, 0.25, 0.3, 0.4, 0.6, 1.0], teacache_k=3,
                magcache_thresholds=[0.005, 0.01, 0.02, 0.03, 0.05, 0.08, 0.15], magcache_ks=[2, 3, 4],
                magcache_retention=0.2, native_thresholds=[0.02, 0.05, 0.08, 0.12, 0.2, 0.3, 0.5, 0.8],
                reps=reps or 2, notes=notes)
