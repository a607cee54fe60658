"""Lab probe (docs/experiments.md section 27): a skip's error fed back at the next computed step.

The pack now does this itself at the levels that feed back (cache_core/feedback.py, section 28:
D space, next sample, linear); the probe keeps the variants it was chosen from. It turns the pack's
own feedback off while its wrapper runs; ``--off`` runs the level as shipped.

A ``model_function_wrapper`` around a model cached at a quality level keeps
each call's model output; at a computed call after skipped ones it estimates what the skipped calls
should have returned (interpolated between the computed calls around them, or, with
``--interp oracle``, taken from the uncached run), and changes this call's output so that the sample
after it carries none of the estimated error. The sampler's sensitivities come from running the
sampler itself on scalars (``sampler_sensitivities``), so any linear, one-call-per-step sampler works.

    ./dev py -m stepbench.feedback image euler both balanced 'balanced:tolerance=0.08'
    ./dev py -m stepbench.feedback video dpmpp_2m headline --off fast

Prints row speedup, worst and mean PSNR against uncached per level spec (``level:field=value,...``).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import math
import statistics
from collections.abc import Callable
from typing import Any

import torch

from harness import host as host_module


def sampler_sensitivities(sampler_function: Callable[..., torch.Tensor], sigmas: torch.Tensor,
                          extra_options: dict, space: str) -> list[list[float]]:
    """X[i][k]: how much the sample the sampler holds at call i (i = n: its result) moves per unit of
    the model's output at call k, with that output taken as independent of x: the denoised output D
    (``space`` "D") or d = (x - D) / sigma ("d"). The pack's own scalar run
    (``cache_core.feedback.sampler_weights``), here for multistep samplers too."""
    feedback = host_module.boot().pack_module("cache_core.feedback")

    def run_sampler(denoiser: Callable[..., torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        def model(x: torch.Tensor, sigma: torch.Tensor, **options: Any) -> torch.Tensor:
            output = denoiser(x, sigma, **options)
            return output if space == "D" else x - sigma.view(-1, 1) * output

        return sampler_function(model, x, sigmas.double(), extra_args={}, callback=None, disable=True,
                                **extra_options)

    weights = feedback.sampler_weights(run_sampler, len(sigmas) - 1)
    if isinstance(weights, str):
        raise ValueError(weights)
    return [list(row) for row in weights]


class Feedback:
    """The wrapper: one per sampling run."""

    def __init__(self, last_call: dict, sampler: Any, space: str, target: str,
                 interp: str, reference: list[torch.Tensor] | None, log_time: bool = False,
                 cfg: float | None = None, chain: bool = False) -> None:
        self.last_call, self.sampler = last_call, sampler  # last_call["skip"]: what the run cache did
        self.space, self.target, self.interp, self.reference = space, target, interp, reference
        # Multistep samplers (section 34): every call cancels what all earlier deviations leave in the next sample.
        self.chain, self.deviations = chain, []  # deviations: (step, output - what it should have been)
        self.log_time = log_time  # interpolate in log sigma (the multistep samplers' time) instead of sigma
        self.sensitivities: list[list[float]] | None = None
        self.cfg, self.branches = cfg, []
        self.ratios: list[float] = []  # per skipped call, guided: |estimate - truth| / |skipped - truth|
        self.anchors: list[tuple[float, torch.Tensor]] = []  # the computed calls: (sigma, output)
        self.pending: list[tuple[int, float, torch.Tensor]] = []  # skipped since: (step, sigma, output)

    def __call__(self, apply_model: Callable[..., torch.Tensor], args: dict) -> torch.Tensor:
        x, timestep, c = args["input"], args["timestep"], args["c"]
        self.branches = list(args.get("cond_or_uncond") or [])
        self.last_call["skip"] = None
        denoised = apply_model(x, timestep, **c)
        skipped = self.last_call["skip"]
        if skipped is None:  # the cache did not see this call
            return denoised
        sigmas = c["transformer_options"]["sample_sigmas"].cpu()
        sigma = float(timestep[0])
        step = min(range(len(sigmas) - 1), key=lambda i: abs(float(sigmas[i]) - sigma))
        if self.sensitivities is None:
            self.sensitivities = sampler_sensitivities(self.sampler.sampler_function, sigmas,
                                                       self.sampler.extra_options, self.space)
        output = denoised if self.space == "D" else (x - denoised) / sigma
        if self.chain:
            return self.chained(step, sigma, skipped, output, denoised)
        if skipped:
            self.pending.append((step, sigma, output))
            return denoised
        if self.pending and self.anchors:
            row = self.sensitivities[step + 1 if self.target == "next" else -1]
            moved = torch.zeros_like(output)
            for skipped_step, skipped_sigma, skipped_output in self.pending:
                estimate = self.estimate(skipped_step, skipped_sigma, sigma, output)
                moved += row[skipped_step] * (skipped_output - estimate)
                if self.reference is not None:  # how far the estimate is from the truth, against the skip's own error
                    truth = self.reference[skipped_step]
                    self.ratios.append(float(self.guided(estimate - truth).norm()
                                             / self.guided(skipped_output - truth).norm()))
            if abs(row[step]) > 1e-12:
                change = -moved / row[step]  # of this call's output, so the sample after it moves back
                denoised = denoised + change if self.space == "D" else denoised - sigma * change
        self.pending = []
        self.anchors = [*self.anchors[-1:], (sigma, output)]
        return denoised

    def chained(self, step: int, sigma: float, skipped: bool, output: torch.Tensor, denoised: torch.Tensor
                ) -> torch.Tensor:
        """The chained form for multistep samplers: each call, skipped or computed, changes its output so
        that the next sample carries none of the earlier calls' deviations, skips' errors (known once the
        next call computes) and earlier corrections alike, which the sampler's history term reuses."""
        if skipped:
            self.pending.append((step, sigma, output))
        else:
            if self.anchors:
                for skipped_step, skipped_sigma, skipped_output in self.pending:
                    estimate = self.estimate(skipped_step, skipped_sigma, sigma, output)
                    self.deviations.append((skipped_step, skipped_output - estimate))
            self.pending = []
            self.anchors = [*self.anchors[-1:], (sigma, output)]
        row = self.sensitivities[step + 1]
        if not self.deviations or abs(row[step]) < 1e-12:
            return denoised
        carried = sum(row[k] * d for k, d in self.deviations) / row[step]
        self.deviations.append((step, -carried))
        return denoised - carried if self.space == "D" else denoised + sigma * carried

    def guided(self, error: torch.Tensor) -> torch.Tensor:
        """What the sampler sees of a per-branch error: cfg * cond - (cfg - 1) * uncond."""
        branches = self.branches
        if self.cfg is None or sorted(branches) != [0, 1]:
            return error
        parts = error.chunk(len(branches))
        cond, uncond = parts[branches.index(0)], parts[branches.index(1)]
        return cond * self.cfg - uncond * (self.cfg - 1.0)

    def time(self, sigma: float) -> float:
        return math.log(sigma) if self.log_time else sigma

    def estimate(self, step: int, sigma: float, now: float, output: torch.Tensor) -> torch.Tensor:
        """What the skipped call at ``step`` should have returned."""
        if self.interp == "oracle":
            return self.reference[step]
        points = [(self.time(s), v) for s, v in (*self.anchors, (now, output))]
        sigma = self.time(sigma)
        if self.interp == "linear" or len(points) < 3:
            (s0, v0), (s1, v1) = points[-2:]
            return v0 + (v1 - v0) * ((sigma - s0) / (s1 - s0))
        result = torch.zeros_like(output)
        for i, (si, vi) in enumerate(points):  # Lagrange through the last three
            weight = 1.0
            for j, (sj, _) in enumerate(points):
                if j != i:
                    weight *= (sigma - sj) / (si - sj)
            result += weight * vi
        return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=["image", "video"])
    parser.add_argument("sampler", choices=["euler", "dpmpp_2m"])
    parser.add_argument("set", choices=["headline", "second", "both", "held-out"])
    parser.add_argument("specs", nargs="+", help="level or level:field=value,...")
    parser.add_argument("--off", action="store_true",
                        help="the level as shipped (with the pack's own feedback where the level has it)")
    parser.add_argument("--space", choices=["D", "d"], default="D")
    parser.add_argument("--target", choices=["next", "final"], default="next")
    parser.add_argument("--interp", choices=["linear", "quadratic", "oracle"], default="linear")
    parser.add_argument("--cfg", type=float, help="the CFG scale (default: the levels table's, 4)")
    parser.add_argument("--steps", type=int, help="the step count (default: the levels table's)")
    parser.add_argument("--scheduler", help="the ComfyUI scheduler (default: the levels table's, simple)")
    parser.add_argument("--chain", action="store_true",
                        help="every call cancels all earlier deviations in the next sample (multistep samplers)")
    parser.add_argument("--log-time", action="store_true", help="interpolate in log sigma")
    parser.add_argument("--weights", help="the model's weights (default: the reference model)")
    options = parser.parse_args()

    host_module.boot()
    import comfy.samplers
    import comfy.utils

    from harness import sampling
    from stepbench import levels, metrics
    from stepbench.configs import Config
    from stepbench.runner import Bench

    comfy.utils.PROGRESS_BAR_ENABLED = False
    logging.getLogger("stepcache").setLevel(logging.WARNING)  # no line per run
    quality = sampling.pack("cache_core.quality")
    run_cache = sampling.pack("cache_core.run_cache")
    last_call = {"skip": None}
    original_begin = run_cache.RunCache.begin

    def begin(self: Any, *args: Any, **kwargs: Any) -> Any:
        call = original_begin(self, *args, **kwargs)
        last_call["skip"] = bool(call.skip)
        return call

    run_cache.RunCache.begin = begin

    def record(into: list[torch.Tensor]) -> Callable[..., torch.Tensor]:
        def wrapper(apply_model: Callable[..., torch.Tensor], args: dict) -> torch.Tensor:
            x, timestep = args["input"], args["timestep"]
            denoised = apply_model(x, timestep, **args["c"])
            into.append(denoised if options.space == "D" else (x - denoised) / float(timestep[0]))
            return denoised
        return wrapper

    setting = next(s for s in levels.sampler_settings(options.cfg, options.steps, options.scheduler)
                   if s.sampler == options.sampler)
    pairs = (levels.PAIRS[options.kind] + levels.SECOND_SET[options.kind] if options.set == "both"
             else levels.SETS[options.set][options.kind])
    bench = Bench(options.kind, options.weights)
    references, outputs = {}, {}
    for pair in pairs:
        model, outputs[pair] = bench.base.clone(), []
        model.set_model_unet_function_wrapper(record(outputs[pair]))
        references[pair] = bench.decode(bench.sample(model, pair, setting))
    shipped = dict(quality.LEVELS)
    for spec in options.specs:
        name, _, fields = spec.partition(":")
        changes = {key: (int(value) if key in ("max_consecutive_skips", "rate_memory") else float(value))
                   for key, value in (field.split("=") for field in fields.split(",") if field)}
        if not options.off:
            changes.setdefault("feedback", False)  # the probe's wrapper instead of the pack's feedback
        quality.LEVELS[name] = dataclasses.replace(shipped[name], **changes)
        worst, rows_total, rows_computed, ratios = [], 0, 0, []
        for pair, reference in references.items():
            model, node = sampling.apply(bench.base.clone(), "magcache", quality=name)
            if not options.off:
                feedback = Feedback(last_call, comfy.samplers.ksampler(options.sampler), options.space,
                                    options.target, options.interp, outputs[pair], options.log_time, setting.cfg,
                                    options.chain)
                model.set_model_unet_function_wrapper(feedback)
            latent = bench.sample(model, pair, setting)
            if not options.off:
                ratios += feedback.ratios
            counts = bench.skip_counts(Config("magcache"), node, setting, pair)
            rows_total += counts["rows_total"]
            rows_computed += counts["rows_total"] - counts["rows_skipped"]
            worst.append((min(p for p, _ in metrics.compare(reference, bench.decode(latent))), pair))
        quality.LEVELS[name] = shipped[name]
        worst.sort(key=lambda item: item[0])
        print(f"{'off' if options.off else 'fed back'} {spec}: {rows_total / rows_computed:.2f}x, worst "
              f"{worst[0][0]:.2f} (class {worst[0][1].class_index} seed {worst[0][1].seed}), mean "
              f"{metrics.finite_mean([p for p, _ in worst]):.2f}"
              + (f"; guided estimate error / skip error: median {statistics.median(ratios):.2f}" if ratios else ""),
              flush=True)


if __name__ == "__main__":
    main()
