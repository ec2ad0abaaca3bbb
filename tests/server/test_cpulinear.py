"""Linear layers through oneDNN: same answers (to float32 rounding), the kernel used where it
should be and only there, parameters shared, the original's children untouched, and a view
that follows what is done to the model after the rewrite."""

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
    MIN_ROWS,
    Chain,
    OneDNNLinear,
    OneDNNSequential,
    chains,
    onednn_available,
    onednn_counts,
    padded_rows,
    torch_linear_layers,
    with_onednn_linear,
)
from wok.errors import ConfigError
from wok.executor import Executor
from wok.models import build_demo

pytestmark = pytest.mark.skipif(not onednn_available(), reason="this torch build has no oneDNN linear kernel")
KERNEL = "mkldnn._linear_pointwise"


class OpLog(TorchDispatchMode):
    """Records the name of every operator that reaches the dispatcher."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []
        self.kernel_rows: list[int] = []  # the rows of each input the oneDNN kernel was given

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func.overloadpacket))
        if self.ops[-1] == KERNEL:
            self.kernel_rows.append(args[0].shape[0])
        return func(*args, **(kwargs or {}))


def logged(module: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, OpLog]:
    log = OpLog()
    with torch.inference_mode(), log:
        y = module(x)
    return y, log


def mlp_module() -> nn.Module:
    return build_demo("mlp").module_for(torch.device("cpu"))


def close(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_mlp_runs_as_one_chain_sharing_every_parameter_and_its_children():
    plain = mlp_module()
    fast, layers, fused = with_onednn_linear(plain)
    assert (layers, fused) == (3, 2)
    assert type(fast.net) is OneDNNSequential and type(plain.net) is nn.Sequential
    # One chain of three layers, the first two with their ReLU.
    assert [[relu for _, relu in step.layers] for step in fast.net._plan] == [[True, True, False]]
    # Its children are the original modules: indexing or iterating it means what it meant.
    assert list(fast.net) == list(plain.net)
    assert type(fast.net[1:]) is OneDNNSequential and list(fast.net[1:]) == list(plain.net)[1:]
    # The same Parameter objects: no weight copied.
    assert [id(p) for p in fast.parameters()] == [id(p) for p in plain.parameters()]
    assert fast is not plain and fast.net is not plain.net


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 7, 16, 32, 100])
def test_answers_agree_with_torch_to_float32_rounding(rows):
    plain = mlp_module()
    fast, _, _ = with_onednn_linear(plain)
    x = torch.from_numpy(np.random.default_rng(rows).standard_normal((rows, 256), dtype=np.float32))
    with torch.inference_mode():
        want, got = plain(x), fast(x)
    if rows < MIN_ROWS:
        assert torch.equal(got, want)  # torch's own path, bit for bit
    else:
        close(got, want)


@pytest.mark.parametrize("rows", [1, 3, 4, 32])
def test_a_nan_or_inf_in_the_input_comes_out_where_torch_puts_it_whatever_the_batch(rows):
    # The kernel's fused ReLU made a NaN 0: a bad row came back finite once it had 3 batch mates.
    plain = mlp_module()
    fast, _, _ = with_onednn_linear(plain)
    x = torch.from_numpy(np.random.default_rng(rows).standard_normal((rows, 256), dtype=np.float32))
    x[0, 5] = float("nan")
    x[-1, 7] = float("inf")  # the same row when rows == 1
    got, log = logged(fast, x)
    with torch.inference_mode():
        want = plain(x)
    assert (KERNEL in log.ops) == (rows >= MIN_ROWS)
    assert want[0].isnan().all()  # what the check below holds fast to
    assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.isinf(), want.isinf())
    finite = want.isfinite()
    close(got[finite], want[finite])


# The bias of n outputs for a batch of `rows` rows, and whether the kernel takes it: one value per
# output (of any strides) or one for all (torch broadcasts it to every row) it does; torch runs
# a bias that broadcasts against the rows, which padding them would change.
BIASES = {
    "stride 2": (lambda n, rows: torch.randn(2 * n)[::2], True),
    "expanded (stride 0)": (lambda n, rows: torch.randn(1).expand(n), True),  # the kernel read past its one float
    "offset": (lambda n, rows: torch.randn(n + 5)[5:], True),
    "0-d": (lambda n, rows: torch.tensor(0.5), True),
    "one value": (lambda n, rows: torch.randn(1), True),
    "(1, n)": (lambda n, rows: torch.randn(1, n), False),
    "(rows, n)": (lambda n, rows: torch.randn(rows, n), False),  # padded: 'expanded size (32) must match (29)'
    "(rows, 1)": (lambda n, rows: torch.randn(rows, 1), False),
}


@pytest.mark.parametrize("rows", [1, 29])
@pytest.mark.parametrize("kind", list(BIASES))
def test_a_bias_of_any_strides_or_shape_torch_takes_gives_f_linears_answer(kind, rows):
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
    lone = nn.Linear(16, 32)
    fast, _, _ = with_onednn_linear(plain)
    fast_lone, _, _ = with_onednn_linear(lone)
    # Assigned after the rewrite, as a load with assign=True would: the view reads it at each call.
    make, kernel = BIASES[kind]
    plain[0].bias = nn.Parameter(make(32, rows))
    lone.bias = nn.Parameter(make(32, rows))
    x = torch.randn(rows, 16)
    for view, module in ((fast, plain), (fast_lone, lone)):
        for _ in range(3):  # garbage read past a storage differs between calls
            got, log = logged(view, x)
            with torch.inference_mode():
                close(got, module(x))
        assert (KERNEL in log.ops) == (rows >= MIN_ROWS and kernel)


def test_a_bias_that_broadcasts_against_leading_dimensions_is_torchs():
    # 3-D input: torch adds a (5, n) bias to each of the two (5, n) blocks; the rows, flattened
    # and padded (10 to 12), are not what it broadcasts against.
    lone = nn.Linear(16, 32)
    fast, _, _ = with_onednn_linear(lone)
    lone.bias = nn.Parameter(torch.randn(5, 32))
    x = torch.randn(2, 5, 16)
    got, log = logged(fast, x)
    assert KERNEL not in log.ops
    with torch.inference_mode():
        close(got, lone(x))


def outcome(module: nn.Module, x: torch.Tensor) -> torch.Tensor | tuple[type, str]:
    """`module(x)` in inference, or the type and message of what it raised."""
    try:
        with torch.inference_mode():
            return module(x)
    except Exception as e:  # any error: compared with torch's
        return type(e), str(e)


# A weight (and bias) assigned to the first of two layers after the rewrite, as a load with
# assign=True or by hand would; the layer's in_features/out_features still say 16 and 32.
WEIGHTS = {
    "too few inputs": lambda: {"weight": torch.ones(32, 15)},  # was oneDNN's "could not create a primitive descriptor"
    "fewer outputs than the bias": lambda: {"weight": torch.ones(31, 16)},
    "more outputs than the next takes": lambda: {"weight": torch.ones(33, 16), "bias": torch.zeros(33)},
    "3-D": lambda: {"weight": torch.randn(32, 16, 1)},  # was an answer, from the kernel
    "1-D": lambda: {"weight": torch.randn(16)},
    "float64": lambda: {"weight": torch.randn(32, 16, dtype=torch.float64)},
    "bfloat16": lambda: {"weight": torch.randn(32, 16).bfloat16()},
    "float64 bias": lambda: {"bias": torch.randn(32, dtype=torch.float64)},
    "no outputs": lambda: {"weight": torch.ones(0, 16), "bias": torch.zeros(0)},
}


@pytest.mark.parametrize("rows", [2, 5, 32])
@pytest.mark.parametrize("kind", list(WEIGHTS))
def test_parameters_reassigned_after_the_rewrite_give_what_the_module_gives(kind, rows):
    torch.manual_seed(0)
    x = torch.randn(rows, 16)
    for how in ("Parameter", ".data"):
        plain = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
        fast, _, _ = with_onednn_linear(plain)
        for name, value in WEIGHTS[kind]().items():
            if how == "Parameter":
                setattr(plain[0], name, nn.Parameter(value))
            else:  # the same Parameter object, of another shape or dtype
                getattr(plain[0], name).data = value
        want, got = outcome(plain, x), outcome(fast, x)
        if isinstance(want, tuple):
            assert got == want  # torch's error, word for word (the batch's rows, not the padded ones)
        else:
            assert isinstance(got, torch.Tensor), got
            close(got, want)


def test_a_lone_linear_reassigned_to_another_width_answers_with_its_new_width():
    lin = nn.Linear(16, 32)
    fast, _, _ = with_onednn_linear(lin)
    lin.weight, lin.bias = nn.Parameter(torch.randn(4, 16)), nn.Parameter(torch.randn(4))
    x = torch.randn(29, 16)
    got, log = logged(fast, x)  # was "shape '[29, 32]' is invalid for input of size 116"
    assert KERNEL in log.ops and got.shape == (29, 4)
    with torch.inference_mode():
        close(got, lin(x))
    lin.weight = nn.Parameter(torch.randn(4, 8))  # and another input width: the kernel for it
    x = torch.randn(29, 8)
    got, log = logged(fast, x)
    assert KERNEL in log.ops
    with torch.inference_mode():
        close(got, lin(x))


def test_train_mode_grads_and_weights_of_any_strides_run_as_the_module_does():
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8)).train()
    fast, _, _ = with_onednn_linear(plain)
    assert all(p.requires_grad for p in fast.parameters())
    x = torch.randn(8, 16)
    for weight in (torch.randn(16, 32).t(), torch.randn(32, 48)[:, 5:37:2], torch.randn(1, 16).expand(32, 16)):
        plain[0].weight = nn.Parameter(weight)
        got, log = logged(fast, x)  # training mode changes nothing for Linear and ReLU: the kernel
        assert KERNEL in log.ops
        with torch.inference_mode():
            close(got, plain(x))
        with torch.no_grad():
            close(fast(x), plain(x))
    plain.eval()
    got, log = logged(fast, x)
    assert KERNEL in log.ops
    # With autograd on, torch's path, so gradients reach the parameters.
    fast(x).sum().backward()
    assert plain[0].weight.grad is not None and plain[2].bias.grad is not None
    # float64 parameters, assigned after the rewrite, and a float64 input: torch's answer.
    plain.double()
    x = x.double()
    got, log = logged(fast, x)
    assert KERNEL not in log.ops and got.dtype is torch.float64
    with torch.inference_mode():
        close(got, plain(x))


def test_the_kernel_runs_from_min_rows_and_torch_below():
    fast, _, _ = with_onednn_linear(mlp_module())
    _, below = logged(fast, torch.zeros(MIN_ROWS - 1, 256))
    _, at = logged(fast, torch.zeros(MIN_ROWS, 256))
    assert KERNEL not in below.ops and below.ops.count("aten.relu") == 2
    assert at.ops.count(KERNEL) == 3 and at.ops.count("aten.relu_") == 2  # in place on the kernel's output
    # Nothing copied per call: the mlp's biases are contiguous as they are.
    assert not {"aten.addmm", "aten.linear", "aten.mm", "aten.relu", "aten.clone", "aten.copy_"} & set(at.ops)
    assert onednn_counts(fast, ran=True) == (3, 2) and chains(fast)[0].calls == 1


def test_rows_are_padded_to_a_few_sizes_so_the_kernels_stay_few():
    by_hand = {1: 1, 2: 2, 3: 3, 4: 4, 5: 6, 6: 6, 7: 8, 8: 8, 9: 12, 13: 16, 17: 24, 25: 32, 33: 48, 49: 64, 65: 96}
    assert {n: padded_rows(n) for n in by_hand} == by_hand
    # Never more than half again the rows: two kernels per doubling.
    assert all(n <= padded_rows(n) <= 1.5 * n for n in range(3, 5000))
    fast, _, _ = with_onednn_linear(mlp_module())
    rows = set()
    for n in range(MIN_ROWS, 33):
        y, log = logged(fast, torch.randn(n, 256))
        assert y.shape == (n, 256)
        rows.update(log.kernel_rows)
    assert rows == {4, 6, 8, 12, 16, 24, 32}


def test_rows_count_every_leading_dimension():
    plain = nn.Sequential(nn.Linear(8, 4))
    fast, _, _ = with_onednn_linear(plain)
    x = torch.randn(2, 5, 8)  # 10 rows in a 3-D input, padded to 12
    got, log = logged(fast, x)
    assert log.kernel_rows == [12] and got.shape == (2, 5, 4)
    with torch.inference_mode():
        close(got, plain(x))
    _, log = logged(fast, torch.randn(8))  # 1-D: torch's
    assert KERNEL not in log.ops


def test_a_chain_pads_once_however_many_layers_it_has():
    plain = nn.Sequential(nn.Linear(16, 32, bias=False), nn.ReLU(inplace=True), nn.Linear(32, 4))
    fast, layers, fused = with_onednn_linear(plain)
    assert (layers, fused) == (2, 1)
    x = torch.randn(5, 16)
    got, log = logged(fast, x)
    assert log.kernel_rows == [6, 6]
    assert log.ops.count("aten.new_zeros") + log.ops.count("aten.zeros") == 1
    with torch.inference_mode():
        close(got, plain(x))


def test_torch_runs_what_the_kernel_does_not_take_and_says_what_torch_says():
    plain = nn.Sequential(nn.Linear(8, 4), nn.ReLU())
    fast, _, _ = with_onednn_linear(plain)
    x = torch.randn(5, 8, requires_grad=True)  # autograd: torch's, and gradients flow
    log = OpLog()
    with log:
        y = fast(x)
    assert KERNEL not in log.ops
    y.sum().backward()
    assert x.grad is not None and plain[0].weight.grad is not None
    for other in (torch.randn(5, 8, dtype=torch.float64), torch.randn(5, 8).to(torch.bfloat16)):
        with pytest.raises(RuntimeError) as theirs, torch.inference_mode():
            plain(other)
        with pytest.raises(RuntimeError) as ours, torch.inference_mode():
            fast(other)
        assert str(ours.value) == str(theirs.value)
    with pytest.raises(RuntimeError, match="mat1 and mat2 shapes cannot be multiplied"), torch.inference_mode():
        fast(torch.randn(5, 7))  # the wrong width: torch's own message
    with torch.autocast("cpu", torch.bfloat16):
        got, log = logged(fast, torch.randn(5, 8))
    assert KERNEL not in log.ops and got.dtype is torch.bfloat16  # autocast's choice stands
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "initializing zero-element tensors is a no-op"
        empty = nn.Sequential(nn.Linear(0, 3))
    with torch.inference_mode():
        close(with_onednn_linear(empty)[0](torch.randn(5, 0)), empty(torch.randn(5, 0)))


def test_a_nested_tensor_is_torchs():
    plain = nn.Sequential(nn.Linear(8, 4))
    fast, _, _ = with_onednn_linear(plain)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # nested tensors are a prototype
        x = torch.nested.nested_tensor([torch.randn(2, 8), torch.randn(3, 8)])
    got, log = logged(fast, x)
    assert KERNEL not in log.ops and got.is_nested
    with torch.inference_mode():
        for a, b in zip(got.unbind(), plain(x).unbind(), strict=True):
            close(a, b)


def test_a_linear_alone_is_a_view_of_the_original():
    lin = nn.Linear(8, 4)
    fast, layers, fused = with_onednn_linear(lin)
    assert (layers, fused) == (1, 0)
    assert type(fast) is OneDNNLinear and isinstance(fast, nn.Linear)
    assert fast.weight is lin.weight and fast.bias is lin.bias
    x = torch.randn(6, 8)
    got, log = logged(fast, x)
    assert log.kernel_rows == [6]
    close(got, lin(x).detach())
    # Weights loaded into the original by assignment, not in place, show in the view.
    new = {"weight": torch.randn(4, 8), "bias": torch.randn(4)}
    lin.load_state_dict(new, assign=True)
    assert fast.weight is lin.weight
    with torch.inference_mode():
        close(fast(x), x @ new["weight"].T + new["bias"])
    no_bias = with_onednn_linear(nn.Linear(8, 4, bias=False))[0]
    assert no_bias.bias is None and [n for n, _ in no_bias.named_parameters()] == ["weight"]


def test_a_sequential_changed_after_the_rewrite_runs_what_it_holds_now():
    fast, _, _ = with_onednn_linear(nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8)))
    x = torch.randn(5, 8)
    fast[1] = nn.Tanh()
    with torch.inference_mode():
        close(fast(x), fast[2](torch.tanh(fast[0](x))))
    fast.append(nn.Linear(8, 3))
    with torch.inference_mode():
        assert fast(x).shape == (5, 3)
    assert [len(s.layers) if type(s) is Chain else type(s).__name__ for s in fast._plan] == [1, "Tanh", 2]


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
    assert [type(s).__name__ if type(s) is not Chain else len(s.layers) for s in plan] == ["ReLU", 1, "Tanh", 2]
    assert type(plain.head) is nn.Linear and type(plain.body) is nn.Sequential
    x = torch.randn(4, 8)
    with torch.inference_mode():
        close(fast(x), plain(x))


def test_modules_with_hooks_are_called_as_they_are_so_their_hooks_run():
    plain = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))
    seen = []
    plain[2].register_forward_hook(lambda mod, args, out: seen.append("linear"))
    plain[3].register_forward_pre_hook(lambda mod, args: seen.append("relu"))
    fast, layers, fused = with_onednn_linear(plain)
    assert (layers, fused) == (2, 1)  # the first Linear with its ReLU, and the last alone
    assert [s if type(s) is not Chain else len(s.layers) for s in fast._plan] == [1, plain[2], plain[3], 1]
    x = torch.randn(4, 8)
    with torch.inference_mode():
        got = fast(x)
        assert seen == ["linear", "relu"]
        close(got, plain(x))


def test_a_hook_registered_after_the_rewrite_runs_on_a_chained_layer():
    plain = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))
    fast, layers, fused = with_onednn_linear(plain)
    assert (layers, fused) == (2, 1)  # one chain of both Linears, before any hook
    seen = []
    handle = plain[2].register_forward_hook(lambda mod, args, out: seen.append(tuple(out.shape)))
    x = torch.randn(4, 8)
    with torch.inference_mode():
        got = fast(x)
    assert seen == [(4, 8)]
    assert [s if type(s) is not Chain else len(s.layers) for s in fast._plan] == [1, plain[2]]
    with torch.inference_mode():
        close(got, plain(x))
    handle.remove()
    seen.clear()
    with torch.inference_mode():
        fast(x)
    assert seen == []


def test_a_global_hook_registered_after_the_rewrite_runs_for_every_child():
    plain = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))
    fast, _, _ = with_onednn_linear(plain)
    seen = []
    handle = torch.nn.modules.module.register_module_forward_pre_hook(lambda mod, args: seen.append(type(mod)))
    try:
        with torch.inference_mode():
            fast(torch.randn(4, 8))
    finally:
        handle.remove()
    assert seen == [OneDNNSequential, nn.Linear, nn.ReLU, nn.Linear]
    with torch.inference_mode():
        fast(torch.randn(4, 8))  # the hook removed: one chain again
    assert [len(s.layers) for s in fast._plan] == [2]


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
        close(fast(x), plain(x))


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.jit's, also raised by torch.compile's import
def test_left_alone_other_dtypes_subclasses_torchscript_compiled_and_modules_without_linears():
    f64 = nn.Sequential(nn.Linear(4, 4).double())
    assert with_onednn_linear(f64) == (f64, 0, 0)
    mha = nn.MultiheadAttention(8, 2)  # its out_proj is a Linear subclass, read by its weights
    assert with_onednn_linear(mha) == (mha, 0, 0)
    scripted = torch.jit.script(nn.Sequential(nn.Linear(4, 4)))  # deprecated; models saved with it still serve
    assert with_onednn_linear(scripted) == (scripted, 0, 0)
    compiled = torch.compile(nn.Sequential(nn.Linear(4, 4)))  # its forward is the original's
    assert with_onednn_linear(compiled) == (compiled, 0, 0)
    conv = nn.Conv1d(1, 1, 3)
    assert with_onednn_linear(conv) == (conv, 0, 0)
    with pytest.raises(ValueError, match="min_rows: expected >= 1; got 0"):
        OneDNNLinear.of(nn.Linear(2, 2), min_rows=0)
    with pytest.raises(ValueError, match="min_rows: expected >= 1; got 0"):
        with_onednn_linear(nn.Linear(2, 2), min_rows=0)


def test_the_encoder_demo_routes_around_its_layers_in_inference_and_keeps_its_answers_without_that():
    s = build_demo("encoder")
    plain = s.module_for(torch.device("cpu"))
    fast, layers, _ = with_onednn_linear(plain)
    assert layers == 2 * len(plain.encoder.layers)  # linear1, linear2; attention's projections are its own
    tensors = s.prepare({"tokens": torch.randint(1, 100, (4, 12)), "lengths": torch.tensor([12, 9, 5, 1])})
    with torch.inference_mode():
        want = s.forward(plain, tensors)
        got = s.forward(fast, tensors)  # torch's fused transformer kernel: the Linears are not called
    assert onednn_counts(fast, ran=True) == (0, 0)
    for k in want:
        close(got[k], want[k])
    fastpath = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        with torch.inference_mode():
            want = s.forward(plain, tensors)
            got = s.forward(fast, tensors)
    finally:
        torch.backends.mha.set_fastpath_enabled(fastpath)
    assert onednn_counts(fast, ran=True) == (layers, 0)
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
        reqs[0]["INPUT0"][0, 0] = np.nan  # a bad request keeps its NaN, batched with six others
        a = fast.instances[0].submit(reqs, [1] * 7, 0).result(30)
        b = plain.instances[0].submit(reqs, [1] * 7, 0).result(30)
        assert np.isnan(a.outputs[0]["OUTPUT0"]).all() and not np.isnan(a.outputs[1]["OUTPUT0"]).any()
        for x, y in zip(a.outputs, b.outputs, strict=True):
            np.testing.assert_allclose(x["OUTPUT0"], y["OUTPUT0"], rtol=1e-5, atol=1e-5)
    finally:
        fast.shutdown()
        plain.shutdown()
    with pytest.raises(ValueError, match="cpu_linear: expected 'onednn' or 'torch'; got 'mkl'"):
        Executor(s, cpu, cpu_linear="mkl")


def test_the_warm_up_builds_a_kernel_for_every_padded_size_and_records_what_ran():
    for name, ran in (("mlp", (3, 2)), ("encoder", (0, 0))):
        ex = Executor(build_demo(name), InstanceConfig(count=1, devices=("cpu",)))
        try:
            inst = ex.instances[0]
            assert inst.onednn_ran == (0, 0)
            ex.warmup()
            assert inst.onednn_ran == ran
            if name == "mlp":
                (chain,) = chains(inst.module)
                # mlp's max batch is 32; with T threads, up to 32/T rows run on one thread.
                one_thread = [n for n in (4, 6, 8, 12, 16, 24, 32) if -(-n * inst.max_threads // 32) == 1]
                assert chain.calls == len(one_thread) and inst.threads == 1
        finally:
            ex.shutdown()


def test_the_setting_names_its_choices():
    assert server_settings().cpu_linear == "onednn"
    assert server_settings(cpu_linear="torch").cpu_linear == "torch"
    with pytest.raises(ConfigError, match=re.escape("cpu_linear: expected 'onednn' or 'torch'; got 'mkl'")):
        server_settings(cpu_linear="mkl")


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.jit's
def test_torchscripts_fp32_linear_layers_are_counted_frozen_too_and_those_of_another_dtype_not():
    # A frozen module (torch.jit.freeze, as one is shipped) has no submodules left and counted 0, so the start-up
    # said nothing of oneDNN for it; a scripted fp16 Linear counted, and was advised onto a path that leaves it to
    # torch (not fp32).
    mlp = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).eval()
    assert torch_linear_layers(torch.jit.script(mlp)) == 2
    assert torch_linear_layers(torch.jit.freeze(torch.jit.script(mlp))) == 2
    assert torch_linear_layers(torch.jit.freeze(torch.jit.trace(mlp, torch.randn(2, 4)))) == 2
    assert torch_linear_layers(torch.jit.freeze(torch.jit.script(nn.Linear(4, 2).eval()))) == 1
    assert torch_linear_layers(torch.jit.script(nn.Linear(4, 2).half())) == 0
    assert torch_linear_layers(torch.jit.freeze(torch.jit.script(nn.Linear(4, 2).half().eval()))) == 0


class _WithParameterList(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 2)
        self.scales = nn.ParameterList([nn.Parameter(torch.ones(2))])

    def forward(self, x):
        return self.linear(x) * self.scales[0]


class _WithUnusedLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 2)
        self.unused = nn.ReLU()

    def forward(self, x):
        return self.linear(x)


def test_a_torchscript_leaf_without_a_forward_is_no_frozen_graph_to_read():
    # A ParameterList, or a traced submodule its parent never calls, is a leaf with no forward: reading its graph
    # raised AttributeError, which ended the server's start over a log line.
    assert torch_linear_layers(torch.jit.script(_WithParameterList().eval())) == 1
    assert torch_linear_layers(torch.jit.trace(_WithUnusedLayer().eval(), torch.randn(2, 4))) == 1
