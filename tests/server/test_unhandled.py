"""UnhandledCalls (server/unhandled.py) on real tasks: what it keeps, counts and sweeps."""

from __future__ import annotations

import asyncio
import gc
import re
import weakref
from types import SimpleNamespace

import pytest

from wok.unhandled import UnhandledCalls

INFER = "/inference.GRPCInferenceService/ModelInfer"


async def _call(u: UnhandledCalls, method: str, handler_runs: bool) -> None:
    """What grpc.aio does in a call's task: the interceptors, then (or not) the handler."""
    await u.intercept_service(lambda details: asyncio.sleep(0), SimpleNamespace(method=method, invocation_metadata=()))
    if handler_runs:
        u.started()


async def test_calls_ended_before_their_handler_are_swept_once_and_others_are_not_kept():
    counted: list[str] = []
    u = UnhandledCalls((INFER,), counted.append, sweep_at=4)
    for handler_runs in (True, False, True):
        await asyncio.get_running_loop().create_task(_call(u, INFER, handler_runs))
    await asyncio.get_running_loop().create_task(_call(u, "/inference.GRPCInferenceService/ModelReady", False))
    assert counted == [] and u.waiting == 1  # the ended one waits for a sweep
    assert u.sweep() == 1 and counted == [INFER] and u.waiting == 0
    assert u.sweep() == 0 and counted == [INFER]


async def test_the_kept_calls_are_swept_without_a_scrape_when_they_reach_the_threshold():
    counted: list[str] = []
    u = UnhandledCalls((INFER,), counted.append, sweep_at=4)
    for _ in range(4):  # the 4th call's interceptor sweeps the 3 ended before it
        await asyncio.get_running_loop().create_task(_call(u, INFER, False))
    assert counted == [INFER] * 3 and u.waiting == 1


async def test_a_handled_calls_task_is_freed_without_the_cyclic_collector():
    u = UnhandledCalls((INFER,), print)
    task = asyncio.get_running_loop().create_task(_call(u, INFER, True))
    await task
    await asyncio.sleep(0)  # the awaiting task's wakeup handle, which holds it, runs
    gone = weakref.ref(task)
    gc.disable()
    try:
        del task
        assert gone() is None  # its context no longer holds it
    finally:
        gc.enable()


async def test_method_names_are_checked():
    with pytest.raises(ValueError, match=re.escape("'/package.Service/Method'; got 'ModelInfer'")):
        UnhandledCalls(("ModelInfer",), print)
    with pytest.raises(ValueError, match=re.escape("sweep_at: expected >= 1; got 0")):
        UnhandledCalls((INFER,), print, sweep_at=0)
