"""Chaos: mixed unary and stream load full of bad requests, cuts and deadlines, audited answer by answer.

The property, at a running server: every request gets exactly one answer, and each answer is
the one its request earns. The load is open-loop unary calls (Poisson, `--rate` a second) and
`--streams` streams one after another on as many tasks, each request of one of these kinds:

* good (80 %): rows of (serial, row) and an id under the table's size: the answer is y =
  2x + (id, −id), row for row, whichever batch mates it had;
* bad (10 %, and now and then a burst of 40 together): an id past the embedding's table, which
  the model refuses (IndexError): INTERNAL, by itself or with the batch's error where the reruns
  left it undecided (docs/architecture.md, "A batch the model failed");
* bad_shape, bad_dtype (a column too many, FP64): INVALID_ARGUMENT; unknown (a model the server
  does not serve): NOT_FOUND; unparsed (bytes that are no request, unary only): INVALID_ARGUMENT.

Some good and bad unary calls have a gRPC deadline of 2–25 ms, a V2 `timeout` parameter, or are
cancelled by the client after up to 15 ms; some streams are cancelled, or have a deadline. The
audit (`audit`) then holds the run to these rules, each broken one a problem:

1. one answer per request: none twice; on a stream that ended OK, every request has one;
2. a good request's rows are right; it fails only by its own deadline or cancel, or with the
   batch's error the probing of a failed batch left it (its details end with executor.NOT_RERUN);
3. each other kind gets its code (INTERNAL, INVALID_ARGUMENT, NOT_FOUND), or its own deadline or
   cancel's; DEADLINE_EXCEEDED only with a deadline, CANCELLED only with a cancel, and the
   server's DEADLINE_EXCEEDED for a V2 timeout no sooner than the timeout after the client sent it;
4. a stream ends OK unless the client cut it (cancel: CANCELLED; its deadline: DEADLINE_EXCEEDED);
   its answers carry ids of its own requests;
5. the server's counts agree: for each code, what `wok_responses_total` grew by over the run is at
   least what the client saw from the server with that code, and at most that plus the answers
   the client cannot place that could have it (a call it cut or whose gRPC deadline passed, a
   request written on a stream it cut: the server answered it with the code its kind earns, or
   counted it cut, CANCELLED or DEADLINE_EXCEEDED); the queue and in-flight batches are empty;
   ModelStatistics' success count grew as `wok_responses_total`'s OK did, its fail count by at
   least its other codes but CANCELLED and DEADLINE_EXCEEDED, at most those and DEADLINE_EXCEEDED.
   In the total over all codes, `wok_calls_ended_before_handler_total{method="ModelInfer"}`'s growth
   counts with `wok_responses_total`'s: a call whose deadline passed or whose client cut it inside
   grpc.aio, before wok's handler ran, is counted there and nowhere else, and its client cannot
   place it; so a call counted in both, or twice, breaks the upper bound. A call in neither still
   passes: gRPC's core ends some before handing them to the server's Python at all, and no
   counter sees those (a server that does not export the counter adds 0);
6. after the load, a round of good requests (unary and a stream) all succeed.

The test suite runs it for a few seconds against an in-process server (tests/bench/test_chaos.py);
a longer run is this module's command, against a `wok serve` it starts with the chaos model
(`--target` for another server serving it, laid out with `--write-repository DIR`):

    python -m wok.bench.chaos --seconds 150 --seed 7 [--json chaos.json]

It prints the codes each kind got and the problems, writes the tallies with `--json` (schema
"wok.chaos/1", docs/bench-schema.md), and exits 1 when there is a problem.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import textwrap
import time
import urllib.request
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from wok.bench.outputs import refuse_unwritable, write_final
from wok.bench.payloads import integer_refusal
from wok.bench.report import write_json
from wok.bench.scrape import parse_exposition, whole
from wok.numerals import ascii_digits

SCHEMA = "wok.chaos/1"
# How it is run: its usage, its refusals and its own lines all begin with it.
PROG = "python -m wok.bench.chaos"
MODEL = "chaos"
TABLE = 100  # the embedding's rows: an id at or past it makes the model raise
ALONE = "(on this request alone)"
CORE_INTERNAL = "Internal error from Core"
# Longest a call may take before the audit calls it hung (far past every deadline the load sets).
# A call without a planned deadline has no gRPC deadline at all: one that fired would read as
# DEADLINE_EXCEEDED, not as the hang it is.
HANG_S = 60.0

MODEL_SOURCE = textwrap.dedent(
    '''
    import time

    import torch


    class Chaos(torch.nn.Module):
        """y = 2x + table[id], table[i] = (i, -i); an id >= 100 raises IndexError. ~2 ms a batch."""

        def __init__(self):
            super().__init__()
            self.table = torch.nn.Embedding(100, 2)
            with torch.no_grad():
                i = torch.arange(100, dtype=torch.float32)
                self.table.weight.copy_(torch.stack([i, -i], 1))

        def forward(self, x, idx):
            time.sleep(0.002)  # a batch's fixed cost, so that requests queue and batch
            # idx + 0: wok's load follows no arithmetic to the table (server/tables.py), so that a bad id reaches
            # the model and fails its batch, the path this load exercises, rather than being refused as decoded.
            return 2 * x + self.table(idx + 0).squeeze(1)


    def build():
        return Chaos()
    '''
)

CONFIG = textwrap.dedent(
    """
    platform = "python"
    factory = "model:build"
    max_batch_size = 16

    [[inputs]]
    name = "x"
    datatype = "FP32"
    dims = [2]

    [[inputs]]
    name = "idx"
    datatype = "INT64"
    dims = [1]

    [[outputs]]
    name = "y"
    datatype = "FP32"
    dims = [2]

    [dynamic_batching]
    max_queue_delay_ms = 4.0

    [instances]
    count = 2
    devices = ["cpu"]
    """
)


def write_repository(root: Path) -> Path:
    """Lay out a model repository holding the chaos model at `root`; returns `root`."""
    folder = Path(root) / MODEL
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.py").write_text(MODEL_SOURCE)
    (folder / "config.toml").write_text(CONFIG)
    return Path(root)


@dataclass
class Plan:
    """What load to send. Rates in requests/s, times in s."""

    seconds: float = 10.0
    rate: float = 150.0  # unary arrivals
    streams: int = 2  # streams open at once, each followed by the next
    bad_burst: float = 0.003  # chance per unary arrival of 40 bad requests at once
    seed: int = 1

    def __post_init__(self) -> None:
        if not self.seconds > 0:
            raise ValueError(f"--seconds: expected a number > 0; got {self.seconds:g}")
        if not self.rate > 0:
            raise ValueError(f"--rate: expected requests/s > 0; got {self.rate:g}")
        if (refusal := integer_refusal("--streams", self.streams, 0)) is not None:
            raise ValueError(refusal)


@dataclass
class Req:
    serial: int
    channel: str  # unary, stream, final
    kind: str
    rows: int
    idx: int
    timeout_s: float | None = None  # the call's gRPC deadline
    timeout_us: int | None = None  # the V2 timeout parameter
    cancel_s: float | None = None  # the client cancels the call this long after sending it
    stream: str | None = None
    sent: bool = False
    sent_at: float | None = None  # time.monotonic() as the client began to send it
    answered_at: float | None = None  # ... as its answer arrived
    cancelled: bool = False
    answers: list = field(default_factory=list)  # (code name, details, rows, or why none could be read)

    def expected(self) -> list[list[float]]:
        return [[2.0 * self.serial + self.idx, 2.0 * k - self.idx] for k in range(self.rows)]


@dataclass
class Stream:
    id: str
    serials: list = field(default_factory=list)
    cancel_s: float | None = None
    timeout_s: float | None = None
    cancelled: bool = False
    status: str | None = None
    details: str | None = None
    stray_ids: list = field(default_factory=list)  # answers naming no request of this stream
    writer_error: str | None = None  # why the client could not write all its requests


@dataclass
class Run:
    plan: Plan
    reqs: dict = field(default_factory=dict)  # serial → Req
    streams: list = field(default_factory=list)
    load_s: float = 0.0
    model_stats: dict = field(default_factory=dict)  # after the run, less before it


def _kind(rng: random.Random, stream: bool) -> str:
    u = rng.random()
    for kind, upto in (("good", 0.80), ("bad", 0.90), ("bad_shape", 0.94), ("bad_dtype", 0.97), ("unknown", 0.985)):
        if u < upto:
            return kind
    return "good" if stream else "unparsed"


def _encode(r: Req):
    import numpy as np

    from wok.codec import encode_request

    x = np.stack([np.full(r.rows, r.serial, np.float32), np.arange(r.rows, dtype=np.float32)], 1)
    if r.kind == "bad_shape":
        x = np.concatenate([x, np.zeros((r.rows, 1), np.float32)], 1)
    elif r.kind == "bad_dtype":
        x = x.astype(np.float64)
    model = "no-such-model" if r.kind == "unknown" else MODEL
    idx = np.full((r.rows, 1), r.idx, np.int64)
    return encode_request(model, {"x": x, "idx": idx}, request_id=str(r.serial), timeout_us=r.timeout_us)


def _answered(r: Req, response) -> None:
    """Record an OK answer's rows; one that cannot be read is recorded as what was wrong with it."""
    from wok.codec import decode_response

    r.answered_at = time.monotonic()
    try:
        rows = decode_response(response)["y"].tolist()
    except Exception as exc:  # the server's fault, for the audit to report, not the client's end
        rows = f"an answer that cannot be read: {exc!r}"
    r.answers.append(("OK", "", rows))


def _ended(r: Req, code: str, details: str) -> None:
    """Record an answer without rows: an error, or the OK of unparsable bytes' call."""
    r.answered_at = time.monotonic()
    r.answers.append((code, details, None))


class _Client:
    """One run's load on one channel; every request is recorded in `run.reqs`. Each load task
    draws from its own random generator (seeded from the plan's seed and its name), so that a
    seed gives the same requests whatever order the tasks run in."""

    def __init__(self, channel, run: Run) -> None:
        from wok.v2pb import grpc_service_pb2_grpc as pbg

        self.run = run
        self.stub = pbg.GRPCInferenceServiceStub(channel)
        self.raw = channel.unary_unary(
            "/inference.GRPCInferenceService/ModelInfer",
            request_serializer=lambda b: b,
            response_deserializer=lambda b: b,
        )
        self._serial = 0

    def rng(self, name: str) -> random.Random:
        return random.Random(f"{self.run.plan.seed}/{name}")

    def new(self, rng: random.Random, channel: str, kind: str, **options) -> Req:
        self._serial += 1
        idx = rng.randrange(TABLE, 10 * TABLE) if kind == "bad" else rng.randrange(TABLE)
        r = Req(self._serial, channel, kind, rng.randint(1, 3), idx, **options)
        self.run.reqs[r.serial] = r
        return r

    async def unary(self, r: Req) -> None:
        import grpc

        loop = asyncio.get_running_loop()
        r.sent_at = time.monotonic()
        if r.kind == "unparsed":
            call = self.raw(b"\xff\xff\xff\xff")
        else:
            call = self.stub.ModelInfer(_encode(r), timeout=r.timeout_s)
        r.sent = True

        def cancel() -> None:
            r.cancelled = call.cancel()

        cut = loop.call_later(r.cancel_s, cancel) if r.cancel_s is not None else None
        try:
            response = await asyncio.wait_for(asyncio.shield(call), HANG_S)
            if r.kind == "unparsed":
                _ended(r, "OK", "")
            else:
                _answered(r, response)
        except asyncio.TimeoutError:
            _ended(r, "HUNG", f"no answer in {HANG_S:g} s")
            call.cancel()
        except asyncio.CancelledError:
            if not r.cancelled:
                raise
            _ended(r, "CANCELLED", "cancelled by the client")
        except grpc.aio.AioRpcError as exc:
            _ended(r, exc.code().name, exc.details() or "")
        finally:
            if cut is not None:
                cut.cancel()

    async def unary_load(self, end: float, tasks: list) -> None:
        rng, plan = self.rng("unary"), self.run.plan
        t = time.monotonic()
        while True:
            t += rng.expovariate(plan.rate)
            if t >= end:
                return
            await asyncio.sleep(max(0.0, t - time.monotonic()))
            burst = rng.random() < plan.bad_burst
            for _ in range(40 if burst else 1):
                kind = "bad" if burst else _kind(rng, stream=False)
                options = {}
                if kind in ("good", "bad"):
                    u = rng.random()
                    if u < 0.10:
                        options["timeout_s"] = rng.uniform(0.002, 0.025)
                    elif u < 0.16:
                        options["timeout_us"] = rng.randrange(1_000, 20_000)
                    elif u < 0.22:
                        options["cancel_s"] = rng.uniform(0.0, 0.015)
                tasks.append(asyncio.ensure_future(self.unary(self.new(rng, "unary", kind, **options))))

    async def stream(self, sid: str, reqs: list[Req], st: Stream, gaps: list[float]) -> None:
        import grpc

        loop = asyncio.get_running_loop()
        call = self.stub.ModelStreamInfer(timeout=st.timeout_s)

        async def write() -> None:
            for r, gap in zip(reqs, gaps):
                if gap:
                    await asyncio.sleep(gap)
                r.sent_at = time.monotonic()
                r.sent = True  # a write the stream's end cuts short may have reached the server
                await call.write(_encode(r))
            await call.done_writing()

        async def read() -> None:
            async for response in call:
                ir = response.infer_response
                # Not isdigit(): it takes digits int() refuses ("²"), and the ValueError ended the reader
                # and the stream's task. Our ids are ASCII; any other is a stray id (rule 4).
                r = self.run.reqs.get(int(ir.id)) if ascii_digits(ir.id) else None
                if r is None or r.stream != sid:
                    st.stray_ids.append(ir.id)
                elif response.error_message:
                    code = ir.parameters["status_code"].int64_param if "status_code" in ir.parameters else -1
                    name = next((c.name for c in grpc.StatusCode if c.value[0] == code), f"status {code}")
                    _ended(r, name, response.error_message)
                else:
                    _answered(r, ir)

        def cancel() -> None:
            st.cancelled = call.cancel()

        cut = loop.call_later(st.cancel_s, cancel) if st.cancel_s is not None else None
        writer = asyncio.ensure_future(write())
        try:
            await asyncio.wait_for(read(), HANG_S)
            st.status, st.details = (await call.code()).name, await call.details()
        except asyncio.TimeoutError:
            st.status = "HUNG"
            call.cancel()
        except asyncio.CancelledError:
            if not st.cancelled:
                raise
            st.status = "CANCELLED"
        except grpc.aio.AioRpcError as exc:
            st.status, st.details = exc.code().name, exc.details()
        finally:
            if cut is not None:
                cut.cancel()
            writer.cancel()
            try:
                await writer
            except asyncio.CancelledError:
                pass
            except Exception as exc:
                # The call ended under it: the requests it had not written stay unsent. A stream
                # the server ended OK before the client was done writing is a problem (rule 1).
                st.writer_error = repr(exc)

    async def stream_load(self, end: float, k: int) -> None:
        rng = self.rng(f"stream/{k}")
        i = 0
        while time.monotonic() < end:
            i += 1
            sid = f"{k}-{i}"
            cancel = rng.random() < 0.15
            st = Stream(sid, cancel_s=rng.uniform(0.0, 0.05) if cancel else None)
            if not cancel and rng.random() < 0.10:
                st.timeout_s = rng.uniform(0.01, 0.06)
            reqs = []
            for _ in range(rng.randint(3, 30)):
                kind = _kind(rng, stream=True)
                timeout_us = rng.randrange(1_000, 20_000) if kind in ("good", "bad") and rng.random() < 0.12 else None
                reqs.append(self.new(rng, "stream", kind, stream=sid, timeout_us=timeout_us))
            st.serials = [r.serial for r in reqs]
            burst = rng.random() < 0.3  # everything written at once
            gaps = [0.0 if burst else rng.uniform(0, 0.004) for _ in reqs]
            self.run.streams.append(st)
            await self.stream(sid, reqs, st, gaps)
            await asyncio.sleep(rng.uniform(0.1, 0.4))

    async def final(self) -> None:
        """Good requests only, after the load: 30 unary, a stream of 20."""
        rng = self.rng("final")
        await asyncio.gather(*(self.unary(self.new(rng, "final", "good")) for _ in range(30)))
        reqs = [self.new(rng, "final", "good", stream="final") for _ in range(20)]
        st = Stream("final", serials=[r.serial for r in reqs])
        self.run.streams.append(st)
        await self.stream("final", reqs, st, [0.0] * len(reqs))

    async def model_stats(self) -> dict:
        from wok.v2pb import grpc_service_pb2 as pb

        stats = await self.stub.ModelStatistics(pb.ModelStatisticsRequest(name=MODEL), timeout=10)
        s = stats.model_stats[0]
        return {
            "success": s.inference_stats.success.count,
            "fail": s.inference_stats.fail.count,
            "inference_count": s.inference_count,
            "execution_count": s.execution_count,
        }


async def drive(target: str, plan: Plan, progress=None) -> Run:
    """Send `plan`'s load to the server at `target` (HOST:PORT) serving the chaos model, then the
    final round; `run.model_stats` is the model's ModelStatistics after, less before.
    `progress(done_s, total_s)` is called each second of the load and as it ends."""
    import grpc

    run = Run(plan)
    async with grpc.aio.insecure_channel(target) as channel:
        client = _Client(channel, run)
        before = await client.model_stats()
        t0 = time.monotonic()
        end = t0 + plan.seconds
        tasks: list[asyncio.Future] = []
        loads = [asyncio.ensure_future(client.unary_load(end, tasks))]
        loads += [asyncio.ensure_future(client.stream_load(end, k)) for k in range(plan.streams)]
        try:
            while not all(f.done() for f in loads):
                await asyncio.wait(loads, timeout=1.0)
                if progress is not None:
                    progress(min(time.monotonic() - t0, plan.seconds), plan.seconds)
            await asyncio.gather(*loads)
            await asyncio.gather(*tasks)
        finally:
            for f in loads + tasks:
                f.cancel()
        run.load_s = time.monotonic() - t0
        await client.final()
        after = await client.model_stats()
        run.model_stats = {k: after[k] - before[k] for k in after}
    return run


# -- the audit ------------------------------------------------------------------------------


def _earns(kind: str) -> str:
    """The code a request of `kind` earns from the server, cut and deadlines aside."""
    return {"good": "OK", "bad": "INTERNAL", "unknown": "NOT_FOUND"}.get(kind, "INVALID_ARGUMENT")


def _natural(r: Req) -> set[str]:
    """The codes the server may answer a request of its kind with, cut and deadlines aside (a good
    one: also a batch's error the probing left it)."""
    return {_earns(r.kind)} | ({"INTERNAL"} if r.kind == "good" else set())


def _label(r: Req) -> str:
    """The `model` label the server counts the request under: none for one that names no model it serves."""
    return "" if r.kind in ("unknown", "unparsed") else MODEL


@dataclass
class _Tally:
    problems: list = field(default_factory=list)
    codes: dict = field(default_factory=lambda: defaultdict(Counter))  # channel/kind → code → n
    seen: Counter = field(default_factory=Counter)  # (model label, code) of answers surely the server's
    allowed: Counter = field(default_factory=Counter)  # (model label, code) → unplaced answers that may be it
    unplaced: int = 0
    undecided_good: list = field(default_factory=list)
    bad_alone: int = 0


def _unplaced(t: _Tally, r: Req, cut: bool, deadline: bool) -> None:
    """An answer the client cannot place: the server may have counted it under any code it could end with."""
    t.unplaced += 1
    for code in _natural(r) | ({"CANCELLED"} if cut else set()) | ({"DEADLINE_EXCEEDED"} if deadline else set()):
        t.allowed[(_label(r), code)] += 1


def _check_request(t: _Tally, r: Req, st: Stream | None) -> None:
    """Rules 1–3 and 6 for one request."""
    from wok.executor import NOT_RERUN  # here, not at the top: it loads torch, which parsing the options needs not

    call_deadline = r.timeout_s is not None or (st is not None and st.timeout_s is not None)
    deadline = call_deadline or r.timeout_us is not None
    only_v2 = not call_deadline  # a stream's deadline bounds its requests' too
    cut = r.cancelled or (st is not None and (st.cancelled or st.status != "OK"))
    label = f"{r.channel}/{r.kind}"
    if len(r.answers) > 1:
        t.problems.append(f"request {r.serial} ({label}): expected one answer; got {len(r.answers)}: {r.answers}")
    if not r.answers:
        t.codes[label]["(none)"] += 1
        if st is None or st.status == "OK":  # an OK stream ended after the client wrote everything
            t.problems.append(
                f"request {r.serial} ({label}): expected an answer; got none (stream {r.stream}: {st and st.status})"
            )
        elif r.sent:
            _unplaced(t, r, cut, deadline)
        return
    code, details, rows = r.answers[0]
    t.codes[label][code] += 1
    from_server = details.startswith(f"request to model '{MODEL}'")
    own_cut = (code == "CANCELLED" and cut) or (code == "DEADLINE_EXCEEDED" and deadline)
    if code == "HUNG" or (own_cut and not from_server):
        # Ended by the client (its cut, its gRPC deadline, its patience): the server may not know yet.
        _unplaced(t, r, cut, deadline)
    else:
        t.seen[(_label(r), code)] += 1
    if r.channel == "final" and code != "OK":
        t.problems.append(f"after the load, good request {r.serial}: expected OK; got {code}: {details}")
    elif code == "HUNG":
        t.problems.append(f"request {r.serial} ({label}) hung: {details}")
    elif code == "CANCELLED" and not cut:
        t.problems.append(f"request {r.serial} ({label}) CANCELLED, the client cut nothing: {details}")
    elif code == "DEADLINE_EXCEEDED" and not deadline:
        t.problems.append(f"request {r.serial} ({label}) DEADLINE_EXCEEDED without a deadline: {details}")
    elif code == "DEADLINE_EXCEEDED" and from_server and r.timeout_us is not None and only_v2:
        # The server counts a V2 timeout from its arrival, after the client began to send it.
        took = r.answered_at - r.sent_at
        if took < r.timeout_us / 1e6:
            t.problems.append(
                f"request {r.serial} ({label}) DEADLINE_EXCEEDED {1e3 * took:.2f} ms after it was sent, "
                f"before its timeout of {r.timeout_us / 1e3:g} ms: {details}"
            )
    elif own_cut:
        pass
    elif r.kind == "good":
        if code == "OK" and rows != r.expected():
            t.problems.append(f"request {r.serial} ({label}): expected rows {r.expected()}; got {rows}")
        elif code == "INTERNAL" and details.endswith(NOT_RERUN):
            t.undecided_good.append(f"request {r.serial} ({label}): {details}")
        elif code != "OK":
            t.problems.append(f"good request {r.serial} ({label}): expected OK; got {code}: {details}")
    else:
        want = _earns(r.kind)
        # Only what the reruns found: a request rerun alone as its device was lost (executor.LOST_ALONE) may
        # have failed by the loss, another instance's kernel's, not by its id, and the server says so.
        t.bad_alone += r.kind == "bad" and code == "INTERNAL" and details.endswith(ALONE)
        if code != want:
            t.problems.append(f"{r.kind} request {r.serial} ({label}): expected {want}; got {code}: {details}")


def _check_stream(t: _Tally, st: Stream) -> None:
    """Rule 4."""
    if st.stray_ids:
        t.problems.append(f"stream {st.id} answered ids of no request of its own: {st.stray_ids[:10]}")
    if st.status == "OK" and st.writer_error:
        t.problems.append(f"stream {st.id} ended OK before the client had written all it meant to: {st.writer_error}")
    # gRPC's client ends a stream whose deadline passes as a write is under way INTERNAL,
    # "Internal error from Core": its own, not the server's.
    ended_by_client = (st.status == "CANCELLED" and st.cancelled) or (
        st.timeout_s is not None
        and (st.status == "DEADLINE_EXCEEDED" or (st.status, st.details) == ("INTERNAL", CORE_INTERNAL))
    )
    if st.status != "OK" and not ended_by_client:
        t.problems.append(
            f"stream {st.id} ended {st.status}: {st.details} (cancelled {st.cancelled}, deadline {st.timeout_s})"
        )


ENDED_BEFORE_HANDLER = "wok_calls_ended_before_handler_total"


def _counts(metrics_text: str) -> tuple[Counter, int, dict]:
    """wok_responses_total by (model, code); the ModelInfer calls that ended before wok's handler
    ran (0 where the server does not export them); the chaos model's queue and in-flight gauges."""
    responses: Counter = Counter()
    ended = 0
    gauges: dict = {}
    for (name, items), value in parse_exposition(metrics_text).values.items():
        labels = dict(items)
        if name == "wok_responses_total":
            responses[(labels["model"], labels["code"])] += whole(name, value)
        elif name == ENDED_BEFORE_HANDLER and labels.get("method") == "ModelInfer":
            ended += whole(name, value)
        elif name in ("wok_queue_depth", "wok_inflight_batches") and labels.get("model") == MODEL:
            gauges[name] = gauges.get(name, 0) + value
    return responses, ended, gauges


_NOT_ERRORS = ("OK", "CANCELLED", "DEADLINE_EXCEEDED")


def _check_server(t: _Tally, run: Run, counted: Counter, ended: int, gauges: dict) -> None:
    """Rule 5: the server's counts of the run against what the client saw (`ended`: the ModelInfer
    calls that ended before wok's handler ran, which no code's count holds)."""
    for key in sorted(set(counted) | set(t.seen)):
        s, c, may = counted[key], t.seen[key], t.allowed[key]
        if not c <= s <= c + may:
            t.problems.append(
                f"wok_responses_total{{model={key[0]!r},code={key[1]!r}}} grew by {s}; the client saw {c} answers "
                f"with that code from the server, and {may} it cannot place could have it"
            )
    # Each call the server saw is in one of the two counters: a call ended before the handler is
    # one the client cut or whose deadline passed (unplaced), in no code's count above.
    total_seen, total_counted = sum(t.seen.values()), sum(counted.values()) + ended
    if not total_seen <= total_counted <= total_seen + t.unplaced:
        t.problems.append(
            f"wok_responses_total grew by {total_counted - ended} and {ENDED_BEFORE_HANDLER} by {ended}, "
            f"{total_counted} in all; the client: {total_seen} answers from the server + {t.unplaced} it cannot place"
        )
    for gauge, value in sorted(gauges.items()):
        if value:
            t.problems.append(f"{gauge} is {value:g} after the run, expected 0")
    if run.model_stats.get("success") != counted[(MODEL, "OK")]:
        t.problems.append(
            f"ModelStatistics success grew by {run.model_stats.get('success')}; wok_responses_total OK by "
            f"{counted[(MODEL, 'OK')]}"
        )
    # fail counts the errors callers got: every code but OK, CANCELLED (a call its client cut) and
    # DEADLINE_EXCEEDED, which is an error answered for a V2 timeout, but the server counts a gRPC
    # deadline's end by that code too.
    errors = sum(n for (model, code), n in counted.items() if model == MODEL and code not in _NOT_ERRORS)
    late = counted[(MODEL, "DEADLINE_EXCEEDED")]
    fail = run.model_stats.get("fail")
    if fail is None or not errors <= fail <= errors + late:
        t.problems.append(
            f"ModelStatistics fail grew by {fail}; wok_responses_total's errors (not OK, CANCELLED or "
            f"DEADLINE_EXCEEDED) by {errors}, its DEADLINE_EXCEEDED by {late}: expected from the first to their sum"
        )


def audit(run: Run, metrics_text: str, metrics_before: str = "") -> dict:
    """Hold `run` to the module's rules against the server's /metrics text read after it (and,
    for a server that had served before, the text read before it, whose counts are taken off).

    Returns {"problems": [...], "codes": {channel/kind: {code: n}}, ...}: no problem, every rule held."""
    t = _Tally()
    streams = {st.id: st for st in run.streams}
    for r in run.reqs.values():
        _check_request(t, r, streams.get(r.stream) if r.stream else None)
    for st in run.streams:
        _check_stream(t, st)
    counted, ended, gauges = _counts(metrics_text)
    earlier, ended_earlier, _ = _counts(metrics_before)
    counted.subtract(earlier)
    ended -= ended_earlier
    _check_server(t, run, +counted, ended, gauges)
    return {
        "problems": t.problems,
        "codes": {k: dict(sorted(v.items())) for k, v in sorted(t.codes.items())},
        "bad_alone": t.bad_alone,
        "undecided_good": len(t.undecided_good),
        "undecided_good_examples": t.undecided_good[:5],
        "unplaced": t.unplaced,
        "server": {f"{m or '-'}/{c}": n for (m, c), n in sorted(counted.items()) if n},
        "ended_before_handler": ended,
        "model_stats": run.model_stats,
    }


def result(run: Run, checked: dict, target: str | None = None) -> dict:
    """The JSON document (schema wok.chaos/1); `target`: the server given (None: one started)."""
    return {
        "schema": SCHEMA,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "config": {**asdict(run.plan), "target": target},
        "requests": len(run.reqs),
        "streams": len(run.streams),
        "load_s": round(run.load_s, 3),
        **checked,
    }


def table(doc: dict) -> str:
    kinds = sorted({c for codes in doc["codes"].values() for c in codes})
    width = max((len(k) for k in doc["codes"]), default=12)
    lines = [
        f"{doc['requests']} requests ({doc['streams']} streams) in {doc['load_s']:.1f} s, seed {doc['config']['seed']}",
        f"{'channel/kind':<{width}}  " + "  ".join(f"{k:>17}" for k in kinds),
    ]
    for label, codes in doc["codes"].items():
        lines.append(f"{label:<{width}}  " + "  ".join(f"{codes.get(k, 0):>17}" for k in kinds))
    lines.append(f"bad requests found by the reruns (failed alone): {doc['bad_alone']}")
    lines.append(f"good requests given an undecided batch's error: {doc['undecided_good']}")
    lines.append(f"problems: {len(doc['problems'])}")
    lines += [f"  - {p[:400]}" for p in doc["problems"][:30]]
    return "\n".join(lines)


def _scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()


def build_parser() -> argparse.ArgumentParser:
    """This script's parser (tests/deploy/test_doc_commands.py parses the docs' command lines with it)."""
    from wok.cliargs import ArgumentParser  # argparse's, its refusals in wok's words

    ap = ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=30.0, help="how long the load runs (default 30)")
    ap.add_argument("--rate", type=float, default=150.0, help="unary requests a second (default 150)")
    ap.add_argument("--streams", type=int, default=2, help="streams open at once (default 2)")
    ap.add_argument("--seed", type=int, default=1, help="seed of the plan's random draws (default 1)")
    ap.add_argument("--target", help="HOST:PORT of a server serving the chaos model (default: start one)")
    ap.add_argument("--metrics-url", help="its /metrics URL (with --target; default http://HOST:8002/metrics)")
    ap.add_argument("--write-repository", metavar="DIR", help="lay out the chaos model's repository in DIR and exit")
    ap.add_argument("--json", metavar="PATH", help="write the tallies and problems (schema wok.chaos/1)")
    return ap


def main(argv: list[str] | None = None) -> int:
    from wok.errors import quoted_name

    ap = build_parser()
    args = ap.parse_args(argv)
    refuse_unwritable(ap, args, "--json")
    if args.write_repository:
        write_repository(Path(args.write_repository))
        print(f"{PROG}: the chaos model laid out in {args.write_repository}")
        return 0
    try:
        plan = Plan(args.seconds, args.rate, args.streams, seed=args.seed)
    except ValueError as exc:
        ap.error(str(exc))
    if args.target:
        from wok.bench.cli import check_one_target
        from wok.clients.channel import _SCHEMES

        try:
            args.target = check_one_target(args.target)  # else one without a port dials 443
        except ValueError as exc:
            ap.error(str(exc))
        if args.target.startswith(_SCHEMES) and not args.metrics_url:
            ap.error(f"--target {quoted_name(args.target)}: a gRPC name; give its --metrics-url")
    tty = sys.stderr.isatty()
    shown = [0.0]

    def progress(done: float, total: float) -> None:
        if tty:
            print(f"\r{PROG}: {done:5.1f} / {total:g} s", end="", file=sys.stderr, flush=True)
        elif done - shown[0] >= 10 or (done >= total > shown[0]):  # a line every 10 s into a log
            shown[0] = done
            print(f"{PROG}: {done:.0f} / {total:g} s", file=sys.stderr, flush=True)

    from wok.bench.faults import ReplicaSet

    with tempfile.TemporaryDirectory(prefix="wok-chaos-") as tmp:
        replicas = None
        try:
            if args.target:
                target = args.target
                metrics_url = args.metrics_url or f"http://{target.rsplit(':', 1)[0]}:8002/metrics"
            else:
                replicas = ReplicaSet(1, ["--model-repository", str(write_repository(Path(tmp)))])
                target, metrics_url = replicas.target, replicas[0].metrics_url
            try:
                before = _scrape(metrics_url)
            except (OSError, ValueError) as exc:  # URLError, a URL urllib cannot take: the audit needs them
                print(f"{PROG}: cannot read the server's metrics at {metrics_url}: {exc}", file=sys.stderr)
                return 1
            import grpc

            try:
                run = asyncio.run(drive(target, plan, progress))
                after = _scrape(metrics_url)
            except (OSError, grpc.RpcError) as exc:  # the server went away during the load
                why = f"{exc.code().name}: {exc.details()}" if isinstance(exc, grpc.RpcError) else exc
                end = "\n" if tty else ""  # after the progress line
                print(f"{end}{PROG}: cannot read the server's counts after the load: {why}", file=sys.stderr)
                return 1
            if tty:
                print(file=sys.stderr)
            doc = result(run, audit(run, after, before), args.target)
        finally:
            if replicas is not None:
                replicas.close()
    # The file first: a reader that closes stdout early (`| head -1`) must not cost it.
    failed = write_final(doc, [("--json", args.json, write_json)]) if args.json else None
    print(table(doc))
    if failed:
        print(f"{PROG}: {failed}", file=sys.stderr)
        return 1
    return 1 if doc["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
