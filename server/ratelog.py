"""Lines logged at most once per window, one mechanism for all: Throttle. A caller off the event loop (the
executor's OwnFailureLog, on a worker thread) tells what was held in its next line; one that `arm`s it on a
loop (the batcher's FailureLog) has what is held told at the window's end as well. And WindowedWarning, a count
of refusals on a Throttle armed on the loop: the first at once, those that follow within the window in one line
at its end, with their count; the bearer-token interceptor's (server/auth.py) and the metrics port's connection
cap (server/http.py)."""

from __future__ import annotations

import asyncio
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
