"""`wok bench ramp`: the command line of the load generator."""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import sys
from dataclasses import replace
from pathlib import Path

from ..errors import NAME_CHARS, printable, quoted_name, unquoted
from ..numerals import SPACES, read_float, read_int, underscore_note
from .outputs import check_outputs as _check_outputs
from .outputs import keep_elsewhere as _keep_elsewhere
from .outputs import result_text as _result_text
from .outputs import write_outputs as _write_outputs_in_order
from .outputs import writing as _writing
from .payloads import DEFAULT_INT_HIGH, integer_refusal

REQUIRE_QPS_NOT_MET = 3
# A soak that found no capacity to soak at: the same verdict as a capacity below --require-qps.
SOAK_NO_CAPACITY = REQUIRE_QPS_NOT_MET
FAULT_NOT_IN_EFFECT = 4
# Every request of a step refused as malformed (INVALID_ARGUMENT, NOT_FOUND): the options made
# requests the server cannot take, which is a bad option's status.
BAD_REQUESTS = 2
DEFAULT_TARGET = "127.0.0.1:8001"
# One default ramp for `wok bench ramp` and `wok simulate` ("the same ramp, simulated"): low rates
# any server takes, so the first run is a measurement rather than an overload.
DEFAULT_STEPS = "50,100,200,400"
# A minute a step: a default ramp ends in minutes (5 min each made it 22), and the lowest step's
# 3,000 requests still leave 30 beyond its P99. A soak or a capacity figure to publish wants longer.
DEFAULT_STEP_DURATION = "60s"
# The warm-up when --warmup is not given: this share of the step, at most WARMUP_CAP_S.
WARMUP_SHARE = 0.1
WARMUP_CAP_S = 30.0


def add_parser(sub) -> None:
    from . import faults, soak

    bench = sub.add_parser("bench", help="load-test a KServe V2 gRPC server")
    bsub = bench.add_subparsers(dest="bench_command", required=True)
    p = bsub.add_parser(
        "ramp",
        help="stepped QPS ramp with open-loop arrivals",
        description="Hold each offered QPS for a step, open loop (latency from each request's intended send "
        "time), and report per-step throughput, success and latency, the knee and the highest QPS under the SLO.",
    )
    p.add_argument(
        "--target",
        help=f"HOST:PORT of the server ([::1]:PORT for IPv6; several: HOST:PORT,HOST:PORT or dns:///NAME:PORT; "
        f"default {DEFAULT_TARGET}; not with --replicas)",
    )
    p.add_argument(
        "--model", default="mlp", help="model, or a weighted mix such as mlp:0.7,encoder:0.3 (default %(default)s)"
    )
    p.add_argument(
        "--steps", default=DEFAULT_STEPS, help="QPS per step: a list, or start:stop:factor (default %(default)s)"
    )
    p.add_argument(
        "--step-duration",
        default=DEFAULT_STEP_DURATION,
        help=f"how long each step is held, e.g. 5m, 30s (default %(default)s; the default ramp takes "
        f"{_default_ramp_text()}; the planned total is printed before the first step)",
    )
    p.add_argument(
        "--warmup",
        default=None,
        help="run but not counted at each step's start: a duration (e.g. 1s) or a share of --step-duration "
        "(e.g. 10%%) (default 10%%, at most 30 s)",
    )
    p.add_argument(
        "--arrival",
        default="poisson",
        help="constant | poisson | burst:amplitude=4x,t0=50%%,sigma=10%% | sawtooth:low=0.5x,high=1.5x,period=10s "
        "| trace:PATH,scale=1 (default %(default)s)",
    )
    p.add_argument("--sizes", default="fixed:16", help="length of variable dims: fixed:N, uniform:A:B, "
                   "lognormal:median=M,sigma=S,max=X, empirical:PATH (default %(default)s)")  # fmt: skip
    p.add_argument("--rows", type=int, default=1, help="rows (samples) per request (default 1)")
    p.add_argument(
        "--int-high",
        type=int,
        help=f"integer inputs uniform in [0, N), every one (default: an input whose server publishes the bound of its "
        f"ids, a wok server's found at load in the model's embedding tables, below it, said before the first step; "
        f"the others below {DEFAULT_INT_HIGH}, which every demo model accepts: give recsys its table size, e.g. "
        f"200000, so that its gathers spread over the table)",
    )
    p.add_argument(
        "--slo-p99", default="200ms", help="P99 latency objective, with its unit: 50ms, 0.05s (default 200ms)"
    )
    p.add_argument("--workers", type=int, default=2, help="load-generator processes (default 2)")
    p.add_argument("--timeout", default="30s", help="per-request deadline (default 30s)")
    p.add_argument(
        "--rpc",
        choices=("unary", "stream"),
        default="unary",
        help="unary: a ModelInfer call per request; stream: requests on ModelStreamInfer streams kept open, "
        "matched to their answers by id (default unary)",
    )
    p.add_argument("--streams", type=int, default=4, help="with --rpc stream: streams per worker (default 4)")
    p.add_argument(
        "--server-timing",
        action="store_true",
        help="read each answer's server-timing trailer (a server run with --server-timing) and split every "
        "latency into the server's stages and the time outside it, per step (unary calls on one channel)",
    )
    p.add_argument(
        "--metrics-url",
        default="auto",
        help="the server's /metrics: auto (HOST:8002 of a single target, if its wok_server_info names the "
        "target's port; none for several), a URL (scraped as given; a port other than the target's is warned "
        "of), or none (default %(default)s)",
    )
    p.add_argument(
        "--seed", type=int, default=0, help="seed of the arrival schedules and the payloads (default %(default)s)"
    )
    p.add_argument(
        "--start-at",
        metavar="UNIX_SECONDS",
        help="start step 1 at this wall-clock time and step k (warm-up + duration + --step-gap) × (k-1) later, so "
        "that several generators (a Kubernetes Indexed Job) run each step together (default: a step starts when "
        "the last one ended)",
    )
    p.add_argument(
        "--step-gap",
        default="2s",
        help="with --start-at: from a step's end (warm-up + duration from its start) to the next one's start "
        "(default %(default)s)",
    )
    p.add_argument(
        "--stop-factor",
        type=float,
        default=10.0,
        help="stop after a step whose P99 exceeds this × the SLO, or with under half its requests ok; inf: never "
        "(a step with none ok, none failed by load, still stops a ramp without --fault) (default %(default)g)",
    )
    p.add_argument(
        "--refine",
        type=int,
        default=0,
        help="bisection steps between the last pass and first failure (default %(default)s: none)",
    )
    p.add_argument(
        "--knee-threshold",
        type=float,
        default=0.5,
        help="Δachieved/Δoffered below this is the knee (default %(default)g)",
    )
    p.add_argument("--require-qps", type=float, help=f"exit {REQUIRE_QPS_NOT_MET} unless max QPS under SLO ≥ this")
    p.add_argument(
        "--host-probe",
        default="0",
        metavar="DURATION",
        help="probe this machine's speed for this long before and after a plain ramp, e.g. 2s (recorded as "
        "host_probe; see docs/performance.md, 'The host's speed, probed'; default 0: off)",
    )
    _add_security(p)
    _add_outputs(p)
    faults.add_arguments(p)
    soak.add_arguments(p)
    # True under the `wok` command (server/__main__.py): `_restore_signals`.
    p.set_defaults(run=_quiet_when_stdout_closes(run), exit_takes_signals=False)
    add_merge_parser(bsub)


def add_merge_parser(bsub) -> None:
    p = bsub.add_parser(
        "merge",
        help="merge the results of bench processes that ramped one server together",
        description="Add up, step by step, the wok.bench results (all /2 or all /1) of several processes that ran "
        "the same ramp at the same time (e.g. a Kubernetes Indexed Job): counts and QPS add, percentiles come "
        "from the merged latency histograms, the server's view from the first file (docs/bench.md).",
    )
    p.add_argument("results", nargs="+", type=Path, help="the parts' --json files")
    _add_outputs(p)
    p.set_defaults(run=_quiet_when_stdout_closes(run_merge))


def run_merge(args) -> int:
    import json

    from .merge import merge_results

    _check_outputs(args, *_RESULT_OUTPUTS, folders=_RESULT_FOLDERS)
    parts = []
    for path in args.results:
        try:
            text = path.read_text()
        except (OSError, ValueError) as exc:  # ValueError: not UTF-8 text
            raise ValueError(f"{path}: {getattr(exc, 'strerror', None) or exc}") from None
        try:
            parts.append(json.loads(text))
        except ValueError as exc:
            raise ValueError(f"{path}: not JSON ({exc}); expected a wok bench ramp's --json file") from None
    _write_outputs(merge_results(parts, [str(p) for p in args.results]), args)
    return 0


def _add_security(p) -> None:
    """How the bench reaches a server with TLS or bearer tokens (docs/security.md)."""
    sec = p.add_argument_group("security", "TLS and bearer token towards the server")
    sec.add_argument("--tls", action="store_true", help="speak TLS, trusting gRPC's bundled root certificates")
    sec.add_argument("--tls-ca", type=Path, metavar="PATH", help="speak TLS, trusting the CA certificate(s) in PATH")
    sec.add_argument("--tls-cert", type=Path, metavar="PATH", help="client certificate for mTLS (with --tls-key)")
    sec.add_argument("--tls-key", type=Path, metavar="PATH", help="private key of --tls-cert")
    # Never a token on the command line: `ps` shows it to every user of the machine.
    sec.add_argument(
        "--token-file",
        type=Path,
        metavar="PATH",
        help="send the bearer token in PATH (the first token of its first line that is not a # comment)",
    )
    sec.add_argument(
        "--token-env",
        metavar="VAR",
        help="send the bearer token in environment variable VAR (the first, where it lists several, as the server's)",
    )


def _security(args):
    """(tls, token) from the security options; ValueError for a bad combination or file."""
    import os

    from ..clients import TLS

    tls = None
    if args.tls_ca or args.tls_cert or args.tls_key:
        # Read here first, for a refusal that names the option: TLS.from_files names the file alone.
        for option, path in (("--tls-ca", args.tls_ca), ("--tls-cert", args.tls_cert), ("--tls-key", args.tls_key)):
            if path is not None:
                try:
                    path.read_bytes()
                except OSError as exc:
                    raise ValueError(f"{option} {path}: {exc.strerror or exc}") from None
        tls = TLS.from_files(args.tls_ca, args.tls_cert, args.tls_key)
    elif args.tls:
        tls = True
    token = None
    if args.token_file is not None and args.token_env is not None:
        raise ValueError("give --token-file or --token-env, not both")
    from ..auth import decode_token_file, split_tokens

    # The server's own file or variable may list several tokens (a rotation): any of them is
    # accepted, and the first is the one to send. Not held to wok's server's rules for the tokens
    # it accepts (length): the target may be another server.
    if args.token_file:
        try:
            raw = args.token_file.read_bytes()
        except OSError as exc:
            raise ValueError(f"--token-file {args.token_file}: {exc.strerror or exc}") from None
        # As the server reads it: not in the locale's encoding, nor with a BOM as a character.
        tokens = split_tokens(decode_token_file(raw, f"--token-file {args.token_file}"))
        if not tokens:
            raise ValueError(f"--token-file {args.token_file} holds no token")
        token = tokens[0]
    elif args.token_env is not None:  # `--token-env ""` sent no token, without a word
        tokens = split_tokens(os.environ.get(args.token_env) or "") if args.token_env else []
        if not tokens:
            raise ValueError(
                f"--token-env: environment variable {quoted_name(args.token_env)} is not set, or holds no token"
            )
        token = tokens[0]
    return tls, token


def _token_hint(args) -> str:
    """What a bench user does about UNAUTHENTICATED: the server's message names the metadata to
    send, which the bench sends from --token-file or --token-env."""
    if args.token_file:
        return f"the bench sent the first token of --token-file {args.token_file}: the server does not accept it"
    if args.token_env:
        return f"the bench sent the first token of --token-env {args.token_env}: the server does not accept it"
    return "the bench sent no token: give the server's with --token-file PATH or --token-env VAR"


def _add_outputs(p) -> None:
    """The result files every figure-producing command writes."""
    p.add_argument("--json", type=Path, help="write the result (schema wok.bench/2) here")
    p.add_argument("--csv", type=Path, help="write one row per step here")
    p.add_argument("--html", type=Path, help="write a self-contained HTML report here")
    _add_plot(p, metavar="FOLDER", help="write the plots as PNG files into this folder")


def _add_plot(p, **kwargs) -> None:
    """--plot, the one spelling every command documents, and --plots, the one `wok bench ramp`,
    `merge` and `simulate` documented before: kept, out of the help, so that scripts still run."""
    p.add_argument("--plot", type=Path, **kwargs)
    p.add_argument("--plots", dest="plot", type=Path, help=argparse.SUPPRESS)


# The files of `_add_outputs`; --plot is a folder there.
_RESULT_OUTPUTS = ("--json", "--csv", "--html", "--plot")
_RESULT_FOLDERS = ("--plot",)


def _warn(message: str) -> None:
    print(f"wok bench: {message}", file=sys.stderr)


def _print_host_probe(record: dict | None) -> None:
    if not record:
        return
    parts = [
        f"{when} {r['cold_forward_us']:.0f} µs" if r and "cold_forward_us" in r else f"{when} failed"
        for when, r in (("before", record["before"]), ("after", record["after"]))
    ]
    mean = record["cold_forward_us"]
    print(f"host probe: cold forward {'-' if mean is None else f'{mean:.0f} µs'} ({', '.join(parts)})")


def _result_outputs(args) -> list:
    """A ramp's (or merge's, simulate's) outputs for `write_outputs`, --json first: one list, so that a
    merge of one fault run writes what its ramp wrote."""
    from . import report

    def plots(result: dict, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        report.plot_latency_vs_offered(result, folder / "latency_vs_offered.png")
        report.plot_throughput(result, folder / "throughput.png")
        report.plot_timeline(result, folder / "timeline.png")
        if result.get("faults"):
            report.plot_fault_timeline(result, folder / "faults.png")

    return [
        ("--json", args.json, report.write_json),
        ("--csv", args.csv, report.write_csv),
        ("--html", args.html, report.write_html),
        ("--plot", args.plot, plots),
    ]


def _print_sections(result: dict) -> None:
    """What a result says after its steps' table: each section it has (a merge has no soak or host probe; its
    replicas are parts' behind the wok balancer, their counters added up; one fault run's merge keeps its faults)."""
    from . import faults, report, soak

    report.print_replicas(result)
    soak.print_soak(result)
    _print_host_probe(result.get("host_probe"))
    faults.print_faults(result)


def _write_outputs(result: dict, args, command: str = "wok bench") -> None:
    from . import report

    def show() -> None:
        report.print_table(result)
        _print_sections(result)

    _show_after(lambda: _write_or_raise(result, _result_outputs(args), command, folders=_RESULT_FOLDERS), show)


def _show_after(write, show):
    """`write()`, then `show()` (the table on stdout); `write`'s value. The files come first: a reader
    that closes stdout early (`| head`) ends the command at the table, and must not cost them. An
    option's error (ValueError) in `write` still shows the table first, as the figures are there."""
    try:
        written = write()
    except ValueError:
        try:
            show()
        # stdout closed (`| head`): the write's error, on stderr, is what matters now. Rich's console
        # meets the broken pipe itself, points stdout at /dev/null and raises SystemExit(1).
        except (BrokenPipeError, SystemExit):
            _silence_stdout()
        raise
    show()
    return written


def _quiet_when_stdout_closes(run):
    """`run(args)` that ends quietly, status 1 as rich's console does (report.print_table), when stdout
    is closed under it (`wok … | head`): no BrokenPipeError traceback, nor Python's complaint at exit
    about a stdout it cannot flush. A broken pipe to anything else (a worker) is raised as before."""
    import functools

    @functools.wraps(run)
    def wrapped(args) -> int:
        try:
            status = run(args)
            sys.stdout.flush()  # here, not at exit, where a closed pipe is found past every handler
            return status
        except BrokenPipeError as exc:
            quiet_if_stdout_closed(exc)
            return 1

    return wrapped


def quiet_if_stdout_closed(exc: BrokenPipeError) -> None:
    """Raise `exc` again unless it is stdout's reader that is gone (`| head`); then point stdout at
    /dev/null, so that the command ends quietly."""
    if not _stdout_closed():
        raise exc
    _silence_stdout()


def _silence_stdout() -> None:
    # Python flushes stdout again at exit: point it at /dev/null so that finds nothing to say.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def _stdout_closed() -> bool:
    """Whether stdout is a pipe (or socket) whose reader is gone: poll says POLLERR or POLLHUP."""
    import select

    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # not a file (a test's capture): not what broke
        return False
    if not hasattr(select, "poll"):  # Windows: the pipe broken is most likely stdout's
        return True
    poll = select.poll()
    poll.register(fd, select.POLLOUT)
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poll.poll(0))


def _write_or_raise(result: dict, outputs, command: str = "wok bench", folders=()) -> None:
    """A command's output writes (`write_outputs`, `folders` as there); the first that fails is that
    option's error (2). Each written is named on stderr (`_say_written`)."""
    failed = _write_outputs_in_order(result, outputs, folders=folders)
    _say_written(command, outputs, failed)
    if failed is not None:
        raise failed[0]


def _say_written(command: str, outputs, failed) -> None:
    """One stderr line per file (or folder) written, in order, up to the one that failed: where the results went."""
    stop = None if failed is None else getattr(failed[0], "option", None)
    for option, path, _ in outputs:
        if not path or str(path) == "-":  # none, or stdout
            continue
        if option == stop:
            break
        print(f"{command}: wrote {path} ({option})", file=sys.stderr)


def add_simulate_parser(sub) -> None:
    p = sub.add_parser(
        "simulate",
        help="simulate the batcher at stepped QPS (discrete-event)",
        description="Simulate wok's batcher (flush on size or queue delay, batch time α + β·n) at each step's "
        "offered load, and report the bench's per-step table and JSON schema, plus utilization.",
    )
    p.add_argument("--alpha", help="fixed time per batch (default 0ms; not with --profile)")
    p.add_argument("--beta", help="time per sample in a batch (default 1ms; not with --profile)")
    p.add_argument(
        "--profile",
        type=Path,
        help="α and β from a `wok profile --json` file (wok.profile/1), as `wok tune --profile` reads it",
    )
    p.add_argument(
        "--max-batch-size",
        type=int,
        help="most samples per batch (default: with --profile, its model's max_batch_size, as profiled; else 1: "
        "no batching unless given)",
    )
    p.add_argument("--max-queue-delay", default="0ms", help="longest wait of the oldest queued request (default 0ms)")
    p.add_argument("--instances", type=int, default=1, help="model instances, each running one batch (default 1)")
    p.add_argument(
        "--max-queue-size",
        type=int,
        default=0,
        help="queued requests beyond which arrivals are rejected (default 0: no limit)",
    )
    p.add_argument("--arrival", default="poisson", help="as for wok bench ramp (default poisson)")
    p.add_argument(
        "--steps",
        default=DEFAULT_STEPS,
        help="QPS per step: a list, or start:stop:factor (default %(default)s, as wok bench ramp's)",
    )
    p.add_argument(
        "--step-duration",
        default="600s",
        help="simulated time per step (default 600s: longer than wok bench ramp's, as simulated time costs little "
        "and steadies the P99)",
    )
    p.add_argument(
        "--warmup",
        default=None,
        help="simulated but not counted at each step's start: a duration (e.g. 1s) or a share of --step-duration "
        "(e.g. 10%%) (default as wok bench ramp's: 10%%, at most 30 s)",
    )
    p.add_argument("--slo-p99", default="200ms", help="P99 latency objective, with its unit (default 200ms)")
    p.add_argument("--seed", type=int, default=0, help="the arrivals' random seed (default 0)")
    _add_outputs(p)
    p.set_defaults(run=_quiet_when_stdout_closes(run_simulate))


def run_simulate(args) -> int:
    from .arrivals import parse_steps
    from .simulate import BatcherModel, SimConfig, simulate_ramp

    def seconds(option: str, positive: bool = False) -> float:
        # Each option checked here, so that its message names it (the model's would not).
        return _seconds(args, option, positive)

    _check_outputs(args, *_RESULT_OUTPUTS, folders=_RESULT_FOLDERS)
    least = {"--max-batch-size": 1, "--instances": 1, "--max-queue-size": 0, "--seed": 0}
    for option, low in least.items():
        value = getattr(args, option.removeprefix("--").replace("-", "_"))
        if value is not None and (refusal := integer_refusal(option, value, low)) is not None:
            raise ValueError(refusal)
    alpha, beta, notes, batch_size_source = _simulated_batch_time(args)
    steps = _named("--steps", parse_steps, args.steps)
    duration = seconds("--step-duration", positive=True)
    # The ramp's rule: each simulated step starts from an empty queue, as each of the bench's starts drained, and
    # leaves out the same share of its start, so that the two windows count the same part of a step.
    warmup = _warmup(args.warmup, duration)
    # From the process's own count: a burst's peak or a dense trace offers far more than the step's QPS.
    _check_arrival(args.arrival, steps, warmup + duration)
    model = BatcherModel(
        alpha_s=alpha,
        beta_s=beta,
        max_batch_size=args.max_batch_size,
        max_queue_delay_s=_latency(args, "--max-queue-delay"),
        instances=args.instances,
        max_queue_size=args.max_queue_size,
    )
    cfg = SimConfig(
        model=model,
        steps=steps,
        step_duration_s=duration,
        warmup_s=warmup,
        arrival=args.arrival,
        slo_p99_ms=1e3 * _latency(args, "--slo-p99", positive=True),
        seed=args.seed,
        profile=None if args.profile is None else str(args.profile),
        max_batch_size_source=batch_size_source,
    )
    result = simulate_ramp(cfg)
    result["warnings"] = [*notes, *result["warnings"]]
    _write_outputs(result, args, "wok simulate")
    if args.profile is not None and batch_size_source != "given":
        # Not the command line's: the table does not show the batcher's settings.
        why = (
            "the profile's model.max_batch_size"
            if batch_size_source == "profile"
            else "the profile names no model.max_batch_size"
        )
        print(
            f"wok simulate: max_batch_size {args.max_batch_size}: {why} (--max-batch-size to change)", file=sys.stderr
        )
    print(
        "utilization per step: "
        + ", ".join(f"{s['offered_qps']:g} QPS {100 * s['utilization']:.0f}%" for s in result["steps"])
    )
    return 0


def _simulated_batch_time(args) -> tuple[float, float, list[str], str]:
    """`wok simulate`'s (α, β), the warnings the profile's fit calls for, and where `args.max_batch_size` came from
    (`config.max_batch_size_source`: given, profile, default; set here when not given). From --profile read as
    `wok tune` reads it (α below 0 taken as 0); with it, --alpha and --beta are refused, as by `wok plan` and `wok
    tune`: which of the two a run meant cannot be told. Without --max-batch-size, the profile's model.max_batch_size:
    a simulation of the model profiled batches as its server did, where 1 simulated no batching at all."""
    source = "given" if args.max_batch_size is not None else "default"
    if args.profile is None:
        args.alpha = "0ms" if args.alpha is None else args.alpha
        args.beta = "1ms" if args.beta is None else args.beta
        args.max_batch_size = 1 if args.max_batch_size is None else args.max_batch_size
        return *_batch_time(args), [], source
    from .plan import outside_profiled, past_model_max, profile_advice
    from .tune import load_profile, negative_alpha_warning

    given = [option for option in ("--alpha", "--beta") if getattr(args, option[2:]) is not None]
    if given:
        raise ValueError(f"give --profile or --alpha/--beta, not both; got --profile and {' and '.join(given)}")
    where = f"--profile {args.profile}"
    profile = load_profile(args.profile, where=where)
    if profile.alpha_s + profile.beta_s == 0:
        raise ValueError(f"{where}: fit.alpha_s and fit.beta_s: a batch needs a time, α + β > 0; got both 0")
    notes = []
    if profile.fitted_alpha_s is not None:
        notes.append(negative_alpha_warning(profile.fitted_alpha_s, "wok plan and wok tune take it"))
    limit = profile.model_max_batch_size
    n = args.max_batch_size
    if n is None:
        n = args.max_batch_size = 1 if limit is None else limit
        source = "default" if limit is None else "profile"
    elif limit is not None and n > limit:
        notes.append(past_model_max("--max-batch-size", [n], limit, where))
    least, most = min(profile.profiled_sizes, default=None), max(profile.profiled_sizes, default=None)
    outside = outside_profiled(n, least, most)
    if outside is not None:
        what = f"--max-batch-size {n}" if source == "given" else f"max_batch_size {n}"
        extrapolated = "every batch runs" if n < least else f"batches of more than {most} run"
        notes.append(f"{what} is {outside}: {extrapolated} on the fit α + β·n extrapolated; {profile_advice(n, limit)}")
    return profile.alpha_s, profile.beta_s, notes, source


AUTO_METRICS_PORT = 8002  # `wok serve`'s default --metrics-port, where --metrics-url auto looks
# Said when nothing is scraped: the columns stay, as the CSV's do, each cell `-` (no figure), as they are for a
# step whose scrape failed.
_NOT_SCRAPED = "server-side columns `-` (give --metrics-url)"


def _several(target: str) -> bool:
    return "," in target or target.startswith(("dns:", "ipv4:", "ipv6:", "unix:"))


def _metrics_url(spec: str, target: str, *, replicas: bool = False, say=_warn) -> str | None:
    """The /metrics the ramp scrapes for `target`'s server view, or None; what was decided is said
    (`say`, stderr). `auto` takes http://HOST:8002/metrics only if it is the target's server: its
    wok_server_info names the target's port. A URL given is scraped as given (see `_vet_metrics_url`)."""
    if spec == "none":
        return None
    if replicas:
        # The replicas do not run yet: each one's own /metrics is taken once they serve (faults.start_replicas).
        if spec == "auto":
            return None
        say(f"server-side columns from {spec} (as given)")
        return spec
    if spec != "auto":
        return _vet_metrics_url(spec, None if _several(target) else target, explicit=True, say=say)
    if _several(target):
        say(f"--metrics-url auto: a target of several servers ({target}) has no one /metrics; {_NOT_SCRAPED}")
        return None
    host = target.rsplit(":", 1)[0]
    return _vet_metrics_url(f"http://{host}:{AUTO_METRICS_PORT}/metrics", target, explicit=False, say=say)


def _check_metrics_url(spec: str) -> None:
    """Refuse a --metrics-url that is neither auto, none nor an http(s) URL with a host (and a port
    from 1 to 65535 if it names one): one such as "" or "host:8002/metrics" was scraped at every
    step, nothing ever answering, after a warning."""
    if spec not in ("auto", "none"):
        _check_http_url("--metrics-url", spec, "auto, none or a URL such as http://HOST:8002/metrics")


def _replica_options(host: str) -> dict[str, str]:
    """What faults.Replica.launch gives every replica's `wok serve` itself, before --serve-args (which may
    not give them again). Its --metrics-host too, which --serve-args may give: a default, not fixed."""
    return {"--host": host, "--port": "0", "--metrics-port": "0"}


def _check_replica_args(args, words: list[str]) -> None:
    """Refuse the replicas' `wok serve` arguments that it would refuse (wok serve's own checks, run
    here: wok.__main__.check_replica_args), before any replica starts: each such replica exited 2
    at once, and the bench with 1 and the child's whole usage, in no option's name."""
    from ..__main__ import check_replica_args
    from .faults import replica_host

    host = replica_host(args.replica_host)
    try:
        check_replica_args(["--metrics-host", host, *words], _replica_options(host))
    except ValueError as exc:
        if str(exc).startswith("--host is not to be given"):
            exc = f"{exc} (give --replica-host for another loopback address)"
        if args.serve_args is not None:
            raise ValueError(f"--serve-args {quoted_name(args.serve_args)}: wok serve refuses it: {exc}") from None
        # Not given: the default, the demo models of the mix, which is --model's.
        raise ValueError(
            f"--model {quoted_name(args.model)}: the replicas serve its models (wok serve {' '.join(words)}), "
            f"which wok serve refuses: {exc}"
        ) from None


def _check_http_url(option: str, spec: str, example: str, *, base: bool = False) -> None:
    """Refuse `spec` unless it is an http(s) URL with a host and, if it names one, a port from 1 to
    65535, all printable and without spaces; a `base` (which paths are added to) without a query or
    a fragment either. ValueError naming `option`."""
    from urllib.parse import urlsplit

    try:
        url = urlsplit(spec)
        port = url.port  # ValueError for one that is no number, or out of range
    except ValueError:  # an IPv6 host without its closing bracket
        url = port = None
    if (
        url is None
        or url.scheme not in ("http", "https")
        or not url.hostname
        or port == 0
        or (base and (url.query or url.fragment))
        or not spec.isprintable()
        or " " in spec
    ):
        raise ValueError(f"{option} {quoted_name(spec)}: expected {example}")


def _grpc_ports(snap) -> list[str]:
    """The gRPC ports a scrape's wok_server_info names: one for a wok server, none for any other."""
    return sorted({dict(items).get("grpc_port", "?") for name, items in snap.values if name == "wok_server_info"})


def _vet_metrics_url(url: str, target: str | None, *, explicit: bool, say=_warn, timeout: float = 2.0) -> str | None:
    """`url` if it is to be scraped for the server at `target` (None: several servers), else None.

    Scraped once now. A candidate of `auto` (explicit=False) is taken only when its
    wok_server_info names the target's port: another server's figures, or none at all, would
    be shown as the target's without a word. A URL given (explicit) is scraped as given, since
    a port mapping (a container's, a Kubernetes Service's) can make the port the client dials
    differ from the one the server bound; a mismatch, or why nothing was read, is said.
    """
    from .scrape import NO_ANSWER, read_metrics

    snap = read_metrics(url, timeout=timeout)
    port = None if target is None else target.rsplit(":", 1)[-1]
    if isinstance(snap, str):  # why there is no snapshot: no answer, an HTTP error, not Prometheus text
        if explicit:
            say(f"--metrics-url {url}: {snap} now; scraped at each step all the same (`-` while none)")
            return url
        found = f"nothing answers at {url}" if snap == NO_ANSWER else f"{url} {snap}"
        say(f"--metrics-url auto: {found}; {_NOT_SCRAPED}")
        return None
    ports = _grpc_ports(snap)
    if not ports:
        if explicit:
            say(f"server-side columns from {url} (as given: it names no gRPC port to check it against)")
            return url
        say(
            f"--metrics-url auto: {url} names no wok server (no wok_server_info: another server, or a wok "
            f"older than this bench), so not {target}'s for sure; {_NOT_SCRAPED}"
        )
        return None
    whose = f"the server on gRPC port {ports[0]}" if len(ports) == 1 else f"servers on gRPC ports {', '.join(ports)}"
    if target is None or ports == [port]:
        say(f"server-side columns from {url} ({whose if target is None else f'the server of {target}'})")
        return url
    if explicit:
        say(
            f"--metrics-url {url} is the metrics of {whose}, not of {target}; scraped as given "
            "(right only if a port mapping stands between)"
        )
        return url
    say(f"--metrics-url auto: {url} is the metrics of {whose}, not of {target}; {_NOT_SCRAPED}")
    return None


def _unix_time(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        value = read_float(text)
    except ValueError:
        value = math.nan
    # Checked here, not only by RampConfig, whose refusal named its field (start_at), not the option.
    if not (math.isfinite(value) and value > 0):
        raise ValueError(
            f"--start-at: expected a Unix time in seconds, e.g. $(date +%s); got {quoted_name(text)}"
            f"{underscore_note(text)}"
        )
    return value


def _signals_interrupt() -> _Interrupts | None:
    """SIGTERM and SIGHUP raise KeyboardInterrupt, as Ctrl-C does, until `_restore_signals`;
    of these and Ctrl-C, only the first does, and none once the run has its result (`_Interrupts.measured`).

    Their default kills the bench at once: faults posted to a server stay on, replicas and
    workers are left running, and nothing measured is kept. As a KeyboardInterrupt they take
    the Ctrl-C path, whose finally blocks turn faults off and stop the processes started.
    A second signal raised inside those blocks would cut the cleanup short and lose the steps
    measured, so it is ignored (and said) until the result is written. A signal ignored when
    the bench starts (nohup, a background job) stays ignored. None off the main thread.
    """
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None  # only the main thread may set handlers (and only it gets signals)
    return _Interrupts()


class _Interrupts:
    """The bench's handlers of SIGINT, SIGTERM and SIGHUP (`_signals_interrupt`), and those they replaced."""

    def __init__(self) -> None:
        import signal

        self.first: str | None = None  # the first signal's name
        self.whole = False  # the run has returned its result: a signal is said, not raised
        self.previous = {}
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            handler = signal.getsignal(s)
            if handler is not signal.SIG_IGN:
                self.previous[s] = handler
                signal.signal(s, self.on_signal)

    def on_signal(self, signum, _frame) -> None:
        import signal

        name = signal.Signals(signum).name
        # os.write, not print: the handler may run inside a print to stderr, which a
        # buffered write from here would break with a reentrant-call error.
        if self.first is not None:
            os.write(2, f"wok bench: {name} while stopping after {self.first}: the result is written first\n".encode())
            return
        self.first = name
        if self.whole:
            # Raised in the table's print, the JSON's write or the exit, it cost what the steps measured (exit 130,
            # no table), all of it before the JSON was written: the status stays the run's, as for a signal after
            # its last step (docs/bench.md, "Exit status").
            os.write(2, f"wok bench: {name} after the run: its result is written first\n".encode())
            return
        raise KeyboardInterrupt(name)

    def measured(self) -> None:
        """The run has returned its result: from here a signal is said, not raised."""
        self.whole = True


def _restore_signals(interrupts: _Interrupts | None, exit_takes_them: bool = False) -> None:
    """The handlers the bench's replaced, put back; with `exit_takes_them` (the `wok` command, whose exit takes the
    signals over from the bench's: wok.entry's `_ExitSignals.returned`) left as they are once the run is whole."""
    import signal

    if exit_takes_them and interrupts is not None and interrupts.whole:
        # Put back, Python's default raised a KeyboardInterrupt on the way out of the command (`wok bench:
        # interrupted`, 130) and SIGTERM or SIGHUP killed the process: the run's status lost to a signal after its
        # result was printed (18 of 40 ramps SIGINTed 40-80 us after their last line).
        return
    for s, handler in (interrupts.previous if interrupts is not None else {}).items():
        if handler is not None:  # None: set outside Python, which cannot be put back from here
            signal.signal(s, handler)


def _check_aim(args) -> None:
    """Options that would be ignored together are refused: the run would not be what was asked."""
    from . import soak

    soak.check_options(args)
    if (refusal := integer_refusal("--workers", args.workers, 1)) is not None:
        raise ValueError(refusal)
    if not args.stop_factor > 0:  # NaN too
        raise ValueError(
            f"--stop-factor: expected a number > 0 (inf: no stop by P99 or success rate); got {args.stop_factor:g}"
        )
    if (refusal := integer_refusal("--refine", args.refine, 0)) is not None:  # taken as 0 before, without a word
        raise ValueError(refusal)
    # NaN compares false: a NaN threshold found no knee, and wrote NaN into the JSON; a NaN
    # --require-qps let every run pass.
    if args.require_qps is not None and not math.isfinite(args.require_qps):
        raise ValueError(f"--require-qps: expected a finite number; got {args.require_qps:g}")
    # The knee is the first step whose Δachieved/Δoffered is below it: at 0 or less a flat throughput
    # (all the server can give) is no knee, above 1 a step that kept up with its offer is one.
    if not 0 < args.knee_threshold <= 1:  # NaN too
        raise ValueError(
            f"--knee-threshold: expected a ratio Δachieved/Δoffered above 0 and at most 1; got {args.knee_threshold:g}"
        )
    if args.replicas is not None:
        if (refusal := integer_refusal("--replicas", args.replicas, 1)) is not None:
            raise ValueError(refusal)
        if args.target is not None:
            raise ValueError("--target with --replicas: the bench ramps the replicas it starts; give one of them")
        if args.admin_url:
            raise ValueError("--admin-url with --replicas: slow and fail faults go to the replicas' own admin API")
    elif args.serve_args is not None or args.replica_host is not None:
        option = "--serve-args" if args.serve_args is not None else "--replica-host"
        raise ValueError(f"{option} is for --replicas: without it no server is started")
    if args.admin_url and not args.fault:
        raise ValueError("--admin-url is where --fault slow:/fail: go; no --fault was given")
    for url in args.admin_url:  # else found only when the fault's time came, the ramp half run
        _check_http_url(
            "--admin-url", url, "the admin API's URL, http://HOST:METRICS-PORT of a wok serve --admin", base=True
        )


def _named(option: str, parse, text: str):
    """`parse(text)`, its ValueError prefixed with the option the text came from."""
    try:
        return parse(text)
    except ValueError as exc:
        raise ValueError(f"{option}: {exc}") from None


def _seconds(args, option: str, positive: bool = False) -> float:
    """A duration option of `args` in seconds: finite, and > 0 if `positive`."""
    from .arrivals import parse_duration

    text = getattr(args, option.removeprefix("--").replace("-", "_"))
    value = _named(option, parse_duration, text)
    if not math.isfinite(value) or (positive and value == 0):
        raise ValueError(f"{option}: expected a finite duration{' > 0' if positive else ''}; got {quoted_name(text)}")
    return value


# A bare number is seconds to parse_duration: right for --step-duration 30, a trap for a latency
# ("--slo-p99 50" was a 50 s objective every step passed).
_BARE_NUMBER = re.compile(r"\s*([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?\s*", re.ASCII)


def _with_unit(option: str, text: str) -> str:
    """`text`, refused when it is a bare number: `option` is a latency, whose scale is milliseconds."""
    # 0 is 0 in any unit (`--max-queue-delay 0`, `--overhead 0`): only another number is ambiguous.
    if _BARE_NUMBER.fullmatch(text) and math.isfinite(value := float(text)) and value != 0:
        raise ValueError(
            f"{option} {quoted_name(text.strip(SPACES))}: give a unit, e.g. {value:g}ms or {value / 1e3:g}s (a bare "
            "number would be seconds)"
        )
    return text


# [0-9], not \d: float() reads other scripts' digits ("٣%" was 3 %); \s under re.ASCII: not their spaces either.
_PERCENT = re.compile(r"\s*([0-9]+\.?[0-9]*|\.[0-9]+)\s*%\s*", re.ASCII)


def _warmup(text: str | None, duration: float) -> float:
    """--warmup in seconds: a duration, or a percentage of the step's `duration`; None: 10 %, at most 30 s."""
    if text is None:
        return min(WARMUP_CAP_S, WARMUP_SHARE * duration)
    m = _PERCENT.fullmatch(text)
    if m is not None:
        return float(m.group(1)) / 100 * duration
    from .arrivals import parse_duration

    value = _named("--warmup", parse_duration, text)
    if not math.isfinite(value):
        raise ValueError(
            f"--warmup: expected a finite duration or a percentage of --step-duration; got {quoted_name(text)}"
        )
    return value


def _duration_text(seconds: float) -> str:
    """`seconds` as a person reads a run's length: 45 s, 4 min 24 s, 1 h 6 min."""
    if seconds < 60:
        return f"{seconds:.3g} s"
    hours, rest = divmod(round(seconds), 3600)
    minutes, secs = divmod(rest, 60)
    # To the minute past an hour: the first two units that are not 0 made 3,601 s "1 h 1 s".
    units = ((hours, "h"), (minutes, "min")) if hours else ((minutes, "min"), (secs, "s"))
    return " ".join(f"{n} {unit}" for n, unit in units if n)


def _steps_text(count: int, warmup_s: float, duration_s: float, gap_s: float = 0.0) -> str:
    """How long `count` steps of `warmup_s` + `duration_s` take, `gap_s` between them (--start-at)."""
    total = count * (warmup_s + duration_s) + max(count - 1, 0) * gap_s
    warm = f"{_duration_text(warmup_s)} warm-up + " if warmup_s else ""
    gaps = f" + {count - 1} × {_duration_text(gap_s)} gap" if gap_s and count > 1 else ""
    steps = f"{count} step{'' if count == 1 else 's'}"
    return f"{steps} × ({warm}{_duration_text(duration_s)}){gaps} = {_duration_text(total)}"


def _default_ramp_text() -> str:
    """How long `wok bench ramp` runs with every default, for its help."""
    from .arrivals import parse_duration, parse_steps

    duration = parse_duration(DEFAULT_STEP_DURATION)
    return _steps_text(len(parse_steps(DEFAULT_STEPS)), _warmup(None, duration), duration)


def _planned_text(args, cfg) -> str:
    """What a ramp (or soak) will take, said before it starts: a default ramp of 5 min steps ran 22 min
    with nothing to say so but the first step's progress."""
    from . import soak

    parts = []
    ramps = args.soak is None or args.capacity is None  # a ramp runs: alone, or to find the soak's rate
    if ramps:
        gap = cfg.step_gap_s if cfg.start_at is not None else 0.0
        parts.append(_steps_text(len(cfg.steps), cfg.warmup_s, cfg.step_duration_s, gap))
        if cfg.refine:
            step = _duration_text(cfg.warmup_s + cfg.step_duration_s)
            parts.append(f"up to {cfg.refine} refinement step{'' if cfg.refine == 1 else 's'} of {step}")
    if args.soak is not None:
        parts.append(f"a soak of {_duration_text(soak.soak_values(args, cfg)[0])}")
    text = f"planned: {', then '.join(parts)}"
    if ramps:
        text += f" (less if a step ends the ramp: {ramp_ends_text(cfg.stop_factor, faulted=bool(args.fault))})"
    return text


def ramp_ends_text(stop_factor: float, *, faulted: bool = False) -> str:
    """What may end a ramp before its last step (Ramp.run), for a planned line: with --stop-factor inf it said
    nothing, though a step with no request OK ends a ramp whatever the factor, unless some of its requests failed by
    load (analysis.none_ok), which only a finite factor stops. A --fault run goes on through both
    (faults.run_faults, FaultRamp) but for a step that sent nothing or had every request refused as malformed."""
    if faulted:
        return "no request sent, or every request refused as malformed"
    return "--stop-factor, or no request OK" if math.isfinite(stop_factor) else "no request OK, none failed by load"


def _check_target(text: str) -> str:
    """`text` if it names a server the way wok.clients.channel reads targets: HOST:PORT or
    [IPV6]:PORT, several of them comma-separated, or a gRPC URI (dns:///NAME:PORT, ipv4:…, unix:…),
    which is taken as given. Without a port gRPC dials 443; a URL doubled its scheme in --metrics-url
    auto's URL."""
    from wok.clients.channel import _SCHEMES, split_host_port, target_list

    text = text.strip()  # "HOST:PORT " from a script: gRPC took it, and the items of a list are stripped
    if text.startswith(_SCHEMES):
        return text
    if not text:  # `--target ""` (a variable left empty) ramped the default target, 127.0.0.1:8001
        raise ValueError("--target '': expected HOST:PORT (several: HOST:PORT,HOST:PORT or dns:///NAME:PORT)")
    for one in target_list(text):
        parsed = split_host_port(one)
        plain = "/" not in one and (one.count(":") == 1 or one.startswith("["))
        if parsed is None or not plain or not 0 < parsed[1] < 65536:
            hint = " (no URL scheme: gRPC, not HTTP)" if "://" in one else ""
            raise ValueError(
                f"--target {quoted_name(text)}: expected HOST:PORT (several: HOST:PORT,HOST:PORT or "
                f"dns:///NAME:PORT){hint}"
            )
    return text


def check_one_target(text: str) -> str:
    """`text` if it names one server (HOST:PORT, [IPV6]:PORT or a gRPC URI): the tools that test a
    single server (fuzz, chaos) refuse a list, and say so whatever was wrong."""
    from wok.clients.channel import _SCHEMES

    try:
        checked = _check_target(text)
    except ValueError:
        checked = None
    if checked is None or "," in checked:  # ipv4:A,B is several servers too
        hint = " (no URL scheme: gRPC, not HTTP)" if "://" in text and not text.startswith(_SCHEMES) else ""
        raise ValueError(
            f"--target {quoted_name(text)}: expected one server, HOST:PORT, [IPV6]:PORT or a gRPC name{hint}"
        )
    return checked


def _latency(args, option: str, positive: bool = False) -> float:
    """A latency option of `args` in seconds (`_seconds`), its unit required (`_with_unit`)."""
    _with_unit(option, getattr(args, option.removeprefix("--").replace("-", "_")))
    return _seconds(args, option, positive)


def _batch_time(args) -> tuple[float, float]:
    """(α, β) from --alpha and --beta, each refused in its option's name (the model's is alpha_s); latencies,
    so with a unit."""
    alpha, beta = _latency(args, "--alpha"), _latency(args, "--beta")
    if alpha + beta == 0:
        raise ValueError("--alpha and --beta: a batch needs a time, α + β > 0; got both 0")
    return alpha, beta


def _arrivals(option: str, spec: str, qps: float, duration_s: float):
    """`parse_arrivals(spec, qps, duration_s=...)`, its errors, an unreadable trace file's too, the option's."""
    from .arrivals import parse_arrivals

    def parse(text: str):
        try:
            return parse_arrivals(text, qps, duration_s=duration_s)
        except OSError as exc:  # a trace file: an option's value, not a failure of the run (exit 1)
            raise ValueError(
                f"arrivals {quoted_name(text)}: cannot read {exc.filename}: {exc.strerror or exc}"
            ) from None

    return _named(option, parse, spec)


def _check_arrival(spec: str, steps: list[float], step_s: float) -> None:
    """Refuse a bad --arrival, and a schedule too large to hold, before anything connects (or simulates)."""
    from .simulate import MAX_ARRIVALS_PER_STEP, arrival_count

    # Every process offers more at a higher step rate (or, a trace at a fixed scale, the same),
    # and refined steps lie between the given ones: the highest step expects the most.
    top = max(steps)
    expected = arrival_count(_arrivals("--arrival", spec, top, step_s), step_s)
    if not expected <= MAX_ARRIVALS_PER_STEP:
        raise ValueError(
            f"--steps × (--warmup + --step-duration) with --arrival {spec}: at most {MAX_ARRIVALS_PER_STEP:.0e} "
            f"arrivals per step; got {expected:.3g} expected at {top:g} QPS over {step_s:g} s"
        )


def run(args) -> int:
    from ..clients import InferError
    from ..clients.errors import PLAINTEXT_HINT
    from . import faults, hostprobe, report, soak
    from .arrivals import parse_duration, parse_steps
    from .payloads import check_int_high, parse_mix, parse_sizes
    from .runner import Ramp, RampConfig
    from .workers import pick_balancer

    _check_aim(args)
    _check_outputs(args, *_RESULT_OUTPUTS, folders=_RESULT_FOLDERS)
    target = _check_target(DEFAULT_TARGET if args.target is None else args.target)
    _check_metrics_url(args.metrics_url)
    tls, token = _security(args)
    duration = _seconds(args, "--step-duration", positive=True)
    warmup = _warmup(args.warmup, duration)
    steps = _named("--steps", parse_steps, args.steps)
    _check_arrival(args.arrival, steps, warmup + duration)
    _named("--sizes", parse_sizes, args.sizes)  # else refused after connecting, in no option's name
    # Else numpy refuses it after connecting (building the payload pool), in no option's name:
    # "expected non-negative integer".
    if (refusal := integer_refusal("--seed", args.seed, 0)) is not None:
        raise ValueError(refusal)
    # Else refused by the payload generator after connecting (exit 1 with the connection's error when nothing
    # answers, or after --replicas started), in no option's name.
    if (refusal := integer_refusal("--rows", args.rows, 1)) is not None:
        raise ValueError(refusal)
    if args.int_high is not None:
        check_int_high(args.int_high)
    _with_unit("--slo-p99", args.slo_p99)
    cfg = RampConfig(
        target=target,
        models=parse_mix(args.model),
        steps=steps,
        step_duration_s=duration,
        warmup_s=warmup,
        arrival=args.arrival,
        sizes=args.sizes,
        rows=args.rows,
        int_high=DEFAULT_INT_HIGH if args.int_high is None else args.int_high,
        int_high_given=args.int_high is not None,
        slo_p99_ms=1e3 * _seconds(args, "--slo-p99", positive=True),
        workers=args.workers,
        timeout_s=_seconds(args, "--timeout", positive=True),
        metrics_url=None,  # chosen below, once the options are known to be good
        seed=args.seed,
        stop_factor=args.stop_factor,
        refine=args.refine,
        knee_threshold=args.knee_threshold,
        tls=tls,
        token=token,
        retries=not args.no_retries,
        balancer=args.balancer,
        hedge_after=faults.parse_hedge_after(_with_unit("--hedge-after", args.hedge_after)),
        rpc=args.rpc,
        streams=args.streams,
        server_timing=args.server_timing,
        start_at=_unix_time(args.start_at),
        step_gap_s=_seconds(args, "--step-gap"),
    )
    plain = args.soak is None and not args.fault and args.replicas is None
    probe_s = _named("--host-probe", parse_duration, args.host_probe)
    if not math.isfinite(probe_s):
        raise ValueError(f"--host-probe: expected a finite duration (0: off); got {quoted_name(args.host_probe)}")
    if probe_s and not plain:
        raise ValueError("--host-probe is for plain ramps; not with --soak, --fault or --replicas")
    if cfg.start_at is not None and not plain:
        raise ValueError("--start-at is for plain ramps of several generators; not with --soak, --fault or --replicas")
    if (refusal := integer_refusal("--streams", args.streams, 1)) is not None:
        raise ValueError(refusal)
    # The balancer the workers will use (as WorkerPool picks it): several replicas are several targets.
    balancer = pick_balancer(args.balancer, args.rpc, target, replicas=args.replicas or 0)
    if args.rpc == "stream" and balancer != "grpc":
        raise ValueError("--rpc stream sends on one channel: it does not go with --balancer wok")
    if args.server_timing and (args.rpc != "unary" or balancer != "grpc"):
        raise ValueError(
            "--server-timing reads unary calls' trailers on one channel: not with --rpc stream or --balancer wok "
            "(the default for several targets or replicas; give --balancer grpc)"
        )
    if args.hedge_after != "auto" and balancer != "wok":
        raise ValueError("--hedge-after is the wok balancer's: it does nothing with --balancer grpc")
    # The soak's, the faults' and the replicas' own options too, before --metrics-url is scraped (for
    # up to 2 s, and said): a bad --fault or --soak was refused after both.
    if args.soak is not None:
        if args.fault:
            raise ValueError("--soak runs without --fault")
        soak.soak_values(args, cfg)
        if args.replicas is not None:
            faults.serve_args_of(args, cfg)
    elif args.replicas is not None or args.fault:
        faults.check_options(args, cfg)
    if args.replicas is not None:
        _check_replica_args(args, faults.serve_args_of(args, cfg))
    cfg = replace(cfg, metrics_url=_metrics_url(args.metrics_url, target, replicas=args.replicas is not None))
    print(f"wok bench: {_planned_text(args, cfg)}", file=sys.stderr, flush=True)
    interrupts = _signals_interrupt()
    try:
        try:
            if args.soak is not None:
                result = soak.run_soak(args, cfg)
            elif args.replicas is not None or args.fault:
                result = faults.run_faults(args, cfg)
            else:
                before = hostprobe.try_probe(probe_s, _warn)
                ramp = Ramp(cfg)
                result = ramp.run()
                if probe_s:
                    result["host_probe"] = hostprobe.around(before, _probe_after(probe_s, ramp.late_signal))
            if interrupts is not None:
                interrupts.measured()
        except (RuntimeError, OSError, InferError) as exc:  # the target or a worker failed us
            if isinstance(exc, InferError) and exc.code.name == "NOT_FOUND":
                # A model of --model that the target does not serve, refused with its metadata before
                # the first step: a bad option, as a step whose every request comes back NOT_FOUND.
                print(f"wok bench: --model {quoted_name(args.model)}: {exc}", file=sys.stderr)
                return BAD_REQUESTS
            # A plaintext client's connection closed unanswered; the clients' other hints (a server draining) are
            # their own words, which the TLS advice replaced.
            if isinstance(exc, InferError) and exc.hint == PLAINTEXT_HINT:
                exc = (
                    f"{exc.code.name}: {exc.details} (the server closed the connection before gRPC began: a "
                    "TLS-only server (the bench connected in plaintext: give --tls-ca PATH, or --tls to trust "
                    "gRPC's bundled roots), or no gRPC server behind the port)"
                )
            elif isinstance(exc, InferError) and exc.code.name == "UNAUTHENTICATED":
                # The server's message names the metadata to send; the bench sends it from its options.
                exc = f"{exc} ({_token_hint(args)})"
            print(f"wok bench: {exc}", file=sys.stderr)
            return 1
        if _show_after(
            lambda: _write_or_keep("wok bench", result, _result_outputs(args), folders=_RESULT_FOLDERS),
            lambda: report.print_table(result),
        ):
            return 1
        _print_sections(result)
        # Its lines too before the handlers go back: a signal after them is the process's exit's (wok.entry).
        return _exit_status(result, args)
    finally:
        _restore_signals(interrupts, args.exit_takes_signals)


def _probe_after(probe_s: float, late_signal: str | None) -> dict:
    """The host probe after a ramp (`--host-probe`), said as it starts. A signal before it (`late_signal`,
    as the workers stopped) or during it leaves a failed reading, `{schema, error}`: the ramp is
    measured whole, and a KeyboardInterrupt from the probe cost the result, its JSON never written."""
    from . import hostprobe

    if late_signal is not None:
        return {"schema": hostprobe.SCHEMA, "error": f"not run: {late_signal} after the ramp"}
    try:  # the line too: a signal as soon as it is read lands before the probe has begun
        _warn(f"probing the host for {probe_s:g} s after the ramp (--host-probe)")
        return hostprobe.try_probe(probe_s, _warn)
    except KeyboardInterrupt as exc:
        _warn(f"warning: host probe after the ramp cut short by {type(exc).__name__}: {exc}")
        return {"schema": hostprobe.SCHEMA, "error": f"cut short: {type(exc).__name__}: {exc}"}


def _write_or_keep(command: str, result: dict, outputs, folders=()) -> bool:
    """A command's output writes (`write_outputs`, --json first). True when one failed past the
    up-front check (its folder removed meanwhile, a full disk, a plot that cannot be drawn) with
    the result in no file: the minutes measured then go to a temporary one, named on stderr, and
    the command fails (1).
    With --json written, another output's failure is that option's error (2), as for any."""
    failed = _write_outputs_in_order(result, outputs, folders=folders)
    _say_written(command, outputs, failed)
    if failed is None:
        return False
    exc, held = failed
    if held:
        raise exc
    print(f"{command}: {_keep_elsewhere(_result_text(result), exc)}", file=sys.stderr)
    return True


def _exit_status(result: dict, args) -> int:
    """The status of a ramp whose result is written (docs/bench.md, "Exit status"); why on stderr."""
    from . import faults, soak
    from .analysis import failed_by_model, refused_as_bad

    fail_faults = any(f["kind"] == "fail" for f in (result.get("faults") or {}).get("faults", ()))
    for step in result.get("steps") or ():
        refused = refused_as_bad(step)
        if refused is not None:
            # Not a server overloaded: the requests are wrong for it (--model, --rows, --sizes, --int-high). The values
            # sent are named: a server's refusal of ids past a table says its rows, not that the ramp sent the default.
            print(
                f"wok bench: the server refused every request at {step['offered_qps']:g} QPS as a bad request "
                f"({refused}); check --model, --rows ({args.rows}), --sizes ({quoted_name(args.sizes)}) and "
                f"--int-high ({_int_high_text(args)}) against the model",
                file=sys.stderr,
            )
            return BAD_REQUESTS
        # A fail: fault fails every request of a step it spans: what it is run for, no broken model.
        failed = None if fail_faults else failed_by_model(step)
        if failed is not None:
            # Exit 0 read as a capacity of nothing ("knee: at or below" the first step) for a model that never ran.
            print(
                f"wok bench: the model failed every request at {step['offered_qps']:g} QPS ({failed}); not a "
                f"capacity result: check the model, and --int-high ({_int_high_text(args)}) "
                "against its embedding tables",
                file=sys.stderr,
            )
            return BAD_REQUESTS
    cut = result.get("interrupted")
    if cut is not None and not cut["by_signal"]:
        # A worker or the target ended the run after a step: what was measured is written,
        # but the run failed as surely as one that failed in its first step (status 1 too).
        print(f"wok bench: the run failed (the steps before it are the result): {cut['reason']}", file=sys.stderr)
        return 1
    if "faults" in result:
        missed = [
            f["fault"] for f, why in zip(result["faults"]["faults"], faults.not_in_effect(result["faults"])) if why
        ]
        if missed:
            print(f"wok bench: fault(s) not run as asked: {', '.join(missed)} (see above)", file=sys.stderr)
            return FAULT_NOT_IN_EFFECT
    if args.soak is not None and result.get("soak") is None and result.get("interrupted") is None:
        print(f"wok bench: {soak.NO_CAPACITY}; the capacity ramp is the result", file=sys.stderr)
        return SOAK_NO_CAPACITY
    best = result["max_qps_under_slo"]
    if args.require_qps is not None and (best is None or best < args.require_qps):
        print(f"wok bench: max QPS under the SLO is {best}, below the required {args.require_qps:g}", file=sys.stderr)
        return REQUIRE_QPS_NOT_MET
    return 0


def _int_high_text(args) -> str:
    """The ids a ramp sent, for its refusals: the --int-high given, or the default's bounds. The default, said beside a
    given one too, is no longer one number: an input whose server publishes a bound of its ids is drawn below it."""
    default = f"{DEFAULT_INT_HIGH}, or an input's id bound the server publishes"
    if args.int_high is not None:
        return f"{args.int_high}; default {default}"
    return f"not given: {default}"


def add_profile_parser(sub) -> None:
    p = sub.add_parser(
        "profile",
        help="batch time against batch size, FLOPs and bytes, and the roofline of a model",
        description="Run a model in-process through wok's executor at each batch size, fit T(n) = α + β·n, "
        "count FLOPs and bytes per batch, classify the arithmetic intensity and compare the time measured "
        "with the roofline's prediction. See docs/profile.md.",
    )
    p.add_argument("model", help="a demo model (mlp, recsys, encoder), or a model in --model-repository")
    p.add_argument("--model-repository", type=Path, help="folder of models to take MODEL from")
    p.add_argument("--batch-sizes", help="list or start:stop:factor (default: powers of two up to max_batch_size)")
    p.add_argument("--warmup", type=int, default=5, help="untimed batches per size first (default 5)")
    p.add_argument("--repeats", type=int, default=100, help="timed batches per size (default 100)")
    p.add_argument(
        "--sizes", default="fixed:16", help="length of variable dims, as for wok bench ramp (default fixed:16)"
    )
    p.add_argument(
        "--int-high",
        type=int,
        help=f"integer inputs uniform in [0, N), every one (default: each input below the smallest embedding table "
        f"its ids reach, another below the model's smallest table, else {DEFAULT_INT_HIGH}; wok bench ramp's: "
        f"each input below the bound its server publishes, its own tables' as here, the others below "
        f"{DEFAULT_INT_HIGH})",
    )
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default)")
    p.add_argument("--torch-threads", type=int, help="torch intra-op threads (default: torch's choice)")
    p.add_argument(
        "--cpu-linear",
        choices=("onednn", "torch"),
        default="onednn",
        help="how a CPU instance runs nn.Linear, as `wok serve --cpu-linear` (default onednn)",
    )
    p.add_argument("--peak-flops", help="device peak FLOP/s, e.g. 60T (default: measured by a matmul)")
    p.add_argument("--bandwidth", help="device memory bandwidth in bytes/s, e.g. 3.3T (default: measured by a copy)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs, their values and sizes (default 0)")
    p.add_argument("--json", type=Path, help="write the result (schema wok.profile/1) here")
    _add_plot(p, metavar="FILE", help="write the roofline and T(n) plot here (PNG; SVG or PDF by its suffix)")
    p.set_defaults(run=_quiet_when_stdout_closes(run_profile))


@contextlib.contextmanager
def _profile_progress(label: str, total: int | None, phase: str | None = None):
    """What `wok profile` tells its progress to (profiler.Progress): a bar on stderr (stdout: the table) where that is
    a terminal that draws one, as the ramp's (runner.live_bar_console); elsewhere (nohup, CI, a pipe) plain lines
    there, on time while a batch or a phase runs (runner.PlainProgress). Until 2026-12-06 none there: the bar, off so
    that its stop wrote no empty line before a refusal, left a long profile silent. `total`: the batches, None until
    `count_to` says it (the model's load, a phase before its max_batch_size is known); `phase`: the one that runs
    from the start, in the bar's first frame (until 2026-12-07 set once the bar was up: its first frame said the
    label alone)."""
    from .runner import PlainProgress, live_bar_console

    console = live_bar_console()
    if console is None:
        plain = PlainProgress(label, total, "batches", lambda line: print(line, file=sys.stderr, flush=True))
        plain.phase(phase)
        with plain:
            yield plain
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    # Not read as rich's markup: the label and a phase hold what the user typed (the model's name, the repository's
    # path since the load is a phase), where a `[/]` raised rich's MarkupError and a `[bold]` was taken for a style.
    text = TextColumn("{task.description}", markup=False)
    columns = (text, BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    with Progress(*columns, console=console, transient=True) as bar:
        yield _BarProgress(bar, bar.add_task(_described(label, phase), total=total), label)


class _BarProgress:
    """profiler.Progress on rich's bar: the batches advance it, a phase is said beside the label."""

    def __init__(self, bar, task, label: str) -> None:
        self.bar, self.task, self.label = bar, task, label

    def __call__(self, batches: int) -> None:
        self.bar.advance(self.task, batches)

    def count_to(self, total: int) -> None:
        self.bar.update(self.task, total=total)

    def phase(self, name: str | None) -> None:
        self.bar.update(self.task, description=_described(self.label, name))


def _described(label: str, phase: str | None) -> str:
    """The bar's description: the label, and the phase that runs beside it (PlainProgress's line says it so too)."""
    return label if phase is None else f"{label}: {phase}"


def _label_name(name: str) -> str:
    """The model's name as the profile's label shows it: as a refusal shows a name (errors.quoted_name: escaped, cut
    past NAME_CHARS) but with no quotes (`profiling mlp`). Until 2026-12-07 the label said it raw: off a terminal,
    past 10 s, a line held its newline (two lines) or its terminal escape, and all of a name of 100,000 characters."""
    return unquoted(name, NAME_CHARS)


def run_profile(args) -> int:
    import torch

    from ..errors import ModelNotFound
    from ..models import build_demo
    from ..repository import load_model
    from . import profiler, report, roofline
    from .payloads import parse_sizes

    _check_outputs(args, "--json", "--plot")
    if args.torch_threads is not None:
        if (refusal := integer_refusal("--torch-threads", args.torch_threads, 1)) is not None:
            raise ValueError(refusal)
        torch.set_num_threads(args.torch_threads)
    # The options read before the model is loaded (seconds for a large one): a typo is refused at once. Only sizes past
    # the model's max_batch_size need the model.
    given_sizes = None if args.batch_sizes is None else profiler.parse_batch_sizes(args.batch_sizes)  # '': refused
    if given_sizes is not None:
        profiler.check_batch_sizes(given_sizes)
    settings = {
        "warmup": args.warmup,
        "repeats": args.repeats,
        "int_high": args.int_high,
        "device": args.device,
        "seed": args.seed,
        "cpu_linear": args.cpu_linear,
    }
    profiler.check_options(**settings)
    profiler.profile_device(args.device)  # CUDA asked for and absent
    _named("--sizes", parse_sizes, args.sizes)  # else refused as "sizes ...", in no option's name
    peak = roofline.parse_rate(args.peak_flops, "--peak-flops") if args.peak_flops else None
    bandwidth = roofline.parse_rate(args.bandwidth, "--bandwidth") if args.bandwidth else None
    # The load is a phase of the progress: until 2026-12-07 it said nothing, and a large model's load looked hung.
    # The batches' count is known once the model is (its max_batch_size sets the default sizes).
    loading = f"loading model {quoted_name(args.model)}"
    if args.model_repository is not None:
        loading += f" from model repository {printable(str(args.model_repository))}"
    with _profile_progress(f"profiling {_label_name(args.model)}", None, loading) as progress:
        try:
            if args.model_repository is None:
                servable = build_demo(args.model)
            else:  # the model alone: a sibling's build (failing, slow, loading dynamo) is no part of its profile
                servable = load_model(args.model_repository, args.model)
        except ModelNotFound as exc:
            raise ValueError(str(exc)) from None
        if given_sizes is not None:
            batch_sizes = given_sizes
        else:
            batch_sizes = profiler.default_batch_sizes(servable.config.max_batch_size)
            if len(batch_sizes) < 2:
                raise ValueError(
                    f"model '{servable.name}' has max_batch_size {servable.config.max_batch_size}: T(n) = α + β·n "
                    "needs batches of two or more sizes, and the server forms no batch above max_batch_size"
                )
        cfg = profiler.ProfileConfig(batch_sizes=batch_sizes, sizes=args.sizes, **settings)
        progress.count_to((cfg.warmup + cfg.repeats) * len(set(cfg.batch_sizes)))
        result = profiler.profile(
            servable,
            cfg,
            lambda device: roofline.roofline_for(device, peak, bandwidth),
            progress=progress,
            source="demo" if args.model_repository is None else str(args.model_repository),
        )
    outputs = [("--json", args.json, report.write_json), ("--plot", args.plot, profiler.plot_profile)]
    failed = _show_after(lambda: _write_or_keep("wok profile", result, outputs), lambda: profiler.print_table(result))
    return 1 if failed else 0


def add_plan_parser(sub) -> None:
    p = sub.add_parser(
        "plan",
        help="GPUs for a peak load, per team, and the autoscaling manifests",
        description="N = ⌈peak QPS × T_batch / (n × U_target)⌉ GPUs plus k for redundancy, computed exactly; "
        "per-team quotas; an autoscaling policy as a Kubernetes HPA (Prometheus adapter) and a KEDA "
        "ScaledObject. See docs/plan.md.",
    )
    peak = p.add_argument_group("peak load (one of)")
    peak.add_argument("--peak-qps", help="the peak request rate")
    peak.add_argument("--burst", help="Gaussian burst base=QPS,amplitude=QPS|Nx[,sigma=30s]: peak = base + amplitude")
    peak.add_argument("--team", action="append", default=[], metavar="NAME=QPS", help="a team's peak (repeat)")
    batch = p.add_argument_group("batch time (one of)")
    batch.add_argument("--t-batch", help="time of one batch of --batch-size rows, e.g. 20ms")
    batch.add_argument("--alpha", help="T_batch = α + β·n: α, e.g. 2ms (with --beta)")
    batch.add_argument("--beta", help="β, the time per row, e.g. 0.5ms (with --alpha)")
    batch.add_argument("--profile", type=Path, help="α and β from a `wok profile --json` file (wok.profile/1)")
    batch.add_argument(
        "--from-ramp", type=Path, help="T_batch and n from a `wok bench ramp --json` result (wok.bench/1 or /2)"
    )
    batch.add_argument("--batch-size", help="n, the mean rows per batch (not with --from-ramp)")
    batch.add_argument(
        "--max-queue-delay",
        help="the model's max_queue_delay_ms, e.g. 5ms: whether batches of n can fill at each GPU's load "
        "(default 5ms, the server's default)",
    )
    p.add_argument("--target-util", default="0.65", help="U_target in (0, 1] (default 0.65; advised 0.6-0.7)")
    p.add_argument("--redundancy", type=int, default=1, help="k replicas beyond N (default 1)")
    p.add_argument(
        "--unit",
        choices=("cpu", "gpu"),
        help="what N counts, where the batch time's source records no device (a ramp written before 2026-12-05, "
        "--t-batch, --alpha/--beta; default: the device --profile or --from-ramp records, else gpu)",
    )
    auto = p.add_argument_group("autoscaling")
    auto.add_argument("--scale-out-above", default="0.7", help="busy ratio to scale out above (default 0.7)")
    auto.add_argument("--scale-in-below", default="0.3", help="busy ratio to scale in below (default 0.3)")
    auto.add_argument(
        "--sustain", default="3m", help="how long either must hold: the stabilization windows (default 3m)"
    )
    auto.add_argument("--max-replicas", type=int, help="the autoscaler's ceiling (default 2 × (N + k))")
    auto.add_argument("--model", help="the model whose busy time drives scaling (default: the ramp's, or mlp)")
    auto.add_argument("--deployment", default="wok", help="the Deployment to scale (default wok)")
    auto.add_argument("--namespace", default="wok", help="its namespace (default wok)")
    auto.add_argument("--prometheus-url", default="http://prometheus-operated.monitoring.svc:9090",
                      help="Prometheus as KEDA reaches it (default %(default)s)")  # fmt: skip
    auto.add_argument(
        "--adapter-namespace", default="monitoring", help="the Prometheus adapter's namespace (default monitoring)"
    )
    p.add_argument("--json", type=Path, help="write the plan (schema wok.plan/1) here")
    p.add_argument("--markdown", type=Path, help="write the plan as markdown here")
    p.add_argument("--manifests", type=Path, help="write the Kubernetes manifests into this folder")
    p.set_defaults(run=_quiet_when_stdout_closes(run_plan))


# What the planner's inputs are called on this command line: its range errors start with them.
PLAN_OPTIONS = {
    "model": "--model",
    "deployment": "--deployment",
    "namespace": "--namespace",
    "prometheus_url": "--prometheus-url",
    "adapter_namespace": "--adapter-namespace",
    "peak_qps": "--peak-qps",
    "t_batch_s": "--t-batch",
    "batch_size": "--batch-size",
    "target_util": "--target-util",
    "redundancy": "--redundancy",
    "scale_out_above": "--scale-out-above",
    "scale_in_below": "--scale-in-below",
    "sustain_s": "--sustain",
    "max_replicas": "--max-replicas",
    "max_queue_delay_s": "--max-queue-delay",
    "unit": "--unit",
}


def run_plan(args) -> int:
    from . import plan

    _check_outputs(args, "--json", "--markdown", "--manifests")
    if args.manifests is not None and (why := plan.manifests_problem(args.manifests)):
        # Its own rule (only the last level is made), checked before the plan is printed as the others are.
        raise ValueError(f"--manifests {args.manifests}: {why}")
    sources = [x for x in ("t_batch", "alpha", "profile", "from_ramp") if getattr(args, x) is not None]
    if args.beta is not None and args.alpha is None:
        raise ValueError("--beta needs --alpha")
    if len(sources) != 1:
        raise ValueError("give the batch time one way: --t-batch, --alpha/--beta, --profile or --from-ramp")
    if args.from_ramp is not None:
        if args.batch_size is not None:
            raise ValueError("--from-ramp takes n from the ramp: drop --batch-size")
        if args.max_queue_delay is not None:
            # Unread: the ramp's n is the batch its step formed, window and all.
            raise ValueError("--from-ramp takes n as the ramp's batches formed it: drop --max-queue-delay")
        batch = plan.batch_from_ramp(args.from_ramp)
    else:
        if args.batch_size is None:
            raise ValueError("--batch-size is needed with --t-batch, --alpha/--beta and --profile")
        n = plan.exact(args.batch_size, "--batch-size", positive=True)
        if args.t_batch is not None:
            batch = plan.batch_given(
                plan.exact_duration(args.t_batch, "--t-batch", positive=True), n, names=PLAN_OPTIONS
            )
        elif args.alpha is not None:
            if args.beta is None:
                raise ValueError("--alpha needs --beta")
            alpha, beta = plan.exact_duration(args.alpha, "--alpha"), plan.exact_duration(args.beta, "--beta")
            ab = {**PLAN_OPTIONS, "beta_s": "--beta", "t_batch_s": "--alpha + --beta × --batch-size"}
            batch = plan.batch_from_alpha_beta(alpha, beta, n, names=ab)
        else:
            batch = plan.batch_from_profile(args.profile, n, names=PLAN_OPTIONS)
    # `--model ""` is refused (Autoscaling.check), not taken for the default.
    model = args.model if args.model is not None else batch.detail.get("model") or "mlp"
    autoscaling = plan.Autoscaling(
        scale_out_above=plan.exact(args.scale_out_above, "--scale-out-above", positive=True),
        scale_in_below=plan.exact(args.scale_in_below, "--scale-in-below", positive=True),
        sustain_s=plan.exact_duration(args.sustain, "--sustain"),
        max_replicas=args.max_replicas,
        model=model,
        deployment=args.deployment,
        namespace=args.namespace,
        prometheus_url=args.prometheus_url,
        adapter_namespace=args.adapter_namespace,
    )
    result = plan.build_plan(
        batch=batch,
        peak_qps=None if args.peak_qps is None else plan.exact(args.peak_qps, "--peak-qps", positive=True),
        burst=None if args.burst is None else plan.parse_burst(args.burst),
        teams=[plan.parse_team(t) for t in args.team],
        target_util=plan.exact(args.target_util, "--target-util", positive=True),
        redundancy=args.redundancy,
        autoscaling=autoscaling,
        names=PLAN_OPTIONS,
        max_queue_delay_s=None
        if args.max_queue_delay is None
        else plan.exact_duration(args.max_queue_delay, "--max-queue-delay"),
        unit=args.unit,
    )

    def markdown(r: dict, path: Path) -> None:
        path.write_text(plan.to_markdown(r), encoding="utf-8")

    def write() -> None:
        if args.manifests:
            with _writing("--manifests", args.manifests):
                written = plan.write_manifests(result, args.manifests)
            for path in written:
                print(f"wok plan: wrote {path} (--manifests)", file=sys.stderr)
        outputs = [("--json", args.json, plan.write_json), ("--markdown", args.markdown, markdown)]
        _write_or_raise(result, outputs, "wok plan")

    _show_after(write, lambda: plan.print_table(result))
    return 0


def add_tune_parser(sub) -> None:
    p = sub.add_parser(
        "tune",
        help="pick max_batch_size and max_queue_delay by simulating the batcher",
        description="For every (max batch size, queue delay) pair, bisect on offered QPS in the batcher simulator "
        "for the highest rate whose P99 meets the SLO; choose the best pair, print the table and write the model "
        "config part (docs/tune.md).",
    )
    p.add_argument("--slo-p99", required=True, help="P99 latency objective, e.g. 50ms")
    p.add_argument("--profile", type=Path, help="batch times from wok profile --json (schema wok.profile/1)")
    p.add_argument("--alpha", help="fixed time per batch, e.g. 0.2ms (instead of --profile)")
    p.add_argument("--beta", help="time per sample in a batch, e.g. 0.03ms (instead of --profile)")
    p.add_argument(
        "--batch-times", choices=("fit", "samples"), default="fit",
        help="fit: α + β·n (the default), or samples: drawn from the profile's measured batch times (docs/tune.md: why "
        "not by default)",
    )  # fmt: skip
    p.add_argument("--overhead", help="constant per-request time outside the batcher (default 0ms)")
    p.add_argument(
        "--overhead-samples",
        type=Path,
        help="measured per-request overheads (schema wok.overhead/1; not with --overhead)",
    )
    p.add_argument(
        "--cpu-calibration", type=Path,
        help="the server's CPU stage and its own batch time (schema wok.cpustage/1, from bench/tune_check.py)",
    )  # fmt: skip
    p.add_argument(
        "--per-request-cpu",
        help="event-loop CPU per request, e.g. 0.23ms, split evenly before and after the batcher (overrides the "
        "calibration's, keeping its split)",
    )
    p.add_argument(
        "--cores",
        type=float,
        help="cores the loop, the model and the background share (0: unbounded; default: the calibration's, else 0)",
    )
    p.add_argument("--arrival", default="poisson", help="as for wok bench ramp (default poisson)")
    p.add_argument("--max-batch-sizes", default="4,8,16,32,64", help="batch sizes to try (default %(default)s)")
    p.add_argument("--delays", default="0ms,1ms,2ms,5ms,10ms", help="queue delays to try (default %(default)s)")
    p.add_argument(
        "--default",
        default="32,5ms",
        help="the setting to compare with: MAX_BATCH_SIZE,DELAY, or none (default 32,5ms)",
    )
    p.add_argument(
        "--allow-extrapolated",
        action="store_true",
        help="choose a setting whose batches run past the profiled sizes even when a measured one meets the SLO "
        "(default: measured first; docs/tune.md)",
    )
    p.add_argument("--instances", type=int, default=1, help="model instances, each running one batch (default 1)")
    p.add_argument("--sim-duration", default="10s", help="simulated step length per evaluation (default 10s)")
    p.add_argument(
        "--sim-warmup",
        default="1s",
        help="simulated before each evaluation's step, not counted (default 1s, whatever --sim-duration: not the "
        "ramp's 10%%, docs/tune.md)",
    )
    p.add_argument("--iterations", type=int, default=8, help="bisection steps per setting, at most 51 (default 8)")
    p.add_argument("--tie", type=float, default=0.02, help="relative QPS difference counted as a tie (default 0.02)")
    p.add_argument("--seed", type=int, default=0, help="seed of the simulated arrivals (default 0)")
    p.add_argument("--write-config", type=Path, help="write the chosen max_batch_size and [dynamic_batching] here")
    p.add_argument("--json", type=Path, help="write the result (schema wok.tune/2) here")
    p.set_defaults(run=_quiet_when_stdout_closes(run_tune))


def run_tune(args) -> int:
    from . import report
    from .arrivals import parse_duration
    from .plan import past_model_max
    from .tune import (
        MAX_ITERATIONS,
        Profile,
        SearchConfig,
        SearchNames,
        load_overhead,
        load_profile,
        overhead_by_rate,
        print_table,
        read_json,
        tune,
        tune_cpu_stage,
    )

    _check_outputs(args, "--write-config", "--json")
    if args.profile and (args.alpha or args.beta):
        raise ValueError("give --profile or --alpha/--beta, not both")
    if args.profile:
        profile = load_profile(args.profile, where=f"--profile {args.profile}")
    elif args.alpha and args.beta:
        profile = Profile(*_batch_time(args), source="--alpha/--beta")
    else:
        raise ValueError("give --profile PATH, or both --alpha and --beta")
    if args.batch_times == "samples" and not args.profile:
        # --alpha/--beta have no measured samples: the search would quietly run on the fit.
        raise ValueError("--batch-times samples draws from a --profile file's measured batch times; give --profile")
    if args.batch_times == "samples" and not profile.samples:
        # As with --alpha/--beta: the search would quietly run on the fit (inputs.batch_times "fit").
        raise ValueError(
            f"--batch-times samples: --profile {args.profile} holds no measured batch times (every "
            "batches[i].samples_s is missing or empty)"
        )

    def ints(spec: str, what: str) -> list[int]:
        try:
            return [read_int(x) for x in spec.split(",") if x.strip(SPACES)]
        except ValueError:
            raise ValueError(
                f"{what} {quoted_name(spec)}: expected whole numbers like 4,8,16{underscore_note(spec)}"
            ) from None

    sizes = ints(args.max_batch_sizes, "--max-batch-sizes")
    delays = [
        _named("--delays", parse_duration, _with_unit("--delays", x.strip(SPACES)))
        for x in args.delays.split(",")
        if x.strip(SPACES)
    ]
    if not all(math.isfinite(d) for d in delays):  # else refused only after simulating the others
        raise ValueError(f"--delays: expected finite durations; got {quoted_name(args.delays)}")
    default = None
    if args.default != "none":
        n, comma, d = args.default.partition(",")
        if not comma:
            raise ValueError(
                f"--default {quoted_name(args.default)}: expected MAX_BATCH_SIZE,DELAY like 32,5ms, or none"
            )
        try:
            default = (ints(n, "--default")[0], parse_duration(d.strip(SPACES)))
        except (ValueError, IndexError):
            default = None
        if default is not None:
            try:
                _with_unit("DELAY", d)  # a queue delay, as --delays
            except ValueError:  # refused with the whole setting: "--default '5'" hid the size it came with
                n, value = n.strip(SPACES), float(d)
                raise ValueError(
                    f"--default {quoted_name(args.default)}: give DELAY a unit, e.g. {n},{value:g}ms or "
                    f"{n},{value / 1e3:g}s "
                    "(a bare number would be seconds)"
                ) from None
        if default is None or default[0] < 1 or not math.isfinite(default[1]):
            raise ValueError(
                f"--default {quoted_name(args.default)}: expected MAX_BATCH_SIZE ≥ 1 and a finite DELAY ≥ 0, like "
                "32,5ms, or none"
            )
    if (refusal := integer_refusal("--instances", args.instances, 1)) is not None:
        raise ValueError(refusal)
    # The reason is for the top of the range alone: said of -1 too, it read as why -1 was refused.
    past = ""
    if args.iterations > MAX_ITERATIONS:
        past = f" (past {MAX_ITERATIONS} the bisection's interval holds no double between its ends)"
    if (refusal := integer_refusal("--iterations", args.iterations, 0, past, most=MAX_ITERATIONS)) is not None:
        raise ValueError(refusal)
    # Else refused at the first simulated step, in the simulator's words ("seed: expected").
    if (refusal := integer_refusal("--seed", args.seed, 0)) is not None:
        raise ValueError(refusal)
    if not 0 <= args.tie < 1:  # NaN too
        raise ValueError(f"--tie: expected a number in [0, 1); got {args.tie:g}")
    if args.overhead_samples and args.overhead is not None:
        # The samples would replace the constant, not add to it: the run would not be what was asked.
        raise ValueError("--overhead with --overhead-samples: give one (the constant, or the measured samples)")
    if args.overhead_samples:
        overhead = load_overhead(args.overhead_samples)
    else:
        constant = 0.0 if args.overhead is None else _latency(args, "--overhead")
        overhead = (constant,) if constant > 0 else ()
    if args.per_request_cpu is not None:
        _with_unit("--per-request-cpu", args.per_request_cpu)
    cpu = tune_cpu_stage(args.cpu_calibration, args.per_request_cpu, args.cores)
    if args.batch_times == "samples" and cpu is not None and cpu.batch_alpha_s is not None:
        # The calibration's batch time replaces the profile's, fit and samples alike (docs/tune.md):
        # the search would quietly run without the samples asked for.
        raise ValueError(
            f"--batch-times samples with --cpu-calibration {args.cpu_calibration}: the calibration carries the "
            "server's own batch time, which replaces the profile's measured samples; give one"
        )
    overhead_at = None
    if args.cpu_calibration and args.overhead is None and not args.overhead_samples:
        # A calibration taken with the server-timing trailer measured the overhead at each of its
        # loads: without an overhead given here, each simulated rate draws its own.
        where = f"--cpu-calibration {args.cpu_calibration}"
        overhead_at = overhead_by_rate(read_json(args.cpu_calibration, "--cpu-calibration"), cpu, where)
    _arrivals("--arrival", args.arrival, 1.0, 1.0)  # a bad spec fails here, before any simulation
    search = SearchConfig(
        slo_p99_ms=1e3 * _latency(args, "--slo-p99", positive=True),
        arrival=args.arrival,
        duration_s=_seconds(args, "--sim-duration", positive=True),
        warmup_s=_seconds(args, "--sim-warmup"),
        iterations=args.iterations,
        seed=args.seed,
        tie=args.tie,
    )
    sampled = args.batch_times == "samples"
    # tune() checks the grid, then (as `wok simulate` does, _check_arrival) the search's busiest step
    # against the arrival cap, before any simulating: its refusal in these options' names.
    names = SearchNames(
        arrival="--arrival",
        length="--sim-warmup + --sim-duration",
        shorter="--sim-warmup + --sim-duration",
        grid="--max-batch-sizes, --delays and --default",
    )
    result = tune(
        profile,
        search,
        sizes,
        delays,
        instances=args.instances,
        overhead_s=overhead,
        sampled=sampled,
        default=default,
        progress=lambda msg: print(f"wok tune: {msg}", file=sys.stderr, flush=True),
        cpu=cpu,
        overhead_at=overhead_at,
        names=names,
        allow_extrapolated=args.allow_extrapolated,
    )
    limit = profile.model_max_batch_size
    past = sorted({n for n in sizes if limit is not None and n > limit})
    if past:
        result["warnings"].insert(0, past_model_max("--max-batch-sizes", past, limit, f"--profile {args.profile}"))
    if default is not None and limit is not None and default[0] > limit and default[0] not in past:
        result["warnings"].insert(
            0, past_model_max("--default's max_batch_size", [default[0]], limit, f"--profile {args.profile}")
        )
    config = args.write_config if result["config_toml"] is not None else None
    outputs = [
        ("--json", args.json, report.write_json),
        ("--write-config", config, lambda r, path: path.write_text(r["config_toml"])),
    ]
    if _show_after(lambda: _write_or_keep("wok tune", result, outputs), lambda: print_table(result)):
        return 1
    if args.write_config and result["config_toml"] is None:
        print("wok tune: no setting meets the SLO; no config written", file=sys.stderr)
        return 1
    return 0 if result["chosen"] is not None else 1


# The `wok` subcommands besides `serve`, each a function that adds its parser to argparse's
# subparsers and sets `run`; wok.__main__ registers them in this order.
COMMANDS = [add_parser, add_simulate_parser, add_profile_parser, add_plan_parser, add_tune_parser]
