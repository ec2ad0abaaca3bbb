"""Round robin, health checking, retries and connection age, against real gRPC servers on loopback.

The servers are conftest.py's `Stub`s: plain grpc.aio servers with the health service and a
ModelInfer that answers as each test says (fail the first calls, or always), so a test knows
exactly how many attempts reached which server. The service config itself is
wok.clients.channel's.
"""

from __future__ import annotations

import asyncio
import json
import sys
import textwrap

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from wok.clients import AsyncClient, InferError
from wok.clients.channel import RETRY_THROTTLING, channel_options, channel_target, service_config, split_host_port
from wok.v2pb import grpc_service_pb2 as pb

pytestmark = pytest.mark.timeout(60)
CODE = grpc.StatusCode
SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
INPUTS: dict = {}  # the stub answers whatever is asked; an empty request is enough
# IN_TIME: the tests marked `serial` (run alone, after the parallel pass: tests/conftest.py) need something to happen
# within a time that a second worker's load could stretch: the held call's UNAVAILABLE within 25 s (about 11 s of gRPC's
# ping and reconnection timers), and a channel still READY when read right after its first call, on a connection the
# server ends 0.5 s after it opened (max_connection_age). The others count the attempts that reached each server and
# which one answered (counts that hold whatever the order of the calls), with deadlines of 10-20 s that no load reaches.


async def answered_by(client: AsyncClient) -> str:
    """Which stub answered one call (its name comes back as the response's model name)."""
    stub = client._stub or client._connect()
    response = await stub.ModelInfer(pb.ModelInferRequest(model_name="m"), timeout=10)
    return response.model_name


def test_service_config_round_robin_health_and_retries():
    config = json.loads(service_config())
    assert config["loadBalancingConfig"] == [{"round_robin": {}}]
    assert config["healthCheckConfig"] == {"serviceName": ""}
    (method,) = config["methodConfig"]
    assert method["name"] == [{"service": "inference.GRPCInferenceService"}]
    assert method["retryPolicy"]["retryableStatusCodes"] == ["UNAVAILABLE"]
    assert method["retryPolicy"]["maxAttempts"] == 5
    assert config["retryThrottling"] == {"maxTokens": 100, "tokenRatio": 0.1}
    bare = json.loads(service_config(retries=False, health_check=False))
    assert bare == {"loadBalancingConfig": [{"round_robin": {}}]}
    opts = dict(channel_options(None, retries=False))
    assert "methodConfig" not in json.loads(opts["grpc.service_config"])
    assert opts["grpc.keepalive_time_ms"] == 10_000 and opts["grpc.keepalive_timeout_ms"] == 5_000
    assert opts["grpc.http2.ping_timeout_ms"] == 5_000 and opts["grpc.min_reconnect_backoff_ms"] == 5_000


def test_a_comma_separated_string_is_a_list_of_targets():
    assert channel_target("10.0.0.1:1,10.0.0.2:2") == "ipv4:10.0.0.1:1,10.0.0.2:2"
    assert channel_target("10.0.0.1:1, 10.0.0.2:2") == "ipv4:10.0.0.1:1,10.0.0.2:2"
    assert channel_target("ipv4:10.0.0.1:1,10.0.0.2:2") == "ipv4:10.0.0.1:1,10.0.0.2:2"
    assert channel_target("dns:///a:1,b:2") == "dns:///a:1,b:2"  # gRPC's to judge


@pytest.mark.parametrize("port", ["\N{SUPERSCRIPT TWO}", "\N{ARABIC-INDIC DIGIT THREE}"])
def test_a_port_of_other_digits_is_no_port(port):
    """isdigit() takes "²" (int() refused it with its own bare ValueError) and "٣" (int() reads 3)."""
    assert split_host_port(f"h:{port}") is None
    with pytest.raises(ValueError, match=f"^target: expected host:port; got 'h:{port}'$"):
        channel_target([f"h:{port}", "h:1"])


async def test_unavailable_is_retried_until_an_answer(stub):
    async with stub("a", fail_first=2) as a, AsyncClient(a.target) as client:
        assert await client.infer("m", INPUTS, timeout=10) == {}
        assert a.calls == 3


async def test_without_retries_unavailable_reaches_the_caller(stub):
    async with stub("a", fail_first=2) as a, AsyncClient(a.target, retries=False) as client:
        with pytest.raises(InferError) as err:
            await client.infer("m", INPUTS, timeout=10)
        assert err.value.code == CODE.UNAVAILABLE and a.calls == 1


async def test_retries_stop_after_five_attempts(stub):
    async with stub("a", fail_first=10) as a, AsyncClient(a.target) as client:
        with pytest.raises(InferError) as err:
            await client.infer("m", INPUTS, timeout=10)
        assert err.value.code == CODE.UNAVAILABLE and a.calls == 5


@pytest.mark.parametrize(
    "code", [CODE.INVALID_ARGUMENT, CODE.DEADLINE_EXCEEDED, CODE.RESOURCE_EXHAUSTED, CODE.INTERNAL, CODE.NOT_FOUND]
)
async def test_other_codes_are_never_retried(stub, code):
    async with stub("a", fail_first=1, code=code) as a, AsyncClient(a.target) as client:
        with pytest.raises(InferError) as err:
            await client.infer("m", INPUTS, timeout=10)
        assert err.value.code == code and a.calls == 1


async def test_the_retry_budget_stops_retries_of_a_failing_fleet(stub):
    # Hand count: tokens start at maxTokens = 100 and each failed attempt takes one; a retry
    # is allowed only while tokens > 50. Calls 1-10 make 5 attempts each (100 -> 50), and
    # from then on every call makes one: 100 calls reach the server 10 * 5 + 90 = 140 times.
    assert RETRY_THROTTLING == {"maxTokens": 100, "tokenRatio": 0.1}

    # The first 10 calls run at once, so their retries' backoffs (up to 0.75 s a call) overlap: the
    # count is the same, as each of the first 49 failures leaves more than 50 tokens, so every one
    # of the 10 calls makes its 5 attempts whatever the order, and the 50th failure is the last of them;
    # below 50 tokens no call is retried, whatever the order of the other 90.
    async def fail() -> None:
        with pytest.raises(InferError):
            await client.infer("m", INPUTS, timeout=10)

    async with stub("a", fail_first=1 << 30) as a, AsyncClient(a.target) as client:
        await asyncio.gather(*(fail() for _ in range(10)))
        assert a.calls == 50
        await asyncio.gather(*(fail() for _ in range(90)))
        assert a.calls == 140


async def test_round_robin_skips_a_not_serving_server_and_comes_back(stub):
    async with stub("a") as a, stub("b") as b:
        await b.health.set("", NOT_SERVING)
        async with AsyncClient([a.target, b.target]) as client:
            assert {await answered_by(client) for _ in range(20)} == {"a"}
            await b.health.set("", SERVING)
            # The health watch reports the change at once; a call then reaches b within a round.
            seen = [await answered_by(client) for _ in range(4)]
            while "b" not in seen[-2:]:
                seen.append(await answered_by(client))
            assert {await answered_by(client) for _ in range(10)} == {"a", "b"}
            await a.health.set("", NOT_SERVING)
            while await answered_by(client) != "b":
                pass
            assert {await answered_by(client) for _ in range(20)} == {"b"}


async def test_a_stub_that_fails_once_started_stops_its_server(stub):
    """`Loopback.__aenter__` started the server, then failed (here its health status refused): `async with` calls no
    `__aexit__` for an `__aenter__` that raised, so the server went on answering on its port for the rest of the
    session (a health Check answered it SERVING, grpc_health's status before any is set)."""

    class Unsettable(stub):
        def __init__(self, name: str) -> None:
            super().__init__(name)

            class Refusing(type(self.health)):
                async def set(self, service: str, status) -> None:
                    raise RuntimeError("health status refused")

            self.health = Refusing()

    a = Unsettable("a")
    try:
        with pytest.raises(RuntimeError, match="health status refused"):
            async with a:
                pytest.fail("entered a stub whose start failed")
        async with grpc.aio.insecure_channel(a.target) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
        assert info.value.code() == CODE.UNAVAILABLE, info.value  # nothing listens on its port
    finally:
        await a.server.stop(0)  # the server a failing test left running


def test_a_stopped_stub_leaves_no_health_watch_to_the_closed_loop(stub, caplog):
    """gRPC's stop returned before it had ended the open health Watch handlers; the loop that then closed
    cancelled them, and gRPC logged "Exception not handled by _handle_exceptions in servicer method
    [/grpc.health.v1.Health/Watch]" (before the stub waited for them: in 8 of 10 such runs with one watch)."""

    async def watched_then_stopped() -> None:
        async with stub("a") as a:
            channel = grpc.aio.insecure_channel(a.target)
            watch = health_pb2_grpc.HealthStub(channel).Watch
            calls = [watch(health_pb2.HealthCheckRequest(service="")) for _ in range(5)]
            for call in calls:
                assert (await call.read()).status == SERVING  # each handler runs, waiting for a change
        # The stub stopped with the watches open, as a client's channel keeps one per server.
        await channel.close()

    for _ in range(5):
        asyncio.run(watched_then_stopped())
    assert [r.getMessage() for r in caplog.records if "not handled" in r.getMessage()] == []


async def test_health_checking_needs_no_import_in_the_client(stub):
    """The health watch is gRPC core's: a client process that never loads grpc_health.v1
    still avoids a NOT_SERVING server."""
    async with stub("a") as a, stub("b") as b:
        await b.health.set("", NOT_SERVING)
        script = textwrap.dedent(
            f"""
            import sys
            from wok.clients import Client
            from wok.v2pb import grpc_service_pb2 as pb
            with Client({[a.target, b.target]!r}) as c:
                names = {{c._stub.ModelInfer(pb.ModelInferRequest(), timeout=10).model_name for _ in range(20)}}
            # `import grpc` imports the empty package grpc_health (as grpc.health); the
            # health protocol's modules are grpc_health.v1.*, and none of them is loaded.
            assert not any(m.startswith("grpc_health.v1") for m in sys.modules), "grpc_health.v1 was imported"
            print(",".join(sorted(names)))
            """
        )
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", script, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        out, err = await proc.communicate()
        assert proc.returncode == 0, err.decode()
        assert out.decode().strip() == "a"
        assert b.calls == 0


async def test_a_server_gone_mid_run_costs_no_call(stub):
    """Calls to two servers, one stopped between them: with retries every call is answered."""
    async with stub("a") as a:
        b = stub("b")
        await b.__aenter__()
        async with AsyncClient([a.target, b.target]) as client:
            for _ in range(10):
                await answered_by(client)
            await b.stop()
            results = await asyncio.gather(*(answered_by(client) for _ in range(50)))
            assert set(results) == {"a"}


@pytest.mark.serial  # (see IN_TIME)
async def test_max_connection_age_closes_connections_and_calls_go_on():
    """`wok serve --max-connection-age`: the server ends each connection after the age
    (GOAWAY), so the channel leaves READY by itself; the next call reconnects."""
    from wok.app import WokServer, build_repository
    from wok.config import server_settings

    settings = server_settings(
        grpc_port=0, metrics_port=None, demo_models=("mlp",), max_connection_age_s=0.5, max_connection_age_grace_s=2
    )
    server = WokServer(settings, build_repository(settings))
    options = dict(server._grpc_options(1 << 20))
    assert options["grpc.max_connection_age_ms"] == 500 and options["grpc.max_connection_age_grace_ms"] == 2000
    await server.start()
    try:
        async with AsyncClient(f"127.0.0.1:{server.port}") as client:
            assert await client.server_ready(timeout=10)
            channel = client._channel
            assert channel.get_state() == grpc.ChannelConnectivity.READY
            await asyncio.wait_for(channel.wait_for_state_change(grpc.ChannelConnectivity.READY), 20)
            assert await client.server_ready(timeout=10)
    finally:
        await server.stop(grace=2)


@pytest.mark.serial  # (see IN_TIME)
def test_a_call_held_by_a_stopped_server_fails_unavailable_long_before_its_deadline(held_call):
    """A server that hangs with its connection open (SIGSTOP: the kernel still accepts connections,
    nothing answers): an unanswered ping (gRPC's, sent as the call before's answer arrived; on a
    quiet connection keepalive's, up to 10 s later) closes the connection after
    `grpc.http2.ping_timeout_ms`, and the retries' new connections time out after
    `grpc.min_reconnect_backoff_ms`, so the call ends UNAVAILABLE in about 11 s (5 + 5 and the
    retries' backoff). It used to wait out its 40 s deadline: gRPC core no longer closes on
    `keepalive_timeout_ms` alone. The call is made by conftest.py's `held_call`, in a process started
    with this folder's first test."""
    out, err = held_call.communicate(timeout=55)
    assert held_call.returncode == 0, err[-3000:]
    result = json.loads(out)
    assert result["code"] == "UNAVAILABLE", result["error"]
    assert result["took"] < 25, f"{result['took']:.1f} s"
