"""A signal once a `wok` command has returned its status (server/entry.py, `_ExitSignals`). Python's exit then joins
what is left running: a python model's own helper thread, not a daemon, in `wok profile` or `wok serve`. Ignored from
the return on (46f78cc; `wok serve` from its loop's end, 51965ea), Ctrl-C and SIGTERM did nothing there: the process
never ended but by SIGKILL. Now one leaves at once with
the command's status and its output, as one in the interpreter's teardown after (tests/bench/test_signal_after_ramp.py)
still keeps them."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading

import pytest

from ..conftest import write_python_model

pytestmark = pytest.mark.timeout(120)

# Its helper thread says when Python's exit has begun (the main thread ended: threading's shutdown, which joins it),
# then waits for good.
LINGERING = """
import os
import threading

from torch import nn


def _linger() -> None:
    threading.main_thread().join()
    os.write(2, b"helper: the exit joins me\\n")
    threading.Event().wait()


def build() -> nn.Module:
    threading.Thread(target=_linger, name="helper").start()
    return nn.Identity()
"""

# The console script, with the signals as Python's defaults have them: the test runner may have started with SIGINT
# ignored, which its children inherit, and a signal ignored at the start stays so.
_SCRIPT = """
import signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.signal(signal.SIGTERM, signal.SIG_DFL)
from wok.entry import main
sys.argv = ["wok", *sys.argv[1:]]
sys.exit(main())
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_signal_ends_an_exit_held_by_a_thread_left_running(tmp_path, sig):
    write_python_model(tmp_path / "lingering", LINGERING)
    cmd = [sys.executable, "-c", _SCRIPT, "profile", "--model-repository", str(tmp_path), "lingering"]
    cmd += ["--batch-sizes", "1,2", "--warmup", "1", "--repeats", "3", "--device", "cpu"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        err = []
        for line in proc.stderr:
            err.append(line)
            if line == "helper: the exit joins me\n":
                break
        else:
            raise AssertionError(f"the profile ended before its exit joined the helper:\n{''.join(err)[-3000:]}")
        proc.send_signal(sig)
        try:
            out, rest = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{sig.name} did not end the exit held by the helper thread") from None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    err = "".join(err) + rest
    assert proc.returncode == 0, (proc.returncode, err[-3000:])
    assert "wok profile lingering on cpu" in out and "fit on per-size medians" in out, out[-3000:]
    assert "Traceback" not in err and "interrupted" not in err, err[-3000:]


class _Lines:
    """A child's stderr read on a thread of its own, so that every wait on a line is bounded."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self.seen: list[str] = []
        self._new = threading.Condition()
        self._ended = False
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            with self._new:
                self.seen.append(line)
                self._new.notify_all()
        with self._new:
            self._ended = True
            self._new.notify_all()

    def wait_for(self, start: str, timeout: float) -> None:
        """Until a line starting with `start` has come; a failure if none within `timeout` s, or the output ended."""

        def seen() -> bool:
            return any(line.startswith(start) for line in self.seen)

        with self._new:
            if not self._new.wait_for(lambda: seen() or self._ended, timeout) or not seen():
                raise AssertionError(f"no line starting {start!r} within {timeout} s:\n{''.join(self.seen)[-3000:]}")

    def text(self) -> str:
        """Everything said, once the child has exited: its last lines read first."""
        self._reader.join(10)
        with self._new:
            return "".join(self.seen)


# LINGERING's model, failing its warm-up: the start fails (a warm-up error: exit 2), then the exit joins the helper.
FAILING_WARM_UP = LINGERING.replace(
    "return nn.Identity()",
    "class Broken(nn.Module):\n        def forward(self, x):\n            raise RuntimeError('test: broken')\n\n"
    "    return Broken()",
)
assert FAILING_WARM_UP != LINGERING


def _signal_the_held_exit(folder, model: str, sig: signal.Signals, stop: bool) -> tuple[int, str]:
    """`wok serve` of `model` (stopped by a SIGTERM once serving, where `stop`), then `sig` once its exit joins the
    model's helper thread: the exit status and stderr."""
    write_python_model(folder / "lingering", model)
    cmd = [sys.executable, "-c", _SCRIPT, "serve", "--model-repository", str(folder), "--port", "0"]
    cmd += ["--metrics-port", "-1", "--grace-period", "5"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines = _Lines(proc)
    try:
        if stop:
            lines.wait_for("wok: serving lingering on ", 60)
            proc.send_signal(signal.SIGTERM)
            lines.wait_for("wok: SIGTERM received, stopping\n", 30)
        lines.wait_for("helper: the exit joins me\n", 60)  # the stop has run and returned: Python's exit joins it
        proc.send_signal(sig)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{sig.name} did not end the exit held by the helper thread") from None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, lines.text()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_signal_after_wok_serve_drained_ends_an_exit_held_by_a_thread_left_running(tmp_path, sig):
    # `wok serve` ignored every signal once its loop had closed (_StopSignal.after_loop, SIG_IGN): a served model's
    # own thread, joined by Python's exit, held the stopped server for good, but for SIGKILL.
    status, err = _signal_the_held_exit(tmp_path, LINGERING, sig, stop=True)
    assert status == 0, (status, err[-3000:])  # the drain's status (README: a stop exits 0)
    assert "Traceback" not in err and "second signal" not in err, err[-3000:]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_signal_after_a_failed_wok_serve_start_leaves_with_the_starts_status(tmp_path, sig):
    # The failed start's exit was held by the helper as a stop's was, signals ignored alike.
    status, err = _signal_the_held_exit(tmp_path, FAILING_WARM_UP, sig, stop=False)
    assert status == 2, (status, err[-3000:])  # a warm-up error's (README)
    assert any(x.startswith("wok: ") and "test: broken" in x for x in err.splitlines()), err[-3000:]
    assert "Traceback" not in err, err[-3000:]


# An error of wok's own (here a BaseException out of the model's build(), which no start failure catches): a
# traceback and status 1. An object of the model's, torn down with its module as the interpreter finalizes, says so
# and holds that teardown for 3 s.
ERROR_OF_ITS_OWN = """
import os
import sys
import time


class Boom(BaseException):
    pass


class _TornDownLate:
    def __del__(self):
        if sys.is_finalizing():
            os.write(2, b"model: torn down\\n")
            time.sleep(3)


_late = _TornDownLate()


def build():
    raise Boom("test: boom")
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_signal_as_wok_serve_tears_down_after_an_error_of_its_own_keeps_its_status(tmp_path, sig):
    # The error never returned to wok.entry, whose teardown ignored only the handlers it had taken: `wok serve`'s
    # own, a Python handler, the interpreter's finalization put back to the default action, and the signal killed
    # the process by it (status -2 or -15, no word), where it was ignored until 9ec7351.
    write_python_model(tmp_path / "boom", ERROR_OF_ITS_OWN)
    cmd = [sys.executable, "-c", _SCRIPT, "serve", "--model-repository", str(tmp_path), "--port", "0"]
    cmd += ["--metrics-port", "-1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines = _Lines(proc)
    try:
        lines.wait_for("model: torn down\n", 60)
        proc.send_signal(sig)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = lines.text()
    assert proc.returncode == 1, (proc.returncode, err[-3000:])
    assert "Traceback" in err and "Boom: test: boom" in err, err[-3000:]


# The console script, with a signal raised the moment `wok serve` has handed its signals back from the loop
# (`_StopSignal.after_loop`): the one place a signal can be put at will in that moment.
_SIGNAL_AFTER_LOOP = _SCRIPT.replace(
    "from wok.entry import main",
    "from wok.entry import main, set_grpc_defaults\n"
    "set_grpc_defaults()\n"
    "import wok.__main__ as serve\n"
    "after_loop = serve._StopSignal.after_loop\n"
    "def signalled(self, status):\n"
    "    after_loop(self, status)\n"
    "    signal.raise_signal(signal.SIGTERM)\n"
    "serve._StopSignal.after_loop = signalled",
)
assert _SIGNAL_AFTER_LOOP != _SCRIPT


def test_a_signal_as_a_failed_start_ends_leaves_with_its_line_said(tmp_path):
    # The failed start's line was printed after `after_loop`, from which a signal leaves at once: status 2 and no
    # word of why.
    write_python_model(tmp_path / "broken", FAILING_WARM_UP)
    cmd = [sys.executable, "-c", _SIGNAL_AFTER_LOOP, "serve", "--model-repository", str(tmp_path), "--port", "0"]
    cmd += ["--metrics-port", "-1"]
    try:
        proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        raise AssertionError("the signal after the loop did not end the exit held by the helper thread") from None
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    said = [x for x in proc.stderr.splitlines() if x.startswith("wok: ") and "test: broken" in x]
    assert said, proc.stderr[-3000:]


# The console script on the loop named first (uvloop, `wok serve`'s own, or asyncio's where uvloop is missing), with
# the signal named second raised the moment the loop has closed (asyncio.run's last step): as one sent then would come.
_SIGNAL_AS_THE_LOOP_CLOSES = _SCRIPT.replace(
    "from wok.entry import main",
    """from wok.entry import main, set_grpc_defaults
set_grpc_defaults()
import asyncio
import wok.__main__ as serve
loop_kind, sig = sys.argv.pop(1), signal.Signals[sys.argv.pop(1)]
pick_loop = serve._pick_loop


def picked():
    if loop_kind == "uvloop":
        pick_loop()
    policy = asyncio.get_event_loop_policy()
    new_loop = policy.new_event_loop

    def closing_signalled():
        loop = new_loop()
        close = loop.close

        def closed():
            close()
            signal.raise_signal(sig)

        loop.close = closed
        return loop

    policy.new_event_loop = closing_signalled


serve._pick_loop = picked""",
)
assert _SIGNAL_AS_THE_LOOP_CLOSES != _SCRIPT


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_a_signal_as_wok_serves_loop_closes_leaves_with_the_stops_status(tmp_path, loop, sig):
    # The loop's close leaves its signals as it likes, wok's handler back only after it: uvloop kept its own, which
    # does nothing (the signal lost, the exit then held by the helper until a second one); asyncio's put the defaults
    # back (SIGTERM killed the process by the signal, -15; SIGINT said "wok: interrupted", status 130, and the exit
    # hung on the helper).
    write_python_model(tmp_path / "lingering", LINGERING)
    cmd = [sys.executable, "-c", _SIGNAL_AS_THE_LOOP_CLOSES, loop, sig.name, "serve"]
    cmd += ["--model-repository", str(tmp_path), "--port", "0", "--metrics-port", "-1", "--grace-period", "5"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines = _Lines(proc)
    try:
        lines.wait_for("wok: serving lingering on ", 60)
        proc.send_signal(signal.SIGTERM)
        lines.wait_for("wok: SIGTERM received, stopping\n", 30)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{sig.name} as the loop closed did not end the exit") from None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = lines.text()
    assert proc.returncode == 0, (proc.returncode, err[-3000:])  # the drain's
    # Left at the signal, before Python's exit began.
    assert "helper: the exit joins me" not in err and "interrupted" not in err, err[-3000:]
    assert "Traceback" not in err and "second signal" not in err, err[-3000:]


# ERROR_OF_ITS_OWN's error, with LINGERING's helper, which, once the exit joins it, sends SIGTERM to itself: handed to
# a thread that is not the main one, whose join the signal cannot wake.
LINGERING_AFTER_AN_ERROR = """
import os
import signal
import threading


class Boom(BaseException):
    pass


def _linger() -> None:
    threading.main_thread().join()
    os.write(2, b"helper: the exit joins me\\n")
    signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
    threading.Event().wait()


def build():
    threading.Thread(target=_linger, name="helper").start()
    raise Boom("test: boom")
"""


def test_a_signal_to_another_thread_ends_an_exit_held_after_an_error_of_wok_serves_own(tmp_path):
    # The error never returned to wok.entry, whose `_ExitSignals` (a thread woken through the signals' wakeup fd) was
    # never armed: `wok serve`'s own handler, a Python one, runs on the main thread alone, which slept on in its join.
    write_python_model(tmp_path / "boom", LINGERING_AFTER_AN_ERROR)
    cmd = [sys.executable, "-c", _SCRIPT, "serve", "--model-repository", str(tmp_path), "--port", "0"]
    cmd += ["--metrics-port", "-1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines = _Lines(proc)
    try:
        lines.wait_for("helper: the exit joins me\n", 60)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            raise AssertionError("the signal to the helper thread did not end the exit it held") from None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = lines.text()
    assert proc.returncode == 1, (proc.returncode, err[-3000:])  # Python's, after a traceback
    assert "Traceback" in err and "Boom: test: boom" in err, err[-3000:]


# The console script with the command replaced by one that starts a helper thread (as LINGERING_AFTER_AN_ERROR's) and
# then leaves as the argument says: a KeyboardInterrupt before the command's own guard, an error of its own, a
# SystemExit.
_LEAVING = _SCRIPT.replace(
    "from wok.entry import main",
    """from wok.entry import main, set_grpc_defaults
set_grpc_defaults()
import os
import threading
import wok.__main__ as command
how = sys.argv.pop(1)


def _linger():
    threading.main_thread().join()
    os.write(2, b"helper: the exit joins me\\n")
    signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
    threading.Event().wait()


class Boom(Exception):
    pass


def leaving(held=None):
    threading.Thread(target=_linger, name="helper").start()
    if how == "interrupted":
        raise KeyboardInterrupt
    if how == "error":
        raise Boom("test: boom")
    sys.exit(3)


command.main = leaving""",
)
assert _LEAVING != _SCRIPT


@pytest.mark.parametrize(("how", "status"), [("interrupted", 130), ("error", 1), ("exit", 3)])
def test_every_way_out_of_a_wok_command_arms_the_exits_signals(how, status):
    # Only a status returned armed `_ExitSignals`: an exit held by a thread left running then ended at a signal only
    # where the kernel handed it to the main thread (the KeyboardInterrupt's "wok: interrupted" path, 130, too).
    proc = subprocess.Popen([sys.executable, "-c", _LEAVING, how], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        raise AssertionError(f"the signal to the helper thread did not end the exit it held:\n{err[-3000:]}") from None
    err = err.decode()
    assert proc.returncode == status, (proc.returncode, err[-3000:])
    assert "helper: the exit joins me" in err, err[-3000:]
    if how == "error":
        assert "Traceback" in err and "Boom: test: boom" in err, err[-3000:]
    if how == "interrupted":
        assert err.startswith("wok: interrupted\n"), err[-3000:]


# The console script on the loop named first.
_ON_LOOP = _SCRIPT.replace(
    "from wok.entry import main",
    """from wok.entry import main, set_grpc_defaults
set_grpc_defaults()
import wok.__main__ as serve
if sys.argv.pop(1) == "asyncio":
    serve._pick_loop = lambda: None""",
)
assert _ON_LOOP != _SCRIPT

# A model whose helper thread, at a line on stdin, sends SIGTERM to itself: a signal the kernel hands to a thread other
# than the main one, as it may one sent to the process.
SIGNALLED_ON_ITS_THREAD = """
import signal
import sys
import threading

from torch import nn


def _signal() -> None:
    sys.stdin.readline()
    signal.pthread_kill(threading.get_ident(), signal.SIGTERM)


def build() -> nn.Module:
    threading.Thread(target=_signal, name="helper").start()
    return nn.Identity()
"""


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_a_signal_handed_to_another_thread_stops_an_idle_wok_serve(tmp_path, loop):
    # `wok serve`'s handler is a Python one (the loop's own, until 2026-12-07, were lost as it closed), run by the main
    # thread alone: the loop, asleep in its poll, must wake for it. (A serving loop wakes about every 10 ms of itself,
    # for gRPC: this holds with or without the wakeup fd `_StopSignal.bind` sets under asyncio's loop.)
    returncode, err = _serve_then_signal_on_its_thread(tmp_path, loop, SIGNALLED_ON_ITS_THREAD)
    assert returncode == 0, (returncode, err[-3000:])
    assert "wok: SIGTERM received, stopping\n" in err, err[-3000:]
    assert "Traceback" not in err, err[-3000:]


def _serve_then_signal_on_its_thread(tmp_path, loop: str, model: str) -> tuple[int, str]:
    """`wok serve` on `loop` of one python model (`model`'s source) whose helper thread signals once told to by a
    line on stdin, sent as the server serves: the exit status and stderr."""
    write_python_model(tmp_path / "signalled", model)
    cmd = [sys.executable, "-c", _ON_LOOP, loop, "serve", "--model-repository", str(tmp_path), "--port", "0"]
    cmd += ["--metrics-port", "-1"]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines = _Lines(proc)
    try:
        lines.wait_for("wok: serving signalled on ", 60)
        proc.stdin.write("signal\n")
        proc.stdin.close()
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, lines.text()


# SIGNALLED_ON_ITS_THREAD's helper sending two SIGTERMs, both before the main thread can run again: a thread that has
# just taken the GIL keeps it for the switch interval (made long for the moment: a thread waiting asks for it only once
# that much has passed), and neither signal lets it go.
SIGNALLED_TWICE_TOGETHER = """
import signal
import sys
import threading
import time

from torch import nn


def _signal() -> None:
    sys.stdin.readline()
    interval = sys.getswitchinterval()
    sys.setswitchinterval(30)
    time.sleep(0.01)  # the GIL let go, and taken back under the long interval
    signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
    signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
    sys.setswitchinterval(interval)


def build() -> nn.Module:
    threading.Thread(target=_signal, name="helper").start()
    return nn.Identity()
"""


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_two_sigterms_that_arrive_together_count_once(tmp_path, loop):
    # Python keeps one pending mark per signal for its handler, which runs on the main thread: signals that arrive
    # before that thread runs again reach it once (README: a drain, not the second signal's exit). The loops' own
    # handlers, until 2026-12-07, counted each byte of the wakeup fd: this exited 1 without draining.
    returncode, err = _serve_then_signal_on_its_thread(tmp_path, loop, SIGNALLED_TWICE_TOGETHER)
    assert returncode == 0, (returncode, err[-3000:])
    assert "wok: SIGTERM received, stopping\n" in err and "second signal" not in err, err[-3000:]
    assert "Traceback" not in err, err[-3000:]


# A model whose build, on the executor's thread, sends SIGTERM to that thread, then takes a minute more.
SIGNALLED_AS_IT_BUILDS = """
import signal
import threading
import time


def build():
    signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
    time.sleep(60)
"""


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_a_signal_handed_to_another_thread_stops_a_wok_serve_building_its_models(tmp_path, loop):
    # While the models build the loop has nothing of its own to wake it (no gRPC yet): asleep in its poll, only the
    # signals' wakeup fd wakes it for the main thread's handler. Without the one `_StopSignal.bind` sets under asyncio's
    # loop, the stop waited for the build's end (here a minute).
    write_python_model(tmp_path / "signalled", SIGNALLED_AS_IT_BUILDS)
    cmd = [sys.executable, "-c", _ON_LOOP, loop, "serve", "--model-repository", str(tmp_path), "--port", "0"]
    cmd += ["--metrics-port", "-1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines = _Lines(proc)
    try:
        lines.wait_for("wok: stopped by a signal before serving\n", 40)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = lines.text()
    assert proc.returncode == 0, (proc.returncode, err[-3000:])
    assert "wok: SIGTERM received, stopping\n" in err and "Traceback" not in err, err[-3000:]


# The console script with a command that, as bench/cli.py's does, has put its handlers back (SIGINT's is Python's
# default, which raises) and returns 3: a Ctrl-C then, raised by a trace hook as `_ExitSignals.returned` reads the
# first handler, before it has armed any.
_INTERRUPTED_AS_THE_EXIT_ARMS = _SCRIPT.replace(
    "from wok.entry import main",
    """from wok.entry import main, set_grpc_defaults
set_grpc_defaults()
import wok.__main__ as command


def _ctrl_c_at_getsignal(frame, event, arg):
    if event == "call" and frame.f_code.co_name == "getsignal" and frame.f_code.co_filename == signal.__file__:
        sys.settrace(None)
        signal.raise_signal(signal.SIGINT)


def returning(held=None):
    print("result", flush=True)
    sys.settrace(_ctrl_c_at_getsignal)
    return 3


command.main = returning""",
)
assert _INTERRUPTED_AS_THE_EXIT_ARMS != _SCRIPT


def test_a_ctrl_c_as_the_exits_signals_are_armed_keeps_the_commands_status():
    # Seen once under CI's load (a ramp SIGINTed as its verdict printed): a KeyboardInterrupt traceback and death by
    # SIGINT (-2), the run's status lost.
    proc = subprocess.run(
        [sys.executable, "-c", _INTERRUPTED_AS_THE_EXIT_ARMS], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 3, (proc.returncode, proc.stderr[-3000:])
    assert proc.stdout == "result\n" and "Traceback" not in proc.stderr, proc.stderr[-3000:]
