"""Malformed inference requests on a real server: each gets INVALID_ARGUMENT with a message that names
the input, what was expected and what was got, on ModelInfer and on a stream alike (the same message,
cut alike when it is long), and the requests sent around it are answered."""

from __future__ import annotations

import asyncio
import logging

import grpc
import numpy as np
import pytest

from wok.codec import decode_response
from wok.v2pb import grpc_service_pb2 as pb
from wok.v2pb import grpc_service_pb2_grpc as pb_grpc

# A model of the two datatypes InferTensorContents has no field for, one of a single FP32 input (whose
# check refuses values over 100, and under -1000 with a 1 MB message, and fails itself under -10,000,
# with a 1 MB error), and one of a BOOL input.
HALF_PY = """
from torch import nn


class Sum(nn.Module):
    def forward(self, H, B):
        return H.float() + B.float()


def build():
    return Sum()
"""
ONE_PY = """
from torch import nn

from wok.errors import InvalidInput


class Double(nn.Module):
    def forward(self, x):
        if (x == -777).any():
            raise ValueError(f"cannot open '{UNDECODABLE}'")
        return x * 2


def build():
    return Double()


# A name made of undecodable bytes, as os.fsdecode makes it: a lone surrogate, which UTF-8 cannot encode.
UNDECODABLE = "caf\\udce9.bin"


def check(inputs):
    top = float(inputs["X"].max())
    if top == -555:
        raise ValueError(f"input 'X': read from '{UNDECODABLE}'")
    if top == -556:
        raise RuntimeError(f"cannot open '{UNDECODABLE}'")
    # wok's own refusal, as the demo models' checks raise it, in place of a ValueError.
    if top > 100:
        raise InvalidInput(f"input 'X': values must be at most 100, got {top}")
    bottom = float(inputs["X"].min())
    if bottom < -10_000:
        raise RuntimeError("the check itself fails: " + "r" * 1_000_000)  # not a refusal: INTERNAL
    if bottom < -1000:
        raise InvalidInput("input 'X': " + "v" * 1_000_000)
"""
FLAG_PY = """
from torch import nn


class Flag(nn.Module):
    def forward(self, F):
        return F.float()


def build():
    return Flag()
"""


def _config(inputs: list[tuple[str, str]], check: bool) -> str:
    lines = ['platform = "python"', 'factory = "model:build"', "max_batch_size = 4"]
    if check:
        lines.append('check = "model:check"')
    for name, datatype in inputs:
        lines += ["", "[[inputs]]", f'name = "{name}"', f'datatype = "{datatype}"', "dims = [4]"]
    lines += ["", "[[outputs]]", 'name = "OUT"', 'datatype = "FP32"', "dims = [4]"]
    lines += ["", "[instances]", 'devices = ["cpu"]']
    return "\n".join(lines) + "\n"


@pytest.fixture
def repository(tmp_path):
    root = tmp_path / "repo"
    for name, model_py, inputs in (
        ("half", HALF_PY, [("H", "FP16"), ("B", "BF16")]),
        ("one", ONE_PY, [("X", "FP32")]),
        ("flag", FLAG_PY, [("F", "BOOL")]),
    ):
        (root / name).mkdir(parents=True)
        (root / name / "model.py").write_text(model_py)
        (root / name / "config.toml").write_text(_config(inputs, check=name == "one"))
    return root


def half() -> pb.ModelInferRequest:
    req = pb.ModelInferRequest(model_name="half")
    req.inputs.add(name="H", datatype="FP16", shape=[1, 4])
    req.raw_input_contents.append(np.full((1, 4), 1.5, np.float16).tobytes())
    req.inputs.add(name="B", datatype="BF16", shape=[1, 4])
    req.raw_input_contents.append(np.full((1, 4), 0x4000, np.uint16).tobytes())  # bfloat16 2.0
    return req


def one() -> pb.ModelInferRequest:
    req = pb.ModelInferRequest(model_name="one")
    req.inputs.add(name="X", datatype="FP32", shape=[1, 4])
    req.raw_input_contents.append(np.ones((1, 4), np.float32).tobytes())
    return req


def flag(raw: bytes = bytes([1, 0, 1, 0])) -> pb.ModelInferRequest:
    req = pb.ModelInferRequest(model_name="flag")
    req.inputs.add(name="F", datatype="BOOL", shape=[len(raw) // 4, 4])
    req.raw_input_contents.append(raw)
    return req


def one_of(value: float) -> pb.ModelInferRequest:
    req = one()
    req.raw_input_contents[0] = np.full((1, 4), value, np.float32).tobytes()
    return req


def over_100() -> pb.ModelInferRequest:
    req = one()
    req.raw_input_contents[0] = np.full((1, 4), 1000.0, np.float32).tobytes()
    return req


def typed_fp16() -> pb.ModelInferRequest:
    req = half()
    del req.raw_input_contents[:]
    for t in req.inputs:
        t.contents.fp32_contents.extend([1.0] * 4)
    return req


def fp16_without_values() -> pb.ModelInferRequest:
    req = half()
    del req.raw_input_contents[:]
    return req


def raw_and_empty_contents() -> pb.ModelInferRequest:
    req = one()
    req.inputs[0].contents.SetInParent()  # set, with no values: on the wire as an empty field 5
    return req


def two_raw_for_one_input() -> pb.ModelInferRequest:
    req = one()
    req.raw_input_contents.append(req.raw_input_contents[0])
    return req


def one_raw_for_two_inputs() -> pb.ModelInferRequest:
    req = half()
    del req.raw_input_contents[1]
    return req


def duplicate_input() -> pb.ModelInferRequest:
    req = one()
    req.inputs.add(name="X", datatype="FP32", shape=[1, 4])
    req.raw_input_contents.append(req.raw_input_contents[0])
    return req


def with_datatype(datatype: str) -> pb.ModelInferRequest:
    req = one()
    req.inputs[0].datatype = datatype
    return req


ALL = "BOOL, UINT8, UINT16, UINT32, UINT64, INT8, INT16, INT32, INT64, FP16, FP32, FP64, BYTES, BF16"
# The 1 MB message of the check, as a unary call's details and a stream's error_message both cut it
# (service.short_details: 4096 bytes percent-encoded, 100 of them for the note).
CHECK_1MB = "model 'one' refused the request: input 'X': " + "v" * 1_000_000
CHECK_1MB_CUT = f"{CHECK_1MB[:3996]}… ({len(CHECK_1MB):,} characters in all)"
RAW_COUNT = (
    "; expected one entry per input, in the order of the request's inputs, or none (every input's values in its "
    "contents)"
)
CASES = {
    "FP16 in typed contents": (
        typed_fp16(),
        "input 'H': expected FP16 values in raw_input_contents (InferTensorContents has no field for FP16); "
        "got contents: fp32_contents (4 values)",
    ),
    "FP16 sent nowhere": (
        fp16_without_values(),
        "input 'H': expected FP16 values in raw_input_contents (InferTensorContents has no field for FP16); "
        "got no raw_input_contents",
    ),
    # Accepted before, the empty contents taken for none; Triton refuses any contents beside raw_input_contents.
    "raw and an empty contents": (
        raw_and_empty_contents(),
        "input 'X': sent both in raw_input_contents and in contents (set, with no values); expected one of them",
    ),
    "two raw entries for one input": (
        two_raw_for_one_input(),
        "raw_input_contents has 2 entries for 1 input" + RAW_COUNT,
    ),
    "one raw entry for two inputs": (
        one_raw_for_two_inputs(),
        "raw_input_contents has 1 entry for 2 inputs" + RAW_COUNT,
    ),
    "an input twice": (
        duplicate_input(),
        "input 'X' appears more than once (inputs 0 and 1); expected each input once",
    ),
    "an unknown datatype": (
        with_datatype("FP8"),
        f"input 'X': expected datatype FP32; got 'FP8', which is not a V2 datatype; the V2 datatypes: {ALL}",
    ),
    "a datatype in lower case": (
        with_datatype("fp32"),
        "input 'X': expected datatype FP32; got 'fp32', which is not a V2 datatype (the datatypes are upper case: "
        f"FP32); the V2 datatypes: {ALL}",
    ),
    "a datatype of control characters": (
        with_datatype("FP\n32\x00"),
        f"input 'X': expected datatype FP32; got 'FP\\n32\\x00', which is not a V2 datatype; the V2 datatypes: {ALL}",
    ),
    "a datatype of 100,000 characters": (
        with_datatype("Q" * 100_000),
        f"input 'X': expected datatype FP32; got '{'Q' * 40}'… (100,000 characters in all), which is not a V2 "
        f"datatype; the V2 datatypes: {ALL}",
    ),
    # Quoted as names are (errors.quoted): in single quotes whatever it holds (repr wrote "it's").
    "a datatype with a quote": (
        with_datatype("it's"),
        f"input 'X': expected datatype FP32; got 'it's', which is not a V2 datatype; the V2 datatypes: {ALL}",
    ),
    # It ended INTERNAL ("its check (model:check) failed: InvalidInput: ..."), logged with a traceback.
    "a check's InvalidInput": (
        over_100(),
        "model 'one' refused the request: input 'X': values must be at most 100, got 1000.0",
    ),
    # A stream's error_message was the whole 1 MB; a unary call's details were cut.
    "a check's InvalidInput of 1 MB": (one_of(-2000.0), CHECK_1MB_CUT),
    # Taken for bools as they were: the byte reached the model (numpy, torch) as it was sent.
    "a BOOL byte of 2": (
        flag(bytes([1, 0, 2, 1])),
        "input 'F': expected BOOL values as bytes 0 or 1 in raw_input_contents; got 2 at element 2 (index [0, 2])",
    ),
    "a BOOL byte of 255 in the second row": (
        flag(bytes([0, 1, 0, 1, 1, 255, 2, 0])),
        "input 'F': expected BOOL values as bytes 0 or 1 in raw_input_contents; got 255 at element 5 (index [1, 1])",
    ),
    # Already right, kept as they are: a V2 datatype that is not the input's, and none at all.
    "another V2 datatype": (with_datatype("FP64"), "input 'X': expected datatype FP32; got FP64"),
    "no datatype": (with_datatype(""), "input 'X': expected datatype FP32; got (none)"),
}


def _good(model: str) -> pb.ModelInferRequest:
    return {"half": half, "one": one, "flag": flag}[model]()


def _answer_of(model: str) -> np.ndarray:
    if model == "flag":
        return np.array([[1, 0, 1, 0]], np.float32)
    return np.full((1, 4), 3.5 if model == "half" else 2.0, np.float32)


async def test_each_malformed_request_is_refused_by_name_on_model_infer_and_its_neighbours_are_answered(
    serve, repository, caplog
):
    caplog.set_level(logging.WARNING, logger="wok")
    async with serve(repository=repository) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            for label, (bad, message) in CASES.items():
                model = bad.model_name
                # Sent at once with good requests to its model, which may share a batch with them.
                calls = [stub.ModelInfer(_good(model)) for _ in range(3)]
                calls[1:1] = [stub.ModelInfer(bad)]
                results = await asyncio.gather(*calls, return_exceptions=True)
                refused = results.pop(1)
                assert isinstance(refused, grpc.aio.AioRpcError), f"{label}: {refused}"
                assert (refused.code(), refused.details()) == (grpc.StatusCode.INVALID_ARGUMENT, message), label
                for r in results:
                    assert not isinstance(r, Exception), f"{label}: {r}"
                    np.testing.assert_array_equal(decode_response(r)["OUT"], _answer_of(model))
    # A malformed request is the client's: nothing for the server's log.
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


async def test_each_malformed_request_on_a_stream_gets_its_one_answer_by_name_and_the_stream_goes_on(serve, repository):
    sent = []
    for label, (bad, _) in CASES.items():
        good = _good(bad.model_name)
        good.id = f"good before {label}"
        bad.id = label
        sent += [good, bad]
    sent.append(one())
    sent[-1].id = "last"
    async with serve(repository=repository) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)

            async def requests():
                for req in sent:
                    yield req

            answers = [a async for a in stub.ModelStreamInfer(requests())]
    by_id = {a.infer_response.id: a for a in answers}
    assert len(answers) == len(sent) == len(by_id)
    for label, (_, message) in CASES.items():
        a = by_id[label]
        assert a.error_message == message, label
        assert a.infer_response.parameters["status_code"].int64_param == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    for req in sent:
        if req.id not in CASES:
            a = by_id[req.id]
            assert a.error_message == "", f"{req.id}: {a.error_message}"
            np.testing.assert_array_equal(decode_response(a.infer_response)["OUT"], _answer_of(req.model_name))


async def test_an_internal_error_of_1_mb_is_cut_alike_on_model_infer_and_on_a_stream_which_echoes_the_id_whole(
    serve, repository
):
    # A check that fails itself (not a refusal) ends INTERNAL with its error's text: the stream's
    # error_message held all 1 MB of it. The model name and id are echoed whole, as Triton does: a
    # client matches a stream's answers to its requests by id.
    bad = one_of(-20_000.0)
    bad.id = "i" * 5000
    async with serve(repository=repository) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.ModelInfer(bad)

            async def requests():
                yield bad

            answers = [a async for a in stub.ModelStreamInfer(requests())]
    message = "model 'one': its check (model:check) failed: RuntimeError: the check itself fails: " + "r" * 1_000_000
    cut = f"{message[:3996]}… ({len(message):,} characters in all)"
    assert (info.value.code(), info.value.details()) == (grpc.StatusCode.INTERNAL, cut)
    [a] = answers
    assert a.error_message == cut
    assert a.infer_response.parameters["status_code"].int64_param == grpc.StatusCode.INTERNAL.value[0]
    assert (a.infer_response.model_name, a.infer_response.id) == ("one", bad.id)


# A check's refusal, a check's own failure and a model's error, each with a name of undecodable bytes
# in its message (os.fsdecode's lone surrogate), by the value that makes it, and what its caller gets.
ESCAPED = "'caf\\udce9.bin'"
SURROGATE_CASES = {
    -555.0: (grpc.StatusCode.INVALID_ARGUMENT, f"model 'one' refused the request: input 'X': read from {ESCAPED}"),
    -556.0: (
        grpc.StatusCode.INTERNAL,
        f"model 'one': its check (model:check) failed: RuntimeError: cannot open {ESCAPED}",
    ),
    -777.0: (grpc.StatusCode.INTERNAL, f"model 'one' failed: ValueError: cannot open {ESCAPED}"),
}


# The server logs the model's failure, lone surrogate and all, into the test's captured log: under
# pytest-xdist it reaches the controller escaped (tests/conftest.py, pytest_report_to_serializable).
@pytest.mark.parametrize("call", ["unary", "stream"])
async def test_a_message_holding_a_lone_surrogate_is_answered_escaped(serve, repository, caplog, call):
    # Neither a status's details nor a protobuf string can carry a lone surrogate: the unary call's
    # abort raised UnicodeEncodeError (grpc.aio logged it) and its client waited out its deadline for
    # an answer never sent; on a stream the request's task died making its answer ("Task exception was
    # never retrieved"), and the stream owed it until the call's deadline. The timeouts only bound
    # that wait: each call is answered at once.
    async with serve(repository=repository) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            if call == "unary":
                results = await asyncio.gather(
                    *(stub.ModelInfer(one_of(v), timeout=10) for v in SURROGATE_CASES), return_exceptions=True
                )
                for value, got in zip(SURROGATE_CASES, results):
                    assert isinstance(got, grpc.aio.AioRpcError), f"{value}: {got}"
                    assert (got.code(), got.details()) == SURROGATE_CASES[value], value
            else:
                sent = []
                for value in SURROGATE_CASES:
                    sent.append(one_of(value))
                    sent[-1].id = str(value)
                sent.append(one())
                sent[-1].id = "good"

                async def requests():
                    for req in sent:
                        yield req

                stream = stub.ModelStreamInfer(requests(), timeout=10)
                answers = {a.infer_response.id: a async for a in stream}
                assert await stream.code() == grpc.StatusCode.OK
                assert sorted(answers) == sorted(req.id for req in sent)
                assert answers["good"].error_message == ""
                for value, (code, message) in SURROGATE_CASES.items():
                    a = answers[str(value)]
                    # A model's error, its batch shared with the good request, is found in parts: the
                    # message then says "(on this request alone)".
                    assert a.error_message.startswith(message), value
                    assert a.infer_response.parameters["status_code"].int64_param == code.value[0], value
        assert server.service.active == 0
        good = {"OK": 1} if call == "stream" else {}
        assert server.runtimes["one"].metrics.responses == {"INVALID_ARGUMENT": 1, "INTERNAL": 2, **good}
    failed = [r.getMessage() for r in caplog.records if "UnicodeEncodeError" in r.getMessage()]
    assert not failed
