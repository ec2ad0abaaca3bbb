"""The KServe V2 gRPC service: decode, hand to the model's batcher, await, encode.

Every exception that ends a request is turned into a status in one place
(`errors.to_status`): `_abort` for unary calls, an `error_message` for the stream (as
Triton does, so the stream stays open for the requests after a bad one), with the gRPC
status number a unary call would have ended with in the answer's `status_code` parameter.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import math
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf.message import DecodeError

from . import __version__
from .codec import (
    CONTENTS_CHUNK,
    IDS_BOUND_PREFIX,
    MAX_MESSAGE_KEY,
    MAX_REQUEST_KEY,
    UnreadOversized,
    decode_request,
    encode_response,
    finish_decoding,
    parse_infer_request,
    transport_limit,
    typed_values,
)
from .config import _MAX_REQUEST_BYTES
from .errors import (
    AnswerTooLarge,
    BatcherFailed,
    DeadlineExceeded,
    DeadlineUnmeetable,
    DeviceLost,
    DeviceLostRefusal,
    InvalidInput,
    InvalidVersion,
    ModelNotFound,
    NotStarted,
    NotSupported,
    QueueFull,
    RegionNotFound,
    ShuttingDown,
    WokError,
    cut_at,
    quoted_name,
    to_status,
)
from .ratelog import TracebackLog
from .repository import VERSION, check_version
from .servertiming import SERVER_TIMING, server_timing
from .v2pb import grpc_service_pb2 as pb
from .v2pb import grpc_service_pb2_grpc as pb_grpc
from .v2pb import model_config_pb2 as mc

if TYPE_CHECKING:
    from .app import ModelRuntime, WokServer

log = logging.getLogger("wok.service")
# Not "model_repository": to Triton's clients it means RepositoryIndex, RepositoryModelLoad and
# RepositoryModelUnload, and wok loads no model at run time (RepositoryModelLoad).
EXTENSIONS = ("model_configuration", "statistics")
# On every stream answer, as Triton sets it: the request has no answer after this one (wok's
# models answer each request once). Stream loops written for Triton wait for it to end.
FINAL = "triton_final_response"
# At the stop, how long a stream that owes nothing more stays open before it ends: time for the
# client to read the last answers (see ModelStreamInfer).
STREAM_LINGER_S = 0.2
# At the stop, how long a stream's write of an answer may take before the drain no longer waits
# for that stream: HTTP/2 flow control holds the write of a client that has stopped reading (and
# keeps its stream open) for as long as the client likes, and waiting for it would hold the whole
# stop for its grace period. A slow reader completes a write at least this often and is waited for.
STREAM_STALL_S = 1.0
# Put on a stream's queue of answers to make it look again at its reader and the server's stop.
_WAKE = object()
# A client whose deadline passes cancels its call (RST_STREAM CANCEL, as a cancel by hand), and that
# cancel reaches the server before the server's own deadline: gRPC sends the time left as `grpc-timeout`
# rounded up to a unit of its third significant figure (10 ms from 1 s, 100 ms from 10 s, 1 s from 100 s;
# measured, a 2.5 s deadline ended 9 ms later on the server, a 30 s one 99 ms), and the server's clock
# starts when the request comes. A cancel that comes within that unit of the call's timeout, plus
# DEADLINE_SLACK_S for the ways in and back and gRPC's millisecond clock, counts as the deadline its client
# saw: with a deadline of 1 s or more, nearly every call that expired counted CANCELLED. (The unit, not
# 1 % of the timeout: on an hour-long stream 1 % took a client's close in its last 36 s for its deadline.)
# DEADLINE_SLACK_S is chosen, not measured: the request's way in is in the server's deadline and the cancel's
# is not, and on a loaded 2-core host loopback hops take milliseconds; 2 ms failed the 1.0025 s test under
# `-n 2` now and then. A client's own cancel this close to its deadline counts DEADLINE_EXCEEDED too.
DEADLINE_SLACK_S = 0.02
_DRAINING = "server is shutting down and accepts no new requests"
_STARTING = "server is not ready: it is still starting"
REJECTION_REASON = {
    QueueFull: "queue_full",
    DeadlineExceeded: "deadline",
    DeadlineUnmeetable: "deadline_unmeetable",
    InvalidInput: "invalid",
    ShuttingDown: "shutting_down",
    # The model refuses every request until the server restarts: its batcher failed, or its device was lost.
    BatcherFailed: "model_failed",
    DeviceLostRefusal: "model_failed",
}


def _varint_len(n: int) -> int:
    return max(1, (n.bit_length() + 6) // 7)


def check_answer_size(resp: pb.ModelInferResponse, limit: int, model: str, *, stream: bool = False) -> None:
    """Raise AnswerTooLarge if `resp`, as gRPC sends it (inside a ModelStreamInferResponse with
    `stream`), is over `limit` bytes: gRPC would end the call, and with it a whole stream.

    ByteSize() is a full serialization pass (upb caches nothing for the send): the request path
    calls this only when its cheap bound from the arrays is over the limit (`_run`)."""
    size = resp.ByteSize()
    if stream:
        size += 1 + _varint_len(size)  # ModelStreamInferResponse.infer_response's tag and length
    if size <= limit:
        return
    need = -(-(size - (1 << 20)) // 4)  # the --max-request-bytes whose transport_limit holds it
    if need <= _MAX_REQUEST_BYTES:
        fix = f"raise --max-request-bytes to at least {need:,}, or ask for fewer rows or outputs per request"
    else:
        fix = f"no --max-request-bytes allows it (at most {_MAX_REQUEST_BYTES:,}): ask for fewer rows or outputs"
    raise AnswerTooLarge(
        f"the answer of model '{model}' is {size:,} bytes, over the server's send limit of {limit:,} bytes "
        f"(4 × --max-request-bytes + 1 MiB); {fix}"
    )


# An error answer's strings cut to this many characters when in full it would be over the send
# limit: far under the smallest limit (1 MiB), and long enough to recognise them by.
_ERROR_FIELD_CHARS = 1024


def error_answer(
    code: grpc.StatusCode, details: str, limit: int, model: str = "", version: str = "", request_id: str = ""
) -> pb.ModelStreamInferResponse:
    """A stream's answer to a request that failed: `details`, cut as a unary call's are
    (`short_details`: the same message either way, and a model's check or an internal error of 1 MB
    makes no 1 MB answer), and the status a unary call would have ended with in its `status_code`
    parameter, for clients that count codes.

    It echoes the request's model name and id whole, as Triton does (clients match a stream's answers
    to their requests by id), though they can be as long as a request may be: over gRPC's send limit,
    the answer would end the whole stream, so then each string is cut to _ERROR_FIELD_CHARS, as
    `short_details` cuts (errors.cut_at: the same note, with the whole length), and `details` says so."""
    details = _encodable(details)
    message = short_details(details)
    if 4 * (len(message) + len(model) + len(version) + len(request_id)) + 256 > limit:
        keep = _ERROR_FIELD_CHARS

        def short(text: str) -> str:
            return cut_at(text, keep)

        # Cut from the whole message, not from short_details' cut of it, so that its note gives the
        # message's own length.
        message = f"{short(details)} [this answer's model name, id and message are cut to {keep} characters each]"
        model, version, request_id = short(model), short(version), short(request_id)
    failed = pb.ModelInferResponse(model_name=model, model_version=version, id=request_id)
    failed.parameters["status_code"].int64_param = code.value[0]
    failed.parameters[FINAL].bool_param = True
    return pb.ModelStreamInferResponse(error_message=message, infer_response=failed)


# A unary error's details travel in the grpc-message header, percent-encoded: a client refuses
# headers over 16 KiB, and from 8 KiB at random, with RESOURCE_EXHAUSTED in place of the real
# status. Details that echo a client's string (a model or input name, a shape) are cut to this
# many bytes, encoded.
_DETAILS_BYTES = 4096


def _encodable(text: str) -> str:
    """`text` with a lone surrogate (a model's or its check's message built from undecodable bytes, as
    os.fsdecode makes them: 'caf\\udce9') escaped as repr escapes it: neither a status's details nor
    a protobuf string can carry it, and the call's abort, or the stream's answer, would raise
    UnicodeEncodeError in its place, leaving the request with no answer at all."""
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def short_details(details: str, budget: int = _DETAILS_BYTES) -> str:
    """`details`, or its start and how long it was (errors.cut_at), so that its percent-encoding fits
    `budget`; a lone surrogate escaped (`_encodable`)."""
    details = _encodable(details)
    used = 0
    for end, ch in enumerate(details):
        # A printable ASCII character (but '%') goes as itself; any other byte as %XX.
        used += 1 if " " <= ch <= "~" and ch != "%" else 3 * len(ch.encode("utf-8", "surrogatepass"))
        if used > budget - 100:  # room for the note
            return cut_at(details, end)
    return details


async def _abort(context: grpc.aio.ServicerContext, exc: BaseException):
    code, details = to_status(exc)
    details = short_details(details)
    try:
        if isinstance(exc, DeadlineUnmeetable):  # the hint of an admission refusal (slo policy), as its message says
            await context.abort(code, details, trailing_metadata=(("retry-after-ms", str(exc.retry_after_ms)),))
        await context.abort(code, details)
    except BaseException as aborted:
        # grpc.aio keeps the abort's error in the call's state, which the context (a local of the handler's
        # frames, held by the tracebacks) and its done callbacks refer back to: a cycle holding the request,
        # its decoded inputs and its batch, which only a collection of the oldest generation freed, and a
        # server holding torch's objects runs one rarely (58.6 MiB refusals grew an idle server by 2.8 GiB
        # in 56 calls). Without the tracebacks, reference counting frees the frames as the call ends.
        _at_call_end(functools.partial(_drop_tracebacks, aborted))
        raise


def _at_call_end(callback: Callable[[asyncio.Task], Any]) -> None:
    """Have `callback(task)` called as the call whose handler calls this ends, once gRPC has written its
    answer and status: grpc.aio runs each call's handler inside the call's task, and then writes what it
    returned there (server/unhandled.py), so that task's done callbacks run with grpc.aio's own.

    Not context.add_done_callback: grpc.aio keeps each callback, bound to the context, in the call's
    state for good, and the context refers back to that state: each call that added one would be a
    reference cycle, left with all it holds to the cyclic collector. A task lets go of its callbacks as
    it ends."""
    task = asyncio.current_task()
    if task is None:  # a handler run outside a task (not grpc.aio 1.85's way): nothing would call it
        raise RuntimeError(f"expected the call's task to run its handler; got none for {callback!r}")
    task.add_done_callback(callback)


def _drop_tracebacks(error: BaseException | None, _task) -> None:
    """At the call's end, the tracebacks of `error` and of the errors it chains, and so their frames, let go.
    Not frame.clear(): a traceback can reach the frame of a coroutine still suspended, which it would close."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        error.__traceback__ = None
        error = error.__cause__ or error.__context__


def _deadline_passed(time_left: Callable[[], float | None] | None) -> bool:
    """Whether a call's deadline has passed, by its context's time_remaining (None: it has none)."""
    left = time_left() if time_left is not None else None
    return left is not None and left <= 0


def _ended_by_deadline(time_left: Callable[[], float | None] | None, timeout: float | None) -> bool:
    """Whether a call that ended before its answer (gRPC cancelled its handler) ended by its client's
    deadline: the server's own passed, or comes within the slack of `timeout`, the call's time left as
    its handler began (`grpc_timeout_unit`: the client's deadline is earlier by up to that much)."""
    left = time_left() if time_left is not None else None
    if left is None:
        return False
    return left <= DEADLINE_SLACK_S + grpc_timeout_unit(timeout)


def grpc_timeout_unit(timeout: float | None) -> float:
    """The unit, in seconds, to which gRPC rounds up a time left of `timeout` seconds as it sends it: that of
    its third significant figure (1 ms below 1 s, gRPC's least; 10 ms from 1 s, 100 ms from 10 s, 1 s from
    100 s; 10 minutes from 100,000 s, where this is more); 0 for none. Taken at 1.05 × `timeout`: read as a
    handler began, late, a 10.001 s deadline (sent as 10.1 s) read 9.999 s and fell to the unit below."""
    if not timeout or timeout <= 0 or not math.isfinite(timeout):
        return 0.0
    return max(1e-3, 10.0 ** (math.floor(math.log10(1.05 * timeout)) - 2))


class Unparsed:
    """A message that does not parse as its method's request type; the method answers it
    (`add_tolerant_service`)."""

    __slots__ = ("error",)

    def __init__(self, error: InvalidInput) -> None:
        self.error = error


def tolerant_parser(request_cls, method: str, max_request_bytes: int | None = None) -> Callable[[bytes], Any]:
    """A request deserializer for `method` ('/package.Service/Method') that returns an `Unparsed`
    instead of raising: a deserializer that raises makes grpc.aio answer UNKNOWN and log an ERROR
    with a traceback for every such call, before any handler runs, and end a whole stream.
    A ModelInferRequest is read by `parse_infer_request`, which holds it to `max_request_bytes` by the
    bytes received (over it: an OversizedRequest, which decode_request refuses)."""
    name = request_cls.DESCRIPTOR.full_name

    def unparsed(data: bytes, exc: DecodeError) -> Unparsed:
        return Unparsed(InvalidInput(f"message is not a valid {name} ({len(data)} bytes): {exc} (sent to {method})"))

    if request_cls is pb.ModelInferRequest:
        # A large one's raw tensors read in place (ReceivedRequest); the limit bound here, not in a partial,
        # whose keyword would cost a dict a request.
        def parse_infer(data: bytes):
            try:
                return parse_infer_request(data, max_request_bytes)
            except UnreadOversized as exc:  # refused for its size, in those words: its model was not read
                return Unparsed(exc.error)
            except DecodeError as exc:
                return unparsed(data, exc)

        return parse_infer
    from_string = request_cls.FromString

    def parse(data: bytes):
        try:
            return from_string(data)
        except DecodeError as exc:
            return unparsed(data, exc)

    return parse


def _refusing_unparsed(behaviour, client_streaming: bool):
    """`behaviour` (a servicer's method) behind a check that ends the call with INVALID_ARGUMENT
    at a request that did not parse, before the servicer sees it."""

    async def parsed(requests, context):
        async for request in requests:
            if isinstance(request, Unparsed):
                await _abort(context, request.error)
            yield request

    async def argument(request, context):
        if client_streaming:
            return parsed(request, context)
        if isinstance(request, Unparsed):
            await _abort(context, request.error)
        return request

    # The same kind as the servicer's: grpc.aio tells a response stream written with
    # context.write from an async generator by what the handler returns.
    if inspect.isasyncgenfunction(behaviour):

        async def checked_stream(request, context):
            async for response in behaviour(await argument(request, context), context):
                yield response

        return checked_stream

    async def checked(request, context):
        return await behaviour(await argument(request, context), context)

    return checked


_MAKE_HANDLER = {
    (False, False): grpc.unary_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, False): grpc.stream_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}


def add_tolerant_service(
    server: grpc.aio.Server,
    module,
    service: str,
    servicer,
    *,
    answers_unparsed: Iterable[str] = (),
    max_request_bytes: int | None = None,
) -> dict[str, grpc.RpcMethodHandler]:
    """Register `servicer` for `service` of the generated `module` (a *_pb2) as the generated code
    does, except that a request that does not parse is an `Unparsed` (`tolerant_parser`): the
    methods named in `answers_unparsed` answer it themselves; the others end with
    INVALID_ARGUMENT before the servicer sees it. `max_request_bytes`: the limit on a ModelInferRequest
    (`tolerant_parser`).

    Returns the handlers by fully qualified method name ('/inference.GRPCInferenceService/ModelInfer').
    """
    desc = module.DESCRIPTOR.services_by_name[service]
    own = frozenset(answers_unparsed)
    handlers = {}
    for method in desc.methods:
        request_cls = getattr(module, method.input_type.name)
        response_cls = getattr(module, method.output_type.name)
        behaviour = getattr(servicer, method.name)
        if method.name not in own:
            behaviour = _refusing_unparsed(behaviour, method.client_streaming)
        make = _MAKE_HANDLER[method.client_streaming, method.server_streaming]
        handlers[method.name] = make(
            behaviour,
            request_deserializer=tolerant_parser(request_cls, f"/{desc.full_name}/{method.name}", max_request_bytes),
            response_serializer=response_cls.SerializeToString,
        )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(desc.full_name, handlers),))
    server.add_registered_method_handlers(desc.full_name, handlers)
    return {f"/{desc.full_name}/{name}": handler for name, handler in handlers.items()}


def add_to_server(service: InferenceService, server: grpc.aio.Server) -> dict[str, grpc.RpcMethodHandler]:
    """Register the V2 service (`add_tolerant_service`); the inference methods answer a request
    that does not parse themselves: counted, and on a stream for that one message only. Their
    deserializer holds a request to the server's --max-request-bytes (`parse_infer_request`)."""
    return add_tolerant_service(
        server,
        pb,
        "GRPCInferenceService",
        service,
        answers_unparsed=("ModelInfer", "ModelStreamInfer"),
        max_request_bytes=service.server.settings.max_request_bytes,
    )


class _ModelRaised(Exception):
    """A BaseException that is no Exception (CancelledError, GeneratorExit, KeyboardInterrupt, SystemExit) raised by
    the model's code run synchronously on a request's path (its batch key's __hash__ or __eq__, as the batcher queues
    the request): no cancellation or close of the handler's task but a failure, which the handlers answer and log as
    that error itself (`_failure`). Raised as it is, a CancelledError ended the call as a cancelled one (a unary call
    unanswered until its client's deadline, a stream with every answer it owed), and a GeneratorExit reads as the
    close of the handler's coroutine, which the handlers let through."""

    def __init__(self, exc: BaseException) -> None:
        super().__init__()
        self.exc = exc


def _failure(exc: BaseException) -> BaseException:
    """The error a handler's unexpected failure `exc` is answered and logged as (_ModelRaised)."""
    return exc.exc if isinstance(exc, _ModelRaised) else exc


class _Stream:
    """An open ModelStreamInfer stream, as the stop sees it."""

    __slots__ = ("owed", "results", "room", "writing_since")

    def __init__(self) -> None:
        # Its answers in order, each (message, request or None, code to count), and _WAKE.
        self.results: asyncio.Queue = asyncio.Queue()
        self.owed = 0  # requests read and not yet answered on the stream (counted in `active`)
        self.writing_since: float | None = None  # loop.time() at the start of a write in progress
        # Clear while the stream owes its window of answers (`stream_window`) and reads no more;
        # set by the write that makes room, and at the stop.
        self.room = asyncio.Event()
        self.room.set()


def _written_before_stop(method):
    """`method`, a unary one whose answer can pass the 64 KiB HTTP/2 lets a server send before its client
    reads: counted in `unwritten` until gRPC has written its answer, so the stop waits for it as for a
    ModelInfer answer (`InferenceService.answers_written`). ModelInfer counts itself, without this
    wrapper's extra coroutine on the hot path."""

    @functools.wraps(method)
    async def counted(self: InferenceService, request, context):
        self._count_unwritten()
        return await method(self, request, context)

    return counted


class InferenceService(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(self, server: WokServer) -> None:
        self.server = server
        self.server_timing = server.settings.server_timing
        self.send_limit = transport_limit(server.settings.max_request_bytes)
        # The most requests one stream owes (read and not yet answered on it) before it reads no more.
        self.stream_window = server.settings.stream_window
        # Inference requests between arrival and their answer: a unary call's until its handler
        # has the response, a stream request's until its answer is handed to the stream.
        self.active = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self.closing = False  # set by close_streams()
        # Calls whose answer gRPC has not written yet (ModelInfer, and the methods whose answer can be
        # large, _written_before_stop): it writes it after the handler returns, as HTTP/2 flow control
        # lets it (answers_written).
        self.unwritten = 0
        self._written = asyncio.Event()
        # Set by the server as gRPC's stop ends the calls still open (a stream whose client reads
        # no more): what they never wrote counts UNAVAILABLE, as those clients see the end.
        self.cutting = False
        self._streams: set[_Stream] = set()
        # After close_streams(): set when what idle() looks at may have changed.
        self._changed = asyncio.Event()
        # Tells server/unhandled.py that a ModelInfer call reached its handler (metrics on only).
        self._handler_started = server.unhandled.started if server.unhandled is not None else None
        # By model (None: a name not served), the requests whose handler ended them with an unexpected error (a
        # bug): a traceback per request was thousands of lines a second under load.
        self._failures: dict[str | None, TracebackLog] = {}
        # Its models' own logs (a check's, a batch_key's) are the servable's, which outlives a server: a second server
        # serving it after this one's stop closed them would log each failure at once, with no rate limit.
        for failures in self._servable_failure_logs():
            failures.open()
        # The logs this service opened and has not closed yet, its own (_failures, added as each is made) and its
        # models': closed once each by close_failure_logs, in this order.
        self._unclosed: tuple[list[TracebackLog], list[TracebackLog]] = ([], self._servable_failure_logs())

    def failure_log(self, model: str) -> TracebackLog:
        """The log of the requests for `model` whose handler an unexpected error (no WokError: a bug) ended: by
        model, its first traceback at once, then one line a window with the count of the rest."""
        key = model if model in self.server.runtimes else None  # a client's names would grow the dict
        failures = self._failures.get(key)
        if failures is None:
            subject = f"requests for model '{model}'" if key is not None else "requests for models not served"
            failures = self._failures[key] = TracebackLog(log, logging.ERROR, f"{subject} failed", "failed requests")
            failures.open()  # this server's own, closed by its stop (close_failure_logs)
            self._unclosed[0].append(failures)
        return failures

    def close_failure_logs(self) -> None:
        """At the stop, once no request is handled: tell the failures held in a window (the handlers', each model's
        check's and batch_key's) and leave no timer on the loop."""
        # Each closed once: a stop interrupted (a KeyboardInterrupt) after some were closed runs this again, and a
        # servable's log closed twice was closed for another server still serving with it (its failures then logged
        # each at once), a log closed more than opened raising. Taken off the list before its close: an interrupt
        # between the two leaves it counted open, rate-limited as while served.
        for logs in self._unclosed:
            while logs:
                logs.pop(0).close()

    def _servable_failure_logs(self) -> list[TracebackLog]:
        logs = []
        for rt in self.server.runtimes.values():
            if rt.servable.check_failures is not None:
                logs.append(rt.servable.check_failures)
            logs.append(rt.servable.batch_key_failures)
        return logs

    async def idle(self) -> None:
        """Return once no inference request is being handled and, after close_streams(), every
        stream has ended, except those stalled: a stream whose write of an answer has not
        completed for STREAM_STALL_S (its client reads no more) is left to gRPC's stop."""
        if not self.closing:
            await self._idle.wait()
            return
        loop = asyncio.get_running_loop()
        while True:
            self._changed.clear()
            now = loop.time()
            stalled, owed, next_stall = 0, 0, None
            for st in self._streams:
                if st.writing_since is None:
                    continue
                at = st.writing_since + STREAM_STALL_S
                if at <= now:
                    stalled += 1
                    owed += st.owed
                elif next_stall is None or at < next_stall:
                    next_stall = at
            # Every stream stalled, and every request still counted owed by one of them.
            if stalled == len(self._streams) and self.active == owed:
                if stalled:
                    log.warning(
                        "%d stream(s) took no answer for %.1f s (their clients read no more): the stop goes "
                        "on without them, and gRPC's stop cuts them with %d answer(s) unwritten",
                        stalled,
                        STREAM_STALL_S,
                        owed,
                    )
                return
            timer = None if next_stall is None else loop.call_at(next_stall, self._changed.set)
            try:
                await self._changed.wait()
            finally:
                if timer is not None:
                    timer.cancel()

    def _begin(self, n: int = 1) -> None:
        self.active += n
        self._idle.clear()

    def _end(self, n: int = 1) -> None:
        self.active -= n
        if self.active == 0:
            self._idle.set()
        if self.closing:
            self._changed.set()

    def _count_unwritten(self) -> None:
        """Count the running call as unwritten until its end (_at_call_end): the stop waits for its answer."""
        _at_call_end(self._answer_written)  # first: had it raised, the count would have stayed up for good
        self.unwritten += 1

    def _answer_written(self, _task) -> None:
        self.unwritten -= 1
        self._written.set()

    async def answers_written(self, window: Callable[[], float]) -> None:
        """Return once gRPC has written the answer of every call counted in `unwritten` (ModelInfer, and
        the methods whose answer can be large: `_written_before_stop`), or none of them has been
        written for STREAM_STALL_S (their clients read no more), or `window()` (seconds left) has run out.

        gRPC's stop must not begin before: it sends GOAWAY and a ping, and once the ping is acknowledged
        its core closes a connection as soon as its last call ends. An answer still held by HTTP/2 flow
        control is written after that exchange, while its client acknowledges what it reads
        (WINDOW_UPDATE, BDP pings); the close then finds those frames unread, and Linux answers a close
        with unread input with a TCP reset, which drops what is still in the socket's send queue: the
        client gets UNAVAILABLE "Connection reset by peer" for answers the server had written
        (docs/reliability.md, "A graceful stop: what gRPC can lose"). Written before the stop begins,
        every answer is ahead of the GOAWAY and the ping on the connection.
        A call counts as written when the task that ran its handler and then wrote the message and the
        status ends (`_at_call_end`, as grpc.aio runs a call's done callbacks); a slow reader
        completes an answer at least every STREAM_STALL_S and is waited for, as a stream's is."""
        while self.unwritten:
            self._written.clear()
            try:
                await asyncio.wait_for(self._written.wait(), timeout=min(STREAM_STALL_S, window()))
            except asyncio.TimeoutError:
                log.warning(
                    "%d unary answer(s) not written by gRPC %s: gRPC's stop may cut them",
                    self.unwritten,
                    f"for {STREAM_STALL_S:.1f} s (their clients read no more)" if window() else "in the grace period",
                )
                return

    def close_streams(self) -> None:
        """At the stop, once every accepted request has its result: each open stream stops reading,
        writes the answers it still owes, and ends with UNAVAILABLE "server is shutting down"; one
        whose client has stopped reading is left to gRPC's stop (idle())."""
        self.closing = True
        for st in self._streams:
            st.results.put_nowait(_WAKE)
            st.room.set()  # a reader waiting for room ends

    # -- the inference path ------------------------------------------------------------------
    async def infer(
        self,
        request: pb.ModelInferRequest,
        time_remaining: float | None,
        timing: list[str] | None = None,
        *,
        counted: bool = False,
        stream: bool = False,
        time_left: Callable[[], float | None] | None = None,
        call_timeout: float | None = None,
    ) -> pb.ModelInferResponse:
        """Run one request through its model's batcher; raises WokError on failure. With `timing` (a
        list), its stage times are appended to it as a `server-timing` value (`server_timing`).
        `counted`: the caller counts the request in `active` itself (a stream, until it is answered).
        `stream`: the answer is a stream's (marked FINAL, and sent inside a ModelStreamInferResponse);
        its code is counted by ModelStreamInfer as it writes the answer (or ends without writing it),
        not here, except a cancellation's.
        `time_left`: the call's context.time_remaining, asked when the request is cancelled: a call
        ended by its deadline counts DEADLINE_EXCEEDED, as its client sees it, not CANCELLED.
        `call_timeout`: the call's time left as its handler began (a stream's, for its request), from which
        the slack of that decision is taken (`_ended_by_deadline`); `time_remaining` when None.
        ModelStatistics counts a unary request's answer here, in success or fail (an error of any
        code its caller gets); a stream's once it is written (`_count_answer`)."""
        arrival = time.perf_counter()
        server = self.server
        try:
            rt: ModelRuntime = server.runtime(request.model_name, request.model_version)
        except ModelNotFound as exc:
            if isinstance(exc, InvalidVersion):  # INVALID_ARGUMENT: refused as `invalid`, not `not_found`
                server.metrics.unparsed_requests += 1
            else:
                server.metrics.unknown_model_requests += 1
            if not stream:  # a stream's, as its answer is written (ModelStreamInfer)
                self._refuse_unmodeled(exc, time_left)
            raise
        m = rt.metrics
        timeout = time_remaining if call_timeout is None else call_timeout
        if not counted:
            self._begin()
        try:
            resp = await self._run(rt, request, time_remaining, arrival, timing, stream, time_left, timeout)
        except WokError as exc:
            reason = REJECTION_REASON.get(type(exc))
            if reason is not None:
                m.record_rejection(reason)
            if stream:
                raise
            if time_left is not None and time_left() == 0:
                # As for an answer (_run): the call's deadline passed, gRPC's core ends it
                # DEADLINE_EXCEEDED itself, and a status sent now races that end. Ended as a
                # cancelled call (ModelInfer), counted as its client sees it (in no fail, as an
                # answer made then counts no success).
                m.record_status("DEADLINE_EXCEEDED")
                raise asyncio.CancelledError(f"the caller's deadline passed: {exc}") from None
            m.record_status(exc.code.name)
            rt.stats.fail.add(time.perf_counter() - arrival)
            raise
        except (asyncio.CancelledError, GeneratorExit):
            # gRPC cancels the handler both when the client cancels and when the call's deadline
            # passes (after its batch was dispatched: before, the batcher drops it as `deadline`). A
            # GeneratorExit is the handler's coroutine closed as it waits (its task destroyed): ended from
            # outside as a cancelled one is, no failure of the request's (it counted INTERNAL and a fail).
            m.record_status(self._ended_code(time_left, stream, timeout))
            raise
        except BaseException:  # neither a CancelledError nor a GeneratorExit: above
            if not stream:
                m.record_status("INTERNAL")  # the handler logs it and answers INTERNAL
                rt.stats.fail.add(time.perf_counter() - arrival)
            raise
        finally:
            if not counted:
                self._end()
        if not stream:
            m.record_status("OK")
        return resp

    async def _run(
        self,
        rt: ModelRuntime,
        request,
        time_remaining: float | None,
        arrival: float,
        timing: list[str] | None,
        stream: bool,
        time_left: Callable[[], float | None] | None,
        call_timeout: float | None,
    ):
        servable = rt.servable
        if not request.raw_input_contents and typed_values(request, len(servable.config.inputs)) > CONTENTS_CHUNK:
            # protobuf parsed it in this turn of the loop (~10 ns a value); its reading takes
            # turns of its own, so that the requests around it go on in between.
            await asyncio.sleep(0)
        self._refuse_if_stopping()
        rt.batcher.check_room()
        # No max_bytes: the deserializer held the request to the limit by the bytes received, and
        # one over it is an OversizedRequest, which decode_request refuses.
        dec = decode_request(request, servable, in_steps=True)
        if dec.pending:
            # A stop beginning meanwhile ends the read at the next chunk: read to the end, the
            # request would be refused all the same, with the stop waiting for it.
            await finish_decoding(dec, servable, self._refuse_if_stopping)
        deadline = None
        if time_remaining is not None:
            deadline = arrival + time_remaining
        timeout = dec.timeout_s or rt.default_timeout_s
        if timeout:
            deadline = arrival + timeout if deadline is None else min(deadline, arrival + timeout)
        # ModelStatistics' fail counts the errors callers get, as success counts answers (`infer`,
        # `_count_answer`), not as the batcher fails a request: its caller may be gone by then.
        try:
            key = servable.batch_key(dec.inputs)
        except WokError:
            raise
        except BaseException as exc:  # run synchronously: not the task's cancellation (a CancelledError is its own)
            raise servable.batch_key_failed(exc) from exc
        try:
            p = rt.batcher.submit(dec.inputs, dec.rows, key, deadline, dec.priority, count_fail=False)
        except Exception:
            raise
        except BaseException as exc:
            # Run synchronously, no cancellation or close of this task: the key's own (its __hash__ or __eq__ as the
            # batcher queues it), a failure (_ModelRaised).
            raise _ModelRaised(exc) from exc
        try:
            outputs = await p.future
        except GeneratorExit:
            # Its coroutine closed as it waits (its task destroyed): no caller is left, as for a cancel, and a
            # request left queued would run for nobody. Nothing more may be awaited here: the close goes on.
            rt.batcher.withdraw(p)
            raise
        except asyncio.CancelledError:
            if p.future.done() and not p.future.cancelled() and p.future.exception() is None:
                # Cancelled with its answer already made: the batcher counted it in the stage
                # histograms (its caller was still there), so the end-to-end one counts it too.
                now = time.perf_counter()
                rt.metrics.record_response(p.arrival - arrival, now - p.finished, 0.0, now - arrival)
            # The batcher refused it at its deadline (`Pending.expired`), and gRPC's cancel for that deadline
            # came before this handler resumed to raise the refusal, which `infer` would have counted: before
            # the refusal (its future cancelled, the refusal then finding it done) or after it.
            if (rt.batcher.withdraw(p) and _ended_by_deadline(time_left, call_timeout)) or p.expired:
                # Its client's deadline passed before it ran (queued, or its batch held at a busy worker):
                # refused as `deadline`, as the batcher refuses one at the server's deadline, which a
                # client's cancel comes before (_ended_by_deadline).
                rt.metrics.record_rejection("deadline")
            raise
        if time_left is not None and not stream and time_left() == 0:
            # The call's deadline passed as its batch ran, and gRPC has not cancelled this handler
            # yet: its core ends the call DEADLINE_EXCEEDED itself, and an answer sent now races
            # that end (grpc.aio logs the failed send as an ERROR with a traceback). Ended as a
            # cancelled call, counted as its client sees it (infer). The batcher put it in the
            # stage histograms: in the end-to-end one too (nothing encoded), so that they count
            # the same requests.
            now = time.perf_counter()
            rt.metrics.record_response(p.arrival - arrival, now - p.finished, 0.0, now - arrival)
            raise asyncio.CancelledError("the caller's deadline passed before its answer was sent")
        resumed = time.perf_counter()
        names = dec.outputs or tuple(outputs)
        resp = encode_response(servable.name, request.id, outputs, servable.output_types, names)
        if stream:
            resp.parameters[FINAL].bool_param = True
        # A bound on the answer's size from the arrays (reading a bytes field back copies it), on
        # every request's path: the exact check, a serialization pass, only near the limit.
        # Strings count 4 bytes a character (UTF-8's most); a field's framing, 1 + 5 bytes at most;
        # a dim, 11; an output's fields and framing besides, under 48; the rest (version, FINAL,
        # the stream's wrapper), under 128.
        raw = 0
        bound = 4 * (len(servable.name) + len(request.id)) + 128
        types = servable.output_types
        for i, n in enumerate(names):
            a = outputs[n]
            raw += len(resp.raw_output_contents[i]) if types[n].name == "BYTES" else a.nbytes
            bound += 4 * len(n) + 11 * a.ndim + 48
        if raw + bound > self.send_limit:
            try:
                check_answer_size(resp, self.send_limit, servable.name, stream=stream)
            except AnswerTooLarge:
                # Its batch ran for it and the batcher put it in the batch stages: it is in the
                # end-to-end histogram too (its encode the answer built and measured), so that every
                # stage counts the requests that one does (docs/metrics.md). Its caller gets the error.
                done = time.perf_counter()
                rt.metrics.record_response(p.arrival - arrival, resumed - p.finished, done - resumed, done - arrival)
                raise
        done = time.perf_counter()
        if not stream:  # a stream's, as its answer is written (ModelStreamInfer)
            rt.stats.success.add(done - arrival)
        rt.metrics.record_response(p.arrival - arrival, resumed - p.finished, done - resumed, done - arrival)
        if timing is not None:
            at = (arrival, p.arrival, p.dispatched, p.started, p.compute, p.finished, resumed, done)
            requests, samples = p.batch_size
            timing.append(server_timing(*at, batch_requests=requests, batch_samples=samples))
        return resp

    def _refuse_if_stopping(self) -> None:
        # A request that arrives once the stop has begun, or whose read is still going on then.
        if self.server.draining:
            raise ShuttingDown(_DRAINING)

    async def ModelInfer(self, request, context):
        if self._handler_started is not None:
            self._handler_started()
        self._count_unwritten()
        if isinstance(request, Unparsed):
            self.server.metrics.unparsed_requests += 1
            self._refuse_unmodeled(request.error, context.time_remaining)
            await _abort(context, request.error)
        try:
            timing: list[str] | None = [] if self.server_timing else None
            resp = await self.infer(request, context.time_remaining(), timing, time_left=context.time_remaining)
            if timing:
                context.set_trailing_metadata(((SERVER_TIMING, timing[0]),))
            return resp
        except WokError as exc:
            # One whose call's deadline had passed ended as a cancelled call in `infer`, which
            # decides it once, counting it as the client sees it.
            await _abort(context, exc)
        except (asyncio.CancelledError, GeneratorExit):
            raise  # the call's cancellation, or the close of this coroutine (its task destroyed): nothing to answer
        except BaseException as exc:  # a bug, not the request's fault: INTERNAL, and log it
            # A BaseException too: a KeyboardInterrupt or SystemExit out of the handler would end the server's loop
            # (`wok serve` takes its signals through the loop: one here is code's own).
            exc = _failure(exc)
            name = request.model_name
            # The client's name, which may be no model served: escaped and cut, as every name a request sent is.
            self.failure_log(name).failed(exc, f"ModelInfer for model {quoted_name(name)} failed")
            await _abort(context, exc)

    async def ModelStreamInfer(self, request_iterator, context):
        # request_iterator, grpc.aio's, is left unread: `read` reads with context.read() (it says why). Named as the
        # servicer's method names it, as the handlers name the arguments they leave (ServerLive's request).
        st = _Stream()
        results = st.results
        tasks: dict[asyncio.Task, pb.ModelInferRequest] = {}  # each request's, until it ends
        timeout = context.time_remaining()  # the stream's, as it began: see _ended_by_deadline

        async def one(req: pb.ModelInferRequest) -> None:
            begun = time.perf_counter()
            try:
                resp = await self.infer(
                    req,
                    context.time_remaining(),
                    counted=True,
                    stream=True,
                    time_left=context.time_remaining,
                    call_timeout=timeout,
                )
                # With its time for ModelStatistics' success (or fail, below), counted once it is written; with
                # the model's name and version, not the request, which a large one's received bytes would keep
                # until then (a client reading slowly: up to the stream's window of them).
                answer = pb.ModelStreamInferResponse(infer_response=resp)
                results.put_nowait((answer, req.model_name, req.model_version, "OK", time.perf_counter() - begun))
            except (asyncio.CancelledError, GeneratorExit):
                raise  # the stream's end, or its call's, or this coroutine's close: no answer is written
            except BaseException as exc:  # every request on the stream gets its one answer (ModelInfer: why Base)
                exc = _failure(exc)
                if not isinstance(exc, WokError):
                    line = f"ModelStreamInfer request for model {quoted_name(req.model_name)} failed"
                    self.failure_log(req.model_name).failed(exc, line)
                code, details = to_status(exc)
                model, version = req.model_name, req.model_version
                answer = error_answer(code, details, self.send_limit, model, version, req.id)
                results.put_nowait((answer, model, version, code.name, time.perf_counter() - begun))

        window = self.stream_window

        def take(req) -> bool:
            """Start on `req`, a request read (False at the end of the client's side, grpc.aio.EOF)."""
            if req is grpc.aio.EOF:
                return False
            st.owed += 1
            self._begin()
            if isinstance(req, Unparsed):  # answered in order; the stream goes on
                self.server.metrics.unparsed_requests += 1
                code, details = to_status(req.error)
                # Nothing of the request could be read: no model or id to answer with; counted
                # under no model's name as it is written.
                results.put_nowait((error_answer(code, details, self.send_limit), None, "", code.name, None))
            else:
                t = asyncio.get_running_loop().create_task(one(req))
                tasks[t] = req
                t.add_done_callback(lambda t: tasks.pop(t, None))
            return True

        async def read() -> bool:
            """Read requests until the client closes its side (False) or the server stops (True).

            Reads no further while the stream owes `window` answers: the requests of a client that
            writes faster than it reads wait in its transport, held by HTTP/2's flow control, and
            the server holds at most `window` answers. A client that writes every request before it
            reads any answer blocks once it is that far ahead (plus what the transports buffer).

            Through context.read(), and into `take` with no name for it here: `async for` over
            `request_iterator` (grpc.aio's generator of context.read()) kept the last request read,
            twice (the generator's variable and the loop's), while the next read waited, and with it
            the bytes gRPC received for it: a stream idle after a large request held them."""
            while take(await context.read()):
                if self.closing:  # this one is answered (UNAVAILABLE); read no more
                    return True
                if st.owed >= window:
                    st.room.clear()
                    await st.room.wait()  # the writer makes room as it writes; close_streams() too
                    if self.closing:
                        return True
            return False

        reader = asyncio.get_running_loop().create_task(read())
        reader.add_done_callback(lambda _: results.put_nowait(_WAKE))
        self._streams.add(st)
        loop = asyncio.get_running_loop()
        end_at: float | None = None  # when a stream the server closes ends, once it owes nothing
        # The answer being written; with those still queued, what a stream ending early never wrote.
        writing = None
        closed = False  # the server ended the stream (UNAVAILABLE), owing nothing
        try:
            while True:
                if st.owed == 0 and reader.done() and (reader.exception() is not None or not reader.result()):
                    break  # the client closed its side and has every answer, or the stream failed
                if st.owed == 0 and self.closing:
                    # The end of the stream makes a write the client is making fail, and grpc.aio's
                    # client then reports INTERNAL and drops the answers it has not read yet.
                    if end_at is None:
                        end_at = loop.time() + STREAM_LINGER_S
                    try:
                        item = await asyncio.wait_for(results.get(), end_at - loop.time())
                    except asyncio.TimeoutError:
                        break
                else:
                    item = await results.get()
                if item is _WAKE:
                    continue
                writing = item
                if _deadline_passed(context.time_remaining):
                    # gRPC's core ends the call DEADLINE_EXCEEDED itself, and its client, whose own
                    # deadline has passed, reads no more. Not written, as a unary answer made then is
                    # not sent (_run): written, it counted in success or fail though it reached no one
                    # (the error of a request the batcher drops at its deadline, the stream's, raced
                    # that end). Ended as a cancelled call, so that this answer and the rest the
                    # stream owes count DEADLINE_EXCEEDED, as its client sees the end (finally).
                    raise asyncio.CancelledError("the stream's deadline passed before its answer was written")
                st.writing_since = loop.time()
                if self.closing:
                    self._changed.set()  # idle() times this write
                # Returns once gRPC has written the answer: flow control holds it while the client
                # does not read.
                try:
                    await context.write(item[0])
                except grpc.aio.InternalError:
                    # gRPC's core failed the write: the call has ended (the client cancelled, or its
                    # deadline passed) and a status can no longer be sent. Let grpc.aio see a
                    # cancellation, which it logs at DEBUG only, rather than the failed write, which it
                    # logs as an ERROR with a traceback when its own view of the end lags behind.
                    raise asyncio.CancelledError("the stream ended before its answer was written") from None
                st.writing_since = None
                writing = None
                self._count_answer(item[1], item[2], item[3], item[4])
                # Not kept while the next answer is awaited: a stream that idles would hold its last answer.
                item = None
                st.owed -= 1
                if st.owed < window:
                    st.room.set()
                self._end()
            # reader.result() raises a failure of the request stream itself.
            if reader.done() and not reader.result():
                return  # the client closed its side and has every answer
            # The server stops: every request read has its answer; what the client sends now
            # would be refused.
            closed = True
            context.set_code(grpc.StatusCode.UNAVAILABLE)
            context.set_details("server is shutting down")
        finally:
            self._streams.discard(st)
            self._end(st.owed)
            if not reader.done():
                reader.cancel()
            elif not reader.cancelled():
                reader.exception()  # retrieved: a failed read (the call ended) is no one's to log
            unsent = [] if writing is None else [writing]
            while not results.empty():
                item = results.get_nowait()
                if item is not _WAKE:
                    unsent.append(item)
            if tasks or unsent:
                code = "UNAVAILABLE" if closed else self._ended_code(context.time_remaining, True, timeout)
                # Answers the stream's end kept from the client count as it sees them end.
                for _, model, version, _, _ in unsent:
                    self._count_answer(model, version, code)
                for t, req in list(tasks.items()):
                    if inspect.getcoroutinestate(t.get_coro()) == inspect.CORO_CREATED:
                        # Read, its task not begun: `infer`, which counts a cancelled request's
                        # code, never sees it. Counted here as it would have counted it.
                        self._count_answer(req.model_name, req.model_version, code)
                    t.cancel()

    def _refuse_unmodeled(self, exc: WokError, time_left: Callable[[], float | None] | None) -> None:
        """Count a unary call's refusal of a request of no served model (model=""): its code, unless
        the call's deadline has passed, when, as `infer` does for a model's, it is ended as a
        cancelled call (CancelledError), counted DEADLINE_EXCEEDED as its client sees it."""
        if _deadline_passed(time_left):
            self.server.metrics.record_unmodeled("DEADLINE_EXCEEDED")
            raise asyncio.CancelledError(f"the caller's deadline passed: {exc}") from None
        self.server.metrics.record_unmodeled(exc.code.name)

    def _ended_code(
        self, time_left: Callable[[], float | None] | None, stream: bool, timeout: float | None = None
    ) -> str:
        """The code a call's client sees when the call ends before its answer: UNAVAILABLE for a
        stream gRPC's stop cut (`cutting`), DEADLINE_EXCEEDED once its client's deadline has passed
        (`_ended_by_deadline`, of the call's `timeout` as it began; gRPC cancels the handler for both
        a client's cancel and a deadline), else CANCELLED."""
        if stream and self.cutting:
            return "UNAVAILABLE"
        return "DEADLINE_EXCEEDED" if _ended_by_deadline(time_left, timeout) else "CANCELLED"

    def _count_answer(self, model: str | None, version: str, code: str, took: float | None = None) -> None:
        """Count `code` in wok_responses_total for a stream's request to `model` (its model_name) and `version`:
        as its answer is written, or as the stream ends without writing it; one written with the time it `took`,
        in ModelStatistics' success (OK) or fail (any other code: an error its caller got). A request of no served
        model (`model` None: bytes that are no request) under model=""."""
        if model is None:
            self.server.metrics.record_unmodeled(code)
            return
        try:
            rt = self.server.runtime(model, version)
        except ModelNotFound:
            self.server.metrics.record_unmodeled(code)
            return
        except WokError:
            return
        rt.metrics.record_status(code)
        if took is not None:
            (rt.stats.success if code == "OK" else rt.stats.fail).add(took)

    # -- health and metadata ----------------------------------------------------------------
    def _not_serving(self) -> WokError | None:
        """Why the server as a whole answers no state while it starts or drains (ModelReady, RepositoryIndex: Triton
        core's "Server not ready" whenever its server is not READY); None once started and until its stop."""
        if self.server.draining:
            return ShuttingDown(_DRAINING)
        if not self.server.started:
            return NotStarted(_STARTING)
        return None

    async def ServerLive(self, request, context):
        # As Triton core's IsLive and IsReady: UNAVAILABLE while the server exits (a tritonclient's is_server_live
        # raises then), false while it starts. Kubernetes' probes read grpc.health.v1, NOT_SERVING from the drain's
        # first moment: these answers change no probe (docs/kubernetes.md).
        if self.server.draining:
            await _abort(context, ShuttingDown(_DRAINING))
        return pb.ServerLiveResponse(live=self.server.started)

    async def ServerReady(self, request, context):
        if self.server.draining:
            await _abort(context, ShuttingDown(_DRAINING))
        return pb.ServerReadyResponse(ready=self.server.ready)

    def _unready(self, rt: ModelRuntime) -> str | None:
        """Why the model cannot take requests now, the server started and not draining (`_not_serving`); None
        when it is ready (ModelReady, RepositoryIndex)."""
        if rt.batcher.failed is not None:
            if isinstance(rt.batcher.failed, DeviceLost):
                return str(rt.batcher.failed)
            return f"batcher failed: {rt.batcher.failed}; the model refuses every request until the server restarts"
        if not self.server.ready:
            return "server is not ready"
        return None

    async def ModelReady(self, request, context):
        try:
            # Triton's answer: a version that is no integer is a bad request, not a model that is not ready;
            # read first, as Triton reads it, before the server's state and the model.
            check_version(request.version, request.name)
        except InvalidVersion as exc:
            await _abort(context, exc)
        if (not_serving := self._not_serving()) is not None:
            # Triton's ModelReady answers UNAVAILABLE "Server not ready", not ready=false, while its server is
            # not ready (starting or exiting: core's InferenceServer::ModelIsReady), for every model, known or
            # not: tritonclient's is_model_ready raises then, and wok's clients retry it (on another server too). A
            # device lost or a batcher failed leave the server running: the model's ready=false tells those.
            await _abort(context, not_serving)
        try:
            rt = self.server.runtime(request.name, request.version)
        except WokError:  # a model or version not served: not ready, as Triton answers it
            return pb.ModelReadyResponse(ready=False)
        return pb.ModelReadyResponse(ready=self._unready(rt) is None)

    async def ServerMetadata(self, request, context):
        context.set_trailing_metadata(
            ((MAX_REQUEST_KEY, str(self.server.settings.max_request_bytes)), (MAX_MESSAGE_KEY, str(self.send_limit)))
        )
        return pb.ServerMetadataResponse(name="wok", version=__version__, extensions=EXTENSIONS)

    @_written_before_stop
    async def ModelMetadata(self, request, context):
        try:
            s = self.server.runtime(request.name, request.version).servable
        except WokError as exc:
            await _abort(context, exc)
        cfg = s.config
        resp = pb.ModelMetadataResponse(name=cfg.name, versions=[VERSION], platform=s.platform_label)
        for t in cfg.inputs:
            resp.inputs.add(name=t.name, datatype=t.datatype, shape=[-1, *t.dims])
        for t in cfg.outputs:
            resp.outputs.add(name=t.name, datatype=t.datatype, shape=[-1, *t.dims])
        return resp

    @_written_before_stop
    async def ModelConfig(self, request, context):
        try:
            rt = self.server.runtime(request.name, request.version)
        except WokError as exc:
            await _abort(context, exc)
        return pb.ModelConfigResponse(config=model_config_proto(rt))

    @_written_before_stop
    async def ModelStatistics(self, request, context):
        if request.name:
            try:
                rts = [self.server.runtime(request.name, request.version)]
            except InvalidVersion as exc:
                await _abort(context, exc)
            except ModelNotFound as exc:
                # Triton's ModelStatistics answers a model or version it does not serve INVALID_ARGUMENT
                # (TRITONSERVER_ServerModelStatistics: "requested model ... is not available"), where its
                # ModelMetadata, ModelConfig and ModelInfer answer NOT_FOUND; wok's message, naming what it serves.
                await _abort(context, InvalidInput(str(exc)))
        else:
            try:
                # Read though every model is answered, as Triton reads it before it looks at the name.
                check_version(request.version)
            except InvalidVersion as exc:
                await _abort(context, exc)
            rts = list(self.server.runtimes.values())
        return pb.ModelStatisticsResponse(model_stats=[rt.stats.to_proto() for rt in rts])

    @_written_before_stop
    async def RepositoryIndex(self, request, context):
        if request.repository_name:
            # Triton refuses it too; ignored, a client would take wok's one repository for the one it named.
            await _abort(
                context,
                InvalidInput(
                    f"'repository_name' specification is not supported: wok serves one set of models, chosen at "
                    f"start (--model-repository, --models); expected RepositoryIndex without repository_name; "
                    f"got {quoted_name(request.repository_name)}"
                ),
            )
        if (not_serving := self._not_serving()) is not None:
            # Triton's (core's InferenceServer::RepositoryIndex), after it refused a repository_name: no list of
            # models each UNAVAILABLE, which read as models that failed on a server that serves.
            await _abort(context, not_serving)
        resp = pb.RepositoryIndexResponse()
        for name in sorted(self.server.runtimes):
            reason = self._unready(self.server.runtimes[name])
            if reason is None:
                resp.models.add(name=name, version=VERSION, state="READY")
            elif not request.ready:  # ready=true asks for the models ready for inferencing only
                resp.models.add(name=name, version=VERSION, state="UNAVAILABLE", reason=reason)
        return resp

    async def RepositoryModelLoad(self, request, context):
        await self._fixed_repository(context, "load", request.model_name)

    async def RepositoryModelUnload(self, request, context):
        await self._fixed_repository(context, "unload", request.model_name)

    @staticmethod
    async def _fixed_repository(context, what: str, model: str) -> None:
        # Declared in the proto so that the answer says why: gRPC's own for an unknown method
        # is "Method not found!".
        await _abort(
            context,
            NotSupported(
                f"cannot {what} model {quoted_name(model)}: wok does not load or unload models while it runs; it "
                "serves the fixed set chosen at start (--model-repository, --models): restart it with the models wanted"
            ),
        )

    # -- shared memory ------------------------------------------------------------------------
    # Declared, as the repository RPCs are, so that a Triton tool that uses shared memory is told
    # why it fails rather than "Method not found!". No region is ever registered, and each answer
    # is Triton's for that state (its SharedMemoryManager): a status lists no region, or is
    # NOT_FOUND for a named one; an unregister, of one name or (empty) of all, succeeds.
    async def SystemSharedMemoryStatus(self, request, context):
        await _no_region(context, "system", request.name)
        return pb.SystemSharedMemoryStatusResponse()

    async def SystemSharedMemoryRegister(self, request, context):
        await _no_shared_memory(context, "system", request.name)

    async def SystemSharedMemoryUnregister(self, request, context):
        return pb.SystemSharedMemoryUnregisterResponse()

    async def CudaSharedMemoryStatus(self, request, context):
        await _no_region(context, "cuda", request.name)
        return pb.CudaSharedMemoryStatusResponse()

    async def CudaSharedMemoryRegister(self, request, context):
        await _no_shared_memory(context, "CUDA", request.name)

    async def CudaSharedMemoryUnregister(self, request, context):
        return pb.CudaSharedMemoryUnregisterResponse()


async def _no_region(context, kind: str, name: str) -> None:
    """The status of region `name` (all regions when empty) of `kind`: Triton's NOT_FOUND for a name."""
    if name:
        await _abort(context, RegionNotFound(f"Unable to find {kind} shared memory region: {quoted_name(name)}"))


async def _no_shared_memory(context, kind: str, name: str) -> None:
    await _abort(
        context,
        NotSupported(
            f"cannot register {kind} shared memory region {quoted_name(name)}: wok does not support shared memory; "
            "send the tensors in the request (raw_input_contents, or the typed contents)"
        ),
    )


def model_config_proto(rt: ModelRuntime) -> mc.ModelConfig:
    s = rt.servable
    cfg = s.config
    out = mc.ModelConfig(name=cfg.name, platform=s.platform_label, backend="wok", max_batch_size=cfg.max_batch_size)
    for t in cfg.inputs:
        out.input.add(name=t.name, data_type=s.input_types[t.name].config_enum, dims=t.dims)
    for t in cfg.outputs:
        out.output.add(name=t.name, data_type=s.output_types[t.name].config_enum, dims=t.dims)
    db = cfg.dynamic_batching
    out.dynamic_batching.preferred_batch_size.extend(db.preferred_batch_sizes)
    out.dynamic_batching.max_queue_delay_microseconds = int(db.max_queue_delay_ms * 1000)
    out.dynamic_batching.default_queue_policy.max_queue_size = db.max_queue_size
    out.dynamic_batching.default_queue_policy.default_timeout_microseconds = int(db.default_timeout_ms * 1000)
    out.dynamic_batching.default_queue_policy.allow_timeout_override = True
    by_kind: dict[str, list[int]] = {}
    for inst in rt.executor.instances:
        by_kind.setdefault(inst.device.type, []).append(inst.device.index or 0)
    for kind, idx in by_kind.items():
        g = out.instance_group.add(name=f"{cfg.name}_{kind}", count=len(idx))
        if kind == "cuda":
            g.kind = mc.ModelInstanceGroup.KIND_GPU
            g.gpus.extend(sorted(set(idx)))
        else:
            g.kind = mc.ModelInstanceGroup.KIND_CPU
    for k, v in cfg.parameters.items():
        out.parameters[k].string_value = str(v)
    for name, bound in s.id_bounds.items():
        out.parameters[IDS_BOUND_PREFIX + name].string_value = str(bound)
    return out
