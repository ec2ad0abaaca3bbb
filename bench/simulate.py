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

`simulate_ramp` writes the bench's schema (`wok.bench/1`, `config.source = "simulate"`,
plus `utilization` per step), so simulated and measured ramps compare directly.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import asdict, dataclass

import numpy as np

from . import analysis
from .arrivals import parse_arrivals

REJECTED = "RESOURCE_EXHAUSTED"


@dataclass(frozen=True)
class BatcherModel:
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
        if self.alpha_s < 0 or self.beta_s < 0 or self.alpha_s + self.beta_s <= 0:
            raise ValueError(f"batch time α + β·n needs α, β ≥ 0 and α + β > 0; got α={self.alpha_s}, β={self.beta_s}")
        if self.max_batch_size < 1 or self.instances < 1 or self.max_queue_size < 0 or self.max_queue_delay_s < 0:
            raise ValueError(
                f"invalid batcher settings: max_batch_size={self.max_batch_size}, instances={self.instances}, "
                f"max_queue_size={self.max_queue_size}, max_queue_delay_s={self.max_queue_delay_s}"
            )
        for n, times in self.batch_samples:
            if n < 1 or not times or min(times) <= 0:
                raise ValueError(f"batch_samples: size {n} needs n ≥ 1 and positive times")
        if self.overhead_samples_s and min(self.overhead_samples_s) < 0:
            raise ValueError("overhead_samples_s must be ≥ 0")

    def batch_time(self, n: int) -> float:
        """The fitted T(n) = α + β·n."""
        return self.alpha_s + self.beta_s * n

    def mean_batch_time(self, n: int) -> float:
        """The expected time of a batch of n: the fit, or the mean of what the samples give."""
        if not self.batch_samples:
            return self.batch_time(n)
        m, times = self._nearest(n)
        if m == n:
            return float(np.mean(times))
        return self.batch_time(n) * float(np.mean(times)) / self.batch_time(m)

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
    busy_s: float  # instance-seconds spent on batches that started before `until`


def simulate(
    arrivals: np.ndarray,
    model: BatcherModel,
    until: float | None = None,
    rng: np.random.Generator | None = None,
    free_at: list[float] | None = None,
) -> Run:
    """Run the batcher over sorted arrival times; every accepted request is served.

    `rng` draws the sampled batch times and overheads (a fixed seed when not given).
    `free_at`: when each instance comes free, to continue from a moment with nothing queued
    (wok demo --simulate); by default every instance is free from time 0.
    """
    rng = np.random.default_rng(0) if rng is None else rng
    batch_time = model.batch_sampler(rng)
    n = len(arrivals)
    done = np.full(n, np.nan)
    rejected = np.zeros(n, dtype=bool)
    queue: deque[int] = deque()
    free_at = [0.0] * model.instances if free_at is None else list(free_at)  # a heap of when instances come free
    heapq.heapify(free_at)
    sizes: list[int] = []
    busy = 0.0
    horizon = math.inf if until is None else until
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
        service = batch_time(k)
        done[members] = t + service
        heapq.heappush(free_at, t + service)
        sizes.append(k)
        if t < horizon:
            busy += min(service, horizon - t)
    if model.overhead_samples_s:
        # Outside the batcher: it shifts when a request's answer arrives, not when its batch ran.
        served = ~rejected
        extra = np.asarray(model.overhead_samples_s, dtype=np.float64)
        done[served] += extra[rng.integers(len(extra), size=int(served.sum()))]
    return Run(done, rejected, sizes, busy)


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


def simulate_step(cfg: SimConfig, qps: float, rng: np.random.Generator) -> dict:
    total = cfg.warmup_s + cfg.step_duration_s
    arrivals = parse_arrivals(cfg.arrival, qps, duration_s=total)
    times = arrivals.times(total, rng)
    run = simulate(times, cfg.model, until=total, rng=rng)
    w = cfg.warmup_s
    keep = times >= w
    codes = np.where(run.rejected, REJECTED, "OK")
    ok = ~run.rejected
    in_window = ok & (run.done >= w) & (run.done < total)
    step = analysis.step_result(
        offered_qps=arrivals.mean_rate,
        duration_s=cfg.step_duration_s,
        intended_s=times[keep] - w,
        sent_s=times[keep] - w,
        done_s=run.done[keep] - w,
        codes=codes[keep],
        completed_ok=int(in_window.sum()),
    )
    step["nominal_qps"] = qps
    step["utilization"] = run.busy_s / (total * cfg.model.instances)
    step["mean_batch_size"] = float(np.mean(run.batch_sizes)) if run.batch_sizes else None
    return step


def simulate_ramp(cfg: SimConfig) -> dict:
    rng = np.random.default_rng(cfg.seed)
    steps = [simulate_step(cfg, q, rng) for q in cfg.steps]
    config = {**asdict(cfg), "source": "simulate"}
    # Samples stay out of the result's config: their count and spread say what was used.
    config["model"]["batch_samples"] = {
        str(n): {"count": len(t), "median_s": float(np.median(t))} for n, t in cfg.model.batch_samples
    }
    o = cfg.model.overhead_samples_s
    config["model"]["overhead_samples_s"] = (
        {"count": len(o), "median_s": float(np.median(o)), "p99_s": float(np.quantile(o, 0.99))} if o else None
    )
    return analysis.ramp_result(
        steps=steps, slo_p99_ms=cfg.slo_p99_ms, config=config, knee_threshold=cfg.knee_threshold
    )
