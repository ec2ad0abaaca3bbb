"""The server's request limit: published by ServerMetadata, and honoured by wok's clients.

gRPC refuses a request over a server's receive limit (4 × --max-request-bytes + 1 MiB on wok)
before the server reads it, and on a stream that refusal ends the whole stream. A wok server
publishes the limit as ServerMetadata's trailing metadata; wok's clients look it up once and
refuse such a request before sending it, so only that request fails.
"""

from __future__ import annotations

import asyncio
import threading

import grpc
import numpy as np
import pytest

from wok.clients import AsyncClient, Client, InferError
from wok.v2pb import grpc_service_pb2 as pb
from wok.v2pb import grpc_service_pb2_grpc as pb_grpc

pytestmark = pytest.mark.timeout(60)

CODE = grpc.StatusCode
# The trailing metadata keys, as docs/security.md documents them for other clients.
MAX_REQUEST_KEY, MAX_MESSAGE_KEY = "wok-max-request-bytes", "wok-max-message-bytes"
MAX_REQUEST = 2048  # one row of mlp (1,024 bytes of FP32 and its names) is under it
LIMIT = 4 * MAX_REQUEST + (1 << 20)  # 1,056,768: gRPC's receive limit on the server
SMALL = {"INPUT0": np.ones((1, 256), np.float32)}
BIG = {"INPUT0": np.ones((1100, 256), np.float32)}  # 1,126,400 bytes of FP32: over LIMIT


def check_refusal(details: str, what: str) -> None:
    assert details.startswith(f"CLIENT: {what} to model 'mlp' is 1,126,4"), details
    assert f"over the server's gRPC limit of {LIMIT:,} bytes" in details, details
    assert f"--max-request-bytes is {MAX_REQUEST:,}" in details, details
    assert "so it was not sent" in details and "raise the server's --max-request-bytes to at least 1,126,4" in details


def check_stream(results) -> None:
    """[small, big, small] on one stream: the big one refused by the client, the others answered."""
    by_id = {r.id: r for r in results}
    assert sorted(by_id) == ["0", "1", "2"], results
    assert by_id["0"].ok and by_id["2"].ok, results
    assert by_id["0"].outputs["OUTPUT0"].shape == (1, 256)
    assert by_id["1"].code == CODE.RESOURCE_EXHAUSTED and by_id["1"].outputs is None
    check_refusal(by_id["1"].error, "stream request '1'")


async def test_server_metadata_publishes_the_request_limit_in_its_trailing_metadata(serve):
    async with serve(models=("mlp",), max_request_bytes=MAX_REQUEST) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            call = pb_grpc.GRPCInferenceServiceStub(channel).ServerMetadata(pb.ServerMetadataRequest())
            assert (await call).name == "wok"
            trailing = dict(await call.trailing_metadata())
    assert trailing[MAX_REQUEST_KEY] == str(MAX_REQUEST) and trailing[MAX_MESSAGE_KEY] == str(LIMIT)


@pytest.mark.parametrize("balancer", ["grpc", "wok"])
async def test_both_clients_tell_the_published_limit(serve, balancer):
    # wok bench reads it before its first step, to say which of its payloads the server will refuse.
    async with serve(models=("mlp",), max_request_bytes=MAX_REQUEST) as server:
        async with AsyncClient(f"127.0.0.1:{server.port}", balancer=balancer) as client:
            assert await client.request_limit(timeout=10) == (MAX_REQUEST, LIMIT)
        if balancer == "grpc":  # the sync client has one channel, no balancer of its own

            def sync() -> tuple[int, int] | None:
                with Client(f"127.0.0.1:{server.port}") as client:
                    return client.request_limit(timeout=10)

            assert await asyncio.to_thread(sync) == (MAX_REQUEST, LIMIT)


@pytest.mark.parametrize("balancer", ["grpc", "wok"])
async def test_aio_client_refuses_a_request_over_the_limit_and_the_stream_goes_on(serve, balancer):
    async with serve(models=("mlp",), max_request_bytes=MAX_REQUEST) as server:
        async with AsyncClient(f"127.0.0.1:{server.port}", balancer=balancer) as client:
            results = [r async for r in client.stream_infer([("mlp", SMALL), ("mlp", BIG), ("mlp", SMALL)])]
            check_stream(results)
            with pytest.raises(InferError) as info:
                await client.infer("mlp", BIG)
            assert info.value.code == CODE.RESOURCE_EXHAUSTED
            check_refusal(info.value.details, "the request")
            assert (await client.infer("mlp", SMALL))["OUTPUT0"].shape == (1, 256)


async def test_a_refusal_shows_the_model_and_the_id_as_the_server_shows_names(serve):
    # They were put in quotes as they were: a line break in either broke the caller's log line in two (and
    # could forge the second), and a 100,000-character id was written out whole. Now as wok.errors'
    # quoted_name shows them: escaped, and cut past 200 characters.
    async with serve(models=("mlp",), max_request_bytes=MAX_REQUEST) as server:
        async with AsyncClient(f"127.0.0.1:{server.port}") as client:
            with pytest.raises(InferError) as info:
                await client.infer("mlp\nwok: serving", BIG)
            assert info.value.details.startswith("CLIENT: the request to model 'mlp\\nwok: serving' is 1,126,4")
            item = {"model": "mlp", "inputs": BIG, "request_id": "a\nb" + "c" * 300}
            [result] = [r async for r in client.stream_infer([item])]
    shown = "'a\\nb" + "c" * 197 + "'… (303 characters in all)"
    assert result.error.startswith(f"CLIENT: stream request {shown} to model 'mlp' is 1,126,"), result.error
    assert result.error.isprintable() and info.value.details.isprintable()


async def test_aio_stream_hands_a_refusal_over_before_the_next_request_is_written(serve):
    # A caller that waits for each result before it sends the next request: the refusal must come
    # without an answer of the server's to carry it.
    async with serve(models=("mlp",), max_request_bytes=MAX_REQUEST) as server:
        async with AsyncClient(f"127.0.0.1:{server.port}") as client:
            seen = asyncio.Event()

            async def requests():
                yield "mlp", BIG
                await seen.wait()
                yield "mlp", SMALL

            results = []
            async for r in client.stream_infer(requests()):
                results.append(r)
                seen.set()
    assert [(r.id, r.code) for r in results] == [("0", CODE.RESOURCE_EXHAUSTED), ("1", None)]


async def test_sync_client_refuses_a_request_over_the_limit_and_the_stream_goes_on(serve):
    async with serve(models=("mlp",), max_request_bytes=MAX_REQUEST) as server:

        def run() -> None:
            with Client(f"127.0.0.1:{server.port}") as client:
                check_stream(list(client.stream_infer([("mlp", SMALL), ("mlp", BIG), ("mlp", SMALL)])))
                with pytest.raises(InferError) as info:
                    client.infer("mlp", BIG)
                assert info.value.code == CODE.RESOURCE_EXHAUSTED
                check_refusal(info.value.details, "the request")
                # One result at a time, each before the next request: the refusal comes on its own.
                seen = threading.Event()

                def requests():
                    yield "mlp", BIG
                    assert seen.wait(30), "the refusal never reached the caller"
                    yield "mlp", SMALL

                results = []
                for r in client.stream_infer(requests()):
                    results.append(r)
                    seen.set()
                assert [(r.id, r.code) for r in results] == [("0", CODE.RESOURCE_EXHAUSTED), ("1", None)]

        await asyncio.to_thread(run)


@pytest.mark.parametrize("server_metadata", [True, False], ids=["no-limit", "no-server-metadata"])
async def test_a_server_that_publishes_no_limit_is_asked_once_and_sent_every_request(unpublished, server_metadata):
    # tritonserver, or an older wok: the client sends as before, and gRPC's refusal ends the stream.
    async with unpublished(LIMIT, server_metadata=server_metadata) as server:
        async with AsyncClient(server.target) as client:
            for _ in range(2):
                with pytest.raises(InferError) as info:
                    await client.infer("mlp", BIG)
                assert info.value.code == CODE.RESOURCE_EXHAUSTED, info.value
                assert "SERVER: Received message larger than max" in info.value.details
            with pytest.raises(InferError) as info:
                async for _ in client.stream_infer([("mlp", BIG)]):
                    pass
            assert "SERVER: Received message larger than max" in info.value.details
            assert [r.ok for r in [r async for r in client.stream_infer([("mlp", SMALL)] * 2)]] == [True, True]
        assert server.lookups == 1 and server.requests == 2

        def run() -> None:
            with Client(server.target) as client:
                for _ in range(2):
                    with pytest.raises(InferError) as info:
                        client.infer("mlp", BIG)
                    assert "SERVER: Received message larger than max" in info.value.details
                with pytest.raises(InferError) as info:
                    list(client.stream_infer([("mlp", BIG)]))
                assert "SERVER: Received message larger than max" in info.value.details

        await asyncio.to_thread(run)
        assert server.lookups == 2 and server.requests == 2


@pytest.mark.parametrize("balancer", ["grpc", "wok"])
async def test_a_look_up_that_takes_the_calls_whole_timeout_leaves_its_request_none(unpublished, balancer):
    # The look-up (ServerMetadata, before the first large request) had the call's timeout, and then
    # the request had it again: infer(timeout=T) took up to 2T, its request sent past its deadline.
    mid = {"INPUT0": np.ones((1000, 256), np.float32)}  # 1,024,000 bytes: looked up first, under LIMIT
    async with unpublished(LIMIT, server_metadata="hold") as server:
        async with AsyncClient(server.target, balancer=balancer) as client:
            with pytest.raises(InferError) as info:
                await client.infer("mlp", mid, timeout=0.5)
            assert info.value.code == CODE.DEADLINE_EXCEEDED, info.value
            assert "took the whole timeout of 0.5 s, so the request was not sent" in info.value.details
        assert (server.lookups, server.requests) == (1, 0)
        if balancer == "grpc":  # the sync client has one channel, no balancer of its own

            def run() -> None:
                with Client(server.target) as client:
                    with pytest.raises(InferError) as info:
                        client.infer("mlp", mid, timeout=0.5)
                    assert info.value.code == CODE.DEADLINE_EXCEEDED, info.value
                    assert "so the request was not sent" in info.value.details

            await asyncio.to_thread(run)
            assert (server.lookups, server.requests) == (2, 0)


# -- the sync client: threads that need the look-up at once --------------------------------------

MID = {"INPUT0": np.ones((1000, 256), np.float32)}  # 1,024,000 bytes: looked up first, under LIMIT


async def test_sync_a_thread_that_gives_up_waiting_for_anothers_look_up_sends_nothing(unpublished):
    # One thread's look-up is held by the server; another's request needs the limit too and waits
    # for that look-up (one at a time), within its own timeout: it runs none of its own, and once
    # its timeout is over its request is not sent (it would go out past its deadline). The first
    # thread's call is unaffected.
    async with unpublished(LIMIT, server_metadata="hold") as server:
        with Client(server.target) as client:
            first = asyncio.ensure_future(asyncio.to_thread(client.infer, "mlp", MID, timeout=60))
            await server.wait_until(lambda: server.lookups == 1)
            with pytest.raises(InferError) as info:
                await asyncio.to_thread(client.infer, "mlp", MID, timeout=0.2)
            assert info.value.code == CODE.DEADLINE_EXCEEDED, info.value
            assert "took the whole timeout of 0.2 s, so the request was not sent" in info.value.details
            assert (server.lookups, server.requests) == (1, 0)
            server.release.set()  # the first thread's look-up is answered (no limit published)
            assert await first == {}
            assert (server.lookups, server.requests) == (1, 1)


async def test_sync_threads_that_waited_for_a_look_up_that_failed_take_its_outcome(unpublished):
    # The first thread's look-up runs out of its caller's time (2 s); a second thread waited for it
    # (30 s). The second used to run a look-up of its own then, held as long again: with a server
    # that hangs, the n-th waiting thread waited n look-ups (10 s each, without a timeout). It takes
    # the first one's outcome, as AsyncClient's callers share one look-up: its request goes out.
    async with unpublished(LIMIT, server_metadata="hold") as server:
        with Client(server.target) as client:
            first = asyncio.ensure_future(asyncio.to_thread(client.infer, "mlp", MID, timeout=2))
            await server.wait_until(lambda: server.lookups == 1)
            # (Started now, it waits for the first thread's look-up: 2 s is its margin to get there.)
            second = asyncio.ensure_future(asyncio.to_thread(client.infer, "mlp", MID, timeout=30))
            with pytest.raises(InferError) as info:
                await first
            assert info.value.code == CODE.DEADLINE_EXCEEDED and "was not sent" in info.value.details
            assert await second == {}
            assert (server.lookups, server.requests) == (1, 1)


async def test_sync_a_negative_timeout_is_out_of_time_not_a_value_error(unpublished):
    # A request that needs the look-up, with a timeout already past: threading.Lock.acquire raised
    # its own ValueError ("timeout value must be positive"), where one that needs none, and
    # AsyncClient, say DEADLINE_EXCEEDED.
    async with unpublished(LIMIT) as server:

        def run() -> None:
            with Client(server.target) as client:
                for x in (SMALL, MID):
                    with pytest.raises(InferError) as info:
                        client.infer("mlp", x, timeout=-0.5)
                    assert info.value.code == CODE.DEADLINE_EXCEEDED, info.value

        await asyncio.to_thread(run)
        assert server.requests == 0
