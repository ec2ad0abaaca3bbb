"""The naive time-stepped simulation (kept for docs/simulate.md) shows the two faults it is kept for."""

from __future__ import annotations

import pytest

from wok.bench.simulate import BatcherModel
from wok.bench.simulate_naive import event_driven, markdown, naive_time_stepped

MD1 = BatcherModel(alpha_s=0.0, beta_s=1e-3, max_batch_size=1, max_queue_delay_s=0.0)


def test_one_arrival_per_tick_caps_the_offered_rate():
    # 3,000 QPS offered with a 1 ms tick: every tick has an arrival, and no more: 1,000/s.
    naive = naive_time_stepped(3000, 5.0, MD1, tick_s=1e-3)
    assert naive["arrived_qps"] == 1000
    assert event_driven(3000, 5.0, MD1)["arrived_qps"] == pytest.approx(3000, rel=0.03)


def test_batches_overlap_on_one_device_so_latency_never_grows():
    # 2,000 QPS against a 1,000 QPS device: the naive run serves all of it, busy 200 % of the
    # time, every request in exactly T = 1 ms; the event-driven one saturates at 1,000/s.
    naive = naive_time_stepped(2000, 5.0, MD1, tick_s=0.5e-3)
    assert naive["device_busy"] == pytest.approx(2.0) and naive["p99_ms"] == pytest.approx(1.0)
    exact = event_driven(2000, 5.0, MD1)
    assert exact["device_busy"] <= 1.0 and exact["achieved_qps"] == pytest.approx(1000, rel=0.01)
    assert exact["p99_ms"] > 1000  # the queue grows for the whole step


def test_the_docs_table_renders():
    text = markdown(duration_s=1.0)
    assert text.count("| offered QPS |") == 2 and "200%" in text
