"""bench/arrivals.py: the arrival processes have the distributions they claim, and the specs parse.

The statistical tests use fixed seeds, so they are deterministic; their thresholds are
set so that a plausible wrong implementation fails them, and the tests that prove it
(a generator with the right mean but the wrong shape, a burst with σ read as σ²) are here
too. Expected counts come from scipy's quadrature of λ(t) written out in this file, not
from the module's own `cumulative`, so a shared mistake cannot cancel out.
"""

from __future__ import annotations

import json
import math
from itertools import pairwise

import numpy as np
import pytest
from scipy import integrate, stats

from wok.bench.arrivals import (
    Arrivals,
    Burst,
    Constant,
    Poisson,
    Sawtooth,
    TraceReplay,
    csv_rows,
    load_trace,
    nominal_for,
    parse_arrivals,
    parse_duration,
    parse_steps,
    window_rate,
)

QPS = 200.0


def gaps_of(times: np.ndarray) -> np.ndarray:
    # The gap from the window's start counts too: a Poisson stream is memoryless.
    return np.diff(np.r_[0.0, times])


def counts_per_bin(process, duration_s: float, windows: int, seed: int, bin_s: float = 1.0) -> np.ndarray:
    """Arrivals per bin, summed over independent windows."""
    rng = np.random.default_rng(seed)
    edges = np.arange(0.0, duration_s + bin_s / 2, bin_s)
    total = np.zeros(len(edges) - 1)
    for _ in range(windows):
        total += np.histogram(process.times(duration_s, rng), bins=edges)[0]
    return total


def expected_per_bin(rate, duration_s: float, windows: int, bin_s: float = 1.0) -> np.ndarray:
    edges = np.arange(0.0, duration_s + bin_s / 2, bin_s)
    return np.array([windows * integrate.quad(rate, a, b)[0] for a, b in pairwise(edges)])


def chi2_pvalue(observed: np.ndarray, expected: np.ndarray) -> float:
    # Expected counts are known, not fitted, so every bin is a degree of freedom.
    stat = float(np.sum((observed - expected) ** 2 / expected))
    return float(stats.chi2.sf(stat, df=len(observed)))


# -- every process ---------------------------------------------------------------------------
PROCESSES = [
    Constant(50.0),
    Constant(50.0, random_phase=True),
    Poisson(50.0),
    Burst(20.0, 80.0, 5.0, 1.0),
    Sawtooth(10.0, 90.0, 3.0),
    TraceReplay([0.0, 0.1, 0.15, 0.7], sizes=[1, 2, 3, 4]),
]


@pytest.mark.parametrize("process", PROCESSES, ids=lambda p: p.name)
def test_times_are_sorted_float64_offsets_inside_the_window(process):
    assert isinstance(process, Arrivals)
    t = process.times(10.0, np.random.default_rng(1))
    assert t.dtype == np.float64 and t.ndim == 1 and t.size > 0
    assert np.all(np.diff(t) >= 0)
    assert t[0] >= 0.0 and t[-1] < 10.0
    assert np.array_equal(t, process.times(10.0, np.random.default_rng(1)))  # same seed, same schedule
    assert process.times(0.0, np.random.default_rng(1)).size == 0
    assert isinstance(process.rate(1.0), float)
    assert process.rate(np.array([1.0, 2.0])).shape == (2,)
    assert process.mean_rate > 0


# -- Constant and Poisson --------------------------------------------------------------------
def test_constant_is_evenly_spaced_from_zero():
    t = Constant(8.0).times(2.0, np.random.default_rng(0))
    assert np.array_equal(t, np.arange(16) / 8.0)  # exact: k/qps, no running sum


def test_constant_with_a_random_phase_keeps_its_spacing():
    t = Constant(8.0, random_phase=True).times(2.0, np.random.default_rng(3))
    assert 0.0 < t[0] < 1 / 8.0
    np.testing.assert_allclose(np.diff(t), 1 / 8.0, rtol=1e-12)
    assert len(t) == 16 - (t[0] + 15 / 8.0 >= 2.0)


def test_poisson_gaps_are_exponential():
    t = Poisson(QPS).times(30.0, np.random.default_rng(7))
    result = stats.kstest(gaps_of(t), "expon", args=(0, 1 / QPS))
    assert result.pvalue > 0.01, result


def wrong_constant_gaps(qps: float, duration_s: float, rng: np.random.Generator) -> np.ndarray:
    return np.arange(1, int(qps * duration_s)) / qps


def wrong_uniform_gaps(qps: float, duration_s: float, rng: np.random.Generator) -> np.ndarray:
    # The right mean gap, the wrong shape: only a test of the distribution can catch it.
    t = np.cumsum(rng.uniform(0, 2 / qps, int(2 * qps * duration_s)))
    return t[t < duration_s]


@pytest.mark.parametrize("wrong", [wrong_constant_gaps, wrong_uniform_gaps])
def test_the_exponential_gap_test_rejects_a_wrong_generator(wrong):
    # Constant gaps put the KS distance at 1 − 1/e ≈ 0.63, uniform ones at ≥ 0.15; with
    # ~6000 gaps the 1% critical distance is ≈ 0.021, so both fail by far.
    t = wrong(QPS, 30.0, np.random.default_rng(7))
    assert stats.kstest(gaps_of(t), "expon", args=(0, 1 / QPS)).pvalue < 1e-6


def test_poisson_counts_have_mean_and_variance_lambda_t():
    rng = np.random.default_rng(11)
    lam_t = QPS * 5.0
    counts = np.array([Poisson(QPS).times(5.0, rng).size for _ in range(60)])
    assert abs(counts.mean() - lam_t) < 4 * math.sqrt(lam_t / len(counts))
    # Index of dispersion: Σ(N − N̄)²/N̄ ~ χ²(k − 1) for Poisson counts. Constant arrivals
    # (variance 0) land in the far lower tail, bunched ones in the upper.
    dispersion = float(np.sum((counts - counts.mean()) ** 2) / counts.mean())
    assert 0.005 < stats.chi2.cdf(dispersion, df=len(counts) - 1) < 0.995


# -- Burst -----------------------------------------------------------------------------------
BASE, AMP, T0, SIGMA, T = 20.0, 80.0, 10.0, 2.0, 20.0
WINDOWS = 200


def burst_rate(t: float, sigma: float = SIGMA) -> float:
    return BASE + AMP * math.exp(-((t - T0) ** 2) / (2 * sigma**2))


def test_burst_rate_is_at_offsets_from_the_step_start():
    b = Burst(BASE, AMP, T0, SIGMA)
    assert b.rate(T0) == BASE + AMP
    assert b.rate(0.0) == pytest.approx(BASE, abs=1e-3)  # 5σ before the peak
    np.testing.assert_allclose(b.rate(np.array([8.0, 12.0])), burst_rate(8.0))
    np.testing.assert_allclose(b.cumulative(T), integrate.quad(burst_rate, 0, T)[0], rtol=1e-9)
    assert Burst(BASE, AMP, T0, SIGMA, duration_s=T).mean_rate == pytest.approx(
        integrate.quad(burst_rate, 0, T)[0] / T, rel=1e-9
    )


def test_burst_per_second_counts_follow_lambda():
    observed = counts_per_bin(Burst(BASE, AMP, T0, SIGMA), T, WINDOWS, seed=5)
    expected = expected_per_bin(burst_rate, T, WINDOWS)
    z = (observed - expected) / np.sqrt(expected)
    assert np.all(np.abs(z) < 4), z.round(2)
    assert chi2_pvalue(observed, expected) > 0.01
    # The two seconds either side of t0 carry ~0.97 (base + A) each; the edges only base.
    peak = observed[[9, 10]].mean() / WINDOWS
    assert 0.9 * (BASE + AMP) < peak < BASE + AMP
    baseline = observed[np.r_[0:3, 17:20]].mean() / WINDOWS
    assert baseline == pytest.approx(BASE, rel=0.05)


def test_the_burst_count_test_rejects_sigma_read_as_variance():
    # Burst(σ=√2) is what a σ²-for-σ slip produces; it carries 30% less burst mass.
    observed = counts_per_bin(Burst(BASE, AMP, T0, math.sqrt(SIGMA)), T, WINDOWS, seed=5)
    assert chi2_pvalue(observed, expected_per_bin(burst_rate, T, WINDOWS)) < 1e-6


def test_a_burst_outside_the_window_is_thinned_from_the_right_bound():
    # Peak at 30 s in a 10 s window: λ_max is λ(10), not base + A; the counts still match.
    b = Burst(5.0, 200.0, 30.0, 8.0)
    observed = counts_per_bin(b, 10.0, 100, seed=9)
    expected = expected_per_bin(lambda t: 5.0 + 200.0 * math.exp(-((t - 30.0) ** 2) / 128.0), 10.0, 100)
    assert chi2_pvalue(observed, expected) > 0.01


def test_a_sharp_burst_draws_about_its_expected_count_not_its_peak_rate():
    """A 1e6 QPS spike of σ 1 ms over 100 QPS was thinned from candidates at the peak rate over
    the whole window: 6.6e7 (2 GB, 10 s) over 66 s for ~9,100 arrivals, a MemoryError beyond."""
    import tracemalloc

    b = parse_arrivals("burst:amplitude=1000000,sigma=1ms", 100, duration_s=6.6)
    spike = 1e6 * 1e-3 * math.sqrt(2 * math.pi)  # ≈ 2,507 requests, all well inside the window
    assert b.cumulative(6.6) == pytest.approx(100 * 6.6 + spike, rel=1e-9)
    tracemalloc.start()
    try:
        counts = [b.times(6.6, np.random.default_rng(seed)) for seed in range(20)]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # ~3,200 arrivals (25 kB) a draw; thinning from the peak held 6.6e6 candidates (> 100 MB).
    assert peak < 8e6, f"{peak / 1e6:.0f} MB"
    total = np.array([t.size for t in counts]).sum()
    expected = 20 * float(b.cumulative(6.6))
    assert abs(total - expected) < 4 * math.sqrt(expected)
    near = sum(int(np.count_nonzero(np.abs(t - 3.3) < 0.005)) for t in counts)  # t0 ± 5σ
    expected_near = 20 * (spike + 100 * 0.01)
    assert abs(near - expected_near) < 4 * math.sqrt(expected_near)
    for t in counts:
        assert np.all(np.diff(t) >= 0) and t[0] >= 0 and t[-1] < 6.6


def test_a_sharp_burst_is_shaped_like_its_gaussian():
    """The bump's arrivals per σ/2 bin near t0 follow λ (the bins of the bound are σ/4 wide)."""
    b = Burst(10.0, 20000.0, 1.0, 0.01, duration_s=2.0)
    rng = np.random.default_rng(3)
    edges = 1.0 + 0.005 * np.arange(-8, 9)
    observed = sum(np.histogram(b.times(2.0, rng), bins=edges)[0] for _ in range(40))
    rate = lambda t: 10.0 + 20000.0 * math.exp(-((t - 1.0) ** 2) / (2 * 0.01**2))  # noqa: E731
    expected = np.array([40 * integrate.quad(rate, a, c)[0] for a, c in pairwise(edges)])
    assert chi2_pvalue(observed, expected) > 0.01


# -- Sawtooth --------------------------------------------------------------------------------
def test_sawtooth_counts_per_second_follow_the_ramp():
    low, high, period, windows = 10.0, 90.0, 5.0, 100
    observed = counts_per_bin(Sawtooth(low, high, period), 20.0, windows, seed=13)
    # λ is linear within each 1 s bin, so its integral is λ at the bin's middle.
    expected = windows * np.array([low + (high - low) * ((k % 5) + 0.5) / period for k in range(20)])
    np.testing.assert_allclose(expected, expected_per_bin(Sawtooth(low, high, period).rate, 20.0, windows))
    assert np.all(np.abs((observed - expected) / np.sqrt(expected)) < 4)
    assert chi2_pvalue(observed, expected) > 0.01
    by_phase = observed.reshape(4, 5)
    assert np.all(np.diff(by_phase, axis=1) > 0)  # rises within every period
    # A falling ramp (low and high swapped) has the same mean and must fail.
    falling = counts_per_bin(Sawtooth(high, low, period), 20.0, windows, seed=13)
    assert chi2_pvalue(falling, expected) < 1e-6


def test_sawtooth_rate_and_mean():
    s = Sawtooth(10.0, 90.0, 5.0)
    np.testing.assert_allclose(s.rate(np.array([0.0, 2.5, 4.999, 5.0, 7.5])), [10, 50, 89.984, 10, 50])
    assert s.mean_rate == 50.0
    assert s.cumulative(12.5) == pytest.approx(integrate.quad(s.rate, 0, 12.5, limit=200, points=[5, 10])[0])


# -- TraceReplay -----------------------------------------------------------------------------
def test_trace_replay_shifts_scales_repeats_and_truncates():
    tr = TraceReplay([103.0, 100.0, 100.5, 101.0], sizes=[9, 3, 5, 7], time_scale=2.0)
    # Sorted and shifted: 0, 0.5, 1, 3 s; twice as fast: 0, 0.25, 0.5, 1.5 s. The period
    # adds the mean gap to the span, 3·4/3 = 4 s → 2 s.
    assert tr.period_s == 2.0 and tr.mean_rate == 2.0
    t = tr.times(5.0, np.random.default_rng(0))
    np.testing.assert_allclose(t, [0, 0.25, 0.5, 1.5, 2, 2.25, 2.5, 3.5, 4, 4.25, 4.5])
    assert tr.sizes_for(t).tolist() == [3, 5, 7, 9, 3, 5, 7, 9, 3, 5, 7]
    assert tr.times(1.0).tolist() == [0, 0.25, 0.5]
    assert tr.cumulative(np.array([1.0, 5.0])).tolist() == [3, 11]


@pytest.mark.parametrize(
    "stamps",
    [[0.0, 0.7], [0.0, 0.1, 0.3], [0.0, 0.2, 0.4, 0.6], [0.0, 0.25, 1.0, 0.5, 2.0], [0.0, 0.3, 0.3, 0.9]],
)
def test_trace_cumulative_counts_exactly_what_times_schedules(stamps):
    """cumulative (so window_rate, so a step's offered_qps) took a float remainder, np.divmod, and
    counted an arrival at a copy boundary that times() left out: TraceReplay([0, 0.7]) scheduled 10
    arrivals in 7 s and cumulative(7) said 11."""
    for scale in (1.0, 0.3, 3.0, 0.7, 10 / 3):
        tr = TraceReplay(stamps, None, scale)
        windows = np.round(np.arange(0.0, 30.0, 0.05), 10)
        scheduled = tr.times(30.0)
        np.testing.assert_array_equal(tr.cumulative(windows), np.searchsorted(scheduled, windows, side="left"))
        for w in windows[::7]:
            assert tr.cumulative(float(w)) == tr.times(float(w)).size, (stamps, scale, w)
    assert TraceReplay([0.0, 0.7]).cumulative(7.0) == TraceReplay([0.0, 0.7]).times(7.0).size == 10


def test_trace_sizes_line_up_through_equal_timestamps_and_many_copies():
    tr = TraceReplay([0.0, 0.1, 0.1, 0.3], sizes=[1, 2, 3, 4], time_scale=3.0)
    t = tr.times(40.0)
    assert t.size == 4 * 300
    assert tr.sizes_for(t).tolist() == [1, 2, 3, 4] * 300
    assert TraceReplay([0.0, 1.0]).sizes_for(t) is None


def test_load_trace_csv_and_jsonl(tmp_path):
    csv_path = tmp_path / "t.csv"
    csv_path.write_text("timestamp,size\n1700000000.5,12\n1700000000.0,4\n1700000001.0,30\n")
    tr = load_trace(csv_path)
    assert tr.offsets.tolist() == [0.0, 0.5, 1.0] and tr.sizes.tolist() == [4, 12, 30]
    jsonl = tmp_path / "t.jsonl"
    jsonl.write_text(
        "\n".join(json.dumps({"timestamp": ts}) for ts in ["2024-05-01T12:00:00Z", "2024-05-01T12:00:01.25Z"]) + "\n"
    )
    tr = load_trace(jsonl)
    assert tr.offsets.tolist() == [0.0, 1.25] and tr.sizes is None
    # As a spreadsheet saves "CSV UTF-8": with a byte-order mark before the header.
    bom = tmp_path / "bom.csv"
    bom.write_text("timestamp,size\n1700000000.0,4\n1700000000.5,12\n", encoding="utf-8-sig")
    assert load_trace(bom).sizes.tolist() == [4, 12]


def test_load_trace_errors(tmp_path):
    p = tmp_path / "bad.csv"
    p.write_text("time,size\n1,2\n")
    with pytest.raises(ValueError, match=r"CSV header: expected a 'timestamp' column; got 'time', 'size'$"):
        load_trace(p)
    p.write_text("timestamp,size\n1,2\n2,\n")
    with pytest.raises(ValueError, match=r"bad.csv:3: no size, but .*bad.csv:2 has one"):
        load_trace(p)
    p.write_text("timestamp\nyesterday\n")
    with pytest.raises(ValueError, match=r"bad.csv:2: timestamp 'yesterday' is neither seconds nor an ISO 8601 time"):
        load_trace(p)
    p.write_text("timestamp,size\n")
    with pytest.raises(ValueError) as e:
        load_trace(p)
    assert str(e.value) == f"{p}: expected at least one arrival; got none"
    jsonl = tmp_path / "bad.jsonl"
    jsonl.write_text('{"timestamp": 1}\n{"time": 2, "size": 4}\n')
    with pytest.raises(ValueError) as e:
        load_trace(jsonl)
    assert str(e.value) == f'{jsonl}:2: expected an object with a "timestamp" field; got \'{{"time": 2, "size": 4}}\''


# -- parsing ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "seconds"), [("5m", 300.0), ("30s", 30.0), ("250ms", 0.25), ("1.5h", 5400.0), ("7", 7.0), (" 2.5 s", 2.5)]
)
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["5 parsecs", "", "-3s", "s", "1.2.3s"])
def test_parse_duration_errors(text):
    with pytest.raises(ValueError, match="invalid duration"):
        parse_duration(text)


def test_a_trace_size_in_other_digits_than_0_to_9_is_refused(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("timestamp,size\n0,1\n1,٣\n")
    with pytest.raises(ValueError) as e:
        load_trace(p)
    assert str(e.value) == f"{p}:3: size '٣' is not an integer >= 0"


# Digits other than 0-9: \d took every script's, and float() read them ("٣s" was 3 s, "1e٣s" 1000 s).
@pytest.mark.parametrize("text", ["5 parsecs", "٣s", "1.٣s", "1e٣s", "２ms"])
def test_parse_duration_error_text(text):
    with pytest.raises(ValueError) as e:
        parse_duration(text)
    assert str(e.value) == (
        f"invalid duration '{text}': expected a number >= 0 with an optional unit ms, s, m or h "
        "(e.g. '250ms', '30s', '5m', '1.5h')"
    )


@pytest.mark.parametrize(
    ("spec", "steps"),
    [
        ("50,100,200,400", [50, 100, 200, 400]),
        ("400, 100", [400, 100]),
        ("50:800:2", [50, 100, 200, 400, 800]),
        ("50:700:2", [50, 100, 200, 400]),
        ("0.1:0.8:2", [0.1, 0.2, 0.4, 0.8]),
        ("10:10:3", [10]),
        ("100:1000:1.5", [100 * 1.5**k for k in range(6)]),
    ],
)
def test_parse_steps(spec, steps):
    assert parse_steps(spec) == pytest.approx(steps, rel=1e-12)


def test_parse_steps_ends_exactly_on_stop():
    assert parse_steps("0.1:0.8:2")[-1] == 0.8


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("50:800:1", "QPS range '50:800:1': factor: expected a number > 1; got 1"),
        ("800:50:2", "QPS range '800:50:2': stop: expected a number >= start 800; got 50"),
        ("50:800", "QPS range '50:800': expected start:stop:factor (e.g. '50:800:2'); got 2 parts"),
        ("50:x:2", "QPS range '50:x:2': stop 'x' is not a number"),
        ("0:800:2", "QPS range '0:800:2': start: expected a number > 0; got 0"),
        ("50,abc", "QPS steps '50,abc': 'abc' is not a number"),
        ("50,0", "QPS steps '50,0': step 2: expected a number > 0; got 0"),
        ("1:1e9:1.0001", "QPS range '1:1e9:1.0001': 207244 steps; at most 1000"),
        # stop / start overflowed to inf: an OverflowError traceback from `wok bench ramp --steps`.
        ("1e-300:1e300:2", "QPS range '1e-300:1e300:2': 1994 steps; at most 1000"),
    ],
)
def test_parse_steps_errors(spec, message):
    with pytest.raises(ValueError) as e:
        parse_steps(spec)
    assert str(e.value) == message


def test_parse_arrivals_happy_paths(tmp_path):
    assert parse_arrivals("constant", 100) == Constant(100.0)
    assert parse_arrivals(" Poisson ", 100) == Poisson(100.0)
    assert parse_arrivals("burst:amplitude=4x,t0=30s,sigma=5s", 100) == Burst(100.0, 400.0, 30.0, 5.0)
    assert parse_arrivals("burst", 100, duration_s=60) == Burst(100.0, 400.0, 30.0, 6.0, duration_s=60.0)
    assert parse_arrivals("burst:amplitude=200,t0=500ms,sigma=2m", 50) == Burst(50.0, 200.0, 0.5, 120.0)
    assert parse_arrivals("sawtooth:low=0.5x,high=1.5x,period=10s", 100) == Sawtooth(50.0, 150.0, 10.0)
    assert parse_arrivals("sawtooth", 100) == Sawtooth(50.0, 150.0, 10.0)
    assert parse_arrivals("sawtooth:period=25%", 100, duration_s=60) == Sawtooth(50.0, 150.0, 15.0)
    trace = tmp_path / "trace.csv"
    trace.write_text("timestamp\n0\n1\n2\n3\n")  # 4 arrivals per 4 s period: 1/s recorded
    assert parse_arrivals(f"trace:{trace}", 100).time_scale == 1.0
    assert parse_arrivals(f"trace:{trace},scale=2", 100).mean_rate == 2.0
    assert parse_arrivals(f"trace:{trace},scale=auto", 100).mean_rate == pytest.approx(100.0)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            "zigzag",
            "arrivals 'zigzag': unknown process 'zigzag'; expected constant, poisson, burst, sawtooth or trace:PATH",
        ),
        ("burst", "arrivals 'burst': t0='50%' is a fraction of the step; parse_arrivals needs duration_s; got None"),
        (
            "burst:amplitude=4y,t0=1s,sigma=1s",
            "arrivals 'burst:amplitude=4y,t0=1s,sigma=1s': amplitude='4y' is neither a multiple of the step's rate "
            "like '4x' nor a rate >= 0 like '200'",
        ),
        (
            "burst:t0=soon,sigma=1s",
            "arrivals 'burst:t0=soon,sigma=1s': t0='soon' is neither a duration like '30s', '500ms', '2m' "
            "nor a fraction of the step like '50%'",
        ),
        ("burst:peak=3x", "arrivals 'burst:peak=3x': unknown option 'peak' for burst; expected amplitude, t0, sigma"),
        ("burst:t0=1s,t0=2s", "arrivals 'burst:t0=1s,t0=2s': option 't0' given twice; got '1s' and '2s'"),
        ("poisson:rate=3", "arrivals 'poisson:rate=3': poisson takes no options; got 'rate=3'"),
        ("sawtooth:low", "arrivals 'sawtooth:low': expected key=value; got 'low'"),
        ("trace:", "arrivals 'trace:': expected trace:PATH[,scale=N]; got no PATH"),
        # Each message names the option, what it expects and what it got, as the others do.
        ("burst:t0=1s,sigma=0s", "arrivals 'burst:t0=1s,sigma=0s': sigma: expected a duration > 0 s; got 0"),
        ("burst:t0=1s,sigma=0", "arrivals 'burst:t0=1s,sigma=0': sigma: expected a duration > 0 s; got 0"),
        (
            "burst:t0=0s,sigma=1s",
            "arrivals 'burst:t0=0s,sigma=1s': a burst at t0 <= 0 needs duration_s for its mean rate; "
            "got t0 0 s and duration_s None",
        ),
        ("sawtooth:period=0s", "arrivals 'sawtooth:period=0s': period: expected a duration > 0 s; got 0"),
        # An infinite duration was refused by the process as its own field ("sigma_s: ..."), not the spec's.
        (
            "burst:t0=1s,sigma=1e999s",
            "arrivals 'burst:t0=1s,sigma=1e999s': sigma: expected a finite duration; got '1e999s'",
        ),
        (
            "burst:t0=1e999s,sigma=1s",
            "arrivals 'burst:t0=1e999s,sigma=1s': t0: expected a finite duration; got '1e999s'",
        ),
        ("sawtooth:period=1e400", "arrivals 'sawtooth:period=1e400': period: expected a finite duration; got '1e400'"),
    ],
)
def test_parse_arrivals_errors(spec, message):
    with pytest.raises(ValueError) as e:
        parse_arrivals(spec, 100)
    assert str(e.value) == message


def test_a_trace_mixing_seconds_and_iso_times_is_refused(tmp_path):
    """Seconds may have any origin, an ISO time counts from the Unix epoch: "0" beside
    "2026-01-01T00:00:00Z" was read as a trace 1.8e9 s long (one arrival per replay)."""
    p = tmp_path / "t.csv"
    p.write_text("timestamp\n0\n1\n2026-01-01T00:00:00Z\n")
    with pytest.raises(ValueError) as e:
        load_trace(p)
    assert str(e.value) == (
        f"{p}:4: timestamp '2026-01-01T00:00:00Z' is an ISO 8601 time, but {p}:2 gives '0' in seconds; "
        "give every timestamp the same way"
    )
    jsonl = tmp_path / "t.jsonl"
    jsonl.write_text('{"timestamp": "2026-01-01T00:00:00Z"}\n{"timestamp": 1767225601.5}\n')
    with pytest.raises(ValueError, match=r"t.jsonl:1: timestamp '2026-01-01T00:00:00Z' is an ISO 8601 time, but "):
        load_trace(jsonl)
    # Either way alone is still read, seconds written as strings too.
    jsonl.write_text('{"timestamp": "1767225600"}\n{"timestamp": 1767225601.5}\n')
    assert load_trace(jsonl).offsets.tolist() == [0.0, 1.5]


LONG = "t" * 100_000
LONG_SHOWN = f"'{'t' * 200}'… (100,000 characters in all)"


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        (
            "t.csv",
            f"timestamp\n0\n{LONG}\n",
            f"t.csv:3: timestamp {LONG_SHOWN} is neither seconds nor an ISO 8601 time",
        ),
        ("t.csv", f"timestamp,size\n0,1\n1,{LONG}\n", f"t.csv:3: size {LONG_SHOWN} is not an integer >= 0"),
        (
            "t.jsonl",
            '{"timestamp": 0}\n{"timestamp": [' + ", ".join(["1"] * 30_000) + "]}\n",
            f"t.jsonl:2: timestamp {str([1] * 30_000)[:167]}… (90,000 characters in all) is neither seconds nor "
            "an ISO 8601 time",
        ),
        (
            "t.jsonl",
            '{"timestamp": 0}\n{"timestamp": 1, "size": {"n": "' + LONG + '"}}\n',
            f't.jsonl:2: size {{"n": "{"t" * 156}… (100,009 characters in all) is not an integer >= 0',
        ),
        # A header's names as the file gives them, however many and however long.
        (
            "t.csv",
            f"{LONG},size\n1,2\n",
            f"t.csv:1: CSV header: expected a 'timestamp' column; got {LONG_SHOWN}, 'size'",
        ),
        (
            "t.csv",
            ",".join(f"c{i}" for i in range(1000)) + "\n" + ",".join(["1"] * 1000) + "\n",
            "t.csv:1: CSV header: expected a 'timestamp' column; got "
            + ", ".join(f"'c{i}'" for i in range(20))
            + " and 980 more",
        ),
        (
            "t.jsonl",
            '{"timestamp": 0}\n["' + LONG + '"]\n',
            't.jsonl:2: expected an object with a "timestamp" field; got \'["'
            + "t" * 58
            + "'… (100,004 characters in all)",
        ),
    ],
    ids=["csv-timestamp", "csv-size", "jsonl-list", "jsonl-object", "header-long", "header-many", "line"],
)
def test_a_trace_files_cell_is_shown_quoted_and_cut(tmp_path, name, text, message):
    """Shown as repr writes them, whole: a cell of 100,000 characters (or a JSON array of 30,000
    numbers) made a refusal as long, cut only by the command's line limit, and a header's names bare. A
    value that is no string is cut to 200 bytes (errors.cut_message), its note included."""
    p = tmp_path / name
    p.write_text(text)
    with pytest.raises(ValueError) as e:
        load_trace(p)
    assert str(e.value).removeprefix(f"{tmp_path}/") == message


def test_trace_file_errors_name_the_file_and_line(tmp_path):
    """A non-finite timestamp was refused "at index 4" (of the sorted trace), a trace of one
    distinct time or bytes that are not UTF-8 without the file's name."""
    p = tmp_path / "t.csv"
    p.write_text("timestamp\n1\n2\n3\n4\nnan\n5\n")
    with pytest.raises(ValueError) as e:
        load_trace(p)
    assert str(e.value) == f"{p}:6: timestamp 'nan' is not a finite number of seconds"
    p.write_text("timestamp\n1\n1e400\n")
    with pytest.raises(ValueError, match=r"t.csv:3: timestamp '1e400' is not a finite number of seconds$"):
        load_trace(p)
    jsonl = tmp_path / "t.jsonl"
    jsonl.write_text('{"timestamp": 1}\n{"timestamp": 1e400}\n')
    # Read as a float's infinity, shown in JSON's word for it (Python's json writes and reads it): it was "inf".
    with pytest.raises(ValueError, match=r"t.jsonl:2: timestamp Infinity is not a finite number of seconds$"):
        load_trace(jsonl)
    p.write_text("timestamp\n1\n1\n")
    with pytest.raises(ValueError) as e:
        load_trace(p)
    assert str(e.value) == f"{p}: trace timestamps: expected at least two distinct; got 2 (1 distinct)"
    p.write_bytes(b"\xff\xfe garbage")
    with pytest.raises(ValueError) as e:
        load_trace(p)
    assert str(e.value) == f"{p}: not UTF-8 text (invalid start byte at byte 0)"


def test_parse_arrivals_bad_trace_scale(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("timestamp\n0\n1\n")
    with pytest.raises(ValueError, match=r"scale='fast' is neither a number > 0 nor 'auto'"):
        parse_arrivals(f"trace:{trace},scale=fast", 100)
    with pytest.raises(ValueError) as e:
        parse_arrivals(f"trace:{trace},scale=auto", 0)
    assert str(e.value) == f"arrivals 'trace:{trace},scale=auto': scale=auto needs a qps > 0; got 0"


def test_a_trace_path_may_hold_commas(tmp_path):
    """ "trace:calls,2026.csv" was the file "calls" with an option "2026.csv" ("expected key=value")."""
    trace = tmp_path / "calls,2026.csv"
    trace.write_text("timestamp\n0\n1\n2\n")
    # Three arrivals a second apart, then the wrap-around gap of their mean gap: 1 QPS recorded.
    assert parse_arrivals(f"trace:{trace}", 100).mean_rate == pytest.approx(1.0)
    assert parse_arrivals(f"trace:{trace},scale=2", 100).mean_rate == pytest.approx(2.0)
    with pytest.raises(ValueError, match=r"scale='fast' is neither a number > 0 nor 'auto'"):
        parse_arrivals(f"trace:{trace},scale=fast", 100)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Poisson(-1), "qps: expected a finite rate >= 0; got -1"),
        (lambda: Burst(1, 1, 5, 0), "sigma_s: expected a finite duration > 0 s; got 0"),
        (
            lambda: Burst(1, 1, 0, 1),
            "Burst duration_s: expected a duration when t0_s <= 0 (mean_rate averages over the step); "
            "got None with t0_s 0",
        ),
        (lambda: Sawtooth(1, 2, 0), "period_s: expected a finite duration > 0 s; got 0"),
        (lambda: TraceReplay([1.0, 1.0]), "trace timestamps: expected at least two distinct; got 2 (1 distinct)"),
        (lambda: TraceReplay([1.0, 2.0], sizes=[1]), "trace sizes: expected one per timestamp (2); got 1"),
        (lambda: TraceReplay([1.0, float("nan")]), "trace timestamps: expected finite numbers; got nan at index 1"),
        (
            lambda: TraceReplay([1.0, 2.0, 3.0], sizes=[1, -2, 3]),
            "trace sizes: expected integers >= 0; got -2 at index 1",
        ),
        (lambda: TraceReplay([1.0, 2.0], sizes=[1, 2.5]), "trace sizes: expected integers >= 0; got 2.5 at index 1"),
    ],
)
def test_constructor_errors(make, message):
    with pytest.raises(ValueError) as e:
        make()
    assert str(e.value) == message


def test_window_rate_is_the_schedules_mean_over_the_measured_window():
    saw = Sawtooth(500.0, 1500.0, 10.0)  # λ rises 100 QPS per second from 500
    # Over [1, 6) λ is linear, so its mean is λ at the midpoint 3.5 s: 850, not (500 + 1500) / 2.
    assert window_rate(saw, 1.0, 6.0) == pytest.approx(850.0)
    assert window_rate(saw, 0.0, 10.0) == pytest.approx(saw.mean_rate)  # a whole period
    assert window_rate(Poisson(QPS), 2.0, 7.0) == pytest.approx(QPS)
    with pytest.raises(ValueError) as e:
        window_rate(saw, 3.0, 3.0)
    assert str(e.value) == "window: expected end_s > start_s; got the empty [3, 3)"


def test_a_steps_burst_is_timed_from_the_warm_ups_start_and_its_window_offers_its_integral():
    """docs/bench.md's example: with --warmup 10s --step-duration 60s the runner gives the process the
    whole 70 s step (warm-up included), so a default burst, t0=50% and sigma=10%, peaks 35 s in, with
    σ 7 s, and the step's offered rate (its measured window, [10, 70)) is λ's integral there / 60 s."""
    warmup, total, q = 10.0, 70.0, 100.0
    burst = parse_arrivals("burst", q, duration_s=total)
    assert (burst.t0_s, burst.sigma_s, burst.amplitude_qps) == (35.0, 7.0, 400.0)

    def rate(t: float) -> float:
        return q + 400.0 * math.exp(-((t - 35.0) ** 2) / (2 * 7.0**2))

    in_window = integrate.quad(rate, warmup, total, points=[35.0])[0]
    # By hand: 60·100 + 400·7·√(2π)·(Φ(5) − Φ(−25/7)) = 6,000 + 7,017.1 requests, less 1.25 in the warm-up's tail.
    assert in_window == pytest.approx(6000 + 400 * 7 * math.sqrt(2 * math.pi) * (0.9999997 - 0.0001775), rel=1e-6)
    assert window_rate(burst, warmup, total) == pytest.approx(in_window / 60.0, rel=1e-9)
    # Drawn, seeded: the window's count over 20 steps is 20 times the integral, within 4σ of Poisson.
    rng = np.random.default_rng(21)
    counts = [int(np.count_nonzero(burst.times(total, rng) >= warmup)) for _ in range(20)]
    assert abs(sum(counts) - 20 * in_window) < 4 * math.sqrt(20 * in_window), counts
    # Centred in the window instead, as the docs say to: t0=40s, sigma=6s.
    centred = parse_arrivals("burst:t0=40s,sigma=6s", q, duration_s=total)
    assert (centred.t0_s, centred.sigma_s) == (40.0, 6.0)
    assert window_rate(centred, warmup, total) == pytest.approx(q + 400 * 6 * math.sqrt(2 * math.pi) / 60, rel=1e-6)


def test_nominal_for_solves_the_step_rate_that_offers_a_rate():
    # Poisson offers its step rate.
    assert nominal_for("poisson", 40.0, 4.0) == pytest.approx(40.0)
    # A default burst adds 4q·σ·√(2π)/D with σ = D/10 (the tails beyond ±5σ are under 1e-6):
    # it offers q·(1 + 0.4·√(2π)), so 40 QPS offered is 40 / 2.0027 = 19.97 per step.
    assert nominal_for("burst", 40.0, 600.0) == pytest.approx(40.0 / (1 + 0.4 * math.sqrt(2 * math.pi)), rel=1e-6)
    # A sawtooth from 0.5q to 1.5q over 10 s, run for 4 s, averages q·(0.5 + 0.4/2) = 0.7q.
    assert nominal_for("sawtooth", 40.0, 4.0) == pytest.approx(40.0 / 0.7)
    # An absolute amplitude is added, not scaled: q + 200·0.1·√(2π) = q + 50.13.
    assert nominal_for("burst:amplitude=200", 80.0, 60.0) == pytest.approx(80.0 - 20 * math.sqrt(2 * math.pi))


def test_nominal_for_a_step_of_about_one_request_is_the_rate_itself():
    """0.4 QPS for 2 s averages 0.8 requests: the one-request-per-step tolerance (1/2 s = 0.5 QPS)
    is larger than the rate, and the first guess's double (0.8 QPS, offering 0.8) used to pass it.
    Poisson and constant offer exactly their step rate, so the answer is 0.4 itself; a default burst
    over the whole 2 s (4x at 1 s, σ = 0.2 s, its tails beyond the step ~ e^-12.5) offers
    1 + 4 · 0.2 · √(2π) / 2 = 1 + 0.4·√(2π) times its step rate."""
    assert nominal_for("poisson", 0.4, 2.0) == 0.4
    assert nominal_for("constant", 0.4, 2.0) == 0.4
    assert nominal_for("burst", 0.4, 2.0) == pytest.approx(0.4 / (1 + 0.4 * math.sqrt(2 * math.pi)), rel=1e-6)


def test_nominal_for_refuses_rates_it_cannot_reach(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("timestamp\n0\n0.5\n1\n")
    with pytest.raises(ValueError, match="does not follow the step's QPS"):
        nominal_for(f"trace:{trace}", 40.0, 10.0)  # a fixed scale replays at its own pace
    assert nominal_for(f"trace:{trace},scale=auto", 40.0, 10.0) == pytest.approx(40.0, rel=0.01)
    with pytest.raises(ValueError) as e:
        nominal_for("burst:amplitude=200", 40.0, 60.0)
    # The burst alone offers 50 QPS: 40 + 50.13 at step rate 40, the lowest tried.
    assert str(e.value) == (
        "arrivals 'burst:amplitude=200': offers more than 40 QPS at any step rate above 0; got 90.1325 QPS at "
        "step rate 40 (an absolute burst amplitude or sawtooth bound sets a floor)"
    )


@pytest.mark.parametrize(
    ("spec", "refusal"),
    [
        ("٣,٤", "QPS steps '٣,٤': '٣' is not a number (numbers are read in ASCII: the digits 0-9)"),
        ("100,２００", "QPS steps '100,２００': '２００' is not a number (numbers are read in ASCII"),
        ("١:٨:٢", "QPS range '١:٨:٢': start '١' is not a number (numbers are read in ASCII"),
        ("1:8:２", "QPS range '1:8:２': factor '２' is not a number (numbers are read in ASCII"),
    ],
    ids=["arabic-indic", "fullwidth", "range", "range-factor"],
)
def test_steps_in_digits_other_than_ascii_are_refused(spec, refusal):
    """float() read "٣" as 3: `--steps ٣,٤` ramped at 3 and 4 QPS."""
    with pytest.raises(ValueError) as exc:
        parse_steps(spec)
    assert str(exc.value).startswith(refusal), str(exc.value)


@pytest.mark.parametrize(
    ("spec", "refusal"),
    [
        ("burst:amplitude=٤x", "amplitude='٤x' is neither a multiple of the step's rate"),
        ("sawtooth:high=٢٠٠", "high='٢٠٠' is neither a multiple of the step's rate"),
        ("burst:t0=٥٠%", "t0='٥٠%' is not a percentage >= 0 of the step"),
    ],
    ids=["rate-multiple", "rate", "percentage"],
)
def test_arrival_options_in_digits_other_than_ascii_are_refused(spec, refusal):
    with pytest.raises(ValueError, match=refusal):
        parse_arrivals(spec, 10.0, duration_s=10.0)


def test_a_trace_in_digits_other_than_ascii_is_refused(tmp_path):
    """A CSV cell (and a JSONL string) is text: float() read "١" as 1 second."""
    csv_path, jsonl_path = tmp_path / "t.csv", tmp_path / "t.jsonl"
    csv_path.write_text("timestamp\n0\n١\n")
    jsonl_path.write_text('{"timestamp": 0}\n{"timestamp": "１"}\n')
    with pytest.raises(ValueError, match="timestamp '١' is neither seconds nor an ISO 8601 time"):
        load_trace(csv_path)
    with pytest.raises(ValueError, match="timestamp '１' is neither seconds nor an ISO 8601 time"):
        load_trace(jsonl_path)
    csv_path.write_text("timestamp\n0\n1\n")
    with pytest.raises(ValueError, match="scale='٢' is neither a number > 0 nor 'auto'"):
        parse_arrivals(f"trace:{csv_path},scale=٢", 1.0)


@pytest.mark.parametrize(
    ("spec", "shown"),
    [
        ("burst:amplitude=4x\xa0", "amplitude='4x\\xa0' is neither a multiple of the step's rate"),
        ("sawtooth:high=200\u2003", "high='200\\u2003' is neither a multiple of the step's rate"),
        ("burst:t0=50%\xa0", "t0='50%\\xa0' is neither a duration"),
        ("burst:t0=5s\u200b", "t0='5s\\u200b' is neither a duration"),
    ],
    ids=["rate-multiple", "rate", "percentage", "duration"],
)
def test_an_arrival_options_refusal_shows_its_value_quoted_and_escaped(spec, shown):
    """The value was written bare: 'amplitude=4x  is neither a multiple …', its no-break space unseen (options
    trim ASCII white space alone since 0a657b6)."""
    with pytest.raises(ValueError) as e:
        parse_arrivals(spec, 10.0, duration_s=10.0)
    assert shown in str(e.value)


@pytest.mark.parametrize("header", ["timestamp\xa0,size", "timestamp,\u2003size", "timestamp,size\u3000"])
def test_a_trace_header_name_with_white_space_other_than_spaces_is_refused_naming_it(tmp_path, header):
    """str.strip() read 'timestamp\\xa0' as 'timestamp' unseen, where numbers trim ASCII white space alone;
    trimmed so, a 'size\\xa0' column would have been dropped without a word. ASCII's around a name is taken."""
    name = next(n for n in header.split(",") if n.strip(" \t") != n.strip())
    trace = tmp_path / "t.csv"
    trace.write_text(f"{header}\n0,1\n1,2\n", encoding="utf-8")
    with pytest.raises(ValueError) as e:
        load_trace(trace)
    shown = name.encode("unicode_escape").decode()
    column = header.split(",").index(name) + 1
    assert str(e.value) == (
        f"{trace}:1: CSV header column {column}, '{shown}': expected '{name.strip()}' with no white space around "
        "it but spaces, tabs and line ends; got other white space"
    )
    trace.write_text(" timestamp\t, size \n0,1\n1,2\n")
    assert load_trace(trace).sizes.tolist() == [1, 2]


@pytest.mark.parametrize(
    ("header", "column", "shown", "got"),
    [
        ("timestamp,size\u200b", 2, "size\\u200b", "U+200B ZERO WIDTH SPACE (category Cf)"),
        ("timestamp\u2060,size", 1, "timestamp\\u2060", "U+2060 WORD JOINER (category Cf)"),
        ("timestamp,\ufeffsize", 2, "\\ufeffsize", "U+FEFF ZERO WIDTH NO-BREAK SPACE (category Cf)"),
        ("timestamp,note,si\x07ze", 3, "si\\x07ze", "U+0007 (category Cc)"),
    ],
    ids=["zero-width-space", "word-joiner", "inner-bom", "control"],
)
def test_a_trace_header_name_with_a_character_not_printable_is_refused_naming_column_and_code_point(
    tmp_path, header, column, shown, got
):
    """'size\\u200b' is no white space, so neither trimmed nor refused: shown as 'size', it was another column, and
    the trace's sizes were dropped without a word ('timestamp\\u2060' was refused as missing, its column unnamed)."""
    trace = tmp_path / "t.csv"
    trace.write_text(f"{header}\n0,1,2\n1,2,3\n", encoding="utf-8")
    with pytest.raises(ValueError) as e:
        load_trace(trace)
    expected = f"{trace}:1: CSV header column {column}, '{shown}': expected printable characters alone; got {got}"
    assert str(e.value) == expected


CASE = "(names are matched case included); got another case"
QUOTES = "(a quote opens quoting only first in its field or after spaces); got it in quotes, read as part of the name"


@pytest.mark.parametrize(
    ("header", "refusal"),
    [
        ("note,Size,\t timestamp ", f"column 2, 'Size': expected 'size' {CASE}"),
        ("TIMESTAMP,size", f"column 1, 'TIMESTAMP': expected 'timestamp' {CASE}"),
        ('timestamp,\t"size"', f"column 2, '\"size\"': expected 'size' {QUOTES}"),
    ],
    ids=["size-case", "timestamp-case", "quoted-after-a-tab"],
)
def test_a_trace_header_name_known_but_for_case_or_quotes_is_refused_naming_it_and_the_spelling(
    tmp_path, header, refusal
):
    """Names are matched exactly, case included (docs/bench.md): `Size` was another column, ignored, so the trace's
    sizes were dropped without a word, and `TIMESTAMP` was refused as no 'timestamp' column, its own unnamed. The
    csv module reads a quote as quoting only first in its field or after spaces: after a tab, '"size"' with its
    quotes was another column, ignored."""
    trace = tmp_path / "t.csv"
    trace.write_text(f"{header}\n" + "0,1,2\n1,2,3\n")
    with pytest.raises(ValueError) as e:
        load_trace(trace)
    assert str(e.value) == f"{trace}:1: CSV header {refusal}"
    trace.write_text("note,Sizes,\t timestamp \n" + "x,7,0\nx,8,1\n")  # a name of another column is still ignored
    assert load_trace(trace).sizes is None


@pytest.mark.parametrize(
    ("char", "shown"),
    [
        ("\v", "\\x0b"),
        ("\f", "\\x0c"),
        ("\x1c", "\\x1c"),
        ("\x1d", "\\x1d"),
        ("\x1e", "\\x1e"),
        ("\x85", "\\x85"),
        ("\u2028", "\\u2028"),
        ("\u2029", "\\u2029"),
    ],
    ids=["vt", "ff", "fs", "gs", "rs", "nel", "line-separator", "paragraph-separator"],
)
def test_a_character_str_splitlines_breaks_at_stays_in_its_csv_cell_and_is_refused_there(tmp_path, char, shown):
    """CSV's line ends are \\n, \\r\\n and \\r: str.splitlines() also broke at these, so '0,1<char>2,3' was read as two
    arrivals, 0 and 2, without a word (and sizes 1 and 3); now the cell '1<char>2' is the size, refused as numbers
    refuse it, on its line, and one in a timestamp is refused as that."""
    trace = tmp_path / "t.csv"
    trace.write_text(f"timestamp,size\n0,1{char}2,3\n1,4\n", encoding="utf-8")
    with pytest.raises(ValueError) as e:
        load_trace(trace)
    assert str(e.value) == f"{trace}:2: size '1{shown}2' is not an integer >= 0"
    trace.write_text(f"timestamp\n0\n1{char}5\n", encoding="utf-8")
    with pytest.raises(ValueError) as e:
        load_trace(trace)
    assert str(e.value) == f"{trace}:3: timestamp '1{shown}5' is neither seconds nor an ISO 8601 time"


def test_a_trace_splits_lines_at_csv_line_ends_alone_and_a_jsonl_string_keeps_a_line_separator(tmp_path):
    """\\r\\n, \\r and \\n end lines, numbered as an editor numbers them; a JSON string may hold U+2028 as it is (JSON
    needs no escape for it), which str.splitlines() cut in two: the line was refused as not JSON."""
    trace = tmp_path / "t.csv"
    trace.write_text("timestamp,size\r\n0,1\r1,2\n2,x\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"t.csv:4: size 'x' is not an integer >= 0"):
        load_trace(trace)
    trace.write_text("timestamp,size\r\n0,1\r1,2\n2,3\n", encoding="utf-8")
    assert load_trace(trace).sizes.tolist() == [1, 2, 3]
    jsonl = tmp_path / "t.jsonl"
    jsonl.write_text('{"timestamp": 0, "note": "a\u2028b"}\n{"timestamp": 1}\n', encoding="utf-8")
    assert load_trace(jsonl).offsets.size == 2


def test_a_trace_skips_comment_and_blank_lines_as_a_sizes_file_does(tmp_path):
    """A sizes file of one integer a line took `#` comments; a trace's first made its header ('# recorded …' has no
    'timestamp' column), one among its rows a timestamp refused, and a JSONL trace's first made it read as CSV.
    Line numbers still count every line."""
    trace = tmp_path / "t.csv"
    trace.write_text("# recorded 2026-12-06\n\ntimestamp,size\n0,1\n  # a pause\n \t\n1,2\n")
    assert load_trace(trace).sizes.tolist() == [1, 2]
    trace.write_text("# recorded 2026-12-06\ntimestamp,size\n0,1\n# a pause\n1,x\n")
    with pytest.raises(ValueError, match=r"t.csv:5: size 'x' is not an integer >= 0"):
        load_trace(trace)
    jsonl = tmp_path / "t.txt"
    jsonl.write_text('# recorded 2026-12-06\n{"timestamp": 0, "size": 3}\n# a pause\n{"timestamp": 1, "size": 4}\n')
    assert load_trace(jsonl).sizes.tolist() == [3, 4]


@pytest.mark.parametrize("header", ['timestamp, "size"', '"timestamp" , "size" ', ' "timestamp",  "size"'])
def test_a_trace_header_name_quoted_after_spaces_is_read(tmp_path, header):
    """A space before its quote kept the quotes in the name ('"size"'), so the column was ignored, its sizes dropped
    without a word (skipinitialspace, as the csv module offers it); a cell's quotes after spaces are read too."""
    trace = tmp_path / "t.csv"
    trace.write_text(f'{header}\n0, "1"\n1,2\n')
    assert load_trace(trace).sizes.tolist() == [1, 2]


def test_a_trace_keeps_rows_whose_first_cell_of_another_column_starts_with_a_hash(tmp_path):
    """'#1' is an id where the first column is not `timestamp` or `size`: a `#` line among the rows is a row
    there (comments before the header are still skipped); the rows were dropped without a word."""
    trace = tmp_path / "t.csv"
    trace.write_text("# recorded\nid,timestamp,size\n#1,0,1\nx,1,2\n#3,2,3\n")
    assert load_trace(trace).sizes.tolist() == [1, 2, 3]


def test_a_quoted_cell_keeps_its_blank_and_hash_lines_and_the_rows_after_it(tmp_path):
    """A quoted cell spanning lines is one row: its `# b` line was skipped as a comment, so the quote never closed
    and swallowed every row after it, without a word."""
    trace = tmp_path / "t.csv"
    trace.write_text('timestamp,size,note\n0,1,"a\n\n# b"\n1,2,c\n2,3,d\n')
    assert load_trace(trace).sizes.tolist() == [1, 2, 3]


@pytest.mark.parametrize("other", ['"Latency\r\n(ms)"', "Request\xa0ID", '"a\tb"', "Size"])
def test_a_trace_header_of_another_column_a_spreadsheet_writes_is_ignored(tmp_path, other):
    """A name that does not show as `timestamp` or `size` is another column's, ignored, whatever it holds: a
    spreadsheet's header cell with a line break or a no-break space was refused, and so was 'Size' beside 'size'."""
    trace = tmp_path / "t.csv"
    trace.write_text(f"timestamp,size,{other}\r\n0,1,x\r\n1,2,y\r\n", encoding="utf-8")
    assert load_trace(trace).sizes.tolist() == [1, 2]


def trace_refusal(trace, text: str) -> str:
    """The refusal of a trace `text` written to `trace`."""
    trace.write_text(text, encoding="utf-8")
    with pytest.raises(ValueError) as e:
        load_trace(trace)
    return str(e.value)


@pytest.mark.parametrize(
    ("text", "refusal"),
    [
        ("# recorded\n\n#\ntimestamp,Size\n0,1\n", f":4: CSV header column 2, 'Size': expected 'size' {CASE}"),
        (
            "\n# recorded\nnote,timestamp\xa0\nx,0\n",
            ":3: CSV header column 2, 'timestamp\\xa0': expected 'timestamp' with no white space around it but "
            "spaces, tabs and line ends; got other white space",
        ),
        (
            '# a\n"time\nof day",size\n0,1\n',
            ":3: CSV header: expected a 'timestamp' column; got 'time\\nof day', 'size'",
        ),
    ],
    ids=["case-after-comments", "white-space-after-comments", "no-timestamp-spanning-lines"],
)
def test_a_trace_header_refusal_names_the_header_line_and_column(tmp_path, text, refusal):
    """A header may follow comment and blank lines (since ad2f9c5), but its refusals named the file alone, where a
    row's name its line; 'timestamp\\xa0' was refused without its column number, where the other names are. A
    header whose quoted name spans lines is named by its last, as such a row is."""
    trace = tmp_path / "t.csv"
    assert trace_refusal(trace, text) == f"{trace}{refusal}"


@pytest.mark.parametrize(
    "text",
    [
        "#timestamp,size\n0,1\n1,2\n",
        "# recorded 2026-12-06\n# timestamp, size\n\n0,1\n# a pause\n1,2\n",
        "\t#  timestamp ,size,note\n0,1,a\n1,2,b\n",
    ],
    ids=["bare", "after-a-comment-and-before-a-blank", "spaces-around"],
)
def test_a_trace_header_commented_out_is_its_header(tmp_path, text):
    """Some tools write the header as a comment: it was skipped, the first row read as the header, and the trace
    refused as having no 'timestamp' column ("got '0', '1'")."""
    trace = tmp_path / "t.csv"
    trace.write_text(text)
    replay = load_trace(trace)
    assert (replay.offsets.tolist(), replay.sizes.tolist()) == ([0.0, 1.0], [1, 2])


def test_a_trace_header_commented_out_is_read_as_a_header_is(tmp_path):
    """Its refusals name its line, as a header's do; the rows after it keep their `#` lines in quoted cells and
    their line numbers; a header below a comment that names the columns is the header, as before."""
    trace = tmp_path / "t.csv"
    refusal = trace_refusal(trace, "# a\n#Timestamp,size\n0,1\n")
    assert refusal == f"{trace}:2: CSV header column 1, 'Timestamp': expected 'timestamp' {CASE}"
    refusal = trace_refusal(trace, '#timestamp,size,note\n0,1,"a\n# b"\n# c\n1,x,d\n')
    assert refusal == f"{trace}:5: size 'x' is not an integer >= 0"
    fields, header, rows = csv_rows('#timestamp,size,note\n0,1,"a\n# b"\n', ("timestamp", "size"), trace)
    assert (fields, header, list(rows)) == (
        ["timestamp", "size", "note"],
        1,
        [(3, {"timestamp": "0", "size": "1", "note": "a\n# b"})],
    )
    trace.write_text("# timestamp,size\ntimestamp,size\n0,1\n1,2\n")
    assert load_trace(trace).sizes.tolist() == [1, 2]
    trace.write_text("# size,n\n#timestamp,size\n# recorded\n0,1\n1,2\n")  # the last comment naming a column
    assert load_trace(trace).sizes.tolist() == [1, 2]
    refusal = trace_refusal(trace, "# recorded\ntime,size\n0,1\n")  # a header of a known column is the header
    assert refusal == f"{trace}:2: CSV header: expected a 'timestamp' column; got 'time', 'size'"


@pytest.mark.parametrize(
    "text",
    ["# recorded 2026-12-06, timestamp, size\n0.1,4\n0.2,8\n", "# timestamp\n0.1,4\n0.2,8\n"],
    ids=["3-of-2", "1-of-2"],
)
def test_a_comment_of_another_cell_count_than_the_first_row_is_no_header(tmp_path, text):
    """Prose naming a column is no header: read as one, the sizes were the timestamps, or dropped, unseen."""
    trace = tmp_path / "t.csv"
    assert trace_refusal(trace, text) == f"{trace}:2: CSV header: expected a 'timestamp' column; got '0.1', '4'"
