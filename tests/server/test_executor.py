"""The executor's pipeline: same answers on every path, stages timed, buffers reused.

The CUDA tests run only where a CUDA device is present; on a machine without one,
bench/gpu_check.py is the script to run on a GPU host.
"""

from __future__ import annotations

import concurrent.futures
import copy
import gc
import os
import sys
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch

from wok.config import InstanceConfig
from wok.errors import ModelExecutionError, WarmupError
from wok.executor import Executor
from wok.models import build_demo

NO_CUDA = "no CUDA device here; the CUDA path is checked on a GPU by bench/gpu_check.py"


def mlp_requests(n_requests: int, rows: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return [{"INPUT0": rng.standard_normal((rows, 256), dtype=np.float32)} for _ in range(n_requests)]


def reference(servable, reqs):
    module = servable.module_for(torch.device("cpu"))
    with torch.inference_mode():
        return [module(torch.from_numpy(r["INPUT0"])).numpy() for r in reqs]


def run(executor, reqs, slot=0, instance=0):
    return executor.instances[instance].submit(reqs, [r["INPUT0"].shape[0] for r in reqs], slot).result(30)


def test_cpu_batch_matches_each_request_alone_and_times_its_stages():
    s = build_demo("mlp")
    ex = Executor(s, InstanceConfig(count=1, devices=("cpu",), pipeline_depth=2))
    try:
        reqs = mlp_requests(5, rows=2)
        result = run(ex, reqs)
        for got, want in zip(result.outputs, reference(s, reqs)):
            np.testing.assert_allclose(got["OUTPUT0"], want, rtol=1e-5, atol=1e-6)
        assert result.times.assemble > 0 and result.times.compute > 0
        assert result.events is None
    finally:
        ex.shutdown()


def test_host_buffers_are_reused_between_batches_of_a_slot():
    s = build_demo("mlp")
    ex = Executor(s, InstanceConfig(count=1, devices=("cpu",), pipeline_depth=1))
    try:
        run(ex, mlp_requests(4, rows=2))
        buf = ex.instances[0].slots[0].inputs._flat["INPUT0"]
        first_ptr = buf.data_ptr()
        second = run(ex, mlp_requests(3, rows=1, seed=1))
        assert ex.instances[0].slots[0].inputs._flat["INPUT0"].data_ptr() == first_ptr
        # The smaller batch reused the buffer without leaking rows of the larger one.
        assert [o["OUTPUT0"].shape for o in second.outputs] == [(1, 256)] * 3
    finally:
        ex.shutdown()


def test_instances_spread_over_the_listed_devices():
    s = build_demo("mlp")
    ex = Executor(s, InstanceConfig(count=3, devices=("cpu",), pipeline_depth=2))
    try:
        assert [i.device.type for i in ex.instances] == ["cpu"] * 3
        assert ex.slot_count == 6
        reqs = mlp_requests(2, rows=1)
        for k in range(3):
            np.testing.assert_allclose(
                run(ex, reqs, instance=k).outputs[0]["OUTPUT0"], reference(s, reqs)[0], rtol=1e-5, atol=1e-6
            )
    finally:
        ex.shutdown()


@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)
def test_cuda_path_uses_pinned_buffers_streams_and_events():
    s = build_demo("mlp")
    ex = Executor(s, InstanceConfig(count=1, devices=("cuda:0",), pipeline_depth=2))
    try:
        inst = ex.instances[0]
        assert len({inst.h2d_stream, inst.compute_stream, inst.d2h_stream}) == 3
        reqs = mlp_requests(8, rows=4)
        result = run(ex, reqs)
        assert inst.slots[0].inputs._flat["INPUT0"].is_pinned()
        assert inst.slots[0].outputs._flat["OUTPUT0"].is_pinned()
        assert result.events is not None and len(result.events) == 5
        assert result.times.h2d > 0 and result.times.compute > 0 and result.times.d2h > 0
        for got, want in zip(result.outputs, reference(s, reqs)):
            np.testing.assert_allclose(got["OUTPUT0"], want, rtol=1e-3, atol=1e-4)
    finally:
        ex.shutdown()


@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)
def test_cuda_two_slots_in_flight_give_the_same_answers():
    s = build_demo("mlp")
    ex = Executor(s, InstanceConfig(count=1, devices=("cuda:0",), pipeline_depth=2))
    try:
        a, b = mlp_requests(4, rows=8, seed=1), mlp_requests(4, rows=8, seed=2)
        inst = ex.instances[0]
        fa = inst.submit(a, [8] * 4, 0)
        fb = inst.submit(b, [8] * 4, 1)
        for reqs, fut in ((a, fa), (b, fb)):
            for got, want in zip(fut.result(30).outputs, reference(s, reqs)):
                np.testing.assert_allclose(got["OUTPUT0"], want, rtol=1e-3, atol=1e-4)
    finally:
        ex.shutdown()


def _servable(module, name="m"):
    from wok.config import model_config_from_dict
    from wok.servable import Servable

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


def test_an_output_aliasing_the_input_buffer_survives_the_next_batch():
    s = _servable(torch.nn.Identity())
    ex = Executor(s, s.config.instances)
    try:
        first = run_x(ex, 1.0)
        run_x(ex, 2.0)  # same slot: overwrites the reusable input buffer
        np.testing.assert_array_equal(first.outputs[0]["Y"], np.full((3, 2), 1.0, np.float32))
    finally:
        ex.shutdown()


def test_a_model_returning_the_wrong_number_of_rows_fails_the_batch():
    class FirstRow(torch.nn.Module):
        def forward(self, x):
            return x[:1]

    s = _servable(FirstRow(), "short")
    ex = Executor(s, s.config.instances)
    try:
        with pytest.raises(
            ModelExecutionError, match=r"model 'short' output 'Y': expected 3 rows, one per sample; got shape \[1, 2\]"
        ):
            run_x(ex, 1.0)
    finally:
        ex.shutdown()


@pytest.mark.parametrize(
    ("forward", "got"),
    [
        (lambda x: torch.cat([x, x], 1), "[3, 4]"),
        (lambda x: x.reshape(3, 1, 2), "[3, 1, 2]"),
        (lambda x: x[:, 0], "[3]"),
    ],
)
def test_a_model_returning_another_shape_than_its_config_declares_fails_the_batch(forward, got):
    class Reshaped(torch.nn.Module):
        def forward(self, x):
            return forward(x)

    s = _servable(Reshaped(), "reshaped")
    ex = Executor(s, s.config.instances)
    try:
        with pytest.raises(ModelExecutionError) as info:
            run_x(ex, 1.0)
        assert str(info.value) == (
            f"model 'reshaped' output 'Y': expected shape [3, 2], as its config declares (3 rows; -1 = any size); "
            f"got {got}"
        )
    finally:
        ex.shutdown()


def test_a_cuda_batch_whose_finish_stage_was_cancelled_is_cancelled_not_left_unset():
    # On CUDA a batch's future takes the outcome of its finish stage, which a shutdown past the
    # grace period cancels; the batcher maps a cancelled batch to ShuttingDown for its callers.
    # The CUDA path itself is checked on a GPU (bench/gpu_check.py); its hand-off is checked here.
    from wok.executor import _copy_outcome

    outcomes = []
    for settle in (lambda f: f.cancel(), lambda f: f.set_exception(ValueError("x")), lambda f: f.set_result(7)):
        src, dst = concurrent.futures.Future(), concurrent.futures.Future()
        src.add_done_callback(lambda g, dst=dst: _copy_outcome(g, dst))
        settle(src)
        assert dst.done()
        outcomes.append("cancelled" if dst.cancelled() else repr(dst.exception()) if dst.exception() else dst.result())
    assert outcomes == ["cancelled", "ValueError('x')", 7]


def test_a_cuda_batch_whose_launch_was_cancelled_is_cancelled_not_a_model_error():
    # The launch stage is cancelled the same way (queued at the worker past the grace period).
    # Its done-callback read `f.exception()`, which raises CancelledError for a cancelled future,
    # and set that as the batch's exception: its callers got INTERNAL ("model failed:
    # CancelledError") instead of UNAVAILABLE (server stopping).
    from wok.executor import _after_launch

    def settle_and_hand_over(settle):
        launched, done, handed = concurrent.futures.Future(), concurrent.futures.Future(), []
        wait = concurrent.futures.Future()
        launched.add_done_callback(lambda f: _after_launch(f, done, lambda r: (handed.append(r), wait)[1]))
        settle(launched)
        return done, handed, wait

    done, handed, _ = settle_and_hand_over(lambda f: f.cancel())
    assert done.cancelled() and handed == []
    done, handed, _ = settle_and_hand_over(lambda f: f.set_exception(ValueError("x")))
    assert repr(done.exception()) == "ValueError('x')" and handed == []
    done, handed, wait = settle_and_hand_over(lambda f: f.set_result("launched"))
    assert handed == ["launched"] and not done.done()  # the wait stage decides
    wait.set_result(7)
    assert done.result() == 7


def test_a_batch_waiting_at_the_worker_can_be_withdrawn_and_never_runs(gated):
    # Past a stop's grace period the batcher has answered the callers of every batch it sent:
    # one still waiting behind the running batch is withdrawn, or the worker would run it for
    # nobody once the running one ends. A batch the worker took cannot be withdrawn.
    _, m, ex = gated(max_batch_size=4, delay_ms=0, depth=2)
    inst = ex.instances[0]
    m.gate.clear()
    m.entered.clear()
    running = inst.submit([{"INPUT0": np.ones((2, 4), np.float32)}], [2], 0)
    assert m.entered.wait(10), "the first batch never reached the model"
    waiting = inst.submit([{"INPUT0": np.ones((3, 4), np.float32)}], [3], 1)
    assert waiting.withdraw() is True
    assert waiting.cancelled()
    assert running.withdraw() is False  # taken by the worker: it runs to its end
    m.gate.set()
    result = running.result(30)
    np.testing.assert_array_equal(result.outputs[0]["OUTPUT0"], np.full((2, 4), 2.0, np.float32))
    # The worker's next task runs after it skipped the withdrawn one: only the first batch ran.
    inst.submit([{"INPUT0": np.ones((1, 4), np.float32)}], [1], 0).result(30)
    assert m.batch_sizes == [2, 1]
    assert waiting.ran == [] and waiting.left_out == []


@pytest.mark.parametrize(
    "device", ["cpu", pytest.param("cuda:0", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA))]
)
def test_a_batchs_future_is_freed_without_the_cyclic_collector(device):
    # Its `withdraw` was its own bound cancel (on CUDA, the launch's, whose done callback holds the
    # batch's future): a cycle per batch, freed only by the cyclic collector, with all the batcher's
    # done callback on it holds (the Batch, its requests and their answers).
    s = build_demo("mlp")
    ex = Executor(s, InstanceConfig(count=1, devices=(device,), pipeline_depth=1))
    try:
        reqs = mlp_requests(1, rows=2)
        run(ex, reqs)  # the first batch: lazy setup
        gc.collect()
        gc.disable()
        try:
            future = ex.instances[0].submit(reqs, [2], 0)
            future.result(30)
            gone = weakref.ref(future)
            del future
            run(ex, reqs)  # one more batch on the one worker (and waiter): the first one's work is gone by then
            assert gone() is None
        finally:
            gc.enable()
    finally:
        ex.shutdown()


def run_x(ex, value):
    return ex.instances[0].submit([{"X": np.full((3, 2), value, np.float32)}], [3], 0).result(30)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="OS thread names are read from Linux's /proc")
@pytest.mark.parametrize(("depth", "slots"), [(None, 2), (1, 1), (3, 3)])
def test_the_gated_models_depth_none_is_the_default_two_slots(gated, depth, slots):
    """gated_servable's docstring says `depth` None is the default of 2, and passes None on as the config's
    pipeline_depth: the executor's default is what makes the two agree."""
    servable, _, ex = gated(depth=depth)
    assert servable.config.instances.pipeline_depth == depth
    assert [len(inst.slots) for inst in ex.instances] == [slots]


def test_worker_threads_carry_an_os_name_that_top_and_proc_show(gated):
    import threading

    _, m, ex = gated(max_batch_size=4, delay_ms=0)
    seen = []
    m.register_forward_pre_hook(lambda *_: seen.append(threading.get_native_id()))
    run_one = ex.instances[0].submit([{"INPUT0": np.ones((1, 4), np.float32)}], [1], 0)
    run_one.result(30)
    (tid,) = seen
    assert Path(f"/proc/{os.getpid()}/task/{tid}/comm").read_text().strip() == "wok-run-0"


def test_an_instances_worker_thread_runs_from_its_construction_so_no_submit_starts_a_thread(gated):
    """The pool started its thread inside the first `submit`, and a Ctrl-C landing in that start (a KeyboardInterrupt:
    the bench tools submit from the main thread) left the thread running the batch unknown to the pool: its shutdown
    waited for nothing, and Python's exit joined the thread, a stuck model's for good (`wok profile`'s Ctrl-C in its
    warm-up hung about 1 run in 3 under load). The worker thread now starts as the instance is built."""
    import threading

    _, _, ex = gated(max_batch_size=4, delay_ms=0, name="eager")
    built = set(threading.enumerate())
    assert [t.name for t in built if t.name.startswith("wok-eager-")] == ["wok-eager-0-run_0"]
    ex.instances[0].submit([{"INPUT0": np.ones((1, 4), np.float32)}], [1], 0).result(30)
    assert set(threading.enumerate()) - built == set()


@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)
def test_a_cuda_instances_worker_and_waiter_threads_run_from_its_construction():
    """A CUDA batch's launch hands it to the waiter in a done callback, which runs on the submitting thread where the
    launch has ended already: the waiter's pool started its thread there, where a Ctrl-C could land in the start."""
    import threading

    ex = Executor(build_demo("mlp"), InstanceConfig(count=1, devices=("cuda:0",), pipeline_depth=1))
    try:
        built = set(threading.enumerate())
        names = sorted(t.name for t in built if t.name.startswith("wok-mlp-"))
        assert names == ["wok-mlp-0-run_0", "wok-mlp-0-wait_0"]
        run(ex, mlp_requests(2, rows=1))
        assert set(threading.enumerate()) - built == set()
    finally:
        ex.shutdown()


@contextmanager
def interrupted_as_a_thread_starts(prefix: str) -> Iterator[list]:
    """A KeyboardInterrupt raised on this thread as `Thread.start` returns for the first thread named `prefix…`: its
    thread runs, and the code that started it has not recorded it. A Ctrl-C lands there when the signal comes while
    the new thread runs and the starting one waits in the start, often on a loaded host. Yields the started threads."""
    import threading

    started: list = []
    start = threading.Thread.start.__code__

    def at_return(frame, event, arg):
        if event == "return" and not started:
            started.append(frame.f_locals["self"])
            raise KeyboardInterrupt  # raised into the traced frame, as a signal handler's is
        return at_return

    def calls(frame, event, arg):
        return at_return if frame.f_code is start and frame.f_locals["self"].name.startswith(prefix) else None

    sys.settrace(calls)
    try:
        yield started
    finally:
        sys.settrace(None)


def test_a_ctrl_c_as_an_instances_worker_thread_starts_leaves_no_thread_running():
    """The start is interrupted with the thread running and its pool not knowing of it: the pool's shutdown, and
    Python's exit, did not tell it to end, and the thread (holding the instance through the pool's initializer) waited
    for a batch for good, the process's exit joining it. The instance's construction shuts its pool down first."""
    with interrupted_as_a_thread_starts("wok-cut-0-run") as started:
        with pytest.raises(KeyboardInterrupt):
            Executor(_servable(torch.nn.Linear(2, 2), "cut"), InstanceConfig(count=1, devices=("cpu",)))
    assert [t.name for t in started] == ["wok-cut-0-run_0"]
    started[0].join(10)
    try:
        assert not started[0].is_alive(), "the worker thread whose start was interrupted is still running"
    finally:
        if started[0].is_alive():  # ended here, else this process's exit waits for it for good
            started[0]._args[2].__self__.shutdown()


def test_the_worker_leaves_out_requests_whose_deadline_passed():
    import time

    s = build_demo("mlp")
    ex = Executor(s, InstanceConfig(count=1, devices=("cpu",), pipeline_depth=1))
    try:
        reqs = mlp_requests(3, rows=1)
        now = time.perf_counter()
        result = ex.instances[0].submit(reqs, [1, 1, 1], 0, [now - 1.0, None, now + 60.0]).result(30)
        assert result.kept == (1, 2)
        for got, want in zip(result.outputs, reference(s, reqs[1:])):
            np.testing.assert_allclose(got["OUTPUT0"], want, rtol=1e-5, atol=1e-6)
        nothing = ex.instances[0].submit(reqs[:1], [1], 0, [now - 1.0]).result(30)
        assert nothing.kept == () and nothing.outputs == []
        every = ex.instances[0].submit(reqs, [1, 1, 1], 0, [None, now + 60.0, None]).result(30)
        assert every.kept is None and len(every.outputs) == 3
    finally:
        ex.shutdown()


class ThreadsSeen(torch.nn.Module):
    """Records, per batch, how many intra-op threads the worker thread runs it with."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[int, int]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append((int(x.shape[0]), torch.get_num_threads()))
        return x + 1


def test_the_worker_sizes_torch_threads_to_the_batch_up_to_the_process_setting():
    from wok.servable import Servable

    from .conftest import four_wide_config

    cfg = four_wide_config("threads")
    module = ThreadsSeen()
    before = torch.get_num_threads()
    torch.set_num_threads(4)  # the worker thread starts from the process-wide setting: T = 4
    try:
        ex = Executor(Servable(cfg, module), cfg.instances)
        try:
            for rows in (1, 2, 3, 4, 5, 8, 1):
                req = {"INPUT0": np.zeros((rows, 4), dtype=np.float32)}
                ex.instances[0].submit([req], [rows], 0).result(30)
            main_after = torch.get_num_threads()  # read here: the worker set 1 on itself meanwhile
        finally:
            ex.shutdown()
    finally:
        torch.set_num_threads(before)
    # ceil(n · 4 / 8): one thread up to 2 samples, all 4 for a full batch, and back down.
    assert module.seen == [(1, 1), (2, 1), (3, 2), (4, 2), (5, 3), (8, 4), (1, 1)]
    assert ex.instances[0].max_threads == 4
    assert main_after == 4  # the worker's setting is its own thread's, not the process's


def test_prewarm_reads_every_weight_on_the_worker_thread_and_only_where_it_can_help(gated):
    s = build_demo("mlp")
    ex = Executor(s, InstanceConfig(count=1, devices=("cpu",)))
    try:
        inst = ex.instances[0]
        size = sum(p.numel() * p.element_size() for p in s.module_for(torch.device("cpu")).parameters())
        assert inst.can_prewarm and inst.prewarm().result(30) == size == 6_300_672  # 1.57 M fp32 weights
        assert inst.prewarms == 1
    finally:
        ex.shutdown()
    _, _, unweighted = gated()  # no weights: nothing to read
    assert not unweighted.instances[0].can_prewarm and unweighted.instances[0].prewarm() is None


def _conv_servable(tmp_path, warmup_dims=None):
    # A valid model that refuses a variable length of 1: its kernel is 3 long.
    from wok.config import model_config_from_dict
    from wok.servable import Servable

    torch.manual_seed(0)
    module = torch.jit.trace(torch.nn.Conv1d(2, 2, 3), torch.zeros(1, 2, 8))
    x = {"name": "x", "datatype": "FP32", "dims": [2, -1]}
    if warmup_dims is not None:
        x["warmup_dims"] = warmup_dims
    cfg = model_config_from_dict(
        {
            "name": "conv",
            "platform": "torchscript",
            "model_file": "model.pt",
            "inputs": [x],
            "outputs": [{"name": "y", "datatype": "FP32", "dims": [2, -1]}],
            "max_batch_size": 4,
            "instances": {"devices": ["cpu"], "pipeline_depth": 1},
        },
        str(tmp_path / "conv" / "config.toml"),
    )
    return Servable(cfg, module)


def test_a_failed_warm_up_is_one_line_naming_the_model_its_config_the_shapes_and_the_field(tmp_path):
    s = _conv_servable(tmp_path)
    ex = Executor(s, s.config.instances)
    try:
        with pytest.raises(ModelExecutionError) as info:
            ex.warmup()
    finally:
        ex.shutdown()
    msg = str(info.value)
    assert "\n" not in msg  # not TorchScript's traceback
    assert msg.startswith("model 'conv' failed: RuntimeError: ")
    assert "Kernel size can't be greater than actual input size; in the start-up warm-up" in msg
    assert f"input shapes 'x' [1, 2, 1] on cpu (config: {tmp_path / 'conv' / 'config.toml'})" in msg
    assert "set them with warmup_dims on each [[inputs]]" in msg


class Squeezed(torch.nn.Module):
    """Drops every size-1 dim: a batch of one row answers a 0-d tensor, not one row per sample."""

    def forward(self, x):
        return (x * 2.0).squeeze()


def test_a_0_d_output_is_not_one_row_per_sample_and_fails_the_warm_up_as_on_cuda(tmp_path):
    # np.ascontiguousarray would make the CPU path's 0-d output [1] and let it through; the CUDA
    # path's copy keeps it 0-d and fails. Both refuse it: the warm-up's batch is one row.
    from wok.config import model_config_from_dict
    from wok.servable import Servable

    cfg = model_config_from_dict(
        {
            "name": "sq",
            "platform": "python",
            "factory": "model:build",
            "inputs": [{"name": "X", "datatype": "FP32", "dims": []}],
            "outputs": [{"name": "Y", "datatype": "FP32", "dims": []}],
            "max_batch_size": 8,
            "instances": {"devices": ["cpu"], "pipeline_depth": 1},
        },
        str(tmp_path / "sq" / "config.toml"),
    )
    ex = Executor(Servable(cfg, Squeezed()), cfg.instances)
    try:
        with pytest.raises(WarmupError) as info:
            ex.warmup()
        # Rows of 2 or more keep their one dim; only the 0-d answer is refused.
        out = ex.instances[0].submit([{"X": np.ones(3, np.float32)}], [3], 0).result(30)
        np.testing.assert_array_equal(out.outputs[0]["Y"], np.full(3, 2.0, np.float32))
    finally:
        ex.shutdown()
    assert str(info.value) == (
        # As a batch's callers are told it: it read "model 'sq' failed: ModelExecutionError: model 'sq' output ...".
        "model 'sq' output 'Y': expected 1 row, one per sample; got shape []; in the "
        f"start-up warm-up, on a batch of zeros with input shapes 'X' [1] on cpu (config: "
        f"{tmp_path / 'sq' / 'config.toml'})"  # wok's own check failed: no warmup_dims hint
    )


def test_warmup_dims_set_the_sizes_the_warm_up_runs_the_model_on(tmp_path):
    s = _conv_servable(tmp_path, warmup_dims=[2, 8])
    ex = Executor(s, s.config.instances)
    try:
        ex.warmup()
        out = ex.instances[0].submit([{"x": np.ones((1, 2, 5), np.float32)}], [1], 0).result(30)
        assert out.outputs[0]["y"].shape == (1, 2, 3)
    finally:
        ex.shutdown()


# (model name, input name, dims, the refusal's words of them: its start, its end): a 5,000-character input name, 5,000
# dims, and a 5,000-character model name.
HUGE_INPUTS = {
    "long name": (
        "m",
        "x" * 5000,
        [10**12, 10**12],
        f"input '{'x' * 200}'… (5,000 characters in all), shape [1, 1000000000000, 1000000000000] (FP32): ",
        "array is too big; `arr.size * arr.dtype.itemsize` is larger than the maximum possible size",
    ),
    "many dims": (
        "m",
        "INPUT0",
        [1] * 5000,
        "input 'INPUT0', shape [1, 1, 1, ",
        "… (15,003 characters in all) (FP32): maximum supported dimension for an ndarray is currently 64, found 5001",
    ),
    "long model name": (
        "m" * 5000,
        "INPUT0",
        [10**12, 10**12],
        "input 'INPUT0', shape [1, 1000000000000, 1000000000000] (FP32): ",
        "array is too big; `arr.size * arr.dtype.itemsize` is larger than the maximum possible size",
    ),
}


@pytest.mark.parametrize("model, name, dims, start, end", HUGE_INPUTS.values(), ids=HUGE_INPUTS.keys())
def test_a_warm_up_that_cannot_make_its_zeros_names_a_huge_input_cut_and_its_config_path_whole(
    tmp_path, model, name, dims, start, end
):
    """The name and the shape went into the refusal whole: 5,000 characters of either pinned the config's path at
    its least room (256 characters, cut in its middle) and made a line over MESSAGE_CHARS, which `wok serve` and
    `wok profile` each cut again (cliargs.one_line), the path's end among what went. Cut as a batch's shapes are,
    the line keeps its shape and a path of 300 characters whole. The model's name too: 5,000 characters of it
    (its config's name has no length cap) did the same."""
    from wok.cliargs import one_line
    from wok.config import model_config_from_dict
    from wok.servable import Servable

    source = str(tmp_path / ("p" * 250) / "config.toml")  # over 256 characters (a folder name's most is 255 bytes)
    assert len(source) > 256
    cfg = model_config_from_dict(
        {
            "name": model,
            "platform": "python",
            "factory": "model:build",
            "inputs": [{"name": name, "datatype": "FP32", "dims": dims}],
            "outputs": [{"name": "Y", "datatype": "FP32", "dims": [-1]}],
            "max_batch_size": 4,
            "instances": {"devices": ["cpu"], "pipeline_depth": 1},
        },
        source,
    )
    ex = Executor(Servable(cfg, torch.nn.Identity()), cfg.instances, cpu_linear="torch")
    try:
        with pytest.raises(WarmupError) as info:
            ex.warmup()
    finally:
        ex.shutdown()
    message = str(info.value)
    shown = "'m'" if model == "m" else f"'{'m' * 200}'… (5,000 characters in all)"
    head = f"model {shown}: its start-up warm-up cannot make a sample of zeros for "
    tail = f"; check that input's dims (and warmup_dims) in its config ({source})"
    assert message.startswith(head + start) and message.endswith(end + tail), message[:300] + " ... " + message[-600:]
    assert len(message) < 1_500, f"{len(message):,} characters"
    assert one_line(message) == message  # as `wok serve` says it: not cut again


class Exits(torch.nn.Module):
    """Raises `exc` (a BaseException, not an Exception) on every batch."""

    def __init__(self, exc: BaseException) -> None:
        super().__init__()
        self.exc = exc

    def forward(self, x):
        raise self.exc


@pytest.mark.parametrize("exc", [SystemExit(0), KeyboardInterrupt(), GeneratorExit()], ids=lambda e: type(e).__name__)
def test_a_model_raising_a_base_exception_in_the_warm_up_fails_it_as_a_warm_up_error(exc):
    # Raised out of warmup(), the model's SystemExit(0) ended `wok serve` with status 0 and no word
    # (its KeyboardInterrupt read as the operator's Ctrl-C); a batch's callers get it as any error.
    from wok.config import model_config_from_dict
    from wok.servable import Servable

    cfg = model_config_from_dict(
        {
            "name": "exits",
            "platform": "python",
            "factory": "model:build",
            "inputs": [{"name": "X", "datatype": "FP32", "dims": [2]}],
            "outputs": [{"name": "Y", "datatype": "FP32", "dims": [2]}],
            "max_batch_size": 4,
            "instances": {"devices": ["cpu"], "pipeline_depth": 1},
        },
        "test",
    )
    ex = Executor(Servable(cfg, Exits(exc)), cfg.instances, cpu_linear="torch")
    try:
        with pytest.raises(WarmupError) as info:
            ex.warmup()
    finally:
        ex.shutdown()
    assert str(info.value) == (
        f"model 'exits' failed: {type(exc).__name__}: {str(exc) or '(no message)'}; in the start-up warm-up, on a "
        "batch of zeros with input shapes 'X' [1, 2] on cpu (config: test)"
    )
    assert info.value.__cause__ is exc


class InterruptedAtTheThirdInstance(torch.nn.Linear):
    """A module whose second copy (Servable.module_for_instance copies it for each later instance on its device)
    raises KeyboardInterrupt once made, as the third instance reads its buffers: a Ctrl-C landing as that instance is
    built (the bench tools build executors on the main thread). Keeps weakrefs to its copies (`copies`) and, as it
    raises, to the instances built before it (`built`), read off the executor being built."""

    def __init__(self) -> None:
        super().__init__(2, 2)
        self.copies: list[weakref.ref] = []  # the original's lists, shared by its copies (deepcopy's memo)
        self.built: list[weakref.ref] = []
        self.interrupts = False

    def __deepcopy__(self, memo):
        copied = type(self).__new__(type(self))
        memo[id(self)] = copied
        memo[id(self.copies)], memo[id(self.built)] = self.copies, self.built
        for key, value in self.__dict__.items():
            copied.__dict__[key] = copy.deepcopy(value, memo)
        copied.__dict__["interrupts"] = len(self.copies) == 1
        self.copies.append(weakref.ref(copied))
        return copied

    def buffers(self, recurse: bool = True):
        if self.interrupts:
            frame = sys._getframe()
            while frame.f_code is not Executor.__init__.__code__:
                frame = frame.f_back
            self.built += [weakref.ref(inst) for inst in frame.f_locals["self"].instances]
            del frame
            raise KeyboardInterrupt
        return super().buffers(recurse)


def test_an_executor_failing_at_a_later_instance_shuts_down_and_lets_go_of_the_instances_it_built():
    """Nobody holds an executor whose construction raised: the instances built before the failing one were never
    shut down (their pools open, their worker threads idle, their fault states unstopped): now their threads are
    ended and joined; on CUDA their streams are made at construction too. And the error held them (its traceback's
    frames: the executor's `self`, the failing instance's), with the modules they run, a copy each for every later
    instance on a device (on CUDA, in device memory), for as long as a caller kept it (`wok serve` until it
    exits): now they can be collected while it is held."""
    import threading

    module = InterruptedAtTheThirdInstance()
    gc.collect()
    gc.disable()  # the instances are in reference cycles (their pools' initializers): collected below, not before
    try:
        with pytest.raises(KeyboardInterrupt) as info:
            Executor(_servable(module, "later"), InstanceConfig(count=3, devices=("cpu",)))
        built = [ref() for ref in module.built]
        assert len(built) == 2 and None not in built and len(module.copies) == 2
        assert not [t.name for t in threading.enumerate() if t.name.startswith("wok-later-")]
        for inst in built:
            with pytest.raises(RuntimeError, match=r"^cannot schedule new futures after shutdown$"):
                inst.submit([{"X": np.ones((1, 2), np.float32)}], [1], 0)
            assert inst.fault._stopped
        del built, inst
        gc.collect()
        assert info.value.__traceback__ is not None  # still held
        assert [ref() for ref in module.built] == [None, None]
        # The second instance's copy, and the third's, made before the interrupt.
        assert [ref() for ref in module.copies] == [None, None]
    finally:
        gc.enable()


# What a batch on CUDA calls that may reach the CUDA runtime (a servable's assemble grows pinned buffers).
CUDA_CALLS = {"_assemble", "Event", "stream", "record", "wait_event", "record_stream", "to", "forward", "copy_"}
CUDA_CALLS |= {"synchronize", "elapsed_time"}


def test_every_cuda_call_of_a_batch_is_made_under_its_instances_device():
    """An instance only on cuda:1 made a CUDA context on cuda:0 too (hundreds of MiB of a GPU it was not given):
    its batch was assembled, a pinned buffer growing (cudaHostAlloc), before the launch entered the instance's
    device, and waited for on the waiter thread, whose current device is cuda:0. Read from the code, as no machine
    here has two GPUs (test_executor_cuda.py runs it where one has): every such call of the methods that run a
    batch on CUDA is inside `with torch.cuda.device(self.device)`."""
    import ast
    import inspect
    import textwrap

    from wok.executor import Instance

    def outside(node: ast.AST, guarded: bool = False) -> list[str]:
        if isinstance(node, ast.With):
            guarded |= any(ast.unparse(i.context_expr) == "torch.cuda.device(self.device)" for i in node.items)
        called = isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in CUDA_CALLS
        found = [ast.unparse(node)] if called and not guarded else []
        return found + [call for child in ast.iter_child_nodes(node) for call in outside(child, guarded)]

    for method in (Instance._launch_live, Instance._cuda_batch, Instance._finish_cuda):
        tree = ast.parse(textwrap.dedent(inspect.getsource(method)))
        calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "attr", None) in CUDA_CALLS]
        assert calls and outside(tree) == [], method.__name__


def test_a_failed_models_line_shows_its_name_quoted_escaped_and_cut_as_every_other_line():
    """`failure_line` put the model's name in whole and raw: a name of 5,000 characters (a config's name has no length
    cap) filled the warm-up's refusal, cut at WARMUP_MESSAGE_BYTES before the model's own words; one holding a newline
    (a servable built in code) split the line. Shown as every other line shows a model's name (errors.quoted_name)."""
    from wok.config import model_config_from_dict
    from wok.executor import failure_line
    from wok.servable import Servable

    words = "ValueError: test: the model's own words"
    assert failure_line("m", ValueError("test: the model's own words")) == f"model 'm' failed: {words}"
    assert failure_line("a\nb'", ValueError("test: the model's own words")) == f"model 'a\\nb'' failed: {words}"
    cfg = model_config_from_dict(
        {
            "name": "m" * 5000,
            "platform": "python",
            "factory": "model:build",
            "inputs": [{"name": "X", "datatype": "FP32", "dims": [2]}],
            "outputs": [{"name": "Y", "datatype": "FP32", "dims": [2]}],
            "max_batch_size": 4,
            "instances": {"devices": ["cpu"], "pipeline_depth": 1},
        },
        "test",
    )
    ex = Executor(Servable(cfg, Exits(ValueError("test: the model's own words"))), cfg.instances, cpu_linear="torch")
    try:
        with pytest.raises(WarmupError) as info:
            ex.warmup()
    finally:
        ex.shutdown()
    assert str(info.value) == (
        f"model '{'m' * 200}'… (5,000 characters in all) failed: {words}; in the start-up warm-up, on a batch of "
        "zeros with input shapes 'X' [1, 2] on cpu (config: test)"
    )
