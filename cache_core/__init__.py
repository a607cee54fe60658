"""Step caching for diffusion transformers: the algorithms, with torch only and no ComfyUI.

- ``schedule``: where each step of a sampling run sits in the denoising (model time), and which
  step a model call belongs to.
- ``ratios``: MagCache magnitude-ratio curves, resampled to any run's steps.
- ``estimators``: what a skipped call returns (reuse, forecast, damped forecast), one module each.
- ``policies``: the skip/compute decisions of TeaCache, MagCache and the measured-error rule, per
  conditioning entry, with an error estimate that follows the estimator.
- ``checks``: checks against real computation that can refuse a skip (hindsight, first block).
- ``measurement``: the estimator's error, measured at every computed call that needs it (the
  hindsight check and the measured-error rule read it).
- ``quality``: the quality levels, the one knob of both Apply nodes (settings of the measured rule).
- ``planning``: the planned rule: skip errors measured by a calibration, an error model over model
  time fitted to them, and the computed steps of a run chosen against an error budget.
- ``methods``: one settings object per method, building its run's policy and estimator.
- ``feedback``: a skip's error, estimated once the next call computes, taken back out of the
  sample there (single-step samplers, found by running the sampler on scalars).
- ``history``: the residuals each entry keeps, and the estimate of a skipped call.
- ``run_cache``: the state of one sampling run: decisions per call, residuals per entry.
- ``stats``: what a run computed and skipped.
"""

from .estimators import ESTIMATORS, Estimator, EstimatorSpec
from .methods import CalibrationRunConfig, MagCacheConfig, MethodConfig, TeaCacheConfig
from .policies import CachePolicy, MagCachePolicy, TeaCachePolicy
from .ratios import MagRatios
from .run_cache import RunCache, StackCall
from .schedule import RunSchedule
from .stats import RunStats

__all__ = [
    "ESTIMATORS",
    "CachePolicy",
    "CalibrationRunConfig",
    "Estimator",
    "EstimatorSpec",
    "MagCacheConfig",
    "MagCachePolicy",
    "MagRatios",
    "MethodConfig",
    "RunCache",
    "RunSchedule",
    "RunStats",
    "StackCall",
    "TeaCacheConfig",
    "TeaCachePolicy",
]
