"""`wok bench ramp --rpc stream`: an answer the sender cannot use settles its own request at most.

An answer parses, but its id (a digit that is no ASCII number) or its status_code (a number that names
no gRPC status) is not what the sender expects: that ended the stream's reader, so every request in
flight on the stream counted as UNKNOWN, and the stream was replaced. The server is a plain grpc.aio
one that answers the way a server other than wok might.
"""

from __future__ import annotations

import asyncio
import time

import grpc
import numpy as np
import pytest

from wok.bench import stream_sender
from wok.bench.workers import NOT_SENT, OK, Share
from wok.codec import encode_request
from wok.v2pb import grpc_service_pb2 as pb
from wok.v2pb import grpc_service_pb2_grpc as pb_grpc

pytestmark = pytest.mark.timeout(60)

BAD = 5  # the request whose answer is flawed
N = 10
CODE_FLAWS = {"huge-code": 70_000, "negative-code": NOT_SENT, "no-such-code": 99}


class Flawed(pb_grpc.GRPCInferenceServiceServicer):
    """Answers each request at once with its id, OK, but request BAD's only once BAD + 1 has come (so
    that one is in flight as the flawed answer is read), with the flaw `flaw`."""

    def __init__(self, flaw: str) -> None:
        self.flaw = flaw
        self.streams = 0

    def flawed(self, request: pb.ModelInferRequest) -> pb.ModelStreamInferResponse:
        resp = pb.ModelInferResponse(model_name=request.model_name, id=request.id)
        if self.flaw == "id":
            resp.id = "\N{SUPERSCRIPT FIVE}"  # str.isdigit() says yes; int() refuses it
            return pb.ModelStreamInferResponse(infer_response=resp)
        resp.parameters["status_code"].int64_param = CODE_FLAWS[self.flaw]
        return pb.ModelStreamInferResponse(
            error_message=f"refused with status {CODE_FLAWS[self.flaw]}", infer_response=resp
        )

    async def ModelStreamInfer(self, request_iterator, context):
        self.streams += 1
        held = None
        async for request in request_iterator:
            if request.id == str(BAD):
                held = request
                continue
            if held is not None:
                yield self.flawed(held)
                held = None
            yield pb.ModelStreamInferResponse(infer_response=pb.ModelInferResponse(model_name="m", id=request.id))


async def run(flaw: str, timeout_s: float):
    servicer = Flawed(flaw)
    server = grpc.aio.server()
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        pool = [encode_request("m", {"INPUT0": np.ones((1, 2), np.float32)}).SerializeToString()]
        times = np.arange(N) * 0.01
        share = Share(time.monotonic() + 0.2, times, np.zeros(N, dtype=np.int64), timeout_s)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            out = await asyncio.wait_for(stream_sender.run_share_stream(channel, pool, share, streams=1), 30)
    finally:
        await server.stop(0)
    return out, servicer.streams


@pytest.mark.parametrize("flaw", sorted(CODE_FLAWS))
async def test_a_status_code_that_names_no_grpc_status_is_unknown_for_its_request_alone(flaw):
    out, streams = await run(flaw, timeout_s=10.0)
    expected = [OK] * N
    expected[BAD] = stream_sender.UNKNOWN
    assert out.codes.tolist() == expected
    assert out.details == {stream_sender.UNKNOWN: f"refused with status {CODE_FLAWS[flaw]}"}
    assert streams == 1  # the stream went on


async def test_an_answer_whose_id_is_no_number_of_ours_leaves_the_other_requests_answered():
    # The answer names no request the sender sent: its request waits out its deadline, as for any
    # answer without an id of ours; the one behind it on the stream is answered as usual.
    out, streams = await run("id", timeout_s=1.0)
    expected = [OK] * N
    expected[BAD] = stream_sender.DEADLINE_EXCEEDED
    assert out.codes.tolist() == expected
    assert streams == 1


def test_parse_answer_reads_a_status_number_outside_grpcs_as_unknown():
    for number in (*CODE_FLAWS.values(), 17, -(1 << 63)):
        failed = pb.ModelStreamInferResponse(error_message="no", infer_response=pb.ModelInferResponse(id="3"))
        failed.infer_response.parameters["status_code"].int64_param = number
        assert stream_sender.parse_answer(failed.SerializeToString()) == (3, stream_sender.UNKNOWN), number
    odd = pb.ModelStreamInferResponse(infer_response=pb.ModelInferResponse(id="\N{SUPERSCRIPT FIVE}"))
    assert stream_sender.parse_answer(odd.SerializeToString()) == (None, OK)
