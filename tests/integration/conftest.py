"""A model repository made on the fly: a slow doubling model loaded through a Python factory."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

SLOW_MODEL = textwrap.dedent(
    """
    import time

    import torch
    from torch import nn


    class SlowDouble(nn.Module):
        # Sleeps per batch so that a burst really queues; raises on NaN so tests can make a
        # batch fail on purpose.
        def __init__(self, sleep_ms: float) -> None:
            super().__init__()
            self.sleep_s = sleep_ms / 1e3

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            time.sleep(self.sleep_s)
            if torch.isnan(x).any():
                raise ValueError("NaN in batch")
            return x * 2


    def build(sleep_ms: float = 20.0) -> nn.Module:
        return SlowDouble(sleep_ms)
    """
)


def write_slow_model(root: Path, name="slow", *, sleep_ms=20.0, max_batch_size=4, delay_ms=1.0, max_queue_size=0) -> Path:
    d = root / name
    d.mkdir(parents=True)
    (d / "model.py").write_text(SLOW_MODEL)
    (d / "config.toml").write_text(
        textwrap.dedent(
            f"""
            platform = "python"
            factory = "model:build"
            max_batch_size = {max_batch_size}
            parameters = {{ sleep_ms = {sleep_ms} }}

            [[inputs]]
            name = "INPUT0"
            datatype = "FP32"
            dims = [4]

            [[outputs]]
            name = "OUTPUT0"
            datatype = "FP32"
            dims = [4]

            [dynamic_batching]
            max_queue_delay_ms = {delay_ms}
            max_queue_size = {max_queue_size}

            [instances]
            devices = ["cpu"]
            """
        )
    )
    return root


@pytest.fixture
def slow_repository(tmp_path):
    """`slow_repository(**options)` → a repository folder holding the slow model."""

    def make(**options) -> Path:
        return write_slow_model(tmp_path / "repo", **options)

    return make
