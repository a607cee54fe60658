"""StepCache speed/quality benchmark, in one process of the real ComfyUI.

    ./dev bench --levels   the headline table: the quality levels on both reference models and
                           both samplers, beside EasyCache and LazyCache (quality-only, ~15 min);
                           --second-set: on the other set they were chosen on; --held-out: on
                           seeds neither set has; --context-windows: the video
                           model in ComfyUI's Context Windows (bench-out/ only)
    ./dev bench            full sweep (results: bench-out/results.md, .json, speed_quality.png,
                           and a copy in docs/benchmark.md + docs/benchmark.png); hours on 2 busy
                           CPU cores (--reps 1 about halves the sweep part)
    ./dev bench --gpu      the prepared GPU check (stepbench/gpu.py): real-size random-weight
                           FLUX.1-dev and Wan 2.1 14B in bf16 on one large GPU, a few minutes;
                           --gpu-geometry tiny runs it on CPU at test size (bench-out/gpu.md)
    ./dev bench --quick    reduced sweep to check the plumbing (bench-out/ only); a few minutes
    ./dev bench --quality-only --kinds image --samplers euler --methods magcache \
                --variants estimators --only "published"      quality and skip counts only,
                           no timing (deterministic, valid on a busy machine); bench-out/ only
    ./dev bench --from-json bench-out/results.json   rewrite report and plot, run nothing
    ./dev bench --no-sweep --no-overhead --compile    only compiled blocks vs the cache vs both
                           on the large model (bench-out/ only)

On the reference models (demo.models.load_model("image") and ("video")): uncached, ApplyTeaCache
and ApplyMagCache at threshold sweeps with the published and with a calibrated set of constants,
each combined with the estimator variants (estimator, separate CFG branches, first-block check),
and ComfyUI's native EasyCache and LazyCache, at euler 30 steps and dpmpp_2m 20 steps (cfg 4).
Then the pack's cost when it skips nothing, on a larger random-weight FLUX-class model.
See docs/benchmark.md for what is measured and how.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import logging
import os
import pathlib
import platform
import shlex
import sys
import time

# The harness (tests/harness) and stepbench (benchmark/stepbench) are importable through the
# PYTHONPATH ./dev sets (never the repository root itself, whose nodes/ shadows ComfyUI's).
REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="./dev bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--levels", action="store_true",
                        help="only the headline table: the quality levels on both reference models and both "
                        "samplers beside EasyCache and LazyCache (quality-only; bench-out/levels.md, and the "
                        "top of docs/benchmark.md with --docs); about 15 min")
    parser.add_argument("--second-set", action="store_true",
                        help="with --levels: evaluate on the second set the levels were chosen on (other classes "
                        "and seeds than the headline's)")
    parser.add_argument("--held-out", action="store_true",
                        help="with --levels: evaluate on images and clips the levels were not chosen on (other seeds)")
    parser.add_argument("--weights", action="append", default=[], metavar="KIND=PATH",
                        help="with --levels: another trained model of that kind (./dev train KIND --set seed=1 "
                        "--out PATH) in place of the reference one, to see the levels on a model they were not "
                        "chosen on")
    parser.add_argument("--context-windows", action="store_true",
                        help="with --levels: the video model in ComfyUI's Context Windows (two windows)")
    parser.add_argument("--output-space", action="store_true",
                        help="with --levels: the models cached as the families without block hooks are (Z-Image, "
                        "HiDream, Kandinsky 5, ...): the whole model call is the stack")
    parser.add_argument("--steps", type=int, default=None,
                        help="with --levels: this many steps for every sampler (default: euler 30, dpmpp_2m 20)")
    parser.add_argument("--scheduler", default=None,
                        help="with --levels: this ComfyUI scheduler (default simple), e.g. normal, beta, karras")
    parser.add_argument("--controlnet", action="store_true",
                        help="each quality level on the image model with and without a small ControlNet (~6 min)")
    parser.add_argument("--gpu", action="store_true",
                        help="only the prepared GPU check: real-size random-weight FLUX.1-dev and Wan 2.1 14B in bf16 "
                        "(wall time against rows, no-skip cost, Compile Blocks, held memory; bench-out/gpu.md); "
                        "a few minutes on one large GPU")
    parser.add_argument("--gpu-geometry", choices=["real", "tiny"], default="real",
                        help="with --gpu: tiny runs the same check on CPU at test size")
    parser.add_argument("--gpu-reps", type=int, default=2, help="with --gpu: interleaved repetitions (default 2)")
    parser.add_argument("--quick", action="store_true", help="reduced sweep, small overhead model (~2 min)")
    parser.add_argument("--classes", type=int, default=None, help="evaluation classes (default 4; quick 2)")
    parser.add_argument("--seeds", type=int, default=None, help="seeds per class (default 2; quick 1)")
    parser.add_argument("--batch", type=int, default=1, help="images per run (same class and seed)")
    parser.add_argument("--reps", type=int, default=None,
                        help="interleaved timing repetitions per pair (default 2; quick 1)")
    parser.add_argument("--cfg", type=float, default=4.0, help="CFG scale of the sweep, and of --levels (default 4)")
    parser.add_argument("--samplers", nargs="*", choices=["euler", "dpmpp_2m"], default=None,
                        help="only these sampler settings (default both)")
    parser.add_argument("--kinds", nargs="*", choices=["image", "video"], default=None,
                        help="reference models (default both)")
    parser.add_argument("--quality-only", action="store_true",
                        help="no timing: one cached run per pair (skip counts and quality are deterministic)")
    parser.add_argument("--variants", choices=["reuse", "estimators", "all"], default=None,
                        help="estimator/CFG-branch/check variants swept beside the thresholds "
                        "(default all; quick reuse)")
    parser.add_argument("--variant", action="append", default=None, metavar="SPEC", dest="variant_specs",
                        help="instead of --variants, explicit variants (repeatable): "
                        "reuse|forecast|damped_forecast[,o=N][,d=X][,separate][,hindsight=X|,first_block=X]")
    parser.add_argument("--only", default=None, metavar="REGEX",
                        help="only configurations whose label matches (e.g. 'MagCache \\(published\\)')")
    parser.add_argument("--methods", nargs="*", choices=["teacache", "magcache", "easycache", "lazycache"],
                        default=None, help="only these methods (default all)")
    parser.add_argument("--constants", nargs="*", choices=["published", "calibrated"], default=None,
                        help="the pack's constants (default both)")
    parser.add_argument("--teacache-thresholds", type=float, nargs="*", default=None)
    parser.add_argument("--magcache-thresholds", type=float, nargs="*", default=None)
    parser.add_argument("--magcache-retention", type=float, default=None,
                        help="ApplyMagCache retention_ratio (default 0.2)")
    parser.add_argument("--planned-thresholds", type=float, nargs="*", default=None,
                        help="error budgets of ApplyMagCache's planned rule (variants with ',planned')")
    parser.add_argument("--magcache-ks", type=int, nargs="*", default=None)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1: steadier timings)")
    parser.add_argument("--no-overhead", action="store_true", help="skip the large-model no-skip overhead part")
    parser.add_argument("--no-sweep", action="store_true", help="only the large-model overhead part")
    parser.add_argument("--compile", action="store_true",
                        help="also time Compile Blocks (StepCache) with and without the cache on the large model "
                        "(inductor; its first runs compile, minutes on a CPU)")
    parser.add_argument("--overhead-hidden", type=int, default=None, help="default 512 (quick 256)")
    parser.add_argument("--overhead-depth", type=int, nargs=2, default=None, metavar=("DOUBLE", "SINGLE"),
                        help="default 4 8 (quick 2 4)")
    parser.add_argument("--overhead-latent", type=int, default=None,
                        help="latent side; image tokens = (side/2)^2 (default 64 = 1024 tokens; quick 32)")
    parser.add_argument("--overhead-reps", type=int, default=None,
                        help="default 6 (quick 2); the order alternates, so keep it even")
    parser.add_argument("--overhead-cfg", type=float, default=1.0)
    parser.add_argument("--out", type=pathlib.Path, default=REPO_ROOT / "bench-out")
    parser.add_argument("--docs", action=argparse.BooleanOptionalAction, default=None,
                        help="also write docs/benchmark.md and docs/benchmark.png (default: on for full runs)")
    parser.add_argument("--from-json", type=pathlib.Path, default=None, metavar="RESULTS_JSON",
                        help="run nothing: rewrite the report and plot from an earlier results.json")
    return parser.parse_args(argv)


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import torch

    return (f"{cpu}, {os.cpu_count()} logical CPUs, {platform.system()} {platform.release()}, "
            f"Python {platform.python_version()}, torch {torch.__version__} with {torch.get_num_threads()} "
            "thread(s), no GPU used")


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.from_json is not None:
        return rewrite(args)
    started = time.perf_counter()
    load_start = " ".join(f"{v:.2f}" for v in os.getloadavg())

    from harness import host

    if args.gpu and args.gpu_geometry == "real":
        os.environ[host.HOST_DEVICE_VARIABLE] = "auto"
    host.boot()
    import comfy.utils
    import torch

    torch.set_num_threads(args.threads)
    comfy.utils.PROGRESS_BAR_ENABLED = False
    for handler in logging.getLogger().handlers:  # keep ComfyUI's INFO records (the native nodes'
        handler.setLevel(logging.WARNING)  # log lines are caught), but off the console

    from stepbench import configs, overhead, report, runner

    def progress(text: str) -> None:
        print(text, flush=True)

    if args.gpu:
        from stepbench import gpu

        gpu.run_gpu_check(args.gpu_geometry, args.gpu_reps, args.out, progress)
        print(f"wrote {args.out / 'gpu.md'} in {(time.perf_counter() - started) / 60:.1f} min")
        return 0
    if args.controlnet:
        from stepbench import controlnet

        command = "./dev bench" + "".join(" " + shlex.quote(a) for a in argv)
        print(controlnet.write(controlnet.run_controlnet(progress), command, args.out))
        print(f"wrote {args.out / 'controlnet.md'} in {(time.perf_counter() - started) / 60:.1f} min")
        return 0
    if args.levels:
        from stepbench import levels

        command = "./dev bench" + "".join(" " + shlex.quote(a) for a in argv)
        pair_set = "held-out" if args.held_out else "second" if args.second_set else "headline"
        weights = {}
        for item in args.weights:
            kind, _, path = item.partition("=")
            if kind not in configs.KINDS or not path:
                raise SystemExit(f"--weights {item!r}: expected KIND=PATH with KIND one of {list(configs.KINDS)}")
            weights[kind] = pathlib.Path(os.environ.get("STEPCACHE_CALLER_CWD", os.getcwd())) / path
        kinds = args.kinds or (list(weights) if weights else list(configs.KINDS))
        data = levels.run_levels(kinds, args.samplers, progress, pair_set, args.context_windows, args.cfg, weights,
                                 args.steps, args.scheduler, args.output_space)
        # Only the headline set, at the settings' own cfg, steps and scheduler, writes docs/benchmark.md's
        # headline block.
        headline = (args.docs and pair_set == "headline" and not args.context_windows and not weights
                    and not args.output_space
                    and data["cfg"] == levels.SETTINGS[0].cfg and args.steps is None and args.scheduler is None)
        print(levels.write(data, command, args.out, REPO_ROOT / "docs" / "benchmark.md" if headline else None))
        print(f"wrote {args.out / 'levels.md'} in {(time.perf_counter() - started) / 60:.1f} min")
        return 0

    plan = configs.make_plan(args.quick, args.classes, args.seeds, args.batch, 0 if args.quality_only else args.reps,
                             args.cfg, args.samplers, kinds=args.kinds, variants=args.variants, only=args.only,
                             methods=args.methods, constants=args.constants,
                             teacache_thresholds=args.teacache_thresholds,
                             magcache_thresholds=args.magcache_thresholds, magcache_ks=args.magcache_ks,
                             variant_specs=args.variant_specs, planned_thresholds=args.planned_thresholds,
                             magcache_retention=args.magcache_retention)
    settings_out = []
    models_out = {}
    for kind in [] if args.no_sweep else plan.kinds:
        bench = runner.Bench(kind)
        models_out[kind] = describe_model(bench, kind)
        settings_out += [runner.run_setting(bench, plan, setting, progress) for setting in plan.settings]
        bench.close()

    overhead_out = compiled_out = None
    if (args.compile or not args.no_overhead) and not args.quality_only:
        spec = overhead.OverheadSpec(
            hidden=args.overhead_hidden or (256 if args.quick else 512),
            depth=(args.overhead_depth or ((2, 4) if args.quick else (4, 8)))[0],
            single=(args.overhead_depth or ((2, 4) if args.quick else (4, 8)))[1],
            latent_side=args.overhead_latent or (32 if args.quick else 64),
            reps=args.overhead_reps or (2 if args.quick else 6),
            cfg=args.overhead_cfg,
        )
        if not args.no_overhead:
            overhead_out = overhead.run_overhead(spec, progress)
        if args.compile:
            from stepbench import compiled

            compiled_out = compiled.run_compiled(spec, progress)

    import comfyui_version

    data = {
        "meta": {
            "command": "./dev bench" + "".join(" " + shlex.quote(a) for a in argv),
            "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "seconds": time.perf_counter() - started,
            "machine": machine(),
            "load_start": load_start,
            "load_end": " ".join(f"{v:.2f}" for v in os.getloadavg()),
            "comfyui_version": comfyui_version.__version__,
            "models": models_out,
            "quick": args.quick,
            "quality_only": args.quality_only,
            "plan": {
                "classes": sorted({p.class_index for p in plan.pairs}), "seeds": sorted({p.seed for p in plan.pairs}),
                "batch": args.batch, "images": len(plan.pairs) * args.batch,
                "calibration_classes": plan.calibration_classes, "calibration_seed": plan.calibration_seed,
                "teacache_thresholds": plan.teacache_thresholds, "teacache_k": plan.teacache_k,
                "magcache_thresholds": plan.magcache_thresholds, "magcache_ks": plan.magcache_ks,
                "planned_thresholds": plan.planned_thresholds,
                "magcache_retention": plan.magcache_retention, "native_thresholds": plan.native_thresholds,
                "reps": plan.reps, "notes": plan.notes, "kinds": plan.kinds,
                "variants": [dataclasses.asdict(v) for v in plan.variants], "only": plan.only,
                "methods": list(plan.methods), "constants": list(plan.constants),
            },
        },
        "settings": settings_out,
        "overhead": overhead_out,
        "compiled": compiled_out,
    }
    docs = args.docs if args.docs is not None else not (args.quick or args.quality_only or args.only or args.no_sweep)
    tgt = report.write(data, args.out, REPO_ROOT / "docs" if docs else None)
    print()
    print(report.print_targets(tgt))
    print(f"\nwrote {args.out / 'results.md'}, results.json, speed_quality.png"
          + (" and docs/benchmark.md, docs/benchmark.png" if docs else "")
          + f" in {(time.perf_counter() - started) / 60:.1f} min")
    return 0


def describe_model(bench: object, kind: str) -> str:
    models = bench.models
    weights = models.weights_path(kind)
    _, metadata = models.read_weights(weights)
    return (f"{weights.relative_to(REPO_ROOT)}, {models.parameter_count(bench.base):,} parameters, "
            f"train_steps {metadata.get('train_steps', '?')}")


def rewrite(args: argparse.Namespace) -> int:
    """The report of an earlier run, written again (e.g. after changing the report code)."""
    import json

    from stepbench import report

    data = report.restore(json.loads(args.from_json.read_text()))
    docs = args.docs if args.docs is not None else not data["meta"].get("quick", False)
    tgt = report.write(data, args.out, REPO_ROOT / "docs" if docs else None)
    print(report.print_targets(tgt))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
