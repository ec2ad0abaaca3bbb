"""Every V2 datatype survives the trip client → server → model → client, raw and typed."""

from __future__ import annotations

import tracemalloc

import grpc
import numpy as np
import pytest
import torch
from torch import nn

from wok import codec
from wok.codec import decode_request, decode_response, encode_request, encode_response
from wok.config import model_config_from_dict
from wok.datatypes import DATATYPES
from wok.errors import InvalidInput
from wok.servable import HostBuffers, Servable
from wok.tensors import from_numpy, to_numpy_view
from wok.v2pb import grpc_service_pb2 as pb

NUMERIC = [n for n in DATATYPES if n != "BYTES"]


def identity(datatype: str) -> Servable:
    cfg = model_config_from_dict(
        {
            "name": "id",
            "platform": "python",
            "factory": "x:y",
            "inputs": [{"name": "X", "datatype": datatype, "dims": [3]}],
            "outputs": [{"name": "Y", "datatype": datatype, "dims": [3]}],
            "max_batch_size": 4,
        },
        "test",
    )
    return Servable(cfg, nn.Identity())


def sample(datatype: str) -> np.ndarray:
    dt = DATATYPES[datatype]
    if datatype == "BOOL":
        return np.array([[True, False, True], [False, False, True]])
    if datatype == "BF16":
        # bfloat16 words for 1.0, -2.5, 0.15625 (exactly representable), as uint16.
        return torch.tensor([[1.0, -2.5, 0.15625], [3.0, 0.0, -1.0]], dtype=torch.bfloat16).view(torch.uint16).numpy()
    info = np.iinfo(dt.numpy) if dt.numpy.kind in "iu" else None
    if info is not None:
        return np.array([[info.min, 0, info.max], [1, 2, 3]], dtype=dt.numpy)
    return np.array([[-1.5, 0.0, 3.25], [1e-3, 2.0, -7.0]], dtype=dt.numpy)


def through_model(s: Servable, req: pb.ModelInferRequest) -> pb.ModelInferResponse:
    dec = decode_request(req, s)
    host = s.assemble([dec.inputs], dec.rows, HostBuffers(pinned=False))
    with torch.inference_mode():
        out = s.forward(s.module_for(torch.device("cpu")), s.prepare(host))
    arrays = {k: to_numpy_view(v) for k, v in out.items()}
    return encode_response("id", "r1", arrays, s.output_types)


@pytest.mark.parametrize("datatype", NUMERIC)
def test_raw_round_trip_through_the_model(datatype):
    s = identity(datatype)
    x = sample(datatype)
    req = encode_request("id", {"X": x}, datatypes={"X": datatype})
    resp = through_model(s, req)
    assert resp.outputs[0].datatype == datatype and list(resp.outputs[0].shape) == [2, 3]
    np.testing.assert_array_equal(decode_response(resp)["Y"], x)


def test_bf16_reaches_the_model_as_bfloat16():
    x = sample("BF16")
    t = from_numpy(x, DATATYPES["BF16"])
    assert t.dtype == torch.bfloat16
    assert t.float().tolist() == [[1.0, -2.5, 0.15625], [3.0, 0.0, -1.0]]


@pytest.mark.parametrize("datatype", [n for n in NUMERIC if DATATYPES[n].contents_field])
def test_typed_contents_decode_like_raw(datatype):
    s = identity(datatype)
    x = sample(datatype)
    req = pb.ModelInferRequest(model_name="id")
    t = req.inputs.add(name="X", datatype=datatype, shape=x.shape)
    getattr(t.contents, DATATYPES[datatype].contents_field).extend(x.ravel().tolist())
    np.testing.assert_array_equal(decode_request(req, s).inputs["X"], x)


@pytest.mark.parametrize(
    "raw, got",
    [
        (bytes([1, 0, 2, 1, 1, 1]), "got 2 at element 2 (index [0, 2])"),
        (bytes([0, 1, 1, 1, 255, 7]), "got 255 at element 4 (index [1, 1])"),  # the first bad one is named
    ],
)
def test_a_raw_bool_byte_other_than_0_or_1_is_refused_naming_the_first(raw, got):
    # numpy and torch would take the byte for a bool as it is; a model that sends it back sends the byte.
    req = encode_request("id", {"X": np.zeros((2, 3), np.bool_)})
    req.raw_input_contents[0] = raw
    with pytest.raises(InvalidInput) as info:
        decode_request(req, identity("BOOL"))
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert str(info.value) == f"input 'X': expected BOOL values as bytes 0 or 1 in raw_input_contents; {got}"


@pytest.mark.parametrize("datatype", ["FP16", "BF16"])
def test_types_without_a_contents_field_must_be_raw(datatype):
    req = pb.ModelInferRequest(model_name="id")
    req.inputs.add(name="X", datatype=datatype, shape=[1, 3])
    with pytest.raises(InvalidInput, match=f"input 'X': expected {datatype} values in raw_input_contents"):
        decode_request(req, identity(datatype))


def test_bytes_round_trip_raw_and_typed():
    s = identity("BYTES")
    x = np.array([[b"a", b"", b"\x00\xff"], [b"wok", b"x" * 300, b"z"]], dtype=object)
    raw = decode_request(encode_request("id", {"X": x}), s).inputs["X"]
    assert raw.tolist() == x.tolist()
    req = pb.ModelInferRequest(model_name="id")
    req.inputs.add(name="X", datatype="BYTES", shape=[2, 3]).contents.bytes_contents.extend(x.ravel().tolist())
    assert decode_request(req, s).inputs["X"].tolist() == x.tolist()
    resp = encode_response("id", "", {"Y": x}, s.output_types)
    assert decode_response(resp)["Y"].tolist() == x.tolist()


def test_bytes_like_elements_are_sent_as_their_bytes_not_their_repr():
    x = np.empty((1, 3), dtype=object)
    x[0] = [bytearray(b"\x00\x01"), memoryview(b"mv"), "caf\u00e9"]
    req = encode_request("id", {"X": x})
    assert req.raw_input_contents[0].startswith(b"\x02\x00\x00\x00\x00\x01")
    assert decode_request(req, identity("BYTES")).inputs["X"].tolist() == [[b"\x00\x01", b"mv", "café".encode()]]


def test_truncated_bytes_content_is_invalid():
    req = encode_request("id", {"X": np.array([[b"abc", b"d", b"e"]], dtype=object)})
    req.raw_input_contents[0] = req.raw_input_contents[0][:-1]
    with pytest.raises(InvalidInput, match="input 'X': raw BYTES element 2 claims 1 bytes, 0 left"):
        decode_request(req, identity("BYTES"))


def test_requested_outputs_and_the_timeout_parameter():
    s = identity("FP32")
    req = encode_request("id", {"X": np.zeros((1, 3), np.float32)}, outputs=["Y"], timeout_us=2500)
    dec = decode_request(req, s)
    assert dec.outputs == ("Y",) and dec.timeout_s == pytest.approx(0.0025)
    req.parameters["timeout"].string_param = "soon"
    with pytest.raises(InvalidInput, match="parameter 'timeout': expected a non-negative integer of microseconds"):
        decode_request(req, s)


EXPECTED_PARAM = {
    "timeout": "parameter 'timeout': expected a non-negative integer of microseconds as int64_param or uint64_param",
    "priority": "parameter 'priority': expected an integer from 0 to 1000000 as int64_param or uint64_param "
    "(1 most urgent, 0 the default)",
}


@pytest.mark.parametrize("key", ["timeout", "priority"])
@pytest.mark.parametrize(
    "kind, value, got",
    [
        ("string_param", "100", "string_param '100'"),
        ("string_param", "1", "string_param '1'"),  # an integer's digits, but a string: not "got 1"
        ("double_param", 1e6, "double_param 1000000.0"),
        ("int64_param", -5, "int64_param -5"),
        ("bool_param", True, "bool_param true"),
        ("bool_param", False, "bool_param false"),
        ("string_param", "a\nb", "string_param 'a\\nb'"),  # quoted, a control character escaped
        # Quoted as names are (errors.quoted): in single quotes whatever it holds, not repr's "it's".
        ("string_param", "it's", "string_param 'it's'"),
    ],
)
def test_a_bad_timeout_or_priority_parameter_names_what_was_got_and_its_kind(key, kind, value, got):
    req = encode_request("id", {"X": np.zeros((1, 3), np.float32)})
    setattr(req.parameters[key], kind, value)
    with pytest.raises(InvalidInput) as info:
        decode_request(req, identity("FP32"))
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert str(info.value) == f"{EXPECTED_PARAM[key]}; got {got}"


@pytest.mark.parametrize("key", ["timeout", "priority"])
def test_a_bad_parameter_out_of_range_or_with_no_value_names_what_was_got(key):
    s = identity("FP32")
    req = encode_request("id", {"X": np.zeros((1, 3), np.float32)})
    req.parameters[key].SetInParent()  # present in the map, none of its value fields set
    with pytest.raises(InvalidInput) as info:
        decode_request(req, s)
    assert str(info.value) == f"{EXPECTED_PARAM[key]}; got no value (none of its fields set)"
    if key == "priority":
        req.parameters[key].uint64_param = 1_000_001
        with pytest.raises(InvalidInput) as info:
            decode_request(req, s)
        assert str(info.value) == f"{EXPECTED_PARAM[key]}; got uint64_param 1000001"


@pytest.mark.parametrize("key", ["timeout", "priority"])
def test_a_long_string_parameter_is_cut_in_the_message(key):
    req = encode_request("id", {"X": np.zeros((1, 3), np.float32)})
    req.parameters[key].string_param = "9" * 10_000
    with pytest.raises(InvalidInput) as info:
        decode_request(req, identity("FP32"))
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert str(info.value) == f"{EXPECTED_PARAM[key]}; got string_param '{'9' * 40}'… (10,000 characters in all)"
    assert len(str(info.value)) < 300


SEQUENCE_REFUSED = (
    "is not supported by this server: it has no sequence batching (its models are stateless); send the requests "
    "without sequence parameters (sequence_id, sequence_start, sequence_end)"
)


@pytest.mark.parametrize(
    "key, kind, value, got",
    [
        ("sequence_id", "int64_param", 7, "int64_param 7"),
        ("sequence_id", "int64_param", -1, "int64_param -1"),
        ("sequence_id", "uint64_param", 7, "uint64_param 7"),
        ("sequence_id", "string_param", "user-42", "string_param 'user-42'"),
        ("sequence_id", "string_param", "s" * 10_000, f"string_param '{'s' * 40}'… (10,000 characters in all)"),
        ("sequence_id", "double_param", 1.0, "double_param 1.0"),  # not a kind Triton takes: still no sequence
        ("sequence_start", "bool_param", True, "bool_param true"),
        ("sequence_end", "bool_param", True, "bool_param true"),
        ("sequence_start", "int64_param", 1, "int64_param 1"),
    ],
)
def test_a_sequence_parameter_is_refused_by_name_not_ignored(key, kind, value, got):
    req = encode_request("id", {"X": np.zeros((1, 3), np.float32)})
    setattr(req.parameters[key], kind, value)
    with pytest.raises(InvalidInput) as info:
        decode_request(req, identity("FP32"))
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert str(info.value) == f"parameter '{key}' ({got}) {SEQUENCE_REFUSED}"


@pytest.mark.parametrize(
    "key, kind, value",
    [
        ("sequence_id", "int64_param", 0),
        ("sequence_id", "uint64_param", 0),
        ("sequence_id", "string_param", ""),
        ("sequence_start", "bool_param", False),
        ("sequence_end", "bool_param", False),
        ("sequence_id", None, None),  # present, none of its value fields set
    ],
)
def test_a_sequence_parameter_that_is_zero_or_false_asks_for_nothing_and_is_accepted(key, kind, value):
    x = np.arange(3, dtype=np.float32).reshape(1, 3)
    req = encode_request("id", {"X": x}, timeout_us=2500)
    if kind is None:
        req.parameters[key].SetInParent()
    else:
        setattr(req.parameters[key], kind, value)
    dec = decode_request(req, identity("FP32"))
    np.testing.assert_array_equal(dec.inputs["X"], x)
    assert dec.timeout_s == pytest.approx(0.0025)


def test_all_three_sequence_parameters_zero_and_false_are_accepted():
    req = encode_request("id", {"X": np.zeros((1, 3), np.float32)})
    req.parameters["sequence_id"].int64_param = 0
    req.parameters["sequence_start"].bool_param = False
    req.parameters["sequence_end"].bool_param = False
    assert decode_request(req, identity("FP32")).rows == 1


def tritonclient_request(**sequence) -> pb.ModelInferRequest:
    """The ModelInferRequest tritonclient.grpc's infer() puts on the wire, read as wok reads it."""
    import tritonclient.grpc as grpcclient
    from tritonclient.grpc._utils import _get_inference_request

    inp = grpcclient.InferInput("X", [1, 3], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 3), np.float32))
    args = dict(sequence_id=0, sequence_start=False, sequence_end=False)  # infer()'s defaults
    args.update(sequence)
    sent = _get_inference_request(
        model_name="id",
        inputs=[inp],
        model_version="",
        request_id="",
        outputs=None,
        priority=0,
        timeout=None,
        parameters=None,
        **args,
    )
    return pb.ModelInferRequest.FromString(sent.SerializeToString())


@pytest.mark.parametrize(
    "sequence",
    [{}, {"sequence_start": True}, {"sequence_end": True}, {"sequence_id": ""}],
    ids=["defaults", "start-without-id", "end-without-id", "empty-string-id"],
)
def test_tritonclient_without_a_sequence_id_is_never_refused(sequence):
    # tritonclient ignores sequence_start and sequence_end unless sequence_id is set.
    assert decode_request(tritonclient_request(**sequence), identity("FP32")).rows == 1


@pytest.mark.parametrize(
    "sequence, got",
    [
        ({"sequence_id": 7, "sequence_start": True}, "int64_param 7"),
        ({"sequence_id": 7}, "int64_param 7"),  # a sequence's middle: start and end sent false
        ({"sequence_id": 7, "sequence_end": True}, "int64_param 7"),
        ({"sequence_id": "user-42", "sequence_start": True}, "string_param 'user-42'"),
    ],
)
def test_tritonclient_with_a_sequence_id_is_refused_naming_it(sequence, got):
    with pytest.raises(InvalidInput) as info:
        decode_request(tritonclient_request(**sequence), identity("FP32"))
    assert str(info.value) == f"parameter 'sequence_id' ({got}) {SEQUENCE_REFUSED}"


@pytest.mark.parametrize(
    ("values", "got"),
    [([9.0, 9.0, 9.0], "fp32_contents (3 values)"), ([], "set, with no values")],
    ids=["typed", "empty"],
)
def test_an_input_sent_both_raw_and_in_contents_is_invalid_even_an_empty_contents(values, got):
    # Triton refuses a contents beside raw_input_contents whatever it holds (the KServe spec: it "must not be
    # specified"); tritonclient never sets one. An empty one was taken for no contents and accepted.
    req = encode_request("id", {"X": np.zeros((1, 3), np.float32)})
    req.inputs[0].contents.SetInParent()
    req.inputs[0].contents.fp32_contents.extend(values)
    sent = pb.ModelInferRequest.FromString(req.SerializeToString())  # as the server gets it: set survives the wire
    assert sent.inputs[0].HasField("contents")
    with pytest.raises(InvalidInput) as info:
        decode_request(sent, identity("FP32"))
    assert (
        str(info.value) == f"input 'X': sent both in raw_input_contents and in contents ({got}); expected one of them"
    )


def test_a_raw_request_whose_inputs_leave_contents_unset_is_accepted():
    req = encode_request("id", {"X": np.zeros((1, 3), np.float32)})
    _ = req.inputs[0].contents.fp32_contents  # reading a field of an unset message does not set it
    assert not req.inputs[0].HasField("contents")
    assert decode_request(req, identity("FP32")).inputs["X"].shape == (1, 3)


def test_every_missing_input_is_named_and_counts_read_in_the_singular_where_one():
    cfg = model_config_from_dict(
        {
            "name": "two",
            "platform": "python",
            "factory": "x:y",
            "inputs": [{"name": n, "datatype": "FP32", "dims": [3]} for n in ("A", "B", "C")],
            "outputs": [{"name": "Y", "datatype": "FP32", "dims": [3]}],
            "max_batch_size": 4,
        },
        "test",
    )
    s = Servable(cfg, nn.Identity())
    with pytest.raises(InvalidInput) as info:
        decode_request(encode_request("two", {"B": np.zeros((1, 3), np.float32)}), s)
    # The first alone was named ("missing input 'A'"), the rest left to be found one call at a time.
    assert str(info.value) == "missing inputs 'A', 'C' for model 'two'; expected inputs: A, B, C"
    req = encode_request("two", {n: np.zeros((1, 3), np.float32) for n in "ABC"})
    del req.raw_input_contents[1:]
    with pytest.raises(InvalidInput) as info:
        decode_request(req, s)
    assert str(info.value) == (  # was "1 entries"
        "raw_input_contents has 1 entry for 3 inputs; expected one entry per input, in the order of the request's "
        "inputs, or none (every input's values in its contents)"
    )


def test_a_request_over_the_size_limit_names_the_option_that_sets_it():
    req = encode_request("id", {"X": np.zeros((4, 3), np.float32)})
    with pytest.raises(InvalidInput) as info:
        decode_request(req, identity("FP32"), max_bytes=16)
    size = req.ByteSize()
    assert str(info.value) == (
        f"request to model 'id' is {size} bytes, over the limit of 16 bytes (the server's --max-request-bytes)"
    )


def test_an_output_requested_twice_is_invalid_naming_both_places():
    # As an input given twice is named: where each was, and what was expected (was "output 'Y' requested
    # more than once", with no expected).
    req = encode_request("id", {"X": np.zeros((1, 3), np.float32)}, outputs=["Y", "Y"])
    with pytest.raises(InvalidInput) as info:
        decode_request(req, identity("FP32"))
    assert str(info.value) == "output 'Y' requested more than once (outputs 0 and 1); expected each output once"


def test_a_shape_whose_element_count_overflows_int64_is_invalid_not_a_crash():
    req = pb.ModelInferRequest(model_name="id")
    req.inputs.add(name="X", datatype="FP32", shape=[4, 2**62])
    req.raw_input_contents.append(b"")
    s = identity("FP32")
    with pytest.raises(InvalidInput, match=r"input 'X': expected shape \[-1, 3\]"):
        decode_request(req, s)
    wide = identity_dims("FP32", [-1])
    with pytest.raises(InvalidInput, match=r"expected 73786976294838206464 bytes of raw content .*; got 0 bytes$"):
        decode_request(req, wide)


@pytest.mark.parametrize("datatype", ["FP32", "BYTES"])
@pytest.mark.parametrize("shape", [[1, 2**62, 0], [1, 0, 2**63 - 1]])
@pytest.mark.parametrize("raw", [True, False])
def test_an_empty_tensor_with_a_dim_numpy_cannot_address_is_invalid_not_internal(datatype, shape, raw):
    # No byte count catches it (0 elements, 0 bytes), and numpy refuses the shape with a
    # ValueError that would have answered INTERNAL.
    req = pb.ModelInferRequest(model_name="id")
    t = req.inputs.add(name="X", datatype=datatype, shape=shape)
    if raw:
        req.raw_input_contents.append(b"")
    else:
        t.contents.SetInParent()  # present but empty
    with pytest.raises(
        InvalidInput, match=r"input 'X': shape \[1, \d+, \d+\] is too large: its dims other than 0 span"
    ):
        decode_request(req, identity_dims(datatype, [-1, -1]))


def test_the_largest_empty_shape_numpy_can_address_is_accepted():
    req = pb.ModelInferRequest(model_name="id")
    req.inputs.add(name="X", datatype="FP32", shape=[1, 2**61 - 1, 0])  # 2**63 - 4 bytes: just inside
    req.raw_input_contents.append(b"")
    assert decode_request(req, identity_dims("FP32", [-1, -1])).inputs["X"].shape == (1, 2**61 - 1, 0)


def test_a_bytes_shape_larger_than_its_content_is_refused_before_allocating():
    req = pb.ModelInferRequest(model_name="id")
    req.inputs.add(name="X", datatype="BYTES", shape=[1, 2**27])
    req.raw_input_contents.append(b"")
    with pytest.raises(InvalidInput, match="raw BYTES content of 0 bytes cannot hold 134217728 elements"):
        decode_request(req, identity_dims("BYTES", [-1]))


def identity_dims(datatype: str, dims: list[int]) -> Servable:
    cfg = model_config_from_dict(
        {
            "name": "id",
            "platform": "python",
            "factory": "x:y",
            "inputs": [{"name": "X", "datatype": datatype, "dims": dims}],
            "outputs": [{"name": "Y", "datatype": datatype, "dims": dims}],
            "max_batch_size": 4,
        },
        "test",
    )
    return Servable(cfg, nn.Identity())


@pytest.mark.parametrize("shape", [[-1, 3], [2, -1], [-2, 3]])
def test_a_negative_dim_is_refused_as_such_not_as_a_shape_that_matches(shape):
    # [-1, 3] is the model's metadata sent back: "expected [-1, 3], got [-1, 3]" would contradict itself.
    req = pb.ModelInferRequest(model_name="id")
    req.inputs.add(name="X", datatype="FP32", shape=shape)
    req.raw_input_contents.append(b"")
    with pytest.raises(InvalidInput) as info:
        decode_request(req, identity("FP32"))
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert str(info.value) == (
        f"input 'X': expected dims >= 0; got {shape}; -1 is only a wildcard, in the expected shape [-1, 3] "
        "of the model's metadata"
    )


def test_a_shape_of_millions_of_dims_is_refused_naming_its_first_dims_and_how_many_without_reading_them_all():
    # Written out whole, the message of a 20 MB request of 20 million dims took 6 s of the event loop
    # (every other request waiting) and 2 GB; this one's, 2 million dims, was 6 MB.
    n = 2_000_000
    req = pb.ModelInferRequest(model_name="id")
    req.inputs.add(name="X", datatype="FP32", shape=[1] * n)
    req.raw_input_contents.append(b"")
    tracemalloc.start()
    try:
        with pytest.raises(InvalidInput) as info:
            decode_request(req, identity("FP32"))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(info.value) == (
        f"input 'X': expected shape [-1, 3] (batch first, -1 = any); got [{', '.join(['1'] * 16)}, …] (2,000,000 dims)"
    )
    assert peak < 1 << 20, peak  # no Python object per dim


@pytest.mark.parametrize(
    ("datatype", "values", "got"),
    [
        ("UINT8", [1, 300], "expected UINT8 values from 0 to 255; got 300 (element 1)"),
        ("UINT16", [70000, 1], "expected UINT16 values from 0 to 65535; got 70000 (element 0)"),
        ("INT8", [1, 2, -129], "expected INT8 values from -128 to 127; got -129 (element 2)"),
        ("INT16", [40000, 1], "expected INT16 values from -32768 to 32767; got 40000 (element 0)"),
    ],
)
def test_a_typed_value_out_of_its_datatypes_range_is_refused_naming_it_and_the_range(datatype, values, got):
    # numpy 1.x (pyproject allows >= 1.26) wraps it instead of raising: UINT8 300 reached the model as 44.
    req = pb.ModelInferRequest(model_name="id")
    t = req.inputs.add(name="X", datatype=datatype, shape=[1, 3])
    getattr(t.contents, DATATYPES[datatype].contents_field).extend([*values, 0][:3])
    with pytest.raises(InvalidInput) as info:
        decode_request(req, identity(datatype))
    assert str(info.value) == f"input 'X': {got}"


@pytest.mark.parametrize(
    ("datatype", "values", "start", "got"),
    [
        (
            "INT32",
            [1, 2**40],
            0,
            "expected INT32 values from -2147483648 to 2147483647; got one out of range (among elements 0 to 1)",
        ),
        ("UINT64", [-1], 7, "expected UINT64 values from 0 to 18446744073709551615; got one out of range (element 7)"),
        (
            "FP32",
            [10**400, 1.0],
            0,
            "expected FP32 values from -3.40282e+38 to 3.40282e+38; got one out of range (among elements 0 to 1)",
        ),
    ],
)
def test_values_numpy_cannot_convert_are_refused_naming_the_tensor_the_elements_and_the_range(
    datatype, values, start, got
):
    # A parsed message's fields hold only what their datatypes can: such values come from elsewhere (Python
    # numbers), where numpy's OverflowError names neither the range nor the elements. It said only "a value
    # does not fit INT32".
    for side, what in ((codec.INPUT, "input 'X'"), (codec.OUTPUT, "output 'X'")):
        with pytest.raises(side.error) as info:
            codec._chunk(iter(values), DATATYPES[datatype], len(values), start, "X", side)
        assert str(info.value) == f"{what}: {got}"


@pytest.mark.parametrize("datatype", ["UINT8", "UINT16", "INT8", "INT16"])
def test_typed_values_at_the_ends_of_their_datatypes_range_are_accepted(datatype):
    info = np.iinfo(DATATYPES[datatype].numpy)
    req = pb.ModelInferRequest(model_name="id")
    t = req.inputs.add(name="X", datatype=datatype, shape=[1, 3])
    getattr(t.contents, DATATYPES[datatype].contents_field).extend([info.min, 0, info.max])
    x = decode_request(req, identity(datatype)).inputs["X"]
    assert x.dtype == DATATYPES[datatype].numpy and x.tolist() == [[info.min, 0, info.max]]


def test_typed_contents_in_another_types_field_are_named_with_the_field_expected():
    req = pb.ModelInferRequest(model_name="id")
    t = req.inputs.add(name="X", datatype="FP64", shape=[1, 3])
    t.contents.int64_contents.extend([1, 2, 3])
    with pytest.raises(InvalidInput) as info:
        decode_request(req, identity("FP64"))
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert str(info.value) == (
        "input 'X': expected 3 values (shape [1, 3]) in fp64_contents for FP64, or the tensor in raw_input_contents; "
        "got 0 values; int64_contents holds 3 values, which FP64 is not read from"
    )


@pytest.mark.parametrize(
    ("datatype", "extra", "got"),
    [
        ("FP32", {"int_contents": [7, 8]}, "int_contents (2 values)"),
        # INT8 and INT64 are both whole numbers, in fields of their own.
        ("INT8", {"int64_contents": [1]}, "int64_contents (1 value)"),
        (
            "BYTES",
            {"fp32_contents": [1.0], "uint_contents": [2, 3]},
            "uint_contents (2 values), fp32_contents (1 value)",
        ),
    ],
)
def test_values_in_a_field_beside_the_one_read_are_refused_not_dropped(datatype, extra, got):
    x = sample(datatype) if datatype != "BYTES" else np.array([[b"a", b"b", b"c"]], dtype=object)
    field = DATATYPES[datatype].contents_field
    req = pb.ModelInferRequest(model_name="id")
    t = req.inputs.add(name="X", datatype=datatype, shape=x.shape)
    getattr(t.contents, field).extend(x.ravel().tolist())
    for other, values in extra.items():
        getattr(t.contents, other).extend(values)
    with pytest.raises(InvalidInput) as info:
        decode_request(req, identity(datatype))
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert str(info.value) == (
        f"input 'X': expected values in {field} alone for {datatype}; got {got} too, which {datatype} is not read from"
    )


def _contents_refusal(where: str) -> str:
    """The message of the refusal at `where`, one of the four that name a contents' fields and their counts."""
    extra = {"int_contents": [7], "fp64_contents": [1.0, 2.0]}
    if where == "a request's raw input":
        req = encode_request("id", {"X": np.zeros((1, 3), np.float32)})
        for field, values in extra.items():
            getattr(req.inputs[0].contents, field).extend(values)
        with pytest.raises(InvalidInput) as info:
            decode_request(req, identity("FP32"))
        return str(info.value)
    if where == "an answer's raw output":
        resp = encode_response("id", "1", {"Y": np.zeros((1, 3), np.float32)}, {"Y": DATATYPES["FP32"]})
        for field, values in extra.items():
            getattr(resp.outputs[0].contents, field).extend(values)
        with pytest.raises(ValueError) as info:
            decode_response(resp)
        return str(info.value)
    contents = pb.InferTensorContents(**extra)
    datatype = "FP16" if where == "a datatype with no field" else "INT32"
    if datatype == "INT32":
        contents.ClearField("int_contents")
        contents.int_contents.extend([1, 2, 3])
        contents.uint_contents.extend([4])
    with pytest.raises(InvalidInput) as info:
        codec.array_from_contents(contents, DATATYPES[datatype], (1, 3), "X")
    return str(info.value)


@pytest.mark.parametrize(
    ("where", "message"),
    [
        (
            "a datatype with no field",
            "input 'X': expected FP16 values in raw_input_contents (InferTensorContents has no field for FP16); "
            "got contents: int_contents (1 value), fp64_contents (2 values)",
        ),
        (
            "a field beside the one read",
            "input 'X': expected values in int_contents alone for INT32; got uint_contents (1 value), fp64_contents "
            "(2 values) too, which INT32 is not read from",
        ),
        (
            "a request's raw input",
            "input 'X': sent both in raw_input_contents and in contents (int_contents (1 value), fp64_contents "
            "(2 values)); expected one of them",
        ),
        (
            "an answer's raw output",
            "output 'Y': sent both in raw_output_contents and in contents (int_contents (1 value), fp64_contents "
            "(2 values)); expected one of them",
        ),
    ],
)
def test_the_four_refusals_naming_a_contents_fields_count_them_in_one_way(where, message):
    # Four copies of one expression built this text; one (codec._counted) now, these messages unchanged.
    assert _contents_refusal(where) == message


def test_an_input_with_no_data_at_all_is_told_where_its_data_goes():
    req = pb.ModelInferRequest(model_name="id")
    req.inputs.add(name="X", datatype="INT8", shape=[1, 3])
    with pytest.raises(InvalidInput) as info:
        decode_request(req, identity("INT8"))
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert str(info.value) == (
        "input 'X': expected 3 values (shape [1, 3]) in int_contents for INT8, or the tensor in raw_input_contents; "
        "got 0 values"
    )


@pytest.mark.parametrize(
    ("array", "datatype", "expected"),
    [
        (np.ones((1, 3), np.float16), "BF16", "uint16 (bfloat16 words) or ml_dtypes.bfloat16"),
        (np.ones((1, 3), np.int64), "FP64", "float64"),
        (np.ones((1, 3), np.float32), "INT32", "int32"),
        (np.ones((1, 3), np.uint8), "BOOL", "bool"),
        (np.ones((1, 3), np.float64), "FP32", "float32"),
        (np.ones((1, 3), np.int32), "BYTES", "object, bytes or str"),
    ],
)
def test_a_datatype_named_for_an_array_of_another_dtype_is_refused_before_sending(array, datatype, expected):
    # Its bytes would go as they are: float16 1.0 read as bfloat16 is 2.0, int64 1 as FP64 is 5e-324.
    with pytest.raises(ValueError) as info:
        encode_request("id", {"X": array}, datatypes={"X": datatype})
    assert str(info.value) == f"input 'X': expected an array of {expected} for datatype {datatype}; got {array.dtype}"


def test_an_unknown_datatype_is_refused_before_sending():
    with pytest.raises(ValueError, match=r"input 'X': unknown datatype 'FP8'; expected one of BOOL, "):
        encode_request("id", {"X": np.ones((1, 3), np.float32)}, datatypes={"X": "FP8"})


def test_bf16_goes_as_uint16_words_or_as_an_ml_dtypes_bfloat16_array_which_needs_no_datatypes():
    import ml_dtypes  # a test dependency: tritonclient (the test extras) requires it

    s = identity("BF16")
    x = sample("BF16")
    as_words = encode_request("id", {"X": x}, datatypes={"X": "BF16"})
    typed = x.view(ml_dtypes.bfloat16)
    for req in (encode_request("id", {"X": typed}), encode_request("id", {"X": typed}, datatypes={"X": "BF16"})):
        assert req == as_words
        np.testing.assert_array_equal(decode_response(through_model(s, req))["Y"], x)
    texts = np.array([["a", "b", "c"]])
    assert decode_request(encode_request("id", {"X": texts}, datatypes={"X": "BYTES"}), identity("BYTES")).inputs[
        "X"
    ].tolist() == [[b"a", b"b", b"c"]]


@pytest.mark.parametrize("value", [0.5, 1.9, float("nan"), float("inf"), True, "5", np.float32(2.5)])
def test_a_timeout_or_priority_that_is_not_whole_is_refused_before_sending_not_cut(value):
    # int() made 0.5 µs a timeout of 0, which the server reads as none, and 1.9 µs one of 1.
    x = {"X": np.zeros((1, 3), np.float32)}
    with pytest.raises(
        ValueError, match=r"^timeout_us \(the clients' server_timeout_us\): expected a whole number; got "
    ):
        encode_request("id", x, timeout_us=value)
    with pytest.raises(ValueError, match=r"^priority: expected a whole number; got "):
        encode_request("id", x, priority=value)


def test_a_whole_timeout_or_priority_written_as_a_float_is_sent_as_its_integer():
    req = encode_request("id", {"X": np.zeros((1, 3), np.float32)}, timeout_us=2500.0, priority=np.int64(2))
    assert (req.parameters["timeout"].int64_param, req.parameters["priority"].int64_param) == (2500, 2)


def test_fixed_dims_around_a_variable_one_are_each_held_to_their_size():
    # Several fixed dims are compared at once (DecodePlan's getter gives their sizes as a tuple), one alone as a
    # value: a wrong size in either place is refused naming the whole shape, the variable dim takes any size.
    s = identity_dims("FP32", [2, -1, 3])
    req = pb.ModelInferRequest(model_name="id")
    req.inputs.add(name="X", datatype="FP32", shape=[1, 2, 5, 3])
    req.raw_input_contents.append(np.arange(30, dtype=np.float32).tobytes())
    assert decode_request(req, s).inputs["X"].tolist() == np.arange(30, dtype=np.float32).reshape(1, 2, 5, 3).tolist()
    for shape in ([1, 3, 5, 3], [1, 2, 5, 4], [1, 2, 5], [1, 2, 5, 3, 1]):
        req = pb.ModelInferRequest(model_name="id")
        req.inputs.add(name="X", datatype="FP32", shape=shape)
        req.raw_input_contents.append(b"")
        with pytest.raises(InvalidInput) as info:
            decode_request(req, s)
        assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert str(info.value) == (
            f"input 'X': expected shape [-1, 2, -1, 3] (batch first, -1 = any); got {shape_str(shape)}"
        ), shape
    one = identity_dims("FP32", [-1, 4])
    req = pb.ModelInferRequest(model_name="id")
    req.inputs.add(name="X", datatype="FP32", shape=[1, 6, 5])
    req.raw_input_contents.append(b"")
    with pytest.raises(InvalidInput, match=r"^input 'X': expected shape \[-1, -1, 4\] \(batch first, -1 = any\); got "):
        decode_request(req, one)


def shape_str(shape: list[int]) -> str:
    return "[" + ", ".join(map(str, shape)) + "]"
