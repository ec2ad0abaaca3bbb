"""Loopback gRPC servers whose ModelInfer answers as a test says, for the balancing tests.

A `Stub` is a plain grpc.aio server (a `Loopback`) with the health service and a ModelInfer
that fails its first `fail_first` calls with `code`, or holds every call until `release` is set
(a server that hangs with its connection open), so a test knows exactly how many attempts
reached which server. Its answer names it (the response's model name).
"""

from __future__ import annotations

import abc
import asyncio
import gc
import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest
import uvloop
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from wok.clients import channel as client_channel
from wok.v2pb import grpc_service_pb2 as pb
from wok.v2pb import grpc_service_pb2_grpc as pb_grpc

CODE = grpc.StatusCode
SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING


class _Health(health.aio.HealthServicer):
    """grpc_health's servicer, whose Watch handlers' tasks a stop waits for (`Loopback.stop`)."""

    def __init__(self) -> None:
        super().__init__()
        self.watches: set[asyncio.Task] = set()

    async def Watch(self, request: health_pb2.HealthCheckRequest, context) -> None:
        task = asyncio.current_task()
        self.watches.add(task)
        task.add_done_callback(self.watches.discard)
        await super().Watch(request, context)


class Loopback(abc.ABC):
    """A grpc.aio server on `address` (loopback, a free port) with the health service, SERVING;
    `register(server)` adds a subclass's handlers. With `credentials` it speaks TLS, `options` are
    the server's. `async with` starts it and stops it (no grace, `stop`). A subclass's handlers call
    `_notify()` where `wait_until` is to look again. A start that fails once the server runs stops it."""

    def __init__(
        self,
        *,
        address: str = "127.0.0.1:0",
        options: Sequence[tuple[str, Any]] = (),
        credentials: grpc.ServerCredentials | None = None,
    ) -> None:
        self.address, self.options, self.credentials = address, options, credentials
        self.server: grpc.aio.Server | None = None
        self.health = _Health()
        self.port = 0
        self._changed = asyncio.Condition()

    @abc.abstractmethod
    def register(self, server: grpc.aio.Server) -> None:
        """Add the subclass's handlers to `server` (before it starts)."""

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def wait_until(self, predicate, timeout: float = 10.0) -> None:
        """Return once `predicate()` holds; it is checked at each `_notify()` of the handlers."""
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(predicate), timeout)

    async def __aenter__(self) -> Loopback:
        self.server = grpc.aio.server(options=self.options)
        self.register(self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        if self.credentials is None:
            self.port = self.server.add_insecure_port(self.address)
        else:
            self.port = self.server.add_secure_port(self.address, self.credentials)
        await self.server.start()
        try:
            await self.health.set("", SERVING)
        except BaseException:
            # `async with` calls no __aexit__ for an __aenter__ that raised: the server would go on answering.
            await self.stop()
            raise
        return self

    async def __aexit__(self, *exc) -> None:
        await self.stop()

    async def stop(self) -> None:
        """Stop the server at once (no grace, its calls cancelled), and return once the health Watch handlers it
        cancels have ended. gRPC's stop returns before them: one still running when the test's loop closed was
        cancelled with it, and gRPC logged "Exception not handled by _handle_exceptions in servicer method
        [/grpc.health.v1.Health/Watch]"."""
        await self.server.stop(0)
        if self.health.watches:
            _, pending = await asyncio.wait(set(self.health.watches), timeout=10)
            assert not pending, f"{len(pending)} health Watch handler(s) still running 10 s after the server's stop"
        # gRPC's own task around each handler resumes once the handler has ended: one turn of the loop, queued
        # before this coroutine's resumption. Cancelled before it, it logs the same error.
        await asyncio.sleep(0)

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"


class Stub(Loopback):
    """A Loopback server whose ModelInfer fails its first `fail_first` calls with `code`; with
    `hold`, every call waits for `release` (and counts as `cancelled` if the client gives up)."""

    def __init__(
        self,
        name: str,
        *,
        fail_first: int = 0,
        code: grpc.StatusCode = CODE.UNAVAILABLE,
        hold: bool = False,
        **loopback,
    ) -> None:
        super().__init__(**loopback)
        self.name, self.fail_first, self.code = name, fail_first, code
        self.calls = 0
        self.cancelled = 0
        self.release = asyncio.Event()
        if not hold:
            self.release.set()

    async def infer(self, request: bytes, context) -> bytes:
        self.calls += 1
        await self._notify()
        if self.calls <= self.fail_first:
            await context.abort(self.code, f"{self.name}: failing call {self.calls}")
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            asyncio.get_running_loop().create_task(self._notify())
            raise
        return pb.ModelInferResponse(model_name=self.name).SerializeToString()

    async def wait_calls(self, n: int, timeout: float = 10.0) -> None:
        """Return once `n` calls have reached this server."""
        await self.wait_until(lambda: self.calls >= n, timeout)

    def register(self, server: grpc.aio.Server) -> None:
        handler = grpc.unary_unary_rpc_method_handler(self.infer)
        server.add_generic_rpc_handlers(
            [grpc.method_handlers_generic_handler("inference.GRPCInferenceService", {"ModelInfer": handler})]
        )

    async def __aexit__(self, *exc) -> None:
        self.release.set()
        await super().__aexit__(*exc)


class LoopThread:
    """An event loop running on a thread of its own until close(); `run(coro)` runs a coroutine on it and waits."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro, timeout: float = 30.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()


@pytest.fixture
def stub():
    """`async with stub("a", fail_first=2) as a:` a Stub server (see the module)."""
    return Stub


class Unpublished(Loopback, pb_grpc.GRPCInferenceServiceServicer):
    """A KServe server that publishes no request limit, as tritonserver or a wok server before it
    published one: gRPC's receive limit `limit`, the health service, a ServerMetadata without
    trailing metadata (or, with `server_metadata=False`, none: UNIMPLEMENTED; with "hold", one that
    answers only once `release` is set, or not at all), and a ModelInfer and ModelStreamInfer that
    answer each request with its model's name and id. `lookups` and `requests` count what reached
    it (`wait_until` looks at each arrival)."""

    def __init__(self, limit: int, *, server_metadata: bool | str = True) -> None:
        super().__init__(options=[("grpc.max_receive_message_length", limit)])
        self.limit, self.server_metadata = limit, server_metadata
        self.lookups = self.requests = 0
        self.release = asyncio.Event()

    async def ServerMetadata(self, request, context):
        self.lookups += 1
        await self._notify()
        if not self.server_metadata:
            await context.abort(CODE.UNIMPLEMENTED, "Method not implemented!")
        if self.server_metadata == "hold":
            await self.release.wait()  # or until the caller's deadline cancels it
        return pb.ServerMetadataResponse(name="triton")

    async def ModelInfer(self, request, context):
        self.requests += 1
        await self._notify()
        return pb.ModelInferResponse(model_name=request.model_name, id=request.id)

    async def ModelStreamInfer(self, request_iterator, context):
        async for request in request_iterator:
            self.requests += 1
            yield pb.ModelStreamInferResponse(
                infer_response=pb.ModelInferResponse(model_name=request.model_name, id=request.id)
            )

    def register(self, server: grpc.aio.Server) -> None:
        pb_grpc.add_GRPCInferenceServiceServicer_to_server(self, server)


@pytest.fixture
def unpublished():
    """`async with unpublished(limit) as server:` an Unpublished server (see the class)."""
    return Unpublished


WATCH_LOADED_S = 10.0  # a watch whose channel nothing holds ends well within this on a loaded host


@pytest.fixture(params=["asyncio", "uvloop"])
def on_a_loop_then_closed(request, caplog, monkeypatch):
    """`on_a_loop_then_closed(run)`: see _on_a_loop_then_closed; on each kind of loop. A watch on a closed
    channel is given WATCH_LOADED_S to end: what is checked is what a close leaves to the collector or to
    the loop's end (a watch that ends only at a collection, or never), not how soon gRPC's poller hands a
    completion over; at 50 ms a loaded host ran the collector in 2 of 60 runs beside four busy loops."""
    monkeypatch.setattr(client_channel, "WATCH_END_S", WATCH_LOADED_S)
    factory = uvloop.new_event_loop if request.param == "uvloop" else asyncio.new_event_loop
    return lambda run: _on_a_loop_then_closed(run, factory, caplog)


def _on_a_loop_then_closed(run, loop_factory, caplog) -> list[str]:
    """Run `run()` (which asserts what it needs) on a loop of `loop_factory`, close the loop, drop
    what `run()` returned, run the collector and gRPC on a new loop; what was left for the closed
    loop: the "Event loop is closed" errors logged meanwhile, and gRPC's operations of the closed
    loop still open in its core (abandoned, their futures cancelled, or not completed). A
    connectivity watch left so completes once its channel goes, if ever, and the poller, running on
    whatever loop then, hands it to the closed one ("Exception in callback
    PollerCompletionQueue._handle_events")."""
    caplog.set_level(logging.ERROR)
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        kept = runner.run(run())
        loop = runner.get_loop()
    del kept  # what the caller kept past the loop (an error, say) goes now
    gc.collect()

    async def more_grpc() -> None:
        async with grpc.aio.insecure_channel("127.0.0.1:1") as channel:  # nothing listens
            try:
                await channel.unary_unary("/inference.GRPCInferenceService/ServerLive")(b"", timeout=1)
            except grpc.aio.AioRpcError:
                pass  # refused: a call that ends by itself, its completion through the poller

    asyncio.run(more_grpc())
    gc.collect()
    left = [
        r.getMessage()
        for r in caplog.records
        if r.exc_info and "Event loop is closed" in str(r.exc_info[1]) and _closed_loop(r.exc_info[2]) in (loop, None)
    ]
    # gRPC's own record of an operation: a CallbackWrapper holding the future it completes.
    wrapper = getattr(grpc._cython.cygrpc, "CallbackWrapper", None)
    for o in gc.get_objects() if wrapper is not None else ():
        if type(o) is wrapper:
            for f in gc.get_referents(o):
                if isinstance(f, asyncio.Future) and f.get_loop() is loop and (f.cancelled() or not f.done()):
                    left.append(f"an operation of the closed loop open in gRPC's core: {gc.get_referents(o)}")
    return left


def _closed_loop(tb) -> asyncio.AbstractEventLoop | None:
    """The loop an "Event loop is closed" error was raised for (`self` of the innermost frame that has
    a loop: asyncio's call_soon_threadsafe), None where no frame shows one (uvloop's, compiled). gRPC's
    poller is the process's: a late completion of an earlier test's loop lands in this one's window
    too, and is not what this run left (in 3 of 9 runs of test_balancer.py beside a second copy and
    three busy loops, each for an earlier test's loop: unfiltered, each failed the test)."""
    found = None
    while tb is not None:
        candidate = tb.tb_frame.f_locals.get("self")
        if isinstance(candidate, asyncio.AbstractEventLoop):
            found = candidate
        tb = tb.tb_next
    return found


# test_balancing.py's test of a call held by a stopped server: almost all of its 11 s is waiting
# for gRPC's ping and reconnection timers, so its client runs in a process of its own from the
# first test of this folder on (test_balancer.py's marked serial, in the serial pass), not from its module's
# start: the module's other tests took 3-5 s of it, and the serial pass waited out the rest.
HELD = ("test_balancing.py", "test_a_call_held_by_a_stopped_server_fails_unavailable_long_before_its_deadline")
HELD_CALL = textwrap.dedent(
    """
    import json, os, signal, sys, time
    import numpy as np
    from wok.clients import Client, InferError
    pid, target = int(sys.argv[1]), sys.argv[2]
    with Client(target) as client:
        client.wait_ready(timeout=30)
        x = {"INPUT0": np.zeros((1, 256), np.float32)}
        client.infer("mlp", x, timeout=10)
        os.kill(pid, signal.SIGSTOP)
        t0 = time.monotonic()
        try:
            client.infer("mlp", x, timeout=40)
            code, error = "OK", None
        except InferError as exc:
            code, error = exc.code.name, str(exc)
        took = time.monotonic() - t0
    print(json.dumps({"code": code, "error": error, "took": took}))
    """
)


@pytest.fixture(scope="session", autouse=True)
def held_call(request):
    """The held call's client (a Popen; None unless its test is selected), started with a bare
    server (bench/peers/bare_server.py) that it SIGSTOPs once answered."""
    if not any((item.path.name, getattr(item, "originalname", None)) == HELD for item in request.session.items):
        yield None
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    bare = Path(__file__).resolve().parents[2] / "bench" / "peers" / "bare_server.py"
    server = subprocess.Popen([sys.executable, str(bare), str(port)], stderr=subprocess.DEVNULL)
    client = subprocess.Popen(
        [sys.executable, "-c", HELD_CALL, str(server.pid), f"127.0.0.1:{port}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield client
    finally:
        if client.poll() is None:
            client.kill()
        client.communicate()
        os.kill(server.pid, signal.SIGCONT)
        server.kill()
        server.wait()
