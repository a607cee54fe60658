"""Published TeaCache rescaling polynomials (data only), numpy poly1d order (highest power first).

Numbers as published in the repositories named on each (repository@commit, file and line, also
kept as each one's ``source``). Each polynomial maps the relative L1 change of the
signal it was fitted on; the family module computes that same signal.
"""

from __future__ import annotations

from .base import TeaCacheCoefficients

_TEACACHE = "ali-vilab/TeaCache@7c10efc"
_COMFY_TEACACHE = "welltop-cn/ComfyUI-TeaCache@91dff8e"

# Signal: first double block's modulated image input.
FLUX = TeaCacheCoefficients(
    (4.98651651e02, -2.83781631e02, 5.58554382e01, -3.82021401e00, 2.64230861e-01),
    source=f"{_TEACACHE} TeaCache4FLUX/teacache_flux.py:L113",
)
FLUX_KONTEXT = TeaCacheCoefficients(
    (-1.04655119e03, 3.12563399e02, -1.69500694e01, 4.10995971e-01, 3.74537863e-02),
    source=f"{_COMFY_TEACACHE} nodes.py:L19 (flux-kontext)",
)
HUNYUAN_VIDEO = TeaCacheCoefficients(
    (7.33226126e02, -4.01131952e02, 6.75869174e01, -3.14987800e00, 9.61237896e-02),
    source=f"{_TEACACHE} TeaCache4HunyuanVideo/teacache_sample_video.py:L102",
)
# Signal: first block's modulated input (rms-normed, scale_shift_table + timestep).
LTXV = TeaCacheCoefficients(
    (2.14700694e01, -1.28016453e01, 2.31279151e00, 7.92487521e-01, 9.69274326e-03),
    source=f"{_TEACACHE} TeaCache4LTX-Video/teacache_ltx.py:L72",
)
# Signal: first block's modulated video input, rms_norm(x) * (1 + scale) (no shift), fitted at 64
# steps on mochi-1-preview (diffusers' MochiTransformer3DModel, the same block as ComfyUI's).
MOCHI = TeaCacheCoefficients(
    (-3.51241319e03, 8.11675948e02, -6.09400215e01, 2.42429681e00, 3.05291719e-03),
    source=f"{_TEACACHE} TeaCache4Mochi/teacache_mochi.py:L70",
)
# Wan 2.1 "ret" (retention) mode: signal e0, the projected time modulation that ComfyUI hands the
# blocks as ``vec``; the reference script always computes the first 5 of 50 steps.
WAN21_T2V_1_3B = TeaCacheCoefficients(
    (-5.21862437e04, 9.23041404e03, -5.28275948e02, 1.36987616e01, -4.99875664e-02),
    source=f"{_TEACACHE} TeaCache4Wan2.1/teacache_generate.py:L883 (ret mode)", warmup=0.1,
)
WAN21_T2V_14B = TeaCacheCoefficients(
    (-3.03318725e05, 4.90537029e04, -2.65530556e03, 5.87365115e01, -3.15583525e-01),
    source=f"{_TEACACHE} TeaCache4Wan2.1/teacache_generate.py:L885 (ret mode)", warmup=0.1,
)
WAN21_I2V_480P = TeaCacheCoefficients(
    (2.57151496e05, -3.54229917e04, 1.40286849e03, -1.35890334e01, 1.32517977e-01),
    source=f"{_TEACACHE} TeaCache4Wan2.1/teacache_generate.py:L967 (ret mode)", warmup=0.1,
)
WAN21_I2V_720P = TeaCacheCoefficients(
    (8.10705460e03, 2.13393892e03, -3.72934672e02, 1.66203073e01, -4.17769401e-02),
    source=f"{_TEACACHE} TeaCache4Wan2.1/teacache_generate.py:L969 (ret mode)", warmup=0.1,
)
