"""Linear layers through oneDNN: same answers (to float32 rounding), the kernel used where it
should be and only there, parameters shared, the original module untouched."""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from wok.config import InstanceConfig, server_settings
from wok.cpulinear import (
    BUCKET_STEP,
    MIN_ROWS,
    OneDNNLinear,
    OneDNNSequential,
    onednn_available,
    padded_rows,
    with_onednn_linear,
)
from wok.errors import ConfigError
from wok.executor import Executor
from wok.models import build_demo

pytestmark = pytest.mark.skipif(not onednn_available(), reason="this torch build has no oneDNN linear kernel")


class OpLog(TorchDispatchMode):
    """Records the name of every operator that reaches the dispatcher."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []
        self.kernel_rows: list[int] = []  # the rows of each input the oneDNN kernel was given

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func.overloadpacket))
        if self.ops[-1] == "mkldnn._linear_pointwise":
            self.kernel_rows.append(args[0].shape[0])
        return func(*args, **(kwargs or {}))


def ops_of(module: nn.Module, x: torch.Tensor) -> list[str]:
    log = OpLog()
    with torch.inference_mode(), log:
        module(x)
    return log.ops


def mlp_module() -> nn.Module:
    return build_demo("mlp").module_for(torch.device("cpu"))


def test_mlp_runs_as_one_chain_sharing_every_parameter_and_its_children():
    plain = mlp_module()
    fast, layers, fused = with_onednn_linear(plain)
    assert (layers, fused) == (3, 2)
    assert type(fast.net) is OneDNNSequential and type(plain.net) is nn.Sequential
    # One chain of three layers, the first two with their ReLU.
    assert [[relu for _, relu in step] for step in fast.net._plan] == [[True, True, False]]
    # Its children are the original modules: indexing or iterating it means what it meant.
    assert list(fast.net) == list(plain.net)
    assert type(fast.net[1:]) is OneDNNSequential and list(fast.net[1:]) == list(plain.net)[1:]
    # The same Parameter objects: no weight copied.
    assert [id(p) for p in fast.parameters()] == [id(p) for p in plain.parameters()]
    assert fast is not plain and fast.net is not plain.net


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 7, 16, 32, 100])
def test_answers_agree_with_torch_to_float32_rounding(rows):
    plain = mlp_module()
    fast, _, _ = with_onednn_linear(plain)
    x = torch.from_numpy(np.random.default_rng(rows).standard_normal((rows, 256), dtype=np.float32))
    with torch.inference_mode():
        want, got = plain(x), fast(x)
    if rows < MIN_ROWS:
        assert torch.equal(got, want)  # torch's own path, bit for bit
    else:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_the_kernel_runs_from_min_rows_and_torch_below():
    fast, _, _ = with_onednn_linear(mlp_module())
    below = ops_of(fast, torch.zeros(MIN_ROWS - 1, 256))
    at = ops_of(fast, torch.zeros(MIN_ROWS, 256))
    assert "mkldnn._linear_pointwise" not in below and below.count("aten.relu") == 2
    assert at.count("mkldnn._linear_pointwise") == 3
    assert not {"aten.addmm", "aten.linear", "aten.mm", "aten.relu"} & set(at)


def test_rows_are_padded_to_a_few_sizes_so_the_kernels_stay_few():
    assert [padded_rows(n) for n in (4, 5, 8, 9, 17, 32, 33, 64, 65, 128, 129)] == [
        4, 8, 8, 16, 32, 32, 64, 64, 2 * BUCKET_STEP, 2 * BUCKET_STEP, 3 * BUCKET_STEP
    ]  # fmt: skip
    fast, _, _ = with_onednn_linear(mlp_module())
    rows = set()
    for n in range(MIN_ROWS, 33):
        log = OpLog()
        x = torch.randn(n, 256)
        with torch.inference_mode(), log:
            y = fast(x)
        assert y.shape == (n, 256)
        rows.update(log.kernel_rows)
    assert rows == {4, 8, 16, 32}


def test_rows_count_every_leading_dimension():
    lin = nn.Linear(8, 4)
    fast = OneDNNLinear(lin)
    x = torch.randn(2, 3, 8)  # 6 rows in a 3-D input, padded to 8
    log = OpLog()
    with torch.inference_mode(), log:
        got = fast(x)
    assert log.kernel_rows == [8]
    with torch.inference_mode():
        torch.testing.assert_close(got, lin(x), rtol=1e-5, atol=1e-5)
    assert got.shape == (2, 3, 4)
    assert "mkldnn._linear_pointwise" not in ops_of(fast, torch.randn(8))  # 1-D: torch's


def test_with_autograd_on_it_is_torch_and_gradients_flow():
    plain = nn.Sequential(nn.Linear(8, 4), nn.ReLU())
    fast, _, _ = with_onednn_linear(plain)
    x = torch.randn(5, 8, requires_grad=True)
    log = OpLog()
    with log:
        y = fast(x)
    assert "mkldnn._linear_pointwise" not in log.ops
    y.sum().backward()
    assert x.grad is not None and plain[0].weight.grad is not None


def test_a_linear_alone_is_still_a_linear_with_the_same_parameters():
    lin = nn.Linear(8, 4)
    fast, layers, fused = with_onednn_linear(lin)
    assert (layers, fused) == (1, 0)
    assert isinstance(fast, nn.Linear) and fast.weight is lin.weight and fast.bias is lin.bias
    x = torch.randn(6, 8)
    log = OpLog()
    with torch.inference_mode(), log:
        got = fast(x)
    assert log.kernel_rows == [8]
    torch.testing.assert_close(got, lin(x).detach(), rtol=1e-5, atol=1e-5)
    no_bias = OneDNNLinear(nn.Linear(8, 4, bias=False))
    assert no_bias.bias is None and [n for n, _ in no_bias.named_parameters()] == ["weight"]


def test_without_bias_and_with_an_inplace_relu():
    plain = nn.Sequential(nn.Linear(16, 32, bias=False), nn.ReLU(inplace=True), nn.Linear(32, 4))
    fast, layers, fused = with_onednn_linear(plain)
    assert (layers, fused) == (2, 1)
    x = torch.randn(6, 16)
    log = OpLog()
    with torch.inference_mode(), log:
        fast(x)
    assert log.kernel_rows == [8, 8]  # padded once for the chain, not per layer
    assert log.ops.count("aten.zeros") + log.ops.count("aten.new_zeros") == 1
    x = torch.randn(6, 16)
    with torch.inference_mode():
        torch.testing.assert_close(fast(x), plain(x), rtol=1e-5, atol=1e-5)


def test_chains_break_at_other_modules_and_a_linear_outside_a_sequential_runs_alone():
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.head = nn.Linear(8, 8)
            self.act = nn.ReLU()  # called after head, but not in a Sequential: order unknown
            self.body = nn.Sequential(nn.ReLU(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8), nn.Linear(8, 8))

        def forward(self, x):
            return self.body(self.act(self.head(x)))

    plain = Net()
    fast, layers, fused = with_onednn_linear(plain)
    assert (layers, fused) == (4, 0)
    assert type(fast.head) is OneDNNLinear and type(fast.act) is nn.ReLU
    plan = fast.body._plan
    assert [type(s).__name__ if not isinstance(s, tuple) else len(s) for s in plan] == ["ReLU", 1, "Tanh", 2]
    assert type(plain.head) is nn.Linear and type(plain.body) is nn.Sequential
    x = torch.randn(4, 8)
    with torch.inference_mode():
        torch.testing.assert_close(fast(x), plain(x), rtol=1e-5, atol=1e-5)


def test_a_sequential_subclass_keeps_its_forward():
    class Residual(nn.Sequential):
        def forward(self, x):
            return x + super().forward(x)

    plain = nn.Sequential(Residual(nn.Linear(8, 8), nn.ReLU()))
    fast, layers, fused = with_onednn_linear(plain)
    assert (layers, fused) == (1, 0)  # its Linear runs alone, its ReLU as it was
    assert type(fast[0]) is Residual and type(fast[0][0]) is OneDNNLinear
    x = torch.randn(5, 8)
    with torch.inference_mode():
        torch.testing.assert_close(fast(x), plain(x), rtol=1e-5, atol=1e-5)


def test_left_alone_other_dtypes_subclasses_torchscript_and_modules_without_linears():
    f64 = nn.Sequential(nn.Linear(4, 4).double())
    assert with_onednn_linear(f64) == (f64, 0, 0)
    mha = nn.MultiheadAttention(8, 2)  # its out_proj is a Linear subclass, read by its weights
    assert with_onednn_linear(mha) == (mha, 0, 0)
    with warnings.catch_warnings():  # torch.jit is deprecated; models saved with it still serve
        warnings.simplefilter("ignore", DeprecationWarning)
        scripted = torch.jit.script(nn.Sequential(nn.Linear(4, 4)))
    assert with_onednn_linear(scripted) == (scripted, 0, 0)
    conv = nn.Conv1d(1, 1, 3)
    assert with_onednn_linear(conv) == (conv, 0, 0)
    with pytest.raises(ValueError, match="min_rows must be >= 1; got 0"):
        OneDNNLinear(nn.Linear(2, 2), min_rows=0)
    with pytest.raises(ValueError, match="min_rows must be >= 1; got 0"):
        with_onednn_linear(nn.Linear(2, 2), min_rows=0)


def test_the_encoder_demo_keeps_its_answers():
    s = build_demo("encoder")
    plain = s.module_for(torch.device("cpu"))
    fast, layers, _ = with_onednn_linear(plain)
    assert layers == 2 * len(plain.encoder.layers)  # linear1, linear2; attention's projections are its own
    tensors = s.prepare({"tokens": torch.randint(1, 100, (4, 12)), "lengths": torch.tensor([12, 9, 5, 1])})
    with torch.inference_mode():
        want = s.forward(plain, tensors)
        got = s.forward(fast, tensors)
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-4, atol=1e-5)


def test_executor_runs_onednn_by_default_and_torch_when_asked():
    s = build_demo("mlp")
    cpu = InstanceConfig(count=1, devices=("cpu",))
    fast = Executor(s, cpu)
    plain = Executor(s, cpu, cpu_linear="torch")
    try:
        assert (fast.instances[0].onednn_layers, fast.instances[0].onednn_fused) == (3, 2)
        assert plain.instances[0].onednn_layers == 0
        assert plain.instances[0].module is s.module_for(torch.device("cpu"))
        reqs = [{"INPUT0": np.random.default_rng(i).standard_normal((1, 256), dtype=np.float32)} for i in range(7)]
        a = fast.instances[0].submit(reqs, [1] * 7, 0).result(30)
        b = plain.instances[0].submit(reqs, [1] * 7, 0).result(30)
        for x, y in zip(a.outputs, b.outputs, strict=True):
            np.testing.assert_allclose(x["OUTPUT0"], y["OUTPUT0"], rtol=1e-5, atol=1e-5)
    finally:
        fast.shutdown()
        plain.shutdown()
    with pytest.raises(ValueError, match="cpu_linear must be 'onednn' or 'torch'; got 'mkl'"):
        Executor(s, cpu, cpu_linear="mkl")


def test_the_setting_names_its_choices():
    assert server_settings().cpu_linear == "onednn"
    assert server_settings(cpu_linear="torch").cpu_linear == "torch"
    with pytest.raises(ConfigError, match=re.escape("cpu_linear: Input should be 'onednn' or 'torch' (got 'mkl')")):
        server_settings(cpu_linear="mkl")
