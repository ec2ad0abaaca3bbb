"""A large ModelInferRequest is read from the bytes the server received (codec.parse_infer_request): its raw
tensors are views of them, and it decodes, is sized and is refused as the message protobuf parses is."""

from __future__ import annotations

import copy
import tracemalloc

import numpy as np
import pytest
from google.protobuf.message import DecodeError
from torch import nn

from wok.codec import (
    _MAX_WALKED_FIELDS,
    LARGE_REQUEST,
    OversizedRequest,
    ReceivedRequest,
    _top_fields,
    decode_request,
    encode_request,
    parse_infer_request,
)
from wok.config import model_config_from_dict
from wok.errors import InvalidInput
from wok.servable import Servable
from wok.service import Unparsed, tolerant_parser
from wok.v2pb import grpc_service_pb2 as pb

# The server's deserializer of ModelInfer and ModelStreamInfer requests.
parse = tolerant_parser(pb.ModelInferRequest, "/inference.GRPCInferenceService/ModelInfer")
ROWS = 2


def servable() -> Servable:
    cfg = model_config_from_dict(
        {
            "name": "wide",
            "platform": "python",
            "factory": "x:y",
            "max_batch_size": 4,
            "inputs": [
                {"name": "ids", "datatype": "INT64", "dims": [-1]},
                {"name": "mask", "datatype": "BOOL", "dims": [-1]},
                {"name": "text", "datatype": "BYTES", "dims": [2]},
            ],
            "outputs": [{"name": "Y", "datatype": "INT64", "dims": [-1]}],
        },
        "test",
    )
    return Servable(cfg, nn.Identity())


def inputs(values: int = LARGE_REQUEST) -> dict[str, np.ndarray]:
    return {
        "ids": (np.arange(ROWS * values, dtype=np.int64) * 7919).reshape(ROWS, values),
        "mask": (np.arange(ROWS * values) % 3 == 0).reshape(ROWS, values),
        "text": np.array([[b"a", b"\xff\x00"], [b"", b"word"]], dtype=object),
    }


def request() -> pb.ModelInferRequest:
    req = encode_request("wide", inputs(), outputs=["Y"], request_id="r1", timeout_us=5, priority=2)
    req.parameters["tag"].string_param = "x"
    return req


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    return bytes(out + bytes([n]))


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2) of `number` around `payload`."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def assert_decoded_alike(data: bytes, max_bytes: int | None = None) -> None:
    """`data` parsed by the server decodes, or is refused, as the message protobuf parses of it."""
    s = servable()
    try:
        expected = decode_request(pb.ModelInferRequest.FromString(data), s, max_bytes)
    except InvalidInput as exc:
        with pytest.raises(InvalidInput) as info:
            decode_request(parse(data), s, max_bytes)
        assert str(info.value) == str(exc)
        return
    got = decode_request(parse(data), s, max_bytes)
    assert got.inputs.keys() == expected.inputs.keys()
    for name, a in expected.inputs.items():
        assert got.inputs[name].dtype == a.dtype
        np.testing.assert_array_equal(got.inputs[name], a)
    assert [type(v) for v in got.inputs["text"].reshape(-1)] == [bytes] * 4  # not views of the received bytes
    assert (got.rows, got.outputs, got.timeout_s, got.priority) == (
        expected.rows,
        expected.outputs,
        expected.timeout_s,
        expected.priority,
    )


def test_a_large_request_is_decoded_from_the_received_bytes_without_copying_its_raw_tensors():
    # upb copied each raw tensor as it parsed, again at each read of raw_input_contents[i], and serialized the
    # whole message for the size check (ByteSize): for 64 MiB, ~150 ms of the event loop and 3 copies.
    data = request().SerializeToString()
    s = servable()
    tracemalloc.start()
    try:
        req = parse(data)
        dec = decode_request(req, s, max_bytes=len(data))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert isinstance(req, ReceivedRequest)
    assert req.ByteSize() == pb.ModelInferRequest.FromString(data).ByteSize() == len(data)
    assert peak < len(data) // 8, f"{peak} bytes allocated to decode a request of {len(data)}"
    for name, a in inputs().items():
        np.testing.assert_array_equal(dec.inputs[name], a)
    assert np.shares_memory(dec.inputs["ids"], np.frombuffer(data, np.uint8))
    assert not dec.inputs["ids"].flags.writeable  # as an array of a bytes object is
    assert (req.model_name, req.id, dec.outputs, dec.timeout_s, dec.priority) == ("wide", "r1", ("Y",), 5e-6, 2)


@pytest.mark.parametrize("values", [4, 10_000], ids=["tiny", "80_KiB"])
def test_a_small_request_is_protobufs_message(values):
    # Below LARGE_REQUEST, protobuf's parse and copies are quicker than the walk of the fields that finds the raw ones:
    # with decode_request, 7.80 µs against 9.56 for 64 KiB of raw tensor, 9.86 against 9.65 at 96 KiB (bench/
    # large_decode.py's `break_even`, docs/results/large-decode-2026-12-06f.json); an 80 KiB request was read in place
    # when the threshold was 64 KiB.
    data = encode_request("wide", {"ids": np.zeros((1, values), np.int64)}).SerializeToString()
    assert type(parse(data)) is pb.ModelInferRequest
    assert_decoded_alike(data)


@pytest.mark.parametrize("values", [4, LARGE_REQUEST], ids=["small", "large"])
def test_a_request_is_held_to_the_servers_limit_by_the_bytes_received(values):
    # Its `id` given twice, the first one long: protobuf keeps the last, and its count (ByteSize) leaves the first
    # out; the limit is about the bytes received, and counting them costs no serialization.
    req = encode_request("wide", inputs(values), request_id="r1")
    data = _field(3, b"x" * 2000) + req.SerializeToString()
    assert pb.ModelInferRequest.FromString(data).ByteSize() == len(data) - 2003
    read = tolerant_parser(pb.ModelInferRequest, "/inference.GRPCInferenceService/ModelInfer", len(data) - 1)
    over = read(data)
    assert type(over) is OversizedRequest
    assert (over.size, over.max_bytes, over.model_name, over.id) == (len(data), len(data) - 1, "wide", "r1")
    with pytest.raises(InvalidInput) as info:
        decode_request(over, servable())  # refused whatever decode_request's max_bytes (none here)
    assert str(info.value) == (
        f"request to model 'wide' is {len(data)} bytes, over the limit of {len(data) - 1} bytes "
        "(the server's --max-request-bytes)"
    )
    # At the limit: the message itself, no wrapper a request.
    at = tolerant_parser(pb.ModelInferRequest, "/inference.GRPCInferenceService/ModelInfer", len(data))(data)
    assert type(at) is (ReceivedRequest if values == LARGE_REQUEST else pb.ModelInferRequest)
    np.testing.assert_array_equal(decode_request(at, servable()).inputs["ids"], inputs(values)["ids"])


def test_a_large_request_reads_as_protobufs_message_whatever_the_order_of_its_fields():
    # Raw entries between the other fields, and unknown fields (kept by protobuf, counted in its size), are read
    # in order: the n-th raw entry is the n-th input's.
    req = request()
    raw = [_field(7, r) for r in req.raw_input_contents]
    put = [pb.ModelInferRequest(inputs=[t]).SerializeToString() for t in req.inputs]
    head = pb.ModelInferRequest(model_name=req.model_name, id=req.id).SerializeToString()
    for name in ("model_name", "id", "inputs", "raw_input_contents"):
        req.ClearField(name)
    tail = req.SerializeToString()  # outputs, parameters
    unknown = _field(99, b"kept") + _varint(100 << 3) + b"\x05"  # field 99 (bytes), field 100 (a varint)
    data = raw[0] + head + put[0] + raw[1] + put[1] + unknown + tail + raw[2] + put[2]
    assert type(parse(data)) is ReceivedRequest
    assert parse(data).ByteSize() == pb.ModelInferRequest.FromString(data).ByteSize()
    assert_decoded_alike(data)
    # A field of its message (model_name) given twice: the last one is the one read.
    data += pb.ModelInferRequest(model_name="other").SerializeToString()
    assert parse(data).model_name == "other"


@pytest.mark.parametrize("max_bytes", [None, 1 << 30, LARGE_REQUEST])
@pytest.mark.parametrize("fault", ["none", "short_raw", "entries", "typed_too", "bad_bool"])
def test_a_large_request_is_refused_as_protobufs_message_is(fault, max_bytes):
    req = request()
    if fault == "short_raw":
        req.raw_input_contents[0] = req.raw_input_contents[0][:-1]
    elif fault == "entries":
        del req.raw_input_contents[2]
    elif fault == "typed_too":
        req.inputs[1].contents.bool_contents.append(True)
    elif fault == "bad_bool":
        mask = bytearray(req.raw_input_contents[1])
        mask[-1] = 2
        req.raw_input_contents[1] = bytes(mask)
    data = req.SerializeToString()
    assert type(parse(data)) is ReceivedRequest
    assert_decoded_alike(data, max_bytes)


@pytest.mark.parametrize(
    "cut",
    [
        pytest.param(lambda d: d[:-1], id="truncated_raw_entry"),
        pytest.param(lambda d: d + b"\x0b", id="group"),
        pytest.param(lambda d: d + b"\x02\x00", id="field_0"),
        pytest.param(lambda d: d + b"\x0f", id="wire_type_7"),
        pytest.param(lambda d: d + b"\x3a" + b"\xff" * 11, id="length_of_11_bytes"),
        pytest.param(lambda d: d + b"\x3a", id="no_length"),
        pytest.param(lambda d: d + b"\xba", id="tag_cut_short"),
        # raw_input_contents' tag (58) in 6 bytes: protobuf reads a tag as a varint of at most 5
        pytest.param(lambda d: d + b"\xba" + b"\x80" * 4 + b"\x00" + b"\x01x", id="raw_tag_of_6_bytes"),
        pytest.param(lambda d: d + _field(5, b"\xff"), id="bad_input_message"),
        pytest.param(lambda d: d + _field(1, b"\xff"), id="model_name_not_utf8"),
    ],
)
def test_large_bytes_that_do_not_parse_are_refused_in_protobufs_words(cut):
    data = cut(request().SerializeToString())
    with pytest.raises(DecodeError) as info:
        pb.ModelInferRequest.FromString(data)
    got = parse(data)
    assert isinstance(got, Unparsed)
    assert str(got.error) == (
        f"message is not a valid inference.ModelInferRequest ({len(data)} bytes): {info.value} "
        "(sent to /inference.GRPCInferenceService/ModelInfer)"
    )


def test_a_request_of_many_top_level_fields_is_left_to_protobuf():
    # Walked in Python, each field costs ~0.3 µs of the event loop: a request of millions of tiny ones (here,
    # parameters) would hold it for seconds, where protobuf's C parse takes a fraction of that.
    req = request()
    for i in range(2000):
        req.parameters[f"p{i}"].int64_param = i
    data = req.SerializeToString()
    assert type(parse(data)) is pb.ModelInferRequest
    assert_decoded_alike(data)


def typed_request(values: int) -> pb.ModelInferRequest:
    """A request of `values` typed INT64 values a row (as tritonclient never sends, but a client may)."""
    req = pb.ModelInferRequest(model_name="wide", model_version="", id="r1")
    ids = req.inputs.add(name="ids", datatype="INT64", shape=[ROWS, values])
    ids.contents.int64_contents.extend(range(ROWS * values))
    req.outputs.add(name="Y")
    req.parameters["timeout"].int64_param = 5
    return req


@pytest.mark.parametrize("values", [600, LARGE_REQUEST], ids=["small", "large"])
def test_a_request_over_the_limit_is_refused_without_parsing_its_tensors(values):
    # The refusal needs the model's name and version, and the id a stream's answer echoes: parsing the rest cost a
    # typed request near gRPC's receive limit (4·L + 1 MiB) its whole parse on the event loop, to be refused.
    data = typed_request(values).SerializeToString()
    over = tolerant_parser(pb.ModelInferRequest, "/inference.GRPCInferenceService/ModelInfer", 1024)(data)
    assert type(over) is OversizedRequest
    assert [f.name for f, _ in over.message.ListFields()] == ["model_name", "id"]
    assert (over.model_name, over.model_version, over.id, over.size) == ("wide", "", "r1", len(data))
    with pytest.raises(InvalidInput) as info:
        decode_request(over, servable())
    assert str(info.value) == (
        f"request to model 'wide' is {len(data)} bytes, over the limit of 1024 bytes (the server's --max-request-bytes)"
    )


def test_a_request_over_the_limit_is_refused_for_its_size_though_its_tensors_would_not_parse():
    # Its tensors are not read, so a broken input message is not seen: the size is refused, as gRPC refuses a
    # message over its receive limit unread.
    data = typed_request(LARGE_REQUEST).SerializeToString() + _field(5, b"\xff")
    with pytest.raises(DecodeError):
        pb.ModelInferRequest.FromString(data)
    over = tolerant_parser(pb.ModelInferRequest, "/inference.GRPCInferenceService/ModelInfer", 1024)(data)
    assert type(over) is OversizedRequest and (over.model_name, over.id) == ("wide", "r1")


@pytest.mark.parametrize(
    "head",
    [
        # protobuf keeps the last of a field given twice, and reads one of the wrong wire type as an unknown field
        pytest.param(lambda d: _field(1, b"first") + d + _field(3, b"last"), id="given_twice"),
        pytest.param(lambda d: d + _varint(3 << 3) + b"\x07", id="id_as_a_varint"),
        pytest.param(lambda d: _field(2, b"7") + d + _field(9, b"unknown"), id="version_and_an_unknown_field"),
    ],
)
def test_the_fields_a_refusal_reads_are_protobufs(head):
    data = head(typed_request(LARGE_REQUEST).SerializeToString())
    whole = pb.ModelInferRequest.FromString(data)
    over = tolerant_parser(pb.ModelInferRequest, "/inference.GRPCInferenceService/ModelInfer", 1024)(data)
    assert type(over) is OversizedRequest
    assert (over.model_name, over.model_version, over.id) == (whole.model_name, whole.model_version, whole.id)


def unread(data: bytes, why: str) -> str:
    return (
        f"request is {len(data)} bytes, over the limit of 1024 bytes (the server's --max-request-bytes); its model was "
        f"not read: {why}"
    )


NOT_WALKED = "its top-level field at byte {} is not read (a group, a bad tag or varint, or a field past the end)"


@pytest.mark.parametrize(
    ("cut", "why"),
    [
        pytest.param(
            lambda d: _field(1, b"\xff") + d,
            lambda d: "its model_name, model_version or id does not parse",
            id="model_name_not_utf8",
        ),
        pytest.param(lambda d: d + b"\x0b", lambda d: NOT_WALKED.format(len(d)), id="group"),
        # Its last field, the outputs' (5 bytes: tag, length, and the output's name), cut a byte short.
        pytest.param(lambda d: d[:-1], lambda d: NOT_WALKED.format(len(d) - 5), id="truncated"),
    ],
)
def test_a_request_over_the_limit_whose_head_is_not_read_is_refused_for_its_size_unparsed(cut, why):
    # The walk stops, or a field the refusal reads does not parse: the parse of the whole, which protobuf's words
    # need, cost as much as the tensors before the break (~120 ms for 60 MiB of INT64) to refuse it all the same.
    whole = typed_request(LARGE_REQUEST)
    assert len(_field(6, whole.outputs[0].SerializeToString())) == 5
    whole = whole.SerializeToString()
    data = cut(whole)
    with pytest.raises(DecodeError):
        pb.ModelInferRequest.FromString(data)
    got = tolerant_parser(pb.ModelInferRequest, "/inference.GRPCInferenceService/ModelInfer", 1024)(data)
    assert isinstance(got, Unparsed)
    assert str(got.error) == unread(data, why(whole))


def _tag(key: int, width: int) -> bytes:
    """`key` as a varint of `width` bytes, padded with continuation bytes of no value where it needs fewer."""
    out = bytearray((key >> 7 * i) & 0x7F | 0x80 for i in range(width))
    out[-1] &= 0x7F
    assert key >> 7 * width == 0, f"{key:#x} does not fit in {width} bytes"
    return bytes(out)


# A body of each wire type the walk reads, protobuf's to read as an unknown field's.
_BODIES = {0: b"\x05", 1: bytes(8), 2: b"\x01x", 5: bytes(4)}


def test_the_walk_reads_a_tag_where_protobuf_does():
    # protobuf refuses a tag of over 5 bytes or 32 bits; the walk read a 5-byte tag past 32 bits, so a request over
    # the limit with one after its model's name was refused for its size under that model, where protobuf does not
    # read it at all (now refused unread, as at the walk's other give-ups). Tags around 32 bits and of 1, 5, 6 and 10
    # bytes: every fifth byte under a key of an unknown field number (100), of the largest (2**29 - 1) and of 0.
    cases = [(0xFFFFFFFF, 5), (0xFFFFFFF8, 5), (1 << 32, 5), (1 << 32 | 2, 5), ((1 << 35) - 6, 5), ((1 << 64) - 6, 10)]
    for low in (100 << 3 | 2, (2**29 - 1) << 3 | 5, 100 << 3, 100 << 3 | 1, 1 << 3 | 2, 2):
        cases += [(high << 28 | low, 5) for high in range(128)]
        cases += [(low, width) for width in (1, 2, 5, 6, 10) if low >> 7 * width == 0]
        cases += [(1 << 32 | low, 6), (1 << 63 | low, 10)]
    differ = []
    read = 0
    for key, width in cases:
        data = _tag(key, width) + _BODIES.get(key & 7, b"")
        try:
            pb.ModelInferRequest.FromString(data)
        except DecodeError:
            expected = str
        else:
            read += 1
            expected = [(key, 0, width + 1 if key & 7 == 2 else 0, len(data))]
        got = _top_fields(data)
        if (type(got) is not str) if expected is str else got != expected:
            differ.append(
                f"{key:#x} in {width} bytes: protobuf {'refuses' if expected is str else 'reads'}, walk {got}"
            )
    assert not differ, "\n".join(differ)
    assert 0 < read < len(cases)  # both ways met


def test_the_walk_reads_a_length_where_protobuf_does():
    # protobuf keeps a varint's low 64 bits: a 10-byte length whose last byte sets bits 64 to 69 is read as its low
    # bits, where the walk read the whole value, a field past the end, so a request over the limit with one in its
    # model's name was refused unread, no model named, where protobuf reads the name (found by REVC58's fuzz).
    cases = [(2, 10, high) for high in range(128)] + [(2, 9, 0), (2, 10, 0), (2, 11, 0), (1 << 31, 10, 0)]
    differ = []
    read = 0
    for length, width, high in cases:
        data = b"\x0a" + _tag(high << 63 | length, width) + b"mm"
        try:
            pb.ModelInferRequest.FromString(data)
        except DecodeError:
            expected = str
        else:
            read += 1
            expected = [(0x0A, 0, 1 + width, len(data))]
        got = _top_fields(data)
        if (type(got) is not str) if expected is str else got != expected:
            differ.append(
                f"{high << 63 | length:#x} in {width} bytes: protobuf {'refuses' if expected is str else 'reads'}, "
                f"walk {got}"
            )
    assert not differ, "\n".join(differ)
    assert 0 < read < len(cases)  # both ways met

    name = b"\x0a" + _tag(1 << 64 | 4, 10) + b"wide"
    data = name + typed_request(LARGE_REQUEST).SerializeToString()[len(_field(1, b"wide")) :]
    whole = pb.ModelInferRequest.FromString(data)
    over = tolerant_parser(pb.ModelInferRequest, "/inference.GRPCInferenceService/ModelInfer", 1024)(data)
    assert type(over) is OversizedRequest
    assert (over.model_name, over.model_version, over.id) == (whole.model_name, whole.model_version, whole.id)
    assert over.model_name == "wide"
    # within the limit, read in place (protobuf parsed the whole of it)
    data = name + request().SerializeToString()[len(_field(1, b"wide")) :]
    assert type(parse(data)) is ReceivedRequest
    assert_decoded_alike(data)


def fields_request(fields: int) -> bytes:
    """A large request of raw tensors in `fields` top-level fields, parameters after its own."""
    req = request()
    # Each of a repeated field's items (a map's entries too) is a top-level field of its own.
    own = sum(len(v) if f.is_repeated else 1 for f, v in req.ListFields())
    return req.SerializeToString() + b"".join(_field(4, _field(1, b"k%04d" % i)) for i in range(fields - own))


def test_the_walk_reads_1024_top_level_fields_and_no_more():
    at_most = fields_request(_MAX_WALKED_FIELDS)
    assert len(_top_fields(at_most)) == _MAX_WALKED_FIELDS == 1024
    assert type(parse(at_most)) is ReceivedRequest
    assert_decoded_alike(at_most)
    over = tolerant_parser(pb.ModelInferRequest, "/inference.GRPCInferenceService/ModelInfer", 1024)(at_most)
    assert type(over) is OversizedRequest and (over.model_name, over.id) == ("wide", "r1")

    more = fields_request(_MAX_WALKED_FIELDS + 1)
    assert _top_fields(more) == "more than 1024 top-level fields"
    assert type(parse(more)) is pb.ModelInferRequest  # left to protobuf, within the limit
    assert_decoded_alike(more)
    got = tolerant_parser(pb.ModelInferRequest, "/inference.GRPCInferenceService/ModelInfer", 1024)(more)
    assert isinstance(got, Unparsed)
    assert str(got.error) == unread(more, "more than 1024 top-level fields")


@pytest.mark.parametrize("kind", ["received", "oversized"])
def test_a_received_request_copies_and_deep_copies(kind):
    data = request().SerializeToString()
    max_bytes = 1024 if kind == "oversized" else None
    got = parse_infer_request(data, max_bytes)
    assert type(got) is (OversizedRequest if kind == "oversized" else ReceivedRequest)
    for copied in (copy.copy(got), copy.deepcopy(got)):
        assert type(copied) is type(got)
        assert (copied.model_name, copied.id) == ("wide", "r1")
        if kind == "oversized":
            assert (copied.size, copied.max_bytes) == (len(data), 1024)
        else:
            assert [bytes(r) for r in copied.raw_input_contents] == [bytes(r) for r in got.raw_input_contents]
            assert all(r.readonly for r in copied.raw_input_contents)
            assert_decoded_alike_from(copied, data)
    shallow, deep = copy.copy(got), copy.deepcopy(got)
    assert shallow.message is got.message and deep.message is not got.message
    if kind == "received":
        assert shallow.raw_input_contents is got.raw_input_contents
        assert all(r.obj is not data for r in deep.raw_input_contents)  # not views of the received bytes


def assert_decoded_alike_from(req: ReceivedRequest, data: bytes) -> None:
    s = servable()
    got, expected = decode_request(req, s), decode_request(pb.ModelInferRequest.FromString(data), s)
    assert got.inputs.keys() == expected.inputs.keys()
    for name in expected.inputs:
        np.testing.assert_array_equal(got.inputs[name], expected.inputs[name])
