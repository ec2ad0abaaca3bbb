"""The metrics port's refusals (server/http.py) against raw sockets on loopback, as RFC 9110 and 9112
word them: a malformed head line shown escaped in ASCII and cut as every value is, a Transfer-Encoding
answered 501 or 400 by what it says, 413 under its RFC 9110 name."""

from __future__ import annotations

import pytest

from wok import http
from wok.errors import quoted_name

from .test_http import Server, post, responses


def status(top: bytes) -> bytes:
    return top.split(b"\r\n")[0]


@pytest.mark.parametrize(
    "head, shown",
    [
        # The request line split in four: its 0xe9 (é read as Latin-1) went out raw, as repr keeps it.
        (b"GET /caf\xe9 x HTTP/1.1\r\n", "request line: expected a method, a target and a version separated by "
         "single spaces; got 'GET /caf\\xe9 x HTTP/1.1'"),
        (b"G\xe9T / HTTP/1.1\r\n", "request line: expected a method (a token); got 'G\\xe9T'"),
        (b"GET / HTTP/1.\xb9\r\n", "request line: expected HTTP/<digit>.<digit> as its version; got 'HTTP/1.\\xb9'"),
        (b"GET / HTTP/1.1\r\nX-Caf\xe9: 1\r\n", "header line 1: expected a field name (a token); got 'X-Caf\\xe9: 1'"),
        (b"GET / HTTP/1.1\r\nX-A: \xa0\xad\xff\n", "header line 1: expected CRLF at its end; got a bare LF: "
         "'X-A: \\xa0\\xad\\xff'"),
        # repr shows a line with a single quote between double ones: quoted as every other value is.
        (b"GET /it's x HTTP/1.1\r\n", "request line: expected a method, a target and a version separated by "
         "single spaces; got 'GET /it's x HTTP/1.1'"),
    ],
    ids=["request-line", "method", "version", "header-name", "bare-lf", "quote"],
)  # fmt: skip
async def test_a_malformed_line_s_400_shows_it_escaped_in_ascii(head, shown, raw_http):
    """Shown by its repr, printable Latin-1 (é, a no-break space, ÿ) went out as raw bytes in a
    text answer, not UTF-8 and not escaped as the rest of the port's refusals escape what came."""
    async with Server() as s:
        answer = await raw_http(s.port, head + s.host + b"\r\n")
    [(top, body)] = responses(answer, [False])
    assert status(top) == b"HTTP/1.1 400 Bad Request" and b"Connection: close" in top, answer
    assert body.isascii(), body
    assert body.decode() == shown + "\n"


async def test_a_malformed_line_is_cut_as_every_value_is(raw_http):
    """Cut past 120 characters with "..." inside its quotes: neither the length nor the end of the
    cut said as every other cut value says it."""
    line = "GET /" + "a" * 2000 + " b HTTP/1.1"
    async with Server() as s:
        answer = await raw_http(s.port, line.encode() + b"\r\n" + s.host + b"\r\n")
    [(_, body)] = responses(answer, [False])
    shown = f"'{line[:200]}'… ({len(line):,} characters in all)"
    assert body.decode() == (
        f"request line: expected a method, a target and a version separated by single spaces; got {shown}\n"
    )
    assert shown == quoted_name(line)  # the note of errors' quoting, to the character


@pytest.mark.parametrize(
    "codings",
    [
        [b"chunked"],
        [b"gzip, chunked"],
        [b"gzip", b"chunked"],
        [b"Chunked"],
        [b"gzip;level=1 , chunked"],
        # A comma or semicolon in a quoted parameter value is its text, not a separator (RFC 9110 5.6.1,
        # 5.6.4): split there, the list read as malformed and got 400.
        [b'gzip;q="a,b", chunked'],
        [b'gzip;q="a;b\\",c", chunked'],
        # Whitespace around a parameter's "=" (BWS, RFC 9112 7) is parsed and removed.
        [b"gzip;level = 1, chunked"],
    ],
    ids=["chunked", "gzip-chunked", "two-lines", "case", "parameter", "quoted-comma", "quoted-escape", "bws"],
)
async def test_a_chunked_request_gets_501_and_the_connection_ends(codings, raw_http):
    """RFC 9112 6.1: a server that receives a transfer coding it does not understand SHOULD answer 501.
    Framed by chunked (the last coding) it is well formed: this server reads bodies by Content-Length
    alone. It got 400, which told its client its request was malformed."""
    async with Server() as s:
        body = b'{"model": "mlp", "mode": "off"}'
        fields = b"".join(b"Transfer-Encoding: " + c + b"\r\n" for c in codings)
        answer = await raw_http(s.port, post(s.host, body, extra=fields) + b"GET / HTTP/1.1\r\n" + s.host + b"\r\n")
    [(top, got)] = responses(answer, [False])  # one answer: the connection ends
    assert status(top) == b"HTTP/1.1 501 Not Implemented" and b"Connection: close" in top, answer
    shown = ", ".join(f"'{c.decode()}'" for c in codings)
    assert got.decode() == (
        "Transfer-Encoding: expected none, since this server reads a body by its Content-Length alone (RFC 9112 "
        f"6.1): send one; got {shown}\n"
    )
    assert s.admin.posted == []


@pytest.mark.parametrize(
    "version, coding, why",
    [
        ("HTTP/1.1", "gzip", "expected chunked as the last coding, and once (RFC 9112 6.3: else where the body "
         "ends is unknown); got 'gzip'"),
        ("HTTP/1.1", "chunked, gzip", "expected chunked as the last coding, and once (RFC 9112 6.3: else where "
         "the body ends is unknown); got 'chunked, gzip'"),
        ("HTTP/1.1", "chunked, chunked", "expected chunked as the last coding, and once (RFC 9112 6.3: else where "
         "the body ends is unknown); got 'chunked, chunked'"),
        ("HTTP/1.1", "", "expected chunked as the last coding, and once (RFC 9112 6.3: else where the body ends "
         "is unknown); got ''"),
        ("HTTP/1.1", "chunked x", "expected a list of transfer codings (RFC 9112 7); got 'chunked x'"),
        ("HTTP/1.1", "chu\xe9nked", "expected a list of transfer codings (RFC 9112 7); got 'chu\\xe9nked'"),
        ("HTTP/1.0", "chunked", "expected none in an HTTP/1.0 request (RFC 9112 6.1); got 'chunked'"),
        # chunked inside a quoted parameter value is no coding: gzip is the last one.
        ("HTTP/1.1", 'gzip;x="a, chunked"', "expected chunked as the last coding, and once (RFC 9112 6.3: else "
         "where the body ends is unknown); got 'gzip;x=\"a, chunked\"'"),
        ("HTTP/1.1", 'gzip;x="a, chunked', "expected a list of transfer codings (RFC 9112 7); got "
         "'gzip;x=\"a, chunked'"),
    ],
    ids=[
        "not-chunked", "chunked-not-last", "chunked-twice", "empty", "malformed", "latin-1", "http-1.0",
        "chunked-quoted", "quote-unclosed",
    ],
)  # fmt: skip
async def test_a_transfer_encoding_that_does_not_frame_the_request_gets_400(version, coding, why, raw_http):
    """RFC 9112 6.3: chunked not the last coding, the body's length cannot be known: a server MUST
    answer 400 and close; 6.1: in HTTP/1.0 a Transfer-Encoding MUST be taken as faulty framing."""
    async with Server() as s:
        request = post(s.host, b"{}", extra=f"Transfer-Encoding: {coding}\r\n".encode("latin-1"))
        answer = await raw_http(s.port, request.replace(b"HTTP/1.1", version.encode(), 1))
    [(top, got)] = responses(answer, [False])
    assert status(top) == b"HTTP/1.1 400 Bad Request" and b"Connection: close" in top, answer
    assert got.decode() == f"Transfer-Encoding: {why}\n"
    assert s.admin.posted == []


async def test_a_413_has_rfc_9110_s_reason_phrase(raw_http):
    """RFC 9110 15.5.14 names 413 Content Too Large; Payload Too Large was RFC 7231's name."""
    async with Server() as s:
        head = b"POST /admin/faults HTTP/1.1\r\n" + s.host + b"Content-Type: application/json\r\n"
        answer = await raw_http(s.port, head + b"Content-Length: 70000\r\n\r\n")
    [(top, _)] = responses(answer, [False])
    assert status(top) == b"HTTP/1.1 413 Content Too Large", answer
    assert http.REASONS[413] == "Content Too Large"


def test_a_value_is_cut_as_errors_cut_a_name():
    """One style for every cut value: it was `'…'... (N bytes in all)` here and `'…'… (N characters
    in all)` in every other message (errors.quoted_name)."""
    for text in ("z" * 201, "p" * 15_000):
        assert http.quoted(text) == quoted_name(text)
    assert http.quoted("é" * 300).endswith("\\xe9'… (300 characters in all)")
    # Not Latin-1 (the demo quotes the admin API's JSON text): escaped as Python writes it.
    assert http.quoted("a\u2026\U0001f600") == "'a\\u2026\\U0001f600'"


# A request line of MAX_HEADER_BYTES + 1 bytes, its CRLF in them: read whole (the reader's limit is
# past its first byte, which request_start reads), then found over the head's limit.
JUST_TOO_LONG = b"HEAD /metrics?" + b"a" * (http.MAX_HEADER_BYTES + 1 - len(b"HEAD /metrics? HTTP/1.1\r\n"))
JUST_TOO_LONG += b" HTTP/1.1\r\n"
TOO_LARGE = b"431 Request Header Fields Too Large"


@pytest.mark.parametrize(
    "request_head, answer_status",
    [
        pytest.param(b"HEAD /metrics?" + b"a" * 20_000 + b" HTTP/1.1\r\n{host}\r\n", b"414 URI Too Long", id="url"),
        pytest.param(JUST_TOO_LONG + b"{host}\r\n", b"414 URI Too Long", id="url-just-over"),
        pytest.param(b"HEAD /metrics HTTP/1.1\r\n{host}X-Big: " + b"a" * 20_000 + b"\r\n\r\n", TOO_LARGE, id="head"),
        pytest.param(
            b"HEAD /metrics HTTP/1.1\r\n{host}X-Big: " + b"a" * 16_340 + b"\r\n\r\n", TOO_LARGE, id="head-just-over"
        ),
        pytest.param(b"HEAD /metrics HTTP/1.1\n{host}\r\n", b"400 Bad Request", id="request-line-lf"),
        pytest.param(b"HEAD /metrics HTTP/1.1\r\n{host}X-A: 1\n\r\n", b"400 Bad Request", id="header-lf"),
        pytest.param(b"HEAD /metrics HTTP/1.1\r\n{host}X-A: 1\r\r\n\r\n", b"400 Bad Request", id="header-cr"),
        pytest.param(b"HEAD  /metrics HTTP/1.1\r\n{host}\r\n", b"400 Bad Request", id="two-spaces"),
        pytest.param(b"HEAD  HTTP/1.1\r\n{host}\r\n", b"400 Bad Request", id="no-target"),
    ],
)
async def test_a_head_refused_as_its_head_is_read_has_no_body(request_head, answer_status, raw_http):
    """Refused before its request line was parsed (or for it), a HEAD's answer carried a body (RFC
    9110 9.3.2: none): its URL too long (414), its head too large (431), a line malformed (400)."""
    async with Server() as s:
        answer = await raw_http(s.port, request_head.replace(b"{host}", s.host))
    [(top, body)] = responses(answer, [True])  # and then the connection's end, no body before it
    assert status(top) == b"HTTP/1.1 " + answer_status and b"Connection: close" in top, answer[:300]
    assert body == b""
