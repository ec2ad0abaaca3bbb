"""The torch side of the V2 datatypes: dtypes, and numpy views that share memory."""

from __future__ import annotations

import numpy as np
import torch

from .datatypes import Datatype


def torch_dtype(dt: Datatype) -> torch.dtype:
    """The torch dtype for a V2 datatype; ValueError for BYTES, which torch cannot hold."""
    if dt.torch_name is None:
        raise ValueError(f"datatype {dt.name} has no torch dtype")
    return getattr(torch, dt.torch_name)


def to_numpy_view(t: torch.Tensor) -> np.ndarray:
    """A numpy view of a CPU tensor; bfloat16 is viewed as its uint16 words."""
    if t.dtype == torch.bfloat16:
        t = t.view(torch.uint16)
    return t.numpy()


def from_numpy(a: np.ndarray, dt: Datatype) -> torch.Tensor:
    """A tensor sharing a's memory, reinterpreted as dt's torch dtype (BF16 from uint16)."""
    t = torch.from_numpy(a)
    if dt.name == "BF16":
        t = t.view(torch.bfloat16)
    return t
