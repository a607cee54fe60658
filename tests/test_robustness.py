"""Robustness in the real ComfyUI: randomized run sequences with interrupts, and a memory soak.

The driver and its checks are in harness/fuzz.py. CI runs a bounded budget with a fixed seed;
``./dev fuzz --runs N --seed S`` runs more and prints the same report. STEPCACHE_FUZZ_RUNS and
STEPCACHE_FUZZ_SEED change the test's budget and seed.
"""

from __future__ import annotations

import os

import pytest

RUNS = int(os.environ.get("STEPCACHE_FUZZ_RUNS", "40"))
SEED = int(os.environ.get("STEPCACHE_FUZZ_SEED", "2026"))
MiB = 1 << 20


@pytest.fixture(scope="module")
def fuzz(host):
    from harness import fuzz

    return fuzz


def test_random_run_sequences_never_fail_leak_or_carry_state(fuzz):
    report = fuzz.run_sequence(RUNS, SEED)
    print(report.summary())
    assert report.runs == RUNS
    assert report.cached_runs > 0 and report.identical_checks > 0 and report.interrupted > 0, report.summary()
    assert not report.failures, report.summary()


def test_two_hundred_runs_with_changing_shapes_hold_no_memory(fuzz):
    soak = fuzz.soak(runs=200)
    print(soak.summary())
    assert soak.pack_objects_end == 0, soak.summary()
    assert soak.tensors_end <= soak.tensors_after_warmup, soak.summary()
    assert soak.rss_end - soak.rss_after_warmup < 64 * MiB, soak.summary()
