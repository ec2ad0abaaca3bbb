"""Per call: grpc.aio's context.add_done_callback (a cycle per call) against the call task's own done callback."""

import asyncio
import functools
import gc
import statistics
import sys
import time

import uvloop


class RPCState:  # as grpc.aio's: its callbacks list, run by a done callback of the call's task
    def __init__(self):
        self.callbacks = []


class Context:
    def __init__(self, state):
        self._rpc_state = state

    def add_done_callback(self, callback):
        self._rpc_state.callbacks.append(functools.partial(callback, self))


def handle_callbacks_for(state):
    def handle_callbacks(_task):
        for cb in state.callbacks:
            cb()

    return handle_callbacks


class Service:
    unwritten = 0

    def written(self, _):
        self.unwritten -= 1


async def handler(svc, ctx, how):
    svc.unwritten += 1
    if how == "context":
        ctx.add_done_callback(svc.written)
    else:
        asyncio.current_task().add_done_callback(svc.written)
    await asyncio.sleep(0)


async def run(how, n):
    svc = Service()
    loop = asyncio.get_running_loop()
    t0 = time.process_time()
    batch = 16
    for _ in range(n // batch):
        tasks = []
        for _ in range(batch):
            st = RPCState()
            t = loop.create_task(handler(svc, Context(st), how))
            t.add_done_callback(handle_callbacks_for(st))
            tasks.append(t)
        await asyncio.gather(*tasks)
    await asyncio.sleep(0)
    assert svc.unwritten == 0
    return (time.process_time() - t0) / n * 1e6


async def main():
    gc.collect()
    gc.freeze()
    res = {"context": [], "task": []}
    for _ in range(int(sys.argv[1])):
        for how in res:
            res[how].append(await run(how, 100_000))
    for how, v in res.items():
        print(f"{how:8s} median {statistics.median(v):.3f} us/call  {[round(x, 3) for x in v]}")


uvloop.run(main())
