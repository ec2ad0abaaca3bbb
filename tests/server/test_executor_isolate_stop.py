"""A failed batch rerun in parts (server/executor.py, Instance._isolate) whose reruns are cut short: the
device lost as they run (a part's device-side error, or another instance's on the device), or an error
that is not the model's failing a request (a bug in wok's work on a part's answers, which a MemoryError
raised viewing an answer stands for: one copying it is the part's failing, rerun smaller). The parts
answered keep their answers; the requests not answered get one error each, and nothing more runs.
"""

from __future__ import annotations

import asyncio
import logging

import grpc
import numpy as np
import pytest
import torch
from torch import nn

from wok.app import WokServer
from wok.codec import decode_response, encode_request
from wok.config import InstanceConfig, server_settings
from wok.errors import DeviceLost, ModelExecutionError
from wok.executor import LOST_ALONE, LOST_IN_PART, Executor
from wok.repository import ModelRepository
from wok.servable import Servable
from wok.v2pb import grpc_service_pb2_grpc as pb_grpc

from .conftest import four_wide_config, gated_servable, until
from .test_executor_isolate import assert_answers, requests, run

# What the CUDA path notes when a batch meets a device-side error (Instance._note_device_error).
DEVICE_ASSERT = "AcceleratorError: CUDA error: device-side assert triggered"
# The error of the forward that meets it here, as every path tells a device-side error (executor.failure_line).
DEVICE_FAILED = "model 'fails' failed on the device: RuntimeError: CUDA error: device-side assert triggered"


class Unreadable(torch.Tensor):
    """An output whose numpy view fails (an error of wok's own work: no copy is refused there)."""

    def numpy(self, *args, **kwargs):
        raise MemoryError("no memory for the answer")


class FailsAtForward(nn.Module):
    """Doubles its input and raises on a batch holding a NaN, as GatedDouble; its forward number `at`
    instead meets `what`: 'lost', a device-side error, which it marks on `lost` (its executor's) as the
    CUDA path marks it; 'planted', the mark another instance on the device sets as this forward runs,
    which then goes on; 'unreadable', an answer whose array no memory can hold (Unreadable)."""

    def __init__(self, at: int, what: str) -> None:
        super().__init__()
        self.at, self.what = at, what
        self.lost: dict[str, str] = {}
        self.batch_sizes: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.batch_sizes.append(int(x.shape[0]))
        if len(self.batch_sizes) == self.at and self.what == "lost":
            self.lost["cpu"] = DEVICE_ASSERT
            raise RuntimeError("CUDA error: device-side assert triggered")
        if len(self.batch_sizes) == self.at and self.what == "planted":
            self.lost["cpu"] = DEVICE_ASSERT
        if torch.isnan(x).any():
            raise ValueError("NaN in batch")
        if len(self.batch_sizes) == self.at:
            return (x * 2).as_subclass(Unreadable)
        return x * 2


def fails_at_forward(at: int, what: str) -> tuple[Executor, FailsAtForward]:
    module = FailsAtForward(at, what)
    ex = Executor(Servable(four_wide_config("fails"), module), InstanceConfig(count=1, devices=("cpu",)))
    assert ex.instances[0].module is module
    module.lost = ex._lost
    return ex, module


def lost_message() -> str:
    return (
        f"model 'fails': device cpu was lost to a device-side error ({DEVICE_ASSERT}); "
        "every later batch there would fail: the server must be restarted"
    )


def test_a_failed_batch_on_a_device_already_lost_is_not_rerun_its_requests_get_the_loss():
    """The device was lost (by another instance on it, or planted here) before the batch's reruns: none runs."""
    ex, m = fails_at_forward(0, "lost")
    try:
        ex._lost["cpu"] = DEVICE_ASSERT
        result = run(ex, requests([1.0, np.nan, 3.0, 4.0]))
        assert m.batch_sizes == [4]
        assert result.reruns == 0
        assert str(result.failure) == "model 'fails' failed: ValueError: NaN in batch"
        assert [type(o) for o in result.outputs] == [DeviceLost] * 4
        assert {str(o) for o in result.outputs} == {lost_message()}
    finally:
        ex.shutdown()


def test_a_device_lost_by_a_part_of_a_failed_batch_fails_the_parts_not_rerun_yet_with_the_loss():
    """The 4th forward, the part [2:4], meets a device-side error: the part answered before keeps its
    answers, that part gets its error, and the four requests not rerun yet get the loss (UNAVAILABLE, to be
    retried elsewhere) without running: rerun on a lost device, each failed again, for nothing of its own."""
    ex, m = fails_at_forward(4, "lost")
    try:
        inst = ex.instances[0]
        values = [1.0, 2.0, np.nan, 4.0, 5.0, 6.0, 7.0, 8.0]
        result = run(ex, requests(values))
        assert m.batch_sizes == [8, 4, 2, 2]
        assert result.reruns == 3
        for out, v in zip(result.outputs[:2], values):
            np.testing.assert_array_equal(out["OUTPUT0"], np.full((1, 4), 2 * v, np.float32))
        met = result.outputs[2:4]
        assert met[0] is met[1] and isinstance(met[0], ModelExecutionError)
        assert str(met[0]) == f"{DEVICE_FAILED} {LOST_IN_PART}"
        assert isinstance(met[0].__cause__, RuntimeError)
        assert [type(o) for o in result.outputs[4:]] == [DeviceLost] * 4
        assert all(str(o) == lost_message() and o.code == grpc.StatusCode.UNAVAILABLE for o in result.outputs[4:])
        assert inst.all_failed_runs == 0  # one part was answered
    finally:
        ex.shutdown()


@pytest.mark.parametrize(
    "what, error",
    [
        ("lost", DEVICE_FAILED),
        ("planted", "model 'fails' failed: ValueError: NaN in batch"),
    ],
)
def test_a_request_rerun_alone_as_the_device_is_lost_is_not_blamed_alone(what, error):
    """The 4th forward, the request [1] rerun alone, runs as the device is lost: by a device-side error it
    meets (on CUDA maybe another instance's kernel, reported at this run's sync), or by another instance's
    at the same moment, its own error then met on a lost device. Its error is marked LOST_ALONE: the loss,
    not its value, may have failed it. It was marked "(on this request alone)", as a request found bad."""
    ex, m = fails_at_forward(4, what)
    try:
        values = [1.0, np.nan, 3.0, 4.0]
        result = run(ex, requests(values))
        assert m.batch_sizes == [4, 2, 1, 1]
        assert result.reruns == 3
        np.testing.assert_array_equal(result.outputs[0]["OUTPUT0"], np.full((1, 4), 2.0, np.float32))
        met = result.outputs[1]
        assert isinstance(met, ModelExecutionError)
        assert str(met) == f"{error} {LOST_ALONE}"
        assert [type(o) for o in result.outputs[2:]] == [DeviceLost] * 2
    finally:
        ex.shutdown()


def test_an_error_not_the_models_in_a_part_fails_the_requests_not_answered_yet_and_keeps_the_answers():
    """The 4th forward, the part [4:6], answers with an array no memory holds (MemoryError taking it to the
    host): the part [0:4] answered before keeps its answers, and the four others get that error, once each.
    It escaped the reruns before: the whole batch failed with it, the answered part discarded."""
    ex, m = fails_at_forward(4, "unreadable")
    try:
        values = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, np.nan, 8.0]
        result = run(ex, requests(values))
        assert m.batch_sizes == [8, 4, 4, 2]  # not rerun further: the same error may meet every part
        assert result.reruns == 3
        assert str(result.failure) == "model 'fails' failed: ValueError: NaN in batch"
        for out, v in zip(result.outputs[:4], values):
            np.testing.assert_array_equal(out["OUTPUT0"], np.full((1, 4), 2 * v, np.float32))
        rest = result.outputs[4:]
        assert all(o is rest[0] for o in rest)
        assert isinstance(rest[0], ModelExecutionError)
        assert str(rest[0]) == "model 'fails' failed: MemoryError: no memory for the answer"
        assert isinstance(rest[0].__cause__, MemoryError)
        # The instance serves on.
        result = run(ex, requests([3.0, 4.0]))
        assert result.failure is None
        assert_answers(result, [3.0, 4.0])
    finally:
        ex.shutdown()


def own_failure_warnings(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno == logging.WARNING and r.name == "wok"]


def test_an_error_not_the_models_in_a_part_is_logged_at_warning_with_its_traceback_rate_limited(caplog):
    """wok's own failure (the MemoryError of the test above) is logged at WARNING with its traceback, at most
    once per 10 s, then with how many were not logged: it was logged at DEBUG only, and the batcher's WARNING
    line shows the batch's first error, the model's, so an operator never saw it."""
    ex, m = fails_at_forward(4, "unreadable")
    try:
        now = [100.0]
        ex.instances[0].own_failures.throttle.clock = lambda: now[0]
        values = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, np.nan, 8.0]
        line = (
            "model 'fails', instance 0: rerunning a failed batch in parts, wok's own work on a part failed (not the "
            "model): MemoryError: no memory for the answer; the 4 request(s) not answered get it"
        )
        with caplog.at_level(logging.WARNING, logger="wok"):
            run(ex, requests(values))
            logged = own_failure_warnings(caplog)
            assert [r.getMessage() for r in logged] == [line]
            assert isinstance(logged[0].exc_info[1], MemoryError)
            assert logged[0].exc_info[2] is not None  # its traceback
            for _ in (1, 2):
                m.batch_sizes.clear()  # its 4th forward fails so again
                run(ex, requests(values))
                assert len(own_failure_warnings(caplog)) == 1  # within 10 s of the one logged: counted
            now[0] += 10.0
            m.batch_sizes.clear()
            run(ex, requests(values))
            logged = own_failure_warnings(caplog)
            assert [r.getMessage() for r in logged] == [line, f"{line} (2 more since the last logged)"]
    finally:
        ex.shutdown()


async def test_served_the_requests_not_rerun_after_the_loss_get_unavailable_and_the_model_refuses_more():
    """The same loss, served: the answered requests are answered, the part that met the loss fails INTERNAL,
    the requests not rerun UNAVAILABLE (to be retried elsewhere), and the model refuses the next request."""
    module = FailsAtForward(0, "lost")  # the warm-up's forwards are not counted: `at` is set after it
    cfg = gated_servable(max_batch_size=8, name="fails")[0].config  # a batch goes when 8 requests wait
    server = WokServer(server_settings(grpc_port=0, metrics_port=None), ModelRepository([Servable(cfg, module)], "t"))
    await server.start()
    try:
        module.lost = server.runtimes["fails"].executor._lost
        module.batch_sizes.clear()
        module.at = 4
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            stub = pb_grpc.GRPCInferenceServiceStub(ch)
            values = [1.0, 2.0, np.nan, 4.0, 5.0, 6.0, 7.0, 8.0]
            batcher = server.runtimes["fails"].batcher
            calls = []
            for k, r in enumerate(requests(values)):  # queued in this order: the batch's
                calls.append(asyncio.ensure_future(stub.ModelInfer(encode_request("fails", r), timeout=30)))
                await until(lambda k=k: batcher.queued == k + 1 or len(module.batch_sizes) > 0)
            outcomes = await asyncio.gather(*calls, return_exceptions=True)
            assert module.batch_sizes == [8, 4, 2, 2]
            for reply, v in zip(outcomes[:2], values):
                np.testing.assert_array_equal(decode_response(reply)["OUTPUT0"], np.full((1, 4), 2 * v))
            error = f"{DEVICE_FAILED} {LOST_IN_PART}"
            assert [(e.code(), e.details()) for e in outcomes[2:4]] == [(grpc.StatusCode.INTERNAL, error)] * 2
            lost = lost_message()
            assert [(e.code(), e.details()) for e in outcomes[4:]] == [(grpc.StatusCode.UNAVAILABLE, lost)] * 4
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.ModelInfer(encode_request("fails", requests([1.0])[0]), timeout=30)
            assert (info.value.code(), info.value.details()) == (grpc.StatusCode.UNAVAILABLE, lost)
            assert module.batch_sizes == [8, 4, 2, 2]
    finally:
        await server.stop(grace=5)
