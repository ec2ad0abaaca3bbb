"""Through a server, under the fixed policy: a request whose V2 `timeout` has passed by the time it
reaches the batcher is answered DEADLINE_EXCEEDED at once, without ever being queued, and the
requests around it are untouched."""

from __future__ import annotations

import asyncio
import re

import grpc
import numpy as np
import pytest

from wok.codec import decode_response, encode_request
from wok.errors import DeadlineExceeded
from wok.v2pb import grpc_service_pb2_grpc as pb_grpc

PASSED = r"request to model 'slow' arrived \d+\.\d ms after its deadline passed; it was not queued"


def watch_submits(monkeypatch, batcher) -> asyncio.Queue:
    """Each call of batcher.submit puts (queued before, queued after, what it raised or None)."""
    seen: asyncio.Queue = asyncio.Queue()
    submit = batcher.submit

    def watched(*args, **kwargs):
        before = batcher.queued
        try:
            p = submit(*args, **kwargs)
        except Exception as exc:
            seen.put_nowait((before, batcher.queued, exc))
            raise
        seen.put_nowait((before, batcher.queued, None))
        return p

    monkeypatch.setattr(batcher, "submit", watched)
    return seen


async def test_a_passed_timeout_under_the_fixed_policy_is_refused_at_arrival_not_queued(
    serve, slow_repository, monkeypatch
):
    # A minute's delay window and batches of 2: an expired request let into the queue would wait
    # there (or fill the live request's batch); the test learns at the batcher's door which it did.
    repo = slow_repository(sleep_ms=1, max_batch_size=2, delay_ms=60_000)
    async with serve(repository=repo) as server:
        batcher = server.runtimes["slow"].batcher
        assert batcher.slo is None
        seen = watch_submits(monkeypatch, batcher)
        ones = np.ones((1, 4), np.float32)
        x = {"INPUT0": ones}
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            stub = pb_grpc.GRPCInferenceServiceStub(ch)

            async def expired_is_refused_at_the_door(queued: int) -> None:
                # A V2 timeout of 1 µs has passed by then: decoding alone takes longer.
                call = asyncio.ensure_future(stub.ModelInfer(encode_request("slow", x, timeout_us=1)))
                try:
                    before, after, exc = await seen.get()
                    assert isinstance(exc, DeadlineExceeded), f"the expired request was queued ({before} -> {after})"
                    assert before == after == queued
                    with pytest.raises(grpc.aio.AioRpcError) as info:
                        await call
                finally:
                    call.cancel()
                assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
                assert re.fullmatch(PASSED, info.value.details())
                assert "retry-after-ms" not in dict(info.value.trailing_metadata() or ())

            await expired_is_refused_at_the_door(queued=0)
            first = asyncio.ensure_future(stub.ModelInfer(encode_request("slow", x)))
            assert await seen.get() == (0, 1, None)
            await expired_is_refused_at_the_door(queued=1)
            second = await stub.ModelInfer(
                encode_request("slow", {"INPUT0": 3 * ones})
            )  # fills the batch: it flushes by size
            assert (await seen.get())[2] is None
            np.testing.assert_array_equal(decode_response(await first)["OUTPUT0"], 2 * ones)
            np.testing.assert_array_equal(decode_response(second)["OUTPUT0"], 6 * ones)
        assert batcher.queued == 0
        stats, m = server.runtimes["slow"].stats, server.metrics.models["slow"]
        assert stats.flushes == {"size": 1} and stats.inference_count == 2 and stats.fail.count == 2
        assert m.rejections["deadline"] == 2 and m.rejections["deadline_unmeetable"] == 0
        assert m.responses == {"OK": 2, "DEADLINE_EXCEEDED": 2}
