"""More accepting tasks for grpc.aio's unary calls than its one per method.

grpc.aio (1.6x on) accepts each registered method's calls through one chain: its server task
starts a task per `request_registered_call`, waits for it with `asyncio.wait`, and only then
asks gRPC's core for the next call. Each accepted call costs that chain about five passes of
the event loop, one after another, whatever the number of calls waiting (measured with
`bench/accept_rate.py --accept-tasks`, docs/performance.md "The unary knee"). A busy loop's
passes are long, so under load the chain, not the loop's work, caps the unary rate.

`AcceptTasks` runs N more chains for the methods it is given. Each asks gRPC for one call,
awaits it directly (about two passes), hands it to grpc.aio's own per-call code, and asks
again. Calls accepted here run exactly as grpc.aio's: the same handler lookup, interceptors,
deserialisers, cancellation and status handling, because they are grpc.aio's own functions.

Those functions are private to grpcio. `unsupported_reason` checks that every one is there with
the parameters this module passes; where one is not (another grpcio), `start()` logs why and
runs nothing, and grpc.aio's own chain serves alone, as without this module. A server built with
`maximum_concurrent_rpcs` must not use this: calls accepted here do not pass its limiter.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import grpc

log = logging.getLogger("wok.server")

# grpcio minor versions whose aio server (`_server_main_loop` and what it calls per call) was
# read against this module; on any other the tasks stay off. Parameter lists alone cannot show a
# new per-call step around them. To add a version: read its server.pyx.pxi, then run
# tests/server/test_accept.py on it.
CHECKED_GRPCIO = ("1.85",)

# The parameters each private entry point must take, in order, for the calls below to be right.
_SIGNATURES = {
    "_handle_rpc": ("method_name", "method_resolver", "interceptors", "rpc_state", "loop", "concurrency_exceeded"),
    "_schedule_rpc_coro": ("rpc_coro", "rpc_state", "loop", "method_name"),
}
_REQUEST_SIGNATURE = ("self", "method")


def _parameters(func: Any) -> tuple[str, ...] | None:
    code = getattr(func, "__code__", None)
    if code is None:
        return None
    return tuple(code.co_varnames[: code.co_argcount])


def grpcio_unchecked(version: str = grpc.__version__) -> str | None:
    """Why this grpcio version's internals are not relied on, or None when they were checked."""
    if ".".join(version.split(".")[:2]) in CHECKED_GRPCIO:
        return None
    return f"grpcio {version} is not among the versions checked ({', '.join(CHECKED_GRPCIO)})"


def unsupported_reason(server: grpc.aio.Server, cygrpc: Any = None, version: str = grpc.__version__) -> str | None:
    """Why `AcceptTasks` cannot run on this grpcio, or None when it can."""
    unchecked = grpcio_unchecked(version)
    if unchecked is not None:
        return unchecked
    if cygrpc is None:
        from grpc._cython import cygrpc
    core_server = getattr(server, "_server", None)
    request = getattr(type(core_server), "_request_registered_call", None)
    if request is None or _parameters(request) != _REQUEST_SIGNATURE:
        return f"grpcio {grpc.__version__} has no AioServer._request_registered_call(method)"
    if not hasattr(core_server, "is_running"):
        return f"grpcio {grpc.__version__} has no AioServer.is_running()"
    if getattr(cygrpc, "_MethodResolver", None) is None:
        return f"grpcio {grpc.__version__} has no _MethodResolver"
    for name, expected in _SIGNATURES.items():
        got = _parameters(getattr(cygrpc, name, None))
        if got != expected:
            return f"grpcio {grpc.__version__}: {name}: expected parameters {expected}; got {got}"
    return None


def check_method_name(method: str) -> None:
    """Raise ValueError unless `method` is a fully qualified gRPC method name, as grpc.aio looks handlers up by."""
    if not method.startswith("/") or method.count("/") != 2:
        raise ValueError(f"method name: expected '/package.Service/Method'; got {method!r}")


class AcceptTasks:
    """N tasks per method, each accepting that method's calls one at a time, beside grpc.aio's own.

    Start after the server has started (its methods registered with `add_registered_method_handlers`
    under the same names); stop after the server has stopped: the server's shutdown fails the calls
    the tasks are waiting for, which ends them. Stopping earlier would cancel a request gRPC may
    already have matched to a call, and that call would never be answered.
    """

    def __init__(
        self,
        server: grpc.aio.Server,
        handlers: Mapping[str, grpc.RpcMethodHandler],
        tasks_per_method: int,
        interceptors: Sequence[Any] = (),
    ) -> None:
        """`handlers` maps fully qualified method names ('/package.Service/Method') to their handlers."""
        if tasks_per_method < 0:
            raise ValueError(f"tasks_per_method: expected >= 0; got {tasks_per_method}")
        for method in handlers:
            check_method_name(method)
        self._server = server
        self._handlers = dict(handlers)
        self._per_method = tasks_per_method
        self._interceptors = tuple(interceptors)
        self._chains: list[asyncio.Task[None]] = []
        self._calls: set[asyncio.Task[Any]] = set()
        # Calls accepted by each chain, by method: tests and the docs read it.
        self.accepted: dict[str, list[int]] = {m: [0] * tasks_per_method for m in self._handlers}
        self.unsupported: str | None = None

    @property
    def running(self) -> int:
        """Chains still accepting."""
        return sum(not c.done() for c in self._chains)

    def start(self, cygrpc: Any = None) -> None:
        """Start the tasks on the running loop; `cygrpc` stands in for grpcio's module in tests."""
        if self._chains:
            raise RuntimeError("AcceptTasks already started")
        if self._per_method == 0 or not self._handlers:
            return
        if cygrpc is None:
            from grpc._cython import cygrpc
        self.unsupported = unsupported_reason(self._server, cygrpc)
        if self.unsupported is not None:
            log.warning("extra accept tasks off: %s; grpc.aio's own accept chain serves alone", self.unsupported)
            return
        if not self._server._server.is_running():
            raise RuntimeError("start the gRPC server before its AcceptTasks")

        loop = asyncio.get_running_loop()
        resolver = cygrpc._MethodResolver([], self._handlers)
        for method in self._handlers:
            for i in range(self._per_method):
                chain = loop.create_task(
                    self._chain(cygrpc, resolver, method, i, loop), name=f"wok-accept-{i}:{method}"
                )
                chain.add_done_callback(self._chain_ended)
                self._chains.append(chain)

    @staticmethod
    def _chain_ended(chain: asyncio.Task[None]) -> None:
        # A chain ends quietly at the server's stop; anything else is a bug worth a traceback,
        # which stop()'s gather would otherwise swallow.
        if not chain.cancelled() and chain.exception() is not None:
            log.error("%s failed", chain.get_name(), exc_info=chain.exception())

    async def _chain(self, cygrpc: Any, resolver: Any, method: str, index: int, loop: Any) -> None:
        core_server = self._server._server
        name = method.encode()
        counts = self.accepted[method]
        while core_server.is_running():
            try:
                rpc_state = await core_server._request_registered_call(name)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the server's shutdown fails the waiting request: the normal end
                if core_server.is_running():
                    log.error("accept task %d for %s ended: %r", index, method, exc)
                return
            counts[index] += 1
            rpc = cygrpc._handle_rpc(method, resolver, self._interceptors, rpc_state, loop, False)
            call = loop.create_task(cygrpc._schedule_rpc_coro(rpc, rpc_state, loop, method), name="rpc_task")
            # The loop keeps only a weak reference to a task.
            self._calls.add(call)
            call.add_done_callback(self._calls.discard)

    async def stop(self, timeout: float = 1.0) -> None:
        """Wait for the chains to end after the server's stop; cancel any left after `timeout` seconds."""
        if not self._chains:
            return
        _, pending = await asyncio.wait(self._chains, timeout=timeout)
        for chain in pending:
            chain.cancel()
        await asyncio.gather(*self._chains, return_exceptions=True)
        if pending:
            log.warning("%d accept task(s) still waiting %.1f s after the server stopped", len(pending), timeout)
