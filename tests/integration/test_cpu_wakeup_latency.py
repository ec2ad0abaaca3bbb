"""`cpu_wakeup_latency_us`: the server holds the CPUs' wake-up bound while it serves, and drops it at stop."""

from __future__ import annotations

import socket

import grpc
import numpy as np
import pytest

from wok.app import WokServer, build_repository
from wok.codec import encode_request
from wok.config import server_settings
from wok.cpulatency import read_constraint
from wok.v2pb import grpc_service_pb2_grpc as pb_grpc


async def test_the_bound_holds_from_start_to_stop_and_requests_are_answered(serve, cpu_latency_before):
    async with serve(models=("mlp",), cpu_wakeup_latency_us=0) as server:
        assert read_constraint() == 0
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            reply = await stub.ModelInfer(encode_request("mlp", {"INPUT0": np.ones((1, 256), np.float32)}))
            assert reply.outputs[0].name == "OUTPUT0"
        assert read_constraint() == 0
    assert read_constraint() == cpu_latency_before


async def test_without_the_setting_the_server_requests_nothing(serve, cpu_latency_before):
    async with serve(models=("mlp",)) as server:
        assert server.cpu_latency is None
        assert read_constraint() == cpu_latency_before


async def test_a_start_that_fails_after_taking_the_bound_gives_it_back_at_stop(cpu_latency_before):
    # The gRPC port is taken, so the start fails after the bound (taken first) is held; the
    # entry point then calls stop(grace=0), as `wok serve` does.
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        s = server_settings(grpc_port=port, demo_models=("mlp",), metrics_port=None, cpu_wakeup_latency_us=0)
        server = WokServer(s, build_repository(s))
        try:
            with pytest.raises(OSError, match=f"cannot bind the gRPC port to 127.0.0.1:{port}: the port is in use"):
                await server.start()
            assert read_constraint() == 0
        finally:
            await server.stop(grace=0)
    assert not server.cpu_latency.held
    assert read_constraint() == cpu_latency_before


def test_wok_serve_holds_the_bound_it_is_given(start_server, cpu_latency_before):
    sp = start_server("--models", "mlp", "--cpu-wakeup-latency", "0")
    sp.wait_for_line("wok: serving")
    assert read_constraint() == 0
    assert sp.terminate() == 0
    assert read_constraint() == cpu_latency_before
