"""The demo mlp's forward after idling, with its weights on 4 KiB pages or on 2 MiB huge pages (ad hoc).

Usage: python huge_weights.py plain|huge|thp-env   (thp-env: run with THP_MEM_ALLOC_ENABLE=1 in the
environment, torch's own switch, which madvises its allocations of 2 MiB or more)
`huge` copies every parameter into one anonymous mapping advised MADV_HUGEPAGE (the machine's THP
mode is `madvise`) and points the parameters at it. Each cell: 150 forwards of n rows on one thread,
each after 5 ms of sleep, a 6.3 MB read and 5 ms more (`cold`), and one straight after (`warm`);
prints one JSON line: medians and the cold P90 in µs, and the process's AnonHugePages.
"""

import json
import mmap
import os
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as `wok serve` sets it, before torch loads

import numpy as np
import torch

from wok.models import build_demo

HUGE = 2 << 20


def onto_huge_pages(module: torch.nn.Module) -> None:
    params = list(module.parameters())
    total = sum(p.numel() * p.element_size() for p in params)
    size = -(-total // HUGE) * HUGE + HUGE  # room to align the start
    area = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    raw = torch.frombuffer(area, dtype=torch.uint8)
    start = (-raw.data_ptr()) % HUGE
    area.madvise(mmap.MADV_HUGEPAGE, start, size - start)
    flat = raw[start : start + total].view(torch.float32)
    at = 0
    with torch.no_grad():
        for p in params:
            view = flat[at : at + p.numel()].view_as(p)
            view.copy_(p)
            p.data = view
            at += p.numel()
    module._huge_area = area  # keep the mapping alive as long as the module


def anon_huge_kb() -> int:
    with open("/proc/self/smaps_rollup") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("AnonHugePages"))


def main() -> None:
    mode = sys.argv[1]
    torch.set_num_threads(1)
    module = build_demo("mlp").module_for(torch.device("cpu"))
    if mode == "huge":
        onto_huge_pages(module)
    other = np.random.rand(6_300_000 // 8)
    cells = {}
    with torch.inference_mode():
        for n in (1, 6, 16):
            x = torch.randn(n, 256)
            module(x)
            cold, warm = [], []
            for _ in range(150):
                time.sleep(0.005)
                other.sum()
                time.sleep(0.005)
                t0 = time.perf_counter()
                module(x)
                t1 = time.perf_counter()
                module(x)
                warm.append(time.perf_counter() - t1)
                cold.append(t1 - t0)
            us = np.array([cold, warm]) * 1e6
            cells[n] = {
                "cold_us": float(np.median(us[0])),
                "cold_p90_us": float(np.percentile(us[0], 90)),
                "warm_us": float(np.median(us[1])),
            }
    print(json.dumps({"mode": mode, "anon_huge_kb": anon_huge_kb(), "rows": cells}), flush=True)


if __name__ == "__main__":
    main()
