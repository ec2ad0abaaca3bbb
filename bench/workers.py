"""Load-generator worker processes: each has its own event loop and gRPC channel.

The coordinator sends a worker its share of a step's schedule (intended send times,
which request to send at each); the worker sends each at its time, open loop, whatever
the server is doing, and returns per-request arrays. Times are time.monotonic(), which is
one clock for every process on the machine, so all workers share the step's start.

Requests travel pre-serialized: the worker's gRPC call neither encodes requests nor
decodes responses, so a worker's time goes to keeping the schedule.

Channels are the client library's. `balancer="grpc"` (`wok.clients.channel`): one channel;
a target "a:p,b:p" or a DNS name that resolves to several servers is balanced round robin
with health checking, and calls ending with UNAVAILABLE are retried (unless
`retries=False`). `balancer="wok"` (`wok.clients.balancer`): a channel per replica, power of
two choices, hedging after `hedge_after`, retries on another replica (one attempt only with
`retries=False`) and outlier detection; each outcome then carries the worker's balancer
counters (cumulative). `default_balancer` picks "wok" for several targets or a dns: name,
"grpc" for one server.
"""

from __future__ import annotations

import asyncio
import gc
import math
import multiprocessing as mp
import multiprocessing.connection as mp_connection
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from wok.servertiming import SERVER_TIMING, TIMING_COLUMNS, parse_server_timing
from wok.timers import PreciseSleeper

from .stream_sender import run_share_stream

T = TypeVar("T")

METHOD = "/inference.GRPCInferenceService/ModelInfer"
OK = 0  # grpc.StatusCode.OK's number; others are their own numbers
CANCELLED = 1  # grpc.StatusCode.CANCELLED's: a request a cut caught in flight (no answer came)
# A request of a cut step that was never sent: no gRPC status has a negative number, so none reads as it.
# A code is OK only where an answer said so: the arrays start here, not at 0, which is OK.
NOT_SENT = -1
# The longest message kept per status code (Outcome.details): a server's own words, not a dump.
DETAILS_CHARS = 300
# How often a worker of a stoppable pool looks whether the coordinator cut the step short.
STOP_POLL_S = 0.1


@dataclass
class Share:
    """One worker's part of one step."""

    start_at: float  # time.monotonic() of the step's t = 0
    times: np.ndarray  # intended send offsets, seconds from start_at
    which: np.ndarray  # index into the worker's request pool, per request
    timeout_s: float


@dataclass
class Outcome:
    sent: np.ndarray  # actual send offsets
    done: np.ndarray  # completion offsets
    # gRPC status numbers: OK (0) only for an answer that said so; of a step cut short (a stoppable
    # pool's `cut`), NOT_SENT for a request never sent (`sent` and `done` NaN) and CANCELLED for one
    # the cut caught in flight (`done` NaN).
    codes: np.ndarray
    inflight: np.ndarray  # (offset, requests in flight) at every send and every answer
    balancer: dict | None = None  # the wok balancer's counters so far (wok.balancer/1), or None
    # With server timing: per request, the server's `server-timing` stages in ms (columns in
    # wok.servertiming.TIMING_COLUMNS' order; NaN where no trailer came), else None.
    server_ms: np.ndarray | None = None
    # Per status code other than OK, the message (grpc details) of the first call that ended with
    # it: what the server said when it refused. Empty when every call succeeded (streams: none for
    # a request the sender itself settled, at its deadline or with no stream open).
    details: dict[int, str] = field(default_factory=dict)
    # Per request, the host's share of its send's lag, seconds (`HostShare`, by `SendHostShare`):
    # what the sending thread's waits for a CPU explain of it. NaN where the kernel does not say.
    host_lag: np.ndarray | None = None


class RunQueueClock:
    """The run-queue wait so far (seconds) of the thread that made it: the time it was ready to
    run and had no CPU (/proc/thread-self/schedstat's run_delay, 2 µs a read). NaN where the
    kernel does not report it."""

    def __init__(self) -> None:
        try:
            self._fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            self._fd = -1

    def __call__(self) -> float:
        try:
            return int(os.pread(self._fd, 64, 0).split()[1]) * 1e-9
        except (OSError, IndexError, ValueError):
            return np.nan

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class HostShare:
    """The host's share of each send's lag, the sends of one sender taken in their order: its
    thread's wait for a CPU (run-queue time, `RunQueueClock`) since the previous send, plus what is
    still due of the previous send's share, and at most the lag itself. A stall of the host makes
    every send due meanwhile late, sent together as the sender gets its CPU back: the wait counts
    for each of them, less the time between its intended send and the one before (that is how
    much later it was due), so the sends late only by it are none of the generator's own."""

    def __init__(self) -> None:
        self._share = 0.0  # the previous send's share, seconds
        self._intended = -math.inf  # its intended send time

    def __call__(self, intended: float, lag: float, waited: float) -> float:
        """`intended` (s, the sender's clock), `lag` (s, sent − intended), `waited` (s, for a CPU
        since the previous send; NaN: unknown, as is the result)."""
        if math.isnan(waited):
            self._share, self._intended = 0.0, intended
            return math.nan
        still = max(0.0, self._share - (intended - self._intended))
        self._share, self._intended = min(max(lag, 0.0), still + waited), intended
        return self._share


class SendHostShare:
    """Each send's host share (`HostShare`) from the run-queue wait (`RunQueueClock`) of the thread
    that sends, the sends of one sender taken in their order: what both senders (unary and stream)
    record as `Outcome.host_lag`. Made on the sending thread and called there at each send (the
    clock reads the wait of the thread that made it: another thread's would be no wait of the
    sender's); a call from another thread raises. `clock` (run-queue seconds so far; default the
    thread's `RunQueueClock`) is for a hand-made sequence of waits."""

    def __init__(self, clock: Callable[[], float] | None = None) -> None:
        self._own = clock is None
        self._clock = RunQueueClock() if clock is None else clock
        self._thread = threading.get_ident()
        self._last = self._clock()
        self._share = HostShare()

    def __call__(self, intended: float, sent: float) -> float:
        """The share (s) of the send intended at `intended` and made at `sent` (s, the sender's clock)."""
        if threading.get_ident() != self._thread:
            raise RuntimeError(
                f"SendHostShare: called on thread {threading.get_ident()}, made on {self._thread}: "
                "the run-queue wait read would be another thread's than the sender's"
            )
        intended = float(intended)  # a share's times are numpy scalars: their arithmetic costs more
        now = self._clock()
        share = self._share(intended, float(sent) - intended, now - self._last)
        self._last = now
        return share

    def close(self) -> None:
        if self._own:
            self._clock.close()


async def _run_share(call, pool: list[bytes], share: Share, metadata=None, timing: bool = False, stop=None) -> Outcome:
    """Send the share open loop; with `stop` (a CutFlag) set, stop sending and cancel
    the calls in flight: their `done` is NaN and their code CANCELLED, so that only answers count;
    the requests never sent keep NOT_SENT."""
    n = len(share.times)
    sent = np.full(n, np.nan)
    done = np.full(n, np.nan)
    codes = np.full(n, NOT_SENT, dtype=np.int16)
    host_lag = np.full(n, np.nan)
    host_share = SendHostShare()  # here, on the loop's thread: the one `one` sends from
    server_ms = np.full((n, len(TIMING_COLUMNS)), np.nan) if timing else None
    start = share.start_at
    inflight = 0
    # (offset, requests in flight) at every send and every answer, written in place: a soak sends
    # millions, and a list of tuples held ~200 bytes a request until the end.
    samples = np.empty((2 * n, 2))
    taken = 0
    details: dict[int, str] = {}
    import grpc

    async def one(i: int, payload: bytes) -> None:
        nonlocal inflight, taken
        inflight += 1
        sent[i] = time.monotonic() - start
        host_lag[i] = host_share(share.times[i], sent[i])
        samples[taken] = sent[i], inflight
        taken += 1
        c = None
        cut = False
        try:
            c = call(payload, timeout=share.timeout_s, metadata=metadata)
            await c
            codes[i] = OK
        except grpc.aio.AioRpcError as exc:
            codes[i] = exc.code().value[0]
            if int(codes[i]) not in details:
                details[int(codes[i])] = _short(exc.details() or "")
        except Exception as exc:
            codes[i] = grpc.StatusCode.UNKNOWN.value[0]
            if int(codes[i]) not in details:
                details[int(codes[i])] = _short(f"{type(exc).__name__}: {exc}")
        except asyncio.CancelledError:
            cut = True  # by a stop, in flight: no answer came
            codes[i] = CANCELLED
            raise
        finally:
            now = time.monotonic() - start
            done[i] = np.nan if cut else now
            inflight -= 1
            samples[taken] = now, inflight
            taken += 1
        if timing and codes[i] == OK:  # after `done`: reading the trailer is the generator's own time
            _record_timing(server_ms, i, await c.trailing_metadata())

    loop = asyncio.get_running_loop()
    # The calls in flight only: a finished call's task is let go (it held ~1 KB until the end), its
    # exception, were there one, kept to raise as gather did.
    running: set[asyncio.Task] = set()
    failed: list[BaseException] = []

    def finished(task: asyncio.Task) -> None:
        running.discard(task)
        if not task.cancelled() and task.exception() is not None:
            failed.append(task.exception())

    # Paced on a timerfd (wok.timers): asyncio.sleep on uvloop wakes up to about 1 ms late, and
    # latency is measured from the intended send time, so the generator's lateness would count.
    sleeper = PreciseSleeper(loop)
    to_perf = time.perf_counter() - time.monotonic()  # 0 on Linux: both read CLOCK_MONOTONIC

    async def send_all() -> None:
        for i in range(n):
            await sleeper.until(start + share.times[i] + to_perf)
            task = loop.create_task(one(i, pool[share.which[i]]))
            running.add(task)
            task.add_done_callback(finished)
        if running:
            await asyncio.gather(*running)
        if failed:
            raise failed[0]

    try:
        if stop is None:
            await send_all()
        else:
            if await until_stopped(send_all(), stop):
                # A task cancelled before it began sent nothing: its sent and done stay NaN, its code NOT_SENT.
                cut = list(running)
                for task in cut:
                    task.cancel()
                await asyncio.gather(*cut, return_exceptions=True)
    finally:
        sleeper.close()
        host_share.close()
    return Outcome(sent, done, codes, samples[:taken].copy(), server_ms=server_ms, details=details, host_lag=host_lag)


def _short(message: str) -> str:
    """A status message as kept in Outcome.details: one line, at most DETAILS_CHARS characters."""
    text = " ".join(message.split())
    return text if len(text) <= DETAILS_CHARS else text[: DETAILS_CHARS - 1] + "…"


def merge_details(outcomes) -> dict[int, str]:
    """The workers' Outcome.details together: per code, the first worker's message (one per code)."""
    merged: dict[int, str] = {}
    for outcome in outcomes:
        for code, message in (getattr(outcome, "details", None) or {}).items():
            merged.setdefault(int(code), message)
    return merged


async def until_stopped(sending, stop) -> bool:
    """Await `sending` unless `stop` (a CutFlag) is set first; then cancel it.
    Whether it was stopped; an error of `sending` is raised."""
    task = asyncio.ensure_future(sending)
    try:
        while not task.done():
            if stop.is_set():
                task.cancel()
                await asyncio.wait({task})
                return True
            await asyncio.wait({task}, timeout=STOP_POLL_S)
        task.result()  # its error, if it failed
        return False
    finally:
        task.cancel()  # when this itself is cancelled; a no-op once the task is done


def _record_timing(server_ms: np.ndarray, i: int, trailer) -> None:
    """Row i from the answer's trailer; left NaN (counted as `missing`) when it has none or one
    that does not parse: the call itself succeeded either way."""
    for key, value in trailer or ():
        if key == SERVER_TIMING:
            try:
                stages = parse_server_timing(value)
            except ValueError:
                return
            server_ms[i] = [stages.get(s, np.nan) for s in TIMING_COLUMNS]
            return


def default_balancer(target: str) -> str:
    """The balancer for `target`: wok for several targets ("a:p,b:p") or a dns: name, grpc for one server."""
    return "wok" if "," in target or target.startswith("dns:") else "grpc"


def pick_balancer(balancer: str | None, rpc: str, target: str, replicas: int = 0) -> str:
    """The balancer the workers use: `balancer` if given; else gRPC's for streams (they run on
    one channel), and for the rest `default_balancer`, or wok's for `replicas` ≥ 2 not yet started."""
    if balancer:
        return balancer
    if rpc == "stream":
        return "grpc"
    return "wok" if replicas >= 2 else default_balancer(target)


@dataclass(frozen=True)
class Channel:
    """How a worker reaches the servers: security, retries, and which balancer."""

    tls: object = None
    token: str | None = None
    retries: bool = True
    balancer: str = "grpc"  # "grpc" (round_robin, one channel) or "wok" (wok.clients.balancer)
    hedge_after: float | str | None = "auto"  # the wok balancer's hedge delay (s), "auto" or None
    rpc: str = "unary"  # "unary" (ModelInfer) or "stream" (ModelStreamInfer: wok.bench.stream_sender)
    streams: int = 4  # streams per worker with rpc="stream"
    server_timing: bool = False  # read each answer's server-timing trailer (unary only)


async def _serve(conn, target: str, pool: list[bytes], how: Channel, stop=None, index: int = 0) -> None:
    import grpc

    from wok.clients.channel import (
        auth_metadata,
        channel_authority,
        channel_credentials,
        channel_options,
        channel_target,
        open_channel,
        target_list,
    )

    loop = asyncio.get_running_loop()
    metadata = auth_metadata(how.token)
    # A bench killed outright (SIGKILL, a crash) runs no cleanup, and a daemon worker would send
    # on to the end of its share. The spawn pipe's sentinel reads EOF once the bench is gone,
    # whichever of its threads made the pool (a death signal would follow that thread).
    bench = mp.parent_process()
    if bench is not None:
        loop.add_reader(bench.sentinel, _orphaned)

    async def serve(call, stats) -> None:
        conn.send("ready")
        while True:
            share = await loop.run_in_executor(None, conn.recv)
            if share is None:
                return
            if how.rpc == "stream":
                # Slots numbered on from the workers before this one: the pool's streams are dealt
                # over the servers together, not every worker's from the first server.
                first = index * how.streams
                outcome = await run_share_stream(call, pool, share, metadata, how.streams, stop, first)
            else:
                outcome = await _run_share(call, pool, share, metadata, how.server_timing, stop)
            outcome.balancer = stats()
            conn.send(outcome)

    if how.balancer == "wok":
        from wok.clients.balancer import Balancer, BalancerSettings

        settings = BalancerSettings(max_attempts=3 if how.retries else 1, hedge_after=how.hedge_after)
        async with Balancer(target, credentials=channel_credentials(how.tls), settings=settings) as balancer:
            await serve(balancer.unary_unary(METHOD), balancer.stats)
        return
    # Streams without gRPC's retries: a replay would resend, late, requests already counted
    # (wok.clients.channel); the stream sender replaces a failed stream itself.
    options = channel_options(None, retries=how.retries, stream_retries=how.rpc != "stream")
    if how.rpc == "stream":
        # A channel per server: the stream sender deals its streams across them (one round_robin
        # channel put them all on the server it had connected to first).
        channels = [
            open_channel(grpc.aio, channel_target(t), channel_credentials(how.tls), options, channel_authority(t))
            for t in target_list(target)
        ]
        try:
            await serve(channels, lambda: None)
        finally:
            for c in channels:
                await c.close()
        return
    channel = open_channel(
        grpc.aio, channel_target(target), channel_credentials(how.tls), options, channel_authority(target)
    )
    async with channel:
        await serve(channel.unary_unary(METHOD, request_serializer=None, response_deserializer=None), lambda: None)


def _orphaned() -> None:
    os._exit(1)  # nobody is left to report to, and nothing of the worker's needs flushing


def _main(conn, stop) -> None:
    # Ctrl-C reaches the whole process group; the coordinator decides what it means. Ignored, a
    # Ctrl-C held back since the start (_start_held: blocked, as inherited) is dropped; SIGTERM and
    # SIGHUP take their default again.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _HELD)
    # The worker's own collector pauses would show up as dispatch lag; it allocates little.
    gc.disable()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    try:
        conn.send(STARTED)
    except OSError:
        return
    # One ramp per job (WorkerProcesses keeps a worker for the next): what it sends to and the pool come on
    # the pipe, not with the spawn data (WorkerPool); its channel and loop are the ramp's own. None: stop.
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            return  # the bench stopped, or gave up on this worker, before handing it a ramp
        if job is None:
            return
        if job == PING:
            try:
                conn.send(PING)  # alive, and waiting for a ramp (WorkerProcesses.take)
            except OSError:
                return
            continue
        target, how, index, stoppable, pool = job
        asyncio.run(_serve(conn, target, pool, how, stop if stoppable else None, index))
        del pool, job  # up to 64 MiB, not held while the worker waits for the next ramp
        # Its collector is off for good (above), and the ramp's loop, channel and calls left reference cycles
        # (about 0.3 MB a ramp, kept for the worker's life): freed here, between ramps, where a pause costs nothing.
        gc.collect()


# The signals the bench stops on (cli._signals_interrupt), held back while a worker starts.
_HELD = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# A worker's first word, once it runs `_main`: the pool may be sent.
STARTED = "started"
# How long a worker may take to start (its imports), and then to connect, before the bench gives up.
START_TIMEOUT_S = 60.0
# How long a worker may take to exit, told to stop or terminated, before it is killed.
END_WAIT_S = 10.0
# A kept worker's answer to this, as a ramp takes it (WorkerProcesses.take), says it still reads its pipe.
PING = "ping"
# How long a kept worker may take to answer PING before it is killed and replaced: one idle in its pipe's read
# answers in well under a millisecond, a stopped one (SIGSTOP, a debugger) never; a few seconds cover a loaded host.
PING_TIMEOUT_S = 5.0


def _start_held(process) -> None:
    """`process.start()` with Ctrl-C, SIGTERM and SIGHUP held back until it returns, in this process
    and in the worker. A Ctrl-C at the terminal in a ramp's first second, which reaches the whole
    process group, printed a KeyboardInterrupt traceback per worker, from its imports before `_main`
    ignores it; one that interrupted this process while it handed a worker its spawn data left the
    worker a truncated pickle (UnpicklingError, its traceback).

    The worker inherits this thread's mask, the signals blocked until `_main`. Here a signal
    meanwhile (another thread of the process may take it) is recorded and raised again once the
    start returns, to the handler as it was. Off the main thread, which neither sets handlers nor
    runs them, a plain start."""
    if threading.current_thread() is not threading.main_thread():
        process.start()
        return
    from multiprocessing import resource_tracker

    # Started by the first start otherwise, and that unblocks SIGINT and SIGTERM on its way out.
    resource_tracker.ensure_running()
    with signals_held():
        held = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD)
        try:
            process.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)


# What a signal after a ramp's last step leaves as its result (a soak's says its own: bench/soak.py).
STEPS_KEPT = "the steps run are the result"


@contextmanager
def signals_held(doing: str | None = None, kept: str = STEPS_KEPT) -> Iterator[None]:
    """Ctrl-C, SIGTERM and SIGHUP recorded, not handled, inside; on the way out the handlers are put back and
    the first signal that came is raised again, to the handler as it was (the bench's raises KeyboardInterrupt:
    cli._signals_interrupt), once the work inside is whole. For work that a KeyboardInterrupt raised halfway
    would lose: a step's figures once its answers are in, the result after the last step. Off the main thread,
    which neither sets handlers nor runs them, nothing changes.

    `doing`, for work that may take long (the replicas' stop: up to their grace period and 10 s), names it in a line
    said on stderr as each signal comes: held silently, a Ctrl-C there did nothing to be seen for as long, a second
    one never anything; `kept`, what the result will be, in that line."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[int] = []

    def held(signum, _frame) -> None:
        came.append(signum)
        if doing is not None:
            name = signal.Signals(signum).name
            then = f"waited for, then {kept}" if len(came) == 1 else "the result is written first"
            # os.write, not print: the handler may run inside a print to stderr (cli._Interrupts.on_signal).
            os.write(2, f"wok bench: {name} as {doing}: {then}\n".encode())

    before = {}
    for s in _HELD:
        handler = signal.getsignal(s)
        if handler not in (signal.SIG_IGN, None):  # None: set outside Python, left as it is
            before[s] = signal.signal(s, held)
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
        if came:
            signal.raise_signal(came[0])


def run_held(
    work: Callable[[], T], doing: str | None = None, kept: str = STEPS_KEPT
) -> tuple[T, KeyboardInterrupt | None]:
    """`work()` under `signals_held` (`doing`, `kept`: its words for a signal meanwhile): its value, and the
    KeyboardInterrupt a signal meanwhile raised once it was done (None: none came, or its handler raised nothing),
    for the caller to keep as it sees fit."""
    done = False
    try:
        with signals_held(doing, kept):
            value = work()
            done = True
    except KeyboardInterrupt as exc:
        if not done:  # raised again over a failure of `work`
            raise
        return value, exc
    return value, None


def _died(process, stage: str) -> RuntimeError:
    process.join(1)
    return RuntimeError(f"bench worker {process.pid} died as it tried to {stage} (exit code {process.exitcode})")


def _from_worker(conn, process, stage: str) -> object:
    """The worker's next word as it starts (`stage`: "start", its imports, or "connect", its channel);
    a RuntimeError when it died first or took more than START_TIMEOUT_S."""
    try:
        if not conn.poll(START_TIMEOUT_S):
            raise RuntimeError(f"a bench worker did not {stage} within {START_TIMEOUT_S:g} s")
        return conn.recv()
    except (EOFError, OSError):
        raise _died(process, stage) from None


class CutFlag:
    """The cut signal every worker of a WorkerProcesses reads (WorkerPool.cut): one shared byte, with no lock. A
    multiprocessing.Event holds a lock as it is read, and a worker terminated as it read one (a step cut short)
    left that lock held: the next ramp's clear() then waited for good."""

    def __init__(self, ctx) -> None:
        self._byte = ctx.RawValue("b", 0)

    def is_set(self) -> bool:
        return bool(self._byte.value)

    def set(self) -> None:
        self._byte.value = 1

    def clear(self) -> None:
        self._byte.value = 0


class WorkerProcesses:
    """Bench worker processes kept from one ramp to the next: each start is a spawned interpreter's
    imports (a few tenths of a second per ramp), which a process running many ramps (compare, tune_check,
    the tests) paid for every one. Started and stopped by its owner (`start`/`stop`, or `with`); a
    WorkerPool given it takes its workers from it for one ramp. A worker that died or was terminated
    (a step cut short) is replaced at the next ramp; `stop` leaves none running. Each is closed (`Process.close`) as it
    is let go of, replaced or stopped."""

    def __init__(self) -> None:
        self._ctx = mp.get_context("spawn")  # gRPC does not survive fork
        self._stop = None  # the cut signal (WorkerPool.cut), one for all: only one pool holds them at a time
        self._procs: list = []
        self._conns: list = []
        self._lent = False

    def __enter__(self) -> WorkerProcesses:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> WorkerProcesses:
        if self._stop is None:
            self._stop = CutFlag(self._ctx)
        return self

    def __len__(self) -> int:
        return len(self._procs)

    def take(self, n: int) -> tuple[list, list, object]:
        """`n` live workers, each waiting for a ramp (pipes, processes), and the cut signal; started here
        where fewer are left. Theirs until `give_back`."""
        if self._stop is None:
            raise RuntimeError("WorkerProcesses.take: not started; call start() or use it in a with block")
        if self._lent:
            raise RuntimeError("WorkerProcesses.take: its workers are still lent to a pool not closed")
        self._drop_unanswering()
        new_conns, new_procs = [], []
        try:
            for _ in range(n - len(self._procs)):
                parent, child = self._ctx.Pipe()
                # The pool (up to 64 MiB) is not in the spawn data: the bench writes that with its stop
                # signals held (_start_held), and a worker that died before reading it all (a script
                # without the main guard, which each worker runs again and fails in; an OOM kill)
                # left the write blocked for good (multiprocessing keeps the worker's end of that pipe
                # open while it writes), Ctrl-C and SIGTERM held with it: only SIGKILL ended the bench.
                new_conns.append(parent)
                try:
                    p = self._ctx.Process(target=_main, args=(child, self._stop), daemon=True)
                    new_procs.append(p)
                    _start_held(p)
                finally:
                    child.close()  # the worker's end: with it closed here, a dead worker reads as EOF
            for c, p in zip(new_conns, new_procs):
                if (word := _from_worker(c, p, "start")) != STARTED:
                    raise RuntimeError(f"bench worker {p.pid}'s first word: expected {STARTED!r}; got {word!r}")
        except BaseException:
            # Their pipes too, also when `_end` raises (a second Ctrl-C): no one else holds them, and they were left
            # open until collected.
            try:
                _end(new_procs, terminate=True)
            finally:
                for c in new_conns:
                    c.close()
                _close_ended(new_procs)
            raise
        self._conns += new_conns
        self._procs += new_procs
        self._lent = True
        return self._conns[:n], self._procs[:n], self._stop

    def _drop_unanswering(self) -> None:
        """Kill and forget each kept worker that does not answer PING within PING_TIMEOUT_S: one that died (a
        death as it was asked reads as EOF: `is_alive` alone let one that died just after it through, and the
        ramp failed as that worker "died as it tried to start") or was stopped between ramps (it never answers:
        the ramp waited START_TIMEOUT_S for it to connect, then failed). All asked at once.

        However the wait ends (a Ctrl-C in it too), each one not answered goes: kept, its answer came later, unread,
        and the next ramp's take read it for its own ping, the pool that ping's answer for the worker's "ready", and
        the step the "ready" for its outcome."""
        answered = set()
        try:
            asked = []
            for c, p in zip(self._conns, self._procs):
                if not p.is_alive():
                    continue
                try:
                    c.send(PING)
                    asked.append(c)
                except OSError:  # its end closed: dead
                    pass
            deadline = time.monotonic() + PING_TIMEOUT_S
            waiting = set(asked)
            while waiting and (left := deadline - time.monotonic()) > 0:
                for c in mp_connection.wait(list(waiting), left):
                    waiting.discard(c)
                    try:
                        if c.recv() == PING:
                            answered.add(c)
                    except (EOFError, OSError):
                        pass
        finally:
            for c, p in [(c, p) for c, p in zip(self._conns, self._procs) if c not in answered]:
                p.kill()  # not terminate(): a stopped worker holds SIGTERM pending
                p.join(10)
                c.close()
                self._conns.remove(c)
                self._procs.remove(p)
                _close_ended([p])

    def give_back(self) -> None:
        self._lent = False

    def stop(self) -> None:
        """Stop every worker and wait for them (as WorkerPool.close)."""
        procs, self._procs = self._procs, []
        conns, self._conns = self._conns, []
        try:
            if self._lent:
                # A pool not closed: its workers may be mid-step, and would read the stop only after their share.
                self._lent = False
                _end(procs, terminate=True)
            else:
                told = False
                try:
                    for c in conns:
                        try:
                            c.send(None)
                        except (BrokenPipeError, OSError):
                            pass
                    told = True
                finally:
                    # A signal between the sends (a Ctrl-C) left every worker unreaped, those not yet told waiting
                    # for a ramp that never comes: they are terminated, and each is waited for, the signal raised after.
                    _end(procs, terminate=not told)
        finally:
            # Also when `_end` raises (a Ctrl-C in its wait): taken off self above, they were left open until collected.
            for c in conns:
                c.close()
            _close_ended(procs)


def _end(procs: list, terminate: bool = False) -> None:
    """Wait for `procs` to exit (started ones; with `terminate`, terminated first; a stopped one continued), killing
    those still running END_WAIT_S after the wait began; each has ended (reaped, its exit code set) when this returns.
    A signal meanwhile (Ctrl-C, raised in a join as the workers exit) is raised once those left are killed and reaped:
    not left to send, or to exit on their own while the bench has stopped waiting (nothing of theirs needs flushing:
    `_orphaned`)."""
    procs = [p for p in procs if p.pid is not None]
    try:
        if terminate:
            for p in procs:
                p.terminate()
        # A worker stopped (SIGSTOP, Ctrl-Z to it alone) neither reads its stop nor takes SIGTERM: each cost a 10 s
        # join before its kill. Continued, it does either at once.
        for p in procs:
            if p.exitcode is None:  # not one reaped already: its pid may be another process's by now
                try:
                    os.kill(p.pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
        # One wait for them all: told at once, they exit together. Each waited for END_WAIT_S in turn, N that would
        # not exit held the bench N times as long (a soak's stop, a Ctrl-C there held for it: 10 s a worker).
        deadline = time.monotonic() + END_WAIT_S
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
    finally:
        # Those past their wait, or every one left where a signal cut it short. Waited for after the kill too: its
        # exit code read None just after, the worker not yet reaped.
        interrupted = None
        for p in procs:
            try:
                if p.is_alive():
                    p.kill()  # not terminate(): a stopped worker (SIGSTOP, a debugger) holds SIGTERM pending
            except BaseException as exc:  # a second Ctrl-C: the workers after this one are killed and reaped too
                interrupted = interrupted or exc
        try:
            _reap(procs, interrupted)
        finally:
            interrupted = None  # this frame is on the traceback of what `_reap` raises: held here, a cycle (`_reap`)


def _reap(procs: list, interrupted: BaseException | None = None) -> None:
    """Wait up to END_WAIT_S for each of `procs` (killed: they end at once). A signal in a wait (a second Ctrl-C), or
    `interrupted` (one in the kills before), is raised once each has been waited for: raised at once, it left that
    worker and those after it unreaped."""
    for p in procs:
        for _ in range(3):  # the wait the signal cut short, again: bounded, for a user who keeps pressing Ctrl-C
            try:
                p.join(END_WAIT_S)
                break
            except BaseException as exc:
                interrupted = interrupted or exc
    if interrupted is not None:
        try:
            raise interrupted
        finally:
            # The exception's traceback holds this frame, which held the exception: a cycle, which kept the frames
            # of every caller, their workers' Process objects (and fds) with them, until the next garbage collection.
            interrupted = None


def _close_ended(procs: list) -> None:
    """Release what each of `procs` that has ended still holds (`Process.close`: its spawn pipe's two fds, else open
    until the object is collected), as its owner lets go of it. One still running (a wait cut short by Ctrl-Cs, past
    `_reap`'s bound) is left as it is: close() refuses it."""
    for p in procs:
        if p.pid is None or p.exitcode is not None:  # never started, or ended and reaped (exitcode reaps it)
            p.close()


class WorkerPool:
    """N worker processes for one ramp, each with the same request pool: taken from `processes` (a
    started WorkerProcesses, kept for the next ramp), or started for this ramp alone and stopped by `close`.

    `tls` (a wok.clients.TLS, or True), `token` and `retries` are as for the clients; they
    reach the workers through the spawn pipe, never their command line. `balancer` is
    "grpc" or "wok" (None: `pick_balancer`), `hedge_after` the wok balancer's. A `stoppable`
    pool's step can be cut short by `cut`, which hands back what the workers measured so far.
    """

    def __init__(
        self,
        target: str,
        pool: list[bytes],
        n: int,
        *,
        tls=None,
        token: str | None = None,
        retries: bool = True,
        balancer: str | None = None,
        hedge_after: float | str | None = "auto",
        rpc: str = "unary",
        streams: int = 4,
        server_timing: bool = False,
        stoppable: bool = False,
        processes: WorkerProcesses | None = None,
    ) -> None:
        balancer = pick_balancer(balancer, rpc, target)
        if balancer not in ("grpc", "wok"):
            raise ValueError(f"balancer: expected 'grpc' or 'wok'; got {balancer!r}")
        if rpc not in ("unary", "stream"):
            raise ValueError(f"rpc: expected 'unary' or 'stream'; got {rpc!r}")
        if rpc == "stream" and (balancer != "grpc" or streams < 1):
            raise ValueError("rpc stream needs balancer grpc (one channel) and at least 1 stream per worker")
        if server_timing and (rpc != "unary" or balancer != "grpc"):
            # A stream's answers have no trailers; the wok balancer's calls do not hand theirs on.
            raise ValueError("server timing needs unary calls on balancer grpc")
        self.balancer = balancer
        how = Channel(tls, token, retries, balancer, hedge_after, rpc, streams, server_timing)
        self._stats: list[dict | None] = [None] * n
        self._running = False  # a step handed out and its outcomes not yet collected
        self._got: list[Outcome | None] = [None] * n  # the outcomes of that step received so far
        self._own = processes is None
        self._processes = WorkerProcesses().start() if processes is None else processes
        self._stoppable = stoppable
        self._conns, self._procs = [], []
        taken = False  # handed back on a failure only if taken: a refused take leaves them lent to their pool
        try:
            self._conns, self._procs, self._stop = self._processes.take(n)
            taken = True
            for index, (c, p) in enumerate(zip(self._conns, self._procs)):
                try:
                    c.send((target, how, index, stoppable, pool))
                except OSError:  # a broken pipe: the worker died as it read it
                    raise _died(p, "start") from None
            for c, p in zip(self._conns, self._procs):
                if (word := _from_worker(c, p, "connect")) != "ready":
                    # Else read as a step's outcome, an AttributeError far from its cause.
                    raise RuntimeError(f"bench worker {p.pid}'s word as it connected: expected 'ready'; got {word!r}")
        except BaseException:
            # Terminated, not handed back as they are: a worker may be connecting, its "ready" not yet read. Handed
            # back and the own processes stopped also when `_end` raises (a second Ctrl-C): else the kept ones stayed
            # lent (the next ramp's take refused), and the own ones' pipes open.
            try:
                _end(self._procs, terminate=True)
            finally:
                if taken:
                    self._processes.give_back()
                if self._own:
                    self._processes.stop()
            raise

    def __len__(self) -> int:
        return len(self._conns)

    def run(self, shares: list[Share], on_tick: Callable[[], None] | None = None) -> list[Outcome]:
        """Run one step; `on_tick` is called about every 0.2 s while waiting (for progress)."""
        self.start(shares)
        return self.finish(on_tick)

    def start(self, shares: list[Share]) -> None:
        """Hand each worker its share; they send on schedule from `Share.start_at`."""
        if self._stoppable:
            self._stop.clear()  # before the shares: a worker reads them only after
        self._got = [None] * len(self._conns)
        self._running = True
        for c, s in zip(self._conns, shares):
            c.send(s)

    def finish(self, on_tick: Callable[[], None] | None = None) -> list[Outcome]:
        """Wait for every worker's outcome of the step started last; a worker that dies meanwhile
        raises at once, whichever worker it is."""
        # All workers at once, pipes and process sentinels: waiting on them in order would notice a
        # dead worker only when the ones before it end their shares, up to a soak step later, with
        # its share of the load missing all the while.
        owner = {p.sentinel: i for i, p in enumerate(self._procs)} | {c: i for i, c in enumerate(self._conns)}
        waiting = set(range(len(self._conns)))
        while waiting:
            handles = [self._conns[i] for i in waiting] + [self._procs[i].sentinel for i in waiting]
            ready = mp_connection.wait(handles, 0.2)
            if not ready:
                if on_tick is not None:
                    on_tick()
                continue
            for i in sorted({owner[r] for r in ready}):
                c, p = self._conns[i], self._procs[i]
                try:
                    # A sentinel with nothing on the pipe is a death; an outcome sent just before
                    # dying is still taken, as it was when the pipe was read first.
                    if not c.poll(0):
                        raise EOFError
                    self._got[i] = c.recv()  # kept as received: `cut` hands them back if a later one fails
                except (EOFError, OSError):
                    p.join(1)
                    raise RuntimeError(f"bench worker {p.pid} died (exit code {p.exitcode})") from None
                waiting.discard(i)
        out = list(self._got)
        self._stats = [o.balancer for o in out]
        self._running = False
        return out

    def cut(self, wait_s: float) -> list[Outcome | None]:
        """Stop the step started last: each worker stops sending, cancels its calls in flight and
        hands back what it measured. Per worker, its Outcome, or None when it died or did not
        answer within `wait_s` (`close` then terminates it)."""
        if not self._stoppable:
            raise RuntimeError("WorkerPool.cut: the pool was not made with stoppable=True")
        if not self._running:
            return list(self._got)
        self._stop.set()
        deadline = time.monotonic() + wait_s
        for i, c in enumerate(self._conns):
            if self._got[i] is not None:
                continue
            try:
                if c.poll(max(0.0, deadline - time.monotonic())):
                    self._got[i] = c.recv()
            except Exception:  # a dead worker's pipe, or one cut mid-message: nothing from it
                continue
        self._running = any(o is None for o in self._got)
        return list(self._got)

    def balancer_stats(self) -> dict | None:
        """The wok balancer's counters over the workers, as of the last step (None with "grpc")."""
        from wok.clients.balancer import merge_stats

        return merge_stats(self._stats)

    def close(self) -> None:
        """End the ramp: its workers go back to `processes` (a step cut short, or a signal as they are told the ramp
        ended: terminated there, replaced at the next ramp's start), or are stopped with the pool's own, waited for
        (WorkerProcesses.stop)."""
        try:
            if self._running:
                # A step cut short (Ctrl-C, an error): its workers would send to the end of their
                # share before reading the pipe again, and nobody waits for what they measure.
                _end(self._procs, terminate=True)
            else:
                try:
                    for c in self._conns:
                        try:
                            c.send(None)  # the ramp's end: the worker closes its channel and waits for the next
                        except (BrokenPipeError, OSError):
                            pass
                except BaseException:
                    # A Ctrl-C between two sends: a worker not yet sent its None still waits for a share, and would
                    # read the next ramp's job as one (and crash). Terminated, all: the next take replaces them.
                    _end(self._procs, terminate=True)
                    raise
        finally:
            self._processes.give_back()
            if self._own:
                self._processes.stop()
