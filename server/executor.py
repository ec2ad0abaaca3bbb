"""Runs batches on model instances: host buffers → device → model → host, off the event loop.

Each instance owns one worker thread that assembles a batch into reusable host buffers
and launches its work, and (on CUDA) a second thread that waits for the batch's CUDA
event, so the event loop never blocks on the device. On CUDA the three stages run on
three streams of the instance (copy in, compute, copy out), ordered by events, and with
`pipeline_depth` >= 2 the copy in of batch k+1 overlaps the compute of batch k (its compute
waits for batch k's copy out, which may read storage the model writes again). Host
buffers are page-locked so that `non_blocking` copies are truly asynchronous. On the CPU
the stages run in order on the worker thread, timed with clocks; there is no copy in (h2d is
metrics.NOT_RUN), and d2h is taking the outputs to NumPy and splitting them per request: views of a
fresh output, a copy of one the model may write again while the loop still encodes it (a view, an
alias of the input slot, or in storage the module holds; see _run_cpu).

An instance has `pipeline_depth` slots (2 by default); each slot owns its host buffers, and
a slot is reused only after its batch completed, so no buffer is overwritten while a copy
reads it. The batcher gives a busy instance only full batches, so on the CPU the second slot
holds the next full batch at the worker under saturation (no gap between batches) and never
makes batches form early and small below it.

On the CPU the worker sizes torch's intra-op threads to the batch: a batch of n samples runs on
ceil(n · T / max_batch_size) threads, at most T (torch's thread count as the worker thread
starts: `wok serve --torch-threads`, or torch's default), so a small batch runs on one thread.
Measured with the demo mlp on the 2-core machine (docs/performance.md): up to 16 samples, one
thread is as fast as two when batches follow each other and faster when they come 5 ms apart
(the usual case below saturation: a second thread must be woken from its sleep for every
parallel region, on a core whose caches went cold), and it leaves the other core to the event
loop; only a full batch of 32 back to back runs faster on two (0.81 against 1.06 ms).

A CPU instance runs its model's plain fp32 linear layers through oneDNN (server/cpulinear.py: a
copy of the module sharing its parameters) unless `cpu_linear` is 'torch': for the batch sizes
a dynamic batcher forms, torch's own fp32 addmm spends as long repacking the weights as
multiplying them.

Below saturation a CPU batch also meets its weights cold: between batches the caches fill with
the event loop's and everyone else's data, so the demo mlp's first layer, 6.3 MB, comes from
memory again. `Instance.prewarm` reads every weight on the worker thread; the batcher calls it
shortly before a delay flush to an idle instance, so the batch finds them in the caches (the
read costs about what the cold batch would have spent on it, off the request's path). Models
whose weights exceed PREWARM_MAX_BYTES (no cache holds them) are not prewarmed.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import functools
import inspect
import logging
import math
import sys
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .config import InstanceConfig
from .cpulinear import MIN_ROWS, onednn_counts, padded_rows, with_onednn_linear
from .errors import (
    MESSAGE_BYTES,
    MESSAGE_CHARS,
    ConfigError,
    DeviceLost,
    InvalidInput,
    ModelExecutionError,
    WarmupError,
    cut_message,
    cut_middle,
    error_line,
    printable,
    quoted_name,
    script_error,
)
from .faults import InstanceFault
from .metrics import NOT_RUN
from .ratelog import Throttle
from .servable import HostBuffers, Servable
from .tensors import to_numpy_view

log = logging.getLogger("wok")

# The largest batch, in rows, whose oneDNN kernels the warm-up builds; larger ones are built on
# first use.
WARMUP_MAX_ROWS = 64
# A warm-up's failure shows the model's message (its failure_line) up to this many bytes (errors.cut_message), as
# a failed batch's is cut everywhere else: whole, a message of 1 MB made `wok serve`'s refusal a 1 MB line. Half of
# MESSAGE_BYTES: the refusal adds the batch's shapes, the config's path and a hint, and `wok profile` its own words,
# and a command's line of more than MESSAGE_CHARS is cut again in its middle (cliargs.one_line), its note then
# counting the first cut's text: the two commands said the failure differently.
WARMUP_MESSAGE_BYTES = MESSAGE_BYTES // 2
# The rest of a warm-up's refusal is bounded too, so that the whole stays within MESSAGE_CHARS beside a command's
# words before it (COMMAND_CHARS: `wok profile` adds "wok serve refuses the model at its start: "), and neither
# command's one_line cuts it again: a config path of ~2,000 characters was cut by each at another point of the
# path, its note counting the first cut's text. The input shapes (one per input) take WARMUP_SHAPES_BYTES at
# most, and the config's path what is left, cut in its middle (_with_config).
COMMAND_CHARS = 128
WARMUP_SHAPES_BYTES = 512
PREWARM_MAX_BYTES = 32 << 20  # the last-level cache of the machine it was measured on (docs/performance.md)
# Failed batches in a row, rerun in parts, whose every request failed alone too (a model failing
# every input runs 2n - 1 forwards for each batch of n), after which a failed batch first reruns
# its first and last request alone: either answered, the rest in parts; both failing, the rest in
# parts within a budget of forwards (Instance._isolate).
PROBE_AFTER = 2
# Ends the message of a request the probing left undecided: a client (and the chaos audit) can
# tell the batch's error given to it from one its own request earned ("(on this request alone)").
NOT_RERUN = "(its batch's error: not rerun alone, the model having failed every request of its last batches)"
# What a batch, or a part of one, fails with that reruns it in parts (Instance._isolate): the model's failure, and a
# request's values that a servable's own assemble refuses, which fails its request alone as it was raised.
_PART_FAILURES = (ModelExecutionError, InvalidInput)


def _part_failure(exc: BaseException, assembling: bool) -> bool:
    """Whether `exc` fails a CUDA batch (or part) as _PART_FAILURES do: an InvalidInput only as it was assembled
    (_assemble); raised later, by a python model's own forward, it is the model's failure, as on the CPU, whose
    _forward_cpu makes every error of the forward one."""
    return isinstance(exc, _PART_FAILURES) and (assembling or not isinstance(exc, InvalidInput))


# Code whose frame may be suspended: a generator's or a coroutine's. frame.clear() refuses a suspended frame
# (RuntimeError) from Python 3.13; before, it closes its generator.
_SUSPENDABLE = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR | inspect.CO_ITERABLE_COROUTINE
_CLEARS_SUSPENDED_SAFELY = sys.version_info >= (3, 13)


def _clear_frames(*errors: BaseException | None) -> None:
    """Clear the local variables of the finished frames in the tracebacks of `errors` and of the errors they chain
    (cause, context). A failed forward's frames hold what it made before it raised, its activations (on CUDA, device
    memory): held by its error while the batch is rerun in parts, they left the parts less memory than the batch had,
    and a batch that ran out of it failed again in every part. The tracebacks keep their lines for the log; a frame
    still running (the caller's) is left as it is. So is a generator's or coroutine's before Python 3.13, where
    clearing one suspended closes it (3.13 refuses, as for a running one) and nothing tells a suspended one from a
    finished one: a generator the model keeps, which caught an error the model then raised, was closed, and every
    part failed on it (StopIteration).

    An error object raised again (a model that keeps one and raises it for each failed batch) keeps its traceback,
    the new raise's entries put in front of it: the walk stops at an entry running the code the traceback starts in
    (where wok caught it) that the entry before did not call (a recursion did), where the earlier raise's traceback
    begins, walked when that one was caught. Walked to its end, each failed batch took longer than the last: a batch
    of one 11 ms after 8,000 such (0.16 ms when its frames were not cleared), a batch of 4 rerun in parts 84 ms after
    2,000."""
    todo, seen = list(errors), set()
    while todo:
        exc = todo.pop()
        if exc is None or id(exc) in seen:
            continue
        seen.add(id(exc))
        tb = exc.__traceback__
        head = None if tb is None else tb.tb_frame.f_code
        caller = None
        while tb is not None:
            frame = tb.tb_frame
            if frame.f_code is head and caller is not None and frame.f_back is not caller:
                break  # raised again: the rest is that earlier raise's traceback
            if _CLEARS_SUSPENDED_SAFELY or not frame.f_code.co_flags & _SUSPENDABLE:
                try:
                    frame.clear()
                except RuntimeError:  # running (the caller's), or suspended (3.13 on)
                    pass
            caller = frame
            tb = tb.tb_next
        todo += (exc.__cause__, exc.__context__)


# Ends the message of the requests of a part that failed as the device was lost: its halves were not rerun
# on a device that can run nothing more, so the error may be any one's of them.
LOST_IN_PART = "(its part's error, met as the device was lost: not rerun alone)"
# Ends the message of a request that failed rerun alone as the device was lost: by a device-side error it met
# (on CUDA reported at the first sync after it, maybe another instance's kernel's) or by another instance's, its
# own error then met on a lost device. The loss, not its values, may have failed it: not "(on this request alone)".
LOST_ALONE = "(its error alone, met as the device was lost: maybe the loss's, not its own)"


class OwnFailureLog:
    """wok's own errors met rerunning a failed batch's parts (Instance._isolate: a bug in wok's work on a part's
    answers) at WARNING in the server's log, with their traceback: the first at once, then
    at most one per `every_s`, saying how many were not logged in between.

    The batcher's FailureLog shows the batch's first error, the model's; this one, which the requests not
    answered get, was logged at DEBUG only. Rate-limited, as every failed batch may meet it."""

    def __init__(self, model: str, instance: int, every_s: float = 10.0) -> None:
        self.model = model
        self.instance = instance
        self.throttle = Throttle(every_s)

    def failed(self, exc: BaseException, unanswered: int) -> None:
        held = self.throttle.due()
        if held is None:
            return
        more = f" ({held} more since the last logged)" if held else ""
        log.warning(
            "model '%s', instance %d: rerunning a failed batch in parts, wok's own work on a part failed (not the "
            "model): %s; the %d request(s) not answered get it%s",
            self.model,
            self.instance,
            cut_message(error_line(exc)),
            unanswered,
            more,
            exc_info=exc,
        )


@dataclass(slots=True)
class StageTimes:
    """Seconds spent per stage of one batch; metrics.NOT_RUN (0 s) for one the device does not have."""

    assemble: float = 0.0
    h2d: float = 0.0
    compute: float = 0.0
    d2h: float = 0.0


@dataclass(slots=True)
class BatchResult:
    outputs: list[dict[str, np.ndarray]]  # per request, owned (never views of reused buffers)
    times: StageTimes
    instance: int
    started: float  # time.perf_counter() when the worker took the batch
    finished: float  # time.perf_counter() when its outputs were on the host
    # CUDA only: the batch's events (copy-in start/end, compute start/end, copy-out end),
    # kept so that a trace can show batches overlapping across streams.
    events: tuple | None = None
    # Indices of the requests that ran, when some were dropped at the worker because their
    # deadline passed while the batch waited behind another; None: all of them ran.
    kept: tuple[int, ...] | None = None
    # A batch the model failed, rerun in parts to find the requests it fails on (isolate): its
    # first error; `outputs` then holds, for each request that fails alone, its error instead.
    failure: BaseException | None = None
    reruns: int = 0  # forwards run on its parts


def resolve_devices(spec: Sequence[str]) -> list[torch.device]:
    out = []
    for d in spec:
        if d == "auto":
            d = "cuda:0" if torch.cuda.is_available() else "cpu"
        dev = torch.device(d)
        if dev.type == "cuda":
            if not torch.cuda.is_available():
                raise ModelExecutionError(f"device {d!r} requested but no CUDA device is present")
            if dev.index is None:
                dev = torch.device("cuda", 0)
            if dev.index >= torch.cuda.device_count():
                raise ModelExecutionError(
                    f"device {d!r} requested but only {torch.cuda.device_count()} CUDA device(s) exist"
                )
        out.append(dev)
    return out


def name_os_thread(name: str) -> None:
    """Name the calling thread for the OS, so that `top -H`, `ps -L` and /proc/PID/task/TID/comm
    tell a model's worker from gRPC's and OpenMP's threads (Python names only its own view of
    a thread). Linux keeps 15 bytes; elsewhere this does nothing."""
    if sys.platform != "linux":
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass


class _Slot:
    __slots__ = ("inputs", "outputs")

    def __init__(self, pinned: bool) -> None:
        self.inputs = HostBuffers(pinned)
        self.outputs = HostBuffers(pinned)


def _nothing() -> None:
    """The first work item of an instance's worker pool: it starts the pool's thread (Instance)."""


class Instance:
    """One copy of the model on one device, with its worker thread(s) and slots."""

    def __init__(
        self,
        servable: Servable,
        index: int,
        device: torch.device,
        depth: int,
        cpu_linear: str = "onednn",
        lost: dict[str, str] | None = None,
        first_on_device: bool = True,
    ) -> None:
        """`lost`: the devices lost to a device-side error, by name, with that error's line; shared
        by the model's instances (a CUDA context is the process's, so one device's instances go
        together). `first_on_device`: whether no instance before this one runs on `device`; a later
        one runs a copy of the module, its parameters shared (Servable.module_for_instance)."""
        self.servable = servable
        self.index = index
        self.device = device
        self.cuda = device.type == "cuda"
        self._lost = {} if lost is None else lost
        self.module = servable.module_for_instance(device, first_on_device)
        # Linear layers that run through oneDNN on this instance (server/cpulinear.py), and how
        # many of them carry the ReLU after them.
        self.onednn_layers = self.onednn_fused = 0
        # (layers, fused) of those that took oneDNN in the warm-up: a model may route around its
        # layers (Executor.warmup sets it).
        self.onednn_ran = (0, 0)
        if not self.cuda and cpu_linear == "onednn" and servable.compute_dtype == torch.float32:
            self.module, self.onednn_layers, self.onednn_fused = with_onednn_linear(self.module)
        # The tensors `prewarm` reads: the CPU module's parameters and buffers, if they fit a cache.
        weights = [t.detach() for t in (*self.module.parameters(), *self.module.buffers())]
        size = sum(t.numel() * t.element_size() for t in weights)
        self._weights = weights if not self.cuda and 0 < size <= PREWARM_MAX_BYTES else []
        self.prewarms = 0  # how many prewarm reads the worker ran
        # Storages of the tensors the module holds (module_storages), collected after a batch of
        # more samples than any before it and after the warm-up, not per batch; and that batch's size.
        self._owned: frozenset[int] | None = None
        self._owned_rows = 0
        self.output_copies = 0  # CPU outputs copied rather than handed out as views (_run_cpu)
        # Failed batches rerun in parts in a row where every request failed alone too (a model
        # that fails every input): from PROBE_AFTER on, a failed batch is probed first (_isolate).
        # Set to 0 by any batch or part answered: on the worker thread, and on CUDA's waiter, whose
        # reset may race the worker's increment; lost, it only moves the probing by a batch.
        self.all_failed_runs = 0
        self.own_failures = OwnFailureLog(servable.name, index)  # read and written on the worker thread only
        self.slots = [_Slot(pinned=self.cuda) for _ in range(depth)]
        self.fault = InstanceFault(servable.name, index)  # set by the admin API (server/faults.py)
        # Called on the loop as each batch is handed over, with (rows, future): the admin's event stream.
        self.observer: Callable[[Sequence[int], concurrent.futures.Future], None] | None = None
        tag = f"wok-{servable.name}-{index}"
        # Intra-op threads for a full batch, and the count the worker thread runs with now (both
        # read in the worker thread as it starts; see _size_threads).
        self.max_threads = 0
        self.threads = 0
        self._worker = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix=f"{tag}-run", initializer=self._start_worker, initargs=(f"wok-run-{index}",)
        )
        self._waiter = (
            concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix=f"{tag}-wait", initializer=name_os_thread, initargs=(f"wok-wait-{index}",)
            )
            if self.cuda
            else None
        )
        # The last batch's copy-out end (CUDA; read and written on the worker thread only): see _launch_live.
        self._last_d2h: torch.cuda.Event | None = None
        if self.cuda:
            with torch.cuda.device(device):
                self.h2d_stream = torch.cuda.Stream(device)
                self.compute_stream = torch.cuda.Stream(device)
                self.d2h_stream = torch.cuda.Stream(device)
                # The module's weights were made, cast (precision) or copied (a later instance's buffers) on the
                # default stream, whose work torch's pool streams do not wait for: a forward on the compute
                # stream could read them before those kernels wrote them (torch's CUDA semantics: "sum() may
                # start execution before normal_() finishes"). Once, before any batch.
                torch.cuda.synchronize(device)
        # The worker thread starts here, not in the first submit, where the pool starts it: a Ctrl-C landing in that
        # start (a KeyboardInterrupt, where the bench tools submit from the main thread) left the thread running the
        # batch unknown to the pool, whose shutdown waited for nothing, and Python's exit joined it: a stuck model's
        # for good (`wok profile`'s Ctrl-C in its warm-up, about 1 run in 3 under load). No submit starts a thread.
        # CUDA's waiter alike: a launched batch is handed to it by a done callback, run on the submitting thread where
        # the launch has ended already.
        try:
            self._worker.submit(_nothing)
            if self._waiter is not None:
                self._waiter.submit(_nothing)
        except BaseException:
            # A thread, if started, takes the shutdown's end marker after the no-op and ends: nothing to wait for.
            self._worker.shutdown(wait=False, cancel_futures=True)
            if self._waiter is not None:
                self._waiter.shutdown(wait=False, cancel_futures=True)
            raise

    def submit(
        self,
        inputs: Sequence[dict[str, np.ndarray]],
        rows: Sequence[int],
        slot: int,
        deadlines: Sequence[float | None] | None = None,
    ) -> concurrent.futures.Future:
        """Run one batch in `slot`; the future's result is a BatchResult.

        With `deadlines` (time.perf_counter() per request, None for none), the worker leaves
        out the requests whose deadline has passed when it starts the batch (see BatchResult.kept);
        should the batch then raise, the future's `left_out` holds (kept, started) (_note_left_out).
        A batch that raised once its worker took it has (started, ended) in the future's `ran`
        (_note_raised): the time it held the instance, as a BatchResult's started and finished do.

        The future's `withdraw()` cancels the batch if its worker has not taken it yet (it waits
        behind another batch of the instance): True, and the future is cancelled, as the executor's
        shutdown cancels it; False once the worker took it, which then runs to its end (nothing
        interrupts a model). The batcher withdraws the batches whose callers it answered when a
        stop's grace period ran out, so that none runs for nobody.
        """
        left_out: list = []
        ran: list = []
        # The inputs go in a box the worker empties as it takes the batch: the pool's work item keeps its arguments
        # until its thread runs again after setting the future, whose callbacks (the batcher's) have the loop answer
        # at once; a thread the OS did not run again at once (a loaded host) held the requests' received bytes.
        handed = [inputs]
        if self.cuda:
            done: concurrent.futures.Future = concurrent.futures.Future()
            launched = self._worker.submit(self._launch_cuda, handed, rows, self.slots[slot], deadlines, left_out, ran)
            launched.add_done_callback(
                lambda f: _after_launch(
                    f, done, lambda result: self._waiter.submit(self._finish_cuda, result, left_out, ran)
                )
            )
            # The launch, not `done`: `done` is a plain future, which cancel() would mark cancelled
            # even while its batch runs on the device. A launch cancelled before the worker took
            # it cancels `done` (_after_launch); one launched is on the device's streams for good.
            done.withdraw = _canceller(launched)
        else:
            done = self._worker.submit(self._run_cpu, handed, rows, self.slots[slot], deadlines, left_out, ran)
            # The pool's future: cancel() succeeds only while it is pending, and the worker skips a
            # cancelled one (both under the future's lock: no batch is both cancelled and started).
            done.withdraw = _canceller(done)
        done.left_out = left_out
        done.ran = ran
        if self.observer is not None:
            self.observer(rows, done)
        return done

    @property
    def can_prewarm(self) -> bool:
        return bool(self._weights)

    def prewarm(self) -> concurrent.futures.Future | None:
        """Read every weight on the worker thread (queued before any later batch); None if not a CPU
        instance with weights that fit PREWARM_MAX_BYTES. The future's result is the bytes read."""
        if not self._weights:
            return None
        return self._worker.submit(self._read_weights)

    def _read_weights(self) -> int:
        self._size_threads(1)  # a read, not a batch: one thread
        with torch.inference_mode():
            for t in self._weights:
                t.sum()
        self.prewarms += 1
        return sum(t.numel() * t.element_size() for t in self._weights)

    def collect_owned(self, samples: int = 0) -> None:
        """Note the storages of every tensor the module holds now (module_storages): a CPU output in
        one of them is copied. `samples`: the batch it follows (a model may grow a buffer it keeps
        for larger batches: the next larger batch collects again)."""
        self._owned = module_storages(self.module)
        self._owned_rows = max(self._owned_rows, samples)

    def _start_worker(self, name: str) -> None:
        name_os_thread(name)
        # A thread's own setting starts from the process-wide one (the last torch.set_num_threads), read as the
        # instance is built (its thread starts then, not at its first batch): every caller sets it before building.
        self.max_threads = self.threads = torch.get_num_threads()

    def threads_for(self, samples: int) -> int:
        """Intra-op threads a batch of `samples` runs on (after the worker thread started)."""
        full = self.servable.config.max_batch_size
        return self.max_threads if full <= 0 else max(1, min(self.max_threads, -(-samples * self.max_threads // full)))

    def _size_threads(self, samples: int) -> None:
        """On the worker thread: run `samples` on ceil(samples · max_threads / max_batch_size) threads.

        torch.set_num_threads called on a thread sets that thread's OpenMP team size (MKL's is
        process-wide, but only model workers run the model), and costs under a microsecond.
        """
        want = self.threads_for(samples)
        if want != self.threads:
            torch.set_num_threads(want)
            self.threads = want

    def shutdown(self) -> None:
        # At a clean stop nothing is pending here. Past the grace period the batcher has failed
        # the callers of every batch it sent here (UNAVAILABLE) and withdrawn those its worker
        # had not taken (the future's `withdraw`, see submit); whatever is still pending here then
        # (a prewarm read) is cancelled rather than run for nobody. The running one cannot be
        # interrupted, and wait=True waits for it: the server bounds that wait and exits hard past it.
        # A batch in an injected slow fault's pause can: it ends now rather than hold the thread.
        self.fault.stop()
        self._worker.shutdown(wait=True, cancel_futures=True)
        if self._waiter is not None:
            self._waiter.shutdown(wait=True, cancel_futures=True)

    # -- CPU: every stage in order on the worker thread -----------------------------------
    def _run_cpu(
        self, handed: list, rows, slot: _Slot, deadlines=None, left_out: list | None = None, ran: list | None = None
    ) -> BatchResult:
        """`handed`: [the batch's inputs], emptied here (submit)."""
        t0 = time.perf_counter()
        inputs, rows, kept = _live(handed.pop(), rows, deadlines, t0)
        if not rows:
            return BatchResult([], StageTimes(), self.index, t0, t0, kept=kept)
        samples = sum(rows)
        try:
            slowed = self.fault.before_forward()  # an injected fault: raises, or says to pause after the forward
            try:
                try:
                    host = self._assemble(inputs, samples, slot)
                    self._size_threads(samples)
                finally:  # a failed assembly's too: its time was counted as compute (the reruns'), no forward's
                    t1 = time.perf_counter()
                out = self._forward_cpu(host)
                if slowed:
                    self.fault.pause()
                t2 = time.perf_counter()
                per_request = self._split_cpu(out, rows, samples, slot)
            except _PART_FAILURES as exc:
                if not self._may_isolate(rows):
                    raise
                # The batch's outputs (answers whose copy was refused) go before its parts run, as its forward's frames.
                out = None
                _clear_frames(exc)
                outcomes, reruns = self._isolate(exc, lambda i, r: self._cpu_batch(i, r, slot), inputs, rows)
                inputs = None  # the batch's error, its result's, keeps this frame: see the raise below
                t2 = time.perf_counter()
                times = StageTimes(t1 - t0, NOT_RUN, t2 - t1, 0.0)
                return BatchResult(outcomes, times, self.index, t0, t2, kept=kept, failure=exc, reruns=reruns)
        except BaseException as exc:
            _note_left_out(left_out, kept, t0)
            _note_raised(ran, t0)
            # The error's traceback keeps this frame and those it called, finished (a failed assembly's hold the
            # requests, a forward's its activations), for as long as the error lives: the callers answered with it,
            # and the worker's work item, which holds the future until its thread runs again.
            inputs = out = None
            _clear_frames(exc)
            raise
        self.all_failed_runs = 0
        t3 = time.perf_counter()
        times = StageTimes(t1 - t0, NOT_RUN, t2 - t1, t3 - t2)
        return BatchResult(per_request, times, self.index, t0, t3, kept=kept)

    def _forward_cpu(self, host: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        s = self.servable
        try:
            with torch.inference_mode():
                return s.forward(self.module, s.prepare(host))
        except ModelExecutionError:
            raise
        except BaseException as exc:  # a BaseException too: see _model_failed
            raise _model_failed(s.name, exc) from exc

    def _cpu_batch(self, inputs, rows, slot: _Slot) -> list[dict[str, np.ndarray]]:
        """One part of a failed batch (_isolate): its answers per request, or ModelExecutionError.
        Copied: the next part may run before these are sent, and a model that keeps its output
        (noted only at a batch larger than any before) would write it again."""
        samples = sum(rows)
        host = self._assemble(inputs, samples, slot)
        self._size_threads(samples)
        return self._split_cpu(self._forward_cpu(host), rows, samples, slot, copy=True)

    def _assemble(self, inputs, samples: int, slot: _Slot) -> dict[str, torch.Tensor]:
        """The batch's inputs copied into its slot's host buffers, which grow to the largest batch yet. What fails
        there fails as the model's forward does, ModelExecutionError, so that the batch is rerun in parts (_isolate):
        buffers that cannot grow for the batch (host or pinned memory refused) fit its parts, and a request too large
        alone fails alone, as does one whose values a servable's own assemble refuses. Raised as it was, it failed
        the whole batch. An InvalidInput of a servable's assemble is raised as it is: the
        client's (INVALID_ARGUMENT, not the model's INTERNAL), and reruns the batch in parts all the same
        (_PART_FAILURES). A device-side error met there is raised as it is, for the caller to mark the device lost
        (_note_device_error): no part could run."""
        try:
            return self.servable.assemble(inputs, samples, slot.inputs)
        except _PART_FAILURES:  # raised as they are; wok's other errors (NotSupported, ...) are the model's, below
            raise
        except Exception as exc:
            if _is_device_error(exc):
                raise
            raise _model_failed(self.servable.name, exc) from exc

    def _split_cpu(
        self, out: dict[str, torch.Tensor], rows, samples: int, slot: _Slot, copy: bool = False
    ) -> list[dict[str, np.ndarray]]:
        s = self.servable
        # Outputs are usually fresh tensors, so per-request views of them are safe to hand out
        # (the loop encodes them while the next batch runs). Any other is copied: an output that
        # aliases an input (identity, a slice of it) lives in this slot's reusable buffer, which
        # the next batch overwrites; one that is a view (of a buffer or parameter: a slice of
        # `self.out`), whose storage the module holds, or that anything but `out` refers to (a
        # tensor kept in a closure, a global, a cache object, and overwritten: _storage_of)
        # would be the next batch's answer by the time it is sent.
        if self._owned is None or samples > self._owned_rows:
            self.collect_owned(samples)
        reused = slot.inputs.storage_ptrs()
        owned = self._owned
        arrays = {}
        for k in out:
            # Before the numpy view below, which refers to the storage too.
            ptr, held = _storage_of(out, k)
            v = out[k]
            a = to_numpy_view(v.detach())
            # A 0-d output stays 0-d (np.ascontiguousarray would make it 1-d), so that split
            # refuses it here as on CUDA: it is not one row per sample.
            try:
                if copy or held or a.ndim == 0 or v._is_view() or ptr in reused or ptr in owned:
                    arrays[k] = a.copy()
                    self.output_copies += 1
                else:
                    arrays[k] = np.ascontiguousarray(a)
            except MemoryError as exc:
                # Host memory refused for the answers fails as the model's forward does, so that the batch is rerun
                # in parts (_isolate), which copy less: a request whose answer is too large alone fails alone. Raised
                # as it was, it failed the whole batch, or stopped a failed batch's parts not yet run.
                raise _model_failed(s.name, exc) from exc
        return s.split(arrays, rows)

    # -- a failed batch, rerun in parts ---------------------------------------------------
    def _may_isolate(self, rows) -> bool:
        return len(rows) > 1

    def _isolate(self, failure: ModelExecutionError | InvalidInput, run, inputs, rows) -> tuple[list, int]:
        """Rerun a failed batch's requests in halves, splitting each half that fails again, down to
        single requests: (per request, its answers or the error it fails with alone; forwards run).

        A value one request carries (an id past an embedding's table) fails the model for the whole
        batch; rerun, the others are answered. A batch of n with one such request takes about
        2·log2(n) more forwards, of shrinking parts; one where every request fails, 2n - 2. After
        PROBE_AFTER of those in a row, the first and last request are probed alone first: either
        answered, the rest is rerun in parts; both failing, the n - 2 between are rerun in parts with
        at most 1 + 2·ceil(log2(n - 2)) more forwards (enough to find one bad request among them), and
        the requests it leaves undecided get the batch's own error, marked NOT_RERUN: a model failing
        every input costs 3 + 2·ceil(log2(n - 2)) forwards a batch, not 2n - 2.

        The reruns stop, the parts answered keeping their answers, when the device is lost (a part's
        device-side error, or another instance's on the device: Instance.lost): a part failing as it
        is lost gives its requests its error, marked LOST_IN_PART, and those not rerun yet get the loss
        (DeviceLost, UNAVAILABLE: to be retried elsewhere) without running; rerun on a device that can
        run nothing more, each failed again, as if on its own values. They stop too at an error that is
        not the model failing a part (a bug in wok's own work on it; host memory refused for its answers
        fails the part as its model does: _split_cpu, _cuda_batch), which every request not answered
        gets: raised out of here, it failed the whole batch, answered parts too. It is logged at WARNING
        with its traceback (OwnFailureLog): the batcher's line shows the model's error.
        A request rerun alone that fails as the device is lost is marked LOST_ALONE: the loss, not its
        values, may have failed it. A whole batch whose answers' copy to the host is refused is rerun in
        parts on the CPU path only (_split_cpu): a CUDA batch's copy out of its pinned buffers, refused,
        fails it whole (_finish_cuda), where a rerun would race its worker, running the next batch.
        A request whose values a servable's own assemble refuses (InvalidInput) gets that error as raised.
        """
        n = len(rows)
        outcomes: list = [None] * n
        reruns = 0
        budget = math.inf  # the most forwards this batch's reruns may take
        stop: BaseException | None = None  # why no more part runs: the device lost, or an error not the model's
        own: BaseException | None = None  # that error not the model's, as raised

        def marked(exc: ModelExecutionError, note: str) -> ModelExecutionError:
            err = ModelExecutionError(f"{exc} {note}")
            err.__cause__ = exc.__cause__ or exc
            return err

        def part(lo: int, hi: int) -> None:
            nonlocal reruns, stop, own
            if stop is None:  # lost by the last part, or meanwhile by another instance on the device
                stop = self.lost
            if stop is not None:
                outcomes[lo:hi] = [stop] * (hi - lo)
                return
            if reruns >= budget:
                outcomes[lo:hi] = [marked(failure, NOT_RERUN)] * (hi - lo)
                return
            reruns += 1
            try:
                answers = run(inputs[lo:hi], rows[lo:hi])
            except _PART_FAILURES as exc:
                if self.lost is None:  # what its forward made goes before the next part runs (none runs on a lost one)
                    _clear_frames(exc)
                # An InvalidInput: a request's values refused as its part was assembled, its own and as raised.
                refused = isinstance(exc, InvalidInput)
                if not refused and self.lost is not None:  # lost during this run (not before it: read above)
                    outcomes[lo:hi] = [marked(exc, LOST_ALONE if hi - lo == 1 else LOST_IN_PART)] * (hi - lo)
                elif hi - lo == 1:
                    outcomes[lo] = exc if refused else marked(exc, "(on this request alone)")
                else:
                    mid = (lo + hi) // 2
                    part(lo, mid)
                    part(mid, hi)
                return
            except BaseException as exc:  # wok's own work on the part failed, not the model: so would every part's
                if self.lost is None:  # its frames hold the part's inputs; on a lost device see _launch_live
                    _clear_frames(exc)
                own = exc
                stop = _model_failed(self.servable.name, exc)
                stop.__cause__ = exc
                outcomes[lo:hi] = [stop] * (hi - lo)
                return
            outcomes[lo:hi] = answers

        if self.all_failed_runs >= PROBE_AFTER:
            part(0, 1)
            part(n - 1, n)
            if n > 2:
                # Only for a model failing (an InvalidInput is one client's values: its text, marked NOT_RERUN, would
                # reach others as the model's).
                if isinstance(failure, ModelExecutionError) and all(
                    isinstance(o, ModelExecutionError) for o in (outcomes[0], outcomes[-1])
                ):
                    # Finding one bad request among the m = n - 2 between: the part of m, then both
                    # halves of each failing part, down to one: 1 + 2·ceil(log2 m) forwards.
                    budget = reruns + 1 + 2 * math.ceil(math.log2(n - 2))
                part(1, n - 1)
        else:
            part(0, n // 2)
            part(n // 2, n)
        if own is not None:
            self.own_failures.failed(own, sum(o is stop for o in outcomes))
        failed = sum(isinstance(o, BaseException) for o in outcomes)
        if failed < n:
            self.all_failed_runs = 0
        # Not cut short: every request failed alone (or was left undecided), the model on each: a batch of clients'
        # values refused (InvalidInput) is not the model failing every input, which turns the probing on.
        elif stop is None and self.lost is None and all(isinstance(o, ModelExecutionError) for o in outcomes):
            self.all_failed_runs += 1
        log.debug(
            "model '%s': a failed batch of %d requests, rerun in parts (%d forwards): %d failed alone",
            self.servable.name,
            n,
            reruns,
            failed,
            exc_info=failure,
        )
        # The parts' errors, the answers of those that failed alone, keep `part`'s frames, which read the batch's
        # inputs through this cell.
        inputs = None
        return outcomes, reruns

    # -- CUDA: launch on three streams, then wait for the last event on another thread -----
    @property
    def lost(self) -> DeviceLost | None:
        """Why this instance's device can run nothing more (a device-side error made its CUDA context
        unusable); None while it can."""
        why = self._lost.get(str(self.device))
        if why is None:
            return None
        return DeviceLost(
            f"model '{self.servable.name}': device {self.device} was lost to a device-side error ({why}); "
            "every later batch there would fail: the server must be restarted"
        )

    def _note_device_error(self, exc: BaseException) -> bool:
        """Whether `exc` is a device-side error (_is_device_error); if so, mark this instance's device
        lost. The first error is the one to tell: those after it are its echoes. Logged by the server
        (WokServer._model_failed), which the batcher tells."""
        if not _is_device_error(exc):
            return False
        self._lost.setdefault(str(self.device), error_line(exc))
        return True

    def _launch_cuda(
        self, handed: list, rows, slot: _Slot, deadlines=None, left_out: list | None = None, ran: list | None = None
    ):
        """`handed`: [the batch's inputs], emptied here (submit)."""
        lost = self.lost
        if lost is not None:  # nothing runs: no time on the instance, no request left out
            handed.clear()
            raise lost
        t0 = time.perf_counter()
        inputs, rows, kept = _live(handed.pop(), rows, deadlines, t0)
        if not rows:
            return None, None, 0.0, t0, rows, kept
        try:
            return self._launch_live(inputs, rows, slot, kept, t0)
        except BaseException as exc:
            _note_left_out(left_out, kept, t0)
            _note_raised(ran, t0)
            device_error = self._note_device_error(exc)  # met outside the forward: a pinned buffer's, an event's
            # As _run_cpu's: the traceback's frames go, _launch_live's device tensors with them, except on a lost
            # device (see _launch_live), where only the inputs go.
            inputs = None
            if self.lost is None:
                _clear_frames(exc)
            if device_error:
                raise _model_failed(self.servable.name, exc) from exc
            raise

    def _launch_live(self, inputs, rows, slot: _Slot, kept, t0: float):
        """_launch_cuda's batch of the requests its worker kept."""
        s = self.servable
        slowed = self.fault.before_forward()  # an injected fault: raises, or says to pause after the forward
        host = None  # set once assembled: an InvalidInput after it (a python model's forward) is the model's failure
        assemble = 0.0  # the device not entered: no assembly
        try:
            # Everything under the instance's device, the assembly too: a pinned buffer growing (cudaHostAlloc) or a
            # servable's own assemble, made on the worker thread's current device, cuda:0, made a CUDA context there
            # (hundreds of MiB) for an instance only on cuda:1.
            with torch.cuda.device(self.device):
                ev = [torch.cuda.Event(enable_timing=True) for _ in range(5)]
                try:
                    host = self._assemble(inputs, sum(rows), slot)
                finally:  # a failed assembly's too: its time was counted as compute (the reruns'), no forward's
                    assemble = time.perf_counter() - t0
                with torch.cuda.stream(self.h2d_stream):
                    ev[0].record()
                    dev_in = {k: v.to(self.device, non_blocking=True) for k, v in host.items()}
                    ev[1].record()
                self.compute_stream.wait_event(ev[1])
                if self._last_d2h is not None:
                    # The batch before may still be copying out an output in storage the model keeps (a
                    # buffer it writes and returns, a CUDA graph's static output): this forward would write
                    # it under that copy, handing the batch before this one's rows. Only the copy-out waits;
                    # the copy-in still runs during the compute before.
                    self.compute_stream.wait_event(self._last_d2h)
                with torch.cuda.stream(self.compute_stream):
                    for t in dev_in.values():
                        # Allocated on the copy stream, used on this one: tell the allocator.
                        t.record_stream(self.compute_stream)
                    ev[2].record()
                    with torch.inference_mode():
                        out = s.forward(self.module, s.prepare(dev_in))
                    # Here, not only in _finish_cuda's split: shapes are known before the values, and
                    # a batch failing as it is launched is rerun in parts, as on the CPU, so that a
                    # model answering another row count for one request's values fails that one alone.
                    s.check_shapes({k: v.shape for k, v in out.items()}, sum(rows))
                    if slowed:  # after the forward, before its end event: counted in compute
                        self.compute_stream.synchronize()
                        self.fault.pause()
                    ev[3].record()
                self.d2h_stream.wait_event(ev[3])
                with torch.cuda.stream(self.d2h_stream):
                    host_out = {}
                    for k, v in out.items():
                        # An output not on this device is copied at once, not recorded: record_stream has no CPU
                        # kernel (a CPU output failed every batch), and one on another GPU is copied on that
                        # device's stream, which ev[4] does not follow.
                        here = v.device == self.device
                        if here:
                            v.record_stream(self.d2h_stream)
                        dst = slot.outputs.get(k, v.shape, v.dtype)
                        dst.copy_(v, non_blocking=here)
                        host_out[k] = dst
                    ev[4].record()
                self._last_d2h = ev[4]
        except BaseException as exc:  # a BaseException too: see _model_failed
            failure = exc if _part_failure(exc, host is None) else _model_failed(s.name, exc)
            # A device-side error (of this batch, or of the one before it, met at a sync in this
            # forward) leaves the CUDA context unusable: its parts would fail for nothing of theirs.
            if self._note_device_error(exc) or not self._may_isolate(rows):
                inputs = None  # kept by the error's traceback: _launch_cuda clears the frames only on a live device
                if failure is exc:
                    raise
                raise failure from exc
            if failure is not exc:
                failure.__cause__ = exc
            # The failed batch's device tensors, here and in its forward's frames, go before its parts run: a batch
            # that ran out of device memory left them none. Not on a lost device (raised above), where freeing a
            # tensor used on two streams records an event, which may fail there, inside the free.
            dev_in = out = host_out = None
            _clear_frames(exc)
            # Parts run one at a time, each waited for: the failure path, not the pipelined one.
            outcomes, reruns = self._isolate(failure, lambda i, r: self._cuda_batch(i, r, slot), inputs, rows)
            inputs = None  # the batch's error, its result's, keeps this frame: see _run_cpu
            t2 = time.perf_counter()
            times = StageTimes(assemble, NOT_RUN, t2 - t0 - assemble, 0.0)
            return BatchResult(outcomes, times, self.index, t0, t2, kept=kept, failure=failure, reruns=reruns)
        return host_out, ev, assemble, t0, rows, kept

    def _cuda_batch(self, inputs, rows, slot: _Slot) -> list[dict[str, np.ndarray]]:
        """One part of a failed batch (_isolate), run and waited for: answers per request, or
        ModelExecutionError. A device-side error (found only as the batch is waited for) makes the
        CUDA context unusable, so only a batch that failed as it was launched is rerun."""
        s = self.servable
        host = None
        try:
            with torch.cuda.device(self.device):
                # The failed batch's copy in may still be reading the slot's buffers, which its parts reuse.
                self.h2d_stream.synchronize()
                host = self._assemble(inputs, sum(rows), slot)
                if self._last_d2h is not None:  # as in _launch_live: the failed batch may have met its error before it
                    self.compute_stream.wait_event(self._last_d2h)
                with torch.cuda.stream(self.compute_stream):
                    dev_in = {k: v.to(self.device) for k, v in host.items()}
                    with torch.inference_mode():
                        out = s.forward(self.module, s.prepare(dev_in))
                    # A copy even of an output on the host, which .cpu() returns as it is: the next part may write it.
                    arrays = {k: to_numpy_view(v.detach().to("cpu", copy=True)) for k, v in out.items()}
        except BaseException as exc:  # a BaseException too: see _model_failed
            if _part_failure(exc, host is None):
                raise
            self._note_device_error(exc)
            raise _model_failed(s.name, exc) from exc
        return s.split(arrays, rows)

    def _finish_cuda(self, launched, left_out: list | None = None, ran: list | None = None) -> BatchResult:
        if isinstance(launched, BatchResult):  # a failed batch rerun in parts as it was launched
            return launched
        host_out, ev, assemble, started, rows, kept = launched
        if ev is None:  # every request's deadline had passed: nothing ran
            return BatchResult([], StageTimes(), self.index, started, started, kept=kept)
        try:
            try:
                # On the instance's device, as the launch: the waiter thread's current device is cuda:0, where the
                # CUDA runtime makes a context for a call that needs one (the wait), for an instance only on cuda:1.
                with torch.cuda.device(self.device):
                    ev[4].synchronize()
                    times = StageTimes(
                        assemble,
                        ev[0].elapsed_time(ev[1]) / 1e3,
                        ev[2].elapsed_time(ev[3]) / 1e3,
                        ev[3].elapsed_time(ev[4]) / 1e3,
                    )
            except Exception as exc:
                self._note_device_error(exc)
                raise _model_failed(self.servable.name, exc) from exc
            # The pinned output buffers belong to the slot and will be reused: copy out. Host memory refused fails
            # the batch as its model does (one line, as on the CPU), not as a bare MemoryError; not rerun in parts
            # here, on the waiter's thread, which would race the worker, already launching the next batch.
            try:
                arrays = {k: to_numpy_view(v).copy() for k, v in host_out.items()}
            except MemoryError as exc:
                raise _model_failed(self.servable.name, exc) from exc
            per_request = self.servable.split(arrays, rows)
        except BaseException:
            _note_left_out(left_out, kept, started)
            _note_raised(ran, started)
            raise
        self.all_failed_runs = 0
        return BatchResult(per_request, times, self.index, started, time.perf_counter(), tuple(ev), kept)


def _note_left_out(left_out: list | None, kept: tuple[int, ...] | None, started: float) -> None:
    """A batch that raised after its worker left out requests whose deadline had passed (`kept`:
    the indices of those that ran, as BatchResult's): note them, and when the worker took the
    batch, in the batch's own `left_out` (its future's), so that the batcher answers the left-out
    requests as such (DEADLINE_EXCEEDED) and only those that ran with the batch's error. Not on
    the error: a model may raise one error object for several batches at once."""
    if left_out is not None and kept is not None:
        left_out.append((kept, started))


def _note_raised(ran: list | None, started: float) -> None:
    """A batch that raised after its worker took it at `started`: note (started, now) in the batch's
    own `ran` (its future's), so that the instance's busy time counts it as it does a batch that
    returned (wok_instance_busy_seconds: a failing model occupies its instance all the same).
    Not on the error, for the reason _note_left_out gives."""
    if ran is not None:
        ran.append((started, time.perf_counter()))


# What torch raises for an error on the device (a kernel's assert, an illegal address).
_DEVICE_ERRORS: tuple[type[BaseException], ...] = tuple(
    t for t in (getattr(torch, "AcceleratorError", None),) if isinstance(t, type)
)


# The CUDA errors that leave the context usable, by cudaError_t code (AcceleratorError.error_code, set by torch's
# _new_accelerator_error_object from the code c10_cuda_check_implementation was given) and by cudaGetErrorString's
# text, which that check puts after "CUDA error: " (torch before AcceleratorError gave the text alone). Each is an
# API call refused as made, returned by that call (a launch's to C10_CUDA_KERNEL_LAUNCH_CHECK's cudaGetLastError;
# the check's own cudaGetLastError then resets the thread's error to cudaSuccess), never found later on the device:
# a launch's grid, block or shared memory too large for the device (what one request's sizes can ask for), memory
# refused, a kernel not built for the device. The CUDA runtime API's cudaError enum says of the others met on the device
# (cudaErrorIllegalAddress 700, LaunchTimeout 702, Assert 710, HardwareStackError 714, IllegalInstruction 715,
# MisalignedAddress 716, InvalidAddressSpace 717, InvalidPc 718, LaunchFailure 719) "This leaves the process in an
# inconsistent state and any further CUDA work will return the same error. To continue using CUDA, the process must
# be terminated and relaunched"; torch (c10/cuda/CUDAMiscFunctions.cpp, get_cuda_async_error_suffix) marks 700, 710,
# 715, 716 and 719 as reported asynchronously. Those, an uncorrectable ECC (214) or NVLink (220) error, and any code
# or text not listed here lose the device: a context wrongly taken for usable fails every later batch anyway.
# https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html (enum cudaError), group__CUDART__ERROR.html
_USABLE_AFTER: dict[int, str] = {
    1: "invalid argument",  # cudaErrorInvalidValue
    2: "out of memory",  # cudaErrorMemoryAllocation: a cudaHostAlloc or a cudaMalloc outside torch's caching allocator
    9: "invalid configuration argument",  # cudaErrorInvalidConfiguration: too many threads or blocks, shared memory
    98: "invalid device function",  # cudaErrorInvalidDeviceFunction
    101: "invalid device ordinal",  # cudaErrorInvalidDevice
    209: "no kernel image is available for execution on the device",  # cudaErrorNoKernelImageForDevice
    701: "too many resources requested for launch",  # cudaErrorLaunchOutOfResources: registers for the block size
    720: "too many blocks in cooperative launch",  # cudaErrorCooperativeLaunchTooLarge
    912: "a kernel launch error has occurred due to cluster misconfiguration",  # cudaErrorInvalidClusterSize
}
_USABLE_AFTER_TEXT = frozenset(_USABLE_AFTER.values())


def _with_config(before: str, source: str | None, after: str) -> str:
    """A warm-up's refusal: `before`, the config's path (`source`; 'built in code' for none) and `after`, the path
    cut in its middle (its start and its end, the model's folder and file, kept) so that the whole, as a command
    prints it (escaped: errors.printable), takes at most MESSAGE_CHARS - COMMAND_CHARS characters."""
    if source is None:
        return f"{before}built in code{after}"
    room = max(MESSAGE_CHARS - COMMAND_CHARS - len(printable(before)) - len(printable(after)), 256)
    return f"{before}{cut_middle(printable(source), room, room // 2)}{after}"


def _is_device_error(exc: BaseException) -> bool:
    """Whether `exc` is an error of the CUDA device that leaves its context unusable (sticky): torch's
    AcceleratorError, or (torch before it, which pyproject allows) a RuntimeError "CUDA error: ...", other than
    the errors of _USABLE_AFTER, an API call refused (memory, a launch's configuration), which fail their batch
    alone (rerun in parts: the other requests answered), as the model's failure. torch's own allocator running
    out (torch.OutOfMemoryError, "CUDA out of memory. ...") is neither.

    An op's error in a TorchScript model arrives as the interpreter's RuntimeError, torch's code and type lost:
    the error it embeds (errors.script_error) is read by its name and text as that error would be. Read whole
    (it starts "The following operation failed in the TorchScript interpreter."), it was never a device's: a
    device lost under a script went on being used. A script's own `raise` is a torch.jit.Error, no RuntimeError:
    the model's, as a Python model's ValueError is."""
    if not isinstance(exc, RuntimeError):  # torch's AcceleratorError is one
        return False  # (and a model's own error, whose str() may raise, is never read here)
    try:
        text, code = str(exc), getattr(exc, "error_code", None)
    except Exception:  # a RuntimeError of the model's own whose str() raised: not torch's
        return False
    torchs = isinstance(exc, _DEVICE_ERRORS)
    embedded = script_error(text)
    if embedded is not None:
        name, text = embedded
        if name not in ("RuntimeError", "AcceleratorError"):  # a Python op's own ValueError, ...: the model's
            return False
        torchs = name == "AcceleratorError"  # a Python op's AcceleratorError (the interpreter's own has no code)
    if torchs and isinstance(code, int) and not isinstance(code, bool):
        # The code, where torch gave one: its text may be stripped (STRIP_ERROR_MESSAGES) or worded otherwise.
        # Only torch's: another library's RuntimeError may carry an error_code of its own.
        return code not in _USABLE_AFTER
    if text.startswith("CUDA error: ") and text[len("CUDA error: ") :].split("\n", 1)[0] in _USABLE_AFTER_TEXT:
        return False
    return torchs or text.startswith("CUDA error")


def failure_line(name: str, exc: BaseException) -> str:
    """How a model's failure with `exc` is told, on every path (a batch's launch, its wait, a part of a failed
    batch, the warm-up): "model 'M' failed on the device: ..." for a device-side error (_is_device_error,
    which marks the device lost on CUDA), "model 'M' failed: ..." for any other, so that a client and an
    operator tell them apart. A part of a failed batch on CUDA said "failed: AcceleratorError: ..." where a
    batch's wait said "failed on the device: AcceleratorError: ..."."""
    where = " on the device" if _is_device_error(exc) else ""
    # The name quoted, escaped and cut as every other line shows a model's: a config's name has no length cap, and
    # 5,000 characters of it filled a warm-up's refusal, cut before the model's own words.
    return f"model {quoted_name(name)} failed{where}: {error_line(exc)}"


def _model_failed(name: str, exc: BaseException) -> ModelExecutionError:
    """The error a batch whose model raised `exc` ends with: its callers get one line (failure_line; a
    TorchScript error's message is the script's traceback). The full one is logged here at DEBUG for
    every batch, and by the batcher's FailureLog at WARNING, rate-limited, as the error's cause.

    `exc` may be a BaseException (KeyboardInterrupt, SystemExit, GeneratorExit, asyncio's CancelledError,
    one of the user's own): the batch's forwards catch those too, for on a worker thread they can only
    be the model's own. Python raises a signal's KeyboardInterrupt in the main thread only; the pool
    ends a worker thread between batches (a None on its queue, at the executor's shutdown), never by
    raising in one, and cancels only the batches its worker has not taken (withdraw, shutdown's
    cancel_futures), which never start; asyncio cancels tasks on the loop, not code on this thread.
    Caught as Exception only, such a batch failed whole, its other requests with the model's error,
    where an Exception has it rerun in parts (Instance._isolate) and fails only the requests the
    model fails on."""
    log.debug("model '%s': a batch failed", name, exc_info=exc)
    return ModelExecutionError(failure_line(name, exc))


# Tensors (and storage objects) on a storage: torch's private count, which torch 2.x has; where it
# has none, only the other two counts of _counts are read.
_STORAGE_USE_COUNT = getattr(torch._C, "_storage_Use_Count", lambda cdata: 0)


def _counts(out: dict[str, torch.Tensor], name: str) -> tuple[int, tuple[int, int, bool]]:
    """(output `name`'s storage's data pointer, (references to its tensor, tensors on that storage,
    whether torch allocated it)): see _storage_of."""
    v = out[name]
    st = v.untyped_storage()
    return st.data_ptr(), (sys.getrefcount(v), _STORAGE_USE_COUNT(st._cdata), st.resizable())


# The counts of a fresh output that only its `out` dict holds, read on this interpreter: what a
# reference costs differs between Python versions (3.14 borrows some), so they are measured, not written.
_FRESH = _counts({"y": torch.empty(1)}, "y")[1]


def _storage_of(out: dict[str, torch.Tensor], name: str) -> tuple[int, bool]:
    """Output `name`'s storage's data pointer, and whether anything besides `out` may hold that
    memory, so that the model could write it again before the answer is sent: another reference to
    the tensor (kept in a closure, a global, an object of the module's), another tensor on its
    storage (a kept buffer's `detach()`), or memory torch did not allocate (`torch.from_numpy` of a
    kept array). A false alarm costs a copy."""
    ptr, counts = _counts(out, name)
    return ptr, counts != _FRESH


def module_storages(module: torch.nn.Module) -> frozenset[int]:
    """The storages (data pointers) of the tensors `module` holds: every submodule's parameters,
    buffers and plain tensor attributes (also those in a list, tuple or dict attribute; for
    TorchScript, the attributes its type declares)."""
    tensors: list = []
    for m in module.modules():
        tensors += m.parameters(recurse=False)
        tensors += m.buffers(recurse=False)
        for v in vars(m).values():
            if isinstance(v, dict):
                v = list(v.values())
            if isinstance(v, (list, tuple)):
                tensors += (x for x in v if isinstance(x, torch.Tensor))
            elif isinstance(v, torch.Tensor):
                tensors.append(v)
        concrete = getattr(m, "_concrete_type", None)  # TorchScript's: its attributes are not in vars()
        if concrete is not None:
            try:
                tensors += [getattr(m, n) for n, (t, _) in concrete.get_attributes().items() if str(t) == "Tensor"]
            except (AttributeError, RuntimeError):
                pass
    ptrs = set()
    for t in tensors:
        # A tensor with no storage (sparse, meta) raises here: it holds no rows an answer could alias.
        with contextlib.suppress(RuntimeError, NotImplementedError):
            ptrs.add(t.untyped_storage().data_ptr())
    ptrs.discard(0)  # an empty tensor's: no answer's rows live there
    return frozenset(ptrs)


def _live(inputs, rows, deadlines, now: float):
    """(inputs, rows, kept) without the requests whose deadline passed; kept is None if none did."""
    if deadlines is None:
        return inputs, rows, None
    kept = tuple(i for i, d in enumerate(deadlines) if d is None or now < d)
    if len(kept) == len(rows):
        return inputs, rows, None
    return [inputs[i] for i in kept], [rows[i] for i in kept], kept


def _cancel_referent(future: weakref.ref) -> bool:
    live = future()
    return live is not None and live.cancel()


def _canceller(future: concurrent.futures.Future) -> Callable[[], bool]:
    """`future.cancel`, holding `future` weakly: a batch's `withdraw`. The bound method, stored on the
    batch's own future (or, on CUDA, the launch's, whose done callback holds the batch's), would make
    that future a reference cycle, keeping the batcher's done callback and through it the Batch, its
    requests and their answers until the cyclic collector runs: a cycle per batch. A future gone is
    done: the worker took it, and cancel() would say False."""
    return functools.partial(_cancel_referent, weakref.ref(future))


def _after_launch(
    launched: concurrent.futures.Future,
    done: concurrent.futures.Future,
    wait: Callable[[object], concurrent.futures.Future],
) -> None:
    """Done-callback of a CUDA batch's launch: its wait goes to `wait`, whose outcome is `done`'s.

    A launch cancelled by a shutdown past the grace period cancels `done`, which the batcher
    answers UNAVAILABLE (server stopping), as it does a cancelled CPU batch: not a model error.
    Anything raised in a done-callback is only logged by concurrent.futures, so all of it is
    caught here: `done` must always be set, or the slot leaks.
    """
    try:
        if launched.cancelled():
            done.cancel()
        elif launched.exception() is not None:
            done.set_exception(launched.exception())
        else:
            wait(launched.result()).add_done_callback(lambda g: _copy_outcome(g, done))
    except BaseException as exc:
        if not done.done():
            done.set_exception(exc)


def _copy_outcome(src: concurrent.futures.Future, dst: concurrent.futures.Future) -> None:
    """Give `dst` the outcome of `src`, whatever it is: a done-callback that raised would only be
    logged, and `dst` (a batch's future) would never be set, its slot never freed."""
    try:
        if src.cancelled():  # its stage was cancelled by a shutdown past the grace period
            dst.cancel()
        elif src.exception() is not None:
            dst.set_exception(src.exception())
        else:
            dst.set_result(src.result())
    except BaseException as exc:
        if not dst.done():
            dst.set_exception(exc)


class Executor:
    """The instances of one model and their slots."""

    def __init__(self, servable: Servable, cfg: InstanceConfig, cpu_linear: str = "onednn") -> None:
        """`cpu_linear`: 'onednn' or 'torch', how CPU instances run nn.Linear (ServerSettings.cpu_linear)."""
        if cpu_linear not in ("onednn", "torch"):
            raise ValueError(f"cpu_linear: expected 'onednn' or 'torch'; got {cpu_linear!r}")
        try:
            devices = resolve_devices(cfg.devices)
        except ModelExecutionError as exc:
            # The machine lacks a device the config names: the config must change (wok serve exits
            # 2, as for its other errors), and the message says which model's.
            source = servable.config.source or f"model '{servable.name}'"
            raise ConfigError(f"{source}: instances.devices: {exc}") from None
        self.instances = []
        self._lost: dict[str, str] = {}  # the devices lost to a device-side error (Instance.lost)
        taken: set[torch.device] = set()
        try:
            for i in range(cfg.count):
                device = devices[i % len(devices)]
                depth = cfg.pipeline_depth or 2
                first = device not in taken
                taken.add(device)
                self.instances.append(Instance(servable, i, device, depth, cpu_linear, self._lost, first))
        except BaseException as exc:
            # An instance failed to build (its module's move or copy, a CUDA stream; a BaseException too: a Ctrl-C
            # lands here where the bench tools build an executor on the main thread): nobody gets this executor to
            # shut down, so those built before it are shut down here, their pools closed (their idle threads
            # ended and joined) and their fault states stopped; then dropped, as is what the failing instance made:
            # the error's traceback holds this frame (`self`) and that instance's, and with them each instance's
            # module, a copy for every later instance on a device (on CUDA, device memory), as long as it is kept.
            self.shutdown()
            self.instances.clear()
            _clear_frames(exc)
            raise

    def devices_lost(self) -> dict[str, bool]:
        """Each of the model's devices, and whether a device-side error made it unusable (Instance.lost)."""
        return {str(inst.device): str(inst.device) in self._lost for inst in self.instances}

    @property
    def lost(self) -> DeviceLost | None:
        """DeviceLost for the first of the model's devices lost to a device-side error; None if none is."""
        for inst in self.instances:
            lost = inst.lost
            if lost is not None:
                return lost
        return None

    @property
    def slot_count(self) -> int:
        return sum(len(inst.slots) for inst in self.instances)

    def slots(self) -> list[tuple[int, int]]:
        """(instance, slot) pairs, every instance's first slot before any second one."""
        deepest = max(len(inst.slots) for inst in self.instances)
        return [(i, s) for s in range(deepest) for i, inst in enumerate(self.instances) if s < len(inst.slots)]

    def warmup(self) -> None:
        """Run one single-row batch of zeros on each instance, so the first request pays no lazy init;
        on an instance with oneDNN layers, also one batch at each row count they pad to, up to
        WARMUP_MAX_ROWS, that runs on one thread (oneDNN builds a kernel for each on its first
        use, several ms)."""
        s = self.instances[0].servable
        sample = {}
        for t in s.config.inputs:
            shape = (1, *s.warmup_shape(t))
            try:
                sample[t.name] = np.zeros(shape, dtype=s.input_types[t.name].numpy)
            except (MemoryError, ValueError) as exc:  # dims no host can hold (numpy: too many elements, or dims)
                # The name and the shape cut as a failed batch's shapes are: whole, a name of 5,000 characters or
                # 5,000 dims made a line that left the config's path 256 characters, and that each command cut again.
                raise WarmupError(
                    _with_config(
                        f"model {quoted_name(s.name)}: its start-up warm-up cannot make a sample of zeros for input "
                        f"{quoted_name(t.name)}, shape {cut_message(str(list(shape)), WARMUP_SHAPES_BYTES)} "
                        f"({t.datatype}): {str(exc).rstrip('.')}; check that input's dims (and warmup_dims) in its "
                        "config (",
                        s.config.source,
                        ")",
                    )
                ) from exc
        top = padded_rows(min(s.config.max_batch_size, WARMUP_MAX_ROWS))
        sizes = sorted({padded_rows(n) for n in range(MIN_ROWS, top + 1)})
        for inst in self.instances:
            self._warm(inst, sample, 1)
            if inst.onednn_layers:
                # Only sizes that run on one thread: a build that also warmed the two-thread sizes
                # was slower at light load in one side-by-side run, for a reason not found
                # (docs/performance.md); those sizes build their kernels at the first burst instead.
                for n in (n for n in sizes if inst.threads_for(n) == 1):
                    self._warm(inst, sample, n)
                inst.onednn_ran = onednn_counts(inst.module, ran=True)
            # What the warm-up made the module allocate (a buffer built at its first call) is its own too.
            inst.collect_owned()

    @staticmethod
    def _warm(inst: Instance, sample: dict[str, np.ndarray], rows: int) -> None:
        """One warm-up batch of `rows` copies of `sample`; WarmupError, in one line, if the model
        refuses it: a model may reject the zeros' shapes (a -1 dim run as 1), which the config can change."""
        # Read off the future, not raised: the model's KeyboardInterrupt, SystemExit or GeneratorExit
        # is its failure too (a batch's callers get it as any error), and raised out of the warm-up
        # it would end `wok serve` as if asked to (SystemExit(0): status 0, not a word of the model).
        fut = inst.submit([sample] * rows, [1] * rows, 0)
        exc = fut.exception()
        if exc is None:
            exc = fut.result().failure  # rerun in parts (_isolate): the batch as a whole failed
        if exc is not None:
            cfg = inst.servable.config
            # wok's own check of the answer (its shape, its dtype) failed, not the model: the zeros'
            # sizes are not what to change then.
            own_check = isinstance(exc, ModelExecutionError) and exc.__cause__ is None
            # The instance wraps the model's own error; that one's type is the one to show.
            if isinstance(exc, ModelExecutionError) and not own_check:
                exc = exc.__cause__
            shapes = cut_message(
                ", ".join(f"{quoted_name(name)} {[rows, *a.shape[1:]]}" for name, a in sample.items()),
                WARMUP_SHAPES_BYTES,
            )
            log.debug("model '%s': warm-up batch failed", cfg.name, exc_info=exc)
            hint = ""
            if not own_check and any(t.variable for t in cfg.inputs):
                hint = (
                    "; if the model needs other sizes for its variable (-1) dims, set them with warmup_dims on "
                    "each [[inputs]] of the config"
                )
            # wok's own check names the model, the output, what it expected and what it got, as a batch's
            # callers are told it; as the model's failure it read "model 'M' failed: ModelExecutionError: model
            # 'M' output ...", the model named twice beside a class of wok's.
            what = cut_message(str(exc) if own_check else failure_line(cfg.name, exc), WARMUP_MESSAGE_BYTES)
            raise WarmupError(
                _with_config(
                    f"{what}; in the start-up warm-up, on a batch of zeros with input shapes {shapes} on "
                    f"{inst.device} (config: ",
                    cfg.source,
                    f"){hint}",
                ),
                device_lost=inst.lost,
            ) from exc

    def shutdown(self) -> None:
        for inst in self.instances:
            inst.shutdown()
