"""The batcher simulator against queueing theory: M/D/1 and M/D/c by their closed forms (with tolerances
from each run's own batch-means confidence interval), D/D/1 and D/D/c exactly, the sample-path laws
(Little's, the busy identity U = λ'·(α / b + β) that `wok plan` bounds, the ceiling m·n / T(n) that
`wok tune` bisects below) in every arrival shape, and the percentiles' definition on simulated latencies."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import poisson

from wok.bench.arrivals import parse_arrivals
from wok.bench.simulate import BatcherModel, SimConfig, simulate, simulate_step
from wok.bench.tune import ceiling_qps

MS = 1e-3
D = 1 * MS  # the service time of batches of one: T(1) = α

# Batch means: 40 batches of consecutive requests. Waits are correlated over about 1 / (1 − ρ)² arrivals
# (25 at ρ = 0.8), far fewer than a batch's 5,000, so the batches' means are close to independent and
# their spread gives the standard error of the run's mean. The checks allow 4 of them (Student's t with
# 39 degrees of freedom: a correct simulator fails one with probability 3·10⁻⁴; the seeds are fixed).
BATCHES = 40
Z = 4.0


def batch_means(x: np.ndarray) -> tuple[float, float]:
    """The mean of `x` and its standard error by batch means (`BATCHES` consecutive parts)."""
    means = np.array([part.mean() for part in np.array_split(x, BATCHES)])
    return float(x.mean()), float(means.std(ddof=1) / np.sqrt(BATCHES))


def quantile_interval(x: np.ndarray, p: float) -> tuple[float, float, float]:
    """The nearest-rank p-quantile of `x` (the ⌈p·n⌉-th smallest) and the order statistics of ranks ⌈(p ∓ Z·s)·n⌉
    around it: the true quantile q lies between them when the share of `x` at most q is within Z·s of p. s is that
    share's standard error, by batch means of the indicator x ≤ the sample quantile: consecutive waits are
    correlated, and the binomial √(p(1 − p) / n) of independent draws is less than half of it at ρ = 0.5."""
    xs = np.sort(x)
    n = len(xs)

    def rank(share: float) -> float:
        return float(xs[min(max(int(np.ceil(share * n)), 1), n) - 1])

    _, s = batch_means((x <= rank(p)).astype(np.float64))
    return rank(p), rank(p - Z * s), rank(p + Z * s)


def poisson_run(rho: float, instances: int, count: int, seed: int):
    """Batches of one, no window, T = D, Poisson λ = ρ·c / D: an M/D/c queue. Its arrivals and run."""
    lam = rho * instances / D
    arrivals = np.cumsum(np.random.default_rng(seed).exponential(1 / lam, count))
    model = BatcherModel(alpha_s=D, beta_s=0.0, max_batch_size=1, max_queue_delay_s=0.0, instances=instances)
    run = simulate(arrivals, model)
    return arrivals, run


def mdc_mean_wait(lam: float, d: float, c: int) -> float:
    """The exact mean wait of M/D/c (Crommelin 1932, in the form of Franx 2001), a = λ·d offered Erlangs:

    E[W] = d · Σ_{k≥1} ( P(Poisson(k·a) ≥ k·c) − (c / a) · P(Poisson(k·a) ≥ k·c + 1) )

    (each term e^{−ka}·Σ_{j≥kc} (ka)^j / j! − (c/a)·e^{−ka}·Σ_{j≥kc+1} (ka)^j / j!). The terms fall
    geometrically in k for a < c."""
    a = lam * d
    total, first = 0.0, 1
    while first < 10**6:
        k = np.arange(first, first + 1000)
        terms = poisson.sf(k * c - 1, k * a) - (c / a) * poisson.sf(k * c, k * a)
        total += float(terms.sum())
        if abs(terms[-1]) < 1e-15 * total:
            return d * total
        first += 1000
    raise ValueError(f"M/D/c mean wait: expected a < c (a stable queue); got a = {a}, c = {c}")


# ------------------------------------------------------------------------------------------ M/D/1, M/D/c


@pytest.mark.parametrize("rho", [0.3, 0.8])
def test_md1_waits_none_with_probability_one_minus_rho_and_on_average_pollaczek_khinchine(rho):
    # Poisson arrivals see time averages (PASTA): a request finds the one instance free, and waits exactly 0,
    # with the probability the instance is idle, 1 − ρ. Its mean wait is Pollaczek–Khinchine's ρD / (2(1 − ρ)).
    arrivals, run = poisson_run(rho, 1, 200_000, seed=11)
    wait = run.started - arrivals
    idle, idle_se = batch_means((wait == 0).astype(np.float64))
    assert abs(idle - (1 - rho)) <= Z * idle_se, (idle, idle_se)
    mean, mean_se = batch_means(wait)
    pk = rho * D / (2 * (1 - rho))
    assert abs(mean - pk) <= Z * mean_se, (mean, mean_se, pk)
    # The interval is narrow enough to mean something: within 5 % of 1 − ρ and 10 % of the P-K mean.
    assert Z * idle_se < 0.05 * (1 - rho) and Z * mean_se < 0.1 * pk


def test_the_mdc_formula_is_pollaczek_khinchine_for_one_instance():
    # The closed form used below, at c = 1, against P-K: a check of its transcription, not of the simulator.
    for rho in (0.1, 0.5, 0.8, 0.95):
        assert mdc_mean_wait(rho / D, D, 1) == pytest.approx(rho * D / (2 * (1 - rho)), rel=1e-9)


@pytest.mark.parametrize("instances", [2, 3])
def test_mdc_mean_wait_matches_crommelins_closed_form(instances):
    # c instances, each 80 % busy. The exact M/D/c mean waits: 0.9033 ms for c = 2, 0.5539 ms for c = 3
    # (against 2 ms for M/D/1 at the same ρ: pooling instances shortens the wait).
    rho = 0.8
    lam = rho * instances / D
    want = mdc_mean_wait(lam, D, instances)
    assert want == pytest.approx({2: 0.90328e-3, 3: 0.55390e-3}[instances], rel=1e-4)
    arrivals, run = poisson_run(rho, instances, 200_000, seed=5)
    wait = run.started - arrivals
    mean, se = batch_means(wait)
    assert abs(mean - want) <= Z * se, (mean, se, want)
    assert Z * se < 0.1 * want
    # Request by request, FIFO with a constant service time: the c-th request back frees the first instance,
    # so a request starts at max(its arrival, the start of the c-th before it + D), exactly (Kiefer–Wolfowitz).
    start = run.started
    np.testing.assert_array_equal(start[:instances], arrivals[:instances])
    np.testing.assert_allclose(
        start[instances:], np.maximum(arrivals[instances:], start[:-instances] + D), rtol=0, atol=1e-12
    )


# ------------------------------------------------------------------------------------------ D/D/1, D/D/c


@pytest.mark.parametrize(("qps", "instances"), [(900.0, 1), (1800.0, 2), (2000.0, 2)], ids=["1", "2", "2-full"])
def test_dd_below_or_at_capacity_never_waits(qps, instances):
    # Evenly spaced arrivals, 1 / λ apart, batches of one taking D: with λ ≤ c / D each instance is free by
    # the time its next request (every c-th) comes, c / λ ≥ D later. Every latency is D, every wait 0, and
    # each instance is busy λ·D / c of the window, exactly but for the batch the window's end cuts (1 ms of 10 s).
    model = BatcherModel(alpha_s=D, beta_s=0.0, max_batch_size=1, max_queue_delay_s=0.0, instances=instances)
    cfg = SimConfig(model=model, steps=[qps], step_duration_s=10.0, warmup_s=1.0, arrival="constant")
    step = simulate_step(cfg, qps, np.random.default_rng(0))
    lat = step["latency_ms"]
    assert lat["p50"] == pytest.approx(1.0) and lat["max"] == pytest.approx(1.0)
    # (At exactly c / D, an instance frees at (k − c) / λ + D, which rounds a nanosecond past k / λ.)
    assert step["queue_ms"] == {"mean": pytest.approx(0.0, abs=1e-8), "p99": pytest.approx(0.0, abs=1e-8)}
    assert step["utilization"] == pytest.approx(qps * D / instances, abs=D / 10.0)


def test_dd1_past_capacity_the_nth_request_waits_n_times_the_deficit():
    # λ = 1,250/s into one instance serving 1,000/s: request k arrives at k·0.8 ms and starts at k·1 ms,
    # so it waits k·(D − 1/λ) = k·0.2 ms, the queue growing by one every 5 ms.
    arrivals = np.arange(5000) / 1250.0
    model = BatcherModel(alpha_s=D, beta_s=0.0, max_batch_size=1, max_queue_delay_s=0.0)
    run = simulate(arrivals, model)
    np.testing.assert_allclose(run.started - arrivals, np.arange(5000) * 0.2 * MS, rtol=0, atol=1e-12)


# -------------------------------------------------------------------------------- laws in every arrival shape

BATCHED = BatcherModel(alpha_s=1 * MS, beta_s=0.25 * MS, max_batch_size=8, max_queue_delay_s=2 * MS, instances=2)


def _trace(tmp_path) -> str:
    # 6,000 requests in clumps of 1 to 6 at the same instant (ties the simulator must order), 1,800/s on average.
    rng = np.random.default_rng(4)
    at = np.repeat(np.cumsum(rng.exponential(1 / 600, 2000)), rng.integers(1, 7, 2000))[:6000]
    path = tmp_path / "trace.csv"
    path.write_text("timestamp\n" + "".join(f"{float(t)!r}\n" for t in at))
    return f"trace:{path}"


SHAPES = {
    "constant": "constant",
    "poisson": "poisson",
    "burst": "burst:amplitude=4x,t0=50%,sigma=0.5s",  # a peak of 5 × 1,800 = 9,000/s, past the 5,333/s ceiling
    "sawtooth": "sawtooth:low=0.2x,high=1.8x,period=1s",  # 360 to 3,240/s
    "trace": None,
}


def integral(up: np.ndarray, down: np.ndarray, *, ups_first: bool) -> tuple[float, int]:
    """∫ N(t) dt and max N(t), N the count of `up` times passed less `down` times passed, by a sweep over
    the events. At equal times the simulator's order: a request joins the queue before the batch that takes
    it leaves (`ups_first`); a batch ends before the next starts on its instance."""
    times = np.concatenate([up, down])
    steps = np.concatenate([np.ones(up.size), -np.ones(down.size)])
    order = np.lexsort((-steps if ups_first else steps, times))
    times, count = times[order], np.cumsum(steps[order])
    assert count.min() >= 0  # nothing leaves before it came
    return float((count[:-1] * np.diff(times)).sum()), int(count.max())


@pytest.mark.parametrize("shape", SHAPES)
def test_littles_law_and_the_queue_bound_hold_in_every_arrival_shape(shape, tmp_path):
    # Two instances, batches of up to 8, a 2 ms window, a queue bound of 64 (the burst's peak is refused in
    # part). Over a whole run, the time-average number in the queue (in the system) is the accepted
    # arrival rate times the mean wait in the queue (latency): L = λW on the sample path, where ∫N dt is a
    # sweep over the events and λW the sum of the requests' own times, two sums of the same area.
    spec = SHAPES[shape] or _trace(tmp_path)
    model = BatcherModel(**{**BATCHED.__dict__, "max_queue_size": 64})
    arrivals = parse_arrivals(spec, 1800.0, duration_s=3.0).times(3.0, np.random.default_rng(8))
    run = simulate(arrivals, model)
    ok = ~run.rejected
    a, s, d = arrivals[ok], run.started[ok], run.done[ok]
    assert np.isfinite(d).all() and (s >= a).all() and (d > s).all()
    end = float(d.max())
    lam = ok.sum() / end
    in_queue, most_queued = integral(a, s, ups_first=True)
    in_system, _ = integral(a, d, ups_first=False)
    in_service, most_served = integral(s, d, ups_first=False)
    assert in_queue / end == pytest.approx(lam * (s - a).mean(), rel=1e-9)
    assert in_system / end == pytest.approx(lam * (d - a).mean(), rel=1e-9)
    assert in_service / end == pytest.approx(lam * (d - s).mean(), rel=1e-9)
    # The bound counts the queue only; at most two batches of 8 are in service.
    assert most_queued <= 64 and most_served <= 2 * 8
    assert run.rejected.any() == (shape == "burst")


@pytest.mark.parametrize("shape", SHAPES)
def test_utilization_is_the_plans_busy_identity_in_every_arrival_shape(shape, tmp_path):
    # `wok plan` (docs/plan.md, "Do batches fill?"): λ' / b batches a second of α + β·b seconds each, so an
    # instance is busy U = λ'·(α / b + β), λ' = λ / m its share, b the mean batch. On a step's own figures
    # (achieved λ, mean_batch_size b, utilization U) that holds but for the window's edges: the busy time
    # counts the batches started in the window, X = Σ T(k), less what the end cuts (≤ m·T(8)); λ·D·(α/b + β)
    # is X·C / Σk, C the window's completions, which differ from the Σk of its batches by at most m·8 at
    # each edge. So |U·m·D − λ·D·(α/b + β)| ≤ m·T(8) + X·2m·8 / Σk.
    spec = SHAPES[shape] or _trace(tmp_path)
    cfg = SimConfig(model=BATCHED, steps=[1800.0], step_duration_s=2.5, warmup_s=0.5, arrival=spec)
    step = simulate_step(cfg, 1800.0, np.random.default_rng(3))
    m, dur, b, lam = 2, 2.5, step["mean_batch_size"], step["achieved_qps"]
    busy = step["utilization"] * m * dur
    identity = lam * dur * (BATCHED.alpha_s / b + BATCHED.beta_s)
    batched = lam * dur  # Σk, to within the edges' 2m·8 requests
    slack = m * BATCHED.batch_time(8) + busy * 2 * m * 8 / (batched - 2 * m * 8)
    assert abs(busy - identity) <= slack, (busy, identity, slack)
    assert slack < 0.02 * busy  # tight enough to tell U = λ'(α / b + β) from, say, λ'·T(b) / b with b ≥ 2


@pytest.mark.parametrize("instances", [1, 2])
def test_saturated_throughput_is_the_ceiling_tune_bisects_below(instances):
    # Offered twice the ceiling: the queue always holds 8 when an instance frees, so every batch is full and
    # the instances never idle; the window's completions are m·8 / T(8) a second, `wok tune`'s ceiling_qps
    # (2,000/s an instance, T(8) = 4 ms), but for the batches in flight at each of the window's edges (m·8
    # requests each, of 10 s).
    model = BatcherModel(**{**BATCHED.__dict__, "alpha_s": 2 * MS, "instances": instances})
    top = ceiling_qps(model)
    assert top == pytest.approx(instances * 8 / (2 * MS + 8 * 0.25 * MS))
    cfg = SimConfig(model=model, steps=[2 * top], step_duration_s=10.0, warmup_s=1.0)
    step = simulate_step(cfg, 2 * top, np.random.default_rng(1))
    # (The busy time is a sum of overlaps: with two instances it rounds to 1 − 10⁻¹³.)
    assert step["mean_batch_size"] == 8.0 and step["utilization"] == pytest.approx(1.0, abs=1e-12)
    assert abs(step["achieved_qps"] - top) <= 2 * instances * 8 / 10.0


# --------------------------------------------------------------------------------- the reported percentiles


def test_a_steps_latency_percentiles_are_nearest_rank_of_the_simulated_latencies():
    # One arrival a millisecond into batches of 4 that leave full (the window never runs out) and take
    # 0.5 ms: the four of each batch finish 3.5, 2.5, 1.5 and 0.5 ms after they came, 250 times each.
    # Nearest rank (the ⌈p·n⌉-th smallest of 1,000): P50 the 500th, 1.5 ms; P90 the 900th, 3.5 ms. numpy's
    # default (linear) P50 would be 2.0 ms, halfway to the 501st.
    model = BatcherModel(alpha_s=0.5 * MS, beta_s=0.0, max_batch_size=4, max_queue_delay_s=10 * MS)
    cfg = SimConfig(model=model, steps=[1000.0], step_duration_s=1.0, arrival="constant")
    lat = simulate_step(cfg, 1000.0, np.random.default_rng(0))["latency_ms"]
    assert lat == {
        "mean": pytest.approx(2.0),
        "p50": pytest.approx(1.5),
        **dict.fromkeys(("p90", "p95", "p99", "p999", "max"), pytest.approx(3.5)),
    }
