"""The one exception the clients raise for a call that failed on the wire or on the server, and the
ValueError of an answer they cannot read (`read_answer`)."""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence

import grpc
import numpy as np

from wok.codec import decode_response
from wok.errors import quoted_name
from wok.v2pb import grpc_service_pb2 as pb

from .balancer import BEFORE
from .channel import target_list

# What a call that waited for the client's first lookup (or its balancer's start) gets when close() came first.
CLOSED_EARLY = "the client was closed before its first call went out"


class SetupTimeout(Exception):
    """A call's timeout ran out while it waited for the client's setup (its first lookup, the wok balancer's
    start); `what` names it. The clients' own: a call raises InferError DEADLINE_EXCEEDED for it."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what

    def call_error(self, timeout: float | None, unsent: str) -> InferError:
        """A call's error for it, as a late call gets: what it waited for and the call's timeout, then `unsent`."""
        return InferError(
            grpc.StatusCode.DEADLINE_EXCEEDED,
            f"CLIENT: {self.what} did not end within the call's timeout of {timeout} s, so {unsent}",
        )

    def ready_error(self, targets: str | Sequence[str], timeout: float | None) -> TimeoutError:
        """wait_ready's error for it, naming the client's `targets` and wait_ready's `timeout`."""
        shown = quoted_name(",".join(target_list(targets)))
        return TimeoutError(f"{shown}: not connected within {timeout} s: {self.what} did not end in that time")


# What gRPC's details say of a connection the server closed before HTTP/2 began: a TLS-only port
# closes a plaintext client's connection so, "... last error: UNAVAILABLE: ipv4:127.0.0.1:8001:
# Socket closed" (grpc 1.85). A port where nothing listens says "Connection refused" instead.
SOCKET_CLOSED = "Socket closed"
# A call whose HTTP/2 stream was open when the socket closed ("Stream removed (Socket closed)": a server killed with
# the call in flight) had got past where a TLS-only port closes the connection, so it gets no PLAINTEXT_HINT.
STREAM_REMOVED = "Stream removed"
PLAINTEXT_HINT = (
    "the server closed the connection before gRPC began: a TLS-only server (this client is plaintext: pass tls=, "
    "a wok.clients.TLS with its CA, or True), or no gRPC server behind the port"
)
# What gRPC's details say of a call it did not send because the server's health service
# (grpc.health.v1, which the channels watch) says NOT_SERVING: "... last error: ipv4:127.0.0.1:8001:
# backend unhealthy" (grpc 1.85). wok's server says NOT_SERVING from the first moment of its drain, and
# its own reason, "server is shutting down", then never reaches a client that health-checks.
UNHEALTHY = "backend unhealthy"
DRAINING_HINT = (
    "the server's health service says NOT_SERVING, as a wok server does from the start of its drain "
    "(it is shutting down); no call is sent to it until it serves again"
)
DRAINED_HINT = (
    "the server's health service said NOT_SERVING before this, as a wok server does while it drains: it has shut down"
)
# What gRPC's details say of a message over the server's receive limit (grpc.max_receive_message_length),
# refused before the server reads it: "SERVER: Received message larger than max (N vs. M)" (grpc 1.85).
# A client's own limits say "CLIENT: ...". wok's server sets M = 4 × --max-request-bytes + 1 MiB and
# refuses a request over --max-request-bytes itself, with its own words; only one over M gets these.
_OVER_SERVER_LIMIT = re.compile(r"SERVER: Received message larger than max \((\d+) vs\. (\d+)\)")


def over_limit_hint(details: str) -> str:
    """The hint for gRPC's refusal of a request over the server's receive limit (its details name
    the request's size and the limit, not the server's option): the --max-request-bytes that limit
    means on a wok server, and what to do; "" for any other details."""
    match = _OVER_SERVER_LIMIT.search(details)
    if match is None:
        return ""
    size, limit = int(match[1]), int(match[2])
    hint = f"the request is {size:,} bytes, over the server's gRPC limit of {limit:,} bytes, so it was not read"
    max_request, rest = divmod(limit - (1 << 20), 4)
    if max_request >= 1024 and rest == 0:
        hint += (
            f"; on a wok server that limit is 4 × --max-request-bytes + 1 MiB: --max-request-bytes is "
            f"{max_request:,} here, so send requests of at most {max_request:,} bytes or raise it to at least {size:,}"
        )
    return hint + "; on a stream this ends the whole stream"


# Statuses that do not show that a server answered on the channel: the client's own, or a failed connection.
_NO_ANSWER = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED})


class InferError(Exception):
    """A call ended with a non-OK gRPC status.

    `code` is the `grpc.StatusCode`, `details` the server's message (it names the input,
    what was expected and what was got); `str(err)` is "CODE: details", and " (hint)" after it
    when the client adds one (`Answers.error`): PLAINTEXT_HINT for a plaintext client whose
    connection the server closed before anything was answered on its channel, as a TLS-only
    server does; DRAINING_HINT for a call not sent because the server's health service says
    NOT_SERVING (a wok server draining); DRAINED_HINT for an UNAVAILABLE call after that, with no
    call answered OK in between (the server that drained is gone); for a request gRPC refused as
    over the server's message limit, its size, the limit and the --max-request-bytes it means on
    a wok server (`over_limit_hint`); else "". A call the wok balancer retried that ends UNAVAILABLE has,
    after its details, " (before: CODE: details)": the last earlier attempt's error that said something else.
    """

    def __init__(self, code: grpc.StatusCode, details: str, hint: str = "") -> None:
        super().__init__(f"{code.name}: {details}" + (f" ({hint})" if hint else ""))
        self.code = code
        self.details = details
        self.hint = hint

    # The default pickling would call __init__ with the formatted message alone; load
    # generators hand errors between processes.
    def __reduce__(self):
        return type(self), (self.code, self.details, self.hint)

    @classmethod
    def from_rpc_error(cls, exc: grpc.RpcError) -> InferError:
        # grpc.RpcError itself declares neither method; every error grpc raises has both.
        code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
        details = exc.details() if hasattr(exc, "details") else str(exc)
        return cls(code or grpc.StatusCode.UNKNOWN, details or "")


class Answers:
    """What a client's channel has seen, to tell its failures apart: `error(exc)` is the InferError
    of a failed call, with PLAINTEXT_HINT where the client is plaintext, nothing was answered on its
    channel yet (no call succeeded, none got a status only a server gives) and the call failed
    UNAVAILABLE with the socket closed (not refused: nothing listening gets no hint). A server that
    answered once and then went away gets none either, nor one that went away with the call's stream open.

    A drain's UNAVAILABLE never reaches a client that health-checks: gRPC stops sending at
    NOT_SERVING and says "backend unhealthy", then "Connection refused" once the server is gone. So
    the first gets DRAINING_HINT, and every UNAVAILABLE after it DRAINED_HINT until a call is
    answered OK that was sent after it (`ok()`; a drain answers the calls it had accepted, and those
    say nothing of the server's serving again): the reason the server gave is carried to the
    failures that follow it."""

    __slots__ = ("_lock", "answered", "drained", "drains", "plaintext")

    def __init__(self, plaintext: bool) -> None:
        self.plaintext = plaintext
        self.answered = False
        self.drained = False  # a call failed for NOT_SERVING, and none sent since was answered OK
        self.drains = 0  # calls failed for NOT_SERVING so far
        # A sync Client's threads share this: an answer's check-and-clear of `drained` and a failure's set-and-count
        # go one at a time, so an answer sent before a NOT_SERVING failure never clears what that failure set, and
        # no count is lost. (CPython's GIL switches threads at no point inside either today, so no test fails
        # without it; a free-threaded build does not hold them together.)
        self._lock = threading.Lock()

    def sent(self) -> int:
        """What a call notes as it goes out, for `ok()`."""
        return self.drains

    def ok(self, sent: int) -> None:
        """A call was answered OK (or a stream ended OK); `sent` is what `sent()` gave as it went out.
        Sent after the last NOT_SERVING failure, its answer shows the server serves again."""
        self.answered = True
        # Nothing to clear, the usual case, takes no lock: a failure counted meanwhile comes after `sent`, and
        # stays set, as it should.
        if self.drained:
            with self._lock:
                if sent == self.drains:
                    self.drained = False

    def error(self, exc: grpc.RpcError) -> InferError:
        # The InferError, raised `from None`, still holds `exc` as its context: without its
        # traceback, whose grpc.aio frame holds the call, and the call its channel open in
        # gRPC's core past close() for as long as the caller keeps the error.
        exc.with_traceback(None)
        err = self._error(InferError.from_rpc_error(exc))
        # An earlier attempt's other error (the wok balancer's retries: balancer.BEFORE), after what the hints were
        # read from: the final error's own details say what this call's end was.
        before = getattr(exc, BEFORE, None)
        if before:
            return InferError(err.code, f"{err.details} (before: {before})", err.hint)
        return err

    def _error(self, err: InferError) -> InferError:
        if err.code not in _NO_ANSWER:
            self.answered = True
        if err.code == grpc.StatusCode.UNAVAILABLE and UNHEALTHY in err.details:
            with self._lock:
                self.drained = True
                self.drains += 1
            return InferError(err.code, err.details, DRAINING_HINT)
        if err.code == grpc.StatusCode.UNAVAILABLE and self.drained:
            return InferError(err.code, err.details, DRAINED_HINT)
        if (
            self.plaintext
            and not self.answered
            and err.code == grpc.StatusCode.UNAVAILABLE
            and SOCKET_CLOSED in err.details
            and not err.details.startswith(STREAM_REMOVED)
        ):
            return InferError(err.code, err.details, PLAINTEXT_HINT)
        if err.code == grpc.StatusCode.RESOURCE_EXHAUSTED and (hint := over_limit_hint(err.details)):
            return InferError(err.code, err.details, hint)
        return err


def read_answer(
    resp: pb.ModelInferResponse, model: str, request_id: str, what: str = "request"
) -> dict[str, np.ndarray]:
    """`decode_response(resp)`, its ValueError (an answer it cannot read) naming the request (`what`,
    its id) and the model as well as the output: a caller with many requests in flight can tell which."""
    try:
        return decode_response(resp)
    except ValueError as exc:
        named = f"{what} {quoted_name(request_id)}" if request_id else f"the {what} (sent without a request id)"
        raise ValueError(f"the answer to {named} of model {quoted_name(model)} cannot be read: {exc}") from None
