"""A batch key is the model's code: its __hash__ and __eq__ run as the service queues a request (a failure there
answers that request INTERNAL alone, test_request_failure_log). The batcher's own task hashed and compared the keys
again as it picked, formed and expired batches, and a key that raised there (a KeyboardInterrupt, a ValueError, a
CancelledError taken for the task's own cancellation) failed the batching task: the model refused every request
until the server restarted. Now the batcher hashes and compares a key only as it queues the request (Batcher.submit,
_Key): its task never runs the model's code, and each request is served by the key it was queued with."""

from __future__ import annotations

import asyncio

import grpc
import numpy as np
import pytest
from torch import nn

from wok import batcher as batcher_module
from wok import policy as policy_module
from wok.batcher import Batcher, BatchingPolicy
from wok.policy import SloPolicy
from wok.servable import Servable
from wok.stats import ModelStats

from .conftest import four_wide_config
from .test_check_failure_log import request, served

# What a key of each INPUT0 value raises inside the batcher's task, and from which method.
IN_TASK = {
    5: ("hash", KeyboardInterrupt("ki")),
    6: ("hash", asyncio.CancelledError("from the hash")),
    7: ("eq", asyncio.CancelledError("from the eq")),
    8: ("eq", ValueError("from the eq")),
}


def _in_batcher_task() -> bool:
    task = asyncio.current_task()
    return task is not None and task.get_name().startswith("wok-batcher-")


class TaskKey:
    """Equal by value; its __hash__ or __eq__ (IN_TASK) raises only inside the batcher's own task."""

    def __init__(self, value: int) -> None:
        self.value = value

    def _raise(self, method: str) -> None:
        how, exc = IN_TASK[self.value]
        if how == method and _in_batcher_task():
            raise type(exc)(*exc.args)  # a new one each time: one raised again keeps each raise's frames

    def __hash__(self) -> int:
        self._raise("hash")
        return hash(self.value)

    def __eq__(self, other: object) -> bool:
        self._raise("eq")
        return isinstance(other, TaskKey) and other.value == self.value


class TaskKeyed(Servable):
    def batch_key(self, inputs):
        value = int(inputs["INPUT0"].flat[0])
        return TaskKey(value) if value in IN_TASK else super().batch_key(inputs)


def waiting_config(name: str, policy: str):
    """One FP32 input and output of 4; requests wait 100 ms for their batch to fill, so that two of one key (equal,
    not the same object) are queued together, and the batcher's task compares them."""
    batching = {"max_queue_delay_ms": 100.0}
    if policy == "slo":
        batching.update(policy="slo", slo_ms=10_000.0, max_queue_delay_ms=5.0)
    return four_wide_config(name, dynamic_batching=batching)


@pytest.mark.parametrize("policy", ["fixed", "slo"])
async def test_a_key_that_raises_in_the_batchers_task_fails_neither_the_task_nor_its_requests(policy):
    s = TaskKeyed(waiting_config("keyed", policy), nn.Identity())
    async with served(s) as (server, stub):
        batcher = server.runtime("keyed", "").batcher
        values = [v for v in IN_TASK for _ in range(2)] + [0.5, 0.5]
        calls = [stub.ModelInfer(request(v, f"{v}", "keyed"), timeout=10) for v in values]
        answers = await asyncio.gather(*calls, return_exceptions=True)
        for value, answer in zip(values, answers):
            assert not isinstance(answer, BaseException), (value, answer)
            out = np.frombuffer(answer.raw_output_contents[0], "<f4")
            np.testing.assert_array_equal(out, np.full(4, value, np.float32))
        # Still serving every key: a batcher failed refused the next request (BatcherFailed, INTERNAL).
        again = await stub.ModelInfer(request(5.0, "again", "keyed"), timeout=10)
        np.testing.assert_array_equal(np.frombuffer(again.raw_output_contents[0], "<f4"), np.full(4, 5.0, np.float32))
        assert batcher.failed is None
        assert (batcher.queued, batcher.inflight, server.service.active) == (0, 0, 0)
        assert server.metrics.models["keyed"].responses == {"OK": len(values) + 1}


class LaterKey:
    """Its __hash__ works for the first request's key and raises for each later one (a key whose hash breaks)."""

    made = 0

    def __init__(self) -> None:
        LaterKey.made += 1
        self.n = LaterKey.made

    def __hash__(self) -> int:
        if self.n > 1:
            raise asyncio.CancelledError("hash broke")
        return 0


class LaterKeyed(Servable):
    def batch_key(self, inputs):
        return LaterKey() if int(inputs["INPUT0"].flat[0]) == 3 else super().batch_key(inputs)


async def test_a_key_whose_hash_breaks_later_fails_each_request_it_breaks_for_alone():
    LaterKey.made = 0
    s = LaterKeyed(waiting_config("later", "fixed"), nn.Identity())
    async with served(s) as (server, stub):
        first = await stub.ModelInfer(request(3.0, "first", "later"), timeout=10)
        np.testing.assert_array_equal(np.frombuffer(first.raw_output_contents[0], "<f4"), np.full(4, 3.0, np.float32))
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.ModelInfer(request(3.0, "second", "later"), timeout=10)
        assert (info.value.code(), info.value.details()) == (
            grpc.StatusCode.INTERNAL,
            "internal error: CancelledError: hash broke",
        )
        other = await stub.ModelInfer(request(1.0, "other", "later"), timeout=10)
        np.testing.assert_array_equal(np.frombuffer(other.raw_output_contents[0], "<f4"), np.full(4, 1.0, np.float32))
        batcher = server.runtime("later", "").batcher
        assert batcher.failed is None and (batcher.queued, batcher.inflight) == (0, 0)


class Breakable:
    """A key whose __hash__ raises once `broken` is set."""

    broken = False

    def __hash__(self) -> int:
        if Breakable.broken:
            raise asyncio.CancelledError("broke")
        return 1


async def test_the_batchers_keys_are_swept_past_their_bound_keeping_those_queued(gated, monkeypatch):
    # Each key a request came with is held (Batcher._keys) so that equal keys share one _Key, as the slo policy's
    # fits do; keys that come and go must not pile up: past the bound, those no request queued holds go. A sweep
    # hashes the keys it keeps again: one that raises now is dropped, for no request to answer, and its queue is
    # served.
    monkeypatch.setattr(batcher_module, "KEYS_KEPT", 8)
    monkeypatch.setattr(Breakable, "broken", False)
    _s, _m, ex = gated(max_batch_size=8, delay_ms=10_000.0)
    b = Batcher("gated", ex, BatchingPolicy(8, 10.0, ()), ModelStats("gated"))
    b.start()
    inputs = {"INPUT0": np.ones((1, 4), np.float32)}
    try:
        waiting = b.submit(inputs, 1, ("queued",), None)  # stays queued: the delay is 10 s
        breaking = b.submit(inputs, 1, Breakable(), None)
        Breakable.broken = True
        for i in range(40):
            b.submit(inputs, 1, ("seen",), None)
            b.withdraw(b.submit(inputs, 1, ("gone", i), None))
            assert len(b._keys) <= 2 * 8, i
        held = set(b._keys)
        assert {("queued",), ("seen",)} <= held and sum(k[0] == "gone" for k in held) < 8
        assert not any(isinstance(k, Breakable) for k in held)
        # Equal keys still share the one held: a request of ("queued",) joins the queue waiting.
        assert b.submit(inputs, 1, ("queued",), None).key is waiting.key
        assert b._queues[waiting.key].requests == 2
    finally:
        await b.stop()  # runs what is queued
    assert breaking.future.result()["OUTPUT0"].shape == (1, 4)
    assert b.queued == 0 and b.inflight == 0


async def test_a_key_the_slo_policy_keeps_a_fit_for_keeps_its_key_past_sweeps_and_a_swept_one_leaves_the_policy(gated):
    # Past KEYS_KEPT keys a sweep dropped each key no request came with since the last sweep, though the slo policy
    # kept its fit (its tables are by _Key, least recently seen out past MAX_TRACKED_KEYS): the key, come again, was
    # a new _Key, its fit learned anew from the model-wide one's, while the old _Key's fit and the swept keys' rates
    # stayed in the policy's tables until pushed out. Now a key the policy keeps a fit or rate for keeps its _Key,
    # and a key swept is in none of the policy's tables (nor put back there by a batch of it still running).
    _s, module, ex = gated(max_batch_size=8, delay_ms=10_000.0)
    slo = SloPolicy(10.0, 8, 1)
    b = Batcher("gated", ex, BatchingPolicy(8, 10.0, ()), ModelStats("gated"), slo=slo)
    b.start()
    inputs = {"INPUT0": np.ones((1, 4), np.float32)}
    try:
        for _ in range(20):
            learned = b.submit(inputs, 1, ("learned",), None)
            await learned.future
        assert slo.times.batches(learned.key) == 20 > slo.times.min_batches  # its own fit, not the model-wide one
        module.gate.clear()
        module.entered.clear()
        running = b.submit(inputs, 1, ("running",), None)
        await asyncio.get_running_loop().run_in_executor(None, module.entered.wait, 10)
        # Each key once, its request withdrawn (no batch runs): two sweeps' worth, so that ("learned",) and
        # ("running",) are neither seen since the last sweep nor among the policy's most recent arrivals.
        for i in range(2 * batcher_module.KEYS_KEPT + 1):
            b.withdraw(b.submit(inputs, 1, ("once", i), None))
        assert len(b._keys) <= 2 * batcher_module.KEYS_KEPT
        module.gate.set()
        await running.future
        back = b.submit(inputs, 1, ("learned",), None)
        assert back.key is learned.key  # the same _Key: its fit found, not learned anew
        await back.future
        assert slo.times.batches(back.key) == 21
        assert b.submit(inputs, 1, ("running",), None).key is running.key
        held = set(b._keys.values())
        assert set(slo.times._keys) <= held and set(slo.times._coef) <= held and set(slo._rates) <= held
    finally:
        module.gate.set()
        await b.stop()
    assert b.queued == 0 and b.inflight == 0


@pytest.mark.parametrize("policy", ["fixed", "slo"])
async def test_a_client_sending_every_key_again_between_sweeps_does_not_grow_the_batchers_keys(
    policy, gated, monkeypatch
):
    # A sweep kept each key a request had come with again since the last one, and let the table grow to twice what
    # it kept before the next: a client that sent every key it had sent before again each round, with as many new
    # ones, doubled the table at each sweep (256 keys held after the sixth round here, 131,072 after the fifth with
    # the real bound) though no request queued, batch running nor fit or rate of the policy's held one of them.
    monkeypatch.setattr(batcher_module, "KEYS_KEPT", 8)
    monkeypatch.setattr(policy_module, "MAX_TRACKED_KEYS", 4)
    _s, _m, ex = gated(max_batch_size=8, delay_ms=10_000.0)
    slo = SloPolicy(10.0, 8, 1) if policy == "slo" else None
    b = Batcher("gated", ex, BatchingPolicy(8, 10.0, ()), ModelStats("gated"), slo=slo)
    b.start()
    inputs = {"INPUT0": np.ones((1, 4), np.float32)}
    try:
        for r in range(6):
            for i in range(8 * 2**r):
                for _ in range(2):
                    b.withdraw(b.submit(inputs, 1, ("k", i), None))
                assert len(b._keys) <= 2 * 8, (r, i, len(b._keys))
        if slo is not None:  # the keys the policy keeps a rate of keep their _Key (and so their rate)
            assert set(slo._rates) <= set(b._keys.values()) and len(slo._rates) == 4
        # Equal keys still share one _Key.
        assert b.submit(inputs, 1, ("k", 3), None).key is b.submit(inputs, 1, ("k", 3), None).key
    finally:
        await b.stop()
    assert b.queued == 0 and b.inflight == 0
