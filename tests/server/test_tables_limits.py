"""The embedding-table finder's limits (server/tables.py): what it follows, what it says it does not, and what its
trace of a python model leaves alone (other threads' modules, the module's buffers)."""

from __future__ import annotations

import importlib.util
import threading

import pytest
import torch
import torch.fx
import torch.nn.functional as F
from torch import nn

from wok.tables import _traced_copy, id_ranges

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.:DeprecationWarning")

I64 = {"ids": torch.int64}


def t(ids: torch.Tensor) -> torch.Tensor:
    # A user's function named as a view op, kept whole in the trace (torch.fx.wrap): it changes the ids.
    return ids + 1


def clone(ids: torch.Tensor) -> torch.Tensor:
    return ids * 2


torch.fx.wrap("t")
torch.fx.wrap("clone")


class Keyword(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.bag = nn.EmbeddingBag(7, 4)

    def forward(self, ids, other):
        return self.emb(input=ids).sum(1) + self.bag(input=other)


def test_ids_given_to_a_table_module_by_keyword_are_followed():
    """`self.emb(input=ids)`: the call_module node holds the ids in its kwargs, which were not read: the input was
    neither checked nor named in the start-up line."""
    found = id_ranges(Keyword().eval(), ["ids", "other"], {"ids": torch.int64, "other": torch.int64})
    assert found.rows == {"ids": 10, "other": 7}
    assert found.unclear == {}


class WrappedT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 4)

    def forward(self, ids):
        return self.emb(t(ids)).sum(1)


class WrappedClone(WrappedT):
    def forward(self, ids):
        return self.emb(clone(ids)).sum(1)


class Own(WrappedT):
    def forward(self, ids):
        return self.emb(torch.clone(ids).t()).sum(0)


@pytest.mark.parametrize(("module", "name"), [(WrappedT, "t"), (WrappedClone, "clone")])
def test_a_wrapped_function_named_as_a_view_op_is_not_taken_to_keep_the_ids(module, name):
    """A torch.fx.wrap'ped function of the user's named `t` or `clone` was taken, by its name, for Tensor.t or
    torch.clone, and the ids it changes (+1, *2) were checked against the table: ids the model answers refused."""
    found = id_ranges(module().eval(), ["ids"], I64)
    assert found.rows == {} and found.bounds == {}
    assert found.unclear == {"ids": f"it reaches the Embedding module through {name}, which wok does not follow"}
    # torch's own `t` and `clone` still keep them.
    assert id_ranges(Own().eval(), ["ids"], I64).rows == {"ids": 10}


class LastOffset(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.bag = nn.EmbeddingBag(10, 4, include_last_offset=True)
        self.w = nn.Parameter(torch.randn(10, 4))

    def forward(self, ids, offsets, more):
        return self.bag(ids, offsets) + F.embedding_bag(more, self.w, offsets, include_last_offset=True)


def test_an_embedding_bag_that_reads_no_id_after_its_last_offset_bounds_its_ids_but_refuses_none():
    """include_last_offset=True: the ids after the last offset are not looked up, and the model answers a request
    holding one past its table; the finder took every id to reach the table, so the server refused it. Now such
    an input bounds `wok profile`'s ids alone, and the start-up says why it is not checked."""
    module = LastOffset().eval()
    ids, offsets = torch.tensor([1, 2, 50]), torch.tensor([0, 2])
    assert module(ids, offsets, ids).shape == (1, 4)  # the model answers it
    order, dtypes = ["ids", "offsets", "more"], {"ids": torch.int64, "offsets": torch.int64, "more": torch.int64}
    models = {
        "python": module,
        "scripted": torch.jit.script(module),
        "exported": torch.export.export(module, (ids.clamp(max=9), offsets, ids.clamp(max=9))),
    }
    for kind, model in models.items():
        found = id_ranges(model, order, dtypes)
        assert found.rows == {}, kind
        assert found.bounds == {"ids": 10, "more": 10}, kind
        assert set(found.unclear) == {"ids", "more"}, kind
        assert all(
            why.endswith("which reads no id after its last offset (include_last_offset)")
            for why in found.unclear.values()
        ), kind
    # Without it every id is read: still checked.
    plain = nn.EmbeddingBag(10, 4).eval()
    assert id_ranges(torch.jit.script(plain), ["ids", "offsets"], dtypes).rows == {"ids": 10}


class Scripted(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(10, 4))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids.view(-1), self.w)


def test_a_scripted_submodule_of_a_python_model_is_walked_as_torchscript():
    """torch.fx cannot trace into a TorchScript submodule: the trace failed, and the tables only its graph holds
    (F.embedding of a parameter) were not found, for the server nor for `wok profile`'s bound."""

    class Holds(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = torch.jit.script(Scripted())
            self.emb = nn.Embedding(100, 4)

        def forward(self, ids, other, far):
            return self.inner(ids).sum(0) + self.inner(ids=other.flatten()).sum(0) + self.inner(far + 1).sum(0)

    module = Holds().eval()
    found = id_ranges(module, ["ids", "other", "far"], {n: torch.int64 for n in ("ids", "other", "far")})
    assert found.rows == {"ids": 10, "other": 10}
    assert found.bounds == {"ids": 10, "other": 10}
    assert found.unclear == {"far": "it reaches aten::embedding through add, which wok does not follow"}
    # Shared, not copied: the trace never calls it.
    assert _traced_copy(module).get_submodule("inner") is module.inner


class Waits(nn.Module):
    """Its forward, traced at load, waits there until another thread has run its modules."""

    # Class attributes: the trace's copy of the module shares them.
    tracing = threading.Event()
    served = threading.Event()

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 4)

    def forward(self, ids):
        Waits.tracing.set()
        if not Waits.served.wait(30):
            raise TimeoutError("the other thread's modules did not run in 30 s")
        return self.emb(ids).sum(1)


def test_another_threads_modules_run_as_ever_while_a_python_model_is_traced():
    """torch.fx's trace patches nn.Module.__call__ for the whole process while it runs: another model's batch in
    that time, python or TorchScript, failed in the trace's hands (NameError: module is not installed as a
    submodule). Now a call from any other thread runs as it does unpatched, and the trace finds what it did."""
    Waits.tracing.clear()
    Waits.served.clear()
    found = {}
    tracer = threading.Thread(target=lambda: found.update(ranges=id_ranges(Waits().eval(), ["ids"], I64)))
    tracer.start()
    try:
        assert Waits.tracing.wait(30)
        other = nn.Sequential(nn.Embedding(10, 4), nn.Flatten()).eval()
        scripted = torch.jit.script(Scripted())
        ids = torch.tensor([[1, 2], [3, 4]])
        with torch.no_grad():
            got = other(ids)
            got_scripted = scripted(ids)
            torch.testing.assert_close(got, other[0].weight[ids].flatten(1))
            torch.testing.assert_close(got_scripted, scripted.w[ids.view(-1)])
    finally:
        Waits.served.set()
        tracer.join(30)
    assert found["ranges"].rows == {"ids": 10}


class Buffered(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("table", torch.arange(40, dtype=torch.float32).reshape(10, 4))
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))
        self.emb = nn.Embedding(7, 4)

    def forward(self, ids, other):
        self.calls += 1  # no proxy in it: run at trace, on the copy's buffer
        return self.table[ids].sum(1) + self.emb(other).sum(1)


def test_the_trace_copies_no_buffer_and_shares_the_parameters():
    """The traced copy deep-copied every buffer: a table held as a buffer doubled its memory at load. Now each
    buffer is a meta tensor of its shape there (a table's rows are read from its shape), each parameter the
    module's own; what forward writes to a buffer still goes to the copy."""
    module = Buffered().eval()
    traced = _traced_copy(module)
    assert traced.get_buffer("table").is_meta and traced.get_buffer("table").shape == (10, 4)
    assert traced.get_parameter("emb.weight") is module.emb.weight
    assert int(module.calls) == 0
    found = id_ranges(module, ["ids", "other"], {"ids": torch.int64, "other": torch.int64})
    assert (found.rows, found.least) == ({"ids": 10, "other": 7}, {"ids": -10, "other": 0})
    assert int(module.calls) == 0


class QuantizedBuffer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("scales", torch.quantize_per_tensor(torch.rand(3), 0.1, 0, torch.quint8))
        self.emb = nn.Embedding(10, 4)

    def forward(self, ids):
        # Not proxied (torch.fx proxies parameters alone): run at trace, on the copy's buffer, which must hold values.
        return self.emb(ids).sum(1) * self.scales.dequantize().sum()


def test_a_buffer_with_no_meta_form_is_deep_copied_for_the_trace():
    """A quantized buffer has no meta tensor: empty_like(device="meta") raised NotImplementedError outside the
    trace's own try, the whole finder failed and the model's inputs went unchecked ("its graph could not be read").
    Such a buffer is deep-copied for the trace instead."""
    found = id_ranges(QuantizedBuffer().eval(), ["ids"], I64)
    assert (found.rows, found.unclear) == ({"ids": 10}, {})


SCALED = """
from math import sqrt

from torch import nn


class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4)

    def forward(self, ids):
        return self.emb(ids) / sqrt(ids.size(-1))
"""


def test_another_threads_module_of_a_file_the_trace_has_yet_to_enter_leaves_its_math_wrapped(tmp_path):
    """torch.fx wraps a file's math functions (`from math import sqrt`) as the trace first calls one of its modules,
    once per file: another thread's module of that file, called first, marked the file done with nothing wrapped,
    and the trace then failed on `sqrt(proxy)` (TypeError), the model's inputs unchecked."""
    path = tmp_path / "wok_scaled_for_test.py"
    path.write_text(SCALED)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    scaled = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(scaled)
    tracing, served = threading.Event(), threading.Event()

    class Root(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = scaled.Scaled()

        def forward(self, ids):
            tracing.set()
            if not served.wait(30):
                raise TimeoutError("the other thread's module did not run in 30 s")
            return self.inner(ids).sum(1)

    found = {}
    tracer = threading.Thread(target=lambda: found.update(ranges=id_ranges(Root().eval(), ["ids"], I64)))
    tracer.start()
    try:
        assert tracing.wait(30)
        with torch.no_grad():
            scaled.Scaled().eval()(torch.tensor([[1, 2]]))
    finally:
        served.set()
        tracer.join(30)
    assert (found["ranges"].rows, found["ranges"].unclear) == ({"ids": 10}, {})
