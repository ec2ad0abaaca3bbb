"""The admin event stream (server/admin.py) across a stop that cancels batches at the worker."""

from __future__ import annotations

import asyncio
import json
import time

import numpy as np
import torch
from torch import nn

from wok.app import WokServer
from wok.config import server_settings
from wok.repository import ModelRepository
from wok.servable import Servable

from .conftest import four_wide_config


async def until(cond, what: str, limit_s: float = 10.0) -> None:
    """Run the loop until `cond()` holds (a backstop of `limit_s`, never reached when it works)."""
    end = time.monotonic() + limit_s
    while not cond():
        assert time.monotonic() < end, f"never: {what}"
        await asyncio.sleep(0)


async def next_event(sub, *types: str) -> dict:
    while True:
        event = await asyncio.wait_for(sub.queue.get(), 10)
        if event["type"] in types:
            return event


async def test_a_batch_cancelled_at_the_worker_by_the_stop_is_a_failed_batch_event(gated_model):
    """Past the grace period the executor's shutdown cancels the batch still waiting at the worker
    (Instance.shutdown, cancel_futures). A subscriber still there then (the /events stream of a
    connection the metrics port accepted as its stop began outlives it) got no event for that batch:
    `_done` called f.exception() on the cancelled future, and the loop logged the CancelledError."""
    # One request is a full batch: the second waits at the busy worker (two slots: the default
    # pipeline_depth, 2). `entered`: a batch met the closed gate (the warm-up runs through).
    servable, module = gated_model(max_batch_size=1, delay_ms=5.0, depth=None, enter_when_closed=True)
    server = WokServer(server_settings(grpc_port=0, metrics_port=0, admin=True), ModelRepository([servable], "test"))
    loop = asyncio.get_running_loop()
    handler = loop.get_exception_handler()
    await server.start()
    stopping = None
    try:
        admin = server.http.admin
        sub = admin.subscribe()
        # A callback that raises on the loop: its report goes to the subscriber, where the test reads it.
        loop.set_exception_handler(lambda _loop, ctx: sub.put({"type": "loop-error", "message": ctx["message"]}))
        module.gate.clear()
        batcher = server.runtime("gated").batcher
        x = {"INPUT0": np.ones((1, 4), np.float32)}
        pending = [batcher.submit(x, 1, None, None) for _ in range(2)]
        assert await loop.run_in_executor(None, module.entered.wait, 10), "the first batch never reached the model"
        await until(lambda: admin.watches["gated"].running == [2], "both batches at the instance")
        stopping = asyncio.create_task(server.stop(grace=0.05))
        event = await next_event(sub, "batch", "loop-error")
        assert {k: v for k, v in event.items() if k not in ("t_start", "t_end")} == {
            "type": "batch",
            "model": "gated",
            "instance": 0,
            "size": 1,
            "requests": 1,
            "reason": "size",
            "queued": 0,
            "ok": False,
            "error": "cancelled",
        }
        assert event["t_start"] <= event["t_end"]
        assert admin.watches["gated"].running == [1]  # the first batch is still in the model
        module.gate.set()
        ran = await next_event(sub, "batch", "loop-error")
        assert (ran["type"], ran["ok"]) == ("batch", True)
        await stopping
        assert admin.watches["gated"].running == [0]
        assert admin.watches["gated"].busy[0] > 0  # the batch that ran; the cancelled one adds nothing
        for p in pending:  # answered UNAVAILABLE by the stop
            assert p.future.done() and type(p.future.exception()).__name__ == "ShuttingDown"
        admin.unsubscribe(sub)
    finally:
        module.gate.set()
        if stopping is None:
            await server.stop(grace=5.0)
        elif not stopping.done():
            await stopping
        loop.set_exception_handler(handler)


async def test_a_batch_rerun_in_parts_is_an_event_that_ran_naming_its_failed_requests_and_error(gated_model):
    """A batch the model failed on one request's value, rerun in parts (executor's _isolate): the
    event says how many of its requests failed alone and the batch's error; it ran, so it counts busy."""
    servable, _ = gated_model(max_batch_size=3, delay_ms=60_000.0)
    server = WokServer(server_settings(grpc_port=0, metrics_port=0, admin=True), ModelRepository([servable], "test"))
    await server.start()
    try:
        admin = server.http.admin
        sub = admin.subscribe()
        batcher = server.runtime("gated").batcher
        values = (1.0, float("nan"), 2.0)
        pending = [batcher.submit({"INPUT0": np.full((1, 4), v, np.float32)}, 1, None, None) for v in values]
        event = await next_event(sub, "batch")
        assert {k: v for k, v in event.items() if k not in ("t_start", "t_end")} == {
            "type": "batch",
            "model": "gated",
            "instance": 0,
            "size": 3,
            "requests": 3,
            "reason": "size",
            "queued": 0,
            "ok": True,
            "ran": 3,
            "failed": 1,
            "error": "model 'gated' failed: ValueError: NaN in batch",
        }
        await asyncio.gather(*(p.future for p in pending), return_exceptions=True)
        busy = admin.watches["gated"].busy[0]
        assert busy > 0
        assert [p.future.exception() is None for p in pending] == [True, False, True]
        # Every request failed: not ok, but it ran (and its parts): busy, as in wok_instance_busy_seconds.
        pending = [batcher.submit({"INPUT0": np.full((1, 4), np.nan, np.float32)}, 1, None, None) for _ in range(3)]
        event = await next_event(sub, "batch")
        assert (event["ok"], event["ran"], event["failed"]) == (False, 3, 3)
        await asyncio.gather(*(p.future for p in pending), return_exceptions=True)
        assert admin.watches["gated"].busy[0] > busy
        assert admin.watches["gated"].busy == server.runtime("gated").metrics.busy_seconds
        admin.unsubscribe(sub)
    finally:
        await server.stop(grace=5.0)


class Loud(nn.Module):
    """Doubles; a batch holding a negative value fails with a message of 100,000 characters."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (x < 0).any():
            raise ValueError("y" * 100_000)
        return x * 2


async def test_a_failed_batchs_error_is_cut_in_its_event_as_in_the_log_line():
    """The batch event carried the model's message whole: one of megabytes went out in one event to
    each /events subscriber. Cut as the server's WARNING for the failed batch is (to 4,096 bytes)."""
    servable = Servable(four_wide_config("loud", max_batch_size=1), Loud())
    server = WokServer(server_settings(grpc_port=0, metrics_port=0, admin=True), ModelRepository([servable], "test"))
    await server.start()
    # Read from the port, as the demo's page reads it: a limit past the uncut event's 100 KB line.
    reader, writer = await asyncio.open_connection("127.0.0.1", server.http.port, limit=1 << 20)
    try:
        writer.write(f"GET /events HTTP/1.1\r\nHost: 127.0.0.1:{server.http.port}\r\n\r\n".encode())
        await asyncio.wait_for(reader.readuntil(b'"type":"hello"'), 10)  # subscribed
        pending = server.runtime("loud").batcher.submit({"INPUT0": np.full((1, 4), -1, np.float32)}, 1, None, None)
        while True:
            line = await asyncio.wait_for(reader.readline(), 10)
            if line.startswith(b"data: ") and json.loads(line[6:])["type"] == "batch":
                break
        await asyncio.gather(pending.future, return_exceptions=True)
    finally:
        writer.close()
        await server.stop(grace=5.0)
    event = json.loads(line[6:])
    message = "model 'loud' failed: ValueError: " + "y" * 100_000
    # 4,096 bytes as the event's JSON writes it, its note (34 bytes, the ellipsis \u2026) included.
    assert (event["ok"], event["error"]) == (False, f"{message[: 4096 - 34]}… ({len(message):,} characters in all)")
    assert len(line) < 5_000, len(line)
