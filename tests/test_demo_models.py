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
    assert {k: tuple(v.shape) for k, v in tensors.items()} == dict(demo.models.SPECS[kind].template.shapes)
    model = demo.models.load_model(kind)
    assert type(model.model).__name__ == {"image": "Flux", "video": "WAN21"}[kind]
    assert type(model.model.model_config).__name__ == metadata["config_class"]
    # Every weight arrives, under whatever name this ComfyUI gives it (Flux's Q/K norms are
    # ".scale" in the file and ".weight" in 0.30.0's modules).
    loaded = demo.models.checkpoint_state_dict(kind, model)
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


def _scheme_matches(demo, videos: np.ndarray, labels: np.ndarray) -> float:
    """Share of clips whose background (border) and foreground colours are their class's scheme."""
    hits = []
    for clip, label in zip(videos, labels, strict=True):
        frames = clip.reshape(-1, *clip.shape[-3:])
        border = np.concatenate([frames[:, 0], frames[:, -1], frames[:, :, 0], frames[:, :, -1]], axis=1)
        bg = np.median(border.reshape(-1, 3), axis=0)
        far = np.linalg.norm(frames - bg, axis=-1) > 0.3
        fg = np.median(frames[far], axis=0) if far.any() else bg
        want_bg, want_fg = (demo.data.PALETTE[i] for i in demo.data.VIDEO_SCHEMES[label])
        hits.append(np.linalg.norm(bg - want_bg) < 0.3 and np.linalg.norm(fg - want_fg) < 0.3)
    return float(np.mean(hits))


def _growth(videos: np.ndarray) -> np.ndarray:
    """Foreground area of the last frame over the first, per clip."""
    area = _foreground_tracks(videos)["area"]
    return area[:, -1] / area[:, 0]


def test_video_samples_follow_their_class(demo):
    """What the small video model learned in its CPU budget: each class's colours, a coherent
    shape in every frame, and the size changes (disc_grow, square_shrink). It did not learn the
    translations (disc_right, square_up, ...): its shapes stay nearly in place (see demo/README)."""
    model = demo.models.load_model("video")
    videos, labels = demo.preview.sample_classes(model, "video", per_class=2, seed=0, steps=STEPS, cfg=CFG)
    assert videos.shape == (len(labels), 8, 32, 32, 3)
    videos = videos.numpy()
    assert _scheme_matches(demo, videos, labels) >= 0.8
    names = list(demo.models.CLASSES["video"])
    growth = _growth(videos)
    assert (growth[labels == names.index("disc_grow")] > 1.8).all(), growth
    assert (growth[labels == names.index("square_shrink")] < 0.55).all(), growth

    random = demo.models.random_model("video", seed=0)
    noise_videos, noise_labels = demo.preview.sample_classes(random, "video", per_class=1, seed=0, steps=10, cfg=CFG)
    assert _scheme_matches(demo, noise_videos.numpy(), noise_labels) < 0.3


def test_committed_weights_sample_as_recorded_on_this_comfyui(host):
    """The demo models load and sample the same on every supported ComfyUI: fixed-seed samples
    match the committed reference (harness/demo_reference.py, written on one version) to float
    rounding. A wrong class, schedule, head count or weight moves them by far more."""
    from harness import demo_reference

    reference, now = demo_reference.load(), demo_reference.compute()
    for kind in demo_reference.SETTINGS:
        torch.testing.assert_close(now[kind], reference[kind], atol=2e-3, rtol=1e-3, msg=lambda m, k=kind: f"{k}: {m}")


def test_training_runs_and_saves_a_checkpoint_every_version_loads(demo, host, tmp_path):
    """./dev train on this ComfyUI: gradients flow (0.30.0 builds models without grad and has
    RoPE kernels without a backward outside its training mode), and the file is in the template's
    checkpoint format, whatever names this ComfyUI's modules use."""
    train = host.pack_module("demo.train")
    config = train.TrainConfig(**{**train.CONFIGS["image"].__dict__, "steps": 2, "batch_size": 4, "threads": 1})
    result = train.train("image", config, minutes=5.0, out=tmp_path / "image.safetensors")
    assert result["steps"] == 2 and np.isfinite(result["train_loss"])
    tensors, metadata = demo.models.read_weights(tmp_path / "image.safetensors")
    assert metadata["demo_kind"] == "image" and metadata["config_class"] == "Flux"
    assert {k: tuple(v.shape) for k, v in tensors.items()} == dict(demo.models.SPECS["image"].template.shapes)
    initial = demo.models.init_state_dict("image", seed=config.seed)
    assert any(not torch.equal(tensors[k], initial[k].half().float()) for k in tensors)  # it learned something
    assert type(demo.models.load_model("image", tmp_path / "image.safetensors").model).__name__ == "Flux"


def test_the_committed_controlnet_makes_the_image_follow_its_hint(host, demo, image_model):
    """demo/controlnet.py's trained "tile" ControlNet, applied with ComfyUI's Apply ControlNet: the
    image's layout (its 4x4-pooled latent, what the hint holds) moves toward the hint's, which is
    another image of the class than the one the seed would give."""
    import nodes

    controlnet_module = host.pack_module("demo.controlnet")
    controlnet = controlnet_module.load(image_model)
    latent = demo.models.empty_latent("image", 4)
    negative = demo.models.conditioning("image", None, 4)
    distances = {}
    for with_control in (False, True):
        gaps = []
        for class_index in (0, 3, 6):
            positive = demo.models.conditioning("image", class_index, 4)
            hint = controlnet_module.hint_image(class_index, 1000 + class_index).repeat(4, 1, 1, 1)
            pos, neg = positive, negative
            if with_control:
                pos, neg = nodes.ControlNetApplyAdvanced().apply_controlnet(positive, negative, controlnet, hint,
                                                                             1.0, 0.0, 1.0)[:2]
            samples = nodes.common_ksampler(image_model, 7, STEPS, CFG, "euler", "simple", pos, neg, latent)[0]
            internal = image_model.model.process_latent_in(samples["samples"])
            gaps.append((controlnet_module.hint_of(internal) - hint.movedim(-1, 1)).abs().mean())
        distances[with_control] = float(torch.stack(gaps).mean())
    assert distances[True] < 0.5 * distances[False], distances  # measured: 0.064 against 0.245
