"""scripts/bootstrap.py: its usage, the torch it installs, and how it hands over to `wok serve`.

Nothing here runs pip: the exec test replaces bootstrap's install steps with no-ops and points it at
the environment the tests run in (an editable reinstall of wok into the shared .venv would disturb
other test runs and needs the build backend from an index).
"""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BOOTSTRAP = ROOT / "scripts" / "bootstrap.py"


def load_bootstrap():
    spec = importlib.util.spec_from_file_location("wok_bootstrap", BOOTSTRAP)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("flag", ["-h", "--help"])
def test_help_prints_the_usage_with_every_command_and_exits_0(flag):
    r = subprocess.run([sys.executable, str(BOOTSTRAP), flag], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    for command in ("serve", "test", "install"):
        assert f"scripts/bootstrap.py {command}" in r.stdout, command


def test_no_command_is_a_usage_error_that_names_what_it_got():
    r = subprocess.run([sys.executable, str(BOOTSTRAP), "frob"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2
    assert "'frob'" in r.stderr and "serve, test, install" in r.stderr


def test_a_requested_torch_is_installed_even_where_a_torch_imports():
    bootstrap = load_bootstrap()

    def imports() -> bool:
        return True

    def must_not_probe() -> bool:
        raise AssertionError("a requested torch is installed whatever the environment has")

    assert bootstrap.torch_to_install("torch==2.4.0", must_not_probe) == "torch==2.4.0"
    assert bootstrap.torch_to_install(None, imports) is None
    assert bootstrap.torch_to_install("", imports) is None  # WOK_TORCH= (empty) is not a request
    assert bootstrap.torch_to_install(None, lambda: False) == f"torch=={bootstrap.TORCH_VERSION}"


def children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads process children from Linux's /proc")
def test_sigterm_to_bootstrap_serve_stops_the_server_and_frees_its_port():
    # bootstrap's own code down to the hand-over; only its pip steps are skipped, and WOK_VENV
    # names the environment this test runs in (where wok is installed already).
    driver = textwrap.dedent(
        f"""
        import importlib.util, sys
        spec = importlib.util.spec_from_file_location("wok_bootstrap", {str(BOOTSTRAP)!r})
        b = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(b)
        b.pip = lambda *args: None
        b.ensure_torch = lambda *args: None
        sys.exit(b.main(["serve", "--models", "mlp", "--port", "0", "--metrics-port", "-1"]))
        """
    )
    env = {**os.environ, "WOK_VENV": sys.prefix, "PYTHONUNBUFFERED": "1"}
    env.pop("WOK_TORCH", None)
    proc = subprocess.Popen([sys.executable, "-c", driver], stderr=subprocess.PIPE, text=True, env=env)
    ready = threading.Event()
    log: list[str] = []
    port: list[int] = []

    def pump() -> None:
        for line in proc.stderr:
            log.append(line.rstrip())
            if "wok: serving" in line and not port:
                port.append(int(line.rsplit(":", 1)[1]))
                ready.set()
        ready.set()

    threading.Thread(target=pump, daemon=True).start()
    left: list[int] = []
    try:
        assert ready.wait(120) and port, "no ready line:\n" + "\n".join(log[-20:])
        left = children(proc.pid)  # wok serve itself, were it a child of bootstrap
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(30)
        assert code == 0, f"expected wok serve's own exit status 0 after SIGTERM, got {code}:\n" + "\n".join(log[-20:])
        orphans = [pid for pid in left if alive(pid)]
        assert not orphans, f"still running after SIGTERM to bootstrap: {orphans}"
        with socket.socket() as s:  # the gRPC port is free again
            s.bind(("127.0.0.1", port[0]))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in left:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_the_suite_runs_in_two_passes_on_two_cpus_and_the_serial_files_exist(pytestconfig):
    bootstrap = load_bootstrap()
    py = Path("/venv/bin/python")
    pytest_ = [str(py), "-m", "pytest"]
    assert bootstrap.suite_passes(py, 1) == [pytest_]
    assert bootstrap.suite_passes(py, 16) == [
        [*pytest_, "-n", "2", "--dist", "loadfile", "-m", "not serial"],
        [*pytest_, "-m", "serial"],
    ]
    # A misspelt or moved name would leave its file to the parallel pass without a word.
    tests = ROOT / "tests"
    here = str(tests / "conftest.py")
    (conftest,) = (p for p in pytestconfig.pluginmanager.get_plugins() if getattr(p, "__file__", None) == here)
    serial = conftest.SERIAL_FILES
    assert serial and all((tests / name).is_file() for name in serial), [n for n in serial if not (tests / n).is_file()]


def test_a_failing_pass_fails_the_suite_after_the_passes_after_it_ran(tmp_path):
    bootstrap = load_bootstrap()
    ran = tmp_path / "ran"
    passes = [
        [sys.executable, "-c", f"open({str(ran)!r}, 'a').write('1'); raise SystemExit(1)"],
        [sys.executable, "-c", f"open({str(ran)!r}, 'a').write('2')"],
    ]
    assert bootstrap.run_suite(passes) == 1 and ran.read_text() == "12"
    assert bootstrap.run_suite(passes[1:]) == 0


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads process children from Linux's /proc")
def test_sigterm_to_the_suite_stops_the_running_pass_and_runs_no_other(tmp_path):
    started, second = tmp_path / "started", tmp_path / "second"
    script = textwrap.dedent(
        f"""
        import importlib.util, sys
        spec = importlib.util.spec_from_file_location("b", {str(BOOTSTRAP)!r})
        b = importlib.util.module_from_spec(spec); spec.loader.exec_module(b)
        first = "import time; open({str(started)!r}, 'w').close(); time.sleep(60)"
        sys.exit(b.run_suite([[sys.executable, "-c", first], [sys.executable, "-c", "open({str(second)!r}, 'w')"]]))
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.DEVNULL)
    try:
        deadline = 30.0
        while not started.exists() and deadline > 0 and proc.poll() is None:
            threading.Event().wait(0.05)
            deadline -= 0.05
        assert started.exists(), "the first pass did not start"
        (child,) = children(proc.pid)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
        assert not alive(child) and not second.exists()
    finally:
        proc.kill()
        proc.wait()
