"""bench/ceiling.py: the saturation figures from two scrapes, against hand-worked numbers."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("ceiling", ROOT / "bench" / "ceiling.py")
ceiling = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ceiling)

PROFILE = {
    "fit": {"alpha_s": 0.002, "beta_s": 0.0005, "r2": 1.0},
    "batches": [
        {"batch_size": 8, "median_s": 0.006, "p99_s": 0.007},
        {"batch_size": 16, "median_s": 0.010, "p99_s": 0.011},
        {"batch_size": 32, "median_s": 0.020, "p99_s": 0.021},
    ],
}


def test_saturation_figures_from_two_scrapes():
    before = {"t": 100.0, "samples": 1000.0, "batches": 40.0, "busy_s": 3.0, "idle_queued_s": 0.5}
    # 10 s later: 500 batches of 32 samples ran, 9.5 s busy, 0.2 s idle with requests queued.
    after = {"t": 110.0, "samples": 17000.0, "batches": 540.0, "busy_s": 12.5, "idle_queued_s": 0.7}
    a = ceiling.analyse(PROFILE, before, after)
    assert a["mean_batch_size"] == 32
    assert a["throughput_samples_per_s"] == pytest.approx(1600.0)
    # α + β·32 = 2 ms + 16 ms = 18 ms: 32 / 0.018 = 1777.8 samples/s; 1600 of it is 90%.
    assert a["ceiling_samples_per_s"] == pytest.approx(32 / 0.018)
    assert a["throughput_vs_ceiling"] == pytest.approx(0.9)
    # The profile timed 20 ms at 32: 1600 samples/s, all of it reached.
    assert a["throughput_vs_measured"] == pytest.approx(1.0)
    assert a["busy_fraction"] == pytest.approx(0.95)
    assert a["idle_queued_fraction"] == pytest.approx(0.02)
    assert a["server_batch_time_s"] == pytest.approx(9.5 / 500)
    assert "90.0 %" in ceiling.table({"result": a, "profile": PROFILE, "config": {"offered_qps": 500, "rows": 4}})


def test_measured_time_is_linear_between_the_sizes_timed():
    assert ceiling.measured_time(PROFILE, 16) == pytest.approx(0.010)
    assert ceiling.measured_time(PROFILE, 24) == pytest.approx(0.015)
    assert ceiling.measured_time(PROFILE, 12) == pytest.approx(0.008)
    assert ceiling.measured_time(PROFILE, 40) == pytest.approx(0.020)  # beyond the sizes timed: the largest


def test_a_window_without_batches_is_an_error():
    same = {"t": 1.0, "samples": 0.0, "batches": 0.0, "busy_s": 0.0, "idle_queued_s": 0.0}
    with pytest.raises(ValueError, match="no batch ran"):
        ceiling.analyse(PROFILE, same, same | {"t": 2.0})


def test_rows_must_divide_the_batch_size():
    with pytest.raises(SystemExit):
        ceiling.parse_args(["--rows", "5"])


def _overloaded_step(p99_ms: float) -> dict:
    # 1.3 × overload: the server completes about 1/1.3 of the offered requests over the step.
    return {
        "offered_qps": 1125.0,
        "achieved_qps": 720.0,
        "requests": 18000,
        "duration_s": 16.0,
        "success_rate": 1.0,
        "latency_ms": {"p99": p99_ms},
        "dispatch_lag_ms": {"p99": 0.5},
        "littles_law": {"relative_error": float("nan")},
    }


def test_the_overloaded_step_neither_stops_early_nor_blames_the_generator():
    from wok.bench import analysis

    cfg = ceiling.ramp_config("127.0.0.1:1", 1125.0, ceiling.parse_args([]))
    slow = _overloaded_step(p99_ms=7590.0)  # requests queue for seconds: the server is the limit
    assert analysis.stop_rule(slow, cfg.slo_p99_ms, cfg.stop_factor) is None
    assert not [w for w in analysis.check_precision(slow, cfg.slo_p99_ms) if "under-delivered" in w]
    # A shortfall with quick answers is still the generator's, and still said.
    quick = _overloaded_step(p99_ms=5.0)
    assert [w for w in analysis.check_precision(quick, cfg.slo_p99_ms) if "under-delivered" in w]
