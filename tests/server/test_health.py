"""wok.health: Watch streams as balancers hold them, through a real server's stop."""

from __future__ import annotations

import asyncio
import logging

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from .conftest import ends_with_the_stop

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
READ_S = 5.0
CHECK = "/grpc.health.v1.Health/Check"
WATCH = "/grpc.health.v1.Health/Watch"


async def _watchers(server, n: int) -> None:
    """Until the server holds exactly `n` Watch handlers (a cancelled one takes a moment to end)."""

    async def settled() -> None:
        while server._health.watching != n:
            await asyncio.sleep(0.005)

    await asyncio.wait_for(settled(), READ_S)


async def test_a_watcher_sees_the_drain_after_another_watcher_of_its_service_left(serve):
    async with serve(models=("mlp",)) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            leaving = stub.Watch(health_pb2.HealthCheckRequest(service=""))
            staying = stub.Watch(health_pb2.HealthCheckRequest(service=""))
            other = stub.Watch(health_pb2.HealthCheckRequest(service="mlp"))
            for watch in (leaving, staying, other):
                assert (await asyncio.wait_for(watch.read(), READ_S)).status == SERVING
            leaving.cancel()
            await _watchers(server, 2)
            stopping = asyncio.ensure_future(server.stop(grace=5))
            # grpcio-health-checking's servicer dropped the shared condition with the watcher that
            # left: the one that stayed never heard of the drain.
            for watch in (staying, other):
                assert (await asyncio.wait_for(watch.read(), READ_S)).status == NOT_SERVING
            # And the streams end, rather than hold gRPC's stop for its grace.
            for watch in (staying, other):
                await ends_with_the_stop(watch)
            await stopping
            assert server._health.watching == 0


async def test_watches_on_the_health_port_end_with_the_stop_too(serve):
    async with serve(models=("mlp",), health_port=0) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.health_port}") as ch:
            watch = health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest(service=""))
            assert (await asyncio.wait_for(watch.read(), READ_S)).status == SERVING
            stopping = asyncio.ensure_future(server.stop(grace=5))
            assert (await asyncio.wait_for(watch.read(), READ_S)).status == NOT_SERVING
            await ends_with_the_stop(watch)
            await stopping


async def test_an_unknown_service_is_not_found_by_check_and_unknown_to_watch(serve):
    async with serve(models=("mlp",)) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.Check(health_pb2.HealthCheckRequest(service="nope"), timeout=READ_S)
            assert (info.value.code(), info.value.details()) == (grpc.StatusCode.NOT_FOUND, "unknown service 'nope'")
            watch = stub.Watch(health_pb2.HealthCheckRequest(service="nope"))
            assert (await asyncio.wait_for(watch.read(), READ_S)).status == SERVICE_UNKNOWN
            stopping = asyncio.ensure_future(server.stop(grace=5))
            # Its status never changes, yet its stream ends with the rest.
            await ends_with_the_stop(watch)
            await stopping


# A field tag whose varint runs past the end of the message: protobuf refuses it.
GARBAGE = b"\xff\xff\xff\xff\x0f"


def assert_unparsed(error: grpc.aio.AioRpcError, message_type: str, method: str) -> None:
    """The call ended with INVALID_ARGUMENT naming the message type, the size and the method."""
    details = error.details()
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, (error.code(), details)
    assert details.startswith(f"message is not a valid {message_type} ({len(GARBAGE)} bytes): "), details
    assert details.endswith(f" (sent to {method})"), details


async def test_bytes_that_are_not_a_health_request_get_invalid_argument_and_log_no_error(serve, caplog):
    # grpc.aio answered UNKNOWN and logged an ERROR with a traceback for each such call: anyone who
    # reaches the probe port (no token, no TLS) could flood the log.
    caplog.set_level(logging.WARNING)
    async with serve(models=("mlp",), health_port=0) as server:
        for port in (server.port, server.health_port):
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                for _ in range(3):
                    with pytest.raises(grpc.aio.AioRpcError) as info:
                        await ch.unary_unary(CHECK)(GARBAGE, timeout=READ_S)
                    assert_unparsed(info.value, "grpc.health.v1.HealthCheckRequest", CHECK)
                    with pytest.raises(grpc.aio.AioRpcError) as info:
                        await ch.unary_stream(WATCH)(GARBAGE, timeout=READ_S).read()
                    assert_unparsed(info.value, "grpc.health.v1.HealthCheckRequest", WATCH)
                # Refused before the servicer: no watcher counted, and a good request is served.
                assert server._health.watching == 0
                stub = health_pb2_grpc.HealthStub(ch)
                assert (await stub.Check(health_pb2.HealthCheckRequest(), timeout=READ_S)).status == SERVING
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, errors
