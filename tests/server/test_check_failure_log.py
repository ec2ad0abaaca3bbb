"""A model's check that fails itself (raises what is no refusal) on every request: each caller gets the answer
to_status gives that exception, and the server's log gets one line with the traceback per window, with a count of
the rest (servable.CheckFailureLog), for a Servable's own check as for a config's `check` (server/servable.py)."""

from __future__ import annotations

import asyncio
import logging
import threading
from contextlib import asynccontextmanager

import grpc
import numpy as np
import pytest
from torch import nn

from wok.codec import decode_response, encode_request
from wok.errors import CheckFailed, InvalidInput, ModelExecutionError
from wok.repository import load_servable
from wok.servable import Servable
from wok.v2pb import grpc_service_pb2 as pb
from wok.v2pb import grpc_service_pb2_grpc as pb_grpc

from .conftest import each_fails_alone, four_wide_config, until
from .test_repository_check import CHECKED_MODEL, checked_model

BAD = 1e7  # a value BuggyCheck's check fails on
DETAILS = "internal error: ValueError: a bug in the check over 1e6"


class BuggyCheck(Servable):
    """A servable whose own check refuses a negative value (wok's InvalidInput, the client's fault) and has a bug
    on a value over 1e6: a plain ValueError, which a Servable's check does not raise to refuse (INTERNAL)."""

    def check(self, inputs):
        x = inputs["INPUT0"]
        if (x < 0).any():
            raise InvalidInput("input 'INPUT0': values must be >= 0")
        if (x > 1e6).any():
            raise ValueError("a bug in the check over 1e6")


@asynccontextmanager
async def served(servable: Servable):
    from wok.app import WokServer
    from wok.config import server_settings
    from wok.repository import ModelRepository

    server = WokServer(server_settings(grpc_port=0, metrics_port=None), ModelRepository([servable], "test"))
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            yield server, pb_grpc.GRPCInferenceServiceStub(ch)
    finally:
        await server.stop(grace=5.0)


def request(value: float, request_id: str = "", model: str = "own") -> pb.ModelInferRequest:
    req = encode_request(model, {"INPUT0": np.full((1, 4), value, np.float32)})
    req.id = request_id
    return req


def check_lines(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= logging.WARNING]


async def test_a_servables_own_check_that_fails_is_logged_once_a_window_with_a_count_of_the_rest(caplog):
    s = BuggyCheck(four_wide_config("own"), nn.Identity())
    now = [0.0]
    s.check_failures.throttle.clock = lambda: now[0]  # the window moves only when the test moves it
    what = f"{BuggyCheck.__module__}:{BuggyCheck.__qualname__}.check"
    async with served(s) as (server, stub):
        with caplog.at_level(logging.WARNING):
            results = await asyncio.gather(*(stub.ModelInfer(request(BAD)) for _ in range(20)), return_exceptions=True)
            # The same on a stream: each request its error answer, none of them a traceback in the log.
            answers = [a async for a in stub.ModelStreamInfer(iter([request(BAD, f"s{i}") for i in range(5)]))]
            # The client's answer: errors.to_status of the check's ValueError, INTERNAL in its words.
            for r in results:
                assert isinstance(r, grpc.aio.AioRpcError), r
                assert (r.code(), r.details()) == (grpc.StatusCode.INTERNAL, DETAILS)
            assert sorted(a.infer_response.id for a in answers) == [f"s{i}" for i in range(5)]
            for a in answers:
                assert a.error_message == DETAILS
                assert a.infer_response.parameters["status_code"].int64_param == grpc.StatusCode.INTERNAL.value[0]
            # One line with the traceback; the handler logged one per request (25, "ModelInfer for model 'own' failed").
            lines = check_lines(caplog)
            assert len(lines) == 1, [r.getMessage() for r in lines]
            first = lines[0]
            assert first.getMessage() == f"model 'own': its check ({what}) failed"
            assert isinstance(first.exc_info[1], ValueError)
            assert str(first.exc_info[1]) == "a bug in the check over 1e6"
            # The check's refusal is the client's, never logged; a good request is answered.
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.ModelInfer(request(-1.0))
            assert (info.value.code(), info.value.details()) == (
                grpc.StatusCode.INVALID_ARGUMENT,
                "input 'INPUT0': values must be >= 0",
            )
            out = decode_response(await stub.ModelInfer(request(2.0)))
            np.testing.assert_array_equal(out["OUTPUT0"], np.full((1, 4), 2.0, np.float32))
            assert len(check_lines(caplog)) == 1
            # A window later, the next failure is logged, with the count of those held since the last line.
            now[0] += s.check_failures.throttle.every_s
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.ModelInfer(request(BAD))
            assert (info.value.code(), info.value.details()) == (grpc.StatusCode.INTERNAL, DETAILS)
            second = check_lines(caplog)[1:]
            assert [r.getMessage() for r in second] == [
                f"model 'own': its check ({what}) failed (24 more failures of its check since the last logged)"
            ]
            assert isinstance(second[0].exc_info[1], ValueError)
            stats = (await stub.ModelStatistics(pb.ModelStatisticsRequest(name="own"))).model_stats[0]
    # Counted as a client sees it: each failure an INTERNAL answer and a fail, none of them refused as invalid.
    m = server.metrics.models["own"]
    assert (m.rejections["invalid"], m.responses["INTERNAL"], m.responses["INVALID_ARGUMENT"]) == (1, 26, 1)
    assert (stats.inference_stats.fail.count, stats.inference_stats.success.count) == (20 + 5 + 1 + 1, 1)


def test_a_servable_without_its_own_check_keeps_the_no_op_and_logs_nothing():
    s = Servable(four_wide_config("plain"), nn.Identity())
    assert s.check.__func__ is Servable.check
    assert s.check_failures is None


def test_a_config_checks_failures_held_in_a_window_are_counted_in_the_next_line(tmp_path, caplog):
    s = load_servable(checked_model(tmp_path))
    now = [0.0]
    s.check_failures.throttle.clock = lambda: now[0]
    bug = {"INPUT0": np.full((1, 4), 1e7, np.float32)}  # model:check's KeyError
    with caplog.at_level(logging.WARNING, logger="wok"):
        for _ in range(3):
            with pytest.raises(ModelExecutionError):
                s.check(bug)
        now[0] += 9.9  # still within the window
        with pytest.raises(ModelExecutionError):
            s.check(bug)
        now[0] += 0.1
        with pytest.raises(ModelExecutionError) as info:
            s.check(bug)
    # The answer as before: the check named, its error's line.
    assert str(info.value) == "model 'chk': its check (model:check) failed: KeyError: 'a bug in the check'"
    assert [r.getMessage() for r in caplog.records] == [
        "model 'chk': its check (model:check) failed",
        "model 'chk': its check (model:check) failed (3 more failures of its check since the last logged)",
    ]
    assert all(isinstance(r.exc_info[1], KeyError) for r in caplog.records)


async def test_a_burst_of_check_failures_that_stops_is_told_at_its_windows_end_and_the_rest_at_the_stop(caplog):
    # The check's throttle was not armed on the loop: a burst that stopped was told only with the next failure.
    s = BuggyCheck(four_wide_config("own"), nn.Identity())
    now = [0.0]
    throttle = s.check_failures.throttle
    throttle.clock = lambda: now[0]
    throttle.every_s = 0.2  # the timer waits this long on the loop's clock, and finds the window over by the test's
    what = f"{BuggyCheck.__module__}:{BuggyCheck.__qualname__}.check"
    async with served(s) as (_, stub):
        with caplog.at_level(logging.WARNING):
            await asyncio.gather(*(stub.ModelInfer(request(BAD)) for _ in range(5)), return_exceptions=True)
            assert len(check_lines(caplog)) == 1
            now[0] += 0.2
            await until(lambda: len(check_lines(caplog)) == 2)
            throttle.every_s = 600.0  # the window the told line began: what it holds is told by the stop
            for _ in range(2):
                with pytest.raises(grpc.aio.AioRpcError):
                    await stub.ModelInfer(request(BAD))
            assert len(check_lines(caplog)) == 2
    first, held, stopped = check_lines(caplog)
    assert first.getMessage() == f"model 'own': its check ({what}) failed" and isinstance(first.exc_info[1], ValueError)
    assert (held.getMessage(), held.exc_info) == (
        f"model 'own': its check ({what}) failed 4 more times since the last logged (ValueError: 4)",
        None,
    )
    assert stopped.getMessage() == (
        f"model 'own': its check ({what}) failed 2 more times since the last logged (ValueError: 2), "
        "as the server stops"
    )
    assert not s.check_failures.window_ends  # nothing left on the loop


class BuggyKey(Servable):
    """A servable whose own batch_key has a bug on a value over 1e6 (a ValueError); other requests get the default."""

    def batch_key(self, inputs):
        if (inputs["INPUT0"] > 1e6).any():
            raise ValueError("a bug in the batch key over 1e6")
        return super().batch_key(inputs)


async def test_a_servables_batch_key_that_fails_is_logged_once_a_window_not_per_request(caplog):
    s = BuggyKey(four_wide_config("keyed"), nn.Identity())
    what = f"{BuggyKey.__module__}:{BuggyKey.__qualname__}.batch_key"
    details = "internal error: ValueError: a bug in the batch key over 1e6"
    async with served(s) as (server, stub):
        with caplog.at_level(logging.WARNING):
            results = await asyncio.gather(
                *(stub.ModelInfer(request(BAD, model="keyed")) for _ in range(20)), return_exceptions=True
            )
            reqs = [request(BAD, f"s{i}", "keyed") for i in range(5)]
            answers = [a async for a in stub.ModelStreamInfer(iter(reqs))]
            out = decode_response(await stub.ModelInfer(request(2.0, model="keyed")))
    for r in results:
        assert isinstance(r, grpc.aio.AioRpcError), r
        assert (r.code(), r.details()) == (grpc.StatusCode.INTERNAL, details)
    assert sorted(a.infer_response.id for a in answers) == [f"s{i}" for i in range(5)]
    for a in answers:
        assert a.error_message == details
        assert a.infer_response.parameters["status_code"].int64_param == grpc.StatusCode.INTERNAL.value[0]
    np.testing.assert_array_equal(out["OUTPUT0"], np.full((1, 4), 2.0, np.float32))
    # One line with its traceback, no handler's line: it logged "ModelInfer for model 'keyed' failed" 25 times.
    lines = check_lines(caplog)
    assert [r.getMessage() for r in lines] == [
        f"model 'keyed': its batch_key ({what}) failed",
        f"model 'keyed': its batch_key ({what}) failed 24 more times since the last logged (ValueError: 24), "
        "as the server stops",
    ]
    assert isinstance(lines[0].exc_info[1], ValueError) and lines[1].exc_info is None
    assert server.metrics.models["keyed"].responses == {"INTERNAL": 25, "OK": 1}


def _hook_failing(hook: str) -> tuple[Servable, object, str]:
    """(servable, its log of `hook`'s failures, the line that log begins each window with)."""
    if hook == "check":
        s = BuggyCheck(four_wide_config("own"), nn.Identity())
        return s, s.check_failures, f"model 'own': its check ({BuggyCheck.__module__}:BuggyCheck.check) failed"
    s = BuggyKey(four_wide_config("own"), nn.Identity())
    return s, s.batch_key_failures, f"model 'own': its batch_key ({BuggyKey.__module__}:BuggyKey.batch_key) failed"


async def _burst(stub, n: int) -> None:
    results = await asyncio.gather(*(stub.ModelInfer(request(BAD)) for _ in range(n)), return_exceptions=True)
    assert [r.code() for r in results] == [grpc.StatusCode.INTERNAL] * n, results


@pytest.mark.parametrize("hook", ["check", "batch_key"])
async def test_a_servable_served_again_by_a_second_server_is_rate_limited_as_by_the_first(hook, caplog):
    # The first server's stop closed the servable's log for good: the second server's burst was logged a traceback
    # per failure. Each server opens it at its start.
    s, failures, line = _hook_failing(hook)
    now = [0.0]
    failures.throttle.clock = lambda: now[0]  # the window moves only when the test moves it
    with caplog.at_level(logging.WARNING):
        for server_no in range(2):
            caplog.clear()
            async with served(s) as (_, stub):
                await _burst(stub, 10)
                assert len(check_lines(caplog)) == 1, (server_no, [r.getMessage() for r in check_lines(caplog)])
            now[0] += failures.throttle.every_s  # the second server's first failure is due at once, as the first's
            first, stopped = check_lines(caplog)
            assert (first.getMessage(), type(first.exc_info[1])) == (line, ValueError), server_no
            assert stopped.getMessage() == (
                f"{line} 9 more times since the last logged (ValueError: 9), as the server stops"
            ), server_no
            assert not failures.window_ends  # nothing left on the stopped server's loop


async def test_a_servable_two_servers_serve_stays_rate_limited_on_the_one_left_when_the_other_stops(caplog):
    # The stop of one of two servers serving the servable at once closed its log under the other's feet.
    s, failures, line = _hook_failing("check")
    now = [0.0]
    failures.throttle.clock = lambda: now[0]
    with caplog.at_level(logging.WARNING):
        async with served(s) as (_, second):
            async with served(s) as (_, first):
                await _burst(first, 3)
                await _burst(second, 2)
            # What the window held is the servable's, of both servers' requests: the first's stop said it was held
            # "as the server stops", as though all of it were the stopping server's.
            assert [r.getMessage() for r in check_lines(caplog)] == [
                line,
                f"{line} 4 more times since the last logged (ValueError: 4), as one of the 2 servers serving it "
                "stops (counted in all of them)",
            ]
            now[0] += failures.throttle.every_s
            caplog.clear()
            await _burst(second, 10)
            assert [r.getMessage() for r in check_lines(caplog)] == [line]
        assert [r.getMessage() for r in check_lines(caplog)] == [
            line,
            f"{line} 9 more times since the last logged (ValueError: 9), as the server stops",
        ]
    # Closed by the last server's stop: a failure now (no server's loop to tell a window's count on) at once.
    for _ in range(2):
        with pytest.raises(CheckFailed):
            s.check({"INPUT0": np.full((1, 4), BAD, np.float32)})
    assert len(check_lines(caplog)) == 4


class _InterruptsTheStopsLine(logging.Handler):
    """Raises a KeyboardInterrupt (a Ctrl-C under a plain run_until_complete) once, as a stop tells what a log held."""

    def __init__(self) -> None:
        super().__init__()
        self.fired = False

    def emit(self, record: logging.LogRecord) -> None:
        if not self.fired and record.getMessage().endswith(("as the server stops", "(counted in all of them)")):
            self.fired = True
            raise KeyboardInterrupt


@pytest.mark.parametrize("servers", [1, 2])
def test_a_stop_interrupted_as_it_tells_a_logs_held_failures_is_finished_closing_each_log_once(servers, caplog):
    # The next stop finishes a stop left partway (a KeyboardInterrupt in a step): it ran the logs' close again,
    # closing the log already closed a second time, which raised RuntimeError (the stop failed, the batch_key's log
    # left open) or, with a second server still serving the servable, took that server's count: it logged each
    # failure at once.
    from wok.app import WokServer
    from wok.config import server_settings
    from wok.repository import ModelRepository

    s, failures, line = _hook_failing("check")
    now = [0.0]
    failures.throttle.clock = lambda: now[0]
    loop = asyncio.new_event_loop()
    interrupts = _InterruptsTheStopsLine()
    started = []

    async def start() -> WokServer:
        server = WokServer(server_settings(grpc_port=0, metrics_port=None), ModelRepository([s], "test"))
        await server.start()
        started.append(server)
        return server

    async def burst(server: WokServer, n: int) -> None:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            await _burst(pb_grpc.GRPCInferenceServiceStub(ch), n)

    try:
        with caplog.at_level(logging.WARNING):
            other = loop.run_until_complete(start()) if servers == 2 else None
            server = loop.run_until_complete(start())
            loop.run_until_complete(burst(server, 3))
            logging.getLogger("wok").addHandler(interrupts)
            with pytest.raises(KeyboardInterrupt):
                loop.run_until_complete(server.stop(grace=5.0))
            assert interrupts.fired
            loop.run_until_complete(server.stop(grace=5.0))  # raised RuntimeError: the check's log closed twice
            # The first line only: the one the interrupt cut never reached the root logger.
            assert [r.getMessage() for r in check_lines(caplog)] == [line]
            if other is not None:  # still rate-limited: the window's failures held, none logged
                loop.run_until_complete(burst(other, 3))
                assert [r.getMessage() for r in check_lines(caplog)] == [line]
                loop.run_until_complete(other.stop(grace=5.0))
                assert [r.getMessage() for r in check_lines(caplog)] == [
                    line,
                    f"{line} 3 more times since the last logged (ValueError: 3), as the server stops",
                ]
            caplog.clear()
            # Every log closed by its last server: a failure now is logged at once, each with its traceback.
            for _ in range(2):
                with pytest.raises(CheckFailed):
                    s.check({"INPUT0": np.full((1, 4), BAD, np.float32)})
                s.batch_key_failed(ValueError("a bug in the batch key"))
            lines = check_lines(caplog)
            assert [r.getMessage().split(" (")[0] for r in lines] == [
                "model 'own': its check",
                "model 'own': its batch_key",
            ] * 2
            assert all(isinstance(r.exc_info[1], ValueError) for r in lines)
    finally:
        logging.getLogger("wok").removeHandler(interrupts)
        for server in started:
            loop.run_until_complete(server.stop(grace=5.0))
        loop.close()


class _ThreadCheckedLoop(asyncio.SelectorEventLoop):
    """asyncio's loop in debug mode, which refuses a callback scheduled from a thread other than its own (call_soon,
    call_later: the error its callback or caller raised is recorded in `errors`) but lets a timer be cancelled from
    one: counted here (`foreign_cancels`). Under uvloop such a cancel stops a libuv timer off its loop's thread."""

    def __init__(self) -> None:
        super().__init__()
        self.set_debug(True)
        self.slow_callback_duration = 600.0  # debug mode's "took 0.1 s" warnings are the host's, not checked here
        self.foreign_cancels = 0
        self.errors: list[str] = []
        self.set_exception_handler(
            lambda _, context: self.errors.append(f"{context['message']}: {context['exception']!r}")
        )

    def _timer_handle_cancelled(self, handle: asyncio.TimerHandle) -> None:
        if self._thread_id not in (None, threading.get_ident()):
            self.foreign_cancels += 1
        super()._timer_handle_cancelled(handle)


class _ServedOnItsOwnThread:
    """A WokServer serving `servable`, on a _ThreadCheckedLoop run by a thread of its own (as a program may run two
    servers in one process); `fail(n)` sends it n requests its check fails, from the calling thread."""

    def __init__(self, servable: Servable) -> None:
        from wok.app import WokServer
        from wok.config import server_settings
        from wok.repository import ModelRepository

        self.loop = _ThreadCheckedLoop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

        async def start() -> WokServer:
            server = WokServer(server_settings(grpc_port=0, metrics_port=None), ModelRepository([servable], "test"))
            await server.start()
            return server

        self.server = self.run(start())
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.server.port}")
        self.stub = pb_grpc.GRPCInferenceServiceStub(self.channel)

    def run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(60)

    def fail(self, n: int) -> None:
        for _ in range(n):
            with pytest.raises(grpc.RpcError) as info:
                self.stub.ModelInfer(request(BAD))
            assert (info.value.code(), info.value.details()) == (grpc.StatusCode.INTERNAL, DETAILS)

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        self.channel.close()
        try:
            self.run(self.server.stop(grace=5.0))
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(30)
            self.loop.close()


def test_two_servers_on_loops_of_their_own_threads_share_a_servables_log_each_touching_its_own_loops_timers(caplog):
    # The log had one timer, on the loop of the server whose failure last armed it: a failure on the other server's
    # loop cancelled it from that server's thread, as the first server's stop did a timer armed by the second's
    # failure; and a window's end on one loop, the log since armed on the other, armed the next timer there from the
    # wrong thread (seen under load: "Non-thread-safe operation invoked on an event loop other than the current one").
    s, failures, line = _hook_failing("check")
    now = [0.0]
    failures.throttle.clock = lambda: now[0]
    failures.throttle.every_s = 0.2  # each loop's timer waits this long, and finds the window over by the test's
    first = second = None
    try:
        with caplog.at_level(logging.WARNING):
            first, second = _ServedOnItsOwnThread(s), _ServedOnItsOwnThread(s)
            first.fail(2)  # its line, then one held: a timer on the first server's loop
            second.fail(1)
            first.stop()  # what both held, told
            second.fail(1)
            now[0] += 0.2
            second.run(until(lambda: len(check_lines(caplog)) == 3))  # told at the window's end, on its loop
            second.stop()
            assert [r.getMessage() for r in check_lines(caplog)] == [
                line,
                f"{line} 2 more times since the last logged (ValueError: 2), as one of the 2 servers serving it stops "
                "(counted in all of them)",
                f"{line} 1 more time since the last logged (ValueError: 1)",
            ]
    finally:
        for served_ in (first, second):
            if served_ is not None:
                served_.stop()
    assert [(first.loop.foreign_cancels, first.loop.errors), (second.loop.foreign_cancels, second.loop.errors)] == [
        (0, []),
        (0, []),
    ]
    assert not failures.window_ends  # no timer left on either loop


# A BaseException a Servable's own check raises by the request's value (INPUT0's), on the event loop: the check's own.
RAISED = {
    5: KeyboardInterrupt("ki"),
    6: GeneratorExit("from the check"),
    8: asyncio.CancelledError("from the check"),
    10: SystemExit(3),
}


class RaisingCheck(Servable):
    def check(self, inputs):
        exc = RAISED.get(int(inputs["INPUT0"].flat[0]))
        if exc is not None:
            # A new one each time: the module's instance, raised, would keep each raise's frames (its requests).
            raise type(exc)(*exc.args)


@pytest.mark.parametrize("call", ["unary", "stream"])
async def test_a_servables_own_check_raising_a_base_exception_fails_its_request_alone(call, caplog):
    # Not wrapped, on a stream (whose per-request task caught only Exception) a GeneratorExit or CancelledError
    # left its request unanswered, and the stream with it; a KeyboardInterrupt or SystemExit ended the loop.
    s = RaisingCheck(four_wide_config("raising"), nn.Identity())
    async with served(s) as (server, stub):
        with caplog.at_level(logging.WARNING):
            await each_fails_alone(stub, call, lambda value, i: request(value, i, "raising"), RAISED)
            lines = check_lines(caplog)
    what = f"{RaisingCheck.__module__}:{RaisingCheck.__qualname__}.check"
    assert [r.getMessage() for r in lines] == [f"model 'raising': its check ({what}) failed"]
    assert isinstance(lines[0].exc_info[1], KeyboardInterrupt)
    assert server.metrics.models["raising"].responses == {"INTERNAL": len(RAISED), "OK": len(RAISED)}


def test_a_keyboard_interrupt_from_a_check_off_the_event_loop_stays_one(tmp_path):
    # `wok profile` runs the checks with no loop, where a Ctrl-C's KeyboardInterrupt may land in one: it stays a
    # Ctrl-C (the profile ends "interrupted"). The config's check made it its own failure (ModelExecutionError).
    interrupted = {"INPUT0": np.full((1, 4), 5.0, np.float32)}
    source = CHECKED_MODEL + "\n\ndef interrupts(inputs):\n    raise KeyboardInterrupt('ki')\n"
    config = load_servable(checked_model(tmp_path, check="model:interrupts", source=source))
    with pytest.raises(KeyboardInterrupt):
        config.check(interrupted)
    own = RaisingCheck(four_wide_config("raising"), nn.Identity())
    with pytest.raises(KeyboardInterrupt):
        own.check(interrupted)
    with pytest.raises(CheckFailed) as info:  # no signal's: the check's own failure, as the server answers it
        own.check({"INPUT0": np.full((1, 4), 10.0, np.float32)})
    assert str(info.value) == "internal error: SystemExit: 3"


class TimingOut(Servable):
    """A servable whose own check and batch_key time out on their own (a bug in them, no deadline of the call's):
    the check on a value over 1e6, the batch_key on a negative one."""

    def check(self, inputs):
        if (inputs["INPUT0"] > 1e6).any():
            raise TimeoutError("the check's own lookup timed out")

    def batch_key(self, inputs):
        if (inputs["INPUT0"] < 0).any():
            raise TimeoutError("the key's own lookup timed out")
        return super().batch_key(inputs)


@pytest.mark.parametrize("call", ["unary", "stream"])
async def test_a_timeout_error_from_the_models_code_is_answered_internal_naming_it_not_as_a_deadline(call):
    # errors.to_status mapped every TimeoutError to DEADLINE_EXCEEDED "deadline exceeded": a bug in a model's check
    # read as the call's deadline, and its message was lost. The server's own deadlines are DeadlineExceeded.
    s = TimingOut(four_wide_config("own"), nn.Identity())
    expected = {
        BAD: "internal error: TimeoutError: the check's own lookup timed out",
        -1.0: "internal error: TimeoutError: the key's own lookup timed out",
    }
    async with served(s) as (server, stub):
        got = {}
        if call == "unary":
            for value in expected:
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await stub.ModelInfer(request(value), timeout=10)
                got[value] = (info.value.code(), info.value.details())
        else:
            stream = stub.ModelStreamInfer(iter([request(v, str(v)) for v in expected]), timeout=10)
            async for a in stream:
                number = a.infer_response.parameters["status_code"].int64_param
                code = next(c for c in grpc.StatusCode if c.value[0] == number)
                got[float(a.infer_response.id)] = (code, a.error_message)
            assert await stream.code() == grpc.StatusCode.OK
        out = decode_response(await stub.ModelInfer(request(2.0), timeout=10))
        np.testing.assert_array_equal(out["OUTPUT0"], np.full((1, 4), 2.0, np.float32))
    assert got == {v: (grpc.StatusCode.INTERNAL, d) for v, d in expected.items()}
    assert server.metrics.models["own"].responses == {"INTERNAL": 2, "OK": 1}
