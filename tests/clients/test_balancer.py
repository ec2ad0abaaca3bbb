"""wok's balancer (wok.clients.balancer) against real gRPC servers on loopback.

Most tests use conftest.py's `Stub` servers (fail with a code, or hold every call with the
connection open, as a hung server does), so a test knows how many attempts reached which
server; one pauses a real `wok serve` with SIGSTOP. Tests wait on the servers' and the
balancer's own change notifications, not on sleeps.
"""

from __future__ import annotations

import asyncio
import errno
import gc
import json
import logging
import math
import os
import random
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
from collections import defaultdict

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2

from wok.clients import TLS, AsyncClient, InferError, aio, balancer
from wok.clients.balancer import SETTLED_AFTER, Balancer, BalancerSettings, merge_stats, split_targets
from wok.clients.errors import Answers
from wok.errors import CUT_NOTE, MESSAGE_BYTES, cut_message
from wok.v2pb import grpc_service_pb2 as pb

from .conftest import LoopThread, Stub

pytestmark = pytest.mark.timeout(90)
# ANSWERS_IN_TIME: the tests marked `serial` (run alone, after the parallel pass: tests/conftest.py)
# count exactly what a replica that answers at once must answer within a hedge delay of 50-250 ms
# (late attempts, hedges, swaps), or pause a `wok serve` child; beside a second worker's load one
# stalled answer is late and the count is off. The others hold their calls on events, or count
# nothing that a late answer changes: they run on the parallel pass's workers.
CODE = grpc.StatusCode
STATE = grpc.ChannelConnectivity
SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
METHOD = "/inference.GRPCInferenceService/ModelInfer"
REQUEST = pb.ModelInferRequest(model_name="m").SerializeToString()
NO_EJECTION = {"consecutive_failures": 0}


def settings(**kw) -> BalancerSettings:
    kw.setdefault("hedge_after", None)
    return BalancerSettings(**kw)


def answering(answers: list[str]):
    """A resolver answering what `answers` holds at each lookup (a test changes it as a name's
    addresses change)."""

    async def resolver(host: str, port: int) -> list[str]:
        return list(answers)

    return resolver


def ejecting_headless(answers: list[str]) -> Balancer:
    """A balancer of dns:///wok-headless:8001, whose addresses are what `answers` holds, looked up
    every 50 ms; 2 failures in a row eject a replica for 60 s."""
    s = settings(consecutive_failures=2, base_ejection_s=60, max_ejection_s=60, resolve_every_s=0.05)
    return Balancer("dns:///wok-headless:8001", settings=s, resolver=answering(answers))


async def ejected_by_calls(bal: Balancer, call, target: str):
    """Call until the replica at `target` (which fails its calls) is ejected; that replica."""
    r = bal.replica(target)
    while not r.ejected:
        await code_of(call)
    return r


async def name_of(call, timeout: float = 10) -> str:
    """Which server answered (its name comes back as the response's model name)."""
    return pb.ModelInferResponse.FromString(await call(REQUEST, timeout=timeout)).model_name


async def code_of(call, timeout: float = 10) -> grpc.StatusCode:
    try:
        await call(REQUEST, timeout=timeout)
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    return CODE.OK


def test_targets_and_settings():
    assert split_targets("10.0.0.1:1, b.example:2") == [("10.0.0.1", 1), ("b.example", 2)]
    assert split_targets(["[::1]:3", "dns:///wok.svc:8001"]) == [("::1", 3), ("wok.svc", 8001)]
    assert split_targets("ipv4:10.0.0.1:1,10.0.0.2:2") == [("10.0.0.1", 1), ("10.0.0.2", 2)]
    for bad in ("nohost", "a:b", "unix:/tmp/x"):
        with pytest.raises(ValueError):
            split_targets(bad)
    with pytest.raises(ValueError, match="hedge_after"):
        BalancerSettings(hedge_after=0)
    with pytest.raises(ValueError, match="max_attempts"):
        BalancerSettings(max_attempts=0)


async def test_a_name_resolves_to_its_replicas_and_is_resolved_again(stub):
    async with stub("a") as a, stub("b") as b:
        # The system's resolver: localhost is one replica (IPv4 preferred), its channel READY.
        async with Balancer(f"localhost:{a.port}") as bal:
            assert list(bal.replicas) == [f"127.0.0.1:{a.port}"]
            assert await name_of(bal.unary_unary(METHOD)) == "a"

        # A headless Service's pods come and go: the name's addresses change between lookups.
        answers = [[a.target], [a.target, b.target], [b.target]]
        asked = []

        async def resolver(host: str, port: int) -> list[str]:
            asked.append((host, port))
            return answers[min(len(asked), len(answers)) - 1]

        bal = Balancer("dns:///wok-headless:8001", settings=settings(resolve_every_s=0.05), resolver=resolver)
        async with bal:
            assert asked[0] == ("wok-headless", 8001) and list(bal.replicas) == [a.target]
            await bal.wait_for(lambda: b.target in bal.replicas, 10)
            await bal.wait_for(lambda: list(bal.replicas) == [b.target], 10)  # a's gone and closed
            call = bal.unary_unary(METHOD)
            assert {await name_of(call) for _ in range(5)} == {"b"}


async def test_a_stream_keeps_its_replicas_channel_open_after_the_name_drops_it(stub):
    """A stream (a call the balancer does not carry) on a replica whose address leaves the name:
    the channel was closed at once, as for a replica with no attempts, and the stream cancelled
    under its caller, its owed answers lost. It is closed once the stream has ended."""
    async with stub("a", hold=True) as a, stub("b") as b:
        answers = [a.target]

        bal = Balancer("dns:///wok-headless:8001", settings=settings(resolve_every_s=0.05), resolver=answering(answers))
        async with bal:
            channel, release = bal.stream_channel()
            held = asyncio.ensure_future(channel.unary_unary(METHOD)(REQUEST, timeout=10))
            await a.wait_calls(1)
            answers[:] = [b.target]
            await bal.wait_for(lambda: b.target in bal.replicas and bal.replicas[a.target].removed, 10)
            assert not held.done() and {await name_of(bal.unary_unary(METHOD)) for _ in range(3)} == {"b"}
            a.release.set()
            assert pb.ModelInferResponse.FromString(await held).model_name == "a"
            assert a.target in bal.replicas  # until the stream's end is told
            release()
            release()  # once only
            await bal.wait_for(lambda: list(bal.replicas) == [b.target], 10)


async def test_a_stream_that_ends_after_stop_starts_nothing(stub):
    async with stub("a") as a, stub("b") as b:
        answers = [a.target]

        bal = Balancer("dns:///wok-headless:8001", settings=settings(resolve_every_s=0.05), resolver=answering(answers))
        await bal.start()
        _channel, release = bal.stream_channel()
        answers[:] = [b.target]
        await bal.wait_for(lambda: b.target in bal.replicas and bal.replicas[a.target].removed, 10)
        await bal.stop()  # closes every channel, a's too
        release()  # the stream ends after the client closed: its replica's close is stop()'s, done
        assert [t for t in bal._tasks if not t.done()] == []


async def test_a_not_serving_replica_gets_no_calls_and_comes_back(stub):
    async with stub("a") as a, stub("b") as b, Balancer([a.target, b.target], settings=settings()) as bal:
        call = bal.unary_unary(METHOD)
        await b.health.set("", NOT_SERVING)
        # The per-replica channel's health check reports NOT_SERVING as TRANSIENT_FAILURE.
        await bal.wait_for(lambda: bal.replica(b.target).state is STATE.TRANSIENT_FAILURE, 10)
        assert {await name_of(call) for _ in range(20)} == {"a"} and b.calls == 0
        await b.health.set("", SERVING)
        await bal.wait_for(lambda: bal.replica(b.target).state is STATE.READY, 10)
        seen = {await name_of(call) for _ in range(50)}
        assert seen == {"a", "b"}


async def test_unavailable_is_retried_at_once_on_another_replica(stub):
    async with stub("a", fail_first=1 << 30) as a, stub("b") as b:
        async with Balancer([a.target, b.target], settings=settings(**NO_EJECTION)) as bal:
            call = bal.unary_unary(METHOD)
            assert [await name_of(call) for _ in range(30)] == ["b"] * 30
            # Every call that went to a first was sent to b once, with no backoff in between.
            assert a.calls > 0 and bal.retries == a.calls and b.calls == 30
            assert bal.attempts == 30 + a.calls and bal.hedges == 0


async def test_back_to_the_same_replica_only_after_a_backoff(stub):
    async with stub("a", fail_first=2) as a, Balancer(a.target, settings=settings(**NO_EJECTION)) as bal:
        assert await name_of(bal.unary_unary(METHOD)) == "a"
        assert a.calls == 3 and bal.retries == 2


@pytest.mark.parametrize(
    "code", [CODE.INVALID_ARGUMENT, CODE.NOT_FOUND, CODE.RESOURCE_EXHAUSTED, CODE.DEADLINE_EXCEEDED, CODE.INTERNAL]
)
async def test_answers_that_are_never_retried_or_hedged(stub, code):
    # Hedging on, with a delay that the first answer beats even on a loaded host (at 50 ms a slow
    # first answer let a hedge go out before it, and the test failed on the host, not the balancer).
    async with stub("a", fail_first=1, code=code) as a, stub("b", fail_first=1, code=code) as b:
        async with Balancer([a.target, b.target], settings=settings(hedge_after=1.0)) as bal:
            assert await code_of(bal.unary_unary(METHOD)) == code
            assert a.calls + b.calls == 1 and bal.attempts == 1 and bal.hedges == bal.retries == 0


async def test_the_budget_stops_retries_of_a_dead_fleet(stub):
    # Hand count: 100 tokens; each retry takes one and needs more than 50 left. Calls 1-25 make
    # 3 attempts each (100 -> 50), every later call one: 100 calls, 25 * 3 + 75 = 150 attempts.
    async with stub("a", fail_first=1 << 30) as a:
        s = settings(backoff_s=0.001, **NO_EJECTION)
        async with Balancer(a.target, settings=s) as bal:
            call = bal.unary_unary(METHOD)
            for _ in range(100):
                assert await code_of(call) == CODE.UNAVAILABLE
            assert a.calls == 150 and bal.retries == 50 and bal.budget_refusals == 75 and bal.tokens == 50


async def test_a_hedge_answers_for_a_replica_that_holds_its_calls(stub):
    async with stub("a", hold=True) as a, stub("b") as b:
        s = settings(hedge_after=0.05, **NO_EJECTION)
        async with Balancer([a.target, b.target], settings=s) as bal:
            call = bal.unary_unary(METHOD)
            names = [await name_of(call) for _ in range(20)]
            assert names == ["b"] * 20  # every call, the ones sent to a first too
            assert a.calls > 0 and bal.hedges == a.calls and bal.calls == 20
            # The first OK answer won; a's attempts were cancelled, on the server too.
            await a.wait_until(lambda: a.cancelled == a.calls)
            assert bal.replica(a.target).outstanding == 0


async def test_the_budget_stops_hedges(stub):
    # 4 tokens: hedges need more than 2 left, so two of the six held calls get a hedge.
    async with stub("a", hold=True) as a, stub("b", hold=True) as b:
        s = settings(hedge_after=0.02, max_attempts=2, budget_tokens=4, **NO_EJECTION)
        async with Balancer([a.target, b.target], settings=s) as bal:
            call = bal.unary_unary(METHOD)
            calls = [asyncio.ensure_future(name_of(call)) for _ in range(6)]
            await bal.wait_for(lambda: bal.budget_refusals >= 8, 10)  # the others asked, more than once
            assert bal.hedges == 2 and a.calls + b.calls == 8 and bal.tokens == 2
            a.release.set()
            b.release.set()
            assert sorted(await asyncio.gather(*calls)) != [] and bal.ok_calls == 6
            assert bal.tokens == pytest.approx(2.6)


async def test_the_deadline_bounds_every_attempt(stub):
    async with stub("a", hold=True) as a, stub("b", hold=True) as b:
        s = settings(hedge_after=0.05, max_attempts=3, **NO_EJECTION)
        async with Balancer([a.target, b.target], settings=s) as bal:
            assert await code_of(bal.unary_unary(METHOD), timeout=0.5) == CODE.DEADLINE_EXCEEDED
            # One hedge; a third attempt would go to a replica that holds this call already: none is sent.
            assert bal.attempts == 2 and bal.hedges == 1 and a.calls == b.calls == 1
            await a.wait_until(lambda: a.cancelled == a.calls)
            await b.wait_until(lambda: b.cancelled == b.calls)


async def test_a_retried_calls_error_names_the_earlier_attempts_other_reason(stub):
    # The last attempt's error alone reached the caller: a drained server's "grace period over: ...", retried on a
    # replica gone since, read "Connection refused", the reason the server gave hidden.
    async with stub("a", fail_first=1 << 30) as a, stub("b", fail_first=1 << 30) as b:
        async with Balancer([a.target, b.target], settings=settings(max_attempts=2, **NO_EJECTION)) as bal:
            await bal.wait_for(lambda: all(r.state is STATE.READY for r in bal.replicas.values()), 10, "all READY")
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await bal.unary_unary(METHOD)(REQUEST, timeout=10)
    assert bal.retries == 1 and a.calls == b.calls == 1  # the retry went to the other
    last = info.value.details()
    first = "b" if last.startswith("a:") else "a"
    err = Answers(plaintext=True).error(info.value)
    assert err.code is CODE.UNAVAILABLE and err.hint == ""
    assert str(err) == f"UNAVAILABLE: {last} (before: UNAVAILABLE: {first}: failing call 1)"


async def test_a_retried_calls_earlier_error_is_cut_in_its_final_error(stub):
    # The earlier attempt's details went whole into the final error's "(before: ...)": twice the text of a long one.
    # Over MESSAGE_BYTES, to be cut, but a trailer well under gRPC's 8 KiB soft metadata limit: over it, the client
    # refuses a growing share of answers RESOURCE_EXHAUSTED (5 of 300 at 8.2 KB), and the retry never went out.
    long = "x" * (MESSAGE_BYTES + 100)
    async with stub("a" + long, fail_first=1 << 30) as a, stub("b" + long, fail_first=1 << 30) as b:
        async with Balancer([a.target, b.target], settings=settings(max_attempts=2, **NO_EJECTION)) as bal:
            await bal.wait_for(lambda: all(r.state is STATE.READY for r in bal.replicas.values()), 10, "all READY")
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await bal.unary_unary(METHOD)(REQUEST, timeout=10)
    assert bal.retries == 1 and a.calls == b.calls == 1
    first = "b" if info.value.details().startswith("a") else "a"
    whole = f"UNAVAILABLE: {first}{long}: failing call 1"
    before = getattr(info.value, balancer.BEFORE)
    assert before == cut_message(whole) and len(before.encode()) <= MESSAGE_BYTES, len(before)
    assert before.endswith(CUT_NOTE.format(len(whole)))


async def test_a_failing_replica_is_ejected_after_k_failures(stub):
    async with stub("a", fail_first=1 << 30, code=CODE.INTERNAL) as a, stub("b") as b:
        s = settings(consecutive_failures=3, base_ejection_s=60, max_ejection_s=60)
        async with Balancer([a.target, b.target], settings=s) as bal:
            # Both READY first: with b still connecting (a slow host), ejected a, READY, is picked before it and
            # takes a fourth call (as in the next test).
            await bal.wait_for(lambda: all(r.state is STATE.READY for r in bal.replicas.values()), 10, "all READY")
            call = bal.unary_unary(METHOD)
            codes = [await code_of(call) for _ in range(60)]
            # INTERNAL is the call's answer (not retried), three times; then a is out of the rotation.
            assert codes.count(CODE.INTERNAL) == 3 and a.calls == 3 and codes.count(CODE.OK) == 57
            r = bal.replica(a.target)
            assert r.ejected and r.ejections == 1 and r.failures == 3 and bal.retries == 0


async def test_never_more_than_the_fraction_is_ejected(stub):
    async with stub("a", fail_first=1 << 30, code=CODE.INTERNAL) as a:
        async with stub("b", fail_first=1 << 30, code=CODE.INTERNAL) as b:
            s = settings(consecutive_failures=2, base_ejection_s=60, max_ejection_s=60)
            async with Balancer([a.target, b.target], settings=s) as bal:
                # Both READY first: while one is still connecting (a slow host), the other, ejected
                # and READY, takes every call (pick: READY ejected before connecting), so the
                # connecting one might get none of the 20 and never be refused an ejection.
                await bal.wait_for(lambda: all(r.state is STATE.READY for r in bal.replicas.values()), 10, "all READY")
                call = bal.unary_unary(METHOD)
                for _ in range(20):
                    assert await code_of(call) == CODE.INTERNAL
                # Of two replicas one may be ejected; the other takes every call after that.
                assert sum(r.ejected for r in bal.replicas.values()) == 1 and bal.ejections_refused > 0
                assert stats_sum(bal.stats(), "attempts") == 20


@pytest.mark.serial  # (see ANSWERS_IN_TIME)
async def test_a_replica_ejected_for_slowness_takes_the_calls_when_the_rotation_holds_only_dead_ones(stub):
    """The cap on ejections is filled by a slow replica; the other then dies and cannot be
    ejected. The slow one, READY, takes the calls instead of the dead one failing them all."""
    async with stub("a", hold=True) as a, stub("b") as b:
        s = settings(hedge_after=0.05, max_attempts=2, consecutive_failures=2, base_ejection_s=60, max_ejection_s=60)
        async with Balancer([a.target, b.target], settings=s) as bal:
            call = bal.unary_unary(METHOD)
            slow = bal.replica(a.target)
            while not slow.ejected:  # the calls that go to a first are hedged to b and answered there
                assert await name_of(call) == "b"
            assert slow.failures == 0 and slow.slow == 2
            a.release.set()  # a answers from now on, but stays ejected for 60 s
            assert [await name_of(call) for _ in range(5)] == ["b"] * 5  # ejected: no calls while b serves
            await b.stop()  # b dies
            await bal.wait_for(lambda: bal.replica(b.target).state is not STATE.READY, 10)
            names = [await name_of(call) for _ in range(20)]
            assert names == ["a"] * 20 and slow.ejected and bal.ejections_refused == 0


async def test_a_failing_replica_takes_the_place_of_one_ejected_for_slowness(stub):
    """The cap on ejections is filled by a slow replica; the other, still READY, then fails every
    call. It is ejected after K failures all the same and the slow one comes back early, instead
    of the failing one taking every call until the slow one's ejection ends (60 s here)."""
    async with stub("a", hold=True) as a, stub("b") as b:
        s = settings(hedge_after=0.2, max_attempts=2, consecutive_failures=2, base_ejection_s=60, max_ejection_s=60)
        async with Balancer([a.target, b.target], settings=s) as bal:
            call = bal.unary_unary(METHOD)
            slow, failing = bal.replica(a.target), bal.replica(b.target)
            while not slow.ejected:  # the calls that go to a first are hedged to b and answered there
                assert await name_of(call) == "b"
            a.release.set()  # a answers from now on, but stays ejected for 60 s
            b.fail_first, b.code = 1 << 30, CODE.INTERNAL  # b fails every call from now on, health SERVING
            calls_before = b.calls
            assert [await code_of(call) for _ in range(2)] == [CODE.INTERNAL] * 2
            assert failing.ejected and not slow.ejected and failing.state is STATE.READY
            assert slow.times_ejected == 1  # readmitted early, not forgiven: a next ejection would be longer
            assert [await name_of(call) for _ in range(10)] == ["a"] * 10
            assert b.calls == calls_before + 2 and sum(r.ejected for r in bal.replicas.values()) == 1


@pytest.mark.serial  # (see ANSWERS_IN_TIME)
async def test_a_hung_replica_takes_the_place_of_the_one_ejected_for_slowness(stub):
    """a is slow and ejected for it (60 s), then answers again; b, the only replica left in the
    rotation, hangs with its connection open. The hedges of b's calls go to a meanwhile, and once
    b has been late K times in a row without answering anything, a comes back early and b is
    ejected in its place. Every call used to wait for b until its deadline."""
    async with stub("a", hold=True) as a, stub("b") as b:
        s = settings(hedge_after=0.05, max_attempts=2, consecutive_failures=2, base_ejection_s=60, max_ejection_s=60)
        async with Balancer([a.target, b.target], settings=s) as bal:
            call = bal.unary_unary(METHOD)
            ra, rb = bal.replica(a.target), bal.replica(b.target)
            while not ra.ejected:  # the calls that go to a first are hedged to b and answered there
                assert await name_of(call) == "b"
            # (On a loaded machine b may have been late K times too, and swapped out for a: counts
            # from here.)
            swaps = bal.swaps
            a.release.set()  # a answers from now on, but stays ejected for 60 s
            b.release.clear()  # b hangs
            assert [await name_of(call, timeout=5) for _ in range(4)] == ["a"] * 4
            assert rb.ejected and rb.ejected_slow and not ra.ejected and ra.readmitted_early == 1
            assert bal.swaps == swaps + 1


@pytest.mark.serial  # (see ANSWERS_IN_TIME)
async def test_a_slow_replica_that_still_answers_keeps_its_place_until_it_hangs(stub):
    """As above, but b answers, late: the only READY replica in the rotation is then slow, not hung
    (its load may be why), and keeps its place: swapping on slowness alone, two slow replicas
    would trade places at every K late attempts. Once it hangs, it is swapped out all the same."""
    async with stub("a", hold=True) as a, stub("b") as b:
        s = settings(hedge_after=0.05, max_attempts=2, consecutive_failures=2, base_ejection_s=60, max_ejection_s=60)
        async with Balancer([a.target, b.target], settings=s) as bal:
            call = bal.unary_unary(METHOD)
            ra, rb = bal.replica(a.target), bal.replica(b.target)
            while not ra.ejected:  # the calls that go to a first are hedged to b and answered there
                assert await name_of(call) == "b"
            swaps = bal.swaps  # as above
            for _ in range(2):  # b is late K times (a holds the hedges), but answers each call
                b.release.clear()
                hedged = a.calls + 1
                answer = asyncio.ensure_future(name_of(call))
                await a.wait_calls(hedged)
                b.release.set()
                assert await answer == "b"
            assert rb.consecutive_slow >= 2 and not rb.ejected and ra.ejected and bal.swaps == swaps
            # Then b hangs: K late attempts later without an answer, it is swapped out after all.
            a.release.set()
            b.release.clear()
            assert [await name_of(call, timeout=5) for _ in range(3)] == ["a"] * 3
            assert rb.ejected and not ra.ejected and bal.swaps == swaps + 1


def stats_sum(stats: dict, key: str) -> int:
    return sum(r[key] for r in stats["replicas"])


async def test_stop_leaves_nothing_in_flight(stub):
    async with stub("a", hold=True) as a:
        bal = Balancer(a.target, settings=settings())
        await bal.start()
        call = bal.unary_unary(METHOD)
        calls = [asyncio.ensure_future(code_of(call)) for _ in range(5)]
        await a.wait_calls(5)
        await bal.stop()
        assert await asyncio.gather(*calls) == [CODE.CANCELLED] * 5
        assert not bal._tasks and all(w.done() for w in (r.watcher for r in bal.replicas.values()))
        await a.wait_until(lambda: a.cancelled == 5)
        with pytest.raises(RuntimeError):
            await call(REQUEST)


def test_stop_ends_the_connectivity_watches_before_its_loop_closes(on_a_loop_then_closed):
    """A watcher cancelled, not ended, left its channel's connectivity watch in gRPC's core; its
    completion came once the channel went (at the next collection: a failed call's error held
    it), and gRPC's poller, running on a later loop, handed it to the closed one: "Exception in
    callback PollerCompletionQueue._handle_events ... Event loop is closed" in a later test."""

    async def use_and_stop() -> None:
        bal = Balancer("127.0.0.1:1", settings=settings(max_attempts=1, **NO_EJECTION))  # nothing listens
        await bal.start()
        assert await code_of(bal.unary_unary(METHOD), timeout=1) == CODE.UNAVAILABLE
        watchers = [r.watcher for r in bal.replicas.values()]
        # The failed attempt's error keeps no call past stop(): no collection is needed.
        collections = []
        gc.callbacks.append(lambda phase, info: collections.append(phase))
        gc.disable()
        try:
            await bal.stop()
        finally:
            gc.enable()
            gc.callbacks.pop()
        assert watchers and all(w.done() and not w.cancelled() for w in watchers)
        assert collections == []

    left = on_a_loop_then_closed(use_and_stop)
    assert not left, left[0]


# A balancer left running when its loop ended, called on a later loop: its own process, since its channels stay
# open in gRPC's core for the closed loop (their completions would reach a later test's loop).
CALLED_ON_A_LATER_LOOP = textwrap.dedent(
    """
    import asyncio, gc, json, warnings
    from wok.clients.balancer import Balancer

    async def start():
        bal = Balancer("127.0.0.1:1")  # nothing listens: no call goes out
        await bal.start()
        return bal

    method = asyncio.run(start()).unary_unary("/inference.GRPCInferenceService/ModelInfer")

    async def call():
        try:
            await method(b"", timeout=5)
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
        return "answered"

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        raised = asyncio.run(call())
        gc.collect()  # a coroutine never awaited warns as it goes
    print(json.dumps({"raised": raised, "warnings": [str(w.message) for w in caught]}))
    """
)


def test_a_call_on_a_closed_loop_raises_its_error_and_leaves_no_coroutine_unawaited():
    """Refused at once, naming the closed loop (`_check_loop`). Before that check `create_task` of an attempt raised
    "Event loop is closed", and the attempt's coroutine, never run, warned "coroutine 'Balancer._attempt' was never
    awaited" as it went."""
    done = subprocess.run([sys.executable, "-c", CALLED_ON_A_LATER_LOOP], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.splitlines()[-1])
    assert got["warnings"] == [], got
    assert re.fullmatch(
        r"RuntimeError: targets '127\.0\.0\.1:1': the Balancer was called on a loop other .* which is closed; .*",
        got["raised"],
    ), got


@pytest.mark.parametrize(
    ("home", "state"),
    [("stopped", "is open but not running"), ("running", "is running, on another thread")],
)
def test_a_call_on_a_loop_other_than_starts_is_refused_at_once_naming_that_loops_state(stub, home, state):
    """start()'s loop open but not running (a Runner between runs): a call from another loop scheduled its attempts
    there, where nothing ran them, and waited for them past its own timeout, for good. Refused at once, whatever
    start()'s loop is doing, before an attempt is made; the balancer still serves its own loop. (Closed:
    test_a_call_on_a_closed_loop_..., in a process of its own.)"""
    server_loop = LoopThread()
    server = stub("a")
    server_loop.run(server.__aenter__())
    first = asyncio.Runner() if home != "running" else LoopThread()
    bal = Balancer(server.target, settings=settings(**NO_EJECTION))
    call = bal.unary_unary(METHOD)
    try:

        async def started() -> str:
            await bal.start()
            return await name_of(call)

        assert first.run(started()) == "a"

        async def elsewhere() -> None:
            # Bounded: unrefused, the call of a stopped loop never ended (its 1 s timeout included).
            await asyncio.wait_for(call(REQUEST, timeout=1), 10)

        with pytest.raises(RuntimeError, match=f"called on a loop other than the one it was started on, which {state}"):
            asyncio.run(elsewhere())
        assert (server.calls, bal.calls, bal.attempts) == (1, 1, 1)
        assert first.run(name_of(call)) == "a"  # its own loop's calls go on
    finally:
        first.run(bal.stop())
        first.close()
        server_loop.run(server.__aexit__(None, None, None))
        server_loop.close()


async def test_cancelling_the_caller_cancels_its_attempts(stub):
    async with stub("a", hold=True) as a, stub("b", hold=True) as b:
        async with Balancer([a.target, b.target], settings=settings(hedge_after=0.02, **NO_EJECTION)) as bal:
            task = asyncio.ensure_future(bal.unary_unary(METHOD)(REQUEST, timeout=10))
            await bal.wait_for(lambda: bal.hedges == 1, 10)
            await asyncio.wait_for(a.wait_calls(1), 10)
            await asyncio.wait_for(b.wait_calls(1), 10)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await a.wait_until(lambda: a.cancelled == 1)
            await b.wait_until(lambda: b.cancelled == 1)
            assert not bal._tasks


@pytest.mark.serial  # (see ANSWERS_IN_TIME)
async def test_a_paused_wok_serve_loses_nothing_is_ejected_and_comes_back(start_server, serve):
    """A real replica SIGSTOPped (connections open, nothing answers): every call is answered by
    the other, the paused one is ejected, and after SIGCONT it answers again."""
    paused = start_server("--models", "mlp", "--torch-threads", "1")
    x = np.zeros((1, 256), np.float32)
    async with serve(models=("mlp",)) as healthy:
        s = BalancerSettings(hedge_after=0.1, consecutive_failures=3, base_ejection_s=0.5, max_ejection_s=1.0)
        async with AsyncClient([paused.target, f"127.0.0.1:{healthy.port}"], balancer="wok", balancer_settings=s) as c:
            bal = c.balancer
            p = bal.replica(f"127.0.0.1:{paused.port}")
            while p.ok == 0:  # both serve
                await c.infer("mlp", {"INPUT0": x}, timeout=10)
            os.kill(paused.proc.pid, signal.SIGSTOP)
            try:
                results = await asyncio.gather(*(c.infer("mlp", {"INPUT0": x}, timeout=10) for _ in range(40)))
                assert len(results) == 40  # none lost: InferError would have been raised
                for _ in range(40):
                    await c.infer("mlp", {"INPUT0": x}, timeout=10)
                assert p.ejections >= 1 and p.slow >= 3
                ok_while_paused = p.ok
            finally:
                os.kill(paused.proc.pid, signal.SIGCONT)
            # Back in the rotation once its ejection ends: it answers again.
            while p.ok == ok_while_paused:
                await c.infer("mlp", {"INPUT0": x}, timeout=10)
            assert bal.stats()["ok"] == bal.calls


async def test_async_client_with_the_wok_balancer(serve):
    x = np.ones((2, 256), np.float32)
    async with serve(models=("mlp",)) as a, serve(models=("mlp",)) as b:
        targets = [f"127.0.0.1:{a.port}", f"127.0.0.1:{b.port}"]
        async with AsyncClient(targets) as plain, AsyncClient(targets, balancer="wok") as c:
            await c.wait_ready(10)
            assert await c.server_ready() and (await c.model_metadata("mlp")).inputs["INPUT0"].shape == (-1, 256)
            want = (await plain.infer("mlp", {"INPUT0": x}))["OUTPUT0"]
            got = await asyncio.gather(*(c.infer("mlp", {"INPUT0": x}, timeout=10) for _ in range(20)))
            assert all(np.allclose(g["OUTPUT0"], want, rtol=1e-5, atol=1e-6) for g in got)
            results = [r async for r in c.stream_infer([("mlp", {"INPUT0": x})] * 3)]
            assert [r.error for r in results] == [None] * 3
            with pytest.raises(InferError) as err:
                await c.infer("nope", {"INPUT0": x}, timeout=10)
            assert err.value.code == CODE.NOT_FOUND
            stats = c.balancer.stats()
            assert stats["ok"] >= 22 and all(r["ok"] > 0 for r in stats["replicas"])
        assert c.balancer is None
        # Opened by its first calls, concurrent ones included: one start.
        lazy = AsyncClient(targets, balancer="wok")
        try:
            assert await asyncio.gather(lazy.server_live(), lazy.server_live(), lazy.server_ready()) == [True] * 3
            assert len(lazy.balancer.replicas) == 2
        finally:
            await lazy.close()
    with pytest.raises(ValueError, match="balancer"):
        AsyncClient("127.0.0.1:1", balancer="nginx")


def server_for_localhost_only(name: str = "localhost") -> tuple[bytes, grpc.ServerCredentials]:
    """(CA certificate, server credentials) with a certificate that names `name` only (no address)."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    def cert(subject: str, key, issuer_name, issuer_key, ca: bool) -> x509.Certificate:
        now = datetime.datetime.now(datetime.timezone.utc)
        b = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(issuer_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if not ca:
            b = b.add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        return b.sign(issuer_key, hashes.SHA256())

    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "balancer test CA")])
    ca = cert("balancer test CA", ca_key, ca_name, ca_key, ca=True)
    pem = serialization.Encoding.PEM
    key_pem = key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    server = grpc.ssl_server_credentials([(key_pem, cert(name, key, ca_name, ca_key, False).public_bytes(pem))])
    return ca.public_bytes(pem), server


async def test_tls_checks_the_name_the_replica_was_reached_by(stub):
    """A channel per address still checks the server's certificate against the target's name:
    "localhost:p" reaches 127.0.0.1 and is accepted; "127.0.0.1:p" is not named by the certificate."""
    ca, server = server_for_localhost_only()
    client = grpc.ssl_channel_credentials(ca)
    async with stub("a", credentials=server) as a:
        async with Balancer(f"localhost:{a.port}", credentials=client, settings=settings()) as bal:
            assert list(bal.replicas) == [f"127.0.0.1:{a.port}"]
            assert await name_of(bal.unary_unary(METHOD)) == "a"
        async with Balancer(a.target, credentials=client, settings=settings(**NO_EJECTION)) as bal:
            assert await code_of(bal.unary_unary(METHOD)) == CODE.UNAVAILABLE
            assert a.calls == 1  # the first balancer's call only: the handshake failed


async def test_the_tls_name_override_holds_for_a_replica_reached_by_host_name(stub):
    """The documented `grpc.ssl_target_name_override` with a host-name target: the balancer's own
    authority ("localhost:p", for TLS to check the name) came on top of it, and gRPC failed every
    call ("call host does not match SSL server name"), health checks included."""
    ca, server = server_for_localhost_only("other.example")
    override = [("grpc.ssl_target_name_override", "other.example")]
    async with stub("a", credentials=server) as a:
        target = f"localhost:{a.port}"
        async with AsyncClient(target, tls=TLS(ca), options=override, balancer="wok") as c:
            await c.wait_ready(10)
            with pytest.raises(InferError) as err:  # the stub serves ModelInfer only: the call got there
                await c.server_live()
            assert err.value.code == CODE.UNIMPLEMENTED
            creds = grpc.ssl_channel_credentials(ca)
            async with Balancer(target, credentials=creds, options=override, settings=settings()) as bal:
                assert await name_of(bal.unary_unary(METHOD)) == "a"


async def test_wait_ready_names_the_targets_and_each_replicas_state_and_last_error():
    """It said "not within 3 s", naming neither the targets nor why; then it named them unquoted."""
    # Nothing listens on port 1 (privileged), so connections are refused; a closed stub's port could
    # be taken meanwhile by another process's server (a second pytest worker's).
    port = 1
    async with AsyncClient(f"127.0.0.1:{port}", balancer="wok") as c:
        with pytest.raises(InferError):
            await c.server_live()
        with pytest.raises(TimeoutError) as err:
            await c.wait_ready(0.2)
    message = str(err.value)
    assert message.startswith(f"'127.0.0.1:{port}' (127.0.0.1:{port} "), message
    assert "not connected (no replica READY) within 0.2 s" in message
    assert any(f" {state.name}" in message for state in (STATE.TRANSIENT_FAILURE, STATE.CONNECTING)), message
    assert "last error 'UNAVAILABLE: " in message
    # The targets are the user's text, quoted as the module's other messages show them: shown bare,
    # a name with a newline broke the message's line (and a client's log with it).
    bal = Balancer(f"dns:///we\nird:{port}", settings=settings(), resolver=answering([f"127.0.0.1:{port}"]))
    async with bal:
        with pytest.raises(TimeoutError) as err:
            await bal.wait_ready(0.2)
    message = str(err.value)
    assert message.startswith(f"'we\\nird:{port}' (127.0.0.1:{port} ") and "\n" not in message, message


async def test_describe_quotes_and_cuts_a_replicas_last_error(stub):
    """A replica's last error is a server's details: shown whole and bare, one with a newline split
    the message's line (forging one in a client's log), and 100 KB of details made each wait_ready
    timeout's message as long."""
    name = "a\nERROR forged " + "x" * 5000  # the stub's details: "{name}: failing call 1"
    async with stub(name, fail_first=1) as a:
        async with Balancer(a.target, settings=settings(max_attempts=1, **NO_EJECTION)) as bal:
            assert await code_of(bal.unary_unary(METHOD)) == CODE.UNAVAILABLE
            details = f"UNAVAILABLE: {name}: failing call 1"
            assert bal.replica(a.target).last_error == details  # kept whole: only its display is bounded
            shown = bal.describe()
    assert "\n" not in shown and len(shown) < 1000, shown[-200:]
    from wok.clients.balancer import ERROR_CHARS  # (after the checks that failed before it was made)

    cut = ("UNAVAILABLE: a\\nERROR forged " + "x" * 5000)[: ERROR_CHARS + 1]  # one more for the escape
    assert shown.endswith(f"last error '{cut}'" + CUT_NOTE.format(len(details)) + ")"), shown[-200:]


def test_counters_of_several_workers_add_up():
    counts = {"attempts": 2, "ok": 1, "failures": 1, "slow": 0, "hedges": 1, "retries": 0, "ejections": 1}
    one = {
        "schema": "wok.balancer/1",
        **dict.fromkeys(("calls", "ok", "attempts", "hedges", "retries", "budget_refusals", "ejections"), 1),
        "ejections_refused": 0,
        "hedge_after_ms": 20.0,
        "replicas": [{"address": "a:1", "target": "a:1", "state": "READY", "ejected": False, **counts}],
    }
    merged = merge_stats([one, None, one])
    assert merged["calls"] == 2 and merged["ejections"] == 2 and merged["hedge_after_ms"] == [20.0, 20.0]
    assert merged["replicas"] == [{"address": "a:1", "target": "a:1", **{k: 2 * v for k, v in counts.items()}}]
    assert merge_stats([None]) is None


# -- the cap on ejections: swaps counted in stats(); failing replicas filling it -----------------


def by_address(stats: dict) -> dict[str, dict]:
    return {r["address"]: r for r in stats["replicas"]}


async def test_a_swap_is_counted_and_names_the_replica_readmitted_early(stub):
    """The cap (one of two) is filled by a slow replica; the other, READY, then fails its calls and
    takes the slow one's place: stats() counts the swap, and the slow one as readmitted early."""
    async with stub("a", hold=True) as a, stub("b") as b:
        s = BalancerSettings(
            hedge_after=0.2, max_attempts=2, consecutive_failures=2, base_ejection_s=60, max_ejection_s=60
        )
        async with Balancer([a.target, b.target], settings=s) as bal:
            call = bal.unary_unary(METHOD)
            slow, failing = bal.replica(a.target), bal.replica(b.target)
            while not slow.ejected:  # the calls that go to a first are hedged to b and answered there
                assert await name_of(call) == "b"
            stats = bal.stats()
            assert stats["swaps"] == 0 and by_address(stats)[a.target]["readmitted_early"] == 0
            a.release.set()
            b.fail_first, b.code = 1 << 30, CODE.INTERNAL  # b fails every call from now on, health SERVING
            assert [await code_of(call) for _ in range(2)] == [CODE.INTERNAL] * 2
            assert failing.ejected and not slow.ejected
            stats = bal.stats()
            replicas = by_address(stats)
            assert stats["swaps"] == 1 and stats["ejections"] == 2 and stats["ejections_refused"] == 0
            assert replicas[a.target]["readmitted_early"] == 1 and replicas[a.target]["ejections"] == 1
            assert replicas[b.target]["readmitted_early"] == 0 and replicas[b.target]["ejections"] == 1
            # Two workers' counters add up, per replica too.
            merged = merge_stats([stats, stats])
            assert merged["swaps"] == 2 and by_address(merged)[a.target]["readmitted_early"] == 2


def test_merging_counters_written_before_swaps_were_counted():
    replica = {"address": "a:1", "target": "a:1", "attempts": 1, "ok": 1, "failures": 0, "slow": 0}
    replica |= {"hedges": 0, "retries": 0, "ejections": 0}
    keys = ("calls", "ok", "attempts", "hedges", "retries", "budget_refusals", "ejections", "ejections_refused")
    old = {"schema": "wok.balancer/1", **dict.fromkeys(keys, 1), "hedge_after_ms": 20.0, "replicas": [replica]}
    new = {**old, "swaps": 1, "replicas": [{**replica, "readmitted_early": 1}]}
    assert merge_stats([old, old])["swaps"] == 0 and "readmitted_early" not in merge_stats([old])["replicas"][0]
    merged = merge_stats([old, new])
    assert merged["swaps"] == 1 and merged["replicas"][0]["readmitted_early"] == 1


async def test_failing_replicas_that_fill_the_cap_keep_a_further_failing_one_in_the_rotation(stub):
    """The cap is a bound on the balancer's own judgement, whatever the ejected ones' fault: of
    three replicas at most one is ejected. One fails and is ejected; a second then fails every
    call too and is not ejected in its place or beside it (nothing tells the balancer the first
    has recovered: an ejected one gets no calls while the rotation has a READY one). It keeps
    its share of the calls, every failure past K is counted as refused, and nothing is swapped."""
    async with stub("a", fail_first=1 << 30, code=CODE.INTERNAL) as a, stub("b") as b, stub("c") as c:
        s = BalancerSettings(hedge_after=None, consecutive_failures=2, base_ejection_s=60, max_ejection_s=60)
        async with Balancer([a.target, b.target, c.target], settings=s) as bal:
            call = bal.unary_unary(METHOD)
            first, second = bal.replica(a.target), bal.replica(b.target)
            while not first.ejected:
                await code_of(call)
            assert first.failures == 2 and bal.ejections_refused == 0
            b.fail_first, b.code = 1 << 30, CODE.INTERNAL  # b fails every call from now on, health SERVING
            calls_before = b.calls
            codes = []
            while second.failures < 6:
                codes.append(await code_of(call))
            assert set(codes) <= {CODE.INTERNAL, CODE.OK} and codes.count(CODE.INTERNAL) == 6  # the rest: c's
            assert first.ejected and not second.ejected and second.state is STATE.READY
            assert b.calls == calls_before + 6 and a.calls == 2  # the ejected one got none of these calls
            # K = 2: the 2nd failure asked for an ejection, and each one after it again; all refused.
            stats = bal.stats()
            assert stats["ejections_refused"] == 6 - 1 and stats["ejections"] == 1 and stats["swaps"] == 0
            assert all(r["readmitted_early"] == 0 for r in stats["replicas"])


async def test_totals_keep_the_counters_of_a_replica_the_name_no_longer_resolves_to(stub):
    """A pod that failed and was ejected goes away (the headless Service drops its address): it
    leaves `replicas`, the current set, but the balancer's totals keep what it counted."""
    async with stub("a", fail_first=1 << 30, code=CODE.INTERNAL) as a, stub("b") as b:
        answers = [a.target, b.target]
        async with ejecting_headless(answers) as bal:
            call = bal.unary_unary(METHOD)
            await ejected_by_calls(bal, call, a.target)
            before = bal.stats()
            assert before["ejections"] == 1 and by_address(before)[a.target]["ejections"] == 1
            answers.remove(a.target)
            await bal.wait_for(lambda: list(bal.replicas) == [b.target], 10)
            after = bal.stats()
            assert [r["address"] for r in after["replicas"]] == [b.target]
            totals = {k: v for k, v in before.items() if k not in ("replicas", "hedge_after_ms")}
            assert {k: after[k] for k in totals} == totals
            assert await name_of(call) == "b" and bal.stats()["ejections"] == 1


# -- stop() racing a retry; hedges and retries while a replica's channel is down ----------------


async def test_stop_as_an_attempt_fails_cancels_its_call_and_outlives_nothing(stub, monkeypatch):
    """An attempt ends UNAVAILABLE and stop() starts before its caller resumes: the caller used to
    launch its retry then, unknown to stop(), which returned with it still asleep in its backoff;
    the retry then met the closed channel and its grpc.aio.UsageError (not an AioRpcError: it
    passed AsyncClient's InferError by) reached the caller. Now the caller gets CANCELLED and
    nothing the balancer started is left running once stop() returns."""
    monkeypatch.setattr(random, "uniform", lambda low, high: high)  # the backoff: its longest, 0.5 s
    async with stub("a", fail_first=1 << 30) as a:
        bal = Balancer(a.target, settings=settings(backoff_s=0.5, max_backoff_s=0.5, **NO_EJECTION))
        await bal.start()
        stopping: list[asyncio.Task] = []
        launch = bal._launch

        def launch_and_stop_as_the_first_attempt_ends(pending, attempt, *args) -> None:
            launch(pending, attempt, *args)
            if attempt.task is not None and len(bal._tasks) == 1 and not stopping:
                # Its done callbacks run in order: this one's stop() gets the loop before the
                # caller's asyncio.wait wakes the caller.
                attempt.task.add_done_callback(lambda _: stopping.append(asyncio.ensure_future(bal.stop())))

        bal._launch = launch_and_stop_as_the_first_attempt_ends
        call = asyncio.ensure_future(code_of(bal.unary_unary(METHOD)))
        await a.wait_calls(1)
        await bal.wait_for(lambda: bool(stopping), 10)
        await stopping[0]
        assert [t for t in bal._tasks if not t.done()] == []
        assert await call == CODE.CANCELLED
        assert a.calls == 1 and bal.retries == 0


async def test_stop_as_an_attempt_answers_leaves_its_caller_the_answer(stub):
    """The same race with an attempt that answered OK: the server did the work, and the caller gets
    its answer, not CANCELLED; counted as any other answer (its replica's ok and the hedge delay's
    latencies were not) and giving its budget token back."""
    async with stub("a") as a:
        bal = Balancer(a.target, settings=settings(**NO_EJECTION))
        await bal.start()
        bal.tokens = 90.0  # as after ten extra attempts: the OK call's 0.1 back shows
        stopping: list[asyncio.Task] = []
        launch = bal._launch

        def launch_and_stop_as_the_first_attempt_ends(pending, attempt, *args) -> None:
            launch(pending, attempt, *args)
            if attempt.task is not None and not stopping:
                attempt.task.add_done_callback(lambda _: stopping.append(asyncio.ensure_future(bal.stop())))

        bal._launch = launch_and_stop_as_the_first_attempt_ends
        call = asyncio.ensure_future(code_of(bal.unary_unary(METHOD)))
        await bal.wait_for(lambda: bool(stopping), 10)
        await stopping[0]
        assert await call == CODE.OK
        assert a.calls == 1 and bal.ok_calls == 1 and [t for t in bal._tasks if not t.done()] == []
        ra = bal.replica(a.target)
        assert (ra.attempts, ra.ok, ra.failures) == (1, 1, 0) and len(bal._latencies) == 1
        assert bal.tokens == pytest.approx(90.1)


async def test_hedges_and_retries_skip_a_replica_whose_channel_is_down(stub):
    """b's channel is TRANSIENT_FAILURE (NOT_SERVING, as a stopped server's would be): a hedge or a
    retry sent there fails at once, spends a token and counted towards b's ejection. None is sent."""
    async with stub("a", hold=True) as a, stub("b") as b:
        s = settings(hedge_after=0.02, backoff_s=0.001, **NO_EJECTION)
        async with Balancer([a.target, b.target], settings=s) as bal:
            down = bal.replica(b.target)
            await b.health.set("", NOT_SERVING)
            await bal.wait_for(lambda: down.state is STATE.TRANSIENT_FAILURE, 10)
            call = bal.unary_unary(METHOD)
            # a holds the call; a hedge is due every 20 ms, and b is the only other replica.
            assert await code_of(call, timeout=0.3) == CODE.DEADLINE_EXCEEDED
            assert a.calls == 1 and bal.hedges == 0 and down.attempts == 0
            # a fails UNAVAILABLE: the retries go back to it, after a backoff, not to b.
            a.fail_first = 1 << 30
            assert await code_of(call) == CODE.UNAVAILABLE
            assert a.calls == 1 + 3 and bal.retries == 2 and down.attempts == 0 and b.calls == 0


async def test_the_only_ready_replica_is_not_ejected_for_slowness(stub):
    """b is down, so a carries every call, and its attempts come late (its load may be why). Ejected
    for it, a would still take the calls, and b, once back, all of them for the ejection's rest."""
    async with stub("a", hold=True) as a, stub("b") as b:
        s = settings(hedge_after=0.02, consecutive_failures=2)
        async with Balancer([a.target, b.target], settings=s) as bal:
            ra, down = bal.replica(a.target), bal.replica(b.target)
            await b.health.set("", NOT_SERVING)
            await bal.wait_for(lambda: down.state is STATE.TRANSIENT_FAILURE, 10)
            call = bal.unary_unary(METHOD)
            calls = [asyncio.ensure_future(code_of(call)) for _ in range(3)]
            await bal.wait_for(lambda: bal.ejections_refused >= 1, 10)
            assert not ra.ejected and bal.ejections == 0 and ra.consecutive_slow >= 2
            a.release.set()
            assert await asyncio.gather(*calls) == [CODE.OK] * 3
            assert down.attempts == 0


async def test_failures_while_every_replica_is_down_eject_none(stub):
    """Every channel TRANSIENT_FAILURE: a call's first attempt still goes to one and fails at once
    (UNAVAILABLE, not a wait), but that is the channel's state, which connectivity tracks: it
    used to eject one replica, kept out of the rotation for its whole ejection once back."""
    async with stub("a") as a, stub("b") as b:
        s = settings(consecutive_failures=2, base_ejection_s=60, max_ejection_s=60)
        async with Balancer([a.target, b.target], settings=s) as bal:
            call = bal.unary_unary(METHOD)
            for x in (a, b):
                await x.health.set("", NOT_SERVING)
            await bal.wait_for(lambda: all(r.state is STATE.TRANSIENT_FAILURE for r in bal.replicas.values()), 10)
            assert [await code_of(call) for _ in range(10)] == [CODE.UNAVAILABLE] * 10
            assert bal.ejections == bal.ejections_refused == 0 and bal.attempts == 10 and bal.retries == 0
            for x in (a, b):
                await x.health.set("", SERVING)
            await bal.wait_for(lambda: all(r.state is STATE.READY for r in bal.replicas.values()), 10)
            assert {await name_of(call) for _ in range(30)} == {"a", "b"}


async def test_an_ejection_ends_when_the_replica_is_back_from_being_down(stub):
    """b fails its calls (UNAVAILABLE, as a dying server's connections do, before its channel says
    so) and is ejected; its channel then goes TRANSIENT_FAILURE and, once its server is back,
    READY: it takes calls again at once, not after the rest of its ejection (60 s here)."""
    async with stub("a") as a, stub("b", fail_first=2) as b:
        s = settings(consecutive_failures=2, base_ejection_s=60, max_ejection_s=60)
        async with Balancer([a.target, b.target], settings=s) as bal:
            call = bal.unary_unary(METHOD)
            back = bal.replica(b.target)
            while not back.ejected:  # b's UNAVAILABLEs are retried on a
                assert await name_of(call) == "a"
            await b.health.set("", NOT_SERVING)
            await bal.wait_for(lambda: back.state is STATE.TRANSIENT_FAILURE, 10)
            assert back.ejected
            await b.health.set("", SERVING)
            await bal.wait_for(lambda: back.state is STATE.READY, 10)
            assert not back.ejected and back.readmit is None
            assert "b" in {await name_of(call) for _ in range(30)}


# -- a replica back from an ejection is judged afresh --------------------------------------------


def a_first_on_ties(monkeypatch, address: str) -> None:
    """Power of two choices draws `address` first: calls that see equal loads all go there."""
    monkeypatch.setattr(random, "sample", lambda pool, k: sorted(pool, key=lambda r: r.address != address)[:k])


def end_ejection(bal: Balancer, r) -> float:
    """End `r`'s ejection now, as its timer would (`Balancer._readmit`, the timer's callback), and
    return how long it had left. A test of what follows a return need not wait out an ejection that
    had to outlast, on a slow host, the late attempts and failures it waits for first (1.5 s each)."""
    assert r.ejected and r.readmit is not None and not r.readmit.cancelled()
    left = r.readmit.when() - asyncio.get_running_loop().time()
    r.readmit.cancel()
    bal._readmit(r)
    return left


@pytest.mark.serial  # (see ANSWERS_IN_TIME)
async def test_late_attempts_out_at_an_ejection_do_not_count_after_the_return(stub, monkeypatch):
    """a holds its calls (hung, or slow past the hedge): 4 calls go to it at once, K = 2 of them
    late eject it, and the other 2 come late while it sits out. Back in the rotation, still slow,
    it used to be ejected again at its first late attempt (the 2 carried over): a lasting fault
    costs K hedged calls each time it comes back, not 1."""
    async with stub("a", hold=True) as a, stub("b") as b:
        a_first_on_ties(monkeypatch, a.target)
        s = settings(hedge_after=0.05, max_attempts=2, consecutive_failures=2, base_ejection_s=10)
        async with Balancer([a.target, b.target], settings=s) as bal:
            call = bal.unary_unary(METHOD)
            ra = bal.replica(a.target)
            assert await asyncio.gather(*(name_of(call) for _ in range(4))) == ["b"] * 4  # hedged
            assert a.calls == 4 and ra.slow == 4 and ra.ejections == 1
            assert 9 < end_ejection(bal, ra) <= 10  # its ejection is over (base_ejection_s × 1)
            assert await name_of(call) == "b"  # to a first (ties): late, hedged
            assert ra.slow == 5 and not ra.ejected and ra.ejections == 1
            while not ra.ejected:  # (a's cancelled attempt may not have ended yet: b is less loaded)
                assert await name_of(call) == "b"
            assert ra.slow == 6 and ra.ejections == 2
            assert 19 < end_ejection(bal, ra) <= 20  # the second ejection: base_ejection_s × 2


@pytest.mark.serial  # (see ANSWERS_IN_TIME)
async def test_a_hedge_late_on_an_ejected_replica_does_not_count_after_its_return(stub):
    """a is ejected for slowness; b, the rotation's only replica, holds a call whose hedge goes to a
    (documented: a hedge may go to a READY one ejected for slowness) and is late there too. Back
    in the rotation, a was ejected again at its first late attempt."""
    async with stub("a", hold=True) as a, stub("b") as b:
        s = settings(hedge_after=0.05, max_attempts=2, consecutive_failures=2, base_ejection_s=60, max_ejection_s=60)
        async with Balancer([a.target, b.target], settings=s) as bal:
            call = bal.unary_unary(METHOD)
            ra = bal.replica(a.target)
            while not ra.ejected:  # the calls that go to a first are hedged to b and answered there
                assert await name_of(call) == "b"
            b.release.clear()
            late = ra.slow
            held = asyncio.ensure_future(name_of(call))
            await bal.wait_for(lambda: ra.slow == late + 1, 10)  # b's call hedged to a, late there
            assert ra.ejected
            b.release.set()
            assert await held == "b"
            end_ejection(bal, ra)
            while ra.slow == late + 1:  # until a call goes to a first: late, hedged
                assert await name_of(call) == "b"
            assert not ra.ejected and ra.ejections == 1
            while not ra.ejected:
                assert await name_of(call) == "b"
            assert ra.slow == late + 3 and ra.ejections == 2


async def test_a_failure_while_ejected_does_not_count_after_the_return(stub):
    """The same for failures: b fails every call (INTERNAL) and is ejected; while a is down, b (READY,
    ejected) takes the calls and fails one. Back in the rotation, b was ejected again at its first
    failure: a lasting fault costs K failed calls each time it comes back."""
    async with stub("a") as a, stub("b", fail_first=1 << 30, code=CODE.INTERNAL) as b:
        s = settings(consecutive_failures=2, base_ejection_s=60, max_ejection_s=60)
        async with Balancer([a.target, b.target], settings=s) as bal:
            call = bal.unary_unary(METHOD)
            ra, rb = bal.replica(a.target), bal.replica(b.target)
            while not rb.ejected:
                await code_of(call)
            await a.health.set("", NOT_SERVING)
            await bal.wait_for(lambda: ra.state is STATE.TRANSIENT_FAILURE, 10)
            assert await code_of(call) == CODE.INTERNAL and rb.failures == 3  # b takes it, ejected
            await a.health.set("", SERVING)
            await bal.wait_for(lambda: ra.state is STATE.READY, 10)
            end_ejection(bal, rb)
            while rb.failures == 3:
                await code_of(call)
            assert not rb.ejected and rb.ejections == 1
            while not rb.ejected:
                await code_of(call)
            assert rb.failures == 5 and rb.ejections == 2


@pytest.mark.serial  # (see ANSWERS_IN_TIME)
async def test_a_replica_back_fast_after_an_ejection_for_slowness_takes_its_share_unhedged(stub, monkeypatch):
    """a is slow, ejected for it with late attempts out (as above), then answers at once. Back in the
    rotation it takes its share of the calls, and nothing of its late past shows: no call is
    hedged, none of its attempts is late, its late count is zero."""
    async with stub("a", hold=True) as a, stub("b") as b:
        a_first_on_ties(monkeypatch, a.target)
        s = settings(hedge_after=0.25, max_attempts=2, consecutive_failures=2, base_ejection_s=1.0)
        async with Balancer([a.target, b.target], settings=s) as bal:
            call = bal.unary_unary(METHOD)
            ra = bal.replica(a.target)
            assert await asyncio.gather(*(name_of(call) for _ in range(4))) == ["b"] * 4
            assert ra.ejected and ra.slow == 4
            monkeypatch.undo()  # random picks again
            a.release.set()  # a answers at once from now on
            await bal.wait_for(lambda: not ra.ejected, 10)  # its timer ends it (elsewhere end_ejection does)
            hedges, calls_before = bal.hedges, a.calls
            names = [await name_of(call) for _ in range(60)]
            # Power of two choices between two idle replicas: half each; fewer than 15 of 60 is
            # a chance of 2e-5.
            assert names.count("a") >= 15 and a.calls - calls_before == names.count("a")
            assert bal.hedges == hedges and ra.slow == 4 and ra.consecutive_slow == 0
            assert not ra.ejected and ra.ejections == 1


@pytest.mark.serial  # (see ANSWERS_IN_TIME)
async def test_an_ejected_slow_replica_alone_ready_is_not_swapped_out_for_itself(stub):
    """a is ejected for slowness and still holds its calls; b goes down, so a, READY, takes every
    call. Its late attempts used to count while it was ejected: at K it was "hung" with a READY
    replica sitting out for slowness (itself), readmitted early and ejected again in its own place:
    a swap counted, its ejection lengthened."""
    async with stub("a", hold=True) as a, stub("b") as b:
        s = settings(hedge_after=0.05, max_attempts=2, consecutive_failures=2, base_ejection_s=60, max_ejection_s=60)
        async with Balancer([a.target, b.target], settings=s) as bal:
            call = bal.unary_unary(METHOD)
            ra, rb = bal.replica(a.target), bal.replica(b.target)
            while not ra.ejected:  # the calls that go to a first are hedged to b and answered there
                assert await name_of(call) == "b"
            swaps, late = bal.swaps, ra.slow  # (b may have been late and swapped out on a busy host)
            await b.health.set("", NOT_SERVING)
            await bal.wait_for(lambda: rb.state is STATE.TRANSIENT_FAILURE, 10)
            calls = [asyncio.ensure_future(code_of(call)) for _ in range(3)]
            await bal.wait_for(lambda: ra.slow == late + 3, 10)  # a holds all three, late
            assert ra.ejected and ra.ejections == 1 and ra.readmitted_early == 0 and bal.swaps == swaps
            a.release.set()
            assert await asyncio.gather(*calls) == [CODE.OK] * 3


async def test_one_attempt_per_call_is_found_late_and_ejects_a_hung_replica(stub, monkeypatch):
    """max_attempts=1 (AsyncClient's retries=False): no hedge, but an attempt unanswered after
    hedge_after is late all the same, and K of them in a row eject the replica. The attempt had not
    started when the call first chose when to wake, so it was never found late: a hung replica
    kept its share of the calls, each waiting out its deadline."""
    async with stub("a", hold=True) as a, stub("b") as b:
        a_first_on_ties(monkeypatch, a.target)
        s = settings(hedge_after=0.1, max_attempts=1, consecutive_failures=2, base_ejection_s=60, max_ejection_s=60)
        async with Balancer([a.target, b.target], settings=s) as bal:
            await bal.wait_for(lambda: all(r.state is STATE.READY for r in bal.replicas.values()), 10, "all READY")
            call = bal.unary_unary(METHOD)
            ra = bal.replica(a.target)
            for late in (1, 2):  # each call goes to a (ties) and is held there until found late
                held = asyncio.ensure_future(code_of(call, timeout=30))
                await bal.wait_for(lambda late=late: ra.slow == late, 10, f"a's attempt {late} found late")
                a.release.set()  # (instead of waiting out its deadline)
                assert await held == CODE.OK
                a.release.clear()
            assert ra.ejected and ra.slow == 2 and a.calls == 2 and bal.hedges == 0
            assert [await name_of(call) for _ in range(10)] == ["b"] * 10


async def test_a_stream_with_no_replica_to_send_to_raises_infer_error():
    """`stream_infer` raised grpc's own AioRpcError when the balancer had no replica to pick (every
    one ejected): every other failed call is an InferError."""
    async with AsyncClient("127.0.0.1:1", balancer="wok") as c:
        await c._open()
        for r in c._balancer.replicas.values():
            r.ejected = True
        with pytest.raises(InferError) as info:
            async for _ in c.stream_infer([("mlp", {"INPUT0": np.zeros((1, 256), np.float32)})]):
                pass
    assert (info.value.code, info.value.details) == (
        grpc.StatusCode.UNAVAILABLE,
        "targets '127.0.0.1:1': no replica to send to among 1",
    )


async def test_stream_channel_before_start_or_after_stop_raises_as_call_does():
    """stream_channel did not check start() and stop() as call() does: before start() it raised UNAVAILABLE
    "no replica", after stop() it handed out a replica's channel stop() had closed."""
    bal = Balancer("127.0.0.1:1")
    with pytest.raises(RuntimeError, match=r"^the Balancer is not running: "):
        bal.stream_channel()
    async with bal:
        _channel, release = bal.stream_channel()
        release()
    with pytest.raises(RuntimeError, match=r"^the Balancer is not running: "):
        bal.stream_channel()


# -- answers that come together; a backoff past the deadline; a name that stops resolving ---------


class HeldThen(Stub):
    """A Stub that holds every call until `release` is set, then answers it with `then`: an error
    of that code, or (OK) its name."""

    def __init__(self, name: str, then: grpc.StatusCode = CODE.OK) -> None:
        super().__init__(name, hold=True)
        self.then = then

    async def infer(self, request: bytes, context) -> bytes:
        self.calls += 1
        await self._notify()
        await self.release.wait()
        if self.then is not CODE.OK:
            await context.abort(self.then, f"{self.name}: {self.then.name}")
        return pb.ModelInferResponse(model_name=self.name).SerializeToString()


async def test_an_ok_answer_that_came_with_an_error_is_the_calls_answer_and_both_are_counted():
    """A call and its hedge answered together, one INTERNAL, one OK: the answers were taken in the
    order of asyncio.wait's `done` (a set, in no order), so half the time the call failed INTERNAL
    with the OK answer in hand, and the answer after the first to end the call was never counted
    (its replica's ok or failures: a failing replica's ejection came late). The OK one wins, both
    are counted. The attempts here end only once both have their answer (on real servers, released
    at once, they mostly come together; this makes it every time)."""
    async with HeldThen("a", CODE.INTERNAL) as a, HeldThen("b") as b:
        s = settings(hedge_after=0.02, max_attempts=2, **NO_EJECTION)
        async with Balancer([a.target, b.target], settings=s) as bal:
            attempt, ended, both = bal._attempt, [], asyncio.Event()

            async def attempt_ending_with_the_other(a, *args):
                try:
                    return await attempt(a, *args)
                finally:
                    ended.append(a)
                    if len(ended) == 2:
                        both.set()
                    await both.wait()

            bal._attempt = attempt_ending_with_the_other
            call = asyncio.ensure_future(name_of(bal.unary_unary(METHOD)))
            await a.wait_calls(1)
            await b.wait_calls(1)  # the call and its hedge
            a.release.set()
            b.release.set()
            assert await call == "b"
            ra, rb = bal.replica(a.target), bal.replica(b.target)
            assert (ra.failures, ra.ok, rb.ok, rb.failures) == (1, 0, 1, 0)
            assert bal.ok_calls == 1 and bal.hedges == 1 and bal.attempts == 2


async def test_a_retry_whose_backoff_would_end_past_the_deadline_is_not_made(stub, monkeypatch):
    """One replica, failing UNAVAILABLE: its retry goes back to it after a backoff. One drawn past
    the call's deadline was slept through all the same, for a token, and the attempt then failed
    DEADLINE_EXCEEDED unsent: infer(timeout=0.5) ended after the whole backoff (5 s here; up to
    max_backoff_s, 1 s, by default). The call ends at once with its UNAVAILABLE."""
    monkeypatch.setattr(random, "uniform", lambda low, high: high)  # the backoff: its longest, 5 s
    async with stub("a", fail_first=1 << 30) as a:
        s = settings(backoff_s=5.0, max_backoff_s=5.0, **NO_EJECTION)
        async with Balancer(a.target, settings=s) as bal:
            call = bal.unary_unary(METHOD)
            assert await code_of(call, timeout=0.5) == CODE.UNAVAILABLE
            assert a.calls == 1 and bal.retries == 0 and bal.attempts == 1
            assert bal.tokens == s.budget_tokens  # no token spent on it
            # A backoff that ends in time is slept, and the retry made.
            monkeypatch.setattr(random, "uniform", lambda low, high: low)
            assert await code_of(call, timeout=0.5) == CODE.UNAVAILABLE
            assert a.calls == 1 + 3 and bal.retries == 2


@pytest.mark.parametrize("lookup", ["fails", "finds nothing"])
async def test_a_name_that_stops_resolving_keeps_its_replicas_and_the_others_follow_theirs(stub, lookup):
    """Two names; the lookups of one start failing (a Service deleted, its DNS gone): the replica
    set was kept whole, the other name's too, so its new pods never got a call and its vanished ones
    stayed. (A lookup that found nothing, from a resolver of one's own, dropped the name's
    replicas.) Now a name that fails keeps its own replicas and the others follow their names."""
    async with stub("a") as a, stub("b") as b, stub("c") as c:
        answers = {"svc-a": [a.target], "svc-b": [b.target]}
        lookups = {"svc-a": 0, "svc-b": 0}

        async def resolver(host: str, port: int) -> list[str]:
            lookups[host] += 1
            if host == "svc-b" and lookups[host] > 1:
                if lookup == "fails":
                    raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
                return []
            return list(answers[host])

        s = settings(resolve_every_s=0.05)
        async with Balancer("dns:///svc-a:8001,dns:///svc-b:8001", settings=s, resolver=resolver) as bal:
            assert sorted(bal.replicas) == sorted([a.target, b.target])
            answers["svc-a"] = [a.target, c.target]  # a new pod of svc-a
            await bal.wait_for(lambda: c.target in bal.replicas, 10, "c added")
            answers["svc-a"] = [c.target]  # and an old one gone
            await bal.wait_for(lambda: a.target not in bal.replicas, 10, "a gone")
            assert sorted(bal.replicas) == sorted([b.target, c.target]) and lookups["svc-b"] > 1
            call = bal.unary_unary(METHOD)
            assert {await name_of(call) for _ in range(40)} == {"b", "c"}


# -- a retry cancelled in its backoff; stop() taking an answer; a resolver's own errors ---------


async def test_a_retry_cancelled_in_its_backoff_is_not_counted_and_gives_its_token_back(stub, monkeypatch):
    """A call on a (held), its hedge on b fails UNAVAILABLE, and its retry goes back to b after a
    backoff; a answers meanwhile and the retry is cancelled unsent. It was counted in `retries` (b's
    too: "sent to it") but not in `attempts`, and kept its token: `retries` and `hedges` are extra
    attempts sent, so attempts = first attempts + hedges + retries, and the budget pays for those."""
    monkeypatch.setattr(random, "uniform", lambda low, high: high)  # the backoff: its longest, 5 s
    monkeypatch.setattr(random, "sample", lambda seq, k: list(seq)[:k])  # the first pick: a, the first target
    async with stub("a", hold=True) as a, stub("b", fail_first=1 << 30) as b:
        s = settings(hedge_after=0.02, max_attempts=3, backoff_s=5.0, max_backoff_s=5.0, **NO_EJECTION)
        async with Balancer([a.target, b.target], settings=s) as bal:
            # Both READY: the first pick is a (a READY b alone would take it, and retry on a at once).
            await bal.wait_for(lambda: all(r.state is STATE.READY for r in bal.replicas.values()), 10)
            call = asyncio.ensure_future(name_of(bal.unary_unary(METHOD), timeout=30))
            await b.wait_calls(1)  # the hedge, failed
            await bal.wait_for(lambda: bal.tokens == s.budget_tokens - 2, 10, "the retry launched")
            assert b.calls == 1 and not call.done()  # the retry sleeps in its backoff
            a.release.set()
            assert await call == "a"
            rb = bal.replica(b.target)
            assert (bal.attempts, bal.hedges, bal.retries) == (2, 1, 0) and (rb.attempts, rb.retries) == (1, 0)
            assert bal.attempts == bal.calls + bal.hedges + bal.retries
            # The hedge's token only: the retry's comes back as its task ends, cancelled.
            refunded = s.budget_tokens - 1 + s.budget_ratio
            await bal.wait_for(lambda: bal.tokens == pytest.approx(refunded), 10, "the retry's token back")
            assert (bal.attempts, bal.retries) == (2, 0) and b.calls == 1


async def test_a_resolver_raising_its_own_error_is_logged_once_per_kind_and_the_lookups_go_on(stub, caplog):
    """A resolver of one's own raising something other than OSError (a bug, a client library's own
    error) ended the re-resolving task, silently: the names were never looked up again. Now the
    name keeps its replicas, the error is logged once per kind of error (not at every lookup), and
    once the resolver answers again its changes apply."""
    async with stub("a") as a, stub("b") as b:
        answers = [a.target]
        lookups = 0
        raising: list[type[Exception]] = []
        looked = asyncio.Event()

        async def resolver(host: str, port: int) -> list[str]:
            nonlocal lookups
            lookups += 1
            looked.set()
            if raising:
                raise raising[0](f"lookup {lookups} of {host}: the resolver failed")
            return list(answers)

        async def lookups_made(n: int) -> None:
            until = lookups + n
            while lookups < until:
                looked.clear()
                await asyncio.wait_for(looked.wait(), 10)

        caplog.set_level(logging.WARNING, logger="wok.balancer")
        s = settings(resolve_every_s=0.02)
        async with Balancer("dns:///svc:8001", settings=s, resolver=resolver) as bal:
            raising.append(RuntimeError)
            await lookups_made(4)
            raising[0] = KeyError
            await lookups_made(4)
            assert list(bal.replicas) == [a.target]  # kept meanwhile
            raising.clear()
            answers.append(b.target)
            await bal.wait_for(lambda: b.target in bal.replicas, 10, "b added")
            logged = [r.getMessage() for r in caplog.records if r.name == "wok.balancer"]
            assert len(logged) == 2, logged
            assert "RuntimeError" in logged[0] and "KeyError" in logged[1]
            assert all("svc:8001" in m for m in logged)


# -- the cap on ejections held as the name's addresses change ------------------------------------


async def test_a_lookup_that_leaves_only_ejected_replicas_readmits_them_down_to_the_cap(stub):
    """a fails twice, is ejected (60 s) and then answers; b's address leaves the name, and later its
    replacement c's comes. The cap (never the last one) was held only at each ejection: a stayed out,
    alone (a call while its channel reconnected, after a GOAWAY, found no replica to send to), and c,
    once READY, took every call for the rest of a's ejection. a is readmitted as b goes."""
    async with stub("a", fail_first=2, code=CODE.INTERNAL) as a, stub("b") as b, stub("c") as c:
        answers = [a.target, b.target]
        async with ejecting_headless(answers) as bal:
            call = bal.unary_unary(METHOD)
            ra = await ejected_by_calls(bal, call, a.target)
            answers[:] = [a.target]
            await bal.wait_for(lambda: list(bal.replicas) == [a.target], 10, "b gone")
            assert not ra.ejected and ra.readmit is None and ra.times_ejected == 1  # not forgiven
            assert await name_of(call) == "a" and bal.ejections == 1
            answers[:] = [a.target, c.target]
            await bal.wait_for(lambda: c.target in bal.replicas and bal.replica(c.target).state is STATE.READY, 10)
            # Two idle replicas, power of two choices: half each; all 40 to c is a chance of 1e-12.
            assert {await name_of(call) for _ in range(40)} == {"a", "c"}


async def test_the_replica_ejected_for_slowness_is_readmitted_first_when_the_cap_shrinks(stub, monkeypatch):
    """Of four replicas two may be ejected: b for failures, then a for slowness. Both are left alone
    in the name, and of two only one may be out: a comes back (a slow replica answers, a failing one
    fails every call), although b is due back first."""
    async with stub("a", hold=True) as a, stub("b", fail_first=1 << 30, code=CODE.INTERNAL) as b:
        async with stub("c") as c, stub("d") as d:
            answers = [a.target, b.target, c.target, d.target]

            async def resolver(host: str, port: int) -> list[str]:
                return list(answers)

            s = settings(
                hedge_after=0.2,
                max_attempts=2,
                consecutive_failures=2,
                base_ejection_s=60,
                max_ejection_s=60,
                resolve_every_s=0.05,
            )
            async with Balancer("dns:///wok-headless:8001", settings=s, resolver=resolver) as bal:
                call = bal.unary_unary(METHOD)
                ra, rb = bal.replica(a.target), bal.replica(b.target)
                a_first_on_ties(monkeypatch, b.target)
                while not rb.ejected:
                    await code_of(call)
                a_first_on_ties(monkeypatch, a.target)
                while not ra.ejected:  # a holds the calls; each is hedged to c or d, and answered there
                    assert await name_of(call) in ("c", "d")
                assert rb.readmit.when() < ra.readmit.when() and ra.ejected_slow and not rb.ejected_slow
                answers[:] = [a.target, b.target]
                await bal.wait_for(lambda: sorted(bal.replicas) == sorted(answers), 10, "c and d gone")
                assert not ra.ejected and rb.ejected and bal.ejections == 2
                a.release.set()
                assert [await name_of(call) for _ in range(5)] == ["a"] * 5


async def test_a_resolver_answering_no_address_is_named_at_start_and_keeps_the_replicas_after(stub, caplog):
    """A resolver of one's own answering a host name ("localhost:p"), not an address: the name's
    replicas were replaced by a channel to "ipv4:localhost:p", which failed every call (UNKNOWN,
    "the target uri is not valid"), and start() took it without a word. Now start() raises a
    ValueError naming the answer, and at a lookup again the name keeps its replicas, logged once."""
    async with stub("a") as a:
        named = f"localhost:{a.port}"
        answers: list = [named]
        lookups = 0
        looked = asyncio.Event()

        async def resolver(host: str, port: int) -> list:
            nonlocal lookups
            lookups += 1
            looked.set()
            return answers

        s = settings(resolve_every_s=0.02)
        first = Balancer("dns:///svc:8001", settings=s, resolver=resolver)
        try:
            with pytest.raises(ValueError, match=f"target 'svc:8001': the resolver answered '{named}'") as err:
                await first.start()
        finally:
            await first.stop()  # (its failed start stopped it; one that started must not be left running)
        assert "expected a list of addresses, 'ip:port' or '[ipv6]:port'" in str(err.value)
        caplog.set_level(logging.WARNING, logger="wok.balancer")
        answers = [a.target]
        async with Balancer("dns:///svc:8001", settings=s, resolver=resolver) as bal:
            for bad in ([named], None, ["10.0.0.1:70000"]):
                answers, until = bad, lookups + 3
                while lookups < until:
                    looked.clear()
                    await asyncio.wait_for(looked.wait(), 10)
                assert list(bal.replicas) == [a.target]
            assert await name_of(bal.unary_unary(METHOD)) == "a"
        logged = [r.getMessage() for r in caplog.records if r.name == "wok.balancer"]
        assert len(logged) == 1, logged  # one name, one kind of error: the three bad answers
        assert logged[0].startswith(f"target 'svc:8001': the resolver answered '{named}' (of ['{named}'])"), logged


# -- lookups again that fail in other ways; a lookup's time bound ---------------------------------


class Lookups:
    """A resolver answering what `answers` holds for each host (a test changes it), counting the
    lookups; a host in `hanging` gets no answer until the lookup is cancelled (`cancelled` counts
    those) or `unhang(host)` takes it out of `hanging`, one in `held` answers once its event is
    set, one in `raising` raises that; `answered` holds an event per host, set as it answers.
    `in_flight`: the hosts being looked up now.
    `made(n)` returns once n more lookups of `host` have been made, `at_once(hosts)` once all of
    them are being looked up together."""

    def __init__(self, answers: dict[str, list]) -> None:
        self.answers = answers
        self.hanging: set[str] = set()
        self.held: dict[str, asyncio.Event] = {}
        self.raising: dict[str, type[BaseException]] = {}
        self.count = dict.fromkeys(answers, 0)
        self.cancelled = 0
        self.answered: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)
        self.in_flight: set[str] = set()
        self._looked = asyncio.Event()
        self._unhung = asyncio.Event()

    async def __call__(self, host: str, port: int) -> list:
        self.count[host] += 1
        self.in_flight.add(host)
        self._looked.set()
        try:
            try:
                while host in self.hanging:
                    await self._unhung.wait()
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
            if host in self.held:
                await self.held[host].wait()
            if host in self.raising:
                raise self.raising[host](f"lookup {self.count[host]} of {host}")
            self.answered[host].set()
            return list(self.answers[host])
        finally:
            self.in_flight.discard(host)
            self._looked.set()

    def unhang(self, host: str) -> None:
        """`host`'s lookups hanging now answer."""
        self.hanging.discard(host)
        self._unhung.set()
        self._unhung = asyncio.Event()

    async def made(self, host: str, n: int) -> None:
        until = self.count[host] + n
        while self.count[host] < until:
            self._looked.clear()
            await asyncio.wait_for(self._looked.wait(), 10)

    async def at_once(self, hosts: set[str], timeout: float = 10) -> None:
        async def together() -> None:
            while not hosts <= self.in_flight:
                self._looked.clear()
                await self._looked.wait()

        await asyncio.wait_for(together(), timeout)


def balancer_log(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "wok.balancer"]


async def test_a_lookup_again_whose_channel_cannot_be_made_keeps_the_set_is_logged_once_and_goes_on(
    stub, caplog, monkeypatch
):
    """A channel gRPC cannot make for a new address (its constructor raising: nothing known makes
    it raise after start, where the same options and names were taken, so the fault is injected
    here) ended the lookups for good, silently: the name never changed again. Now that lookup
    changes nothing (b's channel, made before c's failed, is not added: a half-applied set), it is
    logged once (not at every period), and the next lookups try again: once c's channel can be
    made, the name's new addresses replace a. That ends the error (told at INFO): the same error
    for a later address, d's, is logged again (it was not, once per name and kind for good)."""
    from wok.clients import balancer as module

    made = module.open_channel
    refused: set[str] = set()
    refusals = 0

    def open_channel(grpc_module, target, credentials, options):
        nonlocal refusals
        if any(target.endswith(t) for t in refused):
            refusals += 1
            raise RuntimeError(f"no channel to {target} (refusal {refusals})")
        return made(grpc_module, target, credentials, options)

    monkeypatch.setattr(module, "open_channel", open_channel)
    caplog.set_level(logging.INFO, logger="wok.balancer")
    async with stub("a") as a, stub("b") as b, stub("c") as c, stub("d") as d:
        refused.add(c.target)
        lookups = Lookups({"svc": [a.target]})
        async with Balancer("dns:///svc:8001", settings=settings(resolve_every_s=0.02), resolver=lookups) as bal:
            lookups.answers["svc"] = [b.target, c.target]
            await lookups.made("svc", 4)
            assert refusals >= 3 and list(bal.replicas) == [a.target]  # nothing of that lookup applied
            refused.clear()
            await bal.wait_for(lambda: sorted(bal.replicas) == sorted([b.target, c.target]), 10, "b and c in, a out")
            assert {await name_of(bal.unary_unary(METHOD)) for _ in range(20)} <= {"b", "c"}
            await lookups.made("svc", SETTLED_AFTER)  # (the rounds before the last begun went through)
            refused.add(d.target)
            lookups.answers["svc"] = [b.target, c.target, d.target]
            await lookups.made("svc", 3)
            refused.clear()
            await bal.wait_for(lambda: d.target in bal.replicas, 10, "d in")
            await lookups.made("svc", SETTLED_AFTER)
    logged = balancer_log(caplog)
    assert [r.levelno for r in logged] == [logging.ERROR, logging.INFO] * 2, [r.getMessage() for r in logged]
    for record, refused_target in zip(logged[::2], (c.target, d.target)):
        assert record.exc_info is not None
        message = record.getMessage()
        expected = f"target 'svc:8001': no channel could be made to {refused_target}: RuntimeError: "
        assert message.startswith(expected), message
        kept = "; its replicas are kept and it is looked up again every 0.02 s"
        assert message.endswith(kept + " (this error is logged once, until it is over)"), message
    assert re.fullmatch(
        r"target 'svc:8001': the channels of its new addresses were made \(3 lookups in a row, after the error "
        r"logged before, which came back \d+ times since, untold: the next one is logged again\)",
        logged[1].getMessage(),
    ), logged[1].getMessage()


# "²" passes str.isdigit(), as an interface number would, and no interface is named so.
@pytest.mark.parametrize("scope", ["nosuch", "\N{SUPERSCRIPT TWO}"])
async def test_a_resolver_answering_a_scoped_address_of_no_interface_is_refused_as_no_address(stub, caplog, scope):
    """An IPv6 address whose scope names no interface of this host ("fe80::1%nosuch"): gRPC fails
    every call of its channel ("Invalid interface name ... the target uri is not valid"). Beside
    an IPv4 address its probe raised socket.gaierror, which ended the lookups for good, silently;
    alone it replaced the name's replicas. Now it is an answer of no address: named at start,
    logged once after it, the replicas kept."""
    async with stub("a") as a, stub("b") as b:
        scoped = f"[fe80::1%{scope}]:{a.port}"
        lookups = Lookups({"svc": [scoped]})
        first = Balancer("dns:///svc:8001", settings=settings(), resolver=lookups)
        try:
            with pytest.raises(ValueError, match=re.escape(f"the resolver answered '{scoped}'")) as err:
                await first.start()
        finally:
            await first.stop()
        assert str(err.value).endswith(f"(its scope '{scope}' names no network interface of this host)")
        caplog.set_level(logging.WARNING, logger="wok.balancer")
        lookups.answers["svc"] = [a.target]
        async with Balancer("dns:///svc:8001", settings=settings(resolve_every_s=0.02), resolver=lookups) as bal:
            for bad in ([a.target, scoped], [scoped]):
                lookups.answers["svc"] = bad
                await lookups.made("svc", 3)
                assert list(bal.replicas) == [a.target]
            lookups.answers["svc"] = [a.target, b.target]
            await bal.wait_for(lambda: b.target in bal.replicas, 10, "b added")
    logged = [r.getMessage() for r in balancer_log(caplog)]
    assert len(logged) == 1 and "names no network interface" in logged[0], logged


async def test_a_lookup_that_never_answers_is_bounded_and_the_other_names_follow_theirs(stub, caplog):
    """A resolver that never answers stalled the lookups for good: at start, start() waited forever;
    after it, every name's lookups, so the other name's new addresses never came. Each lookup is
    now bounded by resolve_timeout_s (checked at construction): at start past it a ValueError names
    the target; after it the lookup is left running (as a thread's would be: see the next test but
    one), logged once, its name keeps its replicas and the other name follows its own."""
    for bad in (0, -1, float("nan"), float("inf"), "1", None, True):
        with pytest.raises(ValueError, match=r"^resolve_timeout_s: expected a finite duration > 0 in seconds; got "):
            BalancerSettings(resolve_timeout_s=bad)
    async with stub("a") as a, stub("b") as b, stub("c") as c:
        lookups = Lookups({"svc-a": [a.target], "svc-b": [b.target]})
        s = settings(resolve_every_s=0.02, resolve_timeout_s=0.2)
        lookups.hanging.add("svc-a")
        first = Balancer("dns:///svc-a:8001,dns:///svc-b:8001", settings=s, resolver=lookups)
        try:
            with pytest.raises(ValueError) as err:
                await first.start()
        finally:
            await first.stop()
        expected = "target 'svc-a:8001': cannot resolve 'svc-a': the resolver gave no answer within 0.2 s"
        assert str(err.value) == expected + " (resolve_timeout_s)" and lookups.cancelled == 1
        lookups.hanging.clear()
        caplog.set_level(logging.WARNING, logger="wok.balancer")
        async with Balancer("dns:///svc-a:8001,dns:///svc-b:8001", settings=s, resolver=lookups) as bal:
            lookups.hanging.add("svc-a")
            lookups.answers["svc-b"] = [b.target, c.target]
            await bal.wait_for(lambda: c.target in bal.replicas, 10, "c added")
            await lookups.made("svc-b", 3)  # two lookups again, at least, waited out svc-a's
            assert sorted(bal.replicas) == sorted([a.target, b.target, c.target])
            assert lookups.count["svc-a"] == 3 and lookups.cancelled == 1  # (two at start, one after it)
        assert lookups.cancelled == 2 and lookups.in_flight == set()  # (stop() cancelled it)
    logged = balancer_log(caplog)
    assert len(logged) == 1 and logged[0].levelno == logging.WARNING, [r.getMessage() for r in logged]
    timed_out = "target 'svc-a:8001': the resolver gave no answer within 0.2 s (resolve_timeout_s)"
    assert logged[0].getMessage().startswith(timed_out + "; its replicas are kept"), logged[0].getMessage()


# -- the cap at 0; readmissions by the cap counted; messages ---------------------------------------


async def test_max_ejected_fraction_0_ejects_none_and_any_fraction_above_ejects_one(stub, monkeypatch):
    """The cap was at least one whatever the fraction: 0 let one replica be ejected all the same.
    Now 0 means none (each ejection due is counted as refused), and a fraction above 0 that rounds
    down to none of two (0.1) still allows one, as gRPC's outlier detection does."""
    async with stub("a", fail_first=1 << 30, code=CODE.INTERNAL) as a, stub("b") as b:
        for fraction, ejected in ((0, 0), (0.1, 1)):
            s = settings(consecutive_failures=2, base_ejection_s=60, max_ejection_s=60, max_ejected_fraction=fraction)
            async with Balancer([a.target, b.target], settings=s) as bal:
                await bal.wait_for(lambda: all(r.state is STATE.READY for r in bal.replicas.values()), 10, "all READY")
                a_first_on_ties(monkeypatch, a.target)  # (idle replicas: every call goes to a while it is in)
                call = bal.unary_unary(METHOD)
                for _ in range(4):
                    await code_of(call)
                assert (bal.ejections, bal.replica(a.target).ejected) == (ejected, bool(ejected)), fraction
                assert bal.ejections_refused == (3 if fraction == 0 else 0), fraction


async def test_readmissions_by_the_cap_are_counted_in_stats_and_merged(stub):
    """a fails twice and is ejected; b's address leaves the name, and of one replica none may be out:
    a is readmitted at once. stats() counted that nowhere (a readmission by a swap is counted);
    now `readmitted_by_cap`, in all and per replica, added up by merge_stats (0, or absent per
    replica, in counters written before it)."""
    async with stub("a", fail_first=2, code=CODE.INTERNAL) as a, stub("b") as b:
        answers = [a.target, b.target]
        async with ejecting_headless(answers) as bal:
            call = bal.unary_unary(METHOD)
            await ejected_by_calls(bal, call, a.target)
            answers[:] = [a.target]
            await bal.wait_for(lambda: list(bal.replicas) == [a.target], 10, "b gone")
            stats = bal.stats()
    assert stats["readmitted_by_cap"] == 1 and stats["swaps"] == 0
    assert by_address(stats)[a.target]["readmitted_by_cap"] == 1
    merged = merge_stats([stats, stats])
    assert merged["readmitted_by_cap"] == 2 and by_address(merged)[a.target]["readmitted_by_cap"] == 2
    old = {k: v for k, v in stats.items() if k != "readmitted_by_cap"}
    old["replicas"] = [{k: v for k, v in r.items() if k != "readmitted_by_cap"} for r in stats["replicas"]]
    assert merge_stats([old])["readmitted_by_cap"] == 0 and "readmitted_by_cap" not in merge_stats([old])["replicas"][0]


async def test_settings_and_answers_are_refused_naming_the_value_as_names_are():
    """Each setting's refusal names it, what it takes and the value (as a name is shown: quoted,
    escaped, cut); one message named three settings and no value. A target or a resolver's answer
    is shown the same way, and an answer of many addresses is cut: 10,000 made a 200 KB message."""
    refusals = {
        "resolve_every_s": (0, "resolve_every_s: expected a duration > 0 in seconds; got 0"),
        "base_ejection_s": (-1.0, "base_ejection_s: expected a finite duration > 0 in seconds; got -1.0"),
        "consecutive_failures": ("5", "consecutive_failures: expected a whole number >= 0 (0: no ejection); got '5'"),
        "max_attempts": (1.5, "max_attempts: expected a whole number >= 1; got 1.5"),
        "max_ejected_fraction": (
            "half",
            "max_ejected_fraction: expected a number in [0, 1] (0: no ejection); got 'half'",
        ),
        "hedge_quantile": (1, "hedge_quantile: expected a number in (0, 1); got 1"),
        "hedge_after": (
            "x\n" * 200,
            "hedge_after: expected a finite duration > 0 in seconds, 'auto' or None; got 'x\\nx\\n",
        ),
    }
    for name, (value, message) in refusals.items():
        with pytest.raises(ValueError) as err:
            BalancerSettings(**{name: value})
        assert str(err.value).startswith(message) and "\n" not in str(err.value), str(err.value)
    assert len(str(err.value)) < 500  # (400 characters given, 200 shown)
    with pytest.raises(ValueError, match=re.escape(r"target 'a\nb': the wok balancer needs host:port")):
        split_targets("a\nb")

    many = [f"10.0.{i // 250}.{i % 250}:1" for i in range(10_000)] + ["box:1"]
    bal = Balancer("dns:///svc:8001", resolver=answering(many))
    try:
        with pytest.raises(ValueError) as err:
            await bal.start()
    finally:
        await bal.stop()
    message = str(err.value)
    assert (
        message.startswith("target 'svc:8001': the resolver answered 'box:1' (of ['10.0.0.0:1', ")
        and len(message) < 600
    )
    assert re.search(r"… \([\d,]+ characters in all\)\)", message), message[-120:]
    assert message.endswith("; expected a list of addresses, 'ip:port' or '[ipv6]:port'")


def test_every_setting_is_checked_at_construction_naming_it_what_it_takes_and_the_value():
    """hedge_floor_s, hedge_initial_s, budget_tokens, budget_ratio, max_ejection_s, backoff_s and
    max_backoff_s were taken unchecked: NaN, a negative, infinity or a string failed at a call, or
    never failed (budget_tokens=inf refused every retry: inf is not > inf / 2; hedge_after=inf never
    hedged, what None says). A cap below what it caps (max_ejection_s < base_ejection_s, max_backoff_s
    < backoff_s) made every ejection or backoff the cap's length, the other setting given for nothing.
    The counts take ints only, as a wok config's do: 2.0 is a slip."""
    duration = ": expected a finite duration > 0 in seconds; got "
    refusals = [
        ("hedge_floor_s", math.nan, "hedge_floor_s: expected a finite duration >= 0 in seconds; got nan"),
        ("hedge_floor_s", -0.01, "hedge_floor_s: expected a finite duration >= 0 in seconds; got -0.01"),
        ("hedge_initial_s", 0, "hedge_initial_s" + duration + "0"),
        ("hedge_initial_s", "0.1", "hedge_initial_s" + duration + "'0.1'"),
        ("hedge_after", math.inf, "hedge_after: expected a finite duration > 0 in seconds, 'auto' or None; got inf"),
        ("budget_tokens", math.inf, "budget_tokens: expected a finite number > 0 (tokens); got inf"),
        ("budget_tokens", 0, "budget_tokens: expected a finite number > 0 (tokens); got 0"),
        (
            "budget_ratio",
            math.nan,
            "budget_ratio: expected a finite number > 0 (tokens given back per OK call); got nan",
        ),
        ("budget_ratio", -0.1, "budget_ratio: expected a finite number > 0 (tokens given back per OK call); got -0.1"),
        ("base_ejection_s", math.inf, "base_ejection_s" + duration + "inf"),
        ("max_ejection_s", math.inf, "max_ejection_s" + duration + "inf"),
        ("max_ejection_s", True, "max_ejection_s" + duration + "True"),
        ("max_ejection_s", 1, "max_ejection_s: expected a duration >= base_ejection_s (2 s), as it caps it; got 1 s"),
        ("backoff_s", -0.05, "backoff_s" + duration + "-0.05"),
        ("backoff_s", 2, "max_backoff_s: expected a duration >= backoff_s (2 s), as it caps it; got 1 s"),
        ("max_backoff_s", math.nan, "max_backoff_s" + duration + "nan"),
        ("max_backoff_s", None, "max_backoff_s" + duration + "None"),
        ("max_attempts", 2.0, "max_attempts: expected a whole number >= 1; got 2.0"),
        ("consecutive_failures", 5.0, "consecutive_failures: expected a whole number >= 0 (0: no ejection); got 5.0"),
    ]
    for name, value, message in refusals:
        with pytest.raises(ValueError) as err:
            BalancerSettings(**{name: value})
        assert str(err.value) == message, (name, value, str(err.value))
    # What they take: a floor of 0 (none), caps equal to what they cap, numpy's numbers.
    s = BalancerSettings(hedge_floor_s=0, base_ejection_s=30, backoff_s=1.0, budget_tokens=np.float64(10))
    assert (s.max_ejection_s, s.max_backoff_s, s.budget_tokens) == (30, 1.0, 10)


def test_the_auto_hedge_delay_is_never_below_its_floor_from_the_first_call():
    """hedge_initial_s below hedge_floor_s was the auto delay until 64 answers came: the floor, set
    to keep a fast fleet from hedging on jitter, held only after them."""
    assert Balancer("127.0.0.1:1", settings=BalancerSettings(hedge_floor_s=0.3)).hedge_after_s == 0.3
    assert Balancer("127.0.0.1:1").hedge_after_s == 0.1


# -- names looked up at once; an error logged again once it was over; the guards' triggers --------


async def test_the_names_are_looked_up_at_once_and_taken_in_the_targets_order(stub):
    """The names were looked up one after another: at start, svc-a's lookup, hanging, was waited out
    before svc-b's began (N names that hang cost N × resolve_timeout_s). Now each name's lookup is a
    task of its own, all at once, and the answers are still taken in the targets' order: start()
    raises for svc-a, the first that fails (svc-b failed before it), and an address both names
    answer is svc-a's (its replica's target), although svc-b answered first."""
    async with stub("a") as a:
        lookups = Lookups({"svc-a": [a.target], "svc-b": [a.target], "svc-c": [a.target]})
        lookups.hanging.add("svc-a")
        lookups.raising["svc-b"] = socket.gaierror
        targets = "dns:///svc-a:8001,dns:///svc-b:8001,dns:///svc-c:8001"
        first = Balancer(targets, settings=settings(resolve_timeout_s=0.3), resolver=lookups)
        try:
            with pytest.raises(ValueError) as err:
                await first.start()
        finally:
            await first.stop()
        assert str(err.value).startswith("target 'svc-a:8001': cannot resolve 'svc-a': the resolver gave no answer")
        # svc-b and svc-c were looked up while svc-a's lookup hung (all three, not svc-a's alone).
        assert lookups.count == {"svc-a": 1, "svc-b": 1, "svc-c": 1}, lookups.count
        assert lookups.cancelled == 1 and lookups.in_flight == set()

        # svc-a answers only once svc-b has: looked up one after another, svc-a waited for svc-b's
        # lookup, which had not begun (the 10 s bound is room for a loaded host, not a measure).
        lookups.hanging.clear()
        lookups.raising.clear()
        lookups.answered.clear()
        lookups.held["svc-a"] = lookups.answered["svc-b"]
        s = settings(resolve_timeout_s=10)
        async with Balancer("dns:///svc-a:8001,dns:///svc-b:8001", settings=s, resolver=lookups) as bal:
            assert [(r["address"], r["target"]) for r in bal.stats()["replicas"]] == [(a.target, "svc-a:8001")]


async def test_names_that_hang_cost_one_timeout_are_logged_in_order_and_stop_cancels_their_lookups(stub, caplog):
    """After start, two names whose resolver hangs: looked up one after another, each lookup again
    waited out svc-a's resolve_timeout_s, then svc-b's, before svc-c's (its new address waited
    both). Now they are looked up at once, each bounded on its own; each is logged once, in the
    targets' order; svc-c's change applies; and stop() cancels both lookups in flight."""
    async with stub("a") as a, stub("b") as b, stub("c") as c, stub("d") as d:
        lookups = Lookups({"svc-a": [a.target], "svc-b": [b.target], "svc-c": [c.target]})
        targets = "dns:///svc-a:8001,dns:///svc-b:8001,dns:///svc-c:8001"
        caplog.set_level(logging.WARNING, logger="wok.balancer")
        s = settings(resolve_every_s=0.02, resolve_timeout_s=0.3)
        async with Balancer(targets, settings=s, resolver=lookups) as bal:
            lookups.hanging |= {"svc-a", "svc-b"}
            lookups.answers["svc-c"] = [c.target, d.target]
            await lookups.at_once({"svc-a", "svc-b"})
            await bal.wait_for(lambda: d.target in bal.replicas, 10, "d added")
            await lookups.made("svc-c", 3)
            assert sorted(bal.replicas) == sorted([a.target, b.target, c.target, d.target])
        messages = [r.getMessage() for r in balancer_log(caplog)]
        assert len(messages) == 2, messages
        for message, name in zip(messages, ("svc-a", "svc-b")):
            assert message.startswith(f"target '{name}:8001': the resolver gave no answer within 0.3 s"), message

        # A bound past the test's length: the lookups end only by stop()'s cancellation.
        caplog.clear()
        lookups.hanging.clear()
        s = settings(resolve_every_s=0.02, resolve_timeout_s=3600)
        bal = Balancer(targets, settings=s, resolver=lookups)
        async with bal:
            cancelled = lookups.cancelled
            lookups.hanging |= {"svc-a", "svc-b"}
            await lookups.at_once({"svc-a", "svc-b"})
        assert lookups.cancelled == cancelled + 2 and lookups.in_flight == set()
        assert bal._resolver_task.done() and balancer_log(caplog) == []


async def test_a_name_that_times_out_again_after_answering_is_logged_again(stub, caplog):
    """Errors were logged once per name and kind for the process's life: a name that timed out,
    answered, and timed out again went untold the second time, and an operator saw one outage
    where there were two. Now lookups that give the name addresses, three in a row, end its error
    (told at INFO, so that the warning's end is in the log too, with how often it came back
    untold), and its next timeout is logged again; while it keeps timing out, once. (`tick`, looked
    up at every lookup again, counts them: svc's lookup, hanging, is not made again.)"""
    async with stub("a") as a:
        lookups = Lookups({"svc": [a.target], "tick": [a.target]})
        caplog.set_level(logging.INFO, logger="wok.balancer")
        s = settings(resolve_every_s=0.02, resolve_timeout_s=0.2)
        async with Balancer("dns:///svc:8001,dns:///tick:8001", settings=s, resolver=lookups) as bal:
            for _ in range(2):
                lookups.hanging.add("svc")
                await lookups.made("tick", 3)  # two lookups timed out, at least
                lookups.unhang("svc")
                await lookups.made("svc", SETTLED_AFTER)  # the hung one's answer and two more taken
                assert list(bal.replicas) == [a.target]
    logged = balancer_log(caplog)
    assert [r.levelno for r in logged] == [logging.WARNING, logging.INFO] * 2, [r.getMessage() for r in logged]
    timed_out = "target 'svc:8001': the resolver gave no answer within 0.2 s (resolve_timeout_s); its replicas are kept"
    assert logged[0].getMessage().startswith(timed_out) and logged[2].getMessage() == logged[0].getMessage()
    answers = re.escape(f"target 'svc:8001': its lookup answers again, ['{a.target}'] ")
    assert re.fullmatch(
        answers + r"\(3 lookups in a row, after the error logged before, which came back \d+ times? since, untold: "
        r"the next one is logged again\)",
        logged[1].getMessage(),
    ), logged[1].getMessage()


class Flapping(Lookups):
    """Lookups whose every other lookup of a host raises RuntimeError (the 2nd, the 4th...) while
    `flapping`: the first, start()'s, answers."""

    flapping = True

    async def __call__(self, host: str, port: int) -> list:
        if self.flapping and self.count[host] % 2:
            self.raising[host] = RuntimeError
        else:
            self.raising.pop(host, None)
        return await super().__call__(host, port)


async def test_a_name_whose_lookups_fail_every_other_time_is_logged_once_until_they_work_three_in_a_row(stub, caplog):
    """A lookup that went through ended the name's error: one whose lookups failed and worked in turn
    was logged at every other lookup, an ERROR with its traceback and an INFO each time, for as long
    as it flapped (every 30 s by default). Now its error is over only once its lookups went through
    SETTLED_AFTER times in a row: flapping, it is logged once; steady again, its end is told once,
    with how often it came back untold."""
    async with stub("a") as a:
        lookups = Flapping({"svc": [a.target]})
        caplog.set_level(logging.INFO, logger="wok.balancer")
        async with Balancer("dns:///svc:8001", settings=settings(resolve_every_s=0.01), resolver=lookups) as bal:
            await lookups.made("svc", 10)  # five failed, the 2nd to the 10th, each after one that went through
            levels = [r.levelno for r in balancer_log(caplog)]
            lookups.flapping = False
            await lookups.made("svc", SETTLED_AFTER + 1)  # (the one in flight may have failed)
            assert list(bal.replicas) == [a.target]
    assert levels == [logging.ERROR], [r.getMessage() for r in balancer_log(caplog)]
    logged = balancer_log(caplog)
    assert [r.levelno for r in logged] == [logging.ERROR, logging.INFO], [r.getMessage() for r in logged]
    assert logged[0].getMessage().startswith("target 'svc:8001': the resolver raised RuntimeError: lookup 2 of svc;")
    over = re.fullmatch(
        re.escape(f"target 'svc:8001': its lookup answers again, ['{a.target}'] ")
        + r"\(3 lookups in a row, after the error logged before, which came back (\d+) times since, untold: "
        r"the next one is logged again\)",
        logged[1].getMessage(),
    )
    assert over is not None and int(over.group(1)) >= 4, logged[1].getMessage()


async def test_a_name_whose_lookup_hangs_in_a_thread_is_not_looked_up_again_while_it_runs(stub):
    """The system resolver's getaddrinfo runs in a thread of the loop's default executor, which a
    cancellation does not stop: each lookup again past resolve_timeout_s was cancelled and the next
    started one more thread, the others still hanging, until the executor was full (6 threads on 2
    cores; here 6 lookups in 0.3 s) and every `asyncio.to_thread` of the process waited behind them.
    Now the lookup is left running and each lookup again waits for it (up to resolve_timeout_s)
    instead of starting another: one thread, whatever the rounds; its late answer is taken; and
    stop() cancels it. (`tick`, looked up at every lookup again, counts them.)"""
    release = threading.Event()
    lock = threading.Lock()
    running = most = 0

    def getaddrinfo() -> None:  # as the system's, until it gives up
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        release.wait(30)
        with lock:
            running -= 1

    async with stub("a") as a, stub("b") as b:
        lookups = Lookups({"svc": [a.target], "tick": [a.target]})
        hanging = False

        async def resolver(host: str, port: int) -> list:
            if host == "svc" and hanging:
                await asyncio.get_running_loop().run_in_executor(None, getaddrinfo)
                return [b.target]
            return await lookups(host, port)

        s = settings(resolve_every_s=0.01, resolve_timeout_s=0.03)
        try:
            async with Balancer("dns:///svc:8001,dns:///tick:8001", settings=s, resolver=resolver) as bal:
                hanging = True
                await lookups.made("tick", 12)  # ten lookups again timed out on svc's, at least
                assert (most, running) == (1, 1) and list(bal.replicas) == [a.target]
                release.set()  # the system gave up waiting for a name server: the lookup answers
                await bal.wait_for(lambda: b.target in bal.replicas, 10, "svc's late answer taken")
                hanging = False
                release.clear()
                lookups.answers["svc"] = [b.target]
                await lookups.made("svc", 1)  # looked up anew once that one answered
                hanging = True
                await lookups.made("tick", 2)
                assert running == 1
            assert most == 1
        finally:
            release.set()


async def test_a_resolvers_own_cancellation_is_its_error_not_the_end_of_the_lookups(stub, caplog):
    """A resolver of one's own raising CancelledError itself (a lookup it shares with other callers,
    cancelled by one of them) passed every guard, being no Exception: the lookups again ended for
    good, silently, and start() raised a CancelledError, a cancellation its caller never asked for.
    Now it is the resolver's error as any other: raised at start (naming the target), logged once
    after it, the name keeping its replicas until its resolver answers again."""
    async with stub("a") as a, stub("b") as b:
        lookups = Lookups({"svc": [a.target]})
        lookups.raising["svc"] = asyncio.CancelledError
        first = Balancer("dns:///svc:8001", settings=settings(), resolver=lookups)
        try:
            with pytest.raises(RuntimeError) as err:
                await first.start()
        finally:
            await first.stop()
        cancelled = "target 'svc:8001': the resolver's lookup of 'svc' ended cancelled, not by the balancer"
        assert str(err.value).startswith(cancelled), str(err.value)
        lookups.raising.clear()
        caplog.set_level(logging.WARNING, logger="wok.balancer")
        async with Balancer("dns:///svc:8001", settings=settings(resolve_every_s=0.02), resolver=lookups) as bal:
            lookups.raising["svc"] = asyncio.CancelledError
            await lookups.made("svc", 3)
            assert list(bal.replicas) == [a.target] and not bal._resolver_task.done()
            lookups.raising.clear()
            lookups.answers["svc"] = [b.target]
            await bal.wait_for(lambda: list(bal.replicas) == [b.target], 10, "b in, a out")
    logged = balancer_log(caplog)
    assert len(logged) == 1 and logged[0].levelno == logging.ERROR, [r.getMessage() for r in logged]
    assert logged[0].getMessage().startswith(cancelled + " (the resolver's own CancelledError); its replicas are kept")


# A real trigger of the guard around a name's choice of family: a name answering both families
# (its server listens on IPv4 only) looked up again while the process has no file descriptor left.
# RLIMIT_NOFILE is lowered in a child process (its descriptors would run out under pytest's too), and
# the resolver takes every free one before it answers, giving them back at its next lookup.
OUT_OF_DESCRIPTORS = textwrap.dedent(
    """
    import asyncio, errno, json, logging, os, resource, sys
    from wok.clients.balancer import Balancer, BalancerSettings

    first, second = sys.argv[1], sys.argv[2]
    both = [first, "[::1]:" + first.rpartition(":")[2]]
    records = []
    handler = logging.Handler()
    handler.emit = records.append  # (kept, not formatted: formatting may need a descriptor)
    logging.getLogger("wok.balancer").addHandler(handler)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, soft), hard))
    taken, lookups = [], 0

    def failed():
        return any("choosing the family" in r.getMessage() for r in records)

    async def resolver(host, port):
        global lookups
        while taken:
            os.close(taken.pop())
        lookups += 1
        if lookups > 1 and failed():
            return [second]
        while lookups > 1:  # (a descriptor that gRPC frees meanwhile lets the probe run: again, next time)
            try:
                taken.append(os.open(os.devnull, os.O_RDONLY))
            except OSError as exc:
                if exc.errno != errno.EMFILE:
                    raise
                break
        return list(both)

    async def main():
        s = BalancerSettings(hedge_after=None, resolve_every_s=0.02)
        async with Balancer("dns:///svc:8001", settings=s, resolver=resolver) as bal:
            at_start = list(bal.replicas)
            await bal.wait_for(lambda: list(bal.replicas) == [second], 30, "the second server's address")
        logged = [(r.levelno, r.getMessage(), r.exc_info is not None) for r in records]
        print(json.dumps({"at_start": at_start, "lookups": lookups, "logged": logged}))

    asyncio.run(main())
    """
)


async def test_the_family_probe_out_of_file_descriptors_is_logged_once_and_the_lookups_go_on(stub):
    """A real trigger (no fault injected): out of file descriptors, the probe of a name's two
    families cannot make its selector (OSError EMFILE), which ended the lookups for good, silently,
    before its guard. It is logged once with its traceback, the name keeps its replica, and once
    descriptors are free again the name's next change applies."""
    async with stub("a") as a, stub("b") as b:
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            OUT_OF_DESCRIPTORS,
            a.target,
            b.target,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            out, err = await asyncio.wait_for(child.communicate(), 60)
        finally:
            if child.returncode is None:
                child.kill()
                await child.wait()
    assert child.returncode == 0, err.decode(errors="replace")[-3000:]
    result = json.loads(out)
    assert result["at_start"] == [a.target] and result["lookups"] >= 3, result
    assert len(result["logged"]) == 1, result["logged"]
    level, message, traceback = result["logged"][0]
    both = f"['{a.target}', '[::1]:{a.port}']"
    expected = f"target 'svc:8001': choosing the family of {both} failed: OSError: [Errno {errno.EMFILE}] "
    assert level == logging.ERROR and traceback and message.startswith(expected), message
    assert "; its replicas are kept and it is looked up again every 0.02 s" in message


async def test_an_error_of_a_lookup_again_as_a_whole_is_logged_once_until_over_and_the_lookups_go_on(
    stub, caplog, monkeypatch
):
    """The last guard of the lookups again: nothing known reaches it (the errors of a name's lookup,
    its answer, its family's choice and its channels are each caught as the name's own, and a
    resolver's own CancelledError is its error now), so the fault is injected at the narrowest seam,
    the balancer's `_within_cap`, which every lookup again runs once it has applied the set. It is
    logged once with its traceback while it lasts, the lookups go on, three lookups again in a row
    that go through end it (told at INFO) and the next one is logged again."""
    async with stub("a") as a, stub("b") as b:
        lookups = Lookups({"svc": [a.target]})
        caplog.set_level(logging.INFO, logger="wok.balancer")
        async with Balancer("dns:///svc:8001", settings=settings(resolve_every_s=0.02), resolver=lookups) as bal:
            within_cap = bal._within_cap
            failing = {"on": False}

            def raising() -> None:
                if failing["on"]:
                    raise RuntimeError("the cap could not be held")
                within_cap()

            monkeypatch.setattr(bal, "_within_cap", raising)
            for _ in range(2):
                failing["on"] = True
                await lookups.made("svc", 3)
                failing["on"] = False
                await lookups.made("svc", SETTLED_AFTER + 1)  # (the round in flight may have failed)
            lookups.answers["svc"] = [b.target]
            await bal.wait_for(lambda: list(bal.replicas) == [b.target], 10, "b in, a out")
    logged = balancer_log(caplog)
    assert [r.levelno for r in logged] == [logging.ERROR, logging.INFO] * 2, [r.getMessage() for r in logged]
    failed = "targets 'svc:8001': a lookup again failed: RuntimeError: the cap could not be held; the replicas are kept"
    assert logged[0].getMessage().startswith(failed) and logged[0].exc_info is not None, logged[0].getMessage()
    assert logged[2].getMessage() == logged[0].getMessage()
    went = r"targets 'svc:8001': a lookup again went through \(3 lookups in a row, after the error logged before"
    assert re.fullmatch(
        went + r"(, which came back \d+ times? since, untold)?: the next one is logged again\)",
        logged[1].getMessage(),
    )


async def test_stop_while_start_looks_up_ends_start_and_makes_no_channel():
    """stop() from another task while start() looked the names up found nothing to close and
    returned; start() then made the channels and the resolver's task, never closed."""
    looking, go, cancelled = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def resolver(host: str, port: int) -> list[str]:
        looking.set()
        try:
            await go.wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return ["127.0.0.1:1"]

    bal = Balancer("dns:///svc:8001", settings=settings(), resolver=resolver)
    start = asyncio.create_task(bal.start())
    try:
        await looking.wait()
        await bal.stop()
        stopped_lookup = cancelled.is_set()
        go.set()
        with pytest.raises(RuntimeError, match=r"^targets 'svc:8001': stop\(\) was called while start\(\) looked"):
            await start
        assert bal.replicas == {}
        assert stopped_lookup  # stop() ended the lookup, not left it running past its return
    finally:  # (what the unfixed start() made)
        if bal._resolver_task is not None:
            bal._resolver_task.cancel()
        for r in bal.replicas.values():
            await r.channel.close()


class Stubborn:
    """A resolver that swallows its cancellation: it catches CancelledError and waits on, until `release`
    is set. Answers `answer` at once while `hang` is false."""

    def __init__(self, answer: list[str], hang: bool = True) -> None:
        self.answer, self.hang = answer, hang
        self.looking, self.cancelled, self.release, self.ended = (asyncio.Event() for _ in range(4))

    async def __call__(self, host: str, port: int) -> list[str]:
        if not self.hang:
            return list(self.answer)
        self.looking.set()
        try:
            while not self.release.is_set():
                try:
                    await self.release.wait()
                except asyncio.CancelledError:
                    self.cancelled.set()
            return list(self.answer)
        finally:
            self.ended.set()


class Told(logging.Handler):
    """`event` is set once wok.balancer logs a message starting with `start`."""

    def __init__(self, start: str) -> None:
        super().__init__()
        self.start, self.event = start, asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith(self.start):
            self.event.set()


STUCK = (
    "target 'svc:8001': the resolver's lookup of 'svc' did not end within 0.05 s of its cancellation (a resolver "
    "that catches CancelledError and goes on); it is left running"
)


async def stops_alone(bal: Balancer, resolver: Stubborn) -> bool:
    """Whether bal.stop() returns while the resolver still hangs (10 s: room for a loaded host). If not,
    the resolver is released so that the test ends: a timeout's cancellation it would swallow too."""
    stopping = asyncio.create_task(bal.stop())
    done, _ = await asyncio.wait([stopping], timeout=10)
    if not done:
        resolver.release.set()
        await stopping
    return bool(done)


async def _release(resolver: Stubborn, bal: Balancer) -> None:
    """Let the stuck lookup end; its answer is read, and the balancer lets it go."""
    stuck = list(bal._stuck)
    resolver.release.set()
    await asyncio.wait_for(resolver.ended.wait(), 10)
    if stuck:
        await asyncio.wait(stuck)
    assert bal._stuck == set()


async def test_stop_gives_up_on_a_resolver_that_swallows_its_cancellation_as_start_looks_up(monkeypatch, caplog):
    """A lookup cancelled (stop() as start() looked the names up) was waited for without bound: a resolver
    that catches CancelledError and awaits on hung stop(), and start(), for good. Now after CANCEL_GRACE_S
    it is left running, logged."""
    monkeypatch.setattr(balancer, "CANCEL_GRACE_S", 0.05)
    caplog.set_level(logging.WARNING, logger="wok.balancer")
    resolver = Stubborn(["127.0.0.1:1"])
    bal = Balancer("dns:///svc:8001", settings=settings(), resolver=resolver)
    start = asyncio.create_task(bal.start())
    try:
        await resolver.looking.wait()
        assert await stops_alone(bal, resolver)
        with pytest.raises(RuntimeError, match=r"^targets 'svc:8001': stop\(\) was called while start\(\) looked"):
            await start
        assert resolver.cancelled.is_set() and not resolver.ended.is_set()
        assert [r.getMessage() for r in balancer_log(caplog)] == [STUCK]
        assert bal.replicas == {}
    finally:
        await _release(resolver, bal)
        start.cancel()


async def test_stop_gives_up_on_a_lookup_left_running_that_swallows_its_cancellation(monkeypatch, caplog):
    """A name's lookup past resolve_timeout_s is left running between lookups, and stop() cancels it:
    it waited for it without bound, and a resolver that swallows its cancellation hung stop() for good."""
    monkeypatch.setattr(balancer, "CANCEL_GRACE_S", 0.05)
    caplog.set_level(logging.WARNING, logger="wok.balancer")
    told = Told("target 'svc:8001': the resolver gave no answer within 0.05 s")
    logging.getLogger("wok.balancer").addHandler(told)
    resolver = Stubborn(["127.0.0.1:1"], hang=False)
    # A lookup again every 0.2 s: stop() comes as the lookup that timed out sleeps until the next.
    bal = Balancer("dns:///svc:8001", settings=settings(resolve_every_s=0.2, resolve_timeout_s=0.05), resolver=resolver)
    try:
        await bal.start()
        resolver.hang = True
        await asyncio.wait_for(told.event.wait(), 10)
        assert list(bal._lookups) == ["svc:8001"]  # left running
        assert await stops_alone(bal, resolver)
        assert resolver.cancelled.is_set() and not resolver.ended.is_set()
        assert [r.getMessage() for r in balancer_log(caplog)][1:] == [STUCK]
        assert bal._resolver_task.done()
    finally:
        logging.getLogger("wok.balancer").removeHandler(told)
        await _release(resolver, bal)
        await bal.stop()


async def test_start_after_stop_raises_and_makes_no_channel():
    bal = Balancer("127.0.0.1:1", settings=settings())
    await bal.stop()
    try:
        with pytest.raises(RuntimeError, match=r"^targets '127.0.0.1:1': this Balancer was stopped before it started$"):
            await bal.start()
        assert bal.replicas == {}
    finally:
        for r in bal.replicas.values():
            await r.channel.close()


async def test_a_retry_in_its_backoff_keeps_its_replicas_channel_open_when_the_name_drops_it(stub, monkeypatch):
    """One replica, its first answer UNAVAILABLE: the retry goes back to it after a backoff, and the
    name's next lookup drops its address meanwhile. The attempt in its backoff was not counted as the
    replica's call, so the channel was closed at once, "as idle", and the retry woke to a closed
    channel: UNAVAILABLE "Channel is closed", the call's answer with max_attempts=2, with its replica
    still serving. The channel is closed once the retry is done, as once an attempt in flight is."""
    monkeypatch.setattr(random, "uniform", lambda low, high: high)  # the backoff: its longest, 1 s
    async with stub("a", fail_first=1) as a, stub("b") as b:
        answers = [a.target]
        s = settings(max_attempts=2, backoff_s=1.0, max_backoff_s=1.0, resolve_every_s=0.05, **NO_EJECTION)
        async with Balancer("dns:///wok-headless:8001", settings=s, resolver=answering(answers)) as bal:
            call = asyncio.ensure_future(name_of(bal.unary_unary(METHOD)))
            await bal.wait_for(lambda: bal.tokens == s.budget_tokens - 1, 10, "the retry launched")
            answers[:] = [b.target]
            await bal.wait_for(lambda: b.target in bal.replicas, 10, "b resolved")
            assert not call.done() and a.calls == 1  # the retry sleeps in its backoff
            assert await call == "a" and a.calls == 2 and bal.retries == 1
            await bal.wait_for(lambda: list(bal.replicas) == [b.target], 10, "a closed once its retry was done")


async def test_calls_waiting_for_the_balancers_start_when_the_client_closes_get_infer_error(stub):
    """Calls of an AsyncClient(balancer="wok") whose balancer still looks its names up when the client
    is closed: close() cancels the start, and its cancellation reached each call that waited for it,
    a CancelledError out of infer() (its task ending cancelled, as if the caller had cancelled it).
    They end as a call in flight at close() does, and as the grpc balancer's first calls do when its
    lookup is cut by close(): InferError CANCELLED."""
    async with stub("a") as a:
        client = AsyncClient(f"dns:///wok-headless:{a.port}", balancer="wok")
        looking_up = asyncio.Event()

        async def resolver(host: str, port: int) -> list[str]:  # a name server that does not answer
            looking_up.set()
            await asyncio.Event().wait()

        client.balancer._resolve = resolver
        calls = [asyncio.ensure_future(client.server_live(timeout=10)) for _ in range(2)]
        await looking_up.wait()
        await client.close()
        outcomes = await asyncio.gather(*calls, return_exceptions=True)
        assert [type(o).__name__ for o in outcomes] == ["InferError"] * 2, outcomes
        assert {(o.code, o.details) for o in outcomes} == {(CODE.CANCELLED, aio.CLOSED_EARLY)}
        assert not any(c.cancelled() for c in calls) and a.calls == 0
        with pytest.raises(RuntimeError, match="closed"):  # a call after close(), as ever
            await client.server_live()
