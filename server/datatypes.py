"""The V2 protocol's tensor datatypes and how each maps to numpy, torch and the protobuf.

BF16 has no numpy dtype: its raw bytes travel as uint16 words and are reinterpreted as
torch.bfloat16 on the way into the model (and back on the way out). BYTES tensors hold
length-prefixed byte strings; they are decoded into numpy object arrays.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class Datatype:
    name: str
    numpy: np.dtype
    torch: torch.dtype | None
    # Field of InferTensorContents that carries this type when it is not sent raw;
    # None where the protocol has none (FP16, BF16 travel raw only).
    contents_field: str | None
    # Value of Triton's DataType enum (model_config.proto) for ModelConfig responses.
    config_enum: int

    @property
    def itemsize(self) -> int:
        return self.numpy.itemsize


_TABLE = [
    Datatype("BOOL", np.dtype(np.bool_), torch.bool, "bool_contents", 1),
    Datatype("UINT8", np.dtype(np.uint8), torch.uint8, "uint_contents", 2),
    Datatype("UINT16", np.dtype(np.uint16), torch.uint16, "uint_contents", 3),
    Datatype("UINT32", np.dtype(np.uint32), torch.uint32, "uint_contents", 4),
    Datatype("UINT64", np.dtype(np.uint64), torch.uint64, "uint64_contents", 5),
    Datatype("INT8", np.dtype(np.int8), torch.int8, "int_contents", 6),
    Datatype("INT16", np.dtype(np.int16), torch.int16, "int_contents", 7),
    Datatype("INT32", np.dtype(np.int32), torch.int32, "int_contents", 8),
    Datatype("INT64", np.dtype(np.int64), torch.int64, "int64_contents", 9),
    Datatype("FP16", np.dtype(np.float16), torch.float16, None, 10),
    Datatype("FP32", np.dtype(np.float32), torch.float32, "fp32_contents", 11),
    Datatype("FP64", np.dtype(np.float64), torch.float64, "fp64_contents", 12),
    Datatype("BYTES", np.dtype(object), None, "bytes_contents", 13),
    Datatype("BF16", np.dtype(np.uint16), torch.bfloat16, None, 14),
]

DATATYPES: dict[str, Datatype] = {d.name: d for d in _TABLE}

_BY_TORCH = {d.torch: d for d in _TABLE if d.torch is not None and d.name != "UINT16"}
_BY_TORCH[torch.uint16] = DATATYPES["UINT16"]


def datatype(name: str) -> Datatype:
    """The Datatype called `name` (as the protocol spells it, e.g. "FP32")."""
    try:
        return DATATYPES[name]
    except KeyError:
        raise ValueError(f"unknown datatype {name!r}; expected one of {', '.join(DATATYPES)}") from None


def from_torch(dtype: torch.dtype) -> Datatype:
    try:
        return _BY_TORCH[dtype]
    except KeyError:
        raise ValueError(f"torch dtype {dtype} has no V2 datatype") from None


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
