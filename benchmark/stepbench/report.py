"""Turns the raw results into the targets, a markdown report, a speed/quality plot and JSON."""

from __future__ import annotations

import json
import math
import pathlib
import statistics
from typing import Any

NATIVE_LINES = ("EasyCache (native)", "LazyCache (native)")
PSNR_TARGET = 30.0
MATCH_LEVELS = (25.0, 30.0, 35.0)
ROW_LEVELS = (25.0, 30.0, 35.0, 40.0)
# overhead.py's configurations that are installed and active but skip nothing.
NO_SKIP_NAMES = ("magcache no-skip", "magcache defaults no-skip", "teacache no-skip")


def pack_lines(results: list[dict]) -> tuple[str, ...]:
    """The pack's method lines (method, constants, estimator variant), in the order they ran."""
    return tuple(dict.fromkeys(r["line"] for r in results if r["method"] in ("teacache", "magcache")))


def setting_title(s: dict) -> str:
    return f"{s.get('kind', 'image')} model, {s['setting']['name']}"


def _fmt_db(value: float) -> str:
    return "identical" if math.isinf(value) else f"{value:.2f}"


def _fmt_x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


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
    """The configuration of this line with the highest block-stack row speedup at worst-case PSNR >= level."""
    ok = [r for r in _compared(results)
          if r["line"] == line and r["psnr_worst"] >= level and r["row_skip_fraction"] > 0]
    return max(ok, key=lambda r: (r["row_speedup"], r["psnr_worst"]), default=None)


def best_wall(results: list[dict], lines: tuple[str, ...], level: float) -> dict | None:
    """The fastest configuration (wall time) of these lines that skips something at worst PSNR >= level."""
    ok = [r for r in _compared(results) if r["line"] in lines and r["psnr_worst"] >= level and r["skip_fraction"] > 0
          and r.get("wall_speedup") is not None]
    return max(ok, key=lambda r: r["wall_speedup"], default=None)


def targets(data: dict) -> dict:
    """(a)-(e) of the brief, computed from the raw results."""
    out: dict[str, Any] = {}
    settings = data["settings"]
    # (a) per setting: each line's best row speedup at >= 30 dB
    best = {}
    for s in settings:
        rows = {}
        for line in pack_lines(s["results"]) + NATIVE_LINES:
            if not any(r["line"] == line for r in s["results"]):
                continue
            r = best_reduction(s["results"], line)
            rows[line] = None if r is None else {
                "label": r["label"], "row_skip_fraction": r["row_skip_fraction"], "row_speedup": r["row_speedup"],
                "block_speedup": r["block_speedup"], "psnr_worst": r["psnr_worst"], "psnr_mean": r["psnr_mean"],
                "wall_speedup": r.get("wall_speedup")}
        best[setting_title(s)] = rows
    out["a_best_row_speedup_at_30db"] = best
    # (a') per setting and quality level: the best of the pack against each native node, in rows
    levels_out = {}
    for s in settings:
        lines = pack_lines(s["results"])
        per_level = {}
        for level in ROW_LEVELS:
            entry = {"pack": _brief(max((r for line in lines if (r := best_reduction(s["results"], line, level))),
                                        key=lambda r: r["row_speedup"], default=None))}
            for line in NATIVE_LINES:
                entry[line] = _brief(best_reduction(s["results"], line, level))
            per_level[f"{level:g}"] = entry
        levels_out[setting_title(s)] = per_level
    out["a_rows_at_matched_psnr"] = levels_out
    # (b)
    matched = {}
    for s in settings:
        if not any(r.get("wall_speedup") is not None for r in s["results"]):
            continue
        levels = {}
        for level in MATCH_LEVELS:
            pack = best_wall(s["results"], pack_lines(s["results"]), level)
            entry: dict[str, Any] = {"pack": _brief(pack)}
            for line in NATIVE_LINES:
                native = best_wall(s["results"], (line,), level)
                entry[line] = _brief(native)
                entry[f"pack_vs_{line}"] = (pack["wall_speedup"] / native["wall_speedup"]
                                            if pack and native else None)
            levels[f"{level:g}"] = entry
        matched[setting_title(s)] = levels
    out["b_wall_speedup_at_matched_psnr"] = matched
    # (c)
    tracking = {}
    for s in settings:
        values = [r["wall_speedup"] / r["row_speedup"] for r in _compared(s["results"])
                  if r["method"] in ("teacache", "magcache") and r["skip_fraction"] > 0
                  and r.get("wall_speedup") is not None]
        if values:
            tracking[setting_title(s)] = {
                "median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}
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
            for name, r in ((n, overhead["results"][n]) for n in NO_SKIP_NAMES if n in overhead["results"])}
    # (e)
    memory = {}
    for s in settings:
        per_method = {}
        for line in pack_lines(s["results"]) + NATIVE_LINES:
            rows = [r for r in _compared(s["results"]) if r["line"] == line and r["memory"]]
            if rows:
                m = rows[0]["memory"]
                per_method[line] = {"residual_per_branch_bytes": m["residual_per_branch_bytes"],
                                    "residuals_per_branch": max(r["memory"].get("residuals_per_branch", 0)
                                                                for r in rows),
                                    "order": rows[0].get("variant", {}).get("order", 1),
                                    "estimator": rows[0].get("variant", {}).get("estimator"),
                                    "held_bytes": max(r["memory"]["held_bytes"] for r in rows),
                                    "peak_bytes": max(r["memory"]["peak_bytes"] for r in rows),
                                    "tensor_shapes": m["tensor_shapes"]}
        memory[setting_title(s)] = per_method
    if overhead:
        memory["large model"] = {name: overhead["results"][name].get("memory")
                                 for name in NO_SKIP_NAMES if name in overhead["results"]}
    out["e_memory"] = memory
    return out


def _brief(r: dict | None) -> dict | None:
    if r is None:
        return None
    return {"label": r["label"], "wall_speedup": r.get("wall_speedup"), "block_speedup": r["block_speedup"],
            "row_speedup": r["row_speedup"], "psnr_worst": r["psnr_worst"]}


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
    columns = min(len(settings), 2)
    fig_rows = (len(settings) + columns - 1) // columns
    fig, axes = plt.subplots(fig_rows, columns, figsize=(7.5 * columns, 5.5 * fig_rows), squeeze=False)
    colors = {"StepCache TeaCache (published)": "tab:cyan", "StepCache TeaCache (calibrated)": "tab:blue",
              "StepCache MagCache (published)": "tab:orange", "StepCache MagCache (calibrated)": "tab:red",
              NATIVE_LINES[0]: "tab:green", NATIVE_LINES[1]: "tab:purple"}
    dashes = ["-", "--", ":", "-."]
    markers = ["o", "s", "^", "v", "D", "P", "X", "*", "<", ">", "h"]
    cap = 60.0
    for ax, s in zip(axes.flat, settings, strict=False):
        results = _compared(s["results"])
        variants: dict[str, int] = {}
        for line in pack_lines(results) + NATIVE_LINES:
            pts = [(r["row_speedup"], min(r["psnr_worst"], cap)) for r in results
                   if r["line"] == line and r["row_skip_fraction"] > 0]  # a run that skips nothing is identical
            if not pts:
                continue
            base, _, suffix = line.partition(" + ")
            index = variants.setdefault(suffix, len(variants))
            color = colors.get(base, "tab:gray")
            ax.scatter(*zip(*pts, strict=True), color=color, marker=markers[index % len(markers)], alpha=0.25, s=14)
            front = frontier(pts)
            ax.plot(*zip(*front, strict=True), color=color, linestyle=dashes[index % len(dashes)],
                    marker=markers[index % len(markers)], markersize=4, label=line)
        ax.axhline(PSNR_TARGET, color="grey", linewidth=0.8, linestyle=":")
        ax.annotate(f"{PSNR_TARGET:g} dB", (1.0, PSNR_TARGET), xycoords=("axes fraction", "data"), ha="right",
                    va="bottom", fontsize=8, color="grey")
        ax.set_title(f"reference {setting_title(s)}\n(lines: best points; faint: every setting)", fontsize=10)
        ax.set_xlabel("block-stack row speedup (rows total / computed)")
        ax.set_ylabel("worst-case PSNR vs uncached (dB)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    for ax in list(axes.flat)[len(settings):]:
        ax.axis("off")
    fig.tight_layout()
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110)
    plt.close(fig)


# --- markdown ------------------------------------------------------------------------------

def _results_table(results: list[dict]) -> list[str]:
    lines = [
        "| configuration | rows skipped | row speedup | evaluations speedup | wall time ratio (speedup) "
        "| PSNR worst / mean (dB) | SSIM worst / mean | cache memory held / peak | residuals per CFG branch |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        m = r["memory"] or {}
        per_branch = _fmt_bytes(m.get("residual_per_branch_bytes"))
        if m.get("residuals_per_branch"):
            per_branch = f"{m['residuals_per_branch']} x {per_branch}"
        if r["method"] == "lazycache" and m:
            per_branch += " (one, CFG-combined)"
        note = "" if r["deterministic"] else " (nondeterministic!)"
        checked = f" ({r['rows_checked']} checked)" if r.get("rows_checked") else ""
        wall = "-" if r.get("wall_ratio") is None else f"{r['wall_ratio']:.3f} ({r['wall_speedup']:.2f}x)"
        lines.append(
            f"| {r['label']}{note} | {r['row_skip_fraction']:.1%}{checked} | {r['row_speedup']:.2f}x | "
            f"{r['block_speedup']:.2f}x | {wall} | {_fmt_db(r['psnr_worst'])} / {_fmt_db(r['psnr_mean'])} | "
            f"{r['ssim_worst']:.4f} / {r['ssim_mean']:.4f} | "
            f"{_fmt_bytes(m.get('held_bytes'))} / {_fmt_bytes(m.get('peak_bytes'))} | {per_branch} |")
    return lines


def markdown(data: dict, tgt: dict, plot_name: str) -> str:
    meta = data["meta"]
    plan = meta["plan"]
    out = [
        "# The last full sweep (`./dev bench`)",
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
        "- **Models**: " + "; ".join(
            f"the reference {kind} model, `demo.models.load_model(\"{kind}\")` ({desc})"
            for kind, desc in _models(meta).items())
        + ". The image model is detected by the pack as a flux-architecture model (not a published checkpoint); "
        "*published* means FLUX.1-dev's TeaCache polynomial and MagCache ratio table, chosen with the Apply "
        "nodes' variant input (`flux.1-dev`); the video model as Wan 2.1 (its published Wan 2.1 1.3B constants).",
        "- **Sampler settings**: "
        + ", ".join(dict.fromkeys(f"{s['setting']['name']} ({s['setting']['scheduler']})" for s in data["settings"]))
        + "; "
        "negative = the model's null embedding (real cond + uncond model calls, batched by ComfyUI).",
        f"- **Evaluation**: classes {plan['classes']} x seeds {plan['seeds']}, batch {plan['batch']} "
        f"({plan['images']} images or videos per configuration); quality against the uncached output of the same "
        "class and seed.",
        "- **Calibration** (once per model and sampler setting, not saved to disk): `run_calibration()` of "
        "MagCacheCalibrate / "
        f"TeaCacheCalibrate on a batch of classes {plan['calibration_classes']}, seed {plan['calibration_seed']} "
        "(disjoint from the evaluation seeds" + ("" if not plan["notes"] else "; " + "; ".join(plan["notes"])) + ").",
        f"- **Sweeps**: ApplyTeaCache threshold {plan['teacache_thresholds']} "
        f"(max_consecutive_skips {plan['teacache_k']}); "
        f"ApplyMagCache threshold {plan['magcache_thresholds']} x K (max_consecutive_skips) {plan['magcache_ks']}, "
        f"retention_ratio {plan['magcache_retention']}"
        + (f" (the planned rule: error budget {plan['planned_thresholds']}, calibrated constants only)"
           if plan.get("planned_thresholds") and any(v.get("rule") == "planned" for v in plan.get("variants", []))
           else "")
        + f"; each with {' and '.join(plan.get('constants', ['published', 'calibrated']))} "
        "constants, and each combined with the estimator variants: "
        + "; ".join(_variant_text(v) for v in plan.get("variants", [{}]))
        + f". Native EasyCache and LazyCache: reuse_threshold {plan['native_thresholds']}, start_percent 0.15, "
        "end_percent 0.95 (their defaults)."
        + (f" Only configurations matching `{plan['only']}`." if plan.get("only") else ""),
        ("- **Timing**: none (quality-only run: one cached run per pair; rows and quality are deterministic)."
         if meta.get("quality_only") else
         f"- **Timing**: per configuration and per (class, seed) pair, {plan['reps']} interleaved repetitions "
         "(uncached, cached, uncached, cached, ...); the wall time ratio is the median over all pairs and "
         "repetitions of cached / uncached of adjacent runs. Before each configuration one untimed run "
         "(the memory probe) warms it up."),
        "",
        "### How EasyCache was made fair",
        "",
        "ComfyUI's native EasyCache adds its cached difference into the model's input tensor in place "
        "(`x += diff` in `apply_cache_diff`). On a bf16 GPU run that tensor is a private copy, made by the "
        "dtype cast in `BaseModel._apply_model`; on this fp32 CPU host the cast is a no-op, so the input "
        "is the very tensor the sampler then uses as `model_input` in `calculate_denoised`, and EasyCache's "
        "output would be wrong in a way no GPU user sees (the diagnostic row *as-is, no input copy* shows by "
        "how much). "
        "Each native node here therefore gets one extra DIFFUSION_MODEL wrapper, registered on the model clone "
        "*before* the node's own wrappers (so it is the outermost), that hands the model a copy of its input, as "
        "the bf16 cast would. LazyCache (a PREDICT_NOISE wrapper that does not write in place) gets the same "
        "wrapper for symmetry; it changes nothing for it but costs the same copy. The pack needs no such "
        "help: it never writes into the model's input.",
        "",
        "### What is measured, and how",
        "",
        "- **rows**: block-stack work is counted in rows, batch rows x calls (cond and uncond batched are 2 rows "
        "per image per evaluation): what an accelerator pays, and what separate CFG branches save when only one "
        "branch computes. Pack: its own per-run statistics (`LAST_RUN_STATS[node]`: rows_computed, rows_skipped, "
        "rows_checked). **row speedup** = rows total / rows computed, where a skipped row whose first block ran "
        "for the first-block check costs that block's share of the stack (1 / number of blocks: 1/6 on the "
        "image model, whose blocks differ in size, so this is approximate). Native nodes: their log line "
        "`skipped N/M steps`, caught with a logging handler; a skipped step skips the whole model, every row "
        "(N/M). *evaluations speedup* = model calls total / computed (the previous headline figure; separate "
        "CFG branches make more, smaller calls).",
        "- **PSNR / SSIM**: decoded images (`demo.pixels.latent_to_image`, [0, 1]) against the uncached images; "
        "worst case and mean over every image (videos: `latent_to_video`, PSNR over the whole clip, SSIM the mean "
        "over its frames). SSIM: 11x11 Gaussian window (sigma 1.5), per RGB channel, mean. "
        "*identical* = bit-identical output (PSNR infinite; counted as 100 dB in means).",
        "- **cache memory**: a probe (an extra outermost PREDICT_NOISE wrapper on an untimed run, read-only) reads, "
        "after every sampler evaluation, the tensors the cache holds: for the pack the residual (and TeaCache's "
        "previous signal, the first-block check's head residuals) of every conditioning entry in the run's "
        "`RunCache` (`ActiveRun.cache.held_tensors()`), and how many residuals one CFG branch keeps at most "
        "(the estimator's order + 1); for the "
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
        out += [f"## {setting_title(s)} ({s['setting']['scheduler']})", ""]
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
    if data.get("compiled"):
        from .compiled import table

        out += ["## Compiled blocks and the cache", "", table(data["compiled"]), ""]
    return "\n".join(out) + "\n"


def _variant_text(v: dict) -> str:
    if not v:
        return "reuse"
    parts = [{"reuse": "reuse", "forecast": f"forecast order {v.get('order', 1)}",
              "damped_forecast": f"damped forecast {v.get('damping', 0.5):g}"}.get(v.get("estimator"), "?")]
    if v.get("branches") == "separate":
        parts.append("separate CFG branches")
    if v.get("check") not in (None, "off", 0, 0.0):
        parts.append(f"{v['check'].replace('_', '-')} check {v.get('tolerance', 0.1):g}")
    if v.get("rule") == "planned":
        parts.append("planned")
    return ", ".join(parts)


def _models(meta: dict) -> dict:
    return meta.get("models") or {"image": meta.get("model", "?")}


def _targets_md(tgt: dict) -> list[str]:
    out = []
    for setting, by_line in tgt.get("a_best_row_speedup_at_30db", {}).items():
        out += [f"**(a) Best block-stack row speedup at worst-case PSNR >= {PSNR_TARGET:g} dB**, {setting}:", "",
                "| method | best configuration | rows skipped | row speedup | evaluations speedup | worst / mean PSNR "
                "| wall speedup |", "|---|---|---|---|---|---|---|"]
        for line, r in by_line.items():
            if r is None:
                out.append(f"| {line} | none reaches {PSNR_TARGET:g} dB while skipping | - | - | - | - | - |")
            else:
                out.append(f"| {line} | {r['label']} | {r['row_skip_fraction']:.1%} | **{r['row_speedup']:.2f}x** | "
                           f"{r['block_speedup']:.2f}x | {_fmt_db(r['psnr_worst'])} / {_fmt_db(r['psnr_mean'])} | "
                           f"{_fmt_x(r.get('wall_speedup'))} |")
        out.append("")
    rows_at = tgt.get("a_rows_at_matched_psnr", {})
    if rows_at:
        out += ["**(a') Row speedup at matched quality**: the best row speedup of the pack (any line) and of each "
                "native node among configurations with worst-case PSNR at or above the level.", "",
                "| setting | worst PSNR >= | pack (best) | EasyCache | LazyCache |", "|---|---|---|---|---|"]
        for setting, levels in rows_at.items():
            for level, e in levels.items():
                def cell(x: dict | None) -> str:
                    if x is None:
                        return "-"
                    return f"{x['row_speedup']:.2f}x ({x['label']}; {_fmt_db(x['psnr_worst'])} dB)"

                out.append(f"| {setting} | {level} dB | {cell(e['pack'])} | {cell(e[NATIVE_LINES[0]])} | "
                           f"{cell(e[NATIVE_LINES[1]])} |")
        out.append("")
    if tgt["b_wall_speedup_at_matched_psnr"]:
        out += ["**(b) Wall-time speedup at matched quality**: the best wall-time speedup of each side among its "
                "configurations with worst-case PSNR at or above the level (pack = best of its lines).", "",
                "| setting | worst PSNR >= | pack (best) | EasyCache | LazyCache | pack / EasyCache | "
                "pack / LazyCache |",
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
    if tgt["c_wall_vs_block_ratio"]:
        out += ["", "**(c) How the pack's wall-time speedup tracks its block-stack speedup** (wall speedup / "
                "row speedup; 1.0 = every skipped row saves its full share of wall time):", ""]
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
                           f"{v['per_call_median']:+.2f}%, range {v['per_call_min']:+.2f}% to "
                           f"{v['per_call_max']:+.2f}%")
        out += ["", "A whole-run figure within about two standard errors of 0 is below what this machine resolves; "
                "the per-call figure is the steadier one (it leaves out only the once-per-run setup)."]
    out += ["", "**(e) Memory the cache adds** (measured by the probe; residuals one CFG branch keeps at most, "
            "against the bound order + 1, and everything the cache holds over the run):", "",
            "| setting | method | residuals per CFG branch (bound) | held | peak | tensors held |",
            "|---|---|---|---|---|---|"]
    for setting, methods in tgt["e_memory"].items():
        for line, m in methods.items():
            if not m:
                continue
            shapes = "; ".join(f"{k} {v}" for k, v in m["tensor_shapes"].items())
            count = m.get("residuals_per_branch")
            bound = {"forecast": m.get("order", 1) + 1, "damped_forecast": 2, "reuse": 1}.get(m.get("estimator"))
            kept = _fmt_bytes(m["residual_per_branch_bytes"])
            if count:
                kept = f"{count} x {kept}" + (f" (<= {bound})" if bound else "")
            out.append(f"| {setting} | {line} | {kept} | "
                       f"{_fmt_bytes(m['held_bytes'])} | {_fmt_bytes(m['peak_bytes'])} | {shapes} |")
    out += ["", "The pack's residual lives in the block stack's hidden space: tokens x hidden x dtype size per "
            "branch (e.g. FLUX.1 at 1024x1024: 4096 x 3072 x 2 B = 24 MiB per branch in bf16; TeaCache keeps "
            "its previous signal of the same size beside it). EasyCache's difference lives in the "
            "latent/output space (16 x 128 x 128 x 2 B = 512 KiB per branch for the same image)."]
    return out


def _overhead_md(o: dict) -> list[str]:
    out = ["## Cost of the pack when it skips nothing", "",
           f"Model: {o['description']}. Interleaved repetitions, the order alternating (unpatched, the no-skip "
           "configurations, MagCache skipping, then the reverse, ...); ratios against the unpatched run "
           "of the same repetition. MagCache/TeaCache no-skip: threshold 1e-9, so the cache is installed and "
           "active (stack input copied and residual kept on every call, TeaCache's signal computed) but skips "
           "nothing, checked on every run from the pack's statistics; MagCache no-skip is the published method "
           "(reuse, no check), MagCache defaults no-skip the node's defaults (damped forecast, hindsight check). "
           "Every configuration, the unpatched one "
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
    for s in data.get("settings", []):  # results written before rows and kinds were counted
        s.setdefault("kind", "image")
        for r in s["results"]:
            r.setdefault("row_speedup", r["block_speedup"])
            r.setdefault("row_skip_fraction", r["skip_fraction"])
            r.setdefault("variant", {})
    for r in (data.get("overhead") or {}).get("results", {}).values():
        ratios = r["ratios"]
        r.setdefault("mean_ratio", statistics.fmean(ratios))
        r.setdefault("stderr_ratio", statistics.stdev(ratios) / len(ratios) ** 0.5 if len(ratios) > 1 else None)
    return data


SWEEP_MARKER = "<!-- sweep:start (written by ./dev bench --docs; everything above is kept) -->"


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
        path = docs_dir / "benchmark.md"
        # What stands above the sweep's marker stays: the quality levels' headline table (./dev
        # bench --levels) and the hand-kept sections that quote other commands' figures.
        current = path.read_text() if path.exists() else ""
        head = current.split(SWEEP_MARKER, 1)[0] if SWEEP_MARKER in current else ""
        path.write_text(head + SWEEP_MARKER + "\n" + markdown(data, tgt, "benchmark.png"))
    return tgt


def print_targets(tgt: dict) -> str:
    return "\n".join(_targets_md(tgt))
