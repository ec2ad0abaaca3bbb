"""slo admission costs the queue ahead in the batches the batcher forms: with preferred batch sizes a
backlog flushes "size" batches of the largest preferred size, not of max_batch_size; after the admin
API lowered max_batch_size, a request over it runs alone, as one batch of its rows.

As in test_slo_policy.py, the policy is told the batch time (a seeded fit: T(n) = α + β·n exactly).
The backlog is played out by asking `_pick` / `_form` at the times its batches would start, so the
check does not depend on how fast the host runs the model.
"""

from __future__ import annotations

import asyncio
import heapq
import random
from functools import partial

import grpc
import numpy as np
import pytest

from wok.batcher import Batcher, BatchingPolicy
from wok.errors import DeadlineUnmeetable
from wok.policy import SloPolicy
from wok.stats import ModelStats

MS = 1e-3


def slo_policy(slo_ms, max_batch_size, instances, alpha_ms, beta_ms) -> SloPolicy:
    return SloPolicy(
        slo_ms * MS, max_batch_size, instances, seed=(alpha_ms * MS, beta_ms * MS), initial_margin_s=1 * MS
    )


def submit(b: Batcher, rows=1, deadline=None):
    return b.submit({"INPUT0": np.ones((rows, 4), np.float32)}, rows, None, deadline)


def simulated_finish(free, ahead, rows, size, t) -> float:
    """Play the batches out: the queue ahead in batches of `size` (never splitting the request), each
    on the instance free first; when the request's own batch starts, plus its time T(own)."""
    full, part = divmod(ahead, size)
    batches = [size] * full
    if part + rows <= size:
        own = part + rows
    else:
        batches += [part] if part else []
        own = rows
    heap = list(free)
    heapq.heapify(heap)
    for n in batches:
        heapq.heappush(heap, heapq.heappop(heap) + t(n))
    return heap[0] + t(own)


def play_backlog(b: Batcher, slo: SloPolicy, ps: list, count: int) -> tuple[set, list, list]:
    """Run the queue out without the batcher's task: each batch starts when an instance is free and
    runs T(n). (The flush reasons, the batch sizes, the requests dropped at their batch.)

    The instances are free at the first arrival: admission judged each request from its own
    arrival, so however slowly the host submitted them, no batch starts later than it assumed.
    An instance free with nothing due waits as the batcher's task would: to the latest start of
    the requests left, due later when the host submitted them late (a stall of 250 ms among the
    submits left the last batch not due: `_form` was handed no queue, 1 in 8 runs on one starved
    core with stalls).
    """
    free = [ps[0].arrival] * count
    reasons, sizes = set(), []
    while b.queued:
        now = heapq.heappop(free)
        key, q, reason, wait = b._pick(now)
        if q is None:
            assert wait, f"{b.queued} request(s) queued, none due at {now} and no time to wait for"
            heapq.heappush(free, now + wait)
            continue
        batch = b._form(key, q, reason, now, now)
        if batch is not None:  # None: every request it would have taken was dropped
            reasons.add(reason)
            sizes.append(batch.samples)
            now += slo.times.predict(key, batch.samples)
        heapq.heappush(free, now)
    dropped = [p for p in ps if p.future.done()]
    for p in dropped:
        p.future.exception()
    return reasons, sizes, dropped


def test_the_estimate_is_the_played_out_batches_of_the_flush_size_on_every_instance():
    # T(n) = 10 + n ms, margin 1 ms. 5 ahead in batches of 2: two of 2 (12 ms each), then its own of 2.
    p = slo_policy(50, 8, 1, alpha_ms=10, beta_ms=1)
    assert p.finish_estimate("k", 1.0, 5, 1, 2) == pytest.approx(1.0 + 0.024 + 0.012 + 0.001)
    # Lowered to 2: 8 rows run alone, T(8) = 18 ms; behind 3, the 1 left over runs without it (11 ms).
    p.max_batch_size = 2
    assert p.finish_estimate("k", 1.0, 0, 8) == pytest.approx(1.0 + 0.018 + 0.001)
    assert p.finish_estimate("k", 1.0, 3, 8) == pytest.approx(1.0 + 0.012 + 0.011 + 0.018 + 0.001)
    # Against the batches played out, for any instances, flush size, queue and request size.
    rng = random.Random(7)
    for _ in range(3000):
        k, m = rng.randint(1, 4), rng.randint(1, 8)
        p = slo_policy(50, m, k, alpha_ms=rng.choice([0.0, 10.0]), beta_ms=rng.choice([0.0, 1.0, 7.0]))
        free = [rng.choice([0.0, rng.uniform(0, 0.1)]) for _ in range(k)]
        size, ahead, rows = rng.randint(1, m), rng.randint(0, 40), rng.randint(1, 2 * m)
        want = simulated_finish(free, ahead, rows, size, partial(p.times.predict, "k")) + p.margin
        got = p.finish_estimate("k", free, ahead, rows, size)
        assert got == pytest.approx(want, abs=1e-9), (free, m, size, ahead, rows)


def test_with_rows_that_differ_the_estimate_bounds_the_batches_formed_first_in_first_out():
    # Requests of 1..R rows packed greedily into batches of at most `size` (never split), each on
    # the instance free first: the request's batch ends no later than the estimate with
    # pack = size − R + 1 (and exactly there when the rows happen to pack as the bound assumes).
    rng = random.Random(11)
    for _ in range(3000):
        k, size = rng.randint(1, 4), rng.randint(2, 8)
        p = slo_policy(50, size, k, alpha_ms=rng.choice([0.0, 10.0]), beta_ms=rng.choice([0.0, 1.0, 7.0]))
        t = partial(p.times.predict, "k")
        free = [rng.choice([0.0, rng.uniform(0, 0.1)]) for _ in range(k)]
        most = rng.randint(2, size)
        queue = [rng.randint(1, most) for _ in range(rng.randint(0, 12))]
        rows = rng.randint(1, most)
        batches, n = [], 0
        for r in queue:
            if n + r > size:
                batches.append(n)
                n = 0
            n += r
        if n + rows > size:
            batches.append(n)
            n = 0
        heap = list(free)
        heapq.heapify(heap)
        for b in batches:
            heapq.heappush(heap, heapq.heappop(heap) + t(b))
        real = heap[0] + t(n + rows) + p.margin
        pack = size - max([rows, *queue]) + 1
        got = p.finish_estimate("k", free, sum(queue), rows, size, pack)
        assert got >= real - 1e-9, (free, size, queue, rows)


@pytest.mark.parametrize(("count", "admitted"), [(1, 26), (2, 52)])
async def test_with_preferred_sizes_a_backlog_admits_only_what_its_batches_finish_in_time(
    gated_instances, count, admitted
):
    # T(n) = 20 + n ms, margin 1 ms, SLO 300 ms, max 8, preferred 2: a backlog runs batches of 2,
    # 22 ms each. One instance: the request with S ahead is in batch S // 2, which starts at
    # 22·(S // 2) ms and ends by 22·(S // 2) + 22 + 1: S = 25 in (287 ms), S = 26 out (309 ms).
    # Two instances run two batches side by side: S = 51 in, 52 out. (Costed in batches of 8, 80
    # and 100 would have been admitted, and most of them dropped at their batch.)
    _m, ex = gated_instances(count)
    slo = slo_policy(300, 8, count, alpha_ms=20, beta_ms=1)
    b = Batcher("gated", ex, BatchingPolicy(8, 1e-3, (2,)), ModelStats("gated"), slo=slo)
    b._loop = asyncio.get_running_loop()  # no task: the test plays the batches out itself
    b._wakeup = asyncio.Event()
    ps, refused = [], []
    for _ in range(100):
        try:
            ps.append(submit(b))
        except DeadlineUnmeetable as exc:
            refused.append(exc)
    reasons, sizes, dropped = play_backlog(b, slo, ps, count)
    assert dropped == []  # every admitted request went into a batch predicted to end in time
    assert reasons == {"size"} and sizes == [2] * (admitted // 2)
    # ... and what was refused would not have: the next batch of 2 would end past the SLO.
    assert len(ps) == admitted and len(refused) == 100 - admitted
    assert refused[0].code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert f"with {admitted} samples queued ahead of it" in str(refused[0])


@pytest.mark.parametrize(
    ("count", "preferred", "rows", "admitted", "batch"),
    [
        (1, (8,), (1,), 80, 8),
        (1, (8,), (2,), 40, 8),
        (1, (8,), (3,), 22, 6),
        (2, (8,), (3,), 44, 6),
        (1, (), (3,), 22, 6),
        (1, (8,), (1, 3, 2), 30, None),
    ],
)
async def test_a_backlog_of_multi_row_requests_admits_only_what_its_batches_finish_in_time(
    gated_instances, count, preferred, rows, admitted, batch
):
    # T(n) = 20 + n ms, margin 1 ms, SLO 300 ms, flush size 8 (preferred 8 of a maximum 32, or a
    # maximum 8). A request is never split, so requests of r rows run in batches of 8 − 8 % r:
    # 8 for 1 and 2 rows (28 ms), 6 for 3 (26 ms). One instance, request i (from 0) ends by
    # 28·(i // 8) + 21 + i % 8 + 1 ms (1 row: i = 79 in at 281, 80 out at 302); by
    # 28·(i // 4) + 23 + 2·(i % 4) (2 rows: 39 in at 281, 40 out at 303); by 26·(i // 2) + 24 +
    # 3·(i % 2) (3 rows: 21 in at 287, 22 out at 310; costed in batches of 8, 26 were admitted and
    # 4 of them dropped at their batch). Two instances run batches side by side: 26·(i // 4) + ...,
    # 43 in, 44 out. Rows cycling 1, 3, 2: a batch holds at least 8 − 3 + 1 = 6 samples and takes
    # at most T(8), so request i = 3k + m, 6k + (0, 1, 4)[m] samples ahead, ends by at most
    # 28·k + 21 + (1, 4, 6)[m]: k = 9 in (at most 279), k = 10 out (302 and more).
    _m, ex = gated_instances(count, max_batch_size=32)
    m = 32 if preferred else 8
    slo = slo_policy(300, m, count, alpha_ms=20, beta_ms=1)
    b = Batcher("gated", ex, BatchingPolicy(m, 1e-3, preferred), ModelStats("gated"), slo=slo)
    b._loop = asyncio.get_running_loop()  # no task: the test plays the batches out itself
    b._wakeup = asyncio.Event()
    ps, refused = [], []
    for i in range(100):
        try:
            ps.append(submit(b, rows=rows[i % len(rows)]))
        except DeadlineUnmeetable as exc:
            refused.append(exc)
    _reasons, sizes, dropped = play_backlog(b, slo, ps, count)
    assert dropped == []  # every admitted request went into a batch predicted to end in time
    assert len(ps) == admitted and len(refused) == 100 - admitted
    if batch is not None:
        assert sizes == [batch] * (admitted * rows[0] // batch)
        assert f"with {admitted * rows[0]} samples queued ahead of it" in str(refused[0])
    # Every request that left the queue took its row count with it.
    assert b.queued == 0 and all(not q.rows for q in b._queues.values())


@pytest.mark.parametrize(
    ("rows", "admitted", "batch", "ahead"), [((3,), 22, 6, 66), ((5,), 11, 5, 55), ((3, 5), 10, 8, 40)]
)
async def test_requests_over_every_preferred_size_are_costed_in_the_batches_they_form(
    gated_instances, rows, admitted, batch, ahead
):
    # T(n) = 20 + n ms, margin 1 ms, SLO 300 ms, max 8, preferred 2. A request over every preferred
    # size takes what fits beside it up to the maximum, so requests of 3 rows run in batches of 6
    # (26 ms; request i ends by 26·(i // 2) + 24 + 3·(i % 2): 21 in at 287, 22 out at 310), of 5
    # rows alone (25 ms; i ends by 25·i + 26: 10 in at 276, 11 out at 301). Rows 3, 5, 3, 5, ...:
    # a batch holds at least 8 − 5 + 1 = 4 samples and takes at most T(8), so request 2k ends by at
    # most 56·k + 24, 2k + 1 by 56·k + 29: k = 4 in, k = 5 out (304). Costed in batches of the flush
    # size 2, only 9, 5 and 4 were admitted.
    _m, ex = gated_instances(1)
    slo = slo_policy(300, 8, 1, alpha_ms=20, beta_ms=1)
    b = Batcher("gated", ex, BatchingPolicy(8, 1e-3, (2,)), ModelStats("gated"), slo=slo)
    b._loop = asyncio.get_running_loop()  # no task: the test plays the batches out itself
    b._wakeup = asyncio.Event()
    ps, refused = [], []
    for i in range(40):
        try:
            ps.append(submit(b, rows=rows[i % len(rows)]))
        except DeadlineUnmeetable as exc:
            refused.append(exc)
    reasons, sizes, dropped = play_backlog(b, slo, ps, 1)
    assert dropped == []  # every admitted request went into a batch predicted to end in time
    assert reasons == {"size"} and sizes == [batch] * (ahead // batch)
    assert len(ps) == admitted and len(refused) == 40 - admitted
    assert f"with {ahead} samples queued ahead of it" in str(refused[0])
    assert b.queued == 0


async def test_requests_over_every_preferred_size_are_not_admitted_past_what_their_batches_meet(gated_instances):
    # T(n) = 5·n ms (no fixed cost), margin 1 ms, SLO 300 ms, max 16, preferred 5, two instances.
    # Requests of 8 rows run two to a batch of 16 (80 ms), two batches side by side: request i
    # ends by 80·(i // 4) + 41 when first in its batch, + 81 when second: 12 in (281 ms), 13 out
    # (321). Costed in batches of the flush size 5 (25 ms each), request 13 was said to end by
    # 291 ms: admitted, then dropped at its batch as late.
    _m, ex = gated_instances(2, max_batch_size=16)
    slo = slo_policy(300, 16, 2, alpha_ms=0, beta_ms=5)
    b = Batcher("gated", ex, BatchingPolicy(16, 1e-3, (5,)), ModelStats("gated"), slo=slo)
    b._loop = asyncio.get_running_loop()  # no task: the test plays the batches out itself
    b._wakeup = asyncio.Event()
    ps, refused = [], []
    for _ in range(20):
        try:
            ps.append(submit(b, rows=8))
        except DeadlineUnmeetable as exc:
            refused.append(exc)
    _reasons, sizes, dropped = play_backlog(b, slo, ps, 2)
    assert dropped == []
    assert len(ps) == 13 and sizes == [16] * 6 + [8]
    assert "with 104 samples queued ahead of it" in str(refused[0])
    assert b.queued == 0


async def test_after_max_is_lowered_a_request_over_it_is_admitted_as_one_batch_of_its_rows(gated_instances):
    # T = 100 ms whatever n, SLO 400 ms, margin 1 ms; the maximum lowered from 8 to 2. A probe runs
    # (gated); 1 row and then 8 rows queue behind it. The 8 run alone after the 1: they end by
    # 100 + 100 + 100 + 1 ms from the probe's dispatch. (As 5 batches of 2 it was 501 ms: refused.)
    m, ex = gated_instances(1)
    slo = slo_policy(400, 8, 1, alpha_ms=100, beta_ms=0)
    b = Batcher("gated", ex, BatchingPolicy(8, 1e-3), ModelStats("gated"), slo=slo)
    b.start()
    b.set_policy(BatchingPolicy(2, 1e-3))  # as POST /admin/batching does
    m.gate.clear()
    probe = submit(b)
    await asyncio.to_thread(m.entered.wait, 10)
    try:
        one = submit(b)
        big = submit(b, rows=8)
    finally:
        m.gate.set()
    outs = await asyncio.gather(probe.future, one.future, big.future)
    assert outs[2]["OUTPUT0"].shape == (8, 4) and (outs[2]["OUTPUT0"] == 2.0).all()
    assert m.batch_sizes == [1, 1, 8]
    await b.stop()
