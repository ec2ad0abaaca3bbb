"""The `wok` command's gRPC environment (wok.entry.GRPC_DEFAULTS): set by the command before grpc loads, by both
of its entry points, and by nothing that merely imports wok's modules. Importing wok.__main__ set them: a process that
did (about 15 test modules at collection; bench/cli.py for `check_replica_args`) kept gRPC core's logging off, and its
fork support, for everything after, its bench workers included.

Each in a fresh interpreter: this one's environment already has what earlier imports set."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from wok.entry import GRPC_DEFAULTS

# The environment as it is when grpc is first imported (a finder that looks, then lets the import go on), then the
# command: `python -m wok` (run as its module) or the console script (wok.entry:main).
_SEEN_AT_GRPC_IMPORT = """
import importlib.abc, json, os, runpy, sys

NAMES = json.loads(sys.argv[1])
seen = {}

class Look(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "grpc" and not seen:
            seen.update({n: os.environ.get(n) for n in NAMES})
        return None

sys.meta_path.insert(0, Look())
sys.argv = ["wok", "--help"]
try:
    if os.environ["HOW"] == "module":
        runpy.run_module("wok", run_name="__main__", alter_sys=True)
    elif os.environ["HOW"] == "gcwrap":  # an archived script's recorded command: OUT -- SERVE_ARGS
        sys.argv = [os.environ["GCWRAP"], os.devnull, "--", "--help"]
        runpy.run_path(sys.argv[0], run_name="__main__")
    else:
        from wok.entry import main
        sys.exit(main())
except SystemExit:
    pass
print(json.dumps(seen))
"""


def _environment(**set_here: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in GRPC_DEFAULTS}
    return env | set_here


def _seen(how: str, **set_here: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", _SEEN_AT_GRPC_IMPORT, json.dumps(list(GRPC_DEFAULTS))],
        env=_environment(HOW=how, **set_here),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_importing_wok_main_or_the_bench_cli_leaves_grpcs_environment_as_it_was():
    code = (
        "import json, os, sys, wok.__main__, wok.bench.cli\n"
        "print(json.dumps({n: os.environ.get(n) for n in sys.argv[1:]}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, *GRPC_DEFAULTS], env=_environment(), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout) == dict.fromkeys(GRPC_DEFAULTS)


def test_the_wok_command_sets_grpcs_environment_before_grpc_loads():
    assert GRPC_DEFAULTS == {"GRPC_VERBOSITY": "NONE", "GRPC_ENABLE_FORK_SUPPORT": "0"}
    assert _seen("script") == GRPC_DEFAULTS
    assert _seen("module") == GRPC_DEFAULTS


def test_the_archived_gcwrap_script_runs_wok_as_the_command_does():
    """It ran wok.__main__.main, which no longer sets them: a rerun had gRPC core's logging on."""
    from pathlib import Path

    gcwrap = Path(__file__).resolve().parents[2] / "docs/results/loop-profile-3500qps-2026-11-30/gcwrap.py"
    assert _seen("gcwrap", GCWRAP=str(gcwrap)) == GRPC_DEFAULTS


def test_an_operators_own_grpc_setting_wins():
    assert _seen("script", GRPC_VERBOSITY="ERROR") == GRPC_DEFAULTS | {"GRPC_VERBOSITY": "ERROR"}
    assert _seen("module", GRPC_ENABLE_FORK_SUPPORT="1") == GRPC_DEFAULTS | {"GRPC_ENABLE_FORK_SUPPORT": "1"}
