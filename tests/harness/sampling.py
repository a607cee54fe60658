"""In-process helpers: sample tiny models with ComfyUI's real samplers, apply the pack's nodes.

Import after ``host.boot()`` (the ``host`` fixture): this module imports ComfyUI.
"""

from __future__ import annotations

import inspect
import itertools
from dataclasses import dataclass, field
from typing import Any

import comfy.sample
import comfy.samplers
import nodes
import torch

from . import host as host_module

_node_ids = itertools.count(1)


def tiny() -> Any:
    return host_module.boot().test_module("tiny_models")


def test_nodes() -> Any:
    """The test-only node package (tests/harness/comfy_test_nodes) as ComfyUI loaded it."""
    return host_module.boot().test_nodes


def pack(dotted: str) -> Any:
    return host_module.boot().pack_module(dotted)


@dataclass
class Job:
    """One sampling run of a tiny family; fields are KSampler's inputs."""

    family: str
    seed: int = 42
    steps: int = 12
    cfg: float = 3.0
    sampler: str = "euler"
    scheduler: str = "simple"
    denoise: float = 1.0
    batch: int = 1
    scale: int = 1
    frames: int | None = None
    positive_seed: int = 1
    negative_seed: int = 2
    extra: dict = field(default_factory=dict)
    # A ControlNet on both prompts (ControlNetApplyAdvanced, an RGB hint), its start and end percent.
    controlnet: Any = None
    control_percent: tuple[float, float] = (0.0, 1.0)

    def latent(self) -> dict:
        return tiny().empty_latent(self.family, self.batch, self.scale, self.frames)

    def conds(self) -> tuple[list, list]:
        t = tiny()
        positive = t.conditioning(self.family, self.positive_seed, self.batch)
        negative = t.conditioning(self.family, self.negative_seed, self.batch)
        if self.controlnet is None:
            return positive, negative
        latent = self.latent()["samples"]
        hint = torch.rand(latent.shape[0], latent.shape[-2] * 8, latent.shape[-1] * 8, 3,
                          generator=torch.Generator().manual_seed(self.seed))
        return tuple(nodes.ControlNetApplyAdvanced().apply_controlnet(positive, negative, self.controlnet, hint, 0.3,
                                                                      *self.control_percent)[:2])

    def run(self, model: Any) -> torch.Tensor:
        """KSampler (nodes.common_ksampler)."""
        positive, negative = self.conds()
        return nodes.common_ksampler(
            model, self.seed, self.steps, self.cfg, self.sampler, self.scheduler, positive, negative,
            self.latent(), denoise=self.denoise,
        )[0]["samples"]

    def run_advanced(self, model: Any, start: int, end: int, add_noise: bool = True,
                     leftover_noise: bool = False, latent: dict | None = None) -> torch.Tensor:
        """KSamplerAdvanced: steps [start, end) of ``steps``."""
        positive, negative = self.conds()
        return nodes.common_ksampler(
            model, self.seed, self.steps, self.cfg, self.sampler, self.scheduler, positive, negative,
            latent or self.latent(), denoise=1.0, disable_noise=not add_noise, start_step=start,
            last_step=end, force_full_denoise=not leftover_noise,
        )[0]["samples"]

    def run_sigmas(self, model: Any, sigmas: torch.Tensor) -> torch.Tensor:
        """SamplerCustom with an explicit sigma schedule."""
        positive, negative = self.conds()
        latent = self.latent()["samples"]
        noise = comfy.sample.prepare_noise(latent, self.seed)
        sampler = comfy.samplers.sampler_object(self.sampler)
        return comfy.sample.sample_custom(model, noise, self.cfg, sampler, sigmas, positive, negative, latent,
                                          seed=self.seed)


# The mechanics tests run the published methods (reuse, no check) unless they choose an estimator or
# a check: ApplyMagCache's own defaults (damped forecast + hindsight check) refuse the forced skips
# those tests make on purpose. tests/test_defaults.py, the example workflows and the fuzz run them.
PUBLISHED_METHOD = dict(estimator="reuse", check="off")
NODE_DEFAULTS = {
    "teacache": dict(threshold=0.4, start_percent=0.0, end_percent=1.0, max_consecutive_skips=3,
                     cache_device="main_device", **PUBLISHED_METHOD),
    "magcache": dict(threshold=0.06, max_consecutive_skips=2, retention_ratio=0.2, cache_device="main_device",
                     **PUBLISHED_METHOD),
}


def node_clone(node: Any, hidden: dict[str, Any]) -> Any:
    """``node.PREPARE_CLASS_CLONE`` called as ComfyUI's executor calls it: with the node's V3 data
    (``{"hidden_inputs": ...}``) where it takes ``v3_data`` (ComfyUI 0.30.0), with the hidden
    inputs themselves where it takes ``hidden_inputs`` (0.3.75)."""
    if "v3_data" in inspect.signature(node.PREPARE_CLASS_CLONE).parameters:
        return node.PREPARE_CLASS_CLONE({"hidden_inputs": hidden})
    return node.PREPARE_CLASS_CLONE(hidden)


def schema_defaults(node: Any) -> dict[str, Any]:
    """A V3 node's inputs as a node placed in the UI has them: every input with a default."""
    return {i.id: i.default for i in node.GET_SCHEMA().inputs if getattr(i, "default", None) is not None}


def execute_node(node: Any, **inputs: Any) -> Any:
    """Run a V3 node's ``execute`` with these inputs and every other input at its schema default
    (inputs a newer ComfyUI adds, such as ContextWindowsManual's ``freenoise``, keep the default
    behaviour). Returns the node's outputs."""
    for schema_input in node.GET_SCHEMA().inputs:
        if schema_input.id not in inputs and not schema_input.optional:
            if getattr(schema_input, "default", None) is None:
                raise TypeError(f"{node.__name__}: input {schema_input.id!r} has no default; pass it")
            inputs[schema_input.id] = schema_input.default
    return node_clone(node, {}).execute(**inputs).result


def apply(model: Any, method: str, **inputs: Any) -> tuple[Any, str]:
    """Run ApplyTeaCache/ApplyMagCache's execute as ComfyUI does; returns (MODEL, node id)."""
    apply_nodes = pack("nodes.apply_nodes")
    node = {"teacache": apply_nodes.ApplyTeaCache, "magcache": apply_nodes.ApplyMagCache}[method]
    node_id = f"test-{next(_node_ids)}"
    clone = node_clone(node, {"UNIQUE_ID": node_id})
    return clone.execute(model, **{**NODE_DEFAULTS[method], **inputs}).result[0], node_id


def calibrate(node_name: str, model: Any, job: Job, save: bool = False, **extra: Any) -> tuple[Any, Any, str]:
    """Run MagCacheCalibrate/TeaCacheCalibrate's execute on ``job``; returns (samples, calibration, report)."""
    node = getattr(pack("nodes.calibrate_nodes"), node_name)
    positive, negative = job.conds()
    latent, calibration, report = node.execute(
        model, job.seed, job.steps, job.cfg, job.sampler, job.scheduler, positive, negative, job.latent(),
        job.denoise, save, **extra).result
    return latent["samples"], calibration, report


# CacheSettings fields; every other keyword of ``install`` belongs to the method's settings object.
RUN_SETTINGS = ("variant", "cache_device", "record_trace")


def published_variant(model: Any, method: str = "magcache") -> str:
    """A variant of the model's family with published constants for ``method``. Tiny models are no
    published checkpoint, so a test that wants a published table chooses it by name, as a user
    does for a fine-tune."""
    family = pack("families").family_for(model.model)
    return next(v.name for v in family.variants if v.published(method) is not None)


def install(model: Any, method: str, **settings: Any) -> tuple[Any, str]:
    """Install with explicit settings (tests that need knobs the nodes do not expose): ``method``
    "teacache", "magcache" or "calibration" (a calibration's run, without a recorder), keywords of its
    cache_core.methods config or of CacheSettings."""
    runtime = pack("nodes.runtime")
    methods = pack("cache_core.methods")
    family = pack("families").family_for(model.model)
    node_id = f"test-{next(_node_ids)}"
    config_class = {"teacache": methods.TeaCacheConfig, "magcache": methods.MagCacheConfig,
                    "calibration": methods.CalibrationRunConfig}[method]
    run_settings = {k: settings.pop(k) for k in RUN_SETTINGS if k in settings}
    cache_settings = runtime.CacheSettings(method=config_class(**settings), family=family.name, node_id=node_id,
                                           **run_settings)
    return runtime.install(model, cache_settings, family), node_id


def stats(node_id: str) -> dict:
    """The statistics of the node's most recent run."""
    return pack("nodes.reporting").LAST_RUN_STATS[node_id]


def patterns(node_id: str) -> dict[str, str]:
    return {b["branch"]: b["pattern"] for b in stats(node_id)["branches"]}


def uniform_sigmas(model: Any, steps: int) -> torch.Tensor:
    """A schedule whose steps sit exactly at progress i/steps (as published tables assume)."""
    sampling = model.get_model_object("model_sampling")
    return torch.tensor([float(sampling.percent_to_sigma(i / steps)) for i in range(steps)] + [0.0])
