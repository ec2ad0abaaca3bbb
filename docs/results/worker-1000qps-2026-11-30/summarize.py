"""The model worker's share of a py-spy profile of `wok serve --models mlp` at 1,000 QPS:
inclusive share of the worker's busy samples (its idle wait for the next batch left out), by
Python line. Input: py-spy's raw (collapsed) output beside this file.

    .venv/bin/python docs/results/worker-1000qps-2026-11-30/summarize.py
"""

import collections
from pathlib import Path

IDLE = "_worker (concurrent/futures/thread.py:81)"  # the pool thread waiting for its next item
incl: collections.Counter = collections.Counter()
busy = 0
for line in (Path(__file__).parent / "py-spy-raw.txt").read_text().splitlines():
    stack, _, count = line.rpartition(" ")
    frames = stack.split(";")
    if "run_0" not in frames[0] or frames[-1].endswith(IDLE):
        continue
    busy += int(count)
    for frame in set(frames[1:]):
        incl[frame] += int(count)
print(f"worker busy samples: {busy}")
for frame, n in incl.most_common(30):
    print(f"{100 * n / busy:5.1f} %  {frame}")
