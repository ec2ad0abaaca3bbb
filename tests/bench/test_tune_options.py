"""`wok tune`: option pairs and sizes refused up front, in the options' names, before any simulating."""

from __future__ import annotations

import json

import pytest

from wok.bench.tune import CpuStage, Profile, SearchConfig, cpu_document, profile_document, tune

# One setting whose ceiling is 1e6 QPS (a batch of 4 in 4 µs): a few seconds of it hold over 1e8 arrivals.
FAST = ["--alpha", "0ms", "--beta", "0.001ms", "--max-batch-sizes", "4", "--delays", "0ms", "--default", "none"]


@pytest.fixture
def no_simulating(monkeypatch):
    import wok.bench.tune as tune_module

    monkeypatch.setattr(tune_module, "max_qps", lambda *a, **k: pytest.fail("simulated before refusing"))


def test_a_search_too_large_to_simulate_is_refused_up_front_in_the_options_names(no_simulating, wok_cli):
    """It simulated the setting's 1 % step (2e7 arrivals, minutes) and was then refused at the first
    bisection step, in the simulator's words ("steps x (warmup_s + step_duration_s) ...")."""
    status, _, err = wok_cli("tune", "--slo-p99", "20ms", *FAST, "--sim-duration", "2000s")
    assert status == 2, err
    assert err == (
        "wok tune: --arrival poisson over --sim-warmup + --sim-duration (2001 s): at most 1e+08 arrivals per "
        "simulated step; got 1.99e+09 expected at 996133 QPS, the highest rate the search can try "
        "(max_batch_size 4, delay 0 ms, of --max-batch-sizes, --delays and --default: its ceiling by the "
        "α, β of --alpha/--beta is 1e+06 QPS); a shorter --sim-warmup + --sim-duration, or a grid with a lower "
        "ceiling, fits\n"
    ), err


def test_a_search_too_large_names_the_profile_when_the_fit_is_a_profiles(tmp_path, no_simulating, wok_cli):
    """With --alpha/--beta (above) the refusal said "the profile's α, β" too, though no profile was given."""
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps(profile_document({1: [1e-6, 1e-6], 4: [4e-6, 4e-6]}, "by hand")))
    grid = ["--max-batch-sizes", "4", "--delays", "0ms", "--default", "none", "--sim-duration", "2000s"]
    status, _, err = wok_cli("tune", "--slo-p99", "20ms", "--profile", str(profile), *grid)
    assert status == 2, err
    assert "its ceiling by the profile's α, β is 1e+06 QPS)" in err, err
    assert "--alpha/--beta" not in err, err


def test_a_dense_trace_is_refused_up_front_by_its_own_count(tmp_path, no_simulating, wok_cli):
    """A trace at its recorded pace offers its own count whatever the rate: 1e9 per second here."""
    trace = tmp_path / "dense.csv"
    trace.write_text("timestamp\n0\n0.000000001\n")
    slow = ["--alpha", "10ms", "--beta", "1ms", "--max-batch-sizes", "4", "--delays", "0ms", "--default", "none"]
    status, _, err = wok_cli("tune", "--slo-p99", "200ms", *slow, "--arrival", f"trace:{trace}", "--sim-duration", "1s")
    assert status == 2, err
    assert err.startswith(f"wok tune: --arrival trace:{trace} over --sim-warmup + --sim-duration (2 s): "), err
    assert "arrivals per simulated step; got " in err


def test_the_cap_counts_only_rates_the_search_can_reach(monkeypatch, wok_cli, tmp_path):
    """The bisection stops one halving short of the ceiling: with --iterations 0 only the 1 % step runs."""
    import wok.bench.tune as tune_module

    runs = []
    monkeypatch.setattr(tune_module, "max_qps", lambda model, *a, **k: runs.append(model) or {
        "max_qps": 0.0, "ceiling_qps": 1.0, "evaluations": 1,
        "step": {"latency_ms": {"p99": None, "p50": None}, "mean_batch_size": None, "utilization": None},
    })  # fmt: skip
    # At the ceiling, 1e6 QPS × 101 s = 1e8 + 1e6: over the cap; at its 1 % step, 1e6.
    status, _, err = wok_cli("tune", "--slo-p99", "20ms", *FAST, "--sim-duration", "100s", "--iterations", "0")
    assert len(runs) == 1 and status == 1, err  # searched (nothing passed: the stand-in's 0 QPS)


def test_the_library_refuses_before_simulating_too(no_simulating):
    search = SearchConfig(slo_p99_ms=20.0, duration_s=2000.0, warmup_s=1.0)
    with pytest.raises(ValueError, match=r"at most 1e\+08 arrivals per simulated step; got 1.99e\+09 expected"):
        tune(Profile(alpha_s=0.0, beta_s=1e-6), search, [4], [0.0], default=None)


def test_sampled_batch_times_beside_a_calibrations_batch_time_are_refused(tmp_path, no_simulating, wok_cli):
    """The calibration's batch time replaced the samples (inputs.batch_times "server",
    sampled_sizes []): --batch-times samples quietly did nothing."""
    profile, cpu = tmp_path / "profile.json", tmp_path / "cpu.json"
    profile.write_text(json.dumps(profile_document({1: [1.1e-3, 1.3e-3], 4: [1.9e-3, 2.1e-3]}, "by hand")))
    stage = CpuStage(cpu_in_s=1e-5, batch_alpha_s=0.5e-3, batch_beta_s=0.1e-3)
    cpu.write_text(json.dumps(cpu_document(stage, "hand")))
    status, _, err = wok_cli(
        "tune", "--slo-p99", "20ms", "--profile", str(profile), "--batch-times", "samples",
        "--cpu-calibration", str(cpu), "--max-batch-sizes", "4", "--delays", "0ms",
    )  # fmt: skip
    assert (status, err) == (
        2,
        f"wok tune: --batch-times samples with --cpu-calibration {cpu}: the calibration carries the server's own "
        "batch time, which replaces the profile's measured samples; give one\n",
    )


@pytest.mark.parametrize(
    ("sizes", "message"),
    [(",", "need at least one batch size and one delay"), ("0", "batch sizes must be ≥ 1 and delays ≥ 0")],
)
def test_a_bad_grid_is_refused_in_the_searchs_words_before_its_size_is_checked(sizes, message, no_simulating, wok_cli):
    """The arrival-cap check ran first and failed on the grid in Python's or the model's words:
    'max() arg is an empty sequence', 'invalid batcher settings: max_batch_size=0, ...'."""
    grid = ["--alpha", "0ms", "--beta", "0.1ms", "--default", "none", "--max-batch-sizes", sizes]
    status, _, err = wok_cli("tune", "--slo-p99", "20ms", *grid)
    assert (status, err) == (2, f"wok tune: {message}\n")


def test_wok_tune_checks_the_searchs_size_once(monkeypatch, wok_cli):
    """run_tune checked the busiest step, then tune() checked it again."""
    import wok.bench.tune as tune_module

    calls = []
    real = tune_module.busiest_step
    monkeypatch.setattr(tune_module, "busiest_step", lambda *a, **k: calls.append(a) or real(*a, **k))
    monkeypatch.setattr(tune_module, "max_qps", lambda model, *a, **k: {
        "max_qps": 0.0, "ceiling_qps": 1.0, "evaluations": 1,
        "step": {"latency_ms": {"p99": None, "p50": None}, "mean_batch_size": None, "utilization": None},
    })  # fmt: skip
    status, _, err = wok_cli("tune", "--slo-p99", "20ms", *FAST, "--sim-duration", "1s")
    assert (status, len(calls)) == (1, 1), err  # searched (the stand-in's 0 QPS meets nothing), checked once


def test_the_library_refuses_in_its_own_names_with_one_exception_class(no_simulating):
    """`check_fits` is the one check: tune() raises its SearchTooLarge, worded with tune()'s parameters."""
    import wok.bench.tune as tune_module

    search = SearchConfig(slo_p99_ms=20.0, duration_s=2000.0, warmup_s=1.0)
    with pytest.raises(tune_module.SearchTooLarge) as refused:
        tune(Profile(alpha_s=0.0, beta_s=1e-6), search, [4], [0.0], default=None)
    assert str(refused.value) == (
        "arrival poisson over warmup_s + duration_s (2001 s): at most 1e+08 arrivals per simulated step; got "
        "1.99e+09 expected at 996133 QPS, the highest rate the search can try (max_batch_size 4, delay 0 ms, of "
        "batch_sizes, delays_s and default: its ceiling by the profile's α, β is 1e+06 QPS); a shorter "
        "warmup_s + duration_s, or a grid with a lower ceiling, fits"
    )
    with pytest.raises(ValueError, match=r"^need at least one batch size and one delay$"):
        tune_module.check_fits(Profile(alpha_s=0.0, beta_s=1e-6), search, [], [0.0], None)
