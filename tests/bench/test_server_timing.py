"""`wok bench ramp --server-timing`: every latency split into the server's stages and the rest."""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from wok.bench import analysis
from wok.bench.runner import Ramp, RampConfig
from wok.bench.workers import WorkerPool
from wok.servertiming import TIMING_COLUMNS, TIMING_PARTS, TIMING_STAGES

from .conftest import METRICS

TIMED = "test_each_answer_is_split_into_the_servers_stages_and_the_time_outside"


@pytest.fixture(scope="module", autouse=True)
def _timing_server_starting(request, start_server_module):
    """The server that sends the trailer, started in the background as the module begins if its
    test is selected: its start (mostly a process's imports) overlaps the module's other tests,
    which come first (the run against the session's server, without the flag, judges no timing).
    Its own test, which does, runs last, once the start is over."""
    if not any(
        getattr(item, "module", None) is request.module and item.originalname == TIMED for item in request.session.items
    ):
        yield None
        return
    with ThreadPoolExecutor(1) as pool:
        yield pool.submit(start_server_module, "--models", "mlp", "--server-timing")


@pytest.fixture(scope="module")
def timing_server(_timing_server_starting):
    return _timing_server_starting.result()


def _ramp(target: str, steps, metrics_url=None, said=None, step_duration_s=1.0, warmup_s=0.5) -> dict:
    cfg = RampConfig(
        target=target,
        models=[("mlp", 1.0)],
        steps=steps,
        step_duration_s=step_duration_s,
        warmup_s=warmup_s,
        arrival="constant",
        metrics_url=metrics_url,
        server_timing=True,
    )
    return Ramp(cfg, progress=(said.append if said is not None else lambda _: None)).run()


def test_a_server_without_the_trailer_is_reported_not_guessed(server_process):
    sp = server_process  # the session's, run without the flag
    said: list[str] = []
    step = _ramp(sp.target, [100], said=said, step_duration_s=0.5, warmup_s=0.2)["steps"][0]
    t = step["server_timing"]
    assert t["requests"] == 0 and t["missing"] == step["ok"] > 0
    assert math.isnan(t["outside_ms"]["p50"])
    assert any("no server-timing trailer" in line and "--server-timing" in line for line in said), said


def test_server_timing_needs_unary_calls_on_one_channel():
    for kwargs in ({"rpc": "stream"}, {"balancer": "wok"}):
        with pytest.raises(ValueError, match="server timing needs unary calls on balancer grpc"):
            WorkerPool("127.0.0.1:1", [b""], 1, server_timing=True, **kwargs)


def test_the_summary_by_hand():
    nan = float("nan")
    latency = np.array([10.0, 20.0, 30.0, 40.0])
    stages = np.full((4, len(TIMING_PARTS)), nan)
    total = TIMING_PARTS.index("total")
    queue = TIMING_PARTS.index("queue")
    stages[:3, :] = 0.0
    stages[:3, total] = [5.0, 10.0, 15.0]
    stages[:3, queue] = [5.0, 10.0, 15.0]  # the rest 0: all of the server's time queued
    t = analysis.server_timing_summary(latency, stages)
    assert t["requests"] == 3 and t["missing"] == 1  # the fourth came without a trailer
    assert t["outside_ms"] == {"mean": 10.0, "p50": 10.0, "p99": 15.0}  # 5, 10, 15
    assert t["stages_ms"]["total"] == {"mean": 10.0, "p50": 10.0, "p99": 15.0}
    # The client's P99 of 10, 20, 30 (nearest rank) is 30: one request, outside 15, queue 15.
    assert t["tail"]["threshold_ms"] == 30.0 and t["tail"]["requests"] == 1
    assert t["tail"]["mean_ms"]["outside"] == 15.0 and t["tail"]["mean_ms"]["queue"] == 15.0
    # The histograms hold the three rows with a trailer (their compute 0 ms here).
    stages[:3, TIMING_PARTS.index("batch")] = [1.0, 2.0, 4.0]
    t = analysis.server_timing_summary(latency, stages)
    assert t["batch_histogram"]["count"] == 3 and t["batch_histogram"]["sum_ns"] == 7_000_000
    assert t["compute_histogram"]["count"] == 3 and t["compute_histogram"]["sum_ns"] == 0


def test_a_row_keeps_the_batchs_size_and_the_summary_counts_each_batchs_compute_once():
    from wok.bench.workers import _record_timing

    # Batches (compute ms, requests): a lone request (1.0, 1), a batch of 9 (9.0, 9), two batches of
    # 2 that took the same µs (2.0, 2: 4 requests), and a batch of 4 of which the window saw 2 (4.0).
    batches = [(1.0, 1, 1), (9.0, 9, 9), (2.0, 2, 4), (4.0, 4, 2)]  # (compute, n, requests seen)
    trailers = [
        f"total;dur={10 + c}, compute;dur={c:.3f}, batch_requests;desc={n}, batch_samples;desc={2 * n}"
        for c, n, seen in batches
        for _ in range(seen)
    ]
    rows = np.full((len(trailers) + 1, len(TIMING_COLUMNS)), np.nan)
    for i, value in enumerate(trailers):
        _record_timing(rows, i, (("server-timing", value),))
    _record_timing(rows, len(trailers), (("server-timing", "total;dur=11.0, compute;dur=50.0"),))  # no size
    assert rows[1, TIMING_COLUMNS.index("batch_requests")] == 9 and rows[1, TIMING_COLUMNS.index("batch_samples")] == 18
    latency = np.full(len(rows), 30.0)
    t = analysis.server_timing_summary(latency, rows)
    assert t["compute_histogram"]["count"] == 17  # per request: the batch of 9 is 9 of them
    per_batch = t["compute_batch_histogram"]
    assert per_batch["count"] == 5  # 1 + 1 + 2 + 1: each batch once, the one without a size left out
    assert per_batch["sum_ns"] == 1_000_000 * (1 + 9 + 2 * 2 + 4)
    # Rows of the parts alone (a caller from before the counts) or trailers without them: no such field.
    for old in (rows[:, : len(TIMING_PARTS)], rows[-1:]):
        assert "compute_batch_histogram" not in analysis.server_timing_summary(latency[: len(old)], old)


def test_a_trailer_that_does_not_parse_leaves_its_row_missing_not_the_call_failed():
    from wok.bench.runner import _timing_line
    from wok.bench.workers import _record_timing

    rows = np.full((3, len(TIMING_COLUMNS)), np.nan)
    _record_timing(rows, 0, (("server-timing", "queue;dur=oops, total;dur=1.0"),))
    _record_timing(rows, 1, (("other", "x"),))
    _record_timing(rows, 2, (("server-timing", "queue;dur=2.5, total;dur=3.0"),))
    assert np.isnan(rows[0]).all() and np.isnan(rows[1]).all()
    assert rows[2, TIMING_PARTS.index("queue")] == 2.5 and rows[2, TIMING_PARTS.index("total")] == 3.0
    assert np.isnan(rows[2, TIMING_PARTS.index("compute")])  # a part the trailer did not carry
    assert np.isnan(rows[2, TIMING_COLUMNS.index("batch_requests")])  # nor its batch's size (an older server)
    # A step without one successful answer says so, not that the server lacks the flag.
    empty = analysis.server_timing_summary(np.zeros(0), np.zeros((0, len(TIMING_PARTS))))
    assert empty["requests"] == empty["missing"] == 0
    assert _timing_line(empty) == "no successful answer to split"


def test_each_answer_is_split_into_the_servers_stages_and_the_time_outside(timing_server):
    sp = timing_server
    metrics_url = next(m.group(1) for line in sp.log if (m := METRICS.search(line)))
    said: list[str] = []
    result = _ramp(sp.target, [100, 300], metrics_url, said)
    for step in result["steps"]:
        t = step["server_timing"]
        assert t["missing"] == 0 and t["requests"] == step["ok"] > 0, t
        st = t["stages_ms"]
        parts = sum(st[s]["mean"] for s in TIMING_STAGES if s != "total")
        assert math.isclose(parts, st["total"]["mean"], abs_tol=0.005), st
        # outside = client latency − server total, request by request: so also on average.
        assert math.isclose(t["outside_ms"]["mean"], step["latency_ms"]["mean"] - st["total"]["mean"], abs_tol=1e-6)
        assert 0 < t["outside_ms"]["p50"] < step["latency_ms"]["p50"]
        # The same requests as the server's own end-to-end histogram over the window (its
        # sum / count is exact): the two means agree up to the window's edges.
        assert math.isclose(st["total"]["mean"], step["server"]["e2e_ms"]["mean"], rel_tol=0.1), (st, step["server"])
        assert t["tail"]["requests"] >= 1 and t["tail"]["threshold_ms"] == step["latency_ms"]["p99"]
        assert t["outside_histogram"]["count"] == t["compute_histogram"]["count"] == t["requests"]
        assert t["batch_histogram"]["count"] == t["requests"]
        # Each trailer said its batch's size: every batch counted once, so no more than the requests.
        assert 0 < t["compute_batch_histogram"]["count"] <= t["requests"], t
        # The batch stage holds the compute, request by request: its histogram's sum is the larger.
        assert t["batch_histogram"]["sum_ns"] >= t["compute_histogram"]["sum_ns"] > 0, t
        # Each column is its own part: the trailer's compute is the server's compute histogram's
        # (per request, over the same window), and longer than the hop (start), which a swap of the
        # two would reverse. Not by a fixed factor: on a slow, loaded host the worker thread's
        # wake-up (the hop) reached half a batch's compute (0.53 against 1.06 ms) in one CI run.
        assert math.isclose(st["compute"]["mean"], step["stages_ms"]["compute"], rel_tol=0.1), (st, step["stages_ms"])
        assert st["compute"]["p50"] > st["start"]["p50"], st
    # 100 QPS at a constant pace, 10 ms apart, and mlp's 5 ms window: each request waits
    # out its own window alone (not a share of another's, under 5 ms, nor two, 10 ms). The
    # upper bound leaves the loop 1 ms of lateness: a CI run on a loaded 2-core host read 5.502.
    queue = result["steps"][0]["server_timing"]["stages_ms"]["queue"]
    assert 4.9 <= queue["p50"] <= 6.0, queue
    assert any("the slowest 1 %" in line for line in said), said
