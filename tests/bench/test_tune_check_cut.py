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

    def metered_ramp(server, cfg, progress):
        def said(line: str) -> None:
            progress(line)
            if server.peer.name == TUNED_SERVER and cut_when(line) and not seen:
                seen.append(line)
                cut(server)

        return real(server, cfg, said)

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
