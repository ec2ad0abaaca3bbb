"""`wok tune` and bench/tune_check.py with the simulator's CPU stage: the calibration's fits on
hand-made measurements, the calibration document, the command-line options."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from wok.bench.tune import (
    CpuStage,
    Profile,
    batch_noise_by_rate,
    ceiling_qps,
    cpu_document,
    cpu_from_document,
    load_cpu,
    model_for,
    overhead_by_rate,
    tune_cpu_stage,
)
from wok.bench.tune_check import cpu_overhead, fit_cpu_stage, markdown, predict, step_cpu

US, MS = 1e-6, 1e-3


def point(rate: float, n: float) -> dict:
    """A metered step of a server whose CPU is exactly: loop 0.05 cores + 120 µs per request;
    worker 0.7 ms + 30 µs·n per batch; gRPC 40 µs, other threads 0.02 cores + 20 µs, the load
    generator 0.08 cores + 140 µs per request; respond = 0.1 ms + 70 µs·(n − 1)/2."""
    return {
        "rate_qps": rate,
        "cores": {
            "loop": 0.05 + 120 * US * rate,
            "model": rate / n * (0.7 * MS + 30 * US * n),
            "grpc": 40 * US * rate,
            "other": 0.02 + 20 * US * rate,
        },
        "loadgen_cores": 0.08 + 140 * US * rate,
        "other_cores": 0.0,
        "mean_batch_size": n,
        "stages_ms": {"respond": 0.1 + 0.07 * (n - 1) / 2},
    }


def test_the_cpu_fit_recovers_a_server_built_by_hand():
    stage, details = fit_cpu_stage([point(300, 2.5), point(1200, 7.5), point(2400, 15.0)], cores=2)
    assert stage.cpu_in_s + stage.cpu_out_s == pytest.approx(120 * US)
    assert stage.cpu_out_s == pytest.approx(70 * US) and stage.cpu_in_s == pytest.approx(50 * US)
    assert (stage.batch_alpha_s, stage.batch_beta_s) == pytest.approx((0.7 * MS, 30 * US))
    # Background: gRPC + other threads + load generator, and the loop's part that is not per request.
    assert stage.background_cpu_s == pytest.approx((40 + 20 + 140) * US)
    assert stage.background_cores == pytest.approx(0.05 + 0.02 + 0.08)
    assert stage.cores == 2 and details["loop_fit"]["r2"] == pytest.approx(1.0)
    # The split is clamped: a respond stage that grows faster than the loop's whole CPU gives c_in = 0.
    steep = [{**p, "stages_ms": {"respond": 1.0 * p["mean_batch_size"]}} for p in (point(300, 2), point(900, 6))]
    s2, _ = fit_cpu_stage(steep, cores=2)
    assert s2.cpu_in_s == 0 and s2.cpu_out_s == pytest.approx(120 * US)
    with pytest.raises(ValueError, match="two metered loads"):
        fit_cpu_stage([point(300, 2)], cores=2)


def test_the_overhead_beside_the_cpu_stage_is_the_latency_less_a_lone_requests_own_time():
    stage = CpuStage(cpu_in_s=50 * US, cpu_out_s=70 * US, batch_alpha_s=0.7 * MS, batch_beta_s=30 * US)
    # Calibration overheads were latency − T(1) with T(1) = 0.2 ms; a lone request's own time here is
    # 50 + 70 + 700 + 30 µs = 0.85 ms, so each latency (o + 0.2 ms) loses 0.85 ms, floored at 0.
    out = cpu_overhead([0.0, 1.0 * MS, 3.0 * MS], 0.2 * MS, stage)
    np.testing.assert_allclose(out, [0.0, 0.35 * MS, 2.35 * MS])


def test_the_stage_replaces_the_profiles_batch_time_and_lowers_the_ceiling(tmp_path):
    profile = Profile(0.1 * MS, 10 * US, samples=((4, (0.2 * MS,)),))
    stage = CpuStage(cpu_in_s=0.4 * MS, cpu_out_s=0.6 * MS, cores=2.0, background_cpu_s=0.1 * MS,
                     batch_alpha_s=1 * MS, batch_beta_s=50 * US)  # fmt: skip
    m = model_for(profile, 16, 2 * MS, cpu=stage, sampled=True)
    assert (m.alpha_s, m.beta_s, m.batch_samples) == (1 * MS, 50 * US, ())  # the server's, not the profile's
    assert (m.cpu_in_s, m.cpu_out_s, m.cores, m.background_cpu_s) == (0.4 * MS, 0.6 * MS, 2.0, 0.1 * MS)
    # Batches alone: 16 / 1.8 ms = 8,889 QPS; the loop: 1 / 1 ms = 1,000 QPS.
    assert ceiling_qps(m) == pytest.approx(1000.0)
    assert ceiling_qps(model_for(profile, 16, 2 * MS)) == pytest.approx(16 / (0.1 * MS + 16 * 10 * US))
    # Without the server's batch time the profile's stays.
    assert model_for(profile, 16, 0.0, cpu=replace(stage, batch_alpha_s=None, batch_beta_s=None)).alpha_s == 0.1 * MS
    path = tmp_path / "cpu.json"
    path.write_text(json.dumps(cpu_document(stage, "by hand", setting={"max_batch_size": 32})))
    assert load_cpu(path) == stage
    with pytest.raises(
        ValueError, match=r"^CPU calibration: expected schema 'wok\.cpustage/1'; got 'wok\.overhead/1'$"
    ):
        cpu_from_document({"schema": "wok.overhead/1"})
    with pytest.raises(ValueError, match="come together"):
        cpu_from_document({**cpu_document(CpuStage(), "by hand"), "batch_alpha_s": 1e-3})
    # Without the server's batch time (both null or both absent) the profile's is simulated.
    alone = cpu_document(CpuStage(cpu_in_s=50 * US), "by hand")
    assert cpu_from_document(alone) == cpu_from_document({k: v for k, v in alone.items() if v is not None})


def test_the_command_lines_cpu_options_lay_over_the_calibration(tmp_path):
    assert tune_cpu_stage(None, None, None) is None
    halves = tune_cpu_stage(None, "0.23ms", None)
    assert (halves.cpu_in_s, halves.cpu_out_s, halves.cores) == pytest.approx((115 * US, 115 * US, 0.0))
    path = tmp_path / "cpu.json"
    path.write_text(json.dumps(cpu_document(CpuStage(cpu_in_s=30 * US, cpu_out_s=90 * US, cores=2.0), "by hand")))
    stage = tune_cpu_stage(path, "0.24ms", 4.0)  # the file's split (1 : 3), the given total and cores
    assert (stage.cpu_in_s, stage.cpu_out_s, stage.cores) == pytest.approx((60 * US, 180 * US, 4.0))
    # It said "--cores -1.0: must be a finite number ≥ 0".
    with pytest.raises(ValueError, match=r"^--cores: expected a finite number >= 0; got -1$"):
        tune_cpu_stage(None, None, -1.0)


@pytest.mark.parametrize(
    ("field", "value", "why"),
    [
        # Read as 0: unbounded cores, and the search ran (exit 0) on a stage the file did not describe.
        ("cores", None, "cores: expected a finite number of cores ≥ 0; got none"),
        ("cpu_out_s", "null", "cpu_out_s: expected a finite number of seconds ≥ 0; got null"),
        # Refused by the simulator without the file: "the CPU stage's times and cores must be finite and ≥ 0".
        ("cpu_in_s", float("nan"), "cpu_in_s: expected a finite number of seconds ≥ 0; got NaN"),  # it said nan
        ("cores", float("inf"), "cores: expected a finite number of cores ≥ 0; got Infinity"),
        ("background_cpu_s", -1e-3, "background_cpu_s: expected a finite number of seconds ≥ 0; got -0.001"),
        # "alpha_s must be a finite number of seconds; got nan": the simulator's field, not the file's.
        ("batch_alpha_s", float("nan"), "batch_alpha_s: expected a finite number of seconds ≥ 0; got NaN"),
        # float() read true as 1 core, and a quoted number as its number.
        ("cores", True, "cores: expected a finite number of cores ≥ 0; got true"),
        ("batch_beta_s", "3e-5", "batch_beta_s: expected a finite number of seconds ≥ 0; got a string ('3e-5')"),
        ("schema", "wok.cpustage/2", "expected schema 'wok.cpustage/1'; got 'wok.cpustage/2'"),
    ],
)
def test_a_cpu_calibration_that_cannot_be_simulated_is_refused_naming_option_file_and_field(
    field, value, why, tmp_path, monkeypatch, wok_cli
):
    import wok.bench.tune as tune_module

    monkeypatch.setattr(tune_module, "max_qps", lambda *a, **k: pytest.fail("simulated before refusing"))
    doc = cpu_document(CpuStage(cpu_in_s=50 * US, cpu_out_s=70 * US, cores=2.0, background_cpu_s=0.2 * MS,
                                batch_alpha_s=0.7 * MS, batch_beta_s=30 * US), "by hand")  # fmt: skip
    if value is None:
        del doc[field]
    else:
        doc[field] = None if value == "null" else value
    path = tmp_path / "cpu.json"
    path.write_text(json.dumps(doc))
    status, _, err = wok_cli(
        "tune", "--slo-p99", "20ms", "--alpha", "1ms", "--beta", "0.1ms", "--max-batch-sizes", "4", "--delays",
        "1ms", "--default", "none", "--cpu-calibration", str(path),
    )  # fmt: skip
    assert (status, err) == (2, f"wok tune: --cpu-calibration {path}: {why}\n")


def test_a_cpu_calibrations_batch_time_of_zero_is_refused_as_its_fields():
    """Refused by the simulator as "batch time α + β·n needs ... α + β > 0", without the file or its fields."""
    doc = cpu_document(CpuStage(batch_alpha_s=0.0, batch_beta_s=0.0), "by hand")
    with pytest.raises(ValueError) as refused:
        cpu_from_document(doc, "c.json")
    assert str(refused.value) == "c.json: batch_alpha_s and batch_beta_s: a batch needs a time, α + β > 0; got both 0"


def test_wok_tune_with_a_cpu_stage_is_bounded_by_the_loop(tmp_path, wok_cli):
    out = tmp_path / "tune.json"
    status, stdout, stderr = wok_cli(
        "tune", "--slo-p99", "20ms", "--alpha", "0.2ms", "--beta", "0.01ms", "--max-batch-sizes", "8,32",
        "--delays", "0ms,2ms", "--default", "none", "--sim-duration", "3s", "--iterations", "5",
        "--per-request-cpu", "1ms", "--cores", "2", "--json", str(out),
    )  # fmt: skip
    assert status == 0, stderr
    assert "CPU stage: loop 500 + 500 µs per request, 2 cores shared" in stdout
    result = json.loads(out.read_text())
    assert result["inputs"]["cpu"]["cpu_in_s"] == pytest.approx(0.5e-3)
    # Every setting's ceiling is the loop's 1,000 QPS, and the search stays below it.
    assert all(r["ceiling_qps"] == pytest.approx(1000.0) for r in result["settings"])
    assert 0 < result["chosen"]["max_qps"] < 1000.0
    status, _, stderr = wok_cli(
        "tune", "--slo-p99", "20ms", "--alpha", "1ms", "--beta", "1ms", "--per-request-cpu", "-1ms"
    )
    assert status == 2 and "wok tune:" in stderr, stderr


def test_tune_check_renders_a_cpu_stage_run_as_markdown():
    row = {
        "offered_qps": 2000.0, "measured_achieved_qps": 1990.0, "measured_p50_ms": 6.0, "predicted_p50_ms": 5.5,
        "measured_p99_ms": 12.0, "predicted_p99_ms": 9.0, "relative_error": -0.25, "batcher_p99_ms": 8.0,
        "batcher_relative_error": -1 / 3, "below_knee": True, "measured_mean_batch_size": 12.0,
        "predicted_mean_batch_size": 11.0, "measured_loop_cores": 0.3, "predicted_loop_utilization": 0.25,
        "other_cores": 0.0,
    }  # fmt: skip
    stage = CpuStage(cpu_in_s=50 * US, cpu_out_s=70 * US, cores=2.0, background_cores=0.15, background_cpu_s=185 * US,
                     batch_alpha_s=0.7 * MS, batch_beta_s=30 * US)  # fmt: skip
    stage = cpu_document(stage, "a ramp")
    doc = {
        "schema": "wok.tunecheck/2",
        "config": {"slo_p99_ms": 50.0},
        "cpu_stage": stage,
        "overhead": {"median_s": 2e-3, "p99_s": 7e-3},
        "tuned_setting": {"max_batch_size": 64, "max_queue_delay_ms": 5.0},
        "host": {"loadavg_at_start": [0.5, 0, 0], "loadavg_at_end": [0.7, 0, 0]},
        "runs": [{"rep": 1, "label": "tuned", "max_batch_size": 64, "max_queue_delay_ms": 5.0,
                  "measured_max_qps": 2000.0, "measured_knee_qps": None, "comparison": [row]}],
        "verdict": {"default_max_qps": [1000.0], "tuned_max_qps": [2000.0], "tuned_at_least_default": True,
                    "steps_within": 0, "steps_below_knee": 1, "quiet_steps_within": 0, "quiet_steps_below_knee": 1,
                    "batcher_steps_within": 0},
    }  # fmt: skip
    text = markdown(doc)
    assert (
        "| 2,000 | 1,990 | 6.0 / 5.5 | 12.0 | 9.0 | -25% | 8.0 | -33% | yes | 12.0 / 11.0 | 0.30 / 0.25 | 0.00 |"
        in text
    )
    assert "loop 50 µs before the batcher + 70 µs after it" in text and "0.700 ms + 0.0300 ms·n" in text
    assert "the batcher alone (profile fit + overheads, no CPU stage) within ±20 % on 0 of them" in text


def _outside_point(rate: float, outside_ms) -> dict:
    from wok.bench.histogram import LatencyHistogram

    return {"offered_qps": rate, "outside_histogram": LatencyHistogram.from_ms(outside_ms).to_dict()}


def test_the_overhead_by_load_interpolates_quantiles_between_calibrations_and_never_extrapolates():
    stage = CpuStage(cpu_in_s=40 * US, cpu_out_s=60 * US)  # the loop's 0.1 ms is the stage's, not overhead
    spread = np.linspace(1.0, 2.0, 1001)  # ms: uniform between 1 and 2
    doc = {"outside_by_rate": [_outside_point(3000, spread + 2.0), _outside_point(1000, spread)]}
    at = overhead_by_rate(doc, stage)
    rel = 0.01  # the histogram's buckets (0.8 %) and the quantile grid
    for rate, shift in ((1000, 0.0), (500, 0.0), (2000, 1.0), (2500, 1.5), (3000, 2.0), (9000, 2.0)):
        got = np.asarray(at(rate)) / MS
        # Every quantile moves by the same shift: the interpolation is of quantiles, not a mixture.
        assert np.median(got) == pytest.approx(1.5 + shift - 0.1, rel=rel), rate
        assert np.quantile(got, 0.99) == pytest.approx(1.99 + shift - 0.1, rel=rel), rate
        assert got.min() >= 0
    # Two calibrations at one rate pool their samples (and sorting them does not compare arrays).
    twice = overhead_by_rate(
        {"outside_by_rate": [_outside_point(1000, [1.0] * 100), _outside_point(1000, [3.0] * 100)]}, stage
    )
    assert np.quantile(np.asarray(twice(1000)) / MS, [0.25, 0.75]) == pytest.approx([0.9, 2.9], rel=rel)
    # Floored at 0 where the outside time is below the loop's own.
    low = overhead_by_rate({"outside_by_rate": [_outside_point(100, [0.05] * 10)]}, stage)
    assert set(low(100)) == {0.0}
    assert overhead_by_rate({}, stage) is None and overhead_by_rate(doc, None) is None


def test_a_prediction_takes_each_steps_overhead_at_its_own_rate():
    import argparse

    profile = Profile(0.1 * MS, 10 * US)
    result = {"steps": [{"nominal_qps": 200.0}, {"nominal_qps": 800.0}], "slo_p99_ms": 50.0}
    args = argparse.Namespace(step_duration=2.0, warmup=0.0, arrival="poisson", seed=3)
    none = predict(result, 8, 1.0, profile, (), args, sampled=False)
    by_rate = predict(result, 8, 1.0, profile, lambda q: (0.010,) if q > 500 else (0.0,), args, sampled=False)
    (a0, a1), (b0, b1) = ([s["latency_ms"]["p50"] for s in r["steps"]] for r in (none, by_rate))
    assert b0 == pytest.approx(a0, abs=1e-9)  # 200 QPS: no overhead
    assert b1 == pytest.approx(a1 + 10.0, abs=0.05)  # 800 QPS: 10 ms on every request
    assert by_rate["steps"][1]["nominal_qps"] == 800.0


def test_the_batch_noise_is_the_spread_of_the_model_time_around_its_mean_at_each_load():
    from wok.bench.histogram import LatencyHistogram

    def point(rate, compute_ms):
        return {"offered_qps": rate, "compute_histogram": LatencyHistogram.from_ms(compute_ms).to_dict()}

    doc = {"outside_by_rate": [point(1000, [1.0] * 100), point(3000, [1.0] * 50 + [3.0] * 50)]}
    at = batch_noise_by_rate(doc)
    steady, spread, between = (np.asarray(at(q)) for q in (1000, 3000, 2000))
    assert steady == pytest.approx(1.0, rel=0.01)
    # At 3000: a mean of 2 ms, so ratios of 0.5 and 1.5; at 2000, each quantile halfway: 0.75 and 1.25.
    assert np.quantile(spread, [0.25, 0.75]) == pytest.approx([0.5, 1.5], rel=0.01)
    assert np.quantile(between, [0.25, 0.75]) == pytest.approx([0.75, 1.25], rel=0.01)
    assert all(np.mean(x) == pytest.approx(1.0, rel=0.01) for x in (steady, spread, between))
    assert batch_noise_by_rate({}) is None and batch_noise_by_rate({"outside_by_rate": [{"offered_qps": 1}]}) is None


def _noise_doc(batches) -> dict:
    """A calibration of one load at 1,000 QPS whose trailers carried `batches`: (compute ms, n), each of
    its n requests with the batch's compute and size, summarised as the bench does."""
    from wok.bench import analysis
    from wok.servertiming import TIMING_COLUMNS

    rows = [(c, n) for c, n in batches for _ in range(n)]
    st = np.zeros((len(rows), len(TIMING_COLUMNS)))
    st[:, TIMING_COLUMNS.index("total")] = 1.0
    st[:, TIMING_COLUMNS.index("compute")] = [c for c, _ in rows]
    st[:, TIMING_COLUMNS.index("batch_requests")] = [n for _, n in rows]
    t = analysis.server_timing_summary(np.full(len(rows), 2.0), st)
    keys = ("compute_histogram", "compute_batch_histogram")
    return {"outside_by_rate": [{"offered_qps": 1000.0, **{k: t[k] for k in keys}}]}


def test_the_batch_noise_counts_each_batch_once_where_the_calibration_knows_the_batches_sizes():
    """Two batches, of 1 request at 1 ms and of 9 at 9 ms. Per request the slow one weighs 9/10 (mean
    8.2 ms, ratios 0.12 and 1.10); per batch 1/2 (mean 5 ms, ratios 0.2 and 1.8)."""
    doc = _noise_doc([(1.0, 1), (9.0, 9)])
    at = batch_noise_by_rate(doc)
    assert at.basis == "batches"
    drawn = np.asarray(at(1000))
    # The 2,000 quantiles of {0.2, 1.8}, linear between the two: half of them above the mean.
    assert np.mean(drawn > 1.0) == pytest.approx(0.5, abs=1e-3)
    assert (drawn.min(), drawn.max()) == pytest.approx((0.2, 1.8), abs=0.005)
    assert np.mean(drawn) == pytest.approx(1.0, rel=0.01)
    # The same load without the sizes (a calibration from before them): per request, as before.
    del doc["outside_by_rate"][0]["compute_batch_histogram"]
    old = batch_noise_by_rate(doc)
    assert old.basis == "requests"
    drawn = np.asarray(old(1000))
    assert np.mean(drawn > 1.0) == pytest.approx(0.9, abs=1e-3)  # the quantiles of {0.12, 1.10 ×9}
    assert (drawn.min(), drawn.max()) == pytest.approx((1 / 8.2, 9 / 8.2), abs=0.005)


def _stored(path: str) -> dict:
    from pathlib import Path

    return json.loads((Path(__file__).resolve().parents[2] / "docs" / "results" / path).read_text(encoding="utf-8"))


STORED_CALIBRATIONS = [
    ("tune-check-50ms-run12-noise.json", "cpu_stage"),
    ("tune-check-50ms-run13-tuner-by-load.json", "cpu_stage"),
    ("gpu-h200-2026-12-04/tune-check.json", "cpu_stage"),
    ("gpu-h200-2026-12-04/tune-cpu.json", None),
]


@pytest.mark.parametrize(("path", "key"), STORED_CALIBRATIONS)
def test_a_stored_calibration_without_batch_sizes_draws_the_same_spread_as_before(path, key):
    """Every committed calibration with compute histograms predates the batch's size in the trailer:
    its spread is the per-request one it was, quantile for quantile (the computation before, inline)."""
    from wok.bench.histogram import LatencyHistogram
    from wok.bench.tune import _quantiles_by_rate

    doc = _stored(path)
    doc = doc[key] if key else doc
    at = batch_noise_by_rate(doc)
    assert at.basis == "requests"
    table = []
    for p in doc["outside_by_rate"]:
        values = LatencyHistogram.from_dict(p["compute_histogram"]).values_ms()
        table.append((p["offered_qps"], values / values.mean()))
    before = _quantiles_by_rate(table)
    for rate in (100.0, 300.0, 500.0, 1000.0, 1500.0, 2400.0, 3000.0):
        assert at(rate) == before(rate), rate


def test_a_stored_calibration_with_batch_sizes_draws_per_batch_and_counts_the_servers_batches():
    """docs/results/tune-cpu-mlp-batches.json (a small tune_check run on the 2-core machine, after the
    trailer carried the batch's size): its spread is per batch, and the trailer's batches (requests /
    compute_batch_histogram's count) are the server's own mean batch size at each load (its metrics)."""
    from wok.bench.histogram import LatencyHistogram

    doc = _stored("tune-cpu-mlp-batches.json")
    assert batch_noise_by_rate(doc).basis == "batches"
    for point, load in zip(doc["points"], doc["outside_by_rate"], strict=True):
        requests = LatencyHistogram.from_dict(load["compute_histogram"]).count
        batches = LatencyHistogram.from_dict(load["compute_batch_histogram"]).count
        assert requests / batches == pytest.approx(point["mean_batch_size"], rel=0.02), load["offered_qps"]


def test_run_14_re_predicted_from_its_stored_documents_gives_its_stored_p99s():
    """docs/tune.md run 14: predict() on its two stored ramps, with the file's profile, CPU stage,
    overhead by load and batch spread (per request: the calibration has no batch sizes), gives each
    stored predicted P99 again, exactly."""
    import argparse

    from wok.bench.tune import profile_from_document

    doc = _stored("gpu-h200-2026-12-04/tune-check.json")
    c = doc["config"]
    args = argparse.Namespace(**{k: c[k] for k in ("step_duration", "warmup", "arrival", "seed")})
    profile = profile_from_document(doc["profile"], "run 14's profile")
    stage = cpu_from_document(doc["cpu_stage"])
    noise = batch_noise_by_rate(doc["cpu_stage"])
    assert noise.basis == "requests"
    by_rate = overhead_by_rate(doc["cpu_stage"], stage)
    for run in doc["runs"]:
        n, d = run["max_batch_size"], run["max_queue_delay_ms"]
        got = predict(run["measured"], n, d, profile, by_rate, args, False, stage, noise)
        assert [s["latency_ms"]["p99"] for s in got["steps"]] == [r["predicted_p99_ms"] for r in run["comparison"]]


def test_a_prediction_stretches_each_batch_by_its_rates_noise():
    import argparse

    profile = Profile(1.0 * MS, 0.0)
    result = {"steps": [{"nominal_qps": 20.0}], "slo_p99_ms": 50.0}
    args = argparse.Namespace(step_duration=5.0, warmup=0.0, arrival="constant", seed=1)
    plain = predict(result, 8, 0.0, profile, (), args, sampled=False)["steps"][0]
    doubled = predict(result, 8, 0.0, profile, (), args, False, None, lambda q: (2.0,))["steps"][0]
    assert plain["latency_ms"]["p50"] == pytest.approx(1.0, rel=1e-6)  # alone, 50 ms apart: one batch of 1
    assert doubled["latency_ms"]["p50"] == pytest.approx(2.0, rel=1e-6)


def test_wok_tune_draws_the_overhead_at_each_rate_from_a_calibration_that_measured_it(tmp_path, wok_cli):
    from wok.bench.histogram import LatencyHistogram

    # No overhead up to 1,000 QPS, 30 ms from 2,000 on: with a 20 ms SLO the search must stay
    # below the rate where the interpolated overhead (linear in between) passes 20 ms − the rest.
    doc = cpu_document(CpuStage(), "by hand")
    doc["outside_by_rate"] = [
        {"offered_qps": q, "outside_histogram": LatencyHistogram.from_ms([ms] * 100).to_dict()}
        for q, ms in ((1000.0, 0.0), (2000.0, 30.0))
    ]
    path = tmp_path / "cpu.json"
    path.write_text(json.dumps(doc))
    out = tmp_path / "tune.json"
    args = ("tune", "--slo-p99", "20ms", "--alpha", "0.2ms", "--beta", "0.01ms", "--max-batch-sizes", "32",
            "--delays", "1ms", "--default", "none", "--sim-duration", "2s", "--iterations", "8")  # fmt: skip
    status, stdout, stderr = wok_cli(*args, "--cpu-calibration", str(path), "--json", str(out))
    assert status == 0, stderr
    assert "drawn at each rate, from the calibration's loads 1,000, 2,000 QPS" in stdout
    result = json.loads(out.read_text())
    assert result["inputs"]["overhead_by_rate_loads"] == [1000.0, 2000.0] and result["inputs"]["overhead"] is None
    # At rate q in (1,000, 2,000) every request carries 30·(q − 1,000)/1,000 ms: ≤ ~19 ms below 1,630 QPS.
    assert 1000 < result["chosen"]["max_qps"] < 1667, result["chosen"]
    # An overhead given on the command line wins over the calibration's. That is settled before
    # the search, so one bisection step (the last --iterations given counts) shows it.
    # So does an explicit 0ms: the operator said there is none.
    for given in ("1ms", "0ms"):
        overridden = (*args, "--iterations", "1", "--cpu-calibration", str(path), "--overhead", given)
        status, _, stderr = wok_cli(*overridden, "--json", str(out))
        assert status == 0, stderr
        assert json.loads(out.read_text())["inputs"]["overhead_by_rate_loads"] is None, given


def test_a_calibration_point_keeps_the_offered_rate_beside_the_measured_one():
    step = {
        "offered_qps": 1_200.0,
        "nominal_qps": 1_000.0,  # the ramp's own step (offered_qps: what the schedule achieved)
        "server_cpu": {"requests": 4_000, "wall_s": 4.0, "threads_us_per_request": {"loop": 100.0, "model": None}},
        "host_cpu": {"loadgen_cores": 0.3, "other_cores": 0.01},
        "mean_batch_size": 6.5,
        "stages_ms": {"compute": 0.6},
    }
    p = step_cpu(step)
    assert p["rate_qps"] == 1_000.0 and p["offered_qps"] == 1_000.0
    assert p["cores"] == pytest.approx({"loop": 0.1, "model": 0.0})  # 100 µs × 1,000 per second
    del step["nominal_qps"]
    assert step_cpu(step)["offered_qps"] == 1_200.0
