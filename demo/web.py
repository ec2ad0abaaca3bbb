"""The demo's web side: the page, its API, and one event stream for the browser.

Served on loopback by a small HTTP/1.1 server on the demo's event loop. A connection is kept
alive between requests, except after one with `Connection: close`, or an HTTP/1.0 one without
`Connection: keep-alive`: that one is answered with `Connection: close` and the connection ends.

  GET  /                  the page (static files shipped in wok/demo/static)
  GET  /static/NAME       its script and style
  GET  /api/config        mode (live or simulate), model, instances, SLO, the load
  GET  /api/events        text/event-stream: the server's own /events (batch, tick), relayed
                          unchanged, plus a `load` event every 250 ms with what the callers saw
  POST /api/load          {"rate"} and/or {"burst_rate", "burst_s"}: the load generator
  POST /api/batching      {"max_batch_size"?, "max_queue_delay_ms"?}: the server's /admin/batching
  POST /api/faults        {"instance"?, "mode", "delay_ms"?, "duration_s"?}: the server's /admin/faults

In live mode the batching and fault calls are forwarded to the wok server's admin API
(loopback) with the model filled in, and its answer (or its 400) comes back as is, the admin
API's own bytes; its 413 (a body over its 64 KiB once the model is added) and 503 (the wok server
stops) come back with their status, their message after what the wok server answered; any
other status (408, 411, its own 500), a truncated answer or one that is not a JSON object is a 502
naming what came; 502 with the error when the server refuses or drops the connection, 504 (Gateway
Timeout) when it does not answer within ADMIN_TIMEOUT_S, and 503 while it starts. A 500 is the page
server's own failure alone.

The page's API fails and slows the server, so it takes the admin API's checks against the
one client that reaches loopback anyway, a page of another site in the user's browser: the
Host must be an IP address or localhost, a foreign Origin is refused (403), and a POST must
be JSON (415), of at most 64 KiB (413). See docs/security.md.

As the metrics port does (server/http.py, whose checks it calls): a Host that is not `host[:port]`,
none on HTTP/1.1, or two, get 400 naming it (RFC 9112 3.2) before that check, on every path;
every answer carries a Date header (RFC 9110 6.6.1), formatted once a second; a 404 names the
path asked for (escaped, cut at 200 characters) and the paths served. The head is read and framed
by the metrics port's functions: a bare LF, a bare CR, a space before a colon, a folded line, a
method that is not a token, two Content-Lengths get 400, a version not HTTP/1.x 505 (400 if not
HTTP/<digit>.<digit>), a request line over 16 KiB by itself 414 (its target is too long), a head over
it 431, a Transfer-Encoding 501 or 400 (`transfer_coding_refusal`); an absolute-form target is
served, its authority checked in Host's place.
A HEAD is answered where a GET is, with the GET's headers and no body, and no answer to a HEAD has
one (405 for /api/events, whose stream has no length); `Expect: 100-continue` gets a 100 before the
body is read, another expectation 417 (`expect_refusal`); a request that fails unexpectedly gets
500, logged with its traceback, and the connection ends. The stop is staged (`DemoWeb.stop`): the
connections waiting for a request, and the event streams, end at once; a request being answered gets
STOP_GRACE_S; then every connection left is aborted.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import re
import time
from importlib import resources

from ..config import host_port
from ..errors import cut_message, escaped
from ..http import (
    CONTINUE,
    HOST_SHAPE,
    REASONS,
    BadRequest,
    DateHeader,
    HeadTooLarge,
    TargetTooLong,
    connection_options,
    cross_site_refusal,
    expect_refusal,
    header_field,
    json_content_type_refusal,
    json_encoding_refusal,
    quoted,
    read_head,
    request_line,
    request_start,
    request_target,
    transfer_coding_refusal,
    valid_host,
    version_refusal,
)

log = logging.getLogger("wok.demo")
TICK_S = 0.25
BACKLOG = 4000
TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript", ".css": "text/css", ".png": "image/png"}
MAX_BODY = 64 << 10
MAX_HEAD = 16 << 10  # the request line and headers (the metrics port's MAX_HEADER_BYTES, which read_head checks)
IDLE_S = 120.0  # for a connection's next request head, all of it
# At stop, what a connection still has to write (an answer begun before the stop, a stream's last
# events) gets this long to reach its client; then every connection left is aborted: a client that
# does not read held its connection, and its events, open past the stop.
STOP_GRACE_S = 2.0
ADMIN_TIMEOUT_S = 10.0  # for the wok server's answer to an admin call
STATUS = {
    200: "OK",
    400: "Bad Request",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    413: "Content Too Large",  # RFC 9110 15.5.14 (RFC 7231 named it Payload Too Large)
    414: "URI Too Long",
    415: "Unsupported Media Type",
    417: "Expectation Failed",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    501: "Not Implemented",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
    505: "HTTP Version Not Supported",
}
# The admin API's statuses passed on with its own answer, as it wrote it: its answer and its refusal
# of a field. Those passed on with their message quoted: a body over its 64 KiB (the page's own
# limit, but the model is added to what goes on) and the wok server's stop. Any other is no fault of
# the page's request (408: the relay's body came late; 411; the wok server's own 500) and gets 502:
# as a 500 it read as the page server's own failure, and the browser's request as the one to blame.
RELAYED = (200, 400)
RELAYED_WITH_MESSAGE = (413, 503)
# What a 404 names as served.
API_PATHS = "GET /api/config, GET /api/events, POST /api/load, POST /api/batching, POST /api/faults"
PATHS = f"/, /static/<file> (the page's script and style), {API_PATHS}"


class Refused(Exception):
    """A request answered with an error before it reaches the API; the connection then ends."""

    def __init__(self, status: int, error: str) -> None:
        super().__init__(error)
        self.status = status


@functools.cache
def static_names() -> frozenset[str]:
    return frozenset(f.name for f in resources.files("wok.demo").joinpath("static").iterdir() if f.is_file())


def static_file(name: str) -> bytes | None:
    # Looked up among the files shipped, not on disk: a name over the file system's 255 bytes
    # raised ENAMETOOLONG from is_file(), and `GET /static/aaa…` got the page server's 500.
    if name not in static_names():
        return None
    return resources.files("wok.demo").joinpath("static", name).read_bytes()


class Hub:
    """Fans events out to the page's streams; a browser that falls behind loses events, never the server."""

    def __init__(self) -> None:
        self.queues: set[asyncio.Queue] = set()

    def publish_raw(self, data: bytes) -> None:
        for q in self.queues:
            if q.qsize() < BACKLOG:
                q.put_nowait(data)

    def publish(self, event: dict) -> None:
        self.publish_raw(json.dumps(event, separators=(",", ":")).encode())


async def http_json(host: str, port: int, method: str, path: str, body=None) -> tuple[int, bytes | dict]:
    """One request to the wok server's admin API (HTTP/1.1, Connection: close): the status the
    page answers with, and its body: the admin API's own bytes where it is passed on (RELAYED),
    else a dict naming what the wok server answered. Raises OSError: TimeoutError when it does not
    answer in ADMIN_TIMEOUT_S (the page answers 504), ConnectionError when it ends the connection
    without an answer (502)."""
    # Compact, as the admin API writes JSON: with ", " and ": " a body within the page's 64 KiB
    # grew past the admin port's.
    data = b"" if body is None else json.dumps(body, separators=(",", ":")).encode()

    async def exchange() -> bytes:
        reader, writer = await asyncio.open_connection(host, port)
        try:
            writer.write(
                # host:port, an IPv6 address bracketed (RFC 9110 7.2): the admin port refuses `::1` with 400.
                f"{method} {path} HTTP/1.1\r\nHost: {host_port(host, port)}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode()
                + data
            )
            return await reader.read()
        finally:
            writer.close()

    try:
        # The connect too: a stopped server's socket still accepts, its kernel answering for it.
        raw = await asyncio.wait_for(exchange(), ADMIN_TIMEOUT_S)
    except asyncio.TimeoutError:  # its own text is empty
        raise TimeoutError(f"{method} {path}: no answer within {ADMIN_TIMEOUT_S:g} s from {host}:{port}") from None
    head, _, payload = raw.partition(b"\r\n\r\n")
    m = re.match(rb"HTTP/1\.[01] ([0-9]{3}) ", head)
    if m is None:  # the server ended mid-answer: as unreachable, for the caller's 502
        raise ConnectionError(f"{method} {path}: expected an HTTP answer from {host}:{port}; got {raw[:60]!r}")
    status = int(m.group(1))
    length = re.search(rb"\r\ncontent-length:[ \t]*([0-9]{1,18})[ \t]*(?:\r\n|$)", head, re.IGNORECASE)
    if length is not None:
        expected = int(length.group(1))
        if len(payload) < expected:
            # Read as JSON, a cut answer was "not a JSON object", and a cut 200 said nothing of the
            # change it reports, which may have been made.
            return 502, {
                "error": f"the wok server's {status} answer to {method} {path} ended after {len(payload)} of its "
                f"{expected} bytes: whether the change was made is unknown"
            }
        payload = payload[:expected]
    try:
        answer = json.loads(payload)
    except (ValueError, RecursionError):
        # The admin port's own refusals of a request's framing are text/plain; read as JSON, the
        # parse error reached the page as a 400 of its own input.
        answer = None
    # The admin port writes UTF-8 (charset=utf-8): read as Latin-1, a "…" in it showed as its three bytes.
    text = payload.decode("utf-8", "replace").strip()
    if status in RELAYED:
        if isinstance(answer, dict):
            return status, payload  # passed on as it came: re-encoded, it was spaced otherwise
        return 502, {"error": f"the wok server answered {status} with {quoted(text)}, not a JSON object"}
    error = f"the wok server answered {status} {REASONS.get(status, '')}".rstrip()
    if isinstance(answer, dict) and isinstance(answer.get("error"), str):
        # The admin API's own refusal, its values quoted already: after a colon, not in quotes of its own,
        # where they nested ("with 'Content-Length: ...; got '65600''").
        error += f": {cut_message(escaped(answer['error']))}"
    else:
        error += f" with {quoted(text)}"
    if status == 413:
        error += f" (the body sent on, the model added: {len(data):,} bytes)"
    return (status if status in RELAYED_WITH_MESSAGE else 502), {"error": error}


class DemoWeb:
    """The page's HTTP server. `backend` answers config, batching and faults (live or simulated)."""

    def __init__(self, backend, hub: Hub, host: str, port: int) -> None:
        self.backend = backend
        self.hub = hub
        self.host = host
        self.port = port
        self._server: asyncio.base_events.Server | None = None
        # Each connection's task, and its writer, which stop() aborts once the grace is over.
        self._clients: dict[asyncio.Task, asyncio.StreamWriter] = {}
        # Those that owe nothing at stop, ended at once: waiting for a request head, or streaming events.
        self._idle: set[asyncio.Task] = set()
        self._stopping = False
        self._date_header = DateHeader()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self.host, self.port, limit=MAX_HEAD)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Staged, as uvicorn stops: no new connection; those waiting for a request closed at once,
        event streams ended; a request being answered gets STOP_GRACE_S for its answer (which says
        `Connection: close`) and its client's close; then every connection left is aborted.

        Its tasks were cancelled, and that was all: a stream whose client read slowly stayed open
        with its unsent events (a transport's close waits for them), and a request being answered,
        an admin call relayed, was cut with no answer."""
        if self._server is None:
            return
        # From here no connection is served: one accepted just before the close, whose task runs
        # later, is aborted as it starts (_serve).
        self._stopping = True
        self._server.close()
        connections = dict(self._clients)
        for task in self._idle:
            task.cancel()
        if connections:
            ends = [asyncio.ensure_future(_ended(task, writer)) for task, writer in connections.items()]
            _, late = await asyncio.wait(ends, timeout=STOP_GRACE_S)
            for end in late:
                end.cancel()
            await asyncio.gather(*ends, return_exceptions=True)
        # Until none is left; aborted as well as cancelled: on Python 3.11, asyncio.wait_for loses a
        # cancellation that lands as what it waits for completes (see server/http.py's stop).
        while self._clients:
            for task, writer in list(self._clients.items()):
                writer.transport.abort()
                task.cancel()
            await asyncio.gather(*self._clients, return_exceptions=True)
        # Their tasks ended, but a transport closed with bytes unsent stays open until they are taken.
        for writer in connections.values():
            writer.transport.abort()
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._stopping:
            writer.transport.abort()
            return
        task = asyncio.current_task()
        self._clients[task] = writer
        try:
            while not self._stopping and await self._one(reader, writer):
                pass
            await _linger(reader, writer)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, asyncio.TimeoutError):
            pass
        except asyncio.CancelledError:  # the demo stops; end quietly (see server/http.py)
            pass
        finally:
            self._clients.pop(task, None)
            writer.close()

    @contextlib.contextmanager
    def _idle_while(self):
        """This task counted in `_idle` (the stop ends it at once) for the block's time."""
        task = asyncio.current_task()
        self._idle.add(task)
        try:
            yield
        finally:
            self._idle.discard(task)

    async def _one(self, reader, writer) -> bool:
        """Answer one request; False when the connection must end."""
        head = False  # a HEAD's answers, refusals too, carry no body (RFC 9110 9.3.2)
        try:
            with self._idle_while():
                lines = await _head_lines(reader)
            method, target, version = request_line(lines[0])
            head = method == "HEAD"
            path, body, close = await self._request(reader, writer, method, target, version, lines[1:])
        # Refused before its request line is parsed, or for it, a HEAD is known by the method its
        # line starts with (`method` of the exception).
        except TargetTooLong as exc:  # the request line alone: its URL is too long, not its headers
            await self._send(writer, 414, {"error": str(exc)}, close=True, head=exc.method == "HEAD")
            return False
        except HeadTooLarge as exc:
            error = {"error": f"request head: expected at most {MAX_HEAD} bytes; got more"}
            await self._send(writer, 431, error, close=True, head=exc.method == "HEAD")
            return False
        except BadRequest as exc:  # the head's framing, as the metrics port refuses it
            await self._send(writer, 400, {"error": str(exc)}, close=True, head=head or exc.method == "HEAD")
            return False
        except Refused as exc:
            await self._send(writer, exc.status, {"error": str(exc)}, close=True, head=head)
            return False
        try:
            return await self._answer(writer, method, path, body, close)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, asyncio.TimeoutError):
            raise  # the client went away: nobody to answer
        except Exception:
            # As the metrics port: left to asyncio, the request had no answer at all, and the log
            # an "Unhandled exception in client_connected_cb". The connection ends: what the
            # handler changed before it failed is unknown.
            log.exception("%s %s failed", method, quoted(path))
            error = f"{method} {quoted(path)}: internal error; see the demo's log"
            await self._send(writer, 500, {"error": error}, close=True, head=head)
            return False

    async def _answer(self, writer, method: str, path: str, body, close: bool) -> bool:
        """Answer a request read and checked; False when the connection must end. A HEAD is
        answered as a GET is, with the GET's headers (its Content-Length too) and no body, as the
        metrics port answers it: a 405 with a body, on a connection kept alive, was read by the
        client as the start of the next answer."""
        head = method == "HEAD"
        close = close or self._stopping  # the page stops: this answer is the connection's last
        if path == "/api/events" and method in ("GET", "HEAD"):
            if head:  # as the metrics port's /events: a stream has no length to send
                error = {"error": f"{quoted(path)}: expected GET; got {quoted(method)}"}
                await self._send(writer, 405, error, close=close, head=True, allow="GET")
                return not close
            if self._stopping:  # stop() ends the streams it finds; this one would outlive it
                await self._send(
                    writer,
                    503,
                    {"error": f"GET {path}: expected a page that serves; got one that is stopping"},
                    close=True,
                )
                return False
            with self._idle_while():
                await self._stream(writer)
            return False
        if path.startswith("/api/"):
            status, answer = await self._api("GET" if head else method, path[len("/api/") :], body)
            close = close or self._stopping  # the stop began while it was answered (an admin call relayed)
            await self._send(writer, status, answer, close=close, head=head)
        else:
            name = "index.html" if path == "/" else path[len("/static/") :] if path.startswith("/static/") else ""
            data = static_file(name) if name else None
            if data is None:
                # Whatever the method, as the metrics port: a 405 would say that the path exists.
                error = f"no path {quoted(path)} here; paths: {PATHS}"
                await self._send(writer, 404, {"error": error}, close=close, head=head)
            elif method not in ("GET", "HEAD"):
                error = f"{quoted(path)}: expected GET or HEAD; got {quoted(method)}"
                # Allow: RFC 9110 15.5.6 (a MUST for a 405).
                await self._send(writer, 405, {"error": error}, close=close, allow="GET, HEAD")
            else:
                ctype = TYPES.get(name[name.rfind(".") :], "application/octet-stream")
                await self._raw(writer, 200, data, ctype, close=close, head=head)
        return not close

    @staticmethod
    async def _request(
        reader, writer, method: str, target: str, version: str, lines: list[str]
    ) -> tuple[str, object, bool]:
        """(path, JSON body or None, whether the connection ends after it) of one request, from its
        request line's parts and its header lines; raises Refused, or BadRequest for the head's
        framing. `writer` takes the 100 Continue its client may wait for before it sends the body.

        Framed as the metrics port frames a request, with its checks (server/http.py), in its order:
        each form refused is one a proxy in front may read otherwise (a bare LF, a space before a
        colon, a folded line, two Content-Lengths: another body, or another request, than read
        here), or not HTTP/1 at all (`HTTP/9.9` was served as 1.1).
        """
        refused = version_refusal(version)
        if refused is not None:
            raise Refused(*refused)
        fields = [header_field(number, line) for number, line in enumerate(lines, 1)]
        headers = dict(fields)
        # The refusals below that the metrics port also makes are in its words (server/http.py's),
        # word for word, so that a client meets one text for one fault on either port.
        # Two lengths frame the body two ways (the last was read here); two Hosts may be read
        # apart likewise (RFC 9112 6.3, 3.2).
        for name in ("content-length", "host"):
            values = [v for k, v in fields if k == name]
            if len(values) > 1:
                raise Refused(
                    400, f"{name.title()}: expected one header; got {len(values)}: {', '.join(map(quoted, values))}"
                )
        codings = [v for k, v in fields if k == "transfer-encoding"]
        if codings:
            raise Refused(*transfer_coding_refusal(codings, version))
        # RFC 9112 3.2 (MUSTs), before the cross-site check reads the Host: it took `127.0.0.1/x`,
        # `localhost?x` or `evil@127.0.0.1` for an address.
        if "host" not in headers and version != "HTTP/1.0":  # HTTP/1.0 predates Host: the cross-site check refuses it
            raise Refused(400, "Host: expected one header; got none (RFC 9112 3.2)")
        if "host" in headers and not valid_host(headers["host"]):
            raise Refused(400, f"Host: expected {HOST_SHAPE}; got {quoted(headers['host'])}")
        length = headers.get("content-length", "0")
        if not re.fullmatch(r"[0-9]+", length):
            raise Refused(400, f"Content-Length: expected a number of bytes; got {quoted(length)}")
        # As the metrics port: HTTP/1.0 has no Expect (its client waits for no 100); another
        # expectation than 100-continue, ignored, left its client waiting for it.
        expects = [v for k, v in fields if k == "expect"] if version != "HTTP/1.0" else []
        unmet = expect_refusal(expects)
        if unmet is not None:
            raise Refused(417, unmet)
        # The absolute form (`GET http://127.0.0.1:8090/api/config`) names the host asked for in
        # Host's place (RFC 9112 3.2.2), and the cross-site check reads it; it got 404.
        path, authority = request_target(target)
        # Kept open, the connection of a client that asked to end it (or an HTTP/1.0 one, whose
        # default that is) waited out the idle timeout: such a client reads to the close.
        options = connection_options(v for k, v in fields if k == "connection")
        close = "close" in options or (version == "HTTP/1.0" and "keep-alive" not in options)
        refusal = cross_site_refusal(headers, authority)
        if refusal is not None:
            raise Refused(403, refusal.replace("the admin API", "the demo's page"))
        # Leading zeros dropped before int(), which refuses over 4,300 digits; a header may hold 16 KiB.
        digits = length.lstrip("0")
        size = int(digits or "0") if len(digits) <= len(str(MAX_BODY)) else MAX_BODY + 1
        if method != "POST":
            if size:  # its bytes would be read as the next request
                raise Refused(400, f"{method}: expected no body; got Content-Length {quoted(length)}")
            return path, None, close
        refusal = json_content_type_refusal(
            headers.get("content-type", ""),
            lambda got: f"Content-Type: expected application/json for a POST; got {quoted(got or 'none')}",
        )
        if refusal is not None:
            raise Refused(415, refusal)
        if size > MAX_BODY:  # 413, as the metrics port refuses it (RFC 9110 15.5.14); it got 400
            raise Refused(413, f"Content-Length: expected at most {MAX_BODY} bytes; got {quoted(length)}")
        if expects and size:
            # Its client waits for this before it sends the body (curl for a second, then sends it
            # anyway); asked only now that the request is acceptable: one refused above had its
            # final answer instead, and its body need not come.
            writer.write(CONTINUE)
            await writer.drain()
        raw = await asyncio.wait_for(reader.readexactly(size), 10)
        refusal = json_encoding_refusal(raw)
        if refusal is not None:
            raise Refused(415, refusal)
        try:
            body = json.loads(raw or b"null")
        except ValueError as exc:
            raise Refused(400, f"body: expected JSON; got a parse error: {exc}") from None
        except RecursionError:
            raise Refused(400, "body: expected JSON; got one nested too deeply") from None
        return path, body, close

    async def _api(self, method: str, name: str, body) -> tuple[int, dict | bytes]:
        """The status and body of an API call: a dict to encode, or bytes passed on as they are."""
        b = self.backend
        try:
            if (method, name) == ("GET", "config"):
                return 200, b.config()
            if (method, name) == ("POST", "load"):
                return 200, b.control.set(body)
            if (method, name) == ("POST", "batching"):
                return await b.set_batching(body)
            if (method, name) == ("POST", "faults"):
                return await b.set_faults(body)
        except ValueError as exc:
            return 400, {"error": str(exc)}
        except TimeoutError as exc:
            # The wok server kept the connection and sent nothing in time (stopped, or stuck): a
            # gateway's timeout (RFC 9110 15.6.5), not an answer that was wrong (502).
            return 504, {"error": f"the wok server did not answer: {str(exc) or type(exc).__name__}"}
        except OSError as exc:  # only the admin calls do I/O: the wok server did not answer
            return 502, {"error": f"the wok server did not answer: {str(exc) or type(exc).__name__}"}
        return 404, {"error": f"no API {quoted(f'{method} /api/{name}')}; the API: {API_PATHS}"}

    async def _stream(self, writer) -> None:
        # Made before the 200 goes out: should it fail, the 500 (see _one) must not land inside the stream.
        first = json.dumps({"type": "config", **self.backend.config()}).encode()
        writer.write(
            b"HTTP/1.1 200 OK\r\n" + self._date_header() + b"Content-Type: text/event-stream\r\n"
            b"Cache-Control: no-cache\r\nConnection: close\r\n\r\n"
        )
        q: asyncio.Queue = asyncio.Queue()
        self.hub.queues.add(q)
        try:
            q.put_nowait(first)
            while True:
                items = [await q.get()]
                while not q.empty() and len(items) < 512:
                    items.append(q.get_nowait())
                writer.write(b"".join(b"data: " + d + b"\n\n" for d in items))
                await writer.drain()
        finally:
            self.hub.queues.discard(q)

    async def _send(self, writer, status: int, obj, *, close: bool, head: bool = False, allow: str = "") -> None:
        """Send a JSON answer: `obj` encoded, or, bytes, as they are (the admin API's own answer)."""
        body = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
        await self._raw(writer, status, body, "application/json", close=close, head=head, allow=allow)

    async def _raw(
        self, writer, status: int, body: bytes, ctype: str, *, close: bool, head: bool = False, allow: str = ""
    ) -> None:
        """Send one answer: to a HEAD (`head`), its headers alone, Content-Length the body's; `allow`
        (the methods the path takes) goes with a 405."""
        # Said either way: an HTTP/1.0 client keeps its connection only when the answer says so.
        fields = (
            f"Content-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
            + (f"Allow: {allow}\r\n" if allow else "")
            + f"Cache-Control: no-store\r\nConnection: {'close' if close else 'keep-alive'}\r\n\r\n"
        )
        writer.write(
            f"HTTP/1.1 {status} {STATUS[status]}\r\n".encode()
            + self._date_header()
            + fields.encode()
            + (b"" if head else body)
        )
        await writer.drain()


async def _head_lines(reader: asyncio.StreamReader) -> list[str]:
    """A request head's lines, read line by line as the metrics port reads them (server/http.py):
    a bare LF or CR refused with BadRequest at once (the head was read to a CRLF CRLF, and one
    sent with LF alone waited out the idle timeout unanswered), the empty lines before a request
    line skipped (RFC 9112 2.2). HeadTooLarge (TargetTooLong for the request line alone) past MAX_HEAD.
    TimeoutError past IDLE_S from the call.

    The time limit is request_start's and a wait_for of read_head's alone, as the metrics port has
    it: a wait_for of this whole coroutine ran it as a task around request_start's own wait_for,
    which on Python 3.10 and 3.11 loses a cancellation that lands as the read ends (3.12's runs no task).
    At the page's stop, a client's close met so ended that task with IncompleteReadError, never
    retrieved by the outer wait_for, and asyncio logged "Task exception was never retrieved".
    """
    deadline = time.monotonic() + IDLE_S
    start, _ = await request_start(reader, deadline)
    lines, _ = await asyncio.wait_for(read_head(reader, start), deadline - time.monotonic())
    return lines


async def _ended(task: asyncio.Task, writer: asyncio.StreamWriter) -> None:
    """Wait until a connection's task has ended and its transport has closed, its bytes all sent."""
    await asyncio.wait({task})  # not `await task`: cancelled at the grace's end, this would cancel it
    try:
        await writer.wait_closed()
    except OSError:  # reset by its client: closed all the same
        pass


async def _linger(reader, writer) -> None:
    """End a connection whose client may still be sending (a refused head, a request pipelined
    after one that asked to close): half-close, then read and drop what comes for a moment.
    Closed with unread bytes, the socket would be reset, which can lose the answer before the
    client reads it."""

    async def drop() -> None:
        while await reader.read(64 << 10):
            pass

    try:
        writer.write_eof()
        await asyncio.wait_for(drop(), 2.0)
    except (OSError, asyncio.TimeoutError):
        pass


async def tick_load(hub: Hub, backend, stop: asyncio.Event) -> None:
    """Every TICK_S: a `load` event with the callers' rolling figures and the rate set."""
    while not stop.is_set():
        hub.publish({"type": "load", "t": round(time.time(), 6), **backend.load_summary()})
        try:
            await asyncio.wait_for(stop.wait(), TICK_S)
        except asyncio.TimeoutError:
            pass
