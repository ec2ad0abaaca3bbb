"""A child a python model forks (`multiprocessing`'s fork context) under a `wok` command: its signals are its own,
not the handlers `wok serve` (server/__main__.py's `_StopSignal`) or a returned command (server/entry.py's
`_ExitSignals`) installed, nor the signals' wakeup fd of the parent's. With them `Process.terminate()` left the child
running (exitcode None after 5 s, ended only by SIGKILL), or, after the command's return, had it exit 0; and the
child's signals were written to its parent's wakeup fd (until e9d49a3 that stopped the serving parent)."""

from __future__ import annotations

import re
import signal
import subprocess
import sys

import numpy as np
import pytest

from ..conftest import write_python_model
from .test_exit_signals import _ON_LOOP, _SCRIPT, _Lines

pytestmark = pytest.mark.timeout(120)

# Forks a child of the fork context twice from a thread of the model's own and terminates it: once the child runs
# its target (told through a pipe), and at once after `start()`, before the child has run anything of its own. Says
# the children's exit codes.
_FORKS = """
import multiprocessing as mp
import os
import sys
import threading
import time

from torch import nn


def _child(conn) -> None:
    conn.send("up")
    time.sleep(60)


def _terminated(wait_until_up: bool):
    ctx = mp.get_context("fork")
    ours, theirs = ctx.Pipe()
    child = ctx.Process(target=_child, args=(theirs,))
    child.start()
    if wait_until_up and ours.poll(30):
        ours.recv()
    child.terminate()
    child.join(5)
    code = child.exitcode
    if code is None:
        child.kill()
        child.join()
    return code


def _fork() -> None:
    WHEN
    codes = [_terminated(True), _terminated(False)]
    os.write(2, f"forker: exit codes {codes}\\n".encode())
    AFTER


def build():
    threading.Thread(target=_fork, name="forker", daemon=DAEMON).start()
    return nn.Identity()
"""

# At a line on stdin, as the server serves; a daemon: the stop does not wait for it.
FORKS_WHEN_TOLD = _FORKS.replace("WHEN", "sys.stdin.readline()").replace("AFTER", "").replace("DAEMON", "True")
# Once Python's exit joins it (the command has returned), then waits for good: the exit held until a signal.
FORKS_AS_THE_EXIT_JOINS = (
    _FORKS.replace("WHEN", "threading.main_thread().join()")
    .replace("AFTER", "threading.Event().wait()")
    .replace("DAEMON", "False")
)


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_a_child_forked_under_wok_serve_ends_at_sigterm_and_the_server_serves_on(tmp_path, loop):
    import tritonclient.grpc as grpcclient

    write_python_model(tmp_path / "forker", FORKS_WHEN_TOLD)
    cmd = [sys.executable, "-c", _ON_LOOP, loop, "serve", "--model-repository", str(tmp_path), "--port", "0"]
    cmd += ["--metrics-port", "-1"]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines = _Lines(proc)
    try:
        lines.wait_for("wok: serving forker on ", 60)
        target = re.search(r"^wok: serving forker on (\S+)$", "".join(lines.seen), re.M).group(1)
        proc.stdin.write("fork\n")
        proc.stdin.flush()
        lines.wait_for("forker: exit codes ", 30)
        said = "".join(lines.seen)
        # Killed by the signal, both: before, neither ended (None) but by SIGKILL.
        assert "forker: exit codes [-15, -15]\n" in said, said[-3000:]
        assert proc.poll() is None and "received" not in said, said[-3000:]  # the children's signals were theirs
        with grpcclient.InferenceServerClient(target) as client:
            given = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
            given.set_data_from_numpy(np.arange(4, dtype=np.float32).reshape(1, 4))
            result = client.infer("forker", [given])
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.arange(4, dtype=np.float32).reshape(1, 4))
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = lines.text()
    assert proc.returncode == 0, (proc.returncode, err[-3000:])
    assert err.count("wok: SIGTERM received, stopping\n") == 1 and "Traceback" not in err, err[-3000:]


def test_a_child_forked_as_a_returned_commands_exit_joins_ends_at_sigterm_and_the_exit_waits(tmp_path):
    write_python_model(tmp_path / "forker", FORKS_AS_THE_EXIT_JOINS)
    cmd = [sys.executable, "-c", _SCRIPT, "profile", "--model-repository", str(tmp_path), "forker"]
    cmd += ["--batch-sizes", "1,2", "--warmup", "1", "--repeats", "3", "--device", "cpu"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = _Lines(proc)
    try:
        lines.wait_for("forker: exit codes ", 90)
        said = "".join(lines.seen)
        # Before: both exited 0, with the command's status (`_ExitSignals._leave`), not by the signal.
        assert "forker: exit codes [-15, -15]\n" in said, said[-3000:]
        # Its exit still held by the model's thread: the children's signals did not end it.
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(0.5)
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out, err = proc.stdout.read(), lines.text()
    assert proc.returncode == 0, (proc.returncode, err[-3000:])
    assert "wok profile forker on cpu" in out, out[-3000:]
    assert "Traceback" not in err and "interrupted" not in err, err[-3000:]
