"""What a batch costs the model's worker thread when batches come back to back, and when they are spaced.

    python bench/cold_batch.py --model mlp --sizes 1,7,32 --gap 5ms --batches 300 --json cold.json

Runs the demo model through wok's Executor (the server's own path), one batch at a time, and
reads the worker thread's CPU time from /proc (Linux) around the run: once with batches back to
back, once with `--gap` of idle between them, as a server sees at low load with a queue delay
window. For a model whose weights outgrow the core's cache (mlp: 6.3 MB of fp32 weights, 1 MiB of
L2 per core here), a spaced batch reads them from memory again, so its fixed cost α is paid at
memory speed: that, not the server's Python, is most of the model thread's CPU per request at
low load.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from wok.bench.outputs import refuse_unwritable, write_final, write_json_text
from wok.bench.payloads import integer_refusal
from wok.bench.report import bench_header

SCHEMA = "wok.cold_batch/1"


def thread_cpu_s(tid: int) -> float:
    fields = Path(f"/proc/{os.getpid()}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def worker_tid(name: str) -> int:
    """The thread wok.executor named `name` for the OS (its worker), from /proc/self/task."""
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        if (task / "comm").read_text().strip() == name:
            return int(task.name)
    raise RuntimeError(f"no thread named {name!r} in this process")


def measure(instance, requests, rows, batches: int, gap_s: float, tid: int) -> dict:
    cpu0, wall0 = thread_cpu_s(tid), time.perf_counter()
    busy = 0.0
    for _ in range(batches):
        result = instance.submit(requests, rows, 0).result()
        busy += result.finished - result.started
        if gap_s:
            time.sleep(gap_s)
    cpu = thread_cpu_s(tid) - cpu0
    return {
        "gap_s": gap_s,
        "batches": batches,
        "worker_cpu_us_per_batch": 1e6 * cpu / batches,
        "batch_time_us": 1e6 * busy / batches,
        "wall_s": time.perf_counter() - wall0,
    }


def build_parser() -> argparse.ArgumentParser:
    """This script's parser (tests/deploy/test_doc_commands.py parses the docs' command lines with it)."""
    from wok.bench.arrivals import parse_duration
    from wok.cliargs import ArgumentParser  # argparse's, its refusals in wok's words

    p = ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="mlp", help="a demo model with one FP32 input (default mlp)")
    p.add_argument("--sizes", default="1,7,32", help="batch sizes (rows), comma-separated")
    p.add_argument("--gap", type=parse_duration, default="5ms", help="idle time between spaced batches")
    p.add_argument("--batches", type=int, default=300, help="batches per measurement")
    p.add_argument("--torch-threads", type=int, help="torch intra-op threads (default: torch's choice)")
    p.add_argument("--json", type=Path)
    return p


def main(argv=None) -> int:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as `wok serve` sets it, before torch loads
    import numpy as np
    import torch

    from wok.config import InstanceConfig
    from wok.errors import quoted_name
    from wok.executor import Executor
    from wok.models import DEMO_MODELS, build_demo
    from wok.numerals import digits_note, read_int

    p = build_parser()
    args = p.parse_args(argv)
    refuse_unwritable(p, args, "--json")
    if not sys.platform.startswith("linux"):
        p.error("reads thread CPU time from Linux's /proc")
    try:
        sizes = [read_int(x) for x in args.sizes.split(",")]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        p.error(
            f"--sizes: expected positive integers, comma-separated; got {quoted_name(args.sizes)}"
            f"{digits_note(args.sizes)}"
        )
    if (refusal := integer_refusal("--batches", args.batches, 1)) is not None:
        p.error(refusal)
    if (
        args.torch_threads is not None
        and (refusal := integer_refusal("--torch-threads", args.torch_threads, 1)) is not None
    ):
        p.error(refusal)
    if args.model not in DEMO_MODELS:
        p.error(f"--model: expected a demo model with one FP32 input (mlp); got {quoted_name(args.model)}")
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    servable = build_demo(args.model)
    inputs = servable.config.inputs
    # The batches are rows of ones of one input's fixed dims (recsys has two inputs, encoder variable dims).
    if len(inputs) != 1 or min(inputs[0].dims, default=1) < 0:
        got = ", ".join(f"{i.name} {i.datatype}{list(i.dims)}" for i in inputs)
        p.error(f"--model {args.model}: expected a demo model with one FP32 input of fixed dims; got inputs {got}")
    (inp,) = inputs
    executor = Executor(servable, InstanceConfig(count=1, devices=("cpu",), pipeline_depth=1))
    instance = executor.instances[0]
    try:
        out = []
        for n in sizes:
            requests = [{inp.name: np.ones((1, *inp.dims), np.float32)} for _ in range(n)]
            rows = [1] * n
            for _ in range(20):
                instance.submit(requests, rows, 0).result()
            tid = worker_tid("wok-run-0")
            hot = measure(instance, requests, rows, args.batches, 0.0, tid)
            spaced = measure(instance, requests, rows, args.batches, args.gap, tid)
            out.append({"batch_size": n, "back_to_back": hot, "spaced": spaced})
            print(
                f"n={n:3d}  back to back: {hot['worker_cpu_us_per_batch']:7.0f} µs CPU/batch "
                f"({hot['batch_time_us']:6.0f} µs each)   spaced {1e3 * args.gap:g} ms: "
                f"{spaced['worker_cpu_us_per_batch']:7.0f} µs CPU/batch ({spaced['batch_time_us']:6.0f} µs each)"
            )
    finally:
        executor.shutdown()
    if args.json:
        config = {k: v for k, v in vars(args).items() if k != "json"} | {"torch_threads_used": torch.get_num_threads()}
        doc = bench_header(SCHEMA, config) | {
            "sizes": out,
        }
        failed = write_final(doc, [("--json", args.json, write_json_text)])
        if failed:
            print(f"cold_batch: {failed}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
