"""The demo's teaching mode (`wok demo --simulate`): the batcher simulator, run at wall-clock pace.

No server runs. Arrivals come from the same `LoadControl` as the live demo, and
`wok.bench.simulate.simulate` (the discrete-event model of the batcher: flush on size or
delay, batch time α + β·n, `instances` identical instances) decides when each batch runs.
Every step the simulation is run again over the requests since the last cut (`_cut`): the
requests still queued at that moment and every later arrival, starting from when each
instance came free then (`free_at`, none before the cut): from such a moment the simulation
depends on nothing earlier, so the replay is the exact continuation. Only batches that
started by now are shown, and they are final: a batch's start depends only on arrivals before it.

What the simulator does not model, the page says so: faults, the server's own overheads
(gRPC, decode, the hop to the worker), a batch's actual spread. A change of batch size or
delay window applies to the replay since the cut; batches already shown stay as they were.
The queue is bounded as the live server's (the model's `max_queue_size`; `wok demo --simulate`
gives it the live demo's 4,096): an arrival that finds it full is refused at once, a
RESOURCE_EXHAUSTED answer in the callers' figures (the page's errors, as the live demo's
refusals) and in the ticks' `responses`. Should the history still reach MAX_HISTORY arrivals
(no answer came to cut at: a batch time of seconds at a high rate), the backlog is dropped and
the simulation starts afresh, counted in the ticks' `resets`.
"""

from __future__ import annotations

import time
from collections import Counter

import numpy as np

from ..bench.simulate import REJECTED, BatcherModel, simulate
from ..faults import (
    AdminRequestError,
    check_batching_body,
    check_batching_change,
    check_max_batch_size,
    check_max_queue_delay_ms,
    shown,
)
from .load import WINDOW_S, LoadControl, Rolling

MODEL = "simulated"  # the model's name, in the page's figures and its batching answers
MAX_HISTORY = 60_000  # arrivals kept since the queue was last empty; beyond, the backlog is dropped


class SimBackend:
    def __init__(self, control: LoadControl, model: BatcherModel, seed: int = 0) -> None:
        self.control = control
        self.model = model
        # As the server's limit_batch_size: the configured maximum, which a change may lower and raise back to.
        self.limit_batch_size = model.max_batch_size
        self.rng = np.random.default_rng(seed)
        self.start = time.monotonic()
        # The wall-clock time of `start`, read once: the page's batch times are the simulated ones
        # shifted by it. Read at every step, a preemption between its two clock reads (2 ms on a
        # starved host) moved that step's batches alone.
        self.wall_start = time.time()
        self.arrivals: list[float] = []  # seconds since start, since the last idle moment
        self.windows = 0  # arrival windows drawn so far
        self.emitted_to = -1.0  # batches that started at or before this were sent to the page
        self.answered = np.zeros(0, dtype=bool)  # per arrival since the cut: its answer was counted
        self.free0 = [0.0] * model.instances  # when each instance comes free, at the cut
        self.cut_at = 0.0  # the cut: the history starts from the queue at this moment
        self.free_now = [0.0] * model.instances  # for the page: when each is free, as far as shown
        self.stats = Rolling()
        self.samples = 0
        self.batches = 0
        self.flushes = {"size": 0, "delay": 0}
        self.responses: Counter[str] = Counter()  # answers by gRPC code, as the live server's ticks
        self.resets = 0

    def now(self) -> float:
        return time.monotonic() - self.start

    # -- the page's controls ---------------------------------------------------------------
    def batching(self) -> dict:
        m = self.model
        return {
            "model": MODEL,
            "max_batch_size": m.max_batch_size,
            "policy": "fixed",
            "max_queue_delay_ms": round(m.max_queue_delay_s * 1e3, 6),  # as sent, as the server's admin API
            "preferred_batch_sizes": [],
            "max_queue_size": m.max_queue_size,
            "limit_batch_size": self.limit_batch_size,
        }

    def set_batching(self, body) -> dict:
        """Change the model's batch size or delay window; see the module's note on when it applies."""
        if not isinstance(body, dict):
            raise AdminRequestError(f"body: expected a JSON object; got {shown(body)}")
        # As the live server's admin API: a field it does not know, or another model, was taken
        # without a word (a typo changed nothing, "model": "encoder" changed the simulated one).
        check_batching_body(body)
        if "model" in body and body["model"] != MODEL:
            raise AdminRequestError(
                f"field 'model': expected '{MODEL}' (the one model simulated) or none; got {shown(body['model'])}"
            )
        # As the admin API: a body that changes nothing, or a field null, is refused, not answered 200.
        check_batching_change(body)
        changes = {}
        if "max_batch_size" in body:
            v = body["max_batch_size"]
            check_max_batch_size(v, self.limit_batch_size)  # in the admin API's words
            changes["max_batch_size"] = v
        if "max_queue_delay_ms" in body:
            v = body["max_queue_delay_ms"]
            changes["max_queue_delay_s"] = check_max_queue_delay_ms(v) / 1e3  # in the admin API's words, to its bound
        fields = {k: getattr(self.model, k) for k in self.model.__dataclass_fields__}
        self.model = BatcherModel(**{**fields, **changes})
        return self.batching()

    # -- one tick ---------------------------------------------------------------------------
    def step(self) -> tuple[list[dict], dict]:
        """Advance to now: (batch events started since the last step, a tick event)."""
        now = self.now()
        while (self.windows + 1) * WINDOW_S <= now + 1e-9:  # the live generator's windows
            sent = self.control.arrivals(self.start + self.windows * WINDOW_S, self.rng)
            for t in sent:
                self.stats.on_send(t)
            self.arrivals.extend((sent - self.start).tolist())
            self.answered = np.concatenate((self.answered, np.zeros(len(sent), dtype=bool)))
            self.windows += 1
        if len(self.arrivals) > MAX_HISTORY:  # overloaded for long: drop the backlog, start afresh
            self.arrivals, self.answered = [], np.zeros(0, dtype=bool)
            self.free0 = [now] * self.model.instances
            self.cut_at = now
            self.resets += 1
        # Batches, answers and the queue are final only as far as the arrivals are drawn.
        now = min(now, self.windows * WINDOW_S)
        events: list[dict] = []
        queued = 0
        if self.arrivals:
            arr = np.asarray(self.arrivals, dtype=np.float64)
            # No instance free before the cut: one idle then takes the requests kept queued from then on,
            # not earlier, as in the run that kept them queued (see _cut).
            run = simulate(arr, self.model, free_at=[max(f, self.cut_at) for f in self.free0])
            served = np.nonzero(~run.rejected)[0]
            batches, starts_served = self._batches(run.done[served])
            # A refused arrival is done with as it arrives: never queued, never in a batch.
            starts = arr.copy()
            starts[served] = starts_served
            events = self._emit(batches, arr, starts, now)
            queued = int(np.sum((arr <= now) & (starts > now)))
            due = ~self.answered & (run.done <= now)  # (NaN, a refused arrival's, is never <= now)
            refused = ~self.answered & run.rejected & (arr <= now)
            answers = [(d, d - a, "OK") for d, a in zip(run.done[due], arr[due])]
            answers += [(a, 0.0, REJECTED) for a in arr[refused]]
            for t, latency, code in sorted(answers):  # Rolling keeps its answers in time order
                self.stats.on_answer(self.start + t, latency, code)
                self.responses[code] += 1
            self.answered |= due | refused
            self._cut(arr, starts, batches, now)
        tick = {
            "type": "tick",
            "t": round(time.time(), 6),
            "models": {
                MODEL: {
                    "queued": queued,
                    "samples": self.samples,
                    "batches": self.batches,
                    "flushes": dict(self.flushes),
                    "responses": dict(self.responses),
                    "policy": self.batching(),
                    "running": [int(f > now) for f in self.free_now],
                }
            },
            "faults": [],
            "resets": self.resets,
        }
        return events, tick

    def _batches(self, done: np.ndarray) -> tuple[list[tuple[float, float, int, int]], np.ndarray]:
        """The run's batches in start order as (start, end, size, instance), and each served
        arrival's batch start, from the served arrivals' completion times. FIFO batches of one
        request per arrival: a batch is a run of consecutive served arrivals with the same end time."""
        m = self.model
        cuts = np.nonzero(np.diff(done))[0] + 1
        firsts = np.concatenate(([0], cuts)) if len(done) else np.zeros(0, dtype=int)
        sizes = np.diff(np.append(firsts, len(done)))
        ends = done[firsts]
        begins = ends - (m.alpha_s + m.beta_s * sizes)
        starts = np.repeat(begins, sizes)
        # The simulator gives each batch the instance that comes free first: the same here.
        free = list(self.free0)
        out = []
        for k in np.argsort(begins, kind="stable"):
            inst = int(np.argmin(free))
            free[inst] = float(ends[k])
            out.append((float(begins[k]), float(ends[k]), int(sizes[k]), inst))
        return out, starts

    def _emit(self, batches, arr: np.ndarray, starts: np.ndarray, now: float) -> list[dict]:
        m = self.model
        events = []
        for s, e, n, inst in batches:
            if s <= self.emitted_to or s > now:
                continue
            reason = "size" if n >= m.max_batch_size else "delay"
            self.flushes[reason] += 1
            self.samples += n
            self.batches += 1
            self.free_now[inst] = e
            events.append(
                {
                    "type": "batch",
                    "model": MODEL,
                    "instance": inst,
                    "size": n,
                    "requests": n,
                    "reason": reason,
                    "queued": int(np.sum((arr <= s) & (starts > s))),
                    "t_start": round(self.wall_start + s, 6),
                    "t_end": round(self.wall_start + e, 6),
                    "ok": True,
                }
            )
            self.emitted_to = s
        return events

    def _cut(self, arr: np.ndarray, starts: np.ndarray, batches, now: float) -> None:
        """Forget what is done with before the last arrival a = arr[j] (by now, and emitted up to) by
        which every request done with (in a batch started before a, or refused) has had its answer
        counted; keep the requests still queued at a, with their arrival times, and every later one.

        From a the simulation continues exactly, given the queue then and when each instance comes
        free: the step runs it with no instance free before a, so the kept requests wait until a, as
        they did (a flush before a would have taken them), and arrival j goes first at a, as a tie
        between an arrival and a flush does. An empty queue at a (the only cut before the queue was
        bounded) is the special case. Under an overload the queue never empties, but the answers
        keep coming: the history holds the bounded queue and the last moments, not every arrival."""
        # Per j: the earliest start of a request before j whose answer is not counted yet.
        pending = np.where(self.answered, np.inf, starts)
        pending_before = np.minimum.accumulate(np.concatenate(([np.inf], pending[:-1])))
        ok = (pending_before >= arr) & (arr <= min(now, self.emitted_to))
        ok[0] = False
        idx = np.nonzero(ok)[0]
        if not len(idx):
            return
        j = int(idx[-1])
        a = float(arr[j])
        free = list(self.free0)
        for s, e, _, inst in batches:  # in start order: each instance's last batch started before a
            if s < a:
                free[inst] = e
        self.free0 = free
        self.cut_at = a
        keep = np.arange(len(arr)) >= j
        keep[:j] = starts[:j] >= a  # queued at a (a refused one's start is its arrival, before a)
        self.arrivals = arr[keep].tolist()
        self.answered = self.answered[keep]
