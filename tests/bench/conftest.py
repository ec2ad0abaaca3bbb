"""The `wok serve` process the load generator drives, and the URL of its metrics."""

from __future__ import annotations

import contextlib
import itertools
import re
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

METRICS = re.compile(r"wok: metrics on (http://\S+/metrics)")
# What a web page at --metrics-url answers (a wrong port: a dashboard's, a proxy's).
WEB_PAGE = (b"<!DOCTYPE html><html><body>a dashboard</body></html>", "text/html")


@contextlib.contextmanager
def serving(body: bytes, content_type: str, before_answer: Callable[[int], None] | None = None) -> Iterator[str]:
    """A real HTTP server on loopback that answers every GET with `body`; yields its /metrics URL.
    `before_answer(n)` runs before the nth GET (from 1) is answered, its caller waiting for the answer."""
    count = itertools.count(1)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            if before_answer is not None:
                before_answer(next(count))
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/metrics"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


@pytest.fixture(scope="module")
def bench_server(server_process):
    """The session's server, for modules that send mlp requests and judge only what they measured
    themselves, or its counters as deltas: starting one per module cost seconds each.

    A module that stops, kills or reconfigures its server, or reads its log or absolute counters,
    overrides this with a server of its own (tests/bench/test_ramp.py SIGSTOPs its).
    """
    assert "mlp" in server_process.models, server_process.models
    return server_process


@pytest.fixture(scope="module")
def metrics_url(bench_server) -> str:
    """The bench server's /metrics URL, as it printed it."""
    for line in bench_server.log:
        m = METRICS.search(line)
        if m:
            return m.group(1)
    raise AssertionError("the server printed no metrics URL")
