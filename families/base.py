"""What the cache needs to know about one model family, as ComfyUI implements it.

A family module (one per family, beside this file) declares:

- which ``comfy.model_base`` classes it covers (matched by the model's exact class name);
- its block stack as ComfyUI exposes it to ``patches_replace["dit"]``: the block keys in execution
  order, and for single-stream blocks whether the stream is ``txt_img`` or ``img_txt``;
  a family with no block keys is cached in output space through the DIFFUSION_MODEL wrapper;
- the TeaCache signal: the first block's modulated input (or what the published coefficients
  were fitted on), computed from the head block's arguments;
- its variants: the checkpoints it knows, their published constants, and the class and shape
  (``Architecture``) those constants were measured on. A model gets published constants only when
  it has that class and shape; any other model of the family is the family's generic variant,
  which has none (TeaCache then runs on the unscaled signal, MagCache needs a calibration).

Nothing here runs per block except ``teacache_signal``, once per call at the head.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from ..cache_core.ratios import MagRatios

BlockKey = tuple[str, int]
METHOD_CONSTANTS = {"teacache": "coefficients", "magcache": "ratios"}


@dataclass(frozen=True)
class TeaCacheCoefficients:
    """A published TeaCache rescaling polynomial (numpy poly1d order) and where it comes from."""

    values: tuple[float, ...]
    source: str
    # Leading fraction of the denoising that always computes, as the coefficients were fitted
    # (e.g. Wan 2.1 "ret" mode computes its first 5 of 50 steps).
    warmup: float = 0.0


@dataclass(frozen=True)
class Architecture:
    """The ComfyUI model class and the shape of a published checkpoint: what its constants fit.

    ``shape`` holds the entries of the family's ``shape()`` that must be equal (widths, depths,
    input channels, embeddings present).
    """

    model_class: str
    shape: Mapping[str, object]

    def matches(self, model_class: str, shape: Mapping[str, object]) -> bool:
        return model_class == self.model_class and all(shape.get(k) == v for k, v in self.shape.items())


@dataclass(frozen=True)
class Variant:
    """One kind of model of a family: a published checkpoint (with the constants published for it,
    if any), or the family's generic variant for models that are none of them.

    ``name`` is what the Apply nodes' ``variant`` input and the statistics' label show;
    ``description`` replaces it in the label where the name alone would not say what the model is.
    """

    name: str
    checkpoint: str = ""  # the published checkpoint, as its constants' sources name it
    architecture: Architecture | None = None
    teacache: TeaCacheCoefficients | None = None
    magcache: MagRatios | None = None
    description: str = ""
    # Never detected: its architecture is another variant's too (Wan 2.2 A14B and Wan 2.1 14B),
    # so only the variant input names it.
    by_name_only: bool = False

    def __post_init__(self) -> None:
        if (self.teacache or self.magcache) and (self.architecture is None or not self.checkpoint):
            raise ValueError(f"variant {self.name}: published constants need the checkpoint and the "
                             "architecture they were measured on")

    @property
    def label(self) -> str:
        return self.description or self.name

    def published(self, method: str) -> TeaCacheCoefficients | MagRatios | None:
        return {"teacache": self.teacache, "magcache": self.magcache}.get(method)

    def describe_published(self, method: str) -> str | None:
        """E.g. "published FLUX.1-dev ratios (Zehong-Ma/MagCache)"; None when there are none."""
        constants = self.published(method)
        if constants is None:
            return None
        repository = constants.source.split("@", 1)[0]
        return f"published {self.checkpoint} {METHOD_CONSTANTS[method]} ({repository})"


@dataclass(frozen=True)
class RunContext:
    """What is known of a sampling run when its variant is chosen (all None at node time)."""

    conds: Mapping[str, Sequence[dict]] | None = None  # the guider's conditioning, by name
    latent_shape: tuple[int, ...] | None = None
    steps: int | None = None
    has_denoise_mask: bool = False

    def has_cond_key(self, key: str) -> bool:
        return bool(self.conds) and any(key in c for entries in self.conds.values() for c in entries or ())


@dataclass(frozen=True)
class Family:
    name: str
    model_classes: tuple[str, ...]
    variants: tuple[Variant, ...] = ()
    # Layout of the single-block stream, when the family has single blocks.
    single_stream: str | None = None
    # Model classes that are one kind of checkpoint of their own, by class name -> variant name.
    class_variants: Mapping[str, str] = field(default_factory=dict)
    # What the generic variant calls the family's architecture, e.g. "flux-architecture model".
    architecture_name: str = ""
    # Variant options the Apply nodes once offered and no longer do (saved workflows may hold them),
    # by method: old name -> the variant whose published constants the old option used.
    legacy_variants: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    generic: Variant = field(init=False, repr=False, compare=False)
    # The diffusion model's ModuleList behind each kind of block key, in execution order: the block
    # stack (``block_keys``) and the modules Compile Blocks compiles.
    block_lists: ClassVar[Mapping[str, str]] = {"double_block": "double_blocks", "single_block": "single_blocks"}
    # Where ComfyUI adds a ControlNet's outputs: after block i of a kind, entry i of this list of the
    # control dict. Empty: the cache cannot keep them apart from the residual (ControlNet refused).
    control_lists: ClassVar[Mapping[str, str]] = {}
    _variants_by_name: dict[str, Variant] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        generic = Variant(f"{self.name}-architecture", description=(
            f"{self.architecture_name or self.name + '-architecture model'} (not a published checkpoint)"))
        object.__setattr__(self, "generic", generic)
        object.__setattr__(self, "_variants_by_name", {v.name: v for v in (*self.variants, generic)})
        for method, renamed in self.legacy_variants.items():
            for old, new in renamed.items():
                if self.variant(new).published(method) is None:
                    raise ValueError(f"{self.name}: legacy {method} variant {old} maps to {new}, which has no "
                                     f"published {METHOD_CONSTANTS[method]}")

    def variant(self, name: str) -> Variant:
        return self._variants_by_name[name]

    @property
    def variant_names(self) -> tuple[str, ...]:
        return tuple(self._variants_by_name)

    def resolve_variant(self, model: torch.nn.Module, run: RunContext) -> Variant:
        """What ``model`` (ComfyUI's BaseModel) is: the detected variant where the model has the
        class and shape that variant's constants were measured on, else the generic variant."""
        variant = self.variant(self.detect_variant(model, run))
        if variant.architecture is None or self.has_architecture(model, variant):
            return variant
        return self.generic

    def has_architecture(self, model: torch.nn.Module, variant: Variant) -> bool:
        architecture = variant.architecture
        return architecture is not None and architecture.matches(type(model).__name__,
                                                                  self.shape(model.diffusion_model))

    def possible_variants(self, model: torch.nn.Module) -> tuple[Variant, ...]:
        """The variants ``model`` may be detected as in some run (its class and shape fit them)."""
        fitting = [v for v in self.variants
                   if not v.by_name_only and (v.architecture is None or self.has_architecture(model, v))]
        return (*fitting, self.generic)

    # Overridden per family ---------------------------------------------------------------

    def detect_variant(self, model: torch.nn.Module, run: RunContext) -> str:
        """The variant a loaded model would be (``model`` is ComfyUI's BaseModel); ``run`` adds
        what the sampling run shows, e.g. a reference latent tells FLUX Kontext from dev.
        ``resolve_variant`` then checks the model's class and shape against it."""
        default = self.variants[0].name if self.variants else self.generic.name
        return self.class_variants.get(type(model).__name__, default)

    def shape(self, diffusion_model: torch.nn.Module) -> dict[str, object]:
        """Widths, depths and inputs of a model, to compare with published architectures."""
        return {}

    def block_keys(self, diffusion_model: torch.nn.Module) -> list[BlockKey]:
        """The ``patches_replace["dit"]`` keys of the block stack, in execution order: every block
        of each of ``block_lists`` (in its order) that the model has. A family that leaves blocks
        out (Chroma's pruned ones) overrides this."""
        return [(kind, index) for kind, attribute in self.block_lists.items()
                for index in range(len(getattr(diffusion_model, attribute, ())))]

    def block_module_keys(self, diffusion_model: torch.nn.Module) -> list[str]:
        """Each hooked block as a key of the model object (``ModelPatcher.get_model_object``), in
        ``block_keys`` order, e.g. ``diffusion_model.double_blocks.0``."""
        return [f"diffusion_model.{self.block_lists[kind]}.{index}" for kind, index in self.block_keys(diffusion_model)]

    def teacache_signal(self, diffusion_model: torch.nn.Module, args: dict) -> torch.Tensor:
        """The TeaCache input signal for the call whose head block receives ``args``."""
        raise NotImplementedError

    def image_start(self, kind: str, stream: torch.Tensor, image_tokens: int, options: Mapping | None) -> int | None:
        """Where the image tokens start in a block's ``img`` stream; None where the stream is all
        image. Single-stream blocks also carry the text: where the host says where the image is
        (``transformer_options["img_slice"]``, set before the single blocks), that; else the
        family's layout (text first for ``txt_img``, after the image for ``img_txt``)."""
        if kind != "single_block" or self.single_stream is None:
            return None
        image_slice = options.get("img_slice") if options is not None else None
        if image_slice is not None:
            return int(image_slice[0])
        return stream.shape[1] - image_tokens if self.single_stream == "txt_img" else 0

    def image_part(self, kind: str, stream: torch.Tensor, image_tokens: int,
                   options: Mapping | None = None) -> torch.Tensor:
        """The image tokens of a block's ``img`` stream (see ``image_start``)."""
        start = self.image_start(kind, stream, image_tokens, options)
        return stream if start is None else stream[:, start:start + image_tokens]

    def with_image(self, kind: str, stream: torch.Tensor, image: torch.Tensor,
                   options: Mapping | None = None) -> torch.Tensor:
        """A block's ``img`` stream with its image tokens replaced by ``image`` (what a skipped call
        returns from the stack's last block); the inverse of ``image_part``."""
        start = self.image_start(kind, stream, image.shape[1], options)
        if start is None:
            return image
        return torch.cat((stream[:, :start], image, stream[:, start + image.shape[1]:]), dim=1)

    def control_sum(self, control: Mapping, keys: Sequence[BlockKey], like: torch.Tensor) -> torch.Tensor | None:
        """What ComfyUI adds of a ControlNet's outputs (``control``) into the image stream after
        the blocks ``keys``, summed, shaped like the stack's image stream ``like``; None if nothing.
        Each addition goes into the first tokens of the image stream, in every family's forward."""
        total = None
        for kind, index in keys:
            entries = control.get(self.control_lists.get(kind, "")) or ()
            add = entries[index] if index < len(entries) else None
            if add is None:
                continue
            if total is None:
                total = torch.zeros_like(like)
            total[:, :add.shape[1]] += add
        return total

    @property
    def caches_in_output_space(self) -> bool:
        """True when ComfyUI gives this family no block hooks (see families/output_space.py)."""
        return False


def modulate(normalized: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """adaLN modulation, (1 + scale) * x + shift: the common form of the TeaCache signal."""
    return torch.addcmul(shift, normalized, 1 + scale)


def in_features(module: torch.nn.Module | None) -> int | None:
    """Input width of a Linear (or the first Linear inside ``module``), None without one."""
    if module is None:
        return None
    for layer in module.modules():
        if isinstance(layer, torch.nn.Linear):
            return layer.in_features
        if isinstance(layer, torch.nn.modules.conv._ConvNd):
            return layer.in_channels
    return None


def image_tokens(args: dict) -> int:
    """Tokens of the sampled image in a stream that ends with reference-image tokens (ComfyUI
    records their counts in transformer_options["reference_image_num_tokens"])."""
    references = args["transformer_options"].get("reference_image_num_tokens") or ()
    return args["img"].shape[1] - sum(references)
