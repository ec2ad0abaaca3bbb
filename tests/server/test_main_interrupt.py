"""Ctrl-C in the first second of a `wok` command, while its parsers load: `main` holds SIGINT then
(the handlers `wok serve` needs from its first moment, server/__main__.py's _StopSignal) and
hands it back to the command. It was handed back outside the command's Ctrl-C handling: a
KeyboardInterrupt traceback from `uninstall`, where a Ctrl-C a moment later says
`wok CMD: interrupted`, status 130.

In a process of its own (a KeyboardInterrupt that escapes would end the test session): the
signal is raised where the parsers load, as a Ctrl-C then would be."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

# SIGINT as Python's default has it (the test runner may have started with it ignored, which its
# children inherit), then `main` with the signal raised at `hook`, a name in wok.__main__ or
# wok.demo.cli that main calls while the parsers load.
_CHILD = """
import signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)
import wok.__main__ as main_module
import wok.demo.cli as demo_cli
module = {"main": main_module, "demo": demo_cli}[sys.argv[1]]
real = getattr(module, sys.argv[2])

def interrupted(*args, **kwargs):
    signal.raise_signal(signal.SIGINT)  # held by _StopSignal's handler: the command runs on
    return real(*args, **kwargs)

setattr(module, sys.argv[2], interrupted)
sys.exit(main_module.main(sys.argv[3:]))
"""

SIMULATE = ["simulate", "--alpha", "1ms", "--beta", "1ms", "--steps", "10", "--step-duration", "1s"]


def _run(module: str, hook: str, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", _CHILD, module, hook, *argv], capture_output=True, text=True, timeout=120
    )


def test_ctrl_c_while_the_parsers_load_ends_the_command_as_a_later_one_does():
    done = _run("demo", "add_demo_parser", *SIMULATE)
    assert (done.returncode, done.stdout, done.stderr) == (130, "", "wok simulate: interrupted\n")


@pytest.mark.parametrize("argv", [["simulate", "--no-such-option"], ["--help"]], ids=["refused", "help"])
def test_ctrl_c_while_the_parsers_load_wins_over_their_own_exit(argv):
    """A refused option (argparse's exit 2) or --help (exit 0) with a Ctrl-C meanwhile: the Ctrl-C's
    status, said in one line, not a traceback during the handling of argparse's SystemExit."""
    done = _run("demo", "add_demo_parser", *argv)
    assert done.returncode == 130, done.stderr
    assert done.stderr.endswith("wok: interrupted\n"), done.stderr
    assert "Traceback" not in done.stderr


def test_a_serve_option_refused_after_a_ctrl_c_is_still_said_with_its_status():
    done = _run("main", "_check_serve_options", "serve", "--metrics-port", "-5")
    assert done.returncode == 2, done.stderr
    assert done.stderr == "wok: --metrics-port -5: expected a port 0-65535 (0: a free one), or -1 for none\n"


# The console script's own lines (pyproject.toml: wok = "wok.entry:main"), with SIGINT raised as
# `wok.errors` (gRPC) is imported, as a Ctrl-C in the command's first 0.1 s is.
_SCRIPT = """
import importlib.abc, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)

class CtrlC(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "wok.errors":
            signal.raise_signal(signal.SIGINT)
        return None

sys.meta_path.insert(0, CtrlC())
from wok.entry import main
sys.exit(main())
"""


def test_ctrl_c_while_the_command_module_imports_is_one_line_not_a_traceback():
    """Before `main` held SIGINT: a KeyboardInterrupt traceback through the import of gRPC, and the
    process killed by the signal rather than ending with a status."""
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, "simulate", "--help"], capture_output=True, text=True, timeout=120
    )
    assert (done.returncode, done.stdout, done.stderr) == (130, "", "wok: interrupted\n")


# `python -m wok` as the interpreter runs it (runpy, the module named __main__), with SIGINT raised as
# gRPC is imported.
_DASH_M = _SCRIPT.replace(
    "from wok.entry import main\nsys.exit(main())",
    'import runpy\nrunpy.run_module("wok", run_name="__main__", alter_sys=True)',
)


def test_ctrl_c_while_python_m_wok_imports_is_one_line_not_a_traceback():
    """`python -m wok` ran this module's imports before any guard: a KeyboardInterrupt traceback."""
    assert "runpy" in _DASH_M
    done = subprocess.run(
        [sys.executable, "-c", _DASH_M, "simulate", "--help"], capture_output=True, text=True, timeout=120
    )
    assert (done.returncode, done.stdout, done.stderr) == (130, "", "wok: interrupted\n")


def test_python_m_wok_runs_the_command():
    done = subprocess.run(
        [sys.executable, "-m", "wok", "simulate", "--no-such-option"], capture_output=True, text=True, timeout=120
    )
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.endswith("unrecognized arguments: '--no-such-option'\n"), done.stderr


def test_the_console_script_runs_wok_entry():
    from pathlib import Path

    from wok.config import tomllib  # tomli before Python 3.11

    project = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    assert project["project"]["scripts"] == {"wok": "wok.entry:main"}


# The console script's own lines, with the signals named first ("SIGHUP+SIGTERM": each in turn) raised (on the
# importing thread) at the first import of the module named second: as ones sent at that moment of the start would come.
_SIGNALLED_AT = """
import importlib.abc, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)
sigs, at = [signal.Signals[s] for s in sys.argv.pop(1).split("+")], sys.argv.pop(1)
for sig in sigs:
    signal.signal(sig, signal.SIG_DFL)  # the test runner may ignore it (nohup): a signal ignored at the start stays so

class Signalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == at:
            sys.meta_path.remove(self)
            for sig in sigs:
                signal.raise_signal(sig)
        return None

sys.meta_path.insert(0, Signalled())
from wok.entry import main
sys.argv = ["wok", *sys.argv[1:]]
sys.exit(main())
"""

# Each a moment of `wok serve`'s start: the command module's import begun, asyncio's, gRPC's, its last import, then
# (its handlers in place) the models' build, on the executor's thread.
_START_POINTS = ["wok.__main__", "asyncio", "grpc", "wok.numerals", "wok.app"]


@pytest.mark.parametrize("at", _START_POINTS)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["sigterm", "sighup"])
def test_a_signal_at_any_moment_of_wok_serves_start_stops_it_before_serving(sig, at):
    # Until the command's module had imported (gRPC, asyncio: ~0.1 s) SIGTERM and SIGHUP had their default actions:
    # the process died by the signal (status -15 or -1 to its parent, nothing said).
    cmd = [sys.executable, "-c", _SIGNALLED_AT, sig.name, at, "serve", "--models", "mlp", "--port", "0"]
    done = subprocess.run([*cmd, "--metrics-port", "-1"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, (done.returncode, done.stderr[-3000:])
    said = f"wok: {sig.name} received, stopping\nwok: stopped by a signal before serving\n"
    assert done.stderr.endswith(said) and "Traceback" not in done.stderr, done.stderr[-3000:]


def test_a_sigterm_held_as_another_command_imports_reaches_it_as_it_starts():
    # Held for `wok serve` alone: another command gets it, with the handler it had (the default action here), not lost.
    cmd = [sys.executable, "-c", _SIGNALLED_AT, "SIGTERM", "grpc", *SIMULATE]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout) == (-signal.SIGTERM, ""), (done.returncode, done.stderr[-3000:])


@pytest.mark.parametrize(
    ("signals", "first"),
    [("SIGTERM+SIGTERM", signal.SIGTERM), ("SIGHUP+SIGTERM", signal.SIGHUP)],
    ids=["sigterm-twice", "sighup-sigterm"],
)
@pytest.mark.parametrize("at", ["grpc", "wok.bench"], ids=["held", "parsers"])
def test_two_signals_as_another_command_starts_reach_it_as_the_first_alone(signals, first, at):
    # Counted as `wok serve` counts them, in a command with no drain: two SIGTERMs said "second signal, exiting
    # without draining" and exited 1; SIGHUP then SIGTERM said "already draining" before the hangup killed it.
    cmd = [sys.executable, "-c", _SIGNALLED_AT, signals, at, *SIMULATE]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout, done.stderr) == (-first, "", ""), (done.returncode, done.stderr[-3000:])
