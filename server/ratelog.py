"""Lines logged at most once per window, one mechanism for all: Throttle. A caller off the event loop (the
executor's OwnFailureLog, on a worker thread) tells what was held in its next line; one that `arm`s it on a
loop (the batcher's FailureLog) has what is held told at the window's end as well. And WindowedWarning, a count
of refusals on a Throttle armed on the loop: the first at once, those that follow within the window in one line
at its end, with their count; the bearer-token interceptor's (server/auth.py) and the metrics port's connection
cap (server/http.py). And TracebackLog, failures of one kind on the request path each logged with its traceback at most
once a window, armed on the loop it fails on: a model's own check and batch_key (servable.CheckFailureLog) and the
handlers' unexpected errors (server/service.py)."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable


class Throttle:
    """At most one line per `every_s`: `due()` is, when a line is due now, how many were held since the last;
    None, that one held, while within `every_s` of it. What is held is told in the next line, however late; once
    `arm`ed on an event loop, also by `tell(held)` at the window's end, by a timer (else a count waits for the
    next line, maybe forever), and `disarm()` hands back what is still held, leaving no timer on the loop.
    `tell` returns whether it said a line: one that said nothing starts no window."""

    def __init__(self, every_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.every_s = every_s  # read as each line is weighed: a change applies to the window under way
        self.clock = clock
        self._last = -math.inf  # when the last line was due
        self.held = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tell: Callable[[int], bool] | None = None
        self.window_end: asyncio.TimerHandle | None = None  # armed while lines are held

    def arm(self, loop: asyncio.AbstractEventLoop, tell: Callable[[int], bool]) -> None:
        """From now on, what is held at a window's end is told by `tell(held)`, from a timer on `loop`."""
        self._loop, self._tell = loop, tell

    def disarm(self) -> int:
        """Leave no timer on the loop and arm none from now on; what was held (now none), for the caller to tell."""
        if self.window_end is not None:
            self.window_end.cancel()
            self.window_end = None
        self._loop = self._tell = None
        held, self.held = self.held, 0
        return held

    def due(self) -> int | None:
        now = self.clock()
        end = self._last + self.every_s
        if now < end:
            self.held += 1
            if self.window_end is None and self._loop is not None:
                self.window_end = self._loop.call_later(end - now, self._window_ended)
            return None
        self._last = now
        held, self.held = self.held, 0
        return held

    def left(self) -> float:
        """Seconds until a line is due again (0 when one is now)."""
        return max(0.0, self._last + self.every_s - self.clock())

    def _window_ended(self) -> None:
        self.window_end = None
        if not self.held or self._loop is None:
            return
        left = self.left()
        if left > 0:  # the loop's clock ran ahead of the throttle's, or the window grew meanwhile
            self.window_end = self._loop.call_later(left, self._window_ended)
            return
        held, self.held = self.held, 0
        if self._tell(held):
            self._last = self.clock()


class WindowedWarning:
    """`count` is raised by the caller as refusals happen; `due()` logs what is new now, or has it logged at the
    window's end (a Throttle armed on the running loop); `close()` at the stop logs what is still held and leaves
    nothing scheduled on the loop. `say(n)` writes the line for n refusals."""

    def __init__(self, say: Callable[[int], None], every_s: float) -> None:
        self.say = say
        self.count = 0
        self._logged_count = 0
        self.throttle = Throttle(every_s)  # its window (every_s) and the timer at its end (window_end)

    def due(self) -> None:
        if self.count == self._logged_count and not self.throttle.left():
            return  # nothing to say: no window begins
        self.throttle.arm(asyncio.get_running_loop(), self._told)
        if self.throttle.due() is not None:
            self.log()

    def _told(self, held: int) -> bool:
        return self.log()

    def log(self) -> bool:
        """Whether there was anything new to say."""
        new = self.count - self._logged_count
        if new <= 0:
            return False
        self.say(new)
        self._logged_count = self.count
        return True

    def close(self) -> None:
        if self.throttle.disarm():
            self.log()


class TracebackLog:
    """Failures of one kind at `level` in `logger`, with the exception's traceback: the first at once, then at most
    one line a window (`every_s`), which counts those held since the last line (`counted` names them). A failure on a
    running event loop arms the throttle there, so that what a window held is told at its end, in one line with no
    traceback that counts them by exception type: a flood writes its first traceback and then one line a window, and
    a burst that stops is still told. `close()` tells what is still held and leaves no timer on the loop; a failure
    after it is logged at once, with its traceback, and arms nothing, until `open()`: a server opens the logs it
    serves with at its start and closes them at its stop, so that a servable served again (by a second server in the
    process) is rate-limited again; while another server that opened it still serves, a close leaves it open. Off any
    loop (`wok profile` runs a model's check), what is held is told in the next line. `subject`: the lines' words,
    "model 'm': its check (model:check) failed"; `failed(exc, line)` may word its own line for the first."""

    def __init__(self, logger: logging.Logger, level: int, subject: str, counted: str, every_s: float = 10.0) -> None:
        self.logger = logger
        self.level = level
        self.subject = subject
        self.counted = counted
        self.throttle = Throttle(every_s)
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop the throttle is armed on
        self._types: dict[str, int] = {}  # what is held, by exception type's name
        self._closed = False
        self._opened = 0  # the servers serving with it now: each open()s it at its start and close()s it at its stop

    def failed(self, exc: BaseException, line: str | None = None) -> None:
        if self._closed:
            # At the stop no timer would tell what a window held (the loop ends), and a timer armed now would
            # outlive the stop's close: told now, each whole (the stop handles no request: a few at most).
            self.logger.log(self.level, "%s", line or self.subject, exc_info=exc)
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is not self._loop:
            held = self.throttle.disarm()  # a timer on another loop (a server stopped, its loop closed) never runs
            self.throttle.held = held
            if loop is not None:
                self.throttle.arm(loop, self._tell_held)
            self._loop = loop
        held = self.throttle.due()
        if held is None:
            name = type(exc).__name__
            self._types[name] = self._types.get(name, 0) + 1
            return
        self._types.clear()  # counted in this line
        more = f" ({held} more {self.counted} since the last logged)" if held else ""
        self.logger.log(self.level, "%s%s", line or self.subject, more, exc_info=exc)

    def _tell_held(self, held: int, why: str = "") -> bool:
        types = ", ".join(f"{name}: {n}" for name, n in sorted(self._types.items(), key=lambda kv: -kv[1]))
        self._types.clear()
        times = "time" if held == 1 else "times"
        self.logger.log(self.level, "%s %d more %s since the last logged (%s)%s", self.subject, held, times, types, why)
        return True

    def open(self) -> None:
        """A server starts serving with it: its failures are rate-limited (again, after a close), until every server
        that opened it has closed it."""
        self._opened += 1
        self._closed = False

    def close(self) -> None:
        """Tell what is held now and leave no timer on the loop; unless another server that opened it still serves,
        a later failure is logged at once (`failed`), until the next `open()`. A close with no server left to close
        it (more closes than opens) is a bug of the caller's: RuntimeError. What a window held is the log's, of
        every server serving with it (a servable's check and batch_key run in each, one line a window for all,
        and a failure does not say whose request it was), told as any of them stops: the timer that would tell it at
        the window's end may be on the loop that server's stop ends."""
        if not self._opened:
            raise RuntimeError(f"{self.subject}: its log was closed more times than it was opened")
        servers = self._opened
        self._opened -= 1
        self._closed = not self._opened
        held = self.throttle.disarm()
        self._loop = None
        if held:
            if servers == 1:
                self._tell_held(held, ", as the server stops")
            else:
                self._tell_held(held, f", as one of the {servers} servers serving it stops (counted in all of them)")
