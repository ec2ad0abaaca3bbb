"""The server's request limit, as the clients learn it: refuse a request gRPC would refuse unread.

gRPC refuses a message over the server's receive limit before the server reads it, and on a
stream that refusal ends the whole stream: the requests in flight on it are lost to the caller. A
wok server publishes that limit (M = 4 × --max-request-bytes + 1 MiB) and its --max-request-bytes
as trailing metadata of ServerMetadata (KServe's response has no field for them). A client looks it
up once, the first time it is about to send a request that could be over the smallest limit a wok
server has, and from then on refuses a request over M itself, before sending it, with the size, the
limit and the option: on a stream that one request fails and the stream goes on. A server that
publishes nothing (tritonserver, an older wok) is sent every request, as before.

One limit per client: the replicas behind one client are taken to share their --max-request-bytes
(the first to answer the lookup speaks for them all).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import grpc
import numpy as np

from wok.codec import MAX_MESSAGE_KEY, MAX_REQUEST_KEY, transport_limit
from wok.errors import quoted_name
from wok.v2pb import grpc_service_pb2 as pb

from .errors import InferError
from .messages import StreamResult

# The smallest transport limit a wok server has (--max-request-bytes is at least 1,024: wok.config):
# a request under it needs no look-up.
SMALLEST_LIMIT = transport_limit(1024)
# Room for what a request holds besides its arrays' bytes (names, datatypes, shapes, its id, its
# parameters): a request whose arrays are this far under a limit is not measured (ByteSize() is a
# full serialization pass, 0.3 ms for 1 MB). One whose other fields are larger than this and that
# goes over the limit only with them is sent, and refused by gRPC as before.
SLACK = 1 << 16
# The look-up's deadline when the call that needs it has none.
LOOKUP_TIMEOUT_S = 10.0
_UNKNOWN = -1  # an estimate for inputs whose size cannot be read off cheaply (not arrays, BYTES)


def estimate(inputs: Any) -> int:
    """The bytes of `inputs`' arrays, as encode_request puts them in the request; _UNKNOWN when an
    input is not a numpy array of fixed-size items (a list, BYTES' objects), or `inputs` is not a
    mapping (encode_request says what is wrong with it)."""
    if not isinstance(inputs, Mapping):
        return _UNKNOWN
    total = 0
    for a in inputs.values():
        if not isinstance(a, np.ndarray) or a.dtype.hasobject:
            return _UNKNOWN
        total += a.nbytes
    return total


def item_estimate(item: Any) -> int:
    """`estimate` of a stream item's inputs (an item stream_request has taken: `(model, inputs)` or a
    mapping with "inputs")."""
    inputs = item.get("inputs") if isinstance(item, Mapping) else item[1] if isinstance(item, Sequence) else None
    return estimate(inputs)


def published(metadata: Sequence[tuple[str, str | bytes]] | None) -> tuple[int, int] | None:
    """(--max-request-bytes, transport limit) from ServerMetadata's trailing metadata; None when the
    server publishes neither, or not as positive whole numbers."""
    values = dict(metadata or ())
    try:
        max_request, max_message = int(values[MAX_REQUEST_KEY]), int(values[MAX_MESSAGE_KEY])
    except (KeyError, ValueError, TypeError):
        return None
    if max_request <= 0 or max_message <= 0:
        return None
    return max_request, max_message


class RequestLimit:
    """What one client knows of its server's request limit.

    `needs_lookup(est)`: whether a request of `estimate` `est` waits for the look-up (ServerMetadata)
    first; the client then calls `learn` with its trailing metadata (None when the server does not
    implement ServerMetadata). `refusal(request, est)`: the error message for a request over the
    limit, "" for one the client sends; `check` raises it, `stream_refusal` makes it a stream's
    result. A failed look-up (the server unreachable, a token refused) teaches nothing: the request
    is sent, and the next large one looks again.
    """

    __slots__ = ("known", "max_message", "max_request")

    def __init__(self) -> None:
        self.known = False
        self.max_request: int | None = None
        self.max_message: int | None = None

    def published(self) -> tuple[int, int] | None:
        """(max_request, max_message) as learnt; None before a look-up or when the server published none."""
        if self.max_request is None or self.max_message is None:
            return None
        return self.max_request, self.max_message

    def needs_lookup(self, est: int) -> bool:
        return not self.known and (est == _UNKNOWN or est + SLACK > SMALLEST_LIMIT)

    def learn(self, metadata: Sequence[tuple[str, str | bytes]] | None) -> None:
        limits = published(metadata)
        self.known = True
        self.max_request, self.max_message = limits if limits is not None else (None, None)

    def refusal(self, request: pb.ModelInferRequest, est: int, what: str = "the request") -> str:
        """ "" unless `request` (`estimate` `est`), framed for the wire, is over the server's limit;
        then what RESOURCE_EXHAUSTED says of it, in gRPC's words for a client-side refusal ("CLIENT:")."""
        limit = self.max_message
        if limit is None or (est != _UNKNOWN and est + SLACK <= limit):
            return ""
        size = request.ByteSize()
        if size <= limit:
            return ""
        max_request = self.max_request
        return (
            f"CLIENT: {what} to model {quoted_name(request.model_name)} is {size:,} bytes, over the server's gRPC "
            f"limit of {limit:,} bytes (4 × --max-request-bytes + 1 MiB; the server's --max-request-bytes is "
            f"{max_request:,}), so it was not sent: send requests of at most {max_request:,} bytes, or raise the "
            f"server's --max-request-bytes to at least {size:,}"
        )

    def check(self, request: pb.ModelInferRequest, est: int) -> None:
        """Raise InferError RESOURCE_EXHAUSTED for a request over the limit (`infer`)."""
        if refused := self.refusal(request, est):
            raise InferError(grpc.StatusCode.RESOURCE_EXHAUSTED, refused)

    def stream_refusal(self, request: pb.ModelInferRequest, est: int) -> StreamResult | None:
        """The result of a stream's request over the limit, which is not sent; None for one that is."""
        why = self.refusal(request, est, f"stream request {quoted_name(request.id)}")
        return (
            StreamResult(request.id, request.model_name, None, why, grpc.StatusCode.RESOURCE_EXHAUSTED) if why else None
        )


def lookup_timeout(timeout: float | None) -> float:
    return LOOKUP_TIMEOUT_S if timeout is None else timeout


def check_time_left(left: float | None, timeout: float | None) -> None:
    """Raise InferError DEADLINE_EXCEEDED when the look-up left nothing of the call's `timeout`
    (`left`): gRPC would still send the request, its deadline past, for the server to run for nobody."""
    if left is not None and left <= 0:
        raise InferError(
            grpc.StatusCode.DEADLINE_EXCEEDED,
            f"CLIENT: the look-up of the server's request limit (ServerMetadata) took the whole timeout of "
            f"{timeout} s, so the request was not sent",
        )


def learn_from_error(limit: RequestLimit, exc: grpc.RpcError) -> None:
    """After a failed look-up: a server without ServerMetadata publishes nothing; any other failure
    teaches nothing."""
    code = exc.code() if hasattr(exc, "code") else None
    if code == grpc.StatusCode.UNIMPLEMENTED:
        limit.learn(None)
