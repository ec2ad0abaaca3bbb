"""The metrics/admin HTTP server's stop (server/http.py) against connections that come as it begins.

A real Admin (server/admin.py) for a server with no models, so that each test takes milliseconds.
A connection the loop accepted just before stop() closed the socket has its callback run later:
once the stop had ended the connections it knew of, that one was left serving, and its /events
stream, subscribed after the admin's close, started the ticker again and outlived the stop.
"""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry

from wok.admin import Admin
from wok.http import MetricsHTTPServer

LOOPS = ("asyncio", "uvloop")


def admin_alone() -> Admin:
    """A real Admin, of a server with no models (its constructor reads only these); on the running loop."""
    server = SimpleNamespace(runtimes={}, metrics=SimpleNamespace(faults=None), settings=SimpleNamespace(metrics=True))
    return Admin(server)


def errors(caplog) -> list[str]:
    return [f"{r.name}: {r.getMessage()}" for r in caplog.records if r.levelno >= logging.ERROR]


def ticker_running(admin: Admin) -> bool:
    return admin._ticker is not None and not admin._ticker.done()


async def end_what_is_left(server: MetricsHTTPServer, admin: Admin) -> None:
    """After a failure: end the connections and ticker that outlived the stop, or the loop's close waits on them."""
    for task, writer in list(server._clients.items()):
        writer.transport.abort()
        task.cancel()
    if admin._ticker is not None:
        admin._ticker.cancel()
    await asyncio.gather(*server._clients, *(t for t in [admin._ticker] if t), return_exceptions=True)


async def scrape(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, port: int) -> None:
    """One kept-alive scrape, answered: the connection's task is then the server's, waiting for the next."""
    writer.write(f"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert head.startswith(b"HTTP/1.1 200 "), head
    await reader.readexactly(int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0]))


async def read_to_end(reader: asyncio.StreamReader) -> bytes:
    """What the server sends until it closes (a reset reads as its end; a backstop of 5 s)."""
    try:
        return await asyncio.wait_for(reader.read(), 5)
    except ConnectionResetError:
        return b""


@pytest.mark.parametrize("loop", LOOPS)
def test_a_connection_accepted_as_the_stop_begins_is_closed_and_leaves_nothing_running(run_on, loop, caplog):
    async def main():
        admin = admin_alone()
        server = MetricsHTTPServer(CollectorRegistry(), "127.0.0.1", 0, admin=admin)
        # The connection callback, as start() hands it to the loop: a connection accepted while
        # `holding` has its callback held back, for the test to run when the race would.
        accept = server._accept
        holding, held, arrived = False, [], asyncio.Event()

        def callback(reader, writer) -> None:
            if holding:
                held.append((reader, writer))
                arrived.set()
            else:
                accept(reader, writer)

        server._accept = callback
        await server.start()
        port = server.port
        kept_r, kept_w = await asyncio.open_connection("127.0.0.1", port)  # a scraper's keep-alive
        await scrape(kept_r, kept_w, port)
        (kept_task,) = server._clients
        holding = True
        race_r, race_w = await asyncio.open_connection("127.0.0.1", port)
        race_w.write(f"GET /events HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
        await race_w.drain()
        await asyncio.wait_for(arrived.wait(), 5)
        # The loop runs the held callback just after the stop has ended the connections it knew
        # of (the kept-alive one's task ends as the stop aborts it), as in the race.
        kept_task.add_done_callback(lambda _: accept(*held[0]))
        try:
            await server.stop()
            assert kept_task.done()
            assert not server._clients, "a connection accepted as the stop began is still served after it"
            assert await read_to_end(race_r) == b"", "the connection accepted as the stop began was answered"
            assert not admin.subscribers, "an /events stream outlived the stop"
            assert not ticker_running(admin), "the admin's ticker runs after the stop"
        finally:
            await end_what_is_left(server, admin)
            for w in (kept_w, race_w):
                w.close()

    with caplog.at_level(logging.ERROR):
        run_on(loop, main())
    assert errors(caplog) == []


@pytest.mark.parametrize("loop", LOOPS)
def test_an_event_stream_asked_for_once_the_admin_has_closed_gets_503_and_starts_no_ticker(run_on, loop, caplog):
    async def main():
        admin = admin_alone()
        server = MetricsHTTPServer(CollectorRegistry(), "127.0.0.1", 0, admin=admin)
        await server.start()
        port = server.port
        reader, writer = await asyncio.open_connection("127.0.0.1", port)  # kept alive, served
        await scrape(reader, writer, port)
        # The stop holds once the admin has closed, while the test asks on the open connection.
        close, closed, go_on = admin.close, asyncio.Event(), asyncio.Event()

        async def close_then_hold() -> None:
            await close()
            closed.set()
            await go_on.wait()

        admin.close = close_then_hold
        stopping = asyncio.create_task(server.stop())
        try:
            await asyncio.wait_for(closed.wait(), 5)
            writer.write(f"GET /events HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            assert head.startswith(b"HTTP/1.1 503 "), f"an /events stream opened as the server stops: {head!r}"
            assert b"Connection: close" in head
            body = await read_to_end(reader)
            assert b"expected a server that serves; got one that is stopping" in body
            assert not admin.subscribers
            assert not ticker_running(admin), "the admin's ticker started again after its close"
            go_on.set()
            await stopping
            assert not server._clients
            assert not admin.subscribers
            assert not ticker_running(admin), "the admin's ticker runs after the stop"
        finally:
            go_on.set()
            await stopping
            await end_what_is_left(server, admin)
            writer.close()

    with caplog.at_level(logging.ERROR):
        run_on(loop, main())
    assert errors(caplog) == []


async def test_the_admin_refuses_a_subscriber_once_closed_and_its_ticker_stays_stopped():
    admin = admin_alone()
    sub = admin.subscribe()
    assert ticker_running(admin)
    await admin.close()
    assert not ticker_running(admin)
    with pytest.raises(RuntimeError, match="closed"):
        admin.subscribe()
    assert admin.subscribers == {sub}  # the one from before, ended by its connection's end
    assert not ticker_running(admin)
