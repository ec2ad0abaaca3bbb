"""A python model's call as served runs what torch.fx's trace does not read (server/tables.py): forward hooks and a
forward set on the module of a leaf of the trace (nn.Embedding, nn.MultiheadAttention) or of the model itself, whose
trace calls its class's forward. A hook that moves the ids (`ids + 60`) or reads a padding mask as positions had a
bound published (100) where ids from 40 (or every id) fail the model."""

from __future__ import annotations

import types

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from wok.tables import id_ranges

V, D = 100, 8
I64 = {"ids": torch.int64}


def _counted(mod, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None, **kwargs):
    """nn.MultiheadAttention's forward as a model patches it: a row's pad count looked up in `small` (2 rows)."""
    return query + mod.small[key_padding_mask.long().sum(-1)].unsqueeze(1), None


class PaddedAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(V, D)
        self.attn = nn.MultiheadAttention(D, 2, batch_first=True)
        self.attn.small = nn.Parameter(torch.randn(2, D))

    def forward(self, ids):
        x = self.tok(ids)
        return self.attn(x, x, x, key_padding_mask=ids == 0, need_weights=False)[0].sum(1)


def _pad_counted(mod, args, kwargs):
    return (_counted(mod, *args, **kwargs)[0], *args[1:]), kwargs


class Shifted(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(V, D)

    def forward(self, ids):
        return self.tok(ids)


def _shift(mod, args):
    return (args[0] + 60,)


def _fails_below_the_bound(module: nn.Module, ids: torch.Tensor) -> None:
    with pytest.raises(IndexError):
        module(ids)


def test_an_attention_module_patched_or_hooked_publishes_no_bound():
    module = PaddedAttention().eval()
    found = id_ranges(module, ["ids"], I64)
    assert (found.bounds, found.rows) == ({"ids": V}, {"ids": V})  # torch.nn's own: the mask is read as no position
    patched = PaddedAttention().eval()
    patched.attn.forward = types.MethodType(_counted, patched.attn)
    hooked = PaddedAttention().eval()
    hooked.attn.register_forward_pre_hook(_pad_counted, with_kwargs=True)
    for case, model in (("patched", patched), ("hooked", hooked)):
        _fails_below_the_bound(model, torch.tensor([[0, 0, 0, 5, 6]]))  # three pads: row 3 of 2
        found = id_ranges(model, ["ids"], I64)
        assert (found.bounds, found.rows) == ({}, {"ids": V}), case
        assert found.unpublished == {"ids": "its ids reach MultiheadAttention, which wok does not follow"}, case


def test_an_embedding_hooked_or_patched_or_a_model_hooked_is_not_read_as_its_class():
    hooked = Shifted().eval()
    hooked.tok.register_forward_pre_hook(_shift)
    patched = Shifted().eval()
    patched.tok.forward = types.MethodType(lambda mod, ids: F.embedding(ids + 60, mod.weight), patched.tok)
    for case, model in (("hooked", hooked), ("patched", patched)):
        _fails_below_the_bound(model, torch.full((2, 5), 40))
        found = id_ranges(model, ["ids"], I64)
        assert (found.bounds, found.rows) == ({}, {}), case
        assert found.unclear == {"ids": "it reaches Embedding, which wok does not follow"}, case
    outer = Shifted().eval()
    outer.register_forward_pre_hook(_shift)
    _fails_below_the_bound(outer, torch.full((2, 5), 40))
    found = id_ranges(outer, ["ids"], I64)
    assert (found.bounds, found.rows) == ({}, {})
    why = "its module cannot be traced as served (its call runs forward hooks or a forward set on it, not its class's)"
    assert found.unclear == {"ids": f"{why}, so what reaches its tables is not known"}
    # A hook every module's call runs, registered outside the model, and a torch.nn class's forward patched.
    plain = Shifted().eval()
    handle = nn.modules.module.register_module_forward_pre_hook(
        lambda mod, args: _shift(mod, args) if isinstance(mod, nn.Embedding) else None
    )
    try:
        _fails_below_the_bound(plain, torch.full((2, 5), 40))
        assert (id_ranges(plain, ["ids"], I64).bounds, id_ranges(plain, ["ids"], I64).rows) == ({}, {})
    finally:
        handle.remove()
    assert id_ranges(plain, ["ids"], I64).bounds == {"ids": V}


class PatchedEmbedding(nn.Embedding):
    """An nn.Embedding's class whose forward is patched, as a global patch of torch.nn's would be."""

    def __init__(self) -> None:
        super().__init__(V, D)


class ClassPatched(Shifted):
    def __init__(self) -> None:
        super().__init__()
        self.tok = PatchedEmbedding()


def test_a_torch_nn_class_whose_forward_is_patched_is_not_read_as_its_class(monkeypatch):
    # The class is made torch.nn's (a leaf of the trace) and its forward the model's: `nn.Embedding.forward = ...`.
    monkeypatch.setattr(PatchedEmbedding, "__module__", "torch.nn.modules.sparse")
    monkeypatch.setattr(PatchedEmbedding, "forward", lambda mod, ids: F.embedding(ids + 60, mod.weight))
    module = ClassPatched().eval()
    _fails_below_the_bound(module, torch.full((2, 5), 40))
    found = id_ranges(module, ["ids"], I64)
    assert (found.bounds, found.rows) == ({}, {})
    assert found.unclear == {"ids": "it reaches PatchedEmbedding, which wok does not follow"}
