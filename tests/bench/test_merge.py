"""Mergeable latency histograms and `wok bench merge`: N processes' results add up to one process's."""

from __future__ import annotations

import io
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from wok.__main__ import main as wok_main
from wok.bench import analysis, report
from wok.bench.histogram import LatencyHistogram, bucket_bounds, bucket_index, relative_error
from wok.bench.merge import merge_results

ERR = relative_error()
ROOT = Path(__file__).resolve().parents[2]


# -- the histogram --------------------------------------------------------------------------------------
def test_buckets_by_hand_with_two_sub_bucket_bits():
    # Below 2·2² = 8 ns every nanosecond is a bucket; [8, 16) splits into 4 buckets of 2 ns,
    # [16, 32) into 4 of 4 ns: 8 → (3 − 2)·4 + 8 >> 1 = 8, 15 → 4 + 7 = 11, 16 → 2·4 + 16 >> 2 = 12.
    assert bucket_index(np.array([0, 7, 8, 9, 10, 15, 16, 19, 20, 31, 32]), 2).tolist() == [
        0, 7, 8, 8, 9, 11, 12, 12, 13, 15, 16,
    ]  # fmt: skip
    assert [bucket_bounds(i, 2) for i in (7, 8, 11, 12, 15, 16)] == [(7, 8), (8, 10), (14, 16), (16, 20), (28, 32),
                                                                     (32, 40)]  # fmt: skip


@pytest.mark.parametrize("bits", [1, 3, 7])
def test_every_value_lies_in_its_bucket_and_buckets_are_at_most_2_to_minus_bits_wide(bits):
    rng = np.random.default_rng(bits)
    v = np.concatenate([np.arange(3000), rng.integers(0, 2**62, 20000), [2**40 - 1, 2**40, 2**63 - 1]])
    idx = bucket_index(v, bits)
    order = np.argsort(v)
    assert (np.diff(idx[order]) >= 0).all()  # buckets are in value order
    for x, i in zip(v.tolist(), idx.tolist()):
        lo, hi = bucket_bounds(i, bits)
        assert lo <= x < hi
        assert hi - lo == 1 or (hi - lo) <= lo * 2.0**-bits


def test_percentiles_by_hand():
    # 1..100 ms: nearest-rank P50 is 50 ms = 5e7 ns, in [2^25, 2^26): buckets of 2^18 ns,
    # 5e7 >> 18 = 190, so its bucket ends at 191·2^18 = 50,069,504 ns.
    h = LatencyHistogram.from_ms(np.arange(1, 101, dtype=np.float64))
    s = h.summary()
    assert s["p50"] == 50.069504
    assert s["mean"] == 50.5 and s["max"] == 100.0
    assert s["p999"] == 100.0  # the bucket's end is clamped to the exact maximum
    assert h.count == 100 and h.sum_ns == 5050 * 10**6 and h.min_ns == 10**6


@pytest.mark.parametrize(
    "ms, ns",
    [
        (0.57, 570_000),  # whole nanoseconds are kept as they are, decimal or not in binary
        (0.001, 1_000),  # its float is a shade above 1000 ns: rounding the exact product up makes 1001
        (0.000123, 123),  # 123.00000000000001 ns as a float product: rounding that up makes 124
        (2.5, 2_500_000),
        (0.0, 0),
        (0.000249, 249),  # 248.99999999999997 ns as a float product: flooring made 248
        (1.000001, 1_000_001),  # 1000000.9999999999: flooring made 1,000,000
        (0.5700005, 570_001),  # half a nanosecond over a whole one goes up
        (0.0000005, 1),
        (1e-12, 1),
    ],
)
def test_a_latency_becomes_the_fewest_whole_nanoseconds_not_below_it(ms, ns):
    h = LatencyHistogram.from_ms([ms])
    assert (h.min_ns, h.max_ns, h.sum_ns) == (ns, ns, ns)
    s = h.summary()
    assert s["max"] >= ms and s["p99"] >= ms and s["mean"] >= ms


def test_whole_nanoseconds_up_to_3_ms_are_kept_and_other_latencies_round_up_by_under_1_ns():
    ns = np.arange(3_000_000)
    h = LatencyHistogram.from_ms(ns / 1e6)
    assert h.sum_ns == int(ns.sum()) and (h.min_ns, h.max_ns) == (0, 2_999_999)
    for x in np.random.default_rng(5).lognormal(0.0, 3.0, 2000).tolist():
        v = LatencyHistogram.from_ms([x]).max_ns
        assert (v - 1) / 1e6 < x <= v / 1e6, (x, v)


def _fewest_ns_by_definition(v: int, x: float) -> bool:
    # Python's int / int is correctly rounded, as the histogram's own ns / NS_PER_MS is.
    return v / 10**6 >= x and (v == 0 or (v - 1) / 10**6 < x)


def test_latencies_past_2_53_ns_and_subnormal_ones_become_the_fewest_whole_nanoseconds_not_below_them():
    # Past 2^53 ns (104 days) the float product and v ± 1 are no longer exact: 16294988442.886961 ms
    # became 16294988442886960 ns, whose ms are below it (1 ns low), and 13928645467.002977 ms one too many.
    rng = np.random.default_rng(11)
    whole = [*rng.integers(2**53, 2**63 - 2**20, 3000, dtype=np.int64).tolist(), 2**53 - 1, 2**53, 2**53 + 1]
    big = np.array([v / 10**6 for v in whole])
    subnormal = rng.integers(1, 2**52, 1000, dtype=np.int64).view(np.float64)
    for xs in (big, np.nextafter(big, 0), np.nextafter(big, np.inf), subnormal, [5e-324, 2.2250738585072014e-308]):
        for x in np.asarray(xs, dtype=np.float64).tolist():
            v = LatencyHistogram.from_ms([x]).max_ns
            assert _fewest_ns_by_definition(v, x), (x, v)
    assert LatencyHistogram.from_ms([16294988442.886961]).max_ns == 16294988442886961
    assert LatencyHistogram.from_ms([13928645467.002977]).max_ns == 13928645467002977


@pytest.mark.parametrize("ms", [9223372036854.777, 1e13, 1e300, 1.7976931348623157e308])
def test_a_latency_past_the_histograms_whole_nanoseconds_is_refused_by_its_value(ms):
    # Its nanoseconds overflowed int64 to −2^63, refused as "latencies must be >= 0", though none was.
    with pytest.raises(ValueError, match=rf"latency {re.escape(repr(ms))} ms: expected at most 2\^63 − 1 ns"):
        LatencyHistogram.from_ms([1.0, ms])
    assert LatencyHistogram.from_ms([9223372036854.775]).max_ns <= 2**63 - 1


def test_a_sum_past_2_63_ns_is_kept_exactly():
    # The sum of whole nanoseconds wrapped in int64: two 5e12 ms latencies had a negative mean.
    one = LatencyHistogram.from_ms([5e12])
    two = LatencyHistogram.from_ms([5e12, 5e12])
    assert two.sum_ns == 2 * one.sum_ns > 2**63
    assert two.summary()["mean"] == one.summary()["mean"] >= 5e12


def test_percentiles_are_never_below_exact_and_at_most_the_relative_error_above():
    rng = np.random.default_rng(7)
    ms = np.concatenate([rng.lognormal(1.0, 1.2, 20000), rng.uniform(0.05, 0.3, 300)])
    exact = analysis.latency_summary(ms)
    approx = LatencyHistogram.from_ms(ms).summary()
    for k in ("p50", "p90", "p95", "p99", "p999", "max"):
        # The histogram rounds latencies up to whole nanoseconds: at most 1e-6 ms more.
        assert exact[k] <= approx[k] <= exact[k] * (1 + ERR) + 1e-6, (k, exact[k], approx[k])
    assert exact["mean"] <= approx["mean"] <= exact["mean"] + 1e-6


def test_histograms_of_a_split_merge_into_the_histogram_of_the_whole():
    rng = np.random.default_rng(3)
    ms = rng.lognormal(0.5, 1.0, 5000)
    owner = rng.integers(0, 4, ms.size)
    parts = [LatencyHistogram.from_ms(ms[owner == i]) for i in range(4)]
    merged = LatencyHistogram()
    for p in parts:
        merged.merge(LatencyHistogram.from_dict(json.loads(json.dumps(p.to_dict()))))
    whole = LatencyHistogram.from_ms(ms)
    assert merged.to_dict() == whole.to_dict()
    assert merged.summary() == whole.summary()


def test_a_histogram_that_does_not_add_up_or_another_layout_is_refused():
    d = LatencyHistogram.from_ms([1.0, 2.0]).to_dict()
    with pytest.raises(ValueError, match="add up to"):
        LatencyHistogram.from_dict({**d, "count": 3})
    with pytest.raises(ValueError, match="sub-bucket bits"):
        LatencyHistogram(7).merge(LatencyHistogram(5))
    assert np.isnan(LatencyHistogram().summary()["p99"])


@pytest.mark.parametrize(
    ("unit", "got"),
    [({"unit": "ms"}, "'ms'"), ({"unit": None}, "null"), ({}, "none"), ({"unit": math.nan}, "NaN"), ({"unit": 1}, "1")],
    ids=["ms", "null", "missing", "nan", "number"],
)
def test_a_histogram_of_another_unit_is_refused_naming_what_it_holds(unit, got):
    # The unit was shown by repr: a missing one and a null alike as None, Python's word.
    d = {k: v for k, v in LatencyHistogram.from_ms([1.0]).to_dict().items() if k != "unit"} | unit
    with pytest.raises(ValueError) as info:
        LatencyHistogram.from_dict(d)
    assert str(info.value) == f"histogram unit: expected 'ns'; got {got}"


@pytest.mark.parametrize(("given", "got"), [(None, "null"), ([1, 2], "[1, 2]"), ("ns", "'ns'")])
def test_a_histogram_that_is_no_object_is_refused_as_one(given, got):
    # from_dict's d.get raised AttributeError, which merge_results let through: a traceback, naming neither the part
    # nor the step.
    with pytest.raises(ValueError) as info:
        LatencyHistogram.from_dict(given)
    assert str(info.value) == f"histogram: expected a JSON object; got {got}"


def test_a_part_whose_step_histogram_is_no_object_is_refused_naming_it(split_ramp):
    _, parts = split_ramp
    b = json.loads(json.dumps(parts[1]))
    b["steps"][0]["latency_histogram"] = None
    with pytest.raises(ValueError) as info:
        merge_results([parts[0], b], ["a.json", "b.json"])
    assert str(info.value).endswith(
        "latency_histogram of b.json: expected a latency histogram; histogram: expected a JSON object; got null"
    )


# -- merging results --------------------------------------------------------------------------------------
def _requests(rng, n, duration):
    intended = np.sort(rng.uniform(0, duration, n))
    sent = intended + rng.exponential(0.0002, n)
    done = sent + rng.lognormal(-4.0, 0.8, n)
    codes = np.where(rng.random(n) < 0.03, "UNAVAILABLE", "OK")
    codes[rng.random(n) < 0.01] = "DEADLINE_EXCEEDED"
    return intended, sent, done, codes


def _result(steps_data, offered, seed, duration):
    steps = []
    for (intended, sent, done, codes), qps in zip(steps_data, offered):
        step = analysis.step_result(
            offered_qps=qps,
            duration_s=duration,
            intended_s=intended,
            sent_s=sent,
            done_s=done,
            codes=codes,
            inflight_samples=np.array([qps * 0.02]),
        )
        step["nominal_qps"] = qps
        steps.append(step)
    config = {"source": "bench", "models": [["mlp", 1.0]], "step_duration_s": duration, "seed": seed, "workers": 2}
    return json.loads(report.to_json(analysis.ramp_result(steps=steps, slo_p99_ms=50.0, config=config)))


@pytest.fixture
def split_ramp():
    """One ramp's requests (3 steps), and the same requests dealt among 3 processes at random."""
    rng = np.random.default_rng(11)
    duration, offered, n_parts = 4.0, [150.0, 300.0, 600.0], 3
    whole_data = [_requests(rng, int(q * duration), duration) for q in offered]
    owners = [rng.integers(0, n_parts, len(d[0])) for d in whole_data]
    parts = [
        _result(
            [tuple(a[o == i] for a in d) for d, o in zip(whole_data, owners)],
            [q / n_parts for q in offered],
            i,
            duration,
        )
        for i in range(n_parts)
    ]
    whole = _result(whole_data, offered, 0, duration)
    return whole, parts


def test_merged_parts_have_the_counts_and_exactly_the_percentiles_of_the_whole(split_ramp):
    whole, parts = split_ramp
    merged = merge_results(parts, ["a.json", "b.json", "c.json"])
    assert merged["schema"] == "wok.bench/2"
    assert len(merged["steps"]) == len(whole["steps"])
    for m, w in zip(merged["steps"], whole["steps"]):
        for key in ("requests", "ok", "errors", "late_sends"):
            assert m[key] == w[key], key
        assert m["offered_qps"] == pytest.approx(w["offered_qps"])
        assert m["nominal_qps"] == pytest.approx(w["nominal_qps"])
        assert m["achieved_qps"] == pytest.approx(w["achieved_qps"])
        assert m["success_rate"] == pytest.approx(w["success_rate"])
        # Same buckets: the merged histogram is the whole's, so are its percentiles, exactly.
        assert m["latency_histogram"] == w["latency_histogram"]
        assert m["latency_ms"] == LatencyHistogram.from_dict(w["latency_histogram"]).summary()
        assert m["latency_source"] == "histogram" and w["latency_source"] == "exact"
        for k in ("p50", "p90", "p95", "p99", "p999", "max"):
            assert w["latency_ms"][k] - 1e-6 <= m["latency_ms"][k] <= w["latency_ms"][k] * (1 + ERR)
        # λW adds; the dispatch-lag figures are upper bounds of the whole's.
        assert m["littles_law"]["lambda_w"] == pytest.approx(w["littles_law"]["lambda_w"])
        assert m["littles_law"]["mean_in_flight_ms"] == pytest.approx(w["littles_law"]["mean_in_flight_ms"])
        assert m["littles_law"]["arrival_rate_qps"] == pytest.approx(w["littles_law"]["arrival_rate_qps"])
        assert m["dispatch_lag_ms"]["p99"] >= w["dispatch_lag_ms"]["p99"]
        assert m["dispatch_lag_ms"]["max"] == w["dispatch_lag_ms"]["max"]
    assert merged["max_qps_under_slo"] == whole["max_qps_under_slo"]
    assert merged["config"]["steps"] == [150.0, 300.0, 600.0]
    assert merged["config"]["workers"] == 6
    assert merged["config"]["merged"]["parts"] == ["a.json", "b.json", "c.json"]


def test_the_server_view_comes_from_the_first_part_only(split_ramp):
    _, parts = split_ramp
    for i, p in enumerate(parts):
        p["steps"][0]["server"] = {"requests": 1000 + i}
        p["steps"][0]["mean_batch_size"] = 4.0 + i
    m = merge_results(parts)["steps"][0]
    assert m["server"] == {"requests": 1000} and m["mean_batch_size"] == 4.0
    assert m["outside_server_ms"] is None  # that view has no end-to-end mean
    parts[0]["steps"][0]["server"] = {"requests": 1000, "e2e_ms": {"mean": 1.5}}
    m = merge_results(parts)["steps"][0]
    # The merged client mean (over every part's requests) against the one server's mean.
    assert m["outside_server_ms"] == pytest.approx(m["latency_ms"]["mean"] - 1.5)


def test_parts_of_different_ramps_do_not_merge(split_ramp):
    _, parts = split_ramp
    other = json.loads(json.dumps(parts[1]))
    other["steps"][1]["duration_s"] = 5.0
    with pytest.raises(ValueError, match="step 2: the parts' measured windows differ"):
        merge_results([parts[0], other])
    other = json.loads(json.dumps(parts[1]))
    other["config"]["models"] = [["encoder", 1.0]]
    with pytest.raises(ValueError, match="model mix"):
        merge_results([parts[0], other])
    # The same models in other proportions are another load; the same proportions written
    # differently are not.
    a, b = (json.loads(json.dumps(p)) for p in parts[:2])
    a["config"]["models"], b["config"]["models"] = [["mlp", 0.7], ["encoder", 0.3]], [["mlp", 0.1], ["encoder", 0.9]]
    with pytest.raises(ValueError, match=r"model mix \(part 0: \[\('mlp', 0.7\), \('encoder', 0.3\)\]"):
        merge_results([a, b])
    b["config"]["models"] = [["mlp", 7], ["encoder", 3]]
    assert merge_results([a, b])["config"]["models"] == [["mlp", 0.7], ["encoder", 0.3]]
    other = json.loads(json.dumps(parts[1]))
    del other["steps"][0]["latency_histogram"]
    with pytest.raises(ValueError, match="no latency_histogram"):
        merge_results([parts[0], other])
    other = json.loads(json.dumps(parts[1]))
    other["config"]["source"] = "simulate"
    with pytest.raises(ValueError, match="only measured ramps"):
        merge_results([parts[0], other])


def test_parts_judged_by_other_thresholds_do_not_merge(split_ramp):
    # The first part's knee threshold decided the merged knee: a, b gave one knee and b, a another.
    _, parts = split_ramp
    other = json.loads(json.dumps(parts[1]))
    other["knee_threshold"] = 0.8
    with pytest.raises(ValueError, match=r"knee threshold \(part 0: 0.5, part 1: 0.8\)"):
        merge_results([parts[0], other])
    with pytest.raises(ValueError, match="knee threshold"):
        merge_results([other, parts[0]])
    other = json.loads(json.dumps(parts[1]))
    other["min_success_rate"] = 0.95
    with pytest.raises(ValueError, match="least success rate"):
        merge_results([parts[0], other])
    # A part written without the fields has the defaults.
    bare = json.loads(json.dumps(parts[1]))
    del bare["knee_threshold"], bare["min_success_rate"]
    assert merge_results([parts[0], bare])["knee_threshold"] == 0.5


KNEE = "a ratio Δachieved/Δoffered above 0 and at most 1 (as --knee-threshold takes)"
LEAST = "the least share of a step's requests that succeed for it to pass, above 0 and at most 1"


@pytest.mark.parametrize(("key", "expected"), [("knee_threshold", KNEE), ("min_success_rate", LEAST)])
@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (2.0, "2.0"),
        (0.0, "0.0"),
        (-0.5, "-0.5"),
        (float("nan"), "NaN"),  # the file's word: it was "nan", Python's
        ("0.5", "'0.5'"),
        (None, "null"),  # in the file's words: it was "None", Python's
        (True, "true"),
    ],
)
def test_a_part_whose_ratio_wok_bench_ramp_refuses_is_refused_by_name(split_ramp, key, expected, value, shown):
    # The CLI takes --knee-threshold in (0, 1] only; parts holding 2.0 (every one: they agreed) merged,
    # the knee found by a threshold no ramp runs with; "0.5" and null failed with a TypeError naming
    # neither the part nor the field. A min_success_rate of 2.0 merged too, every step failing the SLO
    # whatever its requests did, "0.5" as if a number, and null failed with a TypeError.
    _, parts = split_ramp
    a, b = (json.loads(json.dumps(p)) for p in parts[:2])
    b[key] = value

    def refusal(name: str) -> str:
        return re.escape(f"{name}: {key}: expected {expected}; got {shown}")

    with pytest.raises(ValueError, match=f"^{refusal('b.json')}$"):
        merge_results([a, b], ["a.json", "b.json"])
    a[key] = value
    with pytest.raises(ValueError, match=f"^{refusal('a.json')}$"):
        merge_results([a, b], ["a.json", "b.json"])
    # The range's top, which the CLI takes, merges.
    a[key] = b[key] = 1
    assert merge_results([a, b])[key] == 1.0


def test_parts_of_both_schema_versions_do_not_merge_and_one_versions_parts_keep_it(split_ramp):
    # A wok.bench/1 part's offered_qps may be over warm-up and window (before 067e39c): a sum with
    # a /2 part's would mean neither, so the merge names each part's version and stops.
    _, parts = split_ramp
    old = json.loads(json.dumps(parts[1]))
    old["schema"] = "wok.bench/1"
    with pytest.raises(
        ValueError,
        match=r"different schema versions \(a\.json: wok\.bench/2, b\.json: wok\.bench/1\): their offered_qps",
    ):
        merge_results([parts[0], old], ["a.json", "b.json"])
    olds = [{**json.loads(json.dumps(p)), "schema": "wok.bench/1"} for p in parts]
    assert merge_results(olds)["schema"] == "wok.bench/1"
    assert merge_results(parts)["schema"] == "wok.bench/2"
    unknown = {**json.loads(json.dumps(parts[1])), "schema": "wok.bench/3"}
    with pytest.raises(
        ValueError, match=r"b\.json: expected schema 'wok\.bench/1' or 'wok\.bench/2'; got 'wok\.bench/3'"
    ):
        merge_results([parts[0], unknown], ["a.json", "b.json"])
    # A result without a schema was said to hold a null one.
    (left_out := json.loads(json.dumps(parts[1]))).pop("schema")
    with pytest.raises(ValueError) as info:
        merge_results([parts[0], left_out], ["a.json", "b.json"])
    assert str(info.value) == "b.json: expected schema 'wok.bench/1' or 'wok.bench/2'; got none"
    with pytest.raises(ValueError) as info:
        merge_results([parts[0], {**left_out, "schema": None}], ["a.json", "b.json"])
    assert str(info.value) == "b.json: expected schema 'wok.bench/1' or 'wok.bench/2'; got null"


def test_steps_only_some_parts_ran_are_left_out_with_a_warning(split_ramp):
    _, parts = split_ramp
    parts[2]["steps"] = parts[2]["steps"][:2]  # stopped early
    merged = merge_results(parts)
    assert len(merged["steps"]) == 2
    assert any("different numbers of steps" in w for w in merged["warnings"])


def test_steps_run_high_to_low_merge_by_the_order_they_ran_when_a_part_stopped_early(split_ramp):
    # `--steps 200,100,50` on each of 3 machines (600, 300, 150 QPS in all); part c stopped after its
    # first step, 200. A result lists its steps by offered rate, so c's one step is listed where the
    # others list their 50: merged by that index, the step read 50 + 50 + 200 = 300 QPS, a rate never
    # run, with two thirds of its requests from another step. It is the 600 QPS step, as one process has it.
    whole, parts = split_ramp
    for p in parts:
        p["config"]["steps"] = [200.0, 100.0, 50.0]
    stopped = [*parts[:2], {**parts[2], "steps": [s for s in parts[2]["steps"] if s["nominal_qps"] == 200.0]}]
    merged = merge_results(stopped, ["a.json", "b.json", "c.json"])
    (m,) = merged["steps"]
    w = whole["steps"][2]
    assert (m["offered_qps"], m["nominal_qps"]) == (pytest.approx(600.0), pytest.approx(600.0))
    for key in ("requests", "ok", "errors", "late_sends", "latency_histogram"):
        assert m[key] == w[key], key
    assert m["achieved_qps"] == pytest.approx(w["achieved_qps"])
    assert merged["config"]["steps"] == [pytest.approx(600.0)]
    assert (
        "the parts ran different numbers of steps (a.json: 3, b.json: 3, c.json: 1): only the first 1 they ran "
        "are merged" in merged["warnings"]
    )
    assert "stopped_early" not in merged  # parts written before it: whether c stopped by a rule is unknown
    # c's rule ended the merged ramp where it ended c: said after its name, at the merged step's offer.
    why = "the step's P99 80 ms is over 1.5 × the SLO (50 ms)"
    stop = {"reason": why, "rule": "stop_factor", "at_qps": 200.0, "steps_run": 1, "steps_planned": 3}
    stopped = [{**p, "stopped_early": None} for p in stopped[:2]] + [{**stopped[2], "stopped_early": stop}]
    assert merge_results(stopped, ["a.json", "b.json", "c.json"])["stopped_early"] == {
        **stop,
        "reason": f"c.json: {why}",
        "at_qps": pytest.approx(600.0),
    }
    # Every part whole: each step with its own, listed by offered rate; config.steps in the order run.
    merged = merge_results([{**p, "stopped_early": None} for p in parts])
    assert [s["requests"] for s in merged["steps"]] == [s["requests"] for s in whole["steps"]]
    assert merged["config"]["steps"] == [pytest.approx(q) for q in (600.0, 300.0, 150.0)]
    assert merged["stopped_early"] is None


def test_parts_planned_with_other_steps_do_not_merge_even_where_the_steps_all_ran_agree(split_ramp):
    # c planned --steps 150,300 beside the others' 150,300,600 and ran both: the merge compared the two
    # steps all parts ran, merged them and dropped a's and b's 600 QPS step as if c had stopped early.
    _, parts = split_ramp
    for p in parts:
        p["config"]["steps"] = [50.0, 100.0, 200.0]
    parts[2]["config"]["steps"] = [50.0, 100.0]
    parts[2]["steps"] = parts[2]["steps"][:2]
    with pytest.raises(
        ValueError,
        match=r"^the parts planned different ramps \(--steps a\.json: 50, 100, 200; b\.json: 50, 100, 200; c\.json: "
        r"50, 100\); only runs of the same --steps, in the same order, merge",
    ):
        merge_results(parts, ["a.json", "b.json", "c.json"])
    # One plan, c stopped after two of its steps: merged, with a warning.
    parts[2]["config"]["steps"] = [50.0, 100.0, 200.0]
    merged = merge_results(parts, ["a.json", "b.json", "c.json"])
    assert len(merged["steps"]) == 2
    assert (
        "the parts ran different numbers of steps (a.json: 3, b.json: 3, c.json: 2): only the first 2 they ran "
        "are merged" in merged["warnings"]
    )


def test_requests_never_sent_add_apart_from_the_requests(split_ramp):
    _, parts = split_ramp
    parts[0]["steps"][1]["not_sent"] = 4
    parts[2]["steps"][1]["not_sent"] = 3
    merged = merge_results(parts)
    assert merged["steps"][1]["not_sent"] == 7
    assert merged["steps"][1]["requests"] == sum(p["steps"][1]["requests"] for p in parts)
    assert "not_sent" not in merged["steps"][0] and "not_sent" not in merged["steps"][2]


def test_parts_that_ran_a_step_at_other_rates_do_not_merge(split_ramp):
    # Part c ran --steps 50,100,300 beside the others' 50,100,200: its third step added to theirs made a
    # step of 700 QPS mixed from two offers, which nobody ran.
    _, parts = split_ramp
    for p in parts:
        p["config"]["steps"] = [50.0, 100.0, 200.0]
    parts[2]["config"]["steps"] = [50.0, 100.0, 300.0]
    parts[2]["steps"][2]["nominal_qps"] = parts[2]["steps"][2]["offered_qps"] = 300.0
    with pytest.raises(
        ValueError,
        match=r"^step 3 \(in the order the parts ran their steps\): the parts ran it at different rates \(--steps "
        r"values a\.json: 200 QPS, b\.json: 200 QPS, c\.json: 300 QPS\); only runs of the same --steps, in the same "
        r"order, merge",
    ):
        merge_results(parts, ["a.json", "b.json", "c.json"])
    # The same steps run in another order (c: 200, 100, 50) differ from the first on.
    parts[2]["steps"][2]["nominal_qps"] = parts[2]["steps"][2]["offered_qps"] = 200.0
    parts[2]["config"]["steps"] = [200.0, 100.0, 50.0]
    with pytest.raises(ValueError, match=r"^step 1 .*\(--steps values a: 50 QPS, b: 50 QPS, c: 200 QPS\)"):
        merge_results(parts, ["a", "b", "c"])
    # Without nominal_qps (a file older than it), the offered rates are compared.
    parts[2]["config"]["steps"] = [50.0, 100.0, 200.0]
    for p in parts:
        for step in p["steps"]:
            del step["nominal_qps"]
    assert len(merge_results(parts)["steps"]) == 3
    parts[1]["steps"][0]["offered_qps"] = 60.0
    with pytest.raises(ValueError, match=r"^step 1 .*\(offered rates part 0: 50 QPS, part 1: 60 QPS, part 2: 50 QPS\)"):
        merge_results(parts)


def test_parts_with_the_same_seed_are_warned_about(split_ramp):
    _, parts = split_ramp
    parts[1]["config"]["seed"] = parts[0]["config"]["seed"]
    assert any("same --seed" in w for w in merge_results(parts)["warnings"])
    assert not any("same --seed" in w for w in merge_results(split_ramp[1][1:])["warnings"])


@pytest.mark.parametrize("arrival", ["constant", "trace:calls.csv,scale=auto"])
def test_parts_whose_arrivals_ignore_the_seed_are_warned_about(split_ramp, arrival):
    """constant and trace schedules draw nothing from --seed: parts with their own seeds each
    still fire at the same instants, which the same-seed warning alone did not say."""
    _, parts = split_ramp
    for p in parts:
        p["config"]["arrival"] = arrival
    warnings = merge_results(parts)["warnings"]
    kind = arrival.partition(":")[0]
    assert any(f"--arrival {kind}, whose schedule does not depend on --seed" in w for w in warnings), warnings
    assert not any("same --seed" in w for w in warnings)
    for p in parts:
        p["config"]["arrival"] = "poisson"
    assert not any("--seed" in w for w in merge_results(parts)["warnings"])


def test_parts_without_one_start_at_are_warned_about_and_late_starts_carry_over(split_ramp):
    _, parts = split_ramp
    assert any("did not share one --start-at" in w for w in merge_results(parts)["warnings"])
    for part in parts:
        part["config"]["start_at"] = 1.9e9
        for step in part["steps"]:
            step["start_late_s"] = 0.0
    merged = merge_results(parts)
    assert not any("--start-at" in w or "after the slot" in w for w in merged["warnings"])
    assert [s["start_late_s"] for s in merged["steps"]] == [0.0, 0.0, 0.0]
    parts[1]["steps"][2]["start_late_s"] = 0.25
    parts[2]["steps"][2]["start_late_s"] = 0.5
    merged = merge_results(parts)
    assert [s["start_late_s"] for s in merged["steps"]] == [0.0, 0.0, 0.5]  # the latest part's
    assert any(w.startswith("step 3: a part started 0.500 s after the slot") for w in merged["warnings"])


def test_the_balancer_counters_of_the_parts_add_up(split_ramp):
    _, parts = split_ramp
    assert "balancer" not in merge_results(parts)
    replica = {"target": "t", "attempts": 10, "ok": 9, "failures": 1, "slow": 0, "hedges": 1, "retries": 0}
    for i, part in enumerate(parts):
        part["balancer"] = {
            "schema": "wok.balancer/1",
            **dict.fromkeys(("calls", "ok", "attempts", "hedges", "retries", "budget_refusals"), i + 1),
            "ejections": i,
            "ejections_refused": 0,
            "hedge_after_ms": [20.0],
            "replicas": [{"address": "127.0.0.1:1", **replica, "ejections": i}],
        }
    merged = merge_results(parts)["balancer"]
    assert (merged["calls"], merged["ejections"], merged["hedge_after_ms"]) == (1 + 2 + 3, 0 + 1 + 2, [20.0] * 3)
    (r,) = merged["replicas"]
    assert (r["address"], r["attempts"], r["ok"], r["ejections"]) == ("127.0.0.1:1", 30, 27, 3)


def test_the_parts_host_probes_are_kept_by_part_not_combined(split_ramp):
    _, parts = split_ramp
    assert "host_probes" not in merge_results(parts)
    probe = {"before": {"schema": "wok.hostprobe/2", "cold_forward_us": 150.0}, "after": None, "cold_forward_us": 150.0}
    failed = {"before": {"schema": "wok.hostprobe/2", "error": "boom"}, "after": None, "cold_forward_us": None}
    parts[0]["host_probe"] = probe
    parts[2]["host_probe"] = failed
    merged = merge_results(parts, ["a", "b", "c"])
    assert merged["host_probes"] == {"a": probe, "c": failed}


def test_the_servers_message_per_code_is_the_first_parts_that_has_one(split_ramp):
    """`wok bench merge` dropped `error_details`: a merged ramp's table said how many were refused, not why."""
    whole, parts = split_ramp
    assert all("error_details" not in s for s in merge_results(parts)["steps"])
    # The split's two codes (the fixture's DEADLINE_EXCEEDED is cut to its array's width).
    late, down = sorted(whole["steps"][0]["errors"])
    assert down == "UNAVAILABLE", whole["steps"][0]["errors"]
    parts[0]["steps"][0].pop("error_details", None)  # a part without the field (older), beside parts with it
    parts[1]["steps"][0]["error_details"] = {down: "b: draining"}
    parts[2]["steps"][0]["error_details"] = {late: "c: late", down: "c: draining"}
    parts[2]["steps"][1]["error_details"] = {down: "c: down", "NOT_FOUND": "not among the errors"}
    steps = merge_results(parts)["steps"]
    assert steps[0]["error_details"] == {late: "c: late", down: "b: draining"}
    assert steps[1]["error_details"] == {down: "c: down"}
    assert "error_details" not in steps[2]
    # As a process's step: the codes in `errors`' order (by name).
    assert list(steps[0]["error_details"]) == [late, down]


def test_wok_bench_merge_writes_the_merged_result_and_prints_the_table(split_ramp, tmp_path, capsys):
    _, parts = split_ramp
    paths = []
    for i, p in enumerate(parts):
        paths.append(tmp_path / f"part{i}.json")
        paths[-1].write_text(json.dumps(p))
    out = tmp_path / "merged.json"
    assert wok_main(["bench", "merge", *map(str, paths), "--json", str(out), "--csv", str(tmp_path / "m.csv")]) == 0
    merged = json.loads(out.read_text())
    expected = json.loads(report.to_json(merge_results(parts, [str(p) for p in paths])))
    assert merged == {**expected, "created": merged["created"]}
    printed = capsys.readouterr().out
    assert "merged from 3 results: percentiles from the merged histograms (at most 0.78% above exact)" in printed
    assert wok_main(["bench", "merge", str(tmp_path / "missing.json")]) == 2
    assert "missing.json" in capsys.readouterr().err


def test_a_merge_of_fault_runs_says_it_leaves_their_fault_sections_out_and_prints_the_balancers_counters(
    tmp_path, capsys
):
    """The merge dropped `faults` without a word: its P99 per window (and each fault's recovery, read off it)
    cannot be rebuilt from the parts'. One part's section is the whole run's, and kept."""
    stored = json.loads((ROOT / "docs" / "results" / "faults-server-wok-2026-11-29.json").read_text())
    # As runs with --admin-url against servers they shared: parts that started their own (--replicas) are
    # refused (test_parts_that_ran_their_own_replicas_are_refused).
    stored["faults"] = {k: v for k, v in stored["faults"].items() if k != "replicas"}
    paths = [tmp_path / "a.json", tmp_path / "b.json"]
    for seed, path in enumerate(paths, 1):
        path.write_text(json.dumps({**stored, "config": {**stored["config"], "seed": seed}}))
    out = tmp_path / "merged.json"
    assert wok_main(["bench", "merge", *map(str, paths), "--json", str(out)]) == 0
    merged = json.loads(out.read_text())
    assert "faults" not in merged and merged["balancer"]["calls"] == 2 * stored["balancer"]["calls"]
    said = f"{paths[0]}, {paths[1]}: the fault section (`faults`) is left out of the merged result"
    assert [w for w in merged["warnings"] if "section" in w] == [
        f"{said}: its P99 per window cannot be rebuilt from the parts' (each part's file keeps its own)"
    ]
    printed = capsys.readouterr().out
    assert f"warning: {said}" in printed
    # The balancer's counters, added up, after the steps (bench/report.py's print_replicas).
    assert re.search(r"│ 127\.0\.0\.1:44353 +│ 11434 +│ 11434 +│", printed)
    (one,) = paths[:1]
    assert wok_main(["bench", "merge", str(one), "--json", str(out)]) == 0
    merged = json.loads(out.read_text())
    assert merged["faults"] == stored["faults"] and not [w for w in merged["warnings"] if "section" in w]
    assert "requests: 13268 sent, 13238 ok, 30 errors, 0 lost" in capsys.readouterr().out


def test_the_merge_line_says_when_the_part_the_server_columns_come_from_has_none(split_ramp):
    # Parts whose ramps reached no /metrics (--metrics-url auto against a server on another port) printed
    # "server columns from a.json" under a table of `-`.
    _, parts = split_ramp
    printed = io.StringIO()
    report.print_table(merge_results(parts, ["a.json", "b.json", "c.json"]), file=printed)
    assert "no server columns: a.json, the part they come from, scraped none" in printed.getvalue()
    assert "server columns from" not in printed.getvalue()
    parts[0]["steps"][0]["server"] = {"requests": 1000}
    printed = io.StringIO()
    report.print_table(merge_results(parts, ["a.json", "b.json", "c.json"]), file=printed)
    assert "(at most 0.78% above exact), server columns from a.json" in printed.getvalue()


def test_a_file_that_is_not_a_result_is_refused_by_its_name(tmp_path, capsys):
    """A non-JSON file was told in json's words only ("Expecting value: line 1 column 1"), and a JSON
    array ended in a traceback (AttributeError)."""
    text, array = tmp_path / "notes.txt", tmp_path / "list.json"
    text.write_text("not json\n")
    array.write_text("[1, 2]\n")
    assert wok_main(["bench", "merge", str(text), str(text)]) == 2
    assert capsys.readouterr().err == (
        f"wok bench: {text}: not JSON (Expecting value: line 1 column 1 (char 0)); "
        "expected a wok bench ramp's --json file\n"
    )
    assert wok_main(["bench", "merge", str(array), str(array)]) == 2
    assert capsys.readouterr().err == f"wok bench: {array}: expected a wok.bench result, a JSON object; got an array\n"


def test_a_p99_whose_bucket_straddles_the_slo_is_warned_about():
    # 1,000 OK requests, the 990th at 49.9 ms: the exact P99 meets the 50 ms SLO, the merged
    # histogram's (its bucket's upper bound, 50.07 ms) misses it: the FAIL may be the bucket's.
    duration = 10.0
    intended = np.linspace(0, duration, 1000, endpoint=False)
    latency = np.array([10.0] * 985 + [49.9] * 10 + [100.0] * 5) / 1e3
    codes = np.array(["OK"] * 1000)
    part = _result([(intended, intended, intended + latency, codes)], [100.0], 0, duration)
    assert part["max_qps_under_slo"] == 100.0
    merged = merge_results([part], ["a.json"])
    assert merged["steps"][0]["latency_ms"]["p99"] > 50.0 and merged["max_qps_under_slo"] is None
    assert [w for w in merged["warnings"] if "may have met it" in w] == [
        "step 100 QPS: its P99 read off the merged histogram, 50.0695 ms, misses the SLO (50 ms), but the exact "
        "P99 of its requests lies between 49.8074 ms and that: the step may have met it"
    ]
    # A P99 clear of the SLO's bucket is not warned about.
    latency[985:995] = 60.0 / 1e3
    clear = _result([(intended, intended, intended + latency, codes)], [100.0], 0, duration)
    assert not [w for w in merge_results([clear])["warnings"] if "may have met it" in w]


def test_one_part_merges_into_itself(split_ramp):
    """One file is a job of one generator (docs/bench.md): its counts and percentiles, unchanged."""
    _, parts = split_ramp
    merged = merge_results(parts[:1], ["a.json"])
    for m, s in zip(merged["steps"], parts[0]["steps"]):
        assert (m["requests"], m["ok"], m["errors"]) == (s["requests"], s["ok"], s["errors"])
    assert not any("--seed" in w or "--start-at" in w for w in merged["warnings"])


# -- Little's law past the window's edges ---------------------------------------------------------------
def _stalled_at_the_end(rng, duration=1.5, warmup=0.5, qps=200.0, stall=0.05):
    """A step's requests (warm-up included, times from the warm-up's start) on a host that stalled
    in its window's last `stall` s: answers in 1 ms, those sent in the stall only `stall` s after
    the window's end. Every one is OK, and the step keeps pace with its offer."""
    start, end = warmup, warmup + duration
    intended = np.sort(rng.uniform(0.0, end, int(qps * end)))
    sent = intended + rng.exponential(0.0002, intended.size)
    done = sent + 0.001
    done[sent >= end - stall] = end + stall
    return sent, done, start, end


def _edged_result(sent, done, start, end, seed, nominal_qps):
    """A ramp of one step at `nominal_qps` as wok bench ramp measures it: Little's law with its edges, L exact."""
    from wok.bench.runner import _littles_law_edges

    keep = sent >= start
    # L exact: each call's time in flight inside the window, over its length (the runner's in-flight
    # count, with no sampling error), so λW − L is wholly the window's edges.
    inside = np.clip(np.minimum(done, end) - np.maximum(sent, start), 0.0, None)
    step = analysis.step_result(
        offered_qps=keep.sum() / (end - start),
        completed_ok=int(((done >= start) & (done < end)).sum()),
        duration_s=end - start,
        intended_s=sent[keep] - start,
        sent_s=sent[keep] - start,
        done_s=done[keep] - start,
        codes=np.full(keep.sum(), "OK"),
        inflight_samples=np.array([inside.sum() / (end - start)]),
    )
    step["littles_law"].update(_littles_law_edges(sent, done, keep, start, end))
    step["nominal_qps"] = nominal_qps
    config = {"source": "bench", "models": [["mlp", 1.0]], "step_duration_s": end - start, "seed": seed}
    return json.loads(report.to_json(analysis.ramp_result(steps=[step], slo_p99_ms=50.0, config=config)))


def _little_warnings(result) -> list[str]:
    """The Little's-law warnings of the result's own steps (not those its parts brought along)."""
    return [w for w in result["warnings"] if w.startswith("step ") and "Little's law" in w]


def test_merged_steps_add_the_window_edges_and_judge_what_they_leave_unexplained():
    # One stall at a short step's end makes λW twice L: all of the gap is the late edge. The whole
    # step does not warn; neither may its merge (which judged the whole error, its edges dropped).
    rng = np.random.default_rng(5)
    sent, done, start, end = _stalled_at_the_end(rng)
    whole = _edged_result(sent, done, start, end, 0, 200.0)
    owner = rng.integers(0, 2, sent.size)
    parts = [_edged_result(sent[owner == i], done[owner == i], start, end, i + 1, 100.0) for i in range(2)]
    w = whole["steps"][0]
    assert w["littles_law"]["relative_error"] > 0.9 and w["littles_law"]["early_edge"] > 0
    assert abs(analysis._unexplained(w["littles_law"])) < 1e-9
    assert 0.95 * w["offered_qps"] <= w["achieved_qps"] <= w["offered_qps"]  # steady: the law is checked
    assert _little_warnings(whole) == []

    merged = merge_results(parts)
    assert _little_warnings(merged) == []
    m = merged["steps"][0]
    for key in ("mean_inflight_measured", "lambda_w", "relative_error", "late_edge", "early_edge"):
        assert m["littles_law"][key] == pytest.approx(w["littles_law"][key], rel=1e-9), key

    # A gap beyond the edges (one part's count half short: a third of the merged L) still warns.
    parts[0]["steps"][0]["littles_law"]["mean_inflight_measured"] *= 0.5
    (warning,) = _little_warnings(merge_results(parts))
    assert warning.endswith("the client's clocks or counters are suspect")


def test_a_part_without_the_window_edges_leaves_the_merged_step_judged_on_the_whole_error():
    rng = np.random.default_rng(5)
    sent, done, start, end = _stalled_at_the_end(rng)
    owner = rng.integers(0, 2, sent.size)
    parts = [_edged_result(sent[owner == i], done[owner == i], start, end, i + 1, 100.0) for i in range(2)]
    for key in ("late_edge", "early_edge"):
        del parts[1]["steps"][0]["littles_law"][key]  # written before the edges were
    merged = merge_results(parts)
    little = merged["steps"][0]["littles_law"]
    # Half the edges would explain half the error away: none are kept, and all of it is judged.
    assert "late_edge" not in little and "early_edge" not in little
    (warning,) = _little_warnings(merged)
    assert f"by {100 * little['relative_error']:+.0f}%" in warning


# -- a real run: two processes at half the rate, merged, against one process ------------------------------
def _ramp(target, steps, seed, workers, out):
    cmd = [sys.executable, "-m", "wok", "bench", "ramp", "--target", target, "--model", "mlp", "--steps", steps,
           "--step-duration", "0.5s", "--warmup", "0.25s", "--arrival", "constant", "--workers", str(workers),
           "--metrics-url", "none", "--seed", str(seed), "--json", str(out)]  # fmt: skip
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def test_two_processes_at_half_the_rate_merge_into_the_counts_of_one_process(bench_server, tmp_path):
    # All three at once (their imports are most of their time): constant arrivals make each one's
    # counts exact whatever else the server serves, and 160 QPS in all is far below its capacity.
    halves = [_ramp(bench_server.target, "20,40", seed, 1, tmp_path / f"half{seed}.json") for seed in (1, 2)]
    one = _ramp(bench_server.target, "40,80", 3, 2, tmp_path / "one.json")
    for p in [*halves, one]:
        assert p.wait(timeout=300) == 0, p.stderr.read()
    parts = [json.loads((tmp_path / f"half{seed}.json").read_text()) for seed in (1, 2)]
    single = json.loads((tmp_path / "one.json").read_text())
    out = tmp_path / "merged.json"
    assert wok_main(["bench", "merge", str(tmp_path / "half1.json"), str(tmp_path / "half2.json"),
                     "--json", str(out)]) == 0  # fmt: skip
    merged = json.loads(out.read_text())
    assert [s["nominal_qps"] for s in merged["steps"]] == [40.0, 80.0]
    for m, s, *halves_steps in zip(merged["steps"], single["steps"], *(p["steps"] for p in parts)):
        # Constant arrivals: 0.5 s at 40 QPS is 20 requests, at 20 QPS twice 10 (the warm-up's end and
        # the step's are whole multiples of every send interval, 1/80 s included: exact in binary).
        assert m["requests"] == s["requests"] == 2 * 0.5 * m["nominal_qps"] / 2
        assert m["ok"] == s["ok"] == m["requests"]
        assert m["offered_qps"] == pytest.approx(s["offered_qps"])
        for h in halves_steps:
            # Each part's histogram percentiles agree with its exact ones within the relative error.
            approx = LatencyHistogram.from_dict(h["latency_histogram"]).summary()
            for k in ("p50", "p99", "max"):
                assert h["latency_ms"][k] - 1e-6 <= approx[k] <= h["latency_ms"][k] * (1 + ERR)
        for k in ("p50", "p90", "p99"):
            # A quantile of the union lies between the parts' quantiles (here read from the histogram).
            lo = min(h["latency_ms"][k] for h in halves_steps)
            hi = max(h["latency_ms"][k] for h in halves_steps)
            assert lo - 1e-6 <= m["latency_ms"][k] <= hi * (1 + ERR), (k, lo, m["latency_ms"][k], hi)
        assert m["latency_ms"]["max"] == pytest.approx(max(h["latency_ms"]["max"] for h in halves_steps), abs=1e-6)


# -- the server-timing split ----------------------------------------------------------------------------
def _timing_part(rng, n: int) -> tuple[np.ndarray, np.ndarray]:
    """n requests' client latencies and server-timing rows, made up but consistent."""
    from wok.servertiming import TIMING_PARTS

    rows = np.zeros((n, len(TIMING_PARTS)))
    col = {name: k for k, name in enumerate(TIMING_PARTS)}
    rows[:, col["queue"]] = rng.uniform(0.0, 5.0, n)
    rows[:, col["compute"]] = rng.uniform(0.2, 2.0, n)
    rows[:, col["batch"]] = rows[:, col["compute"]] + rng.uniform(0.05, 0.5, n)
    rows[:, col["total"]] = rows[:, col["queue"]] + rows[:, col["batch"]]
    latency = rows[:, col["total"]] + rng.lognormal(0.0, 0.5, n)  # the time outside the server
    return latency, rows


def test_merged_server_timing_has_the_wholes_counts_histograms_and_means(split_ramp):
    from wok.bench.merge import merge_server_timing, merge_steps

    rng = np.random.default_rng(5)
    data = [_timing_part(rng, n) for n in (400, 250, 0)]  # the last part had no trailer at all
    parts = [analysis.server_timing_summary(lat, rows) for lat, rows in data]
    whole = analysis.server_timing_summary(np.concatenate([d[0] for d in data]), np.vstack([d[1] for d in data]))
    m = merge_server_timing(parts)
    assert m["requests"] == whole["requests"] == 650 and m["missing"] == 0 and m["merged"] is True
    for key in ("outside_histogram", "compute_histogram", "batch_histogram"):
        assert m[key] == whole[key], key  # summed histograms are the whole's, bucket by bucket
    for stage, figures in whole["stages_ms"].items():
        assert m["stages_ms"][stage]["mean"] == pytest.approx(figures["mean"], rel=1e-12), stage
        assert np.isnan(m["stages_ms"][stage]["p99"])  # percentiles do not add up from parts
    assert m["outside_ms"]["mean"] == pytest.approx(whole["outside_ms"]["mean"], rel=1e-12)
    # The outside percentiles come from the summed histogram: within its error of the exact ones.
    assert whole["outside_ms"]["p99"] <= m["outside_ms"]["p99"] <= whole["outside_ms"]["p99"] * (1 + ERR)
    assert m["tail"] is None
    # Through merge_steps: carried when every part has it, left out when one does not.
    _, result_parts = split_ramp
    steps = [dict(r["steps"][0]) for r in result_parts]
    for step, t in zip(steps, parts):
        step["server_timing"] = t
    assert merge_steps(steps)["server_timing"]["requests"] == 650
    del steps[1]["server_timing"]
    assert "server_timing" not in merge_steps(steps)


def _with_server_timing(results: list[dict], summary) -> None:
    """Give every step of `results` a `server_timing` of its own, `summary()`."""
    for r in results:
        for step in r["steps"]:
            step["server_timing"] = summary()


def test_a_merged_result_draws_its_breakdown_without_a_tail(split_ramp):
    rng = np.random.default_rng(6)
    _, result_parts = split_ramp
    _with_server_timing(result_parts, lambda: analysis.server_timing_summary(*_timing_part(rng, 50)))
    merged = merge_results(result_parts)
    assert all(s["server_timing"]["tail"] is None for s in merged["steps"])
    fig = report.breakdown_figure(merged)
    assert len(fig.axes) == 2  # the mean request's stacks, and a tail panel that says why it is empty
    assert len(fig.axes[0].patches) > 0
    assert not fig.axes[1].patches and "not in this result" in fig.axes[1].texts[0].get_text()


# -- what later additions carry: per-batch compute, request sizes, payloads -------------------------------
def _batched_timing(rng, batches: int, owner_of) -> list[tuple[np.ndarray, np.ndarray]]:
    """Three parts' client latencies and server-timing rows (with each batch's size) from `batches`
    batches of 1-8 requests, each request sent by the part `owner_of(batch, request)` gives."""
    from wok.servertiming import TIMING_COLUMNS

    col = {name: k for k, name in enumerate(TIMING_COLUMNS)}
    rows = [[], [], []]
    for b in range(batches):
        n = int(rng.integers(1, 9))
        compute = round(float(rng.uniform(0.2, 2.0)), 3)  # the trailer's µs: one value per batch
        for r in range(n):
            row = np.zeros(len(TIMING_COLUMNS))
            row[col["compute"]], row[col["batch_requests"]] = compute, n
            row[col["batch"]] = compute + 0.1
            row[col["total"]] = row[col["batch"]] + rng.uniform(0.0, 3.0)
            rows[owner_of(b, r)].append(row)
    out = []
    for part in rows:
        st = np.array(part).reshape(-1, len(TIMING_COLUMNS))
        out.append((st[:, col["total"]] + rng.lognormal(0.0, 0.5, len(st)), st))
    return out


def test_merged_server_timing_keeps_the_per_batch_compute_histogram():
    from wok.bench.merge import merge_server_timing

    rng = np.random.default_rng(21)
    # Each batch's requests all came from one part (the first 120 batches from parts 0 and 1, none from 2):
    # the parts' batches add up to the whole's, batch by batch.
    data = _batched_timing(rng, 200, lambda b, r: b % 2 if b < 120 else 1)
    parts = [analysis.server_timing_summary(lat, rows) for lat, rows in data]
    assert "compute_batch_histogram" not in parts[2]  # no requests, so no batches: it adds nothing
    whole = analysis.server_timing_summary(np.concatenate([d[0] for d in data]), np.vstack([d[1] for d in data]))
    m = merge_server_timing(parts)
    assert m["compute_batch_histogram"] == whole["compute_batch_histogram"]
    assert m["compute_batch_histogram"]["count"] == 200
    assert list(m) == [*whole, "merged"]  # in a process's order, every field kept
    # A batch whose requests several parts sent is counted once too (its parts' partial_batches).
    split = _batched_timing(np.random.default_rng(21), 200, lambda b, r: r % 2)
    m = merge_server_timing([analysis.server_timing_summary(lat, rows) for lat, rows in split])
    assert m["compute_batch_histogram"]["count"] == 200
    # A part with requests but no batch sizes (a server whose trailer lacks them): left out, not a partial sum.
    del parts[0]["compute_batch_histogram"]
    assert "compute_batch_histogram" not in merge_server_timing(parts)


def _cut(data: list[tuple[np.ndarray, np.ndarray]], rng, share: float) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each part's requests less about `share` of them, drawn at random: what a step's window leaves out of
    the batches it cuts (requests answered in the warm-up, or failed)."""
    out = []
    for lat, rows in data:
        keep = rng.random(len(lat)) >= share
        out.append((lat[keep], rows[keep]))
    return out


def _written(summary: dict) -> dict:
    """A `server_timing` as a result file holds it (JSON text read back)."""
    return json.loads(report.to_json(summary))


@pytest.mark.parametrize("owner", ["alternate", "random"])
def test_merged_per_batch_compute_counts_each_batch_once_whichever_parts_sent_its_requests(owner):
    from wok.bench.merge import merge_server_timing

    rng = np.random.default_rng(23)
    # Every batch's requests shared out between parts (two of three, or all three at random), and some
    # of each part's cut by its window: a part sees only some requests of most batches.
    pick = {"alternate": lambda b, r: r % 2, "random": lambda b, r: int(rng.integers(0, 3))}[owner]
    data = _cut(_batched_timing(rng, 300, pick), rng, 0.1)
    parts = [_written(analysis.server_timing_summary(lat, rows)) for lat, rows in data]
    whole = _written(
        analysis.server_timing_summary(np.concatenate([d[0] for d in data]), np.vstack([d[1] for d in data]))
    )
    seen = sum(p["compute_batch_histogram"]["count"] for p in parts if "compute_batch_histogram" in p)
    assert seen > whole["compute_batch_histogram"]["count"]  # the parts' own counts overlap
    m = _written(merge_server_timing(parts))
    # What one process that sent every request would have written: each batch once, a cut one too.
    assert m["compute_batch_histogram"] == whole["compute_batch_histogram"]
    assert m["partial_batches"] == whole["partial_batches"]
    assert list(m) == [*whole, "merged"]
    # A merged split merges again: the first two parts' merge with the third is the whole's.
    again = merge_server_timing([_written(merge_server_timing(parts[:2])), parts[2]])
    assert _written(again)["compute_batch_histogram"] == whole["compute_batch_histogram"]


def test_parts_without_partial_batches_merge_to_the_sum_and_bad_ones_are_refused():
    from wok.bench.merge import merge_server_timing

    data = _batched_timing(np.random.default_rng(24), 100, lambda b, r: r % 2)
    parts = [_written(analysis.server_timing_summary(lat, rows)) for lat, rows in data]
    # A part written before partial_batches: each part's count of the batches it saw, summed, as before
    # (an upper bound); the merged split says so by having no partial_batches.
    old = [dict(p) for p in parts]
    del old[1]["partial_batches"]
    m = merge_server_timing(old)
    assert (
        m["compute_batch_histogram"]["count"]
        == parts[0]["compute_batch_histogram"]["count"] + (parts[1]["compute_batch_histogram"]["count"])
    )
    assert "partial_batches" not in m
    # An entry for a batch its own histogram does not hold, or lists of other lengths: refused, named.
    bad = [dict(p) for p in parts]
    bad[1]["partial_batches"] = dict(
        bad[1]["partial_batches"], compute_ms=[1e6] * len(bad[1]["partial_batches"]["compute_ms"])
    )
    with pytest.raises(ValueError, match=r"step 3: server_timing\.partial_batches of b\.json: .*1e\+06 ms"):
        merge_server_timing(bad, "step 3", ["a.json", "b.json", "c.json"])
    bad[1]["partial_batches"] = dict(parts[1]["partial_batches"], requests=[1])
    with pytest.raises(ValueError, match=r"step 3: server_timing\.partial_batches of b\.json: expected lists .* one "):
        merge_server_timing(bad, "step 3", ["a.json", "b.json", "c.json"])
    listed = parts[1]["partial_batches"]
    size = listed["batch_requests"][0]  # a whole batch's requests are no partial one's
    bad[1]["partial_batches"] = dict(listed, requests=[size] * len(listed["requests"]))
    with pytest.raises(ValueError, match=rf"b\.json: expected each entry .*batch_requests {size}, requests {size}"):
        merge_server_timing(bad, "step 3", ["a.json", "b.json", "c.json"])


def test_a_partial_batch_entry_is_refused_in_the_files_words():
    """An entry of a part's partial_batches that is no batch was shown as Python writes it (`nan`, `None`, a dict's
    quotes): now in the file's words (errors.shown_data), as every other refusal of a file's value. A value that is
    no JSON number of its kind (true, a string's digits, 2.5 requests) was read as one and merged."""
    from wok.bench.merge import merge_server_timing

    data = _batched_timing(np.random.default_rng(24), 100, lambda b, r: r % 2)
    parts = [_written(analysis.server_timing_summary(lat, rows)) for lat, rows in data]
    listed = parts[1]["partial_batches"]
    assert len(listed["compute_ms"]) >= 1, listed
    for x, n, r, said in [
        (float("nan"), 4, 1, "compute_ms NaN, batch_requests 4, requests 1"),
        (1.0, None, 1, "compute_ms 1.0, batch_requests null, requests 1"),
        # Read as numbers (true as 1, a string's digits, 2.5 as 2) and merged.
        (1.0, 4, True, "compute_ms 1.0, batch_requests 4, requests true"),
        ("2", 4, 1, "compute_ms '2', batch_requests 4, requests 1"),
        (1.0, 4, 2.5, "compute_ms 1.0, batch_requests 4, requests 2.5"),
        (10**400, 4, 1, "compute_ms an integer of 401 digits, batch_requests 4, requests 1"),
    ]:
        bad = [dict(p) for p in parts]
        bad[1]["partial_batches"] = {"compute_ms": [x], "batch_requests": [n], "requests": [r]}
        with pytest.raises(ValueError) as refused:
            merge_server_timing(bad, "step 3", ["a.json", "b.json", "c.json"])
        assert str(refused.value).endswith(f"; got {said}"), str(refused.value)
    bad = [dict(p) for p in parts]
    bad[1]["partial_batches"] = {"compute_ms": [1.0], "batch_requests": None, "requests": "x"}
    with pytest.raises(ValueError) as refused:
        merge_server_timing(bad, "step 3", ["a.json", "b.json", "c.json"])
    assert str(refused.value) == (
        "step 3: server_timing.partial_batches of b.json: expected lists compute_ms, batch_requests, requests of one "
        'length; got {"compute_ms": 1, "batch_requests": null, "requests": "x"} (lists as their lengths)'
    )


def test_histograms_of_other_layouts_are_refused_naming_the_field_and_the_files(split_ramp):
    rng = np.random.default_rng(22)
    _, parts = split_ramp
    _with_server_timing(parts, lambda: analysis.server_timing_summary(*_batched_timing(rng, 30, lambda b, i: 0)[0]))
    coarse = LatencyHistogram.from_ms([1.0], sub_bucket_bits=5)
    parts[1]["steps"][1]["server_timing"]["compute_batch_histogram"] = coarse.to_dict()
    with pytest.raises(ValueError) as err:
        merge_results(parts, ["a.json", "b.json", "c.json"])
    message = str(err.value)
    assert "step 2: server_timing.compute_batch_histogram" in message
    assert "a.json: 7, b.json: 5, c.json: 7" in message
    parts[1]["steps"][1]["latency_histogram"]["sub_bucket_bits"] = 5
    with pytest.raises(ValueError, match=r"step 2: latency_histogram: .*a\.json: 7, b\.json: 5"):
        merge_results(parts, ["a.json", "b.json", "c.json"])


def _with_sizes(result: dict, sizes_per_step: list[np.ndarray]) -> dict:
    for step, sizes in zip(result["steps"], sizes_per_step):
        step["request_sizes"] = analysis.request_size_summary(sizes)
    result["config"]["sizes"] = "lognormal:median=20,sigma=0.8,max=256"
    result["payloads"] = [{"model": "mlp", "pool": "per_size", "payloads": 1024, "distinct_sizes": 256}]
    return result


def test_merged_request_sizes_are_exactly_the_wholes(split_ramp):
    rng = np.random.default_rng(23)
    whole, parts = split_ramp
    sizes = [np.clip(np.round(20 * rng.lognormal(0, 0.8, 3000)), 1, 256).astype(int) for _ in whole["steps"]]
    sizes[2][:] = 7  # one size only
    owners = [rng.integers(0, 3, len(s)) for s in sizes]
    owners[1][:] = 0  # a part that sent no sized request in a step
    parts = [_with_sizes(r, [s[o == i] for s, o in zip(sizes, owners)]) for i, r in enumerate(parts)]
    merged = merge_results(parts)
    for step, s in zip(merged["steps"], sizes):
        assert step["request_sizes"] == analysis.request_size_summary(s)
    assert merged["steps"][0]["request_sizes"]["p999"] == int(np.quantile(sizes[0], 0.999, method="inverted_cdf"))
    assert merged["payloads"] == parts[0]["payloads"]
    # Parts written before the sizes' counts were kept: count, mean and maximum; no quantile.
    for r in parts:
        for step in r["steps"]:
            del step["request_sizes"]["sizes"], step["request_sizes"]["counts"]
    step = merge_results(parts)["steps"][0]["request_sizes"]
    assert step["requests"] == len(sizes[0]) and step["max"] == sizes[0].max()
    assert step["mean"] == pytest.approx(sizes[0].mean(), rel=1e-12)
    assert step["p50"] is None and step["p999"] is None


def test_parts_that_sent_other_requests_do_not_merge_and_other_pools_are_kept_by_part(split_ramp):
    _, parts = split_ramp
    parts = [_with_sizes(r, [np.arange(1, 50)] * 3) for r in parts]
    for key, value, what in (("sizes", "fixed:16", "--sizes"), ("rows", 4, "--rows"), ("int_high", 9, "--int-high")):
        other = [json.loads(json.dumps(r)) for r in parts]
        other[2]["config"][key] = value
        with pytest.raises(ValueError, match=rf"differ in .*\({what}\) .*c\.json: {value}"):
            merge_results(other, ["a.json", "b.json", "c.json"])
    # Ids drawn below a bound one part's server published (absent in files written before it: none).
    other = [json.loads(json.dumps(r)) for r in parts]
    other[0]["config"]["int_high_published"] = {"mlp": {}}
    other[2]["config"]["int_high_published"] = {"mlp": {"ids": 10}}
    with pytest.raises(ValueError, match=r"differ in .*\(int_high_published\) .*c\.json: \{'mlp': \{'ids': 10\}\}"):
        merge_results(other, ["a.json", "b.json", "c.json"])
    # A model with no bound published ({}) drew as a part written before the key did: below int_high.
    other[2]["config"]["int_high_published"] = {"mlp": {}}
    merge_results(other, ["a.json", "b.json", "c.json"])
    parts[1]["payloads"] = [{"model": "mlp", "pool": "draws", "payloads": 300, "distinct_sizes": 40}]
    merged = merge_results(parts, ["a.json", "b.json", "c.json"])
    assert "payloads" not in merged
    assert merged["payloads_by_part"] == {n: r["payloads"] for n, r in zip(["a.json", "b.json", "c.json"], parts)}
    for r in parts:
        r["balancer"] = None  # as a ramp with the grpc balancer writes it
    assert merge_results(parts)["balancer"] is None


def test_a_part_cut_in_its_ramp_makes_the_merged_ramp_cut_and_one_cut_elsewhere_does_not(split_ramp):
    # A merged result had no `interrupted`: a part cut short (fewer steps) capped the merged verdicts at
    # the last step it reached, and bench/compare.py, which leaves cut ramps out, could not tell.
    _, parts = split_ramp
    assert merge_results(parts)["interrupted"] is None  # present, as in one process's result
    del parts[1]["steps"][2]
    parts[1]["interrupted"] = {
        "reason": "ramp ended early at 200 QPS: KeyboardInterrupt: SIGINT",
        "by_signal": True,
        "phase": "ramp",
    }
    for r in parts:
        r["config"]["steps"] = [150.0, 300.0, 600.0]
        # Their requests fail 4 % of the time, and take 118 ms at P99 (lognormal(−4, 0.8) s).
        r["min_success_rate"], r["slo_p99_ms"] = 0.9, 500.0
    merged = merge_results(parts, ["a.json", "b.json", "c.json"])
    assert len(merged["steps"]) == 2
    # Both steps met the SLO: "add higher steps" was said, though the third was planned and b.json cut in it.
    assert merged["max_qps_under_slo"] == 300
    assert not any("add higher steps" in w for w in merged["warnings"])
    assert any(w.startswith("the ramp was cut in its 600 QPS step") for w in merged["warnings"])
    assert merged["interrupted"] == {
        "reason": "b.json: ramp ended early at 200 QPS: KeyboardInterrupt: SIGINT",
        "by_signal": True,
        "phase": "ramp",
    }
    # Cut in a refinement or a soak (whose steps are not merged): the merged ramp is whole. Files written
    # before `phase` say where in their reason.
    for cut in (
        {"reason": "refinement ended early at 250 QPS: RuntimeError: x", "by_signal": False, "phase": "refine"},
        {"reason": "refinement ended early at 250 QPS: RuntimeError: x", "by_signal": False},
        {"reason": "soak ended early: KeyboardInterrupt: SIGINT", "by_signal": True, "phase": "soak"},
    ):
        parts[1]["interrupted"] = cut
        assert merge_results(parts)["interrupted"] is None, cut
    parts[1]["interrupted"] = {"reason": "ramp ended early at 200 QPS: OSError: gone", "by_signal": False}
    assert merge_results(parts)["interrupted"]["reason"] == "part 1: ramp ended early at 200 QPS: OSError: gone"


def test_parts_whose_windows_or_successes_are_defined_otherwise_do_not_merge(split_ramp):
    # They merged: another warm-up opens the window elsewhere, another timeout counts other requests
    # as failed, another RPC measures another path, and with one --start-at another gap moves step 2 on.
    _, parts = split_ramp
    for r in parts:
        r["config"] |= {"warmup_s": 1.0, "timeout_s": 30.0, "rpc": "unary", "streams": 4, "step_gap_s": 2.0}
    merge_results(parts)
    cases = (
        (
            {"warmup_s": 0.5},
            r"the warm-up before each window \(--warmup\) \(a\.json: 1\.0, b\.json: 1\.0, c\.json: 0\.5\)",
        ),
        ({"timeout_s": 5.0}, r"the request timeout \(--timeout\) .*c\.json: 5\.0"),
        ({"rpc": "stream"}, r"the RPC \(--rpc, --streams\) .*c\.json: \('stream', 4\)"),
    )
    for change, message in cases:
        other = [json.loads(json.dumps(r)) for r in parts]
        other[2]["config"] |= change
        with pytest.raises(ValueError, match=message):
            merge_results(other, ["a.json", "b.json", "c.json"])
    # The merged config names one arrival process: the first part's would label the others' load.
    for r in parts:
        r["config"]["arrival"] = "burst:amplitude=4x,t0=50%"
    other = [json.loads(json.dumps(r)) for r in parts]
    other[2]["config"]["arrival"] = "poisson"
    with pytest.raises(ValueError, match=r"the arrival process \(--arrival\) .*c\.json: poisson"):
        merge_results(other, ["a.json", "b.json", "c.json"])
    other[2]["config"]["arrival"] = "Burst: amplitude=4x, t0=50%"  # as the parser reads it: the same process
    merge_results(other)
    # A unary part's --streams, and the gap without a shared --start-at, change nothing that is merged.
    other = [json.loads(json.dumps(r)) for r in parts]
    other[2]["config"] |= {"streams": 8, "step_gap_s": 5.0}
    merge_results(other)
    for r in other:
        r["config"]["start_at"] = 1e9
    with pytest.raises(ValueError, match=r"the gap between steps \(--step-gap\) .*c\.json: 5\.0"):
        merge_results(other, ["a.json", "b.json", "c.json"])


def test_a_part_without_server_timing_is_said_to_leave_the_split_out(split_ramp):
    # The merged steps' server_timing needs every part's: it was left out without a word.
    _, parts = split_ramp
    for r in parts:
        r["config"]["server_timing"] = True
    parts[1]["config"]["server_timing"] = False
    merged = merge_results(parts, ["a.json", "b.json", "c.json"])
    said = [w for w in merged["warnings"] if "--server-timing" in w]
    assert said == [
        "b.json ran without --server-timing: the merged steps carry no server_timing split (it needs every part's)"
    ], merged["warnings"]
    for r in parts:
        r["config"]["server_timing"] = False
    assert not [w for w in merge_results(parts)["warnings"] if "--server-timing" in w]


def test_the_models_devices_are_the_first_parts_as_the_servers_view_is(split_ramp):
    """Every part ramped the same server: what it runs the models on (`devices`, which `wok plan
    --from-ramp` counts CPUs or GPUs by) is kept, from the part whose server view the merge keeps."""
    _, parts = split_ramp
    assert "devices" not in merge_results(parts)  # parts written before it: none
    for r in parts:
        r["devices"] = {"mlp": "cpu"}
    parts[1]["devices"] = {"mlp": None}  # its ModelConfig unanswered
    assert merge_results(parts)["devices"] == {"mlp": "cpu"}


def test_a_merge_of_one_fault_run_plots_its_faults_as_the_ramp_does(tmp_path, capsys):
    """`wok bench merge` of one fault run kept its `faults` section but --plot left out faults.png, which
    `wok bench ramp --plot` writes for the same result: one list of outputs now serves both."""
    stored = ROOT / "docs" / "results" / "faults-kill-wok-2026-11-29.json"
    folder = tmp_path / "plots"
    assert wok_main(["bench", "merge", str(stored), "--plot", str(folder)]) == 0
    written = sorted(p.name for p in folder.iterdir())
    assert written == ["faults.png", "latency_vs_offered.png", "throughput.png", "timeline.png"]
    assert (folder / "faults.png").read_bytes().startswith(b"\x89PNG")
    # Said once, as for any output: the fault plot is one of --plot's files, not an output of its own.
    assert capsys.readouterr().err.count(f"wrote {folder} (--plot)") == 1


def test_parts_that_ran_their_own_replicas_are_refused(tmp_path, capsys):
    """Two `--replicas` runs merged with the fault section's warning alone: each ramped the servers it started,
    so the sum read two fleets, each at its share of the rate, as one server at the whole rate (its capacity
    theirs together), beside the first fleet's server columns. One such run still merges (a job of one)."""
    stored = json.loads((ROOT / "docs" / "results" / "faults-kill-wok-2026-11-29.json").read_text())
    shared = {**stored, "faults": {k: v for k, v in stored["faults"].items() if k != "replicas"}}
    parts = [
        {**stored, "config": {**stored["config"], "seed": 1}},
        {**shared, "config": {**shared["config"], "seed": 2}},
    ]
    with pytest.raises(ValueError) as refused:
        merge_results(parts, ["a.json", "b.json"])
    assert str(refused.value) == (
        "a.json (3 replicas): each started the servers it ramped (--replicas: `replicas`), which no other "
        "part loaded: the merged steps would add up the loads of several fleets as one server's, with the server "
        "columns of the first part's alone; only parts that ramped the same servers (one --target for every part) "
        "merge, and a --replicas run alone"
    )
    paths = [tmp_path / "a.json", tmp_path / "b.json"]
    for seed, path in enumerate(paths, 1):
        path.write_text(json.dumps({**stored, "config": {**stored["config"], "seed": seed}}))
    assert wok_main(["bench", "merge", *map(str, paths), "--json", str(tmp_path / "m.json")]) == 2
    assert f"{paths[0]} (3 replicas), {paths[1]} (3 replicas): each started" in capsys.readouterr().err
    assert not (tmp_path / "m.json").exists()
    assert merge_results(parts[:1], ["a.json"])["faults"] == stored["faults"]
