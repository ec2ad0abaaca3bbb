"""bench/tune_check.py with a validation ramp cut short by an error, not by a signal: the ramp is
kept with its `error` (as bench/compare.py records one), left out of the verdict, the table says
so, and the run exits 1. Real `wok serve` processes on loopback, each cut gated on the ramp's
own progress lines."""

from __future__ import annotations

import json
import multiprocessing
from types import SimpleNamespace

import numpy as np
import pytest

from wok.bench import compare, tune, tune_check

DEFAULT, TUNED = "8,1ms", "4,0ms"
# A name as tune_check.start_server gives the tuned setting's server.
TUNED_SERVER = "wok-mbs4-d0ms"


class _Kept:
    """The module's server in the shape of tune_check.start_server's, named `name`: one start for
    the module, and it outlives each run (the fixture stops it)."""

    model = "mlp"

    def __init__(self, sp, log_dir, name: str) -> None:
        self.proc, self.pid, self.target = sp.proc, sp.proc.pid, sp.target
        self.ports = {"metrics": int(sp.http_url().rsplit(":", 1)[1])}
        self.peer = SimpleNamespace(name=name)
        self.log_path = log_dir / f"{name}.log"  # named in an error only

    def stop(self) -> None:
        pass


@pytest.fixture(scope="module")
def kept(start_server_module, tmp_path_factory):
    """The default setting's server (and, where it is not the one cut, the tuned setting's)."""
    sp = start_server_module("--models", "mlp", "--demo-option", "mlp.max_batch_size=8",
                             "--demo-option", "mlp.max_queue_delay_ms=1", "--server-timing")  # fmt: skip
    logs = tmp_path_factory.mktemp("logs")
    return {"default": _Kept(sp, logs, "wok-default-kept"), "tuned": _Kept(sp, logs, TUNED_SERVER)}


def _run(tmp_path, monkeypatch, capsys, kept, cut_when, cut) -> tuple[int, dict, str, str]:
    """tune_check.main, one repetition of two short ramps on real servers, the tuned setting's
    started by tune_check unless `kept` has it; during that ramp, `cut(server)` runs as the ramp
    says a line for which `cut_when(line)` holds. The profile is given, the overhead calibration
    and the search are canned: what is under test is what the validation makes of its ramps."""
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps(tune.profile_document({1: [1e-3] * 5, 8: [2e-3] * 5}, "test", model="mlp")))
    overhead = tune.overhead_document(np.full(50, 1e-3), "test: canned")
    monkeypatch.setattr(tune_check, "calibrate", lambda args, t1: overhead)
    monkeypatch.setattr(tune, "tune", lambda *args, **kwargs: {"chosen": None})
    monkeypatch.setattr(tune, "print_table", lambda doc: None)
    started = tune_check.start_server

    def start_server(n, d, *args, **kwargs):
        label = "default" if (n, d) == (8, 1.0) else "tuned"
        return kept[label] if label in kept else started(n, d, *args, **kwargs)

    monkeypatch.setattr(tune_check, "start_server", start_server)
    real = compare.metered_ramp
    seen = []

    def metered_ramp(server, cfg, progress, processes=None):
        def said(line: str) -> None:
            progress(line)
            if server.peer.name == TUNED_SERVER and cut_when(line) and not seen:
                seen.append(line)
                cut(server)

        return real(server, cfg, said, processes)

    monkeypatch.setattr(compare, "metered_ramp", metered_ramp)
    out = tmp_path / "run.json"
    argv = ["--profile", str(profile), "--no-cpu-stage", "--default", DEFAULT, "--tuned", TUNED, "--reps", "1"]
    argv += ["--steps", "20,40", "--step-duration", "0.25s", "--warmup", "0.05s", "--workers", "1"]
    argv += ["--stop-factor", "1e9"]  # a slow first step on a loaded machine must not end a ramp before its cut
    status = tune_check.main([*argv, "--json", str(out), "--log-dir", str(tmp_path / "logs")])
    assert seen, "the tuned ramp was never cut"
    captured = capsys.readouterr()
    return status, json.loads(out.read_text()), captured.out, captured.err


def _check_left_out(status: int, doc: dict, table: str, err: str, why: str) -> None:
    default, tuned = doc["runs"]
    v = doc["verdict"]
    assert doc["schema"] == "wok.tunecheck/3"  # a verdict that may be null: not /2's
    # The only tuned ramp was cut: nothing says tuned ≥ default, nor gives it a max QPS or a median.
    assert (v["tuned_at_least_default"], v["tuned_max_qps"], v["tuned_median_max_qps"]) == (None, [None], None)
    assert status == 1 and "cut short, left out of the verdict: rep 1 tuned" in err, err[-2000:]
    assert (default["label"], tuned["label"]) == ("default", "tuned")
    assert default["error"] is None
    assert tuned["error"].startswith(f"interrupted: {why}"), tuned["error"]
    assert tuned["measured"]["steps"]  # its steps and their predictions are kept
    assert len(tuned["comparison"]) == len(tuned["measured"]["steps"])
    assert v["default_max_qps"] == [default["measured_max_qps"] or 0.0]
    assert v["reps_whole"] == 0
    assert v["runs_left_out"] == [{"rep": 1, "label": "tuned", "error": tuned["error"]}]
    assert v["steps_below_knee"] == sum(r["below_knee"] for r in default["comparison"])
    assert "cut short, left out of the verdict (interrupted: " in table
    assert "tuned ≥ default in every rep: not known (0 of 1 reps whole)" in table
    assert f"left out of the verdict, cut short: rep 1 tuned ({tuned['error']})" in table
    md = tune_check.markdown(doc)
    assert "tuned ≥ default in every repetition: not known (0 of 1 reps whole)" in md
    assert "left out of the verdict, cut short: rep 1 tuned" in md


def test_a_ramp_cut_by_an_error_is_left_out_of_the_verdict(tmp_path, monkeypatch, capsys, kept):
    """It counted: the tuned ramp's max QPS was the last step it reached, as if the server had
    failed there, in "tuned ≥ default in every rep" and the medians; exit 0."""

    def kill_the_load_generator(server) -> None:
        # The step's line comes before its shares are handed out: a worker dead by then fails the step.
        for worker in multiprocessing.active_children():
            worker.kill()
            worker.join()

    status, doc, table, err = _run(
        tmp_path, monkeypatch, capsys, kept, lambda line: line.startswith("step 2/2: ") and "offered" in line,
        kill_the_load_generator,
    )  # fmt: skip
    _check_left_out(status, doc, table, err, "ramp ended early at 40 QPS: ")
    assert [s["nominal_qps"] for s in doc["runs"][1]["measured"]["steps"]] == [20]


def test_the_validation_ramps_run_on_the_same_load_generator_processes(tmp_path, monkeypatch, capsys, kept):
    """Each ramp started its --workers processes afresh: the run's ramps share one WorkerProcesses (its main's), the
    default setting's workers kept for the tuned one's ramp and stopped at the end."""
    real = tune_check.ramp_config
    handed = []

    def ramp_config(server, steps, args, *rest, **kwargs):
        processes = getattr(args, "processes", None)
        handed.append((processes, None if processes is None else [p.pid for p in processes._procs]))
        return real(server, steps, args, *rest, **kwargs)

    monkeypatch.setattr(tune_check, "ramp_config", ramp_config)
    during = []
    status, doc, _, err = _run(
        tmp_path, monkeypatch, capsys, kept, lambda line: line.startswith("step 1/2: achieved"),
        lambda server: during.extend(p.pid for p in multiprocessing.active_children()),
    )  # fmt: skip
    assert status == 0 and [r["error"] for r in doc["runs"]] == [None, None], err[-2000:]
    (first, before_default), (second, before_tuned) = handed
    assert first is second and first is not None and "processes" not in doc["config"]
    assert before_default == [] and len(before_tuned) == 1 and before_tuned[0] in during
    assert not len(first)  # stopped with the run


def test_a_ramp_whose_server_went_away_is_left_out_of_the_verdict(tmp_path, monkeypatch, capsys, kept):
    """A server gone mid-ramp fails the steps after it, which the ramp's stop rule reads as
    overload: the ramp was not cut (`interrupted` null) and its max QPS counted."""

    def crash(server) -> None:
        server.proc.kill()
        server.proc.wait()

    after_one = lambda line: line.startswith("step 1/2: achieved")  # noqa: E731
    # A server of its own, started by tune_check: the one cut.
    status, doc, table, err = _run(tmp_path, monkeypatch, capsys, {"default": kept["default"]}, after_one, crash)
    _check_left_out(status, doc, table, err, "the server exited with -9 during the ramp")
    assert doc["runs"][1]["measured"]["interrupted"] is None  # the ramp itself ran on


def _run_of(rep: int, label: str, max_qps: float | None, error: str | None = None) -> dict:
    row = {"below_knee": True, "within_tolerance": True, "quiet": True, "relative_error": 0.1}
    row |= {"batcher_relative_error": 0.1, "fixed_overhead_p99_ms": None, "steady_batch_p99_ms": None}
    row["offered_qps"] = 100.0 * rep
    return {"rep": rep, "label": label, "error": error, "measured_max_qps": max_qps, "comparison": [row]}


CUT = "interrupted: ramp ended early at 300 QPS: RuntimeError: bench worker 1 died (exit code -9)"


@pytest.mark.parametrize(
    ("runs", "at_least", "medians", "whole"),
    [
        # Every repetition whole: the verdict as before.
        ([_run_of(1, "default", 100), _run_of(1, "tuned", 200), _run_of(2, "tuned", 150),
          _run_of(2, "default", 150)], True, (125.0, 175.0), 2),
        # One repetition whole and for tuned, the other cut: too few to say "every".
        ([_run_of(1, "default", 100), _run_of(1, "tuned", 200), _run_of(2, "tuned", 300, CUT),
          _run_of(2, "default", 150)], None, (125.0, 200.0), 1),
        # A whole repetition against tuned decides, whatever the cut one would have said.
        ([_run_of(1, "default", 300), _run_of(1, "tuned", 200), _run_of(2, "tuned", 300, CUT),
          _run_of(2, "default", 150)], False, (225.0, 200.0), 1),
        # Every tuned ramp cut: no claim, no tuned median.
        ([_run_of(1, "default", 100), _run_of(1, "tuned", 200, CUT), _run_of(2, "tuned", 300, CUT),
          _run_of(2, "default", 150)], None, (125.0, None), 0),
        # Every ramp cut.
        ([_run_of(1, "default", 100, CUT), _run_of(1, "tuned", 200, CUT)], None, (None, None), 0),
    ],
)  # fmt: skip
def test_the_verdict_is_over_whole_ramps_only(runs, at_least, medians, whole):
    v = tune_check.verdict(runs)
    assert v["tuned_at_least_default"] is at_least
    assert (v["default_median_max_qps"], v["tuned_median_max_qps"]) == medians
    assert v["reps_whole"] == whole
    kept = [r for r in runs if not r["error"]]
    assert v["steps_below_knee"] == len(kept)  # a cut ramp's steps are not compared either
    assert v["runs_left_out"] == [{"rep": r["rep"], "label": r["label"], "error": CUT} for r in runs if r["error"]]
    for label in ("default", "tuned"):
        expected = {r["rep"]: r["measured_max_qps"] for r in kept if r["label"] == label}
        reps = sorted({r["rep"] for r in runs})
        assert v[f"{label}_max_qps"] == [expected.get(rep) for rep in reps]


# --------------------------------------------------------------------------- failures before a ramp's first step,
# and calibration ramps cut short: canned servers and ramps, no processes.


class _Gone:
    """A server whose process exited (as tune_check.start_server's `proc`)."""

    returncode = -9

    def poll(self) -> int:
        return self.returncode


class _Stub:
    """tune_check.start_server's server, without a process (or with one gone, `_Gone`)."""

    target = "127.0.0.1:1"

    def __init__(self, n: int, d: float, log_dir, *args, gone: bool = False, **kwargs) -> None:
        self.setting = (n, d)
        self.ports = {"metrics": 1}
        self.log_path = log_dir / "server.log"
        if gone:
            self.proc = _Gone()

    def stop(self) -> None:
        pass


WHOLE = {"max_qps_under_slo": 100.0, "knee_qps": None, "interrupted": None, "steps": []}


def _cpu_step(rate: float, batch: float) -> dict:
    """A metered step `fit_cpu_stage` can read: one request per `1 / rate` s, batches of `batch`."""
    threads = {"loop": 100.0, "grpc": 50.0, "other": 10.0, "model": 200.0 * batch / (batch + 1)}
    return {
        "nominal_qps": rate,
        "offered_qps": rate,
        "server_cpu": {"requests": int(rate), "wall_s": 1.0, "threads_us_per_request": threads},
        "host_cpu": {"loadgen_cores": 0.1, "other_cores": 0.0},
        "mean_batch_size": batch,
        "stages_ms": {"respond": 0.05 * batch},
        "server_timing": {"requests": 0},
    }


def _canned(tmp_path, monkeypatch, ramps, *, calibrate=None, start_server=None, cpu_stage=False):
    """tune_check.main's argv, its measurements canned: `ramps(server)` is each metered ramp's result
    (or raises), the overhead calibration `calibrate` (default: canned samples), the search canned."""
    from wok.bench import compare

    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps(tune.profile_document({1: [1e-3] * 5, 8: [2e-3] * 5}, "test", model="mlp")))
    overhead = tune.overhead_document(np.full(50, 1e-3), "test: canned")
    monkeypatch.setattr(tune_check, "calibrate", calibrate or (lambda args, t1: overhead))
    monkeypatch.setattr(tune, "tune", lambda *args, **kwargs: {"chosen": None})
    monkeypatch.setattr(tune, "print_table", lambda doc: None)
    monkeypatch.setattr(tune_check, "start_server", start_server or _Stub)
    monkeypatch.setattr(tune_check, "ramp_config", lambda *args, **kwargs: None)
    monkeypatch.setattr(compare, "metered_ramp", lambda server, cfg, progress, processes=None: ramps(server))
    monkeypatch.setattr(compare, "stop_all", lambda: None)
    monkeypatch.setattr(tune_check, "predict", lambda *args, **kwargs: {"max_qps_under_slo": 1.0})
    monkeypatch.setattr(tune_check, "compare_steps", lambda *args: [])
    argv = ["--profile", str(profile), "--default", DEFAULT, "--tuned", TUNED, "--reps", "2"]
    argv += ["--json", str(tmp_path / "run.json"), "--log-dir", str(tmp_path / "logs")]
    return argv + ([] if cpu_stage else ["--no-cpu-stage"])


@pytest.mark.parametrize("where", ["start_server", "metered_ramp"])
def test_a_validation_ramp_that_fails_before_its_first_step_is_left_out_and_the_run_goes_on(
    where, tmp_path, monkeypatch, capsys
):
    """A traceback, exit 1, and nothing written: the other ramps, the profile and the calibrations
    measured before it were lost."""

    def failing(server) -> dict:
        if server.setting == (4, 0.0):
            raise RuntimeError("bench worker 1 died (exit code -9)")
        return WHOLE

    def start_server(n, d, *args, **kwargs):
        if where == "start_server" and (n, d) == (4, 0.0):
            raise RuntimeError("wok-mbs4-d0ms exited with 1; see server.log")
        return _Stub(n, d, *args, **kwargs)

    argv = _canned(tmp_path, monkeypatch, failing, start_server=start_server)
    status = tune_check.main(argv)
    err = capsys.readouterr().err
    doc = json.loads((tmp_path / "run.json").read_text())
    why = (
        "RuntimeError: wok-mbs4-d0ms exited with 1; see server.log"
        if where == "start_server"
        else "RuntimeError: bench worker 1 died (exit code -9)"
    )
    assert status == 1 and "Traceback" not in err, err
    assert doc["error"] is None
    assert [(r["rep"], r["label"], r["error"]) for r in doc["runs"]] == [
        (1, "default", None),
        (1, "tuned", f"failed before its first step: {why}"),
        (2, "tuned", f"failed before its first step: {why}"),
        (2, "default", None),
    ]
    tuned = doc["runs"][1]
    assert (tuned["measured"], tuned["comparison"], tuned["measured_max_qps"]) == (None, [], None)
    v = doc["verdict"]
    assert (v["tuned_at_least_default"], v["tuned_max_qps"], v["default_max_qps"]) == (None, [None, None], [100.0] * 2)
    assert "cut short, left out of the verdict: rep 1 tuned, rep 2 tuned" in err.splitlines()[-1]
    assert "left out of the verdict, cut short: rep 1 tuned (failed before its first step" in tune_check.markdown(doc)


def test_a_calibration_that_fails_before_its_first_step_stops_the_run_and_keeps_what_was_measured(
    tmp_path, monkeypatch, capsys
):
    """Rep 2's overhead calibration raising: a traceback, and rep 1's two ramps lost with everything else."""
    calls = []
    overhead = tune.overhead_document(np.full(50, 1e-3), "test: canned")

    def calibrate(args, t1):
        calls.append(t1)
        if len(calls) == 2:
            raise RuntimeError("wok-mbs32-d0ms exited with 1; see server.log")
        return overhead

    argv = _canned(tmp_path, monkeypatch, lambda server: WHOLE, calibrate=calibrate)
    status = tune_check.main(argv)
    err = capsys.readouterr().err
    doc = json.loads((tmp_path / "run.json").read_text())
    assert status == 1 and "Traceback" not in err, err
    line = err.splitlines()[-1]
    assert line.endswith(
        "stopped at rep 2's overhead calibration: RuntimeError: wok-mbs32-d0ms exited with 1; see server.log; "
        f"what was measured before it is in {tmp_path / 'run.json'}"
    ), line
    assert (
        doc["error"]
        == "stopped at rep 2's overhead calibration: RuntimeError: wok-mbs32-d0ms exited with 1; see server.log"
    )
    assert [(r["rep"], r["label"], r["error"]) for r in doc["runs"]] == [(1, "default", None), (1, "tuned", None)]
    assert doc["profile"]["schema"] == "wok.profile/1" and doc["overhead"] == overhead and doc["calibrations"] == []
    assert doc["tuned_setting"] == {"max_batch_size": 4, "max_queue_delay_ms": 0.0}
    assert "The run stopped at rep 2's overhead calibration" in tune_check.markdown(
        tune_check.read_run(tmp_path / "run.json")
    )


def test_a_first_calibration_that_fails_is_written_and_refused_by_markdown(tmp_path, monkeypatch, capsys):
    def calibrate(args, t1):
        raise RuntimeError("the overhead server did not start")

    argv = _canned(tmp_path, monkeypatch, lambda server: WHOLE, calibrate=calibrate)
    assert tune_check.main(argv) == 1
    doc = json.loads((tmp_path / "run.json").read_text())
    assert doc["error"] == "stopped at the overhead calibration: RuntimeError: the overhead server did not start"
    assert (doc["overhead"], doc["tune"], doc["tuned_setting"], doc["runs"]) == (None, None, None, [])
    assert doc["profile"]["schema"] == "wok.profile/1"
    with pytest.raises(ValueError, match=r"not a whole run; no overhead, tuned_setting \(stopped at the overhead"):
        tune_check.read_run(tmp_path / "run.json")


CPU_STEPS = [_cpu_step(300.0, 2.0), _cpu_step(1200.0, 6.0)]  # the third, 2400 QPS, cut


@pytest.mark.parametrize(
    ("cut", "gone", "why"),
    [
        (
            {"reason": "ramp ended early at 2400 QPS: RuntimeError: bench worker 1 died", "by_signal": False},
            False,
            "interrupted: ramp ended early at 2400 QPS: RuntimeError: bench worker 1 died",
        ),
        (None, True, "interrupted: the server exited with -9 during the ramp; see "),
    ],
)
def test_a_cpu_calibration_cut_short_is_not_used(cut, gone, why, tmp_path, monkeypatch, capsys):
    """Its two whole steps were fitted as if they were the calibration asked for, and the run went on
    to tune and predict on it, exit 0: nothing said it was cut."""

    def ramps(server) -> dict:
        if server.setting == (8, 1.0) and not ramps.calibrated:  # the first: the CPU calibration's
            ramps.calibrated = True
            return {"steps": CPU_STEPS, "interrupted": cut}
        return WHOLE

    ramps.calibrated = False
    start = lambda n, d, *args, **kwargs: _Stub(n, d, *args, gone=gone and not ramps.calibrated, **kwargs)  # noqa: E731
    argv = _canned(tmp_path, monkeypatch, ramps, start_server=start, cpu_stage=True)
    status = tune_check.main(argv)
    err = capsys.readouterr().err
    assert ramps.calibrated
    doc = json.loads((tmp_path / "run.json").read_text())
    assert status == 1 and "Traceback" not in err, err
    assert doc["error"].startswith(f"stopped at the CPU calibration: its ramp was cut short ({why}"), doc["error"]
    assert doc["error"].endswith("); not used")
    assert (doc["cpu_stage"], doc["overhead"], doc["runs"]) == (None, None, [])


def test_the_cpu_calibration_and_each_validation_ramp_carry_their_stop_rule(tmp_path, monkeypatch, capsys):
    """The CPU calibration's ramp, ended by its stop rule before its last load, was fitted on the loads it ran and
    nothing in the document said so: its `stopped_early` is the calibration's (`cpu_stage.stopped_early`), as each
    validation ramp's is in its `measured`."""
    stop = {"reason": "the step's P99 900 ms is over 10 × the SLO (50 ms)", "rule": "stop_factor", "at_qps": 1200.0,
            "steps_run": 2, "steps_planned": 3}  # fmt: skip
    validation = {**WHOLE, "stopped_early": {**stop, "at_qps": 40.0, "steps_run": 1, "steps_planned": 2}}
    results = iter([{"steps": CPU_STEPS, "interrupted": None, "stopped_early": stop}])  # the CPU calibration's
    argv = _canned(tmp_path, monkeypatch, lambda server: next(results, validation), cpu_stage=True)
    tune_check.main(argv)
    doc = json.loads((tmp_path / "run.json").read_text())
    assert doc["cpu_stage"]["stopped_early"] == stop, (doc["error"], capsys.readouterr().err[-2000:])
    assert [run["measured"]["stopped_early"] for run in doc["runs"]] == [validation["stopped_early"]] * 4


def test_a_cpu_calibration_cut_by_a_signal_stops_the_run(tmp_path, monkeypatch):
    """The ramp caught the Ctrl-C after its first step and the run went on with the steps before it."""
    cut = {"reason": "ramp ended early at 2400 QPS: KeyboardInterrupt", "by_signal": True}
    results = iter([{"steps": CPU_STEPS, "interrupted": cut}])  # the CPU calibration's; the others whole
    argv = _canned(tmp_path, monkeypatch, lambda server: next(results, WHOLE), cpu_stage=True)
    with pytest.raises(KeyboardInterrupt, match="ramp ended early at 2400 QPS"):
        tune_check.main(argv)
    assert not (tmp_path / "run.json").exists()
