"""The harness is real: ComfyUI's own modules, samplers and custom-node loader."""

from __future__ import annotations


def test_comfyui_is_the_real_host(host):
    import comfy.model_patcher
    import comfyui_version
    import nodes

    from harness.host import comfyui_version as tree_version

    assert comfyui_version.__version__ == tree_version()  # the tree COMFYUI_DIR names, nothing else
    assert str(host_module_root()) in comfy.model_patcher.__file__
    assert "EasyCache" in nodes.NODE_CLASS_MAPPINGS  # built-in extra nodes loaded
    assert "StepCacheTestTinyModel" in nodes.NODE_CLASS_MAPPINGS  # custom nodes loaded
    assert host.pack.__file__.endswith("__init__.py")


def host_module_root():
    from harness.host import comfyui_dir

    return comfyui_dir()
