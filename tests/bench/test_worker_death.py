"""A bench worker that dies mid-step is seen at once, a stream worker honours a cut, a cut step's
requests without an answer never read OK, and a bench killed outright takes its workers with it.

`WorkerPool.finish` used to wait on its workers in order: a worker killed while the ones before it
were still sending was noticed only when their shares ended (up to an hour into a soak step), the
run going on meanwhile at a silently reduced load. Stream workers ignored `cut` and were
terminated after its wait, their measurements lost. A cut step's requests never sent, and those the
cut caught in flight, kept the code their array started with, 0: OK to anyone counting codes.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
import weakref

import numpy as np
import pytest

from wok.bench import workers
from wok.bench.faults import post_fault
from wok.bench.runner import RampConfig, build_pool, status_name
from wok.bench.scrape import scrape
from wok.bench.workers import OK, Share, WorkerPool, WorkerProcesses

STEP_S = 20.0  # planned step length: far longer than any of these tests may take
QPS = 50  # per worker: light, so the loaded machine keeps up


def _answered(metrics_url: str) -> float:
    snap = scrape(metrics_url)
    return snap.get("wok_request_duration_seconds_count", model="mlp") if snap is not None else 0.0


def _until_answered(metrics_url: str, before: float, n: int = 5, timeout_s: float = 15.0) -> None:
    """Return once the server has answered `n` more requests: the step is under way."""
    deadline = time.monotonic() + timeout_s
    while _answered(metrics_url) < before + n:
        assert time.monotonic() < deadline, f"the server answered fewer than {n} requests in {timeout_s:g} s"
        time.sleep(0.05)


def _shares(n_workers: int, start_at: float) -> list[Share]:
    times = np.arange(0, STEP_S, 1.0 / QPS)
    return [Share(start_at, times, np.zeros(len(times), dtype=np.int64), 5.0) for _ in range(n_workers)]


def _pool(bench_server, n: int, **kwargs) -> WorkerPool:
    cfg = RampConfig(target=bench_server.target, models=[("mlp", 1.0)], steps=[QPS], step_duration_s=1)
    pool, _, _ = build_pool(cfg)
    return WorkerPool(cfg.target, pool, n, **kwargs)


def _short_step(workers: WorkerPool, n_workers: int, requests: int = 5) -> list:
    times = np.arange(requests) * 0.01
    shares = [Share(time.monotonic() + 0.05, times, np.zeros(requests, dtype=np.int64), 5.0)] * n_workers
    return workers.run(shares)


def _closed(p) -> bool:
    """Whether `p` was closed as its owner let go of it (`workers._close_ended`, which closes only ended ones, reaped):
    its pid, exit code and is_alive() raise ValueError then."""
    try:
        p.is_alive()
    except ValueError:
        return True
    return False


def _ended(p) -> bool:
    """`p` has ended: reaped (its exit code set) or, let go of, closed."""
    return _closed(p) or p.exitcode is not None


def _codes_as_closed(procs: list) -> list:
    """Each of `procs`' exit code as its owner closes it (unreadable after), filled in as each is; None until then."""
    codes: list = [None] * len(procs)
    for i, p in enumerate(procs):

        def close(i=i, p=p, close=p.close) -> None:
            codes[i] = p.exitcode
            close()

        p.close = close
    return codes


def test_kept_workers_run_each_ramp_afresh_and_a_dead_one_is_replaced(bench_server):
    """WorkerProcesses keeps the workers from one ramp to the next: each ramp's pool and channel are its
    own (sent with each), a worker that died between ramps or was terminated with a step cut short is
    replaced, and `stop` leaves none running."""
    with WorkerProcesses() as processes:
        first = _pool(bench_server, 2, processes=processes)
        pids = [p.pid for p in first._procs]
        assert all(o.codes.tolist() == [OK] * 5 for o in _short_step(first, 2))
        for _ in range(2):  # a refused pool leaves them lent: a second is refused too, not given first's workers
            with pytest.raises(RuntimeError, match="still lent"):
                WorkerPool(bench_server.target, [b""], 1, processes=processes)
        first.close()
        os.kill(pids[1], signal.SIGKILL)
        first._procs[1].join(10)  # dead before the next ramp takes its workers
        second = _pool(bench_server, 2, processes=processes, stoppable=True)
        assert second._procs[0].pid == pids[0] and second._procs[1].pid not in pids
        assert all(o.codes.tolist() == [OK] * 5 for o in _short_step(second, 2))
        second.start(_shares(2, time.monotonic()))  # a 20 s step, left running: close terminates its workers
        second_pids = [p.pid for p in second._procs]
        second.close()
        third = _pool(bench_server, 1, processes=processes)
        assert third._procs[0].pid not in pids + second_pids
        assert all(_closed(p) for p in second._procs)  # terminated, then replaced: released
        (outcome,) = _short_step(third, 1)
        assert outcome.codes.tolist() == [OK] * 5
        third.close()
        kept = list(processes._procs)
    assert kept and all(_closed(p) for p in kept)
    assert not [c for c in multiprocessing.active_children() if c in kept]


def test_a_kept_worker_that_dies_as_a_ramp_looks_at_it_is_replaced(bench_server):
    """A worker killed just as `take` found it alive (its death not yet reaped) was handed the ramp, and the ramp
    failed: "bench worker N died as it tried to start". Its pipe, asked, says it is gone: it is replaced."""
    with WorkerProcesses() as processes:
        first = _pool(bench_server, 2, processes=processes)
        first.close()
        victim = first._procs[1]
        alive = victim.is_alive

        def alive_then_killed() -> bool:
            was = alive()
            if was:
                os.kill(victim.pid, signal.SIGKILL)  # the death lands right after the look
            return was

        victim.is_alive = alive_then_killed
        second = _pool(bench_server, 2, processes=processes)
        assert second._procs[0] is first._procs[0] and second._procs[1] is not victim
        assert all(o.codes.tolist() == [OK] * 5 for o in _short_step(second, 2))
        second.close()
    assert _closed(victim)


def test_a_kept_worker_stopped_between_ramps_is_replaced_within_the_ping_timeout(bench_server, monkeypatch):
    """A worker SIGSTOPped between ramps was taken as alive: the next ramp waited START_TIMEOUT_S (60 s) for it to
    connect, then failed. It does not answer the ramp's ping: killed and replaced within its timeout (5 s; 2 s here,
    as the stopped worker's whole wait is this timeout: the idle one answers in well under a millisecond)."""
    monkeypatch.setattr(workers, "PING_TIMEOUT_S", 2.0)
    with WorkerProcesses() as processes:
        first = _pool(bench_server, 2, processes=processes)
        first.close()
        stopped = first._procs[0]
        os.kill(stopped.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        second = _pool(bench_server, 2, processes=processes)
        took = time.monotonic() - t0
        assert stopped not in second._procs and first._procs[1] in second._procs
        assert _closed(stopped)
        assert took < 20, took  # the ping's wait, a worker's start and its connect
        assert all(o.codes.tolist() == [OK] * 5 for o in _short_step(second, 2))
        second.close()


def _in_ping_wait(thread_id: int) -> bool:
    """Whether thread `thread_id` waits for a kept worker's answer to its ping (`WorkerProcesses.take`)."""
    frame, names = sys._current_frames().get(thread_id), set()
    while frame is not None:
        names.add(frame.f_code.co_name)
        frame = frame.f_back
    return {"_drop_unanswering", "wait"} <= names


def test_a_take_cut_as_it_waits_for_a_ping_leaves_no_answer_for_the_next_ramp(bench_server):
    """A Ctrl-C as `take` waited for a kept worker's answer left the worker kept and its answer unread: the next
    ramp's take read that answer for its own ping, its pool the second answer for the worker's "ready", and the step
    the "ready" for its outcome (AttributeError: 'str' object has no attribute 'balancer'). A worker whose answer
    was not read is killed, however the wait ends."""
    main = threading.main_thread().ident
    with WorkerProcesses() as processes:
        first = _pool(bench_server, 1, processes=processes)
        first.close()
        (slow,) = first._procs
        os.kill(slow.pid, signal.SIGSTOP)  # it answers only once continued, after the take stopped waiting

        def interrupt() -> None:
            deadline = time.monotonic() + 30  # no ping wait seen: no signal, and pytest.raises fails
            while not _in_ping_wait(main):
                if time.monotonic() > deadline:
                    return
                time.sleep(0.01)
            signal.pthread_kill(main, signal.SIGINT)

        interrupter = threading.Thread(target=interrupt)
        interrupter.start()
        try:
            with pytest.raises(KeyboardInterrupt):
                _pool(bench_server, 1, processes=processes)
        finally:
            interrupter.join()
            if not _ended(slow):
                os.kill(slow.pid, signal.SIGCONT)
        second = _pool(bench_server, 1, processes=processes)
        assert [o.codes.tolist() for o in _short_step(second, 1)] == [[OK] * 5]
        assert second._procs[0] is not slow and _closed(slow)
        second.close()


def test_a_ramp_of_fewer_or_more_workers_than_kept_takes_as_many_as_it_asks(bench_server):
    """The count each ramp asks for is the count it runs on: fewer than kept lends the first ones (the others wait,
    kept), more starts the difference; each sends its share."""
    with WorkerProcesses() as processes:
        two = _pool(bench_server, 2, processes=processes)
        pids = [p.pid for p in two._procs]
        two.close()
        one = _pool(bench_server, 1, processes=processes)
        assert [p.pid for p in one._procs] == pids[:1] and len(processes) == 2
        assert [o.codes.tolist() for o in _short_step(one, 1)] == [[OK] * 5]
        one.close()
        three = _pool(bench_server, 3, processes=processes)
        assert [p.pid for p in three._procs][:2] == pids and len(three) == 3
        assert [o.codes.tolist() for o in _short_step(three, 3)] == [[OK] * 5] * 3
        three.close()


class _CtrlCAfterSend:
    """A worker's pipe whose every send is followed by a Ctrl-C to the bench (a real SIGINT, raised in this
    thread as the terminal's would be): one that lands between two of `close`'s sends."""

    def __init__(self, conn) -> None:
        self._conn = conn

    def send(self, obj) -> None:
        self._conn.send(obj)
        signal.raise_signal(signal.SIGINT)

    def __getattr__(self, name: str):
        return getattr(self._conn, name)


def test_a_ctrl_c_between_the_ramp_end_sends_leaves_no_kept_worker_waiting_for_a_share(bench_server):
    """`close` sends each kept worker its ramp's end in turn. A Ctrl-C after the first left the second still waiting
    for a share, alive: the next ramp's ping read as one killed it (a traceback on the terminal). The pool's workers
    are terminated now, and the next ramp replaces them."""
    with WorkerProcesses() as processes:
        first = _pool(bench_server, 2, processes=processes)
        assert all(o.codes.tolist() == [OK] * 5 for o in _short_step(first, 2))
        borrowed = list(first._procs)
        first._conns[0] = _CtrlCAfterSend(first._conns[0])
        with pytest.raises(KeyboardInterrupt):
            first.close()
        assert [p.exitcode for p in borrowed] == [-signal.SIGTERM] * 2
        second = _pool(bench_server, 2, processes=processes)
        assert not set(second._procs) & set(borrowed)
        assert all(o.codes.tolist() == [OK] * 5 for o in _short_step(second, 2))
        second.close()


def _state(pid: int) -> str:
    """The process's state letter (/proc/PID/stat: R, S, T for stopped, ...)."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def test_stop_continues_a_kept_worker_left_stopped_which_then_exits_on_its_own(bench_server):
    """A worker SIGSTOPped between ramps reads no stop and takes no signal but SIGKILL: `stop` waited 10 s for it,
    then killed it. Continued first, it reads its stop and exits at once, as the others do (exit code 0)."""
    processes = WorkerProcesses().start()
    try:
        first = _pool(bench_server, 2, processes=processes)
        first.close()
        stopped, running = first._procs
        codes = _codes_as_closed([stopped, running])
        os.kill(stopped.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while _state(stopped.pid) != "T":
            assert time.monotonic() < deadline, f"worker {stopped.pid} not stopped: state {_state(stopped.pid)}"
            time.sleep(0.01)
    finally:
        t0 = time.monotonic()
        processes.stop()
        took = time.monotonic() - t0
    assert codes == [0, 0]
    assert took < 5, took  # the join of one that exits on its own; 10 s and a kill before


def test_a_worker_killed_mid_step_raises_at_once_not_at_the_end_of_the_step(bench_server, metrics_url):
    workers = _pool(bench_server, 2)
    try:
        before = _answered(metrics_url)
        workers.start(_shares(2, time.monotonic()))
        _until_answered(metrics_url, before)
        pid = workers._procs[1].pid
        os.kill(pid, signal.SIGKILL)
        killed_at = time.monotonic()
        with pytest.raises(RuntimeError, match=rf"^bench worker {pid} died \(exit code -9\)$"):
            workers.finish()
        took = time.monotonic() - killed_at
    finally:
        workers.close()
    # Worker 0 sends to the end of its 20 s share: waiting on it first would raise only then.
    assert took < 8.0, f"the death of worker 1 was raised {took:.1f} s after the kill"


def test_a_cut_stream_step_hands_back_what_the_stream_workers_measured(bench_server, metrics_url):
    workers = _pool(bench_server, 2, rpc="stream", streams=2, stoppable=True)
    try:
        before = _answered(metrics_url)
        start_at = time.monotonic()
        workers.start(_shares(2, start_at))
        _until_answered(metrics_url, before)
        cut_at = time.monotonic()
        outcomes = workers.cut(10.0)
        took = time.monotonic() - cut_at
    finally:
        workers.close()
    # A stream worker that ignored the stop would keep sending its 20 s share: None after 10 s.
    assert took < 3.0, f"the cut took {took:.1f} s"
    assert all(o is not None for o in outcomes), outcomes
    at = cut_at - start_at
    for o in outcomes:
        assert np.count_nonzero(o.done < at) > 0  # answers from before the cut came back
        assert np.isnan(o.sent[-1])  # the rest of the share was not sent
        sent = np.isfinite(o.sent)
        assert np.all(o.sent[sent] < took + at + 1.0)
        # Requests cut in flight have no answer; every answer came after its send.
        answered = np.isfinite(o.done)
        assert np.all(o.done[answered] >= o.sent[answered])
        assert np.all(np.isnan(o.done[~sent]))


@pytest.fixture(scope="module")
def held_server(start_server_module):
    """A server of this module's own, whose mlp a slow fault can hold (--admin): the session's is not held."""
    return start_server_module("--models", "mlp", "--admin", "--torch-threads", "1")


def _queued(metrics_url: str) -> float:
    snap = scrape(metrics_url)
    return snap.get("wok_queue_depth", model="mlp") if snap is not None else 0.0


@pytest.mark.parametrize("rpc", ["unary", "stream"])
def test_a_cut_steps_requests_never_sent_or_cut_in_flight_never_read_ok(held_server, rpc):
    metrics_url = held_server.wait_for_line("wok: metrics on http://").split("metrics on ")[1]
    admin = metrics_url.removesuffix("/metrics")
    workers = _pool(held_server, 1, stoppable=True, **({"rpc": "stream", "streams": 2} if rpc == "stream" else {}))
    try:
        before = _answered(metrics_url)
        workers.start(_shares(1, time.monotonic()))
        _until_answered(metrics_url, before)
        # Held for 3 s a batch from now on: the requests sent meanwhile are in flight at the cut.
        post_fault(admin, {"model": "mlp", "mode": "slow", "delay_ms": 3000})
        deadline = time.monotonic() + 15.0
        while _queued(metrics_url) < 3:
            assert time.monotonic() < deadline, "no request queued behind the held batch within 15 s"
            time.sleep(0.05)
        (o,) = workers.cut(10.0)
    finally:
        workers.close()
        post_fault(admin, {"model": "mlp", "mode": "off"})
    assert o is not None
    sent, answered = np.isfinite(o.sent), np.isfinite(o.done)
    names = np.array([status_name(c) for c in o.codes])
    # Every code is OK with an answer, CANCELLED sent without one, or NOT_SENT: none reads OK unanswered.
    assert np.all(answered[o.codes == OK]) and np.count_nonzero(o.codes == OK) >= 5
    assert np.all(names[~sent] == "NOT_SENT") and np.count_nonzero(~sent) > 0
    assert np.all(names[sent & ~answered] == "CANCELLED") and np.count_nonzero(sent & ~answered) >= 3
    assert set(names[answered]) == {"OK"}, set(names[answered])


# A bench that makes a pool, starts a long step against the server and says its workers' pids.
_BENCH = """
import sys, time
import numpy as np
from wok.bench.runner import RampConfig, build_pool
from wok.bench.workers import Share, WorkerPool
cfg = RampConfig(target=sys.argv[1], models=[("mlp", 1.0)], steps=[10], step_duration_s=1)
pool, _, _ = build_pool(cfg)
workers = WorkerPool(cfg.target, pool, 2)
times = np.arange(0, 60.0, 0.1)
workers.start([Share(time.monotonic(), times, np.zeros(len(times), dtype=np.int64), 5.0)] * 2)
print(*(p.pid for p in workers._procs), flush=True)
time.sleep(120)
"""


def _running(pid: int) -> bool:
    """Whether `pid` is a live process (an unreaped zombie has ended: it sends nothing)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_the_workers_of_a_bench_killed_outright_stop_sending(bench_server, metrics_url):
    bench = subprocess.Popen([sys.executable, "-c", _BENCH, bench_server.target], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in bench.stdout.readline().split()]
        assert len(pids) == 2, pids
        _until_answered(metrics_url, _answered(metrics_url))
    finally:
        bench.kill()  # SIGKILL: the bench runs no cleanup
        bench.wait()
    # They sent on to the end of their 60 s share, orphans, before they watched for the bench's end.
    deadline = time.monotonic() + 10.0
    while any(_running(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [p for p in pids if _running(p)]
    for p in left:
        os.kill(p, signal.SIGKILL)
    assert not left, f"bench workers {left} outlived the bench that was killed"


SPIN_ON_THE_CUT_SIGNAL = """
import multiprocessing as mp, os, signal, sys, threading

from wok.bench.workers import WorkerProcesses


def spin(stop, ready):
    ready.set()
    while True:
        stop.is_set()  # a worker's poll (until_stopped), as often as it can be


if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    with WorkerProcesses() as processes:
        _, _, stop = processes.take(1)
        hung = 0
        for _ in range(5):
            ready = ctx.Event()
            p = ctx.Process(target=spin, args=(stop, ready))
            p.start()
            ready.wait(60)
            os.kill(p.pid, signal.SIGKILL)  # as close() terminates a worker that did not answer a cut
            p.join()
            clearing = threading.Thread(target=stop.clear, daemon=True)  # the next stoppable ramp's start
            clearing.start()
            clearing.join(5)
            hung += clearing.is_alive()
        processes.give_back()
        print("hung", hung)
        sys.stdout.flush()
        if hung:
            os._exit(0)  # a clear() still waits on the lock the killed process held
"""


def test_a_worker_killed_as_it_reads_the_cut_signal_leaves_the_next_ramps_clear_free(tmp_path):
    """A multiprocessing.Event holds a lock while it is read: a process killed there left it held, and the next
    stoppable ramp's clear() on the same WorkerProcesses waited for good (3 of 5 tries hung, with an Event)."""
    script = tmp_path / "spin.py"
    script.write_text(SPIN_ON_THE_CUT_SIGNAL)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0 and done.stdout.strip() == "hung 0", (done.stdout, done.stderr)


def test_a_worker_killed_as_it_would_not_exit_has_ended_when_the_end_returns(monkeypatch):
    """`_end` killed a worker still alive after its join's wait and returned at once: the worker's exit code read None
    just after (it had not been reaped), and it could still be running. Kept workers waiting for a ramp, never told to
    stop, outlast a short wait; each is killed and reaped before `_end` returns."""
    from wok.bench import workers

    monkeypatch.setattr(workers, "END_WAIT_S", 0.2)
    with WorkerProcesses() as processes:
        _, procs, _ = processes.take(4)
        processes.give_back()
        workers._end(procs)
        assert [p.exitcode for p in procs] == [-signal.SIGKILL] * 4


def test_workers_that_would_not_exit_are_waited_for_together_then_killed(monkeypatch):
    """`_end` waited END_WAIT_S for each worker in turn: N workers that did not exit held it N times as long (a soak's
    held stop, a Ctrl-C there waited for, 10 s a worker). They are all told at once and exit together: one wait.
    Kept workers waiting for a ramp, never told to stop, stand for workers that would not exit."""
    monkeypatch.setattr(workers, "END_WAIT_S", 1.0)
    with WorkerProcesses() as processes:
        _, procs, _ = processes.take(4)
        processes.give_back()
        began = time.monotonic()
        workers._end(procs)
        took = time.monotonic() - began
        assert [p.exitcode for p in procs] == [-signal.SIGKILL] * 4
    assert 1.0 <= took < 2.5, took  # each waited for 1 s in turn: 4 s


def test_stop_terminates_workers_still_lent_and_has_each_ended():
    """Workers lent to a pool never closed may be mid-step, and would read a stop only after their share: `stop`
    terminates them, and each has ended (exit code set) when it returns."""
    processes = WorkerProcesses().start()
    _, procs, _ = processes.take(2)
    codes = _codes_as_closed(procs)
    processes.stop()
    assert codes == [-signal.SIGTERM] * 2
    assert all(_closed(p) for p in procs)
    assert len(processes) == 0


class _CtrlCInJoin:
    """A worker's process whose `at`-th join (or each of those `at` numbers) is met by a Ctrl-C to the bench (a real
    SIGINT, raised in this thread as the terminal's would be) as it begins to wait."""

    def __init__(self, proc, at: int | tuple[int, ...]) -> None:
        self._proc, self._at, self.joins = proc, {at} if isinstance(at, int) else set(at), 0

    def join(self, timeout=None) -> None:
        self.joins += 1
        if self.joins in self._at:
            signal.raise_signal(signal.SIGINT)
        self._proc.join(timeout)

    def __getattr__(self, name: str):
        return getattr(self._proc, name)


def _reaped(pid: int) -> bool:
    """The process is gone, waited for: a killed one not yet reaped stays in /proc as a zombie. (Its `exitcode`
    would reap it as it read it.)"""
    return not os.path.exists(f"/proc/{pid}")


def test_a_ctrl_c_as_the_end_waits_for_the_killed_workers_leaves_none_unreaped(monkeypatch):
    """A Ctrl-C in `_end`'s last wait, for the workers it had just killed, was raised at once: that worker and those
    after it were left unreaped (zombies, their exit code unread). Each is waited for, then the Ctrl-C raised."""
    from wok.bench import workers

    monkeypatch.setattr(workers, "END_WAIT_S", 0.2)
    with WorkerProcesses() as processes:
        _, procs, _ = processes.take(3)
        processes.give_back()
        # Never told to stop, they outlast the first wait and are killed; the Ctrl-C comes in the wait after the kill.
        ending = [_CtrlCInJoin(procs[0], at=2), *procs[1:]]
        with pytest.raises(KeyboardInterrupt):
            workers._end(ending)
        assert ending[0].joins >= 2
        assert [p.pid for p in procs if not _reaped(p.pid)] == []
        assert [p.exitcode for p in procs] == [-signal.SIGKILL] * 3


def test_a_ctrl_c_in_stop_closes_the_pipes_and_leaves_no_worker_unreaped():
    """`stop` closed the workers' pipes only after `_end` returned: a Ctrl-C in its wait left them open. Each pipe
    is closed and each worker waited for, then the Ctrl-C raised."""
    processes = WorkerProcesses().start()
    _, procs, _ = processes.take(2)
    processes.give_back()
    conns = list(processes._conns)
    pids = [p.pid for p in procs]
    processes._procs[0] = _CtrlCInJoin(procs[0], at=1)
    with pytest.raises(KeyboardInterrupt):
        processes.stop()
    assert [c.closed for c in conns] == [True, True]
    assert [pid for pid in pids if not _reaped(pid)] == []
    assert len(processes) == 0


def _open_fds() -> dict[int, str]:
    """This process's open fds, each with what it is."""
    fds = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            fds[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except FileNotFoundError:  # listdir's own, closed by now
            pass
    return fds


class _CtrlCInKill(_CtrlCInJoin):
    """A `_CtrlCInJoin` whose kill is met by a Ctrl-C too, once it has killed it (a second one, as `_end` kills the
    workers past their wait); alive to `_end` whatever it is, for that kill to come."""

    def is_alive(self) -> bool:
        return True

    def kill(self) -> None:
        self._proc.kill()
        signal.raise_signal(signal.SIGINT)


@pytest.mark.parametrize(
    "ctrl_cs",
    [lambda p: _CtrlCInJoin(p, at=(1, 2)), lambda p: _CtrlCInKill(p, at=1)],
    ids=["in-the-wait-after-the-kills", "in-the-kills"],
)
def test_repeated_ctrl_cs_in_stop_leave_no_workers_fds_open_nor_their_frames_held(ctrl_cs):
    """Two Ctrl-Cs as `stop` ended its workers (one in its join, one in the kills or the wait after them): the
    exception `_reap` raised was held by its frame and `_end`'s, a cycle that kept those frames, `stop`'s, and the
    workers' Process objects in them until the next garbage collection, each with its spawn pipe's two fds open; and
    none was closed. With the collector off, as between two collections: every fd back, the Processes let go of."""
    with WorkerProcesses() as warm:  # what multiprocessing opens once, for good (its resource tracker's pipe)
        warm.take(1)
        warm.give_back()
    collecting = gc.isenabled()
    gc.disable()
    try:
        processes = WorkerProcesses().start()
        before = _open_fds()
        _, procs, _ = processes.take(2)
        processes.give_back()
        held = [weakref.ref(p) for p in procs]
        processes._procs[0] = ctrl_cs(procs[0])
        del procs
        try:
            processes.stop()
        except KeyboardInterrupt:
            pass
        else:
            pytest.fail("stop raised no KeyboardInterrupt: the Ctrl-Cs did not come in its waits")
        assert _open_fds() == before
        assert [r() for r in held] == [None, None]
    finally:
        if collecting:
            gc.enable()


def _taken(n: int) -> tuple[WorkerProcesses, list, list]:
    processes = WorkerProcesses().start()
    conns, procs, _ = processes.take(n)
    processes.give_back()
    return processes, conns, procs


def _kill_left(procs: list) -> None:
    for p in procs:  # left running by a failure: not to outlive the test
        if not _ended(p):
            p.kill()
            p.join(10)


def test_a_signal_between_the_stop_words_ends_and_reaps_every_worker():
    """A Ctrl-C as `stop` told its workers to exit, one by one, left them all unreaped, and those not yet told
    waiting for a ramp that never came."""
    processes, conns, procs = _taken(2)

    def interrupted(_word) -> None:
        raise KeyboardInterrupt("SIGINT")  # as the CLI's handler raises it, inside the send

    conns[1].send = interrupted
    try:
        with pytest.raises(KeyboardInterrupt, match="SIGINT"):
            processes.stop()
        assert [_closed(p) for p in procs] == [True, True]
        assert all(c.closed for c in conns)
    finally:
        del conns[1].send
        _kill_left(procs)


def test_a_signal_as_the_workers_are_killed_still_kills_and_reaps_those_after_it(monkeypatch):
    """A second Ctrl-C in `_end`'s kills (the workers past their wait) left the ones after it running, unreaped."""
    processes, _conns, procs = _taken(2)
    monkeypatch.setattr(workers, "END_WAIT_S", 0.1)  # not told to exit: each is past its wait, and killed
    kill = procs[0].kill

    def interrupted() -> None:
        kill()
        raise KeyboardInterrupt("SIGINT")

    procs[0].kill = interrupted
    try:
        with pytest.raises(KeyboardInterrupt, match="SIGINT"):
            workers._end(procs)
        assert [p.exitcode for p in procs] == [-signal.SIGKILL, -signal.SIGKILL]
    finally:
        del procs[0].kill
        _kill_left(procs)
        processes.stop()


def test_a_take_that_fails_closes_the_pipes_of_the_workers_it_started():
    """A Ctrl-C as `take` waited for its second new worker to start: both workers were ended, but their pipes, which
    nothing else holds, were left open until garbage collection."""
    processes = WorkerProcesses().start()
    real = workers._from_worker
    seen: list = []

    def interrupted(conn, process, stage: str) -> object:
        seen.append((conn, process))
        if len(seen) == 2:
            raise KeyboardInterrupt("SIGINT")  # as the CLI's handler raises it, in the wait
        return real(conn, process, stage)

    workers._from_worker = interrupted
    try:
        with pytest.raises(KeyboardInterrupt, match="SIGINT"):
            processes.take(2)
        assert [c.closed for c, _ in seen] == [True, True]
        assert [_closed(p) for _, p in seen] == [True, True]
        assert len(processes) == 0
    finally:
        workers._from_worker = real
        _kill_left([p for _, p in seen])
        processes.stop()


@pytest.mark.parametrize("own", [True, False], ids=["own-processes", "kept-processes"])
def test_a_second_ctrl_c_as_a_failed_pool_ends_its_workers_still_hands_them_back(own):
    """A Ctrl-C as a pool waited for its workers to connect, and a second as it ended them (`_end` raising): the kept
    workers' WorkerProcesses was never handed them back (the next ramp's take refused: "still lent"), and a pool's own
    were never stopped (their pipes left open)."""
    processes = None if own else WorkerProcesses().start()
    real_from, real_end = workers._from_worker, workers._end
    started: list = []

    def from_worker(conn, process, stage: str) -> object:
        if stage == "connect":
            raise KeyboardInterrupt("SIGINT")
        started.append((conn, process))
        return real_from(conn, process, stage)

    def end(procs: list, terminate: bool = False) -> None:
        real_end(procs, terminate)
        raise KeyboardInterrupt("SIGINT again")

    workers._from_worker, workers._end = from_worker, end
    try:
        with pytest.raises(KeyboardInterrupt):
            WorkerPool("127.0.0.1:1", [b""], 2, processes=processes)
        workers._from_worker, workers._end = real_from, real_end
        assert len(started) == 2 and all(_ended(p) for _, p in started)
        if own:
            assert [c.closed for c, _ in started] == [True, True]  # its processes stopped
        else:
            conns, _, _ = processes.take(1)  # handed back, the ended workers replaced
            processes.give_back()
            assert conns[0] not in [c for c, _ in started]
        assert [_closed(p) for _, p in started] == [True, True]  # stopped, or replaced: released
    finally:
        workers._from_worker, workers._end = real_from, real_end
        _kill_left([p for _, p in started])
        if processes is not None:
            processes.stop()
