"""The ramp's parts that need no server: its arithmetic on hand-made arrays, its settings' checks and
its run-queue clock. Apart from tests/bench/test_ramp.py, whose timed ramps against real servers run in
the serial pass: these run in the parallel one, their bounds held beside two CPU hogs (the clock's test
makes its own contention, and more of it only adds to the wait it must see)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import pytest

from wok.bench import analysis
from wok.bench.runner import RampConfig, _littles_law_edges, _mean_inflight, timeline_series
from wok.bench.workers import RunQueueClock


@pytest.mark.skipif(not os.path.exists("/proc/thread-self/schedstat"), reason="the kernel reports no run-queue time")
def test_the_run_queue_clock_counts_a_wait_for_a_cpu_and_not_a_sleep():
    """late_sends_own takes a send's run-queue wait off its lag: a pause of the generator's own
    (a sleep) must not read as the host's, a CPU held by another process must."""
    clock = RunQueueClock()
    t0 = clock()
    time.sleep(0.2)
    assert clock() - t0 < 0.1  # only the wake-up's wait for a CPU, if any
    # This thread and a busy loop pinned to one CPU: each runs about half the time, waits the rest.
    cpus = os.sched_getaffinity(0)
    cpu = min(cpus)
    hog = subprocess.Popen(
        [sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{cpu}}}); print(flush=True)\nwhile 1: pass"],
        stdout=subprocess.PIPE,
    )
    try:
        hog.stdout.readline()  # pinned, and about to spin
        os.sched_setaffinity(0, {cpu})
        t0, end = clock(), time.monotonic() + 0.4
        while time.monotonic() < end:
            pass
        waited = clock() - t0
    finally:
        os.sched_setaffinity(0, cpus)
        hog.kill()
        hog.wait()
        clock.close()
    assert waited > 0.1, waited


def test_the_in_flight_mean_is_the_time_average_of_the_count_in_the_window():
    # By hand: a worker's count is 1 on [0, 0.5), then 0; window [0, 2): 0.5 / 2.
    assert _mean_inflight([np.array([[0.0, 1], [0.5, 0]])], 0.0, 2.0).tolist() == [0.25]
    # Samples before the window set its first value: 1 on [2, 3), 0 on [3, 4).
    assert _mean_inflight([np.array([[0.0, 3], [1.0, 1], [3.0, 0]])], 2.0, 4.0).tolist() == [0.5]
    # The last count holds to the window's end; workers add up; one that sent nothing adds 0.
    two = [np.array([[0.0, 2]]), np.array([[1.5, 1], [2.5, 0]]), np.empty((0, 2))]
    assert _mean_inflight(two, 1.0, 3.0).tolist() == [(2 * 2.0 + 1 * 1.0) / 2.0]
    assert _mean_inflight([np.empty((0, 2))], 0.0, 1.0).size == 0


def test_the_edges_owe_lambda_w_what_it_counts_outside_the_window():
    # By hand, window [1, 3) (2 s): earlier calls A [0.5, 1.5) and B [0.2, 0.8); the window's
    # calls C [1.2, 1.4), D [2.8, 3.6), E sent late past the end [3.1, 3.3), F never sent.
    sent = np.array([0.5, 0.2, 1.2, 2.8, 3.1, np.nan])
    done = np.array([1.5, 0.8, 1.4, 3.6, 3.3, np.nan])
    keep = np.array([False, False, True, True, True, True])
    # D's 0.6 s and E's 0.2 s after the end; A's 0.5 s inside the window.
    assert _littles_law_edges(sent, done, keep, 1.0, 3.0) == pytest.approx(
        {"late_edge": 0.8 / 2, "early_edge": 0.5 / 2}
    )
    # The in-flight count, as a worker records it: 1 on [1, 1.2), 2 on [1.2, 1.4), 1 on [1.4,
    # 1.5), 0 on [1.5, 2.8), 1 on [2.8, 3): L = 0.9 / 2. λW: C, D, E whole, 1.2 s over 2 s = 0.6.
    events = sorted([(t, +1) for t in sent[:5]] + [(t, -1) for t in done[:5]])
    samples = np.array([[t, c] for (t, _), c in zip(events, np.cumsum([d for _, d in events]))])
    L = _mean_inflight([samples], 1.0, 3.0)
    assert L.tolist() == pytest.approx([0.45])
    step = analysis.step_result(
        offered_qps=2.0,
        duration_s=2.0,
        intended_s=sent[keep] - 1.0,
        sent_s=sent[keep] - 1.0,
        done_s=done[keep] - 1.0,
        codes=np.array(["OK", "OK", "OK", "CANCELLED"]),
        inflight_samples=L,
    )
    # λW − L = 0.6 − 0.45 = 0.4 − 0.25: the edges account for all of a relative error of 33 %.
    assert step["littles_law"]["lambda_w"] == pytest.approx(0.6)
    assert step["littles_law"]["relative_error"] == pytest.approx(0.15 / 0.45)


def test_the_timeline_counts_every_request_once_an_answer_on_a_whole_second_too():
    # By hand, two steps (seconds from the first one's start): an OK answer lands on 3.0 exactly, the
    # ramp's last; 13 (DEADLINE_EXCEEDED) and 14 (UNAVAILABLE) are errors, intended but not achieved.
    # The bins ran to ceil(3.0) = 3, so the last answer, on the bin [3, 4), was in none.
    first = (np.array([0.2, 0.5, 0.9]), np.array([0.3, 1.5, 1.0]), np.array([0.1, 1.0, 0.1]), np.array([0, 0, 13]))
    second = (np.array([1.25, 2.5]), np.array([1.5, 3.0]), np.array([0.25, 0.5]), np.array([14, 0]))
    tl = timeline_series([first, second])
    assert tl == {
        "t_s": [0, 1, 2, 3],
        "offered": [3, 1, 1, 0],
        "achieved": [1, 1, 0, 1],
        "p99_ms": [100.0, 1000.0, None, 500.0],
    }
    # Every request intended once, every OK answer achieved once.
    assert sum(tl["offered"]) == 5 and sum(tl["achieved"]) == 3
    assert timeline_series([]) is None


def test_start_at_settings_are_checked():
    base = dict(target="x:1", models=[("mlp", 1.0)], steps=[1], step_duration_s=1.0)
    with pytest.raises(ValueError, match=r"start_at: expected a Unix time in seconds \(> 0\); got -1"):
        RampConfig(**base, start_at=-1)
    with pytest.raises(ValueError, match="start_at does not go with refine"):
        RampConfig(**base, start_at=time.time(), refine=2)
    with pytest.raises(ValueError, match=r"step_gap_s: expected seconds in \[0, 3600\); got -1"):
        RampConfig(**base, start_at=time.time(), step_gap_s=-1)
