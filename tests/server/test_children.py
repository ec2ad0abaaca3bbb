"""server/children.py: a child forked with die_with_parent() ends when the thread that forked it ends."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading

import pytest

from wok.children import die_with_parent

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux's"),
]


def _fork_in_a_thread(**kwargs) -> tuple[subprocess.Popen, threading.Event]:
    """`sleep 60` forked by a thread that ends when the returned event is set."""
    forked: list[subprocess.Popen] = []
    ready, end = threading.Event(), threading.Event()

    def run() -> None:
        forked.append(subprocess.Popen(["sleep", "60"], **kwargs))
        ready.set()
        end.wait()

    threading.Thread(target=run, daemon=True).start()
    assert ready.wait(10)
    return forked[0], end


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_the_child_gets_the_signal_when_its_forking_thread_ends(sig):
    proc, end = _fork_in_a_thread(preexec_fn=die_with_parent(sig))
    try:
        assert proc.poll() is None  # alive while the thread is
        end.set()
        assert proc.wait(10) == -sig
    finally:
        proc.kill()
        proc.wait()


def test_the_default_is_sigterm_and_a_plain_child_runs_on():
    proc, end = _fork_in_a_thread(preexec_fn=die_with_parent())
    plain, plain_end = _fork_in_a_thread()
    try:
        end.set()
        plain_end.set()
        assert proc.wait(10) == -signal.SIGTERM
        with pytest.raises(subprocess.TimeoutExpired):  # nothing tells the plain one to end
            plain.wait(0.5)
    finally:
        for p in (proc, plain):
            p.kill()
            p.wait()
