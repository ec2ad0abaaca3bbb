"""A model's forward that raises a BaseException (KeyboardInterrupt, SystemExit, GeneratorExit, asyncio's
CancelledError, the user's own) fails its batch as any error does: the batch is rerun in parts, the request
the model fails on gets the error alone and its neighbours their answers (executor's Instance._isolate);
and the batcher's failure log cuts a model's long message in its line (FailureLog)."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import ClassVar

import grpc
import numpy as np
import pytest
import torch
from torch import nn

from wok.batcher import FailureLog
from wok.config import InstanceConfig
from wok.errors import ModelExecutionError
from wok.executor import Executor
from wok.servable import Servable
from wok.v2pb import grpc_service_pb2 as pb
from wok.v2pb import grpc_service_pb2_grpc as pb_grpc

from .conftest import four_wide_config
from .test_undescribable_errors import _unary

NO_CUDA = "no CUDA device here; the CUDA path is checked on a GPU by bench/gpu_session.sh"

# What forward raises, by the value of the request that makes it.
MODEL_PY = """
import asyncio

from torch import nn


class Custom(BaseException):
    pass


RAISED = {
    1: lambda: KeyboardInterrupt("ki"),
    2: lambda: SystemExit(3),
    3: lambda: GeneratorExit("ge"),
    4: lambda: asyncio.CancelledError("ce"),
    5: lambda: Custom("the user's own"),
}


class Model(nn.Module):
    def forward(self, x):
        top = int(x.max())
        if top in RAISED:
            raise RAISED[top]()
        return x * 2


def build():
    return Model()
"""

# The answer of the request that makes forward raise, by its value.
FAILED = {
    1: "model 'pairs' failed: KeyboardInterrupt: ki (on this request alone)",
    2: "model 'pairs' failed: SystemExit: 3 (on this request alone)",
    3: "model 'pairs' failed: GeneratorExit: ge (on this request alone)",
    4: "model 'pairs' failed: CancelledError: ce (on this request alone)",
    5: "model 'pairs' failed: Custom: the user's own (on this request alone)",
}

CONFIG = (
    'platform = "python"\nfactory = "model:build"\nmax_batch_size = 2\n\n'
    '[[inputs]]\nname = "X"\ndatatype = "FP32"\ndims = [4]\n\n'
    '[[outputs]]\nname = "OUT"\ndatatype = "FP32"\ndims = [4]\n\n'
    # Each batch is two requests, flushed once both are queued (the delay only bounds a test that fails).
    "[dynamic_batching]\npreferred_batch_sizes = [2]\nmax_queue_delay_ms = 10000\n\n"
    '[instances]\ndevices = ["cpu"]\n'
)


@pytest.fixture
def repository(tmp_path):
    root = tmp_path / "repo"
    (root / "pairs").mkdir(parents=True)
    (root / "pairs" / "model.py").write_text(MODEL_PY)
    (root / "pairs" / "config.toml").write_text(CONFIG)
    return root


def request(value: float) -> pb.ModelInferRequest:
    req = pb.ModelInferRequest(model_name="pairs")
    req.inputs.add(name="X", datatype="FP32", shape=[1, 4])
    req.raw_input_contents.append(np.full((1, 4), value, np.float32).tobytes())
    return req


async def test_a_forward_raising_a_base_exception_fails_its_request_alone_and_its_neighbour_is_answered(
    serve, repository
):
    # Only an Exception was rerun in parts: a BaseException failed the whole batch, the good request
    # beside it answered INTERNAL with the bad one's error.
    async with serve(models=(), repository=repository) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            answers = []
            for value, message in FAILED.items():  # a pair at a time: one batch each
                bad, good = await asyncio.gather(_unary(stub, request(value)), _unary(stub, request(0.5)))
                assert good == ("OK", ""), value
                assert bad == ("INTERNAL", message), value
                answers += [bad, good]
            # The worker thread serves on: the next batch is answered.
            after = await asyncio.gather(_unary(stub, request(0.5)), _unary(stub, request(0.25)))
            assert after == [("OK", "")] * 2
        rt = server.runtimes["pairs"]
        assert rt.metrics.responses == dict(Counter(code for code, _ in answers + after))
        assert (rt.batcher.queued, rt.batcher.inflight) == (0, 0)


class RaisesBase(nn.Module):
    """Doubles its input; raises the BaseException `RAISED[v]` on a batch holding the value -v."""

    RAISED: ClassVar = {1: KeyboardInterrupt, 2: SystemExit, 3: GeneratorExit, 4: asyncio.CancelledError}

    def __init__(self) -> None:
        super().__init__()
        self.batch_sizes: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.batch_sizes.append(int(x.shape[0]))
        low = int(x.min())
        if -low in self.RAISED:
            raise self.RAISED[-low](f"value {low}")
        return x * 2


def _executor(device: str):
    m = RaisesBase()
    s = Servable(four_wide_config("base"), m)
    return Executor(s, InstanceConfig(count=1, devices=(device,), pipeline_depth=1)), m


@pytest.mark.parametrize(
    "device", ["cpu", pytest.param("cuda:0", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA))]
)
@pytest.mark.parametrize("code", sorted(RaisesBase.RAISED))
def test_an_instance_reruns_a_batch_failed_by_a_base_exception_in_parts(device, code):
    """On the CPU (_forward_cpu) and on CUDA (_launch_live: the forward is launched on the host): the batch
    of 4 fails, its halves are rerun, the bad request fails alone; the instance serves on."""
    ex, m = _executor(device)
    try:
        inst = ex.instances[0]
        values = [1.0, 2.0, -code, 4.0]
        reqs = [{"INPUT0": np.full((1, 4), v, np.float32)} for v in values]
        # Read off the future, not raised: a KeyboardInterrupt raised in the test would end the test run.
        fut = inst.submit(reqs, [1] * 4, 0)
        assert fut.exception(30) is None, repr(fut.exception())
        result = fut.result()
        name = RaisesBase.RAISED[code].__name__
        assert isinstance(result.failure, ModelExecutionError)
        assert str(result.failure) == f"model 'base' failed: {name}: value {-code}"
        assert isinstance(result.failure.__cause__, RaisesBase.RAISED[code])  # for the log's traceback
        assert m.batch_sizes == [4, 2, 2, 1, 1]
        bad = result.outputs[2]
        assert isinstance(bad, ModelExecutionError)
        assert str(bad) == f"model 'base' failed: {name}: value {-code} (on this request alone)"
        for i in (0, 1, 3):
            np.testing.assert_array_equal(result.outputs[i]["OUTPUT0"], np.full((1, 4), 2 * values[i], np.float32))
        # A batch of one cannot be rerun: it fails with the model's error, wrapped as any error is.
        alone = inst.submit(reqs[2:3], [1], 0).exception(30)
        assert isinstance(alone, ModelExecutionError), repr(alone)
        assert str(alone) == f"model 'base' failed: {name}: value {-code}"
        again = inst.submit(reqs[:2], [1, 1], 0).result(30)
        assert again.failure is None and len(again.outputs) == 2
    finally:
        ex.shutdown()


def test_the_failure_log_line_cuts_a_long_model_message_and_keeps_the_traceback(caplog):
    # A 20 MB message was logged whole in the WARNING line, on every failure logged.
    try:
        raise ValueError("x" * 20_000_000)
    except ValueError as exc:
        cause = exc
    err = ModelExecutionError(f"model 'm' failed: ValueError: {cause}")
    err.__cause__ = cause
    with caplog.at_level(logging.WARNING, logger="wok"):
        FailureLog("m").batch_failed(err, 2, 2, failed=1, reruns=2)
    [record] = caplog.records
    line = record.getMessage()
    size = len(line)  # not the line: a failing assert would show it whole
    assert size < 10_000
    assert line.startswith("model 'm': a batch of 2 request(s), 2 sample(s), failed: model 'm' failed: ValueError: xxx")
    assert f"… ({len(str(err)):,} characters in all)" in line
    assert line.endswith("; rerun in parts (2 forwards): 1 request(s) failed, 1 answered")
    assert record.exc_info[1] is cause  # the model's exception and its traceback, as before
