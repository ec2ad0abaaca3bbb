"""`wok bench ramp`: the command line of the load generator."""

from __future__ import annotations

import sys
from pathlib import Path

REQUIRE_QPS_NOT_MET = 3


def add_parser(sub) -> None:
    bench = sub.add_parser("bench", help="load-test a KServe V2 gRPC server")
    bsub = bench.add_subparsers(dest="bench_command", required=True)
    p = bsub.add_parser(
        "ramp",
        help="stepped QPS ramp with open-loop arrivals",
        description="Hold each offered QPS for a step, open loop (latency from each request's intended send "
        "time), and report per-step throughput, success and latency, the knee and the highest QPS under the SLO.",
    )
    p.add_argument("--target", default="127.0.0.1:8001", help="HOST:PORT of the server (default 127.0.0.1:8001)")
    p.add_argument("--model", default="mlp", help="model, or a weighted mix such as mlp:0.7,encoder:0.3")
    p.add_argument("--steps", default="50,100,200,400", help="QPS per step: a list, or start:stop:factor")
    p.add_argument("--step-duration", default="5m", help="how long each step is held, e.g. 5m, 30s (default 5m)")
    p.add_argument("--warmup", default=None, help="run but not counted at each step's start (default 10%%, ≤30 s)")
    p.add_argument(
        "--arrival",
        default="poisson",
        help="constant | poisson | burst:amplitude=4x,t0=50%%,sigma=10%% | sawtooth:low=0.5x,high=1.5x,period=10s "
        "| trace:PATH,scale=1",
    )
    p.add_argument("--sizes", default="fixed:16", help="length of variable dims: fixed:N, uniform:A:B, "
                   "lognormal:median=M,sigma=S,max=X, empirical:PATH")  # fmt: skip
    p.add_argument("--rows", type=int, default=1, help="rows (samples) per request (default 1)")
    p.add_argument("--slo-p99", default="200ms", help="P99 latency objective (default 200ms)")
    p.add_argument("--workers", type=int, default=2, help="load-generator processes (default 2)")
    p.add_argument("--timeout", default="30s", help="per-request deadline (default 30s)")
    p.add_argument("--metrics-url", default="auto", help="the server's /metrics: auto (HOST:8002), a URL, or none")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stop-factor", type=float, default=10.0, help="stop when a step's P99 exceeds this × the SLO")
    p.add_argument("--refine", type=int, default=0, help="bisection steps between the last pass and first failure")
    p.add_argument("--knee-threshold", type=float, default=0.5, help="Δachieved/Δoffered below this is the knee")
    p.add_argument("--require-qps", type=float, help=f"exit {REQUIRE_QPS_NOT_MET} unless max QPS under SLO ≥ this")
    _add_outputs(p)
    p.set_defaults(run=run)


def _add_outputs(p) -> None:
    """The result files every figure-producing command writes."""
    p.add_argument("--json", type=Path, help="write the result (schema wok.bench/1) here")
    p.add_argument("--csv", type=Path, help="write one row per step here")
    p.add_argument("--html", type=Path, help="write a self-contained HTML report here")
    p.add_argument("--plots", type=Path, help="write the plots as PNG files into this folder")


def _write_outputs(result: dict, args) -> None:
    from . import report

    report.print_table(result)
    if args.json:
        report.write_json(result, args.json)
    if args.csv:
        report.write_csv(result, args.csv)
    if args.html:
        report.write_html(result, args.html)
    if args.plots:
        args.plots.mkdir(parents=True, exist_ok=True)
        report.plot_latency_vs_offered(result, args.plots / "latency_vs_offered.png")
        report.plot_throughput(result, args.plots / "throughput.png")
        report.plot_timeline(result, args.plots / "timeline.png")


def add_simulate_parser(sub) -> None:
    p = sub.add_parser(
        "simulate",
        help="simulate the batcher at stepped QPS (discrete-event)",
        description="Simulate wok's batcher (flush on size or queue delay, batch time α + β·n) at each step's "
        "offered load, and report the bench's per-step table and JSON schema, plus utilization.",
    )
    p.add_argument("--alpha", default="0ms", help="fixed time per batch (default 0ms)")
    p.add_argument("--beta", default="1ms", help="time per sample in a batch (default 1ms)")
    p.add_argument("--max-batch-size", type=int, default=1)
    p.add_argument("--max-queue-delay", default="0ms", help="longest wait of the oldest queued request")
    p.add_argument("--instances", type=int, default=1)
    p.add_argument("--max-queue-size", type=int, default=0, help="queued requests beyond which arrivals are rejected")
    p.add_argument("--arrival", default="poisson", help="as for wok bench ramp")
    p.add_argument("--steps", default="300,600,900", help="QPS per step: a list, or start:stop:factor")
    p.add_argument("--step-duration", default="600s")
    p.add_argument("--warmup", default="0s")
    p.add_argument("--slo-p99", default="200ms")
    p.add_argument("--seed", type=int, default=0)
    _add_outputs(p)
    p.set_defaults(run=run_simulate)


def run_simulate(args) -> int:
    from .arrivals import parse_duration, parse_steps
    from .simulate import BatcherModel, SimConfig, simulate_ramp

    model = BatcherModel(
        alpha_s=parse_duration(args.alpha),
        beta_s=parse_duration(args.beta),
        max_batch_size=args.max_batch_size,
        max_queue_delay_s=parse_duration(args.max_queue_delay),
        instances=args.instances,
        max_queue_size=args.max_queue_size,
    )
    cfg = SimConfig(
        model=model,
        steps=parse_steps(args.steps),
        step_duration_s=parse_duration(args.step_duration),
        warmup_s=parse_duration(args.warmup),
        arrival=args.arrival,
        slo_p99_ms=1e3 * parse_duration(args.slo_p99),
        seed=args.seed,
    )
    result = simulate_ramp(cfg)
    _write_outputs(result, args)
    print(
        "utilization per step: "
        + ", ".join(f"{s['offered_qps']:g} QPS {100 * s['utilization']:.0f}%" for s in result["steps"])
    )
    return 0


def _metrics_url(spec: str, target: str) -> str | None:
    if spec == "none":
        return None
    if spec != "auto":
        return spec
    from .scrape import scrape

    host = target.rsplit(":", 1)[0]
    url = f"http://{host}:8002/metrics"
    return url if scrape(url, timeout=2.0) is not None else None


def run(args) -> int:
    from ..clients import InferError
    from .arrivals import parse_duration, parse_steps
    from .payloads import parse_mix
    from .runner import Ramp, RampConfig

    duration = parse_duration(args.step_duration)
    warmup = parse_duration(args.warmup) if args.warmup else min(30.0, 0.1 * duration)
    cfg = RampConfig(
        target=args.target,
        models=parse_mix(args.model),
        steps=parse_steps(args.steps),
        step_duration_s=duration,
        warmup_s=warmup,
        arrival=args.arrival,
        sizes=args.sizes,
        rows=args.rows,
        slo_p99_ms=1e3 * parse_duration(args.slo_p99),
        workers=args.workers,
        timeout_s=parse_duration(args.timeout),
        metrics_url=_metrics_url(args.metrics_url, args.target),
        seed=args.seed,
        stop_factor=args.stop_factor,
        refine=args.refine,
        knee_threshold=args.knee_threshold,
    )
    try:
        result = Ramp(cfg).run()
    except (RuntimeError, OSError, InferError) as exc:  # the target or a worker failed us
        print(f"wok bench: {exc}", file=sys.stderr)
        return 1
    _write_outputs(result, args)
    best = result["max_qps_under_slo"]
    if args.require_qps is not None and (best is None or best < args.require_qps):
        print(f"wok bench: max QPS under the SLO is {best}, below the required {args.require_qps:g}", file=sys.stderr)
        return REQUIRE_QPS_NOT_MET
    return 0


# The `wok` subcommands besides `serve`, each a function that adds its parser to argparse's
# subparsers and sets `run`; wok.__main__ registers them in this order.
COMMANDS = [add_parser, add_simulate_parser]
