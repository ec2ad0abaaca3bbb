"""One ramp result from the results of several bench processes that drove one server together.

When the load comes from N machines (a Kubernetes Indexed Job, N `wok bench ramp`
processes with the same steps and step duration, started together), each process's result
holds its share of every step. `merge_results` adds them step by step, by the index of the
step in each ramp, in the order it ran (`config.steps`: a result lists its steps by offered rate, and
with `--steps 400,200,100` a part stopped after its first step ran 400, not the 100 listed first);
refinement steps are left out (each process bisected on its own):

* counts add: offered, nominal and achieved QPS, requests, requests never sent (`not_sent`), ok, errors by
  code, late sends;
* the server's message per error code (`error_details`, when a part has one): per code, the first
  part's that has one, in the order the parts are given;
* latency percentiles come from the sum of the parts' histograms (`latency_histogram`,
  bench/histogram.py), never from averaging percentiles: the merged histogram is exactly
  the one a single process would have built from all the requests, so the percentiles are
  too (`latency_source: "histogram"`, at most the histogram's relative error above the
  exact nearest-rank value);
* dispatch lag: the largest of the parts' p50, p99 and max, an upper bound of the merged
  figure (the generators' health, not the server's);
* Little's law: L and λ add, so λW adds; W is λW / λ; the window's edges (`late_edge`,
  `early_edge`: time over the one window's length, in L's unit) add too, so the merged step's
  Little's-law warning judges what they leave unexplained, as a single process's does (kept
  only when every part has them: without, the whole error is judged, as for older steps);
* the server-timing split (`server_timing`, when every part has one): counts add, the
  histograms (outside, compute, batch) are summed, `outside_ms`'s percentiles come from the
  summed outside histogram and every mean is the parts' means weighted by their requests (exact);
  the stages' percentiles and the slowest 1 %'s breakdown (`tail`) cannot be rebuilt from the
  parts and are left null; the per-batch compute histogram (`compute_batch_histogram`) is merged
  when every part with requests has one: exactly (each batch once, whichever parts sent its
  requests) when they all list the batches they saw only part of (`partial_batches`), else, with a
  part written before those, summed, counting a batch once per part that sent some of its requests;
* the sizes of the requests (`request_sizes`, when every part has them): the counts per size add,
  so every figure is that of all the parts' requests (parts without the counts: count, mean and
  maximum, the quantiles null);
* histograms of different bucket layouts are refused, naming the step, the field and the parts;
* the parts' pools of requests (`payloads`): kept once when all agree, else by part in
  `payloads_by_part` (a pool of draws follows each part's seed);
* `interrupted`: null unless a part was cut in its ramp (then its steps, fewer, cap the merged
  ones, and its verdicts with them, as a part stopped early by its own rule does: with a warning);
  each such part's reason, after its name;
* a part run without --server-timing beside parts run with it: the merged steps have no split,
  and a warning names the part;
* the parts' host probes (`host_probe`, `wok bench ramp --host-probe`) are kept by part in
  `host_probes`: each read its own machine's speed, so they are not combined;
* a fault run's and a soak's sections (`faults`, `soak`) are left out, with a warning naming the parts
  that had one: their P99 per window (and a fault's recovery, read off it) cannot be rebuilt from the
  parts'; but for one part's fault section, which is the whole run's and kept as it is; several parts
  of which one ran `--replicas` (`replicas`; a soak's too) are refused: that part ramped servers of its own,
  which no other part loaded, and the sum would be several fleets' loads read as one server's;
* the server's view (`server`, `queue_ms`, …) is taken from the first result given: every
  process scraped the same server over the same window, so each scrape already counts all
  the processes' requests; adding them would count the server N times. So is the models'
  `devices`, what that server runs them on.

Verdicts (knee, max QPS under the SLO) and precision warnings are recomputed on the merged
steps, with the parts' knee threshold and least success rate (parts that differ in either are
refused, as are parts that sent other requests: other --sizes, --rows or --int-high (or ids drawn below
other bounds their servers published), or measured
otherwise: other --warmup, --timeout, --rpc/--streams, --arrival, or --step-gap with --start-at, or
ran a merged step at other rates, or planned other steps: other --steps, or the same in another order,
or more or fewer of them); the parts' own warnings are kept, prefixed with the part's name.

Parts are `wok.bench/1` or `wok.bench/2`, all of one version, which the merged result keeps:
a /1 file may hold the older definitions of `offered_qps` and the Little's-law count
(docs/bench-schema.md, "Versions"), and a sum across versions would mean neither.
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Sequence

import numpy as np

from ..errors import shown_data, shown_entry
from . import analysis
from .histogram import LatencyHistogram

NAN = float("nan")
DURATION_TOLERANCE_S = 1e-6
LAG_KEYS = ("p50", "p99", "max")
# server_timing's histograms in the order a process writes them (analysis.server_timing_summary).
HISTOGRAM_ORDER = ("outside_histogram", "compute_histogram", "compute_batch_histogram", "batch_histogram")


def _num(x) -> float:
    return float(x) if analysis._finite(x) else NAN


def _sum_if_all(values) -> float:
    """The sum, or NaN when any part lacks the figure (a partial sum would be a lie)."""
    values = [_num(v) for v in values]
    return NAN if any(math.isnan(v) for v in values) else math.fsum(values)


def _max_finite(values) -> float:
    finite = [_num(v) for v in values if analysis._finite(v)]
    return max(finite) if finite else NAN


def _part_names(names: Sequence[str] | None, n: int) -> list[str]:
    """The parts' names for a refusal: those given, else "part 0", "part 1", ..."""
    return list(names) if names is not None else [f"part {i}" for i in range(n)]


def _summed(
    histograms: Sequence[dict], what: str = "histogram", names: Sequence[str] | None = None
) -> LatencyHistogram:
    """The parts' histograms (their JSON form) added bucket by bucket; `what` (the step and field) and
    `names` (the parts') name them in a refusal: histograms of other bucket layouts do not add up."""
    names = _part_names(names, len(histograms))
    read = []
    for h, name in zip(histograms, names):
        try:
            read.append(LatencyHistogram.from_dict(h))
        except (KeyError, TypeError, ValueError) as exc:
            why = f"no {exc.args[0]}" if isinstance(exc, KeyError) else str(exc)
            raise ValueError(f"{what} of {name}: expected a latency histogram; {why}") from None
    bits = [r.bits for r in read]
    if any(b != bits[0] for b in bits):
        shown = ", ".join(f"{name}: {b}" for name, b in zip(names, bits))
        raise ValueError(
            f"{what}: the parts' histograms have different sub_bucket_bits ({shown}); only histograms of one "
            "bucket layout add up (run the parts with one wok bench)"
        )
    return functools.reduce(LatencyHistogram.merge, read)


def merge_steps(steps: Sequence[dict], label: str = "step", names: Sequence[str] | None = None) -> dict:
    """One step from the same step of every part (see the module's docstring for each field); `names`
    (the parts') name them in a refusal."""
    if not steps:
        raise ValueError("nothing to merge")
    names = _part_names(names, len(steps))
    durations = {float(s["duration_s"]) for s in steps}
    if max(durations) - min(durations) > DURATION_TOLERANCE_S:
        raise ValueError(f"{label}: the parts' measured windows differ ({sorted(durations)} s); run them alike")
    if any("latency_histogram" not in s for s in steps):
        raise ValueError(f"{label}: a part has no latency_histogram (written by a wok bench older than merge)")
    hist = _summed([s["latency_histogram"] for s in steps], f"{label}: latency_histogram", names)
    requests = sum(int(s["requests"]) for s in steps)
    not_sent = sum(int(s.get("not_sent") or 0) for s in steps)  # absent: none (analysis.step_result)
    ok = sum(int(s["ok"]) for s in steps)
    if hist.count != ok:
        raise ValueError(f"{label}: the histograms hold {hist.count} latencies for {ok} OK requests")
    errors = Counter()
    for s in steps:
        errors.update({k: int(v) for k, v in (s.get("errors") or {}).items()})
    lw = [s.get("littles_law") or {} for s in steps]
    measured = _sum_if_all(p.get("mean_inflight_measured") for p in lw)
    lambda_w = _sum_if_all(p.get("lambda_w") for p in lw)
    arrival = _sum_if_all(p.get("arrival_rate_qps") for p in lw)
    # Each edge is time summed over the window's length, which every part shares: they add as L
    # does. Only when every part has both: a partial sum would explain part of the error away, and
    # a NaN would hide the error from the check (analysis._unexplained) instead of judging all of it.
    edge_keys = ("late_edge", "early_edge")
    edges = {}
    if all(analysis._finite(p.get(k)) for p in lw for k in edge_keys):
        edges = {k: math.fsum(float(p[k]) for p in lw) for k in edge_keys}
    first = steps[0]
    step = {
        "offered_qps": math.fsum(float(s["offered_qps"]) for s in steps),
        "achieved_qps": math.fsum(float(s["achieved_qps"]) for s in steps),
        "duration_s": float(first["duration_s"]),
        "phase": "ramp",
        "requests": requests,
        **({"not_sent": not_sent} if not_sent else {}),
        "ok": ok,
        "errors": dict(sorted(errors.items())),
        "success_rate": ok / requests if requests else NAN,
        "latency_ms": hist.summary(),
        "latency_source": "histogram",
        "latency_histogram": hist.to_dict(),
        "dispatch_lag_ms": {k: _max_finite((s.get("dispatch_lag_ms") or {}).get(k) for s in steps) for k in LAG_KEYS},
        "late_sends": sum(int(s.get("late_sends") or 0) for s in steps),
        **(
            {"late_sends_own": sum(int(s["late_sends_own"]) for s in steps)}
            if all(s.get("late_sends_own") is not None for s in steps)
            else {}
        ),
        "sent_qps": _sum_if_all(s.get("sent_qps") for s in steps),
        "littles_law": {
            "mean_inflight_measured": measured,
            "lambda_w": lambda_w,
            "relative_error": (lambda_w - measured) / measured if measured > 0 and math.isfinite(lambda_w) else NAN,
            "arrival_rate_qps": arrival,
            "mean_in_flight_ms": 1e3 * lambda_w / arrival if arrival > 0 else NAN,
            **edges,
        },
    }
    for key in analysis.SERVER_KEYS:
        step[key] = first.get(key)
    step["server"] = first.get("server")
    # The merged client mean against the one server view (every part scraped the same server).
    step["outside_server_ms"] = analysis.outside_server_ms(step["latency_ms"]["mean"], step["server"])
    timing = [s.get("server_timing") for s in steps]
    if all(t is not None for t in timing):
        step["server_timing"] = merge_server_timing(timing, label, names)
    if all("nominal_qps" in s for s in steps):
        step["nominal_qps"] = math.fsum(float(s["nominal_qps"]) for s in steps)
    if any("error_details" in s for s in steps):
        # Per code of the merged errors, the first part's message: one per code, as a process keeps.
        details: dict[str, str] = {}
        for s in steps:
            for code, message in (s.get("error_details") or {}).items():
                if code in step["errors"]:
                    details.setdefault(code, message)
        step["error_details"] = dict(sorted(details.items()))
    if all("request_sizes" in s for s in steps):
        step["request_sizes"] = merge_request_sizes([s["request_sizes"] for s in steps], label, names)
    if all("start_late_s" in s for s in steps):
        # The latest part's: until it started, the step had only the others' share of the load.
        step["start_late_s"] = max(float(s["start_late_s"]) for s in steps)
    return step


def merge_server_timing(parts: Sequence[dict], label: str = "step", names: Sequence[str] | None = None) -> dict:
    """The server-timing split of one step from its parts' (see the module's docstring)."""
    names = _part_names(names, len(parts))
    weights = [int(t["requests"]) for t in parts]
    requests = sum(weights)

    def mean(get) -> float:
        # The parts' means weighted by their requests: exact. A part without requests adds nothing.
        if requests == 0:
            return NAN
        return math.fsum(w * _num(get(t)) for w, t in zip(weights, parts) if w) / requests

    hists = {}
    for key in ("outside_histogram", "compute_histogram", "batch_histogram"):
        if all(key in t for t in parts):
            merged = _summed([t[key] for t in parts], f"{label}: server_timing.{key}", names)
            if merged.count != requests:
                raise ValueError(f"{label}: the parts' {key} hold {merged.count} times for {requests} requests")
            hists[key] = merged
    # One count per batch a part saw (its count is batches, not requests). A part without requests
    # has none to give; a part with requests but without it (a server whose trailer did not carry
    # its batch's size) leaves it out: a sum of some parts' batches would be a lie. A batch whose
    # requests came from several parts was counted by each of them: their `partial_batches` count it
    # once; parts written before those leave the sum, an upper bound (docs/bench-schema.md).
    key = "compute_batch_histogram"
    have = [(t, name) for t, name in zip(parts, names) if key in t]
    partial = None
    if have and all(key in t or not int(t["requests"]) for t in parts):
        hists[key] = _summed([t[key] for t, _ in have], f"{label}: server_timing.{key}", [name for _, name in have])
        if all("partial_batches" in t for t, _ in have):
            partial = _count_shared_batches_once(hists[key], have, label)
    stages = sorted({k for t in parts for k in t.get("stages_ms", {})})
    outside = {"mean": mean(lambda t: t["outside_ms"]["mean"]), "p50": NAN, "p99": NAN}
    if "outside_histogram" in hists:
        summary = hists["outside_histogram"].summary()
        outside["p50"], outside["p99"] = summary["p50"], summary["p99"]
    written = {}
    for key in HISTOGRAM_ORDER:  # partial_batches after the histogram it completes, as a process writes it
        if key in hists:
            written[key] = hists[key].to_dict()
        if key == "compute_batch_histogram" and partial is not None:
            written["partial_batches"] = partial
    return {
        "requests": requests,
        "missing": sum(int(t["missing"]) for t in parts),
        "stages_ms": {
            k: {"mean": mean(lambda t, k=k: t["stages_ms"][k]["mean"]), "p50": NAN, "p99": NAN} for k in stages
        },
        "outside_ms": outside,
        **written,
        "tail": None,
        "merged": True,
    }


def _count_shared_batches_once(summed: LatencyHistogram, parts: Sequence[tuple[dict, str]], label: str) -> dict:
    """Take out of `summed` (the parts' `compute_batch_histogram` added up) the counts of batches that more
    than one part counted, and return the merged `partial_batches`. `parts`: (server_timing, name) of
    each part with the histogram, every one with `partial_batches`.

    A part counted a (compute, n) pair it saw c times ⌈c/n⌉ times, and listed c mod n when not 0: over
    all parts the pair is ⌈Σc/n⌉ = Σ⌊c/n⌋ + ⌈Σ(c mod n)/n⌉ batches, where the parts counted Σ⌊c/n⌋ plus
    one per part that listed it. So the merged histogram is what one process that sent every request
    would have written (analysis.per_batch_compute), bucket, count, sum, min and max: every listed pair
    keeps at least one count, so no value leaves it."""
    where = f"{label}: server_timing.partial_batches"
    left: dict[tuple[float, int], int] = {}  # Σ(c mod n) per pair
    listed: Counter = Counter()  # the parts that listed the pair, each of which counted it once more
    for t, name in parts:
        p = t["partial_batches"]
        keys = ("compute_ms", "batch_requests", "requests")
        try:
            entries = list(zip(*(p[k] for k in keys), strict=True))
        except (KeyError, TypeError, ValueError):
            got = {k: len(v) if isinstance(v, list) else v for k, v in p.items()} if isinstance(p, dict) else p
            raise ValueError(
                f"{where} of {name}: expected lists {', '.join(keys)} of one length; got {shown_data(got)} (lists as "
                "their lengths)"
            ) from None
        for x, n, r in entries:
            # Numbers as the file writes them: float() and int() read a string's digits and true as 1, int() 2.5 as 2.
            valid = type(x) in (int, float) and type(n) is type(r) is int and 1 <= r < n
            try:
                valid = valid and 0 <= float(x) < math.inf
            except OverflowError:  # an integer past a float's range
                valid = False
            if not valid:
                raise ValueError(
                    f"{where} of {name}: expected each entry a compute_ms ≥ 0 and integers 1 ≤ requests < "
                    f"batch_requests; got compute_ms {shown_data(x)}, batch_requests {shown_data(n)}, requests "
                    f"{shown_data(r)}"
                )
        entries = [(float(x), int(n), int(r)) for x, n, r in entries]
        own = LatencyHistogram.from_dict(t["compute_batch_histogram"])
        need = LatencyHistogram.from_ms([x for x, _, _ in entries], own.bits)
        for bucket, c in need.counts.items():
            if own.counts.get(bucket, 0) < c:
                x = next(x for x, _, _ in entries if LatencyHistogram.from_ms([x], own.bits).counts.get(bucket))
                raise ValueError(
                    f"{where} of {name}: expected batches its compute_batch_histogram holds; it lists {c} in the "
                    f"bucket of {x:g} ms, which holds {own.counts.get(bucket, 0)}"
                )
        twice = [key for key, c in Counter((x, n) for x, n, _ in entries).items() if c > 1]
        if twice:
            raise ValueError(
                f"{where} of {name}: expected each (compute_ms, batch_requests) once; got {twice[0][0]:g} ms, "
                f"{twice[0][1]} more than once"
            )
        for x, n, r in entries:
            left[(x, n)] = left.get((x, n), 0) + r
            listed[(x, n)] += 1
    extra, merged = [], {"compute_ms": [], "batch_requests": [], "requests": []}
    for (x, n), total in sorted(left.items()):
        extra += [x] * (listed[(x, n)] - -(-total // n))
        if total % n:
            merged["compute_ms"].append(x)
            merged["batch_requests"].append(n)
            merged["requests"].append(total % n)
    drop = LatencyHistogram.from_ms(extra, summed.bits)
    for bucket, c in drop.counts.items():
        summed.counts[bucket] -= c
        if not summed.counts[bucket]:
            del summed.counts[bucket]
    summed.count -= drop.count
    summed.sum_ns -= drop.sum_ns
    return merged


def merge_request_sizes(parts: Sequence[dict], label: str = "step", names: Sequence[str] | None = None) -> dict:
    """One step's `request_sizes` from its parts': every size's count adds, so the quantiles are exactly
    those of all the parts' requests together (`analysis.request_size_summary`). Parts written before
    the counts were kept (`sizes`, `counts`) give the count, the mean (weighted by the parts' requests)
    and the maximum alone: their quantiles cannot be rebuilt from the parts' and are null."""
    names = _part_names(names, len(parts))
    if all("sizes" in p and "counts" in p for p in parts):
        sizes, counts = [], []
        for p, name in zip(parts, names):
            if len(p["sizes"]) != len(p["counts"]) or sum(p["counts"]) != int(p["requests"]):
                raise ValueError(
                    f"{label}: request_sizes of {name}: expected a count per size adding up to its requests "
                    f"({p['requests']}); got {len(p['counts'])} counts of {sum(p['counts'])} "
                    f"for {len(p['sizes'])} sizes"
                )
            sizes += p["sizes"]
            counts += p["counts"]
        return analysis.request_size_summary(np.repeat(np.asarray(sizes, dtype=np.int64), counts))
    requests = sum(int(p["requests"]) for p in parts)
    mean = (
        math.fsum(int(p["requests"]) * float(p["mean"]) for p in parts if p["requests"]) / requests
        if requests
        else None
    )
    return (
        {"requests": requests, "mean": mean}
        | dict.fromkeys(analysis.SIZE_KEYS[1:-1])
        | {"max": max((int(p["max"]) for p in parts if p["requests"]), default=None)}
    )


def _run_order(result: dict, steps: list[dict]) -> list[dict]:
    """A part's ramp `steps` in the order it ran them: that of its `config.steps`, whose first k a part
    that ran k steps ran (it stopped, or was cut, after them). A result lists its steps by offered rate,
    so with steps run high to low (`--steps 400,200,100`) its first step is the last one run: merged by
    that index, a part stopped after 400 added its 400 to another part's 100. Equal rates keep the order
    they are listed in, which is the order they ran (the ramp sorts stably). Steps that do not match
    `config.steps` by their `nominal_qps` (a file without either) keep the order they are listed in."""
    order = result.get("config", {}).get("steps")
    if not isinstance(order, list) or any("nominal_qps" not in s for s in steps):
        return steps
    free: dict[float, list[int]] = {}
    for k, qps in enumerate(order):
        if not analysis._finite(qps):
            return steps
        free.setdefault(float(qps), []).append(k)
    ranked = []
    for step in steps:
        left = free.get(float(step["nominal_qps"])) if analysis._finite(step["nominal_qps"]) else None
        if not left:
            return steps
        ranked.append((left.pop(0), step))
    return [step for _, step in sorted(ranked, key=lambda r: r[0])]


def _stopped_early(
    results: Sequence[dict], names: Sequence[str], parts: list[list[dict]], n: int, steps: list[dict]
) -> dict | None:
    """The merged ramp's `stopped_early`: null unless a part that ran the fewest steps (`n`, the merged ones)
    stopped early by a rule; then its reason after its name (and any other such part's), the first such part's
    rule and plan (the parts planned one ramp: `_same_plan`), and the merged last step's offer."""
    stopped = [
        (name, r["stopped_early"]) for r, name, p in zip(results, names, parts) if r["stopped_early"] and len(p) == n
    ]
    if not stopped or not steps:
        return None
    return {
        "reason": "; ".join(f"{name}: {s['reason']}" for name, s in stopped),
        "rule": stopped[0][1]["rule"],
        "at_qps": steps[-1]["offered_qps"],
        "steps_run": n,
        "steps_planned": stopped[0][1]["steps_planned"],
    }


def _cut_phase(interrupted: dict) -> str:
    """Where a part was cut: its `phase`, or for a file written before it, the phase its reason names."""
    phase = interrupted.get("phase")
    if phase is not None:
        return phase
    reason = str(interrupted.get("reason", ""))
    return "refine" if reason.startswith("refinement ended early") else "soak" if reason.startswith("soak") else "ramp"


def _same(results: Sequence[dict], names: Sequence[str], what: str, get) -> None:
    values = [get(r) for r in results]
    if any(v != values[0] for v in values):
        shown = ", ".join(f"{n}: {v}" for n, v in zip(names, values))
        raise ValueError(f"the results differ in {what} ({shown}); only runs of the same ramp merge")


def _published(result: dict) -> dict:
    """A part's `config.int_high_published` as compared: only the models with an input drawn below a published bound."""
    published = result["config"].get("int_high_published") or {}
    if not isinstance(published, dict):
        return published  # not a ramp's: compared as it is
    return {model: bounds for model, bounds in published.items() if bounds}


def _knee_threshold(result: dict, name: str) -> float:
    """A part's `knee_threshold` (0.5 where absent, as in files written before it); ValueError naming
    the part and the value unless it is a number in (0, 1], as `wok bench ramp --knee-threshold` takes:
    the merged knee would be found with a threshold no ramp runs with (at 0 or less a flat throughput
    is no knee, above 1 a step that kept up with its offer is one)."""
    expected = "a ratio Δachieved/Δoffered above 0 and at most 1 (as --knee-threshold takes)"
    return _ratio(result, name, "knee_threshold", 0.5, expected)


def _min_success_rate(result: dict, name: str) -> float:
    """A part's `min_success_rate` (0.99 where absent, as in files written before it); ValueError naming
    the part and the value unless it is a number in (0, 1]: the merged verdicts would pass a step none
    of whose requests had to succeed (0 or less), or none at all (above 1)."""
    expected = "the least share of a step's requests that succeed for it to pass, above 0 and at most 1"
    return _ratio(result, name, "min_success_rate", 0.99, expected)


def _ratio(result: dict, name: str, key: str, default: float, expected: str) -> float:
    """`result[key]` (`default` where absent) as a float in (0, 1]; else ValueError naming `name`, `key`,
    `expected` and the value got."""
    value = result.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:  # NaN too
        raise ValueError(f"{name}: {key}: expected {expected}; got {shown_data(value)}")
    return float(value)


def _same_rate(steps: Sequence[dict], names: Sequence[str], i: int) -> None:
    """Refuse the i-th step the parts ran (run order) at different rates: their sum would be a step
    mixed from several offers, one nobody ran. Compared by `nominal_qps` (the --steps value), or by
    `offered_qps` where a part's step lacks it."""
    key = "nominal_qps" if all(analysis._finite(s.get("nominal_qps")) for s in steps) else "offered_qps"
    rates = [float(s[key]) for s in steps]
    if any(not math.isclose(r, rates[0], rel_tol=1e-9) for r in rates):
        shown = ", ".join(f"{name}: {analysis._qps(r)} QPS" for name, r in zip(names, rates))
        what = "--steps values" if key == "nominal_qps" else "offered rates"
        raise ValueError(
            f"step {i + 1} (in the order the parts ran their steps): the parts ran it at different rates ({what} "
            f"{shown}); only runs of the same --steps, in the same order, merge: each part sends its share of "
            "every step"
        )


def _same_servers(results: Sequence[dict], names: Sequence[str]) -> None:
    """Refuse several parts of which any ran `--replicas` (its `replicas`, or `faults.replicas` in a fault run
    written before the first, and a soak's never): such a part ramped the
    servers it started itself, which no other part loaded, so the merged steps would add up the loads of
    several fleets, each at its share of the rate, as if one server had taken them all (its knee and
    capacity N fleets'), beside the server columns of the first part's fleet alone. One part merges: a job
    of one process."""
    if len(results) < 2:
        return
    own = []
    for r, name in zip(results, names):
        fleet = r.get("replicas") or (r["faults"].get("replicas") if isinstance(r.get("faults"), dict) else None)
        if isinstance(fleet, list) and fleet:
            own.append(f"{name} ({len(fleet)} replica{'' if len(fleet) == 1 else 's'})")
    if own:
        raise ValueError(
            f"{', '.join(own)}: each started the servers it ramped (--replicas: `replicas`), which no other "
            "part loaded: the merged steps would add up the loads of several fleets as one server's, with the "
            "server columns of the first part's alone; only parts that ramped the same servers (one --target "
            "for every part) merge, and a --replicas run alone"
        )


def _same_plan(results: Sequence[dict], names: Sequence[str]) -> None:
    """Refuse parts that planned other ramps (`config.steps`: the --steps values, in the order run).
    Only the steps every part ran are merged, and `_same_rate` compares only those: a part planned with
    more steps, or with others after them, merged as if the others had stopped early, its own later
    steps dropped without a word of why. Parts with one plan, some stopped early, merge (with a warning);
    parts without a plan (older files) are compared by the steps they ran alone."""
    plans = [r["config"].get("steps") for r in results]
    if not all(isinstance(p, list) and all(analysis._finite(q) for q in p) for p in plans):
        return
    first = [float(q) for q in plans[0]]
    if all(
        len(p) == len(first) and all(math.isclose(float(q), f, rel_tol=1e-9) for q, f in zip(p, first)) for p in plans
    ):
        return
    shown = "; ".join(f"{name}: {', '.join(analysis._qps(float(q)) for q in p)}" for name, p in zip(names, plans))
    raise ValueError(
        f"the parts planned different ramps (--steps {shown}); only runs of the same --steps, in the same order, "
        "merge: each part sends its share of every step, and a step planned by some parts only would be "
        "dropped as if the others had stopped early"
    )


def _rpc(config: dict) -> tuple:
    """("unary",) or ("stream", streams per worker): a unary part's --streams means nothing."""
    rpc = config.get("rpc", "unary")
    return (rpc,) if rpc == "unary" else (rpc, config.get("streams"))


def _arrival(arrival) -> str | None:
    """A part's --arrival as compared: its kind in lower case (the parser takes any case), its
    comma-separated parameters as given but for the spaces around them. A default written out
    ("burst" beside "burst:amplitude=4x") compares as other: refused, not guessed."""
    if arrival is None:
        return None
    kind, sep, rest = str(arrival).strip().partition(":")
    return kind.strip().lower() + sep + ",".join(item.strip() for item in rest.split(","))


def _mix(models: Sequence) -> list:
    """[(name, share)] of a result's model mix: the weights normalised and rounded, so that
    parts given 2:1 and 4:2 agree, and parts given 0.7:0.3 and 0.1:0.9 do not."""
    total = sum(float(m[1]) for m in models) if models else 0.0
    return [(m[0], round(float(m[1]) / total, 6) if total > 0 else None) for m in models]


def _uncertain_verdicts(steps: Sequence[dict], slo_p99_ms: float, min_success_rate: float) -> list[str]:
    """A warning per merged step that fails the SLO by its histogram's P99 alone while the exact P99
    of its requests may lie within the SLO: the bucket holding it straddles the SLO (a P99 of 49.9 ms
    reads 50.07 ms off its bucket, and a step that met a 50 ms SLO in the part's own result fails)."""
    out = []
    for step in steps:
        rate = step["success_rate"]
        if not (analysis._finite(rate) and rate >= min_success_rate):
            continue  # it fails whatever its P99
        low, high = LatencyHistogram.from_dict(step["latency_histogram"]).quantile_bounds_ms(99, 100)
        if low <= slo_p99_ms < high:
            out.append(
                f"step {analysis._qps(step['offered_qps'])} QPS: its P99 read off the merged histogram, "
                f"{high:.6g} ms, misses the SLO ({slo_p99_ms:g} ms), but the exact P99 of its requests lies "
                f"between {low:.6g} ms and that: the step may have met it"
            )
    return out


def merge_results(results: Sequence[dict], names: Sequence[str] | None = None) -> dict:
    """A `wok.bench` result from the results of processes that ran the same ramp together, of the
    parts' schema version (/1 or /2; parts of both are refused)."""
    if not results:
        raise ValueError("nothing to merge: give at least one result")
    names = _part_names(names, len(results))
    if len(names) != len(results):
        raise ValueError(f"{len(names)} names for {len(results)} results")
    readable = " or ".join(map(repr, analysis.READ_SCHEMAS))
    for r, name in zip(results, names):
        if not isinstance(r, dict):
            got = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(type(r), "a number")
            raise ValueError(f"{name}: expected a wok.bench result, a JSON object; got {got}")
        if r.get("schema") not in analysis.READ_SCHEMAS:
            raise ValueError(f"{name}: expected schema {readable}; got {shown_entry(r, 'schema')}")
        if (r.get("config") or {}).get("source") != "bench":
            raise ValueError(f"{name}: only measured ramps (config.source 'bench') merge")
    schemas = {r["schema"] for r in results}
    if len(schemas) > 1:
        # A /1 part's offered_qps may be over warm-up and window, a /2 part's is over the window:
        # their sum would be neither.
        which = ", ".join(f"{name}: {r['schema']}" for r, name in zip(results, names))
        raise ValueError(
            f"the parts are of different schema versions ({which}): their offered_qps and Little's-law "
            "figures may be defined differently (docs/bench-schema.md, Versions); merge parts of one version"
        )
    _same_servers(results, names)
    _same(results, names, "the model mix", lambda r: _mix(r["config"].get("models", [])))
    _same(results, names, "the SLO", lambda r: r["slo_p99_ms"])
    # What each request carried: a merged step's request_sizes, payloads and config describe one load.
    _same(results, names, "the payload sizes (--sizes)", lambda r: r["config"].get("sizes"))
    _same(results, names, "the rows per request (--rows)", lambda r: r["config"].get("rows"))
    _same(results, names, "the integer inputs' bound (--int-high)", lambda r: r["config"].get("int_high"))
    # Absent (written before it) as none: those parts drew every integer input below int_high, as a model with no
    # bound published ({}) does; compared without such models, an older part merges with a newer one of the same ids.
    published = "the integer inputs drawn below the bounds their server publishes (int_high_published)"
    _same(results, names, published, _published)
    _same(results, names, "the step duration", lambda r: r["config"].get("step_duration_s"))
    # When a window opens, and how long a request may take before it counts as failed: parts that
    # differ measured windows that do not line up, or successes of other definitions.
    _same(results, names, "the warm-up before each window (--warmup)", lambda r: r["config"].get("warmup_s"))
    _same(results, names, "the request timeout (--timeout)", lambda r: r["config"].get("timeout_s"))
    _same(results, names, "the RPC (--rpc, --streams)", lambda r: _rpc(r["config"]))
    # The merged config names one arrival process: parts that ran others would be labelled with the
    # first's, and the merged load (their superposition) is neither.
    _same(results, names, "the arrival process (--arrival)", lambda r: _arrival(r["config"].get("arrival")))
    if all(r["config"].get("start_at") is not None for r in results):  # the gap sets step 2's slot on
        _same(results, names, "the gap between steps (--step-gap)", lambda r: r["config"].get("step_gap_s"))
    # The verdicts are recomputed with one threshold and one least success rate: the first part's
    # would decide them, and the order the files were given would change the knee.
    thresholds = [_knee_threshold(r, name) for r, name in zip(results, names)]
    _same(thresholds, names, "the knee threshold", float)
    rates = [_min_success_rate(r, name) for r, name in zip(results, names)]
    _same(rates, names, "the least success rate", float)
    first = results[0]

    parts = [_run_order(r, [s for s in r["steps"] if s.get("phase", "ramp") == "ramp"]) for r in results]
    n = min(len(p) for p in parts)
    for i in range(n):
        _same_rate([p[i] for p in parts], names, i)
    _same_plan(results, names)
    warnings = []
    if any(len(p) != n for p in parts):
        counts = ", ".join(f"{name}: {len(p)}" for name, p in zip(names, parts))
        warnings.append(f"the parts ran different numbers of steps ({counts}): only the first {n} they ran are merged")
    if any(s.get("phase", "ramp") != "ramp" for r in results for s in r["steps"]):
        warnings.append("refinement steps are left out: each process bisected on its own")
    seeds = [r["config"].get("seed") for r in results]
    # constant and trace draw nothing from the seed: constant sends at k/Q from each step's
    # start, a trace replays its file, so different seeds leave the parts in lockstep.
    unseeded = sorted(
        {str(a).partition(":")[0].strip().lower() for a in (r["config"].get("arrival") for r in results) if a}
        & {"constant", "trace"}
    )
    if len(results) > 1 and unseeded:
        warnings.append(
            f"the parts ran --arrival {' and '.join(unseeded)}, whose schedule does not depend on --seed: "
            "with their windows lined up they sent together, so the merged load came in lockstep bursts of "
            f"up to {len(results)} requests rather than as one process's schedule (poisson, burst and sawtooth "
            "draw from the seed)"
        )
    elif len(results) > 1 and len(set(map(str, seeds))) < len(seeds):
        warnings.append(
            "some parts ran with the same --seed: their arrival schedules coincide, so the merged load came "
            "in lockstep bursts rather than as one process's schedule; give each process its own seed"
        )
    timed = [r["config"].get("server_timing") for r in results]
    if any(timed) and not all(timed):
        without = ", ".join(name for t, name in zip(timed, names) if not t)
        warnings.append(
            f"{without} ran without --server-timing: the merged steps carry no server_timing split (it needs "
            "every part's)"
        )
    # A fault run's and a soak's sections judge P99 per window (a fault's recovery too, read off its windows),
    # from each part's own clock: the parts' P99s do not add up into the merged one's, so the merge leaves
    # the sections out, and says so. One part's fault section is the
    # whole run's, and kept (a soak's verdicts are its capacity ramp's, which the merged steps are not).
    for key, what in (("faults", "fault"), ("soak", "soak")):
        having = [name for r, name in zip(results, names) if r.get(key)]
        if having and not (key == "faults" and len(results) == 1):
            warnings.append(
                f"{', '.join(having)}: the {what} section (`{key}`) is left out of the merged result: its P99 "
                "per window cannot be rebuilt from the parts' (each part's file keeps its own)"
            )
    starts = {r["config"].get("start_at") for r in results}
    if len(results) > 1 and (None in starts or len(starts) > 1):
        warnings.append(
            "the parts did not share one --start-at: each timed its steps by its own start, so their windows "
            "line up only as well as their starts did (give every part the same --start-at)"
        )
    steps = [merge_steps([p[i] for p in parts], f"step {i + 1}", names) for i in range(n)]
    warnings += _uncertain_verdicts(steps, float(first["slo_p99_ms"]), rates[0])
    for i, step in enumerate(steps):
        if step.get("start_late_s", 0) > 0:
            warnings.append(
                f"step {i + 1}: a part started {step['start_late_s']:.3f} s after the slot (its previous step's "
                "answers came late): the step's first moments had less than the full load"
            )

    config = dict(first["config"])
    config["steps"] = [s.get("nominal_qps", s["offered_qps"]) for s in steps]
    if all(analysis._finite(r["config"].get("workers")) for r in results):
        config["workers"] = sum(int(r["config"]["workers"]) for r in results)
    config["merged"] = {
        "parts": names,
        "targets": [r["config"].get("target") for r in results],
        "seeds": seeds,
        "server_view_from": names[0],
    }
    # A part cut short in its ramp ran fewer steps, and only the steps every part ran are merged: the
    # merged verdicts then stop where that part stopped, not where the server failed, as a cut ramp's
    # do (bench/compare.py leaves such a result out). A cut in a refinement or a soak leaves the ramp's
    # steps whole (those steps are not merged), so the merged ramp is not cut.
    cut_parts = [i for i, r in enumerate(results) if r.get("interrupted") and _cut_phase(r["interrupted"]) == "ramp"]
    cut = [(names[i], results[i]["interrupted"]) for i in cut_parts]
    # The step the merged ramp was cut in: the next one planned, when a cut part is the one that ran fewest.
    plan = first["config"].get("steps")
    cut_short = any(len(parts[i]) == n for i in cut_parts)
    cut_at = float(plan[n]) if cut_short and isinstance(plan, list) and n < len(plan) else None
    result = analysis.ramp_result(
        steps=steps,
        slo_p99_ms=first["slo_p99_ms"],
        config=config,
        knee_threshold=thresholds[0],
        min_success_rate=rates[0],
        timeline=None,
        cut_at_qps=cut_at,
    )
    if any(r.get("balancer") for r in results):
        from wok.clients.balancer import merge_stats

        result["balancer"] = merge_stats([r.get("balancer") for r in results])
    elif any("balancer" in r for r in results):
        result["balancer"] = None  # as the parts have it: run with the grpc balancer, which counts nothing
    # Each part's pool of requests: one entry per model when they agree (the same --sizes, --rows and
    # mix, enforced above, make the same pool but where it holds draws, which follow each part's seed);
    # else kept by part, as the host probes are.
    pools = [r.get("payloads") for r in results]
    if all(p is not None and p == pools[0] for p in pools):
        result["payloads"] = pools[0]
    elif any(p is not None for p in pools):
        result["payloads_by_part"] = {name: p for p, name in zip(pools, names) if p is not None}
    if "devices" in first:  # the server's, as its view is: the first part's
        result["devices"] = first["devices"]
    if len(results) == 1 and first.get("faults"):  # a job of one process: its fault section is the run's
        result["faults"] = first["faults"]
    if len(results) == 1 and first.get("replicas"):  # ... and its replicas, which no other part can have
        result["replicas"] = first["replicas"]
    probes = {name: r["host_probe"] for r, name in zip(results, names) if r.get("host_probe") is not None}
    if probes:  # each part probed its own machine: kept side by side, never averaged
        result["host_probes"] = probes
    result["interrupted"] = (
        {
            "reason": "; ".join(f"{name}: {c['reason']}" for name, c in cut),
            "by_signal": any(bool(c.get("by_signal")) for _, c in cut),
            "phase": "ramp",
        }
        if cut
        else None
    )
    if all("stopped_early" in r for r in results):  # a part written before it may have stopped, unsaid
        result["stopped_early"] = _stopped_early(results, names, parts, n, steps)
    result["warnings"] = warnings + result["warnings"]
    result["warnings"] += [f"{name}: {w}" for r, name in zip(results, names) for w in r.get("warnings", [])]
    # The merged steps' figures are the parts' added up, so they mean what the parts' meant.
    result["schema"] = first["schema"]
    return result
