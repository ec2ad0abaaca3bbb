"""The metrics/admin HTTP server (server/http.py) against raw sockets: which connection the cap
closes to make room, and the request line's and a 405's errors naming what was wrong."""

from __future__ import annotations

import asyncio
import socket

import pytest
from prometheus_client import CollectorRegistry, Gauge

from wok import http

from .test_http import CLOSED_FOR_ROOM, LOOPS, Captured, Server, responses


@pytest.mark.parametrize("loop", LOOPS)
def test_at_the_cap_an_idle_kept_alive_connection_is_closed_before_a_new_one_owed_its_answer(
    run_on, loop, monkeypatch, raw_http
):
    """Closed by age alone, a new connection accepted before a kept-alive one's last answer had
    waited longer: it got the 503 (its client's request failed) while the idle one, which HTTP lets
    a server close bare (its client asks again on a new connection), stayed open."""
    monkeypatch.setattr(http, "MAX_CONNECTIONS", 2)
    request_start = http.request_start
    waits = asyncio.Semaphore(0)

    def counted(reader, deadline):
        waits.release()  # its connection is registered as waiting, for a request's start
        return request_start(reader, deadline)

    monkeypatch.setattr(http, "request_start", counted)

    async def main() -> tuple[bytes, dict]:
        async with Server() as s:
            kept_reader, kept_writer = await asyncio.open_connection("127.0.0.1", s.port)
            await asyncio.wait_for(waits.acquire(), 5)
            new_reader, new_writer = await asyncio.open_connection("127.0.0.1", s.port)
            await asyncio.wait_for(waits.acquire(), 5)  # waits for its first request, not sent yet
            kept_writer.write(b"GET / HTTP/1.1\r\n" + s.host + b"\r\n")
            await asyncio.wait_for(kept_reader.readuntil(b"wok: metrics at /metrics\n"), 5)
            await asyncio.wait_for(waits.acquire(), 5)  # idle again, waiting since after the new one
            newer = await raw_http(
                s.port,
                b"GET /metrics HTTP/1.1\r\n" + s.host + b"Connection: close\r\n\r\n",
            )
            new_writer.write(b"GET / HTTP/1.1\r\n" + s.host + b"Connection: close\r\n\r\n")
            new = await asyncio.wait_for(new_reader.read(), 5)
            # Checked here: with the new one closed instead, the kept one stays open, unread.
            assert newer.startswith(b"HTTP/1.1 200 OK\r\n"), newer
            [(top, body)] = responses(new, [False])
            assert top.startswith(b"HTTP/1.1 200 OK\r\n") and body == b"wok: metrics at /metrics\n", new
            kept = await asyncio.wait_for(kept_reader.read(), 5)
            for writer in (kept_writer, new_writer):
                writer.close()
            return kept, s.http.unanswered

    kept, unanswered = run_on(loop, main())
    assert kept == b""  # closed bare: no answer to a request its client has not sent
    assert unanswered == {"refused": 0, "room": 0, "blocked": 0}


# asyncio's loop alone: on uvloop, a connection's answer had all gone to the kernel by the time it
# waited again (its write buffer empty, in every run here), so no answer was left to cut.
@pytest.mark.parametrize("close", [False, True], ids=["kept-alive", "closing"])
@pytest.mark.parametrize("other", [False, True], ids=["alone", "beside-a-new-one"])
def test_a_connection_whose_last_answer_is_not_all_sent_is_closed_for_room_last_and_counted(
    run_on, close, other, monkeypatch, raw_http
):
    """Its answer's end, under the transport's low-water mark, still unsent (its client reads
    slowly), it waited as one that loses nothing: closed for room, its answer was cut short, before
    a new connection owed a 503, and the warning did not count it."""
    monkeypatch.setattr(http, "MAX_CONNECTIONS", 2 if other else 1)
    registry = CollectorRegistry()
    gauge = Gauge("wide", "a /metrics answer of about 100 KiB", ["n"], registry=registry)
    for n in range(5000):
        gauge.labels(str(n)).set(n)

    async def main() -> tuple[bytes, int, bytes, dict]:
        async with Server(registry) as s:
            captured = Captured(s.http)
            sock = socket.socket()
            # The kernel's least buffers, each end's (about 2 and 4 KiB): they take little of the answer.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)
            sock.setblocking(False)
            await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", s.port))
            slow_reader, slow_writer = await asyncio.open_connection(sock=sock)
            await asyncio.wait_for(captured.started.acquire(), 5)
            _, served = captured.conns[0]
            served.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1)
            slow_writer.write(
                b"GET /metrics HTTP/1.1\r\n" + s.host + (b"Connection: close\r\n" if close else b"") + b"\r\n"
            )
            got = b""
            # Read a little at a time until the server waits, its answer written, for the next request or the close.
            while b"\r\n\r\n" not in got or served not in s.http._waiting:
                got += await asyncio.wait_for(slow_reader.read(128), 5)
            assert served.transport.get_write_buffer_size() > 0  # the answer's end, over what the kernels take
            if other:
                new_reader, new_writer = await asyncio.open_connection("127.0.0.1", s.port)
                await asyncio.wait_for(captured.started.acquire(), 5)  # waits for its first request
            newer = await raw_http(s.port, b"GET / HTTP/1.1\r\n" + s.host + b"Connection: close\r\n\r\n")
            assert newer.startswith(b"HTTP/1.1 200 OK\r\n"), newer
            new = b""
            if other:
                new_writer.write(b"GET / HTTP/1.1\r\n" + s.host + b"Connection: close\r\n\r\n")
                new = await asyncio.wait_for(new_reader.read(), 5)
                new_writer.close()
            top, _, body = got.partition(b"\r\n\r\n")
            length = int(top.split(b"Content-Length: ")[1].split(b"\r\n")[0])
            try:
                body += await asyncio.wait_for(slow_reader.readexactly(length - len(body)), 5)
            except asyncio.IncompleteReadError as exc:
                body += exc.partial  # cut short
            slow_writer.close()
            return body, length, new, s.http.unanswered

    body, length, new, unanswered = run_on("asyncio", main())
    if other:
        # The new one, owed its answer, goes before an answer is cut: it gets the 503.
        assert len(body) == length
        [(top, closed)] = responses(new, [False])
        assert top.startswith(b"HTTP/1.1 503 Service Unavailable\r\n") and closed == CLOSED_FOR_ROOM, new
        assert unanswered == {"refused": 0, "room": 1, "blocked": 0}
    else:
        # The only one to close: its answer is cut short, counted with those whose clients do not read.
        assert len(body) < length
        assert unanswered == {"refused": 0, "room": 0, "blocked": 1}


@pytest.mark.parametrize(
    "line, error",
    [
        (
            b"GET /metrics",
            "request line: expected a method, a target and a version separated by single spaces; got 'GET /metrics'",
        ),
        (
            b"GET  /metrics HTTP/1.1",
            "request line: expected a method, a target and a version separated by single spaces; "
            "got 'GET  /metrics HTTP/1.1'",
        ),
        # The two above got "bad request line"; the three below were served as well formed, with a
        # 405 "only GET" (the method is not GET) or a 404 (the target was empty).
        (b" /metrics HTTP/1.1", "request line: expected a method (a token); got ''"),
        (b"G(T /metrics HTTP/1.1", "request line: expected a method (a token); got 'G(T'"),
        (b"GET  HTTP/1.1", "request line: expected a request target; got none: 'GET  HTTP/1.1'"),
    ],
    ids=["two-parts", "two-spaces", "no-method", "method-not-a-token", "no-target"],
)
async def test_a_malformed_request_line_gets_400_naming_what_is_wrong(line, error, raw_http):
    async with Server() as s:
        answer = await raw_http(s.port, line + b"\r\n" + s.host + b"Connection: close\r\n\r\n")
    [(top, body)] = responses(answer, [False])
    assert top.startswith(b"HTTP/1.1 400 Bad Request\r\n") and b"Connection: close" in top, answer
    assert body.decode("latin-1") == error + "\n"


@pytest.mark.parametrize(
    "method, path, error",
    [
        ("POST", "/metrics", "'/metrics': expected GET or HEAD; got 'POST'"),
        ("DELETE", "/", "'/': expected GET or HEAD; got 'DELETE'"),
        ("DELETE", "/events", "'/events': expected GET; got 'DELETE'"),
    ],
)
async def test_a_405_names_the_method_and_what_the_path_takes(method, path, error, raw_http):
    """It said "only GET", on /metrics too, which HEAD is served on."""
    async with Server() as s:
        request = f"{method} {path} HTTP/1.1\r\n".encode() + s.host + b"Connection: close\r\n\r\n"
        answer = await raw_http(s.port, request)
    [(top, body)] = responses(answer, [False])
    assert top.startswith(b"HTTP/1.1 405 Method Not Allowed\r\n"), answer
    assert body.decode() == error + "\n"
