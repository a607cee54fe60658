"""What the cache needs to know about one model family, as ComfyUI implements it.

A family module (one per family, beside this file) declares:

- which ``comfy.model_base`` classes it covers (matched by class name, most derived first);
- its block stack as ComfyUI exposes it to ``patches_replace["dit"]``: the block keys in execution
  order, and for single-stream blocks whether the stream is ``txt_img`` or ``img_txt``;
  a family with no block keys is cached in output space through the DIFFUSION_MODEL wrapper;
- the TeaCache signal: the first block's modulated input (or what the published coefficients
  were fitted on), computed from the head block's arguments;
- its variants and their published constants, and how to tell the variant from the model.

Nothing here runs per block except ``teacache_signal``, once per call at the head.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from ..cache_core.ratios import MagRatios

BlockKey = tuple[str, int]


@dataclass(frozen=True)
class TeaCacheCoefficients:
    """A published TeaCache rescaling polynomial (numpy poly1d order) and where it comes from."""

    values: tuple[float, ...]
    source: str
    # Leading fraction of the denoising that always computes, as the coefficients were fitted
    # (e.g. Wan 2.1 "ret" mode computes its first 5 of 50 steps).
    warmup: float = 0.0


@dataclass(frozen=True)
class Variant:
    """One checkpoint kind of a family and its published constants (None: none published)."""

    name: str
    teacache: TeaCacheCoefficients | None = None
    magcache: MagRatios | None = None
    teacache_threshold: float | None = None  # published recommendation, shown in the log
    magcache_threshold: float | None = None


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
    notes: str = ""
    _variants_by_name: dict[str, Variant] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_variants_by_name", {v.name: v for v in self.variants})

    def variant(self, name: str) -> Variant:
        return self._variants_by_name[name]

    @property
    def variant_names(self) -> tuple[str, ...]:
        return tuple(self._variants_by_name)

    # Overridden per family ---------------------------------------------------------------

    def detect_variant(self, model: torch.nn.Module, run: RunContext) -> str:
        """The variant of a loaded model (``model`` is ComfyUI's BaseModel); ``run`` adds what the
        sampling run shows, e.g. a reference latent tells FLUX Kontext from dev."""
        return self.variants[0].name

    def block_keys(self, diffusion_model: torch.nn.Module) -> list[BlockKey]:
        """The ``patches_replace["dit"]`` keys of the block stack, in execution order."""
        return []

    def teacache_signal(self, diffusion_model: torch.nn.Module, args: dict) -> torch.Tensor:
        """The TeaCache input signal for the call whose head block receives ``args``."""
        raise NotImplementedError

    @property
    def caches_in_output_space(self) -> bool:
        """True when ComfyUI gives this family no block hooks (see families/output_space.py)."""
        return False


def modulate(normalized: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """adaLN modulation, (1 + scale) * x + shift: the common form of the TeaCache signal."""
    return torch.addcmul(shift, normalized, 1 + scale)
