"""What metrics cost on the request path: throughput and server CPU per request, with and without.

    python bench/metrics_overhead.py [--reps 3] [--seconds 5] [--concurrency 64] [--json out.json]

Starts `wok serve --models mlp` twice per repetition, once with metrics and once with
`--no-metrics`, alternating which goes first, and drives each with the same closed loop
of one-row requests from this process. Reports medians over the repetitions and the
ratio measured side by side, plus the server's CPU seconds per request (from /proc).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import math
import os
import re
import statistics
import subprocess
import sys
import time

import grpc
import numpy as np

from wok.bench.outputs import refuse_unwritable, write_final, write_json_text
from wok.bench.payloads import integer_refusal
from wok.codec import encode_request
from wok.v2pb import grpc_service_pb2_grpc as pb_grpc

READY = re.compile(r"wok: serving .* on (\S+):(\d+)")
TICKS = os.sysconf("SC_CLK_TCK")


def start(metrics: bool) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "wok", "serve", "--models", "mlp", "--port", "0", "--metrics-port", "0"]
    if not metrics:
        cmd.append("--no-metrics")
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:
        m = READY.search(line)
        if m:
            return proc, f"{m.group(1)}:{m.group(2)}"
    raise RuntimeError("server did not start")


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


async def closed_loop(target: str, concurrency: int, seconds: float) -> int:
    req = encode_request("mlp", {"INPUT0": np.ones((1, 256), np.float32)})
    async with grpc.aio.insecure_channel(target) as ch:
        stub = pb_grpc.GRPCInferenceServiceStub(ch)
        for _ in range(50):  # warm-up
            await stub.ModelInfer(req)
        done = 0
        end = time.perf_counter() + seconds

        async def worker() -> None:
            nonlocal done
            while time.perf_counter() < end:
                await stub.ModelInfer(req)
                done += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return done


def one_run(metrics: bool, concurrency: int, seconds: float) -> dict:
    proc, target = start(metrics)
    try:
        cpu0 = cpu_seconds(proc.pid)
        t0 = time.perf_counter()
        n = asyncio.run(closed_loop(target, concurrency, seconds))
        wall = time.perf_counter() - t0
        cpu = cpu_seconds(proc.pid) - cpu0
    finally:
        proc.terminate()
        proc.wait(30)
    return {"metrics": metrics, "requests": n, "qps": n / wall, "server_cpu_us_per_request": 1e6 * cpu / n}


def build_parser() -> argparse.ArgumentParser:
    """This script's parser (tests/deploy/test_doc_commands.py parses the docs' command lines with it)."""
    from wok.cliargs import ArgumentParser  # argparse's, its refusals in wok's words

    ap = ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--json")
    return ap


def main(argv=None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    refuse_unwritable(ap, args, "--json")
    for option, value in (("--reps", args.reps), ("--concurrency", args.concurrency)):
        if (refusal := integer_refusal(option, value, 1)) is not None:
            ap.error(refusal)
    if not (args.seconds > 0 and math.isfinite(args.seconds)):
        ap.error(f"--seconds: expected a number > 0; got {args.seconds:g}")
    gc.disable()  # the load generator's own pauses would cap both runs alike, and add noise
    runs, ratios = [], []
    for rep in range(args.reps):
        pair = {}
        for metrics in (True, False) if rep % 2 == 0 else (False, True):
            r = one_run(metrics, args.concurrency, args.seconds)
            print(
                f"rep {rep + 1}/{args.reps} metrics={'on ' if metrics else 'off'} {r['qps']:8.0f} QPS "
                f"{r['server_cpu_us_per_request']:6.0f} µs CPU/request",
                file=sys.stderr,
                flush=True,
            )
            runs.append(r)
            pair[metrics] = r["qps"]
        ratios.append(pair[True] / pair[False])

    def med(metrics: bool, key: str) -> float:
        return statistics.median(r[key] for r in runs if r["metrics"] == metrics)

    report = {
        "schema": "wok.metrics_overhead/1",
        "model": "mlp",
        "concurrency": args.concurrency,
        "seconds_per_run": args.seconds,
        "reps": args.reps,
        "runs": runs,
        "median_qps_with_metrics": med(True, "qps"),
        "median_qps_without_metrics": med(False, "qps"),
        "median_qps_ratio_with_over_without": statistics.median(ratios),
        "median_cpu_us_per_request_with_metrics": med(True, "server_cpu_us_per_request"),
        "median_cpu_us_per_request_without_metrics": med(False, "server_cpu_us_per_request"),
    }
    print(f"{'':<28}{'with metrics':>14}{'without':>12}")
    print(f"{'median QPS':<28}{report['median_qps_with_metrics']:>14.0f}{report['median_qps_without_metrics']:>12.0f}")
    print(
        f"{'median server CPU µs/req':<28}{report['median_cpu_us_per_request_with_metrics']:>14.0f}"
        f"{report['median_cpu_us_per_request_without_metrics']:>12.0f}"
    )
    print(f"median ratio of paired runs (with / without): {report['median_qps_ratio_with_over_without']:.3f}")
    failed = write_final(report, [("--json", args.json, write_json_text)])
    if failed:
        print(f"metrics_overhead: {failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
