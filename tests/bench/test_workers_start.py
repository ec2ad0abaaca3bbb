"""A Ctrl-C while the bench's workers start: a terminal's reaches the whole process group, workers
included, and in a ramp's first second each worker was still importing (numpy, gRPC) before
`_main` ignores SIGINT: each died with a KeyboardInterrupt traceback on the terminal. One that
interrupted the bench while it wrote a worker's spawn data left that worker a truncated pickle
(UnpicklingError, its traceback). Now the signals are held back while a worker starts, and the
worker drops a held Ctrl-C once it ignores it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from multiprocessing.context import SpawnProcess

import pytest

from wok.bench.workers import WorkerPool

STOPS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _mask(pid: int, field: str) -> set[int]:
    """The signals of /proc/PID/status's `field` (SigBlk: blocked, SigIgn: ignored)."""
    with open(f"/proc/{pid}/status") as f:
        line = next(line for line in f if line.startswith(f"{field}:"))
    bits = int(line.split()[1], 16)
    return {n for n in range(1, 65) if bits >> (n - 1) & 1}


def test_a_ctrl_c_as_a_worker_starts_neither_kills_it_nor_stays_held(monkeypatch):
    start = SpawnProcess.start

    def start_then_ctrl_c(self) -> None:
        start(self)
        os.kill(self.pid, signal.SIGINT)  # the worker is only starting Python: a Ctrl-C to the group now

    monkeypatch.setattr(SpawnProcess, "start", start_then_ctrl_c)
    handler = signal.getsignal(signal.SIGINT)
    pool = WorkerPool("127.0.0.1:1", [b""], 2)  # a worker killed by it: EOFError here, as it is not ready
    try:
        assert signal.getsignal(signal.SIGINT) is handler  # this thread: as it was
        assert not _mask(os.getpid(), "SigBlk") & set(STOPS)
        for p in pool._procs:
            assert p.is_alive()
            assert signal.SIGINT in _mask(p.pid, "SigIgn")
            # SIGTERM acts again (terminate() stops a worker whose step is cut), nothing stays blocked.
            assert not _mask(p.pid, "SigBlk") & set(STOPS)
    finally:
        pool.close()


def test_a_ctrl_c_to_the_bench_as_a_worker_starts_is_raised_once_it_has_started(monkeypatch):
    """Not in the middle of the start (the worker's spawn data half written), and not lost."""
    start = SpawnProcess.start
    started = []

    def ctrl_c_then_start(self) -> None:
        signal.raise_signal(signal.SIGINT)  # a Ctrl-C as the start begins
        start(self)
        started.append(self)

    monkeypatch.setattr(SpawnProcess, "start", ctrl_c_then_start)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)  # as the test runner's may not be
    try:
        with pytest.raises(KeyboardInterrupt):
            WorkerPool("127.0.0.1:1", [b""], 2)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, before)
        for p in started:
            try:
                p.terminate()
                p.join(10)
            except ValueError:  # closed as the pool's own processes stopped: ended already
                pass
    assert len(started) == 1  # the first start was whole; the Ctrl-C came before the second


# A script without the main guard: each spawned worker imports it again, and its WorkerPool fails there
# (multiprocessing refuses to start a process while a child bootstraps), so the worker dies at once.
NO_MAIN_GUARD = """
from wok.bench.workers import WorkerPool

pool = WorkerPool("127.0.0.1:1", [bytes(200_000)], 1)
pool.close()
"""


def test_a_worker_that_dies_before_it_has_the_pool_fails_the_start_instead_of_hanging_it(tmp_path):
    """The pool (200 KB here, more than a pipe holds) was in the spawn data, written with the stop
    signals held: the worker died before reading it, and the write waited for good (multiprocessing
    holds the worker's end of that pipe open while it writes), Ctrl-C and SIGTERM held too. Now the
    worker gets the pool on its own pipe once it runs, and its death is the bench's error."""
    script = tmp_path / "ramp.py"
    script.write_text(NO_MAIN_GUARD)
    # The timeout only bounds the hang this was: the start itself takes a second or two.
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("RuntimeError: bench worker ") and last.endswith(
        " died as it tried to start (exit code 1)"
    ), done.stderr[-2000:]
    assert "bootstrapping phase" in done.stderr  # the worker's own reason, from multiprocessing
