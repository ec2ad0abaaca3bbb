"""Id bounds of tensors made of the ids' shape alone (server/tables.py), each model small (vocab 100, width 8) in its
three forms: `torch.empty(ids.shape)` looked up (whatever its memory held: no bound is true, of any input),
`torch.full`/`torch.ones` of the shape (one value: the ids' bound stands), `torch.where(ids > 50, 1, 0)` (0 or 1:
within a 2-row table), and SDPA given an integer mask made of the ids (refused by every call, so at start)."""

from __future__ import annotations

import contextlib
import textwrap

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from wok.errors import ModelExecutionError, WarmupError
from wok.executor import Executor
from wok.repository import load_servable
from wok.tables import id_ranges

from .test_tables_encoders import EXAMPLE, I64, D, V, _forms, _serves_below_and_fails_at

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.:DeprecationWarning")


@contextlib.contextmanager
def memory_filled():
    """torch's deterministic mode, which fills what `torch.empty` makes with its dtype's largest value (int64's for
    ids): one of the values its memory may hold, the same on every call."""
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    assert torch.utils.deterministic.fill_uninitialized_memory
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was)


class Positions(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(V, D)
        self.pos = nn.Embedding(16, D)


class EmptyShaped(Positions):
    def forward(self, ids):
        return (self.tok(ids) + self.pos(torch.empty(ids.shape, dtype=torch.long))).sum(1)


class EmptySized(Positions):
    def forward(self, ids):
        return (self.tok(ids) + self.pos(torch.empty(ids.size(), dtype=torch.long))).sum(1)


class EmptyStrided(Positions):
    def forward(self, ids):
        return (self.tok(ids) + self.pos(torch.empty_strided(ids.size(), ids.stride(), dtype=torch.long))).sum(1)


class EmptyOfAnother(Positions):
    """What `empty` leaves is in no input's ids, yet fails the model at any of them: `other`'s bound is false too."""

    def forward(self, ids, other):
        return (self.tok(ids) + self.tok(other) + self.pos(torch.empty(ids.shape, dtype=torch.long))).sum(1)


class EmptyFloats(Positions):
    """Floats `empty` leaves through a layer, never positions: the bound stands."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(D)

    def forward(self, ids):
        x = self.tok(ids)
        return (x + self.norm(torch.empty(x.shape))).sum(1)


class Filled(Positions):
    def forward(self, ids):
        full = torch.full(ids.shape, 7, dtype=torch.long)
        return (self.tok(ids) + self.pos(full) + self.pos(torch.ones(ids.shape, dtype=torch.long))).sum(1)


CONFIG = """
platform = "torchscript"
model_file = "model.pt"
max_batch_size = 4

[[inputs]]
name = "ids"
datatype = "INT64"
dims = [5]

[[outputs]]
name = "out"
datatype = "FP32"
dims = [8]
"""


def _loaded(root, module: nn.Module):
    """`module` scripted, loaded as the server loads it (its bounds found, its config read)."""
    root.mkdir()
    torch.jit.script(module.eval()).save(str(root / "model.pt"))
    (root / "config.toml").write_text(CONFIG)
    return load_servable(root)


def ids_0_fail(servable, tries: int = 1) -> None:
    """A batch of ids 0, through a real Executor, fails at its table within `tries` batches (on what unset memory
    held, or a draw past the table), and `servable` published no bound for its ids."""
    executor = Executor(servable, servable.config.instances)
    try:
        batch = {"ids": np.zeros((2, 5), dtype=np.int64)}
        with pytest.raises(ModelExecutionError, match="index out of range"):
            for _ in range(tries):
                executor.instances[0].submit([batch], [2], 0).result(30)
    finally:
        executor.shutdown()
    assert (dict(servable.id_bounds), dict(servable.id_ranges)) == ({}, {"ids": V})


def test_a_lookup_of_what_empty_leaves_unset_publishes_no_bound(tmp_path):
    """`torch.empty(ids.shape)` reads the ids' shape alone, so nothing of it was followed: a bound of 100 was
    published, where a batch of ids 0 fails at the positions' table (16 rows) on what its memory held."""
    servable = _loaded(tmp_path / "empty", EmptyShaped())
    with memory_filled():
        ids_0_fail(servable)
    for cls in (EmptyShaped, EmptySized, EmptyStrided):
        for kind, model in _forms(cls()).items():
            found = id_ranges(model, ["ids"], I64)
            assert (found.bounds, found.rows) == ({}, {"ids": V}), (cls.__name__, kind)
            assert "leaves unset (whatever its memory held)" in found.unpublished["ids"], (kind, found.unpublished)
    both = {"ids": torch.int64, "other": torch.int64}
    for kind, model in _forms(EmptyOfAnother(), (torch.full((2, 5), 3), torch.full((2, 5), 4))).items():
        found = id_ranges(model, ["ids", "other"], both)
        assert (found.bounds, found.rows) == ({}, {"ids": V, "other": V}), kind


def test_a_constant_or_floats_made_of_the_ids_shape_keep_the_bound():
    """`torch.full(ids.shape, 7)`, `torch.ones(ids.shape)`: one value, below the 16 rows, whatever the ids; floats
    `empty` leaves through a layer norm are read as no position."""
    for cls in (Filled, EmptyFloats):
        for kind, model in _forms(cls()).items():
            found = id_ranges(model, ["ids"], I64)
            assert (found.bounds, found.rows) == ({"ids": V}, {"ids": V}), (cls.__name__, kind, found.unpublished)
    for model in _forms(Filled()).values():
        _serves_below_and_fails_at(model, V)


class Chosen(nn.Module):
    """`torch.where(ids > 50, 1, 0)` looked up in a 2-row table beside the ids themselves."""

    def __init__(self, flags: int = 2) -> None:
        super().__init__()
        self.tok = nn.Embedding(V, D)
        self.flag = nn.Embedding(flags, D)

    def forward(self, ids):
        return (self.tok(ids) + self.flag(torch.where(ids > 50, 1, 0))).sum(1)


class ChosenMade(Chosen):
    def forward(self, ids):
        flags = torch.where(ids > 50, ids.new_ones(ids.shape), ids.new_zeros(ids.shape))
        return (self.tok(ids) + self.flag(flags)).sum(1)


class ChosenLike(Chosen):
    def forward(self, ids):
        return (self.tok(ids) + self.flag(torch.where(ids > 50, torch.ones_like(ids), torch.zeros_like(ids)))).sum(1)


class ChosenOneRow(Chosen):
    def __init__(self) -> None:
        super().__init__(flags=1)


class ChosenIds(Chosen):  # the ids themselves where they pass 50: no 0 or 1
    def forward(self, ids):
        return (self.tok(ids) + self.flag(torch.where(ids > 50, ids, 0))).sum(1)


class ChosenChanged(Chosen):  # the ones changed in place first: 1 + the ids
    def forward(self, ids):
        ones = torch.ones_like(ids)
        ones.add_(ids)
        return (self.tok(ids) + self.flag(torch.where(ids > 50, 0, ones))).sum(1)


def test_a_choice_between_0_and_1_is_within_two_rows():
    """`torch.where(ids > 50, 1, 0)` was followed as the ids changed by an op not followed: no bound, where no id
    below 100 fails. Its 0 or 1 fits a 2-row table, as `(ids > 50).long()` does; not a 1-row one, nor where a way
    holds the ids or ones they changed."""
    for cls in (Chosen, ChosenMade, ChosenLike):
        for kind, model in _forms(cls()).items():
            found = id_ranges(model, ["ids"], I64)
            assert (found.bounds, found.rows) == ({"ids": V}, {"ids": V}), (cls.__name__, kind, found.unpublished)
            assert found.unclear["ids"].endswith("where of values below 2, within its 2 rows"), found.unclear
            _serves_below_and_fails_at(model, V)
    for cls, failing in ((ChosenOneRow, 51), (ChosenIds, 51), (ChosenChanged, 1)):
        module = cls().eval()
        with pytest.raises(IndexError):
            module(torch.full((2, 5), failing))
        for kind, model in _forms(module).items():
            found = id_ranges(model, ["ids"], I64)
            assert (found.bounds, found.rows) == ({}, {"ids": V}), (cls.__name__, kind)


class ChosenCached(Chosen):
    """The zeros chosen are kept as a module attribute, changed in place through it: 5 where ids pass 50."""

    def __init__(self) -> None:
        super().__init__()
        self.cache = torch.zeros(1, dtype=torch.long)

    def forward(self, ids):
        zeros = torch.zeros_like(ids)
        self.cache = zeros
        self.cache.add_(5)
        return (self.tok(ids) + self.flag(torch.where(ids > 50, zeros, 1))).sum(1)


def test_a_choice_changed_through_a_module_attribute_is_not_within_two_rows(tmp_path):
    """TorchScript's `self.cache = zeros; self.cache.add_(5)` changes `zeros` through the attribute read back: the
    choice was still taken for 0 or 1, a bound of 100 published, where ids 51 fail at the 2-row table."""
    servable = _loaded(tmp_path / "cached", ChosenCached())
    executor = Executor(servable, servable.config.instances)
    try:
        executor.instances[0].submit([{"ids": np.full((2, 5), 50, dtype=np.int64)}], [2], 0).result(30)
        with pytest.raises(ModelExecutionError, match="index out of range"):
            executor.instances[0].submit([{"ids": np.full((2, 5), 51, dtype=np.int64)}], [2], 0).result(30)
    finally:
        executor.shutdown()
    assert (dict(servable.id_bounds), dict(servable.id_ranges)) == ({}, {"ids": V}), servable.id_bounds
    found = id_ranges(ChosenCached().eval(), ["ids"], I64)  # torch.fx traces the attribute as `zeros` itself
    assert (found.bounds, found.rows) == ({}, {"ids": V}), found.unpublished


class IntegerMask(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(V, D)

    def forward(self, ids):
        x = self.tok(ids).unsqueeze(1)
        return F.scaled_dot_product_attention(x, x, x, attn_mask=ids[:, None, None, :]).sum((1, 2))


PYTHON_CONFIG = CONFIG.replace('platform = "torchscript"\nmodel_file = "model.pt"', 'platform = "python"\n'
                               'factory = "model:IntegerMask"')  # fmt: skip


def test_sdpa_given_an_integer_mask_made_of_the_ids_is_refused_at_start(tmp_path):
    """Its bound (100: attention reads its mask as no position) is never published: SDPA refuses an integer mask at
    every call, the start-up warm-up's zeros among them."""
    python = tmp_path / "python"
    python.mkdir()
    source = textwrap.dedent(
        """
        import torch
        import torch.nn.functional as F
        from torch import nn


        class IntegerMask(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.tok = nn.Embedding(100, 8)

            def forward(self, ids):
                x = self.tok(ids).unsqueeze(1)
                return F.scaled_dot_product_attention(x, x, x, attn_mask=ids[:, None, None, :]).sum((1, 2))
        """
    )
    (python / "model.py").write_text(source)
    (python / "config.toml").write_text(PYTHON_CONFIG)
    for servable in (load_servable(python), _loaded(tmp_path / "scripted", IntegerMask())):
        executor = Executor(servable, servable.config.instances)
        try:
            with pytest.raises(WarmupError, match="Expected attn_mask dtype to be bool or float"):
                executor.warmup()
        finally:
            executor.shutdown()
    with pytest.raises(RuntimeError, match="Expected attn_mask dtype to be bool or float"):
        torch.export.export(IntegerMask().eval(), EXAMPLE)
