"""Which free slot a batch takes under the fixed policy: an idle instance's if any, else the spare
slot of the busy instance whose running batch started first (with full batches of about one length,
it frees first), not whichever busy instance's slot comes first in the list of free ones."""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import threading

import numpy as np
import torch
from torch import nn

from wok.batcher import Batcher, BatchingPolicy
from wok.executor import Executor
from wok.servable import Servable
from wok.stats import ModelStats

from .conftest import gated_servable, until


class KeyedGates(nn.Module):
    """Returns 2x; a batch whose first value is k waits for gate k."""

    def __init__(self) -> None:
        super().__init__()
        self.gates = {k: threading.Event() for k in range(6)}
        self.gates[0].set()  # a warm-up's zeros
        self.ran: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = int(x[0, 0])
        if not self.gates[k].wait(timeout=30):
            raise RuntimeError(f"gate {k} never opened")
        if k:
            self.ran.append(k)
        return x * 2


def _two_instances(model: nn.Module, wrap=None) -> tuple[Executor, Batcher]:
    """An executor of `model` on two CPU instances of two slots each (their instances passed through
    `wrap`), and a started batcher of batches of 8 that flushes on size only (a 10 s window)."""
    servable = Servable(gated_servable(max_batch_size=8, depth=2, count=2)[0].config, model)
    ex = Executor(servable, servable.config.instances, cpu_linear="torch")
    if wrap is not None:
        ex.instances[:] = [wrap(inst) for inst in ex.instances]
    b = Batcher("gated", ex, BatchingPolicy(8, 10.0), ModelStats("gated"))
    b.start()
    return ex, b


def _batch(b: Batcher, k: int) -> list:
    """A full batch of 8 one-row requests of value k (the gate it waits for)."""
    return [b.submit({"INPUT0": np.full((1, 4), k, np.float32)}, 1, None, None) for _ in range(8)]


async def _one_on_each(b: Batcher) -> tuple[list, list]:
    """Batch 1 sent to instance 0, then batch 2 to instance 1 (both idle: the first idle one goes)."""
    first = _batch(b, 1)
    await until(lambda: b._busy == [1, 0])
    second = _batch(b, 2)
    await until(lambda: b._busy == [1, 1])
    return first, second


async def test_a_full_batch_takes_the_spare_slot_of_the_instance_running_since_first():
    # Two instances, two slots each, batches of 8 (the delay window 10 s: size flushes only).
    # Batch 1 runs on instance 0, batch 2 on instance 1, batch 3 (full) waits in instance 0's
    # spare slot. Batch 2 ends (instance 1 idle), then batch 1: batch 3 starts on instance 0.
    # Batch 4 goes to the idle instance 1. Batch 5, full, takes a spare slot: instance 0's, whose
    # batch 3 started before batch 4. (It took instance 1's, the first in the list of free slots,
    # and waited behind batch 4 while instance 0 finished batch 3 and idled.)
    model = KeyedGates()
    ex, b = _two_instances(model)
    batch = functools.partial(_batch, b)
    try:
        first, second = await _one_on_each(b)
        third = batch(3)
        await until(lambda: b._busy == [2, 1])
        model.gates[2].set()
        await asyncio.gather(*(p.future for p in second))
        model.gates[1].set()
        await asyncio.gather(*(p.future for p in first))
        fourth = batch(4)
        await until(lambda: b._busy == [1, 1])
        fifth = batch(5)
        await until(lambda: b.queued == 0)
        assert b._busy == [2, 1]
        model.gates[3].set()
        model.gates[5].set()
        await asyncio.gather(*(p.future for p in fifth))
        assert not any(p.future.done() for p in fourth)  # batch 5 did not wait behind batch 4
        model.gates[4].set()
        await asyncio.gather(*(p.future for p in [*third, *fourth]))
        assert model.ran == [2, 1, 3, 5, 4]
    finally:
        for g in model.gates.values():
            g.set()
        await b.stop()
        ex.shutdown()
    assert b.queued == 0 and b.inflight == 0


class _LaunchesAtOnce:
    """An instance as a CUDA one is to the batcher (a batch is launched at once, behind none), whose
    batches of value 9 fail at launch: their future is done before the batch running ahead of them."""

    def __init__(self, real) -> None:
        self._real, self.cuda = real, True

    def __getattr__(self, name: str):
        return getattr(self._real, name)

    def submit(self, inputs, rows, slot, deadlines=None):
        if int(inputs[0]["INPUT0"][0, 0]) == 9:
            f: concurrent.futures.Future = concurrent.futures.Future()
            f.set_exception(RuntimeError("launch failed"))
            return f
        return self._real.submit(inputs, rows, slot, deadlines)


async def test_a_batch_failed_at_launch_behind_the_running_one_does_not_move_its_start():
    # Batch 1 runs on instance 0, batch 2 (later) on instance 1. Batch 3, full, takes instance 0's
    # spare slot and fails at launch, back before batch 1. Batch 4, full, still goes to instance 0,
    # whose batch 1 started first (it went to instance 1: batch 3's failure counted as batch 1's end).
    model = KeyedGates()
    ex, b = _two_instances(model, wrap=_LaunchesAtOnce)
    batch = functools.partial(_batch, b)
    try:
        first, second = await _one_on_each(b)
        third = batch(9)
        failed = await asyncio.gather(*(p.future for p in third), return_exceptions=True)
        assert all(isinstance(r, Exception) for r in failed)
        fourth = batch(4)
        await until(lambda: b.queued == 0)
        assert b._busy == [2, 1]
    finally:
        for g in model.gates.values():
            g.set()
        await b.stop()
        ex.shutdown()
    await asyncio.gather(*(p.future for p in [*first, *second, *fourth]))
