"""`nn.Linear` on the CPU through oneDNN, for batches of a few rows and more.

Profiled in the server at 1,000 QPS (docs/performance.md, "The model's own kernels"), the demo
mlp's worker spent about a fifth of its time in MKL copying weight panels into its own layout
(`sgemm_scopy`), once per layer and batch: for a few rows, torch's fp32 `addmm` repacks the
whole weight to multiply it by a thin input. oneDNN's matmul (`mkldnn._linear_pointwise`, the
kernel torch's own compiler emits for CPU linear layers) reads the weight as it is; the ReLU
after it runs in place on its output. Up to three rows torch's matrix-vector path is as fast, so
those stay with `F.linear`.

The rewrite makes a view of the module: shallow copies that share its parameter, buffer and
hook dicts (no weight is copied; the original's own children are untouched). A plain
`nn.Sequential` with Linear layers becomes a `OneDNNSequential`, which runs each run of
consecutive Linears (with the ReLU right after each) as one `Chain`, padding the rows once at
its start; any other plain `nn.Linear` becomes a `OneDNNLinear`. Linears and ReLUs with forward
hooks stay as they are (a chain never calls them), and so do all of a Sequential's children while
hooks registered globally with `register_module_forward_hook` exist; a hook registered after the
rewrite takes effect from the next call. Parameters are read at each call: one reassigned since
the rewrite to a shape, dtype or kind the kernel does not take (or a bias that broadcasts against
the rows) runs its chain through torch's path, with torch's answer or error. Results agree with
`F.linear` and `F.relu` to float32 rounding (a different summation order), as torch's own
already differ between batch sizes, NaN included: a NaN stays NaN through a ReLU.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules import module as _module
from torch.utils.hooks import RemovableHandle

# Rows (the product of all but the last input dimension) from which a layer runs on oneDNN.
# Measured on the mlp's shapes on the 2-core machine (docs/performance.md): below 4 rows
# torch's matrix-vector path is as fast; from 4 rows oneDNN takes 0.5-0.9 × torch's time back
# to back, and from 64 rows about half.
MIN_ROWS = 4


def padded_rows(rows: int) -> int:
    """The row count a batch of `rows` runs with on oneDNN: the next of 4, 6, 8, 12, 16, 24, 32,
    48, 64, 96, … (powers of two and 1.5 × them).

    oneDNN builds and caches (up to 1,024) one kernel per row count and layer shape, each 0.6-1
    MiB: every batch size would be one more (the mlp's 29 sizes from 4 to 32 added 50 MiB). On
    this series a layer has two kernels per doubling of the rows, and a batch is padded by at
    most half its rows, a third of its time at worst.
    """
    if rows <= 2:
        return rows
    p = 1 << (rows - 1).bit_length()
    return 3 * p // 4 if rows <= 3 * p // 4 else p


def _op():
    try:
        return torch.ops.mkldnn._linear_pointwise
    except (AttributeError, RuntimeError):  # a build without oneDNN's fusion ops
        return None


def onednn_available() -> bool:
    """Whether this torch build runs linear layers through oneDNN: the op exists, and one tiny
    call with the arguments wok passes works (the op is torch's internal one)."""
    op = _op()
    if op is None or not torch.backends.mkldnn.is_available():
        return False
    try:
        with torch.inference_mode():
            y = op(torch.ones(1, 2), torch.ones(3, 2), torch.zeros(3), "none", [], "")
        return tuple(y.shape) == (1, 3) and bool((y == 2).all())
    except (RuntimeError, TypeError):
        return False


_PLAIN = (torch.Tensor, nn.Parameter)


def _plain_f32(t: torch.Tensor) -> bool:
    # A tensor subclass (or any wrapper) is left to torch: its own dispatch decides what runs.
    return type(t) in _PLAIN and t.dtype is torch.float32 and t.layout is torch.strided and t.is_cpu


def _kernel_layers(
    x: torch.Tensor, layers: Sequence[tuple[nn.Linear, bool]], min_rows: int
) -> list[tuple[torch.Tensor, torch.Tensor | None, bool]] | None:
    """Each layer's (weight, bias, relu) as the kernel takes them for this call, or None when
    torch's own path runs it: anything but fp32 inference on strided CPU tensors of at least
    `min_rows` rows, through layers whose parameters are what `F.linear` would take for them.

    The parameters are read here, at each call, not when the chain was built: a load may have
    reassigned them (or `.data`) since, to another shape, dtype or rank. The kernel would fail on
    those with oneDNN's own message ("could not create a primitive descriptor"), or, for a 3-D
    weight, answer without a word; and a bias that broadcasts against the rows (2-D, (rows, out)
    or (rows, 1)) would meet the padded rows, not the batch's. Torch's path gives what
    `module(x)` gives: its answer, or its error, for the batch as it came.
    """
    if (
        x.is_nested  # first: a nested tensor has no single shape to read
        or x.layout is not torch.strided
        or x.dim() < 2
        or x.dtype is not torch.float32
        or not x.is_cpu
        or torch.is_grad_enabled()
        or torch.is_autocast_enabled("cpu")
    ):
        return None
    width = x.shape[-1]
    if width == 0 or x.numel() // width < min_rows:
        return None
    out = []
    for linear, relu in layers:
        weight, bias = linear.weight, linear.bias
        if not _plain_f32(weight):
            return None
        shape = weight.shape
        # A matrix of this layer's inputs; and outputs: the kernel refuses a layer of none (and
        # the next one, of no inputs).
        if len(shape) != 2 or shape[1] != width or not shape[0]:
            return None
        width = shape[0]
        if bias is not None:
            if not _plain_f32(bias):
                return None
            if bias.shape != (width,):
                # One value for all (0-d or (1,)), which torch broadcasts: the same for every
                # row. Any other shape torch takes broadcasts against the rows (which padding
                # would change), or torch refuses it with its own message.
                if bias.shape not in ((), (1,)):
                    return None
                bias = bias.expand(width)
            # The kernel reads the bias as that many dense floats whatever its strides (a strided
            # one gives wrong sums, an expanded one reads past its storage); the weight's strides
            # it honours.
            if not bias.is_contiguous():
                bias = bias.contiguous()
        out.append((weight, bias, relu))
    return out


class Chain:
    """Linear layers (each with the ReLU after it, or not) run one after another, as torch would.

    Its layers are the modules themselves, their parameters read at each call, so a load into
    them (in place or by assignment, of any shape) shows, and parameters the kernel does not take
    run through torch's path as the module would. A call that takes oneDNN pads the rows once for
    the whole chain and cuts them once at its end; `calls` counts those calls.
    """

    __slots__ = ("calls", "kernel", "layers")

    def __init__(self, layers: Sequence[tuple[nn.Linear, bool]]) -> None:
        self.layers = tuple(layers)
        self.calls = 0
        self.kernel = _op()  # looked up once, not per batch

    def __call__(self, x: torch.Tensor, min_rows: int = MIN_ROWS) -> torch.Tensor:
        layers = _kernel_layers(x, self.layers, min_rows)
        if layers is None:
            for linear, relu in self.layers:
                x = F.linear(x, linear.weight, linear.bias)
                if relu:
                    x = F.relu(x)
            return x
        self.calls += 1
        kernel = self.kernel
        width = x.shape[-1]
        rows = x.numel() // width
        flat = x.reshape(rows, width)
        padded = padded_rows(rows)
        if padded != rows:
            # Zeros, not garbage: stale bits could be denormals, which are slow to multiply.
            buf = flat.new_zeros((padded, width))
            buf[:rows] = flat
            flat = buf
        for weight, bias, relu in layers:
            flat = kernel(flat, weight, bias, "none", [], "")
            if relu:
                # Not the kernel's fused "relu": it makes NaN 0, so a bad input's answer would depend
                # on its batch mates; torch's keeps NaN.
                flat.relu_()
        if padded != rows:
            flat = flat[:rows]
        return flat.reshape(*x.shape[:-1], flat.shape[1])


class OneDNNLinear(nn.Linear):
    """A view of an `nn.Linear` (a shallow copy: the same parameter, buffer and hook dicts) whose
    forward is a one-layer `Chain`; still an `nn.Linear` to code that checks."""

    min_rows: int = MIN_ROWS

    @classmethod
    def of(cls, linear: nn.Linear, min_rows: int = MIN_ROWS) -> OneDNNLinear:
        if min_rows < 1:
            raise ValueError(f"min_rows: expected >= 1; got {min_rows}")
        view = copy.copy(linear)
        view.__class__ = cls
        view.min_rows = min_rows
        view.chain = Chain([(view, False)])
        return view

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.chain(x, self.min_rows)


class OneDNNSequential(nn.Sequential):
    """An `nn.Sequential` that runs each run of consecutive plain Linear layers (with the ReLUs
    right after them) as one `Chain`. Its children are the original modules, so indexing,
    iterating and slicing it give what they gave before; its plan follows changes to them."""

    min_rows: int = MIN_ROWS

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self._replan()

    def _replan(self) -> None:
        self._plan_key = tuple(map(id, self._modules.values()))
        self._hooks_at = _hooks_at()
        self._plan = _plan(list(self._modules.values()))

    def forward(self, x):
        if self._plan_key != tuple(map(id, self._modules.values())) or self._hooks_at != _hooks_at():
            self._replan()
        for step in self._plan:
            x = step(x, self.min_rows) if type(step) is Chain else step(x)
        return x


def _hooked(m: nn.Module) -> bool:
    # A chain never calls its modules, so their hooks would not run: those stay as they are.
    return bool(m._forward_hooks or m._forward_pre_hooks)


# Hooks for every module's call (register_module_forward_hook): a chain would skip them too.
_GLOBAL_HOOKS = (getattr(_module, "_global_forward_hooks", {}), getattr(_module, "_global_forward_pre_hooks", {}))


def _global_hooks() -> bool:
    return any(_GLOBAL_HOOKS)


def _hooks_at() -> tuple[int, int, int]:
    """What a plan's hooks are checked against at each call: a plan is rebuilt when a hook was
    registered anywhere (torch numbers every hook's handle from one counter: one read, where
    looking at each child's hook dicts costs several times more per batch) or a global one
    removed. A child's hook removed is not seen: until the next rebuild that child is called as
    a module, which is only slower."""
    forward, pre = _GLOBAL_HOOKS
    return RemovableHandle.next_id, len(forward), len(pre)


def _eligible(m: nn.Module | None) -> bool:
    # Subclasses are left alone: their owners may read them differently (MultiheadAttention's
    # out_proj is passed to a functional kernel by its weights).
    return type(m) is nn.Linear and m.weight.dtype is torch.float32 and m.weight.device.type == "cpu" and not _hooked(m)


def _plan(children: list[nn.Module]) -> list:
    """The children as steps: a module to call, or a `Chain` of consecutive Linears (each with
    the ReLU right after it)."""
    plan: list = []
    chainable = not _global_hooks()
    i = 0
    while i < len(children):
        layers: list[tuple[nn.Linear, bool]] = []
        while chainable and i < len(children) and _eligible(children[i]):
            relu = i + 1 < len(children) and type(children[i + 1]) is nn.ReLU and not _hooked(children[i + 1])
            layers.append((children[i], relu))
            i += 2 if relu else 1
        if layers:
            plan.append(Chain(layers))
        else:
            plan.append(children[i])
            i += 1
    return plan


def chains(module: nn.Module) -> list[Chain]:
    """Every `Chain` in a rewritten module tree."""
    out = []
    for sub in module.modules():
        if type(sub) is OneDNNLinear:
            out.append(sub.chain)
        elif type(sub) is OneDNNSequential:
            out += [step for step in sub._plan if type(step) is Chain]
    return out


def onednn_counts(module: nn.Module, *, ran: bool = False) -> tuple[int, int]:
    """(Linear layers, ReLUs run with them) in the tree's chains; with `ran`, only in chains that have
    taken oneDNN at least once (a model may route around its layers: the demo encoder's
    transformer layers run torch's fused kernel in inference, never their Linears)."""
    live = [c for c in chains(module) if c.calls or not ran]
    return sum(len(c.layers) for c in live), sum(relu for c in live for _, relu in c.layers)


def _rewrite(m: nn.Module, min_rows: int) -> nn.Module:
    new = {}
    for name, child in m._modules.items():
        if child is None:
            new[name] = None
        elif _eligible(child) and type(m) is not nn.Sequential:  # a Sequential's own are chained below
            new[name] = OneDNNLinear.of(child, min_rows)
        else:
            new[name] = _rewrite(child, min_rows)
    plain_sequential = type(m) is nn.Sequential and any(_eligible(c) for c in new.values())
    if not plain_sequential and all(new[k] is c for k, c in m._modules.items()):
        return m
    # A view: it shares the parameter, buffer and hook dicts and the training flag's children;
    # only its own dict of children (and, for a Sequential, its class) differ.
    clone = copy.copy(m)
    clone._modules = new
    if plain_sequential:
        clone.__class__ = OneDNNSequential
        clone.min_rows = min_rows
        clone._replan()
    return clone


def with_onednn_linear(module: nn.Module, min_rows: int = MIN_ROWS) -> tuple[nn.Module, int, int]:
    """(view, layers, fused): a view of `module` whose plain fp32 CPU `nn.Linear`s run through
    oneDNN (`layers` of them, `fused` of them followed by a ReLU, run in place after the kernel),
    sharing every parameter; the module itself when there are none, when it is TorchScript or
    compiled, or when oneDNN is not available. The view shares the modules it did not rewrite, and
    their state, with `module`."""
    if min_rows < 1:
        raise ValueError(f"min_rows: expected >= 1; got {min_rows}")
    compiled = type(module).__module__.startswith("torch._dynamo")  # calls the original's forward
    if isinstance(module, torch.jit.ScriptModule) or compiled or not onednn_available():
        return module, 0, 0
    view = OneDNNLinear.of(module, min_rows) if _eligible(module) else _rewrite(module, min_rows)
    return (view, *onednn_counts(view)) if view is not module else (module, 0, 0)


def plain_linear_layers(module: nn.Module) -> int:
    """The nn.Linear layers of an nn.Module that with_onednn_linear runs through oneDNN where the torch build has
    it (plain fp32 CPU ones with no hooks): what a build without it leaves to torch, that a model with none would
    run no differently."""
    return sum(_eligible(m) for m in module.modules())


# A TorchScript module's type for a scripted nn.Linear: "__torch__.torch.nn.modules.linear.Linear", with a
# "___torch_mangle_N." before the class where one process scripted several (a subclass is named for itself).
_SCRIPTED_LINEAR = re.compile(r"__torch__\.torch\.nn\.modules\.linear\.(?:___torch_mangle_\d+\.)?Linear")
# The type a torch.export graph's node records for the nn.Linear that called it (its nn_module_stack's last).
_EXPORTED_LINEAR = "torch.nn.modules.linear.Linear"


def torch_linear_layers(module: nn.Module) -> int:
    """The plain `nn.Linear` layers a TorchScript module, or a torch.export graph (under any wrapper), holds or
    called as it was exported: with_onednn_linear leaves these to torch, where the same layers served as an
    nn.Module would run through oneDNN. A linear computed otherwise (F.linear, a matmul) is not one: served
    as an nn.Module it runs as torch's too, except in a frozen TorchScript module, whose linears are all alike.
    Of TorchScript's, only fp32 ones count, as for plain_linear_layers: served as an nn.Module, one of another
    dtype would run as torch's all the same (a torch.export graph's are counted whatever their dtype)."""
    layers = 0
    for m in module.modules():
        if isinstance(m, torch.jit.ScriptModule):
            weight = getattr(m, "weight", None)  # none once frozen: a constant of its graph
            if _SCRIPTED_LINEAR.fullmatch(m._c._type().qualified_name()) is not None and weight is not None:
                layers += weight.dtype is torch.float32
            elif next(m.children(), None) is None and m._c._has_method("forward"):
                # A leaf without a forward of its own (a ParameterList, an empty ModuleList, a traced submodule
                # its parent never calls) has no graph: reading one raised, and failed the server's start.
                layers += _frozen_linears(m)
        elif isinstance(m, torch.fx.GraphModule):
            # A layer called twice is one: counted by its path in the module exported.
            called = set()
            for node in m.graph.nodes:
                stack = node.meta.get("nn_module_stack")
                if node.op == "call_function" and stack:
                    path, kind = list(stack.values())[-1]
                    if kind == _EXPORTED_LINEAR:
                        called.add(path)
            layers += len(called)
    return layers


def _frozen_linears(m: torch.jit.ScriptModule) -> int:
    """The fp32 linears of a TorchScript module frozen as it is shipped (torch.jit.freeze): its submodules are
    inlined, none left to count, so its graph's aten::linear calls on a weight frozen into a constant. One of a
    module not frozen reads its weight from an attribute (an F.linear of its own, no nn.Linear): not counted.
    torch.jit.optimize_for_inference leaves no aten::linear (this torch's: an aten::matmul on the transposed
    weight, then aten::add), which a model's own matmul is too: not counted."""
    count = 0
    graph = m.inlined_graph  # held: its nodes are invalidated once the graph is freed
    for node in graph.findAllNodes("aten::linear"):
        weight = node.inputsAt(1).toIValue()  # None where not a constant
        count += isinstance(weight, torch.Tensor) and weight.dtype is torch.float32
    return count
