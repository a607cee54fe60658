"""The pack's node interface as saved workflows see it: ids, input names, outputs, help texts.

Saved workflows and API graphs refer to nodes by id and to inputs by name. The snapshot below is the
promise: renaming or removing an input breaks users' files, so it must fail here first (adding an
optional input is fine: extend the snapshot).
"""

from __future__ import annotations

import pytest

ESTIMATOR_INPUTS = ["estimator", "forecast_order", "forecast_damping", "cfg_branches", "check", "check_tolerance"]
MAX_TOOLTIP = 260
INTERFACE = {
    "ApplyTeaCache": (["model", "threshold", "start_percent", "end_percent", "max_consecutive_skips",
                       "cache_device"], ["variant", "coefficients", *ESTIMATOR_INPUTS, "quality"], ["MODEL"]),
    "ApplyMagCache": (["model", "threshold", "max_consecutive_skips", "retention_ratio", "cache_device"],
                      ["variant", "ratios", *ESTIMATOR_INPUTS, "skip_rule", "quality"], ["MODEL"]),
    "MagCacheCalibrate": (["model", "seed", "steps", "cfg", "sampler_name", "scheduler", "positive", "negative",
                           "latent_image", "denoise", "save_calibration"], [], ["LATENT", "MAG_RATIOS", "STRING"]),
    "TeaCacheCalibrate": (["model", "seed", "steps", "cfg", "sampler_name", "scheduler", "positive", "negative",
                           "latent_image", "denoise", "save_calibration"], ["add_to"],
                          ["LATENT", "TEACACHE_COEFFICIENTS", "STRING"]),
    "MagCacheRatiosFromText": (["text", "calibrated_steps", "interleaved"], [], ["MAG_RATIOS"]),
    "TeaCacheCoefficientsFromText": (["text"], [], ["TEACACHE_COEFFICIENTS"]),
    "StepCacheCompileBlocks": (["model", "backend"], [], ["MODEL"]),
    "StepCacheDemoModel": (["kind"], [], ["MODEL"]),
    "StepCacheDemoPrompt": (["kind", "subject", "batch_size"], [], ["CONDITIONING"]),
    "StepCacheDemoLatent": (["kind", "batch_size", "frames"], [], ["LATENT"]),
    "StepCacheDemoDecode": (["samples"], [], ["IMAGE"]),
}


@pytest.fixture(scope="module")
def pack_nodes(host):
    import nodes

    return {name: cls for name, cls in nodes.NODE_CLASS_MAPPINGS.items()
            if getattr(cls, "RELATIVE_PYTHON_MODULE", "").endswith("comfyui-stepcache")}


def test_the_pack_registers_exactly_these_nodes(pack_nodes):
    assert sorted(pack_nodes) == sorted(INTERFACE)


@pytest.mark.parametrize("node_id", sorted(INTERFACE))
def test_inputs_and_outputs_keep_their_names(pack_nodes, node_id):
    required, optional, outputs = INTERFACE[node_id]
    spec = pack_nodes[node_id].INPUT_TYPES()
    assert list(spec["required"]) == required
    assert list(spec.get("optional", {})) == optional
    assert list(pack_nodes[node_id].RETURN_TYPES) == outputs


@pytest.mark.parametrize("node_id", sorted(INTERFACE))
def test_every_node_and_input_explains_itself(pack_nodes, node_id):
    node = pack_nodes[node_id]
    schema = node.GET_SCHEMA()
    assert schema.display_name and schema.category.startswith("sampling/step cache")
    assert schema.description or node_id == "StepCacheDemoLatent"
    spec = node.INPUT_TYPES()
    for section in ("required", "optional"):
        for name, (_, options) in ((k, (v[0], v[1] if len(v) > 1 else {})) for k, v in spec.get(section, {}).items()):
            assert options.get("tooltip"), f"{node_id}.{name} has no tooltip"
            # A tooltip says what the input does in a sentence or two; history goes in the docs.
            assert len(options["tooltip"]) <= MAX_TOOLTIP, f"{node_id}.{name}: {len(options['tooltip'])} characters"


def test_a_node_id_taken_by_another_pack_is_reported(host, monkeypatch, caplog):
    import nodes

    pack = host.pack_module("nodes")

    class OtherPacksCalibrate:
        RELATIVE_PYTHON_MODULE = "custom_nodes.some-other-magcache-pack"

    monkeypatch.setitem(nodes.NODE_CLASS_MAPPINGS, "MagCacheCalibrate", OtherPacksCalibrate)
    monkeypatch.delitem(nodes.NODE_CLASS_MAPPINGS, "ApplyMagCache")
    with caplog.at_level("WARNING", logger="stepcache"):
        pack.warn_about_taken_node_ids([pack.ApplyMagCache, *pack.CALIBRATION_NODES])
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "MagCacheCalibrate" in warnings[0] and "some-other-magcache-pack" in warnings[0]


# Every variant option the Apply nodes have offered (git history of families/ since the first
# release). A saved workflow holding one must still validate: removing one breaks users' files.
EVER_OFFERED_VARIANTS = {
    "ApplyTeaCache": ["auto", "flux.1-dev", "flux.1-schnell", "flux.1-kontext", "wan2.1-t2v-1.3b", "wan2.1-t2v-14b",
                      "wan2.1-i2v-480p", "wan2.1-i2v-720p", "wan2.1-vace-1.3b", "wan2.1-vace-14b",
                      "hunyuanvideo-720p", "hunyuanvideo-544p", "ltx-video", "mochi-1-preview"],
    "ApplyMagCache": ["auto", "flux.1-dev", "flux.1-schnell", "flux.1-kontext", "chroma", "wan2.1-t2v-1.3b",
                      "wan2.1-t2v-14b", "wan2.1-i2v-480p", "wan2.1-i2v-720p", "wan2.1-vace-1.3b", "wan2.1-vace-14b",
                      "wan2.2-t2v-a14b", "wan2.2-i2v-a14b", "wan2.2-ti2v-5b-t2v", "wan2.2-ti2v-5b-i2v",
                      "hunyuanvideo-720p", "hunyuanvideo-544p", "hunyuanvideo1.5-20step", "hunyuanvideo1.5-40step",
                      "qwen-image", "qwen-image-edit"],
}


@pytest.mark.parametrize("node_id", sorted(EVER_OFFERED_VARIANTS))
def test_every_variant_option_ever_offered_is_still_offered(pack_nodes, node_id):
    spec = pack_nodes[node_id].INPUT_TYPES()["optional"]["variant"]
    options = spec[0] if isinstance(spec[0], list) else spec[1]["options"]
    missing = [name for name in EVER_OFFERED_VARIANTS[node_id] if name not in options]
    assert not missing, f"{node_id}: saved workflows holding {missing} no longer validate"
