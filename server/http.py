"""A small HTTP/1.1 server on the event loop for /metrics (Prometheus text or OpenMetrics),
and, with `wok serve --admin`, the admin API and the /events stream (server/admin.py).

It runs on the server's own loop, so a scrape reads the counters the loop writes without
a thread in between. Keep-alive is honoured, since Prometheus reuses its connection.

Admin paths (404 without --admin; bodies are JSON, errors `{"error": "..."}` with 400; a
request that fails unexpectedly, admin or /metrics, answers 500, logged with its traceback, and
the connection ends; /events, once its 200 is out, ends with an SSE comment line instead, logged
once at WARNING):
  GET  /admin/faults     the active faults (HEAD on an admin path: GET's headers)
  POST /admin/faults     {"model", "instance"?, "mode": slow|fail|off, "delay_ms"?, "duration_s"?}
  GET  /admin/batching   each model's batching policy
  POST /admin/batching   {"model", "max_batch_size"?, "max_queue_delay_ms"?}
  GET  /events           text/event-stream of batch and tick events
Once the server stops (its drain has begun), a POST (a change) answers 503 `{"error": "POST <path>:
expected a server that serves; got one that is stopping"}` and the connection ends, kept alive from
before the stop or not, its headers sent before the stop or not; but `{"mode": "off"}` to
/admin/faults is taken through the drain (a fault lifted lets the drain finish). The reads (GET and
HEAD of the admin paths, /metrics) are answered through the drain; from this port's own stop, the
drain's end, every POST and /events answer 503.

Every answer carries a Date header (RFC 9110 6.6.1), formatted once a second. A request whose Host
is not `host[:port]` (RFC 9110 7.2: a name, an IPv4 address or a bracketed IPv6 one, then an
optional colon and digits) gets 400 naming it (RFC 9112 3.2), as does an absolute-form target
whose authority is not; a path not served gets 404 naming it and the paths that are. A refusal shows
what the request sent (a header's value, a method, a path, a malformed line) as `quoted` does: in
quotes, each byte that is not printable ASCII escaped, cut past 200 characters as every cut value
ends (errors.CUT_NOTE); text answers are UTF-8, and say so.

A request with a Transfer-Encoding gets 501 when its last coding is chunked (RFC 9112 6.1: a coding
this server does not implement; bodies are read by Content-Length alone), else 400 (its framing is
faulty: RFC 9112 6.1, 6.3); either way the connection ends. /metrics is OpenMetrics when Accept
weighs it above the Prometheus text format (RFC 9110 12.5.1), else the text format, labelled version
0.0.4 or 1.0.0 as Accept asks, its names in the escaping asked for (`negotiate`). Header lists
(Accept, Connection, Transfer-Encoding) are split outside quoted strings (server/fieldvalues.py).
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import json
import logging
import re
import socket
import time
from collections.abc import Callable
from email.utils import formatdate
from typing import NamedTuple
from urllib.parse import urlsplit

from prometheus_client import CollectorRegistry
from prometheus_client import exposition as text_format
from prometheus_client.openmetrics import exposition as openmetrics

from .admin import Admin, dumps
from .errors import CUT_NOTE, NAME_CHARS
from .faults import AdminRequestError
from .fieldvalues import OWS, split_unquoted, unquoted
from .ports import bind_refusal
from .ratelog import WindowedWarning

log = logging.getLogger("wok.http")
MAX_HEADER_BYTES = 16 << 10
MAX_BODY_BYTES = 64 << 10  # admin bodies are a few fields
# A request's head must arrive within this of its start: a new connection's accept, or, on a
# kept-alive one, the head's first byte.
HEADER_TIMEOUT_S = 10.0
IDLE_TIMEOUT_S = 120.0  # a kept-alive connection with no request for this long is closed
# Empty lines skipped before a request line (RFC 9112 2.2: a client may send a CRLF after a
# POST's body); more are refused, so that a client cannot hold its slot by trickling them.
MAX_EMPTY_LINES = 4
WRITE_TIMEOUT_S = 10.0  # an answer the client does not read within this ends its connection
# After its last answer, a closing connection reads and drops what the client still sends, for up
# to this long: a close with unread bytes makes the kernel send a reset, and the client's kernel
# may then discard the answer before the client has read it.
LINGER_S = 2.0
# Beyond this many connections, one waiting for its next request, for a request's body, or for the
# client to close, is closed to make room (a scraper sends its request at once, so it is never that
# one; nor is one whose awaited bytes have arrived but not been read yet): the one waiting longest
# that loses nothing (an idle kept-alive one, or one whose last answer is out, all of it sent),
# else the one waiting longest with an answer owed, else one whose last answer is not all sent;
# when none waits, the one blocked longest on a client that does not take its answers (pipelined
# requests read slowly, or not at all); when none is, the new one is closed at once. Sockets are
# the gRPC port's file descriptors too. A connection so closed with a request owed (a new one's
# first, whose bytes may be in the socket unread in a burst, or one whose request has begun) gets
# a 503 as a refused new one does, when nothing of its own is still unsent before it.
MAX_CONNECTIONS = 64
# Connections closed unanswered at the cap (new ones refused, and those closed for room with a request
# owed) are logged at WARNING at most once per this many seconds, with their count: a scrape closed
# so fails (its 503 may be lost to a reset), and the operator whose scrapes fail reads why only
# here; a flood of them must not flood the log.
REFUSED_LOG_EVERY_S = 10.0
# A /metrics render (tens of ms, tens of KiB with many models) runs on the loop that serves
# gRPC: each format renders at most once per this interval. A scrape is answered with the last
# render if that began after the scrape arrived (pipelined scrapes sent together share one),
# else with the next, shared by all that wait for it: no scrape reads figures from before it came.
RENDER_INTERVAL_S = 0.25
# At stop, the scrapes waiting for a render are answered with one made then, and get this long to
# be written and their clients to close; then their connections are cut like the rest: a client
# that does not read must not hold the stop.
STOP_ANSWER_S = 1.0
MAX_EVENT_STREAMS = 16  # /events subscribers at once; more get 503, so streams cannot take every slot
REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    403: "Forbidden",
    405: "Method Not Allowed",
    408: "Request Timeout",
    411: "Length Required",
    413: "Content Too Large",  # RFC 9110 15.5.14 (RFC 7231 named it Payload Too Large)
    414: "URI Too Long",
    415: "Unsupported Media Type",
    417: "Expectation Failed",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    501: "Not Implemented",
    503: "Service Unavailable",
    505: "HTTP Version Not Supported",
}
JSON = "application/json"
# A text answer (a refusal, the root): UTF-8, as a cut value's note holds an ellipsis (errors.CUT_NOTE).
TEXT = "text/plain; charset=utf-8"
# A header field's name (RFC 9110 5.1), and a method (RFC 9110 9.1): anything else, a space before
# the colon included, a proxy in front may read otherwise.
TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
# The names a charset parameter gives UTF-8 by, matched case-insensitively (RFC 9110 8.3.2): the labels of the
# WHATWG Encoding Standard (what browsers and fetch() read as UTF-8; "utf8", as common as "utf-8", among them) and
# IANA's alias csUTF8. By codecs.lookup() Python's own aliases were UTF-8 too ("utf--8", "UTF_8", "u8", "utf",
# "cp65001", "utf 8"), which no client sends for it and no registry names.
UTF8_CHARSETS = frozenset(
    ("utf-8", "utf8", "unicode-1-1-utf-8", "unicode11utf8", "unicode20utf8", "x-unicode20utf8", "csutf8")
)
VERSION = re.compile(r"HTTP/([0-9])\.([0-9])")  # RFC 9112 2.3; "HTTP" is case-sensitive
# A Host field value (RFC 9110 7.2): uri-host [":" port], uri-host an RFC 3986 3.2.2 host: a reg-name
# (a name, an IPv4 address, or empty, which RFC 9112 3.2 has a client send when the target has
# no authority) or an IP literal in brackets, checked by valid_host; port = *DIGIT, so
# `127.0.0.1:` is one. Anything else (`a b`, `x/y`, `u@h`, `::1` unbracketed) is not a host, and
# a proxy in front, or the cross-site check, may read another name from it.
HOST = re.compile(r"((?:[A-Za-z0-9\-._~!$&'()*+,;=]|%[0-9A-Fa-f]{2})*|\[([^\[\]]*)\])(?::[0-9]*)?")
# An IP literal's inside, besides an IPv6 address: IPvFuture (RFC 3986 3.2.2), and an IPv6
# address's zone (`fe80::1%25eth0`, RFC 6874), which some clients send.
IP_FUTURE = re.compile(r"v[0-9A-Fa-f]+\.[A-Za-z0-9\-._~!$&'()*+,;=:]+")
ZONE = re.compile(r"%25(?:[A-Za-z0-9\-._~]|%[0-9A-Fa-f]{2})+")
# Admin paths and the Admin methods that answer their GET and POST (a POST reads its body).
ADMIN_ROUTES = {
    "/admin/faults": ("get_faults", "post_faults"),
    "/admin/batching": ("get_batching", "post_batching"),
}


# The answer to a new connection at the cap, written as it is closed unread. With the client's
# request already in the socket the close is a reset, which may make the client's kernel drop this
# answer unread (Linux keeps it); dropped, it is the bare close it replaces, else a scrape error that
# says why.
_REFUSED_BODY = (
    b"connection: expected a free one among the metrics port's, at its limit; got every one busy: try again\n"
)
# The answer to a connection closed to make room for a newer one with a request owed (its first,
# perhaps in the socket, not read yet: a burst of new connections closes some of its own).
_CLOSED_FOR_ROOM_BODY = (
    b"connection: expected its request read; got it closed unread for a newer one, the metrics port at its "
    b"connection limit: try again\n"
)
METRICS_OFF = b"metrics are off: this server runs with --no-metrics\n"


def date_line(now: int) -> bytes:
    """`Date: <IMF-fixdate>\r\n` for the second `now` (RFC 9110 6.6.1: an origin server with a clock
    MUST send Date in its 2xx, 3xx and 4xx answers)."""
    return b"Date: %s\r\n" % formatdate(now, usegmt=True).encode("ascii")


class DateHeader:
    """A server's Date header line, made once a second (`date_line`): /metrics is scraped often,
    and its answer should cost no more than the render it shares. One per server, no module state."""

    def __init__(self) -> None:
        self._second, self._line = -1, b""

    def __call__(self) -> bytes:
        now = int(time.time())
        if now != self._second:
            self._second, self._line = now, date_line(now)
        return self._line


def _turns_faults_off(body) -> bool:
    """Whether a /admin/faults body asks for `mode: off` (the one change taken while draining)."""
    return isinstance(body, dict) and body.get("mode") == "off"


class MetricsHTTPServer:
    def __init__(
        self, registry: CollectorRegistry, host: str, port: int, *, admin: Admin | None = None, metrics: bool = True
    ) -> None:
        self.registry = registry
        # False for a server recording no metrics (`wok serve --no-metrics --admin`): /metrics
        # answers 404 with the reason, as a 200 of zeroed series would read as a server without traffic.
        self.metrics = metrics
        self.admin = admin
        # What a 404 lists as served: those that answer 200 (not /metrics with metrics off).
        served = (["/metrics"] if metrics else []) + ["/"] + ([*ADMIN_ROUTES, "/events"] if admin is not None else [])
        self._served = ", ".join(served)
        self.host = host
        self.port = port
        self._date_header = DateHeader()
        self._server: asyncio.base_events.Server | None = None
        # Each connection's task, and its writer, which stop() aborts.
        self._clients: dict[asyncio.Task, asyncio.StreamWriter] = {}
        # Connections waiting for their next request, a body or the client's close, oldest
        # first, each with whether what it waits for has arrived (then it is not closed to make
        # room: its request would be lost, or, with its body read from the buffer, applied
        # unanswered), and whether it owes an answer (a new connection's first request, or one
        # begun): closed for room, such a one gets a 503; an idle keep-alive one is closed bare,
        # as HTTP lets a server close those (its client asks again on a new connection).
        self._waiting: dict[asyncio.StreamWriter, tuple[Callable[[], bool], bool]] = {}
        # Connections whose answer the client has not taken (over the transport's high-water
        # mark), longest first: a client that pipelines requests and does not read their answers
        # is never waiting, and 64 of them held every slot, WRITE_TIMEOUT_S an answer.
        self._blocked: dict[asyncio.StreamWriter, None] = {}
        self._streams = 0
        # Per body (OpenMetrics or not, and the escaping of its names: `Exposition.body`): its last
        # render (when it began, when it ended, and the body), and the render that scrapes which
        # came sooner wait for, with its timer.
        self._rendered: dict[tuple[bool, str], tuple[float, float, bytes | None]] = {}
        self._due: dict[tuple[bool, str], tuple[asyncio.Future, asyncio.TimerHandle]] = {}
        # The connections' tasks waiting for a due render, which stop() answers before it ends them.
        self._awaiting_render: set[asyncio.Task] = set()
        self._stopping = False
        # Connections closed unanswered at the cap, by why: "refused" (new, none to close for room),
        # "room" (closed for a newer one with a request owed, with a 503), "blocked" (closed for a
        # newer one while its client did not take its answers, one cut short, with no 503: it would
        # wait behind them); and how many of each the warnings have told.
        self._unanswered: dict[str, int] = dict.fromkeys(("refused", "room", "blocked"), 0)
        self._told = dict(self._unanswered)
        self._refusals = WindowedWarning(self._say_unanswered, REFUSED_LOG_EVERY_S)

    async def start(self) -> None:
        # Held before it serves: a start cancelled in its last await (a signal as the server starts)
        # left a port bound and served that stop() did not know of.
        try:
            if _ipv6_any(self.host):
                # "::" is every address of both families, as gRPC takes it; asyncio would make
                # the socket IPv6-only, and an IPv4 scraper would be refused.
                sock = _dual_stack_socket(self.port)
                self._server = await asyncio.start_server(
                    self._accept, sock=sock, limit=MAX_HEADER_BYTES, start_serving=False
                )
            else:
                self._server = await asyncio.start_server(
                    self._accept, self.host, self.port, limit=MAX_HEADER_BYTES, start_serving=False
                )
        except OSError as exc:
            raise OSError(bind_refusal("metrics port", self.host, self.port, exc)) from exc
        self.port = self._server.sockets[0].getsockname()[1]
        await self._server.start_serving()

    async def stop(self) -> None:
        if self._server is None:
            # The port never bound (start raised): nothing served, but the admin, built before the start, is
            # closed all the same (its observers on the model instances, its fault timers).
            self._stopping = True
            if self.admin is not None:
                await self.admin.close()
            return
        # From here no connection is served: one the loop accepted just before the close, whose
        # callback runs later, is closed at once (_accept); else its /events stream, subscribed
        # after the admin's close, outlived the stop, getting ticks from a ticker started again.
        self._stopping = True
        self._server.close()
        # Scrapes waiting for the rate-limited render get it now, of the final figures: cut off,
        # they had no answer at all, and the drain's last counters were never scraped.
        answering = set(self._awaiting_render)
        for body, (_, timer) in list(self._due.items()):
            timer.cancel()
            self._render_due(body)
        if self.admin is not None:
            await self.admin.close()
        if answering:
            await asyncio.wait(answering, timeout=STOP_ANSWER_S)
        # A kept-alive connection may have asked again meanwhile: its render will not come.
        for future, timer in self._due.values():
            timer.cancel()
            future.cancel()
        self._due.clear()
        # Until none is left: one added after a snapshot would outlive the stop (_accept adds
        # none once stopping, but the stop must not rest on that alone).
        while self._clients:
            for task, writer in list(self._clients.items()):
                # Aborted as well as cancelled: on Python 3.11, asyncio.wait_for loses a cancellation
                # that lands as what it waits for completes (seen on uvloop after an answer's drain),
                # and the task would wait out its next read, up to IDLE_TIMEOUT_S.
                writer.transport.abort()
                task.cancel()
            await asyncio.gather(*self._clients, return_exceptions=True)
        await self._server.wait_closed()
        self._refusals.close()  # the refusals still waiting for their window's end

    def _winding_down(self) -> bool:
        """Whether the server stops: this port's stop has begun, or the server's drain has (the
        admin's server's `draining`, WokServer's, set at the stop's first stage; this port stops
        last, so that the last scrape sees the drain)."""
        server = getattr(self.admin, "server", None)
        return self._stopping or getattr(server, "draining", False) is True

    async def _refuse_stopping(self, writer, path: str) -> None:
        await self._json(
            writer, 503, {"error": f"POST {path}: expected a server that serves; got one that is stopping"}, True
        )

    def render(self, body: tuple[bool, str]) -> bytes:
        """The metrics in a format (OpenMetrics or not) and an escaping of names (`Exposition.body`)."""
        om, escaping = body
        if om:
            return openmetrics.generate_latest(self.registry, escaping=escaping)
        return text_format.generate_latest(self.registry, escaping)

    async def scrape(self, accept: str, arrived: float) -> tuple[bytes, str]:
        """The body and Content-Type for `accept` (`negotiate`), from a render begun at or after
        `arrived` (time.monotonic()), at most one per body every RENDER_INTERVAL_S.

        Back-to-back scrapes (pipelined, or from many connections) each rendered on the loop that
        serves gRPC, and stalled inference for as long as they came. A render serves the scrapes
        asking for its body, each labelled as it asked (the text format's 0.0.4 and 1.0.0 in
        underscores share one).
        """
        exposition = negotiate(accept)
        return await self._shared_render(exposition.body, arrived), exposition.content_type

    async def _shared_render(self, body: tuple[bool, str], arrived: float) -> bytes:
        began, ended, answer = self._rendered.get(body, (-1.0, -RENDER_INTERVAL_S, None))
        if answer is not None and began >= arrived:
            return answer
        due = self._due.get(body)
        if due is None:
            wait = ended + RENDER_INTERVAL_S - time.monotonic()
            if wait <= 0:
                return self._render(body)
            loop = asyncio.get_running_loop()
            future = loop.create_future()
            due = self._due[body] = (future, loop.call_later(wait, self._render_due, body))
        task = asyncio.current_task()
        self._awaiting_render.add(task)
        try:
            # Shielded: a waiter cancelled (at stop) must not cancel the render the others wait for.
            return await asyncio.shield(due[0])
        finally:
            self._awaiting_render.discard(task)

    def _render(self, body: tuple[bool, str]) -> bytes:
        began = time.monotonic()
        try:
            answer = self.render(body)
        except Exception:
            self._rendered[body] = (-1.0, time.monotonic(), None)  # failed: counts for the interval
            raise
        self._rendered[body] = (began, time.monotonic(), answer)
        return answer

    def _render_due(self, body: tuple[bool, str]) -> None:
        future, _ = self._due.pop(body)
        try:
            future.set_result(self._render(body))
        except Exception as exc:  # each waiter answers 500 and logs it
            future.set_exception(exc)

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # A plain callback that starts its own task: for a coroutine, asyncio (before 3.12) makes
        # the task and calls its exception() when done, which raises for a task that stop()
        # cancelled, and logs an ERROR traceback for each connection open at a clean stop.
        if self._stopping:
            # Accepted by the loop before stop() closed the socket, its callback run after: the
            # stop has taken its count of connections to end, and would leave this one serving.
            writer.transport.abort()
            return
        if len(self._clients) >= MAX_CONNECTIONS and not self._make_room():
            self._refuse(writer)
            return
        task = asyncio.get_running_loop().create_task(self._serve(reader, writer))
        self._clients[task] = writer
        task.add_done_callback(self._clients.pop)

    def _closing_503(self, body: bytes) -> bytes:
        """A 503 that ends its connection, written whole as it closes (see _REFUSED_BODY)."""
        return (
            b"HTTP/1.1 503 Service Unavailable\r\n%sContent-Type: text/plain\r\nContent-Length: %d\r\n"
            b"Connection: close\r\n\r\n%s" % (self._date_header(), len(body), body)
        )

    def _refuse(self, writer: asyncio.StreamWriter) -> None:
        """Close a new connection that found every slot busy and none to free, and count it for the log."""
        # Just accepted: its buffer is empty, and this small answer leaves at once.
        writer.write(self._closing_503(_REFUSED_BODY))
        writer.close()
        self._closed_unanswered("refused")

    def _closed_unanswered(self, why: str) -> None:
        self._unanswered[why] += 1
        self._refusals.count += 1
        self._refusals.due()

    @property
    def refused(self) -> int:
        """New connections closed at the cap."""
        return self._unanswered["refused"]

    @property
    def unanswered(self) -> dict[str, int]:
        """Connections closed unanswered at the cap, by why (see `_unanswered`)."""
        return dict(self._unanswered)

    def _say_unanswered(self, count: int) -> None:
        new = {why: n - self._told[why] for why, n in self._unanswered.items()}
        self._told = dict(self._unanswered)
        since = " since the last warning"
        parts = []
        if new["refused"]:
            parts.append(
                f"refused {new['refused']} new connection(s) (503, closed){since}: all {MAX_CONNECTIONS} "
                "connections were busy (answering, streaming /events, or just accepted), none idle to close for room"
            )
            since = ""
        if new["room"]:
            # In a burst of new connections, those accepted in one loop pass wait for requests the
            # loop has not read yet, and the next pass's accepts close them for room.
            parts.append(
                f"closed {new['room']} connection(s) for newer ones before their request was read (503){since}: "
                f"more than {MAX_CONNECTIONS} connections at once"
            )
            since = ""
        if new["blocked"]:
            parts.append(
                f"closed {new['blocked']} connection(s) for newer ones while their clients did not take their "
                f"answers (answers cut short, requests unanswered){since}"
            )
        log.warning("metrics port: %s; scrapes among them failed (docs/security.md)", "; ".join(parts))

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self._requests(reader, writer)
            await self._linger(reader, writer)
        except (ConnectionError, asyncio.TimeoutError):
            pass  # the peer went away, or did not read its answer within WRITE_TIMEOUT_S
        finally:
            self._waiting.pop(writer, None)
            writer.close()

    async def _linger(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Half-close, then drop what the client still sends until it closes, or LINGER_S."""
        if writer.is_closing() or not writer.can_write_eof():
            return
        try:
            writer.write_eof()
        except OSError:
            # The client reset the connection as its last answer was written (ENOTCONN, not a
            # ConnectionError, on asyncio's loop): it has gone, and there is nothing to drop.
            return
        self._waiting[writer] = (lambda: False, False)  # it has nothing more to ask: it may make room

        async def discard() -> None:
            while await reader.read(1 << 16):
                pass

        await asyncio.wait_for(discard(), LINGER_S)

    def _make_room(self) -> bool:
        """Close a connection waiting (for a request, a body or the client's close): the one waiting
        longest of those that lose nothing, else of those owed an answer, else of those whose last
        answer is not all sent; else the one blocked longest on a client that does not take its
        answer. False when there is none.

        Without this, idle keep-alive connections (up to IDLE_TIMEOUT_S each), or clients that
        pipeline requests and do not read, could lock Prometheus out of the port. One closed with
        a request owed gets a 503 and is counted in the warning, as a refused new one is: in a
        burst of new connections, those accepted a loop pass before were closed bare, their
        requests in their sockets unread, and no line said why scrapes failed.
        """
        closable = [w for w, (arrived, _) in self._waiting.items() if not arrived()]
        writer = min(closable, key=self._loss, default=None)  # min keeps the first, the oldest, of the least
        if writer is not None:
            _, owed = self._waiting.pop(writer)
            unsent = writer.transport.get_write_buffer_size() > 0
            if owed and not unsent:
                # Closed, not aborted, so that the 503 goes out first; the close ends its read at
                # once all the same (its reader gets the end of stream), and its task checks
                # is_closing before it answers a request read in this pass.
                writer.write(self._closing_503(_CLOSED_FOR_ROOM_BODY))
                writer.close()
                self._closed_unanswered("room")
                return True
            if unsent:
                # Its client has not taken all of an earlier answer: the abort cuts it short, and a
                # 503 would wait behind it.
                self._closed_unanswered("blocked")
        elif self._blocked:
            # Its answer is written (an admin POST's too) and left unread: the client's doing. Its
            # requests still unread are not answered.
            writer = next(iter(self._blocked))
            del self._blocked[writer]
            self._closed_unanswered("blocked")
        else:
            return False
        # Its read (or drain) ends and its task ends; should its bytes arrive in this same loop
        # pass, they are read, but the request is not answered (its task checks is_closing).
        writer.transport.abort()
        return True

    def _loss(self, writer: asyncio.StreamWriter) -> tuple[bool, bool]:
        """What closing a waiting connection for room loses, least first: nothing; a request owed its
        answer (it gets the 503); the end of an answer, still unsent (the abort cuts it short).

        First those that lose nothing, closed bare: no answer owed (idle kept-alive ones, and those
        waiting for their client to close) and all of theirs sent; their clients ask again on a new
        connection. By age alone, a new connection accepted before a kept-alive one's last answer
        had waited longer and got the 503 while the idle one stayed; and an idle one whose client
        had not yet taken its answer's end (under the transport's low-water mark) had it cut short,
        uncounted, while another lost nothing.
        """
        return writer.transport.get_write_buffer_size() > 0, self._waiting[writer][1]

    async def _requests(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        first = True
        # The first `known` bytes in the reader's buffer had all arrived by time `seen`: a
        # request that lies within them (pipelined after an earlier one) arrived by then.
        seen, known = 0.0, 0
        while True:
            # The task reads whole lines, so the buffer starts a line, before the request line
            # perhaps empty ones (or, once the head's first byte is read, the rest of the request
            # line): the head has come when it holds an empty one after a line that is not.
            # Its first request is owed an answer from the accept: its bytes may be in the socket,
            # not read yet; a later one once its first byte comes.
            self._waiting[writer] = (lambda: _head_buffered(_buffered(reader).lstrip(b"\r\n")), first)
            try:
                # A scraper sends its request at once; an idle or trickling client must not hold
                # a socket (and its file descriptor) forever. A kept-alive connection may wait
                # IDLE_TIMEOUT_S for its next request, but once that begins, its head has the
                # HEADER_TIMEOUT_S a new connection's has: under the idle timeout alone, a client
                # trickling a head held its slot for two minutes a request. The empty lines a
                # client may send before it (a CRLF after a POST's body) do not begin it: timed
                # from them, the connection was closed HEADER_TIMEOUT_S after its last request.
                began = time.monotonic()
                start, skipped = await request_start(reader, began + (HEADER_TIMEOUT_S if first else IDLE_TIMEOUT_S))
                if not first:
                    began = time.monotonic()
                if writer in self._waiting:  # not closed to make room meanwhile
                    self._waiting[writer] = (lambda: _head_buffered(_buffered(reader)), True)
                left = began + HEADER_TIMEOUT_S - time.monotonic()
                lines, size = await asyncio.wait_for(read_head(reader, start), left)
                size += skipped
            # Refused before its request line is parsed, a HEAD is known by the method its line
            # starts with (the exception's `method`): its answer carries no body (RFC 9110 9.3.2).
            except TargetTooLong as exc:
                await self._respond(writer, 414, f"{exc}\n".encode(), TEXT, close=True, head=exc.method == "HEAD")
                return
            except HeadTooLarge as exc:
                error = f"request head: expected at most {MAX_HEADER_BYTES} bytes; got more\n".encode()
                await self._respond(writer, 431, error, TEXT, close=True, head=exc.method == "HEAD")
                return
            except BadRequest as exc:
                await self._respond(writer, 400, f"{exc}\n".encode(), TEXT, close=True, head=exc.method == "HEAD")
                return
            except (asyncio.IncompleteReadError, ConnectionError, asyncio.TimeoutError):
                return
            finally:
                self._waiting.pop(writer, None)
            if writer.is_closing():
                return  # closed to make room (or reset) as its request came: nobody to answer
            if size <= known:
                arrived, known = seen, known - size
            else:
                arrived = seen = time.monotonic()
                known = len(_buffered(reader))
            first = False
            try:
                method, target, version = request_line(lines[0])
            except BadRequest as exc:
                await self._respond(writer, 400, f"{exc}\n".encode(), TEXT, close=True, head=exc.method == "HEAD")
                return
            head = method == "HEAD"
            refused = version_refusal(version)
            if refused is not None:
                status, error = refused
                await self._respond(writer, status, f"{error}\n".encode(), TEXT, close=True, head=head)
                return
            old = version == "HTTP/1.0"
            fields: dict[str, list[str]] = {}
            try:
                for number, line in enumerate(lines[1:], 1):
                    name, value = header_field(number, line)
                    fields.setdefault(name, []).append(value)
            except BadRequest as exc:
                await self._respond(writer, 400, f"{exc}\n".encode(), TEXT, close=True, head=head)
                return
            headers = {name: values[-1] for name, values in fields.items()}
            repeated = [(name, fields[name]) for name in ("content-length", "host") if len(fields.get(name, ())) > 1]
            if repeated:
                # Two lengths frame the body two ways: a proxy in front may read it by the other
                # one, and the rest as a request of its own (RFC 9112 6.3). Even equal repeats are
                # refused: no client sends them. Two Hosts may be read apart likewise (RFC 9112 3.2).
                name, values = repeated[0]
                error = f"{name.title()}: expected one header; got {len(values)}: {', '.join(map(quoted, values))}\n"
                await self._respond(writer, 400, error.encode(), TEXT, close=True, head=head)
                return
            if "transfer-encoding" in fields:
                # No chunked bodies here; and a request framed both ways must not be read by its
                # Content-Length, the other end of a proxy may read it by the other (RFC 9112 6.1).
                status, error = transfer_coding_refusal(fields["transfer-encoding"], version)
                await self._respond(writer, status, f"{error}\n".encode(), TEXT, close=True, head=head)
                return
            if "host" not in headers and not old:
                # RFC 9112 3.2 (a MUST): HTTP/1.0 predates Host; an HTTP/1.1 client always sends it,
                # and the admin paths' cross-site check reads it.
                error = b"Host: expected one header; got none (RFC 9112 3.2)\n"
                await self._respond(writer, 400, error, TEXT, close=True, head=head)
                return
            if "host" in headers and not valid_host(headers["host"]):
                # RFC 9112 3.2 (a MUST). Served, `Host: a b` or `Host: x/y` reached the admin
                # paths' cross-site check, and a proxy in front may read another name from it.
                error = f"Host: expected {HOST_SHAPE}; got {quoted(headers['host'])}\n"
                await self._respond(writer, 400, error.encode(), TEXT, close=True, head=head)
                return
            length = headers.get("content-length")
            if length is not None and not re.fullmatch(r"[0-9]+", length):
                # Not a number of bytes ("-1", "2, 2", "0x2", none at all): where the body ends is
                # unknown, and a proxy in front may have framed it otherwise (RFC 9112 6.3).
                error = f"Content-Length: expected a number of bytes; got {quoted(length)}\n"
                await self._respond(writer, 400, error.encode(), TEXT, close=True, head=head)
                return
            if old:
                # HTTP/1.0 has no Expect; its client does not wait for a 100 (RFC 9110 10.1.1).
                fields.pop("expect", None)
                headers.pop("expect", None)
            unmet = expect_refusal(fields.get("expect", ()))
            if unmet is not None:
                await self._respond(writer, 417, f"{unmet}\n".encode(), TEXT, close=True, head=head)
                return
            # A list of options (RFC 9110 7.6.1): "TE, close" asks to close as "close" does.
            close = "close" in connection_options(fields.get("connection", ())) or old
            try:
                path, authority = request_target(target)
            except BadRequest as exc:
                await self._respond(writer, 400, f"{exc}\n".encode(), TEXT, close=True, head=head)
                return
            # Only a POST to an admin route reads its body: after any other request that has
            # one, the connection ends, or the body's bytes would be read as the next request.
            has_body = bool(length and length.lstrip("0"))
            if has_body:
                close = close or not (method == "POST" and path in ADMIN_ROUTES)
            try:
                keep = await self._dispatch(reader, writer, method, path, headers, close, arrived, authority)
            except (ConnectionError, asyncio.TimeoutError):
                raise  # the peer went away: nobody to answer
            except Exception:
                await self._internal_error(writer, method, path, head=method == "HEAD")
                return
            if not keep:
                return
            if has_body:
                known = 0  # a body was read from the buffer's front: the count no longer holds

    async def _dispatch(
        self, reader, writer, method: str, path: str, headers: dict, close: bool, arrived: float, authority: str | None
    ) -> bool:
        """Answer one request; False when the connection must end. `authority`: an absolute-form
        target's (RFC 9112 3.2.2: it names the host asked for, and Host is ignored), which the admin
        paths' cross-site check reads in Host's place."""
        head = method == "HEAD"
        if path.startswith("/admin/") or path == "/events":
            if self.admin is None:  # off: as if absent; an unread body ends the connection
                error = self._not_found(path, "the admin API is off: `wok serve --admin` serves it")
                await self._respond(writer, 404, error.encode(), TEXT, close=True, head=head)
                return False
            refusal = cross_site_refusal(headers, authority)
            if refusal is not None:
                await self._json(writer, 403, {"error": refusal}, close=True, head=head)
                return False
            return await self._admin(reader, writer, method, path, headers, close)
        if path not in ("/metrics", "/"):
            # Whatever the method: a 405 would say that the resource exists (RFC 9110 15.5.6).
            await self._respond(writer, 404, self._not_found(path).encode(), TEXT, close=close, head=head)
        elif method not in ("GET", "HEAD"):
            error = f"{quoted(path)}: expected GET or HEAD; got {quoted(method)}\n".encode()
            await self._respond(writer, 405, error, TEXT, close=close, allow="GET, HEAD")
        elif path == "/metrics" and not self.metrics:
            await self._respond(writer, 404, METRICS_OFF, TEXT, close=close, head=head)
        elif path == "/metrics":
            body, ctype = await self.scrape(headers.get("accept", ""), arrived)
            # At stop the connection ends after this answer: its client then closes, and stop()
            # need not wait out its next request.
            close = close or self._stopping
            await self._respond(writer, 200, body, ctype, close=close, head=head)
        else:
            root = b"wok: metrics at /metrics\n" if self.metrics else METRICS_OFF
            await self._respond(writer, 200, root, TEXT, close=close, head=head)
        return not close

    async def _admin(self, reader, writer, method: str, path: str, headers: dict, close: bool) -> bool:
        """Answer one admin request; False when the connection must end (a stream, a bad body)."""
        admin = self.admin
        head = method == "HEAD"
        if path == "/events":
            if method != "GET":  # a HEAD would open a stream with no body to carry it
                error = f"'/events': expected GET; got {quoted(method)}\n".encode()
                await self._respond(writer, 405, error, TEXT, close=True, head=head, allow="GET")
                return False
            if self._stopping:
                # The admin has closed (or is closing): a stream now would outlive the stop.
                await self._json(
                    writer, 503, {"error": "GET /events: expected a server that serves; got one that is stopping"}, True
                )
                return False
            if self._streams >= MAX_EVENT_STREAMS:
                await self._json(
                    writer,
                    503,
                    {
                        "error": f"GET /events: expected fewer than {MAX_EVENT_STREAMS} streams open; "
                        f"got {self._streams}"
                    },
                    True,
                )
                return False
            await self._stream_events(writer)
            return False
        if path not in ADMIN_ROUTES:
            await self._json(writer, 404, {"error": self._not_found(path).rstrip("\n")}, close, head=head)
            return not close
        get, post = (getattr(admin, name) for name in ADMIN_ROUTES[path])
        if method in ("GET", "HEAD"):
            await self._json(writer, 200, get(), close, head=head)
            return not close
        if method != "POST":
            error = {"error": f"{quoted(path)}: expected GET, HEAD or POST; got {quoted(method)}"}
            await self._json(writer, 405, error, close=True, allow="GET, HEAD, POST")
            return False
        if self._stopping:  # the drain is over: nothing left to change; the body is not read
            await self._refuse_stopping(writer, path)
            return False
        error = json_content_type_refusal(
            headers.get("content-type", ""),
            lambda got: f"Content-Type: expected application/json for a POST; got {quoted(got) if got else 'none'}",
        )
        if error is not None:
            await self._json(writer, 415, {"error": error}, close=True)
            return False
        length = headers.get("content-length")  # digits alone, or absent: _requests refused the rest
        if length is None:
            error = "Content-Length: expected one header for a POST; got none"
            await self._json(writer, 411, {"error": error}, close=True)
            return False
        # Leading zeros are dropped before int(), which refuses over 4,300 digits; a header may hold 16 KiB.
        digits = length.lstrip("0")
        if len(digits) > len(str(MAX_BODY_BYTES)) or int(digits or "0") > MAX_BODY_BYTES:
            error = f"Content-Length: expected at most {MAX_BODY_BYTES} bytes; got {quoted(length)}"
            await self._json(writer, 413, {"error": error}, close=True)
            return False
        size = int(digits or "0")
        if headers.get("expect", "").lower() == "100-continue" and size > 0:
            # Its client waits for this before it sends the body (curl for a second, then sends
            # it anyway). Asked only now that the request is acceptable: one refused above had
            # its final answer instead, and its body need not come.
            await self._send(writer, CONTINUE)
        # Waiting for its body, a connection may make room like an idle one: else connections
        # that send headers and no body could hold every slot, Prometheus's too, for
        # HEADER_TIMEOUT_S.
        self._waiting[writer] = (lambda: len(_buffered(reader)) >= size, True)
        try:
            raw = await asyncio.wait_for(reader.readexactly(size), HEADER_TIMEOUT_S)
        except asyncio.IncompleteReadError as exc:
            # The client closed its side early; or the connection made room before its body
            # came (then the answer finds it closed, and nothing is sent).
            error = f"body: expected Content-Length {size} bytes; got {len(exc.partial)} bytes and end of stream"
            await self._json(writer, 400, {"error": error}, close=True)
            return False
        except asyncio.TimeoutError:
            error = f"body: expected Content-Length {size} bytes within {HEADER_TIMEOUT_S:g} s; got fewer"
            await self._json(writer, 408, {"error": error}, close=True)
            return False
        finally:
            self._waiting.pop(writer, None)
        if writer.is_closing():
            # Closed as its body came (to make room, or reset): applied, the change would have
            # no answer, and its client would not know that it took.
            return False
        error = json_encoding_refusal(raw)
        if error is not None:
            await self._json(writer, 415, {"error": error}, close)
            return not close
        try:
            body = json.loads(raw)
        except ValueError as exc:
            # JSONDecodeError and UnicodeDecodeError are ValueErrors, and so is the refusal of an
            # integer over Python's 4,300-digit conversion limit.
            await self._json(writer, 400, {"error": f"body: expected JSON; got a parse error: {exc}"}, close)
            return not close
        except RecursionError:
            await self._json(writer, 400, {"error": "body: expected JSON; got one nested too deeply"}, close)
            return not close
        if self._stopping or (self._winding_down() and not (path == "/admin/faults" and _turns_faults_off(body))):
            # Checked once the body is in: its headers may have come before the stop began. A
            # change now (a fault, a batching policy) would act on the drain; turning faults off
            # only helps it finish, and is the one change taken.
            await self._refuse_stopping(writer, path)
            return False
        try:
            answer = post(body)
        except AdminRequestError as exc:
            await self._json(writer, 400, {"error": str(exc)}, close)
            return not close
        log.warning("admin: %s %s", path, json.dumps(body))
        await self._json(writer, 200, answer, close)
        return not close

    def _not_found(self, path: str, why: str = "") -> str:
        """A 404's body: the path asked for (quoted, capped) and those served; "not found" alone
        left a scraper's typo (/metric, /metrics/) to be guessed at."""
        return f"no path {quoted(path)} here{f' ({why})' if why else ''}; paths: {self._served}\n"

    async def _internal_error(self, writer, method: str, path: str, *, head: bool = False) -> None:
        """Answer a request's unexpected exception (the one being handled) with 500, and log it.

        Left to asyncio, it would end the connection with no answer at all. The connection ends:
        what the handler changed before it failed is unknown.
        """
        log.exception("%s %s failed", method, path)
        error = {"error": f"{method} {path}: internal error; see the server's log"}
        await self._json(writer, 500, error, True, head=head)

    async def _stream_events(self, writer) -> None:
        # Subscribed before the header goes out, so that a failure to subscribe still answers 500.
        sub = self.admin.subscribe()
        self._streams += 1
        try:
            _write(
                writer,
                b"HTTP/1.1 200 OK\r\n" + self._date_header() + b"Content-Type: text/event-stream\r\n"
                b"Cache-Control: no-cache\r\nConnection: close\r\n\r\n",
            )
            try:
                while True:
                    event = await sub.queue.get()
                    chunk = [b"data: " + dumps(event) + b"\n\n"]
                    while not sub.queue.empty() and len(chunk) < 256:
                        chunk.append(b"data: " + dumps(sub.queue.get_nowait()) + b"\n\n")
                    await self._send(writer, b"".join(chunk))
            except (ConnectionError, asyncio.TimeoutError):
                raise  # the peer went away: nobody to tell
            except Exception:
                # The 200 is out and the body is the stream: a 500 now would land inside it as
                # event data. The stream ends instead, with a comment line (an EventSource skips
                # it, then reconnects).
                log.warning("GET /events: the event stream failed after its header; it ends here", exc_info=True)
                await self._send(writer, b": error: the stream failed; see the server's log\n\n")
        finally:
            self._streams -= 1
            self.admin.unsubscribe(sub)

    async def _json(self, writer, status: int, obj, close: bool, *, head: bool = False, allow: str = "") -> None:
        await self._respond(writer, status, dumps(obj) + b"\n", JSON, close=close, head=head, allow=allow)

    async def _respond(
        self, writer, status: int, body: bytes, ctype: str, *, close: bool, head: bool = False, allow: str = ""
    ) -> None:
        """Send one answer; `allow` (the methods the path takes) goes with a 405, as RFC 9110 15.5.6 asks."""
        reason = REASONS[status]
        header = (
            f"Content-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
            + (f"Allow: {allow}\r\n" if allow else "")
            + f"Connection: {'close' if close else 'keep-alive'}\r\n\r\n"
        )
        status_line = f"HTTP/1.1 {status} {reason}\r\n".encode("latin-1")
        await self._send(writer, status_line + self._date_header() + header.encode("latin-1") + (b"" if head else body))

    async def _send(self, writer: asyncio.StreamWriter, data: bytes) -> None:
        """Write, then wait for the client to take it; while it does not, the connection may make room."""
        _write(writer, data)
        transport = writer.transport
        blocked = transport.get_write_buffer_size() > transport.get_write_buffer_limits()[1]
        if blocked:
            self._blocked[writer] = None
        try:
            await _drain(writer)
        finally:
            if blocked:
                self._blocked.pop(writer, None)


class BadRequest(ValueError):
    """A request head this server refuses (400, and the connection ends); the message names the line.
    `method`: the request's as far as its line was read (`request_method`), "" when unknown, for the
    refusal of a HEAD to carry no body (RFC 9110 9.3.2)."""

    def __init__(self, message: str, method: str = "") -> None:
        super().__init__(message)
        self.method = method


class HeadTooLarge(asyncio.LimitOverrunError):
    """A request head over MAX_HEADER_BYTES (431); `method` as BadRequest's."""

    def __init__(self, message: str, consumed: int, method: str = "") -> None:
        super().__init__(message, consumed)
        self.method = method


class TargetTooLong(HeadTooLarge):
    """A request line over MAX_HEADER_BYTES by itself: its target is too long (414, RFC 9112 3), not
    its header fields (431), which a client that made its URL too long (a browser, curl) was told."""

    def __init__(self, consumed: int, method: str = "") -> None:
        super().__init__(
            f"request line: expected at most {MAX_HEADER_BYTES} bytes; got more: its target is too long",
            consumed,
            method,
        )


# The bytes of a request line read for its method when the line is too long to read whole: past
# the longest method a server may know (RFC 9110's are at most 7 characters).
METHOD_PEEK = 32


def request_method(line: str) -> str:
    """The method a request line (or its start) names: its text before the first space when that is
    a token, else "" (no space in it yet, or no method)."""
    method, space, _ = line.partition(" ")
    return method if space and TOKEN.fullmatch(method) else ""


async def read_head(reader: asyncio.StreamReader, start: bytes = b"") -> tuple[list[str], int]:
    """A request's head: its request line and header lines, without line ends, and its size in bytes.

    `start` is its first bytes, already read. Each line must end in CRLF. RFC 9112 2.2 lets a
    server take a bare LF as a line end too, but a proxy in front that does not would read other
    headers, or another request, from the same bytes; refused at once, it cannot wait for a CRLF
    CRLF that never comes (HEADER_TIMEOUT_S). The empty lines before the request line are
    `request_start`'s. HeadTooLarge past MAX_HEADER_BYTES: TargetTooLong when the request line
    alone is past it. Each refusal carries the request's method as far as its line was read.
    """
    lines: list[str] = []
    size = 0
    method = ""  # the request's, once its line is read
    while True:
        try:
            raw = start if start.endswith(b"\n") else start + await reader.readuntil(b"\n")
        except asyncio.LimitOverrunError as exc:  # past the reader's limit, no line end in it
            if lines:
                raise HeadTooLarge(str(exc), exc.consumed, method) from None
            # readuntil left the line in the buffer: its method is at its start.
            line_start = start + bytes(_buffered(reader)[:METHOD_PEEK])
            raise TargetTooLong(exc.consumed, request_method(line_start.decode("latin-1"))) from None
        start = b""
        size += len(raw)
        line = raw[:-1].decode("latin-1")
        if not lines:
            method = request_method(line)
        if size > MAX_HEADER_BYTES:
            if not lines:
                raise TargetTooLong(size, method)
            raise HeadTooLarge(f"request head: expected at most {MAX_HEADER_BYTES} bytes; got more", size, method)
        where = f"header line {len(lines)}" if lines else "request line"
        if not line.endswith("\r"):
            raise BadRequest(f"{where}: expected CRLF at its end; got a bare LF: {quoted(line)}", method)
        line = line[:-1]
        if "\r" in line:
            raise BadRequest(f"{where}: expected CR only before its LF; got a bare CR: {quoted(line)}", method)
        if not line and lines:
            return lines, size
        lines.append(line)


async def request_start(reader: asyncio.StreamReader, deadline: float) -> tuple[bytes, int]:
    """A request's first bytes, read by `deadline` (time.monotonic()), past the empty lines (CRLF)
    before it, and the size of those. Up to MAX_EMPTY_LINES are skipped (RFC 9112 2.2); a bare LF
    or CR is returned as the start, for `read_head` to refuse."""
    skipped = 0
    while True:
        start = await asyncio.wait_for(reader.readexactly(1), deadline - time.monotonic())
        if start == b"\r":
            start += await asyncio.wait_for(reader.readexactly(1), deadline - time.monotonic())
        if start != b"\r\n":
            return start, skipped
        skipped += len(start)
        if skipped > 2 * MAX_EMPTY_LINES:
            raise BadRequest(f"request line: expected one within {MAX_EMPTY_LINES} empty lines; got more")


def request_line(line: str) -> tuple[str, str, str]:
    """A request line's method, target and version (RFC 9112 3); BadRequest naming what is wrong.

    A method that is not a token, or an empty one or target, was served (405 "only GET", or 404
    for the path ""), as though the request were well formed.
    """
    parts = line.split(" ")
    if len(parts) != 3:
        raise BadRequest(
            f"request line: expected a method, a target and a version separated by single spaces; got {quoted(line)}",
            request_method(line),
        )
    method, target, version = parts
    if not TOKEN.fullmatch(method):
        raise BadRequest(f"request line: expected a method (a token); got {quoted(method)}")
    if not target:
        raise BadRequest(f"request line: expected a request target; got none: {quoted(line)}", method)
    return method, target, version


# The interim answer to `Expect: 100-continue` (RFC 9110 10.1.1), sent once a request with a body is
# found acceptable, before the body is read.
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


def expect_refusal(values) -> str | None:
    """The message refusing a request's Expect fields (417), one value a field line, each `quoted`
    as every refusal shows what a request sent, or None when each asks for 100-continue, the one
    expectation met (CONTINUE before the body is read).

    Ignored, another expectation would leave its client waiting for what it expects, its body, if
    any, unread. HTTP/1.0 has no Expect, its client waits for no 100 (RFC 9110 10.1.1): the caller
    drops its fields first.
    """
    unmet = [value for value in values if value.lower() != "100-continue"]
    return f"Expect: expected 100-continue; got {', '.join(map(quoted, unmet))}" if unmet else None


def version_refusal(version: str) -> tuple[int, str] | None:
    """The status and message refusing a request line's version (400 for one that is not
    HTTP/<digit>.<digit>, 505 for another major than 1), or None for HTTP/1.x: a later HTTP/1
    minor is read as 1.1 (RFC 9110 2.5); another major is not HTTP/1."""
    numbered = VERSION.fullmatch(version)
    if numbered is None:
        return 400, f"request line: expected HTTP/<digit>.<digit> as its version; got {quoted(version)}"
    if numbered[1] != "1":
        return (
            505,
            f"request line: expected HTTP/1.x as its version (this server speaks HTTP/1.1); got {quoted(version)}",
        )
    return None


# A transfer coding (RFC 9112 7): a token, then its parameters, `;name=value` with a token or a
# quoted string as the value, whitespace allowed around the "=" (BWS).
_QUOTED_STRING = r'"(?:[^"\\]|\\.)*"'
CODING = re.compile(
    rf"{TOKEN.pattern}(?:[ \t]*;[ \t]*{TOKEN.pattern}[ \t]*=[ \t]*(?:{TOKEN.pattern}|{_QUOTED_STRING}))*"
)


def connection_options(values) -> set[str]:
    """The options of a request's Connection field lines (their values), in lower case: one list
    of them all (RFC 9110 7.6.1, 5.3), split outside quoted strings as every list here is. Only
    the last line was read, so `Connection: close` then `Connection: TE` kept the connection; and a
    comma in a quoted string (`x="a,close"`) split an option out of it."""
    return {o.strip(OWS).lower() for value in values for o in split_unquoted(value, ",")} - {""}


def transfer_coding_refusal(values, version: str) -> tuple[int, str]:
    """The status and message refusing a request's Transfer-Encoding (its field lines' values):
    this server reads a body by its Content-Length alone, and a request framed both ways must not
    be read one way here and the other by a proxy in front (RFC 9112 6.1). The connection ends.

    501 Not Implemented when the request is framed, by a coding this server does not implement:
    well-formed codings, chunked the last and only once (RFC 9112 6.1: a server SHOULD answer 501
    to a transfer coding it does not understand). 400 when its framing is faulty: in an HTTP/1.0
    request (RFC 9112 6.1, a MUST, with a Content-Length or not), a list that is not of codings,
    or one whose last coding is not chunked (RFC 9112 6.3, a MUST: the body's length is unknown).
    It was 400 for every one, which read as a malformed request where it was a well-formed one
    this server does not take.
    """
    shown = ", ".join(map(quoted, values))
    if version == "HTTP/1.0":
        return 400, f"Transfer-Encoding: expected none in an HTTP/1.0 request (RFC 9112 6.1); got {shown}"
    # Empty list elements are ignored (RFC 9110 5.6.1). Split at every comma, one in a quoted
    # parameter value (`gzip;q="a,b", chunked`) made a well-formed list malformed, a 400.
    codings = [c.strip(OWS) for value in values for c in split_unquoted(value, ",") if c.strip(OWS)]
    if not all(CODING.fullmatch(c) for c in codings):
        return 400, f"Transfer-Encoding: expected a list of transfer codings (RFC 9112 7); got {shown}"
    names = [c.split(";", 1)[0].rstrip(OWS).lower() for c in codings]
    if names.count("chunked") != 1 or names[-1] != "chunked":
        return 400, (
            f"Transfer-Encoding: expected chunked as the last coding, and once (RFC 9112 6.3: else where "
            f"the body ends is unknown); got {shown}"
        )
    return 501, (
        "Transfer-Encoding: expected none, since this server reads a body by its Content-Length alone (RFC 9112 "
        f"6.1): send one; got {shown}"
    )


# What /metrics offers: OpenMetrics and the Prometheus text format, as media types (RFC 9110 8.3.1).
_OPENMETRICS = ("application", "openmetrics-text")
_PROMETHEUS_TEXT = ("text", "plain")
# The OpenMetrics version `render` writes (openmetrics.generate_latest's, its CONTENT_TYPE_LATEST's).
OPENMETRICS_VERSION = "1.0.0"
# A weight (RFC 9110 12.4.2): 0 to 1, at most three decimals.
QVALUE = re.compile(r"0(?:\.[0-9]{0,3})?|1(?:\.0{0,3})?")
# The escaping schemes of metric and label names a scraper may ask for (Prometheus 3's `escaping`
# parameter), as prometheus_client and client_golang spell them; any other value asks for underscores.
ESCAPINGS = (openmetrics.UNDERSCORES, openmetrics.ALLOWUTF8, openmetrics.DOTS, openmetrics.VALUES)


# The Prometheus text format's labels, as prometheus_client's choose_encoder writes them: 0.0.4 by
# default (its names escaped as underscores), 1.0.0 for a scraper that asks for it (from 1.0.0 up),
# followed by the escaping its names are written in. An OpenMetrics range naming its version gets
# OPENMETRICS_WITH_ESCAPING, one naming none openmetrics.CONTENT_TYPE_LATEST.
TEXT_FORMAT_0_0_4 = "text/plain; version=0.0.4; charset=utf-8"
TEXT_FORMAT_1_0_0 = "text/plain; version=1.0.0; charset=utf-8; escaping="
OPENMETRICS_WITH_ESCAPING = f"application/openmetrics-text; version={OPENMETRICS_VERSION}; charset=utf-8; escaping="


class MediaRange(NamedTuple):
    """One of Accept's media ranges: in lower case but its parameters' values, which are unquoted."""

    kind: str
    sub: str
    weight: float
    version: str | None
    escaping: str | None


class Exposition(NamedTuple):
    """What a scrape is answered with: the format, the escaping its names are written in (these two
    make the body, `MetricsHTTPServer.render`), and its Content-Type."""

    openmetrics: bool
    escaping: str
    content_type: str

    @property
    def body(self) -> tuple[bool, str]:
        return self.openmetrics, self.escaping


@functools.lru_cache(maxsize=32)  # a scraper sends the same Accept every time
def _media_ranges(accept: str) -> tuple[MediaRange, ...]:
    """Accept's media ranges: those that are type/subtype (`*/*` and type/* too) with a weight that
    is a qvalue (q, 1 when not given). Commas and semicolons in a quoted parameter value separate
    nothing (RFC 9110 5.6.4)."""
    ranges = []
    for media_range in split_unquoted(accept, ","):
        media, *params = split_unquoted(media_range, ";")
        kind, slash, sub = media.strip(OWS).lower().partition("/")
        if not (slash and TOKEN.fullmatch(kind) and TOKEN.fullmatch(sub)) or (kind == "*" and sub != "*"):
            continue
        weight = 1.0
        version = escaping = None
        for param in params:
            name, _, value = param.partition("=")
            name, value = name.strip(OWS).lower(), value.strip(OWS)
            if name == "q":
                weight = float(value) if QVALUE.fullmatch(value) else -1.0
            elif name == "version":
                version = unquoted(value)
            elif name == "escaping":
                escaping = unquoted(value)
        if weight >= 0:
            ranges.append(MediaRange(kind, sub, weight, version, escaping))
    return tuple(ranges)


@functools.lru_cache(maxsize=32)
def negotiate(accept: str) -> Exposition:
    """What a scrape with this Accept is answered with: OpenMetrics when Accept weighs it above the
    Prometheus text format (the default), else the text format, labelled and escaped as
    prometheus_client's choose_encoder labels and escapes it for the range chosen.

    RFC 9110 12.5.1: each of the two gets the weight (q, 1 when not given) of the most specific
    media range that names it (type/subtype with the version served, then type/subtype, then
    type/*, then */*; of ranges as specific, the highest), 0 when none names it: not acceptable.
    OpenMetrics when its weight is above 0 and above the text format's, or equal and given to it by
    name (`application/openmetrics-text, text/plain`). A range that is not type/subtype, or whose
    weight is not a qvalue (`q=2`, `q=.5`), is skipped. No Accept, or one naming neither: the text
    format.

    choose_encoder reads no weight: it takes the first OpenMetrics range, or text/plain range asking
    for 1.0.0 up, in Accept's order, `q=0` ("not acceptable") too, where this server takes the one
    weighed highest, as client_golang's expfmt.Negotiate does (goautoneg.ParseAccept orders the
    ranges by q). Every Accept Prometheus sends (2.x, 3.x, each scrape_protocols) lists its ranges
    by falling q, and gets here what choose_encoder chooses (tests/server/test_http_accept.py).

    An OpenMetrics range's `version` names the one asked for: one other than OPENMETRICS_VERSION,
    the one written, does not name what is served, and is skipped, as choose_encoder skips 0.0.1
    (Prometheus offers it below 1.0.0). choose_encoder labels its 1.0.0 text with any version from
    1.0.0 up (9.9.9 too) and fails on one not numeric; here each gets the text format unless another
    range takes OpenMetrics. The text format's version does not weigh it: it decides the text's
    label alone (`_text_format`).

    `escaping` (underscores, allow-utf-8, dots, values; another value or none is underscores) is read
    from the range chosen where choose_encoder reads it: an OpenMetrics range naming its version, a
    text/plain range asking for 1.0.0 up; the Content-Type names it, and the names are written in
    it. But OpenMetrics asked for in `values` is written in underscores: prometheus_client's
    OpenMetrics writer prefixes every sample's name with `U__` (`U__wok__responses__total` under
    `# TYPE wok_responses counter`: a sample of no family), where `values`, as client_golang's
    model.EscapeName writes it, leaves a legacy name as it is, and every name wok writes is one
    (`[a-zA-Z_][a-zA-Z0-9_]*`), written alike in underscores.
    """
    # Per format: (specificity, weight) and the range that gave them.
    best: dict[tuple[str, str], tuple[tuple[int, float], MediaRange | None]] = {
        _OPENMETRICS: ((-1, 0.0), None),
        _PROMETHEUS_TEXT: ((-1, 0.0), None),
    }
    for media_range in _media_ranges(accept):
        kind, sub, weight, version, _ = media_range
        for offered in best:
            if (kind, sub) == offered:
                specificity = 2
                if offered == _OPENMETRICS and version is not None:
                    if version != OPENMETRICS_VERSION:
                        continue  # another version: this range does not name what is served
                    specificity = 3
            elif (kind, sub) == (offered[0], "*"):
                specificity = 1
            elif (kind, sub) == ("*", "*"):
                specificity = 0
            else:
                continue
            if (specificity, weight) > best[offered][0]:
                best[offered] = ((specificity, weight), media_range)
    ((om_named, om), om_range), ((_, text), _) = best[_OPENMETRICS], best[_PROMETHEUS_TEXT]
    if not (om > 0 and (om > text or (om == text and om_named >= 2))):
        return _text_format(accept)
    if om_named < 3:  # no version named: choose_encoder labels no escaping, and writes underscores
        return Exposition(True, openmetrics.UNDERSCORES, openmetrics.CONTENT_TYPE_LATEST)
    escaping = _escaping(om_range)
    return Exposition(True, _written(escaping), OPENMETRICS_WITH_ESCAPING + escaping)


def _text_format(accept: str) -> Exposition:
    """The text format served for `accept`: 1.0.0 when the text/plain range weighed highest (the
    first of those as high; q=0 ones are not acceptable) names a version from 1.0.0 up, as numbers
    (`1.0.0`, `2`), in that range's escaping, else 0.0.4 in underscores, prometheus_client's default.

    choose_encoder takes the first text/plain range with a version from 1.0.0 up, whatever its
    weight, and fails on one not numeric (here 0.0.4)."""
    named = [r for r in _media_ranges(accept) if (r.kind, r.sub) == _PROMETHEUS_TEXT]
    chosen = max(named, key=lambda r: r.weight, default=None)  # max: the first of the highest
    version = chosen.version if chosen is not None and chosen.weight > 0 else None
    numeric = version is not None and re.fullmatch(r"[0-9]+(?:\.[0-9]+)*", version)
    if not numeric or tuple(map(int, version.split("."))) < (1, 0, 0):
        return Exposition(False, openmetrics.UNDERSCORES, TEXT_FORMAT_0_0_4)
    escaping = _escaping(chosen)
    return Exposition(False, _written(escaping), TEXT_FORMAT_1_0_0 + escaping)


def _written(escaping: str) -> str:
    """The escaping a body is rendered in for the one asked for: every name wok writes is a legacy
    name, written alike in underscores, allow-utf-8 and values (and prometheus_client's OpenMetrics
    writer gets `values` wrong, see `negotiate`), so those share one render, and a scraper cycling
    through them cannot make the loop render more than twice per format every RENDER_INTERVAL_S."""
    return openmetrics.DOTS if escaping == openmetrics.DOTS else openmetrics.UNDERSCORES


def _escaping(media_range: MediaRange) -> str:
    """The escaping scheme a range asks for: its `escaping` when one of ESCAPINGS (matched as
    written, as choose_encoder and client_golang match it), else underscores."""
    return media_range.escaping if media_range.escaping in ESCAPINGS else openmetrics.UNDERSCORES


def request_target(target: str) -> tuple[str, str | None]:
    """A request target's path, without its query, and its authority: None for the origin form
    (`/metrics`), the URL's host and port for the absolute form (`http://host:port/metrics`).

    RFC 9112 3.2.2: a server MUST accept the absolute form, which clients send to proxies, and some
    proxies pass on; it got 404. Another target (`*`, another scheme) is taken as a path, to which
    nothing answers. BadRequest for an http URL with no host or with userinfo (RFC 9110 4.2.1, 4.2.4).
    """
    if target[:7].lower() != "http://":
        return target.split("?", 1)[0], None
    try:
        url = urlsplit(target)
    except ValueError as exc:  # a bracket left open ("http://[::1/")
        raise BadRequest(f"request target: expected an http URL; got {quoted(target)}: {exc}") from None
    if not url.netloc or "@" in url.netloc or url.netloc[0] == ":":
        raise BadRequest(f"request target: expected an http URL with a host and no userinfo; got {quoted(target)}")
    if not valid_host(url.netloc):
        # It takes Host's place (the admin paths' cross-site check reads it), and is held to Host's shape.
        raise BadRequest(
            f"request target: expected an http URL whose authority is {HOST_SHAPE}; got {quoted(url.netloc)}"
        )
    return url.path or "/", url.netloc


# How a 400 for a Host (or an absolute-form target's authority) names what it expected.
HOST_SHAPE = "host[:port] (a name, an IPv4 address or a bracketed IPv6 one; RFC 9110 7.2)"


def valid_host(value: str) -> bool:
    """Whether `value` is `uri-host [":" port]` (RFC 9110 7.2, RFC 3986 3.2.2; see HOST)."""
    match = HOST.fullmatch(value)
    if match is None:
        return False
    literal = match[2]
    if literal is None or IP_FUTURE.fullmatch(literal):
        return True
    address, percent, zone = literal.partition("%")
    if percent and not ZONE.fullmatch(percent + zone):
        return False
    try:
        ipaddress.IPv6Address(address)
    except ValueError:
        return False
    return True


def quoted(text: str) -> str:
    """A value a request sent (a header's, a path, a line of its head), as an answer shows it:
    errors.quoted_name's form, escaped in ASCII. In quotes as it is when it is all printable ASCII,
    else with backslashes and every other character escaped (\\x1b, \\xe9: the head is read as
    Latin-1, a byte a character, so a UTF-8 é shows as the two bytes sent, \\xc3\\xa9; text from
    elsewhere, \\u2026); past NAME_CHARS, its start and its length (errors.CUT_NOTE, in characters:
    a head's are its bytes), so that a 16 KiB path makes no 16 KiB answer.

    A malformed line was shown by its repr, which keeps printable Latin-1 (é, a no-break space): it
    went out raw, a byte that is not UTF-8 in the answer, and cut past 120 characters its own way."""
    shown = text[:NAME_CHARS]
    if not (shown.isascii() and shown.isprintable()):
        shown = "".join(
            c if " " <= c <= "~" and c != "\\" else repr(c)[1:-1] if c < "\x80" else _escaped(c) for c in shown
        )
    if len(text) <= NAME_CHARS:
        return f"'{shown}'"
    return f"'{shown}'" + CUT_NOTE.format(len(text))


def _escaped(char: str) -> str:
    """A character past ASCII as Python escapes it: \\xe9, \\u2026, \\U0001f600."""
    return char.encode("ascii", "backslashreplace").decode("ascii")


def _head_buffered(buffered: bytes) -> bool:
    """Whether `buffered`, which starts a line, holds the rest of a request head (an empty line)."""
    return buffered.startswith(b"\r\n") or b"\r\n\r\n" in buffered


def header_field(number: int, line: str) -> tuple[str, str]:
    """Header line `number`'s name (lower case) and value; BadRequest naming the line when malformed.

    Each refused form (RFC 9112 5.1, 5.2; RFC 9110 5.5) a proxy in front may read otherwise: a
    space before the colon, a line folded onto the one before, a line with no colon, a name that
    is not a token, a NUL in the value. Read one way there and another here, the Content-Length or
    Host the proxy framed the request by, or checked, would not be the one used here.
    """
    if line[:1] in (" ", "\t"):
        raise BadRequest(
            f"header line {number}: expected a field; got a continuation of the line before "
            f"(obsolete line folding): {quoted(line)}"
        )
    name, sep, value = line.partition(":")
    if not sep:
        raise BadRequest(f"header line {number}: expected name: value; got no colon: {quoted(line)}")
    if name != name.rstrip(OWS):
        raise BadRequest(f"header line {number}: expected no space before the colon; got {quoted(line)}")
    if not TOKEN.fullmatch(name):
        raise BadRequest(f"header line {number}: expected a field name (a token); got {quoted(line)}")
    value = value.strip(OWS)
    if "\0" in value:
        raise BadRequest(f"header line {number}: expected no NUL in the value; got {quoted(line)}")
    return name.lower(), value


def _buffered(reader: asyncio.StreamReader) -> bytearray:
    """What the reader holds unread: its private buffer, as StreamReader has no public view of it
    (uvloop's connections get asyncio's StreamReader too).

    No default: with an empty one, a Python that renamed it would have every request and body
    look unarrived, and a connection whose POST had come could be closed to make room (applied,
    unanswered). Without it every request fails, and tests/server/test_http.py checks it is there.
    """
    return reader._buffer


def _write(writer: asyncio.StreamWriter, data: bytes) -> None:
    # A closed connection: asyncio drops the bytes with a warning, uvloop raises RuntimeError.
    # Either way the client is gone, which the callers handle as a ConnectionError.
    if writer.is_closing():
        raise ConnectionResetError("the client's connection is closed")
    writer.write(data)


async def _drain(writer: asyncio.StreamWriter) -> None:
    """Wait until the client has taken what was written; past WRITE_TIMEOUT_S, drop it.

    A client that never reads would otherwise hold its connection, and a slot, for good; and
    a plain close would keep the socket until its unsent bytes were taken, so it is aborted.
    """
    try:
        await asyncio.wait_for(writer.drain(), WRITE_TIMEOUT_S)
    except asyncio.TimeoutError:
        writer.transport.abort()
        raise


def _ipv6_any(host: str) -> bool:
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return address.version == 6 and address.is_unspecified


def _dual_stack_socket(port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind(("::", port))
    except OSError:
        sock.close()
        raise
    return sock


def _local_name(host: str) -> bool:
    """An IP literal or localhost: what a browser page on another site cannot rebind to this server."""
    if host.lower() == "localhost":
        return True
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def json_content_type_refusal(content_type: str, not_json: Callable[[str], str]) -> str | None:
    """Why a POST whose Content-Type is `content_type` ("" when it has none) is refused (415), None for
    application/json with no charset or utf-8: `not_json(media type)` (lowercased, "" for none) for another
    media type, in its server's words. The admin API and the demo's page take JSON alone: a page on any site
    may POST text/plain or a form to loopback without asking; JSON makes a browser ask first (a CORS
    preflight, which neither server grants). JSON between systems is UTF-8 (RFC 8259 8.1), and
    `charset=utf-16` was ignored, its body read as whatever json.loads guessed."""
    # OWS alone (RFC 9110 8.3.1: media-type = type "/" subtype parameters): str.strip() also dropped a
    # no-break space or a \x1c-\x1f after it, and "application/json\xa0" was taken as JSON.
    media_type = content_type.split(";", 1)[0].strip(OWS).lower()
    if media_type != "application/json":
        return not_json(media_type)
    for param in split_unquoted(content_type, ";")[1:]:
        name, _, value = param.partition("=")
        if name.strip(OWS).lower() == "charset":
            charset = unquoted(value.strip(OWS))
            if charset.lower() not in UTF8_CHARSETS:
                return f"Content-Type charset: expected utf-8 (JSON is UTF-8, RFC 8259); got {quoted(charset)}"
    return None


def json_encoding_refusal(raw: bytes) -> str | None:
    """Why a JSON body `raw` is refused for its encoding, None for UTF-8 (with or without a byte-order
    mark, which RFC 8259 8.1 lets a reader ignore). json.loads() of bytes reads UTF-16 and UTF-32 too,
    told by the NULs among the first bytes (json.detect_encoding), which a JSON text between systems
    is not written in (RFC 8259 8.1): a UTF-16 body was taken."""
    encoding = json.detect_encoding(raw)
    if encoding in ("utf-8", "utf-8-sig"):
        return None
    return f"body: expected JSON in UTF-8 (RFC 8259); got {encoding.upper()} text"


def cross_site_refusal(headers: dict, authority: str | None = None) -> str | None:
    """Why an admin request looks sent by a page of another site (None: it does not).

    Admin changes what every caller gets. A web page the operator has open could reach this port
    on loopback: by its Origin header (a cross-site request), or, through a DNS name rebound to
    127.0.0.1, by a Host that is not an address. Tools (curl, the bench, `wok demo`'s relay) send
    no Origin and an address or localhost as Host. `authority`, an absolute-form target's
    (`POST http://host:port/admin/...`), takes Host's place, and the refusal names it as the URL's.
    """
    host = headers.get("host", "") if authority is None else authority
    try:
        name = urlsplit("//" + host).hostname or ""
    except ValueError:  # not a host at all ("[::1"), so not a local one
        name = ""
    if not _local_name(name):
        # Named by where it came from: with the URL's host, "Host '...'" sent the reader to a
        # header that may say otherwise, or be absent.
        where = "Host" if authority is None else "the request target's host"
        # quoted, as the 400s show what a request sent: a Host of 16 KiB made a 403 as long.
        return f"{where}: expected an IP address or localhost, all the admin API answers; got {quoted(host)}"
    origin = headers.get("origin")
    if origin is not None:
        try:
            o = urlsplit(origin)
        except ValueError:  # not a URL ("http://[x"), so not this server's
            o = None
        if o is None or o.netloc.lower() != host.lower() or o.scheme != "http":
            this = quoted(f"http://{host}")  # valid_host passed, but its port may be 16 KiB of digits
            return (
                f"Origin: expected none or this server's, {this} (the admin API takes no cross-site requests); "
                f"got {quoted(origin)}"
            )
    return None
