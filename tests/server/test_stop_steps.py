"""A stop whose step raises runs the steps after it all the same (`WokServer._stop_stages`): one that raised left
the later ones undone, the metrics port and its admin (observers on the model instances, fault timers, the events
ticker) and the executors' threads among them. Each failure is logged, the first raised once all have run. And
a metrics port that never bound closes its admin at the stop (`MetricsHTTPServer.stop`)."""

from __future__ import annotations

import logging
import socket

import pytest
from prometheus_client import CollectorRegistry

from wok.admin import Admin
from wok.app import WokServer
from wok.config import server_settings
from wok.http import MetricsHTTPServer
from wok.repository import ModelRepository

FAILED = "failed; the stop goes on"


def instances(server: WokServer) -> list:
    return [inst for rt in server.runtimes.values() for inst in rt.executor.instances]


def executor_ended(inst) -> bool:
    try:
        inst._worker.submit(int).result()
    except RuntimeError:  # "cannot schedule new futures after shutdown"
        return True
    return False


async def test_a_step_that_raises_leaves_the_later_steps_run_and_the_first_failure_raised(
    gated_model, monkeypatch, caplog
):
    servable, _ = gated_model(max_batch_size=2, delay_ms=1.0)
    server = WokServer(server_settings(grpc_port=0, metrics_port=0, admin=True), ModelRepository([servable], "test"))
    await server.start()
    admin, port = server.http.admin, server.http.port
    assert all(inst.observer is not None for inst in instances(server))

    def refuse(what: str):
        def raises() -> None:
            raise RuntimeError(what)

        return raises

    monkeypatch.setattr(server._reflection, "end_streams", refuse("the first"))
    monkeypatch.setattr(server.unhandled, "sweep", refuse("the second"))
    caplog.set_level(logging.ERROR, logger="wok")
    with pytest.raises(RuntimeError, match=r"^the first$"):
        await server.stop(grace=5.0)
    failed = [r for r in caplog.records if FAILED in r.getMessage()]
    assert [r.getMessage() for r in failed] == [
        f"stopping: ending reflection's streams {FAILED}",
        f"stopping: the unhandled calls' sweep {FAILED}",
    ]
    assert [str(r.exc_info[1]) for r in failed] == ["the first", "the second"]  # each with its traceback
    # The steps after them ran: the metrics port is closed, its admin too, and the executors' threads ended.
    assert admin._closed and all(inst.observer is None for inst in instances(server))
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    assert all(executor_ended(inst) for inst in instances(server))
    await server.stop()  # stopped: a second stop returns at once


async def test_a_metrics_port_that_never_bound_closes_its_admin_at_the_stop(gated_model):
    # The server checks its ports before it loads the models: one taken after that fails the metrics port's
    # start, which comes last. Here the port is built on a started server, its admin observing the models.
    servable, _ = gated_model(max_batch_size=2, delay_ms=1.0)
    server = WokServer(server_settings(grpc_port=0, metrics_port=None), ModelRepository([servable], "test"))
    await server.start()
    try:
        admin = Admin(server)
        assert all(inst.observer is not None for inst in instances(server))
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            http = MetricsHTTPServer(CollectorRegistry(), "127.0.0.1", taken.getsockname()[1], admin=admin)
            with pytest.raises(OSError, match="metrics port"):
                await http.start()
        await http.stop()
        assert admin._closed and all(inst.observer is None for inst in instances(server))
    finally:
        await server.stop(grace=5.0)
