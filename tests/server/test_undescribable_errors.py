"""A model's and its check's failures that the error path itself could not describe, on a real server:
an exception whose __str__ raises or returns what is not a str, one whose argument's repr raises, a
BaseException (KeyboardInterrupt, GeneratorExit, CancelledError, one of the user's own), a forward that
returns what is no tensor. Each request gets exactly one answer (INTERNAL naming the model, or a
check's refusal), counted once, its batch's other request its own answer, and the server serves on;
the admin event of such a batch names the error as the callers get it."""

from __future__ import annotations

import asyncio
from collections import Counter

import grpc
import numpy as np
import pytest

from wok.v2pb import grpc_service_pb2 as pb
from wok.v2pb import grpc_service_pb2_grpc as pb_grpc

# What a model's code can raise, by the value of the request that makes it: at +value in forward, at
# -value in the check.
MODEL_PY = """
import asyncio

from torch import nn


class StrRaises(Exception):
    def __str__(self):
        raise RuntimeError("__str__ itself failed")


class StrNotStr(Exception):
    def __str__(self):
        return 42


class Unprintable:
    def __repr__(self):
        raise RuntimeError("no repr")

    __str__ = __repr__


class Custom(BaseException):
    pass


class CustomStrRaises(BaseException):
    def __str__(self):
        raise RuntimeError("__str__ of a BaseException failed")


RAISED = {
    1: lambda: StrRaises("x"),
    2: lambda: StrNotStr("x"),
    3: lambda: ValueError(Unprintable()),
    4: lambda: CustomStrRaises(),
    5: lambda: KeyboardInterrupt(Unprintable()),
    6: lambda: GeneratorExit("from the check"),
    7: lambda: Custom("the user's own"),
    8: lambda: asyncio.CancelledError("from the check"),
    9: lambda: KeyboardInterrupt("ki"),
    10: lambda: SystemExit(3),
}
RETURNED = {20: lambda x: "a string", 21: lambda x: None, 22: lambda x: (x * 2).numpy()}


class Model(nn.Module):
    def forward(self, x):
        top = int(x.max())
        if top in RAISED:
            raise RAISED[top]()
        if top in RETURNED:
            return RETURNED[top](x)
        return x * 2


def build():
    return Model()


def check(inputs):
    bottom = int(inputs["X"].min())
    if -bottom in RAISED:
        raise RAISED[-bottom]()
"""


def _config(batching: str) -> str:
    return (
        'platform = "python"\nfactory = "model:build"\ncheck = "model:check"\nmax_batch_size = 2\n\n'
        '[[inputs]]\nname = "X"\ndatatype = "FP32"\ndims = [4]\n\n'
        '[[outputs]]\nname = "OUT"\ndatatype = "FP32"\ndims = [4]\n\n'
        f'[dynamic_batching]\n{batching}\n\n[instances]\ndevices = ["cpu"]\n'
    )


@pytest.fixture
def repository(tmp_path):
    # "pairs": each batch is two requests, flushed once both are queued (the delay only bounds a
    # test that fails), so that a failing request always shares its batch with a good one.
    root = tmp_path / "repo"
    for name, batching in (
        ("pairs", "preferred_batch_sizes = [2]\nmax_queue_delay_ms = 10000"),
        ("checked", "max_queue_delay_ms = 1"),
    ):
        (root / name).mkdir(parents=True)
        (root / name / "model.py").write_text(MODEL_PY)
        (root / name / "config.toml").write_text(_config(batching))
    return root


def request(model: str, value: float, request_id: str = "") -> pb.ModelInferRequest:
    req = pb.ModelInferRequest(model_name=model, id=request_id)
    req.inputs.add(name="X", datatype="FP32", shape=[1, 4])
    req.raw_input_contents.append(np.full((1, 4), value, np.float32).tobytes())
    return req


INTERNAL, INVALID = grpc.StatusCode.INTERNAL, grpc.StatusCode.INVALID_ARGUMENT
UNSHOWN = "(its message cannot be shown: str() raised"
# The model's error, at the value that makes it in forward: what its request's answer starts with. The
# model fails its batch; rerun in parts, its good neighbour is answered and it fails alone.
FORWARD = {
    1: f"model 'pairs' failed: StrRaises: {UNSHOWN} RuntimeError: __str__ itself failed) (on this request alone)",
    2: f"model 'pairs' failed: StrNotStr: {UNSHOWN} TypeError: __str__ returned non-string (type int)) (on this "
    "request alone)",
    3: f"model 'pairs' failed: ValueError: {UNSHOWN} RuntimeError: no repr) (on this request alone)",
    # A BaseException: rerun in parts as any error is (test_forward_base_exceptions.py).
    4: f"model 'pairs' failed: CustomStrRaises: {UNSHOWN} RuntimeError: __str__ of a BaseException failed) (on "
    "this request alone)",
    5: f"model 'pairs' failed: KeyboardInterrupt: {UNSHOWN} RuntimeError: no repr) (on this request alone)",
    20: "model 'pairs': expected a torch.Tensor, or a tuple, list or dict of them, as its result (1 output(s): "
    "OUT); got str (on this request alone)",
    21: "model 'pairs': expected a torch.Tensor, or a tuple, list or dict of them, as its result (1 output(s): "
    "OUT); got NoneType (on this request alone)",
    22: "model 'pairs': expected a torch.Tensor, or a tuple, list or dict of them, as its result (1 output(s): "
    "OUT); got ndarray (on this request alone)",
}
FAILED_CHECK = "model 'checked': its check (model:check) failed: "
# The check's error, at minus the value that makes it: the whole answer.
CHECK = {
    1: (INTERNAL, f"{FAILED_CHECK}StrRaises: {UNSHOWN} RuntimeError: __str__ itself failed)"),
    2: (INTERNAL, f"{FAILED_CHECK}StrNotStr: {UNSHOWN} TypeError: __str__ returned non-string (type int))"),
    # A ValueError is a refusal, whatever its message.
    3: (INVALID, f"model 'checked' refused the request: {UNSHOWN} RuntimeError: no repr)"),
    4: (INTERNAL, f"{FAILED_CHECK}CustomStrRaises: {UNSHOWN} RuntimeError: __str__ of a BaseException failed)"),
    6: (INTERNAL, f"{FAILED_CHECK}GeneratorExit: from the check"),
    7: (INTERNAL, f"{FAILED_CHECK}Custom: the user's own"),
    8: (INTERNAL, f"{FAILED_CHECK}CancelledError: from the check"),
}


async def _unary(stub, req: pb.ModelInferRequest) -> tuple[str, str]:
    """(code, message) of the one answer a unary call gets; the timeout only bounds a call never answered."""
    try:
        await stub.ModelInfer(req, timeout=10)
    except grpc.aio.AioRpcError as exc:
        return exc.code().name, exc.details()
    return "OK", ""


async def _stream(stub, reqs: list[pb.ModelInferRequest]) -> dict[str, list[tuple[str, str]]]:
    """Each request's answers on one stream, by id: (code, message) each."""

    async def sent():
        for req in reqs:
            yield req

    call = stub.ModelStreamInfer(sent(), timeout=10)
    answers: dict[str, list[tuple[str, str]]] = {req.id: [] for req in reqs}
    async for a in call:
        code = grpc.StatusCode.OK
        if a.error_message:
            number = a.infer_response.parameters["status_code"].int64_param
            code = next(c for c in grpc.StatusCode if c.value[0] == number)
        answers[a.infer_response.id].append((code.name, a.error_message))
    assert await call.code() == grpc.StatusCode.OK
    return answers


def _settled(server, model: str, answers: list[tuple[str, str]]) -> None:
    """Every request answered is counted once, under the code its client got, and nothing is left behind."""
    rt = server.runtimes[model]
    assert rt.metrics.responses == dict(Counter(code for code, _ in answers))
    assert server.service.active == 0
    assert (rt.batcher.queued, rt.batcher.inflight) == (0, 0)


@pytest.mark.parametrize("call", ["unary", "stream"])
async def test_a_model_error_that_cannot_be_described_is_answered_once_and_its_batch_neighbour_too(
    serve, repository, call
):
    # An error whose __str__ raised made the description raise in its place: the batch failed with that
    # error (its neighbour too, and the message named __str__'s RuntimeError, not the model's error); a
    # BaseException's ended the batcher's callback, and both requests went unanswered until their deadline.
    async with serve(models=(), repository=repository) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            got: dict[int, list[tuple[str, str]]] = {}
            neighbour: dict[int, list[tuple[str, str]]] = {}
            if call == "unary":
                for value in FORWARD:  # a pair at a time: one batch each
                    bad, good = await asyncio.gather(
                        _unary(stub, request("pairs", value)), _unary(stub, request("pairs", 0.5))
                    )
                    got[value], neighbour[value] = [bad], [good]
            else:
                reqs = []
                for value in FORWARD:  # read in order, batched in pairs
                    reqs += [request("pairs", value, f"bad {value}"), request("pairs", 0.5, f"good {value}")]
                answers = await _stream(stub, reqs)
                got = {value: answers[f"bad {value}"] for value in FORWARD}
                neighbour = {value: answers[f"good {value}"] for value in FORWARD}
            for value, message in FORWARD.items():
                [(code, details)] = got[value]
                assert (code, details) == ("INTERNAL", message), value
                assert neighbour[value] == [("OK", "")], value
            after = [_unary(stub, request("pairs", 0.5)) for _ in range(2)]  # a batch of its own
            assert await asyncio.gather(*after) == [("OK", "")] * 2
            every = [a for answers in (*got.values(), *neighbour.values()) for a in answers]
            _settled(server, "pairs", every + [("OK", "")] * 2)


@pytest.mark.parametrize("call", ["unary", "stream"])
async def test_a_check_error_that_cannot_be_described_or_is_a_base_exception_is_answered_once(serve, repository, call):
    # A check's error whose __str__ raised was reported as wok's own ("internal error: RuntimeError:
    # __str__ itself failed", logged as a bug in ModelInfer), naming neither the model nor its check; a
    # GeneratorExit, CancelledError or the user's own BaseException ended the call's handler unanswered
    # (the unary call waited out its deadline; a stream owed the request until the call's deadline).
    async with serve(models=(), repository=repository) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            if call == "unary":
                results = await asyncio.gather(
                    *(_unary(stub, request("checked", -value)) for value in CHECK),
                    _unary(stub, request("checked", 0.5)),
                )
                got = dict(zip(CHECK, ([r] for r in results)))
                good = [results[-1]]
            else:
                reqs = [request("checked", -value, str(value)) for value in CHECK]
                reqs.append(request("checked", 0.5, "good"))
                answers = await _stream(stub, reqs)
                got = {value: answers[str(value)] for value in CHECK}
                good = answers["good"]
            assert {value: got[value] for value in CHECK} == {
                value: [(code.name, message)] for value, (code, message) in CHECK.items()
            }
            assert good == [("OK", "")]
            assert await _unary(stub, request("checked", 0.5)) == ("OK", "")
            _settled(server, "checked", [a for answers in got.values() for a in answers] + good + [("OK", "")])


@pytest.mark.parametrize("call", ["unary", "stream"])
async def test_a_check_raising_keyboard_interrupt_or_system_exit_fails_its_request_not_the_server(
    serve, repository, call
):
    # The check runs on the event loop: a KeyboardInterrupt it raised ended the loop, and the server with
    # it (as a sys.exit() would, which the check's failure already caught). `wok serve` takes its signals
    # through the loop, so no Ctrl-C is ever a KeyboardInterrupt in a check.
    cases = {
        5: ("INTERNAL", f"{FAILED_CHECK}KeyboardInterrupt: {UNSHOWN} RuntimeError: no repr)"),
        9: ("INTERNAL", f"{FAILED_CHECK}KeyboardInterrupt: ki"),
        10: ("INTERNAL", f"{FAILED_CHECK}SystemExit: 3"),
    }
    async with serve(models=(), repository=repository) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            if call == "unary":
                got = {value: [await _unary(stub, request("checked", -value))] for value in cases}
            else:
                answers = await _stream(stub, [request("checked", -value, str(value)) for value in cases])
                got = {value: answers[str(value)] for value in cases}
            assert got == {value: [answer] for value, answer in cases.items()}
            assert await _unary(stub, request("checked", 0.5)) == ("OK", "")
            _settled(server, "checked", [a for answers in got.values() for a in answers] + [("OK", "")])


async def test_the_admin_event_of_a_batch_whose_error_cannot_be_described_says_so(serve, repository):
    # The /events stream's batch event read the batch's error with str(): for a BaseException whose
    # __str__ raised, the event's callback raised on the loop instead, and subscribers got no event.
    loop = asyncio.get_running_loop()
    handler = loop.get_exception_handler()
    async with serve(models=(), repository=repository, admin=True) as server:
        admin = server.http.admin
        sub = admin.subscribe()
        # A callback that raises on the loop: its report goes to the subscriber, where the test reads it.
        loop.set_exception_handler(lambda _loop, ctx: sub.put({"type": "loop-error", "message": ctx["message"]}))
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
                stub = pb_grpc.GRPCInferenceServiceStub(channel)
                await asyncio.gather(_unary(stub, request("pairs", 4)), _unary(stub, request("pairs", 0.5)))
            while (event := await asyncio.wait_for(sub.queue.get(), 10))["type"] not in ("batch", "loop-error"):
                pass
        finally:
            loop.set_exception_handler(handler)
            admin.unsubscribe(sub)
    # Rerun in parts (its good request answered: ok), its error the instance's, naming the model's.
    assert {k: event.get(k) for k in ("type", "ok", "failed", "error")} == {
        "type": "batch",
        "ok": True,
        "failed": 1,
        "error": f"model 'pairs' failed: CustomStrRaises: {UNSHOWN} RuntimeError: __str__ of a BaseException failed)",
    }
