"""A batch key whose last request left the batcher (answered, withdrawn by its caller, expired) leaves
nothing behind for it: no queue, no entry in the heaps of heads, deadlines or ranks, no timer armed
for it, under both policies. The entries are dropped lazily, at the batcher's next decision, and
with the slo policy also at a decision for a busy instance's spare slot, so that a backlog that
keeps every instance busy does not collect one empty queue per key that came and went. A request of
0 rows is refused before it takes queue space (the server's codec refuses one at decode).
"""

from __future__ import annotations

import asyncio
import math
import shutil
import threading
import time

import grpc
import numpy as np
import pytest

from wok.batcher import Batcher, BatchingPolicy
from wok.codec import encode_request
from wok.errors import DeadlineExceeded, InvalidInput
from wok.policy import SloPolicy
from wok.stats import ModelStats
from wok.v2pb import grpc_service_pb2_grpc as pb_grpc

MS = 1e-3


def make_batcher(servable, executor, slo: SloPolicy | None) -> Batcher:
    cfg = servable.config
    db = cfg.dynamic_batching
    policy = BatchingPolicy(cfg.max_batch_size, db.max_queue_delay_ms / 1e3, db.preferred_batch_sizes)
    b = Batcher(cfg.name, executor, policy, ModelStats(cfg.name), slo=slo)
    b.start()
    return b


def slo_policy(slo_ms: float) -> SloPolicy:
    # T(n) = 1 ms + 0.1 ms·n, told (a seeded fit); a rate that decays slowly (τ = 10 s).
    return SloPolicy(slo_ms * MS, 8, 1, seed=(1 * MS, 0.1 * MS), rate_tau_s=10.0, initial_margin_s=1 * MS)


def submit(b: Batcher, key, rows: int = 1, deadline=None):
    return b.submit({"INPUT0": np.ones((rows, 4), np.float32)}, rows, key, deadline)


async def wait_entered(module) -> None:
    await asyncio.to_thread(module.entered.wait, 10)
    module.entered.clear()


def decisions(b: Batcher) -> asyncio.Event:
    """An event set at each decision of the batcher's task (each `_pick`; the task makes one whenever a
    slot is free). The test resumes only once the task awaits again, so its whole pass is over."""
    made = asyncio.Event()
    pick = b._pick

    def spy(*args, **kwargs):
        try:
            return pick(*args, **kwargs)
        finally:
            made.set()

    b._pick = spy
    return made


def held_for(b: Batcher, key) -> dict:
    """What the batcher's structures hold for `key` (empty: nothing), by the _Key it holds for it (Batcher._keys;
    none for a key no request came with, which nothing can hold)."""
    key = b._keys.get(key)
    if key is None:
        return {}
    held = {
        "queue": key in b._queues,
        "full": key in b._full,
        "emptied": key in b._emptied,
        "heads": sum(e[2] is key for e in b._heads),
        "dues": sum(e[2] is key for e in b._dues),
        "ranks": sum(e[4] is key for e in b._ranks),
        "deadlines": sum(p.key is key for p in b._deadline_fifo) + sum(e[2].key is key for e in b._deadlines),
    }
    return {name: v for name, v in held.items() if v}


def assert_nothing_left(b: Batcher, key) -> None:
    assert held_for(b, key) == {}
    assert b.queued == 0 and b._level_samples == {} and b._queued_since is None
    assert b._timer.armed_at == math.inf, "a timer is armed with nothing queued"


class Permits:
    """A gate for the model that lets one batch through per `set()` (GatedDouble waits on its gate)."""

    def __init__(self) -> None:
        self._sem = threading.Semaphore(0)

    def wait(self, timeout=None) -> bool:
        return self._sem.acquire(timeout=timeout)

    def set(self) -> None:
        self._sem.release()

    def clear(self) -> None:
        pass


# (policy, how the request leaves, whether the instance is busy meanwhile). A lone request on an
# idle instance under slo runs before its deadline (the deadline rule sends it by its latest start):
# it leaves by expiring only behind a busy instance.
CASES = [
    ("fixed", "withdrawn", "idle"),
    ("fixed", "withdrawn", "busy"),
    ("fixed", "expired", "idle"),
    ("fixed", "expired", "busy"),
    ("slo", "withdrawn", "idle"),
    ("slo", "withdrawn", "busy"),
    ("slo", "expired", "busy"),
]


@pytest.mark.parametrize(("policy", "how", "instance"), CASES, ids=["-".join(c) for c in CASES])
async def test_a_lone_request_that_leaves_leaves_nothing_for_its_key(gated, policy, how, instance):
    # A short delay window (fixed) and a short SLO (slo, with an arrival rate that makes an idle
    # instance wait for more): the withdrawn request's flush instant, the decision that drops its
    # queue, comes within a few hundred ms. An expiring request waits a long window.
    s, m, ex = gated(max_batch_size=8, delay_ms=100 if how == "withdrawn" else 10_000)
    slo = None if policy == "fixed" else slo_policy(200 if instance == "idle" else 10_000)
    b = make_batcher(s, ex, slo)
    made = decisions(b)
    if slo is not None:
        slo.arrived(b._intern("k"), time.perf_counter(), 100_000)  # λα = 10 samples: a lone one waits
    running = None
    try:
        if instance == "busy":
            m.gate.clear()
            running = submit(b, "other", rows=8)  # full: it goes at once, under both policies
            await wait_entered(m)
        deadline = time.perf_counter() + 0.05 if how == "expired" else None
        p = submit(b, "k", deadline=deadline)
        while b._wakeup.is_set():  # the task has seen it
            await asyncio.sleep(0)
        # A timer is armed for it: its flush (an idle instance) or its deadline (slo: every request
        # has one). With every instance busy the fixed policy's next decision waits for a completion.
        armed = policy == "slo" or instance == "idle" or how == "expired"
        assert b._queues[b._keys["k"]].requests == 1 and (b._timer.armed_at < math.inf) == armed
        made.clear()
        if how == "withdrawn":
            b.withdraw(p)  # wakes nothing: its entries wait for the next decision
            assert b.queued == 0
        else:
            with pytest.raises(DeadlineExceeded, match="deadline passed before it could run"):
                await asyncio.wait_for(p.future, 10)
        if running is not None:  # the decision after the running batch completes
            m.gate.set()
            await asyncio.wait_for(running.future, 10)
        await asyncio.wait_for(made.wait(), 10)  # idle: the decision at its timer (or the expiry's own)
        assert_nothing_left(b, "k")
        assert held_for(b, "other") == {}
        assert m.batch_sizes == ([8] if running is not None else [])
    finally:
        m.gate.set()
    await b.stop()
    assert b.queued == 0 and b.inflight == 0 and not b._queues


async def test_keys_that_come_and_go_while_every_instance_stays_busy_leave_no_queues_behind(gated):
    # slo, one instance with a spare slot (depth 2), batches of 2. A hot key keeps a full batch in the
    # spare slot behind the running one, so the instance is never idle: each decision is for the
    # spare slot only. Meanwhile requests of other keys come and are withdrawn (cancelled callers);
    # their emptied queues were dropped only at a decision for an idle instance, so they piled up,
    # one per key, for as long as the backlog lasted.
    s, m, ex = gated(max_batch_size=2, depth=2)
    m.gate = Permits()
    b = make_batcher(s, ex, slo_policy(10_000))
    try:
        await _come_and_go(b, m)
    finally:
        for _ in range(8):  # whatever batches are left run (a failed check leaves some gated)
            m.gate.set()
    await b.stop()
    assert b.queued == 0 and b.inflight == 0


async def _come_and_go(b: Batcher, m) -> None:
    batches = [[submit(b, "hot")]]  # the idle instance takes it at once
    await wait_entered(m)
    batches.append([submit(b, "hot"), submit(b, "hot")])  # full: into the spare slot
    while b.queued:
        await asyncio.sleep(0.001)
    assert b.inflight == 2
    for round_ in range(3):
        for j in range(20):
            b.withdraw(submit(b, f"cold-{round_}-{j}"))
        batches.append([submit(b, "hot"), submit(b, "hot")])  # full, queued: no slot is free
        assert b.queued == 2
        m.gate.set()  # the running batch ends; the spare slot's batch starts, the instance stays busy
        await asyncio.wait_for(asyncio.gather(*(p.future for p in batches[round_])), 10)
        await wait_entered(m)
        while b.queued:  # the decision for the freed spare slot sent the full batch
            await asyncio.sleep(0.001)
        assert b.inflight == 2 and b._busy == [2]
        # The hot queue, emptied by that batch, goes at the next decision.
        assert [k.key for k in b._queues] == ["hot"], f"round {round_}: {len(b._queues)} queues"
        assert b._emptied <= {b._keys["hot"]}
        for j in range(20):
            assert held_for(b, f"cold-{round_}-{j}") == {}
    for _ in range(2):
        m.gate.set()
    await asyncio.wait_for(asyncio.gather(*(p.future for batch in batches for p in batch)), 10)
    assert m.batch_sizes == [1, 2, 2, 2, 2]


@pytest.mark.parametrize("policy", ["fixed", "slo"])
@pytest.mark.parametrize("instance", ["idle", "busy"])
async def test_a_request_of_0_rows_is_refused_at_submit_and_takes_no_queue_space(gated, policy, instance):
    # Queued, it used to run as a batch of 0 rows (fixed), never run and hold up a stop until its
    # deadline (slo: a queue of 0 samples is not due), or fail admission with a ZeroDivisionError.
    s, m, ex = gated(max_batch_size=8, delay_ms=0)
    b = make_batcher(s, ex, None if policy == "fixed" else slo_policy(10_000))
    running = None
    try:
        if instance == "busy":
            m.gate.clear()
            running = submit(b, "other")
            await wait_entered(m)
        with pytest.raises(InvalidInput, match=r"^model 'gated': expected at least 1 row in a request; got 0$"):
            submit(b, "k", rows=0)
        assert "k" not in b._keys and b.queued == 0 and b._level_samples == {}
        assert b.stats.fail.count == 0
    finally:
        m.gate.set()
    if running is not None:
        await asyncio.wait_for(running.future, 10)
    await asyncio.wait_for(b.stop(), 10)
    assert b.queued == 0 and b.inflight == 0 and m.batch_sizes == ([1] if running is not None else [])


async def test_the_server_refuses_a_request_of_0_rows_before_it_reaches_either_policys_batcher(serve, slow_repository):
    root = slow_repository(sleep_ms=1, delay_ms=0)
    shutil.copytree(root / "slow", root / "fixed")
    cfg = root / "slow" / "config.toml"
    cfg.write_text(cfg.read_text().replace("[dynamic_batching]\n", '[dynamic_batching]\npolicy = "slo"\nslo_ms = 60\n'))
    async with serve(repository=root) as server:
        assert server.runtimes["slow"].batcher.slo is not None and server.runtimes["fixed"].batcher.slo is None
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            stub = pb_grpc.GRPCInferenceServiceStub(ch)
            for model in ("fixed", "slow"):
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await stub.ModelInfer(encode_request(model, {"INPUT0": np.ones((0, 4), np.float32)}), timeout=30)
                assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, model
                assert info.value.details() == "input 'INPUT0': expected at least one row in the batch dimension; got 0"
                b = server.runtimes[model].batcher
                assert b.queued == 0 and not b._queues, model
                assert b.stats.fail.count == 1, model  # the error its caller got (the service counts it)
                # The model still answers one row with one row.
                resp = await stub.ModelInfer(encode_request(model, {"INPUT0": np.ones((1, 4), np.float32)}), timeout=30)
                assert list(resp.outputs[0].shape) == [1, 4], model
