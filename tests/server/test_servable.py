"""A model's outputs against its config's datatypes: precision casts pass, lossy ones fail the batch.

Checked on `Servable.forward` directly, in the start-up warm-up (a model that cannot start), and
through a real server on loopback (a request whose batch fails, and the server goes on).
"""

from __future__ import annotations

import textwrap
import threading
from pathlib import Path

import grpc
import numpy as np
import pytest
import torch
from torch import nn

from wok.codec import decode_response, encode_request
from wok.config import model_config_from_dict
from wok.errors import ModelExecutionError
from wok.executor import Executor
from wok.servable import Servable
from wok.v2pb import grpc_service_pb2_grpc as pb_grpc

CPU = torch.device("cpu")


class Returns(nn.Module):
    """Returns its input as `dtype`."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.dtype = dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x * 1.5).to(self.dtype)


def servable(module: nn.Module, out_datatype: str, source: str = "test") -> Servable:
    cfg = model_config_from_dict(
        {
            "name": "m",
            "platform": "python",
            "factory": "tests:unused",
            "inputs": [{"name": "x", "datatype": "FP32", "dims": [2]}],
            "outputs": [{"name": "y", "datatype": out_datatype, "dims": [2]}],
            "max_batch_size": 4,
            "instances": {"devices": ["cpu"], "pipeline_depth": 1},
        },
        source,
    )
    return Servable(cfg, module)


def forward(s: Servable, x: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return s.forward(s.module_for(CPU), {"x": x})["y"]


@pytest.mark.parametrize(
    ("model_dtype", "datatype", "want"),
    [
        (torch.float16, "FP32", torch.float32),  # precision casts: an fp16/bf16 model behind an FP32 config
        (torch.bfloat16, "FP32", torch.float32),
        (torch.float64, "FP32", torch.float32),
        (torch.float32, "FP16", torch.float16),
        (torch.int32, "INT64", torch.int64),  # integers into a type that holds every value of theirs
        (torch.uint8, "INT16", torch.int16),
        (torch.int16, "FP32", torch.float32),
        (torch.int32, "FP64", torch.float64),
        (torch.uint8, "BF16", torch.bfloat16),
        (torch.bool, "INT64", torch.int64),
        (torch.bool, "FP16", torch.float16),
    ],
)
def test_an_output_that_casts_without_loss_is_cast_to_the_config_datatype(model_dtype, datatype, want):
    out = forward(servable(Returns(model_dtype), datatype), torch.ones(3, 2))
    assert out.dtype == want and out.shape == (3, 2)


@pytest.mark.parametrize(
    ("model_dtype", "datatype"),
    [
        (torch.float32, "INT64"),  # fractions dropped
        (torch.float32, "BOOL"),
        (torch.int32, "BOOL"),
        (torch.int64, "INT8"),  # values wrapped: 300 would be 44
        (torch.int64, "INT32"),
        (torch.int32, "UINT8"),  # -1 would be 255
        (torch.int8, "UINT8"),
        (torch.uint64, "INT64"),
        (torch.int64, "FP32"),  # values rounded: above 2**24 (2**53 for FP64) a float skips integers
        (torch.int64, "FP64"),
        (torch.int16, "FP16"),
        (torch.int16, "BF16"),
    ],
)
def test_an_output_that_would_be_truncated_fails_the_batch_naming_model_output_and_both_types(model_dtype, datatype):
    s = servable(Returns(model_dtype), datatype)
    for _ in range(2):  # the second batch takes the cached decision
        with pytest.raises(ModelExecutionError) as info:
            forward(s, torch.ones(3, 2))
        assert str(info.value) == (
            f"model 'm' output 'y': expected {datatype}, as its config declares, or a dtype that casts to it without "
            f"loss; got {model_dtype}"
        )


def test_a_model_whose_output_cannot_take_its_config_datatype_fails_the_start_up_warm_up(tmp_path):
    source = str(tmp_path / "m" / "config.toml")
    s = servable(Returns(torch.float32), "INT64", source)
    ex = Executor(s, s.config.instances)
    try:
        with pytest.raises(ModelExecutionError) as info:
            ex.warmup()
    finally:
        ex.shutdown()
    msg = str(info.value)
    assert "\n" not in msg
    assert "model 'm' output 'y': expected INT64, as its config declares, or a dtype that casts to it" in msg
    assert "; got torch.float32;" in msg
    assert f"in the start-up warm-up, on a batch of zeros with input shapes 'x' [1, 2] on cpu (config: {source})" in msg
    assert "warmup_dims" not in msg  # the zeros' sizes are not what failed


def test_a_model_whose_integer_output_would_wrap_in_its_config_datatype_fails_the_warm_up_on_zeros():
    # The warm-up's zeros fit INT8; the check is on the types, so the start fails all the same.
    s = servable(Returns(torch.int64), "INT8")
    ex = Executor(s, s.config.instances)
    try:
        with pytest.raises(
            ModelExecutionError, match=r"output 'y': expected INT8, as its config declares, .*; got torch.int64"
        ):
            ex.warmup()
    finally:
        ex.shutdown()


def test_integer_outputs_are_never_wrapped_or_rounded():
    values = torch.tensor([[300, -200], [128, 2**40], [2**24 + 1, 5]])

    class Passes(nn.Module):
        def forward(self, x):
            return values[: x.shape[0]]

    for datatype in ("INT8", "INT16", "INT32", "UINT8", "FP32", "FP16", "BF16"):
        with pytest.raises(ModelExecutionError, match=r"or a dtype that casts to it without loss; got torch\.int64"):
            forward(servable(Passes(), datatype), torch.ones(3, 2))
    assert forward(servable(Passes(), "INT64"), torch.ones(3, 2)).tolist() == values.tolist()


# Integers for the warm-up's zeros, floats for anything else: it starts, then a request fails.
FLOATS_ON_NONZERO = textwrap.dedent(
    """
    import torch
    from torch import nn


    class FloatsOnNonZero(nn.Module):
        def forward(self, x):
            return x if bool(x.any()) else x.long()


    def build():
        return FloatsOnNonZero()
    """
)


def python_model_repository(tmp_path: Path, source: str, out_datatype: str) -> Path:
    """A repository of one model 'm' built by `source`'s build(): FP32 input 'x' and output 'y' (`out_datatype`),
    both of dims [2], batched up to 4, on the CPU."""
    d = tmp_path / "repo" / "m"
    d.mkdir(parents=True)
    (d / "model.py").write_text(source)
    (d / "config.toml").write_text(
        textwrap.dedent(
            f"""
            platform = "python"
            factory = "model:build"
            max_batch_size = 4

            [[inputs]]
            name = "x"
            datatype = "FP32"
            dims = [2]

            [[outputs]]
            name = "y"
            datatype = "{out_datatype}"
            dims = [2]

            [dynamic_batching]
            max_queue_delay_ms = 0.0

            [instances]
            devices = ["cpu"]
            """
        )
    )
    return tmp_path / "repo"


async def test_a_request_whose_output_cannot_take_its_config_datatype_fails_and_the_server_goes_on(tmp_path, serve):
    async with serve(repository=python_model_repository(tmp_path, FLOATS_ON_NONZERO, "INT64")) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            stub = pb_grpc.GRPCInferenceServiceStub(ch)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.ModelInfer(encode_request("m", {"x": np.ones((1, 2), np.float32)}), timeout=30)
            assert info.value.code() == grpc.StatusCode.INTERNAL
            assert info.value.details() == (
                "model 'm' output 'y': expected INT64, as its config declares, or a dtype that casts to it without "
                "loss; got torch.float32"
            )
            resp = await stub.ModelInfer(encode_request("m", {"x": np.zeros((1, 2), np.float32)}), timeout=30)
    out = decode_response(resp)["y"]
    assert out.dtype == np.int64 and out.tolist() == [[0, 0]]


class ReturnsACount(nn.Module):
    """Answers its scores and a plain int where the config declares a second tensor."""

    def forward(self, x: torch.Tensor):
        return x * 2.0, 3


def servable_with_count(source: str = "test") -> Servable:
    cfg = model_config_from_dict(
        {
            "name": "m",
            "platform": "python",
            "factory": "tests:unused",
            "inputs": [{"name": "x", "datatype": "FP32", "dims": [-1]}],  # variable: the warm-up could hint
            "outputs": [
                {"name": "score", "datatype": "FP32", "dims": [-1]},
                {"name": "count", "datatype": "INT64", "dims": [1]},
            ],
            "max_batch_size": 4,
            "instances": {"devices": ["cpu"], "pipeline_depth": 1},
        },
        source,
    )
    return Servable(cfg, ReturnsACount())


def test_an_output_that_is_no_tensor_fails_the_batch_naming_the_output_and_its_type():
    # It was AttributeError: 'int' object has no attribute 'dtype'.
    s = servable_with_count()
    with pytest.raises(ModelExecutionError) as info, torch.inference_mode():
        s.forward(s.module_for(CPU), {"x": torch.ones(2, 3)})
    assert str(info.value) == "model 'm' output 'count': expected a torch.Tensor; got int"


class AnswersDict(nn.Module):
    def __init__(self, keys) -> None:
        super().__init__()
        self.keys = keys

    def forward(self, x: torch.Tensor) -> dict:
        return {k: x for k in self.keys}


@pytest.mark.parametrize(
    ("keys", "shown"),
    [
        (["Y"], "'Y'"),
        ([], "none"),
        (list(range(10)), "0, 1, 2, 3, 4, 5, 6, 7 and 2 more"),
        (["a\nb"], "'a\\nb'"),
        ([("k",) * 100], repr(("k",) * 100)[:200] + "…"),  # cut at 200 characters
    ],
    ids=["misspelt", "empty", "many", "newline", "long"],
)
def test_a_dict_missing_an_output_fails_the_batch_naming_the_output_and_the_keys_it_had(keys, shown):
    # It said "returned no output named ['y']", not what the model answered instead.
    s = servable(AnswersDict(keys), "FP32")
    with pytest.raises(ModelExecutionError) as info:
        forward(s, torch.ones(2, 2))
    assert str(info.value) == f"model 'm': expected a dict with an output named 'y'; got one without, its keys: {shown}"


class Densely(nn.Module):
    """Doubles its input, answering it in another layout than a dense tensor's."""

    def __init__(self, to) -> None:
        super().__init__()
        self.to_layout = to

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.to_layout(x * 2)


@pytest.mark.parametrize(
    ("to", "layout"),
    [
        (torch.Tensor.to_sparse, "sparse_coo"),
        (torch.Tensor.to_sparse_csr, "sparse_csr"),
        (torch.Tensor.to_mkldnn, "_mkldnn"),
        (lambda y: torch.nested.as_nested_tensor(list(y)), "nested"),
    ],
)
@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype stage")
@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta state")
def test_an_output_that_is_no_dense_tensor_fails_the_batch_naming_the_output_and_its_layout(to, layout):
    # It got past this check and failed in the split as "NotImplementedError: Cannot access storage of
    # SparseTensorImpl" (or "Internal error: NestedTensorImpl doesn't support sizes"), naming no output,
    # and not as the model's answer: the batch was not rerun in parts.
    s = servable(Densely(to), "FP32")
    with pytest.raises(ModelExecutionError) as info:
        forward(s, torch.ones(2, 2))
    assert str(info.value) == f"model 'm' output 'y': expected a dense (strided) torch.Tensor; got a {layout} tensor"


class OnMeta(nn.Module):
    """Answers a tensor of its output's shape on the meta device: a shape, no values."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(x, device="meta")


def test_an_output_on_the_meta_device_fails_the_batch_naming_the_output_and_the_device():
    # It failed in the split as "can't convert meta device type tensor to numpy. Use Tensor.cpu() to copy
    # the tensor to host memory first.", naming no output, with advice that cannot work.
    s = servable(OnMeta(), "FP32")
    with pytest.raises(ModelExecutionError) as info:
        forward(s, torch.ones(2, 2))
    assert str(info.value) == (
        "model 'm' output 'y': expected a torch.Tensor with data; got one on the meta device, which holds no values"
    )


class NegatedView(nn.Module):
    """Answers -x as the imaginary part of a conjugate: a view with torch's negative bit set."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.complex(x, x).conj().imag


@pytest.mark.parametrize("datatype", ["FP32", "FP64"])
def test_an_output_with_the_negative_bit_set_is_answered_with_its_values(datatype):
    x = torch.tensor([[1.5, -2.0], [0.0, 3.0]])
    assert NegatedView()(x).is_neg()
    out = forward(servable(NegatedView(), datatype), x)
    assert not out.is_neg() and out.numpy().tolist() == (-x).tolist()


def test_a_conjugate_output_is_complex_and_refused_as_a_lossy_cast_naming_the_output():
    class Conjugate(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.complex(x, x).conj()

    with pytest.raises(ModelExecutionError) as info:
        forward(servable(Conjugate(), "FP32"), torch.ones(2, 2))
    assert str(info.value) == (
        "model 'm' output 'y': expected FP32, as its config declares, or a dtype that casts to it without loss; got "
        "torch.complex64"
    )


@pytest.mark.parametrize(("total", "rows"), [(1, "1 row"), (2, "2 rows")])
def test_a_wrong_row_count_names_the_rows_expected_in_good_grammar(total, rows):
    s = servable(Returns(torch.float32), "FP32")
    with pytest.raises(ModelExecutionError) as info:
        s.check_shapes({"y": [total + 1, 2]}, total)
    assert str(info.value) == f"model 'm' output 'y': expected {rows}, one per sample; got shape [{total + 1}, 2]"
    with pytest.raises(ModelExecutionError) as info:
        s.check_shapes({"y": [total, 3]}, total)
    assert str(info.value) == (
        f"model 'm' output 'y': expected shape [{total}, 2], as its config declares ({rows}; -1 = any size); got "
        f"[{total}, 3]"
    )


class Answers(nn.Module):
    """Answers what it was built with, whatever its input."""

    def __init__(self, answer) -> None:
        super().__init__()
        self.answer = answer

    def forward(self, x: torch.Tensor):
        return self.answer


@pytest.mark.parametrize(
    ("answer", "got"),
    [
        (torch.ones(2, 3), "1 output (a tensor)"),
        ((torch.ones(2, 3),), "1 output (a tuple)"),
        ([], "0 outputs (a list)"),
        ((torch.ones(2, 3),) * 3, "3 outputs (a tuple)"),
    ],
    ids=["tensor", "tuple of 1", "none", "3"],
)
def test_a_wrong_output_count_names_what_was_returned_and_what_the_config_declares(answer, got):
    # It said "returned 1 outputs, config declares 2": "1 outputs", and neither which outputs nor what it returned.
    s = servable_with_count()
    with pytest.raises(ModelExecutionError) as info, torch.inference_mode():
        s.forward(Answers(answer), {"x": torch.ones(2, 3)})
    assert str(info.value) == (
        f"model 'm': expected 2 outputs in its result, one per output its config declares: 'score', 'count'; got {got}"
    )


NEG_OR_META = textwrap.dedent(
    """
    import torch
    from torch import nn


    class NegOrMeta(nn.Module):
        # Zeros (the warm-up's) as they are; a positive sum as -x, a negative-bit view; a negative
        # sum as a meta tensor.
        def forward(self, x):
            s = float(x.sum())
            if s > 0:
                return torch.complex(x, x).conj().imag
            if s < 0:
                return torch.empty_like(x, device="meta")
            return x


    def build():
        return NegOrMeta()
    """
)


async def test_a_negative_bit_output_is_answered_and_a_meta_one_refused_by_name_through_the_server(tmp_path, serve):
    async with serve(repository=python_model_repository(tmp_path, NEG_OR_META, "FP32")) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            stub = pb_grpc.GRPCInferenceServiceStub(ch)
            x = np.array([[1.5, -0.5]], np.float32)
            resp = await stub.ModelInfer(encode_request("m", {"x": x}), timeout=30)
            assert decode_response(resp)["y"].tolist() == (-x).tolist()
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.ModelInfer(encode_request("m", {"x": -np.ones((1, 2), np.float32)}), timeout=30)
            assert info.value.code() == grpc.StatusCode.INTERNAL
            assert info.value.details() == (
                "model 'm' output 'y': expected a torch.Tensor with data; got one on the meta device, which holds no "
                "values"
            )
            resp = await stub.ModelInfer(encode_request("m", {"x": np.zeros((1, 2), np.float32)}), timeout=30)
    assert decode_response(resp)["y"].tolist() == [[0.0, 0.0]]


def test_an_output_that_is_no_tensor_fails_the_warm_up_without_a_warmup_dims_hint(tmp_path):
    # wok's own check of the answer failed, not the model on the zeros' sizes: no hint to change them.
    source = str(tmp_path / "m" / "config.toml")
    s = servable_with_count(source)
    ex = Executor(s, s.config.instances)
    try:
        with pytest.raises(ModelExecutionError) as info:
            ex.warmup()
    finally:
        ex.shutdown()
    assert str(info.value) == (
        "model 'm' output 'count': expected a torch.Tensor; got int; in the "
        f"start-up warm-up, on a batch of zeros with input shapes 'x' [1, 1] on cpu (config: {source})"
    )


class Locked(nn.Module):
    """A model holding a lock (a cache's, a tokenizer's): copy.deepcopy cannot copy it."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(2, 2)
        self.lock = threading.Lock()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with self.lock:
            return self.fc(x)


META = torch.device("meta")  # a second device on a machine with none: parameters without storage


def test_the_first_device_takes_the_module_itself_and_a_later_one_a_copy():
    module = nn.Linear(2, 2)
    s = servable(module, "FP32")
    assert s.module_for(CPU) is module
    copied = s.module_for(META)
    assert copied is not module and copied.weight.device == META
    assert module.weight.device == CPU  # the first device's module is left where it is
    assert s.module_for(META) is copied and s.module_for(CPU) is module


def test_a_module_that_cannot_be_copied_is_served_on_its_first_device_whichever_that_is():
    # On CUDA: module_for copied for every device but the CPU, so a model holding a lock could not be
    # served on a GPU at all ("TypeError: cannot pickle '_thread.lock' object", seen on an H200).
    module = Locked()
    s = servable(module, "FP32")
    assert s.module_for(META) is module and module.fc.weight.device == META


def test_a_module_that_cannot_be_copied_for_a_second_device_is_a_config_error_naming_both():
    from wok.errors import ConfigError

    s = servable(Locked(), "FP32")
    s.module_for(CPU)
    with pytest.raises(ConfigError) as info:
        s.module_for(META)
    assert str(info.value) == (
        "model 'm': its module, on cpu, cannot be copied for meta (TypeError: cannot pickle '_thread.lock' object); "
        "serve it on one device, or make it copyable (copy.deepcopy)"
    )


class Tied(nn.Module):
    """Two layers sharing one weight (an embedding tied to its output layer), a buffer, and a view."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)
        self.b.weight = self.a.weight
        self.register_buffer("scale", torch.full((4,), 2.0))
        self.register_buffer("head", self.scale[:2])  # a view of another buffer


def test_a_later_devices_copy_is_made_on_that_device_not_on_the_first_ones():
    # deepcopy cloned every weight on the first device, then moved the clone: a second copy of a
    # model's weights on its first GPU, which a model filling most of it cannot have.
    from torch.utils._python_dispatch import TorchDispatchMode

    class Made(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.on: list[tuple[str, str]] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor):
                    self.on.append((str(func), str(t.device)))
            return out

    module = Tied()
    s = servable(module, "FP32")
    assert s.module_for(CPU) is module
    with Made() as made:
        copied = s.module_for(META)
    # On the CPU only aliases (detach), nothing allocated.
    assert {op for op, device in made.on if device == "cpu"} == {"aten.detach.default"}, made.on
    assert copied.b.weight is copied.a.weight and copied.a.weight is not module.a.weight
    assert isinstance(copied.a.weight, nn.Parameter) and copied.a.weight.requires_grad == module.a.weight.requires_grad
    assert {t.device for t in (*copied.parameters(), *copied.buffers())} == {META}
    assert {t.device for t in (*module.parameters(), *module.buffers())} == {CPU}
    assert [n for n, _ in copied.named_parameters()] == [n for n, _ in module.named_parameters()]
    assert [n for n, _ in copied.named_buffers()] == [n for n, _ in module.named_buffers()]


def test_a_later_instance_on_a_device_runs_a_copy_sharing_the_parameters_with_state_of_its_own():
    module = Tied()
    module.workspace = torch.zeros(3)  # a plain tensor attribute a forward may write
    s = servable(module, "FP32")
    assert s.module_for_instance(CPU, first=True) is module
    copied = s.module_for_instance(CPU, first=False)
    assert copied is not module and s.module_for(CPU) is module
    assert [p for p in copied.parameters()] == [p for p in module.parameters()]  # the same objects: no second weights
    assert copied.b.weight is copied.a.weight
    own = [(copied.scale, module.scale), (copied.head, module.head), (copied.workspace, module.workspace)]
    for mine, first in own:
        assert mine.untyped_storage().data_ptr() != first.untyped_storage().data_ptr()
        assert torch.equal(mine, first)


def test_a_module_that_cannot_be_copied_is_shared_by_its_instances_on_a_device_with_one_warning(caplog):
    module = Locked()
    s = servable(module, "FP32")
    caplog.set_level("WARNING", logger="wok")
    assert s.module_for_instance(CPU, first=True) is module
    assert s.module_for_instance(CPU, first=False) is module
    assert s.module_for_instance(CPU, first=False) is module
    assert [r.getMessage() for r in caplog.records] == [
        "model 'm': its module cannot be copied for a second instance on cpu (TypeError: cannot pickle "
        "'_thread.lock' object); its instances there share it and run its forward at the same time: a forward "
        "that writes tensors the module keeps would mix their batches' rows; make it copyable (copy.deepcopy), "
        "or serve one instance per device"
    ]


def test_a_torchscript_module_s_later_instances_hold_weights_of_their_own_logged_once_with_their_size(caplog):
    # TorchScript's deepcopy ignores the memo that keeps a plain module's parameters shared: each later
    # instance holds its weights again, which an operator sizing a device's memory is told.
    module = torch.jit.script(nn.Sequential(nn.Linear(512, 1024)))  # 2 MiB + 4 KiB of fp32
    s = servable(module, "FP32")
    caplog.set_level("INFO", logger="wok")
    assert s.module_for_instance(CPU, first=True) is module
    copies = [s.module_for_instance(CPU, first=False) for _ in range(2)]
    for copied in copies:
        for mine, first in zip(copied.parameters(), module.parameters()):
            assert mine.untyped_storage().data_ptr() != first.untyped_storage().data_ptr()
            assert torch.equal(mine, first)
    assert [r.getMessage() for r in caplog.records if "TorchScript" in r.getMessage()] == [
        "model 'm': TorchScript copies its weights for each later instance on cpu (2.0 MiB each): the instances "
        "there hold them once each"
    ]
