"""StepCache speed/quality benchmark, in one process of the real ComfyUI.

    ./dev bench            full sweep (results: bench-out/results.md, .json, speed_quality.png,
                           and a copy in docs/benchmark.md + docs/benchmark.png); about 50 min
                           on 2 busy CPU cores (--reps 1 about halves the sweep part)
    ./dev bench --quick    reduced sweep to check the plumbing (bench-out/ only); under 2 min
    ./dev bench --from-json bench-out/results.json   rewrite report and plot, run nothing

On the reference image model (demo.models.load_model("image")): uncached, ApplyTeaCache and
ApplyMagCache at threshold sweeps with the published and with a calibrated set of constants,
and ComfyUI's native EasyCache and LazyCache, at euler 30 steps and dpmpp_2m 20 steps (cfg 4).
Then the pack's cost when it skips nothing, on a larger random-weight FLUX-class model.
See docs/benchmark.md for what is measured and how.
"""

from __future__ import annotations

import argparse
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
    parser.add_argument("--quick", action="store_true", help="reduced sweep, small overhead model (~2 min)")
    parser.add_argument("--classes", type=int, default=None, help="evaluation classes (default 4; quick 2)")
    parser.add_argument("--seeds", type=int, default=None, help="seeds per class (default 2; quick 1)")
    parser.add_argument("--batch", type=int, default=1, help="images per run (same class and seed)")
    parser.add_argument("--reps", type=int, default=None, help="interleaved timing repetitions per pair (default 2; quick 1)")
    parser.add_argument("--cfg", type=float, default=4.0)
    parser.add_argument("--samplers", nargs="*", choices=["euler", "dpmpp_2m"], default=None,
                        help="only these sampler settings (default both)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1: steadier timings)")
    parser.add_argument("--no-overhead", action="store_true", help="skip the large-model no-skip overhead part")
    parser.add_argument("--no-sweep", action="store_true", help="only the large-model overhead part")
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
            f"Python {platform.python_version()}, torch {torch.__version__} with {torch.get_num_threads()} thread(s), no GPU used")


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.from_json is not None:
        return rewrite(args)
    started = time.perf_counter()
    load_start = " ".join(f"{v:.2f}" for v in os.getloadavg())

    from harness import host

    h = host.boot()
    import comfy.utils
    import torch

    torch.set_num_threads(args.threads)
    comfy.utils.PROGRESS_BAR_ENABLED = False
    for handler in logging.getLogger().handlers:  # keep ComfyUI's INFO records (the native nodes'
        handler.setLevel(logging.WARNING)  # log lines are caught), but off the console

    from stepbench import configs, overhead, report, runner

    def progress(text: str) -> None:
        print(text, flush=True)

    plan = configs.make_plan(args.quick, args.classes, args.seeds, args.batch, args.reps, args.cfg, args.samplers)
    bench = runner.Bench()
    settings_out = [] if args.no_sweep else [runner.run_setting(bench, plan, setting, progress)
                                             for setting in plan.settings]

    overhead_out = None
    if not args.no_overhead:
        spec = overhead.OverheadSpec(
            hidden=args.overhead_hidden or (256 if args.quick else 512),
            depth=(args.overhead_depth or ((2, 4) if args.quick else (4, 8)))[0],
            single=(args.overhead_depth or ((2, 4) if args.quick else (4, 8)))[1],
            latent_side=args.overhead_latent or (32 if args.quick else 64),
            reps=args.overhead_reps or (2 if args.quick else 6),
            cfg=args.overhead_cfg,
        )
        overhead_out = overhead.run_overhead(spec, progress)

    import comfyui_version

    models = h.pack_module("demo.models")
    weights = models.weights_path("image")
    _, metadata = models.read_weights(weights)
    data = {
        "meta": {
            "command": "./dev bench" + "".join(" " + shlex.quote(a) for a in argv),
            "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "seconds": time.perf_counter() - started,
            "machine": machine(),
            "load_start": load_start,
            "load_end": " ".join(f"{v:.2f}" for v in os.getloadavg()),
            "comfyui_version": comfyui_version.__version__,
            "model": f"{weights.relative_to(REPO_ROOT)}, {models.parameter_count(bench.base):,} parameters, "
                     f"train_steps {metadata.get('train_steps', '?')}",
            "quick": args.quick,
            "plan": {
                "classes": sorted({p.class_index for p in plan.pairs}), "seeds": sorted({p.seed for p in plan.pairs}),
                "batch": args.batch, "images": len(plan.pairs) * args.batch,
                "calibration_classes": plan.calibration_classes, "calibration_seed": plan.calibration_seed,
                "teacache_thresholds": plan.teacache_thresholds, "teacache_k": plan.teacache_k,
                "magcache_thresholds": plan.magcache_thresholds, "magcache_ks": plan.magcache_ks,
                "magcache_retention": plan.magcache_retention, "native_thresholds": plan.native_thresholds,
                "reps": plan.reps, "notes": plan.notes,
            },
        },
        "settings": settings_out,
        "overhead": overhead_out,
    }
    docs = args.docs if args.docs is not None else not args.quick
    tgt = report.write(data, args.out, REPO_ROOT / "docs" if docs else None)
    print()
    print(report.print_targets(tgt))
    print(f"\nwrote {args.out / 'results.md'}, results.json, speed_quality.png"
          + (" and docs/benchmark.md, docs/benchmark.png" if docs else "")
          + f" in {(time.perf_counter() - started) / 60:.1f} min")
    return 0


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
