"""The `wok serve` process the load generator drives, and the URL of its metrics."""

from __future__ import annotations

import re

import pytest

METRICS = re.compile(r"wok: metrics on (http://\S+/metrics)")


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
