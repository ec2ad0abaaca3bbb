"""The host's share of a send's lag (workers.HostShare), by hand-derived cases: what
`late_sends_own` takes off each lag before it judges the generator."""

from __future__ import annotations

import math

import pytest

from wok.bench.workers import HostShare

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
