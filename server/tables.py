"""The embedding tables a model looks ids up in, read from its module or graph at load.

`table_rows` sizes the tables one module holds itself (`wok profile`'s default --int-high). `id_ranges` follows
each integer input of a model through its graph (a TorchScript module's, a torch.export program's, a python
module's as torch.fx traces it) to the tables it reaches unchanged: through ops that keep every value (reshape,
view, flatten, a cast that loses none) into the ids of an nn.Embedding, nn.EmbeddingBag, F.embedding or
index_select on dim 0 of a parameter. Such an input's ids must lie in [0, rows) of its smallest table, which
decode_request holds each request to, so that a client's bad id is refused alone (INVALID_ARGUMENT) before it is
batched, not failed in its batch (on a GPU, a device-side assert that takes the device). Where an input reaches a
table any other way (arithmetic on it, a slice, a branch), nothing is guessed: it is not checked, and `unclear`
says why.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch

# The aten ops that gather rows of their first argument, a table, as a torch.export graph calls them.
EMBEDDING_SCHEMAS = frozenset({"aten::embedding", "aten::embedding_bag", "aten::_embedding_bag"})
_INDEX_SELECT = "aten::index_select"
# Ops whose result holds the values of their first argument and no others (a new shape, a copy): ids through
# them are still ids. A cast is among them only where it loses no value (_keeps_values).
_KEEPS = frozenset(
    {
        "aten::reshape",
        "aten::view",
        "aten::_unsafe_view",
        "aten::flatten",
        "aten::contiguous",
        "aten::clone",
        "aten::detach",
        "aten::alias",
        "aten::squeeze",
        "aten::unsqueeze",
    }
)
_CASTS = frozenset({"aten::to", "aten::_to_copy", "aten::long"})
# TorchScript's ScalarType codes of the integer dtypes (c10/core/ScalarType.h), the ones a cast of ids may name.
_SCALAR_TYPES = {0: torch.uint8, 1: torch.int8, 2: torch.int16, 3: torch.int32, 4: torch.int64}
# The same ops as torch.fx sees a python module call them (methods of a tensor, or functions of torch).
_FX_KEEPS = frozenset({"reshape", "view", "flatten", "contiguous", "clone", "detach", "squeeze", "unsqueeze"})
_FX_CASTS = {"long": torch.int64, "int": torch.int32, "to": None}
# The most levels of submodules followed in a TorchScript module's graph.
_DEPTH = 8


def table_rows(module: torch.nn.Module) -> list[int]:
    """The row counts of the tables `module` itself looks ids up in: an nn.Embedding or nn.EmbeddingBag keeps
    its class only in an nn.Module; TorchScript keeps the name (`original_name`) and torch.export only the op."""
    if isinstance(module, (torch.nn.Embedding, torch.nn.EmbeddingBag)):
        return [module.num_embeddings]
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


@dataclass
class IdRanges:
    """What `id_ranges` found: by input, the rows of the smallest table its ids reach unchanged (its ids must be
    in [0, rows)), and by input not checked, why: the first way found it reaches a table that is not understood."""

    rows: dict[str, int] = field(default_factory=dict)
    unclear: dict[str, str] = field(default_factory=dict)

    def said(self) -> str:
        """The start-up's words for it: "input 'ids' in [0, 1000); input 'b' not checked: ..."."""
        parts = [f"input '{n}' in [0, {r})" for n, r in self.rows.items()]
        parts += [f"input '{n}' not checked: {why}" for n, why in self.unclear.items() if n not in self.rows]
        return "; ".join(parts)


class _Walk:
    """The values of one graph that hold an input's ids unchanged (`ids`: value → (input, dtype)), and those
    derived from an input otherwise (`mixed`: value → {input: the op that changed it}), and what reached a table."""

    def __init__(self) -> None:
        self.ids: dict = {}
        self.mixed: dict = {}
        self.found = IdRanges()

    def inputs_of(self, value) -> dict[str, str]:
        """The inputs `value` is derived from, each with how ('' where it holds the ids unchanged)."""
        if value in self.ids:
            return {self.ids[value][0]: ""}
        return self.mixed.get(value, {})

    def derive(self, outs, ins, via: str, restate: bool = False) -> None:
        """`outs`, made by op `via` from `ins`: derived from each input any of `ins` is, not as ids (`restate`:
        said to be through `via`, not what made `ins`)."""
        merged: dict[str, str] = {}
        for v in ins:
            for name, how in self.inputs_of(v).items():
                merged.setdefault(name, via if restate else how or via)
        if merged:
            for o in outs:
                self.mixed[o] = merged

    def keep(self, out, src, want: torch.dtype | None = None, via: str = "") -> None:
        """`out` holds `src`'s values: ids stay ids, where a cast to `want` loses none of them."""
        if src in self.ids and _keeps_values(self.ids[src][1], want):
            self.ids[out] = (self.ids[src][0], want or self.ids[src][1])
        else:
            self.derive([out], [src], via)

    def lookup(self, index, rows: int | None, what: str, conditional: str = "") -> None:
        """Ids `index` looked up in a table of `rows` rows (None: not known) by op `what`."""
        for name, how in self.inputs_of(index).items():
            if how:
                self.found.unclear.setdefault(name, f"it reaches {what} through {how}, which wok does not follow")
            elif conditional:
                self.found.unclear.setdefault(name, f"it reaches {what} under a condition ({conditional})")
            elif rows is None:
                self.found.unclear.setdefault(name, f"it reaches {what}, whose table's rows cannot be read")
            else:
                self.found.rows[name] = min(rows, self.found.rows.get(name, rows))


def id_ranges(model, order: list[str], dtypes: dict[str, torch.dtype]) -> IdRanges:
    """The embedding tables each integer input of `model` reaches (module docstring). `model`: a torch.export
    program, a TorchScript module or a python nn.Module; `order`: the config's input names in the order the model
    takes them (its forward's, or its program's); `dtypes`: by integer input, its torch dtype (others are left
    out). Nothing of the model runs, but a python module's forward, traced by torch.fx on a copy."""
    walk = _Walk()
    if isinstance(model, torch.export.ExportedProgram):
        _walk_program(walk, model, order, dtypes)
    elif isinstance(model, torch.jit.ScriptModule):
        graph = model.graph
        for name, value in zip(order, list(graph.inputs())[1:]):
            if name in dtypes:
                walk.ids[value] = (name, dtypes[name])
        _walk_script(walk, model, graph.nodes(), {next(iter(graph.inputs())): model}, "", 0)
    else:
        _walk_python(walk, model, order, dtypes)
    return walk.found


# -- torch.export ------------------------------------------------------------------------------------------------
def _walk_program(walk: _Walk, program, order: list[str], dtypes: dict[str, torch.dtype]) -> None:
    from torch.export.graph_signature import InputKind

    kinds = {s.arg.name: s.kind for s in program.graph_signature.input_specs if hasattr(s.arg, "name")}
    user = [s.arg.name for s in program.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
    names = dict(zip(user, order))
    tables = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)
    for node in program.graph.nodes:
        if node.op == "placeholder":
            name = names.get(node.name)
            if name in dtypes:
                walk.ids[node] = (name, dtypes[name])
            continue
        if node.op != "call_function":
            continue
        op = _schema_name(node.target) or getattr(node.target, "__name__", str(node.target))
        ins = [a for a in node.all_input_nodes]
        if op in EMBEDDING_SCHEMAS and len(node.args) > 1:
            walk.lookup(node.args[1], _looked_up_rows(node), op)
            walk.derive([node], [a for a in ins if a is not node.args[1]], op)
        elif op == _INDEX_SELECT and len(node.args) == 3:
            table, dim, index = node.args
            val = getattr(table, "meta", {}).get("val")
            sized = kinds.get(getattr(table, "name", None)) in tables and isinstance(val, torch.Tensor)
            if dim == 0 and sized:
                walk.lookup(index, val.shape[0], f"{op} of a parameter")
                ins = [a for a in ins if a is not index]
            walk.derive([node], ins, op)
        elif op in _KEEPS and node.args:
            walk.keep(node, node.args[0], via=op)
            walk.derive([node], ins[1:], op)
        elif op in _CASTS and node.args:
            val = node.meta.get("val")
            walk.keep(node, node.args[0], val.dtype if isinstance(val, torch.Tensor) else torch.float32, op)
        else:
            walk.derive([node], ins, op)


# -- TorchScript -------------------------------------------------------------------------------------------------
def _script_object(value, objects: dict):
    """The module or tensor a TorchScript value is: an attribute read (prim::GetAttr) off a module known in
    `objects`, or a constant tensor (a frozen module's weights); else None."""
    if value in objects:
        return objects[value]
    node = value.node()
    if node.kind() == "prim::GetAttr":
        owner = _script_object(node.inputsAt(0), objects)
        return getattr(owner, node.s("name"), None) if owner is not None else None
    if node.kind() == "prim::Constant" and isinstance(value.type(), torch._C.TensorType):
        try:
            held = value.toIValue()
        except RuntimeError:
            return None
        return held if isinstance(held, torch.Tensor) else None
    return None


def _rows_of(table) -> int | None:
    return table.shape[0] if isinstance(table, torch.Tensor) and table.dim() == 2 else None


def _walk_script(walk: _Walk, module, nodes, objects: dict, conditional: str, depth: int) -> None:
    for node in nodes:
        kind = node.kind()
        ins = list(node.inputs())
        outs = list(node.outputs())
        blocks = list(node.blocks())
        if blocks:
            # A branch or loop: what it looks up runs only on some requests, and what it returns is not followed.
            for block in blocks:
                _walk_script(walk, module, block.nodes(), objects, conditional or kind, depth)
            inner = [v for block in blocks for n in block.nodes() for v in [*n.inputs(), *n.outputs()]]
            walk.derive(outs, ins + inner, kind, restate=True)
        elif kind in EMBEDDING_SCHEMAS:
            walk.lookup(ins[1], _rows_of(_script_object(ins[0], objects)), kind, conditional)
        elif kind == _INDEX_SELECT:
            dim = ins[1].toIValue() if ins[1].node().kind() == "prim::Constant" else None
            table = _script_object(ins[0], objects)
            if dim == 0 and isinstance(table, torch.Tensor):
                walk.lookup(ins[2], table.shape[0], f"{kind} of a parameter", conditional)
            walk.derive(outs, ins, kind)
        elif kind in _KEEPS:
            walk.keep(outs[0], ins[0], via=kind)
        elif kind in _CASTS:
            walk.keep(outs[0], ins[0], _script_dtype(node), kind)
        elif kind == "prim::CallMethod":
            _script_call(walk, node, objects, conditional, depth)
        elif kind == "prim::CallFunction":
            called = str(ins[0].type())
            if called.endswith("torch.nn.functional.embedding") or called.endswith("functional.embedding_bag"):
                what = called.rpartition(".")[2]
                walk.lookup(ins[1], _rows_of(_script_object(ins[2], objects)), f"F.{what}", conditional)
            walk.derive(outs, ins[1:], called.rpartition(".")[2])
        else:
            walk.derive(outs, ins, kind)


def _script_dtype(node) -> torch.dtype | None:
    """The dtype a TorchScript cast casts to: None where it names none (a move to a device); float32 where it
    cannot be read (a value, or another tensor's dtype), which no id keeps."""
    if node.kind() == "aten::long":
        return torch.int64
    try:
        value = node.namedInput("dtype")
    except RuntimeError:  # to(other): another tensor's dtype
        return torch.float32
    if value.node().kind() != "prim::Constant":
        return torch.float32
    code = value.toIValue()
    return None if code is None else _SCALAR_TYPES.get(code, torch.float32)


def _script_call(walk: _Walk, node, objects: dict, conditional: str, depth: int) -> None:
    """A submodule's method called: an embedding's forward is a lookup; another module's method is followed into
    its graph, its arguments its parameters (to _DEPTH levels); what it returns is derived from all of them."""
    ins = list(node.inputs())
    outs = list(node.outputs())
    sub = _script_object(ins[0], objects)
    method = node.s("name")
    if isinstance(sub, torch.jit.ScriptModule) and method == "forward" and _script_table(sub) is not None:
        walk.lookup(ins[1], _script_table(sub), f"the {sub.original_name} module", conditional)
        walk.derive(outs, ins[2:], sub.original_name)
        return
    graph = getattr(getattr(sub, method, None), "graph", None)
    if graph is not None and depth < _DEPTH:
        params = list(graph.inputs())
        for arg, param in zip(ins[1:], params[1:]):
            if arg in walk.ids:
                walk.ids[param] = walk.ids[arg]
            elif arg in walk.mixed:
                walk.mixed[param] = walk.mixed[arg]
        _walk_script(walk, sub, graph.nodes(), {params[0]: sub}, conditional, depth + 1)
    walk.derive(outs, ins[1:], f"{getattr(sub, 'original_name', 'a module')}.{method}")


# -- python nn.Module (torch.fx) ---------------------------------------------------------------------------------
def _walk_python(walk: _Walk, module: torch.nn.Module, order: list[str], dtypes: dict[str, torch.dtype]) -> None:
    """A python module's forward as torch.fx traces it, on a copy (the trace runs forward on proxies: what it
    writes to its module goes to the copy). Where it cannot be traced (a branch on an input's values, a module
    that cannot be copied), its inputs are not checked; said where it holds an nn.Embedding or nn.EmbeddingBag."""
    try:
        traced = _traced_copy(module)
    except _NotTraced as exc:
        if any(table_rows(m) for m in module.modules()):
            for name in dtypes:
                walk.found.unclear[name] = f"its module cannot {exc}, so what reaches its tables is not known"
        return
    placeholders = [n for n in traced.graph.nodes if n.op == "placeholder"]
    for name, node in zip(order, placeholders):
        if name in dtypes:
            walk.ids[node] = (name, dtypes[name])
    for node in traced.graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        ins = list(node.all_input_nodes)
        target = node.target
        if node.op == "call_module":
            sub = traced.get_submodule(target)
            rows = table_rows(sub) if isinstance(sub, (torch.nn.Embedding, torch.nn.EmbeddingBag)) else []
            if rows and node.args:
                walk.lookup(node.args[0], rows[0], f"the {type(sub).__name__} module")
                walk.derive([node], ins[1:], type(sub).__name__)
            else:
                walk.derive([node], ins, type(sub).__name__)
            continue
        if node.op == "get_attr":
            continue
        name = target if isinstance(target, str) else getattr(target, "__name__", str(target))
        if name in ("embedding", "embedding_bag") and getattr(target, "__module__", "") == "torch.nn.functional":
            index = node.args[0] if node.args else node.kwargs.get("input")
            table = node.args[1] if len(node.args) > 1 else node.kwargs.get("weight")
            walk.lookup(index, _rows_of(_fx_tensor(traced, table)), f"F.{name}")
            walk.derive([node], [a for a in ins if a is not index], name)
        elif name == "index_select" and len(node.args) == 3 and node.args[1] == 0:
            table = _fx_tensor(traced, node.args[0])
            if isinstance(table, torch.Tensor):
                walk.lookup(node.args[2], table.shape[0], "index_select of a parameter")
            walk.derive([node], ins, name)
        elif name in _FX_KEEPS and node.args:
            walk.keep(node, node.args[0], via=name)
        elif node.op == "call_method" and name in _FX_CASTS and node.args:
            walk.keep(node, node.args[0], _fx_dtype(node, _FX_CASTS[name]), name)
        else:
            walk.derive([node], ins, name)


class _NotTraced(Exception):
    """A python module torch.fx cannot trace; its message, what could not be done."""


def _traced_copy(module: torch.nn.Module) -> torch.fx.GraphModule:
    """torch.fx's trace of a copy of `module` sharing its parameters; _NotTraced where it cannot be made."""
    try:
        copied = copy.deepcopy(module, {id(p): p for p in module.parameters()})
    except Exception as exc:  # a lock, a handle: whatever deepcopy refuses
        raise _NotTraced(f"be copied to be traced ({type(exc).__name__})") from exc
    try:
        return torch.fx.symbolic_trace(copied)
    except Exception as exc:  # a branch on its inputs' values, an op torch.fx cannot take: whatever it raises
        raise _NotTraced(f"be traced by torch.fx ({type(exc).__name__})") from exc


def _fx_tensor(traced: torch.fx.GraphModule, node) -> torch.Tensor | None:
    """The parameter or buffer an fx node reads (get_attr), else None."""
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


def _fx_dtype(node, fixed: torch.dtype | None) -> torch.dtype | None:
    """The dtype an fx cast method casts to (`fixed` for long/int), None for a move, float32 where not read."""
    if fixed is not None:
        return fixed
    given = [a for a in (*node.args[1:], *node.kwargs.values()) if isinstance(a, torch.dtype)]
    others = [a for a in (*node.args[1:], *node.kwargs.values()) if isinstance(a, torch.fx.Node)]
    if others:
        return torch.float32  # another tensor's dtype, or one computed
    return given[0] if given else None
