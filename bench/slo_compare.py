"""The `slo` batching policy against the best fixed window `wok tune` finds, on a burst, in one run.

    .venv/bin/python bench/slo_compare.py --slo 50ms --rows 16 --base-qps 150 --duration 20s \\
        --json docs/results/slo-compare.json --plot docs/images/slo-compare.png

1. Profile: `wok profile mlp` on a generated model repository (the demo mlp's network,
   `wok.models.mlp:MLP`, 256→1024→1024→256), batch sizes in whole requests of `--rows` samples.
2. Tune: `wok.bench.tune.tune` on that profile, per request (a request of r rows is one unit:
   T(k requests) = α + β·r·k), with the same burst arrival process and the SLO: the best fixed
   (max_batch_size, max_queue_delay) it finds.
3. Serve and load, `--reps` times, alternating which goes first: one fresh `wok serve` with the
   tuned fixed setting, one with `policy = "slo"` (the same max_batch_size, `slo_ms` = the SLO,
   the profile as its seed), each offered the same schedule (`wok.bench.runner.Ramp`, one step
   of `--arrival` at `--base-qps`, same seed).
4. Per run, over the measured window (after `--warmup`): goodput = requests answered OK within
   the SLO (latency from the intended send time, as the bench measures) per second; P99 over
   the requests the server accepted (all but RESOURCE_EXHAUSTED refusals, failures included at
   the time they failed) and over the OK ones; refusals and deadline drops; the server's flush
   reasons and rejections (scraped); a per-second timeline.

Output: a table, `--json` (schema `wok.slocompare/1`, docs/batching-policy.md), `--plot`.
Every server started here is stopped on exit.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as `wok serve` does, before torch loads

import numpy as np

from wok.bench.outputs import output_problem, refuse_unwritable, write_final, write_outputs
from wok.bench.payloads import integer_refusal
from wok.bench.report import read_json_object
from wok.errors import shown_entry

SCHEMA = "wok.slocompare/1"
STEP_KEYS = ("offered_qps", "achieved_qps", "dispatch_lag_ms")
SERVER_BOUNDS_S = (0.025, 0.05, 0.1)
ROOT = Path(__file__).resolve().parent.parent


def say(msg: str) -> None:
    print(f"[slo-compare {datetime.now(timezone.utc).strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def write_repository(folder: Path, max_batch_size: int, delay_ms: float, batching: str) -> Path:
    """The demo mlp's network (bench/ceiling.py's template at hidden 1024, 2 layers); `batching` goes in
    its [dynamic_batching] table after max_queue_delay_ms."""
    from wok.bench.ceiling import CONFIG

    (folder / "mlp").mkdir(parents=True, exist_ok=True)
    text = CONFIG.format(
        max_batch_size=max_batch_size, hidden=1024, layers=2, delay_ms=f"{delay_ms:g}", instances=batching
    )
    (folder / "mlp" / "config.toml").write_text(text)
    return folder


FIXED = 'policy = "fixed"\n'


def slo_batching(slo_ms: float, quantile: float, profile_name: str | None) -> str:
    text = f'policy = "slo"\nslo_ms = {slo_ms:g}\nslo_quantile = {quantile:g}\n'
    return text + (f'slo_profile = "{profile_name}"\n' if profile_name else "")


# --------------------------------------------------------------------------- 1. profile, 2. tune


def run_profile(tmp: Path, args) -> dict:
    sizes = [args.rows * k for k in args.request_sizes]
    repo = write_repository(tmp / "profile-repo", max(sizes), 0, FIXED)
    out = tmp / "profile.json"
    cmd = [sys.executable, "-m", "wok", "profile", "mlp", "--model-repository", str(repo)]
    cmd += ["--batch-sizes", ",".join(str(n) for n in sizes), "--repeats", str(args.profile_repeats)]
    cmd += ["--json", str(out)]
    if args.torch_threads:
        cmd += ["--torch-threads", str(args.torch_threads)]
    say(f"profiling mlp at {sizes} samples per batch ({args.profile_repeats} repeats)")
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


def tune_fixed(profile_doc: dict, args) -> dict:
    """`wok tune` per request: a unit of `rows` samples, T(k) = α + β·rows·k."""
    from wok.bench.tune import Profile, SearchConfig, profile_from_document, tune

    p = profile_from_document(profile_doc, "wok profile (slo_compare)")
    per_request = Profile(p.alpha_s, p.beta_s * args.rows, p.r2, (), f"{p.source}, per request of {args.rows} rows")
    search = SearchConfig(
        slo_p99_ms=args.slo_ms,
        arrival=args.arrival,
        # The measured window, as the run's step_duration_s: the warm-up is added to it. Given
        # warm-up + window, the simulated step was a warm-up longer than the run's, and a burst's
        # t0 and sigma (fractions of the step) moved and widened with it.
        duration_s=args.duration,
        warmup_s=args.warmup,
        seed=args.seed,
    )
    say(f"tuning the fixed window per request: sizes {args.request_sizes} × delays {args.delays_ms} ms")
    return tune(per_request, search, args.request_sizes, [1e-3 * d for d in args.delays_ms], default=None)


# --------------------------------------------------------------------------- 3. serve and load


def start_server(label: str, repo: Path, log_dir: Path, torch_threads: int | None):
    from wok.bench.compare import Peer, Server

    def launch(peer, ports):
        argv = [sys.executable, "-m", "wok", "serve", "--model-repository", str(repo), "--log-level", "WARNING"]
        argv += ["--port", str(ports["grpc"]), "--metrics-port", str(ports["metrics"])]
        if torch_threads:
            argv += ["--torch-threads", str(torch_threads)]
        return argv, {}, ROOT

    server = Server(Peer(f"slo-compare-{label}", [], launch, ready_timeout_s=120.0), log_dir)
    server.start()
    return server


def server_counters(url: str) -> dict:
    from wok.bench.scrape import scrape

    snap = scrape(url, timeout=10.0)
    if snap is None:
        return {}
    out = {}
    for reason in ("size", "delay", "drain", "deadline", "idle"):
        out[f"flush_{reason}"] = snap.get("wok_batch_flushes_total", model="mlp", reason=reason) or 0.0
    for reason in ("queue_full", "deadline", "deadline_unmeetable"):
        out[f"rejected_{reason}"] = snap.get("wok_rejected_requests_total", model="mlp", reason=reason) or 0.0
    out["batches"] = snap.get("wok_batch_size_count", model="mlp") or 0.0
    out["samples"] = snap.get("wok_batch_size_sum", model="mlp") or 0.0
    # The server's own view of successful requests (arrival at its handler to encoded response):
    # how many, and how many within each bucket bound up to 100 ms.
    out["server_ok"] = snap.get("wok_request_duration_seconds_count", model="mlp") or 0.0
    for le, count in snap.buckets("wok_request_duration_seconds", model="mlp"):
        if le in SERVER_BOUNDS_S:
            out[f"server_ok_within_{1e3 * le:g}ms"] = count
    return out


def run_load(server, args) -> tuple[dict, tuple, np.ndarray]:
    """One step of the burst; (ramp result, its timeline entry, each request's actual send offset)."""
    from wok.bench.runner import Ramp, RampConfig

    class SendTimes(Ramp):
        # The step's timeline has intended send, completion, latency and code per request; keep
        # the actual send times too (same order: worker by worker), to tell the generator's own
        # lateness from the server's time.
        def _collect(self, workers, start):
            outcomes = super()._collect(workers, start)
            self.sent = np.concatenate([o.sent for o in outcomes])
            return outcomes

    cfg = RampConfig(
        target=server.target,
        models=[("mlp", 1.0)],
        steps=[args.base_qps],
        step_duration_s=args.duration,
        warmup_s=args.warmup,
        arrival=args.arrival,
        rows=args.rows,
        slo_p99_ms=args.slo_ms,
        workers=args.workers,
        timeout_s=args.client_timeout,
        seed=args.seed,
        stop_factor=1e9,
    )
    ramp = SendTimes(cfg, progress=say)
    result = ramp.run()
    return result, ramp.timeline[-1], ramp.sent


def summarize(timeline: tuple, sent: np.ndarray, args) -> dict:
    """Goodput, P99s and outcomes over the measured window; a per-second timeline of the whole step."""
    import grpc

    from wok.bench.analysis import latency_summary
    from wok.bench.workers import OK

    # A ramp of one step: its clock starts at the step's t = 0, so these are offsets into the step.
    rel, done, lat, codes = timeline
    from_send = done - sent
    inside = rel >= args.warmup
    ok = codes == OK
    refused = codes == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
    expired = codes == grpc.StatusCode.DEADLINE_EXCEEDED.value[0]
    slo_s = args.slo_ms / 1e3
    good = ok & (lat <= slo_s)
    w = inside
    accepted = w & ~refused & np.isfinite(lat)
    out = {
        "requests": int(w.sum()),
        "ok": int((w & ok).sum()),
        "good": int((w & good).sum()),
        "goodput_qps": float((w & good).sum()) / args.duration,
        "refused": int((w & refused).sum()),
        "deadline_exceeded": int((w & expired).sum()),
        "other_errors": int((w & ~ok & ~refused & ~expired).sum()),
        "accepted": int(accepted.sum()),
        "accepted_latency_ms": latency_summary(1e3 * lat[accepted]),
        "ok_latency_ms": latency_summary(1e3 * lat[w & ok]),
        # From the actual send: without the generator's lateness (dispatch lag) on a busy machine.
        "accepted_from_send_ms": latency_summary(1e3 * from_send[accepted]),
        "accepted_within_slo": float((accepted & good).sum()) / max(1, int(accepted.sum())),
    }
    sec = np.floor(rel).astype(int)
    n = int(sec.max()) + 1 if len(sec) else 0
    out["timeline"] = {
        "t_s": list(range(n)),
        "offered": np.bincount(sec, minlength=n).tolist(),
        "good": np.bincount(sec[good], minlength=n).tolist(),
        "refused": np.bincount(sec[refused], minlength=n).tolist(),
        "late_or_failed": np.bincount(sec[~good & ~refused], minlength=n).tolist(),
    }
    return out


# --------------------------------------------------------------------------- output


def print_table(doc: dict, file=None) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    console = Console(file=file or sys.stdout, color_system=None, highlight=False, markup=False, width=200)
    cfg = doc["config"]
    fx = doc["fixed_setting"]
    console.print(
        f"mlp, {cfg['rows']} rows per request, {cfg['arrival']} at {cfg['base_qps']:g} req/s base, SLO "
        f"{cfg['slo_ms']:g} ms; fixed (wok tune): max_batch_size {fx['max_batch_size']}, delay "
        f"{fx['max_queue_delay_ms']:g} ms; load average {doc['host']['loadavg_at_start'][0]:.2f} → "
        f"{doc['host']['loadavg_at_end'][0]:.2f}"
    )
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    heads = ("rep", "policy", "offered", "goodput/s", "ok", "refused", "deadline", "P99 accepted ms",
             "from send", "P99 ok ms", "accepted in SLO", "flushes (server)")  # fmt: skip
    for h in heads:
        table.add_column(h, justify="right", no_wrap=True)
    for r in doc["runs"]:
        s = r["summary"]
        flushes = ", ".join(
            f"{k[6:]} {v:.0f}" for k, v in r["server"].items() if k.startswith("flush_") and v
        )  # fmt: skip
        table.add_row(
            str(r["rep"]),
            r["policy"],
            str(s["requests"]),
            f"{s['goodput_qps']:.1f}",
            str(s["ok"]),
            str(s["refused"]),
            str(s["deadline_exceeded"]),
            _ms(s["accepted_latency_ms"]["p99"]),
            _ms(s["accepted_from_send_ms"]["p99"]),
            _ms(s["ok_latency_ms"]["p99"]),
            f"{100 * s['accepted_within_slo']:.1f}%",
            flushes,
        )
    console.print(table)
    v = doc["verdict"]
    console.print(
        f"slo goodput > fixed in every rep: {v['slo_goodput_higher_every_rep']}; slo P99 over accepted ≤ SLO in "
        f"every rep: {v['slo_p99_accepted_within_slo_every_rep']}"
    )


def _ms(x) -> str:
    return "-" if x is None or not np.isfinite(x) else f"{x:.1f}"


def plot(doc: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from wok.bench import report

    reps = sorted({r["rep"] for r in doc["runs"]})
    fig, axes = plt.subplots(len(reps), 1, figsize=(11, 3.6 * len(reps)), squeeze=False)
    for ax, rep in zip(axes[:, 0], reps):
        for r in (r for r in doc["runs"] if r["rep"] == rep):
            tl = r["summary"]["timeline"]
            slo = r["policy"] == "slo"
            ax.plot(tl["t_s"], tl["good"], "-" if slo else "--", color="C1" if slo else "C0",
                    label=f"{r['policy']}: within SLO per s")  # fmt: skip
            if slo:
                ax.plot(tl["t_s"], tl["refused"], ":", color="C2", label="slo: refused per s")
            offered = tl["offered"]
        ax.plot(tl["t_s"], offered, color="grey", lw=0.8, label="offered per s")
        ax.axvline(doc["config"]["warmup_s"], color="k", lw=0.6, ls=":")
        ax.set_title(f"rep {rep}")
        ax.set_xlabel("s into the step")
        ax.set_ylabel("requests")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    cfg = doc["config"]
    fig.suptitle(
        f"mlp, {cfg['rows']} rows/request, {cfg['arrival']} at {cfg['base_qps']:g}/s, SLO {cfg['slo_ms']:g} ms"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110, format=report.figure_format(path))
    plt.close(fig)


# --------------------------------------------------------------------------- main


def build_parser() -> argparse.ArgumentParser:
    """This script's parser (tests/deploy/test_doc_commands.py parses the docs' command lines with it)."""
    from wok.cliargs import ArgumentParser  # argparse's, its refusals in wok's words

    p = ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--slo", default="50ms", help="the latency objective (client-side, from the intended send)")
    p.add_argument("--server-slo", help="slo_ms given to the slo policy (default: --slo)")
    p.add_argument("--slo-quantile", type=float, default=0.95, help="slo_quantile of the slo policy")
    p.add_argument("--base-qps", type=float, default=150.0, help="the burst's base rate, requests/s")
    p.add_argument("--arrival", default="burst:amplitude=5x,t0=50%,sigma=10%")
    p.add_argument("--rows", type=int, default=16, help="samples per request")
    p.add_argument("--duration", default="20s", help="measured window")
    p.add_argument("--warmup", default="2s")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--client-timeout", default="30s", help="each request's gRPC deadline (the bench's default)")
    p.add_argument("--request-sizes", default="1,2,4,8", help="max batch sizes tuned over, in requests")
    p.add_argument("--delays", default="0ms,1ms,2ms,5ms,10ms")
    p.add_argument("--fixed", help="skip the tuning: MAX_BATCH_SIZE_IN_REQUESTS,DELAY")
    p.add_argument("--profile", type=Path, help="a wok.profile/1 document of this network (skip profiling)")
    p.add_argument("--profile-repeats", type=int, default=50)
    p.add_argument("--torch-threads", type=int)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path)
    p.add_argument("--plot", type=Path)
    p.add_argument("--plots", dest="plot", type=Path, help=argparse.SUPPRESS)  # the `wok` commands' old spelling
    p.add_argument("--replot", type=Path, help="draw --plot from a finished run's JSON and exit")
    p.add_argument("--log-dir", type=Path, default=Path(tempfile.gettempdir()) / "wok-slo-compare")
    return p


def parse_args(argv=None) -> argparse.Namespace:
    from wok.bench.arrivals import parse_duration
    from wok.errors import quoted_name
    from wok.numerals import digits_note, read_int

    p = build_parser()
    args = p.parse_args(argv)
    # --log-dir: the servers' logs, first written after the profile and the tuning.
    refuse_unwritable(p, args, "--json", "--plot", "--log-dir")
    # int()'s own refusal named neither the option nor what it takes ("invalid literal for int()").
    # A size of 0 or below started servers before failing (or served max_batch_size 0): refused here.
    try:
        sizes = [read_int(x) for x in args.request_sizes.split(",")]
        if min(sizes) < 1:
            raise ValueError
        args.request_sizes = sizes
    except ValueError:
        p.error(
            f"--request-sizes: expected whole numbers >= 1 like 1,2,4,8; got {quoted_name(args.request_sizes)}"
            f"{digits_note(args.request_sizes)}"
        )
    if args.fixed:
        fields = args.fixed.split(",")
        try:
            if len(fields) != 2 or (size := read_int(fields[0])) < 1:
                raise ValueError
        except ValueError:
            p.error(
                "--fixed: expected MAX_BATCH_SIZE_IN_REQUESTS,DELAY, a whole number >= 1 and a duration, like "
                f"8,5ms; got {quoted_name(args.fixed)}{digits_note(fields[0])}"
            )
        args.fixed = (size, fields[1])

    def duration(option: str, text: str) -> float:
        # Each refusal names its option: "invalid duration 'xs'" alone left the user to guess which of six.
        try:
            return parse_duration(text)
        except ValueError as exc:
            p.error(f"{option}: {exc}")

    args.slo_ms = 1e3 * duration("--slo", args.slo)
    args.server_slo_ms = 1e3 * duration("--server-slo", args.server_slo) if args.server_slo else args.slo_ms
    args.duration = duration("--duration", args.duration)
    args.warmup = duration("--warmup", args.warmup)
    args.client_timeout = duration("--client-timeout", args.client_timeout)
    args.delays_ms = [1e3 * duration("--delays", x) for x in args.delays.split(",")]
    if args.fixed:
        args.fixed = (args.fixed[0], 1e3 * duration("--fixed", args.fixed[1]))
    for option, value in (("--rows", args.rows), ("--reps", args.reps)):
        if (refusal := integer_refusal(option, value, 1)) is not None:
            p.error(refusal)
    if not (math.isfinite(args.base_qps) and args.base_qps > 0):  # nan > 0 and nan <= 0 are both False
        p.error(f"--base-qps: expected a finite number > 0; got {args.base_qps:g}")
    # The input files, read here: a missing or wrong one found after the profile and tuning costs them.
    if args.replot:
        try:
            args.replot_doc = read_run(args.replot)
        except ValueError as exc:
            p.error(f"--replot {exc}")
        if args.plot is None:  # drawn next to the run; --plot, when given, was checked above
            args.plot = args.replot.with_suffix(".png")
            try:
                why = output_problem(args.plot, folder=False)
            except OSError as exc:
                why = exc.strerror or str(exc)
            if not why and _same_file(args.plot, args.replot):  # a run saved as *.png: its only copy
                why = "is the run itself, which drawing would overwrite"
            if why:
                p.error(f"--replot {args.replot}: plot {args.plot}: {why}; give --plot to draw it elsewhere")
        elif _same_file(args.plot, args.replot):
            p.error(f"--plot {args.plot}: is --replot's run, which drawing would overwrite; expected another path")
    elif args.profile:
        from wok.bench.tune import profile_from_document
        from wok.policy import read_profile_fit

        try:
            read_profile_fit(args.profile)  # as the slo policy's server reads it: numeric fit.alpha_s, fit.beta_s
            args.profile_doc = json.loads(args.profile.read_text())
            profile_from_document(args.profile_doc, f"profile {args.profile}")  # as the tuning reads it
        except (OSError, ValueError) as exc:
            p.error(f"--profile: {exc}")
    return args


def _same_file(a: Path, b: Path) -> bool:
    """Whether `a` and `b` name one existing file (also through a link, or another spelling)."""
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def read_run(path: Path) -> dict:
    """A finished run's document (`wok.slocompare/1`), for --replot; a ValueError says why not, after the path."""
    doc = read_json_object(path)
    if doc.get("schema") != SCHEMA:
        raise ValueError(f"{path}: expected schema {SCHEMA!r}; got {shown_entry(doc, 'schema')}")
    if not isinstance(doc.get("runs"), list) or not isinstance(doc.get("config"), dict):
        raise ValueError(f"{path}: not a whole run; expected its runs and config")
    return doc


def main(argv=None) -> int:
    from wok.bench import report
    from wok.bench.compare import stop_all

    args = parse_args(argv)
    if args.replot:
        # A drawing that fails is the option's error, as at the end of a run; the run itself is
        # kept already, in --replot's file, so nothing needs a temporary copy.
        failed = write_outputs(args.replot_doc, [("--plot", args.plot, plot)])
        if failed:
            say(f"{failed[0]}; the run is unchanged in {args.replot}")
            return 1
        return 0
    started = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    load0 = os.getloadavg()
    t_start = time.monotonic()
    runs = []
    tmp = Path(tempfile.mkdtemp(prefix="wok-slo-compare-"))
    try:
        profile_doc = args.profile_doc if args.profile else run_profile(tmp, args)
        (tmp / "profile.json").write_text(json.dumps(profile_doc))
        fit = profile_doc["fit"]
        say(f"α = {1e3 * fit['alpha_s']:.3f} ms, β = {1e3 * fit['beta_s']:.4f} ms/sample")
        tuned = None
        if args.fixed:
            k, delay_ms = args.fixed
        else:
            tuned = tune_fixed(profile_doc, args)
            if tuned["chosen"] is None:
                say("wok tune found no fixed setting meeting the SLO in simulation")
                return 1
            k, delay_ms = tuned["chosen"]["max_batch_size"], tuned["chosen"]["max_queue_delay_ms"]
        mbs = k * args.rows
        say(f"fixed: max_batch_size {mbs} samples ({k} requests), delay {delay_ms:g} ms; slo: same maximum")
        repos = {
            "fixed": write_repository(tmp / "fixed", mbs, delay_ms, FIXED),
            "slo": write_repository(
                tmp / "slo", mbs, 0, slo_batching(args.server_slo_ms, args.slo_quantile, "profile.json")
            ),
        }
        shutil.copy(tmp / "profile.json", repos["slo"] / "mlp" / "profile.json")
        for rep in range(1, args.reps + 1):
            order = ["fixed", "slo"] if rep % 2 else ["slo", "fixed"]
            for policy in order:
                say(f"rep {rep}: {policy}")
                server = start_server(f"{policy}-{rep}", repos[policy], args.log_dir, args.torch_threads)
                try:
                    url = f"http://127.0.0.1:{server.ports['metrics']}/metrics"
                    before = server_counters(url)
                    result, timeline, sent = run_load(server, args)
                    after = server_counters(url)
                finally:
                    server.stop()
                summary = summarize(timeline, sent, args)
                runs.append(
                    {
                        "rep": rep,
                        "policy": policy,
                        "summary": summary,
                        "server": {k2: after.get(k2, 0.0) - before.get(k2, 0.0) for k2 in after},
                        "step": {key: result["steps"][0].get(key) for key in STEP_KEYS},
                    }
                )
                say(
                    f"rep {rep} {policy}: goodput {summary['goodput_qps']:.1f}/s, refused {summary['refused']}, "
                    f"P99 accepted {_ms(summary['accepted_latency_ms']['p99'])} ms"
                )
    finally:
        stop_all()
        shutil.rmtree(tmp, ignore_errors=True)

    by_rep: dict[int, dict[str, dict]] = {}
    for r in runs:
        by_rep.setdefault(r["rep"], {})[r["policy"]] = r["summary"]
    verdict = {
        "goodput_qps": {p: [by_rep[rep][p]["goodput_qps"] for rep in sorted(by_rep)] for p in ("fixed", "slo")},
        "p99_accepted_ms": {
            p: [by_rep[rep][p]["accepted_latency_ms"]["p99"] for rep in sorted(by_rep)] for p in ("fixed", "slo")
        },
        "slo_goodput_higher_every_rep": all(
            v["slo"]["goodput_qps"] > v["fixed"]["goodput_qps"] for v in by_rep.values()
        ),
        "slo_p99_accepted_within_slo_every_rep": all(
            v["slo"]["accepted_latency_ms"]["p99"] <= args.slo_ms for v in by_rep.values()
        ),
    }
    doc = {
        "schema": SCHEMA,
        "created": started,
        "host": {"cpus": os.cpu_count(), "loadavg_at_start": list(load0), "loadavg_at_end": list(os.getloadavg())},
        "config": {
            "slo_ms": args.slo_ms,
            "server_slo_ms": args.server_slo_ms,
            "slo_quantile": args.slo_quantile,
            "base_qps": args.base_qps,
            "arrival": args.arrival,
            "rows": args.rows,
            "duration_s": args.duration,
            "warmup_s": args.warmup,
            "reps": args.reps,
            "workers": args.workers,
            "client_timeout_s": args.client_timeout,
            "torch_threads": args.torch_threads,
            "seed": args.seed,
        },
        "profile_fit": fit,
        "tune": tuned,
        "fixed_setting": {"max_batch_size": mbs, "max_batch_requests": k, "max_queue_delay_ms": delay_ms},
        "runs": runs,
        "verdict": verdict,
        "wall_s": time.monotonic() - t_start,
    }
    print_table(doc)
    failed = write_final(doc, [("--json", args.json, report.write_json), ("--plot", args.plot, plot)])
    if failed:
        say(failed)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
