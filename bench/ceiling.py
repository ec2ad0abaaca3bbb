"""The executor at saturation: does wok keep a compute-bound model busy, and reach its own ceiling?

    python bench/ceiling.py --hidden 4096 --rows 4 --overload 1.3 --duration 20s --json ceiling.json

1. Profiles the model in-process (`wok profile`, the same executor as the server) and fits
   T(n) = α + β·n.
2. Serves it (`wok serve`), offers 1.3× the load it can carry (open loop, `--rows` samples per
   request so the event loop is not the bottleneck) and reads the server's own counters over the
   measured window: samples and batches run, busy time, and the time an instance had nothing to
   run while requests were queued (`wok_instance_idle_queued_seconds`).
3. Reports throughput against n/(α + β·n) at the mean batch size formed, the busy and
   idle-while-queued fractions, and the server's own mean batch time against α + β·n.

Targets (issue 5): throughput ≥ 90% of n/(α + β·n); idle while queued < 5% of the window.
The model is the demo `mlp`'s network at a larger width, served from a generated model
repository (so that its batching and instance settings come from the config written here).
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from wok.bench.outputs import refuse_unwritable, write_final, write_json_text
from wok.bench.report import bench_header

SCHEMA = "wok.ceiling/1"
ROOT = Path(__file__).resolve().parents[1]

CONFIG = """\
platform = "python"
factory = "wok.models.mlp:MLP"
max_batch_size = {max_batch_size}

[parameters]
in_features = 256
hidden = {hidden}
out_features = 256
layers = {layers}

[[inputs]]
name = "INPUT0"
datatype = "FP32"
dims = [256]

[[outputs]]
name = "OUTPUT0"
datatype = "FP32"
dims = [256]

[dynamic_batching]
max_queue_delay_ms = {delay_ms}
{instances}"""


def write_repository(folder: Path, args) -> Path:
    model = folder / "mlp"
    model.mkdir(parents=True, exist_ok=True)
    instances = f"\n[instances]\npipeline_depth = {args.pipeline_depth}\n" if args.pipeline_depth else ""
    text = CONFIG.format(
        hidden=args.hidden,
        layers=args.layers,
        max_batch_size=args.max_batch_size,
        delay_ms=args.delay_ms,
        instances=instances,
    )
    (model / "config.toml").write_text(text)
    return folder


def wok(*argv: str) -> list[str]:
    return [sys.executable, "-m", "wok", *argv]


def run_profile(repo: Path, args, out: Path) -> dict:
    sizes = ",".join(str(n) for n in range(args.rows, args.max_batch_size + 1, args.rows))
    cmd = wok("profile", "mlp", "--model-repository", str(repo), "--batch-sizes", sizes, "--repeats", str(args.repeats))
    cmd += ["--json", str(out), "--cpu-linear", args.cpu_linear]
    if args.torch_threads:
        cmd += ["--torch-threads", str(args.torch_threads)]
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


def counters(url: str, model: str = "mlp") -> dict:
    from wok.bench.scrape import scrape

    snap = scrape(url, timeout=10.0)
    if snap is None:
        raise RuntimeError(f"cannot scrape {url}")
    inst = {"model": model, "model_instance": "0"}
    return {
        "t": time.monotonic(),
        "samples": snap.get("wok_batch_size_sum", model=model),
        "batches": snap.get("wok_batch_size_count", model=model),
        "busy_s": snap.get("wok_instance_busy_seconds_total", **inst),
        "idle_queued_s": snap.get("wok_instance_idle_queued_seconds_total", **inst),
    }


def ramp_config(target: str, qps: float, args):
    """One open-loop step of `qps` requests/s for the warm-up and the window, past capacity on purpose."""
    from wok.bench.runner import RampConfig

    return RampConfig(
        target=target,
        models=[("mlp", 1.0)],
        steps=[qps],
        step_duration_s=args.warmup + args.duration,
        warmup_s=0.0,
        rows=args.rows,
        # The default SLO, not a huge one: with a huge one the generator's own check took an
        # overloaded server's completions (about 1/overload of the offered rate) for its own
        # under-delivery. stop_factor keeps the overloaded step from ending the ramp.
        workers=args.workers,
        timeout_s=600.0,
        stop_factor=1e9,
        seed=args.seed,
    )


def saturate(target: str, metrics_url: str, qps: float, args) -> tuple[dict, dict, dict]:
    """Offer `qps` requests/s for the warm-up and the window; counters bracket the window only,
    timed from the load's own start (the generator's set-up before it is not warm-up)."""
    import threading

    from wok.bench.runner import Ramp

    marks: dict = {}
    begun = threading.Event()

    class Timed(Ramp):
        def started(self, clock0: float) -> None:
            marks["clock0"] = clock0  # time.monotonic() of the step's t = 0
            begun.set()

    def bracket() -> None:
        begun.wait()
        for key, at in (("before", args.warmup), ("after", args.warmup + args.duration)):
            time.sleep(max(0.0, marks["clock0"] + at - time.monotonic()))
            marks[key] = counters(metrics_url)

    t = threading.Thread(target=bracket, daemon=True)
    t.start()
    result = Timed(ramp_config(target, qps, args)).run()
    t.join()
    return marks["before"], marks["after"], result["steps"][0]


def measured_time(profile: dict, n: float) -> float:
    """The profile's median batch time at n samples, linear between the sizes it timed (clamped outside)."""
    pts = sorted((b["batch_size"], b["median_s"]) for b in profile["batches"])
    if n <= pts[0][0]:
        return pts[0][1]
    for (n0, t0), (n1, t1) in itertools.pairwise(pts):
        if n <= n1:
            return t0 + (t1 - t0) * (n - n0) / (n1 - n0)
    return pts[-1][1]


def analyse(profile: dict, before: dict, after: dict) -> dict:
    """Throughput against n/(α+β·n) (fit) and n/T(n) (the profile's median at n) over the window."""
    alpha, beta = profile["fit"]["alpha_s"], profile["fit"]["beta_s"]
    wall = after["t"] - before["t"]
    samples = after["samples"] - before["samples"]
    batches = after["batches"] - before["batches"]
    if wall <= 0 or batches <= 0:
        raise ValueError(f"no batch ran in the measured window ({batches:g} batches in {wall:.3f} s)")
    busy = after["busy_s"] - before["busy_s"]
    idle = after["idle_queued_s"] - before["idle_queued_s"]
    n = samples / batches
    throughput = samples / wall
    ceiling = n / (alpha + beta * n)
    ceiling_measured = n / measured_time(profile, n)
    return {
        "window_s": wall,
        "samples": samples,
        "batches": batches,
        "mean_batch_size": n,
        "throughput_samples_per_s": throughput,
        "ceiling_samples_per_s": ceiling,
        "throughput_vs_ceiling": throughput / ceiling,
        "ceiling_measured_samples_per_s": ceiling_measured,
        "throughput_vs_measured": throughput / ceiling_measured,
        "busy_fraction": busy / wall,
        "idle_queued_fraction": idle / wall,
        "server_batch_time_s": busy / batches,
        "profile_batch_time_s": alpha + beta * n,
        "targets": {"throughput_vs_ceiling_min": 0.90, "idle_queued_fraction_max": 0.05},
    }


def table(doc: dict) -> str:
    a = doc["result"]
    fit = doc["profile"]["fit"]
    rows = [
        (
            "α, β (in-process fit)",
            f"{1e3 * fit['alpha_s']:.3f} ms + {1e3 * fit['beta_s']:.3f} ms·n (R² {fit['r2']:.4f})",
        ),
        ("offered", f"{doc['config']['offered_qps']:.0f} req/s × {doc['config']['rows']} rows"),
        ("mean batch formed", f"{a['mean_batch_size']:.2f} samples ({a['batches']:.0f} batches)"),
        ("throughput", f"{a['throughput_samples_per_s']:.0f} samples/s"),
        ("n/(α+β·n)", f"{a['ceiling_samples_per_s']:.0f} samples/s"),
        ("throughput / ceiling", f"{100 * a['throughput_vs_ceiling']:.1f} %  (target ≥ 90 %)"),
        ("n/T(n), T timed at n", f"{a['ceiling_measured_samples_per_s']:.0f} samples/s"),
        ("throughput / that", f"{100 * a['throughput_vs_measured']:.1f} %"),
        ("instance busy", f"{100 * a['busy_fraction']:.1f} % of the window"),
        ("idle while queued", f"{100 * a['idle_queued_fraction']:.2f} % of the window  (target < 5 %)"),
        (
            "batch time: server / α+β·n",
            f"{1e3 * a['server_batch_time_s']:.2f} ms / {1e3 * a['profile_batch_time_s']:.2f} ms",
        ),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def build_parser() -> argparse.ArgumentParser:
    """This script's parser (tests/deploy/test_doc_commands.py parses the docs' command lines with it)."""
    from wok.bench.arrivals import parse_duration
    from wok.cliargs import ArgumentParser  # argparse's, its refusals in wok's words

    p = ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hidden", type=int, default=4096, help="mlp hidden width (default 4096: compute-bound here)")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--max-batch-size", type=int, default=32)
    p.add_argument("--delay-ms", type=float, default=5.0)
    p.add_argument("--rows", type=int, default=4, help="samples per request (default 4)")
    p.add_argument("--pipeline-depth", type=int, help="batches in flight per instance (default: the server's, 2)")
    p.add_argument("--overload", type=float, default=1.3, help="offered load as a multiple of the ceiling")
    p.add_argument("--duration", type=parse_duration, default="20s", help="measured window")
    p.add_argument("--warmup", type=parse_duration, default="5s", help="load before the window (queue fills)")
    p.add_argument("--repeats", type=int, default=30, help="timed batches per size in the profile")
    p.add_argument("--torch-threads", type=int, default=1, help="torch threads, profile and server (default 1)")
    p.add_argument("--workers", type=int, default=1, help="load-generator processes (default 1)")
    p.add_argument(
        "--switch-interval",
        type=float,
        metavar="MS",
        help="the server's GIL switch interval (wok serve --switch-interval; default: Python's 5 ms)",
    )
    p.add_argument(
        "--cpu-linear",
        choices=("onednn", "torch"),
        default="onednn",
        help="how the model's linear layers run, profile and server alike (wok serve --cpu-linear; default onednn)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path)
    return p


def parse_args(argv=None) -> argparse.Namespace:
    p = build_parser()
    args = p.parse_args(argv)
    refuse_unwritable(p, args, "--json")
    if args.rows < 1 or args.max_batch_size % args.rows:
        p.error(f"--rows must divide --max-batch-size ({args.max_batch_size}); got {args.rows}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="wok-ceiling-") as tmp:
        repo = write_repository(Path(tmp) / "models", args)
        print(f"ceiling: profiling mlp (hidden {args.hidden}) in-process …", file=sys.stderr, flush=True)
        prof = run_profile(repo, args, Path(tmp) / "profile.json")
        fit = prof["fit"]
        n = args.max_batch_size
        capacity = n / (fit["alpha_s"] + fit["beta_s"] * n)  # samples/s at full batches
        qps = args.overload * capacity / args.rows
        from wok.bench.compare import local_wok

        serve_args = ["--model-repository", str(repo), "--log-level", "WARNING"]
        serve_args += ["--torch-threads", str(args.torch_threads), "--cpu-linear", args.cpu_linear]
        if args.switch_interval is not None:
            serve_args += ["--switch-interval", str(args.switch_interval)]
        with local_wok(serve_args) as (target, metrics_url, _):
            print(
                f"ceiling: α={1e3 * fit['alpha_s']:.3f} ms β={1e3 * fit['beta_s']:.3f} ms; offering {qps:.0f} req/s "
                f"× {args.rows} rows ({args.overload:g}× full-batch capacity) for {args.warmup:g}+{args.duration:g} s",
                file=sys.stderr,
                flush=True,
            )
            before, after, step = saturate(target, metrics_url, qps, args)
    doc = bench_header(SCHEMA, {k: v for k, v in vars(args).items() if k != "json"} | {"offered_qps": qps}) | {
        "profile": {
            "fit": fit,
            "batches": [{k: b[k] for k in ("batch_size", "median_s", "p99_s")} for b in prof["batches"]],
        },
        "result": analyse(prof, before, after),
        "load": {k: step.get(k) for k in ("offered_qps", "achieved_qps", "success_rate", "dispatch_lag_ms")},
    }
    print(table(doc))
    failed = write_final(doc, [("--json", args.json, write_json_text)])
    if failed:
        print(f"ceiling: {failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
