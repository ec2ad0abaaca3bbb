"""Arrival processes for the open-loop load generator: when each request is meant to be sent.

Every process gives, for a window of `duration_s` seconds, the intended send times as
offsets from the window's start (sorted float64, each in [0, duration_s)). Open loop
means these times do not move when the server is slow: a late response never delays
the next send, so queueing shows up as latency instead of being hidden by a slower
client (coordinated omission).

`rate(t)` is the intensity λ(t) in requests/s at the same offsets that `times()` uses,
so realised per-second counts can be set against it; `cumulative(t)` is its integral
over [0, t), the expected number of arrivals before t. The inhomogeneous processes
(Burst, Sawtooth) are drawn exactly by thinning (Lewis and Shedler, 1979): a Poisson
stream at a bound on λ, each arrival kept with probability λ(t)/bound. A sawtooth's bound
is its peak (at most twice its mean); a burst's base rate is drawn on its own and its bump
thinned from a bound that steps down with the bump, so that the candidates drawn stay
near the expected count however sharp the spike. No time step is involved, so no bin
width biases the counts.

numpy only: bench worker processes import this and must start fast (no torch).
"""

from __future__ import annotations

import codecs
import csv
import io
import json
import math
import re
import unicodedata
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

from ..numerals import SPACES, ascii_digits, digits_note, read_float, underscore_note


def _quoted(text: str) -> str:
    """`text` as a refusal shows user text (wok.errors.quoted_name: quoted, escaped, cut); imported
    here, for a refusal only: wok.errors imports gRPC (see the module's doc)."""
    from wok.errors import quoted_name

    return quoted_name(text)


def csv_columns(names: Sequence[str] | None, known: Sequence[str], where: str) -> list[str]:
    """A CSV header's column names, trimmed of SPACES alone, as numbers are (wok.numerals), and matched exactly: a
    name that is one of `known` but for what shows little or not at all is refused, naming it and the spelling
    expected, where it was a column of another name, an optional one dropped without a word. That is a name with
    other white space around it ('timestamp\xa0': str.strip() read it as `known` unseen), one in quotes not read as
    quoting (a tab before the opening one: the csv module reads a quote as quoting only first in its field, or
    after spaces with skipinitialspace), and one in other case ('Size', unless 'size' is there too). A name that
    shows as a known one but has a character that is not printable in it (a format character, category Cf, as
    'size\u200b' or a second byte-order mark; a control; other white space) is refused, naming its column and
    the character: it shows as the name it is not, and matched no known one, so its column was dropped unseen.
    `where` is the file and the header's line, `path:line`, as a row's refusal names its own."""
    fields = [f.strip(SPACES) for f in names or []]
    for column, name in enumerate(fields, 1):
        if name not in known and name.strip() in known:
            raise ValueError(
                f"{where}: CSV header column {column}, {_quoted(name)}: expected {_quoted(name.strip())} with no "
                "white space around it but spaces, tabs and line ends; got other white space"
            )
    by_case = {k.casefold(): k for k in known}
    for column, name in enumerate(fields, 1):
        if name in known:
            continue
        unquoted = name[1:-1].strip(SPACES) if len(name) > 1 and name[0] == name[-1] == '"' else None
        if unquoted in known:
            raise ValueError(
                f"{where}: CSV header column {column}, {_quoted(name)}: expected {_quoted(unquoted)} (a quote opens "
                "quoting only first in its field or after spaces); got it in quotes, read as part of the name"
            )
        # Beside 'size', 'Size' is another column.
        if name.casefold() in by_case and by_case[name.casefold()] not in fields:
            raise ValueError(
                f"{where}: CSV header column {column}, {_quoted(name)}: expected {_quoted(by_case[name.casefold()])} "
                "(names are matched case included); got another case"
            )
    for column, name in enumerate(fields, 1):
        hidden = next((c for c in name if not c.isprintable()), None)
        # Only a name that shows as a known one: another column's ('Latency\r\n(ms)', 'Request\xa0ID', as
        # spreadsheets export them) is ignored, as any other name is.
        if hidden is not None and "".join(c for c in name if c.isprintable()).strip(SPACES) in known:
            called = unicodedata.name(hidden, "")  # a control has none
            raise ValueError(
                f"{where}: CSV header column {column}, {_quoted(name)}: expected printable characters alone; got "
                f"U+{ord(hidden):04X}{' ' + called if called else ''} (category {unicodedata.category(hidden)})"
            )
    return fields


def text_lines(text: str) -> Iterator[tuple[int, str]]:
    """`text`'s lines, numbered from 1, each with its line end, split at CSV's line ends alone, \\n, \\r\\n and \\r
    (as the csv module reads a file opened with newline=""): str.splitlines() also split at \\v, \\f, \\x1c to
    \\x1e, \\x85, \\u2028 and \\u2029, so one of them in a cell made two rows of one, unseen; now it stays in its
    cell, whose number refuses it."""
    return enumerate(io.StringIO(text, newline=""), 1)


def is_note(line: str) -> bool:
    """Whether a trace's or sizes file's line is skipped, in any of their formats: blank (SPACES alone) or a comment,
    its first character past spaces `#` (a sizes file of one integer a line took comments; a CSV's first made
    its header, refused)."""
    content = line.strip(SPACES)
    return not content or content.startswith("#")


def csv_rows(
    text: str, known: Sequence[str], path: Path
) -> tuple[list[str], int, Iterator[tuple[int, dict[str, str]]]]:
    """A CSV's header names (csv_columns: its first line that is not a note), the header's line number (a row's
    last, as for rows; 0 where there is none) and, as read, its rows each with its line number in `text` (a
    row's last, where a quoted cell spans lines), notes skipped (is_note). Spaces before a quote are skipped, so
    that `timestamp, "size"` names a `size` column, not '"size"', one ignored.

    A header commented out, as some tools write it (`#timestamp,size`), is the header where the first line that
    is not a note names none of `known` (a row, not a header: it was read as the header, and the file refused as
    having no 'timestamp' column, naming the first row's cells): the last comment above that line that, its
    first `#` dropped, names one of `known`, if it has as many cells as that line. A file whose first line that
    is not a note names one is read as before, whatever comments stand above it."""
    at = 0
    within = False  # the reader asked for a line of a row begun: a quoted cell's, never a note
    # Whether a `#` line is a note: before the header, always; after it, where the first column is a known one
    # (which refuses a '#…' cell): one of another name may hold '#1' (an id), and its `#` lines are rows, as they were.
    comments = True
    # The last comment above the first row that, its `#` dropped, names a known column: (its line, its cell count; a
    # header of another count would shift or drop the rows' cells).
    commented = (0, 0)
    header = 0  # a comment line read as the header, its `#` dropped

    def uncommented(line: str) -> str:
        return line.replace("#", "", 1)

    def lines() -> Iterator[str]:
        nonlocal at, within, commented
        for lineno, line in text_lines(text):
            if lineno == header:
                line = uncommented(line)
            elif not within and is_note(line) and (comments or not line.strip(SPACES)):
                # Above the first row alone (none read yet): a comment among the rows is never a header.
                if at == 0 and line.strip(SPACES):
                    names = next(csv.reader([uncommented(line)], skipinitialspace=True), [])
                    if {name.strip(SPACES) for name in names} & set(known):
                        commented = (lineno, len(names))
                continue
            at, within = lineno, True
            yield line

    def read() -> tuple[csv.DictReader, list[str]]:
        nonlocal comments, within
        reader = csv.DictReader(lines(), skipinitialspace=True)
        fields = csv_columns(reader.fieldnames, known, f"{path}:{at}")
        reader.fieldnames = fields
        comments, within = bool(fields) and fields[0] in known, False
        return reader, fields

    reader, fields = read()
    # Prose naming a column ('# recorded 2024, timestamp, size' above '0.1,4') is no header: its cells do not
    # line up with the first row's, which a header's would (else 'timestamp' read the sizes, unseen).
    if commented[0] and not set(fields) & set(known) and commented[1] == len(fields):
        header, at, comments = commented[0], 0, True
        reader, fields = read()

    def rows() -> Iterator[tuple[int, dict[str, str]]]:
        nonlocal within
        for row in reader:
            within = False
            yield at, row

    return fields, at if fields else 0, rows()


def header_names(fields: Sequence[str]) -> str:
    """A header's names as a refusal shows them: each quoted (`_quoted`), the first 20 and a count of the rest,
    'none' where there is no header."""
    got = ", ".join(map(_quoted, fields[:20])) + (f" and {len(fields) - 20} more" if len(fields) > 20 else "")
    return got or "none"


def _shown(value: object) -> str:
    """A trace file's cell (a CSV field, a JSON value) as a refusal shows it: text as `_quoted`, an
    array or object cut (wok.faults.shown, as the admin API shows a body's values); imported here for
    the reason `_quoted` is."""
    from wok.faults import shown

    return shown(value)


__all__ = [
    "Arrivals",
    "Burst",
    "Constant",
    "Poisson",
    "Sawtooth",
    "TraceReplay",
    "load_trace",
    "nominal_for",
    "parse_arrivals",
    "parse_duration",
    "parse_steps",
    "window_rate",
]


@runtime_checkable
class Arrivals(Protocol):
    name: str

    def times(self, duration_s: float, rng: np.random.Generator) -> np.ndarray:
        """Sorted float64 send offsets in [0, duration_s)."""
        ...

    def rate(self, t: np.ndarray | float) -> np.ndarray | float:
        """Expected λ(t) in requests/s; t as offsets from the window's start."""
        ...

    @property
    def mean_rate(self) -> float:
        """Requests/s averaged over whole periods of the schedule (a burst's: over its `duration_s`).
        A step reports `window_rate` over its measured window as its offered QPS, not this."""
        ...


def window_rate(arrivals: Arrivals, start_s: float, end_s: float) -> float:
    """Expected requests/s over [start_s, end_s) of the schedule: a step's offered rate over its
    measured window, which for a burst or a sawtooth differs from the mean over warm-up and window."""
    if not end_s > start_s:
        raise ValueError(f"window: expected end_s > start_s; got the empty [{start_s:g}, {end_s:g})")
    cumulative = getattr(arrivals, "cumulative", None)
    if cumulative is None or isinstance(arrivals, Poisson | Constant):  # constant λ: exactly its rate
        return arrivals.mean_rate
    return float(cumulative(end_s) - cumulative(start_s)) / (end_s - start_s)


def nominal_for(spec: str, offered_qps: float, duration_s: float) -> float:
    """The step rate (`--steps` value) at which `spec` offers `offered_qps` over a step of
    `duration_s` with no warm-up: what `window_rate(parse_arrivals(spec, q, duration_s=d), 0, d)`
    reports. A burst offers more than its base rate, a trace at a fixed scale a rate of its
    own, so a share of a measured offered rate cannot be run as a nominal one.

    The offered rate is affine in q for every process whose options are multiples of q or
    absolute rates (secant steps land on it at once); a trace's count is a step function of
    its pace, which a few more steps bring within one request per step.
    """
    if not (math.isfinite(offered_qps) and offered_qps > 0):
        raise ValueError(f"offered rate: expected a finite QPS > 0; got {offered_qps:g}")

    def offered(q: float) -> float:
        return window_rate(parse_arrivals(spec, q, duration_s=duration_s), 0.0, duration_s)

    # Exact for the affine processes. One request per step is as close as a trace can come, but
    # only once the secant has nothing better: over a step of d seconds that averages a request
    # or less, 1/d is as large as the rate itself, and the first guess q would pass with its double.
    exact = 1e-9 * offered_qps
    tolerance = max(exact, 1.0 / duration_s)
    q0, q1 = offered_qps, 2 * offered_qps
    f0 = offered(q0)
    if abs(f0 - offered_qps) <= exact:
        return q0
    f1 = offered(q1)
    tried = [(q0, f0), (q1, f1)]
    stalled = False
    for _ in range(8):
        if abs(f1 - offered_qps) <= exact:
            return q1
        if f1 == f0:
            stalled = True
            break
        q0, q1 = q1, q1 + (offered_qps - f1) * (q1 - q0) / (f1 - f0)
        if not q1 > 0:
            low_q, low_f = min(tried)
            raise ValueError(
                f"arrivals {_quoted(spec)}: offers more than {offered_qps:g} QPS at any step rate above 0; got "
                f"{low_f:g} QPS at step rate {low_q:g} (an absolute burst amplitude or sawtooth bound sets a floor)"
            )
        f0, f1 = f1, offered(q1)
        tried.append((q1, f1))
    q, f = min(tried, key=lambda qf: abs(qf[1] - offered_qps))
    if abs(f - offered_qps) <= tolerance:
        return q
    if stalled:
        raise ValueError(
            f"arrivals {_quoted(spec)}: the offered rate ({f1:g} QPS) does not follow the step's QPS, so it "
            f"cannot be set to {offered_qps:g} (a trace at a fixed scale, or a sawtooth with absolute low "
            "and high, keeps its own rate)"
        )
    if abs(f - offered_qps) > 0.01 * offered_qps:
        raise ValueError(
            f"arrivals {_quoted(spec)}: no step rate found that offers {offered_qps:g} QPS (nearest {f:g})"
        )
    return q


# -- helpers ---------------------------------------------------------------------------------
def _check_rate(what: str, value: float) -> float:
    value = float(value)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{what}: expected a finite rate >= 0; got {value:g}")
    return value


def _check_duration(duration_s: float) -> float:
    duration_s = float(duration_s)
    if not math.isfinite(duration_s) or duration_s < 0:
        raise ValueError(f"duration_s: expected a finite duration >= 0 s; got {duration_s:g}")
    return duration_s


def _shaped(t: np.ndarray | float, value: np.ndarray) -> np.ndarray | float:
    """A float for a scalar t, an array shaped like t otherwise."""
    return float(value) if np.ndim(t) == 0 else value


def _homogeneous(rate: float, duration_s: float, rng: np.random.Generator) -> np.ndarray:
    """Poisson arrivals at `rate` over [0, duration_s), as cumulative exponential gaps."""
    if rate <= 0 or duration_s <= 0:
        return np.empty(0, dtype=np.float64)
    mean = rate * duration_s
    # Mean + 6σ covers the window in one draw except about once in 10^9 windows;
    # the loop only keeps a rare short draw correct.
    chunk = int(mean + 6 * math.sqrt(mean) + 16)
    parts = []
    start = 0.0
    while True:
        t = start + np.cumsum(rng.exponential(1.0 / rate, chunk))
        parts.append(t)
        if t[-1] >= duration_s:
            break
        start = float(t[-1])
    times = np.concatenate(parts)
    return times[times < duration_s]


def _thin(
    rate_fn: Callable[[np.ndarray], np.ndarray], peak: float, duration_s: float, rng: np.random.Generator
) -> np.ndarray:
    """Inhomogeneous Poisson arrivals by thinning; `peak` must bound rate_fn on [0, duration_s)."""
    candidates = _homogeneous(peak, duration_s, rng)
    keep = rng.random(candidates.size) * peak < rate_fn(candidates)
    return candidates[keep]


_erf = np.vectorize(math.erf, otypes=[np.float64])  # scipy would be the only other source; bench avoids it

# Burst's thinning bins, in units of σ from t0 (see Burst._bump_times).
_BUMP_GRID = np.arange(-40.0, 40.0 + 0.125, 0.25)


# -- processes -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Constant:
    """Evenly spaced arrivals, 1/qps apart.

    The first is at offset 0, unless `random_phase`: then it is uniform in [0, 1/qps),
    drawn from the rng, so that windows or processes started together do not all fire
    on the same instants.
    """

    qps: float
    random_phase: bool = False
    name: str = field(default="constant", init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "qps", _check_rate("qps", self.qps))

    def times(self, duration_s: float, rng: np.random.Generator) -> np.ndarray:
        duration_s = _check_duration(duration_s)
        if self.qps == 0 or duration_s == 0:
            return np.empty(0, dtype=np.float64)
        phase = rng.uniform(0.0, 1.0 / self.qps) if self.random_phase else 0.0
        # k / qps rather than a running sum: no rounding drift over long windows.
        times = phase + np.arange(math.ceil(duration_s * self.qps) + 1, dtype=np.float64) / self.qps
        return times[times < duration_s]

    def rate(self, t: np.ndarray | float) -> np.ndarray | float:
        return _shaped(t, np.full(np.shape(t), self.qps))

    def cumulative(self, t: np.ndarray | float) -> np.ndarray | float:
        """Expected arrivals in [0, t): qps·t (averaged over the phase; a fixed phase is within 1)."""
        return _shaped(t, self.qps * np.asarray(t, dtype=np.float64))

    @property
    def mean_rate(self) -> float:
        return self.qps


@dataclass(frozen=True)
class Poisson:
    """Homogeneous Poisson arrivals: independent Exp(qps) gaps, the first one from offset 0."""

    qps: float
    name: str = field(default="poisson", init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "qps", _check_rate("qps", self.qps))

    def times(self, duration_s: float, rng: np.random.Generator) -> np.ndarray:
        return _homogeneous(self.qps, _check_duration(duration_s), rng)

    def rate(self, t: np.ndarray | float) -> np.ndarray | float:
        return _shaped(t, np.full(np.shape(t), self.qps))

    def cumulative(self, t: np.ndarray | float) -> np.ndarray | float:
        return _shaped(t, self.qps * np.asarray(t, dtype=np.float64))

    @property
    def mean_rate(self) -> float:
        return self.qps


@dataclass(frozen=True)
class Burst:
    """Poisson arrivals at λ(t) = base_qps + amplitude_qps·exp(−(t − t0_s)² / 2σ²).

    `mean_rate` averages λ over [0, duration_s) when duration_s is given (the warm-up and
    the window a step's `times()` covers); without it, over [0, 2·t0_s). A step's offered
    QPS is `window_rate` over its measured window, which leaves the warm-up out.
    """

    base_qps: float
    amplitude_qps: float
    t0_s: float
    sigma_s: float
    duration_s: float | None = None
    name: str = field(default="burst", init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "base_qps", _check_rate("base_qps", self.base_qps))
        object.__setattr__(self, "amplitude_qps", _check_rate("amplitude_qps", self.amplitude_qps))
        object.__setattr__(self, "t0_s", float(self.t0_s))
        object.__setattr__(self, "sigma_s", float(self.sigma_s))
        if not math.isfinite(self.t0_s):
            raise ValueError(f"t0_s: expected a finite time in seconds; got {self.t0_s}")
        if not (math.isfinite(self.sigma_s) and self.sigma_s > 0):
            raise ValueError(f"sigma_s: expected a finite duration > 0 s; got {self.sigma_s:g}")
        if self.duration_s is not None:
            object.__setattr__(self, "duration_s", _check_duration(self.duration_s))
        elif self.t0_s <= 0:
            raise ValueError(
                "Burst duration_s: expected a duration when t0_s <= 0 (mean_rate averages over the step); "
                f"got None with t0_s {self.t0_s:g}"
            )

    def rate(self, t: np.ndarray | float) -> np.ndarray | float:
        t = np.asarray(t, dtype=np.float64)
        return _shaped(t, self.base_qps + self.amplitude_qps * np.exp(-0.5 * ((t - self.t0_s) / self.sigma_s) ** 2))

    def cumulative(self, t: np.ndarray | float) -> np.ndarray | float:
        t = np.asarray(t, dtype=np.float64)
        s = self.sigma_s * math.sqrt(2.0)
        burst = (
            self.amplitude_qps
            * self.sigma_s
            * math.sqrt(math.pi / 2)
            * (_erf((t - self.t0_s) / s) + math.erf(self.t0_s / s))
        )
        return _shaped(t, self.base_qps * t + burst)

    def _bump(self, t: np.ndarray) -> np.ndarray:
        return self.amplitude_qps * np.exp(-0.5 * ((t - self.t0_s) / self.sigma_s) ** 2)

    def times(self, duration_s: float, rng: np.random.Generator) -> np.ndarray:
        # λ is base + bump, so the arrivals are a Poisson stream at the base rate merged with
        # one of the bump's alone. Thinning the whole of λ from its peak drew (base + A)·duration
        # candidates: 6.6e7 (2 GB) for the ~2,500 arrivals of a 1e6 QPS spike of σ 1 ms.
        duration_s = _check_duration(duration_s)
        base = _homogeneous(self.base_qps, duration_s, rng)
        bump = self._bump_times(duration_s, rng)
        return np.sort(np.concatenate([base, bump])) if bump.size else base

    def _bump_times(self, duration_s: float, rng: np.random.Generator) -> np.ndarray:
        """The bump's arrivals, thinned bin by bin from the bump's maximum over each bin.

        Bins are σ/4 wide over t0 ± 40σ (beyond, exp(−800) is 0 in float64: rate() has no
        bump there either), clipped to the window; the candidates are about 1.1 times the
        bump's expected count, plus nothing for the base rate.
        """
        empty = np.empty(0, dtype=np.float64)
        if self.amplitude_qps == 0 or duration_s == 0:
            return empty
        edges = np.unique(np.clip(self.t0_s + self.sigma_s * _BUMP_GRID, 0.0, duration_s))
        if edges.size < 2:
            return empty
        lo, width = edges[:-1], np.diff(edges)
        # The bump is unimodal: its maximum over a bin is at the bin's point nearest t0.
        bound = self._bump(np.clip(self.t0_s, lo, edges[1:]))
        bin_of = np.repeat(np.arange(lo.size), rng.poisson(bound * width))
        t = lo[bin_of] + rng.random(bin_of.size) * width[bin_of]
        keep = (rng.random(t.size) * bound[bin_of] < self._bump(t)) & (t < duration_s)  # t: rounding at the edge
        return t[keep]

    @property
    def mean_rate(self) -> float:
        window = self.duration_s if self.duration_s is not None else 2.0 * self.t0_s
        if window == 0:
            return float(self.rate(0.0))
        return float(self.cumulative(window)) / window


@dataclass(frozen=True)
class Sawtooth:
    """Poisson arrivals whose λ rises linearly from low_qps to high_qps over each period, then drops.

    `mean_rate` is (low + high) / 2, the mean over whole periods; a window that is not whole
    periods offers something else (`window_rate`: 850 over [1, 6) s of a 500 → 1,500 QPS, 10 s
    sawtooth), and a step reports that.
    """

    low_qps: float
    high_qps: float
    period_s: float
    name: str = field(default="sawtooth", init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "low_qps", _check_rate("low_qps", self.low_qps))
        object.__setattr__(self, "high_qps", _check_rate("high_qps", self.high_qps))
        object.__setattr__(self, "period_s", float(self.period_s))
        if not (math.isfinite(self.period_s) and self.period_s > 0):
            raise ValueError(f"period_s: expected a finite duration > 0 s; got {self.period_s:g}")

    def rate(self, t: np.ndarray | float) -> np.ndarray | float:
        t = np.asarray(t, dtype=np.float64)
        phase = np.mod(t, self.period_s) / self.period_s
        return _shaped(t, self.low_qps + (self.high_qps - self.low_qps) * phase)

    def cumulative(self, t: np.ndarray | float) -> np.ndarray | float:
        t = np.asarray(t, dtype=np.float64)
        whole, x = np.divmod(t, self.period_s)
        per_period = 0.5 * (self.low_qps + self.high_qps) * self.period_s
        partial = self.low_qps * x + (self.high_qps - self.low_qps) * x * x / (2.0 * self.period_s)
        return _shaped(t, whole * per_period + partial)

    def times(self, duration_s: float, rng: np.random.Generator) -> np.ndarray:
        return _thin(self.rate, max(self.low_qps, self.high_qps), _check_duration(duration_s), rng)

    @property
    def mean_rate(self) -> float:
        return 0.5 * (self.low_qps + self.high_qps)


class TraceReplay:
    """Recorded arrival times, replayed: shifted so the first is at 0, divided by `time_scale`.

    `time_scale` 2.0 plays the trace twice as fast. A window longer than the trace
    repeats it with period span·n/(n − 1) (the wrap-around gap is the trace's mean gap,
    so copies neither overlap nor leave a hole); a shorter window truncates it. The
    replay is deterministic: `times()` ignores its rng.

    `rate(t)` is the trace's mean rate n/period, flat: a recording has no intensity
    behind it to report. `sizes_for(times)` gives the recorded payload size of each
    arrival `times()` emitted, or None when the trace has no sizes.
    """

    name = "trace"

    def __init__(
        self,
        timestamps_s: Sequence[float] | np.ndarray,
        sizes: Sequence[int] | np.ndarray | None = None,
        time_scale: float = 1.0,
    ) -> None:
        ts = np.asarray(timestamps_s, dtype=np.float64).reshape(-1)
        if not np.all(np.isfinite(ts)):
            i = int(np.flatnonzero(~np.isfinite(ts))[0])
            raise ValueError(f"trace timestamps: expected finite numbers; got {ts[i]:g} at index {i}")
        if not (math.isfinite(time_scale) and time_scale > 0):
            raise ValueError(f"time_scale: expected a finite number > 0; got {time_scale:g}")
        order = np.argsort(ts, kind="stable")  # stable: equal timestamps keep their sizes' order
        ts = ts[order]
        if ts.size < 2 or ts[-1] == ts[0]:
            raise ValueError(
                f"trace timestamps: expected at least two distinct; got {ts.size} ({np.unique(ts).size} distinct)"
            )
        if sizes is not None:
            raw = np.asarray(sizes).reshape(-1)
            if raw.size != ts.size:
                raise ValueError(f"trace sizes: expected one per timestamp ({ts.size}); got {raw.size}")
            sizes = raw.astype(np.int64)
            if np.any(sizes != raw) or np.any(sizes < 0):
                i = int(np.flatnonzero((sizes != raw) | (sizes < 0))[0])
                raise ValueError(f"trace sizes: expected integers >= 0; got {raw[i].item()!r} at index {i}")
            sizes = sizes[order]
        self.timestamps_s = ts
        self.sizes = sizes
        self.time_scale = float(time_scale)
        self.offsets = (ts - ts[0]) / self.time_scale
        n = ts.size
        self.period_s = float(self.offsets[-1]) * n / (n - 1)

    def __repr__(self) -> str:
        return (
            f"TraceReplay({self.timestamps_s.size} arrivals, period {self.period_s:g} s, "
            f"time_scale={self.time_scale:g}, sizes={'yes' if self.sizes is not None else 'no'})"
        )

    def times(self, duration_s: float, rng: np.random.Generator | None = None) -> np.ndarray:
        duration_s = _check_duration(duration_s)
        # One copy more than the window needs: ceil(d / period) may round below a copy whose
        # first arrival, copy·period in float, is still < d. `cumulative` counts by the same sum.
        copies = math.ceil(duration_s / self.period_s) + 1
        times = (np.arange(copies, dtype=np.float64)[:, None] * self.period_s + self.offsets[None, :]).reshape(-1)
        return times[times < duration_s]

    def sizes_for(self, times: np.ndarray) -> np.ndarray | None:
        """The recorded size of each arrival in `times` (as `times()` returned them), or None."""
        if self.sizes is None:
            return None
        times = np.asarray(times, dtype=np.float64).reshape(-1)
        if times.size == 0:
            return np.empty(0, dtype=np.int64)
        # Tolerance for the round trip copy·period + offset − copy·period in floating point.
        eps = 1e-9 * max(1.0, self.period_s)
        copy = np.floor((times + eps) / self.period_s)
        residual = times - copy * self.period_s
        index = np.searchsorted(self.offsets, residual - eps, side="left")
        # Equal timestamps map to the first of their run; their rank within the run picks the rest.
        run_start = np.r_[True, np.diff(times) != 0]
        starts = np.flatnonzero(run_start)
        rank = np.arange(times.size) - np.repeat(starts, np.diff(np.r_[starts, times.size]))
        index = np.clip(index + rank, 0, self.offsets.size - 1)
        return self.sizes[index]

    def rate(self, t: np.ndarray | float) -> np.ndarray | float:
        return _shaped(t, np.full(np.shape(t), self.mean_rate))

    def cumulative(self, t: np.ndarray | float) -> np.ndarray | float:
        """Replayed arrivals in [0, t) (exact: the replay is deterministic)."""
        # Counted with the sum and comparison times() uses, copy·period + offset < t: a remainder
        # (np.divmod) rounds otherwise at copy boundaries and counted one arrival more or less.
        t = np.asarray(t, dtype=np.float64)
        flat = t.reshape(-1)
        n = self.offsets.size
        # Copies before first end a whole period before t, copies after first + 3 start after it.
        first = np.maximum(np.floor(flat / self.period_s) - 1.0, 0.0)
        count = first * n
        for k in range(4):
            start = (first + k) * self.period_s
            # The offsets are sorted and float addition is monotonic, so the arrivals of a copy
            # before t are a prefix: its length by bisection, in float exactly as times() adds.
            low, high = np.zeros(flat.size, dtype=np.int64), np.full(flat.size, n, dtype=np.int64)
            while np.any(low < high):
                mid = (low + high) // 2
                before = start + self.offsets[np.minimum(mid, n - 1)] < flat
                low, high = np.where(before & (low < high), mid + 1, low), np.where(before, high, mid)
            count = count + low
        return _shaped(t, count.reshape(t.shape).astype(np.float64))

    @property
    def mean_rate(self) -> float:
        return self.offsets.size / self.period_s


# -- trace files -----------------------------------------------------------------------------
def _timestamp(value: object, where: str) -> tuple[float, bool]:
    """(seconds since its origin, whether `value` was in seconds rather than an ISO 8601 time)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return _finite(float(value), value, where), True
    if isinstance(value, str):
        try:
            seconds = read_float(value)
        except ValueError:
            pass
        else:
            return _finite(seconds, value, where), True
        try:
            when = datetime.fromisoformat(value.strip(SPACES).replace("Z", "+00:00"))
        except ValueError:
            pass
        else:
            # Naive times are read as UTC: only differences matter, and UTC has no DST jumps.
            if when.tzinfo is None:
                when = when.replace(tzinfo=timezone.utc)
            return when.timestamp(), False
    # underscore_note, not digits_note: a timestamp's text need not be ASCII (a line separator in its cell).
    note = underscore_note(value) if isinstance(value, str) else ""
    raise ValueError(f"{where}: timestamp {_shown(value)} is neither seconds nor an ISO 8601 time{note}")


def _finite(seconds: float, value: object, where: str) -> float:
    # Here, where the line is known: TraceReplay would name only the sorted index.
    if not math.isfinite(seconds):
        raise ValueError(f"{where}: timestamp {_shown(value)} is not a finite number of seconds")
    return seconds


def _brief(text: str, width: int = 60) -> str:
    """`text` quoted as a refusal shows user text (`_quoted`), cut to `width` characters (a trace
    line may be long), with its length."""
    from wok.errors import quoted

    return quoted(text.strip(), width)


def _size(value: object, where: str) -> int:
    if isinstance(value, str):
        value = value.strip(SPACES)
        if ascii_digits(value):
            return int(value)
    elif isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    elif isinstance(value, float) and value.is_integer() and value >= 0:
        return int(value)
    note = underscore_note(value) if isinstance(value, str) else ""
    raise ValueError(f"{where}: size {_shown(value)} is not an integer >= 0{note}")


def read_utf8(path: Path) -> str:
    """The text of `path`, UTF-8 with or without a byte-order mark (spreadsheets save "CSV UTF-8" with one,
    which would become part of the first column's name); ValueError naming the file offset of a byte that
    is not UTF-8 (utf-8-sig counts from after the mark)."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        at = exc.start + (len(codecs.BOM_UTF8) if data.startswith(codecs.BOM_UTF8) else 0)
        raise ValueError(f"{path}: not UTF-8 text ({exc.reason} at byte {at})") from None


def load_trace(path: str | Path, time_scale: float = 1.0) -> TraceReplay:
    """A TraceReplay from a CSV (header with `timestamp`, optional `size`) or JSONL file.

    JSONL has one object per line, `{"timestamp": ..., "size": ...}`; a `.jsonl` or
    `.ndjson` name, or a first line that is not a note (is_note) starting with `{`, selects
    it. Timestamps are seconds (any origin, e.g. Unix time) or ISO 8601 strings. Sizes are
    all or none. Blank and `#` comment lines are skipped in either format, but for a CSV header commented
    out (csv_rows).
    """
    path = Path(path)
    text = read_utf8(path)
    # Its first line past notes says its format, as a sizes file's does: a JSONL trace with a comment first was
    # read as CSV.
    first = next((line.strip(SPACES) for _, line in text_lines(text) if not is_note(line)), "")
    stamps: list[float] = []
    raw: list[object] = []
    kinds: list[bool] = []  # in seconds, not ISO 8601

    def stamp(value: object, where: str) -> None:
        seconds, in_seconds = _timestamp(value, where)
        raw.append(value)
        stamps.append(seconds)
        kinds.append(in_seconds)

    sizes: list[int | None] = []
    wheres: list[str] = []
    if path.suffix.lower() in (".jsonl", ".ndjson") or first.startswith("{"):
        for lineno, line in text_lines(text):
            if is_note(line):
                continue
            where = f"{path}:{lineno}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: not JSON ({e.msg})") from None
            if not isinstance(obj, dict) or "timestamp" not in obj:
                raise ValueError(f'{where}: expected an object with a "timestamp" field; got {_brief(line)}')
            stamp(obj["timestamp"], where)
            sizes.append(_size(obj["size"], where) if obj.get("size") is not None else None)
            wheres.append(where)
    else:
        fields, header, rows = csv_rows(text, ("timestamp", "size"), path)
        if "timestamp" not in fields:
            where = f"{path}:{header}" if header else str(path)
            raise ValueError(f"{where}: CSV header: expected a 'timestamp' column; got {header_names(fields)}")
        for lineno, row in rows:
            where = f"{path}:{lineno}"
            stamp(row["timestamp"], where)
            size = (row.get("size") or "").strip(SPACES)
            sizes.append(_size(size, where) if size else None)
            wheres.append(where)
    if not stamps:
        raise ValueError(f"{path}: expected at least one arrival; got none")
    have = [s is not None for s in sizes]
    # Seconds have any origin (Unix time or the recording's start), an ISO time the Unix epoch:
    # mixed, "0" and "2026-01-01T00:00:00Z" made a trace 1.8e9 s long instead of a refusal.
    if any(kinds) and not all(kinds):
        iso, secs = kinds.index(False), kinds.index(True)
        raise ValueError(
            f"{wheres[iso]}: timestamp {_shown(raw[iso])} is an ISO 8601 time, but {wheres[secs]} gives "
            f"{_shown(raw[secs])} in seconds; give every timestamp the same way"
        )
    if any(have) and not all(have):
        raise ValueError(
            f"{wheres[have.index(False)]}: no size, but {wheres[have.index(True)]} has one; "
            "give every arrival a size or none"
        )
    try:
        return TraceReplay(stamps, sizes if all(have) else None, time_scale)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


# -- parsing ---------------------------------------------------------------------------------
# [0-9], not \d: \d takes every script's digits ("٣"), and float() reads them (3). \s under re.ASCII, for
# the same reason: alone it takes every script's spaces ("\xa0"); ASCII's are numerals.SPACES.
DURATION = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE]([-+]?[0-9]+))?\s*(ms|s|m|h)?\s*", re.ASCII)
_UNIT = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_duration(s: str) -> float:
    """Seconds in "250ms", "30s", "5m", "1.5h" or a plain number of seconds."""
    m = DURATION.fullmatch(s)
    if m is None:
        raise ValueError(
            f"invalid duration {_quoted(s)}: expected a number >= 0 with an optional unit ms, s, m or h "
            f"(e.g. '250ms', '30s', '5m', '1.5h'){underscore_note(s)}"
        )
    number = float(m.group(1) + (f"e{m.group(2)}" if m.group(2) else ""))
    return number * _UNIT[m.group(3)]


def _number(text: str) -> float | None:
    try:
        value = read_float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


MAX_STEPS = 1000


def parse_steps(spec: str, noun: str = "step") -> list[float]:
    """QPS steps from a list "50,100,200" (kept in the order given) or a range "start:stop:factor"; `noun` names
    one value of a list in a refusal ("step 2: expected a number > 0; got 0").

    A range multiplies by `factor` (> 1) from `start` while the value is <= `stop`;
    `stop` itself is the last step when the sequence hits it (to within 1e-9, so that
    "0.1:0.8:2" ends on 0.8 despite binary rounding).
    """
    text = spec.strip(SPACES)
    if not text:
        raise ValueError("QPS steps '': expected a list like '50,100,200' or a range start:stop:factor like '50:800:2'")
    if ":" in text:
        parts = [p.strip(SPACES) for p in text.split(":")]
        if len(parts) != 3:
            raise ValueError(
                f"QPS range {_quoted(spec)}: expected start:stop:factor (e.g. '50:800:2'); got {len(parts)} parts"
            )
        values = [_number(p) for p in parts]
        for label, p, v in zip(("start", "stop", "factor"), parts, values):
            if v is None:
                raise ValueError(f"QPS range {_quoted(spec)}: {label} {_quoted(p)} is not a number{digits_note(p)}")
        start, stop, factor = values
        if start <= 0:
            raise ValueError(f"QPS range {_quoted(spec)}: start: expected a number > 0; got {start:g}")
        if stop < start:
            raise ValueError(f"QPS range {_quoted(spec)}: stop: expected a number >= start {start:g}; got {stop:g}")
        if factor <= 1:
            raise ValueError(f"QPS range {_quoted(spec)}: factor: expected a number > 1; got {factor:g}")
        # Logs apart, not of the ratio: 1e300 / 1e-300 is inf, and floor(inf) raised OverflowError (a traceback).
        count = math.floor((math.log(stop) - math.log(start)) / math.log(factor) + 1e-9) + 1
        if count > MAX_STEPS:
            raise ValueError(f"QPS range {_quoted(spec)}: {count} steps; at most {MAX_STEPS}")
        steps = [start * factor**k for k in range(count)]
        if math.isclose(steps[-1], stop, rel_tol=1e-9):
            steps[-1] = stop
        return steps
    steps = []
    for item in text.split(","):
        item = item.strip(SPACES)
        value = _number(item)
        if value is None:
            raise ValueError(f"QPS steps {_quoted(spec)}: {_quoted(item)} is not a number{digits_note(item)}")
        if value <= 0:
            raise ValueError(
                f"QPS steps {_quoted(spec)}: {noun} {len(steps) + 1}: expected a number > 0; got {value:g}"
            )
        steps.append(value)
    if len(steps) > MAX_STEPS:
        raise ValueError(f"QPS steps {_quoted(spec)}: {len(steps)} steps; at most {MAX_STEPS}")
    return steps


_OPTIONS = {
    "constant": (),
    "poisson": (),
    "burst": ("amplitude", "t0", "sigma"),
    "sawtooth": ("low", "high", "period"),
    "trace": ("scale",),
}


def _options(spec: str, kind: str, items: list[str]) -> dict[str, str]:
    allowed = _OPTIONS[kind]
    out: dict[str, str] = {}
    for item in items:
        key, eq, value = (x.strip(SPACES) for x in item.partition("="))
        if not allowed:
            raise ValueError(f"arrivals {_quoted(spec)}: {kind} takes no options; got {_quoted(item.strip(SPACES))}")
        if not eq or not key or not value:
            raise ValueError(f"arrivals {_quoted(spec)}: expected key=value; got {_quoted(item.strip(SPACES))}")
        if key not in allowed:
            raise ValueError(
                f"arrivals {_quoted(spec)}: unknown option {_quoted(key)} for {kind}; expected {', '.join(allowed)}"
            )
        if key in out:
            raise ValueError(
                f"arrivals {_quoted(spec)}: option {_quoted(key)} given twice; got {_quoted(out[key])} and "
                f"{_quoted(value)}"
            )
        out[key] = value
    return out


def _rate_option(spec: str, key: str, value: str, qps: float) -> float:
    """'4x' is a multiple of the step's qps, '200' an absolute rate."""
    multiple = value.lower().endswith("x")
    number = _number(value[:-1] if multiple else value)
    if number is None or number < 0:
        raise ValueError(
            f"arrivals {_quoted(spec)}: {key}={_quoted(value)} is neither a multiple of the step's rate like '4x' "
            f"nor a rate >= 0 like '200'{underscore_note(value)}"
        )
    return number * qps if multiple else number


def _time_option(spec: str, key: str, value: str, duration_s: float | None) -> float:
    """'30s', '500ms', '2m' or a fraction of the step '50%'."""
    if value.endswith("%"):
        fraction = _number(value[:-1])
        if fraction is None or fraction < 0:
            raise ValueError(
                f"arrivals {_quoted(spec)}: {key}={_quoted(value)} is not a percentage >= 0 of the step"
                f"{underscore_note(value)}"
            )
        if duration_s is None:
            raise ValueError(
                f"arrivals {_quoted(spec)}: {key}={_quoted(value)} is a fraction of the step; parse_arrivals needs "
                "duration_s; got None"
            )
        return fraction / 100.0 * duration_s
    try:
        seconds = parse_duration(value)
    except ValueError:
        raise ValueError(
            f"arrivals {_quoted(spec)}: {key}={_quoted(value)} is neither a duration like '30s', '500ms', '2m' "
            f"nor a fraction of the step like '50%'{underscore_note(value)}"
        ) from None
    if not math.isfinite(seconds):  # '1e999s': refused by the process as its field (sigma_s), not the spec's
        raise ValueError(f"arrivals {_quoted(spec)}: {key}: expected a finite duration; got {_quoted(value)}")
    return seconds


def parse_arrivals(spec: str, qps: float, *, duration_s: float | None = None) -> Arrivals:
    """The arrival process a CLI spec names, at the step's offered rate `qps`.

    constant | poisson | burst[:amplitude=4x,t0=50%,sigma=10%] |
    sawtooth[:low=0.5x,high=1.5x,period=10s] | trace:PATH[,scale=1|auto]

    Rates are multiples of qps ('4x') or absolute ('200'); burst's base rate is qps.
    Times are durations ('30s', '500ms', '2m') or fractions of the step ('50%'), which
    need `duration_s`, the length of the window `times()` will be given (burst's defaults
    are fractions). A trace replays at its recorded pace (scale=1), `scale` times
    faster, or with scale=auto at whatever pace makes its mean rate qps.
    """
    qps = _check_rate("qps", qps)
    kind, _, rest = spec.strip(SPACES).partition(":")
    kind = kind.strip(SPACES).lower()
    if kind not in _OPTIONS:
        raise ValueError(
            f"arrivals {_quoted(spec)}: unknown process {_quoted(kind)}; expected constant, poisson, burst, sawtooth "
            "or trace:PATH"
        )
    items = rest.split(",") if rest.strip(SPACES) else []
    if kind == "trace":
        if not items or not items[0].strip(SPACES):
            raise ValueError(f"arrivals {_quoted(spec)}: expected trace:PATH[,scale=N]; got no PATH")
        # A path may hold commas ("calls,2026.csv" was the file "calls" and an option "2026.csv"):
        # the options are the trailing items with an "=", the rest is the path.
        cut = len(items)
        while cut > 1 and "=" in items[cut - 1]:
            cut -= 1
        path, items = ",".join(items[:cut]).strip(SPACES), items[cut:]
    opts = _options(spec, kind, items)
    if kind == "constant":
        return Constant(qps)
    if kind == "poisson":
        return Poisson(qps)
    if kind == "burst":
        amplitude = _rate_option(spec, "amplitude", opts.get("amplitude", "4x"), qps)
        t0 = _time_option(spec, "t0", opts.get("t0", "50%"), duration_s)
        sigma = _time_option(spec, "sigma", opts.get("sigma", "10%"), duration_s)
        if sigma <= 0:
            raise ValueError(f"arrivals {_quoted(spec)}: sigma: expected a duration > 0 s; got {sigma:g}")
        if duration_s is None and t0 <= 0:
            raise ValueError(
                f"arrivals {_quoted(spec)}: a burst at t0 <= 0 needs duration_s for its mean rate; got t0 {t0:g} s "
                "and duration_s None"
            )
        return Burst(qps, amplitude, t0, sigma, duration_s)
    if kind == "sawtooth":
        low = _rate_option(spec, "low", opts.get("low", "0.5x"), qps)
        high = _rate_option(spec, "high", opts.get("high", "1.5x"), qps)
        period = _time_option(spec, "period", opts.get("period", "10s"), duration_s)
        if period <= 0:
            raise ValueError(f"arrivals {_quoted(spec)}: period: expected a duration > 0 s; got {period:g}")
        return Sawtooth(low, high, period)
    trace = load_trace(path)
    scale = opts.get("scale", "1")
    if scale.lower() == "auto":
        if qps == 0:
            raise ValueError(f"arrivals {_quoted(spec)}: scale=auto needs a qps > 0; got {qps:g}")
        return TraceReplay(trace.timestamps_s, trace.sizes, qps / trace.mean_rate)
    factor = _number(scale)
    if factor is None or factor <= 0:
        raise ValueError(
            f"arrivals {_quoted(spec)}: scale={_quoted(scale)} is neither a number > 0 nor 'auto'"
            f"{underscore_note(scale)}"
        )
    return TraceReplay(trace.timestamps_s, trace.sizes, factor)
