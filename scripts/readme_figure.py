"""The README's picture: the last demo round uncached beside cached, with the run's skip pattern.

    ./dev demo && ./dev py scripts/readme_figure.py out/demo docs/readme-demo.png
"""

from __future__ import annotations

import json
import pathlib
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.image import imread


def main(demo_dir: pathlib.Path, out: pathlib.Path) -> int:
    run = json.loads((demo_dir / "stats.json").read_text())[0]
    seed = max(int(p.name.split("_")[2]) for p in demo_dir.glob("demo_cached_*.png"))
    rows = {name: sorted(demo_dir.glob(f"demo_{name}_{seed}_*.png")) for name in ("uncached", "cached")}
    columns = len(rows["cached"])
    fig = plt.figure(figsize=(1.6 * columns + 1.4, 4.6), dpi=100)
    grid = fig.add_gridspec(3, columns, height_ratios=[1, 1, 0.55], hspace=0.25, wspace=0.08)
    for row, (name, paths) in enumerate(rows.items()):
        for column, path in enumerate(paths):
            axis = fig.add_subplot(grid[row, column])
            axis.imshow(imread(path), interpolation="nearest")
            axis.set_xticks([])
            axis.set_yticks([])
            if column == 0:
                axis.set_ylabel(name, fontsize=11)
    pattern = run["branches"][0]["pattern"]
    strip = fig.add_subplot(grid[2, :])
    for step, mark in enumerate(pattern):
        strip.add_patch(plt.Rectangle((step, 0), 0.85, 1, color="#3b82f6" if mark == "C" else "#d1d5db"))
    strip.set_xlim(0, len(pattern))
    strip.set_ylim(0, 1)
    strip.axis("off")
    strip.set_title(f"steps (blue: computed, grey: skipped): block stack {run['stack_speedup']:.2f}x fewer rows, "
                    f"rule: {run['method']}", fontsize=9)
    fig.savefig(out, bbox_inches="tight")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])))
