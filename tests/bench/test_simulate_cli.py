"""`wok simulate`'s option checks: a bad value exits 2 with a message naming the option, before any
simulation (and the library refuses what the command line would have let through)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from wok.bench.simulate import BatcherModel, SimConfig

BASE = ["--steps", "100", "--step-duration", "1s"]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--step-duration", "0s"], "--step-duration: expected a finite duration > 0; got '0s'"),
        (["--step-duration", "1e400s"], "--step-duration: expected a finite duration > 0; got '1e400s'"),
        (
            ["--warmup", "1e400s"],
            "--warmup: expected a finite duration or a percentage of --step-duration; got '1e400s'",
        ),
        (["--warmup", "-1s"], "--warmup: invalid duration '-1s': expected a number >= 0"),
        (["--seed=-1"], "--seed: expected an integer >= 0; got -1"),
        (["--alpha", "1e400s"], "--alpha: expected a finite duration; got '1e400s'"),
        (["--beta", "1e400s"], "--beta: expected a finite duration; got '1e400s'"),
        (["--max-queue-delay", "1e400s"], "--max-queue-delay: expected a finite duration; got '1e400s'"),
        (["--slo-p99", "0ms"], "--slo-p99: expected a finite duration > 0; got '0ms'"),
        (["--max-batch-size", "0"], "--max-batch-size: expected an integer >= 1; got 0"),
        (["--alpha", "0ms", "--beta", "0ms"], "--alpha and --beta: a batch needs a time"),
        # 10⁹ QPS × 100 s = 10¹¹ arrivals: a slip, refused before it runs out of memory.
        (
            ["--steps", "1e9", "--step-duration", "100s", "--warmup", "0"],
            "--steps × (--warmup + --step-duration) with --arrival poisson: at most 1e+08 arrivals per step; "
            "got 1e+11 expected at 1e+09 QPS over 100 s",
        ),
    ],
)
def test_a_bad_option_exits_2_naming_it(options, message, capsys):
    from wok.__main__ import main

    # In this process (a wok process each cost seconds of imports): anything but the refusal,
    # a traceback included, raises out of main() and fails the test.
    assert main(["simulate", *BASE, *options]) == 2
    err = capsys.readouterr().err
    assert err.startswith("wok simulate: ") and message in err, err


@pytest.mark.parametrize(
    ("arrival", "expected"),
    [
        # 10 QPS over 1 s, but a bump of 10¹² QPS with σ 1 ms: A·σ·√(2π) = 2.51·10⁹ arrivals.
        ("burst:amplitude=1e12,sigma=1ms", "got 2.51e+09 expected at 10 QPS over 1 s"),
        # The same bump at the window's end (t0 = 1 s): half of it, 1.25·10⁹, is in the window.
        ("burst:amplitude=1e12,t0=1s,sigma=1ms", "got 1.25e+09 expected at 10 QPS over 1 s"),
        # Two arrivals 1 ns apart, replayed at their own pace: one a nanosecond, whatever --steps says.
        ("trace:{tiny}", "got 1e+09 expected at 10 QPS over 1 s"),
    ],
)
def test_a_step_is_capped_by_its_arrival_process_own_count_before_simulating(
    arrival, expected, tmp_path, monkeypatch, capsys
):
    """The cap was estimated as max(--steps) × the window, 10 here: a burst's bump or a dense trace
    passed it and the simulator then ran out of memory or time."""
    import wok.bench.simulate as simulate_module
    from wok.__main__ import main

    tiny = tmp_path / "tiny.csv"
    tiny.write_text("timestamp\n0\n0.000000001\n")
    monkeypatch.setattr(simulate_module, "simulate_ramp", lambda *a: pytest.fail("simulated before refusing"))
    arrival = arrival.format(tiny=tiny)
    # No warm-up: the window alone is the second the counts below are over.
    assert main(["simulate", "--steps", "10", "--step-duration", "1s", "--warmup", "0", "--arrival", arrival]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"wok simulate: --steps × (--warmup + --step-duration) with --arrival {arrival}: at most 1e+08 arrivals "
        f"per step; {expected}\n"
    )


def test_the_library_caps_a_step_by_its_arrival_process_too(tmp_path):
    model = BatcherModel(alpha_s=0.0, beta_s=1e-3, max_batch_size=1, max_queue_delay_s=0.0)
    with pytest.raises(ValueError, match=r"with arrival 'burst:amplitude=1e12,sigma=1ms': expected at most 1e\+08"):
        SimConfig(model=model, steps=[10.0], step_duration_s=1.0, arrival="burst:amplitude=1e12,sigma=1ms")
    # Nor the same bump beyond the window: what is in it counts, 10 QPS × 1 s.
    SimConfig(model=model, steps=[10.0], step_duration_s=1.0, arrival="burst:amplitude=1e12,t0=100s,sigma=1ms")
    # Nor a sparse trace at a high step rate: it replays its own 2 arrivals a second, not 10⁹.
    sparse = tmp_path / "sparse.csv"
    sparse.write_text("timestamp\n0\n0.5\n")
    SimConfig(model=model, steps=[1e9], step_duration_s=1.0, arrival=f"trace:{sparse}")


def test_a_missing_trace_file_is_refused_as_the_arrival_options(tmp_path, capsys):
    from wok.__main__ import main

    missing = tmp_path / "missing.csv"
    assert main(["simulate", *BASE, "--arrival", f"trace:{missing}"]) == 2
    assert capsys.readouterr().err == (
        f"wok simulate: --arrival: arrivals 'trace:{missing}': cannot read {missing}: No such file or directory\n"
    )


@pytest.mark.parametrize("field", ["alpha_s", "beta_s", "max_queue_delay_s"])
def test_the_model_needs_finite_times(field):
    base = {"alpha_s": 1e-3, "beta_s": 1e-3, "max_batch_size": 1, "max_queue_delay_s": 0.0}
    with pytest.raises(ValueError, match=f"{field}: expected a finite number of seconds; got inf"):
        BatcherModel(**{**base, field: math.inf})


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        # NaN passed `min(times) <= 0` (min() of (1.0, nan) is 1.0, of (nan, 1.0) nan), inf a batch that never ends.
        ("batch_samples", ((4, (1e-3, math.nan)),), "batch_samples: size 4: expected finite times > 0 s; got nan"),
        ("batch_samples", ((4, (math.nan, 1e-3)),), "batch_samples: size 4: expected finite times > 0 s; got nan"),
        ("batch_samples", ((4, (math.inf,)),), "batch_samples: size 4: expected finite times > 0 s; got inf"),
        ("batch_samples", ((4, ()),), "batch_samples: size 4: expected finite times > 0 s; got none"),
        # A time of 0 was said to be none (`0.0 or 'none'`).
        ("batch_samples", ((4, (1e-3, 0.0)),), "batch_samples: size 4: expected finite times > 0 s; got 0.0"),
        ("batch_samples", ((4, (-0.0,)),), "batch_samples: size 4: expected finite times > 0 s; got -0.0"),
        ("batch_samples", ((0, (1e-3,)),), "batch_samples: expected integer sizes n ≥ 1; got 0"),
        ("batch_samples", ((2.5, (1e-3,)),), "batch_samples: expected integer sizes n ≥ 1; got 2.5"),
        ("batch_samples", ((4.0, (1e-3,)),), "batch_samples: expected integer sizes n ≥ 1; got 4.0"),
        ("overhead_samples_s", (1e-4, math.nan), "overhead_samples_s: expected finite times ≥ 0 s; got nan"),
        ("overhead_samples_s", (math.inf,), "overhead_samples_s: expected finite times ≥ 0 s; got inf"),
        ("overhead_samples_s", (-1e-4,), "overhead_samples_s: expected finite times ≥ 0 s; got -0.0001"),
        ("max_batch_size", 0, "max_batch_size: expected an integer >= 1; got 0"),
        ("instances", 0, "instances: expected an integer >= 1; got 0"),
        ("max_queue_size", -1, "max_queue_size: expected an integer >= 0; got -1"),
        # Counts are ints, as the server's settings: 2.0 and 2.5 ended the simulation in a TypeError, 2.5 queued.
        ("max_batch_size", 2.0, "max_batch_size: expected an integer >= 1; got 2.0"),
        ("max_batch_size", 2.5, "max_batch_size: expected an integer >= 1; got 2.5"),
        ("max_batch_size", True, "max_batch_size: expected an integer >= 1; got True"),
        ("instances", 1.5, "instances: expected an integer >= 1; got 1.5"),
        ("max_queue_size", 2.5, "max_queue_size: expected an integer >= 0; got 2.5"),
        ("max_queue_delay_s", -1e-3, "max_queue_delay_s: expected a number of seconds >= 0; got -0.001"),
    ],
)
def test_the_model_refuses_each_bad_field_by_name(field, value, message):
    base = {"alpha_s": 1e-3, "beta_s": 1e-3, "max_batch_size": 4, "max_queue_delay_s": 0.0}
    with pytest.raises(ValueError) as info:
        BatcherModel(**{**base, field: value})
    assert str(info.value) == message


def test_the_model_takes_numpy_integer_counts():
    model = BatcherModel(
        alpha_s=1e-3,
        beta_s=1e-3,
        max_batch_size=np.int64(4),
        max_queue_delay_s=0.0,
        instances=np.int32(2),
        batch_samples=((np.int64(4), (1e-3,)),),
    )
    assert (model.max_batch_size, model.instances) == (4, 2)


def test_a_step_is_capped_at_max_arrivals_and_needs_a_window():
    from wok.bench.simulate import MAX_ARRIVALS_PER_STEP

    model = BatcherModel(alpha_s=0.0, beta_s=1e-3, max_batch_size=1, max_queue_delay_s=0.0)
    # 10⁶ QPS over 90 + 10 s is exactly the cap; a hair more is not.
    assert MAX_ARRIVALS_PER_STEP == 1e8
    SimConfig(model=model, steps=[1e3, 1e6], step_duration_s=90.0, warmup_s=10.0)
    with pytest.raises(ValueError, match=r": expected at most 1e\+08 arrivals per step; got 1e\+08"):
        SimConfig(model=model, steps=[1.001e6], step_duration_s=90.0, warmup_s=10.0)
    with pytest.raises(ValueError, match=r"step_duration_s: expected a finite duration > 0 s; got 0\.0"):
        SimConfig(model=model, steps=[1.0], step_duration_s=0.0)


def test_a_write_that_fails_is_reported_not_a_traceback(tmp_path, monkeypatch, wok_cli):
    """Past the up-front check (tests/bench/test_cli.py; a disk that fills, a folder removed
    meanwhile), the OSError is the option's message, exit 2; it was a traceback, exit 1."""
    import wok.bench.cli as cli

    monkeypatch.setattr(cli, "_check_outputs", lambda *a, **k: None, raising=False)
    path = tmp_path / "missing" / "x.json"
    status, out, err = wok_cli("simulate", *BASE, "--json", str(path))
    assert "utilization" not in out  # the failed write ends the command
    assert (status, err) == (2, f"wok simulate: --json {path}: No such file or directory\n")


@pytest.mark.parametrize(
    ("option", "value", "hint"),
    [
        ("--alpha", "1", "1ms or 0.001s"),
        ("--beta", "0.5", "0.5ms or 0.0005s"),
        ("--max-queue-delay", "2", "2ms or 0.002s"),
        ("--slo-p99", "50", "50ms or 0.05s"),
    ],
)
def test_a_latency_given_as_a_bare_number_is_refused(option, value, hint, capsys):
    """A bare number is seconds: `--alpha 1 --slo-p99 50` simulated 1 s batches against a 50 s
    objective ("P99 ≤ 50000 ms") and passed, exit 0."""
    from wok.__main__ import main

    assert main(["simulate", *BASE, option, value]) == 2
    assert capsys.readouterr().err == (
        f"wok simulate: {option} '{value}': give a unit, e.g. {hint} (a bare number would be seconds)\n"
    )


def test_a_bare_number_that_is_not_finite_reaches_the_finite_check(capsys):
    from wok.__main__ import main

    assert main(["simulate", *BASE, "--alpha", "1e400"]) == 2
    assert capsys.readouterr().err == "wok simulate: --alpha: expected a finite duration; got '1e400'\n"


def test_the_steps_lengths_keep_bare_seconds(tmp_path, capsys):
    """Not latencies: --step-duration 2 --warmup 0.5 are seconds, as for `wok bench ramp`."""
    import json

    from wok.__main__ import main

    path = tmp_path / "sim.json"
    assert main(["simulate", "--steps", "10", "--step-duration", "2", "--warmup", "0.5", "--json", str(path)]) == 0
    config = json.loads(path.read_text())["config"]
    assert (config["step_duration_s"], config["warmup_s"]) == (2.0, 0.5), config


@pytest.mark.parametrize(
    ("argv", "warmup_s"),
    [
        (["--step-duration", "60s"], 6.0),  # wok bench ramp's default step: its 6 s
        (["--step-duration", "600s"], 30.0),  # wok simulate's default step: the ramp's cap
        (["--step-duration", "60s", "--warmup", "20%"], 12.0),
        (["--step-duration", "60s", "--warmup", "0"], 0.0),
    ],
)
def test_the_warmup_is_the_ramps_rule(argv, warmup_s, tmp_path):
    """`wok simulate` ("the same ramp, simulated") counted a step from its first arrival (--warmup 0s by default)
    where `wok bench ramp` leaves out 10 % of the step, at most 30 s, and refused --warmup 20 %: past capacity the
    simulated queue had grown for less time at the window's start, and its P99 came out lower than the bench's."""
    import json

    from wok.__main__ import main
    from wok.bench.cli import WARMUP_CAP_S, WARMUP_SHARE

    assert (WARMUP_SHARE, WARMUP_CAP_S) == (0.1, 30.0)  # the rule the cases above spell out
    path = tmp_path / "sim.json"
    assert main(["simulate", "--steps", "1", *argv, "--json", str(path)]) == 0
    assert json.loads(path.read_text())["config"]["warmup_s"] == pytest.approx(warmup_s)


def test_the_files_written_are_named_on_stderr(tmp_path, wok_cli):
    """`wok simulate` and `wok bench ramp` (one writer, `cli._write_outputs`) wrote --json, --csv and --html and
    named none of them: a new operator had to guess where the results went."""
    out, csv, html = tmp_path / "sim.json", tmp_path / "sim.csv", tmp_path / "sim.html"
    status, _, err = wok_cli("simulate", *BASE, "--json", str(out), "--csv", str(csv), "--html", str(html))
    assert status == 0, err
    assert err.splitlines() == [
        f"wok simulate: wrote {out} (--json)",
        f"wok simulate: wrote {csv} (--csv)",
        f"wok simulate: wrote {html} (--html)",
    ]


PROFILE_MLP = Path(__file__).resolve().parents[2] / "docs" / "results" / "profile-mlp.json"


def test_a_profile_gives_alpha_and_beta_and_the_utilisation_follows_from_them(tmp_path, capsys):
    """`wok simulate --profile` (docs/profile.md says simulate reads α and β from a profile; it had no such option):
    α and β are the file's fit, and with batches that leave only full (a window of 10⁴ s), arrivals evenly spaced,
    the instance is busy λ·T(n)/n of the window, T(n) = α + β·n, but for the batch either end of the window cuts.
    The default batch time (0 + 1 ms·n) would keep it busy all through: 1000 QPS × 32 ms / 32."""
    import json

    from wok.__main__ import main

    fit = json.loads(PROFILE_MLP.read_text())["fit"]
    alpha, beta = fit["alpha_s"], fit["beta_s"]
    path = tmp_path / "sim.json"
    argv = ["--steps", "1000", "--step-duration", "10s", "--warmup", "1s", "--arrival", "constant"]
    argv += ["--max-batch-size", "32", "--max-queue-delay", "10000s", "--profile", str(PROFILE_MLP)]
    assert main(["simulate", *argv, "--json", str(path)]) == 0, capsys.readouterr().err
    result = json.loads(path.read_text())
    assert (result["config"]["model"]["alpha_s"], result["config"]["model"]["beta_s"]) == (alpha, beta)
    assert result["config"]["profile"] == str(PROFILE_MLP)
    step = result["steps"][0]
    assert step["mean_batch_size"] == 32.0, step
    t32 = alpha + beta * 32  # 1.666 ms: U = 1000 × 1.666 ms / 32 = 0.052
    assert abs(step["utilization"] - 1000 * t32 / 32) <= t32 / 10.0, step["utilization"]
    # 32 is the profile's largest batch: nothing extrapolated, nothing to warn of.
    assert not [w for w in result["warnings"] if "profile" in w], result["warnings"]


def test_without_a_profile_the_result_says_alpha_and_beta_were_given(tmp_path):
    import json

    from wok.__main__ import main

    path = tmp_path / "sim.json"
    assert main(["simulate", *BASE, "--json", str(path)]) == 0
    config = json.loads(path.read_text())["config"]
    assert (config["profile"], config["model"]["alpha_s"], config["model"]["beta_s"]) == (None, 0.0, 1e-3)


@pytest.mark.parametrize(
    ("given", "named"),
    [(["--alpha", "1ms"], "--alpha"), (["--beta", "1ms"], "--beta"), (["--alpha", "0ms", "--beta", "1ms"], None)],
)
def test_a_profile_and_alpha_or_beta_are_refused_together(given, named, capsys):
    """As `wok plan` and `wok tune` refuse them: which batch time the run meant cannot be told. --beta's former
    default (1ms) was given even when not asked for, so the refusal must tell a given one from it."""
    from wok.__main__ import main

    assert main(["simulate", *BASE, "--profile", str(PROFILE_MLP), *given]) == 2
    got = named or "--alpha and --beta"
    assert (
        capsys.readouterr().err
        == f"wok simulate: give --profile or --alpha/--beta, not both; got --profile and {got}\n"
    )


def test_a_profiles_negative_alpha_and_a_batch_past_its_sizes_are_warned_of(tmp_path, capsys):
    """As `wok tune` and `wok plan` warn of both: α below 0 taken as 0, and batches larger than any the profile
    measured, which run on the fit extrapolated."""
    import json

    from wok.__main__ import main

    profile = tmp_path / "profile.json"
    doc = {"schema": "wok.profile/1", "fit": {"alpha_s": -0.001, "beta_s": 0.001}, "batches": [{"batch_size": 8}]}
    profile.write_text(json.dumps(doc))
    path = tmp_path / "sim.json"
    argv = [*BASE, "--profile", str(profile), "--max-batch-size", "16", "--json", str(path)]
    assert main(["simulate", *argv]) == 0, capsys.readouterr().err
    result = json.loads(path.read_text())
    assert (result["config"]["model"]["alpha_s"], result["config"]["model"]["beta_s"]) == (0.0, 0.001)
    assert result["warnings"][:2] == [
        "the profile's fitted α = -1 ms is negative: the linear fit T = α + β·n does not hold at small batches; "
        "α is taken as 0, T(n) = β·n (as wok plan and wok tune take it)",
        "--max-batch-size 16 is past the largest batch the profile measured (8): batches of more than 8 run on the "
        "fit α + β·n extrapolated; profile batches of 16 to check it",
    ]


def test_without_max_batch_size_a_profile_gives_its_models_and_a_size_below_its_batches_is_warned_of(tmp_path, capsys):
    """`wok simulate --profile` simulated max_batch_size 1, no batching, for a model profiled at 32, unless told;
    and a --max-batch-size below the smallest batch the profile measured, whose batches all run on the fit
    extrapolated, went unsaid where one past the largest was warned of (`wok tune` and `wok plan` warn of both)."""
    import json

    from wok.__main__ import main

    path = tmp_path / "sim.json"
    assert main(["simulate", *BASE, "--profile", str(PROFILE_MLP), "--json", str(path)]) == 0
    err = capsys.readouterr().err
    result = json.loads(path.read_text())
    limit = json.loads(PROFILE_MLP.read_text())["model"]["max_batch_size"]
    config = result["config"]
    assert (config["model"]["max_batch_size"], config["max_batch_size_source"]) == (limit, "profile")
    assert (
        f"wok simulate: max_batch_size {limit}: the profile's model.max_batch_size (--max-batch-size to change)" in err
    )
    assert not [w for w in result["warnings"] if "profile" in w], result["warnings"]
    # Given, it is the command line's, and the profile's sizes (2 and 8 here) bound it on both sides.
    profile = tmp_path / "profile.json"
    doc = {"schema": "wok.profile/1", "fit": {"alpha_s": 0.001, "beta_s": 0.001}, "batches": [{"batch_size": 2}]}
    doc["batches"].append({"batch_size": 8})
    profile.write_text(json.dumps(doc))
    assert main(["simulate", *BASE, "--profile", str(profile), "--max-batch-size", "1", "--json", str(path)]) == 0
    assert "max_batch_size 1:" not in capsys.readouterr().err
    result = json.loads(path.read_text())
    assert result["config"]["max_batch_size_source"] == "given"
    assert result["warnings"][0] == (
        "--max-batch-size 1 is below the smallest batch the profile measured (2): every batch runs on the fit "
        "α + β·n extrapolated; profile batches of 1 to check it"
    )
    # A profile that names no model.max_batch_size (this one): 1, as without a profile, and said.
    assert main(["simulate", *BASE, "--profile", str(profile), "--json", str(path)]) == 0
    assert "wok simulate: max_batch_size 1: the profile names no model.max_batch_size (--max-batch-size to change)" in (
        capsys.readouterr().err
    )
    result = json.loads(path.read_text())
    assert (result["config"]["model"]["max_batch_size"], result["config"]["max_batch_size_source"]) == (1, "default")
    assert result["warnings"][0].startswith("max_batch_size 1 is below the smallest batch the profile measured (2)")


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"schema": "wok.bench/2"}, "expected schema 'wok.profile/1'; got 'wok.bench/2'"),
        ({"schema": "wok.profile/1", "fit": {"alpha_s": 0, "beta_s": 0}}, "fit.alpha_s and fit.beta_s: a batch needs"),
    ],
)
def test_a_profile_that_cannot_give_a_batch_time_is_refused_naming_it(doc, message, tmp_path, capsys):
    import json

    from wok.__main__ import main

    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps(doc))
    assert main(["simulate", *BASE, "--profile", str(profile)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"wok simulate: --profile {profile}: {message}"), err
