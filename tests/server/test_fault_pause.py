"""An injected slow fault's pause ends early: when the admin API changes the fault, and when the
server stops (server/faults.py InstanceFault.pause). Before, a batch slept its whole delay (up to
60 s) after `off`, and a stop past its grace period gave the worker thread up (abandoned_work)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.request

import numpy as np
import pytest

from wok.app import WokServer
from wok.config import server_settings
from wok.errors import ShuttingDown
from wok.faults import FaultBoard, InstanceFault, parse_fault_request
from wok.repository import ModelRepository

DELAY_MS = 30_000.0


class _NotedWake(threading.Event):
    """The fault's wake event, which also says when a batch's pause began waiting on it."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting = threading.Event()

    def wait(self, timeout=None):
        self.waiting.set()
        return super().wait(timeout)


def _post(url: str, body: dict) -> int:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.status


async def _sleeping_batch(gated_model):
    """A served gated model with a slow fault of DELAY_MS, and one request of it in its pause."""
    servable, _ = gated_model(max_batch_size=1, delay_ms=1.0, name="paused")
    server = WokServer(server_settings(grpc_port=0, metrics_port=0, admin=True), ModelRepository([servable], "test"))
    await server.start()
    try:
        base = f"http://127.0.0.1:{server.http.port}/admin/faults"
        fault = server.runtime("paused").executor.instances[0].fault
        wake = fault._wake = _NotedWake()
        assert await asyncio.to_thread(_post, base, {"model": "paused", "mode": "slow", "delay_ms": DELAY_MS}) == 200
        started = time.monotonic()
        pending = server.runtime("paused").batcher.submit({"INPUT0": np.ones((1, 4), np.float32)}, 1, None, None)
        assert await asyncio.to_thread(wake.waiting.wait, 10), "the batch never began its pause"
    except BaseException:
        await server.stop(grace=0.1)
        raise
    return server, base, pending, started


@pytest.mark.parametrize(
    "change", [{"mode": "off"}, {"mode": "fail"}, {"mode": "slow", "delay_ms": 1}], ids=["off", "fail", "shorter"]
)
async def test_changing_the_fault_ends_a_pause_under_way(gated_model, change):
    server, base, pending, started = await _sleeping_batch(gated_model)
    try:
        assert await asyncio.to_thread(_post, base, {"model": "paused", **change}) == 200
        result = await asyncio.wait_for(asyncio.shield(pending.future), 10)
        took = time.monotonic() - started
        assert took < 10, f"the answer came {took:.1f} s after the request; the fault's delay is {DELAY_MS / 1e3} s"
        np.testing.assert_array_equal(result["OUTPUT0"], np.full((1, 4), 2.0, np.float32))
        # The compute stage records the time slept, not the delay the batch began with.
        assert pending.compute < 10
    finally:
        await server.stop(grace=5.0)
    assert not server.abandoned_work


async def test_a_stop_past_its_grace_ends_the_pause_and_abandons_no_work(gated_model):
    server, _, pending, _ = await _sleeping_batch(gated_model)
    grace = 0.5
    started = time.monotonic()
    await server.stop(grace=grace)
    took = time.monotonic() - started
    # The drain gives the slow batch its grace, as any slow batch; the executors' shutdown then ends the pause.
    assert not server.abandoned_work
    assert took < grace + 5, f"the stop took {took:.1f} s"
    assert isinstance(pending.future.exception(), ShuttingDown), pending.future.exception()


def _paused_for(state, timeout: float = 10.0) -> float:
    """Seconds `state.pause()` lasted, run in a thread; stop() ends it past `timeout`."""
    took = []

    def run():
        t0 = time.monotonic()
        state.pause()
        took.append(time.monotonic() - t0)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    state.stop()
    t.join(10)
    assert took, "the pause did not end after stop()"
    return took[0]


def test_a_wall_clock_stepped_ahead_does_not_cut_a_pause(monkeypatch):
    # The pause's expiry was on time.time(): a step a day ahead ended a 60 s fault's 300 ms pause at once.
    board = FaultBoard([InstanceFault("m", 0)])
    board.apply(parse_fault_request({"model": "m", "mode": "slow", "delay_ms": 300, "duration_s": 60}, {"m": 1}))
    wall = time.time()
    monkeypatch.setattr(time, "time", lambda: wall + 86_400.0)
    assert _paused_for(board.states["m"][0]) >= 0.3


def test_a_wall_clock_stepped_back_does_not_stretch_a_pause(monkeypatch):
    # A step a day back held a 200 ms fault's pause for its whole 30 s delay.
    board = FaultBoard([InstanceFault("m", 0)])
    body = {"model": "m", "mode": "slow", "delay_ms": DELAY_MS, "duration_s": 0.2}
    board.apply(parse_fault_request(body, {"m": 1}))
    wall = time.time()
    monkeypatch.setattr(time, "time", lambda: wall - 86_400.0)
    took = _paused_for(board.states["m"][0])
    assert took < 10, took
