"""A `wok bench ramp --soak` cut short keeps the soak it measured up to the cut (bench/soak.py).

A soak runs for tens of minutes; one stopped by Ctrl-C, or by a worker that died, used to keep
only the capacity ramp (or nothing, with `--capacity` given): the RSS samples and P99 windows
that showed what happened were thrown away. A target that dies does not cut the soak: its
requests fail, and the part before stays in the windows.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from wok.bench.scrape import scrape
from wok.bench.soak import soak_report
from wok.bench.workers import CANCELLED, NOT_SENT

pytestmark = pytest.mark.timeout(120)
SERVED = "wok_request_duration_seconds_count"
WINDOW_S = 0.5
MIB = float(1 << 20)


@pytest.fixture(scope="module")
def cut_server(bench_server):
    """The session's server, for the runs that leave it serving (a start costs seconds): they read its counters as
    deltas."""
    return bench_server


@pytest.fixture(scope="module")
def doomed_server(start_server_module, server_process_start):
    """Killed by the one test that uses it; its start-up beside the session's (cut_server), where that has not
    begun yet."""
    server_process_start()
    return start_server_module("--models", "mlp", "--torch-threads", "1")


def _metrics(server) -> str:
    return server.wait_for_line("wok: metrics on http://").split("metrics on ")[1]


def _served(metrics: str) -> float:
    snap = scrape(metrics, timeout=2.0)
    return -1.0 if snap is None else snap.get(SERVED, model="mlp")


def _soak(server, out: Path, *args: str) -> subprocess.Popen:
    """`wok bench ramp --soak` at 50 QPS (half of --capacity 100) with 0.5 s windows."""
    cmd = [sys.executable, "-m", "wok", "bench", "ramp", "--target", server.target, "--metrics-url", _metrics(server)]
    cmd += ["--capacity", "100", "--soak-load", "50%", "--soak-window", f"{WINDOW_S}s", "--rss-every", "0.2s"]
    cmd += ["--json", str(out), *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _until_served(proc: subprocess.Popen, metrics: str, n: int, base: float) -> None:
    """Wait until the server has answered `n` of the soak's requests: the soak runs, windows exist."""
    deadline = time.monotonic() + 60
    while _served(metrics) < base + n:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            _, err = proc.communicate()
            raise AssertionError(f"the soak did not serve {n} requests:\n{err[-3000:]}")
        time.sleep(0.05)


def _finish(proc: subprocess.Popen) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        raise AssertionError(f"still running 60 s on:\n{err[-3000:]}") from None


def _children(pid: int) -> list[int]:
    found = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            found += [int(c) for c in f.read().split()]
    return found


def _workers(pid: int) -> list[int]:
    """The bench's worker processes, first started first (multiprocessing's resource tracker left out)."""
    out = []
    for child in _children(pid):
        try:
            with open(f"/proc/{child}/cmdline", "rb") as f:
                cmdline = f.read()
        except FileNotFoundError:
            continue
        if b"multiprocessing" in cmdline and b"resource_tracker" not in cmdline:
            out.append(child)
    return sorted(out)


def test_a_cut_ends_the_windows_and_rss_samples_at_the_cut():
    intended = np.array([0.2, 0.7, 1.2, 1.6, 2.1])
    latency = np.array([10, 20, 30, 40, 50]) / 1e3
    rss = [(float(t) / 2, [(100 + t) * MIB]) for t in range(6)]  # 0, 0.5 … 2.5 s
    cut = {"at_s": 2.2, "in_flight": 3, "sent_after": 1, "workers_lost": 0}
    r = soak_report(intended, latency, np.zeros(5, np.int16), rss, duration_s=60.0, window_s=1.0, cut=cut)
    assert r["duration_s"] == 60.0 and r["cut"] == cut
    assert [w["length_s"] for w in r["windows"]] == pytest.approx([1.0, 1.0, 0.2])
    assert [w["sent"] for w in r["windows"]] == [2, 2, 1]
    # The sample at 2.5 s came after the cut: the run stopping, not the soak.
    assert [t for t, _ in r["rss"]["samples"]] == [0.0, 0.5, 1.0, 1.5, 2.0] and r["rss"]["last_mib"] == 104.0
    assert r["windows"][-1]["rss_mib"] == 104.0 and r["p99"]["windows"] == 2  # the 0.2 s window is too short
    whole = soak_report(intended, latency, np.zeros(5, np.int16), rss, duration_s=3.0, window_s=1.0)
    assert whole["cut"] is None and len(whole["rss"]["samples"]) == 6


def test_requests_a_cut_left_unsent_are_not_counted_and_those_it_caught_in_flight_are_no_success():
    # A cut step's per-request codes as the workers hand them back: 2 answered OK, 1 cancelled in
    # flight, 2 never sent. The unsent were no part of the load; the cancelled one was sent, unanswered.
    intended = np.array([0.2, 0.4, 0.6, 0.8, 1.2])
    latency = np.array([0.01, 0.02, np.nan, np.nan, np.nan])
    codes = np.array([0, 0, CANCELLED, NOT_SENT, NOT_SENT], np.int16)
    r = soak_report(intended, latency, codes, [], duration_s=60.0, window_s=1.0, cut={"at_s": 1.5})
    assert r["requests"] == {"sent": 3, "ok": 2, "errors": 1} and r["errors_by_code"] == {"CANCELLED": 1}
    assert [(w["sent"], w["ok"]) for w in r["windows"]] == [(3, 2), (0, 0)]


def _first_rss_window(soak: dict) -> int:
    """The window that holds the first RSS sample, the first whose `rss_mib` is known; those before
    it have none. A sample's time is when its scrape came back: on a loaded host the first one
    (sent at the soak's start) came back after the first 0.5 s window had ended."""
    first_t = soak["rss"]["samples"][0][0]
    windows = soak["windows"]
    at = next(i for i, w in enumerate(windows) if first_t <= w["t_s"] + w["length_s"] + 1e-9)
    assert all(w["rss_mib"] is None for w in windows[:at]) and at < len(windows) - 1
    return at


def _check_partial(soak: dict, *, at_least: int) -> None:
    """The soak section of a cut soak: windows and RSS samples up to the cut, and no further."""
    cut = soak["cut"]
    assert 0 < cut["at_s"] < soak["duration_s"] == 60.0 and cut["in_flight"] >= 0
    windows = soak["windows"]
    assert len(windows) == math.ceil(cut["at_s"] / WINDOW_S - 1e-9)
    last = windows[-1]
    assert last["length_s"] == pytest.approx(cut["at_s"] - last["t_s"]) and 0 < last["length_s"] <= WINDOW_S
    assert sum(w["sent"] for w in windows) == soak["requests"]["sent"] >= at_least
    assert soak["requests"]["ok"] >= at_least and windows[0]["p99_ms"] is not None
    samples = soak["rss"]["samples"]
    assert samples and all(0 <= t <= cut["at_s"] for t, _ in samples)
    first = _first_rss_window(soak)
    assert soak["rss"]["first_mib"] > 50 and all(w["rss_mib"] > 50 for w in windows[first:])


def test_ctrl_c_in_the_soak_keeps_the_windows_and_rss_measured_so_far(cut_server, tmp_path):
    """It used to exit 130 with nothing written (the capacity was given: no capacity ramp to keep)."""
    metrics, out = _metrics(cut_server), tmp_path / "soak.json"
    base = _served(metrics)
    proc = _soak(cut_server, out, "--soak", "60s", "--workers", "1")
    _until_served(proc, metrics, 60, base)  # about 1.2 s of the soak: two windows and more
    proc.send_signal(signal.SIGINT)
    stdout, err = _finish(proc)
    assert proc.returncode == 0, err[-3000:]
    result = json.loads(out.read_text())
    reason = result["interrupted"]["reason"]
    assert result["interrupted"]["by_signal"] is True and reason == "soak ended early: KeyboardInterrupt: SIGINT"
    assert reason in result["warnings"] and not any(w.startswith("ramp ended early") for w in result["warnings"])
    soak = result["soak"]
    _check_partial(soak, at_least=50)  # answers reach the server's count a moment before the bench
    assert soak["cut"]["workers_lost"] == 0 and soak["errors_by_code"] == {}
    assert soak["p99"]["windows"] >= 2 and soak["capacity"]["source"] == "given"
    # No step ran to its end; the per-second timeline is the soak's up to the cut.
    assert result["steps"] == [] and sum(result["timeline"]["achieved"]) == soak["requests"]["ok"]
    assert f"cut at {soak['cut']['at_s']:g} s of 60 s" in " ".join(stdout.split())


def test_every_request_a_cut_soak_sent_is_counted_once(cut_server, tmp_path):
    """A worker sees the stop only at its next look (workers.STOP_POLL_S, 0.1 s) and sends on until
    then; those requests, sent after the cut moment, were in neither `requests` nor `cut.in_flight`.
    At 200 QPS the server ran 232 of a soak cut by SIGINT, and the result accounted for 209.

    Every request whose batch the server ran (its wok_request_duration_seconds count) was sent, and
    some sent never reach it (cancelled by the cut), so that count bounds the sum from below, however
    late it is read."""
    metrics, out = _metrics(cut_server), tmp_path / "soak.json"
    base = _served(metrics)
    # 50 % of 400: 200 QPS, so that the 0.1 s the worker takes to see the stop holds requests.
    proc = _soak(cut_server, out, "--soak", "60s", "--workers", "1", "--capacity", "400")
    _until_served(proc, metrics, 200, base)
    proc.send_signal(signal.SIGINT)
    _, err = _finish(proc)
    assert proc.returncode == 0, err[-3000:]
    served = _served(metrics) - base
    assert served >= 200  # read: a failed scrape reads -1
    soak = json.loads(out.read_text())["soak"]
    _check_partial(soak, at_least=150)
    cut = soak["cut"]
    assert cut["workers_lost"] == 0 and cut["sent_after"] >= 0
    accounted = soak["requests"]["sent"] + cut["in_flight"] + cut["sent_after"]
    assert accounted >= served, (soak["requests"], cut, served)


def test_a_worker_dying_in_the_soak_keeps_what_the_others_measured(cut_server, tmp_path):
    """A failed worker ends the run (status 1, as before); the other worker's answers up to the
    cut are written. It used to write nothing."""
    metrics, out = _metrics(cut_server), tmp_path / "soak.json"
    base = _served(metrics)
    proc = _soak(cut_server, out, "--soak", "60s", "--workers", "2")
    _until_served(proc, metrics, 60, base)
    workers = _workers(proc.pid)
    assert len(workers) == 2, workers
    # The first one: the coordinator waits on it first, and so sees at once that it is gone.
    os.kill(workers[0], signal.SIGKILL)
    _, err = _finish(proc)
    assert proc.returncode == 1, err[-3000:]
    result = json.loads(out.read_text())
    reason = result["interrupted"]["reason"]
    assert result["interrupted"]["by_signal"] is False and reason.startswith("soak ended early: RuntimeError: bench")
    soak = result["soak"]
    _check_partial(soak, at_least=20)
    assert soak["cut"]["workers_lost"] == 1 and soak["cut"]["at_s"] < 30
    assert "the run failed" in err


def _target_dying(server, out: Path) -> tuple[int, str]:
    """A soak of `server` that kills it once it has answered 60 of the soak's requests."""
    metrics = _metrics(server)
    base = _served(metrics)
    # The kill comes about 1.2 s in (60 answers at 50 QPS): the last of the 7 windows begins 1.8 s later.
    proc = _soak(server, out, "--soak", "3.5s", "--workers", "1")
    _until_served(proc, metrics, 60, base)
    server.proc.kill()
    server.proc.wait()
    _, err = _finish(proc)
    return proc.returncode, err


DYING = "test_a_target_dying_in_the_soak_keeps_the_part_before"


@pytest.fixture(scope="module", autouse=True)
def target_dying(request, tmp_path_factory):
    """That soak, run in the background as the module starts, if its test is selected: it is its
    own server's only client, and mostly waits (paced sends), so it overlaps with the other runs."""
    if not any(
        getattr(item, "module", None) is request.module and item.originalname == DYING for item in request.session.items
    ):
        yield None
        return
    server, out = request.getfixturevalue("doomed_server"), tmp_path_factory.mktemp("dying") / "soak.json"
    with ThreadPoolExecutor(1) as pool:
        yield pool.submit(_target_dying, server, out), out


def test_a_target_dying_in_the_soak_keeps_the_part_before(target_dying):
    """The server's death does not end the soak (its requests fail: UNAVAILABLE), so the run
    is whole: the windows before the death hold its answers, and RSS samples its memory."""
    run, out = target_dying
    status, err = run.result(timeout=100)
    assert status == 0, err[-3000:]
    result = json.loads(out.read_text())
    soak = result["soak"]
    assert result["interrupted"] is None and soak["cut"] is None and len(soak["windows"]) == 7
    windows = soak["windows"]
    assert windows[0]["ok"] == windows[0]["sent"] > 0 and windows[_first_rss_window(soak)]["rss_mib"] > 50
    assert windows[-1]["ok"] == 0 and windows[-1]["sent"] > 0 and windows[-1]["rss_mib"] is None
    assert soak["requests"]["ok"] >= 60 and set(soak["errors_by_code"]) == {"UNAVAILABLE"}
    alive = [vs[0] for _, vs in soak["rss"]["samples"] if vs[0] is not None]
    assert alive and soak["rss"]["first_mib"] > 50
