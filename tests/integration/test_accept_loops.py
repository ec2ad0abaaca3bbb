"""`accept_loops`: several gRPC servers on one port (SO_REUSEPORT), each accepting calls.

grpc.aio accepts one call per pass of the event loop and server; these servers share the
port, so the kernel spreads connections over them. Each must serve on its own, stop with
the server, and a port another socket holds must still be refused.
"""

from __future__ import annotations

import asyncio
import socket

import grpc
import numpy as np
import pytest

from wok.app import WokServer, build_repository
from wok.codec import decode_response, encode_request
from wok.config import server_settings
from wok.v2pb import grpc_service_pb2_grpc as pb_grpc

X = np.random.default_rng(3).standard_normal((1, 256), dtype=np.float32)
# A channel of its own connection: grpc shares subchannels between a process's channels otherwise.
OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]


async def _infer_on_new_connections(port: int, n: int) -> list[np.ndarray]:
    async def one() -> np.ndarray:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=OWN_CONNECTION) as ch:
            resp = await pb_grpc.GRPCInferenceServiceStub(ch).ModelInfer(
                encode_request("mlp", {"INPUT0": X}), timeout=10
            )
            return decode_response(resp)["OUTPUT0"]

    return await asyncio.gather(*(one() for _ in range(n)))


async def test_every_accept_loop_serves_the_one_port_until_the_last(serve):
    async with serve(models=("mlp",), accept_loops=3) as server:
        servers = server._grpcs
        assert len(servers) == 3
        want = (await _infer_on_new_connections(server.port, 1))[0]
        for out in await _infer_on_new_connections(server.port, 12):
            np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)
        # Stop all but one, one at a time: new connections still reach a server on the port
        # each time, so the last one listens there and the others' stop does not close it.
        # (Which server a connection lands on is the kernel's hash; this does not show that
        # each one took some.)
        for s in servers[:-1]:
            await s.stop(0)
            for out in await _infer_on_new_connections(server.port, 4):
                np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)
    # serve() stopped the last one with the server: the port is closed.
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await _infer_on_new_connections(server.port, 1)
    assert info.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


async def test_a_port_another_socket_holds_is_refused_with_several_accept_loops():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        s = server_settings(grpc_port=port, metrics_port=None, demo_models=("mlp",), accept_loops=2)
        server = WokServer(s, build_repository(s, {}))
        try:
            with pytest.raises(OSError, match=rf"cannot bind gRPC to 127\.0\.0\.1:{port}: "):
                await server.start()
            assert server._grpcs == []
        finally:
            await server.stop(grace=0)


def test_accept_loops_out_of_range_are_refused():
    with pytest.raises(Exception, match=r"accept_loops: Input should be greater than or equal to 1 \(got 0\)"):
        server_settings(accept_loops=0)
    with pytest.raises(Exception, match=r"accept_loops: Input should be less than or equal to 16 \(got 17\)"):
        server_settings(accept_loops=17)
