"""The demo mlp's forward time by batch size on 1 and on T intra-op threads, back to back and 5 ms apart.

    python bench/thread_sizing.py --json thread-sizing.json

The figures behind the executor's rule (a batch of n runs on ceil(n·T/max_batch_size) threads)
and behind docs/performance.md's cold-batch discussion. In this process, on its main thread,
as wok's worker runs the model (torch.inference_mode, OMP_WAIT_POLICY=PASSIVE as `wok serve`
sets it, its linear layers as `--cpu-linear` says): for each batch size, `--reps` timed
forwards with no gap ("warm": the weights stay in the caches) and with a 5 ms sleep before
each ("cold": what a batch meets after a delay window below saturation). A third series at
n = 1 reads every weight tensor `--touch-lead` before the forward (a prefetch; its own time is
reported beside the forward's). Times are wall-clock µs of the forward alone: p50 and p99
over the reps, nearest-rank (the ⌈p·n⌉-th smallest: a time some forward took, as every percentile
of the bench; numpy's median and percentile interpolated between two).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from wok.bench.outputs import refuse_unwritable, write_final
from wok.bench.payloads import integer_refusal

SCHEMA = "wok.thread_sizing/1"
SIZES = (1, 2, 4, 8, 16, 32)


def build_parser() -> argparse.ArgumentParser:
    """This script's parser (tests/deploy/test_doc_commands.py parses the docs' command lines with it)."""
    from wok.cliargs import ArgumentParser  # argparse's, its refusals in wok's words

    p = ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=200, help="timed forwards per cell (default 200)")
    p.add_argument("--gap-ms", type=float, default=5.0, help="sleep before each cold forward (default 5)")
    p.add_argument("--touch-lead-ms", type=float, default=1.0, help="prefetch lead for the touch series (default 1)")
    p.add_argument(
        "--cpu-linear",
        choices=("onednn", "torch"),
        default="onednn",
        help="how the linear layers run, as `wok serve --cpu-linear` (default onednn; files before it: torch)",
    )
    p.add_argument("--json", type=Path)
    return p


def main(argv=None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    refuse_unwritable(p, args, "--json", parents_made=True)
    if (refusal := integer_refusal("--reps", args.reps, 1)) is not None:
        p.error(refusal)
    if not (args.gap_ms >= 0 and math.isfinite(args.gap_ms)):
        p.error(f"--gap-ms: expected milliseconds >= 0; got {args.gap_ms:g}")
    # The touch series sleeps gap - lead before its read: a lead past the gap cannot be slept.
    if not (args.touch_lead_ms > 0 and (args.touch_lead_ms <= args.gap_ms or args.gap_ms == 0)):
        p.error(
            f"--touch-lead-ms: expected milliseconds > 0 and <= --gap-ms ({args.gap_ms:g}); got {args.touch_lead_ms:g}"
        )
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import numpy as np
    import torch

    from wok.bench.analysis import latency_summary
    from wok.bench.latency_breakdown import write_doc
    from wok.models import build_demo

    threads = torch.get_num_threads()
    module = build_demo("mlp").module_for(torch.device("cpu"))
    weights = [w.detach() for w in module.parameters()]
    onednn_layers = 0
    if args.cpu_linear == "onednn":
        from wok.cpulinear import with_onednn_linear

        module, onednn_layers, _ = with_onednn_linear(module)

    def forward(x):
        with torch.inference_mode():
            module(x)

    def touch():
        with torch.inference_mode():
            for w in weights:
                w.sum()

    def series(n: int, t: int, gap_s: float, lead_s: float = 0.0) -> dict:
        torch.set_num_threads(t)
        x = torch.ones(n, 256)
        fwd, pre = [], []
        for _ in range(args.reps + 10):
            if gap_s:
                time.sleep(gap_s - lead_s)
            if lead_s:
                t0 = time.perf_counter()
                touch()
                spent = time.perf_counter() - t0
                pre.append(spent)
                time.sleep(max(lead_s - spent, 0.0))
            t0 = time.perf_counter()
            forward(x)
            fwd.append(time.perf_counter() - t0)
        q = latency_summary(1e6 * np.array(fwd[10:]))
        out = {"n": n, "threads": t, "gap_ms": 1e3 * gap_s, "p50_us": q["p50"], "p99_us": q["p99"]}
        if lead_s:
            out["touch_lead_ms"] = 1e3 * lead_s
            out["touch_p50_us"] = latency_summary(1e6 * np.array(pre[10:]))["p50"]
        return out

    forward(torch.ones(32, 256))
    rows = []
    gap = args.gap_ms / 1e3
    for g in (0.0, gap):
        for n in SIZES:
            for t in sorted({1, threads}):
                rows.append(series(n, t, g))
    touched = series(1, 1, gap, args.touch_lead_ms / 1e3)
    torch.set_num_threads(threads)
    doc = {
        "schema": SCHEMA,
        "created": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "torch": torch.__version__,
        "threads_default": threads,
        "onednn_layers": onednn_layers,
        "loadavg_at_end": list(os.getloadavg()),
        "config": vars(args) | {"json": str(args.json) if args.json else None},
        "rows": rows,
        "touch": touched,
    }
    print(f"{'gap':>5s} {'n':>3s} {'threads':>7s} {'p50 µs':>7s} {'p99 µs':>7s}")
    for r in rows:
        print(f"{r['gap_ms']:5.0f} {r['n']:3d} {r['threads']:7d} {r['p50_us']:7.0f} {r['p99_us']:7.0f}")
    print(
        f"n=1, 1 thread, weights read {touched['touch_lead_ms']:g} ms before: forward p50 {touched['p50_us']:.0f} "
        f"p99 {touched['p99_us']:.0f} µs (the read itself {touched['touch_p50_us']:.0f} µs)"
    )
    failed = write_final(doc, [("--json", args.json, lambda doc, path: write_doc(path, doc))], parents_made=True)
    if failed:
        print(f"thread_sizing: {failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
