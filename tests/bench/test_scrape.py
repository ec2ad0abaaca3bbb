"""bench/scrape.py: quantiles from two scrapes of real prometheus_client histograms, and when a
P99 is only the histogram's last finite bound."""

from __future__ import annotations

import json
import math

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from wok.bench.scrape import (
    BATCH,
    E2E,
    FLUSHES,
    LOOP_LAG,
    STAGE,
    Snapshot,
    beyond_last_bound,
    histogram_quantile,
    parse_exposition,
    scrape,
    server_view,
)

from .conftest import WEB_PAGE, serving

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


def test_the_server_views_counts_are_ints():
    """Prometheus text writes every sample as a float: a result read `"requests": 102.0`,
    `"flush_reasons": {"delay": 80.0}`, `"samples": 189.0`."""
    registry = CollectorRegistry()
    e2e = Histogram(E2E, "e2e", ["model"], registry=registry)
    batch = Histogram(BATCH, "rows", ["model"], buckets=(1, 4, 16), registry=registry)
    flushes = Counter(FLUSHES, "flushes", ["model", "reason"], registry=registry)
    lag = Histogram(LOOP_LAG, "lag", registry=registry)
    e2e.labels("m").observe(0.01)  # before the window
    before = parse_exposition(generate_latest(registry).decode())
    for _ in range(102):
        e2e.labels("m").observe(0.01)
    for i in range(80):
        batch.labels("m").observe(1 + i % 2)
        flushes.labels("m", "delay" if i < 60 else "size").inc()
    for _ in range(189):
        lag.observe(0.001)
    view = server_view(before, parse_exposition(generate_latest(registry).decode()), "m")
    counts = {
        "requests": view["requests"],
        "batches": view["batches"],
        "delay": view["flush_reasons"]["delay"],
        "size": view["flush_reasons"]["size"],
        "samples": view["loop_lag_ms"]["samples"],
    }
    assert counts == {"requests": 102, "batches": 80, "delay": 60, "size": 20, "samples": 189}
    assert all(type(v) is int for v in counts.values()), counts
    text = json.dumps(view)
    assert '"requests": 102,' in text and '"delay": 60,' in text and '"samples": 189,' in text
    assert view["mean_batch_size"] == pytest.approx(1.5)


def test_a_count_that_is_not_whole_is_refused():
    def snap(requests: float) -> Snapshot:
        return Snapshot({(E2E + "_count", (("model", "m"),)): requests, (E2E + "_sum", (("model", "m"),)): 1.0})

    whole = r"^wok_request_duration_seconds_count: expected a whole count over the window; got 2\.5$"
    with pytest.raises(ValueError, match=whole):
        server_view(snap(1.0), snap(3.5), "m")


def test_a_mixs_server_view_sums_its_models():
    """A mixed-model ramp showed no server column, not even the server-wide loop lag: the view
    sums the mix's models' series (another model's are left out), and the loop lag is the server's."""
    registry = CollectorRegistry()
    e2e = Histogram(E2E, "e2e", ["model"], buckets=(0.1, 1.0), registry=registry)
    stage = Histogram(STAGE, "stage", ["model", "stage"], buckets=(0.1, 1.0), registry=registry)
    batch = Histogram(BATCH, "rows", ["model"], buckets=(1, 4, 16), registry=registry)
    flushes = Counter(FLUSHES, "flushes", ["model", "reason"], registry=registry)
    lag = Histogram(LOOP_LAG, "lag", buckets=(0.001, 0.01), registry=registry)
    for m in ("a", "b", "other"):
        e2e.labels(m).observe(0.05)  # before the window
    before = parse_exposition(generate_latest(registry).decode())
    for m, count, queue_s, rows in (("a", 60, 0.05, 2), ("b", 40, 0.5, 4), ("other", 100, 0.9, 16)):
        for _ in range(count):
            e2e.labels(m).observe(queue_s)
            stage.labels(m, "queue").observe(queue_s)
        for _ in range(count // rows):
            batch.labels(m).observe(rows)
            flushes.labels(m, "size").inc()
    for _ in range(10):
        lag.observe(0.005)
    view = server_view(before, parse_exposition(generate_latest(registry).decode()), ["a", "b"])
    assert view["models"] == ["a", "b"]
    assert view["requests"] == 100
    assert view["queue_ms"]["mean"] == pytest.approx(1e3 * (60 * 0.05 + 40 * 0.5) / 100)
    # Rank 99 of 100: 60 ≤ 0.1 s, 40 in (0.1, 1]: 0.1 + 0.9 · 39 / 40 s.
    assert view["queue_ms"]["p99"] == pytest.approx(1e3 * (0.1 + 0.9 * 39 / 40))
    assert (view["batches"], view["mean_batch_size"], view["flush_reasons"]) == (40, 2.5, {"size": 40})
    assert view["loop_lag_ms"]["samples"] == 10 and view["loop_lag_ms"]["max_bound"] == pytest.approx(10.0)
    # A model of the mix with no series yet adds nothing; none of them with one: no view.
    absent = server_view(before, parse_exposition(generate_latest(registry).decode()), ["a", "b", "c"])
    assert (absent["requests"], absent["models"]) == (100, ["a", "b"])  # the models summed
    assert server_view(before, before, ["c", "d"]) is None


def test_the_server_view_counts_the_calls_ended_before_woks_handler():
    """wok_calls_ended_before_handler_total: calls the server saw end before its handler ran, in
    no other counter. The window's growth, an int, the server's whatever the model; null from a
    server that does not export it."""
    registry = CollectorRegistry()
    e2e = Histogram(E2E, "e2e", ["model"], registry=registry)
    ended = Counter("wok_calls_ended_before_handler", "ended", ["method"], registry=registry)
    e2e.labels("m").observe(0.01)
    ended.labels("ModelInfer").inc(3)  # before the window
    before = parse_exposition(generate_latest(registry).decode())
    # None completed in the window, 7 ended before the handler: an overloaded server's end of a call.
    ended.labels("ModelInfer").inc(7)
    idle = server_view(before, parse_exposition(generate_latest(registry).decode()), "m")
    assert idle == {"requests": 0, "ended_before_handler": 7} and type(idle["ended_before_handler"]) is int
    for _ in range(4):
        e2e.labels("m").observe(0.01)
    view = server_view(before, parse_exposition(generate_latest(registry).decode()), ["m", "other"])
    assert (view["requests"], view["models"], view["ended_before_handler"]) == (4, ["m"], 7)
    assert '"ended_before_handler": 7,' in json.dumps(view)

    bare = CollectorRegistry()  # a server without the counter
    Histogram(E2E, "e2e", ["model"], registry=bare).labels("m").observe(0.01)
    text = generate_latest(bare).decode()
    assert server_view(parse_exposition(text), parse_exposition(text), "m") == {
        "requests": 0,
        "ended_before_handler": None,
    }


def test_a_url_that_answers_no_prometheus_text_gives_no_snapshot():
    """A web page at --metrics-url (a wrong port, a proxy's page): the parser's ValueError escaped
    scrape() and ended the thread that scraped (a soak's RSS sampler, a step's window scrapes) with a
    traceback; it gives no snapshot (read_metrics says why)."""
    with serving(*WEB_PAGE) as url:
        assert scrape(url) is None
