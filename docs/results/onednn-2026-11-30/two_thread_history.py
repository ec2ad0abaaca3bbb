"""Does a model worker that has once run a batch on two threads run its small batches slower?

Four executors of the demo mlp in one process: oneDNN's and torch's linear layers, each with a
worker whose first batches included 24 and 32 rows (two threads on a 2-core machine) or only up
to 16 (one thread). Then batches of 1, 6 and 12 one-row requests, 5 ms apart, the four taking
turns; compute stage medians (µs), two rounds.

    .venv/bin/python docs/results/onednn-2026-11-30/two_thread_history.py [--order fixed|shuffled]

`--order fixed` (the first version, output in two-thread-history.txt) always ran the four in
the same order, so each executor's batch followed the same other one: the "once on 2 threads"
executors followed the other kernel family's batch, the "1 only" ones their own family's, with
its code and buffers still in the caches. `--order shuffled` (the default) draws the order anew
for every turn (output in two-thread-history-shuffled.txt).
"""

import argparse
import os
import statistics as st
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as `wok serve` sets it, before torch loads

import numpy as np

from wok.config import InstanceConfig
from wok.executor import Executor
from wok.models import build_demo

parser = argparse.ArgumentParser()
parser.add_argument("--order", choices=("fixed", "shuffled"), default="shuffled")
args = parser.parse_args()

s = build_demo("mlp")
cfg = InstanceConfig(count=1, devices=("cpu",))
one = {"INPUT0": np.zeros((1, 256), np.float32)}
exs = {}
for mode in ("onednn", "torch"):
    for hist in ("2thr", "1thr"):
        ex = Executor(s, cfg, cpu_linear=mode)
        inst = ex.instances[0]
        sizes = [1, 4, 8, 16, 24, 32] if hist == "2thr" else [1, 4, 8, 16]
        for n in sizes:
            inst.submit([one] * n, [1] * n, 0).result()
        exs[f"{mode}-{hist}"] = ex
rng = np.random.default_rng(0)
names = list(exs)
for _round in range(2):
    for n in (1, 6, 12):
        reqs = [{"INPUT0": rng.standard_normal((1, 256), dtype=np.float32)} for _ in range(n)]
        c = {k: [] for k in exs}
        for _ in range(150):
            order = names if args.order == "fixed" else list(rng.permutation(names))
            for k in order:
                time.sleep(0.005)
                r = exs[k].instances[0].submit(reqs, [1] * n, 0).result()
                c[k].append(r.times.compute)
        print(n, {k: round(st.median(v) * 1e6) for k, v in c.items()}, flush=True)
for ex in exs.values():
    ex.shutdown()
