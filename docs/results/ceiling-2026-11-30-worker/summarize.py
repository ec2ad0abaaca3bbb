"""The table in README.md from the files beside it: per variant, throughput / n/(α+β·n) in each
run and its median, and the model worker's share of the window on a CPU, waiting for one, and
asleep, with its voluntary switches per batch (all of them waits for the GIL, `gil-waits.txt`).

    .venv/bin/python docs/results/ceiling-2026-11-30-worker/summarize.py
"""

import json
import re
import statistics as st
from pathlib import Path

HERE = Path(__file__).parent
groups: dict[str, list[Path]] = {}
for f in sorted(HERE.glob("*.json")):
    name = f.stem.rsplit("-", 1)[0].removeprefix("ab-").replace("rows-", "rows ")
    groups.setdefault(name, []).append(f)
print(
    "| variant | throughput / n/(α+β·n), each run | median | worker on CPU | waiting for a CPU | asleep "
    "| voluntary switches per batch |"
)
print("|---|---|--:|--:|--:|--:|--:|")
for name, files in groups.items():
    ratios, run, wait, vol_per_batch = [], [], [], []
    for f in files:
        r = json.loads(f.read_text())["result"]
        ratios.append(r["throughput_vs_ceiling"])
        line = next(x for x in f.with_suffix(".sched").read_text().splitlines() if "wok-run-0" in x)
        m = re.search(r"run\s+([\d.]+)%\s+runq-wait\s+([\d.]+)%\s+invol (\d+) vol (\d+)", line)
        run.append(float(m[1]))
        wait.append(float(m[2]))
        # the sampler's 8 s window, batches at the run's mean rate
        vol_per_batch.append(int(m[4]) / (8.0 * r["batches"] / r["window_s"]))
    busy = st.median(json.loads(f.read_text())["result"]["busy_fraction"] for f in files) * 100
    each = ", ".join(f"{100 * x:.1f}" for x in ratios)
    print(
        f"| {name} | {each} | {100 * st.median(ratios):.1f} % | {st.median(run):.1f} % | {st.median(wait):.1f} % "
        f"| {busy - st.median(run) - st.median(wait):.1f} % | {st.median(vol_per_batch):.1f} |"
    )
