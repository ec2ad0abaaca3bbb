"""The server view of the replicas a bench starts (`--replicas` with `--metrics-url auto`, bench/scrape.py's
Fleet): each replica's own /metrics scraped at both edges of a window and summed, a replica restarted in the
window counted from its restart, a replica not scraped leaving the step without a view; and the runs that
record their replicas (`replicas`), which `wok bench merge` then refuses to merge with others."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from wok.bench.faults import ReplicaSet
from wok.bench.scrape import (
    E2E,
    START_TIME,
    Fleet,
    Snapshot,
    fleet_window,
    histogram_quantile,
    parse_exposition,
    server_view,
)

pytestmark = pytest.mark.timeout(180)
SERVE = ["--models", "mlp", "--torch-threads", "1"]
BENCH = [sys.executable, "-m", "wok", "bench", "ramp", "--serve-args", " ".join(SERVE), "--workers", "1"]
RUNS = {
    # A ramp of two replicas, its server columns summed over them.
    "ramp": ["--replicas", "2", "--steps", "30,60", "--step-duration", "1s", "--warmup", "0.3s"],
    # A soak of one replica: it records its replicas as the ramp does.
    "soak": ["--replicas", "1", "--steps", "20", "--step-duration", "0.5s", "--capacity", "20", "--soak", "1s"],
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The two `wok bench ramp` runs, started at once (most of each is its replicas starting): name → (the
    finished process, its result file)."""

    def run(name: str):
        out = tmp_path_factory.mktemp(name) / "r.json"
        cmd = [*BENCH, *RUNS[name], "--slo-p99", "1s", "--json", str(out)]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=150), out

    with ThreadPoolExecutor(2) as pool:
        futures = {name: pool.submit(run, name) for name in RUNS}
        return {name: f.result() for name, f in futures.items()}


@pytest.fixture(scope="module")
def fleet():
    """Two replicas, serving, for the module's Fleet tests (the first of which restarts replica 1)."""
    replicas = ReplicaSet(2, SERVE)
    try:
        yield replicas
    finally:
        replicas.close()


def _send(replicas: ReplicaSet, i: int, n: int) -> None:
    from wok.clients import Client

    with Client(replicas[i].target) as client:
        for _ in range(n):
            client.infer("mlp", {"INPUT0": np.ones((1, 256), np.float32)})


def _own(before: Snapshot, after: Snapshot, name: str) -> dict[float, float]:
    """A histogram's buckets over a window as one replica's own series say: grown by, or (`before` empty) all."""
    earlier = dict(before.buckets(name, model="mlp"))
    return {le: c - earlier.get(le, 0.0) for le, c in after.buckets(name, model="mlp")}


def test_a_replica_restarted_in_the_window_counts_from_its_restart(fleet):
    """Replica 1 restarts inside a window, then is down as the next opens and starts in it: each window's
    view sums replica 0's growth and, of replica 1, what its new process counted (Prometheus' increase()),
    checked against the requests sent and the replicas' own end-to-end histograms summed. Taking replica 1's
    after − before, as for a replica that ran through, read 4 + 2 + 5 − (7 + 9) requests."""
    said = []
    scraper = Fleet([f"{r.admin_url}/metrics" for r in fleet], said.append)
    _send(fleet, 0, 3)
    _send(fleet, 1, 7)  # before the window: in no figure
    before = scraper.scrape()
    _send(fleet, 0, 4)
    _send(fleet, 1, 9)  # died with its process: in no figure
    fleet.restart(1)
    _send(fleet, 1, 5)
    _send(fleet, 0, 2)
    after = scraper.scrape()
    view = scraper.view(before, after, "mlp", "step 1/2")
    assert view is not None, said
    assert view["requests"] == 4 + 2 + 5 and view["replicas"] == [0, 1] and view["resets"] == [1], view
    (b0, _), (a0, a1) = before[1], after[1]
    own = _own(b0, a0, E2E)
    for le, c in _own(Snapshot(), a1, E2E).items():
        own[le] += c
    assert own[float("inf")] == 11
    assert view["e2e_ms"]["p99"] == pytest.approx(1e3 * histogram_quantile(0.99, sorted(own.items())))
    batches = a0.get("wok_batch_size_count", model="mlp") - b0.get("wok_batch_size_count", model="mlp")
    assert view["batches"] == batches + a1.get("wok_batch_size_count", model="mlp")
    assert [line.startswith("step 1/2: replica 1's counters reset in the window") for line in said] == [True]

    # Down as the next window opens, and started in it: all its new process counted is that window's.
    # Launched at once (it waited 1.05 s, past the whole second a start time read early by before 2026-12-06).
    fleet[1].kill()
    before = scraper.scrape()
    fleet[1].launch()
    fleet[1].wait_ready(120)
    _send(fleet, 1, 6)
    _send(fleet, 0, 1)
    view = scraper.view(before, scraper.scrape(), "mlp", "step 2/2")
    assert view is not None and view["requests"] == 7 and view["resets"] == [1], (view, said)
    assert scraper.warnings() == [
        "replica 1 restarted in the window of step 1/2, step 2/2: its server figures there count from its "
        "restart (what it completed before, in that window, is in none)"
    ]


def test_a_replica_not_scraped_leaves_the_step_without_a_view(fleet):
    """Never the scraped replicas' sum shown as the fleet's: the step's view is None, and both the line
    said and the result's warning name the replica that was not scraped."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/metrics"  # closed once the block ends: nothing listens
    said = []
    scraper = Fleet([f"{fleet[0].admin_url}/metrics", dead], said.append)
    before = scraper.scrape()
    _send(fleet, 0, 2)
    assert scraper.view(before, scraper.scrape(), "mlp", "step 3/3") is None
    assert said == [
        f"step 3/3: no server view: replica 1 ({dead}: no answer) not scraped; the step's server columns are `-`"
    ]
    assert scraper.warnings() == [
        f"replica 1's /metrics ({dead}) could not be scraped in step 3/3: no server view there (the server columns "
        "`-`), since the other replicas' figures alone are not the fleet's"
    ]


def test_the_fleets_gauges_are_summed_or_the_largest():
    """The queue depths and batches in flight add up to the fleet's; a GPU gauge is the largest reading (the
    replicas of one host read the same devices); counters add up, their `_created` timestamps never."""

    def exposition(depth: float, util: float, flushes: float) -> Snapshot:
        """A scrape of a registry holding the three (as prometheus_client writes it: `_created` too)."""
        registry = CollectorRegistry()
        Gauge("wok_queue_depth", "depth", ["model"], registry=registry).labels("mlp").set(depth)
        Gauge("wok_gpu_utilization_ratio", "util", ["gpu"], registry=registry).labels("0").set(util)
        Counter("wok_batch_flushes", "flushes", ["model", "reason"], registry=registry).labels("mlp", "size").inc(
            flushes
        )
        return parse_exposition(generate_latest(registry).decode())

    pairs = [(exposition(9, 0.1, 10), exposition(3, 0.5, 14)), (exposition(0, 0.0, 2), exposition(2, 0.7, 7))]
    window, reset = fleet_window(pairs)
    assert window.get("wok_queue_depth", model="mlp") == 5 and window.get("wok_gpu_utilization_ratio", gpu="0") == 0.7
    assert window.get("wok_batch_flushes_total", model="mlp", reason="size") == 4 + 5 and reset == []
    assert any(name.endswith("_created") for name, _ in pairs[0][1].values)
    assert not any(name.endswith("_created") for name, _ in window.values)
    # A counter lower than before is a restart: its value after is its growth.
    window, reset = fleet_window([pairs[0], (exposition(0, 0.0, 20), exposition(0, 0.0, 6))])
    assert window.get("wok_batch_flushes_total", model="mlp", reason="size") == 4 + 6 and reset == [1]
    assert server_view(Snapshot(), window, "mlp") is None  # no request series: no view, as for one server


def _replica(started: float | None, **requests: int) -> Snapshot:
    """A replica's scrape: its start time (None: not exported) and each model's end-to-end histogram."""
    registry = CollectorRegistry()
    if started is not None:
        Gauge(START_TIME, "start", registry=registry).set(started)
    e2e = Histogram(E2E, "e2e", ["model"], buckets=(0.01,), registry=registry)
    for model, n in requests.items():
        for _ in range(n):
            e2e.labels(model).observe(0.001)
    return parse_exposition(generate_latest(registry).decode())


def test_a_series_gone_while_its_replica_ran_on_leaves_the_step_without_a_view():
    """A series that went, its process the same (the start time unchanged), was taken as a restart: the
    window counted the other series' whole totals since the replica's start (here 500 requests for 10). wok's
    series never go while its process runs; a /metrics behind a proxy may drop one, and its growth is unknown."""
    said = []
    scraper = Fleet(["http://a/metrics", "http://b/metrics"], said.append)
    before = (0.0, [_replica(100.0, mlp=40), _replica(100.0, mlp=500, recsys=3)])
    after = (1.0, [_replica(100.0, mlp=45), _replica(100.0, mlp=505)])
    assert scraper.view(before, after, "mlp", "step 1/1") is None
    why = (
        'replica 1: wok_request_duration_seconds_bucket{le="0.01",model="recsys"} (and 3 more) went between the '
        "scrapes while its process ran on (start time 100.00 at both): what it grew by is unknown, and a wok's "
        "series never go (a proxy's /metrics?)"
    )
    assert said == [f"step 1/1: no server view: {why}; the step's server columns are `-`"]
    assert scraper.warnings() == [f"no server view in step 1/1: {why}"]
    # Restarted (another start time), or no start time to tell: its series after count from its restart.
    for started in (101.0, None):
        after = (1.0, [_replica(100.0, mlp=45), _replica(started, mlp=7)])
        view = scraper.view(before, after, "mlp", "step 1/1")
        assert view is not None and view["requests"] == 5 + 7 and view["resets"] == [1], (started, view)


def test_a_ramp_of_replicas_has_their_server_columns_summed(runs):
    """`--replicas 2` with `--metrics-url auto` (the default): every step has a server view summed over both
    replicas, and the table shows its columns; they were `-` ("the replicas started have no one /metrics")."""
    proc, out = runs["ramp"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert [r["replica"] for r in result["replicas"]] == [0, 1] == [r["replica"] for r in result["faults"]["replicas"]]
    urls = [f"{r['admin_url']}/metrics" for r in result["replicas"]]
    assert result["config"]["replica_metrics"] == urls and result["config"]["metrics_url"] is None
    assert f"server-side columns summed over the replicas' /metrics: {', '.join(urls)}" in proc.stderr
    for step in result["steps"]:
        server = step["server"]
        assert server is not None and server["replicas"] == [0, 1] and server["resets"] == [], step
        # The server counts what it completed in the window, the client what it intended in it: a few apart.
        assert abs(server["requests"] - step["ok"]) <= 0.2 * step["ok"] + 3, (server["requests"], step["ok"])
        assert step["queue_ms"]["p99"] is not None and step["mean_batch_size"] >= 1
    rows = [line.split() for line in proc.stdout.splitlines() if line.split()[:1] in (["30"], ["60"])]
    assert len(rows) == 2 and all(row[7] != "-" and row[9] != "-" for row in rows), proc.stdout


def test_a_soak_of_replicas_records_them_and_does_not_merge_with_another(runs, tmp_path, wok_cli):
    """A soak with `--replicas` recorded its replicas nowhere, so two such soaks merged as one server's load."""
    proc, out = runs["soak"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["soak"] is not None and [r["replica"] for r in result["replicas"]] == [0]
    assert result["steps"][0]["server"]["replicas"] == [0]
    second = tmp_path / "b.json"
    second.write_text(json.dumps({**result, "config": {**result["config"], "seed": 1}}))
    status, _, err = wok_cli("bench", "merge", str(out), str(second), "--json", str(tmp_path / "m.json"))
    assert status == 2 and f"{out} (1 replica), {second} (1 replica): each started the servers it ramped" in err
    assert not (tmp_path / "m.json").exists()
