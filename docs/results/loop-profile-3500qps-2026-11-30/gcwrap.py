"""Run `wok serve ARGS` with the collector's pauses timed (gc.callbacks).

At exit, writes OUT: per generation [collections, total s, longest s], and each generation-2
collection as [seconds since start, ms, objects frozen]. From the repository root:

    python docs/results/loop-profile-3500qps-2026-11-30/gcwrap.py OUT [THRESHOLD0] -- --models mlp --port 8001
"""

import atexit
import gc
import json
import sys
import time

out = sys.argv[1]
rest = sys.argv[2:]
if rest and rest[0] != "--":
    gc.set_threshold(int(rest[0]), 10, 10)
    rest = rest[1:]
rest = rest[1:]
stats = {g: [0, 0.0, 0.0] for g in range(3)}
events = []
t0 = [0.0]
start = time.perf_counter()


def on_gc(phase, info):
    if phase == "start":
        t0[0] = time.perf_counter()
        return
    d = time.perf_counter() - t0[0]
    s = stats[info["generation"]]
    s[0] += 1
    s[1] += d
    s[2] = max(s[2], d)
    if info["generation"] == 2:
        events.append((round(time.perf_counter() - start, 3), round(d * 1e3, 2), gc.get_freeze_count()))


def write():
    doc = {"wall_s": time.perf_counter() - start, "threshold": gc.get_threshold(), "gen": stats, "gen2": events}
    with open(out, "w") as f:
        json.dump(doc, f)


gc.callbacks.append(on_gc)
atexit.register(write)

# As the `wok` command runs (pyproject's console script, wok.entry:main), with its gRPC environment set before grpc
# loads; wok.__main__.main alone left gRPC core's logging on. After the callback, so start-up collections count.
from wok.entry import main  # noqa: E402

sys.argv = ["wok", "serve", *rest]
sys.exit(main())
