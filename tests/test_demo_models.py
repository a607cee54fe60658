"""The demo reference models (demo/): committed trained weights that sample real class images.

Sampling is ComfyUI's KSampler (nodes.common_ksampler, euler, "simple", 30 steps, CFG 4 with
the null embedding as negative) on the models as ``demo.models.load_model`` builds them.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

STEPS, CFG = 30, 4.0


@pytest.fixture(scope="module")
def demo(host):
    mods = {name: host.pack_module(f"demo.{name}") for name in ("data", "models", "pixels", "preview", "probe")}
    return SimpleNamespace(**mods)


@pytest.fixture(scope="module")
def image_model(demo):
    return demo.models.load_model("image")


@pytest.fixture(scope="module")
def probe(demo):
    return demo.probe.fit(per_class=60)


def test_pixel_map_is_exactly_invertible(demo):
    images, _ = demo.data.dataset("image", 2, seed=3)
    x = torch.from_numpy(images)
    latent = demo.pixels.image_to_latent(x)
    assert latent.shape == (len(x), 16, 16, 16)
    assert torch.allclose(demo.pixels.latent_to_image(latent, clamp=False), x, atol=1e-5)
    videos, _ = demo.data.dataset("video", 1, seed=3)
    v = torch.from_numpy(videos)
    vlatent = demo.pixels.video_to_latent(v)
    assert vlatent.shape == (len(v), 16, videos.shape[1], 16, 16)
    assert torch.allclose(demo.pixels.latent_to_video(vlatent, clamp=False), v, atol=1e-5)


@pytest.mark.parametrize("kind", ["image", "video"])
def test_committed_weights_load(demo, kind):
    path = demo.models.weights_path(kind)
    assert path.is_file(), f"missing {path}: run ./dev train {kind}"
    assert path.stat().st_size < 8e6
    tensors, metadata = demo.models.read_weights(path)
    assert metadata["demo_kind"] == kind
    assert metadata["classes"] == '["' + '", "'.join(demo.models.CLASSES[kind]) + '"]'
    assert int(metadata["train_steps"]) > 0
    model = demo.models.load_model(kind)
    assert type(model.model).__name__ == {"image": "Flux", "video": "WAN21"}[kind]
    loaded = model.model.diffusion_model.state_dict()
    assert loaded.keys() == tensors.keys()
    assert all(torch.equal(loaded[k], tensors[k]) for k in tensors)


@pytest.fixture(scope="module")
def class_samples(demo, image_model):
    """Three samples of every class at the reference settings, and their labels."""
    return demo.preview.sample_classes(image_model, "image", per_class=3, seed=0, steps=STEPS, cfg=CFG)


def _own_class_probability(probe, images, labels) -> float:
    return float(probe.probabilities(images)[np.arange(len(labels)), labels].mean())


def test_image_samples_look_like_their_class(probe, class_samples):
    images, labels = class_samples
    accuracy = probe.accuracy(images, labels)
    assert accuracy >= 0.8, f"class probe accuracy {accuracy:.2f}"
    assert _own_class_probability(probe, images, labels) > 0.6
    # structure: flat colours and clean edges, not noise (pixels stay near their 3x3 median)
    x = images.numpy()
    median = np.median(np.stack([x[:, 1 + dy:31 + dy, 1 + dx:31 + dx] for dy in (-1, 0, 1) for dx in (-1, 0, 1)]), 0)
    assert np.abs(x[:, 1:-1, 1:-1] - median).mean() < 0.03


def test_random_weights_fail_the_class_test(demo, probe):
    model = demo.models.random_model("image", seed=0)
    images, labels = demo.preview.sample_classes(model, "image", per_class=2, seed=0, steps=STEPS, cfg=CFG)
    assert probe.accuracy(images, labels) < 0.4


def test_guidance_sharpens_the_classes(demo, image_model, probe, class_samples):
    """CFG is meaningful: the conditional model alone (cfg 1) gives weaker class images."""
    guided = _own_class_probability(probe, *class_samples)
    images, labels = demo.preview.sample_classes(image_model, "image", per_class=2, seed=0, steps=STEPS, cfg=1.0)
    assert guided > _own_class_probability(probe, images, labels) + 0.05


def test_same_seed_same_samples(demo, image_model):
    a = demo.preview.sample(image_model, "image", [0, 4, 9], seed=7, steps=10, cfg=CFG)
    b = demo.preview.sample(image_model, "image", [0, 4, 9], seed=7, steps=10, cfg=CFG)
    c = demo.preview.sample(image_model, "image", [0, 4, 9], seed=8, steps=10, cfg=CFG)
    assert torch.equal(a, b)
    assert (a - c).abs().mean() > 0.1


def _foreground_tracks(videos: np.ndarray) -> dict[str, np.ndarray]:
    """Per clip and frame: foreground centroid x, y, area and principal-axis angle (foreground =
    pixels far from the border's median colour)."""
    n, t = videos.shape[:2]
    frames = videos.reshape(n * t, *videos.shape[2:])
    border = np.concatenate([frames[:, 0], frames[:, -1], frames[:, :, 0], frames[:, :, -1]], axis=1)
    dist = np.linalg.norm(frames - np.median(border, axis=1)[:, None, None], axis=-1)
    fg = dist > 0.5 * dist.reshape(n * t, -1).max(1)[:, None, None]
    yy, xx = np.mgrid[0:frames.shape[1], 0:frames.shape[2]]
    area = fg.sum((1, 2)) + 1e-6
    cx = (fg * xx).sum((1, 2)) / area
    cy = (fg * yy).sum((1, 2)) / area
    dx, dy = xx[None] - cx[:, None, None], yy[None] - cy[:, None, None]
    mxx, myy, mxy = ((fg * dx * dx).sum((1, 2)), (fg * dy * dy).sum((1, 2)), (fg * dx * dy).sum((1, 2)))
    angle = 0.5 * np.arctan2(2 * mxy, mxx - myy)
    return {k: v.reshape(n, t) for k, v in dict(x=cx, y=cy, area=area, angle=angle).items()}


def _motion_checks(demo, videos: np.ndarray, labels: np.ndarray) -> float:
    """Share of clips whose foreground moves/changes as its class says."""
    tracks = _foreground_tracks(videos)
    dx = tracks["x"][:, -1] - tracks["x"][:, 0]
    dy = tracks["y"][:, -1] - tracks["y"][:, 0]
    grow = tracks["area"][:, -1] / tracks["area"][:, 0]
    turn = np.diff(tracks["angle"], axis=1)
    turn = np.abs((turn + np.pi / 2) % np.pi - np.pi / 2).sum(1)  # orientation is modulo pi
    expect = {
        "disc_right": lambda i: dx[i] > 4, "disc_down": lambda i: dy[i] > 4,
        "square_left": lambda i: dx[i] < -4, "square_up": lambda i: dy[i] < -4,
        "disc_grow": lambda i: grow[i] > 1.8, "square_shrink": lambda i: grow[i] < 0.55,
        "bar_rotate": lambda i: turn[i] > 1.0, "plus_diagonal": lambda i: dx[i] > 3 and dy[i] > 3,
    }
    names = demo.models.CLASSES["video"]
    checked = [bool(expect[names[k]](i)) for i, k in enumerate(labels) if names[k] in expect]
    return float(np.mean(checked))


def test_video_samples_move_as_their_class(demo):
    model = demo.models.load_model("video")
    videos, labels = demo.preview.sample_classes(model, "video", per_class=1, seed=0, steps=STEPS, cfg=CFG)
    assert videos.shape == (len(labels), 8, 32, 32, 3)
    assert _motion_checks(demo, videos.numpy(), labels) >= 0.7
    random = demo.models.random_model("video", seed=0)
    noise_videos, _ = demo.preview.sample_classes(random, "video", per_class=1, seed=0, steps=10, cfg=CFG)
    assert _motion_checks(demo, noise_videos.numpy(), labels) < 0.5
