"""`mlp`: a dense fp32 stack, the compute-bound demo model.

Every sample has the same shape, so it needs none of the batching hooks: the default
`Servable` stacks rows and runs the module on them.
"""

from __future__ import annotations

import torch
from torch import nn

from ..config import model_config_from_dict
from ..servable import Servable
from .limits import MAX_QUEUE_SIZE

NAME = "mlp"
SEED = 0x6D6C70


class MLP(nn.Module):
    """in_features -> hidden (x layers, ReLU after each) -> out_features."""

    def __init__(self, in_features: int, hidden: int, out_features: int, layers: int) -> None:
        super().__init__()
        blocks: list[nn.Module] = []
        width = in_features
        for _ in range(layers):
            blocks += [nn.Linear(width, hidden), nn.ReLU()]
            width = hidden
        blocks.append(nn.Linear(width, out_features))
        self.net = nn.Sequential(*blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def build(
    in_features: int = 256,
    hidden: int = 1024,
    out_features: int = 256,
    layers: int = 2,
    max_batch_size: int = 32,
    max_queue_delay_ms: float = 5.0,
    max_queue_size: int = MAX_QUEUE_SIZE,
) -> Servable:
    """The `mlp` demo model; `layers` counts the hidden layers."""
    for opt, value in (
        ("in_features", in_features),
        ("hidden", hidden),
        ("out_features", out_features),
    ):
        if value < 1:
            raise ValueError(f"{NAME}: {opt}: expected >= 1; got {value}")
    if layers < 0:
        raise ValueError(f"{NAME}: layers: expected >= 0; got {layers}")
    config = model_config_from_dict(
        {
            "name": NAME,
            "platform": "python",
            "factory": f"wok.models.{NAME}:build",
            "parameters": {
                "in_features": in_features,
                "hidden": hidden,
                "out_features": out_features,
                "layers": layers,
                "max_batch_size": max_batch_size,
                "max_queue_delay_ms": max_queue_delay_ms,
                "max_queue_size": max_queue_size,
            },
            "inputs": [{"name": "INPUT0", "datatype": "FP32", "dims": [in_features]}],
            "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "dims": [out_features]}],
            "max_batch_size": max_batch_size,
            "dynamic_batching": {"max_queue_delay_ms": max_queue_delay_ms, "max_queue_size": max_queue_size},
        },
        source=f"demo model {NAME}",
    )
    # Fixed weights make every server (and every test) give the same answers; fork_rng
    # puts the caller's global RNG back, and seeding only the CPU generator leaves CUDA's alone.
    with torch.random.fork_rng(devices=[]):
        torch.random.default_generator.manual_seed(SEED)
        module = MLP(in_features, hidden, out_features, layers)
    return Servable(config, module.eval(), platform_label="python")
