"""One executor of the demo mlp (oneDNN's layers): 200 batches of 6 one-row requests 5 ms apart,
then two batches of 24 and 32 rows (two threads on a 2-core machine), then twice 200 more; the
compute stage's median and every thread's context switches, CPU time and affinity in each block.

    .venv/bin/python docs/results/onednn-2026-11-30/pool_thread.py
"""

import os
import statistics as st
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as `wok serve` sets it, before torch loads

import numpy as np

from wok.config import InstanceConfig
from wok.executor import Executor
from wok.models import build_demo

PID = os.getpid()


def threads() -> dict[str, tuple]:
    out = {}
    for tid in sorted(os.listdir(f"/proc/{PID}/task")):
        base = Path(f"/proc/{PID}/task/{tid}")
        status = dict(line.split(":\t") for line in (base / "status").read_text().splitlines())
        run_ns = int((base / "schedstat").read_text().split()[0])
        out[tid] = (
            (base / "comm").read_text().strip(),
            int(status["voluntary_ctxt_switches"]),
            int(status["nonvoluntary_ctxt_switches"]),
            run_ns,
            sorted(os.sched_getaffinity(int(tid))),
        )
    return out


s = build_demo("mlp")
ex = Executor(s, InstanceConfig(count=1, devices=("cpu",)), cpu_linear="onednn")
inst = ex.instances[0]
one = {"INPUT0": np.zeros((1, 256), np.float32)}
for n in (1, 4, 8, 16):
    inst.submit([one] * n, [1] * n, 0).result()


def block(tag: str) -> None:
    before = threads()
    compute = []
    for _ in range(200):
        time.sleep(0.005)
        compute.append(inst.submit([one] * 6, [1] * 6, 0).result().times.compute)
    after = threads()
    print(f"{tag}: compute median {1e6 * st.median(compute):.0f} us over 200 batches of 6 rows")
    for tid, (comm, vol, invol, run_ns, aff) in after.items():
        _, vol0, invol0, run0, _ = before.get(tid, (comm, 0, 0, 0, aff))
        new = "" if tid in before else " (new)"
        print(
            f"  {tid} {comm:10s} voluntary {vol - vol0:4d} involuntary {invol - invol0:4d} "
            f"cpu {(run_ns - run0) / 1e6:7.1f} ms affinity {aff}{new}"
        )


block("before any 2-thread batch")
for n in (24, 32):
    inst.submit([one] * n, [1] * n, 0).result()
block("after a 24- and a 32-row batch")
block("again")
ex.shutdown()
