"""bench/compare.py: /proc accounting, aggregation, table and JSON shape, and a wok-only smoke run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from wok.bench import compare
from wok.bench.analysis import max_qps_under_slo
from wok.cpulatency import read_constraint

ROOT = Path(__file__).resolve().parents[2]
# WAKEUP_BOUND: the tests marked `serial` (run alone, after the parallel pass: tests/conftest.py) hold the machine's
# CPU wake-up latency bound (/dev/cpu_dma_latency), which every process's timing meets, and check that it is back
# to what it was before: a second worker's test holding a bound of its own (a `wok serve --cpu-wakeup-latency`)
# would move it meanwhile. The others judge no time or rate against a bound (their ramps' CPU and latency figures
# are checked present, a success rate against a 30 s deadline), so they run on the parallel pass's workers.


def stat_line(pid, ppid, pgrp, session, utime, stime, rss, comm="py thon)", cutime=0, cstime=0):
    # Fields 1..24 of /proc/PID/stat; the name holds a space and a ')' on purpose.
    fields = [str(pid), f"({comm})", "S", str(ppid), str(pgrp), str(session)] + ["0"] * 7
    fields += [str(utime), str(stime), str(cutime), str(cstime)] + ["0"] * 6 + [str(rss)]
    return " ".join(fields) + " 0 0 0\n"


def fake_proc(root: Path, procs: list[tuple]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for old in root.iterdir():
        for f in old.iterdir():
            f.unlink()
        old.rmdir()
    (root / "self").mkdir()
    for p in procs:
        d = root / str(p[0])
        d.mkdir()
        (d / "stat").write_text(stat_line(*p[:7], **(p[7] if len(p) > 7 else {})))
    return root


def test_parse_stat_survives_odd_names():
    st = compare.parse_stat(stat_line(42, 1, 42, 42, 10, 5, 300, comm="a) b", cutime=2, cstime=3))
    assert (st.pid, st.ppid, st.pgrp, st.session, st.cpu_ticks, st.rss_pages) == (42, 1, 42, 42, 20, 300)


def test_tree_usage_and_cpu_per_request_from_fake_proc(tmp_path):
    root = tmp_path / "proc"
    # Leader 100; 101 in its session; 102 left the session (setsid) but is 101's child; 200 unrelated.
    fake_proc(root, [(100, 1, 100, 100, 100, 50, 1000), (101, 100, 100, 100, 30, 20, 500),
                     (102, 101, 102, 102, 0, 0, 250), (200, 1, 200, 200, 999, 999, 9999)])  # fmt: skip
    before = compare.tree_usage(100, proc_root=root, ticks_per_s=100, page_size=4096)
    assert before.pids == 3
    assert before.cpu_s == pytest.approx(2.0)  # (150 + 50) ticks / 100 Hz
    assert before.rss_bytes == 1750 * 4096
    # One second later: the tree used 150 more ticks (1.5 s of CPU), 102 grew.
    fake_proc(root, [(100, 1, 100, 100, 200, 80, 1000), (101, 100, 100, 100, 50, 20, 500),
                     (102, 101, 102, 102, 10, 10, 300), (200, 1, 200, 200, 5000, 5000, 9999)])  # fmt: skip
    after = compare.tree_usage(100, proc_root=root, ticks_per_s=100, page_size=4096)
    assert after.cpu_s == pytest.approx(3.7)
    cpu = compare.cpu_per_request(before, after, wall_s=2.0, ok_requests=1000)
    assert cpu["cpu_s"] == pytest.approx(1.7)
    assert cpu["us_per_request"] == pytest.approx(1700.0)
    assert cpu["cores"] == pytest.approx(0.85)
    assert compare.cpu_per_request(before, after, 2.0, 0)["us_per_request"] is None


def test_system_busy_and_host_load(tmp_path):
    (tmp_path / "stat").write_text("cpu  100 0 50 1000 30 5 5 0 0 0\ncpu0 1 2 3\n")
    assert compare.system_busy_s(tmp_path, ticks_per_s=100) == pytest.approx(1.6)
    load = compare.host_load(server_cpu_s=1.0, loadgen_cpu_s=0.5, busy_s=2.0, wall_s=2.0)
    assert load == {"loadgen_cores": 0.25, "other_cores": 0.25}


def test_spread_median_and_range():
    assert compare.spread([3.0, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3}
    assert compare.spread([4.0, None, float("nan"), 2.0]) == {"median": 3.0, "min": 2.0, "max": 4.0, "n": 2}
    assert compare.spread([None]) == {"median": None, "min": None, "max": None, "n": 0}


def step(qps, p50, p99, us=None, ok=1.0):
    return {
        "offered_qps": qps,
        "achieved_qps": qps * ok,
        "success_rate": ok,
        "latency_ms": {"p50": p50, "p99": p99},
        "server_cpu": None if us is None else {"us_per_request": us},
    }


def synthetic_runs():
    runs = []
    probes = [{"cold_forward_us": c} for c in (100.0, 200.0, 150.0)]
    for rep, (p99_1000, cap) in enumerate([(30.0, 1600), (60.0, 1200), (40.0, 2000)], start=1):
        steps = [step(100, 2.0, 5.0 + rep, us=900), step(1000, 3.0, p99_1000, us=300 + rep)]
        steps.append(step(cap, 20.0, 150.0))
        steps.append(step(4000, 900.0, 9000.0, ok=0.4))
        max50 = max_qps_under_slo(steps, 50.0)
        runs.append({"rep": rep, "server": "a", "error": None, "ready_s": 1.0, "peak_rss_bytes": rep * 2**20,
                     "max_qps": {"50": max50, "200": max_qps_under_slo(steps, 200.0)}, "steps": steps,
                     "host_probe": probes[rep - 1]})  # fmt: skip
    runs.append({"rep": 1, "server": "b", "error": None, "ready_s": 2.0, "peak_rss_bytes": 2**30,
                 "max_qps": {"50": None, "200": 100.0}, "steps": [step(100, 60.0, 120.0, us=5000)]})  # fmt: skip
    runs.append({"rep": 2, "server": "b", "error": "TimeoutError: not ready"})
    return runs


def test_aggregate_table_and_json_shape():
    runs = synthetic_runs()
    config = {"servers": ["a", "b"], "report_at_qps": [100.0, 1000.0]}
    doc = compare.build_doc(
        config, {"a": {"version": "1"}, "b": {"version": "2"}}, runs, created="2026-01-01T00:00:00Z"
    )
    assert doc["schema"] == "wok.compare/1"
    a, b = doc["summary"]["a"], doc["summary"]["b"]
    assert a["runs"] == 3 and b["runs"] == 1  # the failed run is left out
    # rep 2: 60 ms at 1000; every ramp fails at 4,000, so no maximum is a mere lower bound
    assert a["max_qps_p99_50ms"] == {"median": 1000.0, "min": 100.0, "max": 1000.0, "n": 3, "capped": 0}
    assert a["max_qps_p99_200ms"] == {"median": 1600.0, "min": 1200.0, "max": 2000.0, "n": 3, "capped": 0}
    assert a["p99_ms_at_1000"] == {"median": 40.0, "min": 30.0, "max": 60.0, "n": 3}
    assert a["cpu_us_per_request_at_1000"]["median"] == 302.0
    assert a["peak_rss_mb"] == {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3}
    assert b["max_qps_p99_50ms"]["median"] == 0.0  # lowest step failed: counts as 0
    assert b["p99_ms_at_1000"]["n"] == 0
    assert a["host_probe_cold_us"] == {"median": 150.0, "min": 100.0, "max": 200.0, "n": 3}
    assert b["host_probe_cold_us"]["n"] == 0  # b's run was not probed
    text = compare.render_table(doc)
    probe_row = next(line for line in text.splitlines() if line.startswith("host probe: cold forward, µs"))
    assert probe_row.split()[-2:] == ["(100–200)", "-"]
    assert "1,600 (1,200–2,000)" in text and "max QPS, P99 ≤ 50 ms" in text
    md = compare.render_table(doc, markdown=True).splitlines()
    assert md[0] == "| metric | a | b |" and len({line.count("|") for line in md}) == 1
    json.loads(json.dumps(compare.clean(doc), allow_nan=False))


def test_unknown_server_is_refused():
    with pytest.raises(SystemExit):
        compare.parse_args(["--servers", "wok,nope"])


@pytest.mark.parametrize("value", ["-1", "nan", "inf"])
def test_a_negative_or_endless_host_probe_is_refused(value, capsys):
    with pytest.raises(SystemExit) as exc:
        compare.parse_args(["--servers", "bare", "--host-probe", value])
    assert exc.value.code == 2
    assert f"--host-probe: expected seconds >= 0 (0: off); got {value}" in capsys.readouterr().err


def test_a_probe_that_fails_is_recorded_and_keeps_the_run(tmp_path, monkeypatch):
    from wok.bench import hostprobe

    calls = []

    def failing(seconds):
        calls.append(seconds)
        raise RuntimeError(f"probe {len(calls)} broke")

    monkeypatch.setattr(hostprobe, "probe", failing)
    kwargs = {"steps": [50.0], "step_duration_s": 0.5, "warmup_s": 0.2, "arrival": "poisson",
              "slo_p99_ms": 200.0, "workers": 1, "stop_factor": 20.0, "seed": 5}  # fmt: skip
    try:
        record = compare.run_one(compare.PEERS["bare"], 1, kwargs, tmp_path, probe_s=0.1)
    finally:
        compare.stop_all()
    assert calls == [0.1, 0.1]  # before and after the ramp
    assert record["seed"] == 5
    assert record["error"] is None and record["steps"][0]["success_rate"] == 1.0  # the ramp is kept
    probe = record["host_probe"]
    assert probe["before"]["error"] == "RuntimeError: probe 1 broke"
    assert probe["after"]["error"] == "RuntimeError: probe 2 broke"
    assert probe["cold_forward_us"] is None
    port = record["target"].rsplit(":", 1)[1]
    assert f"bare_server.py {port}" not in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout


def test_a_run_carries_its_ramps_stop_rule(tmp_path):
    """A ramp its stop rule ended before its last step said so in its result (`stopped_early`), which the run's
    record left out: its max QPS read as that of every step asked for."""
    kwargs = {"steps": [50.0, 100.0], "step_duration_s": 0.5, "warmup_s": 0.2, "arrival": "poisson",
              "slo_p99_ms": 1e-3, "workers": 1, "stop_factor": 1.0, "seed": 5}  # fmt: skip
    try:
        record = compare.run_one(compare.PEERS["bare"], 1, kwargs, tmp_path)
    finally:
        compare.stop_all()
    assert record["error"] is None and len(record["steps"]) == 1
    stop = record["stopped_early"]
    assert (stop["rule"], stop["steps_run"], stop["steps_planned"]) == ("stop_factor", 1, 2), stop
    assert stop["at_qps"] == record["steps"][0]["offered_qps"]
    assert stop["reason"].startswith("the step's P99 ")


def _compare_here(argv: list[str], capsys) -> tuple[int, str, str]:
    """bench/compare.py's main in this process, which has its imports done: (status, stdout, stderr).
    The script's own entry point is run as a child by the refusal test below."""
    try:
        status = compare.main(argv)
    finally:
        compare.stop_all()
    out, err = capsys.readouterr()
    return status, out, err


def test_smoke_wok_and_the_bare_transport(tmp_path, capsys):
    out = tmp_path / "c.json"
    argv = ["--servers", "wok,bare", "--steps", "50,100", "--step-duration", "0.5s", "--warmup", "0.2s",
            "--reps", "1", "--host-probe", "0.1", "--workers", "1", "--json", str(out)]  # fmt: skip
    status, stdout, stderr = _compare_here(argv, capsys)
    assert status == 0, stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["schema"] == "wok.compare/1"
    assert doc["config"]["host_probe_s"] == 0.1
    assert (doc["config"]["seed"], doc["config"]["seeds"]) == (0, "per-rep")
    run, bare = doc["runs"]
    assert run["seed"] == bare["seed"] == 0  # one repetition, one schedule
    for r in (run, bare):  # probed before and after each ramp
        probe = r["host_probe"]
        assert probe["before"]["schema"] == probe["after"]["schema"] == "wok.hostprobe/2"
        cold = (probe["before"]["cold_forward_us"], probe["after"]["cold_forward_us"])
        assert min(cold) > 0 and probe["cold_forward_us"] == pytest.approx(sum(cold) / 2)
    assert "host probe: cold forward, µs" in stdout
    assert bare["server"] == "bare" and bare["error"] is None
    assert all(s["success_rate"] == 1.0 for s in bare["steps"])
    assert run["server"] == "wok" and run["error"] is None
    assert [s["offered_qps"] for s in run["steps"]] == [50.0, 100.0]
    assert all(s["success_rate"] == 1.0 for s in run["steps"])
    assert all(s["server_cpu"]["us_per_request"] > 0 for s in run["steps"])
    # The model ran on wok's named worker thread; the bare server has none.
    assert sum(s["server_cpu"]["threads_us_per_request"]["model"] for s in run["steps"]) > 0
    assert all(s["server_cpu"]["threads_us_per_request"]["model"] == 0 for s in bare["steps"])
    assert all(s["host_cpu"]["other_cores"] >= 0 for s in run["steps"])
    assert run["peak_rss_bytes"] > 10 * 2**20
    assert "max QPS, P99 ≤ 200 ms" in stdout
    port = run["target"].rsplit(":", 1)[1]
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert f"--port {port} " not in ps  # the server was stopped


@pytest.mark.serial  # (see WAKEUP_BOUND)
def test_the_harness_holds_the_wakeup_bound_for_every_server_and_drops_it(tmp_path, cpu_latency_before, capsys):
    # In this process the bound is dropped by the harness itself, not by a child's exit.
    out = tmp_path / "c.json"
    argv = ["--servers", "bare", "--steps", "50", "--step-duration", "0.3s", "--warmup", "0.1s", "--reps", "2",
            "--workers", "1", "--cpu-wakeup-latency", "0", "--host-probe", "0", "--json", str(out)]  # fmt: skip
    status, _, stderr = _compare_here(argv, capsys)
    assert status == 0, stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["config"]["cpu_wakeup_latency_us"] == 0
    assert [r["cpu_wakeup_bound_us"] for r in doc["runs"]] == [0, 0]
    assert read_constraint() == cpu_latency_before


@pytest.mark.serial  # (see WAKEUP_BOUND)
def test_a_server_holding_its_own_bound_is_recorded_with_it(tmp_path, cpu_latency_before, capsys):
    out = tmp_path / "c.json"
    argv = ["--servers", "wok-b", "--steps", "50", "--wok-variant", "wok-b=--cpu-wakeup-latency 0",
            "--step-duration", "0.3s", "--warmup", "0.1s", "--reps", "1", "--workers", "1", "--host-probe", "0",
            "--json", str(out)]  # fmt: skip
    try:
        status, _, stderr = _compare_here(argv, capsys)
    finally:
        compare.PEERS.pop("wok-b", None)
    assert status == 0, stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["config"]["cpu_wakeup_latency_us"] is None  # the harness held none
    assert [r["cpu_wakeup_bound_us"] for r in doc["runs"]] == [0]  # the server did
    assert read_constraint() == cpu_latency_before


def test_a_bound_the_device_cannot_take_is_refused_before_any_run():
    cmd = [sys.executable, str(ROOT / "bench" / "compare.py"), "--servers", "bare", "--cpu-wakeup-latency", str(2**31)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert (
        f"compare: --cpu-wakeup-latency: cpu wake-up latency: expected 0 to 2000000000 µs; got {2**31}" in proc.stderr
    )


def test_thread_groups_from_a_fake_task_folder(tmp_path):
    root = tmp_path / "proc"
    task = root / "100" / "task"
    for tid, comm, ut, st in [(100, "wok", 50, 10), (101, "wok-run-0", 30, 5), (102, "event_engine", 4, 4),
                              (103, "grpc_global_tim", 1, 1), (104, "wok", 7, 0)]:  # fmt: skip
        (task / str(tid)).mkdir(parents=True)
        fields = [str(tid), f"({comm})", "S"] + ["0"] * 10 + [str(ut), str(st)] + ["0"] * 30
        (task / str(tid) / "stat").write_text(" ".join(fields) + "\n")
    ticks = compare.thread_ticks(100, proc_root=root)
    assert ticks == {"loop": 60, "model": 35, "grpc": 10, "other": 7}
    per = compare.threads_per_request(dict.fromkeys(compare.THREAD_GROUPS, 0), ticks, ok_requests=1000, ticks_per_s=100)
    assert per == pytest.approx({"loop": 600.0, "model": 350.0, "grpc": 100.0, "other": 70.0})


def test_a_wok_variant_serves_wok_with_extra_arguments():
    peer = compare.wok_variant("wok-t1=--torch-threads 1")
    argv, _, _ = peer.launch(peer, {"grpc": 1, "metrics": 2})
    assert argv[-2:] == ["--torch-threads", "1"] and argv[1:4] == ["-m", "wok", "serve"]
    assert peer.recipe.endswith("wok serve … --torch-threads 1")
    with pytest.raises(ValueError, match="expected wok-NAME"):
        compare.wok_variant("t1=--torch-threads 1")
    args = compare.parse_args(["--servers", "wok,wok-t1", "--wok-variant", "wok-t1=--torch-threads 1"])
    assert args.server_list == ["wok", "wok-t1"]
    compare.PEERS.pop("wok-t1")


def test_a_max_qps_at_the_top_step_is_marked_as_a_lower_bound():
    # Rep 1 passes every step: its max (1,000) is only a lower bound; rep 2 fails at 1,000.
    top = [step(100, 2.0, 5.0), step(1000, 3.0, 20.0)]
    failed = [step(100, 2.0, 5.0), step(1000, 3.0, 80.0)]
    runs = [
        {
            "rep": r,
            "server": "a",
            "error": None,
            "max_qps": {"50": max_qps_under_slo(s, 50.0), "200": 1000.0},
            "steps": s,
        }
        for r, s in ((1, top), (2, failed))
    ]
    assert compare.capped(top, 50.0) and not compare.capped(failed, 50.0) and not compare.capped([], 50.0)
    summary = compare.aggregate(runs, ["a"], report_at=[100.0])["a"]
    assert summary["max_qps_p99_50ms"] == {"median": 550.0, "min": 100.0, "max": 1000.0, "n": 2, "capped": 1}
    assert summary["max_qps_p99_200ms"]["capped"] == 2  # both pass every step under 200 ms
    doc = {"config": {"servers": ["a"], "report_at_qps": [100.0]}, "summary": {"a": summary}}
    text = compare.render_table(doc)
    assert "550 (100–1,000; top step in 1 of 2)" in text
    assert "1,000 (1,000–1,000; top step in 2 of 2)" in text


def test_each_repetition_draws_its_own_schedule_shared_by_its_servers():
    args = compare.parse_args(["--servers", "wok,bare", "--seed", "7"])
    assert args.seeds == "per-rep"
    assert [compare.rep_seed(args, r) for r in (1, 2, 3)] == [7, 8, 9]
    same = compare.parse_args(["--servers", "wok,bare", "--seed", "7", "--seeds", "same"])
    assert [compare.rep_seed(same, r) for r in (1, 2, 3)] == [7, 7, 7]
    assert compare.rep_seed(compare.parse_args(["--servers", "bare"]), 1) == 0  # rep 1 as before --seeds


def test_a_report_rate_that_is_not_a_step_is_warned_about(capsys):
    compare.parse_args(["--servers", "wok", "--steps", "100,400", "--report-at", "100,1000"])
    assert "--report-at 1000 not among --steps" in capsys.readouterr().err
    compare.parse_args(["--servers", "wok"])  # the defaults hold every report rate
    assert "not among" not in capsys.readouterr().err
