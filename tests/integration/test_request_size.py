"""The server holds a ModelInfer request to --max-request-bytes by the bytes it received (codec.parse_infer_request),
on ModelInfer and ModelStreamInfer alike: not by protobuf's count of the parsed message (ByteSize, a serialization
of it on every request), which differs from them where the bytes give a field twice, or leave a map entry's value
out."""

from __future__ import annotations

import asyncio
import urllib.request

import grpc
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

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


def tensors_broken() -> bytes:
    """Over the limit, its model, version and id read, an input message after them that does not parse."""
    return request().SerializeToString() + _field(5, b"\xff" * LIMIT)


def many_fields() -> bytes:
    """Over the limit in 1,025 top-level fields (parameters after the request's own), one more than the walk reads:
    protobuf's parse of the whole would read the model, as it does at any size."""
    req = request()
    # Each of a repeated field's items (a map's entries too) is a top-level field of its own.
    own = sum(len(v) if f.is_repeated else 1 for f, v in req.ListFields())
    return req.SerializeToString() + b"".join(_field(4, _field(1, b"k%04d" % i)) for i in range(1025 - own))


def cut_short() -> bytes:
    """Over the limit, its last field (the id again) cut a byte short."""
    return request().SerializeToString() + _field(3, b"x" * LIMIT)[:-1]


def tag_past_32_bits() -> bytes:
    """Over the limit, after its model's name and id a field whose tag is a 5-byte varint of 33 bits (field 100,
    wire type 2, and 2**32): protobuf reads a tag of 32 bits at most, and refuses the whole as bytes that do not
    parse."""
    tag = bytes([0xA2, 0x86, 0x80, 0x80, 0x10])
    return request().SerializeToString() + tag + _varint(LIMIT) + b"x" * LIMIT


def _rejected(body: str) -> dict[str, float]:
    """wok_rejected_requests_total{reason="invalid"} by model, the models counting none left out."""
    return {
        s.labels["model"]: s.value
        for f in text_string_to_metric_families(body)
        for s in f.samples
        if s.name == "wok_rejected_requests_total" and s.labels["reason"] == "invalid" and s.value
    }


UNREAD = (
    "request is {size} bytes, over the limit of 1024 bytes (the server's --max-request-bytes); its model was not read: "
)


@pytest.mark.parametrize(
    ("payload", "counted", "details"),
    [
        # The refusal reads no more than the model's name and version and the id: whether the rest would parse is
        # not known, and the request is the model's, refused for its size.
        pytest.param(tensors_broken, "double", None, id="tensors_broken"),
        # Its model not read (protobuf's parse of the whole, ~120 ms of the event loop at 60 MiB, would read it):
        # bytes read as no request, refused for their size under no model.
        pytest.param(many_fields, "", UNREAD + "more than 1024 top-level fields", id="many_fields"),
        pytest.param(
            cut_short,
            "",
            UNREAD + "its top-level field at byte {at} is not read (a group, a bad tag or "
            "varint, or a field past the end)",
            id="cut_short",
        ),
        pytest.param(
            tag_past_32_bits,
            "",
            UNREAD + "its top-level field at byte {at} is not read (a group, a bad tag or "
            "varint, or a field past the end)",
            id="tag_past_32_bits",
        ),
    ],
)
async def test_a_request_over_the_limit_is_counted_under_the_model_it_was_read_for_or_none(
    serve, tmp_path, payload, counted, details
):
    data = payload()
    assert len(data) > LIMIT
    async with serve(repository=repository(tmp_path), max_request_bytes=LIMIT) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            infer = ch.unary_unary(
                "/inference.GRPCInferenceService/ModelInfer",
                request_serializer=None,
                response_deserializer=pb.ModelInferResponse.FromString,
            )
            call = ch.stream_stream(
                "/inference.GRPCInferenceService/ModelStreamInfer",
                request_serializer=None,
                response_deserializer=pb.ModelStreamInferResponse.FromString,
            )()
            await call.write(data)
            answer = await call.read()
            await call.done_writing()
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await infer(data)
            url = f"http://127.0.0.1:{server.http.port}/metrics"
            body = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=10).read().decode())
    if details is None:
        expected = refusal(len(data))
        assert answer.infer_response.id == "r1" and answer.infer_response.model_name == "double"
    else:
        expected = details.format(size=len(data), at=len(request().SerializeToString()))
        assert answer.infer_response.id == "" and answer.infer_response.model_name == ""
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == expected
    assert answer.error_message == expected
    assert _rejected(body) == {counted: 2}  # the unary call's and the stream's
