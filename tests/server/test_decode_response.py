"""decode_response, the clients' reading of an answer: one it cannot read raises ValueError naming the output
(not "input", the words of a request's refusals), what was expected and what was got."""

from __future__ import annotations

import numpy as np
import pytest

from wok.codec import decode_response, encode_response
from wok.datatypes import DATATYPES
from wok.v2pb import grpc_service_pb2 as pb

V2 = ", ".join(DATATYPES)


def raw_answer(raw: bytes, datatype: str = "FP32", shape=(1, 3), name: str = "Y") -> pb.ModelInferResponse:
    resp = pb.ModelInferResponse(model_name="m")
    resp.outputs.add(name=name, datatype=datatype, shape=shape)
    resp.raw_output_contents.append(raw)
    return resp


def typed_answer(datatype: str = "FP32", shape=(1, 3), raw: bytes | None = None, **fields) -> pb.ModelInferResponse:
    resp = pb.ModelInferResponse(model_name="m")
    t = resp.outputs.add(name="Y", datatype=datatype, shape=shape)
    for field, values in fields.items():
        getattr(t.contents, field).extend(values)
    if raw is not None:
        resp.raw_output_contents.append(raw)
    return resp


def two_outputs(raw_entries: int, second: str = "Z") -> pb.ModelInferResponse:
    resp = pb.ModelInferResponse(model_name="m")
    for name in ("Y", second):
        resp.outputs.add(name=name, datatype="FP32", shape=[1, 3])
    for _ in range(raw_entries):
        resp.raw_output_contents.append(np.zeros(3, np.float32).tobytes())
    return resp


def bytes_of(*items: bytes) -> bytes:
    return b"".join(len(b).to_bytes(4, "little") + b for b in items)


CASES = {
    # Each said "input 'Y'", and the typed ones "raw_input_contents", of an answer's output.
    "truncated BYTES": (
        raw_answer(bytes_of(b"abc", b"d", b"e")[:-1], "BYTES"),
        "output 'Y': raw BYTES element 2 claims 1 bytes, 0 left",
    ),
    "BYTES too short for its count": (
        raw_answer(bytes_of(b""), "BYTES"),
        "output 'Y': raw BYTES content of 4 bytes cannot hold 3 elements (each needs at least 4 bytes)",
    ),
    "BYTES with bytes left over": (
        raw_answer(bytes_of(b"a", b"b", b"c") + b"!", "BYTES"),
        "output 'Y': raw BYTES content has 1 bytes after 3 elements",
    ),
    "typed values too few": (
        typed_answer(fp32_contents=[1.0, 2.0]),
        "output 'Y': expected 3 values (shape [1, 3]) in fp32_contents for FP32, or the tensor in "
        "raw_output_contents; got 2 values",
    ),
    "typed values in another type's field": (
        typed_answer("FP64", int64_contents=[1, 2, 3]),
        "output 'Y': expected 3 values (shape [1, 3]) in fp64_contents for FP64, or the tensor in "
        "raw_output_contents; got 0 values; int64_contents holds 3 values, which FP64 is not read from",
    ),
    "typed values beside another field": (
        typed_answer(fp32_contents=[1.0, 2.0, 3.0], int_contents=[7]),
        "output 'Y': expected values in fp32_contents alone for FP32; got int_contents (1 value) too, which FP32 is "
        "not read from",
    ),
    "a typed value out of its type's range": (
        typed_answer("INT8", int_contents=[1, 300, 2]),
        "output 'Y': expected INT8 values from -128 to 127; got 300 (element 1)",
    ),
    "FP16 in typed contents": (
        typed_answer("FP16", fp32_contents=[1.0, 2.0, 3.0]),
        "output 'Y': expected FP16 values in raw_output_contents (InferTensorContents has no field for FP16); "
        "got contents: fp32_contents (3 values)",
    ),
    "BF16 sent nowhere": (
        typed_answer("BF16"),
        "output 'Y': expected BF16 values in raw_output_contents (InferTensorContents has no field for BF16); "
        "got no raw_output_contents",
    ),
    # A numpy ValueError that named nothing ("cannot reshape array of size 2 into shape (1,3)").
    "raw content of the wrong size": (
        raw_answer(np.zeros(2, np.float32).tobytes()),
        "output 'Y': expected 12 bytes of raw content (shape [1, 3] of FP32, 4 bytes each); got 8 bytes",
    ),
    "an empty shape numpy cannot address": (
        raw_answer(b"", shape=(1, 2**62, 0)),
        "output 'Y': shape [1, 4611686018427387904, 0] is too large: its dims other than 0 span 18446744073709551616 "
        "bytes of FP32, more than the 9223372036854775807 an array can address",
    ),
    # KeyError: 'FP8'.
    "an unknown datatype": (
        raw_answer(b"", "FP8"),
        f"output 'Y': expected a V2 datatype; got 'FP8', which is not a V2 datatype; the V2 datatypes: {V2}",
    ),
    "no datatype": (raw_answer(b"", ""), "output 'Y': expected a V2 datatype; got (none)"),
    # Read as numpy's "the rest": the 6 values came back as [2, 3], a shape the server did not send.
    "a negative dim": (
        raw_answer(np.zeros(6, np.float32).tobytes(), shape=(-1, 3)),
        "output 'Y': expected dims >= 0; got [-1, 3]",
    ),
    # Read from raw_output_contents, the contents' values dropped without a word.
    "raw and typed contents for one output": (
        typed_answer(fp32_contents=[4.0, 5.0, 6.0], raw=np.ones(3, np.float32).tobytes()),
        "output 'Y': sent both in raw_output_contents and in contents (fp32_contents (3 values)); expected one of them",
    ),
    # IndexError.
    "one raw entry for two outputs": (
        two_outputs(1),
        "raw_output_contents has 1 entry for 2 outputs; expected one entry per output, in the order of the answer's "
        "outputs, or none (every output's values in its contents)",
    ),
    # Accepted, the entry left over dropped.
    "three raw entries for two outputs": (
        two_outputs(3),
        "raw_output_contents has 3 entries for 2 outputs; expected one entry per output, in the order of the answer's "
        "outputs, or none (every output's values in its contents)",
    ),
    # Accepted, the first one's values dropped.
    "an output twice": (
        two_outputs(2, second="Y"),
        "output 'Y' appears more than once (outputs 0 and 1); expected each once",
    ),
    # A name from the wire is quoted as names sent are: a newline cannot break the caller's log line.
    "an output name with a newline": (
        raw_answer(b"\x00", name="a\nb"),
        "output 'a\\nb': expected 12 bytes of raw content (shape [1, 3] of FP32, 4 bytes each); got 1 bytes",
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_an_answer_that_cannot_be_read_raises_value_error_naming_the_output_expected_and_got(case):
    resp, message = CASES[case]
    with pytest.raises(ValueError) as info:
        decode_response(pb.ModelInferResponse.FromString(resp.SerializeToString()))
    # A ValueError itself: InvalidInput (INVALID_ARGUMENT) is the server's refusal of a request.
    assert type(info.value) is ValueError
    assert str(info.value) == message


@pytest.mark.parametrize("datatype", [n for n in DATATYPES if n != "BYTES"])
def test_well_formed_answers_still_read_as_before_raw_and_typed(datatype):
    dt = DATATYPES[datatype]
    x = (np.arange(6) % 2).astype(dt.numpy).reshape(2, 3)
    resp = encode_response("m", "", {"Y": x}, {"Y": dt})
    got = decode_response(resp)["Y"]
    assert got.dtype == dt.numpy and got.shape == (2, 3)
    np.testing.assert_array_equal(got, x)
    if dt.contents_field:
        typed = typed_answer(datatype, (2, 3), **{dt.contents_field: x.ravel().tolist()})
        np.testing.assert_array_equal(decode_response(typed)["Y"], x)
    empty = decode_response(raw_answer(b"", datatype, shape=(0, 3)))["Y"]
    assert empty.shape == (0, 3) and empty.dtype == dt.numpy


def test_an_empty_contents_beside_raw_output_contents_is_read_past():
    # It holds no values to drop: the raw entry is the output's only data.
    resp = raw_answer(np.arange(3, dtype=np.float32).tobytes())
    resp.outputs[0].contents.SetInParent()
    resp = pb.ModelInferResponse.FromString(resp.SerializeToString())
    assert resp.outputs[0].HasField("contents")
    np.testing.assert_array_equal(decode_response(resp)["Y"], np.arange(3, dtype=np.float32).reshape(1, 3))
