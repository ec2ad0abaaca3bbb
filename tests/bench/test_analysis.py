"""The bench's arithmetic on hand-made arrays whose answers are known exactly."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from wok.bench import analysis
from wok.bench.analysis import (
    LATENCY_KEYS,
    bisect_max_qps,
    check_precision,
    find_knee,
    latency_summary,
    max_qps_under_slo,
    ramp_result,
    refine_points,
    step_result,
    stop_rule,
)

# ---------------------------------------------------------------------------- latency_summary


def test_nearest_rank_percentiles_of_1_to_100():
    # Shuffled, so that the function has to sort. With n = 100 the p-th percentile is the
    # ceil(p·100)-th smallest: p50 → 50, p90 → 90, p99 → 99, p999 → ceil(99.9) = 100.
    ms = np.random.default_rng(0).permutation(np.arange(1.0, 101.0))
    s = latency_summary(ms)
    assert tuple(s) == LATENCY_KEYS
    assert s == {"mean": 50.5, "p50": 50.0, "p90": 90.0, "p95": 95.0, "p99": 99.0, "p999": 100.0, "max": 100.0}


def test_nearest_rank_at_1000_samples_has_no_float_rounding():
    # 0.999 * 1000 is 999.0000000000001 in floats; a float ceil would give the 1000th value.
    s = latency_summary(np.arange(1.0, 1001.0))
    assert s["p999"] == 999.0 and s["p99"] == 990.0 and s["max"] == 1000.0


def test_percentiles_of_few_samples_are_observed_values():
    # n = 3: p50 → ceil(1.5) = 2nd, p90 → ceil(2.7) = 3rd; nothing interpolated.
    s = latency_summary(np.array([30.0, 10.0, 20.0]))
    assert (s["p50"], s["p90"], s["p99"], s["max"]) == (20.0, 30.0, 30.0, 30.0)
    assert s["mean"] == 20.0
    one = latency_summary(np.array([7.0]))
    assert all(one[k] == 7.0 for k in LATENCY_KEYS)


def test_empty_and_non_finite_samples():
    assert all(math.isnan(v) for v in latency_summary(np.array([])).values())
    s = latency_summary(np.array([np.nan, 5.0, np.inf, 1.0]))
    assert s["max"] == 5.0 and s["mean"] == 3.0


# ---------------------------------------------------------------------------- step_result


def schedule(qps: float, duration: float) -> np.ndarray:
    return np.arange(0.0, duration, 1.0 / qps)


def test_latency_runs_from_the_intended_time_so_a_late_send_counts_in_full():
    intended = np.array([0.0, 0.1, 0.2, 0.3])
    sent = intended + np.array([0.0, 0.0, 0.050, 0.0002])  # the third left 50 ms late
    done = sent + 0.010  # every request took 10 ms on the wire
    step = step_result(
        offered_qps=4, duration_s=1.0, intended_s=intended, sent_s=sent, done_s=done, codes=np.array(["OK"] * 4)
    )
    lat = step["latency_ms"]
    assert lat["max"] == pytest.approx(60.0)  # 50 ms late + 10 ms: the delay is not hidden
    assert lat["p50"] == pytest.approx(10.0)
    assert lat["mean"] == pytest.approx((10 + 10 + 60 + 10.2) / 4)
    lag = step["dispatch_lag_ms"]
    assert lag["max"] == pytest.approx(50.0)
    assert lag["p50"] == pytest.approx(0.0)  # nearest rank: 2nd of [0, 0, 0.2, 50]
    assert lag["p99"] == pytest.approx(50.0)
    assert step["late_sends"] == 1  # 0.2 ms is on time, 50 ms is late
    assert step["achieved_qps"] == 4.0 and step["success_rate"] == 1.0 and step["errors"] == {}
    assert step["phase"] == "ramp"
    assert "late_sends_own" not in step  # no run-queue waits given


def test_a_send_is_late_on_its_own_by_its_lag_less_the_hosts_run_queue_wait():
    intended = np.array([0.0, 0.1, 0.2, 0.3])
    sent = intended + np.array([0.004, 0.004, 0.0002, 0.030])

    def step(host):
        return step_result(
            offered_qps=4,
            duration_s=1.0,
            intended_s=intended,
            sent_s=sent,
            done_s=sent + 0.01,
            codes=np.array(["OK"] * 4),
            host_lag_s=np.array(host),
        )

    # The host's share of the first is 3.5 ms (0.5 ms its own), of the second 2 ms (2 ms its own),
    # of the fourth 30 ms: a stall of the host.
    s = step([0.0035, 0.002, 0.0, 0.030])
    assert (s["late_sends"], s["late_sends_own"]) == (3, 1)
    # A wait the kernel did not report (NaN) leaves the figure out rather than guess it.
    assert "late_sends_own" not in step([0.0035, np.nan, 0.0, 0.030])


def test_errors_are_counted_by_code_and_left_out_of_latency():
    intended = schedule(10, 1.0)  # 10 requests
    codes = np.array(["OK"] * 6 + ["UNAVAILABLE"] * 3 + ["DEADLINE_EXCEEDED"])
    done = intended + 0.005
    done[6:9] = intended[6:9] + 0.0001  # fast refusals must not pull the latency down
    done[9] = np.nan  # never answered
    step = step_result(offered_qps=10, duration_s=1.0, intended_s=intended, sent_s=intended, done_s=done, codes=codes)
    assert step["requests"] == 10 and step["ok"] == 6
    assert step["errors"] == {"DEADLINE_EXCEEDED": 1, "UNAVAILABLE": 3}
    assert list(step["errors"]) == sorted(step["errors"])
    assert step["success_rate"] == 0.6
    assert step["achieved_qps"] == 6.0  # successful completions only
    assert step["latency_ms"]["p50"] == pytest.approx(5.0) and step["latency_ms"]["max"] == pytest.approx(5.0)


def test_requests_never_sent_are_neither_requests_nor_errors_and_are_counted_apart():
    # A cut step's codes as the runner names them (runner.status_name of workers.NOT_SENT): 2 answered
    # OK, 1 refused, 2 never sent (sent and done NaN). The two were no part of the load: they read as
    # 2 errors "NOT_SENT" and a success rate of 40 % before.
    from wok.bench.runner import status_name
    from wok.bench.workers import NOT_SENT

    intended = np.array([0.1, 0.2, 0.3, 0.4, 0.5])
    sent = np.array([0.1, 0.2, 0.3, np.nan, np.nan])
    done = sent + 0.01
    codes = np.array(["OK", "OK", "UNAVAILABLE", status_name(NOT_SENT), status_name(NOT_SENT)])
    timing = np.full((5, len(analysis.TIMING_COLUMNS)), np.nan)
    step = step_result(
        offered_qps=5,
        duration_s=1.0,
        intended_s=intended,
        sent_s=sent,
        done_s=done,
        codes=codes,
        host_lag_s=np.zeros(5),
        server_timing_ms=timing,
    )
    assert (step["requests"], step["not_sent"], step["ok"]) == (3, 2, 2)
    assert step["errors"] == {"UNAVAILABLE": 1} and step["success_rate"] == pytest.approx(2 / 3)
    assert step["late_sends_own"] == 0 and step["server_timing"]["missing"] == 2
    assert step["littles_law"]["arrival_rate_qps"] == 3.0 and step["sent_qps"] == 3.0
    # A step that sent everything has no such count.
    whole = step_result(
        offered_qps=3, duration_s=1.0, intended_s=intended[:3], sent_s=sent[:3], done_s=done[:3], codes=codes[:3]
    )
    assert "not_sent" not in whole and whole["requests"] == 3
    # Nothing of the window sent: said so, not "no request was scheduled".
    none = step_result(
        offered_qps=2, duration_s=1.0, intended_s=intended[3:], sent_s=sent[3:], done_s=done[3:], codes=codes[3:]
    )
    assert (none["requests"], none["not_sent"], none["errors"]) == (0, 2, {})
    assert check_precision(none) == ["step 2 QPS: none of the 2 requests scheduled in the measured window was sent"]
    # A request said never sent that has a send time is a bookkeeping error, not a request to drop.
    with pytest.raises(
        ValueError,
        match=re.escape(
            "request 0 has code NOT_SENT (never sent): expected NaN send and completion times; got sent 0.1, done nan"
        ),
    ):
        step_result(
            offered_qps=1,
            duration_s=1.0,
            intended_s=intended[:1],
            sent_s=intended[:1],
            done_s=np.array([np.nan]),
            codes=np.array(["NOT_SENT"]),
        )


def test_an_ok_without_completion_time_is_refused():
    with pytest.raises(ValueError, match="OK"):
        step_result(
            offered_qps=1,
            duration_s=1,
            intended_s=np.array([0.0]),
            sent_s=np.array([0.0]),
            done_s=np.array([np.nan]),
            codes=np.array(["OK"]),
        )
    with pytest.raises(ValueError, match="length"):
        step_result(
            offered_qps=1,
            duration_s=1,
            intended_s=np.array([0.0, 1.0]),
            sent_s=np.array([0.0]),
            done_s=np.array([0.1]),
            codes=np.array(["OK"]),
        )


def test_littles_law_holds_on_a_hand_built_single_server_queue():
    """Pairs of requests arrive together every 20 ms at one server with a fixed 8 ms service time.

    Per 20 ms cycle: the first of a pair is served over [0, 8) ms and done at 8 ms; the
    second waits for it and is served over [8, 16), done at 16 ms. Time in system: 8 and
    16 ms, so W = 12 ms; arrivals λ = 2 per 20 ms = 100/s; λW = 100 × 0.012 = 1.2.
    In flight over the cycle: 2 during [0, 8), 1 during [8, 16), 0 during [16, 20), so the
    time-average is (2·8 + 1·8 + 0·4) / 20 = 1.2: sampling each 1 ms at the cell midpoints
    gives eight 2s, eight 1s and four 0s per cycle.
    """
    cycles, period = 500, 0.020
    starts = np.arange(cycles) * period
    intended = np.repeat(starts, 2)
    done = intended + np.tile([0.008, 0.016], cycles)
    per_cycle = [2] * 8 + [1] * 8 + [0] * 4
    samples = np.tile(per_cycle, cycles).astype(float)
    # The samples are what a 1 ms in-flight sampler would read off these very arrays.
    grid = (np.arange(cycles * 20) + 0.5) * 1e-3
    counted = ((intended[None, :] <= grid[:, None]) & (grid[:, None] < done[None, :])).sum(axis=1)
    assert (counted == samples).all()
    step = step_result(
        offered_qps=100,
        duration_s=cycles * period,
        intended_s=intended,
        sent_s=intended,
        done_s=done,
        codes=np.array(["OK"] * len(intended)),
        inflight_samples=samples,
    )
    little = step["littles_law"]
    assert little["mean_inflight_measured"] == pytest.approx(1.2)
    assert little["lambda_w"] == pytest.approx(1.2)
    assert little["arrival_rate_qps"] == pytest.approx(100.0)
    assert little["mean_in_flight_ms"] == pytest.approx(12.0)
    assert abs(little["relative_error"]) < 1e-9
    assert step["latency_ms"]["mean"] == pytest.approx(12.0)
    assert step["latency_ms"]["p50"] == pytest.approx(8.0) and step["latency_ms"]["max"] == pytest.approx(16.0)


def test_littles_law_is_nan_without_samples():
    t = schedule(10, 1.0)
    step = step_result(offered_qps=10, duration_s=1, intended_s=t, sent_s=t, done_s=t + 0.01, codes=["OK"] * 10)
    assert math.isnan(step["littles_law"]["mean_inflight_measured"])
    assert math.isnan(step["littles_law"]["relative_error"])


def test_server_figures_are_copied_and_the_whole_view_kept():
    t = schedule(10, 1.0)
    server = {
        "requests": 123,  # the server's own count: must not replace the client's
        "e2e_ms": {"mean": 3.0},
        "queue_ms": {"mean": 1.0, "p99": 2.5},
        "mean_batch_size": 4.5,
        "flush_reasons": {"size": 3, "delay": 7},
        "stages_ms": {"queue": 1.0, "compute": 1.5},
        "gpu": {"0": {"utilization_ratio": 0.5}},
    }
    step = step_result(
        offered_qps=10, duration_s=1, intended_s=t, sent_s=t, done_s=t + 0.01, codes=["OK"] * 10, server=server
    )
    assert step["requests"] == 10
    assert step["queue_ms"] == {"mean": 1.0, "p99": 2.5} and step["mean_batch_size"] == 4.5
    assert step["flush_reasons"] == {"size": 3, "delay": 7} and step["stages_ms"]["compute"] == 1.5
    assert step["gpu"] == {"0": {"utilization_ratio": 0.5}}
    assert step["server"]["e2e_ms"] == {"mean": 3.0}
    # Every request took 10 ms at the client; the server saw 3 ms of it on average.
    assert step["outside_server_ms"] == pytest.approx(10.0 - 3.0)
    bare = step_result(offered_qps=10, duration_s=1, intended_s=t, sent_s=t, done_s=t + 0.01, codes=["OK"] * 10)
    assert all(bare[k] is None for k in analysis.SERVER_KEYS) and bare["server"] is None
    assert bare["outside_server_ms"] is None


def test_outside_server_is_none_without_a_mean_on_either_side():
    assert analysis.outside_server_ms(12.5, {"e2e_ms": {"mean": 2.5}}) == 10.0
    assert analysis.outside_server_ms(12.5, {"requests": 0}) is None  # the server answered nothing in the window
    assert analysis.outside_server_ms(float("nan"), {"e2e_ms": {"mean": 2.5}}) is None  # no OK request
    assert analysis.outside_server_ms(12.5, None) is None


# ---------------------------------------------------------------------------- verdicts


def fake_step(offered, achieved=None, p99=10.0, success=1.0, lag99=0.1, duration=60.0, requests=None) -> dict:
    """A step dict with just the figures the verdicts read."""
    achieved = offered if achieved is None else achieved
    lat = dict.fromkeys(LATENCY_KEYS, p99 / 2)
    lat["p99"] = p99
    return {
        "offered_qps": float(offered),
        "achieved_qps": float(achieved),
        "duration_s": duration,
        "phase": "ramp",
        "requests": int(offered * duration) if requests is None else requests,
        "ok": int(achieved * duration),
        "errors": {},
        "success_rate": success,
        "latency_ms": lat,
        "dispatch_lag_ms": {"p50": lag99 / 2, "p99": lag99, "max": lag99},
        "late_sends": 0,
        "littles_law": {"mean_inflight_measured": math.nan, "lambda_w": math.nan, "relative_error": math.nan},
    }


def curve(points) -> list[dict]:
    return [fake_step(o, a) for o, a in points]


def test_knee_is_the_first_step_whose_marginal_gain_falls_below_the_threshold():
    # Gains: 100→200: 1.0, 200→400: 150/200 = 0.75, 400→800: 150/400 = 0.375 < 0.5.
    steps = curve([(100, 100), (200, 200), (400, 350), (800, 500), (1600, 510)])
    assert find_knee(steps) == 800
    assert find_knee(steps, threshold=0.8) == 400  # 0.75 < 0.8
    assert find_knee(steps, threshold=0.3) == 1600  # 10/800
    # Order of the list does not matter (refinement steps arrive last).
    assert find_knee(list(reversed(steps))) == 800


def test_no_knee_from_noise_between_close_steps():
    # 5 s steps a few QPS apart: at 1,025 the gain from 1,000 is (1013 − 1004) / 25 = 0.36, but
    # 1,013 is only 12 short of 1,025, inside the noise 3·√(1025·5)/5 ≈ 43: throughput still follows.
    pts = [(800, 801), (1000, 1004), (1025, 1013), (1050, 1051), (1200, 1199), (1600, 1450)]
    steps = [fake_step(o, a, duration=5.0) for o, a in pts]
    assert find_knee(steps) is None  # 1,600's gain is 251 / 400 = 0.63
    assert find_knee(steps, threshold=0.7) == 1600  # and 150 short, beyond its noise of 54


def test_no_knee_on_a_straight_line_and_none_for_too_few_steps():
    assert find_knee(curve([(50, 50), (100, 99.5), (200, 199), (400, 398)])) is None
    assert find_knee(curve([(50, 50)])) is None
    assert find_knee([]) is None


def test_knee_counts_successes_only_so_an_erroring_server_has_a_knee():
    steps = curve([(100, 100), (200, 200), (400, 210)])  # 400 offered, 210 succeed, the rest fail
    assert find_knee(steps) == 400


def test_knee_skips_a_repeated_offer():
    steps = curve([(100, 100), (200, 200), (200, 190), (400, 400)])
    assert find_knee(steps) is None


def test_knee_at_or_below_a_first_step_that_already_fell_short():
    # `wok simulate --alpha 0.25ms --beta 0.2ms --steps 16000 --step-duration 5s`: 4,806.4 of 16,000
    # achieved. The first step's gain is taken from the origin: 4806.4 / 16000 = 0.30 < 0.5, and it
    # is 11,194 short, far beyond its noise 3·√(16000·5)/5 ≈ 170. It was reported as "kept up".
    first = [fake_step(16000, 4806.4, duration=5.0)]
    assert find_knee(first) == 16000
    r = ramp_result(steps=first, slo_p99_ms=200, config={})
    assert r["knee_qps"] == 16000 and r.get("knee_at_or_below_first_step") is True
    # With a second, flat step the knee was put at 32,000, though throughput was flat from 16,000.
    flat = [*first, fake_step(32000, 4810.0, duration=5.0)]
    assert find_knee(flat) == 16000
    # A first step whose requests all fail (encoder, `--sizes fixed:0`: 0 achieved, 32 errors).
    assert find_knee([fake_step(6.4, 0.0, success=0.0, duration=5.0, requests=32)]) == 6.4


def test_knee_after_a_first_step_that_kept_up_is_where_it_was():
    # 100 → 100 (gain from the origin 1.0, not short), 200 → 105: (105 − 100) / 100 = 0.05, 95 short
    # beyond its noise 3·√(200·60)/60 ≈ 5.5: the knee is the second step, as before.
    steps = curve([(100, 100), (200, 105)])
    assert find_knee(steps) == 200
    r = ramp_result(steps=steps, slo_p99_ms=200, config={})
    assert r["knee_qps"] == 200 and r["knee_at_or_below_first_step"] is False
    # Every step kept up: no knee.
    kept = ramp_result(steps=curve([(100, 100), (200, 199), (400, 399)]), slo_p99_ms=200, config={})
    assert kept["knee_qps"] is None and kept["knee_at_or_below_first_step"] is False


def test_a_first_step_short_but_still_following_is_not_the_knee():
    # 3 % errors at the first step: 15,520 of 16,000 is 480 short, beyond the noise (170), but its gain
    # from the origin is 0.97, and the next step still gains 0.97: the knee is where the curve flattens,
    # as it would be with lower steps run first (the knee does not move down when they are left out).
    steps = [fake_step(o, a, duration=5.0) for o, a in [(16000, 15520), (32000, 31040), (64000, 33000)]]
    assert find_knee(steps) == 64000
    assert find_knee([fake_step(8000, 8000, duration=5.0), *steps]) == 64000
    assert find_knee(steps, threshold=0.98) == 16000  # with a stricter threshold it is the first step


def slo_curve(points, success=None) -> list[dict]:
    success = success or {}
    return [fake_step(o, p99=p, success=success.get(o, 1.0)) for o, p in points]


def test_max_qps_under_slo_is_the_highest_passing_step_before_the_first_failure():
    steps = slo_curve([(50, 20), (100, 40), (200, 199.9), (400, 250), (800, 900)])
    assert max_qps_under_slo(steps, 200) == 200
    assert max_qps_under_slo(steps, 40) == 100  # equal to the SLO passes
    assert max_qps_under_slo(steps, 1000) == 800


def test_a_pass_after_a_failure_is_noise():
    steps = slo_curve([(50, 20), (100, 300), (200, 150), (400, 500)])
    assert max_qps_under_slo(steps, 200) == 50


def test_an_offer_run_twice_passes_only_if_both_passed_whichever_ran_first():
    # `--steps 100,200,200`, the second 200 failing: the verdict was 200 with "every step met the SLO";
    # with the failing one run first it was 100. Both orders are one ramp: 100.
    for p99s in ((10, 90), (90, 10)):
        steps = slo_curve([(100, 10), (200, p99s[0]), (200, p99s[1])])
        assert max_qps_under_slo(steps, 50) == 100
        r = ramp_result(steps=steps, slo_p99_ms=50, config={})
        assert r["max_qps_under_slo"] == 100
        assert not any("every step met the SLO" in w for w in r["warnings"])
        assert (
            "step 200 QPS met the SLO after another step at the same offer missed it: "
            "ignored as noise in max_qps_under_slo"
        ) in r["warnings"]
    # Both repeats passing: the offer passed.
    assert max_qps_under_slo(slo_curve([(100, 10), (200, 10), (200, 20), (400, 90)]), 50) == 200


def test_first_step_failing_gives_none():
    assert max_qps_under_slo(slo_curve([(50, 300), (100, 400)]), 200) is None
    assert max_qps_under_slo([], 200) is None


def test_success_rate_below_the_minimum_fails_a_fast_step():
    steps = slo_curve([(50, 20), (100, 20), (200, 20)], success={200: 0.98})
    assert max_qps_under_slo(steps, 200) == 100
    assert max_qps_under_slo(steps, 200, min_success_rate=0.95) == 200


def test_a_step_without_successes_has_no_p99_and_fails():
    steps = slo_curve([(50, 20), (100, math.nan)], success={100: 0.0})
    assert max_qps_under_slo(steps, 200) == 50


def _verdicts(steps, slo=200.0) -> tuple:
    r = ramp_result(steps=steps, slo_p99_ms=slo, config={}, created="2026-01-01T00:00:00Z")
    return r["knee_qps"], r["knee_at_or_below_first_step"], r["max_qps_under_slo"], r["warnings"]


def test_the_verdicts_on_edge_cases_by_hand():
    # One step that kept up and met the SLO: no knee; the maximum is at least that step.
    assert _verdicts([fake_step(100, 100, p99=10)]) == (
        None,
        False,
        100,
        ["every step met the SLO: the maximum is at least 100 QPS; add higher steps to find it"],
    )
    # One step 60 short (gain 0.4 from the origin, beyond its noise 3·√6000 / 60 = 3.9) that missed the
    # SLO: the knee is at or below it, no rate met the SLO.
    assert _verdicts([fake_step(100, 40, p99=500, success=0.4)]) == (
        100,
        True,
        None,
        ["the lowest step (100 QPS) already misses the SLO"],
    )
    # Equal throughputs: 200 gains (100 − 100) / 100 = 0 and is 100 short (noise 5.5): the knee.
    flat = curve([(100, 100), (200, 100), (400, 100)])
    assert _verdicts(flat)[:3] == (200, False, 400)
    # Non-monotone: 400 loses 50 of 200's throughput (gain −0.25), and 800 recovering does not move the
    # knee back up; listed in any order.
    dip = curve([(100, 100), (200, 200), (400, 150), (800, 790)])
    assert find_knee(dip) == 400 and find_knee(dip[::-1]) == 400 and find_knee([dip[2], dip[0], dip[3], dip[1]]) == 400
    # Every step failing (every request an error: nothing achieved, no P99): the knee is at or below the
    # first step, no rate met the SLO, and no step is said to have met it after another missed it.
    failing = [fake_step(q, 0.0, p99=math.nan, success=0.0) for q in (100, 200, 400)]
    assert _verdicts(failing) == (100, True, None, ["the lowest step (100 QPS) already misses the SLO"])
    # The SLO met only at the steps after a failed first one: none counts, and each is said to be noise.
    late = slo_curve([(100, 300), (200, 50), (400, 60)])
    knee, _, best, warnings = _verdicts(late)
    assert (knee, best) == (None, None)
    assert warnings == [
        "the lowest step (100 QPS) already misses the SLO",
        "step 200 QPS met the SLO after a lower step missed it: ignored as noise in max_qps_under_slo",
        "step 400 QPS met the SLO after a lower step missed it: ignored as noise in max_qps_under_slo",
    ]
    # ... and the same after a pass: the last pass before the first failure.
    assert _verdicts(slo_curve([(50, 20), (100, 300), (200, 50), (400, 60)]))[2] == 50


def test_refine_points_are_evenly_spaced_strictly_inside():
    assert refine_points(100, 200, 3) == [125.0, 150.0, 175.0]
    assert refine_points(100, 200, 0) == []


@pytest.mark.parametrize(("n", "got"), [(-1, "-1"), (2.5, "2.5")])
def test_refine_points_refuses_a_count_that_is_no_integer_from_0(n, got):
    # It said "n must be >= 0, got -1", and took 2.5 to range()'s TypeError.
    with pytest.raises(ValueError) as info:
        refine_points(100, 200, n)
    assert str(info.value) == f"n: expected an integer >= 0; got {got}"


@pytest.mark.parametrize("threshold", [123.4, 301.0, 399.99, 100.01])
def test_bisect_finds_the_threshold_within_the_tolerance_of_its_iterations(threshold):
    """p99 = 100 ms × qps / threshold: it meets a 100 ms SLO exactly up to `threshold` QPS."""
    calls = []

    def run_at(qps: float) -> dict:
        calls.append(qps)
        return fake_step(qps, p99=100.0 * qps / threshold)

    lo, hi, iterations = 100.0, 400.0, 8
    best, extra = bisect_max_qps(run_at, lo, hi, 100.0, iterations)
    assert len(calls) == iterations and [s["offered_qps"] for s in extra] == calls
    assert all(s["phase"] == "refine" for s in extra)
    assert best <= threshold  # what it reports passed
    assert threshold - best <= (hi - lo) / 2**iterations
    # The refinement steps agree with the verdict the result will carry.
    assert max_qps_under_slo([fake_step(100, p99=1), *extra], 100.0) == best


def test_bisect_needs_an_ordered_bracket():
    with pytest.raises(ValueError):
        bisect_max_qps(lambda q: fake_step(q), 200, 100, 100, 3)


def test_stop_early():
    assert stop_rule(fake_step(100, p99=1999), 200, 10) is None
    assert stop_rule(fake_step(100, p99=2001), 200, 10) is not None
    assert stop_rule(fake_step(100, p99=10, success=0.49), 200, 10) is not None
    assert stop_rule(fake_step(100, p99=math.nan, success=math.nan, requests=0), 200, 10) is not None


def test_the_reason_to_stop_names_its_cause_and_an_infinite_factor_runs_every_step():
    assert stop_rule(fake_step(100, p99=2001), 200, 10) == (
        "stop_factor",
        "the step's P99 2001 ms is over 10 × the SLO (200 ms)",
    )
    assert stop_rule(fake_step(100, p99=10, success=0.396), 200, 10) == (
        "stop_factor",
        "fewer than half of the step's requests succeeded (39.6% ok)",
    )
    # Once meant as "never stop", a huge factor still let the success rule stop; inf turns both off.
    assert stop_rule(fake_step(100, p99=10, success=0.396), 200, 1e9) is not None
    assert stop_rule(fake_step(100, p99=1e6, success=0.01), 200, math.inf) is None
    # No request at all: the generator is not working, whatever the factor.
    assert stop_rule(fake_step(100, p99=math.nan, success=math.nan, requests=0), 200, math.inf) == (
        "none_sent",
        "the step sent no request",
    )
    # The rule comes with its words (the result's stopped_early.rule): the ramp told none_sent by comparing them.
    assert stop_rule(fake_step(100, p99=math.nan, success=math.nan, requests=0), 200, 10) == (
        "none_sent",
        "the step sent no request",
    )


# ---------------------------------------------------------------------------- warnings


def test_dispatch_lag_warning():
    assert check_precision(fake_step(400, lag99=0.9)) == []
    (w,) = check_precision(fake_step(400, lag99=1.8))
    assert w == "step 400 QPS: dispatch lag p99 1.8 ms > 1 ms: the generator could not keep the schedule"
    # Just over the bound, one decimal would read "1.0 ms > 1 ms": as many as show it over.
    for lag99, shown in ((1.04, "1.04"), (1.0004, "1.0004"), (1.06, "1.1")):
        (w,) = check_precision(fake_step(400, lag99=lag99))
        assert w.startswith(f"step 400 QPS: dispatch lag p99 {shown} ms > 1 ms: "), w
    # With the sends' waits for a CPU known, it says how many were late only by them.
    step = fake_step(400, lag99=1.8)
    step.update(late_sends=40, late_sends_own=6)
    (w,) = check_precision(step)
    assert w.endswith("; of its 40 late sends, 34 were late only by waiting for a CPU (a busy host)"), w


def test_sent_qps_counts_the_windows_requests_that_went_out_within_it():
    # 10 requests intended at 0.0..0.9 s of a 1 s window; the last two go out after it ends.
    intended = np.arange(10) / 10
    sent = intended + np.array([0.01] * 8 + [0.2, 0.3])
    done = sent + 0.005
    codes = np.array(["OK"] * 10)
    step = step_result(offered_qps=10, duration_s=1.0, intended_s=intended, sent_s=sent, done_s=done, codes=codes)
    assert step["sent_qps"] == 8.0


def test_the_generator_is_judged_by_what_it_sent_not_by_what_came_back():
    # Past capacity: everything went out on time, the server answered 70 % of it, slowly.
    overloaded = fake_step(1000, achieved=700, p99=5000.0) | {"sent_qps": 1000.0}
    assert not [w for w in check_precision(overloaded, slo_p99_ms=1e9) if "under-delivered" in w]
    # The generator itself sent 10 % short, whatever the latency: said.
    short = fake_step(1000, achieved=900, p99=5000.0) | {"sent_qps": 900.0}
    (w,) = check_precision(short, slo_p99_ms=200)
    assert w == "step 1000 QPS: sent 900.0 QPS < 98% of offered: the generator under-delivered"
    # Within the 2 % margin and within Poisson noise on a short step: not evidence.
    assert check_precision(fake_step(1000, p99=5.0) | {"sent_qps": 985.0}) == []
    assert check_precision(fake_step(100, duration=2.0) | {"sent_qps": 90.0}) == []


def test_under_delivery_warning_only_when_the_server_is_fast_and_healthy():
    # Steps without `sent_qps` (written before it) keep the rule on answers.
    under = fake_step(100, achieved=90, p99=20)
    (w,) = check_precision(under, slo_p99_ms=200)
    assert w.startswith("step 100 QPS: achieved 90.0 QPS") and "under-delivered" in w
    assert check_precision(under) != []  # without an SLO: healthy is enough
    # Slow (P99 near the SLO): the server is the likelier cause, not the generator.
    assert check_precision(fake_step(100, achieved=90, p99=150), slo_p99_ms=200) == []
    # Failing requests explain the shortfall themselves.
    assert check_precision(fake_step(100, achieved=90, p99=20, success=0.9), slo_p99_ms=200) == []
    # 1.5% short is within the 2% margin.
    assert check_precision(fake_step(100, achieved=98.5, p99=20), slo_p99_ms=200) == []
    # On a 2 s step Poisson noise alone is 3·sqrt(200)/2 ≈ 21 QPS: 10 short is not evidence.
    assert check_precision(fake_step(100, achieved=90, p99=20, duration=2.0), slo_p99_ms=200) == []


def test_littles_law_disagreement_warns():
    step = fake_step(100)
    step["littles_law"] = {"mean_inflight_measured": 1.0, "lambda_w": 1.5, "relative_error": 0.5}
    (w,) = check_precision(step)
    assert "Little's law" in w and "+50%" in w
    # Not while the queue grows (answers 10 % short) nor while it drains a backlog (10 % over).
    for achieved in (90.0, 110.0):
        unsteady = fake_step(100, achieved=achieved, p99=500.0) | {"littles_law": step["littles_law"]}
        assert not [w for w in check_precision(unsteady, slo_p99_ms=200) if "Little" in w]


def test_littles_law_warns_only_past_what_the_windows_edges_owe():
    # λW − L = 0.5 with exact counts when the window's calls spend 0.6 requests' worth after its
    # end and earlier calls 0.1 inside it (a stall at the edge of a short step): no warning.
    step = fake_step(100)
    little = {"mean_inflight_measured": 1.0, "lambda_w": 1.5, "relative_error": 0.5}
    step["littles_law"] = little | {"late_edge": 0.6, "early_edge": 0.1}
    assert not [w for w in check_precision(step) if "Little" in w]
    # The edges account for 0.1 of it: 0.4 unexplained, the counters or the clocks.
    step["littles_law"] = little | {"late_edge": 0.15, "early_edge": 0.05}
    (w,) = check_precision(step)
    assert "Little's law" in w and "+50%" in w
    # Edges that are not figures (NaN from a broken part, null in JSON) explain nothing: the
    # whole error is judged, not hidden.
    for bad in (math.nan, None):
        step["littles_law"] = little | {"late_edge": bad, "early_edge": 0.1}
        (w,) = check_precision(step)
        assert "Little's law" in w and "+50%" in w


def test_an_empty_step_warns():
    (w,) = check_precision(fake_step(100, requests=0, success=math.nan))
    assert "no request" in w


# ---------------------------------------------------------------------------- ramp_result


def test_ramp_result_carries_the_verdicts_in_offered_order():
    steps = [fake_step(o, a, p) for o, a, p in [(400, 250, 900), (50, 50, 10), (100, 100, 20), (200, 195, 150)]]
    steps[0]["dispatch_lag_ms"]["p99"] = 1.8
    config = {"target": "localhost:8001", "models": [["mlp", 1.0]], "steps": [50, 100, 200, 400]}
    r = ramp_result(steps=steps, slo_p99_ms=200, config=config, timeline=None)
    assert r["schema"] == "wok.bench/2"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", r["created"])
    assert r["config"]["source"] == "bench" and r["config"]["target"] == "localhost:8001"
    assert [s["offered_qps"] for s in r["steps"]] == [50, 100, 200, 400]
    assert r["knee_qps"] == 400  # gains 1.0, 0.95, then (250 - 195) / 200 = 0.275
    assert r["max_qps_under_slo"] == 200
    assert r["timeline"] is None
    assert any("dispatch lag p99 1.8 ms" in w for w in r["warnings"])
    assert config.get("source") is None  # the caller's dict is not modified


def test_ramp_result_knee_and_edge_warnings():
    steps = [fake_step(o, a, 10) for o, a in [(100, 100), (200, 200), (400, 220)]]
    r = ramp_result(steps=steps, slo_p99_ms=200, config={"source": "simulate"}, created="2025-01-01T00:00:00Z")
    assert r["knee_qps"] == 400 and r["max_qps_under_slo"] == 400
    assert r["created"] == "2025-01-01T00:00:00Z" and r["config"]["source"] == "simulate"
    assert any("every step met the SLO" in w for w in r["warnings"])
    failing = ramp_result(steps=[fake_step(100, p99=500)], slo_p99_ms=200, config={})
    assert failing["max_qps_under_slo"] is None
    assert any("already misses the SLO" in w for w in failing["warnings"])
    noisy = ramp_result(steps=slo_curve([(50, 20), (100, 300), (200, 150)]), slo_p99_ms=200, config={})
    assert noisy["max_qps_under_slo"] == 50
    assert any("step 200 QPS met the SLO after a lower step missed it" in w for w in noisy["warnings"])
    with pytest.raises(ValueError, match="source"):
        ramp_result(steps=[], slo_p99_ms=200, config={"source": "elsewhere"})


def test_a_ramp_cut_after_steps_that_all_met_the_slo_says_its_maximum_is_a_lower_bound():
    # It said "every step met the SLO … add higher steps", though a higher step was planned and cut.
    steps = [fake_step(100, p99=10), fake_step(200, p99=20)]
    r = ramp_result(steps=steps, slo_p99_ms=200, config={}, cut_at_qps=400)
    assert r["max_qps_under_slo"] == 200
    assert r["warnings"] == [
        "the ramp was cut in its 400 QPS step, and every step before it met the SLO: the maximum is at least "
        "200 QPS, a lower bound; run the ramp again to find it"
    ]
    # A step that missed it before the cut sets the maximum: nothing to add. Nor when the lowest missed it.
    r = ramp_result(steps=slo_curve([(100, 10), (200, 300)]), slo_p99_ms=200, config={}, cut_at_qps=400)
    assert r["max_qps_under_slo"] == 100 and r["warnings"] == []
    r = ramp_result(steps=slo_curve([(100, 300)]), slo_p99_ms=200, config={}, cut_at_qps=200)
    assert r["warnings"] == ["the lowest step (100 QPS) already misses the SLO"]


def test_ramp_result_checks_the_timeline():
    tl = {"t_s": [0, 1, 2], "offered": [10, 10, 10], "achieved": [10, 9, 10], "p99_ms": [5.0, None, 6.0]}
    r = ramp_result(steps=[fake_step(10)], slo_p99_ms=200, config={}, timeline=tl)
    assert r["timeline"] == tl
    with pytest.raises(ValueError, match="length"):
        ramp_result(steps=[], slo_p99_ms=200, config={}, timeline={**tl, "p99_ms": [1.0]})
    with pytest.raises(ValueError, match="lacks"):
        ramp_result(steps=[], slo_p99_ms=200, config={}, timeline={"t_s": []})


def test_the_server_view_reads_the_loop_lag_and_a_stall_past_the_last_bucket():
    from wok.bench.scrape import Snapshot, server_view

    def snap(lag_buckets: dict[str, float], lag_sum: float) -> Snapshot:
        s = Snapshot()
        # The view needs requests in the window; each snapshot counts 10 more.
        s.values[("wok_request_duration_seconds_count", (("model", "m"),))] = 10.0 * (1 + lag_buckets["+Inf"])
        s.values[("wok_request_duration_seconds_sum", (("model", "m"),))] = 0.05
        for le, c in lag_buckets.items():
            s.values[("wok_event_loop_lag_seconds_bucket", (("le", le),))] = c
        s.values[("wok_event_loop_lag_seconds_count", ())] = lag_buckets["+Inf"]
        s.values[("wok_event_loop_lag_seconds_sum", ())] = lag_sum
        return s

    before = snap({"0.001": 0, "0.005": 0, "5.0": 0, "+Inf": 0}, 0.0)
    # 98 samples of at most 1 ms, one in (1, 5] ms, one past 5 s (a 7 s stall).
    after = snap({"0.001": 98, "0.005": 99, "5.0": 99, "+Inf": 100}, 7.05)
    lag = server_view(before, after, "m")["loop_lag_ms"]
    assert lag["samples"] == 100 and lag["mean"] == pytest.approx(70.5)
    assert lag["max_bound"] is None and lag["over_last_bound"] is True
    # The P99 rank (99) is reached in the (1, 5] ms bucket: its upper bound, as Prometheus reads it.
    assert lag["p99"] == pytest.approx(5.0)
    after = snap({"0.001": 98, "0.005": 100, "5.0": 100, "+Inf": 100}, 0.01)
    lag = server_view(before, after, "m")["loop_lag_ms"]
    assert lag["max_bound"] == pytest.approx(5.0) and lag["over_last_bound"] is False


def test_a_histogram_gives_back_its_values_to_within_its_buckets():
    from wok.bench.histogram import LatencyHistogram

    values = np.array([0.0005, 0.2, 1.0, 1.0, 7.5, 42.0, 1234.5])
    h = LatencyHistogram.from_ms(values)
    got = h.values_ms()
    assert got.size == values.size and np.all(np.diff(got) >= 0)
    np.testing.assert_allclose(got, np.sort(values), rtol=h.to_dict()["relative_error"], atol=1e-6)
