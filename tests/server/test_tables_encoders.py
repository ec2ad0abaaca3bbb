"""Id bounds of common transformer-encoder forms (server/tables.py), each model small (vocab 100, width 8) in its
three forms: a padding mask made of the ids given to attention, BERT's token types made from the ids' shape, HF's
`inputs_embeds=None` way, a comparison's 0 or 1 looked up. Each lost its true bound (no `bounds`, and some no `rows`)
where no id below it fails the model; each bound found is checked on every id below it, and an id at it fails."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from wok.tables import id_ranges

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.:DeprecationWarning", "ignore:enable_nested_tensor")

V, D = 100, 8
I64 = {"ids": torch.int64}
EXAMPLE = (torch.full((2, 5), 3),)


def _forms(module: nn.Module, example: tuple = EXAMPLE) -> dict:
    module = module.eval()
    return {
        "python": module,
        "scripted": torch.jit.script(module),
        "exported": torch.export.export(module, example),
    }


def _serves_below_and_fails_at(model, bound: int) -> None:
    """Every id below `bound` runs the model (in batches of the exported form's shape, 2 x 5), one at it fails."""
    run = model.module() if isinstance(model, torch.export.ExportedProgram) else model
    for batch in torch.arange(bound).view(-1, 2, 5):
        run(batch)
    with pytest.raises((IndexError, RuntimeError)):
        run(torch.full((2, 5), bound))


class PadMaskEncoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(V, D)
        layer = nn.TransformerEncoderLayer(D, 2, 16, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)

    def forward(self, ids):
        return self.enc(self.tok(ids), src_key_padding_mask=ids == 0).sum(1)


class PadMaskLayer(PadMaskEncoder):
    def forward(self, ids):
        return self.enc.layers[0](self.tok(ids), src_key_padding_mask=ids == 0).sum(1)


class PadMaskAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(V, D)
        self.attn = nn.MultiheadAttention(D, 2, batch_first=True)

    def forward(self, ids):
        x = self.tok(ids)
        return self.attn(x, x, x, key_padding_mask=ids == 0, need_weights=False)[0].sum(1)


class PadMaskSdpa(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(V, D)

    def forward(self, ids):
        x = self.tok(ids).unsqueeze(1)
        return F.scaled_dot_product_attention(x, x, x, attn_mask=ids.ne(0)[:, None, None, :]).sum(2)


def test_a_padding_mask_made_of_the_ids_given_to_attention_keeps_the_bound():
    """The mask reached nn.TransformerEncoder (a leaf of torch.fx's trace), F.scaled_dot_product_attention or
    nn.MultiheadAttention's ops, not followed: no bound published, where attention reads a mask as no position."""
    for cls in (PadMaskEncoder, PadMaskLayer, PadMaskAttention, PadMaskSdpa):
        for kind, model in _forms(cls()).items():
            found = id_ranges(model, ["ids"], I64)
            if kind == "scripted" and cls in (PadMaskEncoder, PadMaskLayer):
                # TorchScript's inlined TransformerEncoderLayer: branches on the mask (its fast path's checks) whose
                # ways mix it into the hidden floats are not followed: checked per request, no bound.
                assert (found.bounds, found.rows) == ({}, {"ids": V}), (cls.__name__, kind)
                continue
            assert (found.bounds, found.rows) == ({"ids": V}, {"ids": V}), (cls.__name__, kind, found.unpublished)
            _serves_below_and_fails_at(model, V)


class PadCounted(nn.TransformerEncoderLayer):
    """A layer of the model's own: it reads the mask as positions, a row's pad count in `small` (2 rows)."""

    def __init__(self) -> None:
        super().__init__(D, 2, 16, dropout=0.0, batch_first=True)
        self.small = nn.Parameter(torch.randn(2, D))

    def forward(self, src, src_mask=None, src_key_padding_mask=None, is_causal=False):
        return src + self.small[src_key_padding_mask.long().sum(-1)].unsqueeze(1)


class OwnLayerEncoder(PadMaskEncoder):
    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.TransformerEncoder(PadCounted(), 1, enable_nested_tensor=False)


def test_a_torch_nn_attention_module_holding_a_layer_of_the_models_own_publishes_no_bound():
    module = OwnLayerEncoder().eval()
    with pytest.raises(IndexError):
        module(torch.tensor([[0, 0, 0, 5, 6]]))  # ids below 100: three pads
    found = id_ranges(module, ["ids"], I64)
    assert (found.bounds, found.rows) == ({}, {"ids": V})
    assert found.unpublished == {"ids": "its ids reach TransformerEncoder, which wok does not follow"}
    # A layer of torch.nn's given an activation of the model's own: its code is not read either.
    module.enc = nn.TransformerEncoder(
        nn.TransformerEncoderLayer(D, 2, 16, activation=lambda x: x.relu(), batch_first=True), 1
    )
    assert id_ranges(module.eval(), ["ids"], I64).bounds == {}


class PadCut(nn.Module):
    """F.pad by amounts made of the ids: a cut past its width of 8 fails (ids from 9)."""

    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(V, D)

    def forward(self, ids):
        return F.pad(self.tok(ids), [0, -int(ids[0, 0])])


def test_ids_read_as_pad_amounts_leave_no_bound():
    """aten::pad's tensor is not read (a padding mask padded by F.multi_head_attention_forward); its amounts are."""
    module = torch.jit.script(PadCut().eval())
    with pytest.raises(RuntimeError):
        module(torch.full((2, 5), 9))
    found = id_ranges(module, ["ids"], I64)
    assert (found.bounds, found.rows) == ({}, {"ids": V})
    assert found.unpublished == {"ids": "its ids reach aten::pad, which wok does not follow"}


class TokenTypes(nn.Module):
    """BERT's embeddings: token types all 0 (`zeros_like`) in a 2-row table, positions expanded to the ids' shape."""

    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(V, D)
        self.types = nn.Embedding(2, D)
        self.pos = nn.Embedding(16, D)

    def forward(self, ids):
        positions = torch.arange(ids.size(1), device=ids.device).unsqueeze(0).expand_as(ids)
        return self.tok(ids) + self.types(torch.zeros_like(ids)) + self.pos(positions)


class TokenTypesNew(TokenTypes):
    def forward(self, ids):
        return self.tok(ids) + self.types(ids.new_zeros(ids.shape)) + self.types(torch.ones_like(ids))


class TypeFilled(TokenTypes):  # the fill value is an id: read
    def forward(self, ids):
        return self.tok(ids) + self.types(ids.new_full(ids.shape, ids[0, 0].item()))


class TypesUninitialised(TokenTypes):  # whatever the memory held: no id is sure to run
    def forward(self, ids):
        return self.tok(ids) + self.types(torch.empty_like(ids)) + self.types(ids.new_empty(ids.shape))


def test_token_types_made_from_the_ids_shape_keep_the_bound():
    """`zeros_like(ids)` and `expand_as(ids)` read the ids' shape alone; they were followed as the ids changed."""
    for cls in (TokenTypes, TokenTypesNew):
        for kind, model in _forms(cls()).items():
            found = id_ranges(model, ["ids"], I64)
            assert (found.bounds, found.rows) == ({"ids": V}, {"ids": V}), (cls.__name__, kind, found.unclear)
            _serves_below_and_fails_at(model, V)
    module = TypeFilled().eval()
    with pytest.raises(IndexError):
        module(torch.full((2, 5), 2))
    for kind, model in {"python": module, "scripted": torch.jit.script(module)}.items():
        found = id_ranges(model, ["ids"], I64)
        assert (found.bounds, found.rows) == ({}, {"ids": V}), kind
    # empty_like's and new_empty's were read as zeros_like's, and a bound of 100 published for a lookup of what
    # their memory held.
    for kind, model in _forms(TypesUninitialised()).items():
        found = id_ranges(model, ["ids"], I64)
        assert (found.bounds, found.rows) == ({}, {"ids": V}), kind
        assert "empty_like" in found.unpublished["ids"], (kind, found.unpublished)


class HfEmbeds(nn.Module):
    """HF's embeddings: looked up unless the caller gives its own, which the server never does."""

    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(V, D)

    def forward(self, ids, inputs_embeds: torch.Tensor | None = None):
        if inputs_embeds is None:
            inputs_embeds = self.tok(ids)
        return inputs_embeds.sum(1)


class DefaultWay(nn.Module):
    """Served with `extra` None: ids reach `small` (10 rows); the other way, `big` (100)."""

    def __init__(self) -> None:
        super().__init__()
        self.small = nn.Embedding(10, D)
        self.big = nn.Embedding(V, D)

    def forward(self, ids, extra: torch.Tensor | None = None):
        if extra is None:
            return self.small(ids)
        return self.big(ids) + extra


def test_forward_is_read_the_way_served_with_its_parameters_after_the_inputs_at_their_defaults():
    """torch.fx's trace took `inputs_embeds` for a tensor (a proxy is not None) and followed the way never served:
    HF's lookup was not seen, and DefaultWay published big's 100, where ids from 10 fail. TorchScript read the
    lookup as under a condition: a bound, no check."""
    module = DefaultWay().eval()
    with pytest.raises(IndexError):
        module(torch.full((2, 5), 50))
    for cls, rows in ((HfEmbeds, V), (DefaultWay, 10)):
        for kind, model in _forms(cls()).items():
            found = id_ranges(model, ["ids"], I64)
            assert (found.bounds, found.rows) == ({"ids": rows}, {"ids": rows}), (cls.__name__, kind)
            _serves_below_and_fails_at(model, rows)


class Compared(nn.Module):
    """A comparison's 0 or 1 looked up in a 2-row table beside the ids themselves."""

    def __init__(self, flags: int = 2) -> None:
        super().__init__()
        self.tok = nn.Embedding(V, D)
        self.flag = nn.Embedding(flags, D)

    def forward(self, ids):
        return self.tok(ids) + self.flag((ids > 50).long())


class ComparedOneRow(Compared):
    def __init__(self) -> None:
        super().__init__(flags=1)


class BytesAnded(Compared):  # uint8 ids are taken as a mask by `table[ids]`, but are no 0 or 1
    def forward(self, ids):
        return self.tok(ids.long()) + self.flag((ids & ids).long())


def test_a_comparison_cast_to_integers_is_within_two_rows():
    """`(ids > 50).long()` was followed as the ids changed by a cast: no bound. It holds 0 or 1 whatever the ids:
    within a 2-row table, not a bound of 2 for the ids, nor one past a 1-row table."""
    for kind, model in _forms(Compared()).items():
        found = id_ranges(model, ["ids"], I64)
        assert (found.bounds, found.rows) == ({"ids": V}, {"ids": V}), (kind, found.unpublished)
        assert found.unclear["ids"].endswith("of a mask (0 or 1), within its 2 rows"), found.unclear
        _serves_below_and_fails_at(model, V)
    module = ComparedOneRow().eval()
    with pytest.raises(IndexError):
        module(torch.full((2, 5), 51))
    for kind, model in _forms(module).items():
        found = id_ranges(model, ["ids"], I64)
        assert (found.bounds, found.rows) == ({}, {"ids": V}), kind
    module = BytesAnded().eval()
    with pytest.raises(IndexError):
        module(torch.full((2, 5), 2, dtype=torch.uint8))
    for kind, model in _forms(module, (torch.full((2, 5), 3, dtype=torch.uint8),)).items():
        found = id_ranges(model, ["ids"], {"ids": torch.uint8})
        assert (found.bounds, found.rows) == ({}, {"ids": V}), kind
