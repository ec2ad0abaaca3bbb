"""`wok bench ramp --rpc stream` over several servers: a slot moved off a server that went away goes
back to it once it is READY again, without losing or doubling a request, and not faster than
`stream_sender.REJOIN_AFTER_S` when it flaps."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from wok.bench import stream_sender
from wok.bench.workers import OK, Share
from wok.codec import encode_request
from wok.v2pb import grpc_service_pb2 as pb

MLP = encode_request("mlp", {"INPUT0": np.ones((1, 256), np.float32)}).SerializeToString()


class _Log:
    """What the sender did on each channel: streams opened, requests written, answers read."""

    def __init__(self, clock) -> None:
        self.clock = clock
        self.opened: list[tuple[float, int]] = []  # (time, channel)
        self.written: list[tuple[float, int, int]] = []  # (time, channel, request index)
        self.answers: list[tuple[float, int, int | None, int]] = []  # (time, channel, index, code)
        self.changed = asyncio.Event()

    def on(self, c: int) -> list[tuple[float, int, int | None, int]]:
        return [a for a in self.answers if a[1] == c]


class _Watched:
    def __init__(self, call, c: int, log: _Log) -> None:
        self.call, self.c, self.log = call, c, log

    def __getattr__(self, name):
        return getattr(self.call, name)

    async def write(self, msg: bytes) -> None:
        await self.call.write(msg)
        self.log.written.append((self.log.clock(), self.c, int(pb.ModelInferRequest.FromString(msg).id)))

    async def read(self):
        import grpc

        msg = await self.call.read()
        if msg is not grpc.aio.EOF:
            self.log.answers.append((self.log.clock(), self.c, *stream_sender.parse_answer(msg)))
            self.log.changed.set()
        return msg


class _WatchedChannel:
    def __init__(self, channel, c: int, log: _Log) -> None:
        self.channel, self.c, self.log = channel, c, log

    def get_state(self, try_to_connect: bool = False):
        return self.channel.get_state(try_to_connect)

    def stream_stream(self, *args, **kwargs):
        method = self.channel.stream_stream(*args, **kwargs)

        def open_stream(**kw):
            self.log.opened.append((self.log.clock(), self.c))
            return _Watched(method(**kw), self.c, self.log)

        return open_stream


def _answered(server) -> float:
    """How many inference requests `server` (a ServedInThread) has answered, from its /metrics."""
    import urllib.request

    with urllib.request.urlopen(server.http_url() + "/metrics", timeout=10) as r:
        lines = r.read().decode().splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith("wok_responses_total{"))


def _check_each_request_once(out, log: _Log) -> None:
    """No request written twice nor answered twice; each one settled OK had its OK answer read."""
    ids = [i for _, _, i in log.written]
    assert len(ids) == len(set(ids)), sorted(i for i in set(ids) if ids.count(i) > 1)
    answered = [i for _, _, i, _ in log.answers]
    assert len(answered) == len(set(answered)), sorted(i for i in set(answered) if answered.count(i) > 1)
    ok_read = {i for _, _, i, code in log.answers if code == OK}
    settled_ok = set(np.flatnonzero((out.codes == OK) & np.isfinite(out.done)).tolist())
    cut = set(np.flatnonzero(np.isnan(out.done)).tolist())  # in flight at the stop: read or not
    assert settled_ok <= ok_read and ok_read - settled_ok <= cut, (settled_ok - ok_read, ok_read - settled_ok - cut)


def test_a_slot_goes_back_to_its_server_once_it_is_back_up(serve_in_thread):
    """Two servers, a stream on each; server A is stopped (drained as on SIGTERM) and started again
    on its port. A's slot moved to B and stayed there for the rest of the step (every later request
    on B, A answering none); it goes back to A once A has been READY for REJOIN_AFTER_S, and the two
    servers share the load again."""
    import grpc

    from wok.clients.channel import channel_options, channel_target, open_channel

    # In this process, each on a loop of its own (conftest.ServedInThread): what is under test is
    # the sender's moves, not a server process; a stop drains A as SIGTERM does `wok serve`.
    with ThreadPoolExecutor(2) as ex:
        servers = list(ex.map(lambda _: serve_in_thread(models=("mlp",)), range(2)))
    a = servers[0]
    times = np.arange(0, 60.0, 0.01)  # longer than needed: the test stops it once A is back in use
    share = Share(time.monotonic() + 0.3, times, np.zeros(len(times), dtype=np.int64), 5.0)
    log = _Log(lambda: time.monotonic() - share.start_at)
    stop = threading.Event()

    async def until(condition, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not condition():
            log.changed.clear()
            try:
                await asyncio.wait_for(log.changed.wait(), max(0.0, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                return condition()
        return True

    async def scenario():
        loop = asyncio.get_running_loop()
        # The bench's stream channels, reconnecting sooner than its 1 s first backoff: A's restart
        # is seen within a few tenths of a second, the test does not wait out the backoff.
        options = channel_options(None, stream_retries=False)
        options += [
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 200),
            ("grpc.min_reconnect_backoff_ms", 1000),  # also a connection attempt's limit
        ]
        channels = [open_channel(grpc.aio, channel_target(s.target), None, options) for s in servers]
        try:
            for ch in channels:
                await ch.channel_ready()
            watched = [_WatchedChannel(ch, c, log) for c, ch in enumerate(channels)]
            sender = stream_sender.run_share_stream(watched, [MLP], share, streams=2, stop=stop)
            task = asyncio.ensure_future(sender)
            assert await until(lambda: log.on(0) and log.on(1), 10), "no answers from both servers"
            await loop.run_in_executor(None, a.stop)
            down = log.clock()
            restarted = await loop.run_in_executor(None, lambda: serve_in_thread(models=("mlp",), grpc_port=a.port))
            up = log.clock()
            # A's slot back on A: 30 answers from it (0.6 s of its half of 100 QPS).
            back = await until(lambda: len([t for t, *_ in log.on(0) if t > up]) >= 30, 15)
            stop.set()
            return await asyncio.wait_for(task, 20), restarted, down, up, back
        finally:
            stop.set()
            for ch in channels:
                await ch.close()

    out, restarted, down, up, back = asyncio.run(scenario())
    after_up = [t for t, *_ in log.on(0) if t > up]
    assert back, f"A answered {len(after_up)} requests in the {log.clock() - up:.1f} s after its restart"
    # Back after REJOIN_AFTER_S of A READY, not before. Measured from A's ready line, not from its
    # exit (its restart alone outlasts REJOIN_AFTER_S); half of it, as the channel may see A READY
    # a little before the line is read: a rejoin at once would come well inside that.
    assert after_up[0] - up >= stream_sender.REJOIN_AFTER_S / 2, (after_up[0], up)
    # The last 40 writes, after the rejoin: shared between the two servers as at the start.
    last = [c for _, c, _ in log.written[-40:]]
    assert 12 <= last.count(0) <= 28, last
    _check_each_request_once(out, log)
    codes = set(out.codes[np.isfinite(out.done)].tolist())
    assert codes <= {OK, stream_sender.UNAVAILABLE}, codes
    # Lost only at A's stop (those on the wire to it): none sent once A was back, the move included.
    late = np.isfinite(out.done) & (out.sent > up)
    assert set(out.codes[late].tolist()) == {OK}, np.unique(out.codes[late], return_counts=True)
    # The restarted server's own count: every answer read from it (and those cut at the stop).
    assert _answered(restarted) >= len(after_up)
    # Once A was back, one stream opened: A's slot's, on A (it had opened at the start, then on B
    # as A stopped). No back and forth.
    assert [c for t, c in log.opened if t > up] == [0], (log.opened, down, up)


class _FakeCall:
    """A stream that answers each request OK as it is written, and ends once half-closed."""

    def __init__(self, channel: _FakeChannel) -> None:
        self.channel = channel
        self.answers: asyncio.Queue = asyncio.Queue()

    async def write(self, msg: bytes) -> None:
        i = pb.ModelInferRequest.FromString(msg).id
        self.channel.written += 1
        self.answers.put_nowait(
            pb.ModelStreamInferResponse(infer_response=pb.ModelInferResponse(id=i)).SerializeToString()
        )

    async def read(self):
        import grpc

        msg = await self.answers.get()
        if msg is None:
            return grpc.aio.EOF
        return msg

    async def done_writing(self) -> None:
        self.answers.put_nowait(None)

    def cancel(self) -> None:
        self.answers.put_nowait(None)


class _FakeChannel:
    """A channel whose state is READY but for the given windows of the clock, when it fails."""

    def __init__(self, clock, failing: list[tuple[float, float]] = ()) -> None:
        self.clock, self.failing = clock, failing
        self.opened: list[float] = []
        self.written = 0

    def get_state(self, try_to_connect: bool = False):
        import grpc

        t = self.clock()
        if any(lo <= t < hi for lo, hi in self.failing):
            return grpc.ChannelConnectivity.TRANSIENT_FAILURE
        return grpc.ChannelConnectivity.READY

    def stream_stream(self, *args, **kwargs):
        def open_stream(**kw):
            self.opened.append(self.clock())
            return _FakeCall(self)

        return open_stream


def test_a_server_that_flaps_draws_its_slot_back_at_most_once_per_rejoin_after_s(monkeypatch):
    """Server A's channel fails for 0.15 s in every 0.3 s for 0.75 s, then stays READY. Its slot
    leaves at the first failure; each return to A comes REJOIN_AFTER_S at least after the slot's
    previous opening, and once A stays up the slot is back on it. Every request answered once."""
    rejoin = 0.4
    monkeypatch.setattr(stream_sender, "REJOIN_AFTER_S", rejoin, raising=False)
    times = np.arange(0, 2.5, 0.005)
    share = Share(time.monotonic() + 0.2, times, np.zeros(len(times), dtype=np.int64), 5.0)

    def clock() -> float:
        return time.monotonic() - share.start_at

    a = _FakeChannel(clock, [(0.5, 0.65), (0.8, 0.95), (1.1, 1.25)])
    b = _FakeChannel(clock)

    async def scenario():
        return await asyncio.wait_for(stream_sender.run_share_stream([a, b], [MLP], share, streams=2), 10)

    out = asyncio.run(scenario())
    assert set(out.codes.tolist()) == {OK} and np.all(np.isfinite(out.done)), np.unique(out.codes)
    assert a.written + b.written == len(times)  # none written twice
    # B never failed: its own slot's stream is the first on it; every later opening is A's slot's.
    assert len(b.opened) >= 2 and len(a.opened) >= 2, (a.opened, b.opened)
    moves = sorted([(t, "a") for t in a.opened[1:]] + [(t, "b") for t in b.opened[1:]])
    assert moves[0][1] == "b" and moves[0][0] >= 0.5, moves  # away at A's first failure
    # Back once A stayed up (after its last failure, plus REJOIN_AFTER_S as rejoin's looks saw it).
    assert moves[-1][1] == "a" and moves[-1][0] >= 1.1, moves
    for (before, _), (t, where) in itertools.pairwise(moves):
        if where == "a":
            assert t - before >= rejoin - 1e-3, moves
    assert len(moves) <= 2 * round(1.25 / rejoin) + 2, moves
