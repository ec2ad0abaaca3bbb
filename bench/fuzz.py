"""Fuzzing the request decoder with random and mutated KServe V2 ModelInferRequests.

The property, at the decoder (`wok.codec.decode_request` with the servable's `check`):
a payload either fails to parse as a ModelInferRequest (protobuf's DecodeError), or it
decodes and every value, shape, requested output and timeout equals what was sent, or it
is rejected with wok's InvalidInput. Any other exception is a bug. At the server: every
payload gets exactly one answer with a clear status (never UNKNOWN or INTERNAL; bytes that
do not parse get INVALID_ARGUMENT), and a normal request succeeds after it.

Three kinds of payload, each built by a hypothesis strategy from the model's config:

* valid: the right inputs, datatypes and shapes, raw or typed contents, some of the
  outputs, a timeout parameter: must decode, value for value;
* random: names, datatypes (unknown ones too), shapes (negative, huge, overflowing,
  mismatched with the contents), raw contents of any length, typed contents of any kind,
  BYTES with bad length prefixes, parameters of every kind, outputs that do not exist;
* mutated: a valid request's serialized bytes with bits flipped, bytes overwritten,
  cut or spliced: they must parse or be rejected by protobuf.

The test suite runs a bounded number of examples (tests/server/test_fuzz_decode.py,
tests/integration/test_fuzz_server.py); a longer run is this module's command:

    python -m wok.bench.fuzz --minutes 10 [--target HOST:PORT] [--json fuzz.json]

It counts the inputs tried by kind and outcome (schema "wok.fuzz/1", docs/fuzzing.md),
and exits 1 with the falsifying input when the property fails.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from wok.bench.outputs import refuse_unwritable, write_final
from wok.codec import decode_request, serialize_bytes
from wok.config import model_config_from_dict
from wok.datatypes import DATATYPES
from wok.errors import InvalidInput
from wok.v2pb import grpc_service_pb2 as pb

SCHEMA = "wok.fuzz/1"
MODEL_KINDS = ("valid", "random", "mutated")
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
def _parameters(target, draw) -> None:
    """Fill a parameters map with random keys ("timeout" often) and values of every kind."""
    for key in draw(st.lists(st.one_of(st.just("timeout"), st.text(max_size=6)), max_size=3)):
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
def random_requests(draw, servable) -> pb.ModelInferRequest:
    """Anything the message can hold, biased towards the model's own names so checks run deep."""
    cfg = servable.config
    names = st.one_of(st.sampled_from([t.name for t in cfg.inputs]), st.text(max_size=6))
    datatypes = st.one_of(st.sampled_from(list(DATATYPES)), st.text(max_size=6))
    dims = st.one_of(st.integers(-3, 40), st.sampled_from(EDGE_DIMS), st.integers(*INT64))
    # Mostly (9 in 10) the model's own name and version, so that at a server most requests reach the decoder.
    mostly = draw(st.integers(0, 9)) > 0
    req = pb.ModelInferRequest(
        model_name=cfg.name if mostly else draw(st.sampled_from(["", cfg.name.upper()]) | st.text(max_size=6)),
        model_version=draw(st.sampled_from(["", "1"])) if mostly else draw(st.sampled_from(["2", "x"]) | st.text()),
    )
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
        out = req.outputs.add(name=draw(st.one_of(st.sampled_from([t.name for t in cfg.outputs]), st.text(max_size=6))))
        _parameters(out.parameters, draw)
    _parameters(req.parameters, draw)
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
    """(kind, serialized payload): valid, random or mutated, in about equal shares."""
    return st.one_of(
        valid_requests(servable).map(lambda r: ("valid", r.SerializeToString())),
        random_requests(servable).map(lambda r: ("random", r.SerializeToString())),
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
# Statuses a bad (or unlucky) request may get; UNKNOWN and INTERNAL mean the server failed on it.
CLEAR_STATUSES = frozenset(
    {"OK", "INVALID_ARGUMENT", "NOT_FOUND", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "UNIMPLEMENTED"}
)
INFER_METHOD = "/inference.GRPCInferenceService/ModelInfer"


def normal_request(model: str) -> bytes:
    """A request every demo model serves, to prove the server still works after a fuzzed one."""
    from wok.codec import encode_request

    inputs = {
        "mlp": {"INPUT0": np.ones((1, 256), np.float32)},
        "recsys": {"dense": np.ones((1, 13), np.float32), "ids": np.arange(4, dtype=np.int64)[None]},
        "encoder": {"tokens": np.arange(1, 9, dtype=np.int64)[None]},
    }[model]
    return encode_request(model, inputs).SerializeToString()


def server_checker(target: str, timeout_s: float = 30.0) -> tuple[Callable[[bytes, str], str], Callable[[], None]]:
    """(check, close): check(payload, model) sends it, asserts a clear status and that a normal request
    to `model` then succeeds, and returns the status name."""
    import grpc

    channel = grpc.insecure_channel(target)
    call = channel.unary_unary(INFER_METHOD)  # bytes in, bytes out: the payload goes as it is

    def status(payload: bytes) -> str:
        try:
            call(payload, timeout=timeout_s)
        except grpc.RpcError as exc:
            return exc.code().name
        return "OK"

    def check(payload: bytes, model: str) -> str:
        code = status(payload)
        assert code in CLEAR_STATUSES, f"status {code} for a fuzzed request"
        after = status(normal_request(model))
        assert after == "OK", f"a normal request to '{model}' after a fuzzed one got {after}"
        return code

    return check, channel.close


# -- the long run -------------------------------------------------------------------------------------------
def run(seconds: float, target: str | None = None, batch: int = 500, progress=None) -> dict:
    """Fuzz for `seconds` (in rounds of `batch` examples, each round a fresh random seed); counts by outcome."""
    servables = fuzz_servables()
    served = [n for n in servables if not n.startswith("alltype")]
    counts: Counter = Counter()
    statuses: Counter = Counter()
    check_server, close = server_checker(target) if target else (None, None)
    end = time.monotonic() + seconds
    started = time.monotonic()

    @settings(
        max_examples=batch,
        deadline=None,
        database=None,
        derandomize=False,
        phases=[Phase.generate, Phase.shrink],
        suppress_health_check=list(HealthCheck),
    )
    @given(st.data())
    def one(data) -> None:
        name = data.draw(st.sampled_from(served if check_server else list(servables)), label="model")
        kind, payload = data.draw(payloads(servables[name]), label="payload")
        t0 = time.monotonic()
        outcome = check_decode(payload, servables[name])
        assert time.monotonic() - t0 < 5.0, "decoding took over 5 s"
        if kind == "valid":
            assert outcome == "ok", f"a valid request was {outcome}"
        counts[f"{kind}/{outcome}"] += 1
        if check_server is not None:
            code = check_server(payload, name)
            assert outcome != "unparseable" or code == "INVALID_ARGUMENT", f"{code} for bytes that do not parse"
            statuses[code] += 1

    rounds = 0
    try:
        while time.monotonic() < end:
            one()
            rounds += 1
            if progress:
                progress(f"{sum(counts.values())} inputs in {time.monotonic() - started:.0f} s")
    finally:
        if close:
            close()
    return {
        "schema": SCHEMA,
        "seconds": round(time.monotonic() - started, 1),
        "target": target,
        "inputs_tried": sum(counts.values()),
        "rounds": rounds,
        "by_outcome": dict(sorted(counts.items())),
        "server_statuses": dict(sorted(statuses.items())) if target else None,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m wok.bench.fuzz", description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0, help="how long to fuzz (default 10)")
    ap.add_argument("--target", help="HOST:PORT of a wok server serving the demo models; also send each input there")
    ap.add_argument("--json", type=Path, help="write the counts (schema wok.fuzz/1) here")
    args = ap.parse_args(argv)
    refuse_unwritable(ap, args, "--json")
    if args.minutes <= 0:
        print("wok fuzz: --minutes must be > 0", file=sys.stderr)
        return 2
    result = run(60 * args.minutes, args.target, progress=lambda m: print(m, file=sys.stderr, flush=True))
    text = json.dumps(result, indent=2)
    print(text)
    failed = write_final(result, [("--json", args.json, lambda result, path: path.write_text(text + "\n"))])
    if failed:
        print(f"wok fuzz: {failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
