"""The server's own view of a step, from two scrapes of its Prometheus /metrics.

Works with any server that exports wok's metric names; a server that does not (Triton,
MLServer) or cannot be reached simply yields no server figures.
"""

from __future__ import annotations

import math
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

STAGE = "wok_request_stage_duration_seconds"
E2E = "wok_request_duration_seconds"
BATCH = "wok_batch_size"
FLUSHES = "wok_batch_flushes"
LOOP_LAG = "wok_event_loop_lag_seconds"
# ModelInfer calls that ended (deadline or cancel) inside grpc.aio before wok's handler ran: in no other counter.
ENDED_BEFORE_HANDLER = "wok_calls_ended_before_handler_total"
GPU = (
    "wok_gpu_utilization_ratio",
    "wok_gpu_memory_used_bytes",
    "wok_gpu_memory_total_bytes",
    "wok_gpu_temperature_celsius",
)
# Of several replicas' gauges, these add up to the fleet's (requests waiting, batches running); any
# other gauge is the largest replica's (the GPU gauges: replicas on one host read the same devices).
SUMMED_GAUGES = ("wok_queue_depth", "wok_inflight_batches")
# A restart shows here first: a counter's fall is seen only when the new process has not caught up yet.
START_TIME = "process_start_time_seconds"
# How early a wok's START_TIME reads (USER_HZ, the clock tick /proc counts a process's start in: 100 a second
# on every Linux). A process forked within it before a window opened cannot have answered anything before.
START_TIME_TICK = 0.01
# The families whose samples only grow while the process lives, and the part of them that does not.
CUMULATIVE = ("counter", "histogram", "summary")


@dataclass
class Snapshot:
    """Cumulative series of one scrape, keyed by (sample name, sorted label items)."""

    values: dict[tuple[str, tuple], float] = field(default_factory=dict)
    # The sample names of counters, histograms and summaries (their `_created` left out): those
    # that only grow while the process lives; every other sample is a gauge's.
    cumulative: set[str] = field(default_factory=set)

    def get(self, name: str, **labels) -> float:
        return self.values.get((name, tuple(sorted(labels.items()))), 0.0)

    def buckets(self, name: str, **labels) -> list[tuple[float, float]]:
        want = set(labels.items())
        out = []
        for (n, items), v in self.values.items():
            if n == name + "_bucket" and want <= set(items):
                le = dict(items)["le"]
                out.append((math.inf if le == "+Inf" else float(le), v))
        return sorted(out)


def scrape(url: str, timeout: float = 5.0) -> Snapshot | None:
    """The Snapshot at `url`, or None whatever the reason (`read_metrics` says which)."""
    got = read_metrics(url, timeout)
    return got if isinstance(got, Snapshot) else None


NO_ANSWER = "no answer"
NOT_PROMETHEUS = "answered, but not Prometheus text"


def read_metrics(url: str, timeout: float = 5.0) -> Snapshot | str:
    """The Snapshot at `url`, or why there is none, for the operator to read: NO_ANSWER (nothing
    listens, a timeout, a bad URL), "answered HTTP <code>" (a wrong path), or NOT_PROMETHEUS (a web
    page at the URL given). Never raises: the threads that scrape must not end on a bad answer."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            body = resp.read()
    except urllib.error.HTTPError as exc:  # before URLError, its base: the server did answer
        exc.close()
        return f"answered HTTP {exc.code}"
    except (urllib.error.URLError, OSError, ValueError):
        return NO_ANSWER
    try:
        return parse_exposition(body.decode())
    except ValueError:  # a web page, or anything not Prometheus' exposition (not UTF-8 either)
        return NOT_PROMETHEUS


def parse_exposition(body: str) -> Snapshot:
    """A Snapshot of Prometheus text exposition (what /metrics serves)."""
    snap = Snapshot()
    for family in text_string_to_metric_families(body):
        for s in family.samples:
            snap.values[(s.name, tuple(sorted(s.labels.items())))] = s.value
            if family.type in CUMULATIVE and not s.name.endswith("_created"):
                snap.cumulative.add(s.name)
    return snap


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """Prometheus' histogram_quantile over cumulative (le, count) pairs: linear within a bucket."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    total = buckets[-1][1]
    rank = q * total
    prev_le, prev_count = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if math.isinf(le):
                return prev_le
            if count == prev_count:
                return le
            return prev_le + (le - prev_le) * (rank - prev_count) / (count - prev_count)
        prev_le, prev_count = le, count
    return prev_le


def beyond_last_bound(q: float, buckets: list[tuple[float, float]]) -> bool:
    """Whether the q-quantile falls in the +Inf bucket: `histogram_quantile` then returns the last
    finite bound, a floor under the true value, not an estimate of it."""
    if not buckets or buckets[-1][1] <= 0:
        return False
    rank = q * buckets[-1][1]
    return math.isinf(next(le for le, count in buckets if count >= rank))


def whole(name: str, value: float) -> int:
    """A counter's delta that counts things (requests, batches, flushes, timer ticks) as the int it
    is: Prometheus text writes every sample as a float (`102.0`), and a result read `102.0`
    requests. Raises ValueError when it is not a whole number: not a count of wok's."""
    if not math.isfinite(value) or value != round(value):
        raise ValueError(f"{name}: expected a whole count over the window; got {value!r}")
    return round(value)


def server_view(before: Snapshot | None, after: Snapshot | None, model: str | Sequence[str]) -> dict | None:
    """What the server saw of `model` between two scrapes: stage means, queue, batching, GPU.

    `model` may be a mix's models: the per-model series are then summed over them (requests,
    stage and end-to-end histograms, batches, flushes), so the queue, batch and stage figures are
    the mix's as a whole, and `models` names the models summed. The event-loop lag, the GPU
    gauges and `ended_before_handler` (ModelInfer calls ended before wok's handler ran; None from
    a server that does not export it) are the server's whatever the model. None without both
    scrapes, or when none of the models has a series (not a wok server, or not these models).

    Counts (`requests`, `batches`, `flush_reasons`, `loop_lag_ms.samples`, `ended_before_handler`)
    are ints; a series that counts in fractions is not wok's, and `whole` raises ValueError for it."""
    if before is None or after is None:
        return None
    names = [model] if isinstance(model, str) else list(model)
    present = [m for m in names if (E2E + "_count", (("model", m),)) in after.values]
    if not present:
        return None

    def delta(name: str, **labels) -> float:
        """The counter's growth over the window, summed over the models."""
        return sum(after.get(name, model=m, **labels) - before.get(name, model=m, **labels) for m in present)

    def bucket_delta(name: str, **labels) -> list[tuple[float, float]]:
        """The histogram's cumulative buckets over the window, summed over the models."""
        summed: dict[float, float] = {}
        for m in present:
            earlier = dict(before.buckets(name, model=m, **labels))
            for le, c in after.buckets(name, model=m, **labels):
                summed[le] = summed.get(le, 0.0) + c - earlier.get(le, 0.0)
        return sorted(summed.items())

    def label_values(name: str, label: str) -> list[str]:
        """The values of `label` on `name`'s series of the models, in first-seen order."""
        seen: dict[str, None] = {}
        for (n, items), _ in after.values.items():
            d = dict(items)
            if n == name and d.get("model") in present and label in d:
                seen.setdefault(d[label])
        return list(seen)

    def quantile_ms(q: float, buckets: list[tuple[float, float]]) -> float | None:
        v = histogram_quantile(q, buckets)
        return None if v is None else 1e3 * v

    n = whole(E2E + "_count", delta(E2E + "_count"))
    out: dict = {"requests": n}
    if not isinstance(model, str):
        out["models"] = present  # the models summed: one with no series yet adds nothing
    # Before a window without completed requests returns: an overloaded server's calls may all end there.
    ended = (ENDED_BEFORE_HANDLER, (("method", "ModelInfer"),))
    out["ended_before_handler"] = (
        whole(ENDED_BEFORE_HANDLER, after.values[ended] - before.values.get(ended, 0.0))
        if ended in after.values
        else None  # a server that does not export it (a wok from before 2026-12-04)
    )
    if n <= 0:
        return out
    e2e_delta = bucket_delta(E2E)
    out["e2e_ms"] = {"mean": 1e3 * delta(E2E + "_sum") / n}
    for q, key in ((0.5, "p50"), (0.99, "p99")):
        out["e2e_ms"][key] = quantile_ms(q, e2e_delta)
    out["e2e_ms"]["p99_over_last_bound"] = beyond_last_bound(0.99, e2e_delta)
    stages = {}
    for stage in label_values(STAGE + "_count", "stage"):
        c = delta(STAGE + "_count", stage=stage)
        if c > 0:
            stages[stage] = 1e3 * delta(STAGE + "_sum", stage=stage) / c
    out["stages_ms"] = stages
    stage_buckets = {st: bucket_delta(STAGE, stage=st) for st in stages}
    out["stages_p99_ms"] = {st: quantile_ms(0.99, b) for st, b in stage_buckets.items()}
    # Stages whose P99 is only the last finite bound (the histogram cannot say how far past it).
    out["stages_p99_over_last_bound"] = sorted(st for st, b in stage_buckets.items() if beyond_last_bound(0.99, b))
    out["queue_ms"] = {"mean": stages.get("queue"), "p99": out["stages_p99_ms"].get("queue")}
    batches = whole(BATCH + "_count", delta(BATCH + "_count"))
    if batches > 0:
        out["mean_batch_size"] = delta(BATCH + "_sum") / batches
        out["batches"] = batches
    flushes = {}
    for reason in label_values(FLUSHES + "_total", "reason"):
        d = whole(FLUSHES + "_total", delta(FLUSHES + "_total", reason=reason))
        if d:
            flushes[reason] = d
    out["flush_reasons"] = flushes

    def server_delta(name: str) -> float:
        return after.get(name) - before.get(name)

    samples = whole(LOOP_LAG + "_count", server_delta(LOOP_LAG + "_count"))
    if samples > 0:
        earlier = dict(before.buckets(LOOP_LAG))
        lag_delta = [(le, c - earlier.get(le, 0.0)) for le, c in after.buckets(LOOP_LAG)]
        # The longest stall to within its bucket: the bound of the highest bucket that grew.
        grew = [le for (le, c), (_, prev) in zip(lag_delta, [(0.0, 0.0), *lag_delta]) if c > prev]
        out["loop_lag_ms"] = {
            "mean": 1e3 * server_delta(LOOP_LAG + "_sum") / samples,
            "samples": samples,
            "max_bound": 1e3 * grew[-1] if grew and math.isfinite(grew[-1]) else None,
            # A stall past the last bound has no bound to show: say so, rather than look like no data.
            "over_last_bound": bool(grew) and not math.isfinite(grew[-1]),
            "p50": quantile_ms(0.5, lag_delta),
            "p99": quantile_ms(0.99, lag_delta),
        }
    gpu = {}
    for (name, items), v in after.values.items():
        if name in GPU:
            gpu.setdefault(dict(items).get("gpu", "0"), {})[name.removeprefix("wok_gpu_")] = v
    if gpu:
        out["gpu"] = gpu
    return out


class SeriesGone(ValueError):
    """A server's counter or histogram series went between two scrapes while its process ran on."""


def series_name(key: tuple[str, tuple]) -> str:
    """A Snapshot key as Prometheus writes the series: name{label="value",...}."""
    name, items = key
    return name + ("{" + ",".join(f'{k}="{v}"' for k, v in items) + "}" if items else "")


def grew(before: Snapshot, after: Snapshot) -> tuple[dict[tuple[str, tuple], float], bool]:
    """One server's counters and histogram buckets over a window: what each grew by, and whether the
    server reset between the two scrapes (restarted: its process start time changed, or a series fell or,
    without a start time to tell, went). A reset's growth is its value after, as Prometheus' increase()
    takes it: what the server counted in the window before its reset died with the process, and is in no
    figure.

    A series that went while the start time stayed the same raises SeriesGone, naming it: wok's series
    never go while its process lives (it loads and unloads no model at run time), so the /metrics read is
    not one process's own (a proxy's, whose upstreams change), and taking it as a restart counted every
    other series' whole total since its start as the window's."""
    now = {k: v for k, v in after.values.items() if k[0] in after.cumulative}
    then = {k: v for k, v in before.values.items() if k[0] in before.cumulative}
    started = [s.values.get((START_TIME, ())) for s in (before, after)]
    gone = [k for k in then if k not in now]
    same = None not in started and started[0] == started[1]  # one process at both scrapes, by its start time
    if gone and same:
        more = f" (and {len(gone) - 1} more)" if len(gone) > 1 else ""
        raise SeriesGone(
            f"{series_name(gone[0])}{more} went between the scrapes while its process ran on (start time "
            f"{started[0]:.2f} at both): what it grew by is unknown, and a wok's series never go (a proxy's /metrics?)"
        )
    reset = (None not in started and not same) or any(now.get(k, 0.0) < v for k, v in then.items())
    if reset:
        return now, True
    return {k: v - then.get(k, 0.0) for k, v in now.items()}, False


def fleet_window(pairs: Sequence[tuple[Snapshot, Snapshot]]) -> tuple[Snapshot, list[int]]:
    """Several servers' windows, each from its two scrapes (before, after), as one Snapshot of what they
    grew by together (for `server_view` against an empty Snapshot), and the servers (indices) that reset in
    theirs. Counters and buckets add up (`grew`); of the gauges at the end, SUMMED_GAUGES add up and any
    other is the largest server's. SeriesGone from `grew` is raised naming the server (its index)."""
    growth: dict[tuple[str, tuple], float] = {}
    gauges: dict[tuple[str, tuple], float] = {}
    reset = []
    for i, (before, after) in enumerate(pairs):
        try:
            counted, was_reset = grew(before, after)
        except SeriesGone as exc:
            raise SeriesGone(f"replica {i}: {exc}") from None
        for k, v in counted.items():
            growth[k] = growth.get(k, 0.0) + v
        for k, v in after.values.items():
            if k[0] not in after.cumulative and not k[0].endswith("_created"):
                gauges[k] = gauges.get(k, 0.0) + v if k[0] in SUMMED_GAUGES else max(gauges.get(k, v), v)
        if was_reset:
            reset.append(i)
    return Snapshot({**gauges, **growth}, {name for name, _ in growth}), reset


class Fleet:
    """The server view of the replicas a bench started (`--replicas` with `--metrics-url auto`), each with
    its own /metrics: all scraped at once at both edges of a step's window (`scrape`), and their windows
    summed into one view (`view`). Counters and histogram buckets add up exactly; a replica restarted in
    the window counts from its restart (`grew`); of the gauges, SUMMED_GAUGES add up and the others are the
    largest replica's. A step in which a replica could not be scraped, or lost a series without a restart
    (`grew`'s SeriesGone), has no view (its server columns `-`), never the others' sum shown as the
    fleet's; `warnings` names those replicas and series, and the resets."""

    def __init__(self, urls: Sequence[str], say: Callable[[str], None], timeout: float = 5.0) -> None:
        self.urls = list(urls)
        self.say = say
        self.timeout = timeout
        self.unread: dict[int, list[str]] = {}  # replica → the steps it could not be scraped in
        self.gone: dict[str, list[str]] = {}  # SeriesGone's words → the steps they were said in
        self.resets: dict[int, list[str]] = {}  # replica → the steps its counters reset in

    def scrape(self) -> tuple[float, list[Snapshot | str]]:
        """When it began (Unix time), and each replica's Snapshot or why there is none (`read_metrics`),
        scraped in parallel: a paused replica's timeout must not make the others' scrapes late, nor the sum
        span several windows."""
        at = time.time()
        with ThreadPoolExecutor(len(self.urls)) as pool:
            return at, list(pool.map(lambda url: read_metrics(url, self.timeout), self.urls))

    def view(self, before: tuple | None, after: tuple | None, model: str | Sequence[str], step: str) -> dict | None:
        """`server_view` of the fleet over the step named `step`, from its two `scrape`s (None: not made),
        with `replicas` (those summed: all) and `resets` (those restarted in the window) added."""
        unread = [NO_ANSWER] * len(self.urls)
        opened, befores = before or (math.inf, unread)
        pairs, missed, fresh = [], [], set()
        for i, (b, a) in enumerate(zip(befores, (after or (0.0, unread))[1])):
            if (
                not isinstance(b, Snapshot)
                and isinstance(a, Snapshot)
                and a.get(START_TIME) >= opened - START_TIME_TICK
            ):
                # Down as the window opened (killed), and its process started after: all it counted is the
                # window's. The start time errs early, never late: by a tick (wok's), or up to 1 s (a wok from
                # before 2026-12-06, or another server, that reads the kernel's boot time in whole seconds).
                b = Snapshot()
                fresh.add(i)
            why = next((s for s in (b, a) if not isinstance(s, Snapshot)), None)
            if why is not None:
                missed.append(f"replica {i} ({self.urls[i]}: {why})")
                self.unread.setdefault(i, []).append(step)
            pairs.append((b, a))
        if missed:
            self.say(f"{step}: no server view: {', '.join(missed)} not scraped; the step's server columns are `-`")
            return None
        try:
            window, reset = fleet_window(pairs)
        except SeriesGone as exc:
            self.say(f"{step}: no server view: {exc}; the step's server columns are `-`")
            self.gone.setdefault(str(exc), []).append(step)
            return None
        reset = sorted(fresh.union(reset))
        for i in reset:
            if not self.resets:
                self.say(
                    f"{step}: replica {i}'s counters reset in the window (it restarted): its server figures "
                    "there count from its restart, as Prometheus' increase() does; what it completed before "
                    "is in none (said once; the result's warnings list every reset)"
                )
            self.resets.setdefault(i, []).append(step)
        view = server_view(Snapshot(), window, model)
        if view is not None:
            view["replicas"] = list(range(len(self.urls)))
            view["resets"] = reset
        return view

    def warnings(self) -> list[str]:
        """The result's words for the steps a replica was not scraped in and the windows it reset in."""
        out = [
            f"replica {i}'s /metrics ({self.urls[i]}) could not be scraped in {', '.join(steps)}: no server view "
            "there (the server columns `-`), since the other replicas' figures alone are not the fleet's"
            for i, steps in sorted(self.unread.items())
        ]
        out += [f"no server view in {', '.join(steps)}: {why}" for why, steps in self.gone.items()]
        out += [
            f"replica {i} restarted in the window of {', '.join(steps)}: its server figures there count from its "
            "restart (what it completed before, in that window, is in none)"
            for i, steps in sorted(self.resets.items())
        ]
        return out
