"""An answer the client cannot read (wok.codec.decode_response's ValueError) fails its own request only.

On a stream it is that request's StreamResult (INTERNAL, the ValueError's message), and the requests
after it get their results; it ended the whole iterator. A unary call's ValueError names the model and
the request id. The server is a plain grpc.aio one that answers as a server other than wok might: the
flaw its answer has is named by the request's model ("broken:size" and so on).
"""

from __future__ import annotations

import asyncio

import grpc
import numpy as np
import pytest

from wok.clients import AsyncClient, Client
from wok.codec import decode_response
from wok.v2pb import grpc_service_pb2 as pb
from wok.v2pb import grpc_service_pb2_grpc as pb_grpc

from .conftest import Loopback

pytestmark = pytest.mark.timeout(60)

X = {"INPUT0": np.ones((1, 2), np.float32)}
GOOD = np.array([[1.0, 2.0]], np.float32)
FLAWS = ["size", "datatype", "dim", "twice"]


def answer(request: pb.ModelInferRequest) -> pb.ModelInferResponse:
    """GOOD as output 'OUT', or with the flaw the model's name gives after "broken:"."""
    resp = pb.ModelInferResponse(model_name=request.model_name, id=request.id)
    out = resp.outputs.add(name="OUT", datatype="FP32", shape=[1, 2])
    raw = GOOD.tobytes()
    flaw = request.model_name.partition("broken:")[2]
    if flaw == "size":
        raw = raw[:4]
    elif flaw == "datatype":
        out.datatype = "FP33"
    elif flaw == "dim":
        out.shape[:] = [-1, 2]
    elif flaw == "twice":
        resp.outputs.add(name="OUT", datatype="FP32", shape=[1, 2])
        resp.raw_output_contents.append(raw)
    resp.raw_output_contents.append(raw)
    return resp


def why(model: str) -> str:
    """decode_response's own message for the answer to a request to `model`."""
    with pytest.raises(ValueError) as info:
        decode_response(answer(pb.ModelInferRequest(model_name=model)))
    return str(info.value)


class Flawed(Loopback, pb_grpc.GRPCInferenceServiceServicer):
    async def ModelInfer(self, request, context):
        return answer(request)

    async def ModelStreamInfer(self, request_iterator, context):
        async for request in request_iterator:
            yield pb.ModelStreamInferResponse(infer_response=answer(request))

    def register(self, server: grpc.aio.Server) -> None:
        pb_grpc.add_GRPCInferenceServiceServicer_to_server(self, server)


def items(flaw: str) -> list:
    return [
        {"model": "m", "inputs": X, "request_id": "a"},
        {"model": f"broken:{flaw}", "inputs": X, "request_id": "b"},
        ("m", X),  # id "2"
    ]


def check_stream(results, flaw: str) -> None:
    assert [r.id for r in results] == ["a", "b", "2"], results
    first, bad, last = results
    for r in (first, last):
        assert r.ok and r.code is None, r
        np.testing.assert_array_equal(r.outputs["OUT"], GOOD)
    assert (bad.model, bad.outputs, bad.code) == (f"broken:{flaw}", None, grpc.StatusCode.INTERNAL)
    assert not bad.ok
    assert bad.error == f"the answer to stream request 'b' of model 'broken:{flaw}' cannot be read: {why(bad.model)}"


@pytest.mark.parametrize("balancer", ["grpc", "wok"])
@pytest.mark.parametrize("flaw", FLAWS)
async def test_aio_stream_an_unreadable_answer_fails_its_request_and_the_stream_goes_on(flaw, balancer):
    async with Flawed() as server, AsyncClient(server.target, balancer=balancer) as client:
        check_stream([r async for r in client.stream_infer(items(flaw))], flaw)


@pytest.mark.parametrize("flaw", FLAWS)
async def test_sync_stream_an_unreadable_answer_fails_its_request_and_the_stream_goes_on(flaw):
    async with Flawed() as server:

        def run() -> list:
            with Client(server.target) as client:
                return list(client.stream_infer(items(flaw)))

        check_stream(await asyncio.to_thread(run), flaw)


@pytest.mark.parametrize(
    ("request_id", "named"), [("r\n7", "request 'r\\n7'"), ("", "the request (sent without a request id)")]
)
async def test_an_unreadable_unary_answer_names_the_model_and_the_request(request_id, named):
    model = "broken:size"
    expected = f"the answer to {named} of model 'broken:size' cannot be read: {why(model)}"
    async with Flawed() as server:
        async with AsyncClient(server.target) as client:
            with pytest.raises(ValueError) as info:
                await client.infer(model, X, request_id=request_id)
            assert str(info.value) == expected
            np.testing.assert_array_equal((await client.infer("m", X))["OUT"], GOOD)  # the client goes on

        def run() -> str:
            with Client(server.target) as client:
                with pytest.raises(ValueError) as info:
                    client.infer(model, X, request_id=request_id)
                np.testing.assert_array_equal(client.infer("m", X)["OUT"], GOOD)
                return str(info.value)

        assert await asyncio.to_thread(run) == expected
