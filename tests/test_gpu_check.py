"""The prepared GPU check (``./dev bench --gpu``, benchmark/stepbench/gpu.py) where there is no GPU:
its real geometries are the released models' sizes, and the whole check runs at test size on CPU,
forcing the skip patterns it times."""

from __future__ import annotations

import math

import pytest

from harness import host as host_module


def parameters(geometry) -> int:
    builder = host_module.boot().pack_module("demo.model_builder")
    return sum(math.prod(shape) for shape in geometry.template(builder).shapes.values())


def test_real_geometries_have_the_released_models_sizes(host):
    from stepbench import geometry

    # FLUX.1-dev: 11.9B parameters; Wan 2.1 T2V 14B: 14.3B (their model cards say 12B and 14B).
    assert round(parameters(geometry.FLUX1_DEV) / 1e9, 2) == 11.90
    assert round(parameters(geometry.WAN21_14B) / 1e9, 2) == 14.29


@pytest.mark.timeout(900)
def test_the_gpu_check_runs_at_test_size_and_forces_its_skip_patterns(host, tmp_path):
    from stepbench import gpu

    outs = gpu.run_gpu_check("tiny", reps=1, out_dir=tmp_path, progress=lambda line: None)
    assert [o["case"] for o in outs] == [case.name for case in gpu.TINY]
    for out in outs:
        results = out["results"]
        for name in ("no-skip, published method", "no-skip, measured rule"):
            assert results[name]["calls_skipped"] == 0, (out["case"], name, results[name]["summary"])
            assert results[name]["calls_computed"] > 0
        computed = [results[f"K {k} forced"]["calls_computed"] for k in (1, 2, 3)]
        assert computed == sorted(computed, reverse=True) and len(set(computed)) == 3, (out["case"], computed)
        for k in (1, 2, 3):
            forced = results[f"K {k} forced"]
            assert forced["calls_skipped"] > 0 and forced["rows_speedup"] > 1.0
            assert forced["held_bytes"] >= forced["residual_bytes"] > 0
        if "compiled blocks + K 2 forced" in results:
            assert results["compiled blocks + K 2 forced"]["calls_computed"] == results["K 2 forced"]["calls_computed"]
    report = (tmp_path / "gpu.md").read_text()
    assert all(case.name in report for case in gpu.TINY) and "| K 3 forced |" in report
    assert (tmp_path / "gpu.json").exists()
