"""The asyncio client, over one `grpc.aio` channel.

A grpc.aio channel belongs to the event loop it is made in, so the channel is made on
first use (or in `__aenter__`) inside the running loop, never at construction. `infer`
is the load generator's hot path: encode, one awaited unary call, decode, nothing more.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import functools
import sys
from collections import deque
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Mapping, Sequence
from typing import Any

import grpc
import numpy as np

from wok.codec import encode_request
from wok.errors import quoted_name, shown_value
from wok.v2pb import grpc_service_pb2 as pb
from wok.v2pb.grpc_service_pb2_grpc import GRPCInferenceServiceStub

from .balancer import Balancer, BalancerSettings
from .channel import (
    TLS,
    auth_metadata,
    channel_authority,
    channel_credentials,
    channel_options,
    channel_target,
    close_ending_watches,
    looked_up_target,
    looks_up,
    loop_future,
    loop_state,
    names_looked_up,
    on_thread,
    open_channel,
    retrieved,
    shown_names,
)
from .errors import CLOSED_EARLY, Answers, InferError, SetupTimeout, read_answer
from .limits import RequestLimit, check_time_left, estimate, item_estimate, learn_from_error, lookup_timeout
from .messages import ModelInfo, StreamIds, StreamItem, StreamResult, output_names, stream_request, stream_result


class AsyncClient:
    """A KServe V2 client for asyncio; numpy arrays in and out.

    `target` is one gRPC target ("host:port", "dns:///name:port", ...) or several
    "host:port" servers, balanced round robin over one channel. `options` are extra
    gRPC channel options. `tls` makes the channel TLS (a `TLS`, or True for gRPC's bundled
    roots; a client certificate in it is presented for mTLS); `token` is sent on every call
    as `authorization: Bearer <token>`. `retries` (on by default): calls that end with
    UNAVAILABLE are sent again, with backoff and a retry budget, to any healthy server;
    no other status is retried (see `wok.clients.channel` for the policy, the health
    checking and the keepalive settings). `balancer="wok"` balances with
    `wok.clients.balancer` instead of gRPC's round_robin: a channel per replica, the least
    loaded of two, hedging, retries on another replica, outlier ejection (`balancer_settings`
    tunes it; `retries=False` means one attempt); streams then go to one replica picked the
    same way, without hedging. Use as `async with AsyncClient(...) as client:` or call
    `close()`; a closed client cannot be used again. All calls must come from the loop
    that made the first one (its channel, or the balancer, belongs to that loop): a call from another loop, or
    a close() from another while that one is open, raises RuntimeError at once, naming that loop's state (closed,
    running on another thread, or open but not running). Only a client that holds nothing of a loop that has
    closed moves to the next loop (a first call that ran out of time waiting for the lookup, or the balancer's
    start, in one asyncio.run: the next run's calls wait for them again); close() from a later loop after its loop
    closed closes the channels and nothing else.

    Several targets naming hosts are looked up, and probed where a name has both address families
    (`wok.clients.channel.channel_target`), which blocks up to a quarter of a second: the client does
    that on a thread, and its first call (or `async with`) awaits it, so a lookup's error (a ValueError:
    a name that does not resolve, targets that need both families) comes from that call, not from the
    constructor. (Built outside a running loop too, as the sync Client: the constructor waited there
    past any call's timeout, up to the system resolver's own limit, for a DNS server that does not answer.)

    A call's `timeout` bounds all it waits for: that lookup, or the wok balancer's start (its lookups, each up
    to `BalancerSettings.resolve_timeout_s`), as well as the call itself. A first call out of time there raises
    InferError DEADLINE_EXCEEDED, as a late call does, its details naming what it waited for ("CLIENT: the
    lookup of 'name' did not end within the call's timeout of 0.5 s, ..."); wait_ready raises its TimeoutError.
    The lookup or the start goes on for the other calls, and for the next.

    Every failed call raises InferError. The metadata calls return the protocol's
    response messages (`wok.v2pb.grpc_service_pb2`) as they are, except `model_metadata`.
    `timeout` is always in seconds and becomes the gRPC deadline.
    """

    def __init__(
        self,
        target: str | Sequence[str],
        *,
        options: Sequence[tuple[str, Any]] | None = None,
        tls: TLS | bool | None = None,
        token: str | None = None,
        retries: bool = True,
        balancer: str = "grpc",
        balancer_settings: BalancerSettings | None = None,
    ) -> None:
        if balancer not in ("grpc", "wok"):
            shown = shown_value(balancer)
            raise ValueError(f"balancer: expected 'grpc' or 'wok'; got {shown}")
        self._targets = target
        self._target: str | Sequence[str] = target
        self._target_lookup: concurrent.futures.Future[str] | None = None
        self._target_wait: asyncio.Future[str] | None = None  # the lookup, as the calls of the loop await it
        if balancer == "grpc":
            if looks_up(target):
                # In a loop, the lookup and the probe would stall every task of the loop meanwhile; outside one,
                # the constructor, which no timeout bounds.
                self._target_lookup = on_thread("wok-channel-target", channel_target, target)
            else:
                self._target = channel_target(target)
        self._options = channel_options(options, retries=retries)
        self._credentials = channel_credentials(tls)
        self._answers = Answers(plaintext=self._credentials is None)
        self._metadata = auth_metadata(token)
        self._channel: grpc.aio.Channel | None = None
        self._stub: GRPCInferenceServiceStub | None = None
        self._closed = False
        self._watch: asyncio.Task | None = None  # wait_ready's, pending after its timeout
        self._balancer: Balancer | None = None
        if balancer == "wok":
            s = balancer_settings or BalancerSettings()
            if not retries:
                s = dataclasses.replace(s, max_attempts=1)
            # Kept: a start cancelled by its loop's end leaves a Balancer that cannot start again (_check_loop).
            self._new_balancer = functools.partial(
                Balancer, target, options=options, credentials=self._credentials, settings=s
            )
            self._balancer = self._new_balancer()
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop of the first call, the client's own
        self._balancer_start: asyncio.Future | None = None
        self._limit = RequestLimit()  # the server's request limit, looked up once (wok.clients.limits)
        self._lookup: asyncio.Future | None = None  # the look-up in progress, shared by its callers

    @property
    def target(self) -> str | Sequence[str]:
        """The gRPC target URI of the channel (`channel_target`); the targets as given with
        balancer="wok". The client looks several targets naming hosts up on a thread: until that
        lookup has ended this is the targets as given, and once it failed it raises its error, as the calls do.
        It never waits: read on the loop, a wait for the lookup stalled every task of the loop, up to the
        resolver's timeout, after close() too."""
        return looked_up_target(self._target_lookup, self._target, self._targets)

    @property
    def balancer(self) -> Balancer | None:
        """The wok balancer (its `stats()`, its replicas) while the client is open; None with "grpc"."""
        return None if self._closed else self._balancer

    def _check_loop(self) -> None:
        """Make the running loop the client's at its first call; RuntimeError for a call from another loop,
        unless the client's has closed holding nothing of it. grpc.aio refused a channel's call from another
        loop with its own error ("Event loop is closed", "... attached to a different loop"), and a call waiting
        for another loop's lookup or balancer start waited on that loop's future: past its timeout, or for good,
        when that loop did not run, and a bare CancelledError once that loop's end had cancelled the start."""
        loop = asyncio.get_running_loop()
        home = self._loop
        if home is loop:
            return
        if home is not None and not (home.is_closed() and self._holds_nothing()):
            raise self._elsewhere(home)
        self._loop = loop
        if home is None:
            return
        # The closed loop's waits, pending for good: this loop's calls make their own.
        self._target_wait = None
        if self._lookup is not None and not self._lookup.done():
            self._lookup = None
        start = self._balancer_start
        if start is not None and (not start.done() or start.cancelled()):
            # Cancelled by asyncio.run's end (which stopped the balancer), or left pending by a loop closed without
            # it: that Balancer was started, and a Balancer starts once.
            self._balancer, self._balancer_start = self._new_balancer(), None

    def _elsewhere(self, home: asyncio.AbstractEventLoop) -> RuntimeError:
        given = self._targets
        shown = quoted_name(given if isinstance(given, str) else ",".join(given))
        return RuntimeError(
            f"targets {shown}: the AsyncClient was called on a loop other than the one its first call ran on, which "
            f"{loop_state(home)}; its channel, or its balancer, belongs to that loop: call it "
            "there, or make an AsyncClient per loop"
        )

    def _holds_nothing(self) -> bool:
        """Whether nothing of the client belongs to its loop: no channel, no balancer started (a start that failed
        holds nothing either: its error is every call's, on any loop)."""
        if self._balancer is None:
            return self._channel is None
        start = self._balancer_start
        return start is None or not start.done() or start.cancelled() or start.exception() is not None

    def _waited_for(self) -> str:
        """What a first call waits for, as its timeout's error names it."""
        if self._balancer is None:
            return f"the lookup of {shown_names(names_looked_up(self._targets))}"
        names = self._balancer.names
        return "the balancer's start" + (f" (the lookup of {shown_names(names)})" if names else "")

    def _connect(self) -> GRPCInferenceServiceStub:
        if self._closed:
            raise RuntimeError("this AsyncClient is closed")
        # Outside a running loop grpc.aio would bind the channel to a loop nobody runs.
        asyncio.get_running_loop()
        self._channel = open_channel(
            grpc.aio, self.target, self._credentials, self._options, channel_authority(self._targets)
        )
        self._stub = GRPCInferenceServiceStub(self._channel)
        return self._stub

    async def _first_connect(self, timeout: float | None) -> float | None:
        """Make the channel once the target's lookup (if it runs on a thread) is done, waiting for it at
        most `timeout` (`_within`); what is left of `timeout`. The lookup's error is raised to every call."""
        lookup = self._target_lookup
        if lookup is not None:
            if self._target_wait is None:
                # One future for every call: a future of each call's own, left pending past its caller's
                # timeout, had the lookup's error logged as never retrieved. One per loop: a client made outside
                # a loop whose first call ran out of time in one asyncio.run waited in the next on the first
                # loop's future, which that loop, ended, never completed (`_check_loop` drops it).
                self._target_wait = loop_future(lookup)
                self._target_wait.add_done_callback(retrieved)
            wait = self._target_wait
            timeout = await _within(wait, timeout, self._waited_for)
            # Closed while the lookup ran (close() cancels the wait, not the thread): as a call in flight at
            # close() ends, its result or error dropped.
            if self._closed:
                raise InferError(grpc.StatusCode.CANCELLED, CLOSED_EARLY)
            self._target = wait.result()
            self._target_lookup = None
        # Concurrent first calls all waited for the lookup: the first to get here makes the channel.
        if self._stub is None:
            self._connect()
        return timeout

    async def _setup(self, timeout: float | None = None) -> float | None:
        """Make the channel, or start the balancer once (concurrent first calls wait for the one lookup or
        start), waiting at most `timeout` (SetupTimeout past it; it goes on for the others); what is left of
        `timeout`, all of it when nothing was waited for."""
        if self._closed:
            raise RuntimeError("this AsyncClient is closed")
        self._check_loop()
        if self._balancer is None:
            return timeout if self._stub is not None else await self._first_connect(timeout)
        if self._balancer_start is None:
            self._balancer_start = asyncio.ensure_future(self._balancer.start())
            # Its error is every caller's; read here too, should each caller's timeout run out before it.
            self._balancer_start.add_done_callback(retrieved)
        start = self._balancer_start
        # Not `await shield(start)`: close() cancels the start, and its cancellation reached every call
        # waiting for it as a CancelledError of the caller's own (its task ended cancelled). wait() raises
        # only the caller's cancellation; a close() then ends the calls as the grpc path's lookup does.
        timeout = await _within(start, timeout, self._waited_for)
        if self._closed:
            raise InferError(grpc.StatusCode.CANCELLED, CLOSED_EARLY)
        start.result()  # its error (a name that does not resolve) to every call
        return timeout

    async def _open(self, timeout: float | None = None, unsent: str = "the request was not sent") -> float | None:
        """`_setup` for a call: out of time, InferError DEADLINE_EXCEEDED, as a late call gets, naming what it
        waited for and the call's timeout, then `unsent`."""
        try:
            return await self._setup(timeout)
        except SetupTimeout as exc:
            raise exc.call_error(timeout, unsent) from None

    async def __aenter__(self) -> AsyncClient:
        await self._setup()
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the channel; calls still in flight, and those waiting for the first lookup or the balancer's
        start, end with CANCELLED (InferError). From a loop other than the client's (`_check_loop`): RuntimeError
        while that loop is open; once it has closed, the channels are closed, and nothing else: what else the client
        had there (the waits of its calls, a `wait_ready`'s watch) went with it."""
        home = self._loop
        if home is not None and home is not asyncio.get_running_loop() and not self._closed:
            if not home.is_closed():
                raise self._elsewhere(home)
            self._closed = True
            channel, self._channel, self._stub = self._channel, None, None
            if channel is not None:
                await channel.close()
            if self._balancer is not None:
                await self._balancer.stop()
            return
        self._closed = True
        if self._target_wait is not None:
            # Its calls waited for the lookup's thread, which nothing can stop: until the resolver answered (or
            # gave up on a DNS server that does not), or to their own timeout. Cancelled, the wait wakes them now,
            # and the thread's result is dropped when it comes (`loop_future`), on a closed loop too.
            self._target_wait.cancel()
        channel, self._channel, self._stub = self._channel, None, None
        if channel is not None:
            await close_ending_watches([channel], [self._watch] if self._watch is not None else [])
        if self._balancer is not None:
            if self._balancer_start is not None and not self._balancer_start.done():
                self._balancer_start.cancel()
                await asyncio.gather(self._balancer_start, return_exceptions=True)
            await self._balancer.stop()

    async def wait_ready(self, timeout: float | None = None) -> None:
        """Wait until the channel is connected (to at least one server); TimeoutError if not in time, the
        client's first lookup or balancer start included (it goes on, for the calls)."""
        starting = self._balancer is not None and (self._balancer_start is None or not self._balancer_start.done())
        try:
            left = await self._setup(timeout)
        except SetupTimeout as exc:
            raise exc.ready_error(self._targets, timeout) from None
        if self._balancer is not None:
            # The balancer's TimeoutError quoted what was left of `timeout` once its start had taken the rest.
            took = None if left is None or not starting else timeout - left
            within = None if took is None else f"{timeout} s, of which {self._waited_for()} took {took:.3f} s"
            await self._balancer.wait_ready(left, within=within)
            return
        # Not channel_ready() under wait_for: that cancels its connectivity watch at the timeout,
        # leaving it in gRPC's core (close_ending_watches); a watch left pending here ends at close().
        channel, loop = self._channel, asyncio.get_running_loop()
        deadline = None if left is None else loop.time() + left
        state = channel.get_state(try_to_connect=True)
        while state is not grpc.ChannelConnectivity.READY:
            # One watch at a time: one still pending (an earlier wait_ready's, timed out) is on
            # this state, as the state has not changed since it began.
            if self._watch is None or self._watch.done():
                self._watch = loop.create_task(channel.wait_for_state_change(state))
            watch = self._watch
            await asyncio.wait([watch], timeout=None if deadline is None else max(0.0, deadline - loop.time()))
            if not watch.done():
                raise TimeoutError(f"{quoted_name(self.target)}: not connected within {timeout} s")
            if watch.cancelled():  # by close(), as its last resort: the channel is closed
                raise grpc.aio.UsageError("Channel is closed.")
            watch.result()
            state = channel.get_state(try_to_connect=True)

    async def _unary(self, method: str, request, timeout: float | None):
        if self._balancer is None:
            if self._stub is None or self._loop is not asyncio.get_running_loop():
                timeout = await self._open(timeout)  # (another loop's call: `_check_loop` refuses it)
            call = getattr(self._stub, method)
        else:
            timeout = await self._open(timeout)
            call = self._balancer.unary_unary(
                f"/inference.GRPCInferenceService/{method}",
                request_serializer=_serialize,
                response_deserializer=getattr(pb, f"{method}Response").FromString,
            )
        sent = self._answers.sent()
        try:
            response = await call(request, timeout=timeout, metadata=self._metadata)
        except grpc.RpcError as exc:
            raise self._answers.error(exc) from None
        self._answers.ok(sent)
        return response

    async def _look_up_limit(self, timeout: float | None) -> float | None:
        """Learn the server's request limit (wok.clients.limits) unless a look-up does it already;
        wait for it at most `timeout`, and return what is left of `timeout` (None: no deadline), the
        deadline of the call that needed it: else a call waited up to twice its timeout."""
        own = self._lookup is None or self._lookup.done()
        if own:
            self._lookup = asyncio.ensure_future(self._read_limit(lookup_timeout(timeout)))
        lookup = self._lookup
        if timeout is None:
            await asyncio.shield(lookup)
            return None
        loop = asyncio.get_running_loop()
        start = loop.time()
        # Not wait_for: another call's look-up (with its own deadline) goes on for that call.
        await asyncio.wait([lookup], timeout=timeout)
        # Its error (the client closed), as awaiting it gave; out of time on this call's own deadline
        # (gRPC's timer may fire a little early), nothing is left of it.
        if lookup.done() and lookup.result() and own:
            return 0.0
        return max(0.0, timeout - (loop.time() - start))

    async def _read_limit(self, timeout: float) -> bool:
        """The look-up itself, the client's setup it waits for included, within `timeout`; whether it ran out of
        time (DEADLINE_EXCEEDED, or the setup still going)."""
        release = None
        try:
            # Its callers `_open` first, which raises the setup's errors as theirs, so the setup is done here and
            # this is the closed client's RuntimeError. Bounded all the same: a caller that did not, unbounded, left
            # this task waiting for a hung lookup past every caller's timeout, and its own ServerMetadata deadline
            # began only after that.
            try:
                timeout = await self._setup(timeout)
            except SetupTimeout:
                return True
            if self._balancer is None:
                stub = self._stub
            else:  # the balancer's calls give no metadata: one replica's channel, as a stream takes
                channel, release = self._balancer.stream_channel()
                stub = GRPCInferenceServiceStub(channel)
            call = stub.ServerMetadata(pb.ServerMetadataRequest(), timeout=timeout, metadata=self._metadata)
            await call
            self._limit.learn(await call.trailing_metadata())
        except grpc.RpcError as exc:  # the request goes out as before; its own call reports the failure
            learn_from_error(self._limit, exc)
            return exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        finally:
            call = None  # not kept by a traceback: it holds its channel open (close_ending_watches)
            if release is not None:
                release()
        return False

    # -- health and metadata ---------------------------------------------------------------
    async def server_live(self, *, timeout: float | None = None) -> bool:
        return (await self._unary("ServerLive", pb.ServerLiveRequest(), timeout)).live

    async def server_ready(self, *, timeout: float | None = None) -> bool:
        return (await self._unary("ServerReady", pb.ServerReadyRequest(), timeout)).ready

    async def model_ready(self, name: str, *, timeout: float | None = None) -> bool:
        return (await self._unary("ModelReady", pb.ModelReadyRequest(name=name), timeout)).ready

    async def server_metadata(self, *, timeout: float | None = None) -> pb.ServerMetadataResponse:
        return await self._unary("ServerMetadata", pb.ServerMetadataRequest(), timeout)

    async def request_limit(self, *, timeout: float | None = None) -> tuple[int, int] | None:
        """The server's published request limit in bytes, (its --max-request-bytes, its gRPC receive
        limit), looked up once (wok.clients.limits); None when it publishes none (not a wok server, an
        older one) or the look-up (ServerMetadata) failed, as a request then goes out unchecked. The client's
        setup it waits for first (its first lookup, the wok balancer's start) fails as any call's does: a
        name's error, InferError DEADLINE_EXCEEDED past `timeout` naming what it waited for, CANCELLED at close()."""
        # The setup first, with the calls' errors: a look-up left waiting for it gave None, as a failed one.
        await self._look_up_limit(await self._open(timeout, "the server's request limit was not looked up"))
        return self._limit.published()

    async def model_metadata(self, name: str, *, timeout: float | None = None) -> ModelInfo:
        """The model's inputs and outputs: names, datatypes, shapes (batch first, -1 = any)."""
        return ModelInfo.from_proto(await self._unary("ModelMetadata", pb.ModelMetadataRequest(name=name), timeout))

    async def model_config(self, name: str, *, timeout: float | None = None) -> pb.ModelConfigResponse:
        return await self._unary("ModelConfig", pb.ModelConfigRequest(name=name), timeout)

    async def model_statistics(self, name: str = "", *, timeout: float | None = None) -> pb.ModelStatisticsResponse:
        """Statistics of model `name`, or of every model when `name` is empty."""
        return await self._unary("ModelStatistics", pb.ModelStatisticsRequest(name=name), timeout)

    async def repository_index(
        self, *, ready: bool = False, timeout: float | None = None
    ) -> pb.RepositoryIndexResponse:
        """The server's models, each with its state ("READY", or "UNAVAILABLE" with the reason: a
        failed batcher, a lost GPU); with `ready`, those ready for inferencing only (V2's `ready` flag). A wok server
        starting or draining answers UNAVAILABLE instead, as Triton does (InferError)."""
        return await self._unary("RepositoryIndex", pb.RepositoryIndexRequest(ready=ready), timeout)

    # -- inference ---------------------------------------------------------------------------
    async def infer(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray],
        *,
        outputs: Iterable[str] | None = None,
        timeout: float | None = None,
        request_id: str = "",
        server_timeout_us: int | None = None,
        datatypes: Mapping[str, str] | None = None,
    ) -> dict[str, np.ndarray]:
        """Run one request; returns every output, or only those named in `outputs`.

        The V2 datatype of each input follows its numpy dtype, or `datatypes` names it:
        BF16 travels as uint16 words, which would otherwise go as UINT16. `server_timeout_us`
        is the V2 `timeout` parameter: how long the server may queue the request. The returned
        arrays are read-only views of the response; copy one to change it.

        An answer the client cannot read (from a server other than wok: a raw entry of the wrong
        size, an unknown datatype, a negative dim, an output twice) raises ValueError naming the
        request id, the model, the output, what was expected and what was got.

        A request over a wok server's gRPC limit (4 × --max-request-bytes + 1 MiB, looked up once,
        with ServerMetadata, before the first request that could be over it) is not sent:
        InferError RESOURCE_EXHAUSTED, its details ("CLIENT: ...") naming its size, the limit and the
        server's --max-request-bytes (wok.clients.limits).
        """
        est = estimate(inputs)
        request = encode_request(model, inputs, output_names(outputs), request_id, server_timeout_us, datatypes)
        if self._limit.needs_lookup(est):
            # The setup first, out of time with its own error: the look-up's would blame ServerMetadata.
            left = await self._look_up_limit(await self._open(timeout))
            check_time_left(left, timeout)
            timeout = left
        self._limit.check(request, est)
        return read_answer(await self._unary("ModelInfer", request, timeout), request.model_name, request.id)

    async def stream_infer(
        self,
        requests: AsyncIterable[StreamItem] | Iterable[StreamItem],
        *,
        timeout: float | None = None,
    ) -> AsyncIterator[StreamResult]:
        """Send `requests` on one ModelStreamInfer stream; yield results as they arrive.

        An item is `(model, inputs)` or a mapping with `model`, `inputs` and optionally
        `outputs`, `request_id`, `server_timeout_us`, `datatypes` (as `infer` takes them); an
        item of another shape is malformed (TypeError). An item without a request id gets
        its position in the stream ("0", "1", ...); so that no two answers share an id by the
        client's doing, a stream that has such items refuses (ValueError, also a malformed item)
        a caller's request_id of that form (a decimal number) other than its own item's position.
        A request the server rejects comes back as a StreamResult with `error` and `code`
        set, and the stream goes on; so does a request over a wok server's gRPC limit, which the
        client does not send (code RESOURCE_EXHAUSTED, as `infer` refuses it): gRPC would refuse it
        unread and end the whole stream; and so does one whose answer the client cannot read (code
        INTERNAL, `error` naming the request, the model and the flaw, as `infer`'s ValueError does).
        If `requests` raises (or holds a malformed item), a CancelledError of its own included,
        nothing more is sent, the results of what was sent still come, and then that exception is
        raised (a SystemExit or KeyboardInterrupt leaves at once: asyncio takes it out of the loop).
        A failure of the stream itself (deadline `timeout` for the whole stream, server gone, the client closed under
        it: CANCELLED) raises InferError.
        Leaving early cancels the stream once the generator is closed: wrap it in
        `contextlib.aclosing` to close it at once.
        """
        release = None
        sent = self._answers.sent()
        loop = asyncio.get_running_loop()
        if self._stub is None or self._balancer is not None or self._loop is not loop:
            timeout = await self._open(timeout, "the stream was not opened")
        if self._balancer is None:
            stub = self._stub
        else:
            try:  # no replica left to send to: an InferError, as every failed call
                channel, release = self._balancer.stream_channel()
            except grpc.RpcError as exc:
                raise self._answers.error(exc) from None
            stub = GRPCInferenceServiceStub(channel)
        # Results of the requests the client refused (over the server's limit), not sent: yielded
        # as they come, between the server's answers; `wake` is set as one comes.
        refused: deque[StreamResult] = deque()
        wake = [loop.create_future()]

        async def check(request: pb.ModelInferRequest, est: int) -> bool:
            """Whether `request` goes out; if not, its result is queued."""
            if self._limit.needs_lookup(est):
                await self._look_up_limit(timeout)
            result = self._limit.stream_refusal(request, est)
            if result is None:
                return True
            refused.append(result)
            if not wake[0].done():
                wake[0].set_result(None)
            return False

        read = None
        flight = _Flight()
        try:
            call = stub.ModelStreamInfer(timeout=timeout, metadata=self._metadata)
            writer = asyncio.ensure_future(_write_requests(call, requests, check, flight))
            try:
                while True:
                    if refused:
                        yield refused.popleft()
                        continue
                    # A request written and not answered yet, or the requests over (half-closed):
                    # an answer or the stream's end is coming, so the read needs no task of its own,
                    # and a refusal meanwhile waits for it at most. Otherwise (the writer waits on the
                    # caller's requests: a caller that waits for each result, or the stream's start)
                    # a refusal may be all that comes: the read runs as a task, raced with `wake`.
                    direct = read is None and (flight.written > flight.answered or writer.done())
                    if not direct:
                        if read is None:
                            read = asyncio.ensure_future(call.read())
                        if not read.done():
                            await asyncio.wait((read, wake[0]), return_when=asyncio.FIRST_COMPLETED)
                            if not read.done():  # a refusal came first
                                wake[0] = loop.create_future()
                                continue
                    try:
                        if direct:
                            response = await call.read()
                        else:
                            response, read = read.result(), None
                    except grpc.RpcError as exc:
                        raise self._answers.error(exc) from None
                    except asyncio.CancelledError:
                        # grpc cancels the call when the reading task is cancelled too, so the
                        # call's state cannot tell them apart: only a client closed under the
                        # stream (and, where Python counts them, no cancel of this task) makes
                        # it a failure of the stream, as documented; anything else is the caller's.
                        if not self._closed or (_COUNTS_CANCELS and asyncio.current_task().cancelling()):
                            raise
                        raise InferError(grpc.StatusCode.CANCELLED, "the client was closed under the stream") from None
                    self._answers.ok(sent)  # a response, or EOF: the stream ended OK
                    flight.answered += 1
                    if response is grpc.aio.EOF:
                        # The writer refused what it refused before its half-close, and so before this.
                        while refused:
                            yield refused.popleft()
                        break
                    yield stream_result(response)
                # The server ends the stream only after the writer half-closed it.
                error = await writer
            finally:
                call.cancel()
                writer.cancel()
                if read is not None:
                    read.cancel()
                    read.add_done_callback(retrieved)
                # An error raised from here keeps this frame in its traceback: not the call with
                # it, which holds its channel open in gRPC's core past close() (close_ending_watches).
                call = writer = read = None
        finally:
            if release is not None:
                release()
        if error is not None:
            raise error


async def _within(setup: asyncio.Future, timeout: float | None, waited_for) -> float | None:
    """Wait for `setup` at most `timeout` s, without cancelling it: other calls wait for it too, and one
    caller's short timeout must not end it for them. What is left of `timeout`, all of it when `setup` is
    done; SetupTimeout naming `waited_for()` when it is not done in time."""
    if setup.done():
        return timeout
    if timeout is None:
        await asyncio.wait([setup])
        return None
    loop = asyncio.get_running_loop()
    start = loop.time()
    await asyncio.wait([setup], timeout=max(0.0, timeout))
    if not setup.done():
        raise SetupTimeout(waited_for())
    return max(0.0, timeout - (loop.time() - start))


def _serialize(message) -> bytes:
    return message.SerializeToString()


class _Flight:
    """A stream's requests written (by its writer) and answers read (by stream_infer)."""

    __slots__ = ("answered", "written")

    def __init__(self) -> None:
        self.written = self.answered = 0


async def _write_requests(call, requests, check, flight: _Flight) -> BaseException | None:
    """Write every request that `await check(request, estimate)` lets go, counting it in
    `flight.written`, then half-close; returns the error that stopped the caller's requests early.
    A failure of the call itself is left to the reader to report."""
    error = None
    ids = StreamIds()
    try:
        async for index, item in _enumerate(requests):
            request = stream_request(item, index, ids)
            if not await check(request, item_estimate(item)):
                continue
            flight.written += 1  # before the write: an answer is due once it may be on its way
            try:
                await call.write(request)
            except (grpc.RpcError, asyncio.InvalidStateError):
                return None
    except asyncio.CancelledError as exc:
        if _cancelled(call):
            raise
        error = exc  # the caller's iterator raised it: the caller's to get, after the results
    except Exception as exc:
        error = exc
    finally:
        # Whatever ended the requests: without the half-close the server waits for more and
        # the stream ends only at its deadline, if it has one.
        try:
            await call.done_writing()
        except (grpc.RpcError, asyncio.InvalidStateError):
            pass
    return error


_COUNTS_CANCELS = sys.version_info >= (3, 11)  # Task.cancelling()


def _cancelled(call) -> bool:
    """Whether this writer task was cancelled (by stream_infer, or at the loop's shutdown), as
    opposed to the caller's iterator raising CancelledError of its own."""
    if _COUNTS_CANCELS:
        return asyncio.current_task().cancelling() > 0
    # 3.10 keeps no count; stream_infer cancels the call before it cancels the writer.
    return call.done()


async def _enumerate(items: AsyncIterable | Iterable) -> AsyncIterator[tuple[int, Any]]:
    index = 0
    if isinstance(items, AsyncIterable):
        async for item in items:
            yield index, item
            index += 1
    else:
        for item in items:
            yield index, item
            index += 1
