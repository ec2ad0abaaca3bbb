"""A discrete-event simulator of wok's batcher: the same flush rule, with a modelled batch time.

Requests arrive from the bench's own arrival processes and wait in one FIFO queue (a
bounded one if `max_queue_size` is set: beyond it they are rejected). When an instance is
free, a batch leaves as soon as the queue holds `max_batch_size` requests or its oldest has
waited `max_queue_delay_s`; it holds up to `max_batch_size` requests and occupies its
instance for T(n) = α + β·n, or a time drawn from measured batch times (`batch_samples`).
A request's latency is its wait and its batch's time, plus an optional per-request
overhead drawn from measured samples (`overhead_samples_s`): everything a real request
spends outside the batcher (client, gRPC, decode, encode), which does not change the
batcher's own schedule. Time jumps from event to event (an arrival, a flush deadline,
an instance coming free), so any arrival rate is simulated exactly and batches never
overlap on one instance: the two things a time-stepped simulation gets wrong.

Optionally a CPU stage (`cpu_in_s`, `cpu_out_s`, `cores`, `background_*`,
`batch_overhead_s`): the server's event loop as one server in front of the batcher (c_in
per request: receive, decode, submit) and behind it (c_out per request: resolve, encode,
send; a waiting answer goes before a waiting new request), and the loop, the busy
instances and a background demand (other threads and processes: gRPC's, the load
generator's) sharing `cores` cores: whenever more is runnable than there are cores, each
runnable one runs at cores / demand of full speed (processor sharing). Then the loop is a
queue of its own, a batch slows when the machine is busy, and the server has a CPU-bound
ceiling. docs/simulate.md has the model and the theory it is checked against.

`simulate_ramp` writes the bench's schema (`wok.bench/2`, `config.source = "simulate"`,
plus `utilization`, and `loop_utilization` with the CPU stage, per step; like the bench's
server-side figures they cover the measured window only), so simulated and measured ramps
compare directly.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import asdict, dataclass, field, fields

import numpy as np

from . import analysis
from .arrivals import parse_arrivals, window_rate
from .payloads import integer_refusal

REJECTED = "RESOURCE_EXHAUSTED"

# The most arrivals one step may expect (its highest rate × warm-up and window). At its peak a
# step holds about 145 bytes of arrays per arrival (tracemalloc, 10⁶ Poisson arrivals) and takes
# 1.5–2 µs of Python each, so this is already some 14 GB and minutes per step, far beyond a real
# ramp (600 s at 10,000 QPS is 6·10⁶): a larger product is a slip in the units, which would
# otherwise end in a MemoryError or the kernel's OOM killer.
MAX_ARRIVALS_PER_STEP = 1e8


@dataclass(frozen=True, kw_only=True)
class CpuFields:
    """The CPU stage (all 0: none, the batcher alone); keyword-only fields of BatcherModel."""

    # Event-loop CPU per request before the batcher and after its batch, in seconds; one loop
    # (answers before new requests).
    cpu_in_s: float = 0.0
    cpu_out_s: float = 0.0
    # Cores the loop, the busy instances and the background share; 0: each runs at full speed.
    cores: float = 0.0
    # Background demand on those cores: a constant part, in cores, and CPU per request, in
    # seconds, which the offered rate λ turns into λ·background_cpu_s cores.
    background_cores: float = 0.0
    background_cpu_s: float = 0.0
    # Work added to every batch (in the server: the hop to the worker, cold caches), seconds.
    batch_overhead_s: float = 0.0


CPU_FIELDS = tuple(f.name for f in fields(CpuFields))


@dataclass(frozen=True)
class BatcherModel(CpuFields):
    alpha_s: float  # fixed cost of a batch, seconds
    beta_s: float  # cost per sample, seconds
    max_batch_size: int
    max_queue_delay_s: float
    instances: int = 1
    max_queue_size: int = 0  # 0: unbounded
    # Measured batch times, ((batch size, (seconds, ...)), ...): a batch of a measured size
    # takes one of its sizes' times at random; any other size n takes α + β·n times the
    # ratio of a random sample to α + β·m at the nearest measured size m (the measured spread,
    # scaled along the fit). Empty: always α + β·n.
    batch_samples: tuple[tuple[int, tuple[float, ...]], ...] = ()
    # Per-request time outside the batcher, in seconds, one drawn at random per request.
    overhead_samples_s: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        times = {"alpha_s": self.alpha_s, "beta_s": self.beta_s, "max_queue_delay_s": self.max_queue_delay_s}
        for name, value in times.items():
            # An infinite batch time or delay would leave accepted requests without a completion time.
            if not math.isfinite(value):
                raise ValueError(f"{name}: expected a finite number of seconds; got {value}")
        if self.alpha_s < 0 or self.beta_s < 0 or self.alpha_s + self.beta_s <= 0:
            raise ValueError(
                f"batch time α + β·n: expected α, β ≥ 0 and α + β > 0; got α={self.alpha_s}, β={self.beta_s}"
            )
        # Counts, as the server's settings hold them: a max_batch_size of 2.0 or 2.5 passed `< 1` and ended the
        # simulation in a TypeError, a max_queue_size of 2.5 was taken, True was taken as 1.
        for name, least in (("max_batch_size", 1), ("instances", 1), ("max_queue_size", 0)):
            if (refusal := integer_refusal(name, getattr(self, name), least)) is not None:
                raise ValueError(refusal)
        if self.max_queue_delay_s < 0:
            raise ValueError(f"max_queue_delay_s: expected a number of seconds >= 0; got {self.max_queue_delay_s}")
        # NaN passed `min(times) <= 0` (and min() of (1.0, nan) is 1.0), inf a batch that never ends: a sample
        # drawn as either left its requests without a completion time.
        for n, times in self.batch_samples:
            # A size is a count of requests, as max_batch_size is.
            if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
                raise ValueError(f"batch_samples: expected integer sizes n ≥ 1; got {n!r}")
            bad = next((t for t in times if not (math.isfinite(t) and t > 0)), None)
            if not times or bad is not None:
                got = "none" if bad is None else bad  # not `bad or 'none'`: a time of 0 is a time
                raise ValueError(f"batch_samples: size {n}: expected finite times > 0 s; got {got}")
        bad = next((t for t in self.overhead_samples_s if not (math.isfinite(t) and t >= 0)), None)
        if bad is not None:
            raise ValueError(f"overhead_samples_s: expected finite times ≥ 0 s; got {bad}")
        cpu = {k: getattr(self, k) for k in CPU_FIELDS}
        if any(not math.isfinite(v) or v < 0 for v in cpu.values()):
            raise ValueError(f"the CPU stage's times and cores: expected finite numbers ≥ 0; got {cpu}")

    @property
    def staged(self) -> bool:
        """Whether the CPU stage is on (the loop has work, or the cores are bounded)."""
        return self.cpu_in_s > 0 or self.cpu_out_s > 0 or self.cores > 0

    def batch_time(self, n: int) -> float:
        """The fitted T(n) = α + β·n."""
        return self.alpha_s + self.beta_s * n

    def mean_batch_time(self, n: int) -> float:
        """The expected time of a batch of n at full speed: the fit, or the mean of what the samples
        give, plus `batch_overhead_s`."""
        if not self.batch_samples:
            return self.batch_time(n) + self.batch_overhead_s
        m, times = self._nearest(n)
        if m == n:
            return float(np.mean(times)) + self.batch_overhead_s
        return self.batch_time(n) * float(np.mean(times)) / self.batch_time(m) + self.batch_overhead_s

    def background_demand(self, rate_qps: float) -> float:
        """The background's cores at an offered rate: background_cores + λ·background_cpu_s."""
        return self.background_cores + rate_qps * self.background_cpu_s

    def cpu_ceiling_qps(self, n: int) -> float:
        """An upper bound on the throughput the CPU stage allows with batches of n: the loop's
        1 / (c_in + c_out) and, with bounded cores, cores / (the loop's and the batch's CPU per
        request). The background is left out (under processor sharing its share depends on
        what else runs), so the bound holds with it too. Infinite without a CPU stage."""
        loop = self.cpu_in_s + self.cpu_out_s
        bound = 1.0 / loop if loop > 0 else math.inf
        if self.cores > 0:
            bound = min(bound, self.cores / (loop + self.mean_batch_time(n) / n))
        return bound

    def _nearest(self, n: int) -> tuple[int, tuple[float, ...]]:
        # Nearest in ratio (batch times grow with n), the smaller size on a tie.
        return min(self.batch_samples, key=lambda e: (abs(math.log(e[0] / n)), e[0]))

    def batch_sampler(self, rng: np.random.Generator):
        """A function n -> one batch's time."""
        if not self.batch_samples:
            return self.batch_time
        table: dict[int, tuple[np.ndarray, float]] = {}

        def draw(n: int) -> float:
            entry = table.get(n)
            if entry is None:
                m, times = self._nearest(n)
                scale = 1.0 if m == n else self.batch_time(n) / self.batch_time(m)
                entry = table[n] = (np.asarray(times, dtype=np.float64), scale)
            times, scale = entry
            return float(times[rng.integers(len(times))]) * scale

        return draw


@dataclass
class Run:
    done: np.ndarray  # completion time per arrival (NaN if rejected)
    rejected: np.ndarray  # bool per arrival
    batch_sizes: list[int]
    busy_s: float  # instance-seconds spent on batches within [since, until)
    # With the CPU stage: when each request joined the batcher's queue (left the loop's first
    # pass; NaN if rejected), and the loop's busy seconds within [since, until).
    enqueued: np.ndarray | None = None
    loop_busy_s: float = 0.0
    batch_starts: list[float] = field(default_factory=list)  # when each batch of `batch_sizes` left
    # When each request's batch left the queue (NaN if rejected): its wait in the queue ends there.
    started: np.ndarray | None = None


def _overlap(start: float, end: float, since: float, until: float) -> float:
    """The length of [start, end) inside [since, until)."""
    return max(0.0, min(end, until) - max(start, since))


def simulate(
    arrivals: np.ndarray,
    model: BatcherModel,
    until: float | None = None,
    rng: np.random.Generator | None = None,
    free_at: list[float] | None = None,
    since: float = 0.0,
) -> Run:
    """Run the batcher over sorted arrival times; every accepted request is served.

    `rng` draws the sampled batch times and overheads (a fixed seed when not given).
    `free_at`: when each instance comes free, to continue from a moment with nothing queued
    (wok demo --simulate); by default every instance is free from time 0.
    `since` and `until`: the window the busy times count (the measured one, warm-up left out).
    """
    rng = np.random.default_rng(0) if rng is None else rng
    window = (since, math.inf if until is None else until)
    if model.staged:
        run = _simulate_staged(arrivals, model, until, rng, free_at, window)
    else:
        run = _simulate_batcher(arrivals, model, rng, free_at, window)
    if model.overhead_samples_s:
        # Outside the batcher: it shifts when a request's answer arrives, not when its batch ran.
        served = ~run.rejected
        extra = np.asarray(model.overhead_samples_s, dtype=np.float64)
        run.done[served] += extra[rng.integers(len(extra), size=int(served.sum()))]
    return run


def _simulate_batcher(arrivals, model: BatcherModel, rng, free_at, window) -> Run:
    """The batcher alone: every request joins the queue at its arrival."""
    batch_time = model.batch_sampler(rng)
    extra = model.batch_overhead_s
    n = len(arrivals)
    done = np.full(n, np.nan)
    rejected = np.zeros(n, dtype=bool)
    started = np.full(n, np.nan)
    queue: deque[int] = deque()
    free_at = [0.0] * model.instances if free_at is None else list(free_at)  # a heap of when instances come free
    heapq.heapify(free_at)
    sizes: list[int] = []
    starts: list[float] = []
    busy = 0.0
    i = 0
    t = 0.0
    while i < n or queue:
        next_arrival = arrivals[i] if i < n else math.inf
        if queue:
            # An instance must be free; the batch leaves when full or when the oldest is due.
            full_at = arrivals[queue[0]] + model.max_queue_delay_s
            if len(queue) >= model.max_batch_size:
                full_at = t
            flush_at = max(free_at[0], full_at, t)
        else:
            flush_at = math.inf
        if next_arrival <= flush_at and i < n:
            t = next_arrival
            if model.max_queue_size and len(queue) >= model.max_queue_size:
                rejected[i] = True
            else:
                queue.append(i)
            i += 1
            continue
        t = flush_at
        heapq.heappop(free_at)
        k = min(len(queue), model.max_batch_size)
        members = [queue.popleft() for _ in range(k)]
        service = batch_time(k) + extra
        done[members] = t + service
        started[members] = t
        heapq.heappush(free_at, t + service)
        sizes.append(k)
        starts.append(t)
        busy += _overlap(t, t + service, *window)
    return Run(done, rejected, sizes, busy, batch_starts=starts, started=started)


def _simulate_staged(arrivals, model: BatcherModel, until, rng, free_at, window) -> Run:
    """The loop in front of and behind the batcher, all sharing the cores (the module's doc).

    State: the loop's two FIFOs of jobs (first passes, second passes), the job it runs and
    the work left on it; the batcher's queue; per instance the work left on its batch and the
    batch's members. The loop takes a waiting second pass before a waiting first pass (it does
    not interrupt the job it runs): a finished batch's answers are resumed together, ahead of
    requests not yet read, so past the loop's ceiling answers keep leaving at its rate and the
    first passes' queue is what grows. Work is in seconds at full speed; between two events
    every runnable party runs at `speed`.
    At equal times events are taken in this order: the loop finishing a job, an instance
    finishing a batch, an arrival, a flush (so a request that reaches the queue at the
    moment a batch leaves goes with it, as in the batcher-only simulation); an idle loop
    takes its next job only after all of them.
    """
    batch_time = model.batch_sampler(rng)
    n = len(arrivals)
    done = np.full(n, np.nan)
    enqueued = np.full(n, np.nan)
    started_at = np.full(n, np.nan)
    rejected = np.zeros(n, dtype=bool)
    c_in, c_out, extra = model.cpu_in_s, model.cpu_out_s, model.batch_overhead_s
    span = until if until is not None else (float(arrivals[-1]) if n else 0.0)
    bg = model.background_demand(n / span if span > 0 else 0.0)
    cores = model.cores
    k_max, delay, bound = model.max_batch_size, model.max_queue_delay_s, model.max_queue_size
    m = model.instances
    w_start, w_end = window
    first: deque[int] = deque()  # requests waiting for their first pass
    second: deque[int] = deque()  # ... for their second
    job: tuple[int, bool] | None = None  # (request, True for its second pass) on the loop now
    loop_left = 0.0
    queue: deque[int] = deque()
    left = [0.0] * m  # work left on each instance's batch
    members: list[list[int] | None] = [None] * m
    started = [0.0] * m
    if free_at is not None:  # busy with earlier work (no requests of this run) until then
        for j, f in enumerate(free_at):
            if f > 0:
                left[j], members[j] = float(f), []
    sizes: list[int] = []
    starts: list[float] = []
    busy = loop_busy = 0.0
    i = 0
    t = 0.0
    inf = math.inf
    while True:
        running = [j for j in range(m) if members[j] is not None]
        t_arr = float(arrivals[i]) if i < n else inf
        t_flush = inf
        if queue and len(running) < m:
            t_flush = t if len(queue) >= k_max else max(t, enqueued[queue[0]] + delay)
        if job is None and (second or first) and t_arr > t and t_flush > t:
            # The loop takes its next job only once every event due at this instant is in: a
            # batch that finishes as the loop's last job does hands over its answers first.
            demand = len(running) + bg
            speed = 1.0 if cores <= 0 or demand <= cores else cores / demand
            if not any(t + left[j] / speed <= t for j in running):
                job = (second.popleft(), True) if second else (first.popleft(), False)
                loop_left = c_out if job[1] else c_in
        demand = len(running) + (job is not None) + bg
        speed = 1.0 if cores <= 0 or demand <= cores else cores / demand
        t_loop = t + loop_left / speed if job is not None else inf
        t_inst, j_inst = inf, -1
        for j in running:
            tj = t + left[j] / speed
            if tj < t_inst:
                t_inst, j_inst = tj, j
        t_next = min(t_loop, t_inst, t_arr, t_flush)
        if t_next == inf:
            break
        if t_next > t:
            work = (t_next - t) * speed
            if job is not None:
                loop_left -= work
                loop_busy += max(0.0, min(t_next, w_end) - max(t, w_start))  # _overlap, inlined: per event
            for j in running:
                left[j] -= work
            t = t_next
        if t_loop <= t_next:
            (r, out), job = job, None
            if out:
                done[r] = t
            elif bound and len(queue) >= bound:
                rejected[r] = True
            else:
                queue.append(r)
                enqueued[r] = t
        elif t_inst <= t_next:
            batch, members[j_inst] = members[j_inst], None
            if batch:  # (an empty one is the earlier work of `free_at`)
                busy += _overlap(started[j_inst], t, *window)
                second.extend(batch)
        elif t_arr <= t_next:
            first.append(i)
            i += 1
        else:
            j = members.index(None)
            k = min(len(queue), k_max)
            members[j] = [queue.popleft() for _ in range(k)]
            started_at[members[j]] = t
            left[j] = batch_time(k) + extra
            started[j] = t
            sizes.append(k)
            starts.append(t)
    return Run(done, rejected, sizes, busy, enqueued, loop_busy, starts, started_at)


@dataclass
class SimConfig:
    model: BatcherModel
    steps: list[float]
    step_duration_s: float
    warmup_s: float = 0.0
    arrival: str = "poisson"
    slo_p99_ms: float = 200.0
    seed: int = 0
    knee_threshold: float = 0.5
    # The wok.profile/1 file α and β were read from (`wok simulate --profile`), recorded as `wok tune` records its
    # own; None: given (--alpha/--beta or their defaults).
    profile: str | None = None
    # Where model.max_batch_size came from (`wok simulate`): "given" (--max-batch-size), "profile" (the --profile
    # document's model.max_batch_size) or "default" (1); None: not said (a config built in code, `wok tune`'s).
    max_batch_size_source: str | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.step_duration_s) and self.step_duration_s > 0):
            raise ValueError(f"step_duration_s: expected a finite duration > 0 s; got {self.step_duration_s}")
        if not (math.isfinite(self.warmup_s) and self.warmup_s >= 0):
            raise ValueError(f"warmup_s: expected a finite duration >= 0 s; got {self.warmup_s}")
        if not (math.isfinite(self.slo_p99_ms) and self.slo_p99_ms > 0):
            raise ValueError(f"slo_p99_ms: expected a finite number > 0 (ms); got {self.slo_p99_ms}")
        if (refusal := integer_refusal("seed", self.seed, 0)) is not None:
            raise ValueError(refusal)
        seconds = self.warmup_s + self.step_duration_s
        # The busiest step's process, kept for `simulate_step`: a trace file is read once, not
        # once here and again per step (`wok tune` builds a config per simulated step). Not a
        # field: asdict() (the result's config) and replace() leave it out.
        self._top = (
            None
            if not self.steps
            else (max(self.steps), parse_arrivals(self.arrival, max(self.steps), duration_s=seconds))
        )
        expected = 0.0 if self._top is None else arrival_count(self._top[1], seconds)
        if expected > MAX_ARRIVALS_PER_STEP:
            raise ValueError(
                f"steps x (warmup_s + step_duration_s) with arrival {self.arrival!r}: expected at most "
                f"{MAX_ARRIVALS_PER_STEP:.0e} arrivals per step; got {expected:.3g}"
            )


def arrival_count(arrivals, seconds: float) -> float:
    """The arrivals a process expects in [0, seconds): its own count, not its mean rate × seconds,
    which a burst's peak (base·T + A·σ·√(2π) per bump in the window) or a dense trace far exceeds."""
    cumulative = getattr(arrivals, "cumulative", None)
    return float(cumulative(seconds)) if cumulative is not None else arrivals.mean_rate * seconds


def simulate_step(cfg: SimConfig, qps: float, rng: np.random.Generator) -> dict:
    total = cfg.warmup_s + cfg.step_duration_s
    top = cfg._top
    arrivals = top[1] if top is not None and top[0] == qps else parse_arrivals(cfg.arrival, qps, duration_s=total)
    times = arrivals.times(total, rng)
    w = cfg.warmup_s
    run = simulate(times, cfg.model, until=total, rng=rng, since=w)
    keep = times >= w
    completed_ok = int((~run.rejected & (run.done >= w) & (run.done < total)).sum())
    # For the window's requests only, sent doubles as intended, and the codes are references to
    # two strings: as numpy text each was 72 bytes (RESOURCE_EXHAUSTED), and the step held three
    # such arrays at once, most of its ~350 bytes per arrival.
    intended = times[keep] - w
    codes = np.array(["OK", REJECTED], dtype=object)[run.rejected[keep].view(np.uint8)]
    step = analysis.step_result(
        offered_qps=window_rate(arrivals, w, total),
        duration_s=cfg.step_duration_s,
        intended_s=intended,
        sent_s=intended,
        done_s=run.done[keep] - w,
        codes=codes,
        completed_ok=completed_ok,
    )
    step["nominal_qps"] = qps
    # The server's figures cover the client's window, as the bench's /metrics scrapes do.
    # At most 1: the busy time is a sum of overlaps whose rounding gave 1.0000000000000444.
    step["utilization"] = min(1.0, run.busy_s / (cfg.step_duration_s * cfg.model.instances))
    sizes = np.asarray(run.batch_sizes)[_in_window(run.batch_starts, w, total)]
    step["mean_batch_size"] = float(sizes.mean()) if len(sizes) else None
    step["queue_ms"] = _queue_ms(run, times, w, total)
    if cfg.model.staged:
        step["loop_utilization"] = min(1.0, run.loop_busy_s / cfg.step_duration_s)
    return step


def _queue_ms(run: Run, arrivals: np.ndarray, since: float, until: float) -> dict | None:
    """The server's `queue_ms`, simulated: mean and P99 (nearest-rank) of the waits in the batcher's
    queue, from joining it (the arrival, or the loop's first pass with the CPU stage) to the batch
    leaving, of the requests whose batch left in the window, as `mean_batch_size` counts batches;
    None when none did."""
    left = run.started
    joined = arrivals if run.enqueued is None else run.enqueued
    counted = (left >= since) & (left < until)  # NaN (rejected) is in no window
    if not counted.any():
        return None
    waits = analysis.latency_summary(1e3 * (left[counted] - joined[counted]))
    return {"mean": waits["mean"], "p99": waits["p99"]}


def _in_window(times: list[float], since: float, until: float) -> np.ndarray:
    t = np.asarray(times, dtype=np.float64)
    return (t >= since) & (t < until)


def simulate_ramp(cfg: SimConfig) -> dict:
    rng = np.random.default_rng(cfg.seed)
    steps = [simulate_step(cfg, q, rng) for q in cfg.steps]
    config = {**asdict(cfg), "source": "simulate"}
    # Samples stay out of the result's config: their count and spread say what was used. Nearest-rank,
    # as every percentile of the schema (np.median and np.quantile interpolate between two samples).
    summary = analysis.latency_summary
    config["model"]["batch_samples"] = {
        str(n): {"count": len(t), "median_s": summary(t)["p50"]} for n, t in cfg.model.batch_samples
    }
    o = cfg.model.overhead_samples_s
    config["model"]["overhead_samples_s"] = (
        {"count": len(o), "median_s": summary(o)["p50"], "p99_s": summary(o)["p99"]} if o else None
    )
    return analysis.ramp_result(
        steps=steps, slo_p99_ms=cfg.slo_p99_ms, config=config, knee_threshold=cfg.knee_threshold
    )
