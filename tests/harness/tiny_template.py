"""Write the template of a tiny model (demo/model_builder.py's ``Template``) from a small config.

Authoring only: this is the one place that calls a model class's constructor with a
hand-written config, once, to learn the checkpoint keys and shapes of a small instance. What it
writes is version-independent (keys and shapes in the checkpoint format, plus the overlay of
sizes ComfyUI's detection cannot see); the tests then build the model from the template through
detection, like a user's checkpoint. ::

    STEPCACHE_COMFYUI=0.3.75 ./dev py -m harness.tiny_template WAN21_T2V \\
        '{"image_model": "wan2.1", "model_type": "t2v", "dim": 128, ...}' \\
        > tests/harness/comfy_test_nodes/templates/<family>.json

Run it on the oldest supported ComfyUI that has the class: its module keys are the checkpoint
format (newer versions rename some, e.g. Flux's ``.scale`` -> ``.weight`` in 0.30.0, and only
accept the old names through their load-time conversion). It checks that the template builds,
through detection and the overlay, into a model with exactly the shapes it came from.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from harness import host as host_module


def author(config_class: str, unet_config: dict[str, Any], explicit_class: bool = False) -> Any:
    """The Template of ``config_class(unet_config)``; the class is kept in the template only when
    ``explicit_class`` (otherwise detection must find it, which is checked)."""
    builder = host_module.boot().pack_module("demo.model_builder")
    import comfy.model_detection
    import comfy.supported_models
    import torch

    config = getattr(comfy.supported_models, config_class)(dict(unet_config))
    config.set_inference_dtype(torch.float32, None)
    module_state = config.get_model({}, "").diffusion_model.state_dict()
    detected = comfy.model_detection.detect_unet_config(dict(module_state), "") or {}
    overlay = {k: v for k, v in unet_config.items() if _plain(detected.get(k, _ABSENT)) != _plain(v)}
    template = builder.template_of(module_state, overlay, config_class if explicit_class else None)
    model = builder.build_from_template(template, seed=0)
    if type(model.model.model_config).__name__ != config_class:
        raise SystemExit(f"detection picks {type(model.model.model_config).__name__}, not {config_class}: "
                         "pass --explicit-class if that is intended")
    built = {k: tuple(v.shape) for k, v in model.model.diffusion_model.state_dict().items()}
    if sorted(built.values()) != sorted(template.shapes.values()):
        raise SystemExit("the model built from the template has other shapes than the one it came from")
    return template


_ABSENT = object()


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def main(argv: list[str]) -> int:
    explicit = "--explicit-class" in argv
    args = [a for a in argv if a != "--explicit-class"]
    if len(args) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    sys.stdout.write(author(args[0], json.loads(args[1]), explicit).to_json())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
