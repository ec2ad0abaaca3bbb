"""A mergeable latency histogram: log-linear buckets over integer nanoseconds, as HdrHistogram has them.

Two histograms with the same `sub_bucket_bits` merge exactly by adding counts bucket by
bucket, so N bench processes that each saw part of the requests merge into the very
histogram one process would have built from all of them, and into the same percentiles.

Buckets. A latency x (ms) is first rounded up to whole nanoseconds, v: the fewest whose
value in ms, the float v / 10^6, is not below x (`ms_to_ns`). An exact count of nanoseconds
(0.57 ms) is kept as it is; any other goes up, by less than 1 ns. Below 2·2^b (b =
`sub_bucket_bits`) every nanosecond is its own bucket. Above, each power-of-two range
[2^k, 2^(k+1)) is cut into 2^b equal buckets of width 2^(k−b): bucket index
(k − b)·2^b + ⌊v / 2^(k−b)⌋ for k = bit length of v − 1 > b. A bucket's width is at most
2^−b of its lower bound.

Percentiles are nearest-rank, as analysis.latency_summary computes them from samples:
the ⌈p·n⌉-th smallest latency, read off the cumulative counts as the upper bound of the
bucket that holds it, clamped to the exact maximum. So the value is never below the true
nearest-rank percentile and at most 2^−b above it (0.78% for the default b = 7), and it
keeps the SLO reading: at least p of the requests finished within it. Count, sum, min
and max are kept exactly (of the whole nanoseconds v), so the mean and max are exact too, to
within 1 ns above.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from fractions import Fraction

import numpy as np

SUB_BUCKET_BITS = 7
NS_PER_MS = 1_000_000
QUANTILES = {"p50": (1, 2), "p90": (9, 10), "p95": (19, 20), "p99": (99, 100), "p999": (999, 1000)}
KEYS = ("mean", "p50", "p90", "p95", "p99", "p999", "max")
# Below 2^53 ns (104 days) the float product x · 10^6 is within 1 of v and v ± 1 are exact floats; past it
# `ms_to_ns` works in integers. Nanoseconds are int64: past 2^63 − 1 ns (292 years) a latency is refused.
_FLOAT_EXACT_NS = 2.0**53
MAX_NS = 2**63 - 1


def relative_error(sub_bucket_bits: int = SUB_BUCKET_BITS) -> float:
    """The most a percentile read from the histogram exceeds the exact one, relative to it."""
    return 2.0**-sub_bucket_bits


def ms_to_ns(ms: np.ndarray) -> np.ndarray:
    """Each latency x in ms (finite, >= 0) as v, the fewest whole nanoseconds with float(v / 10^6) >= x.

    Flooring x · 10^6 put values 1 ns low: 0.000249 ms is 248.99999999999997 ns in floats. Rounding
    up puts whole ones 1 ns high: 0.000123 ms is 123.00000000000001 ns in floats, and the float
    0.001, exactly, a shade above 1000 ns.
    What the histogram hands back is v / 10^6 in floats, compared with the samples' own floats, so
    that is the test: from the float product's floor (within 1 of v), one step up where its ms
    fall short of x, then one down where the nanosecond below is enough too. That holds while the product
    is below 2^53; past it (104 days) the float steps of v are 2 ns or more, and v is worked out in integers
    (`_ns_in_integers`). Raises ValueError for a latency past `MAX_NS`, which int64 nanoseconds cannot hold."""
    a = np.asarray(ms, dtype=np.float64)
    with np.errstate(over="ignore"):  # a product past a float's range is taken in integers below
        product = a * NS_PER_MS
    v = np.floor(product)
    v = np.where(v / NS_PER_MS < a, v + 1, v)
    v = np.where((v >= 1) & ((v - 1) / NS_PER_MS >= a), v - 1, v)
    big = product >= _FLOAT_EXACT_NS
    if not big.any():
        return v.astype(np.int64)
    ns = np.where(big, 0, v).astype(np.int64)
    ns[big] = [_ns_in_integers(x) for x in a[big].tolist()]
    return ns


def _ns_in_integers(x: float) -> int:
    """`ms_to_ns` of one latency past 2^53 ns, exactly. The float v / 10^6 is not below x for every v above
    m · 10^6, m halfway from the float below x to x (and at m itself, where m rounds to x), and for no v
    below: so v is ⌈m · 10^6⌉, or one more where that is m · 10^6 and rounds down. Python's int / int is
    correctly rounded, as the histogram's own ns / NS_PER_MS that hands v back."""
    m = (Fraction(x) + Fraction(math.nextafter(x, 0.0))) / 2
    v = math.ceil(m * NS_PER_MS)
    if v / NS_PER_MS < x:
        v += 1
    if v > MAX_NS:
        raise ValueError(
            f"latency {x!r} ms: expected at most 2^63 − 1 ns ({MAX_NS / NS_PER_MS:.6f} ms, 292 years), what the "
            "histogram's int64 nanoseconds hold"
        )
    return v


def bucket_index(ns: np.ndarray, bits: int = SUB_BUCKET_BITS) -> np.ndarray:
    """Bucket of each non-negative integer nanosecond value (vectorized)."""
    v = np.asarray(ns, dtype=np.int64)
    if v.size and v.min() < 0:
        raise ValueError(f"latencies: expected nanoseconds >= 0; got {int(v.min())}")
    k = np.zeros(v.shape, dtype=np.int64)
    big = v >= (2 << bits)
    if big.any():
        # Bit length − 1 of each value, in integers (floats would misplace values near 2^53).
        vb = v[big]
        kb = np.zeros(vb.shape, dtype=np.int64)
        for shift in (32, 16, 8, 4, 2, 1):
            over = (vb >> (kb + shift)) > 0
            kb += np.where(over, shift, 0)
        k[big] = kb
    shift = np.where(big, k - bits, 0)
    return np.where(big, (k - bits) * (1 << bits) + (v >> shift), v)


def bucket_bounds(index: int, bits: int = SUB_BUCKET_BITS) -> tuple[int, int]:
    """[lower, upper) of bucket `index`, in nanoseconds."""
    index = int(index)
    if index < (2 << bits):
        return index, index + 1
    k = index // (1 << bits) + bits - 1  # the power of two the bucket lies in, 2^k
    shift = k - bits
    sub = index - (k - bits) * (1 << bits)  # v >> shift, in [2^b, 2^(b+1))
    return sub << shift, (sub + 1) << shift


class LatencyHistogram:
    """Counts per log-linear bucket of nanosecond latencies, with exact count, sum, min and max."""

    def __init__(self, sub_bucket_bits: int = SUB_BUCKET_BITS) -> None:
        if not 1 <= sub_bucket_bits <= 16:
            raise ValueError(f"sub_bucket_bits: expected an integer from 1 to 16; got {sub_bucket_bits}")
        self.bits = sub_bucket_bits
        self.counts: dict[int, int] = {}
        self.count = 0
        self.sum_ns = 0
        self.min_ns: int | None = None
        self.max_ns: int | None = None

    @classmethod
    def from_ms(cls, ms: Iterable[float], sub_bucket_bits: int = SUB_BUCKET_BITS) -> LatencyHistogram:
        h = cls(sub_bucket_bits)
        h.record_ms(ms)
        return h

    def record_ms(self, ms: Iterable[float]) -> None:
        """Add latencies given in milliseconds; non-finite ones are left out (they have no latency)."""
        a = np.asarray(ms, dtype=np.float64).ravel()
        a = a[np.isfinite(a)]
        if a.size == 0:
            return
        ns = ms_to_ns(np.maximum(a, 0.0))
        idx, n = np.unique(bucket_index(ns, self.bits), return_counts=True)
        for i, c in zip(idx.tolist(), n.tolist()):
            self.counts[i] = self.counts.get(i, 0) + c
        self.count += int(ns.size)
        lo, hi = int(ns.min()), int(ns.max())
        # In Python's integers where an int64 sum could wrap (latencies of days, or very many of hours).
        self.sum_ns += int(ns.sum(dtype=np.int64)) if hi <= MAX_NS // ns.size else sum(ns.tolist())
        self.min_ns = lo if self.min_ns is None else min(self.min_ns, lo)
        self.max_ns = hi if self.max_ns is None else max(self.max_ns, hi)

    def merge(self, other: LatencyHistogram) -> LatencyHistogram:
        """Add `other` into this one (same bucket layout required); returns self."""
        if other.bits != self.bits:
            raise ValueError(f"cannot merge histograms of {self.bits} and {other.bits} sub-bucket bits")
        for i, c in other.counts.items():
            self.counts[i] = self.counts.get(i, 0) + c
        self.count += other.count
        self.sum_ns += other.sum_ns
        for attr, pick in (("min_ns", min), ("max_ns", max)):
            mine, theirs = getattr(self, attr), getattr(other, attr)
            setattr(self, attr, theirs if mine is None else mine if theirs is None else pick(mine, theirs))
        return self

    def quantile_ms(self, num: int, den: int) -> float:
        """Nearest-rank quantile num/den: upper bound of the bucket of the ⌈num·n/den⌉-th latency, ≤ max."""
        return self.quantile_bounds_ms(num, den)[1]

    def quantile_bounds_ms(self, num: int, den: int) -> tuple[float, float]:
        """Where the exact nearest-rank quantile num/den lies: (the lower bound of the bucket of the
        ⌈num·n/den⌉-th latency, at least min; `quantile_ms`, its upper bound, at most max). NaNs when empty."""
        if self.count == 0:
            return float("nan"), float("nan")
        rank = min(max(-(-num * self.count // den), 1), self.count)
        seen = 0
        for i in sorted(self.counts):
            seen += self.counts[i]
            if seen >= rank:
                lower, upper = bucket_bounds(i, self.bits)
                return max(lower, self.min_ns) / NS_PER_MS, min(upper, self.max_ns) / NS_PER_MS
        raise AssertionError("bucket counts add up to less than count")

    def summary(self) -> dict[str, float]:
        """Mean, percentiles and max in ms, keyed as the schema's `latency_ms`; all NaN when empty."""
        if self.count == 0:
            return dict.fromkeys(KEYS, float("nan"))
        out = {"mean": self.sum_ns / self.count / NS_PER_MS}
        for key, (num, den) in QUANTILES.items():
            out[key] = self.quantile_ms(num, den)
        out["max"] = self.max_ns / NS_PER_MS
        return out

    def values_ms(self) -> np.ndarray:
        """The recorded latencies as far as the buckets know them: each bucket's midpoint, as many
        times as it counted (sorted; within `relative_error` of the true values)."""
        idx = sorted(self.counts)
        mids = [(sum(bucket_bounds(i, self.bits)) / 2) / NS_PER_MS for i in idx]
        return np.repeat(np.asarray(mids, dtype=np.float64), [self.counts[i] for i in idx])

    def to_dict(self) -> dict:
        """The JSON form: layout, exact totals, and the non-empty buckets in increasing order."""
        idx = sorted(self.counts)
        return {
            "unit": "ns",
            "sub_bucket_bits": self.bits,
            "relative_error": relative_error(self.bits),
            "count": self.count,
            "sum_ns": self.sum_ns,
            "min_ns": self.min_ns,
            "max_ns": self.max_ns,
            "buckets": idx,
            "counts": [self.counts[i] for i in idx],
        }

    @classmethod
    def from_dict(cls, d: dict) -> LatencyHistogram:
        if not isinstance(d, dict) or d.get("unit") != "ns":
            # Imported here, on a refusal only: importing this module loads nothing of wok's (nor grpc, which
            # wok.errors loads). The unit was shown as repr shows it: a missing one and a null both None.
            from ..errors import shown_data, shown_entry

            if not isinstance(d, dict):  # d.get's AttributeError, which merge_results let through as a traceback
                raise ValueError(f"histogram: expected a JSON object; got {shown_data(d)}")
            raise ValueError(f"histogram unit: expected 'ns'; got {shown_entry(d, 'unit')}")
        h = cls(int(d["sub_bucket_bits"]))
        if len(d["buckets"]) != len(d["counts"]):
            raise ValueError("histogram buckets and counts differ in length")
        for i, c in zip(d["buckets"], d["counts"]):
            if int(c) < 0:
                raise ValueError(f"negative count {c} in bucket {i}")
            h.counts[int(i)] = h.counts.get(int(i), 0) + int(c)
        h.count = int(d["count"])
        if sum(h.counts.values()) != h.count:
            raise ValueError(f"histogram counts add up to {sum(h.counts.values())}, not its count {h.count}")
        h.sum_ns = int(d["sum_ns"])
        h.min_ns = None if d["min_ns"] is None else int(d["min_ns"])
        h.max_ns = None if d["max_ns"] is None else int(d["max_ns"])
        return h
