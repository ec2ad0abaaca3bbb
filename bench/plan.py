"""`wok plan`: how many GPUs the peak needs, per team, and the autoscaling policy that keeps them.

N_GPU = ⌈λ_peak · T_batch / (n · U_target)⌉, plus k replicas of redundancy (N + k):
λ_peak · T_batch / n is the GPU time the peak asks for per second (batches per second ×
time per batch), so it is the number of GPUs that would be busy all the time; dividing by
U_target leaves each one idle the rest of the time, the headroom that keeps the queue short.

Every number is computed exactly, as a Fraction of the decimal text it was given in (a CLI
argument, or a number in a JSON file read with `parse_float=Decimal`): 5000 × 0.020 /
(16 × 0.65) is 125/13 = 9.615…, which rounds up to 10, and 2000 × 0.026 / (16 × 0.65) is
exactly 5, which stays 5, while the same arithmetic in binary floats (on the
0.026000000000000002 s that 26 × 0.001 gives) lands on 5.000000000000001 and would round up
to one GPU too many. Nothing here rounds until the ceiling.

The plan is one JSON document (schema `wok.plan/1`, docs/plan.md), a markdown view of it,
a table on stdout, and Kubernetes manifests for the autoscaling policy. Library code raises
ValueError on bad input; only the CLI exits.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import sys
import textwrap
from collections.abc import Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from urllib.parse import urlsplit

import yaml

from ..errors import quoted_name, shown_data, shown_entry, shown_value
from ..numerals import SPACES, digits_note, read_decimal
from .arrivals import DURATION, parse_duration
from .outputs import json_text, replacing
from .payloads import integer_refusal

SCHEMA = "wok.plan/1"
# analysis.READ_SCHEMAS, spelled out so that planning does not import numpy. The step figures read
# here (stages_ms, a measured ramp's mean_batch_size, offered_qps at max_qps_under_slo) are read
# alike in both; /1's offered_qps of a burst or sawtooth step may be over warm-up and window.
RAMP_SCHEMAS = ("wok.bench/1", "wok.bench/2")
TARGET_UTIL_DEFAULT = Fraction(13, 20)  # 0.65
TARGET_UTIL_ADVISED = (Fraction(3, 5), Fraction(7, 10))  # 0.6 .. 0.7
# The HPA controller's cluster-wide tolerance (--horizontal-pod-autoscaler-tolerance) when an
# object sets none of its own: no scaling while |metric / target − 1| ≤ 0.1.
HPA_DEFAULT_TOLERANCE = Fraction(1, 10)
# The batch stages of a request (docs/metrics.md); together they are the instance's time per batch.
BATCH_STAGES = ("assemble", "h2d", "compute", "d2h")
METRIC_NAME = "wok_instance_busy_ratio"  # what the Prometheus adapter calls the per-pod busy ratio
BUSY_COUNTER = "wok_instance_busy_seconds_total"
RATE_WINDOW = "1m"  # as deploy/prometheus/recording_rules.yml: 4 scrapes at 15 s
MANIFEST_FILES = ("hpa.yaml", "prometheus-adapter-rules.yaml", "keda-scaledobject.yaml")
# minReplicas and maxReplicas (HPA) and minReplicaCount and maxReplicaCount (KEDA) are int32: the API
# server refuses a larger count, which a schema check without formats (kubernetes-validate) lets by.
MAX_REPLICAS = 2**31 - 1
# The server's max_queue_delay_ms when a model's config sets none (server/config.py, DynamicBatchingConfig).
QUEUE_DELAY_DEFAULT = Fraction(5, 1000)
# A fitted α within this share of the smallest batch time measured is 0 rounded, not a line that fails at small
# batches: times exactly 0.1 ms·n at n = 1, 4, 16, 64 fit α = -4.3e-19 s, which `wok profile`, `wok tune` and
# `wok plan` all warned of as negative. The rounding is ~1e-16 of the largest time; a nanosecond per second is far
# above it for any profile's span of sizes and far below any clock's resolution of a batch.
ALPHA_ROUNDING = Fraction(1, 10**9)
# n more than this many times past the largest batch a profile measured (or below the smallest) is far outside it:
# the plan's `inputs.batch.extrapolation.far` (docs/plan.md, "Past the profile").
FAR_EXTRAPOLATION = 2


# ---------------------------------------------------------------------------- exact numbers


def _needed(d: dict, key: str, where: str):
    """d[key], or a ValueError saying it is missing (a hand-edited or truncated result file)."""
    if d.get(key) is None:
        raise ValueError(f"{where}: no {key}")
    return d[key]


def json_kind(value) -> str:
    """How a refusal names a JSON value that is not the kind expected: 'a list', 'a string ('x')', '1'
    (`wok plan`'s and `wok tune`'s files alike)."""
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return f"a string ({value!r})" if len(value) <= 40 else "a string"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):  # NaN and Infinity as the file writes them (str: nan, inf), as shown_data does
        return shown_data(value)
    return str(value)  # a Decimal (`wok plan` reads numbers so) as written


def _object(value, where: str, *, optional: bool = False) -> dict:
    """`value` if it is a JSON object (or, `optional`, {} for a missing one), else a ValueError naming `where`."""
    if value is None and optional:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"{where}: expected an object; got {json_kind(value)}")
    return value


def _named(names: Mapping[str, str] | None, key: str) -> str:
    """'NAME: ' when the caller names input `key` (a CLI option, a file's field), else ''.

    The library's range errors say which quantity is wrong; only the caller knows what the user
    typed to give it, so it passes `names` ({"target_util": "--target-util", ...}) down.
    """
    name = (names or {}).get(key)
    return f"{name}: " if name else ""


def exact(value, what: str, *, positive: bool = False, typed: str | None = None) -> Fraction:
    """The exact value of a decimal number given as text, int, Decimal or Fraction (never a float). `positive`:
    the caller refuses 0 (and below), so a refusal of a magnitude no float holds does not offer it. `typed`: the
    text as given where `value` is a part of it (an amplitude's '4' of '4x'), which a refusal then quotes whole."""
    if isinstance(value, Fraction):
        return value
    if isinstance(value, float) and not math.isfinite(value):  # JSON's NaN, Infinity
        raise ValueError(f"{what}: expected a finite number; got {shown_data(value)}")
    if isinstance(value, (bool, float)):
        raise ValueError(f"{what}: expected decimal text, not a binary float; got {shown_data(value)}")
    if isinstance(value, int):  # a JSON integer past a float's range was taken, and refused later naming no field
        return _in_float_range(Fraction(value), what, value, positive)
    if isinstance(value, Decimal):
        d = value
    else:
        text = str(value).strip(SPACES)
        try:
            d = read_decimal(text)
        except ValueError:
            raise ValueError(f"{what}: {shown_value(typed or value)} is not a number{digits_note(text)}") from None
    if not d.is_finite():
        raise ValueError(f"{what}: expected a finite number; got {shown_value(typed or value)}")
    return _in_float_range(Fraction(d), what, typed or value, positive)


def _in_float_range(x: Fraction, what: str, given, positive: bool = False) -> Fraction:
    """`x`, if a float holds its magnitude: the plan's figures are reported as floats. `given` shown as the option
    (text) or the file (a JSON number, read as an int or Decimal: until 2026-12-07 `Decimal('1E+400')`) wrote it.
    `positive`: the caller refuses 0, which the refusal then does not offer (until 2026-12-07 `--peak-qps 1e-400`
    was told "expected 0 or ...", and 0 then refused)."""
    try:
        f = float(x)
    except OverflowError:
        f = math.inf
    if math.isinf(f) or (x and not f):
        shown = str(given) if isinstance(given, Decimal) else shown_data(given)
        expected = "a number > 0 that" if positive else "0 or a number whose magnitude"
        raise ValueError(f"{what}: expected {expected} a 64-bit float holds (about 1e-308 to 1e308); got {shown}")
    return x


_UNIT = {"ms": Fraction(1, 1000), "s": Fraction(1), "m": Fraction(60), "h": Fraction(3600), None: Fraction(1)}


def exact_duration(text: str, what: str, *, positive: bool = False) -> Fraction:
    """Seconds, exactly, in the syntax of `wok.bench.arrivals.parse_duration` ("20ms", "2s", "5m"),
    but with the unit required: a plan's times are milliseconds as often as seconds, and a bare
    "20" read as 20 s would plan a thousand times too many GPUs without a word."""
    try:
        parse_duration(text)  # the same syntax and the same message for a bad one
    except ValueError as exc:
        raise ValueError(f"{what}: {exc}") from None
    m = DURATION.fullmatch(text)
    if m.group(3) is None:
        bare = text.strip(SPACES)
        raise ValueError(f"{what}: {quoted_name(text)} has no unit; write {bare}ms or {bare}s")
    number = Fraction(Decimal(m.group(1) + (f"e{m.group(2)}" if m.group(2) else "")))
    return _in_float_range(number * _UNIT[m.group(3)], what, text, positive)


def ceil(x: Fraction) -> int:
    return -(-x.numerator // x.denominator)


def decimal_text(x: Fraction, places: int = 6) -> str:
    """x in decimals: exact when it terminates within `places`, else rounded and marked with '…'."""
    if x.denominator == 1:
        return str(x.numerator)
    scaled = x * 10**places
    if scaled.denominator == 1:
        text = f"{Decimal(scaled.numerator).scaleb(-places):f}".rstrip("0").rstrip(".")
        return text
    return f"{Decimal(round(scaled)).scaleb(-places):f}…"


def _num(x: Fraction) -> float | int:
    return x.numerator if x.denominator == 1 else float(x)


def _many(count, word: str) -> str:
    """'1 GPU', '2 GPUs', '0 GPUs': a count with its noun, singular for exactly one."""
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def _are(count) -> str:
    """The verb after a count of things (`_many`): 'the 1 CPU is', 'the 2 CPUs are'."""
    return "is" if count == 1 else "are"


# A step's unit (plural, as the JSON has it) for a value of exactly 1, in the views.
_SINGULAR = {"GPUs": "GPU", "CPUs": "CPU", "replicas": "replica"}


def device_word(batch_in: Mapping) -> str:
    """What the plan counts, by the device the batch time was measured on: 'CPU' for a profile run on the CPU
    (its `config.device`, `inputs.batch.profile.device`) or a ramp of a model the server runs on the CPU (its
    `devices`, `inputs.batch.ramp.device`), else 'GPU' (every other source, and a ramp that recorded none).
    A plan's views read its `inputs.unit` (`plan_word`); this is for plans written before it."""
    device = (batch_in.get("profile") or batch_in.get("ramp") or {}).get("device")
    return (_unit_of(device) or "gpu").upper()


def _unit_of(device) -> str | None:
    """'cpu' or 'gpu' for a recorded device ("cpu", "cuda:0", a ramp's "gpu"), None for none recorded."""
    return None if not isinstance(device, str) else "cpu" if device.lower().startswith("cpu") else "gpu"


def _unit_option(names: Mapping[str, str] | None) -> str:
    """The caller's name for the `unit` input (`--unit` for the CLI), as its errors and warnings name it."""
    return (names or {}).get("unit", "unit")


def plan_word(plan: Mapping) -> str:
    """What a plan document counts, 'CPU' or 'GPU': its `inputs.unit`, or in a plan written before that field
    (up to e7bb956, 2026-12-05) the device its batch input recorded (`device_word`)."""
    unit = plan["inputs"].get("unit")
    return unit.upper() if isinstance(unit, str) else device_word(plan["inputs"]["batch"])


# What `inputs.unit` may be: the device one of N (`result.gpus`, `teams.rows[].quota_gpus`, ...) is.
UNITS = ("cpu", "gpu")


def plan_unit(batch: BatchTime, given: str | None, names: Mapping[str, str] | None = None) -> tuple[str, str]:
    """What the plan counts ('cpu' or 'gpu') and where that came from: the device the batch input records (source
    'profile' or 'ramp'), else `given` ('given'), else 'gpu' ('default'). A `given` unit that contradicts the
    recorded device is refused: the batch time was measured on the one, and would size a fleet of the other."""
    option = _unit_option(names)
    if given is not None and given not in UNITS:
        raise ValueError(f"{option}: expected one of {', '.join(map(repr, UNITS))}; got {shown_value(given)}")
    device = batch.detail.get("device") if batch.source in ("profile", "ramp") else None
    recorded = _unit_of(device)
    if recorded is None:
        return (given, "given") if given is not None else ("gpu", "default")
    if given is not None and given != recorded:
        field_name = "config.device" if batch.source == "profile" else "devices"
        raise ValueError(
            f"{option} {given}: the {batch.source} {batch.detail.get('path')} was measured on {device} "
            f"(its {field_name}), so its batch time sizes {recorded.upper()}s; drop {option}"
        )
    return recorded, batch.source


# Printed under the plan (and in --markdown) when `inputs.batch.server_cpu_counted` is false.
NO_CPU_NOTE = (
    "T_batch is the model's batch alone: the server's CPU per request (event loop, gRPC, codec) is not in this "
    "plan, and caps a replica at about its cores / (CPU per request) QPS whatever N says (the 2-core development "
    "machine: about 410 µs per request, saturating near 4,000 QPS, docs/performance.md); measure a replica with "
    "`wok bench ramp` and plan with --from-ramp"
)


def _ms(seconds) -> str:
    """Seconds (a Fraction, or a float as the plan holds it) as milliseconds, exact to 0.1 µs or marked '…'."""
    x = seconds if isinstance(seconds, Fraction) else exact(Decimal(repr(seconds)), "figure")
    return decimal_text(1000 * x, 4) + " ms"


def _value_unit(step: dict) -> str:
    """A step's value and unit as the views show it: '10 GPUs', '1 GPU'; seconds as ms."""
    if step["unit"] == "s":
        return _ms(step["value"])
    unit = _SINGULAR.get(step["unit"], step["unit"]) if step["value"] == 1 else step["unit"]
    return f"{_f(step['value'])} {unit}"


def _exact_str(x: Fraction) -> str:
    return str(x.numerator) if x.denominator == 1 else f"{x.numerator}/{x.denominator}"


# ---------------------------------------------------------------------------- inputs


@dataclass(frozen=True)
class Burst:
    """A Gaussian burst λ(t) = base + A·exp(−(t − t0)² / 2σ²): its peak is base + A."""

    base_qps: Fraction
    amplitude_qps: Fraction
    sigma_s: Fraction | None = None

    @property
    def peak_qps(self) -> Fraction:
        return self.base_qps + self.amplitude_qps

    def seconds_above(self, level_qps: Fraction) -> float | None:
        """How long λ(t) stays above `level_qps`: 2σ·√(2·ln(A / (level − base))).

        0 when the peak does not exceed the level; None when that time is unbounded (the
        level is at or below the base) or unknown (no σ).
        """
        if level_qps >= self.peak_qps:
            return 0.0
        if level_qps <= self.base_qps or self.sigma_s is None:
            return None
        return 2.0 * float(self.sigma_s) * math.sqrt(2.0 * math.log(self.amplitude_qps / (level_qps - self.base_qps)))


def parse_burst(spec: str, option: str = "--burst") -> Burst:
    """'base=1000,amplitude=4000,sigma=30s'; amplitude may be a multiple of the base ('4x'); sigma is optional.
    A t0 is taken and left unused (the plan needs no time of the peak). The bench's `--arrival burst:…`
    does not paste as it is: its base is the step's rate (give base=), its sigma may be a share of the step.
    Refusals start with `option` (the caller's name for the spec) and the spec."""
    opts: dict[str, str] = {}
    where = f"{option} {quoted_name(spec)}"
    for item in spec.split(","):
        key, eq, value = (x.strip(SPACES) for x in item.partition("="))
        if not eq or not key or not value:
            raise ValueError(f"{where}: expected key=value items like base=1000,amplitude=4000,sigma=30s")
        if key not in ("base", "amplitude", "sigma", "t0"):
            raise ValueError(f"{where}: unknown option {quoted_name(key)}; expected base, amplitude, sigma or t0")
        if key in opts:
            raise ValueError(f"{where}: option {quoted_name(key)} given twice")
        opts[key] = value
    for key in ("base", "amplitude"):
        if key not in opts:
            raise ValueError(f"{where}: {key}= is required")
    base = exact(opts["base"], f"{where}: base")
    amp_text = opts["amplitude"]
    if amp_text.lower().endswith("x"):
        # Refused as typed: 'amplitude=1e-400x' was told "got '1e-400'", the x dropped.
        amplitude = exact(amp_text[:-1], f"{where}: amplitude", typed=amp_text) * base
    else:
        amplitude = exact(amp_text, f"{where}: amplitude")
    if base < 0 or amplitude < 0:
        got = f"got {decimal_text(base)} and {decimal_text(amplitude)}"
        raise ValueError(f"{where}: expected a base and an amplitude >= 0; {got}")
    sigma = None
    if "sigma" in opts:
        sigma = exact_duration(opts["sigma"], f"{where}: sigma", positive=True)
        if sigma <= 0:
            raise ValueError(f"{where}: expected a sigma > 0 s; got {decimal_text(sigma)} s")
    if base + amplitude <= 0:
        raise ValueError(f"{where}: expected a peak base + amplitude > 0; got 0")
    return Burst(base, amplitude, sigma)


_TEAM = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def parse_team(spec: str, option: str = "--team") -> tuple[str, Fraction]:
    """'search=3000': a team name and its peak QPS. Refusals start with `option` and the spec."""
    name, eq, value = (x.strip(SPACES) for x in spec.partition("="))
    where = f"{option} {quoted_name(spec)}"
    if not eq or not _TEAM.fullmatch(name):
        raise ValueError(f"{where}: expected NAME=PEAK_QPS like search=3000")
    qps = exact(value, f"{where}: peak QPS", positive=True)
    if qps <= 0:
        raise ValueError(f"{where}: expected a peak QPS > 0; got {value}")
    return name, qps


@dataclass(frozen=True)
class BatchTime:
    """T_batch and n, and where they came from (shown in the plan)."""

    t_batch_s: Fraction
    batch_size: Fraction
    source: str  # "given", "alpha_beta", "profile", "ramp"
    detail: dict = field(default_factory=dict)  # JSON-ready, copied into the plan's inputs
    alpha_s: Fraction | None = None
    beta_s: Fraction | None = None
    # From a ramp, exactly: the step's offered and achieved QPS, and its batch stages' means in ms.
    step_qps: Fraction | None = None
    achieved_qps: Fraction | None = None
    stages_ms: dict[str, Fraction] = field(default_factory=dict)
    # The α given when it was below 0 and taken as 0 (`alpha_s`), as `wok tune` takes it.
    given_alpha_s: Fraction | None = None
    # A profile's smallest and largest measured batch sizes (`batches[].batch_size`), outside which α + β·n is
    # extrapolated.
    profiled_min_batch: Fraction | None = None
    profiled_max_batch: Fraction | None = None
    # Warnings of the source, for the plan's: a profile's n past its model's max_batch_size (`past_model_max`).
    notes: tuple[str, ...] = ()
    # The profile's model.max_batch_size, past which `wok profile` times no batch (`profile_advice`).
    profiled_model_max: Fraction | None = None


def past_model_max(option: str, sizes, limit, profile: str) -> str:
    """The warning of `wok plan`, `wok tune` and `wok simulate` for batch sizes (`option`'s `sizes`) above the
    max_batch_size of the model a profile (`profile`: its option and path) measured. Warned of, not refused: that
    max_batch_size is the profiled server's config, which a setting past it raises (`wok tune` searches 64 on a
    profile of the demo mlp's 32, bench/tune_check.py serves it), so a plan of it is asked for; that its time is the
    fit extrapolated is the warning of a size past the largest measured, which each command gives as well."""
    shown = ", ".join(decimal_text(Fraction(n)) for n in sizes)
    return (
        f"{option} {shown} {'is' if len(sizes) == 1 else 'are'} past the profiled model's max_batch_size ({limit}, "
        f"{profile}): the server as profiled forms no batch that large; its config's max_batch_size must be raised "
        "to serve one"
    )


def profiled_model_max(doc: dict, where: str) -> int | None:
    """A `wok.profile/1` document's `model.max_batch_size`, the profiled server's (`past_model_max`), as `wok plan`,
    `wok tune` and `wok simulate` read it: None where the document has none, else a whole number ≥ 1 (a float or a
    Decimal of one too: `wok plan` reads its numbers as Decimal), or refused naming `where` and the field."""
    model = doc.get("model")
    limit = model.get("max_batch_size") if isinstance(model, dict) else None
    if limit is None:
        return None
    number = isinstance(limit, (int, float, Decimal)) and not isinstance(limit, bool)
    if not (number and math.isfinite(limit) and limit == int(limit) and limit >= 1):
        raise ValueError(f"{where}: model.max_batch_size: expected a whole number ≥ 1; got {json_kind(limit)}")
    return int(limit)


def outside_profiled(n, least, most) -> str | None:
    """Where a batch size `n` lies outside the sizes a profile measured (`least` to `most`), as the warnings of
    `wok plan`, `wok tune` and `wok simulate` say it: `below the smallest batch the profile measured (2)` or `past
    the largest batch the profile measured (32)`; None within them, or where they are not known."""
    if least is None or most is None or least <= n <= most:
        return None
    side, end, size = ("below", "smallest", least) if n < least else ("past", "largest", most)
    return f"{side} the {end} batch the profile measured ({decimal_text(Fraction(size))})"


def profile_advice(n, limit) -> str:
    """The advice of `wok plan`, `wok tune` and `wok simulate` to measure a batch time extrapolated to batches of
    `n`. Past the profiled model's max_batch_size (`limit`; None: not known) `wok profile` refuses such batches
    ("--batch-sizes [64] exceed model 'm''s max_batch_size (32)"): the advice alone could not be followed."""
    shown, most = decimal_text(Fraction(n)), None if limit is None else decimal_text(Fraction(limit))
    if limit is None or n <= limit:
        return f"profile batches of {shown} to check it"
    return (
        f"profile batches of {shown} to check it, with the model's max_batch_size raised from {most} to {shown} or "
        "more in its config first (wok profile refuses batches past it)"
    )


def negative_alpha_warning(
    alpha_s, others: str, *, whose: str = "the profile's fitted α", shown: str = "", at: str = ""
) -> str:
    """The warning of `wok plan`, `wok tune` and `wok simulate` for an α below 0, taken as 0: `whose` it is, `shown`
    its value as the command shows it (default: in ms, 4 digits), `others` the commands that take it so too ("wok
    plan takes it"), `at` what that changes, said after ("at n = 16, β·n = 0.024 s, not 0.023 s")."""
    shown = shown or f"{1e3 * float(alpha_s):.4g} ms"
    return (
        f"{whose} = {shown} is negative: the linear fit T = α + β·n does not hold at small batches; α is taken as 0, "
        f"T(n) = β·n (as {others})" + (f": {at}" if at else "")
    )


def alpha_is_rounding(alpha_s, smallest_time_s) -> bool:
    """Whether a fitted α is 0 but for the fit's rounding: |α| within `ALPHA_ROUNDING` of the smallest batch time
    measured (`smallest_time_s`, None when no time is known: then only an α of exactly 0 is)."""
    if smallest_time_s is None or not smallest_time_s > 0:
        return alpha_s == 0
    return abs(alpha_s) <= ALPHA_ROUNDING * smallest_time_s


def _check_batch(t: Fraction, n: Fraction, names: Mapping[str, str] | None) -> None:
    if t <= 0:
        raise ValueError(f"{_named(names, 't_batch_s')}T_batch: expected a time > 0 s; got {decimal_text(t)} s")
    if n <= 0:
        raise ValueError(f"{_named(names, 'batch_size')}the batch size n: expected a number > 0; got {decimal_text(n)}")
    if n < 1:
        # n counts requests per batch (its mean), and a batch holds one or more: below 1 the plan
        # would charge every request more than a whole batch's time.
        raise ValueError(
            f"{_named(names, 'batch_size')}the batch size n: expected at least 1 (a batch holds one request or "
            f"more); got {decimal_text(n)}"
        )


def batch_given(t_batch_s: Fraction, batch_size: Fraction, *, names: Mapping[str, str] | None = None) -> BatchTime:
    """T_batch and n as given; `names` ("t_batch_s", "batch_size") are the caller's for them, for the errors."""
    _check_batch(t_batch_s, batch_size, names)
    return BatchTime(t_batch_s, batch_size, "given")


def batch_from_alpha_beta(
    alpha_s: Fraction,
    beta_s: Fraction,
    batch_size: Fraction,
    *,
    names: Mapping[str, str] | None = None,
    smallest_time_s: Fraction | None = None,
    **detail,
) -> BatchTime:
    """T_batch = α + β·n, the linear batch-time model `wok profile` fits.

    β, the time per row, must be >= 0. A least-squares α may come out below 0 (noise at small
    batches): it is taken as 0, T_batch = β·n, as `wok tune` takes it (its simulator needs α >= 0;
    one profile, one T(n)), and the plan warns, unless it is the fit's rounding of 0 (`alpha_is_rounding`
    of `smallest_time_s`, the smallest batch time the fit was made on). `names` ("beta_s", "t_batch_s" for
    α + β·n, "batch_size") are the caller's for the inputs, for the errors.
    """
    if beta_s < 0:
        raise ValueError(f"{_named(names, 'beta_s')}β: expected a time >= 0 s; got {decimal_text(beta_s)} s")
    given = alpha_s if alpha_s < 0 and not alpha_is_rounding(alpha_s, smallest_time_s) else None
    alpha_s = max(alpha_s, Fraction(0))
    t = alpha_s + beta_s * batch_size
    _check_batch(t, batch_size, names)
    source = "profile" if detail else "alpha_beta"
    return BatchTime(t, batch_size, source, detail, alpha_s, beta_s, given_alpha_s=given)


def _load_json(path: Path, what: str) -> dict:
    """The JSON object in `path`; refusals start with `what` (the option that named the file) and the path."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"{what} {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"{what} {path}: expected JSON (UTF-8 text); got {exc}") from None
    try:
        # Decimal keeps the numbers as written, so the arithmetic on them stays exact.
        doc = json.loads(text, parse_float=Decimal)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{what} {path}: expected JSON; got {exc}") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{what} {path}: expected a JSON object; got {json_kind(doc)}")
    return doc


def batch_from_profile(path: Path, batch_size: Fraction, *, names: Mapping[str, str] | None = None) -> BatchTime:
    """α and β from a `wok profile --json` document (schema wok.profile/1: `fit.alpha_s`, `fit.beta_s`).

    `names` may name "batch_size" for the errors, and "profile", the file (default --profile); α and β
    are named by the file and field.
    """
    option = (names or {}).get("profile", "--profile")
    doc = _load_json(path, option)
    schema = doc.get("schema")
    if not (isinstance(schema, str) and schema.startswith("wok.profile/")):
        raise ValueError(f"{option} {path}: expected schema 'wok.profile/1'; got {shown_entry(doc, 'schema')}")
    if schema != "wok.profile/1":
        raise ValueError(f"{option} {path}: schema {schema!r} is newer than the wok.profile/1 this planner reads")
    fit = doc.get("fit")
    if not isinstance(fit, dict) or fit.get("alpha_s") is None or fit.get("beta_s") is None:
        raise ValueError(f"{option} {path}: no fit.alpha_s and fit.beta_s")
    alpha = exact(fit["alpha_s"], f"{option} {path}: fit.alpha_s")
    beta = exact(fit["beta_s"], f"{option} {path}: fit.beta_s")
    model = doc.get("model")
    limit = profiled_model_max(doc, f"{option} {path}")
    notes = ()
    most = None if limit is None else Fraction(limit)
    if most is not None and batch_size > most:
        # Refused up to 2026-12-06: the plan of a setting `wok tune` chose past the profile's config was not to be had.
        notes = (
            past_model_max((names or {}).get("batch_size", "--batch-size"), [batch_size], limit, f"{option} {path}"),
        )
    detail = {"path": str(path), "model": model.get("name") if isinstance(model, dict) else model}
    # The device the batches ran on (`config.device`: cpu, cuda, cuda:1): the plan names what it counts by it.
    config = doc.get("config")
    device = config.get("device") if isinstance(config, dict) else None
    detail["device"] = device if isinstance(device, str) else None
    if (r2 := fit.get("r2")) is not None:
        # A JSON number, as `wok tune` reads it: float() took true and a string's digits as numbers, and an R² of NaN
        # or 1e400 was taken and failed --json's writing once the plan was made (until 2026-12-07).
        where = f"{option} {path}: fit.r2"
        if isinstance(r2, bool) or not isinstance(r2, (int, float, Decimal)):
            raise ValueError(f"{where}: expected a number; got {json_kind(r2)}")
        if isinstance(r2, float):  # JSON's NaN, Infinity: every other number reads as an int or a Decimal
            raise ValueError(f"{where}: expected a finite number; got {json_kind(r2)}")
        try:
            detail["r2"] = float(r2)
        except OverflowError:  # an integer past a float's range: a traceback until 2026-12-07
            detail["r2"] = math.inf
        if math.isinf(detail["r2"]):  # a Decimal past it reads as infinite
            raise ValueError(f"{where}: expected a number a 64-bit float holds; got {json_kind(r2)}")
    # The sizes and times the fit was made on, as `wok tune` reads them; entries it cannot read are left to it
    # (the plan needs the fit alone): a size outside them is marked and warned of, a time bounds α's rounding.
    batches = doc.get("batches")
    batches = [b for b in batches if isinstance(b, dict)] if isinstance(batches, list) else []
    whole = [Fraction(x) for x in (b.get("batch_size") for b in batches) if _finite_number(x)]
    whole = [x for x in whole if x >= 1]
    times = [b.get("median_s") for b in batches]
    times += [x for b in batches if isinstance(b.get("samples_s"), list) for x in b["samples_s"]]
    times = [Fraction(x) for x in times if _finite_number(x)]
    smallest = min((x for x in times if x > 0), default=None)
    fields = {"beta_s": f"{option} {path}: fit.beta_s", "t_batch_s": f"{option} {path}: fit.alpha_s + fit.beta_s × n"}
    batch = batch_from_alpha_beta(
        alpha, beta, batch_size, names={**(names or {}), **fields}, smallest_time_s=smallest, **detail
    )
    batch = replace(batch, notes=notes, profiled_model_max=most)
    return replace(batch, profiled_min_batch=min(whole), profiled_max_batch=max(whole)) if whole else batch


def _finite_number(x) -> bool:
    """A JSON number read with `parse_float=Decimal` that is finite (not true, not a string, not NaN)."""
    return type(x) is int or (isinstance(x, Decimal) and x.is_finite())


def batch_from_ramp(path: Path, *, names: Mapping[str, str] | None = None) -> BatchTime:
    """T_batch and n from the step of a `wok bench ramp` result at its max QPS under the SLO.

    n is the server's mean batch size in that step and T_batch the sum of the per-request
    means of its batch stages (assemble, h2d, compute, d2h; docs/metrics.md). The stage
    histograms charge each request its batch's time, so that mean is weighted by the
    requests in each batch: when batch sizes vary and bigger batches take longer it is a
    little above the mean time per batch, which makes the plan err towards more GPUs.
    `names` may name "from_ramp", the file, for the errors (default --from-ramp).
    """
    option = (names or {}).get("from_ramp", "--from-ramp")
    doc = _load_json(path, option)
    file = f"{option} {path}"
    if doc.get("schema") not in RAMP_SCHEMAS:
        expected = " or ".join(map(repr, RAMP_SCHEMAS))
        raise ValueError(f"{file}: expected schema {expected}; got {shown_entry(doc, 'schema')}")
    best = doc.get("max_qps_under_slo")
    if best is None:
        raise ValueError(f"{file}: no step met the SLO (max_qps_under_slo is null): nothing to plan on")
    # positive: 0 is refused just below, so a magnitude no float holds is not told "expected 0 or ...".
    best = exact(best, f"{file}: max_qps_under_slo", positive=True)
    if best <= 0:
        raise ValueError(f"{file}: max_qps_under_slo: expected a QPS > 0; got {decimal_text(best)}")
    all_steps = doc.get("steps")
    if all_steps is not None and not isinstance(all_steps, list):
        raise ValueError(f"{file}: steps: expected a list; got {json_kind(all_steps)}")
    offered = []
    for i, s in enumerate(all_steps or []):
        at = f"{file}: steps[{i}]"
        s = _object(s, at)
        offered.append((s, exact(_needed(s, "offered_qps", at), f"{at}.offered_qps")))
    steps = [s for s, q in offered if q == best]
    if not steps:
        raise ValueError(f"{file}: no step at max_qps_under_slo = {decimal_text(best)} QPS")
    step = steps[0]
    where = f"{file}, step {decimal_text(best)} QPS"
    mix = _object(doc.get("config"), f"{file}: config", optional=True).get("models") or []
    if isinstance(mix, list) and len(mix) > 1:
        # Its server figures are the mix's summed (bench/scrape.py): no one model's batch time.
        raise ValueError(
            f"{file}: the ramp ran a mix of {len(mix)} models: its batch figures are the mix's, not one model's; "
            "plan on a ramp of the one model"
        )
    stages = _object(step.get("stages_ms"), f"{where}: stages_ms", optional=True)
    n = step.get("mean_batch_size")
    if not stages or n is None or stages.get("compute") is None:
        raise ValueError(
            f"{where}: no server-side batch figures (mean_batch_size, stages_ms): the ramp did not scrape the "
            "server's /metrics (--metrics-url auto looks only at port 8002 of the target's host: rerun the ramp "
            "with --metrics-url http://HOST:PORT/metrics, the port of wok serve --metrics-port), or it is a simulation"
        )
    parts = {s: exact(stages[s], f"{where}: stages_ms.{s}") for s in BATCH_STAGES if stages.get(s) is not None}
    t = sum(parts.values(), Fraction(0)) / 1000
    rows_per_batch = exact(n, f"{where}: mean_batch_size")
    # λ counts requests, so n must too: mean_batch_size counts rows, which a ramp sending
    # several rows per request (--rows, --sizes) has more of. The server's own counts over the
    # step give requests per batch; a result without them is read as rows / config.rows.
    server = _object(step.get("server"), f"{where}: server", optional=True)
    config = _object(doc.get("config"), f"{file}: config", optional=True)
    if server.get("requests") and server.get("batches"):
        requests = exact(server["requests"], f"{where}: server.requests")
        n = requests / exact(server["batches"], f"{where}: server.batches")
    else:
        rows = exact(config.get("rows", 1), f"{file}: config.rows")
        if rows < 1:
            raise ValueError(f"{file}: config.rows: expected rows per request >= 1; got {decimal_text(rows)}")
        n = rows_per_batch / rows
    _check_batch(t, n, {"t_batch_s": f"{where}: stages_ms", "batch_size": where})
    achieved = exact(_needed(step, "achieved_qps", where), f"{where}: achieved_qps")
    if achieved < 0:
        raise ValueError(f"{where}: achieved_qps: expected a QPS >= 0; got {decimal_text(achieved)}")
    p99 = _object(step.get("latency_ms"), f"{where}: latency_ms", optional=True).get("p99")
    if p99 is not None:
        exact(p99, f"{where}: latency_ms.p99")  # a number, or refused here rather than by float()
    models = config.get("models") or []
    if not isinstance(models, list):
        raise ValueError(f"{file}: config.models: expected a list; got {json_kind(models)}")
    model = _model_of(models, f"{file}: config.models")
    device = _object(doc.get("devices"), f"{file}: devices", optional=True).get(model)
    if device not in (None, "cpu", "gpu"):
        raise ValueError(
            f"{file}: devices[{quoted_name(model)}]: expected 'cpu', 'gpu' or null; got {shown_data(device)}"
        )
    flushes = _object(step.get("flush_reasons"), f"{where}: flush_reasons", optional=True)
    # A ramp's SLO is > 0 (its --slo-p99 refuses 0): a 0 or below was planned on and written as the plan's SLO.
    slo = exact(_needed(doc, "slo_p99_ms", file), f"{file}: slo_p99_ms", positive=True)
    if slo <= 0:
        raise ValueError(f"{file}: slo_p99_ms: expected milliseconds > 0; got {decimal_text(slo)}")
    detail = {
        "path": str(path),
        "model": model,
        "device": device,
        "step_offered_qps": _num(best),
        "achieved_qps": float(achieved),
        "p99_ms": None if p99 is None else float(p99),
        "slo_p99_ms": float(slo),
        "stages_ms": {s: float(v) for s, v in parts.items()},
        "rows_per_batch": float(rows_per_batch),
        # Counts: ints, whether the ramp wrote 900 or (before 2026-12-02) 900.0.
        "flush_reasons": {k: _count(exact(v, f"{where}: flush_reasons.{k}")) for k, v in flushes.items()},
        "highest_step": all(q <= best for _, q in offered),
    }
    return BatchTime(t, n, "ramp", detail, step_qps=best, achieved_qps=achieved, stages_ms=parts)


def _model_of(models: list, where: str) -> str | None:
    """The one model a ramp ran (config.models: [[name, ...], ...]), or None for a mix."""
    if len(models) != 1:
        return None
    first = models[0]
    if not isinstance(first, list) or not first or not isinstance(first[0], str):
        raise ValueError(f"{where}[0]: expected [NAME, ...]; got {json_kind(first)}")
    return first[0]


def _count(v) -> int | float:
    f = float(v)
    return int(f) if f.is_integer() else f


@dataclass(frozen=True)
class Autoscaling:
    """The policy: scale out above `scale_out_above` busy, in below `scale_in_below`, each sustained `sustain_s`."""

    scale_out_above: Fraction = Fraction(7, 10)
    scale_in_below: Fraction = Fraction(3, 10)
    sustain_s: Fraction = Fraction(180)
    max_replicas: int | None = None  # default: 2 × (N + k)
    model: str = "mlp"
    deployment: str = "wok"
    namespace: str = "wok"  # as deploy/k8s
    prometheus_url: str = "http://prometheus-operated.monitoring.svc:9090"
    adapter_namespace: str = "monitoring"

    def check(self, names: Mapping[str, str] | None = None) -> None:
        """Raise ValueError on a bad field; `names` maps field names to the caller's (CLI options), for the errors."""
        out, inn = self.scale_out_above, self.scale_in_below
        if out <= 0:
            raise ValueError(
                f"{_named(names, 'scale_out_above')}the scale-out threshold: expected a number in (0, 1); got {_d(out)}"
            )
        if out >= 1:
            raise ValueError(
                f"{_named(names, 'scale_out_above')}the scale-out threshold: expected a number in (0, 1): a pod's "
                f"busy ratio, the seconds per second its model instance spends running batches, is at most 1, so the "
                f"autoscaler would never scale out; got {_d(out)}"
            )
        # KEDA's HPA scales out above its threshold × (1 + the cluster's 10% tolerance), and the threshold,
        # out / 1.1, is written rounded up to 4 places: above 0.9999 that puts scale-out above 1.
        keda_out = _round_up(out / (1 + HPA_DEFAULT_TOLERANCE), 4) * (1 + HPA_DEFAULT_TOLERANCE)
        if keda_out >= 1:
            raise ValueError(
                f"{_named(names, 'scale_out_above')}the scale-out threshold: expected at most 0.9999: KEDA's "
                f"threshold, it / 1.1 rounded up to 4 places, would have KEDA's HPA (10% tolerance) scale out only "
                f"above {_d(keda_out)}, a busy ratio no pod reaches; got {decimal_text(out, 12)}"
            )
        if not 0 < inn < out:
            raise ValueError(
                f"{_named(names, 'scale_in_below')}the scale-in threshold: expected a number > 0 below the scale-out "
                f"threshold {_d(out)}; got {_d(inn)}"
            )
        # The HPA's scale-down tolerance is written to 4 places and rounded up (so that scale-in
        # starts at or below the threshold asked for): below out / 10⁴ it rounds up to 1, and
        # out × (1 − 1) = 0 is a busy ratio no pod goes below: the HPA would never scale in.
        least = out / 10**4
        if inn < least:
            raise ValueError(
                f"{_named(names, 'scale_in_below')}the scale-in threshold: expected at least the scale-out threshold "
                f"/ 10000 = {decimal_text(_round_up(least, 12), 12)}: below that the HPA's scale-down tolerance, "
                f"4 decimal places, rounds up to 1 and it never scales in; got {decimal_text(inn, 12)}"
            )
        if not 0 <= self.sustain_s <= 3600 or self.sustain_s.denominator != 1:
            raise ValueError(
                f"{_named(names, 'sustain_s')}sustain: expected whole seconds from 0 to 1h (the HPA's stabilization "
                f"window); got {_d(self.sustain_s)} s"
            )
        if self.max_replicas is not None:
            option = f"{_named(names, 'max_replicas')}max replicas"
            int32 = " (the autoscalers' replica counts are 32-bit integers)"
            if (refusal := integer_refusal(option, self.max_replicas, 1, int32, most=MAX_REPLICAS)) is not None:
                raise ValueError(refusal)
        for key, what, name in (
            ("deployment", "deployment", self.deployment),
            ("namespace", "namespace", self.namespace),
            ("adapter_namespace", "adapter namespace", self.adapter_namespace),
        ):
            if not re.fullmatch(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?", name):
                raise ValueError(
                    f"{_named(names, key)}{what} {quoted_name(name)} is not a Kubernetes name (lower case letters, "
                    "digits, '-')"
                )
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", self.model):
            raise ValueError(
                f"{_named(names, 'model')}model {quoted_name(self.model)}: letters, digits, '_', '.', '-' only (it "
                "goes into PromQL)"
            )
        # KEDA's serverAddress: "" or a host without its scheme was written into the manifest as given.
        try:
            url = urlsplit(self.prometheus_url)
        except ValueError:  # an IPv6 host without its closing bracket
            url = None
        shown = self.prometheus_url.isprintable() and " " not in self.prometheus_url
        if url is None or url.scheme not in ("http", "https") or not url.hostname or not shown:
            raise ValueError(
                f"{_named(names, 'prometheus_url')}Prometheus URL {quoted_name(self.prometheus_url)}: expected a URL "
                "such as http://prometheus-operated.monitoring.svc:9090"
            )


# ---------------------------------------------------------------------------- the plan


def _step(name: str, formula: str, substituted: str, value: Fraction, unit: str = "") -> dict:
    return {
        "name": name,
        "formula": formula,
        "substituted": substituted,
        "value": _num(value),
        "exact": _exact_str(value),
        "unit": unit,
    }


def _d(x: Fraction) -> str:
    return decimal_text(x)


def largest_remainder(shares: dict[str, Fraction], total: int) -> dict[str, int]:
    """Integers summing to `total = ⌈Σ shares⌉`: each ⌊share⌋, plus one for the largest fractional parts.

    That is Hamilton's method. Ties go to the larger share, then to the name first in sort order.
    """
    if total != ceil(sum(shares.values(), Fraction(0))):
        raise ValueError(f"total {total} is not ⌈Σ shares⌉")
    quota = {name: x.numerator // x.denominator for name, x in shares.items()}
    left = total - sum(quota.values())  # ⌈Σ frac⌉ ≤ the number of shares
    order = sorted(shares, key=lambda t: (-(shares[t] - quota[t]), -shares[t], t))
    for t in order[:left]:
        quota[t] += 1
    return quota


def build_plan(
    *,
    batch: BatchTime,
    peak_qps: Fraction | None = None,
    burst: Burst | None = None,
    teams: list[tuple[str, Fraction]] | None = None,
    target_util: Fraction = TARGET_UTIL_DEFAULT,
    redundancy: int = 1,
    autoscaling: Autoscaling | None = None,
    created: str | None = None,
    names: Mapping[str, str] | None = None,
    max_queue_delay_s: Fraction | None = None,
    unit: str | None = None,
) -> dict:
    """The whole `wok.plan/1` document (docs/plan.md): inputs, the arithmetic step by step, the result.

    `names` maps the inputs ("peak_qps", "target_util", "redundancy", "max_queue_delay_s", and the
    fields of `Autoscaling`) to the caller's names for them, which the errors then start with.
    `max_queue_delay_s`: the batcher's window w (the model's max_queue_delay_ms), by default the
    server's 5 ms; it decides whether the batches of n the formula assumes can form (`batch_fill`).
    `unit`: what N counts, 'cpu' or 'gpu', where the batch input records no device (`plan_unit`; "unit" in
    `names`); by default what it records, else GPUs.
    """
    try:
        return _build_plan(
            batch, peak_qps, burst, teams, target_util, redundancy, autoscaling, created, names, max_queue_delay_s, unit
        )
    except OverflowError:
        # Each input is within a float's range (exact()), but a product or quotient of them may not be.
        raise ValueError(
            "the inputs give a figure beyond what a 64-bit float holds (about 1e-308 to 1e308): "
            "check the units of the peak and the batch time"
        ) from None


def _build_plan(
    batch, peak_qps, burst, teams, target_util, redundancy, autoscaling, created, names, window, unit
) -> dict:
    teams = list(teams or [])
    given = [x for x in (peak_qps is not None, burst is not None, bool(teams)) if x]
    if len(given) != 1:
        raise ValueError("give the peak exactly one way: a peak QPS, a burst profile, or per-team peaks")
    if not 0 < target_util <= 1:
        raise ValueError(
            f"{_named(names, 'target_util')}target utilization: expected a number in (0, 1]; got {_d(target_util)}"
        )
    if (refusal := integer_refusal(f"{_named(names, 'redundancy')}redundancy k", redundancy, 0)) is not None:
        raise ValueError(refusal)
    team_names = [t for t, _ in teams]
    if len(set(team_names)) != len(team_names):
        raise ValueError(f"a team is named twice: {team_names}")
    autoscaling = autoscaling or Autoscaling()
    autoscaling.check(names)
    window_source = "given" if window is not None else "server default"
    window = QUEUE_DELAY_DEFAULT if window is None else window
    if window < 0:
        raise ValueError(
            f"{_named(names, 'max_queue_delay_s')}the queue delay: expected a time >= 0 s; got {_d(window)} s"
        )
    warnings: list[str] = []
    # What the plan counts, in its steps and every message: CPUs for a batch time measured on the CPU.
    unit, unit_source = plan_unit(batch, unit, names)
    dev = unit.upper()
    if batch.source == "ramp" and unit_source == "default":
        # A ramp written before 2026-12-05 records no device: a CPU server's plan would count GPUs unsaid.
        warnings.append(
            f"the ramp {batch.detail['path']} records no device for its model (its `devices`: absent in ramps "
            "written before 2026-12-05, null where the server's ModelConfig named none), so the plan counts GPUs; "
            f"if that server ran the model on the CPU, give {_unit_option(names)} cpu"
        )
    lo, hi = TARGET_UTIL_ADVISED
    if not lo <= target_util <= hi:
        warnings.append(
            f"target utilization {_d(target_util)} is outside the advised {_d(lo)}–{_d(hi)}: "
            + (
                f"below it {dev}s idle for little gain in latency"
                if target_util < lo
                else "above it the queue (and P99) grows steeply as load nears capacity, and a lost replica "
                "or a forecast miss has little room"
            )
        )

    t, n, u, k = batch.t_batch_s, batch.batch_size, target_util, redundancy
    if batch.given_alpha_s is not None:
        alpha = batch.given_alpha_s
        at = f"T_batch at n = {_d(n)} is β·n = {_d(t)} s, not {_d(alpha + batch.beta_s * n)} s"
        warnings.append(negative_alpha_warning(alpha, "wok tune takes it", whose="α", shown=f"{_d(alpha)} s", at=at))
    warnings.extend(batch.notes)
    extrapolation = _extrapolation(batch)
    if extrapolation is not None and extrapolation["extrapolated"]:
        least, most = batch.profiled_min_batch, batch.profiled_max_batch
        far = ""
        if extrapolation["far"]:
            ratio = n / most if n > most else least / n
            far = f", a factor of {decimal_text(ratio, 2)} outside it (far: more than {FAR_EXTRAPOLATION})"
        warnings.append(
            f"n = {_d(n)} is {outside_profiled(n, least, most)}{far}: T_batch = α + β·n = "
            f"{_d(t)} s is the fit extrapolated, not measured; {profile_advice(n, batch.profiled_model_max)}"
        )
    steps: list[dict] = []

    # -- the peak
    if peak_qps is not None:
        if peak_qps <= 0:
            raise ValueError(f"{_named(names, 'peak_qps')}peak QPS: expected a number > 0; got {_d(peak_qps)}")
        lam = peak_qps
        peak_in = {"source": "given", "peak_qps": _num(lam), "exact": _exact_str(lam)}
    elif burst is not None:
        lam = burst.peak_qps
        peak_in = {
            "source": "burst",
            "peak_qps": _num(lam),
            "exact": _exact_str(lam),
            "burst": {
                "base_qps": _num(burst.base_qps),
                "amplitude_qps": _num(burst.amplitude_qps),
                "sigma_s": None if burst.sigma_s is None else _num(burst.sigma_s),
            },
        }
        steps.append(
            _step("peak", "λ_peak = λ_base + A", f"{_d(burst.base_qps)} + {_d(burst.amplitude_qps)}", lam, "QPS")
        )
    else:
        lam = sum((q for _, q in teams), Fraction(0))
        peak_in = {
            "source": "teams",
            "peak_qps": _num(lam),
            "exact": _exact_str(lam),
            "teams": [{"name": name, "peak_qps": _num(q)} for name, q in teams],
        }
        steps.append(
            _step("peak", "λ_peak = Σ team peaks", " + ".join(_d(q) for _, q in teams), lam, "QPS"),
        )

    # -- T_batch
    if batch.alpha_s is not None:
        steps.append(
            _step(
                "T_batch",
                "T_batch = α + β·n",
                f"{_ms(batch.alpha_s)} + {_ms(batch.beta_s)} × {_d(n)}",
                t,
                "s",
            )
        )
    elif batch.source == "ramp":
        stages = batch.stages_ms
        steps.append(
            _step(
                "T_batch",
                "T_batch = Σ batch stage means (" + " + ".join(stages) + ")",
                " + ".join(f"{_d(v)} ms" for v in stages.values()),
                t,
                "s",
            )
        )

    busy = lam * t / n
    steps.append(
        _step(
            f"{dev} load",
            f"ρ = λ_peak × T_batch / n   ({dev}s busy all the time)",
            f"{_d(lam)} × {_d(t)} / {_d(n)}",
            busy,
            f"{dev}s",
        )
    )
    n_exact = busy / u
    steps.append(_step(f"{dev}s at target", "ρ / U_target", f"{_d(busy)} / {_d(u)}", n_exact, f"{dev}s"))
    n_gpu = ceil(n_exact)
    steps.append(
        _step(
            "N",
            "N = ⌈ρ / U_target⌉",
            f"⌈{_d(n_exact)}⌉" + ("  (an integer: stays)" if n_exact.denominator == 1 else ""),
            Fraction(n_gpu),
            f"{dev}s",
        )
    )
    total = n_gpu + k
    steps.append(_step("N + k", "N + k", f"{n_gpu} + {k}", Fraction(total), "replicas"))
    if total > MAX_REPLICAS:
        raise ValueError(
            f"N + k = {total} replicas is more than an autoscaler's minReplicas holds ({MAX_REPLICAS}, a 32-bit "
            "integer): check the units of the peak and the batch time"
        )
    if busy / total > autoscaling.scale_out_above:
        # The HPA (scale-up tolerance 0) adds replicas once the mean busy ratio exceeds its target.
        share = decimal_text(100 * busy / total, 1)
        warnings.append(
            f"at the peak the {_many(total, 'replica')} {_are(total)} {share}% busy, above "
            f"the scale-out threshold {_d(autoscaling.scale_out_above)}: the autoscaler would add replicas at "
            f"every planned peak, not only for load beyond the plan; a U_target of at most "
            f"{_d(autoscaling.scale_out_above)} (or a higher scale-out threshold) keeps the two apart"
        )

    fill = None
    if batch.source != "ramp":  # a ramp's n is the batch its step formed (and _ramp_check warns on it)
        fill = batch_fill(lam, n_gpu, batch, window, u)
        warning = _fill_warning(fill, batch, n_gpu, busy / n_gpu, u, window, window_source, names, dev)
        if warning:
            warnings.append(warning)

    per_replica_full = n / t
    per_replica_target = per_replica_full * u
    result = {
        "gpus_exact": _num(n_exact),
        "gpus_exact_fraction": _exact_str(n_exact),
        "gpus": n_gpu,
        "redundancy": k,
        "replicas": total,
        "qps_per_replica_full": _num(per_replica_full),
        "qps_per_replica_at_target": _num(per_replica_target),
        "utilization_at_peak": _num(busy / n_gpu),
        "utilization_at_peak_all_replicas": _num(busy / total),
        "batch_fill": None if fill is None else {k: _num(v) if isinstance(v, Fraction) else v for k, v in fill.items()},
    }

    teams_out = None
    if teams:
        teams_out, step = _teams(teams, lam, t / (n * u), n_gpu, k, dev)
        steps.append(step)

    autoscale, burst_out = _autoscaling(autoscaling, total, burst, t / (n * u), per_replica_target, names)

    cross = None
    if batch.source == "ramp":
        cross, step = _ramp_check(batch, lam, per_replica_target, n_gpu, warnings, dev)
        steps.append(step)
        if batch.detail.get("model") and autoscaling.model != batch.detail["model"]:
            warnings.append(
                f"the ramp measured model {batch.detail['model']!r}, the manifests scale on {autoscaling.model!r}"
            )

    batch_in = {
        "source": batch.source,
        "t_batch_s": _num(t),
        "t_batch_exact": _exact_str(t),
        "batch_size": _num(n),
        "batch_size_exact": _exact_str(n),
        "alpha_s": None if batch.alpha_s is None else _num(batch.alpha_s),
        # The α given, when it was below 0 and taken as 0 (alpha_s): else null.
        "alpha_given_s": None if batch.given_alpha_s is None else _num(batch.given_alpha_s),
        "beta_s": None if batch.beta_s is None else _num(batch.beta_s),
        "extrapolation": extrapolation,
        # Only a ramp ran the real server, whose cross-check sizes on what a replica served; every other T_batch
        # is the model's batch alone, without the server's CPU per request (NO_CPU_NOTE).
        "server_cpu_counted": batch.source == "ramp",
        **({"ramp": batch.detail} if batch.source == "ramp" else {}),
        **({"profile": batch.detail} if batch.source == "profile" else {}),
    }
    return {
        "schema": SCHEMA,
        "created": created or datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "inputs": {
            "peak": peak_in,
            "batch": batch_in,
            "target_utilization": _num(u),
            "redundancy": k,
            "max_queue_delay_s": _num(window),
            "max_queue_delay_source": window_source,
            "unit": unit,
            "unit_source": unit_source,
        },
        "steps": steps,
        "result": result,
        "teams": teams_out,
        "burst": burst_out,
        "cross_check": cross,
        "autoscaling": autoscale,
        "warnings": warnings,
    }


def _extrapolation(batch: BatchTime) -> dict | None:
    """Where n lies against the batch sizes a profile measured (`inputs.batch.extrapolation`, docs/plan.md): None
    when they are not known. Marked, not refused: n within the model's max_batch_size is a batch the server forms
    (past it `batch_from_profile` refuses), and the plan of it is the fit's, as `wok tune` searches such settings."""
    least, most, n = batch.profiled_min_batch, batch.profiled_max_batch, batch.batch_size
    if least is None or most is None:
        return None
    # How many times past the largest (or below the smallest) n is; 1 within the range.
    ratio = n / most if n > most else least / n if n < least else Fraction(1)
    return {
        "smallest_profiled_batch": _num(least),
        "largest_profiled_batch": _num(most),
        "extrapolated": ratio > 1,
        "ratio": _num(ratio),
        "ratio_exact": _exact_str(ratio),
        "far": ratio > FAR_EXTRAPOLATION,
    }


# ---------------------------------------------------------------------------- do batches fill?


# From this mean on, `least_mean_batch` takes a normal approximation (`_least_mean_batch_normal`): the
# direct sum costs ~24·√m terms (6.4 s at m = 1e11), the approximation's error is below
# 1 / (12·√(2π·m)) = 3.3e-5 requests here and falls as 1/√m, and from about 1e7 on it is already
# smaller than the float error of the sum (docs/plan.md, "Do batches fill?").
NORMAL_FROM = 1e6


def least_mean_batch(m: float, n: Fraction) -> float:
    """E[min(n, 1 + X)] for X ~ Poisson(m): the mean batch when each holds its first request and
    the arrivals of the window after it, m expected, up to n (`batch_fill`). Summed directly below
    `NORMAL_FROM`, approximated at and above it."""
    if m >= NORMAL_FROM:
        return _least_mean_batch_normal(m, n)
    return _least_mean_batch_sum(m, n)


def _least_mean_batch_sum(m: float, n: Fraction) -> float:
    """`least_mean_batch` by summing the Poisson terms: exact but for floats, in ~24·√m terms."""
    if m <= 0:
        return float(min(n, 1))
    cap = n - 1

    def pmf(j: int) -> float:
        return math.exp(-m + j * math.log(m) - math.lgamma(j + 1))

    # Only the j within ~12 standard deviations of m count (what lies beyond adds far less than a
    # float resolves). Of the two equal forms the one that sums the smaller side: 1 + m − E[(X − cap)⁺]
    # with the cap above m (1.5 exactly at m = 0.5, not 16 less 14.5 in floats), n − E[(cap − X)⁺] below.
    spread = 12 * math.sqrt(m) + 30
    low, high = max(0, math.floor(m - spread)), math.ceil(m + spread)
    if cap > m:
        return 1 + m - sum(float(j - cap) * pmf(j) for j in range(max(low, math.ceil(cap)), high))
    return float(n) - sum(float(cap - j) * pmf(j) for j in range(low, min(high, math.ceil(cap))))


def _least_mean_batch_normal(m: float, n: Fraction) -> float:
    """`least_mean_batch` in constant time: E[(X − c)⁺], c = n − 1, from the Edgeworth expansion of
    Poisson(m) to its skewness term (docs/plan.md, "Do batches fill?"). With σ = √m, z = (c − m) / σ:

        E[(X − c)⁺] ≈ σ·(φ(z) − z·Q(z)) + z·φ(z) / 6

    the normal's value and the skewness 1/σ's correction (up to 0.04 requests, φ(1) / 6). What it
    leaves, R(z, θ)·φ(z) / σ with θ the fraction of c, R = (z² − 1)/24 + (z⁴ − 6z² + 3)/72 − 1/12
    + θ(1 − θ)/2 (kurtosis, squared skewness, the lattice), is at most φ(0) / (12σ) in size, at z = 0, θ = 0.
    """
    c = float(n) - 1
    sigma = math.sqrt(m)
    z = (c - m) / sigma
    phi = math.exp(-z * z / 2) / math.sqrt(2 * math.pi)
    skew = z * phi / 6
    # The side that is small, as `_least_mean_batch_sum` sums it: E[(c − X)⁺] = c − m + E[(X − c)⁺].
    if c >= m:
        return 1 + m - (sigma * (phi - z * math.erfc(z / math.sqrt(2)) / 2) + skew)
    return float(n) - (sigma * (phi + z * math.erfc(-z / math.sqrt(2)) / 2) + skew)


def batch_fill(lam: Fraction, gpus: int, batch: BatchTime, window: Fraction, target_util: Fraction) -> dict:
    """Whether the batches of n the plan assumes form at each GPU's share of the peak (docs/plan.md,
    "Do batches fill?"), and if not, bounds on the batch and the busy ratio.

    Each of `gpus` GPUs (one model instance each) is taken to get a Poisson stream of λ' = λ / N,
    batched by the fixed policy: a batch leaves when the instance is free and n requests wait or the
    oldest has waited the window w. With T(k) ≤ T(n) for k ≤ n:

    * at most: two flushes are at most T(k) + w apart, plus the wait for the next arrival (mean
      1 / λ') when the queue is empty as the instance frees; batches leave at λ' / b a second, so
      b / λ' ≤ E[T(k)] + w + 1 / λ', that is b ≤ 1 + λ'·(T(n) + w), and with T(k) = α + β·k,
      b ≤ (1 + λ'·(α + w)) / (1 − λ'·β). Either is below n exactly when w < (n − 1) / λ' − T(n):
      the plan's batches of n cannot form on average (`window_to_fill_s`).
    * at least (α and β known): a batch below n leaves only once its oldest request has waited w,
      and holds every request that arrived meanwhile, so b ≥ E[min(n, 1 + Poisson(λ'·w))].
    * busy: λ' / b batches a second of α + β·b seconds each, U = λ'·(α / b + β), so the bounds on
      b bound U the other way; `gpus_needed` is the least N whose lower bound is within the target
      (fewer are busier than it for certain), `gpus_enough` the least whose upper bound is.
    * `extrapolation`: whether those b lie below the smallest batch a profile measured, where α + β·b is
      the fit extrapolated (`_fill_extrapolation`).
    """
    n, t = batch.batch_size, batch.t_batch_s
    per_gpu = lam / gpus
    to_fill = max(Fraction(0), (n - 1) / per_gpu - t)
    out = {
        "per_gpu_qps": per_gpu,
        "window_to_fill_s": to_fill,
        "mean_batch_at_most": _most_batch(per_gpu, batch, window),
    }
    if batch.alpha_s is None:
        return out
    least = least_mean_batch(float(per_gpu * window), n)
    out.update(
        mean_batch_at_least=least,
        busy_at_least=_busy(per_gpu, batch, out["mean_batch_at_most"]),
        busy_at_most=min(1.0, float(_busy(per_gpu, batch, least))),  # past 1: the GPU saturates
        gpus_needed=_least_gpus(lam, gpus, lambda q: _busy(q, batch, _most_batch(q, batch, window)) <= target_util),
        gpus_enough=_least_gpus(
            lam, gpus, lambda q: _busy(q, batch, least_mean_batch(float(q * window), n)) <= target_util
        ),
        extrapolation=_fill_extrapolation(batch, least),
    )
    return out


def _fill_below(fill: dict | None, n) -> bool:
    """Whether the views add that the batches at the peak may lie below the profile (`_fill_extrapolation`): only
    when they may be smaller than n, since full batches below it are n's own case, which `inputs.batch.extrapolation`
    says. `n` None: for the fill warnings, which speak only of batches that are not full."""
    e = (fill or {}).get("extrapolation")
    return bool(e and e["extrapolated"]) and (n is None or e["least_mean_batch"] < n)


def _fill_extrapolation(batch: BatchTime, least: float) -> dict | None:
    """Where the least mean batch at the peak lies against the smallest batch a profile measured (`batch_fill`'s
    `extrapolation`, docs/plan.md): None when the profile's sizes are not known. The busy bounds charge batches of
    that size α + β·b, which below the profile is the fit carried past its data, as `inputs.batch.extrapolation`
    marks it for n. Only below: the batches that form are at most n, which that mark judges against the largest."""
    smallest = batch.profiled_min_batch
    if smallest is None:
        return None
    # How many times below the smallest the least mean batch is; 1 at or above it.
    ratio = float(smallest) / least if least < smallest else 1.0
    return {
        "smallest_profiled_batch": _num(smallest),
        "least_mean_batch": least,
        "extrapolated": ratio > 1,
        "ratio": ratio,
        "far": ratio > FAR_EXTRAPOLATION,
    }


def _fill_below_text(fill: dict) -> str:
    """The fill warnings' note on a least mean batch below the profile (`_fill_extrapolation`), or ''."""
    if not _fill_below(fill, None):
        return ""
    e = fill["extrapolation"]
    far = f", far: more than {FAR_EXTRAPOLATION}× below it" if e["far"] else ""
    return (
        f" (below the smallest batch the profile measured, {_f(e['smallest_profiled_batch'])}{far}: the busy "
        "bounds charge such batches α + β·b extrapolated)"
    )


def _most_batch(per_gpu: Fraction, batch: BatchTime, window: Fraction) -> Fraction:
    """The most a batch can hold on average at `per_gpu` QPS (`batch_fill`), exactly."""
    n = batch.batch_size
    most = min(n, 1 + per_gpu * (batch.t_batch_s + window))
    if batch.alpha_s is not None and per_gpu * batch.beta_s < 1:
        most = min(most, (1 + per_gpu * (batch.alpha_s + window)) / (1 - per_gpu * batch.beta_s))
    return most


def _busy(per_gpu: Fraction, batch: BatchTime, mean_batch):
    """U = λ'·(α / b + β): λ' / b batches a second of α + β·b seconds each."""
    if isinstance(mean_batch, float):
        return float(per_gpu) * (float(batch.alpha_s) / mean_batch + float(batch.beta_s))
    return per_gpu * (batch.alpha_s / mean_batch + batch.beta_s)


def _least_gpus(lam: Fraction, start: int, enough) -> int:
    """The least N >= `start` with enough(λ / N); `enough` holds from some N on (U falls as N grows)."""
    high = start
    while not enough(lam / high):
        high *= 2
    low = start if enough(lam / start) else high // 2 + 1
    while low < high:
        mid = (low + high) // 2
        if enough(lam / mid):
            high = mid
        else:
            low = mid + 1
    return high


def _fill_warning(
    fill: dict, batch: BatchTime, gpus: int, planned: Fraction, u: Fraction, window, source, names, dev: str = "GPU"
):
    """The warning when the plan's full batches cannot form on average, naming the numbers; else None. `dev`: what
    the plan counts (`plan_unit`)."""
    n, per_gpu, most = batch.batch_size, fill["per_gpu_qps"], fill["mean_batch_at_most"]
    if batch.alpha_s == 0:  # with α = 0 a request costs β in a batch of any size
        return None
    if most >= n:
        # Full batches can form on average, but only when n − 1 requests arrive within the window after
        # a batch's first (the instance is free at U_target < 1): the lower bound is the close one, and
        # `wok simulate` at w = window_to_fill_s forms batches of 6 of 16, 73% busy for a 62.5% plan.
        if batch.alpha_s is None or fill["gpus_enough"] <= gpus:
            return None
        return (
            f"batches of n = {_d(n)} may not be full: at the peak each {dev} gets λ / N = "
            f"{decimal_text(per_gpu, 1)} QPS, and a batch below n waits only {decimal_text(1000 * window, 3)} ms "
            f"for the requests after its first: batches average at least {_f(fill['mean_batch_at_least'], 2)}"
            f"{_fill_below_text(fill)}, "
            f"so each {dev} may be up to {_f(100 * fill['busy_at_most'], 1)}% busy at the peak, not the "
            f"{decimal_text(100 * planned, 1)}% planned: for U_target {_d(u)} the peak needs at most "
            f'{_many(fill["gpus_enough"], dev)} where the plan counts {gpus} (docs/plan.md, "Do batches fill?")'
        )
    option = (names or {}).get("max_queue_delay_s", "max_queue_delay_s")
    which = (
        f"{option}" if source == "given" else f"the server's default; give the model's max_queue_delay_ms as {option}"
    )
    after = "request after a batch's first takes" if n - 1 == 1 else "requests after a batch's first take"
    text = (
        f"batches of n = {_d(n)} will not be full: at the peak each {dev} gets λ / N = "
        f"{decimal_text(per_gpu, 1)} QPS, so the n − 1 = {_d(n - 1)} {after} "
        f"{decimal_text(1000 * (n - 1) / per_gpu, 1)} ms to arrive, and the batcher would have to wait "
        f"{decimal_text(1000 * fill['window_to_fill_s'], 1)} ms ((n − 1) / λ' − T_batch) to fill it, but it flushes "
        f"after {decimal_text(1000 * window, 3)} ms ({which}): batches average at most {decimal_text(most, 2)} "
        "requests"
    )
    if batch.alpha_s is None:
        return text + (
            f", and each {dev} may be busier than the {decimal_text(100 * planned, 1)}% planned (it is when T_batch "
            "has a fixed part); with --alpha and --beta (or --profile) the plan bounds how much busier (docs/plan.md, "
            '"Do batches fill?")'
        )
    needed, enough = fill["gpus_needed"], fill["gpus_enough"]
    return text + (
        f" and at least {_f(fill['mean_batch_at_least'], 2)}{_fill_below_text(fill)}, so each {dev} is "
        f"{decimal_text(100 * fill['busy_at_least'], 1)}–{_f(100 * fill['busy_at_most'], 1)}% busy at "
        f"the peak, not the {decimal_text(100 * planned, 1)}% planned: for U_target {_d(u)} the peak needs "
        + (_many(needed, dev) if needed == enough else f"at least {needed} and at most {_many(enough, dev)}")
        + f' where the plan counts {gpus} (docs/plan.md, "Do batches fill?")'
    )


def _teams(teams: list[tuple[str, Fraction]], lam: Fraction, gpus_per_qps: Fraction, n_gpu: int, k: int, dev: str):
    """Each team's exact GPUs (CPUs: `dev`), own pool and quota of the shared fleet; and the own-pools step."""
    shares = {name: q * gpus_per_qps for name, q in teams}
    quota = largest_remainder(shares, n_gpu)
    rows = [
        {
            "name": name,
            "peak_qps": _num(q),
            "share_of_peak": _num(q / lam),
            "gpus_exact": _num(shares[name]),
            "gpus_exact_fraction": _exact_str(shares[name]),
            "own_pool_gpus": ceil(shares[name]),
            "own_pool_replicas": ceil(shares[name]) + k,
            "quota_gpus": quota[name],
        }
        for name, q in teams
    ]
    own = sum(r["own_pool_gpus"] for r in rows)
    out = {
        "rows": rows,
        "shared_gpus": n_gpu,
        "shared_replicas": n_gpu + k,
        "own_pools_gpus": own,
        "own_pools_replicas": own + k * len(rows),
        "rounding_overhead_gpus": own - n_gpu,
        "rounding": (
            f"shared: one fleet of N = ⌈Σ team {dev}s⌉ rounds once, and k redundant replicas serve every team; "
            f"each team is charged quota_gpus, ⌊its exact share⌋ plus one {dev} for the teams with the largest "
            "fractional parts until the quotas add up to N (largest remainder). Own pools: each team "
            "rounds up on its own and keeps its own k, which costs own_pools_replicas − shared_replicas "
            "more replicas"
        ),
    }
    step = _step(
        "teams, own pools",
        "Σ ⌈λ_team × T_batch / (n × U_target)⌉",
        " + ".join(f"⌈{_d(shares[name])}⌉" for name, _ in teams),
        Fraction(own),
        f"{dev}s",
    )
    return out, step


def _autoscaling(
    a: Autoscaling,
    total: int,
    burst: Burst | None,
    gpus_per_qps: Fraction,
    per_replica_target: Fraction,
    names: Mapping[str, str] | None,
) -> tuple[dict, dict | None]:
    """The policy's numbers (HPA target and tolerances, KEDA threshold, replica bounds) and why the floor is N + k."""
    max_replicas = a.max_replicas if a.max_replicas is not None else min(2 * total, MAX_REPLICAS)
    if max_replicas < total:
        raise ValueError(
            f"{_named(names, 'max_replicas')}max replicas {max_replicas} is below the planned minimum N + k = {total}"
        )
    scale_down_tol = _tolerance_for(a.scale_in_below, a.scale_out_above)
    if a.scale_out_above * (1 - scale_down_tol) > a.scale_in_below:
        raise AssertionError("the scale-down tolerance must put scale-in at or below the asked threshold")
    keda_threshold = _round_up(a.scale_out_above / (1 + HPA_DEFAULT_TOLERANCE), 4)
    burst_out = None
    why_min = (
        f"min replicas = N + k = {total}: the HPA acts only after the load has stayed above "
        f"{_d(a.scale_out_above)} for {_d(a.sustain_s)} s, and a new replica then still has to be scheduled, "
        "start and load its model; a peak that arrives faster than that would be served by the replicas "
        "already running, so they must carry the planned peak (N) and survive the loss of k. Autoscaling "
        "adds replicas only for load beyond the plan, and scales back to N + k, never below"
    )
    if burst is not None:
        base_gpus = ceil(burst.base_qps * gpus_per_qps)
        base_capacity = base_gpus * per_replica_target
        above = burst.seconds_above(base_capacity)
        burst_out = {
            "base_gpus": base_gpus,
            "base_capacity_qps": _num(base_capacity),
            "seconds_above_base_capacity": above,
        }
        if above is not None:
            verdict = "shorter" if above < float(a.sustain_s) else "longer"
            # Whole seconds, or as many places as it takes not to read as the window itself ("180 s, longer
            # than the 180 s").
            places = 0
            while places < 6 and Fraction(f"{above:.{places}f}") == a.sustain_s:
                places += 1
            shown = f"{above:.{places}f}"
            why_min += (
                f". Here the burst stays above what the {_many(base_gpus, 'replica')} the base load needs can carry at "
                f"U_target ({_d(base_capacity)} QPS) for {shown} s, {verdict} than the {_d(a.sustain_s)} s "
                "the autoscaler waits before it even starts a replica"
            )
            if verdict == "longer":
                why_min += (
                    ": a floor sized for the base load plus autoscaling could follow this burst if replicas start "
                    "well within the rest of it; the plan keeps N + k because a replica that fails to start in "
                    "time costs the SLO, while an idle one costs only money"
                )
    out = {
        "model": a.model,
        "deployment": a.deployment,
        "namespace": a.namespace,
        "prometheus_url": a.prometheus_url,
        "adapter_namespace": a.adapter_namespace,
        "min_replicas": total,
        "max_replicas": max_replicas,
        "why_min_replicas": why_min,
        "scale_out_above": _num(a.scale_out_above),
        "scale_in_below": _num(a.scale_in_below),
        "sustain_s": _num(a.sustain_s),
        "metric": {
            "name": METRIC_NAME,
            "per_pod": f'sum by (namespace, pod) (rate({BUSY_COUNTER}{{model="{a.model}"}}[{RATE_WINDOW}]))',
            "meaning": "seconds per second the pod's model instances spent running batches: its busy ratio",
        },
        "hpa": {
            "target_average_value": _num(a.scale_out_above),
            "scale_up_tolerance": 0,
            "scale_down_tolerance": _num(scale_down_tol),
            "scale_in_below_effective": _num(a.scale_out_above * (1 - scale_down_tol)),
        },
        "keda": {
            "threshold": _num(keda_threshold),
            "scale_out_above_effective": _num(keda_threshold * (1 + HPA_DEFAULT_TOLERANCE)),
            "scale_in_below_effective": _num(keda_threshold * (1 - HPA_DEFAULT_TOLERANCE)),
        },
        "manifests": None,
    }
    return out, burst_out


def _ramp_check(
    batch: BatchTime, lam: Fraction, per_replica_target: Fraction, n_gpu: int, warnings: list[str], dev: str = "GPU"
):
    """The plan against what one replica served within the SLO in the ramp; appends its warnings. `dev`: what the
    plan counts (`plan_unit`: CPUs where the ramp's server ran the model on the CPU)."""
    served = batch.step_qps
    n_ramp = ceil(lam / served)
    step_busy = batch.achieved_qps * batch.t_batch_s / batch.batch_size
    cross = {
        "max_qps_under_slo": _num(served),
        "replicas_at_measured_max": n_ramp,
        "utilization_at_step": float(step_busy),
    }
    step = _step(
        "cross-check",
        "⌈λ_peak / max QPS under the SLO of one replica⌉",
        f"⌈{_d(lam)} / {_d(served)}⌉",
        Fraction(n_ramp),
        f"{dev}s",
    )
    if served < per_replica_target:
        # N's rounding up can leave each replica no more at the peak than the ramp saw it serve: then the two agree.
        sized = (
            f"would take {_many(n_ramp, dev)}, not {n_gpu}"
            if n_ramp != n_gpu
            else f"takes the same {_many(n_ramp, dev)} ({_d(lam)} / {n_gpu} = {decimal_text(lam / n_gpu, 1)} QPS "
            "each at the peak)"
        )
        warnings.append(
            f"one replica met the SLO only up to {_d(served)} QPS in the ramp, below the "
            f"{decimal_text(per_replica_target, 1)} QPS per replica this plan puts on it at U_target (its "
            f"batches kept the instance only {100 * float(step_busy):.0f}% busy there): something besides "
            f"the batch time limits it (CPU, the event loop, the network), and sizing by the ramp {sized}"
        )
    if batch.detail.get("highest_step"):
        warnings.append(
            f"every step of the ramp met the SLO, so one replica can carry more than {_d(served)} QPS: "
            f"the cross-check's {_many(n_ramp, dev)} is an upper bound, and the step's batches may be smaller "
            "than at a replica's planned load"
        )
    flushes = batch.detail.get("flush_reasons") or {}
    if flushes and flushes.get("size", 0) < 0.5 * sum(flushes.values()):
        warnings.append(
            f"at the chosen step most batches left on the queue delay, not full (mean "
            f"{decimal_text(batch.batch_size, 2)} requests): n grows with load, so at a replica's planned load its "
            "batches may be bigger and T_batch / n smaller than measured; on that count the plan errs towards "
            f"more {dev}s"
        )
    return cross, step


def _round_up(x: Fraction, places: int) -> Fraction:
    scale = 10**places
    return Fraction(ceil(x * scale), scale)


def _tolerance_for(scale_in_below: Fraction, target: Fraction) -> Fraction:
    """The HPA scale-down tolerance t with target·(1 − t) ≤ scale_in_below, t rounded up to 4 places."""
    return _round_up(1 - scale_in_below / target, 4)


# ---------------------------------------------------------------------------- manifests


def _quantity(x: Fraction | float | int) -> str:
    """A Kubernetes quantity: plain decimal text."""
    x = exact(Decimal(repr(x)) if isinstance(x, float) else x, "quantity")
    return decimal_text(x, 9).rstrip("…")


def _behavior(window_s: int, tolerances: tuple | None) -> dict:
    """HPA behavior: both stabilization windows = the sustain time; scale up by up to 100% or 4 pods a
    minute (Kubernetes' default, written out), down by 1 pod a minute; tolerances (up, down) if given."""
    rules = {}
    for i, (direction, policies) in enumerate(
        (
            (
                "scaleUp",
                [
                    {"type": "Percent", "value": 100, "periodSeconds": 60},
                    {"type": "Pods", "value": 4, "periodSeconds": 60},
                ],
            ),
            ("scaleDown", [{"type": "Pods", "value": 1, "periodSeconds": 60}]),
        )
    ):
        rule = {"stabilizationWindowSeconds": window_s}
        if tolerances is not None:
            rule["tolerance"] = _quantity(tolerances[i])
        rules[direction] = {**rule, "selectPolicy": "Max", "policies": policies}
    return rules


# The characters Kubernetes draws a generated name from (k8s.io/apimachinery's rand.String, and
# SafeEncodeString for the pod template hash): no vowels, no 0, 1 or 3, so that no word is spelt.
_GENERATED_CHARS = "[bcdfghjklmnpqrstvwxz2456789]"
# The API server cuts a generateName prefix to 58 characters, the 63 of a name less the 5 it adds.
_GENERATE_PREFIX_MAX = 58


def pod_name_regex(deployment: str) -> str:
    """A regex (RE2, which Prometheus anchors at both ends) that matches the names of `deployment`'s
    pods and not those of another Deployment named `deployment`-something: `deployment-.*` took in
    a canary `wok-canary`'s pods (wok-canary-7d4b9c8f6-x2x9z) and summed their busy time into this
    Deployment's. Its ReplicaSet is `deployment`-HASH, HASH the pod template's FNV-32a in decimal
    with each digit mapped to one of the generated characters (1 to 10 of them, never a '-'), and
    it asks for pods named `deployment`-HASH- plus 5 generated characters, the prefix cut to 58
    characters first: a Deployment's name over 46 characters loses the end of that prefix."""
    prefix = f"{deployment}-"
    room = _GENERATE_PREFIX_MAX - len(prefix)  # what the cut leaves of HASH and the '-' after it
    c = _GENERATED_CHARS
    if room >= 11:
        middle = f"{c}{{1,10}}-"
    elif room >= 2:  # a HASH short enough keeps its '-'; a longer one is cut to `room` characters
        middle = f"(?:{c}{{1,{room - 1}}}-|{c}{{{room}}})"
    elif room == 1:
        middle = c
    else:
        prefix, middle = prefix[:_GENERATE_PREFIX_MAX], ""
    return f"{prefix}{middle}{c}{{5}}"


def manifests(plan: dict) -> dict[str, list[dict]]:
    """The Kubernetes objects of the autoscaling policy, by file name.

    hpa.yaml: an autoscaling/v2 HorizontalPodAutoscaler on the per-pod busy ratio, served by the
    Prometheus adapter with the rules of prometheus-adapter-rules.yaml. keda-scaledobject.yaml:
    the same policy through KEDA's Prometheus scaler. Apply one of the two, not both: each
    makes an HPA for the same Deployment, and two HPAs on one target fight.
    """
    a = plan["autoscaling"]
    window = int(a["sustain_s"])
    labels = {"app.kubernetes.io/name": "wok", "app.kubernetes.io/component": "autoscaling"}
    target = {"apiVersion": "apps/v1", "kind": "Deployment", "name": a["deployment"]}

    def scaler(api_version: str, kind: str, replicas: tuple[str, str], **spec) -> dict:
        low, high = replicas
        return {
            "apiVersion": api_version,
            "kind": kind,
            "metadata": {"name": a["deployment"], "namespace": a["namespace"], "labels": labels},
            "spec": {"scaleTargetRef": target, low: a["min_replicas"], high: a["max_replicas"], **spec},
        }

    hpa = scaler(
        "autoscaling/v2",
        "HorizontalPodAutoscaler",
        ("minReplicas", "maxReplicas"),
        metrics=[
            {
                "type": "Pods",
                "pods": {
                    "metric": {"name": METRIC_NAME},
                    "target": {"type": "AverageValue", "averageValue": _quantity(a["hpa"]["target_average_value"])},
                },
            }
        ],
        behavior=_behavior(window, (a["hpa"]["scale_up_tolerance"], a["hpa"]["scale_down_tolerance"])),
    )
    model = a["model"]
    adapter_config = {
        "rules": [
            {
                "seriesQuery": f'{BUSY_COUNTER}{{namespace!="",pod!="",model="{model}"}}',
                "resources": {"overrides": {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}},
                "name": {"matches": f"^{BUSY_COUNTER}$", "as": METRIC_NAME},
                "metricsQuery": (
                    f'sum by (<<.GroupBy>>) (rate(<<.Series>>{{<<.LabelMatchers>>,model="{model}"}}[{RATE_WINDOW}]))'
                ),
            }
        ]
    }
    adapter = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "prometheus-adapter", "namespace": a["adapter_namespace"], "labels": labels},
        "data": {"config.yaml": yaml.safe_dump(adapter_config, sort_keys=False, width=1000)},
    }
    keda_query = (
        f'sum(rate({BUSY_COUNTER}{{namespace="{a["namespace"]}",pod=~"{pod_name_regex(a["deployment"])}",'
        f'model="{model}"}}[{RATE_WINDOW}]))'
    )
    scaled = scaler(
        "keda.sh/v1alpha1",
        "ScaledObject",
        ("minReplicaCount", "maxReplicaCount"),
        pollingInterval=15,
        # No per-direction tolerance: the KEDA CRD this is checked against predates it.
        advanced={"horizontalPodAutoscalerConfig": {"behavior": _behavior(window, None)}},
        triggers=[
            {
                "type": "prometheus",
                "name": "busy-ratio",
                "metricType": "AverageValue",
                "metadata": {
                    "serverAddress": a["prometheus_url"],
                    "query": keda_query,
                    "threshold": _quantity(a["keda"]["threshold"]),
                },
            }
        ],
    )
    return {MANIFEST_FILES[0]: [hpa], MANIFEST_FILES[1]: [adapter], MANIFEST_FILES[2]: [scaled]}


_HEADERS = {
    "hpa.yaml": (
        "HorizontalPodAutoscaler for {deployment}: scale out above {out} busy, in below {inn}, each "
        "sustained {sustain} s.\n# Needs the Prometheus adapter with the rules of prometheus-adapter-rules.yaml. "
        "The per-direction `tolerance`\n# is in the API from Kubernetes 1.33 and takes effect with the "
        "HPAConfigurableTolerance feature gate\n# (beta from 1.35); with the gate off the API server drops it "
        "and the cluster-wide tolerance (10% by\n# default) applies. Older API servers reject the object under "
        "kubectl's default strict field\n# validation: on a cluster older than 1.33 delete the two `tolerance` "
        "lines (the cluster-wide\n# tolerance then applies, as with the gate off) or apply "
        "keda-scaledobject.yaml. Apply this OR\n# keda-scaledobject.yaml, not both."
    ),
    "prometheus-adapter-rules.yaml": "Prometheus adapter rules: the per-pod busy ratio of wok's model instances "
    "as the custom\n# metric {metric}. Merge `rules` into the adapter's config (the Helm chart's "
    "rules.custom)\n# if it already has some.",
    "keda-scaledobject.yaml": "KEDA ScaledObject for {deployment} (KEDA's own HPA, Prometheus scaler). Apply this "
    "OR hpa.yaml.\n# The threshold is set so that KEDA's HPA, with the cluster-wide 10% tolerance, scales out "
    "above {keda_out};\n# it then scales in below {keda_in}, not {inn}: see docs/plan.md.",
}


class _Dumper(yaml.SafeDumper):
    """Safe YAML with multi-line strings (the adapter's embedded config) as literal blocks."""


def _str(dumper: yaml.SafeDumper, text: str):
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style="|" if "\n" in text else None)


_Dumper.add_representer(str, _str)


def to_yaml(docs: list[dict]) -> str:
    return "---\n".join(yaml.dump(d, Dumper=_Dumper, sort_keys=False, width=1000, allow_unicode=True) for d in docs)


def manifests_problem(folder: Path) -> str | None:
    """'folder PARENT does not exist' when `folder` is missing and so is its parent, else None (the
    rest, a parent that is a file, an unwritable one, is mkdir's to report). Only the last level is
    made, as every other output of `wok` needs its folder to exist: a typo in a parent is refused
    rather than made into a tree of folders."""
    folder = Path(folder)
    if not folder.exists() and not folder.parent.exists():
        return f"folder {folder.parent} does not exist"
    return None


def _sync(path: Path) -> None:
    """`path`'s text on disk (a full disk, an NFS server's refusal found now, not after a rename)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_manifests(plan: dict, folder: Path) -> list[Path]:
    """Write the manifests into `folder`, made if missing (its parent must exist: `manifests_problem`);
    returns the paths, and records the names in the plan."""
    folder = Path(folder)
    why = manifests_problem(folder)
    if why:
        # An OSError, as a failed write is: `wok plan` reports it as --manifests's (outputs.writing).
        raise FileNotFoundError(errno.ENOENT, why, str(folder))
    folder.mkdir(exist_ok=True)
    a = plan["autoscaling"]
    fmt = {
        "deployment": a["deployment"],
        "out": a["scale_out_above"],
        "inn": a["scale_in_below"],
        "sustain": a["sustain_s"],
        "metric": a["metric"]["name"],
        "keda_out": a["keda"]["scale_out_above_effective"],
        "keda_in": a["keda"]["scale_in_below_effective"],
    }
    # Every text is made before any file is touched: a value that fails to render leaves them all.
    texts = {
        folder / name: "# " + _HEADERS[name].format(**fmt) + f"\n# Written by `wok plan` ({SCHEMA}).\n" + to_yaml(docs)
        for name, docs in manifests(plan).items()
    }
    paths = list(texts)
    # Whole or not at all, each file and the set: a watcher of the folder (kubectl apply -f, a GitOps
    # agent) never reads half a manifest, nor a new HPA beside the ScaledObject of an earlier plan
    # when a later file fails (a full disk). Every file is written beside its path first (ending in
    # .part, not .yaml, so none reads it) and synced to disk, and only then are they renamed (each
    # `replacing` on leaving the stack): a failure before leaves the earlier set. Only the renames
    # themselves, one after another, can be cut (a crash, Ctrl-C, a rename refused) between files.
    with ExitStack() as renames:
        in_place = []
        for path, text in texts.items():
            where = renames.enter_context(replacing(path, keep_suffix=False))
            if where == path:  # not replaced by a rename (other hard links, not a regular file)
                in_place.append(path)  # written in place, so last: after the others could fail
                continue
            where.write_text(text, encoding="utf-8")
            _sync(where)  # here, not at the rename, where a failure would find earlier files renamed
        for path in in_place:
            path.write_text(texts[path], encoding="utf-8")
    a["manifests"] = [str(p) for p in paths]
    return paths


# ---------------------------------------------------------------------------- views


def to_json(plan: dict) -> str:
    """A plan's JSON text (`outputs.json_text`)."""
    return json_text(plan, allow_nan=False)


def write_json(plan: dict, path: Path) -> None:
    Path(path).write_text(to_json(plan), encoding="utf-8")


def _f(x, places: int = 6) -> str:
    if x is None:
        return "—"
    if isinstance(x, int):
        return str(x)
    return decimal_text(exact(Decimal(repr(x)), "figure"), places)


# Where the unit came from (`inputs.unit_source`), as the inputs table says it.
_UNIT_SOURCES = {
    "ramp": "the ramp's devices",
    "profile": "the profile's config.device",
    "given": "given",
    "default": "default",
}


def _input_rows(plan: dict) -> list[tuple[str, str]]:
    i = plan["inputs"]
    peak, batch = i["peak"], i["batch"]
    rows = [("peak λ", f"{_f(peak['peak_qps'])} QPS ({peak['source']})")]
    if peak.get("burst"):
        b = peak["burst"]
        sigma = "" if b["sigma_s"] is None else f", σ = {_f(b['sigma_s'])} s"
        rows.append(("burst", f"λ_base = {_f(b['base_qps'])} QPS, A = {_f(b['amplitude_qps'])} QPS{sigma}"))
    for t in peak.get("teams") or []:
        rows.append((f"team {t['name']}", f"{_f(t['peak_qps'])} QPS"))
    rows.append(("T_batch", f"{_ms(batch['t_batch_s'])} ({batch['source']})"))
    rows.append(("n (requests per batch)", _f(batch["batch_size"])))
    if batch["source"] != "ramp":  # a ramp's n is the batch its step formed, whatever the window
        rows.append(("window w", f"{_f(1000 * i['max_queue_delay_s'])} ms ({i['max_queue_delay_source']})"))
    if batch["alpha_s"] is not None:
        rows.append(("α, β", f"{_ms(batch['alpha_s'])}, {_ms(batch['beta_s'])} per row"))
    if batch.get("ramp"):
        r = batch["ramp"]
        rows.append(
            (
                "ramp step",
                f"{_f(r['step_offered_qps'])} QPS, the max under the SLO (P99 {_f(r['p99_ms'], 1)} ms ≤ "
                f"{_f(r['slo_p99_ms'])} ms) of {r['path']}" + (f" (on {r['device']})" if r.get("device") else ""),
            )
        )
    if batch.get("profile"):
        device = batch["profile"].get("device")
        rows.append(("profile", batch["profile"]["path"] + (f" (on {device})" if device else "")))
    if batch.get("extrapolation"):
        text = _extrapolation_text(batch["extrapolation"], batch["batch_size"])
        if _fill_below(plan["result"].get("batch_fill"), batch["batch_size"]):
            fill = plan["result"]["batch_fill"]["extrapolation"]
            text += (
                f"; the batches at the peak average as few as {_f(fill['least_mean_batch'], 2)}, below them: "
                "busy bounds extrapolated" + (f" (far: more than {FAR_EXTRAPOLATION}×)" if fill["far"] else "")
            )
        rows.append(("profiled batches", text))
    rows.append(("U_target", _f(i["target_utilization"])))
    rows.append(("redundancy k", str(i["redundancy"])))
    if i.get("unit_source"):  # absent in plans written up to e7bb956
        rows.append(("counts", f"{plan_word(plan)}s ({_UNIT_SOURCES.get(i['unit_source'], i['unit_source'])})"))
    return rows


def _extrapolation_text(e: dict, n) -> str:
    """The inputs row of `inputs.batch.extrapolation`: the profile's range and where n lies against it."""
    least, most = e["smallest_profiled_batch"], e["largest_profiled_batch"]
    text = f"{_f(least)} to {_f(most)}; n = {_f(n)} is "
    if not e["extrapolated"]:
        return text + "within them"
    side = f"past them, {_f(e['ratio'])}× the largest" if n > most else f"below them, the smallest {_f(e['ratio'])}× n"
    return text + side + ": T_batch extrapolated" + (f" (far: more than {FAR_EXTRAPOLATION}×)" if e["far"] else "")


def to_markdown(plan: dict) -> str:
    """The plan as markdown: inputs, each step of the arithmetic, the result, teams, autoscaling, warnings."""
    r, a = plan["result"], plan["autoscaling"]
    dev = plan_word(plan)
    out = [f"# Capacity plan ({plan['schema']}, {plan['created']})", ""]
    out += [
        f"**{_many(r['replicas'], 'replica')}**: N = {_many(r['gpus'], dev)} for the peak at U_target, plus "
        f"k = {r['redundancy']}.",
        "",
    ]
    out += ["## Inputs", "", "| input | value |", "|---|---|"]
    out += [f"| {k} | {v} |" for k, v in _input_rows(plan)]
    out += ["", "## Arithmetic", "", "| step | formula | with the numbers | = | exact |", "|---|---|---|---|---|"]
    for s in plan["steps"]:
        out.append(f"| {s['name']} | {s['formula']} | {s['substituted']} | {_value_unit(s)} | {s['exact']} |")
    out += [
        "",
        f"One replica serves {_f(r['qps_per_replica_full'], 1)} QPS at 100% busy and "
        f"{_f(r['qps_per_replica_at_target'], 1)} QPS at U_target. At the peak the {_many(r['gpus'], dev)} "
        f"{_are(r['gpus'])} "
        f"{_f(100 * r['utilization_at_peak'], 1)}% busy, all {_many(r['replicas'], 'replica')} "
        f"{_f(100 * r['utilization_at_peak_all_replicas'], 1)}%.",
        "",
    ]
    if plan["teams"]:
        t = plan["teams"]
        out += ["## Teams", ""]
        out += [f"| team | peak QPS | share | {dev}s (exact) | own pool ⌈⌉ | quota in the shared fleet |"]
        out += ["|---|---|---|---|---|---|"]
        for row in t["rows"]:
            out.append(
                f"| {row['name']} | {_f(row['peak_qps'])} | {_f(100 * row['share_of_peak'], 1)}% | "
                f"{_f(row['gpus_exact'])} | {row['own_pool_gpus']} | {row['quota_gpus']} |"
            )
        out += [
            "",
            f"Shared fleet: {_many(t['shared_gpus'], dev)} + k = {_many(t['shared_replicas'], 'replica')}. "
            f"Own pools: {_many(t['own_pools_gpus'], dev)}, {_many(t['own_pools_replicas'], 'replica')} with "
            f"k each (rounding costs {_many(t['rounding_overhead_gpus'], dev)}). Rounding: {t['rounding']}.",
            "",
        ]
    if plan["cross_check"]:
        c = plan["cross_check"]
        out += [
            "## Against the ramp",
            "",
            f"The ramp's step at {_f(c['max_qps_under_slo'])} QPS kept the instance "
            f"{_f(100 * c['utilization_at_step'], 1)}% busy; sized by what one replica served within the SLO, "
            f"the peak takes {_many(c['replicas_at_measured_max'], dev)}.",
            "",
        ]
    out += [
        "## Autoscaling",
        "",
        f"Scale out above {_f(a['scale_out_above'])} busy, in below {_f(a['scale_in_below'])}, each sustained "
        f"{_f(a['sustain_s'])} s (the HPA's stabilization windows), between {a['min_replicas']} and "
        f"{a['max_replicas']} replicas of Deployment `{a['deployment']}` in `{a['namespace']}`, on the metric "
        f"`{a['metric']['name']}` = `{a['metric']['per_pod']}`.",
        "",
        f"- HPA: target average {_f(a['hpa']['target_average_value'])}, scale-up tolerance 0, scale-down tolerance "
        f"{_f(a['hpa']['scale_down_tolerance'])} (scale in below {_f(a['hpa']['scale_in_below_effective'])}).",
        f"- KEDA: threshold {_f(a['keda']['threshold'])}; with the default 10% tolerance it scales out above "
        f"{_f(a['keda']['scale_out_above_effective'])} and in below {_f(a['keda']['scale_in_below_effective'])}.",
        f"- Why {a['min_replicas']} at least: {a['why_min_replicas']}.",
    ]
    if a["manifests"]:
        out.append("- Manifests: " + ", ".join(f"`{p}`" for p in a["manifests"]))
    out.append("")
    cpu = [NO_CPU_NOTE] if plan["inputs"]["batch"].get("server_cpu_counted") is False else []
    if plan["warnings"] or cpu:
        out += ["## Warnings", ""] + [f"- {w}" for w in cpu + plan["warnings"]] + [""]
    return "\n".join(out)


def print_table(plan: dict, file=None) -> None:
    """Inputs, the arithmetic and the result as plain-text tables (rich, no colour or markup)."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    file = sys.stdout if file is None else file
    console = Console(file=file, color_system=None, highlight=False, markup=False, emoji=False, width=200)
    r, a = plan["result"], plan["autoscaling"]
    dev = plan_word(plan)
    inputs = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    inputs.add_column("input")
    inputs.add_column("value")
    for k, v in _input_rows(plan):
        inputs.add_row(k, v)
    console.print(inputs)
    steps = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for h, just in (("step", "left"), ("formula", "left"), ("with the numbers", "left"), ("=", "right")):
        steps.add_column(h, justify=just)
    for s in plan["steps"]:
        steps.add_row(s["name"], s["formula"], s["substituted"], _value_unit(s))
    console.print(steps)
    if plan["teams"]:
        t = plan["teams"]
        teams = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
        for h in ("team", "peak QPS", f"{dev}s exact", "own pool", "quota"):
            teams.add_column(h, justify="right")
        for row in t["rows"]:
            cells = (_f(row["peak_qps"]), _f(row["gpus_exact"]), str(row["own_pool_gpus"]), str(row["quota_gpus"]))
            teams.add_row(row["name"], *cells)
        console.print(teams)
        console.print(
            f"teams: shared {_many(t['shared_replicas'], 'replica')}, own pools "
            f"{_many(t['own_pools_replicas'], 'replica')} "
            f"(rounding overhead {_many(t['rounding_overhead_gpus'], dev)})"
        )
    console.print(
        f"plan: N = {_many(r['gpus'], dev)} + k = {r['redundancy']} → {_many(r['replicas'], 'replica')}; autoscale "
        f"{a['min_replicas']}..{a['max_replicas']}, out above {_f(a['scale_out_above'])}, in below "
        f"{_f(a['scale_in_below'])}, sustained {_f(a['sustain_s'])} s"
    )
    # The burst's duration above the base's capacity decides it: shown here, not only in --markdown.
    # ~400 characters: wrapped to a terminal's width, each later line indented under the first.
    why = textwrap.fill(f"why {a['min_replicas']} at least: {a['why_min_replicas']}", 100, subsequent_indent="  ")
    console.print(why, soft_wrap=True)
    if plan["inputs"]["batch"].get("server_cpu_counted") is False:
        console.print(f"WARNING: {NO_CPU_NOTE}", soft_wrap=True)
    for w in plan["warnings"]:
        console.print(f"warning: {w}")
