"""bench/faults.py: fault specs, the fault report on hand-built requests, the schedule against
a real `wok serve --admin` (the admin API of docs/ADMIN_API), and the command line's checks.

The replica kill/restart path runs end to end in tests/integration/test_replicas.py.
"""

from __future__ import annotations

import io
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from wok.bench import faults as bench_faults
from wok.bench import report
from wok.bench.faults import (
    EXPIRY_MARGIN_S,
    Action,
    At,
    FaultSchedule,
    Forker,
    Replica,
    ReplicaSet,
    _p99_ms,
    fault_report,
    get_faults,
    not_in_effect,
    parse_at,
    parse_fault,
    post_fault,
    print_faults,
)
from wok.bench.runner import status_name
from wok.ports import bind_error

from ..conftest import write_python_model

pytestmark = pytest.mark.timeout(120)


# Servers shared by the module's real runs (a start costs seconds). Every test that turns a fault on
# leaves it off again (its `off`, the ramp's end, or its expiry, which that test waits out), so the
# next test finds the server as started.
@pytest.fixture(scope="module")
def admin_server(start_server_module, server_process_start):
    """The module's own server with --admin, its start-up beside the session's (plain_server), where that has not
    begun yet."""
    server_process_start()
    return start_server_module("--models", "mlp", "--admin", "--torch-threads", "1")


@pytest.fixture(scope="module")
def plain_server(bench_server):
    """The session's server. No --admin: the admin paths are refused, and so every fault asked of it, which leaves
    it as it was; the ramps against it read no metrics (--metrics-url none)."""
    return bench_server


# The tests of a ramp against the plain server, whose slow fault is refused (no --admin), and the
# options of their ramps beyond the fault.
REFUSED_RAMPS = {
    "test_a_stream_ramp_records_retries_off_although_asked_for": ["--rpc", "stream"],
    "test_a_ramp_whose_fault_was_refused_says_so_and_exits_4": [],
}


@pytest.fixture(scope="module")
def refused_ramps(request, plain_server, tmp_path_factory) -> dict:
    """The ramps of REFUSED_RAMPS' selected tests, run at once (each is mostly a process's imports)
    and to their end, as the first of those tests begins: test name -> a done future of (the run,
    its JSON's path). Each test judges only its own run (no server counters), and the fault each
    ramp asks for is refused, so the plain server is left as it was."""
    selected = {item.originalname for item in request.session.items if getattr(item, "module", None) is request.module}

    def ramp(name: str) -> tuple[subprocess.CompletedProcess, Path]:
        out = tmp_path_factory.mktemp("ramp") / "r.json"
        server = plain_server
        cmd = [sys.executable, "-m", "wok", "bench", "ramp", "--target", server.target, "--metrics-url", "none"]
        cmd += ["--steps", "50", "--step-duration", "0.5s", "--warmup", "0s", "--workers", "1", "--json", str(out)]
        cmd += [*REFUSED_RAMPS[name], "--admin-url", server.http_url()]
        cmd += ["--fault", "slow:model=mlp,delay=50ms,at=10%"]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=100), out

    with ThreadPoolExecutor(2) as pool:
        return {name: pool.submit(ramp, name) for name in REFUSED_RAMPS if name in selected}


NO_METRICS, REPLICA_SET = "replica_without_metrics", "replica_set"


@pytest.fixture(scope="module")
def replicas(request):
    """The replica without metrics and the replica set that the module's selected tests use, started
    at once (each start is mostly a process's imports), each its one test's own. Not autouse: made
    by the first of those tests, so that no start overlaps the module's other tests. Two at once, as
    the admin and the session's servers: more at once gained nothing on a 2-core host, the starts
    being CPU-bound."""
    items = [item for item in request.session.items if getattr(item, "module", None) is request.module]
    needed = {name for item in items for name in getattr(item, "fixturenames", ()) if name in (NO_METRICS, REPLICA_SET)}
    ready: dict = {}
    try:
        if NO_METRICS in needed:
            # Launched in this (main) thread: a replica forked from a pool thread would get its
            # death signal as that thread ends (see Forker). Only its wait runs in the pool.
            ready[NO_METRICS] = Replica(0, ["--models", "mlp", "--torch-threads", "1", "--no-metrics", "--admin"])
            ready[NO_METRICS].launch()
        with ThreadPoolExecutor(2) as pool:
            waits = {name: pool.submit(ready[name].wait_ready, 120) for name in ready}
            if REPLICA_SET in needed:  # it forks from a thread of its own (its Forker): made in the pool
                waits[REPLICA_SET] = pool.submit(ReplicaSet, 1, ["--models", "mlp", "--torch-threads", "1"])
        if REPLICA_SET in waits and not waits[REPLICA_SET].exception():
            ready[REPLICA_SET] = waits[REPLICA_SET].result()
        for wait in waits.values():
            wait.result()
        yield ready
    finally:  # each test stops its own; one whose test did not run stops here
        if NO_METRICS in ready:
            ready[NO_METRICS].kill()
        if REPLICA_SET in ready and ready[REPLICA_SET].forker._thread.is_alive():
            ready[REPLICA_SET].close()


@pytest.fixture(scope="module")
def replica_without_metrics(replicas) -> Replica:
    """Serving (waited for): its one test's own, which kills it."""
    return replicas[NO_METRICS]


@pytest.fixture(scope="module")
def replica_set(replicas) -> ReplicaSet:
    """One replica, serving: its one test's own, which restarts it and closes the set."""
    return replicas[REPLICA_SET]


OK, INTERNAL, UNAVAILABLE = 0, 13, 14


# -- specs --------------------------------------------------------------------------------


def test_parse_kill_pause_slow_fail():
    kill = parse_fault("kill:replica=1,at=30%,restart=60%")
    assert (kill.kind, kill.replica, kill.at, kill.until) == ("kill", 1, At(0.3, True), At(0.6, True))
    assert not kill.server_side and kill.text == "kill:replica=1,at=30%,restart=60%"
    pause = parse_fault("pause:at=2s,resume=5s")
    assert (pause.kind, pause.replica, pause.at, pause.until) == ("pause", 0, At(2.0, False), At(5.0, False))
    slow = parse_fault("slow:model=mlp,delay=50ms,at=10%,until=20%,instance=1")
    assert (slow.model, slow.delay_ms, slow.instance, slow.replica) == ("mlp", 50.0, 1, None) and slow.server_side
    fail = parse_fault("fail:model=mlp,at=40%")
    assert (fail.kind, fail.until, fail.delay_ms) == ("fail", None, None)
    assert parse_at("25%", "at").seconds(20.0) == 5.0 and parse_at("1.5s", "at").seconds(20.0) == 1.5


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("crash:at=1s", "expected kill:, pause:, slow: or fail:"),
        ("kill:replica=1", "at=... is required"),
        ("kill:at=30%,delay=5ms", "'delay=5ms': expected KEY=VALUE"),
        ("kill:at=30%,at=40%", "at given twice"),
        ("kill:at=60%,restart=30%", "must end after it starts"),
        ("kill:at=30%,restart=60%,until=70%", "give one end"),
        ("kill:at=130%", "from 0% to 100%"),
        ("kill:at=soon", "expected a percentage of the ramp"),
        ("kill:replica=-1,at=1s", "expected an integer >= 0"),
        # isdigit() takes "²" (superscript two); int() refused it with its own bare ValueError.
        ("kill:replica=\N{SUPERSCRIPT TWO},at=1s", "replica='²': expected an integer >= 0"),
        ("slow:at=1s,delay=5ms", "model=NAME is required"),
        ("slow:model=mlp,at=1s", "delay=DURATION is required"),
        ("slow:model=mlp,delay=120s,at=1s", "delay='120s': expected above 0 and at most 60s"),  # the server's cap
        ("slow:model=mlp,delay=0ms,at=1s", "delay='0ms': expected above 0"),
    ],
)
def test_bad_specs_say_what_is_wrong(spec, says):
    with pytest.raises(ValueError, match="--fault") as err:
        parse_fault(spec)
    assert says in str(err.value)


# -- the report ---------------------------------------------------------------------------


def hand_case():
    """18 requests in 0.5 s windows (hand count in the tests below)."""
    rows = [  # (intended s, latency ms, code)
        (0.1, 10, OK),
        (0.2, 20, OK),  # w0: good
        (0.55, 30, OK),
        (0.7, 10, UNAVAILABLE),  # w1: a lost request
        (1.1, 200, OK),
        (1.2, 10, OK),  # w2: P99 200 ms > SLO 100 ms
        (1.6, 10, OK),
        (1.7, 5, INTERNAL),  # w3: 1 error in 2 > 1 %
    ] + [(2.0 + 0.5 * k + 0.1 * j, 10 + 10 * j, OK) for k in range(5) for j in range(2)]  # w4-w8: good
    intended = np.array([r[0] for r in rows])
    latency = np.array([r[1] for r in rows]) / 1e3
    codes = np.array([r[2] for r in rows], dtype=np.int16)
    return intended, intended + latency, latency, codes


EVENTS = [
    {"t_s": 0.6, "fault": 0, "action": "kill", "replica": 1},
    {"t_s": 1.0, "fault": 0, "action": "restart", "replica": 1},
    {"t_s": 1.8, "fault": 0, "action": "ready", "replica": 1},
]


def test_fault_report_by_hand():
    intended, done, latency, codes = hand_case()
    spec = parse_fault("kill:replica=1,at=5%,restart=10%")
    r = fault_report(
        intended, done, latency, codes, specs=[spec], events=EVENTS, slo_p99_ms=100.0, end_s=4.5, n_replicas=3
    )
    assert r["requests"] == {"sent": 18, "ok": 16, "errors": 1, "lost": 1}
    assert r["errors_by_code"] == {"INTERNAL": 1, "UNAVAILABLE": 1}
    assert r["lost_by_code"] == {"UNAVAILABLE": 1}
    tl = r["timeline"]
    assert tl["t_s"] == [0.5 * k for k in range(9)]
    assert tl["sent"] == [2] * 9 and tl["lost"] == [0, 1] + [0] * 7 and tl["errors"] == [0, 0, 0, 1] + [0] * 5
    assert tl["p99_ms"][:4] == pytest.approx([20, 30, 200, 10])
    assert tl["good"] == [True, False, False, False, True, True, True, True, True]
    assert tl["replicas_up"] == [3, 2, 2, 2, 3, 3, 3, 3, 3]  # ready at 1.8 counts from the window at 2.0
    (f,) = r["faults"]
    assert (f["start_s"], f["restart_s"], f["end_s"]) == (0.6, 1.0, 1.8)
    # before [0, 0.6): 10, 20, 30 ms; during [0.6, 1.8): one lost, 200, 10, 10 ms ok, one INTERNAL;
    # after [1.8, 4.5): ten ok at 10 and 20 ms.
    assert (f["sent_before"], f["sent_during"], f["sent_after"]) == (3, 5, 10)
    assert f["p99_before_ms"] == pytest.approx(30) and f["p99_during_ms"] == pytest.approx(200)
    assert f["p99_after_ms"] == pytest.approx(20)
    assert (f["lost_before"], f["lost_during"], f["lost_after"]) == (0, 1, 0)
    assert f["errors_during"] == {"INTERNAL": 1, "UNAVAILABLE": 1} and f["errors_after"] == {}
    # The fault starts in w1; w1-w3 are bad, w4-w7 (2 s) good: recovered at 2.0 s, 1.4 s after the
    # kill and 0.2 s after the replica was ready again.
    assert f["recovery_s"] == pytest.approx(1.4) and f["breached_slo"] is True
    assert f["recovered_after_end_s"] == pytest.approx(0.2)
    json.dumps(r)  # plain JSON


def test_never_sent_requests_are_counted_apart():
    """A request of a cut step never sent (workers.NOT_SENT: done NaN) was no part of the load, as in
    analysis.step_result: counted in `requests.not_sent`, never as lost or an error, in no window."""
    from wok.bench.workers import NOT_SENT

    intended, done, latency, codes = hand_case()
    # Two requests due after the cut, in w2 and past the last window: the figures stay the hand count's.
    intended = np.append(intended, [1.15, 4.7])
    done = np.append(done, [math.nan, math.nan])
    latency = np.append(latency, [math.nan, math.nan])
    codes = np.append(codes, np.array([NOT_SENT, NOT_SENT], dtype=np.int16))
    spec = parse_fault("kill:replica=1,at=5%,restart=10%")
    r = fault_report(intended, done, latency, codes, specs=[spec], events=EVENTS, slo_p99_ms=100.0, n_replicas=3)
    assert r["requests"] == {"sent": 18, "ok": 16, "errors": 1, "lost": 1, "not_sent": 2}
    assert r["errors_by_code"] == {"INTERNAL": 1, "UNAVAILABLE": 1} and r["lost_by_code"] == {"UNAVAILABLE": 1}
    tl = r["timeline"]
    # The windows end with the last request sent (4.1 s: 9 windows), not with one never sent at 4.7 s.
    assert tl["sent"] == [2] * 9 and tl["lost"] == [0, 1] + [0] * 7 and tl["errors"] == [0, 0, 0, 1] + [0] * 5
    (f,) = r["faults"]
    assert (f["sent_before"], f["sent_during"], f["sent_after"]) == (3, 5, 10)
    assert (f["lost_before"], f["lost_during"], f["lost_after"]) == (0, 1, 0)
    out = io.StringIO()
    print_faults({"config": {"retries": True, "rpc": "unary"}, "faults": r}, file=out)
    assert "18 sent, 16 ok, 1 errors, 1 lost (2 never sent, in no figure) (retries on" in out.getvalue()
    # Every request sent: no `not_sent` key, as a step's.
    assert "not_sent" not in fault_report(*hand_case(), specs=[], events=[], slo_p99_ms=100.0)["requests"]


def test_replicas_without_a_fault_print_no_fault_table():
    """--replicas alone has a faults section (the requests' line, lost ones counted) with no fault: the text printed
    a fault table with its head and no row, the HTML one too. Now the line alone; a run with a fault keeps its
    table."""
    r = fault_report(*hand_case(), specs=[], events=[], slo_p99_ms=100.0, n_replicas=2)
    result = {"config": {"retries": True, "rpc": "unary"}, "faults": r}
    out = io.StringIO()
    print_faults(result, file=out)
    printed = out.getvalue()
    assert printed.startswith("requests: 18 sent, 16 ok, 1 errors, 1 lost (retries on"), printed
    assert "faults (SLO" not in printed and "recovery s" not in printed and "┃" not in printed, printed
    html = report._faults_html(result)
    assert "18 sent, 16 ok, 1 errors, " in html and "<h3>Faults" not in html and 'class="faults"' not in html, html
    # Nor is the section, its figure or its caption about faults (until 2026-12-07 headed "Faults", the figure
    # "Faults: 1 lost of 18 requests", the caption naming the faults' events): the requests and the timeline.
    assert "<h2>Requests to the replicas</h2>" in html and "<h2>Faults" not in html
    assert "with each fault" not in html and "Dash-dot lines are the faults" not in html
    title = report.fault_timeline_figure(result).axes[0].get_title()
    assert title == "Requests to the replicas: 1 lost of 18", title
    spec = parse_fault("kill:replica=1,at=5%,restart=10%")
    faulted = {**result, "faults": fault_report(*hand_case(), specs=[spec], events=EVENTS, slo_p99_ms=100.0)}
    out = io.StringIO()
    print_faults(faulted, file=out)
    assert "faults (SLO P99 100 ms)" in out.getvalue() and "kill:replica=1" in out.getvalue(), out.getvalue()
    html = report._faults_html(faulted)
    assert "<h2>Faults</h2>" in html and "<h3>Faults (SLO P99 100 ms)</h3>" in html
    assert "with each fault" in html and "Dash-dot lines are the faults" in html
    assert report.fault_timeline_figure(faulted).axes[0].get_title() == "Faults: 1 lost of 18 requests"


def test_a_never_sent_request_with_a_completion_is_refused():
    from wok.bench.workers import NOT_SENT

    intended, done, latency, codes = hand_case()
    codes = codes.copy()
    codes[3] = NOT_SENT
    with pytest.raises(ValueError, match=r"request 3 has code NOT_SENT \(never sent\): expected a NaN completion"):
        fault_report(intended, done, latency, codes, specs=[], events=[], slo_p99_ms=100.0)


def test_never_recovered_and_never_happened():
    intended, done, latency, codes = hand_case()
    codes = codes.copy()
    codes[-1] = UNAVAILABLE  # the last window is bad: no 2 s of good windows after the fault
    done = done.copy()
    done[-3] = math.nan  # a request that never ended is lost too
    specs = [parse_fault("kill:replica=1,at=5%,restart=10%"), parse_fault("pause:replica=2,at=90%")]
    r = fault_report(
        intended, done, latency, codes, specs=specs, events=EVENTS, slo_p99_ms=100.0, end_s=4.5, n_replicas=3
    )
    assert r["requests"]["lost"] == 3 and r["lost_by_code"] == {"OK": 1, "UNAVAILABLE": 2}
    assert r["timeline"]["good"][-2:] == [False, False]
    first, second = r["faults"]
    assert first["recovery_s"] is None and first["breached_slo"] is True
    assert second["start_s"] is None and "did not happen" in second["note"]


def test_an_unharmed_run_recovers_at_once():
    intended = np.arange(0.05, 4.0, 0.1)
    latency = np.full(len(intended), 0.01)
    codes = np.zeros(len(intended), dtype=np.int16)
    events = [{"t_s": 1.0, "fault": 0, "action": "slow", "replica": 0}]
    r = fault_report(
        intended,
        intended + latency,
        latency,
        codes,
        specs=[parse_fault("slow:model=mlp,delay=1ms,at=25%")],
        events=events,
        slo_p99_ms=100.0,
        end_s=4.0,
    )
    (f,) = r["faults"]
    assert f["recovery_s"] == 0.0 and f["breached_slo"] is False and f["end_s"] is None
    assert r["timeline"]["replicas_up"] is None and "recovered_after_end_s" not in f


def test_p99_is_nearest_rank():
    """docs/bench-schema.md: the P99 of 100 requests is the 99th smallest, not the largest
    (numpy's method="higher" gave 100 ms here)."""
    assert _p99_ms(np.arange(1, 101) / 1e3) == pytest.approx(99.0)
    assert _p99_ms(np.arange(1, 201) / 1e3) == pytest.approx(198.0)  # ceil(0.99 × 200) = 198th
    assert _p99_ms(np.array([0.005])) == pytest.approx(5.0) and _p99_ms(np.array([])) is None
    intended = np.arange(100) / 200  # 100 requests in the first 0.5 s window
    latency = np.arange(1, 101) / 1e3
    codes = np.zeros(100, dtype=np.int16)
    r = fault_report(intended, intended + latency, latency, codes, specs=[], events=[], slo_p99_ms=99.5, end_s=0.5)
    assert r["timeline"]["p99_ms"] == [pytest.approx(99.0)] and r["timeline"]["good"] == [True]


def test_status_names_cover_the_lost_codes():
    assert [status_name(c) for c in (1, 4, 14, 2)] == ["CANCELLED", "DEADLINE_EXCEEDED", "UNAVAILABLE", "UNKNOWN"]


# -- the schedule against a real server's admin API ----------------------------------------


def wait_for(predicate, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_schedule_turns_a_server_fault_on_and_off(admin_server):
    server = admin_server
    url = server.http_url()
    spec = parse_fault("slow:model=mlp,delay=40ms,at=0.2s,until=0.6s")
    schedule = FaultSchedule([spec], planned_s=10.0, admin_urls=[url])
    seen: list[list[dict]] = []
    schedule.start(time.monotonic())
    wait_for(lambda: any(e["action"] == "slow" for e in schedule.events))
    seen.append(get_faults(url))
    wait_for(lambda: any(e["action"] == "off" for e in schedule.events))
    seen.append(get_faults(url))
    schedule.stop()
    assert [(f["model"], f["mode"], f["delay_ms"]) for f in seen[0]] == [("mlp", "slow", 40.0)]
    assert seen[1] == []
    events = schedule.sorted_events()
    assert [e["action"] for e in events] == ["slow", "off"] and all("error" not in e for e in events)
    assert 0.2 <= events[0]["t_s"] < 1.0 and 0.6 <= events[1]["t_s"] < 1.5
    # The fault was posted with an expiry: the rest of its window (to 0.6 s) plus the margin,
    # so that a bench that dies before its `off` leaves nothing on.
    posted = time.time() - (time.monotonic() - schedule._clock0) + events[0]["t_s"]  # Unix time of the POST
    assert seen[0][0]["until"] == pytest.approx(posted + 0.6 - events[0]["t_s"] + EXPIRY_MARGIN_S, abs=0.3)
    assert events[0]["expires_s"] == pytest.approx(0.6 + EXPIRY_MARGIN_S, abs=0.3)


def test_a_server_fault_without_an_end_keeps_a_planned_ramps_time_past_the_plan(admin_server):
    # It ends with the ramp, which an overloaded server can keep past its plan: its expiry is the
    # planned end plus the planned time again (3 s would cut it while the ramp still ran).
    server = admin_server
    url = server.http_url()
    schedule = FaultSchedule([parse_fault("fail:model=mlp,at=0.2s")], planned_s=10.0, admin_urls=[url])
    schedule.start(time.monotonic())
    try:
        wait_for(lambda: any(e["action"] == "fail" for e in schedule.events))
        (fault,) = get_faults(url)
    finally:
        schedule.stop()
    (event,) = [e for e in schedule.sorted_events() if e["action"] == "fail"]
    assert event["expires_s"] == pytest.approx(10.0 + 10.0, abs=0.3)
    assert fault["until"] - time.time() == pytest.approx(20.0 - event["t_s"], abs=1.0)
    assert get_faults(url) == []  # the ramp's end turned it off


def test_the_end_turns_off_only_the_faults_still_on(admin_server):
    """A fault turned off at its `until` is forgotten: the ramp's end posts no second `off`, which on
    a shared server (--admin-url) would clear a fault another client has set on the model since."""
    url = admin_server.http_url()
    spec = parse_fault("slow:model=mlp,delay=40ms,at=0s,until=0.1s")
    turned_off = threading.Event()

    def say(msg: str) -> None:
        if msg.startswith("fault: off"):  # said once the `off` at `until` succeeded
            turned_off.set()

    schedule = FaultSchedule([spec], planned_s=10.0, admin_urls=[url], say=say)
    schedule.start(time.monotonic())
    try:
        assert turned_off.wait(20), schedule.events
        post_fault(url, {"model": "mlp", "mode": "fail", "duration_s": 30})  # somebody else's
        schedule.stop()  # the ramp's end
        assert [(f["model"], f["mode"]) for f in get_faults(url)] == [("mlp", "fail")]
    finally:
        schedule.stop()
        post_fault(url, {"model": "mlp", "mode": "off"})
    assert [e["action"] for e in schedule.sorted_events()] == ["slow", "off"]


def test_a_fault_of_a_bench_killed_outright_expires(admin_server):
    """SIGKILL: no `off`, no cleanup. The fault goes away by itself at its expiry (it stayed on)."""
    server = admin_server
    url = server.http_url()
    cmd = [sys.executable, "-m", "wok", "bench", "ramp", "--target", server.target, "--metrics-url", "none"]
    cmd += ["--steps", "20", "--step-duration", "10s", "--warmup", "0s", "--workers", "1"]
    cmd += ["--admin-url", url, "--fault", "fail:model=mlp,at=0s,until=1s"]
    bench = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        for line in bench.stderr:
            if line.startswith("fault: fail"):
                break
        else:
            raise AssertionError(f"the bench ended (status {bench.wait()}) before its fault")
        killed_at = time.time()
        bench.kill()
        bench.wait(10)
    finally:
        bench.kill()
        bench.stderr.close()
    (fault,) = get_faults(url)
    assert fault["mode"] == "fail" and fault["until"] is not None
    assert fault["until"] <= killed_at + 1.0 + EXPIRY_MARGIN_S
    wait_for(lambda: get_faults(url) == [], timeout=fault["until"] - time.time() + 2.0)


def test_a_refused_server_fault_is_recorded_and_the_schedule_goes_on(plain_server):
    server = plain_server
    spec = parse_fault("fail:model=mlp,at=0s,until=0.1s")
    schedule = FaultSchedule([spec], planned_s=1.0, admin_urls=[server.http_url()])
    schedule.start(time.monotonic())
    wait_for(lambda: len(schedule.events) == 2)
    schedule.stop()
    fail, off = schedule.sorted_events()
    # Without --admin the admin paths answer 404 whatever the method, as the contract says (a POST
    # got 405 before the admin API came, a3031b4), and so, since e922221, does any path not served.
    # The error names the status and asks about --admin.
    assert re.search(r"/admin/faults: HTTP 404 \(is the server run with --admin\?\)", fail["error"])
    assert "/admin/faults: HTTP 404" in off["error"]


def test_ramp_with_server_faults_counts_errors_not_losses(admin_server, tmp_path):
    """slow then fail on one server through --admin-url: P99 during `slow` is at least its delay;
    `fail` answers INTERNAL, which is an error, never a lost request."""
    server = admin_server
    out = tmp_path / "r.json"
    cmd = [sys.executable, "-m", "wok", "bench", "ramp", "--target", server.target, "--metrics-url", "none"]
    cmd += ["--steps", "50", "--step-duration", "3s", "--warmup", "0s", "--workers", "1", "--json", str(out)]
    cmd += ["--admin-url", server.http_url(), "--fault", "slow:model=mlp,delay=60ms,at=10%,until=40%"]
    cmd += ["--fault", "fail:model=mlp,at=60%,until=80%", "--html", str(tmp_path / "r.html")]
    cmd += ["--plot", str(tmp_path / "plots")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # faults.png is one of --plot's files (`wok bench merge` of this file writes the same), said once.
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == [
        "faults.png",
        "latency_vs_offered.png",
        "throughput.png",
        "timeline.png",
    ]
    assert proc.stderr.count(f"wrote {tmp_path / 'plots'} (--plot)") == 1
    result = json.loads(out.read_text())
    faults = result["faults"]
    slow, fail = faults["faults"]
    assert slow["p99_during_ms"] >= 60 and slow["errors_during"] == {}
    assert fail["errors_during"].get("INTERNAL", 0) > 10 and fail["lost_during"] == 0
    assert faults["requests"]["lost"] == 0 and faults["errors_by_code"] == {"INTERNAL": faults["requests"]["errors"]}
    assert [e["action"] for e in faults["events"]] == ["slow", "off", "fail", "off"]
    # --html draws the fault section of the JSON (tests/bench/test_report.py reads it figure by figure).
    page = (tmp_path / "r.html").read_text(encoding="utf-8")
    assert page == report.render_html(result)
    section = page[page.index("<h2>Faults</h2>") : page.index("<h2>Configuration</h2>")]
    assert f"{faults['requests']['errors']} errors, <strong>0 lost</strong>" in section
    assert "<td>slow:model=mlp,delay=60ms,at=10%,until=40%</td>" in section and "<td>fail r0</td>" in section


def test_a_model_failing_every_request_ends_even_an_inf_ramp_and_a_fail_faults_ramp_runs_on(
    admin_server, tmp_path, wok_cli
):
    """A model failing every input (the admin API's fail mode, set by hand as a broken model would fail): with
    --stop-factor inf the ramp went on to its higher steps, measuring the same INTERNAL. A `fail:` fault fails
    whole steps by design: that ramp runs every step, and its all-failed step is no broken model (exit 0)."""
    server = admin_server
    url = server.http_url()
    argv = ["bench", "ramp", "--target", server.target, "--metrics-url", "none", "--steps", "20,40,60"]
    argv += ["--step-duration", "0.5s", "--warmup", "0s", "--workers", "1", "--stop-factor", "inf"]
    post_fault(url, {"model": "mlp", "mode": "fail", "duration_s": 30})
    try:
        status, _, err = wok_cli(*argv, "--json", str(tmp_path / "broken.json"))
    finally:
        post_fault(url, {"model": "mlp", "mode": "off"})
    broken = json.loads((tmp_path / "broken.json").read_text())
    (step,) = broken["steps"]
    n = step["errors"]["INTERNAL"]
    assert (step["ok"], step["errors"]) == (0, {"INTERNAL": n})
    assert f"stopping early: no request of the step succeeded ({n} × INTERNAL)\n" in err
    assert broken["stopped_early"] == {
        "reason": f"no request of the step succeeded ({n} × INTERNAL)",
        "rule": "none_ok",
        "at_qps": step["offered_qps"],
        "steps_run": 1,
        "steps_planned": 3,
    }
    assert status == 2 and "the model failed every request at 20 QPS" in err, err
    # The plan said so: with --stop-factor inf it named no early end, though this one ended the ramp.
    ends = "no request OK, none failed by load"
    assert f"wok bench: planned: 3 steps × (0.5 s) = 1.5 s (less if a step ends the ramp: {ends})\n" in err, err
    status, _, err = wok_cli(
        *argv, "--admin-url", url, "--fault", "fail:model=mlp,at=0s", "--json", str(tmp_path / "f.json")
    )
    faulted = json.loads((tmp_path / "f.json").read_text())
    steps = faulted["steps"]
    # The fault's POST may race the first step's first requests: the second step is wholly the fault's.
    assert len(steps) == 3 and steps[1]["ok"] == 0 and steps[1]["requests"] > 0, err
    assert status == 0 and "stopping early" not in err and faulted["stopped_early"] is None, err
    ends = "no request sent, or every request refused as malformed"
    assert f"wok bench: planned: 3 steps × (0.5 s) = 1.5 s (less if a step ends the ramp: {ends})\n" in err, err


# A model that answers the start-up's warm-up (a batch of zeros) and fails every request of a ramp (normal values).
BROKEN_MODEL = textwrap.dedent(
    """
    import torch
    from torch import nn


    class Broken(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if (x != 0).any():
                raise ValueError("broken on every input but zeros")
            return x


    def build() -> nn.Module:
        return Broken()
    """
)


def test_replicas_without_a_fault_end_the_ramp_at_a_step_with_no_request_ok(tmp_path, wok_cli):
    """--replicas alone ran as a fault run, on through steps in which no request succeeded (here a model failing
    every request, INTERNAL): only faults fail whole steps by design."""
    repo = tmp_path / "repo"
    write_python_model(repo / "broken", BROKEN_MODEL, 4)
    argv = ["bench", "ramp", "--replicas", "1", "--serve-args", f"--model-repository {repo} --torch-threads 1"]
    argv += ["--model", "broken", "--metrics-url", "none", "--steps", "20,40", "--step-duration", "0.5s"]
    argv += ["--warmup", "0s", "--workers", "1", "--stop-factor", "inf"]
    status, _, err = wok_cli(*argv, "--json", str(tmp_path / "r.json"))
    result = json.loads((tmp_path / "r.json").read_text())
    (step,) = result["steps"]
    assert step["ok"] == 0 and list(step["errors"]) == ["INTERNAL"], err
    assert f"stopping early: no request of the step succeeded ({step['errors']['INTERNAL']} × INTERNAL)\n" in err, err
    stop = result["stopped_early"]
    assert (stop["rule"], stop["steps_run"], stop["steps_planned"]) == ("none_ok", 1, 2), stop
    assert status == 2 and "the model failed every request at 20 QPS" in err, err


def test_an_inf_ramp_runs_on_through_steps_failed_by_load(plain_server, tmp_path, wok_cli):
    """Each request's deadline (1 µs) passes before any answer, DEADLINE_EXCEEDED, as an overloaded server fails
    requests. --stop-factor inf asks for every step (an overload curve, a ramp run high to low): a step failed by
    load measured the server, and ended such a ramp since a step with no request OK ended every ramp. A finite
    --stop-factor still ends the ramp there (under half OK)."""
    argv = ["bench", "ramp", "--target", plain_server.target, "--metrics-url", "none", "--steps", "20,40"]
    argv += ["--step-duration", "0.5s", "--warmup", "0s", "--workers", "1", "--timeout", "1e-6s"]
    status, _, err = wok_cli(*argv, "--stop-factor", "inf", "--json", str(tmp_path / "inf.json"))
    inf = json.loads((tmp_path / "inf.json").read_text())
    steps = inf["steps"]
    assert [(s["ok"], list(s["errors"])) for s in steps] == [(0, ["DEADLINE_EXCEEDED"])] * 2, err
    assert status == 0 and "stopping early" not in err and inf["stopped_early"] is None, err
    # The plan named "no request OK" as an end of this ramp, which ran on through two such steps.
    ends = "no request OK, none failed by load"
    assert f"wok bench: planned: 2 steps × (0.5 s) = 1 s (less if a step ends the ramp: {ends})\n" in err, err
    status, _, err = wok_cli(*argv, "--json", str(tmp_path / "ten.json"))
    ten = json.loads((tmp_path / "ten.json").read_text())
    assert len(ten["steps"]) == 1, err
    why = "fewer than half of the step's requests succeeded (0.0% ok)"
    assert status == 0 and f"stopping early: {why}\n" in err, err
    assert ten["stopped_early"] == {
        "reason": why,
        "rule": "stop_factor",
        "at_qps": ten["steps"][0]["offered_qps"],
        "steps_run": 1,
        "steps_planned": 2,
    }


# -- the command line ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--fault", "kill:at=30%"], "need --replicas"),
        (["--fault", "slow:model=mlp,delay=5ms,at=30%"], "need --replicas or --admin-url"),
        (["--replicas", "2", "--fault", "kill:replica=2,at=30%"], "replica=2, but --replicas 2"),
        (["--replicas", "0"], "--replicas: expected an integer >= 1; got 0"),
        (["--replicas", "1", "--fault", "boom"], "expected kill:, pause:, slow: or fail:"),
    ],
)
def test_cli_refuses_bad_fault_options(args, says, wok_cli):
    target = [] if "--replicas" in args else ["--target", "127.0.0.1:1"]  # the bench aims at its replicas
    status, _, err = wok_cli("bench", "ramp", "--metrics-url", "none", *target, *args)
    assert status == 2 and says in err, err


@pytest.mark.parametrize(
    ("first", "second", "overlap"),
    [
        ("slow:model=mlp,delay=40ms,at=10%,until=90%", "fail:model=mlp,at=30%,until=50%", "from 3 s to 5 s"),
        ("fail:model=mlp,at=60%", "slow:model=mlp,delay=5ms,at=10%,until=70%", "from 6 s to 7 s"),
        ("fail:model=mlp,at=10%", "slow:model=mlp,delay=5ms,at=90%", "from 9 s to the end"),  # no until: to the end
        ("fail:model=mlp,at=10%,until=50%,instance=1", "slow:model=mlp,delay=5ms,at=20%", "from 2 s to 5 s"),
    ],
)
def test_overlapping_server_faults_on_one_instance_are_refused(first, second, overlap):
    """The server keeps one fault per instance: the second would replace the first, and the
    first one's `off` would clear both, while the report showed each in effect throughout."""
    with pytest.raises(ValueError) as err:
        FaultSchedule([parse_fault(first), parse_fault(second)], planned_s=10.0, admin_urls=["http://x:1"])
    message = str(err.value)
    assert f"--fault {first!r} and --fault {second!r}" in message and overlap in message
    assert "both act on model mlp" in message and "of http://x:1" in message


def test_server_faults_that_do_not_overlap_are_accepted_and_end_before_the_next_starts():
    specs = [
        parse_fault("fail:model=mlp,at=50%,until=70%,instance=0"),
        parse_fault("slow:model=mlp,delay=5ms,at=10%,until=50%,instance=0"),  # ends as the fail begins
        parse_fault("slow:model=mlp,delay=5ms,at=10%,instance=1"),  # another instance
        parse_fault("slow:model=mlp,delay=5ms,at=55%,replica=1"),  # another server
        parse_fault("fail:model=other,at=0%"),  # another model
    ]
    schedule = FaultSchedule(specs, planned_s=10.0, admin_urls=["http://x:1", "http://y:1"])
    at_5s = [(a.fault, a.name) for a in schedule.actions if a.t_s == 5.0]
    assert at_5s == [(1, "off"), (0, "fail")]  # the slow fault's off first: it must not clear the fail


def test_the_cli_refuses_overlapping_faults_before_any_replica_starts(wok_cli):
    started = time.monotonic()
    status, _, err = wok_cli(
        "bench", "ramp", "--metrics-url", "none", "--replicas", "1", "--steps", "20,20,20",
        "--step-duration", "2s", "--warmup", "0.5s",
        "--fault", "slow:model=mlp,delay=40ms,at=10%,until=90%", "--fault", "fail:model=mlp,at=30%,until=50%",
    )  # fmt: skip
    assert status == 2, err
    assert "both act on model mlp (every instance) of replica 0 from 2.25 s to 3.75 s" in err
    assert time.monotonic() - started < 5  # a replica takes longer than this to start


def test_schedule_refuses_a_signal_fault_without_replicas():
    with pytest.raises(ValueError, match="needs --replicas"):
        FaultSchedule([parse_fault("pause:at=1s")], planned_s=1.0)


def test_stop_before_the_time_runs_nothing():
    schedule = FaultSchedule([parse_fault("fail:model=mlp,at=50s")], planned_s=100.0, admin_urls=["http://x:1"])
    schedule.start(time.monotonic())
    t = threading.Timer(0.05, schedule.stop)
    t.start()
    t.join()
    schedule.stop()
    assert schedule.events == []


def test_a_call_in_flight_when_the_fault_begins_is_not_counted_before_it():
    intended, _, latency, codes = hand_case()
    # The third request (sent at 0.55 s) now takes 500 ms: the kill at 0.6 s caught it in flight.
    latency[2] = 0.5
    spec = parse_fault("kill:replica=1,at=5%,restart=10%")
    r = fault_report(
        intended, intended + latency, latency, codes, specs=[spec], events=EVENTS, slo_p99_ms=100.0, end_s=4.5,
        n_replicas=3,
    )  # fmt: skip
    (f,) = r["faults"]
    # before [0, 0.6) holds only the two calls answered by 0.6 s: 10 and 20 ms.
    assert f["sent_before"] == 2 and f["p99_before_ms"] == pytest.approx(20)


def _steady(t0: float, t1: float, latency_s: float) -> tuple[np.ndarray, np.ndarray]:
    intended = np.arange(t0 + 0.05, t1, 0.1)
    return intended, np.full(len(intended), latency_s)


def test_windows_with_nothing_sent_are_no_evidence_of_recovery():
    """A pause from 1.0 s: calls sent up to 3.0 s wait 1.5 s (bad windows), nothing is sent from 3.0 to
    4.5 s (the bench waits for the held calls before its next step), then calls are fast again. The
    recovery is the first good window, 4.5 s: 3.5 s after the pause (it read 2.0 s, the end of the
    last bad window, with the empty windows taken as good). With nothing after the gap, no recovery
    is shown at all."""
    parts = [_steady(0.0, 1.0, 0.01), _steady(1.0, 3.0, 1.5), _steady(4.5, 7.0, 0.01)]
    intended = np.concatenate([p[0] for p in parts])
    latency = np.concatenate([p[1] for p in parts])
    codes = np.zeros(len(intended), dtype=np.int16)
    events = [{"t_s": 1.0, "fault": 0, "action": "pause", "replica": 0}]
    events.append({"t_s": 4.2, "fault": 0, "action": "resume", "replica": 0})
    spec = parse_fault("pause:replica=0,at=1s,resume=4.2s")
    r = fault_report(
        intended, intended + latency, latency, codes, specs=[spec], events=events, slo_p99_ms=100.0, end_s=7.0
    )
    assert r["timeline"]["good"][6:9] == [None, None, None]  # 3.0-4.5 s: nothing sent
    (f,) = r["faults"]
    assert f["recovery_s"] == pytest.approx(3.5) and f["recovered_after_end_s"] == pytest.approx(0.3)
    cut = intended < 3.0
    r = fault_report(
        intended[cut],
        intended[cut] + latency[cut],
        latency[cut],
        codes[cut],
        specs=[spec],
        events=events,
        slo_p99_ms=100.0,
        end_s=7.0,
    )
    assert r["faults"][0]["recovery_s"] is None and r["faults"][0]["breached_slo"] is True


def test_a_replica_paused_then_killed_is_down_once():
    intended, latency = _steady(0.0, 4.0, 0.01)
    codes = np.zeros(len(intended), dtype=np.int16)
    events = [
        {"t_s": 0.5, "fault": 0, "action": "pause", "replica": 1},
        {"t_s": 1.5, "fault": 1, "action": "kill", "replica": 1},
        {"t_s": 2.5, "fault": 1, "action": "ready", "replica": 1},
    ]
    specs = [parse_fault("pause:replica=1,at=0.5s"), parse_fault("kill:replica=1,at=1.5s,restart=2s")]
    r = fault_report(
        intended,
        intended + latency,
        latency,
        codes,
        specs=specs,
        events=events,
        slo_p99_ms=100.0,
        end_s=4.0,
        n_replicas=2,
    )
    # Windows start at 0, 0.5, ..., 3.5; an event counts from the window whose middle it precedes.
    assert r["timeline"]["replicas_up"] == [2, 1, 1, 1, 1, 2, 2, 2]


def test_a_fault_that_did_not_run_as_asked_is_named():
    intended, latency = _steady(0.0, 2.0, 0.01)
    codes = np.zeros(len(intended), dtype=np.int16)
    specs = [
        parse_fault("slow:model=mlp,delay=50ms,at=0.5s"),  # refused by the server
        parse_fault("fail:model=mlp,at=0.5s,until=1s"),  # on, but turning it off failed
        parse_fault("fail:model=mlp,at=30s"),  # after the ramp's end
        parse_fault("fail:model=mlp,at=1s"),  # as asked
    ]
    events = [
        {"t_s": 0.5, "fault": 0, "action": "slow", "error": "RuntimeError: /admin/faults: HTTP 400"},
        {"t_s": 0.5, "fault": 1, "action": "fail"},
        {"t_s": 1.0, "fault": 1, "action": "off", "error": "RuntimeError: connection refused"},
        {"t_s": 1.0, "fault": 3, "action": "fail"},
    ]
    r = fault_report(
        intended, intended + latency, latency, codes, specs=specs, events=events, slo_p99_ms=100.0, end_s=2.0
    )
    assert not_in_effect(r) == [
        "did not take effect: RuntimeError: /admin/faults: HTTP 400",
        "its off failed: RuntimeError: connection refused",
        "did not take effect: the ramp ended before its time",
        None,
    ]


@pytest.mark.parametrize(
    ("retries", "rpc", "label", "warned"),
    [
        (True, "unary", "retries on", True),
        (True, "stream", "retries off (streams)", False),  # gRPC does not retry the sender's streams
        (False, "unary", "retries off", False),
        (False, "stream", "retries off", False),
    ],
)
def test_the_report_says_whether_retries_were_in_effect(retries, rpc, label, warned):
    intended, done, latency, codes = hand_case()  # one request lost
    spec = parse_fault("kill:replica=1,at=5%,restart=10%")
    section = fault_report(intended, done, latency, codes, specs=[spec], events=EVENTS, slo_p99_ms=100.0, end_s=4.5)
    section |= {"retries": retries, "balancer": "grpc", "planned_s": 12.0, "cut_s": None}
    out = io.StringIO()
    print_faults({"config": {"retries": retries, "rpc": rpc}, "faults": section}, file=out)
    first = out.getvalue().splitlines()[0]
    assert f"1 lost ({label}, balancer grpc)" in first, first
    warning = bench_faults.loss_warning(section, retries, rpc)
    assert warning == ("1 request(s) lost with retries on: UNAVAILABLE 1" if warned else None)


@pytest.mark.parametrize(
    ("requested", "rpc", "in_effect", "label"),
    [
        (True, "unary", True, "retries on"),
        (True, "stream", False, "retries off (streams)"),
        (False, "unary", False, "retries off"),
        (False, "stream", False, "retries off"),
    ],
)
def test_the_section_records_whether_retries_took_effect_and_what_was_asked(requested, rpc, in_effect, label):
    # `retries` is the effect (what a reader of the JSON alone takes it for), `retries_requested`
    # the setting; the table's label still tells `--no-retries` from the streams' own rule.
    intended, done, latency, codes = hand_case()  # one request lost
    spec = parse_fault("kill:replica=1,at=5%,restart=10%")
    section = fault_report(intended, done, latency, codes, specs=[spec], events=EVENTS, slo_p99_ms=100.0, end_s=4.5)
    section |= {"retries": in_effect, "retries_requested": requested, "balancer": "grpc", "planned_s": 12.0}
    out = io.StringIO()
    print_faults({"config": {"retries": requested, "rpc": rpc}, "faults": section | {"cut_s": None}}, file=out)
    assert f"1 lost ({label}, balancer grpc)" in out.getvalue().splitlines()[0]
    assert bench_faults.retries_in_effect(requested, rpc) is in_effect


def test_a_stream_ramp_records_retries_off_although_asked_for(refused_ramps, request):
    """`--rpc stream` without `--no-retries`: gRPC does not replay the streams, so the JSON says
    retries off (it said on: the setting), and keeps the setting in `retries_requested`. The slow
    fault is refused (no --admin), which is the cheapest fault section a real ramp writes."""
    proc, out = refused_ramps[request.node.originalname].result()  # with --rpc stream
    assert proc.returncode == 4, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["config"]["rpc"] == "stream"
    assert result["faults"]["retries"] is False
    assert result["faults"]["retries_requested"] is True
    assert "retries off (streams)" in proc.stdout


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux's")
def test_a_bench_killed_outright_takes_its_replicas_with_it(proc_tree):
    cmd = [sys.executable, "-m", "wok", "bench", "ramp", "--replicas", "1", "--serve-args", "--models mlp"]
    cmd += ["--steps", "20", "--step-duration", "30s", "--warmup", "0s", "--workers", "1", "--metrics-url", "none"]
    bench = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    replicas: list[int] = []
    try:
        for line in bench.stderr:
            if line.startswith("replicas serving on"):
                break
        else:
            raise AssertionError(f"the bench ended (status {bench.wait()}) before its replicas served")
        replicas = proc_tree.children(bench.pid)
        assert len(replicas) == 1
        bench.kill()  # mid-step: no cleanup runs
        bench.wait(10)
        wait_for(lambda: not proc_tree.alive(replicas[0]), timeout=15)  # it ran on, orphaned
    finally:
        bench.kill()
        bench.stderr.close()
        for pid in replicas:
            if proc_tree.alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux's")
def test_a_restarted_replica_is_forked_by_a_thread_that_outlives_the_restart(proc_tree, replica_set):
    """The death signal follows the thread that forked: a replica forked by the restart's own
    thread would get SIGTERM as that thread ends. Each replica's parent is the set's thread."""
    replicas = replica_set
    try:
        assert replicas[0].metrics_on, list(replicas[0].log)  # it said "metrics on" (start_replicas sums its /metrics)
        restart = threading.Thread(target=replicas.restart, args=(0,))
        restart.start()
        restart.join()
        forker = replicas.forker._thread
        assert forker.is_alive() and replicas[0].alive
        assert proc_tree.children(os.getpid(), forker.native_id) == [replicas[0].proc.pid]
    finally:
        replicas.close()
    assert not forker.is_alive()


@pytest.mark.parametrize("forked_by", ["forker", "caller"])
def test_a_replica_runs_in_a_session_of_its_own(forked_by):
    """Ctrl-C at a terminal signals the whole foreground process group: a replica in the bench's
    got SIGINT too, and one being restarted then failed to start (exit 4, a traceback in the
    warnings). The bench stops its replicas itself; their death signal still takes them along
    with a bench killed outright (test_a_bench_killed_outright_takes_its_replicas_with_it)."""
    forker = Forker() if forked_by == "forker" else None
    replica = Replica(0, ["--models", "mlp", "--torch-threads", "1"], forker=forker)
    try:
        replica.launch()  # returns once the child has exec'd: its session is set by then
        pid = replica.proc.pid
        assert os.getsid(pid) == pid and os.getpgid(pid) == pid != os.getpgrp()
    finally:
        replica.kill()
        if forker is not None:
            forker.close()


def test_stop_waits_for_a_restart_at_most_as_long_as_asked_and_records_nothing_later():
    """After a signal, the bench waited up to a replica's start timeout (180 s) for a restart
    that the replicas' stop ends anyway; its late end must not enter the report either."""
    schedule = FaultSchedule([parse_fault("fail:model=mlp,at=100s")], 200.0, admin_urls=["http://127.0.0.1:9"])
    began, release = threading.Event(), threading.Event()

    def restart() -> None:
        began.set()
        release.wait(30)

    schedule.actions = [Action(0.0, 0, "restart", restart, 0, then="ready")]
    schedule.start(time.monotonic())
    assert began.wait(10)
    t0 = time.monotonic()
    schedule.stop(wait_s=0.2)
    took = time.monotonic() - t0
    release.set()
    for thread in schedule._threads:
        thread.join(10)
    assert took < 5, f"stop took {took:.1f} s"
    assert [e["action"] for e in schedule.sorted_events()] == ["restart"]
    assert schedule.stopped_s is not None and schedule.stopped_s >= 0


def test_a_fault_that_expired_before_its_end_is_named():
    """A ramp that ran past its planned time outlived a fault without until: the server ended it
    at its expiry, so the rest of the ramp ran without it."""
    intended, latency = _steady(0.0, 4.0, 0.01)
    codes = np.zeros(len(intended), dtype=np.int16)
    specs = [parse_fault("fail:model=mlp,at=0.5s"), parse_fault("slow:model=mlp,delay=5ms,at=1s,until=2s")]
    events = [
        {"t_s": 0.5, "fault": 0, "action": "fail", "expires_s": 3.0},
        {"t_s": 1.0, "fault": 1, "action": "slow", "expires_s": 5.0},
        {"t_s": 2.0, "fault": 1, "action": "off"},
    ]
    r = fault_report(
        intended, intended + latency, latency, codes, specs=specs, events=events, slo_p99_ms=100.0, end_s=4.0
    )
    assert r["faults"][0]["expired_s"] == 3.0 and "expired_s" not in r["faults"][1]
    assert not_in_effect(r) == ["expired at 3 s, before its end: the ramp ran past its planned time", None]


def test_a_replica_that_exits_before_serving_says_so():
    from wok.bench.faults import Replica

    replica = Replica(0, ["--models", "no-such-model"])
    replica.launch()
    with pytest.raises(RuntimeError, match=r"replica 0 exited with code 2 before serving") as err:
        replica.wait_ready(60)  # it used to say "did not start within 60 s", at once
    assert "no-such-model" in str(err.value)


def test_a_replica_that_closes_its_stderr_before_it_exits_is_not_taken_as_ready(monkeypatch):
    """Its stderr closing ended the wait, and poll() of a process not yet reaped read as running:
    a replica that failed to start was taken as ready about 2 times in 3 on a loaded machine."""
    from wok.bench import faults

    real_spawn = faults._spawn

    def spawn(cmd, **options):  # stderr closed, then an exit a moment later, as at a failed start
        code = "import os, time; os.close(2); time.sleep(0.5); raise SystemExit(3)"
        return real_spawn([sys.executable, "-c", code], **options)

    monkeypatch.setattr(faults, "_spawn", spawn)
    replica = faults.Replica(0, [])
    replica.launch()
    with pytest.raises(RuntimeError, match=r"replica 0 exited with code 3 before serving"):
        replica.wait_ready(30)


def test_a_ramp_whose_fault_was_refused_says_so_and_exits_4(refused_ramps, request):
    """The server has no admin API (no --admin): the slow fault is refused. The ramp still runs and
    writes its result, with the refusal as a warning; the command ends with exit status 4, since
    it measured something other than what was asked (it exited 0, the table a row of dashes)."""
    proc, out = refused_ramps[request.node.originalname].result()
    assert proc.returncode == 4, proc.stderr[-3000:]
    assert "fault(s) not run as asked: slow:model=mlp,delay=50ms,at=10%" in proc.stderr
    assert "did not take effect: RuntimeError" in proc.stdout
    result = json.loads(out.read_text())
    assert any(w.startswith("fault 'slow:model=mlp,delay=50ms,at=10%' did not take effect") for w in result["warnings"])


def test_a_replica_serving_without_metrics_is_found_on_its_admin_port(replica_without_metrics):
    # `--no-metrics --admin` logs "metrics off …; admin API on http://H:P": the bench read only the
    # "metrics on" line, kept port 0, and every slow/fail fault found the admin API refused.
    replica = replica_without_metrics  # launched and waited for by the module's `replicas`
    try:
        assert replica.metrics_port != 0, list(replica.log)
        # Read from its line, as `start_replicas` decides on it: --serve-args may turn metrics off in a form
        # its text does not show ("--no-metr", a later "--metrics-port -1").
        assert not replica.metrics_on
        with urllib.request.urlopen(replica.admin_url + "/admin/faults", timeout=10) as answer:
            assert answer.status == 200
    finally:
        replica.kill()


def test_a_replica_on_ipv6_whose_metrics_host_is_another_is_reached_at_both():
    # The bench wrote an IPv6 host bare ("::1:8001", no port a client can read) and took the replica's
    # --host for its HTTP port too, whereas a --metrics-host in --serve-args binds that elsewhere: its
    # /metrics (a soak's RSS) and admin API (slow/fail faults) were refused.
    from wok.clients import Client

    args = ["--models", "mlp", "--torch-threads", "1", "--metrics-host", "127.0.0.2", "--admin"]
    replica = Replica(0, args, host="::1")
    try:
        replica.launch()
        replica.wait_ready(120)
        assert replica.target == f"[::1]:{replica.port}" and replica.port != 0
        assert replica.admin_url == f"http://127.0.0.2:{replica.metrics_port}" and replica.metrics_port != 0
        with urllib.request.urlopen(replica.admin_url + "/admin/faults", timeout=10) as answer:
            assert answer.status == 200
        with urllib.request.urlopen(replica.admin_url + "/metrics", timeout=10) as answer:
            assert b"process_resident_memory_bytes" in answer.read()
        with Client(replica.target) as client:
            assert client.infer("mlp", {"INPUT0": np.ones((1, 256), np.float32)})["OUTPUT0"].shape == (1, 256)
    finally:
        replica.kill()


# A ramp on one replica with a server-side fault: its gRPC port and its admin API are both used.
IPV6_RAMP = ["bench", "ramp", "--replicas", "1", "--serve-args", "--models mlp --torch-threads 1", "--workers", "1"]
IPV6_RAMP += ["--steps", "20", "--step-duration", "1s", "--warmup", "0.2s", "--metrics-url", "none"]
IPV6_RAMP += ["--fault", "slow:model=mlp,delay=5ms,at=10%,until=50%"]


def _assert_ramped_on_ipv6(proc: subprocess.CompletedProcess, out: Path) -> None:
    assert proc.returncode == 0, proc.stderr[-3000:]
    faults = json.loads(out.read_text())["faults"]
    (replica,) = faults["replicas"]
    assert replica["target"].startswith("[::1]:") and replica["admin_url"].startswith("http://[::1]:"), replica
    assert faults["requests"]["ok"] == faults["requests"]["sent"] > 0
    assert [e["action"] for e in faults["events"]] == ["slow", "off"] and not any(
        "error" in e for e in faults["events"]
    )


@pytest.mark.skipif(bind_error("::1", 0) is not None, reason="this machine has no IPv6 loopback (::1)")
def test_replicas_on_the_ipv6_loopback(tmp_path):
    """--replica-host ::1: the replicas' gRPC port and, with no --metrics-host in --serve-args, their HTTP port
    (the admin API the slow fault goes to) bind ::1. The replicas were pinned to --host 127.0.0.1, and
    `--serve-args "--host ::1"` is refused (the bench gives every replica its --host)."""
    out = tmp_path / "r.json"
    cmd = [sys.executable, "-m", "wok", *IPV6_RAMP, "--replica-host", "::1", "--json", str(out)]
    _assert_ramped_on_ipv6(subprocess.run(cmd, capture_output=True, text=True, timeout=100), out)


def _ipv6_only(argv: list[str]) -> list[str]:
    """`argv` in a network namespace of its own (an unprivileged user's) whose loopback has ::1 and no 127.0.0.1."""
    import shlex

    setup = "ip link set lo up && ip addr del 127.0.0.1/8 dev lo && exec " + shlex.join(argv)
    return ["unshare", "--user", "--map-root-user", "--net", "sh", "-c", setup]


def _can_run_ipv6_only() -> bool:
    if not (shutil.which("unshare") and shutil.which("ip")):
        return False
    probe = [sys.executable, "-c", "import socket; socket.socket(socket.AF_INET6).bind(('::1', 0))"]
    try:
        return subprocess.run(_ipv6_only(probe), capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.skipif(
    sys.platform != "linux" or not _can_run_ipv6_only(),
    reason="needs unshare and ip to make a network namespace with ::1 alone (unprivileged user namespaces)",
)
def test_replicas_on_a_machine_without_ipv4_loopback(tmp_path):
    """Where 127.0.0.1 is not an address of the machine (an IPv6-only network namespace), the replicas at their
    default exit at once ("cannot bind the gRPC port to 127.0.0.1:0"), and there was no way to start them
    elsewhere; with --replica-host ::1 the ramp runs, its fault reaching the replica's admin API on ::1."""
    out = tmp_path / "r.json"
    base = [sys.executable, "-m", "wok", *IPV6_RAMP, "--json", str(out)]
    default = subprocess.run(_ipv6_only(base), capture_output=True, text=True, timeout=100)
    assert default.returncode == 1 and "cannot bind the gRPC port to 127.0.0.1:0" in default.stderr, default.stderr
    ipv6 = subprocess.run(_ipv6_only([*base, "--replica-host", "::1"]), capture_output=True, text=True, timeout=100)
    _assert_ramped_on_ipv6(ipv6, out)


@pytest.mark.parametrize(
    ("printed", "host", "url"),
    [
        ("[::1]", "::1", "http://[::1]:8002"),
        ("[::]", "::1", "http://[::1]:8002"),  # a wildcard: its family's loopback
        ("0.0.0.0", "127.0.0.1", "http://127.0.0.1:8002"),
        ("127.0.0.2", "127.0.0.2", "http://127.0.0.2:8002"),
        ("localhost", "localhost", "http://localhost:8002"),
    ],
)
def test_a_replicas_admin_url_is_where_it_said_its_metrics_port_listens(printed, host, url):
    assert bench_faults.reachable(printed) == host
    assert Replica(0, [], metrics_host=host, metrics_port=8002).admin_url == url


def test_every_column_of_the_timeline_has_a_header():
    """The column that marks a bad window had an empty header."""
    intended, done, latency, codes = hand_case()
    spec = parse_fault("kill:replica=1,at=5%,restart=10%")
    section = fault_report(intended, done, latency, codes, specs=[spec], events=EVENTS, slo_p99_ms=100.0, end_s=4.5)
    section |= {"retries": True, "balancer": "grpc", "planned_s": 12.0, "cut_s": None}
    out = io.StringIO()
    print_faults({"config": {"retries": True, "rpc": "unary"}, "faults": section}, file=out)
    lines = out.getvalue().splitlines()
    head = lines[next(i for i, line in enumerate(lines) if "timeline (by send time)" in line) + 2]
    assert [h.strip() for h in head.split("┃")[1:-1]] == [
        "t s", "sent", "ok", "errors", "lost", "P99 ms", "up", "window", "events"
    ], head  # fmt: skip
    assert any("│ bad" in line for line in lines), out.getvalue()


@pytest.mark.parametrize("text", ["٥٠%", "５０%", "5٠%"])
def test_a_percentage_in_digits_other_than_ascii_is_refused(text):
    """float() read "٥٠" as 50: at=٥٠% was half way through the ramp."""
    with pytest.raises(ValueError, match="expected a percentage of the ramp from 0% to 100%"):
        parse_at(text, "at")


# A batch (not the start's warm-up) says so on stderr, then holds the replica's drain for 2 s.
BUSY_DRAIN = textwrap.dedent(
    """
    import sys, time

    from torch import nn


    class Busy(nn.Module):
        calls = 0

        def forward(self, x):
            self.calls += 1
            if self.calls > 1:
                print("test: in a batch", file=sys.stderr, flush=True)
                time.sleep(2)
            return x * 2


    def build():
        return Busy()
    """
)


def test_closing_the_replicas_stops_each_with_one_signal_so_a_drain_runs_to_its_end(tmp_path):
    # close() sent SIGTERM, then Replica.stop sent it again: a replica still draining took the second as "exit
    # without draining" (status 1), the call in its batch cut (UNAVAILABLE) instead of answered; one done with its
    # drain, or the two sent before it ran, took one (2 runs in 10 failed here). The signals sent are counted too,
    # through Python's audit event for os.kill (Popen.send_signal's), which the race cannot hide.
    import grpc

    from wok.codec import decode_response, encode_request
    from wok.v2pb import grpc_service_pb2_grpc as pb_grpc

    write_python_model(tmp_path / "busy", BUSY_DRAIN)
    replicas = ReplicaSet(1, ["--model-repository", str(tmp_path), "--metrics-port", "-1", "--grace-period", "10"])
    try:
        (replica,) = replicas
        with grpc.insecure_channel(replica.target) as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            x = np.arange(4, dtype=np.float32).reshape(1, 4)
            call = stub.ModelInfer.future(encode_request("busy", {"INPUT0": x}), timeout=30)
            deadline = time.monotonic() + 30
            while "test: in a batch" not in replica.log:  # a deque filled by the replica's stderr reader
                assert time.monotonic() < deadline, "\n".join(replica.log)
                time.sleep(0.02)
            sent: list[int] = []  # the signals sent to the replica
            recording = [True]  # an audit hook stays for the process's life: off once the test is done

            def record(event: str, args: tuple) -> None:
                if recording[0] and event == "os.kill" and args[0] == replica.proc.pid:
                    sent.append(args[1])

            sys.addaudithook(record)
            try:
                replicas.close()
            finally:
                recording[0] = False
            assert sent.count(signal.SIGTERM) == 1, sent
            np.testing.assert_array_equal(decode_response(call.result())["OUTPUT0"], x * 2)
    finally:
        replicas.close()
    log = "\n".join(replica.log)
    assert replica.proc.returncode == 0, log
    assert "wok: second signal, exiting without draining" not in replica.log, log


@pytest.mark.parametrize(
    "words, grace",
    [
        (["--models", "mlp"], 30.0),
        (["--grace-period", "45"], 45.0),
        (["--grace-period=45.5"], 45.5),
        (["--grace", "45"], 45.0),  # an abbreviation, as argparse takes it
        (["--grace-period", "45", "--grace-period", "2"], 2.0),  # the later one wins
        (["--max-connection-age-grace", "50"], 30.0),  # not the drain's
        (["--grace-period", "inf"], 30.0),  # refused by wok serve: it exits before serving
        (["--grace-period", "-1"], 30.0),
        (["--no-such-option"], 30.0),
    ],
)
def test_a_replicas_grace_period_is_read_from_its_arguments_as_wok_serve_reads_them(words, grace):
    assert Replica(0, words).grace_s == grace


def test_the_replicas_stop_is_waited_for_as_long_as_their_grace_period_then_killed_and_said(tmp_path, monkeypatch):
    """The wait followed no grace period: 30 s for each, so a replica given --grace-period 45 was killed halfway
    through its drain, without a word. Now its grace period and STOP_MARGIN_S (here 0.5 s, so that a stop still
    running past them is one the test can wait for: a batch held 60 s, the drain's grace 1.5 s)."""
    import grpc

    from wok.codec import encode_request
    from wok.v2pb import grpc_service_pb2_grpc as pb_grpc

    write_python_model(tmp_path / "busy", BUSY_DRAIN.replace("time.sleep(2)", "time.sleep(60)"))
    monkeypatch.setattr(bench_faults, "STOP_MARGIN_S", 0.5)
    replicas = ReplicaSet(1, ["--model-repository", str(tmp_path), "--metrics-port", "-1", "--grace-period", "1.5"])
    try:
        (replica,) = replicas
        assert replicas.stop_wait_s == 2.0
        with grpc.insecure_channel(replica.target) as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            x = np.arange(4, dtype=np.float32).reshape(1, 4)
            call = stub.ModelInfer.future(encode_request("busy", {"INPUT0": x}), timeout=30)
            deadline = time.monotonic() + 30
            while "test: in a batch" not in replica.log:
                assert time.monotonic() < deadline, "\n".join(replica.log)
                time.sleep(0.02)
            said: list[str] = []
            began = time.monotonic()
            replicas.close(said.append)
            took = time.monotonic() - began
            call.cancel()
    finally:
        replicas.close()
    log = "\n".join(replica.log)
    # Its own stop would have taken the grace period and a second or more past it (the answers' window, then the
    # model's shutdown, given up on after a second): still running at 2 s, it was killed then, not before.
    assert replica.proc.returncode == -signal.SIGKILL, log
    assert 2.0 <= took < 5, took
    assert "wok: SIGTERM received, stopping" in log, log
    assert said == [
        f"replica 0 (pid {replica.proc.pid}) still running 2 s after its SIGTERM (its --grace-period 1.5 s, then "
        "0.5 s for the stop's last stages and its exit): killed"
    ]
