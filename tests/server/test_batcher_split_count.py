"""A model whose outputs split into fewer results than its batch has requests (`Servable.split`
overridden): every caller still waiting fails with ModelExecutionError (INTERNAL), each counted
once in ModelStatistics' fail as for any failed batch, and one already answered (its deadline
passed as its batch waited) or withdrawn is left alone; the batcher goes on serving."""

from __future__ import annotations

import asyncio
import time

import grpc
import numpy as np
import pytest

from wok.batcher import Batcher, BatchingPolicy
from wok.errors import DeadlineExceeded, ModelExecutionError, ShuttingDown, to_status
from wok.executor import Executor
from wok.servable import Servable
from wok.stats import ModelStats

from .conftest import open_and_shut_down

GRACE_S = 0.01


class ShortSplit(Servable):
    """While `short` is set, splits a batch of more than one request into one result fewer."""

    short = True

    def split(self, outputs, rows):
        per_request = super().split(outputs, rows)
        return per_request[:-1] if self.short and len(rows) > 1 else per_request


@pytest.fixture
def short_split(gated_model):
    """Build (servable, module, batcher) of the gated model with ShortSplit's split; shut down at the
    end, its gate opened."""
    made = []

    def build(**kw):
        s, m = gated_model(**kw)
        s = ShortSplit(s.config, m)
        ex = Executor(s, s.config.instances)
        made.append((m, ex))
        cfg = s.config
        policy = BatchingPolicy(cfg.max_batch_size, cfg.dynamic_batching.max_queue_delay_ms / 1e3)
        b = Batcher(cfg.name, ex, policy, ModelStats(cfg.name))
        b.start()
        return s, m, b

    yield build
    open_and_shut_down(made)


def submit(b: Batcher, value: float, rows: int = 1, deadline=None):
    return b.submit({"INPUT0": np.full((rows, 4), value, dtype=np.float32)}, rows, None, deadline)


async def entered(m) -> None:
    if not await asyncio.to_thread(m.entered.wait, 10):
        m.gate.set()
        raise AssertionError("no batch reached the model")
    m.entered.clear()


async def spare_slot_taken(b: Batcher) -> None:
    """Let the batching task run until the full batch is in the spare slot (two batches in flight)."""
    for _ in range(1000):
        if b.inflight == 2:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"no batch went to the spare slot: {b.inflight} in flight, {b.queued} queued")


async def failed_split(p, n: int, got: int) -> None:
    with pytest.raises(ModelExecutionError) as caught:
        await asyncio.wait_for(p.future, 10)
    assert to_status(caught.value) == (
        grpc.StatusCode.INTERNAL,
        f"model 'gated' split a batch of {n} requests into {got} results",
    )


async def serves_on(s: ShortSplit, b: Batcher, size: int) -> None:
    """A next batch, split right, is answered; then the batcher stops with nothing left."""
    s.short = False
    ps = [submit(b, float(i)) for i in range(size)]
    for i, p in enumerate(ps):
        out = await asyncio.wait_for(p.future, 10)
        np.testing.assert_array_equal(out["OUTPUT0"], np.full((1, 4), 2.0 * i, dtype=np.float32))
    await b.stop()
    assert b.queued == 0 and b.inflight == 0


async def test_every_caller_of_a_batch_split_into_too_few_results_fails_and_is_counted_once(short_split):
    s, m, b = short_split(max_batch_size=3)
    ps = [submit(b, float(i)) for i in range(3)]  # a full batch: it goes at once
    for p in ps:
        await failed_split(p, 3, 2)
    assert b.stats.fail.count == 3
    assert b.stats.execution_count == 0 and b.stats.inference_count == 0  # not an executed batch
    await serves_on(s, b, 3)
    assert m.batch_sizes == [3, 3]
    assert b.stats.fail.count == 3
    assert b.stats.execution_count == 1 and b.stats.inference_count == 3


async def test_a_request_whose_deadline_passed_as_its_batch_waited_is_not_failed_again(short_split):
    """Its batch waited at a busy instance: answered DEADLINE_EXCEEDED at its deadline, left out by the
    worker; the two that ran get the split's error, and the three are counted once each."""
    s, m, b = short_split(max_batch_size=3, delay_ms=0, depth=2)
    m.gate.clear()
    first = submit(b, 0.0, rows=3)  # a batch of one request: split right
    await entered(m)
    short = submit(b, 1.0, deadline=time.perf_counter() + 0.01)
    ran = [submit(b, 2.0), submit(b, 3.0)]
    await spare_slot_taken(b)
    with pytest.raises(DeadlineExceeded, match="waiting behind its instance's earlier work"):
        await asyncio.wait_for(short.future, 10)
    assert b.stats.fail.count == 1
    m.gate.set()
    await asyncio.wait_for(first.future, 10)
    for p in ran:
        await failed_split(p, 2, 1)
    assert isinstance(short.future.exception(), DeadlineExceeded)
    assert m.batch_sizes == [3, 2]  # the worker left the expired request out
    assert b.stats.fail.count == 3
    await serves_on(s, b, 2)
    assert b.stats.fail.count == 3


async def test_a_withdrawn_request_that_ran_anyway_is_left_alone(short_split):
    """The race `Batcher.withdraw` allows: the worker read its batch's deadlines before the withdrawal
    marked it left out, so it ran (simulated here by handing the worker a copy of the deadlines).
    Its caller is gone: neither answered nor counted failed."""
    s, m, b = short_split(max_batch_size=3, delay_ms=0, depth=2)
    inst = b.executor.instances[0]
    real_submit = inst.submit

    def submit_copy(inputs, rows, slot, deadlines=None):
        return real_submit(inputs, rows, slot, None if deadlines is None else list(deadlines))

    inst.submit = submit_copy
    m.gate.clear()
    first = submit(b, 0.0, rows=3)
    await entered(m)
    gone = submit(b, 1.0)
    ran = [submit(b, 2.0), submit(b, 3.0)]
    await spare_slot_taken(b)
    gone.future.cancel()  # as the service does when its caller cancels
    b.withdraw(gone)
    m.gate.set()
    await asyncio.wait_for(first.future, 10)
    for p in ran:
        await failed_split(p, 3, 2)
    assert m.batch_sizes == [3, 3]  # it ran
    assert gone.future.cancelled()
    assert b.stats.fail.count == 2
    await serves_on(s, b, 3)
    assert b.stats.fail.count == 2


async def test_a_batch_failed_at_the_stop_records_nothing_more_when_its_split_comes_back_short(short_split):
    _, m, b = short_split(max_batch_size=3)
    m.gate.clear()
    ps = [submit(b, float(i)) for i in range(3)]
    await entered(m)
    sent = b._last_sent[0]
    drain = asyncio.ensure_future(b.stop())
    _, pending = await asyncio.wait({drain}, timeout=GRACE_S)
    assert pending, "the stop ended within the grace period: the batch was not held in the model"
    drain.cancel()
    await asyncio.gather(drain, return_exceptions=True)
    for p in ps:
        assert isinstance(p.future.exception(), ShuttingDown)
    assert b.stats.fail.count == 3
    m.gate.set()
    await asyncio.wait_for(asyncio.wrap_future(sent), 10)  # `_complete` ran first (its callback came first)
    assert b.inflight == 0
    for p in ps:
        assert isinstance(p.future.exception(), ShuttingDown)
    assert b.stats.fail.count == 3
