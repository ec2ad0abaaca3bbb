"""The dynamic batcher: one owned task per model that turns queued requests into batches.

Requests wait in FIFO queues, one per batch key (requests of different keys cannot share
a batch). A key's queue flushes when its samples reach the target size (max_batch_size,
or the largest preferred size) or when its oldest request has waited max_queue_delay;
on stop, everything left flushes at once ("drain"). A batch is formed only when an
executor slot is free, so under load batches fill up while the instances are busy; a busy
instance's spare slot (pipeline_depth >= 2) takes only a full batch, so that at saturation the
next batch waits at the worker, not in the queue, and below it batches still form when an
instance is free to run them.

Each request has one future. The batcher hands a batch to the executor once and gets it
back once (one thread hop each way), then resolves every future of the batch; a batch
that fails fails every caller in it. Submitting and withdrawing are O(1) (a heap push
when a queue gets a new head, so O(log keys)); dead entries (withdrawn, expired) are
skipped lazily. A heap of queue heads by arrival finds the next delay flush, and a set
of queues at their flush size finds size flushes, without scanning every key; across keys the
full queues and those past their delay window go oldest first, a queue ranked by the request
its next batch takes first (its most urgent level's first). A queued request whose deadline
passes is failed then, wherever it waits (the task's timer is armed for the earliest one), and so
is one in a full batch waiting at a busy CPU instance's worker (left out of it there). A request
whose deadline has already passed when it arrives is refused then (DeadlineExceeded), under
every policy: it never takes queue space.

Within a key's queue, requests wait per priority level (lower is more urgent); a batch takes
the most urgent level first, FIFO within a level. With the `slo` policy (server/policy.py,
docs/batching-policy.md) the flush rule is the policy's instead of the delay window: a queue
flushes when waiting longer would make its most pressed request miss its deadline
("deadline"), or when an instance is idle and waiting cannot raise throughput ("idle");
requests predicted to miss their deadline behind the queue ahead of them are refused at arrival
(DeadlineUnmeetable), and at dispatch a request expected to finish after its deadline (its batch
started when its instance is predicted free) is dropped. Across batch keys it serves the most
urgent queue first (priority level, then deadline), as admission assumes, and a full batch for
a spare slot goes to the busy instance predicted free first. The `slo` decisions visit the
queues most urgent first (a heap of the queues' ranks) and stop at the first that is due, so with
many batch keys a decision costs the queues more urgent than the one chosen, not every key (all of
them only when none is due, for the wait); the pass that fails expired requests at each wake visits
the queues due (a heap of the queues' earliest deadlines).
"""

from __future__ import annotations

import asyncio
import bisect
import concurrent.futures
import heapq
import itertools
import logging
import math
import time
from collections import Counter, deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

import numpy as np

from .errors import (
    MESSAGE_CHARS,
    BatcherFailed,
    DeadlineExceeded,
    DeadlineUnmeetable,
    DeviceLost,
    DeviceLostRefusal,
    InvalidInput,
    ModelExecutionError,
    QueueFull,
    ShuttingDown,
    cut_message,
    error_line,
    message_of,
)
from .executor import BatchResult, Executor
from .metrics import ModelMetrics
from .policy import MAX_TRACKED_KEYS, SloPolicy, read_profile_fit
from .ratelog import Throttle
from .stats import ModelStats
from .timers import PreciseTimer

log = logging.getLogger("wok.batcher")

# A delay flush to an idle CPU instance is preceded by a prewarm (Instance.prewarm: its weights
# read back into the caches) this long before it; none when the flush is nearer than PREWARM_MIN_S.
PREWARM_LEAD_S = 1e-3
PREWARM_MIN_S = 0.3e-3
# ...and only when at most this fraction of max_batch_size is queued as the prewarm is due. A small
# batch meets cold weights at several times its warm cost (mlp: 3.7x at 1 row, 1.4x at 32); near
# saturation batches are large, the worker's gaps short, and the read is CPU the batches need
# (with prewarms at every size, mlp's P99 at 3,000-3,500 QPS rose on the 2-core machine).
PREWARM_MAX_FRACTION = 0.25

QUEUED, RUNNING, DONE, WITHDRAWN = range(4)


class _Key:
    """A batch key as the batcher's task holds it: one object for each set of equal keys, hashed and compared by
    identity. The model's own key (`Servable.batch_key`) is the model's code: its __hash__ and __eq__ may raise, or
    change their answer. They run as `submit` queues a request (`Batcher._intern`), on the request's path, where what
    they raise fails that request alone (the service answers it INTERNAL); every structure the task reads (queues,
    heaps, the slo policy's fits) holds the _Key, so the task never runs the model's code. Run there, what a key
    raised failed the task: the model refused every request until a restart, a KeyboardInterrupt ended the server's
    loop, and a CancelledError was taken for the task's own cancellation (its requests answered as at a stop)."""

    __slots__ = ("kept", "key")

    def __init__(self, key: Hashable) -> None:
        self.key = key
        # Set by a sweep of `Batcher._keys` (and cleared by it) on the keys it must keep whatever their queues hold:
        # a batch's running, or the slo policy's fit or rate kept of it (KEYS_KEPT).
        self.kept = False

    def __repr__(self) -> str:
        return f"_Key({self.key!r})"


# How many keys `Batcher._keys` holds before a sweep, which keeps those a request queued or a batch running holds, or
# the slo policy keeps a fit or an arrival rate of (its MAX_TRACKED_KEYS most recent of each: `SloPolicy.tracked`),
# and drops the rest. So a key whose fit is kept keeps its _Key and finds its fit when it comes again, and a key
# dropped is in none of the policy's tables (nothing of it is held): seen again it is a new key, its fit learned anew.
# A key that merely came again is not kept for that: with nothing held by it a new _Key costs nothing, and keeping
# each such key (as before) let a client that sent every key twice between sweeps double the table at each one. The
# bound is then at least twice the keys the sweep kept, which is at most what the policy keeps (2 * MAX_TRACKED_KEYS)
# beside the keys of requests queued and batches running.
KEYS_KEPT = 2 * MAX_TRACKED_KEYS


@dataclass(slots=True, eq=False)
class Pending:
    """One request's life in the batcher."""

    # None once its batch is dispatched: the executor holds its own list of them, and a request
    # answered can outlive that in the batcher (a dead entry in a deadline heap, until it leaves
    # from the top) without holding its arrays.
    inputs: dict[str, np.ndarray] | None
    rows: int
    key: Hashable  # its _Key (Batcher._intern): the task never hashes the model's own key
    arrival: float  # time.perf_counter() when it joined the queue
    deadline: float | None  # time.perf_counter() after which it must not run
    future: asyncio.Future
    state: int = QUEUED
    dispatched: float = 0.0
    finished: float = 0.0  # when its batch's outputs were on the host (executor clock)
    started: float = 0.0  # when the worker took its batch (executor clock)
    compute: float = 0.0  # its batch's model time, seconds
    # Its batch's size, (requests, samples), for the server-timing trailer: its compute is the whole
    # batch's, so a reader weighs it by 1/requests to count each batch once. One tuple per batch.
    batch_size: tuple[int, int] = (0, 0)
    level: int = 1  # priority level: lower is more urgent
    probe: bool = False  # slo policy: admitted without a check (the model was idle), so it runs even if predicted late
    # Counted in ModelStatistics' fail here when failed; False: its caller counts it as it answers
    # (the service: when its handler resumes with the error, or a stream's answer is written).
    count_fail: bool = True
    # Its batch while that waits at a busy instance's worker, behind the batch ahead of it
    # (`Batcher._dispatch`); None otherwise, and once its batch is back.
    batch: Batch | None = None
    # Refused at its deadline here (`_expire`, `_answer_left_out`), its caller waiting or not: a caller whose
    # cancel came first finds its future cancelled, not the refusal, and still counts it (the service).
    expired: bool = False


@dataclass(slots=True)
class Batch:
    requests: list[Pending]
    samples: int
    reason: str
    instance: int = 0
    slot: int = 0
    dispatched: float = 0.0
    # When its instance started waiting for it with requests queued (None: the instance
    # was busy when it was dispatched); the wait ends when the worker starts the batch.
    idle_from: float | None = None
    key: Hashable = None
    to_idle: bool = False  # its instance was idle when it was dispatched (the hop is measured on these)
    # While it waits at a busy CPU instance's worker: the executor's future of the batch (or prewarm
    # read) ahead of it there (the worker, one thread, starts this one only once that one is done)
    # and the deadlines the worker reads as it starts it, one per request (a request withdrawn
    # meanwhile gets -inf: the worker leaves it out). None when nothing was ahead of it.
    ahead: concurrent.futures.Future | None = None
    deadlines: list[float | None] | None = None
    # Its executor future, once sent: withdrawn (`_fail_dispatched`) if the stop's grace period runs
    # out before its worker took it.
    future: concurrent.futures.Future | None = None


@dataclass(frozen=True)
class BatchingPolicy:
    max_batch_size: int
    max_queue_delay_s: float
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_size: int = 0

    @property
    def flush_size(self) -> int:
        return max(self.preferred_batch_sizes) if self.preferred_batch_sizes else self.max_batch_size


@dataclass
class _Queue:
    levels: dict[int, deque] = field(default_factory=dict)  # priority level -> FIFO of requests
    order: list[int] = field(default_factory=list)  # the levels present, most urgent first
    samples: int = 0  # live (queued) samples only
    requests: int = 0  # live (queued) requests
    # slo admission: how many live requests have each row count (how the queue packs into batches).
    rows: Counter = field(default_factory=Counter)
    # slo policy: heap of (deadline, seq, Pending), lazily pruned, and rebuilt with the live entries
    # when the dead ones outnumber them by a margin (`Batcher._push_deadline`).
    deadlines: list = field(default_factory=list)
    # The seq of this queue's one live entry in the batcher's heap of heads; its older entries
    # there are stale and are dropped when they reach the top.
    head_seq: int = -1
    # slo policy: likewise its one live entry in the batcher's heap of queue deadlines, and that
    # entry's deadline (inf: none), never later than the queue's earliest live deadline.
    due_seq: int = -1
    due: float = math.inf
    # slo policy: likewise its one live entry in the batcher's heap of queue ranks, and that entry's
    # rank (level, deadline), never less urgent than the queue's own (`Batcher._urgency`).
    rank_seq: int = -1
    rank: tuple[float, float] = (math.inf, math.inf)
    # When it joined the batcher's dict of queues: among equal ranks the one that joined first goes
    # first, as the dict's order had it when the slo choice scanned the dict.
    created: int = 0

    @property
    def entries(self):
        """Every entry (live or dead), most urgent level first, FIFO within a level."""
        return [p for level in self.order for p in self.levels[level]]

    def append(self, p: Pending) -> None:
        d = self.levels.get(p.level)
        if d is None:
            d = self.levels[p.level] = deque()
            bisect.insort(self.order, p.level)
        d.append(p)


def slo_policy_for(executor: Executor, max_batch_size: int) -> SloPolicy | None:
    """The `slo` policy object when the executor's model config selects it (dynamic_batching.policy)."""
    servable = executor.instances[0].servable if executor.instances else None
    db = getattr(getattr(servable, "config", None), "dynamic_batching", None)
    if db is None or getattr(db, "policy", "fixed") != "slo":
        return None
    seed = read_profile_fit(db.slo_profile) if db.slo_profile is not None else None
    return SloPolicy(db.slo_ms / 1e3, max_batch_size, len(executor.instances), quantile=db.slo_quantile, seed=seed)


# A failed batch's error is shown in FailureLog's line up to this many bytes, encoded (errors.cut_message).
LOG_MESSAGE_CHARS = MESSAGE_CHARS


class FailureLog:
    """A model's failed batches at WARNING in the server's log: the first at once, then at most
    one per `every_s`, saying how many were not logged in between.

    Callers get the error too, but an operator reads the log: without it a model that fails
    shows only as a rising INTERNAL count. Rate-limited, as a model broken for every input
    (or a fault injected on purpose) fails each of its batches. The error is cut to
    LOG_MESSAGE_CHARS in the line; the model's own exception follows it, with its traceback, as
    the record's exc_info.

    Those held within a window are told in the next failure's line or, once `start`ed on the batcher's
    loop, at the window's end if none came (the throttle's timer: failures that stopped were never told) and at
    `stop`. After `stop` each is told at once: no timer would tell it.
    """

    def __init__(self, model: str, every_s: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.model = model
        self._throttle = Throttle(every_s, clock)
        self._stopped = False

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Tell the held failures at each window's end from now on, by a timer on `loop` (the batcher's)."""
        self._throttle.arm(loop, self._tell_held)
        self._stopped = False

    def stop(self) -> None:
        """Tell what is held now, leave no timer on the loop, and hold none from now on."""
        self._stopped = True
        held = self._throttle.disarm()
        if held:
            log.warning(
                "model '%s': %d more failed batches since the last logged, as its batcher stops", self.model, held
            )

    def _tell_held(self, held: int) -> bool:
        log.warning(
            "model '%s': %d more failed batches in the %g s since the last logged",
            self.model,
            held,
            self._throttle.every_s,
        )
        return True

    def batch_failed(
        self,
        exc: BaseException,
        requests: int,
        samples: int,
        failed: int | None = None,
        reruns: int = 0,
        *,
        past_grace: bool = False,
    ) -> None:
        """`failed`: for a batch rerun in parts (`reruns` forwards), how many of its requests
        failed (alone, or all of them when its probes failed: executor's Instance._isolate); None
        for one that failed whole without a rerun. `past_grace`: it failed after the stop's grace period ran
        out, its callers answered UNAVAILABLE then (`Batcher._fail_dispatched`), not with this error."""
        # A batch still in the model as the stop's grace period ran out (`_fail_dispatched`) fails after `stop`,
        # where a failure held within the window was never told. Those come few (one a slot), each told whole.
        held = 0 if self._stopped else self._throttle.due()
        if held is None:
            return
        more = f" ({held} more failed batches since the last logged)" if held else ""
        parts = ""
        if failed is not None:
            parts = f"; rerun in parts ({reruns} forwards): {failed} request(s) failed, {requests - failed} answered"
        if past_grace:
            # Else the line read as the callers' answer, while they had the stop's UNAVAILABLE.
            parts += "; after the stop's grace period ran out: its callers had been answered UNAVAILABLE"
        message = cut_message(message_of(exc), LOG_MESSAGE_CHARS)
        # The model's own exception, with its traceback, when the error wraps one.
        log.warning(
            "model '%s': a batch of %d request(s), %d sample(s), failed: %s%s%s",
            self.model,
            requests,
            samples,
            message,
            parts,
            more,
            exc_info=exc.__cause__,
        )


def _live_heap(heap: list[tuple[float, int, Pending]]) -> list[tuple[float, int, Pending]]:
    """A deadline heap rebuilt with its queued requests' entries only (the answered ones dropped)."""
    live = [e for e in heap if e[2].state == QUEUED]
    heapq.heapify(live)
    return live


class Batcher:
    def __init__(
        self,
        name: str,
        executor: Executor,
        policy: BatchingPolicy,
        stats: ModelStats,
        metrics: ModelMetrics | None = None,
        slo: SloPolicy | None = None,
    ) -> None:
        """`slo`: the slo policy's object; None reads the model's config (`slo_policy_for`)."""
        self.name = name
        self.executor = executor
        self.policy = policy
        self.slo = slo if slo is not None else slo_policy_for(executor, policy.max_batch_size)
        config = getattr(executor.instances[0].servable, "config", None)
        db = getattr(config, "dynamic_batching", None)
        # The model's own limit (its config; requests are checked against it when decoded).
        self.configured_max_batch_size = getattr(config, "max_batch_size", policy.max_batch_size)
        self.default_level = getattr(db, "default_priority_level", 1)
        self.stats = stats
        self.metrics = metrics or ModelMetrics(name, len(executor.instances))
        self.failures = FailureLog(name)
        self.metrics.queue_depth = lambda: self._queued
        self.metrics.devices_lost = executor.devices_lost
        self.metrics.inflight = lambda: self._inflight
        self._queues: dict[Hashable, _Queue] = {}
        # By the model's own key, the _Key every structure below holds for it and its equals (`_intern`), swept past
        # `_keys_limit`.
        self._keys: dict[Hashable, _Key] = {}
        self._keys_limit = KEYS_KEPT
        # (arrival of a queue's head, seq, key). Every non-empty queue has exactly one live entry
        # (seq == its head_seq) whose arrival is at most its head's; a flush that leaves requests
        # pushes a new one, and the older entry, now stale, is dropped when it reaches the top.
        # Under a backlog that never empties there is still one entry per queue, not per batch.
        self._heads: list[tuple[float, int, Hashable]] = []
        self._seq = itertools.count()
        self._full: set[Hashable] = set()  # keys whose queues (may) hold flush_size samples
        # fixed policy: the requests that have a deadline, so that one expires where it waits
        # (`_expire_due`), lazily pruned: in a FIFO while they come in deadline order (one timeout
        # for all: O(1)), the others in a heap of (deadline, seq, request). The slo policy keeps
        # each queue's in the queue's own heap, and across queues a heap of (deadline, seq, key):
        # as the heads', one live entry per queue with queued deadlines (seq == its due_seq), its
        # deadline no later than the queue's earliest, fixed lazily when it reaches the top.
        self._deadline_fifo: deque[Pending] = deque()
        self._deadlines: list[tuple[float, int, Pending]] = []
        self._dues: list[tuple[float, int, Hashable]] = []
        # slo policy: the queues by rank, (level, deadline, created, seq, key), one live entry per
        # non-empty queue (seq == its rank_seq) whose rank is never less urgent than the queue's,
        # fixed lazily when it reaches the top: the choice visits the queues most urgent first and
        # stops at the first that is due. And the keys whose queues emptied since the last decision
        # (each decision drops those still empty, as the choice's scan of every queue did).
        self._ranks: list[tuple[float, float, int, int, Hashable]] = []
        self._emptied: set[Hashable] = set()
        self._failed: BaseException | None = None
        # Called (on the loop) once if the batching task fails: the server marks the model not serving.
        self.on_failed: Callable[[BaseException], None] | None = None
        self._queued = 0  # live queued requests
        self._inflight = 0  # batches in the executor
        self._dispatched: dict[int, Batch] = {}  # those batches, by id(): failed if the grace period runs out
        # Each instance's last dispatched batch's executor future, or its prewarm read's when that came
        # later: the one a batch sent to it waits behind. And the batches waiting so with a request's
        # deadline, as (their earliest such deadline, seq, batch), lazily pruned: a deadline that passes
        # there is answered then (`_expire_held`), not when the batch ahead has run.
        self._last_sent: list[concurrent.futures.Future | None] = [None] * len(executor.instances)
        self._held: list[tuple[float, int, Batch]] = []
        self._free_slots = executor.slots()
        self._busy = [0] * len(executor.instances)
        # Fixed policy: when each busy instance's running batch started (its dispatch to the idle
        # instance, or the end of the batch ahead of it), the proxy for which frees first.
        self._running_since = [0.0] * len(executor.instances)
        # Each instance's batches in the executor, in the order sent: the first is the one running.
        # A CUDA batch that fails at launch comes back before the one ahead of it is done.
        self._sent: list[list[Batch]] = [[] for _ in executor.instances]
        # For the idle-while-queued time: when each instance last finished its last batch,
        # and since when requests have been queued (None while nothing is).
        self._idle_since = [time.perf_counter()] * len(executor.instances)
        self._queued_since: float | None = None
        # slo policy: when each instance is predicted to be free, the live queued samples per
        # priority level (for admission), and when the task's timer is set to fire.
        self._free_at = [0.0] * len(executor.instances)
        self._level_samples: dict[int, int] = {}
        self._timer_at = math.inf
        # Every live request the running `_form` took off its queue (for the batch or to expire),
        # until it returns: were it to fail halfway, the task's handler answers these, which
        # neither the queue nor a formed batch holds any more.
        self._forming: list[Pending] = []
        self._stopping = False
        self._task: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wakeup: asyncio.Event | None = None
        self._timer: PreciseTimer | None = None
        self._prewarm_timer: PreciseTimer | None = None
        self._prewarm_for = math.inf  # the flush instant the last prewarm was planned for
        self._prewarm = any(inst.can_prewarm for inst in executor.instances)

    # -- lifecycle ----------------------------------------------------------------------
    def start(self) -> None:
        """Start the batching task on the running loop."""
        if self._task is not None:
            raise RuntimeError(f"batcher for '{self.name}' already started")
        self._loop = asyncio.get_running_loop()
        self._wakeup = asyncio.Event()
        self._timer = PreciseTimer(self._loop, self._wakeup.set)
        if self._prewarm:
            self._prewarm_timer = PreciseTimer(self._loop, self._prewarm_next)
        self._task = self._loop.create_task(self._run(), name=f"wok-batcher-{self.name}")
        self.failures.start(self._loop)

    async def stop(self) -> None:
        """Refuse new requests, run everything queued and in flight, then end the task.

        If this is cancelled (the grace period ran out), the task is cancelled too and what
        is still queued, or in a batch sent to the executor, fails with UNAVAILABLE; the batches
        sent that their workers have not started are withdrawn, never run (`_fail_dispatched`).
        """
        self._stopping = True
        if self._task is None:
            return
        self._wakeup.set()
        try:
            await asyncio.shield(self._task)
        except asyncio.CancelledError:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            raise
        finally:
            # After the task: the drain's batches may fail too.
            self.failures.stop()

    def set_policy(self, policy: BatchingPolicy) -> None:
        """Replace the batching policy live (the admin API); every later decision reads the new one.

        A request with more rows than a lowered max_batch_size (queued, or sent later) runs in
        a batch of its own: it fits the model's configured maximum, which clients are told.
        Raises ValueError for a max_batch_size above the configured one.
        """
        if policy.max_batch_size > self.configured_max_batch_size:
            raise ValueError(
                f"max_batch_size {policy.max_batch_size} is above the configured {self.configured_max_batch_size}"
            )
        self.policy = policy
        self._full.update(self._queues)  # a smaller flush size may make queues full now
        if self._wakeup is not None:
            self._wakeup.set()

    @property
    def failed(self) -> BaseException | None:
        """What ended the batching task, if it failed (the model then refuses every request)."""
        return self._failed

    @property
    def queued(self) -> int:
        return self._queued

    @property
    def inflight(self) -> int:
        return self._inflight

    @property
    def running(self) -> int:
        """The batches in the executor that its threads have not ended (their future not done): `inflight` less
        those whose end is on its way to the loop (`_complete` counts them out there). Read on the loop."""
        return sum(1 for sent in self._sent for b in sent if b.future is not None and not b.future.done())

    # -- requests ------------------------------------------------------------------------
    def check_room(self) -> None:
        """Raise what `submit` would for any request now: the batcher failed, it stops, or the
        queue is full. The service asks before decoding, so that under overload a refusal
        costs no decode (submit asks again: a request of many typed values is read over several
        turns of the loop, in which the queue may fill)."""
        if self._failed is not None:
            if isinstance(self._failed, DeviceLost):
                raise DeviceLostRefusal(str(self._failed))
            raise BatcherFailed(f"model '{self.name}' cannot run requests: its batcher failed: {self._failed}")
        if self._stopping:
            raise ShuttingDown(f"server is shutting down; model '{self.name}' accepts no new requests")
        limit = self.policy.max_queue_size
        if limit and self._queued >= limit:
            raise QueueFull(
                f"model '{self.name}' queue is full: {self._queued} requests queued, "
                f"max_queue_size is {limit}; retry later"
            )

    def submit(
        self,
        inputs: dict[str, np.ndarray],
        rows: int,
        key: Hashable,
        deadline: float | None,
        priority: int | None = None,
        count_fail: bool = True,
    ) -> Pending:
        """Queue a checked request; raises QueueFull, ShuttingDown, DeadlineExceeded (its deadline has
        passed), or with the slo policy DeadlineUnmeetable, at once.

        `priority`: its level (lower is more urgent); None takes the model's default level.
        `count_fail`: False when the caller counts the request in ModelStatistics' fail itself, should
        it fail here (DeadlineExceeded at once, or the error its future is answered with).
        """
        self.check_room()
        if rows > self.configured_max_batch_size:  # the codec checks it; a direct caller may not
            raise InvalidInput(
                f"model '{self.name}': expected at most {self.configured_max_batch_size} rows in a request (its "
                f"max_batch_size); got {rows}"
            )
        if rows < 1:  # likewise: queued, it would run a batch of nothing, or (slo) never be due
            raise InvalidInput(f"model '{self.name}': expected at least 1 row in a request; got {rows}")
        now = time.perf_counter()
        level = priority or self.default_level
        slo = self.slo
        if slo is not None:
            own = now + slo.slo_s
            deadline = own if deadline is None else min(deadline, own)
        if deadline is not None and now >= deadline:
            # Under every policy, before it takes queue space: queued, it would wait up to a whole
            # delay window only to be dropped at its batch, and count toward max_queue_size meanwhile.
            # No retry could meet it, so it gets no retry hint; counted as a failure, as the
            # request dropped at its batch is, and by the service as reason="deadline".
            if count_fail:
                self.stats.fail.add(0.0)
            raise DeadlineExceeded(
                f"request to model '{self.name}' arrived {1e3 * (now - deadline):.1f} ms after its deadline "
                "passed; it was not queued"
            )
        key = self._intern(key)  # the model's code: before anything changes, should it raise
        probe = self._admit(key, rows, level, deadline, now) if slo is not None else False
        fut = self._loop.create_future()
        p = Pending(inputs, rows, key, now, deadline, fut, level=level, probe=probe, count_fail=count_fail)
        q = self._queues.get(key)
        if q is None:
            q = self._queues[key] = _Queue(created=next(self._seq))
        idle = self._queued == 0
        if idle:
            self._queued_since = p.arrival
        if q.samples == 0 and slo is None:  # the slo policy scans its queues instead
            self._push_head(key, q, p.arrival)
        q.append(p)
        q.samples += rows
        q.requests += 1
        q.rows[rows] += 1
        self._queued += 1
        self._level_samples[level] = self._level_samples.get(level, 0) + rows
        full = q.samples >= self.policy.flush_size
        if full:
            self._full.add(key)
        # Wake the task only when this arrival can change its decision: with nothing queued
        # it has no timer, and a full queue flushes now. A new head is never older than the
        # one whose timer is already set. With the slo policy: also when this request's own
        # latest start is before the timer, or the queue reached the idle rule's size.
        wake = idle or full
        if slo is None:
            if deadline is not None:  # the task wakes to drop it if it is still queued then
                fifo = self._deadline_fifo
                if not fifo or deadline >= fifo[-1].deadline:
                    fifo.append(p)
                else:
                    heapq.heappush(self._deadlines, (deadline, next(self._seq), p))
                wake = wake or deadline < self._timer_at
        else:
            slo.arrived(key, now, rows)
            self._push_deadline(key, q, p)
            # Its most urgent level present and its heap's earliest deadline: no less urgent than
            # the queue's rank now (this request counted), so the heap's order stays exact.
            rank = (q.order[0], q.deadlines[0][0])
            if q.rank_seq < 0 or rank < q.rank:
                self._push_rank(key, q, rank)
            n = q.samples
            wake = (
                wake
                or slo.latest_start(key, self._earliest_deadline(q), n) < self._timer_at
                or n >= slo.idle_target(key, now)
            )
        if wake:
            self._wakeup.set()
        return p

    def _intern(self, key: Hashable) -> _Key:
        """The _Key of the keys equal to `key`, made if there is none. The key's __hash__ and __eq__ (the model's
        code) run here, and in a sweep: what they raise here is the caller's, before anything has changed."""
        held = self._keys.get(key)
        if held is not None:
            return held
        if len(self._keys) >= self._keys_limit:
            self._sweep_keys()
        held = self._keys[key] = _Key(key)
        return held

    def _sweep_keys(self) -> None:
        """Drop the keys that no request queued (an emptied queue waits for the task to drop it) nor batch running
        holds, and that the slo policy keeps no fit or rate of (KEYS_KEPT). Those kept are hashed again: one whose
        __hash__ or __eq__ raises now is dropped too, its queue (keyed by its _Key) served as it is; a request of an
        equal key is queued anew, or fails as its key's hash does."""
        # A running batch's key too: its end teaches the policy its fit (`_complete`), which a key dropped meanwhile
        # would hold for nothing.
        for batch in self._dispatched.values():
            batch.key.kept = True
        if self.slo is not None:
            for held in self.slo.tracked():
                held.kept = True
        queues = self._queues
        kept: dict[Hashable, _Key] = {}
        for key, held in self._keys.items():
            if held.kept or ((q := queues.get(held)) is not None and q.requests):
                held.kept = False
                try:
                    kept[key] = held
                except BaseException:
                    # The model's code, run for no request: nothing to answer, and none of its failures a signal's
                    # (`wok serve` takes its signals through the loop; the service answers a key's KeyboardInterrupt
                    # or SystemExit as it queues a request as that request's failure, `_ModelRaised`). Let through,
                    # it would fail the request that made this sweep, for another key, and leave the table unswept
                    # for the next new key's request to hash the same key again.
                    pass
        self._keys = kept
        self._keys_limit = max(KEYS_KEPT, 2 * len(kept))

    def _admit(self, key: Hashable, rows: int, level: int, deadline: float, now: float) -> bool:
        """slo policy: refuse a request predicted to miss its deadline behind the queue ahead of it
        (`SloPolicy.finish_estimate`, from when each instance is predicted free).

        `submit` has already refused one whose deadline has passed (DeadlineExceeded, under every
        policy). With the model idle (nothing running, nothing queued) a request is let through
        unchecked (True: a probe): refusals teach the batch-time model nothing, so estimates inflated
        by a slow spell would otherwise refuse everything for good.
        """
        slo = self.slo
        slo.max_batch_size = self.policy.max_batch_size  # set_policy may have changed it
        if self._queued == 0 and self._inflight == 0:
            return True
        ahead = sum(n for lvl, n in self._level_samples.items() if lvl <= level)
        free = [self._free_time(i, now) for i in range(len(self._busy))]
        # A backlog flushes "size" batches of the flush size (the largest preferred size): `_form`
        # caps them there, so the queue ahead is costed in batches of that size, not the maximum.
        # `_form` never splits a request: with r rows each, a batch holds size − size % r samples;
        # with rows that differ (at most R), at least size − R + 1 (it closes only when the next
        # request does not fit). The distinct row counts queued are few (at most the maximum).
        size = min(self.policy.flush_size, self.policy.max_batch_size)
        q = self._queues.get(key)
        counts = q.rows.keys() if q is not None else ()
        if rows > size and all(r > size for r in counts):
            # Every request is over every preferred size: `_form` then fills each batch up to the
            # maximum, not the flush size (costed at the flush size, such a backlog was refused far
            # below what its batches meet, or, with little fixed cost per batch, admitted to miss).
            size = self.policy.max_batch_size
        if all(r == rows for r in counts):
            pack = None
            if rows <= size:
                size -= size % rows
        else:
            pack = size - max(rows, *counts) + 1
        finish = slo.finish_estimate(key, free, ahead, rows, size, pack)
        if finish > deadline:
            miss = finish - deadline
            raise DeadlineUnmeetable(
                f"model '{self.name}' cannot finish this request before its deadline "
                f"({1e3 * (deadline - now):.1f} ms from now): with {ahead} samples queued ahead of it "
                f"it would finish in about {1e3 * (finish - now):.1f} ms",
                retry_after_s=miss,
            )
        return False

    def _free_time(self, inst: int, now: float) -> float:
        """slo policy: when instance `inst` is predicted free (now if idle, or if it runs over its prediction)."""
        return max(now, self._free_at[inst]) if self._busy[inst] else now

    def _passed(self, waited_s: float) -> str:
        """The message of a request dropped because its deadline passed before it could run."""
        return (
            f"request to model '{self.name}' waited {1e3 * waited_s:.1f} ms in the queue and its deadline "
            "passed before it could run"
        )

    def _push_deadline(self, key: Hashable, q: _Queue, p: Pending) -> None:
        """slo policy: add a queued request's deadline to its queue's heap, and to the heap of queue
        deadlines if it is now the queue's earliest."""
        heap = q.deadlines
        heapq.heappush(heap, (p.deadline, next(self._seq), p))
        if len(heap) > 2 * q.requests + 64:
            # Entries leave from the top only: behind a queued request with an early deadline (a
            # less urgent level starved, a shorter timeout) the answered ones would pile up, each
            # holding its tensors, for as long as that deadline (up to slo_ms): rebuilt with the
            # live ones only, amortized O(1).
            q.deadlines = _live_heap(heap)
        if p.deadline < q.due:
            self._push_due(key, q, p.deadline)

    def _push_due(self, key: Hashable, q: _Queue, deadline: float) -> None:
        """Make (deadline, key) the queue's one live entry in the heap of queue deadlines."""
        seq = next(self._seq)
        q.due_seq, q.due = seq, deadline
        dues = self._dues
        heapq.heappush(dues, (deadline, seq, key))
        if len(dues) > 2 * len(self._queues) + 64:
            # A queue emptied and dropped (`_drop_emptied`), or one whose earliest deadline came earlier,
            # leaves a stale entry until its deadline reaches the top: rebuilt, amortized O(1).
            queues = self._queues
            self._dues = dues = [e for e in dues if e[2] in queues and queues[e[2]].due_seq == e[1]]
            heapq.heapify(dues)

    def _push_rank(self, key: Hashable, q: _Queue, rank: tuple[float, float]) -> None:
        """Make (rank, key) the queue's one live entry in the heap of queue ranks."""
        seq = next(self._seq)
        q.rank_seq, q.rank = seq, rank
        ranks = self._ranks
        heapq.heappush(ranks, (rank[0], rank[1], q.created, seq, key))
        if len(ranks) > 2 * len(self._queues) + 64:
            # A queue dropped, or one that got a more urgent request, leaves a stale entry until it
            # reaches the top: rebuilt, amortized O(1).
            queues = self._queues
            self._ranks = ranks = [e for e in ranks if e[4] in queues and queues[e[4]].rank_seq == e[3]]
            heapq.heapify(ranks)

    def _next_ranked(self, passed: list) -> tuple[Hashable, _Queue, tuple[float, float]] | None:
        """slo policy: the most urgent non-empty queue left in the heap of ranks (ties: the one that
        joined first), as (key, queue, rank); its entry moves onto `passed`, which the caller
        gives back (`_unpass`). None when no queue is left."""
        ranks = self._ranks
        queues = self._queues
        while ranks:
            level, deadline, created, seq, key = ranks[0]
            q = queues.get(key)
            if q is None or seq != q.rank_seq:  # superseded by the queue's newer entry, or its queue is gone
                heapq.heappop(ranks)
                continue
            if q.samples <= 0:  # the choice drops it; a request that comes first pushes a new entry
                heapq.heappop(ranks)
                q.rank_seq, q.rank = -1, (math.inf, math.inf)
                continue
            rank = self._urgency(q)
            if rank[0] != level or rank[1] != deadline:  # requests left: requeue at its rank now
                seq = next(self._seq)
                q.rank_seq, q.rank = seq, rank
                heapq.heapreplace(ranks, (rank[0], rank[1], created, seq, key))
                continue
            # Exact, and every other entry is no less urgent than its queue: this is the next.
            passed.append(heapq.heappop(ranks))
            return key, q, rank
        return None

    def _unpass(self, passed: list) -> None:
        """Put back the entries `_next_ranked` took (still exact: nothing changed their queues)."""
        if not self._ranks:
            self._ranks = passed  # taken in order: already a heap
            return
        for entry in passed:
            heapq.heappush(self._ranks, entry)

    def _earliest_deadline(self, q: _Queue) -> float:
        """The earliest deadline among a queue's live requests (slo policy); inf when none."""
        heap = q.deadlines
        while heap and heap[0][2].state != QUEUED:
            heapq.heappop(heap)
        return heap[0][0] if heap else math.inf

    def withdraw(self, p: Pending) -> bool:
        """The caller gave up (cancelled): leave the queue if still queued, or its batch if that still
        waits at its instance's worker behind another batch or a prewarm read (the worker leaves it out
        as it starts the batch). True if it left either before it ran, as the requests whose deadline
        passes there are refused (`deadline`)."""
        if p.state == QUEUED:
            self._forget(p)
            p.state = WITHDRAWN
            p.inputs = None  # its entries stay until they reach a front; its caller is gone
            return True
        if p.state == RUNNING and p.batch is not None:
            batch = p.batch
            if batch.ahead is not None and not batch.ahead.done():
                # Not started: the worker starts it only after the batch ahead is done, and reads
                # the deadlines then (a list item's store is atomic). Should the batch ahead end
                # between the check and the store, the worker may start it first: the request
                # then runs for nobody, as it did before, and is answered nothing more.
                batch.deadlines[batch.requests.index(p)] = -math.inf
                p.state = WITHDRAWN
                return True
        return False

    def _forget(self, p: Pending) -> None:
        q = self._queues[p.key]
        q.samples -= p.rows
        q.requests -= 1
        if q.rows[p.rows] > 1:
            q.rows[p.rows] -= 1
        else:  # only the row counts queued stay: `_admit` reads the distinct ones
            del q.rows[p.rows]
        left = self._level_samples[p.level] - p.rows
        if left:
            self._level_samples[p.level] = left
        else:  # only the levels with queued samples stay: clients choose the levels
            del self._level_samples[p.level]
        if q.samples <= 0 and self.slo is not None:
            self._emptied.add(p.key)
        self._queued -= 1
        if self._queued == 0:
            self._queued_since = None

    # -- the task ------------------------------------------------------------------------
    async def _run(self) -> None:
        timer = self._timer
        batch = None  # the batch taken off its queue and not yet handed over, if any
        try:
            while True:
                now = time.perf_counter()
                expiry = (
                    self._expire_due(now)
                    if self._deadline_fifo or self._deadlines or self.slo is not None
                    else math.inf
                )
                if self._held:
                    expiry = min(expiry, self._expire_held(now))
                if self._free_slots:
                    # A busy instance's spare slot takes only a full batch, queued behind the
                    # running one so the worker never waits for the loop at saturation; a batch
                    # that is not full waits for an idle instance, as it can only grow meanwhile.
                    # The slot is chosen first (an idle instance's whenever there is one): with
                    # the slo policy the batch is judged from when its instance will be free.
                    i = self._choose_slot(now)
                    inst = self._free_slots[i][0]
                    start = self._free_time(inst, now) if self.slo is not None else now
                    key, q, reason, wait = self._pick(now, full_only=self._busy[inst] > 0, start=start)
                    if q is not None:
                        queued_since = self._queued_since
                        batch = self._form(key, q, reason, now, start)
                        self._forming.clear()
                        if batch is not None:
                            self._dispatch(batch, queued_since, i)
                            batch = None
                        continue
                else:
                    wait = None
                if self._stopping and self._queued == 0 and self._inflight == 0:
                    return
                self._wakeup.clear()
                # The next flush is armed for its exact instant (a timerfd where the OS has
                # one: the loop's own timers can fire up to a millisecond late).
                # A timer left armed from an earlier pass only wakes the task once more.
                # Also armed for the earliest queued deadline, whether or not an instance is free.
                flush_at = now + wait if wait is not None else math.inf
                self._timer_at = min(flush_at, expiry)
                if self._timer_at < math.inf:
                    # An instant for a deadline alone is armed only when earlier than the pending
                    # one: at saturation the earliest queued deadline moves later with every batch
                    # that leaves, and re-arming at each pass cost the loop 1.5-5 µs per request.
                    if wait is not None or timer.armed_at > self._timer_at:
                        timer.arm(self._timer_at)
                    if wait is not None and self._prewarm and self.slo is None and flush_at != self._prewarm_for:
                        # Below saturation the batch will meet its weights cold: read them first.
                        self._prewarm_for = flush_at
                        if wait >= PREWARM_MIN_S:
                            self._prewarm_timer.arm(max(now, flush_at - PREWARM_LEAD_S))
                else:
                    timer.disarm()
                await self._wakeup.wait()
                if self._timer_at < math.inf and self.slo is not None:
                    late = time.perf_counter() - self._timer_at
                    if late >= 0:  # woken by the timer, this late
                        self.slo.observe_late(late)
        except asyncio.CancelledError:
            self._fail_queued(ShuttingDown(f"server stopped before model '{self.name}' ran this request"))
            self._fail_dispatched()
            raise
        except Exception as exc:
            # A bug here must not leave callers waiting forever: fail them, refuse new work.
            log.exception("batcher for model '%s' failed", self.name)
            error = ModelExecutionError(f"model '{self.name}': batcher failed: {exc}")
            if batch is not None:
                self._fail_formed(batch, error)
            now = time.perf_counter()
            for p in self._forming:
                if not p.future.done():
                    self._fail(p, error, now)
            self._forming.clear()
            self._fail_model(exc, error)
            raise
        finally:
            timer.close()
            if self._prewarm_timer is not None:
                self._prewarm_timer.close()

    def _expire_due(self, now: float) -> float:
        """Fail every queued request whose deadline has passed, wherever it waits in its queue (as
        `_form` fails one it reaches); the earliest deadline still queued (inf: none).

        Left to `_form`, one queued behind more urgent work or busy instances would be answered
        only when its turn came, maybe seconds later, and meanwhile count toward max_queue_size,
        the depth gauge and slo admission's samples ahead. Its entry in the queue stays, dead, as
        a withdrawn one's does. The slo policy keeps every request's deadline in its queue's heap
        already, and the queues' earliest in `_dues` (a pass visits the queues due, not every
        key); the fixed policy keeps the requests that have one in `_deadline_fifo` and
        `_deadlines`, and nothing for those that have none.
        """
        if self.slo is None:
            fifo = self._deadline_fifo
            while fifo and (fifo[0].state != QUEUED or fifo[0].deadline <= now):
                self._expire_left(fifo.popleft(), now)
            heap = self._deadlines
            earliest = self._expire_heap(heap, now)
            if len(fifo) + len(heap) > 2 * self._queued + 64:
                # Behind a live entry with a late deadline (a less urgent request starved at
                # saturation) the answered ones would pile up, each holding its tensors, for as
                # long as that deadline: rebuilt with the live ones only, amortized O(1).
                self._deadline_fifo = fifo = deque(p for p in fifo if p.state == QUEUED)
                self._deadlines = heap = _live_heap(heap)
            return min(fifo[0].deadline, earliest) if fifo else earliest
        while self._dues:  # `_push_due` may rebuild the list
            due, seq, key = self._dues[0]
            q = self._queues.get(key)
            if q is None or seq != q.due_seq:  # superseded by the queue's newer entry, or its queue is gone
                heapq.heappop(self._dues)
                continue
            earliest = self._expire_heap(q.deadlines, now)
            if earliest == due:  # exact, and every other entry is no later than its queue's earliest
                return due
            # Its earliest request left (answered, withdrawn, expired just now): requeue the next.
            heapq.heappop(self._dues)
            if earliest < math.inf:
                self._push_due(key, q, earliest)
            else:
                q.due_seq, q.due = -1, math.inf
        return math.inf

    def _expire_heap(self, heap: list[tuple[float, int, Pending]], now: float) -> float:
        """Pop the heap's dead and expired entries (failing the expired); its earliest deadline left."""
        while heap and (heap[0][2].state != QUEUED or heap[0][0] <= now):
            self._expire_left(heapq.heappop(heap)[2], now)
        return heap[0][0] if heap else math.inf

    def _expire_held(self, now: float) -> float:
        """Fail the requests whose deadline has passed in a batch still waiting at a busy instance's
        worker (`_dispatch`); the earliest deadline still held there (inf: none).

        The batch is not started while the batch ahead of it on the instance is not done (its
        worker is one thread): the worker, reading the deadlines as it starts it, will leave each
        such request out (BatchResult.kept), as it would have anyway, so it is answered now rather
        than when the batch ahead has run, up to a batch time later. Once the batch ahead is done
        the batch may have started: what its worker left out is answered when it is back.
        """
        heap = self._held
        while heap:
            deadline, _, batch = heap[0]
            ahead = batch.ahead
            if ahead is None or ahead.done():
                heapq.heappop(heap)
                continue
            if deadline > now:
                return deadline
            heapq.heappop(heap)
            nxt = math.inf
            for p in batch.requests:
                if p.state != RUNNING or p.deadline is None:
                    continue
                if p.deadline <= now:
                    self._answer_left_out(p, now)
                elif p.deadline < nxt:
                    nxt = p.deadline
            if nxt < math.inf:
                heapq.heappush(heap, (nxt, next(self._seq), batch))
        return math.inf

    def _fail(self, p: Pending, exc: BaseException, now: float) -> None:
        """Answer `p` with `exc` at `now`. Counted failed (ModelStatistics' fail) only if its caller
        still waits: one gone (cancelled, its call's deadline passed) is answered nothing, as a
        request answered after its caller left counts no success. Counted here unless its caller
        counts it (`Pending.count_fail`)."""
        p.state = DONE
        p.finished = now
        if not p.future.done():
            p.future.set_exception(exc)
            if p.count_fail:
                self.stats.fail.add(now - p.arrival)

    def _answer_left_out(self, p: Pending, at: float) -> None:
        """Fail a request whose deadline passed while its batch waited at its instance's worker, before it ran."""
        p.expired = True
        # The work ahead may be no batch: an idle instance's prewarm read (`_prewarm_next`) holds the worker too,
        # and "a busy instance" sent the reader looking for load that was not there.
        exc = DeadlineExceeded(
            f"request to model '{self.name}' waited {1e3 * (at - p.arrival):.1f} ms and its deadline passed "
            f"before it could run (its batch was waiting behind its instance's earlier work: a batch, or a prewarm "
            f"read of the weights)"
        )
        self._fail(p, exc, at)

    def _expire_left(self, p: Pending, now: float) -> None:
        """An entry taken off a deadline structure: if still queued, its deadline has passed."""
        if p.state == QUEUED:
            self._forget(p)
            self._expire(p, now, now, 0.0)

    def _prewarm_next(self) -> None:
        """Prewarm the instance the next batch will go to, if it is still idle with requests queued."""
        if not self._queued or not self._free_slots:
            return
        if self._queued > max(1, int(PREWARM_MAX_FRACTION * self.policy.max_batch_size)):
            return
        inst, _ = min(self._free_slots, key=lambda s: self._busy[s[0]])
        if self._busy[inst] == 0:
            try:
                read = self.executor.instances[inst].prewarm()
            except RuntimeError:  # the executor was shut down: the batch itself will fail and say so
                return
            if read is not None:
                # The batch sent next waits behind the read (one worker thread): a caller gone meanwhile
                # is withdrawn from it (`withdraw`) rather than run for nobody.
                self._last_sent[inst] = read

    def _pick(
        self, now: float, full_only: bool = False, start: float | None = None
    ) -> tuple[Hashable, _Queue | None, str, float | None]:
        """(key, queue, reason) to flush now; else (None, None, '', seconds to the next delay flush).

        With `full_only`, only a queue at its flush size (or any, when draining) may go; the
        next completion wakes the task, so no timer is needed. `start` (slo policy): when the
        busy instance whose spare slot a full batch would take is predicted free (default now).
        """
        flush_size = self.policy.flush_size
        slo = self.slo
        if self._emptied:
            self._drop_emptied()
        best = None
        for key in list(self._full):
            q = self._queues.get(key)
            head = self._next_first(q) if q is not None else None
            if head is None or q.samples < flush_size:
                self._full.discard(key)
                continue
            # fixed: the oldest first, by the request its next batch takes first (its most urgent
            # level's); slo: the most urgent, as admission assumed.
            rank = head.arrival if slo is None else self._urgency(q)
            if best is None or rank < best[2]:
                best = (key, q, rank)
        if slo is not None and not self._stopping:
            if not full_only:
                return self._pick_slo(now)
            if best is None:
                return None, None, "", None
            # A full batch on a spare slot runs before whatever is queued when the instance frees:
            # not while a more urgent queue would then start after its latest start.
            m = self.policy.max_batch_size
            end = (now if start is None else start) + slo.times.predict(best[0], min(best[1].samples, m))
            if self._pressed(best[2], end) is not None:
                return None, None, "", None
            return best[0], best[1], "size", None
        if self._stopping and best is not None and slo is None:
            return best[0], best[1], "drain", None
        if full_only and not self._stopping:
            if best is None:
                return None, None, "", None
            if slo is None and self._pick_fixed(now, best)[2] == "delay":
                # A queue past its window ranks older: the spare slot stays empty (it takes only full
                # batches), so that it goes first on the idle instance instead of queueing behind
                # one full batch after another for as long as the full queue stays full.
                return None, None, "", None
            return best[0], best[1], "size", None
        if slo is not None:
            return self._pick_slo(now)
        return self._pick_fixed(now, best)

    def _pick_fixed(
        self, now: float, best: tuple[Hashable, _Queue, float] | None
    ) -> tuple[Hashable, _Queue | None, str, float | None]:
        """The fixed policy's choice with an instance idle: among the full queues (`best`, the one
        ranked oldest) and those past their delay window, the one whose next batch's first request
        is oldest; else the wait to the next delay flush.

        A queue's window runs from its oldest request of any level (the heap's order), but its
        batch takes its most urgent level first, so a queue ranks by that level's first request:
        an old request of a less urgent level, which cannot leave while its queue has urgent
        work, must not put its whole key ahead of other keys' older requests. The heads are
        visited oldest first and only while one could still rank older than the best so far:
        one step when every queue's oldest request is also its next batch's first.
        """
        delay = self.policy.max_queue_delay_s
        heads = self._heads
        if best is not None and (not heads or heads[0][0] >= best[2] or heads[0][0] + delay > now):
            # No queue's oldest request (never older than its entry) can rank before the full
            # queue, or none is due: the common case under load, settled without a look at a queue.
            return best[0], best[1], "size", None
        limit = best[2] if best is not None else math.inf
        chosen = None
        passed = []  # due heads ranked by a newer request, set aside to look past them
        try:
            while heads:
                arrival, seq, key = heads[0]
                q = self._queues.get(key)
                if q is None or seq != q.head_seq:  # superseded by the queue's newer entry, or its queue is gone
                    heapq.heappop(heads)
                    continue
                head = self._head(q)
                if head is None:
                    heapq.heappop(heads)
                    q.head_seq = -1
                    if q.samples == 0:
                        del self._queues[key]
                    continue
                if head.arrival != arrival:  # its head left (withdrawn, expired): requeue the current one
                    heapq.heappop(heads)
                    self._push_head(key, q, head.arrival)
                    continue
                if self._stopping:
                    return key, q, "drain", None
                due = arrival + delay - now
                if due > 0:
                    if best is None and chosen is None:
                        return None, None, "", due
                    break
                if arrival >= limit:  # this head and every later one are no older than the best
                    break
                rank = self._next_first(q).arrival
                if rank < limit:
                    limit, chosen = rank, (key, q)
                if rank == arrival:
                    break
                passed.append(heapq.heappop(heads))
        finally:
            for entry in passed:
                heapq.heappush(heads, entry)
        if chosen is not None:
            return chosen[0], chosen[1], "delay", None
        if best is not None:
            return best[0], best[1], "size", None
        return None, None, "", None

    def _pick_slo(self, now: float) -> tuple[Hashable, _Queue | None, str, float | None]:
        """The slo policy's choice with an instance idle: the most urgent queue that is due, else the wait.

        Due: full (reason "size"), now is past its latest start ("deadline"), or it holds at
        least the idle rule's λ·α samples ("idle"). The most urgent goes first: the most urgent
        priority level, then the earliest deadline (admission counted only the levels as urgent
        as a request's as ahead of it). A queue not yet due goes instead ("deadline") if it is
        more urgent than that one and would pass its latest start while that batch runs. The
        wait is to the earliest latest start, or to when the arrival rate will have decayed
        enough for the idle rule to flush what is queued.

        The queues are visited most urgent first (the heap of ranks) up to the first that is due:
        the more urgent ones, not due, are those that could be pressed. Only when none is due
        does it visit every queue (for the wait).
        """
        slo = self.slo
        slo.max_batch_size = self.policy.max_batch_size  # set_policy may have changed it
        flush_size = self.policy.flush_size
        wake = math.inf
        waiting = []  # the queues not due, most urgent first: (key, queue, rank, latest start)
        passed: list = []
        try:
            while (found := self._next_ranked(passed)) is not None:
                key, q, rank = found
                if self._stopping:  # every queue is due: the most urgent goes first, full or not
                    return key, q, "drain", None
                n = q.samples
                start_by = slo.latest_start(key, rank[1], n)
                if n >= flush_size:
                    reason = "size"
                elif start_by <= now:
                    reason = "deadline"
                elif n >= slo.idle_target(key, now):
                    reason = "idle"
                else:
                    wake = min(wake, start_by, slo.idle_flush_at(key, n, now))
                    waiting.append((key, q, rank, start_by))
                    continue
                # The most urgent queue more urgent than this one whose latest start is before this batch's end.
                end = now + slo.times.predict(key, min(n, slo.max_batch_size))
                for other, oq, orank, ostart in waiting:
                    if orank < rank and ostart < end:
                        return other, oq, "deadline", None
                return key, q, reason, None
        finally:
            self._unpass(passed)
        return None, None, "", None if wake == math.inf else max(wake - now, 0.0)

    def _drop_emptied(self) -> None:
        """slo policy: drop the queues emptied since the last decision that are still empty (their dead
        entries go with them; their heap entries, stale now, leave when they reach a top).

        At every decision, the spare slot's too: with a full batch always waiting for it, no instance
        is idle, and keys that came and went (withdrawn, expired) would pile up for as long."""
        queues = self._queues
        for key in self._emptied:
            q = queues.get(key)
            if q is not None and q.samples <= 0:
                del queues[key]
        self._emptied.clear()

    def _urgency(self, q: _Queue) -> tuple[float, float]:
        """slo policy: (its most urgent live level, its earliest deadline); the smallest goes first."""
        self._head(q)  # drops the dead entries at the front of each level
        level = next((lv for lv in q.order if q.levels[lv]), math.inf)
        return level, self._earliest_deadline(q)

    def _pressed(self, rank: tuple[float, float], end: float) -> tuple[Hashable, _Queue] | None:
        """slo policy: the most urgent queue more urgent than `rank` whose latest start is before `end`."""
        passed: list = []
        try:
            while (found := self._next_ranked(passed)) is not None:
                key, q, r = found
                if not r < rank:
                    return None
                if self.slo.latest_start(key, r[1], q.samples) < end:
                    return key, q
        finally:
            self._unpass(passed)
        return None

    def _push_head(self, key: Hashable, q: _Queue, arrival: float) -> None:
        """Make (arrival, key) the queue's one live entry in the heap of heads."""
        seq = next(self._seq)
        heapq.heappush(self._heads, (arrival, seq, key))
        q.head_seq = seq

    @staticmethod
    def _head(q: _Queue) -> Pending | None:
        """The oldest live request of the queue, across its priority levels."""
        head = None
        for level in q.order:
            entries = q.levels[level]
            while entries and entries[0].state != QUEUED:
                entries.popleft()
            if entries and (head is None or entries[0].arrival < head.arrival):
                head = entries[0]
        return head

    @staticmethod
    def _next_first(q: _Queue) -> Pending | None:
        """The first live request of the queue's most urgent level: the one its next batch takes first."""
        for level in q.order:
            entries = q.levels[level]
            while entries and entries[0].state != QUEUED:
                entries.popleft()
            if entries:
                return entries[0]
        return None

    def _form(self, key: Hashable, q: _Queue, reason: str, now: float, start: float | None = None) -> Batch | None:
        """Take the batch's requests from the queue. `start` (slo policy): when its instance is
        predicted free, from which a request's finish is judged (default now)."""
        start = now if start is None else start
        slo = self.slo
        limit = self.policy.max_batch_size
        if reason == "size" and self.policy.preferred_batch_sizes:
            fitting = [s for s in self.policy.preferred_batch_sizes if s <= q.samples]
            head = self._head(q)
            # A request larger than every fitting preferred size still goes, up to the maximum.
            if fitting and head is not None and head.rows <= max(fitting):
                limit = max(fitting)
        taken: list[Pending] = []
        forming = self._forming
        forming.clear()
        samples = 0
        # A request whose deadline has passed is dropped; with the slo policy also one that would
        # finish after it, from `start`, even in a batch of mean time (the flush rules plan with
        # the quantile, so a request is dropped here only when the batch starts after its latest
        # start anyway). Here, before it takes room, one that would even alone; below, once the
        # batch's own size is known, the rest.
        full = False
        for level in q.order:
            entries = q.levels[level]
            while entries:
                p = entries[0]
                if p.state != QUEUED:
                    entries.popleft()
                    continue
                alone = 0.0 if slo is None else slo.times.mean(key, p.rows)
                if p.deadline is not None and (now >= p.deadline or (not p.probe and start + alone >= p.deadline)):
                    entries.popleft()
                    forming.append(p)
                    self._forget(p)
                    self._expire(p, now, start, alone)
                    continue
                if samples + p.rows > limit:
                    if taken:
                        full = True
                        break
                    # The first request is larger than the limit. Over a preferred size chosen
                    # for the oldest request (the most urgent level comes first): it goes, up to
                    # the maximum, as a request larger than every fitting size does. Over a
                    # maximum the admin API lowered: it goes alone.
                    limit = max(self.policy.max_batch_size, p.rows)
                entries.popleft()
                forming.append(p)
                self._forget(p)
                p.state = RUNNING
                p.dispatched = now
                taken.append(p)
                samples += p.rows
            if full:
                break
        if any(not q.levels[level] for level in q.order):
            for level in [lv for lv in q.order if not q.levels[lv]]:
                del q.levels[level]
            q.order = [lv for lv in q.order if lv in q.levels]
        head = self._head(q)
        expired = False
        if slo is not None and taken:
            taken, samples, expired = self._expire_late(key, taken, samples, now, start)
        if not taken:
            if head is not None and not expired:
                # The first live request always goes (alone if it is over the limit). Were one
                # left, the task would pick this queue again at once, forever, with the event
                # loop never getting control back: fail loudly instead (the task's handler fails
                # every caller).
                raise RuntimeError(
                    f"no batch formed from model '{self.name}''s queue of {q.samples} samples: its first "
                    f"request has {head.rows} rows, the limit is {limit}"
                )
            return None
        if head is not None and self.slo is None:
            self._push_head(key, q, head.arrival)
        return Batch(taken, samples, reason, key=key)

    def _choose_slot(self, now: float) -> int:
        """The index in `_free_slots` of the slot the next batch takes: an idle instance's if any.

        Fixed policy: the least busy instance's, and among busy ones the one whose running batch
        started first (with no time model, full batches of about one length: it frees first). slo
        policy: the instance predicted free first (the least busy among those). Either way a full
        batch for a spare slot waits behind the shortest remaining work, not behind whichever busy
        instance comes first while another frees and idles.
        """
        slots, busy = self._free_slots, self._busy
        if len(busy) == 1:  # one instance: every free slot is its own (called at every pass of the task)
            return 0
        if self.slo is None:
            # Idle ones tie (the first goes): `_prewarm_next` warmed that one.
            since = self._running_since
            return min(range(len(slots)), key=lambda j: (b := busy[slots[j][0]], since[slots[j][0]] if b else 0.0))
        return min(range(len(slots)), key=lambda j: (self._free_time(slots[j][0], now), busy[slots[j][0]]))

    def _expire_late(
        self, key: Hashable, taken: list[Pending], samples: int, now: float, start: float
    ) -> tuple[list[Pending], int, bool]:
        """slo policy: drop the batch's requests that would finish after their deadline (its mean time
        for its own samples, from `start`); (the rest, their samples, whether any was dropped).

        The earliest deadline goes first: each drop shortens the batch, which may save the next.
        """
        late: set[int] = set()
        for p in sorted((p for p in taken if not p.probe and p.deadline is not None), key=lambda p: p.deadline):
            predicted = self.slo.times.mean(key, samples)
            if start + predicted < p.deadline:
                break
            late.add(id(p))
            samples -= p.rows
            self._expire(p, now, start, predicted)
        if not late:
            return taken, samples, False
        return [p for p in taken if id(p) not in late], samples, True

    def _expire(self, p: Pending, now: float, start: float, predicted: float) -> None:
        """Fail a request dropped at its batch: its deadline has passed, or would before the batch,
        `predicted` long from `start`, finished."""
        p.state = DONE
        p.inputs = None
        p.expired = True
        if p.future.done():
            return
        if now >= p.deadline:
            msg = self._passed(now - p.arrival)
        else:
            waited = f"waited {1e3 * (now - p.arrival):.1f} ms in the queue and its deadline"
            after = f", after its instance is free in {1e3 * (start - now):.1f} ms" if start > now else ""
            msg = (
                f"request to model '{self.name}' {waited} would pass before its batch finished "
                f"(deadline in {1e3 * (p.deadline - now):.1f} ms, batch predicted to take "
                f"{1e3 * predicted:.1f} ms{after})"
            )
        p.future.set_exception(DeadlineExceeded(msg))
        if p.count_fail:
            self.stats.fail.add(now - p.arrival)

    def _dispatch(self, batch: Batch, queued_since: float | None, i: int | None = None) -> None:
        """Send the batch on the free slot at index `i` of `_free_slots` (None: `_choose_slot`'s)."""
        batch.dispatched = batch.requests[0].dispatched
        if i is None:
            i = self._choose_slot(batch.dispatched)
        inst, slot = self._free_slots.pop(i)
        if self._busy[inst] == 0 and queued_since is not None:
            batch.idle_from = max(self._idle_since[inst], queued_since)
        batch.to_idle = self._busy[inst] == 0
        if batch.to_idle:
            self._running_since[inst] = batch.dispatched
        if self.slo is not None:
            # Slack at dispatch: the earliest deadline of the batch minus its predicted finish
            # (after what the instance still runs, then the batch's own predicted time).
            finish = self._free_time(inst, batch.dispatched) + self.slo.times.predict(batch.key, batch.samples)
            self._free_at[inst] = finish
            earliest = min((p.deadline for p in batch.requests if p.deadline is not None), default=math.inf)
            if earliest < math.inf:
                self.metrics.record_slack(earliest - finish - self.slo.margin)
        self._busy[inst] += 1
        self._sent[inst].append(batch)
        self._inflight += 1
        self._dispatched[id(batch)] = batch
        batch.instance, batch.slot = inst, slot
        self.stats.record_flush(batch.reason)
        self.metrics.record_flush(batch.reason)
        loop = self._loop
        instance = self.executor.instances[inst]
        # To a busy CPU instance, or an idle one still reading its weights (`_prewarm_next`), the batch
        # waits at the worker until the batch or read ahead of it is done (its one thread runs them in
        # order; a CUDA worker launches the next batch as soon as the last is launched, so no future of
        # the executor's tells when it starts): meanwhile its requests can still be left out, their
        # deadlines answered (`_expire_held`) and cancelled callers withdrawn (`withdraw`). An idle
        # instance's last batch is done: only a read can be ahead of it.
        ahead = None if getattr(instance, "cuda", False) else self._last_sent[inst]
        if ahead is not None and ahead.done():
            ahead = None
        try:
            reqs = batch.requests
            # Deadlines go along so that the worker can leave out a request whose deadline
            # passes while its batch waits behind another on a busy instance.
            deadlines = (
                [p.deadline for p in reqs] if ahead is not None or any(p.deadline is not None for p in reqs) else None
            )
            fut = instance.submit([p.inputs for p in reqs], [p.rows for p in reqs], slot, deadlines)
            for p in reqs:
                p.inputs = None
        except Exception as exc:  # e.g. the executor was shut down: fail this batch, keep going
            fut = concurrent.futures.Future()
            fut.set_exception(exc)
            self._complete(batch, fut)
            return
        self._last_sent[inst] = fut
        batch.future = fut
        if ahead is not None:
            batch.ahead, batch.deadlines = ahead, deadlines
            for p in reqs:
                p.batch = batch
            earliest = min((d for d in deadlines if d is not None), default=math.inf)
            if earliest < math.inf:
                held = self._held
                heapq.heappush(held, (earliest, next(self._seq), batch))
                if len(held) > 2 * self._inflight + 64:
                    # A batch whose entry is not at the top stays after it started or came back: rebuilt
                    # with those still waiting only, amortized O(1).
                    self._held = held = [e for e in held if e[2].ahead is not None and not e[2].ahead.done()]
                    heapq.heapify(held)

        def _back_on_loop(f: concurrent.futures.Future) -> None:
            try:
                loop.call_soon_threadsafe(self._complete, batch, f)
            except RuntimeError:  # the loop closed under a hard stop; nobody awaits these
                pass

        fut.add_done_callback(_back_on_loop)

    def _complete(self, batch: Batch, f: concurrent.futures.Future) -> None:
        now = time.perf_counter()
        inst = batch.instance
        self._free_slots.append((inst, batch.slot))
        self._busy[inst] -= 1
        self._inflight -= 1
        failed_at_stop = self._dispatched.pop(id(batch), None) is None  # callers answered, counted, DONE
        sent = self._sent[inst]
        ran_first = sent[0] is batch
        del sent[next(j for j, x in enumerate(sent) if x is batch)]
        if self._busy[inst] == 0:
            self._free_at[inst] = now
        elif ran_first:  # the batch waiting at its worker runs now (not if one behind the running one came back)
            self._running_since[inst] = now
        if self._last_sent[inst] is f:
            self._last_sent[inst] = None
        batch.future = None  # back: nothing to withdraw, and a stale `_held` entry keeps no result alive
        if batch.ahead is not None:
            batch.ahead = batch.deadlines = None
            for p in batch.requests:
                p.batch = None
        self._wakeup.set()
        if f.cancelled():  # cancelled at the worker by the executor's shutdown, past the grace period
            exc = ShuttingDown(f"server stopped before model '{self.name}' ran this request")
        else:
            exc = f.exception()
        if exc is not None:
            if self._busy[inst] == 0:
                self._idle_since[inst] = now
            ran = getattr(f, "ran", None)  # [(started, ended)] once its worker took it: the executor's _note_raised
            if ran:
                # It held the instance until it raised: busy, as a batch that returned is, and
                # idle while queued up to its start, as for any batch its worker started.
                started, ended = ran[0]
                self.metrics.record_busy(inst, ended - started)
                if batch.idle_from is not None and started > batch.idle_from:
                    self.metrics.record_idle_queued(inst, started - batch.idle_from)
            left_out = getattr(f, "left_out", None)  # [(kept, started)]: see the executor's _note_left_out
            if left_out and not failed_at_stop:
                # The requests its worker left out did not run: answered as left out, not with its error.
                self._expire_left_out(batch, *left_out[0])
            # A request's values refused as its batch (of it alone: more are rerun in parts) was assembled: the
            # client's error (INVALID_ARGUMENT), not the model's.
            if not isinstance(exc, (ModelExecutionError, ShuttingDown, DeviceLost, InvalidInput)):
                # One line for the callers; the whole error, as the cause, for FailureLog's traceback.
                cause, exc = exc, ModelExecutionError(f"model '{self.name}' failed: {error_line(exc)}")
                exc.__cause__ = cause
            # A client's values refused (InvalidInput) are no failed batch of the model's, for the log's one line a
            # throttle period, which a client's bad requests would take from the model's real failures: counted
            # as refused (reason invalid), as those refused as they are decoded.
            if not isinstance(exc, (ShuttingDown, InvalidInput)):
                self.failures.batch_failed(exc, len(batch.requests), batch.samples, past_grace=failed_at_stop)
            for p in batch.requests:
                # Answered (its deadline passed, or at the stop: `_fail_dispatched`) or withdrawn while it waited.
                if p.state != RUNNING:
                    continue
                self._fail(p, exc, now)
            self._check_device()
            return
        result: BatchResult = f.result()
        if self._busy[inst] == 0:
            self._idle_since[inst] = result.finished
        if failed_at_stop:
            # The grace period ran out while it ran: `_fail_dispatched` answered its callers
            # UNAVAILABLE and counted them failed; what the model returned reaches nobody and is
            # recorded nowhere (no left-out answers, stats, stage histograms or slo observations),
            # as for a batch that failed; but it held the instance, as a failed batch does: busy.
            self.metrics.record_busy(inst, result.finished - result.started)
            return
        if batch.idle_from is not None and result.started > batch.idle_from:
            self.metrics.record_idle_queued(inst, result.started - batch.idle_from)
        if result.kept is not None:
            self._expire_left_out(batch, result.kept, result.started)
            if not batch.requests:
                return
        if len(result.outputs) != len(batch.requests):
            n, got = len(batch.requests), len(result.outputs)
            exc = ModelExecutionError(f"model '{self.name}' split a batch of {n} requests into {got} results")
            self.failures.batch_failed(exc, n, batch.samples)
            self.metrics.record_busy(inst, result.finished - result.started)  # it ran: see _note_raised
            for p in batch.requests:
                # As a batch that raised: one answered (its deadline passed as it waited) or withdrawn
                # meanwhile is left alone; each caller failed here is counted once.
                if p.state != RUNNING:
                    continue
                self._fail(p, exc, now)
            return
        if result.failure is not None:
            self._answer_isolated(batch, result, now)
            self._check_device()  # a part rerun alone may have met a device-side error
            return
        if self.slo is not None:
            self.slo.observe_batch(batch.key, batch.samples, result.finished - result.started)
            if batch.to_idle:  # dispatch → worker start, and worker end → back on the loop
                self.slo.observe_hop((result.started - batch.dispatched) + (now - result.finished))
        compute = result.times.compute
        size = (len(batch.requests), batch.samples)
        for p, out in zip(batch.requests, result.outputs):
            p.state = DONE
            p.finished = result.finished
            p.started = result.started
            p.compute = compute
            p.batch_size = size
            if not p.future.done():
                p.future.set_result(out)
        self._record_executed(batch, result, batch.requests, batch.samples)

    def _check_device(self) -> None:
        """After a failed batch: if it left one of the model's devices unusable (executor's
        Instance.lost), refuse every request from now on (check_room: DeviceLostRefusal, UNAVAILABLE), fail
        those queued with it, and tell the server (on_failed: its health turns NOT_SERVING). Batches
        already sent fail on their own, at their instance."""
        if self._failed is not None:
            return
        lost = self.executor.lost
        if lost is None:
            return
        self._fail_model(lost, DeviceLost(str(lost)))

    def _fail_formed(self, batch: Batch, error: Exception) -> None:
        """A batch taken off its queue when the batching task failed, before `_dispatch` handed it
        over: `_fail_queued` no longer sees its requests and no executor answer will complete them,
        so its callers get `error` here. One `_dispatch` had counted sent is completed as a batch
        the executor refused, so that nothing stays counted in flight."""
        if id(batch) in self._dispatched:
            f: concurrent.futures.Future = concurrent.futures.Future()
            f.set_exception(error)
            try:
                self._complete(batch, f)
            except Exception:  # the same bug may be on this path: the callers below still get their answer
                log.exception("completing the batch of model '%s' that its failed batcher had formed", self.name)
        now = time.perf_counter()
        for p in batch.requests:
            if p.state == RUNNING:
                self._fail(p, error, now)

    def _fail_model(self, failure: BaseException, queued: Exception) -> None:
        """From now on the model refuses every request (check_room: `failure`); those queued get
        `queued`; the server is told (on_failed)."""
        self._failed = failure
        self._fail_queued(queued)
        if self.on_failed is not None:
            try:
                self.on_failed(failure)
            except Exception:
                log.exception("on_failed for model '%s' failed", self.name)

    def _record_executed(
        self, batch: Batch, result: BatchResult, answered: list[Pending], samples: int, by_size: bool = True
    ) -> None:
        """Stats and metrics of an executed batch, for its `answered` requests (`samples` rows)."""
        t = result.times
        queued_s = sum(p.dispatched - p.arrival for p in answered)
        self.stats.record_batch(samples, len(answered), queued_s, t.assemble + t.h2d, t.compute, t.d2h, by_size)
        # Metrics count the requests whose callers still wait, as the end-to-end histogram
        # will: a caller cancelled meanwhile would otherwise be in the stages but not in the total.
        waits = [p.dispatched - p.arrival for p in answered if not p.future.cancelled()]
        # Assemble is charged from the dispatch, so the hop to the worker thread is counted.
        assemble = result.started - batch.dispatched + t.assemble
        busy = result.finished - result.started
        self.metrics.record_batch(
            batch.instance, len(waits), batch.samples, waits, assemble, t.h2d, t.compute, t.d2h, busy
        )

    def _answer_isolated(self, batch: Batch, result: BatchResult, now: float) -> None:
        """A batch the model failed, rerun in parts by its instance: each request that failed alone
        gets its error, the others their answers. Only the answered count as executed (stats and
        stage histograms, as for a batch that succeeded); its time is no model's batch time, so
        the slo policy does not learn from it."""
        failed = [isinstance(out, BaseException) for out in result.outputs]
        # Not where only clients' values were refused (as in _complete).
        refused_only = isinstance(result.failure, InvalidInput) and all(
            isinstance(out, InvalidInput) for out, bad in zip(result.outputs, failed) if bad
        )
        if not refused_only:
            self.failures.batch_failed(
                result.failure, len(batch.requests), batch.samples, failed=sum(failed), reruns=result.reruns
            )
        self.metrics.record_reruns(result.reruns)
        answered = []
        size = (len(batch.requests), batch.samples)
        for p, out, bad in zip(batch.requests, result.outputs, failed):
            if p.state != RUNNING:  # answered (its deadline passed) or withdrawn as its batch waited
                continue
            if bad:
                self._fail(p, out, now)
                continue
            p.state = DONE
            p.finished, p.started, p.compute = result.finished, result.started, result.times.compute
            p.batch_size = size
            if not p.future.done():
                p.future.set_result(out)
            answered.append(p)
        if answered:
            # Not under its size in `batch_stats`: no batch of the answered size ran, and its time is all the parts'.
            self._record_executed(batch, result, answered, sum(p.rows for p in answered), by_size=False)
        else:
            # None answered: in no stage histogram, but its forwards and reruns held the instance.
            self.metrics.record_busy(batch.instance, result.finished - result.started)

    def _expire_left_out(self, batch: Batch, kept: tuple[int, ...], started: float) -> None:
        """Fail the requests the worker left out as it took the batch at `started` (deadline passed):
        those not in `kept`; keep the rest in the batch."""
        ran = set(kept)
        for i, p in enumerate(batch.requests):
            if i in ran or p.state != RUNNING:  # not left out; answered or withdrawn as it waited
                continue
            self._answer_left_out(p, started)
        batch.requests = [batch.requests[i] for i in kept]
        batch.samples = sum(p.rows for p in batch.requests)

    def _fail_dispatched(self) -> None:
        """The grace period ran out: the callers of every batch sent to the executor get UNAVAILABLE
        now, before gRPC stops, and the batches their workers have not taken yet are withdrawn (a
        batch running in the model cannot be interrupted; what it returns later reaches nobody).

        Withdrawn rather than left to the executor's shutdown, which comes only after the answers
        are written and gRPC has stopped (seconds later): meanwhile the running batch may end and
        the worker start the next, holding the instance (the CPU, the device) for nobody during the
        stop. A withdrawn batch comes back cancelled: `_complete` gives its slot back and counts no
        busy time (it never ran), as for one the executor's shutdown cancels."""
        now = time.perf_counter()
        for batch in self._dispatched.values():
            exc = ShuttingDown(
                f"grace period over: server stopped before model '{self.name}' finished this request's batch"
            )
            for p in batch.requests:
                if p.state != RUNNING:  # answered (its deadline passed) or withdrawn as its batch waited
                    continue
                self._fail(p, exc, now)  # answered: `_complete` then leaves it alone
        for sent in self._sent:
            # Newest first: were an instance's older batch withdrawn first, its worker, free then,
            # could take the next before that one is withdrawn. A batch already taken stays
            # (withdraw() is False). `_complete` runs later (its callback goes through the loop),
            # so `sent` does not change here; a stand-in executor's future may have no withdraw.
            for batch in reversed(sent):
                withdraw = getattr(batch.future, "withdraw", None)
                if withdraw is not None:
                    withdraw()
        self._dispatched.clear()

    def _fail_queued(self, exc: Exception) -> None:
        now = time.perf_counter()
        for q in self._queues.values():
            for p in q.entries:
                if p.state == QUEUED:
                    self._fail(p, exc, now)  # as a dispatched request failed at the stop is
            q.levels.clear()
            q.order.clear()
            q.deadlines.clear()
            q.samples = 0
            q.requests = 0
            q.rows.clear()
        self._queues.clear()
        self._heads.clear()
        self._deadline_fifo.clear()
        self._deadlines.clear()
        self._dues.clear()
        self._ranks.clear()
        self._emptied.clear()
        self._full.clear()
        self._level_samples.clear()
        self._queued = 0
