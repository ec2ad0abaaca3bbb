"""The live demo's calls to the wok server's admin API (`http_json`, `LiveDemo._relay`) against
the metrics port's own server (server/http.py) on loopback, with a stand-in for the admin's
handlers: the Host each sends, the answer passed on as the admin API wrote it, and each status it
may answer reaching the browser as that status or a 502 naming it, never as the page's own 500.
Statuses the relay cannot cause in the metrics port (408, 411) and a cut answer come from a
loopback server that answers with fixed bytes."""

from __future__ import annotations

import argparse
import asyncio
import json
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry

from wok.admin import Subscriber
from wok.demo.cli import MODEL, LiveDemo
from wok.demo.load import LoadControl
from wok.demo.web import MAX_BODY, DemoWeb, Hub, http_json
from wok.faults import AdminRequestError
from wok.http import MetricsHTTPServer

from .conftest import exchange, ipv6_loopback


class StandInAdmin:
    """The admin API's handlers (server/admin.py), answering at once; it records what was posted.
    `server.draining` is the wok server's drain, which the metrics port reads (503 for a change)."""

    def __init__(self) -> None:
        self.posted: list = []
        self.server = SimpleNamespace(draining=False)

    def get_faults(self) -> dict:
        return {"faults": []}

    def post_faults(self, body) -> dict:
        self.posted.append(body)
        if body.get("mode") == "crash":  # a fault of the admin's own: the metrics port's 500
            raise RuntimeError("the stand-in admin failed")
        if body.get("mode") not in ("slow", "fail", "off"):
            raise AdminRequestError(f"field 'mode': expected slow, fail or off; got {body.get('mode')!r}")
        # Nested, as the real answer is: its spacing shows whether it was re-encoded.
        return {"faults": [{"model": body["model"], "instance": 0, "mode": body.get("mode")}]}

    get_batching = get_faults
    post_batching = post_faults

    def subscribe(self) -> Subscriber:
        sub = Subscriber()
        sub.put({"type": "hello"})
        return sub

    def unsubscribe(self, sub: Subscriber) -> None:
        pass

    async def close(self) -> None:
        pass


@pytest.fixture
async def live_backend():
    args = argparse.Namespace(instances=2, max_batch_size=32, device="cpu", torch_threads=1)
    backend = LiveDemo(LoadControl(0), args, delay_s=0.005, slo_s=0.05)
    yield backend
    await backend.close()


@pytest.mark.skipif(not ipv6_loopback(), reason="no IPv6 loopback (::1) here")
async def test_an_admin_port_on_ipv6_loopback_takes_the_demo_s_calls_and_its_event_stream(live_backend):
    # They sent `Host: ::1`, unbracketed, which the admin port refuses with 400 (RFC 9110 7.2):
    # a fault from the page came back as a 400 "Expecting value" (the refusal is not JSON), and
    # the page's stream had no server events.
    admin = StandInAdmin()
    server = MetricsHTTPServer(CollectorRegistry(), "::1", 0, admin=admin)
    await server.start()
    stop = asyncio.Event()
    relay = None
    try:
        live_backend.admin = ("::1", server.port)
        assert live_backend.config()["server"]["admin"] == f"http://[::1]:{server.port}"
        assert await live_backend.set_faults({"mode": "off"}) == (
            200,
            b'{"faults":[{"model":"mlp","instance":0,"mode":"off"}]}\n',
        )
        assert admin.posted == [{"model": "mlp", "mode": "off"}]
        hub = Hub()
        events: asyncio.Queue = asyncio.Queue()
        hub.queues.add(events)
        relay = asyncio.ensure_future(live_backend._relay(hub, stop))
        assert json.loads(await asyncio.wait_for(events.get(), 10)) == {"type": "hello"}
    finally:
        stop.set()
        if relay is not None:
            relay.cancel()
            await asyncio.gather(relay, return_exceptions=True)
        await server.stop()


async def test_an_event_over_64_kib_reaches_the_page_and_the_relay_goes_on(live_backend):
    # asyncio's readline refused a line over its 64 KiB limit with ValueError, which the relay did
    # not catch: it ended for good, silently, and the page had no more server events.
    big = json.dumps({"type": "tick", "pad": "x" * 100_000}).encode()
    stream = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n"
    server = await _answering(stream + b"data: " + big + b"\n\ndata: " + b'{"type":"after"}' + b"\n\n")
    hub = Hub()
    events: asyncio.Queue = asyncio.Queue()
    hub.queues.add(events)
    stop = asyncio.Event()
    live_backend.admin = ("127.0.0.1", server.sockets[0].getsockname()[1])
    relay = asyncio.ensure_future(live_backend._relay(hub, stop))
    try:
        assert await asyncio.wait_for(events.get(), 10) == big
        assert json.loads(await asyncio.wait_for(events.get(), 10)) == {"type": "after"}
    finally:
        stop.set()
        relay.cancel()
        await asyncio.gather(relay, return_exceptions=True)
        server.close()
        await server.wait_closed()


async def test_http_json_sends_the_host_with_its_port():
    # RFC 9110 7.2: the port, when not the scheme's default, is part of Host; it was left out.
    heads: asyncio.Queue = asyncio.Queue()

    async def answer(reader, writer):
        await heads.put(await reader.readuntil(b"\r\n\r\n"))
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
        await writer.drain()
        writer.close()

    listener = await asyncio.start_server(answer, "127.0.0.1", 0)
    try:
        port = listener.sockets[0].getsockname()[1]
        assert await http_json("127.0.0.1", port, "POST", "/admin/faults", {}) == (200, b"{}")
        head = (await heads.get()).decode()
    finally:
        listener.close()
        await listener.wait_closed()
    assert f"\r\nHost: 127.0.0.1:{port}\r\n" in head, head


async def test_an_admin_answer_that_is_not_json_is_a_502_naming_it():
    # The admin port's refusals of a request's framing, and its 404s with the admin off, are text:
    # read as JSON, the parse error reached the page as a 400 of its own input.
    server = MetricsHTTPServer(CollectorRegistry(), "127.0.0.1", 0)  # no admin: its paths answer 404
    await server.start()
    try:
        status, answer = await http_json("127.0.0.1", server.port, "POST", "/admin/faults", {"mode": "off"})
    finally:
        await server.stop()
    assert status == 502, answer
    assert answer["error"].startswith(
        "the wok server answered 404 Not Found with 'no path '/admin/faults' here (the admin API is off"
    ), answer


async def _exchange(port: int, request: bytes) -> tuple[int, bytes]:
    """Send raw bytes to a server on loopback; (status, body bytes) of its answer, read to the close."""
    line, body = await exchange(port, request)
    return int(line.split(b" ", 2)[1]), body


def _post(port: int, path: str, body: bytes) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode() + body


@pytest.fixture
async def relay():
    """(page port, the metrics port's server with a StandInAdmin, the live backend): the page's
    server relaying to that admin API on loopback."""
    admin = MetricsHTTPServer(CollectorRegistry(), "127.0.0.1", 0, admin=StandInAdmin())
    await admin.start()
    args = argparse.Namespace(instances=2, max_batch_size=32, device="cpu", torch_threads=1)
    backend = LiveDemo(LoadControl(0), args, delay_s=0.005, slo_s=0.05)
    backend.admin = ("127.0.0.1", admin.port)
    web = DemoWeb(backend, Hub(), "127.0.0.1", 0)
    await web.start()
    yield web.port, admin, backend
    await web.stop()
    await admin.stop()
    await backend.close()


async def test_the_admin_api_s_answer_reaches_the_browser_as_the_admin_api_wrote_it(relay):
    # It was read as JSON and written again with ", " and ": " for the admin API's "," and ":".
    port, admin, _ = relay
    sent = json.dumps({"model": MODEL, "mode": "off"}).encode()
    direct = await _exchange(admin.port, _post(admin.port, "/admin/faults", sent))
    assert direct[0] == 200, direct
    assert await _exchange(port, _post(port, "/api/faults", b'{"mode": "off"}')) == direct
    # Its 400, as it wrote it too.
    sent = json.dumps({"model": MODEL, "mode": "bogus"}).encode()
    direct = await _exchange(admin.port, _post(admin.port, "/admin/faults", sent))
    assert direct[0] == 400, direct
    assert await _exchange(port, _post(port, "/api/faults", b'{"mode": "bogus"}')) == direct


def _body_of(size: int) -> bytes:
    """A fault body of exactly `size` bytes, as compact as the relay sends it."""
    body = json.dumps({"mode": "off", "pad": ""}, separators=(",", ":")).encode()
    return body[:-2] + b"x" * (size - len(body)) + body[-2:]


async def test_a_body_over_the_admin_api_s_64_kib_once_the_model_is_added_gets_its_413_with_its_message(relay):
    # The page takes 64 KiB, as the admin port does; the model the relay adds takes it past that.
    # The 413 had no reason phrase in the page's server: a 500, "internal error".
    port, admin, _ = relay
    body = _body_of(MAX_BODY)
    status, answer = await _exchange(port, _post(port, "/api/faults", body))
    sent = len(json.dumps({"model": MODEL, **json.loads(body)}, separators=(",", ":")))
    assert (status, json.loads(answer)) == (
        413,
        {
            "error": "the wok server answered 413 Content Too Large: Content-Length: expected at most 65536 bytes; "
            f"got '{sent}' (the body sent on, the model added: {sent:,} bytes)"
        },
    )
    assert admin.admin.posted == []
    # Within the admin port's limit with the model, it is taken.
    status, _ = await _exchange(port, _post(port, "/api/faults", _body_of(MAX_BODY - len(b'"model":"mlp",'))))
    assert status == 200
    assert len(admin.admin.posted) == 1


async def test_a_change_while_the_wok_server_stops_gets_its_503_with_its_message(relay):
    # The metrics port refuses a change once the server's drain has begun; that 503 reached the
    # browser as the page's own 500.
    port, admin, _ = relay
    admin.admin.server.draining = True
    status, answer = await _exchange(port, _post(port, "/api/batching", b'{"max_batch_size": 4}'))
    assert (status, json.loads(answer)) == (
        503,
        {
            "error": "the wok server answered 503 Service Unavailable: POST /admin/batching: expected a server that "
            "serves; got one that is stopping"
        },
    )


async def test_the_wok_server_s_own_500_is_a_502_naming_it_not_the_page_s_500(relay):
    # Passed on as a 500, it read as the page server's own failure ("see the demo's log").
    port, _, _ = relay
    status, answer = await _exchange(port, _post(port, "/api/faults", b'{"mode": "crash"}'))
    assert (status, json.loads(answer)) == (
        502,
        {
            "error": "the wok server answered 500 Internal Server Error: POST /admin/faults: internal error; see the "
            "server's log"
        },
    )


async def _answering(answer: bytes):
    """A loopback server that reads a request's head and answers `answer`, then closes."""

    async def serve(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        writer.write(answer)
        await writer.drain()
        writer.close()

    return await asyncio.start_server(serve, "127.0.0.1", 0)


def _answer(status: str, body: bytes, length: int | None = None, ctype: str = "application/json") -> bytes:
    length = len(body) if length is None else length
    return (
        f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {length}\r\nConnection: close\r\n\r\n"
    ).encode() + body


@pytest.mark.parametrize(
    ("answer", "relayed"),
    [
        (
            _answer(
                "408 Request Timeout", b'{"error":"body: expected Content-Length 14 bytes within 10 s; got fewer"}\n'
            ),
            (
                502,
                "the wok server answered 408 Request Timeout: body: expected Content-Length 14 bytes within 10 s; "
                "got fewer",
            ),
        ),
        (
            _answer("411 Length Required", b'{"error":"Content-Length: expected one header for a POST; got none"}\n'),
            (
                502,
                "the wok server answered 411 Length Required: Content-Length: expected one header for a POST; got none",
            ),
        ),
        (
            _answer("503 Service Unavailable", b"the metrics port is at its connection limit: try again\n"),
            (
                503,
                "the wok server answered 503 Service Unavailable with 'the metrics port is at its connection limit: "
                "try again'",
            ),
        ),
        (
            # The admin port's text is UTF-8 (its Content-Type says so): read as Latin-1, the cut
            # note's "…" was shown as the three bytes of it, '\xe2\x80\xa6'. A byte that is not UTF-8: U+FFFD.
            _answer(
                "503 Service Unavailable",
                "the wok server is stopping: 'café'… (300 characters in all) ".encode() + b"\xff\n",
                ctype="text/plain; charset=utf-8",
            ),
            (
                503,
                "the wok server answered 503 Service Unavailable with 'the wok server is stopping: 'caf\\xe9'\\u2026 "
                "(300 characters in all) \\ufffd'",
            ),
        ),
        (
            # Cut short (the server ended as it wrote): read as JSON, "not a JSON object".
            _answer("200 OK", b'{"faults":[{"model":"mlp"', length=60),
            (
                502,
                "the wok server's 200 answer to POST /admin/faults ended after 25 of its 60 bytes: "
                "whether the change was made is unknown",
            ),
        ),
    ],
    ids=["408", "411", "503-text", "503-utf-8", "cut-short"],
)
async def test_an_admin_status_the_page_does_not_pass_on_is_named_not_a_500(answer, relayed):
    # 408 and 411 had no reason phrase in the page's server, and reached the browser as its own
    # 500; the connection limit's text 503 and a cut 200 were 502s "not a JSON object", the one a
    # refusal to be tried again, the other a change that may have been made.
    server = await _answering(answer)
    try:
        status, got = await _faults_off_through_a_live_page(("127.0.0.1", server.sockets[0].getsockname()[1]))
    finally:
        server.close()
        await server.wait_closed()
    assert (status, json.loads(got)) == (relayed[0], {"error": relayed[1]})


async def _faults_off_through_a_live_page(admin: tuple[str, int] | None) -> tuple[int, bytes]:
    """POST /api/faults {"mode": "off"} to a live demo's page whose admin API is at `admin` (None:
    the wok server has not started)."""
    args = argparse.Namespace(instances=2, max_batch_size=32, device="cpu", torch_threads=1)
    backend = LiveDemo(LoadControl(0), args, delay_s=0.005, slo_s=0.05)
    if admin is not None:
        backend.admin = admin
    web = DemoWeb(backend, Hub(), "127.0.0.1", 0)
    await web.start()
    try:
        return await _exchange(web.port, _post(web.port, "/api/faults", b'{"mode": "off"}'))
    finally:
        await web.stop()
        await backend.close()


async def test_a_change_before_the_wok_server_has_started_gets_503_saying_so():
    # The page serves from before the server starts; a change asked meanwhile (a tab left open)
    # went to port 0, and came back as a 502 "did not answer: Connect call failed".
    status, got = await _faults_off_through_a_live_page(None)
    assert (status, json.loads(got)) == (
        503,
        {
            "error": "POST /admin/faults: expected a wok server that serves; got one still starting: try again once "
            "it serves"
        },
    )
