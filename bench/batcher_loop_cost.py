"""The event loop's CPU per request in wok's Batcher, at several git revisions side by side.

    .venv/bin/python bench/batcher_loop_cost.py --rev 89aeba2 --rev HEAD --rev worktree \\
        --reps 7 --n 10000 --json docs/results/batcher-loop-cost-DATE.json

Each revision runs in a process of its own: `worktree` imports this checkout's server/ as it is;
any other REV imports wok as committed at REV, laid out as the package `wok` under
`.bench-peers/wok@SHA/` (bench/compare.py's `wok@REV`, extracted once). The process checks that
every `wok` module it loaded comes from there, and that its batcher.py is REV's (its git blob).
There it builds a real Batcher on a real Executor with a trivial servable (the input times 2; one
instance on the CPU, pipeline depth 2) on uvloop, and drives requests of one row through it in a
closed loop: WINDOW in flight, each answer's done callback submitting the next request, so the
queue stays full and every batch leaves at the max batch size (except in slo_200keys, whose 256 in
flight over 200 keys leave by the slo policy's rules, a few a batch). What it measures is the loop
thread's CPU time (time.thread_time) per request: the batcher's submit, its passes, the timer,
the answers' callbacks; the model worker's thread is left out. Per case: a warm-up run, then
RUNS_PER_PROCESS measured runs, whose median is the process's figure. Each rep runs every
revision once, a fresh process each, in an order rotated by one every rep; the table gives per
case and revision the median [min-max] over the reps, the requests per batch, and the ratio to
the first revision: of the medians, and the median [min-max] of the per-rep ratios (each
revision against the first in the same rep, run minutes apart at most, which cancels most of a
shared host's drift). The output (schema `wok.batcher_loop_cost/1`) is described in
docs/bench-schema.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

SCHEMA = "wok.batcher_loop_cost/1"
ROOT = Path(__file__).resolve().parent.parent
WORKTREE = "worktree"
WINDOW = 64  # requests in flight: eight batches' worth, so every key's queue stays full
MAX_BATCH = 8
DELAY_MS = 2.0  # the fixed policy's max_queue_delay_ms; never reached while the queue is full
TIMEOUT_S = 10.0  # the V2 timeout of the cases that send one: far beyond any answer's wait
RUNS_PER_PROCESS = 3
# name -> (policy, keys, V2 timeout in s or None, requests in flight): keys are batch keys, taken
# round robin. The saturated cases keep WINDOW in flight, so every batch leaves full.
# slo_200keys spreads 256 in flight over 200 keys: a key's queue holds a few requests at most, its
# batches leave by the slo rules (idle, deadline), not full, and every decision faces some 200
# non-empty queues: what a choice linear in the keys costs.
CASES = {
    "fixed_1key": ("fixed", 1, None, WINDOW),
    "fixed_1key_timeout": ("fixed", 1, TIMEOUT_S, WINDOW),
    "fixed_4keys_timeout": ("fixed", 4, TIMEOUT_S, WINDOW),
    "slo_1key": ("slo", 1, None, WINDOW),
    "slo_200keys": ("slo", 200, None, 256),
}


def say(msg: str) -> None:
    print(f"[batcher_loop_cost {datetime.now(timezone.utc).strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def whole_batches(requests: int, keys: int) -> int:
    """`requests` rounded down to a whole number of full batches per key (at least one each): the
    last batch of a key is then as full as the others, and requests per batch reads MAX_BATCH."""
    return max(1, requests // (keys * MAX_BATCH)) * keys * MAX_BATCH


def saturated(case: str) -> bool:
    """Whether every batch of `case` leaves full: each key's share of the window fills whole batches."""
    _, keys, _, window = CASES[case]
    return window >= keys * MAX_BATCH


def case_requests(case: str, requests: int) -> int:
    """A run's requests: whole batches per key where the case is saturated, else `requests` as asked."""
    return whole_batches(requests, CASES[case][1]) if saturated(case) else requests


def git_blob(data: bytes) -> str:
    """Git's object name for a file of these bytes (`git hash-object`)."""
    import hashlib

    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


# --------------------------------------------------------------------------- the child process


def child(job: dict) -> dict:
    """One process's measurement: every case of `job`, wok imported from `job["package_dir"]`."""
    here = str(Path(__file__).resolve().parent)
    # Run as a file, the script's folder (bench/) heads sys.path; nothing of it is wanted here.
    sys.path[:] = [p for p in sys.path if os.path.realpath(p or ".") != here]
    if job["path"] is not None:
        sys.path.insert(0, job["path"])
    import asyncio

    import numpy as np
    import torch
    from torch import nn

    from wok.batcher import Batcher, BatchingPolicy
    from wok.config import model_config_from_dict
    from wok.executor import Executor
    from wok.policy import SloPolicy
    from wok.servable import Servable
    from wok.stats import ModelStats

    try:
        import uvloop

        new_loop, loop_name = uvloop.new_event_loop, "uvloop"
    except ImportError:
        new_loop, loop_name = asyncio.new_event_loop, "asyncio"

    package = os.path.realpath(job["package_dir"])
    strays = sorted(
        f"{name} ({mod.__file__})"
        for name, mod in list(sys.modules.items())
        if (name == "wok" or name.startswith("wok."))
        and getattr(mod, "__file__", None)
        and not os.path.realpath(mod.__file__).startswith(package + os.sep)
    )
    if strays:
        raise RuntimeError(f"revision {job['rev']}: expected every wok module from {package}; got {strays}")
    import wok.batcher

    batcher_file = os.path.realpath(wok.batcher.__file__)
    torch.set_num_threads(1)

    class Double(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2

    cfg = model_config_from_dict(
        {
            "name": "dbl",
            "platform": "python",
            "factory": "unused:unused",  # the servable is built here, not loaded
            "inputs": [{"name": "INPUT0", "datatype": "FP32", "dims": [4]}],
            "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "dims": [4]}],
            "max_batch_size": MAX_BATCH,
            "dynamic_batching": {"max_queue_delay_ms": DELAY_MS},
            "instances": {"count": 1, "devices": ["cpu"], "pipeline_depth": 2},
        },
        "batcher_loop_cost",
    )
    executor = Executor(Servable(cfg, Double()), cfg.instances)
    inputs = {"INPUT0": np.ones((1, 4), np.float32)}

    async def one_run(case: str, count: int) -> dict:
        policy_name, nkeys, timeout, window = CASES[case]
        policy = BatchingPolicy(MAX_BATCH, DELAY_MS / 1e3, ())
        slo = SloPolicy(10.0, MAX_BATCH, 1, seed=(1e-4, 1e-5)) if policy_name == "slo" else None
        batcher = Batcher("dbl", executor, policy, ModelStats("dbl"), slo=slo)
        batcher.start()
        keys = [None] if nkeys == 1 else [f"k{i}" for i in range(nkeys)]
        done = asyncio.get_running_loop().create_future()
        sent = answered = 0
        clock = time.perf_counter

        def send() -> None:
            nonlocal sent
            key = keys[sent % nkeys]
            sent += 1
            pending = batcher.submit(inputs, 1, key, clock() + timeout if timeout else None)
            pending.future.add_done_callback(on_answer)

        def on_answer(future) -> None:
            nonlocal answered
            if future.cancelled() or future.exception() is not None:
                if not done.done():  # a failed request would leave the run waiting: end it with the failure
                    done.set_exception(RuntimeError(f"{case}: a request failed: {future!r}"))
                return
            answered += 1
            if sent < count:
                send()
            elif answered == count and not done.done():
                done.set_result(None)

        cpu0, wall0 = time.thread_time(), clock()
        for _ in range(min(window, count)):
            send()
        await done
        cpu1, wall1 = time.thread_time(), clock()
        await batcher.stop()
        batches = batcher.stats.execution_count
        return {
            "loop_cpu_us_per_request": (cpu1 - cpu0) / count * 1e6,
            "wall_us_per_request": (wall1 - wall0) / count * 1e6,
            "requests_per_batch": count / batches if batches else math.nan,
        }

    async def main() -> dict:
        out = {}
        for case in job["cases"]:
            await one_run(case, case_requests(case, job["warmup"]))
            count = case_requests(case, job["n"])
            runs = [await one_run(case, count) for _ in range(RUNS_PER_PROCESS)]
            out[case] = {"requests": count, **{k: statistics.median(r[k] for r in runs) for k in runs[0]}}
            out[case]["runs_loop_cpu_us_per_request"] = [r["loop_cpu_us_per_request"] for r in runs]
        return out

    loop = new_loop()
    try:
        cases = loop.run_until_complete(main())
    finally:
        loop.close()
        executor.shutdown()
    return {
        "imported_from": batcher_file,
        "batcher_blob": git_blob(Path(batcher_file).read_bytes()),
        "loop": loop_name,
        "cases": cases,
    }


# --------------------------------------------------------------------------- the driver


def resolve(rev: str) -> dict:
    """What a --rev names: its commit, the folder to put first on sys.path (None: this checkout as
    installed), the folder its `wok` package must be imported from, and the git blob its
    batcher.py must have. A ValueError for a revision git does not know."""
    if rev == WORKTREE:
        head = _git("rev-parse", "HEAD")
        dirty = bool(_git("status", "--porcelain", "--", "server"))
        batcher = ROOT / "server" / "batcher.py"
        return {
            "commit": head,
            "dirty": dirty,
            "path": None,
            "package_dir": str(ROOT / "server"),
            "batcher_blob": git_blob(batcher.read_bytes()),
        }
    from wok.bench.compare import rev_tree, wok_at_rev

    sha = wok_at_rev(f"wok@{rev}").extra["rev"]
    top = rev_tree(sha)
    return {
        "commit": sha,
        "dirty": False,
        "path": str(top),
        "package_dir": str(top / "wok"),
        "batcher_blob": _git("rev-parse", f"{sha}:server/batcher.py"),
    }


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True).stdout.strip()


def run_child(rev: str, target: dict, n: int, warmup: int, cases: list[str], timeout_s: float) -> dict:
    """One process of `rev`; its figures, checked to come from `rev`'s own batcher.py."""
    job = {"rev": rev, "path": target["path"], "package_dir": target["package_dir"]}
    job |= {"n": n, "warmup": warmup, "cases": cases}
    argv = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(job)]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"revision {rev}: its process ran past {timeout_s:.0f} s") from None
    if proc.returncode != 0:
        raise RuntimeError(f"revision {rev}: its process exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    lines = proc.stdout.strip().splitlines()
    try:
        out = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        raise RuntimeError(
            f"revision {rev}: expected a JSON line last on its stdout; got {proc.stdout[-500:]!r}"
        ) from None
    if out["batcher_blob"] != target["batcher_blob"]:
        raise RuntimeError(
            f"revision {rev}: expected batcher.py blob {target['batcher_blob']}; "
            f"got {out['batcher_blob']} from {out['imported_from']}"
        )
    return out


def _spread(values: list[float]) -> dict:
    if not values:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def summarize(runs: list[dict], revs: list[str], cases: list[str]) -> dict:
    """Per case, per revision: spreads over the reps, and the ratios to the first revision."""
    by = {(r["rep"], r["rev"]): r for r in runs}
    reps = sorted({r["rep"] for r in runs})
    first = revs[0]
    out: dict = {}
    for case in cases:
        out[case] = {}
        for rev in revs:
            mine = [by[(k, rev)]["cases"][case] for k in reps if (k, rev) in by]
            cpu = _spread([m["loop_cpu_us_per_request"] for m in mine])
            paired = [
                by[(k, rev)]["cases"][case]["loop_cpu_us_per_request"]
                / by[(k, first)]["cases"][case]["loop_cpu_us_per_request"]
                for k in reps
                if (k, rev) in by and (k, first) in by
            ]
            base = out[case][first]["loop_cpu_us_per_request"]["median"] if rev != first else cpu["median"]
            out[case][rev] = {
                "loop_cpu_us_per_request": cpu,
                "wall_us_per_request": _spread([m["wall_us_per_request"] for m in mine]),
                "requests_per_batch": _spread([m["requests_per_batch"] for m in mine]),
                "ratio_to_first": {
                    "of_medians": cpu["median"] / base if cpu["median"] is not None and base else None,
                    "paired": _spread(paired),
                },
            }
    return out


def _num(x, digits: int = 2) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def table_rows(doc: dict) -> tuple[list[str], list[list[str]]]:
    revs, first = doc["config"]["revs"], doc["config"]["revs"][0]
    header = [
        "case",
        "revision",
        "loop CPU µs/request, median [min-max]",
        "requests/batch",
        f"÷ {first}, of medians",
        f"÷ {first}, paired median [min-max]",
    ]
    rows = []
    for case, per_rev in doc["summary"].items():
        for rev in revs:
            s = per_rev[rev]
            cpu, paired = s["loop_cpu_us_per_request"], s["ratio_to_first"]["paired"]
            rows.append(
                [
                    case,
                    rev,
                    f"{_num(cpu['median'])} [{_num(cpu['min'])}-{_num(cpu['max'])}]",
                    _num(s["requests_per_batch"]["median"]),
                    _num(s["ratio_to_first"]["of_medians"], 3),
                    f"{_num(paired['median'], 3)} [{_num(paired['min'], 3)}-{_num(paired['max'], 3)}]",
                ]
            )
    return header, rows


def render_table(doc: dict, markdown: bool = False) -> str:
    from wok.bench.compare import format_table

    return format_table(*table_rows(doc), markdown=markdown, left=2)


def build_parser() -> argparse.ArgumentParser:
    """This script's parser (tests/deploy/test_doc_commands.py parses the docs' command lines with it)."""
    from wok.cliargs import ArgumentParser  # argparse's, its refusals in wok's words

    p = ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--rev",
        action="append",
        default=[],
        metavar="REV",
        help=f"a git revision, or {WORKTREE} (this checkout's server/ as it is); repeat for each, "
        f"the first is the one the others are divided by (default: {WORKTREE})",
    )
    p.add_argument("--reps", type=int, default=7, help="repetitions; the revisions' order rotates each one (default 7)")
    p.add_argument("--n", type=int, default=10_000, help="requests per measured run of each case (default 10,000)")
    p.add_argument("--warmup", type=int, default=2_000, help="requests of each case's warm-up run (default 2,000)")
    p.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)} (default all)")
    p.add_argument(
        "--host-probe",
        type=float,
        default=2.0,
        metavar="SECONDS",
        help="probe the host's speed for this long before and after the run (wok.bench.hostprobe; default 2; 0: off)",
    )
    p.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    p.add_argument("--json", type=Path, help=f"write the {SCHEMA} document here")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from wok.bench.outputs import refuse_unwritable
    from wok.bench.payloads import integer_refusal
    from wok.errors import quoted_name

    p = build_parser()
    args = p.parse_args(argv)
    refuse_unwritable(p, args, "--json", parents_made=True)
    args.revs = args.rev or [WORKTREE]
    twice = sorted({r for r in args.revs if args.revs.count(r) > 1})
    if twice:
        p.error(f"--rev: expected each revision once; got {', '.join(twice)} more than once")
    for option, value in (("--reps", args.reps), ("--n", args.n), ("--warmup", args.warmup)):
        if (refusal := integer_refusal(option, value, 1)) is not None:
            p.error(refusal)
    args.case_list = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in args.case_list if c not in CASES]
    if unknown or not args.case_list:
        p.error(f"--cases: expected some of {', '.join(CASES)}, comma-separated; got {quoted_name(args.cases)}")
    if not (args.host_probe >= 0 and math.isfinite(args.host_probe)):
        p.error(f"--host-probe: expected seconds >= 0 (0: off); got {args.host_probe:g}")
    # Resolved once, up front: an unknown revision is refused before anything runs, and every rep
    # runs the same commit even if a branch REV names moves meanwhile.
    args.targets = {}
    from wok.bench.compare import REV_PEER

    for rev in args.revs:
        if rev != WORKTREE and not REV_PEER.fullmatch(f"wok@{rev}"):
            p.error(
                f"--rev: expected {WORKTREE} or a git revision (letters, digits and _.~^/-); got {quoted_name(rev)}"
            )
        try:
            args.targets[rev] = resolve(rev)
        except ValueError:
            p.error(f"--rev: git does not know revision {quoted_name(rev)}")
        except subprocess.CalledProcessError as exc:
            p.error(f"--rev {rev}: {' '.join(exc.cmd)} failed: {exc.stderr.strip()}")
    return args


def main(argv: list[str] | None = None) -> int:
    from wok.bench import hostprobe
    from wok.bench.outputs import write_final
    from wok.bench.report import bench_header, write_json

    args = parse_args(argv)
    revs, cases = args.revs, args.case_list
    # Generous: a child measures (RUNS_PER_PROCESS x n + warm-up) requests per case, at some
    # 100 µs each on a slow host; a hung one is stopped rather than waited for.
    timeout_s = 120 + 1e-3 * len(cases) * (RUNS_PER_PROCESS * args.n + args.warmup)
    load_at_start = list(os.getloadavg())
    before = hostprobe.try_probe(args.host_probe, say)
    runs: list[dict] = []
    orders: list[list[str]] = []
    stopped = None
    try:
        for rep in range(1, args.reps + 1):
            k = (rep - 1) % len(revs)
            order = revs[k:] + revs[:k]
            orders.append(order)
            for rev in order:
                out = run_child(rev, args.targets[rev], args.n, args.warmup, cases, timeout_s)
                runs.append({"rep": rep, "rev": rev, **out})
                figures = " ".join(f"{c}={out['cases'][c]['loop_cpu_us_per_request']:.2f}" for c in cases)
                say(f"rep {rep}/{args.reps} {rev}: loop CPU µs/request {figures}")
    except KeyboardInterrupt:
        stopped = "interrupted"
        say("interrupted: writing what was measured")
    except RuntimeError as exc:
        stopped = str(exc)
        say(f"stopped: {exc}")
    after = hostprobe.try_probe(args.host_probe, say) if args.host_probe and stopped is None else None
    config = {
        "revs": revs,
        "reps": args.reps,
        "orders": orders,
        "n": args.n,
        "warmup": args.warmup,
        "cases": {c: dict(zip(("policy", "keys", "timeout_s", "window"), CASES[c])) for c in cases},
        "window": WINDOW,
        "max_batch_size": MAX_BATCH,
        "max_queue_delay_ms": DELAY_MS,
        "runs_per_process": RUNS_PER_PROCESS,
        "host_probe_s": args.host_probe,
        "loadavg_at_start": load_at_start,
        "stopped": stopped,
    }
    revisions = {
        rev: {"commit": t["commit"], "dirty": t["dirty"], "package_dir": _shown(t["package_dir"])}
        for rev, t in args.targets.items()
    }
    for r in runs:
        r["imported_from"] = _shown(r["imported_from"])
    doc = bench_header(SCHEMA, config) | {
        "revisions": revisions,
        "host_probe": hostprobe.around(before, after) if args.host_probe else None,
        "runs": runs,
        "summary": summarize(runs, revs, cases),
    }
    print(render_table(doc, markdown=args.markdown))
    failed = write_final(doc, [("--json", args.json, write_json)])
    if failed:
        say(failed)
        return 1
    if args.json:
        say(f"wrote {args.json}")
    return 130 if stopped == "interrupted" else (1 if stopped else 0)


def _shown(path: str) -> str:
    """A path inside this checkout as relative to it (results then do not name the machine's folders)."""
    p = Path(path)
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        # The child's one line of JSON, last on its stdout. It imports nothing of wok before its
        # revision's folder heads sys.path.
        print(json.dumps(child(json.loads(sys.argv[2]))))
        sys.exit(0)
    sys.exit(main())
