"""Check wok's CUDA path on a GPU, in well under 5 minutes, and print a short table.

    python bench/gpu_check.py [--json gpu_check.json] [--batches 60]

What it checks, on --device (default cuda:0; `auto` as the server reads it, refused without CUDA):
  * pinned host buffers: every slot's input and output buffers are page-locked;
  * overlap: with pipeline_depth 2, the copy-in of batch k+1 runs while batch k computes
    (read from the batches' own CUDA events, on one time base), and throughput against
    pipeline_depth 1 measured side by side in the same run;
  * per-stage timings (assemble, H2D, compute, D2H) from CUDA events, medians over the batches
    (nearest-rank, the ⌈n/2⌉-th smallest, as every percentile of one run's samples in the bench);
  * a real server on loopback serving `mlp` on the GPU: 512 concurrent requests give the
    CPU's answers (rtol 1e-3, TF32 allowed) and the mean batch size.
Exits 1 when a check fails; when the server's stop gives up on a model thread still running a batch (or a
start cancelled, a Ctrl-C, leaves one loading or warming up, or a stop cancelled leaves one in a batch), at once,
its figures unreported, as `wok serve` exits then (Python's exit would wait for that thread), the error that ended
the check, if one did, printed first; as well when the server lost its device to a device-side error (as `wok
serve`, without the frees at exit that would abort the process);
on a second Ctrl-C in the server check, at once, as `wok serve` does on a second signal; and when --json cannot be
written at the end (the figures are then kept in a temporary wok-bench-*.json, named on stderr). `--device cpu`
runs the same steps without a GPU, as a dry run of the script itself (no overlap or pinning is expected there);
give it small sizes, as the default model takes over half an hour on a CPU:

    python bench/gpu_check.py --device cpu --hidden 512 --layers 1 --rows 64 --batches 10
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import statistics
import sys
import threading
import time
import traceback

import numpy as np
import torch

from wok.bench.analysis import latency_summary
from wok.bench.outputs import refuse_unwritable, write_final, write_json_text
from wok.bench.payloads import integer_refusal
from wok.config import InstanceConfig, check_device
from wok.errors import ModelExecutionError
from wok.executor import Executor, resolve_devices
from wok.models import build_demo

# Overlap can only show when a batch's compute outlasts the host's work on the next one
# (assembling 1024 x 8192 FP32 rows into the pinned buffer, then the copy-in): on an H200
# (2026-11-30) assembly took 6.5 ms and copy-in 0.7 ms, while one 8192x2048 layer computed
# in 0.8 ms, so the GPU sat idle between batches and no copy ran during compute. Four
# 8192-wide layers compute for about 11 ms (1024 rows x 537 MFLOP at ~50 TFLOP/s FP32).
# The default sizes take over half an hour on a CPU; these take seconds.
CPU_DRY_RUN = "--device cpu --hidden 512 --layers 1 --rows 64 --batches 10"
MIN_BATCHES = 2
OVERLAP_MODEL = dict(in_features=8192, hidden=8192, out_features=256, layers=4, max_batch_size=1024)


def resolve_device(spec: str) -> torch.device:
    """The device `spec` (a `check_device` form) names, as the server resolves it (`wok.executor.resolve_devices`,
    called here: `auto` was reported and checked as the CPU while the executor ran it on the GPU, and cuda:1 reported
    GPU 0's name). Raises ValueError, in this script's words, for a device this machine does not have, and for `auto`
    where it would be the CPU: this script checks the CUDA path, and at its default sizes a CPU takes half an hour (a
    dry run names the CPU, and small sizes, itself)."""
    try:
        device = resolve_devices([spec])[0]
    except ModelExecutionError as exc:
        if not torch.cuda.is_available():
            raise ValueError(f"no CUDA device; run it on a GPU machine (or `{CPU_DRY_RUN}` for a dry run)") from exc
        count = torch.cuda.device_count()
        raise ValueError(
            f"--device {spec}: this machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}"
        ) from exc
    if spec == "auto" and device.type != "cuda":
        raise ValueError(
            "--device auto: no CUDA device (torch.cuda.is_available() is False); this script checks the CUDA path: "
            f"run it on a GPU machine (or `{CPU_DRY_RUN}` for a dry run)"
        )
    return device


def drive(executor: Executor, batches: list[list[dict]], depth: int) -> tuple[float, list]:
    """Run the batches keeping `depth` in flight on instance 0; wall seconds and results."""
    inst = executor.instances[0]
    pending, results = [], []
    t0 = time.perf_counter()
    for k, reqs in enumerate(batches):
        if len(pending) == depth:
            results.append(pending.pop(0).result(120))
        pending.append(inst.submit(reqs, [r["INPUT0"].shape[0] for r in reqs], k % depth))
    results += [f.result(120) for f in pending]
    return time.perf_counter() - t0, results


def overlaps(results) -> tuple[int, int]:
    """(pairs where copy-in of k+1 started before compute of k ended, pairs checked)."""
    if results[0].events is None:
        return 0, 0
    base = results[0].events[0]
    at = [[base.elapsed_time(e) for e in r.events] for r in results]
    hits = sum(1 for k in range(len(at) - 1) if at[k + 1][0] < at[k][3] and at[k + 1][1] > at[k][2])
    return hits, len(at) - 1


def stage_medians(results) -> dict[str, float]:
    """Each stage's median over the run's batches, ms: nearest-rank, a time some batch took (the
    mean of the middle two of an even count before 2026-12-05)."""
    return {
        stage: 1e3 * latency_summary([getattr(r.times, stage) for r in results])["p50"]
        for stage in ("assemble", "h2d", "compute", "d2h")
    }


class LeftRunning(RuntimeError):
    """The server's stop, or its cancelled start's clean-up, gave up on a model thread still running, or its stop was
    cancelled with one still in a batch (its `abandoned_work`): the process must leave through os._exit, as `wok
    serve` does, and its figures are of a server that did not stop."""


class LostDevice(RuntimeError):
    """A device the server's model ran on was lost to a device-side error (its `device_lost`): torch frees its memory
    at exit through calls that now fail, and a failure in a destructor aborts the process (SIGABRT, seen on an H200);
    the process leaves through os._exit, without those frees, as `wok serve` does."""


@contextlib.asynccontextmanager
async def serving(servable, grace: float = 10.0):
    """A real server on loopback serving `servable`, stopped with `grace` however the block ends, a failed or
    cancelled start included; LeftRunning when that stop (or the start's own clean-up) gave up on a model thread
    still running, else LostDevice when the server lost its device, raised in place of the block's end."""
    from wok.app import WokServer
    from wok.config import server_settings
    from wok.repository import ModelRepository

    server = WokServer(server_settings(grpc_port=0, metrics_port=None), ModelRepository([servable], "gpu check"))
    start_cancelled = False
    try:
        try:
            await server.start()
        except asyncio.CancelledError:
            start_cancelled = True
            raise
        yield server
    finally:
        stop_cancelled = False
        try:
            await server.stop(grace=grace)
        except asyncio.CancelledError:
            stop_cancelled = True
            raise
        finally:
            # Read as `wok serve` reads it (its _exit_if_held): unread, the script reported on a server whose model
            # still ran, and Python's exit then waited for that thread. Read when the stop raised too: it gives a
            # model up before it raises a failure of its other steps. Raised over the block's error or the stop's,
            # its __context__ (which _exit_if_left_running says).
            if server.abandoned_work:
                name = f"'{servable.name}'"
                if start_cancelled:
                    # Its clean-up gave the model up (its log line says in which step): "as it stopped" named the
                    # stop after it, which had nothing to give up.
                    left = (
                        f"the server's start was cancelled with model {name} still loading or warming up on its thread"
                    )
                elif stop_cancelled:
                    # A cancelled stop gave nothing up: it ended before the executors' shutdown, the batch running on.
                    left = f"the server's stop was cancelled with model {name} still running on its thread"
                else:
                    left = f"the server gave model {name} up, still running on its thread, as it stopped"
                raise LeftRunning(left)
            # Read as `wok serve` reads it too: unread, the check failed on the model's refusals (UNAVAILABLE) and
            # the process went on to Python's exit and torch's frees on the lost device.
            if server.device_lost is not None:
                raise LostDevice(str(server.device_lost))


async def _exit_if_left_running(check):
    """`check`'s result; on LeftRunning (or LostDevice), said, and the process left through os._exit(1) at once,
    from inside the loop: asyncio.run's end waits for the loop's pool threads, which a load or a warm-up given up on
    still holds (a Ctrl-C's: the script left only when the model's step ended). The error it was raised over (the
    check's own, its server's stop's) is printed first: only the LeftRunning line was, and the failure that ended the
    check went unsaid. A second Ctrl-C leaves at once too (_second_ctrl_c_exits)."""
    with _second_ctrl_c_exits():
        try:
            return await check
        except (LeftRunning, LostDevice) as exc:
            before = exc.__context__
            if before is not None and not isinstance(before, asyncio.CancelledError):  # not a Ctrl-C's cancellation
                traceback.print_exception(before, file=sys.stderr)
            unfreed = ", without freeing the lost device's memory" if isinstance(exc, LostDevice) else ""
            print(f"gpu_check: {exc}; exiting without a report{unfreed}", file=sys.stderr, flush=True)
            os._exit(1)


@contextlib.contextmanager
def _second_ctrl_c_exits():
    """While in the block (on the main thread, SIGINT handled there): the first Ctrl-C goes to the handler in place
    (asyncio.run's, which cancels the check), a second one leaves the process at once through os._exit(1), saying
    so, as `wok serve`'s second signal does. asyncio.run's own raised KeyboardInterrupt out of the loop, past the
    os._exit of a start given up, and asyncio.run's end then waited for the thread of that model's load or warm-up."""
    first = signal.getsignal(signal.SIGINT)
    if not callable(first) or threading.current_thread() is not threading.main_thread():
        yield
        return
    interrupted = False

    def on_sigint(signum, frame) -> None:
        nonlocal interrupted
        if interrupted:
            # os.write: print's buffered stream may be in use by the code the signal interrupted.
            os.write(2, b"gpu_check: a second Ctrl-C; exiting at once, without a report\n")
            os._exit(1)
        interrupted = True
        first(signum, frame)

    signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        # asyncio.run puts the default back only where its own handler is the one in place.
        if signal.getsignal(signal.SIGINT) is on_sigint:
            signal.signal(signal.SIGINT, first)


async def server_check(device: str) -> dict:
    import grpc

    from wok.codec import decode_response, encode_request
    from wok.config import model_config_from_dict
    from wok.servable import Servable
    from wok.v2pb import grpc_service_pb2 as pb
    from wok.v2pb import grpc_service_pb2_grpc as pb_grpc

    base = build_demo("mlp")
    data = base.config.model_dump()
    data["instances"] = {"count": 1, "devices": [device], "pipeline_depth": 2}
    servable = Servable(model_config_from_dict(data, "gpu check"), base._module)
    async with serving(servable) as server:
        xs = np.random.default_rng(0).standard_normal((512, 256), dtype=np.float32)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            stub = pb_grpc.GRPCInferenceServiceStub(ch)
            t0 = time.perf_counter()
            resps = await asyncio.gather(
                *(stub.ModelInfer(encode_request("mlp", {"INPUT0": xs[i : i + 1]})) for i in range(512))
            )
            wall = time.perf_counter() - t0
            st = (await stub.ModelStatistics(pb.ModelStatisticsRequest(name="mlp"))).model_stats[0]
        got = np.concatenate([decode_response(r)["OUTPUT0"] for r in resps])
    with torch.inference_mode():
        want = build_demo("mlp")._module(torch.from_numpy(xs)).numpy()
    return {
        "requests": 512,
        "wall_s": wall,
        "mean_batch_size": st.inference_count / st.execution_count,
        "max_abs_err": float(np.abs(got - want).max()),
        "equal_to_cpu": bool(np.allclose(got, want, rtol=1e-3, atol=1e-3)),
    }


def build_parser() -> argparse.ArgumentParser:
    """This script's parser (tests/deploy/test_doc_commands.py parses the docs' command lines with it)."""
    from wok.cliargs import ArgumentParser  # argparse's, its refusals in wok's words

    ap = ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda:0", help="cuda:N, cuda, auto or cpu (default %(default)s)")
    ap.add_argument("--batches", type=int, default=60)
    ap.add_argument("--rows", type=int, default=1024, help="rows per batch of the copy-heavy model")
    ap.add_argument("--hidden", type=int, default=OVERLAP_MODEL["hidden"], help="width of the hidden layers")
    ap.add_argument("--layers", type=int, default=OVERLAP_MODEL["layers"], help="hidden layers")
    ap.add_argument("--json", help="write the figures here")
    return ap


def main(argv=None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    # Checked before the model is built: a zero would fail only after it (or size nothing). The
    # overlap check judges pairs of batches in flight together: one batch leaves it nothing.
    for option, least, why in (
        ("--batches", MIN_BATCHES, " (the overlap check needs a pair of batches)"),
        ("--rows", 1, ""),
        ("--hidden", 1, ""),
        ("--layers", 1, ""),
    ):
        value = getattr(args, option.removeprefix("--"))
        if (refusal := integer_refusal(option, value, least, why)) is not None:
            ap.error(refusal)
    try:
        check_device(args.device)  # else refused by InstanceConfig with a traceback, once the model is built
    except ValueError as exc:
        ap.error(f"--device: {exc}")
    refuse_unwritable(ap, args, "--json")
    try:
        device = resolve_device(args.device)  # else the executor's refusal, a traceback, once the model is built
    except ValueError as exc:
        print(f"gpu_check: {exc}", file=sys.stderr)
        return 2
    args.device = str(device)
    index = device.index if device.type == "cuda" else None

    model = {**OVERLAP_MODEL, "hidden": args.hidden, "layers": args.layers}
    s = build_demo("mlp", **model)
    rng = np.random.default_rng(1)
    batches = [[{"INPUT0": rng.standard_normal((args.rows, 8192), dtype=np.float32)}] for _ in range(args.batches)]
    runs = {}
    for depth in (1, 2, 1, 2):  # interleaved, so drift on a shared machine hits both alike
        ex = Executor(s, InstanceConfig(count=1, devices=(args.device,), pipeline_depth=depth))
        try:
            drive(ex, batches[:4], depth)  # warm-up: allocator, kernels
            wall, results = drive(ex, batches, depth)
            pinned = all(
                b.is_pinned()
                for slot in ex.instances[0].slots
                for b in (*slot.inputs._flat.values(), *slot.outputs._flat.values())
            )
        finally:
            ex.shutdown()
        runs.setdefault(depth, []).append(
            {"wall_s": wall, "pinned": pinned, "overlap": overlaps(results), "stages_ms": stage_medians(results)}
        )

    served = asyncio.run(_exit_if_left_running(server_check(args.device)))
    d1 = statistics.median(r["wall_s"] for r in runs[1])
    d2 = statistics.median(r["wall_s"] for r in runs[2])
    hits, pairs = runs[2][-1]["overlap"]
    report = {
        "schema": "wok.gpu_check/2",
        "device": "cpu" if index is None else torch.cuda.get_device_name(index),
        "device_index": index,
        "torch": torch.__version__,
        "overlap_model": model,
        "rows_per_batch": args.rows,
        "batches": args.batches,
        "depth1_wall_s": d1,
        "depth2_wall_s": d2,
        "speedup_depth2_over_depth1": d1 / d2,
        "overlapping_pairs": hits,
        "pairs": pairs,
        "pinned_buffers": all(r["pinned"] for rs in runs.values() for r in rs),
        "stages_ms_depth2": runs[2][-1]["stages_ms"],
        "server": served,
    }
    cuda = index is not None
    # None: not applicable on a CPU dry run (no pinning, no streams).
    checks = {
        "pinned host buffers": report["pinned_buffers"] if cuda else None,
        "copy-in overlaps compute (depth 2)": hits > 0 if cuda else None,
        "served results equal the CPU's": served["equal_to_cpu"],
    }
    st = report["stages_ms_depth2"]
    print(f"device {report['device']}, torch {report['torch']}, {args.batches} batches of {args.rows}x8192 FP32")
    print(f"{'figure':<44}{'value':>14}")
    rows = [
        ("wall, pipeline_depth 1 (median of 2) s", f"{d1:.3f}"),
        ("wall, pipeline_depth 2 (median of 2) s", f"{d2:.3f}"),
        ("speed-up depth 2 / depth 1", f"{d1 / d2:.2f}x"),
        ("batch pairs with copy-in during compute", f"{hits}/{pairs}"),
        (
            "median assemble / H2D / compute / D2H ms",
            f"{st['assemble']:.2f}/{st['h2d']:.2f}/{st['compute']:.2f}/{st['d2h']:.2f}",
        ),
        ("server: 512 concurrent mlp requests, s", f"{served['wall_s']:.3f}"),
        ("server: mean batch size", f"{served['mean_batch_size']:.1f}"),
        ("server: max |GPU - CPU|", f"{served['max_abs_err']:.2e}"),
    ]
    for k, v in rows:
        print(f"{k:<44}{v:>14}")
    if cuda and hits == 0 and st["assemble"] + st["h2d"] > st["compute"]:
        print(
            f"host-bound: assembling the next batch ({st['assemble']:.2f} ms) and copying it in "
            f"({st['h2d']:.2f} ms) outlast a batch's compute ({st['compute']:.2f} ms), so no copy-in can "
            "run during compute; raise --hidden or --layers"
        )
    for name, ok in checks.items():
        print(f"{'n/a ' if ok is None else 'PASS' if ok else 'FAIL'}  {name}")
    report["checks"] = checks
    failed = write_final(report, [("--json", args.json, write_json_text)])
    if failed:
        print(f"gpu_check: {failed}", file=sys.stderr)
        return 1
    return 1 if any(ok is False for ok in checks.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
