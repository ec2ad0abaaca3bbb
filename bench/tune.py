"""`wok tune`: pick `max_batch_size` and `max_queue_delay` by simulating the batcher.

For every setting of the grid (batch sizes × queue delays) the batcher simulator
(`wok.bench.simulate`) runs one step of the chosen arrival process at an offered rate,
and a bisection on that rate finds the highest one whose P99 stays within the SLO (with
≥ 99 % successes, the bench's own rule, `wok.bench.analysis.passes_slo`). Every
evaluation uses the same seed, so settings are compared on the same random draws
(common random numbers) and a rerun gives the same table.

The bisection runs between 1 % of the setting's throughput ceiling
instances · n / E[T(n)] (n = max_batch_size) and the ceiling itself, which counts as
failing: at or above it the queue grows for as long as the load lasts. A setting that
misses the SLO already at 1 % of its ceiling (a delay plus a batch longer than the SLO)
scores 0; that step is lengthened to expect at least `MIN_LOW_ARRIVALS` arrivals. The setting
with the highest such QPS wins
(the default setting, 32 and 5 ms unless told otherwise, is always tried and can win);
settings within `tie` (relative) of the best count as equal, and among them the one with
the shortest delay, then the smallest batch, wins: it gives the lowest latency for the
same capacity.

Batch times come from a profile (`wok profile --json`, schema `wok.profile/1`: the fit
α, β and, per batch size, the raw batch times `samples_s`) or from α and β given on the
command line. Per-request time outside the batcher (gRPC, decode, encode, the client)
can be added as measured samples (`wok.overhead/1`, written by `bench/tune_check.py`)
or as a constant. The server's CPU per request (its event loop, and the cores the loop,
the model and everything else share) can be modelled too, from a CPU calibration
(`wok.cpustage/1`, written by `bench/tune_check.py`) or given; see docs/tune.md.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import sys
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from ..errors import quoted_name, shown_entry
from . import analysis
from .analysis import ms_text as _ms
from .payloads import integer_refusal
from .plan import (
    alpha_is_rounding,
    json_kind,
    negative_alpha_warning,
    outside_profiled,
    profile_advice,
    profiled_model_max,
)
from .simulate import (
    CPU_FIELDS,
    MAX_ARRIVALS_PER_STEP,
    BatcherModel,
    CpuFields,
    SimConfig,
    arrival_count,
    simulate_step,
)

# /2 since 2026-12-02: settings[].mean_batch_size and utilization cover the simulated step's
# measured window only since b930a5d (2026-12-01); /1 files may hold them over warm-up and window.
SCHEMA = "wok.tune/2"
PROFILE_SCHEMA = "wok.profile/1"
OVERHEAD_SCHEMA = "wok.overhead/1"
CPU_SCHEMA = "wok.cpustage/1"
DEFAULT_SETTING = (32, 5e-3)  # the demo mlp's (and a repository model's default delay)
LOW_FRACTION = 0.01
# The light-load step is lengthened to expect at least this many arrivals: at 1 % of a slow setting's
# ceiling a 10 s step can hold none, and a step without requests has no P99, so it failed the setting.
MIN_LOW_ARRIVALS = 100


# ---------------------------------------------------------------------------- inputs


@dataclass(frozen=True)
class Profile:
    """Batch time as a function of batch size: the fit and, optionally, measured samples."""

    alpha_s: float
    beta_s: float
    r2: float | None = None
    samples: tuple[tuple[int, tuple[float, ...]], ...] = ()  # (batch size, batch times in s)
    source: str = "given"
    # The fit's α when it was below 0 and clamped to 0 (`alpha_s`), as `wok plan` clamps it too.
    fitted_alpha_s: float | None = None
    # The batch sizes the profile measured (its `batches[].batch_size`, with or without samples): a larger
    # max_batch_size runs on T(n) extrapolated past them. Empty: not known (--alpha/--beta).
    profiled_sizes: tuple[int, ...] = ()
    # The profiled model's max_batch_size (its `model.max_batch_size`): a larger setting is past the server as
    # profiled (plan.past_model_max). None: not known.
    model_max_batch_size: int | None = None


def fit_linear(sizes: Sequence[float], times_s: Sequence[float]) -> tuple[float, float, float]:
    """Least-squares T(n) = α + β·n over (n, T) pairs: (α, β, R²), R² = 1 − SS_res / SS_tot (1.0 when T does
    not vary). The one least-squares line of `wok profile` (`profiler.fit_linear`), of the profiles written
    here (`fit_medians`) and of tune_check's CPU calibration."""
    n = np.asarray(sizes, dtype=np.float64)
    t = np.asarray(times_s, dtype=np.float64)
    if n.shape != t.shape or n.ndim != 1:
        raise ValueError(f"fitting T(n) = α + β·n needs one time per batch size; got {n.size} sizes and {t.size} times")
    if np.unique(n).size < 2:
        raise ValueError(
            f"fitting T(n) = α + β·n needs times at two or more distinct batch sizes; got {np.unique(n).size}"
        )
    if (t == t[0]).all():
        # Flat: the mean of equal values can round off them (3 × 0.1 / 3 = 0.10000000000000002), and
        # the centred sums then gave β = 1e-33 (a ceiling of 1e33/s) and R² = 0 or -4e-16, not 1.
        return float(t[0]), 0.0, 1.0
    nm, tm = n.mean(), t.mean()
    beta = float(((n - nm) * (t - tm)).sum() / ((n - nm) ** 2).sum())
    alpha = float(tm - beta * nm)
    if alpha_is_rounding(alpha, float(t.min())):
        # Times exactly on T = β·n (0.1 ms·n at n = 1, 4, 16, 64) fit α = -4.3e-19 s, which `wok profile` wrote and
        # it, `wok tune` and `wok plan` warned of as a negative α: the line's α is 0 to within its rounding.
        alpha = 0.0
    total = float(((t - tm) ** 2).sum())
    r2 = 1.0 - float(((t - alpha - beta * n) ** 2).sum()) / total if total > 0 else 1.0
    return alpha, beta, r2


# What a profile's fit is on (its `fit.on`): with one batching key per size, or with several in some size.
FIT_ON = "per-size medians"
KEYED_FIT_ON = "per-size medians of each batching key, weighted by its share of the batches"


def fit_medians(
    samples: Mapping[int, Sequence[float]], keys: Mapping[int, Sequence[Hashable]] | None = None
) -> tuple[dict[int, float], tuple[float, float, float], str]:
    """The profile's fit: T(n) = α + β·n by least squares on each batch size's median time (nearest-rank), one
    point per size. `wok profile` and `profile_document` both fit so, so that one set of batch times gives
    one α, β wherever it is fitted: a median is not moved by the odd batch a busy machine preempted, and a
    size timed more often does not outweigh the others. With `keys` (per size, the batching key of each of
    its samples), a size's point is each key's median weighted by that key's share of the size's samples:
    what plan and simulate charge a batch is its mean time (an instance's busy time is their sum), and the
    median of a mixture of keys is the time of the key whose cumulative share crosses one half, not their
    mean. With one key, the median. Returns ({size: point}, in `samples`' order, (α, β, R²), and what the fit
    is on: KEYED_FIT_ON where some size's samples were of several keys, else FIT_ON); the fit takes the sizes in
    ascending order, whatever that order."""
    empty = next((n for n, t in samples.items() if not len(t)), None)
    if empty is not None:
        raise ValueError(f"batch size {empty}: expected at least one batch time to take its median of; got none")
    points = {}
    on = FIT_ON
    for n, times in samples.items():
        t = np.asarray(times, dtype=np.float64)
        of = [None] * len(t) if keys is None else list(keys[n])
        if len(of) != len(t):
            raise ValueError(f"batch size {n}: expected a batching key per batch time ({len(t)}); got {len(of)}")
        by_key: dict[Hashable, list[int]] = {}
        for i, key in enumerate(of):
            by_key.setdefault(key, []).append(i)
        points[n] = sum(len(i) / len(t) * analysis.latency_summary(t[i])["p50"] for i in by_key.values())
        if len(by_key) > 1:
            on = KEYED_FIT_ON
    sizes = sorted(points)
    return points, fit_linear(sizes, [points[n] for n in sizes]), on


def profile_document(samples: dict[int, Sequence[float]], source: str, model: str = "") -> dict:
    """A `wok.profile/1`-shaped document (the part `wok tune` reads) from raw batch times per size, fitted
    as `wok profile` fits them (`fit_medians`); `bench/tune_check.py` uses this when no profile is given."""
    if not samples:
        raise ValueError("no batch times")
    sizes = sorted(samples)
    medians, (alpha, beta, r2), on = fit_medians({n: samples[n] for n in sizes})
    batches = []
    for n in sizes:
        a = np.sort(np.asarray(samples[n], dtype=np.float64))
        # Nearest-rank, as `wok profile` writes median_s and p99_s (np.median averaged the middle two).
        q = analysis.latency_summary(a)
        batches.append(
            {
                "batch_size": n,
                "median_s": medians[n],
                "p99_s": q["p99"],
                "samples_s": a.tolist(),
            }
        )
    return {
        "schema": PROFILE_SCHEMA,
        "model": model,
        "source": source,
        "fit": {"alpha_s": alpha, "beta_s": beta, "r2": r2, "on": on},
        "batches": batches,
    }


def _json_number(value, where: str, name: str, what: str = "a number") -> float:
    """A JSON number as a float, else a ValueError naming `where` and the field: float() takes true as 1
    and a string of digits as its number, so a file's `true` was 1 s, and a quoted "0.002" passed."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{where}: {name}: expected {what}; got {json_kind(value)}")
    try:
        return float(value)
    except OverflowError:  # an integer beyond any double: as infinite, for the caller's finiteness check
        return math.inf


def _batch_size(value, where: str, name: str) -> int:
    """A profile's batch size: a whole number ≥ 1 (int() read 1.7 as 1, and true as 1)."""
    n = _json_number(value, where, name, "a whole number ≥ 1")
    if not (math.isfinite(n) and n.is_integer() and n >= 1):
        raise ValueError(f"{where}: {name}: expected a whole number ≥ 1; got {json_kind(value)}")
    return int(n)


def profile_from_document(doc: dict, where: str = "profile", *, source: str | None = None) -> Profile:
    """The `Profile` of a `wok.profile/1` document; a refusal starts with `where`. `source` (default
    `where`) is what the result records as the profile (`inputs.profile`)."""
    if doc.get("schema") != PROFILE_SCHEMA:
        raise ValueError(f"{where}: expected schema {PROFILE_SCHEMA!r}; got {shown_entry(doc, 'schema')}")
    try:
        fit = doc["fit"]
        alpha = _json_number(fit["alpha_s"], where, "fit.alpha_s", "a number of seconds")
        beta = _json_number(fit["beta_s"], where, "fit.beta_s", "a number of seconds")
        r2 = fit.get("r2")
        r2 = None if r2 is None else _json_number(r2, where, "fit.r2", "a number or null")
        samples = []
        written = {}  # each batch's samples as the file writes them, for a refusal (float() made 10**400 inf)
        sizes = set()
        medians = []
        batches = doc.get("batches", [])
        if not isinstance(batches, list):
            raise ValueError(f"{where}: batches: expected a list of batch sizes' times; got {json_kind(batches)}")
        for i, b in enumerate(batches):
            if not isinstance(b, dict):
                raise ValueError(f"{where}: batches[{i}]: expected an object; got {json_kind(b)}")
            listed = b.get("samples_s") or []
            if not isinstance(listed, list):
                got = json_kind(listed)
                raise ValueError(f"{where}: batches[{i}].samples_s: expected a list of seconds; got {got}")
            times = tuple(_json_number(x, where, f"batches[{i}].samples_s", "numbers of seconds") for x in listed)
            # A size is needed with its samples; without them, one given still bounds the fit's range.
            if times or "batch_size" in b:
                sizes.add(n := _batch_size(b["batch_size"], where, f"batches[{i}].batch_size"))
            if times:
                samples.append((i, n, times))
                written[i] = listed
            median = b.get("median_s")
            if isinstance(median, (int, float)) and not isinstance(median, bool) and math.isfinite(median):
                medians.append(float(median))  # only to bound α's rounding: the simulation never reads it
    except (AttributeError, KeyError, TypeError) as exc:
        raise ValueError(f"{where}: not a readable {PROFILE_SCHEMA} document: {exc!r}") from exc
    # The file's values in its words, as `wok plan` shows the same file's (they were Python's: nan, inf).
    for name, value in (("alpha_s", alpha), ("beta_s", beta)):
        if not math.isfinite(value):
            raise ValueError(f"{where}: fit.{name}: expected a finite number; got {json_kind(fit[name])}")
    # A NaN or infinite batch time passed the simulator's `> 0` check and surfaced mid-search as
    # "a request with code OK has no completion time", naming neither the file nor the sample.
    for i, _, times in samples:
        bad = next((j for j, t in enumerate(times) if not math.isfinite(t)), None)
        if bad is not None:
            raise ValueError(
                f"{where}: batches[{i}].samples_s: expected finite seconds; got {json_kind(written[i][bad])}"
            )
        # A batch takes time: one of 0 s or less was refused only once drawn from (--batch-times samples),
        # by the simulator, without the file or the field ("batch_samples: size 1 needs ... positive times").
        bad = next((j for j, t in enumerate(times) if not t > 0), None)
        if bad is not None:
            got = json_kind(written[i][bad])
            raise ValueError(f"{where}: batches[{i}].samples_s: expected batch times > 0 s; got {got}")
    # As `wok plan --profile` reads the same fit (one profile, one T(n)): β, the time per row, must be
    # ≥ 0; a fit can come out with α below 0 (noise at small n), which the simulator cannot take, so
    # it is clamped to 0, T(n) = β·n, and the result warns (`warnings`).
    if beta < 0:
        raise ValueError(f"{where}: fit.beta_s: β: expected a time >= 0 s; got {json_kind(fit['beta_s'])} s")
    # A profile written before `fit_linear` rounded such an α to 0 holds it as fitted (-4.3e-19 s): it is 0 as well,
    # judged against the smallest time the file measured (its samples, else its medians; none: only 0 is).
    measured = [t for _, _, times in samples for t in times] or [m for m in medians if m > 0]
    fitted = alpha if alpha < 0 and not alpha_is_rounding(alpha, min(measured, default=None)) else None
    if r2 is not None and not math.isfinite(r2):
        r2 = None  # strict JSON writes it as null all the same
    samples_out = tuple((n, t) for _, n, t in samples)
    return Profile(
        max(alpha, 0.0),
        beta,
        r2,
        samples_out,
        where if source is None else source,
        fitted_alpha_s=fitted,
        profiled_sizes=tuple(sorted(sizes)),
        model_max_batch_size=profiled_model_max(doc, where),
    )


def read_json(path: Path, what: str) -> dict:
    """A JSON object, or a ValueError starting with `what` (the option that named the file) and the path."""
    try:
        doc = json.loads(Path(path).read_text())
    except OSError as exc:
        raise ValueError(f"{what} {path}: {exc.strerror or exc}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{what} {path}: expected JSON; got {exc}") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{what} {path}: expected a JSON object; got {json_kind(doc)}")
    return doc


def load_profile(path: Path, what: str = "--profile", *, where: str | None = None) -> Profile:
    """`wok tune --profile`'s file; a file that cannot be read, or holds no JSON object, is refused
    naming `what`; a document that is not a profile, starting with `where` (by default its path; `wok
    tune` names the option too) (`profile_from_document`)."""
    return profile_from_document(read_json(path, what), str(path) if where is None else where, source=str(path))


def overhead_document(samples_s: Sequence[float], method: str) -> dict:
    a = np.asarray(samples_s, dtype=np.float64)
    q = analysis.latency_summary(a)  # nearest-rank, both (the median was np.median's, interpolated)
    return {
        "schema": OVERHEAD_SCHEMA,
        "method": method,
        "count": int(a.size),
        "median_s": q["p50"] if a.size else None,
        "p99_s": q["p99"] if a.size else None,
        "samples_s": a.tolist(),
    }


def load_overhead(path: Path, what: str = "--overhead-samples") -> tuple[float, ...]:
    """`wok tune --overhead-samples`'s file: its samples (s); every refusal names `what`, the path and the field."""
    doc = read_json(path, what)
    if doc.get("schema") != OVERHEAD_SCHEMA:
        raise ValueError(f"{what} {path}: expected schema {OVERHEAD_SCHEMA!r}; got {shown_entry(doc, 'schema')}")
    samples = doc.get("samples_s")
    if samples is None or samples == []:
        # Said apart: both were "expected a wok.overhead/1 document with samples_s", of a document that had one.
        got = "none" if samples is None else "an empty list"
        raise ValueError(f"{what} {path}: samples_s: expected a list of seconds, at least one; got {got}")
    if not isinstance(samples, list):
        raise ValueError(f"{what} {path}: samples_s: expected a list of seconds; got {json_kind(samples)}")
    # float() takes true as 1 s; a NaN or an infinity left requests without a completion time
    # mid-search, and a negative one was refused by the simulator without the file's name.
    bad = next((x for x in samples if not isinstance(x, (int, float)) or isinstance(x, bool)), None)
    if bad is not None:
        raise ValueError(f"{what} {path}: samples_s: expected numbers of seconds; got {json_kind(bad)}")
    bad = next((x for x in samples if not 0 <= x < math.inf), None)
    if bad is not None:
        raise ValueError(f"{what} {path}: samples_s: expected finite seconds ≥ 0; got {json_kind(bad)}")
    return tuple(float(x) for x in samples)


@dataclass(frozen=True, kw_only=True)
class CpuStage(CpuFields):
    """The simulator's CPU stage (`wok.bench.simulate.CpuFields`, the same fields as BatcherModel's),
    and optionally the batch time the server's model worker was measured to take per batch, which
    replaces the profile's back-to-back fit: α + β·n seconds of work (docs/tune.md)."""

    batch_alpha_s: float | None = None
    batch_beta_s: float | None = None
    # The mean batch sizes of the loads that batch time was fitted on (the calibration's `points`): a setting
    # outside them runs on α + β·n extrapolated. Empty: not known. Not one of the stage's fields (`as_dict`).
    batch_fit_sizes: tuple[float, ...] = ()

    def fields(self) -> dict:
        """The BatcherModel fields."""
        return {k: getattr(self, k) for k in CPU_FIELDS}

    def as_dict(self) -> dict:
        return {**self.fields(), "batch_alpha_s": self.batch_alpha_s, "batch_beta_s": self.batch_beta_s}


def cpu_document(stage: CpuStage, method: str, **extra) -> dict:
    """A `wok.cpustage/1` document: the stage's fields, how they were found, and what else the caller adds."""
    return {"schema": CPU_SCHEMA, "method": method, **stage.as_dict(), **extra}


def cpu_from_document(doc: dict, where: str = "CPU calibration") -> CpuStage:
    """The CPU stage of a `wok.cpustage/1` document: every field of the stage (`cpu_document` writes them
    all), and `batch_alpha_s`/`batch_beta_s` together or neither (null: the profile's batch time).
    Each value a finite number ≥ 0; a refusal names `where` and the field."""
    if doc.get("schema") != CPU_SCHEMA:
        raise ValueError(f"{where}: expected schema {CPU_SCHEMA!r}; got {shown_entry(doc, 'schema')}")

    def value(key: str) -> float:
        # Checked here: a missing field read as 0 (0 cores: unbounded), and a NaN, an infinity or a negative
        # was refused by the simulator in its own words, without the file (batch_alpha_s as "alpha_s").
        unit = "cores" if key.endswith("cores") else "seconds"
        expected = f"a finite number of {unit} ≥ 0"
        if key not in doc:
            raise ValueError(f"{where}: {key}: expected {expected}; got none")
        x = _json_number(doc[key], where, key, expected)
        if not 0 <= x < math.inf:
            raise ValueError(f"{where}: {key}: expected {expected}; got {json_kind(doc[key])}")
        return x

    vals = {k: value(k) for k in CPU_FIELDS}
    given = [k for k in ("batch_alpha_s", "batch_beta_s") if doc.get(k) is not None]
    if len(given) == 1:
        raise ValueError(f"{where}: batch_alpha_s and batch_beta_s come together")
    vals |= {k: value(k) if given else None for k in ("batch_alpha_s", "batch_beta_s")}
    if given and vals["batch_alpha_s"] + vals["batch_beta_s"] == 0:
        raise ValueError(f"{where}: batch_alpha_s and batch_beta_s: a batch needs a time, α + β > 0; got both 0")
    return CpuStage(**vals, batch_fit_sizes=_fit_sizes(doc, where) if given else ())


def _fit_sizes(doc: dict, where: str) -> tuple[float, ...]:
    """The mean batch sizes of a calibration's `points` (`bench/tune_check.py` fits batch_alpha_s and
    batch_beta_s on them); () for a document without points (one written by hand: the range is not known)."""
    points = doc.get("points")
    if points is None:
        return ()
    if not isinstance(points, list):
        raise ValueError(f"{where}: points: expected a list of the calibration's loads; got {json_kind(points)}")
    sizes = []
    for i, point in enumerate(points):
        if not isinstance(point, dict):
            raise ValueError(f"{where}: points[{i}]: expected an object; got {json_kind(point)}")
        # The batch time's fit ran on these: one that is not a mean batch (≥ 1 request) cannot bound it.
        expected = "the load's mean batch size, a finite number ≥ 1"
        if "mean_batch_size" not in point:  # not as a written null is: "got null"
            raise ValueError(f"{where}: points[{i}].mean_batch_size: expected {expected}; got none")
        got = point["mean_batch_size"]
        n = _json_number(got, where, f"points[{i}].mean_batch_size", expected)
        if not 1 <= n < math.inf:
            raise ValueError(f"{where}: points[{i}].mean_batch_size: expected {expected}; got {json_kind(got)}")
        sizes.append(n)
    return tuple(sorted(sizes))


def load_cpu(path: Path, what: str = "--cpu-calibration") -> CpuStage:
    """`wok tune --cpu-calibration`'s file; every refusal names `what` and the path."""
    return cpu_from_document(read_json(path, what), f"{what} {path}")


def tune_cpu_stage(path: Path | None, per_request: str | None, cores: float | None) -> CpuStage | None:
    """`wok tune`'s CPU stage: a calibration file, with --per-request-cpu (the loop's CPU per request,
    kept in the file's split or else halved) and --cores laid over it; None when none of them is given."""
    from dataclasses import replace

    from .arrivals import parse_duration

    if path is None and per_request is None and cores is None:
        return None
    stage = load_cpu(path) if path is not None else CpuStage()
    if per_request is not None:
        try:
            total = parse_duration(per_request)
        except ValueError as exc:
            raise ValueError(f"--per-request-cpu: {exc}") from None
        if not math.isfinite(total):  # else refused by the model, as cpu_in_s
            raise ValueError(f"--per-request-cpu: expected a finite duration; got {quoted_name(per_request)}")
        old = stage.cpu_in_s + stage.cpu_out_s
        share = stage.cpu_in_s / old if old > 0 else 0.5
        stage = replace(stage, cpu_in_s=share * total, cpu_out_s=(1 - share) * total)
    if cores is not None:
        if not cores >= 0 or cores == float("inf"):
            raise ValueError(f"--cores: expected a finite number >= 0; got {cores:g}")
        stage = replace(stage, cores=cores)
    return stage


# ---------------------------------------------------------------------------- search


# The most bisection steps that can still narrow the interval. It starts 0.99·top wide and halves each
# step; its midpoint falls strictly inside only while it spans at least two doubles, and near `top`
# doubles are up to top·2⁻⁵² apart: 0.99·top·2⁻⁽ᵏ⁻¹⁾ ≥ 2·top·2⁻⁵² holds up to k = 51. Step 52 already
# re-simulates an end for some ceilings, and from 54 on the search simulated the ceiling itself, which
# counts as failing, and could return it (1,000 QPS for a 1 ms batch of one).
MAX_ITERATIONS = 51


@dataclass(frozen=True)
class SearchConfig:
    slo_p99_ms: float
    arrival: str = "poisson"
    duration_s: float = 10.0  # simulated seconds per evaluation
    warmup_s: float = 1.0
    iterations: int = 8
    seed: int = 0
    tie: float = 0.02

    def __post_init__(self) -> None:
        # The simulator checks the rest when the search starts; these it never sees, or sees only there
        # in its own words (a NaN tie left `choose` no row within it: "min() arg is an empty sequence").
        for refusal in (
            integer_refusal("iterations", self.iterations, 0, most=MAX_ITERATIONS),
            integer_refusal("seed", self.seed, 0),
        ):
            if refusal is not None:
                raise ValueError(refusal)
        if not 0 <= self.tie < 1:  # NaN too
            raise ValueError(f"tie: expected a number in [0, 1); got {self.tie!r}")


# Quantiles a distribution is resampled to when interpolated between two loads.
OVERHEAD_QUANTILES = 2000
# A distribution at an offered rate: samples (s, or ratios) drawn there.
OverheadAt = Callable[[float], tuple[float, ...]]


def _quantiles_by_rate(table: list[tuple[float, np.ndarray]]) -> Callable[[float], tuple[float, ...]]:
    """A distribution at any rate from distributions measured at some: each one's quantiles, interpolated
    linearly in the rate between the two nearest loads; below the lowest and above the highest, the
    nearest load's as they are (no extrapolation)."""
    grid = (np.arange(OVERHEAD_QUANTILES) + 0.5) / OVERHEAD_QUANTILES
    pooled: dict[float, list[np.ndarray]] = {}
    for rate, samples in table:  # loads calibrated twice at one rate count as one
        pooled.setdefault(float(rate), []).append(np.asarray(samples, dtype=np.float64))
    quantiles = [(rate, np.quantile(np.concatenate(parts), grid)) for rate, parts in sorted(pooled.items())]

    def at(rate: float) -> tuple[float, ...]:
        if rate <= quantiles[0][0]:
            return tuple(quantiles[0][1])
        for (r0, q0), (r1, q1) in itertools.pairwise(quantiles):
            if rate <= r1:
                w = (rate - r0) / (r1 - r0)
                return tuple((1 - w) * q0 + w * q1)
        return tuple(quantiles[-1][1])

    return at


def _outside_points(cpu_doc: dict | None, where: str, histogram: str) -> list[tuple[float, np.ndarray | None]]:
    """A calibration's `outside_by_rate`, each load's (offered QPS, its `histogram`'s values in ms, or None when
    the load has none); a refusal names `where` and the field. A missing field was a KeyError traceback."""
    from wok.bench.histogram import LatencyHistogram

    points = (cpu_doc or {}).get("outside_by_rate") or []
    if not isinstance(points, list):
        raise ValueError(f"{where}: outside_by_rate: expected a list of loads; got {json_kind(points)}")
    out = []
    for i, p in enumerate(points):
        field = f"outside_by_rate[{i}]"
        if not isinstance(p, dict):
            raise ValueError(f"{where}: {field}: expected an object; got {json_kind(p)}")
        if "offered_qps" not in p:
            raise ValueError(f"{where}: {field}.offered_qps: expected a finite rate ≥ 0; got none")
        rate = _json_number(p["offered_qps"], where, f"{field}.offered_qps", "a finite rate ≥ 0")
        if not 0 <= rate < math.inf:
            got = json_kind(p["offered_qps"])
            raise ValueError(f"{where}: {field}.offered_qps: expected a finite rate ≥ 0; got {got}")
        h = p.get(histogram)
        if h is None:
            out.append((rate, None))
            continue
        try:
            values = LatencyHistogram.from_dict(_object_of(h, where, f"{field}.{histogram}")).values_ms()
        except (KeyError, TypeError, ValueError) as exc:
            why = f"no {exc.args[0]}" if isinstance(exc, KeyError) else str(exc)
            raise ValueError(f"{where}: {field}.{histogram}: expected a latency histogram; {why}") from None
        out.append((rate, values))
    return out


def _object_of(value, where: str, name: str) -> dict:
    if not isinstance(value, dict):
        raise ValueError(f"{where}: {name}: expected a latency histogram; got {json_kind(value)}")
    return value


def overhead_by_rate(
    cpu_doc: dict | None, stage, where: str = "CPU calibration"
) -> Callable[[float], tuple[float, ...]] | None:
    """The overhead beside the CPU stage at an offered rate, from the calibration's server timing.

    At each calibration load, each request's time outside the server (its latency less its
    `server-timing` total: the generator's lag, the client, the transport, gRPC's work on both
    sides) was measured; less the loop's c_in + c_out, which the stage models as a queue of its
    own, that is the overhead sample there (s). Between loads, `_quantiles_by_rate`. None without
    such a calibration. A refusal names `where` (the caller's name for the calibration) and the field.
    """
    if stage is None:
        return None
    points = _outside_points(cpu_doc, where, "outside_histogram")
    if not points:
        return None
    for i, (_, values) in enumerate(points):
        # A load without requests measured nothing to draw from (np.quantile of none is an IndexError).
        if values is None or not values.size:
            got = "none" if values is None else "an empty histogram"
            raise ValueError(
                f"{where}: outside_by_rate[{i}].outside_histogram: expected a latency histogram of at least one "
                f"request; got {got}"
            )
    own = stage.cpu_in_s + stage.cpu_out_s
    at = _quantiles_by_rate([(rate, np.maximum(values / 1e3 - own, 0.0)) for rate, values in points])
    at.loads = sorted(rate for rate, _ in points)  # what the search records of it
    return at


def batch_noise_by_rate(cpu_doc: dict | None) -> Callable[[float], tuple[float, ...]] | None:
    """How much a batch's time varies under load: at each calibration load, each batch's model time
    (`server-timing` compute) over the batches' mean there, so the ratios average 1 over batches. A
    simulated batch of n takes (α_s + β_s·n) times one drawn at its step's rate (`_quantiles_by_rate`):
    the server's batches stretch when another thread has the core (on 2 shared cores, 2.3 × the mean at
    the P99 of a 2,400-QPS calibration), which the stage's even sharing of the cores does not give.

    Per batch where every load has `compute_batch_histogram` (calibrations against a server whose trailer
    carries its batch's size: one count per batch); else per request from `compute_histogram`, as
    calibrations before it hold: there a batch of n counts n times, so a slow batch of 27 is drawn as
    often as 27 batches would be (docs/tune.md, run 14). Either way the ratios also hold the spread of
    batch sizes at that load, which the simulation draws again. The function's `basis` says which:
    "batches" or "requests". None without the data."""
    where = "CPU calibration"
    basis, points = "batches", _outside_points(cpu_doc, where, "compute_batch_histogram")
    if not points or any(values is None or not values.size for _, values in points):
        basis, points = "requests", _outside_points(cpu_doc, where, "compute_histogram")
    table = [(rate, values / values.mean()) for rate, values in points
             if values is not None and values.size and values.mean() > 0]  # fmt: skip
    if not table:
        return None
    at = _quantiles_by_rate(table)
    at.basis = basis  # what tune_check says and records of it
    return at


def batch_times(
    profile: Profile, sampled: bool, cpu: CpuStage | None
) -> tuple[str, float, float, tuple[tuple[int, tuple[float, ...]], ...]]:
    """Where the simulated batches take their time from: (`fit`, `samples` or `server`, α, β, the
    measured samples drawn from). The server's batch time, when the CPU calibration carries it,
    replaces both the fit and the samples."""
    if cpu is not None and cpu.batch_alpha_s is not None:
        return "server", cpu.batch_alpha_s, cpu.batch_beta_s, ()
    if sampled and profile.samples:
        return "samples", profile.alpha_s, profile.beta_s, profile.samples
    return "fit", profile.alpha_s, profile.beta_s, ()


def model_for(profile: Profile, max_batch_size: int, delay_s: float, *, instances: int = 1,
              overhead_s: Sequence[float] = (), sampled: bool = False,
              cpu: CpuStage | None = None) -> BatcherModel:  # fmt: skip
    """The simulator's model of one setting. With `cpu`, its stage; and when it carries the
    server's own batch time (batch_alpha_s/batch_beta_s), that replaces the profile's fit and
    its samples (which are back-to-back times, not the server's)."""
    _, alpha, beta, samples = batch_times(profile, sampled, cpu)
    stage = {} if cpu is None else cpu.fields()
    return BatcherModel(
        alpha_s=alpha,
        beta_s=beta,
        max_batch_size=max_batch_size,
        max_queue_delay_s=delay_s,
        instances=instances,
        batch_samples=samples,
        overhead_samples_s=tuple(overhead_s),
        **stage,
    )


def ceiling_qps(model: BatcherModel) -> float:
    """instances · n / E[T(n)] at n = max_batch_size, or the CPU stage's bound if lower
    (BatcherModel.cpu_ceiling_qps): no arrival rate above it is sustainable."""
    n = model.max_batch_size
    return min(model.instances * n / model.mean_batch_time(n), model.cpu_ceiling_qps(n))


def evaluate(model: BatcherModel, qps: float, search: SearchConfig, overhead_at: OverheadAt | None = None) -> dict:
    """One simulated step at `qps` (the bench's step schema), on the search's fixed seed; with
    `overhead_at` (`overhead_by_rate`), its overhead drawn at that rate."""
    if overhead_at is not None:
        model = replace(model, overhead_samples_s=tuple(overhead_at(qps)))
    cfg = SimConfig(
        model=model,
        steps=[qps],
        step_duration_s=search.duration_s,
        warmup_s=search.warmup_s,
        arrival=search.arrival,
        slo_p99_ms=search.slo_p99_ms,
        seed=search.seed,
    )
    return simulate_step(cfg, qps, np.random.default_rng(search.seed))


def max_qps(model: BatcherModel, search: SearchConfig, overhead_at: OverheadAt | None = None) -> dict:
    """The highest offered QPS whose simulated P99 meets the SLO, by bisection (see the module's doc).

    The ceiling itself counts as failing: at or above it the queue grows for as long as the
    load lasts, so a pass there only says the simulated step was too short to show it.
    """
    top = ceiling_qps(model)
    lo, hi = LOW_FRACTION * top, top
    slo = search.slo_p99_ms
    longer = MIN_LOW_ARRIVALS / lo
    low = replace(search, duration_s=longer) if search.duration_s < longer < math.inf else search
    best = evaluate(model, lo, low, overhead_at)
    out = {"ceiling_qps": top, "evaluations": 1}
    if not analysis.passes_slo(best, slo):
        return out | {"max_qps": 0.0, "step": best}
    for _ in range(search.iterations):
        mid = (lo + hi) / 2
        step = evaluate(model, mid, search, overhead_at)
        out["evaluations"] += 1
        if analysis.passes_slo(step, slo):
            lo, best = mid, step
        else:
            hi = mid
    return out | {"max_qps": lo, "step": best}


def highest_rate(top_qps: float, iterations: int) -> float:
    """The highest offered rate `max_qps` can simulate for a setting whose ceiling is `top_qps`:
    the 1 % step, then each bisection step passing, one halving short of the ceiling."""
    lo = LOW_FRACTION * top_qps
    return top_qps - (top_qps - lo) * 0.5**iterations


def delay_ms(delay_s: float) -> float:
    """A delay in ms as the result records it and settings are told apart: rounded to the picosecond, so
    that one delay given in two units (`--delays 0.0013s`, `--default 32,1.3ms`: 1.3 × 1e-3 is not 0.0013
    in binary) is one setting, not two rows of which only one counts as the grid's."""
    return round(1e3 * delay_s, 9)


def grid_of(
    batch_sizes: Sequence[int], delays_s: Sequence[float], default: tuple[int, float] | None
) -> list[tuple[int, float]]:
    """The settings `tune` searches: the grid, in order, each setting once, then the default when it is
    outside it."""
    grid, seen = [], set()
    for n, d in [(n, d) for n in batch_sizes for d in delays_s] + ([default] if default is not None else []):
        if (n, delay_ms(d)) not in seen:
            seen.add((n, delay_ms(d)))
            grid.append((n, d))
    return grid


def busiest_step(profile: Profile, search: SearchConfig, grid: Sequence[tuple[int, float]], *, instances: int = 1,
                 sampled: bool = False, cpu: CpuStage | None = None) -> dict:  # fmt: skip
    """The simulated step of the search that can offer the most arrivals: its setting, rate (`highest_rate`
    of the setting with the highest ceiling), length (warm-up + duration) and the arrivals its process
    expects there (`wok.bench.simulate.arrival_count`: a burst's peak, a dense trace's own count).
    Every process offers at least as many at a higher rate, so no step of the search expects more."""
    from .arrivals import parse_arrivals

    tops = [
        (ceiling_qps(model_for(profile, n, d, instances=instances, sampled=sampled, cpu=cpu)), n, d) for n, d in grid
    ]
    top, n, d = max(tops, key=lambda t: t[0])
    if not math.isfinite(top):
        # Batch times so short (1e-320 s) that n / E[T(n)] overflows: the search's rates were NaN, refused
        # by the simulator as "qps: expected a finite rate >= 0; got nan".
        raise ValueError(
            f"max_batch_size {n}, delay {1e3 * d:g} ms: its ceiling n / E[T(n)] by {_fit_words(profile, sampled, cpu)} "
            "is beyond a float: batch times this short cannot be simulated"
        )
    rate = highest_rate(top, search.iterations)
    seconds = search.warmup_s + search.duration_s
    expected = arrival_count(parse_arrivals(search.arrival, rate, duration_s=seconds), seconds)
    return {"max_batch_size": n, "delay_s": d, "ceiling_qps": top, "qps": rate, "seconds": seconds,
            "arrivals": expected}  # fmt: skip


class SearchTooLarge(ValueError):
    """A search whose busiest simulated step would hold more arrivals than the simulator takes."""


@dataclass(frozen=True)
class SearchNames:
    """How `check_fits` names the search's inputs in its refusal: the library's parameters by
    default, a script's options when it passes its own."""

    arrival: str = "arrival"  # followed by the spec
    length: str = "warmup_s + duration_s"  # a simulated step's length, followed by its seconds
    shorter: str = "warmup_s + duration_s"  # what a caller shortens for a shorter step
    grid: str = "batch_sizes, delays_s and default"  # "SIZES, DELAYS and DEFAULT": its parts, in this order
    # The warm-up when the caller cannot shorten it ("the search's 1 s warm-up"): when it alone
    # holds too many arrivals, no shorter step fits.
    fixed_warmup: str | None = None

    def grid_part(self, i: int) -> str:
        """The name of the grid's batch sizes (0), delays (1) or default (2), read off `grid`."""
        m = re.fullmatch(r"(.+?), (.+) and (.+)", self.grid)
        return m.group(i + 1) if m else self.grid


def _fit_words(profile: Profile, sampled: bool, cpu: CpuStage | None) -> str:
    """What the search's ceilings come from, as a refusal names it: "the profile's α, β", "the α, β of
    --alpha/--beta", "the profile's batch times", "the CPU stage's batch time and bound"."""
    source = batch_times(profile, sampled, cpu)[0]
    # The fit's α, β come from a profile, or from options (`wok tune --alpha/--beta`: its source).
    given = f"the α, β of {profile.source}" if profile.source.startswith("--") else "the profile's α, β"
    fit = {"server": "the CPU stage's batch time", "samples": "the profile's batch times"}.get(source, given)
    if cpu is not None:
        fit += " and bound" if source == "server" else " and the CPU stage's bound"
    return fit


def check_fits(
    profile: Profile,
    search: SearchConfig,
    batch_sizes: Sequence[int],
    delays_s: Sequence[float],
    default: tuple[int, float] | None = DEFAULT_SETTING,
    *,
    instances: int = 1,
    sampled: bool = False,
    cpu: CpuStage | None = None,
    names: SearchNames | None = None,
) -> dict:
    """The checks `tune` makes before any simulating: the grid (and the default), then its busiest
    step (`busiest_step`) against the simulator's arrival cap, refused as `SearchTooLarge` worded
    with `names`. Returns the busiest step."""
    names = names or SearchNames()
    sizes_name, delays_name = names.grid_part(0), names.grid_part(1)
    if not batch_sizes:
        raise ValueError(f"{sizes_name}: expected at least one batch size; got none")
    if not delays_s:
        raise ValueError(f"{delays_name}: expected at least one delay; got none")
    small = [n for n in batch_sizes if n < 1]
    if small:
        raise ValueError(f"{sizes_name}: expected batch sizes ≥ 1; got {small[0]}")
    negative = [d for d in delays_s if d < 0]
    if negative:
        raise ValueError(f"{delays_name}: expected delays ≥ 0; got {negative[0]:g} s")
    if default is not None and (default[0] < 1 or not 0 <= default[1] < math.inf):
        raise ValueError(f"the default setting {default}: expected a max batch size ≥ 1 and a finite delay ≥ 0")
    grid = grid_of(batch_sizes, delays_s, default)
    busiest = busiest_step(profile, search, grid, instances=instances, sampled=sampled, cpu=cpu)
    if busiest["arrivals"] <= MAX_ARRIVALS_PER_STEP:
        return busiest
    from .arrivals import parse_arrivals

    fit = _fit_words(profile, sampled, cpu)
    hint = f"a shorter {names.shorter}, or a grid with a lower ceiling, fits"
    if names.fixed_warmup is not None and search.warmup_s > 0:
        # The step's own process (parsed for its whole length, as the search does), counted to its warm-up's end.
        step = parse_arrivals(search.arrival, busiest["qps"], duration_s=busiest["seconds"])
        in_warmup = arrival_count(step, search.warmup_s)
        if not in_warmup <= MAX_ARRIVALS_PER_STEP:
            hint = (
                f"even {names.fixed_warmup} alone expects {in_warmup:.3g}, so no shorter {names.shorter} fits; "
                "a grid with a lower ceiling does"
            )
    raise SearchTooLarge(
        f"{names.arrival} {search.arrival} over {names.length} ({busiest['seconds']:g} s): at most "
        f"{MAX_ARRIVALS_PER_STEP:.0e} arrivals per simulated step; got {busiest['arrivals']:.3g} expected at "
        f"{busiest['qps']:g} QPS, the highest rate the search can try (max_batch_size {busiest['max_batch_size']}, "
        f"delay {1e3 * busiest['delay_s']:g} ms, of {names.grid}: its ceiling by {fit} is "
        f"{busiest['ceiling_qps']:g} QPS); {hint}"
    )


def _row(max_batch_size: int, delay_s: float, found: dict) -> dict:
    step = found["step"]
    return {
        "max_batch_size": max_batch_size,
        "max_queue_delay_ms": delay_ms(delay_s),
        "max_qps": found["max_qps"],
        "ceiling_qps": found["ceiling_qps"],
        "p99_ms": step["latency_ms"]["p99"],
        "p50_ms": step["latency_ms"]["p50"],
        "mean_batch_size": step["mean_batch_size"],
        "utilization": step["utilization"],
        "evaluations": found["evaluations"],
    }


def on_measured_times(row: dict) -> bool:
    """Whether a setting's batches ran on measured batch times: its simulated mean batch within the measured sizes,
    as the table's mark and the warning judge it (`mean_batch_extrapolated`; a max_batch_size past them alone is
    context: a calibration's range is of loads' mean batches, which nearly every max_batch_size is past). Null,
    not known, counts as measured: there is nothing to prefer to it."""
    return not row.get("mean_batch_extrapolated")


def choose(rows: list[dict], tie: float, *, allow_extrapolated: bool = True) -> dict | None:
    """The best row: highest max QPS, ties (within `tie`, relative) to the shortest delay, then the smallest batch.
    Without `allow_extrapolated`, among the settings that ran on measured batch times (`on_measured_times`) when one of
    them meets the SLO: an extrapolated setting's lead is the fit's, not a measurement's."""
    if not allow_extrapolated:
        within = [r for r in rows if on_measured_times(r)]
        if any(r["max_qps"] > 0 for r in within):
            rows = within
    best = max((r["max_qps"] for r in rows), default=0.0)
    if best <= 0:
        return None
    close = [r for r in rows if r["max_qps"] >= (1 - tie) * best]
    return min(close, key=lambda r: (r["max_queue_delay_ms"], r["max_batch_size"]))


def tune(
    profile: Profile,
    search: SearchConfig,
    batch_sizes: Sequence[int],
    delays_s: Sequence[float],
    *,
    instances: int = 1,
    overhead_s: Sequence[float] = (),
    sampled: bool = False,
    default: tuple[int, float] | None = DEFAULT_SETTING,
    progress=None,
    cpu: CpuStage | None = None,
    overhead_at: OverheadAt | None = None,
    names: SearchNames | None = None,
    allow_extrapolated: bool = False,
) -> dict:
    """Search the grid; the `wok.tune/2` document (docs/tune.md). `overhead_at` (`overhead_by_rate`):
    each simulated rate draws its overhead there, in place of `overhead_s`. The grid and the
    search's size are checked first (`check_fits`, its refusal worded with `names`). Without
    `allow_extrapolated` a setting on extrapolated batch times is chosen only when no measured one
    meets the SLO (`choose`)."""
    # Before any simulating: a step too large to hold would be refused only once the search reached it.
    check_fits(profile, search, batch_sizes, delays_s, default, instances=instances, sampled=sampled, cpu=cpu,
               names=names)  # fmt: skip
    say = progress or (lambda msg: None)
    # As model_for builds every setting's model: what is simulated, not what was asked for.
    source, _, _, samples = batch_times(profile, sampled, cpu)
    # Batches outside the sizes the batch time was measured at run on T(n) extrapolated along the fit: the
    # profile's batch sizes, or the calibration's loads' mean batch sizes when its batch time replaces the profile's.
    measured = cpu.batch_fit_sizes if source == "server" else profile.profiled_sizes
    smallest, largest = (min(measured), max(measured)) if measured else (None, None)
    rows = []
    grid = grid_of(batch_sizes, delays_s, default)
    for n, d in grid:
        model = model_for(profile, n, d, instances=instances, overhead_s=overhead_s, sampled=sampled, cpu=cpu)
        row = _row(n, d, max_qps(model, search, overhead_at))
        row["in_grid"] = n in batch_sizes and delay_ms(d) in {delay_ms(x) for x in delays_s}
        # The largest batch the setting can form, as context; the flag is the batches the simulation formed at
        # max_qps (their mean): a max_batch_size of 64 whose batches average 6 under a tight SLO ran on measured
        # times, one of 8 whose batches average 2.4 on a profile of 4 and 8 did not, and the calibration's range
        # is of loads' mean batches.
        row["extrapolated"] = None if largest is None else not smallest <= n <= largest
        mean = row["mean_batch_size"]
        row["mean_batch_extrapolated"] = None if largest is None or mean is None else not smallest <= mean <= largest
        rows.append(row)
        say(f"max_batch_size {n}, delay {1e3 * d:g} ms: {row['max_qps']:.0f} QPS")
    # The default competes too: the tuner never recommends a setting it predicts to be worse
    # than it by more than the tie (within it, the shorter delay wins).
    chosen = choose(rows, search.tie, allow_extrapolated=allow_extrapolated)
    # The setting the measured-first rule passed over, when an extrapolated one predicted more beyond the tie.
    unrestricted = chosen if allow_extrapolated else choose(rows, search.tie)
    ahead = chosen is not None and unrestricted["max_qps"] * (1 - search.tie) > chosen["max_qps"]
    passed_over = unrestricted if ahead and not on_measured_times(unrestricted) else None
    default_row = None
    if default is not None:
        default_row = next(
            r for r in rows if (r["max_batch_size"], r["max_queue_delay_ms"]) == (default[0], delay_ms(default[1]))
        )
    o = np.asarray(overhead_s, dtype=np.float64)
    o_ms = analysis.latency_summary(1e3 * o)  # nearest-rank, as the simulated steps' own percentiles
    warnings = []
    if profile.fitted_alpha_s is not None and source != "server":
        warnings.append(negative_alpha_warning(profile.fitted_alpha_s, "wok plan takes it"))
    if passed_over is not None:
        warnings.append(_passed_over_warning(passed_over, chosen, smallest, largest, source, profile))
    toml = None
    if chosen is not None:
        n, delay_s = chosen["max_batch_size"], 1e-3 * chosen["max_queue_delay_ms"]
        comment = "written by wok tune"
        if chosen["mean_batch_extrapolated"] or chosen["extrapolated"]:
            model = model_for(profile, n, delay_s, sampled=sampled, cpu=cpu)
            comment += "; " + _extrapolated_comment(chosen, smallest, largest, source)
            warnings.append(_extrapolated_warning(chosen, smallest, largest, source, model.mean_batch_time, profile))
        toml = config_toml(n, delay_s, comment)
    return {
        "schema": SCHEMA,
        "created": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "inputs": {
            "slo_p99_ms": search.slo_p99_ms,
            "arrival": search.arrival,
            "alpha_s": profile.alpha_s,
            "beta_s": profile.beta_s,
            "r2": profile.r2,
            "profile": profile.source,
            "batch_times": source,
            "sampled_sizes": [n for n, _ in samples],
            "smallest_profiled_batch": smallest,
            "largest_profiled_batch": largest,
            "overhead": (
                {
                    "count": int(o.size),
                    "median_ms": o_ms["p50"],
                    "p99_ms": o_ms["p99"],
                }
                if o.size and overhead_at is None
                else None
            ),
            # The calibration loads the overhead was measured at, when it is drawn by rate.
            "overhead_by_rate_loads": None if overhead_at is None else list(getattr(overhead_at, "loads", [])),
            "cpu": None if cpu is None else cpu.as_dict(),
            # Whether the prediction charges the server's CPU per request (a CPU stage with some): without it the
            # max QPS is the batcher's alone, which a CPU-bound server does not reach (docs/tune.md).
            "server_cpu_modelled": server_cpu_modelled(cpu),
            "allow_extrapolated": allow_extrapolated,
            "instances": instances,
            "batch_sizes": list(batch_sizes),
            "delays_ms": [delay_ms(d) for d in delays_s],
            "sim_duration_s": search.duration_s,
            "sim_warmup_s": search.warmup_s,
            "iterations": search.iterations,
            "seed": search.seed,
            "tie": search.tie,
            "min_success_rate": 0.99,
        },
        "settings": rows,
        "chosen": chosen,
        "passed_over": passed_over,
        "default": default_row,
        "config_toml": toml,
        "warnings": warnings,
    }


def server_cpu_modelled(cpu: CpuStage | None) -> bool:
    """Whether a CPU stage charges CPU per request (the loop's, or the background's): a constant or measured
    overhead only delays each request, leaving the batcher's schedule, so its capacity, alone."""
    return cpu is not None and cpu.cpu_in_s + cpu.cpu_out_s + cpu.background_cpu_s > 0


# `wok tune`'s warning when `inputs.server_cpu_modelled` is false, printed above the table.
NO_CPU_WARNING = (
    "no per-request server CPU modelled: these are the batcher's limits alone. A server whose CPU is the bottleneck "
    "saturates far below them (on the 2-core development machine near 4,000 QPS, about 410 µs of server CPU per "
    "request: docs/performance.md); give --cpu-calibration (from bench/tune_check.py) or --per-request-cpu and "
    "--cores (docs/tune.md)"
)


def _size_text(n: float) -> str:
    """A batch size as the messages write it: a profile's whole sizes as they are, a calibration's mean to 0.1."""
    return f"{round(n, 1):g}"


def _mean_text(mean: float) -> str:
    """A simulated mean batch as the messages write it, to 0.01: 8.04 is past a profile's 8, and shown so."""
    return f"{round(mean, 2):g}"


def _extrapolated_comment(row: dict, smallest: float, largest: float, source: str) -> str:
    """The config's note of a chosen setting whose simulated mean batch, or else max_batch_size, lies outside the
    measured sizes."""
    n, mean = row["max_batch_size"], row["mean_batch_size"]
    if row["mean_batch_extrapolated"]:
        what, at = f"mean batch {_mean_text(mean)} (max_batch_size {n}) extrapolated: ", mean
    else:  # only the largest batches the setting forms
        what, at = f"max_batch_size {n} extrapolated: ", n
    if source == "server":
        return what + f"calibrated at mean batches {_size_text(smallest)}-{_size_text(largest)}"
    return what + (f"profiled from {smallest}" if at < smallest else f"profiled to {largest}")


def _calibration_range(smallest: float, largest: float) -> str:
    """What a calibration's batch time was measured on, as the messages name it."""
    span = f"{_size_text(smallest)} to {_size_text(largest)}"
    return f"the mean batch sizes the CPU calibration's batch time was fitted on ({span})"


def _check_advice(row: dict, below: bool, source: str, limit: int | None) -> str:
    """How to measure the batch time an extrapolated setting ran on: with a profile, batches of the sizes it forms;
    with a calibration's batch time, a calibration whose loads' mean batches reach its mean (its max_batch_size when
    only that is outside), which profiling does not change: the calibration's fit replaces the profile's. `limit`:
    the profile's model.max_batch_size (`profile_advice`)."""
    n, mean = row["max_batch_size"], row["mean_batch_size"]
    if source == "server":
        size = mean if row["mean_batch_extrapolated"] else n
        if below:
            return (
                f"calibrate at a load whose mean batch is about {_mean_text(size)} to check it (bench/tune_check.py: "
                "a lower --cpu-steps)"
            )
        # A load's mean batch grows with its rate, up to the calibration server's max_batch_size (its --default).
        return (
            f"calibrate at loads whose mean batch reaches about {_mean_text(size)} to check it (bench/tune_check.py: "
            f"higher --cpu-steps, with a --default max_batch_size of {math.ceil(size)} or more)"
        )
    # Past: the setting's batches reach n; below: the small batches its mean is made of.
    return profile_advice(max(1, math.floor(mean)) if below else n, limit)


def _passed_over_warning(
    row: dict, chosen: dict, smallest: float, largest: float, source: str, profile: Profile
) -> str:
    """The warning of the setting *Measured first* passed over: its simulated mean batch is outside the measured
    sizes (`on_measured_times`), and the advice is to measure there."""
    below = row["mean_batch_size"] < smallest
    side = "below" if below else "past"
    if source == "server":
        on = (
            f"its simulated batches average {_mean_text(row['mean_batch_size'])} requests, {side} "
            f"{_calibration_range(smallest, largest)}, on batch times extrapolated"
        )
    else:
        # Passed over for its mean batch outside the measured sizes (`mean_batch_extrapolated`): said as the plan's.
        on = f"on batch times extrapolated {outside_profiled(row['mean_batch_size'], smallest, largest)}"
    return (
        f"max_batch_size {row['max_batch_size']}, delay {row['max_queue_delay_ms']:g} ms predicts "
        f"{row['max_qps']:,.0f} QPS, more than the chosen {chosen['max_qps']:,.0f}, but {on}: not chosen; "
        f"{_check_advice(row, below, source, profile.model_max_batch_size)}, or pass --allow-extrapolated to choose it"
    )


def _extrapolated_warning(row: dict, smallest: float, largest: float, source: str, batch_time, profile: Profile) -> str:
    """The warning of a chosen setting whose simulated batches average outside the measured sizes (its
    max_batch_size the context), or whose max_batch_size alone is past them; `batch_time` is the setting's
    mean batch time as a function of the batch size."""
    n, mean = row["max_batch_size"], row["mean_batch_size"]
    by_mean = row["mean_batch_extrapolated"]
    # Below the smallest only the mean can be: a max_batch_size below it has every batch, so the mean, below too.
    below = by_mean and mean < smallest
    if source == "server":
        # Fitted on loads' mean batches, not on batches of one size: the simulated mean is what compares with them.
        outside = f"{'below' if below else 'past'} {_calibration_range(smallest, largest)}"
    else:
        outside = outside_profiled(mean if by_mean else n, smallest, largest)
    check = _check_advice(row, below, source, profile.model_max_batch_size)
    if by_mean:
        return (
            f"the chosen setting's simulated batches average {_mean_text(mean)} requests (max_batch_size {n}), "
            f"{outside}: their mean batch time, {1e3 * batch_time(mean):.3g} ms, is the fit α + β·n "
            f"extrapolated; {check}"
        )
    # A step without a batch in its window has no mean (null): only the max_batch_size is known outside then.
    within = (
        ""
        if mean is None
        else f"its simulated batches average {_mean_text(mean)} requests, within the measured range, but "
    )
    return (
        f"the chosen max_batch_size {n} is {outside}: {within}its larger batches and its ceiling run on the fit "
        f"α + β·n extrapolated (a batch of {n}: {1e3 * batch_time(n):.3g} ms); {check}"
    )


# ---------------------------------------------------------------------------- outputs


def config_toml(max_batch_size: int, delay_s: float, comment: str = "written by wok tune") -> str:
    """The part of a model's config.toml that `wok tune` decides (README, "repository format")."""
    return (
        f"# {comment}\n"
        f"max_batch_size = {max_batch_size}\n"
        "\n"
        "[dynamic_batching]\n"
        f"max_queue_delay_ms = {_float(1e3 * delay_s)}\n"
    )


def _float(x: float) -> str:
    r = round(x, 6)
    return repr(float(r))


def _fmt(x, spec: str) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return format(x, spec)


def print_table(result: dict, file=None) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    file = sys.stdout if file is None else file
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for h in ("max batch", "delay ms", "max QPS (P99 ≤ SLO)", "ceiling QPS", "P99 ms there", "mean batch", "util", ""):
        table.add_column(h, justify="right", no_wrap=True)
    chosen, default = result["chosen"], result["default"]
    for r in result["settings"]:
        mark = []
        if r is chosen:
            mark.append("chosen")
        if r is default:
            mark.append("default")
        if r.get("mean_batch_extrapolated"):
            mark.append("extrapolated")
        elif r.get("extrapolated"):  # only its largest batches, the simulated mean within the measured sizes
            mark.append("max extrapolated")
        table.add_row(
            str(r["max_batch_size"]),
            f"{r['max_queue_delay_ms']:g}",
            f"{r['max_qps']:,.0f}",
            f"{r['ceiling_qps']:,.0f}",
            _fmt(r["p99_ms"], ".2f"),
            _fmt(r["mean_batch_size"], ".1f"),
            _fmt(None if r["utilization"] is None else 100 * r["utilization"], ".0f") + "%",
            ", ".join(mark),
        )
    console = Console(file=file, color_system=None, highlight=False, markup=False, emoji=False, width=200)
    inp = result["inputs"]
    cpu = inp.get("cpu")
    alpha, beta = (cpu["batch_alpha_s"], cpu["batch_beta_s"]) if inp["batch_times"] == "server" else (
        inp["alpha_s"], inp["beta_s"])  # fmt: skip
    console.print(
        f"batch time α = {_ms(alpha)} ms, β = {_ms(beta)} ms/sample "
        f"({inp['batch_times']}); SLO P99 ≤ {inp['slo_p99_ms']:g} ms; {inp['arrival']} arrivals; "
        f"{inp['sim_duration_s']:g} s simulated per point"
    )
    if cpu:
        console.print(
            f"CPU stage: loop {1e6 * cpu['cpu_in_s']:.0f} + {1e6 * cpu['cpu_out_s']:.0f} µs per request, "
            f"{cpu['cores']:g} cores shared (0: unbounded), background {cpu['background_cores']:.2f} cores + "
            f"{1e6 * cpu['background_cpu_s']:.0f} µs per request"
        )
    if inp.get("overhead_by_rate_loads"):
        loads = ", ".join(f"{q:,.0f}" for q in inp["overhead_by_rate_loads"])
        console.print(f"overhead outside the server: drawn at each rate, from the calibration's loads {loads} QPS")
    # A result without the field (written before it) is not known to lack the CPU stage: no warning then.
    no_cpu = inp.get("server_cpu_modelled") is False
    if no_cpu:
        console.print(f"WARNING: {NO_CPU_WARNING}", soft_wrap=True)
    console.print(table)
    if chosen is None:
        console.print("no setting meets the SLO at any load")
    else:
        console.print(
            f"chosen: max_batch_size = {chosen['max_batch_size']}, "
            f"max_queue_delay_ms = {chosen['max_queue_delay_ms']:g} (predicted max QPS {chosen['max_qps']:,.0f}"
            + ("; the batcher's alone, no server CPU modelled)" if no_cpu else ")")
        )
    for w in result.get("warnings") or []:
        console.print(f"warning: {w}", soft_wrap=True)  # one line, whole, for a reader's grep
