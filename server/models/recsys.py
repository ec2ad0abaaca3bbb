"""`recsys`: a memory-bound recommender, one large embedding table and a small MLP.

Each sample brings dense features and a variable number of ids. `nn.EmbeddingBag` reads
ids flat with per-sample offsets, so requests with different id counts need no padding
and can all share one batch.

Memory-bound by construction: per sample with k ids, the gathers read k·dim fp32 values
while the top MLP does 2·(2·dim)·hidden FLOPs, so FLOPs per byte grow like hidden/(2k).
With the default hidden = 8 a sample with 16 ids (the bench's default size) does about
4,700 FLOPs for about 7,000 bytes: intensity 0.66 at batch 64, below 1 at every batch size
from 4 ids per sample up (`wok profile recsys`, docs/profile.md). A 256-wide top MLP made
the model compute-heavy instead (intensity 4.5 at batch 32).
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

NAME = "recsys"
SEED = 0x726563
# Clients that know only the metadata send small random ids; the table must cover them.
MIN_TABLE_ROWS = 50


class Recsys(nn.Module):
    """score = sigmoid(top(concat(relu(W dense), sum of the sample's embeddings)))."""

    def __init__(self, num_embeddings: int, dim: int, dense_features: int, hidden: int) -> None:
        super().__init__()
        self.table = nn.EmbeddingBag(num_embeddings, dim, mode="sum")
        # Sums of N(0, 1) rows over dozens of ids would saturate the sigmoid.
        nn.init.normal_(self.table.weight, std=0.05)
        self.bottom = nn.Sequential(nn.Linear(dense_features, dim), nn.ReLU())
        self.top = nn.Sequential(nn.Linear(2 * dim, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, dense: torch.Tensor, ids: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        pooled = self.table(ids, offsets)
        return torch.sigmoid(self.top(torch.cat([self.bottom(dense), pooled], dim=1)))


class RecsysServable(Servable):
    def __init__(self, config, module: Recsys, num_embeddings: int) -> None:
        super().__init__(config, module, platform_label="python")
        self.num_embeddings = num_embeddings

    def check(self, inputs: dict[str, np.ndarray]) -> None:
        ids = inputs["ids"]
        if ids.size == 0:
            return
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= self.num_embeddings:
            raise InvalidInput(f"input 'ids': expected ids in [0, {self.num_embeddings}); got values from {lo} to {hi}")

    def batch_key(self, inputs: dict[str, np.ndarray]) -> Hashable:
        return None

    def assemble(
        self, requests: Sequence[dict[str, np.ndarray]], rows: int, buffers: HostBuffers
    ) -> dict[str, torch.Tensor]:
        total_ids = sum(req["ids"].size for req in requests)
        features = requests[0]["dense"].shape[1]
        dense = buffers.get("dense", (rows, features), torch.float32)
        ids = buffers.get("ids", (total_ids,), torch.int64)
        offsets = buffers.get("offsets", (rows,), torch.int64)
        dense_v, ids_v, offsets_v = to_numpy_view(dense), to_numpy_view(ids), to_numpy_view(offsets)
        r = i = 0
        for req in requests:
            n, per_row = req["ids"].shape
            dense_v[r : r + n] = req["dense"]
            ids_v[i : i + n * per_row] = req["ids"].reshape(-1)
            offsets_v[r : r + n] = np.arange(i, i + n * per_row, per_row) if per_row else i
            r += n
            i += n * per_row
        return {"dense": dense, "ids": ids, "offsets": offsets}

    def forward(self, module: nn.Module, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return self.name_outputs(module(tensors["dense"], tensors["ids"], tensors["offsets"]))


def build(
    num_embeddings: int = 200_000,
    dim: int = 64,
    dense_features: int = 13,
    hidden: int = 8,
    max_batch_size: int = 64,
    max_queue_delay_ms: float = 2.0,
    max_queue_size: int = MAX_QUEUE_SIZE,
) -> Servable:
    """The `recsys` demo model: `num_embeddings` x `dim` table, `dense_features` dense inputs."""
    if num_embeddings < MIN_TABLE_ROWS:
        raise ValueError(f"{NAME}: num_embeddings: expected >= {MIN_TABLE_ROWS}; got {num_embeddings}")
    for opt, value in (("dim", dim), ("dense_features", dense_features), ("hidden", hidden)):
        if value < 1:
            raise ValueError(f"{NAME}: {opt}: expected >= 1; got {value}")
    config = model_config_from_dict(
        {
            "name": NAME,
            "platform": "python",
            "factory": f"wok.models.{NAME}:build",
            "parameters": {
                "num_embeddings": num_embeddings,
                "dim": dim,
                "dense_features": dense_features,
                "hidden": hidden,
                "max_batch_size": max_batch_size,
                "max_queue_delay_ms": max_queue_delay_ms,
                "max_queue_size": max_queue_size,
            },
            "inputs": [
                {"name": "dense", "datatype": "FP32", "dims": [dense_features]},
                {"name": "ids", "datatype": "INT64", "dims": [-1]},
            ],
            "outputs": [{"name": "score", "datatype": "FP32", "dims": [1]}],
            "max_batch_size": max_batch_size,
            "dynamic_batching": {"max_queue_delay_ms": max_queue_delay_ms, "max_queue_size": max_queue_size},
        },
        source=f"demo model {NAME}",
    )
    # Fixed weights make every server give the same answers; fork_rng restores the
    # caller's global RNG, and seeding only the CPU generator leaves CUDA's alone.
    with torch.random.fork_rng(devices=[]):
        torch.random.default_generator.manual_seed(SEED)
        module = Recsys(num_embeddings, dim, dense_features, hidden)
    return RecsysServable(config, module.eval(), num_embeddings)
