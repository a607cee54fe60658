"""Turns the raw results into the targets, a markdown report, a speed/quality plot and JSON."""

from __future__ import annotations

import json
import math
import pathlib
import statistics
from typing import Any

PACK_LINES = ("StepCache TeaCache (published)", "StepCache TeaCache (calibrated)",
              "StepCache MagCache (published)", "StepCache MagCache (calibrated)")
NATIVE_LINES = ("EasyCache (native)", "LazyCache (native)")
PSNR_TARGET = 30.0
MATCH_LEVELS = (25.0, 30.0, 35.0)


def _fmt_db(value: float) -> str:
    return "identical" if math.isinf(value) else f"{value:.2f}"


def _fmt_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, size in (("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def _compared(results: list[dict]) -> list[dict]:
    """Configurations that take part in comparisons (not the uncached row, not diagnostics)."""
    return [r for r in results if r["method"] != "uncached" and not r["as_is"]]


def best_reduction(results: list[dict], line: str, level: float = PSNR_TARGET) -> dict | None:
    """The configuration of this line skipping the most block evaluations at worst-case PSNR >= level."""
    ok = [r for r in _compared(results) if r["line"] == line and r["psnr_worst"] >= level and r["skip_fraction"] > 0]
    return max(ok, key=lambda r: (r["skip_fraction"], r["psnr_worst"]), default=None)


def best_wall(results: list[dict], lines: tuple[str, ...], level: float) -> dict | None:
    """The fastest configuration (wall time) of these lines that skips something at worst PSNR >= level."""
    ok = [r for r in _compared(results) if r["line"] in lines and r["psnr_worst"] >= level and r["skip_fraction"] > 0]
    return max(ok, key=lambda r: r["wall_speedup"], default=None)


def targets(data: dict) -> dict:
    """(a)-(e) of the brief, computed from the raw results."""
    out: dict[str, Any] = {}
    settings = data["settings"]
    euler = next((s for s in settings if s["setting"]["sampler"] == "euler"), settings[0] if settings else None)
    # (a)
    if euler is not None:
        rows = {}
        for line in PACK_LINES + NATIVE_LINES:
            best = best_reduction(euler["results"], line)
            rows[line] = None if best is None else {
                "label": best["label"], "skip_fraction": best["skip_fraction"], "block_speedup": best["block_speedup"],
                "psnr_worst": best["psnr_worst"], "wall_speedup": best["wall_speedup"]}
        out["a_best_reduction_at_30db"] = {"setting": euler["setting"]["name"], "by_method": rows}
    # (b)
    matched = {}
    for s in settings:
        levels = {}
        for level in MATCH_LEVELS:
            pack = best_wall(s["results"], PACK_LINES, level)
            entry: dict[str, Any] = {"pack": _brief(pack)}
            for line in NATIVE_LINES:
                native = best_wall(s["results"], (line,), level)
                entry[line] = _brief(native)
                entry[f"pack_vs_{line}"] = (pack["wall_speedup"] / native["wall_speedup"]
                                            if pack and native else None)
            levels[f"{level:g}"] = entry
        matched[s["setting"]["name"]] = levels
    out["b_wall_speedup_at_matched_psnr"] = matched
    # (c)
    tracking = {}
    for s in settings:
        values = [r["wall_speedup"] / r["block_speedup"] for r in _compared(s["results"])
                  if r["method"] in ("teacache", "magcache") and r["skip_fraction"] > 0]
        tracking[s["setting"]["name"]] = {
            "median": statistics.median(values) if values else None,
            "min": min(values, default=None), "max": max(values, default=None), "n": len(values)}
    overhead = data.get("overhead")
    if overhead:
        skipping = overhead["results"]["magcache skipping"]
        tracking["large model (" + overhead["description"] + ")"] = {
            "median": (1 / skipping["median_ratio"]) / skipping["block_speedup"],
            "wall_speedup": 1 / skipping["median_ratio"], "block_speedup": skipping["block_speedup"], "n": 1}
    out["c_wall_vs_block_ratio"] = tracking
    # (d)
    if overhead:
        out["d_no_skip_overhead_percent"] = {
            name: {"median": 100 * (r["median_ratio"] - 1), "mean": 100 * (r["mean_ratio"] - 1),
                   "stderr": None if r["stderr_ratio"] is None else 100 * r["stderr_ratio"],
                   "min": 100 * (min(r["ratios"]) - 1), "max": 100 * (max(r["ratios"]) - 1), "n": len(r["ratios"]),
                   "per_call_median": (100 * (r["median_call_ratio"] - 1) if "median_call_ratio" in r else None),
                   "per_call_min": (100 * (min(r["call_ratios"]) - 1) if "call_ratios" in r else None),
                   "per_call_max": (100 * (max(r["call_ratios"]) - 1) if "call_ratios" in r else None)}
            for name, r in ((n, overhead["results"][n]) for n in ("magcache no-skip", "teacache no-skip"))}
    # (e)
    memory = {}
    for s in settings:
        per_method = {}
        for line in PACK_LINES + NATIVE_LINES:
            rows = [r for r in _compared(s["results"]) if r["line"] == line and r["memory"]]
            if rows:
                m = rows[0]["memory"]
                per_method[line] = {"residual_per_branch_bytes": m["residual_per_branch_bytes"],
                                    "held_bytes": max(r["memory"]["held_bytes"] for r in rows),
                                    "peak_bytes": max(r["memory"]["peak_bytes"] for r in rows),
                                    "tensor_shapes": m["tensor_shapes"]}
        memory[s["setting"]["name"]] = per_method
    if overhead:
        memory["large model"] = {name: overhead["results"][name].get("memory")
                                 for name in ("magcache no-skip", "teacache no-skip")}
    out["e_memory"] = memory
    return out


def _brief(r: dict | None) -> dict | None:
    if r is None:
        return None
    return {"label": r["label"], "wall_speedup": r["wall_speedup"], "block_speedup": r["block_speedup"],
            "psnr_worst": r["psnr_worst"]}


# --- plot ----------------------------------------------------------------------------------

def frontier(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Points not beaten by one that is both faster and better, sorted by speed."""
    best: list[tuple[float, float]] = []
    for x, y in sorted(points, key=lambda p: (-p[0], -p[1])):
        if not best or y > best[-1][1]:
            best.append((x, y))
    return sorted(best)


def plot(data: dict, paths: list[pathlib.Path]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    settings = data["settings"]
    if not settings:
        return
    fig, axes = plt.subplots(1, len(settings), figsize=(6.5 * len(settings), 5), squeeze=False)
    styles = {
        PACK_LINES[0]: ("tab:blue", "--", "o"), PACK_LINES[1]: ("tab:blue", "-", "o"),
        PACK_LINES[2]: ("tab:red", "--", "s"), PACK_LINES[3]: ("tab:red", "-", "s"),
        NATIVE_LINES[0]: ("tab:green", "-", "^"), NATIVE_LINES[1]: ("tab:purple", "-", "v"),
    }
    cap = 60.0
    for ax, s in zip(axes[0], settings, strict=True):
        results = _compared(s["results"])
        for line, (color, dash, marker) in styles.items():
            pts = [(r["block_speedup"], min(r["psnr_worst"], cap)) for r in results
                   if r["line"] == line and r["skip_fraction"] > 0]  # a run that skips nothing is identical
            if not pts:
                continue
            ax.scatter(*zip(*pts, strict=True), color=color, marker=marker, alpha=0.3, s=18)
            front = frontier(pts)
            ax.plot(*zip(*front, strict=True), color=color, linestyle=dash, marker=marker, label=line)
        ax.axhline(PSNR_TARGET, color="grey", linewidth=0.8, linestyle=":")
        ax.annotate(f"{PSNR_TARGET:g} dB", (1.0, PSNR_TARGET), xycoords=("axes fraction", "data"), ha="right",
                    va="bottom", fontsize=8, color="grey")
        ax.set_title(f"reference image model, {s['setting']['name']}\n(lines: best points; faint: every setting)",
                     fontsize=10)
        ax.set_xlabel("block-stack speedup (evaluations total / computed)")
        ax.set_ylabel("worst-case PSNR vs uncached (dB)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110)
    plt.close(fig)


# --- markdown ------------------------------------------------------------------------------

def _results_table(results: list[dict]) -> list[str]:
    lines = [
        "| configuration | skipped | block-stack speedup | wall time ratio (speedup) | PSNR worst / mean (dB) "
        "| SSIM worst / mean | cache memory held / peak | residual per CFG branch |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        m = r["memory"] or {}
        per_branch = _fmt_bytes(m.get("residual_per_branch_bytes"))
        if r["method"] == "lazycache" and m:
            per_branch += " (one, CFG-combined)"
        note = "" if r["deterministic"] else " (nondeterministic!)"
        lines.append(
            f"| {r['label']}{note} | {r['skip_fraction']:.1%} | {r['block_speedup']:.2f}x | "
            f"{r['wall_ratio']:.3f} ({r['wall_speedup']:.2f}x) | {_fmt_db(r['psnr_worst'])} / {_fmt_db(r['psnr_mean'])} | "
            f"{r['ssim_worst']:.4f} / {r['ssim_mean']:.4f} | "
            f"{_fmt_bytes(m.get('held_bytes'))} / {_fmt_bytes(m.get('peak_bytes'))} | {per_branch} |")
    return lines


def markdown(data: dict, tgt: dict, plot_name: str) -> str:
    meta = data["meta"]
    plan = meta["plan"]
    out = [
        "# StepCache benchmark",
        "",
        f"Made by `{meta['command']}` on {meta['date']} in {meta['seconds'] / 60:.1f} min.",
        "",
        f"**Machine**: {meta['machine']}. Load average at start / end: {meta['load_start']} / {meta['load_end']} "
        "(other jobs on the machine slow runs unevenly; wall-time ratios are interleaved to cancel that).",
        "",
        "**Host**: the real ComfyUI " + meta["comfyui_version"] + " in this process (tests/harness/host.py: CPU, "
        "fp32), the pack loaded by ComfyUI's own custom-node loader, sampling through `nodes.common_ksampler` "
        "(KSampler).",
        "",
        "## Settings",
        "",
        f"- **Model**: the reference image model, `demo.models.load_model(\"image\")` ({meta['model']}), detected "
        "by the pack as a flux-architecture model (not a published checkpoint); *published* means FLUX.1-dev's "
        "TeaCache polynomial and MagCache ratio table, chosen with the Apply nodes' variant input (`flux.1-dev`).",
        f"- **Sampler settings**: {', '.join(s['setting']['name'] + ' (' + s['setting']['scheduler'] + ')' for s in data['settings'])}; "
        "negative = the model's null embedding (real cond + uncond model calls, batched by ComfyUI).",
        f"- **Evaluation**: classes {plan['classes']} x seeds {plan['seeds']}, batch {plan['batch']} "
        f"({plan['images']} images per configuration); quality against the uncached output of the same class and seed.",
        f"- **Calibration** (once per sampler setting, not saved to disk): `measure()` of MagCacheCalibrate / "
        f"TeaCacheCalibrate on a batch of classes {plan['calibration_classes']}, seed {plan['calibration_seed']} "
        "(disjoint from the evaluation seeds" + ("" if not plan["notes"] else "; " + "; ".join(plan["notes"])) + ").",
        f"- **Sweeps**: ApplyTeaCache threshold {plan['teacache_thresholds']} (max_consecutive_skips {plan['teacache_k']}); "
        f"ApplyMagCache threshold {plan['magcache_thresholds']} x K (max_consecutive_skips) {plan['magcache_ks']}, "
        f"retention_ratio {plan['magcache_retention']}; each with published and with calibrated constants. "
        f"Native EasyCache and LazyCache: reuse_threshold {plan['native_thresholds']}, start_percent 0.15, "
        "end_percent 0.95 (their defaults).",
        f"- **Timing**: per configuration and per (class, seed) pair, {plan['reps']} interleaved repetitions "
        "(uncached, cached, uncached, cached, ...); the wall time ratio is the median over all pairs and "
        "repetitions of cached / uncached of adjacent runs. Before each configuration one untimed run "
        "(the memory probe) warms it up.",
        "",
        "### How EasyCache was made fair",
        "",
        "ComfyUI's native EasyCache adds its cached difference into the model's input tensor in place "
        "(`x += diff` in `apply_cache_diff`). On a bf16 GPU run that tensor is a private copy, made by the "
        "dtype cast in `BaseModel._apply_model`; on this fp32 CPU host the cast is a no-op, so the input "
        "is the very tensor the sampler then uses as `model_input` in `calculate_denoised`, and EasyCache's "
        "output would be wrong in a way no GPU user sees (the diagnostic row *as-is, no input copy* shows by how much). "
        "Each native node here therefore gets one extra DIFFUSION_MODEL wrapper, registered on the model clone "
        "*before* the node's own wrappers (so it is the outermost), that hands the model a copy of its input, as "
        "the bf16 cast would. LazyCache (a PREDICT_NOISE wrapper that does not write in place) gets the same "
        "wrapper for symmetry; it changes nothing for it but costs the same copy. The pack needs no such "
        "help: it never writes into the model's input.",
        "",
        "### What is measured, and how",
        "",
        "- **skipped**: the fraction of block-stack evaluations (model calls; cond and uncond run batched, so one "
        "call per sampler evaluation) not computed, summed over all pairs. Pack: its own per-run statistics "
        "(`LAST_RUN_STATS[node]`: calls_skipped / (calls_computed + calls_skipped)). Native nodes: their log "
        "line `skipped N/M steps`, caught with a logging handler; a skipped step skips the whole model (N/M). "
        "**block-stack speedup** = total / computed.",
        "- **PSNR / SSIM**: decoded images (`demo.pixels.latent_to_image`, [0, 1]) against the uncached images; "
        "worst case and mean over every image. SSIM: 11x11 Gaussian window (sigma 1.5), per RGB channel, mean. "
        "*identical* = bit-identical output (PSNR infinite; counted as 100 dB in means).",
        "- **cache memory**: a probe (an extra outermost PREDICT_NOISE wrapper on an untimed run, read-only) reads, "
        "after every sampler evaluation, the tensors the cache holds: for the pack the residual (and TeaCache's "
        "previous signal) of every call layout in the run's `RunCache` (`ActiveRun.cache._stores`); for the "
        "native nodes the tensors of their holder (`transformer_options[\"easycache\"]`: EasyCache's per-uuid "
        "differences, which are views of one tensor, LazyCache's difference, and both nodes' subsampled "
        "previous input/output). *held* = the most bytes held at once between evaluations (unique storages); "
        "*peak* = held + the largest residual/difference, because a computed call builds the new one "
        "(the pack's private copy of the stack input; the native nodes' `output - x`) before the old one is "
        "dropped (read off the code, not measured). The pack's skipped-call output (stack input + residual) "
        "replaces the stack's own output and is not counted.",
        "- **Reading the wall times**: the reference model is small (64 image tokens, hidden 128, 2 + 4 blocks), "
        "so the work outside the block stack (embeddings, final layer, sampler, CFG) is a large share of a step. "
        "The pack still runs it on a skipped step (it skips the block stack only); EasyCache skips the whole "
        "diffusion model and LazyCache the whole CFG evaluation. Compare (c) with the large-model section for "
        "how wall time follows block evaluations when the blocks dominate. The *uncached* row times the "
        "uncached model against itself: the noise floor of the wall-time ratios.",
        "",
        "## Targets",
        "",
    ]
    out += _targets_md(tgt)
    out += ["", f"![speed versus quality]({plot_name})", ""]
    for s in data["settings"]:
        out += [f"## {s['setting']['name']} ({s['setting']['scheduler']})", ""]
        out += _results_table(s["results"])
        out += [""]
        for method, info in s["calibration"].items():
            text = info["summary"]
            if method == "teacache":  # its measurement lines repeat the MagCache ones above
                text = "\n".join(line for i, line in enumerate(text.splitlines())
                                 if i < 2 or line.startswith("TeaCache coefficients"))
            out += [f"<details><summary>{method} calibration ({info['seconds']:.1f} s)</summary>", "", "```",
                    text, "```", "", "</details>", ""]
    if data.get("overhead"):
        out += _overhead_md(data["overhead"])
    return "\n".join(out) + "\n"


def _targets_md(tgt: dict) -> list[str]:
    out = []
    a = tgt.get("a_best_reduction_at_30db")
    if a:
        out += [f"**(a) Best block-evaluation reduction at worst-case PSNR >= {PSNR_TARGET:g} dB**, {a['setting']}:", "",
                "| method | best configuration | skipped | block-stack speedup | worst PSNR | wall speedup |",
                "|---|---|---|---|---|---|"]
        for line, r in a["by_method"].items():
            if r is None:
                out.append(f"| {line} | none reaches {PSNR_TARGET:g} dB while skipping | - | - | - | - |")
            else:
                out.append(f"| {line} | {r['label']} | {r['skip_fraction']:.1%} | {r['block_speedup']:.2f}x | "
                           f"{_fmt_db(r['psnr_worst'])} | {r['wall_speedup']:.2f}x |")
        out.append("")
    out += ["**(b) Wall-time speedup at matched quality**: the best wall-time speedup of each side among its "
            "configurations with worst-case PSNR at or above the level (pack = best of its four lines).", "",
            "| setting | worst PSNR >= | pack (best) | EasyCache | LazyCache | pack / EasyCache | pack / LazyCache |",
            "|---|---|---|---|---|---|---|"]
    for setting, levels in tgt["b_wall_speedup_at_matched_psnr"].items():
        for level, e in levels.items():
            def cell(x: dict | None) -> str:
                return "-" if x is None else f"{x['wall_speedup']:.2f}x ({x['label']}; {_fmt_db(x['psnr_worst'])} dB)"

            def ratio(v: float | None) -> str:
                return "-" if v is None else f"{v:.2f}"

            out.append(f"| {setting} | {level} dB | {cell(e['pack'])} | {cell(e[NATIVE_LINES[0]])} | "
                       f"{cell(e[NATIVE_LINES[1]])} | {ratio(e['pack_vs_' + NATIVE_LINES[0]])} | "
                       f"{ratio(e['pack_vs_' + NATIVE_LINES[1]])} |")
    out += ["", "**(c) How the pack's wall-time speedup tracks its block-stack speedup** (wall speedup / "
            "block-stack speedup; 1.0 = every skipped evaluation saves its full share of wall time):", ""]
    for setting, t in tgt["c_wall_vs_block_ratio"].items():
        if t.get("median") is None:
            continue
        if t["n"] == 1:
            out.append(f"- {setting}: {t['median']:.3f} (wall {t['wall_speedup']:.2f}x for block-stack "
                       f"{t['block_speedup']:.2f}x)")
        else:
            out.append(f"- {setting}: median {t['median']:.3f} (min {t['min']:.3f}, max {t['max']:.3f}) over "
                       f"{t['n']} skipping configurations")
    d = tgt.get("d_no_skip_overhead_percent")
    if d:
        out += ["", "**(d) Cost when nothing is skipped** (large random-weight model, cache active, 0 skipped; "
                "wall time against the unpatched model, interleaved):", ""]
        for name, v in d.items():
            spread = "" if v["stderr"] is None else f", mean {v['mean']:+.2f}% +- {v['stderr']:.2f}% (s.e.)"
            out.append(f"- {name}: whole runs: median {v['median']:+.2f}%{spread}, range {v['min']:+.2f}% to "
                       f"{v['max']:+.2f}% over {v['n']} repetitions")
            if v.get("per_call_median") is not None:
                out.append(f"  - per model call (median call time of each run, ratio per repetition): median "
                           f"{v['per_call_median']:+.2f}%, range {v['per_call_min']:+.2f}% to {v['per_call_max']:+.2f}%")
        out += ["", "A whole-run figure within about two standard errors of 0 is below what this machine resolves; "
                "the per-call figure is the steadier one (it leaves out only the once-per-run setup)."]
    out += ["", "**(e) Memory the cache adds** (measured by the probe; residual per CFG branch, and everything "
            "the cache holds over the run):", "",
            "| setting | method | residual per CFG branch | held | peak | tensors held |", "|---|---|---|---|---|---|"]
    for setting, methods in tgt["e_memory"].items():
        for line, m in methods.items():
            if not m:
                continue
            shapes = "; ".join(f"{k} {v}" for k, v in m["tensor_shapes"].items())
            out.append(f"| {setting} | {line} | {_fmt_bytes(m['residual_per_branch_bytes'])} | "
                       f"{_fmt_bytes(m['held_bytes'])} | {_fmt_bytes(m['peak_bytes'])} | {shapes} |")
    out += ["", "The pack's residual lives in the block stack's hidden space: tokens x hidden x dtype size per "
            "branch (e.g. FLUX.1 at 1024x1024: 4096 x 3072 x 2 B = 24 MiB per branch in bf16; TeaCache keeps "
            "its previous signal of the same size beside it). EasyCache's difference lives in the "
            "latent/output space (16 x 128 x 128 x 2 B = 512 KiB per branch for the same image)."]
    return out


def _overhead_md(o: dict) -> list[str]:
    out = ["## Cost of the pack when it skips nothing", "",
           f"Model: {o['description']}. Interleaved repetitions, the order alternating (unpatched, MagCache "
           "no-skip, TeaCache no-skip, MagCache skipping, then the reverse, ...); ratios against the unpatched run "
           "of the same repetition. MagCache/TeaCache no-skip: threshold 1e-9, so the cache is installed and "
           "active (stack input copied and residual kept on every call, TeaCache's signal computed) but skips "
           "nothing, checked on every run from the pack's statistics. Every configuration, the unpatched one "
           "included, carries one outermost DIFFUSION_MODEL wrapper that times each model call (the per-call "
           "ratio compares the median call of each run).", "",
           "| configuration | calls computed / skipped | median seconds | median wall ratio | mean +- s.e. "
           "| min / max ratio | median per-call ratio | output identical to unpatched | cache memory held / peak |",
           "|---|---|---|---|---|---|---|---|---|"]
    for name, r in o["results"].items():
        m = r.get("memory") or {}
        calls = f"{r['calls_computed']} / {r['calls_skipped']}" if "calls_computed" in r else "-"
        se = "-" if r.get("stderr_ratio") is None else f"{r['mean_ratio']:.4f} +- {r['stderr_ratio']:.4f}"
        per_call = f"{r['median_call_ratio']:.4f}" if "median_call_ratio" in r else "-"
        if name == "magcache skipping":
            per_call = "- (mixes skipped and computed calls)"
        out.append(f"| {name} | {calls} | {r['median_seconds']:.2f} | {r['median_ratio']:.4f} | {se} | "
                   f"{min(r['ratios']):.4f} / {max(r['ratios']):.4f} | {per_call} | "
                   f"{r.get('identical_to_unpatched', '-')} | "
                   f"{_fmt_bytes(m.get('held_bytes'))} / {_fmt_bytes(m.get('peak_bytes'))} |")
    return [*out, ""]


def _clean(value: Any) -> Any:
    if isinstance(value, float) and (math.isinf(value) or math.isnan(value)):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def restore(data: dict) -> dict:
    """Inverse of the JSON cleaning: "inf"/"nan" back to floats; fills what older files lack."""

    def back(value: Any) -> Any:
        if value in ("inf", "-inf", "nan"):
            return float(value)
        if isinstance(value, dict):
            return {k: back(v) for k, v in value.items()}
        if isinstance(value, list):
            return [back(v) for v in value]
        return value

    data = back({k: v for k, v in data.items() if k != "targets"})
    for r in (data.get("overhead") or {}).get("results", {}).values():
        ratios = r["ratios"]
        r.setdefault("mean_ratio", statistics.fmean(ratios))
        r.setdefault("stderr_ratio", statistics.stdev(ratios) / len(ratios) ** 0.5 if len(ratios) > 1 else None)
    return data


def write(data: dict, out_dir: pathlib.Path, docs_dir: pathlib.Path | None) -> dict:
    tgt = targets(data)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(json.dumps(_clean({**data, "targets": tgt}), indent=1))
    plot_paths = [out_dir / "speed_quality.png"]
    if docs_dir is not None:
        plot_paths.append(docs_dir / "benchmark.png")
    plot(data, plot_paths)
    (out_dir / "results.md").write_text(markdown(data, tgt, "speed_quality.png"))
    if docs_dir is not None:
        docs_dir.mkdir(parents=True, exist_ok=True)
        (docs_dir / "benchmark.md").write_text(markdown(data, tgt, "benchmark.png"))
    return tgt


def print_targets(tgt: dict) -> str:
    return "\n".join(_targets_md(tgt))
