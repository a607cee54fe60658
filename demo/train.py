"""Train a demo model on CPU, reproducibly:  ./dev train image|video [--minutes N] [--steps N]

(or ``./dev py demo/train.py image``). Writes ``demo/weights/<kind>.safetensors``.

Rectified flow exactly as ComfyUI samples Flux and Wan: the model-internal latent x0 (what
``process_latent_in`` gives inside KSampler) is noised as ``model_sampling.noise_scaling``
does, x_t = sigma * noise + (1 - sigma) * x0, with sigma drawn from the built model's own
``model_sampling`` table (the values the "simple" scheduler steps through) mixed half and half
with uniform sigmas, and the model is called through ``BaseModel.apply_model(x_t, sigma, ...)``,
which returns the denoised estimate for FLOW models. The loss is the velocity MSE,
|(x_t - denoised) / sigma - (noise - x0)|^2, i.e. the denoised error weighted by 1 / sigma^2.
The class embedding is replaced by the null embedding with probability 0.12 so that
classifier-free guidance has an unconditional model to push away from.

AdamW, linear warm-up then cosine decay, gradient clipping, an exponential moving average of the
weights (what is saved, as float16). Seeds fix the initial weights, the data stream, the noise
and the dropout; the default run is a fixed number of steps. ``--minutes`` is a safety budget:
a run that hits it stops early, says so, and is not the reproducible default.

Timing (2 shared CPU cores): image ~4.2 steps/s with 2 threads on an idle machine (3600 steps in
~15 min), ~2.6 steps/s with ``--set threads=1`` while another job holds a core (2 threads are
then much slower); the thread count changes results only by float rounding. Video: ~1-2 steps/s.

ComfyUI's transformer blocks update tensors in place (inference code), which autograd refuses;
``flow_loss`` saves a copy of every tensor autograd keeps, which keeps the gradients exact
(checked against finite differences).
"""

if __name__ == "__main__":  # run as a script: boot ComfyUI with the pack, then re-enter as demo.train
    import sys

    from harness import host  # the dev harness package (./dev puts tests/ on PYTHONPATH)

    raise SystemExit(host.boot().pack_module("demo.train").main(sys.argv[1:]))

import argparse
import contextlib
import copy
import math
import pathlib
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from . import data, models, pixels


@dataclass(frozen=True)
class TrainConfig:
    steps: int
    batch_size: int
    lr: float
    warmup: int = 100
    weight_decay: float = 0.01
    ema_decay: float = 0.999
    cond_dropout: float = 0.12
    table_fraction: float = 0.5  # share of sigmas drawn from model_sampling's table
    extra_shift: float = 1.0  # the rest: uniform t time-shifted by this (1 = uniform sigma)
    grad_clip: float = 1.0
    seed: int = 0
    threads: int = 2
    save_dtype: str = "float16"


CONFIGS = {
    "image": TrainConfig(steps=3600, batch_size=32, lr=2e-3),
    "video": TrainConfig(steps=1800, batch_size=8, lr=2e-3),
}


def to_internal(kind: str, samples: np.ndarray) -> torch.Tensor:
    x = torch.from_numpy(samples)
    return pixels.image_to_internal(x) if kind == "image" else pixels.video_to_internal(x)


def draw_sigmas(model_sampling, n: int, table_fraction: float, gen: torch.Generator,
                extra_shift: float = 1.0) -> torch.Tensor:
    """Mixture: ``model_sampling.sigmas`` at uniform indices (the schedule's own distribution),
    and uniform t time-shifted by ``extra_shift`` (> 1 favours high noise), clipped to the table."""
    table = model_sampling.sigmas.float()
    from_table = table[torch.randint(0, len(table), (n,), generator=gen)]
    t = torch.rand(n, generator=gen)
    shifted = (extra_shift * t / (1 + (extra_shift - 1) * t)).clamp(float(table.min()), float(table.max()))
    pick = torch.rand(n, generator=gen) < table_fraction
    return torch.where(pick, from_table, shifted)


def _save_copy(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.clone() if torch.is_grad_enabled() or tensor.requires_grad else tensor


def _unpack(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def flow_loss(base_model, kind: str, x0: torch.Tensor, labels: torch.Tensor, sigma: torch.Tensor,
              noise: torch.Tensor) -> torch.Tensor:
    """Velocity MSE through ComfyUI's apply_model (per sample)."""
    ms = base_model.model_sampling
    shape = (-1,) + (1,) * (x0.ndim - 1)
    x_t = ms.noise_scaling(sigma.view(shape), noise, x0)
    context, pooled = models.embedding_batch(kind, labels)
    extra = {"y": pooled} if pooled is not None else {}
    # ComfyUI's blocks update their inputs in place (inference code); saving a copy of every
    # tensor autograd keeps for backward makes that harmless to the gradients.
    with torch.autograd.graph.saved_tensors_hooks(_save_copy, _unpack):
        denoised = base_model.apply_model(x_t, sigma, c_crossattn=context, transformer_options={}, **extra)
    v_pred = (x_t - denoised) / sigma.view(shape)
    return ((v_pred - (noise - x0)) ** 2).flatten(1).mean(1)


def lr_at(step: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


@torch.no_grad()
def eval_loss(base_model, kind: str, seed: int = 12345, per_class: int = 8) -> float:
    """Velocity MSE on a fixed held-out set (fixed data, sigmas and noise), conditional."""
    samples, labels = data.dataset(kind, per_class, seed)
    x0 = to_internal(kind, samples)
    gen = torch.Generator().manual_seed(seed)
    sigma = draw_sigmas(base_model.model_sampling, len(x0), 0.5, gen)
    noise = torch.randn(x0.shape, generator=gen)
    losses = [flow_loss(base_model, kind, x0[i:i + 16], torch.from_numpy(labels[i:i + 16]), sigma[i:i + 16],
                        noise[i:i + 16]) for i in range(0, len(x0), 16)]
    return float(torch.cat(losses).mean())


@contextlib.contextmanager
def comfy_training_mode() -> Iterator[None]:
    """ComfyUI's own training flag, where it has one (0.30.0: ``model_management.in_training``,
    set by its LoRA training node): with it, layers take their differentiable paths instead of
    fused kernels that have no backward (comfy_kitchen's RoPE)."""
    import comfy.model_management

    if not hasattr(comfy.model_management, "in_training"):
        yield
        return
    before = comfy.model_management.in_training
    comfy.model_management.in_training = True
    try:
        yield
    finally:
        comfy.model_management.in_training = before


def train(kind: str, cfg: TrainConfig, minutes: float, out: pathlib.Path, log_every: int = 50) -> dict:
    with comfy_training_mode():
        return _train(kind, cfg, minutes, out, log_every)


def _train(kind: str, cfg: TrainConfig, minutes: float, out: pathlib.Path, log_every: int) -> dict:
    torch.set_num_threads(cfg.threads)
    torch.set_flush_denormal(True)  # zero-initialised layers otherwise make the first steps crawl
    torch.manual_seed(cfg.seed)
    patcher = models.build_model(kind, models.init_state_dict(kind, cfg.seed))
    base = patcher.model
    net = base.diffusion_model
    net.train().requires_grad_(True)  # newer ComfyUI builds inference models without grad
    params = [p for p in net.parameters() if p.requires_grad]
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.99))
    ema = copy.deepcopy(net).eval().requires_grad_(False)

    stream = data.Stream(kind, cfg.batch_size, seed=cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    n_classes = len(models.CLASSES[kind])
    print(f"[demo.train] {kind}: {models.SPECS[kind].config_class} {models.parameter_count(patcher):,} params, "
          f"{cfg}", flush=True)

    start = time.monotonic()
    budget = minutes * 60.0
    running, step = [], 0
    for step in range(cfg.steps):
        if time.monotonic() - start > budget:
            print(f"[demo.train] wall-clock budget of {minutes} min reached at step {step} of {cfg.steps}: "
                  "stopping early (not the reproducible default run)", flush=True)
            break
        samples, labels = stream.next()
        x0 = to_internal(kind, samples)
        labels = torch.from_numpy(labels)
        drop = torch.rand(len(labels), generator=gen) < cfg.cond_dropout
        labels = torch.where(drop, torch.full_like(labels, n_classes), labels)
        sigma = draw_sigmas(base.model_sampling, len(x0), cfg.table_fraction, gen, cfg.extra_shift)
        noise = torch.randn(x0.shape, generator=gen)

        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        loss = flow_loss(base, kind, x0, labels, sigma, noise).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        opt.step()
        with torch.no_grad():
            d = min(cfg.ema_decay, (1 + step) / (10 + step))
            for pe, p in zip(ema.parameters(), net.parameters(), strict=True):
                pe.lerp_(p, 1 - d)

        running.append(loss.item())
        if (step + 1) % log_every == 0 or step == 0:
            elapsed = time.monotonic() - start
            print(f"[demo.train] step {step + 1}/{cfg.steps} loss {np.mean(running[-log_every:]):.4f} "
                  f"lr {lr_at(step, cfg):.2e} {elapsed:.0f}s ({(step + 1) / elapsed:.2f} it/s)", flush=True)
    else:
        step = cfg.steps
    wall = time.monotonic() - start

    net.load_state_dict(ema.state_dict())
    net.eval()
    final_train = float(np.mean(running[-100:]))
    held_out = eval_loss(base, kind)
    weights = models.checkpoint_state_dict(kind, patcher, ema.state_dict())
    models.save_weights(kind, weights, out, getattr(torch, cfg.save_dtype), {
        "train_steps": str(step), "train_config": repr(cfg), "eval_loss": f"{held_out:.5f}",
    })
    print(f"[demo.train] done: {step} steps in {wall:.0f}s; train loss (last 100 steps) {final_train:.4f}; "
          f"held-out velocity MSE of the saved EMA weights {held_out:.4f}; wrote {out} "
          f"({out.stat().st_size / 1e6:.2f} MB, {cfg.save_dtype})", flush=True)
    return {"steps": step, "wall_s": wall, "train_loss": final_train, "eval_loss": held_out, "path": str(out)}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="demo/train.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("kind", choices=sorted(CONFIGS))
    parser.add_argument("--minutes", type=float, default=18.0, help="wall-clock safety budget (default 18)")
    parser.add_argument("--steps", type=int, default=None, help="override the fixed step count")
    parser.add_argument("--out", type=pathlib.Path, default=None, help="default demo/weights/<kind>.safetensors")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="override a TrainConfig field (experiments; the default run uses none)")
    args = parser.parse_args(argv)
    cfg = CONFIGS[args.kind]
    overrides = {"steps": args.steps} if args.steps is not None else {}
    for item in args.set:
        key, value = item.split("=", 1)
        overrides[key] = type(getattr(cfg, key))(value)
    cfg = TrainConfig(**{**cfg.__dict__, **overrides})
    train(args.kind, cfg, args.minutes, args.out or models.weights_path(args.kind))
    return 0
