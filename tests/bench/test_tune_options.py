"""`wok tune`: option pairs and sizes refused up front, in the options' names, before any simulating."""

from __future__ import annotations

import json

import pytest

from wok.bench.tune import CpuStage, Profile, SearchConfig, cpu_document, profile_document, tune

# One setting whose ceiling is 1e6 QPS (a batch of 4 in 4 µs): a few seconds of it hold over 1e8 arrivals.
FAST = ["--alpha", "0ms", "--beta", "0.001ms", "--max-batch-sizes", "4", "--delays", "0ms", "--default", "none"]


@pytest.fixture
def no_simulating(monkeypatch):
    import wok.bench.tune as tune_module

    monkeypatch.setattr(tune_module, "max_qps", lambda *a, **k: pytest.fail("simulated before refusing"))


def test_a_search_too_large_to_simulate_is_refused_up_front_in_the_options_names(no_simulating, wok_cli):
    """It simulated the setting's 1 % step (2e7 arrivals, minutes) and was then refused at the first
    bisection step, in the simulator's words ("steps x (warmup_s + step_duration_s) ...")."""
    status, _, err = wok_cli("tune", "--slo-p99", "20ms", *FAST, "--sim-duration", "2000s")
    assert status == 2, err
    assert err == (
        "wok tune: --arrival poisson over --sim-warmup + --sim-duration (2001 s): at most 1e+08 arrivals per "
        "simulated step; got 1.99e+09 expected at 996133 QPS, the highest rate the search can try "
        "(max_batch_size 4, delay 0 ms, of --max-batch-sizes, --delays and --default: its ceiling by the "
        "α, β of --alpha/--beta is 1e+06 QPS); a shorter --sim-warmup + --sim-duration, or a grid with a lower "
        "ceiling, fits\n"
    ), err


def test_a_search_too_large_names_the_profile_when_the_fit_is_a_profiles(tmp_path, no_simulating, wok_cli):
    """With --alpha/--beta (above) the refusal said "the profile's α, β" too, though no profile was given."""
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps(profile_document({1: [1e-6, 1e-6], 4: [4e-6, 4e-6]}, "by hand")))
    grid = ["--max-batch-sizes", "4", "--delays", "0ms", "--default", "none", "--sim-duration", "2000s"]
    status, _, err = wok_cli("tune", "--slo-p99", "20ms", "--profile", str(profile), *grid)
    assert status == 2, err
    assert "its ceiling by the profile's α, β is 1e+06 QPS)" in err, err
    assert "--alpha/--beta" not in err, err


def test_a_dense_trace_is_refused_up_front_by_its_own_count(tmp_path, no_simulating, wok_cli):
    """A trace at its recorded pace offers its own count whatever the rate: 1e9 per second here."""
    trace = tmp_path / "dense.csv"
    trace.write_text("timestamp\n0\n0.000000001\n")
    slow = ["--alpha", "10ms", "--beta", "1ms", "--max-batch-sizes", "4", "--delays", "0ms", "--default", "none"]
    status, _, err = wok_cli("tune", "--slo-p99", "200ms", *slow, "--arrival", f"trace:{trace}", "--sim-duration", "1s")
    assert status == 2, err
    assert err.startswith(f"wok tune: --arrival trace:{trace} over --sim-warmup + --sim-duration (2 s): "), err
    assert "arrivals per simulated step; got " in err


def test_the_cap_counts_only_rates_the_search_can_reach(monkeypatch, wok_cli, tmp_path):
    """The bisection stops one halving short of the ceiling: with --iterations 0 only the 1 % step runs."""
    import wok.bench.tune as tune_module

    runs = []
    monkeypatch.setattr(tune_module, "max_qps", lambda model, *a, **k: runs.append(model) or {
        "max_qps": 0.0, "ceiling_qps": 1.0, "evaluations": 1,
        "step": {"latency_ms": {"p99": None, "p50": None}, "mean_batch_size": None, "utilization": None},
    })  # fmt: skip
    # At the ceiling, 1e6 QPS × 101 s = 1e8 + 1e6: over the cap; at its 1 % step, 1e6.
    status, _, err = wok_cli("tune", "--slo-p99", "20ms", *FAST, "--sim-duration", "100s", "--iterations", "0")
    assert len(runs) == 1 and status == 1, err  # searched (nothing passed: the stand-in's 0 QPS)


def test_the_library_refuses_before_simulating_too(no_simulating):
    search = SearchConfig(slo_p99_ms=20.0, duration_s=2000.0, warmup_s=1.0)
    with pytest.raises(ValueError, match=r"at most 1e\+08 arrivals per simulated step; got 1.99e\+09 expected"):
        tune(Profile(alpha_s=0.0, beta_s=1e-6), search, [4], [0.0], default=None)


def test_sampled_batch_times_beside_a_calibrations_batch_time_are_refused(tmp_path, no_simulating, wok_cli):
    """The calibration's batch time replaced the samples (inputs.batch_times "server",
    sampled_sizes []): --batch-times samples quietly did nothing."""
    profile, cpu = tmp_path / "profile.json", tmp_path / "cpu.json"
    profile.write_text(json.dumps(profile_document({1: [1.1e-3, 1.3e-3], 4: [1.9e-3, 2.1e-3]}, "by hand")))
    stage = CpuStage(cpu_in_s=1e-5, batch_alpha_s=0.5e-3, batch_beta_s=0.1e-3)
    cpu.write_text(json.dumps(cpu_document(stage, "hand")))
    status, _, err = wok_cli(
        "tune", "--slo-p99", "20ms", "--profile", str(profile), "--batch-times", "samples",
        "--cpu-calibration", str(cpu), "--max-batch-sizes", "4", "--delays", "0ms",
    )  # fmt: skip
    assert (status, err) == (
        2,
        f"wok tune: --batch-times samples with --cpu-calibration {cpu}: the calibration carries the server's own "
        "batch time, which replaces the profile's measured samples; give one\n",
    )


@pytest.mark.parametrize(
    ("sizes", "message"),
    [
        (",", "--max-batch-sizes: expected at least one batch size; got none"),
        ("0", "--max-batch-sizes: expected batch sizes ≥ 1; got 0"),
        ("4,-2", "--max-batch-sizes: expected batch sizes ≥ 1; got -2"),
    ],
)
def test_a_bad_grid_is_refused_in_the_searchs_words_before_its_size_is_checked(sizes, message, no_simulating, wok_cli):
    """The arrival-cap check ran first and failed on the grid in Python's or the model's words:
    'max() arg is an empty sequence', 'invalid batcher settings: max_batch_size=0, ...'; then in the
    search's, without the option or the value ('batch sizes must be ≥ 1 and delays ≥ 0')."""
    grid = ["--alpha", "0ms", "--beta", "0.1ms", "--default", "none", "--max-batch-sizes", sizes]
    status, _, err = wok_cli("tune", "--slo-p99", "20ms", *grid)
    assert (status, err) == (2, f"wok tune: {message}\n")


def test_wok_tune_checks_the_searchs_size_once(monkeypatch, wok_cli):
    """run_tune checked the busiest step, then tune() checked it again."""
    import wok.bench.tune as tune_module

    calls = []
    real = tune_module.busiest_step
    monkeypatch.setattr(tune_module, "busiest_step", lambda *a, **k: calls.append(a) or real(*a, **k))
    monkeypatch.setattr(tune_module, "max_qps", lambda model, *a, **k: {
        "max_qps": 0.0, "ceiling_qps": 1.0, "evaluations": 1,
        "step": {"latency_ms": {"p99": None, "p50": None}, "mean_batch_size": None, "utilization": None},
    })  # fmt: skip
    status, _, err = wok_cli("tune", "--slo-p99", "20ms", *FAST, "--sim-duration", "1s")
    assert (status, len(calls)) == (1, 1), err  # searched (the stand-in's 0 QPS meets nothing), checked once


def test_the_library_refuses_in_its_own_names_with_one_exception_class(no_simulating):
    """`check_fits` is the one check: tune() raises its SearchTooLarge, worded with tune()'s parameters."""
    import wok.bench.tune as tune_module

    search = SearchConfig(slo_p99_ms=20.0, duration_s=2000.0, warmup_s=1.0)
    with pytest.raises(tune_module.SearchTooLarge) as refused:
        tune(Profile(alpha_s=0.0, beta_s=1e-6), search, [4], [0.0], default=None)
    assert str(refused.value) == (
        "arrival poisson over warmup_s + duration_s (2001 s): at most 1e+08 arrivals per simulated step; got "
        "1.99e+09 expected at 996133 QPS, the highest rate the search can try (max_batch_size 4, delay 0 ms, of "
        "batch_sizes, delays_s and default: its ceiling by the profile's α, β is 1e+06 QPS); a shorter "
        "warmup_s + duration_s, or a grid with a lower ceiling, fits"
    )
    prof = Profile(alpha_s=0.0, beta_s=1e-6)
    for sizes, delays, message in (
        ([], [0.0], "batch_sizes: expected at least one batch size; got none"),
        ([4], [], "delays_s: expected at least one delay; got none"),
        ([4, 0], [0.0], "batch_sizes: expected batch sizes ≥ 1; got 0"),
        ([4], [0.0, -1e-3], "delays_s: expected delays ≥ 0; got -0.001 s"),
    ):
        with pytest.raises(ValueError) as refused:
            tune_module.check_fits(prof, search, sizes, delays, None)
        assert str(refused.value) == message
    # A caller's names for the grid ("SIZES, DELAYS and DEFAULT") name its parts.
    names = tune_module.SearchNames(grid="--sizes, --delays-ms and --default")
    with pytest.raises(ValueError, match=r"^--delays-ms: expected delays ≥ 0; got -0\.001 s$"):
        tune_module.check_fits(prof, search, [4], [-1e-3], None, names=names)


OVERHEAD = '{"schema": "wok.overhead/1", "samples_s": %s}'


@pytest.mark.parametrize(
    ("option", "text", "why"),
    [
        ("--profile", "[1, 2]", "expected a JSON object; got a list"),
        ("--overhead-samples", "[1, 2]", "expected a JSON object; got a list"),
        ("--cpu-calibration", '"hello"', "expected a JSON object; got a string ('hello')"),
        ("--cpu-calibration", "3", "expected a JSON object; got 3"),
        ("--profile", None, "No such file or directory"),
        ("--overhead-samples", None, "No such file or directory"),
        ("--cpu-calibration", None, "No such file or directory"),
        (
            "--profile",
            "{",
            "expected JSON; got Expecting property name enclosed in double quotes: line 1 column 2 (char 1)",
        ),
        ("--overhead-samples", OVERHEAD % "5", "samples_s: expected a list of seconds; got 5"),
        ("--overhead-samples", OVERHEAD % '["x"]', "samples_s: expected numbers of seconds; got a string ('x')"),
    ],
)
def test_a_file_that_holds_no_json_object_is_refused_naming_its_option(
    option, text, why, tmp_path, no_simulating, wok_cli
):
    """A list or a string was an AttributeError traceback, exit 1 ("'list' object has no attribute 'get'");
    a missing file said 'cannot read profile PATH: [Errno 2] …', not which option gave it."""
    path = tmp_path / "in.json"
    if text is not None:
        path.write_text(text)
    batch = [] if option == "--profile" else ["--alpha", "0.1ms", "--beta", "0.01ms"]
    status, _, err = wok_cli("tune", "--slo-p99", "20ms", *batch, option, str(path))
    assert (status, err) == (2, f"wok tune: {option} {path}: {why}\n")


def test_a_profile_with_a_negative_beta_is_refused_as_wok_plan_refuses_it(tmp_path, no_simulating, wok_cli):
    """tune clamped β < 0 to 0 silently, where `wok plan --profile` refuses the same file."""
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({"schema": "wok.profile/1", "fit": {"alpha_s": 0.002, "beta_s": -0.0001}}))
    status, _, err = wok_cli("tune", "--slo-p99", "20ms", "--profile", str(path))
    assert (status, err) == (2, f"wok tune: --profile {path}: fit.beta_s: β: expected a time >= 0 s; got -0.0001 s\n")


# A valid search of one setting, to which each case below adds one bad option.
ONE = ["--alpha", "1ms", "--beta", "1ms", "--max-batch-sizes", "4", "--delays", "1ms", "--default", "none"]


@pytest.mark.parametrize(
    ("option", "value", "shown", "hint"),
    [
        ("--slo-p99", "50", "50", "50ms or 0.05s"),
        ("--alpha", "1", "1", "1ms or 0.001s"),
        ("--beta", "0.5", "0.5", "0.5ms or 0.0005s"),
        ("--delays", "0ms,2", "2", "2ms or 0.002s"),
        ("--overhead", "1e-1", "1e-1", "0.1ms or 0.0001s"),
        ("--per-request-cpu", "0.23", "0.23", "0.23ms or 0.00023s"),
    ],
)
def test_a_latency_given_as_a_bare_number_is_refused(option, value, shown, hint, no_simulating, wok_cli):
    """A bare number is seconds to parse_duration: `--slo-p99 50` was a 50 s objective ("SLO P99 ≤
    50000 ms"), `--alpha 1` a batch time of 1 s, and tune searched on them, exit 0."""
    base = {"--slo-p99": "20ms", **dict(zip(ONE[::2], ONE[1::2]))}
    argv = [x for o, v in {**base, option: value}.items() for x in (o, v)]
    status, _, err = wok_cli("tune", *argv)
    message = f"wok tune: {option} '{shown}': give a unit, e.g. {hint} (a bare number would be seconds)\n"
    assert (status, err) == (2, message)


def test_a_default_delay_given_as_a_bare_number_is_refused_with_the_whole_setting(no_simulating, wok_cli):
    """It said "--default '5': give a unit, e.g. 5ms or 0.005s", naming the delay alone, not the setting."""
    status, _, err = wok_cli("tune", "--slo-p99", "20ms", *ONE[:-2], "--default", "32,5")
    message = (
        "wok tune: --default '32,5': give DELAY a unit, e.g. 32,5ms or 32,0.005s (a bare number would be seconds)\n"
    )
    assert (status, err) == (2, message)


def test_the_searchs_lengths_keep_bare_seconds(monkeypatch, wok_cli):
    """Not latencies: --sim-duration 2 is 2 s, as --step-duration is for `wok bench ramp`."""
    import wok.bench.tune as tune_module

    seen = []
    real = tune_module.max_qps
    monkeypatch.setattr(
        tune_module, "max_qps", lambda model, cfg, *a, **k: seen.append(cfg) or real(model, cfg, *a, **k)
    )
    status, _, err = wok_cli(
        "tune", "--slo-p99", "20ms", *ONE, "--iterations", "1", "--sim-duration", "2", "--sim-warmup", "0.5"
    )
    assert status == 0, err
    assert {(c.duration_s, c.warmup_s) for c in seen} == {(2.0, 0.5)}


PAST_51 = " (past 51 the bisection's interval holds no double between its ends)"


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--instances", "0", "--instances: expected an integer >= 1; got 0"),
        # Past 51 halvings the interval holds no double between its ends (tune.MAX_ITERATIONS): said of -1 too, that
        # reason read as why -1 was refused.
        ("--iterations", "-1", "--iterations: expected an integer from 0 to 51; got -1"),
        # It said "expected an integer ≤ 51", beside "expected an integer >= 0" for -1.
        ("--iterations", "52", f"--iterations: expected an integer from 0 to 51{PAST_51}; got 52"),
        # It was refused at the first simulated step, in the simulator's words: "seed must be >= 0; got -1".
        ("--seed", "-1", "--seed: expected an integer >= 0; got -1"),
        ("--tie", "2", "--tie: expected a number in [0, 1); got 2"),
        ("--tie", "-0.5", "--tie: expected a number in [0, 1); got -0.5"),
        ("--tie", "nan", "--tie: expected a number in [0, 1); got nan"),
    ],
)
def test_a_search_option_out_of_range_is_refused_alone_with_its_value(option, value, message, no_simulating, wok_cli):
    """Each was one sentence naming all three ranges, without the value given."""
    status, _, err = wok_cli("tune", "--slo-p99", "20ms", *ONE, option, value)
    assert (status, err) == (2, f"wok tune: {message}\n")


PROFILE_OF = {"schema": "wok.profile/1", "fit": {"alpha_s": 1e-3, "beta_s": 1e-4, "r2": 1.0}}


@pytest.mark.parametrize(
    ("samples", "args", "why"),
    [
        # Drawn from only with --batch-times samples: refused then by the simulator, as "batch_samples: size 1
        # needs n ≥ 1 and positive times", without the option, the file or the field.
        ([0.0], ("--batch-times", "samples"), "batches[0].samples_s: expected batch times > 0 s; got 0.0"),
        ([1e-3, -1e-3], (), "batches[0].samples_s: expected batch times > 0 s; got -0.001"),
        (1e-3, (), "batches[0].samples_s: expected a list of seconds; got 0.001"),
    ],
)
def test_a_profile_batch_time_of_zero_or_less_is_refused_naming_option_file_and_field(
    samples, args, why, tmp_path, no_simulating, wok_cli
):
    path = tmp_path / "p.json"
    path.write_text(json.dumps({**PROFILE_OF, "batches": [{"batch_size": 1, "samples_s": samples}]}))
    status, _, err = wok_cli("tune", "--slo-p99", "20ms", "--profile", str(path), *args)
    assert (status, err) == (2, f"wok tune: --profile {path}: {why}\n")


def test_batch_times_samples_from_a_profile_without_samples_is_refused(tmp_path, no_simulating, wok_cli):
    """Every samples_s empty (or missing): the search ran on the fit without a word, inputs.batch_times "fit"."""
    path = tmp_path / "p.json"
    path.write_text(json.dumps({**PROFILE_OF, "batches": [{"batch_size": 1, "samples_s": []}, {"batch_size": 4}]}))
    status, _, err = wok_cli("tune", "--slo-p99", "20ms", "--profile", str(path), "--batch-times", "samples")
    assert (status, err) == (
        2,
        f"wok tune: --batch-times samples: --profile {path} holds no measured batch times (every "
        "batches[i].samples_s is missing or empty)\n",
    )


@pytest.mark.parametrize(
    ("text", "why"),
    [
        # Both were "expected a wok.overhead/1 document with samples_s", of a document that had one.
        (OVERHEAD % "[]", "samples_s: expected a list of seconds, at least one; got an empty list"),
        ('{"schema": "wok.overhead/1"}', "samples_s: expected a list of seconds, at least one; got none"),
        ('{"schema": "wok.profile/1", "samples_s": [0.001]}', "expected schema 'wok.overhead/1'; got 'wok.profile/1'"),
    ],
)
def test_an_overhead_file_without_samples_says_which_field_and_what_it_got(text, why, tmp_path, no_simulating, wok_cli):
    path = tmp_path / "o.json"
    path.write_text(text)
    status, _, err = wok_cli("tune", "--slo-p99", "20ms", *ONE, "--overhead-samples", str(path))
    assert (status, err) == (2, f"wok tune: --overhead-samples {path}: {why}\n")


@pytest.mark.parametrize(
    ("points", "why"),
    [
        # The KeyError tracebacks: overhead_by_rate read p["offered_qps"] and p["outside_histogram"] as they came.
        (
            [{"offered_qps": 1000.0}],
            "outside_by_rate[0].outside_histogram: expected a latency histogram of at least one request; got none",
        ),
        ([{"outside_histogram": {}}], "outside_by_rate[0].offered_qps: expected a finite rate ≥ 0; got none"),
        (
            [{"offered_qps": 1000.0, "outside_histogram": {"unit": "ns"}}],
            "outside_by_rate[0].outside_histogram: expected a latency histogram; no sub_bucket_bits",
        ),
        (
            [{"offered_qps": "1000", "outside_histogram": {}}],
            "outside_by_rate[0].offered_qps: expected a finite rate ≥ 0; got a string ('1000')",
        ),
        ({"offered_qps": 1000.0}, "outside_by_rate: expected a list of loads; got an object"),
        ([3], "outside_by_rate[0]: expected an object; got 3"),
    ],
)
def test_a_calibrations_outside_by_rate_that_cannot_be_read_is_refused_with_one_line(
    points, why, tmp_path, no_simulating, wok_cli
):
    path = tmp_path / "cpu.json"
    path.write_text(json.dumps({**cpu_document(CpuStage(), "by hand"), "outside_by_rate": points}))
    status, _, err = wok_cli("tune", "--slo-p99", "20ms", *ONE, "--cpu-calibration", str(path))
    assert (status, err) == (2, f"wok tune: --cpu-calibration {path}: {why}\n")


def test_a_load_that_measured_no_request_is_refused_not_an_index_error():
    from wok.bench.histogram import LatencyHistogram
    from wok.bench.tune import overhead_by_rate

    empty = LatencyHistogram.from_ms([]).to_dict()
    doc = {"outside_by_rate": [{"offered_qps": 1000.0, "outside_histogram": empty}]}
    with pytest.raises(ValueError) as refused:
        overhead_by_rate(doc, CpuStage(), "cal.json")
    assert str(refused.value) == (
        "cal.json: outside_by_rate[0].outside_histogram: expected a latency histogram of at least one request; "
        "got an empty histogram"
    )


def test_batch_times_too_short_for_a_float_ceiling_are_refused_before_simulating(no_simulating, wok_cli):
    """n / 1e-320 s overflows to inf: the search's rates were NaN, refused as 'qps must be a finite rate >= 0;
    got nan'."""
    args = ["--alpha", "1e-320s", "--beta", "0s", "--max-batch-sizes", "4", "--delays", "1ms", "--default", "none"]
    status, _, err = wok_cli("tune", "--slo-p99", "20ms", *args)
    assert (status, err) == (
        2,
        "wok tune: max_batch_size 4, delay 1 ms: its ceiling n / E[T(n)] by the α, β of --alpha/--beta is beyond a "
        "float: batch times this short cannot be simulated\n",
    )
