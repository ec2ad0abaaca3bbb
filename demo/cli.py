"""`wok demo`: a live page of the batching pipeline, with a rate control and fault injection.

Live (default): starts `wok serve --admin` as a child process on loopback with the `mlp`
model (two instances by default, so one can fail while the other serves), sends it an
open-loop Poisson load from this process, and serves the page. What the page shows is that
server's own event stream and these callers' answers. `--simulate`: no server; the batcher
simulator (wok.bench.simulate) runs at wall-clock pace instead, labelled so on the page.
"""

from __future__ import annotations

import asyncio
import errno
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from ..bench.arrivals import parse_duration
from ..bench.payloads import integer_refusal
from ..children import die_with_parent
from ..config import bind_address, check_device, host_port
from ..errors import quoted_name
from ..faults import MAX_QUEUE_DELAY_MS, AdminRequestError, check_number, shown
from ..models.limits import MAX_QUEUE_SIZE  # the built-in demo models' queue bound (wok.models imports no torch)
from .load import MAX_RATE, LoadControl, LoadGenerator

if TYPE_CHECKING:
    from .web import Hub

METRICS = re.compile(r"wok: metrics on http://(\S+):(\d+)/metrics")
SERVING = re.compile(r"wok: serving (.+) on (\S+):(\d+)")
MODEL = "mlp"
# The callers waiting at most: above the server's queue bound and the batches in hand, so that
# an overload shows as the server's own refusals; the cap only guards this process's memory.
MAX_IN_FLIGHT = 2 * MAX_QUEUE_SIZE
MAX_QUEUE_DELAY_S = MAX_QUEUE_DELAY_MS / 1e3  # the server's limit (ModelConfig, /admin/batching)
TMP_PREFIX = "wok-demo-"  # the live demo's temporary folder (its model repository), in tempfile.gettempdir()
PID_FILE = "demo.pid"  # in that folder: "PID START", the demo that owns it


def add_demo_parser(sub) -> None:
    p = sub.add_parser(
        "demo",
        help="a live page of the batching pipeline: rate control, batch settings, fault injection",
        description="Start a wok server (admin API on, the mlp model), a load generator, and a local page that "
        "shows requests, the queue, batches and why they flushed, each instance, throughput and P50/P95/P99 "
        "against the SLO, live. See docs/demo.md.",
    )
    p.add_argument("--host", default="127.0.0.1", help="address of the page (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8090, help="port of the page (default 8090; 0 picks a free one)")
    p.add_argument("--rate", type=float, default=100.0, help="starting arrival rate, requests/s (default 100)")
    p.add_argument("--instances", type=int, default=2, help="model instances (default 2)")
    p.add_argument("--max-batch-size", type=int, default=32, help="the model's largest batch (default 32)")
    p.add_argument("--max-queue-delay", default="5ms", help="starting delay window (default 5ms)")
    p.add_argument("--slo", default="50ms", help="the latency objective drawn on the page (default 50ms)")
    p.add_argument("--device", default="cpu", help="device of the instances: cpu, cuda, auto (default cpu)")
    p.add_argument("--torch-threads", type=int, default=1, help="torch threads of the server (default 1)")
    p.add_argument(
        "--simulate",
        action="store_true",
        help="teaching mode: no server; the batcher simulator (as wok simulate) runs at wall-clock pace",
    )
    # The defaults: mlp's fit in docs/profile.md, taken with 2 torch threads where the live demo's server
    # runs 1 (docs/demo.md: how to measure it at 1).
    p.add_argument(
        "--alpha", default="0.25ms", help="--simulate: time per batch (default mlp's with 2 torch threads, 0.25ms)"
    )
    p.add_argument(
        "--beta", default="0.044ms", help="--simulate: time per sample (default mlp's with 2 torch threads, 0.044ms)"
    )
    p.set_defaults(run=run_demo)


def run_demo(args) -> int:
    """The `wok demo` command; raises ValueError naming the option for a bad value (exit 2)."""
    for refusal in (
        integer_refusal("--instances", args.instances, 1, most=16),
        integer_refusal("--max-batch-size", args.max_batch_size, 1, most=1024),
        integer_refusal("--port", args.port, 0, most=65535),
    ):
        if refusal is not None:
            raise ValueError(refusal)
    if not 0 <= args.rate <= MAX_RATE:
        raise ValueError(f"--rate: expected requests per second from 0 to {MAX_RATE:g}; got {args.rate:g}")
    if (refusal := integer_refusal("--torch-threads", args.torch_threads, 1)) is not None:
        raise ValueError(refusal)
    try:
        check_device(args.device)
    except ValueError as exc:
        raise ValueError(f"--device: {exc}") from None
    host = check_host(args.host)
    delay_s = duration("--max-queue-delay", args.max_queue_delay)
    if delay_s > MAX_QUEUE_DELAY_S:
        raise ValueError(f"--max-queue-delay: expected at most {MAX_QUEUE_DELAY_S:g}s; got {args.max_queue_delay}")
    slo_s = duration("--slo", args.slo)
    if slo_s <= 0:
        raise ValueError(f"--slo: expected a duration above 0; got {args.slo}")
    # Here, not by the simulator's model: its message names α and β, not these options. A live
    # demo ignores both, so only their format is checked there.
    batch_time_s = duration("--alpha", args.alpha) + duration("--beta", args.beta)
    if args.simulate and batch_time_s <= 0:
        raise ValueError(
            f"--alpha and --beta: expected a batch time above 0 (--alpha + --beta > 0); "
            f"got --alpha {args.alpha} and --beta {args.beta}"
        )
    control = LoadControl(args.rate)
    try:
        return asyncio.run(_main(args, control, host, delay_s, slo_s))
    except (StartError, ServerExited) as exc:
        print(f"wok demo: {exc}", file=sys.stderr)
        return 1


def duration(option: str, text: str) -> float:
    """Seconds of a duration option; raises ValueError naming it. Never infinite: the page's
    JSON (JSON.parse) has no Infinity, and the simulator's model refuses one under its own names."""
    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        raise ValueError(f"{option}: {exc}") from None
    if not math.isfinite(seconds):
        raise ValueError(f"{option}: expected a finite duration; got {text}")
    return seconds


def check_host(host: str) -> str:
    """--host as the page listens on it, an IPv6 address in brackets ("[::1]") bare, as `wok serve`
    takes its --host (bind_address). Refused before anything starts, as there: empty (asyncio took ""
    for every address of the machine, the page at http://:PORT/), not printable, with a space, or
    longer than DNS's 253 characters (one of 100,000 was refused in IDNA's words, naming no option)."""
    try:
        return bind_address(host)
    except ValueError:
        raise ValueError(
            f"--host: expected an address or a host name of this machine; got {quoted_name(host)}"
        ) from None


def page_url(host: str, port: int) -> str:
    """The page's address; an IPv6 literal in brackets, as a URL needs it."""
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


def exit_text(status: int) -> str:
    """A child's end from its Popen returncode (negative: the signal that killed it)."""
    if status >= 0:
        return f"exited with status {status}"
    try:
        return f"was killed by {signal.Signals(-status).name}"
    except ValueError:
        return f"was killed by signal {-status}"


class StartError(RuntimeError):
    """The wok server child did not start; the message carries the end of its log. `status`: its
    exit status if it ended by itself (None if it was killed for taking too long), `log` its last lines."""

    def __init__(self, message: str, status: int | None = None, log: list[str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.log = log or []


class ServerExited(RuntimeError):
    """The wok server child ended while the demo ran; the message carries the end of its log."""


def listen_error(exc: OSError | UnicodeError, host: str, port: int) -> ValueError:
    """The option to blame when the page cannot listen."""
    if isinstance(exc, UnicodeError):  # IDNA's: a label over 63 characters, or an empty one ("a..b")
        return ValueError(f"--host: expected an address of this machine; got {quoted_name(host)} ({exc})")
    if isinstance(exc, socket.gaierror):
        return ValueError(f"--host: expected an address of this machine; got {quoted_name(host)} ({exc.strerror})")
    # asyncio's message repeats the address; the errno's own text is the one line needed.
    reason = os.strerror(exc.errno) if exc.errno else str(exc)
    if exc.errno == errno.EADDRNOTAVAIL:
        return ValueError(f"--host: expected an address of this machine; got {quoted_name(host)} ({reason})")
    return ValueError(f"--port: cannot listen on {host_port(host, port)}: {reason}")


async def _main(args, control: LoadControl, host: str, delay_s: float, slo_s: float) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # Here, not at the top: `wok` builds this subcommand's parser on every run, and the page's
    # server imports the server's admin routes, hence torch (2 s), which `wok bench` never uses.
    from .web import DemoWeb, Hub, tick_load

    hub = Hub()
    if args.simulate:
        from ..bench.simulate import BatcherModel
        from .sim import SimBackend

        model = BatcherModel(
            alpha_s=duration("--alpha", args.alpha),
            beta_s=duration("--beta", args.beta),
            max_batch_size=args.max_batch_size,
            max_queue_delay_s=delay_s,
            instances=args.instances,
            # The live server's bound: past it an arrival is refused (RESOURCE_EXHAUSTED), not queued.
            max_queue_size=MAX_QUEUE_SIZE,
        )
        backend = SimulatedDemo(SimBackend(control, model), slo_s)
    else:
        backend = LiveDemo(control, args, delay_s, slo_s)
    web = DemoWeb(backend, hub, host, args.port)
    try:
        # The page first: a port in use or a bad host is found before a server is started for nothing.
        try:
            await web.start()
        except (OSError, UnicodeError) as exc:
            raise listen_error(exc, host, args.port) from None
        if not await _start_unless_stopped(backend, hub, stop):
            return 0
        mode = "SIMULATION (no server)" if args.simulate else f"live, wok server at {backend.target}"
        print(f"wok demo: {mode}", file=sys.stderr, flush=True)
        print(f"wok demo: page at {page_url(host, web.port)}", file=sys.stderr, flush=True)
        if host not in ("127.0.0.1", "localhost", "::1"):
            print(
                f"wok demo: warning: the page on {host} lets anyone who reaches it fail and slow the server",
                file=sys.stderr,
                flush=True,
            )
        tasks = [asyncio.ensure_future(tick_load(hub, backend, stop))]
        await stop.wait()
        for t in tasks:
            t.cancel()
    finally:
        # A second Ctrl-C kills a server that does not drain (stopped, stuck) rather than waiting 15 s for it.
        again = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, again.set)
        await web.stop()
        await backend.close(again)
    if backend.failure is not None:
        raise backend.failure
    return 0


async def _start_unless_stopped(backend, hub: Hub, stop: asyncio.Event) -> bool:
    """Start the backend; False if a signal came first. The live start waits up to minutes for
    the server's imports and warm-up, and a Ctrl-C meanwhile must end it then, not after."""
    start = asyncio.ensure_future(backend.start(hub, stop))
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({start, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
    if stop.is_set():
        start.cancel()  # the live start then kills its server; close() removes its files
        await asyncio.gather(start, return_exceptions=True)
        return False
    start.result()
    return True


def spawn_wok(
    cmd: list[str], patterns: dict[str, re.Pattern], timeout_s: float
) -> tuple[subprocess.Popen, dict[str, re.Match], list[str]]:
    """Start a `wok` child process and wait until its stderr has matched every pattern.

    Returns the process, the first match of each pattern, and its stderr lines (the last 200,
    kept up to date by a thread); raises StartError with the log if it ends or times out first.
    """
    proc = popen_wok(cmd)
    found, log = wait_for_patterns(proc, patterns, timeout_s)
    return proc, found, log


def popen_wok(cmd: list[str]) -> subprocess.Popen:
    """Start a `wok` child that gets SIGTERM when the thread calling this ends (Linux), so that
    a demo killed outright (SIGKILL) does not leave its server running."""
    return subprocess.Popen(
        cmd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        preexec_fn=die_with_parent(),
    )


def wait_for_patterns(
    proc: subprocess.Popen, patterns: dict[str, re.Pattern], timeout_s: float, ended: threading.Event | None = None
) -> tuple[dict[str, re.Match], list[str]]:
    """Read the child's stderr (by a thread, for good) until every pattern matched; see spawn_wok.
    `ended`, if given, is set once the thread has read all of it (the child closed it)."""
    log: list[str] = []
    found: dict[str, re.Match] = {}
    ready = threading.Event()

    def pump() -> None:
        for line in proc.stderr:
            log.append(line.rstrip())
            del log[:-200]
            for key, pat in patterns.items():
                m = pat.search(line)
                if m and key not in found:
                    found[key] = m
            if len(found) == len(patterns):
                ready.set()
        ready.set()
        if ended is not None:
            ended.set()

    threading.Thread(target=pump, daemon=True, name="wok-child-log").start()
    if not ready.wait(timeout_s) or len(found) < len(patterns):
        status = None
        if ready.is_set():  # its log ended: it is exiting, and its status says why (2: a setting refused)
            try:
                status = proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
        proc.kill()
        how = "" if status is None else f" ({exit_text(status)})"
        raise StartError(f"{' '.join(proc.args[2:4])} did not start{how}:\n" + "\n".join(log[-30:]), status, log[-30:])
    return found, log


class SimulatedDemo:
    def __init__(self, sim, slo_s: float) -> None:
        self.sim = sim
        self.control = sim.control
        self.slo_s = slo_s
        self._task: asyncio.Task | None = None
        self.target = None
        self.failure = None  # nothing here can end on its own

    def config(self) -> dict:
        m = self.sim.model
        batching = self.sim.batching()
        return {
            "mode": "simulate",
            # The simulator's name for its model (sim.MODEL), as its ticks and batching answers give it.
            "model": batching["model"],
            "instances": m.instances,
            "slo_ms": self.slo_s * 1e3,
            "alpha_ms": m.alpha_s * 1e3,
            "beta_ms": m.beta_s * 1e3,
            "batching": batching,
            "load": self.control.describe(),
            "faults": False,
        }

    async def start(self, hub: Hub, stop: asyncio.Event) -> None:
        async def run() -> None:
            # Steps every 50 ms (answers reach the rolling figures promptly), ticks every 250 ms as the server's.
            last_tick = 0.0
            while not stop.is_set():
                events, tick = self.sim.step()
                for e in events:
                    hub.publish(e)
                if time.monotonic() - last_tick >= 0.25:
                    hub.publish(tick)
                    last_tick = time.monotonic()
                await asyncio.sleep(0.05)

        self._task = asyncio.ensure_future(run())

    async def close(self, again: asyncio.Event | None = None) -> None:
        if self._task is not None:
            self._task.cancel()

    async def set_batching(self, body) -> tuple[int, dict]:
        return 200, self.sim.set_batching(body)

    async def set_faults(self, body) -> tuple[int, dict]:
        return 400, {"error": "faults are not modelled by the simulator; run wok demo without --simulate"}

    def load_summary(self) -> dict:
        # The simulator sends every arrival: its `skipped` stays 0, the field is there for the page.
        return {**self.sim.stats.summary(time.monotonic()), **self.control.describe()}


def write_repository(root: Path, instances: int, max_batch_size: int, delay_ms: float, device: str) -> Path:
    """A model repository holding `mlp` (the demo model's network) with the demo's instance count."""
    d = root / MODEL
    d.mkdir(parents=True)
    config = {
        "platform": "python",
        "factory": "wok.models.mlp:MLP",
        "max_batch_size": max_batch_size,
        "parameters": {"in_features": 256, "hidden": 1024, "out_features": 256, "layers": 2},
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "dims": [256]}],
        "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "dims": [256]}],
        "dynamic_batching": {"max_queue_delay_ms": delay_ms, "max_queue_size": MAX_QUEUE_SIZE},
        "instances": {"count": instances, "devices": [device]},
    }
    (d / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return root


def process_start(pid: int) -> str | None:
    """When process `pid` started (Linux: /proc/PID/stat's starttime, in clock ticks since boot), None
    if there is none. With the pid it names one process: a pid reused since names another start."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    except OSError:  # no /proc (not Linux): only whether the pid is in use can be told
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:  # another user's: alive
            pass
        return ""
    # The fields after the command's ")" (which may itself hold spaces or parentheses) start at the 3rd.
    return stat.rsplit(")", 1)[1].split()[19]


def write_pid_file(folder: Path) -> None:
    """Mark `folder` as this process's while it runs (see remove_stale_folders)."""
    pid = os.getpid()
    part = folder / (PID_FILE + ".part")
    part.write_text(f"{pid} {process_start(pid)}\n")
    part.replace(folder / PID_FILE)  # whole or absent: a demo sweeping meanwhile never reads half of it


def remove_stale_folders(tmp: Path) -> list[Path]:
    """Remove the temporary folders in `tmp` of demos that no longer run; returns those removed.

    Only this user's folders with a pid file whose process is gone, or whose pid now names another
    process (its start time differs), are removed. A folder without a pid file is left alone: its
    demo may be between creating it and writing the file, or be a demo from before pid files.
    """
    removed = []
    for folder in tmp.glob(TMP_PREFIX + "*"):
        try:
            if folder.is_symlink() or not folder.is_dir() or folder.stat().st_uid != os.getuid():
                continue
            pid, start = (folder / PID_FILE).read_text().split()
            pid_n = int(pid)
        except (OSError, ValueError):  # no pid file (yet), or not a demo's
            continue
        now = process_start(pid_n)
        if now is not None and (now == "" or start in ("", now)):
            continue  # that demo still runs
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    return removed


# The longest server event the live demo relays to its page (one line of JSON).
EVENT_LINE_LIMIT = 4 * 1024 * 1024


class LiveDemo:
    """A `wok serve --admin` child process, the load generator, and the relay of its /events."""

    def __init__(self, control: LoadControl, args, delay_s: float, slo_s: float) -> None:
        self.control = control
        self.args = args
        self.delay_s = delay_s
        self.slo_s = slo_s
        self.proc: subprocess.Popen | None = None
        self.log: list[str] = []
        self._log_ended = threading.Event()
        self.failure: ServerExited | None = None
        self.target = ""
        self.admin: tuple[str, int] = ("127.0.0.1", 0)
        self.generator: LoadGenerator | None = None
        self._tasks: list[asyncio.Task] = []
        # First: the folders of demos killed outright (SIGKILL), which cannot remove their own.
        remove_stale_folders(Path(tempfile.gettempdir()))
        self._tmp = tempfile.TemporaryDirectory(prefix=TMP_PREFIX)
        write_pid_file(Path(self._tmp.name))
        self._channel = None

    def config(self) -> dict:
        return {
            "mode": "live",
            "model": MODEL,
            "instances": self.args.instances,
            "slo_ms": self.slo_s * 1e3,
            "server": {"grpc": self.target, "admin": f"http://{host_port(*self.admin)}"},
            "load": self.control.describe(),
            "faults": True,
        }

    async def start(self, hub: Hub, stop: asyncio.Event) -> None:
        import grpc
        import numpy as np

        from ..codec import encode_request
        from ..v2pb import grpc_service_pb2_grpc as pb_grpc

        a = self.args
        repo = write_repository(Path(self._tmp.name), a.instances, a.max_batch_size, self.delay_s * 1e3, a.device)
        cmd = [sys.executable, "-m", "wok", "serve", "--admin", "--host", "127.0.0.1", "--port", "0"]
        cmd += ["--metrics-port", "0", "--model-repository", str(repo), "--torch-threads", str(a.torch_threads)]
        cmd += ["--grace-period", "5"]
        # Started on this (the loop's) thread, which lives as long as the demo: see popen_wok.
        self.proc = popen_wok(cmd)
        try:
            await asyncio.get_running_loop().run_in_executor(None, self._wait_started)
        except asyncio.CancelledError:
            # Stopped while starting: the thread waiting for its log ends with the server.
            self.proc.kill()
            raise
        self._channel = grpc.aio.insecure_channel(self.target)
        stub = pb_grpc.GRPCInferenceServiceStub(self._channel)
        rng = np.random.default_rng(1)
        request = encode_request(MODEL, {"INPUT0": rng.standard_normal((1, 256), dtype=np.float32)})

        async def send() -> str:
            try:
                await stub.ModelInfer(request, timeout=10.0)
                return "OK"
            except grpc.aio.AioRpcError as e:
                return e.code().name

        self.generator = LoadGenerator(self.control, send, max_in_flight=MAX_IN_FLIGHT)
        self._tasks = [
            asyncio.ensure_future(self.generator.run()),
            asyncio.ensure_future(self._relay(hub, stop)),
            asyncio.ensure_future(self._watch(stop)),
        ]

    def _wait_started(self) -> None:
        patterns = {"metrics": METRICS, "serving": SERVING}
        try:
            found, self.log = wait_for_patterns(self.proc, patterns, 180.0, ended=self._log_ended)
        except StartError as exc:
            if exc.status == 2:  # `wok serve` refused a setting made from the demo's options
                raise self._refusal(exc.log) from None
            raise
        self.admin = (found["metrics"].group(1), int(found["metrics"].group(2)))
        self.target = f"{found['serving'].group(2)}:{found['serving'].group(3)}"

    def _refusal(self, log: list[str]) -> ValueError:
        """The server's one-line refusal (its last `wok: ` line) as the demo's own: exit 2, one line,
        naming --device for a device it lacks (--device cuda on a machine without CUDA), rather than
        the model config file the demo wrote."""
        line = next((ln for ln in reversed(log) if ln.startswith("wok: ")), log[-1] if log else "no message")
        line = line.removeprefix("wok: ").replace(f"{Path(self._tmp.name) / MODEL / 'config.yaml'}: ", "")
        if line.startswith("instances.devices:"):
            return ValueError(f"--device: the wok server refused {quoted_name(self.args.device)}: {line}")
        return ValueError(f"the wok server refused its settings: {line}")

    async def _watch(self, stop: asyncio.Event) -> None:
        """Stop the demo, with the server's last words, if the server ends before the demo does:
        without it, the page would go on showing UNAVAILABLE answers and the relay retrying."""
        status = await asyncio.get_running_loop().run_in_executor(None, self._wait_exit)
        if stop.is_set():  # the demo is stopping (a Ctrl-C reaches the server too)
            return
        self.failure = ServerExited(
            f"the wok server at {self.target} {exit_text(status)} while the demo ran; the end of its log:\n"
            + "\n".join(self.log[-30:])
        )
        stop.set()

    def _wait_exit(self) -> int:
        status = self.proc.wait()
        # Its last lines may still be in the pipe, on their way to the log.
        self._log_ended.wait(2.0)
        return status

    async def _relay(self, hub: Hub, stop: asyncio.Event) -> None:
        """Relay the server's /events to the page, reconnecting if the stream breaks."""
        host, port = self.admin
        while not stop.is_set():
            writer = None
            try:
                # An event is one line: asyncio's 64 KiB line limit made readline raise ValueError on a
                # longer one (a tick of many models), which ended the relay for good, silently.
                reader, writer = await asyncio.open_connection(host, port, limit=EVENT_LINE_LIMIT)
                # host:port, an IPv6 address bracketed (RFC 9110 7.2): the admin port refuses `::1` with 400.
                writer.write(f"GET /events HTTP/1.1\r\nHost: {host_port(host, port)}\r\n\r\n".encode())
                await reader.readuntil(b"\r\n\r\n")
                while True:
                    line = await reader.readline()
                    if not line:
                        break
                    if line.startswith(b"data: "):
                        hub.publish_raw(line[6:].rstrip(b"\n"))
            except (OSError, ValueError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
                pass  # a line over even this limit too: the stream is read afresh
            finally:
                if writer is not None:  # each reconnection left its socket open
                    writer.close()
            await asyncio.sleep(0.5)

    async def close(self, again: asyncio.Event | None = None) -> None:
        """Stop the load, then the server: SIGTERM, then SIGKILL after 15 s, or at once once `again` is set."""
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._channel is not None:
            await self._channel.close()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            exited = asyncio.get_running_loop().run_in_executor(None, self._wait_drained)
            hurry = asyncio.ensure_future((again or asyncio.Event()).wait())
            await asyncio.wait({exited, hurry}, return_when=asyncio.FIRST_COMPLETED)
            hurry.cancel()
            if self.proc.poll() is None:
                self.proc.kill()
            await exited
        self._tmp.cleanup()

    def _wait_drained(self) -> None:
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            pass

    async def _admin(self, path: str, body) -> tuple[int, dict | bytes]:
        """The admin API's answer to a POST of `body`, the model added (see web.http_json).

        The model is the demo's: the page controls the one model the demo serves, and need not name
        it. A body that names another is refused here, as the simulated demo refuses it, rather than
        passed on (the body's "model" went over the demo's) or overridden (its change would then
        be made to the demo's model, which it did not ask for)."""
        if not isinstance(body, dict):
            raise AdminRequestError(f"body: expected a JSON object; got {shown(body)}")
        if "model" in body and body["model"] != MODEL:
            raise AdminRequestError(
                f"field 'model': expected '{MODEL}' (the demo's model) or none; got {shown(body['model'])}"
            )
        if self.admin[1] == 0:
            # The page is served from before the server starts (a port in use is found first), and
            # a tab left open on it asks meanwhile: it got 502, "did not answer" from port 0.
            starting = "got one still starting: try again once it serves"
            return 503, {"error": f"POST {path}: expected a wok server that serves; {starting}"}
        from .web import http_json

        return await http_json(*self.admin, "POST", path, {**body, "model": MODEL})

    async def set_batching(self, body) -> tuple[int, dict | bytes]:
        return await self._admin("/admin/batching", body)

    async def set_faults(self, body) -> tuple[int, dict | bytes]:
        # The admin API takes a 0 ms slow fault (a no-op); from the page it is an emptied field. Read
        # here, not at import: the admin's one bound, as `check_max_queue_delay_ms` reads its own.
        from ..faults import MAX_DELAY_MS

        if isinstance(body, dict) and body.get("mode") == "slow":
            check_number("delay_ms", body.get("delay_ms"), 0, MAX_DELAY_MS, above=True, when="for mode 'slow'")
        return await self._admin("/admin/faults", body)

    def load_summary(self) -> dict:
        return {**self.generator.stats.summary(time.monotonic()), **self.control.describe()}
