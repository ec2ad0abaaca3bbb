"""The host's share of a send's lag (workers.HostShare), by hand-derived cases: what
`late_sends_own` takes off each lag before it judges the generator."""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import pytest

from wok.bench.workers import HostShare, SendHostShare

MS = 1e-3


def _shares(intended_ms, sent_ms, waited_ms):
    share = HostShare()
    return [round(share(i * MS, (s - i) * MS, w * MS) / MS, 6) for i, s, w in zip(intended_ms, sent_ms, waited_ms)]


def test_a_stall_of_the_host_explains_every_send_due_during_it():
    """Sends due every 0.5 ms; the sender waits 9 ms for a CPU from 0.5 ms on, then sends the six
    due by then at once (the wait read at the first of them, 0 at the others). Each is late by the
    stall's rest: none is the generator's own (the wait read once counted only the first)."""
    intended = [0.5, 1.0, 1.5, 2.0, 2.5, 3.0]
    sent = [10.0, 10.02, 10.04, 10.06, 10.08, 10.10]
    waited = [9.0, 0, 0, 0, 0, 0]
    shares = _shares(intended, sent, waited)
    # 9 ms, then 9 − 0.5 per step: the stall's part still due at each.
    assert shares == [9.0, 8.5, 8.0, 7.5, 7.0, 6.5]
    own = [(s - i) - h for i, s, h in zip(intended, sent, shares)]
    assert max(own) == pytest.approx(0.6)  # 0.5 ms after its intended time, + 0.1 of sending: on time


def test_a_pause_of_the_generators_own_is_not_the_hosts():
    """No wait for a CPU (a blocking call, a sleep in the sender): every ms of the lag is its own."""
    assert _shares([1.0, 2.0, 3.0], [4.0, 4.1, 4.2], [0, 0, 0]) == [0.0, 0.0, 0.0]


def test_a_share_is_at_most_the_lag_and_a_wait_between_sends_due_apart_is_not_carried():
    # A wait of 5 ms while nothing was due: the send after it is on time, its share its lag (0.2 ms).
    # The next, 10 ms later, owes nothing to it.
    assert _shares([10.0, 20.0], [10.2, 22.0], [5.0, 0.0]) == [0.2, 0.0]


def test_an_unknown_wait_is_an_unknown_share_and_starts_afresh():
    share = HostShare()
    assert share(0.0, 0.009, 0.009) == pytest.approx(0.009)
    assert math.isnan(share(0.001, 0.008, math.nan))
    assert share(0.002, 0.007, 0.0) == 0.0  # nothing carried past the unknown one


def test_what_both_senders_record_is_the_share_of_the_run_queue_waits_between_their_sends():
    """SendHostShare, what the unary and the stream sender record per send (Outcome.host_lag): the
    stall case above, its waits as a run-queue clock reads them (cumulative, seconds) before the
    first send and at each. The stream sender recorded nothing (its host_lag None)."""
    readings = iter([2.0, 2.009, 2.009, 2.009, 2.009, 2.009, 2.009])
    share = SendHostShare(clock=lambda: next(readings))
    intended = [0.5, 1.0, 1.5, 2.0, 2.5, 3.0]
    sent = [10.0, 10.02, 10.04, 10.06, 10.08, 10.10]
    got = [round(share(i * MS, s * MS) / MS, 6) for i, s in zip(intended, sent)]
    assert got == _shares(intended, sent, [9.0, 0, 0, 0, 0, 0]) == [9.0, 8.5, 8.0, 7.5, 7.0, 6.5]
    unknown = iter([0.0, math.nan, 0.001])
    share = SendHostShare(clock=lambda: next(unknown))
    assert math.isnan(share(0.0, 0.005))
    assert math.isnan(share(0.001, 0.006))  # a wait from an unknown reading is unknown too


def test_a_senders_share_read_on_another_thread_than_its_own_raises():
    """The run-queue clock reads the wait of the thread that opened it: a share read elsewhere would
    charge the sender another thread's waits (or none)."""
    share = SendHostShare(clock=lambda: 0.0)
    with ThreadPoolExecutor(1) as pool, pytest.raises(RuntimeError, match="thread"):
        pool.submit(share, 0.0, 0.001).result()
    assert share(0.0, 0.001) == 0.0  # on its own thread
