"""Fault injection: make a model instance slow or failing for a while (`wok serve --admin`).

Each model instance owns one `InstanceFault`; the admin API (server/http.py) sets it and the
instance's worker reads it once per batch (server/executor.py):

- `slow`: the worker sleeps `delay_ms` after the forward, so the batch's compute stage (and
  the instance's busy time) grows by that much; a change of the fault, or the instance's
  shutdown, ends a sleep already begun early (`InstanceFault.pause`);
- `fail`: the worker raises ModelExecutionError before the forward, so every request of the
  batch ends with INTERNAL and the message below;
- `off`: back to normal.

A fault may carry an expiry: past it, the fault is gone without anyone turning it off. It is shown
as `until`, Unix time, but decided by `deadline`, time.monotonic(): a step of the wall clock (NTP,
a VM resumed) stretched or cut a fault's `duration_s`. Every `now` below is a monotonic instant.
The state is one immutable `Fault` swapped under the GIL, written on the event loop alone (the worker
leaves an ended one in place), so the worker's read needs no lock. On a `FaultBoard` given the loop, a
fault with a duration is dropped, and its end logged, by a timer at its deadline; every read on the loop
drops an ended one too.
Requests to change it are checked by `parse_fault_request`, which names the field, what it
expected and what it got.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .errors import ModelExecutionError, quoted_name
from .errors import shown_data as shown  # a JSON body's value in its words: admin, demo and trace refusals

if TYPE_CHECKING:
    import asyncio

log = logging.getLogger("wok.faults")

MODES = ("slow", "fail", "off")
ACTIVE_MODES = ("slow", "fail")
MAX_DELAY_MS = 60_000.0
# The longest max_queue_delay_ms, one bound for a model's config (config.DynamicBatchingConfig), the
# admin API's change of it and the demo's simulator's. Here, not in config: that module loads
# pydantic and numpy (0.35 s), which the admin's routes and the demo's simulator do not.
MAX_QUEUE_DELAY_MS = 60_000
# A fault's shortest and longest `duration_s`: a shorter one (1e-300) ended at once, yet was answered
# and logged as a change made.
MIN_DURATION_S = 1e-3
MAX_DURATION_S = 86_400.0


class AdminRequestError(ValueError):
    """A bad admin request body; the message names the field, what was expected and what came."""


@dataclass(frozen=True, slots=True)
class Fault:
    mode: str  # "slow" or "fail"
    delay_ms: float = 0.0
    until: float | None = None  # Unix time it ends, as shown; None: until turned off
    deadline: float | None = None  # time.monotonic() it ends, what decides; None: until turned off
    duration_s: float | None = None  # as asked for, for the line that says it ended; None: not known

    def __post_init__(self) -> None:
        # One without the other was a fault shown to end that never did, or the reverse.
        if (self.until is None) != (self.deadline is None):
            raise ValueError(
                f"Fault: expected until and deadline both set or both None; got {self.until=}, {self.deadline=}"
            )


class InstanceFault:
    """The fault state of one model instance, read by its worker once per batch."""

    __slots__ = ("_fault", "_stopped", "_wake", "instance", "model")

    def __init__(self, model: str, instance: int) -> None:
        self.model = model
        self.instance = instance
        self._fault: Fault | None = None
        self._stopped = False
        # Set by every change and by stop(): a batch in `pause` re-reads the fault then. Only the
        # slow path touches it; the worker's read of the fault stays a plain attribute read.
        self._wake = threading.Event()

    def set(self, fault: Fault | None) -> None:
        self._fault = fault
        self._wake.set()

    def stop(self) -> None:
        """End a pause under way and any later one at once: the instance shuts down, and a slow fault
        of up to MAX_DELAY_MS would hold its worker thread past the stop's grace period."""
        self._stopped = True
        self._wake.set()

    def pause(self) -> None:
        """The worker's sleep after a `slow` batch's forward (where before_forward said so).

        It lasts the delay of the fault in force, counted from the pause's start, so that turning
        the fault off or to `fail`, its expiry, or a shorter delay ends it early (a 60 s batch
        otherwise held its requests for the whole delay after `off`); stop() ends it at once.
        """
        start = time.monotonic()
        while not self._stopped:
            # Cleared before the fault is read: a set() after this read wakes the wait below.
            self._wake.clear()
            now = time.monotonic()
            f = self.current(now)
            if f is None or f.mode != "slow":
                return
            left = start + f.delay_ms / 1e3 - now
            if f.deadline is not None:
                left = min(left, f.deadline - now)
            if left <= 0:
                return
            self._wake.wait(left)

    def current(self, now: float | None = None, *, forget: bool = False) -> Fault | None:
        """The active fault, or None (none set, or its time is up).

        `now`: a time.monotonic() instant. `forget`: an ended fault is dropped, which only the event
        loop, where `set` runs, may ask. The worker's thread reads alone: its write of None could land
        after a fault the admin set meanwhile, and wipe that one.
        """
        f = self._fault
        if f is None or f.deadline is None:
            return f
        now = time.monotonic() if now is None else now
        if not now >= f.deadline:
            return f
        if forget:
            self._fault = None
            self._say_ended(f, now)
        return None

    def _say_ended(self, f: Fault, now: float) -> None:
        # Its start was logged (the admin API's POST) but its end came unannounced: an operator reading the log
        # took the model as still slowed or failing. Dropped at its end by the board's timer, or by a read on the loop
        # that came first (a GET, a tick of /events, a scrape; the only way on a board with no loop), so the line
        # says how long ago it ended.
        ran = f"its duration_s of {f.duration_s:g} s" if f.duration_s is not None else "to its end"
        log.info(
            "fault injection: model '%s' instance %d: mode '%s'%s ended after %s, %.3f s ago",
            self.model,
            self.instance,
            f.mode,
            f" (delay_ms {f.delay_ms:g})" if f.mode == "slow" else "",
            ran,
            now - f.deadline,
        )

    def before_forward(self) -> bool:
        """Called by the worker before a batch's forward: raises for `fail`; whether to `pause` after
        the forward, true for a `slow` fault of a delay above 0. The pause reads the delay itself, as the
        fault may change during the forward."""
        f = self._fault
        if f is None:
            return False
        f = self.current()
        if f is None:
            return False
        if f.mode == "fail":
            raise ModelExecutionError(f"model '{self.model}' instance {self.instance}: failing by fault injection")
        return f.delay_ms > 0

    def describe(self, now: float | None = None) -> dict | None:
        f = self.current(now, forget=True)
        if f is None:
            return None
        return {
            "model": self.model,
            "instance": self.instance,
            "mode": f.mode,
            "delay_ms": f.delay_ms if f.mode == "slow" else None,
            "until": f.until,
        }


@dataclass(frozen=True)
class FaultRequest:
    model: str
    instance: int | None  # None: every instance of the model
    mode: str
    delay_ms: float
    duration_s: float | None


# The fields a POST /admin/batching body may hold (the admin API's, and the demo's simulator's, which
# share its checks: check_batching_body, check_batching_change).
BATCHING_FIELDS = ("max_batch_size", "max_queue_delay_ms", "model")


def check_batching_body(body) -> None:
    """AdminRequestError unless `body` is an object of BATCHING_FIELDS only: a field not known (a
    typo) was taken without a word, and changed nothing."""
    if not isinstance(body, dict):
        raise AdminRequestError(f"field '(body)': expected a JSON object; got {shown(body)}")
    extra = sorted(set(body) - set(BATCHING_FIELDS))
    if extra:
        raise AdminRequestError(
            f"field {quoted_name(extra[0])}: expected only the fields {', '.join(sorted(BATCHING_FIELDS))}; "
            f"got {shown(body[extra[0]])}"
        )


def check_batching_change(body: dict) -> None:
    """AdminRequestError unless `body` (checked by check_batching_body) changes something: a body of
    the model alone changed nothing, yet was answered as a change made."""
    if "max_batch_size" not in body and "max_queue_delay_ms" not in body:
        raise AdminRequestError("field 'max_batch_size': expected it or max_queue_delay_ms; got neither")


def check_max_batch_size(v, limit: int) -> None:
    """AdminRequestError unless `v` is an integer from 1 to `limit`, the model's configured maximum:
    the admin API and the demo's simulator refuse one in the same words."""
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= limit:
        raise AdminRequestError(
            f"field 'max_batch_size': expected an integer from 1 to {limit} (the model's configured maximum); "
            f"got {shown(v)}"
        )


def check_max_queue_delay_ms(v) -> float:
    """`v` as a float if it is a number from 0 to MAX_QUEUE_DELAY_MS, the bound a model's config is
    held to, else AdminRequestError: the admin API and the demo's simulator refuse one in the same words."""
    return check_number("max_queue_delay_ms", v, 0, MAX_QUEUE_DELAY_MS)


def is_number(v) -> bool:
    """A JSON number that compares as one: not a bool, not NaN or an infinity.

    An integer is never passed to math.isfinite, which raises OverflowError for one beyond a
    float's range; such an integer still compares exactly with a float bound, and fails it.
    """
    if isinstance(v, bool):
        return False
    return isinstance(v, int) or (isinstance(v, float) and math.isfinite(v))


def _bad(field: str, expected: str, got) -> AdminRequestError:
    # quoted_name: a field not allowed is named by the body's key, which may be 64 KiB.
    return AdminRequestError(f"field {quoted_name(field)}: expected {expected}; got {shown(got)}")


def check_number(
    field: str, v, lo: float, hi: float, what: str = "a number", *, above: bool = False, when: str = ""
) -> float:
    """`v` as a float if it is a number (`is_number`) from `lo` to `hi` (`above`: `lo` itself excluded), else
    AdminRequestError naming `field` and `what` it expected (`when`, e.g. "for mode 'slow'", after the
    range): the admin API's numbers and the demo's."""
    if not is_number(v) or not (lo < v if above else lo <= v) or not v <= hi:
        expected = f"{what} above {lo:g} up to {hi:g}" if above else f"{what} from {lo:g} to {hi:g}"
        raise _bad(field, f"{expected} {when}" if when else expected, v)
    return float(v) + 0.0  # -0.0 as 0.0, as -0 (an int) is 0: GET /admin/batching answered -0.0


def parse_fault_request(body, instances: dict[str, int]) -> FaultRequest:
    """Check a POST /admin/faults body against the served models ({name: instance count})."""
    if not isinstance(body, dict):
        raise _bad("(body)", "a JSON object", body)
    allowed = {"model", "instance", "mode", "delay_ms", "duration_s"}
    extra = sorted(set(body) - allowed)
    if extra:
        raise _bad(extra[0], f"only the fields {', '.join(sorted(allowed))}", body[extra[0]])
    model = body.get("model")
    if not isinstance(model, str) or model not in instances:
        raise _bad("model", f"one of the served models ({', '.join(sorted(instances))})", model)
    instance = body.get("instance")
    n = instances[model]
    if instance is not None and (isinstance(instance, bool) or not isinstance(instance, int) or not 0 <= instance < n):
        raise _bad("instance", f"an instance index of '{model}' from 0 to {n - 1}, or no field for all", instance)
    mode = body.get("mode")
    if mode not in MODES:
        raise _bad("mode", "one of " + ", ".join(repr(m) for m in MODES), mode)
    delay_ms = 0.0
    if mode == "slow":
        delay_ms = check_number("delay_ms", body.get("delay_ms"), 0.0, MAX_DELAY_MS, when="for mode 'slow'")
    elif "delay_ms" in body:
        raise _bad("delay_ms", "no delay_ms except for mode 'slow'", body["delay_ms"])
    duration_s = None
    if body.get("duration_s") is not None:
        if mode == "off":
            raise _bad("duration_s", "no duration_s for mode 'off'", body["duration_s"])
        duration_s = check_number("duration_s", body["duration_s"], MIN_DURATION_S, MAX_DURATION_S)
    return FaultRequest(model, instance, mode, delay_ms, duration_s)


class FaultBoard:
    """Every instance's fault state, by model: what the admin API reads and writes."""

    def __init__(self, states: Iterable[InstanceFault], loop: asyncio.AbstractEventLoop | None = None) -> None:
        """`loop`: the one `apply` runs on (the admin API's), where a timer drops each fault with a duration at
        its end and logs it; None: dropped only as a read on the loop finds it ended, maybe never (no GET,
        no /events, no scrape), its end then never logged."""
        self.states: dict[str, list[InstanceFault]] = {}
        for s in states:
            self.states.setdefault(s.model, []).append(s)
        for lst in self.states.values():
            lst.sort(key=lambda s: s.instance)
        self._loop = loop
        self._ends: dict[InstanceFault, asyncio.TimerHandle] = {}  # by instance: the timer at its fault's end

    @property
    def instances(self) -> dict[str, int]:
        return {m: len(lst) for m, lst in self.states.items()}

    def apply(self, req: FaultRequest, now: float | None = None, *, wall: float | None = None) -> list[dict]:
        """Set (or clear) the fault of the instances the request names; returns the new state.

        `now`: the time.monotonic() instant its deadline counts from; `wall`: the Unix time its shown
        `until` counts from.
        """
        now = time.monotonic() if now is None else now
        fault = None
        if req.mode != "off":
            until = deadline = None
            if req.duration_s is not None:
                until = (time.time() if wall is None else wall) + req.duration_s
                deadline = now + req.duration_s
            fault = Fault(req.mode, req.delay_ms, until, deadline, req.duration_s)
        targets: Sequence[InstanceFault] = self.states[req.model]
        if req.instance is not None:
            targets = [targets[req.instance]]
        for s in targets:
            s.set(fault)
            # The replaced fault's: left, it stayed on the loop (up to MAX_DURATION_S) for a fault long gone.
            end = self._ends.pop(s, None)
            if end is not None:
                end.cancel()
            if fault is not None and fault.deadline is not None and self._loop is not None:
                self._arm(s, fault)
        return self.active(now)

    def close(self) -> None:
        """Cancel every timer at a fault's end, and arm none from now on: the server stops, and nothing it
        scheduled may be left on its loop."""
        self._loop = None
        for end in self._ends.values():
            end.cancel()
        self._ends.clear()

    def _arm(self, s: InstanceFault, fault: Fault) -> None:
        self._ends[s] = self._loop.call_later(max(0.0, fault.deadline - time.monotonic()), self._end, s, fault)

    def _end(self, s: InstanceFault, fault: Fault) -> None:
        del self._ends[s]
        if s.current(forget=True) is fault:  # the loop's clock ran ahead (uvloop's fires up to 1 ms early)
            self._arm(s, fault)

    def active(self, now: float | None = None) -> list[dict]:
        now = time.monotonic() if now is None else now
        return [d for lst in self.states.values() for s in lst if (d := s.describe(now)) is not None]

    def gauge(self) -> list[tuple[str, int, str, int]]:
        """(model, instance, mode, 1 if active else 0) for every instance and fault mode."""
        out = []
        now = time.monotonic()
        for lst in self.states.values():
            for s in lst:
                f = s.current(now, forget=True)
                out.extend((s.model, s.instance, m, int(f is not None and f.mode == m)) for m in ACTIVE_MODES)
        return out
