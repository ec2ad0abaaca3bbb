"""`wok tune` against the real server, in one run: the tuned setting's measured max QPS
under the SLO next to the default's, and the simulator's P99 next to the measured P99.

    .venv/bin/python bench/tune_check.py --slo-p99 50ms --json docs/results/tune-check.json \\
        --plot docs/images/tune-check.png
    .venv/bin/python bench/tune_check.py --markdown docs/results/tune-check.json   # the tables of docs/tune.md

1. Profile: batch times of the demo `mlp` per batch size, measured in this process through
   wok's own executor (`wok.executor.Instance`, the path a server's batch takes), written as
   a `wok.profile/1` document; or `--profile PATH` from `wok profile`.
2. Overhead: `wok serve` with `max_queue_delay_ms = 0` under a light load (one short step,
   default 100 QPS): there nearly every request is a batch of one that finds the instance
   free, so its latency is the overhead (client, gRPC, decode, encode) plus one batch of
   one. Overhead sample = latency − median measured T(1) (nearest-rank), floored at 0 (`wok.overhead/1`).
   Before it, the CPU stage (`wok.cpustage/1`): `wok serve` with the default setting, a
   metered ramp over a few loads (`--cpu-steps`), the server's CPU per thread group from
   /proc and its stage means from /metrics at each, fitted against the rate (`fit_cpu_stage`):
   the event loop's CPU per request, split before and after the batcher by the growth of the
   server's `respond` stage with the batch size; the model worker's CPU per batch against the
   batch size (the server's own batch time); everything else (gRPC's threads, the load
   generator) as a background demand; the machine's cores. The overhead is then what the
   loop and the batch leave of a calibration latency, not the profile's T(1) alone.
3. Tune: `wok.bench.tune.tune` on the profile, the CPU stage and the overhead samples, choosing as
   `wok tune` does: among the settings on measured batch times first, with `--allow-extrapolated`
   as `wok tune`'s (docs/tune.md, "Measured first"), so that the setting validated is the one the
   user would get.
4. Validate: `wok serve` with the default setting and with the tuned one, one fresh server
   per ramp, `--reps` times each, in alternating order (default first in odd repetitions,
   tuned first in even ones), the same ramp for both (`wok.bench.runner.Ramp`, in-process).
5. Predict: each measured ramp's steps simulated with that ramp's setting, the same arrival
   process, step length and warm-up, with the CPU stage (the prediction) and without it (the
   batcher on the profile's fit plus overheads, as before the stage existed); per step, the
   predicted P99 against the measured one, "below the knee" meaning offered < the measured
   ramp's knee (every step if it has none). `--device-like` runs leave the CPU stage out (a
   sleeping batch uses no core).

A validation ramp cut short by an error (it raised after its first step, `interrupted` in its
result; or its server exited during it, which fails the later steps as overload would) is kept
in `runs` with `error` ("interrupted: …", as bench/compare.py records such a run; null for a
whole ramp) and left out of the verdict (`verdict`): `tuned_at_least_default` is then null
unless a whole repetition shows tuned < default, and the medians are over whole ramps. A ramp
cut by Ctrl-C stops the run there, nothing written (KeyboardInterrupt: status 130). A validation
ramp that fails before its first step is kept so too (`error` "failed before its first step: …",
`measured` null). A validation ramp whose predictions fail (the simulator refusing its steps) is
kept so too, with what it measured (`error` "predicting it failed: …", `comparison` empty). A failure
in the profile, a calibration or the search, and a calibration ramp cut short (not used: its steps
are not the calibration asked for), stop the run with a one-line `stopped at …`: what was measured
before it is written to --json, with the top-level `error`.

A search the simulator cannot hold (its busiest step, at the grid's highest ceiling, expecting more
arrivals than `wok.bench.simulate.MAX_ARRIVALS_PER_STEP`: --arrival, --sim-duration, --max-batch-sizes,
--delays, --default) is refused in those options' names, exit 2, as soon as the ceilings are known
(`check_search`): with --profile and no CPU stage (--no-cpu-stage, --device-like), with the options,
before anything is measured; with a measured profile and no CPU stage, right after the profile,
before the first server; with the CPU stage, whose server batch time and bound replace the profile's
fit in the search, right after the CPU calibration, before the overhead calibration. (No bound holds
for any profile: a faster batch raises every ceiling without limit.) Once something was measured,
it is written to --json as for a stopped run (`error` "stopped at the search's check: …").

Exit status: 0 when every ramp was whole and every output written; 1 when a validation ramp
was cut short or failed before its first step (the outputs are written all the same), when the
run stopped so (--json written), when an output failed to be written (kept in a temporary file,
named on stderr), or when no setting meets the SLO in simulation (without --tuned); 2 for a bad
option, before anything is measured, or a search the simulator cannot hold (above).

The output (schema `wok.tunecheck/3`) is described in docs/tune.md. Every server this
script starts is stopped on exit (`wok.bench.compare.stop_all`). The servers run the same
`wok` this script imports (`python -m wok serve`, environment inherited), so a run from a
clean snapshot (`PYTHONPATH=SNAPSHOT python -m wok.bench.tune_check`) measures that snapshot.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

# As `wok serve` does, before torch is imported: the profile must see the server's threads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np

from wok.bench.analysis import latency_summary
from wok.bench.outputs import WriteFailed, refuse_unwritable, replacing, write_final, writing
from wok.bench.payloads import integer_refusal
from wok.bench.report import read_json_object
from wok.bench.tune import SearchTooLarge  # the search's refusal (`check_search`), the library's own
from wok.errors import shown_entry
from wok.numerals import digits_note, read_int

# /1: before the CPU stage (`predicted_*` was the batcher-only prediction); /2: before cut ramps were left
# out of the verdict (`tuned_at_least_default` and the medians were never null, runs had no `error`).
SCHEMA = "wok.tunecheck/3"
READ_SCHEMAS = ("wok.tunecheck/1", "wok.tunecheck/2", SCHEMA)
DEFAULT_STEPS = "250,500,1000,1500,2000,2500,3000,3500,4000,5000"
TOLERANCE = 0.20
# Arguments left out of a run's `config`: the outputs, and --profile's document (kept whole as `profile`).
NOT_CONFIG = (
    "json", "plot", "save_profile", "save_overhead", "save_cpu", "log_dir", "profile_doc", "profile_fit", "processes",
)  # fmt: skip
# A step during which processes other than the server and the load generator used more than
# this many cores (of the machine's) measured the machine, not the server (as in bench/compare.py).
QUIET_CORES = 0.25
# batch_noise_by_rate's `basis`, in words.
BATCH_SPREAD = {
    "batches": "per batch, each batch counted once (the calibration's compute_batch_histogram)",
    "requests": "per request, a batch of n counted n times (the calibration has no batch sizes: a server "
    "whose server-timing trailer does not carry them)",
}


def say(msg: str) -> None:
    print(f"[tune-check {datetime.now(timezone.utc).strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- 1. profile


def measure_profile(
    sizes: list[int], reps: int, warmup: int = 10, threads: int | None = None, device_like: tuple | None = None
) -> dict:
    """Batch times through wok's executor (worker thread start to outputs split): the demo mlp, or
    with `device_like` = (α, β) the sleeping stand-in for a device (`write_device_like`)."""
    import tempfile

    import torch

    from wok.bench.tune import profile_document
    from wok.executor import Executor
    from wok.models import build_demo
    from wok.repository import ModelRepository

    if threads:
        torch.set_num_threads(threads)  # as `wok serve --torch-threads` does
    with tempfile.TemporaryDirectory() as tmp:
        if device_like:
            write_device_like(Path(tmp), *device_like, max(sizes), 0.0)
            servable = ModelRepository.from_directory(Path(tmp)).get(DEVICE_LIKE)
        else:
            servable = build_demo("mlp", max_batch_size=max(sizes))
        executor = Executor(servable, servable.config.instances)
        try:
            executor.warmup()
            inst = executor.instances[0]
            row = {"INPUT0": np.random.default_rng(0).random((1, 256), dtype=np.float32)}
            samples: dict[int, list[float]] = {n: [] for n in sizes}
            # Sizes interleaved round by round, so a slow spell of the machine hits every size alike.
            for r in range(warmup + reps):
                for n in sizes:
                    res = inst.submit([row] * n, [1] * n, 0).result()
                    if r >= warmup:
                        samples[n].append(res.finished - res.started)
        finally:
            executor.shutdown()
    name = servable.name
    return profile_document(samples, source=f"bench/tune_check.py: in-process, wok.executor, {name}", model=name)


# A model whose batch occupies its instance for α + β·n without using the CPU (it sleeps, with
# the GIL released): what a batch on a GPU looks like to the host. On a CPU-only machine it lets
# the batcher, not the host's CPU, be the bottleneck, which is the regime the simulator models.
DEVICE_LIKE = "device_like"
DEVICE_LIKE_PY = """import time

from torch import nn


class DeviceLike(nn.Module):
    def __init__(self, alpha_s: float, beta_s: float) -> None:
        super().__init__()
        self.alpha_s, self.beta_s = alpha_s, beta_s

    def forward(self, x):
        time.sleep(self.alpha_s + self.beta_s * x.shape[0])
        return x + 1.0


def build(alpha_s: float, beta_s: float) -> nn.Module:
    return DeviceLike(alpha_s, beta_s)
"""


def write_device_like(root: Path, alpha_s: float, beta_s: float, max_batch_size: int, delay_ms: float) -> Path:
    """A model repository holding the device-like model with these batching settings."""
    folder = root / DEVICE_LIKE
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.py").write_text(DEVICE_LIKE_PY)
    (folder / "config.toml").write_text(
        'platform = "python"\n'
        'factory = "model:build"\n'
        f"max_batch_size = {max_batch_size}\n\n"
        f"[parameters]\nalpha_s = {alpha_s!r}\nbeta_s = {beta_s!r}\n\n"
        '[[inputs]]\nname = "INPUT0"\ndatatype = "FP32"\ndims = [256]\n\n'
        '[[outputs]]\nname = "OUTPUT0"\ndatatype = "FP32"\ndims = [256]\n\n'
        f"[dynamic_batching]\nmax_queue_delay_ms = {float(delay_ms)!r}\n"
    )
    return root


# --------------------------------------------------------------------------- servers and ramps


def start_server(
    max_batch_size: int,
    delay_ms: float,
    log_dir: Path,
    torch_threads: int | None,
    device_like=None,
    server_timing: bool = False,
):
    from wok.bench.compare import Peer, Server

    model = DEVICE_LIKE if device_like else "mlp"
    repo = log_dir / f"repo-mbs{max_batch_size}-d{delay_ms:g}ms"

    def launch(peer, ports):
        argv = [sys.executable, "-m", "wok", "serve", "--log-level", "WARNING"]
        argv += ["--port", str(ports["grpc"]), "--metrics-port", str(ports["metrics"])]
        if device_like:
            argv += ["--model-repository", str(write_device_like(repo, *device_like, max_batch_size, delay_ms))]
        else:
            argv += ["--models", "mlp", "--demo-option", f"mlp.max_batch_size={max_batch_size}"]
            argv += ["--demo-option", f"mlp.max_queue_delay_ms={delay_ms:g}"]
        if torch_threads:
            argv += ["--torch-threads", str(torch_threads)]
        if server_timing:
            argv += ["--server-timing"]
        # The caller's folder, never the package's own (whose http.py would shadow the standard library's).
        return argv, {}, Path.cwd()

    class ModelServer(Server):
        def wait_ready(self, t0: float) -> None:  # Server's waits for "mlp"
            from wok.clients import Client

            with Client(self.target) as client:
                while time.monotonic() < t0 + self.peer.ready_timeout_s:
                    if self.proc.poll() is not None:
                        raise RuntimeError(f"{self.peer.name} exited with {self.proc.returncode}; see {self.log_path}")
                    try:
                        if client.model_ready(model, timeout=1.0):
                            return
                    except Exception:
                        time.sleep(0.25)
            raise TimeoutError(f"{self.peer.name} not ready; see {self.log_path}")

    server = ModelServer(Peer(f"wok-mbs{max_batch_size}-d{delay_ms:g}ms", [], launch, ready_timeout_s=120.0), log_dir)
    server.model = model
    server.start()
    return server


def ramp_config(server, steps: list[float], args, slo_ms: float, server_timing: bool = False):
    from wok.bench.runner import RampConfig

    return RampConfig(
        target=server.target,
        models=[(server.model, 1.0)],
        steps=steps,
        step_duration_s=args.step_duration,
        warmup_s=args.warmup,
        arrival=args.arrival,
        slo_p99_ms=slo_ms,
        workers=args.workers,
        metrics_url=f"http://127.0.0.1:{server.ports['metrics']}/metrics",
        seed=args.seed,
        stop_factor=args.stop_factor,
        server_timing=server_timing,
    )


def run_ramp(server, steps: list[float], args, slo_ms: float) -> tuple[dict, list[np.ndarray]]:
    """The bench's ramp in-process; also each step's per-request latencies (s, successful, after warm-up)."""
    from wok.bench.runner import Ramp
    from wok.bench.workers import OK

    ramp = Ramp(ramp_config(server, steps, args, slo_ms), progress=say, processes=args.processes)
    result = ramp.run()
    latencies = []
    for intended, _done, lat, codes in ramp.timeline:
        keep = (codes == OK) & (intended >= intended.min() + args.warmup)
        latencies.append(lat[keep])
    return result, latencies


class CalibrationCut(RuntimeError):
    """A calibration ramp cut short: its steps are not the calibration asked for, and are not used."""


def whole_calibration(server, result: dict) -> None:
    """Refuse a calibration ramp cut short, as the validation ramps' cut is read (`main`): by a
    signal, KeyboardInterrupt (the run stops there); by an error after its first step (`interrupted`),
    or by its server exiting during it (which fails the later steps as overload would), CalibrationCut.
    Read before the server is stopped."""
    cut = result.get("interrupted")
    if cut and cut["by_signal"]:
        raise KeyboardInterrupt(cut["reason"])
    if cut:
        raise CalibrationCut(f"its ramp was cut short (interrupted: {cut['reason']}); not used")
    proc = getattr(server, "proc", None)
    if proc is not None and proc.poll() is not None:
        raise CalibrationCut(
            f"its ramp was cut short (interrupted: the server exited with {proc.returncode} during the ramp; "
            f"see {server.log_path}); not used"
        )


def calibrate(args, t1: float) -> dict:
    """Per-request overhead samples (`wok.overhead/1`) from a light step on a server with no queue delay."""
    from wok.bench.tune import overhead_document

    say(f"calibrating the per-request overhead: {args.calibration_qps:g} QPS, max_queue_delay 0 ms")
    # The device-like model calibrates with a batch of no time (α = β = 0): at its real α even a
    # light load would queue behind busy batches. Requests and responses are the same size.
    server = start_server(32, 0.0, args.log_dir, args.torch_threads, (0.0, 0.0) if args.device_like else None)
    try:
        cal_args = argparse.Namespace(**{**vars(args), "step_duration": args.calibration_duration})
        cal_result, cal_lat = run_ramp(server, [args.calibration_qps], cal_args, args.slo_ms)
        whole_calibration(server, cal_result)
    finally:
        server.stop()
    overhead = np.maximum(cal_lat[0] - t1, 0.0)
    doc = overhead_document(
        overhead, f"latency at {args.calibration_qps:g} QPS with max_queue_delay 0 ms minus median T(1) = {t1:.6f} s"
    )
    doc["calibration_step"] = {k: cal_result["steps"][0][k] for k in ("offered_qps", "achieved_qps", "latency_ms")}
    say(f"overhead: median {1e3 * doc['median_s']:.2f} ms, P99 {1e3 * doc['p99_s']:.2f} ms ({overhead.size} requests)")
    return doc


# --------------------------------------------------------------------------- 2b. the CPU stage


def step_cpu(step: dict) -> dict:
    """One metered step's figures for the CPU fit: the request rate over the step, the cores each
    thread group used, the load generator's cores, the server's mean batch size and stage means."""
    sc = step["server_cpu"]
    rate = sc["requests"] / sc["wall_s"]
    cores = {g: (us or 0.0) * 1e-6 * rate for g, us in sc["threads_us_per_request"].items()}
    return {
        "rate_qps": rate,
        "offered_qps": step.get("nominal_qps", step["offered_qps"]),
        "cores": cores,
        "loadgen_cores": step["host_cpu"]["loadgen_cores"],
        "other_cores": step["host_cpu"]["other_cores"],
        "mean_batch_size": step.get("mean_batch_size"),
        "stages_ms": step.get("stages_ms") or {},
    }


def fit_cpu_stage(points: list[dict], cores: float):
    """The CPU stage from metered steps (`step_cpu`'s dicts), by least squares against the rate:

    - the loop (the main thread): cores = a + c·λ; c is its CPU per request, a goes to the
      background (timers, polls: not per request);
    - c's split: the server's `respond` stage (a request's wait on the loop after its batch)
      grows with the batch by c_out·(n − 1)/2 (the batch's answers are sent one after another),
      so c_out is the slope of respond against (n̄ − 1)/2, clamped to [0, c]; c_in = c − c_out;
    - the model worker: its CPU per batch, cores / (λ / n̄), = α + β·n̄: the server's own batch
      time (cold weights, the hop to the worker), which replaces the profile's back-to-back fit;
    - the background: gRPC's own threads, the rest of the server's threads and the load
      generator, cores = a + c·λ.

    Returns (CpuStage, details)."""
    from wok.bench.tune import CpuStage, fit_linear

    if len(points) < 2:
        raise ValueError("the CPU stage needs at least two metered loads")
    lam = [p["rate_qps"] for p in points]
    a_loop, c_loop, r2_loop = fit_linear(lam, [p["cores"]["loop"] for p in points])
    bg = [p["cores"]["grpc"] + p["cores"]["other"] + p["loadgen_cores"] for p in points]
    a_bg, c_bg, r2_bg = fit_linear(lam, bg)
    sizes = [p["mean_batch_size"] for p in points]
    per_batch = [p["cores"]["model"] / (p["rate_qps"] / n) for p, n in zip(points, sizes)]
    a_w, b_w, r2_w = fit_linear(sizes, per_batch)
    respond = [1e-3 * p["stages_ms"].get("respond", 0.0) for p in points]
    _, c_out, r2_out = fit_linear([(n - 1) / 2 for n in sizes], respond)
    c_loop = max(c_loop, 0.0)
    c_out = min(max(c_out, 0.0), c_loop)
    stage = CpuStage(
        cpu_in_s=c_loop - c_out,
        cpu_out_s=c_out,
        cores=float(cores),
        background_cores=max(a_loop, 0.0) + max(a_bg, 0.0),
        background_cpu_s=max(c_bg, 0.0),
        batch_alpha_s=max(a_w, 0.0),
        batch_beta_s=max(b_w, 1e-9),
    )
    details = {
        "loop_fit": {"cores_at_zero": a_loop, "s_per_request": c_loop, "r2": r2_loop},
        "respond_fit": {"s_per_answer": c_out, "r2": r2_out},
        "batch_fit": {"alpha_s": a_w, "beta_s": b_w, "r2": r2_w},
        "background_fit": {"cores_at_zero": a_bg, "s_per_request": c_bg, "r2": r2_bg},
        "points": points,
    }
    return stage, details


def calibrate_cpu(args) -> dict:
    """A `wok.cpustage/1` document from a metered ramp on a server with the default setting."""
    from wok.bench.compare import metered_ramp
    from wok.bench.tune import cpu_document

    n, d = args.default_setting
    say(f"calibrating the CPU stage: max_batch_size {n}, delay {d:g} ms, steps {args.cpu_steps_list}")
    server = start_server(n, d, args.log_dir, args.torch_threads, server_timing=True)
    try:
        cal_args = argparse.Namespace(**{**vars(args), "step_duration": args.cpu_calibration_duration})
        cfg = ramp_config(server, args.cpu_steps_list, cal_args, args.slo_ms, server_timing=True)
        result = metered_ramp(server, cfg, say, args.processes)
        whole_calibration(server, result)
    finally:
        server.stop()
    stage, details = fit_cpu_stage([step_cpu(s) for s in result["steps"]], args.cores)
    details["outside_by_rate"] = [
        {
            "offered_qps": s["nominal_qps"],
            "outside_ms": s["server_timing"]["outside_ms"],
            "outside_histogram": s["server_timing"]["outside_histogram"],
            "compute_histogram": s["server_timing"]["compute_histogram"],
            # Once per batch (the trailer's batch size): what the batch's spread is drawn from (batch_noise_by_rate).
            **{k: s["server_timing"][k] for k in ("compute_batch_histogram",) if k in s["server_timing"]},
            "batch_histogram": s["server_timing"]["batch_histogram"],
            # What the slowest 1 % were made of at this load: whether server and outside are slow together.
            "tail": s["server_timing"]["tail"],
        }
        for s in result["steps"]
        if s["server_timing"]["requests"]
    ]
    say(
        f"CPU stage: loop {1e6 * stage.cpu_in_s:.0f} + {1e6 * stage.cpu_out_s:.0f} µs per request; batch "
        f"{1e3 * stage.batch_alpha_s:.3f} ms + {1e3 * stage.batch_beta_s:.4f} ms·n; background "
        f"{stage.background_cores:.2f} cores + {1e6 * stage.background_cpu_s:.0f} µs per request; {stage.cores:g} cores"
    )
    # The ramp's stop rule ending it before its last load: the stage is fitted on fewer loads than asked.
    details["stopped_early"] = result.get("stopped_early")
    return cpu_document(stage, f"bench/tune_check.py: metered ramp at {args.cpu_steps_list} QPS, max_batch_size {n}, "
                        f"delay {d:g} ms", setting={"max_batch_size": n, "max_queue_delay_ms": d},
                        **details)  # fmt: skip


def cpu_overhead(overhead_s, t1: float, stage) -> np.ndarray:
    """The calibration's latencies (overhead + t1) less what the CPU stage models of a lone request:
    the loop's two passes and one batch of one."""
    lat = np.asarray(overhead_s, dtype=np.float64) + t1
    own = stage.cpu_in_s + stage.cpu_out_s + stage.batch_alpha_s + stage.batch_beta_s
    return np.maximum(lat - own, 0.0)


# --------------------------------------------------------------------------- 5. prediction


def predict(result: dict, max_batch_size: int, delay_ms: float, profile, overhead, args, sampled: bool,
            cpu=None, batch_noise=None) -> dict:  # fmt: skip
    """The measured ramp's steps, simulated: same offers, arrival process, step length and warm-up.

    `overhead`: samples (s), or a function of the offered rate giving them (`overhead_by_rate`),
    in which case each step is simulated with its own; `batch_noise` (`batch_noise_by_rate`), with
    the CPU stage: each step's batches vary by its rate's ratios."""
    from wok.bench import analysis
    from wok.bench.simulate import SimConfig, simulate_ramp
    from wok.bench.tune import model_for

    def config(steps, overhead_s, noise=None) -> SimConfig:
        model = model_for(profile, max_batch_size, 1e-3 * delay_ms, overhead_s=overhead_s, sampled=sampled, cpu=cpu)
        if noise is not None:  # batch_sampler scales a size-1 sample along the fit: (α + β·n)·ratio
            model = replace(model, batch_samples=((1, tuple(model.batch_time(1) * np.asarray(noise))),))
        return SimConfig(
            model=model,
            steps=steps,
            step_duration_s=args.step_duration,
            warmup_s=args.warmup,
            arrival=args.arrival,
            slo_p99_ms=result["slo_p99_ms"],
            seed=args.seed,
        )

    rates = [s["nominal_qps"] for s in result["steps"]]
    if not callable(overhead) and batch_noise is None:
        return simulate_ramp(config(rates, overhead))
    steps = [
        simulate_ramp(
            config(
                [q], overhead(q) if callable(overhead) else overhead, None if batch_noise is None else batch_noise(q)
            )
        )["steps"][0]
        for q in rates
    ]
    return analysis.ramp_result(steps=steps, slo_p99_ms=result["slo_p99_ms"], config={"source": "simulate"})


def compare_steps(
    measured: dict,
    predicted: dict,
    sampled: dict,
    batcher: dict | None = None,
    plain: dict | None = None,
    fixed: dict | None = None,
    by_rate: Callable[[float], tuple[float, ...]] | None = None,
    steady: dict | None = None,
) -> list[dict]:
    """Per step: measured against predicted (the CPU stage's model when there is one, else α + β·n with
    overheads); `sampled_*` with the profile's measured batch times and overheads; with `plain` (the
    batcher on the profile's fit with overheads, no CPU stage) also `batcher_*`.

    With `batcher` (the same steps simulated without overheads), also the server's own mean
    end-to-end time (its histogram's sum / count: exact, unlike its bucketed percentiles) against
    the simulated batcher's mean. That pair leaves out the client, gRPC transport and the
    generator's lag, so it checks the batcher model on its own.
    """
    knee = measured["knee_qps"]
    rows = []
    n = len(measured["steps"])

    def steps_of(ramp: dict | None) -> list:
        return ramp["steps"] if ramp else [None] * n

    def p99_of(step: dict | None) -> float | None:
        return None if step is None else step["latency_ms"]["p99"]

    others = (steps_of(r) for r in (batcher, plain, fixed, steady))
    for m, p, q, b, f, x, y in zip(measured["steps"], predicted["steps"], sampled["steps"], *others):
        other = (m.get("host_cpu") or {}).get("other_cores")
        timing = m.get("server_timing") or {}
        mp, pp = m["latency_ms"]["p99"], p["latency_ms"]["p99"]
        err = _error(pp, mp)
        below = knee is None or m["offered_qps"] < knee
        fp, xp = p99_of(f), p99_of(x)
        yp = None if y is p else p99_of(y)  # the same ramp: the prediction has steady batches itself
        threads = (m.get("server_cpu") or {}).get("threads_us_per_request") or {}
        sc = m.get("server_cpu") or {}
        loop_cores = None
        if threads.get("loop") is not None and sc.get("wall_s"):
            loop_cores = threads["loop"] * 1e-6 * sc["requests"] / sc["wall_s"]
        rows.append(
            {
                "offered_qps": m["offered_qps"],
                "measured_achieved_qps": m["achieved_qps"],
                "measured_p50_ms": m["latency_ms"]["p50"],
                "measured_p99_ms": mp,
                "predicted_p50_ms": p["latency_ms"]["p50"],
                "predicted_p99_ms": pp,
                "relative_error": err,
                "sampled_p99_ms": q["latency_ms"]["p99"],
                "sampled_relative_error": _error(q["latency_ms"]["p99"], mp),
                "below_knee": below,
                "within_tolerance": err is not None and abs(err) <= TOLERANCE,
                "measured_mean_batch_size": m.get("mean_batch_size"),
                "predicted_mean_batch_size": p.get("mean_batch_size"),
                "server_compute_ms": (m.get("stages_ms") or {}).get("compute"),
                "dispatch_lag_p99_ms": m["dispatch_lag_ms"]["p99"],
                "server_e2e_mean_ms": ((m.get("server") or {}).get("e2e_ms") or {}).get("mean"),
                "predicted_batcher_mean_ms": None if b is None else b["latency_ms"]["mean"],
                "other_cores": other,
                "quiet": other is not None and other <= QUIET_CORES,
                "server_cores": (m.get("server_cpu") or {}).get("cores"),
                "batcher_p99_ms": fp,
                "batcher_relative_error": _error(fp, mp),
                "measured_loop_cores": loop_cores,
                "predicted_loop_utilization": p.get("loop_utilization"),
                # The prediction with the light-load overhead at every rate (before the overhead by load).
                "fixed_overhead_p99_ms": xp,
                "fixed_overhead_relative_error": _error(xp, mp),
                # With the overhead by load but batches that do not vary (when `predicted` has them vary).
                "steady_batch_p99_ms": yp,
                "steady_batch_relative_error": _error(yp, mp),
                # Request by request (server-timing): the server's own P99, and the time outside it.
                "measured_server_p99_ms": ((timing.get("stages_ms") or {}).get("total") or {}).get("p99"),
                "measured_outside_p99_ms": (timing.get("outside_ms") or {}).get("p99"),
                # Nearest-rank, as the measured_outside_p99_ms it is set beside (np.quantile interpolated).
                "predicted_overhead_p99_ms": (
                    None if by_rate is None else latency_summary(1e3 * np.asarray(by_rate(m["nominal_qps"])))["p99"]
                ),
            }
        )
    return rows


def _error(predicted: float | None, measured: float | None) -> float | None:
    if predicted is None or not measured or not np.isfinite(measured) or not np.isfinite(predicted):
        return None
    return (predicted - measured) / measured


def _steps_within(rows: list[dict], prediction: str) -> int | None:
    """How many rows' `{prediction}_relative_error` is within TOLERANCE; None when no row has that prediction."""
    if all(r.get(f"{prediction}_p99_ms") is None for r in rows):
        return None
    errors = (r[f"{prediction}_relative_error"] for r in rows)
    return sum(e is not None and abs(e) <= TOLERANCE for e in errors)


# --------------------------------------------------------------------------- output


def print_report(doc: dict, file=None) -> None:
    from rich import box
    from rich.console import Console
    from rich.measure import Measurement
    from rich.table import Table

    tables = []
    for run in doc["runs"]:
        table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False,
                      title=f"rep {run['rep']} {run['label']}: max_batch_size {run['max_batch_size']}, "
                      f"delay {run['max_queue_delay_ms']:g} ms; measured max QPS {run['measured_max_qps']}, "
                      f"knee {_knee(run)}{_left_out(run)}")  # fmt: skip
        for h in ("offered", "achieved", "P50 meas", "P50 sim", "P99 meas", "P99 sim", "error", "P99 steady",
                  "P99 fixed", "error·f", "server P99", "outside P99", "overhead P99 sim", "below knee",
                  "batch meas", "batch sim", "loop cores meas", "loop util sim", "other cores"):  # fmt: skip
            table.add_column(h, justify="right", no_wrap=True)
        for r in run["comparison"]:
            table.add_row(
                f"{r['offered_qps']:g}",
                f"{r['measured_achieved_qps']:.0f}",
                _ms(r["measured_p50_ms"]),
                _ms(r["predicted_p50_ms"]),
                _ms(r["measured_p99_ms"]),
                _ms(r["predicted_p99_ms"]),
                _pct(r["relative_error"]),
                _ms(r.get("steady_batch_p99_ms")),
                _ms(r.get("fixed_overhead_p99_ms")),
                _pct(r.get("fixed_overhead_relative_error")),
                _ms(r.get("measured_server_p99_ms")),
                _ms(r.get("measured_outside_p99_ms")),
                _ms(r.get("predicted_overhead_p99_ms")),
                "yes" if r["below_knee"] else "no",
                _num(r["measured_mean_batch_size"]),
                _num(r["predicted_mean_batch_size"]),
                _num2(r.get("measured_loop_cores")),
                _num2(r.get("predicted_loop_utilization")),
                _num2(r["other_cores"]),
            )
        tables.append(table)
    # Wide enough for every table whole: at a narrower width rich shortens the no_wrap cells and
    # headers to "…", whether it writes to a terminal or to a pipe.
    wide = Console(file=io.StringIO(), width=1 << 16)
    width = max((Measurement.get(wide, wide.options, t).maximum for t in tables), default=0)
    console = Console(file=file or sys.stdout, color_system=None, highlight=False, markup=False,
                      width=max(width, 80), soft_wrap=True)  # fmt: skip
    for table in tables:
        console.print(table)
        console.print()
    v = doc["verdict"]
    slo = doc["config"]["slo_p99_ms"]
    console.print(
        f"max QPS under P99 ≤ {slo:g} ms, per rep: default {v['default_max_qps']}, tuned {v['tuned_max_qps']}; "
        f"tuned ≥ default in every rep: {_every_rep(v)}; medians: default "
        f"{_qps(v['default_median_max_qps'])}, tuned {_qps(v['tuned_median_max_qps'])}"
    )
    if v.get("runs_left_out"):
        console.print(f"left out of the verdict, cut short: {_cut_runs(v)}")
    console.print(
        f"P99 within ±{100 * TOLERANCE:g}% on every step below the knee: {v['p99_within_tolerance_below_knee']} "
        f"({v['steps_within']}/{v['steps_below_knee']} steps; worst {v['worst_error']}); on quiet steps "
        f"(other load ≤ {QUIET_CORES:g} cores): {v['quiet_steps_within']}/{v['quiet_steps_below_knee']}"
    )
    if v.get("steady_batch_steps_within") is not None:
        console.print(
            f"with the overhead by load but steady batches: {v['steady_batch_steps_within']}/"
            f"{v['steps_below_knee']} steps within ±{100 * TOLERANCE:g}%"
        )
    if v.get("fixed_overhead_steps_within") is not None:
        console.print(
            f"with the light-load overhead at every rate instead (P99 fixed): {v['fixed_overhead_steps_within']}/"
            f"{v['steps_below_knee']} steps within ±{100 * TOLERANCE:g}%"
        )


def _knee(run: dict) -> str:
    """The measured ramp's knee, worded as `wok bench`'s report words it: "at or below N" when the
    ramp's first step already fell short of its offer (nothing ran below it to say where). Read from
    the whole `measured` ramp: its `knee_at_or_below_first_step`, or its steps in files written before
    that flag (a run without `measured`, as in hand-made documents, shows the knee as it is)."""
    knee = run["measured_knee_qps"]
    measured = run.get("measured") or {}
    at_first = measured.get("knee_at_or_below_first_step")
    if at_first is None and knee is not None and measured.get("steps"):
        from wok.bench.analysis import knee_at_or_below_first_step

        at_first = knee_at_or_below_first_step(measured["steps"], knee)
    return f"at or below {knee}" if at_first and knee is not None else f"{knee}"


def _left_out(run: dict) -> str:
    return f"; cut short, left out of the verdict ({run['error']})" if run.get("error") else ""


def _every_rep(v: dict) -> str:
    """`tuned_at_least_default` in words: None is a verdict that too few whole repetitions leave open."""
    if v["tuned_at_least_default"] is not None:
        return str(v["tuned_at_least_default"])
    return f"not known ({v.get('reps_whole', 0)} of {len(v['default_max_qps'])} reps whole)"


def _cut_runs(v: dict) -> str:
    return "; ".join(f"rep {r['rep']} {r['label']} ({r['error']})" for r in v.get("runs_left_out", []))


def _qps(x) -> str:
    return "-" if x is None else f"{x:g}"


def _ms(x) -> str:
    return "-" if x is None or not np.isfinite(x) else f"{x:.1f}"  # a None from an older run's JSON too


def _pct(x) -> str:
    return "-" if x is None or not np.isfinite(x) else f"{100 * x:+.0f}%"


def _num(x) -> str:
    return "-" if x is None else f"{x:.1f}"


def _num2(x) -> str:
    return "-" if x is None else f"{x:.2f}"


def add_batcher_means(doc: dict) -> None:
    """Fill `server_e2e_mean_ms` and `predicted_batcher_mean_ms` into a run written before they existed."""
    from wok.bench.tune import profile_from_document

    profile = profile_from_document(doc["profile"])
    c = doc["config"]
    args = argparse.Namespace(
        step_duration=c["step_duration"], warmup=c["warmup"], arrival=c["arrival"], seed=c["seed"]
    )
    for run in doc["runs"]:
        # Failed before its first step (`measured` null), or predicting it failed (`comparison` empty):
        # no rows to fill.
        if run.get("measured") is None or not run.get("comparison"):
            continue
        bare = predict(run["measured"], run["max_batch_size"], run["max_queue_delay_ms"], profile, (), args, False)
        for row, m, b in zip(run["comparison"], run["measured"]["steps"], bare["steps"]):
            row["server_e2e_mean_ms"] = ((m.get("server") or {}).get("e2e_ms") or {}).get("mean")
            row["predicted_batcher_mean_ms"] = b["latency_ms"]["mean"]


def rewrite(path: Path, text: str) -> None:
    """`text` (UTF-8) in place of the file at `path`, whole or not at all (`outputs.replacing`): a
    write that fails (a full disk) or is interrupted leaves the file as it was, not truncated."""
    with replacing(Path(path)) as part:
        part.write_text(text, encoding="utf-8")


def _rows_v2(run: dict) -> list[str]:
    """One run's table (`wok.tunecheck/2` or `/3`): the prediction with the CPU stage, and the batcher alone; for a
    run with the overhead by load, the prediction with the light-load overhead instead of the batcher's."""
    if any(r.get("fixed_overhead_p99_ms") is not None for r in run["comparison"]):
        return _rows_by_rate(run)
    out = [
        "| offered | achieved | P50 ms meas / sim | P99 ms meas | P99 ms sim | error | P99 ms batcher only | error "
        "| below knee | mean batch meas / sim | loop cores meas / sim | other cores |",
        "|--:|--:|--:|--:|--:|--:|--:|--:|:-:|--:|--:|--:|",
    ]
    for r in run["comparison"]:
        out.append(
            f"| {r['offered_qps']:,.0f} | {r['measured_achieved_qps']:,.0f} "
            f"| {_ms(r['measured_p50_ms'])} / {_ms(r['predicted_p50_ms'])} | {_ms(r['measured_p99_ms'])} "
            f"| {_ms(r['predicted_p99_ms'])} | {_pct(r['relative_error'])} | {_ms(r.get('batcher_p99_ms'))} "
            f"| {_pct(r.get('batcher_relative_error'))} | {'yes' if r['below_knee'] else 'no'} "
            f"| {_num(r['measured_mean_batch_size'])} / {_num(r['predicted_mean_batch_size'])} "
            f"| {_num2(r.get('measured_loop_cores'))} / {_num2(r.get('predicted_loop_utilization'))} "
            f"| {_num2(r.get('other_cores'))} |"
        )
    out.append("")
    return out


def _rows_by_rate(run: dict) -> list[str]:
    out = [
        "| offered | achieved | P50 ms meas / sim | P99 ms meas | P99 ms sim | error | P99 ms sim, steady batches "
        "| P99 ms sim, light-load overhead | error | server P99 ms | outside P99 ms meas / overhead sim | below knee "
        "| mean batch meas / sim | other cores |",
        "|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|:-:|--:|--:|",
    ]
    for r in run["comparison"]:
        out.append(
            f"| {r['offered_qps']:,.0f} | {r['measured_achieved_qps']:,.0f} "
            f"| {_ms(r['measured_p50_ms'])} / {_ms(r['predicted_p50_ms'])} | {_ms(r['measured_p99_ms'])} "
            f"| {_ms(r['predicted_p99_ms'])} | {_pct(r['relative_error'])} | {_ms(r.get('steady_batch_p99_ms'))} "
            f"| {_ms(r.get('fixed_overhead_p99_ms'))} "
            f"| {_pct(r.get('fixed_overhead_relative_error'))} | {_ms(r.get('measured_server_p99_ms'))} "
            f"| {_ms(r.get('measured_outside_p99_ms'))} / {_ms(r.get('predicted_overhead_p99_ms'))} "
            f"| {'yes' if r['below_knee'] else 'no'} "
            f"| {_num(r['measured_mean_batch_size'])} / {_num(r['predicted_mean_batch_size'])} "
            f"| {_num2(r.get('other_cores'))} |"
        )
    out.append("")
    return out


def markdown(doc: dict) -> str:
    """The runs of a `wok.tunecheck/1`, `/2` or `/3` document as the markdown tables of docs/tune.md."""
    out = []
    cfg, v = doc["config"], doc["verdict"]
    cals = [doc["overhead"], *doc.get("calibrations", [])]
    out.append(
        "Overhead calibrations (median / P99 ms): "
        + ", ".join(f"{1e3 * c['median_s']:.2f} / {1e3 * c['p99_s']:.2f}" for c in cals)
        + f"; tuned setting: max_batch_size {doc['tuned_setting']['max_batch_size']}, "
        f"delay {doc['tuned_setting']['max_queue_delay_ms']:g} ms; load average at start "
        f"{doc['host']['loadavg_at_start'][0]:.2f}, at end {doc['host']['loadavg_at_end'][0]:.2f}.\n"
    )
    if doc.get("error"):
        out.append(f"The run {doc['error']}: the runs below are what was measured before it.\n")
    cpu = doc.get("cpu_stage")
    if cpu:
        out.append(
            f"CPU stage ({cpu['method']}): loop {1e6 * cpu['cpu_in_s']:.0f} µs before the batcher + "
            f"{1e6 * cpu['cpu_out_s']:.0f} µs after it per request; the server's batch "
            f"{1e3 * cpu['batch_alpha_s']:.3f} ms + {1e3 * cpu['batch_beta_s']:.4f} ms·n; background "
            f"{cpu['background_cores']:.2f} cores + {1e6 * cpu['background_cpu_s']:.0f} µs per request; "
            f"{cpu['cores']:g} cores.\n"
        )
    for run in doc["runs"]:
        out.append(
            f"**rep {run['rep']}, {run['label']}** (max_batch_size {run['max_batch_size']}, delay "
            f"{run['max_queue_delay_ms']:g} ms): measured max QPS under {cfg['slo_p99_ms']:g} ms "
            f"{run['measured_max_qps']}, knee {_knee(run)}{_left_out(run)}\n"
        )
        if doc.get("schema") != "wok.tunecheck/1":
            out.extend(_rows_v2(run))
            continue
        out.append(
            "| offered | achieved | P50 ms meas / sim | P99 ms meas | P99 ms sim (fit) | error | P99 ms sim (samples) "
            "| error | below knee | mean batch meas / sim | server mean ms meas / sim | other cores |"
        )
        out.append("|--:|--:|--:|--:|--:|--:|--:|--:|:-:|--:|--:|--:|")
        for r in run["comparison"]:
            other = r.get("other_cores")
            out.append(
                f"| {r['offered_qps']:,.0f} | {r['measured_achieved_qps']:,.0f} "
                f"| {_ms(r['measured_p50_ms'])} / {_ms(r['predicted_p50_ms'])} | {_ms(r['measured_p99_ms'])} "
                f"| {_ms(r['predicted_p99_ms'])} | {_pct(r['relative_error'])} | {_ms(r['sampled_p99_ms'])} "
                f"| {_pct(r['sampled_relative_error'])} | {'yes' if r['below_knee'] else 'no'} "
                f"| {_num(r['measured_mean_batch_size'])} / {_num(r['predicted_mean_batch_size'])} "
                f"| {_ms(r.get('server_e2e_mean_ms'))} / {_ms(r.get('predicted_batcher_mean_ms'))} "
                f"| {'-' if other is None else f'{other:.2f}'} |"
            )
        out.append("")
    out.append(
        f"Verdict: max QPS under P99 ≤ {cfg['slo_p99_ms']:g} ms per repetition: default {v['default_max_qps']}, "
        f"tuned {v['tuned_max_qps']} (tuned ≥ default in every repetition: {_every_rep(v)}"
        + (
            f"; medians: default {_qps(v['default_median_max_qps'])}, tuned {_qps(v['tuned_median_max_qps'])}); "
            if "tuned_median_max_qps" in v
            else "); "
        )
        + (f"left out of the verdict, cut short: {_cut_runs(v)}; " if v.get("runs_left_out") else "")
        + f"predicted P99 within ±{100 * TOLERANCE:g} % on {v['steps_within']} of {v['steps_below_knee']} steps "
        "below the knee"
        + (
            f" ({v['quiet_steps_within']} of {v['quiet_steps_below_knee']} quiet ones)"
            if "quiet_steps_below_knee" in v
            else ""
        )
        + (
            f"; the batcher alone (profile fit + overheads, no CPU stage) within ±{100 * TOLERANCE:g} % on "
            f"{v['batcher_steps_within']} of them"
            if "batcher_steps_within" in v
            else ""
        )
        + (
            f"; with the overhead by load but steady batches, {v['steady_batch_steps_within']} of them"
            if v.get("steady_batch_steps_within") is not None
            else ""
        )
        + (
            f"; with the light-load overhead at every rate instead, {v['fixed_overhead_steps_within']} of them"
            if v.get("fixed_overhead_steps_within") is not None
            else ""
        )
        + "."
    )
    return "\n".join(out) + "\n"


def plot(doc: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from wok.bench import report

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for ax, label in zip(axes, ("default", "tuned")):
        runs = [r for r in doc["runs"] if r["label"] == label]
        for k, run in enumerate(runs):
            x = [r["offered_qps"] for r in run["comparison"]]
            ax.plot(x, [r["measured_p99_ms"] for r in run["comparison"]], "o-", color=f"C{k}",
                    label=f"measured, rep {run['rep']}{' (cut short)' if run.get('error') else ''}")  # fmt: skip
            ax.plot(x, [r["predicted_p99_ms"] for r in run["comparison"]], "x--", color=f"C{k}",
                    label=f"simulated, rep {run['rep']}")  # fmt: skip
            if run["measured_knee_qps"]:
                ax.axvline(run["measured_knee_qps"], color=f"C{k}", lw=0.8, ls=":")
        if runs:
            ax.set_title(
                f"{label}: max_batch_size {runs[0]['max_batch_size']}, delay {runs[0]['max_queue_delay_ms']:g} ms"
            )
        ax.axhline(doc["config"]["slo_p99_ms"], color="k", lw=0.8, ls="-.", label="SLO")
        ax.set_yscale("log")
        ax.set_xlabel("offered QPS")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("P99 latency, ms")
    model = doc["profile"].get("model") or "mlp"
    what = "CPU stage + batcher + overhead" if doc.get("cpu_stage") else "batcher + measured overhead"
    fig.suptitle(f"wok {model}: P99 measured (wok bench ramp) and simulated ({what}); dotted: knee")
    fig.tight_layout()
    fig.savefig(path, dpi=110, format=report.figure_format(path))
    plt.close(fig)


# --------------------------------------------------------------------------- main


def build_parser() -> argparse.ArgumentParser:
    """This script's parser (tests/deploy/test_doc_commands.py parses the docs' command lines with it)."""
    from wok.cliargs import ArgumentParser  # argparse's, its refusals in wok's words

    p = ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--slo-p99", default="50ms", help="the P99 latency the search tunes for (default %(default)s)")
    p.add_argument("--profile", type=Path, help="a wok.profile/1 document; default: measure in-process")
    p.add_argument(
        "--profile-sizes",
        default="1,2,4,8,16,32,64",
        help="batch sizes the in-process profile times (default %(default)s)",
    )
    p.add_argument(
        "--profile-reps", type=int, default=200, help="batches timed per profiled size (default %(default)s)"
    )
    p.add_argument(
        "--calibration-qps", type=float, default=100.0,
        help="the overhead calibration's load, requests/s (default %(default)g)",
    )  # fmt: skip
    p.add_argument(
        "--calibration-duration", default="6s",
        help="measured length of the overhead calibration, one per repetition (default %(default)s)",
    )  # fmt: skip
    p.add_argument(
        "--cpu-steps", default="300,1200,2400",
        help="loads of the CPU stage's metered calibration ramp, requests/s (default %(default)s)",
    )  # fmt: skip
    p.add_argument(
        "--cpu-calibration-duration", default="4s", help="measured length of each of those steps (default %(default)s)"
    )
    p.add_argument(
        "--cores", type=float, default=float(os.cpu_count() or 1),
        help="cores the server shares, in the CPU stage (default: this machine's, %(default)g)",
    )  # fmt: skip
    p.add_argument("--no-cpu-stage", action="store_true", help="predict and tune without the CPU stage")
    p.add_argument("--save-cpu", type=Path, help="write the CPU stage (wok.cpustage/1) here")
    p.add_argument(
        "--max-batch-sizes", default="4,8,16,32,64", help="the search's max_batch_size values (default %(default)s)"
    )
    p.add_argument(
        "--delays", default="0ms,1ms,2ms,5ms,10ms", help="the search's max_queue_delay values (default %(default)s)"
    )
    p.add_argument(
        "--default", default="32,5ms",
        help="the default setting, searched and validated beside the tuned one: MAX_BATCH_SIZE,DELAY "
        "(default %(default)s)",
    )  # fmt: skip
    p.add_argument(
        "--tuned",
        help="validate this setting, not the tuner's choice (the search still runs, for its table): "
        "MAX_BATCH_SIZE,DELAY",
    )
    p.add_argument(
        "--allow-extrapolated",
        action="store_true",
        help="as wok tune's: choose a setting whose batches run past the profiled sizes even when a measured one "
        "meets the SLO (default: measured first; docs/tune.md)",
    )
    p.add_argument(
        "--sim-duration", default="10s",
        help="simulated length of each of the search's steps, after its warm-up (default %(default)s)",
    )  # fmt: skip
    p.add_argument(
        "--steps", default=DEFAULT_STEPS,
        help="offered loads of each validation ramp, requests/s: a list, or start:stop:factor (default %(default)s)",
    )  # fmt: skip
    p.add_argument(
        "--step-duration", default="4s", help="measured length of each validation step (default %(default)s)"
    )
    p.add_argument(
        "--warmup", default="1s", help="uncounted start of every step, the calibrations' too (default %(default)s)"
    )
    p.add_argument(
        "--arrival", default="poisson", help="the arrival process of the ramps and the search (default %(default)s)"
    )
    p.add_argument("--workers", type=int, default=2, help="load-generator processes (default %(default)s)")
    p.add_argument(
        "--reps", type=int, default=2,
        help="repetitions: each an overhead calibration and a ramp of each setting (default %(default)s)",
    )  # fmt: skip
    p.add_argument(
        "--stop-factor", type=float, default=10.0,
        help="end a ramp after a step whose P99 exceeds this × the SLO (default %(default)g)",
    )  # fmt: skip
    p.add_argument(
        "--torch-threads", type=int, help="torch's threads in the profile and the servers (default: torch's own)"
    )
    p.add_argument(
        "--device-like",
        dest="device_like_spec",
        metavar="ALPHA,BETA",
        help="serve a model whose batch sleeps α + β·n (a device's batch, no host CPU) instead of mlp, e.g. 5ms,1ms",
    )
    p.add_argument("--seed", type=int, default=0, help="the load's and the search's random seed (default %(default)s)")
    p.add_argument("--json", type=Path, help=f"write the run ({SCHEMA}) here")
    p.add_argument("--plot", type=Path, help="draw each ramp's measured and predicted P99 here")
    p.add_argument("--plots", dest="plot", type=Path, help=argparse.SUPPRESS)  # the `wok` commands' old spelling
    p.add_argument("--save-profile", type=Path, help="write the measured profile here")
    p.add_argument(
        "--save-overhead", type=Path,
        help="write the first calibration's overhead samples (wok.overhead/1) here (beside the CPU stage if any)",
    )  # fmt: skip
    p.add_argument(
        "--log-dir", type=Path, default=Path("/tmp/wok-tune-check"), help="the servers' logs (default %(default)s)"
    )
    p.add_argument("--markdown", type=Path, help="print a finished run's tables (for docs/tune.md) and exit")
    p.add_argument(
        "--refresh", action="store_true", help="with --markdown: add the batcher-only columns to an older run's file"
    )
    p.epilog = run_length_text(p)
    return p


def has_cpu_stage(args) -> bool:
    """Whether a run calibrates on the CPU first (`args` as parse_args leaves them, or the parser's defaults)."""
    return not (args.no_cpu_stage or args.device_like_spec)


def measured_seconds(args) -> dict[str, float]:
    """The seconds of load a run offers, by part, from its options (`args` as parse_args leaves them, or the
    parser's defaults): an upper bound, as a validation ramp ends at the first step past --stop-factor × the SLO."""
    cpu = 0.0
    if has_cpu_stage(args):
        cpu = len(args.cpu_steps_list) * (args.warmup + args.cpu_calibration_duration)
    return {
        "cpu calibration": cpu,
        "overhead calibrations": args.reps * (args.warmup + args.calibration_duration),
        "validation": args.reps * 2 * len(args.steps_list) * (args.warmup + args.step_duration),
    }


# The load's durations, converted to seconds on the parsed args (parse_args, and run_length_text's defaults).
LOAD_DURATIONS = ("--step-duration", "--warmup", "--calibration-duration", "--cpu-calibration-duration")


def _attr(option: str) -> str:
    return option.removeprefix("--").replace("-", "_")


def run_length_text(p: argparse.ArgumentParser) -> str:
    """--help's account of how long a run takes, from the parser's defaults."""
    from wok.bench.arrivals import parse_steps

    d = p.parse_args([])
    for attr in map(_attr, LOAD_DURATIONS):
        setattr(d, attr, _seconds(getattr(d, attr)))
    d.steps_list, d.cpu_steps_list = parse_steps(d.steps), parse_steps(d.cpu_steps)
    parts = measured_seconds(d)
    return (
        "How long a run takes: the load it offers is, at most, the CPU calibration's --cpu-steps × (--warmup + "
        f"--cpu-calibration-duration) ({parts['cpu calibration']:g} s with the defaults; none with --no-cpu-stage "
        f"or --device-like), --reps overhead calibrations of --warmup + --calibration-duration "
        f"({parts['overhead calibrations']:g} s), and --reps × 2 settings × --steps × (--warmup + --step-duration) "
        f"of validation ({parts['validation']:g} s; a ramp ends at the first step whose P99 passes --stop-factor × "
        "the SLO); besides, a start of a few seconds per server (3 × --reps + 1, "
        f"{servers_started(d)} with the defaults; 3 × --reps, {3 * d.reps}, with --no-cpu-stage or "
        "--device-like), the in-process profile "
        "(--profile-sizes × --profile-reps batches; none with --profile), and the search (a simulated --sim-duration "
        "per evaluation, --max-batch-sizes × --delays settings). On the 2-core development machine docs/tune.md's "
        "command (these loads, a 4 × 4 grid, --sim-duration 5s) took 270 to 281 s (the wall_s of runs 6, 7 and "
        "10 to 13)."
    )


def servers_started(args) -> int:
    """The servers a run starts: the CPU calibration's one, where it has that stage, and per repetition the
    overhead calibration's and each validated setting's (2)."""
    return 3 * args.reps + has_cpu_stage(args)


def planned_text(args) -> str:
    """What a run will take, said as it starts (as `wok bench` says its plan): --help alone gave it, from the
    defaults, and a run of other options said nothing of its length but each stage's start."""
    from wok.bench.cli import _duration_text, ramp_ends_text

    parts = measured_seconds(args)
    shown = ", ".join(f"{_duration_text(s)} of {part.replace('cpu', 'CPU')}" for part, s in parts.items() if s)
    besides = "the search" if args.profile else "the in-process profile, the search"
    return (
        f"planned: at most {_duration_text(sum(parts.values()))} of load ({shown}; less if a step ends a ramp: "
        f"{ramp_ends_text(args.stop_factor)}), besides {besides} and the starts of {servers_started(args)} servers, a "
        "few seconds each"
    )


def parse_args(argv=None):
    from wok.bench.arrivals import parse_arrivals, parse_steps

    p = build_parser()
    args = p.parse_args(argv)
    args.processes = None  # main's WorkerProcesses, which its ramps run on (none: each ramp its own workers)
    # --log-dir: the servers' logs (and the device-like model's repository), first written after
    # the profile.
    refuse_unwritable(p, args, "--json", "--plot", "--save-profile", "--save-overhead", "--save-cpu", "--log-dir")
    if args.markdown:  # nothing else is read
        try:
            args.markdown_doc = read_run(args.markdown)
        except ValueError as exc:
            p.error(f"--markdown {exc}")
        return args
    # Every value checked before the first measurement: the profile alone takes minutes.
    try:
        option = "--slo-p99"
        args.slo_ms = 1e3 * _seconds(args.slo_p99)
        option = "--arrival"
        parse_arrivals(args.arrival, 1.0, duration_s=1.0)  # checked only: the search and the ramps parse it
        option = "--steps"
        args.steps_list = parse_steps(args.steps)
        for option in LOAD_DURATIONS:
            setattr(args, _attr(option), _seconds(getattr(args, _attr(option))))
        option = "--sim-duration"
        sim_duration = _seconds(args.sim_duration)  # checked only: the run's config keeps the text given
        option = "--cpu-steps"
        args.cpu_steps_list = parse_steps(args.cpu_steps)
        option = "--max-batch-sizes"
        args.sizes = _positive_ints(args.max_batch_sizes)
        option = "--profile-sizes"
        _positive_ints(args.profile_sizes)
        option = "--delays"
        args.delays_s = [_seconds(x) for x in args.delays.split(",")]
        option = "--default"
        args.default_setting = _setting(args.default)
        option = "--tuned"
        args.tuned_setting = _setting(args.tuned) if args.tuned else None
        option = "--device-like"
        args.device_like = None
        if args.device_like_spec:
            a, comma, b = args.device_like_spec.partition(",")
            if not comma:
                raise ValueError(f"expected ALPHA,BETA (e.g. 5ms,1ms); got {args.device_like_spec!r}")
            args.device_like = (_seconds(a), _seconds(b))
    except ValueError as exc:
        p.error(f"{option}: {exc}")
    for name, value in (("--step-duration", args.step_duration), ("--calibration-duration", args.calibration_duration),
                        ("--cpu-calibration-duration", args.cpu_calibration_duration),
                        ("--sim-duration", sim_duration)):  # fmt: skip
        if value <= 0:
            p.error(f"{name}: expected a duration > 0; got {value:g} s")
    for name, value in (("--reps", args.reps), ("--workers", args.workers), ("--profile-reps", args.profile_reps)):
        if (refusal := integer_refusal(name, value, 1)) is not None:
            p.error(refusal)
    # Else refused by the search's SearchConfig, after the profile and the calibrations.
    if (refusal := integer_refusal("--seed", args.seed, 0)) is not None:
        p.error(refusal)
    if not (args.calibration_qps > 0 and np.isfinite(args.calibration_qps)):
        p.error(f"--calibration-qps: expected a rate > 0; got {args.calibration_qps:g}")
    if not (args.cores > 0 and np.isfinite(args.cores)):
        p.error(f"--cores: expected a number > 0; got {args.cores:g}")
    if args.profile:
        try:
            args.profile_doc, args.profile_fit = read_profile(args.profile)
        except ValueError as exc:
            p.error(f"--profile: {exc}")
        if args.device_like or args.no_cpu_stage:
            # The profile is all the search's ceilings depend on: checked here, before anything is measured.
            # (With the CPU stage, the server's batch time and the stage's bound replace it: `main`.)
            try:
                check_search(args.profile_fit, args)
            except SearchTooLarge as exc:
                p.error(str(exc))
            except ValueError as exc:  # the grid and --arrival are checked above: what is left is the profile's
                p.error(f"--profile: {exc}")
    return args


def _positive_ints(spec: str) -> list[int]:
    try:
        values = [read_int(x) for x in spec.split(",")]
    except ValueError:  # read_int, not int(): int() read "1_6" as 16 and "٣" as 3
        values = []
    if not values or min(values) < 1:
        raise ValueError(f"expected positive integers, comma-separated; got {spec!r}{digits_note(spec)}")
    return values


def read_profile(path: Path) -> tuple[dict, object]:
    """A `wok.profile/1` document and its `wok.bench.tune.Profile`; a ValueError naming the path says why not."""
    from wok.bench import tune

    return read_json_object(path), tune.load_profile(path)


def read_run(path: Path) -> dict:
    """A finished run (`wok.tunecheck/1`, `/2` or `/3`) for --markdown; a ValueError says why not, after the path."""
    doc = read_json_object(path)
    if doc.get("schema") not in READ_SCHEMAS:
        raise ValueError(f"{path}: expected schema one of {', '.join(READ_SCHEMAS)}; got {shown_entry(doc, 'schema')}")
    # A run stopped before its first calibration or its search (`error`) has them null: nothing to show.
    missing = [k for k in ("config", "host", "overhead", "tuned_setting", "runs", "verdict") if doc.get(k) is None]
    if missing:
        stopped = f" ({doc['error']})" if doc.get("error") else ""
        raise ValueError(f"{path}: not a whole run; no {', '.join(missing)}{stopped}")
    return doc


def _setting(spec: str) -> tuple[int, float]:
    n, comma, d = spec.partition(",")
    try:
        size = read_int(n)
    except ValueError:
        size = 0
    if not comma or size < 1:
        raise ValueError(f"expected MAX_BATCH_SIZE,DELAY (e.g. 32,5ms); got {spec!r}{digits_note(n)}")
    return size, 1e3 * _seconds(d)  # (max_batch_size, delay in ms)


def main(argv=None) -> int:
    from wok.bench import report
    from wok.bench.compare import metered_ramp, stop_all
    from wok.bench.tune import (
        batch_noise_by_rate,
        cpu_from_document,
        overhead_by_rate,
        overhead_document,
        print_table,
        profile_from_document,
        tune,
    )
    from wok.bench.workers import WorkerProcesses

    args = parse_args(argv)
    if args.markdown:
        doc = args.markdown_doc
        if args.refresh:
            try:
                with writing("--refresh", args.markdown):
                    add_batcher_means(doc)
                    rewrite(args.markdown, report.to_json(doc))
            except WriteFailed as exc:
                say(f"{exc}; {args.markdown} is left as it was")
                return 1
        sys.stdout.write(markdown(doc))
        return 0
    say(planned_text(args))
    t0 = time.monotonic()
    started = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    loadavg_start = os.getloadavg()
    unsaved = []  # the --save-* options that failed when written
    # What was measured so far: written (--json) with `error` when a measurement fails before its ramp's
    # first step, or a calibration ramp is cut short (`stopped`).
    profile_doc = cpu_doc = overhead_doc = tuned_doc = tuned = None
    noise = None  # the batch's spread (batch_noise_by_rate), when the calibration has one
    calibrations: list[dict] = []
    runs: list[dict] = []
    stopped = None
    refused = False  # the search refused (SearchTooLarge): exit 2, an option to change
    phase = "the profile"
    # Every ramp (the calibrations', the validation's) on the same --workers load-generator processes, started at the
    # first ramp and kept (each start is a spawned interpreter's imports, a few tenths of a second a ramp).
    args.processes = WorkerProcesses().start()
    try:
        # 1. profile
        if args.profile:
            profile_doc, profile = args.profile_doc, args.profile_fit
        else:
            sizes = [int(x) for x in args.profile_sizes.split(",")]
            say(f"profiling mlp in-process: sizes {sizes}, {args.profile_reps} batches each")
            profile_doc = measure_profile(
                sizes, args.profile_reps, threads=args.torch_threads, device_like=args.device_like
            )
            profile = profile_from_document(profile_doc, "measured in-process by bench/tune_check.py")
            if args.save_profile and not _save(profile_doc, "--save-profile", args.save_profile):
                unsaved.append("--save-profile")
        say(f"α = {1e3 * profile.alpha_s:.3f} ms, β = {1e3 * profile.beta_s:.4f} ms/sample, R² = {profile.r2:.3f}")
        # The profile's median_s of batches of 1, nearest-rank as profile_document and `wok profile` write it.
        t1 = (
            latency_summary(dict(profile.samples)[1])["p50"]
            if 1 in dict(profile.samples)
            else profile.alpha_s + profile.beta_s
        )
        with_stage = not args.device_like and not args.no_cpu_stage
        if not with_stage and not args.profile:  # with --profile, checked with the options (parse_args)
            # Before the first server: the search's ceilings are the profile's alone (`check_search`).
            phase = "the search's check"
            check_search(profile, args)
        if args.device_like:  # the calibration's batch is the zero-time one: subtract what that takes
            phase = "the profile"
            # Its samples only: the fit of a batch that takes no time is noise around 0, β < 0 half the time.
            zero = measure_profile([1, 2], 50, device_like=(0.0, 0.0))
            t1 = latency_summary(next(b["samples_s"] for b in zero["batches"] if b["batch_size"] == 1))["p50"]

        # 2. the CPU stage (not for the device-like model: its batch sleeps), then the overhead
        stage = None
        if with_stage:
            phase = "the CPU calibration"
            cpu_doc = calibrate_cpu(args)
            stage = cpu_from_document(cpu_doc)
            if args.save_cpu and not _save(cpu_doc, "--save-cpu", args.save_cpu):
                unsaved.append("--save-cpu")
            # The search's ceilings are the stage's (the server's batch time replaces the profile's fit,
            # its CPU bound caps it): known only now, and checked before the overhead calibration.
            phase = "the search's check"
            check_search(profile, args, cpu=stage)
        by_rate = overhead_by_rate(cpu_doc, stage)
        noise = batch_noise_by_rate(cpu_doc) if stage is not None else None
        if noise is not None:
            say(f"the batch's spread: {BATCH_SPREAD[noise.basis]}")
        phase = "the overhead calibration"
        overhead_doc = calibrate(args, t1)
        calibrations = [overhead_doc]
        overhead = np.asarray(overhead_doc["samples_s"])
        if stage is not None:
            overhead = cpu_overhead(overhead, t1, stage)
            shown = latency_summary(1e3 * overhead)  # nearest-rank, as the overhead document's
            say(f"overhead beside the CPU stage: median {shown['p50']:.2f} ms, P99 {shown['p99']:.2f} ms")
        if args.save_overhead:  # what `wok tune --overhead-samples` needs beside this run's CPU stage
            saved = overhead_doc
            if stage is not None:
                saved = overhead_document(overhead, overhead_doc["method"] + "; less the CPU stage's own time "
                                          "(loop c_in + c_out, one server batch of one) + median T(1)")  # fmt: skip
            if not _save(saved, "--save-overhead", args.save_overhead):
                unsaved.append("--save-overhead")

        # 3. tune
        phase = "the search"
        search = search_config(args)
        default_s = default_seconds(args)
        tuned_doc = tune(profile, search, args.sizes, args.delays_s, overhead_s=tuple(overhead), default=default_s,
                         progress=say, cpu=stage, overhead_at=by_rate, names=search_names(args),
                         allow_extrapolated=args.allow_extrapolated)  # fmt: skip
        print_table(tuned_doc)
        if args.tuned_setting:
            tuned = args.tuned_setting
        elif tuned_doc["chosen"] is None:
            say("no setting meets the SLO in simulation: nothing to validate")
            return 1
        else:
            tuned = (tuned_doc["chosen"]["max_batch_size"], tuned_doc["chosen"]["max_queue_delay_ms"])

        # 4. + 5. validate and predict
        for rep in range(1, args.reps + 1):
            if rep > 1:
                # The machine drifts: each repetition's predictions use an overhead measured just before it.
                phase = f"rep {rep}'s overhead calibration"
                calibrations.append(calibrate(args, t1))
            rep_overhead = tuple(calibrations[-1]["samples_s"])
            rep_cpu_overhead = tuple(cpu_overhead(rep_overhead, t1, stage)) if stage is not None else rep_overhead
            order = [("default", args.default_setting), ("tuned", tuned)]
            if rep % 2 == 0:
                order.reverse()
            for label, (n, d) in order:
                say(f"rep {rep}: {label} (max_batch_size {n}, delay {d:g} ms)")
                phase = f"rep {rep} {label}"
                server = None
                try:
                    # With the server-timing trailer on, as in the CPU calibration: the same server and
                    # generator work per request as there, and each step's time outside the server.
                    server = start_server(n, d, args.log_dir, args.torch_threads, args.device_like, server_timing=True)
                    cfg = ramp_config(server, args.steps_list, args, args.slo_ms, server_timing=True)
                    measured = metered_ramp(server, cfg, say, args.processes)
                    cut = measured.get("interrupted")
                    if cut and cut["by_signal"]:
                        # As bench/compare.py does: a cut ramp's max QPS is the last step it reached, not
                        # where the server fails, so it is left out (the verdict would count it), and the
                        # signal stops the run, as it would anywhere else in it.
                        raise KeyboardInterrupt(cut["reason"])
                    # Read before our own stop: a server gone mid-ramp fails every later step, which
                    # the ramp's stop rule takes for overload, so its ramp is cut as well. (No `proc`:
                    # a stand-in server with no process of ours to watch.)
                    proc = getattr(server, "proc", None)
                    exited = None if proc is None else proc.poll()
                except Exception as exc:
                    # Before its first step (its server did not start, or the ramp raised at once: after
                    # its first step it returns cut, below): no steps to keep; recorded with its `error`,
                    # left out of the verdict, and the run goes on, as compare.py's does.
                    error = f"failed before its first step: {type(exc).__name__}: {exc}"
                    say(f"rep {rep}: {label} left out of the verdict: {error}")
                    runs.append(_failed_run(rep, label, n, d, error))
                    continue
                finally:
                    if server is not None:
                        server.stop()
                # Cut by an error (the ramp raised, or its server went away): kept with its steps and
                # predictions, left out of the verdict (`verdict`) for the same reason, and the run goes
                # on, as compare.py's does.
                error = None
                if cut:
                    error = f"interrupted: {cut['reason']}"
                elif exited is not None:
                    error = f"interrupted: the server exited with {exited} during the ramp; see {server.log_path}"
                try:
                    plain = predict(measured, n, d, profile, rep_overhead, args, sampled=False)
                    predicted = fixed = plain
                    steady = None
                    if stage is not None:
                        fixed = predict(measured, n, d, profile, rep_cpu_overhead, args, sampled=False, cpu=stage)
                        predicted = fixed
                        if by_rate is not None:
                            steady = predict(measured, n, d, profile, by_rate, args, sampled=False, cpu=stage)
                            predicted = steady
                            if noise is not None:
                                predicted = predict(measured, n, d, profile, by_rate, args, False, stage, noise)
                    sampled = predict(measured, n, d, profile, rep_overhead, args, sampled=True)
                    bare = predict(measured, n, d, profile, (), args, sampled=False)
                    comparison = compare_steps(
                        measured, predicted, sampled, bare, plain, fixed if by_rate else None, by_rate, steady
                    )
                except Exception as exc:
                    # The ramp ran: its measurement is kept (`measured`, its max QPS and knee), with no
                    # predictions, and left out of the verdict as a cut ramp is; the run goes on.
                    why = f"predicting it failed: {type(exc).__name__}: {exc}"
                    error = why if error is None else f"{error}; {why}"
                    predicted, comparison = {"max_qps_under_slo": None}, []
                if error:
                    say(f"rep {rep}: {label} left out of the verdict: {error}")
                runs.append(
                    {
                        "rep": rep,
                        "label": label,
                        "error": error,
                        "max_batch_size": n,
                        "max_queue_delay_ms": d,
                        "measured_max_qps": measured["max_qps_under_slo"],
                        "measured_knee_qps": measured["knee_qps"],
                        "predicted_max_qps_on_steps": predicted["max_qps_under_slo"],
                        "comparison": comparison,
                        "measured": measured,  # the predictions are in `comparison`; rerun them from the inputs
                    }
                )
    except Exception as exc:
        # No traceback, and what was measured before it is written all the same (--json), with why it stopped.
        own = isinstance(exc, (CalibrationCut, SearchTooLarge))  # in this script's words already
        stopped = f"{phase}: " + (str(exc) if own else f"{type(exc).__name__}: {exc}")
        refused = isinstance(exc, SearchTooLarge)
    finally:
        stop_all()
        args.processes.stop()

    doc = {
        "schema": SCHEMA,
        "error": None if stopped is None else f"stopped at {stopped}",
        "created": started,
        "host": {"cpus": os.cpu_count(), "loadavg_at_start": loadavg_start, "loadavg_at_end": os.getloadavg()},
        "config": {k: v for k, v in vars(args).items() if k not in NOT_CONFIG},
        "profile": profile_doc,
        "cpu_stage": cpu_doc,
        "overhead": overhead_doc,
        "calibrations": calibrations[1:],
        "tune": tuned_doc,
        "tuned_setting": None if tuned is None else {"max_batch_size": tuned[0], "max_queue_delay_ms": tuned[1]},
        "runs": runs,
        "verdict": verdict(runs),
        # What the prediction's batch spread was drawn from: "batches" (one count per batch), "requests"
        # (a batch of n counted n times: calibrations without the trailer's batch size), or null (none).
        "batch_spread": None if noise is None else noise.basis,
        "wall_s": time.monotonic() - t0,
    }
    doc["config"]["slo_p99_ms"] = args.slo_ms
    if stopped is not None:
        if runs:
            print_report(doc)
        failed = write_final(doc, [("--json", args.json, report.write_json)])
        if failed:
            say(failed)
        say(f"stopped at {stopped}" + (f"; what was measured before it is in {args.json}" if args.json and not failed
                                       else ""))  # fmt: skip
        return 2 if refused else 1
    print_report(doc)
    failed = write_final(doc, [("--json", args.json, report.write_json), ("--plot", args.plot, plot)])
    if failed:
        say(failed)
        return 1
    if unsaved:
        say(f"{', '.join(unsaved)} failed when written (said above, with where each document went)")
        return 1
    cut = [f"rep {run['rep']} {run['label']}" for run in runs if run["error"]]
    if cut:
        say(f"cut short, left out of the verdict: {', '.join(cut)} (their `error` in the runs)")
        return 1
    return 0


def _failed_run(rep: int, label: str, max_batch_size: int, delay_ms: float, error: str) -> dict:
    """A validation ramp that failed before its first step: a run with its `error`, nothing measured."""
    return {
        "rep": rep,
        "label": label,
        "error": error,
        "max_batch_size": max_batch_size,
        "max_queue_delay_ms": delay_ms,
        "measured_max_qps": None,
        "measured_knee_qps": None,
        "predicted_max_qps_on_steps": None,
        "comparison": [],
        "measured": None,
    }


def verdict(runs: list[dict]) -> dict:
    """The verdict over the whole ramps. A ramp cut short (`error` set) is left out, as
    bench/compare.py leaves such a run out of its summary: its max QPS is the last step it
    reached, not where the server fails, and its knee is not known. `tuned_at_least_default`
    is True only when every repetition's two ramps are whole and tuned ≥ default in each,
    False when a whole repetition has tuned < default, else None: too few whole repetitions
    to say. The medians are over each setting's whole ramps (None without any)."""
    whole = [run for run in runs if not run.get("error")]
    below = [r for run in whole for r in run["comparison"] if r["below_knee"]]
    within = [r for r in below if r["within_tolerance"]]
    quiet = [r for r in below if r["quiet"]]
    worst = max(below, key=lambda r: abs(r["relative_error"]) if r["relative_error"] is not None else float("inf"),
                default=None)  # fmt: skip
    by_rep: dict[int, dict[str, float]] = {run["rep"]: {} for run in runs}
    for run in whole:
        by_rep[run["rep"]][run["label"]] = run["measured_max_qps"] or 0.0
    pairs = [v for v in by_rep.values() if "default" in v and "tuned" in v]
    if any(v["tuned"] < v["default"] for v in pairs):
        at_least = False
    elif pairs and len(pairs) == len(by_rep):
        at_least = True
    else:
        at_least = None

    def median(label: str) -> float | None:
        # Of repetitions, the median as the compare harness takes it (statistics.median): of an even
        # count the mean of the middle two. Nearest-rank is for the percentiles of a run's samples.
        values = [v[label] for v in by_rep.values() if label in v]
        return float(np.median(values)) if values else None

    return {
        "default_max_qps": [by_rep[r].get("default") for r in sorted(by_rep)],
        "tuned_max_qps": [by_rep[r].get("tuned") for r in sorted(by_rep)],
        "tuned_at_least_default": at_least,
        "reps_whole": len(pairs),
        "runs_left_out": [{k: run[k] for k in ("rep", "label", "error")} for run in runs if run.get("error")],
        # The median over repetitions: one noisy repetition moves it less than it moves "every".
        "default_median_max_qps": median("default"),
        "tuned_median_max_qps": median("tuned"),
        "steps_below_knee": len(below),
        "steps_within": len(within),
        "p99_within_tolerance_below_knee": bool(below) and len(within) == len(below),
        "quiet_steps_below_knee": len(quiet),
        "quiet_steps_within": sum(r["within_tolerance"] for r in quiet),
        "fixed_overhead_steps_within": _steps_within(below, "fixed_overhead"),
        "steady_batch_steps_within": _steps_within(below, "steady_batch"),
        "batcher_steps_within": sum(
            r["batcher_relative_error"] is not None and abs(r["batcher_relative_error"]) <= TOLERANCE for r in below
        ),
        "worst_error": None if worst is None else {k: worst[k] for k in ("offered_qps", "relative_error")},
    }


def _save(doc: dict, option: str, path: Path) -> bool:
    """A mid-run output (--save-*), written as the final ones are (`write_final`): one that fails
    keeps its document in a temporary file, named on stderr, and the run goes on, since what it
    measures next is worth more than this file; the run then exits 1. True when written."""
    from wok.bench import report

    failed = write_final(doc, [(option, path, report.write_json)])
    if failed:
        say(failed)
    return failed is None


def search_config(args):
    """The search's `SearchConfig` from this script's options (its warm-up is SearchConfig's own)."""
    from wok.bench.tune import SearchConfig

    return SearchConfig(slo_p99_ms=args.slo_ms, arrival=args.arrival, seed=args.seed,
                        duration_s=_seconds(args.sim_duration))  # fmt: skip


def default_seconds(args) -> tuple[int, float]:
    """--default as the search takes it: (max_batch_size, delay in s)."""
    return args.default_setting[0], 1e-3 * args.default_setting[1]


def search_names(args):
    """How the search's refusal (`wok.bench.tune.SearchTooLarge`) names its inputs: this script's options."""
    from wok.bench.tune import SearchNames

    warmup = f"the search's {search_config(args).warmup_s:g} s warm-up"
    return SearchNames(arrival="--arrival", length=f"{warmup} + --sim-duration {args.sim_duration}",
                       shorter="--sim-duration", grid="--max-batch-sizes, --delays and --default",
                       fixed_warmup=warmup)  # fmt: skip


def check_search(profile, args, cpu=None) -> None:
    """`wok.bench.tune.SearchTooLarge`, in this script's options, when the search (`wok.bench.tune.tune`
    on `profile`, with `cpu` as it will be given) would reach a simulated step over the simulator's
    arrival cap: `wok.bench.tune.check_fits`, as `tune` refuses it, but before the run measures what
    the search does not need. Its busiest step is at the highest ceiling of the grid, which `profile`'s
    α, β (or, with the CPU stage, the server's batch time and the stage's bound) decide; the SLO does
    not move it."""
    from wok.bench.tune import check_fits

    check_fits(profile, search_config(args), args.sizes, args.delays_s, default_seconds(args), cpu=cpu,
               names=search_names(args))  # fmt: skip


def _seconds(spec: str) -> float:
    """A duration option's seconds; a ValueError for one that is not finite ('1e400ms'), which
    would otherwise fail only in the search or the predictions, after minutes of measuring."""
    from wok.bench.arrivals import parse_duration

    seconds = parse_duration(spec)
    if not np.isfinite(seconds):
        raise ValueError(f"expected a finite duration; got {spec!r}")
    return seconds


if __name__ == "__main__":
    sys.exit(main())
