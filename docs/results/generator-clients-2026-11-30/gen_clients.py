"""Load-generator CPU per request for five ways of sending the same unary calls (ad hoc, 2026-11-30).

Two processes split one Poisson schedule, as `wok bench ramp`'s default two workers do, and
send the same pre-serialized ModelInferRequest (mlp, one row) open loop; each reports its own
CPU seconds (getrusage, all threads) over the step. Kinds:
  aio          the bench's worker (`wok.bench.workers._run_share`) on a plain grpc.aio channel
  aio-bench    the same on the bench's channel options (round_robin, health check, retries)
  aio-noretry  the bench's options without retries, and gRPC's retry machinery off
  aio-cb       grpc.aio without a task per request: `call.add_done_callback` for the done time
  sync         grpc's sync API: `future()` from one pacing thread, done callbacks on gRPC's thread
Usage: python gen_clients.py TARGET QPS SECONDS KINDS REPS OUT.json   (a server must listen on TARGET)
"""

import asyncio
import gc
import json
import multiprocessing as mp
import resource
import sys
import threading
import time
from types import SimpleNamespace

import numpy as np

METHOD = "/inference.GRPCInferenceService/ModelInfer"


def _payload() -> bytes:
    from wok.v2pb import grpc_service_pb2 as pb

    r = pb.ModelInferRequest(model_name="mlp")
    r.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 256])
    r.raw_input_contents.append(np.random.rand(1, 256).astype(np.float32).tobytes())
    return r.SerializeToString()


def _cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


async def _run_cb(call, p, start, times):
    from wok.timers import PreciseSleeper

    n = len(times)
    sent, done, codes = np.full(n, np.nan), np.full(n, np.nan), np.zeros(n, np.int16)
    sleeper = PreciseSleeper(asyncio.get_running_loop())
    calls = []
    for i in range(n):
        await sleeper.until(start + times[i])
        sent[i] = time.monotonic() - start
        c = call(p, timeout=5)
        c.add_done_callback(lambda c, i=i: done.__setitem__(i, time.monotonic() - start))
        calls.append(c)
    sleeper.close()
    for i, c in enumerate(calls):
        codes[i] = (await c.code()).value[0]
    return SimpleNamespace(sent=sent, done=done, codes=codes)


def _run_aio(kind, target, times, start, q):
    gc.disable()  # as the bench's workers do
    import grpc
    import uvloop

    from wok.bench.workers import Share, _run_share
    from wok.clients.channel import channel_options

    uvloop.install()
    p = _payload()
    opts = None
    if kind == "aio-bench":
        opts = channel_options(None, retries=True)
    elif kind == "aio-noretry":
        opts = [*channel_options(None, retries=False), ("grpc.enable_retries", 0)]

    async def main():
        async with grpc.aio.insecure_channel(target, options=opts) as ch:
            call = ch.unary_unary(METHOD, request_serializer=None, response_deserializer=None)
            await call(p, timeout=5)
            c0 = _cpu_s()
            if kind == "aio-cb":
                out = await _run_cb(call, p, start, times)
            else:
                out = await _run_share(call, [p], Share(start, times, np.zeros(len(times), int), 5.0))
            return out, _cpu_s() - c0

    out, cpu = asyncio.run(main())
    q.put((times, out.sent, out.done, out.codes, cpu))


def _run_sync(kind, target, times, start, q):
    gc.disable()
    import grpc

    p = _payload()
    n = len(times)
    # -1 until the call's callback runs: a call that never finished must not count as OK (0).
    sent, done, codes = np.full(n, np.nan), np.full(n, np.nan), np.full(n, -1, np.int16)
    channel = grpc.insecure_channel(target)
    call = channel.unary_unary(METHOD, request_serializer=None, response_deserializer=None)
    call(p, timeout=5)
    left = [n]
    finished = threading.Event()

    def on_done(f, i):
        done[i] = time.monotonic() - start
        codes[i] = f.code().value[0]
        left[0] -= 1
        if left[0] == 0:
            finished.set()

    c0 = _cpu_s()
    for i in range(n):
        wait = start + times[i] - time.monotonic()
        if wait > 0:
            time.sleep(wait)  # clock_nanosleep: about 50 µs of timer slack
        sent[i] = time.monotonic() - start
        call.future(p, timeout=5).add_done_callback(lambda f, i=i: on_done(f, i))
    if not finished.wait(30):
        raise TimeoutError(f"sync: {left[0]} of {n} calls unfinished after 30 s")
    cpu = _cpu_s() - c0
    channel.close()
    q.put((times, sent, done, codes, cpu))


def main() -> None:
    target, qps, seconds = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
    kinds, reps, out = sys.argv[4].split(","), int(sys.argv[5]), sys.argv[6]
    rows = []
    ctx = mp.get_context("spawn")
    for rep in range(reps):
        for kind in kinds:  # interleaved: each rep runs every kind once, on the same schedule
            t = np.cumsum(np.random.default_rng(rep).exponential(1 / qps, int(qps * seconds * 1.2)))
            t = t[t < seconds]
            start = time.monotonic() + 1.5
            q = ctx.Queue()
            fn = _run_sync if kind == "sync" else _run_aio
            procs = [ctx.Process(target=fn, args=(kind, target, t[w::2], start, q)) for w in range(2)]
            for pr in procs:
                pr.start()
            parts = [q.get(timeout=seconds + 60) for _ in procs]  # a worker that raised sends nothing
            for pr in procs:
                pr.join()
            lat = np.concatenate([d - i for i, s, d, c, cpu in parts]) * 1e3
            lag = np.concatenate([s - i for i, s, d, c, cpu in parts]) * 1e3
            row = {
                "rep": rep,
                "kind": kind,
                "offered_qps": qps,
                "requests": len(t),
                "ok": int(sum((c == 0).sum() for i, s, d, c, cpu in parts)),
                "generator_cpu_us_per_request": sum(p[4] for p in parts) / len(t) * 1e6,
                "p50_ms": float(np.percentile(lat, 50)),
                "p99_ms": float(np.percentile(lat, 99)),
                "dispatch_lag_p99_ms": float(np.percentile(lag, 99)),
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    with open(out, "w") as f:
        json.dump({"schema": "wok.adhoc.generator-clients/1", "argv": sys.argv[1:], "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
