"""Health (overall and per model), reflection, and the staged stop as a client sees them."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import grpc
import numpy as np
import pytest
from google.protobuf import descriptor_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from wok.codec import decode_response, encode_request
from wok.errors import InvalidInput, ModelExecutionError
from wok.faults import Fault
from wok.v2pb import grpc_service_pb2 as pb
from wok.v2pb import grpc_service_pb2_grpc as pb_grpc

from .conftest import ends_with_the_stop, until

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
READ_S = 5.0


async def test_health_is_served_overall_per_service_and_per_model(serve):
    async with serve(models=("mlp", "encoder")) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            h = health_pb2_grpc.HealthStub(ch)
            for name in ("", "inference.GRPCInferenceService", "mlp", "encoder"):
                assert (await h.Check(health_pb2.HealthCheckRequest(service=name))).status == SERVING, name
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await h.Check(health_pb2.HealthCheckRequest(service="recsys"))
            assert info.value.code() == grpc.StatusCode.NOT_FOUND


async def test_reflection_lists_the_inference_and_health_services(serve):
    async with serve(models=("mlp",)) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            stub = reflection_pb2_grpc.ServerReflectionStub(ch)

            async def ask():
                yield reflection_pb2.ServerReflectionRequest(list_services="")

            names = set()
            async for resp in stub.ServerReflectionInfo(ask()):
                names |= {s.name for s in resp.list_services_response.service}
    assert {"inference.GRPCInferenceService", "grpc.health.v1.Health"} <= names


async def test_reflection_and_health_answers_stay_well_within_what_http2_sends_unread(serve):
    # A guard for why the stop does not wait for them (docs/reliability.md, "A graceful stop"): an answer
    # within the 64 KiB HTTP/2 lets a server send before its client reads is written as its handler makes it,
    # ahead of gRPC's stop. One grown past half of that (a larger file in the reflection pool) asks again.
    limit = 32 << 10
    async with serve(models=("mlp",)) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            stub = reflection_pb2_grpc.ServerReflectionStub(ch)
            call = stub.ServerReflectionInfo()
            await call.write(reflection_pb2.ServerReflectionRequest(list_services=""))
            answers = [await call.read()]
            files: set[str] = set()
            for service in answers[0].list_services_response.service:
                await call.write(reflection_pb2.ServerReflectionRequest(file_containing_symbol=service.name))
                answers.append(await call.read())
                for proto in answers[-1].file_descriptor_response.file_descriptor_proto:
                    files.add(descriptor_pb2.FileDescriptorProto.FromString(proto).name)
            for name in sorted(files):
                await call.write(reflection_pb2.ServerReflectionRequest(file_by_filename=name))
                answers.append(await call.read())
            await call.done_writing()
            h = health_pb2_grpc.HealthStub(ch)
            checks = [await h.Check(health_pb2.HealthCheckRequest(service=name)) for name in ("", "mlp")]
    assert not any(a.HasField("error_response") for a in answers), answers
    assert len(files) >= 3, files  # the V2 service's, the model config's it imports, health's, reflection's
    largest = max(answers, key=lambda a: a.ByteSize())
    assert largest.ByteSize() < limit, (largest.ByteSize(), largest.original_request)
    assert max(c.ByteSize() for c in checks) <= 2, checks


async def test_an_open_reflection_stream_ends_with_the_stop_rather_than_hold_it(serve):
    # grpcurl, grpcui and Postman keep one open between their requests.
    async with serve(models=("mlp",)) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            call = reflection_pb2_grpc.ServerReflectionStub(ch).ServerReflectionInfo()
            await call.write(reflection_pb2.ServerReflectionRequest(list_services=""))
            assert (await asyncio.wait_for(call.read(), READ_S)).HasField("list_services_response")
            await server.stop(grace=5)
            await ends_with_the_stop(call)
            assert server._reflection.open_streams == 0


async def test_a_reflection_request_read_before_the_stop_gets_its_answer_then_the_end(serve):
    # Its answer, the request's echo, is past what gRPC's flow control lets through before the client
    # reads (3 MiB: below the client's 4 MiB limit): the stop comes while it is being written.
    symbol = "x" * (3 << 20)
    async with serve(models=("mlp",)) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            call = reflection_pb2_grpc.ServerReflectionStub(ch).ServerReflectionInfo()
            await call.write(reflection_pb2.ServerReflectionRequest(file_containing_symbol=symbol))
            await until(lambda: server._reflection.requests_read == 1)
            stopping = asyncio.ensure_future(server.stop(grace=5))
            answer = await asyncio.wait_for(call.read(), READ_S)
            assert answer.error_response.error_code == grpc.StatusCode.NOT_FOUND.value[0], answer.error_response
            assert answer.original_request.file_containing_symbol == symbol
            await ends_with_the_stop(call)
            await stopping


async def test_stop_turns_health_not_serving_refuses_new_calls_and_finishes_accepted_ones(serve, slow_repository):
    repo = slow_repository(sleep_ms=300, max_batch_size=1, delay_ms=0)
    async with serve(repository=repo) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            stub = pb_grpc.GRPCInferenceServiceStub(ch)
            h = health_pb2_grpc.HealthStub(ch)
            x = {"INPUT0": np.ones((1, 4), np.float32)}
            accepted = asyncio.ensure_future(stub.ModelInfer(encode_request("slow", x)))
            while server.runtimes["slow"].stats.execution_count == 0 and server.runtimes["slow"].batcher.inflight == 0:
                await asyncio.sleep(0.001)
            stopping = asyncio.ensure_future(server.stop(grace=10))
            while not server.draining:
                await asyncio.sleep(0)
            for name in ("", "slow"):
                assert (await h.Check(health_pb2.HealthCheckRequest(service=name))).status == NOT_SERVING
            # ServerReady as Triton's while it exits: UNAVAILABLE, not ready=false.
            for call in (
                lambda: stub.ServerReady(pb.ServerReadyRequest()),
                lambda: stub.ModelInfer(encode_request("slow", x)),
            ):
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await call()
                assert info.value.code() == grpc.StatusCode.UNAVAILABLE
                assert info.value.details() == "server is shutting down and accepts no new requests"
            out = decode_response(await accepted)
            np.testing.assert_array_equal(out["OUTPUT0"], np.full((1, 4), 2.0, np.float32))
            await stopping


async def test_a_grace_period_that_runs_out_logs_what_each_model_still_held(gated_model, caplog):
    # The gated model, batches of 4 and a window of a minute; ten requests: one batch runs, held at
    # the gate, a full one waits at the worker (a busy instance's spare slot), two stay queued as a
    # 0.1 s grace runs out. Every call gets UNAVAILABLE; the batch still waiting at the worker is
    # cancelled by the executor's shutdown, not run. The gate opens once it is: with a 300 ms model's
    # sleep, a host slow through the stop's stages ended the running batch before the shutdown,
    # and the waiting one ran (2 batches, not 1: 1 in 6 runs on one starved core with stalls).
    from wok.app import WokServer
    from wok.config import server_settings
    from wok.repository import ModelRepository

    s, module = gated_model(max_batch_size=4, delay_ms=60_000, depth=2, enter_when_closed=True)
    server = WokServer(server_settings(grpc_port=0, metrics_port=None), ModelRepository([s], "test"))
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            stub = pb_grpc.GRPCInferenceServiceStub(ch)
            x = {"INPUT0": np.ones((1, 4), np.float32)}
            warmed = len(module.batch_sizes)
            module.gate.clear()
            calls = [asyncio.ensure_future(stub.ModelInfer(encode_request("gated", x))) for _ in range(10)]
            batcher = server.runtimes["gated"].batcher

            async def settled():
                while (batcher.queued, batcher.inflight) != (2, 2):
                    await asyncio.sleep(0.005)

            await asyncio.wait_for(settled(), 10)
            waiting = batcher._last_sent[0]  # the batch sent behind the running one

            async def open_once_cancelled():
                while not waiting.cancelled():
                    await asyncio.sleep(0.005)
                module.gate.set()

            opener = asyncio.ensure_future(open_once_cancelled())
            with caplog.at_level("WARNING", logger="wok"):
                await server.stop(grace=0.1)
            opener.cancel()  # done: the stop waited for the running batch, which the gate held till then
            assert waiting.cancelled(), "the batch waiting at the worker was not cancelled by the shutdown"
            results = await asyncio.gather(*calls, return_exceptions=True)
    finally:
        module.gate.set()
        await server.stop(grace=5)
    assert "grace period over: model 'gated': 2 request(s) queued, 2 batch(es) running" in caplog.text, caplog.text
    # The running batch ended; the one waiting at the worker, whose callers had their answer, never ran.
    assert module.batch_sizes[warmed:] == [4]
    # Each caller counted once, as failed: the batch that ended past the grace period reached nobody.
    stats = server.runtimes["gated"].stats
    assert (stats.fail.count, stats.success.count, stats.execution_count) == (10, 0, 0)
    assert all(isinstance(r, grpc.aio.AioRpcError) and r.code() == grpc.StatusCode.UNAVAILABLE for r in results)


async def test_a_model_whose_batcher_fails_turns_not_serving_and_the_server_goes_on(serve):
    async with serve(models=("mlp", "encoder")) as server:
        batcher = server.runtimes["mlp"].batcher

        def bug(*args, **kwargs):
            raise RuntimeError("a bug in the batcher")

        batcher._form = bug  # the batching task's next decision raises, as a bug in it would
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            stub = pb_grpc.GRPCInferenceServiceStub(ch)
            h = health_pb2_grpc.HealthStub(ch)
            x = {"INPUT0": np.ones((1, 256), np.float32)}
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.ModelInfer(encode_request("mlp", x))
            assert info.value.code() == grpc.StatusCode.INTERNAL
            assert info.value.details() == "model 'mlp': batcher failed: a bug in the batcher"
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.ModelInfer(encode_request("mlp", x))
            assert info.value.code() == grpc.StatusCode.INTERNAL
            assert info.value.details() == ("model 'mlp' cannot run requests: its batcher failed: a bug in the batcher")

            async def mlp_not_serving():
                while (await h.Check(health_pb2.HealthCheckRequest(service="mlp"))).status != NOT_SERVING:
                    await asyncio.sleep(0.005)

            await asyncio.wait_for(mlp_not_serving(), 10)
            assert not (await stub.ModelReady(pb.ModelReadyRequest(name="mlp"))).ready
            # The other model and the server as a whole serve on.
            for name in ("", "encoder"):
                assert (await h.Check(health_pb2.HealthCheckRequest(service=name))).status == SERVING
            assert (await stub.ModelReady(pb.ModelReadyRequest(name="encoder"))).ready
            tokens = {"tokens": np.ones((1, 8), np.int64)}
            assert decode_response(await stub.ModelInfer(encode_request("encoder", tokens)))["embedding"].shape == (
                1,
                128,
            )


@pytest.mark.parametrize("where", ["forming", "before_dispatch", "halfway"])
async def test_a_batch_formed_when_the_batcher_fails_gets_the_failure_not_silence(serve, where):
    # A bug between taking a batch off its queue and handing it to the executor (while forming it,
    # once a request is off the queue; before `_dispatch` counted it sent; or halfway through: at
    # the flush counter) failed only the requests still queued: the taken ones' callers waited for
    # an answer that nothing would ever give.
    async with serve(models=("mlp",)) as server:
        batcher = server.runtimes["mlp"].batcher

        def bug(*args, **kwargs):
            raise RuntimeError("a bug in the batcher")

        if where == "forming":
            batcher._forget = bug
        elif where == "halfway":
            batcher.metrics.record_flush = bug
        else:
            batcher._dispatch = bug
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            stub = pb_grpc.GRPCInferenceServiceStub(ch)
            x = {"INPUT0": np.ones((1, 256), np.float32)}
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.ModelInfer(encode_request("mlp", x), timeout=10)
            assert info.value.code() == grpc.StatusCode.INTERNAL
            assert info.value.details() == "model 'mlp': batcher failed: a bug in the batcher"
        assert batcher._dispatched == {} and batcher._queued == 0
        assert server.runtimes["mlp"].stats.fail.count == 1


async def test_a_stop_without_grace_and_without_work_logs_no_grace_warning(serve, caplog):
    # As after a failed start: stop(grace=0) finds every drain still pending, with nothing in it.
    async with serve(models=("mlp",)) as server:
        with caplog.at_level("WARNING", logger="wok"):
            await server.stop(grace=0)
    assert "grace period over" not in caplog.text, caplog.text


# A field tag whose varint runs past the end of the message: protobuf refuses it.
GARBAGE = b"\xff\xff\xff\xff\x0f"
REFLECTION = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"


def _unparsed(error: grpc.aio.AioRpcError, message_type: str, method: str) -> str | None:
    """What is wrong with `error` as the answer to GARBAGE sent to `method`; None if nothing."""
    code, details = error.code(), error.details()
    if code != grpc.StatusCode.INVALID_ARGUMENT:
        return f"{method}: {code} {details!r}"
    if not details.startswith(f"message is not a valid {message_type} ({len(GARBAGE)} bytes): "):
        return f"{method}: {details!r}"
    if not details.endswith(f" (sent to {method})"):
        return f"{method}: {details!r}"
    return None


async def test_bytes_that_are_not_a_request_get_invalid_argument_on_the_other_v2_methods_and_reflection(serve, caplog):
    # The inference methods parsed tolerantly; the others, and reflection, used the generated
    # FromString: grpc.aio answered UNKNOWN and logged an ERROR with a traceback for each call.
    caplog.set_level(logging.WARNING)
    service = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    wrong = []
    async with serve(models=("mlp",)) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            for method in service.methods:
                if method.name in ("ModelInfer", "ModelStreamInfer"):  # tests/integration/test_fuzz_server.py
                    continue
                path = f"/{service.full_name}/{method.name}"
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await ch.unary_unary(path)(GARBAGE, timeout=30)
                wrong.append(_unparsed(info.value, method.input_type.full_name, path))
            call = ch.stream_stream(REFLECTION)(timeout=30)
            await call.write(GARBAGE)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await call.read()
            wrong.append(_unparsed(info.value, "grpc.reflection.v1alpha.ServerReflectionRequest", REFLECTION))
            # The server goes on serving them.
            assert (await pb_grpc.GRPCInferenceServiceStub(ch).ServerMetadata(pb.ServerMetadataRequest())).name == "wok"
    assert [w for w in wrong if w is not None] == []
    assert len(wrong) == len(service.methods) - 2 + 1
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, errors


def _scrape_counts(port: int) -> tuple[dict[str, float], dict[str, float]]:
    """wok_responses_total by code and wok_rejected_requests_total by reason, for model 'slow'."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    codes, reasons = {}, {}
    for f in text_string_to_metric_families(body):
        for s in f.samples:
            if s.labels.get("model") != "slow" or not s.value:
                continue
            if s.name == "wok_responses_total":
                codes[s.labels["code"]] = s.value
            elif s.name == "wok_rejected_requests_total":
                reasons[s.labels["reason"]] = s.value
    return codes, reasons


async def test_a_client_deadline_that_passes_while_its_batch_runs_counts_deadline_exceeded_a_cancel_cancelled(
    gated_model,
):
    # gRPC cancels the handler both ways; a deadline was counted CANCELLED while its client saw
    # DEADLINE_EXCEEDED. Neither is a rejection: each request ran. The gated model holds each batch
    # until the call has ended, so that the end comes while it runs (a 300 ms model's sleep did).
    # The deadline must not pass before the batch starts: a host stalled past it then, gRPC ends the
    # call before wok's handler sees it, and nothing counts it (once in 30 runs with the test
    # stopped 250 ms at a time). Such a try is made again on a new server with twice the time.
    from wok.app import WokServer
    from wok.config import server_settings
    from wok.repository import ModelRepository

    async def counted(rt, n: int) -> dict[str, int]:
        # The handler counts its end once gRPC has cancelled it, after the client saw the end.
        while sum(rt.metrics.responses.values()) < n:
            await asyncio.sleep(0.005)
        return dict(rt.metrics.responses)

    x = {"INPUT0": np.ones((1, 4), np.float32)}
    timeout = 0.1
    for _ in range(6):
        s, module = gated_model(max_batch_size=1, delay_ms=0, depth=1, name="slow", enter_when_closed=True)
        server = WokServer(server_settings(grpc_port=0, metrics_port=0), ModelRepository([s], "test"))
        await server.start()
        try:
            rt = server.runtimes["slow"]
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
                stub = pb_grpc.GRPCInferenceServiceStub(ch)
                module.gate.clear()
                late = asyncio.ensure_future(stub.ModelInfer(encode_request("slow", x), timeout=timeout))
                while not (module.entered.is_set() or late.done()):
                    await asyncio.sleep(0.001)
                if not module.entered.is_set():  # the deadline passed before the batch began
                    late.exception()  # DEADLINE_EXCEEDED, retrieved
                    timeout *= 2
                    continue
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await late
                assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
                assert await asyncio.wait_for(counted(rt, 1), 10) == {"DEADLINE_EXCEEDED": 1}
                module.entered.clear()
                module.gate.set()
                # A call its client cancels while its batch runs.
                while rt.batcher.inflight:
                    await asyncio.sleep(0.005)
                module.gate.clear()
                call = stub.ModelInfer(encode_request("slow", x), timeout=30)
                while not module.entered.is_set():
                    await asyncio.sleep(0.001)
                call.cancel()
                assert await call.code() == grpc.StatusCode.CANCELLED
                assert await asyncio.wait_for(counted(rt, 2), 10) == {"DEADLINE_EXCEEDED": 1, "CANCELLED": 1}
                module.gate.set()
                codes, reasons = await asyncio.to_thread(_scrape_counts, server.http.port)
            break
        finally:
            module.gate.set()
            await server.stop(grace=5)
    else:
        raise AssertionError(f"every call's deadline passed before its batch began, the last after {timeout / 2} s")
    assert codes == {"DEADLINE_EXCEEDED": 1, "CANCELLED": 1}, codes
    assert reasons == {}, reasons


# A deadline of seconds: gRPC sends the time left rounded up to 10 ms (1.0025 s leaves about 1.002 s as
# the header is written, sent as 1010 ms), so the server's deadline is about 7 ms after the client's.
SECONDS_TIMEOUT = 1.0025


async def test_a_client_deadline_of_seconds_counts_deadline_exceeded_and_refused_before_it_ran(
    serve_in_thread, slow_repository
):
    """A client whose deadline passes cancels its call, and with a deadline of 1 s or more that cancel
    comes before the server's own deadline: every such call counted CANCELLED, its client saw
    DEADLINE_EXCEEDED, and those still waiting to run counted no `deadline` refusal, where a deadline under
    1 s (sent to the ms, cut) counted both. Three unary calls, one running, one in a batch held at its busy
    worker, one queued; then a stream of two, one running, one held. The server runs on a loop of its own,
    as `wok serve` does: on the client's loop it saw the cancel late, after its own deadline."""
    srv = serve_in_thread(repository=slow_repository(sleep_ms=1500, max_batch_size=1, delay_ms=0))
    batcher = srv.server.runtimes["slow"].batcher
    x = {"INPUT0": np.ones((1, 4), np.float32)}

    async def counted(n: int) -> tuple[dict[str, float], dict[str, float]]:
        while True:  # a scrape renders at most every 0.25 s
            codes, reasons = await asyncio.to_thread(_scrape_counts, srv.server.http.port)
            if sum(codes.values()) >= n:
                return codes, reasons

    async with grpc.aio.insecure_channel(srv.target) as ch:
        stub = pb_grpc.GRPCInferenceServiceStub(ch)
        calls = [stub.ModelInfer(encode_request("slow", x), timeout=SECONDS_TIMEOUT) for _ in range(3)]
        results = await asyncio.gather(*calls, return_exceptions=True)
        assert [r.code() for r in results] == [grpc.StatusCode.DEADLINE_EXCEEDED] * 3, results
        unary = await asyncio.wait_for(counted(3), 10)
        await until(lambda: not batcher.inflight)  # the batch that ran for nobody
        requests = [encode_request("slow", x, request_id=str(i)) for i in range(2)]
        call = stub.ModelStreamInfer(iter(requests), timeout=SECONDS_TIMEOUT)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            _ = [a async for a in call]
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        streamed = await asyncio.wait_for(counted(5), 10)
    assert unary == ({"DEADLINE_EXCEEDED": 3}, {"deadline": 2})
    assert streamed == ({"DEADLINE_EXCEEDED": 5}, {"deadline": 3})


@pytest.mark.parametrize("cancel_first", [False, True], ids=["refused-then-cancelled", "cancelled-then-refused"])
async def test_a_request_the_batcher_refused_at_its_deadline_counts_deadline_when_grpcs_cancel_comes_first(
    serve, gated_model, cancel_first
):
    """The server's deadline passes with the request queued: the batcher refuses it (DeadlineExceeded on its
    future) and gRPC cancels the handler for the same deadline. When that cancel comes before the handler
    resumes, the handler sees CancelledError, not the refusal, and the `deadline` rejection went uncounted
    (about one run in six of the test above). The order is forced: the refusal cancels the handler."""
    from wok.app import WokServer
    from wok.config import server_settings
    from wok.repository import ModelRepository

    s, module = gated_model(max_batch_size=1, delay_ms=0, depth=1, name="slow")
    server = WokServer(server_settings(grpc_port=0, metrics_port=0), ModelRepository([s], "test"))
    await server.start()
    try:
        rt = server.runtimes["slow"]
        x = {"INPUT0": np.ones((1, 4), np.float32)}
        module.gate.clear()
        running = asyncio.ensure_future(server.service.infer(encode_request("slow", x), None))
        await until(lambda: module.entered.is_set())
        end = time.perf_counter() + 0.05
        queued = asyncio.ensure_future(
            server.service.infer(encode_request("slow", x), 0.05, time_left=lambda: max(0.0, end - time.perf_counter()))
        )
        expire = rt.batcher._expire

        def expire_then_cancel(p, *args) -> None:
            if cancel_first:  # the cancel cancels the handler's future: the refusal then finds it done
                queued.cancel()
                expire(p, *args)
            else:
                expire(p, *args)
                queued.cancel()  # gRPC's cancel for the same deadline, before the handler resumes

        rt.batcher._expire = expire_then_cancel
        with pytest.raises(asyncio.CancelledError):
            await queued
        assert rt.metrics.responses == {"DEADLINE_EXCEEDED": 1}
        assert rt.metrics.rejections["deadline"] == 1
        module.gate.set()
        await running
    finally:
        module.gate.set()
        await server.stop(grace=5)


class _StreamCall:
    """A stream's call as its handler reads it: its requests from `requests` (an async iterator), as grpc.aio's
    context.read() gives them (grpc.aio.EOF at their end), and the time left (none set)."""

    def __init__(self, requests) -> None:
        self._requests = aiter(requests)

    async def read(self):
        return await anext(self._requests, grpc.aio.EOF)

    def time_remaining(self) -> None:
        return None


async def test_a_stream_request_read_but_not_begun_when_the_call_ends_is_counted_cancelled(serve):
    """The handler reads a request and makes its task; the call ends (the client cancelled) before
    that task runs, so `infer`, which counts a cancelled request's code, never sees it. Through gRPC
    the window is one turn of the loop; here the order is forced: the handler is called directly and
    the requests its context reads cancel it as they hand the request over."""
    async with serve(models=("mlp",)) as server:
        rt = server.runtimes["mlp"]
        handler: asyncio.Future

        async def requests():
            handler.cancel()  # before the reader makes the request's task: the handler ends first
            yield encode_request("mlp", {"INPUT0": np.ones((1, 256), np.float32)})
            await asyncio.Event().wait()

        handler = asyncio.ensure_future(server.service.ModelStreamInfer(None, _StreamCall(requests())))
        with pytest.raises(asyncio.CancelledError):
            await handler
        assert rt.metrics.responses == {"CANCELLED": 1}
        assert server.service.active == 0


async def _three_then_open(request):
    """A stream's requests: `request` three times, and the client keeps its side open."""
    for _ in range(3):
        yield request
    await asyncio.Event().wait()


class _UnreadCall(_StreamCall):
    """A stream's call whose client reads nothing: each write waits, as flow control holds it."""

    def __init__(self, requests) -> None:
        super().__init__(requests)
        self.writes = 0

    async def write(self, message) -> None:
        self.writes += 1
        await asyncio.Event().wait()


async def test_stream_answers_its_call_ended_before_writing_are_counted_as_the_client_saw_the_end(serve):
    """Three answers ready, the first held in its write, two queued behind it: the call ends (the
    client cancelled). wok_responses_total counts the three CANCELLED, as the client saw them, not
    OK as they were made. Called directly, as above, so that the order is certain."""
    async with serve(models=("mlp",)) as server:
        rt = server.runtimes["mlp"]
        request = encode_request("mlp", {"INPUT0": np.ones((1, 256), np.float32)})

        call = _UnreadCall(_three_then_open(request))
        handler = asyncio.ensure_future(server.service.ModelStreamInfer(None, call))
        while rt.metrics.request.count < 3 or call.writes < 1:  # every answer made, the first held in its write
            await asyncio.sleep(0.005)
        handler.cancel()
        with pytest.raises(asyncio.CancelledError):
            await handler
        assert call.writes == 1
        assert rt.metrics.responses == {"CANCELLED": 3}
        assert rt.stats.success.count == 0  # made, never written: no caller got them
        assert server.service.active == 0


class _DeadlineCall(_StreamCall):
    """A stream's call whose client reads every answer, with a deadline once `deadline` (time.time())
    is set: its time left as gRPC's context gives it, never below 0."""

    def __init__(self, requests) -> None:
        super().__init__(requests)
        self.deadline: float | None = None
        self.written: list[str] = []

    def time_remaining(self) -> float | None:
        return None if self.deadline is None else max(0.0, self.deadline - time.time())

    async def write(self, message) -> None:
        self.written.append(message.infer_response.id)


async def test_a_stream_answer_made_after_its_calls_deadline_passed_is_not_written_and_counts_deadline_exceeded(
    serve, slow_repository
):
    """As a unary answer made then is not sent: gRPC's core ends the call DEADLINE_EXCEEDED, and its
    client, whose own deadline has passed, reads no more. The stream wrote it all the same, counted
    OK and in success (a request the batcher dropped at its deadline, the stream's, in fail): with
    tritonclient, 10 of 40 streams whose deadline passed as the batcher dropped requests counted an
    error answer in fail that their client never got. Called directly: through gRPC its cancel of the
    handler follows the deadline within a millisecond, and whether an answer comes first is chance."""
    async with serve(repository=slow_repository(sleep_ms=200, delay_ms=1)) as server:
        rt = server.runtimes["slow"]
        x = {"INPUT0": np.ones((1, 4), np.float32)}
        second = asyncio.Event()

        async def requests():
            yield encode_request("slow", x, request_id="0")
            await second.wait()
            yield encode_request("slow", x, request_id="1")
            await asyncio.Event().wait()  # the client keeps its side open

        async def counted(n: int) -> None:
            while sum(rt.metrics.responses.values()) < n:
                await asyncio.sleep(0.005)

        call = _DeadlineCall(requests())
        handler = asyncio.ensure_future(server.service.ModelStreamInfer(None, call))
        try:
            await asyncio.wait_for(counted(1), 10)
            assert call.written == ["0"]
            # 50 ms left: the second request's batch (the model sleeps 200 ms) ends after the
            # deadline, or, should the host stall past it first, the request is refused on arrival.
            call.deadline = time.time() + 0.05
            second.set()
            await asyncio.wait_for(counted(2), 10)
            assert call.written == ["0"]
            assert rt.metrics.responses == {"OK": 1, "DEADLINE_EXCEEDED": 1}
            assert (rt.stats.success.count, rt.stats.fail.count) == (1, 0)
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(handler, 10)
            assert server.service.active == 0 and not server.service._streams
        finally:
            handler.cancel()


def _no_model_request(kind: str):
    """A request of no served model: one naming an unknown model, or bytes that are no request."""
    from wok.service import Unparsed

    if kind == "unknown model":
        return encode_request("nope", {"INPUT0": np.ones((1, 256), np.float32)})
    return Unparsed(InvalidInput("not a ModelInferRequest"))


def _refused(metrics, kind: str) -> int:
    return metrics.unknown_model_requests if kind == "unknown model" else metrics.unparsed_requests


@pytest.mark.parametrize("kind", ["unknown model", "unparsed"])
async def test_stream_answers_of_no_model_its_call_ended_before_writing_count_as_the_client_saw_the_end(serve, kind):
    """As above, for requests of no served model, counted under model="": they counted NOT_FOUND (or
    INVALID_ARGUMENT) as they were refused, written or not. Refused they were: the rejection counts."""
    async with serve(models=("mlp",)) as server:
        metrics = server.metrics
        request = _no_model_request(kind)
        call = _UnreadCall(_three_then_open(request))
        handler = asyncio.ensure_future(server.service.ModelStreamInfer(None, call))
        while _refused(metrics, kind) < 3 or call.writes < 1:  # every answer made, the first held in its write
            await asyncio.sleep(0.005)
        handler.cancel()
        with pytest.raises(asyncio.CancelledError):
            await handler
        assert call.writes == 1
        assert metrics.unmodeled_responses == {"CANCELLED": 3}
        assert server.service.active == 0
        families = {f.name: f for f in metrics.collect()}
        responses = {tuple(s.labels.values()): s.value for s in families["wok_responses"].samples}
        assert responses == {("", "NOT_FOUND"): 0, ("", "INVALID_ARGUMENT"): 0, ("", "CANCELLED"): 3}
        reason = "not_found" if kind == "unknown model" else "invalid"
        rejected = {tuple(s.labels.values()): s.value for s in families["wok_rejected_requests"].samples}
        assert rejected[("", reason)] == 3


class _PastDeadline:
    """A unary call's context whose deadline has passed."""

    def time_remaining(self) -> float:
        return 0.0

    async def abort(self, code, details):  # pragma: no cover - reached only by the bug tested
        raise AssertionError(f"answered {code.name} after the deadline passed: {details}")


@pytest.mark.parametrize("kind", ["unknown model", "unparsed"])
async def test_a_unary_request_of_no_model_refused_after_its_deadline_counts_deadline_exceeded(serve, kind):
    """Its client sees DEADLINE_EXCEEDED (gRPC's core ends the call): counted NOT_FOUND (or
    INVALID_ARGUMENT) under model="", and a status sent raced the core's end, as for a model's own."""
    async with serve(models=("mlp",)) as server:
        metrics = server.metrics
        request = _no_model_request(kind)
        with pytest.raises(asyncio.CancelledError):
            # In a task of its own, as grpc.aio runs a call: its answer counts written as that task ends.
            await asyncio.get_running_loop().create_task(server.service.ModelInfer(request, _PastDeadline()))
        assert metrics.unmodeled_responses == {"DEADLINE_EXCEEDED": 1}
        assert _refused(metrics, kind) == 1  # refused all the same
        assert server.service.active == 0


class _OneWriteCall(_UnreadCall):
    """A stream's call whose client reads the first answer, then no more."""

    async def write(self, message) -> None:
        self.writes += 1
        if self.writes > 1:
            await asyncio.Event().wait()


async def test_stream_errors_its_call_ended_before_writing_count_no_fail(serve, monkeypatch):
    """As for answers (above): three requests the model fails, the first error written, the second held
    in its write, the third queued behind it, and the call ends. ModelStatistics' fail counts the one
    written (it counted all three, as the batcher failed them, before the stream wrote any)."""
    import wok.service

    made = []  # the stream's error answers, as its requests' tasks make them
    error_answer = wok.service.error_answer
    monkeypatch.setattr(wok.service, "error_answer", lambda *a, **kw: made.append(1) or error_answer(*a, **kw))
    async with serve(models=("mlp",)) as server:
        rt = server.runtimes["mlp"]
        for inst in rt.executor.instances:
            inst.fault.set(Fault("fail"))
        request = encode_request("mlp", {"INPUT0": np.ones((1, 256), np.float32)})

        call = _OneWriteCall(_three_then_open(request))
        handler = asyncio.ensure_future(server.service.ModelStreamInfer(None, call))
        while len(made) < 3 or call.writes < 2:
            await asyncio.sleep(0.005)
        handler.cancel()
        with pytest.raises(asyncio.CancelledError):
            await handler
        assert call.writes == 2
        assert rt.metrics.responses == {"INTERNAL": 1, "CANCELLED": 2}
        assert (rt.stats.fail.count, rt.stats.success.count) == (1, 0)
        assert server.service.active == 0


@pytest.mark.parametrize("fails", [False, True], ids=["answer", "error"])
async def test_a_unary_call_cancelled_as_its_batch_comes_back_counts_neither_success_nor_fail(serve, fails):
    """The client's cancel reaches the handler in the loop turn its batch is answered in: the handler
    ends cancelled (CANCELLED, as its client saw it), and counts no success, nor (it did) a failure."""
    async with serve(models=("mlp",)) as server:
        rt = server.runtimes["mlp"]
        if fails:
            for inst in rt.executor.instances:
                inst.fault.set(Fault("fail"))
        request = encode_request("mlp", {"INPUT0": np.ones((1, 256), np.float32)})
        complete = rt.batcher._complete
        handler: asyncio.Future

        def complete_then_cancel(batch, f):
            complete(batch, f)  # answers the batch's futures
            handler.cancel()  # before the handler resumes, as gRPC cancels it

        rt.batcher._complete = complete_then_cancel
        handler = asyncio.ensure_future(server.service.infer(request, None, time_left=lambda: None))
        with pytest.raises(asyncio.CancelledError):
            await handler
        assert rt.metrics.responses == {"CANCELLED": 1}
        assert (rt.stats.fail.count, rt.stats.success.count) == (0, 0)
        assert server.service.active == 0


async def test_an_answer_made_after_its_calls_deadline_passed_is_not_sent_and_counts_deadline_exceeded(serve):
    """gRPC may resume the handler with its answer before it cancels it for the call's deadline,
    which passed as the batch ran: an answer sent then races the core's own end of the call (and
    grpc.aio logs the failed send as an ERROR). `infer` asks the call's time left (here: none) once
    the batch is back and ends as a cancelled call, counted as its client sees it."""
    async with serve(models=("mlp",)) as server:
        rt = server.runtimes["mlp"]
        request = encode_request("mlp", {"INPUT0": np.ones((1, 256), np.float32)})
        with pytest.raises(asyncio.CancelledError, match="deadline passed before its answer was sent"):
            await server.service.infer(request, None, time_left=lambda: 0.0)
        assert rt.metrics.responses == {"DEADLINE_EXCEEDED": 1}
        assert rt.stats.success.count == 0
        # With time left, or none set, the answer is made.
        await server.service.infer(request, None, time_left=lambda: 0.5)
        await server.service.infer(request, None, time_left=lambda: None)
        assert rt.metrics.responses == {"DEADLINE_EXCEEDED": 1, "OK": 2}
        assert server.service.active == 0
        # The batcher put the first in the stage histograms: it is in the end-to-end one too.
        counts = {name: h.count for name, h in rt.metrics.stages.items() if name != "h2d"}
        assert counts == dict.fromkeys(counts, 3) and rt.metrics.request.count == 3, counts


async def test_an_error_made_after_its_calls_deadline_passed_is_not_sent_and_counts_deadline_exceeded(serve):
    """As for an answer: the client sees DEADLINE_EXCEEDED (gRPC's core ends the call), and a status
    sent then races that end. It was counted under the error's own code."""
    async with serve(models=("mlp",)) as server:
        rt = server.runtimes["mlp"]
        bad = encode_request("mlp", {"INPUT0": np.ones((1, 3), np.float32)})  # 3 wide, not 256
        with pytest.raises(asyncio.CancelledError, match="the caller's deadline passed: "):
            await server.service.infer(bad, None, time_left=lambda: 0.0)
        with pytest.raises(InvalidInput):
            await server.service.infer(bad, None, time_left=lambda: 0.5)
        assert rt.metrics.responses == {"DEADLINE_EXCEEDED": 1, "INVALID_ARGUMENT": 1}
        # ModelStatistics' fail counts the error its caller got, whatever refused it.
        assert (rt.stats.fail.count, rt.stats.success.count) == (1, 0)
        assert server.service.active == 0


async def test_a_failed_batch_counts_in_fail_only_for_a_caller_still_waiting(serve):
    """ModelStatistics' fail counts the errors callers get, as success counts answers: a request whose
    batch failed after its call's deadline passed (its client sees DEADLINE_EXCEEDED) is in neither."""
    async with serve(models=("mlp",)) as server:
        rt = server.runtimes["mlp"]
        for inst in rt.executor.instances:
            inst.fault.set(Fault("fail"))
        request = encode_request("mlp", {"INPUT0": np.ones((1, 256), np.float32)})
        with pytest.raises(asyncio.CancelledError, match="the caller's deadline passed: "):
            await server.service.infer(request, None, time_left=lambda: 0.0)
        assert (rt.stats.fail.count, rt.stats.success.count) == (0, 0)
        with pytest.raises(ModelExecutionError, match="instance 0: failing by fault injection"):
            await server.service.infer(request, None, time_left=lambda: 0.5)
        assert (rt.stats.fail.count, rt.stats.success.count) == (1, 0)
        assert rt.metrics.responses == {"DEADLINE_EXCEEDED": 1, "INTERNAL": 1}
        assert server.service.active == 0


@pytest.mark.parametrize(
    ("timeout", "unit"),
    [
        (0.05, 0.001),  # gRPC's least unit: 1 ms
        (0.5, 0.001),
        (1.0025, 0.01),
        (9.0, 0.01),
        (9.99, 0.1),  # a handler that began late reads below the 10.1 s a 10.001 s deadline was sent as
        (30.0, 0.1),
        (3600.0, 10.0),
        (None, 0.0),
        (0.0, 0.0),
    ],
)
def test_the_deadline_slack_is_grpcs_rounding_unit_not_a_share_of_the_timeout(timeout, unit):
    # gRPC sends 1.0025 s as 1010 ms and 30 s to 100 ms: a unit of the third significant figure. 1 % of an
    # hour-long stream's timeout took a client's close in its last 36 s for its deadline; the unit, 10 s.
    from wok.service import grpc_timeout_unit

    assert grpc_timeout_unit(timeout) == pytest.approx(unit)


X1 = {"INPUT0": np.ones((1, 4), np.float32)}


@dataclass
class HeldRead:
    """A server of the gated model whose instance's prewarm read holds its worker until `release` is set
    (`reading` once it began, `read` once it ended), and the model's forwards since it started (`ran`)."""

    server: object
    rt: object
    inst: object
    module: object
    warmed: int
    reading: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    read: threading.Event = field(default_factory=threading.Event)

    @property
    def ran(self) -> list[int]:
        return self.module.batch_sizes[self.warmed :]

    async def released_and_going_on(self, stub) -> None:
        """Release the read: the batch behind it runs no forward (its one request was left out), and the instance
        answers the next call."""
        self.release.set()
        await until(lambda: self.rt.batcher.inflight == 0)
        assert self.ran == []
        assert self.inst.prewarms == 1
        answer = await stub.ModelInfer(encode_request("gated", X1), timeout=30)
        np.testing.assert_array_equal(decode_response(answer)["OUTPUT0"], np.full((1, 4), 2.0, np.float32))
        assert self.ran == [1]


@asynccontextmanager
async def prewarm_read_held(gated_model, monkeypatch):
    """A delay flush (20 ms) to the idle instance follows its prewarm read (its weights read back into the
    caches) on the worker thread: the read is held, its batch sent behind it, until the test releases it."""
    import torch
    from torch import nn

    from wok.app import WokServer
    from wok.config import server_settings
    from wok.repository import ModelRepository

    s, module = gated_model(max_batch_size=4, delay_ms=20, depth=1)
    module.weight = nn.Parameter(torch.zeros(4))  # something to prewarm (read at the executor's start)
    server = WokServer(server_settings(grpc_port=0, metrics_port=0), ModelRepository([s], "test"))
    await server.start()
    rt = server.runtimes["gated"]
    held = HeldRead(server, rt, rt.executor.instances[0], module, len(module.batch_sizes))
    try:
        assert held.inst.can_prewarm
        read_weights = held.inst._read_weights

        def slow_read() -> int:
            held.reading.set()
            held.release.wait(10)
            held.read.set()
            return read_weights()

        monkeypatch.setattr(held.inst, "_read_weights", slow_read)
        yield held
    finally:
        held.release.set()
        await server.stop(grace=5)


async def test_a_call_cancelled_as_its_batch_waits_behind_a_prewarm_read_is_withdrawn_unrun(gated_model, monkeypatch):
    """A call cancelled while its batch waits behind the instance's prewarm read was still run, for nobody:
    a forward of its rows. The read counts as the work ahead of the batch, as a busy instance's batch does:
    the cancelled request is left out, and its one-request batch runs no forward."""
    async with prewarm_read_held(gated_model, monkeypatch) as held:
        rt = held.rt
        async with grpc.aio.insecure_channel(f"127.0.0.1:{held.server.port}") as ch:
            stub = pb_grpc.GRPCInferenceServiceStub(ch)
            call = stub.ModelInfer(encode_request("gated", X1), timeout=30)
            # The read holds the worker, and the batch is sent to the idle instance behind it.
            await until(lambda: held.reading.is_set() and rt.batcher.inflight == 1)
            call.cancel()
            assert await call.code() == grpc.StatusCode.CANCELLED
            await until(lambda: rt.metrics.responses == {"CANCELLED": 1})  # the handler withdrew it, then counted
            await held.released_and_going_on(stub)
        assert (rt.stats.execution_count, rt.stats.inference_count, rt.stats.fail.count) == (1, 1, 0)
        assert not any(rt.metrics.rejections.values())  # withdrawn by its caller, not refused at a deadline
        assert rt.metrics.responses == {"CANCELLED": 1, "OK": 1}


async def test_a_deadline_passing_as_its_batch_waits_behind_a_prewarm_read_is_answered_once_before_the_read_ends(
    gated_model, monkeypatch
):
    """As for a cancel (above), a request whose deadline passes while its batch waits behind the instance's
    prewarm read is answered then, DEADLINE_EXCEEDED naming the wait, not once the read is done; the worker
    then leaves it out (no forward), and it is answered and counted once. The deadline is the request's own
    timeout parameter, short of the call's: the server's answer reaches the client, not gRPC's own."""
    async with prewarm_read_held(gated_model, monkeypatch) as held:
        rt = held.rt
        async with grpc.aio.insecure_channel(f"127.0.0.1:{held.server.port}") as ch:
            stub = pb_grpc.GRPCInferenceServiceStub(ch)
            # Flushed at 20 ms behind the read, well before its deadline: it passes as the batch waits there.
            call = stub.ModelInfer(encode_request("gated", X1, timeout_us=500_000), timeout=30)
            await until(lambda: held.reading.is_set() and rt.batcher.inflight == 1)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await call
            assert not held.read.is_set()  # answered while the read still held the worker, not once it was done
            assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            assert "waiting behind its instance's earlier work: a batch, or a prewarm read" in info.value.details()
            assert rt.metrics.responses == {"DEADLINE_EXCEEDED": 1}
            assert rt.metrics.rejections["deadline"] == 1
            await held.released_and_going_on(stub)
        assert (rt.stats.execution_count, rt.stats.inference_count, rt.stats.fail.count) == (1, 1, 1)
        assert rt.metrics.responses == {"DEADLINE_EXCEEDED": 1, "OK": 1}  # answered once
        assert rt.metrics.rejections["deadline"] == 1
