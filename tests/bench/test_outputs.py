"""bench/outputs.py: the standalone scripts of bench/ check their --json path before measuring, as the
`wok` commands do (tests/bench/test_cli.py)."""

from __future__ import annotations

import asyncio
import importlib
import re
import subprocess
from pathlib import Path

import pytest
import uvloop

BENCH = Path(__file__).resolve().parents[2] / "bench"

# Each script with a --json output, and the options it needs besides: compare's default peers
# would build their venvs first (that was the measurement's start, not the check's).
SCRIPTS = {
    "accept_rate": [],
    "balancer_overhead": [],
    "ceiling": [],
    "cold_batch": [],
    "compare": ["--servers", "wok"],
    "fuzz": [],
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
}


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
    a full disk): here it becomes a file, which fails every write under it, --plots' mkdir too."""
    folder.rmdir()
    folder.write_text("")


@pytest.mark.parametrize(("option", "name"), [("--csv", "r.csv"), ("--html", "r.html"), ("--plots", "plots")])
def test_a_ramp_without_json_whose_output_fails_at_the_end_keeps_the_result(
    option, name, bench_server, tmp_path, monkeypatch, wok_cli
):
    """Only a failed --json kept the result: without --json, a --csv, --html or --plots that failed
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
    assert result["schema"] == "wok.bench/1" and [s["offered_qps"] for s in result["steps"]] == [20]


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
    profile.write_text('{"fit": {"alpha_s": 0.001, "beta_s": 0.0001}}')
    summary = {"goodput_qps": 1.0, "refused": 0, "accepted_latency_ms": {"p99": 1.0}}
    monkeypatch.setattr(slo_compare, "start_server", lambda *args: _Server())
    monkeypatch.setattr(slo_compare, "server_counters", lambda url: {})
    monkeypatch.setattr(slo_compare, "run_load", lambda server, args: ({"steps": [{}]}, (), None))
    monkeypatch.setattr(slo_compare, "summarize", lambda *args: summary)
    monkeypatch.setattr(slo_compare, "print_table", lambda doc: at_end())
    monkeypatch.setattr(slo_compare, "plot", _plot)
    return slo_compare, ["--profile", str(profile), "--fixed", "1,1ms", "--reps", "1"], "wok.slocompare/1"


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
    return tune_check, argv, tune_check.SCHEMA


@pytest.mark.parametrize("script", [_slo_compare_measured_nothing, _tune_check_measured_nothing])
@pytest.mark.parametrize("given", ["--json", "--plot"])
def test_a_scripts_output_that_fails_at_the_end_keeps_the_result(script, given, tmp_path, monkeypatch, capsys):
    """slo_compare and tune_check wrote --json and --plot unguarded after their whole run: a folder
    gone meanwhile ended them in a traceback, everything measured lost."""
    import json
    import tempfile

    folder, temp = tmp_path / "out", tmp_path / "temp"
    folder.mkdir()
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))  # the system's temp folder, for this test
    module, argv, schema = script(monkeypatch, tmp_path, lambda: _lose(folder))
    path = folder / ("r.json" if given == "--json" else "r.png")
    assert module.main([*argv, "--log-dir", str(tmp_path / "logs"), given, str(path)]) == 1
    (kept,) = temp.glob("wok-bench-*.json")
    last = capsys.readouterr().err.splitlines()[-1]
    assert last.endswith(f"] {given} {path}: Not a directory; the result is kept in {kept} instead"), last
    assert json.loads(kept.read_text())["schema"] == schema


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
    option = "--plots" if folder else "--json"
    status, _, err = wok_cli("simulate", "--steps", "100", "--step-duration", "1s", option, path)
    assert status == 2 and err.startswith(f"wok simulate: {option} {path}: folder /proc is not writable"), err
