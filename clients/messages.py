"""What the clients give back besides arrays, and the stream's request/result conversion.

Both clients build stream requests and read stream responses here, so an item is
accepted in the same forms and a result has the same shape whichever client is used.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from wok.codec import decode_response, encode_request
from wok.datatypes import datatype
from wok.v2pb import grpc_service_pb2 as pb


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """One input or output of a model: `shape` is batch first, -1 where any size goes."""

    name: str
    datatype: str
    shape: tuple[int, ...]

    @property
    def numpy_dtype(self) -> np.dtype:
        """The numpy dtype to send or expect (BF16 travels as uint16 words)."""
        return datatype(self.datatype).numpy


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """A model's metadata; `inputs` and `outputs` map names to TensorInfo, in model order."""

    name: str
    versions: tuple[str, ...]
    platform: str
    inputs: dict[str, TensorInfo]
    outputs: dict[str, TensorInfo]

    @classmethod
    def from_proto(cls, msg: pb.ModelMetadataResponse) -> ModelInfo:
        def tensors(ts) -> dict[str, TensorInfo]:
            return {t.name: TensorInfo(t.name, t.datatype, tuple(t.shape)) for t in ts}

        return cls(msg.name, tuple(msg.versions), msg.platform, tensors(msg.inputs), tensors(msg.outputs))


@dataclass(frozen=True, slots=True)
class StreamResult:
    """The answer to one stream request: `outputs` when it succeeded, else `error`.

    `error` is the server's message; a stream response carries no status code.
    """

    id: str
    model: str
    outputs: dict[str, np.ndarray] | None
    error: str | None

    @property
    def ok(self) -> bool:
        return self.error is None


# (model, inputs), or a mapping with the keys below ("model" and "inputs" required).
StreamItem = tuple[str, Mapping[str, np.ndarray]] | Mapping[str, Any]
_ITEM_KEYS = frozenset({"model", "inputs", "outputs", "request_id", "server_timeout_us", "datatypes"})


def stream_request(item: StreamItem, index: int) -> pb.ModelInferRequest:
    """The request for the `index`-th stream item; without an id it gets str(index)."""
    if isinstance(item, Mapping):
        unknown = item.keys() - _ITEM_KEYS
        if unknown or "model" not in item or "inputs" not in item:
            raise TypeError(
                f"stream request {index}: expected keys model, inputs and optionally "
                f"outputs, request_id, server_timeout_us, datatypes; got {sorted(item)}"
            )
        return encode_request(
            item["model"],
            item["inputs"],
            item.get("outputs"),
            item.get("request_id") or str(index),
            item.get("server_timeout_us"),
            item.get("datatypes"),
        )
    try:
        model, inputs = item
    except (TypeError, ValueError):
        raise TypeError(
            f"stream request {index}: expected (model, inputs) or a mapping; got {type(item).__name__}"
        ) from None
    return encode_request(model, inputs, None, str(index))


def stream_result(msg: pb.ModelStreamInferResponse) -> StreamResult:
    resp = msg.infer_response
    if msg.error_message:
        return StreamResult(resp.id, resp.model_name, None, msg.error_message)
    return StreamResult(resp.id, resp.model_name, decode_response(resp), None)
