"""Does a model worker that has once run a batch on two threads run its small batches slower?

Four executors of the demo mlp in one process: oneDNN's and torch's linear layers, each with a
worker whose first batches included 24 and 32 rows (two threads on a 2-core machine) or only up
to 16 (one thread). Then batches of 1, 6 and 12 one-row requests, 5 ms apart, the four
alternating; compute stage medians (µs), two rounds.
    .venv/bin/python docs/results/onednn-2026-11-30/two_thread_history.py
"""

import os
import statistics as st
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as `wok serve` sets it, before torch loads

import numpy as np

from wok.config import InstanceConfig
from wok.executor import Executor
from wok.models import build_demo

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
for _round in range(2):
    for n in (1, 6, 12):
        reqs = [{"INPUT0": rng.standard_normal((1, 256), dtype=np.float32)} for _ in range(n)]
        c = {k: [] for k in exs}
        for _ in range(150):
            for k, ex in exs.items():
                time.sleep(0.005)
                r = ex.instances[0].submit(reqs, [1] * n, 0).result()
                c[k].append(r.times.compute)
        print(n, {k: round(st.median(v) * 1e6) for k, v in c.items()})
for ex in exs.values():
    ex.shutdown()
