"""The main job: a real headless ComfyUI run of an example workflow with the cache.

Starts ComfyUI's own server (main.py, CPU) with this pack in custom_nodes/, queues the example
workflow over the HTTP API with the cache node and, interleaved, the same graph without it, and
prints what the cache did: steps computed and skipped per CFG branch, wall time against the
uncached run, and how far the images are from the uncached ones (PSNR). Images go to out/demo/.

Run it with ``./dev demo`` (which installs the ComfyUI host first if needed).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import pathlib
import shutil
import statistics
import sys

from harness.server import (
    ComfyServer,  # the real-server runner the tests use (./dev puts tests/ on PYTHONPATH)
)

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]

DEFAULT_WORKFLOW = REPO_ROOT / "example_workflows" / "api" / "demo_image_magcache.json"
CACHE_NODE_TYPES = {"ApplyTeaCache", "ApplyMagCache"}


def without_cache(graph: dict) -> dict:
    """The same graph with every cache node bypassed (its consumers take its input model)."""
    graph = copy.deepcopy(graph)
    bypass = {node_id: node["inputs"]["model"] for node_id, node in graph.items()
              if node["class_type"] in CACHE_NODE_TYPES}
    for node_id in bypass:
        del graph[node_id]
    for node in graph.values():
        for name, value in node["inputs"].items():
            if isinstance(value, list) and value[0] in bypass:
                node["inputs"][name] = bypass[value[0]]
    return graph


def with_seed(graph: dict, seed: int, prefix: str) -> dict:
    graph = copy.deepcopy(graph)
    for node in graph.values():
        if "seed" in node["inputs"]:
            node["inputs"]["seed"] = seed
        if node["class_type"] == "SaveImage":
            node["inputs"]["filename_prefix"] = prefix
    return graph


def read_png(path: pathlib.Path) -> list[float]:
    from PIL import Image

    with Image.open(path) as image:
        return [v / 255.0 for v in image.convert("RGB").tobytes()]


def psnr(a: list[float], b: list[float]) -> float:
    mse = sum((x - y) ** 2 for x, y in zip(a, b, strict=True)) / len(a)
    return math.inf if mse == 0 else 10 * math.log10(1.0 / mse)


def caller_path(path: pathlib.Path) -> pathlib.Path:
    """A path as the caller meant it: relative ones against the directory ./dev was called from
    (it runs commands in the repository root), else against the working directory."""
    return (pathlib.Path(os.environ.get("STEPCACHE_CALLER_CWD", os.getcwd())) / path).resolve()


def shown(path: pathlib.Path) -> str:
    """Relative to the repository when inside it, else as it is."""
    return str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else str(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workflow", type=pathlib.Path, default=DEFAULT_WORKFLOW)
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds (plus one warm-up)")
    parser.add_argument("--out", type=pathlib.Path, default=REPO_ROOT / "out" / "demo")
    args = parser.parse_args(argv)
    args.workflow, args.out = caller_path(args.workflow), caller_path(args.out)

    cached_graph = json.loads(args.workflow.read_text())
    uncached_graph = without_cache(cached_graph)
    if uncached_graph.keys() == cached_graph.keys():
        print(f"{shown(args.workflow)} has no ApplyTeaCache/ApplyMagCache node", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)

    print(f"Starting ComfyUI (CPU) with the pack; workflow {shown(args.workflow)}")
    with ComfyServer(test_nodes=False) as server:
        times: dict[str, list[float]] = {"uncached": [], "cached": []}
        scores: list[float] = []
        last_stats: list[dict] = []
        for round_index in range(args.rounds + 1):
            seed = 1000 + round_index
            images = {}
            for name, graph in (("uncached", uncached_graph), ("cached", cached_graph)):
                prefix = f"demo_{name}_{seed}"
                prompt_id = server.queue(with_seed(graph, seed, prefix))
                entry = server.wait(prompt_id, timeout=600)
                if entry["status"]["status_str"] != "success":
                    print(json.dumps(entry["status"], indent=1)[:3000], file=sys.stderr)
                    print(server.log()[-3000:], file=sys.stderr)
                    return 1
                if round_index > 0:  # round 0 loads the model and warms up
                    times[name].append(server.execution_seconds(entry))
                images[name] = sorted(server.base_directory.glob(f"output/{prefix}_*.png"))
                if name == "cached":
                    last_stats = server.get(f"/stepcache/stats?prompt_id={prompt_id}")
            for cached_png, uncached_png in zip(images["cached"], images["uncached"], strict=True):
                scores.append(psnr(read_png(cached_png), read_png(uncached_png)))
                for png in (cached_png, uncached_png):
                    shutil.copy(png, args.out / png.name)
            if round_index > 0:
                print(f"  round {round_index} (seed {seed}): uncached {times['uncached'][-1]:.2f} s, "
                      f"cached {times['cached'][-1]:.2f} s, worst PSNR {min(scores[-len(images['cached']):]):.1f} dB")

    uncached_time = statistics.median(times["uncached"])
    cached_time = statistics.median(times["cached"])
    print()
    for run in last_stats:
        print(f"Cache ({run['label']}): {run['summary']}")
        for branch in run["branches"]:
            print(f"  {branch['branch']:>6}: computed {branch['steps_computed']}, skipped {branch['steps_skipped']}"
                  f"  [{branch['pattern']}]")
    print(f"Wall time (median of {args.rounds}): uncached {uncached_time:.2f} s, cached {cached_time:.2f} s"
          f" -> {uncached_time / cached_time:.2f}x")
    print(f"Output vs uncached: PSNR mean {statistics.fmean(scores):.1f} dB, worst {min(scores):.1f} dB"
          f" over {len(scores)} images")
    (args.out / "stats.json").write_text(json.dumps(last_stats, indent=1))  # scripts/readme_figure.py reads it
    print(f"Images: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
