"""A one-shot timer on the event loop that fires at a `time.perf_counter()` instant, not a millisecond late.

The event loop's own timers are coarse: uvloop rounds every delay to whole milliseconds and
measures it from a millisecond clock cached at the start of the loop's iteration, and the
default loop's selector sleeps in whole milliseconds, rounded up. A batcher's delay flush
armed with `call_later` therefore lands anywhere from about 1 ms early (uvloop; the batcher
then re-arms for the rest) to about 1 ms late, and max_queue_delay is a maximum.

On Linux, `PreciseTimer` arms a timerfd (CLOCK_MONOTONIC, the clock of `time.perf_counter()`
there) at the absolute instant and watches it with `loop.add_reader`: the loop's poll returns
when the kernel's high-resolution timer expires (within the thread's timer slack, 50 µs by
default), whatever the loop's own timers are rounded to. Elsewhere, or if the timerfd cannot
be made, it falls back to `loop.call_at` (`precise` is then False): up to 1-2 ms late, and
never early, as a firing before the instant re-arms for the rest instead of calling back.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import functools
import math
import os
import sys
import time
from collections.abc import Callable

_CLOCK_MONOTONIC = 1
_TFD_NONBLOCK = os.O_NONBLOCK
_TFD_CLOEXEC = 0o2000000
_TFD_TIMER_ABSTIME = 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


@functools.cache
def _libc() -> ctypes.CDLL:
    """The C library with timerfd's argument types declared; loaded once per process.

    Through PyDLL, which keeps the GIL across the call: timerfd_settime returns at once, and a
    CDLL call's release let a worker thread take the GIL, and the loop wait for it back (measured:
    15-65 µs of loop CPU per arm beside a running model worker, against about 9 without)."""
    lib = ctypes.PyDLL(ctypes.util.find_library("c") or None, use_errno=True)
    lib.timerfd_create.argtypes = (ctypes.c_int, ctypes.c_int)
    lib.timerfd_settime.argtypes = (
        ctypes.c_int,
        ctypes.c_int,
        ctypes.POINTER(_Itimerspec),
        ctypes.POINTER(_Itimerspec),
    )
    return lib


def _same_clock() -> bool:
    """True when time.perf_counter() reads CLOCK_MONOTONIC, the clock the timerfd is armed on."""
    return time.get_clock_info("perf_counter").implementation == "clock_gettime(CLOCK_MONOTONIC)"


class PreciseTimer:
    """Calls `callback()` on `loop` once the perf_counter clock reaches the armed instant.

    One pending instant at a time: `arm` replaces it, `disarm` drops it. The callback runs
    as a loop callback (never inside `arm`), at most once per arming.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, callback: Callable[[], None], *, precise: bool = True) -> None:
        self._loop = loop
        self._callback = callback
        self._fd = -1
        self._handle: asyncio.TimerHandle | None = None
        self._spec = _Itimerspec()
        self.armed_at = math.inf  # the pending instant (perf_counter seconds); inf when disarmed
        if precise and sys.platform == "linux" and _same_clock():
            self._fd = self._open_timerfd()

    def _open_timerfd(self) -> int:
        """A timerfd the loop watches, or -1: then the loop's own timers serve (`precise` False)."""
        try:
            fd = _libc().timerfd_create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)
        except (OSError, AttributeError):  # no C library to load, or one without timerfd
            return -1
        if fd < 0:
            return -1
        try:
            self._loop.add_reader(fd, self._expired)
        except (OSError, NotImplementedError, RuntimeError):  # a loop that cannot watch descriptors
            os.close(fd)
            return -1
        return fd

    @property
    def precise(self) -> bool:
        """Whether the kernel's timer (timerfd) is used rather than the loop's."""
        return self._fd >= 0

    def arm(self, at: float) -> None:
        """Fire at perf_counter instant `at` (at once, on the next loop pass, if that has passed)."""
        if at == self.armed_at:
            return
        self.armed_at = at
        if self._fd >= 0:
            sec = math.floor(at)
            spec = self._spec
            spec.it_value.tv_sec = max(sec, 0)
            # A zero it_value disarms a timerfd, so an instant at exactly 0 becomes 1 ns.
            spec.it_value.tv_nsec = max(min(int((at - sec) * 1e9), 999_999_999), 0 if sec > 0 else 1)
            if _libc().timerfd_settime(self._fd, _TFD_TIMER_ABSTIME, ctypes.byref(spec), None) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"timerfd_settime failed: {os.strerror(err)}")
            return
        if self._handle is not None:
            self._handle.cancel()
        self._call_at(at)

    def _call_at(self, at: float) -> None:
        # The loop's clock is not perf_counter's (uvloop's is a millisecond clock cached per pass).
        self._handle = self._loop.call_at(self._loop.time() + (at - time.perf_counter()), self._fire)

    def disarm(self) -> None:
        if self.armed_at == math.inf:  # nothing pending: never armed, or fired already
            return
        self.armed_at = math.inf
        if self._fd >= 0:
            spec = self._spec
            spec.it_value.tv_sec = spec.it_value.tv_nsec = 0
            _libc().timerfd_settime(self._fd, 0, ctypes.byref(spec), None)
        elif self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def close(self) -> None:
        self.disarm()
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if self._fd >= 0:
            try:
                self._loop.remove_reader(self._fd)
            except RuntimeError:  # the loop is closed already
                pass
            os.close(self._fd)
            self._fd = -1

    def _expired(self) -> None:
        try:
            os.read(self._fd, 8)  # the expiration count; reading it clears readiness
        except BlockingIOError:  # re-armed or disarmed after it expired: nothing to do
            return
        self._fire()

    def _fire(self) -> None:
        self._handle = None
        if self.armed_at == math.inf:
            return
        if self._fd < 0 and time.perf_counter() < self.armed_at:
            # The loop's timer ran early (uvloop's by up to about 1 ms): wait out the rest, so
            # a caller that does not re-arm itself (PreciseSleeper, LoopLagMonitor) is never early.
            # At least a millisecond on: uvloop rounds a shorter delay to 0 and fires on the
            # next pass, still early, and the timer would spin the loop until the instant.
            self._call_at(max(self.armed_at, time.perf_counter() + 1e-3))
            return
        self.armed_at = math.inf
        self._callback()


class PreciseSleeper:
    """`await sleeper.until(at)`: sleep until perf_counter instant `at` on a `PreciseTimer`.

    For a load generator that sends at intended instants: `asyncio.sleep` on uvloop wakes up to
    about a millisecond late, and that lateness is charged to every request it delays. One
    sleep at a time (one coroutine paces itself).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop or asyncio.get_running_loop()
        self._timer = PreciseTimer(self._loop, self._wake)
        self._waiter: asyncio.Future | None = None

    @property
    def precise(self) -> bool:
        return self._timer.precise

    async def until(self, at: float) -> None:
        if at <= time.perf_counter():
            return
        if self._waiter is not None:
            raise RuntimeError("PreciseSleeper.until: another sleep is pending")
        self._waiter = self._loop.create_future()
        self._timer.arm(at)
        try:
            await self._waiter
        finally:
            self._waiter = None
            self._timer.disarm()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def close(self) -> None:
        self._timer.close()
