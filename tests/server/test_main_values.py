"""Option values on the `wok` command line, for every subcommand (server/__main__.py's _Parser).

argparse took a value that begins with '-' and is not a plain negative number (`--slo -5ms`,
`--port -5x`) for an option: the option had no value ("expected one argument"), and its own
check, which `--slo=-5ms` reached, never ran. And a value argparse refused itself (`--port abc`)
came after the whole usage, where the commands' own refusals are one line.

What matters is the exit status and the words on stderr: `wok serve`'s in `wok` processes of their
own, the other commands' in this process (`wok_cli`: the same main(), which refuses before it starts
anything, without a child's seconds of imports each, 19 of this module's 35 runs)."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.fixture
def wok(wok_cli):
    """`wok(*argv)` → (returncode, stdout, stderr) of `wok ARGV`: in a `python -m wok` child for
    `serve` and for no command (wok_cli runs neither), else in this process."""

    def run(*argv: str) -> subprocess.CompletedProcess:
        if argv[:1] in ((), ("serve",)):
            return subprocess.run([sys.executable, "-m", "wok", *argv], capture_output=True, text=True, timeout=60)
        return subprocess.CompletedProcess(argv, *wok_cli(*argv))

    return run


@pytest.mark.parametrize(
    ("argv", "refusal"),
    [
        (("demo", "--slo", "-5ms"), "wok demo: --slo: invalid duration '-5ms': expected a number >= 0"),
        (
            ("demo", "--max-queue-delay", "-1ms"),
            "wok demo: --max-queue-delay: invalid duration '-1ms': expected a number >= 0",
        ),
        (("demo", "--alpha", "-1ms"), "wok demo: --alpha: invalid duration '-1ms': expected a number >= 0"),
        # Abbreviated, as argparse allows: the value is still the option's.
        (("demo", "--sl", "-5ms"), "wok demo: --slo: invalid duration '-5ms': expected a number >= 0"),
        (("serve", "--port", "-5x"), "wok serve: --port: expected an integer; got '-5x'"),
        (("serve", "--grace-period", "-.5s"), "wok serve: --grace-period: expected a number; got '-.5s'"),
        (("simulate", "--arrival", "-1x"), "wok simulate: --arrival: arrivals '-1x': unknown process '-1x'"),
        # Another script's digit is still a number's beginning, not an option's: refused by the option's
        # check, which says why ("expected one argument" with _DASH_NUMBER's \d made ASCII alone).
        (
            ("serve", "--grace-period", "-\N{ARABIC-INDIC DIGIT THREE}ms"),
            "wok serve: --grace-period: expected a number; got '-\N{ARABIC-INDIC DIGIT THREE}ms' (numbers are read "
            "in ASCII: the digits 0-9)",
        ),
    ],
    ids=[
        "demo-slo",
        "demo-delay",
        "demo-alpha",
        "demo-abbreviated",
        "serve-port",
        "serve-float",
        "simulate",
        "serve-other-digits",
    ],
)
def test_a_value_beginning_with_a_dash_is_refused_as_the_same_value_after_an_equals_sign(argv, refusal, wok):
    *command, option, value = argv
    spaced, joined = wok(*argv), wok(*command, f"{option}={value}")
    assert (spaced.returncode, spaced.stderr) == (joined.returncode, joined.stderr)
    assert spaced.returncode == 2
    assert len(spaced.stderr.splitlines()) == 1 and spaced.stderr.startswith(refusal), spaced.stderr


@pytest.mark.parametrize(
    ("argv", "refusal"),
    [
        (("bench", "ramp", "--json", "--steps", "100"), "wok bench: --json: expected one argument"),
        (("demo", "--slo", "--simulate"), "wok demo: --slo: expected one argument"),
        (("demo", "--slo", "--sim"), "wok demo: --slo: expected one argument"),  # --simulate, abbreviated
        (("serve", "--models", "--port=0"), "wok serve: --models: expected one argument"),
        (("serve", "--host", "-h"), "wok serve: --host: expected one argument"),
        # A mistyped option is no value: not a file named --stpes.
        (("bench", "ramp", "--json", "--stpes", "100"), "wok bench: --json: expected one argument"),
        (("serve", "--host", "-x"), "wok serve: --host: expected one argument"),
    ],
    ids=[
        "bench-json",
        "demo-slo",
        "demo-abbreviated",
        "serve-with-value",
        "serve-help",
        "bench-typo",
        "serve-dash-word",
    ],
)
def test_an_option_after_an_option_that_takes_a_value_is_still_an_option(argv, refusal, wok):
    done = wok(*argv)
    assert (done.returncode, done.stdout, done.stderr) == (2, "", refusal + "\n")


@pytest.mark.parametrize(
    ("argv", "refusal"),
    [
        (("serve", "--port", "abc"), "wok serve: --port: expected an integer; got 'abc'"),
        (("serve", "--port=abc"), "wok serve: --port: expected an integer; got 'abc'"),
        (("serve", "--grace-period", "soon"), "wok serve: --grace-period: expected a number; got 'soon'"),
        (
            ("serve", "--cpu-linear", "mkl"),
            "wok serve: --cpu-linear: invalid choice: 'mkl' (choose from 'onednn', 'torch')",
        ),
        (("serve", "--port"), "wok serve: --port: expected one argument"),
        (("demo", "--rate", "fast"), "wok demo: --rate: expected a number; got 'fast'"),
        (("bench", "ramp", "--workers", "two"), "wok bench: --workers: expected an integer; got 'two'"),
    ],
    ids=["serve-port", "serve-port=", "serve-float", "serve-choice", "serve-missing", "demo-float", "bench-int"],
)
def test_a_value_argparse_refuses_is_one_line_naming_the_option(argv, refusal, wok):
    done = wok(*argv)
    assert (done.returncode, done.stdout, done.stderr) == (2, "", refusal + "\n")


def test_a_bench_subcommands_refusals_have_one_prefix_whoever_refused(wok):
    """argparse's refusal of a `wok bench ramp` option said `wok bench ramp:`, the bench's own check
    of the same option `wok bench:` (main's ValueError): now both the latter."""
    by_argparse, by_bench = wok("bench", "ramp", "--rows", "abc"), wok("bench", "ramp", "--rows", "0")
    assert (by_argparse.returncode, by_argparse.stderr) == (2, "wok bench: --rows: expected an integer; got 'abc'\n")
    assert (by_bench.returncode, by_bench.stderr) == (2, "wok bench: --rows: expected an integer >= 1; got 0\n")


def test_the_usage_stays_with_help_and_with_a_missing_or_unknown_command(wok):
    """Only an option's refused value lost the usage before its line."""
    assert wok("serve", "--port", "abc").stderr == "wok serve: --port: expected an integer; got 'abc'\n"
    shown = wok("serve", "--help")
    assert (shown.returncode, shown.stderr) == (0, "") and shown.stdout.startswith("usage: wok serve [-h]")
    assert "--port PORT" in shown.stdout
    for argv, error in [
        ((), "wok: error: the following arguments are required: command"),
        (("bench", "bogus"), "wok bench: error: argument bench_command: invalid choice: 'bogus'"),
    ]:
        done = wok(*argv)
        assert done.returncode == 2 and done.stderr.startswith(f"usage: {' '.join(('wok', *argv[:1]))} ")
        assert done.stderr.splitlines()[-1].startswith(error), done.stderr


@pytest.mark.parametrize("argv", [("bench", "ramp"), ("bench", "merge", "a.json"), ("demo",), ("plan",)])
def test_an_unknown_option_is_refused_with_its_commands_usage_not_the_top_ones(argv, wok_cli):
    """argparse refused words no parser took with `wok`'s usage, every command listed
    (`usage: wok [-h] {serve,bench,...}`), whichever command was given."""
    status, out, err = wok_cli(*argv, "--bogus", "x")
    command = " ".join(a for a in argv if not a.endswith(".json"))
    assert (status, out) == (2, "")
    assert err.startswith(f"usage: wok {command} [-h]"), err
    assert err.endswith(f"wok {command}: error: unrecognized arguments: '--bogus' 'x'\n"), err


def test_an_unknown_option_of_wok_serve_is_refused_with_its_usage(wok):
    done = wok("serve", "--bogus")
    assert done.returncode == 2 and done.stderr.startswith("usage: wok serve [-h]"), done.stderr
    assert done.stderr.endswith("wok serve: error: unrecognized arguments: '--bogus'\n")


# User text in a refusal is shown as names are everywhere (errors.quoted_name): quoted, escaped, cut
# at 200 characters. argparse showed a refused value whole (repr), and the words it did not take as
# they were given: a 100,000-character value made a 100 KB refusal, a newline split it, a terminal
# escape reached the terminal.
LONG = "x" * 100_000
LONG_SHOWN = f"'{'x' * 200}'… (100,000 characters in all)"


@pytest.mark.parametrize(
    ("argv", "refusal"),
    [
        (("bench", "ramp", "--rows", LONG), f"wok bench: --rows: expected an integer; got {LONG_SHOWN}"),
        (("demo", "--rate", LONG), f"wok demo: --rate: expected a number; got {LONG_SHOWN}"),
        (
            ("bench", "ramp", "--rpc", LONG),
            f"wok bench: --rpc: invalid choice: {LONG_SHOWN} (choose from 'unary', 'stream')",
        ),
        (("serve", "--port", LONG), f"wok serve: --port: expected an integer; got {LONG_SHOWN}"),
        # As repr writes it, whole: the 100 KB refusal was cut at 4,096 characters (its list of the
        # models known lost).
        (
            ("serve", "--models", LONG, "--port", "0", "--metrics-port", "-1"),
            f"wok: --models: unknown demo model {LONG_SHOWN}; known: mlp, recsys, encoder",
        ),
        # check_demo_name's: as repr writes it, whole.
        (("profile", LONG), f"wok profile: unknown demo model {LONG_SHOWN}; known: mlp, recsys, encoder"),
    ],
    ids=["bench-int", "demo-float", "bench-choice", "serve-int", "serve-models", "profile-model"],
)
def test_a_long_refused_value_is_shown_cut_as_names_are(argv, refusal, wok):
    done = wok(*argv)
    assert (done.returncode, done.stdout, done.stderr) == (2, "", refusal + "\n")


@pytest.mark.parametrize(
    ("word", "shown"),
    [("a\nb", r"'a\nb'"), ("\x1b[31mred", r"'\x1b[31mred'"), (LONG, LONG_SHOWN)],
    ids=["newline", "escape", "long"],
)
def test_words_no_option_took_are_quoted_escaped_and_cut(word, shown, wok_cli):
    status, out, err = wok_cli("bench", "ramp", word)
    assert (status, out) == (2, "")
    assert err.endswith(f"wok bench ramp: error: unrecognized arguments: {shown}\n"), err[-300:]
    assert len(err.splitlines()[-1]) < 400


def test_a_command_not_offered_is_shown_cut(wok_cli):
    status, _, err = wok_cli("bench", LONG)
    assert status == 2
    refusal = f"wok bench: error: argument bench_command: invalid choice: {LONG_SHOWN} (choose from 'ramp', 'merge')"
    assert err.splitlines()[-1] == refusal


def test_an_empty_path_is_refused_not_taken_for_the_working_directory(wok_cli, tmp_path, monkeypatch):
    """Path("") is ".": `--plot ""` (a variable left empty) drew the plots into the working
    directory, `--json ""` was refused as "--json .: is a folder"."""
    monkeypatch.chdir(tmp_path)
    status, _, err = wok_cli("simulate", "--steps", "10", "--step-duration", "1s", "--plot", "")
    assert (status, err) == (2, "wok simulate: --plot: expected a path; got ''\n")
    assert list(tmp_path.iterdir()) == []
    assert wok_cli("bench", "ramp", "--json", "")[::2] == (2, "wok bench: --json: expected a path; got ''\n")


@pytest.mark.parametrize(
    ("argv", "refusal"),
    [
        (("--port", "-1"), "wok: --port: expected >= 0; got -1"),
        (("--grace-period", "nan"), "wok: --grace-period: expected a finite number; got nan"),
        (
            ("--max-connection-age-grace", "5"),
            "wok: --max-connection-age-grace needs --max-connection-age: there is no age to be graceful at",
        ),
        # Taken: the bind failed after the models had loaded, exit 1.
        (("--host", "a\nb"), r"wok: --host: expected an address or a host name; got 'a\nb'"),
        (("--host", LONG), f"wok: --host: expected an address or a host name; got {LONG_SHOWN}"),
    ],
    ids=["field", "finite", "several-fields", "host-newline", "host-long"],
)
def test_a_server_setting_refused_names_the_option_that_gave_it(argv, refusal, wok):
    """It named the settings' field: "wok: server settings: grpc_port: ..." for `--port -1`. Refused
    before the models load: with a model that does not exist, the test cannot load one."""
    done = wok("serve", *argv, "--metrics-port", "-1", "--models", "nosuch")
    assert (done.returncode, done.stderr) == (2, refusal + "\n")


@pytest.mark.parametrize(
    ("argv", "start"),
    [
        (("serve", "--tls-cert", LONG), "wok: --tls-cert: xxx"),
        (("serve", "--model-repository", LONG), "wok: model repository xxx"),
        (("profile", "mlp", "--model-repository", LONG), "wok profile: model repository xxx"),
    ],
    ids=["serve-tls-cert", "serve-repository", "profile-repository"],
)
def test_a_path_too_long_for_the_file_system_is_refused_not_a_traceback(argv, start, wok):
    """A stat that fails otherwise than "no such file" (ENAMETOOLONG) raised out of the checks: an
    OSError traceback, exit 1. Now a refusal, one line cut to errors.MESSAGE_CHARS."""
    from wok.errors import MESSAGE_CHARS

    extra = ("--metrics-port", "-1", "--models", "nosuch") if argv[:2] == ("serve", "--tls-cert") else ()
    done = wok(*argv, *extra)
    assert done.returncode == 2, done.stderr[-500:]
    assert done.stderr.count("\n") == 1 and done.stderr.startswith(start), done.stderr[:200]
    assert len(done.stderr) < MESSAGE_CHARS + 100


NOTE = " (numbers are read in ASCII: the digits 0-9)"

# int() and float() read every script's digits: `--port ٣` served on port 3, `--steps ٣,٤` ramped.
NUMBER_CASES = [
    # `--models nope` stops a serve whose number passed (it was read as 3) before it starts.
    (("serve", "--port", "٣", "--models", "nope"), f"wok serve: --port: expected an integer; got '٣'{NOTE}"),
    (
        ("serve", "--grace-period", "３.５", "--models", "nope"),
        f"wok serve: --grace-period: expected a number; got '３.５'{NOTE}",
    ),
    (
        ("serve", "--demo-option", "mlp.hidden=٣", "--models", "mlp", "--grace-period", "-1"),
        f"wok: --demo-option 'mlp.hidden=٣': option 'hidden' of demo model 'mlp': expected an integer; got '٣'{NOTE}",
    ),
    (("serve", "--port", "\u00a03", "--models", "nope"), rf"wok serve: --port: expected an integer; got '\xa03'{NOTE}"),
    (("bench", "ramp", "--workers", "٢"), f"wok bench: --workers: expected an integer; got '٢'{NOTE}"),
    (
        ("bench", "ramp", "--steps", "٣,٤", "--target", "127.0.0.1:1"),
        f"wok bench: --steps: QPS steps '٣,٤': '٣' is not a number{NOTE}",
    ),
    (
        ("bench", "ramp", "--steps", "١:٨:٢", "--target", "127.0.0.1:1"),
        f"wok bench: --steps: QPS range '١:٨:٢': start '١' is not a number{NOTE}",
    ),
    (("demo", "--rate", "３"), f"wok demo: --rate: expected a number; got '３'{NOTE}"),
    (
        ("tune", "--max-batch-sizes", "٤,٨", "--alpha", "1ms", "--beta", "1ms", "--slo-p99", "50ms"),
        "wok tune: --max-batch-sizes '٤,٨': expected whole numbers like 4,8,16",
    ),
    (
        ("bench", "ramp", "--start-at", "١٧٠٠٠٠٠٠٠٠", "--target", "127.0.0.1:1"),
        "wok bench: --start-at: expected a Unix time in seconds, e.g. $(date +%s); got '١٧٠٠٠٠٠٠٠٠'",
    ),
]


@pytest.mark.parametrize(("argv", "refusal"), NUMBER_CASES, ids=[" ".join(argv[:3]) for argv, _ in NUMBER_CASES])
def test_a_number_in_digits_other_than_ascii_is_refused_naming_the_option(argv, refusal, wok):
    done = wok(*argv)
    assert (done.returncode, done.stdout, done.stderr) == (2, "", refusal + "\n")


UNDERSCORE = " (numbers are read without '_': 1000, not 1_000)"

# int(), float() and Decimal() take '_' between digits, as Python's literals do: `--port 8_001` served on 8001 and
# `--peak-qps 1_000` planned for 1000 QPS, where a duration, a size or a rate with one was refused.
UNDERSCORE_CASES = [
    (
        ("serve", "--port", "8_001", "--models", "nope"),
        f"wok serve: --port: expected an integer; got '8_001'{UNDERSCORE}",
    ),
    (
        ("serve", "--grace-period", "1_0.5", "--models", "nope"),
        f"wok serve: --grace-period: expected a number; got '1_0.5'{UNDERSCORE}",
    ),
    (
        ("serve", "--demo-option", "mlp.hidden=6_4", "--models", "mlp", "--grace-period", "-1"),
        "wok: --demo-option 'mlp.hidden=6_4': option 'hidden' of demo model 'mlp': expected an integer; got "
        f"'6_4'{UNDERSCORE}",
    ),
    (("bench", "ramp", "--workers", "1_0"), f"wok bench: --workers: expected an integer; got '1_0'{UNDERSCORE}"),
    (
        ("bench", "ramp", "--steps", "50,1_000", "--target", "127.0.0.1:1"),
        f"wok bench: --steps: QPS steps '50,1_000': '1_000' is not a number{UNDERSCORE}",
    ),
    (
        ("plan", "--peak-qps", "1_000", "--t-batch", "20ms", "--batch-size", "16"),
        f"wok plan: --peak-qps: '1_000' is not a number{UNDERSCORE}",
    ),
    # Refused, but until 2026-12-07 without a reason: as any other typo.
    (
        ("bench", "ramp", "--start-at", "1_700_000_000", "--target", "127.0.0.1:1"),
        f"wok bench: --start-at: expected a Unix time in seconds, e.g. $(date +%s); got '1_700_000_000'{UNDERSCORE}",
    ),
    (
        ("bench", "ramp", "--soak", "1s", "--soak-load", "8_0%", "--capacity", "10", "--target", "127.0.0.1:1"),
        f"wok bench: --soak-load '8_0%': expected a share of the capacity such as 80% or 0.8, in (0, 1]{UNDERSCORE}",
    ),
    (
        ("bench", "ramp", "--fault", "fail:at=3_0%,model=mlp", "--replicas", "1"),
        "wok bench: --fault 'fail:at=3_0%,model=mlp': at='3_0%': expected a percentage of the ramp from 0% to 100%"
        f"{UNDERSCORE}",
    ),
    (
        ("tune", "--slo-p99", "20ms", "--alpha", "0ms", "--beta", "1ms", "--max-batch-sizes", "4,1_6"),
        f"wok tune: --max-batch-sizes '4,1_6': expected whole numbers like 4,8,16{UNDERSCORE}",
    ),
]


@pytest.mark.parametrize(
    ("argv", "refusal"), UNDERSCORE_CASES, ids=[" ".join(argv[:3]) for argv, _ in UNDERSCORE_CASES]
)
def test_a_number_with_an_underscore_is_refused_naming_the_option(argv, refusal, wok):
    done = wok(*argv)
    assert (done.returncode, done.stdout, done.stderr) == (2, "", refusal + "\n")
