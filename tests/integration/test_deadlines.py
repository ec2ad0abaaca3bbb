"""Requests past their deadline are dropped before they run; a cancelled call leaves the queue."""

from __future__ import annotations

import asyncio

import grpc
import numpy as np
import pytest

from wok.codec import decode_response, encode_request
from wok.v2pb import grpc_service_pb2 as pb
from wok.v2pb import grpc_service_pb2_grpc as pb_grpc

X = {"INPUT0": np.ones((1, 4), np.float32)}


async def _busy(server, stub):
    """Start a request that occupies the only instance slot; returns its call."""
    call = asyncio.ensure_future(stub.ModelInfer(encode_request("slow", X)))
    while server.runtimes["slow"].batcher.inflight == 0:
        await asyncio.sleep(0.001)
    return call


async def test_v2_timeout_parameter_expires_in_the_queue_with_deadline_exceeded(serve, slow_repository):
    repo = slow_repository(sleep_ms=200, max_batch_size=1, delay_ms=0)
    async with serve(repository=repo) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            stub = pb_grpc.GRPCInferenceServiceStub(ch)
            first = await _busy(server, stub)  # a CPU instance has one slot: the next one queues
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.ModelInfer(encode_request("slow", X, timeout_us=20_000))
            assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            assert "deadline passed before it could run" in info.value.details()
            await first
            stats = server.runtimes["slow"].stats
            assert stats.inference_count == 1 and stats.fail.count == 1


async def test_a_client_deadline_or_cancel_withdraws_the_request_from_the_queue(serve, slow_repository):
    repo = slow_repository(sleep_ms=200, max_batch_size=1, delay_ms=0)
    async with serve(repository=repo) as server:
        batcher = server.runtimes["slow"].batcher
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            stub = pb_grpc.GRPCInferenceServiceStub(ch)
            running = [await _busy(server, stub)]
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.ModelInfer(encode_request("slow", X), timeout=0.05)
            assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            cancelled = asyncio.ensure_future(stub.ModelInfer(encode_request("slow", X)))
            while batcher.queued == 0:
                await asyncio.sleep(0.001)
            cancelled.cancel()
            while batcher.queued:
                await asyncio.sleep(0.001)
            for call in running:
                np.testing.assert_array_equal(decode_response(await call)["OUTPUT0"], np.full((1, 4), 2.0, np.float32))
            stats = (await stub.ModelStatistics(pb.ModelStatisticsRequest(name="slow"))).model_stats[0]
    # Neither the expired nor the cancelled request ever ran.
    assert stats.inference_count == 1
