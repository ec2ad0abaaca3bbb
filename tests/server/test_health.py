"""wok.health: Watch streams as balancers hold them, through a real server's stop."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from wok.health import ENDED

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
READ_S = 5.0


async def _watchers(server, n: int) -> None:
    """Until the server holds exactly `n` Watch handlers (a cancelled one takes a moment to end)."""

    async def settled() -> None:
        while server._health.watching != n:
            await asyncio.sleep(0.005)

    await asyncio.wait_for(settled(), READ_S)


async def _ends_with_the_stop(watch) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await asyncio.wait_for(watch.read(), READ_S)
    assert (info.value.code(), info.value.details()) == (grpc.StatusCode.UNAVAILABLE, ENDED)


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
                await _ends_with_the_stop(watch)
            await stopping
            assert server._health.watching == 0


async def test_watches_on_the_health_port_end_with_the_stop_too(serve):
    async with serve(models=("mlp",), health_port=0) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.health_port}") as ch:
            watch = health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest(service=""))
            assert (await asyncio.wait_for(watch.read(), READ_S)).status == SERVING
            stopping = asyncio.ensure_future(server.stop(grace=5))
            assert (await asyncio.wait_for(watch.read(), READ_S)).status == NOT_SERVING
            await _ends_with_the_stop(watch)
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
            await _ends_with_the_stop(watch)
            await stopping
