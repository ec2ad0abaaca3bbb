"""How much of the CPU model worker's cost per batch is wok's own Python around the forward?

    .venv/bin/python docs/results/lean-worker-2026-12-01/lean_worker.py --rows 6 --reps 10 [--prewarm] \
        --json docs/results/lean-worker-2026-12-01/rows6.json

Runs the demo mlp's batches of `--rows` rows, 5 ms apart (a server's queue delay window at 1,000
QPS), alternately through wok's own Instance (the server's path: its thread pool, deadlines,
assembly into the slot's buffers, thread sizing, fault hook, output alias check, split) and
through the leanest worker that does the same work: one thread that holds inference mode, copies
the rows into one buffer, runs the same module (wok's oneDNN copy), and slices the output. Each
repetition runs both, in alternating order; the figure is each thread's CPU per batch from /proc.
With `--prewarm`, each batch is preceded 1 ms earlier by a read of the weights on the same
thread, as the batcher does below saturation.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import ctypes
import json
import os
import queue
import statistics
import sys
import threading
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as `wok serve` sets it, before torch loads

import numpy as np
import torch

from wok.bench.cold_batch import thread_cpu_s, worker_tid
from wok.config import InstanceConfig
from wok.executor import Executor
from wok.models import build_demo


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=6)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--batches", type=int, default=200, help="batches per repetition and path")
    p.add_argument("--prewarm", action="store_true")
    p.add_argument("--json")
    args = p.parse_args()
    n, gap = args.rows, 0.005
    servable = build_demo("mlp")
    (inp,) = servable.config.inputs
    ex = Executor(servable, InstanceConfig(count=1, devices=("cpu",), pipeline_depth=1))
    inst = ex.instances[0]
    reqs = [{inp.name: np.ones((1, *inp.dims), np.float32)} for _ in range(n)]
    rows = [1] * n
    module, work = inst.module, queue.SimpleQueue()

    def lean() -> None:
        torch.set_num_threads(1)  # wok runs a batch of up to 16 rows on one thread
        ctypes.CDLL(None).prctl(15, b"lean", 0, 0, 0)
        buf = np.empty((n, *inp.dims), np.float32)
        with torch.inference_mode():
            while (item := work.get()) is not None:
                r, fut = item
                if r == "warm":
                    for w in module.parameters():
                        w.sum()
                    fut.set_result(None)
                    continue
                for i, d in enumerate(r):
                    buf[i] = d[inp.name][0]
                a = module(torch.from_numpy(buf)).numpy()
                fut.set_result([a[i : i + 1].copy() for i in range(n)])

    def lean_submit(r):
        f = cf.Future()
        work.put((r, f))
        return f

    thread = threading.Thread(target=lean, daemon=True)
    thread.start()
    for _ in range(30):
        inst.submit(reqs, rows, 0).result()
        lean_submit(reqs).result()
    tids = {"wok": worker_tid("wok-run-0"), "lean": worker_tid("lean")}

    def run(kind: str) -> float:
        c0 = thread_cpu_s(tids[kind])
        for _ in range(args.batches):
            time.sleep(gap - (1e-3 if args.prewarm else 0))
            if args.prewarm:
                inst.prewarm() if kind == "wok" else lean_submit("warm")
                time.sleep(1e-3)
            (inst.submit(reqs, rows, 0) if kind == "wok" else lean_submit(reqs)).result()
        return 1e6 * (thread_cpu_s(tids[kind]) - c0) / args.batches

    reps = []
    for rep in range(args.reps):
        got = {}
        for kind in ("wok", "lean") if rep % 2 == 0 else ("lean", "wok"):
            got[kind] = run(kind)
        reps.append(got)
    work.put(None)
    thread.join()
    ex.shutdown()
    wok_us = statistics.median(r["wok"] for r in reps)
    lean_us = statistics.median(r["lean"] for r in reps)
    diff = statistics.median(r["wok"] - r["lean"] for r in reps)
    print(
        f"rows {n}, prewarm {args.prewarm}: CPU per batch, median of {args.reps}: "
        f"wok {wok_us:.0f} µs, lean {lean_us:.0f} µs;"
    )
    print(
        f"  wok − lean paired {diff:+.0f} µs (wok higher in {sum(r['wok'] > r['lean'] for r in reps)} of {args.reps})"
    )
    if args.json:
        doc = {
            "schema": "wok.lean_worker/1",
            "config": vars(args),
            "reps": reps,
            "median_us": {"wok": wok_us, "lean": lean_us, "paired_difference": diff},
        }
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
