"""Collector work and server CPU per request, variants interleaved: python gcwork.py REPS N VARIANT..."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))


def serve() -> None:
    from wok.app import WokServer, build_repository
    from wok.config import server_settings

    gc_time = [0.0]
    started = [0.0]

    def cb(phase, info):
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            gc_time[0] += time.perf_counter() - started[0]

    gc.callbacks.append(cb)

    async def main():
        s = server_settings(demo_models=("mlp",), metrics_port=0, grpc_port=0)
        server = WokServer(s, build_repository(s))
        await server.start()
        loop = asyncio.get_running_loop()
        print(f"PORT {server.port}", flush=True)
        mark = None
        while True:
            line = (await loop.run_in_executor(None, sys.stdin.readline)).strip()
            if line == "freeze":  # as `wok serve` does once started
                gc.collect()
                gc.freeze()
                print("OK", flush=True)
            elif line == "begin":
                mark = ([st["collections"] for st in gc.get_stats()], gc_time[0], time.process_time())
                print("OK", flush=True)
            elif line == "end":
                cols = [st["collections"] for st in gc.get_stats()]
                print(
                    "RES "
                    + json.dumps(
                        {
                            "collections": [a - b for a, b in zip(cols, mark[0])],
                            "gc_s": gc_time[0] - mark[1],
                            "cpu_s": time.process_time() - mark[2],
                        }
                    ),
                    flush=True,
                )
            else:
                break
        await server.stop(grace=5)

    if os.environ.get("LOOP", "uvloop") == "uvloop":
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    asyncio.run(main())


def main():
    import census
    from census import client_phases

    reps, n = int(sys.argv[1]), int(sys.argv[2])
    variants = sys.argv[3:]
    census.N = n
    results = {}
    for _rep in range(reps):
        for v in variants:
            env = dict(os.environ, PYTHONPATH=os.path.join(os.environ.get("VARIANTS", "/tmp/cycles51"), f"{v}_pkg"))
            p = subprocess.Popen(
                [sys.executable, __file__, "serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
            )
            port = census.read(p, "PORT ")
            census.N = 500
            phases = client_phases(f"127.0.0.1:{port}")
            phases["sync_unary"]()
            phases["stream"]()
            census.N = n
            census.ask(p, "freeze", "OK")
            for name in ("sync_unary", "concurrent_unary", "stream"):
                census.ask(p, "begin", "OK")
                phases[name]()
                res = json.loads(census.ask(p, "end", "RES "))
                results.setdefault((v, name), []).append(res)
                print(v, name, res, flush=True)
            p.stdin.write("quit\n")
            p.stdin.flush()
            p.wait()
    print(
        f"\nmedians over {reps} reps of {n} requests; per 10k requests: collections gen0/gen1/gen2, gc ms; "
        "server CPU us/req"
    )
    for name in ("sync_unary", "concurrent_unary", "stream"):
        for v in variants:
            rs = results[(v, name)]
            k = 1e4 / n
            cols = [statistics.median(r["collections"][g] for r in rs) * k for g in range(3)]
            gcms = statistics.median(r["gc_s"] for r in rs) * k * 1e3
            cpu = statistics.median(r["cpu_s"] for r in rs) / n * 1e6
            print(
                f"{name:17s} {v:10s} gen0 {cols[0]:7.1f} gen1 {cols[1]:6.1f} gen2 {cols[2]:5.1f}  "
                f"gc {gcms:7.2f} ms  cpu {cpu:7.1f} us/req"
            )


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        serve()
    else:
        main()
