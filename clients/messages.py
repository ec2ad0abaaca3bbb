"""What the clients give back besides arrays, and the stream's request/result conversion.

Both clients build stream requests and read stream responses here, so an item is
accepted in the same forms and a result has the same shape whichever client is used.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np

from wok.codec import encode_request
from wok.datatypes import datatype
from wok.errors import quoted_name, shown_value
from wok.numerals import ascii_digits
from wok.v2pb import grpc_service_pb2 as pb

from .errors import read_answer


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
    """The answer to one stream request: `outputs` when it succeeded, else `error` and `code`.

    `error` is the server's message and `code` the status a unary call would have ended with,
    which wok sends in the answer's `status_code` parameter (UNKNOWN from a server that sends
    none); both are None for a success. An answer the client cannot read (`read_answer`) is a
    failure of its request alone: `code` INTERNAL, as gRPC's for a response it cannot deserialize,
    and `error` naming the request, the model and what was wrong with the answer.
    """

    id: str
    model: str
    outputs: dict[str, np.ndarray] | None
    error: str | None
    code: grpc.StatusCode | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


# (model, inputs), or a mapping with the keys below ("model" and "inputs" required).
StreamItem = tuple[str, Mapping[str, np.ndarray]] | Mapping[str, Any]
_ITEM_KEYS = frozenset({"model", "inputs", "outputs", "request_id", "server_timeout_us", "datatypes"})
_CODES = {c.value[0]: c for c in grpc.StatusCode}


class StreamIds:
    """One stream's request ids: an item without one gets its position ("0", "1", ...).

    So that two answers cannot carry one id by the client's doing, a stream with items without
    an id refuses (ValueError) a caller's id of the same form (a decimal number without leading
    zeros) other than its own item's position, whichever of the two comes first. It keeps two
    items' worth of state, however long the stream.
    """

    __slots__ = ("_first_auto", "_first_numeric")

    def __init__(self) -> None:
        self._first_auto: int | None = None
        self._first_numeric: tuple[int, str] | None = None

    def id_for(self, index: int, request_id: Any) -> Any:
        """The id of the `index`-th item, whose caller's id is `request_id` ("" or None for none)."""
        if not request_id:
            if self._first_numeric is not None:
                at, rid = self._first_numeric
                raise ValueError(
                    f"stream request {index}: has no request_id, so it would get the automatic id "
                    f"'{index}', which can repeat stream request {at}'s request_id {quoted_name(rid)}, a number other "
                    f"than its position; expected every request to have an id, or numeric ids only at "
                    f"their own position"
                )
            if self._first_auto is None:
                self._first_auto = index
            return str(index)
        if isinstance(request_id, str) and request_id != str(index) and _looks_automatic(request_id):
            if self._first_auto is not None:
                raise ValueError(
                    f"stream request {index}: request_id {quoted_name(request_id)} is a number other than its "
                    f"position, which the automatic ids of this stream's requests without an id (the "
                    f"first: stream request {self._first_auto}) can repeat; expected a request_id that "
                    f"is not a number, or '{index}'"
                )
            if self._first_numeric is None:
                self._first_numeric = (index, request_id)
        return request_id


def _looks_automatic(request_id: str) -> bool:
    return ascii_digits(request_id) and str(int(request_id)) == request_id


def output_names(outputs: Any, where: str = "outputs") -> Any:
    """`outputs` as given, unless it is one string: encode_request takes any iterable of names, and a
    string's are its letters ("unknown output 'O'" for "OUTPUT0")."""
    if isinstance(outputs, (str, bytes)):
        shown = shown_value(outputs)
        raise TypeError(f"{where}: expected a list of output names; got the string {shown}; pass [{shown}]")
    return outputs


def stream_request(item: StreamItem, index: int, ids: StreamIds) -> pb.ModelInferRequest:
    """The request for the `index`-th stream item; its id comes from `ids` (one per stream)."""
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
            output_names(item.get("outputs"), f"stream request {index}: outputs"),
            ids.id_for(index, item.get("request_id")),
            item.get("server_timeout_us"),
            item.get("datatypes"),
        )
    try:
        model, inputs = item
    except (TypeError, ValueError):
        raise TypeError(
            f"stream request {index}: expected (model, inputs) or a mapping; got {type(item).__name__}"
        ) from None
    return encode_request(model, inputs, None, ids.id_for(index, None))


def stream_result(msg: pb.ModelStreamInferResponse) -> StreamResult:
    resp = msg.infer_response
    if msg.error_message:
        p = resp.parameters.get("status_code")
        code = None if p is None else _CODES.get(p.int64_param)
        if code is None or code is grpc.StatusCode.OK:  # not wok, or a number that names no failure
            code = grpc.StatusCode.UNKNOWN
        return StreamResult(resp.id, resp.model_name, None, msg.error_message, code)
    try:
        outputs = read_answer(resp, resp.model_name, resp.id, "stream request")
    except ValueError as exc:
        # Raised here, it ended the caller's iterator: the requests after it lost their results.
        return StreamResult(resp.id, resp.model_name, None, str(exc), grpc.StatusCode.INTERNAL)
    return StreamResult(resp.id, resp.model_name, outputs, None)
