"""The demo's load: an arrival rate the page controls, and what the callers saw.

`LoadControl` says how many requests per second to send now: a steady rate, and a burst
(a higher rate for a few seconds, then back). Arrivals are Poisson at that rate, drawn in
short windows (`WINDOW_S`) with the bench's own process, so a new rate applies within one
window. `LoadGenerator` sends them open loop to the server over one gRPC channel (a late
answer never delays the next send) and `Rolling` keeps the last seconds of answers: the
page's throughput, P50/P95/P99 and errors by code are these callers' exact figures.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, deque
from dataclasses import dataclass

import numpy as np

from ..bench.arrivals import Poisson
from ..errors import quoted_name
from ..faults import AdminRequestError, check_number, shown

WINDOW_S = 0.05  # arrivals are drawn this far ahead; a rate change applies within it
ROLLING_S = 2.0  # the page's throughput and percentiles cover the last this many seconds
MAX_RATE = 5000.0
MAX_BURST_S = 30.0


@dataclass
class LoadState:
    rate: float
    burst_rate: float = 0.0
    burst_until: float = 0.0  # time.monotonic() the burst ends

    def current(self, now: float) -> float:
        return self.burst_rate if now < self.burst_until else self.rate


class LoadControl:
    """The rate the page set: steady, or a burst for a few seconds."""

    def __init__(self, rate: float) -> None:
        self.state = LoadState(check_rate("rate", rate))

    def set(self, body) -> dict:
        """Apply a POST /api/load body: {"rate"} and/or {"burst_rate", "burst_s"}; raises AdminRequestError, as
        its fields' checks do (a ValueError: the page's server answers 400)."""
        if not isinstance(body, dict):
            # As the admin API shows a value (wok.faults.shown): a body of 64 KiB made a 400 as long.
            raise AdminRequestError(f"body: expected a JSON object; got {shown(body)}")
        extra = sorted(set(body) - {"rate", "burst_rate", "burst_s"})
        if extra:
            raise AdminRequestError(
                f"field {quoted_name(extra[0])}: expected only rate, burst_rate, burst_s; got {shown(body[extra[0]])}"
            )
        # Every field checked before any applies: a refused body changes nothing.
        rate = check_rate("rate", body["rate"]) if "rate" in body else None
        burst = "burst_rate" in body or "burst_s" in body
        if burst:
            burst_rate = check_rate("burst_rate", body.get("burst_rate"))
            # A burst of 0 s would be none: 0 itself refused, as it was.
            seconds = check_number("burst_s", body.get("burst_s"), 0, MAX_BURST_S, "seconds", above=True)
        if rate is not None:
            self.state.rate = rate
        if burst:
            self.state.burst_rate = burst_rate
            self.state.burst_until = time.monotonic() + seconds
        return self.describe()

    def describe(self) -> dict:
        now = time.monotonic()
        s = self.state
        bursting = now < s.burst_until
        return {
            "rate": s.rate,
            "current_rate": s.current(now),
            "burst_rate": s.burst_rate if bursting else None,
            "burst_left_s": round(s.burst_until - now, 3) if bursting else 0.0,
        }

    def arrivals(self, start: float, rng: np.random.Generator) -> np.ndarray:
        """Send times (time.monotonic()) in [start, start + WINDOW_S) at the rate of that moment."""
        rate = self.state.current(start)
        if rate <= 0:
            return np.empty(0)
        return start + Poisson(rate).times(WINDOW_S, rng)


def check_rate(field: str, value) -> float:
    """`value` as a float of requests per second from 0 to MAX_RATE, else ValueError (AdminRequestError)."""
    return check_number(field, value, 0, MAX_RATE, "requests per second")


class Rolling:
    """Answers of the last ROLLING_S seconds: (time answered, latency s, code)."""

    def __init__(self, span_s: float = ROLLING_S) -> None:
        self.span_s = span_s
        self.answers: deque[tuple[float, float, str]] = deque()
        self.sent: deque[float] = deque()
        # Arrivals not sent (LoadGenerator's cap): over the window too, so that the page's warning of
        # an overload ends once the demo keeps up again; a lifetime total stayed up for good.
        self.skipped: deque[float] = deque()
        self.sent_total = 0
        self.skipped_total = 0
        self.answered_total = 0
        self.in_flight = 0

    def on_send(self, now: float) -> None:
        self.sent.append(now)
        self.sent_total += 1
        self.in_flight += 1

    def on_skip(self, now: float) -> None:
        self.skipped.append(now)
        self.skipped_total += 1

    def on_answer(self, now: float, latency_s: float, code: str) -> None:
        self.answers.append((now, latency_s, code))
        self.answered_total += 1
        self.in_flight -= 1

    def summary(self, now: float) -> dict:
        """Rates over the window, and the percentiles of its successful answers (ms; None if none)."""
        edge = now - self.span_s
        while self.answers and self.answers[0][0] < edge:
            self.answers.popleft()
        while self.sent and self.sent[0] < edge:
            self.sent.popleft()
        while self.skipped and self.skipped[0] < edge:
            self.skipped.popleft()
        ok = np.array([lat for _, lat, code in self.answers if code == "OK"])
        codes = Counter(code for _, _, code in self.answers if code != "OK")
        pct = np.percentile(ok, (50, 95, 99)) * 1e3 if len(ok) else (None, None, None)
        return {
            "window_s": self.span_s,
            "sent_per_s": len(self.sent) / self.span_s,
            "ok_per_s": len(ok) / self.span_s,
            "errors_per_s": sum(codes.values()) / self.span_s,
            "errors": dict(codes),
            "p50_ms": None if pct[0] is None else round(float(pct[0]), 3),
            "p95_ms": None if pct[1] is None else round(float(pct[1]), 3),
            "p99_ms": None if pct[2] is None else round(float(pct[2]), 3),
            "skipped": len(self.skipped),
            "sent_total": self.sent_total,
            "skipped_total": self.skipped_total,
            "answered_total": self.answered_total,
            "in_flight": self.in_flight,
        }


class LoadGenerator:
    """Sends the control's arrivals to `send` (an async callable) open loop, recording each answer."""

    def __init__(self, control: LoadControl, send, *, max_in_flight: int = 4000, seed: int = 0) -> None:
        self.control = control
        self.send = send
        self.max_in_flight = max_in_flight
        self.stats = Rolling()  # its `skipped`: arrivals not sent because max_in_flight callers were waiting
        self._rng = np.random.default_rng(seed)
        self._tasks: set[asyncio.Task] = set()

    async def run(self) -> None:
        start = time.monotonic()
        try:
            while True:
                for t in self.control.arrivals(start, self._rng):
                    delay = t - time.monotonic()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    # Its tasks, not the callers counted as they start: arrivals that fell due while the loop
                    # was held are made into tasks here before any starts, and passed the cap (9,580 of 8,192).
                    if len(self._tasks) >= self.max_in_flight:
                        self.stats.on_skip(time.monotonic())
                        continue
                    task = asyncio.ensure_future(self._one())
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
                start += WINDOW_S
                delay = start - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                elif delay < -1.0:  # the loop fell far behind: skip ahead rather than burst to catch up
                    start = time.monotonic()
        finally:
            for task in list(self._tasks):
                task.cancel()

    async def _one(self) -> None:
        t0 = time.monotonic()
        self.stats.on_send(t0)
        code = await self.send()
        t1 = time.monotonic()
        self.stats.on_answer(t1, t1 - t0, code)
