"""Between V2 protobuf messages and numpy arrays, both ways, with the request checks.

`decode_request` is where a malformed request is caught, before it can join a batch:
each failure is an InvalidInput naming the input, what was expected and what was got.
The client library uses `encode_request` and `decode_response` from here too, so both
ends read the protocol the same way.
"""

from __future__ import annotations

import asyncio
import copy
import math
import struct
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter

import numpy as np
from google.protobuf.message import DecodeError

from .datatypes import DATATYPES, Datatype
from .errors import InvalidInput, quoted, quoted_name
from .v2pb import grpc_service_pb2 as pb

_LEN = struct.Struct("<I")


def transport_limit(max_request_bytes: int) -> int:
    """gRPC's limit on a message the server receives or sends: room for a request of
    `max_request_bytes` encoded in the least compact way (app.py sets it on the server)."""
    return 4 * max_request_bytes + (1 << 20)


# ServerMetadata's trailing metadata, where a wok server publishes its --max-request-bytes and its
# transport_limit (KServe's response has no field for them; Triton's clients ignore metadata they do
# not know): wok's clients (wok.clients.limits) refuse a request over the limit before sending it,
# since gRPC refuses it unread and, on a stream, ends the whole stream. See docs/security.md.
MAX_REQUEST_KEY = "wok-max-request-bytes"
MAX_MESSAGE_KEY = "wok-max-message-bytes"

# ModelConfig's `parameters` key, before an input's name, under which a wok server publishes the bound of that
# integer input's ids (tables.IdRanges.bounds, Servable.id_bounds): ids in [0, N) reach no embedding table past its
# rows, so a request of them is never refused for its ids (check_ids). Published only for an input every use of whose
# ids the load followed: one whose ids also reach a table through arithmetic (`b(ids * 2)`), or an op that may look
# them up unread, has none, as the rows of the tables followed would not bound it. KServe's ModelMetadataResponse has
# no field for it, nor Triton's ModelInput; a Triton client reads the parameters map as any model's. `wok bench ramp`
# draws such an input below it unless given --int-high. A config's own parameters may not start with "wok." (config.py).
IDS_BOUND_PREFIX = "wok.ids_bound."


# A shape is written out in a message up to this many dims. A request's shape may have millions
# (a 64 MiB request holds 60 million one-byte dims): written out whole, one took 6 s of the event
# loop, every other request waiting, and 2 GB, for a 20 MB request.
_SHAPE_STR_DIMS = 16


def _shape_str(shape: Sequence[int]) -> str:
    if len(shape) <= _SHAPE_STR_DIMS:
        return "[" + ", ".join(str(d) for d in shape) + "]"
    head = ", ".join(str(shape[i]) for i in range(_SHAPE_STR_DIMS))
    return f"[{head}, …] ({len(shape):,} dims)"


def _wrong_shape(name: str, want: Sequence[int], got: Sequence[int]) -> InvalidInput:
    return InvalidInput(
        f"input '{name}': expected shape {_shape_str(want)} (batch first, -1 = any); got {_shape_str(got)}"
    )


def size_range(least: int, most: int | None, step: int = 1) -> str:
    """The sizes from `least` to `most` (None: no most), every `step`th from `least` where `step` > 1 (a size a
    torch.export program derived from a Dim, 2 × Dim: an even one)."""
    if most is not None and least == most:
        return f"exactly {least}"
    sizes = f"{least} or more" if most is None else f"{least} to {most}"
    if step == 1:
        return sizes
    if step == 2:
        return f"an {'odd' if least % 2 else 'even'} size of {sizes}"
    return f"a size of {sizes} in steps of {step}"


def in_size_range(size: int, least: int, most: int | None, step: int = 1) -> bool:
    """Whether `size` is one of size_range(least, most, step)'s sizes."""
    return least <= size and (most is None or size <= most) and (size - least) % step == 0


def _check_ranges(
    name: str, ranges: tuple[tuple[int, int, int | None, int], ...], shape: tuple[int, ...], model: str
) -> None:
    """The sizes of a request's variable dims that its model takes (Servable.dim_ranges): InvalidInput for one
    outside them, which the model was not exported for."""
    for i, least, most, step in ranges:
        got = shape[i]
        # in_size_range's test, written out: a call per ranged dim of every request is its cost again.
        if got < least or (most is not None and got > most) or (step != 1 and (got - least) % step):
            raise InvalidInput(
                f"input '{name}': expected dim {i} of {size_range(least, most, step)} (the sizes model '{model}' was "
                f"exported for); got {got} in shape {_shape_str(shape)}"
            )


def check_ids(
    id_ranges: Mapping[str, int], arrays: Mapping[str, np.ndarray], model: str, least: Mapping[str, int] | None = None
) -> None:
    """InvalidInput for a request holding an id outside [0, rows) of the embedding table an input's ids reach
    (Servable.id_ranges), or [least, rows) where its tables count a negative id from their end (Servable.id_least):
    the model would fail on it, with its batch (on a GPU, losing the device). An input read in chunks is checked as
    they are read instead (`_ChunkIds`)."""
    for name, rows in id_ranges.items():
        a = arrays[name]
        if a.size == 0:
            continue
        # One min and one max per input: the check's whole cost on every request.
        lo, hi = a.min(), a.max()
        low = least.get(name, 0) if least else 0
        if lo < low or hi >= rows:
            raise _ids_refused(name, low, rows, model, lo, hi)


def check_values(servable, arrays: Mapping[str, np.ndarray]) -> None:
    """The checks decode_request makes of a request whose inputs have the config's datatypes and shapes, in its
    order: each variable dim within the sizes the model takes (Servable.dim_ranges), each id within its table
    (check_ids), then the model's own check (Servable.check); raising what the server answers such a request with.
    For requests made in-process (`wok profile`'s), which no decode_request sees."""
    model = servable.name
    for t in servable.config.inputs:
        if t.name in servable.dim_ranges:
            _check_ranges(t.name, servable.dim_ranges[t.name], arrays[t.name].shape, model)
    if servable.id_ranges:
        check_ids(servable.id_ranges, arrays, model, servable.id_least)
    servable.check(dict(arrays))


def _ids_refused(name: str, low: int, rows: int, model: str, lo, hi, read: int = 0, count: int = 0) -> InvalidInput:
    """check_ids' refusal; `read` of `count`: where the values from `lo` to `hi` are those of a chunked input's
    first chunks, read before the one that held the id outside the table (`_ChunkIds`)."""
    ends = ", a negative id counted from its end" if low < 0 else ""
    where = f" in its first {read:,} of {count:,} values (the rest not read)" if read < count else ""
    return InvalidInput(
        f"input '{name}': expected ids in [{low}, {rows}) (the rows of the embedding table model '{model}' "
        f"looks them up in{ends}); got values from {lo} to {hi}{where}"
    )


class _ChunkIds:
    """check_ids of one input read in chunks (`_values_in_steps`): a min and a max of each chunk as it is read, so
    that no turn of the event loop reduces the whole input at once (~20 ms for 160 MiB of ids, docs/performance.md),
    and a request is refused at the chunk holding an id outside the table, its later chunks unread."""

    __slots__ = ("count", "hi", "lo", "low", "model", "name", "read", "rows")

    def __init__(self, name: str, rows: int, low: int, model: str, count: int) -> None:
        self.name, self.rows, self.low, self.model, self.count = name, rows, low, model, count
        self.read = 0
        self.lo = self.hi = None

    def __call__(self, chunk: np.ndarray) -> None:
        lo, hi = chunk.min(), chunk.max()
        if self.read:
            lo, hi = min(lo, self.lo), max(hi, self.hi)
        self.lo, self.hi = lo, hi
        self.read += chunk.size
        if lo < self.low or hi >= self.rows:
            raise _ids_refused(self.name, self.low, self.rows, self.model, lo, hi, self.read, self.count)


# The least urgent priority level a request or a model's default may name. Each level a queue
# holds is a FIFO of its own: the bound keeps a client from spreading requests over billions.
MAX_PRIORITY_LEVEL = 1_000_000


# -- sides ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class _Side:
    """Which end a tensor is read at, for the words of its messages: a request's input, which the server
    refuses (InvalidInput, INVALID_ARGUMENT), or an answer's output, which a client reads
    (`decode_response`): a malformed answer is no fault of the caller's request, so it is a ValueError."""

    kind: str  # "input" or "output"
    message: str  # "request" or "answer"
    raw_field: str  # the message's field of raw tensors
    error: type[Exception]

    def tensor(self, name: str) -> str:
        # An input's name is one of its model's config (decode_request checks it first); an output's
        # comes from the wire, as the server sent it, and is quoted as names sent are.
        return f"input '{name}'" if self is INPUT else f"output {quoted_name(name)}"


INPUT = _Side("input", "request", "raw_input_contents", InvalidInput)
OUTPUT = _Side("output", "answer", "raw_output_contents", ValueError)


def _check_raw_entries(raw: Sequence[bytes], tensors: int, side: _Side) -> None:
    """One raw entry per tensor, or none at all."""
    if raw and len(raw) != tensors:
        entries = f"{len(raw)} entr{'y' if len(raw) == 1 else 'ies'}"
        counted = f"{tensors} {side.kind}{'' if tensors == 1 else 's'}"
        raise side.error(
            f"{side.raw_field} has {entries} for {counted}; expected one entry per {side.kind}, in the order of "
            f"the {side.message}'s {side.kind}s, or none (every {side.kind}'s values in its contents)"
        )


# -- BYTES ---------------------------------------------------------------------------
def serialize_bytes(a: np.ndarray) -> bytes:
    """Raw BYTES content: each element as a 4-byte little-endian length, then its bytes."""
    parts = []
    for item in a.reshape(-1):
        if isinstance(item, bytes):
            b = item
        elif isinstance(item, (bytearray, memoryview)):
            b = bytes(item)  # their str() is a repr, not their bytes
        else:
            b = str(item).encode()  # as Triton's client does: text as UTF-8, other objects as their str()
        parts.append(_LEN.pack(len(b)))
        parts.append(b)
    return b"".join(parts)


def deserialize_bytes(raw: bytes, count: int, name: str, side: _Side = INPUT) -> np.ndarray:
    what = side.tensor(name)
    if count > len(raw) // 4:  # checked before allocating: each element needs its 4-byte length
        raise side.error(
            f"{what}: raw BYTES content of {len(raw)} bytes cannot hold {count} elements (each needs at least 4 bytes)"
        )
    out = np.empty(count, dtype=object)
    pos = 0
    for i in range(count):
        if pos + 4 > len(raw):
            raise side.error(f"{what}: raw BYTES content ends after {i} of {count} elements")
        (n,) = _LEN.unpack_from(raw, pos)
        pos += 4
        if pos + n > len(raw):
            raise side.error(f"{what}: raw BYTES element {i} claims {n} bytes, {len(raw) - pos} left")
        out[i] = raw[pos : pos + n]
        pos += n
    if pos != len(raw):
        raise side.error(f"{what}: raw BYTES content has {len(raw) - pos} bytes after {count} elements")
    return out


# -- tensors ---------------------------------------------------------------------------
# numpy refuses a shape whose non-zero dims multiply past what it can index, even when another
# dim is 0 and the array is empty (so no byte count catches it): [1, 2**62, 0] of FP32.
_MAX_SPAN_BYTES = np.iinfo(np.intp).max


def _check_empty_span(shape: tuple[int, ...], dt: Datatype, name: str, side: _Side) -> None:
    """For a shape with a 0 in it (a non-empty one meets the byte or value count first)."""
    span = math.prod(d for d in shape if d) * dt.itemsize
    if span > _MAX_SPAN_BYTES:
        raise side.error(
            f"{side.tensor(name)}: shape {_shape_str(shape)} is too large: its dims other than 0 span {span} bytes "
            f"of {dt.name}, more than the {_MAX_SPAN_BYTES} an array can address"
        )


def array_from_raw(
    raw: bytes | memoryview, dt: Datatype, shape: tuple[int, ...], name: str, side: _Side = INPUT
) -> np.ndarray:
    count = math.prod(shape)
    if count == 0:
        _check_empty_span(shape, dt, name, side)
    if dt.name == "BYTES":
        # Its elements are bytes objects, not views of a ReceivedRequest's entry (bytes(raw) of bytes is raw).
        return deserialize_bytes(bytes(raw), count, name, side).reshape(shape)
    expected = count * dt.itemsize
    if len(raw) != expected:
        raise side.error(
            f"{side.tensor(name)}: expected {expected} bytes of raw content (shape {_shape_str(shape)} of {dt.name}, "
            f"{dt.itemsize} bytes each); got {len(raw)} bytes"
        )
    a = np.frombuffer(raw, dtype=dt.numpy).reshape(shape)
    if dt.name == "BOOL" and side is INPUT:
        # An answer's BOOL bytes are handed on as the server sent them, as tritonclient's as_numpy does.
        _check_bool_bytes(a, name)
    return a


def _check_bool_bytes(a: np.ndarray, name: str) -> None:
    """Refuse a raw BOOL tensor with a byte other than 0 or 1: numpy and torch take any byte for a
    bool as it is, and what a model gets from it depends on the op (a conversion reads it as True, a
    view of its bytes or a BOOL output sent back carries the 2 or the 255). Triton's core checks a raw
    input's datatype, shape and size, not its BOOL bytes (its backends get them as sent); wok refuses
    them, as typed contents (bool_contents) cannot hold another value.

    One pass of a max over the bytes (about 6 ms for 64 MiB); the first bad one is looked for only to refuse."""
    u8 = a.view(np.uint8)
    if u8.size and u8.max() > 1:
        flat = int(np.argmax(u8.reshape(-1) > 1))
        index = ", ".join(str(int(i)) for i in np.unravel_index(flat, a.shape))
        raise InvalidInput(
            f"input '{name}': expected BOOL values as bytes 0 or 1 in raw_input_contents; got {u8.reshape(-1)[flat]} "
            f"at element {flat} (index [{index}])"
        )


def _count_mismatch(
    contents: pb.InferTensorContents, dt: Datatype, shape: tuple[int, ...], name: str, got: int, side: _Side
) -> str:
    # Values in another field (FP64 ones in int64_contents) look like no data at all: name where they are.
    msg = (
        f"{side.tensor(name)}: expected {math.prod(shape)} values (shape {_shape_str(shape)}) in {dt.contents_field} "
        f"for {dt.name}, or the tensor in {side.raw_field}; got {got} values"
    )
    others = [f"{field} holds {n} values" for field, n in _other_fields(contents, dt)]
    if others:
        msg += f"; {', '.join(others)}, which {dt.name} is not read from"
    return msg


def _fields(contents: pb.InferTensorContents) -> list[tuple[str, int]]:
    """(field, values) of each non-empty field of `contents`."""
    return [(f.name, len(v)) for f, v in contents.ListFields()]


def _counted(fields: list[tuple[str, int]]) -> str:
    """`fields` ((field, values) pairs, as `_fields` gives them) as a refusal names them: "int_contents
    (1 value), fp64_contents (2 values)". Called only to refuse: the request path builds no text."""
    return ", ".join(f"{field} ({n} value{'' if n == 1 else 's'})" for field, n in fields)


def _other_fields(contents: pb.InferTensorContents, dt: Datatype) -> list[tuple[str, int]]:
    """(field, values) of each non-empty field of `contents` that `dt` is not read from."""
    return [(field, n) for field, n in _fields(contents) if field != dt.contents_field]


def array_from_contents(
    contents: pb.InferTensorContents, dt: Datatype, shape: tuple[int, ...], name: str, side: _Side = INPUT
) -> np.ndarray:
    return _finish(_contents_in_steps(contents, dt, shape, name, side))


def _contents_in_steps(
    contents: pb.InferTensorContents,
    dt: Datatype,
    shape: tuple[int, ...],
    name: str,
    side: _Side = INPUT,
    check: Callable[[np.ndarray], None] | None = None,
) -> Generator[None, None, np.ndarray]:
    """array_from_contents, yielding between chunks of CONTENTS_CHUNK values; `check` (_ChunkIds) called on each
    chunk of more than one (`_values_in_steps`)."""
    if dt.contents_field is None:
        # Name what was sent: "0 values" or a guess at the field would not tell the client the
        # protocol has no field for FP16 or BF16 at all.
        got = _counted(_fields(contents))
        raise side.error(
            f"{side.tensor(name)}: expected {dt.name} values in {side.raw_field} (InferTensorContents has no "
            f"field for {dt.name}); got {f'contents: {got}' if got else f'no {side.raw_field}'}"
        )
    values = getattr(contents, dt.contents_field)
    count = math.prod(shape)
    if count == 0:
        _check_empty_span(shape, dt, name, side)
    if len(values) != count:
        raise side.error(_count_mismatch(contents, dt, shape, name, len(values), side))
    others = _other_fields(contents, dt)
    if others:
        # Only its own field is read: the others' values would be dropped unseen, and which the client meant is a guess.
        got = _counted(others)
        raise side.error(
            f"{side.tensor(name)}: expected values in {dt.contents_field} alone for {dt.name}; got {got} too, "
            f"which {dt.name} is not read from"
        )
    if dt.contents_field in _PACKED_TAGS:
        a = _packed_values(contents, dt, count)
        if a is not None:
            return a.reshape(shape)
    a = yield from _values_in_steps(values, dt, count, name, side, check)
    return a.reshape(shape)


# Typed contents are read value by value (fp32 and fp64 aside, _packed_values): ~40 ns a value,
# so a request of millions holds the event loop for as many tenths of a second. Above this many,
# the service converts them in chunks of it (~3 ms each) with the loop's other work between.
CONTENTS_CHUNK = 1 << 16

# The wire tag of each fixed-width field: a proto3 repeated float or double is written packed, one
# tag, the payload's length, then the values little-endian, which is the array's own bytes.
_PACKED_TAGS = {
    field: (pb.InferTensorContents.DESCRIPTOR.fields_by_name[field].number << 3) | 2
    for field in ("fp32_contents", "fp64_contents")
}


def typed_values(req: pb.ModelInferRequest, max_inputs: int) -> int:
    """How many typed values the request's first `max_inputs` inputs hold (a request with more
    inputs than its model's is refused at the first one too many). Cheap: each field's length is
    stored."""
    n = 0
    for t in req.inputs[:max_inputs]:
        dt = DATATYPES.get(t.datatype)
        if dt is not None and dt.contents_field is not None and t.HasField("contents"):
            n += len(getattr(t.contents, dt.contents_field))
    return n


def _packed_values(contents: pb.InferTensorContents, dt: Datatype, count: int) -> np.ndarray | None:
    """FP32 or FP64 values copied from their serialized bytes (protobuf's C writes them in about
    0.5 ns a value, where reading them one by one takes ~70); None where the serialized form is not
    the one expected (then they are read one by one)."""
    data = contents.SerializeToString()  # the other fields are empty (checked before); unknown ones follow
    if not data or data[0] != _PACKED_TAGS[dt.contents_field]:
        return None
    length, pos, shift = 0, 1, 0
    while pos < len(data) and pos <= 10:
        b = data[pos]
        length |= (b & 0x7F) << shift
        shift += 7
        pos += 1
        if b < 0x80:
            break
    else:
        return None
    if length != count * dt.itemsize or pos + length > len(data):
        return None
    # Copied out of `data` (~0.1 ns a value): a view would start at the field's odd offset, where
    # numpy's loops run up to half as fast on it, and be read-only, where the values read one by one
    # made a writable array (decode_response hands a response's to the client's code).
    return np.frombuffer(data, dtype=dt.numpy.newbyteorder("<"), count=count, offset=pos).astype(dt.numpy)


def _values_in_steps(
    values, dt: Datatype, count: int, name: str, side: _Side, check: Callable[[np.ndarray], None] | None = None
) -> Generator[None, None, np.ndarray]:
    """Typed values into an array, CONTENTS_CHUNK at a time, yielding between chunks. BYTES too: an
    object array filled with the field's bytes objects (numpy would make a list of them an 'S' array).
    `check`: called on each chunk, where there are several (one alone is the whole, left to check_ids)."""
    if count <= CONTENTS_CHUNK:
        # The common request: no array to copy a chunk into (~1 µs of a small one's decode).
        return _chunk(iter(values), dt, count, 0, name, side)
    out = np.empty(count, dtype=dt.numpy)
    it = iter(values)
    for start in range(0, count, CONTENTS_CHUNK):
        n = min(CONTENTS_CHUNK, count - start)
        out[start : start + n] = _chunk(it, dt, n, start, name, side)
        if start + n < count:
            yield
        if check is not None:
            # After the turn: the first chunk is read in decode_request's loop over the inputs, and the refusals of
            # the later inputs, the outputs and the parameters come before any of the ids', read in steps or whole.
            check(out[start : start + n])
    return out


def _chunk(it, dt: Datatype, n: int, start: int, name: str, side: _Side) -> np.ndarray:
    """The next `n` values of `it`, elements `start` on of tensor `name`."""
    if dt.numpy.kind in "iu" and dt.itemsize < 4:
        # int_contents and uint_contents hold 32-bit values for the 8- and 16-bit types. One out of
        # the type's range is refused here, not left to numpy: numpy 1.x wraps it (UINT8 300 is 44).
        wide = np.fromiter(it, dtype=np.int64, count=n)
        info = np.iinfo(dt.numpy)
        outside = (wide < info.min) | (wide > info.max)
        if outside.any():
            k = int(outside.argmax())
            raise side.error(
                f"{side.tensor(name)}: expected {dt.name} values from {info.min} to {info.max}; got {int(wide[k])} "
                f"(element {start + k})"
            )
        return wide.astype(dt.numpy)
    try:
        return np.fromiter(it, dtype=dt.numpy, count=n)
    except OverflowError:
        # Each contents field holds what its datatypes can (the 8- and 16-bit ones are checked above): only
        # values from elsewhere than a parsed message get here, and which one numpy refused it does not say.
        if dt.numpy.kind in "iu":
            span = f"{np.iinfo(dt.numpy).min} to {np.iinfo(dt.numpy).max}"
        else:
            span = f"{float(np.finfo(dt.numpy).min):g} to {float(np.finfo(dt.numpy).max):g}"
        where = f"element {start}" if n == 1 else f"among elements {start} to {start + n - 1}"
        raise side.error(
            f"{side.tensor(name)}: expected {dt.name} values from {span}; got one out of range ({where})"
        ) from None


def _finish(steps: Generator[None, None, np.ndarray]) -> np.ndarray:
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


# Triton features a tensor can ask for, which wok does not offer.
SHARED_MEMORY = "shared_memory_region"
UNSUPPORTED_OUTPUT_PARAMETERS = {
    "classification": "top-k classes, tritonclient's class_count",
    SHARED_MEMORY: "shared memory",
}

# A request's parameters asking for Triton's sequence batching, refused when set (not 0, "" or false).
SEQUENCE_PARAMETERS = ("sequence_id", "sequence_start", "sequence_end")


@dataclass(slots=True)
class DecodedRequest:
    inputs: dict[str, np.ndarray]
    rows: int
    outputs: tuple[str, ...] | None
    timeout_s: float | None
    priority: int | None = None  # the 'priority' parameter; None when absent or 0 (the model's default level)
    # decode_request(in_steps=True): inputs whose typed values are still to be read, each with the
    # rest of its conversion (`finish_decoding`); their entries in `inputs` are None until then.
    pending: list[tuple[str, Generator[None, None, np.ndarray]]] | None = None


def _check_whole_ids(servable, arrays: Mapping[str, np.ndarray], pending) -> None:
    """check_ids of the inputs read whole: those left `pending` are checked as they are read (_ChunkIds)."""
    ranges = servable.id_ranges
    if ranges and pending:
        chunked = {name for name, _ in pending}
        ranges = {name: rows for name, rows in ranges.items() if name not in chunked}
    if ranges:
        check_ids(ranges, arrays, servable.name, servable.id_least)


async def finish_decoding(dec: DecodedRequest, servable, refuse: Callable[[], None] | None = None) -> None:
    """Read what decode_request(in_steps=True) left pending, a chunk per turn of the event loop (the
    requests around it go on meanwhile), then run the model's value checks. `refuse`, called before
    each chunk, ends the read with what it raises. The ids of the inputs read whole are checked first
    (check_ids), those of the pending ones chunk by chunk as they are read (_ChunkIds)."""
    _check_whole_ids(servable, dec.inputs, dec.pending)
    for name, steps in dec.pending or ():
        while True:
            await asyncio.sleep(0)
            if refuse is not None:
                refuse()
            try:
                next(steps)
            except StopIteration as done:
                dec.inputs[name] = done.value
                break
    dec.pending = None
    servable.check(dec.inputs)


# -- a large request as received ---------------------------------------------------------
# A ModelInferRequest of this many bytes or more is parsed by `parse_infer_request`. Below it protobuf's own parse and
# read of the raw tensors are quicker: the walk, the parse of the rest and the wrapper cost 9.5-9.9 µs of the server's
# read (with decode_request) at any size, where protobuf's copies grow with the tensors (64 KiB: 7.80 µs against the
# walk's 9.56, 96 KiB: 9.86 against 9.65, 128 KiB: 10.60 against 9.63: docs/results/large-decode-2026-12-06f.json,
# docs/performance.md). It was 64 KiB until 2026-12-06 (later), chosen while protobuf's way still paid ByteSize's
# serialization (bench/large_decode.py's `break_even`).
LARGE_REQUEST = 96 << 10
_RAW_INPUT_TAG = (pb.ModelInferRequest.DESCRIPTOR.fields_by_name["raw_input_contents"].number << 3) | 2
# The most top-level fields the walk reads before it leaves the message to protobuf: a request of raw tensors has
# a few per input, where millions of tiny ones (a map of parameters, unknown fields) would each cost it ~0.3 µs
# of the event loop. A request over the limit with more is refused unread (`_head_of`).
_MAX_WALKED_FIELDS = 1024


class ReceivedRequest:
    """A ModelInferRequest of LARGE_REQUEST bytes or more, as `parse_infer_request` reads it: its raw_input_contents
    are read-only views of the received bytes (the arrays decode_request makes of them too, at any offset, so that
    numpy reads them unaligned), every other field is that of `message`, parsed without them.

    upb copies a bytes field into its arena as it parses, again into a new bytes object at each read of an entry,
    and ByteSize serializes the whole message: for 64 MiB of raw tensors, ~160 ms of the event loop, and the
    tensors held twice while the request lasts, where the views cost neither."""

    __slots__ = ("message", "raw_input_contents")

    def __init__(self, message: pb.ModelInferRequest, raw: list[memoryview]) -> None:
        self.message = message
        self.raw_input_contents = raw

    def __getattr__(self, name: str):
        # `message` unset (copy's new object): a lookup of it recursed. A special name (`__deepcopy__`, which copy
        # looks up on the object) is this class's, not the message's: copy.deepcopy gave the message's copy.
        if name == "message" or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.message, name)

    def __deepcopy__(self, memo: dict) -> ReceivedRequest:
        # memoryviews do not deep-copy: the copy's are views of a copy of each entry, as read-only as the received.
        raw = [memoryview(bytes(r)) for r in self.raw_input_contents]
        return ReceivedRequest(copy.deepcopy(self.message, memo), raw)

    def ByteSize(self) -> int:
        """The request's size as protobuf counts it (serialized): the message's, and each raw entry's field. The
        server holds a received request to its limit by the bytes received instead (`parse_infer_request`)."""
        tag = _varint_size(_RAW_INPUT_TAG)
        return self.message.ByteSize() + sum(tag + _varint_size(len(r)) + len(r) for r in self.raw_input_contents)


class OversizedRequest:
    """A received ModelInferRequest over the server's --max-request-bytes (`parse_infer_request`'s `max_bytes`),
    `size` being the bytes received: decode_request refuses it, naming them. `message` holds what the refusal
    reads and nothing more (`_head_of`): its model_name and model_version, for the model of the refusal, and its
    id, for a stream's answer."""

    __slots__ = ("max_bytes", "message", "size")

    def __init__(self, message: pb.ModelInferRequest, size: int, max_bytes: int) -> None:
        self.message = message
        self.size = size
        self.max_bytes = max_bytes

    def __getattr__(self, name: str):
        # `message` unset (copy's new object): a lookup of it recursed. A special name (`__deepcopy__`, which copy
        # looks up on the object) is this class's, not the message's: copy.deepcopy gave the message's copy.
        if name == "message" or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.message, name)


class UnreadOversized(DecodeError):
    """`parse_infer_request`'s refusal of a request over the limit whose model_name, model_version and id it could
    not read without parsing the whole (`_head_of`): `error` says so, naming the size. A DecodeError, so that a
    caller catching protobuf's refusal of bytes that do not parse catches it too."""

    def __init__(self, error: InvalidInput) -> None:
        super().__init__(str(error))
        self.error = error


def _varint_size(n: int) -> int:
    return max(1, (n.bit_length() + 6) // 7)


def parse_infer_request(
    data: bytes, max_bytes: int | None = None
) -> pb.ModelInferRequest | ReceivedRequest | OversizedRequest:
    """A received ModelInferRequest: a ReceivedRequest when it is LARGE_REQUEST bytes or more and holds raw tensors,
    else the message protobuf parses (which raises DecodeError, as for the whole message, for one that does not
    parse); an OversizedRequest where `data` is over `max_bytes` (the server's limit), around a message of its
    model_name, model_version and id alone (`_head_of`): the rest, its tensors, is not parsed, so that a request is
    refused for its size whether or not they would parse. One over the limit whose top-level fields the walk does
    not read (more than _MAX_WALKED_FIELDS of them, or one it leaves to protobuf), or whose model_name, model_version
    or id does not parse, raises UnreadOversized: it is refused for its size, no model named, without the parse of
    the whole, which took the event loop ~100 ms for 60 MiB of INT64 and 1.3 s for 60 MiB of 2-byte parameters
    (docs/performance.md) and could only refuse it.

    The limit is held here, against the bytes received, so that no request is serialized again to learn its size
    (ByteSize() of a parsed message is a serialization of it: docs/performance.md, "Large requests read in place").
    It is also the size the operator's limit is about: protobuf's count of the parsed message differs from the
    bytes sent where these give a field twice (the last one kept), pad a varint, or leave a map entry's value out."""
    size = len(data)
    if size < LARGE_REQUEST and (max_bytes is None or size <= max_bytes):
        return pb.ModelInferRequest.FromString(data)  # nearly every request: nothing more to look at
    if max_bytes is not None and size > max_bytes:
        # Refused whatever its tensors hold: only the fields the refusal reads are parsed (a typed request near
        # gRPC's receive limit, 4·L + 1 MiB, cost its whole parse on the event loop: 123 ms for 60 MiB of INT64).
        head = _head_of(data)
        if type(head) is str:
            raise UnreadOversized(
                InvalidInput(
                    f"request is {size} bytes, over the limit of {max_bytes} bytes (the server's "
                    f"--max-request-bytes); its model was not read: {head}"
                )
            )
        return OversizedRequest(head, size, max_bytes)
    return _parse_large(data)  # LARGE_REQUEST bytes or more, within the limit


def _parse_large(data: bytes) -> pb.ModelInferRequest | ReceivedRequest:
    split = _split_raw_inputs(data)
    if split is not None and split[1]:
        try:
            return ReceivedRequest(pb.ModelInferRequest.FromString(split[0]), split[1])
        except DecodeError:
            pass  # refused below, in protobuf's words for the whole message
    return pb.ModelInferRequest.FromString(data)


def _split_raw_inputs(data: bytes) -> tuple[bytes, list[memoryview]] | None:
    """The fields of a serialized ModelInferRequest other than raw_input_contents (in their order, as bytes to
    parse), and views of its raw_input_contents entries; None where `_top_fields` leaves the message to protobuf."""
    fields = _top_fields(data)
    if type(fields) is not list:
        return None
    view = memoryview(data)
    kept = 0  # where the run of fields kept for the message began
    rest: list[memoryview] = []
    raw: list[memoryview] = []
    for key, at, body, end in fields:
        if key == _RAW_INPUT_TAG:
            rest.append(view[kept:at])
            raw.append(view[body:end])
            kept = end
    rest.append(view[kept:])
    return b"".join(rest), raw


# The fields an OversizedRequest's refusal reads: the model's name and version, and the id a stream's answer echoes.
_HEAD_FIELDS = frozenset(
    pb.ModelInferRequest.DESCRIPTOR.fields_by_name[name].number for name in ("model_name", "model_version", "id")
)


def _head_of(data: bytes) -> pb.ModelInferRequest | str:
    """The message of a serialized ModelInferRequest's model_name, model_version and id fields alone (each as
    protobuf reads it from the whole: the last one given, a wrong wire type an unknown field), its tensors and
    the rest not parsed; where `_top_fields` does not read the top-level fields or those three do not parse, why,
    in words. What is not walked is not parsed either: protobuf's own parse of a head-only message type keeps the
    fields it does not know, a copy of them (~39 ms for 60 MiB of INT64), and a map entry's parse is its own."""
    fields = _top_fields(data)
    if type(fields) is not list:
        return fields
    view = memoryview(data)
    try:
        return pb.ModelInferRequest.FromString(
            b"".join(view[at:end] for key, at, _, end in fields if key >> 3 in _HEAD_FIELDS)
        )
    except DecodeError:
        return "its model_name, model_version or id does not parse"


def _top_fields(data: bytes) -> list[tuple[int, int, int, int]] | str:
    """The top-level fields of a serialized message, each as (key, its start, its body's start, its end); where the
    walk meets what it leaves to protobuf, why, in words: more than _MAX_WALKED_FIELDS of them (a message of exactly
    that many is walked), a group, a bad wire type or field number, a tag of over 5 bytes or 32 bits, a varint of
    over 10 bytes, or a field past the end."""
    end = len(data)
    pos = 0
    fields: list[tuple[int, int, int, int]] = []
    while pos < end:
        if len(fields) == _MAX_WALKED_FIELDS:
            return f"more than {_MAX_WALKED_FIELDS} top-level fields"
        at = pos
        # A tag, or a length, of one byte read here: a call of _varint each took two thirds of the walk's time (a
        # message of 1,025 fields: 865 µs, 253 without; a large request's few: 2.7 µs, 1.3).
        key = data[pos]
        if key < 0x80:
            pos += 1
        else:
            key, pos = _varint(data, pos)
            # protobuf reads a tag as a varint of 5 bytes at most and 32 bits (upb's _upb_Decoder_DecodeTag): it
            # refuses a longer one, or a 5-byte one of a larger value, as bytes that do not parse
            if pos - at > 5 or key >> 32:
                break
        kind = key & 7
        if kind not in (0, 1, 2, 5):
            break
        if kind == 2:
            if pos < end and data[pos] < 0x80:
                length = data[pos]
                pos += 1
            else:
                length, pos = _varint(data, pos)
            body = pos
            pos += length
        elif kind == 0:
            _, pos = _varint(data, pos)
            body = at
        else:
            pos += 8 if kind == 1 else 4
            body = at
        if key >> 3 == 0 or pos > end or pos < 0:
            break
        fields.append((key, at, body, pos))
    else:
        return fields
    return f"its top-level field at byte {at} is not read (a group, a bad tag or varint, or a field past the end)"


def _over_limit(model: str, size: int, max_bytes: int) -> InvalidInput:
    return InvalidInput(
        f"request to model '{model}' is {size} bytes, over the limit of {max_bytes} bytes (the server's "
        "--max-request-bytes)"
    )


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """The varint at `pos` and the position after it; (-1, -1) past the end or past 10 bytes."""
    value = shift = 0
    for i in range(pos, min(pos + 10, len(data))):
        b = data[i]
        value |= (b & 0x7F) << shift
        if b < 0x80:
            # protobuf keeps the low 64 bits of a 10-byte varint: a length padded past them is read as they are
            return value & 0xFFFF_FFFF_FFFF_FFFF, i + 1
        shift += 7
    return -1, -1


class DecodePlan:
    """What decode_request reads of a model's config on every request, worked out once per model (each Servable
    builds its own): the input and output names as sets, and each input's datatype, its Datatype, its expected
    shape (batch dim first) and a getter of its fixed dims with their sizes. With them, and the refusals' texts made
    only to refuse, the server's read of a request of the demo mlp took 5.2 µs instead of 8.8 (docs/performance.md,
    "decode_request's work per request")."""

    __slots__ = ("input_names", "inputs", "output_names")

    def __init__(self, config) -> None:
        self.input_names = frozenset(t.name for t in config.inputs)
        self.output_names = frozenset(t.name for t in config.outputs)
        inputs = []
        for t in config.inputs:
            want = (-1, *t.dims)
            at = [i for i, w in enumerate(want) if w != -1]
            # itemgetter of one index gives the value, of several a tuple: the sizes are got from `want` by it.
            fixed = itemgetter(*at) if at else None
            inputs.append((t.name, t.datatype, DATATYPES[t.datatype], want, fixed, fixed(want) if fixed else None))
        self.inputs: tuple[tuple[str, str, Datatype, tuple[int, ...], Callable | None, object], ...] = tuple(inputs)


def _input_names(cfg) -> str:
    return ", ".join(t.name for t in cfg.inputs)


def decode_request(
    req: pb.ModelInferRequest | ReceivedRequest | OversizedRequest,
    servable,
    max_bytes: int | None = None,
    *,
    in_steps: bool = False,
) -> DecodedRequest:
    """Check a ModelInferRequest against the model's config and decode its inputs.

    An OversizedRequest (received over the server's limit: `parse_infer_request`) is refused, naming the bytes
    received. `max_bytes`: the limit for a request built in-process, which has no received size: its ByteSize()
    (the bytes protobuf would send) is held to it. The server passes none: its deserializer held the limit.

    `in_steps`: an input sent as more than CONTENTS_CHUNK typed values has its first chunk read
    here and the rest left in `pending`, for `finish_decoding`, which also runs the model's value
    checks; without it, everything is read here."""
    cfg = servable.config
    model = cfg.name
    if type(req) is OversizedRequest:
        raise _over_limit(model, req.size, req.max_bytes)
    if max_bytes is not None:
        size = req.ByteSize()
        if size > max_bytes:
            raise _over_limit(model, size, max_bytes)
    plan = servable.decode_plan
    # Names and messages are made only on a refusal: each costs every request otherwise (each read of a protobuf
    # field too, ~50-130 ns on a slow host: each is read once).
    tensors = req.inputs
    known = plan.input_names
    seen: dict[str, int] = {}
    for i, t in enumerate(tensors):
        name = t.name
        if name not in known:
            raise InvalidInput(
                f"unexpected input {quoted_name(name)} for model '{model}'; expected inputs: {_input_names(cfg)}"
            )
        if name in seen:
            raise InvalidInput(
                f"input '{name}' appears more than once (inputs {seen[name]} and {i}); expected each input once"
            )
        seen[name] = i
    if len(seen) != len(plan.inputs):  # `seen` holds only the config's names, each once
        missing = [t.name for t in cfg.inputs if t.name not in seen]
        names = ", ".join(f"'{m}'" for m in missing)
        inputs = "inputs" if len(missing) > 1 else "input"
        raise InvalidInput(f"missing {inputs} {names} for model '{model}'; expected inputs: {_input_names(cfg)}")
    raw = req.raw_input_contents
    _check_raw_entries(raw, len(seen), INPUT)  # len(seen): the request's inputs, each known and once

    arrays: dict[str, np.ndarray] = {}
    pending = []
    rows = None
    dim_ranges = servable.dim_ranges
    id_ranges = servable.id_ranges
    for name, datatype, dt, want, fixed, sizes in plan.inputs:
        i = seen[name]
        t = tensors[i]
        if t.datatype != datatype:
            raise InvalidInput(f"input '{name}': expected datatype {datatype}; got {_datatype_str(t.datatype)}")
        dims = t.shape
        if len(dims) != len(want) and len(dims) > _SHAPE_STR_DIMS:
            # Before the dims are read one by one: there may be millions of them (_SHAPE_STR_DIMS).
            raise _wrong_shape(name, want, dims)
        shape = tuple(dims[:])  # a slice of protobuf's repeated field is a list, made at once: half tuple()'s time
        # `len(shape) == len(want)` >= 1 before min() reads it.
        if len(shape) != len(want) or min(shape) < 0 or (fixed is not None and fixed(shape) != sizes):
            if any(s < 0 for s in shape):
                # A -1 sent back from the metadata would read "expected [-1, 4]; got [-1, 4]".
                raise InvalidInput(
                    f"input '{name}': expected dims >= 0; got {_shape_str(shape)}; -1 is only a wildcard, "
                    f"in the expected shape {_shape_str(want)} of the model's metadata"
                )
            raise _wrong_shape(name, want, shape)
        if dim_ranges and name in dim_ranges:
            _check_ranges(name, dim_ranges[name], shape, model)
        n = shape[0]
        if n < 1:
            raise InvalidInput(f"input '{name}': expected at least one row in the batch dimension; got 0")
        if n > cfg.max_batch_size:
            raise InvalidInput(
                f"input '{name}': expected at most {cfg.max_batch_size} rows (max_batch_size of model '{model}'); "
                f"got {n}"
            )
        if rows is None:
            rows = n
        elif n != rows:
            first = cfg.inputs[0].name
            raise InvalidInput(f"input '{name}': expected {rows} rows, as many as input '{first}' has; got {n}")
        if t.parameters and SHARED_MEMORY in t.parameters:
            # Triton's clients send such an input with no data of its own: say why, not "0 values".
            raise InvalidInput(
                f"input '{name}': parameter '{SHARED_MEMORY}' (shared memory) is not supported by this server; "
                "send the tensor in raw_input_contents"
            )
        if raw:
            if t.HasField("contents"):
                # Both would be data for one tensor; which one the client meant is a guess. A contents set but
                # empty is refused too, as Triton refuses any (the KServe spec: contents "must not be specified"
                # where raw contents are used); tritonclient never sets it beside raw_input_contents.
                fields = _counted(_fields(t.contents))
                got = fields or "set, with no values"
                raise InvalidInput(
                    f"input '{name}': sent both in raw_input_contents and in contents ({got}); expected one of them"
                )
            arrays[name] = array_from_raw(raw[i], dt, shape, name)
        else:
            check = None
            if id_ranges and name in id_ranges:
                low = servable.id_least.get(name, 0)
                check = _ChunkIds(name, id_ranges[name], low, model, math.prod(shape))
            steps = _contents_in_steps(t.contents, dt, shape, name, check=check)
            try:
                next(steps)
            except StopIteration as done:
                arrays[name] = done.value
            else:
                arrays[name] = None  # type: ignore[assignment]  # its place in the order, filled in later
                pending.append((name, steps))

    outputs = None
    if req.outputs:
        known = plan.output_names
        names: dict[str, int] = {}  # each output asked for, at its place in req.outputs (kept in that order)
        for j, o in enumerate(req.outputs):
            if o.name not in known:
                raise InvalidInput(
                    f"unknown output {quoted_name(o.name)} requested from model '{model}'; outputs: "
                    + ", ".join(t.name for t in cfg.outputs)
                )
            if o.name in names:
                # Refused, as Triton's core refused it before its later versions kept one copy: an
                # answer has one tensor per name, fewer than the request listed.
                raise InvalidInput(
                    f"output '{o.name}' requested more than once (outputs {names[o.name]} and {j}); "
                    "expected each output once"
                )
            for unsupported, what in UNSUPPORTED_OUTPUT_PARAMETERS.items() if o.parameters else ():
                if unsupported in o.parameters:
                    # Ignored, the client would get the whole tensor inline and take it for what it asked.
                    raise InvalidInput(
                        f"output '{o.name}': parameter '{unsupported}' ({what}) is not supported by this server; "
                        "request the output without it"
                    )
            names[o.name] = j
        outputs = tuple(names)

    timeout_s = priority = None
    params = req.parameters
    if params:
        timeout_s, priority = _request_parameters(params)

    if pending:
        if in_steps:
            return DecodedRequest(arrays, rows, outputs, timeout_s, priority, pending)
        # Read after the outputs and parameters are checked, as finish_decoding reads them: a value out
        # of range past the first chunk is refused after a bad parameter either way, and so is an id.
        _check_whole_ids(servable, arrays, pending)
        for name, steps in pending:
            arrays[name] = _finish(steps)
    elif id_ranges:
        check_ids(id_ranges, arrays, model, servable.id_least)
    servable.check(arrays)
    return DecodedRequest(arrays, rows, outputs, timeout_s, priority)


def _request_parameters(params) -> tuple[float | None, int | None]:
    """A request's parameters (read only where it has any): its timeout in seconds and its priority level, each None
    where absent (or 0); InvalidInput for one asking for sequence batching, and for a bad timeout or priority."""
    # Triton's sequence batcher keeps a model's state between a sequence's requests; wok
    # has none, and a sequence ignored would get stateless answers taken for the sequence's.
    for key in SEQUENCE_PARAMETERS:
        if key in params:
            p = params[key]
            which = p.WhichOneof("parameter_choice")
            # tritonclient sends none of them for sequence_id=0; 0, "" and false ask for nothing.
            if which is not None and getattr(p, which):
                raise InvalidInput(
                    f"parameter '{key}' ({_param_str(p)}) is not supported by this server: it has no "
                    "sequence batching (its models are stateless); send the requests without sequence "
                    "parameters (sequence_id, sequence_start, sequence_end)"
                )

    timeout_s = None
    if "timeout" in params:
        p = params["timeout"]
        which = p.WhichOneof("parameter_choice")
        if which not in _INTEGER_PARAMS or getattr(p, which) < 0:
            raise InvalidInput(
                "parameter 'timeout': expected a non-negative integer of microseconds as int64_param or "
                f"uint64_param; got {_param_str(p)}"
            )
        us = getattr(p, which)
        timeout_s = us / 1e6 if us > 0 else None

    priority = None
    if "priority" in params:
        p = params["priority"]
        which = p.WhichOneof("parameter_choice")
        if which not in _INTEGER_PARAMS or not 0 <= getattr(p, which) <= MAX_PRIORITY_LEVEL:
            raise InvalidInput(
                f"parameter 'priority': expected an integer from 0 to {MAX_PRIORITY_LEVEL} as int64_param or "
                f"uint64_param (1 most urgent, 0 the default); got {_param_str(p)}"
            )
        priority = getattr(p, which) or None
    return timeout_s, priority


def _datatype_str(got: str) -> str:
    """A request's datatype as a message's "got" names it: a V2 one as it is (FP64); any other
    quoted as names are (`errors.quoted`), cut as a long string parameter is, and said to be none."""
    if not got:
        return "(none)"
    if got in DATATYPES:
        return got
    shown = quoted(got, _PARAM_STR_CHARS)
    # Datatypes are matched exactly, as Triton matches them: "fp32" is no datatype.
    hint = f" (the datatypes are upper case: {got.upper()})" if got.upper() in DATATYPES else ""
    return f"{shown}, which is not a V2 datatype{hint}; the V2 datatypes: {', '.join(DATATYPES)}"


_INTEGER_PARAMS = ("int64_param", "uint64_param")
# A string parameter's value (or a datatype that is none) is quoted in a message up to this many
# characters: one of 10,000 must not make a 10 KB message. Fewer than a name's (NAME_CHARS): a value
# is recognised by its start, and a message may hold a name besides.
_PARAM_STR_CHARS = 40


def _param_str(p: pb.InferParameter) -> str:
    """A parameter's value as a message's "got" names it, with its kind: string_param '1',
    double_param 1000000.0, int64_param -5, bool_param true; a long string is cut."""
    which = p.WhichOneof("parameter_choice")
    if which is None:
        return "no value (none of its fields set)"
    v = getattr(p, which)
    if which == "bool_param":
        return f"bool_param {'true' if v else 'false'}"
    if which == "string_param":
        return f"string_param {quoted(v, _PARAM_STR_CHARS)}"  # as names are: control characters escaped
    return f"{which} {v!r}"  # a double as repr reads 1000000.0, inf, nan


def encode_response(
    model: str,
    request_id: str,
    outputs: Mapping[str, np.ndarray],
    types: Mapping[str, Datatype],
    only: tuple[str, ...] | None = None,
) -> pb.ModelInferResponse:
    resp = pb.ModelInferResponse(model_name=model, model_version="1", id=request_id)
    for name in only or outputs.keys():
        a = outputs[name]
        dt = types[name]
        resp.outputs.add(name=name, datatype=dt.name, shape=a.shape)
        resp.raw_output_contents.append(serialize_bytes(a) if dt.name == "BYTES" else a.tobytes())
    return resp


# -- client side -------------------------------------------------------------------------
_NUMPY_TO_V2 = {
    np.dtype(np.bool_): "BOOL",
    np.dtype(np.uint8): "UINT8",
    np.dtype(np.uint16): "UINT16",
    np.dtype(np.uint32): "UINT32",
    np.dtype(np.uint64): "UINT64",
    np.dtype(np.int8): "INT8",
    np.dtype(np.int16): "INT16",
    np.dtype(np.int32): "INT32",
    np.dtype(np.int64): "INT64",
    np.dtype(np.float16): "FP16",
    np.dtype(np.float32): "FP32",
    np.dtype(np.float64): "FP64",
    np.dtype(object): "BYTES",
}


def _is_bfloat16(dtype: np.dtype) -> bool:
    # ml_dtypes' bfloat16 (jax's), told by name so that the client need not import ml_dtypes.
    return dtype.name == "bfloat16" and dtype.itemsize == 2


def v2_datatype_of(a: np.ndarray) -> str:
    if a.dtype.kind in "SU":
        return "BYTES"
    try:
        return _NUMPY_TO_V2[a.dtype]
    except KeyError:
        if _is_bfloat16(a.dtype):
            return "BF16"
        raise ValueError(f"numpy dtype {a.dtype} has no V2 datatype") from None


def _check_datatype(name: str, a: np.ndarray, datatype: str) -> None:
    """An array's bytes go as they are: one of another dtype would reach the model as other values."""
    dt = DATATYPES.get(datatype)
    if dt is None:
        raise ValueError(f"input '{name}': unknown datatype {datatype!r}; expected one of {', '.join(DATATYPES)}")
    if dt.name == "BYTES":
        if a.dtype.kind not in "OSU":
            raise ValueError(
                f"input '{name}': expected an array of object, bytes or str for datatype BYTES; got {a.dtype}"
            )
    elif dt.name == "BF16":
        if a.dtype != np.uint16 and not _is_bfloat16(a.dtype):
            raise ValueError(
                f"input '{name}': expected an array of uint16 (bfloat16 words) or ml_dtypes.bfloat16 for datatype "
                f"BF16; got {a.dtype}"
            )
    elif a.dtype != dt.numpy:
        raise ValueError(f"input '{name}': expected an array of {dt.numpy} for datatype {dt.name}; got {a.dtype}")


def encode_request(
    model: str,
    inputs: Mapping[str, np.ndarray],
    outputs: Iterable[str] | None = None,
    request_id: str = "",
    timeout_us: int | None = None,
    datatypes: Mapping[str, str] | None = None,
    priority: int | None = None,
) -> pb.ModelInferRequest:
    """A ModelInferRequest with every input in raw_input_contents."""
    req = pb.ModelInferRequest(model_name=model, id=request_id)
    for name, a in inputs.items():
        a = np.asarray(a)
        dtype = datatypes.get(name) if datatypes else None
        if dtype:
            _check_datatype(name, a, dtype)
        else:
            dtype = v2_datatype_of(a)
        req.inputs.add(name=name, datatype=dtype, shape=a.shape)
        if dtype == "BYTES":
            req.raw_input_contents.append(serialize_bytes(a))
        else:
            req.raw_input_contents.append(np.ascontiguousarray(a).tobytes())
    for name in outputs or ():
        req.outputs.add(name=name)
    if timeout_us is not None:
        req.parameters["timeout"].int64_param = _whole(timeout_us, "timeout_us (the clients' server_timeout_us)")
    if priority is not None:
        req.parameters["priority"].int64_param = _whole(priority, "priority")
    return req


def _whole(value, what: str) -> int:
    """An integer parameter's value, refused unless whole: int() dropped a fraction without a word (a
    timeout of 0.5 µs was sent as 0, which asks for no timeout at all)."""
    number = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))
    if not number or not float(value).is_integer():
        raise ValueError(f"{what}: expected a whole number; got {value!r}")
    return int(value)


def decode_response(resp: pb.ModelInferResponse) -> dict[str, np.ndarray]:
    """An answer's outputs as arrays, by name. An answer that cannot be read (the server's fault, not the
    request's) raises ValueError naming the output, what was expected and what was got."""
    raw = resp.raw_output_contents
    _check_raw_entries(raw, len(resp.outputs), OUTPUT)
    out: dict[str, np.ndarray] = {}
    # Messages made only on a refusal: every answer a client reads passes here (~1.2 µs an output
    # more when each was named, and its places kept, up front).
    for i, t in enumerate(resp.outputs):
        name = t.name
        if name in out:
            # A dict keeps one of them: the other would be dropped without a word.
            first = next(j for j, o in enumerate(resp.outputs) if o.name == name)
            raise ValueError(
                f"{OUTPUT.tensor(name)} appears more than once (outputs {first} and {i}); expected each once"
            )
        dt = DATATYPES.get(t.datatype)
        if dt is None:
            raise ValueError(f"{OUTPUT.tensor(name)}: expected a V2 datatype; got {_datatype_str(t.datatype)}")
        shape = tuple(t.shape)
        if shape and min(shape) < 0:
            # numpy would take a -1 for "the rest" and reshape the values to a shape the server did not send.
            raise ValueError(f"{OUTPUT.tensor(name)}: expected dims >= 0; got {_shape_str(shape)}")
        if raw:
            if t.HasField("contents") and (fields := _fields(t.contents)):
                # Both would be data for one output, the contents read nowhere: which one the server meant is a
                # guess, as for a request's input. A contents set with no values drops none and is read past.
                got = _counted(fields)
                raise ValueError(
                    f"{OUTPUT.tensor(name)}: sent both in raw_output_contents and in contents ({got}); "
                    "expected one of them"
                )
            out[name] = array_from_raw(raw[i], dt, shape, name, OUTPUT)
        else:
            out[name] = array_from_contents(t.contents, dt, shape, name, OUTPUT)
    return out
