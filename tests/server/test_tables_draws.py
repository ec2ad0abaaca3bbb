"""Id bounds of positions no id's value is in, yet which fail the model at any id (server/tables.py), each model small
(vocab 100, a 16-row positions table) in its three forms: what torch's random ops draw at each call (`torch.randint(0,
20, ids.shape)`, `p.random_(0, 20)`, `torch.randperm(20)`, `(torch.rand(...) * 20).long()`), the memory `resize_`
grows a tensor by, and what a python forward makes of no input (`torch.empty(2, 5)`, `torch.LongTensor(2, 5)`), which
torch.fx's trace made once, a constant of its graph. Each published the ids' bound of 100, where ids 0 fail."""

from __future__ import annotations

import textwrap

import pytest
import torch
from torch import nn

from wok.repository import load_servable
from wok.tables import id_ranges

from .test_tables_encoders import I64, D, V, _forms, _serves_below_and_fails_at
from .test_tables_shapes import CONFIG, _loaded, ids_0_fail, memory_filled

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.:DeprecationWarning")


class Positions(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(V, D)
        self.pos = nn.Embedding(16, D)

    def looked_up(self, ids, positions):
        return (self.tok(ids) + self.pos(positions)).sum(1)


class Drawn(Positions):
    def forward(self, ids):
        return self.looked_up(ids, torch.randint(0, 20, ids.shape))


class DrawnOfLiterals(Positions):
    def forward(self, ids):
        return self.looked_up(ids, torch.randint(0, 20, (2, 5)))


class DrawnLike(Positions):
    def forward(self, ids):
        return self.looked_up(ids, torch.randint_like(ids, 20))


class DrawnFloats(Positions):
    def forward(self, ids):
        return self.looked_up(ids, (torch.rand(ids.shape) * 20).long())


class DrawnInPlace(Positions):
    def forward(self, ids):
        positions = ids.new_zeros(ids.shape)
        positions.random_(0, 20)
        return self.looked_up(ids, positions)


class Permuted(Positions):
    def forward(self, ids):
        return self.looked_up(ids, torch.randperm(20)[:5].expand(2, 5))


class DrawnWithin(Positions):
    """Below the 16 rows whatever is drawn: the bound stands."""

    def forward(self, ids):
        return self.looked_up(ids, torch.randint(0, 16, ids.shape))


class DrawnWithinOfLiterals(Positions):
    def forward(self, ids):
        return self.looked_up(ids, torch.randint(16, (2, 5)))


class Grown(Positions):
    def forward(self, ids):
        positions = ids.new_zeros(ids.shape).view(-1)
        positions.resize_(20)
        return self.looked_up(ids, positions[10:].view(2, 5))


class EmptyOfLiterals(Positions):
    def forward(self, ids):
        return self.looked_up(ids, torch.empty(2, 5, dtype=torch.long))


class Legacy(Positions):
    def forward(self, ids):
        return self.looked_up(ids, torch.LongTensor(2, 5))


class LegacyCast(Positions):
    def forward(self, ids):
        return self.looked_up(ids, torch.Tensor(2, 5).long())


POSITIONS = torch.arange(5)


class ArangeOfLiterals(Positions):
    """Made at the trace, the same at each call: the bound stands."""

    def forward(self, ids):
        return self.looked_up(ids, torch.arange(5).expand(2, 5) + POSITIONS * 0)


def _built(module: nn.Module) -> dict:
    """Its forms, but the exported one of a model calling `random_(low, high)`: torch.export's code for it names
    `aten.random_.from`, a python keyword (SyntaxError in torch 2.13)."""
    forms = {"python": module.eval(), "scripted": torch.jit.script(module.eval())}
    return forms if isinstance(module, (DrawnInPlace, DrawnInPlaceWithin)) else _forms(module)


def _fails_in_20_calls(run, ids) -> bool:
    """Whether the model fails on `ids` in one of 20 calls (what it draws, seeded: the same on every run)."""
    torch.manual_seed(0)
    for _ in range(20):
        try:
            run(ids)
        except (IndexError, RuntimeError):
            return True
    return False


def test_positions_drawn_at_each_call_past_the_table_publish_no_bound(tmp_path):
    """`torch.randint(0, 20, ids.shape)` (and randint_like's, randperm's, rand's cast, random_'s in place) holds none
    of the ids, so nothing of it was followed (randint_like's read as the ids'): a bound of 100 was published (none
    for randint_like), where ids 0 fail at the 16-row table on a draw past it. Within its range where known."""
    servable = _loaded(tmp_path / "drawn", Drawn())
    torch.manual_seed(0)
    ids_0_fail(servable, tries=20)
    zeros = torch.zeros(2, 5, dtype=torch.long)
    for cls in (Drawn, DrawnOfLiterals, DrawnLike, DrawnFloats, DrawnInPlace, Permuted):
        module = cls().eval()
        assert _fails_in_20_calls(module, zeros), cls.__name__
        for kind, model in _built(module).items():
            found = id_ranges(model, ["ids"], I64)
            assert (found.bounds, found.rows) == ({}, {"ids": V}), (cls.__name__, kind, found.unclear)
    for kind, model in _forms(Drawn()).items():
        what = "the Embedding module" if kind == "python" else "aten::embedding"
        op = "randint" if kind == "python" else "aten::randint"
        past = f"{op}'s draws below 20, whose results from 16 to 19 are past its 16 rows"
        assert id_ranges(model, ["ids"], I64).unpublished == {"ids": f"it reaches {what} through {past}"}, kind
    for cls in (DrawnWithin, DrawnWithinOfLiterals):
        for kind, model in _forms(cls()).items():
            found = id_ranges(model, ["ids"], I64)
            assert (found.bounds, found.rows) == ({"ids": V}, {"ids": V}), (cls.__name__, kind, found.unpublished)
            assert found.unclear["ids"].endswith("randint's draws below 16, within its 16 rows"), found.unclear
            torch.manual_seed(0)
            _serves_below_and_fails_at(model, V)


def test_the_memory_resize_grows_a_tensor_by_publishes_no_bound():
    """`resize_` leaves what it adds unset, as `torch.empty` does: looked up, ids 0 fail with the memory filled."""
    zeros = torch.zeros(2, 5, dtype=torch.long)
    for kind, model in _forms(Grown()).items():
        found = id_ranges(model, ["ids"], I64)
        assert (found.bounds, found.rows) == ({}, {"ids": V}), kind
        assert "resize_ leaves unset (whatever its memory held)" in found.unpublished["ids"], (kind, found.unpublished)
        run = model.module() if kind == "exported" else model
        with memory_filled(), pytest.raises((IndexError, RuntimeError)):
            run(zeros)


PYTHON_CONFIG = CONFIG.replace('platform = "torchscript"\nmodel_file = "model.pt"', 'platform = "python"\n'
                               'factory = "model:EmptyOfLiterals"')  # fmt: skip


def test_what_a_python_forward_makes_of_no_input_is_read_as_made_at_each_call(tmp_path):
    """torch.fx's trace runs `torch.empty(2, 5)` once and makes it a constant of its graph, read as holding no ids:
    a bound of 100 was published for the python form alone (TorchScript and torch.export read the op), where ids 0
    fail with the memory filled; so too `torch.LongTensor(2, 5)`, which the trace does not see made, and a randint
    of literals. A constant the same at each call (an arange, a global) keeps the bound."""
    root = tmp_path / "python"
    root.mkdir()
    source = """
        import torch
        from torch import nn


        class EmptyOfLiterals(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.tok = nn.Embedding(100, 8)
                self.pos = nn.Embedding(16, 8)

            def forward(self, ids):
                return (self.tok(ids) + self.pos(torch.empty(2, 5, dtype=torch.long))).sum(1)
        """
    (root / "model.py").write_text(textwrap.dedent(source))
    (root / "config.toml").write_text(PYTHON_CONFIG)
    servable = load_servable(root)
    with memory_filled():
        ids_0_fail(servable)
    zeros = torch.zeros(2, 5, dtype=torch.long)
    for cls in (EmptyOfLiterals, Legacy, LegacyCast):
        module = cls().eval()
        with memory_filled(), pytest.raises(IndexError):
            module(zeros)
        found = id_ranges(module, ["ids"], I64)
        assert (found.bounds, found.rows) == ({}, {"ids": V}), cls.__name__
    found = id_ranges(Legacy().eval(), ["ids"], I64)
    assert found.unpublished == {
        "ids": "it reaches the Embedding module through the values of _tensor_constant0, made by forward by no torch "
        "function wok sees (whatever its memory held)"
    }
    module = ArangeOfLiterals().eval()
    assert id_ranges(module, ["ids"], I64).bounds == {"ids": V}
    _serves_below_and_fails_at(module, V)


class FilledAfterEmpty(Positions):
    def forward(self, ids):
        return self.looked_up(ids, torch.empty(ids.shape, dtype=torch.long).fill_(3))


class DrawnInPlaceWithin(Positions):
    def forward(self, ids):
        positions = ids.new_zeros(ids.shape)
        positions.random_(0, 16)
        return self.looked_up(ids, positions)


class ZerosOfEmpty(Positions):
    def forward(self, ids):
        return self.looked_up(ids, torch.zeros_like(torch.empty_like(ids)))


class EmptyOfEmpty(Positions):
    def forward(self, ids):
        return self.looked_up(ids, torch.empty_like(ids).new_empty(ids.shape))


class EmptyFloatsCast(Positions):
    def forward(self, ids):
        return self.looked_up(ids, torch.empty_like(ids, dtype=torch.float).long())


def test_other_tensors_made_of_unset_or_drawn_values_as_found():
    """Pinned: an unset tensor filled after (no bound, where none fails: over-strict, the safe side, as before), zeros
    made like an empty one (the bound), empty made of empty, floats cast (none, true). Changed, over-strict: a draw in
    place within the rows (`random_(0, 16)`: no bound, where 100 was true), as what an in-place draw draws in is not
    read."""
    zeros = torch.zeros(2, 5, dtype=torch.long)
    for cls, bounds in (
        (FilledAfterEmpty, {}),
        (DrawnInPlaceWithin, {}),
        (ZerosOfEmpty, {"ids": V}),
        (EmptyOfEmpty, {}),
        (EmptyFloatsCast, {}),
    ):
        module = cls().eval()
        for kind, model in _built(module).items():
            found = id_ranges(model, ["ids"], I64)
            assert (found.bounds, found.rows) == (bounds, {"ids": V}), (cls.__name__, kind)
        if cls in (EmptyOfEmpty, EmptyFloatsCast):
            with memory_filled(), pytest.raises(IndexError):
                module(zeros)
        else:
            assert not _fails_in_20_calls(module, torch.full((2, 5), V - 1)), cls.__name__


class ChangedThroughAnAttribute(nn.Module):
    """A `% 2` kept as a module attribute and changed in place through it: 5 or 6, past the 2-row table."""

    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(V, D)
        self.flag = nn.Embedding(2, D)
        self.cache = torch.zeros(1, dtype=torch.long)

    def forward(self, ids):
        odd = ids % 2
        self.cache = odd
        self.cache.add_(5)
        return (self.tok(ids) + self.flag(odd)).sum(1)


def test_a_remainder_changed_through_an_attribute_names_the_change():
    """TorchScript's said the `% 2` reached the table "through aten::remainder, which wok does not follow", the
    `add_` that changed it through the attribute not named."""
    module = ChangedThroughAnAttribute().eval()
    with pytest.raises(IndexError):
        module(torch.zeros(2, 5, dtype=torch.long))
    for kind, model in {"python": module, "scripted": torch.jit.script(module)}.items():
        found = id_ranges(model, ["ids"], I64)
        assert (found.bounds, found.rows) == ({}, {"ids": V}), kind
        how = "mod by 2, then add_" if kind == "python" else "aten::remainder by 2, then aten::add_"
        what = "the Embedding module" if kind == "python" else "aten::embedding"
        assert found.unclear == {"ids": f"it reaches {what} through {how} in place, which wok does not follow"}, kind


class DrawnInPlaceRead(Positions):
    def forward(self, ids):
        return self.looked_up(ids, torch.zeros(ids.shape).exponential_(0.1).long())


class DrawnIntoOut(Positions):
    def forward(self, ids):
        positions = torch.zeros(2, 5, dtype=torch.long)
        torch.randint(0, 20, (2, 5), out=positions)
        return self.looked_up(ids, positions)


class DrawnInPlaceThenRead(Positions):
    def forward(self, ids):
        positions = torch.zeros(2, 5)
        positions.normal_(10.0, 5.0)
        return self.looked_up(ids, positions.abs().long())


def test_a_draw_in_place_read_from_its_result_publishes_no_bound(tmp_path):
    """What an in-place draw returns is the tensor it changed: `torch.zeros(s).exponential_(0.1).long()` published
    100 as TorchScript (the draw marked the zeros, not its result), and torch.export, which reads an in-place op's
    result after it, published 100 for each (`p.normal_(...)`, `randint(..., out=p)` too), where ids 0 fail."""
    servable = _loaded(tmp_path / "drawn", DrawnInPlaceRead())
    torch.manual_seed(0)
    ids_0_fail(servable, tries=20)
    zeros = torch.zeros(2, 5, dtype=torch.long)
    for cls in (DrawnInPlaceRead, DrawnIntoOut, DrawnInPlaceThenRead):
        module = cls().eval()
        assert _fails_in_20_calls(module, zeros), cls.__name__
        for kind, model in _forms(module).items():
            assert _fails_in_20_calls(model.module() if kind == "exported" else model, zeros), (cls.__name__, kind)
            found = id_ranges(model, ["ids"], I64)
            assert (found.bounds, found.rows) == ({}, {"ids": V}), (cls.__name__, kind, found.unclear)
            assert "draws" in found.unpublished["ids"], (cls.__name__, kind, found.unpublished)
