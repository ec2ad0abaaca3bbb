"""A small HTTP/1.1 server on the event loop for /metrics (Prometheus text or OpenMetrics).

It runs on the server's own loop, so a scrape reads the counters the loop writes without
a thread in between. Keep-alive is honoured, since Prometheus reuses its connection.
"""

from __future__ import annotations

import asyncio
import logging

from prometheus_client import CollectorRegistry
from prometheus_client import exposition as text_format
from prometheus_client.openmetrics import exposition as openmetrics

log = logging.getLogger("wok.http")
MAX_HEADER_BYTES = 16 << 10
HEADER_TIMEOUT_S = 10.0  # a request's headers must arrive within this
IDLE_TIMEOUT_S = 120.0  # a kept-alive connection with no request for this long is closed
MAX_CONNECTIONS = 64  # beyond this, new connections are closed at once: sockets are the gRPC port's too


class MetricsHTTPServer:
    def __init__(self, registry: CollectorRegistry, host: str, port: int) -> None:
        self.registry = registry
        self.host = host
        self.port = port
        self._server: asyncio.base_events.Server | None = None
        self._clients: set[asyncio.Task] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self.host, self.port, limit=MAX_HEADER_BYTES)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for t in list(self._clients):
            t.cancel()
        await asyncio.gather(*self._clients, return_exceptions=True)
        await self._server.wait_closed()

    def render(self, accept: str) -> tuple[bytes, str]:
        if "application/openmetrics-text" in accept:
            return openmetrics.generate_latest(self.registry), openmetrics.CONTENT_TYPE_LATEST
        return text_format.generate_latest(self.registry), text_format.CONTENT_TYPE_LATEST

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._clients) >= MAX_CONNECTIONS:
            writer.close()
            return
        task = asyncio.current_task()
        self._clients.add(task)
        try:
            first = True
            while True:
                try:
                    # A scraper sends its request at once; an idle or trickling client must
                    # not hold a socket (and its file descriptor) forever.
                    head = await asyncio.wait_for(
                        reader.readuntil(b"\r\n\r\n"), HEADER_TIMEOUT_S if first else IDLE_TIMEOUT_S
                    )
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, asyncio.TimeoutError):
                    return
                first = False
                lines = head.decode("latin-1").split("\r\n")
                parts = lines[0].split(" ")
                headers = {}
                for line in lines[1:]:
                    name, sep, value = line.partition(":")
                    if sep:
                        headers[name.strip().lower()] = value.strip()
                if len(parts) != 3:
                    await self._respond(writer, 400, b"bad request line\n", "text/plain", close=True)
                    return
                method, target, version = parts
                close = headers.get("connection", "").lower() == "close" or version == "HTTP/1.0"
                path = target.split("?", 1)[0]
                if method not in ("GET", "HEAD"):
                    await self._respond(writer, 405, b"only GET\n", "text/plain", close=close)
                elif path == "/metrics":
                    body, ctype = self.render(headers.get("accept", ""))
                    await self._respond(writer, 200, body, ctype, close=close, head=method == "HEAD")
                elif path == "/":
                    await self._respond(writer, 200, b"wok: metrics at /metrics\n", "text/plain", close=close)
                else:
                    await self._respond(writer, 404, b"not found\n", "text/plain", close=close)
                if close:
                    return
        finally:
            self._clients.discard(task)
            writer.close()

    @staticmethod
    async def _respond(writer, status: int, body: bytes, ctype: str, *, close: bool, head: bool = False) -> None:
        reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed"}[status]
        header = (
            f"HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
            f"Connection: {'close' if close else 'keep-alive'}\r\n\r\n"
        )
        writer.write(header.encode("latin-1") + (b"" if head else body))
        await writer.drain()
