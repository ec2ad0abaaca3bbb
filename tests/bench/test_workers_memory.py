"""A worker's memory over a long share (a soak sends millions of requests): what it keeps per request
is its figures, not the finished calls' tasks and tuples (about 1.3 KB a request before); and over many
ramps (a kept worker, WorkerProcesses): what each ramp left in reference cycles is freed before the next."""

from __future__ import annotations

import asyncio
import gc
import time
import tracemalloc

import numpy as np

from wok.bench.runner import RampConfig, build_pool
from wok.bench.workers import OK, Share, WorkerPool, WorkerProcesses, _run_share


class _Answering:
    """Calls that answer at once but the share's last, which waits for `release`: while it waits, every
    other call has ended, and what the worker holds then is what it keeps per request to the end."""

    def __init__(self, n: int) -> None:
        self.n, self.calls = n, 0
        self.last_started, self.release = asyncio.Event(), asyncio.Event()

    def __call__(self, payload: bytes, timeout=None, metadata=None):
        self.calls += 1
        if self.calls < self.n:
            return self._now()
        self.last_started.set()
        return self.release.wait()

    async def _now(self) -> None:
        return None


async def _held_bytes(n: int, last_at_s: float) -> int | None:
    """What the worker holds while the share's last call waits, all others ended; None if the host
    stalled so long that some began after the last was due (then still in the worker's final wait)."""
    # Measured once the calls have ended, not as a peak: sends paced 0.1 ms apart lagged 0.25-1.6 s
    # beside a loaded suite, and the calls due meanwhile, not yet begun, held ~1.2 KB each.
    times = np.zeros(n)
    times[-1] = last_at_s
    share = Share(time.monotonic(), times, np.zeros(n, dtype=np.int64), 5.0)
    calls = _Answering(n)
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        run = asyncio.ensure_future(_run_share(calls, [b"x"], share))
        await calls.last_started.wait()
        held = tracemalloc.get_traced_memory()[0] - base
        calls.release.set()
        outcome = await run
    finally:
        tracemalloc.stop()
    assert outcome.codes.tolist() == [0] * n and not np.isnan(outcome.done).any()
    assert outcome.inflight.shape == (2 * n, 2)
    return held if np.nanmax(outcome.done[:-1]) < last_at_s else None


async def _least_held(n: int, runs: int = 3) -> int:
    # The others take under 0.5 s for 3,000 on this kind of host (tracemalloc on), 1.5 s for 12,000, 2.6 s
    # on a loaded one: a run where they did not end before the last was due is run again with it later.
    held, last_at_s = [], 0.5
    while len(held) < runs:
        if (h := await _held_bytes(n, last_at_s)) is not None:
            held.append(h)
        elif last_at_s < 16:
            last_at_s *= 2
        else:
            raise AssertionError(f"{n} sends at once did not end within {last_at_s:g} s")
    return min(held)


async def test_a_worker_keeps_under_400_bytes_a_request_however_many_it_sends():
    # 2,000 requests apart: the 400-byte bound is 800 KB there, the 1.3 KB a request kept before 2.6 MB
    # (940 bytes a request read here with finished tasks kept), and a run's reading varies by about 1 KB.
    # 2,000 and 12,000 read the same (97 bytes a request against 107-132) in 10-14 s against 3 s: the
    # larger runs' sends, 1.5 s each with tracemalloc on.
    small, large = 1_000, 3_000
    held = {n: await _least_held(n) for n in (small, large)}
    per_request = (held[large] - held[small]) / (large - small)
    # Its arrays: sent, done, host lag (8 bytes each), code (2), two in-flight samples (32): 58.
    assert per_request < 400, f"{per_request:.0f} bytes held per request sent"


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(next(line for line in f if line.startswith("VmRSS:")).split()[1])


def test_a_kept_workers_rss_stays_flat_over_ramps(bench_server):
    """A worker's collector is off for its life (its pauses would be dispatch lag), and WorkerProcesses keeps it
    from ramp to ramp: each ramp's loop, channel and calls left reference cycles, 200-290 KiB a ramp held for good
    (1.6-2.3 MiB over these 8 ramps). Collected between ramps: 0.2-0.5 MiB over the 8."""
    cfg = RampConfig(target=bench_server.target, models=[("mlp", 1.0)], steps=[100], step_duration_s=1)
    pool, _, _ = build_pool(cfg)
    requests = 300
    times = np.arange(requests) * 0.002
    rss = []
    with WorkerProcesses() as processes:
        for _ in range(10):
            workers = WorkerPool(cfg.target, pool, 1, processes=processes)
            try:
                (outcome,) = workers.run([Share(time.monotonic() + 0.05, times, np.zeros(requests, np.int64), 5.0)])
            finally:
                workers.close()
            assert outcome.codes.tolist() == [OK] * requests
            processes.take(1)  # its ping answered: the worker is back in its job loop, the ramp's end behind it
            processes.give_back()
            rss.append(_rss_kib(processes._procs[0].pid))
    # From the second ramp: the first's imports (gRPC's aio, the balancer's) stay.
    assert rss[-1] - rss[1] < 1024, rss
