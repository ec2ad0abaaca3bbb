"""`cpu_wakeup_latency_us`: the server holds the CPUs' wake-up bound while it serves, and drops it at stop."""

from __future__ import annotations

import os

import grpc
import numpy as np
import pytest

from wok.codec import encode_request
from wok.cpulatency import DEVICE, read_constraint
from wok.v2pb import grpc_service_pb2_grpc as pb_grpc

pytestmark = pytest.mark.skipif(
    not os.access(DEVICE, os.W_OK), reason=f"{DEVICE} is missing or not writable by this user (root's by default)"
)


async def test_the_bound_holds_from_start_to_stop_and_requests_are_answered(serve):
    before = read_constraint()
    assert before > 0, "another process holds the CPUs at 0 µs; the test cannot tell this server's request apart"
    async with serve(models=("mlp",), cpu_wakeup_latency_us=0) as server:
        assert read_constraint() == 0
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            reply = await stub.ModelInfer(encode_request("mlp", {"INPUT0": np.ones((1, 256), np.float32)}))
            assert reply.outputs[0].name == "OUTPUT0"
        assert read_constraint() == 0
    assert read_constraint() == before


async def test_without_the_setting_the_server_requests_nothing(serve):
    before = read_constraint()
    async with serve(models=("mlp",)) as server:
        assert server.cpu_latency is None
        assert read_constraint() == before
