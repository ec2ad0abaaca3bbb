"""A batch's requests are the caller's alone once its outcome is told (server/executor.py, Instance.submit).

The worker's thread pool sets a batch's future (whose done callbacks run there and then: the batcher's sends the
outcome to the loop, which answers) before it drops the batch's work item, whose arguments are the requests' inputs,
views of the bytes received for them: a worker the OS did not run again at once (a loaded host) held the requests (up
to gRPC's receive limit each) after their answers. So did the frames a failed batch's traceback keeps (the worker's,
its assembly's), and its outputs, which reach nobody.
"""

from __future__ import annotations

import threading
import weakref

import numpy as np
import pytest
import torch

from wok.config import InstanceConfig
from wok.errors import InvalidInput, ModelExecutionError
from wok.executor import Executor
from wok.servable import Servable

from .conftest import GatedDouble, four_wide_config

NO_CUDA = "no CUDA device here; the CUDA path is checked on a GPU by bench/gpu_check.py"
CUDA = pytest.param("cuda:0", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA))


class Recorded(GatedDouble):
    """GatedDouble, with a weak reference to each output it made."""

    def __init__(self) -> None:
        super().__init__()
        self.made: list[weakref.ref] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        self.made.append(weakref.ref(out))
        return out


class RefusesNegative(Servable):
    """Its own assemble refuses a request holding a negative value (InvalidInput: the client's), with the request in
    its frame's variables as it raises."""

    def assemble(self, requests, rows, buffers):
        for r in requests:
            if bool((r["INPUT0"] < 0).any()):
                raise InvalidInput("model 'lets-go': input 'INPUT0' holds a negative value; expected 0 or more")
        return super().assemble(requests, rows, buffers)


class SplitFails(RefusesNegative):
    """Its split raises on an answer of 2 (a request of 1), as a bug in wok's own work on a batch would: met rerunning
    a failed batch's parts, it stops the reruns and fails every request not answered (Instance._isolate)."""

    def split(self, outputs, rows):
        if bool((outputs["OUTPUT0"] == 2).any()):
            raise RuntimeError("split failed")
        return super().split(outputs, rows)


def _submit(inst, values) -> tuple[list[weakref.ref], object]:
    """Submit a batch of one request a value; (a weak reference to each request's array, the batch's future). Nothing
    here keeps the arrays once it returns."""
    reqs = [{"INPUT0": np.full((1, 4), v, np.float32)} for v in values]
    refs = [weakref.ref(r["INPUT0"]) for r in reqs]
    return refs, inst.submit(reqs, [1] * len(reqs), 0)


@pytest.mark.parametrize("device", ["cpu", CUDA])
@pytest.mark.parametrize(
    ("values", "outcome"),
    [
        ([1.0], "answered"),
        ([np.nan], ModelExecutionError),  # the model fails a batch of one: raised, not rerun
        ([-1.0], InvalidInput),  # its assemble refuses it: raised from the assembly's frames
        ([1.0, np.nan, -1.0, 2.0], "rerun"),  # failed, rerun in parts: the batch's error is the result's
        ([1.0, np.nan], "own"),  # failed, rerun in parts, whose first meets an error not the model's
        ([1.0], "split"),  # its outputs made, their split fails: raised, not rerun
    ],
)
def test_a_batch_told_done_holds_nothing_of_its_requests(device, values, outcome):
    servable = SplitFails if outcome in ("own", "split") else RefusesNegative
    m = Recorded()
    s = servable(four_wide_config("lets-go"), m)
    ex = Executor(s, InstanceConfig(count=1, devices=(device,), pipeline_depth=1))
    try:
        inst = ex.instances[0]
        # A batch ahead holds the worker, so that the one watched is run after this thread let its requests go.
        m.gate.clear()
        ahead = inst.submit([{"INPUT0": np.zeros((1, 4), np.float32)}], [1], 0)
        assert m.entered.wait(30)
        refs, future = _submit(inst, values)
        held_when_told: list[int] = []
        outputs_when_told: list[int] = []
        told = threading.Event()

        def on_done(f) -> None:  # on the thread that set the outcome, as the batcher's callback is
            held_when_told.append(sum(r() is not None for r in refs))
            outputs_when_told.append(sum(r() is not None for r in m.made[1:]))  # [0]: the batch ahead's
            told.set()

        future.add_done_callback(on_done)
        m.gate.set()
        ahead.result(30)
        assert told.wait(30)
        if outcome == "answered":
            assert future.result().failure is None
        elif outcome == "rerun":
            result = future.result()
            assert type(result.failure) is InvalidInput  # its assemble refuses the batch before any forward
            assert [type(o) for o in result.outputs] == [dict, ModelExecutionError, InvalidInput, dict]
        elif outcome == "own":
            result = future.result()
            assert [str(o) for o in result.outputs] == ["model 'lets-go' failed: RuntimeError: split failed"] * 2
        elif outcome == "split":
            assert str(future.exception()) == "split failed"
        else:
            assert type(future.exception()) is outcome
        assert held_when_told == [0], f"{held_when_told[0]} of {len(values)} requests held as the batch was told done"
        if outcome != "answered":  # an answer's arrays are views of the output the model made, handed over
            # A failed batch's outputs reach nobody; a part's answers are copies (Instance._cpu_batch).
            assert outputs_when_told == [0], f"{outputs_when_told[0]} outputs held as the batch was told done"
    finally:
        m.gate.set()
        ex.shutdown()
