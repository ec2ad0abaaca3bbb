"""Fuzzing the request decoder with random and mutated KServe V2 ModelInferRequests.

The property, at the decoder (`wok.codec.decode_request` with the servable's `check`):
a payload either fails to parse as a ModelInferRequest (protobuf's DecodeError), or it
decodes and every value, shape, requested output and timeout equals what was sent, or it
is rejected with wok's InvalidInput. Any other exception is a bug. At the server: every
payload gets exactly one answer with a clear status (never UNKNOWN or INTERNAL; bytes that
do not parse get INVALID_ARGUMENT), and a normal request succeeds after it. Each answer
is judged (`judge`): clear, or unclear with the reason (a status that is not clear, a
RESOURCE_EXHAUSTED for a request under every size limit, details over 4 KiB as sent, an
error that does not name the wrong model name, version, input or output name).

Four kinds of payload, each built by a hypothesis strategy from the model's config:

* valid: the right inputs, datatypes and shapes, raw or typed contents, some of the
  outputs, a timeout parameter: must decode, value for value;
* random: names, datatypes (unknown ones too), shapes (negative, huge, overflowing,
  mismatched with the contents), raw contents of any length, typed contents of any kind,
  BYTES with bad length prefixes, parameters of every kind, outputs that do not exist;
* renamed: a valid request with one string (the model name or version, the id, an input's
  or output's name, a parameter's key) replaced by an odd one;
* mutated: a valid request's serialized bytes with bits flipped, bytes overwritten,
  cut or spliced: they must parse or be rejected by protobuf.

Names (random and renamed) are short text of any characters (control characters too) or
long: 256 to 40,000 characters of ASCII, '%', 2- to 4-byte UTF-8 or control characters,
which an error's details echo past gRPC's header limits unless the server cuts them.

The test suite runs a bounded number of examples (tests/server/test_fuzz_decode.py,
tests/integration/test_fuzz_server.py); a longer run is this module's command:

    python -m wok.bench.fuzz --minutes 10 [--target HOST:PORT] [--json fuzz.json]

It counts the inputs tried by kind and outcome (schema "wok.fuzz/1", docs/fuzzing.md),
and the server's answers by status and verdict; it exits 1 with the falsifying input when
the decoder's property fails or a normal request fails, and 1 after the run when any
answer was unclear (the first ones are listed).
"""

from __future__ import annotations

import argparse
import math
import re
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import field as dc_field
from pathlib import Path

import numpy as np
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from wok.bench.outputs import json_text, refuse_unwritable, write_final
from wok.codec import UNSUPPORTED_OUTPUT_PARAMETERS, _head_of, decode_request, serialize_bytes
from wok.config import model_config_from_dict
from wok.datatypes import DATATYPES
from wok.errors import InvalidInput, escaped
from wok.numerals import ascii_digits
from wok.repository import VERSION
from wok.v2pb import grpc_service_pb2 as pb

SCHEMA = "wok.fuzz/1"
# How the long run is started: its usage, its refusals and its own lines after the run all begin with it.
PROG = "python -m wok.bench.fuzz"
MODEL_KINDS = ("valid", "random", "renamed", "mutated")
INT64 = (-(2**63), 2**63 - 1)
# Shape entries that break naive arithmetic: int32/int64 edges, products that overflow int64.
EDGE_DIMS = [0, -1, 2**31 - 1, 2**31, 2**32, 2**32 + 1, 2**62, 2**63 - 1, -(2**63), 3037000500]
CONTENT_VALUES = {
    "bool_contents": st.booleans(),
    "int_contents": st.integers(-(2**31), 2**31 - 1),
    "int64_contents": st.integers(*INT64),
    "uint_contents": st.integers(0, 2**32 - 1),
    "uint64_contents": st.integers(0, 2**64 - 1),
    "fp32_contents": st.floats(width=32),
    "fp64_contents": st.floats(),
    "bytes_contents": st.binary(max_size=12),
}
# Long names: a unary error's details, which often echo a name, travel in the grpc-message header,
# percent-encoded; a client refuses it past 16 KiB (from 8 KiB at random) and reports RESOURCE_EXHAUSTED
# in place of the server's status, unless the server cuts them (to 4 KiB). Up to 40,000 characters of
# units that encode to 1 ('m'), 3 ('%', a control character), 6, 9 and 12 bytes.
LONG_NAME_CHARS = (256, 40_000)
NAME_UNITS = ["m", " ", "%", "\u00e9", "\u6f22", "\U0001f600", "\x00", "\r\n", "\x7f", "'"]
# Versions other than a request's usual "" and "1": "01", which Triton reads as 1 and is answered; "2", an
# integer not served; and none at all: letters, a sign, 20 digits (past int64's 19).
OTHER_VERSIONS = st.sampled_from(["01", "2", "x", "-1"]) | st.integers(10**19, 10**20 - 1).map(str)
PARAMETER_VALUES = {
    "bool_param": st.booleans(),
    "int64_param": st.integers(*INT64),
    "string_param": st.text(max_size=8),
    "double_param": st.floats(),
    "uint64_param": st.integers(0, 2**64 - 1),
}


# -- the models fuzzed ----------------------------------------------------------------------------
def all_types_servable(typed: bool = False):
    """A servable with one variable-length input of every V2 datatype (its module is never run).

    `typed`: only the datatypes that InferTensorContents can carry, so that valid requests
    also travel as typed contents (FP16 and BF16 travel raw only).
    """
    from torch import nn

    from wok.servable import Servable

    names = [n for n, d in DATATYPES.items() if d.contents_field or not typed]
    cfg = model_config_from_dict(
        {
            "name": "alltyped" if typed else "alltypes",
            "platform": "python",
            "factory": "wok.bench.fuzz:unused",
            "max_batch_size": 4,
            "inputs": [{"name": f"in_{n.lower()}", "datatype": n, "dims": [-1]} for n in names],
            "outputs": [{"name": f"out_{n.lower()}", "datatype": n, "dims": [-1]} for n in names[:3]],
        },
        "wok.bench.fuzz",
    )
    return Servable(cfg, nn.Identity())


def fuzz_servables() -> dict:
    """The demo models (small sizes) and the every-datatype model, by name."""
    from wok.models import build_demo

    return {
        "mlp": build_demo("mlp"),
        "recsys": build_demo("recsys", num_embeddings=1000),
        "encoder": build_demo("encoder", max_length=64, layers=1),
        "alltypes": all_types_servable(),
        "alltyped": all_types_servable(typed=True),
    }


# -- strategies -------------------------------------------------------------------------------------
@st.composite
def long_names(draw) -> str:
    """A name of 256 to 40,000 characters: one unit (ASCII, '%', multi-byte UTF-8, control
    characters, or 1-3 random characters) repeated."""
    unit = draw(st.one_of(st.sampled_from(NAME_UNITS), st.text(min_size=1, max_size=3)))
    n = draw(st.integers(*LONG_NAME_CHARS))
    return (unit * -(-n // len(unit)))[:n]


def odd_names() -> st.SearchStrategy[str]:
    """Odd names: short text of any characters (control characters too), or long ones (`long_names`)."""
    return st.one_of(st.text(max_size=6), long_names())


def _parameters(target, draw) -> None:
    """Fill a parameters map with random keys ("timeout" often, long ones too) and values of every kind."""
    for key in draw(st.lists(st.one_of(st.just("timeout"), odd_names()), max_size=3)):
        kind = draw(st.sampled_from(sorted(PARAMETER_VALUES)))
        setattr(target[key], kind, draw(PARAMETER_VALUES[kind]))


def _sample_values(draw, dt, shape: tuple[int, ...], servable) -> np.ndarray:
    """An array of `shape` that the model accepts (ids within its table, any float otherwise)."""
    if dt.name == "BYTES":
        flat = draw(st.lists(st.binary(max_size=10), min_size=math.prod(shape), max_size=math.prod(shape)))
        a = np.empty(len(flat), dtype=object)
        a[:] = flat
        return a.reshape(shape)
    if servable.name in ("recsys", "encoder") and dt.name == "INT64":
        return draw(hnp.arrays(np.int64, shape, elements=st.integers(0, 49)))
    return draw(hnp.arrays(dt.numpy, shape))


@st.composite
def valid_requests(draw, servable) -> pb.ModelInferRequest:
    """A request the model must accept: right names, datatypes and shapes, raw or typed contents."""
    cfg = servable.config
    rows = draw(st.integers(1, min(cfg.max_batch_size, 4)))
    lo = 1 if servable.name == "encoder" else 0  # the encoder needs at least one token
    req = pb.ModelInferRequest(model_name=cfg.name, id=draw(st.text(max_size=4)))
    typed_ok = all(DATATYPES[t.datatype].contents_field for t in cfg.inputs)
    raw = not typed_ok or draw(st.booleans())
    order = draw(st.permutations(list(cfg.inputs)))
    for t in order:
        dt = DATATYPES[t.datatype]
        shape = (rows, *(d if d != -1 else draw(st.integers(lo, 6)) for d in t.dims))
        a = _sample_values(draw, dt, shape, servable)
        tensor = req.inputs.add(name=t.name, datatype=t.datatype, shape=shape)
        if raw:
            req.raw_input_contents.append(serialize_bytes(a) if dt.name == "BYTES" else a.tobytes())
        else:
            getattr(tensor.contents, dt.contents_field).extend(a.reshape(-1).tolist())
    for o in draw(st.lists(st.sampled_from([o.name for o in cfg.outputs]), unique=True)):
        req.outputs.add(name=o)
    if draw(st.booleans()):
        # Long enough that a loaded test machine never turns a valid request into DEADLINE_EXCEEDED.
        req.parameters["timeout"].int64_param = draw(st.one_of(st.just(0), st.integers(10**7, 10**12)))
    return req


@st.composite
def _bytes_content(draw) -> bytes:
    """BYTES raw content, often with length prefixes that lie."""
    parts = []
    for _ in range(draw(st.integers(0, 4))):
        body = draw(st.binary(max_size=8))
        claimed = draw(st.one_of(st.just(len(body)), st.integers(0, 2**32 - 1)))
        parts.append(claimed.to_bytes(4, "little") + body)
    return b"".join(parts) + draw(st.binary(max_size=3))


@st.composite
def names_and_versions(draw, model: str) -> tuple[str, str]:
    """A random request's model name and version: mostly (9 in 10) `model` and its own version ("" or "1"), so
    that at a server most requests reach the decoder; else a wrong name, another version (`OTHER_VERSIONS`, odd
    names) or both. Drawn apart: with the name always wrong as well, the version was never what the server's
    answer was about."""
    other = "" if draw(st.integers(0, 9)) > 0 else draw(st.sampled_from(["name", "version", "both"]))
    name = draw(st.sampled_from(["", model.upper()]) | odd_names()) if other in ("name", "both") else model
    version = draw(OTHER_VERSIONS | odd_names() if other in ("version", "both") else st.sampled_from(["", "1"]))
    return name, version


@st.composite
def random_requests(draw, servable) -> pb.ModelInferRequest:
    """Anything the message can hold, biased towards the model's own names so checks run deep."""
    cfg = servable.config
    names = st.one_of(st.sampled_from([t.name for t in cfg.inputs]), odd_names())
    datatypes = st.one_of(st.sampled_from(list(DATATYPES)), st.text(max_size=6))
    dims = st.one_of(st.integers(-3, 40), st.sampled_from(EDGE_DIMS), st.integers(*INT64))
    model_name, model_version = draw(names_and_versions(cfg.name))
    req = pb.ModelInferRequest(model_name=model_name, model_version=model_version)
    n = draw(st.integers(0, len(cfg.inputs) + 2))
    for _ in range(n):
        name = draw(names)
        tcfg = cfg.input(name)
        if tcfg is not None and draw(st.booleans()):  # a plausible shape with a random batch size
            datatype = tcfg.datatype
            shape = [draw(dims), *(d if d != -1 else draw(st.integers(0, 8)) for d in tcfg.dims)]
        else:
            datatype = draw(datatypes)
            shape = draw(st.lists(dims, max_size=4))
        tensor = req.inputs.add(name=name, datatype=datatype, shape=shape)
        dt = DATATYPES.get(datatype)
        count = math.prod(shape)
        if dt is not None and dt.contents_field and 0 <= count <= 64 and draw(st.booleans()):
            # The right field and count, values of the field's whole range: overflow for narrow types.
            values = CONTENT_VALUES[dt.contents_field]
            getattr(tensor.contents, dt.contents_field).extend(draw(st.lists(values, min_size=count, max_size=count)))
        for field in draw(st.lists(st.sampled_from(sorted(CONTENT_VALUES)), max_size=2, unique=True)):
            getattr(tensor.contents, field).extend(draw(st.lists(CONTENT_VALUES[field], max_size=20)))
        _parameters(tensor.parameters, draw)
    n_raw = draw(st.sampled_from([0, n, n, max(n - 1, 0), n + 1]))
    for i in range(n_raw):
        tensor = req.inputs[i] if i < n else None
        count = math.prod(tensor.shape) if tensor is not None else 0
        item = DATATYPES[tensor.datatype].itemsize if tensor is not None and tensor.datatype in DATATYPES else 4
        nominal = count * item if 0 <= count * item <= 4096 else 0
        req.raw_input_contents.append(
            draw(
                st.one_of(
                    st.binary(max_size=64),
                    st.integers(-3, 3).map(lambda k, m=nominal: bytes(max(m + k, 0))),
                    _bytes_content(),
                )
            )
        )
    for _ in range(draw(st.integers(0, 3))):
        out = req.outputs.add(name=draw(st.one_of(st.sampled_from([t.name for t in cfg.outputs]), odd_names())))
        _parameters(out.parameters, draw)
    _parameters(req.parameters, draw)
    return req


RENAMED_FIELDS = ("model_name", "model_version", "id", "input", "output", "parameter")


@st.composite
def renamed_requests(draw, servable) -> pb.ModelInferRequest:
    """A valid request with one string replaced by an odd name (long or short): the model name or
    version, the id, an input's or an output's name, or a parameter's key (on the request, an
    input or an output), where a server that echoes it must still answer clearly."""
    # The odd name and where it goes are drawn first: drawn after a valid request's arrays, they came
    # out as hypothesis's simplest choices (an empty model name) most of the time. Long 3 times in 4.
    name = draw(long_names()) if draw(st.integers(0, 3)) else draw(st.text(max_size=6))
    which = draw(st.sampled_from(RENAMED_FIELDS))
    pick = draw(st.integers(0, 15))
    kind = draw(st.sampled_from(sorted(PARAMETER_VALUES)))
    value = draw(PARAMETER_VALUES[kind])
    req = draw(valid_requests(servable))
    if which in ("model_name", "model_version", "id"):
        setattr(req, which, name)
    elif which == "input":
        req.inputs[pick % len(req.inputs)].name = name
    elif which == "output":
        if not req.outputs:
            req.outputs.add(name=servable.config.outputs[0].name)
        req.outputs[pick % len(req.outputs)].name = name
    else:
        owners = [req, *req.inputs, *req.outputs]
        params = owners[pick % len(owners)].parameters
        setattr(params[name], kind, value)
    return req


@st.composite
def mutated_payloads(draw, servable) -> bytes:
    """A valid request's bytes with 1-4 bit flips, overwrites, cuts, insertions or duplicated slices."""
    data = bytearray(draw(valid_requests(servable)).SerializeToString())
    for _ in range(draw(st.integers(1, 4))):
        if not data:
            data.extend(draw(st.binary(min_size=1, max_size=8)))
            continue
        pos = draw(st.integers(0, len(data) - 1))
        op = draw(st.sampled_from(["flip", "byte", "cut", "insert", "dup"]))
        if op == "flip":
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif op == "byte":
            data[pos] = draw(st.integers(0, 255))
        elif op == "cut":
            end = draw(st.integers(pos, len(data)))
            del data[pos:end]
        elif op == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        else:
            end = draw(st.integers(pos, min(len(data), pos + 32)))
            data[pos:pos] = data[pos:end]
    return bytes(data)


def payloads(servable) -> st.SearchStrategy[tuple[str, bytes]]:
    """(kind, serialized payload): valid, random, renamed or mutated, in about equal shares."""
    return st.one_of(
        valid_requests(servable).map(lambda r: ("valid", r.SerializeToString())),
        random_requests(servable).map(lambda r: ("random", r.SerializeToString())),
        renamed_requests(servable).map(lambda r: ("renamed", r.SerializeToString())),
        mutated_payloads(servable).map(lambda b: ("mutated", b)),
    )


# -- the property ---------------------------------------------------------------------------------------
def parse(payload: bytes) -> pb.ModelInferRequest | None:
    """The request the bytes hold, or None where protobuf rejects them."""
    req = pb.ModelInferRequest()
    try:
        req.ParseFromString(payload)
    except DecodeError:
        return None
    return req


def check_decode(payload: bytes, servable, max_bytes: int | None = None) -> str:
    """The outcome: "unparseable", "invalid" (InvalidInput) or "ok" (and then faithful); other exceptions escape."""
    req = parse(payload)
    if req is None:
        return "unparseable"
    try:
        dec = decode_request(req, servable, max_bytes)
    except InvalidInput:
        return "invalid"
    assert_faithful(req, dec, servable)
    return "ok"


def assert_faithful(req: pb.ModelInferRequest, dec, servable) -> None:
    """The decoded request holds exactly what was sent: names, datatypes, shapes, values, outputs, timeout."""
    cfg = servable.config
    sent = {t.name: (i, t) for i, t in enumerate(req.inputs)}
    assert len(sent) == len(req.inputs), "accepted a request naming an input twice"
    assert set(dec.inputs) == set(sent) == {t.name for t in cfg.inputs}, (sorted(dec.inputs), sorted(sent))
    raw = req.raw_input_contents
    for tcfg in cfg.inputs:
        i, t = sent[tcfg.name]
        dt = DATATYPES[tcfg.datatype]
        a = dec.inputs[tcfg.name]
        assert t.datatype == tcfg.datatype, (tcfg.name, t.datatype)
        assert a.shape == tuple(t.shape), (tcfg.name, a.shape, tuple(t.shape))
        assert a.shape[0] == dec.rows and 1 <= dec.rows <= cfg.max_batch_size
        assert all(w == -1 or w == s for w, s in zip(tcfg.dims, a.shape[1:])), (tcfg.dims, a.shape)
        assert a.dtype == dt.numpy, (tcfg.name, a.dtype)
        flat = a.reshape(-1)
        if raw:
            got = serialize_bytes(a) if dt.name == "BYTES" else a.tobytes()
            assert got == raw[i], f"input '{tcfg.name}': decoded values differ from the raw bytes sent"
            continue
        values = list(getattr(t.contents, dt.contents_field))
        if dt.numpy.kind == "f":
            assert np.array_equal(flat, np.asarray(values, dtype=dt.numpy), equal_nan=True), tcfg.name
        else:
            assert flat.tolist() == values, f"input '{tcfg.name}': decoded values differ from the contents sent"
    wanted = tuple(o.name for o in req.outputs)
    assert dec.outputs == (wanted or None), (dec.outputs, wanted)
    p = req.parameters.get("timeout") if "timeout" in req.parameters else None
    if p is None:
        assert dec.timeout_s is None
    else:
        us = getattr(p, p.WhichOneof("parameter_choice"))
        assert dec.timeout_s == (us / 1e6 if us > 0 else None), (us, dec.timeout_s)


# -- at the server ---------------------------------------------------------------------------------------
# Statuses a bad (or unlucky) request may get; UNKNOWN and INTERNAL mean the server failed on it,
# UNAVAILABLE or CANCELLED that the answer was lost.
CLEAR_STATUSES = frozenset(
    {"OK", "INVALID_ARGUMENT", "NOT_FOUND", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "UNIMPLEMENTED"}
)
INFER_METHOD = "/inference.GRPCInferenceService/ModelInfer"
# The most bytes a unary answer's details take as sent (percent-encoded in the grpc-message
# header): wok cuts them to this (`short_details` in server/service.py).
DETAILS_BYTES = 4096
# The server's --max-request-bytes by default. RESOURCE_EXHAUSTED is a clear answer to a request
# over it (gRPC's receive limit is 4 times it + 1 MiB), not to a smaller one: there it is a
# client's limit (a header over 16 KiB) or a server's fault, unless it is one of wok's refusals.
MAX_REQUEST_BYTES = 64 << 20
# wok's own RESOURCE_EXHAUSTED refusals, of a request of any size, by their messages: a full queue,
# an slo admission refusal, an answer over the send limit.
SERVER_REFUSALS = re.compile(r"queue is full|; retry after \d+ ms$|over the server's send limit")
# A wrong name must appear in the error's details: its first this many characters, as they are or,
# for a name with a character that is not printable, escaped (`quoted_name` in server/errors.py).
NAME_START = 32
UNCLEAR_KEPT = 10  # unclear answers listed in the result, the first ones


def sent_size(details: str) -> int:
    """Bytes of `details` in the grpc-message header: printable ASCII but '%' as itself, any other byte as %XX."""
    raw = details.encode("utf-8", "surrogatepass")
    return len(raw) + 2 * sum(1 for b in raw if not 0x20 <= b <= 0x7E or b == 0x25)


def _show(name: str) -> str:
    return f"{len(name):,} characters: {name[:40]!r}{'...' if len(name) > 40 else ''}"


def wrong_name(req: pb.ModelInferRequest, servables: dict) -> tuple[str, str, str] | None:
    """(status, what, name) when `req` names something the server (serving `servables`, by name)
    does not have, in the order the server checks: a version that is no integer (read first, as
    Triton reads it), the model, a version not served, an input (unknown or repeated), then, where
    the inputs pass, an output (unknown, repeated or with a parameter wok refuses). The answer must
    have that status and quote the name's start; None: no wrong name."""
    version = req.model_version
    # An int64 as Triton reads it, in ASCII digits alone: "01" is version 1, another integer one not
    # served, anything else (a sign, a point, past 2**63-1) no version at all. Leading zeros go before
    # int(), which refuses over 4,300 digits.
    digits = version.lstrip("0") or "0"
    if version and (not ascii_digits(version) or len(digits) > 19 or int(digits) >= 2**63):
        return "INVALID_ARGUMENT", "model version", version
    servable = servables.get(req.model_name)
    if servable is None:
        return "NOT_FOUND", "model name", req.model_name
    if version and int(digits) != int(VERSION):
        return "NOT_FOUND", "model version", version
    cfg = servable.config
    seen: set[str] = set()
    for t in req.inputs:
        if cfg.input(t.name) is None or t.name in seen:
            return "INVALID_ARGUMENT", "input name", t.name
        seen.add(t.name)
    known, asked, offender = {o.name for o in cfg.outputs}, set(), None
    for o in req.outputs:
        if o.name not in known or o.name in asked or any(p in o.parameters for p in UNSUPPORTED_OUTPUT_PARAMETERS):
            offender = o.name
            break
        asked.add(o.name)
    if offender is None:
        return None
    bare = pb.ModelInferRequest()
    bare.CopyFrom(req)
    del bare.outputs[:]
    try:  # the outputs are checked once every input passes (the model's own check comes after them)
        decode_request(bare, servable)
    except InvalidInput:
        return None
    return "INVALID_ARGUMENT", "output name", offender


def judge(
    payload: bytes, code: str, details: str, servables: dict, max_request_bytes: int = MAX_REQUEST_BYTES
) -> tuple[str, str] | None:
    """None when the unary answer (`code`, `details`) to `payload` is clear; else (key, why) it is not.

    Clear: a status of CLEAR_STATUSES; details of at most DETAILS_BYTES as sent; RESOURCE_EXHAUSTED
    only for a request over `max_request_bytes` or as one of wok's refusals (SERVER_REFUSALS);
    INVALID_ARGUMENT for bytes that do not parse (over `max_request_bytes`, where the server reads only the
    model's name, version and id, `codec._head_of`, the status those call for); for a wrong model name, version,
    input or output name (`wrong_name`), the status it calls for, with the name's first NAME_START characters in
    the details (escaped, for a name that is not all printable). `servables`: what the server serves,
    by name."""
    if code not in CLEAR_STATUSES:
        return f"status {code}", f"status {code}: {details[:200]!r}"
    size = sent_size(details)
    if size > DETAILS_BYTES:
        why = f"{code} with details of {size:,} bytes as sent (over {DETAILS_BYTES:,}): {details[:200]!r}"
        return "details too long", why
    small = len(payload) <= max_request_bytes
    if code == "RESOURCE_EXHAUSTED" and small and not SERVER_REFUSALS.search(details):
        why = f"RESOURCE_EXHAUSTED for {len(payload):,} bytes (limit {max_request_bytes:,}): {details[:200]!r}"
        return "RESOURCE_EXHAUSTED under the size limits", why
    req = parse(payload)
    if req is None:
        # Over the limit, the server parses only the model's name, version and id (codec._head_of) and refuses the
        # request by them, for its model or for its size, whether or not the rest would parse.
        head = None if small else _head_of(payload)
        if head is None or type(head) is str:  # a str: why the server did not read it (refused for its size)
            return None if code == "INVALID_ARGUMENT" else ("unparseable bytes", f"{code} for bytes that do not parse")
        wrong = wrong_name(head, servables)
        if wrong is None and code not in ("INVALID_ARGUMENT", "RESOURCE_EXHAUSTED"):  # its size refused
            return "unparseable bytes", f"{code} for bytes over the limit that do not parse, to a served model"
    else:
        wrong = wrong_name(req, servables) if small else None
    if wrong is None or code == "RESOURCE_EXHAUSTED":  # one of wok's refusals comes before the names are read
        return None
    want, what, name = wrong
    if code != want:
        return f"{code} for a wrong {what}", f"{code} for a request whose {what} is wrong ({_show(name)}), not {want}"
    if name[:NAME_START] not in details and escaped(name[:NAME_START]) not in details:
        return f"{what} not named", f"{code} does not name the {what} ({_show(name)}): {details[:200]!r}"
    return None


def normal_request(model: str) -> bytes:
    """A request every demo model serves, to prove the server still works after a fuzzed one."""
    from wok.codec import encode_request

    inputs = {
        "mlp": {"INPUT0": np.ones((1, 256), np.float32)},
        "recsys": {"dense": np.ones((1, 13), np.float32), "ids": np.arange(4, dtype=np.int64)[None]},
        "encoder": {"tokens": np.arange(1, 9, dtype=np.int64)[None]},
    }[model]
    return encode_request(model, inputs).SerializeToString()


class ServerChecker:
    """Sends payloads as they are (bytes in, bytes out) to a wok server that serves `servables`
    (by name), judges each answer (`judge`), and asserts that a normal request to the same model
    succeeds after it. Each call carries a `timeout_s` gRPC deadline."""

    def __init__(
        self, target: str, servables: dict, timeout_s: float = 30.0, max_request_bytes: int = MAX_REQUEST_BYTES
    ) -> None:
        import grpc

        self._error = grpc.RpcError
        self.channel = grpc.insecure_channel(target)
        self._call = self.channel.unary_unary(INFER_METHOD)
        self.servables, self.timeout_s, self.max_request_bytes = servables, timeout_s, max_request_bytes

    def send(self, payload: bytes) -> tuple[str, str]:
        """(status name, details) of the answer to `payload`."""
        try:
            self._call(payload, timeout=self.timeout_s)
        except self._error as exc:
            return exc.code().name, exc.details() or ""
        return "OK", ""

    def answer(self, payload: bytes, model: str) -> tuple[str, tuple[str, str] | None]:
        """(status name, None or why the answer is unclear); asserts that a normal request to `model` then succeeds."""
        code, details = self.send(payload)
        problem = judge(payload, code, details, self.servables, self.max_request_bytes)
        after, why = self.send(normal_request(model))
        assert after == "OK", f"a normal request to '{model}' after a fuzzed one got {after}: {why[:200]!r}"
        return code, problem

    def check(self, payload: bytes, model: str) -> str:
        """The status name; asserts that the answer is clear (and the normal request after it OK)."""
        code, problem = self.answer(payload, model)
        assert problem is None, problem[1]
        return code

    def close(self) -> None:
        self.channel.close()


def server_checker(
    target: str, servables: dict, timeout_s: float = 30.0
) -> tuple[Callable[[bytes, str], str], Callable[[], None]]:
    """(check, close): check(payload, model) sends it, asserts a clear answer (`judge`) and that a
    normal request to `model` then succeeds, and returns the status name."""
    checker = ServerChecker(target, servables, timeout_s)
    return checker.check, checker.close


# -- the rounds and the long run -----------------------------------------------------------------------------
@dataclass
class Tally:
    """What rounds of fuzzing saw: inputs by kind/outcome at the decoder; at the server, statuses,
    verdicts ("clear" or "unclear: <reason>"), the first unclear answers, and the wrong names judged
    that are over DETAILS_BYTES as sent, by field (proof that names too long to echo reached the checks)."""

    by_outcome: Counter = dc_field(default_factory=Counter)
    statuses: Counter = dc_field(default_factory=Counter)
    verdicts: Counter = dc_field(default_factory=Counter)
    unclear: list = dc_field(default_factory=list)
    long_names: Counter = dc_field(default_factory=Counter)


def fuzz_round(
    servables: dict,
    examples: int,
    checker: ServerChecker | None = None,
    tally: Tally | None = None,
    seed_: int | None = None,
) -> Tally:
    """One hypothesis run of `examples` inputs to `servables` (by name), seeded with `seed_` (else
    random): each through the decoder's property (a failure raises, with the falsifying input), then,
    with `checker`, to its server, where the answer is judged and counted (an unclear one does not
    stop the round; a normal request failing after one does)."""
    tally = tally if tally is not None else Tally()
    names = sorted(servables)

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=False,
        phases=[Phase.generate, Phase.shrink],
        suppress_health_check=list(HealthCheck),
    )
    @given(st.data())
    def one(data) -> None:
        name = data.draw(st.sampled_from(names), label="model")
        kind, payload = data.draw(payloads(servables[name]), label="payload")
        t0 = time.monotonic()
        outcome = check_decode(payload, servables[name])
        assert time.monotonic() - t0 < 5.0, "decoding took over 5 s"
        if kind == "valid":
            assert outcome == "ok", f"a valid request was {outcome}"
        tally.by_outcome[f"{kind}/{outcome}"] += 1
        if checker is None:
            return
        code, problem = checker.answer(payload, name)
        tally.statuses[code] += 1
        tally.verdicts["clear" if problem is None else f"unclear: {problem[0]}"] += 1
        req = parse(payload)
        wrong = wrong_name(req, checker.servables) if req is not None else None
        if wrong is not None and sent_size(wrong[2]) > DETAILS_BYTES:
            tally.long_names[wrong[1]] += 1
        if problem is not None and len(tally.unclear) < UNCLEAR_KEPT:
            seen = {"kind": kind, "model": name, "bytes": len(payload), "status": code, "why": problem[1]}
            tally.unclear.append(seen)

    if seed_ is not None:
        one = seed(seed_)(one)
    one()
    return tally


def run(
    seconds: float,
    target: str | None = None,
    batch: int = 500,
    progress=None,
    max_request_bytes: int = MAX_REQUEST_BYTES,
) -> dict:
    """Fuzz for `seconds` (in rounds of `batch` examples, each round a fresh random seed); counts by
    outcome, and with `target` (a server with the demo models, whose --max-request-bytes is
    `max_request_bytes`) by status and verdict."""
    servables = fuzz_servables()
    served = {n: s for n, s in servables.items() if not n.startswith("alltype")}
    checker = ServerChecker(target, served, max_request_bytes=max_request_bytes) if target else None
    tally = Tally()
    end = time.monotonic() + seconds
    started = time.monotonic()
    rounds = 0
    try:
        while time.monotonic() < end:
            fuzz_round(served if checker else servables, batch, checker, tally)
            rounds += 1
            if progress:
                progress(f"{sum(tally.by_outcome.values())} inputs in {time.monotonic() - started:.0f} s")
    finally:
        if checker:
            checker.close()
    return {
        "schema": SCHEMA,
        "seconds": round(time.monotonic() - started, 1),
        "target": target,
        "inputs_tried": sum(tally.by_outcome.values()),
        "rounds": rounds,
        "by_outcome": dict(sorted(tally.by_outcome.items())),
        "server_statuses": dict(sorted(tally.statuses.items())) if target else None,
        "server_verdicts": dict(sorted(tally.verdicts.items())) if target else None,
        "long_wrong_names": dict(sorted(tally.long_names.items())) if target else None,
        "unclear_answers": tally.unclear if target else None,
    }


def build_parser() -> argparse.ArgumentParser:
    """This script's parser (tests/deploy/test_doc_commands.py parses the docs' command lines with it)."""
    from wok.cliargs import ArgumentParser  # argparse's, its refusals in wok's words

    ap = ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0, help="how long to fuzz (default 10)")
    ap.add_argument("--target", help="HOST:PORT of a wok server serving the demo models; also send each input there")
    ap.add_argument(
        "--max-request-bytes",
        type=int,
        default=MAX_REQUEST_BYTES,
        help="the target's --max-request-bytes (default 64 MiB): RESOURCE_EXHAUSTED is clear only over it",
    )
    ap.add_argument("--json", type=Path, help="write the counts (schema wok.fuzz/1) here")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    refuse_unwritable(ap, args, "--json")
    # Refused as --json is and as the other standalone scripts refuse a value (usage, the message, exit 2).
    if not args.minutes > 0:  # NaN passed `<= 0`: a run of no rounds, exit 0
        ap.error(f"--minutes: expected a number > 0; got {args.minutes:g}")
    if args.target is not None:
        from wok.bench.cli import check_one_target

        try:
            args.target = check_one_target(args.target)  # else one without a port dials 443, a URL fails every input
        except ValueError as exc:
            ap.error(str(exc))
    result = run(
        60 * args.minutes,
        args.target,
        progress=lambda m: print(m, file=sys.stderr, flush=True),
        max_request_bytes=args.max_request_bytes,
    )
    text = json_text(result)
    # The file first: a reader that closes stdout early (`| head -1`) must not cost it.
    failed = write_final(result, [("--json", args.json, lambda result, path: path.write_text(text, encoding="utf-8"))])
    shown = _print_to_stdout(text.removesuffix("\n"))
    unclear = sum(n for verdict, n in (result.get("server_verdicts") or {}).items() if verdict != "clear")
    if unclear:
        print(f"{PROG}: {unclear} unclear answers from the server; the first ones:", file=sys.stderr)
        for answer in result.get("unclear_answers") or ():
            print(f"  {answer['kind']} to '{answer['model']}': {answer['why']}", file=sys.stderr)
    if failed:
        print(f"{PROG}: {failed}", file=sys.stderr)
        return 1
    return 1 if unclear or not shown else 0


def _print_to_stdout(text: str) -> bool:
    """`text` on stdout; False, quietly, when its reader is gone (`| head`), as the other commands end."""
    from wok.bench.cli import quiet_if_stdout_closed

    try:
        print(text)
        sys.stdout.flush()  # here, not at exit, where a closed pipe is found past every handler
        return True
    except BrokenPipeError as exc:
        quiet_if_stdout_closed(exc)
        return False


if __name__ == "__main__":
    sys.exit(main())
