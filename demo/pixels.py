"""A fixed, exactly invertible linear map between RGB pixels and the demo models' latents.

No VAE: a latent pixel is a 2x2 block of RGB pixels (space-to-depth: 12 values), padded with
4 zeros to the 16 channels ComfyUI's Flux and Wan 2.1 latent formats have, mixed by the
orthonormal 16x16 Hadamard matrix (exact in floating point, no seeded factorisation), and
scaled so the model-internal latent has about unit variance on the demo data. The result is then
put through the latent format's ``process_out`` so that ComfyUI's ``process_latent_in`` (which
KSampler applies to the input latent) gives back that model-internal latent:

    image [B, H, W, 3] in [0, 1]  <->  Flux latent  [B, 16, H/2, W/2]
    video [B, T, H, W, 3]         <->  Wan21 latent [B, 16, T, H/2, W/2]  (no temporal compression)

``latent_to_image(image_to_latent(x)) == x`` up to float rounding for any x in [0, 1]. The 4
padding directions form the null space of ``latent_to_image``: what a model writes there is
dropped on decoding.
"""

from __future__ import annotations

import comfy.latent_formats
import torch

LATENT_CHANNELS = 16
PIXEL_CHANNELS = 12  # 2x2 space-to-depth of RGB
DOWNSCALE = 2
# Pixels go to [-GAIN, GAIN]; with the 12/16 padding this gives the demo data a model-internal
# standard deviation of about 1 (measured on demo.data, both kinds).
GAIN = 1.9

_FLUX = comfy.latent_formats.Flux()  # process_in(x) = (x - shift_factor) * scale_factor
_WAN = comfy.latent_formats.Wan21()  # process_in(x) = (x - mean) / std, per channel


def _hadamard(n: int) -> torch.Tensor:
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / n**0.5


# Orthonormal and symmetric: MIX @ MIX == identity.
MIX = _hadamard(LATENT_CHANNELS)


def _wan_stats(like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return _WAN.latents_mean.to(like.device, like.dtype), _WAN.latents_std.to(like.device, like.dtype)


def _mix(x: torch.Tensor) -> torch.Tensor:
    """Apply MIX over dim 1 of [B, 16, ...]."""
    mix = MIX.to(x.device, x.dtype)
    return torch.einsum("oc,bc...->bo...", mix, x)


def _pixels_to_internal(images: torch.Tensor) -> torch.Tensor:
    """[N, H, W, 3] -> model-internal latent [N, 16, H/2, W/2]."""
    n, h, w, c = images.shape
    if c != 3 or h % DOWNSCALE or w % DOWNSCALE:
        raise ValueError(f"expected [N, H, W, 3] with even H, W; got {tuple(images.shape)}")
    x = images.to(torch.float32) * (2 * GAIN) - GAIN
    x = x.permute(0, 3, 1, 2)  # N, 3, H, W
    x = torch.nn.functional.pixel_unshuffle(x, DOWNSCALE)  # N, 12, H/2, W/2
    pad = x.new_zeros(n, LATENT_CHANNELS - PIXEL_CHANNELS, h // DOWNSCALE, w // DOWNSCALE)
    return _mix(torch.cat([x, pad], 1))


def _internal_to_pixels(z: torch.Tensor, clamp: bool) -> torch.Tensor:
    x = _mix(z.to(torch.float32))[:, :PIXEL_CHANNELS]
    x = torch.nn.functional.pixel_shuffle(x, DOWNSCALE).permute(0, 2, 3, 1)
    images = (x + GAIN) / (2 * GAIN)
    return images.clamp(0.0, 1.0) if clamp else images


# --- images: Flux latent format ---------------------------------------------------------------

def image_to_internal(images: torch.Tensor) -> torch.Tensor:
    """The latent the image model sees inside sampling (after process_latent_in)."""
    return _pixels_to_internal(images)


def image_to_latent(images: torch.Tensor) -> torch.Tensor:
    """[B, H, W, 3] in [0, 1] -> Flux-format latent [B, 16, H/2, W/2] (a ComfyUI LATENT's samples)."""
    return _FLUX.process_out(_pixels_to_internal(images))


def latent_to_image(latent: torch.Tensor, clamp: bool = True) -> torch.Tensor:
    """Flux-format latent [B, 16, h, w] -> images [B, 2h, 2w, 3] (ComfyUI IMAGE layout)."""
    return _internal_to_pixels(_FLUX.process_in(latent.to(torch.float32)), clamp)


# --- videos: Wan 2.1 latent format ------------------------------------------------------------

def video_to_internal(videos: torch.Tensor) -> torch.Tensor:
    b, t = videos.shape[:2]
    z = _pixels_to_internal(videos.reshape(b * t, *videos.shape[2:]))
    return z.reshape(b, t, *z.shape[1:]).transpose(1, 2).contiguous()  # B, 16, T, h, w


def video_to_latent(videos: torch.Tensor) -> torch.Tensor:
    """[B, T, H, W, 3] in [0, 1] -> Wan21-format latent [B, 16, T, H/2, W/2]."""
    z = video_to_internal(videos)
    mean, std = _wan_stats(z)
    return z * std + mean


def latent_to_video(latent: torch.Tensor, clamp: bool = True) -> torch.Tensor:
    """Wan21-format latent [B, 16, T, h, w] -> videos [B, T, 2h, 2w, 3]."""
    latent = latent.to(torch.float32)
    mean, std = _wan_stats(latent)
    z = (latent - mean) / std
    b, _, t = z.shape[:3]
    frames = _internal_to_pixels(z.transpose(1, 2).reshape(b * t, LATENT_CHANNELS, *z.shape[3:]), clamp)
    return frames.reshape(b, t, *frames.shape[1:])
