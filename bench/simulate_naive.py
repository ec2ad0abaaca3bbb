"""THE WRONG WAY: a naive time-stepped batcher simulation, kept only to show what it gets wrong.

Nothing in wok uses this for a decision. `wok simulate` and `wok tune` use the
discrete-event simulator in `wok.bench.simulate`; this file exists for docs/simulate.md,
which sets the two side by side on the same parameters:

    .venv/bin/python -m wok.bench.simulate_naive        # prints the markdown tables

The naive simulation advances a clock by a fixed tick and, at each tick,
1. lets at most one request arrive, with probability min(1, λ·tick): the offered rate is
   capped at 1/tick, and two arrivals never share a tick, so bursts are smoothed away;
2. flushes every batch whose flush rule holds, each finishing at t + T(n), without asking
   whether the device is still running the previous one: batches overlap on one GPU, so
   the device is never a queue and latency never grows with load.
"""

from __future__ import annotations

import sys
from collections import deque

import numpy as np

from wok.bench import analysis
from wok.bench.simulate import BatcherModel, SimConfig, simulate_step


def naive_time_stepped(qps: float, duration_s: float, model: BatcherModel, tick_s: float, seed: int = 0) -> dict:
    """The wrong simulation (see the module's doc): per-tick Bernoulli arrivals, overlapping batches."""
    rng = np.random.default_rng(seed)
    ticks = round(duration_s / tick_s)
    arrives = rng.random(ticks) < min(1.0, qps * tick_s)
    queue: deque[float] = deque()
    latencies: list[float] = []
    busy = 0.0
    for k in range(ticks):
        t = k * tick_s
        if arrives[k]:
            queue.append(t)
        while queue and (len(queue) >= model.max_batch_size or t - queue[0] >= model.max_queue_delay_s):
            n = min(len(queue), model.max_batch_size)
            service = model.batch_time(n)
            latencies += [t + service - queue.popleft() for _ in range(n)]
            busy += service
    lat = analysis.latency_summary(1e3 * np.asarray(latencies))
    return {
        "offered_qps": qps,
        "arrived_qps": int(arrives.sum()) / duration_s,
        "achieved_qps": len(latencies) / duration_s,
        "p50_ms": lat["p50"],
        "p99_ms": lat["p99"],
        "device_busy": busy / duration_s,  # > 1: batches ran on top of each other
    }


def event_driven(qps: float, duration_s: float, model: BatcherModel, seed: int = 0) -> dict:
    cfg = SimConfig(model=model, steps=[qps], step_duration_s=duration_s, seed=seed)
    step = simulate_step(cfg, qps, np.random.default_rng(seed))
    return {
        "offered_qps": qps,
        "arrived_qps": step["requests"] / duration_s,
        "achieved_qps": step["achieved_qps"],
        "p50_ms": step["latency_ms"]["p50"],
        "p99_ms": step["latency_ms"]["p99"],
        "device_busy": step["utilization"],
    }


CASES = [
    # (title, model, tick, offers)
    (
        "batches of one, T = 1 ms (M/D/1; ceiling 1,000 QPS), tick 0.5 ms",
        BatcherModel(alpha_s=0.0, beta_s=1e-3, max_batch_size=1, max_queue_delay_s=0.0),
        0.5e-3,
        [300, 600, 900, 1200, 2000, 3000],
    ),
    (
        "max_batch_size 8, delay 2 ms, T(n) = 2 ms + 0.25 ms·n (ceiling 2,000 QPS), tick 0.25 ms",
        BatcherModel(alpha_s=2e-3, beta_s=0.25e-3, max_batch_size=8, max_queue_delay_s=2e-3),
        0.25e-3,
        [500, 1000, 1500, 1900, 2500, 5000],
    ),
]


def _f(x: float, spec: str) -> str:
    return "-" if x is None or not np.isfinite(x) else format(x, spec)


def markdown(duration_s: float = 60.0, seed: int = 0) -> str:
    out = []
    for title, model, tick, offers in CASES:
        out.append(f"**{title}**, {duration_s:g} s simulated per row, seed {seed}\n")
        out.append(
            "| offered QPS | arrived/s: event / naive | served/s: event / naive | P50 ms: event / naive "
            "| P99 ms: event / naive | device busy: event / naive |"
        )
        out.append("|--:|--:|--:|--:|--:|--:|")
        for q in offers:
            e = event_driven(q, duration_s, model, seed)
            n = naive_time_stepped(q, duration_s, model, tick, seed)
            out.append(
                f"| {q:,} | {e['arrived_qps']:,.0f} / {n['arrived_qps']:,.0f} "
                f"| {e['achieved_qps']:,.0f} / {n['achieved_qps']:,.0f} "
                f"| {_f(e['p50_ms'], '.2f')} / {_f(n['p50_ms'], '.2f')} "
                f"| {_f(e['p99_ms'], '.2f')} / {_f(n['p99_ms'], '.2f')} "
                f"| {100 * e['device_busy']:.0f}% / {100 * n['device_busy']:.0f}% |"
            )
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    sys.stdout.write(markdown())
