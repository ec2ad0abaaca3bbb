"""What a refused call costs the server: CPU per RESOURCE_EXHAUSTED answer from a full queue.

A `wok serve --models mlp --admin` process whose queue bound is small; its one instance slowed
by an admin fault so that nothing drains; the queue filled to its bound. Then N calls of R rows
each are sent with C in flight at a time (closed loop), and every one is refused at once. The
server's CPU seconds over them (its whole process tree, from /proc) divided by N is the cost of
one refusal. Each server in `--servers` (`wok`: this checkout; `wok@REV`: wok as committed at
REV; `bare`: bench/peers/bare_server.py, which answers every call OK without decoding it, the
floor of a call on this machine) runs once per rep, the order rotated every rep; the figures are
medians over the reps.

    .venv/bin/python bench/refusal_cost.py --servers wok,wok@a2d5308,bare --rows 1,32 --reps 5 \\
        --json docs/results/refusal-cost-2026-11-30.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime

import grpc
import numpy as np

from wok.bench.compare import REV_PEER, TEMPLATES, free_port, local_wok, tree_usage, wok_at_rev
from wok.bench.faults import post_fault
from wok.bench.outputs import finish_json, refuse_unwritable
from wok.bench.payloads import integer_refusal
from wok.bench.scrape import scrape
from wok.v2pb import grpc_service_pb2 as pb
from wok.v2pb import grpc_service_pb2_grpc as pb_grpc

SCHEMA = "wok.refusal_cost/1"
BOUND = 64  # the mlp's max_queue_size here: small, so that filling it is quick


def _request(rows: int) -> pb.ModelInferRequest:
    tensor = pb.ModelInferRequest.InferInputTensor(name="INPUT0", datatype="FP32", shape=[rows, 256])
    data = np.ones((rows, 256), np.float32).tobytes()
    return pb.ModelInferRequest(model_name="mlp", inputs=[tensor], raw_input_contents=[data])


async def _until_queue_full(metrics_url: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        snap = await asyncio.to_thread(scrape, metrics_url)
        if snap is not None and snap.get("wok_queue_depth", model="mlp") == BOUND:
            return
        await asyncio.sleep(0.2)
    raise RuntimeError(f"the mlp's queue did not reach {BOUND} within {timeout_s} s")


async def _send(stub, req: pb.ModelInferRequest, calls: int, concurrency: int) -> dict[str, int]:
    """Send `req` `calls` times, `concurrency` at a time; the count of each status code."""
    codes: dict[str, int] = {}
    left = calls

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            try:
                await stub.ModelInfer(req, timeout=30)
                code = "OK"
            except grpc.aio.AioRpcError as exc:
                code = exc.code().name
            codes[code] = codes.get(code, 0) + 1

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return codes


@contextlib.contextmanager
def _bare():
    """The bare transport (bench/peers/bare_server.py): every call answered OK, nothing decoded."""
    port = free_port()
    argv = [sys.executable, str(TEMPLATES / "bare_server.py"), str(port)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, start_new_session=True)
    try:
        yield f"127.0.0.1:{port}", proc.pid
    finally:
        proc.kill()
        proc.wait()


async def measure_bare(rows_list: list[int], calls: int, concurrency: int) -> dict:
    """The floor of one call: the same calls, each answered OK by the bare transport."""
    out: dict = {"server": "bare", "rows": {}}
    with _bare() as (target, pid):
        async with grpc.aio.insecure_channel(target) as channel:
            await asyncio.wait_for(channel.channel_ready(), 60)
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            for rows in rows_list:
                for _ in range(20):
                    await stub.ModelInfer(_request(rows))
            for rows in rows_list:
                out["rows"][str(rows)] = await _timed(stub, _request(rows), calls, concurrency, pid)
    return out


async def _timed(stub, req: pb.ModelInferRequest, calls: int, concurrency: int, pid: int) -> dict:
    cpu0, t0 = tree_usage(pid).cpu_s, time.perf_counter()
    codes = await _send(stub, req, calls, concurrency)
    cpu1, t1 = tree_usage(pid).cpu_s, time.perf_counter()
    answered = codes.get("RESOURCE_EXHAUSTED", 0) + codes.get("OK", 0)
    return {
        "calls": calls,
        "codes": codes,
        "wall_s": round(t1 - t0, 3),
        "answers_per_s": round(answered / (t1 - t0), 1),
        "server_cpu_us_per_call": round((cpu1 - cpu0) / calls * 1e6, 1),
    }


async def measure(server: str, rows_list: list[int], calls: int, concurrency: int, rev: str | None = None) -> dict:
    """`server` (wok, wok@REV or bare), the label of the run; `rev`: the commit a wok@REV serves."""
    if server == "bare":
        return await measure_bare(rows_list, calls, concurrency)
    serve = ["--models", "mlp", "--admin", "--log-level", "ERROR", "--grace-period", "0"]
    serve += ["--demo-option", f"mlp.max_queue_size={BOUND}"]
    out: dict = {"server": server, "rows": {}}
    with local_wok(serve, rev=rev) as (target, metrics_url, pid):
        async with grpc.aio.insecure_channel(target) as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            for rows in rows_list:  # warm every code path the answers take
                for _ in range(20):
                    await stub.ModelInfer(_request(rows))
            fault = {"model": "mlp", "instance": 0, "mode": "slow", "delay_ms": 60_000, "duration_s": 900}
            post_fault(metrics_url.removesuffix("/metrics"), fault)
            held = [asyncio.ensure_future(stub.ModelInfer(_request(1), timeout=900)) for _ in range(BOUND + 64)]
            await _until_queue_full(metrics_url)
            for rows in rows_list:
                out["rows"][str(rows)] = await _timed(stub, _request(rows), calls, concurrency, pid)
            for call in held:
                call.cancel()
    return out


def _median(runs: list[dict], server: str, rows: int, key: str) -> float:
    return statistics.median(r["rows"][str(rows)][key] for r in runs if r["server"] == server)


def _check_args(ap: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[dict[str, str | None], list[int]]:
    """The servers (each name to the commit a wok@REV serves, else None) and the rows values, or
    the parser's error (exit 2) before any server starts."""
    from wok.errors import quoted_name
    from wok.numerals import digits_note, read_int

    servers = [s.strip() for s in args.servers.split(",") if s.strip()]
    if not servers:
        ap.error(f"--servers: expected wok, bare or wok@REV, comma-separated; got {quoted_name(args.servers)}")
    revs: dict[str, str | None] = {}
    for name in servers:
        if name in ("wok", "bare"):
            revs[name] = None
            continue
        if not REV_PEER.fullmatch(name):
            ap.error(f"--servers: expected wok, bare or wok@REV; got {quoted_name(name)}")
        # Resolved once, up front: an unknown revision is refused before any server starts, and
        # every rep serves the same commit even if a branch named by REV moves meanwhile.
        try:
            revs[name] = wok_at_rev(name).extra["rev"]
        except ValueError as exc:
            ap.error(f"--servers: {exc}")
    twice = sorted({s for s in servers if servers.count(s) > 1})
    if twice:
        ap.error(f"--servers: expected each server once; got {', '.join(twice)} more than once")
    try:
        rows_list = [read_int(r) for r in args.rows.split(",")]
    except ValueError:
        ap.error(
            f"--rows: expected positive integers, comma-separated; got {quoted_name(args.rows)}{digits_note(args.rows)}"
        )
    if min(rows_list) < 1:
        ap.error(
            f"--rows: expected positive integers, comma-separated; got {quoted_name(args.rows)}{digits_note(args.rows)}"
        )
    for option, value in (("--calls", args.calls), ("--concurrency", args.concurrency), ("--reps", args.reps)):
        if (refusal := integer_refusal(option, value, 1)) is not None:
            ap.error(refusal)
    return revs, rows_list


def build_parser() -> argparse.ArgumentParser:
    """This script's parser (tests/deploy/test_doc_commands.py parses the docs' command lines with it)."""
    from wok.cliargs import ArgumentParser  # argparse's, its refusals in wok's words

    ap = ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--servers", default="wok", help="comma-separated: wok, wok@REV, bare (default wok)")
    ap.add_argument("--rows", default="1,32", help="rows per refused call, comma-separated (default 1,32)")
    ap.add_argument("--calls", type=int, default=5_000, help="refused calls per rows value (default 5,000)")
    ap.add_argument("--concurrency", type=int, default=32, help="calls in flight at a time (default 32)")
    ap.add_argument("--reps", type=int, default=3, help="repetitions, the server order rotated (default 3)")
    ap.add_argument("--json", help="write the wok.refusal_cost/1 document here")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    refuse_unwritable(ap, args, "--json")
    revs, rows_list = _check_args(ap, args)
    servers = list(revs)
    runs = []
    for rep in range(args.reps):
        order = servers[rep % len(servers) :] + servers[: rep % len(servers)]
        for server in order:
            print(f"[refusal_cost] rep {rep + 1}/{args.reps}: {server} …", file=sys.stderr, flush=True)
            pinned = {"rev": revs[server]} if revs[server] else {}  # wok@REV: the commit resolved up front
            run = asyncio.run(measure(server, rows_list, args.calls, args.concurrency, **pinned))
            run["rep"] = rep + 1
            runs.append(run)
    print(f"{'server':>16} {'rows':>5} {'server CPU µs/call':>19} {'answers/s':>10}   (median of {args.reps})")
    summary = []
    for server in servers:
        for rows in rows_list:
            cpu = _median(runs, server, rows, "server_cpu_us_per_call")
            rate = _median(runs, server, rows, "answers_per_s")
            summary.append({"server": server, "rows": rows, "server_cpu_us_per_call": cpu, "answers_per_s": rate})
            print(f"{server:>16} {rows:>5} {cpu:>19.1f} {rate:>10.0f}")
    if args.json:
        doc = {
            "schema": SCHEMA,
            "created": datetime.now(UTC).isoformat(timespec="seconds"),
            "args": vars(args),
            "max_queue_size": BOUND,
            "summary": summary,
            "runs": runs,
        }
        return finish_json(doc, args.json, "[refusal_cost] ")
    return 0


if __name__ == "__main__":
    sys.exit(main())
