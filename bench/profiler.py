"""`wok profile`: batch time against batch size, FLOPs and bytes per batch, and the roofline.

A model is run in-process through wok's own Executor, on one instance, exactly as the
server runs a batch (assemble the requests' rows into the slot's host buffers, forward,
split), a batch holding requests of one batching key as the server's batcher forms it (`KeyedPool`).
For each batch size the batch time is the worker's time for one batch
(`BatchResult.finished - started`); sizes are visited round robin, one batch each per
round, so that a slow spell of a shared machine spreads over every size instead of
bending the curve. T(n) = α + β·n is fitted by least squares on the per-size medians
(`wok.bench.tune.fit_medians`, as `wok tune` fits the profiles it writes itself); where a size's
batches are of several keys, on each key's median weighted by its share: their mean, the time a
batch costs in `wok plan` and `wok simulate`, which the mixture's median is not.

The work of a batch is counted on the model itself, with one forward pass under two
dispatch modes (see docs/profile.md for the full rules); where the payloads' sizes vary, the
figures per batch size are the mean over the timed batches, from at most COUNTED_BATCHES passes:

* FLOPs: `torch.utils.flop_counter.FlopCounterMode` (matmuls, convolutions, the
  attention kernels it knows: 2 FLOPs per multiply-add), plus what it does not count
  that is added here: EmbeddingBag pooling (adds of the pooled rows) and CPU flash
  attention. Elementwise ops (bias adds, activations, norms, softmax) are not counted;
  every op seen without a formula is listed in `counting.uncounted_ops`.
* bytes: each op reads its tensor inputs and writes its tensor outputs; a parameter is
  read once per batch, however many ops use it; an embedding lookup reads only the rows it
  gathers (one row per id), not the table; views move nothing.

Intensity I = FLOPs / bytes per batch classifies the batch: compute-bound (I > 10),
memory-bound (I < 1), in between otherwise; the roofline turns FLOPs and bytes into a
predicted time, max(FLOPs/peak, bytes/bandwidth), compared with the forward time measured.
"""

from __future__ import annotations

import math
import re
import sys
import threading
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Protocol

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode, flop_registry, sdpa_flop_count

from wok import tables
from wok.codec import check_values
from wok.config import InstanceConfig, check_device
from wok.cpulinear import chains
from wok.errors import (
    InterruptedWorkLeft,
    InvalidInput,
    ModelExecutionError,
    WarmupError,
    message_of,
    script_error,
    to_status,
)
from wok.executor import Executor, failure_line, resolve_devices
from wok.numerals import SPACES
from wok.servable import HostBuffers, Servable
from wok.service import short_details

from ..errors import NAME_CHARS, quoted_name, unquoted
from .analysis import latency_summary
from .analysis import ms_text as _ms
from .payloads import (
    DEFAULT_INT_HIGH,
    POOL_CAP_BYTES,
    PayloadGenerator,
    TensorSpec,
    check_int_high,
    integer_cap,
    integer_refusal,
    parse_sizes,
    support_of,
)
from .roofline import Roofline
from .tune import KEYED_FIT_ON, fit_medians
from .tune import fit_linear as fit_linear_tuple

SCHEMA = "wok.profile/1"
COMPUTE_BOUND = 10.0  # FLOP/byte above which a batch is compute-bound
MEMORY_BOUND = 1.0  # ... and below which it is memory-bound
# Timed batches whose work is counted per batch size when the payloads' sizes vary: one counting pass is a
# forward under two dispatch modes (about 50-130 ms for 16 encoder sequences on 2 cores), so counting every
# one of --repeats batches would cost more than timing them. See `representatives` for which ones.
COUNTED_BATCHES = 8
# Requests drawn at most beyond the pool to give each batching key of it as many requests as the largest batch
# (`keyed_pool`); a key rarer than about n in this many draws gets no batch of n, and the document says so. Most
# draws are made, keyed and dropped: 0.05 s for encoder's uniform:8:200 (its rarest bucket, 8 tokens alone, 1
# draw in 193, took 5,900 draws to hold 32 requests). FILL_CHUNK: the draws made at once.
FILL_DRAWS = 1 << 16
FILL_CHUNK = 256
# How long a Ctrl-C's shutdown waits for a batch the model is still running (`warmed_executor`): the server's start
# waits as long for its models after a cancelled warm-up (STARTCUT57, app.WokServer._shutdown_within).
INTERRUPT_WAIT_S = 1.0
# The executor's stages (wok.executor.StageTimes); on the CPU h2d is 0 and d2h is the split.
STAGES = ("assemble", "h2d", "compute", "d2h")

aten = torch.ops.aten
_EMBEDDING_BAG = {aten.embedding_bag, aten._embedding_bag, aten._embedding_bag_forward_only}
_EMBEDDING = {aten.embedding}
_CPU_FLASH = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu", None)
# Ops that allocate without writing a value.
_NO_WRITE = {aten.empty, aten.empty_strided, aten.empty_like, aten.new_empty}
# Ops that take a tensor for its shape, dtype and device only: none of its bytes are read.
_SHAPE_ONLY = {
    aten.empty_like, aten.zeros_like, aten.ones_like, aten.full_like, aten.rand_like, aten.randn_like,
    aten.new_empty, aten.new_empty_strided, aten.new_zeros, aten.new_ones, aten.new_full,
}  # fmt: skip


def classify(intensity: float) -> str | None:
    """The class of intensity I; None when there is none (0 FLOPs over 0 bytes: the pass counted nothing)."""
    if math.isnan(intensity):  # neither above, below nor between the thresholds
        return None
    if intensity > COMPUTE_BOUND:
        return "compute-bound"
    if intensity < MEMORY_BOUND:
        return "memory-bound"
    return "in between"


# ---------------------------------------------------------------------------- counting


def _tensors(x) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in _tensors(v)]
    if isinstance(x, dict):
        return [t for v in x.values() for t in _tensors(v)]
    return []


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _named_args(func, args, kwargs) -> dict:
    named = {a.name: v for a, v in zip(func._schema.arguments, args)}
    named.update(kwargs)
    return named


@dataclass
class WorkCount:
    """What one forward pass of one batch did."""

    flops_counter: int = 0  # FlopCounterMode's total
    flops_added: dict[str, int] = field(default_factory=dict)  # "embedding_bag", "scaled_dot_product_attention"
    param_bytes: int = 0  # parameters and buffers, each read once
    activation_read_bytes: int = 0  # inputs and intermediates, read by every op that reads them
    activation_write_bytes: int = 0  # every op output
    embedding_row_bytes: int = 0  # rows gathered by embedding lookups
    embedding_rows: int = 0
    uncounted_ops: set[str] = field(default_factory=set)

    @property
    def flops(self) -> int:
        return self.flops_counter + sum(self.flops_added.values())

    @property
    def bytes(self) -> int:
        return self.param_bytes + self.activation_read_bytes + self.activation_write_bytes + self.embedding_row_bytes


class _WorkMode(TorchDispatchMode):
    """Counts bytes moved per op, and the FLOPs of ops FlopCounterMode has no formula for.

    Entered before (under) FlopCounterMode, so it sees the ops after FlopCounterMode has
    decomposed composite ones (linear → t + addmm).
    """

    def __init__(self, params: dict[int, int], work: WorkCount) -> None:
        super().__init__()
        self.params = params  # storage pointer -> bytes, for parameters and buffers
        self.seen: set[int] = set()
        self.work = work
        # The last op's error as raised here: a TorchScript model's own error then holds no message of it (`told`).
        self.failed: Exception | None = None

    def told(self, exc: Exception) -> Exception:
        """The error a forward that raised `exc` under this mode is told with. Only a TorchScript model's op error
        is the one kept here: the interpreter's error raised for it holds no message of it, and a script catches
        nothing. A Python model's op error is `exc` itself, and one it caught before is no part of what it raised
        (`try: ...; except IndexError: raise ValueError(...)`): the executor tells `exc`, and so is it told."""
        if self.failed is not None and script_error(message_of(exc)) is not None:
            return self.failed
        return exc

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        try:
            out = func(*args, **kwargs)
        except Exception as exc:
            self.failed = exc
            raise
        packet = func._overloadpacket
        # An `out=` tensor is written, not read; a shape-only argument is not read at all.
        named = _named_args(func, args, kwargs)
        skip = {a.name for a in func._schema.arguments if a.is_out or packet in _SHAPE_ONLY}
        ins, outs = _tensors([v for k, v in named.items() if k not in skip]), _tensors(out)
        in_place = any(r.alias_info is not None and r.alias_info.is_write for r in func._schema.returns)
        in_storages = {_storage(t) for t in ins}
        if not in_place and outs and all(_storage(t) in in_storages for t in outs):
            return out  # a view (t, view, transpose, detach, _unsafe_view): nothing moves
        if packet in _EMBEDDING_BAG or packet in _EMBEDDING:
            self._embedding(packet, named, outs[0])
        else:
            for t in ins:
                self._read(t)
            if packet not in _NO_WRITE:
                self.work.activation_write_bytes += sum(_nbytes(t) for t in outs)
            if packet is _CPU_FLASH and packet not in flop_registry:
                q, k, v = args[:3]
                self._add_flops("scaled_dot_product_attention", sdpa_flop_count(q.shape, k.shape, v.shape))
            elif packet not in flop_registry and packet not in _NO_WRITE:
                self.work.uncounted_ops.add(str(packet))
        return out

    def _read(self, t: torch.Tensor) -> None:
        ptr = _storage(t)
        if ptr in self.params:
            if ptr not in self.seen:
                self.seen.add(ptr)
                self.work.param_bytes += self.params[ptr]
        else:
            self.work.activation_read_bytes += _nbytes(t)

    def _add_flops(self, key: str, flops: int) -> None:
        self.work.flops_added[key] = self.work.flops_added.get(key, 0) + int(flops)

    def _embedding(self, packet, a: dict, pooled: torch.Tensor) -> None:
        weight, indices = a["weight"], a["indices"]
        row_bytes = weight.shape[-1] * weight.element_size()
        # A bag skips its padding id; a plain lookup still reads that (zero) row.
        padding = a.get("padding_idx") if packet in _EMBEDDING_BAG else None
        valid = indices != padding if padding is not None and padding >= 0 else torch.ones_like(indices, dtype=bool)
        rows = int(valid.sum())
        self.work.embedding_rows += rows
        self.work.embedding_row_bytes += rows * row_bytes
        reads = [indices, a.get("offsets"), a.get("per_sample_weights")]
        self.work.activation_read_bytes += sum(_nbytes(t) for t in reads if isinstance(t, torch.Tensor))
        # Only the pooled (or gathered) rows are the op's result; the bag kernels' other
        # outputs (offset2bag, bag sizes) are scratch of one implementation.
        self.work.activation_write_bytes += _nbytes(pooled)
        if packet in _EMBEDDING_BAG:
            self._add_flops("embedding_bag", _bag_flops(a, valid, pooled))


def _bag_flops(a: dict, valid: torch.Tensor, pooled: torch.Tensor) -> int:
    """Pooling k rows of width D: (k-1)·D adds (sum), the same compares (max), plus D divides
    (mean) per non-empty bag; per-sample weights add k·D multiplies."""
    bags, dim = pooled.shape[0], pooled.shape[-1]
    offsets = a["offsets"].to(torch.int64).cpu()
    starts = offsets[:bags]
    ends = torch.cat([offsets[1 : bags + 1], torch.tensor([valid.numel()])])[:bags]
    if a.get("include_last_offset"):
        ends = offsets[1 : bags + 1]
    counted = torch.cat([torch.zeros(1, dtype=torch.int64), valid.reshape(-1).to(torch.int64).cpu().cumsum(0)])
    k = counted[ends] - counted[starts]
    flops = int((k - 1).clamp(min=0).sum()) * dim
    if a.get("mode", 0) == 1:
        flops += int((k > 0).sum()) * dim
    if isinstance(a.get("per_sample_weights"), torch.Tensor):
        flops += int(k.sum()) * dim
    return flops


def _parameter_storages(module: torch.nn.Module) -> dict[int, int]:
    out = {}
    for t in [*module.parameters(), *module.buffers()]:
        out[_storage(t)] = t.untyped_storage().nbytes()
    return out


# TorchDispatchMode wraps each subclass's __torch_dispatch__ in torch._disable_dynamo, whose first call imports
# torch._dynamo: ~1.2 s, a fifth of a short `wok profile`. The wrap keeps dynamo from compiling the mode's own frames,
# and only a loaded dynamo compiles anything, so where torch._dynamo is not loaded the counting pass runs the same
# modes unwrapped (`__wrapped__`: the function as written); where it is (a model that compiles), as torch made them.
# A model can load dynamo during the pass (an eager torch.cond compiles; a torch.compile first called then): dynamo
# then traces the unwrapped modes' frames (torch.cond failed, "Unsupported: missing tp_iter"), so `count_work` counts
# such a pass again with torch's modes.
# Private parts of torch (2.13): a torch without them (pyproject allows 2.4 on) counts with the modes as torch makes
# them, the import's cost paid.
try:
    from torch.utils.flop_counter import _FlopCounterMode
except ImportError:
    _FlopCounterMode = None
_QUIET = _FlopCounterMode is not None and all(
    hasattr(m.__torch_dispatch__, "__wrapped__") and hasattr(m, "_should_skip_dynamo")
    for m in (_WorkMode, _FlopCounterMode)
)

if _QUIET:

    class _QuietWorkMode(_WorkMode):
        __torch_dispatch__ = _WorkMode.__torch_dispatch__.__wrapped__

        @classmethod
        def _should_skip_dynamo(cls) -> bool:
            return False

    class _QuietFlopMode(_FlopCounterMode):
        """FlopCounterMode's own dispatch mode (its formulas, decompositions, higher-order ops), unwrapped."""

        __torch_dispatch__ = _FlopCounterMode.__torch_dispatch__.__wrapped__

        @classmethod
        def _should_skip_dynamo(cls) -> bool:
            return False

    class _QuietFlopCounter(FlopCounterMode):
        def __enter__(self):
            # FlopCounterMode.__enter__ but for the mode it enters.
            self.flop_counts.clear()
            self.mod_tracker.__enter__()
            self.mode = _QuietFlopMode(self)
            self.mode.__enter__()
            return self


def _dynamo_loaded() -> bool:
    return "torch._dynamo" in sys.modules


def count_work(servable: Servable, device: torch.device, requests: Sequence[dict[str, np.ndarray]]) -> WorkCount:
    """FLOPs and bytes of one forward pass over `requests` (one batch), on `device`."""
    if _QUIET and not _dynamo_loaded():
        try:
            work = _count_pass(servable, device, requests, quiet=True)
        except Exception:
            if not _dynamo_loaded():
                raise
        else:
            if not _dynamo_loaded():
                return work
        # The model loaded dynamo in the pass (see above): its result, or its failure, may be dynamo's tracing of the
        # quiet modes.
    return _count_pass(servable, device, requests, quiet=False)


def _count_pass(
    servable: Servable, device: torch.device, requests: Sequence[dict[str, np.ndarray]], *, quiet: bool
) -> WorkCount:
    """`count_work`'s pass, with the quiet modes or torch's."""
    module = servable.module_for(device)
    rows = sum(next(iter(r.values())).shape[0] for r in requests)
    host = servable.assemble(requests, rows, HostBuffers(pinned=False))
    tensors = servable.prepare({k: v.to(device) for k, v in host.items()})
    work = WorkCount()
    # Fused inference kernels (nn.TransformerEncoderLayer's fast path) have no FLOP formula;
    # the unfused path computes the same products, each a counted matmul.
    fastpath = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        # no_grad, not inference_mode: under inference_mode and FlopCounterMode TorchScript's aten::numel
        # raises a RuntimeError with no message (torch 2.13), and nn.EmbeddingBag's forward reads numel().
        params = _parameter_storages(module)
        if quiet:
            mode, counter = _QuietWorkMode(params, work), _QuietFlopCounter(display=False)
        else:
            mode, counter = _WorkMode(params, work), FlopCounterMode(display=False)
        with torch.no_grad(), mode, counter:
            try:
                servable.forward(module, tensors)
            except Exception as exc:  # the requests may be none the timing ran: told as the executor tells it
                raise ModelExecutionError(failure_line(servable.name, mode.told(exc))) from exc
    finally:
        torch.backends.mha.set_fastpath_enabled(fastpath)
    work.flops_counter = int(counter.get_total_flops())
    return work


def representatives(keys: Sequence, most: int = COUNTED_BATCHES) -> list[tuple[int, int]]:
    """Which of the batches with these (sortable) keys to count, as (index, how many batches it stands for).

    At most `most` distinct keys: each once, at its first batch, weighted by its count (exact where a batch's
    work follows from its key). More: the batches sorted by key cut into `most` runs as equal in number as
    can be, each counted at its middle batch and weighted by its length (a stratified sample, so that a
    draw of sizes that is long, or short, by chance does not stand for the whole distribution)."""
    if (refusal := integer_refusal("most", most, 1)) is not None:
        raise ValueError(refusal)
    order = sorted(range(len(keys)), key=keys.__getitem__)
    groups: dict = {}
    for i in order:
        groups.setdefault(keys[i], []).append(i)
    if len(groups) <= most:
        return [(members[0], len(members)) for members in groups.values()]
    return [(int(run[len(run) // 2]), len(run)) for run in np.array_split(np.asarray(order), most)]


def batch_shapes(servable: Servable, requests: Sequence[dict[str, np.ndarray]], buffers: HostBuffers) -> tuple:
    """What the model is given for these requests, as (elements, shapes): the tensors `assemble` makes
    (padded to the longest request, where the model pads), so that batches sort by the work they hold.
    Not the batcher's key (`Servable.batch_key`, which decides which requests may share a batch): a batch of
    one such key still pads to its own longest request."""
    rows = sum(next(iter(r.values())).shape[0] for r in requests)
    shapes = tuple(sorted((name, tuple(t.shape)) for name, t in servable.assemble(requests, rows, buffers).items()))
    return sum(math.prod(shape) for _, shape in shapes), shapes


def mean_work(counted: Sequence[tuple[WorkCount, int]]) -> WorkCount:
    """The weighted mean of counted passes, field by field (floats); uncounted ops: those of any pass."""
    total = sum(weight for _, weight in counted)

    def mean(value: Callable[[WorkCount], float]) -> float:
        return sum(value(work) * weight for work, weight in counted) / total

    added = sorted({k for work, _ in counted for k in work.flops_added})
    return WorkCount(
        flops_counter=mean(lambda w: w.flops_counter),
        flops_added={k: mean(lambda w, k=k: w.flops_added.get(k, 0)) for k in added},
        param_bytes=mean(lambda w: w.param_bytes),
        activation_read_bytes=mean(lambda w: w.activation_read_bytes),
        activation_write_bytes=mean(lambda w: w.activation_write_bytes),
        embedding_row_bytes=mean(lambda w: w.embedding_row_bytes),
        embedding_rows=mean(lambda w: w.embedding_rows),
        uncounted_ops=set().union(*(work.uncounted_ops for work, _ in counted)),
    )


def count_timed(
    servable: Servable, device: torch.device, requests: list, batches: Sequence[Sequence[int]]
) -> tuple[WorkCount, int]:
    """The mean work of the timed batches (each the indices of its requests in `requests`, as `time_batches`
    formed it), and how many passes it counted (`representatives`: at most COUNTED_BATCHES)."""
    buffers = HostBuffers(pinned=False)
    keys = [batch_shapes(servable, [requests[i] for i in batch], buffers) for batch in batches]
    picked = representatives(keys)
    counted = [(count_work(servable, device, [requests[j] for j in batches[i]]), weight) for i, weight in picked]
    return mean_work(counted), len(picked)


def sizes_vary(servable: Servable, sizes: str) -> bool:
    """Whether the requests made with `sizes` differ in shape: a variable dimension, and more than one size."""
    variable = any(-1 in t.dims for t in servable.config.inputs)
    return variable and support_of(parse_sizes(sizes), limit=1) is None


# ---------------------------------------------------------------------------- the fit


@dataclass(frozen=True)
class Fit:
    alpha_s: float
    beta_s: float
    r2: float

    def time_s(self, n: float) -> float:
        return self.alpha_s + self.beta_s * n

    def throughput(self, n: float) -> float:
        """Samples per second at batch size n: n / (α + β·n)."""
        t = self.time_s(n)
        return n / t if t > 0 else math.nan

    @property
    def ceiling(self) -> float:
        """1/β, the throughput that large batches approach; NaN when β ≤ 0 (no ceiling seen)."""
        return 1.0 / self.beta_s if self.beta_s > 0 else math.nan


def fit_linear(n: Sequence[float], t: Sequence[float]) -> Fit:
    """Least squares T = α + β·n, and R² = 1 - SS_res / SS_tot (1 when every t is equal and fitted): `wok tune`'s
    line (`tune.fit_linear`), so that a profile fitted here and one fitted there agree."""
    return Fit(*fit_linear_tuple(n, t))


# ---------------------------------------------------------------------------- the run


@dataclass
class ProfileConfig:
    batch_sizes: list[int]
    warmup: int = 5  # batches per size before timing
    repeats: int = 100  # timed batches per size
    sizes: str = "fixed:16"  # length of variable dims, as `wok bench ramp --sizes`
    int_high: int | None = None  # integer inputs uniform in [0, int_high); None: by input (`_int_highs`)
    device: str = "auto"
    seed: int = 0
    cpu_linear: str = "onednn"  # how a CPU instance runs nn.Linear, as `wok serve --cpu-linear`

    def __post_init__(self) -> None:
        check_batch_sizes(self.batch_sizes)
        check_options(
            warmup=self.warmup,
            repeats=self.repeats,
            seed=self.seed,
            int_high=self.int_high,
            device=self.device,
            cpu_linear=self.cpu_linear,
        )


def check_batch_sizes(batch_sizes: Sequence[int]) -> None:
    """--batch-sizes as a profile takes them (ProfileConfig): two or more different sizes, each >= 1."""
    if len(set(batch_sizes)) < 2:
        raise ValueError(f"--batch-sizes: expected two or more different sizes (to fit α and β); got {batch_sizes}")
    if any(n < 1 for n in batch_sizes):
        raise ValueError(f"--batch-sizes: expected sizes >= 1; got {batch_sizes}")


def check_options(*, warmup: int, repeats: int, seed: int, int_high: int | None, device: str, cpu_linear: str) -> None:
    """A profile's settings but its batch sizes, each refused naming its option (ProfileConfig): `wok profile` checks
    them before it loads the model, which takes seconds for a large one (until 2026-12-07 a typo was refused after)."""
    # --seed: numpy's own refusal names no option ("expected non-negative integer").
    for option, value, least in (("--warmup", warmup, 0), ("--repeats", repeats, 1), ("--seed", seed, 0)):
        if (refusal := integer_refusal(option, value, least)) is not None:
            raise ValueError(refusal)
    if int_high is not None:
        check_int_high(int_high)
    try:
        check_device(device)
    except ValueError as exc:
        raise ValueError(f"--device: {exc}") from None
    if cpu_linear not in ("onednn", "torch"):
        raise ValueError(f"--cpu-linear {quoted_name(cpu_linear)}: expected onednn or torch")


def profile_device(device: str) -> torch.device:
    """The device `--device` names (check_device's forms), resolved as the server resolves it; a CUDA one that is not
    here refused naming --device."""
    try:
        return resolve_devices([device])[0]
    except ModelExecutionError as exc:
        raise ValueError(f"--device: {exc}") from None


def default_batch_sizes(max_batch_size: int) -> list[int]:
    """Powers of two up to max_batch_size, and max_batch_size itself."""
    sizes = [1 << k for k in range(max_batch_size.bit_length()) if 1 << k <= max_batch_size]
    return sizes if sizes[-1] == max_batch_size else [*sizes, max_batch_size]


def parse_batch_sizes(spec: str) -> list[int]:
    """ "1,2,4,8" or a range "1:32:2", as `parse_steps` reads QPS steps; whole numbers only. The refusals that show
    a form show batch sizes (`parse_steps`' examples are QPS: '50:800:2'), and a range of too many counts sizes."""
    from .arrivals import parse_steps

    text = spec.strip(SPACES)
    if not text:
        raise ValueError(
            f"--batch-sizes {quoted_name(spec)}: expected a list like '1,2,4,8' or a range start:stop:factor like "
            "'1:32:2'"
        )
    if ":" in text and (parts := len(text.split(":"))) != 3:
        raise ValueError(
            f"--batch-sizes {quoted_name(spec)}: expected start:stop:factor (e.g. '1:32:2'); got {parts} parts"
        )
    try:
        values = parse_steps(spec, noun="size")
    except ValueError as exc:
        # parse_steps speaks of QPS steps; the message that reaches the user names this option. Its subject is cut off
        # whole: cut at the first ": ", a spec holding one ('1: 2') left its tail in the message.
        detail = str(exc)
        for subject in (f"QPS range {quoted_name(spec)}: ", f"QPS steps {quoted_name(spec)}: "):
            if detail.startswith(subject):
                detail = detail.removeprefix(subject)
                break
        detail = re.sub(r"^(\d+) steps; at most ", r"\1 sizes; at most ", detail)
        raise ValueError(f"--batch-sizes {quoted_name(spec)}: {detail}") from None
    if any(v != int(v) for v in values):
        raise ValueError(f"--batch-sizes: expected whole numbers; got {quoted_name(spec)}")
    return [int(v) for v in values]


def id_range(servable: Servable) -> int:
    """Ids valid for every embedding table of the model (its smallest one), else DEFAULT_INT_HIGH: the bound of
    the integer inputs `id_highs` has none for. The tables: those its modules are (nn.Embedding, nn.EmbeddingBag,
    alike in a TorchScript module and a torch.export program's graph), and those the load found its inputs'
    ids gathered from in its graph (Servable.id_bounds: F.embedding of a parameter, index_select, `table[ids]`)."""
    rows = smallest_table(servable)
    return DEFAULT_INT_HIGH if rows is None else rows


def smallest_table(servable: Servable) -> int | None:
    """The rows of the model's smallest embedding table (`id_range`'s tables), or None where none is found."""
    module = servable.module_for(torch.device("cpu"))
    found = [rows for m in module.modules() for rows in tables.table_rows(m)]
    return min(found + list(servable.id_bounds.values()), default=None)


def id_highs(servable: Servable) -> dict[str, int]:
    """By integer input whose ids the load followed to tables (tables.IdRanges.bounds, Servable.id_bounds: through
    ops that keep their values, or some of them), the rows of the smallest: ids drawn below it reach no table past
    its rows. A demo model's inputs reach its module through its own forward, and have none."""
    return {name: max(rows, 1) for name, rows in servable.id_bounds.items()}


def _int_highs(servable: Servable, cfg: ProfileConfig) -> tuple[int, dict[str, int]]:
    """The bound of integer inputs (--int-high, else `id_range`), and by input the bounds `id_highs` has, which
    --int-high overrides."""
    if cfg.int_high:
        return cfg.int_high, {}
    return id_range(servable), id_highs(servable)


def int_high_source(servable: Servable, cfg: ProfileConfig, by_input: Mapping[str, int]) -> str | None:
    """Where `config.int_high` came from: `given` (--int-high), `table` (the model's smallest embedding table) or
    `default` (none found: DEFAULT_INT_HIGH); None where no integer input is drawn below it: the model has none, or
    each has its own bound in `by_input` (`_int_highs`)."""
    names = [t.name for t in servable.config.inputs if integer_cap(t.datatype) is not None]
    if not [name for name in names if name not in by_input]:
        return None
    if cfg.int_high:
        return "given"
    return "default" if smallest_table(servable) is None else "table"


def _type_capped(servable: Servable, high: int, by_input: Mapping[str, int]) -> dict[str, int]:
    """By integer input whose datatype holds no id up to its bound (`by_input`'s, else `high`), the bound it is drawn
    below instead: the type's largest value + 1, as PayloadGenerator caps it (an INT8 input's ids reach 127)."""
    out = {}
    for t in servable.config.inputs:
        cap = integer_cap(t.datatype)
        if cap is not None and cap < by_input.get(t.name, high):
            out[t.name] = cap
    return out


def _generator(servable: Servable, cfg: ProfileConfig) -> PayloadGenerator:
    high, by_input = _int_highs(servable, cfg)
    specs = [TensorSpec(t.name, t.datatype, (-1, *t.dims)) for t in servable.config.inputs]
    return PayloadGenerator(
        servable.name,
        specs,
        sizes=parse_sizes(cfg.sizes),
        rows=1,
        seed=cfg.seed,
        int_high=high,
        int_highs=by_input,
    )


def request_pool(servable: Servable, cfg: ProfileConfig, count: int) -> list[dict[str, np.ndarray]]:
    """`count` one-row requests shaped by the model's inputs, as the bench would send them."""
    return _generator(servable, cfg).pool(count)


@dataclass
class KeyedPool:
    """The requests timed batches are formed from, grouped as the server's batcher groups them: by the model's
    `Servable.batch_key` (the shape of every variable input by default, encoder's length bucket, recsys's one
    key), since requests of different keys never share a batch there.

    A batch of n takes a key in proportion to the pool's own draws (the first `len(keys)` requests, a sample
    of the payload distribution), then n consecutive requests of that key from a random place in its group.
    The requests past those were drawn only to give a key as many requests as the largest batch
    (`keyed_pool`); a key that still has fewer than n is left out of the batches of n (`short`).

    A key's requests are `counts[key]`; `groups[key]` holds as many of them as the pool's cap let it keep
    (`keyed_pool`: POOL_CAP_BYTES, one at least), and a batch takes the held ones in turn from its random place
    (`batch`): the same requests where none was dropped, the held ones repeated where some were."""

    requests: list[dict[str, np.ndarray]]
    keys: list[Hashable]  # the key of each of the pool's own draws
    groups: dict[Hashable, list[int]]  # key -> the indices of its held requests in `requests`, in the order drawn
    extra_draws: int = 0  # requests drawn beyond the pool's own to fill keys, kept or not
    counts: dict[Hashable, int] = field(default_factory=dict)  # key -> its requests, held or not; {}: `groups`'
    held_bytes: int = 0  # the held requests' arrays (`request_bytes`)
    _allowed: dict[int, list[int]] = field(default_factory=dict, repr=False, compare=False)
    _key_of: dict[int, Hashable] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = {key: len(members) for key, members in self.groups.items()}

    @property
    def size(self) -> int:
        """The pool's requests, held or not: its own draws and those kept from the extra draws."""
        return sum(self.counts.values())

    def allowed(self, n: int) -> list[int]:
        """The pool's own draws whose key has n requests or more: a batch of n takes its key from one of them."""
        if n not in self._allowed:
            self._allowed[n] = [i for i, key in enumerate(self.keys) if self.counts[key] >= n]
        return self._allowed[n]

    @property
    def most(self) -> int:
        """The most requests any key has: no batch is larger."""
        return max(self.counts.values())

    def key_of(self, batch: Sequence[int]) -> Hashable:
        """The key of a batch (`batch`'s indices in `requests`, all of one key)."""
        if not self._key_of:
            self._key_of.update((i, key) for key, members in self.groups.items() for i in members)
        return self._key_of[batch[0]]

    def short(self, n: int) -> tuple[int, float]:
        """How many keys of the pool have fewer than n requests, and the share of its own draws that are theirs."""
        keys = sum(count < n for count in self.counts.values())
        return keys, 1 - len(self.allowed(n)) / len(self.keys)

    def _allowed_or_raise(self, n: int) -> list[int]:
        allowed = self.allowed(n)
        if not allowed:
            raise ValueError(f"KeyedPool: a batch of {n} needs a key with {n} requests; the most any has: {self.most}")
        return allowed

    def plan(self, rng: np.random.Generator, n: int, count: int) -> list[Hashable] | None:
        """The keys of `count` batches of n, in random order: each key as often as its share of the pool's draws
        says, to within one (systematic sampling: the draws grouped by key, every len/count-th of them from one
        random offset). Drawn one batch at a time, a key's share of 100 batches strays by some 5 points, and
        with batch times that differ by key the median of one size then fell on another key than its
        neighbours' (encoder, uniform:8:200, seed 0: 53 of 100 batches of 16 of bucket 256, 42 of 32). None
        with one key: there is nothing to plan, and no draw is made."""
        if len(self.groups) == 1:
            return None
        order = {key: i for i, key in enumerate(self.groups)}
        allowed = sorted(self._allowed_or_raise(n), key=lambda i: order[self.keys[i]])
        step = len(allowed) / count
        offset = rng.random() * step
        keys = [self.keys[allowed[int(offset + j * step)]] for j in range(count)]
        return [keys[i] for i in rng.permutation(count)]

    def batch(self, rng: np.random.Generator, n: int, key: Hashable | None = None) -> list[int]:
        """The indices in `requests` of one batch of n, all of one key: `key` (from `plan`), else one drawn in
        proportion to the pool's draws."""
        if len(self.groups) == 1:
            # No key to take: the one random start per batch that batches took before there were keys.
            key = next(iter(self.groups))
        elif key is None:
            allowed = self._allowed_or_raise(n)
            key = self.keys[allowed[int(rng.integers(0, len(allowed)))]]
        group = self.groups[key]
        start = int(rng.integers(0, self.counts[key] - n + 1))
        if len(group) == self.counts[key]:
            return group[start : start + n]
        # A key holding fewer than n repeats a request within the batch (`profile` says so: requests_repeated). It
        # matters: a batch of 32 copies of one FP32 request assembled in 0.51x the time of 32 distinct ones at
        # 64 KiB a request, 0.74x at 2 MiB, 0.88x at 1 KiB (the executor's assemble stage, medians of 9 reps x 41
        # batches, alternated, 2-core EPYC, 2026-12-06): the repeats are read from cache.
        return [group[(start + j) % len(group)] for j in range(n)]


def request_bytes(request: Mapping[str, np.ndarray]) -> int:
    """The memory a request's arrays hold: their elements, and a BYTES input's strings (its array holds pointers)."""
    total = 0
    for a in request.values():
        total += a.nbytes
        if a.dtype == object:
            total += sum(len(v) for v in a.flat)
    return total


class PoolUnmade(Exception):
    """A request of the pool could not be made: `error` is numpy's (a MemoryError, or the ValueError of an array of
    more elements than it can count), `count` the requests the pool draws (`profile` refuses the options for it)."""

    def __init__(self, error: Exception, count: int) -> None:
        super().__init__(message_of(error))
        self.error, self.count = error, count


def _draws(gen: PayloadGenerator, n: int, count: int) -> Iterator[dict[str, np.ndarray]]:
    """`gen.pool(n)`'s requests (the same draws), made one at a time: a request the pool drops is then no longer
    held while the next is made (`keyed_pool`). PoolUnmade where numpy cannot make one."""
    for size in gen.sizes.sample(gen.rng, n):
        try:
            request = gen.make(gen.rng, int(size))
        except (MemoryError, ValueError) as exc:  # numpy: no memory, or more elements than it counts
            raise PoolUnmade(exc, count) from exc
        yield request
        del request  # else this frame held a request the pool dropped while the next was made


def keyed_pool(
    servable: Servable,
    cfg: ProfileConfig,
    count: int,
    largest: int,
    most_draws: int | None = None,
    cap_bytes: int | None = None,
) -> KeyedPool:
    """`request_pool`'s `count` requests grouped by batching key; then, while a key of theirs has fewer than
    `largest` requests, more drawn from the same payload distribution (at most `most_draws`, by default
    FILL_DRAWS), keeping only those a key still needs: the other keys' are dropped, so that the pool's own
    draws alone set how often each key is taken.

    The requests held are capped at `cap_bytes` (by default POOL_CAP_BYTES, the bench's cap of its own pool),
    one of each key at least: the draws are held up to the first that would pass the cap; from it on a request is
    counted to its key (`KeyedPool.counts`) and not kept, but for a key's first, its key's batches taking its held
    requests in turn. Uncapped, max(256, 4·largest n) requests of a few MB
    each were held whole: past the machine's memory, with overcommit, the pool's pages were the OOM killer's
    to find, where one batch of them ran."""
    most_draws = FILL_DRAWS if most_draws is None else most_draws
    cap_bytes = POOL_CAP_BYTES if cap_bytes is None else cap_bytes
    gen = _generator(servable, cfg)
    pool = KeyedPool([], [], {}, counts={})
    full = False  # a request was past the cap: from then on a key's first alone is held

    def take(request: dict[str, np.ndarray], key: Hashable) -> None:
        nonlocal full
        pool.counts[key] = pool.counts.get(key, 0) + 1
        nbytes = request_bytes(request)
        full = full or pool.held_bytes + nbytes > cap_bytes
        # The draws up to the first past the cap, as the bench's pool keeps them (`plan_pool`): a smaller request
        # after it, held while larger ones were not, drew the held requests of a key of several sizes (a length
        # bucket, BYTES strings) towards its shortest, its batches' times with them (2026-12-06).
        if key not in pool.groups or not full:
            pool.groups.setdefault(key, []).append(len(pool.requests))
            pool.requests.append(request)
            pool.held_bytes += nbytes

    for request in _draws(gen, count, count):
        key = servable.batch_key(request)
        pool.keys.append(key)
        take(request, key)
        del request  # not held while the next is made, where the pool dropped it
    wanted = {key: largest - k for key, k in pool.counts.items() if k < largest}
    while wanted and pool.extra_draws < most_draws:
        chunk = min(FILL_CHUNK, most_draws - pool.extra_draws)
        pool.extra_draws += chunk
        for request in _draws(gen, chunk, count):
            key = servable.batch_key(request)
            if key in wanted:
                take(request, key)
                wanted[key] -= 1
                if not wanted[key]:
                    del wanted[key]
            del request
    return pool


class Progress(Protocol):
    """What `profile` tells of its progress (runner.PlainProgress off a terminal, a bar on one)."""

    def __call__(self, batches: int) -> None:
        """`batches` more timed or warm-up batches (`time_batches`) were run."""

    def phase(self, name: str | None) -> None:
        """What runs now where no batch is counted (the start-up warm-up, the roofline, the counting); None: the
        batches again."""


def _phase(progress: Progress | None, name: str | None) -> None:
    if progress is not None:
        progress.phase(name)


class BatchFailed(Exception):
    """A batch of `size` requests the model failed in `time_batches` (`warmup`: one of the untimed batches first).
    `error`: the executor's (a batch of 1's as raised; a larger one's first, its requests then rerun in parts, as the
    server reruns them); `answered`: each of its requests was answered rerun in smaller parts, so that its size failed
    it, not its requests (a workspace that grows with the batch, memory for the largest batch alone)."""

    def __init__(self, error: ModelExecutionError | InvalidInput, size: int, warmup: bool, answered: bool) -> None:
        super().__init__(str(error))
        self.error, self.size, self.warmup, self.answered = error, size, warmup, answered


# A Ctrl-C left the profile with the model still in a batch (`warmed_executor`); named for the tests and callers here.
ModelStillRunning = InterruptedWorkLeft


class BatchTimes(dict):
    """`time_batches`' per-size times, and `cpu_linear`: how the instance ran the model's linear layers."""

    # "onednn" where some of them ran through oneDNN, else "torch": the executor leaves a TorchScript or torch.export
    # model's, a model's on CUDA or not in fp32, and all with --cpu-linear torch, to torch (server/cpulinear.py), and a
    # layer the forward routes around (a fused transformer kernel) or a batch of under 4 rows runs as torch's too.
    cpu_linear: str = "torch"


@contextmanager
def warmed_executor(
    servable: Servable, device: torch.device, cfg: ProfileConfig, wait_s: float = INTERRUPT_WAIT_S
) -> Iterator[Executor]:
    """The executor the profile times batches on (one instance on `device`), past the server's own start-up warm-up
    (Executor.warmup), which `wok serve` refuses a model for failing (WarmupError); shut down on leaving. Run before
    any request is drawn: dims no sample of which fits in memory are refused there in the server's words ("cannot
    make a sample of zeros"), where drawing the request pool failed first with numpy's MemoryError, a traceback. The
    batches are then timed on an instance as warm as a served one (its oneDNN kernels built), and a model the server
    refuses is not profiled where the timed sizes would have passed.

    Left by a Ctrl-C (a KeyboardInterrupt, or any BaseException but an Exception), the model may be in a batch still:
    the shutdown waits for it at most `wait_s` (as the server's start does, STARTCUT57) or until a second Ctrl-C, and
    a model still in one then is raised as ModelStillRunning: the process cannot end as usual, Python joining the
    model's thread at exit.
    A model that raised has ended its batch: the shutdown waits for the threads' exit."""
    executor = Executor(servable, InstanceConfig(count=1, devices=(str(device),)), cpu_linear=cfg.cpu_linear)
    try:
        executor.warmup()
        yield executor
    except Exception:
        executor.shutdown()
        raise
    except BaseException as exc:
        left = _shut_down_within(executor, wait_s)
        if left is not None:
            still = f"model '{servable.name}' was still running a batch {left}; not waited for"
            raise ModelStillRunning(still) from exc
        raise
    else:
        executor.shutdown()


def _shut_down_within(executor: Executor, wait_s: float) -> str | None:
    """`executor.shutdown()` (which waits for a running batch) on a daemon thread of its own, waited for at most
    `wait_s`, or until a second Ctrl-C: None where it ended, else when it was left ("1 s after it", "at a second
    Ctrl-C"). A daemon, so that one left waiting on a stuck batch does not hold the exit itself."""
    ended = threading.Event()

    def shut() -> None:
        executor.shutdown()
        ended.set()

    try:
        threading.Thread(target=shut, name="wok-profile-shutdown", daemon=True).start()
        return None if ended.wait(wait_s) else f"{wait_s:g} s after it"
    except KeyboardInterrupt:
        # A second Ctrl-C in the wait (a user's second press): raised from here as it was, until 2026-12-06, it left
        # the model's thread to Python's exit, which joined it, a stuck model's for good.
        return None if ended.is_set() else "at a second Ctrl-C"


def time_batches(
    executor: Executor, cfg: ProfileConfig, pool: KeyedPool, progress: Progress | None = None
) -> BatchTimes:
    """Per batch size, on the instance of `executor` (`warmed_executor`): the batch times and stage times (seconds) of
    `repeats` batches, and under "requests" the indices in `pool.requests` of each batch's n requests
    (`KeyedPool.batch`: all of one batching key; the keys of the timed batches of each size in proportion to the
    pool's draws, `KeyedPool.plan`)."""
    instance = executor.instances[0]
    rng = np.random.default_rng(cfg.seed)
    sizes = list(dict.fromkeys(cfg.batch_sizes))
    out = BatchTimes({n: {k: [] for k in ("batch", *STAGES, "requests")} for n in sizes})

    plans = {n: pool.plan(rng, n, cfg.repeats) for n in sizes}

    def run(n: int, warmup: bool, key: Hashable | None = None) -> tuple[list[int], object]:
        batch = pool.batch(rng, n, key)
        try:
            r = instance.submit([pool.requests[i] for i in batch], [1] * n, 0).result()
        except (ModelExecutionError, InvalidInput) as exc:
            # A batch of 1, which the executor does not rerun. Refused, a warm-up one too, though a first call's
            # failure (a lazy set-up) may not recur: its one request failed alone, as the server would answer it, and
            # no parts answered show the request served, as they do for a larger warm-up batch (below). The server's
            # own start-up warm-up, a batch of 1 (Executor.warmup), ends `wok serve` on such a failure alike, with no
            # second try.
            raise BatchFailed(exc, n, warmup, answered=False) from exc
        if r.failure is not None:
            # The executor reran the failed batch in parts, as it does for the server's callers, and its time was the
            # reruns': no batch's. A warm-up batch with a request that failed alone too: its requests are drawn as the
            # timed ones are, and let pass, the refusal hung on whether the timed batches drew such a request. One
            # whose every request was answered in parts failed for its size, which the timed batches of that size
            # meet again unless it was the model's first such batch, which the warm-up is for.
            answered = not any(isinstance(o, BaseException) for o in r.outputs)
            if not (warmup and answered):
                raise BatchFailed(r.failure, n, warmup, answered)
        return batch, r

    # The start-up warm-up's batches (`warmed_executor`), of up to 64 rows, take oneDNN where the profile's sizes may
    # not (under 4 rows): only the calls after it say how the profile's batches ran. Kept by chain, not by place in
    # the list: a OneDNNSequential plans new chains when a hook is registered anywhere (a model that hooks a layer for
    # each call does at each call), and the warm-up's last chain and the profile's last, 1 call each, read as no call
    # since.
    warm_calls = {chain: chain.calls for chain in chains(instance.module)}
    for _ in range(cfg.warmup):
        for n in sizes:
            run(n, warmup=True)
            if progress:
                progress(1)
    for repeat in range(cfg.repeats):
        for n in sizes:
            batch, r = run(n, False, None if plans[n] is None else plans[n][repeat])
            out[n]["requests"].append(batch)
            out[n]["batch"].append(r.finished - r.started)
            for k in STAGES:
                out[n][k].append(getattr(r.times, k))
            if progress:
                progress(1)
    # What ran, not what was asked: a torch.export model was recorded as onednn, which it never reaches.
    ran = any(chain.calls > warm_calls.get(chain, 0) for chain in chains(instance.module))
    out.cpu_linear = "onednn" if ran else "torch"
    return out


def _inputs_refused(
    servable: Servable,
    cfg: ProfileConfig,
    drawn_below: tuple[int, Mapping[str, int], Mapping[str, int]],
    exc: str,
) -> str:
    """The refusal of a profile whose inputs, made for it, the model failed or the server would refuse (ids past a
    table, a sequence longer than it takes): the options that made them are the error, not a traceback.
    `drawn_below`: the bound of the integer inputs, those by input (`_int_highs`) and the datatypes' caps
    (`_type_capped`). A cap is said (an INT8 input drew below 128, whatever --int-high said), and so are the inputs
    drawn below the bound of those with none of their own, by name: the model's smallest table keeps the ids that
    reach a table unchanged within it, not ids the model changes first (`a(ids) + b(ids * 2)`), which only a lower
    --int-high draws lower."""
    high, by_input, capped = drawn_below
    bounds = {**by_input, **capped}
    own = "".join(
        f", input {quoted_name(name)} below {rows}" + (" (its datatype holds no larger id)" if name in capped else "")
        for name, rows in bounds.items()
    )
    # --int-high named only where the user gave it: a table's rows or the default is said as such.
    source = int_high_source(servable, cfg, by_input)
    others = [t.name for t in servable.config.inputs if integer_cap(t.datatype) is not None and t.name not in bounds]
    made = _made(servable, cfg)
    if source == "given":
        return f"{made} and --int-high {high}{own}: {exc}"
    drawn = ""
    if others:  # drawn below `high`: so `source` is "table" or "default"
        names = ", ".join(quoted_name(name) for name in others)
        which = f"input {names}" if len(others) == 1 else f"inputs {names}"
        why = _INT_HIGH_WHY[source]
        if source == "table":
            # --int-high also replaces the inputs' own bounds: with any, every integer input is drawn below it.
            lower = "them" if not by_input else "every integer input"
            whose = "it has no id bound of its own" if len(others) == 1 else "they have no id bound of their own"
            why = f"{whose}: {why}; where the model changes ids before a lookup, --int-high below {high} draws {lower}"
            why += " lower"
        else:
            why += "; --int-high to change"
        drawn = f" and {which} below {high} ({why})"
    return f"{made}{drawn}{own}: {exc}"


def _made(servable: Servable, cfg: ProfileConfig) -> str:
    """What shaped the profile's inputs: --sizes where an input has a variable dim, else the model's own dims (said
    as --sizes fixed:16 until 2026-12-07, an option that shaped nothing there)."""
    if any(t.variable for t in servable.config.inputs):
        return f"the inputs made with --sizes {cfg.sizes}"
    return "the inputs made at the model's fixed dims"


def _keys_too_many(servable: Servable, cfg: ProfileConfig, pool: KeyedPool, n: int) -> str:
    """The refusal of a batch size `n` that no batching key of the pool reached. A model of fixed dims reaches it only
    by a batch_key of its own, keying requests of one shape by their values: no --sizes shapes its requests, which
    until 2026-12-07 this named ("drawn with --sizes fixed:16", "--sizes with fewer distinct sizes")."""
    if any(t.variable for t in servable.config.inputs):
        drawn, fewer = f"drawn with --sizes {cfg.sizes}", ", or --sizes with fewer distinct sizes"
    else:
        drawn, fewer = "made at the model's fixed dims", " (its batch_key keys them by their values)"
    return (
        f"model '{servable.name}': the server batches only requests of one batching key, and none of the "
        f"{len(pool.groups)} keys of the {len(pool.keys)} requests {drawn} had {n} requests after "
        f"{pool.extra_draws} draws more (the most: {pool.most}): batches of {n} would hardly ever form; give smaller "
        f"--batch-sizes{fewer}"
    )


def _names_model(servable: Servable, text: str) -> bool:
    """Whether a message of the server's names the model, as its messages do (`model 'M'`): a config check's refusal
    ("model 'M' refused the request: ..."), a dim's ("the sizes model 'M' was exported for"), an id's; so that the
    profile's refusal does not name it again. The quotes end the name (a model's name holds none); the word `model`
    must begin where a word may: a model's own text naming its "submodel 'M'" names no model."""
    return re.search(rf"(?<![\w.-])model '{re.escape(servable.name)}'", text) is not None


def _served(servable: Servable, exc: Exception, where: str) -> str:
    """What the server answers a request that raised `exc` (`where`: before it is batched, or as its batch is
    assembled), as the profile refuses the inputs for it: the status code and the details `errors.to_status` makes
    of `exc`, as a client gets them (a Servable's own check raising a ValueError: INTERNAL, "internal error:
    ValueError: ..."), long ones cut as the server cuts them (`service.short_details`). The model is named once: by
    the prefix where the details do not name it (a model's own check or assemble need not)."""
    code, details = to_status(exc)
    details = short_details(details)
    if _names_model(servable, details):
        return f"served, such a request is answered {code.name} {where}: {details}"
    return f"served, model '{servable.name}' answers such a request {code.name} {where}: {details}"


def _pool_unmade(servable: Servable, cfg: ProfileConfig, unmade: PoolUnmade) -> str:
    """The refusal of a profile whose request pool could not be made: by the option that sized its variable dims,
    else by the model's dims, and numpy's error (an allocation that failed; an array of more elements than numpy
    counts, which a warm-up at a variable dim's least size passed, said bare until 2026-12-06, no option named)."""
    if any(t.variable for t in servable.config.inputs):
        what = f"--sizes {cfg.sizes}: expected requests of model '{servable.name}'"
    else:
        what = f"model '{servable.name}': expected inputs"
    return (
        f"{what} that fit in memory (the profile draws {unmade.count} and holds up to "
        f"{POOL_CAP_BYTES >> 20} MiB of them, one of each batching key at least, before it times a batch); "
        f"got {message_of(unmade.error).rstrip('.')}"
    )


def _told(servable: Servable, exc: ModelExecutionError | InvalidInput) -> str:
    """A batch's failure as the profile tells it: the model's (its line names the model), or its assemble's refusal
    (wok's InvalidInput, whose text need not name the model; named once where it does). Either is the details a
    client of the server gets for it (`errors.to_status`), and cut as the server cuts them (`service.short_details`):
    a model's message of 1 MB, one line, was printed whole."""
    details = short_details(to_status(exc)[1])
    if isinstance(exc, InvalidInput):
        if _names_model(servable, details):
            return f"refused as it was assembled (INVALID_ARGUMENT): {details}"
        return f"model '{servable.name}' refused it as it was assembled (INVALID_ARGUMENT): {details}"
    return details


def _batch_refused(
    servable: Servable,
    cfg: ProfileConfig,
    drawn_below: tuple[int, Mapping[str, int], Mapping[str, int]],
    failed: BatchFailed,
) -> str:
    """The refusal of a profile whose batch the model failed, naming its size. Where the model answered each of its
    requests rerun in smaller parts, the batch's size failed it (a workspace or memory that grows with the batch), not
    the inputs: no bound to lower is said, the server reruns every such batch; else `_inputs_refused`'s."""
    batch = f"a {'warm-up ' if failed.warmup else ''}batch of {failed.size}"
    if failed.answered:
        return (
            f"{batch} failed, though the model answered each of its requests rerun in smaller parts (as the server "
            f"reruns a failed batch): the batch's size failed it, not {_made(servable, cfg)}; the "
            f"server reruns every such batch (a max_batch_size below {failed.size} keeps it from forming them, "
            f"--batch-sizes below {failed.size} profile the sizes that run): {_told(servable, failed.error)}"
        )
    exc = failed.error
    alone = " (some of its requests alone too)" if failed.size > 1 else ""
    if isinstance(exc, InvalidInput):
        told = _served(servable, exc, "as its batch is assembled")
    else:
        told = _told(servable, exc)
    return _inputs_refused(servable, cfg, drawn_below, f"{batch} failed{alone}: {told}")


def _check_as_served(servable: Servable, requests: Sequence[dict[str, np.ndarray]]) -> str | None:
    """The server's checks of each request (`codec.check_values`: sizes, ids, the model's own check), which refuse
    a request before it joins a batch: a profile of requests the server refuses times batches it never runs. The
    server's answer to the first one refused (`_served`), else None."""
    for request in requests:
        try:
            check_values(servable, request)
        except Exception as exc:
            # Refused (InvalidInput), or the check failed (a config's check: ModelExecutionError, INTERNAL). Whatever
            # else a Servable's own check raises, a ValueError too, the server answers INTERNAL in to_status's words
            # ("internal error: KeyError: 'x'": servable's CheckFailed), which is what the profile says. A
            # BaseException is no check's answer here: a Ctrl-C stays one.
            return _served(servable, exc, "before it is batched")
    return None


def _median(values: Sequence[float]) -> float:
    return latency_summary(np.asarray(values))["p50"]


def profile(
    servable: Servable,
    cfg: ProfileConfig,
    roofline_of: Callable[[torch.device], Roofline],
    progress: Progress | None = None,
    source: str = "demo",
) -> dict:
    """Time, fit, count and place the model on the roofline; the `wok.profile/1` document."""
    too_big = [n for n in cfg.batch_sizes if n > servable.config.max_batch_size]
    if too_big:
        raise ValueError(
            f"--batch-sizes {too_big} exceed model '{servable.name}''s max_batch_size "
            f"({servable.config.max_batch_size}): the server never forms such batches"
        )
    device = profile_device(cfg.device)
    sizes = list(dict.fromkeys(cfg.batch_sizes))
    _phase(progress, "start-up warm-up")
    try:
        with warmed_executor(servable, device, cfg) as executor:
            _phase(progress, "drawing requests")
            count = max(256, 4 * max(sizes))
            try:
                pool = keyed_pool(servable, cfg, count, max(sizes))
            except PoolUnmade as unmade:
                # The warm-up's sample fits where the pool may not: a variable dim is warmed at its least size.
                raise ValueError(_pool_unmade(servable, cfg, unmade)) from None
            high, by_input = _int_highs(servable, cfg)  # the bounds the pool was drawn below (`_generator`)
            capped = _type_capped(servable, high, by_input)
            refused = _check_as_served(servable, pool.requests)
            if refused is not None:
                raise ValueError(_inputs_refused(servable, cfg, (high, by_input, capped), refused))
            never = [n for n in sizes if not pool.allowed(n)]
            if never:
                raise ValueError(_keys_too_many(servable, cfg, pool, never[0]))
            _phase(progress, "measuring the roofline")
            roof = roofline_of(device)
            _phase(progress, None)
            try:
                times = time_batches(executor, cfg, pool, progress)
            except BatchFailed as failed:
                raise ValueError(_batch_refused(servable, cfg, (high, by_input, capped), failed)) from None
    except WarmupError as exc:  # the server's words: `wok serve` says "wok: {exc}" and exits 2
        raise ValueError(f"wok serve refuses the model at its start: {exc}") from None
    # The fit `wok tune` makes of a profile's raw times too (tune_check's in-process profile): one α, β; with
    # several keys on each key's median, weighted by its share of the batches (`fit_medians`).
    keys = {n: [pool.key_of(b) for b in times[n]["requests"]] for n in sizes}
    by_size, (alpha, beta, r2), fit_on = fit_medians({n: times[n]["batch"] for n in sizes}, keys)
    fit = Fit(alpha, beta, r2)
    batches = []
    uncounted: set[str] = set()
    added: set[str] = set()
    # With one shape of request every batch of n holds the same work: one pass counts it. Otherwise the
    # timed batches differ (a sequence model's padded length, a bag's ids): their mean, from a few of them.
    vary = sizes_vary(servable, cfg.sizes)
    _phase(progress, "counting FLOPs and bytes")
    for n in sizes:
        counted = None
        try:
            if vary:
                work, counted = count_timed(servable, device, pool.requests, times[n]["requests"])
            else:
                # A batch the timing ran: any n requests of one shape hold its work, but not any n may share a batch
                # (a model keyed by a value), and a batch the server never forms may be one its assemble refuses.
                work = count_work(servable, device, [pool.requests[i] for i in times[n]["requests"][0]])
        except (ModelExecutionError, InvalidInput) as exc:
            # The timing ran these requests in this batch: the inputs passed; the counting's own way of running the
            # model (no_grad, not inference_mode; torch's dispatch modes; no fused attention) failed it.
            raise ValueError(
                f"counting the FLOPs and bytes of a batch of {n} failed, a batch the timing ran: {_told(servable, exc)}"
            ) from None
        uncounted |= work.uncounted_ops
        added |= set(work.flops_added)
        summary = latency_summary(np.asarray(times[n]["batch"]))
        median = summary["p50"]
        forward = _median(times[n]["compute"])
        intensity = work.flops / work.bytes if work.bytes else math.nan
        predicted = roof.predicted_s(work.flops, work.bytes)
        batches.append(
            {
                "batch_size": n,
                "median_s": median,
                "p99_s": summary["p99"],
                "mean_s": summary["mean"],
                "max_s": summary["max"],
                "fitted_on_s": by_size[n],
                "fit_s": fit.time_s(n),
                "throughput_qps": n / median,
                "fitted_on_throughput_qps": n / by_size[n],
                "fit_throughput_qps": fit.throughput(n),
                "stages_median_s": {k: _median(times[n][k]) for k in STAGES},
                "flops": work.flops,
                "flops_per_inference": work.flops / n,
                "bytes": work.bytes,
                "bytes_per_inference": work.bytes / n,
                "bytes_detail": {
                    "parameters": work.param_bytes,
                    "activations_read": work.activation_read_bytes,
                    "activations_written": work.activation_write_bytes,
                    "embedding_rows": work.embedding_row_bytes,
                    "embedding_rows_gathered": work.embedding_rows,
                },
                "flops_detail": {"flop_counter": work.flops_counter, **work.flops_added},
                "intensity_flop_per_byte": intensity,
                "bound": classify(intensity),
                "predicted_s": predicted,
                "roofline_limit": roof.limit(work.flops, work.bytes) if work.flops or work.bytes else None,
                "attained_fraction": predicted / forward if forward > 0 else math.nan,
                "samples_s": times[n]["batch"],
            }
        )
        if counted is not None:
            batches[-1]["counted_batches"] = counted
        keys, share = pool.short(n)
        if keys:
            batches[-1]["keys_left_out"] = {"keys": keys, "share": share, "draws": len(pool.keys) + pool.extra_draws}
        repeated = sum(len(set(batch)) < len(batch) for batch in times[n]["requests"])
        if repeated:
            batches[-1]["requests_repeated"] = {"batches": repeated, "share": repeated / len(times[n]["requests"])}
    cfg_out = asdict(cfg)
    cfg_out["int_high"], cfg_out["int_high_by_input"] = high, by_input
    cfg_out["int_high_source"] = int_high_source(servable, cfg, by_input)
    cfg_out["int_high_capped"] = capped
    cfg_out["cpu_linear"] = times.cpu_linear
    cfg_out["pool"] = {
        "requests": pool.size,
        "held": len(pool.requests),
        "held_bytes": pool.held_bytes,
        "cap_bytes": POOL_CAP_BYTES,
    }
    return {
        "schema": SCHEMA,
        "model": {
            "name": servable.name,
            "source": source,
            "platform": servable.platform_label,
            "precision": servable.config.precision,
            "max_batch_size": servable.config.max_batch_size,
            "parameters": sum(p.numel() for p in servable.module_for(torch.device("cpu")).parameters()),
        },
        "config": {**cfg_out, "device": str(device), "torch_threads": torch.get_num_threads()},
        "device": roof.to_dict(),
        "fit": {
            "alpha_s": fit.alpha_s,
            "beta_s": fit.beta_s,
            "r2": fit.r2,
            "on": fit_on,
            "ceiling_qps": fit.ceiling,
        },
        "counting": {
            "flops": "torch.utils.flop_counter.FlopCounterMode, plus the ops in flops_added",
            "flops_added": sorted(added),
            "uncounted_ops": sorted(uncounted),
            "bytes": "each op reads its inputs and writes its outputs; parameters once per batch; "
            "embedding lookups read the rows they gather; views move nothing",
        },
        "batches": batches,
    }


# ---------------------------------------------------------------------------- output


def _si(x: float, unit: str = "") -> str:
    if not math.isfinite(x):
        return "-"
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {prefix}{unit}"
    return f"{x:.3g} {unit}".rstrip()


def _num(x: float | None, spec: str) -> str:
    return "-" if x is None or not math.isfinite(x) else format(x, spec)


def _pct(x: float | None) -> str:
    """A fraction as a percentage: whole from 10 % up, 2 significant digits below (1 % read '1%' whether 0.6 or 1.4)."""
    if x is None or not math.isfinite(x):
        return "-"
    pct = 100 * x
    if pct == 0 or abs(pct) >= 9.95:
        return f"{pct:.0f}%"
    return f"{pct:#.2g}%"


def table_rows(result: dict) -> tuple[list[str], list[list[str]]]:
    """With several batching keys the fit is not on the median of a size's batches but on `fitted_on_s`: the
    table shows it beside the fit, and QPS is n over it (with one key the two are the median)."""
    keyed = result["fit"]["on"] == KEYED_FIT_ON
    head = ["batch", "median ms", "p99 ms", *(["fitted on ms"] if keyed else []), "fit ms", "QPS", "fit QPS"]
    head += ["forward ms", "predicted ms", "attained", "FLOP/inf", "bytes/batch", "I FLOP/B", "class", "roof"]
    rows = []
    for b in result["batches"]:
        # Files written before fitted_on_s were fitted on median_s (and keyed files were written with it).
        point = b["fitted_on_s"] if keyed else b["median_s"]
        rows.append(
            [
                str(b["batch_size"]),
                _ms(b["median_s"]),
                _ms(b["p99_s"]),
                *([_ms(point)] if keyed else []),
                _ms(b["fit_s"]),
                f"{b['batch_size'] / point:.0f}",
                "-" if not math.isfinite(b["fit_throughput_qps"]) else f"{b['fit_throughput_qps']:.0f}",
                _ms(b["stages_median_s"]["compute"]),
                _ms(b["predicted_s"]),
                _pct(b["attained_fraction"]),
                _si(b["flops_per_inference"]),
                _si(b["bytes"], "B"),
                _num(b["intensity_flop_per_byte"], ".2f"),
                b["bound"] or "-",
                b["roofline_limit"] or "-",
            ]
        )
    return head, rows


def summary_lines(result: dict) -> list[str]:
    f, d = result["fit"], result["device"]
    ceiling = f["ceiling_qps"]
    ceiling_text = "none (β ≤ 0)" if ceiling is None or not math.isfinite(ceiling) else f"{ceiling:.0f} samples/s"
    how = {k: ("measured" if v["measured"] else "given") for k, v in d["source"].items()}
    lines = [
        f"fit on {f['on']}: T(n) = α + β·n, α = {1e3 * f['alpha_s']:.4f} ms, β = {1e3 * f['beta_s']:.4f} ms/sample, "
        f"R² = {f['r2']:.4f}; throughput ceiling 1/β = {ceiling_text}",
        f"roofline of {d['name']}: peak {_si(d['peak_flops'], 'FLOP/s')} ({how['peak_flops']}), "
        f"bandwidth {_si(d['bandwidth_bytes_s'], 'B/s')} ({how['bandwidth']}), "
        f"ridge {d['ridge_flop_per_byte']:.1f} FLOP/B",
        f"class: I against fixed thresholds, the same on every device: compute-bound I > {COMPUTE_BOUND:g}, "
        f"memory-bound I < {MEMORY_BOUND:g}, in between otherwise",
        # Only the ridge is the device's: a batch the thresholds call "in between" sits under one roof or
        # the other, and on a device whose ridge is above 10 FLOP/B a "compute-bound" one under memory's.
        f"roof: which roof of this device bounds the batch: compute from its ridge up (I ≥ "
        f"{d['ridge_flop_per_byte']:.1f} FLOP/B), memory below; class ignores the ridge, so the two differ where "
        "I lies between it and a threshold",
        "attained = predicted / measured forward time",
    ]
    if f["on"] == KEYED_FIT_ON:
        lines.append(
            "fitted on ms: each batching key's median weighted by its share of the batches of n, the point the fit "
            "is on and QPS is n over; median ms and p99 ms are of all the batches of n together (their median is "
            "one key's time, not the mean an instance's busy time counts)"
        )
    if f["alpha_s"] < 0:
        # As `wok plan` and `wok tune` say when they take such an α as 0. With α < 0 every n/(α + β·n)
        # is above 1/β: the "ceiling" is then exceeded by the fit at every size.
        zero = -f["alpha_s"] / f["beta_s"] if f["beta_s"] > 0 else math.inf
        lines.append(
            f"α < 0: the line does not hold at small batch sizes (fit ms ≤ 0 up to n = {zero:.1f}, and every "
            "fit QPS is above 1/β); wok plan and wok tune take α as 0"
        )
    left_out = [(b["batch_size"], b["keys_left_out"]) for b in result["batches"] if "keys_left_out" in b]
    if left_out:
        each = ", ".join(f"n = {n}: {o['keys']} ({_pct(o['share'])} of requests)" for n, o in left_out)
        lines.append(
            f"batching keys with fewer than n requests in {left_out[0][1]['draws']} draws, left out of the batches "
            f"of n (the server forms a batch of n of a key only when n of its requests wait at once): {each}"
        )
    held = pool_line(result["config"])
    if held is not None:
        lines.append(held)
    repeated = [
        (b["batch_size"], b["requests_repeated"]["share"]) for b in result["batches"] if "requests_repeated" in b
    ]
    if repeated:
        each = ", ".join(f"n = {n}: {_pct(share)}" for n, share in repeated)
        lines.append(
            f"batches that held a request more than once, their key holding fewer than n under the pool's cap: {each} "
            "of them; a repeat is assembled from cache, so their assemble and batch times may read low"
        )
    drawn = int_high_line(result["config"])
    if drawn is not None:
        lines.append(drawn)
    if result["counting"]["uncounted_ops"]:
        lines.append("ops with no FLOPs counted: " + ", ".join(result["counting"]["uncounted_ops"]))
    return lines


def pool_line(config: dict) -> str | None:
    """What the pool held where its cap kept fewer requests than it drew (`keyed_pool`); None where it held them all,
    or a document written before `config.pool`."""
    pool = config.get("pool")
    if pool is None or pool["held"] >= pool["requests"]:
        return None
    return (
        f"request pool capped at {pool['cap_bytes'] / 2**20:g} MiB: {pool['held']} requests held "
        f"({pool['held_bytes'] / 2**20:.3g} MiB) of its {pool['requests']}; a batch takes its key's held requests in "
        "turn, so their values repeat"
    )


# The hint of a profile whose ids a ramp with no --int-high draws alike (`int_high_line`).
SAME_WITHOUT_INT_HIGH = (
    "wok bench ramp with no --int-high sends the same: it draws each below the bound its server publishes"
)

_INT_HIGH_WHY = {
    "given": "given by --int-high",
    "table": "the rows of the model's smallest embedding table",
    "default": "the default: no embedding table was found in the model",
}


def int_high_line(config: dict) -> str | None:
    """Which ids the profile drew, and the `wok bench ramp --int-high` that sends the same where one can; None for a
    model with no integer input, or a document written before `int_high_source`. The ids set which rows the gathers
    touch, so the batch time, and the ramp draws below its own 50 unless told: the JSON alone said the bound."""
    if "int_high_source" not in config:
        return None
    source, high, by_input = config["int_high_source"], config["int_high"], config.get("int_high_by_input") or {}
    if source is None and not by_input:
        return None
    if not by_input:
        text = f"integer inputs uniform in [0, {high}): {_INT_HIGH_WHY[source]}"
    else:
        each = ", ".join(f"input {quoted_name(name)} in [0, {rows})" for name, rows in by_input.items())
        whose = "its" if len(by_input) == 1 else "each one's"
        text = f"integer inputs uniform by input: {each}, the rows of the smallest embedding table {whose} ids reach"
        if source is not None:
            text += f"; the others in [0, {high}): {_INT_HIGH_WHY[source]}"
    if source != "given":
        text += " (--int-high to change)"
    capped = config.get("int_high_capped") or {}
    if capped:
        # The ramp's payloads cap the same way, so its hint below still sends what the profile drew.
        each = ", ".join(f"input {quoted_name(name)} in [0, {cap})" for name, cap in capped.items())
        text += f"; but {each}: " + ("its datatype holds" if len(capped) == 1 else "their datatypes hold")
        text += " no larger id" if len(capped) == 1 else " no larger ids"
    # The ramp draws every integer input below one --int-high, capped by its datatype as here: it sends what the
    # profile drew where that is the bound of each input no cap lowered, and no smaller than a cap that lowered one.
    # The inputs drawn below `high` are not named in the document: `high` counts as uncapped, which it stays for any.
    need = {rows for name, rows in by_input.items() if name not in capped} | ({high} if source is not None else set())
    floor = max(capped.values(), default=0)

    def sends_same(h: int) -> bool:
        return need <= {h} and h >= floor

    # Without --int-high the ramp draws each input with a bound the server publishes (ModelConfig parameter
    # wok.ids_bound.<input>) below it, capped as here, and the others below DEFAULT_INT_HIGH. The server publishes
    # what `int_high_by_input` holds, found by the same load (Servable.id_bounds, slices and branches included): the
    # ramp sends the same where the profile drew the others below DEFAULT_INT_HIGH too, or had none.
    if by_input and (source is None or high == DEFAULT_INT_HIGH):
        return f"{text}; {SAME_WITHOUT_INT_HIGH}"
    if sends_same(DEFAULT_INT_HIGH):
        return text
    same = [h for h in sorted({*need, *by_input.values()}) if sends_same(h)]
    if same:
        return f"{text}; to send the same, give wok bench ramp --int-high {same[0]}"
    # None does: the smallest bound no cap lowered keeps each input's ids within its tables (a capped input's
    # are within them whatever --int-high).
    smallest = ", the smallest," if len(need) > 1 else ""
    return (
        f"{text}; wok bench ramp draws every integer input below one --int-high: --int-high {min(need)}{smallest} "
        "keeps each within its tables"
    )


def print_table(result: dict, file=None) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    head, rows = table_rows(result)
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for h in head:
        table.add_column(h, justify="right", no_wrap=True)
    for r in rows:
        table.add_row(*r)
    console = Console(file=file or sys.stdout, color_system=None, highlight=False, markup=False, emoji=False, width=240)
    # The name as the progress label shows it (escaped, cut past NAME_CHARS): it is the one typed, of any length.
    # soft_wrap: one line, as the label's, not cut into two at the console's 240 columns.
    name = unquoted(result["model"]["name"], NAME_CHARS)
    console.print(f"wok profile {name} on {result['config']['device']}", soft_wrap=True)
    console.print(table)
    for line in summary_lines(result):
        console.print(line)


def profile_figure(result: dict):
    """Left: the roofline with each batch size at (I, FLOPs / measured forward time).
    Right: the median batch time with its p99, and the fitted line."""
    from matplotlib.figure import Figure

    from . import report  # noqa: F401  (selects the Agg backend as the bench's figures do)

    d, f = result["device"], result["fit"]
    peak, bw = d["peak_flops"], d["bandwidth_bytes_s"]
    bs = result["batches"]
    fig = Figure(figsize=(12, 4.8), layout="constrained")
    roof, curve = fig.subplots(1, 2)
    xs = np.array([b["intensity_flop_per_byte"] for b in bs], dtype=float)  # None (JSON null): NaN
    achieved = np.array([b["flops"] / b["stages_median_s"]["compute"] for b in bs], dtype=float)
    # A log axis has no place for I = 0 (no FLOPs counted: an elementwise model) or NaN (no bytes):
    # those sizes stay off the roofline, and its axis spans the others and the ridge.
    on_roof = np.isfinite(xs) & (xs > 0) & np.isfinite(achieved) & (achieved > 0)
    lo = min([*xs[on_roof], d["ridge_flop_per_byte"]]) / 4
    hi = max([*xs[on_roof], d["ridge_flop_per_byte"]]) * 4
    grid = np.geomspace(lo, hi, 200)
    roof.loglog(grid, np.minimum(peak, grid * bw), color="#333333", label="roofline min(peak, I·bandwidth)")
    roof.axvline(MEMORY_BOUND, color="#4c72b0", ls=":", lw=1, label=f"I = {MEMORY_BOUND:g} (memory-bound below)")
    roof.axvline(COMPUTE_BOUND, color="#c44e52", ls=":", lw=1, label=f"I = {COMPUTE_BOUND:g} (compute-bound above)")
    roof.scatter(xs[on_roof], achieved[on_roof], color="#dd8452", zorder=3, label="measured: FLOPs / forward time")
    for b, x, y, shown in zip(bs, xs, achieved, on_roof):
        if shown:
            roof.annotate(f"n={b['batch_size']}", (x, y), textcoords="offset points", xytext=(4, -10), fontsize=8)
    if not on_roof.all():
        off = ", ".join(str(b["batch_size"]) for b, shown in zip(bs, on_roof) if not shown)
        note = f"not on the roofline (no FLOPs counted): n = {off}"
        roof.text(0.02, 0.98, note, transform=roof.transAxes, fontsize=8, va="top")
    roof.set_xlabel("arithmetic intensity (FLOP/byte)")
    roof.set_ylabel("FLOP/s")
    roof.set_title(f"{result['model']['name']} on {d['name']}", fontsize=10)
    roof.legend(fontsize=7, loc="lower right")
    roof.grid(True, which="both", alpha=0.25)
    n = np.array([b["batch_size"] for b in bs], dtype=float)
    med = np.array([b["median_s"] for b in bs]) * 1e3
    p99 = np.array([b["p99_s"] for b in bs]) * 1e3
    curve.plot(n, med, "o", color="#4c72b0", label="median batch time")
    if f["on"] == KEYED_FIT_ON:
        fitted = np.array([b["fitted_on_s"] for b in bs]) * 1e3
        curve.plot(n, fitted, "s", color="#55a868", label="fitted on: keys' medians by their share")
    curve.plot(n, p99, "v", color="#c44e52", label="p99 batch time")
    line = np.linspace(0, n.max(), 50)
    curve.plot(line, 1e3 * (f["alpha_s"] + f["beta_s"] * line), color="#333333",
               label=f"fit α={1e3 * f['alpha_s']:.3f} ms, β={1e3 * f['beta_s']:.4f} ms, R²={f['r2']:.3f}")  # fmt: skip
    curve.set_xlabel("batch size n")
    curve.set_ylabel("batch time (ms)")
    curve.set_xlim(left=0)
    curve.set_ylim(bottom=0)
    curve.legend(fontsize=8, loc="upper left")
    curve.grid(True, alpha=0.3)
    return fig


def plot_profile(result: dict, path) -> None:
    from .report import figure_format

    fig = profile_figure(result)

    fig.savefig(path, format=figure_format(path), dpi=110)  # --plot p.svg: SVG, not PNG bytes in it
