"""A device lost to a device-side error (a kernel's assert, an illegal address): its CUDA context is
unusable, every later batch there would fail, and only a new process recovers it. The batch that met
the error fails INTERNAL; from then on the model refuses requests UNAVAILABLE (to be retried
elsewhere), is not ready, and the server's health turns NOT_SERVING so that the probes of
deploy/k8s take it out of its Service and restart it; `wok serve` exits 1 without the frees that
would abort it (errors.DeviceLost, executor's Instance._mark_lost, batcher's _check_device).

The CUDA tests need a GPU (bench/gpu_session.sh runs them on a lent one); each runs the lost device
in a process of its own, as the error poisons the process. The first test plants the mark the CUDA
path sets on a CPU model, for what follows it in the batcher, the service and the health servicer;
another plants it as the start-up warm-up begins, for `wok serve`'s exit.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path

import grpc
import numpy as np
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from wok import executor
from wok.app import SERVICE_NAME, WokServer
from wok.codec import decode_response, encode_request
from wok.config import InstanceConfig, server_settings
from wok.errors import DeviceLost, ModelExecutionError, WarmupError, error_line
from wok.repository import ModelRepository
from wok.servable import Servable
from wok.v2pb import grpc_service_pb2 as pb
from wok.v2pb import grpc_service_pb2_grpc as pb_grpc

from ..conftest import write_python_model
from .conftest import four_wide_config, gated_servable, until

NO_CUDA = "no CUDA device here; bench/gpu_session.sh runs this on a lent GPU"
ASSERT = "AcceleratorError: CUDA error: device-side assert triggered"
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def lost_message(model: str, device: str, why: str = ASSERT) -> str:
    return (
        f"model '{model}': device {device} was lost to a device-side error ({why}); "
        "every later batch there would fail: the server must be restarted"
    )


def lost_gauges(server: WokServer) -> dict[tuple[str, str], float]:
    """wok_device_lost by (model, device), as /metrics gives it."""
    return {
        (s.labels["model"], s.labels["device"]): s.value
        for family in text_string_to_metric_families(generate_latest(server.registry).decode())
        if family.name == "wok_device_lost"
        for s in family.samples
    }


async def fail_a_batch_on_a_lost_device(server: WokServer, stub, module) -> asyncio.Future:
    """Mark model a's device lost, as the CUDA path marks it when a batch meets a device-side error
    (Instance._mark_lost), and send it a batch that fails (a NaN), held in the model at its gate:
    its call, once it is there."""
    server.runtimes["a"].executor._lost["cpu"] = ASSERT
    module.gate.clear()
    nan = {"INPUT0": np.full((1, 4), np.nan, np.float32)}
    failing = asyncio.ensure_future(stub.ModelInfer(encode_request("a", nan), timeout=30))
    entered = await asyncio.get_running_loop().run_in_executor(None, module.entered.wait, 10)
    assert entered, "the batch never reached its model"
    return failing


async def health_turns(channel, service: str, status: int) -> None:
    """Until the health servicer's Watch of `service` says `status`."""
    call = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=service), timeout=30)
    async for reply in call:
        if reply.status == status:
            call.cancel()
            return


async def test_a_device_marked_lost_turns_its_model_unavailable_and_the_server_not_serving():
    a, module = gated_servable(max_batch_size=1, delay_ms=5.0, depth=None, name="a", enter_when_closed=True)
    b, _ = gated_servable(name="b", delay_ms=1.0)
    server = WokServer(server_settings(grpc_port=0, metrics_port=None), ModelRepository([a, b], "test"))
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            stub = pb_grpc.GRPCInferenceServiceStub(ch)
            batcher = server.runtimes["a"].batcher
            assert lost_gauges(server) == {("a", "cpu"): 0.0, ("b", "cpu"): 0.0}
            failing = await fail_a_batch_on_a_lost_device(server, stub, module)
            one = {"INPUT0": np.ones((1, 4), np.float32)}
            behind = asyncio.ensure_future(stub.ModelInfer(encode_request("a", one), timeout=30))  # at the worker
            await until(lambda: batcher.inflight == 2)
            queued = asyncio.ensure_future(stub.ModelInfer(encode_request("a", one), timeout=30))
            await until(lambda: batcher.queued == 1)
            module.gate.set()

            with pytest.raises(grpc.aio.AioRpcError) as info:
                await failing
            assert info.value.code() == grpc.StatusCode.INTERNAL
            assert info.value.details() == "model 'a' failed: ValueError: NaN in batch"
            # The batch sent before the failure runs (on the CPU here; on CUDA its launch refuses it).
            np.testing.assert_array_equal(decode_response(await behind)["OUTPUT0"], np.full((1, 4), 2.0))
            for call in (queued, stub.ModelInfer(encode_request("a", one), timeout=30)):
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await call
                assert info.value.code() == grpc.StatusCode.UNAVAILABLE
                assert info.value.details() == lost_message("a", "cpu")
            # The queued one was accepted and failed with the device; the one sent after was refused.
            assert server.metrics.models["a"].rejections["model_failed"] == 1

            await health_turns(ch, "", NOT_SERVING)
            assert lost_gauges(server) == {("a", "cpu"): 1.0, ("b", "cpu"): 0.0}
            for service, status in (("", NOT_SERVING), (SERVICE_NAME, NOT_SERVING), ("a", NOT_SERVING), ("b", SERVING)):
                reply = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=service))
                assert reply.status == status, service
            assert not (await stub.ServerReady(pb.ServerReadyRequest(), timeout=10)).ready
            assert not (await stub.ModelReady(pb.ModelReadyRequest(name="a"), timeout=10)).ready
            index = await stub.RepositoryIndex(pb.RepositoryIndexRequest(), timeout=10)
            assert [(m.name, m.state, m.reason) for m in index.models] == [
                ("a", "UNAVAILABLE", lost_message("a", "cpu")),
                ("b", "UNAVAILABLE", "server is not ready"),
            ]
            # The other model, on a device of its own, still answers until the restart.
            np.testing.assert_array_equal(
                decode_response(await stub.ModelInfer(encode_request("b", one), timeout=30))["OUTPUT0"],
                np.full((1, 4), 2.0),
            )
            assert batcher.queued == 0 and batcher.inflight == 0
    finally:
        module.gate.set()
        await server.stop(grace=5)


async def test_a_device_lost_in_the_drain_is_the_servers_too(caplog):
    """A batch of the drain meets the device-side error: the server records the loss and logs it
    once, as outside the drain, so that `wok serve` exits 1 without the frees that would abort it
    (recorded only outside the drain before: it exited 0 through them)."""
    a, module = gated_servable(max_batch_size=1, delay_ms=5.0, depth=1, name="a", enter_when_closed=True)
    server = WokServer(server_settings(grpc_port=0, metrics_port=None), ModelRepository([a], "test"))
    await server.start()
    stopping = None
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            stub = pb_grpc.GRPCInferenceServiceStub(ch)
            batcher = server.runtimes["a"].batcher
            failing = await fail_a_batch_on_a_lost_device(server, stub, module)
            one = {"INPUT0": np.ones((1, 4), np.float32)}
            queued = asyncio.ensure_future(stub.ModelInfer(encode_request("a", one), timeout=30))
            await until(lambda: batcher.queued == 1)
            stopping = asyncio.ensure_future(server.stop(grace=10))
            await until(lambda: server.draining)
            module.gate.set()

            with pytest.raises(grpc.aio.AioRpcError) as info:
                await failing
            assert info.value.code() == grpc.StatusCode.INTERNAL
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await queued
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
            assert info.value.details() == lost_message("a", "cpu")
            await stopping
    finally:
        module.gate.set()
        if stopping is None:
            await server.stop(grace=5)
    assert str(server.device_lost) == lost_message("a", "cpu")
    lines = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert lines == [f"{lost_message('a', 'cpu')}; health NOT_SERVING"]


# Row i of a 10-row table for each request's first value: 10 or more indexes past the table, which
# on CUDA is a device-side assert, on the CPU an IndexError.
LOOKUP_MODEL = """
import torch
from torch import nn


class Lookup(nn.Module):
    def __init__(self):
        super().__init__()
        self.table = nn.Parameter(torch.arange(40, dtype=torch.float32).reshape(10, 4), requires_grad=False)

    def forward(self, x):
        return nn.functional.embedding(x[:, 0].long(), self.table)


def build():
    return Lookup()
"""

# An executor on cuda:0 for the model whose source is argv[1]; `outcome` notes a batch's answers (or its
# error) and how many times its worker ran, in `out`, which the script prints as JSON at its end.
EXECUTOR_HEAD = """
import json, os, sys, types
import numpy as np
from wok.config import InstanceConfig, model_config_from_dict
from wok.executor import Executor
from wok.servable import Servable

code = types.ModuleType("lookup")
exec(sys.argv[1], code.__dict__)
cfg = model_config_from_dict({"name": "lookup", "platform": "python", "factory": "x:y", "max_batch_size": 4,
    "inputs": [{"name": "INPUT0", "datatype": "FP32", "dims": [4]}],
    "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "dims": [4]}]}, "test")
ex = Executor(Servable(cfg, code.build()), InstanceConfig(count=1, devices=("cuda:0",), pipeline_depth=2))
inst = ex.instances[0]
req = lambda i: {"INPUT0": np.full((1, 4), i, np.float32)}
out = {}

def outcome(name, fut):
    try:
        outputs = fut.result(60).outputs
        out[name] = ["ok", [repr(o) if isinstance(o, Exception) else o["OUTPUT0"].tolist() for o in outputs]]
    except Exception as exc:
        out[name] = [type(exc).__name__, str(exc)]
    out[name + "_ran"] = len(fut.ran)
"""

EXECUTOR_SCRIPT = (
    EXECUTOR_HEAD
    + """
outcome("good", inst.submit([req(1), req(2)], [1, 1], 0))
bad, behind = inst.submit([req(1), req(50)], [1, 1], 0), inst.submit([req(3)], [1], 1)
outcome("bad", bad)
outcome("behind", behind)
outcome("later", inst.submit([req(3)], [1], 0))
out["lost"] = str(ex.lost)
print(json.dumps(out), flush=True)
os._exit(0)  # the frees at exit would abort on the lost device
"""
)


def run_executor_script(script: str, model: str) -> dict:
    """What `script` (EXECUTOR_HEAD's executor, on `model`'s source) printed: a process of its own, as
    the device-side error poisons the process."""
    proc = subprocess.run(
        [sys.executable, "-c", script, textwrap.dedent(model)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)
def test_cuda_a_device_side_error_fails_its_batch_and_every_later_one_is_refused_without_running():
    out = run_executor_script(EXECUTOR_SCRIPT, LOOKUP_MODEL)
    assert out["good"] == ["ok", [[[4.0, 5.0, 6.0, 7.0]], [[8.0, 9.0, 10.0, 11.0]]]]
    assert out["bad"] == ["ModelExecutionError", f"model 'lookup' failed on the device: {ASSERT}"]
    assert out["bad_ran"] == 1
    # In flight behind it on the other slot: it ran on the poisoned context, or was refused.
    assert out["behind"][0] in ("ModelExecutionError", "DeviceLost"), out["behind"]
    assert out["later"] == ["DeviceLost", lost_message("lookup", "cuda:0")]
    assert out["later_ran"] == 0  # refused before it ran: no time on the instance
    assert out["lost"] == lost_message("lookup", "cuda:0")


class ScriptedLookup(torch.nn.Module):
    """LOOKUP_MODEL's lookup as a TorchScript model that reads its answer inside the script (a NaN check): the
    device-side assert of an index past the table is raised there, by an op of the script, so that it reaches the
    executor as the interpreter's RuntimeError."""

    def __init__(self):
        super().__init__()
        self.table = torch.nn.Parameter(torch.arange(40, dtype=torch.float32).reshape(10, 4), requires_grad=False)

    def forward(self, x):
        y = torch.nn.functional.embedding(x[:, 0].long(), self.table)
        if bool(torch.isnan(y).any()):
            y = torch.nan_to_num(y)
        return y


@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)
def test_cuda_a_device_side_error_in_a_torchscript_model_loses_the_device(tmp_path):
    """It was read as the script's traceback, never a CUDA error: the batch was rerun in parts on the dead context,
    the device never marked lost, and every later batch failed on it as the model's failure."""
    path = tmp_path / "lookup.pt"
    torch.jit.script(ScriptedLookup()).save(str(path))
    out = run_executor_script(
        EXECUTOR_SCRIPT, f"import torch\n\ndef build():\n    return torch.jit.load({str(path)!r})\n"
    )
    why = "RuntimeError: CUDA error: device-side assert triggered"
    assert out["good"] == ["ok", [[[4.0, 5.0, 6.0, 7.0]], [[8.0, 9.0, 10.0, 11.0]]]]
    assert out["bad"] == ["ModelExecutionError", f"model 'lookup' failed on the device: {why}"]
    assert out["bad_ran"] == 1
    assert out["behind"][0] in ("ModelExecutionError", "DeviceLost"), out["behind"]
    assert out["later"] == ["DeviceLost", lost_message("lookup", "cuda:0", why)]
    assert out["later_ran"] == 0
    assert out["lost"] == lost_message("lookup", "cuda:0", why)


@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)
def test_cuda_wok_serve_after_a_device_side_error_refuses_turns_not_serving_and_exits_1(tmp_path, start_server):
    write_python_model(tmp_path / "lookup", LOOKUP_MODEL, devices=("cuda:0",))
    sp = start_server("--model-repository", str(tmp_path))
    with grpc.insecure_channel(sp.target) as ch:
        stub = pb_grpc.GRPCInferenceServiceStub(ch)

        def infer(value: float):
            return stub.ModelInfer(encode_request("lookup", {"INPUT0": np.full((1, 4), value, np.float32)}), timeout=30)

        np.testing.assert_array_equal(decode_response(infer(1.0))["OUTPUT0"], [[4.0, 5.0, 6.0, 7.0]])
        with pytest.raises(grpc.RpcError) as info:
            infer(50.0)
        assert info.value.code() == grpc.StatusCode.INTERNAL
        assert info.value.details() == f"model 'lookup' failed on the device: {ASSERT}"
        with pytest.raises(grpc.RpcError) as info:
            infer(1.0)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert info.value.details() == lost_message("lookup", "cuda:0")
        health = health_pb2_grpc.HealthStub(ch)
        for reply in health.Watch(health_pb2.HealthCheckRequest(service=""), timeout=30):
            if reply.status == NOT_SERVING:
                break
        assert not stub.ServerReady(pb.ServerReadyRequest(), timeout=10).ready
    with urllib.request.urlopen(sp.http_url() + "/metrics", timeout=10) as reply:
        gauges = [
            (s.labels, s.value)
            for family in text_string_to_metric_families(reply.read().decode())
            if family.name == "wok_device_lost"
            for s in family.samples
        ]
    assert gauges == [({"model": "lookup", "device": "cuda:0"}, 1.0)]
    assert sp.terminate(timeout=60) == 1, "\n".join(sp.log[-40:])
    log = "\n".join(sp.log)
    assert f"ERROR wok: {lost_message('lookup', 'cuda:0')}; health NOT_SERVING" in log, log[-3000:]
    assert f"wok: exiting without freeing the lost device's memory ({lost_message('lookup', 'cuda:0')})" in log
    assert "terminate called" not in log


# LOOKUP_MODEL refusing a batch of more than one row as it is launched (a check on the host, no device
# work): the CUDA path reruns such a batch in parts (Instance._cuda_batch), one request at a time.
ONE_ROW_LOOKUP_MODEL = LOOKUP_MODEL.replace(
    "    def forward(self, x):\n",
    "    def forward(self, x):\n        if x.shape[0] > 1:\n            raise ValueError('one row at a time')\n",
)

RERUN_SCRIPT = (
    EXECUTOR_HEAD
    + """
outcome("rerun", inst.submit([req(1), req(50), req(2), req(3)], [1, 1, 1, 1], 0))
out["lost"] = str(ex.lost)
print(json.dumps(out), flush=True)
os._exit(0)
"""
)


@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)
def test_cuda_a_part_of_a_failed_batch_that_loses_the_device_fails_on_the_device_and_the_reruns_stop():
    # CPU twins with the loss planted: test_executor_isolate_stop.py. On CUDA the part is run and waited for
    # by _cuda_batch, which said "failed: AcceleratorError" where every other path said "failed on the device";
    # the parts after it must get the loss without running (each failed again on the dead context before).
    assert "raise ValueError" in ONE_ROW_LOOKUP_MODEL
    out = run_executor_script(RERUN_SCRIPT, ONE_ROW_LOOKUP_MODEL)
    status, answers = out["rerun"]
    assert status == "ok", out
    assert answers[0] == [[4.0, 5.0, 6.0, 7.0]]  # answered before the loss: kept
    failed = f"model 'lookup' failed on the device: {ASSERT} {executor.LOST_ALONE}"
    assert answers[1] == repr(ModelExecutionError(failed))
    assert answers[2:] == [repr(DeviceLost(lost_message("lookup", "cuda:0")))] * 2  # never run
    assert out["lost"] == lost_message("lookup", "cuda:0")


# The id is the input's first value less one: the warm-up's zeros ask for row -1, past the table.
WARMUP_LOOKUP_MODEL = LOOKUP_MODEL.replace("x[:, 0].long()", "x[:, 0].long() - 1")

# `wok serve`, with the mark the CUDA path sets when a batch meets a device-side error planted on
# the CPU model's device as its warm-up starts (then its warm-up batch, which the model refuses,
# fails on a "lost" device).
PLANTED_WARMUP = """
import sys
from wok import __main__ as cli, executor

warmup = executor.Executor.warmup

def planted(self):
    self._lost["cpu"] = "AcceleratorError: CUDA error: device-side assert triggered"
    warmup(self)

executor.Executor.warmup = planted
sys.exit(cli.main(sys.argv[1:]))
"""

REFUSES_ZEROS = """
import torch


class RefusesZeros(torch.nn.Module):
    def forward(self, x):
        if not x.any():
            raise ValueError("all zeros")
        return x


def build():
    return RefusesZeros()
"""


def serve_until_exit(command: list[str], repository) -> subprocess.CompletedProcess:
    """`command serve` on the models in `repository`, which must end at its start."""
    return subprocess.run(
        [*command, "serve", "--model-repository", str(repository), "--port", "0", "--metrics-port", "-1"],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_warm_up_failed_on_a_lost_device_exits_2_without_the_frees_at_exit(tmp_path):
    # A warm-up batch that met a device-side error left the device lost as a served batch does; wok serve
    # exited 2 through Python's teardown, whose frees on a lost device abort the process (seen at the stop).
    d = write_python_model(tmp_path / "m", REFUSES_ZEROS)
    proc = serve_until_exit([sys.executable, "-c", PLANTED_WARMUP], tmp_path)
    assert proc.returncode == 2, proc.stderr[-3000:]
    lost = lost_message("m", "cpu")
    assert proc.stderr.splitlines()[-2:] == [
        "wok: model 'm' failed: ValueError: all zeros; in the start-up warm-up, on a batch of zeros with input "
        f"shapes 'INPUT0' [1, 4] on cpu (config: {d / 'config.toml'})",
        f"wok: exiting without freeing the lost device's memory ({lost})",
    ]


@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)
def test_cuda_a_device_side_error_in_the_warm_up_exits_2_naming_the_model_and_does_not_abort(tmp_path):
    d = write_python_model(tmp_path / "lookup", WARMUP_LOOKUP_MODEL, devices=("cuda:0",))
    proc = serve_until_exit([sys.executable, "-m", "wok"], tmp_path)
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = proc.stderr.splitlines()
    assert lines[-2].startswith(f"wok: model 'lookup' failed on the device: {ASSERT}"), proc.stderr[-3000:]
    assert lines[-2].endswith(
        f"in the start-up warm-up, on a batch of zeros with input shapes 'INPUT0' [1, 4] on "
        f"cuda:0 (config: {d / 'config.toml'})"
    ), lines[-2]
    assert lines[-1] == f"wok: exiting without freeing the lost device's memory ({lost_message('lookup', 'cuda:0')})"
    assert "terminate called" not in proc.stderr


# bench/gpu_check.py's server check (`serving`, `_exit_if_left_running`, as its main runs them) on argv[2]'s one model,
# on device argv[3], sent a request for a row past its table: on CUDA a device-side assert, on the CPU an IndexError,
# with the mark the CUDA path then sets (argv[4] its cause) planted.
GPU_CHECK_LOST = """
import asyncio, importlib.util, sys
import numpy as np
from wok.repository import ModelRepository

spec = importlib.util.spec_from_file_location("gpu_check", sys.argv[1])
gpu_check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_check)
(servable,) = ModelRepository.from_directory(sys.argv[2]).models.values()


async def check():
    async with gpu_check.serving(servable, grace=5.0) as server:
        if sys.argv[3] == "cpu":
            server.runtime("lookup").executor._lost["cpu"] = sys.argv[4]
        request = server.runtime("lookup").batcher.submit({"INPUT0": np.full((1, 4), 50, np.float32)}, 1, None, None)
        await request.future


asyncio.run(gpu_check._exit_if_left_running(check()))
print("gpu_check: reported", file=sys.stderr)
"""


@pytest.mark.parametrize(
    "device", ["cpu", pytest.param("cuda:0", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA))]
)
def test_gpu_check_whose_server_lost_its_device_says_so_and_exits_1_without_the_frees_at_exit(tmp_path, device):
    """bench/gpu_check.py's server check never read the server's `device_lost` (`wok serve` does): the check failed
    on the model's error and the process went on to Python's exit, whose frees on a lost device abort it. Now said,
    after the check's own error, and left through os._exit(1)."""
    write_python_model(tmp_path / "lookup", LOOKUP_MODEL, devices=(device,))
    script = Path(__file__).resolve().parents[2] / "bench" / "gpu_check.py"
    proc = subprocess.run(
        [sys.executable, "-c", GPU_CHECK_LOST, str(script), str(tmp_path), device, ASSERT],
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = proc.stderr.splitlines()
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert lines[-1] == (
        f"gpu_check: {lost_message('lookup', device)}; exiting without a report, without freeing the lost device's "
        "memory"
    ), proc.stderr[-3000:]
    failed = "ModelExecutionError: model 'lookup' failed: IndexError: index out of range in self"
    if device != "cpu":
        failed = f"ModelExecutionError: model 'lookup' failed on the device: {ASSERT}"
    assert any(line.endswith(failed) for line in lines[:-1]), proc.stderr[-3000:]  # the check's own, said first
    assert "terminate called" not in proc.stderr


# Device-side errors as torch raises them (executor._DEVICE_ERRORS, _is_device_error): made on the CPU here.
SYNTHETIC_DEVICE_ERRORS = [RuntimeError("CUDA error: device-side assert triggered")] + (
    [torch.AcceleratorError("CUDA error: an illegal memory access was encountered")]
    if isinstance(getattr(torch, "AcceleratorError", None), type)
    else []
)


@pytest.mark.parametrize("error", SYNTHETIC_DEVICE_ERRORS, ids=lambda e: type(e).__name__)
def test_a_device_side_error_is_named_so_by_the_message_every_path_gives(error):
    # A part of a failed batch rerun on CUDA (_cuda_batch) said "failed: AcceleratorError: ...", a batch's
    # launch and wait "failed on the device: ...": one helper builds them all now. Those paths need a GPU
    # (bench/gpu_session.sh), so the helper is checked here, on an error classified as theirs are.
    assert executor._is_device_error(error)
    assert str(executor._model_failed("m", error)) == f"model 'm' failed on the device: {error_line(error)}"


def coded_runtime_error() -> RuntimeError:
    """Another library's RuntimeError carrying an error_code of its own (the code of CUDA's illegal address)."""
    error = RuntimeError("the library's own failure")
    error.error_code = 700
    return error


@pytest.mark.parametrize(
    "error",
    [
        ValueError("NaN in batch"),
        RuntimeError("index out of range in self"),
        RuntimeError("not a CUDA error: x"),
        coded_runtime_error(),
    ],
    ids=["ValueError", "RuntimeError", "RuntimeError-naming-CUDA", "RuntimeError-with-error_code"],
)
def test_an_error_not_the_devices_is_named_the_models(error):
    assert str(executor._model_failed("m", error)) == f"model 'm' failed: {error_line(error)}"


# What torch raises when memory runs out, as it words it: C10_CUDA_CHECK's message for a failed cudaHostAlloc (a pinned
# buffer growing) or a cudaMalloc outside the caching allocator (an AcceleratorError whose error_code is
# cudaErrorMemoryAllocation; a RuntimeError before torch had AcceleratorError), and the caching allocator's own.
CHECK_SUFFIX = (
    "\nCUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be "
    "incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1\nCompile with `TORCH_USE_CUDA_DSA` to enable "
    "device-side assertions.\n"
)


def out_of_memory_errors() -> list[BaseException]:
    errors: list[BaseException] = [
        RuntimeError(f"CUDA error: out of memory{CHECK_SUFFIX}"),
        torch.OutOfMemoryError(
            "CUDA out of memory. Tried to allocate 1024.00 MiB. GPU 0 has a total capacity of 79.19 GiB of which "
            "512.00 MiB is free. Of the allocated memory 77.90 GiB is allocated by PyTorch"
        ),
    ]
    accelerator = getattr(torch, "AcceleratorError", None)
    if isinstance(accelerator, type):
        errors.append(accelerator(f"CUDA error: out of memory{CHECK_SUFFIX}"))
        coded = accelerator("")  # a torch built with STRIP_ERROR_MESSAGES: its error_code alone tells
        coded.error_code = 2
        errors.append(coded)
    return errors


@pytest.mark.parametrize(
    "error", out_of_memory_errors(), ids=["RuntimeError", "OutOfMemoryError", "AcceleratorError", "error_code"]
)
def test_memory_running_out_fails_the_batch_not_the_device(error):
    """A failed pinned allocation was taken for a device-side error: the device was marked lost, its model refused
    every request until a restart, though cudaErrorMemoryAllocation leaves the CUDA context usable."""
    assert not executor._is_device_error(error)
    assert str(executor._model_failed("m", error)) == f"model 'm' failed: {error_line(error)}"


class RaisesDeviceError(torch.nn.Module):
    def forward(self, x):
        raise RuntimeError("CUDA error: device-side assert triggered")


def test_a_batch_and_a_warm_up_meeting_a_device_side_error_name_it_so():
    """The CPU paths (its forward, the warm-up's message) use the same helper: the warm-up said "model 'm'
    failed: RuntimeError: CUDA error: ...; in the start-up warm-up" where a batch's launch said "on the device"."""
    ex = executor.Executor(Servable(four_wide_config("m"), RaisesDeviceError()), InstanceConfig(count=1))
    try:
        error = "model 'm' failed on the device: RuntimeError: CUDA error: device-side assert triggered"
        one = {"INPUT0": np.ones((1, 4), np.float32)}
        with pytest.raises(ModelExecutionError) as info:
            ex.instances[0].submit([one], [1], 0).result(30)
        assert str(info.value) == error
        with pytest.raises(WarmupError) as warm:
            ex.warmup()
        assert str(warm.value).startswith(f"{error}; in the start-up warm-up, on a batch of zeros"), warm.value
    finally:
        ex.shutdown()


# CUDA errors as torch 2.13's C10_CUDA_CHECK raises them (c10_cuda_check_implementation): an AcceleratorError whose
# error_code is the cudaError_t, its text "CUDA error: " + cudaGetErrorString, get_cuda_error_help's line (naming the
# code's cudaGetErrorName), get_cuda_async_error_suffix's (asynchronous for 700, 710, 715, 716, 719) and the line of
# device-side assertions; torch before AcceleratorError raised a RuntimeError of the text alone (CHECK_SUFFIX).
# code, cudaGetErrorName, cudaGetErrorString. 999: not known to leave the context usable, so lost. 0: a kernel's
# failure in the device-side assertion registry (TORCH_USE_CUDA_DSA), whose check is given cudaSuccess.
CUDA_ERRORS = {
    int(code): (name, text)
    for code, name, text in (
        line.split(" ", 2)
        for line in """
700 cudaErrorIllegalAddress an illegal memory access was encountered
702 cudaErrorLaunchTimeout the launch timed out and was terminated
710 cudaErrorAssert device-side assert triggered
714 cudaErrorHardwareStackError hardware stack error
715 cudaErrorIllegalInstruction an illegal instruction was encountered
716 cudaErrorMisalignedAddress misaligned address
719 cudaErrorLaunchFailure unspecified launch failure
214 cudaErrorECCUncorrectable uncorrectable ECC error encountered
999 cudaErrorUnknown unknown error
0 cudaSuccess no error
1 cudaErrorInvalidValue invalid argument
9 cudaErrorInvalidConfiguration invalid configuration argument
98 cudaErrorInvalidDeviceFunction invalid device function
101 cudaErrorInvalidDevice invalid device ordinal
209 cudaErrorNoKernelImageForDevice no kernel image is available for execution on the device
701 cudaErrorLaunchOutOfResources too many resources requested for launch
720 cudaErrorCooperativeLaunchTooLarge too many blocks in cooperative launch
912 cudaErrorInvalidClusterSize a kernel launch error has occurred due to cluster misconfiguration
""".strip().splitlines()
    )
}
STICKY_CUDA_ERRORS = [700, 702, 710, 714, 715, 716, 719, 214, 999, 0]
USABLE_CUDA_ERRORS = [1, 9, 98, 101, 209, 701, 720, 912]
ASYNC_CUDA_ERRORS = {700, 710, 715, 716, 719}  # torch's get_cuda_async_error_suffix
ASYNC_SUFFIX = (
    "\nCUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be "
    "incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1"
)


ACCELERATOR_ERROR = getattr(torch, "AcceleratorError", None)  # torch 2.8 on; pyproject allows torch before it


def torch_cuda_error(code: int) -> BaseException:
    """The error torch raises for `code`: from 2.13 an AcceleratorError as its Python binding makes it (error_code
    set); before AcceleratorError, a RuntimeError of the text alone."""
    name, text = CUDA_ERRORS[code]
    if not isinstance(ACCELERATOR_ERROR, type):
        return RuntimeError(f"CUDA error: {text}{CHECK_SUFFIX}")
    help_line = (
        "\nGPU device may be out of range, do you have enough GPUs?"
        if code == 101
        else f"\nSearch for `{name}' in https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html for "
        "more information."
    )
    suffix = (
        ASYNC_SUFFIX
        if code in ASYNC_CUDA_ERRORS
        else "\nFor more detailed error information, run with CUDA_LOG_FILE=stderr"
    )
    exc = ACCELERATOR_ERROR(
        f"CUDA error: {text}{help_line}{suffix}\nCompile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n"
    )
    exc.error_code = code
    return exc


def cuda_error_forms(codes) -> list:
    """Each code's error as torch 2.13 raises it, with its text stripped (STRIP_ERROR_MESSAGES: the code alone tells),
    and as torch before AcceleratorError raised it (the text alone)."""
    forms = []
    for code in codes:
        name, text = CUDA_ERRORS[code]
        forms.append(pytest.param(RuntimeError(f"CUDA error: {text}{CHECK_SUFFIX}"), id=f"{name}-RuntimeError"))
        if isinstance(ACCELERATOR_ERROR, type):
            stripped = ACCELERATOR_ERROR("")
            stripped.error_code = code
            forms += [
                pytest.param(torch_cuda_error(code), id=f"{name}-AcceleratorError"),
                pytest.param(stripped, id=f"{name}-error_code"),
            ]
    return forms


@pytest.mark.parametrize(
    "error",
    [
        *cuda_error_forms(STICKY_CUDA_ERRORS),
        pytest.param(RuntimeError("CUDA error: an error a later CUDA adds"), id="unknown-text"),
    ],
)
def test_a_cuda_error_that_leaves_the_context_unusable_or_is_unknown_loses_the_device(error):
    assert executor._is_device_error(error)
    assert str(executor._model_failed("m", error)) == f"model 'm' failed on the device: {error_line(error)}"


@pytest.mark.parametrize("error", cuda_error_forms(USABLE_CUDA_ERRORS))
def test_a_cuda_error_refused_as_its_call_was_made_fails_the_batch_not_the_device(error):
    """Every "CUDA error: ..." was taken for the device lost: a launch configuration one request's sizes made invalid
    (a grid too large for a huge batch) stopped the server on that device until a restart, where the call refused
    left the context usable and only that request could not be run."""
    assert not executor._is_device_error(error)
    assert str(executor._model_failed("m", error)) == f"model 'm' failed: {error_line(error)}"


@torch.jit.ignore
def _raise_cuda_error(x, code):
    # type: (torch.Tensor, int) -> torch.Tensor
    # (A comment: this module's annotations are strings, which TorchScript cannot resolve for an ignored function.)
    raise torch_cuda_error(code)


class ScriptedFailsOnFifty(torch.nn.Module):
    """FailsOnFifty's TorchScript twin, for `code`'s CUDA error: raised by an op of the script, a Python one (no op
    of torch's raises a CUDA error on the CPU), it reaches the caller as the interpreter's RuntimeError."""

    def __init__(self, code: int):
        super().__init__()
        self.code = code

    def forward(self, x):
        if bool((x[:, 0] == 50).any()):
            return _raise_cuda_error(x, self.code)
        return x + 1


class ScriptedMatmul(torch.nn.Module):
    def forward(self, x):
        return torch.mm(x, x)


def script_wrapped(code: int, form: str) -> RuntimeError:
    """`code`'s CUDA error raised in a TorchScript model, as the interpreter gives it (torch/csrc/jit/runtime/
    interpreter.cpp, handleError): "The following operation failed in the TorchScript interpreter.", the script's
    traceback, then the error named. "python-op": a Python op's, as torch makes it here ("RuntimeError:
    AcceleratorError: CUDA error: ..."). "op": one of torch's own ops' (a c10 error, named "RuntimeError: "),
    which only a GPU raises for CUDA: a real one of an op failing on the CPU, the CUDA error's text in place of
    its own."""
    if form == "python-op":
        model, x = torch.jit.script(ScriptedFailsOnFifty(code)), torch.full((1, 4), 50.0)
    else:
        model, x = torch.jit.script(ScriptedMatmul()), torch.ones(2)
    with pytest.raises(RuntimeError) as info:
        model(x)
    error = info.value
    assert type(error) is RuntimeError and str(error).startswith(
        "The following operation failed in the TorchScript interpreter.\nTraceback of TorchScript"
    ), str(error)
    if form == "python-op":
        return error
    assert "\nRuntimeError: self must be a matrix\n" in str(error), str(error)
    return RuntimeError(str(error).replace("self must be a matrix", str(torch_cuda_error(code)), 1))


def script_error_line(code: int, form: str) -> str:
    """How `code`'s error raised in a script is told: as the error itself is, named as the script's traceback names
    it (a c10 error "RuntimeError")."""
    named = "RuntimeError" if form == "op" else type(torch_cuda_error(code)).__name__
    return f"{named}: CUDA error: {CUDA_ERRORS[code][1]}"


@pytest.mark.parametrize("form", ["op", "python-op"])
@pytest.mark.parametrize("code", STICKY_CUDA_ERRORS)
def test_a_cuda_error_in_a_torchscript_model_that_leaves_the_context_unusable_loses_the_device(code, form):
    """An op's error in a TorchScript model is the interpreter's RuntimeError, its text the script's traceback
    before the error's: never read as a CUDA error, a device lost under a script was used on, every later batch
    failing on it, and the client was told the message's last line (CUDA's "Compile with `TORCH_USE_CUDA_DSA`",
    or a Python op's traceback's last frame)."""
    error = script_wrapped(code, form)
    assert executor._is_device_error(error)
    assert error_line(error) == script_error_line(code, form)
    assert str(executor._model_failed("m", error)) == f"model 'm' failed on the device: {error_line(error)}"


@pytest.mark.parametrize("form", ["op", "python-op"])
@pytest.mark.parametrize("code", USABLE_CUDA_ERRORS)
def test_a_cuda_error_in_a_torchscript_model_refused_as_its_call_was_made_fails_the_batch_not_the_device(code, form):
    error = script_wrapped(code, form)
    assert not executor._is_device_error(error)
    assert str(executor._model_failed("m", error)) == f"model 'm' failed: {script_error_line(code, form)}"


class RaisesInScript(torch.nn.Module):
    def forward(self, x):
        if bool((x[:, 0] == 50).any()):
            raise RuntimeError(
                "CUDA error: an illegal memory access was encountered\nFor debugging consider passing "
                "CUDA_LAUNCH_BLOCKING=1"
            )
        return x + 1


def test_a_cuda_error_a_script_raises_itself_is_the_models_and_told_by_its_first_line():
    """A script's own `raise` is a torch.jit.Error (no RuntimeError, unlike an op's error): the model's, as a Python
    model's ValueError is; a real CUDA error never arrives so. It was told by its message's last line."""
    with pytest.raises(torch.jit.Error) as info:
        torch.jit.script(RaisesInScript())(torch.full((1, 4), 50.0))
    error = info.value
    assert not isinstance(error, RuntimeError) and not executor._is_device_error(error)
    assert str(executor._model_failed("m", error)) == (
        "model 'm' failed: RuntimeError: CUDA error: an illegal memory access was encountered"
    )


class FailsOnFifty(torch.nn.Module):
    """Raises a fresh `make()` for a batch holding a request whose first value is 50; adds 1 otherwise."""

    def __init__(self, make):
        super().__init__()
        self.make = make

    def forward(self, x):
        if bool((x[:, 0] == 50).any()):
            raise self.make()
        return x + 1


@pytest.mark.parametrize("scripted", [False, True], ids=["python", "torchscript"])
@pytest.mark.parametrize(
    ("code", "where"),
    [(9, ""), (710, " on the device")],
    ids=["invalid-configuration", "device-side-assert"],
)
def test_the_cpu_path_names_a_cuda_error_of_a_forward_as_the_cuda_path_classifies_it(code, where, scripted):
    # The CPU path never marks its device lost; a batch failing is rerun in parts there whatever the error, and
    # its message says "on the device" for the errors that lose a CUDA device only (it did for every CUDA error;
    # for one raised in a TorchScript model, never).
    model = torch.jit.script(ScriptedFailsOnFifty(code)) if scripted else FailsOnFifty(lambda: torch_cuda_error(code))
    ex = executor.Executor(Servable(four_wide_config("m"), model), InstanceConfig(count=1))
    try:
        rows = [{"INPUT0": np.full((1, 4), v, np.float32)} for v in (1.0, 50.0, 2.0)]
        outputs = ex.instances[0].submit(rows, [1, 1, 1], 0).result(30).outputs
        np.testing.assert_array_equal(outputs[0]["OUTPUT0"], np.full((1, 4), 2.0))
        np.testing.assert_array_equal(outputs[2]["OUTPUT0"], np.full((1, 4), 3.0))
        assert isinstance(outputs[1], ModelExecutionError)
        text = error_line(torch_cuda_error(code))
        assert str(outputs[1]) == f"model 'm' failed{where}: {text} (on this request alone)"
        assert ex.lost is None
    finally:
        ex.shutdown()


# LOOKUP_MODEL, where a request's first value makes a CUDA error that leaves the context usable, raised by torch's
# own check as the call is refused: 50, cudaSetDevice given an ordinal past the devices ("invalid device ordinal");
# 60, memory-efficient attention over 65536 heads, whose grid.y (a head each) is past CUDA's 65535 ("invalid
# configuration argument", pytorch/pytorch#142228), unless this torch splits the heads: then its rows are -1.
USABLE_ERROR_MODEL = LOOKUP_MODEL.replace(
    "from torch import nn\n", "from torch import nn\nfrom torch.nn.attention import SDPBackend, sdpa_kernel\n"
).replace(
    "    def forward(self, x):\n",
    """    def forward(self, x):
        if bool((x[:, 0] == 50).any()):
            torch.cuda.set_device(torch.cuda.device_count())
        if bool((x[:, 0] == 60).any()):
            q = torch.rand(1, 65536, 1, 16, device=x.device)
            with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
                nn.functional.scaled_dot_product_attention(q, q, q)
            return torch.full((x.shape[0], 4), -1.0, device=x.device)
""",
)

USABLE_ERROR_SCRIPT = (
    EXECUTOR_HEAD
    + """
outcome("ordinal", inst.submit([req(1), req(50), req(2)], [1, 1, 1], 0))
outcome("grid", inst.submit([req(60), req(3)], [1, 1], 0))
outcome("later", inst.submit([req(3)], [1], 0))
out["lost"] = str(ex.lost)
print(json.dumps(out), flush=True)
os._exit(0)
"""
)


@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)
def test_cuda_an_error_that_leaves_the_context_usable_fails_its_request_alone_and_keeps_the_device():
    assert "set_device" in USABLE_ERROR_MODEL and "import SDPBackend" in USABLE_ERROR_MODEL
    out = run_executor_script(USABLE_ERROR_SCRIPT, USABLE_ERROR_MODEL)
    failed = "model 'lookup' failed: AcceleratorError: CUDA error: {} (on this request alone)"
    assert out["ordinal"] == [
        "ok",
        [
            [[4.0, 5.0, 6.0, 7.0]],
            repr(ModelExecutionError(failed.format("invalid device ordinal"))),
            [[8.0, 9.0, 10.0, 11.0]],
        ],
    ], out
    status, answers = out["grid"]
    assert status == "ok" and answers[1] in ([[12.0, 13.0, 14.0, 15.0]], [[-1.0] * 4]), out
    if "invalid configuration argument" in str(answers[0]):  # this torch still launches the grid: CUDA refuses it
        assert answers[0] == repr(ModelExecutionError(failed.format("invalid configuration argument"))), out
    assert out["later"] == ["ok", [[[12.0, 13.0, 14.0, 15.0]]]]
    assert out["lost"] == "None"
