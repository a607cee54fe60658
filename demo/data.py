"""Procedural, class-conditional training data for the demo models (seeded, numpy only).

Images (32x32 RGB in [0, 1]): ten classes of shapes, stroke glyphs and textures. Within a class
the position, size, stroke width, period/phase and both colours are random; the class fixes
the geometry and a colour scheme (background and foreground colour, randomly shaded). Videos (8
frames of 32x32): eight classes of one shape moving or changing in a fixed way (direction, growth,
rotation), with random start, speed, size and colours.

Everything is drawn with anti-aliased signed distances, so edges are smooth and the data has no
pixel-grid aliasing the tiny models would waste capacity on. A ``numpy.random.Generator`` is
the only source of randomness: the same seed gives the same data on any machine.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

IMAGE_SIZE = 32
VIDEO_FRAMES = 8

IMAGE_CLASSES = (
    "disc", "square", "triangle", "ring", "plus", "cross", "seven", "h_stripes", "v_stripes", "checker",
)
VIDEO_CLASSES = (
    "disc_right", "disc_down", "square_left", "square_up", "disc_grow", "square_shrink", "bar_rotate",
    "plus_diagonal",
)

_YY, _XX = np.meshgrid(np.arange(IMAGE_SIZE) + 0.5, np.arange(IMAGE_SIZE) + 0.5, indexing="ij")


# --- signed distances (pixels; negative inside) -------------------------------------------------

def _coverage(d: np.ndarray) -> np.ndarray:
    return np.clip(0.5 - d, 0.0, 1.0)


def _disc(cx: float, cy: float, r: float) -> np.ndarray:
    return np.hypot(_XX - cx, _YY - cy) - r


def _box(cx: float, cy: float, ax: float, ay: float, angle: float = 0.0) -> np.ndarray:
    x, y = _XX - cx, _YY - cy
    if angle:
        c, s = math.cos(angle), math.sin(angle)
        x, y = c * x + s * y, -s * x + c * y
    qx, qy = np.abs(x) - ax, np.abs(y) - ay
    outside = np.hypot(np.maximum(qx, 0), np.maximum(qy, 0))
    return outside + np.minimum(np.maximum(qx, qy), 0)


def _segment(x0: float, y0: float, x1: float, y1: float, width: float) -> np.ndarray:
    px, py, dx, dy = _XX - x0, _YY - y0, x1 - x0, y1 - y0
    t = np.clip((px * dx + py * dy) / (dx * dx + dy * dy), 0.0, 1.0)
    return np.hypot(px - t * dx, py - t * dy) - width / 2


def _convex_polygon(points: list[tuple[float, float]]) -> np.ndarray:
    """max over edges of the signed distance to the edge's line (points counter-clockwise on screen)."""
    d = np.full(_XX.shape, -np.inf)
    for (x0, y0), (x1, y1) in zip(points, points[1:] + points[:1], strict=True):
        nx, ny = -(y1 - y0), x1 - x0  # outward normal for this orientation
        norm = math.hypot(nx, ny)
        d = np.maximum(d, ((_XX - x0) * nx + (_YY - y0) * ny) / norm)
    return d


def _stripes(coord: np.ndarray, period: float, phase: float) -> np.ndarray:
    u = np.mod(coord + phase, period)
    return np.abs(u - period / 4) - period / 4  # one stripe of width period/2 per period


def _plus(cx: float, cy: float, arm: float, width: float, angle: float = 0.0) -> np.ndarray:
    return np.minimum(_box(cx, cy, arm, width / 2, angle), _box(cx, cy, width / 2, arm, angle))


# --- colours ------------------------------------------------------------------------------------

# Twelve clearly distinct colours.
PALETTE = np.array([
    [0.90, 0.10, 0.10], [0.10, 0.70, 0.20], [0.15, 0.25, 0.90], [0.95, 0.85, 0.10],
    [0.10, 0.80, 0.85], [0.85, 0.20, 0.80], [0.95, 0.95, 0.95], [0.08, 0.08, 0.08],
    [0.95, 0.55, 0.10], [0.50, 0.50, 0.50], [0.45, 0.25, 0.10], [0.55, 0.85, 0.45],
])
# Each class has a colour scheme (background, foreground palette entries); a sample shifts both
# colours by a random shade of up to COLOUR_JITTER per channel.
COLOUR_JITTER = 0.12
IMAGE_SCHEMES = ((7, 0), (6, 2), (9, 3), (10, 4), (1, 6), (8, 7), (2, 8), (0, 6), (7, 11), (3, 5))
VIDEO_SCHEMES = ((7, 0), (6, 2), (9, 3), (10, 4), (1, 6), (8, 7), (2, 8), (5, 6))


def _colours(rng: np.random.Generator, scheme: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """The scheme's background and foreground colours, each shaded at random."""
    bg, fg = PALETTE[scheme[0]], PALETTE[scheme[1]]
    shade = rng.uniform(-COLOUR_JITTER, COLOUR_JITTER, (2, 3))
    return np.clip(bg + shade[0], 0, 1), np.clip(fg + shade[1], 0, 1)


def _compose(alpha: np.ndarray, bg: np.ndarray, fg: np.ndarray) -> np.ndarray:
    a = alpha[..., None]
    return (bg * (1 - a) + fg * a).astype(np.float32)


# --- image classes ------------------------------------------------------------------------------

# How far (pixels) a shape's centre may sit from the image centre, per axis.
POSITION_JITTER = 4.0


def _centre(rng: np.random.Generator, radius: float) -> tuple[float, float]:
    """A centre near the middle that keeps a shape of this radius inside the image."""
    room = min(POSITION_JITTER, IMAGE_SIZE / 2 - radius - 1.0)
    return tuple(float(IMAGE_SIZE / 2 + rng.uniform(-room, room)) for _ in range(2))


def _img_disc(rng):
    r = rng.uniform(5, 11)
    return _disc(*_centre(rng, r), r)


def _img_square(rng):
    a = rng.uniform(4, 10)
    cx, cy = _centre(rng, a)
    return _box(cx, cy, a, a)


def _img_triangle(rng):
    b = rng.uniform(6, 12)
    h = 1.6 * b
    cx, cy = _centre(rng, max(b, h / 2))
    return _convex_polygon([(cx, cy - h / 2), (cx - b, cy + h / 2), (cx + b, cy + h / 2)])


def _img_ring(rng):
    r, w = rng.uniform(7, 12), rng.uniform(3.0, 4.5)
    return np.abs(_disc(*_centre(rng, r + w / 2), r)) - w / 2


def _img_plus(rng):
    arm, w = rng.uniform(6, 12), rng.uniform(3.0, 5.0)
    return _plus(*_centre(rng, arm), arm, w)


def _img_cross(rng):
    arm, w = rng.uniform(6, 12), rng.uniform(3.0, 5.0)
    return _plus(*_centre(rng, arm / math.sqrt(2) + w / 2), arm, w, angle=math.pi / 4)


def _img_seven(rng):
    w, h, stroke = rng.uniform(10, 16), rng.uniform(12, 20), rng.uniform(3.0, 4.5)
    cx, cy = _centre(rng, max(w, h) / 2 + stroke)
    x0, y0 = cx - w / 2, cy - h / 2
    top = _segment(x0, y0, x0 + w, y0, stroke)
    stem = _segment(x0 + w, y0, x0 + 0.3 * w, y0 + h, stroke)
    return np.minimum(top, stem)


def _img_h_stripes(rng):
    period = rng.uniform(10, 16)
    return _stripes(_YY, period, rng.uniform(0, period))


def _img_v_stripes(rng):
    period = rng.uniform(10, 16)
    return _stripes(_XX, period, rng.uniform(0, period))


def _img_checker(rng):
    cell = rng.uniform(6, 10)
    sx = _coverage(_stripes(_XX, 2 * cell, rng.uniform(0, 2 * cell)))
    sy = _coverage(_stripes(_YY, 2 * cell, rng.uniform(0, 2 * cell)))
    alpha = sx + sy - 2 * sx * sy  # soft xor
    return 0.5 - alpha  # as a distance whose coverage is alpha


_IMAGE_MAKERS: dict[str, Callable[[np.random.Generator], np.ndarray]] = {
    "disc": _img_disc, "square": _img_square, "triangle": _img_triangle, "ring": _img_ring,
    "plus": _img_plus, "cross": _img_cross, "seven": _img_seven, "h_stripes": _img_h_stripes,
    "v_stripes": _img_v_stripes, "checker": _img_checker,
}


def _wobble_field(rng: np.random.Generator, amplitude: float) -> np.ndarray:
    """Smooth random offsets (pixels) for the signed distance: ragged, imperfect edges."""
    coarse = rng.normal(0.0, amplitude, (9, 9))
    idx = np.linspace(0, 8, IMAGE_SIZE)
    i0 = np.minimum(idx.astype(int), 7)
    f = idx - i0
    rows = coarse[i0] * (1 - f)[:, None] + coarse[i0 + 1] * f[:, None]
    return rows[:, i0] * (1 - f)[None] + rows[:, i0 + 1] * f[None]


def render_image(class_index: int, rng: np.random.Generator, wobble: float = 0.0) -> np.ndarray:
    """One [32, 32, 3] float32 image of the class. ``wobble`` > 0 roughens the edges (for the
    class probe's training; the models' data uses 0, which draws nothing extra from ``rng``)."""
    bg, fg = _colours(rng, IMAGE_SCHEMES[class_index])
    d = _IMAGE_MAKERS[IMAGE_CLASSES[class_index]](rng)
    if wobble:
        d = d + _wobble_field(rng, wobble)
    return _compose(_coverage(d), bg, fg)


# --- video classes ------------------------------------------------------------------------------

def _travel(rng: np.random.Generator, size: float, frames: int) -> tuple[float, float]:
    """Start coordinate and per-frame speed (>0) keeping a shape of this half-size in frame."""
    speed = rng.uniform(1.0, 1.5)
    span = speed * (frames - 1)
    start = rng.uniform(size + 1, IMAGE_SIZE - size - 1 - span)
    return float(start), float(speed)


def _clip_frames(class_name: str, rng: np.random.Generator, frames: int) -> list[np.ndarray]:
    t = np.arange(frames, dtype=np.float64)
    if class_name in ("disc_right", "disc_down"):
        r = rng.uniform(6, 8)
        start, speed = _travel(rng, r, frames)
        other = rng.uniform(r + 1, IMAGE_SIZE - r - 1)
        pos = start + speed * t
        if class_name == "disc_right":
            return [_disc(p, other, r) for p in pos]
        return [_disc(other, p, r) for p in pos]
    if class_name in ("square_left", "square_up"):
        a = rng.uniform(5, 7)
        start, speed = _travel(rng, a, frames)
        other = rng.uniform(a + 1, IMAGE_SIZE - a - 1)
        pos = IMAGE_SIZE - (start + speed * t)  # decreasing coordinate
        if class_name == "square_left":
            return [_box(p, other, a, a) for p in pos]
        return [_box(other, p, a, a) for p in pos]
    if class_name == "disc_grow":
        r0, growth = rng.uniform(3.5, 5), rng.uniform(0.6, 1.0)
        radii = r0 + growth * t
        cx, cy = _centre(rng, float(radii[-1]))
        return [_disc(cx, cy, r) for r in radii]
    if class_name == "square_shrink":
        a1, shrink = rng.uniform(2.5, 3.5), rng.uniform(0.6, 0.9)
        sizes = a1 + shrink * (frames - 1 - t)
        cx, cy = _centre(rng, float(sizes[0]))
        return [_box(cx, cy, a, a) for a in sizes]
    if class_name == "bar_rotate":
        length, w = rng.uniform(10, 13), rng.uniform(4.0, 5.0)
        a0, omega = rng.uniform(0, math.pi), rng.uniform(0.2, 0.35)
        cx, cy = _centre(rng, length)
        return [_box(cx, cy, length, w / 2, angle=a0 + omega * k) for k in t]
    if class_name == "plus_diagonal":
        arm, w = rng.uniform(6, 8), rng.uniform(4.0, 5.0)
        speed = rng.uniform(1.0, 1.4)
        span = speed * (frames - 1)
        x0 = rng.uniform(arm + 1, IMAGE_SIZE - arm - 1 - span)
        y0 = rng.uniform(arm + 1, IMAGE_SIZE - arm - 1 - span)
        return [_plus(x0 + speed * k, y0 + speed * k, arm, w) for k in t]
    raise KeyError(class_name)


def render_video(class_index: int, rng: np.random.Generator, frames: int = VIDEO_FRAMES) -> np.ndarray:
    """One [frames, 32, 32, 3] float32 clip of the class."""
    bg, fg = _colours(rng, VIDEO_SCHEMES[class_index])
    return np.stack([_compose(_coverage(d), bg, fg) for d in _clip_frames(VIDEO_CLASSES[class_index], rng, frames)])


# --- batches ------------------------------------------------------------------------------------

CLASSES = {"image": IMAGE_CLASSES, "video": VIDEO_CLASSES}


def render(kind: str, class_index: int, rng: np.random.Generator) -> np.ndarray:
    return render_image(class_index, rng) if kind == "image" else render_video(class_index, rng)


def batch(kind: str, labels: np.ndarray | list[int], rng: np.random.Generator) -> np.ndarray:
    """Stacked samples for these class indices: [B, 32, 32, 3] or [B, T, 32, 32, 3]."""
    return np.stack([render(kind, int(k), rng) for k in labels])


def dataset(kind: str, per_class: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``per_class`` samples of every class (class-major order) and their labels."""
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(len(CLASSES[kind])), per_class)
    return batch(kind, labels, rng), labels


class Stream:
    """The training data: an endless, deterministic sequence of labelled batches."""

    def __init__(self, kind: str, batch_size: int, seed: int):
        self.kind, self.batch_size = kind, batch_size
        self.rng = np.random.default_rng(seed)

    def next(self) -> tuple[np.ndarray, np.ndarray]:
        labels = self.rng.integers(0, len(CLASSES[self.kind]), self.batch_size)
        return batch(self.kind, labels, self.rng), labels
