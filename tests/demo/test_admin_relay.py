"""The live demo's calls to the wok server's admin API (`http_json`, `LiveDemo._relay`) against
the metrics port's own server (server/http.py) on loopback, with a stand-in for the admin's
handlers: the Host each sends, and an answer that is not JSON."""

from __future__ import annotations

import argparse
import asyncio
import json
import socket

import pytest
from prometheus_client import CollectorRegistry

from wok.admin import Subscriber
from wok.demo.cli import LiveDemo
from wok.demo.load import LoadControl
from wok.demo.web import Hub, http_json
from wok.http import MetricsHTTPServer


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


class StandInAdmin:
    """The admin API's handlers (server/admin.py), answering at once; it records what was posted."""

    def __init__(self) -> None:
        self.posted: list = []

    def get_faults(self) -> dict:
        return {"faults": []}

    def post_faults(self, body) -> dict:
        self.posted.append(body)
        return {"faults": []}

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


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback (::1) here")
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
        assert await live_backend.set_faults({"mode": "off"}) == (200, {"faults": []})
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
        assert await http_json("127.0.0.1", port, "POST", "/admin/faults", {}) == (200, {})
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
        "the wok server answered 404 with 'no path '/admin/faults' here (the admin API is off"
    ), answer
