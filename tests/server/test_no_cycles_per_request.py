"""A served request leaves nothing of wok's to the cyclic collector.

An object in a reference cycle is freed only when the cyclic collector runs, and each run walks every
object it tracks: cycles left by each request make it run more often (server CPU per request), and what
they reach (a batch's requests, their inputs and answers) stays until it does. With the collector off,
the unary calls answered and refused and the stream requests here leave nothing that only it can free,
besides grpc.aio's own: the closure of its handler lookup, one per call (`_find_method_handler`, whose
coroutine keeps its inner function in the scope that function refers to), which wok cannot change.
"""

from __future__ import annotations

import asyncio
import collections
import gc

import grpc
import numpy as np
import pytest

from wok.codec import encode_request
from wok.v2pb import grpc_service_pb2_grpc as pb_grpc

from ..conftest import until

CALLS = 20
GOOD = encode_request("mlp", {"INPUT0": np.ones((1, 256), np.float32)})
BAD = encode_request("mlp", {"INPUT0": np.ones((1, 256), np.int64)})  # wrong datatype: INVALID_ARGUMENT
# grpc.aio's handler lookup: its closure's scope (a Cython type named after the function) and what that reaches.
GRPC_LOOKUP = "_find_method_handler"


async def _unary(stub, req) -> None:
    try:
        await stub.ModelInfer(req, timeout=30)
    except grpc.aio.AioRpcError as exc:
        assert req is BAD and exc.code() == grpc.StatusCode.INVALID_ARGUMENT, exc


async def _stream(stub, reqs) -> None:
    """One request at a time, each its answer before the next: a batch each, as the unary calls one at a time."""
    call = stub.ModelStreamInfer()
    for req in reqs:
        await call.write(req)
        answer = await call.read()
        assert bool(answer.error_message) == (req is BAD), answer.error_message
    await call.done_writing()
    assert await call.read() is grpc.aio.EOF


def _left_to_the_collector() -> collections.Counter:
    """The objects only the cyclic collector would free, by type, less grpc.aio's handler-lookup closures
    and what only they reach."""
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        garbage = list(gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    ids = {id(o) for o in garbage}
    reached = set()
    todo = [o for o in garbage if type(o).__name__.endswith(GRPC_LOOKUP)]
    while todo:
        o = todo.pop()
        if id(o) not in reached:
            reached.add(id(o))
            todo.extend(r for r in gc.get_referents(o) if id(r) in ids)
    return collections.Counter(type(o).__qualname__ for o in garbage if id(o) not in reached)


@pytest.mark.parametrize(
    "kind",
    ["unary one at a time", "unary 8 at a time", "unary refused", "stream", "stream refused"],
)
async def test_requests_leave_no_cycles_of_wok(serve, kind):
    async with serve(models=("mlp",)) as server:
        service = server.service
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            req = BAD if "refused" in kind else GOOD

            async def run() -> None:
                if kind.startswith("stream"):
                    await _stream(stub, [req] * CALLS)
                elif "8 at a time" in kind:
                    for _ in range(CALLS // 8):
                        await asyncio.gather(*(_unary(stub, req) for _ in range(8)))
                else:
                    for _ in range(CALLS):
                        await _unary(stub, req)
                # A client has its answer before the server's call task has ended and let go of the call.
                await until(lambda: service.unwritten == 0 and service.active == 0, "every call ended")

            await run()  # first calls: caches, lazy imports
            gc.collect()
            gc.disable()
            try:
                await run()
                left = _left_to_the_collector()
            finally:
                gc.enable()
    assert not left, f"expected nothing left to the cyclic collector but grpc.aio's handler lookups, got {left}"
