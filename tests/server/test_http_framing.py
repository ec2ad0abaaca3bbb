"""The metrics/admin HTTP server (server/http.py) against raw sockets: the request line's version,
empty lines before it, a kept-alive connection's head timeout, and Expect: 100-continue."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time

import pytest
from prometheus_client import CollectorRegistry

from wok import http

from .test_http import LOOPS, BrokenCollector, Server, _gate_admin, errors, post, responses


def status(top: bytes) -> bytes:
    return top.split(b"\r\n")[0]


@pytest.mark.parametrize(
    "version, error",
    [
        (b"FOO/9", "request line: expected HTTP/<digit>.<digit> as its version; got 'FOO/9'"),
        (b"http/1.1", "request line: expected HTTP/<digit>.<digit> as its version; got 'http/1.1'"),
        (b"HTTP/1.10", "request line: expected HTTP/<digit>.<digit> as its version; got 'HTTP/1.10'"),
        (b"HTTP/1", "request line: expected HTTP/<digit>.<digit> as its version; got 'HTTP/1'"),
    ],
    ids=["foo", "lower-case", "two-digits", "no-minor"],
)
async def test_a_malformed_version_gets_400_and_the_connection_ends(version, error, raw_http):
    """Any third word of the request line was answered 200, as HTTP/1.1."""
    async with Server() as s:
        answer = await raw_http(s.port, b"GET /metrics " + version + b"\r\n" + s.host + b"\r\nGET / HTTP/1.1\r\n\r\n")
    [(top, body)] = responses(answer, [False])
    assert top.startswith(b"HTTP/1.1 400 Bad Request\r\n") and b"Connection: close" in top, answer
    assert body.decode("latin-1") == error + "\n"


@pytest.mark.parametrize("version", [b"HTTP/2.0", b"HTTP/0.9", b"HTTP/3.0"])
async def test_another_major_version_gets_505_and_the_connection_ends(version, raw_http):
    async with Server() as s:
        answer = await raw_http(s.port, b"GET /metrics " + version + b"\r\n" + s.host + b"\r\nGET / HTTP/1.1\r\n\r\n")
        # HTTP/2 with prior knowledge: its preface reads as a request line and an empty line.
        preface = await raw_http(s.port, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
    for got, sent in ((answer, version), (preface, b"HTTP/2.0")):
        [(top, body)] = responses(got, [False])
        assert top.startswith(b"HTTP/1.1 505 HTTP Version Not Supported\r\n") and b"Connection: close" in top, got
        assert (
            body
            == b"request line: expected HTTP/1.x as its version (this server speaks HTTP/1.1); got '" + sent + b"'\n"
        )


async def test_a_later_http1_minor_is_served_as_http11_and_http10_closes(raw_http):
    async with Server() as s:
        later = b"GET / HTTP/1.2\r\n" + s.host + b"\r\n"
        kept = await raw_http(s.port, later + later.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"))
        # HTTP/1.0 has no keep-alive unless asked for; this server does not offer it: one answer.
        old = await raw_http(s.port, b"GET / HTTP/1.0\r\n\r\nGET / HTTP/1.0\r\n\r\n")
    first, second = responses(kept, [False, False])
    assert status(first[0]) == status(second[0]) == b"HTTP/1.1 200 OK", kept
    assert b"Connection: keep-alive" in first[0], kept
    [(top, body)] = responses(old, [False])
    assert top.startswith(b"HTTP/1.1 200 OK\r\n") and b"Connection: close" in top, old
    assert body == b"wok: metrics at /metrics\n"


@pytest.mark.parametrize("most", [False, True], ids=["one", "most"])
async def test_empty_lines_before_a_request_line_are_skipped(most, raw_http):
    """RFC 9112 2.2: a server SHOULD ignore at least one; it answered 400."""
    empty = http.MAX_EMPTY_LINES if most else 1
    async with Server() as s:
        request = b"GET / HTTP/1.1\r\n" + s.host + b"\r\n"
        last = request.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n")
        answer = await raw_http(s.port, b"\r\n" * empty + request + b"\r\n" * empty + last)
        # As an old client sends it: a CRLF after a POST's body, then its next request.
        body = b'{"model":"mlp"}'
        after_post = await raw_http(s.port, post(s.host, body) + b"\r\n" + last)
    got = responses(answer, [False, False])
    assert [status(top) for top, _ in got] == [b"HTTP/1.1 200 OK"] * 2, answer
    got = responses(after_post, [False, False])
    assert [status(top) for top, _ in got] == [b"HTTP/1.1 200 OK"] * 2, after_post
    assert got[1][1] == b"wok: metrics at /metrics\n"
    assert s.admin.posted == [{"model": "mlp"}]


async def test_more_empty_lines_than_the_limit_get_400(raw_http):
    async with Server() as s:
        answer = await raw_http(s.port, b"\r\n" * (http.MAX_EMPTY_LINES + 1) + b"GET / HTTP/1.1\r\n" + s.host + b"\r\n")
    [(top, body)] = responses(answer, [False])
    assert top.startswith(b"HTTP/1.1 400 Bad Request\r\n") and b"Connection: close" in top, answer
    assert body == f"request line: expected one within {http.MAX_EMPTY_LINES} empty lines; got more\n".encode()


@pytest.mark.parametrize("loop", LOOPS)
def test_a_kept_alive_connections_next_head_has_the_head_timeout_once_it_begins(run_on, loop, monkeypatch):
    """Its whole next head was read under IDLE_TIMEOUT_S (120 s): a client trickling it held its
    slot that long, where a new connection's head has HEADER_TIMEOUT_S."""
    monkeypatch.setattr(http, "HEADER_TIMEOUT_S", 0.4)

    async def main() -> tuple[bytes, bytes, bytes, float]:
        async with Server() as s:
            request = b"GET / HTTP/1.1\r\n" + s.host + b"\r\n"
            reader, writer = await asyncio.open_connection("127.0.0.1", s.port)
            try:
                writer.write(request)
                first = await asyncio.wait_for(reader.readuntil(b"metrics\n"), 5)
                # Idle for longer than the head timeout: the idle timeout applies, not that one.
                await asyncio.sleep(0.6)
                writer.write(request)
                second = await asyncio.wait_for(reader.readuntil(b"metrics\n"), 5)
                writer.write(request[:10])  # a head begun and never finished
                started = time.monotonic()
                rest = await asyncio.wait_for(reader.read(), 5)
                return first, second, rest, time.monotonic() - started
            finally:
                writer.close()

    first, second, rest, waited = run_on(loop, main())
    assert first.startswith(b"HTTP/1.1 200 OK\r\n") and second.startswith(b"HTTP/1.1 200 OK\r\n"), (first, second)
    assert rest == b"", rest  # closed unanswered, as a new connection's unfinished head is
    assert waited < 4, waited


@pytest.mark.parametrize("loop", LOOPS)
def test_a_crlf_after_a_post_body_does_not_begin_the_next_heads_timeout(run_on, loop, monkeypatch):
    """The CRLF RFC 9112 2.2 lets a client send after a body was taken as the next head's start:
    the kept-alive connection was closed HEADER_TIMEOUT_S after its request, not IDLE_TIMEOUT_S."""
    monkeypatch.setattr(http, "HEADER_TIMEOUT_S", 0.4)

    async def main() -> tuple[bytes, bytes, bytes, float]:
        async with Server() as s:
            request = b"GET / HTTP/1.1\r\n" + s.host + b"\r\n"
            reader, writer = await asyncio.open_connection("127.0.0.1", s.port)
            try:
                writer.write(post(s.host, b'{"model":"mlp"}') + b"\r\n")
                first = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
                length = int(first.split(b"Content-Length: ")[1].split(b"\r\n")[0])
                await asyncio.wait_for(reader.readexactly(length), 5)
                # Idle for longer than the head timeout, its CRLF sent: the idle timeout applies.
                await asyncio.sleep(0.6)
                writer.write(request)
                second = await asyncio.wait_for(reader.readuntil(b"metrics\n"), 5)
                # Empty lines, then a head begun and never finished: its head timeout still applies.
                writer.write(b"\r\n" + request[:10])
                started = time.monotonic()
                rest = await asyncio.wait_for(reader.read(), 5)
                return first, second, rest, time.monotonic() - started
            finally:
                writer.close()

    first, second, rest, waited = run_on(loop, main())
    assert first.startswith(b"HTTP/1.1 200 OK\r\n") and b"Connection: keep-alive" in first, first
    assert second.startswith(b"HTTP/1.1 200 OK\r\n"), second
    assert rest == b"", rest
    assert waited < 4, waited


async def test_expect_100_continue_is_answered_before_the_body_is_read():
    """Its client waited for a 100 that never came: curl for a second, then it sent the body."""
    async with Server() as s:
        body = b'{"model":"mlp"}'
        request = post(s.host, body, extra=b"Expect: 100-continue\r\n")
        reader, writer = await asyncio.open_connection("127.0.0.1", s.port)
        try:
            writer.write(request[: -len(body)])  # the head; the body waits for the 100
            interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            assert s.admin.posted == []
            writer.write(body + b"GET / HTTP/1.1\r\n" + s.host + b"Connection: close\r\n\r\n")
            rest = await asyncio.wait_for(reader.read(), 5)
        finally:
            writer.close()
    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
    final, after = responses(rest, [False, False])
    assert status(final[0]) == b"HTTP/1.1 200 OK" and b"Connection: keep-alive" in final[0], rest
    assert status(after[0]) == b"HTTP/1.1 200 OK", rest
    assert s.admin.posted == [{"model": "mlp"}]


@pytest.mark.parametrize(
    "change, expected",
    [
        ((b"application/json", b"text/plain"), b"HTTP/1.1 415 Unsupported Media Type"),
        ((b"/admin/faults", b"/admin/nope"), b"HTTP/1.1 404 Not Found"),
        ((b"POST /admin/faults", b"POST /"), b"HTTP/1.1 405 Method Not Allowed"),
        ((b"Content-Length: 15", b"Content-Length: 70000"), b"HTTP/1.1 413 Content Too Large"),
        ((b"Host: 127.0.0.1", b"Host: example.com"), b"HTTP/1.1 403 Forbidden"),
    ],
    ids=["415", "404", "405", "413", "403"],
)
async def test_expect_100_continue_on_a_refused_request_gets_only_its_final_answer(change, expected, raw_http):
    async with Server() as s:
        head = post(s.host, b"", length=15, extra=b"Expect: 100-continue\r\n").replace(*change)
        answer = await raw_http(s.port, head)  # the body is never sent
    [(top, _)] = responses(answer, [False])
    assert status(top) == expected and b"Connection: close" in top, answer
    assert s.admin.posted == []


async def test_http10_expect_100_continue_is_ignored(raw_http):
    """RFC 9110 10.1.1: an HTTP/1.0 client does not wait for a 100; none is sent."""
    async with Server() as s:
        body = b'{"model":"mlp"}'
        request = post(s.host, body, extra=b"Expect: 100-continue\r\n").replace(b"HTTP/1.1", b"HTTP/1.0")
        answer = await raw_http(s.port, request)
    [(top, _)] = responses(answer, [False])
    assert top.startswith(b"HTTP/1.1 200 OK\r\n") and b"Connection: close" in top, answer
    assert s.admin.posted == [{"model": "mlp"}]


@pytest.mark.parametrize("expect", [b"foo", b"100-continue, foo"])
async def test_an_unknown_expectation_gets_417_and_the_connection_ends(expect, raw_http):
    """It was ignored: the POST applied, a client waiting for what it expected left unanswered."""
    async with Server() as s:
        posted = await raw_http(s.port, post(s.host, b'{"model":"mlp"}', extra=b"Expect: " + expect + b"\r\n"))
        scrape = await raw_http(s.port, b"GET /metrics HTTP/1.1\r\n" + s.host + b"Expect: " + expect + b"\r\n\r\n")
    for answer in (posted, scrape):
        [(top, body)] = responses(answer, [False])
        assert top.startswith(b"HTTP/1.1 417 Expectation Failed\r\n") and b"Connection: close" in top, answer
        assert body == b"Expect: expected 100-continue; got '" + expect + b"'\n"
    assert s.admin.posted == []


@pytest.mark.parametrize("loop", LOOPS)
def test_a_client_that_closes_before_its_body_ends_the_connection_with_no_error(run_on, loop, caplog):
    """Its 400, written to a socket the client had closed, drew a reset; the half-close after it
    then raised OSError (ENOTCONN), which ended the task unhandled: asyncio logged it as an ERROR."""

    async def main() -> list:
        async with Server() as s:
            at_body = _gate_admin(s)
            _, writer = await asyncio.open_connection("127.0.0.1", s.port)
            writer.write(post(s.host, b"", length=15))
            await asyncio.wait_for(at_body.acquire(), 5)
            tasks = list(s.http._clients)
            writer.close()  # a full close: what the server writes next draws a reset
            return await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 5)

    with caplog.at_level(logging.ERROR):
        ended = run_on(loop, main())
    assert ended == [None], ended
    assert errors(caplog) == []


async def test_a_head_the_client_sends_byte_by_byte_is_read(raw_http):
    """The head's first byte is read on its own (its wait is the idle one): the rest must join it."""
    async with Server() as s:
        request = b"GET / HTTP/1.1\r\n" + s.host + b"Connection: close\r\n\r\n"
        with socket.create_connection(("127.0.0.1", s.port), timeout=5) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def send() -> bytes:
                for i in range(len(request)):
                    sock.sendall(request[i : i + 1])
                out = b""
                while chunk := sock.recv(1 << 16):
                    out += chunk
                return out

            answer = await asyncio.to_thread(send)
    [(top, body)] = responses(answer, [False])
    assert top.startswith(b"HTTP/1.1 200 OK\r\n"), answer
    assert body == b"wok: metrics at /metrics\n"


@pytest.mark.parametrize(
    "length",
    [b"abc", b"-1", b"+2", b"2, 2", b"0x2", b"", b"\xb2"],
    ids=["word", "minus", "plus", "list", "hex", "empty", "superscript"],
)
@pytest.mark.parametrize("target", [b"GET /metrics", b"POST /admin/faults"], ids=["get", "admin-post"])
async def test_a_content_length_that_is_not_a_number_gets_400_naming_it_and_the_connection_ends(
    target, length, raw_http
):
    """RFC 9112 6.3: the body's end is unknown, so the request is refused. A GET was answered 200
    (its connection then closed); an admin POST got 411 "a POST needs a Content-Length", which it had."""
    async with Server() as s:
        head = target + b" HTTP/1.1\r\n" + s.host + b"Content-Type: application/json\r\nContent-Length: " + length
        answer = await raw_http(s.port, head + b"\r\n\r\n{}GET / HTTP/1.1\r\n" + s.host + b"\r\n")
    [(top, body)] = responses(answer, [False])
    assert top.startswith(b"HTTP/1.1 400 Bad Request\r\n") and b"Connection: close" in top, answer
    # Quoted as the other refusals show a header's value: the superscript two went out as the raw byte.
    shown = http.quoted(length.decode("latin-1")).encode()
    assert body == b"Content-Length: expected a number of bytes; got " + shown + b"\n"
    assert s.admin.posted == []


@pytest.mark.parametrize(
    "length",
    [b"99999999999", b"1" * 5000, b"0" * 20 + b"65537"],
    ids=["eleven-digits", "5000-digits", "zeros-then-over"],
)
async def test_an_admin_post_whose_content_length_is_over_the_limit_gets_413_however_it_is_written(length, raw_http):
    """One of ten or more digits was answered 411, "a POST needs a Content-Length"."""
    async with Server() as s:
        head = b"POST /admin/faults HTTP/1.1\r\n" + s.host + b"Content-Type: application/json\r\nContent-Length: "
        answer = await raw_http(s.port, head + length + b"\r\n\r\n{}")
        # Leading zeros are still a number of bytes: this one is 2, and is taken.
        taken = await raw_http(s.port, head + b"0" * 20 + b"2\r\nConnection: close\r\n\r\n{}")
    [(top, body)] = responses(answer, [False])
    assert top.startswith(b"HTTP/1.1 413 Content Too Large\r\n") and b"Connection: close" in top, answer
    shown = http.quoted(length.decode())  # 5,000 digits cut, as every value a request sent is shown
    assert json.loads(body) == {"error": f"Content-Length: expected at most {http.MAX_BODY_BYTES} bytes; got {shown}"}
    assert status(responses(taken, [False])[0][0]) == b"HTTP/1.1 200 OK", taken
    assert s.admin.posted == [{}]


async def test_an_admin_post_without_a_content_length_gets_411_naming_the_header(raw_http):
    """It was "a POST needs a Content-Length": no header named first, as every other refusal names it."""
    async with Server() as s:
        head = b"POST /admin/faults HTTP/1.1\r\n" + s.host + b"Content-Type: application/json\r\n\r\n{}"
        answer = await raw_http(s.port, head)
    [(top, body)] = responses(answer, [False])
    assert top.startswith(b"HTTP/1.1 411 Length Required\r\n") and b"Connection: close" in top, answer
    assert json.loads(body) == {"error": "Content-Length: expected one header for a POST; got none"}
    assert s.admin.posted == []


async def test_a_head_request_that_fails_gets_a_500_without_a_body(caplog, raw_http):
    """The 500 carried its JSON body after a HEAD too, which a client reads as the next answer's start."""
    registry = CollectorRegistry()
    registry.register(BrokenCollector())
    async with Server(registry) as s:
        with caplog.at_level(logging.ERROR):
            answer = await raw_http(s.port, b"HEAD /metrics HTTP/1.1\r\n" + s.host + b"\r\n")
    [(top, _)] = responses(answer, [True])
    assert top.startswith(b"HTTP/1.1 500 Internal Server Error\r\n") and b"Connection: close" in top, answer
    assert int(top.split(b"Content-Length: ")[1].split(b"\r\n")[0]) > 0  # GET's length, as for any HEAD
    assert errors(caplog) == ["wok.http: HEAD /metrics failed"]


@pytest.mark.parametrize("target", [b"GET /metrics", b"HEAD /", b"GET /admin/faults"], ids=["metrics", "head", "admin"])
async def test_an_http11_request_without_host_gets_400_and_http10_is_served(target, raw_http):
    """RFC 9112 3.2: a server MUST answer 400 to an HTTP/1.1 request without Host. It was served
    (the admin paths answered 403, "Host '' is not an IP address")."""
    head = target.startswith(b"HEAD")
    async with Server() as s:
        answer = await raw_http(
            s.port, target + b" HTTP/1.1\r\nAccept: */*\r\n\r\nGET / HTTP/1.1\r\n" + s.host + b"\r\n"
        )
        old = await raw_http(s.port, b"GET / HTTP/1.0\r\n\r\n")
    [(top, body)] = responses(answer, [head])
    assert top.startswith(b"HTTP/1.1 400 Bad Request\r\n") and b"Connection: close" in top, answer
    assert head or body == b"Host: expected one header; got none (RFC 9112 3.2)\n"
    assert status(responses(old, [False])[0][0]) == b"HTTP/1.1 200 OK", old


async def test_an_absolute_form_target_is_served_and_its_authority_stands_for_host(raw_http):
    """RFC 9112 3.2.2: a server MUST accept `GET http://host:port/path`, which clients send to a
    proxy; it got 404. Host is then ignored: the admin paths' cross-site check reads the URL's authority."""
    async with Server() as s:
        url = f"http://127.0.0.1:{s.port}"
        close = b"Connection: close\r\n\r\n"
        metrics = await raw_http(s.port, f"GET {url}/metrics?x=1 HTTP/1.1\r\n".encode() + s.host + close)
        # The scheme is case-insensitive; no path is "/"; HTTP/1.0 needs no Host.
        root = await raw_http(s.port, f"GET HTTP://127.0.0.1:{s.port} HTTP/1.0\r\n\r\n".encode())
        named = f"GET http://localhost:{s.port}/admin/faults HTTP/1.1\r\nHost: rebound.example\r\n".encode()
        named = await raw_http(s.port, named + close)
        rebound = f"GET http://rebound.example:{s.port}/admin/faults HTTP/1.1\r\n".encode() + s.host + close
        refused = await raw_http(s.port, rebound)
        absolute = post(s.host, b"{}", extra=b"Connection: close\r\n").replace(b" /admin/", f" {url}/admin/".encode())
        posted = await raw_http(s.port, absolute)
    top, body = responses(metrics, [False])[0]
    assert status(top) == b"HTTP/1.1 200 OK" and b"Content-Type: text/plain; version=" in top, metrics
    assert responses(root, [False])[0][1] == b"wok: metrics at /metrics\n", root
    assert responses(named, [False])[0][1] == b'{"faults":[]}\n', named
    top, body = responses(refused, [False])[0]
    assert status(top) == b"HTTP/1.1 403 Forbidden", refused
    # Named as the URL's: the Host header, 127.0.0.1, is not what was refused.
    assert json.loads(body) == {
        "error": "the request target's host: expected an IP address or localhost, all the admin API answers; "
        f"got 'rebound.example:{s.port}'"
    }
    assert status(responses(posted, [False])[0][0]) == b"HTTP/1.1 200 OK", posted
    assert s.admin.posted == [{}]


@pytest.mark.parametrize(
    "target, error",
    [
        ("http://u@127.0.0.1/metrics", "'http://u@127.0.0.1/metrics'"),
        ("http:///metrics", "'http:///metrics'"),
    ],
    ids=["userinfo", "no-host"],
)
async def test_an_absolute_form_target_without_a_host_or_with_userinfo_gets_400(target, error, raw_http):
    """RFC 9110 4.2.1 (an http URL with no host MUST be rejected), 4.2.4 (userinfo is an error)."""
    async with Server() as s:
        answer = await raw_http(s.port, f"GET {target} HTTP/1.1\r\n".encode() + s.host + b"Connection: close\r\n\r\n")
    [(top, body)] = responses(answer, [False])
    assert status(top) == b"HTTP/1.1 400 Bad Request" and b"Connection: close" in top, answer
    assert body.decode() == f"request target: expected an http URL with a host and no userinfo; got {error}\n"


@pytest.mark.parametrize("method", ["POST", "DELETE", "PUT"])
async def test_any_method_on_a_path_not_served_gets_404(method, raw_http):
    """A 405 says the resource exists, but not the method (RFC 9110 15.5.6): any method but GET
    and HEAD got it on any path, with `Allow: GET, HEAD`. `/` and `/metrics` still answer 405."""
    async with Server() as s:
        request = f"{method} /nowhere HTTP/1.1\r\n".encode() + s.host + b"Content-Length: 2\r\n\r\n{}"
        answer = await raw_http(s.port, request)  # the body is not read: the connection ends
        served = await raw_http(
            s.port, f"{method} /metrics HTTP/1.1\r\n".encode() + s.host + b"Connection: close\r\n\r\n"
        )
    [(top, body)] = responses(answer, [False])
    assert status(top) == b"HTTP/1.1 404 Not Found" and b"Allow:" not in top and b"Connection: close" in top, answer
    assert body == b"no path '/nowhere' here; paths: /metrics, /, /admin/faults, /admin/batching, /events\n"
    assert status(responses(served, [False])[0][0]) == b"HTTP/1.1 405 Method Not Allowed", served


async def test_the_cross_site_refusal_shows_what_was_sent_escaped_and_cut(raw_http):
    """It showed the Host and the Origin with repr(): a 16 KiB Host made a 16 KiB 403, and a
    quote in it changed the quotes; the 400s show what a request sent with `quoted`."""
    long_host, long_origin = "a" * 300, "http://evil.example/" + "x" * 300
    async with Server() as s:
        host = await raw_http(s.port, f"GET /admin/faults HTTP/1.1\r\nHost: {long_host}\r\n\r\n".encode())
        quote = await raw_http(s.port, b"GET /admin/faults HTTP/1.1\r\nHost: rebound'example\r\n\r\n")
        origin = await raw_http(
            s.port, b"GET /admin/faults HTTP/1.1\r\n" + s.host + b"Origin: " + long_origin.encode() + b"\r\n\r\n"
        )
    answers = [json.loads(responses(a, [False])[0][1])["error"] for a in (host, quote, origin)]
    assert answers == [
        f"Host: expected an IP address or localhost, all the admin API answers; got '{'a' * 200}'… (300 characters "
        "in all)",
        "Host: expected an IP address or localhost, all the admin API answers; got 'rebound'example'",
        f"Origin: expected none or this server's, 'http://127.0.0.1:{s.port}' (the admin API takes no cross-site "
        f"requests); got '{long_origin[:200]}'… (320 characters in all)",
    ]
