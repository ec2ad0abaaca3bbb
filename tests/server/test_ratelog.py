"""server/ratelog.py: one mechanism for every line logged at most once a window. The Throttle, armed on a loop,
tells what it held at the window's end (the batcher's FailureLog had a timer of its own for this, beside
WindowedWarning's); WindowedWarning, the refusals' count, is a Throttle armed on the running loop."""

from __future__ import annotations

import asyncio
import logging

import pytest

from wok.ratelog import Throttle, TracebackLog, WindowedWarning

from .conftest import until


async def test_an_armed_throttle_tells_what_it_held_at_the_windows_end_and_disarm_hands_back_the_rest():
    told: list[int] = []
    ended = asyncio.Event()

    def tell(held: int) -> bool:
        told.append(held)
        ended.set()
        return True

    throttle = Throttle(0.05)
    throttle.arm(asyncio.get_running_loop(), tell)
    assert [throttle.due(), throttle.due(), throttle.due()] == [0, None, None]
    await asyncio.wait_for(ended.wait(), 10)
    assert told == [2] and throttle.held == 0 and throttle.window_end is None
    # The line told at the window's end began the next window; read live, a longer one holds this one.
    throttle.every_s = 600.0
    assert throttle.due() is None and throttle.window_end is not None
    timer = throttle.window_end
    assert throttle.disarm() == 1 and timer.cancelled() and throttle.window_end is None
    assert throttle.due() is None and throttle.window_end is None  # disarmed: held for the next line alone
    assert told == [2]


async def test_a_warnings_window_end_with_nothing_new_begins_no_window():
    # The token interceptor counts a refusal as the call comes and asks for its line as it is denied: a line may
    # have told a refusal whose own ask comes later, within the window, and its window's end then says nothing.
    said: list[int] = []
    warning = WindowedWarning(said.append, 0.05)
    warning.count = 2
    warning.due()
    assert said == [2]
    warning.due()  # the second refusal's: told already
    assert warning.throttle.window_end is not None
    await until(lambda: warning.throttle.window_end is None)
    assert said == [2]
    warning.count += 1
    warning.due()
    assert said == [2, 1]  # at once: the window's end that said nothing began no window
    warning.close()
    assert said == [2, 1] and warning.throttle.window_end is None


def test_a_traceback_log_tells_a_window_held_at_its_end_on_each_loop_it_fails_on(caplog):
    # A model's check fails on the server's loop; a servable outlives a server (its loop closed, a timer of the
    # throttle's still on it) and serves on the next one's, where what it holds is told at the window's end as well.
    logger = logging.getLogger("wok.test_ratelog")
    failures = TracebackLog(logger, logging.WARNING, "model 'm': its check (m:check) failed", "failures of its check")
    failures.open()
    failures.throttle.every_s = 1.0  # long enough for the next loop's failure to come within it, on a slow host

    async def fail(*excs: BaseException) -> None:
        for exc in excs:
            failures.failed(exc)

    async def told(n: int) -> None:
        await fail(KeyError("k"))
        await until(lambda: len(caplog.records) == n)

    with caplog.at_level(logging.WARNING, logger="wok.test_ratelog"):
        asyncio.run(fail(ValueError("first"), KeyError("a"), ValueError("b"), KeyError("c")))  # its loop closes
        assert len(failures.window_ends) == 1 and failures.throttle.held == 3  # its timer on the closed loop
        asyncio.run(told(2))
        failures.throttle.every_s = 600.0
        asyncio.run(fail(ValueError("x")))  # the next window: held, then told at the close
        failures.close()
    first, held, closed = caplog.records
    assert first.getMessage() == "model 'm': its check (m:check) failed" and str(first.exc_info[1]) == "first"
    # What the closed loop's timer never told, told on the next loop: no traceback, the exceptions counted by type.
    assert (held.getMessage(), held.exc_info) == (
        "model 'm': its check (m:check) failed 4 more times since the last logged (KeyError: 3, ValueError: 1)",
        None,
    )
    assert closed.getMessage() == (
        "model 'm': its check (m:check) failed 1 more time since the last logged (ValueError: 1), as the server stops"
    )
    assert not failures.window_ends


async def test_a_failure_after_a_traceback_logs_close_is_logged_at_once_and_arms_no_timer(caplog):
    # The stop closes the logs once no request is handled; a failure after that (a servable's check run later) armed
    # the throttle's timer on the running loop again: left there past the stop, its count told only if the loop ran
    # to the window's end.
    logger = logging.getLogger("wok.test_ratelog")
    failures = TracebackLog(logger, logging.WARNING, "requests for model 'm' failed", "failed requests")
    failures.open()
    failures.throttle.every_s = 600.0
    with caplog.at_level(logging.WARNING, logger="wok.test_ratelog"):
        failures.failed(ValueError("before"))
        failures.failed(KeyError("held"))
        failures.close()
        failures.failed(TypeError("after"), "ModelInfer for model 'm' failed")
        failures.failed(TypeError("after, again"))
        assert not failures.window_ends and failures.throttle.held == 0
    assert [(r.getMessage(), r.exc_info[1] if r.exc_info else None) for r in caplog.records] == [
        ("requests for model 'm' failed", caplog.records[0].exc_info[1]),
        (
            "requests for model 'm' failed 1 more time since the last logged (KeyError: 1), as the server stops",
            None,
        ),
        ("ModelInfer for model 'm' failed", caplog.records[2].exc_info[1]),
        ("requests for model 'm' failed", caplog.records[3].exc_info[1]),
    ]
    assert [str(r.exc_info[1]) for r in caplog.records if r.exc_info] == ["before", "after", "after, again"]


def test_a_traceback_log_closed_more_times_than_opened_raises(caplog):
    # A close past the opens passed silently (its count floored at 0): a stop closing a log twice, or one it never
    # opened, then unthrottled it under another server still serving with it. A bug of the caller's, said.
    logger = logging.getLogger("wok.test_ratelog")
    failures = TracebackLog(logger, logging.WARNING, "model 'm': its check (m:check) failed", "failures of its check")
    with pytest.raises(RuntimeError) as info:
        failures.close()
    assert str(info.value) == "model 'm': its check (m:check) failed: its log was closed more times than it was opened"
    failures.open()
    failures.open()
    failures.close()
    failures.close()
    with pytest.raises(RuntimeError):
        failures.close()
    # Still closed by the last of its servers: a failure now is logged at once, with its traceback.
    with caplog.at_level(logging.WARNING, logger="wok.test_ratelog"):
        failures.failed(ValueError("a"))
        failures.failed(ValueError("b"))
    assert [str(r.exc_info[1]) for r in caplog.records] == ["a", "b"]


@pytest.mark.parametrize("said", ["first", "held", "stop"])
def test_a_line_is_said_with_no_lock_held_so_a_handler_may_wait_on_another_threads_failure(said):
    """A logging handler that waits, as it says a line, on another thread where a failure of the same log comes and is
    held (a log shipper handing records to another server's loop): with the line said under the log's lock, that
    failure waited for the lock and the handler for it, both hung until the handler's own timeout (a review's repro:
    3.5 s). A failure's traceback, a window's end, the stop of one of two servers. (The other thread's failure is
    one held, saying nothing: one said would wait for the handler's own lock, which logging holds through `emit`.)"""
    import threading

    logger = logging.getLogger(f"test.ratelog.unlocked.{said}")
    logger.propagate = False
    failures = TracebackLog(logger, logging.WARNING, "model 'm': its check (m:check) failed", "failures of its check")
    now = [0.0]
    failures.throttle.clock = lambda: now[0]
    failures.open()
    failures.open()  # two servers: the first one's stop leaves it open, the other thread's failure held
    waits = [said == "first"]
    other: list[threading.Thread] = []

    class WaitsOnAnotherThread(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if waits[0] and not other:
                other.append(threading.Thread(target=failures.failed, args=(ValueError("test: meanwhile"),)))
                other[0].start()
                other[0].join(10)

    logger.addHandler(WaitsOnAnotherThread())
    failures.failed(ValueError("test: first"))
    if said != "first":
        failures.failed(ValueError("test: held"))
        waits[0] = True
        if said == "held":
            now[0] += failures.throttle.every_s
            asyncio.run(_a_window_ends(failures))
        else:
            failures.close()
    assert other and not other[0].is_alive(), "the other thread's failure waited for the lock the line was said under"
    assert failures.throttle.held == 1  # the other thread's, held


async def _a_window_ends(failures: TracebackLog) -> None:
    loop = asyncio.get_running_loop()
    failures.window_ends[loop] = loop.call_soon(failures._window_ended, loop)
    await until(lambda: loop not in failures.window_ends)
