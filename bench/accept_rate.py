"""How many unary calls a grpc.aio server completes per pass of its event loop, and what wok changes in that.

    python bench/accept_rate.py --loops 1,4 --hog-us 0,1000 --json accept-rate.json
    python bench/accept_rate.py --accept-tasks 0,4 --drain 0,1 --hog-us 0,250 --json accept-tasks.json

Settings: N grpc.aio servers on the port (`--loops`); wok's extra accept tasks per server
(`--accept-tasks`, server/accept.py); wok's wake-up drain (`--drain 1`, server/wakeup.py).

The hypothesis it tested (docs/performance.md, "The unary knee"): grpc.aio's server accepts
one call at a time (`AioServer._server_main_loop` awaits each `_request_call` before it asks
for the next), and each accept costs at least one pass of the event loop, so a loop whose
passes are long accepts few calls per second, and N servers on the port accept N at a time.
Measured on 2 cores (2026-11-30): about 0.2 calls per pass with 1 server and 0.21-0.25 with
4, whatever the calls in flight, so the accept chain is not what limits.

The server (a child process) answers a unary call with its request, on N grpc.aio servers
sharing the port (SO_REUSEPORT when N > 1). A "hog" keeps every loop pass at least `hog`
long: a callback that spins that long and schedules itself again for the next pass, so
the number of hog runs is the number of passes. The client (this process) keeps 64 calls in
flight on each of 8 channels, each with its own connection, for the measured window (closed
loop: the server's capacity, not a latency). Printed and written: calls per second, loop
passes per second, and calls per pass, per setting, settings interleaved over the repetitions.
If the accept chain limited, calls per pass would rise with N when the hog makes passes long.
They did not, because a second limit sits behind it: grpc.aio reads one wake-up byte per pass,
so gRPC hands the loop about one finished operation per pass once bytes pile up, about four
per call. `--accept-tasks` and `--drain` lift the two limits one at a time (2026-11-30, docs/
performance.md "The unary knee"). Also reported: the wake-up callbacks per call and per pass.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from wok.bench.outputs import finish_json, refuse_unwritable
from wok.bench.payloads import integer_refusal
from wok.bench.report import bench_header

SCHEMA = "wok.acceptrate/2"
METHOD = "/wok.bench.Echo/Echo"
READY = "ACCEPT_RATE_READY"


# --------------------------------------------------------------------------- server (child)
async def _serve(port: int, loops: int, hog_s: float, hog_kind: str, tasks: int, drain: bool) -> None:
    import grpc

    from wok.accept import AcceptTasks
    from wok.wakeup import WakeupDrain

    loop = asyncio.get_running_loop()
    passes = 0
    calls = 0
    hogging = hog_s > 0

    def hog() -> None:
        nonlocal passes
        if not hogging:
            return
        passes += 1
        if hog_kind == "sleep":
            time.sleep(hog_s)  # the GIL released: other threads run meanwhile
        else:
            end = time.perf_counter() + hog_s
            while time.perf_counter() < end:
                pass
        loop.call_soon(hog)  # runs in the next pass: one hog per pass

    per_server = [0] * loops

    def echo_for(i: int):
        async def echo(request: bytes, context) -> bytes:
            nonlocal calls
            calls += 1
            per_server[i] += 1
            return request

        return echo

    wakeup = WakeupDrain()

    async def counts(request: bytes, context) -> bytes:
        state = {
            "passes": passes,
            "calls": calls,
            "per_server": per_server,
            "t": time.perf_counter(),
            "wakeups": wakeup.wakeups,
        }
        return json.dumps(state).encode()

    servers, accepts = [], []
    for i in range(loops):
        echo_handler = grpc.unary_unary_rpc_method_handler(echo_for(i))
        handler = grpc.method_handlers_generic_handler(
            "wok.bench.Echo",
            {"Echo": echo_handler, "Counts": grpc.unary_unary_rpc_method_handler(counts)},
        )
        server = grpc.aio.server(options=[("grpc.so_reuseport", int(loops > 1))])
        server.add_generic_rpc_handlers((handler,))
        server.add_registered_method_handlers("wok.bench.Echo", {"Echo": echo_handler})
        if server.add_insecure_port(f"127.0.0.1:{port}") != port:
            raise OSError(f"cannot bind 127.0.0.1:{port}")
        await server.start()
        servers.append(server)
        accepts.append(AcceptTasks(server, {METHOD: echo_handler}, tasks))
        accepts[-1].start()
    if drain and not wakeup.install():
        raise RuntimeError(f"the wake-up drain cannot run here: {wakeup.unsupported}")
    if hog_s > 0:
        loop.call_soon(hog)
    print(READY, flush=True)
    # Until the parent closes stdin. Read by the loop itself, not a thread: a spinning hog holds the
    # GIL, and a thread's read took seconds to get back, then the default executor's shutdown more.
    closed = loop.create_future()

    def on_stdin() -> None:
        if not os.read(sys.stdin.fileno(), 4096) and not closed.done():
            loop.remove_reader(sys.stdin.fileno())
            closed.set_result(None)

    loop.add_reader(sys.stdin.fileno(), on_stdin)
    await closed
    hogging = False
    await asyncio.gather(*(s.stop(0) for s in servers))
    for accept in accepts:
        await accept.stop()
    wakeup.uninstall()


# --------------------------------------------------------------------------- client
async def _drive(port: int, seconds: float, warmup: float, channels: int, inflight: int) -> dict:
    import grpc

    chans = [
        grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)])
        for _ in range(channels)
    ]
    try:
        echo = [c.unary_unary(METHOD) for c in chans]
        counts = chans[0].unary_unary("/wok.bench.Echo/Counts")
        for e in echo:
            await e(b"x", timeout=10)  # connect every channel first
        stop_at = time.perf_counter() + warmup + seconds

        async def worker(call) -> None:
            while time.perf_counter() < stop_at:
                await call(b"x" * 64, timeout=30)

        tasks = [asyncio.ensure_future(worker(e)) for e in echo for _ in range(inflight)]
        await asyncio.sleep(warmup)
        c0 = json.loads(await counts(b"", timeout=30))
        await asyncio.sleep(seconds)
        c1 = json.loads(await counts(b"", timeout=30))
        await asyncio.gather(*tasks)
    finally:
        await asyncio.gather(*(c.close() for c in chans))
    dt = c1["t"] - c0["t"]
    calls, passes = c1["calls"] - c0["calls"], c1["passes"] - c0["passes"]
    wakeups = c1["wakeups"] - c0["wakeups"]  # counted only with the drain on
    return {
        "wakeups_per_call": wakeups / calls if wakeups and calls else None,
        "per_server_calls": [b - a for a, b in zip(c0["per_server"], c1["per_server"])],
        "window_s": dt,
        "calls_per_s": calls / dt,
        "passes_per_s": passes / dt if passes else None,
        "calls_per_pass": calls / passes if passes else None,
    }


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(loops: int, hog_us: float, tasks: int, drain: int, args) -> dict:
    port = _free_port()
    serve = [str(port), str(loops), str(hog_us), args.hog_kind, args.loop, str(tasks), str(drain)]
    child = subprocess.Popen(
        [sys.executable, __file__, "--serve", *serve],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        if child.stdout.readline().strip() != READY:
            raise RuntimeError(f"the server ({loops=}, {hog_us=}, {tasks=}, {drain=}) did not start")
        import uvloop

        return uvloop.run(_drive(port, args.duration, args.warmup, args.channels, args.inflight))
    finally:
        child.stdin.close()
        try:
            child.wait(10)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def _cell(value: float | None, spec: str) -> str:
    """`value` formatted by `spec` ('9.0f'), or a dash as wide."""
    return format(value, spec) if value is not None else "-".rjust(int(spec.split(".")[0]))


def _settings(p: argparse.ArgumentParser, args) -> list[tuple[int, float, int, int]]:
    """Every (loops, hog µs, accept tasks, drain) to measure, or the parser's error (exit 2) for a bad
    option, checked before the first server starts."""
    if not (args.duration > 0 and math.isfinite(args.duration)):
        p.error(f"--duration: expected seconds > 0; got {args.duration:g}")
    if not (args.warmup >= 0 and math.isfinite(args.warmup)):
        p.error(f"--warmup: expected seconds >= 0; got {args.warmup:g}")
    for option, value in (("--channels", args.channels), ("--inflight", args.inflight), ("--reps", args.reps)):
        if (refusal := integer_refusal(option, value, 1)) is not None:
            p.error(refusal)

    def values(option: str, text: str, kind, ok, expected: str) -> list:
        from wok.errors import quoted_name

        try:
            out = [kind(x) for x in text.split(",")]
        except ValueError:
            out = []
        if not out or not all(ok(v) for v in out):
            p.error(f"{option}: expected {expected}, comma-separated; got {quoted_name(text)}")
        return out

    hogs = values("--hog-us", args.hog_us, float, lambda v: 0 <= v < math.inf, "microseconds >= 0")
    loops = values("--loops", args.loops, int, lambda v: v >= 1, "integers >= 1")
    tasks = values("--accept-tasks", args.accept_tasks, int, lambda v: v >= 0, "integers >= 0")
    drains = values("--drain", args.drain, int, lambda v: v in (0, 1), "0 or 1")
    return [(n, h, t, d) for h in hogs for n in loops for t in tasks for d in drains]


def build_parser() -> argparse.ArgumentParser:
    """This script's parser (tests/deploy/test_doc_commands.py parses the docs' command lines with it)."""
    from wok.cliargs import ArgumentParser  # argparse's, its refusals in wok's words

    p = ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--loops", default="1,4", help="servers on the port, comma-separated")
    p.add_argument("--hog-us", default="0,1000", help="least length of a loop pass (µs), comma-separated")
    p.add_argument(
        "--accept-tasks", default="0", help="wok's extra accept tasks per server (server/accept.py), comma-separated"
    )
    p.add_argument("--drain", default="0", help="wok's wake-up drain (server/wakeup.py): 0 off, 1 on, comma-separated")
    p.add_argument("--duration", type=float, default=5.0, help="measured seconds per setting")
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--channels", type=int, default=8, help="client connections")
    p.add_argument("--inflight", type=int, default=64, help="calls in flight per connection")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--json", type=Path)
    p.add_argument(
        "--hog-kind",
        choices=("spin", "sleep"),
        default="spin",
        help="spin: the hog holds the GIL (Python work); sleep: it releases it (default spin)",
    )
    p.add_argument(
        "--loop",
        choices=("uvloop", "asyncio"),
        default="uvloop",
        help="the server's event loop (default uvloop, as wok serve's); asyncio runs the callbacks queued "
        "during a pass in the next one, as uvloop is expected to",
    )
    p.add_argument("--serve", nargs=7, help=argparse.SUPPRESS)
    return p


def main(argv=None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    refuse_unwritable(p, args, "--json")
    if args.serve:
        import uvloop

        port, loops, hog_us = int(args.serve[0]), int(args.serve[1]), float(args.serve[2])
        tasks, drain = int(args.serve[5]), args.serve[6] == "1"
        serve = _serve(port, loops, hog_us / 1e6, args.serve[3], tasks, drain)
        if args.serve[4] == "asyncio":
            asyncio.run(serve)
        else:
            uvloop.run(serve)
        return 0
    settings = _settings(p, args)
    keys = ("loops", "hog_us", "accept_tasks", "drain")
    runs = []
    for rep in range(args.reps):
        for setting in settings if rep % 2 == 0 else list(reversed(settings)):
            loops, hog, tasks, drain = setting
            r = measure(loops, hog, tasks, drain, args) | dict(zip(keys, setting)) | {"rep": rep + 1}
            runs.append(r)
            per_pass = "-" if r["calls_per_pass"] is None else f"{r['calls_per_pass']:.2f}"
            print(
                f"rep {rep + 1}: loops {loops}, hog {hog:g} µs, tasks {tasks}, drain {drain}: "
                f"{r['calls_per_s']:.0f} calls/s, {per_pass} per pass; calls by server {r['per_server_calls']}",
                file=sys.stderr,
                flush=True,
            )
    summary = []
    print(
        f"{'loops':>5} {'hog µs':>7} {'tasks':>5} {'drain':>5} {'calls/s':>9} {'passes/s':>9} {'calls/pass':>10} "
        f"{'wakes/call':>10}"
    )
    for setting in settings:
        mine = [r for r in runs if tuple(r[k] for k in keys) == setting]

        def med(key, mine=mine):
            vals = [r[key] for r in mine if r[key] is not None]
            return statistics.median(vals) if vals else None

        stats = ("calls_per_s", "passes_per_s", "calls_per_pass", "wakeups_per_call")
        row = dict(zip(keys, setting)) | {k: med(k) for k in stats}
        summary.append(row)
        loops, hog, tasks, drain = setting
        print(
            f"{loops:>5} {hog:>7g} {tasks:>5} {drain:>5} {_cell(row['calls_per_s'], '9.0f')} "
            f"{_cell(row['passes_per_s'], '9.0f')} {_cell(row['calls_per_pass'], '10.2f')} "
            f"{_cell(row['wakeups_per_call'], '10.2f')}"
        )
    if args.json:
        doc = bench_header(SCHEMA, {k: v for k, v in vars(args).items() if k not in ("json", "serve")}) | {
            "runs": runs,
            "summary": summary,
        }
        return finish_json(doc, args.json, "accept_rate: ")
    return 0


if __name__ == "__main__":
    sys.exit(main())
