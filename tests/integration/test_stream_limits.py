"""Answers over the server's send limit, and streams that end while an answer's write is held.

An answer larger than gRPC's send limit (4 × max_request_bytes + 1 MiB) is that request's
RESOURCE_EXHAUSTED, with wok's message, and a stream goes on with the requests after it. A
stream that ends (cancelled, or past its deadline) while flow control holds the write of an
answer (its client reads nothing) ends quietly, as a unary call does: no ERROR in the log.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import tracemalloc

import grpc
import numpy as np

from wok import service
from wok.codec import decode_response, encode_request
from wok.v2pb import grpc_service_pb2 as pb
from wok.v2pb import grpc_service_pb2_grpc as pb_grpc

from ..conftest import REPEAT_MODEL, write_python_model

X = {"INPUT0": np.ones((1, 4), np.float32)}
# With --max-request-bytes 1024 the send limit is 4 × 1024 + 1 MiB = 1,052,672 bytes.
MAX_REQUEST_BYTES = 1024
SEND_LIMIT = 4 * MAX_REQUEST_BYTES + (1 << 20)
# FP32 values per row of the "expand" model's answer: 1,200,000 bytes, over the limit.
EXPAND = 300_000
# FP32 values per row of the "wide" model's answer (1 MiB): HTTP/2's flow control holds the
# server's writes to a client that reads nothing after a few answers (a 4 MiB window).
WIDE = 262_144
GRPC_LOGGER = "grpc._cython.cygrpc"


def _write_model(root, name: str, dims_in: int, width: int) -> None:
    batching = {"max_queue_delay_ms": 1.0}
    write_python_model(
        root / name, REPEAT_MODEL, dims=dims_in, out_dims=width, parameters={"width": width}, dynamic_batching=batching
    )


def _errors(caplog) -> list[str]:
    return [f"{r.name}: {r.getMessage()}" for r in caplog.records if r.levelno >= logging.ERROR]


async def test_an_answer_over_the_send_limit_is_that_request_s_resource_exhausted(serve, slow_repository, caplog):
    caplog.set_level(logging.WARNING)
    repo = slow_repository(sleep_ms=0, delay_ms=1)
    _write_model(repo, "expand", 4, EXPAND)
    async with serve(repository=repo, max_request_bytes=MAX_REQUEST_BYTES) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            stub = pb_grpc.GRPCInferenceServiceStub(ch)
            models = ["slow", "expand", "slow", "slow"]
            reqs = [encode_request(m, X, request_id=str(i)) for i, m in enumerate(models)]
            answers = [r async for r in stub.ModelStreamInfer(iter(reqs), timeout=30)]
            with_timeout = stub.ModelInfer(reqs[1], timeout=30)
            try:
                await with_timeout
                unary = None
            except grpc.aio.AioRpcError as exc:
                unary = exc
            responses = dict(server.runtimes["expand"].metrics.responses)
            st = (await stub.ModelStatistics(pb.ModelStatisticsRequest(name="expand"))).model_stats[0]
    # Every request has its answer (in the order the models finished), and the stream ended OK.
    by_id = {a.infer_response.id: a for a in answers}
    assert sorted(by_id) == ["0", "1", "2", "3"] and len(answers) == 4, answers
    assert {i: bool(a.error_message) for i, a in by_id.items()} == {"0": False, "1": True, "2": False, "3": False}
    size = EXPAND * 4  # the raw output alone; the message is a little larger
    message = by_id["1"].error_message
    assert message.startswith("the answer of model 'expand' is "), message
    got = int(message.split(" is ")[1].split(" bytes")[0].replace(",", ""))
    assert size < got < size + 200, message
    assert f"over the server's send limit of {SEND_LIMIT:,} bytes" in message, message
    assert "--max-request-bytes" in message, message
    code = by_id["1"].infer_response.parameters["status_code"].int64_param
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
    # A unary call gets the same status and message (its answer is 39 bytes smaller).
    assert unary is not None and unary.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, unary
    assert unary.details().startswith("the answer of model 'expand' is "), unary.details()
    assert f"over the server's send limit of {SEND_LIMIT:,} bytes" in unary.details()
    assert responses == {"RESOURCE_EXHAUSTED": 2}, responses
    # Both ran, and both callers got an error: counted failed (they were counted in neither).
    assert st.inference_count == 2
    assert (st.inference_stats.success.count, st.inference_stats.fail.count) == (0, 2)
    assert not _errors(caplog), _errors(caplog)


async def test_an_error_answer_that_echoes_a_huge_id_or_model_name_fits_and_the_stream_goes_on(serve, slow_repository):
    # A request under the receive limit but over max_request_bytes gets INVALID_ARGUMENT; its
    # answer echoed its id (and an unknown model's name, twice) whole: over the send limit, which
    # ended the stream and lost the answers after it.
    repo = slow_repository(sleep_ms=0, delay_ms=1)
    huge = SEND_LIMIT - 64  # an id that fills the request to just under the receive limit
    async with serve(repository=repo, max_request_bytes=MAX_REQUEST_BYTES) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            stub = pb_grpc.GRPCInferenceServiceStub(ch)
            reqs = [
                encode_request("slow", X, request_id="0"),
                pb.ModelInferRequest(model_name="slow", id="i" * huge),
                pb.ModelInferRequest(model_name="m" * (SEND_LIMIT // 2), id="2"),
                encode_request("slow", X, request_id="3"),
            ]
            answers = [r async for r in stub.ModelStreamInfer(iter(reqs), timeout=30)]
    assert len(answers) == 4, [a.infer_response.id[:20] for a in answers]
    ok = sorted(a.infer_response.id for a in answers if not a.error_message)
    assert ok == ["0", "3"], ok
    failed = [a for a in answers if a.error_message]
    codes = sorted(a.infer_response.parameters["status_code"].int64_param for a in failed)
    assert codes == sorted([grpc.StatusCode.INVALID_ARGUMENT.value[0], grpc.StatusCode.NOT_FOUND.value[0]]), codes
    for a in failed:
        assert a.ByteSize() < 16 << 10, a.ByteSize()
        assert "cut to 1024 characters each" in a.error_message, a.error_message[:300]
    # Each cut string ends as a unary call's cut details do (short_details), with its whole length.
    by_code = {a.infer_response.parameters["status_code"].int64_param: a.infer_response for a in failed}
    assert by_code[grpc.StatusCode.INVALID_ARGUMENT.value[0]].id == _cut("i" * huge, 1024)
    assert by_code[grpc.StatusCode.NOT_FOUND.value[0]].model_name == _cut("m" * (SEND_LIMIT // 2), 1024)


def _cut(text: str, keep: int) -> str:
    return f"{text[:keep]}… ({len(text):,} characters in all)"


def test_an_error_answer_cut_to_fit_the_send_limit_ends_its_cuts_as_a_unary_call_s_details_end():
    # Two styles for one cut: a unary call's details (and a stream's message) ended "… (cut: N
    # characters in all)", an error answer's strings cut to fit the send limit "… (N characters)",
    # its message's N the length of the first cut, not of the message.
    message = "model 'm' refused the request: " + "v" * 100_000
    request_id = "i" * SEND_LIMIT
    a = service.error_answer(grpc.StatusCode.INVALID_ARGUMENT, message, SEND_LIMIT, "m", "1", request_id)
    note = " [this answer's model name, id and message are cut to 1024 characters each]"
    assert a.error_message == _cut(message, 1024) + note, a.error_message[-200:]
    assert a.infer_response.id == _cut(request_id, 1024), a.infer_response.id[-100:]
    assert (a.infer_response.model_name, a.infer_response.model_version) == ("m", "1")
    assert service.short_details(message) == _cut(message, 3996)
    # Under the limit, only the message is cut, as a unary call's details are.
    a = service.error_answer(grpc.StatusCode.INVALID_ARGUMENT, message, SEND_LIMIT, "m", "1", "r")
    assert (a.error_message, a.infer_response.id) == (service.short_details(message), "r")


def test_the_size_check_is_exact_at_the_limit():
    # The serialized size decides, and the stream's wrapping counts: the answer gRPC would send.
    def answer(raw: int) -> pb.ModelInferResponse:
        resp = pb.ModelInferResponse(model_name="m", model_version="1", id="r")
        resp.outputs.add(name="OUTPUT0", datatype="UINT8", shape=[1, raw])
        resp.raw_output_contents.append(bytes(raw))
        return resp

    resp = answer(1 << 20)
    n = resp.ByteSize()
    service.check_answer_size(resp, n, "m")
    try:
        service.check_answer_size(resp, n - 1, "m")
    except service.AnswerTooLarge as exc:
        assert f"is {n:,} bytes, over the server's send limit of {n - 1:,} bytes" in str(exc), str(exc)
    else:
        raise AssertionError("an answer one byte over the limit passed")
    wrapped = pb.ModelStreamInferResponse(infer_response=resp).ByteSize()
    service.check_answer_size(resp, wrapped, "m", stream=True)
    try:
        service.check_answer_size(resp, wrapped - 1, "m", stream=True)
    except service.AnswerTooLarge:
        pass
    else:
        raise AssertionError("a stream answer one byte over the limit passed")


async def _stalled_stream(server, stub, n: int, timeout: float | None = None):
    """A stream of `n` requests for the wide model whose client reads nothing: returns the call
    once every request has run and the server's write of an answer is held."""
    call = stub.ModelStreamInfer(timeout=timeout)
    x = {"INPUT0": np.ones((1, 4), np.float32)}
    for i in range(n):
        await call.write(encode_request("wide", x, request_id=str(i)))
    stats = server.runtimes["wide"].stats
    loop = asyncio.get_running_loop()

    async def held():
        # Every request run, and one write of an answer in progress for a while (flow control).
        while not (
            stats.inference_count == n
            and any(
                st.writing_since is not None and loop.time() - st.writing_since > 0.1 for st in server.service._streams
            )
        ):
            await asyncio.sleep(0.005)

    await asyncio.wait_for(held(), 10)
    return call


async def _stream_ended(server, caplog) -> None:
    # The stream's handler is done once it is no longer among the open streams; grpc.aio logs the
    # end of a handler (the ERROR, if any) before another task runs.
    async def ended():
        while server.service._streams and not _errors(caplog):
            await asyncio.sleep(0.005)

    await asyncio.wait_for(ended(), 10)


def _wide_server(serve, tmp_path, **settings):
    repo = tmp_path / "wide-repo"
    _write_model(repo, "wide", 4, WIDE)
    return serve(repository=repo, **settings)


async def test_a_stream_cancelled_while_an_answer_s_write_is_held_ends_quietly(serve, tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    async with _wide_server(serve, tmp_path) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            stub = pb_grpc.GRPCInferenceServiceStub(ch)
            call = await _stalled_stream(server, stub, 12)
            call.cancel()
            await _stream_ended(server, caplog)
            # The server serves on: a fresh stream gets its answers.
            more = [r async for r in stub.ModelStreamInfer(iter([encode_request("wide", X)]), timeout=10)]
            assert [r.error_message for r in more] == [""]
            assert server.service.active == 0
    assert not _errors(caplog), _errors(caplog)


async def test_a_stream_past_its_deadline_while_an_answer_s_write_is_held_ends_quietly(serve, tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    async with _wide_server(serve, tmp_path) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            stub = pb_grpc.GRPCInferenceServiceStub(ch)
            call = await _stalled_stream(server, stub, 12, timeout=2.0)
            assert await call.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            await _stream_ended(server, caplog)
            assert server.service.active == 0
    assert not _errors(caplog), _errors(caplog)


async def test_a_stream_whose_client_writes_far_ahead_of_what_it_reads_is_read_no_further_than_its_window(
    serve, tmp_path
):
    # A client that wrote and did not read made the server read every request and hold every
    # answer: memory without bound. Now the stream reads no further while it owes stream_window
    # answers; the rest of the requests wait in the transports (HTTP/2 flow control).
    window = 16
    n = 4 * window  # small requests: the client writes them all at once
    async with _wide_server(serve, tmp_path, stream_window=window) as server:
        assert server.settings.stream_window == window
        stats = server.runtimes["wide"].stats
        batcher = server.runtimes["wide"].batcher
        loop = asyncio.get_running_loop()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            stub = pb_grpc.GRPCInferenceServiceStub(ch)
            call = stub.ModelStreamInfer(timeout=30)

            async def write_all():
                for i in range(n):
                    x = {"INPUT0": np.full((1, 4), i, np.float32)}
                    await call.write(encode_request("wide", x, request_id=str(i)))
                await call.done_writing()

            writer = asyncio.ensure_future(write_all())

            async def settled():
                # Every request read has run and has its answer, and the server's write of an
                # answer is held (the client's window is full): the server reads no more now.
                while True:
                    for st in server.service._streams:
                        held = st.writing_since is not None and loop.time() - st.writing_since > 0.2
                        if held and not batcher.queued and not batcher.inflight and st.results.qsize() >= st.owed - 1:
                            return st
                    await asyncio.sleep(0.005)

            st = await asyncio.wait_for(settled(), 10)
            read, owed = stats.inference_count, st.owed
            assert owed <= window, f"the stream owes {owed} answers, over its window of {window} ({read} read)"
            # What the server wrote before its write was held: a few 1 MiB answers.
            assert read - owed <= 16, (read, owed)
            # The client reads every answer, exactly once, each its own.
            got = {}
            async for r in call:
                assert not r.error_message, r.error_message
                out = decode_response(r.infer_response)["OUTPUT0"]
                i = int(r.infer_response.id)
                assert i not in got, i
                got[i] = out
            await writer
            assert await call.code() == grpc.StatusCode.OK
        assert sorted(got) == list(range(n))
        for i, out in got.items():
            assert out.shape == (1, WIDE) and out[0, 0] == i and out[0, -1] == i, (i, out[0, :3])
        assert stats.inference_count == n and server.service.active == 0 and not server.service._streams


# FP32 values a row of the "sink" model's requests: 4 MiB, read in place of the received bytes (codec.LARGE_REQUEST);
# its answers, one value a row.
SINK = 1 << 20


async def test_an_answer_waiting_to_be_written_keeps_nothing_of_its_request(serve, tmp_path):
    # A stream's answer waited for its write with the whole request beside it (only its model's name and version
    # are read then), and so the bytes gRPC received for it: a client reading slowly made the server hold up to
    # the stream's window of requests, each up to gRPC's receive limit, besides their answers.
    n = 8
    repo = tmp_path / "repo"
    _write_model(repo, "wide", 4, WIDE)
    _write_model(repo, "sink", SINK, 1)
    async with serve(repository=repo) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            stub = pb_grpc.GRPCInferenceServiceStub(ch)
            call = await _stalled_stream(server, stub, 12)  # the sink's answers wait behind the wide ones' writes
            (st,) = server.service._streams
            sink = server.runtimes["sink"].stats
            request = encode_request("sink", {"INPUT0": np.ones((1, SINK), np.float32)}, request_id="sink")
            tracemalloc.start()
            try:
                before = tracemalloc.get_traced_memory()[0]
                for _ in range(n):
                    await call.write(request)

                async def answered():
                    while sink.inference_count < n or st.results.qsize() < n:
                        await asyncio.sleep(0.005)

                await asyncio.wait_for(answered(), 10)
                held = tracemalloc.get_traced_memory()[0] - before
            finally:
                tracemalloc.stop()
            # Not one request (the stream's reader keeps none of them: test_a_stream_idle_after_a_large_request_...).
            assert held < SINK * 4 // 2, f"{held:,} bytes held by {n} answers of 4 bytes waiting to be written"
            # Every request has its one answer, once the client reads.
            await call.done_writing()
            answers = [r async for r in call]
            assert await call.code() == grpc.StatusCode.OK
    assert [a.error_message for a in answers] == [""] * (12 + n)
    assert sorted(a.infer_response.id for a in answers) == sorted([str(i) for i in range(12)] + ["sink"] * n)
    assert server.service.active == 0


async def _idle_streams(server, stub, request: pb.ModelInferRequest, n: int) -> list:
    """`n` open streams, each having sent `request` once and read its answer; returns once the server has written
    and counted every answer, when each stream's handler waits for the next request and the next answer."""
    calls = []
    for _ in range(n):
        call = stub.ModelStreamInfer(timeout=30)
        await call.write(request)
        answer = await call.read()
        assert not answer.error_message, answer.error_message
        calls.append(call)

    async def idle():
        while server.service.active:
            await asyncio.sleep(0.005)

    await asyncio.wait_for(idle(), 10)
    return calls


async def _close(calls: list) -> None:
    for call in calls:
        await call.done_writing()
        assert await call.read() is grpc.aio.EOF
        assert await call.code() == grpc.StatusCode.OK


def _sink_server(serve, tmp_path):
    repo = tmp_path / "sink-repo"
    _write_model(repo, "sink", SINK, 1)
    return serve(repository=repo)


async def test_a_stream_idle_after_a_large_request_keeps_nothing_of_it(serve, tmp_path):
    # A stream's handler read its requests with `async for` over grpc.aio's request iterator, which kept the last
    # request read (twice: the iterator's variable and the loop's) until the next came: the bytes gRPC received for
    # it, up to gRPC's receive limit, held for as long as the stream stayed open and idle. 4 streams of one 4 MiB
    # request each held 16.8 MB.
    n = 4
    request = encode_request("sink", {"INPUT0": np.ones((1, SINK), np.float32)}, request_id="idle")
    async with _sink_server(serve, tmp_path) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            stub = pb_grpc.GRPCInferenceServiceStub(ch)
            await _close(await _idle_streams(server, stub, request, 1))  # gRPC's and the model's first allocations
            tracemalloc.start()
            try:
                before = tracemalloc.get_traced_memory()[0]
                calls = await _idle_streams(server, stub, request, n)
                held = tracemalloc.get_traced_memory()[0] - before
            finally:
                tracemalloc.stop()
            assert held < SINK * 4 // 2, f"{held:,} bytes held by {n} idle streams of one {SINK * 4:,}-byte request"
            # Each stream goes on: a second request on each has its answer.
            for call in calls:
                await call.write(request)
                assert not (await call.read()).error_message
            await _close(calls)
    assert server.runtimes["sink"].stats.inference_count == 2 * n + 1


async def test_a_stream_idle_after_an_answer_keeps_nothing_of_it(serve, tmp_path):
    # The handler's loop kept the last answer it wrote in its variable while it waited for the next one: as large
    # as the model's answer (up to the send limit) for as long as the stream stayed open and idle.
    n = 4
    request = encode_request("sink", {"INPUT0": np.ones((1, SINK), np.float32)}, request_id="idle-answer")
    async with _sink_server(serve, tmp_path) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            stub = pb_grpc.GRPCInferenceServiceStub(ch)
            calls = await _idle_streams(server, stub, request, n)
            gc.collect()
            kept = [
                o
                for o in gc.get_objects()
                if type(o) is pb.ModelStreamInferResponse and o.infer_response.id == "idle-answer"
            ]
            assert not kept, f"{len(kept)} answers kept by {n} idle streams, each answered once"
            await _close(calls)
