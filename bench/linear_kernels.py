"""The demo mlp's forward through torch's linear layers and through oneDNN's, side by side.

    python bench/linear_kernels.py --json linear-kernels.json

The figures behind `wok serve --cpu-linear` (server/cpulinear.py). In this process, on one
thread, as wok's CPU worker runs a small batch (torch.inference_mode, OMP_WAIT_POLICY=PASSIVE):
for each row count, `--reps` forwards back to back and `--reps` with a `--gap-ms` sleep before
each (what a batch meets after a delay window below saturation), the ways alternating within
each row count so that the host's drift hits them alike: torch's layers, wok's oneDNN chain
(rows padded as wok pads them), and, from 4 rows, oneDNN at the exact row count (what the
padding costs). Times are wall-clock µs of the
forward alone, medians (nearest-rank, the ⌈reps/2⌉-th smallest, as every percentile of one run's
samples in the bench). First, the resident memory oneDNN's kernels add: RSS after a forward
at every row count up to `--max-rows-rss` through torch, then again after the same through
oneDNN, with wok's padding.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from wok.bench.analysis import latency_summary
from wok.bench.outputs import refuse_unwritable, write_final, write_json_text
from wok.bench.payloads import integer_refusal

SCHEMA = "wok.linear_kernels/1"
ROWS = (1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32, 64, 128, 256, 512)


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def build_parser() -> argparse.ArgumentParser:
    """This script's parser (tests/deploy/test_doc_commands.py parses the docs' command lines with it)."""
    from wok.cliargs import ArgumentParser  # argparse's, its refusals in wok's words

    p = ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=100, help="timed forwards per cell (default 100)")
    p.add_argument("--gap-ms", type=float, default=5.0, help="sleep before each forward of the gap series (default 5)")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    p.add_argument("--max-rows-rss", type=int, default=32, help="row counts run for the memory reading (default 32)")
    p.add_argument("--json", type=Path)
    return p


def main(argv=None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    refuse_unwritable(p, args, "--json")
    for option, value, least in (
        ("--reps", args.reps, 1),
        ("--threads", args.threads, 1),
        ("--max-rows-rss", args.max_rows_rss, 4),
    ):
        if (refusal := integer_refusal(option, value, least)) is not None:
            p.error(refusal)
    # NaN passed `< 0`: time.sleep refused it after the first series had run; inf never wakes.
    if not (args.gap_ms >= 0 and math.isfinite(args.gap_ms)):
        p.error(f"--gap-ms: expected milliseconds >= 0; got {args.gap_ms:g}")
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import torch

    from wok.cpulinear import MIN_ROWS, chains, onednn_available, padded_rows, with_onednn_linear
    from wok.models import build_demo

    if not onednn_available():
        raise SystemExit("linear_kernels: this torch build has no oneDNN linear kernel")
    torch.set_num_threads(args.threads)
    plain = build_demo("mlp").module_for(torch.device("cpu"))
    rss_start = rss_mib()
    fast, layers, fused = with_onednn_linear(plain)
    (chain,) = chains(fast)  # the mlp's one chain: its layers, each with its ReLU or not
    linears, kernel = chain.layers, chain.kernel

    def exact(x):  # oneDNN at the batch's own row count: what the padding costs, not what wok runs
        for m, relu in linears:
            x = kernel(x, m.weight, m.bias, "none", [], "")
            if relu:  # in place after the kernel, as the chain runs it (the fused post-op loses NaN)
                x.relu_()
        return x

    ways = {"torch": plain, "onednn": fast, "onednn_exact": exact}

    def timed(module, x, gap_s: float) -> float:
        if gap_s:
            time.sleep(gap_s)
        t0 = time.perf_counter()
        module(x)
        return time.perf_counter() - t0

    with torch.inference_mode():
        # Memory first, before any oneDNN kernel exists: torch's own path at every row count,
        # then oneDNN's; the difference is what its cached kernels (and their buffers) hold.
        for n in range(1, args.max_rows_rss + 1):
            plain(torch.randn(n, 256))
        before = rss_mib()
        for n in range(MIN_ROWS, args.max_rows_rss + 1):
            fast(torch.randn(n, 256))
        after = rss_mib()
    rows_out = []
    gap = args.gap_ms / 1e3
    with torch.inference_mode():
        for n in ROWS:
            x = torch.randn(n, 256)
            for k, m in ways.items():  # build the kernels, warm the paths
                if k != "onednn_exact" or n >= MIN_ROWS:
                    for _ in range(5):
                        m(x)
            row = {"rows": n, "padded_rows": padded_rows(n) if n >= MIN_ROWS else n}
            for label, g in (("warm", 0.0), ("gap", gap)):
                timed_ways = {k: m for k, m in ways.items() if k != "onednn_exact" or n >= MIN_ROWS}
                samples = {k: [] for k in timed_ways}
                for _ in range(args.reps):
                    for k, m in timed_ways.items():
                        samples[k].append(timed(m, x, g))
                for k in timed_ways:
                    row[f"{k}_{label}_us"] = 1e6 * latency_summary(samples[k])["p50"]
            row["speedup_warm"] = row["torch_warm_us"] / row["onednn_warm_us"]
            row["speedup_gap"] = row["torch_gap_us"] / row["onednn_gap_us"]
            rows_out.append(row)
    doc = {
        "schema": SCHEMA,
        "created": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "torch": torch.__version__,
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "min_rows": MIN_ROWS,
        "layers": layers,
        "fused": fused,
        "loadavg_at_end": list(os.getloadavg()),
        "rows": rows_out,
        "rss_mib": {"start": rss_start, "before": before, "after": after, "max_rows": args.max_rows_rss},
    }
    print("  rows padded torch warm oneDNN warm     × exact warm torch gap oneDNN gap     × exact gap")
    for r in rows_out:
        ew, eg = r.get("onednn_exact_warm_us"), r.get("onednn_exact_gap_us")
        print(
            f"{r['rows']:6d} {r['padded_rows']:6d} {r['torch_warm_us']:10.0f} {r['onednn_warm_us']:11.0f} "
            f"{r['speedup_warm']:5.2f} {'' if ew is None else f'{ew:.0f}':>10s} {r['torch_gap_us']:9.0f} "
            f"{r['onednn_gap_us']:10.0f} {r['speedup_gap']:5.2f} {'' if eg is None else f'{eg:.0f}':>9s}"
        )
    print(f"µs per forward, medians of {args.reps}; gap: {args.gap_ms:g} ms sleep before each; threads {args.threads}")
    print(f"RSS {before:.0f} → {after:.0f} MiB after rows {MIN_ROWS}..{args.max_rows_rss} through oneDNN")
    failed = write_final(doc, [("--json", args.json, write_json_text)])
    if failed:
        print(f"linear_kernels: {failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
