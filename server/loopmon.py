"""How late the event loop answers: a timer armed every `interval`, and how long after its
instant the loop ran it.

Every request's handler, every batch's hand-back and every response waits on the one
event-loop thread. When that thread is busy (Python work, the GIL held by another thread,
the scheduler's slice gone to another process), an I/O event waits too, and no stage
histogram sees it: a request that arrives during a stall enters `decode` only after it.
Each sample is the lateness of one 10 ms tick. The next tick is armed from the firing, so
a stall of any length yields one sample, not one per tick it covers: long stalls weigh less
here than in what requests arriving at random instants meet. On Linux the timer is a
timerfd (server/timers.py), so a sample is the lateness of an I/O event, to about 50 µs;
elsewhere it is the loop's own timer, to about 1 ms.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from .timers import PreciseTimer

DEFAULT_INTERVAL_S = 0.01


class LoopLagMonitor:
    """Samples the loop's lateness every `interval` seconds into `record(seconds)`.

    `start()` on the running loop, `stop()` before the loop closes; nothing runs between
    samples but one armed timer.
    """

    def __init__(self, record: Callable[[float], None], interval: float = DEFAULT_INTERVAL_S) -> None:
        if not interval > 0:
            raise ValueError(f"loop lag interval: expected > 0 s; got {interval}")
        self.interval = interval
        self._record = record
        self._timer: PreciseTimer | None = None
        self._due = 0.0
        self.samples = 0
        self._waiters: list[tuple[int, asyncio.Future]] = []

    @property
    def running(self) -> bool:
        return self._timer is not None

    def start(self) -> None:
        if self._timer is not None:
            raise RuntimeError("loop lag monitor already started")
        self._timer = PreciseTimer(asyncio.get_running_loop(), self._fired)
        self._arm(time.perf_counter())

    def stop(self) -> None:
        if self._timer is None:
            return
        self._timer.close()
        self._timer = None
        for _, fut in self._waiters:
            if not fut.done():
                # Not cancel(): the waiting task was not cancelled, and asyncio.timeout or a
                # TaskGroup would take a CancelledError for one.
                fut.set_exception(RuntimeError("loop lag monitor stopped"))
        self._waiters.clear()

    async def wait_samples(self, n: int) -> None:
        """Until `n` samples in all have been taken (for tests and health checks)."""
        if self.samples >= n:
            return
        if self._timer is None:
            raise RuntimeError("loop lag monitor not started")
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append((n, fut))
        await fut

    def _arm(self, now: float) -> None:
        self._due = now + self.interval
        self._timer.arm(self._due)

    def _fired(self) -> None:
        now = time.perf_counter()
        lag = max(0.0, now - self._due)  # never negative: the loop's own timer can fire up to 1 ms early
        if self._timer is not None:
            # Re-armed before recording, so a failing record cannot stop the sampling;
            # from now, not from the missed instant: a stall yields one late sample, not a burst.
            self._arm(now)
        self._record(lag)
        self.samples += 1
        if self._waiters:
            ready = [fut for n, fut in self._waiters if n <= self.samples]
            self._waiters = [(n, fut) for n, fut in self._waiters if n > self.samples]
            for fut in ready:
                if not fut.done():
                    fut.set_result(None)
