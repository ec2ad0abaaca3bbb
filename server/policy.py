"""The `slo` batching policy: flush decisions from deadlines and a learned batch-time model.

The batcher (server/batcher.py) consults a `SloPolicy` in `_pick` when a model's config says
`dynamic_batching.policy = "slo"`; the `fixed` policy (a delay window) needs no object. The
rules, with T_q(n) the predicted execution time of a batch of n samples (the fit plus a high
quantile of its residuals), m the measured hop margin, and, for one batch key's queue holding
n samples (at most max_batch_size) whose earliest deadline is D:

- **deadline**: the queue flushes as soon as now ≥ D − T_q(n) − m, the latest start that still
  lets its most pressed request finish in time; waiting any longer would make it miss.
- **idle**: with an instance idle, the queue flushes at once when n ≥ λ·α (λ the key's arrival
  rate in samples/s, α the fit's fixed cost per batch). Waiting Δ more and then running
  n + λΔ samples costs (Δ + α)/(n + λΔ) + β instance-seconds per sample against α/n + β for
  running n now (idle time counted as spent); the first is smaller exactly when λα > n, for
  every Δ. So when n ≥ λα waiting cannot raise throughput, and below it the queue keeps
  filling (until the deadline rule or a full batch sends it). Reaching λα from n takes
  α − n/λ < α on average: the rule never waits longer than one batch's fixed cost for a
  better batch.
- otherwise it keeps filling; a full queue (max_batch_size samples) flushes as with `fixed`.

Admission (at arrival): a request whose predicted finish, were it to run as soon as the queue
ahead of it (requests of its priority or more urgent, packed into full batches, each on the
instance predicted free first; `nth_start`) has run, is past its deadline is refused
(`DeadlineUnmeetable`); the retry-after hint is by how much it would miss, the time the queue
ahead needs to drain that far. A request
that finds the model idle (nothing running or queued) is let through unchecked, a probe: a
refusal teaches the model nothing, so without probes estimates inflated by a slow spell of the
machine would refuse every request for good.

The margin m is measured: the quantile of the hop (loop → worker thread at dispatch, worker →
loop at completion, on batches sent to an idle instance) plus the quantile of how late the
batcher's timer wakes up.

Everything here is O(1) per request and per batch (admission: O(K log K) for K instances),
except the quantiles, which are recomputed over a window of recent values every few additions.
"""

from __future__ import annotations

import itertools
import json
import math
import sys
from collections.abc import Hashable, Iterable, Sequence
from pathlib import Path

import numpy as np

from .errors import shown_data, shown_entry

PROFILE_SCHEMA = "wok.profile/1"
# Batch keys whose fits and arrival rates are kept per model. The default key is the shape of a
# request's variable dims, which clients choose: without a bound every new shape would add state
# for good. The least recently seen key goes first (it falls back to the model-wide fit, and its
# rate had decayed); a key with requests queued was seen recently.
MAX_TRACKED_KEYS = 4096


def _recent(table: dict, key: Hashable, make) -> tuple[object, Hashable | None]:
    """table[key] (made if absent), moved last: the dict runs from least to most recently seen.
    A new key beyond MAX_TRACKED_KEYS evicts the least recent; returns (value, evicted key or None)."""
    value = table.pop(key, None)
    evicted = None
    if value is None:
        value = make()
        if len(table) >= MAX_TRACKED_KEYS:
            evicted = next(iter(table))
            del table[evicted]
    table[key] = value
    return value, evicted


def read_profile_fit(path: Path) -> tuple[float, float]:
    """(α, β) in seconds from a `wok profile --json` document (docs/profile.md); ValueError if unreadable."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read profile {path}: {exc}") from None
    if not isinstance(doc, dict):
        # Its type's name was shown as though it were the schema written: got 'list'.
        raise ValueError(f"profile {path}: expected a JSON object of schema {PROFILE_SCHEMA!r}; got {shown_data(doc)}")
    if doc.get("schema") != PROFILE_SCHEMA:
        raise ValueError(f"profile {path}: expected schema {PROFILE_SCHEMA!r}; got {shown_entry(doc, 'schema')}")
    try:
        alpha, beta = doc["fit"]["alpha_s"], doc["fit"]["beta_s"]
    except (KeyError, TypeError) as exc:
        raise ValueError(f"profile {path}: no numeric fit.alpha_s and fit.beta_s ({exc!r})") from None
    # JSON numbers only: a quoted "0.001" is a document `wok profile` did not write.
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (alpha, beta)):
        raise ValueError(
            f"profile {path}: fit.alpha_s and fit.beta_s: expected numbers; "
            f"got {shown_data(alpha)} and {shown_data(beta)}"
        )
    # Shown as the file writes them (they were Python's nan and inf); an integer past a float's range is no finite
    # number either: float() raised OverflowError on it, which the config's check (of a ValueError) let through.
    if not all(math.isfinite(v) if isinstance(v, float) else abs(v) <= sys.float_info.max for v in (alpha, beta)):
        raise ValueError(
            f"profile {path}: fit.alpha_s and fit.beta_s: expected finite numbers; "
            f"got {shown_data(alpha)} and {shown_data(beta)}"
        )
    alpha, beta = float(alpha), float(beta)
    # A fitted α can come out slightly below 0 (noise at small n), as wok tune also clamps.
    return max(alpha, 0.0), max(beta, 0.0)


def nth_start(free: Sequence[float], k: int, step: float) -> float:
    """When the batch after k others starts, each batch `step` long, on instances free at `free`,
    each batch run on the instance free first: the k-th smallest (from 0) of the starts
    {f + j·step : f in free, j ≥ 0}.

    O(K log K) for K instances, whatever k is (it runs per request, and k can be large).
    """
    f = sorted(free)
    if step <= 0 or k <= 0:
        return f[0]

    def before(p: int) -> list[int]:
        # Per instance among the p free first: its starts before the p-th one is free.
        c = f[p - 1]
        return [math.ceil((c - x) / step) for x in f[:p]]

    # The instances free after the answer take no batch; with the p free first, the starts
    # before the p-th is free are n(p), growing with p: p is the largest with n(p) ≤ k.
    lo, hi = 1, len(f)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if sum(before(mid)) <= k:
            lo = mid
        else:
            hi = mid - 1
    counts = before(lo)
    # Past the p-th free time, each of the p instances is next free within one step of it, in
    # an order that then repeats every step: whole rounds of p batches, then the rest in order.
    next_free = sorted(x + n * step for x, n in zip(f[:lo], counts))
    rounds, rest = divmod(k - sum(counts), lo)
    return next_free[rest] + rounds * step


class QuantileWindow:
    """The q-quantile of the last `size` values, recomputed every `refresh` additions."""

    __slots__ = ("filled", "pos", "q", "refresh", "since", "value", "values")

    def __init__(self, q: float, size: int = 256, refresh: int = 8, initial: float = 0.0) -> None:
        self.q = q
        self.values = np.zeros(size)
        self.filled = 0
        self.pos = 0
        self.refresh = refresh
        self.since = 0
        self.value = initial

    def add(self, x: float) -> None:
        self.values[self.pos] = x
        self.pos = (self.pos + 1) % len(self.values)
        self.filled = min(self.filled + 1, len(self.values))
        self.since += 1
        if self.since >= self.refresh or self.filled < self.refresh:
            self.since = 0
            self.value = float(np.quantile(self.values[: self.filled], self.q))


class _Fit:
    """Exponentially weighted least squares of t = α + β·n: the weighted sums, decayed per observation."""

    __slots__ = ("count", "n", "nn", "nt", "t", "w")

    def __init__(self) -> None:
        self.w = self.n = self.nn = self.t = self.nt = 0.0
        self.count = 0

    def add(self, n: float, t: float, decay: float, weight: float = 1.0) -> None:
        self.w = self.w * decay + weight
        self.n = self.n * decay + weight * n
        self.nn = self.nn * decay + weight * n * n
        self.t = self.t * decay + weight * t
        self.nt = self.nt * decay + weight * n * t
        self.count += 1

    def solve(self, beta_fallback: float) -> tuple[float, float]:
        mean_n, mean_t = self.n / self.w, self.t / self.w
        var_n = self.nn / self.w - mean_n * mean_n
        if var_n <= 1e-9 * max(1.0, mean_n * mean_n):
            # One batch size only: β is not identifiable; keep the one known, fit α to the mean.
            beta = beta_fallback
        else:
            beta = (self.nt / self.w - mean_n * mean_t) / var_n
        beta = max(beta, 0.0)
        return max(mean_t - beta * mean_n, 0.0), beta


class BatchTimeModel:
    """Batch execution time by batch size, per batch key, learned online.

    Per key (and over all keys together, for keys with few batches yet): an exponentially
    weighted least-squares fit T(n) = α + β·n, each batch weighing `decay` times less than the
    next (a memory of about 1/(1 − decay) batches), and the `quantile` of the last `window`
    residuals (observed − fitted before the observation, counted once the fit has
    `min_batches` batches). `predict` is α + β·n + that quantile (≥ 0):
    a time most batches finish within, not the mean. A seed (α, β from `wok profile`) enters
    as `prior_weight` pseudo-batches at n = 1 and at n = max_batch_size until the key has
    `min_batches` batches of its own, then leaves the fit (a wrong seed is forgotten at once);
    without one, and before any batch, the prediction is 0.
    """

    def __init__(
        self,
        max_batch_size: int,
        *,
        quantile: float = 0.95,
        seed: tuple[float, float] | None = None,
        decay: float = 0.995,
        window: int = 256,
        min_batches: int = 16,
        prior_weight: float = 4.0,
    ) -> None:
        if not 0.5 <= quantile < 1.0:
            raise ValueError(f"quantile: expected a value in [0.5, 1); got {quantile}")
        self.max_batch_size = max_batch_size
        self.quantile = quantile
        self.decay = decay
        self.window = window
        self.min_batches = min_batches
        self.seed = seed
        self.prior_weight = prior_weight
        self._prior = _Fit()
        if seed is not None:
            a, b = seed
            self._prior.add(1.0, a + b, 1.0, prior_weight / 2)
            self._prior.add(float(max_batch_size), a + b * max_batch_size, 1.0, prior_weight / 2)
        self._all = _Fit()
        self._all_resid = QuantileWindow(quantile, window)
        self._keys: dict[Hashable, tuple[_Fit, QuantileWindow]] = {}
        self._coef: dict[Hashable, tuple[float, float, float]] = {}  # key -> (α, β, residual quantile)
        self._coef_all = self._solve(self._all, self._all_resid)

    def _solve(self, fit: _Fit, resid: QuantileWindow) -> tuple[float, float, float]:
        if fit.count < self.min_batches and self._prior.w > 0:  # the seed's pseudo-batches count too
            both = _Fit()
            for name in ("w", "n", "nn", "t", "nt"):
                setattr(both, name, getattr(fit, name) + getattr(self._prior, name))
            fit = both
        if fit.w <= 0:
            return 0.0, 0.0, 0.0
        fallback = self.seed[1] if self.seed is not None else 0.0
        alpha, beta = fit.solve(fallback)
        return alpha, beta, max(resid.value, 0.0) if resid.filled else 0.0

    def observe(self, key: Hashable, n: int, seconds: float) -> None:
        """One executed batch of n samples that took `seconds` (the worker's time)."""
        (fit, resid), evicted = _recent(self._keys, key, lambda: (_Fit(), QuantileWindow(self.quantile, self.window)))
        if evicted is not None:
            self._coef.pop(evicted, None)
        # Residuals count once a fit has `min_batches` batches: before, its line is still moving.
        if fit.count >= self.min_batches:
            a, b, _ = self._coef[key]
            resid.add(seconds - (a + b * n))
        fit.add(float(n), seconds, self.decay)
        self._coef[key] = self._solve(fit, resid)
        if self._all.count >= self.min_batches:
            a, b, _ = self._coef_all
            self._all_resid.add(seconds - (a + b * n))
        self._all.add(float(n), seconds, self.decay)
        self._coef_all = self._solve(self._all, self._all_resid)

    def coefficients(self, key: Hashable) -> tuple[float, float, float]:
        """(α, β, residual quantile) in seconds for `key`: its own fit once it has `min_batches` batches."""
        entry = self._keys.get(key)
        if entry is not None and entry[0].count >= self.min_batches:
            return self._coef[key]
        return self._coef_all

    def predict(self, key: Hashable, n: int) -> float:
        a, b, q = self.coefficients(key)
        return max(a + b * n + q, 0.0)

    def mean(self, key: Hashable, n: int) -> float:
        a, b, _ = self.coefficients(key)
        return a + b * n

    def batches(self, key: Hashable | None = None) -> int:
        if key is None:
            return self._all.count
        entry = self._keys.get(key)
        return 0 if entry is None else entry[0].count


class RateMeter:
    """Arrival rate (samples/s) with an exponential memory of `tau_s`: each sample counts 1/τ, decaying."""

    __slots__ = ("at", "tau", "value")

    def __init__(self, tau_s: float) -> None:
        self.tau = tau_s
        self.value = 0.0
        self.at = 0.0

    def add(self, now: float, samples: int) -> None:
        self.value = self.rate(now) + samples / self.tau
        self.at = now

    def rate(self, now: float) -> float:
        dt = now - self.at
        return self.value * math.exp(-dt / self.tau) if dt > 0 else self.value


class SloPolicy:
    """The `slo` policy's state for one model: batch times, arrival rates, the hop margin."""

    name = "slo"

    def __init__(
        self,
        slo_s: float,
        max_batch_size: int,
        instances: int = 1,
        *,
        quantile: float = 0.95,
        seed: tuple[float, float] | None = None,
        rate_tau_s: float = 0.1,
        initial_margin_s: float = 0.5e-3,
    ) -> None:
        if not slo_s > 0:
            raise ValueError(f"the slo policy needs an SLO > 0; got {slo_s}")
        self.slo_s = slo_s
        self.max_batch_size = max_batch_size
        self.instances = max(1, instances)
        self.times = BatchTimeModel(max_batch_size, quantile=quantile, seed=seed)
        self.rate_tau_s = rate_tau_s
        self._rates: dict[Hashable, RateMeter] = {}
        # The hop: loop → worker thread at dispatch plus worker → loop at completion, measured
        # on batches sent to an idle instance; and how late the batcher's timer wakes it. The
        # sum of their quantiles is the margin every rule keeps.
        self.hop = QuantileWindow(quantile, 256, initial=initial_margin_s)
        self.late = QuantileWindow(quantile, 256)

    @property
    def margin(self) -> float:
        return max(self.hop.value, 0.0) + max(self.late.value, 0.0)

    # -- arrivals ---------------------------------------------------------------------------
    def arrived(self, key: Hashable, now: float, rows: int) -> None:
        meter, _ = _recent(self._rates, key, lambda: RateMeter(self.rate_tau_s))
        meter.add(now, rows)

    def tracked(self) -> Iterable[Hashable]:
        """The keys a fit or an arrival rate is kept of (the batcher keeps those keys: Batcher._sweep_keys)."""
        return itertools.chain(self._rates, self.times._keys)

    def rate(self, key: Hashable, now: float) -> float:
        meter = self._rates.get(key)
        return 0.0 if meter is None else meter.rate(now)

    # -- the flush rules ------------------------------------------------------------------------
    def latest_start(self, key: Hashable, deadline: float, n: int) -> float:
        """The last moment a batch of n (capped at the maximum) may start and still finish by `deadline`."""
        return deadline - self.times.predict(key, min(n, self.max_batch_size)) - self.margin

    def idle_target(self, key: Hashable, now: float) -> float:
        """Samples at which an idle instance gains nothing by waiting: λ·α (at most max_batch_size)."""
        alpha = self.times.coefficients(key)[0]
        return min(self.rate(key, now) * alpha, float(self.max_batch_size))

    def idle_flush_at(self, key: Hashable, n: int, now: float) -> float:
        """When, with no arrival, λ(t)·α decays to n (so the idle rule flushes n); inf if never needed."""
        alpha = self.times.coefficients(key)[0]
        target = self.rate(key, now) * alpha
        if n <= 0:
            return math.inf
        if target <= n:
            return now
        return now + self.rate_tau_s * math.log(target / n)

    # -- admission ----------------------------------------------------------------------------
    def finish_estimate(
        self,
        key: Hashable,
        free: float | Sequence[float],
        ahead: int,
        rows: int,
        size: int | None = None,
        pack: int | None = None,
    ) -> float:
        """Predicted finish of a request of `rows` behind `ahead` samples, the instances free at `free`.

        `free`: when each instance is predicted free (each ≥ now); one time: every instance then.
        `size`: the batches a backlog is formed into, the batcher's flush size (the largest
        preferred batch size, else max_batch_size); None: max_batch_size. The queue ahead is
        packed into batches of `size`, each run on the instance free first; the request's own
        batch then runs on the instance free first. A request is never split: if it does not fit
        beside the last, partial batch ahead (or is over `size`, as after the admin API lowered
        the maximum: it then runs alone), that batch runs without it and its own batch is itself.

        `pack`: when the requests queued differ in rows, the fewest samples a batch ahead may hold
        (a batch formed first-in first-out closes only when the next request does not fit: with at
        most R rows a request, it holds at least size − R + 1); None: every batch holds `size`.
        The estimate is then a bound: at most ⌊ahead / pack⌋ batches run before the request's, each
        at most T(size), and its own batch holds at most `size` samples.
        """
        size = max(1, min(self.max_batch_size if size is None else size, self.max_batch_size))
        times = [free] * self.instances if isinstance(free, (int, float)) else free
        step = self.times.predict(key, size)
        if pack is not None and pack < size:
            full, part = divmod(ahead, max(1, pack))
            own = rows if rows > size else min(size, part + rows)
            finish = nth_start(times, full, step) + self.times.predict(key, own)
            if full and rows <= size:
                # Fewer batches may run before it, its own then fuller: after the (full−1)-th start
                # any batch of at most `size` ends by then (one instance: no later than the above).
                finish = max(finish, nth_start(times, full - 1, step) + step)
            return finish + self.margin
        full, part = divmod(ahead, size)
        start = nth_start(times, full, step)
        if part + rows <= size:
            own = part + rows
        else:
            own = rows
            if part:
                # The partial batch starts where a full one would; its instance is free after
                # T(part), the others as if every batch were full (T is non-decreasing in n).
                start = min(nth_start(times, full + 1, step), start + self.times.predict(key, part))
        return start + self.times.predict(key, own) + self.margin

    def observe_batch(self, key: Hashable, n: int, seconds: float) -> None:
        self.times.observe(key, n, seconds)

    def observe_hop(self, seconds: float) -> None:
        self.hop.add(seconds)

    def observe_late(self, seconds: float) -> None:
        """How long after its set time the batcher's timer woke it."""
        self.late.add(seconds)
