"""bench/tune_check.py refuses a search the simulator cannot hold (its busiest step over the arrival
cap) in its own options' names, with exit 2, before it measures what the search does not need; and
a validation ramp whose predictions fail is kept with what it measured. No servers: every
measurement is a stand-in that records it was asked for."""

from __future__ import annotations

import json

import numpy as np
import pytest

from wok.bench import compare, tune, tune_check

# Batches of 1 in 1 ms, of 8 in 2 ms: the grid's highest ceiling (max_batch_size 64) is about 6,400
# QPS, so a simulated step of 1e6 s would expect some 6e9 arrivals, over the simulator's 1e8.
PROFILE = {1: [1e-3] * 5, 8: [2e-3] * 5}
TOO_LONG = "1e6s"
OVERHEAD = tune.overhead_document(np.full(50, 1e-3), "test: canned")
STAGE = tune.CpuStage(cpu_in_s=1e-4, cpu_out_s=1e-4, cores=2.0, batch_alpha_s=1e-3, batch_beta_s=1e-4)


class _Stub:
    """tune_check.start_server's server, without a process."""

    target = "127.0.0.1:1"

    def __init__(self, n: int, d: float, log_dir, *args, **kwargs) -> None:
        self.setting = (n, d)
        self.ports = {"metrics": 1}
        self.log_path = log_dir / "server.log"

    def stop(self) -> None:
        pass


@pytest.fixture
def measured(monkeypatch) -> list[str]:
    """What tune_check measured, in order: every measurement it can make replaced by a stand-in."""
    calls: list[str] = []

    def measure_profile(sizes, reps, *args, **kwargs):
        calls.append("profile")
        return tune.profile_document(PROFILE, "test: canned", model="mlp")

    def calibrate_cpu(args):
        calls.append("cpu calibration")
        return tune.cpu_document(STAGE, "test: canned")

    def calibrate(args, t1):
        calls.append("overhead calibration")
        return OVERHEAD

    def start_server(n, d, *args, **kwargs):
        calls.append(f"server {n},{d:g}")
        return _Stub(n, d, *args, **kwargs)

    def metered_ramp(server, cfg, progress, processes=None):
        calls.append("ramp")
        return {"max_qps_under_slo": 100.0, "knee_qps": None, "interrupted": None, "steps": [], "slo_p99_ms": 50.0}

    monkeypatch.setattr(tune_check, "measure_profile", measure_profile)
    monkeypatch.setattr(tune_check, "calibrate_cpu", calibrate_cpu)
    monkeypatch.setattr(tune_check, "calibrate", calibrate)
    monkeypatch.setattr(tune_check, "start_server", start_server)
    monkeypatch.setattr(tune_check, "ramp_config", lambda *args, **kwargs: None)
    monkeypatch.setattr(compare, "metered_ramp", metered_ramp)
    monkeypatch.setattr(compare, "stop_all", lambda: None)
    monkeypatch.setattr(tune, "print_table", lambda doc: None)
    return calls


def _main(argv: list[str]) -> int:
    try:
        return tune_check.main(argv)
    except SystemExit as exc:  # argparse's error: status 2
        return exc.code


def _profile(tmp_path) -> str:
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(tune.profile_document(PROFILE, "test", model="mlp")))
    return str(path)


def _argv(tmp_path, *extra: str) -> list[str]:
    return [*extra, "--json", str(tmp_path / "run.json"), "--log-dir", str(tmp_path / "logs"), "--reps", "1"]


def _says_the_options(message: str, setting: str = "max_batch_size 64, delay 0 ms") -> None:
    assert f"--arrival poisson over the search's 1 s warm-up + --sim-duration {TOO_LONG} (1e+06 s)" in message
    assert "at most 1e+08 arrivals per simulated step" in message
    # The first of the grid's settings with the highest ceiling.
    assert f"{setting}, of --max-batch-sizes, --delays and --default" in message


@pytest.mark.parametrize("no_stage", [["--no-cpu-stage"], ["--device-like", "1ms,0.1ms"]])
def test_a_search_too_large_for_a_given_profile_is_refused_before_anything_is_measured(
    no_stage, tmp_path, measured, capsys
):
    """It calibrated (a server, a ramp), then failed in the search: 'stopped at the search', exit 1,
    in the library's words (`warmup_s + duration_s`)."""
    status = _main(_argv(tmp_path, "--profile", _profile(tmp_path), *no_stage, "--sim-duration", TOO_LONG))
    err = capsys.readouterr().err
    assert (status, measured) == (2, []), err[-2000:]
    _says_the_options(err)
    assert "the profile's α, β" in err
    assert not (tmp_path / "run.json").exists()  # nothing measured, nothing to write


def test_a_search_too_large_for_the_measured_profile_is_refused_before_the_first_server(tmp_path, measured, capsys):
    """It went on to the calibration's server and ramp, and stopped only at the search, exit 1."""
    status = _main(_argv(tmp_path, "--no-cpu-stage", "--sim-duration", TOO_LONG))
    err = capsys.readouterr().err
    assert (status, measured) == (2, ["profile"]), err[-2000:]
    _says_the_options(err.splitlines()[-1])
    doc = json.loads((tmp_path / "run.json").read_text())
    assert doc["error"].startswith("stopped at the search's check: --arrival poisson over"), doc["error"]
    assert doc["profile"]["schema"] == "wok.profile/1"
    assert (doc["overhead"], doc["tune"], doc["runs"]) == (None, None, [])


def test_with_the_cpu_stage_the_search_is_checked_on_the_stage_before_the_overhead_calibration(
    tmp_path, measured, capsys
):
    """The stage's batch time replaces the profile's fit in the search, so its ceilings are known only
    after the CPU calibration; checked then, not after the overhead calibration and the search."""
    status = _main(_argv(tmp_path, "--profile", _profile(tmp_path), "--sim-duration", TOO_LONG))
    err = capsys.readouterr().err
    assert (status, measured) == (2, ["cpu calibration"]), err[-2000:]
    # The stage's loop bound, 1 / (c_in + c_out) = 5,000 QPS, caps max_batch_size 16 and above.
    _says_the_options(err.splitlines()[-1], "max_batch_size 16, delay 0 ms")
    assert "its ceiling by the CPU stage's batch time and bound is 5000 QPS" in err
    doc = json.loads((tmp_path / "run.json").read_text())
    assert doc["cpu_stage"]["schema"] == "wok.cpustage/1" and doc["overhead"] is None


def test_a_search_that_fits_is_not_refused(tmp_path, measured, monkeypatch):
    monkeypatch.setattr(tune, "tune", lambda *args, **kwargs: {"chosen": None})
    status = _main(_argv(tmp_path, "--profile", _profile(tmp_path), "--no-cpu-stage", "--sim-duration", "1s"))
    assert (status, measured) == (1, ["overhead calibration"])  # no setting meets the SLO (canned): 1


def test_a_ramp_whose_prediction_fails_is_kept_with_what_it_measured(tmp_path, measured, monkeypatch, capsys):
    """The run stopped at 'rep 1 tuned' with its measured ramp lost (exit 1, `runs` without it)."""
    monkeypatch.setattr(tune, "tune", lambda *args, **kwargs: {"chosen": None})
    real = tune_check.predict

    def predict(result, n, *args, **kwargs):
        if n == 4:
            raise ValueError("at most 1e+08 arrivals per step; got 4e+08")
        return real(result, n, *args, **kwargs)

    monkeypatch.setattr(tune_check, "predict", predict)
    monkeypatch.setattr(tune_check, "compare_steps", lambda *args: [])
    argv = _argv(tmp_path, "--profile", _profile(tmp_path), "--no-cpu-stage", "--default", "8,1ms", "--tuned", "4,0ms")
    status = _main(argv)
    err = capsys.readouterr().err
    doc = json.loads((tmp_path / "run.json").read_text())
    assert status == 1 and "Traceback" not in err, err[-2000:]
    assert doc["error"] is None
    default, tuned = doc["runs"]
    assert (default["label"], default["error"]) == ("default", None)
    assert tuned["label"] == "tuned"
    assert tuned["error"] == "predicting it failed: ValueError: at most 1e+08 arrivals per step; got 4e+08"
    assert tuned["measured"]["max_qps_under_slo"] == 100.0 and tuned["measured_max_qps"] == 100.0
    assert (tuned["predicted_max_qps_on_steps"], tuned["comparison"]) == (None, [])
    assert doc["verdict"]["runs_left_out"] == [{"rep": 1, "label": "tuned", "error": tuned["error"]}]
    assert "left out of the verdict: rep 1 tuned" in err.splitlines()[-1]


def test_the_search_is_refused_as_the_librarys_search_too_large(tmp_path, measured, capsys):
    """One class, one check (`wok.bench.tune.check_fits`): tune_check had its own of each."""
    assert tune_check.SearchTooLarge is tune.SearchTooLarge
    status = _main(_argv(tmp_path, "--profile", _profile(tmp_path), "--no-cpu-stage", "--sim-duration", TOO_LONG))
    err = capsys.readouterr().err
    assert status == 2 and err.rstrip().endswith("a shorter --sim-duration, or a grid with a lower ceiling, fits"), err


def test_a_search_whose_warm_up_alone_is_too_large_says_no_duration_fits(tmp_path, measured, capsys):
    """Batches in nanoseconds: a ceiling of some 6e9 QPS, whose 1 s warm-up alone is over the cap. The
    refusal said 'a shorter --sim-duration, or a grid with a lower ceiling, fits'."""
    path = tmp_path / "fast.json"
    path.write_text(json.dumps(tune.profile_document({1: [1e-9] * 5, 8: [2e-9] * 5}, "test", model="mlp")))
    status = _main(_argv(tmp_path, "--profile", str(path), "--no-cpu-stage", "--sim-duration", "1ms"))
    err = capsys.readouterr().err
    assert (status, measured) == (2, []), err[-2000:]
    assert "a shorter --sim-duration" not in err, err
    assert "; even the search's 1 s warm-up alone expects 6.38e+09, so no shorter --sim-duration fits; " in err, err
    assert err.rstrip().endswith("a grid with a lower ceiling does"), err


def test_a_profile_the_model_refuses_is_named_as_the_profile(tmp_path, measured, capsys):
    """A fit of α = β = 0: the early check's error was blamed on --arrival ('error: --arrival poisson: ...')."""
    path = tmp_path / "zero.json"
    doc = tune.profile_document({1: [1e-3] * 5, 8: [2e-3] * 5}, "test", model="mlp")
    path.write_text(json.dumps({**doc, "fit": {"alpha_s": 0.0, "beta_s": 0.0, "r2": 1.0}}))
    status = _main(_argv(tmp_path, "--profile", str(path), "--no-cpu-stage"))
    err = capsys.readouterr().err
    assert (status, measured) == (2, []), err[-2000:]
    assert "error: --profile: batch time α + β·n: expected α, β ≥ 0 and α + β > 0" in err, err
    assert "error: --arrival" not in err, err
    # Batch times of 0 s are refused as the profile's, in its field, when it is read.
    path.write_text(json.dumps(tune.profile_document({1: [0.0] * 5, 8: [0.0] * 5}, "test", model="mlp")))
    status = _main(_argv(tmp_path, "--profile", str(path), "--no-cpu-stage"))
    err = capsys.readouterr().err
    assert (status, measured) == (2, []), err[-2000:]
    assert f"error: --profile: {path}: batches[0].samples_s: expected batch times > 0 s; got 0.0" in err, err


def test_refresh_skips_a_run_whose_prediction_failed(monkeypatch):
    """--markdown --refresh predicted a run kept with `comparison` empty (its predicting had failed) again."""
    monkeypatch.setattr(tune_check, "predict", lambda *a, **k: pytest.fail("predicted a run with no comparison"))
    measured = {"max_qps_under_slo": 100.0, "knee_qps": None, "steps": [{"offered_qps": 50.0}]}
    doc = {
        "profile": tune.profile_document(PROFILE, "test", model="mlp"),
        "config": {"step_duration": 1.0, "warmup": 1.0, "arrival": "poisson", "seed": 0},
        "runs": [
            {
                "label": "tuned",
                "max_batch_size": 4,
                "max_queue_delay_ms": 0.0,
                "measured": measured,
                "comparison": [],
                "error": "predicting it failed: ValueError: at most 1e+08 arrivals per step",
            },
            {
                "label": "default",
                "max_batch_size": 8,
                "max_queue_delay_ms": 1.0,
                "measured": None,
                "comparison": [],
                "error": "failed before its first step: boom",
            },
        ],
    }
    tune_check.add_batcher_means(doc)
    assert [r["comparison"] for r in doc["runs"]] == [[], []]


# T(1), which each overhead sample is its calibration latency less, is the profile's median_s of batches of 1
# (nearest-rank, the ⌈n/2⌉-th smallest, as `wok profile` and tune.profile_document write it): np.median
# took the mean of the middle two, 2.5 ms of 1, 2, 3, 4 ms, a time no batch took.
FOUR_MS = [4e-3, 1e-3, 3e-3, 2e-3]


def _t1_given_to_the_calibration(monkeypatch, tmp_path, argv: list[str]) -> float:
    given = []

    def calibrate(args, t1):
        given.append(t1)
        return OVERHEAD

    monkeypatch.setattr(tune_check, "calibrate", calibrate)
    monkeypatch.setattr(tune, "tune", lambda *args, **kwargs: {"chosen": None})
    assert _main(_argv(tmp_path, *argv)) == 1  # no setting chosen (canned): 1
    [t1] = given
    return t1


def test_t1_of_a_profile_is_its_nearest_rank_median(tmp_path, measured, monkeypatch):
    path = tmp_path / "profile.json"
    doc = tune.profile_document({1: FOUR_MS, 8: [5e-3] * 5}, "test", model="mlp")
    path.write_text(json.dumps(doc))
    t1 = _t1_given_to_the_calibration(monkeypatch, tmp_path, ["--profile", str(path), "--no-cpu-stage"])
    assert t1 == 2e-3 == doc["batches"][0]["median_s"]


def test_t1_of_the_device_like_calibrations_zero_time_batch_is_its_nearest_rank_median(tmp_path, measured, monkeypatch):
    zero = tune.profile_document({1: [1e-4, 1e-4, 3e-4, 3e-4], 2: [2e-4] * 4}, "test: the zero-time batch")
    monkeypatch.setattr(tune_check, "measure_profile", lambda *args, **kwargs: zero)
    argv = ["--profile", _profile(tmp_path), "--device-like", "1ms,0.1ms"]
    assert _t1_given_to_the_calibration(monkeypatch, tmp_path, argv) == 1e-4  # ties: np.median 2e-4


@pytest.mark.parametrize("allow", [False, True])
def test_the_setting_validated_is_the_one_wok_tune_chooses(allow, tmp_path, measured, capsys):
    """`wok tune` chooses among settings on measured batch times first (--allow-extrapolated to choose past them);
    tune_check validated its search's choice with no such option, so it could not check the setting a user of
    `wok tune --allow-extrapolated` gets. On the profile of batches 1 and 8, max_batch_size 64 forms batches past
    8 and predicts more (its ceiling 64 / T(64) = 6,400 QPS against 8 / T(8) = 4,000): measured first, 8 is
    validated and 64 passed over; allowed, 64."""
    extra = ["--allow-extrapolated"] if allow else []
    argv = ["--profile", _profile(tmp_path), "--no-cpu-stage", "--max-batch-sizes", "8,64", "--delays", "0ms"]
    status = _main(_argv(tmp_path, *argv, "--default", "8,0ms", "--sim-duration", "1s", *extra))
    err = capsys.readouterr().err
    assert status == 0, err[-2000:]
    doc = json.loads((tmp_path / "run.json").read_text())
    assert doc["config"]["allow_extrapolated"] is allow
    assert doc["tune"]["inputs"]["allow_extrapolated"] is allow
    assert doc["tuned_setting"] == {"max_batch_size": 64 if allow else 8, "max_queue_delay_ms": 0.0}
    assert (doc["tune"]["passed_over"] is None) is allow
    assert measured == ["overhead calibration", "server 8,0", "ramp", f"server {64 if allow else 8},0", "ramp"]


def test_help_gives_every_option_a_help_with_its_default_and_the_runs_length():
    """Most options had no help and --help showed no default: how long a run would take could not be told from it."""
    import argparse

    parser = tune_check.build_parser()
    text = parser.format_help()
    for action in parser._actions:
        if action.help == argparse.SUPPRESS or action.dest == "help":
            continue
        assert action.help, f"{action.option_strings[0]} has no help"
        if action.default not in (None, False):
            shown = f"{action.default:g}" if isinstance(action.default, float) else str(action.default)
            assert shown in action.help % {"default": action.default}, action.option_strings[0]
    # The load a default run offers, at most: 3 CPU steps of 1 + 4 s, 2 overhead calibrations of 1 + 6 s,
    # 2 repetitions × 2 settings × 10 steps of 1 + 4 s.
    prose = " ".join(text.split())
    for part in ("(15 s with the defaults;", "--calibration-duration (14 s)", "of validation (200 s;"):
        assert part in prose
    # A server started per repetition's overhead calibration and its 2 settings, and the CPU calibration's where it
    # runs: --help said 3 × --reps + 1 with --no-cpu-stage and --device-like too, where a run starts and says 6.
    assert "server (3 × --reps + 1, 7 with the defaults; 3 × --reps, 6, with --no-cpu-stage or --device-like)" in prose
    args = tune_check.parse_args(["--reps", "3", "--no-cpu-stage", "--steps", "100,200", "--step-duration", "2s"])
    assert tune_check.measured_seconds(args) == {
        "cpu calibration": 0.0,
        "overhead calibrations": 3 * (1 + 6),
        "validation": 3 * 2 * 2 * (1 + 2),
    }


@pytest.mark.parametrize(
    ("extra", "planned"),
    [
        (
            ["--no-cpu-stage"],
            "planned: at most 19 s of load (7 s of overhead calibrations, 12 s of validation; less if a step ends a "
            "ramp: --stop-factor, or no request OK), besides the in-process profile, the search and the starts of 3 "
            "servers, a few seconds each",
        ),
        (
            ["--cpu-steps", "300,600"],
            "planned: at most 29 s of load (10 s of CPU calibration, 7 s of overhead calibrations, 12 s of "
            "validation; less if a step ends a ramp: --stop-factor, or no request OK), besides the in-process "
            "profile, the search and the starts of 4 servers, a few seconds each",
        ),
        (
            # A step with no request OK, none failed by load, ends a ramp whatever --stop-factor: with inf the
            # line named no end at all.
            ["--no-cpu-stage", "--stop-factor", "inf"],
            "planned: at most 19 s of load (7 s of overhead calibrations, 12 s of validation; less if a step ends a "
            "ramp: no request OK, none failed by load), besides the in-process profile, the search and the starts "
            "of 3 servers, a few seconds each",
        ),
    ],
    ids=["no-cpu-stage", "cpu-stage", "stop-factor-inf"],
)
def test_a_run_says_how_long_it_will_take_as_it_starts(tmp_path, measured, capsys, extra, planned):
    """--help alone said it, from the defaults: a run of other options said nothing of its length but each
    stage's start, minutes apart."""
    argv = _argv(tmp_path, *extra, "--steps", "100,200", "--step-duration", "2s", "--sim-duration", TOO_LONG)
    assert _main(argv) == 2  # stopped at the search's check, after the profile: the plan was said before it
    first, second = capsys.readouterr().err.splitlines()[:2]
    assert first.endswith(f"] {planned}"), first
    assert "profiling mlp in-process" in second
