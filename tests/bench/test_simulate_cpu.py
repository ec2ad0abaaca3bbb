"""The simulator's CPU stage (the event loop as a FIFO server, cores shared) against queueing theory
and hand-worked schedules."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from wok.bench.simulate import BatcherModel, SimConfig, simulate, simulate_step

MS = 1e-3


def in_system(arrivals: np.ndarray, left: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """How many requests had arrived and not yet left at each grid time."""
    return np.searchsorted(np.sort(arrivals), grid, side="right") - np.searchsorted(np.sort(left), grid, side="right")


def lindley_waits(arrivals: np.ndarray, d: float) -> np.ndarray:
    """FIFO single-server waits with service time d, by Lindley's recursion."""
    waits = np.empty_like(arrivals)
    w = 0.0
    gaps = np.diff(arrivals, prepend=arrivals[0]).tolist()
    for i, gap in enumerate(gaps):
        w = max(0.0, w + d - gap) if i else 0.0
        waits[i] = w
    return waits


# The P-K check's tolerance is about 3 standard errors of the mean wait over 100,000 arrivals
# (waits are correlated over ~1/(1 - ρ)² arrivals): over 12 seeds its relative error spreads by
# 1.3 % (one SD) at ρ 0.3, 1.1 % at 0.6 and 3.5 % at 0.9. The simulator itself is held request by
# request to Lindley's recursion, exactly, which takes no more arrivals.
@pytest.mark.parametrize(("rho", "rel"), [(0.3, 0.04), (0.6, 0.035), (0.9, 0.11)])
def test_the_loop_alone_is_md1_pollaczek_khinchine(rho, rel):
    # The batcher out of the way (batches of one that take no time): the loop's first pass is
    # an M/D/1 queue with service D = c_in. Pollaczek–Khinchine: Wq = ρD / (2(1 − ρ)).
    d = 1 * MS
    lam = rho / d
    arrivals = np.cumsum(np.random.default_rng(7).exponential(1 / lam, 100_000))
    model = BatcherModel(alpha_s=1e-12, beta_s=0.0, max_batch_size=1, max_queue_delay_s=0.0, cpu_in_s=d)
    run = simulate(arrivals, model)
    wait = run.enqueued - arrivals - d
    assert wait.min() >= -1e-12
    # Request by request, the wait is the queue's own: Lindley's recursion on the same arrivals.
    np.testing.assert_allclose(wait, lindley_waits(arrivals, d), rtol=0, atol=1e-9)
    assert wait.mean() == pytest.approx(rho * d / (2 * (1 - rho)), rel=rel)
    # Little's law on the loop stage: the number in it, sampled on a fine grid, is λ times the
    # mean time in it.
    grid = np.linspace(arrivals[0], arrivals[-1], 100_000)
    measured = in_system(arrivals, run.enqueued, grid).mean()
    assert measured == pytest.approx(lam * (run.enqueued - arrivals).mean(), rel=0.02)


def test_without_cpu_work_the_staged_run_is_the_batcher_alone():
    # Bounded cores that never bind switch the staged path on with c_in = c_out = 0: the same
    # schedule as the batcher-only simulation, to rounding.
    arrivals = np.cumsum(np.random.default_rng(3).exponential(1 / 2000, 20_000))
    plain = BatcherModel(alpha_s=1 * MS, beta_s=0.2 * MS, max_batch_size=8, max_queue_delay_s=2 * MS, instances=2)
    staged = BatcherModel(**{**plain.__dict__, "cores": 100.0})
    a, b = simulate(arrivals, plain), simulate(arrivals, staged)
    np.testing.assert_allclose(b.done, a.done, rtol=0, atol=1e-9)
    assert b.batch_sizes == a.batch_sizes
    np.testing.assert_allclose(b.enqueued, arrivals)


def test_one_core_shared_by_the_loop_and_the_batch_by_hand():
    # c_in = 1 ms, c_out = 0.5 ms, T = 2 ms, batches of one, 1 core, arrivals at 0 and 0.5 ms.
    #   0–1: request 0's first pass alone → queued at 1, its batch starts (2 ms of work).
    #   1–3: request 1's first pass and the batch share the core (half speed each): request 1
    #        is queued at 3; the batch has 1 ms left.
    #   3–4: the batch alone: done at 4. Request 0's second pass and request 1's batch start.
    #   4–5: both at half speed: request 0 answered at 5; the batch has 1.5 ms left.
    #   5–6.5: the batch alone; 6.5–7: request 1's second pass alone → answered at 7.
    model = BatcherModel(alpha_s=2 * MS, beta_s=0.0, max_batch_size=1, max_queue_delay_s=0.0,
                         cpu_in_s=1 * MS, cpu_out_s=0.5 * MS, cores=1.0)  # fmt: skip
    run = simulate(np.array([0.0, 0.5 * MS]), model)
    np.testing.assert_allclose(run.enqueued, [1 * MS, 3 * MS], atol=1e-12)
    np.testing.assert_allclose(run.done, [5 * MS, 7 * MS], atol=1e-12)


def test_background_demand_slows_what_runs_by_hand():
    # 2 cores, 1 core of background, c_in = 1 ms, T = 2 ms: the loop alone fits (1 + 1 ≤ 2), the
    # loop and a batch together do not (demand 3): each runs at 2/3 speed.
    #   0–1: request 0's first pass; 1–2.5: request 1's (1 ms at 2/3) beside the batch, which
    #   does 1 ms of its 2; 2.5–3.5: the batch alone at full speed → request 0 done at 3.5;
    #   then request 1's batch alone → 5.5.
    model = BatcherModel(alpha_s=2 * MS, beta_s=0.0, max_batch_size=1, max_queue_delay_s=0.0,
                         cpu_in_s=1 * MS, cores=2.0, background_cores=1.0)  # fmt: skip
    run = simulate(np.array([0.0, 0.5 * MS]), model)
    np.testing.assert_allclose(run.enqueued, [1 * MS, 2.5 * MS], atol=1e-12)
    np.testing.assert_allclose(run.done, [3.5 * MS, 5.5 * MS], atol=1e-12)
    # The per-request part: 1,000 QPS × 1 ms is the same 1 core.
    per_request = BatcherModel(**{**model.__dict__, "background_cores": 0.0, "background_cpu_s": 1 * MS})
    assert per_request.background_demand(1000.0) == pytest.approx(1.0)
    assert simulate(np.array([0.0, 0.5 * MS]), per_request, until=2 / 1000).done == pytest.approx(run.done)


def test_the_delay_window_counts_from_when_the_loop_queues_the_request():
    # A lone request: c_in, then the whole window, then the batch, then c_out.
    model = BatcherModel(alpha_s=1 * MS, beta_s=0.5 * MS, max_batch_size=4, max_queue_delay_s=5 * MS,
                         cpu_in_s=0.2 * MS, cpu_out_s=0.1 * MS)  # fmt: skip
    arrivals = np.arange(0, 0.1, 0.010)
    run = simulate(arrivals, model)
    np.testing.assert_allclose(run.done - arrivals, (0.2 + 5 + 1 + 0.5 + 0.1) * MS, atol=1e-12)


@pytest.mark.parametrize(
    ("changes", "ceiling"),
    [
        # The loop alone bounds it: 1 / (c_in + c_out).
        ({"cpu_in_s": 1 * MS}, 1000.0),
        ({"cpu_in_s": 0.6 * MS, "cpu_out_s": 0.4 * MS}, 1000.0),
        # One core for the loop and the batches: cores / (their CPU per request), which they
        # reach because the loop, always busy, keeps the core busy.
        ({"cpu_in_s": 0.5 * MS, "alpha_s": 0.5 * MS, "cores": 1.0}, 1000.0),
    ],
)
def test_under_saturation_throughput_approaches_the_cpu_ceiling(changes, ceiling):
    base = {"alpha_s": 1e-9, "beta_s": 0.0, "max_batch_size": 1, "max_queue_delay_s": 0.0}
    model = BatcherModel(**{**base, **changes})
    assert model.cpu_ceiling_qps(1) == pytest.approx(ceiling, rel=1e-6)
    cfg = SimConfig(model=model, steps=[2 * ceiling], step_duration_s=20.0, warmup_s=2.0, slo_p99_ms=50)
    step = simulate_step(cfg, 2 * ceiling, np.random.default_rng(0))
    assert step["achieved_qps"] == pytest.approx(ceiling, rel=0.02)
    assert step["loop_utilization"] == pytest.approx(1.0, abs=0.01)


def test_the_loop_answers_before_it_reads_more_by_hand():
    # c_in = c_out = 1 ms, batches of 1e-12 s, arrivals at 0, 0.5 and 0.6 ms. A waiting second
    # pass goes before a waiting first pass, but does not interrupt one: 0–1 request 0 in (its
    # batch ends just after 1, when request 1's first pass has begun); 1–2 request 1 in; 2–3
    # request 0 out, before request 2's first pass, waiting since 0.6; 3–4 request 1 out; 4–5
    # request 2 in; 5–6 out. (One FIFO would run all three first passes first: done 4, 5, 6.)
    model = BatcherModel(alpha_s=1e-12, beta_s=0.0, max_batch_size=1, max_queue_delay_s=0.0,
                         cpu_in_s=1 * MS, cpu_out_s=1 * MS)  # fmt: skip
    run = simulate(np.array([0.0, 0.5 * MS, 0.6 * MS]), model)
    np.testing.assert_allclose(run.enqueued, [1 * MS, 2 * MS, 5 * MS], atol=1e-9)
    np.testing.assert_allclose(run.done, [3 * MS, 4 * MS, 6 * MS], atol=1e-9)


def test_loop_utilization_below_saturation_is_lambda_times_its_work():
    model = BatcherModel(alpha_s=1 * MS, beta_s=0.1 * MS, max_batch_size=16, max_queue_delay_s=1 * MS,
                         cpu_in_s=0.15 * MS, cpu_out_s=0.1 * MS)  # fmt: skip
    cfg = SimConfig(model=model, steps=[1000], step_duration_s=20.0, slo_p99_ms=50)
    step = simulate_step(cfg, 1000, np.random.default_rng(1))
    assert step["loop_utilization"] == pytest.approx(1000 * 0.25 * MS, rel=0.03)
    # Sharing 2 cores with a background, the loop runs slower at times: busy longer for the same work.
    shared = BatcherModel(**{**model.__dict__, "cores": 2.0, "background_cpu_s": 0.2 * MS})
    slowed = simulate_step(dataclasses.replace(cfg, model=shared), 1000, np.random.default_rng(1))
    assert slowed["loop_utilization"] > step["loop_utilization"]
    # Little's law over the whole server, CPU sharing included: sampled number in the system = λ·W.
    arrivals = np.cumsum(np.random.default_rng(2).exponential(1 / 1500, 60_000))
    run = simulate(arrivals, shared, until=float(arrivals[-1]))
    grid = np.linspace(arrivals[0], arrivals[-1], 100_000)
    lam = len(arrivals) / (arrivals[-1] - arrivals[0])
    assert in_system(arrivals, run.done, grid).mean() == pytest.approx(lam * (run.done - arrivals).mean(), rel=0.02)


def test_a_cpu_stage_must_be_finite_and_not_negative():
    base = {"alpha_s": 1 * MS, "beta_s": 0.0, "max_batch_size": 1, "max_queue_delay_s": 0.0}
    for field in ("cpu_in_s", "cpu_out_s", "cores", "background_cores", "background_cpu_s", "batch_overhead_s"):
        with pytest.raises(ValueError, match="CPU stage"):
            BatcherModel(**base, **{field: -1.0})
    with pytest.raises(ValueError, match="CPU stage"):
        BatcherModel(**base, cpu_in_s=float("nan"))
    assert not BatcherModel(**base).staged and BatcherModel(**base, cpu_out_s=1e-6).staged


def test_a_batch_finishing_with_the_loops_job_hands_its_answers_over_first_by_hand():
    # c_in = c_out = 1 ms, T(1) = 1 ms exactly, three arrivals at 0. 0–1: request 0 in, its batch
    # 1–2; 1–2: request 1 in. At 2 the loop's job and the batch end together: the answer reaches
    # the loop before it picks its next job, so 2–3 request 0 out (ahead of request 2, waiting
    # since 0), 3–4 request 1 out (its batch ran 2–3), 4–5 request 2 in, its batch 5–6, 6–7 out.
    # (Picking before the batch's event: request 2 in at 2–3, done 4, 5, 6.)
    model = BatcherModel(alpha_s=0.0, beta_s=1 * MS, max_batch_size=1, max_queue_delay_s=0.0,
                         cpu_in_s=1 * MS, cpu_out_s=1 * MS)  # fmt: skip
    run = simulate(np.zeros(3), model)
    np.testing.assert_allclose(run.enqueued, [1 * MS, 2 * MS, 5 * MS], atol=1e-12)
    np.testing.assert_allclose(run.done, [3 * MS, 4 * MS, 7 * MS], atol=1e-12)


def test_loop_utilization_covers_the_measured_window_only(tmp_path):
    # c_in = c_out = 1 ms, batches of up to 4 of T(n) = 10 ms · n. The warm-up's 40 requests at 0
    # keep the loop busy 80 ms, all well before 1 s. In the window [1, 2): nine lone requests
    # (1.0 … 1.8), 2 ms of the loop each, and 8 at 1.99: their first passes run 1.99–1.998 (the
    # first one's batch, 1.991–2.001, holds the instance; nothing comes back before the end).
    #   loop_utilization = (18 + 8) ms / 1 s = 0.026
    #   utilization = (9 · 10 + 9) ms / 1 s = 0.099; mean_batch_size = 10 batches of 1 = 1.
    stamps = [0.0] * 40 + [1.0 + k / 10 for k in range(9)] + [1.99] * 8
    path = tmp_path / "trace.csv"
    path.write_text("timestamp\n" + "".join(f"{s!r}\n" for s in stamps))
    model = BatcherModel(alpha_s=0.0, beta_s=10 * MS, max_batch_size=4, max_queue_delay_s=0.0,
                         cpu_in_s=1 * MS, cpu_out_s=1 * MS)  # fmt: skip
    cfg = SimConfig(model=model, steps=[1.0], step_duration_s=1.0, warmup_s=1.0, arrival=f"trace:{path}")
    step = simulate_step(cfg, 1.0, np.random.default_rng(0))
    assert step["loop_utilization"] == pytest.approx(0.026, abs=1e-9)
    assert step["utilization"] == pytest.approx(0.099, abs=1e-9)
    assert step["mean_batch_size"] == 1.0
