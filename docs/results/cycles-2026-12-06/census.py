"""Census of objects left to the cyclic collector per request in a wok server process.

python census.py            -> controller: starts a server child, runs client phases, prints the census
python census.py serve      -> server child (stdin commands: begin / end / quit)
"""

from __future__ import annotations

import asyncio
import collections
import gc
import json
import os
import subprocess
import sys
import types

N = int(os.environ.get("N", "2000"))


def describe(o) -> str:
    t = type(o)
    name = t.__qualname__
    if isinstance(o, types.FunctionType):
        return f"function {o.__qualname__}"
    if isinstance(o, types.FrameType):
        return f"frame {o.f_code.co_qualname if hasattr(o.f_code, 'co_qualname') else o.f_code.co_name}"
    if isinstance(o, types.CoroutineType):
        return f"coroutine {o.__qualname__}"
    if isinstance(o, types.MethodType):
        return f"method {getattr(o.__func__, '__qualname__', '?')}"
    if isinstance(o, types.CellType):
        return "cell"
    if isinstance(o, asyncio.Task):
        c = o.get_coro()
        return f"Task {getattr(c, '__qualname__', type(c).__name__)}"
    if isinstance(o, BaseException):
        return f"exc {name}"
    return f"{t.__module__}.{name}"


def sccs(objs):
    """Tarjan's SCCs over objs (by id), iterative."""
    ids = {id(o): i for i, o in enumerate(objs)}
    edges = []
    for o in objs:
        edges.append([ids[id(r)] for r in gc.get_referents(o) if id(r) in ids])
    index = [None] * len(objs)
    low = [0] * len(objs)
    onstack = [False] * len(objs)
    stack, comps, counter = [], [], 0
    for s in range(len(objs)):
        if index[s] is not None:
            continue
        work = [(s, 0)]
        while work:
            v, pi = work.pop()
            if pi == 0:
                index[v] = low[v] = counter
                counter += 1
                stack.append(v)
                onstack[v] = True
            recurse = False
            for i in range(pi, len(edges[v])):
                w = edges[v][i]
                if index[w] is None:
                    work.append((v, i + 1))
                    work.append((w, 0))
                    recurse = True
                    break
                elif onstack[w]:
                    low[v] = min(low[v], index[w])
            if recurse:
                continue
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    onstack[w] = False
                    comp.append(w)
                    if w == v:
                        break
                comps.append(comp)
            if work:
                u = work[-1][0]
                low[u] = min(low[u], low[v])
    return comps, edges


def census() -> dict:
    gc.collect()
    objs = list(gc.garbage)
    by_type = collections.Counter(describe(o) for o in objs)
    comps, edges = sccs(objs)
    cyc = collections.Counter()
    in_cycle = 0
    for comp in comps:
        if len(comp) == 1 and comp[0] not in edges[comp[0]]:
            continue
        in_cycle += len(comp)
        sig = tuple(sorted(collections.Counter(describe(objs[i]) for i in comp).items()))
        cyc[sig] += 1
    out = {
        "garbage": len(objs),
        "in_cycles": in_cycle,
        "by_type": by_type.most_common(40),
        "cycles": [(n, dict(sig)) for sig, n in cyc.most_common(25)],
    }
    return out


def serve() -> None:
    from wok.app import WokServer, build_repository
    from wok.config import server_settings

    async def main():
        s = server_settings(
            demo_models=("mlp",), metrics_port=0, grpc_port=0, **json.loads(os.environ.get("SETTINGS", "{}"))
        )
        server = WokServer(s, build_repository(s))
        await server.start()
        loop = asyncio.get_running_loop()
        print(f"PORT {server.port}", flush=True)
        while True:
            line = (await loop.run_in_executor(None, sys.stdin.readline)).strip()
            if line == "begin":
                gc.collect()
                gc.garbage.clear()
                gc.disable()
                gc.set_debug(gc.DEBUG_SAVEALL)
                print("OK", flush=True)
            elif line == "end":
                res = census()
                gc.set_debug(0)
                gc.garbage.clear()
                gc.enable()
                print("RES " + json.dumps(res), flush=True)
            elif line == "gcstats":
                print("RES " + json.dumps({"stats": gc.get_stats(), "count": gc.get_count()}), flush=True)
            else:
                break
        await server.stop(grace=5)

    if os.environ.get("LOOP") == "uvloop":
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    asyncio.run(main())


def client_phases(target):
    import grpc
    import numpy as np

    from wok.codec import encode_request
    from wok.v2pb import grpc_service_pb2_grpc as pb_grpc

    req = encode_request("mlp", {"INPUT0": np.ones((1, 256), np.float32)})

    def sync_unary():
        with grpc.insecure_channel(target) as ch:
            stub = pb_grpc.GRPCInferenceServiceStub(ch)
            for _ in range(N):
                stub.ModelInfer(req, timeout=10)

    def concurrent_unary():
        async def run():
            async with grpc.aio.insecure_channel(target) as ch:
                stub = pb_grpc.GRPCInferenceServiceStub(ch)
                sem = asyncio.Semaphore(16)

                async def one():
                    async with sem:
                        await stub.ModelInfer(req, timeout=10)

                await asyncio.gather(*(one() for _ in range(N)))

        asyncio.run(run())

    def streamed(request, refused: bool) -> None:
        # N requests on one stream, each answered (or, `refused`, answered with an error message).
        async def run():
            async with grpc.aio.insecure_channel(target) as ch:
                call = pb_grpc.GRPCInferenceServiceStub(ch).ModelStreamInfer()

                async def w():
                    for _ in range(N):
                        await call.write(request)
                    await call.done_writing()

                t = asyncio.create_task(w())
                n = 0
                async for a in call:
                    assert bool(a.error_message) == refused, a.error_message
                    n += 1
                await t
                assert n == N

        asyncio.run(run())

    def stream():
        streamed(req, refused=False)

    bad = encode_request("mlp", {"INPUT0": np.ones((1, 256), np.int64)})

    def invalid_unary():
        with grpc.insecure_channel(target) as ch:
            stub = pb_grpc.GRPCInferenceServiceStub(ch)
            for _ in range(N):
                try:
                    stub.ModelInfer(bad, timeout=10)
                except grpc.RpcError as exc:
                    assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT
                else:
                    raise AssertionError("answered")

    def invalid_stream():
        streamed(bad, refused=True)

    def idle():
        import time

        time.sleep(2)

    return {
        "idle": idle,
        "sync_unary": sync_unary,
        "concurrent_unary": concurrent_unary,
        "stream": stream,
        "invalid_unary": invalid_unary,
        "invalid_stream": invalid_stream,
    }


def read(p: subprocess.Popen, prefix: str) -> str:
    """The rest of the server child's next line that starts with `prefix`."""
    while True:
        line = p.stdout.readline()
        if not line:
            raise SystemExit("server died")
        if line.startswith(prefix):
            return line[len(prefix) :].strip()


def ask(p: subprocess.Popen, command: str, answer: str) -> str:
    """Send the server child `command`; the rest of its line that starts with `answer`."""
    p.stdin.write(command + "\n")
    p.stdin.flush()
    return read(p, answer)


def main():
    p = subprocess.Popen([sys.executable, __file__, "serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    port = read(p, "PORT ")
    phases = client_phases(f"127.0.0.1:{port}")
    # warm up
    phases["sync_unary"]()
    phases["stream"]()
    only = sys.argv[1:] or list(phases)
    for name in only:
        ask(p, "begin", "OK")
        phases[name]()
        res = json.loads(ask(p, "end", "RES "))
        print(f"=== {name}: N={N} garbage={res['garbage']} ({res['garbage'] / N:.2f}/req) in cycles={res['in_cycles']}")
        print("  by type:")
        for t, n in res["by_type"]:
            print(f"    {n:7d} {n / N:6.2f}/req  {t}")
        print("  cycles (strongly connected components), by makeup:")
        for n, sig in res["cycles"]:
            print(f"    {n:6d} x {sig}")
    p.stdin.write("quit\n")
    p.stdin.flush()
    p.wait()


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        serve()
    else:
        main()
