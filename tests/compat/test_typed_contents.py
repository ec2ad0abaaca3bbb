"""Typed contents (InferTensorContents) of every datatype wok serves, sent with tritonclient's own generated
stubs (tritonclient.grpc.service_pb2), to a real server on loopback.

tritonclient's InferInput always sends raw_input_contents, so test_tritonclient_datatypes.py never sends a
typed value; a client generated from the KServe proto may send nothing else. Each datatype goes in the field
the KServe spec gives it (FIELD: the test's own table, not wok's), INT8 and INT16 in int_contents, UINT8 and
UINT16 in uint_contents, with its edge values (datatype_values.py); the model answers each input back
unchanged and widened to FP64, and the answers are checked bit for bit against what was sent, on ModelInfer
(batched) and on a stream, and against the answers to the same values sent raw. FP16 and BF16 have no field:
a request carrying them in one is refused, naming raw_input_contents. BYTES is not served (README).
"""

from __future__ import annotations

import asyncio

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as tpb
from tritonclient.grpc import service_pb2_grpc as tpb_grpc

from .datatype_values import (
    BITS,
    FLOAT_FIELDS,
    MAX_BATCH_SIZE,
    TOGETHER,
    TYPES,
    WIRE,
    case_inputs,
    config_toml,
    echo_name,
    edge_values,
    f64_name,
    input_name,
    model_py,
)

# InferTensorContents' field of each datatype, as the KServe V2 gRPC spec's comments give them.
FIELD = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
}
TYPED = tuple(t for t in TYPES if t in FIELD)
assert set(TYPES) - set(TYPED) == {"FP16", "BF16"}, "a datatype wok serves has no row in FIELD"
MODEL = "typed"
# One input of a type with no field, each a model of its own: a request's first bad input is the one refused.
HALF = {"FP16": "half_fp16", "BF16": "half_bf16"}
IDENTITY_PY = "from torch import nn\n\n\ndef build():\n    return nn.Identity()\n"


@pytest.fixture
def repository(tmp_path):
    root = tmp_path / "repo"
    (root / MODEL).mkdir(parents=True)
    # A short delay: a lone request is answered at once, and those sent together may share a batch.
    (root / MODEL / "config.toml").write_text(config_toml(TYPED, max_queue_delay_ms=20.0))
    (root / MODEL / "model.py").write_text(model_py(TYPED))
    for t, name in HALF.items():
        (root / name).mkdir()
        (root / name / "model.py").write_text(IDENTITY_PY)
        (root / name / "config.toml").write_text(
            f'platform = "python"\nfactory = "model:build"\nmax_batch_size = {MAX_BATCH_SIZE}\n\n'
            f'[[inputs]]\nname = "IN"\ndatatype = "{t}"\ndims = [3]\n\n'
            f'[[outputs]]\nname = "OUT"\ndatatype = "{t}"\ndims = [3]\n\n[instances]\ndevices = ["cpu"]\n'
        )
    return root


def sent(case: str) -> dict[str, np.ndarray]:
    """Input name -> [rows, dims] of its type, for the typed types."""
    inputs = case_inputs(case)
    return {input_name(t): inputs[input_name(t)] for t in TYPED}


def typed_request(case: str) -> tpb.ModelInferRequest:
    req = tpb.ModelInferRequest(model_name=MODEL, id=f"typed-{case}")
    for t in TYPED:
        x = sent(case)[input_name(t)]
        tensor = req.inputs.add(name=input_name(t), datatype=t, shape=x.shape)
        getattr(tensor.contents, FIELD[t]).extend(x.ravel().tolist())
    return req


def raw_request(case: str) -> tpb.ModelInferRequest:
    req = tpb.ModelInferRequest(model_name=MODEL, id=f"raw-{case}")
    for t in TYPED:
        x = sent(case)[input_name(t)]
        req.inputs.add(name=input_name(t), datatype=t, shape=x.shape)
        req.raw_input_contents.append(x.tobytes())
    return req


def outputs_of(resp: tpb.ModelInferResponse) -> dict[str, np.ndarray]:
    """Output name -> its values as bit patterns, read from raw_output_contents by the test's own dtypes."""
    assert len(resp.raw_output_contents) == len(resp.outputs), resp.id
    out = {}
    for o, raw in zip(resp.outputs, resp.raw_output_contents, strict=True):
        t = o.name.split("_", 1)[1]
        wide = o.name == f64_name(t)
        assert o.datatype == ("FP64" if wide else t), (resp.id, o.name, o.datatype)
        out[o.name] = np.frombuffer(raw, np.uint64 if wide else BITS[t]).reshape(tuple(o.shape))
    return out


def assert_same_bits(where: str, got: np.ndarray, want: np.ndarray, floats: np.dtype | None) -> None:
    """Equal bit for bit, but that a NaN sent may come back as any NaN (`floats`: the dtype the bits are of)."""
    assert got.shape == want.shape, f"{where}: shape {list(got.shape)}, expected {list(want.shape)}"
    same = got == want
    if floats is not None:
        same |= np.isnan(got.view(floats)) & np.isnan(want.view(floats))
    bad = [f"[{', '.join(map(str, i))}] got {got[i]:#x}, expected {want[i]:#x}" for i in zip(*np.nonzero(~same))]
    assert not bad, f"{where}: {len(bad)} value(s) differ: " + "; ".join(bad[:8])


def check_answer(resp: tpb.ModelInferResponse, case: str) -> None:
    out = outputs_of(resp)
    assert sorted(out) == sorted([echo_name(t) for t in TYPED] + [f64_name(t) for t in TYPED]), resp.id
    for t in TYPED:
        x = sent(case)[input_name(t)]
        floats = WIRE[t] if t in FLOAT_FIELDS else None
        assert_same_bits(f"{resp.id} {echo_name(t)}", out[echo_name(t)], x.view(BITS[t]), floats)
        # The model's float64 of each value: the value the model got, not only its bytes.
        widened = x.astype(np.float64).view(np.uint64)
        assert_same_bits(f"{resp.id} {f64_name(t)}", out[f64_name(t)], widened, np.dtype(np.float64))


def test_the_edge_values_reach_each_fields_limits():
    # What the sent values cover: the ends of each integer type, so a value out of int_contents' low bytes shows.
    for t in TYPED:
        if t in FLOAT_FIELDS or t == "BOOL":
            continue
        info = np.iinfo(WIRE[t])
        assert {info.min, info.max} <= set(edge_values(t).tolist()), t


async def test_typed_contents_of_every_datatype_come_back_as_sent_on_model_infer_batched(serve, repository):
    async with serve(models=(), repository=repository) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = tpb_grpc.GRPCInferenceServiceStub(channel)
            full = await stub.ModelInfer(typed_request("full"))
            # Sent together: 3 + 4 + 1 rows, a batch of MAX_BATCH_SIZE where they meet in one.
            together = await asyncio.gather(*(stub.ModelInfer(typed_request(c)) for c in TOGETHER))
            raw = await asyncio.gather(*(stub.ModelInfer(raw_request(c)) for c in ("full", *TOGETHER)))
    for case, resp in zip(("full", *TOGETHER), (full, *together), strict=True):
        assert (resp.model_name, resp.id) == (MODEL, f"typed-{case}")
        check_answer(resp, case)
    for typed, untyped in zip((full, *together), raw, strict=True):
        # The same values sent raw get the same answer, byte for byte.
        assert list(typed.raw_output_contents) == list(untyped.raw_output_contents), typed.id


async def test_typed_contents_of_every_datatype_come_back_as_sent_on_a_stream(serve, repository):
    cases = ("full", *TOGETHER)

    async def requests():
        for case in cases:
            yield typed_request(case)

    async with serve(models=(), repository=repository) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = tpb_grpc.GRPCInferenceServiceStub(channel)
            answers = [msg async for msg in stub.ModelStreamInfer(requests())]
    assert [a.error_message for a in answers] == [""] * len(cases)
    by_id = {a.infer_response.id: a.infer_response for a in answers}
    assert sorted(by_id) == sorted(f"typed-{c}" for c in cases)
    for case in cases:
        check_answer(by_id[f"typed-{case}"], case)


@pytest.mark.parametrize(
    ("datatype", "fields", "got"),
    [
        ("FP16", {"fp32_contents": [1.0, -2.5, 0.5]}, "contents: fp32_contents (3 values)"),
        ("BF16", {"fp32_contents": [1.0, -2.5, 0.5]}, "contents: fp32_contents (3 values)"),
        # bfloat16 words, as a client holding them as uint16 might send them.
        ("BF16", {"uint_contents": [0x3F80, 0xC020, 0x3F00]}, "contents: uint_contents (3 values)"),
        (
            "FP16",
            {"int_contents": [1], "fp64_contents": [1.0, 2.0]},
            "contents: int_contents (1 value), fp64_contents (2 values)",
        ),
        ("BF16", {}, "no raw_input_contents"),
    ],
)
async def test_fp16_and_bf16_in_typed_contents_are_refused_naming_raw_input_contents(
    serve, repository, datatype, fields, got
):
    # InferTensorContents has no field for either; Triton refuses them too ("unexpected explicit tensor data").
    req = tpb.ModelInferRequest(model_name=HALF[datatype])
    tensor = req.inputs.add(name="IN", datatype=datatype, shape=[1, 3])
    for field, values in fields.items():
        getattr(tensor.contents, field).extend(values)
    raw = tpb.ModelInferRequest(model_name=HALF[datatype])
    raw.inputs.add(name="IN", datatype=datatype, shape=[1, 3])
    raw.raw_input_contents.append(np.array([[0x3C00, 0xC100, 0x3800]], np.uint16).tobytes())
    async with serve(models=(), repository=repository) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = tpb_grpc.GRPCInferenceServiceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.ModelInfer(req)
            answer = await stub.ModelInfer(raw)  # the same tensor sent raw is served
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == (
        f"input 'IN': expected {datatype} values in raw_input_contents (InferTensorContents has no field for "
        f"{datatype}); got {got}"
    )
    assert list(answer.raw_output_contents) == list(raw.raw_input_contents)
