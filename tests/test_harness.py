"""The harness is real: ComfyUI's own modules, samplers and custom-node loader."""

from __future__ import annotations

import sys

import pytest
import torch


def test_comfyui_is_the_real_host(host):
    import comfy.model_patcher
    import comfyui_version
    import nodes

    assert comfyui_version.__version__ == "0.3.75"
    assert str(host_module_root()) in comfy.model_patcher.__file__
    assert "EasyCache" in nodes.NODE_CLASS_MAPPINGS  # built-in extra nodes loaded
    assert "StepCacheTestTinyModel" in nodes.NODE_CLASS_MAPPINGS  # custom nodes loaded
    assert host.pack.__file__.endswith("__init__.py")


def host_module_root():
    from harness.host import comfyui_dir

    return comfyui_dir()


@pytest.mark.parametrize("family", ["flux", "wan21"])
def test_real_sampling_on_tiny_family(host, family):
    import nodes

    tiny = host.test_module("tiny_models")
    model = tiny.build_model(family, seed=0)
    positive = tiny.conditioning(family, seed=1)
    negative = tiny.conditioning(family, seed=2)
    latent = tiny.empty_latent(family)

    def run():
        return nodes.common_ksampler(model, 42, 4, 3.0, "euler", "simple", positive, negative, latent)[0]["samples"]

    first, second = run(), run()
    assert first.shape == latent["samples"].shape
    assert torch.isfinite(first).all()
    assert first.abs().sum() > 0
    assert torch.equal(first, second)
    assert "comfy" in sys.modules
