"""A worker's memory over a long share (a soak sends millions of requests): what it keeps per request
is its figures, not the finished calls' tasks and tuples (about 1.3 KB a request before)."""

from __future__ import annotations

import gc
import time
import tracemalloc

import numpy as np

from wok.bench.workers import Share, _run_share


class _Answering:
    """A call that answers at once: the worker's own bookkeeping is what is measured."""

    def __call__(self, payload: bytes, timeout=None, metadata=None):
        async def call():
            return None

        return call()


async def _peak_bytes(n: int) -> int:
    # 0.1 ms apart: the loop turns between sends, so each call ends before the next few are sent.
    share = Share(time.monotonic() + 0.05, np.arange(n) * 1e-4, np.zeros(n, dtype=np.int64), 5.0)
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        outcome = await _run_share(_Answering(), [b"x"], share)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert outcome.codes.tolist() == [0] * n and not np.isnan(outcome.done).any()
    assert outcome.inflight.shape == (2 * n, 2)
    return peak - base


async def test_a_worker_keeps_under_400_bytes_a_request_however_many_it_sends():
    small, large = 2_000, 12_000
    # The least of three runs each: a stall of the host (a busy CI machine) leaves the sends due
    # meanwhile to go at once, each call in flight holding ~1.2 KB until it ends.
    peaks = {n: min([await _peak_bytes(n) for _ in range(3)]) for n in (small, large)}
    per_request = (peaks[large] - peaks[small]) / (large - small)
    # Its arrays: sent, done, host lag (8 bytes each), code (2), two in-flight samples (32): 58.
    assert per_request < 400, f"{per_request:.0f} bytes held per request sent"
