"""The pack's own socket types."""

from __future__ import annotations

from comfy_api.latest import io

# A MagCache calibration (cache_core.calibration.Calibration) or a plain MagRatios table.
MagRatiosType = io.Custom("MAG_RATIOS")
# A TeaCache calibration (Calibration) or a plain tuple of polynomial coefficients.
TeaCacheCoefficientsType = io.Custom("TEACACHE_COEFFICIENTS")

CATEGORY = "sampling/step cache"
