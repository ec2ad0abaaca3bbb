"""bench/outputs.py: the standalone scripts of bench/ check their --json path before measuring, as the
`wok` commands do (tests/bench/test_cli.py)."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import itertools
import os
import re
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import uvloop

BENCH = Path(__file__).resolve().parents[2] / "bench"

# Each script with a --json output, and the options it needs besides: compare's default peers
# would build their venvs first (that was the measurement's start, not the check's).
SCRIPTS = {
    "accept_rate": [],
    "balancer_overhead": [],
    "batcher_loop_cost": [],
    "ceiling": [],
    "chaos": [],
    "cold_batch": [],
    "compare": ["--servers", "wok"],
    "fuzz": [],
    "id_check_chunks": [],
    "large_decode": [],
    "gpu_check": [],
    "latency_breakdown": [],
    "linear_kernels": [],
    "metrics_overhead": [],
    "queue_memory": [],
    "refusal_cost": [],
    "slo_compare": [],
    "stream_vs_unary": [],
    "thread_sizing": [],
    "tune_check": [],
    "unhandled_cost": [],
}


@pytest.fixture(autouse=True)
def _environment_kept():
    """The scripts run in this process, and some set OMP_WAIT_POLICY as `wok serve` does (cold_batch in main,
    before its --json check; slo_compare and tune_check on import): it must not outlive the test, or the files
    that follow on the same pytest-xdist worker start their children with it. The environment is put back whole
    (a `wok` command sets GRPC_VERBOSITY, a profile points TORCHINDUCTOR_CACHE_DIR into this test's temp folder).
    Torch's threads are the scripts' own to set: the tests that reach their set_num_threads replace it."""
    env = dict(os.environ)
    yield
    for name in set(os.environ) - set(env):
        del os.environ[name]
    for name, value in env.items():
        if os.environ.get(name) != value:
            os.environ[name] = value


def test_every_script_with_a_json_output_is_listed():
    found = {
        p.stem
        for p in BENCH.glob("*.py")
        if re.search(r'add_argument\(\s*"--json"', (text := p.read_text())) and re.search(r"^def main\(", text, re.M)
    }
    assert found == set(SCRIPTS)


@pytest.fixture
def no_load(monkeypatch):
    """What starts a script's measurement (a server, a load generator, an event loop) fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("the script started measuring before it checked --json")

    # matplotlib's first import on a new machine lists its fonts with fc-list (a subprocess) to
    # build its cache: done here, before Popen is refused, or this test alone fails on a new machine.
    importlib.import_module("matplotlib.font_manager")
    for module, name in ((subprocess, "Popen"), (asyncio, "run"), (asyncio, "Runner"), (uvloop, "run")):
        monkeypatch.setattr(module, name, refuse)


@pytest.mark.parametrize("where", ["a folder", "under a file"])
@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_a_script_refuses_an_unwritable_json_before_measuring(name, where, tmp_path, capsys, no_load):
    """Each wrote its --json unchecked at the end: a bad path was found after the whole measurement
    (minutes of a ramp, a comparison of servers), as a traceback."""
    (tmp_path / "file").write_text("")
    path, why = {
        "a folder": (tmp_path, "is a folder; expected a file name"),
        "under a file": (tmp_path / "file" / "out.json", f"{tmp_path / 'file'} is not a folder"),
    }[where]
    module = importlib.import_module(f"wok.bench.{name}")
    with pytest.raises(SystemExit) as exited:
        module.main([*SCRIPTS[name], "--json", str(path)])
    assert exited.value.code == 2
    assert f"error: --json {path}: {why}\n" in capsys.readouterr().err


def test_a_file_whose_writer_makes_its_folder_may_lie_in_a_missing_one(tmp_path):
    """compare, latency_breakdown and thread_sizing make --json's folder when they write: a missing
    one is no reason to refuse them; for the others it is."""
    from wok.bench.outputs import output_problem

    assert output_problem(tmp_path / "new" / "deeper" / "out.json", folder=False, parents_made=True) is None
    assert output_problem(tmp_path / "new" / "out.json", folder=False) == f"folder {tmp_path / 'new'} does not exist"


def _lose(folder: Path) -> None:
    """What may happen to an output's folder between the up-front check and the write (removed,
    a full disk): here it becomes a file, which fails every write under it, --plot's mkdir too."""
    folder.rmdir()
    folder.write_text("")


@pytest.mark.parametrize(("option", "name"), [("--csv", "r.csv"), ("--html", "r.html"), ("--plot", "plots")])
def test_a_ramp_without_json_whose_output_fails_at_the_end_keeps_the_result(
    option, name, bench_server, tmp_path, monkeypatch, wok_cli
):
    """Only a failed --json kept the result: without --json, a --csv, --html or --plot that failed
    when written lost the whole ramp, as an option error (exit 2)."""
    import json
    import tempfile

    from wok.bench import runner

    folder, temp = tmp_path / "out", tmp_path / "temp"
    folder.mkdir()
    temp.mkdir()
    measure = runner.Ramp.run

    def measure_then_lose_the_folder(self):
        result = measure(self)
        _lose(folder)
        return result

    monkeypatch.setattr(runner.Ramp, "run", measure_then_lose_the_folder)
    monkeypatch.setattr(tempfile, "tempdir", str(temp))  # the system's temp folder, for this test
    path = folder / name
    argv = ["bench", "ramp", "--target", bench_server.target, "--steps", "20", "--step-duration", "0.5s"]
    status, _, err = wok_cli(*argv, "--warmup", "0.1s", "--workers", "1", "--metrics-url", "none", option, str(path))
    (kept,) = temp.glob("wok-bench-*.json")
    assert (status, err.splitlines()[-1]) == (
        1,
        f"wok bench: {option} {path}: Not a directory; the result is kept in {kept} instead",
    )
    result = json.loads(kept.read_text())
    assert result["schema"] == "wok.bench/2" and [s["offered_qps"] for s in result["steps"]] == [20]


class _Server:
    """A started server, as the scripts' loops see one: nothing runs."""

    def __init__(self) -> None:
        self.target = "127.0.0.1:1"
        self.ports = {"metrics": 1}

    def stop(self) -> None:
        pass


def _plot(doc: dict, path: Path) -> None:
    """A script's plot, drawn from nothing measured: only its write is the test's."""
    path.write_bytes(b"")


def _slo_compare_measured_nothing(monkeypatch, tmp_path, at_end):
    """bench/slo_compare.py's run, its profiling, servers and load replaced: straight to its end."""
    from wok.bench import slo_compare

    profile = tmp_path / "profile.json"
    profile.write_text('{"schema": "wok.profile/1", "fit": {"alpha_s": 0.001, "beta_s": 0.0001}}')
    summary = {"goodput_qps": 1.0, "refused": 0, "accepted_latency_ms": {"p99": 1.0}}
    monkeypatch.setattr(slo_compare, "start_server", lambda *args: _Server())
    monkeypatch.setattr(slo_compare, "server_counters", lambda url: {})
    monkeypatch.setattr(slo_compare, "run_load", lambda server, args: ({"steps": [{}]}, (), None))
    monkeypatch.setattr(slo_compare, "summarize", lambda *args: summary)
    monkeypatch.setattr(slo_compare, "print_table", lambda doc: at_end())
    monkeypatch.setattr(slo_compare, "plot", _plot)
    argv = ["--profile", str(profile), "--fixed", "1,1ms", "--reps", "1", "--log-dir", str(tmp_path / "logs")]
    return slo_compare, argv, "wok.slocompare/1"


def _tune_check_measured_nothing(monkeypatch, tmp_path, at_end):
    """bench/tune_check.py's run, its profile, calibration, search, servers and ramps replaced."""
    from wok.bench import compare, tune, tune_check

    profile = tmp_path / "profile.json"
    profile.write_text("{}")
    monkeypatch.setattr(tune, "load_profile", lambda path: tune.Profile(0.001, 0.0001, r2=1.0))
    monkeypatch.setattr(tune, "tune", lambda *args, **kwargs: {"chosen": None})
    monkeypatch.setattr(tune, "print_table", lambda doc: None)
    monkeypatch.setattr(tune_check, "calibrate", lambda args, t1: {"samples_s": [0.001], "method": "none"})
    monkeypatch.setattr(tune_check, "start_server", lambda *args, **kwargs: _Server())
    monkeypatch.setattr(tune_check, "ramp_config", lambda *args, **kwargs: None)
    monkeypatch.setattr(compare, "metered_ramp", lambda *args: {"max_qps_under_slo": 1.0, "knee_qps": None})
    monkeypatch.setattr(tune_check, "predict", lambda *args, **kwargs: {"max_qps_under_slo": 1.0})
    monkeypatch.setattr(tune_check, "compare_steps", lambda *args: [])
    monkeypatch.setattr(tune_check, "print_report", lambda doc: at_end())
    monkeypatch.setattr(tune_check, "plot", _plot)
    argv = ["--profile", str(profile), "--no-cpu-stage", "--tuned", "4,1ms", "--reps", "1"]
    return tune_check, [*argv, "--log-dir", str(tmp_path / "logs")], tune_check.SCHEMA


class _Forward:
    """A model's forward that computes nothing, running `at_end` (if given) on each call."""

    def __init__(self, at_end=None) -> None:
        self.at_end = at_end

    def __call__(self, x):
        if self.at_end:
            self.at_end()
        return x

    def module_for(self, device):
        return self

    def parameters(self):
        return []


class _Clock:
    """time for a script that times calls: each perf_counter reading 1 s after the last, no sleeping."""

    def __init__(self) -> None:
        self.perf_counter = itertools.count(1).__next__

    def sleep(self, seconds: float) -> None:
        pass


@contextlib.contextmanager
def _no_server(*args, **kwargs):
    """compare.local_wok's place: a server that is never started."""
    yield "127.0.0.1:1", "http://127.0.0.1:1/metrics", 0


def _accept_rate_measured_nothing(monkeypatch, tmp_path, at_end):
    from wok.bench import accept_rate

    calls = dict.fromkeys(("calls_per_s", "passes_per_s", "calls_per_pass", "wakeups_per_call"), 1.0)
    monkeypatch.setattr(accept_rate, "measure", lambda *args: (at_end(), calls | {"per_server_calls": [1]})[1])
    return accept_rate, ["--loops", "1", "--hog-us", "0", "--reps", "1"], accept_rate.SCHEMA


def _balancer_overhead_measured_nothing(monkeypatch, tmp_path, at_end):
    from wok.bench import balancer_overhead as bo

    async def run_all(targets, payload, args):
        at_end()
        keys = ("client_cpu_us_per_request", "throughput_rps", "p50_ms", "p99_ms")
        return [dict.fromkeys(keys, 1.0) | {"kind": kind, "round": 1} for kind in bo.KINDS]

    monkeypatch.setattr(bo, "bare_servers", lambda n: contextlib.nullcontext([]))
    monkeypatch.setattr(bo, "run_all", run_all)
    return bo, ["--rounds", "1"], bo.SCHEMA


def _ceiling_measured_nothing(monkeypatch, tmp_path, at_end):
    from wok.bench import ceiling, compare

    prof = {"fit": {"alpha_s": 0.001, "beta_s": 0.0001}, "batches": []}
    monkeypatch.setattr(ceiling, "write_repository", lambda folder, args: folder)
    monkeypatch.setattr(ceiling, "run_profile", lambda *args: prof)
    monkeypatch.setattr(compare, "local_wok", _no_server)
    monkeypatch.setattr(ceiling, "saturate", lambda *args: ({}, {}, {}))
    monkeypatch.setattr(ceiling, "analyse", lambda *args: {})
    monkeypatch.setattr(ceiling, "table", lambda doc: (at_end(), "")[1])
    return ceiling, [], ceiling.SCHEMA


def _cold_batch_measured_nothing(monkeypatch, tmp_path, at_end):
    from concurrent.futures import Future

    from wok import executor, models
    from wok.bench import cold_batch

    done = Future()
    done.set_result(None)

    class Executor:
        def __init__(self, servable, config) -> None:
            self.instances = [SimpleNamespace(submit=lambda *args: done)]

        def shutdown(self) -> None:
            pass

    servable = SimpleNamespace(config=SimpleNamespace(inputs=[SimpleNamespace(name="INPUT0", dims=(1,))]))
    monkeypatch.setattr(models, "build_demo", lambda name: servable)
    monkeypatch.setattr(executor, "Executor", Executor)
    monkeypatch.setattr(cold_batch, "worker_tid", lambda name: 0)
    figures = {"worker_cpu_us_per_batch": 1.0, "batch_time_us": 1.0}
    monkeypatch.setattr(cold_batch, "measure", lambda *args: (at_end(), figures)[1])
    return cold_batch, ["--sizes", "1"], cold_batch.SCHEMA


def _compare_measured_nothing(monkeypatch, tmp_path, at_end):
    from wok.bench import compare

    monkeypatch.setattr(compare, "ensure_venv", lambda peer: None)
    monkeypatch.setattr(compare, "peer_version", lambda peer: "wok")
    monkeypatch.setattr(compare, "run_one", lambda *args: {"error": None})
    monkeypatch.setattr(compare, "stop_all", lambda: None)
    monkeypatch.setattr(compare, "build_doc", lambda config, versions, runs: {"schema": compare.SCHEMA})
    monkeypatch.setattr(compare, "render_table", lambda doc: (at_end(), "")[1])
    return compare, ["--servers", "wok", "--reps", "1"], compare.SCHEMA


def _fuzz_measured_nothing(monkeypatch, tmp_path, at_end):
    from wok.bench import fuzz

    monkeypatch.setattr(fuzz, "run", lambda *args, **kwargs: (at_end(), {"schema": fuzz.SCHEMA})[1])
    return fuzz, [], fuzz.SCHEMA


def _gpu_check_measured_nothing(monkeypatch, tmp_path, at_end):
    from wok.bench import gpu_check

    class Executor:
        def __init__(self, servable, config) -> None:
            self.instances = [SimpleNamespace(slots=[])]

        def shutdown(self) -> None:
            pass

    async def server_check(device):
        at_end()
        return {"wall_s": 1.0, "mean_batch_size": 1.0, "max_abs_err": 0.0, "equal_to_cpu": True}

    monkeypatch.setattr(gpu_check, "build_demo", lambda name, **kwargs: None)
    monkeypatch.setattr(gpu_check, "Executor", Executor)
    monkeypatch.setattr(gpu_check, "drive", lambda *args: (1.0, []))
    monkeypatch.setattr(gpu_check, "overlaps", lambda results: (0, 0))
    monkeypatch.setattr(
        gpu_check, "stage_medians", lambda results: dict.fromkeys(("assemble", "h2d", "compute", "d2h"), 1.0)
    )
    monkeypatch.setattr(gpu_check, "server_check", server_check)
    return gpu_check, ["--device", "cpu", "--batches", "2", "--rows", "1"], "wok.gpu_check/2"


def _latency_breakdown_measured_nothing(monkeypatch, tmp_path, at_end):
    from wok.bench import latency_breakdown

    async def measure(qps, duration_s, seed):
        at_end()
        return {"stages_ms": {}, "requests": 1, "batches": 1, "mean_batch_size": 1.0, "flushes": {}}

    monkeypatch.setattr(latency_breakdown, "measure", measure)
    return latency_breakdown, [], latency_breakdown.SCHEMA


def _linear_kernels_measured_nothing(monkeypatch, tmp_path, at_end):
    import torch

    from wok import cpulinear, models
    from wok.bench import linear_kernels

    fast = _Forward()
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)  # this test process's, not the script's
    monkeypatch.setattr(models, "build_demo", lambda name: _Forward(at_end))
    monkeypatch.setattr(cpulinear, "onednn_available", lambda: True)
    monkeypatch.setattr(cpulinear, "with_onednn_linear", lambda module: (fast, 2, 1))
    monkeypatch.setattr(cpulinear, "chains", lambda module: [SimpleNamespace(layers=[], kernel=None)])
    monkeypatch.setattr(linear_kernels, "ROWS", (1, cpulinear.MIN_ROWS))
    monkeypatch.setattr(linear_kernels, "time", _Clock())
    return linear_kernels, ["--reps", "1", "--max-rows-rss", "4"], linear_kernels.SCHEMA


def _metrics_overhead_measured_nothing(monkeypatch, tmp_path, at_end):
    import gc

    from wok.bench import metrics_overhead

    def one_run(metrics, concurrency, seconds):
        at_end()
        return {"metrics": metrics, "requests": 1, "qps": 1.0, "server_cpu_us_per_request": 1.0}

    monkeypatch.setattr(gc, "disable", lambda: None)  # this test process's, not the script's
    monkeypatch.setattr(metrics_overhead, "one_run", one_run)
    return metrics_overhead, ["--reps", "1"], "wok.metrics_overhead/1"


def _queue_memory_measured_nothing(monkeypatch, tmp_path, at_end):
    from wok.bench import queue_memory

    async def measure(requests, max_queue_size):
        at_end()
        keys = ("queued", "rss_idle_mib", "rss_backlog_mib", "kib_per_queued")
        return dict.fromkeys(keys, 1) | {"max_queue_size": max_queue_size, "answered_at_once": {}}

    monkeypatch.setattr(queue_memory, "measure", measure)
    return queue_memory, ["--max-queue-size", "0"], queue_memory.SCHEMA


def _refusal_cost_measured_nothing(monkeypatch, tmp_path, at_end):
    from wok.bench import refusal_cost

    async def measure(server, rows_list, calls, concurrency):
        at_end()
        figures = {"server_cpu_us_per_call": 1.0, "answers_per_s": 1.0}
        return {"server": server, "rows": {str(rows): figures for rows in rows_list}}

    monkeypatch.setattr(refusal_cost, "measure", measure)
    return refusal_cost, ["--reps", "1", "--rows", "1"], refusal_cost.SCHEMA


def _stream_vs_unary_measured_nothing(monkeypatch, tmp_path, at_end):
    from wok.bench import compare, stream_vs_unary

    def measure(kind, target, pid, payload, args):
        at_end()
        return {"kind": kind} | dict.fromkeys(("server_us_per_request", "throughput_qps", "mean_batch_size"), 1.0)

    monkeypatch.setattr(compare, "local_wok", _no_server)
    monkeypatch.setattr(stream_vs_unary, "measure", measure)
    return stream_vs_unary, ["--rounds", "1"], stream_vs_unary.SCHEMA


def _thread_sizing_measured_nothing(monkeypatch, tmp_path, at_end):
    import torch

    from wok import models
    from wok.bench import thread_sizing

    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)  # this test process's, not the script's
    monkeypatch.setattr(models, "build_demo", lambda name: _Forward(at_end))
    monkeypatch.setattr(thread_sizing, "time", _Clock())
    return thread_sizing, ["--reps", "1", "--cpu-linear", "torch"], thread_sizing.SCHEMA


def _unhandled_cost_measured_nothing(monkeypatch, tmp_path, at_end):
    from wok.bench import unhandled_cost

    async def measure(calls, reps, progress):
        at_end()
        names = {name for pair in unhandled_cost.PAIRS for name in pair}
        return {name: [1e-6] for name in sorted(names)}, 0

    monkeypatch.setattr(unhandled_cost, "_measure", measure)
    return unhandled_cost, ["--calls", "1", "--reps", "1"], unhandled_cost.SCHEMA


# The scripts that make --json's folder when they write it: one that became a file is "File exists".
MAKES_ITS_FOLDER = {"compare", "latency_breakdown", "thread_sizing"}
JSON_ONLY = [
    _accept_rate_measured_nothing,
    _balancer_overhead_measured_nothing,
    _ceiling_measured_nothing,
    _cold_batch_measured_nothing,
    _compare_measured_nothing,
    _fuzz_measured_nothing,
    _gpu_check_measured_nothing,
    _latency_breakdown_measured_nothing,
    _linear_kernels_measured_nothing,
    _metrics_overhead_measured_nothing,
    _queue_memory_measured_nothing,
    _refusal_cost_measured_nothing,
    _stream_vs_unary_measured_nothing,
    _thread_sizing_measured_nothing,
    _unhandled_cost_measured_nothing,
]


@pytest.mark.parametrize(
    ("script", "given"),
    [
        *(
            (script, given)
            for script in (_slo_compare_measured_nothing, _tune_check_measured_nothing)
            for given in ("--json", "--plot")
        ),
        *((script, "--json") for script in JSON_ONLY),
    ],
    ids=lambda v: v.__name__.removeprefix("_").removesuffix("_measured_nothing") if callable(v) else v,
)
def test_a_scripts_output_that_fails_at_the_end_keeps_the_result(script, given, tmp_path, monkeypatch, capsys):
    """Every standalone script wrote its outputs unguarded after its whole run: a folder gone
    meanwhile ended it in a traceback, everything measured lost."""
    import json
    import tempfile

    folder, temp = tmp_path / "out", tmp_path / "temp"
    folder.mkdir()
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))  # the system's temp folder, for this test
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")  # some scripts set it as wok serve does: not for the suite
    module, argv, schema = script(monkeypatch, tmp_path, lambda: folder.is_dir() and _lose(folder))
    path = folder / ("r.json" if given == "--json" else "r.png")
    assert module.main([*argv, given, str(path)]) == 1
    (kept,) = temp.glob("wok-bench-*.json")
    last = capsys.readouterr().err.splitlines()[-1]
    why = f"File exists ({folder})" if module.__name__.rpartition(".")[2] in MAKES_ITS_FOLDER else "Not a directory"
    assert last.endswith(f" {given} {path}: {why}; the result is kept in {kept} instead"), last
    assert json.loads(kept.read_text())["schema"] == schema


def test_a_scripts_last_json_write_gives_its_exit_status(tmp_path, monkeypatch, capsys):
    """The scripts that write only --json end by `finish_json`: 0 when it is written or not asked for,
    else 1, the failure on stderr after the script's own label, the result kept elsewhere."""
    import json
    import tempfile

    from wok.bench.outputs import finish_json

    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))  # the system's temp folder, for this test
    assert finish_json({"schema": "s/1"}, None, "[s] ") == 0
    path = tmp_path / "r.json"
    assert finish_json({"schema": "s/1", "n": 1}, str(path), "[s] ") == 0
    assert json.loads(path.read_text()) == {"schema": "s/1", "n": 1}
    assert capsys.readouterr().err == ""
    folder = tmp_path / "out"
    folder.mkdir()
    _lose(folder)
    assert finish_json({"schema": "s/1", "n": 2}, str(folder / "r.json"), "[s] ") == 1
    (kept,) = temp.glob("wok-bench-*.json")
    assert json.loads(kept.read_text()) == {"schema": "s/1", "n": 2}
    err = capsys.readouterr().err
    assert err == f"[s] --json {folder / 'r.json'}: Not a directory; the result is kept in {kept} instead\n"


@pytest.mark.parametrize("name", ["slo_compare", "tune_check"])
@pytest.mark.parametrize("where", ["a file", "under a file"])
def test_a_script_refuses_a_log_dir_it_cannot_make_before_measuring(name, where, tmp_path, capsys, no_load):
    """--log-dir was first used when a server started, after the profile (and slo_compare's tuning):
    a file there failed the run minutes in, as a traceback."""
    (tmp_path / "file").write_text("")
    path, why = {
        "a file": (tmp_path / "file", "is not a folder"),
        "under a file": (tmp_path / "file" / "logs", f"{tmp_path / 'file'} is not a folder"),
    }[where]
    module = importlib.import_module(f"wok.bench.{name}")
    with pytest.raises(SystemExit) as exited:
        module.main(["--log-dir", str(path)])
    assert exited.value.code == 2
    assert f"error: --log-dir {path}: {why}\n" in capsys.readouterr().err


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="Linux's /proc")
@pytest.mark.parametrize(("path", "folder"), [("/proc/wok-out.json", False), ("/proc/wok-plots", True)])
def test_a_folder_where_no_file_can_be_made_is_refused_for_root_too(path, folder, wok_cli):
    """os.access answers yes to root for /proc, where no file can be made: `--json /proc/x.json`
    passed the check and failed when written, after the run."""
    from wok.bench.outputs import output_problem

    assert output_problem(Path(path), folder=folder).startswith("folder /proc is not writable")
    option = "--plot" if folder else "--json"
    status, _, err = wok_cli("simulate", "--steps", "100", "--step-duration", "1s", option, path)
    assert status == 2 and err.startswith(f"wok simulate: {option} {path}: folder /proc is not writable"), err


PLAN = ["plan", "--peak-qps", "100", "--t-batch", "20ms", "--batch-size", "16"]
SIMULATE = ["simulate", "--steps", "100", "--step-duration", "1s"]


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (PLAN, "--json"),
        (PLAN, "--markdown"),
        (PLAN, "--manifests"),
        (SIMULATE, "--json"),
        (SIMULATE, "--csv"),
        (SIMULATE, "--html"),
        (SIMULATE, "--plot"),
    ],
)
def test_a_dash_for_standard_output_is_refused_up_front(argv, option, tmp_path, monkeypatch, wok_cli):
    """`--json -` wrote a file named `-` in the working folder and nothing on stdout, exit 0."""
    monkeypatch.chdir(tmp_path)
    status, out, err = wok_cli(*argv, option, "-")
    assert status == 2 and out == ""
    kind = "folder" if option in ("--manifests", "--plot") else "file"
    assert err == f"wok {argv[0]}: {option} -: writing to standard output is not supported; give a {kind} path\n"
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("name", ["cold_batch", "ceiling"])
def test_a_script_refuses_a_dash_for_standard_output(name, tmp_path, monkeypatch, capsys, no_load):
    monkeypatch.chdir(tmp_path)
    module = importlib.import_module(f"wok.bench.{name}")
    with pytest.raises(SystemExit) as exited:
        module.main([*SCRIPTS[name], "--json", "-"])
    assert exited.value.code == 2
    assert "error: --json -: writing to standard output is not supported; give a file path\n" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


TUNE = ["tune", "--slo-p99", "20ms", "--alpha", "1ms", "--beta", "0.25ms", "--max-batch-sizes", "4"]
TUNE += ["--delays", "0ms", "--sim-duration", "1s", "--iterations", "2"]
PROFILE = ["profile", "mlp", "--batch-sizes", "1,4", "--warmup", "0", "--repeats", "2"]


@pytest.mark.parametrize(
    ("argv", "module", "option", "name", "schema"),
    [
        (TUNE, "tune", "--json", "t.json", "wok.tune/2"),
        (TUNE, "tune", "--write-config", "c.toml", "wok.tune/2"),
        (PROFILE, "profiler", "--json", "p.json", "wok.profile/1"),
        (PROFILE, "profiler", "--plot", "p.png", "wok.profile/1"),
    ],
    ids=["tune-json", "tune-write-config", "profile-json", "profile-plot"],
)
def test_a_tune_or_profile_whose_output_fails_at_the_end_keeps_the_result(
    argv, module, option, name, schema, tmp_path, monkeypatch, wok_cli
):
    """`wok tune` and `wok profile` lost their result (exit 2) when a write failed past the
    up-front check, as the ramp did before it kept it."""
    import importlib
    import json
    import tempfile

    folder, temp = tmp_path / "out", tmp_path / "temp"
    folder.mkdir()
    temp.mkdir()
    mod = importlib.import_module(f"wok.bench.{module}")
    work = getattr(mod, {"tune": "tune", "profiler": "profile"}[module])

    def work_then_lose_the_folder(*args, **kwargs):  # the work is done; its files are written next
        result = work(*args, **kwargs)
        _lose(folder)
        return result

    monkeypatch.setattr(mod, work.__name__, work_then_lose_the_folder)
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    path = folder / name
    status, _, err = wok_cli(*argv, option, str(path))
    (kept,) = temp.glob("wok-bench-*.json")
    last = err.splitlines()[-1]
    assert status == 1, err
    # Why it failed is the OS's (profile's plot makes its folder: "File exists"), the rest is wok's.
    assert last.startswith(f"wok {argv[0]}: {option} {path}: "), last
    assert last.endswith(f"; the result is kept in {kept} instead"), last
    assert json.loads(kept.read_text())["schema"] == schema


@pytest.mark.parametrize(
    "error",
    [ValueError("Out of range float values are not JSON compliant"), RuntimeError("Agg cannot draw")],
    ids=["serializer", "plot"],
)
def test_an_output_that_fails_with_any_error_keeps_the_result(error, tmp_path, monkeypatch):
    """Only an OSError kept the result: any other error of a writer (a plot matplotlib could not
    draw, a value the serializer refused) went out of write_final, the result lost with it."""
    import json
    import tempfile

    from wok.bench.outputs import write_final

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))

    def fail(result, path):
        raise error

    path = tmp_path / "r.png"
    line = write_final({"schema": "s/1", "n": 1}, [("--plot", path, fail)])
    (kept,) = tmp_path.glob("wok-bench-*.json")
    assert line == f"--plot {path}: {type(error).__name__}: {error}; the result is kept in {kept} instead"
    assert json.loads(kept.read_text()) == {"schema": "s/1", "n": 1}
    # With --json written first, the result is in a file already: the failure alone is said.
    kept.unlink()
    line = write_final(
        {"schema": "s/1"}, [("--json", tmp_path / "r.json", lambda r, p: p.write_text("{}")), ("--plot", path, fail)]
    )
    assert line == f"--plot {path}: {type(error).__name__}: {error}" and not list(tmp_path.glob("wok-bench-*"))


def test_a_result_its_own_serializer_refuses_is_kept_as_near_json_as_can_be(tmp_path, monkeypatch):
    """A --json that failed on a value to_json refuses would fail the same when kept elsewhere:
    that value is kept as its repr, the rest as it is."""
    import json
    import tempfile

    from wok.bench import report
    from wok.bench.outputs import write_final

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    path = tmp_path / "r.json"
    line = write_final({"schema": "s/1", "odd": {3}}, [("--json", path, report.write_json)])
    (kept,) = tmp_path.glob("wok-bench-*.json")
    why = "TypeError: Object of type set is not JSON serializable"
    assert line == f"--json {path}: {why}; the result is kept in {kept} instead"
    assert json.loads(kept.read_text()) == {"schema": "s/1", "odd": "{3}"}


def test_a_result_holding_a_lone_surrogate_is_written_escaped(tmp_path, monkeypatch):
    """A command-line value with undecodable bytes (surrogateescape, carried into the config by
    vars(args)): --json failed on encoding it, leaving an empty file, and keep_elsewhere failed the
    same, leaving an empty temporary file: the result lost."""
    import json
    import tempfile

    from wok.bench import report
    from wok.bench.outputs import WriteFailed, keep_elsewhere, write_final

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    label = b"run-\xff".decode("utf-8", "surrogateescape")
    result = {"schema": "s/1", "config": {"label": label, "unit": "\u00b5s"}}
    path = tmp_path / "r.json"
    assert write_final(result, [("--json", path, report.write_json)]) is None
    assert '"run-\\udcff"' in path.read_text(encoding="utf-8") and "\u00b5s" in path.read_text(encoding="utf-8")
    assert json.loads(path.read_text(encoding="utf-8")) == result  # read back as the same str
    assert not list(tmp_path.glob("wok-bench-*"))
    # Text that holds one all the same (a caller's own), kept elsewhere: escaped, not lost.
    failed = WriteFailed("--plot", tmp_path / "r.png", "--plot r.png: full")
    line = keep_elsewhere(json.dumps(result, ensure_ascii=False), failed)
    (kept,) = tmp_path.glob("wok-bench-*.json")
    assert line == f"--plot r.png: full; the result is kept in {kept} instead"
    assert json.loads(kept.read_text(encoding="utf-8")) == result


def test_a_temporary_file_that_could_not_be_written_is_removed(tmp_path, monkeypatch):
    """It was left behind, empty, beside the line saying the result could not be kept."""
    import errno
    import os
    import tempfile

    from wok.bench import outputs

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))

    def full_disk(fd, *args, **kwargs):
        os.close(fd)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(outputs, "open", full_disk, raising=False)
    line = outputs.keep_elsewhere("{}", outputs.WriteFailed("--json", tmp_path / "r.json", "--json r.json: full"))
    assert line == (
        "--json r.json: full; nor could the result be kept in a temporary file: [Errno 28] No space left on device"
    )
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("stop", [KeyboardInterrupt, SystemExit])
def test_an_interrupt_while_writing_is_not_an_output_error(stop, tmp_path, monkeypatch):
    """Ctrl-C (or an exit) while an output is written stops the script, as anywhere else."""
    import tempfile

    from wok.bench.outputs import write_final

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))

    def interrupted(result, path):
        raise stop()

    with pytest.raises(stop):
        write_final({"schema": "s/1"}, [("--json", tmp_path / "r.json", interrupted)])
    assert not list(tmp_path.iterdir())  # nor the hidden file it was being written to


@pytest.mark.parametrize(
    "script", [_slo_compare_measured_nothing, _tune_check_measured_nothing], ids=["slo_compare", "tune_check"]
)
def test_a_plot_that_matplotlib_cannot_draw_keeps_the_result(script, tmp_path, monkeypatch, capsys):
    """A plot's drawing failed with matplotlib's own error (not an OSError): a traceback, the whole
    run lost."""
    import json
    import tempfile

    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    module, argv, schema = script(monkeypatch, tmp_path, lambda: None)

    def plot(doc, path):
        raise ValueError("Image size of 1100x99999999 pixels is too large")

    monkeypatch.setattr(module, "plot", plot)
    path = tmp_path / "r.png"
    assert module.main([*argv, "--plot", str(path)]) == 1
    (kept,) = temp.glob("wok-bench-*.json")
    last = capsys.readouterr().err.splitlines()[-1]
    why = "ValueError: Image size of 1100x99999999 pixels is too large"
    assert last.endswith(f" --plot {path}: {why}; the result is kept in {kept} instead"), last
    assert json.loads(kept.read_text())["schema"] == schema


def test_tune_check_keeps_a_save_that_fails_mid_run_and_goes_on(tmp_path, monkeypatch, capsys):
    """--save-overhead (as --save-profile, --save-cpu) was written unguarded mid-run: a folder gone
    meanwhile ended the run in a traceback, the rest never measured. Its document is kept in a
    temporary file now, the run goes on to its --json, and exits 1."""
    import json
    import tempfile

    from wok.bench import tune_check

    folder, temp = tmp_path / "out", tmp_path / "temp"
    folder.mkdir()
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    module, argv, schema = _tune_check_measured_nothing(monkeypatch, tmp_path, lambda: None)
    samples = {"samples_s": [0.001], "method": "none"}

    def calibrate_then_lose_the_folder(args, t1):
        if folder.is_dir():
            _lose(folder)
        return samples

    monkeypatch.setattr(tune_check, "calibrate", calibrate_then_lose_the_folder)
    saved, out = folder / "o.json", tmp_path / "r.json"
    assert module.main([*argv, "--save-overhead", str(saved), "--json", str(out)]) == 1
    (kept,) = temp.glob("wok-bench-*.json")
    err = capsys.readouterr().err
    assert f" --save-overhead {saved}: Not a directory; the result is kept in {kept} instead\n" in err
    assert err.splitlines()[-1].endswith(
        "--save-overhead failed when written (said above, with where each document went)"
    )
    assert json.loads(kept.read_text()) == samples
    assert json.loads(out.read_text())["schema"] == schema  # the run went on to its end


def test_an_output_that_fails_midway_leaves_an_earlier_file_whole(tmp_path, monkeypatch):
    """--json was written in place: a write that failed midway (a full disk) truncated the file
    that was there, an earlier run's result lost with the new one only in a temporary file."""
    import errno
    import json
    import tempfile

    from wok.bench.outputs import write_final

    keep = tmp_path / "kept"
    keep.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(keep))
    path = tmp_path / "r.json"
    path.write_text('{"schema": "s/1", "run": "earlier"}\n')

    def full_disk(result, where):
        where.write_text('{"schema": "s/1", "ru')
        raise OSError(errno.ENOSPC, "No space left on device", str(where))

    line = write_final({"schema": "s/1", "run": "new"}, [("--json", path, full_disk)])
    (kept,) = keep.glob("wok-bench-*.json")
    # The error is the path's, not the file beside it that was being written.
    assert line == f"--json {path}: No space left on device; the result is kept in {kept} instead"
    assert json.loads(path.read_text()) == {"schema": "s/1", "run": "earlier"}
    assert json.loads(kept.read_text()) == {"schema": "s/1", "run": "new"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept", "r.json"]


def test_an_output_is_replaced_whole_with_the_mode_a_plain_write_gives(tmp_path):
    import os

    from wok.bench.outputs import write_outputs

    seen = []

    def write(result, where):
        seen.append(where)
        assert not path.exists() or path.read_text() == "old\n"  # not yet replaced while written
        where.write_text("new\n")

    path = tmp_path / "r.png"
    old = os.umask(0o027)
    try:
        assert write_outputs({}, [("--plot", path, write)]) is None
    finally:
        os.umask(old)
    assert path.read_text() == "new\n" and path.stat().st_mode & 0o777 == 0o640
    assert seen[0].parent == tmp_path and seen[0].suffix == ".png" and seen[0] != path  # a plot's format kept
    path.write_text("old\n")
    path.chmod(0o604)  # an existing file keeps its own mode, as a write in place would
    assert write_outputs({}, [("--plot", path, write)]) is None
    assert path.read_text() == "new\n" and path.stat().st_mode & 0o777 == 0o604
    assert [p.name for p in tmp_path.iterdir()] == ["r.png"]


def test_an_output_through_a_link_replaces_the_file_it_points_at(tmp_path):
    from wok.bench import report
    from wok.bench.outputs import write_outputs

    (tmp_path / "runs").mkdir()
    target = tmp_path / "runs" / "r.json"
    target.write_text("{}\n")
    link = tmp_path / "latest.json"
    link.symlink_to(target)
    assert write_outputs({"schema": "s/1"}, [("--json", link, report.write_json)]) is None
    assert link.is_symlink() and '"s/1"' in target.read_text()
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["latest.json", "r.json", "runs"]


def test_an_output_that_is_not_a_regular_file_is_written_directly(tmp_path):
    """A pipe (as /dev/null, a device) cannot be replaced by a file, and must not be."""
    import os
    import threading

    from wok.bench import report
    from wok.bench.outputs import write_outputs

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()), daemon=True)
    reader.start()
    assert write_outputs({"schema": "s/1"}, [("--json", fifo, report.write_json)]) is None
    reader.join(10)
    assert got == ['{\n  "schema": "s/1"\n}\n'] and fifo.is_fifo()
    assert [p.name for p in tmp_path.iterdir()] == ["pipe"]


def test_a_writer_that_makes_its_folder_gets_it_made(tmp_path):
    from wok.bench import report
    from wok.bench.outputs import write_final

    path = tmp_path / "new" / "deeper" / "r.json"
    assert write_final({"schema": "s/1"}, [("--json", path, report.write_json)], parents_made=True) is None
    assert '"s/1"' in path.read_text() and [p.name for p in path.parent.iterdir()] == ["r.json"]


def test_an_output_to_a_pipes_dev_fd_path_is_written_to_the_pipe(tmp_path):
    """/dev/stdout (and /dev/fd/N, a process substitution's >(...)) name a pipe through a link to a
    name that resolves nowhere: the new file beside it was sought in /proc, and the result lost to
    a temporary file."""
    import os

    from wok.bench import report
    from wok.bench.outputs import write_outputs

    r, w = os.pipe()
    try:
        assert write_outputs({"schema": "s/1"}, [("--json", Path(f"/dev/fd/{w}"), report.write_json)]) is None
        os.close(w)
        w = None
        with os.fdopen(r) as f:
            r = None
            assert f.read() == '{\n  "schema": "s/1"\n}\n'
    finally:
        for fd in (r, w):
            if fd is not None:
                os.close(fd)


def test_a_file_with_other_hard_links_is_written_in_place(tmp_path):
    """Replaced, it would leave its other names holding the old text."""
    from wok.bench import report
    from wok.bench.outputs import write_outputs

    path = tmp_path / "r.json"
    path.write_text("{}\n")
    other = tmp_path / "same.json"
    other.hardlink_to(path)
    assert write_outputs({"schema": "s/1"}, [("--json", path, report.write_json)]) is None
    assert '"s/1"' in other.read_text() and path.stat().st_ino == other.stat().st_ino


def test_a_file_in_a_folder_that_takes_no_new_file_is_written_in_place(tmp_path, monkeypatch):
    """Its file writable, its folder not (a read-only folder, an immutable one): the check before
    the run passed it, and the write at the end failed (a new file could not be made beside it)."""
    import errno

    from wok.bench import outputs, report

    def refused(path, st, keep_suffix):  # the folder's refusal, as root cannot be refused here
        raise PermissionError(errno.EPERM, "Operation not permitted", str(path))

    monkeypatch.setattr(outputs, "_make_beside", refused)
    path = tmp_path / "r.json"
    path.write_text("{}\n")
    assert outputs.write_outputs({"schema": "s/1"}, [("--json", path, report.write_json)]) is None
    assert '"s/1"' in path.read_text()
    # A new file there cannot be made at all: the folder's refusal is the output's error.
    new = tmp_path / "new.json"
    failed, held = outputs.write_outputs({"schema": "s/1"}, [("--json", new, report.write_json)])
    assert str(failed) == f"--json {new}: Operation not permitted" and not held


@pytest.mark.skipif(__import__("os").geteuid() != 0, reason="only root may give a file to another owner")
def test_a_replaced_file_keeps_its_owner(tmp_path):
    import os

    from wok.bench import report
    from wok.bench.outputs import write_outputs

    path = tmp_path / "r.json"
    path.write_text("{}\n")
    os.chown(path, 65534, 65534)
    assert write_outputs({"schema": "s/1"}, [("--json", path, report.write_json)]) is None
    assert '"s/1"' in path.read_text() and (path.stat().st_uid, path.stat().st_gid) == (65534, 65534)


def test_a_plot_is_drawn_in_its_paths_format_else_png():
    """The file being written ends in .part when the path has no suffix: read as the format, savefig
    refused it (and with none, it added .png to the name)."""
    from wok.bench.report import figure_format

    assert figure_format(Path(".fig.0a1b2c3d.part")) == "png"
    assert figure_format(Path(".r.svg.0a1b2c3d.part.svg")) == "svg"
    assert figure_format(Path("r.PDF")) == "pdf"
    # Not drawn as PNG over what the path holds (a --plot run.json, by a slip): refused.
    with pytest.raises(ValueError, match=r"a figure cannot be written as \.json"):
        figure_format(Path(".run.json.0a1b2c3d.part.json"))


def test_an_output_to_dev_fd_of_a_regular_file_writes_that_open_file(tmp_path):
    """`--json /dev/stdout > out.json`: the open file is the stream meant; replaced by name, the new
    text went to a new out.json while the shell's descriptor kept the old, unlinked one."""
    import os

    from wok.bench import report
    from wok.bench.outputs import write_outputs

    out = tmp_path / "out.json"
    with open(out, "w") as f:
        before = os.fstat(f.fileno()).st_ino
        assert write_outputs({"schema": "s/1"}, [("--json", Path(f"/dev/fd/{f.fileno()}"), report.write_json)]) is None
        assert os.fstat(f.fileno()).st_ino == out.stat().st_ino == before
    assert '"s/1"' in out.read_text() and [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_an_output_that_takes_no_rename_is_written_in_place_whole(tmp_path, monkeypatch):
    """A bind-mounted file (EBUSY), another's file in a sticky folder (EPERM): the rename is refused
    where a write in place is not; the run's end failed, its result only in a temporary file."""
    import errno

    from wok.bench import outputs, report

    def busy(src, dst):
        raise OSError(errno.EBUSY, "Device or resource busy", src, None, dst)

    monkeypatch.setattr(outputs.os, "replace", busy)
    path = tmp_path / "r.json"
    path.write_text("{}\n")
    assert outputs.write_outputs({"schema": "s/1"}, [("--json", path, report.write_json)]) is None
    assert '"s/1"' in path.read_text() and [p.name for p in tmp_path.iterdir()] == ["r.json"]


@pytest.fixture
def append_only_folder(tmp_path):
    """A folder under `chattr +a`: files can be made in it, none renamed or removed."""
    import shutil

    folder = tmp_path / "kept"
    folder.mkdir()
    (folder / "old.json").write_text("{}\n")
    chattr = shutil.which("chattr")
    if chattr is None or subprocess.run([chattr, "+a", str(folder)], capture_output=True).returncode:
        pytest.skip("chattr +a refused: it needs CAP_LINUX_IMMUTABLE and a file system with the flag")
    try:
        yield folder
    finally:
        subprocess.run([chattr, "-a", str(folder)], check=True)  # else tmp_path cannot be removed


def test_an_output_in_an_append_only_folder_is_written_in_place_and_leaves_no_file_beside(append_only_folder):
    """The file made beside the path could be neither renamed over it nor removed: a new output
    failed with EPERM (its result only in a hidden .part), a replaced one left a .part each write,
    and the check before the run left its probe file."""
    from wok.bench import report
    from wok.bench.outputs import output_problem, write_outputs

    for name in ("new.json", "old.json"):
        path = append_only_folder / name
        assert output_problem(path, folder=False) is None
        assert write_outputs({"schema": "s/1"}, [("--json", path, report.write_json)]) is None
        assert '"s/1"' in path.read_text()
    assert sorted(p.name for p in append_only_folder.iterdir()) == ["new.json", "old.json"]


def test_a_new_output_under_a_umask_that_leaves_it_read_only_is_written(tmp_path):
    """Under umask 0222 the file beside it was made 0444 before its writer opened it: refused."""
    import os

    from wok.bench import report
    from wok.bench.outputs import write_outputs

    path = tmp_path / "r.json"
    old = os.umask(0o222)
    try:
        assert write_outputs({"schema": "s/1"}, [("--json", path, report.write_json)]) is None
    finally:
        os.umask(old)
    assert '"s/1"' in path.read_text() and path.stat().st_mode & 0o777 == 0o444


def test_an_output_with_a_long_name_is_written(tmp_path):
    """The file beside it adds to the name: at 240 bytes it passed the check and failed at the end."""
    from wok.bench import report
    from wok.bench.outputs import write_outputs

    path = tmp_path / ("r" * 235 + ".json")
    assert write_outputs({"schema": "s/1"}, [("--json", path, report.write_json)]) is None
    assert '"s/1"' in path.read_text() and [p.name for p in tmp_path.iterdir()] == [path.name]


def test_an_output_to_an_own_descriptor_is_written_at_its_offset(tmp_path):
    """What the process wrote to the descriptor before is kept, the output after it: a second open
    by name truncated the file and wrote from its start."""
    import os

    from wok.bench import report
    from wok.bench.outputs import write_outputs

    out = tmp_path / "out.json"
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        os.write(fd, b"before\n")
        for name in (f"/dev/fd/{fd}", f"/proc/self/fd/{fd}", f"/proc/{os.getpid()}/fd/{fd}"):
            assert write_outputs({"schema": name}, [("--json", Path(name), report.write_json)]) is None
    finally:
        os.close(fd)
    text = out.read_text()
    assert text == "before\n" + "".join(
        f'{{\n  "schema": "{n}"\n}}\n' for n in (f"/dev/fd/{fd}", f"/proc/self/fd/{fd}", f"/proc/{os.getpid()}/fd/{fd}")
    )
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_which_paths_name_an_own_descriptor(tmp_path, monkeypatch):
    import os

    from wok.bench.outputs import _own_descriptor

    r, w = os.pipe()
    try:
        assert _own_descriptor(Path("/dev/stdout")) == 1 and _own_descriptor(Path("/dev/stderr")) == 2
        assert _own_descriptor(Path(f"/dev/fd/{w}")) == w
        assert _own_descriptor(Path(f"/dev/../dev/fd/{w}")) == w
        assert _own_descriptor(Path(f"/proc/thread-self/fd/{w}")) == w
        monkeypatch.chdir("/dev")
        assert _own_descriptor(Path(f"fd/{w}")) == w
        # Another process's descriptor, one not open, a file named like one: paths as any other.
        assert _own_descriptor(Path(f"/proc/{os.getppid()}/fd/{w}")) is None
        assert _own_descriptor(Path("/dev/fd/99999")) is None
        assert _own_descriptor(Path(f"/dev/fd/{'9' * 30}")) is None
        assert _own_descriptor(Path("/dev/fd/\N{SUPERSCRIPT TWO}")) is None  # isdigit() took it, int() raised
        assert _own_descriptor(tmp_path / "dev" / "fd" / str(w)) is None
        assert _own_descriptor(Path("/dev/null")) is None
        # As the kernel resolves them: a link to /dev/stdout is stdout (opened by name it truncated
        # the file the shell redirected stdout to, or was renamed over it, the table then lost);
        # `//dev/stdout` is /dev/stdout; /dev/fd/../stdout is /proc/PID/stdout, which is nothing.
        (tmp_path / "out.json").symlink_to("/dev/stdout")
        (tmp_path / "again").symlink_to("out.json")
        assert _own_descriptor(tmp_path / "out.json") == 1 and _own_descriptor(tmp_path / "again") == 1
        assert _own_descriptor(Path("//dev/stdout")) == 1
        assert _own_descriptor(Path("/dev/fd/../stdout")) is None
    finally:
        os.close(r)
        os.close(w)


@pytest.mark.skipif(not hasattr(__import__("os"), "memfd_create"), reason="no memfd: spooled in the temporary folder")
def test_an_output_to_an_own_descriptor_needs_no_room_in_the_temporary_folder(tmp_path, monkeypatch):
    """Spooled in the temporary folder, `--json /dev/stdout` failed when that was full (No space left
    on device, said of /dev/stdout), though stdout itself took it before."""
    import errno
    import os
    import tempfile

    from wok.bench import report
    from wok.bench.outputs import write_outputs

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tempfile, "mkstemp", full)
    out = tmp_path / "out.json"
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        assert write_outputs({"schema": "x"}, [("--json", Path(f"/dev/fd/{fd}"), report.write_json)]) is None
    finally:
        os.close(fd)
    assert out.read_text() == '{\n  "schema": "x"\n}\n'


def test_an_error_of_the_file_an_own_descriptor_is_spooled_to_is_said_as_the_paths():
    """The writer's error on the file it was given (in memory: /proc/self/fd/N) names the path asked
    for, not that file."""
    import errno

    from wok.bench.outputs import write_outputs

    def writer(result, where):
        raise OSError(errno.EIO, "Input/output error", str(where))

    failed = write_outputs({}, [("--json", Path("/dev/stderr"), writer)])
    assert failed is not None and str(failed[0]) == "--json /dev/stderr: Input/output error"


def test_an_output_to_a_full_non_blocking_pipe_waits_for_its_reader(tmp_path):
    """A non-blocking stdout (left so by the program before) takes a result larger than its pipe in
    parts, as its reader reads; at a descriptor from 1024 up too, where select() refuses to wait."""
    import fcntl
    import os
    import resource
    import threading

    from wok.bench import report
    from wok.bench.outputs import write_outputs

    high = 1500
    if resource.getrlimit(resource.RLIMIT_NOFILE)[0] <= high:
        pytest.skip("the open-file limit is below a descriptor of 1500")
    r, w = os.pipe()
    os.dup2(w, high)
    os.close(w)
    fcntl.fcntl(high, fcntl.F_SETFL, fcntl.fcntl(high, fcntl.F_GETFL) | os.O_NONBLOCK)
    result = {"schema": "s/1", "text": "x" * (1 << 18)}
    got = []

    def read():
        with os.fdopen(r, "rb") as f:
            got.append(f.read())

    reader = threading.Thread(target=read, daemon=True)
    try:
        reader.start()
        assert write_outputs(result, [("--json", Path(f"/dev/fd/{high}"), report.write_json)]) is None
    finally:
        os.close(high)
    reader.join(10)
    assert got and got[0].decode() == report.to_json(result)


# ---------------------------------------------------------------------------- JSON text


def _real_results() -> list:
    """Results as the writers get them: a simulated ramp (histograms' buckets and counts, a
    timeline, config lists of lists) and a step's server timing whose window cut some batches
    (`partial_batches`' three arrays of numbers, as a part's file of a merged run holds them)."""
    import numpy as np

    from wok.bench.analysis import per_batch_compute
    from wok.bench.simulate import BatcherModel, SimConfig, simulate_ramp

    model = BatcherModel(alpha_s=1e-4, beta_s=1e-3, max_batch_size=8, max_queue_delay_s=0.002)
    ramp = simulate_ramp(SimConfig(model=model, steps=[50.0, 200.0], step_duration_s=1.0))
    rng = np.random.default_rng(3)
    n = rng.integers(1, 9, 400).astype(float)
    histogram, partial = per_batch_compute(np.round(rng.uniform(0.2, 2.0, 400), 3), n)
    assert partial["compute_ms"] and len(partial["compute_ms"]) == len(partial["requests"])
    return [ramp, {"compute_batch_histogram": histogram.to_dict(), "partial_batches": partial}]


# Values that stand beside the real shapes: every kind of item, lists inside lists and objects, and
# strings made to look like the lists the writer puts on one line.
ODD_SHAPES = {
    "numbers": [0, -1, 2.5, -3e-05, 1e300, -0.0, 10**30, True, False, None],
    "empty": [],
    "empty_object": {},
    "nested": [[1, 2], [3, [4, 5.5], []], [[[]]], [[None]]],
    "objects": [{"a": [1, 2]}, {"b": []}, {}, 3],
    "mixed": [1, "2", [3], {"4": 4}, None],
    "strings": ["1", "true", "[\n1,\n2\n]", "a\nb", "µs"],
    "keys": {"[\n1\n]": [1], "2": "[3,\n4]"},
    "tuple": (1, 2.0),
}


def _number_lists(value) -> list:
    """Every non-empty list (or tuple) in `value` whose items are all plain numbers, bools or None."""
    if isinstance(value, dict):
        return [found for v in value.values() for found in _number_lists(v)]
    if not isinstance(value, (list, tuple)):
        return []
    if value and all(v is None or isinstance(v, (int, float)) for v in value):
        return [value]
    return [found for v in value for found in _number_lists(v)]


def _on_one_line(text: str, value) -> list:
    """The lists of plain numbers in `value` that `text` does not hold on one line, as json.dumps
    writes a list without indent ("[1, 2.5, null]")."""
    import json

    return [lst for lst in _number_lists(value) if json.dumps(list(lst)) not in text]


def test_json_text_reads_back_as_json_dumps_value_with_each_number_list_on_one_line():
    """A step's arrays of numbers were written one item a line, most of a result file (a two-step
    ramp with --server-timing: 98 KB, 39 KB one line a list). Now every list of plain numbers is one
    line, and the text reads back as the very value json.dumps wrote (the same types: 1 stays 1, 1.0
    1.0, True true)."""
    import json
    import math

    from wok.bench import report
    from wok.bench.outputs import json_text

    for value in [*_real_results(), ODD_SHAPES]:
        text = report.to_json(value)
        reference = json.dumps(report._plain(value), indent=2, ensure_ascii=False) + "\n"
        assert json.dumps(json.loads(text), indent=2) == json.dumps(json.loads(reference), indent=2)
        assert _number_lists(value) and _on_one_line(text, report._plain(value)) == []
        assert len(text) < len(reference) and text.endswith("\n")
    # Where the writer lets NaN and the infinities through (json.dumps' default, kept by the scripts
    # that wrote their own JSON), they stand in a one-line list as json.dumps writes them.
    value = {"x": [math.nan, math.inf, -math.inf, 1], "y": [[math.nan], {"z": [-math.inf]}]}
    text = json_text(value)
    assert '"x": [NaN, Infinity, -Infinity, 1]' in text and _on_one_line(text, value) == []
    assert json.dumps(json.loads(text)) == json.dumps(value)
    with pytest.raises(ValueError, match="Out of range float values are not JSON compliant"):
        json_text(value, allow_nan=False)  # refused as before: report.to_json writes them as null
    assert (
        report.to_json(value)
        == '{\n  "x": [null, null, null, 1],\n  "y": [\n    [null],\n    {\n      "z": [null]\n    }\n  ]\n}\n'
    )


def test_a_list_of_plain_numbers_is_written_on_one_line_and_the_rest_at_indent_2(tmp_path):
    """What a reader of a result file sees: a histogram's counts on the line of their key, a list of
    strings or of lists still one item a line, objects indented by 2."""
    from wok.bench import report

    path = tmp_path / "r.json"
    report.write_json({"schema": "s/1", "h": {"buckets": [0.5, 1.0], "counts": [3, 0]}, "w": ["a", "b"]}, path)
    assert path.read_text(encoding="utf-8").splitlines() == [
        "{",
        '  "schema": "s/1",',
        '  "h": {',
        '    "buckets": [0.5, 1.0],',
        '    "counts": [3, 0]',
        "  },",
        '  "w": [',
        '    "a",',
        '    "b"',
        "  ]",
        "}",
    ]


def test_scripts_that_wrote_their_own_json_write_it_by_json_text_keeping_nan(tmp_path):
    """The scripts that wrote --json by json.dumps themselves (indent 2, or 1) write it by the same
    writer as every result, in UTF-8; json.dumps' NaN stays NaN there (report.write_json's null would
    change the value), and compare's strict JSON stays strict."""
    import json
    import math

    from wok.bench import compare, latency_breakdown
    from wok.bench.outputs import write_json_text

    doc = {"schema": "s/1", "runs": [{"us": [1.5, math.nan, 3]}], "unit": "µs"}
    path = tmp_path / "r.json"
    write_json_text(doc, path)
    text = path.read_text(encoding="utf-8")
    assert '"us": [1.5, NaN, 3]' in text and '"unit": "µs"' in text
    assert json.dumps(json.loads(text)) == json.dumps(doc)
    latency_breakdown.write_doc(path, {"schema": "wok.latency_breakdown/1", "ms": [1, 2]})
    assert path.read_text(encoding="utf-8") == '{\n  "schema": "wok.latency_breakdown/1",\n  "ms": [1, 2]\n}\n'
    compare._write_doc({"schema": "wok.compare/1", "qps": [1.0, math.inf, 2]}, path)
    assert path.read_text(encoding="utf-8") == '{\n  "schema": "wok.compare/1",\n  "qps": [1.0, null, 2]\n}\n'
