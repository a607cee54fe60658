"""Step caching for diffusion transformers: the algorithms, with torch only and no ComfyUI.

- ``schedule``: where each step of a sampling run sits in the denoising (model time), and which
  step a model call belongs to.
- ``ratios``: MagCache magnitude-ratio curves, resampled to any run's steps.
- ``policies``: the skip/compute decisions of TeaCache and MagCache, per conditioning entry.
- ``run_cache``: the state of one sampling run: decisions per call, residuals per call layout.
- ``stats``: what a run computed and skipped.
"""

from .policies import CachePolicy, MagCachePolicy, TeaCachePolicy
from .ratios import MagRatios
from .run_cache import RunCache, StackCall
from .schedule import RunSchedule
from .stats import RunStats

__all__ = [
    "CachePolicy",
    "MagCachePolicy",
    "MagRatios",
    "RunCache",
    "RunSchedule",
    "RunStats",
    "StackCall",
    "TeaCachePolicy",
]
