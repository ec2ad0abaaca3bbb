"""A `wok serve` process with the demo models for the load generator to drive."""

from __future__ import annotations

import re

import pytest

METRICS = re.compile(r"wok: metrics on (http://\S+/metrics)")


@pytest.fixture(scope="module")
def bench_server(start_server_module):
    """One server per test module: its own process, so SIGSTOP and load touch only it."""
    return start_server_module("--models", "mlp,encoder")


@pytest.fixture(scope="module")
def metrics_url(bench_server) -> str:
    """The bench server's /metrics URL, as it printed it."""
    for line in bench_server.log:
        m = METRICS.search(line)
        if m:
            return m.group(1)
    raise AssertionError("the server printed no metrics URL")
