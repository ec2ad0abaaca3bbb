"""The metrics/admin HTTP server (server/http.py) against raw sockets: what a refusal shows of what
the request sent (quoted: cut past 200 characters, escaped), and a request line too long for it."""

from __future__ import annotations

import asyncio
import json

import pytest

from wok import http

from .test_http import Server, post, responses

# 10,000 characters of what a client sent: shown as its first 200, in quotes, and its length.
LONG = "z" * 10_000
LONG_SHOWN = f"'{'z' * 200}'… (10,000 characters in all)"


@pytest.mark.parametrize(
    "expects, shown",
    [
        ([b"foo\x1b[31m"], "'foo\\x1b[31m'"),  # a terminal's escape, as the 400s show one
        ([b"caf\xe9"], "'caf\\xe9'"),  # the head is read as Latin-1, a byte a character
        ([LONG.encode()], LONG_SHOWN),
        ([b"foo", b"bar"], "'foo', 'bar'"),
    ],
    ids=["escape", "latin-1", "long", "two-lines"],
)
async def test_an_unmet_expectation_is_shown_quoted_escaped_and_cut(expects, shown, raw_http):
    """The 417 echoed the Expect value as sent: 10,000 bytes of it made a 10 KB answer, and a
    terminal's escape in it reached the client's terminal, where every other refusal quotes it."""
    async with Server() as s:
        fields = b"".join(b"Expect: " + e + b"\r\n" for e in expects)
        answer = await raw_http(s.port, b"GET /metrics HTTP/1.1\r\n" + s.host + fields + b"\r\n")
    [(top, body)] = responses(answer, [False])
    assert top.startswith(b"HTTP/1.1 417 Expectation Failed\r\n") and b"Connection: close" in top, answer
    assert body.decode() == f"Expect: expected 100-continue; got {shown}\n"


@pytest.mark.parametrize(
    "fields, shown",
    [
        (b"Host: ev\x1bil\xe9\r\n", "Host: expected one header; got 2: '127.0.0.1:{port}', 'ev\\x1bil\\xe9'"),
        (b"Host: " + LONG.encode() + b"\r\n", "Host: expected one header; got 2: '127.0.0.1:{port}', " + LONG_SHOWN),
        (
            b"Content-Length: 0\r\nContent-Length: 0" + b"0" * 10_000 + b"\r\n",
            "Content-Length: expected one header; got 2: '0', '" + "0" * 200 + "'… (10,001 characters in all)",
        ),
    ],
    ids=["escape", "long-host", "long-length"],
)
async def test_a_repeated_header_is_shown_quoted_escaped_and_cut(fields, shown, raw_http):
    async with Server() as s:
        answer = await raw_http(s.port, b"GET /metrics HTTP/1.1\r\n" + s.host + fields + b"\r\n")
    [(top, body)] = responses(answer, [False])
    assert top.startswith(b"HTTP/1.1 400 Bad Request\r\n") and b"Connection: close" in top, answer
    assert body.decode() == shown.format(port=s.port) + "\n"


@pytest.mark.parametrize(
    "path, error",
    [
        ("/metrics", "'/metrics': expected GET or HEAD; got {method}"),
        ("/events", "'/events': expected GET; got {method}"),
        ("/admin/faults", "'/admin/faults': expected GET, HEAD or POST; got {method}"),
    ],
)
async def test_a_405_shows_a_long_method_cut(path, error, raw_http):
    """A method is a token of any length: one of 10,000 characters made a 10 KB 405."""
    async with Server() as s:
        answer = await raw_http(s.port, f"{LONG} {path} HTTP/1.1\r\n".encode() + s.host + b"Connection: close\r\n\r\n")
    [(top, body)] = responses(answer, [False])
    assert top.startswith(b"HTTP/1.1 405 Method Not Allowed\r\n"), answer[:200]
    shown = json.loads(body)["error"] if path.startswith("/admin/") else body.decode().removesuffix("\n")
    assert shown == error.format(method=LONG_SHOWN)


@pytest.mark.parametrize("ctype, shown", [(LONG, LONG_SHOWN), ("text/x\x1b", "'text/x\\x1b'")], ids=["long", "escape"])
async def test_a_415_shows_the_content_type_quoted_and_cut(ctype, shown, raw_http):
    async with Server() as s:
        request = (
            b"POST /admin/faults HTTP/1.1\r\n" + s.host + f"Content-Type: {ctype}\r\n".encode("latin-1")
        ) + b"Content-Length: 2\r\nConnection: close\r\n\r\n{}"
        answer = await raw_http(s.port, request)
    [(top, body)] = responses(answer, [False])
    assert top.startswith(b"HTTP/1.1 415 Unsupported Media Type\r\n"), answer[:200]
    assert json.loads(body) == {"error": f"Content-Type: expected application/json for a POST; got {shown}"}
    assert s.admin.posted == []


async def test_a_request_line_over_the_head_limit_gets_414_not_431(raw_http):
    """A URL too long (a browser's, curl's) was told that its request headers were too large (431);
    RFC 9112 3: a target longer than the server will parse gets 414. Headers over the limit keep 431."""
    async with Server() as s:
        target = b"/metrics?" + b"a" * (http.MAX_HEADER_BYTES + 100)
        long_target = await raw_http(s.port, b"GET " + target + b" HTTP/1.1\r\n" + s.host + b"\r\n")
        # Under the reader's limit, with no line end yet: over it once the line ends.
        just_over = b"GET /" + b"a" * (http.MAX_HEADER_BYTES - 15) + b" HTTP/1.1\r\n"
        assert len(just_over) > http.MAX_HEADER_BYTES
        line_then_end = await raw_http(s.port, just_over + s.host + b"\r\n")
        long_header = await raw_http(
            s.port, b"GET /metrics HTTP/1.1\r\n" + s.host + b"X-A: " + b"a" * 20_000 + b"\r\n\r\n"
        )
    for answer in (long_target, line_then_end):
        [(top, body)] = responses(answer, [False])
        assert top.startswith(b"HTTP/1.1 414 URI Too Long\r\n") and b"Connection: close" in top, answer[:200]
        assert body == b"request line: expected at most 16384 bytes; got more: its target is too long\n"
    [(top, body)] = responses(long_header, [False])
    assert top.startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n"), long_header[:200]
    assert body == b"request head: expected at most 16384 bytes; got more\n"


async def test_a_body_cut_short_names_its_content_length_as_a_number():
    """A Content-Length of 10,000 zeros then 15 is 15, within the limit: the 400 for its body's early
    end echoed the 10 KB of digits."""
    async with Server() as s:
        reader, writer = await asyncio.open_connection("127.0.0.1", s.port)
        try:
            writer.write(post(s.host, b"").replace(b"Content-Length: 0", b"Content-Length: " + b"0" * 10_000 + b"15"))
            writer.write(b'{"model":')
            writer.write_eof()  # the client says it has sent all
            answer = await asyncio.wait_for(reader.read(), 5)
        finally:
            writer.close()
    [(top, body)] = responses(answer, [False])
    assert top.startswith(b"HTTP/1.1 400 Bad Request\r\n"), answer[:200]
    assert json.loads(body) == {"error": "body: expected Content-Length 15 bytes; got 9 bytes and end of stream"}
    assert s.admin.posted == []
