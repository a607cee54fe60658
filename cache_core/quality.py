"""The quality levels: the one knob of both Apply nodes, each a promise about worst-case fidelity.

A level is a set of settings for the measured-error rule (``MeasuredErrorConfig``), which needs no
published table and no calibration, so every level serves every cached model family. Each level's
``worst_db`` is what it was chosen to hold, as the worst-case PSNR against uncached sampling on the
project's reference models (image and video, euler 30 and dpmpp_2m 20 steps, cfg 4); the figures
it reached are in docs/benchmark.md, and the sweep that chose them in docs/experiments.md.

``custom`` is not a level: the node then runs its expert inputs exactly as given.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .estimators import EstimatorSpec
from .methods import MeasuredErrorConfig

# The CFG scale the levels were chosen at; runs at a higher scale get a proportionally tighter
# tolerance, so the promises hold there too (docs/experiments.md section 19).
REFERENCE_CFG = 4.0
# Models cached in output space (the families without block hooks: the whole model call is the stack)
# take the levels' tolerances times this. The levels were chosen in the block stack's space; in output
# space the reference image model mostly skipped more at the same tolerance and missed four promises, at
# euler and at dpmpp_2m (docs/experiments.md section 33).
OUTPUT_SPACE_FACTOR = 0.75


@dataclass(frozen=True)
class QualityLevel:
    name: str
    summary: str  # what a user gets, in a few words (tooltips, README)
    worst_db: float  # the worst-case PSNR the level was chosen to hold on the reference models
    tolerance: float  # the largest predicted relative error of a skipped step
    max_consecutive_skips: int
    retention_ratio: float = 0.2
    # Every level charges the error as gap^2 and measures it per CFG branch (docs/experiments.md
    # section 18); the guided residual and a fitted growth remain MeasuredErrorConfig's options.
    growth: float = 2.0  # prior exponent of the error's growth with the gap
    guided: bool = False  # measure per CFG branch, not on the guided residual
    # ... charging each branch at least half the guided residual's error: a net for models whose
    # guidance amplifies the branches' errors more than the reference models' (section 21).
    guided_error_weight: float = 0.5
    # How many latest measurements the error model follows the largest of (MeasuredErrorConfig): 2
    # waits out the fast-falling errors early in a run, where one skip can cost some images 25 dB
    # (sections 23-24); the tight levels' tolerances already do.
    rate_memory: int = 1
    # ... only during the transient: while one of the latest rates is more than this many times the
    # latest (0: always). After it the latest measurement alone, as the tight levels (section 25).
    transient_fall: float = 0.0
    # How far a run at a CFG scale above REFERENCE_CFG tightens the tolerance: x (4 / cfg) ** power.
    # A rule that waits for two low measurements needs less of it (section 24).
    guidance_power: float = 1.0
    # Feed a skip's error back at the next computed call on single-step samplers (section 28).
    feedback: bool = False
    # The tolerance where the sampler allows no skip feedback (multistep samplers such as dpmpp_2m);
    # None: ``tolerance`` there too (docs/experiments.md section 31).
    tolerance_without_feedback: float | None = None
    estimator: EstimatorSpec = field(default_factory=lambda: EstimatorSpec("damped_forecast", damping=0.5))

    def config(self) -> MeasuredErrorConfig:
        return MeasuredErrorConfig(
            tolerance=self.tolerance, max_consecutive_skips=self.max_consecutive_skips,
            retention_ratio=self.retention_ratio, growth=self.growth, guided=self.guided, estimator=self.estimator,
            guided_error_weight=self.guided_error_weight, rate_memory=self.rate_memory,
            transient_fall=self.transient_fall, guidance_power=self.guidance_power,
            guidance_reference=REFERENCE_CFG, level=self.name, feedback=self.feedback,
            tolerance_without_feedback=self.tolerance_without_feedback, output_space_factor=OUTPUT_SPACE_FACTOR,
        )


# The settings were chosen on the reference models by sweeps of the rule's tolerance, K, retention,
# growth exponent and measurement (per branch or on the guided residual): docs/experiments.md
# sections 13 and 18. Each is the fastest setting tried whose worst case held its promise on two
# sets of images and clips (the headline set and a second one of other classes and seeds); a third
# set of other seeds checks them. Per-branch measurement with the error charged as gap^2 held the
# worst case best at every level. balanced and fast follow two measurements while the errors fall
# fast, which held their promises on models trained anew where one measurement missed (sections 24-25).
# All but fast feed a skip's error back at the next computed call where the sampler allows it
# (Euler-like samplers): at equal speed it raised the worst case on nearly every set it was tried
# on, by up to 10 dB; at fast it moved one clip under the promise at cfg 7 (sections 27-28).
LEVELS: dict[str, QualityLevel] = {
    level.name: level
    for level in (
        QualityLevel("lossless", "no visible change", 37.0, tolerance=0.03, max_consecutive_skips=2,
                     feedback=True),
        QualityLevel("high", "hard to tell apart", 32.0, tolerance=0.04, max_consecutive_skips=2,
                     retention_ratio=0.3, feedback=True),
        QualityLevel("balanced", "small changes in detail", 29.0, tolerance=0.06, max_consecutive_skips=2,
                     rate_memory=2, transient_fall=2.0, guidance_power=0.75, feedback=True,
                     tolerance_without_feedback=0.05),
        QualityLevel("fast", "fastest; visible changes", 24.0, tolerance=0.12, max_consecutive_skips=3,
                     rate_memory=2, transient_fall=2.0, guidance_power=0.75),
    )
}
CUSTOM = "custom"
DEFAULT_LEVEL = "balanced"
QUALITY_OPTIONS = [*LEVELS, CUSTOM]

__all__ = ["CUSTOM", "DEFAULT_LEVEL", "LEVELS", "OUTPUT_SPACE_FACTOR", "QUALITY_OPTIONS", "REFERENCE_CFG",
           "QualityLevel"]
