"""The metrics/admin HTTP server (server/http.py) against raw sockets: Host values held to RFC 9110
7.2, the Date header on every answer, and 404 bodies that name the path and those served."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from email.utils import parsedate_to_datetime

import pytest
from prometheus_client import CollectorRegistry

from wok import http
from wok.bench.scrape import read_metrics

from .test_http import Server, StubAdmin, responses

# RFC 9110 5.6.7's IMF-fixdate, the form a sender MUST generate.
IMF_FIXDATE = re.compile(
    rb"Date: (?:Mon|Tue|Wed|Thu|Fri|Sat|Sun), [0-9]{2} (?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) "
    rb"[0-9]{4} [0-9]{2}:[0-9]{2}:[0-9]{2} GMT"
)
SHAPE = "host[:port] (a name, an IPv4 address or a bracketed IPv6 one; RFC 9110 7.2)"
ALL_PATHS = "/metrics, /, /admin/faults, /admin/batching, /events"
# Pipelined after a request: after a refused one never served; after one served, the last.
NEXT = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"


def status(top: bytes) -> bytes:
    return top.split(b"\r\n")[0]


def dated(top: bytes, before: int, after: int) -> bool:
    """Whether an answer's head has one Date, an IMF-fixdate within [before, after] (whole seconds)."""
    found = IMF_FIXDATE.findall(top)
    if len(found) != 1 or top.count(b"\r\nDate:") != 1:
        return False
    when = parsedate_to_datetime(found[0][len(b"Date: ") :].decode()).timestamp()
    return before <= when <= after


@contextlib.asynccontextmanager
async def serving(*, admin: bool = True, metrics: bool = True):
    """A started MetricsHTTPServer on loopback, with a stand-in admin or none."""
    server = http.MetricsHTTPServer(
        CollectorRegistry(), "127.0.0.1", 0, admin=StubAdmin() if admin else None, metrics=metrics
    )
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.mark.parametrize(
    "value, shown",
    [
        (b"a b", "'a b'"),
        (b"x/y", "'x/y'"),
        (b"::1", "'::1'"),  # an IPv6 address without its brackets
        (b"[::1", "'[::1'"),
        (b"[zz]:80", "'[zz]:80'"),
        (b"[1.2.3.4]", "'[1.2.3.4]'"),
        (b"127.0.0.1:80x", "'127.0.0.1:80x'"),
        (b"h:80:90", "'h:80:90'"),
        (b"[fe80::1%eth0]", "'[fe80::1%eth0]'"),  # a zone unencoded (RFC 6874 has it %25)
        (b"a\x1b[2Jb", "'a\\x1b[2Jb'"),
        (b"back\\slash\x7f", "'back\\\\slash\\x7f'"),
        (b"caf\xc3\xa9", "'caf\\xc3\\xa9'"),  # UTF-8, not punycode: bytes, each shown
        (b"a" * 5000 + b" b", "'" + "a" * 200 + "'… (5,002 characters in all)"),
    ],
    ids=[
        "space", "slash", "bare-ipv6", "open-bracket", "bad-literal", "ipv4-literal", "bad-port", "two-ports",
        "zone-unencoded", "escape", "backslash", "utf8", "long",
    ],
)  # fmt: skip
async def test_a_host_that_is_not_host_port_gets_400_naming_it(value, shown, raw_http):
    """RFC 9112 3.2: a server MUST answer 400 to a request whose Host is not a valid value. Each
    was served; the body names the value escaped and capped (a 5,000-byte Host, no 5,000-byte body)."""
    async with Server() as s:
        answer = await raw_http(s.port, b"GET /metrics HTTP/1.1\r\nHost: " + value + b"\r\n\r\n" + NEXT)
        head = await raw_http(s.port, b"HEAD /metrics HTTP/1.1\r\nHost: " + value + b"\r\n\r\n" + NEXT)
    [(top, body)] = responses(answer, [False])  # one answer: the connection ends
    assert status(top) == b"HTTP/1.1 400 Bad Request" and b"Connection: close" in top, answer
    assert body.decode() == f"Host: expected {SHAPE}; got {shown}\n"
    [(top, _)] = responses(head, [True])
    assert status(top) == b"HTTP/1.1 400 Bad Request", head


@pytest.mark.parametrize("host", ["127.0.0.1/x", "localhost?x", "127.0.0.1#x"], ids=["path", "query", "fragment"])
async def test_an_admin_post_whose_host_is_not_host_port_is_refused_and_not_applied(host, raw_http):
    """Read as a URL's authority, these are 127.0.0.1 or localhost, and the cross-site check let
    the POST through: the fault was applied."""
    async with Server() as s:
        body = b'{"model": "mlp", "mode": "fail"}'
        request = (
            f"POST /admin/faults HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        ).encode() + body
        answer = await raw_http(s.port, request)
    [(top, got)] = responses(answer, [False])
    assert status(top) == b"HTTP/1.1 400 Bad Request" and b"Connection: close" in top, answer
    assert got.decode() == f"Host: expected {SHAPE}; got '{host}'\n"
    assert s.admin.posted == []


@pytest.mark.parametrize(
    "target, shown",
    [("http://a%zz/metrics", "'a%zz'"), ("http://h:8x/metrics", "'h:8x'"), ("http://:80/metrics", None)],
    ids=["bad-escape", "bad-port", "no-host"],
)
async def test_an_absolute_form_target_whose_authority_is_not_host_port_gets_400(target, shown, raw_http):
    """It takes Host's place (RFC 9112 3.2.2), and the admin check reads it: it was served, and
    `http://:80/`, with no host, too (RFC 9110 4.2.1: a recipient MUST reject it)."""
    async with Server() as s:
        answer = await raw_http(s.port, f"GET {target} HTTP/1.1\r\n".encode() + s.host + b"\r\n" + NEXT)
    [(top, body)] = responses(answer, [False])
    assert status(top) == b"HTTP/1.1 400 Bad Request" and b"Connection: close" in top, answer
    if shown is None:
        assert body.decode() == f"request target: expected an http URL with a host and no userinfo; got '{target}'\n"
    else:
        assert body.decode() == f"request target: expected an http URL whose authority is {SHAPE}; got {shown}\n"


async def test_the_hosts_real_clients_send_are_served_each_answer_dated(raw_http):
    """What must not be refused: Prometheus and kubelet's probes (an address and port, IPv6 in
    brackets), curl and the bench (localhost, a name with dashes and dots), an empty port, an empty
    Host (RFC 9112 3.2: a client sends one for a target with no authority), an IPv6 zone (RFC 6874),
    IPvFuture; the admin paths' cross-site check still takes addresses and localhost and refuses
    names. Each answer carries a Date (RFC 9110 6.6.1), which none did."""
    served = [
        "127.0.0.1:8000", "localhost:9090", "localhost", "[::1]:8000", "[::1]", "10.244.1.7:8002",
        "wok-0.wok.default.svc.cluster.local:8002", "my-host_1.example.:80", "127.0.0.1:", "",
        "[fe80::1%25eth0]:8002", "[v1.fe]:80", "%77ok:1", "WOK.Example.COM",
    ]  # fmt: skip
    before = int(time.time())
    async with Server() as s:
        metrics = b"".join(f"GET /metrics HTTP/1.1\r\nHost: {h}\r\n\r\n".encode() for h in served)
        scrapes = await raw_http(s.port, metrics + b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        admin = {}
        for host in (f"127.0.0.1:{s.port}", f"[::1]:{s.port}", f"localhost:{s.port}", "rebound.example"):
            admin[host] = await raw_http(
                s.port, f"GET /admin/faults HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode()
            )
        # The bench's own scrape (urllib, as `wok bench --metrics-url` reads it).
        snapshot = await asyncio.to_thread(read_metrics, f"http://127.0.0.1:{s.port}/metrics")
    after = int(time.time())
    got = responses(scrapes, [False] * (len(served) + 1))
    assert [status(top) for top, _ in got] == [b"HTTP/1.1 200 OK"] * len(got), scrapes
    assert all(dated(top, before, after) for top, _ in got), scrapes
    statuses = {host: status(answer) for host, answer in admin.items()}
    assert statuses == {
        **{host: b"HTTP/1.1 200 OK" for host in list(admin)[:3]},
        "rebound.example": b"HTTP/1.1 403 Forbidden",
    }, admin
    assert not isinstance(snapshot, str), snapshot


async def test_every_answer_carries_a_date(monkeypatch, raw_http):
    """RFC 9110 6.6.1: an origin server with a clock MUST send Date in its 2xx, 3xx and 4xx answers
    (and may in 5xx): 200s (/metrics, /, admin JSON, the /events stream), 404, 405, 400, 403, 431,
    and the 503 of a connection refused at the cap. None carried one."""
    before = int(time.time())
    h = b"Host: 127.0.0.1\r\n"
    requests = [
        (b"GET /metrics HTTP/1.1\r\n" + h + b"\r\n", b"200 OK"),
        (b"HEAD / HTTP/1.1\r\n" + h + b"\r\n", b"200 OK"),
        (b"GET /admin/faults HTTP/1.1\r\n" + h + b"\r\n", b"200 OK"),
        (b"GET /nowhere HTTP/1.1\r\n" + h + b"\r\n", b"404 Not Found"),
        (b"DELETE / HTTP/1.1\r\n" + h + b"\r\n", b"405 Method Not Allowed"),
        (b"GET / HTTP/1.1\r\nHost: a b\r\n\r\n", b"400 Bad Request"),
        (b"GET /admin/faults HTTP/1.1\r\nHost: rebound.example\r\n\r\n", b"403 Forbidden"),
        (b"GET / HTTP/1.1\r\n" + h + b"X: " + b"x" * (20 << 10) + b"\r\n\r\n", b"431 Request Header Fields Too Large"),
    ]
    async with Server() as s:
        answers = [(await raw_http(s.port, request + NEXT), want) for request, want in requests]
        reader, writer = await asyncio.open_connection("127.0.0.1", s.port)
        writer.write(b"GET /events HTTP/1.1\r\n" + h + b"\r\n")
        stream = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        writer.close()
        monkeypatch.setattr(http, "MAX_CONNECTIONS", 0)  # every new connection refused: 503
        refused = await raw_http(s.port, b"GET /metrics HTTP/1.1\r\n" + h + b"\r\n")
    after = int(time.time())
    for answer, want in answers:
        top = answer.partition(b"\r\n\r\n")[0]
        assert status(top) == b"HTTP/1.1 " + want and dated(top, before, after), answer[:300]
    assert status(stream) == b"HTTP/1.1 200 OK" and dated(stream, before, after), stream
    assert status(refused) == b"HTTP/1.1 503 Service Unavailable" and dated(refused, before, after), refused


@pytest.mark.parametrize(
    "admin, metrics, path, body",
    [
        (True, True, "/metricz", f"no path '/metricz' here; paths: {ALL_PATHS}\n"),
        (True, True, "/metrics/", f"no path '/metrics/' here; paths: {ALL_PATHS}\n"),
        (False, True, "/nowhere?x=1", "no path '/nowhere' here; paths: /metrics, /\n"),  # the query is no part of it
        (
            False,
            True,
            "/admin/faults",
            "no path '/admin/faults' here (the admin API is off: `wok serve --admin` serves it); paths: /metrics, /\n",
        ),
        (True, False, "/x", "no path '/x' here; paths: /, /admin/faults, /admin/batching, /events\n"),
        (True, True, "/a\x1bb\xe9", f"no path '/a\\x1bb\\xe9' here; paths: {ALL_PATHS}\n"),
        (
            True,
            True,
            "/" + "p" * 15000,
            f"no path '/{'p' * 199}'… (15,001 characters in all) here; paths: {ALL_PATHS}\n",
        ),
    ],
    ids=["typo", "trailing-slash", "admin-off", "admin-path-admin-off", "metrics-off", "escaped", "long"],
)
async def test_a_404_names_the_path_and_those_served(admin, metrics, path, body, raw_http):
    """It said "not found" alone: a scraper's typo (/metric, /metrics/) was left to be guessed at.
    The path is escaped and capped (a 15 KB target makes no 15 KB body); a HEAD's 404 has no body,
    and the connection stays in step."""
    async with serving(admin=admin, metrics=metrics) as server:
        target = path.encode("latin-1")
        request = b"GET " + target + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
        answer = await raw_http(
            server.port,
            request + request.replace(b"GET", b"HEAD", 1) + NEXT,
        )
    close = path.startswith("/admin/") and not admin  # an admin path without the admin API ends the connection
    got = responses(answer, [False] if close else [False, True, False])
    assert status(got[0][0]) == b"HTTP/1.1 404 Not Found", answer
    assert got[0][1].decode() == body
    if not close:
        top = got[1][0]
        assert status(top) == b"HTTP/1.1 404 Not Found" and f"Content-Length: {len(body.encode())}\r\n".encode() in top
        assert status(got[2][0]) == b"HTTP/1.1 200 OK"


async def test_an_admin_path_not_served_names_it_and_those_served(raw_http):
    async with Server() as s:
        answer = await raw_http(s.port, b"GET /admin/fault HTTP/1.1\r\n" + s.host + b"Connection: close\r\n\r\n")
    [(top, body)] = responses(answer, [False])
    assert status(top) == b"HTTP/1.1 404 Not Found" and b"Content-Type: application/json" in top, answer
    assert json.loads(body) == {"error": f"no path '/admin/fault' here; paths: {ALL_PATHS}"}
