"""The batcher simulator against queueing theory and hand-worked schedules."""

from __future__ import annotations

import numpy as np
import pytest

from wok.bench.simulate import BatcherModel, SimConfig, simulate, simulate_ramp


def test_md1_mean_wait_matches_pollaczek_khinchine():
    # Batches of one, no delay window, constant service D = 1 ms: an M/D/1 queue. With
    # λ = 500/s, ρ = λD = 0.5 and the mean wait is Wq = ρD / (2(1 − ρ)) = 0.5 ms.
    rng = np.random.default_rng(1)
    lam, d = 500.0, 1e-3
    arrivals = np.cumsum(rng.exponential(1 / lam, 400_000))
    run = simulate(arrivals, BatcherModel(alpha_s=d, beta_s=0.0, max_batch_size=1, max_queue_delay_s=0.0))
    wait = run.done - arrivals - d
    rho = lam * d
    assert wait.mean() == pytest.approx(rho * d / (2 * (1 - rho)), rel=0.03)
    # Little's law: the mean number in the system over the run is λ·W.
    span = run.done.max()
    in_system = (run.done - arrivals).sum() / span
    assert in_system == pytest.approx(len(arrivals) / span * (run.done - arrivals).mean(), rel=1e-9)
    assert set(run.batch_sizes) == {1}


def test_a_lone_request_waits_out_the_delay_window():
    model = BatcherModel(alpha_s=1e-3, beta_s=0.5e-3, max_batch_size=4, max_queue_delay_s=5e-3)
    arrivals = np.arange(0, 0.1, 0.010)  # one every 10 ms: each is alone in its window
    run = simulate(arrivals, model)
    np.testing.assert_allclose(run.done - arrivals, 5e-3 + 1e-3 + 0.5e-3)
    assert run.batch_sizes == [1] * 10


def test_a_full_batch_leaves_at_once_and_the_next_waits_for_the_instance():
    model = BatcherModel(alpha_s=2e-3, beta_s=1e-3, max_batch_size=4, max_queue_delay_s=1.0)
    arrivals = np.array([0, 0.001, 0.002, 0.003, 0.0035, 0.004, 0.0045, 0.005])
    run = simulate(arrivals, model)
    # First four: full at 3 ms, served 2 + 4·1 = 6 ms → done at 9 ms. Next four: full at
    # 5 ms but the one instance is busy until 9 ms → done at 15 ms.
    np.testing.assert_allclose(run.done, [0.009] * 4 + [0.015] * 4)
    assert run.batch_sizes == [4, 4]


def test_a_bounded_queue_rejects_what_does_not_fit():
    model = BatcherModel(alpha_s=0.1, beta_s=0.0, max_batch_size=1, max_queue_delay_s=0.0, max_queue_size=2)
    arrivals = np.array([0.0, 0.01, 0.02, 0.03, 0.04])
    run = simulate(arrivals, model)
    # The first starts at once; two queue behind it; the last two find the queue full.
    assert run.rejected.tolist() == [False, False, False, True, True]
    np.testing.assert_allclose(run.done[:3], [0.1, 0.2, 0.3])


def test_more_instances_serve_batches_side_by_side():
    model = BatcherModel(alpha_s=0.01, beta_s=0.0, max_batch_size=1, max_queue_delay_s=0.0, instances=2)
    run = simulate(np.zeros(4), model)
    np.testing.assert_allclose(sorted(run.done), [0.01, 0.01, 0.02, 0.02])


def test_a_simulated_ramp_writes_the_bench_schema_with_utilization():
    cfg = SimConfig(
        model=BatcherModel(alpha_s=0.0, beta_s=1e-3, max_batch_size=1, max_queue_delay_s=0.0),
        steps=[300, 600, 900, 1200],
        step_duration_s=20.0,
        slo_p99_ms=50,
    )
    result = simulate_ramp(cfg)
    assert result["schema"] == "wok.bench/1" and result["config"]["source"] == "simulate"
    util = [s["utilization"] for s in result["steps"]]
    # Utilization is λ·β while λβ < 1, then the instance is always busy.
    assert util[:3] == pytest.approx([0.3, 0.6, 0.9], abs=0.03)
    assert util[3] == pytest.approx(1.0, abs=0.01)
    # Past capacity (1000/s) throughput stops following the offer: that is the knee.
    assert result["knee_qps"] == 1200
    assert result["steps"][3]["achieved_qps"] == pytest.approx(1000, rel=0.02)


def test_the_cli_prints_the_table_and_writes_the_schema(tmp_path):
    import json
    import subprocess
    import sys

    out = tmp_path / "sim.json"
    cmd = [
        sys.executable, "-m", "wok", "simulate", "--alpha", "0ms", "--beta", "1ms", "--max-batch-size", "1",
        "--max-queue-delay", "0ms", "--arrival", "poisson", "--steps", "300,600,900", "--step-duration", "60s",
        "--json", str(out),
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "utilization per step: 300 QPS 30%" in done.stdout
    result = json.loads(out.read_text())
    assert [s["nominal_qps"] for s in result["steps"]] == [300, 600, 900]
    assert all("utilization" in s for s in result["steps"])


def test_a_step_offers_what_its_schedule_holds_in_the_measured_window():
    from wok.bench.arrivals import parse_arrivals, window_rate

    model = BatcherModel(alpha_s=0.0, beta_s=1e-5, max_batch_size=1, max_queue_delay_s=0.0)
    cfg = SimConfig(model=model, steps=[1000], step_duration_s=5.0, warmup_s=1.0, arrival="sawtooth")
    step = simulate_ramp(cfg)["steps"][0]
    want = window_rate(parse_arrivals("sawtooth", 1000, duration_s=6.0), 1.0, 6.0)
    assert step["offered_qps"] == pytest.approx(want)
    assert abs(want - 1000) > 100  # the mean over warm-up and window would be 1,000: far off
