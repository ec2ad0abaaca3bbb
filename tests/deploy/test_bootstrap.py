"""scripts/bootstrap.py: its usage, the torch it installs, how it hands over to `wok serve`, and how
`test` runs the suite's passes and passes signals on to them.

Nothing here runs pip: the exec test replaces bootstrap's install steps with no-ops and points it at
the environment the tests run in (an editable reinstall of wok into the shared .venv would disturb
other test runs and needs the build backend from an index).
"""

from __future__ import annotations

import importlib.util
import os
import queue
import select
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Sequence
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


def state(pid: int) -> str:
    """A process's run state, signal sets and kernel wait point (Linux's /proc), for a failure's message:
    why a process that a signal should have ended runs on (the signal's bit in SigIgn: ignored; in
    SigPnd or ShdPnd and SigBlk: held back; in none of them: it never came)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text().splitlines()
        wchan = Path(f"/proc/{pid}/wchan").read_text()
    except OSError:
        return f"{pid} gone"
    fields = ("Name", "State", "SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt")
    said = [line.replace("\t", " ") for line in status if line.split(":", 1)[0] in fields]
    return f"{pid}: {', '.join(said)}, waits in {wchan or '-'}"


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
        b.pip = lambda *args, **kwargs: None
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
    pytest_ = [str(py), "-m", "pytest", "--durations=15"]
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


def test_a_pass_killed_by_a_signal_ends_the_suite_with_the_failure_before_it(tmp_path):
    # As the OOM killer's SIGKILL, which does not come through bootstrap: the earlier failure is the status.
    bootstrap = load_bootstrap()
    third = tmp_path / "third"
    passes = [
        [sys.executable, "-c", "raise SystemExit(1)"],
        [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"],
        [sys.executable, "-c", f"open({str(third)!r}, 'w')"],
    ]
    assert bootstrap.run_suite(passes) == 1 and not third.exists()
    assert bootstrap.run_suite(passes[1:]) == 128 + signal.SIGKILL and not third.exists()


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
        # The pass, not its guard (PASS_GUARD), bootstrap's other child.
        (child,) = (c for c in children(proc.pid) if str(started) in Path(f"/proc/{c}/cmdline").read_text())
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
        assert not alive(child) and not second.exists()
    finally:
        proc.kill()
        proc.wait()


# A pass that stands for a pytest run: it says it runs, then takes the SIGINT of a Ctrl-C as pytest
# does (its summary on stderr, status 2). A signal that does not reach it leaves it running a minute.
WAITING_PASS = textwrap.dedent(
    """
    import os, sys, time
    try:  # from before it says it runs: a SIGINT once it has said so is its KeyboardInterrupt
        print("pass: running", os.getpid(), flush=True, file=sys.stderr)
        time.sleep(60)
    except KeyboardInterrupt:
        print("pass: KeyboardInterrupt", flush=True, file=sys.stderr)
        sys.exit(2)
    """
)


def lines_of(stream) -> queue.Queue:
    """The lines of a child's `stream`, as they come, then None once every process holding it has ended."""
    lines: queue.Queue = queue.Queue()

    def pump() -> None:
        for line in stream:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return lines


def bootstrap_script(path: Path, prelude: str, call: str) -> Path:
    """A script that does `prelude`, then loads bootstrap and exits with `b.<call>`."""
    path.write_text(
        prelude
        + textwrap.dedent(
            f"""
        import importlib.util, sys
        spec = importlib.util.spec_from_file_location("b", {str(BOOTSTRAP)!r})
        b = importlib.util.module_from_spec(spec); spec.loader.exec_module(b)
        sys.exit(b.{call})
        """
        )
    )
    return path


def start_suite(
    tmp_path: Path, passes: list[str], prelude: str = "", wrapper: Sequence[str] = (), **popen
) -> tuple[subprocess.Popen, queue.Queue]:
    """bootstrap's run_suite on passes of Python code, in a process of its own as `bootstrap.py test`
    (run by `wrapper` where one is given), after `prelude`; and its stderr's lines (the passes' too),
    then None once every process holding it has ended."""
    # A file: a pass may be longer than one argument can be.
    script = bootstrap_script(
        tmp_path / "suite.py", prelude, f"run_suite([[sys.executable, '-c', code] for code in {passes!r}])"
    )
    # A session of its own: the cleanup's SIGKILL to its group reaches what it started there.
    popen = {"stdout": subprocess.DEVNULL, "stderr": subprocess.PIPE, **popen}
    proc = subprocess.Popen([*wrapper, sys.executable, str(script)], text=True, start_new_session=True, **popen)
    return proc, lines_of(proc.stderr)


def read_until(lines: queue.Queue, wanted: str | None, timeout: float = 30) -> list[str]:
    """The lines up to the one that starts with `wanted`, that one too; `None`: up to the end of the
    output, which comes once every process holding it has ended."""
    seen: list[str] = []
    while True:
        try:
            line = lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no {wanted or 'end of the output'!r} in {timeout} s; so far: {seen}") from None
        if line is None:
            assert wanted is None, f"the output ended before {wanted!r}: {seen}"
            return seen
        seen.append(line)
        if wanted is not None and line.startswith(wanted):
            return seen


def pid_of(line: str) -> int:
    return int(line.split()[-1])


def end_all(proc: subprocess.Popen, *pids: int) -> None:
    """Whatever a failing test left running: bootstrap's session, and the given processes and their groups."""
    for kill, pid in [(os.killpg, proc.pid), *((k, pid) for pid in pids for k in (os.killpg, os.kill))]:
        try:
            kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    proc.wait()


@pytest.mark.skipif(not hasattr(os, "killpg"), reason="signals process groups")
def test_sigint_to_bootstrap_alone_interrupts_the_running_pass_and_ends_the_suite_with_130(tmp_path):
    second = tmp_path / "second"
    proc, lines = start_suite(tmp_path, [WAITING_PASS, f"open({str(second)!r}, 'w')"])
    left: list[int] = []
    try:
        left.append(pid_of(read_until(lines, "pass: running")[-1]))
        proc.send_signal(signal.SIGINT)  # `kill -INT`, not a terminal's Ctrl-C to the whole group
        assert proc.wait(timeout=10) == 128 + signal.SIGINT
        # to the end of the output: the pass has ended, and all it started
        assert read_until(lines, None, timeout=10) == [
            "pass: KeyboardInterrupt",
            "bootstrap: SIGINT in pass 1 of 2; the suite stops there (status 130)",
        ]
        assert not second.exists()
    finally:
        end_all(proc, *left)


# A pass that starts a worker, as pytest-xdist's, in its process group, and says both their ids.
STARTS_A_WORKER = (
    "import os, subprocess, sys; w = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
    "print('pass: running', os.getpid(), w.pid, flush=True, file=sys.stderr); w.wait()"
)


@pytest.mark.skipif(not hasattr(os, "killpg"), reason="signals process groups")
def test_sigterm_to_the_suite_stops_what_the_pass_started_too(tmp_path):
    proc, lines = start_suite(tmp_path, [STARTS_A_WORKER])
    left: list[int] = []
    try:
        left += map(int, read_until(lines, "pass: running")[-1].split()[-2:])
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 128 + signal.SIGTERM
        # The worker holds the output open while it runs (it inherited stderr): it has ended too.
        assert read_until(lines, None, timeout=10) == [
            "bootstrap: SIGTERM in pass 1 of 1; the suite stops there (status 143)"
        ]
    finally:
        end_all(proc, *left)


@pytest.mark.skipif(not hasattr(os, "killpg"), reason="signals process groups")
def test_a_pass_and_what_it_started_end_with_bootstrap_killed_outright(tmp_path):
    # `timeout -s KILL` (or -k), or a CI runner, kills bootstrap's process group: the pass, in a session
    # of its own, is out of it, and it and its workers ran on, orphaned, for as long as they would.
    proc, lines = start_suite(tmp_path, [STARTS_A_WORKER])
    left: list[int] = []
    try:
        left += map(int, read_until(lines, "pass: running")[-1].split()[-2:])
        os.killpg(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=10) == -signal.SIGKILL
        # The pass and its worker hold the output open while they run: it ends once both have ended.
        assert read_until(lines, None, timeout=10) == []
    finally:
        end_all(proc, *left)


@pytest.mark.skipif(not hasattr(os, "killpg"), reason="signals process groups")
def test_an_interrupted_pass_does_not_hide_the_failure_of_the_pass_before_it(tmp_path):
    proc, lines = start_suite(tmp_path, ["raise SystemExit(1)", WAITING_PASS])
    left: list[int] = []
    try:
        left.append(pid_of(read_until(lines, "pass: running")[-1]))
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 1
        assert read_until(lines, None, timeout=10) == [
            "bootstrap: SIGTERM in pass 2 of 2; the suite stops there (status 1: pass 1 of 2 had failed)"
        ]
    finally:
        end_all(proc, *left)


def stopped_before(proc, lines, sig: int, n: int, of: int, never_made: Path) -> None:
    """Bootstrap stopped by `sig` before pass n of `of`: its status, its one line (no traceback), and
    the pass's file never made."""
    assert proc.wait(timeout=10) == 128 + sig
    status = 128 + sig
    assert read_until(lines, None, timeout=10) == [
        f"bootstrap: {signal.Signals(sig).name} before pass {n} of {of}; the suite stops there (status {status})"
    ]
    assert not never_made.exists()


@pytest.mark.skipif(not hasattr(os, "killpg"), reason="signals process groups")
def test_ctrl_c_between_two_passes_exits_130_with_one_line_and_starts_no_further_pass(tmp_path):
    second = tmp_path / "second"
    # Bootstrap writes the second pass's command line before it starts it, a line far longer than a
    # pipe holds: once its start has come through stdout, bootstrap is held in that write, after the
    # first pass ended and before the second starts, for as long as stdout is not read.
    token = "the second pass"
    second_pass = f"open({str(second)!r}, 'w')  # {token} " + "x" * 2**20
    proc, lines = start_suite(tmp_path, ["pass", second_pass], stdout=subprocess.PIPE)
    try:
        out = b""
        while token.encode() not in out:
            assert select.select([proc.stdout], [], [], 30)[0], f"no second pass line in 30 s: {out[-300:]!r}"
            chunk = os.read(proc.stdout.fileno(), 4096)
            assert chunk, f"stdout ended before the second pass's line: {out[-300:]!r}"
            out += chunk
        proc.send_signal(signal.SIGINT)
        proc.stdout.read()  # the rest of the line, which bootstrap then finishes writing
        stopped_before(proc, lines, signal.SIGINT, 2, 2, second)
    finally:
        end_all(proc)


@pytest.mark.skipif(not hasattr(os, "openpty"), reason="runs bootstrap on a pseudo-terminal")
def test_ctrl_c_typed_at_a_terminal_reaches_the_pass_which_still_writes_to_the_terminal(tmp_path):
    # The pass runs in a session of its own, out of the terminal's foreground process group: a Ctrl-C
    # reaches bootstrap alone, which passes it on. The pass says whether its stdout is a terminal
    # (where pytest colours its output).
    import termios  # POSIX only, as openpty

    says_if_tty = "import os, sys; print('pass: stdout is a tty:', os.isatty(1), flush=True, file=sys.stderr)\n"
    controller, terminal = os.openpty()
    # bootstrap's process leads its session: the terminal becomes its controlling one, as a shell's
    # foreground job's, and the terminal signals its process group.
    takes_the_terminal = "import fcntl, termios; fcntl.ioctl(0, termios.TIOCSCTTY, 0)\n"
    proc, lines = start_suite(
        tmp_path, [says_if_tty + WAITING_PASS], takes_the_terminal, stdin=terminal, stdout=terminal
    )
    os.close(terminal)
    left: list[int] = []
    try:
        *_, tty, running = read_until(lines, "pass: running")
        left.append(pid_of(running))
        assert tty == "pass: stdout is a tty: True"
        # What a typed Ctrl-C needs of the terminal, checked before it is typed (a termios call on the
        # controller side reads the terminal's): a SIGINT (ISIG on) to bootstrap's group. Either missing
        # would show only as the wait below running out.
        group = os.tcgetpgrp(controller)
        assert group == proc.pid, f"the terminal's foreground process group is {group}, not bootstrap's {proc.pid}"
        assert termios.tcgetattr(controller)[3] & termios.ISIG, "ISIG is off: a Ctrl-C would be input, not SIGINT"
        os.write(controller, b"\x03")
        try:
            code = proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            seen = []
            while not lines.empty():
                seen.append(lines.get())
            raise AssertionError(
                f"bootstrap still runs 10 s after the Ctrl-C (foreground group {os.tcgetpgrp(controller)}): "
                f"{state(proc.pid)}; its children (the pass, its guard): "
                f"{'; '.join(state(pid) for pid in children(proc.pid)) or 'none'}; its output since: {seen}"
            ) from None
        assert code == 128 + signal.SIGINT
        assert read_until(lines, None, timeout=10) == [
            "pass: KeyboardInterrupt",
            "bootstrap: SIGINT in pass 1 of 1; the suite stops there (status 130)",
        ]
    finally:
        os.close(controller)
        end_all(proc, *left)


# A stand-in for a virtual environment's python, for bootstrap's install steps: its torch "imports",
# and its pip succeeds at once ("ok"), fails with a status, or runs until a signal, then cleans up for a
# while (as pip removes what it began) and says which signals reached it. As what bootstrap hands over to
# (`wok serve`, pytest), it says the signals it has blocked and ignored, and waits a minute for one.
FAKE_PYTHON = textwrap.dedent(
    """
    import os, signal, sys, time
    args = sys.argv[1:]
    if args[:1] == ["-c"]:  # bootstrap's probe for torch
        sys.exit(0)
    if args[:2] in (["-m", "wok"], ["-m", "pytest"]):
        blocked = sorted(signal.Signals(s).name for s in signal.pthread_sigmask(signal.SIG_BLOCK, []))
        ignored = sorted(s.name for s in signal.Signals if signal.getsignal(s) is signal.SIG_IGN)
        print("handed over:", *args, "| blocked:", *blocked, "| ignored:", *ignored, file=sys.stderr, flush=True)
        time.sleep(60)
        sys.exit(0)
    assert args[:3] == ["-m", "pip", "install"], args
    mode = os.environ["FAKE_PIP"]
    if mode == "ok":
        sys.exit(0)
    if mode.startswith("fail:"):
        print("pip: failing", file=sys.stderr, flush=True)
        sys.exit(int(mode[5:]))
    sigs = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
    print("pip: running", os.getpid(), file=sys.stderr, flush=True)
    first = signal.sigwait(sigs)
    more, end = [], time.monotonic() + 1.5
    while (left := end - time.monotonic()) > 0:
        info = signal.sigtimedwait(sigs, left)
        if info is not None:
            more.append(signal.Signals(info.si_signo).name)
    print(f"pip: {signal.Signals(first).name}, then {more}", file=sys.stderr, flush=True)
    sys.exit(1)
    """
)


def fake_venv(tmp_path: Path) -> Path:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (tmp_path / "fake_python.py").write_text(FAKE_PYTHON)
    python = venv / "bin" / "python"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} {tmp_path / "fake_python.py"} "$@"\n')
    python.chmod(0o755)
    return venv


def start_install(venv: Path, fake_pip: str = "wait") -> tuple[subprocess.Popen, queue.Queue]:
    """`bootstrap.py install` in a session of its own (a signal to its group is a terminal's Ctrl-C),
    and the lines of its stdout and stderr, then None. A real pip it may start finds no package (no
    index, no configuration): a step meant to be interrupted that is not fails at once."""
    env = {**os.environ, "WOK_VENV": str(venv), "FAKE_PIP": fake_pip, "PYTHONUNBUFFERED": "1"}
    env.update(PIP_NO_INDEX="1", PIP_CONFIG_FILE=os.devnull)
    env.pop("WOK_TORCH", None)
    proc = subprocess.Popen(
        [sys.executable, str(BOOTSTRAP), "install"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )
    return proc, lines_of(proc.stdout)


def pip_step(venv: Path) -> str:
    return f"{venv / 'bin' / 'python'} -m pip install --disable-pip-version-check -q -e {ROOT}"


def test_a_failing_install_step_ends_bootstrap_with_its_status_and_one_line(tmp_path):
    venv = fake_venv(tmp_path)
    proc, lines = start_install(venv, "fail:3")
    try:
        assert proc.wait(timeout=30) == 3
        assert read_until(lines, None, timeout=10) == [  # and no traceback
            f"+ {pip_step(venv)}",
            "pip: failing",
            f"bootstrap: an install step failed with status 3: {pip_step(venv)}; nothing was run",
        ]
    finally:
        end_all(proc)


@pytest.mark.skipif(not hasattr(os, "killpg"), reason="signals process groups")
@pytest.mark.parametrize(
    ("to_group", "signum"), [(True, signal.SIGINT), (False, signal.SIGINT), (False, signal.SIGTERM)]
)
def test_a_signal_while_pip_runs_reaches_pip_once_and_ends_bootstrap_after_it_with_one_line(tmp_path, to_group, signum):
    # to_group: a terminal's Ctrl-C (its whole foreground group); else `kill` of bootstrap alone.
    venv = fake_venv(tmp_path)
    proc, lines = start_install(venv)
    left: list[int] = []
    try:
        left.append(pid_of(read_until(lines, "pip: running")[-1]))
        if to_group:
            os.killpg(proc.pid, signum)
        else:
            proc.send_signal(signum)
        assert proc.wait(timeout=30) == 128 + signum
        name = signal.Signals(signum).name
        assert read_until(lines, None, timeout=10) == [  # pip cleaned up before bootstrap ended
            f"pip: {name}, then []",
            f"bootstrap: {name} in {pip_step(venv)}; nothing was run (status {128 + signum})",
        ]
    finally:
        end_all(proc, *left)


@pytest.mark.skipif(not hasattr(os, "killpg"), reason="signals process groups")
def test_ctrl_c_while_the_environment_is_made_removes_it_and_ends_bootstrap_with_one_line(tmp_path):
    venv = tmp_path / "new-venv"
    proc, lines = start_install(venv)
    try:
        read_until(lines, f"+ {sys.executable} -m venv {venv}")
        os.killpg(proc.pid, signal.SIGINT)  # ensurepip, in bootstrap's group, gets it too where it runs
        assert proc.wait(timeout=60) == 130
        said = read_until(lines, None, timeout=10)
        assert said[-1] == f"bootstrap: SIGINT in making the virtual environment {venv}; nothing was run (status 130)"
        assert not any("Traceback" in line for line in said), said
        assert not venv.exists()  # the next run makes it whole
    finally:
        end_all(proc)


def test_a_failed_ensurepip_is_named_with_what_it_said_and_the_package_that_provides_it(tmp_path):
    venv = tmp_path / "venv"
    # EnvBuilder runs `python -m ensurepip` in the new environment's folder, which is first on its
    # path: a folder given that holds a failing ensurepip makes the making fail as a missing one does.
    (venv / "ensurepip").mkdir(parents=True)
    (venv / "ensurepip" / "__init__.py").write_text("")
    (venv / "ensurepip" / "__main__.py").write_text("import sys\nprint('ensurepip: not here')\nsys.exit(1)\n")
    proc, lines = start_install(venv)
    try:
        assert proc.wait(timeout=60) == 1
        said = read_until(lines, None, timeout=10)
        assert said[-1].startswith(f"bootstrap: making the virtual environment {venv} failed: "), said
        assert said[-1].endswith(
            "-m ensurepip --upgrade --default-pip exited with status 1: ensurepip: not here (on Debian and Ubuntu"
            " the python3-venv package provides ensurepip); nothing was run"
        ), said
        assert not any("Traceback" in line for line in said), said
        assert (venv / "ensurepip").exists()  # a folder bootstrap did not make is left
    finally:
        end_all(proc)


# strace, to make a signal arrive at a chosen point in another process (its `inject` on a system call):
# the moment a race needs, every run, without a hook in bootstrap.
STRACE = shutil.which("strace")


def strace_works() -> bool:
    """Whether strace may trace here (a container's seccomp profile or Yama's ptrace_scope can forbid it)."""
    if STRACE is None:
        return False
    r = subprocess.run([STRACE, "-f", "-qq", "-o", os.devnull, sys.executable, "-c", "pass"], capture_output=True)
    return r.returncode == 0


def until(found: Callable[[], int | None], what: str, timeout: float = 10) -> int:
    """What `found` returns once it returns something, looked for every 10 ms."""
    end = time.monotonic() + timeout
    while (got := found()) is None:
        assert time.monotonic() < end, f"no {what} in {timeout} s"
        select.select([], [], [], 0.01)
    return got


def started_guard(bootstrap: int, pass_pid: int) -> int | None:
    """bootstrap's child other than the pass once it runs the guard's code, or has ended (a zombie)."""
    for pid in children(bootstrap):
        try:
            if pid != pass_pid and (not alive(pid) or b"killpg" in Path(f"/proc/{pid}/cmdline").read_bytes()):
                return pid
        except OSError:
            pass
    return None


@pytest.mark.skipif(not hasattr(os, "killpg"), reason="signals process groups")
@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads process children from Linux's /proc")
def test_a_signal_that_reaches_the_guard_as_it_starts_does_not_end_it(tmp_path):
    # Until its setsid the guard (PASS_GUARD) is in bootstrap's process group, where a terminal's Ctrl-C
    # or a runner's SIGTERM to the group reaches it: strace delivers a SIGINT there (on entering setsid)
    # to each process bootstrap starts. The pass takes it as it starts (see `Forwarding.run`), the guard
    # must too: else it dies, and bootstrap then killed outright leaves the pass's worker running.
    if not strace_works():
        pytest.skip("needs strace, allowed to trace (ptrace)")
    tracer = [STRACE, "-f", "-qq", "-o", os.devnull, "-e", "trace=setsid", "-e", "inject=setsid:signal=SIGINT"]
    proc, lines = start_suite(tmp_path, [STARTS_A_WORKER], wrapper=tracer)
    left: list[int] = []
    try:
        left += map(int, read_until(lines, "pass: running")[-1].split()[-2:])
        (bootstrap,) = children(proc.pid)  # strace's child
        guard = until(lambda: started_guard(bootstrap, left[0]), "the guard's start")
        assert alive(guard), f"the guard ended as it started: {state(guard)}"
        os.killpg(proc.pid, signal.SIGKILL)  # strace and bootstrap; the pass and the guard are out of the group
        proc.wait(timeout=10)
        # The pass and its worker hold the output open while they run: it ends once the guard has ended both.
        assert read_until(lines, None, timeout=10) == []
    finally:
        end_all(proc, *left)


# For start_suite's prelude: bootstrap's process says each signal it sends a process group (`kill`
# after killpg: the test's line to look for), then sends it.
SAYS_WHAT_IT_SENDS = textwrap.dedent(
    """
    import os, signal, sys
    killpg = os.killpg
    def says_it(pgid, signum):
        print("kill", signal.Signals(signum).name, pgid, file=sys.stderr, flush=True)
        killpg(pgid, signum)
    os.killpg = says_it
    """
)


@pytest.mark.skipif(not hasattr(os, "killpg"), reason="signals process groups")
def test_a_signal_as_the_pass_becomes_the_running_one_reaches_it_once(tmp_path):
    # A signal whose handler runs as `Forwarding.run` has just put the pass in `_running` is passed on by
    # the handler, and must not be again by run's check for one that came while the pass started. A
    # trace function sends it there, every run: at the first line run executes with the pass in `_running`.
    sends_it_there = textwrap.dedent(
        f"""
        import sys
        def run_line(frame, event, arg):
            if event == "line" and frame.f_locals["self"]._running and not sent:
                sent.append(True)
                os.kill(os.getpid(), signal.SIGINT)
            return run_line
        def calls(frame, event, arg):
            code = frame.f_code
            in_run = code.co_filename == {str(BOOTSTRAP)!r} and code.co_name == "run" and "self" in frame.f_locals
            return run_line if in_run else None  # Forwarding.run's
        sent = []
        sys.settrace(calls)
        """
    )
    proc, lines = start_suite(tmp_path, ["import time; time.sleep(60)"], SAYS_WHAT_IT_SENDS + sends_it_there)
    try:
        assert proc.wait(timeout=10) == 128 + signal.SIGINT
        said = read_until(lines, None, timeout=10)
        assert [line.split()[:2] for line in said if line.startswith("kill ")] == [["kill", "SIGINT"]], said
        assert said[-1] == "bootstrap: SIGINT in pass 1 of 1; the suite stops there (status 130)", said
    finally:
        end_all(proc)


@pytest.mark.skipif(not hasattr(os, "killpg"), reason="signals process groups")
def test_a_signal_held_back_by_a_mask_bootstrap_was_started_with_ends_the_suite_before_its_first_pass(tmp_path):
    # A runner that starts bootstrap with SIGINT and SIGTERM blocked (a mask is inherited, a leftover of
    # its own signal handling): one sent then waits, pending, and comes once bootstrap lets it through.
    first = tmp_path / "first"
    blocked_and_sent = textwrap.dedent(
        """
        import os, signal
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        os.kill(os.getpid(), signal.SIGTERM)
        """
    )
    proc, lines = start_suite(tmp_path, [f"open({str(first)!r}, 'w')"], blocked_and_sent)
    try:
        stopped_before(proc, lines, signal.SIGTERM, 1, 1, first)
    finally:
        end_all(proc)


@pytest.mark.skipif(not hasattr(os, "killpg"), reason="signals process groups")
def test_sigint_interrupts_the_pass_of_a_bootstrap_started_with_it_blocked(tmp_path):
    # The pass inherits bootstrap's mask: a SIGINT passed on to a pass that holds it back would leave it
    # (pytest, its workers) running, and bootstrap waiting for it.
    blocked = "import signal; signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})\n"
    proc, lines = start_suite(tmp_path, [WAITING_PASS], blocked)
    left: list[int] = []
    try:
        left.append(pid_of(read_until(lines, "pass: running")[-1]))
        proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"bootstrap still runs 10 s after SIGINT: {state(proc.pid)}; the pass: {state(left[0])}"
            ) from None
        assert code == 128 + signal.SIGINT
        assert read_until(lines, None, timeout=10) == [
            "pass: KeyboardInterrupt",
            "bootstrap: SIGINT in pass 1 of 1; the suite stops there (status 130)",
        ]
        assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, [])  # this process's is untouched
    finally:
        end_all(proc, *left)


def start_bootstrap(tmp_path: Path, argv: list[str], prelude: str) -> tuple[subprocess.Popen, queue.Queue]:
    """bootstrap's main on `argv` in a process of its own, as `bootstrap.py ARGV` run by a caller that
    did `prelude` before it, with a stand-in environment (fake_venv) whose pip succeeds; and the lines
    of its stderr (what it hands over to writes there too), then None."""
    venv = fake_venv(tmp_path)
    script = bootstrap_script(tmp_path / "bootstrap_main.py", prelude, f"main({argv!r})")
    env = {**os.environ, "WOK_VENV": str(venv), "FAKE_PIP": "ok", "PYTHONUNBUFFERED": "1"}
    env.pop("WOK_TORCH", None)
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    return proc, lines_of(proc.stderr)


# A caller (a runner, a process manager) that starts bootstrap with the signals it passes on blocked, a
# leftover of its own signal handling, and SIGHUP ignored too, as under nohup; a hang-up has come since.
BLOCKED_CALLER = textwrap.dedent(
    """
    import os, signal
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT})
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    os.kill(os.getpid(), signal.SIGHUP)  # pending: a blocked signal is kept, ignored or not
    """
)


@pytest.mark.skipif(not hasattr(os, "killpg"), reason="signals process groups")
@pytest.mark.parametrize("argv", [["serve", "--port", "0"], ["test", "-q"]])
def test_what_bootstrap_hands_over_to_gets_the_signals_its_caller_blocked_and_a_sigterm_ends_it(tmp_path, argv):
    # `wok serve` (or pytest) runs in bootstrap's place, with its mask: with SIGTERM blocked, a process
    # manager's stop would never reach wok's staged shutdown, and the server would run on.
    proc, lines = start_bootstrap(tmp_path, argv, BLOCKED_CALLER)
    try:
        said = read_until(lines, "handed over:")[-1]
        what = ["-m", "wok", *argv] if argv[0] == "serve" else ["-m", "pytest", *argv[1:]]
        _, blocked, ignored = (part.split() for part in said.split("|"))
        assert not {"SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGTSTP"} & set(blocked), said
        assert "SIGHUP" in ignored, said  # as nohup set it: the hang-up that came meanwhile ended nothing
        assert said.startswith(f"handed over: {' '.join(what)} |"), said
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still runs 10 s after SIGTERM: {state(proc.pid)}") from None
        assert code == -signal.SIGTERM
    finally:
        end_all(proc)


@pytest.mark.skipif(not hasattr(os, "killpg"), reason="signals process groups")
def test_a_suite_pass_gets_the_signals_its_caller_blocked_and_ignored_unblocked_and_still_ignored(tmp_path):
    # As `test ARGS` and `serve` (above): a pass left with SIGINT blocked hands it on blocked to every
    # process it starts, and a `wok serve` a test starts, whose own handler takes SIGINT, never sees one.
    ignored_too = BLOCKED_CALLER + "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
    says_its_mask = textwrap.dedent(
        """
        import signal, sys
        blocked = sorted(signal.Signals(s).name for s in signal.pthread_sigmask(signal.SIG_BLOCK, []))
        ignored = sorted(s.name for s in signal.Signals if signal.getsignal(s) is signal.SIG_IGN)
        print("pass | blocked:", *blocked, "| ignored:", *ignored, file=sys.stderr, flush=True)
        """
    )
    proc, lines = start_suite(tmp_path, [says_its_mask], ignored_too)
    try:
        said = read_until(lines, "pass |")[-1]
        _, blocked, ignored = (part.split() for part in said.split("|"))
        assert not {"SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGTSTP"} & set(blocked), said
        assert {"SIGINT", "SIGHUP"} <= set(ignored), said
        assert proc.wait(timeout=30) == 0
    finally:
        end_all(proc)


# For start_bootstrap's prelude: bootstrap's process sends itself SIGNUM as it calls FUNCTION (a name
# in BOOTSTRAP's code), just before FUNCTION's own code runs.
SENDS_ITSELF_IN = textwrap.dedent(
    """
    import os, sys
    def calls(frame, event, arg):
        if frame.f_code.co_name == FUNCTION and frame.f_code.co_filename == BOOTSTRAP and not sent:
            sent.append(True)
            os.kill(os.getpid(), SIGNUM)
    sent = []
    sys.settrace(calls)
    """
)


@pytest.mark.skipif(not hasattr(os, "killpg"), reason="signals process groups")
@pytest.mark.parametrize(
    ("caller", "function", "signum"),
    [
        (BLOCKED_CALLER, "hand_over", signal.SIGTERM),  # pending, blocked, since bootstrap stopped passing it on
        (BLOCKED_CALLER, "hand_over", signal.SIGINT),
        ("", "__exit__", signal.SIGTERM),  # Forwarding's handler takes it as bootstrap stops passing them on
    ],
    ids=["pending-SIGTERM", "pending-SIGINT", "recorded-SIGTERM"],
)
def test_a_signal_that_comes_after_installing_ends_bootstrap_with_one_line_before_the_hand_over(
    tmp_path, caller, function, signum
):
    prelude = caller + f"import signal\nFUNCTION, SIGNUM, BOOTSTRAP = {function!r}, {int(signum)}, {str(BOOTSTRAP)!r}\n"
    proc, lines = start_bootstrap(tmp_path, ["serve", "--port", "0"], prelude + SENDS_ITSELF_IN)
    try:
        first = lines.get(timeout=30)  # a hand-over with the signal still pending would say so first
        name, status = signal.Signals(signum).name, 128 + signum
        cmd = f"{tmp_path / 'venv' / 'bin' / 'python'} -m wok serve --port 0"
        where = "after installing, before serve" if function == "__exit__" else f"before {cmd}"
        assert first == f"bootstrap: {name} {where}; nothing was run (status {status})"
        assert proc.wait(timeout=10) == status
        assert read_until(lines, None, timeout=10) == []
    finally:
        end_all(proc)
