"""The demo's teaching mode (`wok demo --simulate`): the batcher simulator, run at wall-clock pace.

No server runs. Arrivals come from the same `LoadControl` as the live demo, and
`wok.bench.simulate.simulate` (the discrete-event model of the batcher: flush on size or
delay, batch time α + β·n, `instances` identical instances) decides when each batch runs.
Every tick the simulation is run again over the arrivals since the last moment the model
was idle (nothing queued, every instance free): from such a moment on, the simulation
does not depend on anything earlier, so the replay is the continuation. Only batches that
started by now are shown, and they are final: a batch's start depends only on arrivals before it.

What the simulator does not model, the page says so: faults, the server's own overheads
(gRPC, decode, the hop to the worker), a batch's actual spread. A change of batch size or
delay window applies to the replay from the last idle moment, so under sustained
overload (no idle moment) it also reshapes batches already on the page's timeline.
"""

from __future__ import annotations

import time

import numpy as np

from ..bench.simulate import BatcherModel, simulate
from .load import LoadControl, Rolling

MAX_HISTORY = 60_000  # arrivals kept since the last idle moment; beyond, the queue is dropped


class SimBackend:
    def __init__(self, control: LoadControl, model: BatcherModel, seed: int = 0) -> None:
        self.control = control
        self.model = model
        self.rng = np.random.default_rng(seed)
        self.start = time.monotonic()
        self.arrivals: list[float] = []  # seconds since start, since the last idle moment
        self.generated_to = 0.0
        self.emitted_to = -1.0  # batches that started at or before this were sent to the page
        self.answered_to = 0.0
        self.stats = Rolling()
        self.samples = 0
        self.batches = 0
        self.flushes = {"size": 0, "delay": 0}
        self.resets = 0

    def now(self) -> float:
        return time.monotonic() - self.start

    # -- the page's controls ---------------------------------------------------------------
    def batching(self) -> dict:
        m = self.model
        return {
            "model": "simulated",
            "max_batch_size": m.max_batch_size,
            "max_queue_delay_ms": m.max_queue_delay_s * 1e3,
            "preferred_batch_sizes": [],
            "max_queue_size": m.max_queue_size,
            "limit_batch_size": 256,
        }

    def set_batching(self, body) -> dict:
        if not isinstance(body, dict):
            raise ValueError(f"body: expected a JSON object, got {body!r}")
        changes = {}
        v = body.get("max_batch_size")
        if v is not None:
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 256:
                raise ValueError(f"field 'max_batch_size': expected an integer from 1 to 256, got {v!r}")
            changes["max_batch_size"] = v
        v = body.get("max_queue_delay_ms")
        if v is not None:
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 60_000:
                raise ValueError(f"field 'max_queue_delay_ms': expected a number from 0 to 60000, got {v!r}")
            changes["max_queue_delay_s"] = float(v) / 1e3
        fields = {k: getattr(self.model, k) for k in self.model.__dataclass_fields__}
        self.model = BatcherModel(**{**fields, **changes})
        return self.batching()

    # -- one tick ---------------------------------------------------------------------------
    def step(self) -> tuple[list[dict], dict]:
        """Advance to now: (batch events started since the last step, a tick event)."""
        now = self.now()
        while self.generated_to + 0.05 <= now:  # the same 50 ms windows as the live generator
            sent = self.control.arrivals(self.start + self.generated_to, self.rng)
            for t in sent:
                self.stats.on_send(t)
            self.arrivals.extend((sent - self.start).tolist())
            self.generated_to += 0.05
        if len(self.arrivals) > MAX_HISTORY:  # no idle moment for a long time: drop the backlog
            self.arrivals = [a for a in self.arrivals if a >= now - 1.0]
            self.resets += 1
        arr = np.asarray(self.arrivals, dtype=np.float64)
        events: list[dict] = []
        queued = 0
        if len(arr):
            run = simulate(arr, self.model)
            events, starts = self._batches(arr, run.done, now)
            queued = int(np.sum((arr <= now) & (starts > now)))
            ok = (run.done > self.answered_to) & (run.done <= now)
            for d, a in sorted(zip(run.done[ok], arr[ok])):
                self.stats.on_answer(self.start + d, d - a, "OK")
            self.answered_to = now
            self._advance(arr, run.done, now)
        tick = {
            "type": "tick",
            "t": round(time.time(), 6),
            "models": {
                "simulated": {
                    "queued": queued,
                    "samples": self.samples,
                    "batches": self.batches,
                    "flushes": dict(self.flushes),
                    "policy": self.batching(),
                    "running": self._running(now),
                }
            },
            "faults": [],
            "resets": self.resets,
        }
        return events, tick

    def _batches(self, arr: np.ndarray, done: np.ndarray, now: float) -> tuple[list[dict], np.ndarray]:
        """Batch events of batches that started in (emitted_to, now], and each arrival's batch start."""
        m = self.model
        # Requests of one batch share its end time; with one request per arrival and FIFO
        # batches, the members of a batch are consecutive arrivals.
        order = np.argsort(done, kind="stable")
        ends, first = np.unique(done[order], return_index=True)
        sizes = np.diff(np.append(first, len(order)))
        starts_per_batch = ends - (m.alpha_s + m.beta_s * sizes)
        starts = np.empty_like(done)
        for s, f, n in zip(starts_per_batch, first, sizes):
            starts[order[f : f + n]] = s
        events = []
        free = getattr(self, "_free", None) or [0.0] * m.instances
        offset = time.time() - time.monotonic() + self.start
        for s, e, n in zip(starts_per_batch, ends, sizes):
            if s <= self.emitted_to or s > now:
                continue
            # Identical instances: the batch goes to the first one free at its start.
            inst = next((i for i, f in enumerate(free) if f <= s + 1e-12), int(np.argmin(free)))
            free[inst] = e
            reason = "size" if n >= m.max_batch_size else "delay"
            self.flushes[reason] += 1
            self.samples += int(n)
            self.batches += 1
            events.append(
                {
                    "type": "batch",
                    "model": "simulated",
                    "instance": inst,
                    "size": int(n),
                    "requests": int(n),
                    "reason": reason,
                    "queued": int(np.sum((arr <= s) & (starts > s))),
                    "t_start": round(offset + s, 6),
                    "t_end": round(offset + e, 6),
                    "ok": True,
                }
            )
            self.emitted_to = s
        self._free = free
        return events, starts

    def _running(self, now: float) -> list[int]:
        free = getattr(self, "_free", None) or [0.0] * self.model.instances
        return [int(f > now) for f in free]

    def _advance(self, arr: np.ndarray, done: np.ndarray, now: float) -> None:
        """Forget the arrivals before the last idle moment: an arrival by now that found every
        earlier request answered."""
        finished_before = np.maximum.accumulate(np.concatenate(([-np.inf], done[:-1])))
        idle = np.nonzero((arr <= now) & (finished_before <= arr) & (arr > self.emitted_to - 1e-9))[0]
        # Keep the arrivals of batches not yet emitted: cut only where the next batch starts later.
        if len(idle):
            j = int(idle[-1])
            if j > 0:
                del self.arrivals[:j]
