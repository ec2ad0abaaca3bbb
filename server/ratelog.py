"""Lines logged at most once per window, one mechanism for all: Throttle. A caller off the event loop (the
executor's OwnFailureLog, on a worker thread) tells what was held in its next line; one that `arm`s it on a
loop (the batcher's FailureLog) has what is held told at the window's end as well. And WindowedWarning, a count
of refusals on a Throttle armed on the loop: the first at once, those that follow within the window in one line
at its end, with their count; the bearer-token interceptor's (server/auth.py) and the metrics port's connection
cap (server/http.py). And TracebackLog, failures of one kind on the request path each logged with its traceback at most
once a window, with a timer of its own on each loop it fails on (servers on loops in several threads share one): a
model's own check and batch_key (servable.CheckFailureLog) and the handlers' unexpected errors (server/service.py)."""

from __future__ import annotations

import asyncio
import logging
import math
import threading
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
        if self._loop is None:
            return
        wait = self.ended(self._tell)
        if wait:
            self.window_end = self._loop.call_later(wait, self._window_ended)

    def ended(self, tell: Callable[[int], bool]) -> float:
        """A window's timer ran: what is held is told by `tell(held)` if the window is over; else the seconds left of
        it, to wait again (0: nothing to wait for)."""
        if not self.held:
            return 0.0
        left = self.left()
        if left > 0:  # the loop's clock ran ahead of the throttle's, or the window grew meanwhile
            return left
        held, self.held = self.held, 0
        if tell(held):
            self._last = self.clock()
        return 0.0


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
    one line a window (`every_s`), which counts those held since the last line (`counted` names them). A failure held
    on a running event loop arms a timer there (`window_ends`, one per loop), so that what a window held is told at its
    end, in one line with no traceback that counts them by exception type: a flood writes its first traceback and then
    one line a window, and a burst that stops is still told. `close()` tells what is still held and leaves no timer on
    the loop; a failure after it is logged at once, with its traceback, and arms nothing, until `open()`: a server
    opens the logs it serves with at its start and closes them at its stop, so that a servable served again (by a
    second server in the process) is rate-limited again; while another server that opened it still serves, a close
    leaves it open. Servers on loops in different threads share a servable's log: its state is changed under a lock,
    and each loop's timer is armed and cancelled on that loop's own thread alone. Off any loop (`wok profile` runs a
    model's check), what is held is told in the next line. `subject`: the lines' words, "model 'm': its check
    (model:check) failed"; `failed(exc, line)` may word its own line for the first."""

    def __init__(self, logger: logging.Logger, level: int, subject: str, counted: str, every_s: float = 10.0) -> None:
        self.logger = logger
        self.level = level
        self.subject = subject
        self.counted = counted
        self.throttle = Throttle(every_s)  # never armed: its windows' timers are the log's, on each loop
        # By loop, the timer that tells what is held at the window's end, armed by a failure held on that loop. One per
        # loop: a timer armed on one loop and cancelled or re-armed from another loop's thread (asyncio's handles and
        # uvloop's libuv timers are their loop's thread's alone) raced that loop.
        self.window_ends: dict[asyncio.AbstractEventLoop, asyncio.TimerHandle] = {}
        # Held while the state changes, never while a line is said: a logging handler may wait on another thread (a
        # log shipper handing records to another loop) whose server holds a failure meanwhile, and both hung.
        self._lock = threading.Lock()
        self._types: dict[str, int] = {}  # what is held, by exception type's name
        self._closed = False
        self._opened = 0  # the servers serving with it now: each open()s it at its start and close()s it at its stop

    def failed(self, exc: BaseException, line: str | None = None) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        with self._lock:
            if self._closed:
                # At the stop no timer would tell what a window held (the loop ends), and a timer armed now would
                # outlive the stop's close: told now, each whole (the stop handles no request: a few at most).
                more = ""
            else:
                held = self.throttle.due()
                if held is None:
                    name = type(exc).__name__
                    self._types[name] = self._types.get(name, 0) + 1
                    if loop is not None and loop not in self.window_ends:
                        self._forget_closed_loops()
                        self.window_ends[loop] = loop.call_later(self.throttle.left(), self._window_ended, loop)
                    return
                self._types.clear()  # counted in this line
                more = f" ({held} more {self.counted} since the last logged)" if held else ""
        self.logger.log(self.level, "%s%s", line or self.subject, more, exc_info=exc)

    def _window_ended(self, loop: asyncio.AbstractEventLoop) -> None:
        """A window's timer on `loop`, run by it: what any loop held, told once the window is over."""
        lines: list[tuple] = []
        with self._lock:
            del self.window_ends[loop]  # only this loop's thread cancels its timer, which then never runs: this one
            wait = self.throttle.ended(lambda held: self._held_line(held, "", lines))
            if wait:
                self.window_ends[loop] = loop.call_later(wait, self._window_ended, loop)
        self._say(lines)

    def _forget_closed_loops(self) -> None:
        # A server stopped, its loop closed without the log's close (a test's asyncio.run): that timer never runs.
        for loop in [loop for loop in self.window_ends if loop.is_closed()]:
            del self.window_ends[loop]

    def _held_line(self, held: int, why: str, lines: list[tuple]) -> bool:
        """The line that tells the `held` failures counted (by type), into `lines`, to be said once the lock is let go
        (`_say`); the count starts again."""
        types = ", ".join(f"{name}: {n}" for name, n in sorted(self._types.items(), key=lambda kv: -kv[1]))
        self._types.clear()
        times = "time" if held == 1 else "times"
        lines.append((self.subject, held, times, types, why))
        return True

    def _say(self, lines: list[tuple]) -> None:
        for args in lines:
            self.logger.log(self.level, "%s %d more %s since the last logged (%s)%s", *args)

    def open(self) -> None:
        """A server starts serving with it: its failures are rate-limited (again, after a close), until every server
        that opened it has closed it."""
        with self._lock:
            self._opened += 1
            self._closed = False

    def close(self) -> None:
        """Tell what is held now and leave no timer on the running loop (that of the server whose stop closes it);
        unless another server that opened it still serves, a later failure is logged at once (`failed`), until the
        next `open()`. A close with no server left to close it (more closes than opens) is a bug of the caller's:
        RuntimeError. What a window held is the log's, of every server serving with it (a servable's check and
        batch_key run in each, one line a window for all, and a failure does not say whose request it was), told as
        any of them stops: the timer that would tell it at the window's end may be on the loop that server's stop
        ends. A timer on another loop is left to it (each server's stop cancels its own loop's): it finds nothing
        held, or what was held since, at its window's end."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        lines: list[tuple] = []
        with self._lock:
            if not self._opened:
                raise RuntimeError(f"{self.subject}: its log was closed more times than it was opened")
            servers = self._opened
            self._opened -= 1
            self._closed = not self._opened
            self._forget_closed_loops()
            if running in self.window_ends:
                self.window_ends.pop(running).cancel()
            held, self.throttle.held = self.throttle.held, 0
            if held:
                if servers == 1:
                    self._held_line(held, ", as the server stops", lines)
                else:
                    why = f", as one of the {servers} servers serving it stops (counted in all of them)"
                    self._held_line(held, why, lines)
        self._say(lines)
