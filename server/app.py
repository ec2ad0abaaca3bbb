"""The server: builds each model's executor and batcher, serves gRPC, and stops in stages.

Stop (SIGTERM/SIGINT/SIGHUP, or `stop()`), in order, within the grace period:
  1. health turns NOT_SERVING and new inference calls get UNAVAILABLE;
  2. each batcher runs what is queued and in flight (flush reason "drain");
  3. every handler hands its answer to gRPC and each open stream, having written the answers it
     owes, ends with UNAVAILABLE "server is shutting down"; once gRPC has written the unary
     answers that can be large, inference and metadata (`InferenceService.answers_written`), the
     gRPC server stops;
  4. the executors' threads end;
  5. a CPU wake-up latency request (`cpu_wakeup_latency_us`) is dropped.
If the grace period runs out, what is still queued or in a batch that has not finished fails
with UNAVAILABLE, and stage 3 still gets ANSWER_WINDOW_S to write the answers: every accepted
request gets exactly one response either way.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import threading
import time
from dataclasses import dataclass

import grpc
from google.protobuf import descriptor_pool
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection, reflection_pb2
from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector

from .accept import AcceptTasks
from .admin import Admin
from .auth import BearerTokenInterceptor, SecurityMode, security_warnings, server_credentials, token_interceptor
from .batcher import Batcher, BatchingPolicy
from .codec import transport_limit
from .config import ServerSettings, host_port
from .cpulatency import CpuWakeupLatency, read_constraint
from .cpulinear import onednn_available, plain_linear_layers, torch_linear_layers
from .errors import DeviceLost
from .executor import Executor
from .health import HealthServicer
from .http import MetricsHTTPServer
from .loopmon import LoopLagMonitor
from .metrics import ModelMetrics, WokMetrics
from .ports import bind_error, bind_refusal, check_ports
from .reflection import ReflectionServicer
from .repository import ModelRepository
from .servable import Servable
from .service import InferenceService, add_to_server, add_tolerant_service
from .stats import ModelStats
from .unhandled import UnhandledCalls
from .v2pb import grpc_service_pb2 as pb
from .wakeup import WakeupDrain

log = logging.getLogger("wok")
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name
_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
# Past the grace period, how long the answers already decided (the requests that ran, and the
# UNAVAILABLE of those that did not) get to be handed to gRPC and the streams to end.
ANSWER_WINDOW_S = 1.0
# A bind gRPC refused though a plain socket binds there now (the port was held and let go meanwhile).
_BIND_CAUSES = "gRPC refused it, naming no cause (a plain socket binds there now: the port may have been held a moment)"
# The stop's last step (_stop_stages): until it has run, a model thread may be left in a batch (abandoned_work).
_EXECUTORS_STEP = "the executors' shutdown"


@functools.cache
def _reflection_pool() -> descriptor_pool.DescriptorPool:
    """A pool holding the files of the services reflection describes, and what they import.

    Reflection answers from one pool, but wok's stubs are in a pool of their own (wok.v2pb._pool:
    tritonclient puts the same `inference.*` names in the default pool), and health and reflection
    are in the default pool.
    """
    pool = descriptor_pool.DescriptorPool()
    added: set[str] = set()

    def add(file) -> None:
        if file.name not in added:
            for dependency in file.dependencies:
                add(dependency)
            pool.AddSerializedFile(file.serialized_pb)
            added.add(file.name)

    for file in (pb.DESCRIPTOR, health_pb2.DESCRIPTOR, reflection_pb2.DESCRIPTOR):
        add(file)
    return pool


@dataclass
class ModelRuntime:
    servable: Servable
    executor: Executor
    batcher: Batcher
    stats: ModelStats
    metrics: ModelMetrics

    @property
    def default_timeout_s(self) -> float | None:
        ms = self.servable.config.dynamic_batching.default_timeout_ms
        return ms / 1e3 if ms else None


class TickProcessCollector(ProcessCollector):
    """prometheus_client's process collector, its `process_start_time_seconds` true to the clock tick.

    It adds the process's start (clock ticks since boot) to /proc/stat's `btime`, the boot time in
    whole seconds: the start read up to 1 s early, so a bench could not tell a replica back within
    a second of a window's start from one started before it (bench/scrape.py's Fleet blanked the
    step). The boot time here is the one the kernel rounds down, read from the clocks.
    """

    def _boot_time(self):
        whole = super()._boot_time()  # OSError without /proc: the collector then exports nothing, as before
        if not whole or not hasattr(time, "CLOCK_BOOTTIME"):
            return whole
        # Of three readings, the one whose two boot-clock reads lie closest around the wall clock's: a thread
        # preempted between the reads would put the boot time early by the stall.
        readings = []
        for _ in range(3):
            first = time.clock_gettime(time.CLOCK_BOOTTIME)
            wall = time.time()
            last = time.clock_gettime(time.CLOCK_BOOTTIME)
            readings.append((last - first, wall - (first + last) / 2))
        return min(readings)[1]


def default_registry() -> CollectorRegistry:
    """A registry of the server's own, with the process, platform and GC collectors."""
    registry = CollectorRegistry()
    TickProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry


class WokServer:
    def __init__(
        self,
        settings: ServerSettings,
        repository: ModelRepository,
        *,
        registry: CollectorRegistry | None = None,
        announce: bool = True,
    ) -> None:
        self.settings = settings
        # Log where it serves (gRPC, security mode, health and metrics ports) once started. `wok
        # serve` passes False: it prints those lines itself, whatever --log-level, as the lines scripts
        # and tests parse ("wok: serving ...", "wok: metrics on http://..."); logged too, each showed twice.
        self.announce = announce
        self.repository = repository
        self.registry = registry if registry is not None else default_registry()
        self.metrics = WokMetrics(self.registry, enabled=settings.metrics)
        self.http: MetricsHTTPServer | None = None
        self.service: InferenceService | None = None
        # Set when a stop (or a cancelled start) gave up on a model thread (`abandoned_work`).
        self._gave_up = False
        self._given_up: set[str] = set()  # the models whose executor's shutdown a stop gave up waiting for
        self.runtimes: dict[str, ModelRuntime] = {}
        self.port: int | None = None
        self.health_port: int | None = None
        self.draining = False
        self._started = False
        self._grpc: grpc.aio.Server | None = None
        self._health: HealthServicer | None = None
        self._reflection: ReflectionServicer | None = None
        self._background: set[asyncio.Task] = set()  # held until done (the loop keeps weak refs)
        self._health_grpc: grpc.aio.Server | None = None
        self._token_interceptor: BearerTokenInterceptor | None = None
        # Counts the ModelInfer calls that end before their handler runs (metrics on only).
        self.unhandled: UnhandledCalls | None = None
        self._stopped: asyncio.Event | None = None
        # One stop runs the steps at a time; those it ran to their end (or failure), and its failures: a stop
        # cancelled partway leaves the others to the next (_stop_stages).
        self._stop_lock = asyncio.Lock()
        self._stop_calls = 0  # the stop() calls running or waiting for the lock: one will shut the executors down
        self._stop_done: set[str] = set()
        self._stop_failures: list[Exception] = []
        # The models whose batcher's stop has ended (a cancelled drain ends them all): not stopped again by the next.
        self._drained: set[str] = set()
        self.loop_lag: LoopLagMonitor | None = None
        self.accept: AcceptTasks | None = None
        self.wakeup_drain: WakeupDrain | None = None
        self.cpu_latency: CpuWakeupLatency | None = None
        # A device a model ran on, lost to a device-side error: the server can serve no more there.
        self.device_lost: DeviceLost | None = None

    @property
    def ready(self) -> bool:
        return self._started and not self.draining and self.device_lost is None

    @property
    def abandoned_work(self) -> bool:
        """A model thread is left in a batch that nothing will end: the process must then exit hard (os._exit), as
        Python's exit would wait for that thread. One a stop past its grace period, or a cancelled start, gave up
        on; or, once a stop was cancelled (or interrupted: a KeyboardInterrupt or SystemExit in a step) before the
        executors' shutdown (left to a next stop() that no call has made yet), a batch still in a model's executor.
        A caller that never stopped again read False there, with the model's thread in its batch (a stuck one's for
        good). A batch whose thread has returned is none (Batcher.running): counted until its completion ran on the
        loop (Batcher.inflight), it said True between the two, and the caller exited hard saying the model was given
        up on. Read on the loop. A stop left pending by a KeyboardInterrupt raised out of the loop's wait (a Ctrl-C
        under a plain run_until_complete) counts as running, False with a batch still in a model: the loop run again
        (a next stop() waits for it) ends it. No caller meets that: `wok serve` takes its signals on the loop, and
        gpu_check's asyncio.run cancels on a first Ctrl-C and leaves at once on a second."""
        if self._gave_up:
            return True
        if not self.draining or self._stop_calls or self._stopped.is_set() or _EXECUTORS_STEP in self._stop_done:
            return False
        return any(rt.batcher.running for rt in self.runtimes.values())

    @property
    def started(self) -> bool:
        """Its start has finished (every port open, health SERVING); still True once it stops."""
        return self._started

    def runtime(self, name: str, version: str = "") -> ModelRuntime:
        return self.runtimes[self.repository.get(name, version).name]

    def _log_cpu_linear(self, name: str, executor: Executor, platform: str) -> None:
        cpu = [inst for inst in executor.instances if not inst.cuda]
        if not cpu or self.settings.cpu_linear != "onednn":
            return
        first = cpu[0]
        if platform in ("torchscript", "torch_export"):
            # Without a word an operator took the line's absence for a model that has no linear layers, or for a
            # failure: a ScriptModule is kept as it is, and an exported graph calls aten.linear with no nn.Linear.
            # One with no nn.Linear gains nothing served as an nn.Module: nothing to say (the line said it had some).
            if not torch_linear_layers(first.module):
                return
            log.info(
                "%s: oneDNN not used: a %s model runs torch's own linear layers; to run them through oneDNN, serve "
                'its nn.Module with platform = "python" (a factory and weights = its state dict)',
                name,
                platform,
            )
        elif first.onednn_ran[0]:
            log.info(
                "%s: %d linear layer(s) per CPU instance run through oneDNN (%d with their ReLU)",
                name,
                *first.onednn_ran,
            )
        elif first.onednn_layers:
            # The demo encoder: its transformer layers run torch's fused kernels in inference, never their Linears.
            log.info(
                "%s: oneDNN not used: the warm-up called none of its %d linear layer(s), which its forward "
                "computes another way (as torch's fused transformer kernels do); nothing to do: it runs as with "
                "--cpu-linear torch",
                name,
                first.onednn_layers,
            )
        elif not onednn_available() and plain_linear_layers(first.module):
            # Only where oneDNN would run some: a model with no nn.Linear (or an F.linear) runs the same on any build.
            log.warning("%s: this torch build cannot run linear layers through oneDNN; torch runs them", name)

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._stopped = asyncio.Event()
        if self.settings.cpu_wakeup_latency_us is not None:
            # Acquired first: where the process may not hold it (not root), the start fails
            # before any model loads.
            self.cpu_latency = CpuWakeupLatency(self.settings.cpu_wakeup_latency_us)
            self.cpu_latency.acquire()
            try:
                bound = f"{read_constraint(self.cpu_latency.path)} µs"
            except OSError as exc:  # the bound is held; only the read-back failed
                bound = f"unknown ({exc.strerror})"
            log.info(
                "CPU wake-up latency held at <= %d µs (PM QoS); the system's bound is now %s",
                self.cpu_latency.latency_us,
                bound,
            )
        # Before the models' warm-up, which takes minutes for a large one (`wok serve` checks before it loads them
        # too). Off the loop: a host name resolves there.
        await loop.run_in_executor(None, check_ports, self.settings)
        for name, servable in self.repository.models.items():
            cfg = servable.config
            # Moving modules to devices and the warm-up batch block; keep them off the loop.
            executor = await self._build_executor(name, servable)
            try:
                await loop.run_in_executor(None, executor.warmup)
                self._log_cpu_linear(name, executor, servable.platform_label)
                db = cfg.dynamic_batching
                policy = BatchingPolicy(
                    cfg.max_batch_size, db.max_queue_delay_ms / 1e3, db.preferred_batch_sizes, db.max_queue_size
                )
                stats = ModelStats(name)
                metrics = self.metrics.model(name, len(executor.instances))
                # The slo policy reads its profile again here, after the load: the file may have
                # changed since the config was checked.
                batcher = Batcher(name, executor, policy, stats, metrics)
            except BaseException:
                # Not in self.runtimes yet, so stop() would not shut its worker threads down. Bounded as the stop's
                # wait is: a start cancelled in the warm-up (asyncio.run's on a Ctrl-C, a caller's wait_for) left
                # the warm-up's forward running on the model thread, and this waited for its end, a stuck model's
                # never. A warm-up that raised has ended its forward: the wait is the threads' exit.
                await self._shutdown_within({name: executor}, lambda: 0.0, "as the start ended", last=True)
                raise
            batcher.on_failed = functools.partial(self._model_failed, name)
            batcher.start()
            self.runtimes[name] = ModelRuntime(servable, executor, batcher, stats, metrics)

        limit = transport_limit(self.settings.max_request_bytes)
        # Built before the port opens: a token source that fails now fails the start.
        interceptor = self._token_interceptor = token_interceptor(self.settings)
        interceptors = [interceptor] if interceptor is not None else []
        if self.settings.metrics:
            # After the token's: a call it refuses never reaches this one, and is not counted as unhandled.
            self.unhandled = UnhandledCalls((f"/{SERVICE_NAME}/ModelInfer",), self.metrics.record_unhandled)
            self.metrics.sweep_unhandled = self.unhandled.sweep
            interceptors.append(self.unhandled)
        # No maximum_concurrent_rpcs: calls the AcceptTasks below take would bypass its limiter
        # (admission is the batcher's max_queue_size).
        self._grpc = grpc.aio.server(interceptors=interceptors or None, options=self._grpc_options(limit))
        try:
            self.service = InferenceService(self)
            handlers = add_to_server(self.service, self._grpc)
            self._health = HealthServicer()
            # Health and reflection parse as the V2 service does: bytes that are not their request
            # get INVALID_ARGUMENT, not UNKNOWN and an ERROR with a traceback in the log per call.
            add_tolerant_service(self._grpc, health_pb2, "Health", self._health)
            self._reflection = reflector = ReflectionServicer(
                [SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME],
                pool=_reflection_pool(),
            )
            add_tolerant_service(self._grpc, reflection_pb2, "ServerReflection", reflector)
            address = host_port(self.settings.host, self.settings.grpc_port)
            credentials = server_credentials(self.settings)
            try:
                if credentials is None:
                    self.port = self._grpc.add_insecure_port(address)
                else:
                    self.port = self._grpc.add_secure_port(address, credentials)
            except RuntimeError:  # gRPC's own message names no cause
                self.port = 0
            if self.port == 0:  # taken since check_ports
                self._bind_failed("gRPC port", self.settings.host, self.settings.grpc_port)
        except BaseException:
            # Nothing is bound (the bind is the last step above), and stop() frees no server never started.
            await _release_unstarted(self._grpc)
            raise
        self.metrics.grpc_port = self.port  # wok_server_info: whose /metrics a scraper reads
        # Nothing that can fail goes between the bind and the start: grpc.aio's stop does nothing to a server
        # never started, whose port then stays bound until the process ends (grpcio 1.85).
        await _start_grpc(self._grpc)
        # Unary inference only: a stream is accepted once and then carries many requests.
        infer = f"/{SERVICE_NAME}/ModelInfer"
        self.accept = AcceptTasks(self._grpc, {infer: handlers[infer]}, self.settings.accept_tasks, interceptors)
        self.accept.start()
        if self.settings.drain_wakeups:
            self.wakeup_drain = WakeupDrain()
            self.wakeup_drain.install()
        if self.settings.metrics:
            self.loop_lag = LoopLagMonitor(self.metrics.record_loop_lag)
            self.loop_lag.start()
        if self.settings.health_port is not None:
            await self._start_health_port()
        if self.settings.metrics_port is not None:
            admin = Admin(self) if self.settings.admin else None
            self.http = MetricsHTTPServer(
                self.registry,
                self.settings.metrics_host,
                self.settings.metrics_port,
                admin=admin,
                metrics=self.settings.metrics,
            )
            await self.http.start()
        for service in ("", SERVICE_NAME):
            # A device lost between the port's opening and here (the health and metrics ports start
            # meanwhile) must not be told SERVING.
            await self._health.set(service, _NOT_SERVING if self.device_lost else _SERVING)
        for name, rt in self.runtimes.items():
            await self._health.set(name, _NOT_SERVING if rt.batcher.failed else _SERVING)
        # Before the ready line, which scripts wait for.
        log.info(
            "unary accept: grpc.aio's chain and %d more task(s); gRPC wake-up drain %s",
            self.accept.running,
            "on" if self.wakeup_drain is not None and self.wakeup_drain.installed else "off",
        )
        self._started = True
        if self.announce:
            log.info("wok serving %s on %s", ", ".join(self.runtimes), host_port(self.settings.host, self.port))
            log.info("gRPC security: %s", SecurityMode.of(self.settings).describe())
        for warning in security_warnings(self.settings):
            log.warning("%s", warning)
        if self.announce and self._health_grpc is not None:
            log.info(
                "health (plaintext, grpc.health.v1 only) on %s",
                host_port(self.settings.health_bind_host, self.health_port),
            )
        if self.announce and self.http is not None:
            http = host_port(self.settings.metrics_host, self.http.port)
            if self.settings.metrics:
                log.info("metrics on http://%s/metrics", http)
                if self.http.admin:
                    log.info("admin API on http://%s (/admin/*, /events)", http)
            else:
                log.info(
                    "metrics off: http://%s/metrics answers 404%s", http, "; admin API there" if self.http.admin else ""
                )

    async def _build_executor(self, name: str, servable: Servable) -> Executor:
        """`servable`'s Executor, built on a thread of the loop's pool (loading the model blocks).

        Cancelled meanwhile (asyncio.run's cancel on a Ctrl-C, a caller's wait_for), the build goes on: a load
        cannot be interrupted. It is waited for as a cancelled warm-up is (`_shutdown_within`), 1 s at most, and
        the executor it built shut down; a build still running then is given up on, named, and `abandoned_work`
        set: its pool thread holds asyncio.run's end and the process's exit for as long as the load takes. That
        thread shuts down the executor it builds later, which nobody else holds."""
        loop = asyncio.get_running_loop()
        lock = threading.Lock()
        wanted = True  # under `lock`: the start still takes the executor
        built: list[Executor] = []  # under `lock`: the executor built while wanted

        def build() -> Executor | None:
            executor = Executor(servable, servable.config.instances, cpu_linear=self.settings.cpu_linear)
            with lock:
                if wanted:
                    built.append(executor)
                    return executor
            executor.shutdown()  # the start ended meanwhile
            return None

        building = loop.run_in_executor(None, build)
        # Read whoever gets it: a load that fails after a cancellation (in the wait below, past it, or as a second
        # cancellation ends that wait) was logged as "Future exception was never retrieved"; the caller gets the
        # cancellation, or the failure itself through the shield.
        building.add_done_callback(lambda f: f.cancelled() or f.exception())
        try:
            # Shielded: a cancellation leaves `building` to be waited for below.
            return await asyncio.shield(building)
        except asyncio.CancelledError:
            try:
                await asyncio.wait({building}, timeout=1.0)
            finally:  # a second cancellation ends the wait, not the clean-up
                with lock:
                    wanted = False
                    taken = built[:]
                if taken:
                    taken[0].shutdown()  # never given a batch: its threads are idle and end at once
                elif not building.done():
                    # The thread shuts down what it builds later, needing nothing of the loop.
                    log.error("model '%s' is still loading as the start ended", name)
                    self._gave_up = True
            raise

    def _model_failed(self, name: str, exc: BaseException) -> None:
        """A model's batching task failed (a bug; it is logged): its health turns NOT_SERVING, so
        that a balancer watching it routes elsewhere; the server's own health is left as it is.
        A device lost to a device-side error (DeviceLost) is the process's, not the model's: only a
        restart recovers it, so the server's health turns NOT_SERVING too and it is no longer ready
        (the probes in deploy/k8s take it out of its Service, then restart it)."""
        lost = isinstance(exc, DeviceLost)
        if lost and self.device_lost is None:
            # Recorded in the drain as well (its health is NOT_SERVING already): `wok serve` then
            # exits without the frees that would abort it on the lost device.
            self.device_lost = exc
            log.error("%s; health NOT_SERVING", exc)
        if self._health is None or self.draining:
            return
        services = [name, "", SERVICE_NAME] if lost else [name]
        for service in services:
            task = asyncio.get_running_loop().create_task(self._health.set(service, _NOT_SERVING))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def _start_health_port(self) -> None:
        # The kubelet's gRPC probe speaks plaintext only and presents no client certificate,
        # so with TLS on the main port it cannot probe there. This port carries the same
        # health servicer, so it turns NOT_SERVING at the drain with the main one, and
        # nothing else: no inference, no reflection, no token needed (health is exempt anyway).
        self._health_grpc = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        add_tolerant_service(self._health_grpc, health_pb2, "Health", self._health)
        address = host_port(self.settings.health_bind_host, self.settings.health_port)
        try:
            self.health_port = self._health_grpc.add_insecure_port(address)
        except RuntimeError:
            self.health_port = 0
        if self.health_port == 0:
            await _release_unstarted(self._health_grpc)
            self._bind_failed("health port", self.settings.health_bind_host, self.settings.health_port)
        await _start_grpc(self._health_grpc)

    @staticmethod
    def _bind_failed(what: str, host: str, port: int) -> None:
        """Raise for a port gRPC refused, with the cause a plain socket meets there (gRPC names none)."""
        exc = bind_error(host, port)
        if exc is None:
            raise OSError(f"cannot bind the {what} to {host_port(host, port)}: {_BIND_CAUSES}")
        raise OSError(bind_refusal(what, host, port, exc)) from exc

    def _grpc_options(self, transport_limit: int) -> list[tuple[str, int]]:
        options = [
            ("grpc.max_receive_message_length", transport_limit),
            ("grpc.max_send_message_length", transport_limit),
            ("grpc.so_reuseport", 0),
            # gRPC core cancels calls beyond 1000 waiting for the application (3000 hard);
            # admission is the batcher's job (max_queue_size), so lift that limit.
            ("grpc.server.max_pending_requests", 1 << 20),
            ("grpc.server.max_pending_requests_hard_limit", 1 << 20),
            # wok's clients ping a connection with calls in flight every 10 s to find a hung
            # server (wok.clients.channel); accept pings every 5 s instead of gRPC's 5 minutes.
            ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
        ]
        age = self.settings.max_connection_age_s
        if age is not None:
            grace = self.settings.max_connection_age_grace_s
            grace = self.settings.grace_period_s if grace is None else grace
            options.append(("grpc.max_connection_age_ms", max(1, round(1e3 * age))))
            options.append(("grpc.max_connection_age_grace_ms", max(0, round(1e3 * grace))))
        return options

    async def stop(self, grace: float | None = None) -> None:
        """Stop in stages within `grace` seconds (the settings' grace period by default).

        A stop cancelled partway (its drain then fails what is left, as past the grace period) leaves the steps it
        did not finish to the next stop(), which runs them within its own grace; one called meanwhile waits for it,
        and takes over if it is cancelled. So does one left by a KeyboardInterrupt or SystemExit raised in a step.
        Until a next one is called, `abandoned_work` tells of a batch still in a model. Once a stop has returned or
        raised an Exception (its steps' first failure), a later one returns at once."""
        if self._stopped is None:
            self._stopped = asyncio.Event()
        self._stop_calls += 1
        try:
            await self._stop_locked(grace)
        finally:
            self._stop_calls -= 1

    async def _stop_locked(self, grace: float | None) -> None:
        """stop()'s work, one call at a time."""
        async with self._stop_lock:
            if self._stopped.is_set():
                return
            grace = self.settings.grace_period_s if grace is None else grace
            deadline = time.monotonic() + grace

            def left() -> float:
                return max(0.0, deadline - time.monotonic())

            resumed = self.draining
            self.draining = True
            # Not for a start that failed before any model loaded (a port it cannot have): nothing to drain,
            # and its error is the line to read.
            told = self._started or bool(self.runtimes)
            if told and resumed:
                log.info("stopping: finishing a stop left partway (cancelled or interrupted), within %.1f s", grace)
            elif told:
                log.info("stopping: draining %d model(s) within %.1f s", len(self.runtimes), grace)
            left_partway = False
            try:
                await self._stop_stages(left)
            except BaseException as exc:
                # A cancellation, or a KeyboardInterrupt/SystemExit raised in a step (a Ctrl-C under a plain
                # run_until_complete, as bench tools and tests run the stop): the steps not done are the next stop's.
                # Taken for a finished stop, the next returned at once with the executors open, and
                # `abandoned_work` read False with a model's thread still in its batch. An Exception is the steps'
                # first failure, raised once all of them ran.
                left_partway = not isinstance(exc, Exception)
                raise
            finally:
                # Even when a step raised: the bound must not outlive the server, and a later stop() returns at once.
                # Not when left partway: the next stop() finishes the steps left, the drain's answers among them.
                if not left_partway:
                    if self.cpu_latency is not None:
                        # Last: the drain's answers are latency-sensitive too.
                        self.cpu_latency.release()
                    self._stopped.set()
            if told:
                log.info("stopped")

    async def _stop_stages(self, left) -> None:
        """Stages 1-4 of the stop (the module's docstring); `left()`: seconds of grace left.

        A step that raises is logged, with its traceback, and the stop goes on: one that failed (a port's stop, a
        health update) left every later one undone, the metrics port's, its admin's fault timers and events ticker
        and the executors' threads among them. The first failure is raised once every step has run.

        A step cancelled partway is not done: the next call runs it and those after it (the ones done are skipped).
        A stop cancelled in its drain left the ports bound and the executors' threads running, and the next stop()
        returned at once."""
        failures = self._stop_failures
        steps = []

        def say(what: str, exc: Exception) -> None:
            log.error("stopping: %s failed; the stop goes on", what, exc_info=exc)

        def failed(what: str, exc: Exception) -> None:
            failures.append(exc)  # kept before it is said: an interrupt in the saying (a log handler's write) loses it
            say(what, exc)

        def step(what: str, needed: bool = True, run=None):
            """If `needed`, `run` is the stop's next step (a function, its awaitable awaited); without it, the
            function decorated."""

            def add(run):
                if needed:
                    steps.append((what, run))
                return run

            return add if run is None else add(run)

        @step("health's NOT_SERVING", self._health is not None)
        async def not_serving() -> None:
            for service in ("", SERVICE_NAME, *self.runtimes):
                await self._health.set(service, _NOT_SERVING)

        @step("the batchers' drain", bool(self.runtimes))
        async def drain() -> None:
            # A batching task that failed while serving was logged then and its model turned NOT_SERVING: its
            # stop raising that failure again is no failure of the stop.
            known = {name: rt.batcher.failed for name, rt in self.runtimes.items()}
            # Not those a cancelled stop's drain ended: stopped again, a batcher whose stop raised raised again,
            # logged and counted twice.
            names = [name for name in self.runtimes if name not in self._drained]

            def ended(name: str, task: asyncio.Future) -> None:
                # Recorded as each drain ends, not after the gather below: a second cancellation of the stop in
                # that gather skipped the record, and the next stop ran the batcher's stop again, its first
                # failure dropped unsaid.
                self._drained.add(name)
                end = None if task.cancelled() else task.exception()
                if not isinstance(end, Exception) or end is known[name]:
                    return
                if end is self.runtimes[name].batcher.failed:
                    # The batching task failed in the drain: the batcher logged it, with its traceback, as it
                    # failed. It fails the stop, unlogged here: logged again, its traceback showed twice.
                    failures.append(end)
                else:
                    # One a batcher's stop raised (its failure log's stop, say): gathered, it was dropped unsaid.
                    failed(f"the drain of model '{name}'", end)

            drains = {}
            for name in names:
                task = asyncio.ensure_future(self.runtimes[name].batcher.stop())
                task.add_done_callback(functools.partial(ended, name))
                drains[task] = name
            left_over = []
            try:
                if drains:
                    _, pending = await asyncio.wait(drains, timeout=left())
                    # Read before the cancellation fails what is left.
                    late = [self.runtimes[drains[d]].batcher for d in pending]
                    # Only what held work: with no grace at all (a failed start) every drain is still pending.
                    left_over = [(b.name, b.queued, b.inflight) for b in late if b.queued or b.inflight]
            finally:
                # Past the grace period, and as well when this step fails or is cancelled partway: a drain left
                # running outlived the stop, its batcher draining on and its requests unanswered.
                for d in drains:
                    d.cancel()
                # Each drain's end is taken in by `ended`, which ran before the gather's own callback.
                await asyncio.gather(*drains, return_exceptions=True)
            if left_over:
                log.warning(
                    "grace period over: %s",
                    "; ".join(f"model '{m}': {q} request(s) queued, {b} batch(es) running" for m, q, b in left_over),
                )

        @step("the answers' window", self.service is not None)
        async def answers() -> None:
            # Every accepted request has its result: let the handlers hand them to gRPC, and the
            # open streams write theirs and end (UNAVAILABLE) rather than be cut by gRPC's stop.
            # Past the grace period this still gets ANSWER_WINDOW_S.
            self.service.close_streams()
            # One window for both: the answers handed to gRPC, then written by it.
            window_end = time.monotonic() + max(left(), ANSWER_WINDOW_S)

            def window() -> float:
                return max(0.0, window_end - time.monotonic())

            try:
                await asyncio.wait_for(self.service.idle(), timeout=window())
            except asyncio.TimeoutError:
                log.warning("grace period over with %d request(s) still being answered", self.service.active)
            await self.service.answers_written(window)

        # Watchers have had NOT_SERVING since stage 1; an open Watch would hold gRPC's stop.
        step("ending health's Watch streams", self._health is not None, lambda: self._health.end_watches())
        # Idle between requests, an open one (grpcurl, grpcui) would hold gRPC's stop for its grace too.
        step("ending reflection's streams", self._reflection is not None, lambda: self._reflection.end_streams())

        @step("the gRPC port's stop", self._grpc is not None)
        async def grpc_stop() -> None:
            if self.service is not None:
                self.service.cutting = True  # the calls gRPC's stop ends, its clients see UNAVAILABLE
            # Only idle streams and responses on the wire remain: a short grace, not the rest.
            await self._grpc.stop(min(1.0, max(0.1, left())))

        step("the accept tasks' stop", self.accept is not None, lambda: self.accept.stop())
        # Every call has ended: those gRPC's stop ended before their handler count now, for the last scrape.
        step("the unhandled calls' sweep", self.unhandled is not None, lambda: self.unhandled.sweep())
        # No call is refused any more: the last refusals are logged now, not at their window's end.
        token = self._token_interceptor
        step("the token interceptor's close", token is not None, lambda: token.close())
        # Nor any request failed: those held in a window (a broken check's, a handler's bug's) are told now.
        step("the failure logs' close", self.service is not None, lambda: self.service.close_failure_logs())
        step("the wake-up drain's removal", self.wakeup_drain is not None, lambda: self.wakeup_drain.uninstall())

        @step("the health port's stop", self._health_grpc is not None)
        async def health_stop() -> None:
            # Last of the ports: probes read NOT_SERVING through the whole drain. A short grace, as the
            # main port's: its Watch streams, ended above, may not have written their NOT_SERVING yet
            # (a drain with nothing to wait for comes here at once), and stop(0) cut them with
            # "Cancelling all calls" before it (CI at ed42cb6, a starved host).
            await self._health_grpc.stop(min(1.0, max(0.1, left())))

        # Metrics stay up through the drain, so the last scrape sees it.
        step("the metrics port's stop", self.http is not None, lambda: self.http.stop())
        step("the loop lag monitor's stop", self.loop_lag is not None, lambda: self.loop_lag.stop())
        step("the metrics' close", True, lambda: self.metrics.close())
        step(_EXECUTORS_STEP, True, lambda: self._shutdown_executors(left))

        for what, run in steps:
            if what in self._stop_done:
                continue
            try:
                ran = run()
                if inspect.isawaitable(ran):
                    await ran
            except Exception as exc:
                # Kept, and the step marked done, before its failure is said: an interrupt in the saying left the step
                # to the next stop, which ran it again and said a failure of it twice.
                failures.append(exc)
                self._stop_done.add(what)
                say(what, exc)
                continue
            # Not reached when cancelled (a BaseException): the step is the next call's to run.
            self._stop_done.add(what)
        if failures:
            raise failures[0]

    async def _shutdown_executors(self, left) -> None:
        # Not those a stop left partway (an interrupt in its joins) gave up on: their shutdown runs on in its thread,
        # and waited for again each was said given up twice, the next stop held another second.
        executors = {
            rt.servable.name: rt.executor for rt in self.runtimes.values() if rt.servable.name not in self._given_up
        }
        await self._shutdown_within(executors, left, "after the grace period")

    async def _shutdown_within(self, executors: dict[str, Executor], left, when: str, last: bool = False) -> None:
        """Shut `executors` (by model name) down, waiting at most max(left(), 1 s) for a batch still running: a model
        still in one then is logged ("... still running a batch {when}") and given up on (`abandoned_work`).

        Cancelled in that wait, it leaves them to the next call (the stop's next one, `abandoned_work` telling of a
        batch meanwhile); `last`: none comes (a start's clean-up: the executor is in no runtime), and a model still
        running is given up on then as well."""
        # All at once under one deadline: one at a time, each stuck model would add its own second.
        loop = asyncio.get_running_loop()
        ends = {}
        for name, executor in executors.items():
            end, thread = _shutdown_on_own_thread(loop, executor, name)
            ends[end] = (name, thread)
        if not ends:
            return
        try:
            _, pending = await asyncio.wait(list(ends), timeout=max(left(), 1.0))
        except asyncio.CancelledError:
            if last:
                # A start cancelled again in its clean-up: ended with the warm-up's forward still on the model's
                # thread, unsaid, `abandoned_work` False, and Python's exit waiting for that thread. The cancellation
                # is what the caller gets: the shutdowns' own failures are said, not raised.
                failures = self._give_up(ends, {end for end in ends if not end.done()}, when, last)
                self._say_left(failures, "cancelled", when, last)
            else:
                # Left to the next stop, which shuts the executors down again and waits on ends of its own: one
                # failing, now or once its thread ends, went unsaid (or asyncio's "Future exception was never
                # retrieved"), the next shutdown of the same executor succeeding.
                for end, (name, _) in ends.items():
                    end.add_done_callback(functools.partial(self._shutdown_ended, name))
            raise
        failures = self._give_up(ends, pending, when, last)
        # Every failure said, in the models' order: the first raised (the step's failure, said by the stop), the
        # others said here. One raised alone left the rest unsaid, or to asyncio's "never retrieved".
        for name, exc in failures[1:]:
            log.error("stopping: model '%s': its executor's shutdown failed; the stop goes on", name, exc_info=exc)
        if failures:
            raise failures[0][1]

    def _shutdown_ended(self, name: str, end: asyncio.Future) -> None:
        """The end of model `name`'s executor shutdown that a cancelled stop left: a failure is said and fails the
        stop that finishes this one (as a drain's does)."""
        if not end.cancelled() and end.exception() is not None:
            self._say_left([(name, end.exception())], "cancelled", "", last=False)

    def _say_left(self, failures: list[tuple[str, BaseException]], how: str, when: str, last: bool) -> None:
        """Say the executor shutdowns' `failures` (by model name) that a _shutdown_within ended `how` ("cancelled",
        "interrupted") did not: a stop's fail the stop that finishes it; `last` (a start's clean-up, which the
        cancellation or interrupt ends) raises none."""
        if not last:
            # Kept before they are said, as a step's failure is: an interrupt in the saying (a log handler's write)
            # lost them, and the stop that finished this one returned.
            self._stop_failures.extend(exc for _, exc in failures)
        for name, exc in failures:
            if last:
                log.error("model '%s': its executor's shutdown failed %s", name, when, exc_info=exc)
            else:
                log.error(
                    "stopping: model '%s': its executor's shutdown failed, after the stop that waited for it was %s",
                    name,
                    how,
                    exc_info=exc,
                )

    def _give_up(self, ends: dict, pending: set, when: str, last: bool) -> list[tuple[str, BaseException]]:
        """_shutdown_within's end: the models whose shutdown's `end` is `pending` are logged and given up on, the
        threads of the others joined; the failures of those others (by model name, in the models' order).

        The failures are read, and the models given up on, before any join: a KeyboardInterrupt in a join (a Ctrl-C
        under a plain run_until_complete) left them unread (asyncio's "Future exception was never retrieved") and
        the models after it not given up on. Such an interrupt leaves the shutdowns to the next stop (`last`: to
        none), the failures read said as it passes (a stop's then fail the stop that finishes it)."""
        failures = [(name, end.exception()) for end, (name, _) in ends.items() if end not in pending]
        failures = [(name, exc) for name, exc in failures if exc is not None]
        for end, (name, _) in ends.items():
            if end in pending:
                # A batch stuck in the model: its thread cannot be interrupted from Python. Given up before it is
                # said: an interrupt in the saying left it to the next stop, which waited for it and said it again.
                self._gave_up = True
                self._given_up.add(name)
                end.cancel()  # its thread, ending later, then sets nothing
                log.error("model '%s' is still running a batch %s", name, when)
        try:
            for end, (_, thread) in ends.items():
                if end not in pending:
                    # Setting `end` was its last step; joined so that the stop leaves only the threads it gave up on.
                    thread.join()
        except BaseException:
            self._say_left(failures, "interrupted", when, last)
            raise
        return failures


async def _release_unstarted(server: grpc.aio.Server) -> None:
    """Free the core objects of a gRPC server whose port could not be bound.

    grpc.aio's stop does nothing to a server never started, and its core server (and gRPC's init
    count with it) then lived until the process ended (grpcio 1.85: only the stop of a started one
    destroys it). Started with no port, it serves nothing, and its stop destroys it."""
    await _start_grpc(server)
    await server.stop(None)


async def _start_grpc(server: grpc.aio.Server) -> None:
    """`server.start()`, to its end even when the caller is cancelled meanwhile (then raised after it).

    grpc.aio's start waits for its serving task to report that the core server started: cancelled in that
    wait (a signal as `wok serve` starts), the report failed, and with it the serving task (ERROR "invalid
    state"), whose crash handler's stop failed in turn ("Task exception was never retrieved"). The wait is
    one loop iteration."""
    start = asyncio.ensure_future(server.start())
    try:
        await asyncio.shield(start)
    except asyncio.CancelledError:
        await asyncio.wait({start})  # a second cancellation ends this wait, not the start
        if not start.cancelled():
            start.exception()  # read: the cancellation is what the caller gets
        raise


def _shutdown_on_own_thread(
    loop: asyncio.AbstractEventLoop, executor: Executor, name: str
) -> tuple[asyncio.Future, threading.Thread]:
    """Run `executor.shutdown()` (it waits for a running batch) on a thread of its own: (a future
    done when it returns, the thread).

    Not the loop's default pool: its few threads would queue the waits of many stuck models behind
    each other, and asyncio.run's end waits for that pool's threads. A daemon thread: one left
    waiting on a stuck batch must not hold the interpreter's exit.
    """
    end = loop.create_future()

    def settle(exc: BaseException | None) -> None:
        if end.done():  # the stop gave up on it
            return
        if exc is None:
            end.set_result(None)
        else:
            end.set_exception(exc)

    def run() -> None:
        exc = None
        try:
            executor.shutdown()
        except BaseException as e:  # handed to the stop, which raises it
            exc = e
        try:
            loop.call_soon_threadsafe(settle, exc)
        except RuntimeError:  # the loop has closed: nobody waits for it any more
            pass

    thread = threading.Thread(target=run, name=f"wok-{name}-shutdown", daemon=True)
    thread.start()
    return end, thread


def build_repository(settings: ServerSettings, demo_options: dict | None = None) -> ModelRepository:
    if settings.model_repository is not None:
        return ModelRepository.from_directory(settings.model_repository)
    return ModelRepository.demo(settings.demo_models, **(demo_options or {}))
