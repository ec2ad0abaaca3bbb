"""The embedding tables a model looks ids up in, read from its module or graph at load.

`table_rows` sizes the tables one module holds itself. `id_ranges` follows each integer input of a model through
its graph (a TorchScript module's inlined graph, a torch.export program's, a python module's as torch.fx traces it)
to the tables it reaches: nn.Embedding, nn.EmbeddingBag, F.embedding, index_select on dim 0 and `table[ids]` of a
parameter or buffer (a constant, once frozen). It finds two things per input, for two readers:

* `rows` (and `least`), the server's: where every id of a request reaches a table unchanged and on every request,
  an id outside [least, rows) of its smallest table fails the model, so decode_request refuses it alone
  (INVALID_ARGUMENT) before it is batched, not failed in its batch (on a GPU, a device-side assert that takes the
  device). Unchanged: through ops that keep every value (reshape, view, flatten, a transpose, a cast that loses
  none, a TorchScript branch each of whose ways does). `least` is 0 but where every table is indexed as
  `table[ids]`, which takes a negative id as counted from its end.
* `bounds`, `wok profile`'s and the one ModelConfig publishes: ids in [0, bound) reach no table outside its rows.
  Ops that pass on only some of the ids (a slice, a row, an expand, an embedding bag with include_last_offset) and
  lookups under a condition count here, as the ids drawn below the bound stay below it; they do not for `rows`,
  where an id the model never looks up would be refused. An input has a bound only where every way it is used is
  followed: where its ids, or values made of them, also reach a table any other way (below), a table whose rows
  cannot be read, or an op that may read them as positions in something wok does not size (`_NO_LOOKUP` lists the
  ops that cannot), the bound of the tables found would be a guess: `a(ids) + b(ids * 2)` holds ids below a's 100
  rows past b's 150 from 75 on. `rows` stands there: every id still reaches its table, which fails past it.

Where an input reaches a table any other way (arithmetic on it, a narrowing cast, an op not known, a function of the
model's own whatever its name, another table's values looked up at it: `a(self.remap[ids])` of an integer `remap`,
`a(emb(ids).long())` of a float table's, or its `argmax`, top-k's indices, `int()`: `_Walk.table_values`), nothing is
guessed: it is not checked, and `unclear` says why. Nor is one whose ids are
changed in place (`ids.sub_(1)`, `ids[ids >= n] = 0`, `torch.sub(ids, 1, out=ids)`, `ids.data = ids + 1`,
`nn.ReLU(inplace=True)(ids)`, through a view, a list's item or an op or module that may return them: `l = [ids];
l[0].sub_(1)`, `ids.cpu().sub_(1)`, `nn.Identity()(ids).sub_(1)`): neither `rows` nor `bounds`, as the graphs of
TorchScript, torch.fx and torch.export go on reading the changed value as the ids the request sent (`_Walk.in_place`,
`_Walk.share`); what any op writes with `out=` is not followed (a lookup given one is still a lookup). Ids written into
another tensor by such an op (`buf.add_(ids)`, `torch.add(ids, 60, out=buf)`) reach a table through it, not followed,
where `buf` or what shares its memory does.

What holds none of the ids' values is not followed as them: what an op makes of their shape alone (BERT's
`token_type_ids = torch.zeros_like(ids)`, positions `.expand_as(ids)`: `_LIKE`), a comparison's 0 or 1 cast to
integers (`emb((ids > 50).long())`: within 2 rows), as is a choice of 0 or 1 (`torch.where(ids > 50, 1, 0)`:
`_Walk.choose`), the floats attention makes of a padding mask (`ids == pad` as src_key_padding_mask, `ids.ne(0)` as
attn_mask: `_ATTENTION`, `_attends`), which reads no mask as positions. But what `torch.empty(ids.shape)` leaves
unset holds whatever its memory held: looked up, it may fail at any id, and no input has a bound (`_Walk.unset`); so
too what `resize_` grows a tensor by, what torch's random ops draw past the table (`torch.randint(0, 20, ids.shape)`
in a 16-row one; within it, the bound stands), and what a python forward makes of no input, which torch.fx's trace
made once, a constant of its graph (`torch.empty(2, 5)`, `torch.LongTensor(2, 5)`: `_TraceMade`).
Forward's parameters after the inputs take their defaults, as served: HF's `if inputs_embeds is None:` looks the ids up.
A python model's module, table or attention module whose call runs what torch.fx's trace does not (forward hooks, a
forward set on it or its class: `_runs_its_class`) is not read as its class: what reaches it is not followed.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import math
import operator
import threading
from dataclasses import dataclass, field

import torch
from torch.overrides import TorchFunctionMode

# The aten ops that gather rows of their first argument, a table, as a torch.export graph calls them.
EMBEDDING_SCHEMAS = frozenset({"aten::embedding", "aten::embedding_bag", "aten::_embedding_bag"})
_INDEX_SELECT = "aten::index_select"
_INDEX = "aten::index"
# F.embedding's max_norm as torch.export writes it: `embedding_renorm_(weight, ids, ...)` renorms the rows at ids.
_RENORMS = frozenset({"aten::embedding_renorm_", "aten::embedding_renorm"})
# Ops whose result holds every value of their first argument and no others (a new shape, a new order, a copy):
# ids through them are still all the ids. A cast is among them only where it loses no value (_keeps_values).
_KEEPS = frozenset(
    f"aten::{op}"
    for op in ("reshape", "view", "_unsafe_view", "flatten", "contiguous", "clone", "detach", "alias", "squeeze",
               "unsqueeze", "t", "transpose", "permute")
)  # fmt: skip
# Ops whose result holds some values of their first argument and no others: a slice, a row, an expand (which may
# make none). Ids through them stay below any bound of the input's (`bounds`), but not every id is looked up.
_PARTS = frozenset(f"aten::{op}" for op in ("slice", "select", "narrow", "expand", "expand_as"))
# Of _PARTS, those whose other arguments are positions in their tensor that fail past its size (a slice's clamp):
# `x.select(0, i)` of an `i` made of ids looks it up as `x[i]` does.
_POSITIONED = frozenset({"aten::select", "aten::narrow"})
_CASTS = frozenset({"aten::to", "aten::_to_copy", "aten::long"})
# TorchScript's ScalarType codes of the integer dtypes and bool (c10/core/ScalarType.h): those of ids and masks.
_SCALAR_TYPES = {0: torch.uint8, 1: torch.int8, 2: torch.int16, 3: torch.int32, 4: torch.int64, 11: torch.bool}
# Index tensors `table[index]` takes as a mask, not as rows.
_MASKS = (torch.bool, torch.uint8)
# The same ops as torch.fx sees a python module call them (methods of a tensor, or functions of torch).
_FX_KEEPS = frozenset(op.removeprefix("aten::") for op in _KEEPS)
# `x[i]`: a tensor's __getitem__ method, or operator.getitem.
_FX_INDEX = frozenset({"__getitem__", "getitem"})
_FX_PARTS = frozenset({*(op.removeprefix("aten::") for op in _PARTS), *_FX_INDEX, "index_select"})
_FX_CASTS = {
    "long": torch.int64, "int": torch.int32, "short": torch.int16, "char": torch.int8, "byte": torch.uint8,
    "bool": torch.bool, "float": torch.float32, "double": torch.float64, "half": torch.float16,
    "bfloat16": torch.bfloat16, "to": None,
}  # fmt: skip
# Attention's ops, as TorchScript and torch.export graphs call them (nn.TransformerEncoder's fast path among them): a
# mask (`ids == pad` as src_key_padding_mask, `ids.ne(0)` as attn_mask) is added to or selects scores, or (a nested
# tensor's) says which rows are kept; queries, keys and values are multiplied. None is read as a position.
_ATTENTION = (
    "scaled_dot_product_attention _scaled_dot_product_attention_math _native_multi_head_attention "
    "_transformer_encoder_layer_fwd _masked_softmax _nested_tensor_from_mask _nested_tensor_from_mask_left_aligned"
)
_ATTENDING = frozenset(_ATTENTION.split())
# Ops that read no value of their inputs as a position in another tensor (arithmetic, comparisons, casts, reductions,
# a size, a new tensor, a container), by their names in TorchScript and torch.export graphs (less aten::/prim::) and
# as torch.fx sees them called (torch's and python's operators): values made of an input's ids through them are
# followed to any table they reach (`_Walk.lookup`: not checked). Through any other op (a function of the model's
# own, a custom op, a gather, a scatter, a computed tensor indexed by them) they may reach rows wok does not size,
# and the input has no bound (`_Walk.unbounded`). The positions that ops taking rows (a tensor's, a list's, a dict's)
# are given are read before this list: `_Walk.positions`, `_POSITIONED`.
_NO_LOOKUP = frozenset(
    op
    for ops in (
        "add sub rsub mul div true_divide floor_divide remainder fmod pow neg negative abs sign",
        "clamp clamp_min clamp_max clip minimum maximum floor ceil round trunc",
        "sqrt rsqrt exp log log1p log2 reciprocal square",
        "bitwise_and bitwise_or bitwise_xor bitwise_not bitwise_left_shift bitwise_right_shift",
        "__and__ __or__ __xor__ __invert__ __lshift__ __rshift__ __not__ __iand__ __ior__ __ixor__",
        "eq ne lt le gt ge logical_and logical_or logical_not logical_xor isin where masked_fill",
        "sum mean max min amax amin argmax argmin prod any all count_nonzero cumsum",
        "size sym_size sym_numel sym_stride sym_storage_offset numel dim len stride is_floating_point",
        "dtype device layout shape Int Float Bool ScalarImplicit NumToTensor item",
        "zeros_like ones_like full_like empty_like new_zeros new_ones new_full new_empty arange zeros ones full empty",
        "rand randn randint randperm rand_like randn_like randint_like normal poisson bernoulli multinomial binomial",
        "to _to_copy long int float double half bfloat16 bool type_as cpu cuda",
        "ListConstruct TupleConstruct ListUnpack TupleUnpack TupleIndex cat concat concatenate stack",
        "float_power linear matmul mm bmm addmm relu sigmoid tanh softmax log_softmax",
        _ATTENTION,
        "truediv floordiv mod and_ or_ xor invert lshift rshift getattr",
        "slice select narrow expand expand_as getitem __getitem__",
        "format str __is__ __isnot__ __contains__ RaiseException warn Uninitialized unchecked_cast isinstance",
        "_assert _assert_async _assert_scalar _assert_tensor_metadata sym_constrain_range sym_constrain_range_for_size",
    )
    for op in ops.split()
)  # fmt: skip
# Of _NO_LOOKUP's ops, those whose result is always a new tensor, never (a view of) an argument: an in-place change
# of it changes no id. Any other's result (a list's item, `ids.cpu()`, `ids.type_as(ids)`, `torch.atleast_1d(ids)`,
# a function of the model's own) may be its argument, whatever its schema says (`_Walk.share`).
_FRESH = frozenset(
    op
    for ops in (
        "add sub rsub mul div true_divide floor_divide remainder fmod pow neg negative abs sign",
        "clamp clamp_min clamp_max clip minimum maximum floor ceil round trunc",
        "sqrt rsqrt exp log log1p log2 reciprocal square",
        "bitwise_and bitwise_or bitwise_xor bitwise_not bitwise_left_shift bitwise_right_shift",
        "__and__ __or__ __xor__ __invert__ __lshift__ __rshift__",
        "eq ne lt le gt ge logical_and logical_or logical_not logical_xor isin where masked_fill",
        "sum mean max min amax amin argmax argmin prod any all count_nonzero cumsum",
        "zeros_like ones_like full_like empty_like new_zeros new_ones new_full new_empty arange zeros ones full empty",
        "rand randn randint randperm rand_like randn_like randint_like normal poisson bernoulli multinomial binomial",
        "cat concat concatenate stack float_power linear matmul mm bmm addmm relu sigmoid tanh softmax log_softmax",
        _ATTENTION,
        "truediv floordiv mod and_ or_ xor invert lshift rshift",
    )
    for op in ops.split()
)  # fmt: skip
# Ops whose every result is integers made of their arguments' values (a position in them, a bucket, a draw), and
# those whose second result is positions (`indices`) beside values: a table's floats through them are made integers
# as by a cast (`_Walk.cast_values`): `x.gather(-1, emb(ids).topk(1).indices)`, `t.select(0, int(emb(ids)[0, 0]))`.
_INDICES_OF = frozenset(
    {"argmax", "argmin", "argsort", "bucketize", "searchsorted", "nonzero", "argwhere", "multinomial", "Int"}
)
_WITH_INDICES = frozenset({"topk", "sort", "max", "min", "kthvalue", "mode", "median", "nanmedian", "cummax", "cummin"})
# Ops that read their first argument's shape (and dtype, device) alone, not its values: BERT's `token_type_ids =
# torch.zeros_like(ids)` (or `ids.new_zeros(ids.shape)`) holds none of the ids; what they make of their other
# arguments (a fill value, a size) is followed as any op's; what the random ones draw (`randint_like`), as `_DRAWN`'s.
# Not empty_like nor new_empty: what they make holds whatever their memory held, and looked up fails at ids below
# any bound.
_LIKE = frozenset(
    {"zeros_like", "ones_like", "full_like", "new_zeros", "new_ones", "new_full", "rand_like", "randn_like",
     "randint_like"}
)  # fmt: skip
# Ops whose result holds whatever its memory held, no value set (`torch.empty(ids.shape, dtype=torch.long)`, what
# `ids.new(2, 3)` makes): none of the ids' values, yet a table looked up at it may fail at any id, of any input
# (`_Walk.unset`). With `_LIKE`, the shape-only reads: `empty_like` is read as its other ops are.
# `resize_` (in place: what shares the tensor's memory, `_Walk.in_place`) leaves what it grows the tensor by unset.
_UNSET = frozenset(
    {"empty", "empty_like", "new_empty", "empty_strided", "new_empty_strided", "empty_permuted", "new", "resize",
     "resize_as"}
)  # fmt: skip
# Ops whose values are drawn anew at each call (torch's random ops, `p.random_(0, 20)` in place): none of any input's
# ids, yet looked up they may fail at any id (`torch.randint(0, 20, ids.shape)` in a 16-row table), as `_UNSET`'s
# may: made of every integer input (`_Walk.unset`), within their range where it is known (`randint`'s high,
# `randperm`'s n: `_drawn_span`).
_DRAWN = frozenset(
    {"rand", "randn", "randint", "randperm", "rand_like", "randn_like", "randint_like", "normal", "poisson",
     "bernoulli", "multinomial", "binomial", "random", "uniform", "exponential", "geometric", "cauchy", "log_normal"}
)  # fmt: skip
# Of _UNSET and _DRAWN, those whose dtype is their tensor argument's where none is given (a drawn one's: integers,
# the safe side); the others' is torch's default, floats, but for those that make integers (`_DRAWN_INTEGERS`).
_UNSET_LIKE = frozenset({"empty_like", "new_empty", "new_empty_strided", "new", "resize", "resize_as", "randint_like"})
_DRAWN_INTEGERS = frozenset({"randint", "randperm", "multinomial", "random"})
# Ops that make a tensor of one value whatever their arguments (an id among them is read as a size): within 1 or 2
# rows, as a choice between them is (`torch.where(ids > 50, ids.new_ones(s), ids.new_zeros(s))`: `_Walk.choose`).
_FILLED = {"zeros_like": 1, "new_zeros": 1, "zeros": 1, "ones_like": 2, "new_ones": 2, "ones": 2}
# Ops that read an input's shape alone, not its ids: what they make (`arange(ids.size(1))`, positions) holds none.
_SHAPES = frozenset({"size", "sym_size", "sym_numel", "sym_stride", "numel", "dim", "len", "stride", "dtype", "device"})
# The attributes of a tensor that torch.fx reads with getattr and that hold none of its values.
_FX_SHAPES = frozenset({"shape", "dtype", "device", "ndim", "is_cuda", "layout"})
# Of _NO_LOOKUP's ops, those whose result is a mask (`table[mask]` takes no position from it).
_COMPARES = frozenset(
    {"eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_not", "logical_xor", "isin"}
)
# Of _NO_LOOKUP's ops, those whose result has the dtype of their tensor arguments where those are integers of one
# dtype and the rest python ints (`ids * 31 + 7`): a `% n` of it is an integer one, in [0, n) (`_Walk.remainder`).
_INTEGER_CLOSED = frozenset(
    op
    for ops in (
        "add sub rsub mul remainder floor_divide neg negative",
        "bitwise_and bitwise_or bitwise_xor bitwise_not __and__ __or__ __xor__ __invert__ __lshift__ __rshift__",
        "mod floordiv and_ or_ xor invert lshift rshift",
    )
    for op in ops.split()
)
# Of _NO_LOOKUP's ops, those whose result is a mask where each tensor argument is one and any other a python bool
# (`~mask`, `(ids != 0) & (ids < 5)`): bool stays bool (a python int would make it one).
_MASK_CLOSED = frozenset(
    {"bitwise_not", "bitwise_and", "bitwise_or", "bitwise_xor", "__and__", "__or__", "__xor__", "__invert__", "and_",
     "or_", "xor", "invert"}
)  # fmt: skip
# In-place ops that change no value (autograd's flags; a new shape in place is one of _KEEPS): ids stay the ids.
_KEEPS_IN_PLACE = frozenset({"requires_grad", "retain_grad", "share_memory", "record_stream"})
# Attributes of a tensor that an assignment sets with no value changed: autograd's.
_KEEPS_ASSIGNED = frozenset(
    {"requires_grad", "grad", "_grad", "grad_dtype", "volatile", "_backward_hooks", "_post_accumulate_grad_hooks"}
)
# Python's in-place operators as torch.fx records them (`ids += 1` changes `ids` and any view of it).
_PY_IN_PLACE = frozenset(
    {"iadd", "isub", "imul", "itruediv", "ifloordiv", "imod", "ipow", "iand", "ior", "ixor", "ilshift", "irshift"}
)
# Why an embedding bag may look up only some ids (include_last_offset: those after the last offset are not read).
_LAST_OFFSET = "which reads no id after its last offset (include_last_offset)"


def table_rows(module: torch.nn.Module) -> list[int]:
    """The row counts of the tables `module` itself looks ids up in: an nn.Embedding or nn.EmbeddingBag keeps
    its class only in an nn.Module; TorchScript keeps the name (`original_name`) and torch.export only the op."""
    if isinstance(module, (torch.nn.Embedding, torch.nn.EmbeddingBag)):
        # Its weight's, not num_embeddings: a weight replaced after it was built (`emb.weight.data = pretrained`)
        # is what forward looks ids up in, and num_embeddings then names rows it no longer has.
        rows = _rows_of(module.weight)
        return [] if rows is None else [rows]
    if isinstance(module, torch.jit.ScriptModule):
        rows = _script_table(module)
        return [] if rows is None else [rows]
    if not isinstance(module, torch.fx.GraphModule):
        return []
    return [rows for node in module.graph.nodes if (rows := _looked_up_rows(node)) is not None]


def _script_table(module: torch.jit.ScriptModule) -> int | None:
    # A model's own class may be named Embedding too: only a table of rows counts.
    weight = getattr(module, "weight", None) if module.original_name in ("Embedding", "EmbeddingBag") else None
    return weight.shape[0] if isinstance(weight, torch.Tensor) and weight.dim() == 2 else None


def _schema_name(target) -> str | None:
    return getattr(getattr(target, "_schema", None), "name", None)


def _looked_up_rows(node) -> int | None:
    """The rows of the table an fx node of a torch.export graph gathers from, where it is an embedding op whose
    table's shape the trace kept."""
    if node.op != "call_function" or _schema_name(node.target) not in EMBEDDING_SCHEMAS:
        return None
    val = getattr(node.args[0], "meta", {}).get("val")
    return val.shape[0] if isinstance(val, torch.Tensor) else None


def _keeps_values(have: torch.dtype, want: torch.dtype | None) -> bool:
    """Whether a cast of integers of dtype `have` to `want` (None: no dtype, a move) keeps every value."""
    if want is None or want == have:
        return True
    if want.is_floating_point or want.is_complex or want == torch.bool or have.is_floating_point or have == torch.bool:
        return False
    return torch.iinfo(want).min <= torch.iinfo(have).min and torch.iinfo(have).max <= torch.iinfo(want).max


def _short(dtype: torch.dtype) -> str:
    """A dtype's name as a model writes it, less `torch.`: int8."""
    return str(dtype).removeprefix("torch.")


def _most(dtype: torch.dtype) -> int:
    """The largest value of an integer dtype; -1 for any other, which holds no id."""
    if dtype.is_floating_point or dtype.is_complex or dtype == torch.bool:
        return -1
    return torch.iinfo(dtype).max


def _rows_of(table, embedding: bool = True) -> int | None:
    """The rows of a table: a 2-D tensor's for an embedding op, any tensor's first dim for an index."""
    if not isinstance(table, torch.Tensor) or table.dim() < 1 or (embedding and table.dim() != 2):
        return None
    return table.shape[0]


@dataclass
class IdRanges:
    """What `id_ranges` found (module docstring). `rows`: by input whose every id reaches a table unchanged, the
    rows of its smallest table; `least`: the least id those tables take, 0 or (`table[ids]` alone) -rows; `bounds`:
    by input whose ids reach a table through ops that keep values or some of them, the rows of its smallest such
    table; `unclear`: by input reaching a table otherwise, why its ids are not checked (the first way found);
    `unpublished`: by input of `rows` that has no bound, why (a use of its ids not followed)."""

    rows: dict[str, int] = field(default_factory=dict)
    least: dict[str, int] = field(default_factory=dict)
    unclear: dict[str, str] = field(default_factory=dict)
    bounds: dict[str, int] = field(default_factory=dict)
    unpublished: dict[str, str] = field(default_factory=dict)

    def said(self) -> str:
        """The start-up's words for it: "input 'ids' in [0, 1000); input 'b' not checked: ...", and why an input
        that is checked has no published bound: "input 'c' in [0, 100) (checked per request; no bound published:
        ...)"."""
        parts = [
            f"input '{n}' in [{self.least.get(n, 0)}, {r})"
            + (f" (checked per request; no bound published: {self.unpublished[n]})" if n in self.unpublished else "")
            for n, r in self.rows.items()
        ]
        parts += [f"input '{n}' not checked: {why}" for n, why in self.unclear.items() if n not in self.rows]
        return "; ".join(parts)


def _bare(op: str) -> str:
    """An op's name as `_NO_LOOKUP` lists it: aten's and prim's without their namespace (another's, a custom op's,
    kept, so that none is taken for torch's), an in-place op's without its trailing `_`."""
    for space in ("aten::", "prim::"):
        op = op.removeprefix(space)
    if "::" in op or op in _NO_LOOKUP:  # python's `&` and `|` are operator.and_ and or_, not in-place ops
        return op
    return op[:-1] if op.endswith("_") and not op.endswith("__") else op


def _is_in_place(op: str) -> bool:
    """Whether an op is an in-place one (`ne_`), by its name: not python's `and_` (`&`), nor a custom op."""
    return _bare(op) != op.removeprefix("aten::").removeprefix("prim::")


class _Walk:
    """The values of one graph that hold an input's ids (`ids`: value → (input, dtype, the op that passed on only
    some of them, '' where none did)), those derived from an input otherwise (`mixed`: value → {input: how, the
    words after "it reaches a table through": the step that left what is followed, the ids, a mask or a `% n` of
    them}), the masks among them (`masks`), the integer dtype of those known to hold one (`integer`), those in
    [0, n) whatever the ids (`within`: value → (n, the words of what made it: `aten::remainder by 200`), an integer
    `% n`), the values whose
    memory each value made by a view, a cast, a copy, a container's item or an op that may return its argument may
    share (`base`: value → its roots; an in-place change of one changes the others), the floats a table holds that
    were looked up at an input's ids, or an integer table's made floats (`values`: value → {input: how}; no ids, nor
    positions, until cast to an integer: `_Walk.table_values`; `held`: an integer table's, as `mixed` says them →
    as `values` do, once floats), the values known to be bools (`bools`: 0 or 1, which `masks` with a uint8 input's
    ids is not), what reached a table, and the inputs whose bound is not known (`unbounded`: input → why, module
    docstring)."""

    def __init__(self) -> None:
        self.ids: dict = {}
        self.mixed: dict = {}
        self.masks: set = set()
        self.bools: set = set()
        self.within: dict = {}
        self.integer: dict = {}
        self.base: dict = {}
        self.values: dict = {}
        self.held: dict[str, str] = {}
        self.unbounded: dict[str, str] = {}
        self.changed: dict[str, str] = {}
        self.every: tuple[str, ...] = ()  # the integer inputs: what an unset value (`unset`) fails at any id of
        self.unset_hows: set[str] = set()  # the words `unset` says such a value with: no id of an input's in it
        self.found = IdRanges()

    def finished(self) -> IdRanges:
        """What was found, `bounds` left without the inputs of `unbounded`, and nothing of those in `changed`: the
        one place those rules are kept."""
        for name, why in self.changed.items():
            for found in (self.found.rows, self.found.least, self.found.bounds):
                found.pop(name, None)
            self.found.unclear.setdefault(name, why)
        for name, why in self.unbounded.items():
            self.found.bounds.pop(name, None)
            if name in self.found.rows:
                self.found.unpublished[name] = why
        return self.found

    def in_place(self, target, via: str, sources=()) -> None:
        """`target` changed in place by op `via` of the values `sources`. A graph goes on reading the value it changed,
        and any view of it, as the ids it held (`ids.sub_(1); emb(ids)`; `ids.view(-1).sub_(1)` of a torch.export
        program too), so no table found says which ids fail: `ids.clamp_(0, 99)` takes ids past a 100-row table's
        rows, `ids.sub_(1)` fails at 0. Nor is a `% n` made of the same inputs, or sharing `target`'s memory, still
        known within n (`y = ids % 200; y.view(-1).add_(150)`): a value may share memory with it by ways not followed
        (a list's item), so none is. What `target` shares memory with now holds values made of the inputs `sources`
        are made of (`buf.add_(ids)`, `torch.add(ids, 60, out=buf)` of a `buf` made of none), through `via`; where
        `via` is one of `_UNSET` or `_DRAWN` (`p.random_(0, 20)`, the memory `p.resize_(20)` adds), values that may
        fail at any id (`unset`)."""
        if _bare(via) in _KEEPS_IN_PLACE:
            return
        shared = self.sharing(target)
        touched = set(self.inputs_of(target))
        for v in shared:
            if v in self.ids:
                name = self.ids[v][0]
                touched.add(name)
                self.changed.setdefault(name, f"{via} changes its ids in place, which wok does not follow")
        written = {name: f"{via}, which wok does not follow" for s in sources for name in self.inputs_of(s)}
        looked = {name: how for s in sources for name, how in self.values.get(s, {}).items()}
        for v in shared if looked else ():  # `buf.copy_(emb(ids))`: a table's floats, cast later
            self.values[v] = {**looked, **self.values.get(v, {})}
        for v in shared:
            if v in self.ids:  # an input's ids, changed (no table of it kept): other inputs written in have no bound
                for name in written.keys() - {self.ids[v][0]}:
                    self.unbounded.setdefault(name, f"its ids are written into another input's by {via}")
            elif written:
                self.mixed[v] = {**written, **self.mixed.get(v, {})}
        held = set(shared)
        for v in [v for v in self.within if v in held or touched & set(self.inputs_of(v))]:
            _, op = self.within.pop(v)
            # The in-place op, not the `%` before it, is the step not followed (`y = ids % 200; y.view(-1).add_(1)`),
            # where it changed the `% n` itself (`self.cache = y; self.cache.add_(1)`: no input of `y`'s touched) or
            # its inputs; ids it wrote in are said as written.
            then = f"{op}, then {via} in place, which wok does not follow"
            self.mixed[v] = {
                name: then if name in touched or (v in held and name not in written) else how
                for name, how in self.inputs_of(v).items()
            }
        made = _bare(via.removesuffix(" with out="))
        if made in _UNSET or made in _DRAWN:  # an integer's (the safe side) but where only floats are drawn
            self.unset(shared, via.removesuffix(" with out="), made in _DRAWN and made not in _DRAWN_INTEGERS)

    def sharing(self, target) -> list:
        """The values that may share `target`'s memory, itself among them."""
        roots = self.roots(target)
        return [v for v, b in self.base.items() if b & roots] + [*roots, target]

    def roots(self, value) -> frozenset:
        """The values whose memory `value` may share, itself among them where it was made by none."""
        return self.base.get(value, frozenset({value}))

    def share(self, out, srcs) -> None:
        """`out` may be (a view of) any of `srcs` (`l[0]` of `l = [ids]`, `ids.cpu()`), or, where it is one of them
        (a list appended to), may now hold them too: an in-place change of it may change theirs."""
        held = self.roots(out) if out in srcs else frozenset()
        self.base[out] = held.union(*(self.roots(s) for s in srcs if s != out))

    def inputs_of(self, value) -> dict[str, str]:
        """The inputs `value` is derived from, each with how ('' where it holds the ids, all or some)."""
        if value in self.ids:
            return {self.ids[value][0]: ""}
        return self.mixed.get(value, {})

    def dtype_of(self, value) -> torch.dtype | None:
        return self.ids[value][1] if value in self.ids else None

    def integer_of(self, value) -> torch.dtype | None:
        """The integer dtype a value made of inputs is known to have (every input's ids are integers); else None."""
        return self.ids[value][1] if value in self.ids else self.integer.get(value)

    def mask(self, value) -> bool:
        """Whether a value is a mask, which `table[value]` takes no position from."""
        return value in self.masks or self.dtype_of(value) in _MASKS

    def integer_op(self, out, via: str, args: list) -> None:
        """`out`, made by op `via` of `args`: each an argument's integer dtype where it is a tensor made of inputs
        known to hold one, `int` for a python int, else None. Of one dtype where `via` keeps it (`_INTEGER_CLOSED`):
        tensors all of that dtype (no promotion: a 0-dim one of another dtype would not promote), python ints."""
        dtypes = {a for a in args if a is not int}
        if _bare(via) in _INTEGER_CLOSED and len(dtypes) == 1 and None not in dtypes:
            self.integer[out] = dtypes.pop()

    def mask_op(self, out, via: str, tensors: list, others: list, into: bool = False) -> None:
        """`out`, made by op `via` of `tensors` and the values `others`, is a mask where `via` keeps one
        (`_MASK_CLOSED`) and writes into no tensor given (`into`: `out=`, whose dtype it keeps)."""
        masks = tensors and all(self.mask(t) for t in tensors) and all(isinstance(o, bool) for o in others)
        if masks and _bare(via) in _MASK_CLOSED and not into:
            self.masks.add(out)
            if all(t in self.bools for t in tensors):  # not a uint8 input's ids, which `mask` takes for a mask
                self.bools.add(out)

    def derive(self, outs, ins, via: str, restate: bool = False, reads: bool | None = None, into: bool = False) -> None:
        """`outs`, made by op `via` from `ins`: derived from each input any of `ins` is, not as ids (`restate`:
        said to be through `via`, not what made `ins`; so too from the ids, a mask or a `% n` of them, which are
        followed: `via` is the first step that is not). `reads`: whether `via` may read `ins`' values as positions
        where wok does not follow them, which leaves their inputs without a bound; None: unless it is in
        `_NO_LOOKUP`. `into`: `via` writes its result into a tensor given (`out=`), which keeps its own dtype."""
        if _bare(via) in _SHAPES:
            return
        if _bare(via) in _ATTENDING and not into:
            self.floats(outs, ins, via)
            return
        merged: dict[str, str] = {}
        unfollowed = f"{via}, which wok does not follow"
        looked: dict[str, str] = {}
        for v in ins:
            for name, how in self.inputs_of(v).items():
                merged.setdefault(
                    name, unfollowed if restate or v in self.within or v in self.masks else how or unfollowed
                )
            for name, how in self.values.get(v, {}).items():
                looked.setdefault(name, how)
        if looked:  # a table's floats through any op (a layer, a norm) are not read as positions until cast
            for o in outs:
                self.values[o] = looked
            if _bare(via) in _COMPARES and not _is_in_place(via) and not into:
                self.masks.update(outs)  # `emb(ids) > 0`
                self.bools.update(outs)
        if merged:
            for o in outs:
                self.mixed[o] = merged
            # `x.ne_(0)` of integers holds integers, and so does `torch.ne(x, 0, out=integers)`: 0s and 1s, rows.
            if _bare(via) in _COMPARES and not _is_in_place(via) and not into:
                self.masks.update(outs)
                self.bools.update(outs)
            if reads or (reads is None and _bare(via) not in _NO_LOOKUP):
                for name, how in merged.items():
                    what = how.removesuffix(", which wok does not follow") if how in self.unset_hows else "its ids"
                    self.unbounded.setdefault(name, f"{what} reach {via}, which wok does not follow")

    def floats(self, outs, ins, via: str) -> None:
        """`outs`, floats that op or module `via` made of `ins`: attention, where a mask made of ids (`ids == pad` as
        src_key_padding_mask) weighs or selects its scores, and is read as no position (`_ATTENTION`); a TorchScript
        branch whose every way gives floats. They hold no ids, as a table's floats hold none: `values` (through a
        layer norm, a dropout, a head, none is read), positions only once cast to integers (`cast_values`)."""
        made: dict[str, str] = {}
        for v in ins:
            for name in self.inputs_of(v):
                made.setdefault(name, f"the floats of {via}, given values made of its ids,")
            for name, how in self.values.get(v, {}).items():
                made.setdefault(name, how)
        for o in outs if made else ():
            self.values[o] = {**made, **self.values.get(o, {})}

    def remainder(self, out, divisor, dtype: torch.dtype | None, via: str) -> None:
        """`out` is a value of `dtype` (None: not known) `% divisor` by op `via`: in [0, divisor) whatever the ids,
        for a positive whole divisor (torch's remainder takes the divisor's sign) that the dtype holds. Not for a
        float: `(ids.half() % 1000).long()` is garbage from id 65,520 (inf), and a float's remainder may round up to
        the divisor; nor past the dtype, which wraps the divisor: an int8's `% 200` is `% -56`, in (-56, 0]. Where
        it is not within, `out`'s inputs are said to reach a table through it, and why."""
        whole = isinstance(divisor, int) and not isinstance(divisor, bool)
        if dtype is not None and whole and 0 < divisor <= _most(dtype):
            self.within[out] = (divisor, f"{via} by {divisor}")
            return
        if out not in self.mixed:
            return
        if isinstance(divisor, (bool, int, float)):
            if not whole or divisor <= 0:
                how = f"{via} by {divisor!r}, not a positive whole number"
            elif dtype is None:
                how = f"{via} of values not known to be integers"
            elif _most(dtype) < 0:
                how = f"{via} of {_short(dtype)} values, not integers"
            else:
                how = f"{via} by {divisor}, past what {_short(dtype)} holds ({_most(dtype)})"
        else:
            how = f"{via} by a divisor not known at load"
        self.mixed[out] = dict.fromkeys(self.mixed[out], how)

    def unset(self, outs, via: str, floats: bool, below: int | None = None, how: str = "") -> None:
        """`outs`, made by op `via` (`_UNSET`, `_DRAWN`), hold whatever their memory held or what it draws: none of
        any input's ids, yet a table looked up at them may fail at any id of every input (`torch.empty(ids.shape,
        dtype=torch.long)` as positions: an id 0 fails as one past the table, and a bound published for the ids would
        be false). So they are made of every integer input, as values not followed (`how`: their words, where not
        the op's); `floats` (a float dtype): as a table's floats are, positions only once cast (`values`), not read
        as positions by the layers they go through. `below`: what `via` draws is in [0, below) (`torch.randint(0,
        16, ids.shape)`: within a 16-row table)."""
        if not how:
            drawn = _bare(via) in _DRAWN
            how = f"the values {via} draws at each call" if drawn else f"the values {via} leaves unset"
            how += "" if drawn else " (whatever its memory held)"
        self.unset_hows.add(how)
        made = dict.fromkeys(self.every, how)
        for o in outs if made else ():
            self.within.pop(o, None)
            if floats:
                self.values[o] = {**self.values.get(o, {}), **made}
            else:
                self.mixed[o] = {**self.mixed.get(o, {}), **made}
                if below is not None:
                    self.within[o] = (below, f"{via}'s draws below {below}")

    def filled(self, out, via: str) -> None:
        """`out`, made by op `via` (`_FILLED`), holds one value whatever its arguments: in [0, n) (`within`)."""
        n = _FILLED[_bare(via)]
        self.within[out] = (n, f"{via}'s filled value ({n - 1})")

    def choose(self, out, via: str, ways: list) -> None:
        """`out`, made by op `via` (`torch.where(cond, a, b)`) of one of `ways`' values at each place: a value of
        the graph, or a python number. Where each is within a bound (`within`, a bool's 0 or 1, a number of at
        least 0), so is `out`, within the largest (`torch.where(ids > 50, 1, 0)`: 0 or 1, a 2-row table's), the
        condition read as no position; else it is what `derive` made it."""
        bounds = []
        for way in ways:
            if isinstance(way, (bool, int)):
                bounds.append(int(way) + 1 if way >= 0 else None)
            elif isinstance(way, (torch.fx.Node, torch._C.Value)) and way in self.within:
                bounds.append(self.within[way][0])
            elif isinstance(way, (torch.fx.Node, torch._C.Value)) and way in self.bools:
                bounds.append(2)
            else:  # a float, a value not known to be within one
                bounds.append(None)
        if bounds and None not in bounds:
            self.within[out] = (max(bounds), f"{via} of values below {max(bounds)}")

    def positions(self, outs, index, via: str) -> None:
        """`outs`, rows of a tensor wok does not size (a computed one, or along another dim) taken by op `via` at the
        values `index`; a mask among them takes no position."""
        self.derive(outs, index, via, reads=False)
        for v in index:
            if not self.mask(v):
                self.derive([], [v], via, reads=True)
                for name, how in self.values.get(v, {}).items():  # a float is no position: made one unread
                    self.unbounded.setdefault(
                        name, f"its ids reach {via} through {how}, made integers by a step wok does not follow"
                    )

    def keep(
        self, out, src, want: torch.dtype | None = None, via: str = "", part: bool = False, read: bool = True
    ) -> None:
        """`out` holds `src`'s values (`part`: some of them): ids stay ids, where a cast to `want` loses none; a mask
        stays a mask but cast (`mask.long()` holds rows 0 and 1), and anything cast to bool is one (`(ids != 0).bool()`,
        `ids.bool()`). A cast to another dtype than `src`'s is a copy; a move, or a cast to its own dtype (or one not
        known: `read` False, `want` a stand-in), may be `src` itself (`ids.long()` of int64 ids)."""
        have = self.integer_of(src)  # a mask's is not known: a uint8 one of a torch.export graph is no bool
        if want is None or have is None or want == have or not read:
            self.base[out] = self.roots(src)
        if want == torch.bool or (src in self.masks and want is None):
            self.masks.add(out)
        if want == torch.bool or (src in self.bools and want is None):
            self.bools.add(out)
        if src in self.ids and _keeps_values(self.ids[src][1], want):
            name, have, taken = self.ids[src]
            self.ids[out] = (name, want or have, taken or (via if part else ""))
        else:
            self.derive([out], [src], via, reads=False)
            n, op = self.within.get(src, (None, ""))
            if n is not None and (want is None or n - 1 <= _most(want)):
                self.within[out] = (n, op)
            elif src in self.bools and read and want is not None and _most(want) >= 1:
                # A bool's 0 or 1 as integers (`emb((ids > 50).long())`): within 2 rows, none of the ids' values.
                self.within[out] = (2, f"{via} of a mask (0 or 1)")
            dtype = self.integer_of(src) if want is None else want
            if dtype is not None and _most(dtype) >= 0:
                self.integer[out] = dtype
        if src in self.values and not (read and (want is None or want.is_floating_point or want.is_complex)):
            self.cast_values(out, via if read else f"{via} to a dtype not known at load")
        if read and want is not None and (want.is_floating_point or want.is_complex):
            self.floated(out)

    def floated(self, out) -> None:
        """`out` is cast to floats: an integer table's values in it (`table_values`), positions no more until cast back
        (`q[ids].float() * scale`, a dequantized row, through a layer norm), are `values`, as a float table's are."""
        mixed = self.mixed.get(out, {})
        held = {name: self.held[how] for name, how in mixed.items() if how in self.held}
        if held:
            self.values[out] = {**held, **self.values.get(out, {})}
            self.mixed[out] = {name: how for name, how in mixed.items() if name not in held}

    def cast_values(self, out, via: str) -> None:
        """`out` is a table's floats (`values`) cast by `via` to integers, or to a dtype not known: values made of
        the ids that may reach a table as ids (`emb(ids).long()`), not followed; or made integers by an op
        (`_INDICES_OF`)."""
        if out not in self.values:
            return
        looked = self.values.pop(out)
        cast = {name: f"{how} cast by {via}, which wok does not follow" for name, how in looked.items()}
        self.mixed[out] = {**cast, **self.mixed.get(out, {})}

    def reinterpret(self, out, src, dtype: torch.dtype, via: str) -> None:
        """`out` is `src`'s memory read as `dtype` (`ids.view(torch.int8)`): its bytes, none of its values (id 200
        is -56, 0, ...; an int8's `% 100` read as int64, ids past any table)."""
        self.derive([out], [src], via, reads=False)
        self.base[out] = self.roots(src)
        if _most(dtype) >= 0:
            self.integer[out] = dtype
            if out in self.values:
                self.cast_values(out, via)

    def alias(self, out, src) -> None:
        """`out` is `src` (a branch always taken returns it)."""
        self.base[out] = self.roots(src)
        if src in self.ids:
            self.ids[out] = self.ids[src]
        elif src in self.mixed:
            self.mixed[out] = self.mixed[src]
        if src in self.values:
            self.values[out] = self.values[src]

    def lookup(
        self, index, rows: int | None, what: str, conditional: str = "", wraps: bool = False, partial: str = ""
    ) -> None:
        """Ids `index` looked up in a table of `rows` rows (None: not known) by op `what`; `wraps`: as `table[ids]`,
        which counts a negative id from the table's end; `partial`: why `what` may read only some of the ids."""
        for name, how in self.values.get(index, {}).items():
            # A float fails as an index: these are ids only through a cast wok did not see (`x.type_as(ids)`).
            if name not in self.inputs_of(index):
                why = f"it reaches {what} through {how}, made integers by a step wok does not follow"
                self.found.unclear.setdefault(name, why)
                self.unbounded.setdefault(name, why)
        for name, how in self.inputs_of(index).items():
            taken = self.ids[index][2] if index in self.ids else ""
            if how:
                n, op = self.within.get(index, (None, ""))
                if n is None:
                    why = f"it reaches {what} through {how}"
                elif rows is None:
                    why = f"it reaches {what} through {op}, whose table's rows cannot be read"
                elif n <= rows:  # `ids % n` stays within n rows: followed, and no id fails there
                    self.found.unclear.setdefault(name, f"it reaches {what} through {op}, within its {rows} rows")
                    continue
                else:
                    past = f"whose results from {rows} to {n - 1} are past its {rows} rows"
                    why = f"it reaches {what} through {op}, {past}"
                self.found.unclear.setdefault(name, why)
                self.unbounded.setdefault(name, why)
                continue
            if rows is None:
                why = f"it reaches {what}, whose table's rows cannot be read"
                self.found.unclear.setdefault(name, why)
                self.unbounded.setdefault(name, why)
                continue
            self.found.bounds[name] = min(rows, self.found.bounds.get(name, rows))
            if taken:
                self.found.unclear.setdefault(name, f"it reaches {what} through {taken}, which passes on only some ids")
            elif partial:
                self.found.unclear.setdefault(name, f"it reaches {what}, {partial}")
            elif conditional:
                self.found.unclear.setdefault(name, f"it reaches {what} under a condition ({conditional})")
            else:
                self.found.rows[name] = min(rows, self.found.rows.get(name, rows))
                low = -rows if wraps else 0
                self.found.least[name] = max(low, self.found.least.get(name, low))

    def table_values(self, outs, index, what: str, table, name: str = "") -> None:
        """`outs` hold the values of `table` (a tensor, or None where it is not known; `name`: the model's, where
        read) that op `what` looked up at `index`. Made of the ids as much as the ids are: where they are integers
        (or may be), ids remapped (`a(self.remap[ids])`), which reach a table as values wok does not follow (not
        checked, and no bound: `remap`'s rows say nothing of which ids fail `a`); where floats, they are `values`,
        followed to a cast to an integer (`a(emb(ids).long())`) or an op that makes integers of them (`_INDICES_OF`:
        `x.gather(-1, emb(ids).argmax(-1, keepdim=True))`), and are no ids nor positions before one; so too an integer
        table's values cast to floats (`_Walk.floated`)."""
        inputs = self.inputs_of(index)
        if not inputs:
            return
        dtype = table.dtype if isinstance(table, torch.Tensor) else None
        shown = f"{what} ({name})" if name else what
        if dtype is not None and (dtype.is_floating_point or dtype.is_complex):
            how = f"the {_short(dtype)} values of {shown}"
            for o in outs:
                self.values[o] = {**dict.fromkeys(inputs, how), **self.values.get(o, {})}
            return
        held = f"{_short(dtype)} values" if dtype is not None else "values, of a dtype not known at load,"
        how = f"the {held} of {shown}, which wok does not follow"
        self.held[how] = f"the {held} of {shown}"  # what they are once cast to floats (`floated`)
        for o in outs:
            self.mixed[o] = {**dict.fromkeys(inputs, how), **self.mixed.get(o, {})}
            if dtype is not None and _most(dtype) >= 0:
                self.integer[o] = dtype  # `self.remap[ids] % 100` is within 100 all the same


def id_ranges(model, order: list[str], dtypes: dict[str, torch.dtype]) -> IdRanges:
    """The embedding tables each integer input of `model` reaches (module docstring). `model`: a torch.export
    program, a TorchScript module or a python nn.Module; `order`: the config's input names in the order the model
    takes them (its forward's, or its program's); `dtypes`: by integer input, its torch dtype (others are left
    out). Nothing of the model runs, but a python module's forward, traced by torch.fx on a copy."""
    walk = _Walk()
    walk.every = tuple(dtypes)
    if isinstance(model, torch.export.ExportedProgram):
        _walk_program(walk, model, order, dtypes)
    elif isinstance(model, torch.jit.ScriptModule):
        _walk_script(walk, model, order, dtypes)
    else:
        _walk_python(walk, model, order, dtypes)
    return walk.finished()


# -- torch.export ------------------------------------------------------------------------------------------------
def _walk_program(walk: _Walk, program, order: list[str], dtypes: dict[str, torch.dtype]) -> None:
    from torch.export.graph_signature import InputKind

    kinds = {s.arg.name: s.kind for s in program.graph_signature.input_specs if hasattr(s.arg, "name")}
    user = [s.arg.name for s in program.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
    names = dict(zip(user, order))
    tables = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)
    # The model's names of its parameters and buffers (`remap`), by their placeholders'.
    targets = {s.arg.name: s.target for s in program.graph_signature.input_specs if hasattr(s.arg, "name")}

    def table(node) -> torch.Tensor | None:
        val = getattr(node, "meta", {}).get("val")
        return val if kinds.get(getattr(node, "name", None)) in tables and isinstance(val, torch.Tensor) else None

    def looked_up(outs, index, what: str, weight) -> None:
        held = getattr(weight, "meta", {}).get("val")
        walk.table_values(outs, index, what, held, targets.get(getattr(weight, "name", None)) or "")

    for node in program.graph.nodes:
        if node.op == "placeholder":
            name = names.get(node.name)
            if name in dtypes:
                walk.ids[node] = (name, dtypes[name], "")
            continue
        if node.op != "call_function":
            continue
        op = _schema_name(node.target) or getattr(node.target, "__name__", str(node.target))
        ins = [a for a in node.all_input_nodes]
        looks_up = op == _INDEX_SELECT and len(node.args) == 3 and node.args[1] == 0 and table(node.args[0]) is not None
        if isinstance(node.kwargs.get("out"), torch.fx.Node):
            # As in the other walks (`_Script.nodes`): its result is the tensor given, which torch.export keeps
            # (`index_select(remap, 0, pos, out=ids.view(-1))` changes the ids a table then reads), not followed
            # as ids; what it writes read from its schema. A lookup is one all the same, of the ids as they come.
            index = node.args[2] if looks_up else None
            if looks_up:
                walk.lookup(index, _rows_of(table(node.args[0]), embedding=False), f"{op} of a parameter")
            ins = [a for a in ins if a is not index]
            walk.derive([node], ins, op)
            _program_writes(walk, node, op, ins)
            if looks_up:  # the table's values at the ids, written into `out`
                looked_up([node, *walk.sharing(node.kwargs["out"])], index, f"{op} of a parameter", node.args[0])
        elif op in EMBEDDING_SCHEMAS and len(node.args) > 1:
            partial = "" if _schema_arg(node, "include_last_offset") in (None, False) else _LAST_OFFSET
            walk.lookup(node.args[1], _looked_up_rows(node), op, partial=partial)
            walk.derive([node], [a for a in ins if a is not node.args[1]], op, reads=False)
            looked_up([node], node.args[1], op, node.args[0])
        elif looks_up:
            walk.lookup(node.args[2], _rows_of(table(node.args[0]), embedding=False), f"{op} of a parameter")
            walk.derive([node], [a for a in ins if a is not node.args[2]], op, reads=False)
            looked_up([node], node.args[2], f"{op} of a parameter", node.args[0])
        elif op == _INDEX and len(node.args) == 2 and table(node.args[0]) is not None and _one_index(node.args[1]):
            index = node.args[1][0]
            val = index.meta.get("val")
            if isinstance(val, torch.Tensor) and val.dtype in _MASKS:
                walk.derive([node], ins, op, reads=False)
                continue
            rows = _rows_of(table(node.args[0]), embedding=False)
            walk.lookup(index, rows, f"{op} (table[ids]) of a parameter", wraps=True)
            walk.derive([node], [a for a in ins if a is not index], op, reads=False)
            looked_up([node], index, f"{op} (table[ids]) of a parameter", node.args[0])
        elif op == "aten::view" and len(node.args) > 1 and isinstance(node.args[1], torch.dtype):
            walk.reinterpret(node, node.args[0], node.args[1], op)
        elif op.removesuffix("_") in _KEEPS and node.args:  # `mask.unsqueeze_(-1)` as well
            walk.keep(node, node.args[0], via=op)
            walk.derive([node], ins[1:], op, reads=False)
        elif op in (_INDEX, _INDEX_SELECT) and node.args:
            walk.keep(node, node.args[0], via=op, part=True)
            index = node.args[1] if op == _INDEX else node.args[2:3]
            masks = [i for i in index if isinstance(i, torch.fx.Node) and _fx_val_dtype(i) in _MASKS]
            walk.masks.update(masks)
            walk.positions([node], [a for a in ins[1:] if a is not node.args[0]], op)
        elif op in _PARTS and node.args:
            walk.keep(node, node.args[0], via=op, part=True)
            walk.derive([node], _shape_read(op, ins[1:]), op, reads=False)
            if op in _POSITIONED:
                walk.positions([], [a for a in ins if a is not node.args[0]], op)
        elif op in _CASTS and node.args:
            val = node.meta.get("val")
            read = isinstance(val, torch.Tensor)
            walk.keep(node, node.args[0], val.dtype if read else torch.float32, op, read=read)
        elif op in _RENORMS and len(node.args) > 1:
            # max_norm's renorm of the rows the ids name, in place, before F.embedding looks them up: the same rows.
            walk.lookup(node.args[1], _rows_of(getattr(node.args[0], "meta", {}).get("val")), op)
            walk.derive([node], [a for a in ins if a is not node.args[1]], op, reads=False)
        else:
            first = node.args[0] if node.args else None
            walk.derive([node], _values_read(op, ins, first, _fx_nodes([node.args[1:], node.kwargs])), op)
            span = functools.partial(_schema_span, op, functools.partial(_schema_arg, node))
            _made(walk, node, op, functools.partial(_floats, _fx_val_dtype(node)), span=span)
            if _bare(op) == "where" and len(node.args) == 3:
                walk.choose(node, op, [_schema_arg(node, "self"), _schema_arg(node, "other")])
            if op == "aten::remainder" and len(node.args) == 2:
                # The trace's dtypes are the graph's own: a float's `% n` is not within n (`_Walk.remainder`).
                walk.remainder(node, node.args[1], _fx_val_dtype(node.args[0]), op)
            _program_writes(walk, node, op, ins)
        val = node.meta.get("val")
        made = (
            val.dtype if isinstance(val, torch.Tensor) else type(val) if isinstance(val, (int, torch.SymInt)) else None
        )
        if made is torch.SymInt or made is int or (isinstance(made, torch.dtype) and _most(made) >= 0):
            walk.cast_values(node, op)  # a table's floats made integers (`topk`'s indices, `argmax`): the trace's dtype


def _program_writes(walk: _Walk, node, op: str, ins: list) -> None:
    """What an op of a torch.export graph not followed writes (`_Script.writes`), which torch.export keeps on a view
    or an input (`ids.view(-1).sub_(1)`, `torch.sub(v, 1, out=v)`)."""
    schema = getattr(node.target, "_schema", None)
    if schema is None:  # operator.getitem of an op's results, a higher-order op
        walk.share(node, ins)
        if _is_in_place(op) and node.args:
            walk.in_place(node.args[0], op, ins)
        return
    changed, filled = _effects(schema)
    if changed or filled or _bare(op) not in _FRESH:
        # Before the change: the result may be the tensor changed, which the change reaches (`p.normal_(10, 5).long()`,
        # `torch.randint(0, 20, s, out=p)`: what it draws, read from the result).
        walk.share(node, ins)
    for name in filled:
        held = _schema_arg(node, name)
        if isinstance(held, torch.fx.Node):
            walk.share(held, ins)
    for name in changed:
        held = _schema_arg(node, name)
        for target in held if isinstance(held, (list, tuple)) else [held]:
            if isinstance(target, torch.fx.Node):
                walk.in_place(target, _written_by(op, name), ins)


def _made(walk: _Walk, out, op: str, floats, into: bool = False, span=lambda: (None, None)) -> None:
    """What op `op` not followed as ids made of its arguments' shapes alone, in any form: `out` unset (`_UNSET`) or
    drawn (`_DRAWN`; floats where `floats()` says so; in [low, high) where `span()` gives both, python ints), or
    filled with one value (`_FILLED`), where it writes into no tensor given (`into`)."""
    if _bare(op) in _UNSET or (_bare(op) in _DRAWN and not _is_in_place(op)):
        walk.unset([out], op, floats(), _below(*span()))
    elif _bare(op) in _FILLED and not into and not _is_in_place(op):
        walk.filled(out, op)


def _below(low, high) -> int | None:
    """The bound of values drawn in [low, high): `high`, where both are python ints and `low` at least 0."""
    ints = all(isinstance(v, int) and not isinstance(v, bool) for v in (low, high))
    return high if ints and 0 <= low < high else None


def _drawn_span(op: str, args, kwargs) -> tuple:
    """The (low, high) a call of torch's `randint`, `randint_like` or `randperm` draws in, as python calls them
    (`torch.randint(20, size)`, `torch.randint(0, 20, size)`, `torch.randint_like(ids, 20)`, `torch.randperm(n)`);
    (None, None) for any other op, or a bound not given."""
    name = _bare(op)
    if name == "randperm":
        return 0, args[0] if args else kwargs.get("n")
    if name == "randint_like":
        ends = list(args[1:])
    elif name == "randint":
        ends = list(args if "size" in kwargs else args[:-1])  # the size last
    else:
        return None, None
    low, high = (0, ends[0]) if len(ends) == 1 else (ends[0], ends[1]) if len(ends) == 2 else (0, None)
    return kwargs.get("low", low), kwargs.get("high", high)


def _schema_span(op: str, arg) -> tuple:
    """The (low, high) an aten `randint`, `randint_like` or `randperm` draws in, its arguments read by name (`arg`:
    None where the op has none); (None, None) for any other op."""
    name = _bare(op)
    if name == "randperm":
        return 0, arg("n")
    if name not in ("randint", "randint_like"):
        return None, None
    low = arg("low")
    return 0 if low is None else low, arg("high")


def _floats(dtype: torch.dtype | None) -> bool:
    """Whether a dtype is known to be a float's (or a complex's), which no id is."""
    return dtype is not None and (dtype.is_floating_point or dtype.is_complex)


def _shape_read(op: str, others: list) -> list:
    """The other arguments than the tensor of one of `_PARTS` whose values it may read: none of `expand_as`, which
    reads its other's shape alone (`arange(ids.size(1)).expand_as(ids)`, BERT's positions)."""
    return [] if _bare(op) == "expand_as" else others


def _values_read(op: str, ins: list, first, rest: list) -> list:
    """Those of `ins`, an op's arguments, whose values op `op` may read: all but its first argument `first` where it
    is one of `_LIKE`, which reads that one's shape alone, and `first` is not given again among the others (`rest`)."""
    if _bare(op) not in _LIKE or first is None or any(r is first for r in rest):
        return ins
    return [v for v in ins if v is not first]


def _fx_nodes(args) -> list:
    """The fx nodes among `args`, at any depth of its lists, tuples and dicts."""
    found: list = []
    torch.fx.node.map_arg(args, found.append)
    return found


def _fx_val_dtype(node) -> torch.dtype | None:
    """The dtype of a torch.export graph's value, where its trace kept it."""
    val = getattr(node, "meta", {}).get("val")
    return val.dtype if isinstance(val, torch.Tensor) else None


def _schema_arg(node, name: str):
    """The value a node of a torch.export graph gives its aten op's argument `name` (by position, by keyword, else
    the schema's default); None where the op has no such argument."""
    for i, arg in enumerate(node.target._schema.arguments):
        if arg.name == name:
            return node.args[i] if i < len(node.args) else node.kwargs.get(name, arg.default_value)
    return None


def _one_index(indices) -> bool:
    """Whether aten::index's indices are one tensor, along the rows: `table[ids]`."""
    return isinstance(indices, (list, tuple)) and len(indices) == 1 and isinstance(indices[0], torch.fx.Node)


# -- TorchScript -------------------------------------------------------------------------------------------------
_UNKNOWN = object()
# The ops on constants a TorchScript branch's condition is made of where it is known before a request comes: the
# `max_norm is not None` of F.embedding's code, F.embedding_bag's swap of a float input with a long weight.
_FOLDS = {
    "aten::__not__": lambda a: not a,
    "aten::__and__": lambda a, b: a and b,
    "aten::__or__": lambda a, b: a or b,
    "aten::eq": operator.eq,
    "aten::ne": operator.ne,
}


class _Script:
    """A TorchScript module's inlined graph walked: `objects`, the modules and tensors values are (self, its
    attributes, a frozen module's constants); `known`, the values known before a request comes."""

    def __init__(self, walk: _Walk, module: torch.jit.ScriptModule) -> None:
        self.walk = walk
        self.graph = module.inlined_graph  # held: its nodes are invalidated once the graph is freed
        self.objects: dict = {next(iter(self.graph.inputs())): module}
        self.known: dict = {}
        # The attributes forward sets (a table built at its first call): read at load, they are not what it reads.
        self.set_by_forward = {n.s("name") for n in self.graph.findAllNodes("prim::SetAttr", recurse=True)}

    def object(self, value):
        """The module or tensor a value is: an attribute read (prim::GetAttr) off one known, or a constant tensor
        (a frozen module's weights); else None."""
        if value in self.objects:
            return self.objects[value]
        node = value.node()
        if node.kind() == "prim::GetAttr":
            if node.s("name") in self.set_by_forward:
                return None
            owner = self.object(node.inputsAt(0))
            return getattr(owner, node.s("name"), None) if owner is not None else None
        if node.kind() == "prim::Constant" and isinstance(value.type(), torch._C.TensorType):
            try:
                held = value.toIValue()
            except RuntimeError:
                return None
            return held if isinstance(held, torch.Tensor) else None
        return None

    def constant(self, value):
        """The value `value` always has (None, a bool, a number, a string), else _UNKNOWN."""
        if value not in self.known:
            self.known[value] = self._constant(value)
        return self.known[value]

    def _constant(self, value):
        node = value.node()
        kind = node.kind()
        if kind == "prim::Constant":
            if isinstance(value.type(), torch._C.TensorType):
                return _UNKNOWN
            try:
                return value.toIValue()
            except RuntimeError:
                return _UNKNOWN
        if kind in ("aten::__is__", "aten::__isnot__"):
            a, b = (self.constant(v) for v in node.inputs())
            # `is` of constants is known only against None: two equal ints may be two objects.
            if _UNKNOWN in (a, b) or (a is not None and b is not None):
                return _UNKNOWN
            return (a is b) == (kind == "aten::__is__")
        if kind == "aten::is_floating_point":
            dtype = self.walk.dtype_of(node.inputsAt(0))
            held = self.object(node.inputsAt(0))
            dtype = held.dtype if dtype is None and isinstance(held, torch.Tensor) else dtype
            return _UNKNOWN if dtype is None else dtype.is_floating_point
        if kind == "prim::If":
            cond = self.constant(node.inputsAt(0))
            blocks = list(node.blocks())
            taken = blocks if cond is _UNKNOWN else [blocks[0] if cond else blocks[1]]
            got = {repr(self.constant(list(b.outputs())[value.offset()])) for b in taken}
            return self.constant(list(taken[0].outputs())[value.offset()]) if len(got) == 1 else _UNKNOWN
        fold = _FOLDS.get(kind)
        if fold is None:
            return _UNKNOWN
        args = [self.constant(v) for v in node.inputs()]
        if _UNKNOWN in args or any(isinstance(a, torch.Tensor) for a in args):
            return _UNKNOWN
        try:
            return fold(*args)
        except TypeError:  # an arity or a type other than expected
            return _UNKNOWN

    def nodes(self, nodes, conditional: str) -> None:
        walk = self.walk
        for node in nodes:
            kind = node.kind()
            ins = list(node.inputs())
            outs = list(node.outputs())
            if _writes_out(node):
                # Its result is the tensor given (`torch.index_select(x, 0, pos, out=ids)` changes the ids): not
                # followed as ids, and what it writes read from its schema. A lookup is one all the same: of the ids
                # as they come, a table's rows written into `out`.
                looks_up = self.table_index(node, kind, ins)
                index = ins[2] if looks_up else None
                if looks_up:
                    rows = _rows_of(self.object(ins[0]), embedding=False)
                    walk.lookup(index, rows, f"{kind} of a parameter", conditional)
                self.unfollowed(node, kind, [v for v in ins if v is not index], outs)
                if looks_up:  # the table's values at the ids, written into `out`
                    shared = [*outs, *walk.sharing(node.namedInput("out"))]
                    self.looked_up(shared, index, f"{kind} of a parameter", ins[0])
            elif kind == "prim::If":
                self.branch(node, ins, outs, conditional)
            elif list(node.blocks()):
                # A loop: what it looks up runs only on some requests, and what it returns is not followed.
                blocks = list(node.blocks())
                for block in blocks:
                    self.nodes(block.nodes(), conditional or kind)
                walk.derive(outs, ins + _inner(blocks), kind, restate=True, reads=False)
            elif kind in EMBEDDING_SCHEMAS:
                partial = "" if self.last_offset(node) is False else _LAST_OFFSET
                walk.lookup(ins[1], _rows_of(self.object(ins[0])), kind, conditional, partial=partial)
                walk.derive(outs, ins[2:], kind, reads=False)
                self.looked_up(outs, ins[1], kind, ins[0])
            elif self.table_index(node, kind, ins):
                rows = _rows_of(self.object(ins[0]), embedding=False)
                walk.lookup(ins[2], rows, f"{kind} of a parameter", conditional)
                walk.derive(outs, ins[:2], kind, reads=False)
                self.looked_up(outs, ins[2], f"{kind} of a parameter", ins[0])
            elif kind == _INDEX and isinstance(self.object(ins[0]), torch.Tensor) and self._one_index(ins[1]):
                index = ins[1].node().inputsAt(0)
                if walk.mask(index):
                    walk.derive(outs, ins, kind, reads=False)
                    continue
                rows = _rows_of(self.object(ins[0]), embedding=False)
                walk.lookup(index, rows, f"{kind} (table[ids]) of a parameter", conditional, wraps=True)
                self.looked_up(outs, index, f"{kind} (table[ids]) of a parameter", ins[0])
            elif kind.removesuffix("_") in _KEEPS:
                walk.keep(outs[0], ins[0], via=kind)
            elif kind in (_INDEX, _INDEX_SELECT):
                walk.keep(outs[0], ins[0], via=kind, part=True)
                listed = ins[1].node()
                index = list(listed.inputs()) if listed.kind() == "prim::ListConstruct" else ins[1:]
                walk.derive(outs, ins[1:], kind, reads=False)
                walk.positions(outs, index, kind)
            elif kind in _PARTS:
                walk.keep(outs[0], ins[0], via=kind, part=True)
                walk.derive(outs, _shape_read(kind, ins[1:]), kind, reads=False)
                if kind in _POSITIONED:
                    walk.positions([], ins[1:], kind)
            elif kind in ("aten::__getitem__", "prim::TupleIndex"):
                # A list's, a tuple's or a dict's item at an index or key made of ids: past its end, or not among
                # its keys, it fails.
                walk.derive(outs, ins[:1], kind, reads=False)
                walk.positions(outs, ins[1:], kind)
                walk.share(outs[0], ins[:1])  # the item itself: `l[0].sub_(1)` of `l = [ids]` changes the ids
            elif kind in _CASTS:
                want, read = _script_dtype(node)
                walk.keep(outs[0], ins[0], want, kind, read=read)
            else:
                self.unfollowed(node, kind, ins, outs)

    def looked_up(self, outs, index, what: str, table) -> None:
        """`outs` hold the values of the tensor `table` (a value of the graph) at `index` (`_Walk.table_values`)."""
        path = []
        node = table.node()
        while node.kind() == "prim::GetAttr":  # `self.a.weight`: a.weight
            path.insert(0, node.s("name"))
            node = node.inputsAt(0).node()
        self.walk.table_values(outs, index, what, self.object(table), ".".join(path))

    def table_index(self, node, kind: str, ins: list) -> bool:
        """Whether a node is `index_select(table, 0, ids)` of a parameter or buffer."""
        return kind == _INDEX_SELECT and self.constant(ins[1]) == 0 and isinstance(self.object(ins[0]), torch.Tensor)

    def unfollowed(self, node, kind: str, ins: list, outs: list) -> None:
        """An op whose result is not followed as ids: derived from its inputs, with what it writes."""
        walk = self.walk
        if kind == "aten::pad":
            # Its tensor is padded, none of its values read (F.multi_head_attention_forward's key_padding_mask, under a
            # condition on its module's bias_k); its amounts are sizes, which fail past the tensor's.
            walk.derive(outs, ins, kind, reads=False)
            walk.derive([], ins[1:], kind)
        else:
            walk.derive(outs, _values_read(kind, ins, ins[0] if ins else None, ins[1:]), kind, into=_writes_out(node))
        if outs:
            walk.integer_op(outs[0], kind, [self.integer_arg(v) for v in ins])
            tensors = [v for v in ins if isinstance(v.type(), torch._C.TensorType)]
            others = [self.constant(v) for v in ins if v not in tensors]
            walk.mask_op(outs[0], kind, tensors, others, into=_writes_out(node))
        if outs:
            span = functools.partial(_schema_span, kind, functools.partial(self.named_constant, node))
            _made(walk, outs[0], kind, lambda: self.unset_floats(node, kind), into=_writes_out(node), span=span)
        if _bare(kind) == "where" and len(ins) == 3 and not _writes_out(node):
            walk.choose(outs[0], kind, [self.way(node.namedInput(n)) for n in ("self", "other")])
        if kind == "aten::remainder" and len(ins) == 2:
            walk.remainder(outs[0], self.constant(ins[1]), walk.integer_of(ins[0]), kind)
        # A table's floats made integers: an op's (`_INDICES_OF`, `_WITH_INDICES`' indices) or any int (`math.floor`).
        indices = outs if _bare(kind) in _INDICES_OF else outs[1:] if _bare(kind) in _WITH_INDICES else []
        for out in outs:
            if out in indices or isinstance(out.type(), torch._C.IntType):
                walk.cast_values(out, kind)
        self.writes(node, kind, ins, outs)

    def writes(self, node, kind: str, ins: list, outs: list) -> None:
        """What an op not followed writes, read from its schema (a prim node has none: an in-place op by its name): a
        tensor it changes in place (`ids.sub_(1)`, `out=`, a list's tensors), a container it puts its other
        arguments in (`l.append(ids)`, a module `self.cache = t` sets, whose attributes read after may be `t`:
        `self.cache.add_(5)` changes it); and its result, where it may be (a view of) an argument (`_FRESH`: `l[0]`
        of `l = [ids]`, a prim node's, `ids.cpu()`)."""
        schema = _script_schema(node)
        changed, filled = _effects(schema) if schema is not None else (["self"] if _is_in_place(kind) else [], [])
        if kind == "prim::SetAttr":
            self.walk.share(ins[0], ins)
        if changed or filled or _bare(kind) not in _FRESH:
            # Before the change: the result may be the tensor changed, which the change reaches
            # (`torch.zeros(s).exponential_(0.1).long()`: what it draws, read from the result).
            for out in outs:
                self.walk.share(out, ins)
        for name in filled:
            self.walk.share(node.namedInput(name), ins)
        for name in changed:
            self.walk.in_place(ins[0] if schema is None else node.namedInput(name), _written_by(kind, name), ins)

    def unset_floats(self, node, kind: str) -> bool:
        """Whether an op of `_UNSET` or `_DRAWN` makes floats: its dtype given, or where none is, torch's default
        (floats) but for those of `_UNSET_LIKE`, whose tensor's dtype is not known to be floats, and of
        `_DRAWN_INTEGERS`. A dtype not read: not floats."""
        dtype, read = _script_dtype(node)
        if dtype is None:
            return read and _bare(kind) not in _UNSET_LIKE and _bare(kind) not in _DRAWN_INTEGERS
        return read and _floats(dtype)

    def named_constant(self, node, name: str):
        """The value a node's argument `name` always has (`constant`; _UNKNOWN where not known); None where its op
        has no such argument."""
        try:
            return self.constant(node.namedInput(name))
        except RuntimeError:
            return None

    def way(self, value):
        """One of `torch.where`'s values as `_Walk.choose` takes it: a tensor of the graph, or a constant's value."""
        if isinstance(value.type(), torch._C.TensorType):
            return value
        held = self.constant(value)
        return None if held is _UNKNOWN else held

    def integer_arg(self, value):
        """An op's argument as `_Walk.integer_op` takes it: a tensor's integer dtype, `int` for an int constant."""
        if isinstance(value.type(), torch._C.TensorType):
            return self.walk.integer_of(value)
        held = self.constant(value)
        return int if isinstance(held, int) and not isinstance(held, bool) else None

    def last_offset(self, node):
        """An embedding op's include_last_offset: False where it has none; _UNKNOWN where not known at load
        (F.embedding_bag's code passes a module's True for 1-D ids alone, whose dims come with the request)."""
        try:
            value = node.namedInput("include_last_offset")
        except RuntimeError:  # aten::embedding: no such argument
            return False
        return self.constant(value)

    @staticmethod
    def _one_index(indices) -> bool:
        listed = indices.node()
        return listed.kind() == "prim::ListConstruct" and listed.inputsSize() == 1

    def branch(self, node, ins, outs, conditional: str) -> None:
        """prim::If: where its condition is known (`constant`), the way it always takes, as if inline; else each
        way under the condition, and an output that holds ids of one input whichever way is taken holds them."""
        walk = self.walk
        blocks = list(node.blocks())
        cond = self.constant(ins[0])
        if cond is not _UNKNOWN:
            block = blocks[0] if cond else blocks[1]
            self.nodes(block.nodes(), conditional)
            for out, value in zip(outs, block.outputs()):
                walk.alias(out, value)
                held = self.object(value)
                if held is not None:
                    self.objects[out] = held
            return
        for block in blocks:
            self.nodes(block.nodes(), conditional or "prim::If")
        inner = _inner(blocks)
        for i, out in enumerate(outs):
            values = [list(b.outputs())[i] for b in blocks]
            walk.share(out, values)  # either way's value itself: an in-place change of `out` changes it
            ways = [walk.ids.get(v) for v in values]
            if all(w is not None for w in ways) and len({w[:2] for w in ways}) == 1:
                walk.ids[out] = (*ways[0][:2], next((w[2] for w in ways if w[2]), ""))
                continue
            if all(v in walk.values and not walk.inputs_of(v) for v in values):
                # A table's floats or attention's either way (F.multi_head_attention_forward's, by a condition made
                # of its mask): floats whichever is taken, positions only once cast.
                walk.floats([out], ins + inner, "prim::If")
                continue
            walk.derive([out], ins + inner, "prim::If", restate=True, reads=False)
            within = [walk.within.get(v) for v in values]
            if all(w is not None for w in within):  # `% n` either way: within the largest n
                walk.within[out] = max(within, key=lambda w: w[0])


def _script_schema(node):
    """The schema of the op a TorchScript node calls; None for a prim node, which has none."""
    text = node.schema()
    return None if text == "(no schema)" else torch._C.parse_schema(text)


def _effects(schema) -> tuple[list[str], list[str]]:
    """An op's schema read for what it writes: the arguments it changes in place (a tensor, `out=`, a list's
    tensors: `Tensor(a!)[]`), and the containers it puts its other arguments in (`t[](a!)`: `l.append(ids)`)."""
    changed: list[str] = []
    filled: list[str] = []
    for arg in schema.arguments:
        info = arg.alias_info
        if info is None or not info.is_write:
            continue
        container = info.before_set and arg.type.kind() in ("ListType", "DictType")
        (filled if container else changed).append(arg.name)
    return changed, filled


def _written_by(op: str, arg: str) -> str:
    """How the start-up names an op that writes into its argument `arg`: `aten::sub_`, `aten::sub with out=`."""
    return f"{op} with {arg}=" if arg == "out" else op


def _writes_out(node) -> bool:
    """Whether a TorchScript op writes its result into a tensor given as `out=` (`aten::ne.Scalar_out`). Read from
    its schema: `node.namedInput("out")` raising for the others cost ~0.8 ms a node (an encoder's 3,000: seconds)."""
    schema = _script_schema(node)
    return schema is not None and any(arg.name == "out" for arg in schema.arguments)


def _inner(blocks) -> list:
    return [v for block in blocks for n in block.nodes() for v in [*n.inputs(), *n.outputs()]]


def _walk_script(walk: _Walk, module: torch.jit.ScriptModule, order: list[str], dtypes: dict) -> None:
    """The module's inlined graph: every submodule's method and scripted function called, in place. An
    nn.Embedding or nn.EmbeddingBag is its F.embedding's code there, whose branches are on settings known at load
    (its max_norm, the types of its table and ids) or keep the ids whichever way they go."""
    script = _Script(walk, module)
    values = list(script.graph.inputs())[1:]
    for name, value in zip(order, values):
        if name in dtypes:
            walk.ids[value] = (name, dtypes[name], "")
    # The parameters after the inputs take their defaults, as Servable calls forward: `if inputs_embeds is None:`
    # is known, its lookup not under a condition.
    for arg, value in zip(module.forward.schema.arguments[1 + len(order) :], values[len(order) :]):
        if arg.has_default_value() and type(arg.default_value) in (type(None), bool, int, float, str):
            script.known[value] = arg.default_value
    script.nodes(script.graph.nodes(), "")


def _script_dtype(node) -> tuple[torch.dtype | None, bool]:
    """The dtype a TorchScript cast casts to: None where it names none (a move to a device); float32 where it
    cannot be read (a value, or another tensor's dtype), which no id keeps; and whether it was read."""
    if node.kind() == "aten::long":
        return torch.int64, True
    try:
        value = node.namedInput("dtype")
    except RuntimeError:  # to(other): another tensor's dtype
        return torch.float32, False
    if value.node().kind() != "prim::Constant":
        return torch.float32, False
    code = value.toIValue()
    # A code not listed is a float's or a complex's: not an integer's nor bool's, what ids and masks are.
    return (None if code is None else _SCALAR_TYPES.get(code, torch.float32)), True


# -- python nn.Module (torch.fx) ---------------------------------------------------------------------------------
def _walk_python(walk: _Walk, module: torch.nn.Module, order: list[str], dtypes: dict[str, torch.dtype]) -> None:
    """A python module's forward as torch.fx traces it, on a copy in eval mode, as Servable serves it (the trace
    runs forward on proxies: what it writes to its module goes to the copy; what it does outside it, to a global or
    a file, is done once). Where it cannot be traced (a branch on an input's values, a module that cannot be copied),
    its inputs are not checked; said where it holds an nn.Embedding or nn.EmbeddingBag. Inputs sent into
    forward's *args are not followed: torch.fx has one placeholder for them all. A TorchScript submodule is not
    traced into (torch.fx cannot) but walked as a TorchScript model is."""
    try:
        traced = _traced_copy(module, len(order))
    except _NotTraced as exc:
        if any(table_rows(m) for m in module.modules()):
            for name in dtypes:
                walk.found.unclear[name] = f"its module cannot {exc}, so what reaches its tables is not known"
        return
    placeholders = [n for n in traced.graph.nodes if n.op == "placeholder"]
    for name, node in zip(order, placeholders):
        if node.target.startswith("*"):  # *args (or **kwargs): this input and those after it share it
            break
        if name in dtypes:
            walk.ids[node] = (name, dtypes[name], "")
    scripts: list[_Script] = []  # held to the end: their graphs' values are keys of walk's dicts
    state = object()  # the module's tensors, as one value
    for node in traced.graph.nodes:
        if node.op == "get_attr":
            # Each read of an attribute is a node of its own, and the trace makes a tensor forward makes of none a
            # constant, each view of it another (`buf.view(-1)`): any may share memory with any other, so what one is
            # written with (`torch.add(ids, 60, out=buf)`) any read after may hold, as TorchScript's reads of `self`.
            walk.alias(node, state)
            if _MADE_AT_TRACE in node.meta:  # a constant the trace made of what forward makes anew at each call
                op, low, high, floats = node.meta[_MADE_AT_TRACE]
                how = "" if op else f"the values of {node.target}, made by forward by no torch function wok sees"
                walk.unset([node], op, floats, _below(low, high), how + " (whatever its memory held)" if how else "")
            continue
        if node.op in ("placeholder", "output"):
            continue
        if node.op == "call_module":
            _fx_module_call(walk, traced, node, scripts)
            continue
        _fx_call(walk, traced, node)
        _fx_made_integers(walk, node)


def _fx_made_integers(walk: _Walk, node) -> None:
    """A table's floats made integers by an op (`_INDICES_OF`), or `_WITH_INDICES`' second result (`[1]`,
    `.indices`): followed as cast (`_Walk.cast_values`)."""
    name = _fx_op(node)
    src = node.args[0] if node.args else None
    if name in _INDICES_OF:
        walk.cast_values(node, name)
        return
    second = (name == "getitem" and node.args[1:] == (1,)) or (node.target is getattr and node.args[1:] == ("indices",))
    if second and isinstance(src, torch.fx.Node) and _fx_op(src) in _WITH_INDICES:
        walk.cast_values(node, f"{_fx_op(src)}'s indices")


def _fx_module_call(walk: _Walk, traced: torch.fx.GraphModule, node, scripts: list) -> None:
    """A call_module node: an nn.Embedding or nn.EmbeddingBag (its ids by position or as `input=`), or a
    TorchScript submodule (its graph walked); any other leaf's output is derived from its inputs."""
    ins = list(node.all_input_nodes)
    sub = traced.get_submodule(node.target)
    if isinstance(sub, torch.jit.ScriptModule):
        script = _Script(walk, sub)
        scripts.append(script)
        values = list(script.graph.inputs())[1:]
        names = [a.name for a in sub.forward.schema.arguments][1:]
        for arg, value in [
            *zip(node.args, values),
            *((node.kwargs[n], v) for n, v in zip(names, values) if n in node.kwargs),
        ]:
            walk.alias(value, arg)
        script.nodes(script.graph.nodes(), "")
        out = next(iter(script.graph.outputs()))
        walk.alias(node, out)
        if node not in walk.ids and node not in walk.mixed:
            walk.derive([node], ins, type(sub).__name__, reads=False)
        return
    rows = table_rows(sub) if isinstance(sub, (torch.nn.Embedding, torch.nn.EmbeddingBag)) else []
    index = _fx_arg(node, 0, "input")
    own = _runs_its_class(sub)
    if rows and index is not None and own:
        partial = _LAST_OFFSET if getattr(sub, "include_last_offset", False) else ""
        walk.lookup(index, rows[0], f"the {type(sub).__name__} module", partial=partial)
        walk.derive([node], [a for a in ins if a is not index], type(sub).__name__, reads=False)
        walk.table_values([node], index, f"the {type(sub).__name__} module", sub.weight, f"{node.target}.weight")
    else:
        # A leaf of torch.nn whose code is not read (a quantized embedding's): it may look its inputs up. Its result
        # may be its input itself or a view of it (nn.Identity, nn.Dropout in eval, nn.Flatten); with inplace=True
        # (an activation's; torch.nn's leaves write their input no other way) it changes its input, but a dropout
        # in eval, as served (`_traced_copy`), which leaves it as it is.
        shown = type(sub).__name__
        if _attends(sub):
            walk.floats([node], ins, shown)
        else:
            walk.derive([node], ins, shown, reads=True)
        if rows and not own:
            for name in {n for arg in ins for n in walk.inputs_of(arg)}:
                walk.found.unclear.setdefault(name, f"it reaches {shown}, which wok does not follow")
        idle = isinstance(sub, torch.nn.modules.dropout._DropoutNd) and not sub.training
        if getattr(sub, "inplace", False) and not idle:
            for arg in ins:
                walk.in_place(arg, f"the {shown} module (inplace=True)", ins)
        walk.share(node, ins)


# torch.nn's attention modules, leaves of torch.fx's trace: a mask given (src_key_padding_mask, attn_mask) is added
# to or selects scores, queries, keys and values are multiplied (`_ATTENTION`, their ops): none is read as a position.
_ATTENTION_MODULES = (
    torch.nn.MultiheadAttention,
    torch.nn.TransformerEncoderLayer,
    torch.nn.TransformerEncoder,
    torch.nn.TransformerDecoderLayer,
    torch.nn.TransformerDecoder,
    torch.nn.Transformer,
)


def _attends(module: torch.nn.Module) -> bool:
    """Whether a leaf of torch.fx's trace is one of torch.nn's attention modules made of torch.nn's own parts alone:
    not a subclass, nor holding one (`nn.TransformerEncoder(MyLayer(), 2)`) or a function of the model's own as a
    layer's activation, whose code may read what it is given as positions."""
    if type(module) not in _ATTENTION_MODULES:
        return False
    for part in module.modules():
        if not type(part).__module__.startswith("torch.nn.modules.") or not _runs_its_class(part):
            return False
        activation = getattr(part, "activation", None)
        own = getattr(torch.nn.functional, getattr(activation, "__name__", ""), None) is not activation
        if activation is not None and not isinstance(activation, torch.nn.Module) and own:
            return False
    return True


def _runs_its_class(module: torch.nn.Module) -> bool:
    """Whether a call of `module` runs its class's forward alone, as torch.fx's trace reads it: the trace calls the
    traced model's class's forward, and makes a leaf's call a node, so neither runs the forward hooks (the module's,
    or those of every module: `register_module_forward_pre_hook`) nor a forward set on the module or its class (a
    patched attention, `emb.forward = ...`) that the served call runs."""
    if module._forward_hooks or module._forward_pre_hooks or "forward" in vars(module):
        return False
    torchs = type(module).__module__.startswith("torch.")  # a leaf of the trace is torch's: its forward torch's too
    if torchs and not (getattr(type(module).forward, "__module__", None) or "").startswith("torch."):
        return False
    every = torch.nn.modules.module
    return not (getattr(every, "_global_forward_hooks", None) or getattr(every, "_global_forward_pre_hooks", None))


def _fx_op(node) -> str | None:
    """The name of the op an fx node calls where it is torch's own: a method (of a tensor, the values followed
    being tensors), a function of torch or of torch.Tensor, or operator.getitem; None for any other function
    (a user's, torch.fx.wrap'ped, whatever its name)."""
    if node.op == "call_method":
        return node.target
    if node.target is operator.getitem:
        return "getitem"
    name = getattr(node.target, "__name__", None)
    spaces = (torch, torch.Tensor, torch.nn.functional)  # F.linear, F.scaled_dot_product_attention: torch._C's
    if isinstance(name, str) and any(getattr(ns, name, None) is node.target for ns in spaces):
        return name
    return None


def _fx_call(walk: _Walk, traced: torch.fx.GraphModule, node) -> None:
    """A call_function or call_method node."""
    ins = list(node.all_input_nodes)
    target = node.target
    shown = target if isinstance(target, str) else getattr(target, "__name__", str(target))
    name = _fx_op(node)
    args = node.args
    if target is setattr and len(args) == 3:  # `ids.data = ids + 60` (`_Assigned`): ids changed to the value's
        if args[1] not in _KEEPS_IN_PLACE:
            walk.in_place(args[0], f"an assignment to .{args[1]}", [a for a in ins if a is not args[0]])
            walk.share(args[0], ins)
        return
    if "out" in node.kwargs:
        # Its result is the tensor given, which may be one the trace does not follow the changes of (a constant
        # forward made: `buf.add_(60)` of constants alone is done as it traces, not in its graph), so nothing it
        # writes is taken as ids or a `% n` (`torch.index_select(x, 0, pos, out=ids)` changes the ids).
        table, index = _fx_table_index(traced, node, name)
        if table is not None:  # a lookup all the same: of the ids as they come, a table's rows written into `out`
            walk.lookup(index, _rows_of(table, embedding=False), "index_select of a parameter")
        _fx_unfollowed(walk, node, name, shown, [a for a in ins if a is not index])
        if table is not None:
            shared = [node, *walk.sharing(node.kwargs["out"])]
            walk.table_values(shared, index, "index_select of a parameter", table, _fx_arg(node, 0, "input").target)
    elif target is torch.nn.functional.embedding or target is torch.nn.functional.embedding_bag:
        index = _fx_arg(node, 0, "input")
        table = _fx_arg(node, 1, "weight")
        partial = ""
        if target is torch.nn.functional.embedding_bag:
            # F.embedding_bag's 10th parameter; anything but False (a value computed in forward) may leave ids out.
            last = args[9] if len(args) > 9 else node.kwargs.get("include_last_offset", False)
            partial = "" if last is False else _LAST_OFFSET
        walk.lookup(index, _rows_of(_fx_tensor(traced, table)), f"F.{shown}", partial=partial)
        walk.derive([node], [a for a in ins if a is not index], shown, reads=False)
        held = _fx_tensor(traced, table)
        walk.table_values([node], index, f"F.{shown}", held, table.target if held is not None else "")
    elif (looked := _fx_table_index(traced, node, name))[0] is not None:
        table, index = looked
        walk.lookup(index, _rows_of(table, embedding=False), "index_select of a parameter")
        walk.derive([node], [a for a in ins if a is not index], name, reads=False)
        walk.table_values([node], index, "index_select of a parameter", table, _fx_arg(node, 0, "input").target)
    elif (
        name in _FX_INDEX
        and len(args) == 2
        and _fx_tensor(traced, args[0]) is not None
        and isinstance(args[1], torch.fx.Node)
    ):
        if walk.mask(args[1]):
            walk.derive([node], ins, name, reads=False)
            return
        table = _fx_tensor(traced, args[0])
        walk.lookup(args[1], _rows_of(table, embedding=False), "table[ids] of a parameter", wraps=True)
        walk.table_values([node], args[1], "table[ids] of a parameter", table, args[0].target)
    elif name == "view" and args and (dtype := _fx_view_dtype(node)) is not None:
        walk.reinterpret(node, args[0], dtype, name)
    elif name is not None and name.removesuffix("_") in _FX_KEEPS and args:
        walk.keep(node, args[0], via=name)
        walk.derive([node], ins[1:], name, reads=False)
    elif name in _FX_PARTS and args:
        walk.keep(node, args[0], via=name, part=True)
        walk.derive([node], _shape_read(name, ins[1:]), name, reads=False)
        if name in _FX_INDEX:
            walk.positions([node], _fx_positions(args[1]), name)
        elif name == "index_select":
            walk.positions([node], _fx_positions(_fx_arg(node, 2, "index")), name)
        elif name in ("select", "narrow"):
            walk.positions([], [a for a in ins if a is not args[0]], name)
    elif node.op == "call_method" and name in _FX_CASTS and args:
        want, read = _fx_dtype(node, _FX_CASTS[name])
        walk.keep(node, args[0], want, name, read=read)
    elif target is getattr and len(args) == 2 and args[1] in _FX_SHAPES:
        return  # `ids.shape`: none of its ids
    else:
        _fx_unfollowed(walk, node, name, shown, ins)


def _fx_table_index(traced: torch.fx.GraphModule, node, name: str | None) -> tuple:
    """The table and the index of `index_select(table, 0, ids)` of a parameter or buffer; (None, None) for any other
    call."""
    if name != "index_select" or _fx_arg(node, 1, "dim") != 0:
        return None, None
    table = _fx_tensor(traced, _fx_arg(node, 0, "input"))
    return (None, None) if table is None else (table, _fx_arg(node, 2, "index"))


def _fx_unfollowed(walk: _Walk, node, name: str | None, shown: str, ins: list) -> None:
    """A call_function or call_method node whose result is not followed as ids: derived from its inputs, with what
    it writes."""
    target = node.target
    args = node.args
    into = "out" in node.kwargs
    # A function not torch's nor python's operator (the model's own) is never taken for one of _NO_LOOKUP's.
    known = name is not None or _py_operator(target)
    first = args[0] if args else node.kwargs.get("input")
    rest = _fx_nodes([args[1:], {k: v for k, v in node.kwargs.items() if k != "input" or args}])
    read = _values_read(name, ins, first, rest) if name is not None else ins
    walk.derive([node], read, shown, reads=None if known else True, into=into)
    if known:
        walk.integer_op(node, name or shown, [_fx_integer(walk, a) for a in (*args, *node.kwargs.values())])
        given = [*args, *(v for k, v in node.kwargs.items() if k != "out")]
        tensors = [a for a in given if isinstance(a, torch.fx.Node)]
        others = [a for a in given if not isinstance(a, torch.fx.Node)]
        walk.mask_op(node, name or shown, tensors, others, into=into)
    if name is not None:
        span = functools.partial(_drawn_span, name, node.args, node.kwargs)
        _made(walk, node, name, lambda: _fx_unset_floats(node, name), into=into, span=span)
    if name == "where" and not into and len(args) + len(node.kwargs) == 3:
        # `torch.where(condition, input, other)`; the method's tensor is its input: `x.where(condition, other)`.
        method = node.op == "call_method" or target is torch.Tensor.where
        walk.choose(node, name, [args[0] if method else _fx_arg(node, 1, "input"), _fx_arg(node, 2, "other")])
    # Not with out= (`_fx_call`): `torch.remainder(ids, 100, out=buf); buf.add_(60)` of a `buf` forward made of
    # constants holds ids past 100, and the graph has no add_. TorchScript's remainder with out= is not followed either.
    if (target is operator.mod or name == "remainder") and len(args) == 2 and not into:
        walk.remainder(node, args[1], walk.integer_of(args[0]), name or shown)
    given = node.kwargs.get("out")
    written = [given] if isinstance(given, torch.fx.Node) else [o for o in given or () if isinstance(o, torch.fx.Node)]
    # The result of a function of the model's own, of a tensor's attribute (`ids.data`), of an op not in _FRESH
    # (`ids.cpu()`, `ids += 1`) may be its argument: before the change, which then reaches it
    # (`torch.zeros(s).exponential_(0.1).long()`: what it draws, read from the result).
    if written or not known or _bare(name or shown) not in _FRESH:
        walk.share(node, ins)
    in_place = name is not None and name.endswith("_") and not name.endswith("__")
    if args and (in_place or target is operator.setitem or (_py_operator(target) and shown in _PY_IN_PLACE)):
        walk.in_place(args[0], shown, ins)
    for out in written:  # `torch.sub(ids, 1, out=ids)`: its result is `out`, changed
        walk.in_place(out, _written_by(shown, "out"), ins)


def _fx_unset_floats(node, name: str) -> bool:
    """Whether an op of `_UNSET` or `_DRAWN` called in an fx graph makes floats (`_Script.unset_floats`): its dtype
    given, or torch's default, but for those of `_UNSET_LIKE`, whose tensor's dtype is not known, and of
    `_DRAWN_INTEGERS`."""
    given = node.kwargs.get("dtype")
    if isinstance(given, torch.dtype):
        return _floats(given)
    return given is None and _bare(name) not in _UNSET_LIKE and _bare(name) not in _DRAWN_INTEGERS


def _py_operator(target) -> bool:
    """Whether an fx node's function is python's own: an operator (`ids != 0`, `ids * 2`), getattr (`ids.shape`) or
    one of math's, which torch.fx wraps (`sqrt(ids.size(-1))`)."""
    name = getattr(target, "__name__", "")
    return target is getattr or any(getattr(ns, name, None) is target for ns in (operator, math))


def _fx_integer(walk: _Walk, arg):
    """An fx node's argument as `_Walk.integer_op` takes it: a node's integer dtype, `int` for a python int."""
    if isinstance(arg, torch.fx.Node):
        return walk.integer_of(arg)
    return int if isinstance(arg, int) and not isinstance(arg, bool) else None


def _fx_view_dtype(node) -> torch.dtype | None:
    """The dtype `x.view(dtype)` reads its tensor's memory as; None for a view of a new shape."""
    given = [a for a in (*node.args[1:], *node.kwargs.values()) if isinstance(a, torch.dtype)]
    return given[0] if given else None


def _fx_arg(node, i: int, name: str):
    """An fx node's argument, given by position `i` or as keyword `name` (`torch.index_select(t, 0, index=ids)`)."""
    return node.args[i] if len(node.args) > i else node.kwargs.get(name)


def _fx_positions(index) -> list:
    """The nodes `x[index]` takes positions at: the index itself, or a tuple's tensors (a slice's ends clamp)."""
    if isinstance(index, torch.fx.Node):
        return [index]
    if isinstance(index, (tuple, list)):
        return [i for i in index if isinstance(i, torch.fx.Node)]
    return []


class _NotTraced(Exception):
    """A python module torch.fx cannot trace; its message, what could not be done."""


def _assigns_values(name: str) -> bool:
    """Whether assigning a tensor's attribute `name` may change its values: one torch.Tensor itself sets (`data`,
    `real`, `imag`, or one of a later torch), not autograd's (`requires_grad`, `grad`), python's (`__dict__`, which
    `copy.copy` sets) nor the model's own (`ids.tag = Tag()`), which holds no value of it."""
    if name.startswith("__") or name in _KEEPS_ASSIGNED:
        return False
    return hasattr(type(inspect.getattr_static(torch.Tensor, name, None)), "__set__")


class _Assigned:
    """A proxy of torch.fx's trace that records an assignment to an attribute that may change a tensor's values
    (`ids.data = ids + 60`, `ids.real = ...`: `_assigns_values`) as a node of its graph, `setattr(ids, 'data',
    value)`: torch.fx records none, and the graph went on reading `ids` as the ids the request sent, though forward
    looks up the values assigned (`_fx_call`). Any other assignment is not recorded: the value of one of the model's
    own may be no argument a graph can hold (its trace failed), and a recorded one was taken for a change. The
    assignment is made as well, as torch.fx makes it: a read of the attribute after gets the value assigned."""

    _OWN = frozenset({"tracer", "node", "_node", "root", "attr"})  # Proxy's and Attribute's own

    def __setattr__(self, name: str, value) -> None:
        if name not in self._OWN and _assigns_values(name):
            self.tracer.create_proxy("call_function", setattr, (self, name, value), {})
        object.__setattr__(self, name, value)

    def __getattr__(self, name: str):
        return _AssignedAttribute(self, name)  # `ids.data`: Proxy's Attribute, with its assignments recorded too


class _AssignedProxy(_Assigned, torch.fx.Proxy):
    pass


class _AssignedAttribute(_Assigned, torch.fx.proxy.Attribute):
    pass


# The key of a get_attr node's meta that says what the constant it reads holds where it is not the same at each call:
# (the op that made it, low, high: `_TraceMade.of`; whether it holds floats).
_MADE_AT_TRACE = "wok.made_at_trace"  # a node.meta key (a "wok_" name reads as a metric to the docs check)
# What a tensor the trace saw made holds where it is not the same at each call, by the op that made it (`_TraceMade`).
_NOT_SEEN = ""


class _TraceMade(TorchFunctionMode):
    """What a python forward does to tensors, not proxies, torch.fx's trace does once, as it traces, and makes the
    result a constant of the graph (`torch.empty(2, 5, dtype=torch.long)`, `torch.randint(0, 20, (2, 5))`,
    `torch.arange(5)`): served, forward makes it again at each call, and what `empty` leaves or `randint` draws is
    not what the trace held. So each tensor made as the trace runs is recorded, by its memory: the same values at
    each call (None) where a torch function made it of values that are (the module's tensors, python numbers); else
    the op of `_UNSET` or `_DRAWN` whose values it holds (`p = torch.zeros(2, 5, dtype=torch.long); p.random_(0, 20)`
    too), with what it draws in (`_drawn_span`); `_NOT_SEEN` where its memory was made by no call seen here
    (`torch.LongTensor(2, 5)`, a legacy constructor, and `torch.from_numpy`: no torch function; a tensor held in a
    global list, the safe side). The trace's constants are read from it (`_OwnThreadTracer.create_arg`). A mode is
    the calling thread's alone: another thread's calls are not seen, nor changed."""

    def __init__(self, root: torch.nn.Module) -> None:
        super().__init__()
        self.made: dict[int, tuple | None] = {}
        self.kept: list[torch.Tensor] = []  # held while the trace runs: no memory recorded is freed and made again
        for module in root.modules():
            if isinstance(module, torch.jit.ScriptModule):  # a leaf of the trace, walked as TorchScript
                continue
            # A global of its forward's module (`POSITIONS = torch.arange(5)`) was made before the trace, as its
            # attributes were: the same at each call, but for what forward changes (recorded as it does).
            named = getattr(getattr(type(module), "forward", None), "__globals__", {}).values()
            for held in (*module._parameters.values(), *module._buffers.values(), *vars(module).values(), *named):
                if isinstance(held, torch.Tensor):
                    self._record(held, None)

    @staticmethod
    def _memory(t: torch.Tensor) -> int:
        try:
            return t.untyped_storage()._cdata
        except (RuntimeError, NotImplementedError):  # a tensor with no storage of its own (sparse, nested)
            return id(t)

    def _record(self, t: torch.Tensor, made: tuple | None) -> None:
        self.kept.append(t)
        self.made[self._memory(t)] = made

    def of(self, t: torch.Tensor) -> tuple | None:
        """What a tensor holds: None, the same values at each call; else (op, low, high) of what made it."""
        return self.made.get(self._memory(t), (_NOT_SEEN, None, None))

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        given = torch.utils._pytree.tree_leaves((args, kwargs))
        if any(isinstance(a, torch.fx.Proxy) for a in given):
            return result  # the graph's: followed in it
        name = getattr(func, "__name__", "")
        if _bare(name) in _UNSET or _bare(name) in _DRAWN:
            made = (name, *_drawn_span(name, args, kwargs))
        else:  # made of what is not the same at each call, past the op that drew it: in no range known
            made = next(((m[0], None, None) for a in given if isinstance(a, torch.Tensor) and (m := self.of(a))), None)
        outs = [t for t in torch.utils._pytree.tree_leaves(result) if isinstance(t, torch.Tensor)]
        changed = _is_in_place(name) or name == "__setitem__" or "out" in kwargs
        if changed and args and isinstance(args[0], torch.Tensor) and "out" not in kwargs:
            outs.append(args[0])
        outs += [t for t in torch.utils._pytree.tree_leaves(kwargs.get("out")) if isinstance(t, torch.Tensor)]
        for t in outs:
            # Changed in place by values the same at each call, a tensor holds what it held: `p.fill_(3)` of `p =
            # torch.empty(...)` is still taken as unset, as the graph forms take it.
            self._record(t, made if made is not None or not changed else self.of(t))
        return result


class _OwnThreadTracer(torch.fx.Tracer):
    """torch.fx's Tracer, for its own thread alone. Its trace replaces nn.Module.__call__ and __getattr__ for the
    whole process while it runs, so another thread's module call (another model's batch, a TorchScript one too) went
    to this trace and failed ("module is not installed as a submodule"): here such a call, or attribute read, runs
    as if nothing were patched. Two things of the trace still reach every thread while it runs: the functions it
    wraps (math's, those of torch.fx.wrap) answer as before for values that are not its proxies, and
    torch.fx's is_fx_tracing() is True (torch.nested.nested_tensor_from_jagged refuses; a torch.compile'd function
    runs uncompiled). A TorchScript submodule is a leaf: torch.fx cannot trace into it; `_fx_module_call` walks it.
    Two traces at once in two threads are not kept apart: the second runs under the first's patched __call__, which
    takes it for another thread's, and its model is left unchecked; wok loads its models one after another."""

    def __init__(self) -> None:
        self._thread = threading.get_ident()
        self._wrapped: set[int] = set()  # the globals `_wrap_globals` has been through
        super().__init__()

    # Read by the patched nn.Module.__call__ of whatever thread calls a module: another thread's call must wrap no
    # function of its module's globals (with this trace's patcher, which may be gone by then, left wrapped).
    @property
    def _autowrap_function_ids(self) -> set[int]:
        return self._own_autowrap_ids if threading.get_ident() == self._thread else set()

    @_autowrap_function_ids.setter
    def _autowrap_function_ids(self, ids: set[int]) -> None:
        self._own_autowrap_ids = ids

    def call_module(self, m, forward, args, kwargs):
        if threading.get_ident() != self._thread:
            return forward(*args, **kwargs)
        self._wrap_globals(m)
        return super().call_module(m, forward, args, kwargs)

    def _wrap_globals(self, m: torch.nn.Module) -> None:
        """Wrap the functions of `m`'s code's globals that the trace wraps (math's): another thread's call of a
        module of the same file, wrapping none of them (above), has marked those globals visited for the trace,
        which then wrapped none either, and `sqrt(ids.size(-1))` of a `from math import sqrt` failed the trace
        (TypeError: a proxy is no number), the model's inputs left unchecked."""
        patcher = torch.fx._symbolic_trace.CURRENT_PATCHER
        frame = getattr(getattr(m, "forward", m), "__globals__", None)
        if patcher is None or not isinstance(frame, dict) or id(frame) in self._wrapped:
            return
        self._wrapped.add(id(frame))
        for name, value in list(frame.items()):
            if not name.startswith("_") and callable(value) and id(value) in self._own_autowrap_ids:
                patcher.patch(frame, name, torch.fx._symbolic_trace._create_wrapped_func(value))

    def getattr(self, attr, attr_val, parameter_proxy_cache):
        if threading.get_ident() != self._thread:
            return attr_val
        return super().getattr(attr, attr_val, parameter_proxy_cache)

    def proxy(self, node: torch.fx.Node) -> torch.fx.Proxy:
        return _AssignedProxy(node, self)

    def trace(self, root, concrete_args=None):
        self._made = _TraceMade(root) if isinstance(root, torch.nn.Module) else None
        with self._made or contextlib.nullcontext():
            return super().trace(root, concrete_args)

    def create_arg(self, a):
        """As torch.fx's, with what a tensor forward made as it was traced (a constant of the graph) holds where it
        is not the same at each call (`_TraceMade`) kept in the meta of the node that reads it."""
        arg = super().create_arg(a)
        made = getattr(self, "_made", None)
        if made is not None and isinstance(a, torch.Tensor) and not isinstance(a, torch.nn.Parameter):
            held = made.of(a)
            if held is not None and isinstance(arg, torch.fx.Node) and arg.op == "get_attr":
                arg.meta[_MADE_AT_TRACE] = (*held, _floats(a.dtype))
        return arg

    def is_leaf_module(self, m: torch.nn.Module, module_qualified_name: str) -> bool:
        return isinstance(m, torch.jit.ScriptModule) or super().is_leaf_module(m, module_qualified_name)


def _traced_copy(module: torch.nn.Module, served: int | None = None) -> torch.fx.GraphModule:
    """torch.fx's trace of a copy of `module`, whose forward is given its first `served` parameters (None: all) by
    position and the rest their defaults, as Servable calls it (`_served_defaults`); _NotTraced where it cannot be
    made. The copy shares the module's
    parameters and TorchScript submodules (the trace writes to neither: it reads a parameter as a proxy, and calls
    no TorchScript) and holds each buffer as a meta tensor of its shape and dtype (one with no meta form, a quantized
    one, a copy): a table's rows are read from its shape, and a buffer of a GB is not copied at load. What forward
    writes to a buffer outside the graph (`+= 1`) goes to the meta copy; a forward that reads a buffer's values at
    trace (`.item()`) cannot be traced."""
    if not _runs_its_class(module):
        raise _NotTraced("be traced as served (its call runs forward hooks or a forward set on it, not its class's)")
    memo: dict[int, object] = {id(p): p for p in module.parameters()}
    memo.update((id(m), m) for m in module.modules() if isinstance(m, torch.jit.ScriptModule) and m is not module)
    for b in module.buffers():
        try:
            memo[id(b)] = torch.empty_like(b, device="meta")
        except (NotImplementedError, RuntimeError):
            pass  # no meta form (a quantized buffer): deepcopy below copies it, its memory held twice while tracing
    try:
        copied = copy.deepcopy(module, memo)
    except Exception as exc:  # a lock, a handle: whatever deepcopy refuses
        raise _NotTraced(f"be copied to be traced ({type(exc).__name__})") from exc
    # Servable serves it in eval mode, after this: traced in the training mode a factory's module comes in, the
    # way of an `if self.training` was read, and an id the served way takes (clamped, hashed) refused.
    copied.eval()
    try:
        graph = _OwnThreadTracer().trace(copied, _served_defaults(copied.forward, served))
        return torch.fx.GraphModule(copied, graph, copied.__class__.__name__)
    except Exception as exc:  # a branch on its inputs' values, an op torch.fx cannot take: whatever it raises
        raise _NotTraced(f"be traced by torch.fx ({type(exc).__name__})") from exc


def _served_defaults(forward, served: int | None) -> dict | None:
    """The parameters of `forward` after its first `served`, which the server gives none (Servable calls it with its
    inputs by position), each with the default it takes, where that is None, a bool, a number or a string: the trace
    takes the way served of `if inputs_embeds is None:` (HF's), where a proxy in its place, which is not None, took
    the other, and its tables stood for the served way's. None where there are none (or `*args`, `**kwargs`)."""
    try:
        params = list(inspect.signature(forward).parameters.values())
    except (TypeError, ValueError):
        return None
    if served is None or any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
        return None
    plain = (type(None), bool, int, float, str)
    given = {p.name: p.default for p in params[served:] if p.default is not p.empty and type(p.default) in plain}
    return given or None


def _fx_tensor(traced: torch.fx.GraphModule, node) -> torch.Tensor | None:
    """The parameter or buffer (a meta tensor: `_traced_copy`) an fx node reads (get_attr), else None."""
    if getattr(node, "op", None) != "get_attr":
        return None
    try:
        held = traced.get_parameter(node.target)
    except AttributeError:
        try:
            held = traced.get_buffer(node.target)
        except AttributeError:
            return None
    return held


def _fx_dtype(node, fixed: torch.dtype | None) -> tuple[torch.dtype | None, bool]:
    """The dtype an fx cast method casts to (`fixed` for long, bool...), None for a move (to a device, or another
    tensor's device: `x.to(ids.device)`), float32 where not read; and whether it was read."""
    if fixed is not None:
        return fixed, True
    given = [a for a in (*node.args[1:], *node.kwargs.values()) if isinstance(a, torch.dtype)]
    others = [
        a
        for a in (*node.args[1:], *node.kwargs.values())
        if isinstance(a, torch.fx.Node) and not (a.target is getattr and a.args[1:] == ("device",))
    ]
    if others:
        return torch.float32, False  # another tensor's dtype, or one computed
    return (given[0] if given else None), True
