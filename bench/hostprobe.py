"""How fast the host is at this moment: a reading to set beside a benchmark's, not a benchmark.

On a shared virtual machine the same server's figures drift: wok's CPU per request at a fixed
100 QPS went from about 750 to 1,550 µs between repetitions minutes apart, and its P99 with it
(docs/performance.md, "The host's speed, probed"). A tight Python loop and a back-to-back sweep
of a few MB do not follow that drift: they keep their data in the caches. What a server at low
load does is different: every few milliseconds it wakes, reads its weights from wherever the
host's other tenants and its own other work have left them, and goes idle again. The probe does
the same, in cycles of: `gap_s` of sleep, a sum over a 6.3 MB buffer (the "other work", timed:
`cold_read_us`), `gap_s` more, the forward pass of one row through an MLP 256→1024→1024→256
(6.3 MB of fp32 weights, the demo `mlp`'s shapes, through torch on one thread as wok's model
worker runs a small batch: `cold_forward_us`), and the same forward again straight after
(`warm_forward_us`). The working set, 12.6 MB, is larger than the cores' own caches, so what
the reading follows is how much of the shared cache and memory bandwidth the host leaves to
this machine.

One thread: a BLAS that runs the product on several threads keeps a helper spinning on another
core between calls (numpy's OpenBLAS did, for the whole probe), which would both load the
machine the probe is reading and time a different forward. The probe runs with the server up and
idle, before and after a ramp, never during one: what it reads competes with a server for the
same caches.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import numpy as np

from .analysis import latency_summary

SCHEMA = "wok.hostprobe/2"  # /1: numpy's forward on OpenBLAS's threads (readings of 2026-11-30)
SHAPES = ((256, 1024), (1024, 1024), (1024, 256))  # the demo mlp's layers, (in, out)


def probe(seconds: float = 2.0, gap_s: float = 0.005, *, seed: int = 0) -> dict:
    """Probe cycles for about `seconds` (at least two), each with two sleeps of `gap_s`; medians in µs,
    nearest-rank as every percentile of the bench (the ⌈p·n⌉-th smallest: a time some cycle took; readings
    written before 2026-12-05 hold numpy's, which averaged the middle two of an even count and interpolated
    the P90).

    Returns the `wok.hostprobe/2` object: `cold_forward_us` (median of the forwards that follow
    a sleep), `cold_forward_p90_us`, `warm_forward_us` (of those straight after one),
    `cold_read_us` (of the buffer sums), `samples` (cycles), `seconds`, `gap_ms`, `threads` (the
    intra-op threads the forwards ran with, read back: 1) and `torch` (its version). torch's
    thread count is process-wide: it is set back as it was before returning. The first cycle is
    discarded (it pays for first touches).
    """
    if not 0 < seconds < math.inf:
        raise ValueError(f"host probe: seconds: expected a finite number > 0; got {seconds!r}")
    if not 0 < gap_s < math.inf:
        raise ValueError(f"host probe: gap_s: expected a finite number > 0; got {gap_s!r}")
    import torch  # here, not at import: a harness that never probes need not load it
    import torch.nn.functional as F

    gen = torch.Generator().manual_seed(seed)
    layers = [(torch.randn(o, i, generator=gen), torch.randn(o, generator=gen)) for i, o in SHAPES]
    x = torch.randn(1, SHAPES[0][0], generator=gen)
    buffer = np.random.default_rng(seed).standard_normal(sum(i * o for i, o in SHAPES), dtype=np.float32)

    def forward() -> None:
        h = x
        for w, b in layers:
            h = F.relu(F.linear(h, w, b))

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    clock = time.perf_counter
    rows: list[tuple[float, float, float]] = []
    try:
        ran_on = torch.get_num_threads()  # what the forwards ran with, read back
        with torch.inference_mode():
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
    finally:
        torch.set_num_threads(threads)
    read, cold, warm = (np.array(rows[1:]) * 1e6).T
    cold_q = latency_summary(cold)
    return {
        "schema": SCHEMA,
        "seconds": seconds,
        "gap_ms": gap_s * 1e3,
        "samples": len(cold),
        "threads": ran_on,
        "torch": torch.__version__,
        "cold_forward_us": cold_q["p50"],
        "cold_forward_p90_us": cold_q["p90"],
        "warm_forward_us": latency_summary(warm)["p50"],
        "cold_read_us": latency_summary(read)["p50"],
    }


def combined(readings: list[dict | None]) -> float | None:
    """One figure for a run probed before and after: the mean of the cold medians it has (a failed
    reading, which holds `error` instead, or a missing one counts for nothing)."""
    cold = [r["cold_forward_us"] for r in readings if r and "cold_forward_us" in r]
    return sum(cold) / len(cold) if cold else None


def try_probe(seconds: float, warn: Callable[[str], None]) -> dict | None:
    """A reading for a benchmark's record: None when `seconds` is 0 (off); a probe that fails gives
    `{schema, error}` and a warning, never an exception, so that it cannot cost the benchmark its run."""
    if not seconds:
        return None
    try:
        return probe(seconds)
    except Exception as exc:
        warn(f"warning: host probe failed: {type(exc).__name__}: {exc}")
        return {"schema": SCHEMA, "error": f"{type(exc).__name__}: {exc}"}


def around(before: dict | None, after: dict | None) -> dict:
    """The record of a run probed before and after it: both readings and their `combined` figure."""
    return {"before": before, "after": after, "cold_forward_us": combined([before, after])}
