"""Open-loop sends on ModelStreamInfer: the streaming RPC driven like `wok bench ramp`'s unary calls.

A worker keeps `streams` bidirectional streams open for a step and sends each request of its
share at its intended time (paced on wok.timers' timerfd, as the unary sender is) on the next
stream, round robin. Each request carries its index in the share as its `id`, appended to the
pre-serialized bytes (a later field wins when protobuf parses a message), and its deadline as
the `timeout` parameter, so the server drops it as it would a unary call's. A reader per stream
matches each answer to its request by that id: latency, status codes, dispatch lag and the host's
share of it (the send loop's waits for a CPU: workers.SendHostShare) come out in the same `Outcome`
as for unary calls.

Sending never waits for a stream: the send loop queues each request on its stream, and a writer
task per stream writes them in order, so a stream whose writes are held (flow control, a server
that hangs) delays only its own requests, never the schedule of the others.

A failed request's answer is an `error_message`; wok puts its gRPC status code in the answer's
`status_code` parameter (another server's error counts as UNKNOWN, as does a number that names no
gRPC failure). An answer whose id is not one of the sender's settles nothing: its request waits out
its deadline, and the stream goes on. A request with no answer
`timeout_s` after it was sent is DEADLINE_EXCEEDED, with `done` = sent + `timeout_s`, settled then
(as a unary call's deadline ends it, so it leaves the in-flight count on time); an answer that
comes later is ignored, and a request not yet written by then is never written. Requests are
sent in time order with one timeout, so their deadlines come in send order: one timer walks a
FIFO of the sends. If a stream itself fails, its
unanswered requests take the stream's code (they were lost with it; UNKNOWN when the failure is
the sender's own, an answer that does not parse), and the next request due
opens a replacement on the same channel, whose balancer picks a server that is up: a failed
stream's share of the load comes back at once, not at the next step. A stream slot reopens at
most once per `REOPEN_AFTER_S`, so a fleet that is down for good is not hammered with streams
that fail at once; until then requests go to the streams still open (UNAVAILABLE when none is).

A server that drains (SIGTERM) keeps its streams open to answer what it has accepted, but refuses
every new request on them (UNAVAILABLE) until the drain ends, seconds later. So a stream is retired
as soon as its server is seen draining: its channel (a channel per server, health-checked) fails
while another is connected, or it answers a request UNAVAILABLE (wok's code only for a server that
stops). A retired stream gets no new request: those queued on it and not yet written are dealt to the
others, its writer half-closes it, and its reader still settles the answers of those sent; its slot
reopens, on a connected server, as a failed stream's does.

A slot so moved off its own server goes back to it once that server is up again (restarted, say,
in a rolling restart): a timer reads the channels' states every REJOIN_AFTER_S / 4, and a stream
away from its slot's server is retired, as above, once that server's channel has been READY for
REJOIN_AFTER_S and the stream open as long; the slot reopens on its own server. Nothing is lost
or sent twice (a retired stream's written requests are answered on it, the others dealt anew), and
a server that flaps draws a slot back at most once per REJOIN_AFTER_S. One channel (a `dns:///`
name) has one state for all its servers and does not say which one a stream is on: there the only
sign of a drain is a refusal, and nothing moves a stream back.
"""

from __future__ import annotations

import array
import asyncio
import time
from collections import deque

import numpy as np

from wok.numerals import ascii_digits
from wok.timers import PreciseSleeper

STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"
OK, CANCELLED, UNKNOWN, DEADLINE_EXCEEDED, UNAVAILABLE = 0, 1, 2, 4, 14
FIRST_FAILURE, LAST_FAILURE = 1, 16  # gRPC's failure codes: CANCELLED .. UNAUTHENTICATED
# The least time between two openings of one stream slot: a failed stream is replaced with the next
# request unless its slot opened less than this ago (then with the first request after that).
REOPEN_AFTER_S = 0.1
# A slot whose stream is away from its own server (moved while that one was down) goes back once
# that server's channel has been seen READY for this long and the slot's stream has been open this
# long: a server that flaps draws each slot back at most once per REJOIN_AFTER_S. The channels'
# states are read every REJOIN_AFTER_S / 4, off the send path.
REJOIN_AFTER_S = 1.0


def id_field(i: int) -> bytes:
    """The serialized `id` field (number 3, a string) holding `i`."""
    s = b"%d" % i
    return b"\x1a" + bytes((len(s),)) + s


def timeout_field(timeout_s: float) -> bytes:
    """The serialized `timeout` request parameter (whole µs, at least 1), as a field to append."""
    from wok.v2pb import grpc_service_pb2 as pb

    m = pb.ModelInferRequest()
    m.parameters["timeout"].int64_param = max(1, round(timeout_s * 1e6))
    return m.SerializeToString()


def parse_answer(msg: bytes) -> tuple[int | None, int]:
    """(request index, gRPC status number) of one ModelStreamInferResponse; index None if it has no id of ours."""
    from wok.v2pb import grpc_service_pb2 as pb

    r = pb.ModelStreamInferResponse.FromString(msg)
    rid = r.infer_response.id
    # Not isdigit() alone: it takes digits int() refuses ("²"), and the ValueError ended the stream's
    # reader, failing every request in flight on it. Ours are ASCII; any other id is not ours.
    index = int(rid) if ascii_digits(rid) else None
    if not r.error_message:
        return index, OK
    p = r.infer_response.parameters.get("status_code")
    code = p.int64_param if p is not None else UNKNOWN
    # Another server's number may name no gRPC failure: one past int16 ended the reader as above (the
    # codes array's OverflowError), and -1 read as NOT_SENT. As the clients read it, UNKNOWN.
    return index, code if FIRST_FAILURE <= code <= LAST_FAILURE else UNKNOWN


def answer_message(msg: bytes) -> str:
    """The `error_message` of one ModelStreamInferResponse ('' for a success): what the server said."""
    from wok.v2pb import grpc_service_pb2 as pb

    return pb.ModelStreamInferResponse.FromString(msg).error_message


async def run_share_stream(
    channel, pool: list[bytes], share, metadata=None, streams: int = 4, stop=None, first_slot: int = 0
):
    """Send `share` (wok.bench.workers.Share) open loop on `streams` streams of `channel`; an Outcome.
    With `stop` (a multiprocessing Event) set, stop sending and close the streams: requests in
    flight then have no answer (`done` NaN, code CANCELLED), and those never sent keep NOT_SENT.

    `channel` may be a list, a channel per server: stream slot k opens on channel
    (first_slot + k) mod their number, or, while that one is not connected and another is, on the
    next connected one. One round_robin channel over several servers puts every stream on the one
    server it is connected to when they open, and they stay there. A pool's workers number their
    slots on from one another (`first_slot`): were each to start at 0, workers with fewer streams
    than there are servers would all open theirs on the first servers and leave the last idle."""
    import grpc

    from .workers import NOT_SENT, Outcome, SendHostShare, _short, until_stopped

    n = len(share.times)
    sent = np.full(n, np.nan)
    host_lag = np.full(n, np.nan)
    done = np.full(n, np.nan)
    codes = np.full(n, NOT_SENT, dtype=np.int16)  # each request's is set as it is settled
    start = share.start_at
    timeout_s = share.timeout_s
    suffix = timeout_field(timeout_s)
    pending: dict[int, int] = {}  # request index -> stream id
    # Per status code other than OK, the first message a request settled with it came with (the
    # server's error_message, the stream's status details): Outcome.details, as the unary sender's.
    details: dict[int, str] = {}
    # (offset, requests in flight) pairs, flat, 16 bytes a pair: a soak sends millions of requests,
    # and a list of tuples held ~120 bytes a pair until the end.
    samples = array.array("d")
    loop = asyncio.get_running_loop()
    READY = grpc.ChannelConnectivity.READY
    FAILING = grpc.ChannelConnectivity.TRANSIENT_FAILURE
    channels = list(channel) if isinstance(channel, (list, tuple)) else [channel]
    methods = [c.stream_stream(STREAM, request_serializer=None, response_deserializer=None) for c in channels]
    # Each opened stream gets a new id, so a failed stream's reader, still settling, never takes
    # the requests of the stream that replaced it in its slot.
    calls: list = []  # by stream id: every call opened
    slot_of: list[int] = []  # by stream id: its slot
    channel_of: list[int] = []  # by stream id: the index of its channel
    retired: list[bool] = []  # by stream id: its server drains; its writer half-closes it once idle
    outbox: list[deque] = []  # by stream id: (index, bytes) queued for its writer
    wake: list[asyncio.Event] = []  # by stream id: set when its outbox gets a request
    live: list[int] = []  # ids of the streams open now
    dead: list[int] = []  # slots whose stream failed, not yet reopened
    opened_at = [0.0] * max(1, streams)  # each slot's latest opening (monotonic)
    # By channel: since when it has been seen READY (monotonic), None while it is not.
    ready_since: list[float | None] = [None] * len(channels)
    rejoin_timer: asyncio.TimerHandle | None = None
    readers: list[asyncio.Task] = []
    writers: list[asyncio.Task] = []
    finished = asyncio.Event()
    expiry: deque[int] = deque()  # indices of the requests in flight, in send (= deadline) order
    timer: asyncio.TimerHandle | None = None

    def settle(i: int, code: int, message: str | None = None) -> None:
        """Request i ends with `code`, and `message` (what the server said, if anything), by its deadline."""
        now = time.monotonic() - start
        if now >= sent[i] + timeout_s:  # not answered by its deadline (the timer had yet to run)
            done[i], codes[i] = sent[i] + timeout_s, DEADLINE_EXCEEDED
        else:
            done[i], codes[i] = now, code
            if message is not None and code != OK and code not in details:
                details[code] = _short(message)
        del pending[i]
        samples.extend((now, len(pending)))
        if not pending and sending_done:
            finished.set()

    def expire() -> None:
        """Settle every request past its deadline; arm the timer for the next one."""
        nonlocal timer
        timer = None
        now = time.monotonic() - start
        while expiry:
            i = expiry[0]
            if i in pending:
                if sent[i] + timeout_s > now:
                    break
                settle(i, DEADLINE_EXCEEDED)
            expiry.popleft()
        arm()

    def arm() -> None:
        nonlocal timer
        if timer is None and expiry:
            timer = loop.call_later(max(0.0, start + sent[expiry[0]] + timeout_s - time.monotonic()), expire)

    def draining(k: int) -> bool:
        """Stream k's channel is failing while another is connected: its server drains (health-checked
        channels fail on NOT_SERVING) or died. Not one still connecting: each server's first
        connection takes its own time, and the streams would all go to the first one up."""
        c = channel_of[k]
        if channels[c].get_state(try_to_connect=False) is not FAILING:
            return False
        ready_since[c] = None  # a failure between two of rejoin's looks still restarts its wait
        return any(channels[j].get_state(try_to_connect=False) is READY for j in range(len(channels)) if j != c)

    def home(slot: int) -> int:
        return (first_slot + slot) % len(channels)

    def channel_for(slot: int) -> int:
        # Its own server's, unless that one is not connected and another is (a server that died:
        # its channel is IDLE or failing, and the slot's new stream goes where one is up). At the
        # first opening none is connected yet: each slot takes its own, spread over the servers.
        k = len(channels)
        own = home(slot)
        if k > 1 and channels[own].get_state(try_to_connect=True) is not READY:
            for j in range(1, k):
                c = (own + j) % k
                if channels[c].get_state(try_to_connect=True) is READY:
                    return c
        return own

    def open_stream(slot: int) -> None:
        opened_at[slot] = time.monotonic()
        c = channel_for(slot)
        call = methods[c](metadata=metadata)
        sid = len(calls)
        calls.append(call)
        slot_of.append(slot)
        channel_of.append(c)
        retired.append(False)
        outbox.append(deque())
        wake.append(asyncio.Event())
        live.append(sid)
        readers.append(loop.create_task(reader(sid)))
        writers.append(loop.create_task(writer(sid)))

    def drop(sid: int) -> None:
        if sid in live:
            live.remove(sid)
            dead.append(slot_of[sid])

    def reopen_due() -> None:
        now = time.monotonic()
        for slot in [s for s in dead if now - opened_at[s] >= REOPEN_AFTER_S]:
            try:
                open_stream(slot)
            except grpc.aio.UsageError:  # the channel is closed: the slot stays down
                continue
            dead.remove(slot)

    def pick(i: int) -> int | None:
        """The open stream request i goes on (round robin); None when no stream is open."""
        while live:
            k = live[i % len(live)]
            if len(channels) > 1 and draining(k):
                retire(k)
                continue
            return k
        return None

    def deal(i: int, msg: bytes) -> None:
        k = pick(i)
        if k is None:
            settle(i, UNAVAILABLE)
            return
        pending[i] = k
        outbox[k].append((i, msg))
        wake[k].set()

    def retire(k: int) -> None:
        """Stream k's server drains: no new request goes on it; those not yet written go elsewhere."""
        if k not in live:
            return
        drop(k)
        retired[k] = True
        unwritten = [(j, msg) for j, msg in outbox[k] if pending.get(j) == k]
        outbox[k].clear()
        wake[k].set()  # its writer half-closes it
        reopen_due()
        for j, msg in unwritten:
            deal(j, msg)

    def rejoin() -> None:
        """Retire each stream away from its own server once that one has been READY for
        REJOIN_AFTER_S (a server that drained and came back, say): its slot reopens there, so the
        load is spread again as at the start. Runs on a timer, never per request."""
        nonlocal rejoin_timer
        rejoin_timer = None
        if sending_done:
            return
        now = time.monotonic()
        away = {home(slot_of[k]) for k in live if channel_of[k] != home(slot_of[k])}
        for c, ch in enumerate(channels):
            # try_to_connect for a server some slot waits for: an IDLE channel does not reconnect alone.
            if ch.get_state(try_to_connect=c in away) is READY:
                if ready_since[c] is None:
                    ready_since[c] = now
            else:
                ready_since[c] = None
        for k in list(live):
            slot = slot_of[k]
            c, since = home(slot), ready_since[home(slot)]
            if channel_of[k] != c and since is not None and min(now - since, now - opened_at[slot]) >= REJOIN_AFTER_S:
                retire(k)
        rejoin_timer = loop.call_later(REJOIN_AFTER_S / 4, rejoin)

    async def writer(k: int) -> None:
        call, queue, ready = calls[k], outbox[k], wake[k]
        while True:
            while not queue:
                if retired[k]:
                    # Half-closed: the server ends the stream once it has answered what it read.
                    try:
                        await call.done_writing()
                    except asyncio.CancelledError:
                        return
                    except Exception:  # the stream has ended: its reader settles what it had
                        pass
                    return
                ready.clear()
                try:
                    await ready.wait()
                except asyncio.CancelledError:
                    return
            i, msg = queue.popleft()
            if pending.get(i) != k:  # settled unwritten: its deadline passed, or the stream failed
                continue
            try:
                await call.write(msg)
            except asyncio.CancelledError:
                return
            except (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError):
                # The stream failed under the write: this request and those queued behind it never
                # left; its reader settles those written before.
                for j in [i, *(j for j, _ in queue)]:
                    if pending.get(j) == k:
                        settle(j, UNAVAILABLE)
                queue.clear()
                drop(k)
                return

    async def reader(k: int) -> None:
        call = calls[k]
        try:
            while True:
                msg = await call.read()
                if msg is grpc.aio.EOF:
                    break
                i, code = parse_answer(msg)
                if i is not None and pending.get(i) == k:  # not one settled already (late, or lost)
                    settle(i, code, None if code == OK or code in details else answer_message(msg))
                if code == UNAVAILABLE:
                    retire(k)  # its server drains: the requests after this one would be refused too
            code = UNAVAILABLE  # the server ended the stream with requests unanswered
            message = None  # no one's words: the stream's status was OK
        except grpc.aio.AioRpcError as exc:
            code = exc.code().value[0]
            message = exc.details() or ""
        except asyncio.CancelledError:
            return
        except Exception as exc:
            # Anything else (an answer that does not parse) ends this reader: its requests would
            # wait out their deadline unread. A client-side failure: UNKNOWN, and a new stream.
            code = UNKNOWN
            message = f"{type(exc).__name__}: {exc}"  # as the unary sender's own failures
            call.cancel()
        drop(k)
        for i in [i for i, s in pending.items() if s == k]:
            settle(i, code, message)

    for slot in range(len(opened_at)):
        open_stream(slot)
    sending_done = False
    if len(channels) > 1:
        rejoin_timer = loop.call_later(REJOIN_AFTER_S / 4, rejoin)
    sleeper = PreciseSleeper(loop)
    to_perf = time.perf_counter() - time.monotonic()  # 0 on Linux: both read CLOCK_MONOTONIC
    # Made here, on the loop's thread, which send_all sends from (the writers only pass the bytes on).
    host_share = SendHostShare()

    async def send_all() -> None:
        nonlocal sending_done
        for i in range(n):
            await sleeper.until(start + share.times[i] + to_perf)
            sent[i] = time.monotonic() - start
            host_lag[i] = host_share(share.times[i], sent[i])
            if dead:
                reopen_due()
            k = pick(i)
            if k is None:
                done[i], codes[i] = sent[i], UNAVAILABLE
                continue
            pending[i] = k
            samples.extend((sent[i], len(pending)))
            expiry.append(i)
            arm()
            outbox[k].append((i, pool[share.which[i]] + suffix + id_field(i)))
            wake[k].set()
        sending_done = True
        if pending:
            # Every request is settled by its deadline (the timer); the wait's own limit is a guard.
            last = np.nanmax(sent) if n else 0.0
            wait = start + last + timeout_s + 1.0 - time.monotonic()
            try:
                await asyncio.wait_for(finished.wait(), max(wait, 0.0))
            except asyncio.TimeoutError:
                pass

    try:
        if stop is None:
            await send_all()
        elif await until_stopped(send_all(), stop):
            # Cut: requests in flight have no answer (`done` NaN), as for the unary calls cancelled.
            if pending:
                samples.extend((time.monotonic() - start, 0))
            for i in pending:
                codes[i] = CANCELLED
            pending.clear()
        if pending:
            samples.extend((time.monotonic() - start, 0))  # given up on: counted in flight until now
        for i in list(pending):
            done[i] = sent[i] + timeout_s
            codes[i] = DEADLINE_EXCEEDED
            del pending[i]
    finally:
        sleeper.close()
        host_share.close()
        if timer is not None:
            timer.cancel()
        if rejoin_timer is not None:
            rejoin_timer.cancel()
        for t in writers:  # the writers first: a stream is half-closed only between writes
            t.cancel()
        await asyncio.gather(*writers, return_exceptions=True)
        for k in list(live):  # a reader may drop one while we wait
            try:
                await calls[k].done_writing()
            except Exception:  # the stream is gone already
                pass
        for call in calls:
            call.cancel()
        for t in readers:
            t.cancel()
        await asyncio.gather(*readers, return_exceptions=True)
    inflight = np.array(samples, dtype=float).reshape(-1, 2)
    return Outcome(sent, done, codes, inflight, details=details, host_lag=host_lag)
