"""Which balancer the bench's workers use when none is given (bench/workers.py)."""

from __future__ import annotations

import pytest

from wok.bench.workers import WorkerPool, default_balancer


def test_wok_for_several_servers_or_a_dns_name_grpc_for_one():
    assert default_balancer("127.0.0.1:8001,127.0.0.1:8002") == "wok"
    assert default_balancer("dns:///wok-headless.wok.svc:8001") == "wok"
    assert default_balancer("127.0.0.1:8001") == "grpc"
    # No worker processes (n = 0): only the choice is made.
    assert WorkerPool("127.0.0.1:1,127.0.0.1:2", [], 0).balancer == "wok"
    assert WorkerPool("127.0.0.1:1,127.0.0.1:2", [], 0, balancer="grpc").balancer == "grpc"
    assert WorkerPool("127.0.0.1:1", [], 0).balancer == "grpc"
    # Streams run on one channel: without an explicit balancer they get gRPC's.
    assert WorkerPool("127.0.0.1:1,127.0.0.1:2", [], 0, rpc="stream").balancer == "grpc"
    with pytest.raises(ValueError, match="balancer"):
        WorkerPool("127.0.0.1:1", [], 0, balancer="nginx")
