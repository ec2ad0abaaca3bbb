"""From a ramp's raw per-request arrays to the figures of the `wok.bench/2` result.

Everything here is pure arithmetic on numpy arrays and dicts (no I/O, no torch), so that
`wok bench` and `wok simulate` produce the same schema (docs/bench-schema.md) and the
verdicts can be tested on hand-made data.

Percentiles are nearest-rank: the p-th percentile of n samples is the ceil(p·n)-th
smallest (numpy's method="inverted_cdf"). It is always a latency some request actually
had, and it is exactly the statement an SLO makes: at least p of the requests finished
within it (of the successful ones: errors count in the success rate, judged beside it).
Interpolating methods (numpy's default "linear") invent values between two
requests, and "higher" (sorted[ceil(p·(n-1))]) turns P99 of 100 requests into the max.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import datetime, timezone

import numpy as np

from wok.servertiming import TIMING_COLUMNS, TIMING_COUNTS, TIMING_PARTS

from .histogram import LatencyHistogram
from .payloads import integer_refusal

# /2 since 2026-12-02: offered_qps, knee_qps, littles_law.mean_inflight_measured and wok simulate's
# utilization, loop_utilization and mean_batch_size changed meaning inside /1 on 2026-11-30 and
# 2026-12-01 (docs/bench-schema.md, "Versions"), so a /1 file may hold either meaning.
SCHEMA = "wok.bench/2"
READ_SCHEMAS = ("wok.bench/1", SCHEMA)
LATENCY_KEYS = ("mean", "p50", "p90", "p95", "p99", "p999", "max")
# Exact fractions, so that ceil(p·n) has no rounding error (0.999 * 1000 is not 999.0 in floats).
_QUANTILES = {"p50": (1, 2), "p90": (9, 10), "p95": (19, 20), "p99": (99, 100), "p999": (999, 1000)}
LATE_SEND_MS = 1.0
# Server figures that a step carries at its top level; the scraped view also stays whole under "server".
SERVER_KEYS = ("queue_ms", "mean_batch_size", "flush_reasons", "stages_ms", "gpu", "loop_lag_ms")
# Far enough under the SLO that an achieved rate below the offered one cannot be the server's doing.
FAR_UNDER_SLO = 0.5
UNDER_DELIVERY = 0.98
LITTLE_TOLERANCE = 0.25
NAN = float("nan")
# The code of a request of a cut step that was never sent (runner.status_name's for workers.NOT_SENT):
# counted in a step's `not_sent`, never among its `requests` or `errors`.
NOT_SENT = "NOT_SENT"


def _nearest_rank(sorted_ms: np.ndarray, num: int, den: int) -> float:
    n = len(sorted_ms)
    k = -(-num * n // den)  # ceil(num·n/den) in integers
    return float(sorted_ms[min(max(k, 1), n) - 1])


def latency_summary(ms: np.ndarray) -> dict[str, float]:
    """Mean, nearest-rank percentiles and max of all samples; all NaN when there are none.

    Non-finite samples are left out: a request that never completed has no latency (it is
    counted as an error by its status code instead).
    """
    a = np.asarray(ms, dtype=np.float64).ravel()
    a = np.sort(a[np.isfinite(a)])
    if a.size == 0:
        return dict.fromkeys(LATENCY_KEYS, NAN)
    out = {"mean": float(a.mean())}
    for key, (num, den) in _QUANTILES.items():
        out[key] = _nearest_rank(a, num, den)
    out["max"] = float(a[-1])
    return {k: out[k] for k in LATENCY_KEYS}


def _finite(x) -> bool:
    # Figures come as floats from step_result, None from a JSON file, numpy scalars from callers.
    try:
        return x is not None and math.isfinite(float(x))
    except (TypeError, ValueError):
        return False


def step_result(
    *,
    offered_qps: float,
    duration_s: float,
    intended_s: np.ndarray,
    sent_s: np.ndarray,
    done_s: np.ndarray,
    codes: np.ndarray,
    inflight_samples: np.ndarray | None = None,
    server: dict | None = None,
    phase: str = "ramp",
    completed_ok: int | None = None,
    server_timing_ms: np.ndarray | None = None,
    error_details: dict[str, str] | None = None,
    host_lag_s: np.ndarray | None = None,
) -> dict:
    """One step of the schema from its measured window's raw arrays (seconds from the window's start).

    Latency runs from the intended send time (open loop), so a request the generator sent
    late is charged its full wait: a stall never hides behind a delayed send. Latency
    figures cover successful requests; errors are counted by code. `sent_s` is NaN for a
    request never sent, `done_s` NaN for one that never completed (its code says why).
    A request never sent (code NOT_SENT, a step cut short) was no part of the load: it is left out
    of every figure, `requests`, `errors` and `success_rate` included, and counted in `not_sent`
    (present when any was).
    `error_details` ({code name: message}, the bench's) is kept for the codes of `errors`.
    `host_lag_s`, per request, is the host's share of its send's lag (seconds; the sender's waits
    for a CPU, workers.HostShare; NaN unknown): `late_sends_own` counts the sends late without it.
    """
    if duration_s <= 0:
        raise ValueError(f"duration_s: expected a number > 0; got {duration_s}")
    intended = np.asarray(intended_s, dtype=np.float64).ravel()
    sent = np.asarray(sent_s, dtype=np.float64).ravel()
    done = np.asarray(done_s, dtype=np.float64).ravel()
    code = np.asarray(codes)
    # Text or Python strings as they are: a copy of a step's codes as text is 4 bytes a character.
    code = (code if code.dtype.kind in "UO" else code.astype(str)).ravel()
    n = intended.size
    if not (sent.size == done.size == code.size == n):
        raise ValueError(
            f"arrays differ in length: intended {n}, sent {sent.size}, done {done.size}, codes {code.size}"
        )
    unsent = code == NOT_SENT
    if unsent.any():
        timed = unsent & (np.isfinite(sent) | np.isfinite(done))
        if timed.any():
            i = int(np.flatnonzero(timed)[0])
            raise ValueError(
                f"request {i} has code {NOT_SENT} (never sent): expected NaN send and completion times; "
                f"got sent {float(sent[i])!r}, done {float(done[i])!r}"
            )
        keep = ~unsent
        intended, sent, done, code = intended[keep], sent[keep], done[keep], code[keep]
        if host_lag_s is not None:
            host_lag_s = np.asarray(host_lag_s, dtype=np.float64).ravel()
            host_lag_s = host_lag_s[keep] if host_lag_s.size == n else None  # a wrong length: unknown, as below
        if server_timing_ms is not None:
            server_timing_ms = np.asarray(server_timing_ms)[keep]
        n = intended.size
    ok_mask = code == "OK"
    if not np.isfinite(done[ok_mask]).all():
        raise ValueError("a request with code OK has no completion time")
    ok = int(ok_mask.sum())
    errors = dict(sorted(Counter(code[~ok_mask].tolist()).items()))

    latency = 1e3 * (done[ok_mask] - intended[ok_mask])
    lag_ms = 1e3 * (sent - intended)
    late_own = None
    if host_lag_s is not None:
        host_ms = 1e3 * np.asarray(host_lag_s, dtype=np.float64).ravel()
        if host_ms.size == n and np.isfinite(host_ms[np.isfinite(lag_ms)]).all():
            late_own = int((lag_ms - host_ms > LATE_SEND_MS).sum())
    lag_ms = lag_ms[np.isfinite(lag_ms)]
    lag = latency_summary(lag_ms)

    # Little's law over what the in-flight samples count: requests sent and not yet answered,
    # whatever their outcome. λ is the rate of actual sends, W their mean time on the wire.
    was_sent = np.isfinite(sent)
    arrival_rate = float(was_sent.sum()) / duration_s
    in_system = done[was_sent] - sent[was_sent]
    in_system = in_system[np.isfinite(in_system)]
    w_s = float(in_system.mean()) if in_system.size else NAN
    lambda_w = arrival_rate * w_s if in_system.size else NAN
    measured = NAN
    if inflight_samples is not None and np.asarray(inflight_samples).size:
        measured = float(np.mean(np.asarray(inflight_samples, dtype=np.float64)))
    rel = (lambda_w - measured) / measured if measured > 0 and math.isfinite(lambda_w) else NAN

    # The bench's messages, for the codes counted here (not one seen in the warm-up only).
    details = (
        {} if error_details is None else {"error_details": {c: error_details[c] for c in errors if c in error_details}}
    )
    step = {
        "offered_qps": float(offered_qps),
        # Completions inside the window, not admissions: past capacity the answers to a step's
        # requests spread beyond it, and the rate they come at is the server's throughput.
        # `completed_ok` (from the caller, who also sees the warm-up's requests) counts every
        # successful completion in the window; without it, the window's own requests do.
        "achieved_qps": (
            completed_ok if completed_ok is not None else int((ok_mask & (done >= 0) & (done < duration_s)).sum())
        )
        / duration_s,
        "duration_s": float(duration_s),
        "phase": phase,
        "requests": int(n),
        **({"not_sent": int(unsent.sum())} if unsent.any() else {}),
        "ok": ok,
        "errors": errors,
        **details,
        "success_rate": ok / n if n else NAN,
        "latency_ms": latency_summary(latency),
        # Exact percentiles above; the histogram is what several processes' results merge by
        # (wok bench merge), whose percentiles then come from it: `latency_source` says which.
        "latency_source": "exact",
        "latency_histogram": LatencyHistogram.from_ms(latency).to_dict(),
        "dispatch_lag_ms": {"p50": lag["p50"], "p99": lag["p99"], "max": lag["max"]},
        "late_sends": int((lag_ms > LATE_SEND_MS).sum()),
        **({} if late_own is None else {"late_sends_own": late_own}),
        # The window's requests that went out within it: what the generator delivered, whatever
        # the server then did with them (check_precision judges the generator by this).
        "sent_qps": int(((sent >= 0) & (sent < duration_s)).sum()) / duration_s,
        "littles_law": {
            "mean_inflight_measured": measured,
            "lambda_w": lambda_w,
            "relative_error": rel,
            "arrival_rate_qps": arrival_rate,
            "mean_in_flight_ms": 1e3 * w_s,
        },
    }
    for key in SERVER_KEYS:
        step[key] = None if server is None else server.get(key)
    step["server"] = server
    step["outside_server_ms"] = outside_server_ms(step["latency_ms"]["mean"], server)
    if server_timing_ms is not None:
        step["server_timing"] = server_timing_summary(latency, np.asarray(server_timing_ms)[ok_mask])
    return step


def server_timing_summary(latency_ms: np.ndarray, stages_ms: np.ndarray) -> dict:
    """Each successful request's latency split by its server-timing trailer (`server_timing`).

    `stages_ms` holds one row per request of `latency_ms` (columns: TIMING_COLUMNS, or only
    TIMING_PARTS without the batch's counts; NaN where no trailer came, or where it had no such
    part). `outside` = the client's latency − the server's total: the generator's
    lag, the client, the transport and gRPC's work on both sides. `outside_histogram`: those
    times as a LatencyHistogram (negative ones, if clocks ever gave any, as 0);
    `compute_histogram` and `batch_histogram`: each request's batch's model time and whole batch
    stage, likewise; `compute_batch_histogram`, where the trailers carried their batch's size,
    the batches' model times, one count per batch, and beside it `partial_batches`, the batches of
    which it saw only some requests (`per_batch_compute`). `tail`: the mean of each
    part over the requests at or above the client's P99 (of the requests with a trailer), which
    says what the slowest 1 % were made of.
    """
    lat = np.asarray(latency_ms, dtype=np.float64).ravel()
    st = np.asarray(stages_ms, dtype=np.float64)
    if st.ndim != 2 or st.shape[1] != len(TIMING_COLUMNS):  # rows of the parts alone: no counts
        st = st.reshape(lat.size, len(TIMING_PARTS))
        st = np.hstack([st, np.full((lat.size, len(TIMING_COUNTS)), np.nan)])
    total = st[:, TIMING_PARTS.index("total")]
    have = np.isfinite(total)
    lat, st = lat[have], st[have]
    parts = {name: st[:, k] for k, name in enumerate(TIMING_PARTS)}
    by_batch, partial = per_batch_compute(parts["compute"], st[:, TIMING_COLUMNS.index("batch_requests")])
    parts["outside"] = lat - parts["total"]

    def brief(a: np.ndarray) -> dict[str, float]:
        full = latency_summary(a)
        return {"mean": full["mean"], "p50": full["p50"], "p99": full["p99"]}

    threshold = latency_summary(lat)["p99"]
    slow = lat >= threshold if lat.size else np.zeros(0, dtype=bool)
    return {
        "requests": int(have.sum()),
        "missing": int((~have).sum()),
        "stages_ms": {name: brief(a) for name, a in parts.items() if name != "outside"},
        "outside_ms": brief(parts["outside"]),
        # What a simulation draws the time outside the server from, at this step's load.
        "outside_histogram": LatencyHistogram.from_ms(np.maximum(parts["outside"], 0.0)).to_dict(),
        # ... and the spread of its batches' model time under this load.
        "compute_histogram": LatencyHistogram.from_ms(parts["compute"]).to_dict(),
        # ... counted once per batch, not once per request, where the server said each batch's size.
        **({} if by_batch is None else {"compute_batch_histogram": by_batch.to_dict(), "partial_batches": partial}),
        # ... and of the whole batch stage (the hop to the worker included), where the server's
        # own tail grows first with load.
        "batch_histogram": LatencyHistogram.from_ms(parts["batch"]).to_dict(),
        "tail": {
            "threshold_ms": threshold,
            "requests": int(slow.sum()),
            "mean_ms": {name: (float(a[slow].mean()) if slow.any() else NAN) for name, a in parts.items()},
        },
    }


def per_batch_compute(
    compute_ms: np.ndarray, batch_requests: np.ndarray
) -> tuple[LatencyHistogram, dict[str, list]] | tuple[None, None]:
    """The batches' model times, one count per batch, from each request's (compute, its batch's request
    count n), and the batches of which only some requests were seen (`partial_batches`); (None, None)
    when no request carried n (a server without it).

    A batch's n requests carry the same compute (to the µs of the trailer), so each distinct (compute, n)
    pair seen c times is ⌈c/n⌉ batches: its requests count 1/n each, and a batch the step's window cut
    (some of its requests before the warm-up's end or failed) still counts once. Two batches of one size
    that took the same µs are one pair seen 2n times: two batches. Requests without n are left out.

    `partial_batches` holds every pair whose c is not a multiple of n: its `compute_ms`, `batch_requests`
    (n) and `requests`, c mod n (sorted by compute, then n). It is what a merge of several processes'
    steps needs to count a batch whose requests they shared once (bench/merge.py): the pair's batches over
    all of them are ⌈Σc/n⌉ = Σ⌊c/n⌋ + ⌈Σ(c mod n)/n⌉, and a process counted ⌊c/n⌋ + 1. A process that sent
    every request of its batches lists only those its window cut."""
    compute = np.asarray(compute_ms, dtype=np.float64).ravel()
    n = np.asarray(batch_requests, dtype=np.float64).ravel()
    known = np.isfinite(compute) & np.isfinite(n) & (n >= 1)
    if not known.any():
        return None, None
    pairs, seen = np.unique(np.column_stack([compute[known], n[known]]), axis=0, return_counts=True)
    size = pairs[:, 1].astype(np.int64)
    batches = -(-seen // size)
    left = seen % size
    cut = left > 0
    partial = {
        "compute_ms": pairs[cut, 0].tolist(),
        "batch_requests": size[cut].tolist(),
        "requests": left[cut].tolist(),
    }
    return LatencyHistogram.from_ms(np.repeat(pairs[:, 0], batches)), partial


SIZE_KEYS = ("mean", "p50", "p90", "p99", "p999", "max")


def request_size_summary(sizes: np.ndarray) -> dict:
    """A step's `request_sizes` from the sizes of its requests (those to a model with a variable
    dimension): their count, mean, nearest-rank quantiles (as latencies') and maximum, and every size
    with its count (`sizes`, increasing, and `counts`): what `wok bench merge` adds up, so that a merged
    step's quantiles are exactly those of all the parts' requests together."""
    sizes = np.asarray(sizes, dtype=np.int64).ravel()
    if not len(sizes):
        return {"requests": 0} | dict.fromkeys(SIZE_KEYS) | {"sizes": [], "counts": []}
    q = np.quantile(sizes, [0.5, 0.9, 0.99, 0.999], method="inverted_cdf")
    distinct, counts = np.unique(sizes, return_counts=True)
    return (
        {"requests": len(sizes), "mean": float(sizes.mean())}
        | {k: int(v) for k, v in zip(SIZE_KEYS[1:], [*q, sizes.max()])}
        | {"sizes": distinct.tolist(), "counts": counts.tolist()}
    )


def outside_server_ms(client_mean_ms: float, server: dict | None) -> float | None:
    """Mean client latency less the server's own mean end-to-end time over the same window.

    What the server's histograms cannot see: the transport both ways, the wait before grpc.aio
    accepts a call, the client's own work. Means subtract where percentiles do not. None
    without a server view, or without a successful request on either side.
    """
    e2e = ((server or {}).get("e2e_ms") or {}).get("mean")
    if e2e is None or not math.isfinite(client_mean_ms) or not math.isfinite(e2e):
        return None
    return float(client_mean_ms - e2e)


def _sorted_steps(steps: Sequence[dict]) -> list[dict]:
    # Refinement steps arrive after the ramp's; the verdicts read the curve in QPS order.
    return sorted(steps, key=lambda s: s["offered_qps"])


def poisson_noise_qps(offered_qps: float, duration_s: float) -> float:
    """3·√N / T: how far a step's count of Poisson arrivals alone may stray from its offer, in QPS."""
    return 3 * math.sqrt(max(offered_qps * duration_s, 0.0)) / duration_s


def find_knee(steps: list[dict], threshold: float = 0.5) -> float | None:
    """Offered QPS of the first step where achieved throughput stops following the offer.

    That is the first step i (in offered order) whose marginal gain
    (achieved_i − achieved_{i−1}) / (offered_i − offered_{i−1}) is below `threshold`, the
    first step's gain taken from the origin (nothing offered, nothing achieved): achieved_1 /
    offered_1. When the first step is the knee, the knee is at or below it (nothing ran below
    to say where): `knee_at_or_below_first_step`. `achieved_qps` counts successful requests
    only, so a server that answers the extra load with errors has reached its knee too. Of steps
    at one offer only the first in `steps` (sorted stably: the first run) is judged, and the next
    gain is taken from it; the later ones are skipped (docs/bench-schema.md, Verdicts). The step
    must also fall short of its own offer by more than the Poisson noise of its count (3·√N):
    between steps a few QPS apart (refinement), noise alone makes gains below any threshold while
    throughput still follows.
    """
    prev = {"offered_qps": 0.0, "achieved_qps": 0.0}
    for step in _sorted_steps(steps):
        if step["offered_qps"] > prev["offered_qps"]:
            gain = (step["achieved_qps"] - prev["achieved_qps"]) / (step["offered_qps"] - prev["offered_qps"])
            short = step["offered_qps"] - step["achieved_qps"] > poisson_noise_qps(
                step["offered_qps"], step["duration_s"]
            )
            if gain < threshold and short:
                return step["offered_qps"]
            prev = step
    return None


def knee_at_or_below_first_step(steps: Sequence[dict], knee: float | None) -> bool:
    """Whether `knee` (find_knee's answer on these steps) is their lowest offer: the first step
    already fell short of its offer, so the knee lies at or below it, where nothing was run.

    Exact on every result ever written: before the first step was judged (2026-12-02) the knee
    could only be a step above the lowest one."""
    offers = [s["offered_qps"] for s in steps if s["offered_qps"] > 0]
    return knee is not None and bool(offers) and knee <= min(offers)


def passes_slo(step: dict, slo_p99_ms: float, min_success_rate: float = 0.99) -> bool:
    """P99 within the SLO and enough successes (a step without successes has no P99: it fails)."""
    p99 = step["latency_ms"]["p99"]
    rate = step["success_rate"]
    return _finite(p99) and p99 <= slo_p99_ms and _finite(rate) and rate >= min_success_rate


def max_qps_under_slo(steps: list[dict], slo_p99_ms: float, min_success_rate: float = 0.99) -> float | None:
    """The highest offered QPS that passed, among the steps below the first failing one.

    A ramp is monotone: a server that failed at 400 QPS and passed at 800 is noisy, and
    800 is not a rate it can be trusted with. An offer run more than once (`--steps 100,200,200`)
    passes only if every step at it passed: which of them ran first does not change the answer.
    None when the lowest step already fails.
    """
    lowest_fail = _lowest_failing_offer(steps, slo_p99_ms, min_success_rate)
    best = None
    for step in _sorted_steps(steps):
        if step["offered_qps"] >= lowest_fail:
            break
        best = step["offered_qps"]
    return best


def _lowest_failing_offer(steps: Sequence[dict], slo_p99_ms: float, min_success_rate: float) -> float:
    """The lowest offered QPS of a step that missed the SLO; infinity when none did."""
    return min((s["offered_qps"] for s in steps if not passes_slo(s, slo_p99_ms, min_success_rate)), default=math.inf)


def refine_points(last_pass: float, first_fail: float, n: int) -> list[float]:
    """n offers evenly spaced strictly between a passing and a failing offer (a grid refinement)."""
    if (refusal := integer_refusal("n", n, 0)) is not None:
        raise ValueError(refusal)
    step = (first_fail - last_pass) / (n + 1)
    return [last_pass + k * step for k in range(1, n + 1)]


def bisect_max_qps(
    run_at: Callable[[float], dict],
    lo: float,
    hi: float,
    slo_p99_ms: float,
    iterations: int,
    *,
    min_success_rate: float = 0.99,
) -> tuple[float, list[dict]]:
    """Bisect between a passing `lo` and a failing `hi`, running one step per iteration.

    Returns the highest passing offer found (within (hi − lo) / 2**iterations of the
    threshold) and the steps run, each marked phase "refine".
    """
    if not lo < hi:
        raise ValueError(f"lo, hi: expected lo < hi; got lo={lo}, hi={hi}")
    extra = []
    for _ in range(iterations):
        mid = (lo + hi) / 2
        step = run_at(mid)
        step["phase"] = "refine"
        extra.append(step)
        if passes_slo(step, slo_p99_ms, min_success_rate):
            lo = mid
        else:
            hi = mid
    return lo, extra


# `stop_rule`'s words for a step with no request at all, which ends a ramp whatever its factor.
NONE_SENT = "the step sent no request"


def stop_rule(step: dict, slo_p99_ms: float, factor: float) -> tuple[str, str] | None:
    """The rule that ends a ramp after `step` and why, as a result's `stopped_early` names it; None: it goes on.
    `stop_factor`: its P99 beyond factor × SLO, or most of its requests failed. An infinite factor turns both off, for
    a curve run to its last step (but for the ramp's other rules: a step with no request OK, none failed by load, ends
    any ramp but a fault run's: Ramp._stop_rule). `none_sent`: a step with no requests at all (success rate NaN)
    stops whatever the factor: the generator is not working."""
    rate = step["success_rate"]
    if not _finite(rate):
        return "none_sent", NONE_SENT
    if math.isinf(factor):
        return None
    if rate < 0.5:
        return "stop_factor", f"fewer than half of the step's requests succeeded ({100 * rate:.1f}% ok)"
    p99 = step["latency_ms"]["p99"]
    if _finite(p99) and p99 > factor * slo_p99_ms:
        return "stop_factor", f"the step's P99 {p99:.4g} ms is over {factor:g} × the SLO ({slo_p99_ms:g} ms)"
    return None


# Codes that refuse the request itself (its model, shape or values), whatever the load: a step
# whose every request got one measured nothing of the server.
BAD_REQUEST_CODES = ("INVALID_ARGUMENT", "NOT_FOUND")


def _all_failed(step: dict) -> dict[str, int]:
    """`step`'s errors by code when it sent requests and none of them succeeded; else {}."""
    errors = step.get("errors") or {}
    return errors if step.get("requests") and not step.get("ok") else {}


# Codes an overloaded server's requests fail with (a deadline passed, a full queue): a step failed by them measured
# the server past its capacity, the overload curve a ramp with --stop-factor inf is run to draw.
LOAD_CODES = ("DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED")


def none_ok(step: dict) -> str | None:
    """When `step` sent requests, not one succeeded, and none failed by load (LOAD_CODES): each code with its
    count ("120 × INTERNAL, 3 × UNAVAILABLE"); else None. `refused_as_bad` and `failed_by_model` are the cases
    whose cause is known (the requests, the model). A step with a load code among them is left to `stop_rule`
    (under half OK), which --stop-factor inf turns off: a server that died in it fails the next step with
    UNAVAILABLE alone, which ends the ramp."""
    errors = _all_failed(step)
    if not errors or any(code in LOAD_CODES for code in errors):
        return None
    return ", ".join(f"{n} × {code}" for code, n in errors.items())


def refused_as_bad(step: dict) -> str | None:
    """When every request of `step` was refused with one of BAD_REQUEST_CODES: the codes and the
    server's first message for each ("INVALID_ARGUMENT: ..."); else None."""
    errors = _all_failed(step)
    if not errors or any(c not in BAD_REQUEST_CODES for c in errors):
        return None
    details = step.get("error_details") or {}
    return "; ".join(f"{code}: {details[code]}" if details.get(code) else code for code in errors)


def failed_by_model(step: dict) -> str | None:
    """When every request of `step` failed INTERNAL (the model raised on each, none refused for load): the
    server's first message ("INTERNAL: ..."); else None. An id past an embedding table fails so in a
    TorchScript or torch.export model (IndexError), which no metadata lets the bench foresee."""
    if list(_all_failed(step)) != ["INTERNAL"]:
        return None
    detail = (step.get("error_details") or {}).get("INTERNAL")
    return f"INTERNAL: {detail}" if detail else "INTERNAL"


def ms_text(seconds: float) -> str:
    """Seconds as ms for a table: 3 decimals from 1 ms up, 3 significant digits below (a µs-scale
    figure read 0.000 or 0.0022 at fixed decimals), so that 0.000 only ever means 0; "-" when not
    finite. The profile and tune tables' rule."""
    if not math.isfinite(seconds):
        return "-"
    ms = 1e3 * seconds
    if ms == 0 or abs(ms) >= 0.9995:  # 0.9995 and up round to 1.000 at 3 decimals
        return f"{ms:.3f}"
    return f"{ms:#.3g}"


def _qps(x: float) -> str:
    # A whole rate in full: ":g" wrote 1,048,576 QPS as 1.04858e+06.
    return f"{x:.0f}" if float(x).is_integer() else f"{x:.10g}"


def _over(x: float, bound: float) -> str:
    """`x`, known to be above `bound`, with one decimal, or as many more as show it above: a lag of
    1.04 ms written "1.0 ms > 1 ms" read as a warning about nothing."""
    for digits in range(1, 7):
        text = f"{x:.{digits}f}"
        if float(text) > bound:
            return text
    return f"{x:.10g}"


def check_precision(step: dict, slo_p99_ms: float | None = None) -> list[str]:
    """Warnings that a step measured the generator rather than the server.

    Without `slo_p99_ms` the under-delivery check cannot tell "far under the SLO" and
    requires only that nearly everything succeeded.
    """
    out = []
    name = f"step {_qps(step['offered_qps'])} QPS"
    if step["requests"] == 0:
        if step.get("not_sent"):
            return [f"{name}: none of the {step['not_sent']} requests scheduled in the measured window was sent"]
        return [f"{name}: no request was scheduled in the measured window"]
    lag99 = step["dispatch_lag_ms"]["p99"]
    if _finite(lag99) and lag99 > LATE_SEND_MS:
        shown = _over(lag99, LATE_SEND_MS)
        w = f"{name}: dispatch lag p99 {shown} ms > {LATE_SEND_MS:g} ms: the generator could not keep the schedule"
        late, own = step.get("late_sends"), step.get("late_sends_own")
        if late and own is not None:
            # Whose the lateness is says what to do: a busy host (a quieter one, fewer other
            # processes) or a generator short of workers.
            w += f"; of its {late} late sends, {late - own} were late only by waiting for a CPU (a busy host)"
        out.append(w)
    offered, achieved, duration = step["offered_qps"], step["achieved_qps"], step["duration_s"]
    # Poisson arrivals alone put the count 3·sqrt(N) off on a short step; warn only beyond that.
    limit = max((1 - UNDER_DELIVERY) * offered, poisson_noise_qps(offered, duration))
    sent = step.get("sent_qps")
    if _finite(sent):
        # What went out, not what came back: a server past capacity completes less than was
        # sent, and that is its figure, not the generator's.
        if offered - sent > limit:
            out.append(
                f"{name}: sent {sent:.1f} QPS < {100 * UNDER_DELIVERY:g}% of offered: the generator under-delivered"
            )
    else:
        # Steps written before `sent_qps`: a shortfall of answers counts as the generator's only
        # while they come quickly, which a large SLO makes a weak test.
        p99 = step["latency_ms"]["p99"]
        healthy = _finite(step["success_rate"]) and step["success_rate"] >= 0.99
        fast = slo_p99_ms is None or (_finite(p99) and p99 <= FAR_UNDER_SLO * slo_p99_ms)
        if healthy and fast and offered - achieved > limit:
            out.append(
                f"{name}: achieved {achieved:.1f} QPS < {100 * UNDER_DELIVERY:g}% of offered while requests succeed "
                "quickly: the generator under-delivered"
            )
    rel = step["littles_law"]["relative_error"]
    # Little's law holds for a stationary system; past capacity the queue grows through the
    # step, and a step that answers well beyond its offer is draining an earlier backlog: in
    # either L over the window need not equal λW, so only a step that keeps pace is checked.
    steady = offered > 0 and 0.95 * offered <= achieved <= 1.05 * offered
    if (
        steady
        and _finite(rel)
        and abs(rel) > LITTLE_TOLERANCE
        and abs(_unexplained(step["littles_law"])) > LITTLE_TOLERANCE
    ):
        out.append(
            f"{name}: in-flight samples disagree with Little's law by {100 * rel:+.0f}%: "
            "the client's clocks or counters are suspect"
        )
    return out


def _unexplained(little: dict) -> float:
    """The part of Little's law's relative error that the window's edges do not account for
    (λW − L − (late_edge − early_edge), over L): a stall at a short step's edge owes λW − L
    several percent with exact clocks and counts. Steps without finite edge terms (written
    before them, or merged from a part without them) keep the whole error: a NaN would hide it."""
    rel = little["relative_error"]
    late, early, L = little.get("late_edge"), little.get("early_edge"), little.get("mean_inflight_measured")
    if not (_finite(late) and _finite(early) and _finite(L)) or L <= 0:
        return rel
    return (little["lambda_w"] - L - (late - early)) / L


def ramp_result(
    *,
    steps: list[dict],
    slo_p99_ms: float,
    config: dict,
    knee_threshold: float = 0.5,
    timeline: dict | None = None,
    min_success_rate: float = 0.99,
    created: str | None = None,
    cut_at_qps: float | None = None,
) -> dict:
    """The whole `wok.bench/2` document: config, verdicts, steps in offered order, warnings.

    `cut_at_qps`: the step (its --steps value) in which a signal or an error cut the ramp, None when
    it ran the steps it meant to; a maximum that is then the highest step run is only a lower bound."""
    config = dict(config)
    config.setdefault("source", "bench")
    if config["source"] not in ("bench", "simulate"):
        raise ValueError(f"config source: expected 'bench' or 'simulate'; got {config['source']!r}")
    ordered = _sorted_steps(steps)
    knee = find_knee(ordered, knee_threshold)
    best = max_qps_under_slo(ordered, slo_p99_ms, min_success_rate)
    warnings = [w for s in ordered for w in check_precision(s, slo_p99_ms)]
    if ordered and best is None:
        warnings.append(f"the lowest step ({_qps(ordered[0]['offered_qps'])} QPS) already misses the SLO")
    elif ordered and best == ordered[-1]["offered_qps"] and cut_at_qps is not None:
        # "Add higher steps" would be wrong: a higher one was planned, and never finished.
        warnings.append(
            f"the ramp was cut in its {_qps(cut_at_qps)} QPS step, and every step before it met the SLO: "
            f"the maximum is at least {_qps(best)} QPS, a lower bound; run the ramp again to find it"
        )
    elif ordered and best == ordered[-1]["offered_qps"]:
        warnings.append(
            f"every step met the SLO: the maximum is at least {_qps(best)} QPS; add higher steps to find it"
        )
    lowest_fail = _lowest_failing_offer(ordered, slo_p99_ms, min_success_rate)
    for s in ordered:
        if s["offered_qps"] >= lowest_fail and passes_slo(s, slo_p99_ms, min_success_rate):
            which = "a lower step" if s["offered_qps"] > lowest_fail else "another step at the same offer"
            warnings.append(
                f"step {_qps(s['offered_qps'])} QPS met the SLO after {which} missed it: "
                "ignored as noise in max_qps_under_slo"
            )
    return {
        "schema": SCHEMA,
        "created": created or datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "config": config,
        "slo_p99_ms": float(slo_p99_ms),
        "min_success_rate": float(min_success_rate),
        "knee_threshold": float(knee_threshold),
        "knee_qps": knee,
        "knee_at_or_below_first_step": knee_at_or_below_first_step(ordered, knee),
        "max_qps_under_slo": best,
        "steps": ordered,
        "timeline": _check_timeline(timeline),
        "warnings": warnings,
    }


TIMELINE_KEYS = ("t_s", "offered", "achieved", "p99_ms")


def _check_timeline(timeline: dict | None) -> dict | None:
    if timeline is None:
        return None
    missing = [k for k in TIMELINE_KEYS if k not in timeline]
    if missing:
        raise ValueError(f"timeline lacks {missing}")
    lengths = {k: len(timeline[k]) for k in TIMELINE_KEYS}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"timeline series differ in length: {lengths}")
    return {k: list(v) for k, v in timeline.items()}
