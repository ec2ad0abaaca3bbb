"""The server holds a ModelInfer request to --max-request-bytes by the bytes it received (codec.parse_infer_request),
on ModelInfer and ModelStreamInfer alike: not by protobuf's count of the parsed message (ByteSize, a serialization
of it on every request), which differs from them where the bytes give a field twice, or leave a map entry's value
out."""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from wok.codec import decode_response, encode_request
from wok.v2pb import grpc_service_pb2 as pb

LIMIT = 1024  # the least --max-request-bytes
X = np.arange(4, dtype=np.float32).reshape(1, 4)

MODEL = """\
from torch import nn


class Double(nn.Module):
    def forward(self, x):
        return x * 2


def build():
    return Double()
"""

CONFIG = """\
platform = "python"
factory = "model:build"
max_batch_size = 4
inputs = [{ name = "X", datatype = "FP32", dims = [4] }]
outputs = [{ name = "Y", datatype = "FP32", dims = [4] }]
"""


def repository(tmp_path):
    (tmp_path / "repo" / "double").mkdir(parents=True)
    (tmp_path / "repo" / "double" / "model.py").write_text(MODEL)
    (tmp_path / "repo" / "double" / "config.toml").write_text(CONFIG)
    return tmp_path / "repo"


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    return bytes(out + bytes([n]))


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2) of `number` around `payload`."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def request() -> pb.ModelInferRequest:
    return encode_request("double", {"X": X}, request_id="r1")


def id_given_twice() -> bytes:
    """A request whose `id` (field 3) comes twice, first as 1,100 bytes: protobuf keeps the last one ("r1"), and
    counts 45 bytes; 1,148 were sent."""
    data = _field(3, b"x" * 1100) + request().SerializeToString()
    parsed = pb.ModelInferRequest.FromString(data)
    assert parsed.id == "r1" and parsed.ByteSize() < LIMIT < len(data), (parsed.ByteSize(), len(data))
    return data


def parameters_without_values() -> bytes:
    """A request of map entries with a key and no value (ignored parameters): protobuf writes each with an empty
    value, 2 bytes more, so it counts more bytes than were sent; 1,024 were sent."""
    data = request().SerializeToString()
    i = 0
    while len(data) < LIMIT - 8:
        data += _field(4, _field(1, b"k%04d" % i))
        i += 1
    data += _field(3, b"r" * (LIMIT - len(data) - 2))  # the id again, the last one kept: exactly LIMIT bytes
    parsed = pb.ModelInferRequest.FromString(data)
    assert len(data) == LIMIT < parsed.ByteSize(), (len(data), parsed.ByteSize())
    return data


def canonical_over() -> bytes:
    """A request protobuf writes itself, over the limit: 1,025 bytes sent and counted alike."""
    req = request()
    req.ClearField("id")
    req.id = "r" * (LIMIT + 1 - req.ByteSize() - 3)  # its tag, a length of 2 bytes, and that many bytes
    assert req.ByteSize() == LIMIT + 1
    return req.SerializeToString()


def refusal(size: int) -> str:
    return (
        f"request to model 'double' is {size} bytes, over the limit of {LIMIT} bytes (the server's --max-request-bytes)"
    )


@pytest.mark.parametrize(
    ("payload", "served"),
    [
        pytest.param(id_given_twice, False, id="id_given_twice"),
        pytest.param(parameters_without_values, True, id="parameters_without_values"),
        pytest.param(canonical_over, False, id="canonical_over"),
    ],
)
async def test_a_request_is_held_to_the_limit_by_the_bytes_received_on_modelinfer_and_its_stream(
    serve, tmp_path, payload, served
):
    data = payload()
    async with serve(repository=repository(tmp_path), max_request_bytes=LIMIT) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            infer = ch.unary_unary(
                "/inference.GRPCInferenceService/ModelInfer",
                request_serializer=None,  # the bytes as given
                response_deserializer=pb.ModelInferResponse.FromString,
            )
            call = ch.stream_stream(
                "/inference.GRPCInferenceService/ModelStreamInfer",
                request_serializer=None,
                response_deserializer=pb.ModelStreamInferResponse.FromString,
            )()
            # The stream goes on after a refused request: the next one on it is answered.
            for sent in (data, request().SerializeToString()):
                await call.write(sent)
            answers = [await call.read(), await call.read()]
            await call.done_writing()
            if served:
                unary = await infer(data)
            else:
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await infer(data)
    if served:
        np.testing.assert_array_equal(decode_response(unary)["Y"], X * 2)
        assert answers[0].error_message == "", answers[0].error_message
        np.testing.assert_array_equal(decode_response(answers[0].infer_response)["Y"], X * 2)
    else:
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert info.value.details() == refusal(len(data))
        assert answers[0].error_message == refusal(len(data))
        # The stream's answer names the request it refuses (its id, read from the bytes as protobuf reads them).
        assert answers[0].infer_response.id == pb.ModelInferRequest.FromString(data).id
        assert answers[0].infer_response.model_name == "double"
    assert answers[1].error_message == ""
    np.testing.assert_array_equal(decode_response(answers[1].infer_response)["Y"], X * 2)
