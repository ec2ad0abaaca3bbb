"""A request whose deadline has already passed is refused at arrival under the fixed policy, as
under the slo one (tests/server/test_slo_policy.py): it never takes queue space."""

from __future__ import annotations

import re
import time

import numpy as np
import pytest

from wok.batcher import Batcher, BatchingPolicy
from wok.errors import DeadlineExceeded
from wok.stats import ModelStats

PASSED = r"request to model 'gated' arrived \d+\.\d ms after its deadline passed; it was not queued"


def submit(b: Batcher, value: float, deadline=None, priority=None):
    return b.submit({"INPUT0": np.full((1, 4), value, np.float32)}, 1, None, deadline, priority)


async def test_the_fixed_policy_refuses_a_passed_deadline_at_arrival_and_the_queue_never_holds_it(gated):
    # A delay window of a minute and batches of 2: a request that were queued would sit there, and
    # fill the batch of the live one queued before it.
    s, m, ex = gated(max_batch_size=2, delay_ms=60_000)
    cfg = s.config
    b = Batcher(cfg.name, ex, BatchingPolicy(cfg.max_batch_size, 60.0), ModelStats(cfg.name))
    assert b.slo is None
    b.start()
    with pytest.raises(DeadlineExceeded) as info:
        submit(b, 9.0, deadline=time.perf_counter())
    assert re.fullmatch(PASSED, str(info.value)) and not hasattr(info.value, "retry_after_s")
    assert b.queued == 0 and b.stats.fail.count == 1
    first = submit(b, 1.0)
    # Behind a queued request, and at the most urgent level: refused all the same.
    with pytest.raises(DeadlineExceeded, match=f"^{PASSED}$"):
        submit(b, 9.0, deadline=0.0, priority=1)
    assert b.queued == 1 and b._queues[b._keys[None]].samples == 1 and b.stats.fail.count == 2
    second = submit(b, 2.0)  # the batch's second request is this one, not an expired one
    outs = [await p.future for p in (first, second)]
    for value, out in zip((1.0, 2.0), outs):
        np.testing.assert_array_equal(out["OUTPUT0"], np.full((1, 4), 2 * value, np.float32))
    assert m.batch_sizes == [2] and b.stats.flushes == {"size": 1}
    assert b.stats.inference_count == 2 and b.stats.fail.count == 2
    await b.stop()
    assert b.queued == 0 and b.inflight == 0
