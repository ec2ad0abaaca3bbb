"""The blocking client, over a plain `grpc` channel; no event loop anywhere.

The channel is thread-safe, so one Client can serve many threads.
"""

from __future__ import annotations

import concurrent.futures
import queue
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import grpc
import numpy as np

from wok.codec import encode_request
from wok.errors import quoted_name
from wok.v2pb import grpc_service_pb2 as pb
from wok.v2pb.grpc_service_pb2_grpc import GRPCInferenceServiceStub

from .channel import (
    TLS,
    auth_metadata,
    channel_authority,
    channel_credentials,
    channel_options,
    channel_target,
    looked_up_target,
    looks_up,
    names_looked_up,
    on_thread,
    open_channel,
    shown_names,
)
from .errors import CLOSED_EARLY, Answers, InferError, SetupTimeout, read_answer
from .limits import RequestLimit, check_time_left, estimate, item_estimate, learn_from_error, lookup_timeout
from .messages import ModelInfo, StreamIds, StreamItem, StreamResult, output_names, stream_request, stream_result


class Client:
    """A blocking KServe V2 client; the same calls as AsyncClient, without `await`.

    `target`, `options`, `tls`, `token` and `retries` are as for AsyncClient. Use as `with Client(...) as client:`
    or call `close()`. Every failed call raises InferError; the metadata calls return the
    protocol's response messages as they are, except `model_metadata`.

    Several targets naming hosts are looked up (and probed, `channel_target`) on a thread, as an AsyncClient made
    in a running loop does: the constructor returns at once, and each call waits for that lookup at most its
    `timeout` (then InferError DEADLINE_EXCEEDED naming the lookup; wait_ready its TimeoutError), and raises the
    lookup's error (a name that does not resolve: ValueError). close() ends the calls waiting for it, with
    InferError CANCELLED (wait_ready: RuntimeError). (Not in the constructor: it waited there past any timeout,
    up to the system resolver's own limit, 30 s with resolv.conf's defaults, for a DNS server that does not answer.)
    """

    def __init__(
        self,
        target: str | Sequence[str],
        *,
        options: Sequence[tuple[str, Any]] | None = None,
        tls: TLS | bool | None = None,
        token: str | None = None,
        retries: bool = True,
    ) -> None:
        self._targets = target
        looked_up = looks_up(target)  # (a malformed list's ValueError, here, with no lookup)
        self._metadata = auth_metadata(token)
        self._credentials = channel_credentials(tls)
        self._options = channel_options(options, retries=retries)
        self._answers = Answers(plaintext=self._credentials is None)
        self._closed = False
        self._channel: grpc.Channel | None = None
        self._stub: GRPCInferenceServiceStub | None = None
        self._target: str | None = None
        self._target_lookup: concurrent.futures.Future[str] | None = None
        # Set once the calls need not wait for the lookup: it has ended, or close() came. (With no lookup, the
        # channel is opened here, and _setup returns before it would wait.)
        self._settled = threading.Event()
        if looked_up:
            self._target_lookup = on_thread("wok-channel-target", channel_target, target)
            self._target_lookup.add_done_callback(lambda _: self._settled.set())
        else:
            self._target = channel_target(target)
            self._open_channel()
        # wait_ready's pending futures: close() cancels them, else a wait without a timeout never ended.
        self._waits: set[grpc.Future] = set()
        self._lock = threading.Lock()
        self._limit = RequestLimit()  # the server's request limit, looked up once (wok.clients.limits)
        self._lookup_lock = threading.Lock()  # one look-up at a time; those waiting for it find it done
        self._lookups_ended = 0  # look-ups ended, whatever their outcome (under _lookup_lock)

    @property
    def target(self) -> str | Sequence[str]:
        """The gRPC target URI of the channel (`channel_target`). While the lookup of several targets' names runs,
        the targets as given; once it has failed, its error, as the calls raise it. It never waits."""
        return looked_up_target(self._target_lookup, self._target, self._targets)

    def _open_channel(self) -> None:
        self._channel = open_channel(
            grpc, self.target, self._credentials, self._options, channel_authority(self._targets)
        )
        self._stub = GRPCInferenceServiceStub(self._channel)

    def _setup(self, timeout: float | None) -> float | None:
        """Wait at most `timeout` for the targets' lookup, if it runs, and open the channel once it has ended; what
        is left of `timeout`. SetupTimeout past it, the lookup's error (every caller's), InferError CANCELLED for
        a close() that came meanwhile, RuntimeError once closed."""
        if self._stub is not None:
            return timeout
        if self._closed:
            raise RuntimeError("this Client is closed")
        start = time.monotonic()
        if not self._settled.wait(timeout):
            raise SetupTimeout(f"the lookup of {shown_names(names_looked_up(self._targets))}")
        with self._lock:
            if self._closed:
                # The lookup's thread cannot be stopped: as a call in flight at close() ends, its result dropped.
                raise InferError(grpc.StatusCode.CANCELLED, CLOSED_EARLY)
            if self._stub is None:  # the first to get here opens the channel; the lookup's error is everyone's
                self._open_channel()
        return None if timeout is None else max(0.0, timeout - (time.monotonic() - start))

    def _open(self, timeout: float | None, unsent: str = "the request was not sent") -> float | None:
        """`_setup` for a call: out of time, InferError DEADLINE_EXCEEDED, as a late call gets, naming what it
        waited for and the call's timeout, then `unsent`."""
        try:
            return self._setup(timeout)
        except SetupTimeout as exc:
            raise exc.call_error(timeout, unsent) from None

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        """Close the channel; calls still in flight end with CANCELLED, later ones raise RuntimeError."""
        with self._lock:
            self._closed = True
            waits, self._waits = self._waits, set()
            channel = self._channel
        self._settled.set()  # the calls waiting for the lookup end (`_setup`)
        for ready in waits:
            ready.cancel()
        if channel is not None:
            _await_poller_end(channel)
            channel.close()

    def _closed_error(self, exc: ValueError) -> Exception:
        # grpc's own words for a call on a closed channel are a ValueError; AsyncClient says this.
        return RuntimeError("this Client is closed") if self._closed else exc

    def wait_ready(self, timeout: float | None = None) -> None:
        """Wait until the channel is connected (to at least one server); TimeoutError if not in time, the targets'
        lookup included (it goes on, for the calls), RuntimeError if the client is closed (before, or while it
        waits)."""
        try:
            timeout_left = self._setup(timeout)
        except SetupTimeout as exc:
            raise exc.ready_error(self._targets, timeout) from None
        except InferError:  # CANCELLED: closed while it waited for the lookup
            raise RuntimeError("this Client is closed") from None
        with self._lock:
            # On a closed channel grpc's watch thread dies of a ValueError, and the wait never ends.
            if self._closed:
                raise RuntimeError("this Client is closed")
            ready = grpc.channel_ready_future(self._channel)
            self._waits.add(ready)
        try:
            ready.result(timeout=timeout_left)
        except grpc.FutureTimeoutError:
            # Left running, it would stay subscribed to the channel's state until it connects.
            ready.cancel()
            raise TimeoutError(f"{quoted_name(self.target)}: not connected within {timeout} s") from None
        except grpc.FutureCancelledError:
            raise RuntimeError("this Client is closed") from None
        finally:
            with self._lock:
                self._waits.discard(ready)

    def _unary(self, method: str, request, timeout: float | None):
        timeout = self._open(timeout)
        sent = self._answers.sent()
        try:
            response = getattr(self._stub, method)(request, timeout=timeout, metadata=self._metadata)
        except grpc.RpcError as exc:
            raise self._answers.error(exc) from None
        except ValueError as exc:
            raise self._closed_error(exc) from None
        self._answers.ok(sent)
        return response

    def _look_up_limit(self, timeout: float | None) -> float | None:
        """Learn the server's request limit (wok.clients.limits) unless another thread just did; wait
        for it at most `timeout`, and return what is left of `timeout` (None: no deadline), the
        deadline of the call that needed it: else a call waited up to twice its timeout. A thread
        that waited for another's look-up takes its outcome, as AsyncClient's callers share one."""
        start = time.monotonic()

        def left() -> float | None:
            return None if timeout is None else max(0.0, timeout - (time.monotonic() - start))

        ended = self._lookups_ended
        # Another thread's look-up (with its own deadline) may hold the lock: wait for it only so long.
        # Not below 0: Lock.acquire raised ValueError for a timeout under 0, and waited for ever at -1.
        if not self._lookup_lock.acquire(timeout=-1 if timeout is None else max(0.0, timeout)):
            return left()
        try:
            # One that ended while this thread waited and learnt nothing (out of its caller's time, the
            # server unreachable) is not run again at once: each waiting thread then ran its own in
            # turn, and with a server that hangs the n-th waited n look-ups (10 s each, no timeout).
            if self._limit.known or self._lookups_ended != ended:
                return left()
            try:
                _, call = self._stub.ServerMetadata.with_call(
                    pb.ServerMetadataRequest(), timeout=lookup_timeout(left()), metadata=self._metadata
                )
                self._limit.learn(call.trailing_metadata())
            except grpc.RpcError as exc:  # the request goes out as before; its own call reports the failure
                learn_from_error(self._limit, exc)
                # Out of time on this call's deadline (gRPC's timer may fire a little early): none is left.
                if timeout is not None and exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                    return 0.0
            except ValueError as exc:
                raise self._closed_error(exc) from None
            finally:
                self._lookups_ended += 1
        finally:
            self._lookup_lock.release()
        return left()

    # -- health and metadata ---------------------------------------------------------------
    def server_live(self, *, timeout: float | None = None) -> bool:
        return self._unary("ServerLive", pb.ServerLiveRequest(), timeout).live

    def server_ready(self, *, timeout: float | None = None) -> bool:
        return self._unary("ServerReady", pb.ServerReadyRequest(), timeout).ready

    def model_ready(self, name: str, *, timeout: float | None = None) -> bool:
        return self._unary("ModelReady", pb.ModelReadyRequest(name=name), timeout).ready

    def server_metadata(self, *, timeout: float | None = None) -> pb.ServerMetadataResponse:
        return self._unary("ServerMetadata", pb.ServerMetadataRequest(), timeout)

    def request_limit(self, *, timeout: float | None = None) -> tuple[int, int] | None:
        """The server's published request limit in bytes, (its --max-request-bytes, its gRPC receive
        limit), looked up once (wok.clients.limits); None when it publishes none (not a wok server, an
        older one) or the look-up failed. The targets' lookup it waits for first fails as any call's does."""
        self._look_up_limit(self._open(timeout, "the server's request limit was not looked up"))
        return self._limit.published()

    def model_metadata(self, name: str, *, timeout: float | None = None) -> ModelInfo:
        """The model's inputs and outputs: names, datatypes, shapes (batch first, -1 = any)."""
        return ModelInfo.from_proto(self._unary("ModelMetadata", pb.ModelMetadataRequest(name=name), timeout))

    def model_config(self, name: str, *, timeout: float | None = None) -> pb.ModelConfigResponse:
        return self._unary("ModelConfig", pb.ModelConfigRequest(name=name), timeout)

    def model_statistics(self, name: str = "", *, timeout: float | None = None) -> pb.ModelStatisticsResponse:
        """Statistics of model `name`, or of every model when `name` is empty."""
        return self._unary("ModelStatistics", pb.ModelStatisticsRequest(name=name), timeout)

    def repository_index(self, *, ready: bool = False, timeout: float | None = None) -> pb.RepositoryIndexResponse:
        """The server's models, each with its state ("READY", or "UNAVAILABLE" with the reason: a
        failed batcher, a lost GPU); with `ready`, those ready for inferencing only (V2's `ready` flag). A wok server
        starting or draining answers UNAVAILABLE instead, as Triton does (InferError)."""
        return self._unary("RepositoryIndex", pb.RepositoryIndexRequest(ready=ready), timeout)

    # -- inference ---------------------------------------------------------------------------
    def infer(
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
        """Run one request; see AsyncClient.infer (a request over a wok server's limit is not sent)."""
        est = estimate(inputs)
        request = encode_request(model, inputs, output_names(outputs), request_id, server_timeout_us, datatypes)
        if self._limit.needs_lookup(est):
            # The targets' lookup first, out of time with its own error: the look-up's would blame ServerMetadata.
            left = self._look_up_limit(self._open(timeout))
            check_time_left(left, timeout)
            timeout = left
        self._limit.check(request, est)
        return read_answer(self._unary("ModelInfer", request, timeout), request.model_name, request.id)

    def stream_infer(self, requests: Iterable[StreamItem], *, timeout: float | None = None) -> Iterator[StreamResult]:
        """Send `requests` on one stream; yield results as they arrive. See AsyncClient.stream_infer.

        Nothing is sent until the first result is asked for. Leaving early (closing the
        generator, or dropping it) cancels the stream.
        """
        timeout = self._open(timeout, "the stream was not opened")
        failure: list[BaseException] = []
        sent = self._answers.sent()
        # The requests sent and answered, and the results of those the client refused (over the
        # server's limit, not sent), shared with grpc's thread that consumes the requests.
        flight = _Flight()

        def check(request: pb.ModelInferRequest, est: int) -> bool:
            """Whether `request` goes out; if not, its result is queued. On grpc's requests thread."""
            if self._limit.needs_lookup(est):
                self._look_up_limit(timeout)
            result = self._limit.stream_refusal(request, est)
            if result is None:
                flight.sending()
                return True
            flight.refuse(result)
            return False

        try:
            responses = self._stub.ModelStreamInfer(
                _requests(requests, failure, check, flight), timeout=timeout, metadata=self._metadata
            )
        except ValueError as exc:
            raise self._closed_error(exc) from None
        responses.add_done_callback(flight.end)  # a failed call wakes a caller waiting below
        try:
            while True:
                if flight.refused:
                    yield flight.refused.popleft()
                    continue
                # The answers are read on this thread, in grpc's iterator, while one is coming (see
                # _Flight): a refusal meanwhile comes right after it. Else wait for one to be due.
                if not flight.answer_due():
                    flight.wait()
                    continue
                response = next(responses, None)
                self._answers.ok(sent)
                if response is None:  # the stream ended OK; the requests refused before its half-close
                    while flight.refused:
                        yield flight.refused.popleft()
                    break
                flight.answered += 1
                yield stream_result(response)
        except grpc.RpcError as exc:
            raise self._answers.error(exc) from None
        finally:
            responses.cancel()
        # grpc consumes the requests on its own thread and would log and hide an exception
        # raised there (and end without half-closing, so the stream would hang); it is kept
        # and raised here, after the results.
        if failure:
            raise failure[0]


# grpc's connectivity poller (the thread behind channel_ready_future, so behind wait_ready) looks for
# subscribers only between watches of the channel's state, each at most 0.2 s long. Closed while
# it is between two (a wait_ready cancelled by close(), or one that ended just before), the
# channel kills it with "Cannot monitor channel state: Channel closed!", which Python prints as an
# unhandled exception in a thread of the caller's application (grpc/grpc#18995: grpc#19030's
# unsubscribe-all in close() narrowed the window, still open in grpcio 1.85); so close() waits for
# it to stop. grpc's public API cannot tell: the sync channel has no get_state (grpc.aio's has),
# and subscribe/unsubscribe/channel_ready_future say nothing of the poller's thread. So this
# reads grpc's private state, and does nothing where its shape is not the one known.
POLLER_END_S = 1.0  # a bound, should a subscriber that is not wait_ready's keep it going


def _await_poller_end(channel: grpc.Channel, timeout: float = POLLER_END_S) -> None:
    state = getattr(channel, "_connectivity_state", None)  # grpc's private state
    if not hasattr(state, "lock") or not hasattr(state, "polling"):  # another grpc: nothing known to wait for
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with state.lock:
            if not state.polling:
                return
        time.sleep(0.005)


class _Flight:
    """What a sync stream's caller, reading its answers, and grpc's thread, consuming its requests,
    share: the requests sent and answered, and the results of those refused.

    The caller reads the answers in grpc's iterator, on its own thread, and nothing can wake it
    there but an answer or the stream's end. So it blocks there only while one is due (a request
    sent and not answered, or the requests over, or the call done); a refusal meanwhile is yielded
    right after that answer. Otherwise (nothing in flight: a caller that waits for each result, the
    stream's start) it waits on `wake` until a request goes out, one is refused, or the stream ends.
    """

    __slots__ = ("answered", "ended", "lock", "refused", "waiting", "wake", "written")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.written = 0  # requests handed to grpc (grpc's thread)
        self.answered = 0  # answers read (the caller's thread)
        self.ended = False  # the requests are over, or the call is done: no refusal comes any more
        self.waiting = False  # the caller waits on `wake`
        self.refused: deque[StreamResult] = deque()
        self.wake: queue.SimpleQueue = queue.SimpleQueue()

    def _wake(self) -> None:  # under the lock
        if self.waiting:
            self.waiting = False
            self.wake.put(None)

    def sending(self) -> None:
        with self.lock:
            self.written += 1
            self._wake()

    def refuse(self, result: StreamResult) -> None:
        with self.lock:
            self.refused.append(result)
            self._wake()

    def end(self, _call=None) -> None:
        with self.lock:
            self.ended = True
            self._wake()

    def answer_due(self) -> bool:
        # Read without the lock: each count has one writer, and a stale False only means wait().
        return self.written > self.answered or self.ended

    def wait(self) -> None:
        with self.lock:
            if self.written > self.answered or self.ended or self.refused:
                return
            self.waiting = True
        self.wake.get()


def _requests(
    requests: Iterable[StreamItem], failure: list[BaseException], check, flight: _Flight
) -> Iterator[pb.ModelInferRequest]:
    ids = StreamIds()
    try:
        for index, item in enumerate(requests):
            request = stream_request(item, index, ids)
            if check(request, item_estimate(item)):
                yield request
    except GeneratorExit:  # grpc dropped the requests: the stream is over, nothing to report
        raise
    except BaseException as exc:  # SystemExit too: ending here is what half-closes the stream
        failure.append(exc)
    finally:  # no refusal comes after this: a caller waiting for one reads the stream's end
        flight.end()
