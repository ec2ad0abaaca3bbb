"""Admin changes (POST) on the metrics port (server/http.py) once the server stops.

A connection kept alive from before the stop was still served: an operator's script on it could
inject a fault, or change a model's batching, in a server that was draining (the port stays up
through the drain, so that the last scrape sees it) or whose port was stopping. Each such POST
now answers 503 and changes nothing; the reads (admin GETs, /metrics) are still answered.
"""

from __future__ import annotations

import asyncio
import http.client
import json

import numpy as np
import pytest

from wok.app import WokServer
from wok.config import server_settings
from wok.repository import ModelRepository

from .conftest import saying


class Client:
    """One keep-alive connection (http.client, as an operator's script), used from a thread."""

    def __init__(self, port: int) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)

    def _ask(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict, bytes]:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        self.conn.request(method, path, body=None if body is None else json.dumps(body), headers=headers)
        answer = self.conn.getresponse()
        return answer.status, {k.lower(): v for k, v in answer.getheaders()}, answer.read()

    async def ask(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict, bytes]:
        return await asyncio.to_thread(self._ask, method, path, body)

    def close(self) -> None:
        self.conn.close()


CHANGES = {
    "/admin/batching": {"model": "gated", "max_batch_size": 2, "max_queue_delay_ms": 7.0},
    "/admin/faults": {"model": "gated", "mode": "fail"},
}


def state(admin) -> tuple[dict, dict]:
    return admin.get_batching(), admin.get_faults()


def assert_refused(answer: tuple[int, dict, bytes], path: str) -> None:
    status, headers, body = answer
    assert status == 503, f"POST {path} was served as the server stops: {status} {body!r}"
    assert headers["connection"] == "close"
    assert json.loads(body) == {"error": f"POST {path}: expected a server that serves; got one that is stopping"}


@pytest.fixture
async def served(gated_model):
    # `entered`: a batch met the closed gate (the warm-up runs through).
    servable, module = gated_model(max_batch_size=4, delay_ms=5.0, depth=None, enter_when_closed=True)
    server = WokServer(server_settings(grpc_port=0, metrics_port=0, admin=True), ModelRepository([servable], "test"))
    await server.start()
    try:
        yield server, module
    finally:
        module.gate.set()
        await server.stop(grace=5.0)


@pytest.mark.parametrize("path", sorted(CHANGES))
async def test_an_admin_change_on_a_kept_alive_connection_is_refused_while_the_server_drains(served, path):
    server, module = served
    admin = server.http.admin
    port = server.http.port
    kept = Client(port)
    stopping = None
    try:
        status, _, _ = await kept.ask("GET", "/admin/batching")  # before the stop: kept alive
        assert status == 200
        before = state(admin)
        # A batch held in the model: the drain waits for it, with the port up.
        stopping, pending = await _drain_held(server, module)

        assert_refused(await kept.ask("POST", path, CHANGES[path]), path)
        assert state(admin) == before, f"POST {path} changed the server as it drains"
        # The reads go on through the drain, on a connection new or kept.
        fresh = Client(port)
        try:
            for read in ("/admin/faults", "/admin/batching", "/metrics"):
                status, _, body = await fresh.ask("GET", read)
                assert status == 200, (read, body)
            assert json.loads((await fresh.ask("GET", "/admin/batching"))[2]) == before[0]
            assert_refused(await fresh.ask("POST", path, CHANGES[path]), path)
        finally:
            fresh.close()
        assert state(admin) == before
        assert not stopping.done()  # all of it within the drain
        module.gate.set()
        await stopping
        assert pending.future.done() and not pending.future.cancelled()
    finally:
        module.gate.set()
        if stopping is not None:
            await stopping
        kept.close()


@pytest.mark.parametrize("path", sorted(CHANGES))
async def test_an_admin_change_on_a_kept_alive_connection_is_refused_once_the_port_stops(served, path):
    """The port's own stop (its last stage), with the server not draining: the admin's close held."""
    server, _ = served
    admin = server.http.admin
    port = server.http.port
    kept = Client(port)
    close, closed, go_on = admin.close, asyncio.Event(), asyncio.Event()

    async def close_then_hold() -> None:
        await close()
        closed.set()
        await go_on.wait()

    admin.close = close_then_hold
    stopping = None
    try:
        status, _, _ = await kept.ask("GET", "/admin/faults")
        assert status == 200
        before = state(admin)
        stopping = asyncio.create_task(server.http.stop())
        await asyncio.wait_for(closed.wait(), 10)
        assert not server.draining
        status, _, body = await kept.ask("GET", "/admin/batching")  # a read: answered
        assert status == 200 and json.loads(body) == before[0]
        assert_refused(await kept.ask("POST", path, CHANGES[path]), path)
        assert state(admin) == before, f"POST {path} changed the server as its port stops"
        go_on.set()
        await stopping
    finally:
        go_on.set()
        if stopping is not None:
            await stopping
        kept.close()


async def _drain_held(server, module):
    """Hold a batch in the model and start the server's stop: (the stop's task, the held request),
    once the drain has begun (the batcher's stop called), the port still up."""
    batcher = server.runtime("gated").batcher
    module.gate.clear()
    pending = batcher.submit({"INPUT0": np.ones((1, 4), np.float32)}, 1, None, None)
    loop = asyncio.get_running_loop()
    assert await loop.run_in_executor(None, module.entered.wait, 10), "the batch never reached the model"
    draining = asyncio.Event()
    stop_batcher = batcher.stop

    async def stop_and_tell() -> None:
        draining.set()
        await stop_batcher()

    batcher.stop = stop_and_tell
    stopping = asyncio.create_task(server.stop(grace=30.0))
    await asyncio.wait_for(draining.wait(), 10)
    return stopping, pending


async def test_a_fault_can_be_turned_off_while_the_server_drains_and_no_other_change(served):
    """A slow fault injected before the stop would hold the drain to its grace period, and lose
    what is queued: turning it off is the one change taken while draining."""
    server, module = served
    admin = server.http.admin
    kept = Client(server.http.port)
    stopping = None
    try:
        slow = {"model": "gated", "mode": "slow", "delay_ms": 50}
        status, _, body = await kept.ask("POST", "/admin/faults", slow)
        assert status == 200, body
        stopping, _ = await _drain_held(server, module)
        assert_refused(await kept.ask("POST", "/admin/faults", {"model": "gated", "mode": "fail"}), "/admin/faults")
        assert [f["mode"] for f in admin.get_faults()["faults"]] == ["slow"]
        kept.close()
        kept = Client(server.http.port)
        status, _, body = await kept.ask("POST", "/admin/faults", {"model": "gated", "mode": "off"})
        assert (status, json.loads(body)) == (200, {"faults": []})
        assert admin.get_faults() == {"faults": []}
        assert not stopping.done()
    finally:
        module.gate.set()
        if stopping is not None:
            await stopping
        kept.close()


@pytest.mark.parametrize("path", sorted(CHANGES))
async def test_a_post_whose_headers_came_before_the_stop_and_body_after_is_refused(served, path):
    """The check is made once the body is in: headers alone before the stop, then the body."""
    server, module = served
    admin = server.http.admin
    before = state(admin)
    body = json.dumps(CHANGES[path]).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", server.http.port)
    stopping = None
    try:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        writer.write(head.encode())
        await writer.drain()
        stopping, _ = await _drain_held(server, module)
        writer.write(body)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 10)  # the server closes after its answer
        status_line, _, rest = answer.partition(b"\r\n")
        assert status_line == b"HTTP/1.1 503 Service Unavailable", answer
        assert json.loads(rest.partition(b"\r\n\r\n")[2]) == {
            "error": f"POST {path}: expected a server that serves; got one that is stopping"
        }
        assert state(admin) == before, f"POST {path} changed the server as it drains"
        assert not stopping.done()
    finally:
        module.gate.set()
        if stopping is not None:
            await stopping
        writer.close()


async def test_a_posted_fault_s_end_is_logged_unread_and_the_stop_leaves_no_timer(served):
    # Its end was logged only as something read the faults (a GET, an /events tick, a scrape): here, never.
    server, _ = served
    board = server.http.admin.faults
    client = Client(server.http.port)
    try:
        with saying("wok.faults", "model 'gated' instance 0: mode 'fail' ended after its duration_s of 0.05 s") as said:
            status, _, body = await client.ask(
                "POST", "/admin/faults", {"model": "gated", "mode": "fail", "duration_s": 0.05}
            )
            assert status == 200, body
            await asyncio.wait_for(said.said.wait(), 10)
        slow = {"model": "gated", "mode": "slow", "delay_ms": 1, "duration_s": 3600}
        status, _, body = await client.ask("POST", "/admin/faults", slow)
        assert status == 200, body
        (end,) = board._ends.values()
    finally:
        client.close()
    await server.stop(grace=5.0)
    assert end.cancelled() and board._ends == {}
