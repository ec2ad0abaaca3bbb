"""A 6-row forward of the demo mlp (wok's oneDNN copy, one thread) after different pauses and reads.

    .venv/bin/python docs/results/lean-worker-2026-12-01/forward_after.py > forward_after.txt

CPU and wall time of the forward, medians of 400 rounds; each round runs every case in turn.
"""

import os
import statistics
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as `wok serve` sets it, before torch loads

import numpy as np
import torch

from wok.cpulinear import with_onednn_linear
from wok.models import build_demo


def timed(f) -> tuple[float, float]:
    c0, p0 = time.thread_time(), time.perf_counter()
    f()
    return time.thread_time() - c0, time.perf_counter() - p0


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def main() -> None:
    torch.set_num_threads(1)
    module, *_ = with_onednn_linear(build_demo("mlp").module_for(torch.device("cpu")))
    weights = [p.detach() for p in module.parameters()]
    x = torch.ones(6, 256)
    junk = np.ones(8 << 20, np.uint8)

    def prewarm() -> None:
        for w in weights:
            w.sum()

    cases = {
        "b2b": lambda: module(x),
        "after 1ms sleep": lambda: time.sleep(0.001),
        "after 5ms sleep": lambda: time.sleep(0.005),
        "after 8MB junk read": junk.sum,
        "junk then prewarm": lambda: (junk.sum(), prewarm()),
        "5ms sleep then prewarm": lambda: (time.sleep(0.005), prewarm()),
        "5ms sleep then spin 1ms": lambda: (time.sleep(0.005), spin(0.001)),
    }
    got: dict[str, list[tuple[float, float]]] = {k: [] for k in cases}
    with torch.inference_mode():
        for _ in range(400):
            for name, before in cases.items():
                before()
                got[name].append(timed(lambda: module(x)))
    for name, v in got.items():
        cpu = 1e6 * statistics.median(a for a, _ in v)
        wall = 1e6 * statistics.median(b for _, b in v)
        print(f"{name:28s} cpu {cpu:6.0f} us  wall {wall:6.0f} us")


if __name__ == "__main__":
    main()
