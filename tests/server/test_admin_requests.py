"""The admin API's HTTP server (server/http.py) when a handler fails, and what the admin docs list."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

from prometheus_client import CollectorRegistry

from wok import admin
from wok.app import WokServer
from wok.config import server_settings
from wok.http import MetricsHTTPServer
from wok.metrics import FLUSH_REASONS
from wok.repository import ModelRepository

DOCS = Path(__file__).resolve().parents[2] / "docs"


class FailingAdmin:
    """An admin whose handlers raise what no request check expects: a bug in a handler."""

    def get_faults(self) -> dict:
        raise RuntimeError("a bug in get_faults")

    def post_faults(self, body) -> dict:
        raise RuntimeError("a bug in post_faults")

    def get_batching(self) -> dict:
        raise RuntimeError("a bug in get_batching")

    def post_batching(self, body) -> dict:
        raise RuntimeError("a bug in post_batching")

    async def close(self) -> None:
        pass


async def _exchange(port: int, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        return await asyncio.wait_for(reader.read(), 5)  # to the server's close
    finally:
        writer.close()


async def test_a_failing_handler_answers_500_json_and_logs_its_traceback_once(caplog):
    server = MetricsHTTPServer(CollectorRegistry(), "127.0.0.1", 0, admin=FailingAdmin())
    await server.start()
    host = f"Host: 127.0.0.1:{server.port}"
    body = b'{"model": "mlp", "max_batch_size": 4}'
    requests = {
        "GET /admin/faults": f"GET /admin/faults HTTP/1.1\r\n{host}\r\n\r\n".encode(),
        "POST /admin/batching": (
            f"POST /admin/batching HTTP/1.1\r\n{host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        + body,
    }
    try:
        with caplog.at_level(logging.ERROR):
            for what, request in requests.items():
                caplog.clear()
                answer = await _exchange(server.port, request)
                head, _, payload = answer.partition(b"\r\n\r\n")
                assert head.startswith(b"HTTP/1.1 500 Internal Server Error\r\n"), answer[:200]
                assert b"Content-Type: application/json" in head and b"Connection: close" in head
                assert json.loads(payload) == {"error": f"{what}: internal error; see the server's log"}
                # Once, by wok.http with the traceback; not again by asyncio as an unhandled exception.
                errors = [(r.name, r.getMessage(), r.exc_info[1]) for r in caplog.records]
                assert len(errors) == 1 and errors[0][:2] == ("wok.http", f"{what} failed"), errors
                assert isinstance(errors[0][2], RuntimeError)
    finally:
        await server.stop()


def _reasons_sentence(text: str) -> str:
    """The words between a batch event's `reason` and `queued`, where the flush reasons are listed."""
    start = text.index("`reason` the batcher's flush reason")
    return text[start : text.index("`queued`", start)]


def test_every_flush_reason_a_batch_event_can_carry_is_listed():
    for where, text in (("server/admin.py", admin.__doc__), ("docs/demo.md", (DOCS / "demo.md").read_text())):
        listed = _reasons_sentence(text)
        missing = [r for r in FLUSH_REASONS if r not in listed]
        assert not missing, f"{where} lists {listed!r}, without {missing}"


async def _post_json(port: int, path: str, body: dict) -> tuple[bytes, dict]:
    data = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n"
    )
    answer = await _exchange(port, head.encode() + data)
    top, _, payload = answer.partition(b"\r\n\r\n")
    return top.split(b"\r\n")[0], json.loads(payload)


async def test_a_refused_admin_body_shows_a_long_field_or_value_cut(gated_model):
    """A 400 echoed a body's string, key or array whole: a model name of 60,000 characters made a
    60 KB answer. Each is shown as every message shows a request's string (errors.quoted_name): its
    first 200 characters and its length; an array or object by its first 200 and its length."""
    servable, _ = gated_model()
    server = WokServer(server_settings(grpc_port=0, metrics_port=0, admin=True), ModelRepository([servable], "test"))
    await server.start()
    m, k, ones = "m" * 60_000, "k" * 30_000, [1] * 10_000  # the list's repr: 30,000 characters
    # A value that is no string is cut to NAME_CHARS bytes, its note (33 bytes as JSON writes it) included.
    cut = repr(ones)[:167]
    fields = "delay_ms, duration_s, instance, mode, model"
    cases = [
        (
            "/admin/faults",
            {"model": m, "mode": "off"},
            f"field 'model': expected one of the served models (gated); got '{m[:200]}'… (60,000 characters in all)",
        ),
        (
            "/admin/faults",
            {"model": "gated", "mode": "off", k: ones},
            f"field '{k[:200]}'… (30,000 characters in all): expected only the fields {fields}; "
            f"got {cut}… (30,000 characters in all)",
        ),
        (
            "/admin/batching",
            {"model": "gated", k: 1},
            f"field '{k[:200]}'… (30,000 characters in all): expected only the fields max_batch_size, "
            "max_queue_delay_ms, model; got 1",
        ),
        (
            "/admin/batching",
            {"model": "gated", "max_batch_size": ones},
            f"field 'max_batch_size': expected an integer from 1 to 8 (the model's configured maximum); "
            f"got {cut}… (30,000 characters in all)",
        ),
    ]
    try:
        for path, body, error in cases:
            status, answer = await _post_json(server.http.port, path, body)
            assert (status, answer) == (b"HTTP/1.1 400 Bad Request", {"error": error})
    finally:
        await server.stop(grace=5.0)
