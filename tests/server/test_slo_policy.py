"""The slo batching policy: the online batch-time fit, the flush rules on hand-worked timelines,
admission control, priorities, and the rejection's status, hint and metrics through a server.

The decisions are checked on a model whose batch time the policy is told (a seeded fit, no
residuals yet: T(n) = α + β·n exactly) and whose progress the test gates, so that each
flush or refusal is the one the rule predicts at a time the test chooses (`_pick(now)`).
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import shutil
import threading
import time

import grpc
import numpy as np
import pytest
from prometheus_client import generate_latest

from wok import policy as policy_module
from wok.batcher import QUEUED, Batcher, BatchingPolicy
from wok.codec import decode_request, encode_request
from wok.config import load_model_config
from wok.errors import ConfigError, DeadlineExceeded, DeadlineUnmeetable, InvalidInput
from wok.policy import BatchTimeModel, RateMeter, SloPolicy
from wok.stats import ModelStats
from wok.v2pb import grpc_service_pb2 as pb
from wok.v2pb import grpc_service_pb2_grpc as pb_grpc

from .conftest import until

MS = 1e-3
# WALL_WINDOW: the tests marked `serial` (run alone, after the parallel pass: tests/conftest.py) need the test or the
# batcher to act within a window of wall time that a second worker's load could close: three arrivals within about
# 2 ms (the rate the idle rule reads), a request submitted or dispatched 10-180 ms before its deadline or latest start
# passes (else it is refused, sent by the deadline rule and not the idle one, or admitted where the rule refuses it),
# and a server's 20 ms batches against a 50 ms SLO. The others decide at times the test passes in (`_pick(now)`, a fake
# clock), gate the model on events, or leave 0.8 s or more before a deadline (sized for a loop stalled 50-300 ms).


def make_batcher(servable, executor, slo: SloPolicy | None, *, start: bool = True) -> Batcher:
    cfg = servable.config
    db = cfg.dynamic_batching
    policy = BatchingPolicy(cfg.max_batch_size, db.max_queue_delay_ms / 1e3, db.preferred_batch_sizes)
    b = Batcher(cfg.name, executor, policy, ModelStats(cfg.name), slo=slo)
    if start:
        b.start()
    else:  # decisions are asked of `_pick` by the test, at times it chooses; no task acts on its own
        b._loop = asyncio.get_running_loop()
        b._wakeup = asyncio.Event()
    return b


def policy(slo_ms, max_batch_size, alpha_ms, beta_ms, *, margin_ms=1.0, tau_s=0.1) -> SloPolicy:
    return SloPolicy(
        slo_ms * MS, max_batch_size, 1, seed=(alpha_ms * MS, beta_ms * MS), rate_tau_s=tau_s,
        initial_margin_s=margin_ms * MS,
    )  # fmt: skip


def submit(b: Batcher, value: float = 1.0, rows: int = 1, deadline=None, priority=None):
    return b.submit({"INPUT0": np.full((rows, 4), value, np.float32)}, rows, None, deadline, priority)


async def wait_entered(module) -> None:
    # Event.wait returns False at its timeout: a batch that never reached the model (dropped in
    # the queue) fails here, not at a later step that assumed it runs.
    assert await asyncio.to_thread(module.entered.wait, 10), "no batch entered the model within 10 s"
    module.entered.clear()


# -- the online fit -----------------------------------------------------------------------------


def test_the_fit_recovers_alpha_and_beta_exactly_from_exact_times():
    m = BatchTimeModel(32, min_batches=4)
    for i in range(64):
        n = 1 + (7 * i) % 32
        m.observe("k", n, 0.4e-3 + 0.045e-3 * n)
    a, b, q = m.coefficients("k")
    assert a == pytest.approx(0.4e-3, rel=1e-9) and b == pytest.approx(0.045e-3, rel=1e-9)
    assert q == pytest.approx(0.0, abs=1e-12)
    assert m.predict("k", 10) == pytest.approx(0.85e-3, rel=1e-9)


def test_the_fit_converges_on_alpha_beta_under_noise_and_plans_with_the_p95_not_the_mean():
    # T = 2 ms + 0.1 ms·n + U(0, 1 ms): the least-squares line is 2.5 ms + 0.1 ms·n (the noise's mean
    # goes into α), the residuals are U(−0.5, 0.5) ms, whose 95th percentile is 0.45 ms.
    rng = np.random.default_rng(7)
    m = BatchTimeModel(32, quantile=0.95, decay=0.999, window=1024, min_batches=16)
    for _ in range(4000):
        n = int(rng.integers(1, 33))
        m.observe(None, n, 2e-3 + 0.1e-3 * n + rng.uniform(0, 1e-3))
    a, b, q = m.coefficients(None)
    assert a == pytest.approx(2.5e-3, abs=0.05e-3)
    assert b == pytest.approx(0.1e-3, rel=0.03)
    assert q == pytest.approx(0.45e-3, abs=0.05e-3)
    assert m.predict(None, 16) == pytest.approx(2.5e-3 + 1.6e-3 + 0.45e-3, abs=0.1e-3)
    assert m.mean(None, 16) == pytest.approx(4.1e-3, abs=0.08e-3)


def test_the_fit_follows_a_change_and_a_seed_fades():
    # Seeded at α = 1 ms, β = 0.1 ms; the model really runs at α = 3 ms, β = 0.2 ms.
    m = BatchTimeModel(32, seed=(1e-3, 0.1e-3), decay=0.99, min_batches=8)
    assert m.predict("k", 10) == pytest.approx(2e-3)  # before any batch: the seed
    for i in range(2000):
        n = 1 + i % 32
        m.observe("k", n, 3e-3 + 0.2e-3 * n)
    a, b, _ = m.coefficients("k")
    assert a == pytest.approx(3e-3, rel=1e-3) and b == pytest.approx(0.2e-3, rel=1e-3)


def test_one_batch_size_only_keeps_the_known_beta_and_fits_alpha_to_the_mean():
    m = BatchTimeModel(32, seed=(1e-3, 0.1e-3), decay=0.9, min_batches=4)
    for _ in range(300):
        m.observe("k", 8, 5e-3)
    a, b, _ = m.coefficients("k")
    # The seed's pseudo-batches have decayed to nothing; β stays the seed's, α = 5 − 0.8 ms.
    assert b == pytest.approx(0.1e-3, rel=1e-6) and a == pytest.approx(4.2e-3, rel=1e-6)


def test_a_key_with_few_batches_is_predicted_from_all_keys():
    m = BatchTimeModel(32, min_batches=4)
    for n in (1, 2, 3, 4, 5, 6):
        m.observe("short", n, 1e-3 * n)
    assert m.predict("long", 3) == pytest.approx(3e-3)
    for n in (1, 2, 3, 4):
        m.observe("long", n, 2e-3 * n)
    assert m.predict("long", 3) == pytest.approx(6e-3)


def test_per_key_state_is_bounded_and_the_least_recently_seen_key_goes_first(monkeypatch):
    # Batch keys are the shapes clients send: a model must not keep state for every one forever.
    monkeypatch.setattr(policy_module, "MAX_TRACKED_KEYS", 3)
    m = BatchTimeModel(32, min_batches=4)
    slo = SloPolicy(0.05, 32)
    for n in (1, 2, 3, 4):
        m.observe("kept", n, 2e-3 * n)
    slo.arrived("kept", 0.0, 1)
    for i in range(10):
        m.observe(("shape", i), 1, 1e-3)
        slo.arrived(("shape", i), 0.0, 1)
        m.observe("kept", 5, 1e-2)  # seen again each time: never the least recent
        slo.arrived("kept", 0.0, 1)
    assert len(m._keys) == len(m._coef) == len(slo._rates) == 3
    assert set(m._keys) == set(slo._rates) == {("shape", 8), ("shape", 9), "kept"}
    assert m.batches("kept") == 14 and m.batches(("shape", 0)) == 0  # its fit went; the model-wide one stays
    assert m.batches() == 24
    assert slo.rate("kept", 0.0) == pytest.approx(11 / 0.1)


def test_the_rate_meter_counts_samples_per_second_and_decays():
    r = RateMeter(0.1)
    for _ in range(10):
        r.add(1.0, 1)  # 10 samples at once: 10 / τ
    assert r.rate(1.0) == pytest.approx(100.0)
    assert r.rate(1.1) == pytest.approx(100.0 / math.e)


# -- the rules, as numbers ----------------------------------------------------------------------


def test_rule_formulas_on_hand_worked_numbers():
    p = policy(50, 8, alpha_ms=10, beta_ms=1, margin_ms=1, tau_s=1.0)
    # latest start = D − T(n) − margin = 100 − (10 + 3) − 1 ms
    assert p.latest_start("k", 0.100, 3) == pytest.approx(0.086)
    assert p.latest_start("k", 0.100, 20) == pytest.approx(0.100 - 0.018 - 0.001)  # n capped at 8
    # idle rule: λ = 300 samples/s (300 at once, τ = 1 s), α = 10 ms → λα = 3 samples
    p.arrived("k", 5.0, 300)
    assert p.idle_target("k", 5.0) == pytest.approx(3.0)
    # with 2 queued and no arrival, λ(t)α falls to 2 at t = 5 + τ·ln(3/2)
    assert p.idle_flush_at("k", 2, 5.0) == pytest.approx(5.0 + math.log(1.5))
    assert p.idle_flush_at("k", 3, 5.0) == 5.0
    # admission: 19 samples ahead + 1 → two full batches of 8 (18 ms each), then a batch of 4 (14 ms)
    assert p.finish_estimate("k", 1.0, 19, 1) == pytest.approx(1.0 + 0.036 + 0.014 + 0.001)
    assert p.finish_estimate("k", 1.0, 0, 8) == pytest.approx(1.0 + 0.018 + 0.001)
    assert p.finish_estimate("k", 1.0, 1, 8) == pytest.approx(1.0 + 0.018 + 0.011 + 0.001)


# -- the flush decisions on timelines -------------------------------------------------------------


@pytest.mark.serial  # (see WALL_WINDOW)
async def test_deadline_rule_flushes_at_the_latest_start_and_not_before(gated):
    # α = 20 ms, β = 1 ms, SLO 200 ms, margin 1 ms, λ = 99 samples/s → λα = 1.98 samples: an idle
    # instance waits for a second sample; the deadline rule bounds the wait.
    s, _m, ex = gated(max_batch_size=8)
    slo = policy(200, 8, alpha_ms=20, beta_ms=1, margin_ms=1, tau_s=10.0)
    b = make_batcher(s, ex, slo, start=False)
    p = submit(b)
    slo.arrived(b._keys[None], p.arrival, 989)  # arrivals seen before: λ = 990/10 s = 99 samples/s
    t0 = p.arrival
    latest = t0 + 0.200 - 0.021 - 0.001  # deadline − T(1) − margin
    assert b._pick(t0 + 0.001) == (None, None, "", pytest.approx(latest - t0 - 0.001))
    assert b._pick(latest - 1e-6)[1] is None
    _, q, reason, _ = b._pick(latest)
    assert q is not None and reason == "deadline"
    # A second request grows the batch: T(2) = 22 ms, so the same deadline's latest start is 1 ms earlier.
    p2 = submit(b)
    assert b._pick(latest - 0.0005)[2] == "deadline"
    # ... and the two samples pass λα = 99.1·0.02 = 1.98: the idle rule sends them now.
    assert b._pick(p2.arrival)[2] == "idle"
    b._fail_queued(DeadlineExceeded("test over"))
    for x in (p, p2):
        x.future.exception()


@pytest.mark.serial  # (see WALL_WINDOW)
async def test_idle_rule_waits_while_the_rate_says_the_batch_grows_then_flushes_as_it_decays(gated):
    s, _m, ex = gated(max_batch_size=32)
    slo = policy(60_000, 32, alpha_ms=2000, beta_ms=0, margin_ms=1, tau_s=1.0)
    b = make_batcher(s, ex, slo, start=False)
    ps = [submit(b) for _ in range(3)]  # λ ≈ 3 samples/s, λα ≈ 6 > 3 queued: keep filling
    t0 = ps[-1].arrival
    _, q, _, wait = b._pick(t0)
    assert q is None
    # No arrival: λ(t)·α = 6·e^(−t/τ) reaches 3 at τ·ln 2 after the last arrival.
    assert wait == pytest.approx(math.log(2), abs=2e-3)
    assert b._pick(t0 + math.log(2) - 0.01)[1] is None
    assert b._pick(t0 + math.log(2) + 0.01)[2] == "idle"
    b._fail_queued(DeadlineExceeded("test over"))
    for x in ps:
        x.future.exception()


@pytest.mark.serial  # (see WALL_WINDOW)
async def test_an_idle_instance_takes_a_lone_request_at_once_when_waiting_cannot_pay(gated):
    # λ = 1 sample / 0.1 s = 10 samples/s, α = 1 ms: λα = 0.01 < 1, so the request goes now.
    s, m, ex = gated(max_batch_size=8)
    b = make_batcher(s, ex, policy(50, 8, alpha_ms=1, beta_ms=0.1))
    p = submit(b)
    await p.future
    assert b.stats.flushes == {"idle": 1} and m.batch_sizes == [1]
    assert b.slo.times.batches(b._keys[None]) == 1  # the batch's time went into the fit
    assert b.metrics.slack.count == 1
    await b.stop()


async def test_a_running_batcher_sends_the_batch_at_its_latest_start(gated):
    # As above with an SLO of 1 s and a margin of 800 ms: the latest start comes as soon (179 ms), and
    # the batcher's timer may wake up to 800 ms late before the request's deadline passes in the
    # queue (it is then dropped, not sent). With 200 ms and 20 ms, a host that stalled the loop
    # 150 ms at the timer failed it (2 runs of 2 on one starved core with 50-300 ms SIGSTOP stalls).
    s, _m, ex = gated(max_batch_size=8)
    slo = policy(1000, 8, alpha_ms=20, beta_ms=1, margin_ms=800, tau_s=10.0)
    b = make_batcher(s, ex, slo)
    p = submit(b)
    slo.arrived(b._keys[None], p.arrival, 989)  # as above: λα = 1.98 > 1, so only the deadline rule sends it
    await p.future
    assert b.stats.flushes == {"deadline": 1}
    waited = p.dispatched - p.arrival
    assert waited >= 0.179 - 1e-6  # never before the latest start: 1000 − 21 − 800 ms
    await b.stop()


async def test_a_full_queue_flushes_on_size_and_a_busy_instance_takes_only_full_batches(gated):
    s, m, ex = gated(max_batch_size=4, depth=2)
    b = make_batcher(s, ex, policy(10_000, 4, alpha_ms=1, beta_ms=0.1))
    m.gate.clear()
    first = submit(b)
    await wait_entered(m)
    ps = [submit(b) for _ in range(5)]  # 4 fill the spare slot at once; the 5th waits for the idle instance
    while b.inflight < 2:
        await asyncio.sleep(0)
    assert b.queued == 1
    m.gate.set()
    await asyncio.gather(first.future, *(p.future for p in ps))
    assert m.batch_sizes == [1, 4, 1]
    assert b.stats.flushes == {"idle": 2, "size": 1}
    await b.stop()


@pytest.mark.serial  # (see WALL_WINDOW)
async def test_a_request_that_would_finish_late_is_dropped_at_dispatch(gated):
    s, _m, ex = gated(max_batch_size=8)
    slo = policy(10_000, 8, alpha_ms=50, beta_ms=0, margin_ms=1)
    b = make_batcher(s, ex, slo, start=False)
    ok = submit(b)  # the model is idle: let through unchecked (a probe)
    late = submit(b, deadline=time.perf_counter() + 0.060)  # admitted: a batch of 2 ends in 50 + 1 ms < 60 ms
    # 15 ms later (the instance was busy, say) a batch of 50 ms would end 5 ms past its deadline.
    key = b._keys[None]
    batch = b._form(key, b._queues[key], "deadline", late.arrival + 0.015)
    assert batch.requests == [ok]
    with pytest.raises(DeadlineExceeded, match="would pass before its batch finished"):
        late.future.result()
    b._fail_queued(DeadlineExceeded("test over"))


@pytest.mark.serial  # (see WALL_WINDOW)
async def test_a_request_expiring_while_every_instance_is_busy_is_answered_at_its_deadline(gated):
    # The one instance runs (gated) and no slot is free, so no flush rule is asked; the queued
    # request's deadline still wakes the batcher, which fails it and takes it out of the samples
    # that admission counts as ahead. It used to wait for a free slot to be dropped at dispatch.
    s, m, ex = gated(max_batch_size=8, depth=1)
    b = make_batcher(s, ex, policy(60_000, 8, alpha_ms=1, beta_ms=0))
    m.gate.clear()
    running = submit(b)
    await wait_entered(m)
    kept = submit(b, priority=1)
    late = submit(b, deadline=time.perf_counter() + 0.05, priority=2)
    assert b._level_samples == {1: 1, 2: 1}
    with pytest.raises(DeadlineExceeded, match="deadline passed before it could run"):
        await asyncio.wait_for(late.future, 5)
    assert b.queued == 1 and b._level_samples == {1: 1} and b.inflight == 1
    m.gate.set()
    await asyncio.wait_for(asyncio.gather(running.future, kept.future), 10)
    assert m.batch_sizes == [1, 1]
    await b.stop()


# -- admission --------------------------------------------------------------------------------


@pytest.mark.serial  # (see WALL_WINDOW)
async def test_admission_refuses_the_first_request_that_cannot_finish_in_time(gated):
    # α = 100 ms, β = 10 ms, max batch 8, SLO 500 ms, margin 1 ms. One batch of 1 runs (gated):
    # the instance is predicted free s = 110 ms after its dispatch (less the time since). The
    # k-th queued request would finish s + 180·((k − 1) // 8) + 100 + 10·own + 1 ms from now,
    # own = k − 8·((k − 1) // 8): k = 16: s + 361 ms (in), k = 17: s + 471 ms, past 500 ms for
    # any s > 29 ms: refused, with a hint of s − 29 ms.
    s, m, ex = gated(max_batch_size=8, depth=1)
    b = make_batcher(s, ex, policy(500, 8, alpha_ms=100, beta_ms=10, margin_ms=1))
    m.gate.clear()
    running = submit(b)
    await wait_entered(m)
    accepted = [submit(b, priority=2) for _ in range(16)]
    free_at = b._free_at[0]
    before = time.perf_counter()
    with pytest.raises(DeadlineUnmeetable, match=r"16 samples queued ahead of it.*retry after \d+ ms") as info:
        submit(b, priority=2)
    after = time.perf_counter()
    assert free_at - after - 0.029 <= info.value.retry_after_s <= free_at - before - 0.029
    assert info.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    # A more urgent request has nobody ahead of it: it is admitted.
    urgent = submit(b, priority=1)
    assert b.queued == 17
    m.gate.set()
    await asyncio.gather(running.future, urgent.future, *(p.future for p in accepted), return_exceptions=True)
    await b.stop()


async def test_an_idle_model_lets_a_probe_through_so_an_inflated_estimate_recovers(gated):
    # Seeded 10 s per batch against a 1 s SLO: every checked request would be refused. With the
    # model idle, one goes through unchecked; its real (ms) time enters the fit, and once the key
    # has min_batches (16) batches of its own the seed leaves the fit. Each probe's deadline (the
    # SLO) must not pass before its batch is sent: with 50 ms, a host that stalled the loop that
    # long dropped the first in the queue, and the next request found the model idle (a probe).
    s, m, ex = gated(max_batch_size=8)
    b = make_batcher(s, ex, policy(1000, 8, alpha_ms=10_000, beta_ms=0))
    observed = []  # (n, seconds) of each batch, as the batcher hands them to the fit
    observe = b.slo.observe_batch
    b.slo.observe_batch = lambda key, n, seconds: observed.append((n, seconds)) or observe(key, n, seconds)
    m.gate.clear()
    probe = submit(b)
    await wait_entered(m)
    assert probe.probe
    with pytest.raises(DeadlineUnmeetable):
        submit(b)  # the model is busy: checked against the 10 s estimate
    m.gate.set()
    await probe.future
    for _ in range(15):
        p = submit(b)
        assert p.probe  # idle again each time
        await p.future
    # The seed has left the fit: 16 batches, all of 1, so β is the seed's (0: one size does not identify it) and α the
    # decay-weighted mean of their times, the last weighing most; no residual counts yet (only those of a fit that
    # already had 16 batches). With the seed's pseudo-batches (weight 4 at 10 s) still in it is 1.3 s, with equal
    # weights (here) 2 % off; a wall-time bound (< 50 ms, as this had) fails once the first probe, timed with the gate
    # shut, is held 0.8 s.
    ns, seconds = zip(*observed, strict=True)
    weights = b.slo.times.decay ** np.arange(len(seconds) - 1, -1, -1)
    assert ns == (1,) * 16 and b.slo.times.batches() == 16
    assert b.slo.times.predict(b._keys[None], 1) == pytest.approx(np.dot(weights, seconds) / weights.sum(), rel=1e-9)
    m.gate.clear()
    first = submit(b)
    await wait_entered(m)
    second = submit(b)  # checked now, and admitted
    assert not second.probe
    m.gate.set()
    await asyncio.gather(first.future, second.future)
    await b.stop()


async def test_a_request_whose_deadline_has_already_passed_is_refused_as_expired_without_a_retry_hint(gated):
    # No retry can meet a deadline that has passed: DeadlineExceeded, as the fixed policy ends it,
    # whether the model is idle (a probe otherwise) or busy (checked otherwise).
    s, m, ex = gated(max_batch_size=8)
    b = make_batcher(s, ex, policy(50, 8, alpha_ms=1, beta_ms=0.1))
    arrived = r"^request to model 'gated' arrived \d+\.\d ms after its deadline passed; it was not queued$"
    with pytest.raises(DeadlineExceeded, match=arrived):
        submit(b, deadline=0.0)
    m.gate.clear()
    running = submit(b)
    await wait_entered(m)
    with pytest.raises(DeadlineExceeded, match=r"ms after its deadline passed; it was not queued$") as info:
        submit(b, deadline=time.perf_counter())
    assert not hasattr(info.value, "retry_after_s")
    assert b.queued == 0 and b.stats.fail.count == 2
    m.gate.set()
    await running.future
    await b.stop()


async def test_a_refusal_that_misses_by_under_half_a_ms_says_retry_after_1_ms(gated):
    # The hint is whole ms, rounded up, at least 1, in the message as in the trailer: a client of the
    # stream, which has only the message, must not be told to retry after 0 ms.
    s, _m, ex = gated(max_batch_size=8)
    b = make_batcher(s, ex, policy(50, 8, alpha_ms=10, beta_ms=1), start=False)
    submit(b)  # a probe; no task runs it, so the model is busy from now on
    now = time.perf_counter()
    finish = b.slo.finish_estimate(None, now, 1, 1)
    with pytest.raises(DeadlineUnmeetable) as info:
        b._admit(None, 1, 1, finish - 0.3 * MS, now)
    assert info.value.retry_after_s == pytest.approx(0.3 * MS)
    assert info.value.retry_after_ms == 1
    assert str(info.value).endswith("; retry after 1 ms")
    with pytest.raises(DeadlineUnmeetable) as info:
        b._admit(None, 1, 1, finish - 2.2 * MS, now)
    assert info.value.retry_after_ms == 3 and str(info.value).endswith("; retry after 3 ms")
    b._fail_queued(DeadlineExceeded("test over"))


# -- priorities ------------------------------------------------------------------------------


@pytest.mark.parametrize("use_slo", [False, True])
async def test_batches_take_the_most_urgent_level_first_fifo_within_a_level(gated, use_slo):
    s, m, ex = gated(max_batch_size=2, delay_ms=0, depth=1)
    b = make_batcher(s, ex, policy(60_000, 2, alpha_ms=1, beta_ms=0) if use_slo else None)
    m.gate.clear()
    running = submit(b, 0.0)
    await wait_entered(m)
    levels = [3, 1, 2, 1, 3]
    ps = [submit(b, float(i + 1), priority=lv) for i, lv in enumerate(levels)]
    m.gate.set()
    outs = await asyncio.gather(*(p.future for p in ps))
    await running.future
    batches = {}
    for i, p in enumerate(ps):
        batches.setdefault(p.dispatched, set()).add(i)
    # Level 1 (requests 1 and 3) first; then level 2 (2) with the older level-3 one (0); then 4.
    assert [batches[t] for t in sorted(batches)] == [{1, 3}, {0, 2}, {4}]
    assert m.batch_sizes == [1, 2, 2, 1]
    for i, out in enumerate(outs):  # each result still goes to its own request
        assert out["OUTPUT0"][0, 0] == 2.0 * (i + 1)
    assert b._level_samples == {}  # levels are the clients' choice: none is kept once empty
    await b.stop()


def test_the_priority_parameter_decodes_and_a_bad_one_names_itself(gated):
    s, _, _ = gated(max_batch_size=4)
    x = {"INPUT0": np.zeros((1, 4), np.float32)}
    assert decode_request(encode_request("gated", x, priority=3), s).priority == 3
    assert decode_request(encode_request("gated", x, priority=0), s).priority is None  # 0: the default level
    assert decode_request(encode_request("gated", x), s).priority is None
    req = encode_request("gated", x)
    req.parameters["priority"].string_param = "high"
    expected = "parameter 'priority': expected an integer from 0 to 1000000 as int64_param or uint64_param "
    expected += "(1 most urgent, 0 the default); got "
    with pytest.raises(InvalidInput) as info:
        decode_request(req, s)
    assert str(info.value) == expected + "string_param 'high'"
    for bad in (-1, 1_000_001, 2**62):
        req.parameters["priority"].int64_param = bad
        with pytest.raises(InvalidInput) as info:
            decode_request(req, s)
        assert str(info.value) == expected + f"int64_param {bad}"
    req.parameters["priority"].uint64_param = 1_000_000  # the least urgent level there is
    assert decode_request(req, s).priority == 1_000_000


# -- config --------------------------------------------------------------------------------------


def _set_batching(root, batching: str):
    """The slow model's config with `batching` lines added to its [dynamic_batching] table."""
    cfg = root / "slow" / "config.toml"
    base = root / "slow" / "config.base"
    if not base.exists():
        base.write_text(cfg.read_text())
    cfg.write_text(base.read_text().replace("[dynamic_batching]\n", "[dynamic_batching]\n" + batching))
    return root


def _profile(path, alpha_s, beta_s):
    path.write_text(json.dumps({"schema": "wok.profile/1", "fit": {"alpha_s": alpha_s, "beta_s": beta_s}}))


def test_config_checks_the_policy_fields(slow_repository):
    root = slow_repository()
    assert load_model_config(root / "slow").dynamic_batching.policy == "fixed"
    _set_batching(root, 'policy = "slo"\n')
    with pytest.raises(ConfigError, match="policy 'slo' needs slo_ms"):
        load_model_config(root / "slow")
    _set_batching(root, "slo_ms = 30\n")
    with pytest.raises(ConfigError, match="slo_ms only apply to policy 'slo'"):
        load_model_config(root / "slow")
    _set_batching(root, 'policy = "slo"\nslo_ms = -1\n')
    with pytest.raises(ConfigError, match=r"dynamic_batching\.slo_ms"):
        load_model_config(root / "slow")
    _set_batching(root, 'policy = "lifo"\n')
    with pytest.raises(ConfigError, match=r"dynamic_batching\.policy"):
        load_model_config(root / "slow")
    _set_batching(root, 'policy = "slo"\nslo_ms = 30\nslo_profile = "p.json"\n')
    with pytest.raises(ConfigError, match=r"cannot read profile .*p\.json"):
        load_model_config(root / "slow")
    (root / "slow" / "p.json").write_text(json.dumps({"schema": "wok.tune/1"}))
    with pytest.raises(ConfigError, match=r"p\.json: expected schema 'wok\.profile/1'; got 'wok\.tune/1'"):
        load_model_config(root / "slow")
    _profile(root / "slow" / "p.json", 0.02, 0.001)  # relative to the model's folder
    db = load_model_config(root / "slow").dynamic_batching
    assert db.policy == "slo" and db.slo_ms == 30 and db.slo_profile == root / "slow" / "p.json"


@pytest.mark.parametrize(
    ("doc", "refusal"),
    [
        ({"fit": {}}, "expected schema 'wok.profile/1'; got none"),
        ({"schema": None}, "expected schema 'wok.profile/1'; got null"),
        ([1, 2], "expected a JSON object of schema 'wok.profile/1'; got [1, 2]"),
    ],
    ids=["left-out", "null", "an-array"],
)
def test_a_profile_without_a_schema_is_refused_saying_what_it_holds(tmp_path, doc, refusal):
    # A schema left out was "got null", as a written null; an array was "got 'list'", its type's name shown as though
    # it were the schema written.
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError) as info:
        policy_module.read_profile_fit(path)
    assert str(info.value) == f"profile {path}: {refusal}"


@pytest.mark.parametrize(
    ("alpha", "shown"),
    [(math.nan, "NaN"), (math.inf, "Infinity"), (10**400, "an integer of 401 digits")],
    ids=["nan", "inf", "int-past-float"],
)
def test_a_profile_fit_of_no_finite_number_is_refused_in_the_file_s_words(tmp_path, alpha, shown):
    # They were shown by repr, Python's nan and inf (the schema's refusal beside it said JSON's), and an integer past a
    # float's range raised float()'s OverflowError, which the config's check (of a ValueError) let through.
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"schema": "wok.profile/1", "fit": {"alpha_s": alpha, "beta_s": 1e-4}}))
    with pytest.raises(ValueError) as info:
        policy_module.read_profile_fit(path)
    assert str(info.value) == (
        f"profile {path}: fit.alpha_s and fit.beta_s: expected finite numbers; got {shown} and 0.0001"
    )


def test_a_profile_fit_past_a_float_s_range_is_a_config_error(slow_repository):
    # float()'s OverflowError went through the config's check, which pydantic turns into a refusal for a ValueError
    # only: a traceback from load_model_config instead of a ConfigError.
    root = slow_repository()
    _set_batching(root, 'policy = "slo"\nslo_ms = 30\nslo_profile = "p.json"\n')
    _profile(root / "slow" / "p.json", 10**400, 0.001)
    with pytest.raises(ConfigError) as info:
        load_model_config(root / "slow")
    assert str(info.value).endswith("expected finite numbers; got an integer of 401 digits and 0.001")


async def test_a_profile_unreadable_by_the_start_fails_it_with_the_model_s_threads_shut_down(slow_repository):
    # The config is checked as the repository loads; the server reads the profile again as it
    # builds the model's batcher, after the model's load and warm-up. A profile edited between the
    # two fails the start; its executor, not yet among the runtimes that stop() shuts down, kept
    # its worker thread running after the stop.
    from wok.app import WokServer, build_repository
    from wok.config import server_settings

    root = _set_batching(slow_repository(), 'policy = "slo"\nslo_ms = 50\nslo_profile = "profile.json"\n')
    _profile(root / "slow" / "profile.json", 0.020, 0.0)
    settings = server_settings(grpc_port=0, model_repository=root)
    server = WokServer(settings, build_repository(settings))
    (root / "slow" / "profile.json").write_text("{")
    with pytest.raises(ValueError, match=r"cannot read profile .*profile\.json"):
        await server.start()
    await server.stop(grace=0)
    assert server.runtimes == {}
    assert [t.name for t in threading.enumerate() if t.name.startswith("wok-slow-")] == []


# -- through a server: status, retry-after, metrics -------------------------------------------------


def _slip(server, model: str, batch_s: float) -> tuple[bool, float]:
    """What the server's own metrics show of the machine stalling it: (whether a batch of a model
    that takes `batch_s` ran past 1.75 × that, an event-loop pass was late by more than 25 ms, or
    the batches' start fell behind the plan by more than 0.25 × `batch_s` in all; how far the start
    fell behind, in seconds).

    The plan starts each batch when the one before is predicted done, at least `batch_s` after it
    started (the model sleeps `batch_s`; the fit, seeded with it, only learns longer times). The
    start slips by what the batches ran over `batch_s` and by the time an instance sat idle with
    requests queued (the hop to the worker thread, which a busy machine can hold up). A policy
    that admits too much expires requests with the batches on time: neither sum grows (by a few
    tenths of a ms a batch). The sum misses a stall of the event loop before a batch whose every
    request expired (it never ran), hence the quarter batch time."""
    m = server.metrics.models[model]
    compute = m.stages["compute"]
    slow = sum(c for b, c in zip((*compute.bounds, math.inf), compute.counts) if b > 1.75 * batch_s)
    lag = server.metrics.loop_lag
    late = sum(c for b, c in zip((*lag.bounds, math.inf), lag.counts) if b > 25e-3)
    slipped = sum(m.busy_seconds) - m.batch_size.count * batch_s + sum(m.idle_queued_seconds)
    return slow + late > 0 or slipped > 0.25 * batch_s, slipped


def _late_by(details: str, batch_s: float) -> float:
    """How late (s) an admitted request dropped at its batch would have finished, from its message.

    Admitted, its predicted finish (planned start + quantile time + margin) was by its deadline; it
    is dropped when its batch's start plus the mean time passes the deadline, so this lateness is
    at most how far the start slipped from the plan. A request whose deadline had passed before
    its batch could start was late by at least a batch time."""
    got = re.search(
        r"deadline in (-?[\d.]+) ms, batch predicted to take ([\d.]+) ms"
        r"(?:, after its instance is free in ([\d.]+) ms)?",
        details,
    )
    if got is None:
        assert "passed before it could run" in details, details
        return batch_s
    left, took, wait = (float(g) if g else 0.0 for g in got.groups())
    return (wait + took - left) / 1e3


@pytest.mark.serial  # (see WALL_WINDOW)
async def test_a_server_refuses_what_cannot_meet_the_slo_with_a_retry_hint_and_counts_it(serve, slow_repository):
    # The slow model sleeps 20 ms per batch of ≤ 4; the profile says so (α = 20 ms). SLO 50 ms:
    # the first request runs at once (a probe), the next 4 fit a second batch (done 40 ms after the
    # first started), a third would end at 60 ms, past the deadline of a request that came within
    # 10 ms of the first: refused. Those admitted have about 10 ms to spare (an SLO of 60 ms put
    # every third batch's deadline at its planned end: a 3 ms slip of the machine expired them).
    root = _set_batching(slow_repository(), 'policy = "slo"\nslo_ms = 50\nslo_profile = "profile.json"\n')
    _profile(root / "slow" / "profile.json", 0.020, 0.0)
    async with serve(repository=root) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            stub = pb_grpc.GRPCInferenceServiceStub(ch)
            x = {"INPUT0": np.ones((1, 4), np.float32)}
            calls = [stub.ModelInfer(encode_request("slow", x)) for _ in range(40)]
            results = await asyncio.gather(*calls, return_exceptions=True)
        ok = [r for r in results if isinstance(r, pb.ModelInferResponse)]
        errors = [r for r in results if isinstance(r, grpc.aio.AioRpcError)]
        refused = [e for e in errors if e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED]
        # A stall of the shared machine can hold an admitted request past its deadline: that ends
        # DEADLINE_EXCEEDED and is no refusal. Only a stall may explain it: a policy that admits
        # too much expires requests with every batch on time, or later than the batches slipped
        # (a request arriving 10 ms after the first is admitted with little to spare).
        expired = [e for e in errors if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED]
        assert len(ok) + len(refused) + len(expired) == 40, [(e.code(), e.details()) for e in errors]
        assert ok and refused
        if expired:
            m = server.metrics.models["slow"]
            stalled, slipped = _slip(server, "slow", batch_s=0.020)
            for err in expired:
                assert stalled or _late_by(err.details(), 0.020) <= slipped + 0.5e-3, (
                    f"an admitted request expired, no stall seen: {err.details()}; {m.batch_size.count} "
                    f"batches, busy {m.busy_seconds} s, idle while queued {m.idle_queued_seconds} s: "
                    f"the start slipped {1e3 * slipped:.2f} ms"
                )
        for err in refused:
            assert "cannot finish this request before its deadline" in err.details()
            hint = int(dict(err.trailing_metadata())["retry-after-ms"])
            said = int(re.search(r"retry after (\d+) ms$", err.details()).group(1))
            assert hint >= 1 and hint == said
        m = server.metrics.models["slow"]
        assert m.rejections["deadline_unmeetable"] == len(refused)
        # Slack is recorded for each batch dispatched; a batch size for each that ran a request. A
        # batch whose every request expired at the worker (the stall above) ran none.
        dispatched = sum(server.runtimes["slow"].stats.flushes.values())
        assert m.slack.count == dispatched >= m.batch_size.count > 0
        if not expired:
            assert m.batch_size.count == dispatched
        text = generate_latest(server.metrics.registry)
        assert b"wok_dispatch_slack_seconds_bucket" in text
        assert b'wok_rejected_requests_total{model="slow",reason="deadline_unmeetable"}' in text


async def test_a_passed_deadline_ends_alike_under_both_policies(serve, slow_repository):
    # A V2 timeout of 1 µs has passed by the time the request reaches its batcher (decoding alone
    # takes longer). Both policies refuse it at arrival; a client sees one answer for both, without
    # a retry hint, and the same counter counts it.
    root = slow_repository(sleep_ms=1, delay_ms=0)
    shutil.copytree(root / "slow", root / "fixed")
    _set_batching(root, 'policy = "slo"\nslo_ms = 60\n')
    async with serve(repository=root) as server:
        assert server.runtimes["slow"].batcher.slo is not None and server.runtimes["fixed"].batcher.slo is None
        answers = {}
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            stub = pb_grpc.GRPCInferenceServiceStub(ch)
            for model in ("fixed", "slow"):
                call = stub.ModelInfer(encode_request(model, {"INPUT0": np.ones((1, 4), np.float32)}, timeout_us=1))
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await call
                trailers = dict(await call.trailing_metadata() or ())
                # How late it arrived aside.
                details = re.sub(r"arrived \d+\.\d ms", "arrived T ms", info.value.details())
                answers[model] = (info.value.code(), details.replace(f"'{model}'", "'M'"), "retry-after-ms" in trailers)
        expired = "request to model 'M' arrived T ms after its deadline passed; it was not queued"
        assert answers == dict.fromkeys(("fixed", "slow"), (grpc.StatusCode.DEADLINE_EXCEEDED, expired, False))
        for model in ("fixed", "slow"):
            m = server.metrics.models[model]
            assert m.rejections["deadline"] == 1 and m.rejections["deadline_unmeetable"] == 0, model
            assert server.runtimes[model].stats.fail.count == 1, model


async def test_the_retry_hint_in_the_message_is_the_trailer_s_and_at_least_1_ms(serve, slow_repository, monkeypatch):
    # A refusal whose miss is 0.3 ms (hard to time through the policy; its own test is above): the
    # unary call's trailer and message, and the stream's message, all say 1 ms.
    root = _set_batching(slow_repository(sleep_ms=1, delay_ms=0), 'policy = "slo"\nslo_ms = 60\n')
    async with serve(repository=root) as server:
        batcher = server.runtimes["slow"].batcher

        def refuse(*args, **kwargs):
            raise DeadlineUnmeetable("model 'slow' cannot finish this request before its deadline", retry_after_s=3e-4)

        monkeypatch.setattr(batcher, "submit", refuse)
        request = encode_request("slow", {"INPUT0": np.ones((1, 4), np.float32)})
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            stub = pb_grpc.GRPCInferenceServiceStub(ch)
            call = stub.ModelInfer(request)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await call
            assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert info.value.details().endswith("; retry after 1 ms")
            assert dict(await call.trailing_metadata())["retry-after-ms"] == "1"

            async def one():
                yield request

            answers = [a async for a in stub.ModelStreamInfer(one())]
        assert len(answers) == 1 and answers[0].error_message.endswith("; retry after 1 ms")
        assert server.metrics.models["slow"].rejections["deadline_unmeetable"] == 2


async def test_the_priority_parameter_reaches_the_batcher_and_a_bad_one_is_invalid_argument(gated_model):
    # The gated model (fixed policy, one slot): one request is held at its gate, occupying the
    # instance; then a level-5 request (2 rows) and a level-1 request (3 rows) queue, in that
    # order, and the gate opens: the level-1 one runs first. The gate, not a model's sleep, holds
    # the first: a host that stalled past a 200 ms sleep between the two sends let the level-5 one
    # run alone before the level-1 one arrived (once in 30 runs with the test stopped 250 ms at a time).
    from wok.app import WokServer
    from wok.config import server_settings
    from wok.repository import ModelRepository

    s, module = gated_model(max_batch_size=4, delay_ms=0, depth=1, enter_when_closed=True)
    server = WokServer(server_settings(grpc_port=0, metrics_port=None), ModelRepository([s], "test"))
    await server.start()
    try:
        b = server.runtimes["gated"].batcher
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            stub = pb_grpc.GRPCInferenceServiceStub(ch)
            bad = encode_request("gated", {"INPUT0": np.ones((1, 4), np.float32)})
            bad.parameters["priority"].int64_param = -2
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.ModelInfer(bad)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "parameter 'priority'" in info.value.details()

            def call(rows: int, priority: int | None):
                x = {"INPUT0": np.ones((rows, 4), np.float32)}
                return asyncio.ensure_future(stub.ModelInfer(encode_request("gated", x, priority=priority)))

            module.gate.clear()
            ran_before = len(module.batch_sizes)
            first = call(1, None)
            await until(module.entered.is_set)  # held at the gate
            low = call(2, 5)
            await until(lambda: b.queued == 1)
            high = call(3, 1)
            await until(lambda: b.queued == 2)
            module.gate.set()
            await asyncio.gather(first, low, high)
            # Each ran alone (2 + 3 rows are more than a batch of 4): in the order the batcher took them.
            assert module.batch_sizes[ran_before:] == [1, 3, 2]
    finally:
        module.gate.set()
        await server.stop(grace=5)


@pytest.mark.parametrize("a_rows", [2, 4], ids=["partial", "full"])
async def test_the_drain_runs_the_most_urgent_key_first(gated, a_rows):
    # Every queue is due at the stop; the most urgent goes first, as at any flush. Before, the drain
    # took the keys in the order their queues were made (or a full one first), so a less urgent key
    # made earlier ran before an urgent one, which could then miss its deadline.
    s, m, ex = gated(max_batch_size=4, delay_ms=0, depth=1)
    b = make_batcher(s, ex, policy(60_000, 4, alpha_ms=1, beta_ms=0))
    m.gate.clear()
    running = submit(b, 0.0)
    await wait_entered(m)
    x = {"INPUT0": np.ones((1, 4), np.float32)}
    less = [b.submit(x, 1, "A", None, 3) for _ in range(a_rows)]
    urgent = [b.submit(x, 1, "B", None, 1) for _ in range(2)]
    stopping = asyncio.ensure_future(b.stop())
    await asyncio.sleep(0)  # the stop has begun: what is queued drains
    m.gate.set()
    await asyncio.gather(running.future, *(p.future for p in less + urgent))
    await stopping
    assert max(p.dispatched for p in urgent) < min(p.dispatched for p in less)
    assert b.queued == 0 and b.inflight == 0


# -- bounded work and state ---------------------------------------------------------------------


async def test_answered_requests_do_not_pile_up_behind_a_queued_earlier_deadline(gated):
    # A less urgent request holds its queue's earliest deadline while urgent work with later ones
    # keeps leaving. Entries left each queue's deadline heap only from its top, so every request
    # answered (or withdrawn) meanwhile stayed there, with its tensors and future, until that
    # deadline: up to slo_ms (60 s here) of traffic. Driven: no timing involved.
    s, _m, ex = gated(max_batch_size=8)
    b = make_batcher(s, ex, policy(60_000, 8, alpha_ms=1, beta_ms=0.1), start=False)
    starved = submit(b, priority=5)
    for _ in range(200):
        ps = [submit(b, priority=1) for _ in range(8)]
        key = b._keys[None]
        assert b._form(key, b._queues[key], "size", time.perf_counter()).requests == ps
        b.withdraw(submit(b, priority=1))
    assert starved.state == QUEUED and b.queued == 1
    # Dead entries go once they outnumber the live ones by a margin: a bound on the queue, not on
    # the traffic served (1,801 entries here before).
    q = b._queues[b._keys[None]]
    assert len(q.deadlines) <= 2 * b.queued + 64, len(q.deadlines)
    assert b._expire_due(time.perf_counter()) == starved.deadline
    b._fail_queued(DeadlineExceeded("test over"))
    starved.future.exception()


async def test_a_pass_over_many_keys_visits_only_the_queues_whose_deadline_is_due(gated, monkeypatch):
    # The task's pass for queued deadlines took the minimum over every queue: O(keys) at each wake,
    # with many keys (models with many shapes) most of the batcher's cost per request.
    s, _m, ex = gated(max_batch_size=8)
    b = make_batcher(s, ex, policy(60_000, 8, alpha_ms=1, beta_ms=0.1), start=False)
    x = {"INPUT0": np.ones((1, 4), np.float32)}
    t0 = time.perf_counter()
    ps = [b.submit(x, 1, k, t0 + 10 + k, None) for k in range(200)]  # key k: deadline in 10 + k s
    visited = []
    expire_heap = b._expire_heap
    monkeypatch.setattr(b, "_expire_heap", lambda heap, now: visited.append(heap) or expire_heap(heap, now))
    assert b._expire_due(t0) == ps[0].deadline and len(visited) == 1
    early = b.submit(x, 1, 150, t0 + 5, None)  # key 150's earliest deadline comes earlier
    assert b._expire_due(t0) == early.deadline
    b.withdraw(ps[0])
    visited.clear()
    # Key 150's early request expires; key 150 and key 0 (emptied) are looked at, then key 1.
    assert b._expire_due(t0 + 5.5) == ps[1].deadline and len(visited) <= 4, len(visited)
    with pytest.raises(DeadlineExceeded, match="deadline passed before it could run"):
        early.future.result()
    assert ps[150].state == QUEUED and b.queued == 199
    b._fail_queued(DeadlineExceeded("test over"))
    for p in ps[1:]:
        p.future.exception()
    # Keys that come and go (their queues dropped once empty) leave stale entries: bounded too.
    for k in range(300):
        b.withdraw(b.submit(x, 1, ("gone", k), None, None))
        b._pick(time.perf_counter())  # drops the emptied queue
    assert len(b._dues) <= 2 * len(b._queues) + 64, len(b._dues)


# -- the choice across many keys: sublinear, and the same as the scan it replaced -----------------


def _scan_pick_slo(b: Batcher, now: float):
    """The slo choice as it was: a scan of every queue (the reference the heap of ranks must match)."""
    slo = b.slo
    slo.max_batch_size = b.policy.max_batch_size
    flush_size = b.policy.flush_size
    best = None
    wake = math.inf
    for key, q in list(b._queues.items()):
        if q.samples <= 0:
            del b._queues[key]
            continue
        rank = b._urgency(q)
        if b._stopping:
            if best is None or rank < best[2]:
                best = (key, q, rank, "drain")
            continue
        n = q.samples
        start_by = slo.latest_start(key, rank[1], n)
        if n >= flush_size:
            reason = "size"
        elif start_by <= now:
            reason = "deadline"
        elif n >= slo.idle_target(key, now):
            reason = "idle"
        else:
            wake = min(wake, start_by, slo.idle_flush_at(key, n, now))
            continue
        if best is None or rank < best[2]:
            best = (key, q, rank, reason)
    if best is not None:
        key, q, rank, reason = best
        if reason == "drain":
            return key, q, reason, None
        pressed = _scan_pressed(b, rank, now + slo.times.predict(key, min(q.samples, slo.max_batch_size)))
        if pressed is not None:
            b.scan_pressed += 1
            return pressed[0], pressed[1], "deadline", None
        return key, q, reason, None
    return None, None, "", None if wake == math.inf else max(wake - now, 0.0)


def _scan_pressed(b: Batcher, rank, end):
    found = None
    for key, q in b._queues.items():
        if q.samples <= 0:
            continue
        r = b._urgency(q)
        if r < rank and b.slo.latest_start(key, r[1], q.samples) < end and (found is None or r < found[2]):
            found = (key, q, r)
    return None if found is None else (found[0], found[1])


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def perf_counter(self) -> float:
        return self.now


def _named(key) -> str | None:
    """The client's key of a batcher's own (batcher._Key, equal only to itself in another batcher); None for none."""
    return None if key is None else key.key


def _drive(
    b: Batcher, clock: _Clock, seed: int, hot_keys: int, hot_share: float, step_ms: float, base_ms: float
) -> list:
    """A seeded sequence of arrivals (many keys, levels, client deadlines, some shared to the
    nanosecond across keys), withdrawals, expiry passes, batch times learned per key, a busy
    instance whose spare slot is offered only full batches, then a drain; every decision and every
    batch formed, as (key, reason, wait, request numbers)."""
    rng = np.random.default_rng(seed)
    x = {"INPUT0": np.ones((1, 4), np.float32)}
    keys = [f"k{i}" for i in range(120)]
    hot = keys[:hot_keys]
    sent: list = []
    live: list = []
    log: list = []
    busy_until = -math.inf
    running = None  # (key, samples, batch time) of the batch on the instance
    for _ in range(1500):
        clock.now += float(rng.uniform(0.0, step_ms * 1e-3))
        now = clock.now
        if running is not None and now >= busy_until:
            key, samples, took = running
            b.slo.observe_batch(key, samples, took)
            b.slo.observe_hop(float(rng.uniform(0.05e-3, 0.3e-3)))
            b._busy[0], running = 0, None
        for _ in range(int(rng.integers(0, 3))):
            key = hot[int(rng.integers(len(hot)))] if rng.random() < hot_share else keys[int(rng.integers(len(keys)))]
            rows = int(rng.integers(1, 4))
            level = [None, 1, 2, 3][int(rng.integers(4))]
            u = rng.random()
            # Client deadlines: none (the SLO's); on a 5 ms grid, so that queues tie on rank; a few ms
            # away, so that a fresh queue not yet due is pressed by a less urgent one's batch; random.
            grid = 1000.0 + 5e-3 * (math.ceil((now - 1000.0) / 5e-3) + 3 + int(rng.integers(40)))
            if u < 0.35:
                deadline = None
            elif u < 0.6:
                deadline = grid
            elif u < 0.75:
                deadline = now + float(rng.uniform(4e-3, 12e-3))
            else:
                deadline = now + float(rng.uniform(12e-3, 0.3))
            try:
                p = b.submit(x, rows, key, deadline, level)
            except (DeadlineUnmeetable, DeadlineExceeded) as exc:
                log.append(("refused", key, type(exc).__name__))
                continue
            sent.append(p)
            live.append(p)
        if live and rng.random() < 0.05:
            p = live.pop(int(rng.integers(len(live))))
            b.withdraw(p)
        live = [p for p in live if p.state == QUEUED]
        b._expire_due(now)
        busy = running is not None
        start = b._free_time(0, now)
        key, q, reason, wait = b._pick(now, full_only=busy, start=start)
        log.append(("pick", busy, _named(key), reason, wait))
        if q is None:
            continue
        batch = b._form(key, q, reason, now, start)
        if batch is None:
            continue
        numbers = [sent.index(p) for p in batch.requests]
        log.append(("batch", _named(key), reason, numbers))
        # Each key's batches take their own time, so that keys with fits of their own differ.
        took = (base_ms + 0.5 * (int(key.key[1:]) % 7)) * 1e-3 + 0.2e-3 * batch.samples
        b._free_at[0] = start + b.slo.times.predict(key, batch.samples)
        if not busy:
            b._busy[0] = 1
            busy_until, running = now + took, (key, batch.samples, took)
    b._stopping = True
    while True:
        key, q, reason, _ = b._pick(clock.now, start=clock.now)
        if q is None:
            break
        batch = b._form(key, q, reason, clock.now, clock.now)
        if batch is not None:
            log.append(("batch", _named(key), reason, [sent.index(p) for p in batch.requests]))
    assert b.queued == 0
    for p in sent:  # answered in no batch here: their futures are left; retrieve the failed ones
        if p.future.done() and not p.future.cancelled():
            p.future.exception()
    return log


# (seed, hot keys, their share of the arrivals, max ms between steps, each key's base batch ms)
@pytest.mark.parametrize(
    "drive", [(1, 2, 0.8, 2.0, 1.0), (1, 6, 0.4, 1.5, 2.0), (2, 3, 0.7, 1.5, 1.0)], ids=["light", "heavy", "mixed"]
)
async def test_the_choice_across_many_keys_is_the_one_a_scan_of_every_queue_makes(gated, monkeypatch, drive):
    # The slo choice visits the queues by rank (a heap) and stops at the first due, instead of
    # scanning every queue twice per batch. Two batchers on one fake clock get the same sequence;
    # one chooses by the scan it replaced. Every decision, wait and batch must be the same.
    from wok import batcher as batcher_module

    clock = _Clock()
    monkeypatch.setattr(batcher_module, "time", clock)
    logs = []
    for scan in (False, True):
        s, _m, ex = gated(max_batch_size=8, depth=2)
        # τ = 1 ms: a queue just joined is not due by the idle rule (λα above its samples) for a
        # while, so that more urgent queues wait while others go.
        slo = policy(120, 8, alpha_ms=3, beta_ms=0.2, margin_ms=0.5, tau_s=0.001)
        b = make_batcher(s, ex, slo, start=False)
        if scan:
            b.scan_pressed = 0
            b._pick_slo = lambda now, b=b: _scan_pick_slo(b, now)
            b._pressed = lambda rank, end, b=b: _scan_pressed(b, rank, end)
        clock.now = 1000.0
        logs.append(_drive(b, clock, *drive))
        if not scan:
            assert len(b._ranks) <= 2 * len(b._queues) + 64
    heap, scan = logs
    reasons = {e[2] for e in heap if e[0] == "batch"}
    assert {"size", "deadline", "idle", "drain"} <= reasons, reasons  # every rule was exercised
    assert any(e[0] == "pick" and e[1] and e[2] is None for e in heap)  # a full batch held back, pressed
    assert b.scan_pressed > 0  # an idle instance's batch went to a more urgent queue not yet due
    assert len(heap) == len(scan)
    for i, (a, c) in enumerate(zip(heap, scan)):
        assert a == c, (i, a, c)


async def test_a_choice_among_many_keys_visits_the_queues_down_to_the_first_due(gated, monkeypatch):
    # 200 keys, one request each; the three most urgent are not due, the fourth is full. The scan
    # looked at every queue's urgency twice (the choice, then whether a more urgent one is pressed).
    s, _m, ex = gated(max_batch_size=4)
    b = make_batcher(s, ex, policy(60_000, 4, alpha_ms=1, beta_ms=0.1, tau_s=10.0), start=False)
    x = {"INPUT0": np.ones((1, 4), np.float32)}
    t0 = time.perf_counter()
    ps = [b.submit(x, 1, k, t0 + 10 + k, None) for k in range(200)]  # key k: deadline in 10 + k s
    full = [b.submit(x, 1, 3, None, None) for _ in range(3)]  # key 3 holds 4: full
    for k in range(3):
        b.slo.arrived(b._keys[k], t0, 10_000)  # a high rate: λα far above one sample, so keys 0-2 wait
    looked = []
    urgency = b._urgency
    monkeypatch.setattr(b, "_urgency", lambda q: looked.append(q) or urgency(q))
    key = b._keys[3]
    assert b._pick(t0)[:3] == (key, b._queues[key], "size")
    assert len(looked) <= 6, len(looked)
    b._fail_queued(DeadlineExceeded("test over"))
    for p in ps + full:
        p.future.exception()
