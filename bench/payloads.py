"""Request payloads built from a model's metadata, with variable dimensions of sampled length.

The load generator knows a model only through its V2 ModelMetadata: names, datatypes
and shapes with -1 for the batch dimension and for any dimension of variable length.
A PayloadGenerator fills those in: the batch dimension with `rows`, every other -1 with
one length per request drawn from a size distribution (a sequence length, a number of
ids), so that the server sees the spread of shapes a real workload brings. Payloads
are pre-made in a pool (`plan_pool`): one per size the distribution can draw where they fit
under a byte cap, so that each request's size, drawn when its step is scheduled, has its
payload, the tail included; the send loop only picks one by index.

numpy, wok.datatypes and wok.bench.arrivals (numpy only) alone: bench worker processes import this and must start
fast.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

from wok.bench.arrivals import csv_rows, header_names, is_note, read_utf8, text_lines
from wok.datatypes import datatype
from wok.numerals import SPACES, ascii_digits, read_float, underscore_note

# The bound of integer inputs when none is given: every wok demo model accepts ids below it. A
# server's KServe metadata does not say a model's id range, so the bench cannot find a better one;
# `wok profile`, which loads the model, uses its smallest embedding table instead (profiler.id_range).
DEFAULT_INT_HIGH = 50

__all__ = [
    "Empirical",
    "Fixed",
    "LogNormal",
    "Mix",
    "PayloadGenerator",
    "PoolPlan",
    "Sizes",
    "TensorSpec",
    "Uniform",
    "check_int_high",
    "integer_cap",
    "integer_refusal",
    "parse_mix",
    "parse_sizes",
    "plan_pool",
    "support_of",
]


def _quoted(text: str) -> str:
    """`text` as a refusal shows user text (wok.errors.quoted_name: quoted, escaped, cut); imported
    here, for a refusal only: wok.errors imports gRPC (see the module's doc)."""
    from wok.errors import quoted_name

    return quoted_name(text)


# The largest size a distribution may give: sizes are drawn as int64 (Empirical's bound too). A fixed:10^20 was
# accepted, and its first draw ended the run in an OverflowError traceback.
SIZE_MOST = 2**63 - 1


def _int(value: object, what: str, minimum: int, most: int | None = None) -> int:
    # A whole float passes (a size read from JSON may be 4.0); integer_refusal says why anything else does not.
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if (refusal := integer_refusal(what, value, minimum)) is not None:
        raise ValueError(refusal)
    if most is not None and value > most:  # the top said only to a value past it
        raise ValueError(integer_refusal(what, value, minimum, most=most))
    return int(value)


def integer_refusal(option: str, value: object, least: int, why: str = "", most: int | None = None) -> str | None:
    """The refusal of an integer option below `least` (or above `most`), or of a value that is no integer, in the one
    wording of every bench command and script (`--reps: expected an integer >= 1; got 0`; with `most`, `expected an
    integer from 0 to 51`; `why`, said after the bound, the reason for it); None where `value` is within it."""
    bound = f">= {least}" if most is None else f"from {least} to {most}"
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        got = repr(value)
    elif least <= value and (most is None or value <= most):
        return None
    else:
        got = str(int(value))  # np.int64(3) said as 3
    return f"{option}: expected an integer {bound}{why}; got {got}"


def check_int_high(value: int) -> int:
    """`--int-high` (`wok bench ramp`'s, `wok profile`'s), refused below 1 in one wording wherever it is given."""
    if (refusal := integer_refusal("--int-high", value, 1)) is not None:
        raise ValueError(refusal)
    return value


def integer_cap(name: str) -> int | None:
    """The bound PayloadGenerator draws an input of datatype `name` below, whatever its int_high: the type's largest
    value + 1 (128 for INT8); None for a datatype not drawn as integers (BF16 travels as uint16 words of floats
    drawn as such, BOOL and BYTES are not numbers)."""
    dt = datatype(name)
    if dt.name == "BF16" or dt.numpy.kind not in "iu":
        return None
    return int(np.iinfo(dt.numpy).max) + 1


@dataclass(frozen=True)
class TensorSpec:
    """One model input as ModelMetadata gives it: batch dimension first, -1 where any length goes."""

    name: str
    datatype: str
    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        datatype(self.datatype)  # an unknown name fails here, with the list of known ones
        shape = tuple(int(d) for d in self.shape)
        if any(d < -1 for d in shape):
            raise ValueError(f"input '{self.name}': dimensions: expected sizes >= 0 or -1; got {list(shape)}")
        object.__setattr__(self, "shape", shape)


# -- sizes -------------------------------------------------------------------------------------
@runtime_checkable
class Sizes(Protocol):
    """The distribution of a variable dimension's length."""

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """n lengths as int64, each >= 0."""
        ...


@dataclass(frozen=True)
class Fixed:
    """Always `n` (0 allowed: some models, like recsys's ids, accept an empty list)."""

    n: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "n", _int(self.n, "fixed size", 0, SIZE_MOST))

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.full(n, self.n, dtype=np.int64)


@dataclass(frozen=True)
class Uniform:
    """Uniform over lo..hi, both included (lo may be 0)."""

    lo: int
    hi: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "lo", _int(self.lo, "uniform lo", 0, SIZE_MOST))
        object.__setattr__(self, "hi", _int(self.hi, "uniform hi", 0, SIZE_MOST))
        if self.hi < self.lo:
            raise ValueError(f"uniform hi {self.hi} is below lo {self.lo}")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.integers(self.lo, self.hi + 1, n, dtype=np.int64)


@dataclass(frozen=True)
class LogNormal:
    """round(median·e^(σZ)), clipped to [1, max]: most requests short, a long tail of long ones.

    Never 0. Clipping piles the tail beyond `max` onto `max`, as a model's length limit
    would (truncation) rather than dropping those requests.
    """

    median: float
    sigma: float
    max: int

    def __post_init__(self) -> None:
        if not (math.isfinite(self.median) and self.median > 0):
            raise ValueError(f"lognormal median: expected a finite number > 0; got {self.median!r}")
        if not (math.isfinite(self.sigma) and self.sigma >= 0):
            raise ValueError(f"lognormal sigma: expected a finite number >= 0; got {self.sigma!r}")
        object.__setattr__(self, "max", _int(self.max, "lognormal max", 1, SIZE_MOST))
        if self.median > self.max:
            raise ValueError(f"lognormal median: expected at most max {self.max}; got {self.median:g}")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        x = np.rint(self.median * np.exp(self.sigma * rng.standard_normal(n)))
        return np.clip(x, 1, self.max).astype(np.int64)


class Empirical:
    """Resampled, with replacement, from observed sizes (e.g. a trace's size column); 0 allowed."""

    def __init__(self, values: Sequence[int] | np.ndarray) -> None:
        raw = np.asarray(values).reshape(-1)
        if raw.size == 0:
            raise ValueError("empirical sizes: no values")
        expected = "empirical sizes: expected integers 0 <= n < 2**63"
        if raw.dtype.kind not in "iuf":
            raise ValueError(f"{expected}; got values of dtype {raw.dtype}")
        # An infinite float is its own floor, and a uint64 or float from 2**63 up passed as well: each was cast to
        # int64's minimum, a negative size.
        bad = (raw < 0) | (raw >= 2**63)
        if raw.dtype.kind == "f":
            bad |= ~np.isfinite(raw) | (raw != np.floor(raw))
        if np.any(bad):
            i = int(np.argmax(bad))
            raise ValueError(f"{expected}; got {raw[i].item()!r} at index {i}")
        self.values = raw.astype(np.int64)

    def __repr__(self) -> str:
        return f"Empirical({self.values.size} values, {self.values.min()}..{self.values.max()})"

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return self.values[rng.integers(0, self.values.size, n)]


def _read_sizes(path: Path) -> np.ndarray:
    """Sizes from one integer a line, a CSV with a `size` column, or JSONL objects with "size"."""
    # With or without a byte-order mark, as load_trace reads traces: a spreadsheet's made the header
    # '\ufeffsize' and the file refused.
    text = read_utf8(path)
    lines = [(i, line.strip(SPACES)) for i, line in text_lines(text) if not is_note(line)]
    if not lines:
        read = [line for _, line in text_lines(text)]
        if not read:
            got = "an empty file"
        elif any(line.strip(SPACES) for line in read):
            got = f"only comments and blank lines ({len(read)} line{'s' if len(read) > 1 else ''})"
        else:
            got = f"only blank lines ({len(read)})"
        raise ValueError(
            f"{path}: expected sizes, one integer a line, a CSV with a 'size' column or JSONL objects with \"size\"; "
            f"got {got}"
        )
    values = []
    first = lines[0][1]
    if path.suffix.lower() in (".jsonl", ".ndjson") or first.startswith("{"):
        for i, line in lines:
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{i}: not JSON ({e.msg})") from None
            if not isinstance(obj, dict) or obj.get("size") is None:
                raise ValueError(f'{path}:{i}: expected an object with a "size" field')
            values.append((i, obj["size"]))
    elif ascii_digits(first):
        values = lines
    else:
        fields, header, rows = csv_rows(text, ("size",), path)
        if "size" not in fields:
            raise ValueError(
                f"{path}:{header}: expected one integer a line, or a CSV header with a 'size' column; got "
                f"{header_names(fields)}"
            )
        values = [(i, row["size"]) for i, row in rows]
        if not values:
            # Empirical's own refusal said "empirical sizes: no values", naming neither the file nor what it held.
            raise ValueError(
                f"{path}:{header}: expected sizes, a row each under the CSV header's 'size' column; got the header "
                f"({header_names(fields)}) and no rows"
            )
    out = []
    for i, v in values:
        text_v = str(v).strip(SPACES)
        if isinstance(v, bool) or not ascii_digits(text_v):
            raise ValueError(f"{path}:{i}: size {v!r} is not an integer >= 0{underscore_note(text_v)}")
        if int(text_v) >= 2**63:
            # It left as an OverflowError from numpy, naming neither the file nor the line.
            raise ValueError(f"{path}:{i}: size {v!r} is not below 2**63")
        out.append(int(text_v))
    return np.asarray(out, dtype=np.int64)


_SIZES_HELP = "expected fixed:N, uniform:LO:HI, lognormal:median=M,sigma=S,max=N or empirical:PATH"


def parse_sizes(spec: str) -> Sizes:
    """ "fixed:16" (or just "16"), "uniform:1:64", "lognormal:median=20,sigma=0.8,max=256", "empirical:PATH"."""
    kind, _, rest = spec.strip(SPACES).partition(":")
    kind = kind.strip(SPACES).lower()
    rest = rest.strip(SPACES)
    try:
        if ascii_digits(kind) and not rest:
            return Fixed(int(kind))
        if kind == "fixed":
            if not ascii_digits(rest):
                raise ValueError(f"expected fixed:N with N an integer >= 0; got {_quoted(rest)}{underscore_note(rest)}")
            return Fixed(int(rest))
        if kind == "uniform":
            m = re.fullmatch(r"([0-9]+)\s*:\s*([0-9]+)", rest, re.ASCII)
            if m is None:
                raise ValueError(
                    f"expected uniform:LO:HI with integers 0 <= LO <= HI; got {_quoted(rest)}{underscore_note(rest)}"
                )
            return Uniform(int(m.group(1)), int(m.group(2)))
        if kind == "lognormal":
            opts: dict[str, str] = {}
            for item in rest.split(",") if rest else []:
                key, eq, value = (x.strip(SPACES) for x in item.partition("="))
                if not eq or key not in ("median", "sigma", "max") or key in opts or not value:
                    raise ValueError(f"expected median=M,sigma=S,max=N, each once; got {_quoted(item.strip(SPACES))}")
                opts[key] = value
            missing = [k for k in ("median", "sigma", "max") if k not in opts]
            if missing:
                raise ValueError(f"lognormal needs median, sigma and max; missing {', '.join(missing)}")
            numbers = {}
            for key in ("median", "sigma"):
                try:
                    numbers[key] = read_float(opts[key])
                except ValueError:
                    raise ValueError(
                        f"lognormal {key}: expected a number; got {_quoted(opts[key])}{underscore_note(opts[key])}"
                    ) from None
            median, sigma = numbers["median"], numbers["sigma"]
            if not ascii_digits(opts["max"]):
                raise ValueError(
                    f"lognormal max: expected an integer >= 1; got {_quoted(opts['max'])}{underscore_note(opts['max'])}"
                )
            return LogNormal(median, sigma, int(opts["max"]))
        if kind == "empirical":
            if not rest:
                raise ValueError("expected empirical:PATH")
            return Empirical(_read_sizes(Path(rest)))
    except (ValueError, OSError) as e:
        raise ValueError(f"sizes {_quoted(spec)}: {e}") from None
    raise ValueError(
        f"sizes {_quoted(spec)}: unknown distribution {_quoted(kind)}; {_SIZES_HELP}{underscore_note(kind)}"
    )


# -- payloads ----------------------------------------------------------------------------------
# The longest string a BYTES input's payload holds (each is 1 to this many random letters).
BYTES_LONGEST = 16


def _varint_len(n) -> np.ndarray:
    """The bytes of protobuf's varint of each n >= 0 (float64, elementwise): 7 bits a byte."""
    n = np.asarray(n, dtype=np.float64)
    return 1.0 + sum((n >= 2.0**bits).astype(np.float64) for bits in range(7, 64, 7))


def _string_field(length: int) -> float:
    """The bytes of a string field of `length` bytes: none when empty (proto3 leaves it out)."""
    return float(1 + _varint_len(length) + length) if length else 0.0


class PayloadGenerator:
    """One request's inputs for `model`, shaped by its metadata.

    The first dimension is the batch: -1 there becomes `rows` (a fixed first dimension,
    from a model that does not batch, is kept). Every other -1 becomes the request's
    size: the one given to make(), or one drawn from `sizes`, shared by all variable
    dimensions of the request. Values: integers uniform in [0, int_high) (an input named in
    `int_highs`, below its own; capped at the type's maximum; every wok demo model accepts ids
    below 50), floats standard normal in the declared type (BF16 as the uint16 words of truncated float32), BOOL fair
    coin flips, BYTES short random lowercase strings.

    `rng` may be None in make() and pool(): the generator's own, seeded with `seed`.
    """

    def __init__(
        self,
        model: str,
        inputs: Sequence[TensorSpec],
        sizes: Sizes = Fixed(16),  # frozen, so one shared default is safe
        rows: int = 1,
        seed: int = 0,
        int_high: int = DEFAULT_INT_HIGH,
        int_highs: Mapping[str, int] | None = None,
    ) -> None:
        # Any object with name, datatype and shape will do (a client's TensorInfo, a protobuf).
        self.inputs = tuple(
            t if isinstance(t, TensorSpec) else TensorSpec(t.name, t.datatype, tuple(t.shape)) for t in inputs
        )
        if not self.inputs:
            raise ValueError(f"model '{model}': no inputs to generate")
        self.model = model
        self.sizes = sizes
        self.rows = _int(rows, "rows", 1)
        self.int_high = _int(int_high, "int_high", 1)
        self.int_highs = {name: _int(high, f"int_highs[{name!r}]", 1) for name, high in (int_highs or {}).items()}
        self.rng = np.random.default_rng(seed)

    @property
    def datatypes(self) -> dict[str, str]:
        """Input name -> V2 datatype, for encode_request(datatypes=...): BF16 cannot be told from UINT16."""
        return {t.name: t.datatype for t in self.inputs}

    @property
    def variable(self) -> bool:
        """Whether any input has a variable dimension besides the batch: else `sizes` changes nothing."""
        return any(-1 in t.shape[1:] for t in self.inputs)

    def nbytes(self, sizes: np.ndarray) -> np.ndarray:
        """The serialized request of each size in bytes (float64), as `wok.codec.encode_request` writes
        it: protobuf's wire format counted field by field, so exact for every datatype but BYTES, whose
        strings' lengths are drawn: each is counted at its longest (its 4-byte length and BYTES_LONGEST
        letters), an upper bound. The pool's cap is held against this (`plan_pool`): an estimate of the
        average let a pool planned just under the cap serialize to more than it."""
        s = np.asarray(sizes, dtype=np.float64)
        total = np.full(s.shape, _string_field(len(self.model.encode())))  # model_name; id and the rest empty
        for t in self.inputs:
            dt = datatype(t.datatype)
            per = 4.0 + BYTES_LONGEST if dt.name == "BYTES" else float(dt.itemsize)
            fixed = math.prod(self.shape_of(t, 1))  # the elements of size 1: the rest grow with it
            k = sum(1 for d in t.shape[1:] if d == -1)
            raw = per * fixed * s**k
            shape = np.zeros(s.shape)
            if t.shape:  # packed int64s: the fixed dimensions' varints and one of the size per variable one
                first = self.rows if t.shape[0] == -1 else t.shape[0]
                dims = sum(float(_varint_len(d)) for d in (first, *(d for d in t.shape[1:] if d != -1)))
                dims = dims + k * _varint_len(s)
                shape = 1 + _varint_len(dims) + dims
            tensor = _string_field(len(t.name.encode())) + _string_field(len(t.datatype.encode())) + shape
            total += 1 + _varint_len(tensor) + tensor  # inputs: tag, length, the InferInputTensor
            total += 1 + _varint_len(raw) + raw  # raw_input_contents: tag, length, the bytes (even none)
        return total

    def shape_of(self, spec: TensorSpec, size: int) -> tuple[int, ...]:
        if not spec.shape:
            return ()
        first = self.rows if spec.shape[0] == -1 else spec.shape[0]
        return (first, *(size if d == -1 else d for d in spec.shape[1:]))

    def _values(self, spec: TensorSpec, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
        dt = datatype(spec.datatype)
        kind = dt.numpy.kind
        if dt.name == "BF16":
            bits = rng.standard_normal(shape, dtype=np.float32).view(np.uint32)
            return (bits >> 16).astype(np.uint16)
        if kind == "f":
            if dt.numpy == np.float32 or dt.numpy == np.float64:
                return rng.standard_normal(shape, dtype=dt.numpy)
            return rng.standard_normal(shape, dtype=np.float32).astype(dt.numpy)
        cap = integer_cap(spec.datatype)
        if cap is not None:
            high = min(self.int_highs.get(spec.name, self.int_high), cap)
            return rng.integers(0, high, shape, dtype=dt.numpy)
        if kind == "b":
            return rng.random(shape) < 0.5
        # BYTES: one draw of letters, cut into strings of 1 to BYTES_LONGEST bytes.
        count = math.prod(shape)
        lengths = rng.integers(1, BYTES_LONGEST + 1, count)
        letters = rng.integers(ord("a"), ord("z") + 1, int(lengths.sum()), dtype=np.uint8).tobytes()
        ends = np.cumsum(lengths)
        out = np.empty(count, dtype=object)
        out[:] = [letters[e - n : e] for e, n in zip(ends.tolist(), lengths.tolist())]
        return out.reshape(shape)

    def make(self, rng: np.random.Generator | None = None, size: int | None = None) -> dict[str, np.ndarray]:
        """One request's inputs, by name in the model's order."""
        rng = self.rng if rng is None else rng
        if size is None:
            size = int(self.sizes.sample(rng, 1)[0])
        size = _int(size, "size", 0)
        return {t.name: self._values(t, self.shape_of(t, size), rng) for t in self.inputs}

    def pool(self, n: int, rng: np.random.Generator | None = None) -> list[dict[str, np.ndarray]]:
        """n pre-made requests, sizes drawn independently from `sizes`."""
        rng = self.rng if rng is None else rng
        return [self.make(rng, int(s)) for s in self.sizes.sample(rng, _int(n, "n", 0))]


# -- the pool ----------------------------------------------------------------------------------
# At least this many payloads per model: a pool of one payload per size gives each size several
# variants up to it, so that a fixed size or a narrow range keeps the values' variety of a pool of
# draws (recsys's ids: at most this many × ids per request distinct embedding rows are read).
POOL_PER_MODEL = 256
# The pool's serialized bytes, all models of a mix together: every worker process holds a copy.
# Held against PayloadGenerator.nbytes, exact (a BYTES string at its longest): one payload alone may pass it.
POOL_CAP_BYTES = 64 << 20
# The most distinct sizes made one payload each; and the largest pool of draws past the cap.
MAX_SUPPORT = 1 << 16
MAX_DRAWS = 1 << 16
# A lognormal's sizes beyond this many σ either side of its median are left out of its support:
# together a mass of 2·Φ(−6) ≈ 2e-9, 0.2 requests expected in a day at 1,000 QPS. Its sizes range up
# to `max`, and one payload for every size up to a large max (4,096) outgrew the cap.
LOGNORMAL_TAIL_Z = 6.0


def support_of(sizes: Sizes, limit: int = MAX_SUPPORT) -> np.ndarray | None:
    """Every size `sizes` can draw, increasing (int64): a range for Fixed, Uniform and LogNormal (cut
    at LOGNORMAL_TAIL_Z σ), the distinct values for Empirical. None for a distribution of another
    kind (its sizes are unknown) or one of more than `limit` sizes."""
    if isinstance(sizes, Fixed):
        return np.array([sizes.n], dtype=np.int64)
    if isinstance(sizes, Uniform):
        lo, hi = sizes.lo, sizes.hi
    elif isinstance(sizes, LogNormal):
        spread = math.exp(LOGNORMAL_TAIL_Z * sizes.sigma)
        lo = max(1, round(sizes.median / spread))
        hi = max(lo, min(sizes.max, round(sizes.median * spread)))
    elif isinstance(sizes, Empirical):
        values = np.unique(sizes.values)
        return values if values.size <= limit else None
    else:
        return None
    return np.arange(lo, hi + 1, dtype=np.int64) if hi - lo + 1 <= limit else None


@dataclass(frozen=True)
class PoolPlan:
    """Which payloads a model's slice of the pool holds, and how a request picks one.

    `kind` "per_size": `variants` payloads of each size of `support`, each request's size drawn
    from `sizes` as its step is scheduled (a lognormal's draw beyond its support takes the nearest
    end of it). "draws": `sizes` drawn once, picked uniformly (over the cap: the sizes the draws
    missed are never sent; `note` says so). "fixed_shape": the model has no variable dimension,
    `sizes` changes nothing; picked uniformly. `payload_sizes`: each payload's size, in pool order.
    """

    kind: str
    sizes: Sizes
    payload_sizes: np.ndarray
    support: np.ndarray | None = None
    variants: int = 1
    note: str | None = None

    def __len__(self) -> int:
        return len(self.payload_sizes)

    def pick(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """Each of n requests' payload, an index into the slice (int64)."""
        if self.kind != "per_size":
            return rng.integers(0, len(self.payload_sizes), n, dtype=np.int64)
        support = self.support
        drawn = np.clip(self.sizes.sample(rng, n), support[0], support[-1])
        at = np.searchsorted(support, drawn)
        if not np.array_equal(support[at], drawn):
            raise RuntimeError(f"sizes {self.sizes!r} drew a size outside its support {support[0]}..{support[-1]}")
        if self.variants > 1:
            return at * self.variants + rng.integers(0, self.variants, n, dtype=np.int64)
        return at


def plan_pool(
    gen: PayloadGenerator,
    budget_bytes: float,
    rng: np.random.Generator,
    min_payloads: int = POOL_PER_MODEL,
    cap_text: str | None = None,
) -> PoolPlan:
    """The payloads of `gen`'s slice: one per size of `gen.sizes` (with variants up to `min_payloads`
    in all) when they fit in `budget_bytes`, else as many draws as fit (at most MAX_DRAWS, at least
    one), the `note` naming the cap (`cap_text`, else the budget) and the sizes kept. A model without
    a variable dimension: `min_payloads` requests, or as many as fit (at least one, said in `note`)."""
    cap_text = cap_text or f"{budget_bytes / 2**20:g} MiB"
    if not gen.variable:
        each = float(gen.nbytes(np.ones(1))[0])
        count = _fitting(each, budget_bytes, min_payloads)
        note = None
        if count < min_payloads:
            note = (
                f"model '{gen.model}': its requests are {_mib(each)} each, so {count} of them fit in the pool's "
                f"cap of {cap_text}, not {min_payloads}: the values sent repeat every {count} requests"
                + (" (one request alone is over the cap)" if each > budget_bytes else "")
            )
        return PoolPlan("fixed_shape", gen.sizes, np.zeros(count, dtype=np.int64), note=note)
    support = support_of(gen.sizes)
    if support is not None:
        one_each = float(gen.nbytes(support).sum())
        variants = max(1, -(-min_payloads // len(support)))
        variants = _fitting(one_each, budget_bytes, variants)
        if one_each <= budget_bytes:
            return PoolPlan("per_size", gen.sizes, np.repeat(support, variants), support, variants)
        why = (
            f"one payload per size ({support[0]}..{support[-1]}, {len(support)} sizes) would take "
            f"{one_each / 2**20:.1f} MiB, over the pool's cap of {cap_text}"
        )
    elif isinstance(gen.sizes, (Uniform, LogNormal, Empirical)):
        why = f"its sizes are more than the {MAX_SUPPORT} a pool makes one payload each for (its cap: {cap_text})"
    else:
        why = f"its sizes ({gen.sizes!r}) are not known ahead, to make one payload each (the pool's cap: {cap_text})"
    draws = gen.sizes.sample(rng, MAX_DRAWS)
    draw_bytes = gen.nbytes(draws)
    fit = int(np.searchsorted(np.cumsum(draw_bytes), budget_bytes, side="right"))
    # The cap holds before the variety: every worker process holds the pool, and 256 requests of a
    # large input (an image model's) would take gigabytes in each. One is kept whatever its size.
    kept = draws[: max(1, fit)]
    distinct = np.unique(kept)
    if support is None:
        missed = f"the sizes the draws missed are never sent, any beyond {kept.max()} among them"
    elif kept.max() < support[-1]:
        missed = (
            f"the {len(support) - len(distinct)} sizes the draws missed are never sent, "
            f"every size beyond {kept.max()} up to {support[-1]} among them"
        )
    else:
        missed = f"the {len(support) - len(distinct)} sizes the draws missed are never sent"
    fewer = ""
    if fit < min_payloads:
        fewer = f", fewer than the {min_payloads} a pool holds where they fit" + (
            f" (the first draw alone, {_mib(float(draw_bytes[0]))}, is over the cap)" if fit == 0 else ""
        )
    note = (
        f"model '{gen.model}': {why}; a pool of {len(kept)} draws (as many as fit{fewer}) "
        f"is sent instead, sizes {kept.min()}..{kept.max()} ({len(distinct)} distinct): {missed}"
    )
    return PoolPlan("draws", gen.sizes, kept, note=note)


def _fitting(each_bytes: float, budget_bytes: float, most: int) -> int:
    """How many payloads of `each_bytes` a pool holds: as many as fit in `budget_bytes`, at most
    `most`, and one even when it alone is over."""
    return max(1, min(most, int(budget_bytes // each_bytes)))


def _mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:.1f} MiB" if nbytes >= 2**20 / 10 else f"{nbytes / 1024:.1f} KiB"


class Mix:
    """Several models' generators, chosen per request by weight (weights need not sum to 1)."""

    def __init__(self, entries: Sequence[tuple[PayloadGenerator, float]]) -> None:
        if not entries:
            raise ValueError("a mix needs at least one model")
        self.generators = [g for g, _ in entries]
        weights = np.asarray([w for _, w in entries], dtype=np.float64)
        if not np.all(np.isfinite(weights)) or np.any(weights < 0) or weights.sum() <= 0:
            raise ValueError(f"mix weights: expected finite numbers >= 0 with a sum > 0; got {weights.tolist()}")
        self.weights = weights / weights.sum()

    def __len__(self) -> int:
        return len(self.generators)

    def choose(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """The index of the generator for each of n requests (int64)."""
        if len(self.generators) == 1:
            return np.zeros(n, dtype=np.int64)
        return rng.choice(len(self.generators), size=n, p=self.weights).astype(np.int64)


def parse_mix(spec: str) -> list[tuple[str, float]]:
    """ "mlp:0.7,encoder:0.3" -> [("mlp", 0.7), ("encoder", 0.3)], weights normalised to sum 1.

    Weights are given for every model or for none ("mlp,encoder" mixes equally).
    """
    items = [item.strip(SPACES) for item in spec.split(",")]
    if not spec.strip(SPACES) or any(not item for item in items):
        raise ValueError(f"model mix {_quoted(spec)}: expected NAME[:WEIGHT],... (e.g. 'mlp:0.7,encoder:0.3')")
    names: list[str] = []
    weights: list[float | None] = []
    for item in items:
        name, colon, weight = (x.strip(SPACES) for x in item.rpartition(":")) if ":" in item else (item, "", "")
        if not name:
            raise ValueError(f"model mix {_quoted(spec)}: {_quoted(item)} has no model name")
        if name in names:
            raise ValueError(f"model mix {_quoted(spec)}: model {_quoted(name)} appears twice")
        value: float | None = None
        if colon:
            try:
                value = read_float(weight)
            except ValueError:
                value = None
            if value is None or not math.isfinite(value) or value <= 0:
                raise ValueError(
                    f"model mix {_quoted(spec)}: weight {_quoted(weight)} of {_quoted(name)} is not a number > 0"
                    f"{underscore_note(weight)}"
                )
        names.append(name)
        weights.append(value)
    given = [w is not None for w in weights]
    if any(given) and not all(given):
        raise ValueError(f"model mix {_quoted(spec)}: give a weight for every model or for none")
    raw = [w if w is not None else 1.0 for w in weights]
    total = sum(raw)
    return [(name, w / total) for name, w in zip(names, raw)]
