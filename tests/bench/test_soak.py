"""bench/soak.py: the soak report on hand-built requests and RSS samples, the RSS sampler
against a real server's /metrics, and a short `wok bench ramp --soak` end to end."""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from wok.bench import faults
from wok.bench.cli import _restore_signals, _signals_interrupt
from wok.bench.runner import RampConfig
from wok.bench.soak import RssSampler, parse_fraction, run_soak, soak_report
from wok.bench.workers import WorkerProcesses

pytestmark = pytest.mark.timeout(120)
MIB = float(1 << 20)


@pytest.fixture(scope="module")
def soak_server(server_process):
    """The session's server for the module's real runs, as tests/bench/conftest.py's bench_server:
    each run leaves it idle, none of them changes its state or reads its counters (only its RSS,
    above 50 MiB), and in the serial pass it is already up (test_ramp, test_server_timing), where a
    start of the module's own cost 3 s alone."""
    assert "mlp" in server_process.models, server_process.models
    return server_process


def _e2e_args(metrics: str) -> list[str]:
    args = ["--metrics-url", metrics, "--capacity", "100", "--soak", "2s", "--soak-load", "50%"]
    return [*args, "--soak-window", "0.5s", "--rss-every", "0.2s", "--workers", "1"]


# 95 QPS offered at step 40 (a burst over 0.5 s after a 0.2 s warm-up).
BURST = ["--metrics-url", "none", "--steps", "20,40", "--step-duration", "0.5s", "--warmup", "0.2s"]
BURST += ["--slo-p99", "2s", "--arrival", "burst", "--soak", "1s", "--soak-load", "50%", "--soak-window", "0.5s"]
BURST += ["--workers", "1", "--require-qps", "60"]
NO_CAPACITY = ["--metrics-url", "none", "--workers", "1", "--warmup", "0.2s", "--steps", "20"]
NO_CAPACITY += ["--step-duration", "0.5s", "--slo-p99", "0.001ms", "--soak", "60s"]
# A soak on two replicas the bench starts (no --target): the capacity measured on them, then the soak, their RSS read
# from each one's own /metrics (--metrics-url auto).
REPLICAS = ["--replicas", "2", "--serve-args", "--models mlp --torch-threads 1", "--model", "mlp", "--workers", "1"]
REPLICAS += ["--steps", "20", "--step-duration", "0.5s", "--warmup", "0s", "--slo-p99", "2s", "--soak", "1s"]
REPLICAS += ["--soak-load", "50%", "--soak-window", "0.5s", "--rss-every", "0.25s"]
RUNS = {
    "test_soak_end_to_end": ("e2e", _e2e_args),
    "test_a_soak_on_replicas_reads_the_rss_of_each_and_stops_them": ("replicas", lambda metrics: REPLICAS),
    "test_a_burst_soak_holds_its_share_of_the_offered_capacity_and_reports_the_capacitys_verdict": (
        "burst",
        lambda metrics: BURST,
    ),
    "test_a_soak_without_capacity_writes_the_capacity_ramp_and_exits_3": ("no_capacity", lambda metrics: NO_CAPACITY),
}


@pytest.fixture(scope="module", autouse=True)
def runs(request, tmp_path_factory):
    """The runs of the selected tests that take no signal, all started as the module starts: each
    is mostly waiting (imports, paced sends), their loads together are a small part of the
    server's capacity, and none of their checks counts another's requests."""
    selected = {item.originalname for item in request.session.items if getattr(item, "module", None) is request.module}
    wanted = {name: args for test, (name, args) in RUNS.items() if test in selected}
    started: dict[str, tuple[subprocess.Popen, Path]] = {}
    try:
        if wanted:
            server = request.getfixturevalue("soak_server")
            metrics = next(line.split("metrics on ")[1] for line in server.log if "metrics on http://" in line)
            for name, args in wanted.items():
                d = tmp_path_factory.mktemp(name)
                given = args(metrics)
                target = [] if "--replicas" in given else ["--target", server.target]
                cmd = [sys.executable, "-m", "wok", "bench", "ramp", *target, *given]
                # Files, not pipes: a run not yet waited on must not block on a full pipe.
                with open(d / "stdout", "w") as out, open(d / "stderr", "w") as err:
                    proc = subprocess.Popen([*cmd, "--json", str(d / "soak.json")], stdout=out, stderr=err, text=True)
                started[name] = (proc, d)
        yield started
    finally:
        for proc, _ in started.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _finished(runs: dict, name: str) -> tuple[int, str, str, Path]:
    """A run's exit status, stdout and stderr once it has ended, and its result's path."""
    proc, d = runs[name]
    status = proc.wait(timeout=100)
    return status, (d / "stdout").read_text(), (d / "stderr").read_text(), d / "soak.json"


def test_parse_fraction():
    assert parse_fraction("80%") == pytest.approx(0.8) and parse_fraction("0.5") == 0.5
    assert parse_fraction("100%") == 1.0
    for bad in ("0%", "120%", "x", "-0.1"):
        with pytest.raises(ValueError, match="--soak-load"):
            parse_fraction(bad)


def test_soak_report_by_hand():
    intended = np.array([0.5, 1.0, 1.5, 2.5, 3.5])
    latency = np.array([10, 20, 30, 40, 50]) / 1e3
    codes = np.array([0, 0, 0, 0, 13], dtype=np.int16)
    rss = [(float(t), [(100 + t) * MIB]) for t in range(5)]  # 1 MiB per second
    r = soak_report(intended, latency, codes, rss, duration_s=4.0, window_s=2.0, urls=["u"])
    w0, w1 = r["windows"]
    # Window 0: 10, 20, 30 ms; window 1: 40 ms (the 50 ms request failed, INTERNAL).
    assert (w0["sent"], w0["ok"], w0["p50_ms"], w0["p99_ms"]) == (3, 3, 20.0, 30.0)
    assert (w1["sent"], w1["ok"], w1["p50_ms"], w1["p99_ms"]) == (2, 1, 40.0, 40.0)
    assert (w0["rss_mib"], w1["rss_mib"]) == (102.0, 104.0)  # the last sample at or before each end
    assert r["requests"] == {"sent": 5, "ok": 4, "errors": 1} and r["errors_by_code"] == {"INTERNAL": 1}
    m = r["rss"]
    assert (m["first_mib"], m["last_mib"], m["max_mib"], m["growth_mib"]) == (100.0, 104.0, 104.0, 4.0)
    assert m["growth_pct"] == pytest.approx(4.0)
    assert m["slope_mib_per_min"] == pytest.approx(60.0) and m["slope_second_half_mib_per_min"] == pytest.approx(60)
    p = r["p99"]
    assert (p["first_ms"], p["last_ms"], p["drift_ms"]) == (30.0, 40.0, 10.0)
    assert p["drift_pct"] == pytest.approx(100 / 3) and p["slope_ms_per_min"] == pytest.approx(300.0)
    json.dumps(r)


def test_window_percentiles_are_nearest_rank():
    """docs/bench-schema.md: P99 of 100 requests is the 99th smallest, not the largest (numpy's
    "higher" gave 100 ms here, and 51 ms for the P50)."""
    latency = np.arange(1, 101) / 1e3  # 1 ms … 100 ms
    r = soak_report(np.linspace(0, 0.99, 100), latency, np.zeros(100, np.int16), [], duration_s=1.0, window_s=1.0)
    (w,) = r["windows"]
    assert (w["p50_ms"], w["p99_ms"]) == (50.0, 99.0)


def test_rss_of_several_servers_adds_up_and_a_missing_or_early_sample_is_left_out():
    rss = [
        (-1.0, [900 * MIB, 50 * MIB]),
        (0.0, [100 * MIB, 50 * MIB]),
        (1.0, [None, None]),
        (2.0, [100 * MIB, 52 * MIB]),
    ]
    r = soak_report(np.array([0.1]), np.array([0.01]), np.zeros(1, np.int16), rss, duration_s=3.0, window_s=3.0)
    # The sample at -1 s (before the soak's first send) belongs to the capacity ramp.
    assert r["rss"]["first_mib"] == 150.0 and r["rss"]["last_mib"] == 152.0 and r["rss"]["max_mib"] == 152.0
    assert [t for t, _ in r["rss"]["samples"]] == [0.0, 1.0, 2.0]
    assert r["rss"]["slope_mib_per_min"] == pytest.approx(60.0)  # 2 MiB in 2 s, the empty sample skipped


def test_a_short_last_window_is_left_out_of_the_drift():
    intended = np.array([0.5, 1.5, 2.1])
    latency = np.array([0.010, 0.020, 0.500])
    r = soak_report(intended, latency, np.zeros(3, np.int16), [], duration_s=2.2, window_s=1.0)
    assert [w["length_s"] for w in r["windows"]] == pytest.approx([1.0, 1.0, 0.2])
    assert r["p99"]["windows"] == 2 and r["p99"]["last_ms"] == 20.0
    assert "first_mib" not in r["rss"]


def test_rss_sampler_reads_a_real_server(soak_server):
    server = soak_server
    url = next(line.split("metrics on ")[1] for line in server.log if "metrics on http://" in line)
    sampler = RssSampler([url, "http://127.0.0.1:1/metrics"], every_s=0.05)
    sampler.start(time.monotonic() + 0.2)  # samples begin at clock0, not before
    while len(sampler.samples) < 3:
        time.sleep(0.01)
    sampler.stop()
    assert sampler.samples[0][0] >= 0
    for _, (rss, gone) in sampler.samples:
        assert rss > 50 * MIB and gone is None


class _SlowScrapes(RssSampler):
    """A sampler whose every scrape takes 0.2 s, recording when each of its own thread's began, and what
    each of its thread's waits aimed at: the moment it asked to wake, as now + timeout (from clock0)."""

    def __init__(self, every_s: float):
        super().__init__([], every_s)
        self.began: list[float] = []
        self.aims: list[tuple[float, float]] = []  # (asked at, aimed at)
        sampler = self

        class AimedStop(threading.Event):
            def wait(self, timeout: float | None = None) -> bool:
                if threading.current_thread().name == "wok-rss" and timeout is not None:
                    now = time.monotonic() - sampler._clock0
                    sampler.aims.append((now, now + timeout))
                return super().wait(timeout)

        self._stop = AimedStop()

    def sample(self) -> None:
        if threading.current_thread().name == "wok-rss":
            self.began.append(time.monotonic() - self._clock0)
            time.sleep(0.2)
        super().sample()


def test_rss_samples_keep_their_grid_however_long_a_scrape_takes():
    # It waited every_s after each scrape ended: 0.2 s scrapes every 0.4 s began at 0, 0.6, 1.2 s,
    # the cadence stretched by half (the soak's e2e test, 0.2 s cadence, got 7 samples of 2 s on a
    # host slow to scrape). On the grid they begin at 0, 0.4, 0.8, 1.2 s. When each scrape began
    # is the host's to say (a loaded one woke the thread 0.15 s late): what each wait after a scrape
    # aimed at is the sampler's, a tick of the grid, the first after the scrape ended.
    every = 0.4
    sampler = _SlowScrapes(every_s=every)
    sampler.start(time.monotonic())
    while len(sampler.began) < 4:
        time.sleep(0.01)
    sampler.stop()
    waits = sampler.aims[1 : len(sampler.began)]  # the first is the wait for clock0, before any scrape
    assert len(waits) == len(sampler.began) - 1, (sampler.aims, sampler.began)
    ticks = [round(aim / every) for _, aim in waits]
    # The slack is only for the host between the sampler's reading of the clock and the wait's.
    assert all(abs(aim - every * tick) < 0.05 for (_, aim), tick in zip(waits, ticks)), waits
    assert all(0 < aim - asked <= every + 1e-9 for asked, aim in waits), waits  # the first tick after the scrape
    assert ticks == sorted(set(ticks)), waits  # ticks a slow scrape overran skipped, not made up
    # Each scrape waited for its tick (a wait's slack: its clock read before it woke).
    assert all(began >= aim - 0.005 for began, (_, aim) in zip(sampler.began[1:], waits)), (sampler.began, waits)


def _short_soak(server, say) -> dict:
    """`run_soak` in this process: a capacity ramp of one 0.5 s step on 2 workers, then a 1 s soak."""
    args = argparse.Namespace(
        capacity=None, soak="1s", soak_window=None, rss_every=None, soak_load="50%", replicas=None
    )
    cfg = RampConfig(target=server.target, models=[("mlp", 1.0)], steps=[20], step_duration_s=0.5, warmup_s=0.2)
    return run_soak(args, cfg, say=say)


def test_the_soak_runs_on_the_capacity_ramps_worker_processes(soak_server):
    """The soak's ramp started --workers processes of its own (each a spawned interpreter's imports) as the
    capacity ramp's were stopped: it runs on those (WorkerProcesses), stopped once, after it."""
    before = set(multiprocessing.active_children())
    workers: list[tuple[str, set[int]]] = []  # per line said, the bench's worker processes alive then

    def say(line: str) -> None:
        workers.append((line, {p.pid for p in set(multiprocessing.active_children()) - before}))

    result = _short_soak(soak_server, say)
    assert result["interrupted"] is None and result["soak"]["requests"]["errors"] == 0
    soak_at = next(i for i, (line, _) in enumerate(workers) if line.startswith("soak: "))
    # The capacity ramp's step (its end said), the soak's line, the soak's step (as it starts, and its end).
    capacity = [alive for line, alive in workers[:soak_at] if line.startswith("step 1/1: achieved")]
    soak = [alive for line, alive in workers[soak_at + 1 :] if line.startswith("step 1/1: ")]
    assert len(capacity) == 1 and len(capacity[0]) == 2 and len(soak) == 2, workers
    assert workers[soak_at][1] == soak[0] == soak[1] == capacity[0], workers
    assert not set(multiprocessing.active_children()) - before


@pytest.mark.parametrize("when", ["begins", "returns"])
def test_a_ctrl_c_as_the_soaks_workers_stop_is_held_until_they_have_stopped(soak_server, monkeypatch, capfd, when):
    """The workers are stopped once both ramps are done: a signal then (a real SIGINT, raised as the stop begins or
    returns) comes after everything was measured, and is held until the stop is done, then said as a ramp's late
    signals are (Ramp.late). Caught, not held, one as the stop began ended it there: the workers were left running.
    It is said as it comes too: a worker that would not exit holds the stop 10 s, and held silently, a Ctrl-C there
    did nothing to be seen for as long."""
    stop = WorkerProcesses.stop

    def stop_with_a_ctrl_c(self) -> None:
        if when == "begins":
            signal.raise_signal(signal.SIGINT)
        stop(self)
        if when == "returns":
            signal.raise_signal(signal.SIGINT)

    monkeypatch.setattr(WorkerProcesses, "stop", stop_with_a_ctrl_c)
    before = set(multiprocessing.active_children())
    said: list[str] = []
    previous = _signals_interrupt()  # the CLI's handlers: the signal read as `wok bench ramp --soak` reads it
    try:
        result = _short_soak(soak_server, said.append)
        left = set(multiprocessing.active_children()) - before
    finally:
        _restore_signals(previous)
        for p in set(multiprocessing.active_children()) - before:
            p.kill()
            p.join()
    assert result["interrupted"] is None and result["soak"]["requests"]["errors"] == 0
    assert not left, left
    assert said[-1] == "KeyboardInterrupt: SIGINT as the workers stopped: the soak measured is the result", said
    held = "wok bench: SIGINT as the workers stop (up to 10 s): waited for, then the soak measured is the result"
    assert capfd.readouterr().err.count(held) == 1


@pytest.mark.parametrize(
    ("slo_p99_ms", "kept"), [(2000.0, "the soak measured is the result"), (0.001, "the steps run are the result")]
)
def test_a_signal_as_a_soaks_replicas_stop_says_what_the_result_is(slo_p99_ms, kept, monkeypatch, capfd):
    """A soak is one step: "the steps run are the result" (a ramp's words) was said for it as its replicas stopped.
    A real run on a real replica, a real SIGINT as their stop begins: with an SLO the capacity ramp meets the soak
    runs and is the result; with one it misses, no soak runs and the capacity ramp's steps are the result."""
    close = faults.ReplicaSet.close
    stopped: list[faults.ReplicaSet] = []

    def close_with_a_ctrl_c(self, say=None) -> None:
        stopped.append(self)
        signal.raise_signal(signal.SIGINT)
        close(self, say)

    monkeypatch.setattr(faults.ReplicaSet, "close", close_with_a_ctrl_c)
    args = argparse.Namespace(
        capacity=None, soak="1s", soak_window=None, rss_every=None, soak_load="50%", replicas=1,
        serve_args="--models mlp --torch-threads 1", replica_host=None, metrics_url="none",
    )  # fmt: skip
    cfg = RampConfig(
        target="127.0.0.1:1", models=[("mlp", 1.0)], steps=[20], step_duration_s=0.5, warmup_s=0.2,
        slo_p99_ms=slo_p99_ms,
    )  # fmt: skip
    said: list[str] = []
    interrupts = _signals_interrupt()  # the CLI's handlers: the signal read as `wok bench ramp --soak` reads it
    try:
        result = run_soak(args, cfg, say=said.append)
    finally:
        _restore_signals(interrupts)
    assert (result["soak"] is not None) == (slo_p99_ms > 1), result["warnings"]
    assert len(stopped) == 1 and all(r.proc.poll() is not None for r in stopped[0].replicas)
    assert said[-1] == f"KeyboardInterrupt: SIGINT as the replicas stopped: {kept}", said
    held = f"wok bench: SIGINT as the replicas stop (up to {stopped[0].stop_wait_s:g} s): waited for, then {kept}\n"
    assert capfd.readouterr().err.count(held) == 1


def test_a_soak_has_each_warning_of_its_pool_once(soak_server, monkeypatch):
    """The soak step runs on the capacity ramp's pool (`pool_of`), so what the pool's build said was in both ramps'
    results: the run's warnings (its JSON, and the table's `warning:` lines) held each twice, once prefixed "capacity
    ramp: ". A pool cap of 4 KiB holds 3 of the mlp's requests (1 KiB and a header), not 256: a real plan note."""
    from wok.bench import runner
    from wok.bench.report import _verdict_lines

    monkeypatch.setattr(runner, "POOL_CAP_BYTES", 4 << 10)
    result = _short_soak(soak_server, lambda line: None)
    assert result["interrupted"] is None and result["soak"]["requests"]["errors"] == 0
    about_pool = [w for w in result["warnings"] if "fit in the pool's cap" in w]
    assert about_pool == [
        "model 'mlp': its requests are 1.0 KiB each, so 3 of them fit in the pool's cap of 0.00390625 "
        "MiB, not 256: the values sent repeat every 3 requests"
    ], result["warnings"]
    assert [line for line in _verdict_lines(result) if "fit in the pool's cap" in line] == [f"warning: {about_pool[0]}"]
    # The capacity ramp's own warnings keep their prefix.
    assert any(w.startswith("capacity ramp: every step met the SLO") for w in result["warnings"]), result["warnings"]


def test_soak_end_to_end(runs):
    status, stdout, stderr, out = _finished(runs, "e2e")
    assert status == 0, stderr[-3000:]
    result = json.loads(out.read_text())
    soak = result["soak"]
    assert soak["schema"] == "wok.soak/1" and soak["capacity"]["source"] == "given"
    assert soak["capacity"]["load_qps"] == 50.0 and result["steps"][0]["nominal_qps"] == 50.0
    assert len(soak["windows"]) == 4 and sum(w["sent"] for w in soak["windows"]) == soak["requests"]["sent"] > 50
    # Every 0.2 s over the 2 s soak, on a grid from its first send, and once more at its end: 12,
    # less the ticks a slow scrape overran (7 on a slow host when each scrape stretched the cadence).
    times = [t for t, _ in soak["rss"]["samples"]]
    assert soak["rss"]["first_mib"] > 50 and len(times) >= 8, times
    assert soak["p99"]["windows"] == 4 and "RSS:" in stdout and "P99: first window" in stdout


def test_a_soak_on_replicas_reads_the_rss_of_each_and_stops_them(runs):
    status, stdout, stderr, out = _finished(runs, "replicas")
    assert status == 0 and "killed" not in stderr, stderr[-3000:]
    result = json.loads(out.read_text())
    soak, replicas = result["soak"], result["replicas"]
    assert [r["replica"] for r in replicas] == [0, 1] and result["interrupted"] is None
    assert soak["capacity"]["source"] == "measured" and soak["capacity"]["steps"][0]["nominal_qps"] == 20
    assert soak["requests"]["sent"] > 0 and soak["requests"]["errors"] == 0
    assert soak["rss"]["urls"] == [f"{r['admin_url']}/metrics" for r in replicas]
    # Each sample reads both replicas (a wok serve of the mlp: over 50 MiB each), and the total is their sum.
    samples = [vs for _, vs in soak["rss"]["samples"]]
    assert len(samples) >= 3 and all(len(vs) == 2 and min(vs) > 50 * MIB for vs in samples), samples
    assert soak["rss"]["last_mib"] == pytest.approx(sum(samples[-1]) / MIB)
    assert "RSS:" in stdout and "P99: first window" in stdout
    # Stopped as the run ended: their processes are gone (reaped by the bench).
    for r in replicas:
        (pid,) = r["pids"]
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_a_burst_soak_holds_its_share_of_the_offered_capacity_and_reports_the_capacitys_verdict(runs):
    """A default burst offers about twice its step rate. The soak holds 50% of the capacity's
    offered rate (it used to run 50% of the offered rate as a step rate: twice the load), and
    the run's verdict, warnings and --require-qps are the capacity ramp's, not the soak step's."""
    status, stdout, stderr, out = _finished(runs, "burst")
    assert status == 0, stderr[-3000:]
    result = json.loads(out.read_text())
    cap = result["soak"]["capacity"]
    assert cap["source"] == "measured" and cap["steps"][-1]["nominal_qps"] == 40
    capacity = cap["steps"][-1]["offered_qps"]  # both steps met a 2 s SLO
    assert capacity > 60 and cap["qps"] == capacity and cap["load_qps"] == pytest.approx(capacity / 2)
    (step,) = result["steps"]
    assert step["offered_qps"] == pytest.approx(capacity / 2) and step["nominal_qps"] == cap["load_nominal_qps"]
    # A whole burst step (no warm-up) offers 1 + 0.4·√(2π) times its step rate.
    assert step["nominal_qps"] == pytest.approx(capacity / 2 / (1 + 0.4 * math.sqrt(2 * math.pi)), rel=1e-3)
    assert result["max_qps_under_slo"] == capacity and result["soak"]["verdict_from"] == "capacity ramp"
    assert result["stopped_early"] is None  # the capacity ramp's: it ran both steps
    # The knee and its flag are the capacity ramp's both (both steps kept up: none).
    assert result["knee_qps"] is None and result["knee_at_or_below_first_step"] is False
    assert not any(w.startswith("every step met") for w in result["warnings"])
    assert any(w.startswith("capacity ramp: every step met the SLO") for w in result["warnings"])
    assert "from the capacity ramp's steps" in stdout


def _soak_child(server, tmp_path, *args: str) -> tuple[subprocess.Popen, Path]:
    out = tmp_path / "soak.json"
    cmd = [sys.executable, "-m", "wok", "bench", "ramp", "--target", server.target, "--metrics-url", "none"]
    cmd += ["--workers", "1", "--warmup", "0.2s", "--json", str(out), *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), out


def _interrupt_at(proc: subprocess.Popen, starts: str) -> str:
    """SIGINT once stderr shows a line starting with `starts`; then all of stderr."""
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if line.startswith(starts):
            proc.send_signal(signal.SIGINT)
            break
    else:
        raise AssertionError("".join(seen)[-3000:])
    try:
        _, rest = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise AssertionError(f"still running 30 s after SIGINT:\n{''.join(seen)[-3000:]}") from None
    return "".join(seen) + rest


def _cut_soak_args(scraped: bool):
    """test_a_signal_as_the_soak_waits_for_its_end_cuts_it_there's run: its arguments, given the server."""

    def args(server) -> list[str]:
        if scraped:
            metrics = next(line.split("metrics on ")[1] for line in server.log if "metrics on http://" in line)
        else:
            metrics = "none"
        args = ["--arrival", "constant", "--capacity", "0.4", "--soak-load", "100%", "--soak", "4s"]
        return [*args, "--soak-window", "1s", "--rss-every", "0.2s", "--metrics-url", metrics]

    return args


# The signal tests' runs: (test, parameter id) → the run's arguments (given the server), and the start of
# the stderr line at which it gets SIGINT.
SIGNALLED = {
    ("test_ctrl_c_in_the_capacity_ramp_starts_no_soak", None): (
        lambda server: ["--steps", "20,40,80", "--step-duration", "0.5s", "--soak", "60s"],
        "step 2/3:",
    ),
    # The soak's one step, after the capacity ramp's two.
    ("test_ctrl_c_in_the_soak_step_keeps_the_capacity_ramp", None): (
        lambda server: ["--steps", "20,40", "--step-duration", "0.5s", "--soak", "60s"],
        "step 1/1:",
    ),
    # Sends at 0 and 2 s of its 3.2 s: once both are answered, it waits ~1.2 s for its end.
    ("test_a_signal_as_the_capacity_ramps_last_step_waits_for_its_end_starts_no_soak", None): (
        lambda server: ["--arrival", "constant", "--steps", "0.5", "--step-duration", "3s", "--soak", "60s"],
        "step 1/1: every answer is in",
    ),
    # Sends at 0 and 2.5 s of the 4 s: once both are answered, it waits ~1.5 s for its end.
    **{
        ("test_a_signal_as_the_soak_waits_for_its_end_cuts_it_there", case): (
            _cut_soak_args(case == "metrics"),
            "step 1/1: every answer is in",
        )
        for case in ("no-metrics", "metrics")
    },
}


def _key(item) -> tuple[str, str | None]:
    callspec = getattr(item, "callspec", None)
    return item.originalname, callspec.id if callspec else None


@pytest.fixture(scope="module")
def signalled(request, tmp_path_factory, soak_server):
    """{(test, parameter id): a future of (the run's process, its result's path, its stderr)} for the
    selected signal tests, their runs all started at once, each interrupted by a thread of its own at
    its line (a test reading the line later would signal the run past the point it tests). Each run is
    mostly waiting (imports, planned steps, its own ~1.5 s hold for its end), and their loads (at most
    80 QPS) are a small part of the server's capacity. Not autouse: made by the first signal test, after
    the module's runs (`runs`) are judged, so that their ramps share the host with none of these."""
    selected = {_key(item) for item in request.session.items if getattr(item, "module", None) is request.module}
    wanted = {key: spec for key, spec in SIGNALLED.items() if key in selected}
    started: list[subprocess.Popen] = []

    def run(args, starts: str) -> tuple[subprocess.Popen, Path, str]:
        proc, out = _soak_child(soak_server, tmp_path_factory.mktemp("signalled"), *args(soak_server))
        started.append(proc)
        return proc, out, _interrupt_at(proc, starts)

    pool = ThreadPoolExecutor(max(len(wanted), 1))
    try:
        yield {key: pool.submit(run, args, starts) for key, (args, starts) in wanted.items()}
    finally:
        for proc in started:
            if proc.poll() is None:
                proc.kill()
        pool.shutdown(wait=True)


def _signalled_run(signalled: dict, request) -> tuple[subprocess.Popen, Path, str]:
    """The test's run, once interrupted and ended: its process, its result's path and its stderr."""
    return signalled[_key(request.node)].result(timeout=100)


def test_ctrl_c_in_the_capacity_ramp_starts_no_soak(signalled, request):
    """It used to soak at 80 % of the steps reached so far (exit 0, `interrupted` null)."""
    proc, out, err = _signalled_run(signalled, request)
    assert proc.returncode == 0, err[-3000:]
    assert "\nsoak: " not in err and "the capacity ramp was cut short: no soak" in err
    result = json.loads(out.read_text())
    assert result["soak"] is None and [s["nominal_qps"] for s in result["steps"]] == [20]
    assert result["interrupted"]["by_signal"] is True
    assert result["interrupted"]["reason"].startswith("ramp ended early at 40 QPS: KeyboardInterrupt")


def test_ctrl_c_in_the_soak_step_keeps_the_capacity_ramp(signalled, request):
    """It used to exit 130 with nothing written, the capacity ramp's steps lost."""
    proc, out, err = _signalled_run(signalled, request)
    assert proc.returncode == 0, err[-3000:]
    result = json.loads(out.read_text())
    # Cut before the soak's first send (about 0.2 s after its progress line): no soak section;
    # after it, the part measured, marked `cut` (tests/bench/test_soak_cut.py).
    if result["soak"] is None:
        capacity_steps = result["steps"]
    else:
        assert result["soak"]["cut"] is not None and result["steps"] == []
        capacity_steps = result["soak"]["capacity"]["steps"]
    assert [s["nominal_qps"] for s in capacity_steps] == [20, 40]
    assert result["max_qps_under_slo"] == capacity_steps[-1]["offered_qps"]
    reason = result["interrupted"]["reason"]
    assert result["interrupted"]["by_signal"] is True and reason.startswith("soak ended early: KeyboardInterrupt")
    assert reason in result["warnings"]


def test_a_signal_as_the_capacity_ramps_last_step_waits_for_its_end_starts_no_soak(signalled, request):
    """The ramp is whole then (`Ramp.late_signal`), but the soak, minutes long, started all the same:
    a whole soak, `interrupted` null, exit 0, the signal said on stderr alone."""
    proc, out, err = _signalled_run(signalled, request)
    assert proc.returncode == 0, err[-3000:]
    assert "\nsoak: " not in err and "soak not started: KeyboardInterrupt: SIGINT" in err, err[-3000:]
    # One line for the one signal: the ramp's own "... after the last step: the steps run are the result" came too.
    assert [line for line in err.splitlines() if "SIGINT" in line] == ["soak not started: KeyboardInterrupt: SIGINT"]
    result = json.loads(out.read_text())
    assert result["soak"] is None and [(s["nominal_qps"], s["ok"]) for s in result["steps"]] == [(0.5, 1)]
    assert result["max_qps_under_slo"] == result["steps"][0]["offered_qps"]
    reason = "soak not started: KeyboardInterrupt: SIGINT"
    assert result["interrupted"] == {"reason": reason, "by_signal": True, "phase": "soak"}
    assert reason in result["warnings"]


@pytest.mark.parametrize("scraped", [False, True], ids=["no-metrics", "metrics"])
def test_a_signal_as_the_soak_waits_for_its_end_cuts_it_there(signalled, request, scraped):
    """Every answer in, the soak waits for its end (its schedule ended early): in `Ramp._hold_to`, or
    with --metrics-url in the scrape at its end. A signal there wrote a whole soak (`interrupted` null,
    `cut` null) though its RSS watch ended short of its duration, the signal said on stderr alone; with
    --metrics-url it ended the run with exit 130 and nothing written."""
    proc, out, err = _signalled_run(signalled, request)
    assert proc.returncode == 0, err[-3000:]
    result = json.loads(out.read_text())
    reason = "soak ended early: KeyboardInterrupt: SIGINT"
    assert result["interrupted"] == {"reason": reason, "by_signal": True, "phase": "soak"}
    assert result["warnings"].count(reason) == 1
    soak = result["soak"]
    cut = soak["cut"]
    # One line for the cut: the base ramp's "... after the last step: the steps run are the result" came first.
    said = [line for line in err.splitlines() if "SIGINT" in line]
    assert said == [f"{reason}; the soak's {cut['at_s']:g} s measured are kept"], err[-3000:]
    # Nothing was in flight or sent after it: the cut leaves only the RSS watch's end out.
    assert (cut["in_flight"], cut["sent_after"], cut["workers_lost"]) == (0, 0, 0)
    assert 0 < cut["at_s"] < 4.0 and soak["requests"] == {"sent": 2, "ok": 2, "errors": 0}
    windows = soak["windows"]
    assert len(windows) == math.ceil(cut["at_s"]) and windows[-1]["length_s"] < 1.0
    assert all(t <= cut["at_s"] for t, _ in soak["rss"]["samples"])
    if scraped:
        assert soak["rss"]["first_mib"] > 50
    # The soak step itself is whole (every answer in, over its planned window): kept.
    assert [(s["nominal_qps"], s["ok"]) for s in result["steps"]] == [(soak["capacity"]["load_nominal_qps"], 2)]


def test_a_soak_without_capacity_writes_the_capacity_ramp_and_exits_3(runs):
    """No step meets a 1 µs SLO. It used to exit 1 (kept for a failed target or worker) and write nothing."""
    status, _, err, out = _finished(runs, "no_capacity")
    assert status == 3, err[-3000:]
    assert "no step of the ramp met the SLO: no capacity to soak at (give --capacity)" in err
    result = json.loads(out.read_text())
    assert result["soak"] is None and result["max_qps_under_slo"] is None and len(result["steps"]) == 1
    assert result["interrupted"] is None and any("no capacity to soak at" in w for w in result["warnings"])
    # Its one step met the stop rule (P99 over 10 × 1 µs), and was the last planned: no step skipped, and none said
    # so (it printed "stopping early" while `stopped_early` was null).
    assert "stopping early" not in err and result["stopped_early"] is None


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--capacity", "10"], "--capacity is for --soak, which was not given: it would be ignored"),
        (["--soak-load", "50%"], "--soak-load is for --soak"),
        (["--soak-window", "10s", "--rss-every", "1s"], "--soak-window, --rss-every are for --soak, which was not"),
    ],
)
def test_soak_options_without_soak_are_refused(args, says, wok_cli):
    status, _, err = wok_cli("bench", "ramp", "--metrics-url", "none", "--target", "127.0.0.1:1", *args)
    assert status == 2 and says in err, err


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--soak", "0s", "--capacity", "10"], "--soak: expected a finite duration > 0; got '0s'"),
        (["--soak", "1s", "--soak-load", "150%", "--capacity", "10"], "--soak-load"),
        (["--soak", "1s", "--capacity", "0"], "--capacity: expected a rate > 0; got 0"),
        (["--soak", "--fault", "kill:at=1s", "--replicas", "1"], "--soak runs without --fault"),
        (["--soak", "1s", "--capacity", "10", "--replicas", "0"], "--replicas: expected an integer >= 1; got 0"),
        (["--soak", "1s", "--capacity", "10", "--arrival", "sawtooth:low=5,high=15"], "does not follow the step's"),
    ],
)
def test_cli_refuses_bad_soak_options(args, says, wok_cli):
    target = [] if "--replicas" in args else ["--target", "127.0.0.1:1"]  # the bench aims at its replicas
    status, _, err = wok_cli("bench", "ramp", "--metrics-url", "none", *target, *args)
    assert status == 2 and says in err, err


@pytest.mark.parametrize("text", ["٠.٨", "٨٠%", "０.８"])
def test_parse_fraction_refuses_digits_other_than_ascii(text):
    """float() read "٠.٨" as 0.8."""
    with pytest.raises(ValueError, match=r"expected a share of the capacity such as 80% or 0\.8"):
        parse_fraction(text)
