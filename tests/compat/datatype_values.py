"""Every V2 datatype wok serves, its edge values, and the model and requests that carry them.

Shared by datatypes_peer.py, which sends the values with tritonclient in a process of its own, and
test_tritonclient_datatypes.py, which checks the answers. numpy only: the peer must not import wok,
and what the test expects must not come from wok's own datatype table (server/datatypes.py), which is
what it checks. Float edge values are built from their bit fields, so that neither numpy's nor
ml_dtypes' conversions decide what a NaN, an infinity or a subnormal is.
"""

from __future__ import annotations

import numpy as np

# V2 name -> the numpy dtype of its values on the wire; BF16 as its uint16 bit patterns, since
# numpy has no bfloat16. BYTES is left out: wok serves every V2 datatype but BYTES (README,
# "Serving"), its models running on torch tensors.
WIRE = {
    "BOOL": np.dtype(np.bool_),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "FP16": np.dtype(np.float16),
    "BF16": np.dtype(np.uint16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
}
TYPES = tuple(WIRE)
# (exponent bits, mantissa bits) of each floating-point type.
FLOAT_FIELDS = {"FP16": (5, 10), "BF16": (8, 7), "FP32": (8, 23), "FP64": (11, 52)}
# The unsigned integer dtype as wide as each type: how values are compared bit for bit.
BITS = {t: np.dtype(f"u{WIRE[t].itemsize}") for t in TYPES}

MODEL = "datatypes"
MAX_BATCH_SIZE = 8
# Long enough that no batch is flushed by time on a slow host: every batch the peer makes is
# filled to MAX_BATCH_SIZE by its requests' rows (CASES), which flushes it at once.
MAX_QUEUE_DELAY_MS = 10_000.0


def input_name(t: str) -> str:
    return f"IN_{t}"


def echo_name(t: str) -> str:
    return f"ECHO_{t}"


def f64_name(t: str) -> str:
    return f"F64_{t}"


def outputs_of(types: tuple[str, ...]) -> tuple[str, ...]:
    """The config's output order, unlike the inputs' (each F64 in input order, then each ECHO in reverse):
    an answer that followed the inputs' order, or the model's dict, would show."""
    return tuple(f64_name(t) for t in types) + tuple(echo_name(t) for t in reversed(types))


OUTPUTS = outputs_of(TYPES)


def _float_edges(exponent: int, mantissa: int) -> list[int]:
    sign = 1 << (exponent + mantissa)
    exp_all = ((1 << exponent) - 1) << mantissa
    quiet = 1 << (mantissa - 1)
    bias = (1 << (exponent - 1)) - 1
    largest = exp_all - 1  # the largest finite: the exponent one below all 1s, the mantissa all 1s
    return [
        0,  # +0.0
        sign,  # -0.0
        exp_all | quiet,  # NaN
        sign | exp_all | quiet,  # -NaN
        exp_all | quiet | 1,  # a NaN with a payload
        exp_all,  # +inf
        sign | exp_all,  # -inf
        largest,  # max
        sign | largest,  # lowest
        1 << mantissa,  # the smallest normal
        1,  # the smallest subnormal
        (1 << mantissa) - 1,  # the largest subnormal
        bias << mantissa,  # 1.0
        sign | ((bias + 1) << mantissa) | (1 << (mantissa - 2)),  # -2.5
    ]


def edge_values(t: str) -> np.ndarray:
    """One sample's values of type `t` (BF16 as uint16 bits): 1-D, in a fixed order."""
    dtype = WIRE[t]
    if t == "BOOL":
        return np.array([False, True])
    if t in FLOAT_FIELDS:
        return np.array(_float_edges(*FLOAT_FIELDS[t]), dtype=BITS[t]).view(dtype)
    info = np.iinfo(dtype)
    # Bytes 5A 01 02 …, all different, so that a byte order or width mistake cannot read the same.
    pattern = int.from_bytes(bytes([0x5A, *range(1, dtype.itemsize)]), "big")
    if info.min < 0:
        values = [info.min, info.max, 0, -1, 1, info.min + 1, info.max - 1, pattern]
    else:
        values = [0, info.max, 1, info.max - 1, info.max >> 1, (info.max >> 1) + 1, pattern]
    return np.array(values, dtype=dtype)


def dims(t: str) -> int:
    return len(edge_values(t))


# case -> (rows, offset, model_version, outputs requested in this order; None for all of them).
# "full" fills a batch alone; "a", "b" and "c" fill one together (3 + 4 + 1 rows). Each row of each
# case rolls the edge values by a different amount, so that rows swapped within or between requests
# of a batch would show.
CASES = {
    "full": (MAX_BATCH_SIZE, 0, "", None),
    "a": (3, 1, "", (f64_name("BF16"), echo_name("UINT64"), echo_name("BF16"), echo_name("BOOL"), f64_name("INT8"))),
    "b": (4, 4, "1", None),
    "c": (1, 7, "", tuple(reversed(OUTPUTS))),
}
TOGETHER = ("a", "b", "c")
assert sum(CASES[c][0] for c in TOGETHER) == MAX_BATCH_SIZE


def case_inputs(case: str) -> dict[str, np.ndarray]:
    """input name -> [rows, dims] of its type (BF16 as uint16 bits), in TYPES order."""
    rows, offset, _, _ = CASES[case]
    out = {}
    for t in TYPES:
        values = edge_values(t)
        out[input_name(t)] = np.stack([np.roll(values, offset + r) for r in range(rows)])
    return out


def config_toml(types: tuple[str, ...] = TYPES, max_queue_delay_ms: float = MAX_QUEUE_DELAY_MS) -> str:
    """The config of the model of `types` (model_py): an input of each, its ECHO and F64 outputs."""
    lines = ['platform = "python"', 'factory = "model:build"', f"max_batch_size = {MAX_BATCH_SIZE}"]
    for t in types:
        lines += ["", "[[inputs]]", f'name = "{input_name(t)}"', f'datatype = "{t}"', f"dims = [{dims(t)}]"]
    for name in outputs_of(types):
        t = name.split("_", 1)[1]
        datatype = "FP64" if name == f64_name(t) else t
        lines += ["", "[[outputs]]", f'name = "{name}"', f'datatype = "{datatype}"', f"dims = [{dims(t)}]"]
    lines += ["", "[dynamic_batching]", f"max_queue_delay_ms = {max_queue_delay_ms}"]
    lines += ["", "[instances]", 'devices = ["cpu"]']
    return "\n".join(lines) + "\n"


# Each input back unchanged, and converted to float64 by torch: an echo alone would pass a codec
# that read one type's bytes as another of the same width (BF16 as FP16, INT8 as UINT8), since the
# same bytes would go back; the conversion reads the values as the type the model got.
def model_py(types: tuple[str, ...] = TYPES) -> str:
    return _MODEL_PY.replace("TYPES = ()", f"TYPES = {types!r}")


_MODEL_PY = """\
import torch
from torch import nn

TYPES = ()


class EchoAndWiden(nn.Module):
    def forward(self, *inputs):
        out = {}
        for t, x in zip(TYPES, inputs, strict=True):
            out["ECHO_" + t] = x
            out["F64_" + t] = x.to(torch.float64)
        return out


def build():
    return EchoAndWiden()
"""


MODEL_PY = model_py()
