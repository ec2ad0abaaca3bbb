"""A large request of raw tensors is read from the bytes the server received (codec.parse_infer_request), on
ModelInfer and ModelStreamInfer alike: its tensors are views of them, not copies."""

from __future__ import annotations

import textwrap

import grpc
import numpy as np
import pytest

from wok.codec import decode_response, encode_request
from wok.v2pb import grpc_service_pb2 as pb

N = 1 << 22  # INT64 ids and BOOL marks of one row: a 36 MiB request

MODEL = textwrap.dedent(
    """
    import numpy as np
    import torch
    from torch import nn


    class Marked(nn.Module):
        def forward(self, ids: torch.Tensor, mark: torch.Tensor) -> torch.Tensor:
            return (ids * mark).sum(dim=1, keepdim=True)


    def build() -> nn.Module:
        return Marked()


    def check(inputs) -> None:
        # What the ids were read from: the bytes of the request as the server received it (through a view),
        # or a copy of their own.
        held = inputs["ids"]
        while isinstance(held, np.ndarray):
            held = held.base
        whole = held.obj if isinstance(held, memoryview) else held
        if len(whole) <= inputs["ids"].nbytes:
            raise ValueError(f"the ids were copied out of the request: {type(whole).__name__} of {len(whole)} bytes")
    """
)

CONFIG = """\
platform = "python"
factory = "model:build"
check = "model:check"
max_batch_size = 1
inputs = [{ name = "ids", datatype = "INT64", dims = [-1] }, { name = "mark", datatype = "BOOL", dims = [-1] }]
outputs = [{ name = "TOTAL", datatype = "INT64", dims = [1] }]
"""


def repository(tmp_path):
    (tmp_path / "repo" / "marked").mkdir(parents=True)
    (tmp_path / "repo" / "marked" / "model.py").write_text(MODEL)
    (tmp_path / "repo" / "marked" / "config.toml").write_text(CONFIG)
    return tmp_path / "repo"


async def test_a_large_raw_request_is_read_from_the_received_bytes_on_modelinfer_and_its_stream(serve, tmp_path):
    ids = np.arange(N, dtype=np.int64).reshape(1, N)
    mark = (np.arange(N) % 3 == 0).reshape(1, N)
    payload = encode_request("marked", {"ids": ids, "mark": mark}).SerializeToString()
    total = int(ids[mark].sum())

    async with serve(repository=repository(tmp_path)) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            infer = ch.unary_unary(
                "/inference.GRPCInferenceService/ModelInfer",
                request_serializer=None,  # sent as bytes: no copy of the client's message on the loop
                response_deserializer=pb.ModelInferResponse.FromString,
            )
            resp = await infer(payload)
            call = ch.stream_stream(
                "/inference.GRPCInferenceService/ModelStreamInfer",
                request_serializer=None,
                response_deserializer=pb.ModelStreamInferResponse.FromString,
            )()
            await call.write(payload)
            answer = await call.read()
            await call.done_writing()
    assert decode_response(resp)["TOTAL"].tolist() == [[total]]
    assert answer.error_message == ""
    assert decode_response(answer.infer_response)["TOTAL"].tolist() == [[total]]


async def test_a_large_raw_request_over_the_limit_is_refused_with_its_size(serve, tmp_path):
    req = encode_request("marked", {"ids": np.ones((1, 1 << 17), np.int64), "mark": np.ones((1, 1 << 17), bool)})
    size = req.ByteSize()
    async with serve(repository=repository(tmp_path), max_request_bytes=size - 1) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            infer = ch.unary_unary(
                "/inference.GRPCInferenceService/ModelInfer",
                request_serializer=pb.ModelInferRequest.SerializeToString,
                response_deserializer=pb.ModelInferResponse.FromString,
            )
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await infer(req)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == (
        f"request to model 'marked' is {size} bytes, over the limit of {size - 1} bytes (the server's "
        "--max-request-bytes)"
    )
