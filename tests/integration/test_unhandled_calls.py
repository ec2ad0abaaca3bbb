"""A ModelInfer call that ends inside grpc.aio before wok's handler runs is counted once, in
wok_calls_ended_before_handler_total (server/unhandled.py); every other call as before."""

from __future__ import annotations

import asyncio
import re
import threading
import urllib.request

import grpc
import numpy as np
import pytest
from prometheus_client import generate_latest

from wok.codec import encode_request
from wok.v2pb import grpc_service_pb2 as pb
from wok.v2pb import grpc_service_pb2_grpc as pb_grpc

from ..conftest import until

INFER = "/inference.GRPCInferenceService/ModelInfer"
X = {"INPUT0": np.ones((1, 256), np.float32)}
TOKEN = "tok-A-1b0c4ee6a1f94c8a8d1e"
UNHANDLED = re.compile(r'^wok_calls_ended_before_handler_total\{method="ModelInfer"\} (\S+)$', re.M)


def unhandled_in(text: str) -> float | None:
    """The ModelInfer series of wok_calls_ended_before_handler_total in a scrape; None when absent."""
    m = UNHANDLED.search(text)
    return None if m is None else float(m.group(1))


def scraped(server) -> float | None:
    """A scrape of the in-loop server's registry (its collector runs on this, the server's, loop)."""
    return unhandled_in(generate_latest(server.registry).decode())


def messageless(channel: grpc.aio.Channel):
    """ModelInfer as a call that sends its headers and no request message until it ends: grpc.aio
    waits in its message read, before the handler, for as long as the call lasts."""
    call = channel.stream_unary(
        INFER,
        request_serializer=pb.ModelInferRequest.SerializeToString,
        response_deserializer=pb.ModelInferResponse.FromString,
    )
    never = asyncio.Event()

    async def nothing():
        await never.wait()
        yield pb.ModelInferRequest()  # never reached

    return lambda **kw: call(nothing(), **kw)


async def test_a_call_whose_deadline_passes_or_that_is_cancelled_before_its_message_is_counted_once(serve):
    async with serve(models=("mlp",)) as server:
        assert scraped(server) == 0.0  # the series is there before any call
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            start = messageless(ch)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await start(timeout=0.2)
            assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            await until(lambda: scraped(server) == 1.0, "the expired call counted")

            call = start()
            await until(lambda: server.unhandled.waiting == 1, "the call in grpc.aio's message read")
            call.cancel()
            await until(lambda: scraped(server) == 2.0, "the cancelled call counted")
            # Neither reached wok's handler, and neither is counted anywhere else.
            assert server.metrics.models["mlp"].responses == {}
            assert server.metrics.unmodeled_responses == {}
            assert server.unhandled.waiting == 0


async def test_answered_calls_are_counted_where_they_were_and_not_as_unhandled(serve):
    async with serve(models=("mlp",)) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            stub = pb_grpc.GRPCInferenceServiceStub(ch)
            await stub.ModelInfer(encode_request("mlp", X))
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.ModelInfer(encode_request("nope", X))
            assert info.value.code() == grpc.StatusCode.NOT_FOUND
            # A stream's requests are its handler's to count (streams are not watched).
            answers = [a async for a in stub.ModelStreamInfer(iter([encode_request("mlp", X)]))]
            assert len(answers) == 1 and not answers[0].error_message
        assert server.metrics.models["mlp"].responses == {"OK": 2}
        assert server.metrics.unmodeled_responses == {"NOT_FOUND": 1}
        assert scraped(server) == 0.0
        assert server.unhandled.waiting == 0  # a call whose handler ran is not kept


async def test_a_call_refused_for_its_token_is_not_counted_as_unhandled(serve, tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text(TOKEN + "\n")
    async with serve(models=("mlp",), auth_token_file=tokens) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            stub = pb_grpc.GRPCInferenceServiceStub(ch)
            start = messageless(ch)
            for refused in (stub.ModelInfer(encode_request("mlp", X)), start(timeout=30)):
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await refused
                assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert server._token_interceptor.refused == 2
            # One with the token that ends before its message is counted, behind the token's check.
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await start(timeout=0.2, metadata=(("authorization", f"Bearer {TOKEN}"),))
            assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            await until(lambda: scraped(server) == 1.0, "the expired call counted")
        assert server.metrics.models["mlp"].responses == {}
        assert scraped(server) == 1.0


def test_a_call_whose_deadline_passes_while_the_loop_is_held_is_counted_once(serve_in_thread):
    """The overload case: the server's event loop is busy while gRPC's core holds a call whose
    deadline passes. Once the loop runs again, the call ends before its handler or, if the loop
    reaches it before core has ended it, in its handler: either way it is counted once."""
    srv = serve_in_thread(models=("mlp",))
    held, release = threading.Event(), threading.Event()

    def hold() -> None:  # on the server's loop: nothing else runs there until released
        held.set()
        release.wait(60)

    def scrape() -> str:
        with urllib.request.urlopen(f"{srv.http_url()}/metrics", timeout=30) as r:
            return r.read().decode()

    with grpc.insecure_channel(srv.target) as ch:
        stub = pb_grpc.GRPCInferenceServiceStub(ch)
        stub.ModelInfer(encode_request("mlp", X), timeout=30)  # connected, and the model warm
        srv.loop.call_soon_threadsafe(hold)
        assert held.wait(30)
        try:
            with pytest.raises(grpc.RpcError) as info:
                stub.ModelInfer(encode_request("mlp", X), timeout=0.2)
            assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        finally:
            release.set()
        stub.ModelInfer(encode_request("mlp", X), timeout=30)
        responses = srv.server.metrics.models["mlp"].responses
        for _ in range(200):
            text = scrape()  # on the server's loop, so after what it had to do for the expired call
            unhandled = unhandled_in(text) or 0.0
            if unhandled + responses.get("DEADLINE_EXCEEDED", 0) >= 1:
                break
            threading.Event().wait(0.001)
        assert unhandled + responses.get("DEADLINE_EXCEEDED", 0) == 1
        assert responses["OK"] == 2
