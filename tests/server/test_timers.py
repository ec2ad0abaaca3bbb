"""wok.timers: the flush timer fires at its instant, never before it, on both event loops.

Each wait gates on the callback's own event; times are read with time.perf_counter(), the
clock the timer is armed on. The lateness bound (a median over many firings, so one scheduling
hiccup of a busy machine does not decide it) is the tolerance docs/performance.md states, judged on
the firings during which the loop's thread never waited for a CPU (its run-queue time did not grow):
beside busy processes a thread woken at its instant waits out their time slice, milliseconds that
are the host's, not the timer's. The `loop.call_at` fallback (no timerfd) is held to "never early"
only: its lateness is the loop's.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from collections.abc import Callable

import pytest

import wok.timers
from wok.bench.workers import RunQueueClock
from wok.timers import PreciseSleeper, PreciseTimer

LOOPS = ("asyncio", "uvloop")
LATE_MEDIAN_S = 0.5e-3  # the stated tolerance: half the loops' own 1 ms timer granularity
# LATENESS: the tests marked `serial` (run alone, after the parallel pass: tests/conftest.py) hold the median lateness
# to LATE_MEDIAN_S, judged on the firings whose thread never waited for a CPU: beside a second worker too few may be,
# and the test skips, the check not made. Or they need the loop to run an early timer within the 100 ms before its
# instant (the early-loop fallback's steps). The others hold each firing to "never early" and check which instant
# fired (instants 1 s apart told apart), what a loaded loop only delays.


async def _fire_many(n: int, precise: bool, had_cpu: bool = False) -> tuple[list[float], list[float], list[bool], bool]:
    """Arm and await the timer `n` times, or (`had_cpu`) until `n` firings had their CPU, at most 10 × n:
    (armed instants, firing times, whether the loop's thread waited for a CPU between each arming and its
    callback (False where the kernel does not say), precise)."""
    loop = asyncio.get_running_loop()
    runq = RunQueueClock()  # this thread's, the loop's
    fired: list[float] = []
    at_fire: list[float] = []
    event = asyncio.Event()

    def callback() -> None:
        fired.append(time.perf_counter())
        at_fire.append(runq())
        event.set()

    timer = PreciseTimer(loop, callback, precise=precise)
    armed: list[float] = []
    waited: list[bool] = []
    precise = timer.precise
    try:
        for i in range(10 * n if had_cpu else n):
            if had_cpu and waited.count(False) >= n:
                break
            event.clear()
            before = runq()
            # Instants off the millisecond grid: 1.3, 2.6, 3.9 ms ahead, …
            at = time.perf_counter() + 1e-3 * (1 + (i % 7) * 1.3)
            armed.append(at)
            timer.arm(at)
            await asyncio.wait_for(event.wait(), 5)
            waited.append(at_fire[-1] > before)
    finally:
        timer.close()
        runq.close()
    return armed, fired, waited, precise


@pytest.mark.serial  # (see LATENESS)
@pytest.mark.skipif(sys.platform != "linux", reason="the timerfd is Linux's")
@pytest.mark.parametrize("loop", LOOPS)
def test_the_timer_fires_once_per_arming_never_before_its_instant_and_within_the_tolerance(run_on, loop):
    armed, fired, waited, precise = run_on(loop, _fire_many(40, precise=True, had_cpu=True))
    assert precise
    assert len(fired) == len(armed)
    late = [f - a for a, f in zip(armed, fired)]
    assert min(late) >= 0, f"fired {-1e3 * min(late):.3f} ms before its instant"
    judged = [x for x, w in zip(late, waited) if not w]
    if len(judged) < 40:
        pytest.skip(
            f"the loop's thread waited for a CPU in {waited.count(True)} of {len(waited)} firings: too busy a host"
        )
    assert statistics.median(judged) <= LATE_MEDIAN_S, f"median lateness {1e3 * statistics.median(judged):.3f} ms"


@pytest.mark.parametrize("loop", LOOPS)
def test_the_call_at_fallback_fires_once_per_arming_never_before_its_instant(run_on, loop):
    """uvloop's own timer runs up to about 1 ms early (whole ms on a cached ms clock); the
    fallback waits out the rest rather than calling back early."""
    armed, fired, _, precise = run_on(loop, _fire_many(40, precise=False))
    assert not precise
    assert len(fired) == 40
    late = [f - a for a, f in zip(armed, fired)]
    assert min(late) >= 0, f"fired {-1e3 * min(late):.3f} ms before its instant"


@pytest.mark.parametrize("loop", LOOPS)
def test_the_sleeper_without_a_timerfd_never_returns_before_its_instant(run_on, loop, monkeypatch):
    monkeypatch.setattr(wok.timers, "_same_clock", lambda: False)  # what a platform without timerfd gets

    async def scenario():
        sleeper = PreciseSleeper()
        precise = sleeper.precise
        early = []
        try:
            for i in range(40):
                at = time.perf_counter() + 1e-4 * (5 + i % 13)  # 0.5-1.7 ms ahead, off the ms grid
                await sleeper.until(at)
                early.append(at - time.perf_counter())
        finally:
            sleeper.close()
        return precise, early

    arms = []
    call_at = wok.timers.PreciseTimer._call_at
    monkeypatch.setattr(wok.timers.PreciseTimer, "_call_at", lambda self, at: arms.append(at) or call_at(self, at))
    precise, early = run_on(loop, scenario())
    assert not precise
    assert max(early) <= 0, f"returned {1e3 * max(early):.3f} ms before its instant"
    # Waiting out an early firing must not spin: uvloop made a re-arm under 1 ms a 0 ms timer,
    # early again, and one sleep re-armed up to 260 times.
    assert len(arms) <= 3 * 40, f"{len(arms)} armings for 40 sleeps"


@pytest.mark.parametrize("precise", (True, False), ids=("timerfd", "call_at"))
@pytest.mark.parametrize("loop", LOOPS)
def test_rearming_replaces_the_instant_and_disarming_cancels_it(run_on, loop, precise):
    async def scenario():
        loop_ = asyncio.get_running_loop()
        calls: list[float] = []
        event = asyncio.Event()

        def callback():
            calls.append(time.perf_counter())
            event.set()

        timer = PreciseTimer(loop_, callback, precise=precise)
        try:
            now = time.perf_counter()
            timer.arm(now + 0.002)
            timer.disarm()
            # Replaced by 4 ms: a full second, so that a loop kept from a CPU for 50 ms (one read 1 in 1,700 runs
            # beside two busy loops) is not taken for the first instant kept.
            timer.arm(now + 1.0)
            timer.arm(now + 0.004)
            await asyncio.wait_for(event.wait(), 5)
            first = list(calls)
            # Disarmed before its instant: never fires. A later arming, gated on, proves time passed.
            timer.arm(time.perf_counter() + 0.003)
            timer.disarm()
            event.clear()
            after = time.perf_counter() + 0.010
            timer.arm(after)
            await asyncio.wait_for(event.wait(), 5)
        finally:
            timer.close()
        return now, first, calls, after

    now, first, calls, after = run_on(loop, scenario())
    assert len(first) == 1 and now + 0.004 <= first[0] < now + 1.0
    assert len(calls) == 2 and calls[1] >= after


@pytest.mark.parametrize("precise", (True, False), ids=("timerfd", "call_at"))
@pytest.mark.parametrize("loop", LOOPS)
def test_an_instant_already_past_fires_on_the_next_pass(run_on, loop, precise):
    async def scenario():
        event = asyncio.Event()
        timer = PreciseTimer(asyncio.get_running_loop(), event.set, precise=precise)
        try:
            timer.arm(time.perf_counter() - 1.0)
            assert not event.is_set()  # never inside arm
            await asyncio.wait_for(event.wait(), 5)
        finally:
            timer.close()

    run_on(loop, scenario())


SLEEPS_JUDGED = 29  # the sleeper's lateness median is taken over this many sleeps


@pytest.mark.serial  # (see LATENESS)
@pytest.mark.parametrize("loop", LOOPS)
def test_the_sleeper_returns_at_or_after_each_instant(run_on, loop):
    """On a schedule 0.7 ms apart, as the bench paces its sends. Every return is at or after its
    instant; the lateness median is judged on the sleeps that slept (their instant still ahead when
    called: one already past returns at once, late by whatever held the caller) and during which the
    loop's thread never waited for a CPU (its run-queue time did not grow). A busy host's time slice
    made a sleep, and the dozen past instants behind it, milliseconds late whatever the sleeper did."""

    async def scenario():
        sleeper = PreciseSleeper()
        precise = sleeper.precise
        runq = RunQueueClock()  # this thread's, the loop's
        targets, woke, judged = [], [], []
        try:
            start = time.perf_counter()
            while judged.count(True) < SLEEPS_JUDGED and len(targets) < 30 * SLEEPS_JUDGED:
                at = start + 1e-3 * (len(targets) + 1) * 0.7
                targets.append(at)
                before, ahead = runq(), at > time.perf_counter()
                await sleeper.until(at)
                woke.append(time.perf_counter())
                judged.append(ahead and not runq() > before)  # NaN (not reported): judged
            await sleeper.until(start)  # past: returns at once
        finally:
            sleeper.close()
            runq.close()
        return targets, woke, judged, precise

    targets, woke, judged, precise = run_on(loop, scenario())
    late = [w - t for t, w in zip(targets, woke)]
    assert precise == (sys.platform == "linux")
    assert min(late) >= 0 or not precise
    slept = [x for x, j in zip(late, judged) if j]
    if len(slept) < SLEEPS_JUDGED:
        pytest.skip(f"{len(slept)} of {len(late)} sleeps slept on the timer with their CPU: too busy a host")
    assert statistics.median(slept) <= LATE_MEDIAN_S or not precise, [f"{1e3 * x:.3f}" for x in slept]


class _EarlyLoop(asyncio.SelectorEventLoop):
    """A loop whose timers run halfway to their instant: the fallback meets an early firing on
    every arming, and `on_call_at(callback)` sees each scheduling, its re-arms included."""

    def __init__(self) -> None:
        super().__init__()
        self.on_call_at: Callable[[object], None] = lambda callback: None

    def call_at(self, when, callback, *args, context=None):
        self.on_call_at(callback)
        return super().call_at(when - max(when - self.time(), 0) / 2, callback, *args, context=context)


@pytest.mark.serial  # (see LATENESS)
def test_the_fallback_on_an_early_loop_fires_once_after_its_instant_and_disarm_rearm_close_still_hold():
    """Each step acts while the timer waits out the rest (about 100 ms of it), after its first
    early firing: what a busy machine delays is when that lands, not whether the step was in time."""

    async def scenario():
        loop = asyncio.get_running_loop()
        calls: list[float] = []
        fired = asyncio.Event()
        rearmed = asyncio.Event()  # the timer's loop timer ran early and it scheduled the rest
        schedulings = 0

        def callback():
            calls.append(time.perf_counter())
            fired.set()

        timer = PreciseTimer(loop, callback, precise=False)
        probe = PreciseTimer(loop, fired.set, precise=False)

        def on_call_at(cb):
            nonlocal schedulings
            if cb == timer._fire:
                schedulings += 1
                if schedulings >= 2:
                    rearmed.set()

        async def arm_and_wait_for_the_early_firing(at: float) -> None:
            nonlocal schedulings
            schedulings = 0
            rearmed.clear()
            fired.clear()
            timer.arm(at)
            await asyncio.wait_for(rearmed.wait(), 5)

        loop.on_call_at = on_call_at
        result = {}
        try:
            # Fires once, at or after its instant, though every loop timer under it ran early. A loop kept
            # from a CPU past the instant (10 ms after its early timer) runs that timer late, not early,
            # and nothing is re-armed: then it is armed again, each arming held to the same.
            for _ in range(20):
                calls.clear()
                fired.clear()
                schedulings = 0
                at = time.perf_counter() + 0.020
                timer.arm(at)
                await asyncio.wait_for(fired.wait(), 5)
                assert len(calls) == 1 and calls[0] >= at, f"fired {1e3 * (at - calls[0]):.3f} ms before its instant"
                if schedulings >= 2:
                    break
            assert schedulings >= 2  # the loop did run its timer early, and the rest was re-armed

            # Disarmed: never fires; a later arming, gated on, proves its instant passed.
            dropped = time.perf_counter() + 0.200
            await arm_and_wait_for_the_early_firing(dropped)
            timer.disarm()
            later = dropped + 0.010
            timer.arm(later)
            await asyncio.wait_for(fired.wait(), 5)
            result["disarmed"] = (later, list(calls))

            # Re-armed: the new instant replaces it.
            replaced = time.perf_counter() + 0.200
            await arm_and_wait_for_the_early_firing(replaced)
            moved = replaced + 0.010
            timer.arm(moved)
            await asyncio.wait_for(fired.wait(), 5)
            result["rearmed"] = (moved, list(calls))

            # Closed: never fires; a probe timer armed past its instant, gated on, proves it passed.
            closed = time.perf_counter() + 0.200
            await arm_and_wait_for_the_early_firing(closed)
            timer.close()
            probe.arm(closed + 0.010)
            await asyncio.wait_for(fired.wait(), 5)
            result["closed"] = list(calls)
        finally:
            timer.close()
            probe.close()
        return result

    with asyncio.Runner(loop_factory=_EarlyLoop) as runner:
        result = runner.run(scenario())
    later, calls = result["disarmed"]
    assert len(calls) == 2 and calls[1] >= later, "the disarmed instant fired"
    moved, calls = result["rearmed"]
    assert len(calls) == 3 and calls[2] >= moved, "the replaced instant fired"
    assert len(result["closed"]) == 3, "the closed timer fired"
