"""The admin API behind `wok serve --admin`: fault injection, live batching policy, and events.

Served by server/http.py on the metrics port (loopback unless --metrics-host says otherwise);
see docs/demo.md for the endpoints. Everything here runs on the server's event loop.

Events (`GET /events`, server-sent events) are what the demo page draws:
- one `batch` event per batch an instance ran (or failed), sent when it finished:
  `{"type": "batch", "model", "instance", "size", "requests", "reason", "queued", "t_start", "t_end", "ok"}`
  with `reason` the batcher's flush reason (one of metrics.FLUSH_REASONS: size, delay, drain;
  with the slo policy also deadline, idle), `queued` the requests still waiting when it was
  formed, the times in Unix seconds (the worker's start and end; for a failed batch, its
  dispatch and the failure), and `error` when `ok` is false ("cancelled" for a batch
  withdrawn at its worker before it ran, past the grace period: by the batcher as the grace
  period ran out, or by the executor's shutdown), or when some of its requests failed; `error`
  is cut as the server's log line of a failed batch is (errors.cut_message, to 4,096 bytes as the
  event's JSON writes it);
- a `tick` every 250 ms: per model its queue, batches in flight, the instances' running
  batches, the counters (samples, batches, responses by code, flushes by reason, busy seconds
  per instance: every batch an instance ran, failed ones included), the policy and the active
  faults. With metrics off (`--no-metrics`) the busy seconds are this module's own count (the
  same worker start and end times; for a batch that raised, those the executor's _note_raised noted); responses by code
  are counted only as metrics, so they are null, and the tick's `unavailable` says why: never
  an empty count that reads as no traffic.
A subscriber that falls behind by more than `SUBSCRIBER_BACKLOG` events loses the newest
ones, counted in its next tick's `dropped`; the server never waits for a browser.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from .errors import cut_message, message_of
from .faults import (
    AdminRequestError,
    FaultBoard,
    check_batching_body,
    check_batching_change,
    check_max_batch_size,
    check_max_queue_delay_ms,
    parse_fault_request,
    shown,
)

if TYPE_CHECKING:  # they import torch, which the metrics port (and wok demo's page) need not load
    from .app import ModelRuntime, WokServer
    from .batcher import BatchingPolicy
    from .executor import BatchResult

TICK_S = 0.25
SUBSCRIBER_BACKLOG = 2000
# A tick's `unavailable` with metrics off: each figure it leaves null (per model), and why.
UNAVAILABLE_WITHOUT_METRICS = {
    "responses": "not counted: this server runs with --no-metrics (responses by gRPC code are counted only as metrics)"
}


class Subscriber:
    def __init__(self) -> None:
        self.queue: asyncio.Queue[dict] = asyncio.Queue(SUBSCRIBER_BACKLOG)
        self.dropped = 0

    def put(self, event: dict) -> None:
        try:
            self.queue.put_nowait(event)
        except asyncio.QueueFull:
            self.dropped += 1


class _BatchWatch:
    """Watches one model's batches as its instances take them: the source of `batch` events."""

    def __init__(self, admin: Admin, rt: ModelRuntime) -> None:
        self.admin = admin
        self.rt = rt
        self.name = rt.servable.name
        self.running = [0] * len(rt.executor.instances)
        # Seconds each instance spent running batches, from the batches' worker start and end:
        # the tick's busy_s when metrics are off (their own count, ModelMetrics.busy_seconds, is not kept).
        self.busy = [0.0] * len(rt.executor.instances)
        self._flushes = dict(rt.stats.flushes)
        for inst in rt.executor.instances:
            inst.observer = self._observer(inst.index)

    def _reason(self) -> str:
        # The batcher counts a batch's flush reason just before it hands the batch to an
        # instance, on this same loop; the counter that moved since the last batch names it.
        now = self.rt.stats.flushes
        reason = next((r for r, n in now.items() if n != self._flushes.get(r, 0)), "unknown")
        self._flushes = dict(now)
        return reason

    def _observer(self, index: int):
        loop = self.admin.loop

        def observe(rows: Sequence[int], fut: concurrent.futures.Future) -> None:
            self.running[index] += 1
            info = (index, sum(rows), len(rows), self._reason(), self.rt.batcher.queued, time.perf_counter())

            def back(f: concurrent.futures.Future) -> None:
                try:
                    loop.call_soon_threadsafe(self._done, info, f)
                except RuntimeError:  # the loop closed under a hard stop
                    pass

            fut.add_done_callback(back)

        return observe

    def _done(self, info: tuple, f: concurrent.futures.Future) -> None:
        index, samples, requests, reason, queued, dispatched = info
        self.running[index] -= 1
        # Cancelled: the batch still waited at the worker when the executor shut down past the
        # grace period (Instance.shutdown); f.exception() would raise CancelledError here.
        cancelled = f.cancelled()
        exc = None if cancelled else f.exception()
        ok = not cancelled and exc is None
        failed = 0
        # As wok_instance_busy_seconds: every batch its worker took counts, failed ones too (a
        # failing model occupies its instance all the same); one cancelled before it ran, not.
        if ok:
            r: BatchResult = f.result()
            if r.failure is not None:  # rerun in parts: some requests failed alone
                failed = sum(isinstance(out, BaseException) for out in r.outputs)
            self.busy[index] += r.finished - r.started
        elif not cancelled and getattr(f, "ran", None):  # raised once its worker took it (_note_raised)
            started, ended = f.ran[0]
            self.busy[index] += ended - started
        if not self.admin.subscribers:
            return
        to_unix = self.admin.to_unix
        event = {
            "type": "batch",
            "model": self.name,
            "instance": index,
            "size": samples,
            "requests": requests,
            "reason": reason,
            "queued": queued,
        }
        if ok:
            kept = requests if r.kept is None else len(r.kept)
            event.update(t_start=to_unix(r.started), t_end=to_unix(r.finished), ok=True, ran=kept)
            if r.failure is not None:
                # ok while some request of it was answered; its busy time counts either way.
                # Cut: a model's message of megabytes went out whole, in one event to each subscriber.
                event.update(ok=failed < len(r.outputs), failed=failed, error=cut_message(message_of(r.failure)))
        else:
            error = "cancelled" if cancelled else cut_message(message_of(exc))
            event.update(t_start=to_unix(dispatched), t_end=to_unix(time.perf_counter()), ok=False, error=error)
        self.admin.publish(event)


class Admin:
    """Fault injection, live batching policy and the event stream of one WokServer."""

    def __init__(self, server: WokServer) -> None:
        self.server = server
        self.loop = asyncio.get_running_loop()
        self.faults = FaultBoard(
            (inst.fault for rt in server.runtimes.values() for inst in rt.executor.instances), self.loop
        )
        server.metrics.faults = self.faults.gauge
        self.subscribers: set[Subscriber] = set()
        self.metrics = server.settings.metrics  # off: ticks leave UNAVAILABLE_WITHOUT_METRICS null
        # perf_counter → Unix time, fixed once so that event times are consistent with each other.
        self._offset = time.time() - time.perf_counter()
        self.watches = {name: _BatchWatch(self, rt) for name, rt in server.runtimes.items()}
        self._ticker: asyncio.Task | None = None
        self._closed = False  # by close(): subscribe() refuses, so the ticker cannot start again
        # The ticker close() cancelled, until a close has seen it end: one whose wait was cancelled leaves it here.
        self._ending: asyncio.Task | None = None

    def to_unix(self, perf: float) -> float:
        return round(perf + self._offset, 6)

    async def close(self) -> None:
        """End the events ticker, the fault timers and the observers on the model instances. Idempotent: a later
        close (the metrics port's stop after its failed bind, then the server's) returns once the ticker has ended.

        All is undone before its one await, the ticker's end, so that nothing met there leaves it half done: a ticker
        that had failed (its failure raised once the rest is undone, by the close that sees it end) or a cancellation
        of the close (raised, where it was swallowed and the close went on as if it had not come). A close cancelled
        there leaves the ticker's end to the next, which awaits it: returning at once, a resumed stop left it
        pending."""
        if not self._closed:
            # First: a subscribe() while the ticker's end is awaited would start another.
            self._closed = True
            self.faults.close()
            for rt in self.server.runtimes.values():
                for inst in rt.executor.instances:
                    inst.observer = None
            self._ending, self._ticker = self._ticker, None
            if self._ending is not None:
                self._ending.cancel()
        ticker = self._ending
        if ticker is None:
            return
        await asyncio.wait({ticker})  # the ticker's own outcome is read below, not raised by the wait
        if self._ending is not ticker:  # a close awaiting it beside this one has raised its failure
            return
        self._ending = None
        if not ticker.cancelled() and ticker.exception() is not None:
            raise ticker.exception()

    # -- faults -------------------------------------------------------------------------
    def get_faults(self) -> dict:
        return {"faults": self.faults.active()}

    def post_faults(self, body) -> dict:
        req = parse_fault_request(body, self.faults.instances)
        return {"faults": self.faults.apply(req)}

    # -- batching policy ----------------------------------------------------------------
    def get_batching(self) -> dict:
        return {"models": [self._policy(name, rt) for name, rt in self.server.runtimes.items()]}

    @staticmethod
    def _policy(name: str, rt: ModelRuntime) -> dict:
        p = rt.batcher.policy
        return {
            "model": name,
            "policy": _policy_name(rt),
            "max_batch_size": p.max_batch_size,
            # The window is kept in seconds, and ms / 1e3 * 1e3 can miss the value sent by an ulp
            # (1001 would come back 1000.9999999999999); rounding to 1e-6 ms gives back every value
            # with up to 6 decimals, since the round trip errs by far less than 5e-7 ms up to 60 s.
            "max_queue_delay_ms": round(p.max_queue_delay_s * 1e3, 6),
            "preferred_batch_sizes": list(p.preferred_batch_sizes),
            "max_queue_size": p.max_queue_size,
            "limit_batch_size": rt.servable.config.max_batch_size,
        }

    def post_batching(self, body) -> dict:
        """Replace a model's max_batch_size and/or (fixed policy only) max_queue_delay; the batcher uses it at once."""
        check_batching_body(body)
        model = body.get("model")
        rt = self.server.runtimes.get(model) if isinstance(model, str) else None
        if rt is None:
            raise AdminRequestError(
                f"field 'model': expected one of the served models ({', '.join(sorted(self.server.runtimes))}); "
                f"got {shown(model)}"
            )
        check_batching_change(body)
        policy: BatchingPolicy = rt.batcher.policy
        limit = rt.servable.config.max_batch_size
        changes = {}
        if "max_batch_size" in body:
            v = body["max_batch_size"]
            check_max_batch_size(v, limit)
            changes["max_batch_size"] = v
            # The model's configured preferred sizes that the new maximum can reach: from the
            # config, not the live policy, so that raising the maximum again brings them back.
            preferred = rt.servable.config.dynamic_batching.preferred_batch_sizes
            changes["preferred_batch_sizes"] = tuple(s for s in preferred if s <= v)
        if "max_queue_delay_ms" in body:
            v = body["max_queue_delay_ms"]
            if _policy_name(rt) != "fixed":
                # The slo policy flushes by deadlines and never reads the window: taking one
                # would answer 200 for a change that does nothing.
                raise AdminRequestError(
                    f"field 'max_queue_delay_ms': expected no max_queue_delay_ms for model '{model}', whose "
                    f"batching policy is '{_policy_name(rt)}' (only 'fixed' uses a delay window); got {shown(v)}"
                )
            changes["max_queue_delay_s"] = check_max_queue_delay_ms(v) / 1e3
        rt.batcher.set_policy(replace(policy, **changes))  # within the configured maximum, checked above
        return self._policy(model, rt)

    # -- events -------------------------------------------------------------------------
    def subscribe(self) -> Subscriber:
        if self._closed:
            # After close() a subscriber got ticks from a ticker started again, past the stop.
            raise RuntimeError("the admin API is closed: the server is stopping")
        sub = Subscriber()
        self.subscribers.add(sub)
        if self._ticker is None or self._ticker.done():
            self._ticker = self.loop.create_task(self._tick_forever(), name="wok-admin-ticks")
        sub.put(self.hello())
        return sub

    def unsubscribe(self, sub: Subscriber) -> None:
        self.subscribers.discard(sub)

    def publish(self, event: dict) -> None:
        for sub in self.subscribers:
            sub.put(event)

    def hello(self) -> dict:
        return {
            "type": "hello",
            "t": round(time.time(), 6),
            "tick_s": TICK_S,
            "models": {
                name: {"instances": len(insts), "devices": [str(i.device) for i in insts]}
                for name, insts in ((n, rt.executor.instances) for n, rt in self.server.runtimes.items())
            },
            "batching": self.get_batching()["models"],
        }

    def tick(self) -> dict:
        models = {}
        metrics = self.metrics
        for name, rt in self.server.runtimes.items():
            s = rt.stats
            # With metrics off, rt.metrics records nothing: its zeros would read as no traffic.
            busy = rt.metrics.busy_seconds if metrics else self.watches[name].busy
            models[name] = {
                "queued": rt.batcher.queued,
                "inflight": rt.batcher.inflight,
                "running": list(self.watches[name].running),
                "samples": s.inference_count,
                "batches": s.execution_count,
                "succeeded": s.success.count,
                "failed": s.fail.count,
                "responses": dict(rt.metrics.responses) if metrics else None,
                "flushes": dict(s.flushes),
                "busy_s": [round(b, 6) for b in busy],
                "policy": self._policy(name, rt),
            }
        event = {"type": "tick", "t": round(time.time(), 6), "models": models, "faults": self.faults.active()}
        if not metrics:
            event["unavailable"] = dict(UNAVAILABLE_WITHOUT_METRICS)
        return event

    async def _tick_forever(self) -> None:
        while self.subscribers:
            event = self.tick()
            for sub in self.subscribers:
                sub.put({**event, "dropped": sub.dropped})
            await asyncio.sleep(TICK_S)


def _policy_name(rt: ModelRuntime) -> str:
    """The batching policy the model's batcher runs: 'slo' when it holds an slo policy object."""
    return "fixed" if rt.batcher.slo is None else "slo"


def dumps(obj) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()
