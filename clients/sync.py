"""The blocking client, over a plain `grpc` channel; no event loop anywhere.

The channel is thread-safe, so one Client can serve many threads.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import grpc
import numpy as np

from wok.codec import decode_response, encode_request
from wok.v2pb import grpc_service_pb2 as pb
from wok.v2pb.grpc_service_pb2_grpc import GRPCInferenceServiceStub

from .channel import (
    TLS,
    auth_metadata,
    channel_authority,
    channel_credentials,
    channel_options,
    channel_target,
    open_channel,
)
from .errors import Answers
from .messages import ModelInfo, StreamIds, StreamItem, StreamResult, output_names, stream_request, stream_result


class Client:
    """A blocking KServe V2 client; the same calls as AsyncClient, without `await`.

    `target`, `options`, `tls`, `token` and `retries` are as for AsyncClient. Use as `with Client(...) as client:`
    or call `close()`. Every failed call raises InferError; the metadata calls return the
    protocol's response messages as they are, except `model_metadata`.
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
        self.target = channel_target(target)
        self._metadata = auth_metadata(token)
        credentials = channel_credentials(tls)
        self._answers = Answers(plaintext=credentials is None)
        self._channel = open_channel(
            grpc,
            self.target,
            credentials,
            channel_options(options, retries=retries),
            channel_authority(target),
        )
        self._stub = GRPCInferenceServiceStub(self._channel)
        self._closed = False
        # wait_ready's pending futures: close() cancels them, else a wait without a timeout never ended.
        self._waits: set[grpc.Future] = set()
        self._lock = threading.Lock()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        """Close the channel; calls still in flight end with CANCELLED, later ones raise RuntimeError."""
        with self._lock:
            self._closed = True
            waits, self._waits = self._waits, set()
        for ready in waits:
            ready.cancel()
        _await_poller_end(self._channel)
        self._channel.close()

    def _closed_error(self, exc: ValueError) -> Exception:
        # grpc's own words for a call on a closed channel are a ValueError; AsyncClient says this.
        return RuntimeError("this Client is closed") if self._closed else exc

    def wait_ready(self, timeout: float | None = None) -> None:
        """Wait until the channel is connected (to at least one server); TimeoutError if not in time,
        RuntimeError if the client is closed (before, or while it waits)."""
        with self._lock:
            # On a closed channel grpc's watch thread dies of a ValueError, and the wait never ends.
            if self._closed:
                raise RuntimeError("this Client is closed")
            ready = grpc.channel_ready_future(self._channel)
            self._waits.add(ready)
        try:
            ready.result(timeout=timeout)
        except grpc.FutureTimeoutError:
            # Left running, it would stay subscribed to the channel's state until it connects.
            ready.cancel()
            raise TimeoutError(f"{self.target}: not connected within {timeout} s") from None
        except grpc.FutureCancelledError:
            raise RuntimeError("this Client is closed") from None
        finally:
            with self._lock:
                self._waits.discard(ready)

    def _unary(self, method: str, request, timeout: float | None):
        sent = self._answers.sent()
        try:
            response = getattr(self._stub, method)(request, timeout=timeout, metadata=self._metadata)
        except grpc.RpcError as exc:
            raise self._answers.error(exc) from None
        except ValueError as exc:
            raise self._closed_error(exc) from None
        self._answers.ok(sent)
        return response

    # -- health and metadata ---------------------------------------------------------------
    def server_live(self, *, timeout: float | None = None) -> bool:
        return self._unary("ServerLive", pb.ServerLiveRequest(), timeout).live

    def server_ready(self, *, timeout: float | None = None) -> bool:
        return self._unary("ServerReady", pb.ServerReadyRequest(), timeout).ready

    def model_ready(self, name: str, *, timeout: float | None = None) -> bool:
        return self._unary("ModelReady", pb.ModelReadyRequest(name=name), timeout).ready

    def server_metadata(self, *, timeout: float | None = None) -> pb.ServerMetadataResponse:
        return self._unary("ServerMetadata", pb.ServerMetadataRequest(), timeout)

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
        failed batcher, a drain); with `ready`, those ready for inferencing only (V2's `ready` flag)."""
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
        """Run one request; see AsyncClient.infer."""
        request = encode_request(model, inputs, output_names(outputs), request_id, server_timeout_us, datatypes)
        return decode_response(self._unary("ModelInfer", request, timeout))

    def stream_infer(self, requests: Iterable[StreamItem], *, timeout: float | None = None) -> Iterator[StreamResult]:
        """Send `requests` on one stream; yield results as they arrive. See AsyncClient.stream_infer.

        Nothing is sent until the first result is asked for. Leaving early (closing the
        generator, or dropping it) cancels the stream.
        """
        failure: list[BaseException] = []
        sent = self._answers.sent()
        try:
            responses = self._stub.ModelStreamInfer(
                _requests(requests, failure), timeout=timeout, metadata=self._metadata
            )
        except ValueError as exc:
            raise self._closed_error(exc) from None
        try:
            for response in responses:
                self._answers.ok(sent)
                yield stream_result(response)
            self._answers.ok(sent)  # the stream ended OK
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
# unhandled exception in a thread of the caller's application; so close() waits for it to stop.
POLLER_END_S = 1.0  # a bound, should a subscriber that is not wait_ready's keep it going


def _await_poller_end(channel: grpc.Channel, timeout: float = POLLER_END_S) -> None:
    state = getattr(channel, "_connectivity_state", None)  # grpc's private state; absent: nothing to wait for
    deadline = time.monotonic() + timeout
    while state is not None and time.monotonic() < deadline:
        with state.lock:
            if not state.polling:
                return
        time.sleep(0.005)


def _requests(requests: Iterable[StreamItem], failure: list[BaseException]) -> Iterator[pb.ModelInferRequest]:
    ids = StreamIds()
    try:
        for index, item in enumerate(requests):
            yield stream_request(item, index, ids)
    except GeneratorExit:  # grpc dropped the requests: the stream is over, nothing to report
        raise
    except BaseException as exc:  # SystemExit too: ending here is what half-closes the stream
        failure.append(exc)
