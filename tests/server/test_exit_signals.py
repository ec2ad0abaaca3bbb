"""A signal once a `wok` command has returned its status (server/entry.py, `_ExitSignals`). Python's exit then joins
what is left running: a python model's own helper thread, not a daemon, in `wok profile`. Ignored from the return on
(46f78cc), Ctrl-C and SIGTERM did nothing there: the process never ended but by SIGKILL. Now one leaves at once with
the command's status and its output, as one in the interpreter's teardown after (tests/bench/test_signal_after_ramp.py)
still keeps them."""

from __future__ import annotations

import signal
import subprocess
import sys

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
