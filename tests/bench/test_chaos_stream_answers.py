"""bench/chaos.py: a stream answer whose id is no ASCII number of the client's is a stray id, not the reader's end.

"²" passes str.isdigit() and int() refuses it: the ValueError ended the stream's reader and took the
stream's task down. The server is a plain grpc.aio one that answers the way a server other than wok might.
"""

from __future__ import annotations

import random

import grpc
import numpy as np
import pytest

from wok.bench import chaos
from wok.codec import encode_response
from wok.datatypes import DATATYPES
from wok.v2pb import grpc_service_pb2 as pb
from wok.v2pb import grpc_service_pb2_grpc as pb_grpc

pytestmark = pytest.mark.timeout(60)

ODD = "\N{SUPERSCRIPT TWO}"  # str.isdigit() says yes; int() refuses it


class Model(pb_grpc.GRPCInferenceServiceServicer):
    """Answers each stream request as the chaos model would, the second one under the id ODD."""

    async def ModelStreamInfer(self, request_iterator, context):
        k = 0
        async for request in request_iterator:
            k += 1
            x = np.frombuffer(request.raw_input_contents[0], np.float32).reshape(-1, 2)
            idx = np.frombuffer(request.raw_input_contents[1], np.int64).reshape(-1, 1)
            y = 2 * x + np.concatenate([idx, -idx], 1).astype(np.float32)
            rid = ODD if k == 2 else request.id
            yield pb.ModelStreamInferResponse(
                infer_response=encode_response(chaos.MODEL, rid, {"y": y}, {"y": DATATYPES["FP32"]})
            )


async def test_an_answer_whose_id_is_a_digit_int_refuses_is_a_stray_id_and_the_stream_goes_on():
    server = grpc.aio.server()
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(Model(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        run = chaos.Run(chaos.Plan(seconds=1.0))
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            client = chaos._Client(channel, run)
            rng = random.Random(0)
            reqs = [client.new(rng, "stream", "good", stream="s") for _ in range(4)]
            st = chaos.Stream("s", serials=[r.serial for r in reqs])
            await client.stream("s", reqs, st, [0.0] * len(reqs))
    finally:
        await server.stop(0)
    assert (st.status, st.stray_ids) == ("OK", [ODD])
    assert reqs[1].answers == []
    for r in reqs[:1] + reqs[2:]:
        assert r.answers == [("OK", "", r.expected())], r.serial
