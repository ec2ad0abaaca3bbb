"""Where a request's time goes inside wok at a low rate: the batcher and executor in-process, per request.

    python bench/latency_breakdown.py --qps 100 --duration 20s --json breakdown.json

Builds the demo `mlp` (max batch 32, 5 ms queue delay) with wok's own Executor and Batcher on
uvloop, as `wok serve` runs them, and submits one-row requests at Poisson arrival times from the
same loop (no gRPC: the transport is what bench/compare.py's `bare` server measures). Per
request it reads the batcher's and the executor's own clocks (time.perf_counter()): submit lag
(actual minus intended submit time: this script's own pacing), queue wait, how late its batch's
delay flush left (dispatch minus head arrival minus max_queue_delay, for batches that left on
the delay), the hop to the worker thread, assemble, compute, split, and the hop back to the loop
(the future's resolution seen by the awaiting coroutine); `total` is submit to resumption.
Percentiles are over requests (batch stages: over the requests of each batch), nearest-rank: the
⌈p·n⌉-th smallest, a time some request took, as every percentile of the bench.

Run with the checkout's `wok`, or with a revision's laid out by bench/compare.py (wok@REV):
`PYTHONPATH=.bench-peers/wok@SHA python bench/latency_breakdown.py …` measures that revision's
batcher and executor (a revision without wok.timers is still paced with this checkout's, which
the editable install finds; with neither, asyncio.sleep; `paced_with` says which).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from wok.bench.arrivals import parse_duration
from wok.bench.outputs import refuse_unwritable, write_final, write_json_text

SCHEMA = "wok.latency_breakdown/1"
STAGES = ("lag", "queue", "flush_late", "hop_to_worker", "assemble", "compute", "split", "hop_back", "total")


def percentiles(values) -> dict:
    """Mean, min, P50, P90, P99 and max in ms of `values` in s; all None without any. Nearest-rank, the
    ⌈p·n⌉-th smallest, as every percentile of the bench (numpy's default interpolated between two requests)."""
    import numpy as np

    # Since wok's first bench commit, so a peer's wok@REV on PYTHONPATH has it too.
    from wok.bench.analysis import latency_summary

    a = 1e3 * np.asarray(values, dtype=float)
    a = a[np.isfinite(a)]  # as latency_summary leaves them out: min over the same samples
    if not len(a):
        return {k: None for k in ("mean", "min", "p50", "p90", "p99", "max")}
    q = latency_summary(a)
    return {"mean": q["mean"], "min": float(a.min()), **{k: q[k] for k in ("p50", "p90", "p99", "max")}}


async def measure(qps: float, duration_s: float, seed: int) -> dict:
    import numpy as np

    from wok.batcher import Batcher, BatchingPolicy
    from wok.executor import Executor
    from wok.models import build_demo
    from wok.stats import ModelStats

    try:
        from wok.timers import PreciseSleeper
    except ImportError:  # a revision before wok.timers
        PreciseSleeper = None

    s = build_demo("mlp")
    ex = Executor(s, s.config.instances)
    ex.warmup()
    inst = ex.instances[0]
    db = s.config.dynamic_batching
    delay = db.max_queue_delay_ms / 1e3
    policy = BatchingPolicy(s.config.max_batch_size, delay, tuple(db.preferred_batch_sizes), db.max_queue_size)
    b = Batcher("mlp", ex, policy, ModelStats("mlp"))
    b.start()
    batches: dict[float, tuple] = {}  # finished -> (started, assemble, compute, split)
    run_cpu = inst._run_cpu

    def recorded(*args, **kwargs):
        r = run_cpu(*args, **kwargs)
        batches[r.finished] = (r.started, r.times.assemble, r.times.compute, r.times.d2h)
        return r

    inst._run_cpu = recorded
    loop = asyncio.get_running_loop()
    rng = np.random.default_rng(seed)
    offsets = np.cumsum(rng.exponential(1.0 / qps, int(qps * duration_s)))
    x = {"INPUT0": np.ones((1, 256), np.float32)}
    key = s.batch_key(x)
    rows: list[tuple] = []

    async def one(intended: float) -> None:
        p = b.submit(x, 1, key, None)
        await p.future
        rows.append((intended, p.arrival, p.dispatched, p.finished, time.perf_counter()))

    sleeper = PreciseSleeper(loop) if PreciseSleeper is not None else None
    t0 = time.perf_counter() + 0.2
    tasks = []
    for off in offsets:
        at = t0 + off
        if sleeper is not None:
            await sleeper.until(at)
        elif at > time.perf_counter():
            await asyncio.sleep(at - time.perf_counter())
        tasks.append(loop.create_task(one(at)))
    await asyncio.gather(*tasks)
    if sleeper is not None:
        sleeper.close()
    await b.stop()
    ex.shutdown()
    flushes = dict(b.stats.flushes)

    r = np.array(rows)
    intended, arrival, dispatched, finished, resumed = r.T
    per = {k: [] for k in STAGES}
    per["lag"] = arrival - intended
    per["queue"] = dispatched - arrival
    per["hop_back"] = resumed - finished
    per["total"] = resumed - arrival
    head: dict[float, float] = {}
    for a, d in zip(arrival, dispatched):
        head[d] = min(head.get(d, a), a)
    for d, f in zip(dispatched, finished):
        started, assemble, compute, split = batches[f]
        per["hop_to_worker"].append(started - d)
        per["assemble"].append(assemble)
        per["compute"].append(compute)
        per["split"].append(split)
    # Only batches that waited out the window left on the delay (a full one would leave at once).
    late = [d - a - delay for d, a in head.items() if d - a >= delay - 1e-3]
    per["flush_late"] = late
    return {
        "requests": len(rows),
        "batches": len(head),
        "mean_batch_size": len(rows) / max(1, len(head)),
        "flushes": flushes,
        "paced_with": "wok.timers.PreciseSleeper" if sleeper is not None else "asyncio.sleep",
        "torch_threads_max": getattr(inst, "max_threads", None),
        "stages_ms": {k: percentiles(v) for k, v in per.items()},
    }


def build_parser() -> argparse.ArgumentParser:
    """This script's parser (tests/deploy/test_doc_commands.py parses the docs' command lines with it)."""
    from wok.cliargs import ArgumentParser  # argparse's, its refusals in wok's words

    p = ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--qps", type=float, default=100.0, help="Poisson arrival rate (default 100)")
    p.add_argument("--duration", default="20s", help="length of the run (default 20s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, help="write the wok.latency_breakdown/1 document here")
    return p


def main(argv=None) -> int:
    from wok.errors import quoted_name

    p = build_parser()
    args = p.parse_args(argv)
    refuse_unwritable(p, args, "--json", parents_made=True)
    if not (args.qps > 0 and math.isfinite(args.qps)):
        p.error(f"--qps: expected a rate > 0; got {args.qps:g}")
    try:
        duration_s = parse_duration(args.duration)
    except ValueError as exc:
        p.error(f"--duration: {exc}")
    if duration_s <= 0:
        p.error(f"--duration: expected a duration > 0; got {quoted_name(args.duration)}")
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as wok serve sets it, before torch loads
    import uvloop

    import wok

    result = uvloop.run(measure(args.qps, duration_s, args.seed))
    doc = {
        "schema": SCHEMA,
        "created": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "wok": str(Path(wok.__file__).resolve().parent),
        "loadavg_at_end": list(os.getloadavg()),
        "config": {"qps": args.qps, "duration_s": duration_s, "seed": args.seed, "model": "mlp"},
        **result,
    }
    print(f"{'stage':14s} {'mean':>7s} {'p50':>7s} {'p90':>7s} {'p99':>7s} {'max':>7s}  (ms; {doc['wok']})")
    for k, v in doc["stages_ms"].items():
        cells = " ".join("      -" if v[q] is None else f"{v[q]:7.3f}" for q in ("mean", "p50", "p90", "p99", "max"))
        print(f"{k:14s} {cells}")
    print(
        f"{doc['requests']} requests in {doc['batches']} batches (mean {doc['mean_batch_size']:.2f}); {doc['flushes']}"
    )
    failed = write_final(doc, [("--json", args.json, lambda doc, path: write_doc(path, doc))], parents_made=True)
    if failed:
        print(f"latency_breakdown: {failed}", file=sys.stderr)
        return 1
    return 0


def write_doc(path: Path | None, doc: dict) -> None:
    """Write a measurement document as indented JSON (nothing without a path; its folder must exist)."""
    if path is not None:
        write_json_text(doc, path)


if __name__ == "__main__":
    sys.exit(main())
