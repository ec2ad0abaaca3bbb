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

from .conftest import each_fails_alone, four_wide_config, until
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
    assert not failures.window_ends  # the stop left nothing on the loop
    assert server.metrics.models["listed"].responses == {"INTERNAL": 28}


# A BaseException out of the batcher's own work on a request: the key's hash, by INPUT0's value.
RAISED = {
    5: KeyboardInterrupt("ki"),
    6: GeneratorExit("from the hash"),
    8: asyncio.CancelledError("from the hash"),
    10: SystemExit(3),
}


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
    # with it); a KeyboardInterrupt or SystemExit left the handler's task and ended the server's loop. A
    # CancelledError, taken for the call's cancellation, still left its request unanswered until its deadline.
    s = RaisingHash(four_wide_config("hashed"), nn.Identity())
    async with served(s) as (server, stub):
        with caplog.at_level(logging.WARNING):
            await each_fails_alone(stub, call, lambda value, i: request(value, i, "hashed"), RAISED)
            out = np.frombuffer((await stub.ModelInfer(request(2.0, model="hashed"))).raw_output_contents[0], "<f4")
            np.testing.assert_array_equal(out, np.full(4, 2.0, np.float32))
            lines = error_lines(caplog)
    assert len(lines) == 1 and isinstance(lines[0].exc_info[1], KeyboardInterrupt)
    # The rest counted as what the hash raised, told at the stop.
    assert error_lines(caplog)[-1].getMessage() == (
        "requests for model 'hashed' failed 3 more times since the last logged "
        "(GeneratorExit: 1, CancelledError: 1, SystemExit: 1), as the server stops"
    )
    assert server.metrics.models["hashed"].responses == {"INTERNAL": len(RAISED), "OK": len(RAISED) + 1}


class _TimeLeft:
    """A unary call's context with its deadline far off; its abort reached only by the bug tested."""

    def time_remaining(self) -> float:
        return 10.0

    async def abort(self, code, details):  # pragma: no cover - reached only by the bug tested
        raise AssertionError(f"a closed handler answered {code.name}: {details}")


async def test_a_handler_closed_as_it_waits_for_its_batch_lets_the_close_through_unlogged(caplog):
    # Its coroutine closed (its task destroyed pending, as a loop closed by hand does): the handler's `except
    # BaseException` took the GeneratorExit for a bug, logged an ERROR and awaited its abort, and the close failed,
    # "coroutine ignored GeneratorExit".
    s = Servable(four_wide_config("closed"), nn.Identity())
    async with served(s) as (server, _stub):

        async def close_as_it_waits() -> None:
            handler = server.service.ModelInfer(request(1.0, model="closed"), _TimeLeft())
            assert isinstance(handler.send(None), asyncio.Future)  # run to its wait for the batch's answer
            handler.close()

        with caplog.at_level(logging.WARNING):
            await asyncio.get_running_loop().create_task(close_as_it_waits())
        assert error_lines(caplog) == []
        assert server.service.active == 0
        # Counted as a call ended from outside, as a cancelled one: it counted INTERNAL and a failed request.
        rt = server.runtime("closed")
        assert rt.metrics.responses == {"CANCELLED": 1}
        assert rt.stats.fail.count == 0


async def test_a_handlers_failure_line_shows_the_clients_model_name_escaped_and_cut(caplog, monkeypatch):
    # The line named the model as the client sent it, in plain quotes: a name no model has, with a newline and a
    # terminal's escape, forged a line of the server's log, and one of 100 KB made a 100 KB line. Shown as every name
    # a request sent is (errors.quoted_name). A bug of wok's own for such a name is made here: no model's code runs
    # before the name is looked up.
    s = Servable(four_wide_config("plain"), nn.Identity())
    async with served(s) as (server, stub):
        runtime = server.runtime

        def buggy(name: str, version: str = ""):
            if name.startswith("evil"):
                raise TypeError("a bug in the lookup")
            return runtime(name, version)

        monkeypatch.setattr(server, "runtime", buggy)
        names = ["evil\n\x1b[31mname", "evil" + "x" * 100_000]
        with caplog.at_level(logging.WARNING):
            for name in names:
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await stub.ModelInfer(request(1.0, model=name), timeout=10)
                assert (info.value.code(), info.value.details()) == (
                    grpc.StatusCode.INTERNAL,
                    "internal error: TypeError: a bug in the lookup",
                )
                server.service.failure_log(name).throttle.every_s = 0.0  # each failure its own line
    assert [r.getMessage() for r in error_lines(caplog)] == [
        "ModelInfer for model 'evil\\n\\x1b[31mname' failed",
        f"ModelInfer for model 'evil{'x' * 196}'… (100,004 characters in all) failed",
    ]


async def test_a_handler_closed_as_it_waits_for_its_batch_withdraws_its_request():
    # Its CancelledError branch withdrew the request; a close (GeneratorExit) left it queued, and its batch ran for
    # nobody, with the next request's samples: the model's time spent, and ModelStatistics counted a sample no one got.
    s = Servable(four_wide_config("closed", dynamic_batching={"max_queue_delay_ms": 50.0}), nn.Identity())
    async with served(s) as (server, stub):
        rt = server.runtime("closed")

        async def close_as_it_waits() -> None:
            handler = server.service.ModelInfer(request(1.0, model="closed"), _TimeLeft())
            assert isinstance(handler.send(None), asyncio.Future)  # run to its wait for the batch's answer
            assert rt.batcher.queued == 1
            handler.close()

        await asyncio.get_running_loop().create_task(close_as_it_waits())
        assert (rt.batcher.queued, rt.batcher.inflight) == (0, 0)
        # The next request's batch is its own alone (the closed one, queued first, ran in or before it).
        out = await stub.ModelInfer(request(2.0, model="closed"), timeout=10)
        np.testing.assert_array_equal(np.frombuffer(out.raw_output_contents[0], "<f4"), np.full(4, 2.0, np.float32))
        assert (rt.stats.inference_count, rt.stats.execution_count) == (1, 1)
        assert rt.metrics.responses == {"CANCELLED": 1, "OK": 1}
