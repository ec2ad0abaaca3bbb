"""Let grpc.aio hand the event loop all of gRPC's finished operations in one pass, not one.

grpc.aio's poller thread takes each finished operation from gRPC's core, queues it, and writes
one byte to a socket the event loop watches. The loop's callback for that socket reads one byte
and then runs every queued operation. Under load the bytes come faster than the loop's passes:
each pass reads one, the rest stay, the socket's buffer fills (278 one-byte writes on Linux),
and the poller thread blocks in `write` until the loop reads again. From then on gRPC delivers
one operation per loop pass, about four per unary call, whatever the calls waiting
(`bench/accept_rate.py --drain`, docs/performance.md "The unary knee").

`WakeupDrain` puts a callback of its own on that socket: it reads all but one of the bytes
waiting, then calls grpc.aio's callback, which reads the last and runs every queued operation.
No operation is skipped: the poller queues an operation before it writes its byte, so a byte
read here stands for an operation already queued, and grpc.aio's callback that follows runs it.

It reaches grpc.aio's private objects (`PollerCompletionQueue`, `_BoundEventLoop`) through the
garbage collector, on the grpcio versions in `wok.accept.CHECKED_GRPCIO` only. Where they are not
as expected (another grpcio, or another engine through `GRPC_ASYNCIO_ENGINE`), `install()` logs
why and changes nothing.
"""

from __future__ import annotations

import asyncio
import fcntl
import functools
import gc
import logging
import sys
import termios
from typing import Any

import grpc

from .accept import grpcio_unchecked

log = logging.getLogger("wok.server")


def _find(loop: asyncio.AbstractEventLoop, cygrpc: Any) -> tuple[Any, Any] | str:
    """(completion queue, this loop's read socket), or why they cannot be used."""
    poller_type = getattr(cygrpc, "PollerCompletionQueue", None)
    bound_type = getattr(cygrpc, "_BoundEventLoop", None)
    if poller_type is None or bound_type is None:
        return f"grpcio {grpc.__version__} has no PollerCompletionQueue/_BoundEventLoop"
    # A queue gRPC has shut down (all its servers and channels gone) may linger until collected,
    # with its binding to this loop: its socket is closed.
    bindings = [
        o
        for o in gc.get_objects()
        if type(o) is bound_type and getattr(o, "loop", None) is loop and _is_open(getattr(o, "read_socket", None))
    ]
    if len(bindings) != 1:
        return f"expected 1 open binding of gRPC's poller to this loop; got {len(bindings)}"
    sock = bindings[0].read_socket
    queues = [o for o in gc.get_referrers(sock) if type(o) is poller_type]
    if len(queues) != 1 or not callable(getattr(queues[0], "_handle_events", None)):
        return f"grpcio {grpc.__version__}: the poller queue reading this loop's socket is not reachable"
    if sock.getblocking():
        # grpc.aio's own read of the last byte would then block if another loop took it first.
        return "the poller's read socket is blocking"
    return queues[0], sock


def _is_open(sock: Any) -> bool:
    fileno = getattr(sock, "fileno", None)
    return callable(fileno) and fileno() >= 0


class WakeupDrain:
    """Install on the running loop after gRPC's first server or channel there; uninstall at the end."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sock: Any = None
        self._handle_events: Any = None
        self.unsupported: str | None = None
        # Wake-ups handled, the bytes they took (grpc.aio's own one included), and the most at one.
        self.wakeups = 0
        self.bytes_read = 0
        self.most_read = 0

    @property
    def installed(self) -> bool:
        return self._sock is not None

    def install(self, cygrpc: Any = None) -> bool:
        if self._sock is not None:
            raise RuntimeError("WakeupDrain already installed")
        if cygrpc is None:
            from grpc._cython import cygrpc
        loop = asyncio.get_running_loop()
        found = grpcio_unchecked() or _find(loop, cygrpc)
        if isinstance(found, str):
            self.unsupported = found
            log.warning("gRPC wake-up drain off: %s", found)
            return False
        queue, sock = found
        self.attach(loop, sock, queue._handle_events)
        return True

    def attach(self, loop: asyncio.AbstractEventLoop, sock: Any, handle_events: Any) -> None:
        """Read `sock` on `loop` as a wake-up socket whose queue `handle_events(loop)` runs (install's second half)."""
        self._loop, self._sock, self._handle_events = loop, sock, handle_events
        loop.add_reader(sock, self._on_readable, sock.fileno(), bytearray(4))

    def _on_readable(self, fd: int, count: bytearray) -> None:
        fcntl.ioctl(fd, termios.FIONREAD, count)
        waiting = int.from_bytes(count, sys.byteorder)
        taken = min(waiting, 1)
        if waiting > 1:
            try:
                taken += len(self._sock.recv(waiting - 1))
            except BlockingIOError:
                # Another loop bound to the same poller took the bytes first; its callback runs
                # the queue and hands this loop's operations back to it.
                pass
        self.wakeups += 1
        self.bytes_read += taken
        if taken > self.most_read:
            self.most_read = taken
        self._handle_events(self._loop)

    def uninstall(self) -> None:
        """Put grpc.aio's own callback back, unless gRPC has closed the socket meanwhile."""
        sock, loop = self._sock, self._loop
        self._sock = self._loop = None
        if sock is None or loop is None or sock.fileno() < 0 or loop.is_closed():
            return
        loop.add_reader(sock, functools.partial(self._handle_events, loop))
