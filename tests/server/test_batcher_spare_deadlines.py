"""A batch sent to a busy instance's spare slot waits at its worker behind the running batch:
its requests' deadlines are still answered when they pass, and cancelled callers are left out,
before the running batch ends (the gated model's gate stays closed until each test opens it)."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from wok.batcher import Batcher, BatchingPolicy
from wok.errors import DeadlineExceeded
from wok.stats import ModelStats


def make_batcher(servable, executor) -> Batcher:
    cfg = servable.config
    db = cfg.dynamic_batching
    policy = BatchingPolicy(cfg.max_batch_size, db.max_queue_delay_ms / 1e3, db.preferred_batch_sizes)
    b = Batcher(cfg.name, executor, policy, ModelStats(cfg.name))
    b.start()
    return b


def submit(b: Batcher, value: float, rows: int = 1, deadline=None):
    return b.submit({"INPUT0": np.full((rows, 4), value, dtype=np.float32)}, rows, None, deadline)


async def wait_entered(module) -> None:
    await asyncio.to_thread(module.entered.wait, 10)
    module.entered.clear()


async def answered(m, *ps) -> None:
    """Wait for these requests' answers (at most 2 s) while the running batch is held in the model;
    if they do not come, open the gate (the worker must not stay blocked) and fail."""
    _, pending = await asyncio.wait([p.future for p in ps], timeout=2)
    if pending:
        m.gate.set()
        raise AssertionError(f"{len(pending)} of {len(ps)} requests not answered while the batch ahead ran")


async def finish(b: Batcher) -> None:
    await b.stop()
    assert b.queued == 0 and b.inflight == 0


async def busy_instance(gated):
    """The gated model with one instance of two slots and max_batch_size 2, and its batcher, with a
    full batch (`first`) running in the model, held there until the test opens the gate:
    (module, batcher, first)."""
    s, m, ex = gated(max_batch_size=2, delay_ms=0, depth=2)
    b = make_batcher(s, ex)
    m.gate.clear()
    first = submit(b, 0.0, rows=2)  # runs, blocked in the model until the gate opens
    await wait_entered(m)
    return m, b, first


async def spare_slot_taken(b) -> None:
    """Let the batching task run until the full batch is in the spare slot (two batches in flight)."""
    for _ in range(1000):
        if b.inflight == 2:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"no batch went to the spare slot: {b.inflight} in flight, {b.queued} queued")


async def test_a_deadline_passing_in_a_batch_waiting_at_a_busy_instance_is_answered_before_the_running_batch_ends(
    gated,
):
    m, b, first = await busy_instance(gated)
    short = submit(b, 1.0, deadline=time.perf_counter() + 0.01)
    patient = submit(b, 2.0, deadline=time.perf_counter() + 60)
    await spare_slot_taken(b)
    assert b.queued == 0
    # Answered at its deadline, while the batch ahead is still running (its gate is closed).
    await answered(m, short)
    with pytest.raises(DeadlineExceeded, match="waiting behind its instance's earlier work"):
        await short.future
    assert not first.future.done() and not patient.future.done()
    assert b.stats.fail.count == 1
    m.gate.set()
    await first.future
    out = await patient.future
    np.testing.assert_array_equal(out["OUTPUT0"], np.full((1, 4), 4.0, dtype=np.float32))
    assert m.batch_sizes == [2, 1]  # the worker left the expired request out
    assert b.stats.inference_count == 3 and b.stats.fail.count == 1  # answered and counted once
    await finish(b)


async def test_a_batch_waiting_at_a_busy_instance_whose_every_deadline_passes_runs_nothing(gated):
    m, b, first = await busy_instance(gated)
    soon = time.perf_counter() + 0.01
    held = [submit(b, 1.0, deadline=soon), submit(b, 2.0, deadline=soon + 0.005)]
    await spare_slot_taken(b)
    await answered(m, *held)
    for p in held:
        with pytest.raises(DeadlineExceeded, match="waiting behind its instance's earlier work"):
            await p.future
    assert not first.future.done()
    m.gate.set()
    await first.future
    await finish(b)
    assert m.batch_sizes == [2]
    assert b.stats.inference_count == 2 and b.stats.fail.count == 2


async def test_a_caller_cancelled_while_its_batch_waits_at_a_busy_instance_is_left_out(gated):
    m, b, first = await busy_instance(gated)
    gone = submit(b, 1.0)
    stays = submit(b, 2.0)
    await spare_slot_taken(b)
    gone.future.cancel()  # as the service does when its caller cancels
    b.withdraw(gone)
    m.gate.set()
    await first.future
    out = await stays.future
    np.testing.assert_array_equal(out["OUTPUT0"], np.full((1, 4), 4.0, dtype=np.float32))
    assert m.batch_sizes == [2, 1]  # not computed for nobody
    await finish(b)
    assert b.stats.inference_count == 3 and b.stats.fail.count == 0
