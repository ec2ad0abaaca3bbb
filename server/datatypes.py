"""The V2 protocol's tensor datatypes and how each maps to numpy and the protobuf.

Numpy only, so that the client library does not pay for importing torch; the torch side
is in tensors.py. BF16 has no numpy dtype: its raw bytes travel as uint16 words and are
reinterpreted as torch.bfloat16 on the way into the model (and back on the way out).
BYTES tensors hold length-prefixed byte strings, decoded into numpy object arrays.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Datatype:
    name: str
    numpy: np.dtype
    # Name of the torch dtype (an attribute of the torch module); None where torch has none.
    torch_name: str | None
    # Field of InferTensorContents that carries this type when it is not sent raw;
    # None where the protocol has none (FP16, BF16 travel raw only).
    contents_field: str | None
    # Value of Triton's DataType enum (model_config.proto) for ModelConfig responses.
    config_enum: int

    @property
    def itemsize(self) -> int:
        return self.numpy.itemsize


_TABLE = [
    Datatype("BOOL", np.dtype(np.bool_), "bool", "bool_contents", 1),
    Datatype("UINT8", np.dtype(np.uint8), "uint8", "uint_contents", 2),
    Datatype("UINT16", np.dtype(np.uint16), "uint16", "uint_contents", 3),
    Datatype("UINT32", np.dtype(np.uint32), "uint32", "uint_contents", 4),
    Datatype("UINT64", np.dtype(np.uint64), "uint64", "uint64_contents", 5),
    Datatype("INT8", np.dtype(np.int8), "int8", "int_contents", 6),
    Datatype("INT16", np.dtype(np.int16), "int16", "int_contents", 7),
    Datatype("INT32", np.dtype(np.int32), "int32", "int_contents", 8),
    Datatype("INT64", np.dtype(np.int64), "int64", "int64_contents", 9),
    Datatype("FP16", np.dtype(np.float16), "float16", None, 10),
    Datatype("FP32", np.dtype(np.float32), "float32", "fp32_contents", 11),
    Datatype("FP64", np.dtype(np.float64), "float64", "fp64_contents", 12),
    Datatype("BYTES", np.dtype(object), None, "bytes_contents", 13),
    Datatype("BF16", np.dtype(np.uint16), "bfloat16", None, 14),
]

DATATYPES: dict[str, Datatype] = {d.name: d for d in _TABLE}


def datatype(name: str) -> Datatype:
    """The Datatype called `name` (as the protocol spells it, e.g. "FP32")."""
    try:
        return DATATYPES[name]
    except KeyError:
        raise ValueError(f"unknown datatype {name!r}; expected one of {', '.join(DATATYPES)}") from None
