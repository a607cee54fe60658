"""The benchmark's evaluation sets: the held-out set (``./dev bench --levels --held-out``) shares
no image or clip with the one the quality levels were chosen on, and stays within each reference
model's classes."""

from __future__ import annotations


def test_the_held_out_set_shares_nothing_with_the_levels_set(host):
    from stepbench import levels

    models = host.pack_module("demo.models")
    for kind in ("image", "video"):
        chosen = {(p.class_index, p.seed) for p in levels.PAIRS[kind]}
        held = {(p.class_index, p.seed) for p in levels.HELD_OUT[kind]}
        assert held and not chosen & held, kind
        assert not {c for c, _ in chosen} & {c for c, _ in held}, kind  # other content, not only other noise
        assert max(c for c, _ in held) < len(models.CLASSES[kind]), kind
    assert levels.describe_pairs(levels.HELD_OUT) == (
        "image model: 12 images (classes 4-9 x seeds 10-11), video model: 8 clips (classes 4-7 x seeds 10-11)")
    assert levels.describe_pairs(levels.PAIRS) == (
        "image model: 16 images (classes 0-3 x seeds 0-3), video model: 8 clips (classes 0-3 x seeds 0-1)")
