"""wok.wakeup: the event loop takes every waiting gRPC completion in one pass.

The client side shows it best, with no timing luck: an aio client in this loop sends calls to
a synchronous gRPC server in a thread, which holds them until the loop is blocked, then
answers them all while it stays blocked.
Every answer finishes operations on grpc.aio's completion queue, each one byte on the wake-up
socket; the first pass after the block finds them all waiting and takes them at once. Without
the drain grpc.aio would take one byte per pass, one pass per finished operation.
"""

from __future__ import annotations

import asyncio
import fcntl
import socket
import sys
import termios
import threading
import time
import types
from concurrent import futures
from dataclasses import dataclass

import grpc
import pytest

from wok.wakeup import WakeupDrain

LOOPS = ("asyncio", "uvloop")
METHOD = "/wok.test.Echo/Echo"
CALLS = 30


def waiting_bytes(sock) -> int:
    count = bytearray(4)
    fcntl.ioctl(sock.fileno(), termios.FIONREAD, count)
    return int.from_bytes(count, sys.byteorder)


@dataclass
class SyncServer:
    port: int
    received: threading.Semaphore  # released as each call reaches the handler
    answered: threading.Semaphore  # ... as each handler returns
    release: threading.Event  # handlers wait for it; set unless a test holds them


@pytest.fixture
def sync_server():
    """A synchronous gRPC echo server, with its own completion queues and threads."""
    server_state = SyncServer(0, threading.Semaphore(0), threading.Semaphore(0), threading.Event())
    server_state.release.set()

    def echo(request: bytes, context) -> bytes:
        server_state.received.release()
        server_state.release.wait(30)
        server_state.answered.release()
        return request[::-1]

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=CALLS + 2))
    handler = grpc.unary_unary_rpc_method_handler(echo)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("wok.test.Echo", {"Echo": handler}),))
    server_state.port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield server_state
    server_state.release.set()
    server.stop(None)


@pytest.mark.parametrize("loop", LOOPS)
def test_the_first_pass_after_a_block_takes_every_waiting_completion(sync_server, run_on, loop):
    async def main():
        async with grpc.aio.insecure_channel(f"127.0.0.1:{sync_server.port}") as channel:
            call = channel.unary_unary(METHOD)
            assert await call(b"warm", timeout=10) == b"mraw"
            assert sync_server.received.acquire(timeout=1) and sync_server.answered.acquire(timeout=1)
            drain = WakeupDrain()
            assert drain.install() and drain.installed and drain.unsupported is None
            try:
                sync_server.release.clear()  # the server holds every call until the loop is blocked
                pending = [asyncio.ensure_future(call(b"%d" % i, timeout=10)) for i in range(CALLS)]
                await asyncio.sleep(0)  # the calls go out
                problems = []

                def block_until_all_answered() -> None:
                    # The loop is stopped here (the GIL free) while the server answers every call
                    # and the answers' completions reach the poller thread, one byte each.
                    if not all(sync_server.received.acquire(timeout=10) for _ in range(CALLS)):
                        problems.append("the server did not receive every call")
                    sync_server.release.set()
                    if not all(sync_server.answered.acquire(timeout=10) for _ in range(CALLS)):
                        problems.append("the server did not answer every call")
                    deadline = time.monotonic() + 10
                    while waiting_bytes(drain._sock) < CALLS and time.monotonic() < deadline:
                        time.sleep(0.001)
                    if waiting_bytes(drain._sock) < CALLS:
                        problems.append(f"only {waiting_bytes(drain._sock)} wake-up bytes waiting")

                asyncio.get_running_loop().call_soon(block_until_all_answered)
                assert await asyncio.gather(*pending) == [(b"%d" % i)[::-1] for i in range(CALLS)]
                assert problems == []
            finally:
                sync_server.release.set()
                drain.uninstall()
            assert not drain.installed
            # One call finishes at least one operation; they were all waiting at one wake-up.
            assert drain.bytes_read >= CALLS
            assert drain.most_read >= CALLS, (drain.most_read, drain.wakeups, drain.bytes_read)
            # Taken at once: reading one byte per pass would need a wake-up per byte.
            assert drain.wakeups <= CALLS // 2, (drain.wakeups, drain.bytes_read)
            # grpc.aio's own reader is back: calls still complete.
            assert await asyncio.gather(*(call(b"ab", timeout=10) for _ in range(5))) == [b"ba"] * 5

    run_on(loop, main())


async def test_installing_twice_is_an_error_and_uninstalling_twice_is_not(sync_server):
    async with grpc.aio.insecure_channel(f"127.0.0.1:{sync_server.port}") as channel:
        assert await channel.unary_unary(METHOD)(b"x", timeout=10) == b"x"
        drain = WakeupDrain()
        assert drain.install()
        with pytest.raises(RuntimeError, match="already installed"):
            drain.install()
        drain.uninstall()
        drain.uninstall()
        assert await channel.unary_unary(METHOD)(b"xy", timeout=10) == b"yx"


async def test_without_grpcio_internals_it_changes_nothing(sync_server, caplog):
    async with grpc.aio.insecure_channel(f"127.0.0.1:{sync_server.port}") as channel:
        drain = WakeupDrain()
        assert not drain.install(cygrpc=types.SimpleNamespace())
        assert not drain.installed
        assert drain.unsupported.endswith("has no PollerCompletionQueue/_BoundEventLoop")
        assert any("gRPC wake-up drain off" in r.getMessage() for r in caplog.records)
        # Types of which no object binds this loop: the count found is the reason.
        unbound = types.SimpleNamespace(PollerCompletionQueue=type("Queue", (), {}), _BoundEventLoop=type("B", (), {}))
        assert not drain.install(cygrpc=unbound)
        assert drain.unsupported == "expected 1 open binding of gRPC's poller to this loop; got 0"
        assert await channel.unary_unary(METHOD)(b"ab", timeout=10) == b"ba"
        drain.uninstall()


async def test_each_wake_up_leaves_grpc_aio_exactly_its_one_byte():
    # A socketpair and a recorder in place of grpc.aio's queue: what grpc.aio's own callback
    # finds when the drain hands over, for 1, 2 and 40 bytes waiting.
    loop = asyncio.get_running_loop()
    read, write = socket.socketpair()
    read.setblocking(False)
    seen = []
    called = asyncio.Event()

    def handle_events(context_loop) -> None:
        assert context_loop is loop
        seen.append(waiting_bytes(read))
        read.recv(1)  # as grpc.aio's _handle_events does
        called.set()

    drain = WakeupDrain()
    drain.attach(loop, read, handle_events)
    try:
        for n in (1, 2, 40):
            called.clear()
            write.send(b"1" * n)
            await asyncio.wait_for(called.wait(), 5)
            assert seen[-1] == 1, (n, seen)
            assert waiting_bytes(read) == 0
        assert seen == [1, 1, 1]
        assert (drain.wakeups, drain.bytes_read, drain.most_read) == (3, 43, 40)
    finally:
        drain.uninstall()
        loop.remove_reader(read)
        read.close()
        write.close()
