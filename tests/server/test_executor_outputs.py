"""What a CPU batch hands each request: rows of its own, whatever tensor the model returned, and, when the
model raised, one line of its error.

The loop encodes a batch's answers while the worker already runs the next batch, so an answer that lives
in memory the model writes again (a buffer it keeps, the slot's input buffer) must be copied first. A
TorchScript error's message is the script's whole traceback: the server logs it, the client gets its last
line.
"""

from __future__ import annotations

import asyncio
import logging
import textwrap
import time
import types

import grpc
import numpy as np
import pytest
import torch

from wok.codec import decode_response, encode_request
from wok.config import model_config_from_dict
from wok.errors import InvalidInput
from wok.executor import PROBE_AFTER, Executor
from wok.models import build_demo
from wok.servable import Servable
from wok.v2pb import grpc_service_pb2_grpc as pb_grpc

# torch 2.13 deprecates torch.jit, but the torchscript platform is still served.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.:DeprecationWarning")

REUSE_MODEL = textwrap.dedent(
    """
    import torch
    from torch import nn


    class Reuse(nn.Module):
        # Writes each batch into tensors it keeps and answers slices of them: `score` of a registered
        # buffer, `count` of a plain attribute it allocates at its first call.
        def __init__(self, rows):
            super().__init__()
            self.register_buffer("out", torch.zeros(rows, 3))
            self.cnt = None

        def forward(self, ids, feats):
            b = feats.shape[0]
            if self.cnt is None:
                self.cnt = torch.zeros(self.out.shape[0], 1, dtype=torch.int64)
            self.out[:b].copy_(feats[:, :3])
            self.cnt[:b].copy_(ids)
            return self.out[:b], self.cnt[:b]


    def build():
        return Reuse(4)
    """
)

REUSE_CONFIG = textwrap.dedent(
    """
    platform = "python"
    factory = "model:build"
    max_batch_size = 4

    [[inputs]]
    name = "ids"
    datatype = "INT64"
    dims = [1]

    [[inputs]]
    name = "feats"
    datatype = "FP32"
    dims = [4]

    [[outputs]]
    name = "score"
    datatype = "FP32"
    dims = [3]

    [[outputs]]
    name = "count"
    datatype = "INT64"
    dims = [1]

    [dynamic_batching]
    max_queue_delay_ms = 1.0

    [instances]
    devices = ["cpu"]
    """
)


async def test_a_model_answering_slices_of_the_buffers_it_keeps_gives_every_request_its_own_rows(tmp_path, serve):
    d = tmp_path / "repo" / "reuse"
    d.mkdir(parents=True)
    (d / "config.toml").write_text(REUSE_CONFIG)
    (d / "model.py").write_text(REUSE_MODEL)
    n = 64
    async with serve(repository=tmp_path / "repo") as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            stub = pb_grpc.GRPCInferenceServiceStub(ch)
            for _ in range(3):
                requests = [
                    {"ids": np.full((1, 1), i, np.int64), "feats": np.full((1, 4), float(i), np.float32)}
                    for i in range(n)
                ]
                answers = await asyncio.gather(
                    *(stub.ModelInfer(encode_request("reuse", r), timeout=30) for r in requests)
                )
                got = [decode_response(a) for a in answers]
                assert [(int(g["score"][0, 0]), int(g["count"][0, 0])) for g in got] == [(i, i) for i in range(n)]
        # Batches formed (the copies are what this checks), several requests a batch.
        assert server.runtimes["reuse"].batcher.executor.instances[0].output_copies > 0


STAGED_MODEL = textwrap.dedent(
    """
    import threading

    import torch
    from torch import nn

    # Holds each batch in the model until the other instance's batch is in it too: two batches in the
    # model at once, whatever the host's speed. A global: a copy of the module shares it.
    BOTH_IN = threading.Barrier(2, timeout=30)


    class Staged(nn.Module):
        # Stages its input in a workspace it keeps and computes its answer from there, as a model
        # that preallocates its workspace does; the answer is a fresh tensor.
        def __init__(self):
            super().__init__()
            self.register_buffer("staged", torch.zeros(1, 4))

        def forward(self, x):
            self.staged.copy_(x)
            if x[0, 0] > 0:  # not the warm-up's zeros
                BOTH_IN.wait()
            return self.staged * 2


    def build():
        return Staged()
    """
)

STAGED_CONFIG = textwrap.dedent(
    """
    platform = "python"
    factory = "model:build"
    max_batch_size = 1

    [[inputs]]
    name = "X"
    datatype = "FP32"
    dims = [4]

    [[outputs]]
    name = "Y"
    datatype = "FP32"
    dims = [4]

    [instances]
    count = 2
    devices = ["cpu"]
    pipeline_depth = 1
    """
)


async def test_two_instances_on_one_device_each_run_a_workspace_of_their_own(tmp_path, serve):
    """Two instances on one CPU ran one module object: the two batches in it at once staged their rows in its
    one workspace, the later write winning, and one request was answered with the other's rows (without the
    barrier, a model computing between its write and its read: 275 of 640 requests, 0 with one instance).
    Each later instance on a device now runs a copy of the module that shares its parameters and holds its
    own buffers."""
    d = tmp_path / "repo" / "staged"
    d.mkdir(parents=True)
    (d / "config.toml").write_text(STAGED_CONFIG)
    (d / "model.py").write_text(STAGED_MODEL)
    async with serve(repository=tmp_path / "repo") as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            stub = pb_grpc.GRPCInferenceServiceStub(ch)
            # Batches of one request, one slot per instance: the two requests run on the two instances.
            answers = await asyncio.gather(
                *(
                    stub.ModelInfer(encode_request("staged", {"X": np.full((1, 4), v, np.float32)}), timeout=60)
                    for v in (1.0, 2.0)
                )
            )
        assert [decode_response(a)["Y"].tolist() for a in answers] == [[[2.0] * 4], [[4.0] * 4]]
        instances = server.runtimes["staged"].executor.instances
        assert instances[0].module.staged is not instances[1].module.staged


def _servable(module: torch.nn.Module, name: str = "m") -> Servable:
    cfg = model_config_from_dict(
        {
            "name": name,
            "platform": "python",
            "factory": "x:y",
            "inputs": [{"name": "X", "datatype": "FP32", "dims": [2]}],
            "outputs": [{"name": "Y", "datatype": "FP32", "dims": [2]}],
            "max_batch_size": 8,
            "instances": {"devices": ["cpu"], "pipeline_depth": 1},
        },
        "test",
    )
    return Servable(cfg, module)


def run_x(ex: Executor, value: float):
    reqs = [{"X": np.full((1, 2), value, np.float32)} for _ in range(3)]
    return ex.instances[0].submit(reqs, [1] * 3, 0).result(30)


class SliceOfBuffer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("out", torch.zeros(8, 2))

    def forward(self, x):
        self.out[: x.shape[0]].copy_(x)
        return self.out[: x.shape[0]]


class KeptWhole(torch.nn.Module):
    """Answers a tensor it allocated at its first call (in inference mode: not a view of anything), then
    overwrites; held in a plain attribute of a submodule, or in a list."""

    def __init__(self, in_list: bool) -> None:
        super().__init__()
        self.inner = torch.nn.Module()
        self.inner.kept = None
        self.in_list = in_list
        self.kept: list = []

    def forward(self, x):
        held = self.kept[0] if self.in_list and self.kept else self.inner.kept
        if held is None or held.shape != x.shape:
            held = torch.empty_like(x)
            if self.in_list:
                self.kept[:] = [held]
            else:
                self.inner.kept = held
        return held.copy_(x * 2)


class KeptScripted(torch.nn.Module):
    """Scripted: a plain tensor attribute, which TorchScript keeps outside the module's __dict__."""

    def __init__(self) -> None:
        super().__init__()
        self.kept = torch.zeros(3, 2)

    def forward(self, x):
        self.kept.copy_(x * 2)
        return self.kept


class KeptOutside(torch.nn.Module):
    """Answers memory it keeps per input shape where no module attribute shows it: in a cache object
    of its own, handed out as it is, as a `detach()` of it (a second tensor on the kept storage), or
    as a numpy array it keeps (memory torch did not allocate)."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how
        self.cache = types.SimpleNamespace(by_shape={})

    def forward(self, x):
        key = tuple(x.shape)
        if self.how == "numpy":
            kept = self.cache.by_shape.setdefault(key, np.empty(key, np.float32))
            np.multiply(x.numpy(), 2, out=kept)
            return torch.from_numpy(kept)
        kept = self.cache.by_shape.setdefault(key, torch.empty(key))
        torch.mul(x, 2, out=kept)
        return kept.detach() if self.how == "detach" else kept


@pytest.mark.parametrize(
    "build, first",
    [
        (SliceOfBuffer, 1.0),
        (lambda: KeptWhole(in_list=False), 2.0),
        (lambda: KeptWhole(in_list=True), 2.0),
        (lambda: torch.jit.script(KeptScripted()), 2.0),
        (lambda: KeptOutside("whole"), 2.0),
        (lambda: KeptOutside("detach"), 2.0),
        (lambda: KeptOutside("numpy"), 2.0),
    ],
    ids=[
        "slice-of-buffer",
        "kept-attribute",
        "kept-in-a-list",
        "torchscript-attribute",
        "kept-in-an-object",
        "detached-from-kept",
        "kept-numpy-array",
    ],
)
def test_an_output_in_memory_the_module_keeps_survives_the_next_batch(build, first):
    s = _servable(build())
    ex = Executor(s, s.config.instances)
    try:
        one = run_x(ex, 1.0)
        run_x(ex, 5.0)  # the model writes the same memory again
        assert [o["Y"].tolist() for o in one.outputs] == [[[first, first]]] * 3
    finally:
        ex.shutdown()


def test_the_demo_models_fresh_outputs_are_handed_out_without_a_copy():
    s = build_demo("mlp")
    ex = Executor(s, s.config.instances)
    try:
        ex.warmup()
        inst = ex.instances[0]
        rng = np.random.default_rng(0)
        for rows in (1, 5, 7, 32):  # unpadded and padded oneDNN row counts, and torch's path
            reqs = [{"INPUT0": rng.standard_normal((1, 256), dtype=np.float32)} for _ in range(rows)]
            inst.submit(reqs, [1] * rows, 0).result(30)
        assert inst.output_copies == 0
    finally:
        ex.shutdown()


# -- a model's error, for the client ----------------------------------------------------------
class Lookup(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(10, 3)

    def forward(self, ids):
        # Through an add, which the load's check of ids against the table does not follow (server/tables.py): an id
        # past the table reaches the model, as any value a TorchScript op refuses would.
        return self.emb(ids + 0).sum(1)


LOOKUP_CONFIG = textwrap.dedent(
    """
    platform = "torchscript"
    model_file = "model.pt"
    max_batch_size = 4

    [[inputs]]
    name = "ids"
    datatype = "INT64"
    dims = [2]

    [[outputs]]
    name = "y"
    datatype = "FP32"
    dims = [3]

    [dynamic_batching]
    max_queue_delay_ms = 1.0

    [instances]
    devices = ["cpu"]
    """
)


async def test_a_torchscript_error_reaches_the_client_in_one_line_and_the_log_whole(tmp_path, serve, caplog):
    d = tmp_path / "repo" / "emb"
    d.mkdir(parents=True)
    (d / "config.toml").write_text(LOOKUP_CONFIG)
    torch.jit.script(Lookup()).save(str(d / "model.pt"))
    caplog.set_level(logging.WARNING, logger="wok.batcher")
    async with serve(repository=tmp_path / "repo") as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            stub = pb_grpc.GRPCInferenceServiceStub(ch)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.ModelInfer(encode_request("emb", {"ids": np.array([[1, 12]], np.int64)}), timeout=30)
    assert info.value.code() == grpc.StatusCode.INTERNAL
    assert info.value.details() == "model 'emb' failed: RuntimeError: index out of range in self"
    # The operator's log has the script's traceback: the model's own error, as the logged exception.
    (record,) = [r for r in caplog.records if "failed" in r.getMessage()]
    assert record.getMessage() == (
        "model 'emb': a batch of 1 request(s), 1 sample(s), failed: "
        "model 'emb' failed: RuntimeError: index out of range in self"
    )
    logged = str(record.exc_info[1])
    assert "Traceback of TorchScript" in logged and logged.rstrip().endswith("index out of range in self")


class Refuses(torch.nn.Module):
    def forward(self, x):
        if bool((x < 0).any()):
            raise ValueError("negative input")
        return x * 2


def test_an_exception_a_script_raises_is_named_once_by_its_own_type():
    s = _servable(torch.jit.script(Refuses()), "neg")
    ex = Executor(s, s.config.instances)
    try:
        result = run_x(ex, -1.0)  # three requests, each refused: the batch, rerun in parts, fails for each
    finally:
        ex.shutdown()
    assert str(result.failure) == "model 'neg' failed: ValueError: negative input"  # not "Error: builtins.ValueError"
    assert [str(o) for o in result.outputs] == [
        "model 'neg' failed: ValueError: negative input (on this request alone)"
    ] * 3


def _checked(x: torch.Tensor) -> torch.Tensor:
    if bool((x < 0).any()):
        raise ValueError("negative input")
    return x


class CheckedOnAssembly(Servable):
    """A batching hook that runs TorchScript (`checker`: `_checked`, scripted): its error is raised outside the
    model's call, where the batcher (not the instance) words it."""

    checker = None

    def assemble(self, requests, rows, buffers):
        out = super().assemble(requests, rows, buffers)
        self.checker(out["X"])
        return out


async def test_a_torchscript_error_of_a_batching_hook_reaches_the_client_in_one_line(serve_servables):
    s = _servable(torch.nn.Identity(), "hook")
    s.__class__ = CheckedOnAssembly
    s.checker = torch.jit.script(_checked)
    async with serve_servables(s) as stub:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.ModelInfer(encode_request("hook", {"X": np.full((1, 2), -1.0, np.float32)}), timeout=30)
    assert info.value.details() == "model 'hook' failed: ValueError: negative input"


class RefusesNegativeOnAssembly(Servable):
    """A servable whose own assemble refuses a request's values (InvalidInput, INVALID_ARGUMENT), noting how long
    each refusing call took: a batch holding a negative value is refused."""

    refusals: list[float]

    def assemble(self, requests, rows, buffers):
        start = time.perf_counter()
        out = super().assemble(requests, rows, buffers)
        if bool((out["X"] < 0).any()):
            self.refusals.append(time.perf_counter() - start)
            raise InvalidInput("model 'refuse': input 'X' holds a negative value; expected 0 or more")
        return out


def _refusing() -> RefusesNegativeOnAssembly:
    s = _servable(torch.nn.Identity(), "refuse")
    s.__class__ = RefusesNegativeOnAssembly
    s.refusals = []
    return s


def test_a_request_a_servables_assemble_refuses_fails_alone_as_invalid_input_and_the_rest_is_answered():
    # It failed as the model's error (INTERNAL, "model 'refuse' failed: InvalidInput: ..."): before the batch was
    # rerun in parts, an INVALID_ARGUMENT for the whole batch.
    s = _refusing()
    ex = Executor(s, s.config.instances)
    try:
        reqs = [{"X": np.full((1, 2), v, np.float32)} for v in (1.0, -1.0, 2.0)]
        result = ex.instances[0].submit(reqs, [1] * 3, 0).result(30)
    finally:
        ex.shutdown()
    np.testing.assert_array_equal(result.outputs[0]["Y"], np.full((1, 2), 1.0, np.float32))
    assert type(result.outputs[1]) is InvalidInput
    assert str(result.outputs[1]) == "model 'refuse': input 'X' holds a negative value; expected 0 or more"
    np.testing.assert_array_equal(result.outputs[2]["Y"], np.full((1, 2), 2.0, np.float32))


def test_batches_of_clients_values_refused_are_not_the_model_failing_every_input():
    # Two batches whose every request a servable's assemble refused counted as the model failing every input
    # (all_failed_runs), which turns on the probing meant for a broken model (PROBE_AFTER).
    s = _refusing()
    ex = Executor(s, s.config.instances)
    try:
        for _ in range(PROBE_AFTER + 1):
            reqs = [{"X": np.full((1, 2), -1.0, np.float32)} for _ in range(3)]
            result = ex.instances[0].submit(reqs, [1] * 3, 0).result(30)
            assert all(type(o) is InvalidInput for o in result.outputs)
        assert ex.instances[0].all_failed_runs == 0
    finally:
        ex.shutdown()


async def test_a_batch_of_clients_values_refused_logs_no_failed_batch(serve_servables, caplog):
    # It was logged at WARNING as the model's failed batch, taking the throttled line from the model's own.
    caplog.set_level(logging.WARNING)
    async with serve_servables(_refusing()) as stub:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.ModelInfer(encode_request("refuse", {"X": np.full((1, 2), -1.0, np.float32)}), timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert not [r.getMessage() for r in caplog.records if "negative value" in r.getMessage()]


def test_a_failed_assembly_is_timed_as_the_batchs_assembly_not_its_compute():
    # Its time was counted as compute, the assembly's as 0: t1 was taken only once it had succeeded.
    s = _refusing()
    ex = Executor(s, s.config.instances)
    try:
        result = run_x(ex, -1.0)
    finally:
        ex.shutdown()
    assert result.times.assemble >= s.refusals[0] > 0  # the whole batch's, the first refused
    assert result.times.compute <= result.finished - result.started - s.refusals[0]
    assert all(type(o) is InvalidInput for o in result.outputs)


async def test_a_request_a_servables_assemble_refuses_is_answered_invalid_argument(serve_servables):
    async with serve_servables(_refusing()) as stub:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.ModelInfer(encode_request("refuse", {"X": np.full((1, 2), -1.0, np.float32)}), timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == "model 'refuse': input 'X' holds a negative value; expected 0 or more"


@pytest.fixture
def serve_servables():
    from contextlib import asynccontextmanager

    from wok.app import WokServer
    from wok.config import server_settings
    from wok.repository import ModelRepository

    @asynccontextmanager
    async def serving(*servables: Servable):
        server = WokServer(server_settings(grpc_port=0, metrics_port=None), ModelRepository(servables, "test"))
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
                yield pb_grpc.GRPCInferenceServiceStub(ch)
        finally:
            await server.stop(grace=5)

    return serving


def test_any_other_error_gives_its_first_line_and_one_without_a_message_says_so():
    from wok.errors import error_line

    cuda = RuntimeError(
        "CUDA error: device-side assert triggered\n"
        "CUDA kernel errors might be asynchronously reported at some other API call\n"
        "For debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
    )
    assert error_line(cuda) == "RuntimeError: CUDA error: device-side assert triggered"
    assert error_line(ValueError()) == "ValueError: (no message)"
