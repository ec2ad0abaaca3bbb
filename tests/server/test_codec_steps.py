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


async def finishing_turns(dec, s) -> tuple[InvalidInput | None, int]:
    """finish_decoding, with a task beside it counting the turns the loop gave it meanwhile: its refusal (None where
    it read the request) and the turns."""
    turns = 0
    done = asyncio.Event()

    async def beside():
        nonlocal turns
        while not done.is_set():
            await asyncio.sleep(0)
            turns += 1

    task = asyncio.ensure_future(beside())
    refused = None
    try:
        await finish_decoding(dec, s)
    except InvalidInput as exc:
        refused = exc
    finally:
        done.set()
        await task
    return refused, turns


async def finish_counting_turns(dec, s) -> int:
    refused, turns = await finishing_turns(dec, s)
    assert refused is None, refused
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
    want = f"input 'X': expected UINT8 values from 0 to 255; got 300 (element {CONTENTS_CHUNK + 5})"
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


ROWS = 1000


def checked(n: int, **id_ranges: int) -> Servable:
    """servable("INT64", n) whose X reaches a table of ROWS rows (and any input named in `id_ranges`, its own): its
    ids are checked (codec.check_ids)."""
    return Servable(servable("INT64", n).config, nn.Identity(), id_ranges={"X": ROWS, **id_ranges})


def refusal(lo, hi, where: str = "", name: str = "X", rows: int = ROWS) -> str:
    return (
        f"input '{name}': expected ids in [0, {rows}) (the rows of the embedding table model 'id' looks them up in); "
        f"got values from {lo} to {hi}{where}"
    )


async def refused_after_turns(dec, s) -> tuple[InvalidInput, int]:
    refused, turns = await finishing_turns(dec, s)
    assert refused is not None, "the request was read, not refused"
    return refused, turns


async def test_ids_read_in_chunks_are_checked_a_chunk_at_a_time_and_refused_at_the_chunk_holding_one_past():
    """finish_decoding ran one min and max over the whole input after its last chunk, in one turn of the loop (~4.7 ms
    per 64 MB): each chunk is checked as it is read, and the first one holding an id past the table refuses the request,
    the chunks after it unread, its message saying how far it read."""
    n = 5 * CONTENTS_CHUNK + 3  # six chunks: the first read in decode_request, five in turns of their own
    s = checked(n)
    x = (np.arange(n, dtype=np.int64) % ROWS)[None]
    whole = decode_request(typed_request("INT64", x), s, in_steps=True)
    assert await finish_counting_turns(whole, s) >= 5
    np.testing.assert_array_equal(whole.inputs["X"], x)

    x[0, 2 * CONTENTS_CHUNK + 7] = ROWS + 4  # in the third chunk
    want = refusal(0, ROWS + 4, f" in its first {3 * CONTENTS_CHUNK:,} of {n:,} values (the rest not read)")
    exc, turns = await refused_after_turns(decode_request(typed_request("INT64", x), s, in_steps=True), s)
    assert str(exc) == want
    # Refused in the turn after the third chunk's: the three after it were never read.
    assert turns <= 3
    with pytest.raises(InvalidInput) as info:  # read whole (decode_request alone), the same
        decode_request(typed_request("INT64", x), s)
    assert str(info.value) == want


async def test_an_id_past_the_table_in_the_last_chunk_reads_as_the_whole_inputs_check_read():
    n = 3 * CONTENTS_CHUNK + 5
    s = checked(n)
    x = (np.arange(n, dtype=np.int64) % ROWS)[None]
    x[0, -1] = -2
    exc, _ = await refused_after_turns(decode_request(typed_request("INT64", x), s, in_steps=True), s)
    assert str(exc) == refusal(-2, ROWS - 1)  # every value read: no "first … of …"


async def test_a_bad_parameter_is_refused_before_an_id_past_the_table_in_the_first_chunk():
    """The first chunk is read in decode_request's loop over the inputs; its ids are checked after that turn, so
    that a bad parameter is refused first, as when every id was checked after the read, in steps or whole."""
    n = 2 * CONTENTS_CHUNK
    s = checked(n)
    x = np.zeros((1, n), np.int64)
    x[0, 0] = ROWS
    req = typed_request("INT64", x)
    req.parameters["timeout"].string_param = "soon"
    with pytest.raises(InvalidInput, match=r"^parameter 'timeout'"):
        decode_request(req, s)
    with pytest.raises(InvalidInput, match=r"^parameter 'timeout'"):
        decode_request(req, s, in_steps=True)
    del req.parameters["timeout"]
    exc, _ = await refused_after_turns(decode_request(req, s, in_steps=True), s)
    assert str(exc) == refusal(0, ROWS, f" in its first {CONTENTS_CHUNK:,} of {n:,} values (the rest not read)")


async def test_an_input_read_whole_is_checked_before_the_chunked_one_is_read():
    """S (one value, read whole in decode_request) past its table: refused before any chunk of X is read, not
    after all of them."""
    n = 4 * CONTENTS_CHUNK
    s = checked(n, S=1)
    req = typed_request("INT64", np.zeros((1, n), np.int64))
    req.inputs[1].contents.fp32_contents[0] = 2.0
    exc, turns = await refused_after_turns(decode_request(req, s, in_steps=True), s)
    assert str(exc) == refusal(2.0, 2.0, name="S", rows=1)
    assert turns == 0
