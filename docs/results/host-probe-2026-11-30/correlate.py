"""Rank correlation of the host probe with each server's figures in a wok.compare/1 document.

Usage: python correlate.py COMPARE.json [QPS ...]   (default QPS: the document's report_at_qps)
Prints, per server and rate, Spearman's rho (ties averaged) of the run's `host_probe.cold_forward_us`
against its P99 and its server CPU per request, each with a one-sided permutation p-value (the share
of 20,000 shufflings with a rho at least as high), and the figures' medians in the runs whose probe was
at or below, and above, the median probe.
"""

import json
import statistics
import sys

import numpy as np


def ranks(a):
    a = np.asarray(a, dtype=float)
    order = a.argsort()
    r = np.empty(len(a))
    r[order] = np.arange(len(a))
    for v in np.unique(a):  # ties share their mean rank
        r[a == v] = r[a == v].mean()
    return r


def rho(a, b):
    return float(np.corrcoef(ranks(a), ranks(b))[0, 1])


def p_above(a, b, shuffles=20_000, seed=0):
    """One-sided permutation p-value: how often shuffled pairs give a rho at least the observed."""
    rng = np.random.default_rng(seed)
    ra, rb = ranks(a), ranks(b)
    seen = np.corrcoef(ra, rb)[0, 1]
    hits = sum(np.corrcoef(ra, rng.permutation(rb))[0, 1] >= seen - 1e-12 for _ in range(shuffles))
    return hits / shuffles


def main() -> None:
    with open(sys.argv[1]) as f:
        doc = json.load(f)
    rates = [float(q) for q in sys.argv[2:]] or doc["config"]["report_at_qps"]
    for server in doc["config"]["servers"]:
        runs = [r for r in doc["runs"] if r["server"] == server and not r["error"]]
        runs = [r for r in runs if (r.get("host_probe") or {}).get("cold_forward_us") is not None]
        if len(runs) < 3:
            sys.exit(f"{server}: {len(runs)} runs with a host probe reading; expected at least 3")
        probe = [r["host_probe"]["cold_forward_us"] for r in runs]
        cut = statistics.median(probe)
        print(f"{server}: {len(runs)} runs, probe median {cut:.0f} µs ({min(probe):.0f}–{max(probe):.0f})")
        for q in rates:
            steps = [next((s for s in r["steps"] if s["offered_qps"] == q), None) for r in runs]
            if None in steps:
                sys.exit(f"{server}: a run has no step at {q:g} QPS (its ramp stopped before it)")
            p99 = [s["latency_ms"]["p99"] for s in steps]
            cpu = [s["server_cpu"]["us_per_request"] for s in steps]
            low = [i for i, p in enumerate(probe) if p <= cut]
            high = [i for i, p in enumerate(probe) if p > cut] or low  # every probe equal: one half
            med = lambda xs, idx: statistics.median(xs[i] for i in idx)  # noqa: E731
            print(
                f"  {q:>6g} QPS  rho(probe, P99) {rho(probe, p99):+.2f} (p {p_above(probe, p99):.3f})"
                f"  rho(probe, CPU) {rho(probe, cpu):+.2f} (p {p_above(probe, cpu):.3f})"
                f"  | probe ≤ median: P99 {med(p99, low):.2f} ms, CPU {med(cpu, low):.0f} µs"
                f"  | above: P99 {med(p99, high):.2f} ms, CPU {med(cpu, high):.0f} µs"
            )


if __name__ == "__main__":
    main()
