"""./dev fuzz [--runs N] [--seed S] [--soak N]: randomized run sequences and a memory soak in the
real ComfyUI (in-process, tiny models), with the report the robustness tests assert on."""

from __future__ import annotations

import argparse
import sys

from harness import host  # the dev harness package (./dev puts tests/ on PYTHONPATH)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="./dev fuzz", description=__doc__)
    parser.add_argument("--runs", type=int, default=300, help="random runs (default 300)")
    parser.add_argument("--seed", type=int, default=1, help="sequence seed (default 1)")
    parser.add_argument("--soak", type=int, default=200, help="soak runs, cached and uncached (0: none)")
    args = parser.parse_args(argv)
    host.boot()
    from harness import fuzz

    report = fuzz.run_sequence(args.runs, args.seed)
    print(report.summary(), flush=True)
    soaks = [fuzz.soak(args.soak, cached=cached) for cached in (True, False)] if args.soak else []
    for soak in soaks:
        print(soak.summary(), flush=True)
    return 1 if report.failures or any(s.pack_objects_end for s in soaks) else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
