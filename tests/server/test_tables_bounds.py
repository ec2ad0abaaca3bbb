"""`IdRanges.bounds`, the bound of an input's ids the server publishes (`wok.ids_bound.<input>`) and `wok profile`
and `wok bench ramp` draw below: given only where every way the input is used is followed (server/tables.py). An
input whose ids also reached a table through an op the finder does not follow was given the bound of the tables it
did follow: `a(ids) + b(ids * 2)` was published 100, a's rows, and the ramp's ids from 75 on failed the model at b's
150."""

from __future__ import annotations

import copy

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


class Picked(nn.Module):
    """`ids` reaches a (100 rows), and its first id picks a row of `small` (10 rows) as a position, not through a
    table op: ids from 10 on, below a's rows, fail it."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Embedding(100, 4)
        self.small = nn.Parameter(torch.randn(10, 4))
        self.scale = {0: 1.0, 1: 2.0}


class Selected(Picked):  # as torch.fx traces it: `.item()`, no `int()`
    def forward(self, ids):
        return self.a(ids) + self.small.select(0, ids[0, 0].item())


class Narrowed(Picked):
    def forward(self, ids):
        return self.a(ids) + self.small.narrow(0, ids[0, 0].item(), 1)


class SelectedExported(Picked):
    def forward(self, ids):
        first = ids[0, 0].item()
        torch._check(first >= 0)  # torch.export takes a data-dependent position only said within the tensor
        torch._check(first < 10)
        return self.a(ids) + self.small.select(0, first) + self.small.narrow(0, first, 1)


class SelectedScripted(Picked):
    def forward(self, ids):
        return self.a(ids) + self.small.select(0, int(ids[0, 0]))


class NarrowedScripted(Picked):
    def forward(self, ids):
        return self.a(ids) + self.small.narrow(0, int(ids[0, 0]), 1)


class Indexed(Picked):
    def forward(self, ids):
        first: int = int(ids[0, 0])
        return self.a(ids) + self.small[first]


class Keyed(Picked):
    def forward(self, ids):
        return self.a(ids) * self.scale[int(ids[0, 0])]


def test_ids_read_as_a_position_in_select_narrow_or_a_container_have_no_bound():
    below = torch.full((2, 3), 50)
    forms = {
        "python select": Selected().eval(),
        "python narrow": Narrowed().eval(),
        "exported": torch.export.export(SelectedExported().eval(), (torch.zeros(2, 3, dtype=torch.long),)),
    }
    for cls in (SelectedScripted, NarrowedScripted, Indexed, Keyed):
        forms[f"scripted {cls.__name__}"] = torch.jit.script(cls().eval())
    for kind, model in forms.items():
        with pytest.raises((IndexError, KeyError, RuntimeError)):
            model(below) if kind != "exported" else model.module()(below)  # 50 < 100, the bound once published
        found = id_ranges(model, ["ids"], {"ids": torch.int64})
        assert (found.bounds, found.rows) == ({}, {"ids": 100}), kind


class SelectedByKeyword(Picked):
    def forward(self, ids):
        return self.a(ids) + torch.index_select(self.small, 0, index=ids.flatten()).sum()


def test_index_select_of_a_parameter_given_its_index_by_keyword_is_a_lookup():
    with pytest.raises(IndexError):
        SelectedByKeyword().eval()(torch.full((1, 3), 50))
    found = id_ranges(SelectedByKeyword().eval(), ["ids"], {"ids": torch.int64})
    # Read as the table it is: ids past small's 10 rows refused, not only those past a's 100.
    assert (found.bounds, found.rows) == ({"ids": 10}, {"ids": 10})


class Unknown(nn.Module):
    """Ids past a's 100 rows mapped to 0 in place: the graph goes on reading `ids` as if it were the request's."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Embedding(100, 4)

    def forward(self, ids):
        ids.masked_fill_(ids >= 100, 0)
        return self.a(ids)


class OneBased(Unknown):
    def forward(self, ids):
        ids.sub_(1)
        return self.a(ids)


class ReshapedInPlace(Unknown):
    """A mask of the ids reshaped in place: it reads no id as a position, and changes no id."""

    def forward(self, ids):
        keep = (ids != 0).unsqueeze_(-1)
        ids.unsqueeze_(-1).squeeze_(-1)
        return self.a(ids) * keep


def test_ids_changed_in_place_are_not_checked():
    assert Unknown().eval()(torch.tensor([[150]])).shape == (1, 1, 4)  # once refused: past a's 100 rows
    assert OneBased().eval()(torch.tensor([[100]])).shape == (1, 1, 4)  # once refused
    with pytest.raises(IndexError):
        OneBased().eval()(torch.tensor([[0]]))  # once let through, below the bound published
    example = (torch.zeros(2, 3, dtype=torch.long),)
    for cls in (Unknown, OneBased):
        for kind, model in _forms(cls(), example).items():
            found = id_ranges(model, ["ids"], {"ids": torch.int64})
            assert (found.bounds, found.rows, found.least) == ({}, {}, {}), (cls.__name__, kind)
            assert "ids" in found.unclear, (cls.__name__, kind)
    for kind, model in _forms(ReshapedInPlace(), example).items():
        found = id_ranges(model, ["ids"], {"ids": torch.int64})
        assert (found.bounds, found.rows) == ({"ids": 100}, {"ids": 100}), kind


class HalfRemainder(nn.Module):
    """`% n` of ids made half floats: from id 65,520 on they are inf, whose remainder is NaN, a garbage long."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Embedding(70_000, 2)
        self.b = nn.Embedding(1000, 2)

    def forward(self, ids):
        return self.a(ids) + self.b((ids.half() % 1000).long())


class RoundedRemainder(HalfRemainder):
    """A float32's remainder rounds up to its divisor: id 0 makes -1e-5, whose `% 1000` is 1000.0."""

    def forward(self, ids):
        return self.a(ids) + self.b(((ids.float() - 1) * 1e-5 % 1000).long())


class NarrowRemainder(nn.Module):
    """Int8 ids: their `% 200` is `% -56` (200 wrapped to int8), in (-56, 0]."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Embedding(100, 2)
        self.b = nn.Embedding(200, 2)

    def forward(self, ids):
        return self.a(ids.long()) + self.b((ids % 200).long())


class IntegerRemainders(NarrowRemainder):
    """Integer arithmetic before `% 200`, and a float made a long again: each within b's 200 rows. (A python
    model's `&`, operator.and_, was read as an in-place `and`, and its `<<` was not followed: it had no bound.)"""

    def forward(self, ids):
        wide = ids.long()
        hashed = self.b((wide * 31 + 7) % 200) + self.b((wide & 0xFFFF | 1) % 200) + self.b((wide << 3 >> 1) % 200)
        return self.a(wide) + hashed + self.b(((wide * 3).float() / 2).long() % 200)


def test_a_remainder_of_floats_or_past_its_dtype_keeps_no_id_within_its_divisor():
    """`(ids.half() % n).long()` was taken as within n: a's 70,000 rows were published, and ids from 65,520 on
    failed b."""
    for cls, dtype, failing, rows in (
        (HalfRemainder, torch.int64, 65_520, 70_000),
        (RoundedRemainder, torch.int64, 0, 70_000),
        (NarrowRemainder, torch.int8, 5, 100),
    ):
        module = cls().eval()
        with pytest.raises(IndexError, match="index out of range"):
            module(torch.full((1, 3), failing, dtype=dtype))  # below a's rows, the bound once published
        for kind, model in _forms(module, (torch.zeros(2, 3, dtype=dtype),)).items():
            found = id_ranges(model, ["ids"], {"ids": dtype})
            assert (found.bounds, found.rows) == ({}, {"ids": rows}), (cls.__name__, kind)
    module = IntegerRemainders().eval()
    module(torch.arange(100, dtype=torch.int8).reshape(1, -1))  # every id below the bound is served
    for kind, model in _forms(module, (torch.zeros(2, 3, dtype=torch.int8),)).items():
        found = id_ranges(model, ["ids"], {"ids": torch.int8})
        assert (found.bounds, found.rows) == ({"ids": 100}, {"ids": 100}), kind


def test_the_start_up_says_why_an_input_checked_per_request_has_no_bound():
    """`ids` is refused past a's rows but published no bound: the line said only `in [0, 100)`."""
    example = (torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 3, dtype=torch.long))
    ways = {"python": "the Embedding module through mul", "scripted": "aten::embedding through aten::mul"}
    ways["exported"] = ways["scripted"]
    for kind, model in _forms(TwoTables(), example).items():
        found = id_ranges(model, ["ids", "other"], {"ids": torch.int64, "other": torch.int64})
        assert found.said() == (
            f"input 'ids' in [0, 100) (checked per request; no bound published: it reaches {ways[kind]}, which wok "
            "does not follow); input 'other' in [0, 100)"
        ), kind


class Renormed(nn.Module):
    """max_norm: torch.export writes `embedding_renorm_(weight, ids, ...)` before the lookup, on the same rows."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Embedding(100, 4, max_norm=1.0)

    def forward(self, ids):
        return self.a(ids)


class MaskOfParameter(nn.Module):
    """`table[ids != 0]` of a parameter takes a mask, no id as a row."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Embedding(100, 4)
        self.small = nn.Parameter(torch.randn(2, 3))

    def forward(self, ids):
        return self.a(ids).sum() + self.small[ids != 0].sum()


def test_a_max_norm_embedding_and_a_mask_of_a_parameter_keep_the_bound():
    """The exported max_norm embedding, and the python and scripted masks, had no bound (over-strict)."""
    example = (torch.zeros(2, 3, dtype=torch.long),)
    for cls in (Renormed, MaskOfParameter):
        module = cls().eval()
        module(torch.tensor([[0, 99, 5], [99, 0, 1]]))  # ids below the bound are served
        with pytest.raises(IndexError):
            module(torch.tensor([[0, 100, 5], [99, 0, 1]]))
        for kind, model in _forms(module, example).items():
            found = id_ranges(model, ["ids"], {"ids": torch.int64})
            assert (found.bounds, found.rows) == ({"ids": 100}, {"ids": 100}), (cls.__name__, kind)


class InPlaceCompare(nn.Module):
    """`x.ne_(0)` of integers writes 0/1 into them, which `small[...]` takes as rows, not as a mask."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Embedding(100, 4)
        self.small = nn.Parameter(torch.randn(1, 3))

    def forward(self, ids):
        return self.a(ids).sum() + self.small[(ids * 1).ne_(0)].sum()


def test_an_in_place_comparison_of_integers_is_no_mask():
    """It was taken for a mask (`table[mask]` of a parameter keeps the bound): bound 100, and id 1 failed `small`'s
    one row."""
    module = InPlaceCompare().eval()
    module(torch.zeros(1, 3, dtype=torch.long))
    with pytest.raises(IndexError):
        module(torch.ones(1, 3, dtype=torch.long))  # below the bound once published
    for kind, model in _forms(module, (torch.zeros(1, 3, dtype=torch.long),)).items():
        found = id_ranges(model, ["ids"], {"ids": torch.int64})
        assert (found.bounds, found.rows) == ({}, {"ids": 100}), kind


class RemainderChangedThroughAView(NarrowRemainder):
    """`y = ids % 200` changed in place through a view of it: y's ids reach b past its 200 rows from id 50 on."""

    def forward(self, ids):
        y = ids % 200
        y.view(-1).add_(150)
        return self.a(ids) + self.b(y)


class RemainderChangedInPart(NarrowRemainder):
    def forward(self, ids):
        y = ids % 200
        y[:, 0:1].add_(150)
        return self.a(ids) + self.b(y)


class RemainderFilledInPlace(NarrowRemainder):
    def forward(self, ids):
        y = ids % 200
        y.masked_fill_(y > 50, 250)
        return self.a(ids) + self.b(y)


class RemainderWrittenByOut(NarrowRemainder):
    def forward(self, ids):
        y = ids % 200
        torch.add(y, 150, out=y)
        return self.a(ids) + self.b(y)


def test_a_remainder_changed_in_place_keeps_no_id_within_its_divisor():
    """Each was published a's bound of 100 (the exported view form too; the python and scripted forms of the
    `out=` one); ids from 50 on fail b."""
    example = (torch.zeros(1, 3, dtype=torch.long),)
    for cls in (RemainderChangedThroughAView, RemainderChangedInPart, RemainderFilledInPlace, RemainderWrittenByOut):
        module = cls().eval()
        with pytest.raises(IndexError, match="index out of range"):
            module(torch.full((1, 3), 60))
        for kind, model in _forms(module, example).items():
            found = id_ranges(model, ["ids"], {"ids": torch.int64})
            assert (found.bounds, found.rows) == ({}, {"ids": 100}), (cls.__name__, kind)


class OneBasedThroughAView(Unknown):
    def forward(self, ids):
        ids.view(-1).sub_(1)
        return self.a(ids)


def test_ids_changed_in_place_through_a_view_are_not_checked_in_an_exported_program():
    """torch.export keeps `sub_` on the view: the program's ids were read as the request's, bound and range 100
    (id 0 passed the check and failed the model, 100 was refused though served)."""
    module = OneBasedThroughAView().eval()
    program = torch.export.export(module, (torch.zeros(1, 3, dtype=torch.long),))
    assert program.module()(torch.full((1, 3), 100)).shape == (1, 3, 4)
    with pytest.raises(IndexError):
        program.module()(torch.zeros(1, 3, dtype=torch.long))
    for kind, model in _forms(module, (torch.zeros(1, 3, dtype=torch.long),)).items():
        found = id_ranges(model, ["ids"], {"ids": torch.int64})
        op = "sub_" if kind == "python" else "aten::sub_"
        why = f"{op} changes its ids in place, which wok does not follow"
        assert (found.bounds, found.rows, found.unclear) == ({}, {}, {"ids": why}), kind


class ViewedAsBytes(nn.Module):
    """`ids.view(torch.int8)`: the ids' bytes (id 200 is -56, 0, ...), not the ids."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Embedding(300, 2)
        self.b = nn.Embedding(300, 2)

    def forward(self, ids):
        return self.a(ids) + self.b(ids.view(torch.int8).long()).sum(1, keepdim=True)


class BytesRemainder(ViewedAsBytes):
    def forward(self, ids):
        return self.a(ids) + self.b((ids.view(torch.int8) % 200).long()).sum(1, keepdim=True)


def test_ids_viewed_as_another_dtype_are_not_the_ids():
    """Read as a reshape, both were bound and checked below a's and b's 300 rows; id 128 failed b (and an int8's
    `% 200` was taken as within 200). TorchScript has no `view(dtype)`: it scripts `view(torch.int8)` as
    `view([1])`, a reshape, so the python and exported forms alone."""
    example = (torch.zeros(1, 3, dtype=torch.long),)
    for cls in (ViewedAsBytes, BytesRemainder):
        module = cls().eval()
        with pytest.raises(IndexError, match="index out of range"):
            module(torch.full((1, 3), 128))
        for model in (module, torch.export.export(module, example)):
            found = id_ranges(model, ["ids"], {"ids": torch.int64})
            assert (found.bounds, found.rows) == ({}, {"ids": 300}), (cls.__name__, type(model).__name__)


class RemainderAddedTo(NarrowRemainder):
    """`% 200` is followed; the `+= 150` after it is not (ids from 50 on pass b's 200 rows)."""

    def __init__(self) -> None:
        super().__init__()
        self.b = nn.Embedding(200, 2)

    def forward(self, ids):
        y = ids % 200
        y += 150
        return self.a(ids) + self.b(y)


class RemainderPastRows(NarrowRemainder):
    """`% 200` into b of 150 rows: followed, but 200 is more than the rows (ids from 150 on fail)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Embedding(300, 2)
        self.b = nn.Embedding(150, 2)

    def forward(self, ids):
        return self.a(ids) + self.b(ids % 200)


class RemainderWithinRows(nn.Module):
    """`(ids * 3) % 100` into 150 rows alone: every id is served, none checked."""

    def __init__(self) -> None:
        super().__init__()
        self.b = nn.Embedding(150, 2)

    def forward(self, ids):
        return self.b((ids * 3) % 100)


def test_the_start_up_names_the_step_not_followed_after_a_remainder():
    """Each said "through mod" (python) or "through aten::remainder", an op wok follows, whatever came after it or
    whichever way it failed: the `+=` after it, a divisor past the table's rows, past the dtype, a float dividend,
    an in-place change through a view; and of a `% n` within the rows, that it "is not followed"."""
    long_example = (torch.zeros(1, 3, dtype=torch.long),)
    module = RemainderAddedTo().eval()
    with pytest.raises(IndexError, match="index out of range"):
        module(torch.full((1, 3), 50))
    module = RemainderPastRows().eval()
    with pytest.raises(IndexError, match="index out of range"):
        module(torch.full((1, 3), 150))
    module = RemainderWithinRows().eval()
    assert module(torch.arange(1000).reshape(1, -1)).shape == (1, 1000, 2)
    checked = "input 'ids' in [0, {rows}) (checked per request; no bound published: it reaches {what} through {how})"
    cases = (
        (
            RemainderAddedTo,
            torch.int64,
            100,
            {"python": "add", "scripted": "aten::add_"},
            ", which wok does not follow",
        ),
        (RemainderPastRows, torch.int64, 300, {}, " by 200, whose results from 150 to 199 are past its 150 rows"),
        (NarrowRemainder, torch.int8, 100, {}, " by 200, past what int8 holds (127)"),
        (RoundedRemainder, torch.int64, 70_000, {}, " of values not known to be integers"),
        (
            RemainderChangedThroughAView,
            torch.int64,
            100,
            {},
            " by 200, then {add_} in place, which wok does not follow",
        ),
    )
    for cls, dtype, rows, ops, tail in cases:
        for kind, model in _forms(cls(), (torch.zeros(1, 3, dtype=dtype),)).items():
            found = id_ranges(model, ["ids"], {"ids": dtype})
            python = kind == "python"
            op = ops.get(kind, ops.get("scripted")) or ("mod" if python else "aten::remainder")
            how = op + tail.format(add_="add_" if python else "aten::add_")
            if cls is RoundedRemainder and kind == "exported":  # the exported graph's dtypes are known
                how = "aten::remainder of float32 values, not integers"
            what = "the Embedding module" if python else "aten::embedding"
            assert found.said() == checked.format(rows=rows, what=what, how=how), (cls.__name__, kind)
    for kind, model in _forms(RemainderWithinRows(), long_example).items():
        found = id_ranges(model, ["ids"], {"ids": torch.int64})
        how = "the Embedding module through mod" if kind == "python" else "aten::embedding through aten::remainder"
        assert found.said() == f"input 'ids' not checked: it reaches {how} by 100, within its 150 rows", kind


class MaskReshaped(nn.Module):
    """`table[mask.flatten()]` (and its reshape, view, move) of a parameter: a mask still, no id taken as a row;
    ids moved to a device are the ids."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Embedding(100, 4)
        self.small = nn.Parameter(torch.randn(6, 3))

    def forward(self, ids):
        mask = ids != 0
        picked = self.small[mask.flatten()].sum() + self.small[mask.reshape(-1)].sum()
        return self.a(ids.to(ids.device)).sum() + picked + self.small[mask.view(-1).to(ids.device)].sum()


class MaskCast(MaskReshaped):
    """`mask.long()` is no mask: its 0s and 1s are rows, and `one` has one."""

    def __init__(self) -> None:
        super().__init__()
        self.one = nn.Parameter(torch.randn(1, 3))

    def forward(self, ids):
        return self.a(ids).sum() + self.one[(ids != 0).flatten().long()].sum()


def test_a_mask_reshaped_stays_a_mask():
    """Reshaped, the mask was taken for ids reaching `table[...]` through ne: the python and scripted forms had no
    bound; the exported one had (its graph keeps the bool dtype). A cast to integers is none, but its 0 or 1 is within
    2 rows. (A python model's `.to(ids.device)` was read as a cast to another tensor's dtype: its ids were not
    checked.)"""
    example = (torch.zeros(2, 3, dtype=torch.long),)
    module = MaskReshaped().eval()
    module(torch.tensor([[0, 99, 5], [99, 0, 1]]))  # every id below the bound is served
    for kind, model in _forms(module, example).items():
        found = id_ranges(model, ["ids"], {"ids": torch.int64})
        assert (found.bounds, found.rows, found.said()) == ({"ids": 100}, {"ids": 100}, "input 'ids' in [0, 100)"), kind
    module = MaskCast().eval()
    with pytest.raises(IndexError, match="out of bounds"):
        module(torch.ones(2, 3, dtype=torch.long))  # below a's 100 rows
    for kind, model in _forms(module, example).items():
        found = id_ranges(model, ["ids"], {"ids": torch.int64})
        how = (
            "table[ids] of a parameter through long"
            if kind == "python"
            else "aten::index (table[ids]) of a parameter through aten::to"
        )
        assert (found.bounds, found.rows) == ({}, {"ids": 100}), kind
        # The cast of a comparison holds 0 or 1: past one's single row.
        past = "of a mask (0 or 1), whose results from 1 to 1 are past its 1 rows"
        assert found.unpublished == {"ids": f"it reaches {how} {past}"}, kind


class ComparedInto(MaskCast):
    """`torch.ne(ids, 0, out=buf)` writes the comparison into `buf`'s integers: 0s and 1s, which `one[...]` takes as
    rows (`one` has one), not a mask."""

    def forward(self, ids):
        got = torch.ne(ids, 0, out=torch.zeros_like(ids))
        return self.a(ids).sum() + self.one[got.flatten()].sum()


def test_a_comparison_written_into_a_tensor_given_is_no_mask():
    """It was taken for a mask, and stayed one through the reshape, as a mask does: the python and scripted
    forms published bound 100, and id 1 failed `one`'s one row. The exported graph has no `out=` (it had none)."""
    module = ComparedInto().eval()
    module(torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(IndexError):
        module(torch.ones(2, 3, dtype=torch.long))  # below a's 100 rows
    for kind, model in _forms(module, (torch.zeros(2, 3, dtype=torch.long),)).items():
        found = id_ranges(model, ["ids"], {"ids": torch.int64})
        assert (found.bounds, found.rows) == ({}, {"ids": 100}), kind


class SubtractedInto(Unknown):
    """`torch.sub(ids, 1, out=ids)`: the ids one less, id 0 past a's rows; the graphs read `ids` on as sent."""

    def forward(self, ids):
        torch.sub(ids, 1, out=ids)
        return self.a(ids)


class SubtractedIntoAView(Unknown):
    def forward(self, ids):
        flat = ids.view(-1)
        torch.sub(flat, 1, out=flat)
        return self.a(ids)


class ListItemChanged(Unknown):
    def forward(self, ids):
        held: list[torch.Tensor] = [ids]
        held[0].sub_(1)
        return self.a(ids)


class AppendedItemChanged(Unknown):
    def forward(self, ids):
        held: list[torch.Tensor] = []
        held.append(ids)
        held[0].sub_(1)
        return self.a(ids)


class MovedChanged(Unknown):
    """`ids.cpu()` of ids on the CPU is the ids."""

    def forward(self, ids):
        ids.cpu().sub_(1)
        return self.a(ids)


class UnboundChanged(Unknown):
    def forward(self, ids):
        ids.unbind(0)[0].sub_(1)
        return self.a(ids)


def test_ids_written_by_out_or_changed_through_an_item_or_a_move_are_not_checked():
    """Each was published bound 100, or checked in [0, 100) per request, where id 0 fails: `out=` was not taken for
    an in-place change (python, scripted; exported into a view), nor a change of a list's item (scripted), of
    `ids.cpu()` (python, scripted) or of an unbind's row (rows in all three)."""
    example = (torch.zeros(1, 3, dtype=torch.long),)
    classes = (SubtractedInto, SubtractedIntoAView, ListItemChanged, AppendedItemChanged, MovedChanged, UnboundChanged)
    for cls in classes:
        module = cls().eval()
        with pytest.raises(IndexError, match="index out of range"):
            module(torch.zeros(1, 3, dtype=torch.long))
        assert module(torch.full((1, 3), 100)).shape == (1, 3, 4)  # past the rows once refused
        for kind, model in _forms(module, example).items():
            found = id_ranges(model, ["ids"], {"ids": torch.int64})
            assert (found.bounds, found.rows, found.least) == ({}, {}, {}), (cls.__name__, kind)
    for kind, model in _forms(SubtractedInto(), example).items():
        if kind != "exported":  # whose lookup reads the op's result: "through aten::sub"
            found = id_ranges(model, ["ids"], {"ids": torch.int64})
            op = "sub" if kind == "python" else "aten::sub"
            assert (
                found.said()
                == f"input 'ids' not checked: {op} with out= changes its ids in place, which wok does not follow"
            )


class ChangedCopies(Unknown):
    """In-place changes of new tensors made of the ids (a product, a cast to float): the ids stay as sent."""

    def forward(self, ids):
        shifted = ids * 1
        shifted.sub_(1)
        scaled = ids.float()
        scaled.mul_(2)
        return self.a(ids) + shifted.sum() + scaled.sum()


def test_an_in_place_change_of_a_copy_of_the_ids_keeps_the_bound():
    """The scripted and exported forms read `ids.float()` as sharing the ids' memory: no bound, not checked."""
    module = ChangedCopies().eval()
    module(torch.full((1, 3), 99))
    with pytest.raises(IndexError):
        module(torch.full((1, 3), 100))
    for kind, model in _forms(module, (torch.zeros(1, 3, dtype=torch.long),)).items():
        found = id_ranges(model, ["ids"], {"ids": torch.int64})
        assert (found.bounds, found.rows) == ({"ids": 100}, {"ids": 100}), kind


class MaskCastToBool(MaskReshaped):
    def forward(self, ids):
        back = (ids != 0).long().to(torch.bool)
        return (
            self.a(ids).sum() + self.small[(ids != 0).to(torch.bool).flatten()].sum() + self.small[back.view(-1)].sum()
        )


class MaskMethodBool(MaskReshaped):  # TorchScript has no Tensor.bool()
    def forward(self, ids):
        return self.a(ids).sum() + self.small[(ids != 0).bool().flatten()].sum() + self.small[ids.bool().view(-1)].sum()


class MaskInverted(MaskReshaped):
    def forward(self, ids):
        return self.a(ids).sum() + self.small[~(ids != 0).flatten()].sum()


class MasksCombined(MaskReshaped):
    def forward(self, ids):
        both = (ids != 0) & (ids < 5)
        either = (ids != 0) | ~(ids < 5)
        return self.a(ids).sum() + self.small[both.flatten()].sum() + self.small[(either ^ both).flatten()].sum()


class MaskAndIds(MaskCast):
    """`mask & ids` is integers (0 or the id), which `one[...]` takes as rows (`one` has one)."""

    def forward(self, ids):
        return self.a(ids).sum() + self.one[((ids != 0) & ids).flatten()].sum()


class MaskOrOne(MaskCast):
    """`mask | 1`: a python int makes it int64, 1s, past `one`'s one row."""

    def forward(self, ids):
        return self.a(ids).sum() + self.one[((ids != 0) | 1).flatten()].sum()


def test_a_mask_cast_to_bool_inverted_or_combined_with_masks_stays_a_mask():
    """Each was taken for ids reaching `table[...]` through the cast, `~` or `&` (python and scripted forms): no bound
    published though no id is read as a row. Combined with integers, they are rows: still no bound."""
    example = (torch.zeros(2, 3, dtype=torch.long),)
    cases = {cls: _forms(cls(), example) for cls in (MaskCastToBool, MaskInverted, MasksCombined)}
    cases[MaskMethodBool] = {"python": MaskMethodBool().eval()}
    for cls, forms in cases.items():
        module = cls().eval()
        module(torch.tensor([[0, 99, 5], [99, 0, 1]]))
        with pytest.raises(IndexError):
            module(torch.tensor([[0, 100, 5], [99, 0, 1]]))
        for kind, model in forms.items():
            found = id_ranges(model, ["ids"], {"ids": torch.int64})
            assert (found.bounds, found.rows, found.said()) == (
                {"ids": 100},
                {"ids": 100},
                "input 'ids' in [0, 100)",
            ), (
                cls.__name__,
                kind,
            )
    for cls in (MaskAndIds, MaskOrOne):
        with pytest.raises(IndexError):
            cls().eval()(torch.ones(2, 3, dtype=torch.long))  # below a's 100 rows
        for kind, model in _forms(cls(), example).items():
            found = id_ranges(model, ["ids"], {"ids": torch.int64})
            assert (found.bounds, found.rows) == ({}, {"ids": 100}), (cls.__name__, kind)


class RemainderEitherWay(nn.Module):
    """`% 50` or `% 30` under a branch on the batch: within b's 50 rows either way."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Embedding(100, 2)
        self.b = nn.Embedding(50, 2)

    def forward(self, ids):
        hashed = ids % 50 if ids.size(0) > 1 else ids % 30
        return self.a(ids) + self.b(hashed)


class RemainderPastOneWay(RemainderEitherWay):
    def forward(self, ids):
        hashed = ids % 50 if ids.size(0) > 1 else ids % 80
        return self.a(ids) + self.b(hashed)


def test_a_remainder_under_a_torchscript_branch_is_within_its_largest_divisor():
    """The branch's result was not followed ("through prim::If"): no bound. Past the rows one way, it stays none."""
    within = torch.jit.script(RemainderEitherWay().eval())
    within(torch.full((1, 3), 99))
    with pytest.raises(RuntimeError, match="index out of range"):
        within(torch.full((1, 3), 100))
    found = id_ranges(within, ["ids"], {"ids": torch.int64})
    assert (found.bounds, found.rows, found.said()) == ({"ids": 100}, {"ids": 100}, "input 'ids' in [0, 100)")
    past = torch.jit.script(RemainderPastOneWay().eval())
    with pytest.raises(RuntimeError, match="index out of range"):
        past(torch.full((1, 3), 60))  # below a's 100 rows: 60 % 80 is past b's 50
    found = id_ranges(past, ["ids"], {"ids": torch.int64})
    assert (found.bounds, found.rows) == ({}, {"ids": 100})
    how = "aten::remainder by 80, whose results from 50 to 79 are past its 50 rows"
    assert found.unpublished == {"ids": f"it reaches aten::embedding through {how}"}


class Buffered(nn.Module):
    """Ids written into a tensor made of no input (a constant to torch.fx's trace, each view of it another) by an op
    wok does not follow, which a table then looks up: values from id 40 or 50 on are past a's 100 rows. `ids` also
    reaches a as sent."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Embedding(100, 4)

    def forward(self, ids):
        return self.a(self.written(ids)) + self.a(ids)


class AddedIntoABuffer(Buffered):
    def written(self, ids):
        buf = torch.zeros(1, 3, dtype=torch.long)
        torch.add(ids, 60, out=buf)
        return buf


class AddedInPlaceToABuffer(Buffered):
    def written(self, ids):
        buf = torch.zeros(1, 3, dtype=torch.long)
        buf.add_(ids * 2)
        return buf


class AddedIntoABuffersView(Buffered):
    def written(self, ids):
        buf = torch.zeros(1, 3, dtype=torch.long)
        flat = buf.view(-1)
        flat.add_(ids.view(-1) * 2)
        return buf


class RemainderIntoABufferChanged(Buffered):
    """The `% 100` is within a's rows, but it is the buffer's memory, changed after."""

    def written(self, ids):
        buf = torch.zeros(1, 3, dtype=torch.long)
        held = torch.remainder(ids, 100, out=buf)
        # Of a value of the trace's (the ids' size), so that torch.fx records it: a change of the trace's constant by
        # constants alone is made as it traces, not in its graph.
        buf.add_(ids.size(0) * 0 + 60)
        return held


def test_ids_written_into_a_tensor_that_reaches_a_table_have_no_bound():
    """Each was published bound 100 (python and scripted forms; the exported graph reads the op's result, not the
    buffer), where id 50 fails: the buffer, made of no input, was looked up as holding no ids, and a `% n` whose
    memory was changed through the buffer it was written into was still taken within n."""
    example = (torch.zeros(1, 3, dtype=torch.long),)
    classes = (AddedIntoABuffer, AddedInPlaceToABuffer, AddedIntoABuffersView, RemainderIntoABufferChanged)
    for cls in classes:
        module = cls().eval()
        module(torch.full((1, 3), 39))
        with pytest.raises(IndexError, match="index out of range"):
            module(torch.full((1, 3), 50))
        for kind, model in _forms(module, example).items():
            found = id_ranges(model, ["ids"], {"ids": torch.int64})
            assert found.bounds == {}, (cls.__name__, kind)
    found = id_ranges(torch.jit.script(AddedIntoABuffer().eval()), ["ids"], {"ids": torch.int64})
    assert found.said() == (
        "input 'ids' in [0, 100) (checked per request; no bound published: it reaches aten::embedding through "
        "aten::add with out=, which wok does not follow)"
    )


class OtherIdsAddedIn(nn.Module):
    """`other` doubled, added into `ids` in place: ids 0 with `other` from 50 on fail a."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Embedding(100, 4)

    def forward(self, ids, other):
        ids.add_(other * 2)
        return self.a(ids) + self.a(other)


ADD_ = {"python": "add_", "scripted": "aten::add_"}


def test_ids_written_into_another_inputs_have_no_bound():
    """`other` was published bound 100 (python and scripted forms; the exported graph looks the sum up)."""
    module = OtherIdsAddedIn().eval()
    with pytest.raises(IndexError, match="index out of range"):
        module(torch.zeros(1, 3, dtype=torch.long), torch.full((1, 3), 50))
    example = (torch.zeros(1, 3, dtype=torch.long), torch.zeros(1, 3, dtype=torch.long))
    for kind, model in _forms(module, example).items():
        found = id_ranges(model, ["ids", "other"], {"ids": torch.int64, "other": torch.int64})
        assert found.bounds == {}, kind
        if kind != "exported":
            assert found.unpublished == {"other": f"its ids are written into another input's by {ADD_[kind]}"}, kind


class DataAssigned(Unknown):
    """`ids.data = ids + 60`: a looks up the ids plus 60, id 40 past its rows; torch.fx records no assignment."""

    def forward(self, ids):
        ids.data = ids + 60
        return self.a(ids)


class RealAssigned(Unknown):
    """`ids.T.real = ...` copies into the ids' memory (the real part of integers is themselves), through an attribute
    read (`ids.T`), not a call."""

    def forward(self, ids):
        ids.T.real = ids.T + 60
        return self.a(ids)


class RemainderIntoAConstantChanged(Buffered):
    """`buf` is made of constants: the trace adds 60 to it as it traces, and its graph has no add_."""

    def written(self, ids):
        buf = torch.zeros(1, 3, dtype=torch.long)
        held = torch.remainder(ids, 100, out=buf)
        buf.add_(60)
        return held


def test_ids_assigned_or_a_remainder_changed_outside_the_trace_are_not_followed():
    """Each python module was published bound 100 (DataAssigned and RealAssigned checked in [0, 100) per request too,
    refusing id -60, which the model takes): the trace's graph reads `ids` and the `% 100` as they were. TorchScript
    cannot script `.data =`; torch.export's program drops the assignment (it serves id 50), so its bound stands."""
    for cls, attr in ((DataAssigned, "data"), (RealAssigned, "real")):
        module = cls().eval()
        assert module(torch.full((1, 3), -60)).shape == (1, 3, 4)
        with pytest.raises(IndexError, match="index out of range"):
            module(torch.full((1, 3), 40))
        found = id_ranges(module, ["ids"], {"ids": torch.int64})
        assert (found.bounds, found.rows, found.least) == ({}, {}, {}), cls.__name__
        assert found.said() == (
            f"input 'ids' not checked: an assignment to .{attr} changes its ids in place, which wok does not follow"
        )
    module = RemainderIntoAConstantChanged().eval()
    module(torch.full((1, 3), 39))
    with pytest.raises(IndexError, match="index out of range"):
        module(torch.full((1, 3), 40))
    found = id_ranges(module, ["ids"], {"ids": torch.int64})
    assert (found.bounds, found.rows) == ({}, {"ids": 100})
    assert found.unpublished == {"ids": "it reaches the Embedding module through remainder, which wok does not follow"}


class SelectedInto(Unknown):
    """`torch.index_select(..., out=ids)` writes the first row doubled into the ids: 50 fails a, and [[10], [150]]
    is served (20)."""

    def forward(self, ids):
        torch.index_select(ids * 2, 0, torch.zeros(ids.size(0), dtype=torch.long), out=ids)
        return self.a(ids)


def test_ids_written_by_an_op_followed_given_out_are_not_checked():
    """The python form was published bound 100 and the scripted one checked in [0, 100) per request: index_select
    is followed (a part of its tensor), and its `out=` was not read."""
    module = SelectedInto().eval()
    assert module(torch.tensor([[10], [150]])).shape == (2, 1, 4)
    with pytest.raises(IndexError, match="index out of range"):
        module(torch.tensor([[50], [0]]))
    for kind, model in _forms(module, (torch.zeros(2, 3, dtype=torch.long),)).items():
        found = id_ranges(model, ["ids"], {"ids": torch.int64})
        assert (found.bounds, found.rows, found.least) == ({}, {}, {}), kind
        if kind != "exported":  # whose lookup reads the op's result: "through aten::index_select"
            op = "index_select" if kind == "python" else "aten::index_select"
            assert found.unclear == {"ids": f"{op} with out= changes its ids in place, which wok does not follow"}


class Tag:
    """An object of the model's own, which a trace cannot write into its graph as an argument."""


class Tagged(Unknown):
    """Attributes of the model's own set on the ids (and a shallow copy of them) change no id."""

    def forward(self, ids):
        ids.source = "request"
        ids.tag = Tag()
        return self.a(copy.copy(ids))


def test_an_attribute_set_on_the_ids_that_changes_no_id_keeps_the_bound():
    """98b143c recorded every attribute set on a proxy: `.source = "request"` left the ids not checked (an
    assignment taken for a change), `.tag = Tag()` and `copy.copy(ids)` (which sets the copy's `__dict__`) failed the
    trace (NotImplementedError, RecursionError), so the module's inputs were not checked at all."""
    module = Tagged().eval()
    assert module(torch.full((1, 3), 99)).shape == (1, 3, 4)
    with pytest.raises(IndexError, match="index out of range"):
        module(torch.full((1, 3), 100))
    found = id_ranges(module, ["ids"], {"ids": torch.int64})
    assert (found.bounds, found.rows, found.unclear) == ({"ids": 100}, {"ids": 100}, {})


class SelectedFromATableInto(nn.Module):
    """`torch.index_select(table, 0, ids, out=rows)`: a lookup of the ids as sent, its rows written into a tensor
    given, which a, the ids' other table, does not read."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Embedding(100, 4)
        self.table = nn.Parameter(torch.randn(80, 4))

    def forward(self, ids):
        rows = torch.empty(0, 4)
        torch.index_select(self.table, 0, ids.flatten(), out=rows)
        return self.a(ids).sum() + rows.sum()


def test_a_lookup_given_out_keeps_the_bound():
    """98b143c took no op given out= for a lookup: the python and scripted forms were left with no bound and not
    checked, though an id from 80 on fails the model and every one below is served."""
    module = SelectedFromATableInto().eval()
    with torch.inference_mode():  # as the server runs it: out= refuses a table that requires grad
        module(torch.full((1, 3), 79))
        with pytest.raises(IndexError, match="index out of range"):
            module(torch.full((1, 3), 80))
        forms = _forms(module, (torch.zeros(2, 3, dtype=torch.long),))
    for kind, model in forms.items():
        found = id_ranges(model, ["ids"], {"ids": torch.int64})
        assert (found.bounds, found.rows, found.unclear) == ({"ids": 80}, {"ids": 80}, {}), kind


class ModuleApplied(Unknown):
    """A leaf module of torch.nn (kept whole by torch.fx's trace) applied to the ids."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.applied = module

    def forward(self, ids):
        self.applied(ids)
        return self.a(ids)


class ModuleResultChanged(ModuleApplied):
    """What the leaf returns is the ids themselves or a view of them (nn.Identity, nn.Dropout in eval, nn.Flatten),
    changed in place."""

    def forward(self, ids):
        self.applied(ids).sub_(60)
        return self.a(ids)


def test_ids_changed_by_a_leaf_module_or_through_its_result_are_not_checked():
    """The python form was checked in [0, 100) per request (no bound published: "its ids reach Threshold"): the
    trace keeps a leaf module of torch.nn as one call_module node, and neither its inplace=True nor its result being
    the ids was read. Threshold(50, 150) makes id 10 into 150, past a's rows; ReLU serves id -5 (made 0); each
    result changed in place fails at 10 and serves 150. TorchScript and torch.export see the ops inside."""
    example = (torch.zeros(2, 3, dtype=torch.long),)
    threshold = ModuleApplied(nn.Threshold(50, 150, inplace=True)).eval()
    with pytest.raises(IndexError, match="index out of range"):
        threshold(torch.full((1, 3), 10))
    relu = ModuleApplied(nn.ReLU(inplace=True)).eval()
    assert relu(torch.full((1, 3), -5)).shape == (1, 3, 4)
    for module, op in ((threshold, "Threshold"), (relu, "ReLU")):
        found = id_ranges(module, ["ids"], {"ids": torch.int64})
        assert (found.bounds, found.rows, found.least) == ({}, {}, {}), op
        why = f"the {op} module (inplace=True) changes its ids in place, which wok does not follow"
        assert found.unclear == {"ids": why}, op
    for kind, model in _forms(relu, example).items():
        assert id_ranges(model, ["ids"], {"ids": torch.int64}).rows == {}, kind
    for leaf in (nn.Identity(), nn.Dropout(), nn.Flatten(0)):
        module = ModuleResultChanged(leaf).eval()
        assert module(torch.full((1, 3), 150)).shape == (1, 3, 4), leaf
        with pytest.raises(IndexError, match="index out of range"):
            module(torch.full((1, 3), 10))
        for kind, model in _forms(module, example).items():
            found = id_ranges(model, ["ids"], {"ids": torch.int64})
            assert (found.bounds, found.rows, found.least) == ({}, {}, {}), (leaf, kind)
            if kind == "python":
                assert found.unclear == {"ids": "sub_ changes its ids in place, which wok does not follow"}, leaf
    # A leaf that changes nothing keeps the server's check: every id still reaches a as sent. A dropout in place
    # changes nothing in eval, as served.
    for leaf in (nn.Dropout(), nn.Dropout(inplace=True)):
        kept = ModuleApplied(leaf).eval()
        for refused in (-1, 100):
            with pytest.raises(IndexError, match="index out of range"):
                kept(torch.full((1, 3), refused))
        assert id_ranges(kept, ["ids"], {"ids": torch.int64}).rows == {"ids": 100}, leaf


class RemappedInto(nn.Module):
    """`index_select(remap, 0, pos, out=ids.view(-1))` writes remap's values (the ids plus 60) into the ids, which a
    then looks up: id 40 fails a, though it is below remap's 80 rows."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Embedding(100, 4)
        self.register_buffer("remap", torch.arange(80) + 60)

    def forward(self, ids):
        flat = ids.view(-1)
        torch.index_select(self.remap, 0, flat.clone(), out=flat)
        return self.a(ids)


def test_ids_written_by_a_lookup_given_out_are_not_checked():
    """The exported program keeps `index_select.out` with its `out=`, which the walk of a lookup did not read: it
    was published bound 80 (python and TorchScript were not checked since 98b143c)."""
    module = RemappedInto().eval()
    assert module(torch.full((2, 3), 39)).shape == (2, 3, 4)
    with pytest.raises(IndexError, match="index out of range"):
        module(torch.full((2, 3), 40))
    for kind, model in _forms(module, (torch.zeros(2, 3, dtype=torch.long),)).items():
        found = id_ranges(model, ["ids"], {"ids": torch.int64})
        assert (found.bounds, found.rows, found.least) == ({}, {}, {}), kind
        op = "index_select" if kind == "python" else "aten::index_select"
        assert found.unclear == {"ids": f"{op} with out= changes its ids in place, which wok does not follow"}, kind


class Remapped(nn.Module):
    """`remap` (a buffer of integers, 80 rows) takes id i to i + 60, which `a` (100 rows) looks up: ids from 40 to
    79, below remap's rows, fail a. `f` holds the same values as floats."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Embedding(100, 4)
        self.register_buffer("remap", torch.arange(80) + 60)
        self.register_buffer("remap_weight", (torch.arange(80) + 60).unsqueeze(1))
        self.f = nn.Embedding(80, 1)
        with torch.no_grad():
            self.f.weight.copy_(self.remap_weight)


class RemapIndexed(Remapped):
    def forward(self, ids):
        return self.a(self.remap[ids])


class RemapSelected(Remapped):
    def forward(self, ids):
        return self.a(torch.index_select(self.remap, 0, ids.flatten()))


class RemapEmbedded(Remapped):  # F.embedding of an integer weight
    def forward(self, ids):
        return self.a(torch.nn.functional.embedding(ids, self.remap_weight).squeeze(-1))


class RemapAndDirect(Remapped):  # ids reach a as they are too
    def forward(self, ids):
        return self.a(self.remap[ids]) + self.a(ids)


class RemapSelectedInto(Remapped):  # remap's values written into a tensor given as out=
    def forward(self, ids):
        buf = torch.zeros(ids.numel(), dtype=torch.long)
        torch.index_select(self.remap, 0, ids.flatten(), out=buf)
        return self.a(buf)


class FloatsCast(Remapped):  # a float table's values cast to ids
    def forward(self, ids):
        return self.a(self.f(ids).squeeze(-1).long())


def test_the_values_of_a_table_that_reach_another_table_leave_no_bound():
    """The result of a lookup was taken as holding no ids: each was published bound 80, remap's (or f's) rows, and
    ids 40 to 79 fail a. remap's rows still fail ids from 80 on, so the server's check stands."""
    example = (torch.zeros(2, 3, dtype=torch.long),)
    cases = {
        RemapIndexed: "remap",
        RemapSelected: "remap",
        RemapEmbedded: "remap_weight",
        RemapAndDirect: "remap",
        RemapSelectedInto: "remap",
        FloatsCast: "f.weight",
    }
    for cls, table in cases.items():
        module = cls().eval()
        assert module(torch.full((1, 3), 39)).shape[-1] == 4, cls.__name__
        with pytest.raises(IndexError, match="index out of range"):
            module(torch.full((1, 3), 40))
        for kind, model in _forms(module, example).items():
            found = id_ranges(model, ["ids"], {"ids": torch.int64})
            assert (found.bounds, found.rows) == ({}, {"ids": 80}), (cls.__name__, kind)
            why = found.unpublished["ids"]
            assert "values of " in why and f"({table})" in why and why.endswith("which wok does not follow"), why


class RemapHashed(Remapped):  # remap's values `% 100`: within a's rows whatever they are
    def forward(self, ids):
        summed = self.f(ids).squeeze(-1).mul(2).relu().sum(-1, keepdim=True)
        return self.a(self.remap[ids] % 100) + self.a(summed.long() % 100)


class FloatsOn(Remapped):  # a float table's values through layers, no cast: no ids
    def forward(self, ids):
        return torch.nn.functional.layer_norm(self.f(ids) * 2, (1,)) + self.a(ids)


def test_the_values_of_a_table_within_another_tables_rows_or_never_cast_keep_the_bound():
    example = (torch.zeros(2, 3, dtype=torch.long),)
    for cls, bound in ((RemapHashed, 80), (FloatsOn, 80)):
        module = cls().eval()
        assert module(torch.full((1, 3), 79)).shape[-1] == 4, cls.__name__
        for kind, model in _forms(module, example).items():
            found = id_ranges(model, ["ids"], {"ids": torch.int64})
            assert (found.bounds, found.rows) == ({"ids": bound}, {"ids": bound}), (cls.__name__, kind)


class Ranked(nn.Module):
    """`r` (80 rows of 8 floats) peaks at column 0 for ids below 40 and at column 5 from 40 on: its argmax, or top
    index, taken as a position in `a`'s rows of 4 columns fails from id 40, below r's 80 rows. `f` holds 60 + id."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Embedding(100, 4)
        self.r = nn.Embedding(80, 8)
        self.f = nn.Embedding(80, 1)
        self.small = nn.Parameter(torch.randn(10, 4))
        with torch.no_grad():
            self.r.weight.zero_()
            self.r.weight[:40, 0] = 1.0
            self.r.weight[40:, 5] = 1.0
            self.f.weight.copy_((torch.arange(80) + 60).unsqueeze(1))


class TopGathered(Ranked):
    def forward(self, ids):
        return self.a(ids).gather(-1, self.r(ids).topk(1, dim=-1).indices)


class ArgmaxGathered(Ranked):
    def forward(self, ids):
        return self.a(ids).gather(-1, self.r(ids).argmax(-1, keepdim=True))


class MaxGathered(Ranked):
    def forward(self, ids):
        return self.a(ids).gather(-1, torch.max(self.r(ids), -1, keepdim=True)[1])


class SortGathered(Ranked):
    def forward(self, ids):
        return self.a(ids).gather(-1, self.r(ids).sort(-1, descending=True).indices[..., :1])


class FloatPicked(Ranked):  # TorchScript alone: torch.fx cannot trace int(), torch.export not guard on it
    def forward(self, ids):
        return self.a(ids) + self.small.select(0, int(self.f(ids)[0, 0, 0]) - 60)


class FloatIndexed(Ranked):
    def forward(self, ids):
        return self.a(ids) + self.small[int(self.f(ids)[0, 0, 0]) - 60]


class FloatTyped(Ranked):  # a python module alone: `type` is no cast wok reads, and a float is no position
    def forward(self, ids):
        return self.a(ids) + (self.small * 2)[self.f(ids)[..., 0].type(torch.int64) - 60]


def test_a_tables_floats_made_positions_by_an_op_not_a_cast_leave_no_bound():
    """A float table's values are no positions until cast (5c7c282), but an op makes integers of them too (top-k's
    or a max's indices, argmax, int()): these reached gather's index or select's position unread, and each was
    published bound 80, r's (or f's) rows, where ids from 40 (or 10) fail the model."""
    example = (torch.zeros(2, 3, dtype=torch.long),)
    forms = {}
    for cls in (TopGathered, ArgmaxGathered, MaxGathered, SortGathered):
        for kind, model in _forms(cls(), example).items():
            forms[cls.__name__, kind] = model
    for cls in (FloatPicked, FloatIndexed):
        forms[cls.__name__, "scripted"] = torch.jit.script(cls().eval())
    forms["FloatTyped", "python"] = FloatTyped().eval()
    for (name, kind), model in forms.items():
        run = model.module() if kind == "exported" else model
        assert run(torch.full((2, 3), 9)).shape[-1] in (1, 4), name
        with pytest.raises((RuntimeError, IndexError)):
            run(torch.full((2, 3), 40))
        found = id_ranges(model, ["ids"], {"ids": torch.int64})
        assert (found.bounds, found.rows) == ({}, {"ids": 80}), (name, kind)
        op = "gather" if name.endswith("Gathered") else "getitem" if name == "FloatTyped" else "select"
        assert op in found.unpublished["ids"], (name, kind, found.unpublished)


class Dequantized(nn.Module):
    """A row-wise int8 table and its scales, a table's values made floats before a layer: no positions."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Embedding(100, 4)
        self.register_buffer("q", torch.randint(-128, 128, (80, 4), dtype=torch.int8))
        self.register_buffer("scale", torch.rand(80, 1))
        self.register_buffer("counts", torch.randint(0, 1000, (80,)))
        self.head = nn.Linear(5, 1)

    def forward(self, ids):
        x = torch.nn.functional.layer_norm(self.q[ids].float() * self.scale[ids], (4,))
        counted = torch.log1p(self.counts[ids].to(torch.float32)).unsqueeze(-1)
        return self.head(torch.cat([x + self.a(ids), counted], -1))


class DequantizedCastBack(Dequantized):  # the floats made ids again: q's values, 0 to 127, fail a from 100
    def forward(self, ids):
        return self.a(self.q[ids][..., 0].float().abs().long())


def test_an_integer_tables_values_made_floats_keep_the_bound():
    """An integer table's values were followed as ids remapped (5c7c282) even once cast to floats: the layer norm (or,
    in a python module, the Linear) they reach took the bound, 80, which every id below serves."""
    module = Dequantized().eval()
    example = (torch.zeros(2, 3, dtype=torch.long),)
    assert module(torch.arange(80).view(1, 80)).shape == (1, 80, 1)
    for kind, model in _forms(module, example).items():
        found = id_ranges(model, ["ids"], {"ids": torch.int64})
        assert (found.bounds, found.rows) == ({"ids": 80}, {"ids": 80}), kind
    for kind, model in _forms(DequantizedCastBack(), example).items():
        found = id_ranges(model, ["ids"], {"ids": torch.int64})
        assert (found.bounds, found.rows) == ({}, {"ids": 80}), kind
        assert found.unpublished["ids"].endswith(
            "(q) cast by " + ("long" if kind == "python" else "aten::to") + ", which wok does not follow"
        ), found.unpublished
