"""Rounds of the error paths a server running for weeks meets leave nothing behind: after each round,
once the server has settled, its tasks, the objects of its per-request and per-stream state, the
process's fds and threads, and its own counters of open calls are what they were after the first.

A real server on loopback in a thread of its own (serve_in_thread), driven from the test's loop:
malformed and oversize requests, calls cancelled while queued and while running, deadlines expiring
in the queue, faults switched on and off, streams half-closed, abandoned and never read, health
Watch and reflection streams dropped, /events and HTTP connections dropped mid-request, scrapes.
A leak of a task, a stream's state, a connection's fd or a watcher per round fails the comparison,
naming what grew.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import gc
import os

import grpc
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from wok.admin import Subscriber
from wok.batcher import Batch, Pending
from wok.codec import encode_request
from wok.service import _Stream
from wok.v2pb import grpc_service_pb2 as pb
from wok.v2pb import grpc_service_pb2_grpc as pb_grpc

from ..conftest import until

MAX_REQUEST_BYTES = 64 * 1024  # gRPC's own message limit is then 4 x this + 1 MiB
WINDOW = 8  # --stream-window: a stream never read stops being read past it
SETTLE_S = 15.0
PROCESS_WIDE = ("tasks", "objects", "fds", "threads")  # the rest of `state` counts what is open: 0 when quiet
ROUNDS = 3


def mlp(rows: int = 1, width: int = 256, dtype=np.float32) -> pb.ModelInferRequest:
    return encode_request("mlp", {"INPUT0": np.ones((rows, width), dtype)})


def recsys(rows: int = 1) -> pb.ModelInferRequest:
    return encode_request("recsys", {"dense": np.ones((rows, 13), np.float32), "ids": np.ones((rows, 3), np.int64)})


def malformed() -> list[pb.ModelInferRequest]:
    short = mlp(2)
    short.raw_input_contents[0] = short.raw_input_contents[0][:-4]
    unknown = mlp()
    unknown.model_name = "nope"
    return [
        mlp(2, dtype=np.int64),  # wrong datatype
        mlp(2, width=255),  # wrong shape
        encode_request("recsys", {"dense": np.ones((1, 13), np.float32)}),  # an input missing
        unknown,
        short,  # raw contents a row's worth short
        mlp(80),  # past --max-request-bytes: wok refuses it
        mlp(1600),  # past gRPC's message limit: its core refuses it before the handler
    ]


async def http(port: int, raw: bytes, *, read_until: bytes | None = None) -> None:
    """Send `raw` to the metrics port; read the whole answer, or up to `read_until`, then drop the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        await writer.drain()
        if read_until is None:
            await asyncio.wait_for(reader.read(), 10)
        elif read_until:
            await asyncio.wait_for(reader.readuntil(read_until), 10)
    finally:
        writer.close()


async def admin(port: int, body: str) -> None:
    head = "POST /admin/faults HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    await http(port, f"{head}Content-Length: {len(body)}\r\nConnection: close\r\n\r\n{body}".encode())


@contextlib.asynccontextmanager
async def slowed(port: int):
    """mlp's instance slowed for the block, until its end (a stream's cancellation or its channel's close)
    has been sent. A stream stops being read at its window only while WINDOW of its requests are owed at
    once; a model answering as they are read (a loaded host, reading slower) kept it below, and the wait
    for it failed ("never: a stream at its window"). Slowed, no answer is made, so the stream's reader
    stops at the window, as a client that never reads leaves it once its transport is full."""
    await admin(port, '{"model": "mlp", "mode": "slow", "delay_ms": 60000}')
    try:
        yield
    finally:
        await admin(port, '{"model": "mlp", "mode": "off"}')


async def until_at_window(srv, what: str) -> None:
    """Return once a stream has stopped being read at its window; fail saying `what` after 10,000 looks. Read on the
    server's loop, as `state` reads: walked from the test's thread, the set of streams could change size as the
    server opened or ended one meanwhile ("Set changed size during iteration")."""

    async def reached() -> bool:
        return any(st.owed >= WINDOW for st in srv.server.service._streams)

    for _ in range(10_000):
        if await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(reached(), srv.loop)):
            return
        await asyncio.sleep(0.001)
    raise AssertionError(f"never: {what}")


async def ended(call) -> None:
    try:
        await call
    except (grpc.aio.AioRpcError, asyncio.CancelledError):
        pass


async def one_round(srv) -> None:
    target, mport = srv.target, srv.server.http.port
    rt = srv.server.runtimes["mlp"]
    options = [("grpc.max_send_message_length", 16 << 20)]
    async with grpc.aio.insecure_channel(target, options=options) as ch:
        stub = pb_grpc.GRPCInferenceServiceStub(ch)
        calls = [stub.ModelInfer(r, timeout=10) for r in malformed()]
        calls.append(ch.unary_unary("/inference.GRPCInferenceService/ModelInfer")(b"\xff\xff not a message"))
        for call in calls:
            await ended(call)

        # mlp's one instance slowed: a batch runs, others queue behind it; cancelled in both places,
        # and short deadlines that pass in the queue.
        await admin(mport, '{"model": "mlp", "mode": "slow", "delay_ms": 60000}')
        running = [stub.ModelInfer(mlp(), timeout=30) for _ in range(2)]
        await until(lambda: rt.batcher.inflight >= 1, "a batch running at the slowed instance")
        queued = [stub.ModelInfer(mlp(), timeout=30) for _ in range(4)]
        expiring = [stub.ModelInfer(mlp(), timeout=0.05) for _ in range(3)]
        await until(lambda: rt.batcher.queued >= 4, "calls queued behind it")
        abandoned = grpc.aio.insecure_channel(target)
        stream = pb_grpc.GRPCInferenceServiceStub(abandoned).ModelStreamInfer()
        for _ in range(3):
            await stream.write(mlp())
        await until(lambda: rt.batcher.queued >= 7, "the stream's requests queued")
        await abandoned.close()  # mid-stream, its requests queued
        for call in expiring:
            await ended(call)
        for call in running + queued:
            call.cancel()
            await ended(call)
        await admin(mport, '{"model": "mlp", "mode": "off"}')
        await admin(mport, '{"model": "recsys", "mode": "fail"}')
        await ended(stub.ModelInfer(recsys(), timeout=10))
        await admin(mport, '{"model": "recsys", "mode": "off"}')

        # Streams: good and bad messages, half-closed and read to the end; never read past the
        # window, then cancelled.
        stream = stub.ModelStreamInfer()
        for r in (mlp(), *malformed()[:5], recsys()):
            await stream.write(r)
        await stream.done_writing()
        assert len([a async for a in stream]) == 7
        async with slowed(mport):
            stream = stub.ModelStreamInfer()
            for _ in range(2 * WINDOW):
                await stream.write(mlp())
            await until_at_window(srv, "a stream at its window")
            stream.cancel()

        health = health_pb2_grpc.HealthStub(ch)
        watch = health.Watch(health_pb2.HealthCheckRequest(service=""))
        await watch.read()
        watch.cancel()
        reflect = reflection_pb2_grpc.ServerReflectionStub(ch).ServerReflectionInfo()
        await reflect.write(reflection_pb2.ServerReflectionRequest(list_services=""))
        await reflect.read()
        reflect.cancel()

    # Streams left open, unread, as their channel closes.
    async with slowed(mport), grpc.aio.insecure_channel(target) as ch:
        stream = pb_grpc.GRPCInferenceServiceStub(ch).ModelStreamInfer()
        for _ in range(2 * WINDOW):
            await stream.write(mlp())
        watch = health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest(service=""))
        await watch.read()
        reflect = reflection_pb2_grpc.ServerReflectionStub(ch).ServerReflectionInfo()
        await reflect.write(reflection_pb2.ServerReflectionRequest(list_services=""))
        await until_at_window(srv, "the unread stream at its window")

    host = b"Host: 127.0.0.1\r\n"
    await http(mport, b"GET /events HTTP/1.1\r\n" + host + b"\r\n", read_until=b"data: ")  # dropped mid-stream
    await http(mport, b"GET /metr", read_until=b"")  # dropped mid-line
    await http(mport, b"POST /admin/faults HTTP/1.1\r\n" + host + b"Content-Length: 40\r\n\r\n{", read_until=b"")
    # A scrape: UnhandledCalls keeps the calls ended before their handler (the one past gRPC's
    # limit) until the next scrape counts them.
    await http(mport, b"GET /metrics HTTP/1.1\r\n" + host + b"Connection: close\r\n\r\n")


def _coro_name(task: asyncio.Task) -> str:
    coro = task.get_coro()
    return getattr(coro, "__qualname__", type(coro).__name__)


async def _server_side(server) -> dict:
    """On the server's loop: its pending tasks by coroutine, and its own counts of what is open."""
    this = asyncio.current_task()
    service = server.service
    return {
        "tasks": collections.Counter(_coro_name(t) for t in asyncio.all_tasks() if t is not this),
        "requests active": service.active,
        "answers unwritten": service.unwritten,
        "streams open": len(service._streams),
        "health watches": server._health.watching,
        "reflection streams": server._reflection.open_streams,
        "event subscribers": len(server.http.admin.subscribers),
        "http connections": len(server.http._clients),
        "calls kept before their handler": server.unhandled.waiting,
        "queued": {name: rt.batcher.queued for name, rt in server.runtimes.items()},
        "in flight": {name: rt.batcher.inflight for name, rt in server.runtimes.items()},
    }


async def state(srv) -> dict:
    """What a leak would grow: the server's side, the process's fds and threads, and live objects (done
    tasks of the server's loop kept by a reference included)."""
    own = await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(_server_side(srv.server), srv.loop))
    gc.collect()
    kinds = (Pending, Batch, _Stream, Subscriber)
    objects = collections.Counter(type(o).__name__ for o in gc.get_objects() if type(o) in kinds)
    objects["server loop tasks"] = sum(
        1 for o in gc.get_objects() if type(o) is asyncio.Task and o.get_loop() is srv.loop
    )
    return own | {
        "objects": dict(objects),
        "fds": len(os.listdir("/proc/self/fd")),
        "threads": len(os.listdir("/proc/self/task")),
    }


async def settled(srv, base: dict | None) -> dict:
    """The state once the server has taken in the round's ends: equal to `base`, or, with none, quiet:
    every count of open calls, streams and connections at 0, no request's, batch's, stream's or
    subscriber's object alive. Fails naming what differs after SETTLE_S."""
    loop = asyncio.get_running_loop()
    end = loop.time() + SETTLE_S
    while True:
        now = await state(srv)
        if base is None:
            counts = [v for k, v in now.items() if k not in (*PROCESS_WIDE, "queued", "in flight")]
            counts += [*now["queued"].values(), *now["in flight"].values()]
            # No request's, batch's, stream's or subscriber's state alive, and the ticks for /events ended.
            counts += [v for k, v in now["objects"].items() if k != "server loop tasks"]
            if not any(counts) and "Admin._tick_forever" not in now["tasks"]:
                return now
        elif now == base:
            return now
        if loop.time() > end:
            if base is None:
                raise AssertionError(f"the server never quiet after the first round: {now}")
            grown = {k: (base[k], v) for k, v in now.items() if base[k] != v}
            raise AssertionError(f"after a round, expected the state of the first, got (first, now) {grown}")
        await asyncio.sleep(0.05)


async def test_rounds_of_error_paths_leave_no_tasks_objects_fds_or_threads(serve_in_thread):
    srv = serve_in_thread(admin=True, max_request_bytes=MAX_REQUEST_BYTES, stream_window=WINDOW)
    await one_round(srv)  # warm-up: lazy threads, first batches' buffers, metric series
    base = await settled(srv, None)
    for _ in range(ROUNDS):
        await one_round(srv)
        await settled(srv, base)
