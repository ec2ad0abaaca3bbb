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
