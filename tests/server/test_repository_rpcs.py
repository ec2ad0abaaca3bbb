"""The V2 repository RPCs as Triton answers them: RepositoryIndex tells what is ready for
inferencing by the condition ModelReady uses (a failed batcher) and honours `ready`; while the
server starts or drains it answers UNAVAILABLE, as ModelReady does, and ServerLive and ServerReady
too while it drains; a `repository_name` is refused by name, not ignored; RepositoryModelLoad/Unload
say why wok does not serve them, and ServerMetadata does not advertise the `model_repository` extension."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from wok.app import WokServer
from wok.codec import decode_response, encode_request
from wok.config import server_settings
from wok.errors import quoted_name
from wok.metrics import REJECTION_REASONS
from wok.repository import ModelRepository
from wok.v2pb import grpc_service_pb2 as pb
from wok.v2pb import grpc_service_pb2_grpc as pb_grpc

from .conftest import GatedDouble, gated_servable


def stuck_servable(name: str):
    """A 2x model whose batch of one blocks while its gate is closed (conftest's GatedDouble)."""
    return gated_servable(max_batch_size=1, delay_ms=5.0, depth=None, name=name, enter_when_closed=True)


X = {"INPUT0": np.ones((1, 4), np.float32)}
SHUTTING_DOWN = "server is shutting down and accepts no new requests"
STARTING = "server is not ready: it is still starting"


@asynccontextmanager
async def gated_server(
    *names: str,
) -> AsyncIterator[tuple[WokServer, dict[str, GatedDouble], pb_grpc.GRPCInferenceServiceStub]]:
    made = {name: stuck_servable(name) for name in names}
    server = WokServer(
        server_settings(grpc_port=0, metrics_port=None), ModelRepository([s for s, _ in made.values()], "test")
    )
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            yield server, {name: m for name, (_, m) in made.items()}, pb_grpc.GRPCInferenceServiceStub(ch)
    finally:
        for _, m in made.values():
            m.gate.set()
        await server.stop(grace=5)


async def index(stub, **request) -> list[tuple[str, str, str]]:
    resp = await stub.RepositoryIndex(pb.RepositoryIndexRequest(**request), timeout=10)
    return [(m.name, m.state, m.reason) for m in resp.models]


async def test_a_model_whose_batcher_failed_is_unavailable_with_the_failure_and_left_out_of_ready_true():
    async with gated_server("a", "b") as (server, _, stub):
        assert await index(stub) == [("a", "READY", ""), ("b", "READY", "")]

        def bug(*args, **kwargs):
            raise RuntimeError("a bug in the batcher")

        server.runtimes["a"].batcher._form = bug  # the batching task's next decision raises
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.ModelInfer(encode_request("a", X), timeout=10)
        assert info.value.details() == "model 'a': batcher failed: a bug in the batcher"
        # That request was accepted and failed with the batcher; the next is refused at arrival.
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.ModelInfer(encode_request("a", X), timeout=10)
        assert info.value.code() == grpc.StatusCode.INTERNAL
        assert info.value.details() == "model 'a' cannot run requests: its batcher failed: a bug in the batcher"
        assert server.metrics.models["a"].rejections == {
            **dict.fromkeys(REJECTION_REASONS, 0),
            "model_failed": 1,
        }
        # The same condition as ModelReady's.
        assert not (await stub.ModelReady(pb.ModelReadyRequest(name="a"), timeout=10)).ready
        assert (await stub.ModelReady(pb.ModelReadyRequest(name="b"), timeout=10)).ready
        reason = "batcher failed: a bug in the batcher; the model refuses every request until the server restarts"
        assert await index(stub) == [("a", "UNAVAILABLE", reason), ("b", "READY", "")]
        assert await index(stub, ready=True) == [("b", "READY", "")]


async def test_during_a_drain_the_server_and_repository_rpcs_answer_unavailable_as_tritons():
    async with gated_server("a", "b") as (server, modules, stub):
        modules["a"].gate.clear()
        accepted = asyncio.ensure_future(stub.ModelInfer(encode_request("a", X), timeout=30))
        loop = asyncio.get_running_loop()
        assert await loop.run_in_executor(None, modules["a"].entered.wait, 10), "the request never reached its model"
        stopping = asyncio.ensure_future(server.stop(grace=10))  # waits for the accepted request
        while not server.draining:
            await asyncio.sleep(0)
        try:
            await state_rpcs_are_unavailable(stub, SHUTTING_DOWN, server_rpcs=True)
            await model_ready_is_unavailable(stub, SHUTTING_DOWN)
            # Triton reads repository_name before its server's state: refused by name still.
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.RepositoryIndex(pb.RepositoryIndexRequest(repository_name="models"), timeout=10)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            unavailable = ("StatusCode.UNAVAILABLE", SHUTTING_DOWN)
            assert await asyncio.to_thread(with_tritonclient, f"127.0.0.1:{server.port}") == {
                "live": unavailable,
                "ready": unavailable,
                "index": unavailable,
                "model ready": unavailable,
            }
        finally:
            modules["a"].gate.set()
        out = decode_response(await accepted)
        np.testing.assert_array_equal(out["OUTPUT0"], np.full((1, 4), 2.0, np.float32))
        await stopping


def with_tritonclient(target: str) -> dict:
    """What Triton's own client makes of the server and repository RPCs: each value, or (status, message) of
    what it raised. Blocking, so off the event loop that serves it."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    got = {}
    with grpcclient.InferenceServerClient(target) as client:
        for key, fn in (
            ("live", client.is_server_live),
            ("ready", client.is_server_ready),
            ("index", lambda: [(m.name, m.state) for m in client.get_model_repository_index().models]),
            ("model ready", lambda: client.is_model_ready("b")),
        ):
            try:
                got[key] = fn()
            except InferenceServerException as exc:
                got[key] = (exc.status(), exc.message())
    return got


async def state_rpcs_are_unavailable(stub, details: str, *, server_rpcs: bool) -> None:
    """RepositoryIndex while the server is not ready (core's InferenceServer::RepositoryIndex), and with `server_rpcs`
    ServerLive and ServerReady too (its IsLive and IsReady, while it exits): UNAVAILABLE, not an answer."""
    calls = {
        "RepositoryIndex": lambda: stub.RepositoryIndex(pb.RepositoryIndexRequest(), timeout=10),
        "RepositoryIndex ready": lambda: stub.RepositoryIndex(pb.RepositoryIndexRequest(ready=True), timeout=10),
    }
    if server_rpcs:
        calls["ServerLive"] = lambda: stub.ServerLive(pb.ServerLiveRequest(), timeout=10)
        calls["ServerReady"] = lambda: stub.ServerReady(pb.ServerReadyRequest(), timeout=10)
    for what, call in calls.items():
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call()
        assert (info.value.code(), info.value.details()) == (grpc.StatusCode.UNAVAILABLE, details), what


async def model_ready_is_unavailable(stub, details: str) -> None:
    """ModelReady while the server is not ready, as Triton answers it (core's InferenceServer::ModelIsReady):
    UNAVAILABLE for a model served or not, not ready=false; a version that is no integer is read first."""
    for name in ("b", "nope"):
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.ModelReady(pb.ModelReadyRequest(name=name), timeout=10)
        assert (info.value.code(), info.value.details()) == (grpc.StatusCode.UNAVAILABLE, details), name
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.ModelReady(pb.ModelReadyRequest(name="b", version="x"), timeout=10)
    assert (info.value.code(), info.value.details()) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        invalid_version("model 'b': ", "x"),
    )


async def test_while_the_server_starts_it_is_not_live_nor_ready_and_its_models_unavailable_as_tritons():
    made = {name: stuck_servable(name) for name in ("a", "b")}
    server = WokServer(
        server_settings(grpc_port=0, metrics_port=None, health_port=0),
        ModelRepository([s for s, _ in made.values()], "test"),
    )
    # Held where the gRPC port is open and the start not finished: the health port opens after it.
    held, go_on = asyncio.Event(), asyncio.Event()
    start_health_port = server._start_health_port

    async def held_health_port() -> None:
        held.set()
        await go_on.wait()
        await start_health_port()

    server._start_health_port = held_health_port
    starting = asyncio.ensure_future(server.start())
    try:
        await asyncio.wait_for(held.wait(), 60)
        target = f"127.0.0.1:{server.port}"
        async with grpc.aio.insecure_channel(target) as ch:
            stub = pb_grpc.GRPCInferenceServiceStub(ch)
            # Triton's IsLive and IsReady while it initializes: false, not an error.
            assert not (await stub.ServerLive(pb.ServerLiveRequest(), timeout=10)).live
            assert not (await stub.ServerReady(pb.ServerReadyRequest(), timeout=10)).ready
            await state_rpcs_are_unavailable(stub, STARTING, server_rpcs=False)
            await model_ready_is_unavailable(stub, STARTING)
            # No health status is set yet: a probe's Check fails (docs/kubernetes.md); inference is served already.
            for service in ("", "a"):
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await health_pb2_grpc.HealthStub(ch).Check(
                        health_pb2.HealthCheckRequest(service=service), timeout=10
                    )
                assert (info.value.code(), info.value.details()) == (
                    grpc.StatusCode.NOT_FOUND,
                    f"unknown service '{service}'",
                )
            out = decode_response(await stub.ModelInfer(encode_request("a", X), timeout=10))
            np.testing.assert_array_equal(out["OUTPUT0"], np.full((1, 4), 2.0, np.float32))
            unavailable = ("StatusCode.UNAVAILABLE", STARTING)
            assert await asyncio.to_thread(with_tritonclient, target) == {
                "live": False,
                "ready": False,
                "index": unavailable,
                "model ready": unavailable,
            }
            go_on.set()
            await starting
            assert (await stub.ServerLive(pb.ServerLiveRequest(), timeout=10)).live
            assert (await stub.ModelReady(pb.ModelReadyRequest(name="b"), timeout=10)).ready
            assert not (await stub.ModelReady(pb.ModelReadyRequest(name="nope"), timeout=10)).ready
            assert await index(stub) == [("a", "READY", ""), ("b", "READY", "")]
            assert await asyncio.to_thread(with_tritonclient, target) == {
                "live": True,
                "ready": True,
                "index": [("a", "READY"), ("b", "READY")],
                "model ready": True,
            }
    finally:
        go_on.set()
        await asyncio.gather(starting, return_exceptions=True)
        await server.stop(grace=5)


@pytest.mark.parametrize("ready", [False, True])
async def test_a_repository_name_is_refused_by_name_not_ignored(ready):
    async with gated_server("a") as (_, _, stub):
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.RepositoryIndex(pb.RepositoryIndexRequest(repository_name="models", ready=ready), timeout=10)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert info.value.details() == (
            "'repository_name' specification is not supported: wok serves one set of models, chosen at start "
            "(--model-repository, --models); expected RepositoryIndex without repository_name; got 'models'"
        )


@pytest.mark.parametrize(("method", "what"), [("RepositoryModelLoad", "load"), ("RepositoryModelUnload", "unload")])
async def test_load_and_unload_say_the_models_are_fixed_at_start(method, what):
    async with gated_server("a") as (_, _, stub):
        request = getattr(pb, f"{method}Request")(model_name="a")
        request.parameters["config"].string_param = '{"max_batch_size": 8}'
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await getattr(stub, method)(request, timeout=10)
        assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert info.value.details() == (
            f"cannot {what} model 'a': wok does not load or unload models while it runs; it serves the fixed set "
            "chosen at start (--model-repository, --models): restart it with the models wanted"
        )
        # Nothing changed: the model is there and serves.
        assert await index(stub) == [("a", "READY", "")]
        out = decode_response(await stub.ModelInfer(encode_request("a", X), timeout=10))
        np.testing.assert_array_equal(out["OUTPUT0"], np.full((1, 4), 2.0, np.float32))


async def test_server_metadata_does_not_advertise_the_model_repository_extension():
    # To Triton's clients the extension means RepositoryIndex, RepositoryModelLoad and RepositoryModelUnload.
    async with gated_server("a") as (_, _, stub):
        meta = await stub.ServerMetadata(pb.ServerMetadataRequest(), timeout=10)
    assert list(meta.extensions) == ["model_configuration", "statistics"]


# A wrong name of 100,007 characters, with a newline: shown cut to 200 characters, the newline escaped.
ODD_NAME = "models\n" + "x" * 100_000
SHOWN = "'models\\n" + "x" * 193 + "'… (100,007 characters in all)"
ODD_NAME_CASES = {
    "RepositoryIndex": (
        pb.RepositoryIndexRequest(repository_name=ODD_NAME),
        grpc.StatusCode.INVALID_ARGUMENT,
        f"expected RepositoryIndex without repository_name; got {SHOWN}",
    ),
    "RepositoryModelLoad": (
        pb.RepositoryModelLoadRequest(model_name=ODD_NAME),
        grpc.StatusCode.UNIMPLEMENTED,
        f"cannot load model {SHOWN}: wok does not load",
    ),
    "SystemSharedMemoryStatus": (
        pb.SystemSharedMemoryStatusRequest(name=ODD_NAME),
        grpc.StatusCode.NOT_FOUND,
        f"Unable to find system shared memory region: {SHOWN}",
    ),
    "CudaSharedMemoryRegister": (
        pb.CudaSharedMemoryRegisterRequest(name=ODD_NAME),
        grpc.StatusCode.UNIMPLEMENTED,
        f"cannot register CUDA shared memory region {SHOWN}: wok does not support shared memory",
    ),
}


@pytest.mark.parametrize("method", ODD_NAME_CASES)
async def test_a_name_sent_to_an_rpc_that_refuses_it_is_echoed_cut_and_escaped(method):
    # It came back whole up to the 4 KiB cut of the details, and its newline as it was.
    request, code, shown = ODD_NAME_CASES[method]
    async with gated_server("a") as (_, _, stub):
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await getattr(stub, method)(request, timeout=10)
        assert await index(stub) == [("a", "READY", "")]
    assert info.value.code() == code
    assert shown in info.value.details() and info.value.details().isprintable(), info.value.details()[:400]
    assert len(info.value.details()) < 600, len(info.value.details())  # the name's 230 and the message's own


# Triton reads a version as an integer: "01" is version 1, and what is no integer (or is negative) is
# INVALID_ARGUMENT. wok served only "" and "1", and answered NOT_FOUND for "01" and "abc" alike.
def versioned(version: str, model: str = "a") -> pb.ModelInferRequest:
    req = encode_request(model, X)
    req.model_version = version
    return req


def invalid_version(model: str, version: str) -> str:
    return (
        f"{model}model version: expected an integer from 0 to 2**63-1 in decimal digits, or '' for the version served "
        f"(1); got {quoted_name(version)}"
    )


SERVED_VERSIONS = ("", "1", "01", "0001")
ABSENT_VERSIONS = ("2", "0", "02", str(2**63 - 1))
INVALID_VERSIONS = ("abc", "-1", "1.0", "+1", " 1", "1 ", "\u0661", "1_0", str(2**63), "9" * 5000)


async def test_a_version_is_read_as_triton_reads_it_by_every_rpc_that_takes_one():
    async with gated_server("a") as (server, _, stub):
        for v in SERVED_VERSIONS:
            out = decode_response(await stub.ModelInfer(versioned(v), timeout=10))
            np.testing.assert_array_equal(out["OUTPUT0"], np.full((1, 4), 2.0, np.float32))
            meta = await stub.ModelMetadata(pb.ModelMetadataRequest(name="a", version=v), timeout=10)
            assert meta.versions == ["1"], v
            assert (await stub.ModelReady(pb.ModelReadyRequest(name="a", version=v), timeout=10)).ready, v
            stats = await stub.ModelStatistics(pb.ModelStatisticsRequest(name="a", version=v), timeout=10)
            assert [(st.name, st.version) for st in stats.model_stats] == [("a", "1")], v
        invalid = grpc.StatusCode.INVALID_ARGUMENT
        bad = [(v, grpc.StatusCode.NOT_FOUND) for v in ABSENT_VERSIONS]
        bad += [(v, invalid) for v in INVALID_VERSIONS]
        for v, code in bad:
            calls = [
                (code, stub.ModelInfer(versioned(v), timeout=10)),
                (code, stub.ModelMetadata(pb.ModelMetadataRequest(name="a", version=v), timeout=10)),
                (code, stub.ModelConfig(pb.ModelConfigRequest(name="a", version=v), timeout=10)),
                # Triton's ModelStatistics answers a version not served INVALID_ARGUMENT, its others NOT_FOUND.
                (invalid, stub.ModelStatistics(pb.ModelStatisticsRequest(name="a", version=v), timeout=10)),
            ]
            if code == invalid:  # an integer not served is a model not ready, below
                calls.append((code, stub.ModelReady(pb.ModelReadyRequest(name="a", version=v), timeout=10)))
            for want, call in calls:
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await call
                assert info.value.code() == want, (v, info.value.details())
                if code == grpc.StatusCode.NOT_FOUND:
                    assert info.value.details() == f"model 'a' has no version '{v}'; available: 1"
                else:
                    assert info.value.details() == invalid_version("model 'a': ", v)
            if code == grpc.StatusCode.NOT_FOUND:
                assert not (await stub.ModelReady(pb.ModelReadyRequest(name="a", version=v), timeout=10)).ready, v
        # Each refused ModelInfer answered once and counted, under no model's name, by its own code.
        unmodeled = server.metrics.unmodeled_responses
        assert unmodeled.get("NOT_FOUND", 0) == len(ABSENT_VERSIONS)
        assert unmodeled.get("INVALID_ARGUMENT", 0) == len(INVALID_VERSIONS)
        # Refused as the codes say: not_found for an integer not served, invalid for what is no integer.
        assert server.metrics.unknown_model_requests == len(ABSENT_VERSIONS)
        assert server.metrics.unparsed_requests == len(INVALID_VERSIONS)


async def test_a_version_that_is_no_integer_is_refused_before_the_model_is_looked_up_as_triton_does():
    # Triton reads the version first: INVALID_ARGUMENT whatever the name, and for ModelStatistics of every
    # model (no name) too. wok looked the model up first (NOT_FOUND), ModelReady answered ready=False, and
    # ModelStatistics with no name ignored the version.
    async with gated_server("a") as (server, _, stub):
        for v in ("-1", "x", "9" * 20):
            for name, shown in (("nope", "model 'nope': "), ("", "")):  # no name: ModelStatistics of every model
                for call in (
                    stub.ModelInfer(versioned(v, name), timeout=10),
                    stub.ModelMetadata(pb.ModelMetadataRequest(name=name, version=v), timeout=10),
                    stub.ModelConfig(pb.ModelConfigRequest(name=name, version=v), timeout=10),
                    stub.ModelReady(pb.ModelReadyRequest(name=name, version=v), timeout=10),
                    stub.ModelStatistics(pb.ModelStatisticsRequest(name=name, version=v), timeout=10),
                ):
                    with pytest.raises(grpc.aio.AioRpcError) as info:
                        await call
                    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (name, v, info.value.details())
                    assert info.value.details() == invalid_version(shown, v)
        # An unknown model with a version that is an integer: the model is what is not found, and not ready;
        # its statistics INVALID_ARGUMENT, as Triton's ModelStatistics answers a model it does not serve.
        for v in ("", "1", "2"):
            assert not (await stub.ModelReady(pb.ModelReadyRequest(name="nope", version=v), timeout=10)).ready
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.ModelStatistics(pb.ModelStatisticsRequest(name="nope", version=v), timeout=10)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert info.value.details() == "unknown model 'nope'; this server serves: a"
            for call in (
                stub.ModelMetadata(pb.ModelMetadataRequest(name="nope", version=v), timeout=10),
                stub.ModelConfig(pb.ModelConfigRequest(name="nope", version=v), timeout=10),
                stub.ModelInfer(versioned(v, "nope"), timeout=10),
            ):
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await call
                assert info.value.code() == grpc.StatusCode.NOT_FOUND, v
                assert info.value.details() == "unknown model 'nope'; this server serves: a"
        # Every model's statistics, with a version that is an integer: the version is not looked for.
        for v in ("", "1", "2"):
            stats = await stub.ModelStatistics(pb.ModelStatisticsRequest(version=v), timeout=10)
            assert [st.name for st in stats.model_stats] == ["a"]
        # Each refused ModelInfer counted as what is no request of a model served: `invalid` for a version that is
        # no integer, whatever the name, `not_found` for an unknown model asked with an integer (or no) version.
        assert server.metrics.unparsed_requests == 6 and server.metrics.unknown_model_requests == 3
