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
from wok.config import model_config_from_dict
from wok.errors import DeadlineUnmeetable
from wok.executor import Executor
from wok.policy import SloPolicy
from wok.servable import Servable
from wok.stats import ModelStats

from .conftest import GatedDouble

MS = 1e-3


@pytest.fixture
def gated_instances():
    """Build (module, executor) for the gated model with `count` CPU instances (one module, one gate)."""
    made = []

    def build(count: int, max_batch_size: int = 8):
        cfg = model_config_from_dict(
            {
                "name": "gated",
                "platform": "python",
                "factory": "tests:unused",
                "inputs": [{"name": "INPUT0", "datatype": "FP32", "dims": [4]}],
                "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "dims": [4]}],
                "max_batch_size": max_batch_size,
                "instances": {"count": count, "devices": ["cpu"], "pipeline_depth": 1},
            },
            "test",
        )
        module = GatedDouble()
        s = Servable(cfg, module)
        ex = Executor(s, s.config.instances, cpu_linear="torch")
        made.append(ex)
        return module, ex

    yield build
    for ex in made:
        ex.shutdown()


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
    # Each batch starts when an instance is free (all of them at the last arrival) and runs T(n).
    free = [ps[-1].arrival] * count
    reasons, sizes = set(), []
    while b.queued:
        now = heapq.heappop(free)
        key, q, reason, _ = b._pick(now)
        batch = b._form(key, q, reason, now, now)
        if batch is not None:  # None: every request it would have taken was dropped
            reasons.add(reason)
            sizes.append(batch.samples)
            now += slo.times.predict(key, batch.samples)
        heapq.heappush(free, now)
    dropped = [p for p in ps if p.future.done()]
    for p in dropped:
        p.future.exception()
    assert dropped == []  # every admitted request went into a batch predicted to end in time
    assert reasons == {"size"} and sizes == [2] * (admitted // 2)
    # ... and what was refused would not have: the next batch of 2 would end past the SLO.
    assert len(ps) == admitted and len(refused) == 100 - admitted
    assert refused[0].code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert f"with {admitted} samples queued ahead of it" in str(refused[0])


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
