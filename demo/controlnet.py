"""A small trained ControlNet for the demo image model, reproducibly on CPU:
``./dev py demo/controlnet.py [--steps N]``. Writes ``demo/weights/image_controlnet.safetensors``.

It is a "tile"-style ControlNet: its hint is the target image at a quarter of the latent's
resolution (4x4 average-pooled, in the model-internal latent space, repeated back to full size),
and it learns to make the image follow that layout. ComfyUI's own FLUX ControlNet class
(``comfy.ldm.flux.controlnet.ControlNetFlux``, the InstantX form that takes a latent hint) at the
demo model's width, with one double and one single block; as ControlNets are trained, its blocks
start as copies of the model's first ones and its output projections at zero, and the demo model
stays frozen. The loss is the demo model's (demo/train.py: velocity MSE through ComfyUI's
``apply_model``), with the ControlNet's outputs passed as ComfyUI's samplers pass them.

Used by ``./dev bench --controlnet`` (benchmark/stepbench/controlnet.py), to measure the cache on
runs with a ControlNet whose outputs evolve as a trained one's do (a random ControlNet's follow
the noisy latent without that smoothness).
"""

if __name__ == "__main__":  # run as a script: boot ComfyUI with the pack, then re-enter as demo.controlnet
    import sys

    from harness import host  # the dev harness package (./dev puts tests/ on PYTHONPATH)

    raise SystemExit(host.boot().pack_module("demo.controlnet").main(sys.argv[1:]))

import argparse
import pathlib
import time

import comfy.controlnet
import comfy.ldm.flux.controlnet
import comfy.model_patcher
import comfy.ops
import numpy as np
import safetensors.torch
import torch

from . import data, model_builder, models
from .train import _save_copy, _unpack, comfy_training_mode, draw_sigmas, to_internal

WEIGHTS = models.WEIGHTS_DIR / "image_controlnet.safetensors"
HINT_POOL = 4  # the hint's resolution: the latent's / HINT_POOL
OUTPUT_PROJECTIONS = ("controlnet_blocks.", "controlnet_single_blocks.")


def hint_of(latent: torch.Tensor) -> torch.Tensor:
    """The hint for a model-internal image latent [B, C, H, W]: 4x4 average-pooled, repeated back."""
    pooled = torch.nn.functional.avg_pool2d(latent, HINT_POOL)
    return pooled.repeat_interleave(HINT_POOL, dim=-2).repeat_interleave(HINT_POOL, dim=-1)


def hint_image(class_index: int, seed: int) -> torch.Tensor:
    """A hint as ComfyUI's Apply ControlNet takes it (an IMAGE, channels last): the layout of a
    rendered demo image of ``class_index`` (another instance than the one being sampled)."""
    samples = data.batch("image", [class_index], np.random.default_rng(seed))
    return hint_of(to_internal("image", samples)).movedim(1, -1)


def build(base: comfy.model_patcher.ModelPatcher) -> torch.nn.Module:
    config = dict(base.model.model_config.unet_config, depth=1, depth_single_blocks=1)
    return comfy.ldm.flux.controlnet.ControlNetFlux(latent_input=True, operations=comfy.ops.disable_weight_init,
                                                    **config)


def as_controlnet(control_model: torch.nn.Module) -> comfy.controlnet.ControlNet:
    """ComfyUI's ControlNet object around the trained model, as its loader wraps an InstantX one
    (without a VAE: the hint is already a latent)."""
    return comfy.controlnet.ControlNet(control_model, compression_ratio=1, load_device=torch.device("cpu"),
                                       extra_conds=["y", "guidance"])


def checkpoint_name(name: str) -> str:
    """The FLUX checkpoint format's name of a module key: its RMSNorm weights are ``.scale`` (ComfyUI
    0.30.0 names them ``.weight`` in the module and converts when it loads a checkpoint)."""
    return name[:-len(".weight")] + ".scale" if name.endswith(("query_norm.weight", "key_norm.weight")) else name


def load(base: comfy.model_patcher.ModelPatcher, path: pathlib.Path = WEIGHTS) -> comfy.controlnet.ControlNet:
    control_model = build(base)
    weights = safetensors.torch.load_file(str(path))
    module_names = {checkpoint_name(name): name for name in control_model.state_dict()}
    control_model.load_state_dict({module_names[k]: v.float() for k, v in weights.items()})
    return as_controlnet(control_model.eval())


def initial_state(control_model: torch.nn.Module, base: comfy.model_patcher.ModelPatcher, seed: int) -> dict:
    """Seeded random weights; the blocks and embeddings the model also has copied from it; the output
    projections (and the hint's input projection) zero, so training starts from the plain model."""
    state = model_builder.random_state_dict(model_builder.template_of(control_model.state_dict()), seed)
    own = base.model.diffusion_model.state_dict()
    for name in state:
        if name in own and own[name].shape == state[name].shape:
            state[name] = own[name].detach().float().clone()
        if name.startswith((*OUTPUT_PROJECTIONS, "pos_embed_input.")):
            state[name] = torch.zeros_like(state[name])
    return state


def controlled_loss(base, control_model, x0: torch.Tensor, labels: torch.Tensor, sigma: torch.Tensor,
                    noise: torch.Tensor) -> torch.Tensor:
    ms = base.model_sampling
    shape = (-1, 1, 1, 1)
    # The stream the ControlNet's outputs are added into in place must be part of the graph already.
    x_t = ms.noise_scaling(sigma.view(shape), noise, x0).requires_grad_(True)
    context, pooled = models.embedding_batch("image", labels)
    with torch.autograd.graph.saved_tensors_hooks(_save_copy, _unpack):
        control = control_model(x=ms.calculate_input(sigma, x_t), hint=hint_of(x0), timesteps=ms.timestep(sigma),
                                context=context, y=pooled)
        control = {key: list(value) for key, value in control.items()}
        denoised = base.apply_model(x_t, sigma, c_crossattn=context, control=control, transformer_options={},
                                    y=pooled)
    v_pred = (x_t - denoised) / sigma.view(shape)
    return ((v_pred - (noise - x0)) ** 2).flatten(1).mean(1)


def train(steps: int, batch_size: int, lr: float, seed: int, out: pathlib.Path) -> None:
    torch.manual_seed(seed)
    torch.set_flush_denormal(True)
    patcher = models.load_model("image")
    base = patcher.model
    base.diffusion_model.requires_grad_(False)
    control_model = build(patcher)
    control_model.load_state_dict(initial_state(control_model, patcher, seed))
    control_model.train().requires_grad_(True)
    params = list(control_model.parameters())
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.99), weight_decay=0.0)
    stream = data.Stream("image", batch_size, seed=seed + 7)
    gen = torch.Generator().manual_seed(seed + 8)
    null = len(models.CLASSES["image"])
    start, running = time.monotonic(), []
    for step in range(steps):
        samples, labels = stream.next()
        x0 = to_internal("image", samples)
        labels = torch.from_numpy(labels)
        labels = torch.where(torch.rand(len(labels), generator=gen) < 0.12, torch.full_like(labels, null), labels)
        sigma = draw_sigmas(base.model_sampling, len(x0), 0.5, gen)
        noise = torch.randn(x0.shape, generator=gen)
        for group in opt.param_groups:
            group["lr"] = lr * min(1.0, (step + 1) / 50) * (0.1 + 0.9 * (1 - step / steps))
        loss = controlled_loss(base, control_model, x0, labels, sigma, noise).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        running.append(loss.item())
        if (step + 1) % 50 == 0 or step == 0:
            print(f"[demo.controlnet] step {step + 1}/{steps} loss {np.mean(running[-50:]):.4f} "
                  f"{time.monotonic() - start:.0f}s", flush=True)
    weights = {checkpoint_name(k): v.detach().to(torch.float16).contiguous()
               for k, v in control_model.state_dict().items()}
    safetensors.torch.save_file(weights, str(out), metadata={"train_steps": str(steps), "seed": str(seed)})
    print(f"[demo.controlnet] wrote {out} ({out.stat().st_size / 1e6:.2f} MB)", flush=True)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="demo/controlnet.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=pathlib.Path, default=WEIGHTS)
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads (results differ only by rounding)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    with comfy_training_mode():
        train(args.steps, args.batch_size, args.lr, args.seed, args.out)
    return 0
