"""A stop whose step raises runs the steps after it all the same (`WokServer._stop_stages`): one that raised left
the later ones undone, the metrics port and its admin (observers on the model instances, fault timers, the events
ticker) and the executors' threads among them. Each failure is logged, the first raised once all have run. And
a metrics port that never bound closes its admin at the stop (`MetricsHTTPServer.stop`). A stop cancelled partway
leaves the steps it did not finish to the next stop, which runs them, each failure logged once (a batcher's stop
is not run again; the admin's close awaits the ticker's end that a cancelled one left)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from wok.admin import Admin
from wok.app import WokServer
from wok.config import server_settings
from wok.errors import ShuttingDown
from wok.faults import parse_fault_request
from wok.http import MetricsHTTPServer
from wok.ports import bind_error
from wok.repository import ModelRepository

from .conftest import until

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


@pytest.fixture
async def admin_served(gated_model):
    """A started server of the gated model with the admin API on its metrics port; stopped at the end."""
    servable, _ = gated_model(max_batch_size=2, delay_ms=1.0)
    server = WokServer(server_settings(grpc_port=0, metrics_port=0, admin=True), ModelRepository([servable], "test"))
    await server.start()
    try:
        yield server
    finally:
        await server.stop(grace=5.0)


async def test_the_admin_closes_once_what_it_undoes_undone_before_its_ticker_failure_is_raised(
    admin_served, monkeypatch
):
    # The metrics port's stop after a failed bind, then the server's, may close it twice. A ticker that had failed
    # raised at the first close before the fault timers and the observers were undone, and at every later one again.
    server = admin_served
    admin = server.http.admin
    admin.post_faults({"model": "gated", "mode": "slow", "delay_ms": 1.0, "duration_s": 60.0})
    assert admin.faults._ends  # the fault's end, a timer on the loop

    def tick() -> dict:
        raise RuntimeError("test: the tick failed")

    monkeypatch.setattr(admin, "tick", tick)
    admin.subscribe()
    await asyncio.wait({admin._ticker})
    with pytest.raises(RuntimeError, match=r"^test: the tick failed$"):
        await admin.close()
    assert not admin.faults._ends and all(inst.observer is None for inst in instances(server))
    await admin.close()  # once closed, at once: nothing raised again
    admin.faults.close()  # the fault board's too
    admin.faults.apply(parse_fault_request({"model": "gated", "mode": "fail", "duration_s": 60.0}, {"gated": 1}))
    assert not admin.faults._ends  # closed: no timer armed on a loop the server is leaving


async def test_an_admin_close_cancelled_while_its_ticker_ends_raises_the_cancellation_with_the_rest_undone(
    admin_served, monkeypatch
):
    server = admin_served
    admin = server.http.admin
    cancelled, release = asyncio.Event(), asyncio.Event()

    async def ticks() -> None:  # a ticker slow to end once cancelled
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            await release.wait()
            raise

    monkeypatch.setattr(admin, "_tick_forever", ticks)
    admin.subscribe()
    ticker = admin._ticker
    closing = asyncio.ensure_future(admin.close())
    await cancelled.wait()
    closing.cancel()
    await asyncio.wait({closing})
    # Swallowed, the caller's cancellation was lost: its close went on as if it had not come.
    assert closing.cancelled()
    assert all(inst.observer is None for inst in instances(server))
    release.set()
    await asyncio.wait({ticker})
    assert ticker.cancelled()
    await admin.close()  # once closed, at once


async def cancel_a_stop_in_its_drain(server, batcher, module, draining=lambda: False):
    """Hold one request's batch in the gated model, start a stop and cancel it once its drain has begun (asserting
    `draining()` false then); the request."""
    module.gate.clear()
    pending = batcher.submit({"INPUT0": np.ones((1, 4), np.float32)}, 1, None, None)
    assert await asyncio.to_thread(module.entered.wait, 10), "the batch never reached the model"
    stopping = asyncio.ensure_future(server.stop(grace=30.0))
    await until(lambda: batcher._stopping)  # its drain has begun: the stop waits for it
    assert not draining()
    stopping.cancel()
    await asyncio.wait({stopping})
    assert stopping.cancelled()
    return pending


async def test_a_stop_cancelled_in_the_drain_cancels_the_drains_it_started(gated_model):
    # Cancellation ended the stop's wait for the drains and left them running: the batcher went on draining (its
    # batch held in the model), its requests unanswered, past the stop.
    servable, module = gated_model(max_batch_size=1, delay_ms=5.0, depth=None, enter_when_closed=True)
    server = WokServer(server_settings(grpc_port=0, metrics_port=None), ModelRepository([servable], "test"))
    await server.start()
    batcher = server.runtime("gated").batcher
    try:
        pending = await cancel_a_stop_in_its_drain(server, batcher, module)
        assert batcher._task.done() and pending.future.done()
        assert isinstance(pending.future.exception(), ShuttingDown), pending.future.exception()
    finally:
        module.gate.set()
        # The steps the cancelled stop left undone (the ports' stops, the executors' shutdown).
        await server.stop(grace=5.0)


async def test_a_batchers_stop_that_raises_fails_the_stop_once_the_later_steps_ran(gated_model, monkeypatch, caplog):
    # The drain gathered the batchers' stops with return_exceptions and dropped what they raised: the stop
    # returned as if it had gone well, and nothing said a batcher's had not.
    servable, _ = gated_model(max_batch_size=2, delay_ms=1.0)
    server = WokServer(server_settings(grpc_port=0, metrics_port=None), ModelRepository([servable], "test"))
    await server.start()
    port = server.port

    def refuse() -> None:
        raise RuntimeError("test: the failure log's stop failed")

    monkeypatch.setattr(server.runtime("gated").batcher.failures, "stop", refuse)
    caplog.set_level(logging.ERROR, logger="wok")
    with pytest.raises(RuntimeError, match=r"^test: the failure log's stop failed$"):
        await server.stop(grace=5.0)
    failed = [r for r in caplog.records if FAILED in r.getMessage()]
    assert [r.getMessage() for r in failed] == [f"stopping: the drain of model 'gated' {FAILED}"]
    assert str(failed[0].exc_info[1]) == "test: the failure log's stop failed"  # with its traceback
    assert bind_error("127.0.0.1", port) is None, "the gRPC port is still bound after the stop"
    assert all(executor_ended(inst) for inst in instances(server))


@pytest.mark.parametrize("second", ["after", "meanwhile"])
async def test_a_stop_cancelled_in_its_drain_is_finished_by_the_next_stop(gated_model, second):
    # The cancelled stop marked the server stopped: a later stop returned at once, and one waiting meanwhile
    # too, with the ports bound, the executors' threads running and nothing left that could end them.
    servable, module = gated_model(max_batch_size=1, delay_ms=5.0, depth=None, enter_when_closed=True)
    settings = server_settings(grpc_port=0, health_port=0, metrics_port=0)
    server = WokServer(settings, ModelRepository([servable], "test"))
    await server.start()
    ports = {"gRPC": server.port, "health": server.health_port, "metrics": server.http.port}
    batcher = server.runtime("gated").batcher
    try:
        module.gate.clear()
        x = {"INPUT0": np.ones((1, 4), np.float32)}
        # One in the model, held at its gate; the others queued behind it.
        pending = [batcher.submit(x, 1, None, None) for _ in range(3)]
        assert await asyncio.to_thread(module.entered.wait, 10), "the batch never reached the model"
        first = asyncio.ensure_future(server.stop(grace=30.0))
        await until(lambda: batcher._stopping)  # its drain has begun: the stop waits for it
        waiting = asyncio.ensure_future(server.stop(grace=5.0)) if second == "meanwhile" else None
        first.cancel()
        await asyncio.wait({first})
        assert first.cancelled()
    finally:
        module.gate.set()
    if waiting is None:
        await asyncio.wait_for(server.stop(grace=5.0), 30)
    else:
        await asyncio.wait_for(waiting, 30)
    assert all(p.future.done() for p in pending)
    assert isinstance(pending[-1].future.exception(), ShuttingDown), pending[-1].future.exception()
    assert (batcher.queued, batcher.inflight) == (0, 0)
    for what, at in ports.items():
        assert bind_error("127.0.0.1", at) is None, f"the {what} port ({at}) is still bound after the stop"
    assert all(executor_ended(inst) for inst in instances(server))
    assert not server.abandoned_work
    await server.stop()  # stopped: at once


async def test_a_stop_cancelled_before_the_executors_shutdown_tells_of_a_model_still_in_a_batch(gated_model):
    """A stop cancelled in its drain leaves the executors' shutdown to the next stop(): a caller that never calls it
    again (a wait_for's, gpu_check's Ctrl-C) read `abandoned_work` False with the model's thread still in its batch,
    which nothing would shut down and Python's exit then waits for, a stuck model's for good. It tells of that batch
    while it runs, and of nothing once it has ended or the next stop shut the executors down."""
    servable, module = gated_model(max_batch_size=1, delay_ms=5.0, depth=None, enter_when_closed=True)
    server = WokServer(server_settings(grpc_port=0, metrics_port=None), ModelRepository([servable], "test"))
    await server.start()
    batcher = server.runtime("gated").batcher
    try:
        # Not while the stop runs: it will shut the executors down.
        pending = await cancel_a_stop_in_its_drain(server, batcher, module, draining=lambda: server.abandoned_work)
        assert isinstance(pending.future.exception(), ShuttingDown), pending.future.exception()
        assert server.abandoned_work
    finally:
        module.gate.set()
    await until(lambda: not server.abandoned_work)  # the batch ended: no thread left in one
    await asyncio.wait_for(server.stop(grace=5.0), 30)
    assert all(executor_ended(inst) for inst in instances(server))
    assert not server.abandoned_work


async def test_a_batch_whose_thread_has_ended_is_no_work_left_though_its_end_is_not_yet_on_the_loop(gated_model):
    """After a stop cancelled in its drain, `abandoned_work` counted a batch until its completion ran on the loop:
    read between the model thread's return and that callback (gpu_check reads it as the cancellation comes out of
    the stop), it said True, and the caller left through os._exit saying the model was given up on, its thread
    idle. A batch whose thread has returned is no work left."""
    servable, module = gated_model(max_batch_size=1, delay_ms=5.0, depth=None, enter_when_closed=True)
    server = WokServer(server_settings(grpc_port=0, metrics_port=None), ModelRepository([servable], "test"))
    await server.start()
    batcher = server.runtime("gated").batcher
    try:
        pending = await cancel_a_stop_in_its_drain(server, batcher, module)
        assert server.abandoned_work  # its thread is in the batch
        (ran,) = [b.future for sent in batcher._sent for b in sent]
        module.gate.set()
        # On the loop's thread, which the batch's completion then waits for: the thread has returned, its end not
        # yet taken in.
        ran.result(timeout=10)
        assert batcher.inflight == 1
        assert not server.abandoned_work
        assert isinstance(pending.future.exception(), ShuttingDown), pending.future.exception()
    finally:
        module.gate.set()
    await asyncio.wait_for(server.stop(grace=5.0), 30)
    assert not server.abandoned_work


def logged(caplog, exc: BaseException) -> list[logging.LogRecord]:
    """The records that carry `exc` as their traceback."""
    return [r for r in caplog.records if r.exc_info and r.exc_info[1] is exc]


async def test_a_batching_task_that_fails_in_the_drain_is_logged_once_and_fails_the_stop(
    gated_model, monkeypatch, caplog
):
    # Logged by the batcher as it failed, then by the stop's drain again: two ERRORs, each with the traceback.
    servable, module = gated_model(max_batch_size=1, delay_ms=1.0, depth=1, enter_when_closed=True)
    server = WokServer(server_settings(grpc_port=0, metrics_port=None), ModelRepository([servable], "test"))
    await server.start()
    batcher = server.runtime("gated").batcher
    stopping = None
    try:
        module.gate.clear()
        x = {"INPUT0": np.ones((1, 4), np.float32)}
        # One in the model, held at its gate; one queued behind it, which the drain's next batch takes.
        pending = [batcher.submit(x, 1, None, None) for _ in range(2)]
        assert await asyncio.to_thread(module.entered.wait, 10), "the batch never reached the model"
        bug = RuntimeError("test: a bug in the batcher")

        def form(*args, **kwargs):
            raise bug

        monkeypatch.setattr(batcher, "_form", form)
        caplog.set_level(logging.ERROR, logger="wok")
        stopping = asyncio.ensure_future(server.stop(grace=30.0))
        await until(lambda: batcher._stopping)  # its drain has begun
    finally:
        module.gate.set()
    with pytest.raises(RuntimeError) as raised:
        await stopping
    assert raised.value is bug
    assert batcher.failed is bug
    assert [r.getMessage() for r in logged(caplog, bug)] == ["batcher for model 'gated' failed"]
    assert not [r for r in caplog.records if FAILED in r.getMessage()]
    assert all(p.future.done() for p in pending)
    assert pending[0].future.exception() is None  # the batch held at the gate ran
    assert "batcher failed: test: a bug in the batcher" in str(pending[1].future.exception())
    assert all(executor_ended(inst) for inst in instances(server))


async def test_a_batchers_stop_that_keeps_raising_is_logged_once_when_a_cancelled_stop_is_resumed(
    gated_model, monkeypatch, caplog
):
    # The resumed stop drained the batcher again: its stop raised again, logged (with its traceback) and counted again.
    servable, module = gated_model(max_batch_size=1, delay_ms=5.0, depth=None, enter_when_closed=True)
    server = WokServer(server_settings(grpc_port=0, metrics_port=None), ModelRepository([servable], "test"))
    await server.start()
    port = server.port
    batcher = server.runtime("gated").batcher
    raised = []

    def refuse() -> None:
        raised.append(RuntimeError(f"test: the failure log's stop failed ({len(raised) + 1})"))
        raise raised[-1]

    monkeypatch.setattr(batcher.failures, "stop", refuse)
    caplog.set_level(logging.ERROR, logger="wok")
    try:
        module.gate.clear()
        pending = batcher.submit({"INPUT0": np.ones((1, 4), np.float32)}, 1, None, None)
        assert await asyncio.to_thread(module.entered.wait, 10), "the batch never reached the model"
        first = asyncio.ensure_future(server.stop(grace=30.0))
        await until(lambda: batcher._stopping)  # its drain has begun: the stop waits for it
        first.cancel()
        await asyncio.wait({first})
        assert first.cancelled()
    finally:
        module.gate.set()
    assert len(raised) == 1 and isinstance(pending.future.exception(), ShuttingDown)
    with pytest.raises(RuntimeError) as failed:
        await asyncio.wait_for(server.stop(grace=5.0), 30)
    assert failed.value is raised[0]  # the stop still fails with it
    assert len(raised) == 1, [str(e) for e in raised]
    assert [r.getMessage() for r in caplog.records if FAILED in r.getMessage()] == [
        f"stopping: the drain of model 'gated' {FAILED}"
    ]
    assert len(logged(caplog, raised[0])) == 1
    assert bind_error("127.0.0.1", port) is None, "the gRPC port is still bound after the stop"
    assert all(executor_ended(inst) for inst in instances(server))


def slow_ending_ticker(admin: Admin, monkeypatch) -> tuple[asyncio.Event, asyncio.Event]:
    """Make `admin`'s ticker one that, once cancelled, sets the first event and ends when the second is set."""
    cancelled, release = asyncio.Event(), asyncio.Event()

    async def ticks() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            await release.wait()
            raise

    monkeypatch.setattr(admin, "_tick_forever", ticks)
    return cancelled, release


async def test_an_admin_close_after_a_cancelled_one_awaits_the_tickers_end(admin_served, monkeypatch):
    # The first close was cancelled in its wait for the ticker's end; the next returned at once, the ticker pending.
    admin = admin_served.http.admin
    cancelled, release = slow_ending_ticker(admin, monkeypatch)
    admin.subscribe()
    ticker = admin._ticker
    closing = asyncio.ensure_future(admin.close())
    await cancelled.wait()
    closing.cancel()
    await asyncio.wait({closing})
    assert closing.cancelled() and not ticker.done()
    # Set with no await before the close: the ticker can end only while the close waits for it.
    release.set()
    await admin.close()
    assert ticker.done() and ticker.cancelled()
    await admin.close()  # its end seen: at once


async def test_a_stop_cancelled_as_its_admin_closes_leaves_nothing_pending_once_resumed(gated_model, monkeypatch):
    servable, _ = gated_model(max_batch_size=2, delay_ms=1.0)
    server = WokServer(server_settings(grpc_port=0, metrics_port=0, admin=True), ModelRepository([servable], "test"))
    await server.start()
    admin, port = server.http.admin, server.http.port
    cancelled, release = slow_ending_ticker(admin, monkeypatch)
    admin.subscribe()
    ticker = admin._ticker
    first = asyncio.ensure_future(server.stop(grace=5.0))
    await cancelled.wait()  # in the metrics port's stop, its admin's close waiting for the ticker
    first.cancel()
    await asyncio.wait({first})
    assert first.cancelled() and not ticker.done()
    release.set()
    await asyncio.wait_for(server.stop(grace=5.0), 30)
    assert ticker.done()
    assert not [t for t in asyncio.all_tasks() if t.get_name() == "wok-admin-ticks" and not t.done()]
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    assert all(executor_ended(inst) for inst in instances(server))


async def test_a_drain_ending_as_its_stop_is_cancelled_again_is_stopped_once_and_its_failure_kept(
    gated_model, monkeypatch, caplog
):
    # The drain was recorded only once the gather of the cancelled drains returned: a second cancellation in that
    # gather left the batcher to be stopped again by the next stop, the first drain's failure dropped unsaid.
    servable, module = gated_model(max_batch_size=1, delay_ms=5.0, depth=None, enter_when_closed=True)
    server = WokServer(server_settings(grpc_port=0, metrics_port=None), ModelRepository([servable], "test"))
    await server.start()
    port = server.port
    batcher = server.runtime("gated").batcher
    raised, stops = [], []
    ending, release = asyncio.Event(), asyncio.Event()

    def refuse() -> None:
        raised.append(RuntimeError(f"test: the failure log's stop failed ({len(raised) + 1})"))
        raise raised[-1]

    real_stop = batcher.stop

    async def stop() -> None:
        stops.append(len(stops) + 1)
        try:
            await real_stop()
        finally:
            # Its end held, through the stop's second cancellation too, as a batching task slow to end would.
            ending.set()
            while not release.is_set():
                with contextlib.suppress(asyncio.CancelledError):
                    await release.wait()

    monkeypatch.setattr(batcher.failures, "stop", refuse)
    monkeypatch.setattr(batcher, "stop", stop)
    caplog.set_level(logging.ERROR, logger="wok")
    try:
        module.gate.clear()
        pending = batcher.submit({"INPUT0": np.ones((1, 4), np.float32)}, 1, None, None)
        assert await asyncio.to_thread(module.entered.wait, 10), "the batch never reached the model"
        first = asyncio.ensure_future(server.stop(grace=30.0))
        await until(lambda: batcher._stopping)  # its drain has begun: the stop waits for it
        first.cancel()
        # The drain is cancelled only by the stop's own cancellation of it, which then gathers its end.
        await ending.wait()
        assert not first.done()
        first.cancel()  # the gather, cancelled, still waits for the drain's end
        release.set()
        await asyncio.wait({first})
        assert first.cancelled()
    finally:
        module.gate.set()
        release.set()
    assert isinstance(pending.future.exception(), ShuttingDown)
    with pytest.raises(RuntimeError) as failed:
        await asyncio.wait_for(server.stop(grace=5.0), 30)
    assert failed.value is raised[0]  # the first drain's failure, kept
    assert stops == [1], "the batcher was stopped again"
    assert len(raised) == 1, [str(e) for e in raised]
    assert [r.getMessage() for r in caplog.records if FAILED in r.getMessage()] == [
        f"stopping: the drain of model 'gated' {FAILED}"
    ]
    assert len(logged(caplog, raised[0])) == 1
    assert bind_error("127.0.0.1", port) is None, "the gRPC port is still bound after the stop"
    assert all(executor_ended(inst) for inst in instances(server))


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, SystemExit])
def test_a_stop_left_by_an_interrupt_in_a_step_tells_of_its_batch_and_is_finished_by_the_next(
    gated_model, monkeypatch, interrupt
):
    """A KeyboardInterrupt (a Ctrl-C under a plain run_until_complete, as bench tools and tests run the stop) or a
    SystemExit raised in a step came out of the stop with the server marked stopped: the executors' step never ran,
    `abandoned_work` read False with the model's thread in its batch, and the next stop returned at once, the gRPC
    port bound and the executors open. Such a stop is left partway, as a cancelled one."""
    servable, module = gated_model(max_batch_size=1, delay_ms=5.0, depth=None, enter_when_closed=True)
    loop = asyncio.new_event_loop()
    try:
        server = WokServer(server_settings(grpc_port=0, metrics_port=None), ModelRepository([servable], "test"))
        loop.run_until_complete(server.start())
        port = server.port
        batcher = server.runtime("gated").batcher
        ends = server._reflection.end_streams
        calls = []

        def interrupted():
            calls.append(interrupt)
            if len(calls) == 1:
                raise interrupt()
            return ends()

        monkeypatch.setattr(server._reflection, "end_streams", interrupted)
        module.gate.clear()
        pending = batcher.submit({"INPUT0": np.ones((1, 4), np.float32)}, 1, None, None)
        entered = loop.run_until_complete(asyncio.to_thread(module.entered.wait, 10))  # the loop sends it
        assert entered, "the batch never reached the model"
        # The drain's grace runs out with the batch held in the model; the interrupt comes after it.
        with pytest.raises(interrupt):
            loop.run_until_complete(server.stop(grace=0.2))
        assert calls == [interrupt]
        assert isinstance(pending.future.exception(), ShuttingDown), pending.future.exception()
        assert server.abandoned_work  # the model's thread is in its batch, and no stop will shut it down
        module.gate.set()
        loop.run_until_complete(asyncio.wait_for(server.stop(grace=5.0), 30))
        assert calls == [interrupt, interrupt]  # the step the interrupt left, run by the next stop
        assert bind_error("127.0.0.1", port) is None, "the gRPC port is still bound after the stop"
        assert all(executor_ended(inst) for inst in instances(server))
        assert not server.abandoned_work
    finally:
        module.gate.set()
        loop.close()


async def test_a_shutdown_failing_after_its_stop_was_cancelled_in_the_executors_wait_is_said_and_fails_the_next(
    gated_model, monkeypatch, caplog
):
    """A stop cancelled in its wait for the executors' shutdowns left their `end` futures to no one (the next stop
    waits on ends of its own): one whose shutdown then failed was logged as "Future exception was never retrieved";
    then (fd2170d) read by a callback and said nowhere, the next stop's own shutdown succeeding. Now said, naming
    the model, and the next stop fails with it, as with a drain's failure."""
    import gc

    from wok import app

    servable, _ = gated_model(max_batch_size=1, delay_ms=1.0)
    server = WokServer(server_settings(grpc_port=0, metrics_port=None), ModelRepository([servable], "test"))
    await server.start()
    executor = server.runtime("gated").executor
    real_shutdown = executor.shutdown
    entered, release = threading.Event(), threading.Event()
    calls = []

    def shutdown() -> None:
        calls.append(len(calls) + 1)
        if len(calls) == 1:
            entered.set()
            release.wait(30)
            real_shutdown()
            raise RuntimeError("test: the executor's shutdown failed")
        real_shutdown()

    ends = []

    def on_own_thread(loop, executor, name):
        end, thread = real_on_own_thread(loop, executor, name)
        ends.append(end)
        return end, thread

    real_on_own_thread = app._shutdown_on_own_thread
    monkeypatch.setattr(executor, "shutdown", shutdown)
    monkeypatch.setattr(app, "_shutdown_on_own_thread", on_own_thread)
    loop = asyncio.get_running_loop()
    caplog.set_level(logging.ERROR, logger="wok")
    unretrieved = []
    default_handler = loop.get_exception_handler()
    loop.set_exception_handler(lambda loop, context: unretrieved.append(context["message"]))
    try:
        stopping = asyncio.ensure_future(server.stop(grace=30.0))
        try:
            assert await asyncio.to_thread(entered.wait, 10), "the stop never reached the executors' shutdown"
            stopping.cancel()
            await asyncio.wait({stopping})
            assert stopping.cancelled()
        finally:
            release.set()
        del stopping  # its cancellation's traceback holds the stop's frames, and the end with them
        (end,) = ends
        await asyncio.wait_for(asyncio.wait({end}), 30)
        assert end.done() and not end.cancelled()  # its failure set; not read here, which would retrieve it
        ends.clear()
        del end
        gc.collect()
        assert unretrieved == []
    finally:
        loop.set_exception_handler(default_handler)
        release.set()
    with pytest.raises(RuntimeError, match=r"^test: the executor's shutdown failed$") as raised:
        await asyncio.wait_for(server.stop(grace=5.0), 30)
    assert calls == [1, 2]
    assert all(executor_ended(inst) for inst in instances(server))
    (said,) = logged(caplog, raised.value)
    assert said.getMessage() == (
        "stopping: model 'gated': its executor's shutdown failed, after the stop that waited for it was cancelled"
    )


class _InterruptedAfter(set):
    """A stop's `_stop_done` whose marking of step `what` raises a KeyboardInterrupt, once: the step ran to its end,
    and a Ctrl-C landed before the stop recorded it (a signal's KeyboardInterrupt comes at any line)."""

    def __init__(self, what: str) -> None:
        super().__init__()
        self.what, self.raised = what, False

    def add(self, what: str) -> None:
        if what == self.what and not self.raised:
            self.raised = True
            raise KeyboardInterrupt
        super().add(what)


class _InterruptedOnce(logging.Handler):
    """An ERROR handler that keeps the records in `records` and raises a KeyboardInterrupt in the first one's write:
    an interrupt as a line is said."""

    def __init__(self, records: list) -> None:
        super().__init__(logging.ERROR)
        self.records = records

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        if len(self.records) == 1:
            raise KeyboardInterrupt


def test_a_stop_interrupted_after_a_step_ran_runs_it_again_harmlessly(gated_model, caplog, monkeypatch):
    """The next stop runs again a step that an interrupt left unrecorded (fd2170d): one that had run to its end ran
    twice. The metrics' close unregistered from the registry again (KeyError: the stop failed, status 1 in `wok serve`),
    and the failure logs' close closed the servable's check and batch_key logs again, for another server still serving
    with them (its failures then logged each at once, with no rate limit), and the server's own logs again (since
    a6efd4e a RuntimeError: the stop failed). Each step in turn: the next stop ends as an uninterrupted one, and the
    other server's logs stay open."""
    servable, _ = gated_model(max_batch_size=1, delay_ms=1.0)
    monkeypatch.setenv("WOK_TEST_TOKEN", "t" * 32)
    # Every part that has a step of its own.
    settings = server_settings(
        grpc_port=0, metrics_port=0, health_port=0, admin=True, auth_token_env="WOK_TEST_TOKEN", drain_wakeups=True
    )
    loop = asyncio.new_event_loop()
    caplog.set_level(logging.ERROR, logger="wok")
    other = WokServer(server_settings(grpc_port=0, metrics_port=None), ModelRepository([servable], "test"))
    try:
        loop.run_until_complete(other.start())
        server = WokServer(settings, ModelRepository([servable], "test"))
        loop.run_until_complete(server.start())
        loop.run_until_complete(server.stop(grace=2.0))
        steps = sorted(server._stop_done)  # those an uninterrupted stop runs
        assert len(steps) == 16, steps
        for what in steps:
            server = WokServer(settings, ModelRepository([servable], "test"))
            loop.run_until_complete(server.start())
            port, http_port = server.port, server.http.port
            own = server.service.failure_log(servable.name)  # as the first request a handler's bug failed makes it
            server._stop_done = _InterruptedAfter(what)
            with pytest.raises(KeyboardInterrupt):
                loop.run_until_complete(server.stop(grace=2.0))
            assert server._stop_done.raised, what
            loop.run_until_complete(asyncio.wait_for(server.stop(grace=2.0), 30))
            assert [r.getMessage() for r in caplog.records] == [], what
            assert sorted(server._stop_done) == steps, what
            assert bind_error("127.0.0.1", port) is None, what
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection(("127.0.0.1", http_port), timeout=5).close()
            assert not [m.name for m in server.registry.collect() if m.name.startswith("wok_")], what
            assert all(executor_ended(inst) for inst in instances(server)), what
            # The other server's: still open, its failures rate-limited. The server's own: closed.
            assert (servable.batch_key_failures._opened, servable.batch_key_failures._closed) == (1, False), what
            assert (own._opened, own._closed) == (0, True), what
    finally:
        loop.run_until_complete(other.stop(grace=2.0))
        loop.close()


async def test_each_models_failed_executor_shutdown_is_said(gated_model, monkeypatch, caplog):
    """The executors' step raised the first failed shutdown and left the others' unread: "Future exception was never
    retrieved" from asyncio, then (fd2170d) read by a callback and said nowhere. Each is said, naming its model."""
    (first, _), (second, _) = (gated_model(max_batch_size=1, delay_ms=1.0, name=name) for name in ("a", "b"))
    server = WokServer(server_settings(grpc_port=0, metrics_port=None), ModelRepository([first, second], "test"))
    await server.start()
    for name in ("a", "b"):
        executor = server.runtime(name).executor

        def failing(real=executor.shutdown, name=name) -> None:
            real()
            raise RuntimeError(f"test: model {name}'s shutdown failed")

        monkeypatch.setattr(executor, "shutdown", failing)
    caplog.set_level(logging.ERROR, logger="wok")
    with pytest.raises(RuntimeError, match=r"^test: model a's shutdown failed$"):
        await server.stop(grace=5.0)
    said = [(r.getMessage(), str(r.exc_info[1])) for r in caplog.records]
    assert said == [
        (f"stopping: model 'b': its executor's shutdown {FAILED}", "test: model b's shutdown failed"),
        (f"stopping: the executors' shutdown {FAILED}", "test: model a's shutdown failed"),  # the step's, raised
    ]
    assert all(executor_ended(inst) for inst in instances(server))


def test_finished_shutdowns_left_by_an_interrupt_in_a_join_are_said_and_fail_the_next_stop(gated_model, monkeypatch):
    """A KeyboardInterrupt in the executors' step as it joined a finished shutdown's thread (a Ctrl-C under a plain
    run_until_complete) left every shutdown's failure unread: asyncio's "Future exception was never retrieved" once
    collected, the next stop's own shutdowns succeeding. Each is said, naming its model, and the next stop fails with
    the first, as after a stop cancelled in that wait."""
    import gc

    (first, _), (second, _) = (gated_model(max_batch_size=1, delay_ms=1.0, name=name) for name in ("a", "b"))
    loop = asyncio.new_event_loop()
    unretrieved = []
    loop.set_exception_handler(lambda loop, context: unretrieved.append(context["message"]))
    try:
        server = WokServer(server_settings(grpc_port=0, metrics_port=None), ModelRepository([first, second], "test"))
        loop.run_until_complete(server.start())
        raised = []  # the models whose shutdown failed: not the errors, whose tracebacks would hold the ends
        for name in ("a", "b"):
            executor = server.runtime(name).executor

            def failing(real=executor.shutdown, name=name) -> None:
                real()
                if name not in raised:  # the first shutdown only
                    raised.append(name)
                    raise RuntimeError(f"test: model {name}'s shutdown failed")

            monkeypatch.setattr(executor, "shutdown", failing)

        joins = _interrupt_the_first_join_of("a", monkeypatch)
        records = []
        handler = logging.Handler(logging.ERROR)
        handler.emit = records.append
        logging.getLogger("wok").addHandler(handler)
        try:
            with pytest.raises(KeyboardInterrupt):
                loop.run_until_complete(server.stop(grace=5.0))
            assert joins[0].interrupted and sorted(raised) == ["a", "b"]
            # The stop task's done callbacks, queued on the stopped loop, hold it (and its frames, and the ends).
            loop.run_until_complete(asyncio.sleep(0))
            gc.collect()
            assert unretrieved == []
            assert [(r.getMessage(), str(r.exc_info[1])) for r in records] == [
                (
                    f"stopping: model '{name}': its executor's shutdown failed, after the stop that waited for it was "
                    "interrupted",
                    f"test: model {name}'s shutdown failed",
                )
                for name in ("a", "b")
            ]
            with pytest.raises(RuntimeError) as failed:
                loop.run_until_complete(asyncio.wait_for(server.stop(grace=5.0), 30))
            assert failed.value is records[0].exc_info[1]
            assert len(records) == 2, [r.getMessage() for r in records]
        finally:
            logging.getLogger("wok").removeHandler(handler)
        assert all(executor_ended(inst) for inst in instances(server))
        assert not server.abandoned_work
    finally:
        loop.close()


def test_a_steps_failure_whose_saying_an_interrupt_cut_is_said_once(gated_model, monkeypatch):
    """An interrupt while a step's failure was being said (a KeyboardInterrupt in a log handler's write) left the step
    unmarked: the next stop ran it again, and its failure was said twice. The step is marked before its failure is
    said; the next stop raises that failure."""
    servable, _ = gated_model(max_batch_size=1, delay_ms=1.0)
    loop = asyncio.new_event_loop()
    records = []
    handler = _InterruptedOnce(records)
    logging.getLogger("wok").addHandler(handler)
    try:
        server = WokServer(server_settings(grpc_port=0, metrics_port=None), ModelRepository([servable], "test"))
        loop.run_until_complete(server.start())
        port = server.port
        raised = []

        def refuse() -> None:
            raised.append(RuntimeError(f"test: the streams' end failed ({len(raised) + 1})"))
            raise raised[-1]

        monkeypatch.setattr(server._reflection, "end_streams", refuse)
        with pytest.raises(KeyboardInterrupt):
            loop.run_until_complete(server.stop(grace=5.0))
        with pytest.raises(RuntimeError) as failed:
            loop.run_until_complete(asyncio.wait_for(server.stop(grace=5.0), 30))
        assert len(raised) == 1, [str(e) for e in raised]
        assert failed.value is raised[0]
        assert [(r.getMessage(), r.exc_info[1]) for r in records] == [
            (f"stopping: ending reflection's streams {FAILED}", raised[0])
        ]
        assert bind_error("127.0.0.1", port) is None, "the gRPC port is still bound after the stop"
        assert all(executor_ended(inst) for inst in instances(server))
    finally:
        logging.getLogger("wok").removeHandler(handler)
        loop.close()


class _JoinInterruptedOnce:
    """A shutdown's thread whose first join raises a KeyboardInterrupt once the thread has ended (a Ctrl-C under a
    plain run_until_complete, landing in the executors' step's joins)."""

    def __init__(self, thread: threading.Thread) -> None:
        self.thread, self.interrupted = thread, False

    def join(self, timeout=None) -> None:
        self.thread.join(timeout)
        if not self.interrupted:
            self.interrupted = True
            raise KeyboardInterrupt


def _interrupt_the_first_join_of(model: str, monkeypatch) -> list[_JoinInterruptedOnce]:
    from wok import app

    joins = []

    def on_own_thread(loop, executor, name):
        end, thread = real_on_own_thread(loop, executor, name)
        if name == model and not joins:
            joins.append(_JoinInterruptedOnce(thread))
            return end, joins[-1]
        return end, thread

    real_on_own_thread = app._shutdown_on_own_thread
    monkeypatch.setattr(app, "_shutdown_on_own_thread", on_own_thread)
    return joins


def test_a_model_given_up_on_by_a_stop_an_interrupt_cut_is_said_once(gated_model, monkeypatch):
    """Model b stuck in a batch, the executors' step interrupted as it joined model a's thread: b, given up on before
    the joins (b9c1ce7), was waited for again by the next stop (another second) and said given up twice. Its
    shutdown runs on in the thread the first stop gave up on: the next stop leaves it there."""
    (first, _), (second, module) = (
        gated_model(max_batch_size=1, delay_ms=1.0, name="a"),
        gated_model(max_batch_size=1, delay_ms=1.0, name="b", enter_when_closed=True),
    )
    loop = asyncio.new_event_loop()
    records = []
    handler = logging.Handler(logging.ERROR)
    handler.emit = records.append
    logging.getLogger("wok").addHandler(handler)
    try:
        server = WokServer(server_settings(grpc_port=0, metrics_port=None), ModelRepository([first, second], "test"))
        loop.run_until_complete(server.start())
        port = server.port
        joins = _interrupt_the_first_join_of("a", monkeypatch)
        module.gate.clear()
        pending = server.runtime("b").batcher.submit({"INPUT0": np.ones((1, 4), np.float32)}, 1, None, None)
        assert loop.run_until_complete(asyncio.to_thread(module.entered.wait, 10)), "the batch never reached b"
        with pytest.raises(KeyboardInterrupt):
            loop.run_until_complete(server.stop(grace=0.2))
        assert joins[0].interrupted
        loop.run_until_complete(asyncio.wait_for(server.stop(grace=0.2), 30))
        assert [r.getMessage() for r in records] == ["model 'b' is still running a batch after the grace period"]
        assert server.abandoned_work
        assert bind_error("127.0.0.1", port) is None, "the gRPC port is still bound after the stop"
        assert all(executor_ended(inst) for inst in server.runtime("a").executor.instances)
        assert isinstance(pending.future.exception(), ShuttingDown)  # retrieved: no "never retrieved" at its end
        (left,) = [t for t in threading.enumerate() if t.name == "wok-b-shutdown"]  # the first stop's, alone
        module.gate.set()
        left.join(10)  # b's shutdown ends in it once its batch does
        assert not left.is_alive()
    finally:
        logging.getLogger("wok").removeHandler(handler)
        module.gate.set()
        loop.close()


def test_a_failed_shutdown_whose_saying_an_interrupt_cut_after_an_interrupted_join_fails_the_next_stop(
    gated_model, monkeypatch
):
    """A stop interrupted in its joins says the failed shutdowns it read (b9c1ce7), and kept each only once said: a
    second interrupt in the saying (a log handler's write) lost it, and the next stop returned. Kept first, as a
    step's failure is: the next stop raises it, said once."""
    servable, _ = gated_model(max_batch_size=1, delay_ms=1.0, name="a")
    loop = asyncio.new_event_loop()
    records = []
    handler = _InterruptedOnce(records)
    logging.getLogger("wok").addHandler(handler)
    try:
        server = WokServer(server_settings(grpc_port=0, metrics_port=None), ModelRepository([servable], "test"))
        loop.run_until_complete(server.start())
        executor = server.runtime("a").executor
        failures = []

        def failing(real=executor.shutdown) -> None:
            real()
            if not failures:  # the first shutdown only
                failures.append(RuntimeError("test: model a's shutdown failed"))
                raise failures[0]

        monkeypatch.setattr(executor, "shutdown", failing)
        joins = _interrupt_the_first_join_of("a", monkeypatch)
        with pytest.raises(KeyboardInterrupt):
            loop.run_until_complete(server.stop(grace=5.0))
        assert joins[0].interrupted and len(records) == 1
        with pytest.raises(RuntimeError) as failed:
            loop.run_until_complete(asyncio.wait_for(server.stop(grace=5.0), 30))
        assert failed.value is failures[0]
        assert [(r.getMessage(), r.exc_info[1]) for r in records] == [
            (
                "stopping: model 'a': its executor's shutdown failed, after the stop that waited for it was "
                "interrupted",
                failures[0],
            )
        ]
        assert all(executor_ended(inst) for inst in instances(server))
    finally:
        logging.getLogger("wok").removeHandler(handler)
        loop.close()


def test_a_model_given_up_on_as_an_interrupt_cut_its_line_is_said_once(gated_model):
    """An interrupt in the line saying a stuck model given up on (a log handler's write) left it not given up: the
    next stop waited for it again and said it again. Given up before it is said."""
    servable, module = gated_model(max_batch_size=1, delay_ms=1.0, enter_when_closed=True)
    loop = asyncio.new_event_loop()
    records = []
    handler = _InterruptedOnce(records)
    logging.getLogger("wok").addHandler(handler)
    try:
        server = WokServer(server_settings(grpc_port=0, metrics_port=None), ModelRepository([servable], "test"))
        loop.run_until_complete(server.start())
        module.gate.clear()
        pending = server.runtime("gated").batcher.submit({"INPUT0": np.ones((1, 4), np.float32)}, 1, None, None)
        assert loop.run_until_complete(asyncio.to_thread(module.entered.wait, 10)), "the batch never reached the model"
        with pytest.raises(KeyboardInterrupt):
            loop.run_until_complete(server.stop(grace=0.2))
        assert server.abandoned_work
        loop.run_until_complete(asyncio.wait_for(server.stop(grace=0.2), 30))
        assert [r.getMessage() for r in records] == ["model 'gated' is still running a batch after the grace period"]
        assert server.abandoned_work
        assert isinstance(pending.future.exception(), ShuttingDown)  # retrieved: no "never retrieved" at its end
    finally:
        logging.getLogger("wok").removeHandler(handler)
        module.gate.set()
        loop.close()
