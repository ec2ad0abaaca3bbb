"""Fuzzing the request decoder: a payload parses and decodes faithfully, or is rejected cleanly.

The strategies and the property live in wok.bench.fuzz (shared with the long run,
`python -m wok.bench.fuzz --minutes 10`, see docs/fuzzing.md). Here the number of examples
is bounded so the suite stays fast; WOK_FUZZ_EXAMPLES raises it.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wok.bench import fuzz
from wok.codec import decode_request, encode_request
from wok.errors import InvalidInput
from wok.v2pb import grpc_service_pb2 as pb

EXAMPLES = int(os.environ.get("WOK_FUZZ_EXAMPLES", "100"))
# A decoder that hangs outright never returns for hypothesis's deadline to judge: pytest-timeout ends it.
pytestmark = pytest.mark.timeout(max(180, EXAMPLES))
# deadline bounds each example's time (hypothesis re-runs a slow one before failing it, so a
# loaded machine does not fail the test by itself); database=None: nothing written to the tree.
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=timedelta(seconds=2),
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)
SERVABLES = fuzz.fuzz_servables()
NAMES = sorted(SERVABLES)


@FUZZ
@given(st.data())
def test_a_random_or_mutated_request_decodes_to_what_was_sent_or_is_rejected(data):
    name = data.draw(st.sampled_from(NAMES), label="model")
    kind, payload = data.draw(fuzz.payloads(SERVABLES[name]), label="payload")
    outcome = fuzz.check_decode(payload, SERVABLES[name])
    if kind == "valid":
        assert outcome == "ok"


@FUZZ
@given(st.data())
def test_a_valid_request_decodes_to_the_arrays_it_was_encoded_from(data):
    name = data.draw(st.sampled_from(NAMES), label="model")
    req = data.draw(fuzz.valid_requests(SERVABLES[name]), label="request")
    # Through the wire format and back, as the server gets it.
    assert fuzz.check_decode(req.SerializeToString(), SERVABLES[name]) == "ok"


@FUZZ
@given(st.data())
def test_a_request_over_the_size_limit_is_invalid_whatever_it_holds(data):
    name = data.draw(st.sampled_from(NAMES), label="model")
    req = data.draw(fuzz.random_requests(SERVABLES[name]), label="request")
    limit = data.draw(st.integers(0, max(req.ByteSize() - 1, 0)))
    if req.ByteSize() > limit:
        with pytest.raises(InvalidInput, match="over the limit"):
            decode_request(req, SERVABLES[name], max_bytes=limit)


# -- the property can fail: a decoder that changes anything is caught ------------------------------
def _mlp_request() -> pb.ModelInferRequest:
    return encode_request("mlp", {"INPUT0": np.arange(512, dtype=np.float32).reshape(2, 256)}, outputs=["OUTPUT0"])


@pytest.mark.parametrize(
    "tamper",
    [
        lambda d: d.inputs["INPUT0"].__setitem__((1, 3), -1.0),
        lambda d: d.inputs.__setitem__("INPUT0", d.inputs["INPUT0"].astype(np.float64)),
        lambda d: d.inputs.__setitem__("INPUT0", d.inputs["INPUT0"][:1]),
        lambda d: setattr(d, "outputs", None),
        lambda d: setattr(d, "timeout_s", 1.0),
    ],
    ids=["value", "dtype", "rows", "outputs", "timeout"],
)
def test_the_faithfulness_check_catches_a_decoder_that_changes_anything(tamper):
    servable = SERVABLES["mlp"]
    req = _mlp_request()
    dec = decode_request(req, servable)
    fuzz.assert_faithful(req, dec, servable)
    dec.inputs["INPUT0"] = dec.inputs["INPUT0"].copy()
    tamper(dec)
    with pytest.raises(AssertionError):
        fuzz.assert_faithful(req, dec, servable)


# -- hand-picked inputs the strategies aim at, each checked by name --------------------------------
def _alltypes(shape: list[int], raw: bytes, datatype: str = "BYTES") -> pb.ModelInferRequest:
    servable = SERVABLES["alltypes"]
    req = pb.ModelInferRequest(model_name="alltypes")
    for t in servable.config.inputs:
        if t.datatype == datatype:
            req.inputs.add(name=t.name, datatype=t.datatype, shape=shape)
            req.raw_input_contents.append(raw)
        else:
            req.inputs.add(name=t.name, datatype=t.datatype, shape=[1, 0])
            req.raw_input_contents.append(b"")
    return req


@pytest.mark.parametrize(
    ("shape", "raw", "datatype", "message"),
    [
        ([1, 2**62], b"", "BYTES", "cannot hold"),
        ([1, 2**63 - 1], b"\x00" * 64, "BYTES", "cannot hold"),
        ([1, 2**62], b"", "FP64", "bytes of raw content"),
        ([1, 2**61 + 1], b"", "INT64", "expected 18446744073709551624"),  # the byte count overflows int64
        ([1, -1], b"", "BYTES", "expected shape"),
        ([1, 2], b"\xff\xff\xff\xff", "BYTES", "cannot hold 2 elements"),
        ([1, 1], b"\xff\xff\xff\xff", "BYTES", "claims 4294967295 bytes"),
        ([1, 1], b"\x01\x00\x00\x00ab", "BYTES", "bytes after 1 elements"),
        ([2**31, 1], b"", "INT8", "expected at most 4 rows .*; got 2147483648$"),
    ],
)
def test_huge_negative_and_lying_shapes_are_rejected_at_once(shape, raw, datatype, message):
    req = _alltypes(shape, raw, datatype)
    t0 = time.monotonic()
    with pytest.raises(InvalidInput, match=message):
        decode_request(req, SERVABLES["alltypes"])
    assert time.monotonic() - t0 < 1.0  # no allocation or loop sized by the claimed shape


@pytest.mark.parametrize(
    ("datatype", "value"),
    [("UINT8", 256), ("INT8", -129), ("UINT16", 70000), ("INT16", 40000)],
)
def test_typed_contents_that_do_not_fit_the_datatype_are_invalid(datatype, value):
    servable = SERVABLES["alltyped"]
    req = pb.ModelInferRequest(model_name="alltyped")
    for t in servable.config.inputs:
        tensor = req.inputs.add(name=t.name, datatype=t.datatype, shape=[1, 1])
        field = fuzz.DATATYPES[t.datatype].contents_field
        filler = {"bool_contents": True, "bytes_contents": b"x"}.get(field, 1)
        getattr(tensor.contents, field).append(value if t.datatype == datatype else filler)
    with pytest.raises(InvalidInput, match=f"expected {datatype} values from .*; got"):
        decode_request(req, servable)


def test_bit_flips_that_break_the_message_are_protobufs_to_reject():
    payload = bytearray(_mlp_request().SerializeToString())
    payload[1] ^= 0x80  # the model name's length becomes a varint that runs on into the string
    assert fuzz.parse(bytes(payload)) is None
    assert fuzz.check_decode(bytes(payload), SERVABLES["mlp"]) == "unparseable"
