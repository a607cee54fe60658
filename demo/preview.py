"""Sample the demo models with ComfyUI's KSampler and save a PNG grid per class.

    ./dev preview image|video [--out PATH] [--steps 30] [--cfg 4] [--per-class 8]

(or ``./dev py demo/preview.py ...``). Rows are classes; for video each row is one
clip's frames. Default outputs: /tmp/demo_samples_image.png and /tmp/demo_samples_video.png.
"""

if __name__ == "__main__":  # run as a script: boot ComfyUI with the pack, then re-enter as demo.preview
    import sys

    from harness import host  # the dev harness package (./dev puts tests/ on PYTHONPATH)

    raise SystemExit(host.boot().pack_module("demo.preview").main(sys.argv[1:]))

import argparse
import pathlib

import nodes
import numpy as np
import torch

from . import models, pixels

DEFAULTS = {"steps": 30, "cfg": 4.0, "sampler": "euler", "scheduler": "simple"}


def sample(model, kind: str, class_index: int | list[int], batch: int = 1, seed: int = 0, steps: int = 30,
           cfg: float = 4.0, sampler: str = "euler", scheduler: str = "simple") -> torch.Tensor:
    """KSampler (nodes.common_ksampler) with the class as positive and the null embedding as
    negative. ``class_index`` may be a list (one class per batch row; ``batch`` is then its
    length). Returns the LATENT samples (decode with ``decode``)."""
    if isinstance(class_index, list):
        batch = len(class_index)
    positive = models.conditioning(kind, class_index, batch)
    negative = models.conditioning(kind, None, batch)
    latent = models.empty_latent(kind, batch)
    return nodes.common_ksampler(model, seed, steps, cfg, sampler, scheduler, positive, negative, latent)[0]["samples"]


def decode(kind: str, latent: torch.Tensor) -> torch.Tensor:
    return pixels.latent_to_image(latent) if kind == "image" else pixels.latent_to_video(latent)


def sample_classes(model, kind: str, per_class: int, seed: int = 0, **settings) -> tuple[torch.Tensor, np.ndarray]:
    """``per_class`` decoded samples of every class (class-major, one KSampler batch): images or
    videos, and their labels."""
    labels = np.repeat(np.arange(len(models.CLASSES[kind])), per_class)
    return decode(kind, sample(model, kind, labels.tolist(), seed=seed, **settings)), labels


def save_grid(rows: list[np.ndarray], path: pathlib.Path, zoom: int = 3) -> None:
    """rows: each [n, H, W, 3] in [0, 1], laid out left to right with 2-pixel gutters."""
    from PIL import Image

    h, w = rows[0].shape[1:3]
    cols = max(len(r) for r in rows)
    canvas = np.ones((len(rows) * (h + 2), cols * (w + 2), 3))
    for i, row in enumerate(rows):
        for j, tile in enumerate(row):
            canvas[i * (h + 2):i * (h + 2) + h, j * (w + 2):j * (w + 2) + w] = tile
    img = Image.fromarray((canvas * 255).round().astype(np.uint8))
    img.resize((img.width * zoom, img.height * zoom), Image.NEAREST).save(path)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="demo/preview.py")
    parser.add_argument("kind", choices=["image", "video"])
    parser.add_argument("--weights", type=pathlib.Path, default=None)
    parser.add_argument("--out", type=pathlib.Path, default=None)
    parser.add_argument("--per-class", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=DEFAULTS["steps"])
    parser.add_argument("--cfg", type=float, default=DEFAULTS["cfg"])
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    model = models.load_model(args.kind, args.weights)
    out = args.out or pathlib.Path(f"/tmp/demo_samples_{args.kind}.png")
    per_class = args.per_class or (8 if args.kind == "image" else 2)
    samples, labels = sample_classes(model, args.kind, per_class, args.seed, steps=args.steps, cfg=args.cfg)
    samples = samples.numpy()
    if args.kind == "image":
        from . import probe

        rows = [samples[labels == k] for k in range(len(models.CLASSES["image"]))]
        acc = probe.fit().accuracy(samples, labels)
        print(f"[demo.preview] class probe accuracy {acc:.2f} over {len(labels)} samples")
    else:
        rows = list(samples)  # one clip per row, frames left to right
    save_grid(rows, out)
    print(f"[demo.preview] wrote {out}: rows = {', '.join(models.CLASSES[args.kind])}"
          + (f" ({per_class} clips each)" if args.kind == "video" else ""))
    return 0
