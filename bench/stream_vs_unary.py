"""Server CPU per request: unary ModelInfer against ModelStreamInfer, side by side.

    python bench/stream_vs_unary.py --requests 20000 --inflight 64 --rounds 3 --json stream.json

Starts `wok serve --models mlp`, then, alternating, sends the same pre-serialized one-row
requests closed-loop with `--inflight` outstanding: as unary calls, and as messages on
`--streams` long-lived bidirectional streams. It reads the server process's CPU time from
/proc (Linux) around each run and reports µs of server CPU per request, throughput and the
mean batch size the server formed (its ModelStatistics). Closed loop: this measures cost at
the rate the server sustains, not latency at a set rate (that is `wok bench ramp`'s job).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

from wok.bench.outputs import refuse_unwritable, write_final, write_json_text
from wok.bench.payloads import integer_refusal
from wok.bench.report import bench_header

SCHEMA = "wok.stream_vs_unary/1"
INFER = "/inference.GRPCInferenceService/ModelInfer"
STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"


async def run_unary(target: str, payload: bytes, n: int, inflight: int) -> int:
    import grpc

    async with grpc.aio.insecure_channel(target) as ch:
        call = ch.unary_unary(INFER)
        left = n
        ok = 0

        async def worker() -> None:
            nonlocal left, ok
            while left > 0:
                left -= 1
                await call(payload, timeout=60)
                ok += 1

        await asyncio.gather(*(worker() for _ in range(inflight)))
    return ok


async def run_stream(target: str, payload: bytes, n: int, inflight: int, streams: int) -> int:
    import grpc

    from wok.v2pb import grpc_service_pb2 as pb

    async with grpc.aio.insecure_channel(target) as ch:
        per_stream = [n // streams + (1 if i < n % streams else 0) for i in range(streams)]
        window = max(1, inflight // streams)
        ok = 0

        async def one(count: int) -> None:
            nonlocal ok
            call = ch.stream_stream(STREAM)()
            credit = asyncio.Semaphore(window)

            async def write() -> None:
                for _ in range(count):
                    await credit.acquire()
                    await call.write(payload)
                await call.done_writing()

            writer = asyncio.ensure_future(write())
            got = 0
            while got < count:
                msg = await call.read()
                if msg is grpc.aio.EOF:
                    raise RuntimeError(f"stream ended after {got} of {count} answers")
                if pb.ModelStreamInferResponse.FromString(msg).error_message:
                    raise RuntimeError("the server answered an error on the stream")
                got += 1
                credit.release()
            await writer
            ok += got

        await asyncio.gather(*(one(c) for c in per_stream if c))
    return ok


def statistics_of(target: str) -> tuple[int, int]:
    from wok.clients import Client

    with Client(target) as c:
        st = c.model_statistics("mlp").model_stats[0]
        return st.inference_count, st.execution_count


def measure(kind: str, target: str, pid: int, payload: bytes, args) -> dict:
    from wok.bench.compare import tree_usage

    inf0, ex0 = statistics_of(target)
    c0, t0 = tree_usage(pid).cpu_s, time.perf_counter()
    if kind == "unary":
        ok = asyncio.run(run_unary(target, payload, args.requests, args.inflight))
    else:
        ok = asyncio.run(run_stream(target, payload, args.requests, args.inflight, args.streams))
    wall = time.perf_counter() - t0
    cpu = tree_usage(pid).cpu_s - c0
    inf1, ex1 = statistics_of(target)
    return {
        "kind": kind,
        "requests": ok,
        "wall_s": wall,
        "server_cpu_s": cpu,
        "server_us_per_request": 1e6 * cpu / ok,
        "throughput_qps": ok / wall,
        "mean_batch_size": (inf1 - inf0) / max(1, ex1 - ex0),
    }


def build_parser() -> argparse.ArgumentParser:
    """This script's parser (tests/deploy/test_doc_commands.py parses the docs' command lines with it)."""
    from wok.cliargs import ArgumentParser  # argparse's, its refusals in wok's words

    p = ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=20000, help="requests per run (default 20,000)")
    p.add_argument("--inflight", type=int, default=64, help="outstanding requests (default 64)")
    p.add_argument("--streams", type=int, default=4, help="streams that share them (default 4)")
    p.add_argument("--rounds", type=int, default=3, help="unary/stream pairs, alternating which goes first")
    p.add_argument("--serve-args", default="--models mlp", help="arguments for wok serve (default: --models mlp)")
    p.add_argument("--json", type=Path)
    return p


def main(argv=None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    refuse_unwritable(p, args, "--json")
    if not sys.platform.startswith("linux"):
        p.error("reads the server's CPU time from Linux's /proc")
    # --rounds 0 was taken: the server started and warmed, then the median of no runs failed (StatisticsError).
    for option, value in (("--requests", args.requests), ("--inflight", args.inflight), ("--rounds", args.rounds)):
        if (refusal := integer_refusal(option, value, 1)) is not None:
            p.error(refusal)
    shared = " (the streams share --inflight's requests)"
    if (refusal := integer_refusal("--streams", args.streams, 1, shared, most=args.inflight)) is not None:
        p.error(refusal)

    import numpy as np

    from wok.bench.compare import local_wok
    from wok.codec import encode_request

    runs = []
    with local_wok([*args.serve_args.split(), "--log-level", "WARNING"]) as (target, _, pid):
        payload = encode_request("mlp", {"INPUT0": np.ones((1, 256), np.float32)}).SerializeToString()
        measure("unary", target, pid, payload, argparse.Namespace(**{**vars(args), "requests": 500}))
        for r in range(args.rounds):
            order = ("unary", "stream") if r % 2 == 0 else ("stream", "unary")
            for kind in order:
                m = measure(kind, target, pid, payload, args) | {"round": r + 1}
                runs.append(m)
                print(
                    f"round {r + 1} {kind:6s}: {m['server_us_per_request']:6.0f} µs server CPU/request, "
                    f"{m['throughput_qps']:7.0f} req/s, mean batch {m['mean_batch_size']:.1f}",
                    flush=True,
                )
    summary = {}
    for kind in ("unary", "stream"):
        mine = [m for m in runs if m["kind"] == kind]
        summary[kind] = {
            k: statistics.median(m[k] for m in mine)
            for k in ("server_us_per_request", "throughput_qps", "mean_batch_size")
        }
    ratio = summary["stream"]["server_us_per_request"] / summary["unary"]["server_us_per_request"]
    print(
        f"median: unary {summary['unary']['server_us_per_request']:.0f} µs, stream "
        f"{summary['stream']['server_us_per_request']:.0f} µs per request (stream/unary {ratio:.2f})"
    )
    if args.json:
        doc = bench_header(SCHEMA, {k: v for k, v in vars(args).items() if k != "json"}) | {
            "runs": runs,
            "median": summary,
            "stream_over_unary_cpu": ratio,
        }
        failed = write_final(doc, [("--json", args.json, write_json_text)])
        if failed:
            print(f"stream_vs_unary: {failed}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
