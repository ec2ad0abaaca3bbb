"""The demo page's server (demo/web.py) against raw sockets on loopback: its refusals as the metrics
port words them (server/http.py): a URL too long 414, a Transfer-Encoding 501 or 400, a malformed line
escaped in ASCII, 413 under its RFC 9110 name. The admin relay's timeout (504):
tests/demo/test_edges.py."""

from __future__ import annotations

import asyncio
import gc
import json
import socket

import pytest

from wok.bench.simulate import BatcherModel
from wok.demo.cli import SimulatedDemo
from wok.demo.load import LoadControl
from wok.demo.sim import SimBackend
from wok.demo.web import DemoWeb, Hub

from .conftest import exchange, live_page

HOST = b"Host: 127.0.0.1\r\n"
CONFIG = b"GET /api/config HTTP/1.1\r\n" + HOST + b"\r\n"


@pytest.fixture
async def page():
    """The page's server on a free loopback port, the simulator behind it at 100/s."""
    model = BatcherModel(alpha_s=2.5e-4, beta_s=4.4e-5, max_batch_size=32, max_queue_delay_s=0.005)
    web = DemoWeb(SimulatedDemo(SimBackend(LoadControl(100), model), slo_s=0.05), Hub(), "127.0.0.1", 0)
    await web.start()
    yield web
    await web.stop()


async def answer(port: int, request: bytes) -> tuple[bytes, dict]:
    """Send `request`; its answer's status line and JSON body, read to the close."""
    line, body = await exchange(port, request)
    return line, json.loads(body)


async def test_a_url_too_long_gets_414_and_the_page_goes_on(page):
    """The metrics port's read_head says a request line over 16 KiB by itself is its target's fault
    (414, RFC 9112 3); the page answered it 431, header fields too large, which its client had not sent."""
    line, got = await answer(page.port, b"GET /api/config?" + b"a" * 20_000 + b" HTTP/1.1\r\n" + HOST + b"\r\n")
    assert line == b"HTTP/1.1 414 URI Too Long", got
    assert got == {"error": "request line: expected at most 16384 bytes; got more: its target is too long"}
    assert (await answer(page.port, CONFIG.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n")))[0].endswith(
        b" 200 OK"
    )


@pytest.mark.parametrize(
    "coding, expected, error",
    [
        ("chunked", b"HTTP/1.1 501 Not Implemented", "Transfer-Encoding: expected none, since this server reads a "
         "body by its Content-Length alone (RFC 9112 6.1): send one; got 'chunked'"),
        ("gzip", b"HTTP/1.1 400 Bad Request", "Transfer-Encoding: expected chunked as the last coding, and once "
         "(RFC 9112 6.3: else where the body ends is unknown); got 'gzip'"),
    ],
    ids=["chunked", "gzip"],
)  # fmt: skip
async def test_a_transfer_encoding_is_answered_as_the_metrics_port_answers_it(page, coding, expected, error):
    """Every one got 400, "expected none"; chunked, well formed, is a coding this server does not
    implement (RFC 9112 6.1: SHOULD answer 501)."""
    body = b'{"rate": 5000}'
    request = (
        f"POST /api/load HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Transfer-Encoding: {coding}\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    line, got = await answer(page.port, request)
    assert (line, got) == (expected, {"error": error})
    assert page.backend.config()["load"]["rate"] == 100  # not applied


async def test_a_malformed_request_line_is_shown_escaped_in_ascii(page):
    """read_head's 400s showed the line by its repr: é (0xe9, read as Latin-1) came back as é, not
    as the byte sent, which every other refusal escapes."""
    line, got = await answer(page.port, b"GET /caf\xe9 x HTTP/1.1\r\n" + HOST + b"\r\n")
    assert line == b"HTTP/1.1 400 Bad Request"
    assert got == {
        "error": "request line: expected a method, a target and a version separated by single spaces; "
        "got 'GET /caf\\xe9 x HTTP/1.1'"
    }


async def test_a_body_over_64_kib_gets_413_content_too_large(page):
    """RFC 9110 15.5.14's name; Payload Too Large was RFC 7231's."""
    request = b"POST /api/load HTTP/1.1\r\n" + HOST + b"Content-Type: application/json\r\nContent-Length: 70000\r\n\r\n"
    line, got = await answer(page.port, request)
    assert line == b"HTTP/1.1 413 Content Too Large", got


async def test_the_page_stops_with_no_task_exception_left_unretrieved(caplog):
    """A kept-alive client that closes as the page stops: its connection's head read, a task of a
    wait_for around request_start's own wait_for, ended with IncompleteReadError that nothing
    retrieved, and asyncio logged "Task exception was never retrieved" (Python 3.10, 3.11). Which
    loop pass the close lands in decides it: each of the first few is tried."""
    model = BatcherModel(alpha_s=2.5e-4, beta_s=4.4e-5, max_batch_size=32, max_queue_delay_s=0.005)
    for passes in range(8):
        web = DemoWeb(SimulatedDemo(SimBackend(LoadControl(100), model), slo_s=0.05), Hub(), "127.0.0.1", 0)
        await web.start()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", web.port)
            writer.write(CONFIG)  # kept alive: the page reads for the next request
            head = await reader.readuntil(b"\r\n\r\n")
            [length] = [int(line[15:]) for line in head.split(b"\r\n") if line.startswith(b"Content-Length: ")]
            await reader.readexactly(length)
            writer.close()
            for _ in range(passes):
                await asyncio.sleep(0)  # a loop pass, not a wait: where the close meets the stop
        finally:
            await web.stop()
        gc.collect()  # a task left unretrieved logs as it is collected
    assert not [r.getMessage() for r in caplog.records if r.name == "asyncio"], caplog.text


EVENTS = b"GET /api/events HTTP/1.1\r\n" + HOST + b"\r\n"


async def closed_within(reader: asyncio.StreamReader, timeout: float) -> int:
    """Read to the close, within `timeout` s (TimeoutError if the connection stays open); the bytes read."""

    async def drain() -> int:
        n = 0
        try:
            while chunk := await reader.read(1 << 20):
                n += len(chunk)
        except ConnectionResetError:  # aborted with bytes unread: closed too
            pass
        return n

    return await asyncio.wait_for(drain(), timeout)


async def test_the_page_stop_closes_a_kept_alive_connection_and_a_stream_its_client_does_not_read(monkeypatch):
    """The stop cancelled the connections' tasks and left their transports: a stream whose client
    read slowly stayed open with its unsent events (a transport's close waits for them), past the
    stop, for as long as the client kept reading."""
    monkeypatch.setattr("wok.demo.web.STOP_GRACE_S", 0.2, raising=False)  # not there before the fix
    model = BatcherModel(alpha_s=2.5e-4, beta_s=4.4e-5, max_batch_size=32, max_queue_delay_s=0.005)
    hub = Hub()
    web = DemoWeb(SimulatedDemo(SimBackend(LoadControl(100), model), slo_s=0.05), hub, "127.0.0.1", 0)
    await web.start()
    writers = []
    try:
        kept_reader, kept = await asyncio.open_connection("127.0.0.1", web.port)
        writers.append(kept)
        kept.write(CONFIG)
        head = await asyncio.wait_for(kept_reader.readuntil(b"\r\n\r\n"), 10)
        assert b"Connection: keep-alive" in head
        # A client that takes its events slowly: a small receive buffer, read no further than the stream's head.
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", web.port))
        stream_reader, stream = await asyncio.open_connection(sock=sock, limit=1 << 16)
        writers.append(stream)
        stream.write(EVENTS)
        read = len(await asyncio.wait_for(stream_reader.readuntil(b"data: "), 10))  # its first event: subscribed
        hub.publish_raw(b"x" * (16 << 20))  # more than the kernel's buffers hold: most of it waits in the page's
        read += len(await asyncio.wait_for(stream_reader.readuntil(b"xxxx"), 10))  # it is being written
    finally:
        await asyncio.wait_for(web.stop(), 10)
    try:
        await closed_within(kept_reader, 5)
        read += await closed_within(stream_reader, 5)
        # Its unsent events dropped, not held for it: a client that never read held the connection for good.
        assert read < 16 << 20, f"the stream's {read:,} bytes, its event's {16 << 20:,} among them, outlived the stop"
    finally:
        for w in writers:
            w.close()


async def test_the_page_stop_gives_a_request_being_answered_its_answer_then_closes():
    """A request in flight at the stop (an admin call relayed to a slow wok server) was cancelled,
    and its client got the close with no answer; it gets its answer, `Connection: close`."""
    asked, release = asyncio.Event(), asyncio.Event()

    async def slow_admin(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        asked.set()
        await release.wait()
        body = b'{"faults": []}'
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        writer.close()

    admin = await asyncio.start_server(slow_admin, "127.0.0.1", 0)
    web, backend = await live_page(admin.sockets[0].getsockname()[1])
    stopping = None
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", web.port)
        body = b'{"mode": "off"}'
        writer.write(
            b"POST /api/faults HTTP/1.1\r\n" + HOST + b"Content-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        await asyncio.wait_for(asked.wait(), 10)
        stopping = asyncio.ensure_future(web.stop())
        await asyncio.sleep(0)  # a loop pass, not a wait: the stop has begun
        assert not stopping.done()
        release.set()
        raw = await asyncio.wait_for(reader.read(), 10)  # to the close
        writer.close()
        head, _, got = raw.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK\r\n"), raw
        assert b"\r\nConnection: close" in head and json.loads(got) == {"faults": []}
        await asyncio.wait_for(stopping, 10)
    finally:
        if stopping is None:
            await web.stop()
        await backend.close()
        admin.close()
