"""StepCache benchmark: the pack's TeaCache/MagCache against uncached sampling and ComfyUI's
native EasyCache/LazyCache, in one process of the real ComfyUI (see benchmark/run.py).

Modules import ComfyUI, so import them only after ``harness.host.boot()``.
"""
