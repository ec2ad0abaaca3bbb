"""`wok tune`: the fit, the bisection and the choice against hand-worked cases; the config it writes."""

from __future__ import annotations

import json
import math
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from wok.bench.simulate import BatcherModel, simulate
from wok.bench.tune import (
    Profile,
    SearchConfig,
    ceiling_qps,
    choose,
    config_toml,
    fit_linear,
    load_overhead,
    load_profile,
    max_qps,
    model_for,
    overhead_document,
    profile_document,
    profile_from_document,
    tune,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def test_fit_recovers_an_exact_line():
    alpha, beta, r2 = fit_linear([1, 2, 4, 8, 16], [1e-3 + 0.25e-3 * n for n in (1, 2, 4, 8, 16)])
    assert alpha == pytest.approx(1e-3) and beta == pytest.approx(0.25e-3) and r2 == pytest.approx(1.0)


def test_fit_by_hand_on_noisy_points():
    # Points (1, 1), (2, 3), (3, 2): mean n 2, mean T 2; β = Σ(n−2)(T−2)/Σ(n−2)² = (−1·−1 + 0 + 1·0)/2 = 0.5,
    # α = 2 − 0.5·2 = 1; residuals −0.5, 1, −0.5 → SSE 1.5 of SST 2 → R² = 0.25.
    alpha, beta, r2 = fit_linear([1, 2, 3], [1, 3, 2])
    assert (alpha, beta, r2) == pytest.approx((1.0, 0.5, 0.25))
    with pytest.raises(ValueError, match="two or more distinct batch sizes; got 1"):
        fit_linear([4, 4], [1, 2])


def test_a_profile_document_round_trips_and_reads_the_profilers_shape(tmp_path):
    doc = profile_document({1: [1e-3, 1.2e-3], 4: [2e-3, 2.2e-3]}, source="test")
    assert doc["schema"] == "wok.profile/1" and [b["batch_size"] for b in doc["batches"]] == [1, 4]
    # On the per-size medians (nearest-rank: 1 and 2 ms): β = (2 − 1) / 3 ms, α = 1 ms − β.
    prof = profile_from_document(doc)
    assert prof.beta_s == pytest.approx(1e-3 / 3) and prof.alpha_s == pytest.approx(1e-3 - 1e-3 / 3)
    assert dict(prof.samples)[4] == (2e-3, 2.2e-3)
    # What `wok profile --json` writes has more keys; only fit and batches[].samples_s are read.
    path = tmp_path / "p.json"
    path.write_text(
        json.dumps(
            {
                "schema": "wok.profile/1",
                "device": {"name": "cpu"},
                "fit": {"alpha_s": -1e-5, "beta_s": 2e-4, "r2": 0.99, "ceiling_qps": 5000},
                "batches": [{"batch_size": 8, "median_s": 1.6e-3, "p99_s": 2e-3, "samples_s": [1.6e-3]}],
            }
        )
    )
    prof = load_profile(path)
    assert prof.alpha_s == 0.0  # a slightly negative fitted α is clamped: the simulator needs α ≥ 0
    assert prof.fitted_alpha_s == -1e-5  # and kept, for the result's warning
    assert prof.beta_s == 2e-4 and prof.samples == ((8, (1.6e-3,)),)
    path.write_text(json.dumps({"schema": "wok.bench/1"}))
    with pytest.raises(ValueError, match=r"wok\.profile/1"):
        load_profile(path)


def test_overhead_samples_round_trip(tmp_path):
    path = tmp_path / "o.json"
    path.write_text(json.dumps(overhead_document([1e-3, 2e-3], "test")))
    assert load_overhead(path) == (1e-3, 2e-3)
    path.write_text(json.dumps({"schema": "wok.overhead/1", "samples_s": []}))
    with pytest.raises(ValueError, match="samples_s"):
        load_overhead(path)


def test_sampled_batch_times_and_overheads_enter_each_latency():
    arrivals = np.arange(200) * 0.01  # 10 ms apart: no request ever waits for another
    model = BatcherModel(
        alpha_s=0.0, beta_s=1e-3, max_batch_size=1, max_queue_delay_s=0.0, batch_samples=((1, (1e-3, 3e-3)),)
    )
    lat = simulate(arrivals, model, rng=np.random.default_rng(3)).done - arrivals
    assert set(np.round(lat * 1e3, 9)) == {1.0, 3.0}
    with_overhead = BatcherModel(alpha_s=1e-3, beta_s=0.0, max_batch_size=1, max_queue_delay_s=0.0,
                                 overhead_samples_s=(0.5e-3,))  # fmt: skip
    np.testing.assert_allclose(simulate(arrivals, with_overhead).done - arrivals, 1.5e-3)
    # A size without samples: the fit scaled by the nearest measured size's spread.
    # Fit T(n) = 1 ms·n, samples at n = 1 average 2 ms (2 × the fit) → E[T(2)] = 2 × 2 ms.
    assert model.mean_batch_time(2) == pytest.approx(4e-3)
    assert model.mean_batch_time(1) == pytest.approx(2e-3)


def test_ceiling_is_instances_times_n_over_t_n():
    model = BatcherModel(alpha_s=1e-3, beta_s=0.25e-3, max_batch_size=16, max_queue_delay_s=0.0, instances=2)
    assert ceiling_qps(model) == pytest.approx(2 * 16 / 5e-3)  # 6,400 QPS


def test_bisection_converges_on_the_ceiling_when_latency_never_grows():
    # Constant arrivals, batches of one, T = 1 ms: below 1,000 QPS no request waits, so every
    # latency is 1 ms ≤ the 1.5 ms SLO, and the ceiling (1,000 QPS) itself counts as failing.
    # Every midpoint passes: after 8 halvings of [10, 1000] the answer is 1000 − 990/2⁸.
    model = BatcherModel(alpha_s=1e-3, beta_s=0.0, max_batch_size=1, max_queue_delay_s=0.0)
    found = max_qps(model, SearchConfig(slo_p99_ms=1.5, arrival="constant", duration_s=2.0, warmup_s=0.0))
    assert found["max_qps"] == pytest.approx(1000 - 990 / 256)
    assert found["evaluations"] == 9
    assert found["step"]["latency_ms"]["p99"] == pytest.approx(1.0)


# Times in units of U = 2⁻¹⁰ s, so that every arrival plus a latency, and back, is exact in binary.
U = 2**-10


@pytest.mark.parametrize("iterations", [5, 8])
def test_the_slo_binds_below_the_ceiling_where_a_bisection_by_hand_says(iterations, tmp_path, wok_cli):
    """Every other exact max_qps is the grid's top or 0: neither tells P99 ≤ SLO from P99 < SLO, or an
    SLO in the wrong unit. By hand: constant arrivals 1/λ apart from 0, a 4U window, batches of up to
    16 taking T(b) = 2U + b·U/4. A batch leaves 4U after its first request (an arrival at that instant
    joins it) with b = ⌊4U·λ⌋ + 1 requests, and while T(b) ≤ b/λ (b ≤ 4, where b/λ > 4U ≥ T(4) = 3U)
    the instance is free when it leaves; the next batch starts at the next arrival, so every batch is
    alike. Its first request waits longest, 4U + T(b) = 6.25U + b·U/4; 1/b of all requests do, more
    than 1 %, so that is the P99. The SLO of 7U = 6.8359375 ms is met exactly (P99 = SLO) with b = 4
    and missed from b = 5 on (by at least 1/b of the requests, queueing or not): a step passes iff
    λ < 1/U = 1,024 QPS. The ceiling is 16/T(16) = 16/6U = 8,192/3 QPS, the search starts at 1 % of it, and a
    bisection of a pass-below-a-rate test ends on the highest point lo + (top − lo)·j/2ᵏ below it."""
    out = tmp_path / "tune.json"
    status, _, err = wok_cli(
        "tune", "--slo-p99", "6.8359375ms", "--arrival", "constant", "--alpha", f"{2 * U!r}s", "--beta",
        f"{U / 4!r}s", "--max-batch-sizes", "16", "--delays", f"{4 * U!r}s", "--default", "none",
        "--sim-warmup", "0s", "--sim-duration", "2s", "--iterations", str(iterations), "--json", str(out),
    )  # fmt: skip
    assert status == 0, err
    (row,) = json.loads(out.read_text())["settings"]
    top = 8192 / 3
    lo = top / 100
    j = math.ceil((1024 - lo) / (top - lo) * 2**iterations) - 1  # 11 of 32, 94 of 256
    assert row["ceiling_qps"] == pytest.approx(top, rel=1e-12)
    assert row["max_qps"] == pytest.approx(lo + (top - lo) * j / 2**iterations, rel=1e-12)
    assert 768 <= row["max_qps"] < 1024  # 956.6 and 1,019.9 QPS: batches of 4, whose P99 is the SLO itself
    assert (row["p99_ms"], row["mean_batch_size"]) == (6.8359375, 4.0)
    assert row["evaluations"] == 1 + iterations


@pytest.mark.parametrize(("alpha_s", "wasted"), [(0.968e-3, "repeats a rate"), (0.1e-3, "simulates the ceiling")])
def test_the_bisection_stops_where_doubles_run_out(alpha_s, wasted, monkeypatch):
    """The interval [1 % of the ceiling, the ceiling] holds a double strictly between its ends for 51
    halvings (tune.MAX_ITERATIONS): a batch of one in 0.968 ms (1,033 QPS) repeats its lower end at the
    52nd, one in 0.1 ms simulates the ceiling itself at the 53rd; there, with a latency that never grows,
    it passed, and `--iterations 53` returned the ceiling, which counts as failing."""
    import wok.bench.tune as tune_module

    rates = []
    real = tune_module.evaluate
    monkeypatch.setattr(tune_module, "evaluate", lambda model, qps, *a: rates.append(qps) or real(model, qps, *a))
    model = BatcherModel(alpha_s=alpha_s, beta_s=0.0, max_batch_size=1, max_queue_delay_s=0.0)
    search = SearchConfig(slo_p99_ms=1.5, arrival="constant", duration_s=0.2, warmup_s=0.0, iterations=51)
    found = max_qps(model, search)
    assert len(set(rates)) == len(rates) == 52 and max(rates) < found["ceiling_qps"] == pytest.approx(1 / alpha_s)
    with pytest.raises(ValueError) as refused:
        replace(search, iterations=52)
    assert str(refused.value) == "iterations: expected an integer from 0 to 51; got 52", wasted


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        # A NaN tie left choose() no row within it: "min() arg is an empty sequence", after the whole search.
        ("tie", float("nan"), "tie: expected a number in [0, 1); got nan"),
        ("tie", 1.0, "tie: expected a number in [0, 1); got 1.0"),
        ("iterations", -1, "iterations: expected an integer from 0 to 51; got -1"),
        ("iterations", 2.0, "iterations: expected an integer from 0 to 51; got 2.0"),
        # Refused by the simulator at the first step, in its words ("seed must be >= 0"); then as "≥ 0", alone.
        ("seed", -1, "seed: expected an integer >= 0; got -1"),
        ("seed", True, "seed: expected an integer >= 0; got True"),
    ],
)
def test_the_library_refuses_a_search_it_cannot_run_in_its_parameters_names(field, value, message):
    with pytest.raises(ValueError) as refused:
        search = SearchConfig(slo_p99_ms=20.0, duration_s=0.5, warmup_s=0.0, **{"iterations": 1, field: value})
        tune(Profile(alpha_s=1e-3, beta_s=1e-4), search, [4], [1e-3], default=None)
    assert str(refused.value) == message


def test_a_delay_longer_than_the_slo_scores_zero_and_the_tuner_picks_another():
    # SLO 5 ms. With a 10 ms window, a request at 1 % of the ceiling waits the whole window: 0 QPS.
    profile = Profile(alpha_s=1e-3, beta_s=0.1e-3)
    search = SearchConfig(slo_p99_ms=5.0, arrival="constant", duration_s=2.0, warmup_s=0.0, iterations=4)
    result = tune(profile, search, [8], [0.0, 10e-3], default=None)
    rows = {r["max_queue_delay_ms"]: r for r in result["settings"]}
    assert rows[10.0]["max_qps"] == 0.0 and rows[0.0]["max_qps"] > 0
    assert result["chosen"] is rows[0.0] and result["default"] is None
    only_bad = tune(profile, search, [8], [10e-3], default=None)
    assert only_bad["chosen"] is None and only_bad["config_toml"] is None


def test_a_slow_settings_light_load_step_holds_requests_to_judge():
    # T = 100 ms, batches of one, constant arrivals: below the 10 QPS ceiling no request waits, every
    # latency is 100 ms ≤ 150 ms, so the answer is 10 − 9.9/2⁸ as for any setting whose latency never
    # grows. The 1 % step (0.1 QPS: one arrival every 10 s, the first in the 1 s warm-up) of a 2 s step
    # held no request, had no P99, and failed the setting at 0 QPS ("no setting meets the SLO").
    search = SearchConfig(slo_p99_ms=150.0, arrival="constant", duration_s=2.0, warmup_s=1.0)
    found = max_qps(BatcherModel(alpha_s=0.1, beta_s=0.0, max_batch_size=1, max_queue_delay_s=0.0), search)
    assert found["max_qps"] == pytest.approx(10 - 9.9 / 256)
    # A setting that does fail at light load fails on requests: batches of 4 at 0.4 QPS never fill, so
    # each of the step's 100 requests waits the whole 1 s window, 1.1 s > 500 ms.
    slow = BatcherModel(alpha_s=0.1, beta_s=0.0, max_batch_size=4, max_queue_delay_s=1.0)
    found = max_qps(slow, replace(search, slo_p99_ms=500.0))
    assert found["max_qps"] == 0.0 and found["step"]["requests"] == 100
    assert found["step"]["latency_ms"]["p99"] == pytest.approx(1100.0)


def test_one_delay_in_two_units_is_one_setting():
    # 1.3 ms as "1.3ms" is 1.3 × 1e-3 = 0.0013000000000000002 s, as "0.0013s" it is 0.0013: the
    # default was searched a second time, as a setting outside the grid, and recorded as 1.3000000000000003 ms.
    search = SearchConfig(slo_p99_ms=50.0, duration_s=0.5, warmup_s=0.0, iterations=1)
    result = tune(Profile(1e-3, 1e-4), search, [4, 4], [0.0013], default=(4, 1.3 * 1e-3))
    assert [(r["max_batch_size"], r["max_queue_delay_ms"], r["in_grid"]) for r in result["settings"]] == [
        (4, 1.3, True)
    ]
    assert result["default"] is result["settings"][0] is result["chosen"]


@pytest.mark.parametrize(
    "fit, batches, message",
    [
        ({"r2": {}}, [], "p.json: fit.r2: expected a number or null; got an object"),
        ({"r2": "abc"}, [], "p.json: fit.r2: expected a number or null; got a string ('abc')"),
        # float() read true as 1 (a 1 s batch) and a quoted number as its number; int() read 1.7 as a batch of 1.
        ({"alpha_s": True}, [], "p.json: fit.alpha_s: expected a number of seconds; got true"),
        ({"beta_s": "0.0001"}, [], "p.json: fit.beta_s: expected a number of seconds; got a string ('0.0001')"),
        ({"r2": True}, [], "p.json: fit.r2: expected a number or null; got true"),
        ({}, [{"batch_size": 1.7, "samples_s": [1e-3]}],
         "p.json: batches[0].batch_size: expected a whole number ≥ 1; got 1.7"),
        ({}, [{"batch_size": 1, "samples_s": [1e-3]}, {"batch_size": True, "samples_s": [1e-3]}],
         "p.json: batches[1].batch_size: expected a whole number ≥ 1; got true"),
        ({}, [{"batch_size": 0, "samples_s": [1e-3]}],
         "p.json: batches[0].batch_size: expected a whole number ≥ 1; got 0"),
        ({}, [{"batch_size": 4, "samples_s": [1e-3, True]}],
         "p.json: batches[0].samples_s: expected numbers of seconds; got true"),
        ({}, [{"batch_size": 1, "samples_s": [1e-3]}, {"batch_size": 4, "samples_s": [2e-3, float("nan")]}],
         "p.json: batches[1].samples_s: expected finite seconds; got NaN"),
        ({}, [{"batch_size": 1, "samples_s": [float("inf")]}],
         "p.json: batches[0].samples_s: expected finite seconds; got Infinity"),
        # The file's words, as wok plan shows the same file's values: they were Python's nan and inf.
        ({}, [{"batch_size": 1, "samples_s": [10**400]}],
         "p.json: batches[0].samples_s: expected finite seconds; got an integer of 401 digits"),
    ],
)  # fmt: skip
def test_a_profile_that_cannot_be_simulated_is_refused_naming_the_file_and_field(fit, batches, message):
    # r2 was read outside the readable-document check (a dict: a traceback; "abc": a message without the
    # file); a NaN or infinite sample passed the simulator's check and failed mid-search as "a request
    # with code OK has no completion time".
    doc = {"schema": "wok.profile/1", "fit": {"alpha_s": 1e-3, "beta_s": 1e-4, **fit}, "batches": batches}
    with pytest.raises(ValueError) as refused:
        profile_from_document(doc, "p.json")
    assert str(refused.value).startswith(message), refused.value


@pytest.mark.parametrize(
    ("alpha", "shown"),
    [(math.nan, "NaN"), (-math.inf, "-Infinity"), (10**400, "an integer of 401 digits")],
    ids=["nan", "-inf", "int-past-float"],
)
def test_a_fit_of_no_finite_number_is_shown_as_wok_plan_shows_the_same_file(tmp_path, alpha, shown):
    # wok tune showed it as Python writes it (nan, -inf, and inf for the integer past a float's range) where wok plan,
    # reading the same file, said NaN: a file's value is shown in its words.
    from fractions import Fraction

    from wok.bench.plan import batch_from_profile

    path = tmp_path / "p.json"
    path.write_text(json.dumps({"schema": "wok.profile/1", "fit": {"alpha_s": alpha, "beta_s": 1e-4}, "batches": []}))
    with pytest.raises(ValueError) as tuned:
        load_profile(path)
    assert str(tuned.value) == f"{path}: fit.alpha_s: expected a finite number; got {shown}"
    if isinstance(alpha, float):  # wok plan reads the integer exactly, and refuses it later, by the figures it makes
        with pytest.raises(ValueError) as planned:
            batch_from_profile(path, Fraction(4))
        assert str(planned.value) == f"--profile {path}: fit.alpha_s: expected a finite number; got {shown}"


def test_a_whole_batch_size_written_as_a_float_is_read_as_it_is():
    doc = {"schema": "wok.profile/1", "fit": {"alpha_s": 1e-3, "beta_s": 1e-4},
           "batches": [{"batch_size": 4.0, "samples_s": [1e-3]}]}  # fmt: skip
    assert profile_from_document(doc, "p.json").samples == ((4, (1e-3,)),)


def test_a_profile_whose_r2_is_not_a_number_is_refused_with_one_line(tmp_path, wok_cli):
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"schema": "wok.profile/1", "fit": {"alpha_s": 1e-3, "beta_s": 1e-4, "r2": {}}}))
    status, _, err = wok_cli("tune", "--slo-p99", "50ms", "--profile", str(path))
    assert (status, err) == (2, f"wok tune: --profile {path}: fit.r2: expected a number or null; got an object\n")


@pytest.mark.parametrize(
    "samples, why",
    [
        ([1e-3, float("nan")], "samples_s: expected finite seconds ≥ 0; got NaN"),  # the file's word: it was nan
        ([float("inf")], "samples_s: expected finite seconds ≥ 0; got Infinity"),
        ([1e-3, -2e-3], "samples_s: expected finite seconds ≥ 0; got -0.002"),
        ([True, 1e-3], "samples_s: expected numbers of seconds; got true"),
    ],
)
def test_overhead_samples_that_cannot_be_simulated_are_refused_naming_the_file(samples, why, tmp_path):
    # NaN and infinity failed mid-search ("a request with code OK has no completion time"), a negative
    # sample was refused by the simulator without the file's name, and true was a 1 s overhead.
    path = tmp_path / "o.json"
    path.write_text(json.dumps({"schema": "wok.overhead/1", "samples_s": samples}))
    with pytest.raises(ValueError) as refused:
        load_overhead(path)
    assert str(refused.value) == f"--overhead-samples {path}: {why}"


def test_an_overhead_file_of_another_schema_is_refused_naming_its_option(tmp_path):
    path = tmp_path / "o.json"
    path.write_text(json.dumps({"schema": "wok.overhead/2", "samples_s": [1e-3]}))
    with pytest.raises(ValueError) as refused:
        load_overhead(path)
    assert str(refused.value) == f"--overhead-samples {path}: expected schema 'wok.overhead/1'; got 'wok.overhead/2'"


@pytest.mark.parametrize(
    ("doc", "got"), [({"samples_s": [1e-3]}, "none"), ({"schema": None, "samples_s": [1e-3]}, "null")]
)
def test_a_schema_left_out_is_said_apart_from_one_written_null(tmp_path, doc, got):
    # Both were "got null", as doc.get("schema") read them: a file without the field said it held a null.
    from wok.bench.tune import profile_from_document

    path = tmp_path / "o.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError) as refused:
        load_overhead(path)
    assert str(refused.value) == f"--overhead-samples {path}: expected schema 'wok.overhead/1'; got {got}"
    with pytest.raises(ValueError) as refused:
        profile_from_document(doc)
    assert str(refused.value) == f"profile: expected schema 'wok.profile/1'; got {got}"


def test_choose_breaks_ties_by_delay_then_batch_size():
    rows = [
        {"max_batch_size": 32, "max_queue_delay_ms": 5.0, "max_qps": 1000.0},
        {"max_batch_size": 16, "max_queue_delay_ms": 1.0, "max_qps": 985.0},  # within 2 %: a tie
        {"max_batch_size": 8, "max_queue_delay_ms": 1.0, "max_qps": 990.0},
        {"max_batch_size": 4, "max_queue_delay_ms": 0.0, "max_qps": 900.0},  # 10 % down: not a tie
    ]
    assert choose(rows, tie=0.02) is rows[2]
    assert choose(rows, tie=0.0) is rows[0]
    assert choose([{"max_batch_size": 4, "max_queue_delay_ms": 0.0, "max_qps": 0.0}], tie=0.02) is None


def test_the_default_competes_and_runs_are_reproducible():
    profile = Profile(alpha_s=1e-3, beta_s=0.25e-3)
    search = SearchConfig(slo_p99_ms=20.0, duration_s=3.0, warmup_s=0.5, iterations=5)
    a = tune(profile, search, [4], [0.0], default=(32, 5e-3))
    b = tune(profile, search, [4], [0.0], default=(32, 5e-3))
    assert [r["max_qps"] for r in a["settings"]] == [r["max_qps"] for r in b["settings"]]
    # 32 per 9 ms (3,556 QPS ceiling) beats 4 per 2 ms (2,000): outside the grid, the default still wins.
    assert a["chosen"] is a["default"] and a["default"]["in_grid"] is False
    assert a["settings"][0]["max_qps"] < 2000 < a["default"]["max_qps"] < 3556


def test_the_config_written_is_a_valid_part_of_a_model_config():
    from wok.config import model_config_from_dict

    text = config_toml(16, 2.5e-3)
    part = tomllib.loads(text)
    assert part == {"max_batch_size": 16, "dynamic_batching": {"max_queue_delay_ms": 2.5}}
    base = {
        "name": "m",
        "platform": "python",
        "factory": "wok.models.mlp:build",
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "dims": [256]}],
        "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "dims": [256]}],
    }
    cfg = model_config_from_dict({**base, **part}, source="tune test")
    assert cfg.max_batch_size == 16 and cfg.dynamic_batching.max_queue_delay_ms == 2.5


def test_model_for_carries_the_profile_and_overheads():
    profile = Profile(1e-3, 2e-4, samples=((4, (2e-3,)),))
    m = model_for(profile, 8, 1e-3, overhead_s=(1e-4,), sampled=True)
    assert (m.max_batch_size, m.max_queue_delay_s, m.batch_samples, m.overhead_samples_s) == (
        8, 1e-3, ((4, (2e-3,)),), (1e-4,),
    )  # fmt: skip
    assert model_for(profile, 8, 1e-3).batch_samples == ()  # the fit unless asked


def test_the_cli_prints_the_table_and_writes_json_and_config(tmp_path, wok_cli):
    out, cfg = tmp_path / "tune.json", tmp_path / "config.toml"
    status, stdout, stderr = wok_cli(
        "tune", "--slo-p99", "20ms", "--alpha", "1ms", "--beta", "0.25ms", "--max-batch-sizes", "4,16",
        "--delays", "0ms,5ms", "--sim-duration", "3s", "--iterations", "5", "--json", str(out),
        "--write-config", str(cfg),
    )  # fmt: skip
    assert status == 0, stderr
    assert "chosen: max_batch_size =" in stdout and "default" in stdout
    result = json.loads(out.read_text())
    assert result["schema"] == "wok.tune/2" and len(result["settings"]) == 5
    chosen = result["chosen"]
    assert tomllib.loads(cfg.read_text()) == {
        "max_batch_size": chosen["max_batch_size"],
        "dynamic_batching": {"max_queue_delay_ms": chosen["max_queue_delay_ms"]},
    }


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--alpha", "1ms"], "--alpha"),
        (["--alpha", "1ms", "--beta", "1ms", "--max-batch-sizes", "4,x"], "--max-batch-sizes"),
        (["--alpha", "1ms", "--beta", "1ms", "--delays", "soon"], "invalid duration"),
        (["--alpha", "1ms", "--beta", "1ms", "--default", "32"], "--default"),
    ],
)
def test_the_cli_refuses_bad_values_with_exit_2(args, message, wok_cli):
    status, _, err = wok_cli("tune", "--slo-p99", "20ms", *args)
    assert status == 2 and "wok tune:" in err and message in err, err


# A grid that searches in well under a second: what a refusal that comes too late would run.
SMALL = ["--alpha", "1ms", "--beta", "0.25ms", "--max-batch-sizes", "4", "--delays", "0ms", "--sim-duration", "1s"]
SMALL += ["--iterations", "2"]


@pytest.mark.parametrize("spec", ["0,5ms", "-1,5ms", "4,soon", "x,5ms", ",5ms", "4,1e400s"])
def test_a_bad_default_is_refused_before_the_search_naming_default(spec, monkeypatch, wok_cli):
    """--default 0,5ms ran the whole grid, then failed in the batcher model's words
    ("invalid batcher settings: max_batch_size=0 ...")."""
    import wok.bench.tune as tune_module

    monkeypatch.setattr(tune_module, "max_qps", lambda *a, **k: pytest.fail("simulated before refusing"))
    status, _, err = wok_cli("tune", "--slo-p99", "20ms", *SMALL, "--default", spec)
    assert status == 2, err
    assert (
        err
        == f"wok tune: --default {spec!r}: expected MAX_BATCH_SIZE ≥ 1 and a finite DELAY ≥ 0, like 32,5ms, or none\n"
    )


def test_the_library_refuses_a_bad_default_before_simulating(monkeypatch):
    import wok.bench.tune as tune_module

    monkeypatch.setattr(tune_module, "max_qps", lambda *a, **k: pytest.fail("simulated before refusing"))
    search = SearchConfig(slo_p99_ms=20.0, duration_s=1.0, warmup_s=0.0, iterations=2)
    with pytest.raises(ValueError, match=r"the default setting \(0, 0.005\): expected a max batch size ≥ 1"):
        tune(Profile(alpha_s=1e-3, beta_s=0.25e-3), search, [4], [0.0], default=(0, 5e-3))


def test_sampled_batch_times_without_a_profile_are_refused(wok_cli):
    """--batch-times samples with --alpha/--beta quietly searched on the fit (inputs.batch_times "fit")."""
    status, _, err = wok_cli("tune", "--slo-p99", "20ms", *SMALL, "--batch-times", "samples")
    assert (status, err) == (
        2,
        "wok tune: --batch-times samples draws from a --profile file's measured batch times; give --profile\n",
    )


def test_a_write_that_fails_after_the_search_is_reported_not_a_traceback(tmp_path, monkeypatch, wok_cli):
    """Past the up-front check (a disk that fills, a folder removed meanwhile), the OSError is the
    option's message, exit 2, when --json holds the result (without it, the result is kept in a
    temporary file: tests/bench/test_outputs.py)."""
    import wok.bench.cli as cli

    monkeypatch.setattr(cli, "_check_outputs", lambda *a: None, raising=False)
    config = tmp_path / "gone" / "config.toml"
    argv = ["--json", str(tmp_path / "tune.json"), "--write-config", str(config)]
    status, out, err = wok_cli("tune", "--slo-p99", "20ms", *SMALL, *argv)
    assert "chosen:" in out
    assert (status, err.splitlines()[-1]) == (2, f"wok tune: --write-config {config}: No such file or directory")


def test_tune_check_predicts_a_ramp_step_for_step_and_flags_the_knee():
    import argparse

    from wok.bench.simulate import SimConfig, simulate_ramp
    from wok.bench.tune_check import compare_steps, predict

    # A "measured" ramp that is itself a simulation of the same setting on the same seed: the
    # prediction must reproduce it exactly (same offers, step length, warm-up, arrival process).
    profile = Profile(alpha_s=1e-3, beta_s=0.25e-3)
    model = model_for(profile, 8, 2e-3, overhead_s=(1e-3, 2e-3))
    args = argparse.Namespace(step_duration=2.0, warmup=0.5, arrival="poisson", seed=7)
    measured = simulate_ramp(SimConfig(model, [500, 1000, 5000], 2.0, 0.5, "poisson", 50.0, seed=7))
    # The ceiling is 8 / T(8) = 8 / 3 ms ≈ 2,667 QPS: from 1,000 to 5,000 offered, achieved gains
    # ≈ 1,667 of 4,000 (0.42 < 0.5), so 5,000 is the knee.
    assert measured["knee_qps"] == 5000
    predicted = predict(measured, 8, 2.0, profile, (1e-3, 2e-3), args, sampled=False)
    bare = predict(measured, 8, 2.0, profile, (), args, sampled=False)
    rows = compare_steps(measured, predicted, predicted, bare)
    assert [r["relative_error"] for r in rows] == [0.0, 0.0, 0.0]
    # Without overheads the same arrivals and batches give every latency 1–2 ms less: the mean 1.5 ms less.
    with_o, without = predicted["steps"][0]["latency_ms"]["mean"], rows[0]["predicted_batcher_mean_ms"]
    assert with_o - without == pytest.approx(1.5, abs=0.1) and rows[0]["server_e2e_mean_ms"] is None
    assert [r["below_knee"] for r in rows] == [True, True, False]
    assert all(r["within_tolerance"] for r in rows) and not any(r["quiet"] for r in rows)  # no host figures


def _tune_check_run() -> dict:
    """A finished `wok.tunecheck/1` run of one ramp of one step, as --markdown reads it."""
    row = {
        "offered_qps": 1000.0, "measured_achieved_qps": 998.0, "measured_p50_ms": 8.0, "predicted_p50_ms": 7.0,
        "measured_p99_ms": 20.0, "predicted_p99_ms": 15.0, "relative_error": -0.25, "sampled_p99_ms": 22.0,
        "sampled_relative_error": 0.1, "below_knee": True, "measured_mean_batch_size": 7.5,
        "predicted_mean_batch_size": 6.0, "other_cores": 0.1,
    }  # fmt: skip
    return {
        "schema": "wok.tunecheck/1",
        "config": {"slo_p99_ms": 50.0},
        "overhead": {"median_s": 2e-3, "p99_s": 7e-3},
        "tuned_setting": {"max_batch_size": 64, "max_queue_delay_ms": 0.0},
        "host": {"loadavg_at_start": [0.5, 0, 0], "loadavg_at_end": [0.7, 0, 0]},
        "runs": [{"rep": 1, "label": "default", "max_batch_size": 32, "max_queue_delay_ms": 5.0,
                  "measured_max_qps": 1000.0, "measured_knee_qps": None, "comparison": [row]}],
        "verdict": {"default_max_qps": [1000.0], "tuned_max_qps": [1500.0], "tuned_at_least_default": True,
                    "steps_within": 0, "steps_below_knee": 1, "quiet_steps_within": 0, "quiet_steps_below_knee": 1},
    }  # fmt: skip


def test_tune_check_renders_a_run_as_markdown():
    from wok.bench.tune_check import markdown

    text = markdown(_tune_check_run())
    assert "| 1,000 | 998 | 8.0 / 7.0 | 20.0 | 15.0 | -25% | 22.0 | +10% | yes | 7.5 / 6.0 | - / - | 0.10 |" in text
    assert "2.00 / 7.00" in text and "0 of 1 steps below the knee (0 of 1 quiet ones)" in text


def _ramp_step(offered: float, achieved: float) -> dict:
    return {"offered_qps": offered, "achieved_qps": achieved, "duration_s": 10.0}


# (the measured ramp's steps, its knee_at_or_below_first_step: None for a file written before it)
KNEE_AT_FIRST = {
    "flagged": ([_ramp_step(1000.0, 400.0), _ramp_step(1500.0, 410.0)], True),
    "older-file": ([_ramp_step(1000.0, 400.0), _ramp_step(1500.0, 410.0)], None),
}
KNEE_ABOVE_FIRST = {
    "flagged": ([_ramp_step(500.0, 500.0), _ramp_step(1000.0, 600.0)], False),
    "older-file": ([_ramp_step(500.0, 500.0), _ramp_step(1000.0, 600.0)], None),
}


def _with_knee(steps: list[dict], flag: bool | None) -> dict:
    """`_tune_check_run` whose ramp's knee is at 1,000 QPS, with its whole `measured` ramp; its
    text report's verdict as `verdict` makes it."""
    from wok.bench.analysis import find_knee
    from wok.bench.tune_check import verdict

    assert find_knee(steps) == 1000.0
    doc = _tune_check_run()
    run = doc["runs"][0]
    run["measured_knee_qps"] = 1000.0
    run["measured"] = {"knee_qps": 1000.0, "steps": steps}
    if flag is not None:
        run["measured"]["knee_at_or_below_first_step"] = flag
    run["comparison"][0].update(within_tolerance=False, quiet=True, batcher_relative_error=None)
    doc["verdict"] = verdict(doc["runs"])
    return doc


def _report_and_markdown(doc: dict) -> tuple[str, str]:
    import io

    from wok.bench.tune_check import markdown, print_report

    out = io.StringIO()
    print_report(doc, file=out)
    return out.getvalue(), markdown(doc)


@pytest.mark.parametrize("case", KNEE_AT_FIRST)
def test_tune_check_says_a_knee_on_the_first_step_is_at_or_below_it(case):
    """Its text and markdown said "knee 1000.0": a knee the ramp's first step already showed is at
    or below that step (nothing ran below it), as `wok bench`'s own report says it."""
    text, md = _report_and_markdown(_with_knee(*KNEE_AT_FIRST[case]))
    assert "measured max QPS 1000.0, knee at or below 1000.0" in text, text
    assert "measured max QPS under 50 ms 1000.0, knee at or below 1000.0" in md, md


@pytest.mark.parametrize("case", KNEE_ABOVE_FIRST)
def test_tune_check_says_a_knee_above_the_first_step_as_it_is(case):
    text, md = _report_and_markdown(_with_knee(*KNEE_ABOVE_FIRST[case]))
    assert "measured max QPS 1000.0, knee 1000.0" in text, text
    assert "measured max QPS under 50 ms 1000.0, knee 1000.0" in md, md
    assert "at or below" not in text + md


def _refreshed(doc: dict) -> None:  # add_batcher_means without a profile and ramps to simulate
    doc["runs"][0]["comparison"][0]["server_e2e_mean_ms"] = 9.5


def test_tune_check_refresh_replaces_the_file_whole(monkeypatch, tmp_path, capsys):
    from wok.bench import tune_check

    path = tmp_path / "run.json"
    path.write_text(json.dumps(_tune_check_run()), encoding="utf-8")
    path.chmod(0o640)
    monkeypatch.setattr(tune_check, "add_batcher_means", _refreshed)
    assert tune_check.main(["--markdown", str(path), "--refresh"]) == 0
    assert json.loads(path.read_text())["runs"][0]["comparison"][0]["server_e2e_mean_ms"] == 9.5
    assert (path.stat().st_mode & 0o777) == 0o640  # the file's mode, not the temporary file's
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]
    assert "| 1,000 | 998 |" in capsys.readouterr().out


def test_tune_check_refresh_of_a_value_it_cannot_write_says_so(monkeypatch, tmp_path, capsys):
    from wok.bench import tune_check

    path = tmp_path / "run.json"
    path.write_text(json.dumps(_tune_check_run(), indent=1), encoding="utf-8")
    before = path.read_bytes()
    monkeypatch.setattr(tune_check, "add_batcher_means", lambda doc: doc.update(bad=object()))
    assert tune_check.main(["--markdown", str(path), "--refresh"]) == 1
    err = capsys.readouterr().err
    assert f"--refresh {path}: TypeError: Object of type object is not JSON serializable" in err
    assert f"{path} is left as it was" in err
    assert path.read_bytes() == before


def test_tune_check_refresh_that_fails_midway_leaves_the_file_as_it_was(tmp_path):
    import subprocess

    path = tmp_path / "run.json"
    path.write_text(json.dumps(_tune_check_run(), indent=1), encoding="utf-8")
    before = path.read_bytes()
    # A write that fails midway, as on a full disk: the file-size limit (EFBIG, SIGXFSZ being
    # ignored by Python), set in a child process so as to leave this one's files alone.
    code = (
        "import resource, sys\n"
        "from wok.bench import tune_check\n"
        "tune_check.add_batcher_means = lambda doc: doc.update(refreshed=True)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (64, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))\n"
        "sys.exit(tune_check.main(['--markdown', sys.argv[1], '--refresh']))\n"
    )
    r = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=60)
    assert path.read_bytes() == before, r.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]  # nor a temporary file left beside it
    assert r.returncode == 1, r.stderr
    assert f"--refresh {path}: File too large" in r.stderr and f"{path} is left as it was" in r.stderr
    assert r.stdout == ""  # no tables printed for a refresh that failed


def test_the_device_like_model_takes_alpha_plus_beta_n_through_the_executor():
    from wok.bench.tune_check import measure_profile

    # Sleeping 20 ms + 2 ms·n: a batch never ends early, and what the shared machine adds (sleep's
    # overshoot, a stall) is only ever added. So each size's least time is α + β·n plus the least
    # of its 5 delays. This took the medians, and in one CI run both sizes' were 9 ms late (t1 - β
    # 28.9 ms): the host was busy for the whole test; one batch stalled by 70 ms in another CI run
    # (that moved a least-squares fit of 3 samples per size by more than the bound).
    doc = measure_profile([1, 4], reps=5, warmup=1, device_like=(20e-3, 2e-3))
    assert doc["model"] == "device_like"
    t1, t4 = (min(b["samples_s"]) for b in sorted(doc["batches"], key=lambda b: b["batch_size"]))
    for n, t in ((1, t1), (4, t4)):
        assert 20e-3 + 2e-3 * n - 0.5e-3 <= t <= 20e-3 + 2e-3 * n + 6e-3, (n, doc["batches"])
    # β read off the two least times: 0 were β left out of the batch, 4 ms were it counted twice.
    assert (t4 - t1) / 3 == pytest.approx(2e-3, abs=1e-3), doc["batches"]
    prof = profile_from_document(doc)  # the document reads back as a profile of these sizes
    assert sorted(n for n, _ in prof.samples) == [1, 4]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--arrival", "bogus"], "--arrival: arrivals 'bogus': unknown process 'bogus'"),
        (["--delays", "0ms,1e400ms"], "--delays: expected a finite duration; got '1e400ms'"),
        (["--slo-p99", "1e400ms"], "--slo-p99: expected a finite duration; got '1e400ms'"),
        (["--default", "32,1e400ms"], "--default: expected a finite duration; got '1e400ms'"),
        (["--tuned", "4,1e400ms"], "--tuned: expected a finite duration; got '1e400ms'"),
        # Refused by the search's SearchConfig (on HEAD: by the simulator), after the profile and calibrations.
        (["--seed", "-1"], "--seed: expected an integer >= 0; got -1"),
    ],
)
def test_tune_check_refuses_a_bad_value_before_measuring(args, message, monkeypatch, capsys):
    """These failed only in the search or the predictions, after the profile, the calibrations
    and every ramp had run, as a traceback (exit 1)."""
    from wok.bench import tune_check

    monkeypatch.setattr(tune_check, "measure_profile", lambda *a, **k: pytest.fail("measured before refusing"))
    monkeypatch.setattr(tune_check, "calibrate", lambda *a, **k: pytest.fail("measured before refusing"))
    with pytest.raises(SystemExit) as exc:
        tune_check.main([*args, "--device-like", "1ms,1ms", "--log-dir", "/tmp"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and ": error: " in err and message in err, err
    assert "Traceback" not in err


class _NoServer:
    target = "127.0.0.1:1"
    stopped = 0

    def __init__(self) -> None:
        self.ports = {"metrics": 1}

    def stop(self) -> None:
        _NoServer.stopped += 1


def test_tune_check_stops_at_a_ramp_cut_by_a_signal_and_leaves_it_out(tmp_path, monkeypatch):
    """A ramp cut by Ctrl-C went on to the other setting's whole ramp, and the verdict counted
    the cut one's max QPS (the last step reached) as if the server had failed there."""
    from wok.bench import compare, tune, tune_check

    profile = tmp_path / "profile.json"
    profile.write_text("{}")
    ramps = []

    def ramp(server, cfg, progress, processes=None):
        ramps.append(server)
        cut = {"reason": "ramp ended early at step 2 (200 QPS): KeyboardInterrupt", "by_signal": True}
        return {"max_qps_under_slo": 100.0, "knee_qps": None, "interrupted": cut}

    stops = []
    monkeypatch.setattr(tune, "load_profile", lambda path: tune.Profile(0.001, 0.0001, r2=1.0))
    monkeypatch.setattr(tune, "tune", lambda *args, **kwargs: {"chosen": None})
    monkeypatch.setattr(tune, "print_table", lambda doc: None)
    monkeypatch.setattr(tune_check, "calibrate", lambda args, t1: {"samples_s": [0.001], "method": "none"})
    monkeypatch.setattr(tune_check, "start_server", lambda *args, **kwargs: _NoServer())
    monkeypatch.setattr(tune_check, "ramp_config", lambda *args, **kwargs: None)
    monkeypatch.setattr(compare, "metered_ramp", ramp)
    monkeypatch.setattr(compare, "stop_all", lambda: stops.append(True))
    monkeypatch.setattr(tune_check, "predict", lambda *args, **kwargs: {"max_qps_under_slo": 1.0})
    monkeypatch.setattr(tune_check, "compare_steps", lambda *args: [])
    monkeypatch.setattr(tune_check, "print_report", lambda doc: pytest.fail(f"a verdict on a cut ramp: {doc}"))
    json_path = tmp_path / "run.json"
    argv = ["--profile", str(profile), "--no-cpu-stage", "--tuned", "4,1ms", "--reps", "2"]
    _NoServer.stopped = 0
    with pytest.raises(KeyboardInterrupt, match="ramp ended early at step 2"):
        tune_check.main([*argv, "--json", str(json_path), "--log-dir", str(tmp_path / "logs")])
    assert len(ramps) == 1  # not the tuned setting's ramp, nor the second repetition
    assert _NoServer.stopped == 1 and stops == [True]  # its server stopped, and any other started
    assert not json_path.exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--delays", "0ms,1e400ms"], "wok tune: --delays: expected finite durations; got '0ms,1e400ms'\n"),
        (["--overhead", "1e400s"], "wok tune: --overhead: expected a finite duration; got '1e400s'\n"),
    ],
)
def test_the_cli_refuses_an_infinite_duration_before_simulating(args, message, monkeypatch, wok_cli):
    """--delays ...,1e400ms was refused after simulating the other delays, in the batcher
    model's field name; --overhead 1e400s failed after simulating, in other words."""
    import wok.bench.tune as tune_module

    monkeypatch.setattr(tune_module, "max_qps", lambda *a, **k: pytest.fail("simulated before refusing"))
    status, _, err = wok_cli("tune", "--slo-p99", "20ms", *SMALL, *args)
    assert (status, err) == (2, message)


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--alpha", "1e400", "expected a finite duration; got '1e400'"),
        ("--beta", "1e400s", "expected a finite duration; got '1e400s'"),
        ("--sim-duration", "1e400", "expected a finite duration > 0; got '1e400'"),
        ("--sim-warmup", "1e400s", "expected a finite duration; got '1e400s'"),
        ("--slo-p99", "1e400ms", "expected a finite duration > 0; got '1e400ms'"),
        ("--per-request-cpu", "1e400s", "expected a finite duration; got '1e400s'"),
        ("--alpha", "nan", "invalid duration 'nan'"),
        ("--beta", "inf", "invalid duration 'inf'"),
        ("--sim-duration", "infms", "invalid duration 'infms'"),
        ("--sim-warmup", "nan", "invalid duration 'nan'"),
        ("--slo-p99", "inf", "invalid duration 'inf'"),
        ("--per-request-cpu", "infms", "invalid duration 'infms'"),
    ],
)
def test_a_duration_that_is_not_finite_is_refused_in_the_options_name(option, value, message, monkeypatch, wok_cli):
    """`--alpha 1e400` was refused as "alpha_s must be a finite number of seconds", `--slo-p99 1e400ms`
    as "slo_p99_ms ...", `--sim-duration 1e400` as "step_duration_s ...", and `--alpha nan` without
    any option's name: the batcher model's and the simulator's words, not the command line's."""
    import wok.bench.tune as tune_module

    monkeypatch.setattr(tune_module, "max_qps", lambda *a, **k: pytest.fail("simulated before refusing"))
    status, _, err = wok_cli("tune", "--slo-p99", "20ms", *SMALL, option, value)
    assert status == 2 and err.startswith(f"wok tune: {option}: {message}"), err
    assert "Traceback" not in err


def test_alpha_and_beta_both_zero_are_refused_in_their_names(wok_cli):
    status, _, err = wok_cli("tune", "--slo-p99", "20ms", *SMALL, "--alpha", "0ms", "--beta", "0ms")
    assert (status, err) == (2, "wok tune: --alpha and --beta: a batch needs a time, α + β > 0; got both 0\n")


@pytest.mark.parametrize("constant", ["1ms", "0ms"])
def test_a_constant_overhead_beside_overhead_samples_is_refused(constant, tmp_path, monkeypatch, wok_cli):
    """--overhead 1ms --overhead-samples FILE searched on the samples alone: the constant was dropped
    without a word."""
    import wok.bench.tune as tune_module

    path = tmp_path / "overhead.json"
    path.write_text(json.dumps(overhead_document([1e-4, 2e-4], "by hand")))
    monkeypatch.setattr(tune_module, "max_qps", lambda *a, **k: pytest.fail("simulated before refusing"))
    status, _, err = wok_cli(
        "tune", "--slo-p99", "20ms", *SMALL, "--overhead", constant, "--overhead-samples", str(path)
    )
    assert (status, err) == (
        2,
        "wok tune: --overhead with --overhead-samples: give one (the constant, or the measured samples)\n",
    )


def test_overhead_samples_alone_are_drawn(tmp_path, wok_cli):
    path, out = tmp_path / "overhead.json", tmp_path / "tune.json"
    path.write_text(json.dumps(overhead_document([1e-4, 2e-4], "by hand")))
    status, _, err = wok_cli("tune", "--slo-p99", "20ms", *SMALL, "--overhead-samples", str(path), "--json", str(out))
    assert status == 0, err
    assert json.loads(out.read_text())["inputs"]["overhead"]["count"] == 2


def test_a_missing_trace_file_is_refused_as_the_arrival_options(tmp_path, monkeypatch, wok_cli):
    """It was a FileNotFoundError traceback; `wok bench ramp` says `--arrival: ...`."""
    import wok.bench.tune as tune_module

    missing = tmp_path / "missing.csv"
    monkeypatch.setattr(tune_module, "max_qps", lambda *a, **k: pytest.fail("simulated before refusing"))
    status, _, err = wok_cli("tune", "--slo-p99", "20ms", *SMALL, "--arrival", f"trace:{missing}")
    assert (status, err) == (
        2,
        f"wok tune: --arrival: arrivals 'trace:{missing}': cannot read {missing}: No such file or directory\n",
    )


def test_sampled_sizes_describe_the_batch_times_simulated(tmp_path, monkeypatch, wok_cli):
    """With sampled batch times and a CPU calibration that carries the server's batch time, the search
    simulated that batch time (model_for drops the profile's samples), but inputs.sampled_sizes still
    listed the profile's sizes [1, 4] beside batch_times "server": as if the samples had been drawn.
    (`wok tune` refuses that pair, tests/bench/test_tune_options.py; the library still takes it.)"""
    import wok.bench.tune as tune_module
    from wok.bench.tune import CpuStage, cpu_document

    profile, cpu, out = tmp_path / "profile.json", tmp_path / "cpu.json", tmp_path / "tune.json"
    profile.write_text(json.dumps(profile_document({1: [1.1e-3, 1.3e-3], 4: [1.9e-3, 2.1e-3]}, "by hand")))
    cpu.write_text(json.dumps(cpu_document(CpuStage(cpu_in_s=1e-5), "hand")))
    simulated = []
    real = tune_module.max_qps

    def spy(model, *args, **kwargs):
        simulated.append(sorted(n for n, _ in model.batch_samples))
        return real(model, *args, **kwargs)

    monkeypatch.setattr(tune_module, "max_qps", spy)
    grid = ["--max-batch-sizes", "4", "--delays", "0ms", "--sim-duration", "1s", "--iterations", "1"]
    status, _, err = wok_cli(
        "tune", "--slo-p99", "20ms", "--profile", str(profile), "--batch-times", "samples",
        "--cpu-calibration", str(cpu), *grid, "--default", "none", "--json", str(out),
    )  # fmt: skip
    assert status == 0, err
    inputs = json.loads(out.read_text())["inputs"]
    assert simulated == [[1, 4]]
    assert (inputs["batch_times"], inputs["sampled_sizes"]) == ("samples", [1, 4])

    simulated.clear()
    server = CpuStage(cpu_in_s=1e-5, batch_alpha_s=0.5e-3, batch_beta_s=0.1e-3)
    search = SearchConfig(slo_p99_ms=20.0, duration_s=1.0, warmup_s=0.0, iterations=1)
    inputs = tune(load_profile(profile), search, [4], [0.0], sampled=True, cpu=server, default=None)["inputs"]
    assert simulated == [[]]
    assert (inputs["batch_times"], inputs["sampled_sizes"]) == ("server", [])


def test_a_negative_alpha_is_clamped_with_a_warning_and_a_negative_beta_refused_as_plan_does(tmp_path):
    """One profile, one T(n): `wok plan --profile` refuses β < 0 ("fit.beta_s: β must be >= 0") while
    tune clamped it to 0 silently; plan warned of α < 0 while tune clamped it silently."""
    import io

    from wok.bench.tune import print_table

    doc = {"schema": "wok.profile/1", "fit": {"alpha_s": 1e-3, "beta_s": -1e-4}}
    with pytest.raises(ValueError) as refused:
        profile_from_document(doc, "p.json")
    assert str(refused.value) == "p.json: fit.beta_s: β: expected a time >= 0 s; got -0.0001 s"
    for bad, shown in ((float("nan"), "NaN"), (float("inf"), "Infinity")):  # as plan shows them (it was nan, inf)
        with pytest.raises(ValueError) as refused:
            profile_from_document({"schema": "wok.profile/1", "fit": {"alpha_s": bad, "beta_s": 1e-4}}, "p.json")
        assert str(refused.value) == f"p.json: fit.alpha_s: expected a finite number; got {shown}"
    prof = profile_from_document({"schema": "wok.profile/1", "fit": {"alpha_s": -2e-4, "beta_s": 1e-4}}, "p.json")
    assert (prof.alpha_s, prof.beta_s, prof.fitted_alpha_s) == (0.0, 1e-4, -2e-4)
    search = SearchConfig(slo_p99_ms=50.0, duration_s=0.5, warmup_s=0.1, iterations=1)
    result = tune(prof, search, [4], [0.0], default=None)
    assert result["warnings"] == [
        "the profile's fitted α = -0.2 ms is negative: the linear fit T = α + β·n does not hold at small batches; "
        "α is taken as 0, T(n) = β·n (as wok plan takes it)"
    ]
    out = io.StringIO()
    print_table(result, file=out)
    assert out.getvalue().splitlines()[-1] == "warning: " + result["warnings"][0]
    # A fit with α ≥ 0 warns of nothing.
    assert tune(Profile(1e-4, 1e-4), search, [4], [0.0], default=None)["warnings"] == []


# Batch times exactly on T = 0.1 ms·n, a line through the origin: the least-squares α came out -4.3e-19 s.
ON_THE_ORIGIN = {n: [1e-4 * n] * 3 for n in (1, 4, 16, 64)}


def test_an_alpha_that_is_zero_but_for_rounding_is_fitted_as_zero_and_not_warned_of():
    """`fit_linear` of times exactly 0.1 ms·n gave α = -4.3e-19 s: `wok profile` wrote it and said "α < 0: the line
    does not hold at small batch sizes", and `wok tune` warned "the profile's fitted α = -4.337e-16 ms is
    negative"."""
    sizes = sorted(ON_THE_ORIGIN)
    alpha, beta, r2 = fit_linear(sizes, [ON_THE_ORIGIN[n][0] for n in sizes])
    assert alpha == 0.0 and beta == pytest.approx(1e-4, rel=1e-12) and r2 == pytest.approx(1.0)
    doc = profile_document(ON_THE_ORIGIN, "test")
    assert doc["fit"]["alpha_s"] == 0.0
    profile = profile_from_document(doc, "profile.json")
    assert (profile.alpha_s, profile.fitted_alpha_s) == (0.0, None)
    assert tune(profile, QUICK, [4], [0.0], default=None)["warnings"] == []


def test_a_profiles_alpha_within_rounding_of_its_smallest_time_is_zero_and_past_it_negative():
    """A profile written before the fit rounded such an α to 0 holds it: read as 0, judged against the smallest
    batch time the file measured (0.1 ms: its samples, else its medians), not warned of. An α of -0.2 ns, 2e-9 of
    that time, is no rounding of a fit and is warned of as before; so is any α < 0 of a file with no times."""
    doc = profile_document(ON_THE_ORIGIN, "test")
    doc["fit"]["alpha_s"] = -4.336808689942018e-19  # as fit_linear fitted these times before
    profile = profile_from_document(doc, "profile.json")
    assert (profile.alpha_s, profile.fitted_alpha_s) == (0.0, None)
    assert tune(profile, QUICK, [4], [0.0], default=None)["warnings"] == []
    for b in doc["batches"]:
        del b["samples_s"]  # the medians alone
    assert profile_from_document(doc, "profile.json").fitted_alpha_s is None
    doc["fit"]["alpha_s"] = -2e-13
    assert profile_from_document(doc, "profile.json").fitted_alpha_s == -2e-13
    doc["fit"]["alpha_s"] = -4.336808689942018e-19
    del doc["batches"]
    assert profile_from_document(doc, "profile.json").fitted_alpha_s == -4.336808689942018e-19


@pytest.mark.parametrize(
    ("alpha_s", "beta_s", "shown"),
    [
        (0.0859e-3, 2.2e-6, "α = 0.0859 ms, β = 0.00220 ms/sample"),  # β read 0.0022 to 4 decimals
        (2.4e-7, 4.31e-5, "α = 0.000240 ms, β = 0.0431 ms/sample"),  # α read 0.000
        (1.5e-3, 0.0, "α = 1.500 ms, β = 0.000 ms/sample"),
    ],
)
def test_the_tables_batch_time_has_significant_digits_below_a_millisecond(alpha_s, beta_s, shown):
    import io

    from wok.bench.tune import print_table

    inputs = {"alpha_s": alpha_s, "beta_s": beta_s, "batch_times": "profile", "slo_p99_ms": 50.0}
    inputs |= {"arrival": "poisson", "sim_duration_s": 5.0}
    result = {"chosen": None, "default": None, "settings": [], "inputs": inputs}
    out = io.StringIO()
    print_table(result, file=out)
    first = out.getvalue().splitlines()[0]
    assert first == f"batch time {shown} (profile); SLO P99 ≤ 50 ms; poisson arrivals; 5 s simulated per point"


# docs/profile.md and docs/bench-schema.md: percentiles are nearest-rank, the ⌈p·n⌉-th smallest. np.median
# averaged the middle two (2.5 ms of 1, 2, 3, 4 ms, a time no batch took) and np.quantile interpolated.
FOUR_MS = [4e-3, 1e-3, 3e-3, 2e-3]
HUNDRED_MS = [k * 1e-3 for k in range(1, 101)]


def test_a_profile_documents_median_is_nearest_rank_as_wok_profile_writes_it():
    from wok.bench.analysis import latency_summary

    doc = profile_document({1: FOUR_MS, 2: [5e-3, 6e-3]}, source="test")
    # `wok profile` writes median_s = its latency_summary's p50 (the 2nd of 4): the same figure here.
    assert [b["median_s"] for b in doc["batches"]] == [2e-3, 5e-3] == [latency_summary(FOUR_MS)["p50"], 5e-3]


def test_an_overhead_documents_median_is_nearest_rank_as_its_p99():
    doc = overhead_document(FOUR_MS, "test")
    assert (doc["median_s"], overhead_document(HUNDRED_MS, "test")["p99_s"]) == (2e-3, 0.099)


def test_wok_tunes_record_of_its_overhead_is_nearest_rank():
    # The 50th and 99th of 1..100 ms (np.median and np.quantile: 50.5 and 99.01).
    search = SearchConfig(slo_p99_ms=500.0, duration_s=0.5, warmup_s=0.0, iterations=0)
    result = tune(Profile(alpha_s=1e-3, beta_s=0.0), search, [1], [0.0], default=None, overhead_s=HUNDRED_MS)
    assert result["inputs"]["overhead"] == {"count": 100, "median_ms": 50.0, "p99_ms": 99.0}


def test_tune_checks_predicted_overhead_p99_is_nearest_rank_as_the_measured_one_beside_it():
    from wok.bench.simulate import SimConfig, simulate_ramp
    from wok.bench.tune_check import compare_steps

    model = BatcherModel(alpha_s=1e-3, beta_s=0.0, max_batch_size=1, max_queue_delay_s=0.0)
    ramp = simulate_ramp(SimConfig(model=model, steps=[10.0], step_duration_s=1.0))
    [row] = compare_steps(ramp, ramp, ramp, by_rate=lambda qps: tuple(HUNDRED_MS))
    assert row["predicted_overhead_p99_ms"] == pytest.approx(99.0, abs=1e-9)  # np.quantile: 99.01


def _whole_run(rep: int, label: str, max_qps: float) -> dict:
    return {"rep": rep, "label": label, "error": None, "measured_max_qps": max_qps, "comparison": []}


@pytest.mark.parametrize(
    ("default", "tuned", "medians"),
    [
        ([300.0, 100.0], [200.0, 250.0], (200.0, 225.0)),  # even: the mean of the middle two
        ([100.0, 100.0, 300.0, 300.0], [5.0, 5.0, 5.0, 9.0], (200.0, 5.0)),  # ties
        ([400.0, 100.0, 300.0], [7.0, 7.0, 9.0], (300.0, 7.0)),  # odd: the middle one
    ],
)
def test_tune_checks_verdict_medians_over_repetitions_are_taken_as_compare_takes_them(default, tuned, medians):
    """Medians of repetitions as `wok compare`'s summary takes them (statistics.median); nearest-rank is for
    the percentiles of one run's samples (T(1), the overhead's P99)."""
    from wok.bench.tune_check import verdict

    runs = [_whole_run(rep, label, q) for label, qs in (("default", default), ("tuned", tuned))
            for rep, q in enumerate(qs, 1)]  # fmt: skip
    v = verdict(runs)
    assert (v["default_median_max_qps"], v["tuned_median_max_qps"]) == medians


# A profile measured at batches of 1 and 8 only (T = 1 ms + 0.125 ms·n): a max_batch_size of 16 runs on the
# fit's T(16) = 3 ms, an extrapolation past the data that no batch of the profile took.
PROFILED = {1: [1.125e-3] * 3, 8: [2e-3] * 3}
QUICK = SearchConfig(slo_p99_ms=50.0, duration_s=0.5, warmup_s=0.0, iterations=2)


@pytest.mark.parametrize("sampled", [False, True])
def test_a_pick_beyond_the_profiled_batch_sizes_says_it_is_extrapolated(sampled):
    """tune() chose 16 (ceiling 16 / 3 ms = 5,333 QPS against 8 / 2 ms = 4,000) and said nothing of
    the profile ending at 8: no field, no warning, a config of 16 as if measured."""
    import io

    from wok.bench.tune import print_table

    profile = profile_from_document(profile_document(PROFILED, "test"), "profile.json")
    result = tune(profile, QUICK, [4, 8, 16], [0.0], default=None, sampled=sampled)
    assert result["inputs"]["largest_profiled_batch"] == 8
    assert [(r["max_batch_size"], r["extrapolated"]) for r in result["settings"]] == [
        (4, False), (8, False), (16, True)
    ]  # fmt: skip
    chosen = result["chosen"]
    assert chosen["max_batch_size"] == 16 and chosen["extrapolated"] is True
    # At its max QPS (the 2-iteration bisection's 3/4 of the ceiling) its batches average under 8: the flag is
    # the simulated mean's; the max_batch_size past the profile is said as context, the batches beyond it named.
    assert 1 < chosen["mean_batch_size"] < 8 and chosen["mean_batch_extrapolated"] is False
    warning = (
        f"the chosen max_batch_size 16 is past the largest batch the profile measured (8): its simulated batches "
        f"average {round(chosen['mean_batch_size'], 2):g} requests, within the measured range, but its larger "
        "batches and its ceiling run on the fit α + β·n extrapolated (a batch of 16: 3 ms); profile batches of 16 "
        "to check it"
    )
    assert result["warnings"] == [warning]
    first = result["config_toml"].splitlines()[0]
    assert first == "# written by wok tune; max_batch_size 16 extrapolated: profiled to 8"
    assert tomllib.loads(result["config_toml"])["max_batch_size"] == 16
    out = io.StringIO()
    print_table(result, file=out)
    table = out.getvalue()
    assert "chosen, max extrapolated" in table and f"warning: {warning}" in table


def test_a_pick_within_the_profiled_batch_sizes_says_nothing_of_it():
    profile = profile_from_document(profile_document(PROFILED, "test"), "profile.json")
    result = tune(profile, QUICK, [4, 8], [0.0], default=None)
    assert result["chosen"]["max_batch_size"] == 8 and result["chosen"]["extrapolated"] is False
    assert result["chosen"]["mean_batch_extrapolated"] is False
    assert result["warnings"] == [] and result["config_toml"].startswith("# written by wok tune\n")


def test_a_pick_whose_simulated_batches_average_below_the_profile_is_flagged_though_its_max_is_within():
    """A profile of batches of 4 and 8 and max_batch_size 4: at its max QPS its batches average 2.65, so the
    simulation ran mostly on T(1..3), the fit carried below 4. Judged by max_batch_size (4, within 4 to 8) it was
    not marked, warned of, nor noted in the config."""
    import io

    from wok.bench.tune import print_table

    profile = profile_from_document(profile_document({4: [1.5e-3] * 3, 8: [2e-3] * 3}, "test"), "profile.json")
    result = tune(profile, QUICK, [4], [0.0], default=None)
    chosen = result["chosen"]
    assert chosen["max_batch_size"] == 4 and chosen["extrapolated"] is False  # the context: its largest batch
    assert chosen["mean_batch_size"] == pytest.approx(2.654, abs=1e-3) and chosen["mean_batch_extrapolated"] is True
    t_mean = 1e-3 + 1.25e-4 * chosen["mean_batch_size"]  # the fit through (4, 1.5 ms) and (8, 2 ms)
    assert result["warnings"] == [
        "the chosen setting's simulated batches average 2.65 requests (max_batch_size 4), below the smallest batch "
        f"the profile measured (4): their mean batch time, {1e3 * t_mean:.3g} ms, is the fit α + β·n extrapolated; "
        "profile batches of 2 to check it"
    ]
    comment = "# written by wok tune; mean batch 2.65 (max_batch_size 4) extrapolated: profiled from 4"
    assert result["config_toml"].splitlines()[0] == comment
    out = io.StringIO()
    print_table(result, file=out)
    assert "chosen, extrapolated" in out.getvalue()


def test_without_a_profiled_range_extrapolation_is_not_known():
    """--alpha/--beta, and a profile whose batches hold no sizes: nothing to measure the pick against."""
    fit_only = {"schema": "wok.profile/1", "fit": {"alpha_s": 1e-3, "beta_s": 1.25e-4}}
    for profile in (Profile(1e-3, 1.25e-4, source="--alpha/--beta"), profile_from_document(fit_only)):
        result = tune(profile, QUICK, [8, 16], [0.0], default=None)
        assert result["inputs"]["largest_profiled_batch"] is None
        assert [r["extrapolated"] for r in result["settings"]] == [None, None]
        assert [r["mean_batch_extrapolated"] for r in result["settings"]] == [None, None]
        assert result["warnings"] == []


def test_the_cpu_calibrations_batch_time_is_not_judged_by_the_profiles_sizes():
    """The calibration's batch time replaces the profile's: the profile's range says nothing of it, and a stage
    made in code carries no mean batch sizes of its own (a file's `points` do: the tests below)."""
    from wok.bench.tune import CpuStage

    profile = profile_from_document(profile_document(PROFILED, "test"), "profile.json")
    stage = CpuStage(batch_alpha_s=1e-3, batch_beta_s=1.25e-4)
    result = tune(profile, QUICK, [16], [0.0], default=None, cpu=stage)
    assert result["inputs"]["batch_times"] == "server" and result["inputs"]["largest_profiled_batch"] is None
    assert result["chosen"]["extrapolated"] is None and result["warnings"] == []


def test_a_profiles_sizes_without_samples_still_bound_the_fit():
    """A `wok profile` document lists every size it fitted on, with or without its raw samples."""
    doc = profile_document(PROFILED, "test")
    for b in doc["batches"]:
        del b["samples_s"]
    profile = profile_from_document(doc, "profile.json")
    result = tune(profile, QUICK, [16], [0.0], default=None)
    assert result["inputs"]["largest_profiled_batch"] == 8 and result["chosen"]["extrapolated"] is True


def test_the_cli_says_the_mlp_profiles_pick_of_64_is_extrapolated(tmp_path, wok_cli):
    """docs/results/tune-profile-mlp.json holds batches of 1 to 32 (`wok profile` refuses more than the
    model's max_batch_size); with the default grid `wok tune` chose 64 and wrote it as it would a measured one."""
    profile = Path(__file__).resolve().parents[2] / "docs" / "results" / "tune-profile-mlp.json"
    out, cfg = tmp_path / "tune.json", tmp_path / "config.toml"
    status, stdout, stderr = wok_cli(
        "tune", "--slo-p99", "50ms", "--profile", str(profile), "--max-batch-sizes", "32,64", "--delays", "0ms",
        "--default", "none", "--sim-duration", "1s", "--iterations", "2", "--json", str(out),
        "--write-config", str(cfg),
    )  # fmt: skip
    assert status == 0, stderr
    result = json.loads(out.read_text())
    assert result["chosen"]["max_batch_size"] == 64 and result["chosen"]["extrapolated"] is True
    assert result["chosen"]["mean_batch_size"] < 32 and result["chosen"]["mean_batch_extrapolated"] is False
    assert result["inputs"]["largest_profiled_batch"] == 32
    assert cfg.read_text().startswith("# written by wok tune; max_batch_size 64 extrapolated: profiled to 32\n")
    assert "warning: the chosen max_batch_size 64 is past the largest batch the profile measured (32)" in stdout


# ---------------------------------------------------------------------------- one fit of a profile


def test_a_profile_document_is_fitted_on_the_per_size_medians_as_wok_profile_fits():
    """Batch times of 1 + n ms, with one batch of 1 preempted (14 ms): `wok profile` fits the medians, 2, 3
    and 5 ms, to T = 1 + 1·n ms; profile_document fitted every sample, to T = 4.5 ms flat (β ≈ 0), so one
    set of times gave tune_check's simulator another batch time than `wok tune --profile` of the same times."""
    samples = {1: [2e-3, 2e-3, 2e-3, 14e-3], 2: [3e-3, 3e-3], 4: [5e-3, 5e-3]}
    fit = profile_document(samples, "by hand")["fit"]
    assert (fit["alpha_s"], fit["beta_s"], fit["r2"]) == pytest.approx((1e-3, 1e-3, 1.0))
    assert fit["on"] == "per-size medians"
    from wok.bench.tune import fit_medians  # the one fit, `wok profile`'s too

    medians, line, on = fit_medians(samples)
    assert medians == {1: 2e-3, 2: 3e-3, 4: 5e-3} and line == (fit["alpha_s"], fit["beta_s"], fit["r2"])
    assert on == "per-size medians"


def test_wok_profiles_own_samples_written_again_give_its_fit_exactly():
    """`docs/results/tune-profile-mlp.json` is `wok profile`'s (100 batches per size): its samples through
    profile_document gave α = 0.685 ms, β = 0.0558 ms against the file's 0.407 and 0.0450."""
    doc = json.loads((Path(__file__).resolve().parents[2] / "docs" / "results" / "tune-profile-mlp.json").read_text())
    again = profile_document({b["batch_size"]: b["samples_s"] for b in doc["batches"]}, "again")
    assert [again["fit"][k] for k in ("alpha_s", "beta_s", "r2")] == [
        doc["fit"][k] for k in ("alpha_s", "beta_s", "r2")
    ]
    assert [b["median_s"] for b in again["batches"]] == [b["median_s"] for b in doc["batches"]]


def test_a_size_without_batch_times_is_refused_naming_it():
    with pytest.raises(
        ValueError, match=r"^batch size 4: expected at least one batch time to take its median of; got none$"
    ):
        profile_document({1: [1e-3], 4: []}, "by hand")


# ------------------------------------------------------------ extrapolated: below, and the calibration's


def test_a_pick_below_the_smallest_profiled_batch_says_it_is_extrapolated():
    """A profile of batches of 4 and 8: batches of 2 run on the fit carried below 4 (at small batches the line
    holds least: a fitted α < 0 is the common sign). tune() marked only the sizes past 8."""
    import io

    from wok.bench.tune import print_table

    profile = profile_from_document(profile_document({4: [1.5e-3] * 3, 8: [2e-3] * 3}, "test"), "profile.json")
    result = tune(profile, QUICK, [1, 2, 4], [0.0], default=None)
    assert [(r["max_batch_size"], r["extrapolated"]) for r in result["settings"]] == [(1, True), (2, True), (4, False)]
    # Below by max_batch_size, below by the mean too; 4's batches average 2.65 (the test above).
    assert [r["mean_batch_extrapolated"] for r in result["settings"]] == [True, True, True]
    assert (result["inputs"]["smallest_profiled_batch"], result["inputs"]["largest_profiled_batch"]) == (4, 8)
    result = tune(profile, QUICK, [2], [0.0], default=None)
    assert result["chosen"]["mean_batch_size"] == pytest.approx(1.505, abs=1e-3)
    warning = (
        "the chosen setting's simulated batches average 1.51 requests (max_batch_size 2), below the smallest batch "
        "the profile measured (4): their mean batch time, 1.19 ms, is the fit α + β·n extrapolated; profile batches "
        "of 1 to check it"
    )
    assert result["warnings"] == [warning]
    comment = "# written by wok tune; mean batch 1.51 (max_batch_size 2) extrapolated: profiled from 4"
    assert result["config_toml"].splitlines()[0] == comment
    out = io.StringIO()
    print_table(result, file=out)
    assert "chosen, extrapolated" in out.getvalue() and f"warning: {warning}" in out.getvalue()


def _calibration(tmp_path, means, **stage) -> Path:
    from wok.bench.tune import CpuStage, cpu_document

    stage = CpuStage(batch_alpha_s=1e-3, batch_beta_s=1.25e-4, **stage)
    path = tmp_path / "cpu.json"
    path.write_text(json.dumps(cpu_document(stage, "test", points=[{"mean_batch_size": m} for m in means])))
    return path


def test_the_cpu_calibrations_batch_time_is_judged_by_its_loads_mean_batches(tmp_path):
    """bench/tune_check.py fits the server's batch time on its loads' mean batches (2.6 to 14.7 in run 8's
    calibration) and `wok tune` used it up to 64 with `extrapolated` null: no mark, no warning."""
    from wok.bench.tune import cpu_from_document, load_cpu

    profile = profile_from_document(profile_document(PROFILED, "test"), "profile.json")
    stage = load_cpu(_calibration(tmp_path, [14.72, 2.57, 7.84]))
    result = tune(profile, QUICK, [2, 8, 16], [0.0], default=None, cpu=stage)
    assert result["inputs"]["batch_times"] == "server"
    assert [(r["max_batch_size"], r["extrapolated"]) for r in result["settings"]] == [(2, True), (8, False), (16, True)]
    # The calibration's range is of loads' mean batches: the simulated mean is what compares with it. 16's batches
    # average 7.79 (3/4 of its ceiling, as with the profile's same fit above), within 2.57 to 14.72.
    means = [r["mean_batch_extrapolated"] for r in result["settings"]]
    assert means == [True, False, False]
    assert (result["inputs"]["smallest_profiled_batch"], result["inputs"]["largest_profiled_batch"]) == (2.57, 14.72)
    assert result["chosen"]["max_batch_size"] == 16
    assert result["warnings"] == [
        "the chosen max_batch_size 16 is past the mean batch sizes the CPU calibration's batch time was fitted on "
        f"(2.6 to 14.7): its simulated batches average {round(result['chosen']['mean_batch_size'], 2):g} requests, "
        "within the measured range, but its larger batches and its ceiling run on the fit α + β·n extrapolated (a "
        "batch of 16: 3 ms); calibrate at loads whose mean batch reaches about 16 to check it (bench/tune_check.py: "
        "higher --cpu-steps, with a --default max_batch_size of 16 or more)"
    ]
    comment = "# written by wok tune; max_batch_size 16 extrapolated: calibrated at mean batches 2.6-14.7"
    assert result["config_toml"].splitlines()[0] == comment
    # Run 8's calibration as tune_check wrote it: its three loads' mean batches.
    run8 = load_cpu(Path(__file__).resolve().parents[2] / "docs" / "results" / "tune-cpu-mlp-run8.json")
    inputs = tune(profile, QUICK, [64], [0.0], default=None, cpu=run8)["inputs"]
    assert [round(inputs[k], 2) for k in ("smallest_profiled_batch", "largest_profiled_batch")] == [2.57, 14.72]
    # A calibration written without its points (by hand): its range is not known, as with --alpha/--beta.
    bare = json.loads(_calibration(tmp_path, []).read_text())
    del bare["points"]
    result = tune(profile, QUICK, [16], [0.0], default=None, cpu=cpu_from_document(bare))
    assert result["inputs"]["largest_profiled_batch"] is None and result["chosen"]["extrapolated"] is None


MEAN_BATCH = "expected the load's mean batch size, a finite number ≥ 1"


@pytest.mark.parametrize(
    ("points", "got"),
    [
        ({"load": 1}, "points: expected a list of the calibration's loads; got an object"),
        ([3.0], "points[0]: expected an object; got 3.0"),
        ([{"mean_batch_size": 4.0}, {}], f"points[1].mean_batch_size: {MEAN_BATCH}; got none"),  # said "missing; …"
        ([{"mean_batch_size": None}], f"points[0].mean_batch_size: {MEAN_BATCH}; got null"),
        ([{"mean_batch_size": "4"}], f"points[0].mean_batch_size: {MEAN_BATCH}; got a string ('4')"),
        ([{"mean_batch_size": 0.5}], f"points[0].mean_batch_size: {MEAN_BATCH}; got 0.5"),
    ],
    ids=["not-a-list", "not-an-object", "missing", "null", "a-string", "below-1"],
)
def test_a_calibrations_points_it_cannot_read_are_refused_naming_the_field(tmp_path, points, got):
    from wok.bench.tune import load_cpu

    path = _calibration(tmp_path, [])
    doc = json.loads(path.read_text())
    doc["points"] = points
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError) as info:
        load_cpu(path)
    assert str(info.value) == f"--cpu-calibration {path}: {got}"


# ---------------------------------------------------------------------------- a new operator's review

# The README's profile on this machine (`wok profile mlp`: batches 1 to 32, on the CPU): T(n) = 0.445 + 0.0297·n ms.
README_PROFILED = {n: [0.445e-3 + 0.0297e-3 * n] * 3 for n in (1, 2, 4, 8, 16, 32)}
# Bisected far enough (6 steps) that 64's batches average past 32 at its max QPS (58.9), as the README's did (62.5).
CLOSER = replace(QUICK, iterations=6)


def test_a_measured_setting_is_chosen_before_an_extrapolated_one():
    """The README's `wok tune` chose 64 ("chosen, extrapolated", batches averaging 62.5 on a profile that stops at
    32) and wrote it into tuned.toml, though 32, measured, meets the SLO as well."""
    profile = profile_from_document(profile_document(README_PROFILED, "test"), "profile.json")
    result = tune(profile, CLOSER, [32, 64], [0.0], default=None)
    chosen, passed = result["chosen"], result["passed_over"]
    assert chosen["max_batch_size"] == 32 and chosen["mean_batch_extrapolated"] is False
    assert passed["max_batch_size"] == 64 and passed["mean_batch_extrapolated"] is True
    assert passed["max_qps"] > chosen["max_qps"] and result["inputs"]["allow_extrapolated"] is False
    assert tomllib.loads(result["config_toml"])["max_batch_size"] == 32
    assert result["config_toml"].startswith("# written by wok tune\n")
    assert result["warnings"] == [
        f"max_batch_size 64, delay 0 ms predicts {passed['max_qps']:,.0f} QPS, more than the chosen "
        f"{chosen['max_qps']:,.0f}, but on batch times extrapolated past the largest batch the profile measured (32): "
        "not chosen; "
        "profile batches of 64 to check it, or pass --allow-extrapolated to choose it"
    ]
    allowed = tune(profile, CLOSER, [32, 64], [0.0], default=None, allow_extrapolated=True)
    assert allowed["chosen"]["max_batch_size"] == 64 and allowed["passed_over"] is None
    assert allowed["inputs"]["allow_extrapolated"] is True
    # With no measured setting that meets the SLO, the extrapolated one is still chosen (and warned of).
    alone = tune(profile, CLOSER, [64], [0.0], default=None)
    assert alone["chosen"]["max_batch_size"] == 64 and alone["passed_over"] is None
    assert alone["warnings"][0].startswith("the chosen setting's simulated batches average")


def test_a_setting_passed_over_on_a_calibrations_batch_time_says_to_calibrate_there(tmp_path):
    """With a CPU calibration's batch time the passed-over warning cited the calibration's loads' mean batches (2.6
    to 14.7) as "the measured sizes" and said "measure batches of 64": the profile may have measured 64 already, and
    its times are not the ones simulated. What is outside is the setting's mean batch; a calibration reaching it
    checks it."""
    from wok.bench.tune import load_cpu

    profile = profile_from_document(profile_document(README_PROFILED, "test"), "profile.json")
    stage = load_cpu(_calibration(tmp_path, [14.72, 2.57, 7.84]))
    result = tune(profile, CLOSER, [8, 64], [0.0], default=None, cpu=stage)
    chosen, passed = result["chosen"], result["passed_over"]
    assert chosen["max_batch_size"] == 8 and passed["max_batch_size"] == 64
    mean = round(passed["mean_batch_size"], 2)
    assert mean > 32  # past the profile's 32 as well: profiling 64 would not have been the check either
    assert result["warnings"] == [
        f"max_batch_size 64, delay 0 ms predicts {passed['max_qps']:,.0f} QPS, more than the chosen "
        f"{chosen['max_qps']:,.0f}, but its simulated batches average {mean:g} requests, past the mean batch sizes "
        "the CPU calibration's batch time was fitted on (2.6 to 14.7), on batch times extrapolated: not chosen; "
        f"calibrate at loads whose mean batch reaches about {mean:g} to check it (bench/tune_check.py: higher "
        f"--cpu-steps, with a --default max_batch_size of {math.ceil(mean)} or more), or pass --allow-extrapolated "
        "to choose it"
    ]


def test_the_cli_chooses_measured_unless_allowed_and_says_what_it_wrote(tmp_path, wok_cli):
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps(profile_document(README_PROFILED, "test")))
    out, cfg = tmp_path / "tune.json", tmp_path / "tuned.toml"
    argv = ["tune", "--slo-p99", "50ms", "--profile", str(profile), "--max-batch-sizes", "32,64", "--delays", "0ms",
            "--default", "none", "--sim-duration", "0.5s", "--sim-warmup", "0s", "--iterations", "6"]  # fmt: skip
    status, stdout, stderr = wok_cli(*argv, "--json", str(out), "--write-config", str(cfg))
    assert status == 0, stderr
    assert tomllib.loads(cfg.read_text())["max_batch_size"] == 32
    assert "warning: max_batch_size 64, delay 0 ms predicts" in stdout
    assert stderr.splitlines()[-2:] == [f"wok tune: wrote {out} (--json)", f"wok tune: wrote {cfg} (--write-config)"]
    status, stdout, stderr = wok_cli(*argv, "--write-config", str(cfg), "--allow-extrapolated")
    assert status == 0, stderr
    assert tomllib.loads(cfg.read_text())["max_batch_size"] == 64


def test_a_prediction_without_the_servers_cpu_says_so(tmp_path, wok_cli):
    """`wok tune --slo-p99 50ms --profile profile.json` predicted 27,205 QPS on this machine, where the server
    saturates near 4,000 on its per-request CPU, without a word: now a field and a warning above the table. An
    overhead alone does not count (it delays each request, leaving the batcher's capacity); a CPU stage does."""
    from wok.bench.tune import NO_CPU_WARNING

    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps(profile_document(README_PROFILED, "test")))
    out = tmp_path / "tune.json"
    argv = ["tune", "--slo-p99", "50ms", "--profile", str(profile), "--max-batch-sizes", "8", "--delays", "0ms",
            "--default", "none", "--sim-duration", "0.5s", "--sim-warmup", "0s", "--iterations", "2",
            "--json", str(out)]  # fmt: skip
    for extra, modelled in (([], False), (["--overhead", "0.4ms"], False), (["--per-request-cpu", "0.4ms"], True)):
        status, stdout, stderr = wok_cli(*argv, *extra)
        assert status == 0, stderr
        assert json.loads(out.read_text())["inputs"]["server_cpu_modelled"] is modelled, extra
        assert (f"WARNING: {NO_CPU_WARNING}\n" in stdout) is not modelled, extra
        assert ("the batcher's alone, no server CPU modelled)" in stdout) is not modelled, extra
