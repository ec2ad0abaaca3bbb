"""The slo policy with several instances and across batch keys: admission simulates each instance,
a full batch takes the spare slot of the instance free first, a request's finish is judged from
when its instance is free and with its batch's own size, and urgency orders the batch keys.

As in test_slo_policy.py, the policy is told the batch time (a seeded fit: T(n) = α + β·n exactly)
and the test gates the model or asks `_pick` / `_form` at times it chooses.
"""

from __future__ import annotations

import asyncio
import heapq
import random
import time

import numpy as np
import pytest

from wok import policy as policy_module
from wok.batcher import Batcher, BatchingPolicy
from wok.errors import DeadlineExceeded, DeadlineUnmeetable
from wok.policy import SloPolicy
from wok.stats import ModelStats

from .conftest import until

MS = 1e-3


def batcher(executor, slo_ms, max_batch_size, alpha_ms, beta_ms, *, start=True, tau_s=0.1) -> Batcher:
    slo = SloPolicy(
        slo_ms * MS, max_batch_size, len(executor.instances), seed=(alpha_ms * MS, beta_ms * MS),
        rate_tau_s=tau_s, initial_margin_s=1 * MS,
    )  # fmt: skip
    b = Batcher("gated", executor, BatchingPolicy(max_batch_size, 1e-3), ModelStats("gated"), slo=slo)
    if start:
        b.start()
    else:  # decisions are asked of `_pick` / `_form` by the test, at times it chooses
        b._loop = asyncio.get_running_loop()
        b._wakeup = asyncio.Event()
    return b


def submit(b: Batcher, rows=1, key=None, deadline=None, priority=None):
    return b.submit({"INPUT0": np.ones((rows, 4), np.float32)}, rows, key, deadline, priority)


def finish_all(b: Batcher, *ps) -> None:
    b._fail_queued(DeadlineExceeded("test over"))
    for p in ps:
        if p.future.done() and not p.future.cancelled():
            p.future.exception()


# -- where the k-th batch starts ------------------------------------------------------------------


def test_nth_start_is_the_start_of_batch_k_on_the_instance_free_first():
    # Instances free at 0 and 0.25, batches of 0.1: they start at 0, 0.1, 0.2 (first instance),
    # 0.25 (second), 0.3, 0.35, 0.4, 0.45, ... alternately.
    starts = [0.0, 0.1, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5]
    assert [policy_module.nth_start([0.25, 0.0], k, 0.1) for k in range(9)] == pytest.approx(starts)
    assert policy_module.nth_start([3.0], 5, 0.5) == pytest.approx(5.5)
    # Against the simulation it stands for, for any number of batches and instances.
    rng = random.Random(5)
    for _ in range(2000):
        free = [rng.choice([0.0, rng.uniform(0, 3)]) for _ in range(rng.randint(1, 6))]
        step, k = rng.choice([0.01, 0.37, 1.0]), rng.randint(0, 60)
        heap = list(free)
        heapq.heapify(heap)
        for _ in range(k):
            heapq.heappush(heap, heapq.heappop(heap) + step)
        assert policy_module.nth_start(free, k, step) == pytest.approx(heap[0], abs=1e-9), (free, k, step)


# -- admission with several instances -------------------------------------------------------------


async def test_two_idle_instances_admit_the_two_batches_they_run_at_once(gated_instances):
    # α = 100 ms, β = 1 ms, max batch 8, SLO 150 ms, margin 1 ms, 2 idle instances. A burst of 16:
    # two batches of 8 run side by side, done in 108 + 1 ms. The 17th would start on the first
    # instance to free, at 108 ms, and end at 108 + 101 + 1 = 210 ms: refused, 60 ms late.
    _m, ex = gated_instances(count=2)
    b = batcher(ex, 150, 8, alpha_ms=100, beta_ms=1, start=False)
    ps = [submit(b) for _ in range(16)]  # the first is a probe; the other 15 are checked
    assert b.queued == 16
    with pytest.raises(DeadlineUnmeetable, match="16 samples queued ahead of it") as info:
        submit(b)
    assert info.value.retry_after_s == pytest.approx(0.060, abs=1e-6)
    finish_all(b, *ps)


async def test_admission_counts_a_busy_instance_busy(gated_instances):
    # α = 10 ms, β = 100 ms: T(1) = 110 ms, T(8) = 810 ms. Instance 0 runs a batch of 8 (gated),
    # predicted to end 810 ms after its dispatch; instance 1 is idle; 8 samples are queued. A
    # request with 700 ms left: the 8 run on instance 1 (810 ms), and its own batch on whichever
    # frees first, at about 810 ms: it ends about 921 ms from now, past 700. (Spreading the 8
    # over both instances as if both were free said 405 + 110 + 1 = 516 ms: admitted, then late.)
    m, ex = gated_instances(count=2)
    b = batcher(ex, 10_000, 8, alpha_ms=10, beta_ms=100, start=False)
    m.gate.clear()
    running = submit(b, rows=8)
    key = b._keys[None]
    b._dispatch(b._form(key, b._queues[key], "size", running.arrival), None)
    assert b._busy == [1, 0]
    queued = [submit(b) for _ in range(8)]
    now = queued[-1].arrival
    with pytest.raises(DeadlineUnmeetable, match="8 samples queued ahead of it") as info:
        submit(b, deadline=now + 0.700)
    assert 0.100 < info.value.retry_after_s <= 0.221 + 1e-6
    finish_all(b, *queued)
    m.gate.set()
    await running.future


# -- the spare slot, and judging a request from when its instance is free -------------------------


async def test_a_full_batch_takes_the_spare_slot_of_the_instance_free_first(gated_instances):
    # α = 10 ms, β = 200 ms: T(1) = 210 ms, T(8) = 1,610 ms; 2 instances with 2 slots each. Instance
    # 0 runs 8 (free in 1,610 ms), instance 1 runs 1 (free in 210 ms); 8 more arrive, a full batch
    # for a spare slot: behind the 1 it starts 1,400 ms sooner than behind the 8. Predicted times
    # long enough that a stalled host does not outlast both (an instance running over its
    # prediction counts as free now): with T(8) = 170 ms, a stall past it made them even, and the
    # batch took instance 0's spare slot (1 in 8 runs on one starved core with stalls).
    m, ex = gated_instances(count=2, depth=2)
    b = batcher(ex, 10_000, 8, alpha_ms=10, beta_ms=200)
    m.gate.clear()
    first = [submit(b) for _ in range(8)]
    await until(lambda: b.inflight == 1)
    single = submit(b)  # λα = 0.9 < 1 sample: the idle instance takes it at once
    await until(lambda: b.inflight == 2)
    assert b._busy == [1, 1]
    second = [submit(b) for _ in range(8)]
    await until(lambda: b.inflight == 3)
    assert b._busy == [1, 2]
    m.gate.set()
    await asyncio.gather(*(p.future for p in [*first, single, *second]))
    assert b.stats.flushes == {"size": 2, "idle": 1}
    await b.stop()


async def test_a_request_is_judged_from_when_its_busy_instance_frees(gated_instances):
    # One instance, 2 slots; α = 10 ms, β = 100 ms: T(1) = 110 ms, T(8) = 810 ms. A batch of 8
    # runs, predicted free 810 ms after its dispatch. R (1 s left) is admitted: alone after it, it
    # would end at about 921 ms. 7 more fill a batch for the spare slot: it starts when the
    # instance frees and takes 810 ms, so R would end at about 1,620 ms: it is dropped there and
    # then, not sent to finish late.
    m, ex = gated_instances(count=1, depth=2)
    b = batcher(ex, 10_000, 8, alpha_ms=10, beta_ms=100)
    m.gate.clear()
    running = [submit(b) for _ in range(8)]
    await until(lambda: b.inflight == 1)
    r = submit(b, deadline=time.perf_counter() + 1.0)
    rest = [submit(b) for _ in range(7)]
    await until(lambda: b.inflight == 2)
    with pytest.raises(DeadlineExceeded, match=r"would pass before its batch finished .*after its instance is free in"):
        r.future.result()
    m.gate.set()
    await asyncio.gather(*(p.future for p in running + rest))
    assert m.batch_sizes == [8, 7]
    await b.stop()


async def test_a_request_is_judged_by_its_own_batch_not_the_whole_queue(gated_instances):
    # α = 5 ms, β = 20 ms: T(n) = 5 + 20n ms. Queued: A and B (level 1, deadlines in 40 and 60 ms),
    # a level-2 probe, and Y (8 rows), which does not fit beside them. The batch is A, B and the
    # probe: 3 samples, 65 ms, past A's deadline; without A it is 2 samples, 45 ms, within B's.
    # (The queue's 11 samples would say 165 ms and drop both.)
    _m, ex = gated_instances(count=1)
    b = batcher(ex, 1000, 8, alpha_ms=5, beta_ms=20, start=False)
    probe = submit(b, priority=2)
    a = submit(b, deadline=probe.arrival + 0.040, priority=1)
    bb = submit(b, deadline=probe.arrival + 0.060, priority=1)
    y = submit(b, rows=8, priority=2)
    key = b._keys[None]
    batch = b._form(key, b._queues[key], "deadline", bb.arrival)
    assert batch.requests == [bb, probe] and batch.samples == 2
    with pytest.raises(DeadlineExceeded, match=r"batch predicted to take 65\.0 ms"):
        a.future.result()
    finish_all(b, y)


# -- across batch keys: the most urgent first -------------------------------------------------------


async def test_an_urgent_request_of_another_key_goes_before_a_full_less_urgent_batch(gated_instances):
    # α = 100 ms, β = 1 ms, SLO 400 ms. Key A holds a full batch of level 2; then B (level 1, 250 ms
    # left) is admitted, nothing as urgent being ahead of it. 100 ms later, an instance idle, both
    # are due (A full, B by the idle rule): B goes first, as admission assumed (A's 108 ms first
    # would have B end at about 310 ms).
    _m, ex = gated_instances(count=1)
    b = batcher(ex, 400, 8, alpha_ms=100, beta_ms=1, start=False)
    low = [submit(b, key="A", priority=2) for _ in range(8)]
    urgent = submit(b, key="B", deadline=low[-1].arrival + 0.250, priority=1)
    key, _q, reason, _ = b._pick(urgent.arrival + 0.100)
    assert (key.key, reason) == ("B", "idle")
    finish_all(b, *low, urgent)


async def test_among_one_level_the_earliest_deadline_goes_before_a_full_batch(gated_instances):
    # Same level everywhere. B (50 ms left) waits; 8 of key A (400 ms left) fill a batch. B goes first.
    _m, ex = gated_instances(count=1)
    b = batcher(ex, 400, 8, alpha_ms=20, beta_ms=1, start=False)
    pressed = submit(b, key="B", deadline=time.perf_counter() + 0.050)
    full = [submit(b, key="A") for _ in range(8)]
    key, _q, reason, _ = b._pick(full[-1].arrival)
    assert (key.key, reason) == ("B", "idle")
    finish_all(b, pressed, *full)


@pytest.mark.parametrize(("left_ms", "first"), [(200, "B"), (400, "A")])
async def test_a_more_urgent_queue_not_yet_due_goes_first_when_it_would_start_too_late(gated_instances, left_ms, first):
    # α = 100 ms, β = 1 ms. B (level 1) arrives at a high rate (λα = 9.9 samples: the idle rule
    # waits for more). Key A's full level-2 batch would run 108 ms. With 200 ms left, B's latest
    # start is 98 ms away: B goes now ("deadline"), and a spare slot (its instance busy another
    # 50 ms) is kept from A's batch. With 400 ms left, B can wait for A's batch, which goes first.
    _m, ex = gated_instances(count=1)
    b = batcher(ex, 10_000, 8, alpha_ms=100, beta_ms=1, start=False, tau_s=10.0)
    low = [submit(b, key="A", priority=2) for _ in range(8)]
    b_key = b._intern("B")  # the batcher's own key for B, which its rate is learned by
    b.slo.arrived(b_key, low[-1].arrival, 989)
    urgent = submit(b, key="B", deadline=low[-1].arrival + left_ms * MS, priority=1)
    now = urgent.arrival
    assert b.slo.idle_target(b_key, now) > 1
    key, _q, reason, _ = b._pick(now)
    assert (key.key, reason) == (first, "deadline" if first == "B" else "size")
    spare = b._pick(now, full_only=True, start=now + 0.050)[0]
    assert spare is (None if first == "B" else b._keys["A"])
    finish_all(b, *low, urgent)
