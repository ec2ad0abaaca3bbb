"""bench/balancer_overhead.py: its arithmetic on hand-made runs, and a short run end to end."""

from __future__ import annotations

import json

import pytest

from wok.bench import balancer_overhead as bo

pytestmark = pytest.mark.timeout(120)


def test_summary_of_one_run():
    # 100 calls of 1..100 ms: nearest rank P50 is the 50th (50 ms), P99 the 99th (99 ms);
    # 0.5 s of CPU for 100 calls is 5,000 µs a call; 100 calls in 2 s are 50 a second.
    latencies = [i / 1e3 for i in range(100, 0, -1)]
    before = {"hedges": 3, "attempts": 10}
    after = {"hedges": 5, "attempts": 112}
    m = bo.summarize("wok", latencies, 0.5, 2.0, before, after)
    assert m == {
        "kind": "wok",
        "requests": 100,
        "client_cpu_us_per_request": pytest.approx(5000.0),
        "throughput_rps": pytest.approx(50.0),
        "p50_ms": pytest.approx(50.0),
        "p99_ms": pytest.approx(99.0),
        "hedges": 2,
        "attempts": 102,
    }
    assert "hedges" not in bo.summarize("grpc", latencies, 0.5, 2.0, None, None)
    cpu = (("grpc", 100), ("grpc", 120), ("grpc", 90), ("wok", 130), ("wok", 110), ("wok", 150))
    runs = [{"kind": k, "client_cpu_us_per_request": c, "throughput_rps": 1, "p50_ms": 1, "p99_ms": 1} for k, c in cpu]
    assert bo.median_of(runs)["client_cpu_us_per_request"] == {"grpc": 100, "wok": 130}


def test_a_short_run_end_to_end(tmp_path):
    out = tmp_path / "overhead.json"
    assert bo.main(["--requests", "300", "--inflight", "8", "--rounds", "1", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["schema"] == "wok.balancer_overhead/1"
    assert [r["kind"] for r in doc["runs"]] == ["grpc", "wok"]
    assert all(r["requests"] == 300 and r["client_cpu_us_per_request"] > 0 for r in doc["runs"])
    assert doc["runs"][1]["attempts"] == 300 + doc["runs"][1]["hedges"]
    med = doc["median"]["client_cpu_us_per_request"]
    assert doc["wok_minus_grpc_cpu_us"] == pytest.approx(med["wok"] - med["grpc"])
