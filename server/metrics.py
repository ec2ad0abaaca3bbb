"""Prometheus metrics, recorded on the hot path at the cost of a few list updates.

One `WokMetrics` per server, registered in the `registry` it is given (tests pass their
own `CollectorRegistry`). It is a custom collector: the hot path updates plain Python
counters and bucket lists (`WeightedHistogram`), and the Prometheus families are built
only when scraped. A batch-level stage (assemble, H2D, compute, D2H) is observed once per
batch with the batch's request count as weight, which gives exactly the histogram that
one observation per request would, at a per-batch cost.

The stages partition a request's life as the server sees it, so their means add up to
the end-to-end mean: decode (request checks) → queue → assemble (including the hop to
the worker thread) → h2d → compute → d2h → respond (back to the event loop and the
caller's coroutine) → encode (the response message).

All times are seconds, sizes bytes, following Prometheus' base-unit convention.
"""

from __future__ import annotations

import logging
from bisect import bisect_left
from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

log = logging.getLogger("wok.metrics")

STAGES = ("decode", "queue", "assemble", "h2d", "compute", "d2h", "respond", "encode")
FLUSH_REASONS = ("size", "delay", "drain", "deadline", "idle")
REJECTION_REASONS = (
    "queue_full",
    "deadline",
    "deadline_unmeetable",
    "invalid",
    "shutting_down",
    "not_found",
    "model_failed",
)

# 25 µs resolves the sub-millisecond stages (decode, H2D of a small batch); 60 s bounds
# the multi-second tails of an overloaded queue. Roughly 1-2.5-5 per decade, but at most
# 1.5x apart from 2.5 to 200 ms, where P99s under an SLO live: with 10 and 25 ms neighbours
# a P99 of 13 ms read back as anything from 10 to 25. 200 ms is the shipped alert's SLO: on
# a bound, the share of requests slower than it is exact (deploy/prometheus/alert_rules.yml).
# 5.5 and 6.5 ms sit just above the default 5 ms max_queue_delay_ms: a delay flush's requests
# wait it plus the loop timer's lateness (~0.1 ms), so with 5 and 7.5 ms neighbours every
# queue time at low rates fell just past 5 ms and histogram_quantile read its P99 as 7.47 ms.
LATENCY_BUCKETS = (
    25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3,
    2.5e-3, 3.5e-3, 5e-3, 5.5e-3, 6.5e-3, 7.5e-3, 10e-3, 15e-3, 20e-3, 25e-3, 35e-3, 50e-3, 75e-3, 100e-3,
    150e-3, 200e-3, 250e-3, 500e-3, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip
# Slack at dispatch (slo policy): negative when a batch is predicted to finish late.
SLACK_BUCKETS = (
    -0.1, -0.025, -0.01, -0.005, -0.001, 0.0,
    1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3, 500e-3, 1.0, 5.0,
)  # fmt: skip
# The event loop's lateness (server/loopmon.py): from its timer's resolution (~50 µs) to stalls of seconds.
LOOP_LAG_BUCKETS = (
    50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3, 500e-3, 1.0, 5.0,
)  # fmt: skip
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096, 16384, 65536)


class _NotRun(float):
    """A batch stage that did not happen on the instance's device: 0 s wherever times are added."""

    __slots__ = ()


# The executor reports H2D as this on the CPU, where nothing is copied to a device. `record_batch`
# then does not observe it: a stage histogram of zeros would read back as a P99 of ~25 µs (the
# first bucket's interpolation), a copy that never happened; unobserved, its series keeps its
# labels with a count of 0, which `histogram_quantile` reads as NaN.
NOT_RUN = _NotRun(0.0)


class WeightedHistogram:
    """Bucket counts and a sum; `observe(value, n)` counts the value n times."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.total = 0.0

    def observe(self, value: float, n: int = 1) -> None:
        # bisect_left: a value equal to a bound belongs to that bound's bucket (le is <=).
        self.counts[bisect_left(self.bounds, value)] += n
        self.total += value * n

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[str, int]]:
        out, running = [], 0
        for bound, c in zip(self.bounds, self.counts):
            running += c
            out.append((_fmt(bound), running))
        out.append(("+Inf", running + self.counts[-1]))
        return out


def _fmt(bound: float) -> str:
    # As prometheus_client writes `le` ("1.0", "0.005", "2.5e-05"), which is also the form
    # Prometheus 3 stores every bound in: a matcher such as le="1.0" selects alike on 2 and 3.
    return floatToGoString(bound)


class ModelMetrics:
    """The series of one model; the batcher and the service update these."""

    def __init__(self, name: str, instances: int) -> None:
        self.name = name
        self.stages = {s: WeightedHistogram(LATENCY_BUCKETS) for s in STAGES}
        self.request = WeightedHistogram(LATENCY_BUCKETS)
        self.batch_size = WeightedHistogram(BATCH_SIZE_BUCKETS)
        self.slack = WeightedHistogram(SLACK_BUCKETS)  # slo policy only
        self.flushes = dict.fromkeys(FLUSH_REASONS, 0)
        self.rejections = dict.fromkeys(REJECTION_REASONS, 0)
        self.responses: dict[str, int] = {}
        self.busy_seconds = [0.0] * instances
        self.reruns = 0  # forwards run on parts of failed batches (executor's _isolate)
        # Seconds an instance had nothing to run while requests waited: the delay window at
        # low load (by design), dispatch gaps at saturation (waste).
        self.idle_queued_seconds = [0.0] * instances
        # Read at scrape time from the batcher, so the hot path keeps no gauge of its own.
        self.queue_depth: Callable[[], int] = lambda: 0
        self.inflight: Callable[[], int] = lambda: 0
        # Each of the model's devices, and whether a device-side error made it unusable.
        self.devices_lost: Callable[[], dict[str, bool]] = dict

    def record_batch(
        self,
        instance: int,
        requests: int,
        samples: int,
        queue_waits: Iterable[float],
        assemble: float,
        h2d: float,
        compute: float,
        d2h: float,
        busy: float,
    ) -> None:
        st = self.stages
        q = st["queue"]
        for w in queue_waits:
            q.observe(w)
        st["assemble"].observe(assemble, requests)
        if h2d is not NOT_RUN:
            st["h2d"].observe(h2d, requests)
        st["compute"].observe(compute, requests)
        st["d2h"].observe(d2h, requests)
        self.batch_size.observe(samples)
        self.busy_seconds[instance] += busy

    def record_busy(self, instance: int, seconds: float) -> None:
        """The time an instance ran a batch `record_batch` does not record: one that failed (raised, or
        none of its requests answered) or whose answers reached nobody (the stop's grace period ran
        out). The instance was occupied all the same, and the busy ratio is its utilisation."""
        self.busy_seconds[instance] += seconds

    def record_idle_queued(self, instance: int, seconds: float) -> None:
        self.idle_queued_seconds[instance] += seconds

    def record_reruns(self, forwards: int) -> None:
        self.reruns += forwards

    def record_slack(self, seconds: float) -> None:
        self.slack.observe(seconds)

    def record_flush(self, reason: str) -> None:
        self.flushes[reason] = self.flushes.get(reason, 0) + 1

    def record_response(self, decode: float, respond: float, encode: float, total: float) -> None:
        st = self.stages
        st["decode"].observe(decode)
        st["respond"].observe(respond)
        st["encode"].observe(encode)
        self.request.observe(total)

    def record_status(self, code: str) -> None:
        self.responses[code] = self.responses.get(code, 0) + 1

    def record_rejection(self, reason: str) -> None:
        self.rejections[reason] = self.rejections.get(reason, 0) + 1


class NullModelMetrics(ModelMetrics):
    """Records nothing: for measuring what metrics cost (`wok serve --no-metrics`)."""

    def record_batch(self, *args, **kwargs) -> None:
        pass

    def record_busy(self, instance: int, seconds: float) -> None:
        pass

    def record_idle_queued(self, instance: int, seconds: float) -> None:
        pass

    def record_reruns(self, forwards: int) -> None:
        pass

    def record_slack(self, seconds: float) -> None:
        pass

    def record_flush(self, reason: str) -> None:
        pass

    def record_response(self, decode: float, respond: float, encode: float, total: float) -> None:
        pass

    def record_status(self, code: str) -> None:
        pass

    def record_rejection(self, reason: str) -> None:
        pass


class WokMetrics:
    """The server's collector: every model's series, plus GPU gauges when NVML has devices."""

    def __init__(self, registry: CollectorRegistry, *, gpu: bool = True, enabled: bool = True) -> None:
        self.registry = registry
        self.enabled = enabled
        self.models: dict[str, ModelMetrics] = {}
        # Requests naming no served model are counted here, without the name, so that a
        # client cannot grow the label set; scraped as model="" in wok_rejected_requests_total
        # (reason not_found) as they are refused.
        self.unknown_model_requests = 0
        # Messages that do not parse as a request name no model either, nor do requests whose model version
        # is no integer (InvalidVersion): model="", refused as `invalid`.
        self.unparsed_requests = 0
        # The answers to both, model="" in wok_responses_total, by the code their clients saw
        # (`record_unmodeled`): NOT_FOUND and INVALID_ARGUMENT, or on a stream that ended before
        # the answer was written, the stream's end (CANCELLED, ...), as for a model's own.
        self.unmodeled_responses: dict[str, int] = {}
        # Calls gRPC accepted that ended (deadline or cancel) before wok's handler ran, by method
        # ('ModelInfer'): in no other counter (server/unhandled.py).
        self.unhandled_calls: dict[str, int] = {}
        # Set by the server: counts those ended since the last call (UnhandledCalls.sweep), so that a
        # scrape reads every one ended by then.
        self.sweep_unhandled: Callable[[], object] | None = None
        self._gpu = GpuSampler.create() if gpu else None
        self.loop_lag = WeightedHistogram(LOOP_LAG_BUCKETS)  # fed by server/loopmon.py while the server runs
        # Set by the admin API (server/admin.py): (model, instance, mode, 1 or 0) per instance and mode.
        self.faults: Callable[[], Iterable[tuple[str, int, str, int]]] | None = None
        # The gRPC port the server bound (the real one when asked for port 0), set by the server
        # once bound: exported as wok_server_info{grpc_port=...}, so that a scraper (`wok bench
        # ramp --metrics-url auto`) can tell whose /metrics it reads. None: no series.
        self.grpc_port: int | None = None
        registry.register(self)
        self._registered = True

    def model(self, name: str, instances: int) -> ModelMetrics:
        m = self.models.get(name)
        if m is None:
            m = self.models[name] = (ModelMetrics if self.enabled else NullModelMetrics)(name, instances)
        return m

    def record_loop_lag(self, seconds: float) -> None:
        self.loop_lag.observe(seconds)

    def record_unmodeled(self, code: str) -> None:
        """One answer, of final gRPC status `code`, to a request of no served model (model="")."""
        self.unmodeled_responses[code] = self.unmodeled_responses.get(code, 0) + 1

    def record_unhandled(self, method: str) -> None:
        """One call of `method` ('/package.Service/Method') that ended before wok's handler ran."""
        name = method.rpartition("/")[2]
        self.unhandled_calls[name] = self.unhandled_calls.get(name, 0) + 1

    def close(self) -> None:
        """Unregistered and NVML let go, each once: a stop interrupted (a KeyboardInterrupt) after this ran, before
        it recorded the step, runs it again; the registry's KeyError then failed that stop, and a second
        nvmlShutdown took back another user's NVML init. Each part's mark is set before it runs: an interrupt
        between the two leaves that part undone, which the process's end undoes."""
        if self._registered:
            self._registered = False
            self.registry.unregister(self)
        gpu, self._gpu = self._gpu, None
        if gpu is not None:
            gpu.close()

    def describe(self) -> list[Metric]:
        # Registration checks names against describe(); an empty list skips that work.
        return []

    def collect(self) -> Iterable[Metric]:
        if self.sweep_unhandled is not None:
            self.sweep_unhandled()
        models = list(self.models.values())
        stage = HistogramMetricFamily(
            "wok_request_stage_duration_seconds",
            "Time a request spent in each stage on the server: decode, queue, assemble (with the hop "
            "to the worker), h2d, compute, d2h, respond (back to the caller) and encode; batch stages "
            "count once per request of the batch",
            labels=["model", "stage"],
        )
        e2e = HistogramMetricFamily(
            "wok_request_duration_seconds",
            "End-to-end time of a request whose batch ran, as the server sees it, from its arrival to its encoded "
            "response (also one whose caller went after its batch came back, and one whose answer was refused as "
            "over the send limit: the requests the stages count)",
            labels=["model"],
        )
        bs = HistogramMetricFamily("wok_batch_size", "Samples (rows) per executed batch", labels=["model"])
        flush = CounterMetricFamily(
            "wok_batch_flushes",
            "Batches flushed, by reason: size, delay, drain, deadline, idle (the last two: slo policy)",
            labels=["model", "reason"],
        )
        slack = HistogramMetricFamily(
            "wok_dispatch_slack_seconds",
            "slo policy: per batch at dispatch, its earliest deadline minus its predicted finish (after the "
            "instance's running batch, the batch's quantile time and the hop margin); negative: predicted late",
            labels=["model"],
        )
        resp = CounterMetricFamily(
            "wok_responses", "Inference requests answered, by final gRPC status code", labels=["model", "code"]
        )
        rej = CounterMetricFamily(
            "wok_rejected_requests",
            "Inference requests refused before running, by reason: queue_full, deadline, deadline_unmeetable "
            "(slo policy, at arrival), invalid, shutting_down, not_found, model_failed (its batcher failed or its "
            "device was lost: refused until the server restarts)",
            labels=["model", "reason"],
        )
        busy = CounterMetricFamily(
            "wok_instance_busy_seconds",
            "Seconds each model instance spent running batches, failed ones included; its rate is the busy ratio",
            # Not "instance": Prometheus gives every target an `instance` label (host:port).
            labels=["model", "model_instance"],
        )
        idle_queued = CounterMetricFamily(
            "wok_instance_idle_queued_seconds",
            "Seconds each model instance had no batch to run while requests were queued for its model, up to "
            "when its worker started the next batch: the queue delay window at low load, dispatch gaps under load",
            labels=["model", "model_instance"],
        )
        reruns = CounterMetricFamily(
            "wok_batch_reruns",
            "Forwards run on parts of batches the model failed, to find the requests it fails on alone "
            "(those get the error; the rest of the batch is answered)",
            labels=["model"],
        )
        depth = GaugeMetricFamily("wok_queue_depth", "Requests waiting in the model's queue", labels=["model"])
        inflight = GaugeMetricFamily(
            "wok_inflight_batches", "Batches handed to the model's instances and not yet finished", labels=["model"]
        )
        lost = GaugeMetricFamily(
            "wok_device_lost",
            "1 when a device-side error (a kernel's assert, an illegal address) made the model's device unusable: "
            "the model refuses requests and the server must be restarted; else 0",
            labels=["model", "device"],
        )
        for m in models:
            for s, h in m.stages.items():
                stage.add_metric([m.name, s], h.cumulative(), h.total)
            e2e.add_metric([m.name], m.request.cumulative(), m.request.total)
            bs.add_metric([m.name], m.batch_size.cumulative(), m.batch_size.total)
            if m.slack.count:
                slack.add_metric([m.name], m.slack.cumulative(), m.slack.total)
            for reason, n in list(m.flushes.items()):
                flush.add_metric([m.name, reason], n)
            for code, n in list(m.responses.items()):
                resp.add_metric([m.name, code], n)
            for reason, n in list(m.rejections.items()):
                rej.add_metric([m.name, reason], n)
            for i, secs in enumerate(m.busy_seconds):
                busy.add_metric([m.name, str(i)], secs)
            for i, secs in enumerate(m.idle_queued_seconds):
                idle_queued.add_metric([m.name, str(i)], secs)
            reruns.add_metric([m.name], m.reruns)
            depth.add_metric([m.name], m.queue_depth())
            inflight.add_metric([m.name], m.inflight())
            for device, is_lost in m.devices_lost().items():
                lost.add_metric([m.name, device], 1.0 if is_lost else 0.0)
        # An unknown model's request, or bytes that are no request, is answered and counted under no
        # model's name: without these, wok_responses_total would not count every answer.
        for code, n in ({"NOT_FOUND": 0, "INVALID_ARGUMENT": 0} | self.unmodeled_responses).items():
            resp.add_metric(["", code], n)
        rej.add_metric(["", "not_found"], self.unknown_model_requests)
        rej.add_metric(["", "invalid"], self.unparsed_requests)
        unhandled = CounterMetricFamily(
            "wok_calls_ended_before_handler",
            "Inference calls gRPC accepted that ended (their deadline passed, or their client cancelled) before "
            "wok's handler ran, by method: counted nowhere else; a busy event loop takes them too late",
            labels=["method"],
        )
        for method, n in ({"ModelInfer": 0} | self.unhandled_calls).items():
            unhandled.add_metric([method], n)
        if self.grpc_port is not None:
            # An info-style gauge (always 1; the label is the information), as prometheus_client's Info
            # renders in the text format.
            info = GaugeMetricFamily(
                "wok_server_info",
                "Which server this is: the port its gRPC inference service listens on (the bound one); always 1",
                labels=["grpc_port"],
            )
            info.add_metric([str(self.grpc_port)], 1)
            yield info
        yield from (
            stage,
            e2e,
            bs,
            flush,
            slack,
            resp,
            rej,
            unhandled,
            busy,
            idle_queued,
            reruns,
            depth,
            inflight,
            lost,
        )
        if self.loop_lag.count:
            lag = HistogramMetricFamily(
                "wok_event_loop_lag_seconds",
                "How late the event loop ran each 10 ms tick of a timer (a stall counts once): a wait that "
                "requests meet before any stage starts (Python work, the GIL, the scheduler)",
            )
            lag.add_metric([], self.loop_lag.cumulative(), self.loop_lag.total)
            yield lag
        if self.faults is not None:
            faults = GaugeMetricFamily(
                "wok_injected_faults",
                "1 while an injected fault (wok serve --admin) is active on the model instance, by mode: slow, fail",
                labels=["model", "model_instance", "mode"],
            )
            for model, instance, mode, active in self.faults():
                faults.add_metric([model, str(instance), mode], active)
            yield faults
        if self._gpu is not None:
            yield from self._gpu.collect()


class GpuSampler:
    """GPU gauges read through NVML at scrape time; absent (not zero) where there is no GPU."""

    def __init__(self, nvml, handles: list) -> None:
        self._nvml = nvml
        self._handles = handles

    @classmethod
    def create(cls) -> GpuSampler | None:
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception as exc:  # no library, no driver, no device: no GPU series
            log.debug("no NVML: %s", exc)
            return None
        try:
            n = pynvml.nvmlDeviceGetCount()
            handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
        except Exception as exc:
            log.warning("NVML is present but lists no devices: %s", exc)
            pynvml.nvmlShutdown()
            return None
        if not handles:
            pynvml.nvmlShutdown()
            return None
        return cls(pynvml, handles)

    def close(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except Exception as exc:
            log.debug("nvmlShutdown: %s", exc)

    def collect(self) -> Iterable[Metric]:
        nv = self._nvml
        util = GaugeMetricFamily(
            "wok_gpu_utilization_ratio", "GPU busy ratio over NVML's last sample period", labels=["gpu"]
        )
        used = GaugeMetricFamily("wok_gpu_memory_used_bytes", "GPU memory in use", labels=["gpu"])
        total = GaugeMetricFamily("wok_gpu_memory_total_bytes", "GPU memory in all", labels=["gpu"])
        temp = GaugeMetricFamily("wok_gpu_temperature_celsius", "GPU core temperature", labels=["gpu"])
        power = GaugeMetricFamily("wok_gpu_power_watts", "GPU power draw", labels=["gpu"])
        for i, h in enumerate(self._handles):
            gpu = [str(i)]
            # Each reading is independent: a device that does not report power still reports the rest.
            for family, read in (
                (util, lambda h=h: nv.nvmlDeviceGetUtilizationRates(h).gpu / 100.0),
                (used, lambda h=h: nv.nvmlDeviceGetMemoryInfo(h).used),
                (total, lambda h=h: nv.nvmlDeviceGetMemoryInfo(h).total),
                (temp, lambda h=h: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
                (power, lambda h=h: nv.nvmlDeviceGetPowerUsage(h) / 1000.0),
            ):
                try:
                    family.add_metric(gpu, float(read()))
                except Exception as exc:
                    log.debug("NVML read failed on gpu %d: %s", i, exc)
        return [util, used, total, temp, power]
