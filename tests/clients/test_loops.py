"""An AsyncClient, and the wok Balancer's streams, used from a loop other than their own, against real loopback
servers: refused at once, naming that loop's state, or (a client that holds nothing of a loop that has closed) served
on the new loop."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from wok.clients import AsyncClient
from wok.clients.balancer import Balancer

from .conftest import LoopThread

pytestmark = pytest.mark.timeout(60)

ELSEWHERE = "the AsyncClient was called on a loop other than the one its first call ran on, which {}"


@pytest.fixture
def served(unpublished):
    """A KServe server (an Unpublished one) run on a loop of its own thread, so that any loop can call it."""
    home = LoopThread()
    server = unpublished(1 << 20)
    home.run(server.__aenter__())
    yield server
    home.run(server.__aexit__(None, None, None))
    home.close()


def _client(server, balancer: str) -> AsyncClient:
    return AsyncClient([server.target, server.target], balancer=balancer)


async def _live(client: AsyncClient, timeout: float | None = 5) -> bool:
    """An inference call; whether it was answered."""
    return await client.infer("m", {"x": np.zeros((1, 2), np.float32)}, timeout=timeout) == {}


async def _stream(client: AsyncClient) -> list:
    return [r async for r in client.stream_infer([("m", {"x": np.zeros((1, 2), np.float32)})], timeout=5)]


@pytest.mark.parametrize("balancer", ["grpc", "wok"])
@pytest.mark.parametrize(
    ("home", "state"), [("stopped", "is open but not running"), ("running", "is running, on another thread")]
)
def test_a_call_or_close_on_another_loop_is_refused_at_once_naming_that_loops_state(served, balancer, home, state):
    """The grpc path's call went to grpc.aio, whose channel belongs to the first loop: its own errors, or a call
    scheduled on a loop nobody ran. Refused before anything is sent, as the wok balancer's call is, and so is a
    close() (it cancelled that loop's futures from here); the client still serves its own loop, and closes there."""
    first = asyncio.Runner() if home == "stopped" else LoopThread()
    client = _client(served, balancer)
    try:
        assert first.run(_live(client)) is True
        calls = (served.requests, served.lookups)
        for call in (
            _live,
            lambda c: c.wait_ready(5),
            lambda c: c.request_limit(timeout=5),
            _stream,
            AsyncClient.close,
        ):
            with pytest.raises(RuntimeError, match=re.escape(ELSEWHERE.format(state))):
                asyncio.run(asyncio.wait_for(call(client), 10))
        assert (served.requests, served.lookups) == calls
        assert first.run(_live(client)) is True  # its own loop's calls go on
    finally:
        first.run(client.close())
        first.close()


@pytest.mark.parametrize("balancer", ["grpc", "wok"])
def test_a_first_call_on_another_loop_while_the_first_loops_setup_is_pending_is_refused(served, balancer):
    """The first loop's first call waits for the lookup (grpc) or the balancer's start (wok), and that loop stops
    running (a Runner between runs). A call from another loop waited on the first loop's start, which nothing ran,
    to its own timeout ("the balancer's start did not end within the call's timeout"), for good without one; or it
    made the channel on its own loop (grpc), and the first loop's call, resumed, failed on it with grpc.aio's
    "Event loop is closed". Refused at once; the first loop's call then goes through."""
    # A host name among the targets: the grpc path looks them up on a thread, its calls waiting on the loop.
    client = AsyncClient([f"localhost:{served.port}", served.target], balancer=balancer)
    with asyncio.Runner() as first:
        waiting = first.get_loop().create_task(_live(client))
        first.run(asyncio.sleep(0))  # the call's first step: it waits for the setup
        assert not waiting.done()
        for timeout in (1, None):
            with pytest.raises(RuntimeError, match=re.escape(ELSEWHERE.format("is open but not running"))):
                asyncio.run(asyncio.wait_for(_live(client, timeout), 10))
        assert first.get_loop().run_until_complete(waiting) is True
        first.run(client.close())


def test_a_balancers_stream_channel_on_another_loop_is_refused_at_once(served):
    """stream_channel() handed another loop a channel of start()'s, and grpc.aio failed the stream with its own
    error; refused as `call` is (`_check_loop`)."""
    first = asyncio.Runner()
    bal = Balancer(served.target)
    try:
        first.run(bal.start())

        async def elsewhere():
            return bal.stream_channel()

        with pytest.raises(RuntimeError, match="the Balancer was called on a loop other than the one it was started"):
            asyncio.run(elsewhere())
        with pytest.raises(RuntimeError, match="the Balancer was called on a loop other than the one it was started"):
            asyncio.run(bal.stop())
    finally:
        first.run(bal.stop())
        first.close()


# The first loop closed (asyncio.run ended): in a process of its own, as a closed loop's gRPC operations, cancelled at
# its end, complete later on whatever loop runs gRPC next, logging there "Event loop is closed".
CLOSED_FIRST = textwrap.dedent(
    """
    import asyncio, json, logging, sys, warnings
    from concurrent import futures

    import grpc
    import numpy as np

    from wok.clients import AsyncClient
    from wok.clients.balancer import Balancer
    from wok.v2pb import grpc_service_pb2 as pb
    from wok.v2pb import grpc_service_pb2_grpc as pb_grpc


    class Server(pb_grpc.GRPCInferenceServiceServicer):
        def ServerLive(self, request, context):
            return pb.ServerLiveResponse(live=True)

        def ModelStreamInfer(self, requests, context):
            for r in requests:
                yield pb.ModelStreamInferResponse(infer_response=pb.ModelInferResponse(model_name=r.model_name))


    server = grpc.server(futures.ThreadPoolExecutor(4))
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(Server(), server)
    target = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    server.start()


    def outcome(make):
        try:
            return f"ok {asyncio.run(asyncio.wait_for(make(), 10))}"
        except BaseException as exc:
            return f"{type(exc).__name__}: {exc}"


    async def live(client):
        return await client.server_live(timeout=5)


    async def stream(client):
        return len([r async for r in client.stream_infer([("m", {"x": np.zeros((1, 2), np.float32)})], timeout=5)])


    async def start_pending(client):
        # The first call waits for the balancer's start as the loop ends: asyncio.run cancels it.
        asyncio.get_running_loop().create_task(live(client))
        await asyncio.sleep(0)


    out = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for balancer in ("grpc", "wok"):
            client = AsyncClient([target, target], balancer=balancer)
            out[balancer] = [outcome(lambda: live(client)), outcome(lambda: live(client))]
            out[balancer] += [outcome(lambda: stream(client)), outcome(client.close)]
        client = AsyncClient([target, target], balancer="wok")
        asyncio.run(start_pending(client))

        async def served(client):  # in one run: the loop that makes the client's balancer is the client's
            answered = [await live(client), await stream(client)]
            await client.close()
            return answered

        out["wok after a start cancelled"] = outcome(lambda: served(client))
        bal = Balancer(target)
        asyncio.run(bal.start())

        async def stream_channel():
            bal.stream_channel()

        out["balancer"] = [outcome(stream_channel), outcome(bal.stop)]
    server.stop(0)
    out["warnings"] = [str(w.message) for w in caught]
    print(json.dumps(out))
    """
)


def test_a_client_whose_loop_closed_refuses_calls_and_closes_from_the_next():
    """After the first asyncio.run: the grpc path's call and either path's stream raised grpc.aio's "Event loop is
    closed"; the wok path's close() raised it too (the balancer's stop() scheduled on the closed loop). Calls are
    refused, naming the closed loop; close() closes the channels. A wok client whose first loop ended during the
    balancer's start raised a bare CancelledError at every later call; it starts anew, as the grpc path's lookup
    does. The Balancer's own stream_channel() is refused, its stop() closes the channels."""
    done = subprocess.run([sys.executable, "-c", CLOSED_FIRST], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.splitlines()[-1])
    refused = "RuntimeError: targets '{0},{0}': " + ELSEWHERE.format("is closed") + "; .*"
    for balancer in ("grpc", "wok"):
        first, later, stream, closed = got[balancer]
        assert first == "ok True", got
        target = re.escape(re.search(r"'([^,']+),", later).group(1)) if "targets" in later else "?"
        assert re.fullmatch(refused.format(target), later), got
        assert re.fullmatch(refused.format(target), stream), got
        assert closed == "ok None", got
    assert got["wok after a start cancelled"] == "ok [True, 1]", got
    stream_channel, stopped = got["balancer"]
    assert re.fullmatch(
        r"RuntimeError: .* the Balancer was called on a loop other .* which is closed; .*", stream_channel
    )
    assert stopped == "ok None", got
    assert got["warnings"] == [], got
