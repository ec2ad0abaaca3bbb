"""A request that an unexpected error (no WokError: a bug, wok's or what a model's code hands it) ends in its handler,
on a real server: its client gets INTERNAL in to_status's words, as before; the server's log gets, by model, the
first traceback at once, then one line a window counting the rest (service.InferenceService.failure_log), not a
traceback per request. A BaseException (KeyboardInterrupt, SystemExit, GeneratorExit) ends that request alone."""

from __future__ import annotations

import asyncio
import logging

import grpc
import numpy as np
import pytest
from torch import nn

from wok.servable import Servable

from .conftest import four_wide_config, until
from .test_check_failure_log import request, served

UNHASHABLE = "internal error: TypeError: unhashable type: 'list'"


class ListKey(Servable):
    """Its batch_key returns a list, which no batcher queue is keyed by: the batcher's own TypeError as it queues the
    request, on every request, past any hook of the model's (the handler's to log)."""

    def batch_key(self, inputs):
        return [inputs["INPUT0"].shape[0]]


def error_lines(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_a_handlers_unexpected_errors_are_logged_once_a_window_by_model_with_a_count_of_the_rest(caplog):
    s = ListKey(four_wide_config("listed"), nn.Identity())
    async with served(s) as (server, stub):
        failures = server.service.failure_log("listed")
        now = [0.0]
        failures.throttle.clock = lambda: now[0]
        failures.throttle.every_s = 0.2  # the loop's timer waits this long, and finds the window over by the test's
        with caplog.at_level(logging.WARNING):
            answers = [
                a async for a in stub.ModelStreamInfer(iter([request(1.0, f"s{i}", "listed") for i in range(5)]))
            ]
            results = await asyncio.gather(
                *(stub.ModelInfer(request(1.0, model="listed")) for _ in range(20)), return_exceptions=True
            )
            assert len(error_lines(caplog)) == 1  # a traceback a request before
            now[0] += 0.2
            await until(lambda: len(error_lines(caplog)) == 2)  # told at the window's end: none failed after
            now[0] += 0.2  # the window the told line began is over: the next failure's line is due
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.ModelInfer(request(1.0, model="listed"))
            failures.throttle.every_s = 600.0
            for _ in range(2):
                with pytest.raises(grpc.aio.AioRpcError):
                    await stub.ModelInfer(request(1.0, model="listed"))
            assert len(error_lines(caplog)) == 3
    # The client's answer as before: INTERNAL, the TypeError named.
    assert (info.value.code(), info.value.details()) == (grpc.StatusCode.INTERNAL, UNHASHABLE)
    for r in results:
        assert isinstance(r, grpc.aio.AioRpcError), r
        assert (r.code(), r.details()) == (grpc.StatusCode.INTERNAL, UNHASHABLE)
    assert sorted(a.infer_response.id for a in answers) == [f"s{i}" for i in range(5)]
    assert {a.error_message for a in answers} == {UNHASHABLE}
    lines = error_lines(caplog)
    assert [r.getMessage() for r in lines] == [
        "ModelStreamInfer request for model 'listed' failed",
        "requests for model 'listed' failed 24 more times since the last logged (TypeError: 24)",
        "ModelInfer for model 'listed' failed",
        "requests for model 'listed' failed 2 more times since the last logged (TypeError: 2), as the server stops",
    ]
    assert [type(r.exc_info[1]) if r.exc_info else None for r in lines] == [TypeError, None, TypeError, None]
    assert failures.throttle.window_end is None  # the stop left nothing on the loop
    assert server.metrics.models["listed"].responses == {"INTERNAL": 28}


# A BaseException out of the batcher's own work on a request: the key's hash, by INPUT0's value.
RAISED = {5: KeyboardInterrupt("ki"), 6: GeneratorExit("from the hash"), 10: SystemExit(3)}


class RaisingKey:
    def __init__(self, value: int) -> None:
        self.value = value

    def __hash__(self) -> int:
        exc = RAISED[self.value]
        raise type(exc)(*exc.args)  # a new one each time: the module's, raised, would keep each raise's frames


class RaisingHash(Servable):
    def batch_key(self, inputs):
        value = int(inputs["INPUT0"].flat[0])
        return RaisingKey(value) if value in RAISED else super().batch_key(inputs)


@pytest.mark.parametrize("call", ["unary", "stream"])
async def test_a_base_exception_in_a_handler_fails_its_request_alone(call, caplog):
    # The handlers caught only Exception: a GeneratorExit left its request unanswered (a stream's, and the stream
    # with it); a KeyboardInterrupt or SystemExit left the handler's task and ended the server's loop.
    s = RaisingHash(four_wide_config("hashed"), nn.Identity())
    want = {v: ("INTERNAL", f"internal error: {type(e).__name__}: {e}") for v, e in RAISED.items()}
    async with served(s) as (server, stub):
        with caplog.at_level(logging.WARNING):
            got: dict[int, tuple[str, str]] = {}
            good: list[tuple[str, str]] = []
            if call == "unary":
                for v in RAISED:
                    for value in (v, 0.5):
                        try:
                            await stub.ModelInfer(request(value, model="hashed"), timeout=10)
                            answer = ("OK", "")
                        except grpc.aio.AioRpcError as exc:
                            answer = (exc.code().name, exc.details())
                        if value == 0.5:
                            good.append(answer)
                        else:
                            got[v] = answer
            else:
                reqs = [request(value, f"{v} {value}", "hashed") for v in RAISED for value in (v, 0.5)]
                stream = stub.ModelStreamInfer(iter(reqs), timeout=10)
                async for a in stream:
                    number = a.infer_response.parameters["status_code"].int64_param if a.error_message else 0
                    code = next(c for c in grpc.StatusCode if c.value[0] == number)
                    v, value = a.infer_response.id.split()
                    if value == "0.5":
                        good.append((code.name, a.error_message))
                    else:
                        got[int(v)] = (code.name, a.error_message)
                assert await stream.code() == grpc.StatusCode.OK
            assert got == want
            assert good == [("OK", "")] * len(RAISED)
            out = np.frombuffer((await stub.ModelInfer(request(2.0, model="hashed"))).raw_output_contents[0], "<f4")
            np.testing.assert_array_equal(out, np.full(4, 2.0, np.float32))
            lines = error_lines(caplog)
    assert len(lines) == 1 and isinstance(lines[0].exc_info[1], KeyboardInterrupt)
    assert server.metrics.models["hashed"].responses == {"INTERNAL": len(RAISED), "OK": len(RAISED) + 1}
