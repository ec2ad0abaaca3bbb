"""Client CPU per call: wok's balancer against gRPC's round_robin channel, side by side.

    python bench/balancer_overhead.py --requests 20000 --inflight 32 --rounds 3 --json overhead.json

Starts `--servers` bare-transport servers (bench/peers/bare_server.py: a prebuilt answer, no
model) on loopback, then, alternating which goes first, sends the same pre-serialized
one-row ModelInfer requests closed loop with `--inflight` outstanding from this process:
through one grpc.aio channel with round_robin, health checking and retries
(`--balancer grpc`'s channel), and through `wok.clients.balancer.Balancer` with its defaults
(`--balancer wok`). It reports this process's CPU time per call (`time.process_time`: every
thread, gRPC's included; the servers are other processes), throughput, P50/P99 of the calls,
and the balancer's hedges. Closed loop on a healthy fleet: what the balancer's bookkeeping
costs a client, not what it saves when a replica misbehaves (docs/reliability.md).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import subprocess
import sys
import time
from pathlib import Path

from wok.bench.analysis import latency_summary
from wok.bench.outputs import finish_json, refuse_unwritable
from wok.bench.payloads import integer_refusal
from wok.bench.report import bench_header

SCHEMA = "wok.balancer_overhead/1"
INFER = "/inference.GRPCInferenceService/ModelInfer"
BARE = Path(__file__).resolve().parent / "peers" / "bare_server.py"
KINDS = ("grpc", "wok")


async def closed_loop(call, payload: bytes, n: int, inflight: int) -> list[float]:
    """Send `n` calls with `inflight` outstanding; each call's latency in seconds."""
    left = n
    latencies: list[float] = []

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            t0 = time.perf_counter()
            await call(payload, timeout=30)
            latencies.append(time.perf_counter() - t0)

    await asyncio.gather(*(worker() for _ in range(min(inflight, n))))
    return latencies


async def measure(kind: str, targets: list[str], payload: bytes, n: int, inflight: int, warmup: int) -> dict:
    """One run through `kind`'s channel: CPU per call, throughput, P50/P99, hedges."""
    import grpc

    from wok.clients.balancer import Balancer
    from wok.clients.channel import channel_options, channel_target, open_channel

    async with contextlib.AsyncExitStack() as stack:
        if kind == "wok":
            balancer = await stack.enter_async_context(Balancer(targets))
            call, stats = balancer.unary_unary(INFER), balancer.stats
        else:
            channel = open_channel(grpc.aio, channel_target(targets), None, channel_options(None))
            stack.push_async_callback(channel.close)
            call, stats = channel.unary_unary(INFER), lambda: None
        await closed_loop(call, payload, warmup, inflight)
        before = stats()
        cpu0, t0 = time.process_time(), time.perf_counter()
        latencies = await closed_loop(call, payload, n, inflight)
        cpu_s, wall_s = time.process_time() - cpu0, time.perf_counter() - t0
        after = stats()
    return summarize(kind, latencies, cpu_s, wall_s, before, after)


def summarize(kind: str, latencies: list[float], cpu_s: float, wall_s: float, before, after) -> dict:
    """The figures of one run; percentiles nearest-rank, as the bench's (analysis.latency_summary)."""
    n = len(latencies)
    ms = latency_summary([1e3 * s for s in latencies])
    out = {
        "kind": kind,
        "requests": n,
        "client_cpu_us_per_request": 1e6 * cpu_s / n,
        "throughput_rps": n / wall_s,
        "p50_ms": ms["p50"],
        "p99_ms": ms["p99"],
    }
    if before is not None and after is not None:
        out["hedges"] = after["hedges"] - before["hedges"]
        out["attempts"] = after["attempts"] - before["attempts"]
    return out


@contextlib.contextmanager
def bare_servers(n: int):
    """`n` bare-transport servers on free loopback ports; yields their targets."""
    from wok.bench.compare import free_port

    procs, targets = [], []
    try:
        for _ in range(n):
            port = free_port()
            procs.append(
                subprocess.Popen(
                    [sys.executable, str(BARE), str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
                )
            )
            targets.append(f"127.0.0.1:{port}")
        yield targets
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


async def wait_serving(targets: list[str], timeout: float = 60.0) -> None:
    import grpc

    for t in targets:
        async with grpc.aio.insecure_channel(t) as ch:
            await asyncio.wait_for(ch.channel_ready(), timeout)


async def run_all(targets: list[str], payload: bytes, args) -> list[dict]:
    """The rounds, alternating which kind goes first; prints each run as it ends."""
    await wait_serving(targets)
    runs = []
    for r in range(args.rounds):
        for kind in KINDS if r % 2 == 0 else KINDS[::-1]:
            m = await measure(kind, targets, payload, args.requests, args.inflight, 500) | {"round": r + 1}
            runs.append(m)
            print(
                f"round {r + 1} {kind:4s}: {m['client_cpu_us_per_request']:6.1f} µs client CPU/call, "
                f"{m['throughput_rps']:7.0f} calls/s, P50 {m['p50_ms']:.2f} ms, P99 {m['p99_ms']:.2f} ms"
                + (f", {m['hedges']} hedges" if "hedges" in m else ""),
                flush=True,
            )
    return runs


def median_of(runs: list[dict]) -> dict:
    keys = ("client_cpu_us_per_request", "throughput_rps", "p50_ms", "p99_ms")
    return {k: {kind: statistics.median(r[k] for r in runs if r["kind"] == kind) for kind in KINDS} for k in keys}


def document(runs: list[dict], med: dict, config: dict) -> dict:
    """The JSON result (schema wok.balancer_overhead/1): every run, the medians, the difference."""
    return bench_header(SCHEMA, config) | {
        "runs": runs,
        "median": med,
        "wok_minus_grpc_cpu_us": med["client_cpu_us_per_request"]["wok"] - med["client_cpu_us_per_request"]["grpc"],
    }


def build_parser() -> argparse.ArgumentParser:
    """This script's parser (tests/deploy/test_doc_commands.py parses the docs' command lines with it)."""
    from wok.cliargs import ArgumentParser  # argparse's, its refusals in wok's words

    p = ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=20000, help="calls per run (default 20,000)")
    p.add_argument("--inflight", type=int, default=32, help="outstanding calls (default 32)")
    p.add_argument("--servers", type=int, default=2, help="bare servers to balance over (default 2)")
    p.add_argument("--rounds", type=int, default=3, help="grpc/wok pairs, alternating which goes first")
    p.add_argument("--json", type=Path)
    return p


def main(argv=None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    refuse_unwritable(p, args, "--json")
    for option in ("--requests", "--inflight", "--servers", "--rounds"):
        if (refusal := integer_refusal(option, getattr(args, option.removeprefix("--")), 1)) is not None:
            p.error(refusal)
    try:
        import uvloop  # as the bench's workers; only for this run's loop, not the process's policy

        loop_factory = uvloop.new_event_loop
    except ImportError:
        loop_factory = None
    import numpy as np

    from wok.codec import encode_request

    payload = encode_request("mlp", {"INPUT0": np.ones((1, 256), np.float32)}).SerializeToString()
    with bare_servers(args.servers) as targets:
        # One event loop for every run: grpc.aio keeps per-loop state that outlives asyncio.run.
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            runs = runner.run(run_all(targets, payload, args))
    med = median_of(runs)
    cpu = med["client_cpu_us_per_request"]
    extra = cpu["wok"] - cpu["grpc"]
    print(f"median client CPU per call: grpc {cpu['grpc']:.1f} µs, wok {cpu['wok']:.1f} µs ({extra:+.1f} µs)")
    if args.json:
        doc = document(runs, med, {k: v for k, v in vars(args).items() if k != "json"})
        return finish_json(doc, args.json, "balancer_overhead: ")
    return 0


if __name__ == "__main__":
    sys.exit(main())
