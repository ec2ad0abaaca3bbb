"""bench/cli.py: where `--metrics-url auto` looks for the server's /metrics, option checks, --token-file."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from wok.bench.cli import _metrics_url


@pytest.mark.parametrize(
    "target", ["127.0.0.1:1,127.0.0.1:2", "dns:///wok-headless.wok.svc.cluster.local:8001", "ipv4:127.0.0.1:1"]
)
def test_auto_scrapes_nothing_for_several_servers(target):
    assert _metrics_url("auto", target) is None


def test_explicit_and_none_are_taken_as_given():
    assert _metrics_url("http://127.0.0.1:9/metrics", "a:1,b:2") == "http://127.0.0.1:9/metrics"
    assert _metrics_url("none", "127.0.0.1:1") is None


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            ["--start-at", "soon"],
            "wok bench: --start-at: expected a Unix time in seconds, e.g. $(date +%s); got 'soon'",
        ),
        (["--start-at", "1900000000", "--refine", "2"], "wok bench: start_at does not go with refine"),
        (["--start-at", "1900000000", "--replicas", "2"], "wok bench: --start-at is for plain ramps"),
        (["--host-probe", "2s", "--replicas", "2"], "wok bench: --host-probe is for plain ramps"),
        (["--host-probe=-1s"], "wok bench: --host-probe: invalid duration '-1s': expected a number >= 0"),
    ],
)
def test_mistaken_options_exit_2_naming_the_option(extra, message, capsys):
    from wok.__main__ import main

    # Refused before anything connects: the target need not exist (with --replicas there is none).
    target = [] if "--replicas" in extra else ["--target", "127.0.0.1:1"]
    assert main(["bench", "ramp", *target, *extra]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--replicas", "1", "--target", "127.0.0.1:1"], "--target with --replicas: the bench ramps the replicas"),
        (["--replicas", "1", "--admin-url", "http://127.0.0.1:9"], "--admin-url with --replicas"),
        (["--serve-args", "--models mlp"], "--serve-args is for --replicas: without it no server is started"),
        (["--replica-host", "::1"], "--replica-host is for --replicas: without it no server is started"),
        (["--admin-url", "http://127.0.0.1:9"], "--admin-url is where --fault slow:/fail: go; no --fault"),
        (["--workers", "0"], "--workers: expected an integer >= 1; got 0"),
        (["--stop-factor", "0"], "--stop-factor: expected a number > 0 (inf: no stop by P99 or success rate); got 0"),
        (
            ["--stop-factor", "nan"],
            "--stop-factor: expected a number > 0 (inf: no stop by P99 or success rate); got nan",
        ),
        (["--hedge-after", "50ms"], "--hedge-after is the wok balancer's: it does nothing with --balancer grpc"),
        # Two replicas are two targets: the wok balancer unless told, which has no trailers to read.
        (["--replicas", "2", "--server-timing"], "not with --rpc stream or --balancer wok (the default for several"),
    ],
)
def test_options_that_would_be_ignored_together_are_refused(argv, message, capsys):
    """Each used to be ignored (the run went elsewhere than asked, or did not do what was asked),
    or, for --server-timing with replicas, refused only after starting them, in a worker's words."""
    from wok.__main__ import main

    assert main(["bench", "ramp", *argv]) == 2
    assert message in capsys.readouterr().err


TARGET = "--target '{}': expected HOST:PORT (several: HOST:PORT,HOST:PORT or dns:///NAME:PORT)"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--arrival", "bogus"], "--arrival: arrivals 'bogus': unknown process 'bogus'; expected constant, poisson"),
        (
            ["--arrival", "trace:{missing}"],
            "--arrival: arrivals 'trace:{missing}': cannot read {missing}: No such file",
        ),
        (["--arrival", "trace:{tmp}"], "--arrival: arrivals 'trace:{tmp}': cannot read {tmp}: Is a directory"),
        (
            ["--arrival", "burst:t0=1s,sigma=0"],
            "--arrival: arrivals 'burst:t0=1s,sigma=0': sigma: expected a duration > 0 s",
        ),
        (["--steps", "1e9"], "at most 1e+08 arrivals per step; got 1.1e+09 expected at 1e+09 QPS over 1.1 s"),
        (["--steps", "1", "--arrival", "trace:{tiny}"], "with --arrival trace:{tiny}: at most 1e+08 arrivals per step"),
        (
            ["--steps", "100", "--arrival", "burst:amplitude=1e12,sigma=1ms"],
            "at most 1e+08 arrivals per step; got 2.51e+09 expected at 100 QPS over 1.1 s",
        ),
        (["--step-duration", "0"], "--step-duration: expected a finite duration > 0; got '0'"),
        (["--step-duration", "2x"], "--step-duration: invalid duration '2x'"),
        (["--warmup", "2x"], "--warmup: invalid duration '2x'"),
        (["--timeout", "2x"], "--timeout: invalid duration '2x'"),
        (["--slo-p99", "fast"], "--slo-p99: invalid duration 'fast'"),
        (["--step-gap", "soon"], "--step-gap: invalid duration 'soon'"),
        (["--steps", "50,fast"], "--steps: QPS steps '50,fast': 'fast' is not a number"),
        (["--steps", "50,0"], "--steps: QPS steps '50,0': step 2: expected a number > 0; got 0"),
        # An OverflowError traceback (stop / start is inf).
        (["--steps", "1e-300:1e300:2"], "--steps: QPS range '1e-300:1e300:2': 1994 steps; at most 1000"),
        (["--arrival", "burst:sigma=1e999s"], "--arrival: arrivals 'burst:sigma=1e999s': sigma: expected a finite"),
        (["--warmup", "1e400"], "--warmup: expected a finite duration or a percentage of --step-duration; got '1e400'"),
        (["--sizes", "fixed:x"], "--sizes: sizes 'fixed:x': expected fixed:N with N an integer >= 0; got 'x'"),
        (["--seed", "-1"], "--seed: expected an integer >= 0; got -1"),
        # Refused by the payload generator after connecting: exit 1 (UNAVAILABLE) against a dead port.
        (["--rows", "0"], "--rows: expected an integer >= 1; got 0"),
        (["--int-high", "-3"], "--int-high: expected an integer >= 1; got -3"),
        # A soak's one step drew its whole schedule after connecting: a numpy MemoryError traceback.
        (["--soak", "1e12", "--capacity", "10"], "--soak 1e12 at 80% of --capacity 10: at most 1e+08 arrivals"),
        (["--soak", "1000h", "--steps", "1000"], "--soak 1000h at 80% of the highest step (1000 QPS offered)"),
        # Soak durations did not name their option; an infinite one was taken.
        (["--soak", "1e400", "--capacity", "10"], "--soak: expected a finite duration > 0; got '1e400'"),
        (["--soak", "1s", "--soak-window", "fast", "--capacity", "10"], "--soak-window: invalid duration 'fast'"),
        (
            ["--soak", "1s", "--rss-every", "1e400", "--capacity", "10"],
            "--rss-every: expected a finite duration > 0; got '1e400'",
        ),
        # One window shorter than asked: the report's P99 drift was `-` or 0, without a word.
        (["--soak", "2s", "--soak-window", "5s", "--capacity", "10"], "--soak-window 5s is longer than --soak 2s"),
        # A bare number is seconds: --slo-p99 50 was a 50 s objective that every step passed.
        (["--slo-p99", "50"], "--slo-p99 '50': give a unit, e.g. 50ms or 0.05s (a bare number would be seconds)"),
        (["--slo-p99", "0.5"], "--slo-p99 '0.5': give a unit, e.g. 0.5ms or 0.0005s"),
        (["--hedge-after", "30", "--balancer", "wok"], "--hedge-after '30': give a unit, e.g. 30ms or 0.03s"),
        # \d took every script's digits, and float() read them: "٣" was a bare 3, "٣%" a 3 % warm-up.
        (["--slo-p99", "٣"], "--slo-p99: invalid duration '٣': expected a number >= 0 with an optional unit"),
        (["--warmup", "٣%"], "--warmup: invalid duration '٣%': expected a number >= 0 with an optional unit"),
        # An infinite delay is no hedging (off says it): the balancer refuses it, in each worker.
        (["--hedge-after", "1e400s", "--balancer", "wok"], "--hedge-after '1e400s': expected a finite duration > 0"),
        # Without a port gRPC dialled 443; a URL doubled its scheme in --metrics-url auto's URL.
        (["--target", "127.0.0.1"], TARGET.format("127.0.0.1")),
        (["--target", "localhost"], TARGET.format("localhost")),
        (["--target", "::1"], TARGET.format("::1")),
        (["--target", "[::1]"], TARGET.format("[::1]")),
        (["--target", "127.0.0.1:0"], TARGET.format("127.0.0.1:0")),
        (["--target", "127.0.0.1:1,"], TARGET.format("127.0.0.1:1,")),
        (["--target", "127.0.0.1:1,127.0.0.2"], TARGET.format("127.0.0.1:1,127.0.0.2")),
        (["--target", "http://127.0.0.1:8001"], TARGET.format("http://127.0.0.1:8001") + " (no URL scheme"),
    ],
)
def test_ramp_options_are_refused_before_anything_connects_naming_the_option(
    argv, message, tmp_path, monkeypatch, wok_cli
):
    """`--arrival` was first read by the ramp, after connecting: against a dead port `--arrival bogus`
    exited 1 (UNAVAILABLE), a missing trace 1; `--steps 1e9` or a trace of a 1 ns span ended in a
    MemoryError traceback; `--step-duration 0` failed mid-run; duration and step errors did not
    name their option."""
    from wok.bench import runner

    def work(*args, **kwargs):
        raise AssertionError("the ramp ran: the options were not checked first")

    # The method, not the name: faults and soak subclass runner.Ramp when first imported, so with
    # the name replaced (this test run alone, `-k refused_before`) they failed with a TypeError.
    monkeypatch.setattr(runner.Ramp, "__init__", work)
    tiny = tmp_path / "tiny.csv"
    tiny.write_text("timestamp\n0\n0.000000001\n")  # 1 ns apart: 1e9 QPS at scale 1
    names = {"missing": tmp_path / "missing.csv", "tiny": tiny, "tmp": tmp_path}
    argv = [a.format(**names) for a in argv]
    status, _, err = wok_cli("bench", "ramp", "--target", "127.0.0.1:1", "--metrics-url", "none",
                             "--step-duration", "1s", *argv)  # fmt: skip
    assert status == 2 and err.startswith("wok bench: ") and message.format(**names) in err, err


@pytest.mark.parametrize(
    "target",
    [
        "127.0.0.1:8001",
        "localhost:8001",
        "[::1]:8001",
        "127.0.0.1:1,127.0.0.1:2",
        "a.example:1, [::1]:2",
        "dns:///wok-headless.wok.svc.cluster.local:8001",
        "dns:wok:8001",
        "ipv4:127.0.0.1:1,127.0.0.1:2",
        "unix:/run/wok.sock",
    ],
)
def test_every_target_the_clients_read_is_accepted(target):
    from wok.bench.cli import _check_target

    assert _check_target(target) == target
    assert _check_target(f" {target} ") == target  # as gRPC took it


@pytest.mark.parametrize("option", ["--slo-p99", "--hedge-after"])
def test_a_bare_zero_is_zero_in_any_unit(option):
    from wok.bench.cli import _with_unit

    assert _with_unit(option, "0") == "0"
    assert _with_unit(option, "0.0") == "0.0"


def _ramp_config(monkeypatch, wok_cli, *argv: str):
    """The RampConfig `wok bench ramp ARGV` would run (the ramp itself not run)."""
    from wok.bench import runner

    got = []

    def run(self):
        raise KeyboardInterrupt  # nothing measured: exit 130

    # Methods of the real class, so a module first imported here subclasses the real Ramp.
    monkeypatch.setattr(runner.Ramp, "__init__", lambda self, cfg, *a, **k: got.append(cfg))
    monkeypatch.setattr(runner.Ramp, "run", run)
    status, _, err = wok_cli("bench", "ramp", "--target", "127.0.0.1:1", "--metrics-url", "none", *argv)
    assert status == 130 and len(got) == 1, err
    return got[0]


@pytest.mark.parametrize(
    ("argv", "warmup_s"),
    [
        ([], 0.3),
        (["--warmup", "10%"], 0.3),
        (["--warmup", "50 %"], 1.5),
        (["--warmup", "0.5s"], 0.5),
        (["--warmup", "0"], 0),
    ],
)
def test_warmup_takes_a_share_of_the_step_as_its_help_says(argv, warmup_s, monkeypatch, wok_cli):
    """The help said "(default 10%, ≤30 s)", and --warmup 10% was refused as an invalid duration."""
    cfg = _ramp_config(monkeypatch, wok_cli, "--step-duration", "3s", *argv)
    assert cfg.warmup_s == pytest.approx(warmup_s)


def test_latencies_with_a_unit_are_taken(monkeypatch, wok_cli):
    cfg = _ramp_config(monkeypatch, wok_cli, "--step-duration", "1s", "--slo-p99", "0.05s", "--balancer", "wok",
                       "--hedge-after", "30ms")  # fmt: skip
    assert (cfg.slo_p99_ms, cfg.hedge_after) == (pytest.approx(50.0), pytest.approx(0.03))


def test_every_ramp_option_says_its_default():
    """--model, --steps, --arrival, --sizes, --metrics-url, --stop-factor, --refine and --knee-threshold
    did not say theirs, and --seed had no help at all."""
    import argparse

    from wok.bench.cli import add_parser

    sub = argparse.ArgumentParser().add_subparsers()
    add_parser(sub)
    ramp = next(a for a in sub.choices["bench"]._actions if isinstance(a, argparse._SubParsersAction)).choices["ramp"]
    formatter = ramp._get_formatter()
    named = ["--model", "--steps", "--arrival", "--sizes", "--metrics-url", "--stop-factor", "--refine"]
    named += ["--knee-threshold", "--seed", "--step-gap", "--step-duration", "--warmup", "--slo-p99", "--timeout"]
    helps = {a.option_strings[0]: formatter._expand_help(a) for a in ramp._actions if a.option_strings and a.help}
    assert [o for o in named if "default" not in helps.get(o, "")] == []
    assert "(default 0)" in helps["--seed"] and "(default 0: none)" in helps["--refine"]


def test_a_bursts_progress_line_says_the_rate_it_offers(server_process, tmp_path, wok_cli):
    """The line said "step 1/1: 20 QPS offered" (the --steps value) while the step's JSON reported
    the window's rate, about 40 QPS for this burst (10 requests more in its 0.5 s)."""
    out = tmp_path / "r.json"
    argv = ["bench", "ramp", "--target", server_process.target, "--steps", "20", "--step-duration", "0.5s"]
    argv += ["--warmup", "0.1s", "--workers", "1", "--metrics-url", "none", "--json", str(out)]
    status, stdout, err = wok_cli(*argv, "--arrival", "burst:amplitude=4x,t0=0.35s,sigma=0.05s")
    assert status == 0, err
    (step,) = json.loads(out.read_text())["steps"]
    assert step["nominal_qps"] == 20 and step["offered_qps"] > 30
    line = f"step 1/1: {step['offered_qps']:g} QPS offered (nominal 20) for 0.5 s (+0.1 s warm-up)"
    assert line in stdout + err


FIRST_TOKEN, SECOND_TOKEN = "tok-A-1b0c4ee6a1f94c8a8d1e", "tok-B-9f21d7c3e5a64b0f9c2a"


@pytest.fixture(scope="module")
def token_server(start_server_module, tmp_path_factory):
    """A server whose token file lists two tokens on a line (a rotation), and that file: the token
    tests' one server (each start is seconds); they only send it calls, and change nothing in it."""
    tokens = tmp_path_factory.mktemp("tokens") / "tokens"
    tokens.write_text(f"# the rotation: new, old\n{FIRST_TOKEN},{SECOND_TOKEN}\n")
    return start_server_module("--models", "mlp", "--torch-threads", "1", "--auth-token-file", str(tokens)), tokens


def test_token_file_sends_the_first_token_of_the_servers_own_file(token_server, tmp_path, capsys, monkeypatch):
    """The server's token file may list several tokens on a line (a rotation); the bench sent the
    whole line "A,B" as one token, and the server refused it (exit 1). Likewise the server's own
    variable, with --token-env."""
    from wok.__main__ import main

    first, second = FIRST_TOKEN, SECOND_TOKEN
    server, tokens = token_server
    out = tmp_path / "r.json"
    argv = ["bench", "ramp", "--target", server.target, "--steps", "20", "--step-duration", "0.5s", "--warmup", "0.1s"]
    argv += ["--workers", "1", "--metrics-url", "none", "--token-file", str(tokens), "--json", str(out)]
    assert main(argv) == 0, capsys.readouterr().err
    result = json.loads(out.read_text())
    assert result["steps"][0]["success_rate"] == 1.0 and result["config"]["token"] is True
    assert first not in out.read_text()
    monkeypatch.setenv("WOK_TEST_TOKENS", f"{first},{second}")
    by_env = [*argv[:-4], "--token-env", "WOK_TEST_TOKENS", "--json", str(out)]
    assert main(by_env) == 0, capsys.readouterr().err
    assert json.loads(out.read_text())["steps"][0]["success_rate"] == 1.0
    empty = tmp_path / "empty"
    empty.write_text("# nothing but a comment\n")
    assert main([*argv[:-4], "--token-file", str(empty)]) == 2
    assert f"--token-file {empty} holds no token" in capsys.readouterr().err


def test_a_token_refused_names_the_bench_option_that_sends_one(token_server, tmp_path, capsys, monkeypatch):
    """The server's UNAUTHENTICATED names the metadata to send ('authorization: Bearer <token>'),
    which a bench user cannot send but through --token-file or --token-env: the line says which
    option sent the token refused, or that none was given."""
    from wok.__main__ import main

    wrong = tmp_path / "wrong"
    wrong.write_text("tok-W-70d2a9c4b8e14f6a9d3b\n")  # neither of the server's two
    server, _ = token_server
    argv = ["bench", "ramp", "--target", server.target, "--steps", "20", "--step-duration", "0.5s", "--warmup", "0.1s"]
    argv += ["--workers", "1", "--metrics-url", "none"]
    monkeypatch.setenv("WOK_TEST_WRONG_TOKEN", "tok-W-70d2a9c4b8e14f6a9d3b")
    cases = [
        ([], "(the bench sent no token: give the server's with --token-file PATH or --token-env VAR)"),
        (
            ["--token-file", str(wrong)],
            f"(the bench sent the first token of --token-file {wrong}: the server does not accept it)",
        ),
        (
            ["--token-env", "WOK_TEST_WRONG_TOKEN"],
            "(the bench sent the first token of --token-env WOK_TEST_WRONG_TOKEN: the server does not accept it)",
        ),
    ]
    for options, hint in cases:
        assert main([*argv, *options]) == 1
        last = capsys.readouterr().err.splitlines()[-1]
        assert last.startswith("wok bench: UNAUTHENTICATED: ") and last.endswith(hint), (options, last)
        assert "tok-W-" not in last  # the token itself is never printed


# The work each command does once its options are read: a test that reaches it failed to refuse first.
WORK = {
    "tune": ("wok.bench.tune", "tune"),
    "plan": ("wok.bench.plan", "build_plan"),
    "simulate": ("wok.bench.simulate", "simulate_ramp"),
    "bench": ("wok.bench.runner", "Ramp"),
    "profile": ("wok.models", "build_demo"),
}
COMMAND = {
    "tune": ["tune", "--slo-p99", "50ms", "--alpha", "0.25ms", "--beta", "0.044ms"],
    "plan": ["plan", "--peak-qps", "100", "--t-batch", "20ms", "--batch-size", "16"],
    "simulate": ["simulate", "--steps", "100", "--step-duration", "1s"],
    "bench": ["bench", "ramp", "--target", "127.0.0.1:1", "--metrics-url", "none"],
    "profile": ["profile", "mlp"],
}


@pytest.mark.parametrize(
    ("command", "option", "path", "why"),
    [
        ("tune", "--write-config", "{missing}/x.toml", "folder {missing} does not exist"),
        ("tune", "--json", "{missing}/x.json", "folder {missing} does not exist"),
        ("tune", "--json", "{tmp}", "is a folder; expected a file name"),
        ("plan", "--json", "{missing}/p.json", "folder {missing} does not exist"),
        ("plan", "--markdown", "{file}/p.md", "{file} is not a folder"),
        ("plan", "--manifests", "{file}/k8s", "{file} is not a folder"),
        ("plan", "--manifests", "{file}", "is not a folder"),
        ("simulate", "--json", "{missing}/x.json", "folder {missing} does not exist"),
        ("simulate", "--plot", "{file}/plots", "{file} is not a folder"),
        ("bench", "--csv", "{missing}/x.csv", "folder {missing} does not exist"),
        ("bench", "--html", "{tmp}", "is a folder; expected a file name"),
        ("profile", "--plot", "{missing}/p.png", "folder {missing} does not exist"),
    ],
)
def test_an_output_that_cannot_be_written_is_refused_before_any_work(
    command, option, path, why, tmp_path, monkeypatch, wok_cli
):
    """Each crashed with a traceback (exit 1) when it came to write: `wok tune` after its whole grid
    search, `wok bench ramp` after the ramp."""
    import importlib

    module, name = WORK[command]

    def work(*args, **kwargs):
        raise AssertionError(f"{module}.{name} ran: the output path was not checked first")

    monkeypatch.setattr(importlib.import_module(module), name, work)
    (tmp_path / "file").write_text("")
    names = {"missing": tmp_path / "missing", "file": tmp_path / "file", "tmp": tmp_path}
    path, why = path.format(**names), why.format(**names)
    status, _, err = wok_cli(*COMMAND[command], option, path)
    assert (status, err) == (2, f"wok {command}: {option} {path}: {why}\n")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["tune", "--slo-p99", "-50ms", "--alpha", "1ms", "--beta", "1ms"], "invalid duration '-50ms'"),
        (["simulate", "--step-duration", "-1s"], "invalid duration '-1s'"),
        (["plan", "--peak-qps", "100", "--t-batch", "-20ms", "--batch-size", "16"], "--t-batch"),
        (["plan", "--peak-qps", "-1.5e3", "--t-batch", "20ms", "--batch-size", "16"], "got -1500"),
        (["bench", "ramp", "--target", "127.0.0.1:1", "--host-probe", "-1s"], "invalid duration '-1s'"),
        (["bench", "merge", "x.json", "--json", "-1"], "x.json"),  # a plain negative stays a value, as before
    ],
)
def test_a_negative_value_with_a_unit_reaches_the_options_own_check(argv, message, wok_cli):
    """argparse took "-50ms" for an option and answered "expected one argument"; only "--slo-p99=-50ms"
    reached the duration check. The `wok` parser (server/__main__.py's _Parser) passes such a value on
    as --opt=VALUE, for every subcommand."""
    status, _, err = wok_cli(*argv)
    assert status == 2 and err.startswith(f"wok {argv[0]}: ") and message in err, err


def test_an_option_after_an_option_is_still_an_option(wok_cli):
    status, _, err = wok_cli("tune", "--slo-p99", "--alpha", "1ms")
    assert status == 2 and "--slo-p99: expected one argument" in err


def test_a_json_write_that_fails_after_the_ramp_keeps_the_result_in_a_temporary_file(
    server_process, tmp_path, monkeypatch, wok_cli
):
    """The up-front check passed, then --json's folder went away during the run (as a disk fills):
    everything measured was lost, and the run ended in an option error (exit 2)."""
    import tempfile

    from wok.bench import runner

    folder, temp = tmp_path / "out", tmp_path / "temp"
    folder.mkdir()
    temp.mkdir()
    measure = runner.Ramp.run

    def measure_then_lose_the_folder(self):
        result = measure(self)
        folder.rmdir()
        return result

    monkeypatch.setattr(runner.Ramp, "run", measure_then_lose_the_folder)
    monkeypatch.setattr(tempfile, "tempdir", str(temp))  # the system's temp folder, for this test
    path = folder / "r.json"
    argv = ["bench", "ramp", "--target", server_process.target, "--steps", "20", "--step-duration", "0.5s"]
    status, _, err = wok_cli(*argv, "--warmup", "0.1s", "--workers", "1", "--metrics-url", "none", "--json", str(path))
    (kept,) = temp.glob("wok-bench-*")
    assert (status, err.splitlines()[-1]) == (
        1,
        f"wok bench: --json {path}: No such file or directory; the result is kept in {kept} instead",
    )
    result = json.loads(kept.read_text())
    assert result["schema"] == "wok.bench/2" and [s["offered_qps"] for s in result["steps"]] == [20]


def test_the_bench_and_planning_commands_start_without_importing_torch():
    """`wok` builds every subcommand's parser on each run; the demo's page server imports the
    server's admin routes and so torch (~2 s of a bench child's ~3 s start), which `wok bench`,
    `simulate`, `plan` and `tune` never use."""
    code = (
        "import sys\n"
        "import wok.__main__ as m\n"
        "for cmd in ('bench', 'simulate', 'plan', 'tune', 'demo'):\n"
        "    sys.argv = ['wok', cmd, '--help']\n"
        "    try:\n"
        "        m.main()\n"
        "    except SystemExit:\n"
        "        pass\n"
        "print('torch' in sys.modules, file=sys.stderr)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stderr.strip().splitlines()[-1] == "False", r.stderr


@pytest.mark.parametrize("model", ["nope", "mlp:0.5,nope:0.5"])
def test_a_model_the_target_does_not_serve_is_a_bad_option(bench_server, model, capsys):
    """Refused with its metadata before the first step, it exited 1, a failed target's status (docs/
    bench.md: 2 when the options make requests the server cannot take, NOT_FOUND among them)."""
    from wok.__main__ import main

    argv = ["--target", bench_server.target, "--model", model, "--metrics-url", "none", "--steps", "10"]
    assert main(["bench", "ramp", *argv, "--step-duration", "1s"]) == 2
    err = capsys.readouterr().err
    assert f"wok bench: --model '{model}': NOT_FOUND: unknown model 'nope'" in err, err


def test_every_option_of_every_command_but_serve_says_its_default():
    """`wok simulate` said none of its defaults (--max-batch-size 1: no batching unless given), and
    tune, profile and plan left some out. `wok serve`'s: tests/server/test_main_options.py."""
    import argparse

    from wok.bench import cli as bench_cli
    from wok.demo.cli import add_demo_parser

    wok = argparse.ArgumentParser(prog="wok")
    sub = wok.add_subparsers()
    for register in bench_cli.COMMANDS:
        register(sub)
    add_demo_parser(sub)

    def options(parser, name):
        for a in parser._actions:
            if isinstance(a, argparse._SubParsersAction):
                for command, p in a.choices.items():
                    yield from options(p, f"{name} {command}")
            elif a.option_strings and a.dest != "help":
                yield name, parser, a

    missing = []
    for name, parser, a in options(wok, "wok"):
        if a.default is None or a.default is False or a.default == []:  # leaving it out is the help's to say
            continue
        shown = f"{a.default:g}" if isinstance(a.default, float) else str(a.default)
        helped = parser._get_formatter()._expand_help(a) if a.help else ""
        if "default" not in helped or shown.lower() not in helped.lower():  # as tests/server's rule
            missing.append(f"{name} {a.option_strings[0]} (default {shown}): {helped!r}")
    assert not missing, "\n".join(missing)


LONG = "x" * 100_000
LONG_SHOWN = f"'{'x' * 200}'… (100,000 characters in all)"
DURATION = "expected a number >= 0 with an optional unit ms, s, m or h (e.g. '250ms', '30s', '5m', '1.5h')"


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        # RampConfig's check named its field, not the option, and took -1 and NaN as their text.
        *(
            (["--start-at", v], f"--start-at: expected a Unix time in seconds, e.g. $(date +%s); got '{v}'")
            for v in ("nan", "inf", "-1", "1e999")
        ),
        # Each was taken: "" for the default target and no token, -1 for no refinement, NaN for no knee
        # (and NaN in the JSON), a NaN --require-qps for a run that always passes.
        (["--target", ""], "--target '': expected HOST:PORT (several: HOST:PORT,HOST:PORT or dns:///NAME:PORT)"),
        (["--token-env", ""], "--token-env: environment variable '' is not set, or holds no token"),
        (["--refine", "-1"], "--refine: expected an integer >= 0; got -1"),
        *(
            (
                ["--knee-threshold", v],
                f"--knee-threshold: expected a ratio Δachieved/Δoffered above 0 and at most 1; got {v}",
            )
            # NaN found no knee; at or below 0 a flat throughput was no knee, above 1 one that kept up was.
            for v in ("nan", "-0.5", "0", "1.5")
        ),
        (["--require-qps", "nan"], "--require-qps: expected a finite number; got nan"),
        (["--require-qps", "inf"], "--require-qps: expected a finite number; got inf"),
        # Scraped at every step, nothing ever answering, after a warning.
        (["--metrics-url", ""], "--metrics-url '': expected auto, none or a URL such as http://HOST:8002/metrics"),
        (
            ["--metrics-url", "127.0.0.1:8002/metrics"],
            "--metrics-url '127.0.0.1:8002/metrics': expected auto, none or a URL such as http://HOST:8002/metrics",
        ),
        # Taken, and refused (or worse, posted somewhere) only when the fault's time came, the ramp half run.
        *(
            (
                ["--fault", "slow:model=mlp,at=1s,delay=5ms", "--admin-url", url],
                f"--admin-url '{url}': expected the admin API's URL, http://HOST:METRICS-PORT of a wok serve --admin",
            )
            for url in (
                "",
                "127.0.0.1:8002",
                "ftp://127.0.0.1:8002",
                "http://:8002",
                "http://127.0.0.1:99999",
                "http://127.0.0.1:0",
                "http://127.0.0.1:8002/?x=1",
                "http://[::1:8002",
            )
        ),
        # A port past 65535 was scraped at every step, nothing ever answering, after a warning.
        (
            ["--metrics-url", "http://127.0.0.1:80020/metrics"],
            "--metrics-url 'http://127.0.0.1:80020/metrics': expected auto, none or a URL such as "
            "http://HOST:8002/metrics",
        ),
        # Named no option: "cannot read PATH", "invalid duration 'soon'" alone.
        (["--tls-ca", "{missing}"], "--tls-ca {missing}: No such file or directory"),
        (["--hedge-after", "soon"], f"--hedge-after: invalid duration 'soon': {DURATION}"),
        (
            ["--fault", "slow:model=mlp,at=1s,delay=soon", "--admin-url", "http://127.0.0.1:9"],
            f"--fault 'slow:model=mlp,at=1s,delay=soon': delay: invalid duration 'soon': {DURATION}",
        ),
        # Refused after --metrics-url was scraped, and a line about it.
        (
            ["--fault", "bogus", "--metrics-url", "http://127.0.0.1:1/metrics"],
            "--fault 'bogus': expected kill:, pause:, slow: or fail:; got 'bogus'",
        ),
        (
            ["--soak", "soon", "--metrics-url", "http://127.0.0.1:1/metrics"],
            f"--soak: invalid duration 'soon': {DURATION}",
        ),
        # Shown whole, twice: a 200 KB refusal.
        (["--steps", LONG], f"--steps: QPS steps {LONG_SHOWN}: {LONG_SHOWN} is not a number"),
        (["--step-duration", LONG], f"--step-duration: invalid duration {LONG_SHOWN}: {DURATION}"),
        (
            ["--sizes", LONG],
            f"--sizes: sizes {LONG_SHOWN}: unknown distribution {LONG_SHOWN}; expected fixed:N, uniform:LO:HI, "
            "lognormal:median=M,sigma=S,max=N or empirical:PATH",
        ),
        (
            ["--target", LONG],
            f"--target {LONG_SHOWN}: expected HOST:PORT (several: HOST:PORT,HOST:PORT or dns:///NAME:PORT)",
        ),
        (
            ["--fault", f"kill:at=\x1b[2J{LONG}"],
            f"--fault 'kill:at=\\x1b[2J{'x' * 188}'… (100,012 characters in all): at='\\x1b[2J{'x' * 196}'… "
            "(100,004 characters in all): expected a percentage of the ramp (30%) or a time from its start (12s)",
        ),
    ],
)
def test_a_bad_value_is_refused_in_one_line_naming_its_option(argv, line, tmp_path, monkeypatch, wok_cli):
    from wok.bench import runner

    def work(*args, **kwargs):
        raise AssertionError("the ramp ran: the options were not checked first")

    monkeypatch.setattr(runner.Ramp, "__init__", work)
    argv = [a.format(missing=tmp_path / "missing.pem") for a in argv]
    status, out, err = wok_cli("bench", "ramp", "--target", "127.0.0.1:1", "--metrics-url", "none",
                               "--step-duration", "1s", *argv)  # fmt: skip
    assert (status, out, err) == (2, "", f"wok bench: {line.format(missing=tmp_path / 'missing.pem')}\n")


def test_serve_args_a_shell_cannot_split_are_refused_naming_the_option(monkeypatch, wok_cli):
    """shlex's refusal came alone: "wok bench: No closing quotation"."""
    from wok.bench import faults

    def start(*args, **kwargs):
        raise AssertionError("a replica was started")

    monkeypatch.setattr(faults.ReplicaSet, "__init__", start)
    argv = ["bench", "ramp", "--replicas", "1", "--serve-args", "--models 'mlp", "--metrics-url", "none"]
    assert wok_cli(*argv)[::2] == (2, "wok bench: --serve-args '--models 'mlp': No closing quotation\n")


def test_a_path_in_a_refusal_is_still_one_bounded_line_and_keeps_its_reason(wok_cli):
    """A path is shown as given, not quoted as a name: the whole message is cut, and what is not
    printable in it escaped, where `wok` prints it: one line of at most errors.MESSAGE_CHARS (this
    one was 100 KB, its newline splitting it, and named no option: "cannot read PATH"). Cut in its
    middle, where the path is: cut at its end, it lost the OS's reason (File name too long)."""
    from wok.errors import MESSAGE_CHARS

    path = LONG + "\n"
    status, _, err = wok_cli("bench", "ramp", "--target", "127.0.0.1:1", "--metrics-url", "none", "--tls-ca", path)
    assert status == 2 and err.count("\n") == 1 and err.startswith(f"wok bench: --tls-ca {'x' * 100}"), err[:100]
    assert len(err) <= len("wok bench: ") + MESSAGE_CHARS + 60, len(err)
    assert re.search(r"x… \([\d,]+ characters in all\) …x+\\n: File name too long\n$", err), err[-80:]


@pytest.mark.parametrize(
    ("argv", "start"),
    [
        (("bench", "ramp", "--json"), "wok bench: --json /"),
        (("bench", "merge"), "wok bench: /"),
        (("simulate", "--json"), "wok simulate: --json /"),
        (("tune", "--slo-p99", "5ms", "--profile"), "wok tune: --profile /"),
        (("bench", "ramp", "--target", "127.0.0.1:1", "--metrics-url", "none", "--arrival"), "wok bench: --arrival: "),
    ],
    ids=["ramp-json", "merge", "simulate-json", "tune-profile", "ramp-trace"],
)
def test_a_path_too_long_keeps_the_os_reason_whole(argv, start, tmp_path, wok_cli):
    """A path of 5,000 characters in a folder of 300: the refusal was cut at its end, inside the path."""
    from wok.errors import MESSAGE_CHARS

    path = str(tmp_path / ("d" * 300) / ("p" * 5000))
    value = f"trace:{path}" if argv[-1] == "--arrival" else path
    status, out, err = wok_cli(*argv, value)
    assert (status, out) == (2, ""), err[-300:]
    assert err.startswith(start) and err.count("\n") == 1, err[:200]
    assert len(err) <= len(start) + MESSAGE_CHARS + 60, len(err)
    assert re.search(r"p… \([\d,]+ characters in all\) …p+\S*:? [^…]*File name too long", err), err[-300:]


def _no_replica(monkeypatch):
    from wok.bench import faults

    def start(*args, **kwargs):
        raise AssertionError("a replica was started")

    monkeypatch.setattr(faults.ReplicaSet, "__init__", start)


@pytest.mark.parametrize(
    ("serve_args", "reason"),
    [
        ("--bogus", "unrecognized arguments: '--bogus'"),
        ("--grace-period soon", "--grace-period: expected a number; got 'soon'"),
        ("--models nope", "--models: unknown demo model 'nope'; known: mlp, recsys, encoder"),
        ("--models mlp --demo-option mlp.bogus=1", "--demo-option 'mlp.bogus=1': demo model 'mlp' has no option"),
        ("--cpu-linear mkl", "--cpu-linear: invalid choice: 'mkl' (choose from 'onednn', 'torch')"),
        ("--tls-key {missing}", "--tls-key: {missing} does not exist"),
        # The bench's own: two replicas on one port, the second failing to bind.
        ("--port 8001", "--port is not to be given: each replica is started with --port 0"),
        ("--metrics-port=-1", "--metrics-port is not to be given: each replica is started with --metrics-port 0"),
        ("--help", "-h/--help prints wok serve's help and exits: no replica would serve"),
    ],
    ids=["unknown", "value", "model", "demo-option", "choice", "file", "port", "metrics-port", "help"],
)
def test_serve_args_that_wok_serve_refuses_are_refused_before_any_replica_starts(
    serve_args, reason, tmp_path, monkeypatch, wok_cli
):
    """Each replica exited 2 at once, and the bench with 1 and the child's usage (or its one line),
    in no option's name."""
    _no_replica(monkeypatch)
    missing = str(tmp_path / "missing.pem")
    serve_args, reason = serve_args.format(missing=missing), reason.format(missing=missing)
    argv = ["bench", "ramp", "--replicas", "2", f"--serve-args={serve_args}", "--metrics-url", "none"]
    status, out, err = wok_cli(*argv)
    assert (status, out) == (2, ""), err
    assert err.startswith(f"wok bench: --serve-args '{serve_args}': wok serve refuses it: {reason}"), err
    assert err.count("\n") == 1, err


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (
            ["--replica-host", "192.0.2.2"],
            "--replica-host '192.0.2.2': expected a loopback address, such as 127.0.0.1 or ::1",
        ),
        (["--replica-host", "0.0.0.0"], "--replica-host '0.0.0.0': expected a loopback address"),
        (["--replica-host", "localhost"], "--replica-host 'localhost': expected a loopback address"),
        # The replicas' --host is the bench's to give: the refusal names the option that gives another.
        (
            ["--serve-args", "--models mlp --host ::1"],
            "--serve-args '--models mlp --host ::1': wok serve refuses it: --host is not to be given: each replica "
            "is started with --host 127.0.0.1 (give --replica-host for another loopback address)",
        ),
        (
            ["--replica-host", "[::1]", "--serve-args", "--models mlp --host ::1"],
            "each replica is started with --host ::1 (give --replica-host",
        ),
    ],
    ids=["not-loopback", "wildcard", "name", "host-in-serve-args", "host-in-serve-args-ipv6"],
)
def test_replica_hosts_are_refused_before_any_replica_starts(args, says, monkeypatch, wok_cli):
    _no_replica(monkeypatch)
    status, out, err = wok_cli("bench", "ramp", "--replicas", "2", "--metrics-url", "none", *args)
    assert (status, out) == (2, ""), err
    assert says in err and err.count("\n") == 1, err


def test_a_mix_whose_models_wok_serve_refuses_names_model_before_any_replica_starts(monkeypatch, wok_cli):
    """Without --serve-args the replicas serve the mix's models: --model is the option to blame."""
    _no_replica(monkeypatch)
    status, out, err = wok_cli("bench", "ramp", "--replicas", "1", "--model", "nope", "--metrics-url", "none")
    assert (status, out) == (2, ""), err
    assert err == (
        "wok bench: --model 'nope': the replicas serve its models (wok serve --models nope), which wok serve "
        "refuses: --models: unknown demo model 'nope'; known: mlp, recsys, encoder\n"
    )


def test_an_empty_plan_model_is_refused_not_taken_for_the_default(wok_cli):
    """`--model ""` (a variable left empty) planned, and wrote manifests, for mlp."""
    status, _, err = wok_cli("plan", "--peak-qps", "100", "--t-batch", "10ms", "--batch-size", "8", "--model", "")
    assert (status, err) == (
        2,
        "wok plan: --model: model '': letters, digits, '_', '.', '-' only (it goes into PromQL)\n",
    )


def _wok_parser():
    import argparse

    from wok.bench import cli as bench_cli

    wok = argparse.ArgumentParser(prog="wok")
    sub = wok.add_subparsers()
    for register in bench_cli.COMMANDS:
        register(sub)
    return wok, sub


def _command(sub, *names: str):
    import argparse

    parser = sub.choices[names[0]]
    for name in names[1:]:
        parser = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[name]
    return parser


def _option(parser, option: str):
    return next(a for a in parser._actions if option in a.option_strings)


def test_a_ramp_says_how_long_it_will_run_before_its_first_step(bench_server, wok_cli):
    """Nothing said how long a ramp would take: with the defaults (4 steps of 5 min) it ran 22 min,
    and only the first step's progress line hinted at it."""
    argv = ["bench", "ramp", "--target", bench_server.target, "--steps", "20,40", "--step-duration", "0.5s"]
    status, _, err = wok_cli(*argv, "--warmup", "0.1s", "--workers", "1", "--metrics-url", "none")
    assert status == 0, err
    line = (
        "wok bench: planned: 2 steps × (0.1 s warm-up + 0.5 s) = 1.2 s (less if a step ends the ramp: --stop-factor, "
        "or no request OK)"
    )
    assert line in err.splitlines(), err
    assert err.index(line) < err.index("step 1/2"), err


def test_the_default_ramp_takes_minutes_and_its_help_says_how_many(monkeypatch, wok_cli):
    """A step lasted 5 min by default: 22 min for the default ramp, said nowhere."""
    cfg = _ramp_config(monkeypatch, wok_cli)
    assert (cfg.steps, cfg.step_duration_s, cfg.warmup_s) == ([50, 100, 200, 400], 60.0, 6.0)
    _, sub = _wok_parser()
    ramp = _command(sub, "bench", "ramp")
    helped = ramp._get_formatter()._expand_help(_option(ramp, "--step-duration"))
    assert "the default ramp takes 4 steps × (6 s warm-up + 1 min) = 4 min 24 s" in helped, helped


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(45, "45 s"), (264, "4 min 24 s"), (3600, "1 h"), (3601, "1 h"), (3661, "1 h 1 min"), (7259, "2 h")],
)
def test_a_planned_length_past_an_hour_is_said_to_the_minute(seconds, text):
    """The first two units that were not 0: 3,601 s read "1 h 1 s", 7,259 s "2 h 59 s"."""
    from wok.bench.cli import _duration_text

    assert _duration_text(seconds) == text


def test_ramp_and_simulate_share_one_default_ramp():
    """`wok simulate` ("the same ramp, simulated") stepped 300,600,900 QPS by default, the ramp 50,100,200,400."""
    from wok.bench.cli import DEFAULT_STEPS

    _, sub = _wok_parser()
    defaults = {name: _option(_command(sub, *name.split()), "--steps").default for name in ("bench ramp", "simulate")}
    assert defaults == {"bench ramp": DEFAULT_STEPS, "simulate": DEFAULT_STEPS}


@pytest.mark.parametrize("command", ["bench ramp", "bench merge", "simulate", "profile"])
def test_plot_is_the_one_spelling_shown_and_plots_still_works(command):
    """`wok bench ramp`, `merge` and `simulate` took --plots, `wok profile` --plot: the other spelling
    was refused as an unknown option."""
    _, sub = _wok_parser()
    parser = _command(sub, *command.split())
    shown = parser.format_help()
    assert "--plot " in shown and "--plots" not in shown, shown
    positional = {"bench merge": ["r.json"], "profile": ["mlp"]}.get(command, [])
    for spelling in ("--plot", "--plots"):
        assert parser.parse_args([*positional, spelling, "out"]).plot == Path("out")


def test_simulate_draws_its_plots_with_either_spelling(tmp_path, wok_cli):
    for spelling in ("--plot", "--plots"):
        folder = tmp_path / spelling.strip("-")
        status, _, err = wok_cli("simulate", "--steps", "100", "--step-duration", "1s", spelling, str(folder))
        assert status == 0, err
        assert sorted(p.name for p in folder.iterdir()) == ["latency_vs_offered.png", "throughput.png", "timeline.png"]
        assert f"wok simulate: wrote {folder} (--plot)" in err


def test_profile_takes_plots_for_its_plot_file(tmp_path, wok_cli):
    """--plots was refused by `wok profile` (unrecognized arguments); it is --plot's file now."""
    missing = tmp_path / "missing"
    status, _, err = wok_cli("profile", "mlp", "--plots", f"{missing}/p.png")
    assert (status, err) == (2, f"wok profile: --plot {missing}/p.png: folder {missing} does not exist\n")


@pytest.mark.parametrize("name", ["tune_check", "slo_compare"])
def test_the_scripts_with_a_plot_take_plots_too(name, tmp_path, capsys):
    import importlib

    missing = tmp_path / "missing"
    with pytest.raises(SystemExit) as exited:
        importlib.import_module(f"wok.bench.{name}").main(["--plots", f"{missing}/p.png"])
    assert exited.value.code == 2
    assert f"error: --plot {missing}/p.png: folder {missing} does not exist\n" in capsys.readouterr().err


def test_one_default_bound_for_integer_inputs_and_profiles_own_is_explained():
    """The bench's 50 was written out in four places (the ramp's option, RampConfig, the payload
    generator, the profiler's fallback), and `wok profile`'s help did not say why its default differs."""
    import inspect

    from wok.bench import payloads, profiler, runner

    _, sub = _wok_parser()
    ramp, profile = _command(sub, "bench", "ramp"), _command(sub, "profile")
    # Not given (None): each integer input below the bound its server publishes, the others below the default.
    assert _option(ramp, "--int-high").default is None
    assert f"the others below {payloads.DEFAULT_INT_HIGH}" in ramp._get_formatter()._expand_help(
        _option(ramp, "--int-high")
    )
    assert runner.RampConfig.__dataclass_fields__["int_high"].default == payloads.DEFAULT_INT_HIGH
    assert inspect.signature(payloads.PayloadGenerator).parameters["int_high"].default == payloads.DEFAULT_INT_HIGH
    assert profiler.DEFAULT_INT_HIGH is payloads.DEFAULT_INT_HIGH
    helped = profile._get_formatter()._expand_help(_option(profile, "--int-high"))
    assert "wok bench ramp's: each input below the bound its server publishes" in helped


@pytest.mark.parametrize(
    ("raw", "sent"),
    [
        # PowerShell 5's Out-File / Set-Content -Encoding UTF8: a BOM, CRLF. Its first line was no comment, and the
        # bench sent "\ufeff#" (read in the locale's encoding, the server refusing the file for its U+FEFF).
        ("\ufeff# the rotation: new, old\r\ntok-A-1b0c4ee6a1f94c8a8d1e,tok-B-9f21d7c3e5a64b0f9c2a\r\n", "tok-A"),
        ("\ufefftok-B-9f21d7c3e5a64b0f9c2a\n", "tok-B"),
    ],
    ids=["bom-comment", "bom-token"],
)
def test_token_file_is_read_as_the_server_reads_it(tmp_path, raw, sent):
    import argparse

    from wok.auth import load_tokens
    from wok.bench.cli import _security

    tokens = tmp_path / "tokens"
    tokens.write_bytes(raw.encode("utf-8"))
    args = argparse.Namespace(tls_ca=None, tls_cert=None, tls_key=None, tls=False, token_file=tokens, token_env=None)
    _, token = _security(args)
    assert token.startswith(sent) and token == load_tokens(tokens)[0]
    tokens.write_bytes(b"tok-\xff-not-utf-8-text\n")
    with pytest.raises(ValueError) as info:
        _security(args)
    assert str(info.value) == f"--token-file {tokens} is not UTF-8 text (invalid start byte at byte 4, line 1)"
