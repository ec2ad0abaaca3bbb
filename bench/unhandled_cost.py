"""What counting the calls that end before wok's handler costs per call (server/unhandled.py).

    python bench/unhandled_cost.py [--calls 2000] [--reps 101] [--json out.json]

`UnhandledCalls` is a server interceptor, and grpc.aio runs its interceptor chain for every call
once any is installed (without one, none runs). What it adds per ModelInfer call is measured here
as grpc.aio (1.85) pays it: its own handler lookup (`cygrpc._find_method_handler`, which runs the
interceptors) in a task per call, then the handler's `started()` mark, on uvloop; nothing else of
a call (no gRPC core, no model), so that the difference is not lost in a whole server's noise
(±15 % between paired runs here: docs/metrics.md). The variants run interleaved, each rep in
turn forwards and backwards, and each figure is the thread's CPU time per call; the verdicts are
medians of the paired ratios and the difference of the medians.

Variants: no interceptor (wok with no token before the counter), the counter alone, a done callback
per call's task instead (the obvious design, kept for the comparison), and with a bearer token
configured the token's interceptor alone and with the counter behind it.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time

from wok.bench.outputs import finish_json, refuse_unwritable
from wok.bench.payloads import integer_refusal

SCHEMA = "wok.unhandled_cost/1"
METHOD = "/inference.GRPCInferenceService/ModelInfer"
TOKEN = "tok-unhandled-cost-5b1e0c7d"  # a made-up token, checked by the token interceptor as any other
# The per-request server CPU the fractions are given against: wok at 1,000 QPS on a normal-speed hour
# of the 2-core machine (docs/performance.md, "Against the targets").
REFERENCE_US = 410.0
# (variant, baseline) pairs reported as ratios.
PAIRS = (("counter", "none"), ("done_callback", "none"), ("token_counter", "token"))


class _DoneCallbackDesign:
    """The design not taken: a done callback on each call's task, the task looked up again at the mark."""

    def __init__(self, record) -> None:
        self._waiting: dict = {}
        self._record = record

    def intercept_service(self, continuation, details):
        if details.method == METHOD:
            task = asyncio.current_task()
            self._waiting[task] = details.method
            task.add_done_callback(self._ended)
        return continuation(details)

    def started(self) -> None:
        self._waiting.pop(asyncio.current_task(), None)

    def _ended(self, task) -> None:
        method = self._waiting.pop(task, None)
        if method is not None:
            self._record(method)


def _variants(counted: list) -> tuple[dict, object]:
    """name → (interceptors, the handler's mark or None), made on the running loop; and the counter,
    whose calls `counted` records."""
    from wok.auth import BearerTokenInterceptor, TokenCheck
    from wok.unhandled import UnhandledCalls

    counter = UnhandledCalls((METHOD,), counted.append)
    callback = _DoneCallbackDesign(counted.append)
    token = BearerTokenInterceptor(TokenCheck([TOKEN]))
    return {
        "none": ((), None),
        "counter": ((counter,), counter.started),
        "done_callback": ((callback,), callback.started),
        "token": ((token,), None),
        "token_counter": ((token, counter), counter.started),
    }, counter


async def _measure(calls: int, reps: int, progress) -> tuple[dict, int]:
    from grpc._cython import cygrpc

    from wok.service import _MAKE_HANDLER

    class _Servicer:
        async def ModelInfer(self, request, context):
            return None

    resolver = cygrpc._MethodResolver([], {METHOD: _MAKE_HANDLER[False, False](_Servicer().ModelInfer)})
    metadata = (("authorization", f"Bearer {TOKEN}"), ("user-agent", "grpc-python/1.85"))
    counted: list = []
    variants, counter = _variants(counted)
    loop = asyncio.get_running_loop()

    async def call(interceptors, mark):
        handler = await cygrpc._find_method_handler(METHOD, metadata, resolver, interceptors)
        if handler is None:  # the token refused the call, or the lookup failed: not what is measured
            raise RuntimeError(f"the handler lookup of {METHOD} found nothing")
        if mark is not None:
            mark()

    async def run(interceptors, mark) -> float:
        began = time.thread_time()
        await asyncio.gather(*[loop.create_task(call(interceptors, mark)) for _ in range(calls)])
        # Two passes: the done callbacks (the design not taken) run after their tasks.
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        return (time.thread_time() - began) / calls

    for v in variants.values():  # warm every path once, out of the figures
        await run(*v)
    per_call: dict[str, list[float]] = {name: [] for name in variants}
    for rep in range(reps):
        order = list(variants.items())
        for name, v in order if rep % 2 == 0 else reversed(order):
            per_call[name].append(await run(*v))
        progress(rep + 1)
    counter.sweep()
    # Every call reached its handler: none may be counted as ended before it.
    return per_call, len(counted) + counter.waiting


def build_parser() -> argparse.ArgumentParser:
    """This script's parser (tests/deploy/test_doc_commands.py parses the docs' command lines with it)."""
    from wok.cliargs import ArgumentParser  # argparse's, its refusals in wok's words

    ap = ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=2000, help="calls per variant and rep (default 2000)")
    ap.add_argument("--reps", type=int, default=101, help="repetitions, each variant once per rep (default 101)")
    ap.add_argument("--json", help="write the figures here (schema wok.unhandled_cost/1)")
    return ap


def main(argv=None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    refuse_unwritable(ap, args, "--json")
    for option, value in (("--calls", args.calls), ("--reps", args.reps)):
        if (refusal := integer_refusal(option, value, 1)) is not None:
            ap.error(refusal)

    import uvloop

    def progress(done: int) -> None:
        if done == args.reps or done % 10 == 0:
            print(f"rep {done}/{args.reps}", file=sys.stderr, flush=True)

    per_call, miscounted = uvloop.run(_measure(args.calls, args.reps, progress))
    if miscounted:
        print(f"unhandled_cost: {miscounted} call(s) that reached the handler were counted", file=sys.stderr)
        return 1
    medians = {name: 1e6 * statistics.median(v) for name, v in per_call.items()}
    pairs = []
    for variant, baseline in PAIRS:
        added = medians[variant] - medians[baseline]
        pairs.append(
            {
                "variant": variant,
                "baseline": baseline,
                "median_ratio": statistics.median(a / b for a, b in zip(per_call[variant], per_call[baseline])),
                "added_us": added,
                "of_reference": added / REFERENCE_US,
            }
        )
    report = {
        "schema": SCHEMA,
        "calls": args.calls,
        "reps": args.reps,
        "reference_us": REFERENCE_US,
        "median_us_per_call": medians,
        "pairs": pairs,
    }
    print(f"{'variant':<16}{'median µs/call':>16}")
    for name, value in medians.items():
        print(f"{name:<16}{value:>16.2f}")
    print(f"{'variant':<16}{'over':<8}{'ratio':>8}{'added µs':>10}{'of 410 µs':>11}")
    for p in pairs:
        print(
            f"{p['variant']:<16}{p['baseline']:<8}{p['median_ratio']:>8.3f}{p['added_us']:>10.2f}"
            f"{100 * p['of_reference']:>10.2f}%"
        )
    return finish_json(report, args.json, "unhandled_cost: ")


if __name__ == "__main__":
    sys.exit(main())
