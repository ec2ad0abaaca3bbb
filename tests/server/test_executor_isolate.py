"""A batch the model fails is rerun in parts: the requests it fails on alone get the error, the
others their answers (server/executor.py, Instance._isolate).

GatedDouble (conftest) doubles its input and raises on a batch holding a NaN, as a model does on
a value one request carries (an id past an embedding's table).
"""

from __future__ import annotations

import sys
import types
import weakref

import numpy as np
import pytest
import torch
from torch import nn

from wok.config import InstanceConfig, model_config_from_dict
from wok.errors import InvalidInput, ModelExecutionError, WarmupError
from wok.executor import NOT_RERUN, PROBE_AFTER, Executor
from wok.servable import Servable

from .conftest import four_wide_config, gated_servable

NO_CUDA = "no CUDA device here; the CUDA path is checked on a GPU by bench/gpu_session.sh"


def requests(values):
    return [{"INPUT0": np.full((1, 4), v, np.float32)} for v in values]


def run(executor, reqs):
    return executor.instances[0].submit(reqs, [1] * len(reqs), 0).result(30)


@pytest.fixture
def cpu_executor():
    made = []

    def make(device="cpu", max_batch_size=8):
        s, m = gated_servable(max_batch_size=max_batch_size)
        ex = Executor(s, InstanceConfig(count=1, devices=(device,), pipeline_depth=1))
        made.append(ex)
        return ex, m

    yield make
    for ex in made:
        ex.shutdown()


def assert_answers(result, values):
    """Each request's outcome: 2x its value, or the error it fails with alone (a NaN)."""
    assert len(result.outputs) == len(values)
    for out, v in zip(result.outputs, values):
        if np.isnan(v):
            assert isinstance(out, ModelExecutionError), out
            assert str(out) == "model 'gated' failed: ValueError: NaN in batch (on this request alone)"
            assert isinstance(out.__cause__, ValueError)  # the model's own error, for the log's traceback
        else:
            np.testing.assert_array_equal(out["OUTPUT0"], np.full((1, 4), 2 * v, np.float32))


def test_one_bad_request_fails_alone_and_the_rest_of_its_batch_is_answered(cpu_executor):
    ex, m = cpu_executor()
    values = [1.0, 2.0, np.nan, 4.0, 5.0]
    result = run(ex, requests(values))
    assert isinstance(result.failure, ModelExecutionError)
    assert str(result.failure) == "model 'gated' failed: ValueError: NaN in batch"
    assert_answers(result, values)
    # The batch of 5, then halves [0:2] (answered) and [2:5] (fails), whose halves [2:3] (the
    # NaN, alone) and [3:5] (answered): four forwards after the first.
    assert m.batch_sizes == [5, 2, 3, 1, 2]
    assert result.reruns == 4
    assert result.times.compute > 0 and result.finished >= result.started


def test_two_bad_requests_in_different_halves_each_fail_alone(cpu_executor):
    ex, m = cpu_executor()
    values = [np.nan, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, np.nan]
    result = run(ex, requests(values))
    assert_answers(result, values)
    # 8 → 4 (fails) → 2 (fails) → 1 (NaN), 1 (ok); 2 (ok); 4 (fails) → 2 (ok); 2 (fails) → 1, 1.
    assert m.batch_sizes == [8, 4, 2, 1, 1, 2, 4, 2, 2, 1, 1]
    assert result.reruns == 10


def test_after_batches_failing_for_every_request_a_failed_batch_is_probed_before_it_is_rerun(cpu_executor):
    """A model failing every input: rerunning a batch of n costs 2n - 1 forwards, so after
    PROBE_AFTER such batches in a row a failed batch reruns its first and last request alone;
    both failing, the n - 2 between are rerun in parts within 1 + 2·ceil(log2(n - 2)) forwards (enough
    to find one bad request among them), and what that leaves undecided gets the batch's error. A
    client's bad requests may have filled those batches."""
    ex, m = cpu_executor()
    inst = ex.instances[0]

    def fail_every_request_twice():
        for k in range(PROBE_AFTER):
            m.batch_sizes.clear()
            result = run(ex, requests([np.nan] * 4))
            assert_answers(result, [np.nan] * 4)
            assert result.reruns == 2 * 4 - 2  # every part of every size, but the batch itself
            assert len(m.batch_sizes) == 2 * 4 - 1
            assert inst.all_failed_runs == k + 1
        m.batch_sizes.clear()

    fail_every_request_twice()
    result = run(ex, requests([np.nan] * 8))
    # The batch, its first and last request, then the six between in parts within 1 + 2·ceil(log2 6)
    # forwards: requests 1, 2, 3 are found failing alone, 4, 5, 6 (which fail together once) are
    # left with the batch's error.
    assert m.batch_sizes == [8, 1, 1, 6, 3, 1, 2, 1, 1, 3]
    assert result.reruns == 2 + 7
    alone = [o for i, o in enumerate(result.outputs) if i not in (4, 5, 6)]
    assert all(str(o).endswith("(on this request alone)") for o in alone), alone
    # Marked as the batch's, so that a client can tell it from an error its own request earned.
    left = result.outputs[4:7]
    assert all(str(o) == f"{result.failure} {NOT_RERUN}" and o.__cause__ is result.failure.__cause__ for o in left)
    assert inst.all_failed_runs == PROBE_AFTER + 1
    # Bad requests at both ends and one between: the rest is answered.
    m.batch_sizes.clear()
    values = [np.nan, 1.0, 2.0, np.nan, 3.0, np.nan]
    assert_answers(run(ex, requests(values)), values)
    assert m.batch_sizes == [6, 1, 1, 4, 2, 2, 1, 1]
    assert inst.all_failed_runs == 0
    # One bad request between failing ends is found wherever it lies, the rest answered (a budget
    # of 2·ceil(log2 n) ran out on this one, the three good requests after it left undecided).
    fail_every_request_twice()
    values = [np.nan, 1.0, np.nan, 2.0, 3.0, 4.0, 5.0, np.nan]
    assert_answers(run(ex, requests(values)), values)
    # A batch of two whose probes fail: nothing between them, each failed alone.
    fail_every_request_twice()
    result = run(ex, requests([np.nan, np.nan]))
    assert m.batch_sizes == [2, 1, 1]
    assert_answers(result, [np.nan, np.nan])
    assert inst.all_failed_runs == PROBE_AFTER + 1
    # A batch that succeeds ends the probing: a failed batch is rerun in halves again.
    run(ex, requests([1.0, 2.0]))
    assert inst.all_failed_runs == 0
    m.batch_sizes.clear()
    values = [np.nan, 1.0, 2.0, np.nan]
    assert_answers(run(ex, requests(values)), values)
    assert m.batch_sizes == [4, 2, 1, 1, 2, 1, 1]
    # The first request fails alone, the last is answered: the rest is rerun in parts.
    fail_every_request_twice()
    values = [np.nan, 1.0, 2.0, np.nan, 3.0, 4.0]
    result = run(ex, requests(values))
    assert m.batch_sizes == [6, 1, 1, 4, 2, 2, 1, 1]  # probes; then the four between them in parts
    assert_answers(result, values)
    assert inst.all_failed_runs == 0
    # Isolated as before: halves first.
    m.batch_sizes.clear()
    values = [1.0, np.nan, 2.0]
    assert_answers(run(ex, requests(values)), values)
    assert m.batch_sizes == [3, 1, 2, 1, 1]


def test_a_batch_of_one_request_fails_as_before_with_no_rerun(cpu_executor):
    ex, m = cpu_executor()
    with pytest.raises(ModelExecutionError, match=r"^model 'gated' failed: ValueError: NaN in batch$"):
        run(ex, requests([np.nan]))
    assert m.batch_sizes == [1]


def test_requests_of_several_rows_are_rerun_whole_never_split_between_parts(cpu_executor):
    ex, m = cpu_executor()
    reqs = [{"INPUT0": np.full((3, 4), v, np.float32)} for v in (1.0, 2.0, 3.0)]
    reqs[1]["INPUT0"][2, 0] = np.nan
    result = ex.instances[0].submit(reqs, [3, 3, 3], 0).result(30)
    assert m.batch_sizes == [9, 3, 6, 3, 3]
    assert isinstance(result.outputs[1], ModelExecutionError)
    np.testing.assert_array_equal(result.outputs[0]["OUTPUT0"], np.full((3, 4), 2.0, np.float32))
    np.testing.assert_array_equal(result.outputs[2]["OUTPUT0"], np.full((3, 4), 6.0, np.float32))


# Rows of one request whose batch no allocator gives buffers for (2**60 B of float32 x 4: past any address space, so
# refused where the kernel grants every allocation too, overcommit_memory=1, which would grant 16 TiB, then have it
# written): its input is a view of one value (no memory of its own), as no decoded request could be, so that the
# allocation refused is the batch's.
HUGE_ROWS = 1 << 56


CUDA = pytest.param("cuda:0", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA))


@pytest.mark.parametrize("device", ["cpu", CUDA])
@pytest.mark.parametrize("where", [0, 1, 2])
def test_a_batch_whose_buffers_cannot_grow_is_rerun_in_parts_and_the_request_too_large_fails_alone(
    cpu_executor, device, where
):
    """The host buffers a batch is assembled in (pinned on CUDA) grow to the largest batch yet; one they cannot grow
    for (its memory refused) failed whole, every request with the allocator's error, where the requests that fit
    were answerable: rerun in parts as for a model's failure, the parts fit the buffers there are, and the request
    too large alone fails alone."""
    ex, m = cpu_executor(device=device)
    reqs = requests([1.0, 2.0])
    reqs.insert(where, {"INPUT0": np.broadcast_to(np.float32(3.0), (HUGE_ROWS, 4))})
    rows = [1, 1]
    rows.insert(where, HUGE_ROWS)
    values: list[float | None] = [1.0, 2.0]
    values.insert(where, None)
    result = ex.instances[0].submit(reqs, rows, 0).result(30)
    assert isinstance(result.failure, ModelExecutionError)
    for out, v in zip(result.outputs, values, strict=True):
        if v is None:
            assert isinstance(out, ModelExecutionError), out
            assert str(out).startswith("model 'gated' failed: "), out  # the allocator's error, as the batch's was
            assert str(out).endswith("(on this request alone)"), out
            assert isinstance(out.__cause__, (MemoryError, RuntimeError))  # the allocator's, for the log's traceback
        else:
            np.testing.assert_array_equal(out["OUTPUT0"], np.full((1, 4), 2 * v, np.float32))
    assert sum(m.batch_sizes) == 2  # each request that fits ran once, the one too large never


class HugeAnswerOnThree(nn.Module):
    """Doubles; raises on a batch holding a NaN; a batch holding a 3 gets an answer no allocator gives memory for
    (its rows of HUGE_ROWS values, a view of one value each): refused as it is copied to the host, as a request's
    too large answer is."""

    def __init__(self) -> None:
        super().__init__()
        self.batch_sizes: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.batch_sizes.append(int(x.shape[0]))
        if torch.isnan(x).any():
            raise ValueError("NaN in batch")
        if (x == 3.0).any():
            return (2 * x[:, :1]).expand(x.shape[0], HUGE_ROWS)
        return 2 * x


@pytest.mark.parametrize("device", ["cpu", CUDA])
@pytest.mark.parametrize(
    ("values", "sizes"), [([1.0, 3.0, 2.0], [3, 1, 2, 1, 1]), ([1.0, np.nan, 3.0, 4.0], [4, 2, 1, 1, 2, 1, 1])]
)
def test_a_part_whose_answers_cannot_be_copied_out_is_rerun_in_parts_and_the_request_too_large_fails_alone(
    values, sizes, device
):
    """A batch's answers copied to the host (a copy refused: MemoryError) failed the whole batch, and a part's of a
    failed batch every part not yet run, where smaller parts copy less: rerun in parts as for a model's failure,
    the request whose answer is too large alone fails alone, the others are answered. On CUDA the slot's pinned
    buffer for the answers is refused as the batch is launched, and a part's copy (.cpu()) as it is run."""
    cfg = model_config_from_dict(
        {
            "name": "huge",
            "platform": "python",
            "factory": "tests:unused",
            "inputs": [{"name": "INPUT0", "datatype": "FP32", "dims": [4]}],
            "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "dims": [-1]}],
            "max_batch_size": 8,
        },
        "test",
    )
    m = HugeAnswerOnThree()
    ex = Executor(Servable(cfg, m), InstanceConfig(count=1, devices=(device,), pipeline_depth=1))
    try:
        result = run(ex, requests(values))
    finally:
        ex.shutdown()
    assert isinstance(result.failure, ModelExecutionError)
    for out, v in zip(result.outputs, values, strict=True):
        if np.isnan(v):
            assert str(out) == "model 'huge' failed: ValueError: NaN in batch (on this request alone)", out
        elif v == 3.0:
            assert isinstance(out, ModelExecutionError), out
            assert str(out).startswith("model 'huge' failed: "), out  # the allocator's error, as the batch's was
            assert str(out).endswith("(on this request alone)"), out
            # numpy's (torch's allocators' on CUDA), for the log's traceback
            assert isinstance(out.__cause__, MemoryError if device == "cpu" else (MemoryError, RuntimeError))
        else:
            np.testing.assert_array_equal(out["OUTPUT0"], np.full((1, 4), 2 * v, np.float32))
    assert m.batch_sizes == sizes


class KeepsItsOutput(nn.Module):
    """Doubles into a tensor it keeps, made anew only when the batch size changes; raises on a NaN."""

    def __init__(self) -> None:
        super().__init__()
        self.out = torch.empty(0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.isnan(x).any():
            raise ValueError("NaN in batch")
        if self.out.shape != x.shape:
            self.out = torch.empty_like(x)
        return torch.mul(x, 2, out=self.out)


def test_a_model_that_keeps_its_output_gives_each_part_its_own_answers():
    """Two parts of one size: the second writes the tensor the first's answers are in. The module's
    storages are noted only at a batch larger than any before (8 here), so those parts' were not."""
    ex = Executor(Servable(four_wide_config("keeps"), KeepsItsOutput()), InstanceConfig(count=1, devices=("cpu",)))
    try:
        ex.warmup()
        run(ex, requests([0.0] * 8))
        values = [1.0, 2.0, np.nan, 4.0, 5.0]  # parts [1, 2] and [4, 5] are both of 2 rows
        result = run(ex, requests(values))
        for out, v in zip(result.outputs, values):
            if not np.isnan(v):
                np.testing.assert_array_equal(out["OUTPUT0"], np.full((1, 4), 2 * v, np.float32))
    finally:
        ex.shutdown()


class NoBatches(nn.Module):
    """Fails any batch of more than one row: a model that cannot batch, served with a max batch above 1."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > 1:
            raise RuntimeError(f"expected a batch of 1, got {x.shape[0]}")
        return self.fc(x)


def test_a_warm_up_batch_that_fails_whole_fails_the_start_though_its_parts_succeed():
    """Rerun in parts, each single row succeeds: the warm-up must still fail, as the batch did."""
    cfg = four_wide_config("nobatch")
    ex = Executor(Servable(cfg, NoBatches()), InstanceConfig(count=1, devices=("cpu",), pipeline_depth=1))
    try:
        assert ex.instances[0].onednn_layers  # its warm-up runs batches of several rows
        with pytest.raises(WarmupError, match=r"^model 'nobatch' failed: RuntimeError: expected a batch of 1, got "):
            ex.warmup()
    finally:
        ex.shutdown()


@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)
def test_cuda_one_bad_request_fails_alone_and_the_rest_of_its_batch_is_answered(cpu_executor):
    """On CUDA a batch that raised as it was launched (GatedDouble checks on the host, in forward)."""
    ex, m = cpu_executor(device="cuda:0")
    values = [1.0, 2.0, np.nan, 4.0, 5.0]
    result = run(ex, requests(values))
    assert_answers(result, values)
    assert m.batch_sizes == [5, 2, 3, 1, 2]
    # The instance keeps serving on its streams.
    result = run(ex, requests([3.0, 4.0]))
    assert result.failure is None and result.events is not None
    assert_answers(result, [3.0, 4.0])


class DropsNaN(nn.Module):
    """Doubles its input, leaving out the rows holding a NaN: a row count that depends on one request's values."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[~torch.isnan(x).any(1)] * 2


@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)
def test_cuda_a_request_whose_values_make_the_model_answer_too_few_rows_fails_alone():
    """The output's shape was checked only as the batch was waited for (its split), past the point where
    a failed batch is rerun in parts: every request of the batch failed, where on the CPU only the
    request with the NaN does. Shapes are known as the batch is launched, and checked there."""
    s = Servable(four_wide_config("drops"), DropsNaN())
    ex = Executor(s, InstanceConfig(count=1, devices=("cuda:0",), pipeline_depth=1))
    try:
        result = run(ex, requests([1.0, 2.0, np.nan, 4.0, 5.0]))
        assert result.failure is not None
        for out, v in zip(result.outputs, [1.0, 2.0, np.nan, 4.0, 5.0], strict=True):
            if np.isnan(v):
                assert str(out) == (
                    "model 'drops' output 'OUTPUT0': expected 1 row, one per sample; got shape [0, 4] "
                    "(on this request alone)"
                )
            else:
                np.testing.assert_array_equal(out["OUTPUT0"], np.full((1, 4), 2 * v, np.float32))
    finally:
        ex.shutdown()


def test_a_device_error_is_told_by_its_type_or_by_older_torchs_message():
    from wok.executor import _is_device_error

    assert _is_device_error(RuntimeError("CUDA error: device-side assert triggered"))
    assert not _is_device_error(RuntimeError("index out of range in self"))
    assert not _is_device_error(ValueError("CUDA error: not a RuntimeError"))
    if hasattr(torch, "AcceleratorError"):
        assert _is_device_error(torch.AcceleratorError("an illegal memory access was encountered"))


def run_alone(m: nn.Module, name: str, values, device: str = "cpu"):
    """`values`' requests run as one batch by a model of `m` on `device`, on an executor of its own."""
    ex = Executor(Servable(four_wide_config(name), m), InstanceConfig(count=1, devices=(device,), pipeline_depth=1))
    try:
        return run(ex, requests(values))
    finally:
        ex.shutdown()


class CountsAlive(nn.Module):
    """`made`: a weak reference to each tensor `noted`; `alive`: how many of them were alive as each batch or part
    `began`."""

    def __init__(self) -> None:
        super().__init__()
        self.made: list[weakref.ref] = []
        self.alive: list[int] = []

    def began(self) -> None:
        self.alive.append(sum(r() is not None for r in self.made))

    def noted(self, t: torch.Tensor) -> torch.Tensor:
        self.made.append(weakref.ref(t))
        return t


class MakesThenFails(CountsAlive):
    """Doubles; a batch holding a NaN makes a tensor on its device before it raises, as a forward that runs out of
    memory has made its activations (`made`). It raises a new ValueError, or the one `kept` each time, whose traceback
    Python lets grow: each raise's entries go in front of those the error has."""

    def __init__(self, kept: ValueError | None = None) -> None:
        super().__init__()
        self.kept = kept

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.began()
        if torch.isnan(x).any():
            activations = self.noted(torch.empty(1 << 16, device=x.device))  # noqa: F841 (held by this frame)
            raise self.kept or ValueError("NaN in batch")
        return 2 * x


@pytest.mark.parametrize("device", ["cpu", CUDA])
def test_what_a_failed_forward_made_is_freed_before_its_parts_run(device):
    """Its error's traceback held the failed forward's frames, and so what it had made, while its parts ran: a batch
    that ran out of memory left its halves less memory than it had, and they failed too (on CUDA the batch's device
    inputs were held as well)."""
    m = MakesThenFails()
    result = run_alone(m, "makes", [1.0, np.nan, 2.0, 3.0], device)
    assert str(result.outputs[1]) == "model 'makes' failed: ValueError: NaN in batch (on this request alone)"
    assert len(m.made) == 3  # the batch, its half [1, nan], the nan alone
    assert m.alive == [0] * 5, m.alive  # the batch, [1, nan], [1], [nan], [2, 3]


class RefusesNegative(Servable):
    """A servable whose own assemble refuses a request holding a negative value (InvalidInput: the client's)."""

    def assemble(self, requests, rows, buffers):
        if any(bool((r["INPUT0"] < 0).any()) for r in requests):
            raise InvalidInput("model 'refuse': input 'INPUT0' holds a negative value; expected 0 or more")
        return super().assemble(requests, rows, buffers)


class RaisesInvalidInput(nn.Module):
    """A python model whose forward raises wok's InvalidInput on a negative value: the model's failure, not a
    refusal of the client's values (those are refused before a batch forms, or by a servable's assemble)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if bool((x < 0).any()):
            raise InvalidInput("negative value")
        return 2 * x


@pytest.mark.parametrize("device", ["cpu", CUDA])
def test_an_invalid_input_of_assemble_is_the_clients_and_one_of_a_forward_the_models(device):
    """On CUDA as on the CPU (d241c8a, f782fa3): a request a servable's assemble refuses fails alone with that
    InvalidInput (INVALID_ARGUMENT), the rest answered; an InvalidInput a forward raises is the model's failure."""
    values = [1.0, -1.0, 2.0]
    refusing = RefusesNegative(four_wide_config("refuse"), nn.Identity())
    raising = Servable(four_wide_config("raises"), RaisesInvalidInput())
    results = []
    for s in (refusing, raising):
        ex = Executor(s, InstanceConfig(count=1, devices=(device,), pipeline_depth=1))
        try:
            results.append(run(ex, requests(values)))
        finally:
            ex.shutdown()
    refused, raised = results
    assert type(refused.outputs[1]) is InvalidInput
    assert str(refused.outputs[1]) == "model 'refuse': input 'INPUT0' holds a negative value; expected 0 or more"
    assert type(raised.outputs[1]) is ModelExecutionError
    assert str(raised.outputs[1]) == "model 'raises' failed: InvalidInput: negative value (on this request alone)"
    for result, factor in ((refused, 1.0), (raised, 2.0)):
        for i in (0, 2):
            np.testing.assert_array_equal(result.outputs[i]["OUTPUT0"], np.full((1, 4), factor * values[i], np.float32))


class ChecksThroughAGenerator(nn.Module):
    """Doubles; its values checked by a generator it keeps for its life, which catches the error it finds and yields
    it for forward to raise: that error's traceback runs through the generator's frame, suspended at its yield."""

    def __init__(self) -> None:
        super().__init__()
        self.checks = self._checks()
        next(self.checks)

    @staticmethod
    def _checks():
        x = yield None
        while True:
            try:
                if torch.isnan(x).any():
                    raise ValueError("NaN in batch")
                found = None
            except ValueError as exc:
                found = exc
            x = yield found

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        found = self.checks.send(x)
        if found is not None:
            raise found
        return 2 * x


@pytest.mark.parametrize("device", ["cpu", CUDA])
def test_a_generator_the_model_keeps_is_not_closed_as_its_failed_batchs_frames_are_cleared(device):
    """Clearing the failed batch's frames cleared its error's suspended generator frame too, which (Python before
    3.13) closed the generator: every part then failed on it (StopIteration), the requests it would have answered
    too."""
    m = ChecksThroughAGenerator()
    values = [1.0, np.nan, 2.0, 3.0]
    result = run_alone(m, "checks", values, device)
    assert str(result.outputs[1]) == "model 'checks' failed: ValueError: NaN in batch (on this request alone)"
    for i in (0, 2, 3):
        np.testing.assert_array_equal(result.outputs[i]["OUTPUT0"], np.full((1, 4), 2 * values[i], np.float32))
    assert m.checks.gi_frame is not None  # still open


@pytest.mark.parametrize("values", [[np.nan], [1.0, np.nan, 2.0]], ids=["alone", "rerun"])
def test_an_error_raised_again_has_only_its_new_frames_cleared(values):
    """A model raising one error object for every failed batch: clearing its traceback walked it to its end, every
    earlier raise's frames again, so that each failed batch took longer than the last (11 ms a batch of one after
    8,000). Counted: the frames cleared (frame.clear() called) for each batch, on the worker thread."""
    m = MakesThenFails(kept=ValueError("NaN in batch"))
    ex = Executor(Servable(four_wide_config("again"), m), InstanceConfig(count=1, devices=("cpu",), pipeline_depth=1))
    clears: list[int] = []

    def count(frame, event, arg) -> None:
        if event == "c_call" and isinstance(getattr(arg, "__self__", None), types.FrameType):
            clears[-1] += arg.__name__ == "clear"

    try:
        inst = ex.instances[0]
        inst._worker.submit(sys.setprofile, count).result(30)
        for _ in range(6):
            clears.append(0)
            future = inst.submit(requests(values), [1] * len(values), 0)
            if len(values) == 1:
                assert str(future.exception(30)) == "model 'again' failed: ValueError: NaN in batch"
            else:
                assert str(future.result(30).outputs[1]).endswith("NaN in batch (on this request alone)")
        inst._worker.submit(sys.setprofile, None).result(30)
    finally:
        ex.shutdown()
    # The first batch's may differ: the error keeps the context of its last raise (in a part: that part's error).
    assert clears[0] > 0 and clears[1:] == [clears[1]] * 5, clears
    # Each raise's own frames still cleared: no failed forward's tensor alive as the next forward began.
    assert m.alive == [0] * len(m.alive), m.alive


class KeepsItsAnswers(CountsAlive):
    """Doubles; a batch holding a 3 gets an answer no allocator gives memory for (HugeAnswerOnThree), refused as it
    is copied to the host. Each answer is `made`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.began()
        return self.noted((2 * x[:, :1]).expand(x.shape[0], HUGE_ROWS) if (x == 3.0).any() else 2 * x)


def test_a_batchs_answers_refused_their_copy_are_freed_before_its_parts_run():
    """The batch's answers, whose copy to the host was refused, stayed referred to while its parts ran, which then
    had less host memory than the batch had."""
    m = KeepsItsAnswers()
    result = run_alone(m, "keeps", [1.0, 3.0, 2.0])
    assert str(result.outputs[1]).endswith("(on this request alone)"), result.outputs[1]
    assert m.alive == [0] * 5, m.alive  # the batch, [1], [3, 2], [3], [2]
