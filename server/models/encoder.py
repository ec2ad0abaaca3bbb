"""`encoder`: a small transformer encoder over variable-length token sequences.

Requests are batched by length bucket (powers of two from 8 up to the maximum length)
and padded to the longest sequence actually in the batch, so padding wastes at most
about half of a batch. Padding is masked out of attention and out of the pooling, so a
request's embedding does not depend on what it was batched with.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np
import torch
from torch import nn

from ..config import model_config_from_dict
from ..errors import InvalidInput
from ..servable import HostBuffers, Servable
from ..tensors import to_numpy_view
from .limits import MAX_QUEUE_SIZE

NAME = "encoder"
SEED = 0x656E63
SMALLEST_BUCKET = 8
# Clients that know only the metadata send small random ids; the vocabulary must cover them.
MIN_VOCAB = 50
PAD_ID = 0


def length_bucket(length: int, max_length: int) -> int:
    """The smallest power of two >= length (at least 8), capped at max_length."""
    bucket = max(SMALLEST_BUCKET, 1 << max(length - 1, 0).bit_length())
    return min(bucket, max_length)


class Encoder(nn.Module):
    """Token + learned position embeddings, a TransformerEncoder, mean over real tokens."""

    def __init__(
        self,
        vocab: int,
        max_length: int,
        d_model: int,
        nhead: int,
        layers: int,
        dim_feedforward: int,
    ) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, d_model)
        self.positions = nn.Embedding(max_length, d_model)
        # nn.Embedding's N(0, 1) would swamp the attention block's residual at this width.
        nn.init.normal_(self.tokens.weight, std=0.02)
        nn.init.normal_(self.positions.weight, std=0.02)
        layer = nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward, dropout=0.0, batch_first=True)
        # Nested tensors would drop padded positions in a layout that varies with the
        # batch; a dense padded batch plus the key mask keeps results batch-independent.
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        padding = positions.unsqueeze(0) >= lengths.unsqueeze(1)
        x = self.tokens(tokens) + self.positions(positions)
        h = self.encoder(x, src_key_padding_mask=padding)
        real = (~padding).unsqueeze(-1).to(h.dtype)
        return (h * real).sum(dim=1) / lengths.unsqueeze(1).to(h.dtype)


class EncoderServable(Servable):
    def __init__(self, config, module: Encoder, vocab: int, max_length: int) -> None:
        super().__init__(config, module, platform_label="python")
        self.vocab = vocab
        self.max_length = max_length

    def check(self, inputs: dict[str, np.ndarray]) -> None:
        tokens = inputs["tokens"]
        length = tokens.shape[1]
        if length < 1:
            raise InvalidInput("input 'tokens': expected a sequence length of at least 1; got 0")
        if length > self.max_length:
            raise InvalidInput(f"input 'tokens': expected a sequence length of at most {self.max_length}; got {length}")
        if tokens.size == 0:
            return
        lo, hi = int(tokens.min()), int(tokens.max())
        if lo < 0 or hi >= self.vocab:
            raise InvalidInput(f"input 'tokens': expected token ids in [0, {self.vocab}); got values from {lo} to {hi}")

    def batch_key(self, inputs: dict[str, np.ndarray]) -> Hashable:
        return length_bucket(inputs["tokens"].shape[1], self.max_length)

    def assemble(
        self, requests: Sequence[dict[str, np.ndarray]], rows: int, buffers: HostBuffers
    ) -> dict[str, torch.Tensor]:
        longest = max(req["tokens"].shape[1] for req in requests)
        tokens = buffers.get("tokens", (rows, longest), torch.int64)
        lengths = buffers.get("lengths", (rows,), torch.int64)
        tokens_v, lengths_v = to_numpy_view(tokens), to_numpy_view(lengths)
        r = 0
        for req in requests:
            n, length = req["tokens"].shape
            tokens_v[r : r + n, :length] = req["tokens"]
            # The buffer is reused across batches: stale ids must not stay in the padding.
            tokens_v[r : r + n, length:] = PAD_ID
            lengths_v[r : r + n] = length
            r += n
        return {"tokens": tokens, "lengths": lengths}

    def forward(self, module: nn.Module, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return self.name_outputs(module(tensors["tokens"], tensors["lengths"]))


def build(
    vocab: int = 1000,
    max_length: int = 256,
    d_model: int = 128,
    nhead: int = 4,
    layers: int = 2,
    dim_feedforward: int = 256,
    max_batch_size: int = 32,
    max_queue_delay_ms: float = 5.0,
    max_queue_size: int = MAX_QUEUE_SIZE,
) -> Servable:
    """The `encoder` demo model: `layers` transformer layers of width `d_model`."""
    if vocab < MIN_VOCAB:
        raise ValueError(f"{NAME}: vocab: expected >= {MIN_VOCAB}; got {vocab}")
    for opt, value in (
        ("max_length", max_length),
        ("d_model", d_model),
        ("nhead", nhead),
        ("layers", layers),
        ("dim_feedforward", dim_feedforward),
    ):
        if value < 1:
            raise ValueError(f"{NAME}: {opt}: expected >= 1; got {value}")
    if d_model % nhead:
        raise ValueError(f"{NAME}: d_model: expected a multiple of nhead ({nhead}); got {d_model}")
    config = model_config_from_dict(
        {
            "name": NAME,
            "platform": "python",
            "factory": f"wok.models.{NAME}:build",
            "parameters": {
                "vocab": vocab,
                "max_length": max_length,
                "d_model": d_model,
                "nhead": nhead,
                "layers": layers,
                "dim_feedforward": dim_feedforward,
                "max_batch_size": max_batch_size,
                "max_queue_delay_ms": max_queue_delay_ms,
                "max_queue_size": max_queue_size,
            },
            "inputs": [{"name": "tokens", "datatype": "INT64", "dims": [-1]}],
            "outputs": [{"name": "embedding", "datatype": "FP32", "dims": [d_model]}],
            "max_batch_size": max_batch_size,
            "dynamic_batching": {"max_queue_delay_ms": max_queue_delay_ms, "max_queue_size": max_queue_size},
        },
        source=f"demo model {NAME}",
    )
    # Fixed weights make every server give the same answers; fork_rng restores the
    # caller's global RNG, and seeding only the CPU generator leaves CUDA's alone.
    with torch.random.fork_rng(devices=[]):
        torch.random.default_generator.manual_seed(SEED)
        module = Encoder(vocab, max_length, d_model, nhead, layers, dim_feedforward)
    return EncoderServable(config, module.eval(), vocab, max_length)
