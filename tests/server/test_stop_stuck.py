"""A stop with several models each stuck in a batch past the grace period: the server waits for
their executors all at once, about one second in all, not one second per model, and names each."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import numpy as np
import pytest
import torch
from torch import nn

from wok.app import WokServer
from wok.config import model_config_from_dict, server_settings
from wok.repository import ModelRepository
from wok.servable import Servable

GRACE_S = 0.2
STUCK = "is still running a batch after the grace period"


class Stuck(nn.Module):
    """Returns 2x; once `gate` is cleared, a batch blocks in the model until the test sets it."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.gate.set()  # the warm-up runs through
        self.entered = threading.Event()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.gate.is_set():
            self.entered.set()
        if not self.gate.wait(timeout=60):  # a backstop for a test that never set it
            raise RuntimeError("test gate never opened")
        return x * 2


def stuck_servable(name: str) -> tuple[Servable, Stuck]:
    cfg = model_config_from_dict(
        {
            "name": name,
            "platform": "python",
            "factory": "tests:unused",
            "inputs": [{"name": "INPUT0", "datatype": "FP32", "dims": [4]}],
            "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "dims": [4]}],
            "max_batch_size": 1,  # one request is a full batch: it goes to the model at once
            "instances": {"count": 1, "devices": ["cpu"]},
        },
        "test",
    )
    module = Stuck()
    return Servable(cfg, module), module


async def _stop_with_stuck_models(count: int, caplog) -> None:
    made = [stuck_servable(f"stuck{i}") for i in range(count)]
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
def test_a_stop_waits_for_all_stuck_models_at_once_and_names_each(run_on, loop, count, caplog):
    # 8: more than the default thread pool's 6 threads on a 2-core machine.
    run_on(loop, _stop_with_stuck_models(count, caplog))
