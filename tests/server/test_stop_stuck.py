"""A stop with several models each stuck in a batch past the grace period: the server waits for
their executors all at once, about one second in all, not one second per model, and names each. A start
cancelled in a stuck warm-up, or in a stuck load (its executor's build), waits for that model as long, and names
it."""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from wok.app import WokServer
from wok.config import server_settings
from wok.errors import ShuttingDown
from wok.repository import ModelRepository
from wok.servable import Servable

from .conftest import GatedDouble, gated_servable, until

GRACE_S = 0.2
STUCK = "is still running a batch after the grace period"


async def _stop_with_stuck_models(gated_model, count: int, caplog) -> None:
    # One request is a full batch: it goes to the model at once, and blocks there once its gate is
    # cleared (`entered`: a batch met the closed gate; the warm-up runs through).
    made = [
        gated_model(max_batch_size=1, delay_ms=5.0, depth=None, name=f"stuck{i}", enter_when_closed=True)
        for i in range(count)
    ]
    modules = [m for _, m in made]
    settings = server_settings(grpc_port=0, metrics_port=None)
    server = WokServer(settings, ModelRepository([s for s, _ in made], "test"))
    loop = asyncio.get_running_loop()
    try:
        await server.start()
        for m in modules:
            m.gate.clear()
        x = {"INPUT0": np.ones((1, 4), np.float32)}
        pending = [server.runtime(s.name).batcher.submit(x, 1, None, None) for s, _ in made]
        for m in modules:
            assert await loop.run_in_executor(None, m.entered.wait, 10), "a batch never reached its model"
        caplog.set_level(logging.ERROR, logger="wok")
        started = time.monotonic()
        await server.stop(grace=GRACE_S)
        took = time.monotonic() - started
        # One shared second past the grace (plus gRPC's 0.1 s stop), with room for a loaded machine;
        # one at a time, 3 stuck models took 3.2 s and 8 took 8.2 s.
        assert took < GRACE_S + 2.5, f"stop with {count} stuck models took {took:.2f} s"
        assert server.abandoned_work
        logged = [r.getMessage() for r in caplog.records if STUCK in r.getMessage()]
        assert sorted(logged) == sorted(f"model '{s.name}' {STUCK}" for s, _ in made)
        for p in pending:  # answered UNAVAILABLE by the stop, not left waiting
            assert p.future.done()
            # Read, as a handler reads it: unread, the failed futures log "Future exception was never retrieved"
            # when collected, into whichever test then runs in this process (CI: test_deadlines' caplog check).
            assert isinstance(p.future.exception(), ShuttingDown), p.future.exception()
    finally:
        for m in modules:
            m.gate.set()
        if not server.draining:
            await server.stop(grace=5.0)
        # The stuck batches end now: wait for every model thread and the stop's shutdown threads.
        for rt in server.runtimes.values():
            await loop.run_in_executor(None, rt.executor.shutdown)
        for t in threading.enumerate():
            if t.name.startswith("wok-stuck") and t.name.endswith("-shutdown"):
                await loop.run_in_executor(None, t.join, 10)
                assert not t.is_alive(), f"{t.name} did not end"


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
@pytest.mark.parametrize("count", [3, 8])
def test_a_stop_waits_for_all_stuck_models_at_once_and_names_each(run_on, gated_model, loop, count, caplog):
    # 8: more than the default thread pool's 6 threads on a 2-core machine.
    run_on(loop, _stop_with_stuck_models(gated_model, count, caplog))


async def _cancel_once(starting: asyncio.Future, reached: threading.Event, never: str) -> None:
    """Cancel `starting` (a server's start) once the model has set `reached`; it ends cancelled within 3 s."""
    loop = asyncio.get_running_loop()
    assert await loop.run_in_executor(None, reached.wait, 10), never
    started = time.monotonic()
    starting.cancel()
    await asyncio.wait({starting})
    took = time.monotonic() - started
    assert starting.cancelled()
    assert took < 3.0, f"the cancelled start took {took:.2f} s to end"


async def _end_the_start(module, starting, server, shutdown_thread: bool = False) -> None:
    """Let the gated model go, wait for the start to end, stop the server; with `shutdown_thread`, wait for the start's
    shutdown thread too (the warm-up's forward ends now)."""
    module.gate.set()
    if not starting.done():
        await asyncio.wait({starting})
    await server.stop(grace=5.0)
    if shutdown_thread:
        for t in threading.enumerate():
            if t.name == "wok-stuck-shutdown":
                await asyncio.get_running_loop().run_in_executor(None, t.join, 10)
                assert not t.is_alive(), f"{t.name} did not end"


async def _cancel_a_start_stuck_in_its_warm_up(gated_model, caplog) -> None:
    # The warm-up's forward blocks at the closed gate (`entered`: it reached the model).
    servable, module = gated_model(name="stuck")
    module.gate.clear()
    server = WokServer(server_settings(grpc_port=0, metrics_port=None), ModelRepository([servable], "test"))
    caplog.set_level(logging.ERROR, logger="wok")
    starting = asyncio.ensure_future(server.start())
    try:
        # The start's cleanup waits a second, as a stop with no grace left does; unbounded, it waited for the
        # warm-up's forward (here the gate's 10 s backstop, a stuck model's forever).
        await _cancel_once(starting, module.entered, "the warm-up never reached the model")
        assert server.abandoned_work
        logged = [r.getMessage() for r in caplog.records if "is still running" in r.getMessage()]
        assert logged == ["model 'stuck' is still running a batch as the start ended"], logged
    finally:
        await _end_the_start(module, starting, server, shutdown_thread=True)


def test_a_start_cancelled_in_a_stuck_warm_up_ends_within_a_second_and_gives_the_model_up(run_on, gated_model, caplog):
    """A start cancelled in its warm-up (asyncio.run's on a Ctrl-C, a caller's wait_for) shut the model's executor
    down with no bound: it waited for the warm-up's forward, as long as the model held it. Bounded as the stop's
    wait is, the model is given up on (`abandoned_work`, which `wok serve` exits hard on) and named."""
    run_on("asyncio", _cancel_a_start_stuck_in_its_warm_up(gated_model, caplog))


class SlowToLoad(GatedDouble):
    """A model whose load (its move to the device, on the start's build of its executor) blocks while its gate is
    closed: `loading` is set as it waits, `loaded` once the move returned."""

    def __init__(self) -> None:
        super().__init__()
        self.loading = threading.Event()
        self.loaded = threading.Event()

    def to(self, *args, **kwargs):
        self.loading.set()
        if not self.gate.wait(timeout=10):  # a backstop, as the batches' gate's
            raise RuntimeError("test gate never opened")
        moved = super().to(*args, **kwargs)
        self.loaded.set()
        return moved


async def _cancel_a_start_stuck_in_a_models_load(caplog) -> None:
    servable, _ = gated_servable(name="loading")
    module = SlowToLoad()
    servable = Servable(servable.config, module)
    module.gate.clear()
    server = WokServer(server_settings(grpc_port=0, metrics_port=None), ModelRepository([servable], "test"))
    loop = asyncio.get_running_loop()
    caplog.set_level(logging.ERROR, logger="wok")
    starting = asyncio.ensure_future(server.start())
    try:
        await _cancel_once(starting, module.loading, "the build never reached the model's load")
        # The load goes on on its thread, which the process's exit waits for (a pool thread): the start gave the
        # model up, as the stop gives up a stuck batch, and said so.
        assert not module.loaded.is_set()
        assert server.abandoned_work
        logged = [r.getMessage() for r in caplog.records if "still" in r.getMessage()]
        assert logged == ["model 'loading' is still loading as the start ended"], logged
        # The executor that load then builds is shut down on its thread, never served.
        module.gate.set()
        assert await loop.run_in_executor(None, module.loaded.wait, 10), "the load never ended"
        assert server.runtimes == {}
    finally:
        await _end_the_start(module, starting, server)


def test_a_start_cancelled_in_a_models_load_ends_within_a_second_and_gives_the_model_up(run_on, caplog):
    """A start cancelled while it built a model's executor (its load: moving the module to its device) ended at
    once and said nothing, the build still running on a thread of the loop's pool, which asyncio.run's end and the
    process's exit wait for, however long the load takes. Now waited for a second, as a warm-up is, then the model
    is given up on (`abandoned_work`) and named; what the load builds after is shut down on its thread."""
    run_on("asyncio", _cancel_a_start_stuck_in_a_models_load(caplog))


class FailsToLoad(SlowToLoad):
    """A model whose load fails once its gate opens."""

    def to(self, *args, **kwargs):
        self.loading.set()
        if not self.gate.wait(timeout=10):  # a backstop, as the batches' gate's
            raise RuntimeError("test gate never opened")
        raise RuntimeError("the load failed")


async def _cancel_a_start_twice_as_its_load_fails() -> None:
    servable, _ = gated_servable(name="loading")
    module = FailsToLoad()
    module.gate.clear()
    server = WokServer(
        server_settings(grpc_port=0, metrics_port=None), ModelRepository([Servable(servable.config, module)], "test")
    )
    loop = asyncio.get_running_loop()
    unhandled = []
    loop.set_exception_handler(lambda _, context: unhandled.append(context["message"]))
    # One thread: a call queued behind the build returns once the build's end has been handed to the loop.
    pool = ThreadPoolExecutor(1)
    loop.set_default_executor(pool)
    waits = ThreadPoolExecutor(1)  # the test's own waits, which the build's thread would queue behind
    starting = asyncio.ensure_future(server.start())
    try:
        assert await loop.run_in_executor(waits, module.loading.wait, 10), "the build never reached the model's load"
        starting.cancel()
        await asyncio.sleep(0)  # one turn of the loop: the start is in its wait for the load
        module.gate.set()
        pool.submit(int).result(timeout=10)  # on the loop's thread: the failed load's end is queued, not yet read
        starting.cancel()  # a second Ctrl-C, in the same turn
        await asyncio.wait({starting})
        assert starting.cancelled()
        assert not server.abandoned_work  # the load ended, with its failure
    finally:
        await _end_the_start(module, starting, server)
        waits.shutdown()
    del starting
    gc.collect()
    # The build's failure, read: it was logged as "Future exception was never retrieved", with its traceback.
    assert unhandled == []


def test_a_load_that_fails_as_a_second_cancellation_lands_is_read(run_on):
    """A start cancelled in a model's load, cancelled again as that load fails: the build's exception was left
    unread, and asyncio logged it as "Future exception was never retrieved" (ERROR, a traceback) when collected."""
    run_on("asyncio", _cancel_a_start_twice_as_its_load_fails())


async def _cancel_a_start_stuck_in_its_warm_up_twice(gated_model, caplog) -> None:
    # The warm-up's forward blocks at the closed gate; the start's clean-up waits for it a second, as the stop does.
    servable, module = gated_model(name="stuck")
    module.gate.clear()
    server = WokServer(server_settings(grpc_port=0, metrics_port=None), ModelRepository([servable], "test"))
    loop = asyncio.get_running_loop()
    caplog.set_level(logging.ERROR, logger="wok")
    starting = asyncio.ensure_future(server.start())
    try:
        assert await loop.run_in_executor(None, module.entered.wait, 10), "the warm-up never reached the model"
        starting.cancel()
        # The start's clean-up has begun its wait: the thread that shuts the executor down runs.
        await until(lambda: any(t.name == "wok-stuck-shutdown" for t in threading.enumerate()))
        starting.cancel()  # a second Ctrl-C, a caller's second cancellation
        await asyncio.wait({starting})
        assert starting.cancelled()
        # The warm-up still runs on the model's thread, which nothing will end and Python's exit waits for.
        assert not module.ran
        assert server.abandoned_work
        logged = [r.getMessage() for r in caplog.records if "is still running" in r.getMessage()]
        assert logged == ["model 'stuck' is still running a batch as the start ended"], logged
    finally:
        await _end_the_start(module, starting, server, shutdown_thread=True)


def test_a_start_cancelled_again_as_it_waits_for_a_stuck_warm_up_gives_the_model_up(run_on, gated_model, caplog):
    """A start cancelled in its warm-up waits a second for the model's forward; cancelled again in that wait (a
    second Ctrl-C, a caller's wait_for inside a cancelled task), it ended with the forward still running on the
    model's thread, said nothing, and left `abandoned_work` False: the executor is in no runtime, no stop shuts it
    down, and Python's exit waits for that thread, a stuck model's for good."""
    run_on("asyncio", _cancel_a_start_stuck_in_its_warm_up_twice(gated_model, caplog))


async def _cancel_a_start_again_as_its_shutdown_fails(gated_model, caplog, monkeypatch) -> None:
    from wok import app

    servable, module = gated_model(name="stuck")
    module.gate.clear()
    server = WokServer(server_settings(grpc_port=0, metrics_port=None), ModelRepository([servable], "test"))
    caplog.set_level(logging.ERROR, logger="wok")
    starting = asyncio.ensure_future(server.start())
    failure = RuntimeError("test: the executor's shutdown failed")

    class Failing:
        """The start's executor, whose shutdown lets the warm-up through, ends the executor, then fails."""

        def __init__(self, executor) -> None:
            self.executor = executor

        def shutdown(self) -> None:
            module.gate.set()
            self.executor.shutdown()
            raise failure

    def on_own_thread(loop, executor, name):
        end, thread = real_on_own_thread(loop, Failing(executor), name)
        # Added before the clean-up's wait adds its own: the second cancellation lands in that wait, the end set.
        end.add_done_callback(lambda _: starting.cancel())
        return end, thread

    real_on_own_thread = app._shutdown_on_own_thread
    monkeypatch.setattr(app, "_shutdown_on_own_thread", on_own_thread)
    try:
        assert await asyncio.to_thread(module.entered.wait, 10), "the warm-up never reached the model"
        starting.cancel()
        await asyncio.wait_for(asyncio.wait({starting}), 30)
        assert starting.cancelled()
        assert not server.abandoned_work  # its shutdown ended: nothing given up
        said = [(r.getMessage(), r.exc_info and r.exc_info[1]) for r in caplog.records]
        assert said == [("model 'stuck': its executor's shutdown failed as the start ended", failure)], said
    finally:
        module.gate.set()
        if not starting.done():
            await asyncio.wait({starting})
        await server.stop(grace=5.0)


def test_a_shutdown_failing_in_a_start_cancelled_again_in_its_clean_up_is_said(
    run_on, gated_model, caplog, monkeypatch
):
    """A start cancelled in its warm-up, cancelled again as its clean-up's executor shutdown failed: the failure was
    read (not raised: the cancellation is what the caller gets) and said nowhere. Said, naming the model."""
    run_on("asyncio", _cancel_a_start_again_as_its_shutdown_fails(gated_model, caplog, monkeypatch))
