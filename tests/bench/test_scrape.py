"""bench/scrape.py: quantiles from two scrapes of real prometheus_client histograms, and when a
P99 is only the histogram's last finite bound."""

from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from wok.bench.scrape import E2E, STAGE, beyond_last_bound, histogram_quantile, parse_exposition, server_view

INF = math.inf


def test_quantile_inside_a_bucket_and_past_the_last_bound():
    # 100 observations: 50 ≤ 0.1 s, 48 more ≤ 1 s, 0.5 more ≤ 60 s (cumulative counts), the rest past 60 s.
    buckets = [(0.1, 50.0), (1.0, 98.0), (60.0, 98.5), (INF, 100.0)]
    # P50: rank 50 lands exactly on the first bucket's count: its bound.
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.1)
    # P97: rank 97, inside (0.1, 1]: 0.1 + 0.9 · (97 − 50) / 48.
    assert histogram_quantile(0.97, buckets) == pytest.approx(0.1 + 0.9 * 47 / 48)
    assert not beyond_last_bound(0.97, buckets)
    # P99: rank 99 lies in +Inf: all the histogram can give is 60 s, a floor.
    assert histogram_quantile(0.99, buckets) == 60.0
    assert beyond_last_bound(0.99, buckets)
    assert not beyond_last_bound(0.99, []) and not beyond_last_bound(0.99, [(1.0, 0.0), (INF, 0.0)])


def test_the_server_view_flags_a_p99_past_the_last_bound():
    registry = CollectorRegistry()
    e2e = Histogram(E2E, "e2e", ["model"], buckets=(0.1, 1.0, 60.0), registry=registry)
    stage = Histogram(STAGE, "stage", ["model", "stage"], buckets=(0.1, 1.0, 60.0), registry=registry)
    e2e.labels("m").observe(0.05)  # before the window
    before = parse_exposition(generate_latest(registry).decode())
    for _ in range(97):
        e2e.labels("m").observe(0.05)
        stage.labels("m", "queue").observe(0.05)
        stage.labels("m", "compute").observe(0.05)
    for _ in range(3):  # 3 % of the window's requests waited past the last bound
        e2e.labels("m").observe(100.0)
        stage.labels("m", "queue").observe(100.0)
        stage.labels("m", "compute").observe(0.5)
    view = server_view(before, parse_exposition(generate_latest(registry).decode()), "m")
    assert view["requests"] == 100
    assert view["e2e_ms"]["p99"] == pytest.approx(60_000.0) and view["e2e_ms"]["p99_over_last_bound"]
    assert view["stages_p99_over_last_bound"] == ["queue"]
    # compute's P99: rank 99 of 100, 97 ≤ 0.1 s and 3 in (0.1, 1]: 0.1 + 0.9 · 2 / 3 s.
    assert view["stages_p99_ms"]["compute"] == pytest.approx(1e3 * (0.1 + 0.9 * 2 / 3))
