"""Large typed contents: FP32/FP64 read as one copy of their bytes, the rest read in chunks with
the event loop turning between them (`decode_request(in_steps=True)`, `finish_decoding`)."""

from __future__ import annotations

import asyncio
import math

import numpy as np
import pytest
from torch import nn

from wok.codec import CONTENTS_CHUNK, _packed_values, decode_request, decode_response, encode_request, finish_decoding
from wok.config import model_config_from_dict
from wok.datatypes import DATATYPES
from wok.errors import InvalidInput
from wok.servable import Servable
from wok.v2pb import grpc_service_pb2 as pb


def servable(datatype: str, n: int, cls=Servable) -> Servable:
    cfg = model_config_from_dict(
        {
            "name": "id",
            "platform": "python",
            "factory": "x:y",
            "inputs": [
                {"name": "X", "datatype": datatype, "dims": [n]},
                {"name": "S", "datatype": "FP32", "dims": [1]},
            ],
            "outputs": [{"name": "Y", "datatype": datatype, "dims": [n]}],
            "max_batch_size": 2,
        },
        "test",
    )
    return cls(cfg, nn.Identity())


def typed_request(datatype: str, x: np.ndarray) -> pb.ModelInferRequest:
    """X as typed contents, between two small inputs' worth of other work (S, typed FP32)."""
    req = pb.ModelInferRequest(model_name="id")
    t = req.inputs.add(name="X", datatype=datatype, shape=x.shape)
    getattr(t.contents, DATATYPES[datatype].contents_field).extend(x.ravel().tolist())
    s = req.inputs.add(name="S", datatype="FP32", shape=[x.shape[0], 1])
    s.contents.fp32_contents.extend([0.5] * x.shape[0])
    return req


async def finish_counting_turns(dec, s) -> int:
    """finish_decoding, with a task beside it counting the turns the loop gave it meanwhile."""
    turns = 0
    done = asyncio.Event()

    async def beside():
        nonlocal turns
        while not done.is_set():
            await asyncio.sleep(0)
            turns += 1

    task = asyncio.ensure_future(beside())
    try:
        await finish_decoding(dec, s)
    finally:
        done.set()
        await task
    return turns


VALUES = {
    "INT64": lambda n: np.arange(n, dtype=np.int64) * (-(2**33) + 7),
    "INT32": lambda n: (np.arange(n, dtype=np.int64) * 40_503 - 2**30).astype(np.int32),
    "UINT64": lambda n: np.arange(n, dtype=np.uint64) * np.uint64(2**44) + np.uint64(2**64 - 2**45),
    "UINT8": lambda n: (np.arange(n) % 256).astype(np.uint8),
    "INT16": lambda n: (np.arange(n) % 65_536 - 32_768).astype(np.int16),
    "BOOL": lambda n: np.arange(n) % 3 == 0,
    "BYTES": lambda n: np.array([b"%d" % i for i in range(n)], dtype=object),
}


@pytest.mark.parametrize("datatype", sorted(VALUES))
async def test_typed_values_over_a_chunk_are_read_a_chunk_per_turn_of_the_loop_and_equal_the_whole_read(datatype):
    n = 3 * CONTENTS_CHUNK + 5  # four chunks: the first read at once, three after a turn each
    s = servable(datatype, n)
    x = VALUES[datatype](2 * n).reshape(2, n)
    req = typed_request(datatype, x)
    whole = decode_request(req, s)
    assert whole.pending is None
    dec = decode_request(req, s, in_steps=True)
    assert [name for name, _ in dec.pending] == ["X"]
    assert list(dec.inputs) == ["X", "S"] and dec.inputs["X"] is None  # the inputs' order kept
    turns = await finish_counting_turns(dec, s)
    assert turns >= math.ceil(2 * n / CONTENTS_CHUNK) - 1
    assert dec.pending is None
    for d in (whole, dec):
        a = d.inputs["X"]
        assert a.dtype == DATATYPES[datatype].numpy and a.shape == (2, n)
        np.testing.assert_array_equal(a, x)
    np.testing.assert_array_equal(dec.inputs["S"], [[0.5], [0.5]])


def test_typed_values_up_to_a_chunk_are_read_at_once():
    s = servable("INT64", CONTENTS_CHUNK)
    dec = decode_request(typed_request("INT64", VALUES["INT64"](CONTENTS_CHUNK)[None]), s, in_steps=True)
    assert dec.pending is None and dec.inputs["X"].shape == (1, CONTENTS_CHUNK)


def test_a_value_out_of_range_in_a_later_chunk_is_named_by_its_element_in_the_whole_tensor():
    n = CONTENTS_CHUNK + 10
    s = servable("UINT8", n)
    req = pb.ModelInferRequest(model_name="id")
    t = req.inputs.add(name="X", datatype="UINT8", shape=[1, n])
    t.contents.uint_contents.extend([300 if i == CONTENTS_CHUNK + 5 else 1 for i in range(n)])
    req.inputs.add(name="S", datatype="FP32", shape=[1, 1]).contents.fp32_contents.append(0.5)
    want = f"input 'X': value 300 (element {CONTENTS_CHUNK + 5}) does not fit UINT8, expected 0 to 255"
    with pytest.raises(InvalidInput) as info:
        decode_request(req, s)
    assert str(info.value) == want
    dec = decode_request(req, s, in_steps=True)  # the first chunk is clean
    with pytest.raises(InvalidInput) as info:
        asyncio.run(finish_decoding(dec, s))
    assert str(info.value) == want


class Refusing(Servable):
    def check(self, inputs):
        if (inputs["X"] == 7).any():
            raise InvalidInput("input 'X': 7 is refused")


async def test_the_models_value_check_runs_once_every_chunk_is_read():
    n = 2 * CONTENTS_CHUNK
    s = servable("INT64", n, Refusing)
    x = np.zeros((1, n), np.int64)
    x[0, -1] = 7  # in the last chunk
    dec = decode_request(typed_request("INT64", x), s, in_steps=True)  # checked only when read whole
    with pytest.raises(InvalidInput, match="7 is refused"):
        await finish_decoding(dec, s)
    with pytest.raises(InvalidInput, match="7 is refused"):
        decode_request(typed_request("INT64", x), s)


SPECIAL = [0.0, -0.0, 1.5, -1e-45, 1e-310, np.inf, -np.inf, np.nan, 3.4e38, -2.0]


@pytest.mark.parametrize("datatype", ["FP32", "FP64"])
def test_float_contents_are_read_from_their_bytes_bit_for_bit_as_raw(datatype):
    dt = DATATYPES[datatype]
    n = 2 * CONTENTS_CHUNK + 3
    x = np.resize(np.array(SPECIAL, dtype=dt.numpy), 2 * n).reshape(2, n)
    payload_nan = b"\x01\x00\xc0\x7f" if datatype == "FP32" else b"\x01" + b"\x00" * 5 + b"\xf8\x7f"
    x[1, -1] = np.frombuffer(payload_nan, dt.numpy)[0]  # a NaN with a payload
    s = servable(datatype, n)
    req = typed_request(datatype, x)
    assert _packed_values(req.inputs[0].contents, dt, x.size) is not None  # one copy, no value by value read
    dec = decode_request(req, s, in_steps=True)
    assert dec.pending is None
    raw = decode_request(encode_request("id", {"X": x, "S": np.full((2, 1), 0.5, np.float32)}), s)
    bits = np.uint32 if datatype == "FP32" else np.uint64
    np.testing.assert_array_equal(dec.inputs["X"].view(bits), raw.inputs["X"].view(bits))  # NaN payloads too
    np.testing.assert_array_equal(dec.inputs["X"].view(bits), x.view(bits))


@pytest.mark.parametrize("datatype", ["FP32", "FP64"])
def test_float_contents_make_an_aligned_writable_array_as_values_read_one_by_one_do(datatype):
    # Read from the serialized bytes, they start at the field's odd offset there: a view would be
    # misaligned and read-only, and decode_response hands the client's code a response's.
    resp = pb.ModelInferResponse(model_name="id")
    out = resp.outputs.add(name="Y", datatype=datatype, shape=[2, 3])
    getattr(out.contents, DATATYPES[datatype].contents_field).extend([0.5, 1.5, 2.5, 3.5, 4.5, 5.5])
    assert _packed_values(out.contents, DATATYPES[datatype], 6) is not None
    y = decode_response(resp)["Y"]
    assert y.dtype == DATATYPES[datatype].numpy and y.flags.aligned and y.flags.writeable
    y += 1
    assert y.tolist() == [[1.5, 2.5, 3.5], [4.5, 5.5, 6.5]]


def _field(number: int, wire_type: int, payload: bytes) -> bytes:
    def varint(v: int) -> bytes:
        out = bytearray()
        while True:
            out.append((v & 0x7F) | (0x80 if v > 0x7F else 0))
            v >>= 7
            if not v:
                return bytes(out)

    return varint(number << 3 | wire_type) + (varint(len(payload)) if wire_type == 2 else b"") + payload


@pytest.mark.parametrize("form", ["unpacked", "with an unknown field", "two packed runs"])
def test_float_contents_sent_in_another_wire_form_read_the_same(form):
    # What a client sends need not be what protobuf writes back: unpacked values (each with its own
    # tag, as proto2 writes them), a field this version does not know, a repeated field in two runs.
    x = np.array([1.5, -2.0, np.nan, 1e-40, 7.0], np.float32)
    number = pb.InferTensorContents.DESCRIPTOR.fields_by_name["fp32_contents"].number
    if form == "unpacked":
        contents = b"".join(_field(number, 5, v.tobytes()) for v in x)
    elif form == "with an unknown field":
        contents = _field(number, 2, x.tobytes()) + _field(99, 2, b"future")
    else:
        contents = _field(number, 2, x[:2].tobytes()) + _field(number, 2, x[2:].tobytes())
    tensor = pb.ModelInferRequest.InferInputTensor(name="X", datatype="FP32", shape=[1, 5])
    tensor.contents.ParseFromString(contents)
    req = pb.ModelInferRequest(model_name="id", inputs=[tensor])
    req.inputs.add(name="S", datatype="FP32", shape=[1, 1]).contents.fp32_contents.append(0.5)
    got = decode_request(req, servable("FP32", 5)).inputs["X"]
    np.testing.assert_array_equal(got.view(np.uint32), x[None].view(np.uint32))


async def test_a_bad_parameter_is_refused_before_a_later_chunks_bad_value_whether_read_in_steps_or_whole():
    # The same error for one request from the server (in steps) and the fuzzer's check (whole).
    n = CONTENTS_CHUNK + 10
    s = servable("UINT8", n)
    req = pb.ModelInferRequest(model_name="id")
    t = req.inputs.add(name="X", datatype="UINT8", shape=[1, n])
    t.contents.uint_contents.extend([300 if i == n - 1 else 1 for i in range(n)])
    req.inputs.add(name="S", datatype="FP32", shape=[1, 1]).contents.fp32_contents.append(0.5)
    req.parameters["timeout"].string_param = "soon"
    with pytest.raises(InvalidInput, match=r"^parameter 'timeout'"):
        decode_request(req, s)
    with pytest.raises(InvalidInput, match=r"^parameter 'timeout'"):
        dec = decode_request(req, s, in_steps=True)
        await finish_decoding(dec, s)
    del req.parameters["timeout"]
    with pytest.raises(InvalidInput, match=f"element {n - 1}"):
        decode_request(req, s)
