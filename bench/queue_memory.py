"""What a backlog costs the server in memory, and what `max_queue_size` keeps of it.

A `wok serve --models mlp --admin` process; its one instance slowed by an admin fault so that
nothing drains; then N calls sent at once on one channel. When every call is either queued (the
`wok_queue_depth` gauge) or already answered (the refusals past the bound), the server's RSS
is read from /proc against its RSS before the burst. The server runs with no grace period, so
that its stop at the end does not wait for the slowed batch.

    .venv/bin/python bench/queue_memory.py --requests 10000 --max-queue-size 0 --max-queue-size 4096 \\
        --json docs/results/queue-memory-2026-11-30.json
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from datetime import UTC, datetime

import grpc
import numpy as np

from wok.bench.compare import local_wok, tree_usage
from wok.bench.faults import post_fault
from wok.bench.outputs import finish_json, refuse_unwritable
from wok.bench.payloads import integer_refusal
from wok.bench.scrape import scrape
from wok.v2pb import grpc_service_pb2 as pb
from wok.v2pb import grpc_service_pb2_grpc as pb_grpc

SCHEMA = "wok.queue_memory/1"


def _rss_mib(pid: int) -> float:
    return tree_usage(pid).rss_bytes / 2**20


def _queue_depth(metrics_url: str) -> float:
    snap = scrape(metrics_url)
    if snap is None:
        raise RuntimeError(f"cannot scrape {metrics_url}")
    return snap.get("wok_queue_depth", model="mlp")


async def measure(requests: int, max_queue_size: int, settle_s: float = 1.0) -> dict:
    # No grace period: at the end the stalled batch is abandoned, not waited for.
    serve = ["--models", "mlp", "--admin", "--log-level", "ERROR", "--grace-period", "0"]
    serve += ["--demo-option", f"mlp.max_queue_size={max_queue_size}"]
    with local_wok(serve) as (target, metrics_url, pid):
        async with grpc.aio.insecure_channel(target) as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            row = np.ones((1, 256), np.float32).tobytes()
            tensor = pb.ModelInferRequest.InferInputTensor(name="INPUT0", datatype="FP32", shape=[1, 256])
            req = pb.ModelInferRequest(model_name="mlp", inputs=[tensor], raw_input_contents=[row])
            for _ in range(50):  # the answers' code paths warm, so the baseline includes them
                await stub.ModelInfer(req)
            await asyncio.sleep(settle_s)
            idle = _rss_mib(pid)
            fault = {"model": "mlp", "instance": 0, "mode": "slow", "delay_ms": 60_000, "duration_s": 120}
            post_fault(metrics_url.removesuffix("/metrics"), fault)
            calls = [asyncio.ensure_future(stub.ModelInfer(req, timeout=900)) for _ in range(requests)]
            deadline = time.monotonic() + 120
            queued = 0.0
            while time.monotonic() < deadline:
                await asyncio.sleep(0.5)
                queued = _queue_depth(metrics_url)
                answered = sum(c.done() for c in calls)
                # Everything not queued and not answered is in the stalled instance's batches.
                if queued + answered >= requests - 2 * 32 * 2:
                    break
            await asyncio.sleep(settle_s)
            queued = _queue_depth(metrics_url)
            held = _rss_mib(pid)
            codes: dict[str, int] = {}
            for c in calls:
                if c.done():
                    exc = c.exception()
                    name = "OK" if exc is None else exc.code().name
                    codes[name] = codes.get(name, 0) + 1
            for c in calls:
                c.cancel()
    return {
        "requests": requests,
        "max_queue_size": max_queue_size,
        "queued": int(queued),
        "answered_at_once": codes,
        "rss_idle_mib": round(idle, 1),
        "rss_backlog_mib": round(held, 1),
        "kib_per_queued": round((held - idle) * 1024 / queued, 1) if queued else None,
    }


def build_parser() -> argparse.ArgumentParser:
    """This script's parser (tests/deploy/test_doc_commands.py parses the docs' command lines with it)."""
    from wok.cliargs import ArgumentParser  # argparse's, its refusals in wok's words

    ap = ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=10_000, help="calls sent at once (default 10,000)")
    ap.add_argument(
        "--max-queue-size",
        type=int,
        action="append",
        help="the mlp's bound, once per run (0: none); default 0 and 4096",
    )
    ap.add_argument("--json", help="write the wok.queue_memory/1 document here")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    refuse_unwritable(ap, args, "--json")
    if (refusal := integer_refusal("--requests", args.requests, 1)) is not None:
        ap.error(refusal)
    if any(bound < 0 for bound in args.max_queue_size or ()):
        ap.error(f"--max-queue-size: expected integers >= 0 (0: none); got {args.max_queue_size}")
    runs = []
    for bound in args.max_queue_size or [0, 4096]:
        print(f"[queue_memory] {args.requests} calls, max_queue_size {bound} …", file=sys.stderr, flush=True)
        runs.append(asyncio.run(measure(args.requests, bound)))
    print(
        f"{'max_queue_size':>14} {'queued':>7} {'answered at once':>24} "
        f"{'RSS idle':>9} {'RSS backlog':>12} {'KiB/queued':>11}"
    )
    for r in runs:
        at_once = ", ".join(f"{k} {v}" for k, v in sorted(r["answered_at_once"].items())) or "none"
        print(
            f"{r['max_queue_size']:>14} {r['queued']:>7} {at_once:>24} {r['rss_idle_mib']:>9} "
            f"{r['rss_backlog_mib']:>12} {r['kib_per_queued']!s:>11}"
        )
    if args.json:
        doc = {"schema": SCHEMA, "created": datetime.now(UTC).isoformat(timespec="seconds"), "runs": runs}
        return finish_json(doc, args.json, "[queue_memory] ")
    return 0


if __name__ == "__main__":
    sys.exit(main())
