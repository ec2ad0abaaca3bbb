"""Counting the calls that end inside grpc.aio before wok's handler runs.

grpc.aio (1.85) runs each call in a task of its own: it looks the handler up (running the server
interceptors), then, for a unary call, awaits the request message, and only then calls the handler.
When gRPC's core reports the call ended first (its deadline passed, or its client cancelled), the
task ends there: the message read returns nothing, or the task is cancelled, and the handler never
runs. Under overload this is a common end of a call (the event loop is late to take what core has
already accepted), and without this module no wok counter sees such a call, while its client gets
DEADLINE_EXCEEDED or CANCELLED.

`UnhandledCalls` is a server interceptor (public grpc.aio API) that runs inside the call's task:
for the methods it watches it keeps the task until the handler says it has started (`started()`,
its first line). `sweep()` counts, once, each task kept that has ended: at every scrape (so a
scrape reads every such call ended by then), at the server's stop, and whenever the tasks kept have
doubled since the last sweep (so that they stay few without a scrape). Per call this costs a dict
entry and a context variable, not a done callback per task: see docs/metrics.md for the cost.

It does not tell a deadline from a cancel: before the handler, grpc.aio holds the call's deadline
only in its private per-call state (the interceptor is given the method and the metadata, and core
takes `grpc-timeout` out of the metadata), so the count has no status code.

Streams are not watched: grpc.aio calls a stream's handler without awaiting anything after the
interceptors, so a stream always reaches wok's handler (which counts each request it reads).
Installed after the bearer-token interceptor, whose refusals never reach it: those are not counted.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from contextvars import ContextVar

import grpc

from .accept import check_method_name

# The task of the watched call running in this context: the interceptor sets it, the handler reads
# it back (cheaper than a second asyncio.current_task()). Each task runs in a context of its own.
_CALL: ContextVar[asyncio.Task | None] = ContextVar("unhandled_call", default=None)
# Sweep when this many tasks are kept, at least (then at twice what the last sweep left).
SWEEP_AT = 1024


class UnhandledCalls(grpc.aio.ServerInterceptor):
    """Counts, by method, the calls of `methods` whose task ended before their handler's `started()`.

    Build it on the event loop that serves the calls. `record(method)` is called once for each
    such call, from `sweep()`.
    """

    def __init__(self, methods: Iterable[str], record: Callable[[str], None], *, sweep_at: int = SWEEP_AT) -> None:
        self.methods = frozenset(methods)
        for method in self.methods:
            check_method_name(method)
        if sweep_at < 1:
            raise ValueError(f"sweep_at: expected >= 1; got {sweep_at}")
        self._record = record
        # Passed to current_task: without it, each call would ask for the running loop first.
        self._loop = asyncio.get_running_loop()
        # The tasks of watched calls whose handler has not started, by task: the method.
        self._waiting: dict[asyncio.Task, str] = {}
        self._min_sweep = sweep_at
        self._sweep_at = sweep_at

    @property
    def waiting(self) -> int:
        """Watched calls kept: between the interceptors and their handler, or ended there since the last sweep."""
        return len(self._waiting)

    # Not a coroutine function: grpc.aio awaits what this returns, and handing back the next
    # interceptor's awaitable saves a coroutine of our own on every call.
    def intercept_service(self, continuation, handler_call_details):
        method = handler_call_details.method
        if method in self.methods:
            task = asyncio.current_task(self._loop)
            if task is not None:
                waiting = self._waiting
                waiting[task] = method
                _CALL.set(task)
                if len(waiting) >= self._sweep_at:
                    self.sweep()
        return continuation(handler_call_details)

    def started(self) -> None:
        """Called first thing by a watched method's handler, inside the call's task."""
        self._waiting.pop(_CALL.get(), None)
        # The task's own context held the task: without this each handled call's task would be a
        # reference cycle, freed by the cyclic collector rather than when grpc.aio drops it.
        _CALL.set(None)

    def sweep(self) -> int:
        """Count each kept call whose task has ended (its handler never started); returns how many."""
        waiting = self._waiting
        ended = [task for task in waiting if task.done()]
        for task in ended:
            self._record(waiting.pop(task))
        self._sweep_at = max(self._min_sweep, 2 * len(waiting))
        return len(ended)
