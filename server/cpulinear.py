"""`nn.Linear` on the CPU through oneDNN, for batches of a few rows and more.

Profiled in the server at 1,000 QPS (docs/performance.md, "The model's own kernels"), the demo
mlp's worker spent about a fifth of its time in MKL copying weight panels into its own layout
(`sgemm_scopy`), once per layer and batch: for a few rows, torch's fp32 `addmm` repacks the
whole weight to multiply it by a thin input. oneDNN's matmul (`mkldnn._linear_pointwise`, the
kernel torch's own compiler emits for CPU linear layers) reads the weight as it is and fuses
the ReLU after it. Up to three rows torch's matrix-vector path is as fast, so those stay with
`F.linear`.

The rewrite is a structural copy of the module that shares every Parameter (no weight is
copied, the original module is untouched): a plain `nn.Sequential` with Linear layers becomes a
`OneDNNSequential`, which runs each run of consecutive Linears (with the ReLU right after each)
as one chain, padding the rows once at its start; any other plain `nn.Linear` becomes a
`OneDNNLinear`. Results agree with `F.linear` to float32 rounding (a different summation
order), as they already differ between batch sizes.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

# Rows (the product of all but the last input dimension) from which a layer runs on oneDNN.
# Measured on the mlp's shapes on the 2-core machine (docs/performance.md): below 4 rows
# torch's matrix-vector path is as fast or faster; from 4 rows, padded as below, the mlp runs
# 1.2-1.8 × faster on oneDNN (up to 2.4 × at 512 rows).
MIN_ROWS = 4
# oneDNN builds (and caches, up to 1,024) one kernel per row count and layer shape, about 0.7 MB
# each: every batch size would be one more (the mlp's 29 sizes from 4 to 32 added 50 MB).
# Rows are padded with zeros to the next power of two up to BUCKET_STEP, then to a multiple of
# it, so a layer has a handful of kernels (4, 8, 16, 32, 64, 128, 192, ...); the padding costs
# up to a quarter of a batch's time, at sizes just above a power of two.
BUCKET_STEP = 64


def padded_rows(rows: int) -> int:
    """The row count a batch of `rows` runs with on oneDNN."""
    if rows <= BUCKET_STEP:
        return 1 << (rows - 1).bit_length()
    return -(-rows // BUCKET_STEP) * BUCKET_STEP


def _op():
    try:
        return torch.ops.mkldnn._linear_pointwise
    except (AttributeError, RuntimeError):  # a build without oneDNN's fusion ops
        return None


def onednn_available() -> bool:
    """Whether this torch build can run linear layers through oneDNN."""
    return torch.backends.mkldnn.is_available() and _op() is not None


# One step of a chain: a Linear (its parameters read at each call, so in-place loads show) and
# whether the ReLU after it is fused.
Step = tuple[nn.Linear, bool]


def run_chain(x: torch.Tensor, steps: Sequence[Step], min_rows: int = MIN_ROWS) -> torch.Tensor:
    """Linear layers (each with its ReLU or not) one after another, as torch would run them.

    Inference (no autograd) on fp32 CPU inputs of at least `min_rows` rows runs oneDNN's fused
    kernel: the rows are padded once for the whole chain and cut once at its end. Anything else
    runs `F.linear` (and `F.relu`), exactly as before.
    """
    first = steps[0][0]
    rows = x.numel() // first.in_features if x.dim() >= 2 else 0
    kernel = _op() if rows >= min_rows else None
    if kernel is None or x.dtype is not torch.float32 or x.device.type != "cpu" or torch.is_grad_enabled():
        for linear, relu in steps:
            x = F.linear(x, linear.weight, linear.bias)
            if relu:
                x = F.relu(x)
        return x
    flat = x.reshape(rows, first.in_features)
    padded = padded_rows(rows)
    if padded != rows:
        # Zeros, not garbage: stale bits could be denormals, which are slow to multiply.
        buf = flat.new_zeros((padded, first.in_features))
        buf[:rows] = flat
        flat = buf
    for linear, relu in steps:
        flat = kernel(flat, linear.weight, linear.bias, "relu" if relu else "none", [], "")
    if padded != rows:
        flat = flat[:rows]
    return flat.reshape(*x.shape[:-1], steps[-1][0].out_features)


class OneDNNLinear(nn.Linear):
    """An `nn.Linear` whose forward is `run_chain` of itself; its parameters are the original's
    (shared, not copied), and it is still an `nn.Linear` to code that checks."""

    def __init__(self, linear: nn.Linear, *, min_rows: int = MIN_ROWS) -> None:
        nn.Module.__init__(self)  # not nn.Linear's: it would allocate new weights
        if min_rows < 1:
            raise ValueError(f"min_rows must be >= 1; got {min_rows}")
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.weight = linear.weight
        if linear.bias is None:
            self.register_parameter("bias", None)
        else:
            self.bias = linear.bias
        self.min_rows = min_rows
        self._steps = ((self, False),)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return run_chain(x, self._steps, self.min_rows)


class OneDNNSequential(nn.Sequential):
    """An `nn.Sequential` that runs each run of consecutive plain Linear layers (with the ReLUs
    right after them) as one chain through oneDNN. Its children are the original modules, so
    indexing, iterating and slicing it give what they gave before; only calling it differs."""

    min_rows: int = MIN_ROWS

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self._plan = _plan(list(self._modules.values()))

    def forward(self, x):
        for step in self._plan:
            x = run_chain(x, step, self.min_rows) if isinstance(step, tuple) else step(x)
        return x


def _eligible(m: nn.Module | None) -> bool:
    # Subclasses are left alone: their owners may read them differently (MultiheadAttention's
    # out_proj is passed to a functional kernel by its weights).
    return type(m) is nn.Linear and m.weight.dtype is torch.float32 and m.weight.device.type == "cpu"


def _plan(children: list[nn.Module]) -> list:
    """The children as steps: a module to call, or a tuple of chain steps."""
    plan: list = []
    i = 0
    while i < len(children):
        chain: list[Step] = []
        while i < len(children) and _eligible(children[i]):
            relu = i + 1 < len(children) and type(children[i + 1]) is nn.ReLU
            chain.append((children[i], relu))
            i += 2 if relu else 1
        if chain:
            plan.append(tuple(chain))
        else:
            plan.append(children[i])
            i += 1
    return plan


def _counts(m: nn.Module) -> tuple[int, int]:
    """(Linear layers run through oneDNN, ReLUs fused) in the module tree."""
    layers = fused = 0
    for sub in m.modules():
        if type(sub) is OneDNNLinear:
            layers += 1
        elif type(sub) is OneDNNSequential:
            for step in sub._plan:
                if isinstance(step, tuple):
                    layers += len(step)
                    fused += sum(relu for _, relu in step)
    return layers, fused


def _rewrite(m: nn.Module, min_rows: int) -> nn.Module:
    new = {}
    for name, child in m._modules.items():
        if child is None:
            new[name] = None
        elif _eligible(child) and type(m) is not nn.Sequential:  # a Sequential's own are chained below
            new[name] = OneDNNLinear(child, min_rows=min_rows)
        else:
            new[name] = _rewrite(child, min_rows)
    plain_sequential = type(m) is nn.Sequential and any(_eligible(c) for c in new.values())
    if not plain_sequential and all(new[k] is c for k, c in m._modules.items()):
        return m
    clone = copy.copy(m)  # shares parameters, buffers and hooks; only the children (and class) differ
    clone._modules = new
    if plain_sequential:
        clone.__class__ = OneDNNSequential
        clone.min_rows = min_rows
        clone._plan = _plan(list(new.values()))
    return clone


def with_onednn_linear(module: nn.Module, min_rows: int = MIN_ROWS) -> tuple[nn.Module, int, int]:
    """(module', layers, fused): a copy of `module` whose plain fp32 CPU `nn.Linear`s run through
    oneDNN (`layers` of them, `fused` with the ReLU after them), sharing every parameter; the
    module itself when there are none, when it is TorchScript, or when oneDNN is not available."""
    if min_rows < 1:
        raise ValueError(f"min_rows must be >= 1; got {min_rows}")
    if isinstance(module, torch.jit.ScriptModule) or not onednn_available():
        return module, 0, 0
    clone = OneDNNLinear(module, min_rows=min_rows) if _eligible(module) else _rewrite(module, min_rows)
    return (clone, *_counts(clone)) if clone is not module else (module, 0, 0)
