"""Calibrations on disk: tied to a model by a fingerprint of its weights, found again by it.

Files live in ComfyUI's user directory, ``<user>/stepcache/calibrations/<method>-<family>-<fingerprint>.json``,
one per model and method (a newer calibration replaces the older one).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pathlib
import tempfile

import torch

from .. import families
from ..cache_core.calibration import Calibration, CalibrationError, ModelIdentity
from ..cache_core.methods import CALIBRATED_METHODS

LOGGER = logging.getLogger("stepcache")
_SAMPLED_TENSORS = 16
_SAMPLED_VALUES = 256


def weights_fingerprint(diffusion_model: torch.nn.Module) -> str:
    """A hash of every parameter's name and shape, and of values sampled across the weights.

    Cheap enough for node time: a few thousand values are read, never the whole model.
    """
    digest = hashlib.sha256()
    state = list(diffusion_model.state_dict().items())
    for name, tensor in state:
        digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype};".encode())
    for name, tensor in state[:: max(1, len(state) // _SAMPLED_TENSORS)]:
        flat = tensor.detach().reshape(-1)
        sample = flat[:: max(1, flat.numel() // _SAMPLED_VALUES)][:_SAMPLED_VALUES]
        digest.update(name.encode())
        digest.update(sample.to(device="cpu", dtype=torch.float32).numpy().tobytes())
    return digest.hexdigest()


def hidden_size(diffusion_model: torch.nn.Module) -> int:
    for attribute in ("hidden_size", "dim", "inner_dim", "model_channels"):
        value = getattr(diffusion_model, attribute, None)
        if isinstance(value, int):
            return value
    return 0


def model_identity(model: object, family: families.Family, variant: str) -> ModelIdentity:
    """``model`` is a ComfyUI ModelPatcher."""
    diffusion_model = model.model.diffusion_model
    return ModelIdentity(
        family=family.name, variant=variant, model_class=type(model.model).__name__,
        hidden_size=hidden_size(diffusion_model), fingerprint=weights_fingerprint(diffusion_model),
    )


def calibrations_directory() -> pathlib.Path:
    import folder_paths

    return pathlib.Path(folder_paths.get_user_directory()) / "stepcache" / "calibrations"


def calibration_path(method: str, identity: ModelIdentity) -> pathlib.Path:
    return calibrations_directory() / f"{method}-{identity.family}-{identity.fingerprint[:16]}.json"


def save(calibration: Calibration) -> pathlib.Path:
    path = calibration_path(calibration.method, calibration.model)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Write then rename, so a crash never leaves half a file to be found later.
    handle, temporary = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(handle, "w") as out:
        json.dump(calibration.to_json(), out, indent=1)
    os.replace(temporary, path)
    return path


def find(method: str, identity: ModelIdentity) -> Calibration | None:
    """The saved calibration of this model, if any (an unreadable file is reported and ignored)."""
    path = calibration_path(method, identity)
    if not path.is_file():
        return None
    try:
        calibration = Calibration.from_json(json.loads(path.read_text()))
    except (OSError, json.JSONDecodeError, CalibrationError) as error:
        LOGGER.warning("[StepCache] ignoring the saved calibration %s: %s", path, error)
        return None
    if calibration.method != method or calibration.model.mismatch(identity) is not None:
        LOGGER.warning("[StepCache] ignoring the saved calibration %s: it belongs to another model", path)
        return None
    try:
        CALIBRATED_METHODS[method].check_calibration(calibration)
    except CalibrationError as error:
        LOGGER.warning("[StepCache] ignoring the saved calibration %s: %s", path, error)
        return None
    return calibration
