"""How fast the host is at this moment: a reading to set beside a benchmark's, not a benchmark.

On a shared virtual machine the same server's figures drift: wok's CPU per request at a fixed
100 QPS went from about 750 to 1,550 µs between repetitions minutes apart, and its P99 with it
(docs/performance.md, "The host's speed, probed"). A tight Python loop and a back-to-back sweep
of a few MB do not follow that drift: they keep their data in the caches. What a server at low
load does is different: every few milliseconds it wakes, reads its weights from wherever the
host's other tenants and its own other work have left them, and goes idle again. The probe does
the same with numpy, in cycles of: 5 ms of sleep, a sum over a 6.3 MB buffer (the "other work",
timed: `cold_read_us`), 5 ms of sleep, the forward pass of one row through an MLP
256→1024→1024→256 (6.3 MB of fp32 weights, the demo `mlp`'s shapes: `cold_forward_us`), and the
same forward again straight after (`warm_forward_us`). The working set, 12.6 MB, is larger than
the cores' own caches, so what the reading follows is how much of the shared cache and memory
bandwidth the host leaves to this machine.

The probe runs on its own, between a benchmark's steps: it sleeps most of the time, but what it
does read would compete with a server for the same caches.
"""

from __future__ import annotations

import time

import numpy as np

SCHEMA = "wok.hostprobe/1"
SHAPES = ((256, 1024), (1024, 1024), (1024, 256))  # the demo mlp's layers


def probe(seconds: float = 2.0, gap_s: float = 0.005, *, seed: int = 0) -> dict:
    """Probe cycles for about `seconds`, each with two sleeps of `gap_s`; medians in µs.

    Returns the `wok.hostprobe/1` object: `cold_forward_us` (median of the forwards that follow
    a sleep), `cold_forward_p90_us`, `warm_forward_us` (of those straight after one),
    `cold_read_us` (of the buffer sums), `samples` (cycles), `seconds`, `gap_ms`. The first
    cycle is discarded (it pays for first touches); there is always at least one more.
    """
    if not seconds > 0:
        raise ValueError(f"host probe: seconds must be > 0, got {seconds!r}")
    if not 0 < gap_s <= seconds:
        raise ValueError(f"host probe: gap_s must be in (0, seconds={seconds:g}], got {gap_s!r}")
    rng = np.random.default_rng(seed)
    weights = [rng.standard_normal(s, dtype=np.float32) for s in SHAPES]
    buffer = rng.standard_normal(sum(a * b for a, b in SHAPES), dtype=np.float32)
    x = rng.standard_normal((1, SHAPES[0][0]), dtype=np.float32)

    def forward() -> None:
        h = x
        for w in weights:
            h = np.maximum(h @ w, 0.0)

    clock = time.perf_counter
    rows: list[tuple[float, float, float]] = []
    end = clock() + seconds
    while len(rows) < 2 or clock() < end:
        time.sleep(gap_s)
        t0 = clock()
        buffer.sum()
        t1 = clock()
        time.sleep(gap_s)
        t2 = clock()
        forward()
        t3 = clock()
        forward()
        t4 = clock()
        rows.append((t1 - t0, t3 - t2, t4 - t3))
    read, cold, warm = (np.array(rows[1:]) * 1e6).T
    return {
        "schema": SCHEMA,
        "seconds": seconds,
        "gap_ms": gap_s * 1e3,
        "samples": len(cold),
        "cold_forward_us": float(np.median(cold)),
        "cold_forward_p90_us": float(np.percentile(cold, 90)),
        "warm_forward_us": float(np.median(warm)),
        "cold_read_us": float(np.median(read)),
    }


def combined(readings: list[dict | None]) -> float | None:
    """One figure for a run probed before and after: the mean of the readings' cold medians."""
    cold = [r["cold_forward_us"] for r in readings if r]
    return sum(cold) / len(cold) if cold else None
