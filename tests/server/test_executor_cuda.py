"""The CUDA path's bookkeeping on a real device: requests left out at their deadline, a failed batch's
`ran` and `left_out`, the instance serving on after a failed batch; what a model may return and run out of. Most
are the CUDA twin of a CPU test (test_executor.py, test_batcher.py) whose stand-in cannot reach
_launch_cuda/_finish_cuda.

These skip without a CUDA device; bench/gpu_session.sh runs them on a lent GPU.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from torch import nn

from wok.config import InstanceConfig
from wok.errors import ModelExecutionError
from wok.executor import Executor
from wok.models import build_demo
from wok.servable import Servable

from .conftest import four_wide_config, gated_servable

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device here; bench/gpu_session.sh runs these on a GPU"
)


def mlp_requests(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return [{"INPUT0": rng.standard_normal((1, 256), dtype=np.float32)} for _ in range(n)]


def reference(servable, reqs):
    module = servable.module_for(torch.device("cpu"))
    with torch.inference_mode():
        return [module(torch.from_numpy(r["INPUT0"])).numpy() for r in reqs]


@pytest.fixture
def cuda_executor():
    made = []

    def make(servable, depth=2, count=1):
        ex = Executor(servable, InstanceConfig(count=count, devices=("cuda:0",), pipeline_depth=depth))
        made.append(ex)
        return ex

    yield make
    for ex in made:
        ex.shutdown()


def test_cuda_worker_leaves_out_requests_whose_deadline_passed(cuda_executor):
    s = build_demo("mlp")
    inst = cuda_executor(s).instances[0]
    reqs = mlp_requests(3)
    now = time.perf_counter()
    result = inst.submit(reqs, [1, 1, 1], 0, [now - 1.0, None, now + 60.0]).result(30)
    assert result.kept == (1, 2) and result.events is not None
    assert len(result.outputs) == 2
    for got, want in zip(result.outputs, reference(s, reqs[1:])):
        np.testing.assert_allclose(got["OUTPUT0"], want, rtol=1e-3, atol=1e-4)
    nothing = inst.submit(reqs[:1], [1], 0, [now - 1.0]).result(30)
    assert nothing.kept == () and nothing.outputs == [] and nothing.events is None
    every = inst.submit(reqs, [1, 1, 1], 1, [None, now + 60.0, None]).result(30)
    assert every.kept is None and len(every.outputs) == 3


def test_cuda_a_batch_failing_whole_notes_its_time_on_the_instance_and_its_left_out_requests(cuda_executor):
    """One request left (its batch of one cannot be rerun in parts), its NaN fails the forward as the
    batch is launched: the future raises, `ran` holds the time the batch held the instance and
    `left_out` the request its worker left out (the batcher answers it DEADLINE_EXCEEDED)."""
    s, _ = gated_servable()
    inst = cuda_executor(s, depth=1).instances[0]
    now = time.perf_counter()
    before = time.perf_counter()
    nan = {"INPUT0": np.full((1, 4), np.nan, np.float32)}
    fut = inst.submit([{"INPUT0": np.ones((1, 4), np.float32)}, nan], [1, 1], 0, [now - 1.0, None])
    with pytest.raises(ModelExecutionError, match=r"^model 'gated' failed: ValueError: NaN in batch$"):
        fut.result(30)
    after = time.perf_counter()
    [(started, ended)] = fut.ran
    assert before <= started <= ended <= after
    assert fut.left_out == [((1,), started)]
    # The instance serves on, on its streams.
    ok = inst.submit([{"INPUT0": np.full((1, 4), 3.0, np.float32)}], [1], 0).result(30)
    assert ok.failure is None and ok.events is not None
    np.testing.assert_array_equal(ok.outputs[0]["OUTPUT0"], np.full((1, 4), 6.0, np.float32))


def test_cuda_a_batch_that_returned_notes_no_ran_and_no_left_out(cuda_executor):
    s = build_demo("mlp")
    inst = cuda_executor(s).instances[0]
    fut = inst.submit(mlp_requests(2), [1, 1], 0)
    result = fut.result(30)
    assert fut.ran == [] and fut.left_out == []
    assert result.started <= result.finished


def test_cuda_both_slots_of_a_pipeline_left_out_and_answered_in_order(cuda_executor):
    """Depth 2: two batches in flight, each with a request past its deadline; each keeps its own."""
    s = build_demo("mlp")
    inst = cuda_executor(s).instances[0]
    a, b = mlp_requests(4, seed=1), mlp_requests(4, seed=2)
    now = time.perf_counter()
    fa = inst.submit(a, [1] * 4, 0, [None, now - 1.0, None, None])
    fb = inst.submit(b, [1] * 4, 1, [None, None, None, now - 1.0])
    ra, rb = fa.result(30), fb.result(30)
    assert (ra.kept, rb.kept) == ((0, 2, 3), (0, 1, 2))
    for result, reqs in ((ra, [a[0], a[2], a[3]]), (rb, b[:3])):
        for got, want in zip(result.outputs, reference(s, reqs)):
            np.testing.assert_allclose(got["OUTPUT0"], want, rtol=1e-3, atol=1e-4)


def test_cuda_a_launch_waiting_at_the_worker_can_be_withdrawn_and_never_runs(cuda_executor):
    """The CUDA twin of test_executor.py's: the batch's future is a plain one, so `withdraw` cancels
    its launch at the worker (the gated forward holds the worker in the first launch), which
    cancels the batch; a launch the worker took cannot be withdrawn."""
    s, m = gated_servable()
    inst = cuda_executor(s, depth=2).instances[0]
    m.gate.clear()
    m.entered.clear()
    try:  # the gate opened whatever fails: the fixture's shutdown waits for the batch in the model
        running = inst.submit([{"INPUT0": np.ones((2, 4), np.float32)}], [2], 0)
        assert m.entered.wait(30), "the first batch never reached the model"
        waiting = inst.submit([{"INPUT0": np.ones((3, 4), np.float32)}], [3], 1)
        assert waiting.withdraw() is True
        assert waiting.cancelled()
        assert running.withdraw() is False
    finally:
        m.gate.set()
    result = running.result(30)
    np.testing.assert_array_equal(result.outputs[0]["OUTPUT0"], np.full((2, 4), 2.0, np.float32))
    inst.submit([{"INPUT0": np.ones((1, 4), np.float32)}], [1], 0).result(30)
    assert m.batch_sizes == [2, 1]


def storages(tensors) -> list[int]:
    return [t.untyped_storage().data_ptr() for t in tensors]


def two_instances(cuda_executor, make) -> tuple:
    """(first, second, twin): two instances on cuda:0 of the module `make()` builds, and a CPU module of
    `make()` holding the same weights, made before the first instance takes the module onto the GPU."""
    module, twin = make(), make()
    twin.load_state_dict(module.state_dict())
    first, second = cuda_executor(Servable(four_wide_config("m"), module), count=2).instances
    return first, second, twin


def assert_each_answers_as(instances, twin) -> None:
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    with torch.inference_mode():
        want = twin(torch.from_numpy(x)).numpy()
    for inst in instances:
        (got,) = inst.submit([{"INPUT0": x}], [2], 0).result(30).outputs
        np.testing.assert_allclose(got["OUTPUT0"], want, rtol=1e-5, atol=1e-5)


class Scaled(nn.Module):
    """A linear layer and a buffer of its own: an instance's copy shares the one, holds the other."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.register_buffer("scale", torch.full((4,), 2.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) * self.scale


def test_cuda_a_later_instance_on_the_device_runs_a_copy_sharing_the_weights_and_answers_as_the_first(
    cuda_executor,
):
    """Servable.module_for_instance on a GPU (checked on the CPU in test_servable.py): the second instance's
    module is a copy whose parameters are the first's own tensors on cuda:0 (the weights are not made twice
    on the device) and whose buffers are its own; both instances answer as the CPU does."""
    first, second, twin = two_instances(cuda_executor, Scaled)
    assert second.module is not first.module
    assert {t.device for t in (*second.module.parameters(), *second.module.buffers())} == {torch.device("cuda:0")}
    assert storages(second.module.parameters()) == storages(first.module.parameters())
    assert storages(second.module.buffers())[0] != storages(first.module.buffers())[0]
    assert_each_answers_as((first, second), twin)


def test_cuda_a_torchscript_modules_later_instance_holds_weights_of_its_own_logged_once(cuda_executor, caplog):
    """TorchScript's deepcopy ignores the memo that shares a plain module's parameters: on a GPU too, the
    second instance holds its own copy of the weights on cuda:0, said once with their size, and answers."""
    caplog.set_level("INFO", logger="wok")
    first, second, twin = two_instances(cuda_executor, lambda: torch.jit.script(nn.Sequential(nn.Linear(4, 4))))
    assert {p.device for p in second.module.parameters()} == {torch.device("cuda:0")}
    mine, theirs = storages(second.module.parameters()), storages(first.module.parameters())
    assert not set(mine) & set(theirs)
    for a, b in zip(second.module.parameters(), first.module.parameters()):
        assert torch.equal(a, b)
    size = sum(p.numel() * p.element_size() for p in twin.parameters()) / 2**20
    assert [r.getMessage() for r in caplog.records if "TorchScript" in r.getMessage()] == [
        f"model 'm': TorchScript copies its weights for each later instance on cuda:0 ({size:.1f} MiB each): "
        "the instances there hold them once each"
    ]
    assert_each_answers_as((first, second), twin)


# About 0.5 s of a GPU's clock (torch.cuda._sleep spins this many cycles): far longer than the worker takes
# to launch a second batch.
SLEEP_CYCLES = 1_000_000_000


class KeepsItsOutput(nn.Module):
    """Writes each batch's answer, twice its input, into a buffer it keeps and returns a view of it, as a CUDA
    graph's static output is returned."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("out", torch.zeros(8, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        self.out[:n].copy_(x * 2.0)
        return self.out[:n]


def test_cuda_an_output_the_model_keeps_is_copied_out_before_the_next_batch_writes_it(cuda_executor):
    """Depth 2: batch b's forward waits for batch a's copy out (Instance._launch_live). The copy-out stream is
    held behind a sleep, so that without that wait b's forward writes the kept buffer before a's copy reads
    it, and a's caller gets b's rows (10, not 2). Both slots ran a batch first, so that no pinned or device
    allocation (which the driver may synchronise) falls between the two."""
    inst = cuda_executor(Servable(four_wide_config("keeps"), KeepsItsOutput())).instances[0]
    for slot in (0, 1):
        inst.submit([{"INPUT0": np.zeros((2, 4), np.float32)}], [2], slot).result(30)
    with torch.cuda.device(inst.device), torch.cuda.stream(inst.d2h_stream):
        torch.cuda._sleep(SLEEP_CYCLES)
    fa = inst.submit([{"INPUT0": np.full((2, 4), 1.0, np.float32)}], [2], 0)
    fb = inst.submit([{"INPUT0": np.full((2, 4), 5.0, np.float32)}], [2], 1)
    np.testing.assert_array_equal(fa.result(30).outputs[0]["OUTPUT0"], np.full((2, 4), 2.0, np.float32))
    np.testing.assert_array_equal(fb.result(30).outputs[0]["OUTPUT0"], np.full((2, 4), 10.0, np.float32))


def test_cuda_weights_written_on_the_default_stream_are_what_the_first_batch_reads(cuda_executor):
    """The module's buffer is written on the default stream behind a sleep, as a factory's or a precision cast's
    kernels may still run when the instance starts; the instance's streams are torch's non-blocking pool
    streams, which do not wait for the default stream, so the instance synchronises the device once as it is
    made. Without that, the first forward reads the buffer as it was (2, not 3) unless the driver's implicit
    synchronisation at the batch's first allocations happens to order them."""
    module = Scaled().cuda()
    nn.init.eye_(module.linear.weight)
    nn.init.zeros_(module.linear.bias)
    torch.cuda.synchronize()
    torch.cuda._sleep(SLEEP_CYCLES)  # on the default stream, as every write below
    module.scale.fill_(3.0)
    inst = cuda_executor(Servable(four_wide_config("m"), module)).instances[0]
    (got,) = inst.submit([{"INPUT0": np.ones((1, 4), np.float32)}], [1], 0).result(30).outputs
    np.testing.assert_array_equal(got["OUTPUT0"], np.full((1, 4), 3.0, np.float32))


class AnswersOnTheHost(nn.Module):
    """Doubles on the device and returns its answer on the host (.cpu()), as a model ending on the host does."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (2 * x).cpu()


def test_cuda_an_answer_the_model_returns_on_the_host_is_answered(cuda_executor):
    """Every output was record_stream'ed for the copy-out stream, an op with no CPU kernel: each batch failed as it was
    launched (NotImplementedError), the warm-up's and any other of one request whole, one of several rerun in parts
    (answered, each part through .cpu()). An output on the host is copied as it is, not recorded."""
    ex = cuda_executor(Servable(four_wide_config("host"), AnswersOnTheHost()))
    ex.warmup()
    inst = ex.instances[0]
    for slot, n in ((0, 1), (1, 3), (0, 2)):
        x = np.arange(4 * n, dtype=np.float32).reshape(n, 4)
        result = inst.submit([{"INPUT0": x[i : i + 1]} for i in range(n)], [1] * n, slot).result(30)
        assert result.failure is None and result.events is not None
        for i, out in enumerate(result.outputs):
            np.testing.assert_array_equal(out["OUTPUT0"], 2 * x[i : i + 1])


class NeedsRowsOfMemory(nn.Module):
    """Makes a block of `unit` bytes on the device for each row of its batch before it answers, as its activations:
    a batch of four rows runs out of device memory as it makes its fourth."""

    def __init__(self, unit: int) -> None:
        super().__init__()
        self.unit = unit
        self.batch_sizes: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.batch_sizes.append(int(x.shape[0]))
        blocks = []  # a local of this frame (a comprehension's list may not be), held by the error's traceback
        for _ in range(x.shape[0]):
            blocks.append(torch.empty(self.unit, dtype=torch.uint8, device=x.device))
        return 2 * x


def test_cuda_a_batch_that_ran_out_of_device_memory_is_answered_in_parts_that_fit(cuda_executor):
    """Its halves were run while its error's traceback held the forward's frame, and so the three blocks it had made:
    each half of two rows ran out of memory too, and so did each row alone; every request failed. Freed first, the
    halves fit."""
    torch.cuda.empty_cache()  # what the allocator keeps is not free to the driver, yet given before it runs out
    free, _ = torch.cuda.mem_get_info()
    m = NeedsRowsOfMemory(int(free * 0.3))
    inst = cuda_executor(Servable(four_wide_config("rows"), m), depth=1).instances[0]
    x = np.arange(16, dtype=np.float32).reshape(4, 4)
    try:
        result = inst.submit([{"INPUT0": x[i : i + 1]} for i in range(4)], [1] * 4, 0).result(60)
    finally:
        torch.cuda.empty_cache()  # the blocks the allocator keeps, for the tests after this one
    assert str(result.failure).startswith("model 'rows' failed: OutOfMemoryError: CUDA out of memory."), result.failure
    assert m.batch_sizes == [4, 2, 2]
    for i, out in enumerate(result.outputs):
        np.testing.assert_array_equal(out["OUTPUT0"], 2 * x[i : i + 1])


# An executor on the last of two or more GPUs runs batches, then says which devices have a CUDA context: a process of
# its own, as this one has one on cuda:0.
ON_ANOTHER_DEVICE = """
import numpy as np, torch
from wok.config import InstanceConfig
from wok.executor import Executor
from wok.models import build_demo

last = torch.cuda.device_count() - 1
ex = Executor(build_demo("mlp"), InstanceConfig(count=1, devices=(f"cuda:{last}",), pipeline_depth=2))
reqs = [{"INPUT0": np.ones((rows, 256), np.float32)} for rows in (1, 3, 8)]  # the buffers grow: cudaHostAlloc
for slot in (0, 1, 0, 1):
    ex.instances[0].submit(reqs, [1, 3, 8], slot).result(60)
ex.shutdown()
print([torch._C._cuda_hasPrimaryContext(i) for i in range(last + 1)])
"""


@pytest.mark.skipif(0 < torch.cuda.device_count() < 2, reason="needs two CUDA devices; one here")
def test_cuda_an_instance_on_another_device_makes_no_context_on_cuda_0():
    """Its batches were assembled (pinned buffers growing) before the launch entered the instance's device, and
    waited for on a thread whose device is cuda:0: a context there, hundreds of MiB of a GPU it was not given.
    (test_executor.py checks the code's structure where no machine has two GPUs.)"""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", ON_ANOTHER_DEVICE], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    contexts = proc.stdout.strip().splitlines()[-1]
    assert contexts == repr([False] * (torch.cuda.device_count() - 1) + [True]), contexts
