"""A refused ModelInfer call's request, decoded inputs and frames are freed as the call ends, by reference
counting, not left to the cyclic GC.

grpc.aio keeps an aborted call's error in the call's state, which the call's context and its done callbacks
refer back to; the error's traceback held the handler's frames and with them the request. Such a cycle
waits for a collection of the oldest generation, which a server holding torch's objects runs rarely:
refused requests of 58.6 MiB each grew an idle `wok serve` by about 370 MiB every 8 of them (282 MiB to
3,085 MiB after 56).
"""

from __future__ import annotations

import asyncio
import gc

import grpc
import numpy as np

from wok.codec import encode_request
from wok.v2pb import grpc_service_pb2 as pb
from wok.v2pb import grpc_service_pb2_grpc as pb_grpc

ROUNDS = 5
TAG = "refused, to be freed"  # the id of these requests: the server's copies of them carry it too


REFUSED = {
    "rows past max_batch_size": encode_request("mlp", {"INPUT0": np.ones((600, 256), np.float32)}, request_id=TAG),
    "wrong datatype": encode_request("mlp", {"INPUT0": np.ones((2, 256), np.int64)}, request_id=TAG),
    "unknown model": encode_request("nope", {"INPUT0": np.ones((1, 256), np.float32)}, request_id=TAG),
    "ids past the table (the model's batch fails)": encode_request(
        "recsys", {"dense": np.ones((1, 13), np.float32), "ids": np.full((1, 3), 10**9, np.int64)}, request_id=TAG
    ),
}


def served_requests() -> int:
    """The server's parsed copies of REFUSED alive (this test's own are REFUSED's values)."""
    return sum(1 for o in gc.get_objects() if type(o) is pb.ModelInferRequest and o.id == TAG) - len(REFUSED)


async def refuse_each(stub, server) -> None:
    for what, req in REFUSED.items():
        try:
            await stub.ModelInfer(req, timeout=30)
        except grpc.aio.AioRpcError as exc:
            assert exc.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INTERNAL)
        else:
            raise AssertionError(f"{what}: expected a refusal, got an answer")
        # The client has the status before the call's task has ended and run its done callbacks, the
        # service's count of answers not written (`_answer_written`) among them.
        service = server.service
        while service.unwritten:
            service._written.clear()
            await asyncio.wait_for(service._written.wait(), 10)


async def test_refused_calls_free_their_requests_by_reference_counting(serve):
    async with serve(models=("mlp", "recsys")) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            await refuse_each(stub, server)  # first calls: caches, lazy imports
            gc.collect()
            gc.disable()  # what reference counting alone frees
            try:
                for _ in range(ROUNDS):
                    await refuse_each(stub, server)
                kept = served_requests()
            finally:
                gc.enable()
    assert kept == 0, f"expected every refused call's request freed, got {kept} of {ROUNDS * len(REFUSED)} kept"
