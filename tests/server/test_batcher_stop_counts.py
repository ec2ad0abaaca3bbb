"""A batch still in the model when a stop's grace period runs out: its callers are answered
UNAVAILABLE and counted failed then (`Batcher._fail_dispatched`); when the model returns later,
on a loop still running, nothing more is counted for them (no executed batch or metrics for
callers already answered), and the instance's slot and busy count are given back. A batch still
waiting at the worker behind it then is withdrawn: it never runs, and its requests (one whose
deadline passes meanwhile too) are answered once (the gated model's gate stays closed until each
test opens it)."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from wok.batcher import Batcher, BatchingPolicy
from wok.errors import ShuttingDown
from wok.metrics import ModelMetrics
from wok.stats import ModelStats

from .conftest import until

GRACE_S = 0.01


def make_batcher(servable, executor) -> Batcher:
    cfg = servable.config
    db = cfg.dynamic_batching
    policy = BatchingPolicy(cfg.max_batch_size, db.max_queue_delay_ms / 1e3, db.preferred_batch_sizes)
    b = Batcher(cfg.name, executor, policy, ModelStats(cfg.name), ModelMetrics(cfg.name, len(executor.instances)))
    b.start()
    return b


def submit(b: Batcher, value: float, rows: int = 1, deadline=None):
    return b.submit({"INPUT0": np.full((rows, 4), value, dtype=np.float32)}, rows, None, deadline)


async def entered(m) -> None:
    if not await asyncio.to_thread(m.entered.wait, 10):
        m.gate.set()
        raise AssertionError("no batch reached the model")


async def stop_past_grace(b: Batcher) -> None:
    """Stop as the server does (`WokServer._stop_stages`): the drain is cancelled when the grace runs out."""
    drain = asyncio.ensure_future(b.stop())
    _, pending = await asyncio.wait({drain}, timeout=GRACE_S)
    assert pending, "the stop ended within the grace period: the batch was not held in the model"
    drain.cancel()
    await asyncio.gather(drain, return_exceptions=True)


async def model_returned(b: Batcher, m, sent) -> None:
    """Open the gate and wait until every batch sent is back and `_complete` has run for it: each
    executor future's loop callback (`_complete`) was added before the one `wrap_future` adds, so
    it runs first, on this loop."""
    m.gate.set()
    for fut in sent:
        await asyncio.wait_for(asyncio.wrap_future(fut), 10)
    assert b.inflight == 0
    assert b._busy == [0]
    assert sorted(b._free_slots) == sorted(b.executor.slots())


async def answered_at_stop(*ps) -> None:
    for p in ps:
        assert p.future.done()
        with pytest.raises(ShuttingDown, match="grace period over"):
            await p.future


async def one_running_one_slot_spare(gated):
    """A batcher whose one instance (two slots) runs a batch of two rows, blocked in the model."""
    s, m, ex = gated(max_batch_size=2, delay_ms=0, depth=2)
    b = make_batcher(s, ex)
    m.gate.clear()
    m.entered.clear()
    first = submit(b, 0.0, rows=2)
    await entered(m)
    return b, m, first, b._last_sent[0]


async def both_back(b, m, ahead, held) -> None:
    """Open the gate: the running batch returns, the withdrawn one is back already; the
    instance's slots and busy count are given back."""
    m.gate.set()
    await asyncio.wait([asyncio.wrap_future(f) for f in (ahead, held)], timeout=10)
    assert ahead.done() and held.done()
    assert b.inflight == 0 and b._busy == [0]
    assert sorted(b._free_slots) == sorted(b.executor.slots())


async def test_a_batch_returning_after_the_grace_period_counts_its_requests_once(gated):
    s, m, ex = gated(max_batch_size=2, delay_ms=0, depth=1)
    b = make_batcher(s, ex)
    m.gate.clear()
    m.entered.clear()
    ps = [submit(b, 1.0), submit(b, 2.0)]  # one batch of two, blocked in the model
    await entered(m)
    sent = [b._last_sent[0]]
    assert b.inflight == 1 and sent[0] is not None
    await stop_past_grace(b)
    await answered_at_stop(*ps)
    assert b.stats.fail.count == 2
    assert b.inflight == 1  # still in the model
    await model_returned(b, m, sent)
    assert m.batch_sizes == [2]
    st = b.stats
    assert st.fail.count == 2 and st.success.count == 0
    # Not an executed batch as well: its callers were answered UNAVAILABLE and counted failed.
    assert (st.inference_count, st.execution_count, st.queue.count, st.compute_infer.count) == (0, 0, 0, 0)
    assert b.metrics.batch_size.count == 0
    assert b.metrics.stages["compute"].count == 0 and b.metrics.stages["queue"].count == 0


async def test_a_request_whose_deadline_passes_in_a_batch_withdrawn_at_the_grace_period_is_counted_once(gated):
    b, m, first, ahead = await one_running_one_slot_spare(gated)
    # The next batch waits at the busy instance's worker in its spare slot. `short`'s deadline
    # passes after the stop (the task that would answer it where it waits is then over) and
    # before the batch ahead returns. The stop withdraws the waiting batch (`_fail_dispatched`):
    # its worker never starts it, so nothing leaves `short` out and answers it a second time.
    short_deadline = time.perf_counter() + 0.3
    short = submit(b, 1.0, deadline=short_deadline)
    patient = submit(b, 2.0, deadline=time.perf_counter() + 60)
    await until(lambda: b.inflight == 2)
    held = b._last_sent[0]
    assert ahead is not None and held is not None and held is not ahead
    await stop_past_grace(b)
    assert time.perf_counter() < short_deadline, "the stop took longer than the test allows"
    await answered_at_stop(first, short, patient)
    assert b.stats.fail.count == 3
    assert held.cancelled()
    # Past `short`'s deadline before the batch ahead returns: the scenario needs the clock past
    # that instant, nothing else to wait for.
    while time.perf_counter() <= short_deadline:
        await asyncio.sleep(short_deadline - time.perf_counter() + 0.001)
    await both_back(b, m, ahead, held)
    assert m.batch_sizes == [2]  # the withdrawn batch never ran
    st = b.stats
    assert st.fail.count == 3 and st.success.count == 0  # `short` not failed a second time
    assert (st.inference_count, st.execution_count, st.queue.count) == (0, 0, 0)
    assert b.metrics.batch_size.count == 0


async def test_a_batch_waiting_at_the_worker_when_the_grace_period_runs_out_is_withdrawn(gated):
    b, m, first, ahead = await one_running_one_slot_spare(gated)
    waiting = submit(b, 1.0, rows=2)  # a full batch: it waits at the busy instance's worker, in its spare slot
    await until(lambda: b.inflight == 2)
    held = b._last_sent[0]
    assert ahead is not None and held is not None and held is not ahead
    await stop_past_grace(b)
    await answered_at_stop(first, waiting)
    assert b.stats.fail.count == 2
    # Withdrawn from the executor at once: its worker never starts it, so when the running batch
    # returns the model runs nothing more for callers already answered.
    assert held.cancelled()
    await both_back(b, m, ahead, held)
    assert m.batch_sizes == [2]
    # Only the batch that ran counts as busy.
    ran = ahead.result()
    assert b.metrics.busy_seconds == [ran.finished - ran.started]
    st = b.stats
    assert st.fail.count == 2 and st.success.count == 0
    assert (st.inference_count, st.execution_count) == (0, 0)
