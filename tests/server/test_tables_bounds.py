"""`IdRanges.bounds`, the bound of an input's ids the server publishes (`wok.ids_bound.<input>`) and `wok profile`
and `wok bench ramp` draw below: given only where every way the input is used is followed (server/tables.py). An
input whose ids also reached a table through an op the finder does not follow was given the bound of the tables it
did follow: `a(ids) + b(ids * 2)` was published 100, a's rows, and the ramp's ids from 75 on failed the model at b's
150."""

from __future__ import annotations

import pytest
import torch
import torch.fx
from torch import nn

from wok.tables import id_ranges

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.:DeprecationWarning")


class TwoTables(nn.Module):
    """`ids` reaches a (100 rows) as it is and b (150 rows) doubled; `other` reaches a alone."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Embedding(100, 4)
        self.b = nn.Embedding(150, 4)

    def forward(self, ids, other):
        return self.a(ids) + self.b(ids * 2) + self.a(other)


def _forms(module: nn.Module, example: tuple) -> dict:
    module = module.eval()
    return {
        "python": module,
        "scripted": torch.jit.script(module),
        "exported": torch.export.export(module, example),
    }


def test_an_input_that_also_reaches_a_table_through_an_op_not_followed_has_no_bound():
    module = TwoTables().eval()
    below = torch.full((1, 3), 80)
    with pytest.raises(IndexError, match="index out of range"):
        module(below, torch.zeros(1, 3, dtype=torch.long))  # 80 < 100, the bound once published
    example = (torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 3, dtype=torch.long))
    for kind, model in _forms(module, example).items():
        found = id_ranges(model, ["ids", "other"], {"ids": torch.int64, "other": torch.int64})
        assert found.bounds == {"other": 100}, kind
        # The server's refusal stands: every id still reaches a, which fails past its 100 rows.
        assert found.rows == {"ids": 100, "other": 100}, kind


def lookup_in(table: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    # The model's own function, kept whole in the trace (torch.fx.wrap): what it looks up is not read.
    return table[ids]


torch.fx.wrap("lookup_in")


class Wrapped(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Embedding(100, 4)
        self.small = nn.Parameter(torch.randn(50, 4))

    def forward(self, ids):
        return self.a(ids) + lookup_in(self.small, ids)


class Computed(nn.Module):
    """`ids` indexes a tensor forward computes (50 rows), which no table's shape says; `other` indexes a parameter
    along its second dim (8 columns)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Embedding(100, 4)
        self.small = nn.Parameter(torch.randn(50, 4))
        self.wide = nn.Parameter(torch.randn(100, 8))

    def forward(self, ids, other):
        return self.a(ids) + (self.small * 2)[ids] + self.a(other) + self.wide.index_select(1, other.flatten()).sum()


class Hashed(TwoTables):
    """`% n` keeps any id within n rows: within b's 150 for `ids`, not for `other`'s 200."""

    def forward(self, ids, other):
        return self.a(ids) + self.b(ids % 150) + self.a(other) + self.b((other % 200).reshape(-1)).sum(0)


class Masked(nn.Module):
    """A mask made of the ids takes no position: the ids it selects are some of the ids, below a's rows."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Embedding(100, 4)

    def forward(self, ids):
        return self.a(ids[ids != 0]).sum(0) + self.a(ids).sum((0, 1)) + (ids.size(1) * 0)


def test_ids_that_reach_an_op_that_may_look_them_up_unread_have_no_bound():
    found = id_ranges(Wrapped().eval(), ["ids"], {"ids": torch.int64})
    assert (found.bounds, found.rows) == ({}, {"ids": 100})
    two = {"ids": torch.int64, "other": torch.int64}
    example = (torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 3, dtype=torch.long))
    for kind, model in _forms(Computed(), example).items():
        found = id_ranges(model, ["ids", "other"], two)
        assert (found.bounds, found.rows) == ({}, {"ids": 100, "other": 100}), kind
    for kind, model in _forms(Hashed(), example).items():
        found = id_ranges(model, ["ids", "other"], two)
        assert found.bounds == {"ids": 100}, kind
    for kind, model in {"python": Masked().eval(), "scripted": torch.jit.script(Masked().eval())}.items():
        found = id_ranges(model, ["ids"], {"ids": torch.int64})
        assert (found.bounds, found.rows) == ({"ids": 100}, {"ids": 100}), kind
