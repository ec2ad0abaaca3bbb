"""A count of refusals logged at most once per window: the first at once, those that follow within the
window in one line at its end, with their count. Shared by the bearer-token interceptor (server/auth.py)
and the metrics port's connection cap (server/http.py). And Throttle, at most a line per window off the
event loop: the batcher's FailureLog, the executor's OwnFailureLog."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable


class Throttle:
    """At most one line per `every_s`, for a caller with no event loop to arm a timer on (a worker thread):
    `due()` is, when a line is due now, how many were held since the last; None, that one held, while within
    `every_s` of it. What is held is told in the next line, however late (WindowedWarning's timer tells it at
    the window's end)."""

    def __init__(self, every_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.every_s = every_s
        self.clock = clock
        self._next = -math.inf
        self.held = 0

    def due(self) -> int | None:
        now = self.clock()
        if now < self._next:
            self.held += 1
            return None
        self._next = now + self.every_s
        held, self.held = self.held, 0
        return held

    def left(self) -> float:
        """Seconds until a line is due again (0 when one is now)."""
        return max(0.0, self._next - self.clock())


class WindowedWarning:
    """`count` is raised by the caller as refusals happen; `due()` logs what is new now, or arms a
    timer for the window's end (else a count would wait for the next refusal after the window, maybe
    forever); `close()` at the stop logs what is still held and leaves nothing scheduled on the loop.
    `say(n)` writes the line for n refusals."""

    def __init__(self, say: Callable[[int], None], every_s: float) -> None:
        self.say = say
        self.every_s = every_s
        self.count = 0
        self._logged_count = 0
        self._logged_at = -every_s
        self.flush: asyncio.TimerHandle | None = None  # the window's end, while refusals wait for it

    def due(self) -> None:
        wait = self._logged_at + self.every_s - time.monotonic()
        if wait <= 0:
            self.log()
        elif self.flush is None:
            self.flush = asyncio.get_running_loop().call_later(wait, self.log)

    def log(self) -> None:
        if self.flush is not None:
            self.flush.cancel()
            self.flush = None
        new = self.count - self._logged_count
        if new <= 0:
            return
        self.say(new)
        self._logged_at, self._logged_count = time.monotonic(), self.count

    def close(self) -> None:
        if self.flush is not None:
            self.log()
