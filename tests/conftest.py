"""Fixtures shared by every test folder: a real wok server on a loopback port.

`server_process` runs `python -m wok serve` as a child process (what a user runs), for
tests that need a separate process (signals, tritonclient). `serve` starts a WokServer
inside the test's own event loop, for tests that also look at its internals.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from wok.entry import GRPC_DEFAULTS  # imports nothing of gRPC's: the setting below is read as grpc loads

# As `wok` sets it, before any test imports grpc: the demo and replica tests fork children with a
# preexec_fn, and gRPC's fork handlers killed about 1 in 100 of them.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", GRPC_DEFAULTS["GRPC_ENABLE_FORK_SUPPORT"])

# Files whose tests measure times or rates against bounds (latency agreement, throughput, CPU per
# request, pacing, recovery times): marked `serial`, so that `bootstrap.py test` runs them alone,
# after the rest of the suite on two workers, whose load would move what they measure. A file whose
# other tests time nothing marks its timing tests alone (`@pytest.mark.serial`, its reasons in the file).
SERIAL_FILES = frozenset(
    {
        # Its 0.2 s windows need calls in them: beside a second worker the harness's server, a 2 ms
        # hog in each loop pass, answered none in one (CI, 2026-12-05), and wakeups per call divided by 0.
        "bench/test_accept_rate.py",
        "bench/test_balancer_overhead.py",
        "bench/test_batcher_loop_cost.py",
        "bench/test_ceiling.py",
        "bench/test_chaos.py",
        "bench/test_cold_batch.py",
        "bench/test_queue_memory.py",
        "bench/test_ramp.py",
        "bench/test_refusal_cost.py",
        "bench/test_server_timing.py",
        "bench/test_soak.py",
        "bench/test_stream_vs_unary.py",
        "demo/test_demo.py",
        "demo/test_page_controls.py",
        "integration/test_cpu_wakeup_latency.py",
        "integration/test_large_typed_requests.py",
        "integration/test_overload_and_shutdown.py",
        "integration/test_prometheus_scrape.py",
        "integration/test_replicas.py",
        # Holds the machine's CPU wake-up bound (/dev/cpu_dma_latency) and checks it is back to what it was,
        # which a second worker's `wok serve --cpu-wakeup-latency` would move (test_compare's WAKEUP_BOUND).
        # (Timers and flushes to the sub-millisecond are serial too, marked alone in server/test_batcher.py,
        # test_timers.py, test_loopmon.py and test_slo_policy.py.)
        "server/test_cpulatency.py",
    }
)


def _in_serial_files(path: Path) -> bool:
    # A path from outside tests/ (given to pytest, --doctest-modules) is not in it.
    here = Path(__file__).parent
    return path.is_relative_to(here) and path.relative_to(here).as_posix() in SERIAL_FILES


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _in_serial_files(item.path):
            item.add_marker(pytest.mark.serial)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """`bootstrap.py test`'s two passes (`-m serial`, `-m "not serial"`) leave out, uncollected, the
    files whose every test the pass would deselect: collecting (importing) all 150-odd files took
    16-19 s of the serial pass on a slow host, the serial files alone 6-7 s. A file outside
    SERIAL_FILES is kept for `-m serial` if it says `mark.serial` (a test marked on its own)."""
    markexpr = " ".join(config.getoption("markexpr", "").split())
    if markexpr not in ("serial", "not serial") or collection_path.suffix != ".py":
        return None
    if not collection_path.name.startswith("test_") or not collection_path.is_relative_to(Path(__file__).parent):
        return None
    serial = _in_serial_files(collection_path)
    if markexpr == "not serial":
        return True if serial else None
    return True if not serial and "mark.serial" not in collection_path.read_text(encoding="utf-8") else None


def _utf8_safe(value):
    """`value` with each string that UTF-8 cannot encode (a lone surrogate) in backslash escapes."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return value.encode("utf-8", "backslashreplace").decode("utf-8")
        return value
    if isinstance(value, dict):
        return {_utf8_safe(k): _utf8_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_utf8_safe(v) for v in value)
    return value


@pytest.hookimpl(wrapper=True)
def pytest_report_to_serializable(config: pytest.Config, report) -> dict:
    """A pytest-xdist worker sends each test's report, captured output and log included, through
    execnet, which refuses a string that is not UTF-8 ("DumpError: strings must be utf-8 encodable"):
    a test whose server logged a name of undecodable bytes (os.fsdecode's lone surrogate) crashed
    its worker, an INTERNALERROR that ended the whole run. Such text is sent escaped, as the
    messages wok writes show it."""
    return _utf8_safe((yield))


@pytest.hookimpl(tryfirst=True)
def pytest_warning_recorded(warning_message) -> None:
    """As for reports, for a warning: a worker sends it apart from them (xdist's `warning_recorded`,
    its text as `str(message)`), and one naming undecodable bytes crashed the worker all the same.
    Its text goes escaped, its category kept; in a run without workers it is printed as it was."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return
    text = str(warning_message.message)
    safe = _utf8_safe(text)
    if safe is not text:
        warning_message.message = safe


READY = re.compile(r"wok: serving (.+) on (\S+):(\d+)")
# Small demo sizes keep start-up fast; the defaults are what `wok serve` uses.
SMALL_DEMO = ["--demo-option", "recsys.num_embeddings=20000"]
SMALL_DEMO_OPTIONS = {"recsys": {"num_embeddings": 20000}}

# A shell without job control (`pytest ... &` in a script, `bash -c '... &'`) starts pytest with
# SIGINT ignored, and an ignored signal stays ignored across exec: the `wok bench` children that
# tests interrupt with SIGINT would never see it. A handler (Python's own here) is reset to the
# default at exec, so the children get Ctrl-C as a user's shell gives it.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
# Under nohup, SIGHUP is ignored, and wok (serve and bench) keeps an ignored SIGHUP ignored, as
# nohup asks: the tests that stop a wok with SIGHUP, in this process or a child, would wait for it in
# vain. A handler that does nothing keeps this process through a hangup, as nohup meant, and is reset
# to the default at exec, so the children get SIGHUP as a terminal's closing gives it.
if signal.getsignal(signal.SIGHUP) is signal.SIG_IGN:
    signal.signal(signal.SIGHUP, lambda signum, frame: None)


@dataclass
class ServerProcess:
    proc: subprocess.Popen
    host: str
    port: int
    models: list[str]
    log: list[str] = field(default_factory=list)
    # Notified with each line appended to `log` (by the thread that reads the server's stderr).
    lines: threading.Condition = field(default_factory=threading.Condition)
    # Set once that thread has read stderr to its end: `log` then holds every line the process wrote.
    log_read: threading.Event = field(default_factory=threading.Event)

    @property
    def target(self) -> str:
        return f"{self.host}:{self.port}"

    def wait_for_line(self, prefix: str, timeout: float = 30.0) -> str:
        """The first line of the log that starts with `prefix`, once the server has printed it.

        The fixtures return at the ready line; lines printed after it may not be read yet.
        """

        def first() -> str | None:
            return next((line for line in self.log if line.startswith(prefix)), None)

        with self.lines:
            if not self.lines.wait_for(lambda: first() is not None, timeout):
                raise AssertionError(
                    f"no line starting with {prefix!r} within {timeout} s:\n" + "\n".join(self.log[-20:])
                )
            return first()

    def http_url(self) -> str:
        """The base URL of its metrics (and admin) HTTP port: "http://host:port"."""
        line = self.wait_for_line("wok: metrics on http://")
        return line.split("metrics on ")[1].rsplit("/metrics", 1)[0]

    def terminate(self, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)


# `python -c NOHUP_EXEC ARGS` runs `python ARGS` with SIGHUP ignored, as nohup starts a command: the
# disposition is set in the child, so the starting process (any thread of it) keeps its own, and an
# ignored signal stays ignored across the exec. The process keeps its pid.
NOHUP_EXEC = (
    "import os, signal, sys; signal.signal(signal.SIGHUP, signal.SIG_IGN); "
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
)


def start_server_process(*args: str, timeout: float = 120.0, sighup_ignored: bool = False) -> ServerProcess:
    """Start `python -m wok serve --port 0 ARGS` and wait for its ready line; with `sighup_ignored`,
    started with SIGHUP ignored, as under nohup (NOHUP_EXEC)."""
    cmd = [sys.executable, "-m", "wok", "serve", "--port", "0", "--metrics-port", "0", *args]
    if sighup_ignored:
        cmd = [sys.executable, "-c", NOHUP_EXEC, *cmd[1:]]
    # The server's own gRPC log level (the `wok` command's default), not one of this test run's environment.
    env = {k: v for k, v in os.environ.items() if k != "GRPC_VERBOSITY"} | {"PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    log: list[str] = []
    lines = threading.Condition()
    found: list[re.Match] = []
    ready = threading.Event()
    log_read = threading.Event()

    def pump() -> None:
        for line in proc.stderr:
            with lines:
                log.append(line.rstrip())
                lines.notify_all()
            m = READY.search(line)
            if m and not found:
                found.append(m)
                ready.set()
        log_read.set()
        ready.set()

    threading.Thread(target=pump, daemon=True).start()
    if not ready.wait(timeout) or not found:
        proc.kill()
        raise RuntimeError(f"server did not start: {' '.join(cmd)}\n" + "\n".join(log[-40:]))
    m = found[0]
    return ServerProcess(proc, m.group(2), int(m.group(3)), m.group(1).split(", "), log, lines, log_read)


@pytest.fixture(scope="session")
def server_process_start() -> Iterator[Callable[[], Future]]:
    """`server_process_start()`: the start of the session's server (`server_process`) as a future, begun
    at the first call. A module fixture that starts servers of its own begins it beside them: each
    start is seconds, mostly imports, and two overlap on two CPUs. Killed at the session's end if no
    test took it (those that did stop it through `server_process`)."""
    begun: list[Future] = []
    lock = threading.Lock()

    def start() -> Future:
        with lock:
            if not begun:
                pool = ThreadPoolExecutor(1)
                begun.append(pool.submit(start_server_process, *SMALL_DEMO))
                pool.shutdown(wait=False)
            return begun[0]

    yield start
    if begun and begun[0].exception() is None and begun[0].result().proc.poll() is None:
        begun[0].result().proc.kill()
        begun[0].result().proc.wait()


@pytest.fixture(scope="session")
def server_process(server_process_start) -> Iterator[ServerProcess]:
    """One `wok serve` process with the three demo models, shared by the session."""
    sp = server_process_start().result()
    yield sp
    code = sp.terminate()
    assert code == 0, "\n".join(sp.log[-40:])


def _starter():
    """A start function that remembers what it started, and a cleanup that stops it all."""
    started: list[ServerProcess] = []

    def start(*args: str, **options) -> ServerProcess:
        sp = start_server_process(*args, **options)
        started.append(sp)
        return sp

    def cleanup(graceful: bool) -> None:
        for sp in started:
            if sp.proc.poll() is None:
                if graceful:
                    sp.terminate()
                else:
                    sp.proc.kill()
                    sp.proc.wait()

    return start, cleanup


@pytest.fixture
def start_server():
    """`start_server(*args)`: a `wok serve` process of the test's own; killed if left running."""
    start, cleanup = _starter()
    yield start
    cleanup(graceful=False)


@asynccontextmanager
async def running_server(models=("mlp", "recsys", "encoder"), repository=None, **settings) -> AsyncIterator:
    """A WokServer on a free loopback port inside the current event loop."""
    from wok.app import WokServer, build_repository
    from wok.config import server_settings

    settings.setdefault("metrics_port", 0)
    settings.setdefault("grpc_port", 0)  # a given one: a server started again where another one stopped
    s = server_settings(demo_models=tuple(models), model_repository=repository, **settings)
    server = WokServer(s, build_repository(s, SMALL_DEMO_OPTIONS))
    await server.start()
    try:
        yield server
    finally:
        await server.stop(grace=5.0)
        for rt in server.runtimes.values():
            assert rt.batcher.queued == 0 and rt.batcher.inflight == 0, f"{rt.servable.name} left work behind"


@pytest.fixture
def serve():
    """`async with serve(models=..., **settings) as server:` a server in this test's loop."""
    return running_server


class ServedInThread:
    """`running_server(**settings)`, a WokServer on loopback, in a thread of its own with an event
    loop of its own, as a separate `wok serve` would have: the test's loop (or the call it blocks
    in) runs none of the server's work. For tests of what a client does, where the server process
    is no subject: a `wok serve` child's start is mostly its imports, seconds each. `stop()` drains
    and stops it as SIGTERM does `wok serve`; its ports are closed when it returns, and it raises
    what the stop raised (`running_server`'s check that no work was left behind included)."""

    def __init__(self, **settings) -> None:
        import asyncio
        from concurrent.futures import Future

        self.loop = asyncio.new_event_loop()
        started: Future = Future()

        async def main() -> None:
            self._stopping = asyncio.Event()
            try:
                async with running_server(**settings) as server:
                    started.set_result(server)
                    await self._stopping.wait()
            except BaseException as exc:
                if not started.done():
                    started.set_exception(exc)
                raise

        self.error: BaseException | None = None

        def run() -> None:
            try:
                self.loop.run_until_complete(main())
            except BaseException as exc:  # raised by stop(): a stop that failed, or work left behind
                self.error = exc

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        self.server = started.result(timeout=120)
        self.port = self.server.port
        self.target = f"127.0.0.1:{self.port}"

    def http_url(self) -> str:
        """The base URL of its metrics HTTP port, as ServerProcess.http_url gives it."""
        return f"http://127.0.0.1:{self.server.http.port}"

    def stop(self, timeout: float = 30.0) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self._stopping.set)
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"the server on {self.target} did not stop within {timeout} s"
        self.loop.close()
        if self.error is not None:
            raise self.error


@pytest.fixture
def serve_in_thread():
    """`serve_in_thread(**settings)`: a ServedInThread (its `running_server` settings); stopped at
    the test's end if left running."""
    started: list[ServedInThread] = []

    def start(**settings) -> ServedInThread:
        started.append(ServedInThread(**settings))
        return started[-1]

    yield start
    for s in started:
        s.stop()


SLOW_MODEL = textwrap.dedent(
    """
    import time

    import torch
    from torch import nn


    class SlowDouble(nn.Module):
        # Sleeps per batch so that a burst really queues; raises on NaN so tests can make a
        # batch fail on purpose.
        def __init__(self, sleep_ms: float) -> None:
            super().__init__()
            self.sleep_s = sleep_ms / 1e3
            self.forwards = 0  # warm-up included

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.forwards += 1
            time.sleep(self.sleep_s)
            if torch.isnan(x).any():
                raise ValueError("NaN in batch")
            return x * 2


    def build(sleep_ms: float = 20.0) -> nn.Module:
        return SlowDouble(sleep_ms)
    """
)


def _toml(value) -> str:
    """`value` written as TOML: the numbers, strings, booleans and lists these configs hold."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return str(value)


# A python model whose answer is far larger than its request (for the send limit's tests):
# build(width) repeats each row's first value `width` times.
REPEAT_MODEL = """
from torch import nn


class Repeat(nn.Module):
    # Each row's first value, `width` times: an answer far larger than the request.
    def __init__(self, width: int) -> None:
        super().__init__()
        self.width = width

    def forward(self, x):
        return x[:, :1].repeat(1, self.width)


def build(width: int) -> nn.Module:
    return Repeat(width)
"""


def python_model_config(
    max_batch_size: int | None = 4,
    *,
    dims: int = 4,
    out_dims: int | None = None,
    parameters: dict | None = None,
    dynamic_batching: dict | None = None,
    devices: tuple[str, ...] | None = ("cpu",),
) -> str:
    """A python model's config.toml in the layout the docs show, for the model that model.py's
    `build(**parameters)` makes: one FP32 input INPUT0 of `dims` values, one FP32 output OUTPUT0 of
    `out_dims` (`dims` if None).

    The top-level keys (`max_batch_size` None leaves it out), then the [[inputs]] and [[outputs]]
    tables; [dynamic_batching] only when given, and [instances] on `devices` unless None (the
    server's default). With neither, the text ends in the [[outputs]] table.
    """
    lines = ['platform = "python"', 'factory = "model:build"']
    if max_batch_size is not None:
        lines.append(f"max_batch_size = {max_batch_size}")
    if parameters:
        lines.append("parameters = { " + ", ".join(f"{k} = {_toml(v)}" for k, v in parameters.items()) + " }")
    for table, name, n in (("inputs", "INPUT0", dims), ("outputs", "OUTPUT0", dims if out_dims is None else out_dims)):
        lines += ["", f"[[{table}]]", f'name = "{name}"', 'datatype = "FP32"', f"dims = [{n}]"]
    if dynamic_batching is not None:
        lines += ["", "[dynamic_batching]", *(f"{k} = {_toml(v)}" for k, v in dynamic_batching.items())]
    if devices is not None:
        lines += ["", "[instances]", f"devices = {_toml(devices)}"]
    return "\n".join(lines) + "\n"


async def cancel_after(start, steps: int) -> bool:
    """Cancel the task `start` after `steps` more loop iterations and wait for it to end; whether it had
    finished before the cancellation. Raises what it raised, other than the cancellation."""
    import asyncio

    for _ in range(steps):
        await asyncio.sleep(0)
    finished = start.done()
    start.cancel()
    try:
        await start
    except asyncio.CancelledError:
        pass
    return finished


async def until(condition, what: str, within_s: float = 15.0) -> None:
    """Yield to the loop (1 ms at a time) until `condition()` holds; fail after `within_s` seconds, saying `what`.

    A bound in seconds, not in tries: a try lasts the 1 ms sleep and whatever else the loop runs in it
    (1.1-1.2 ms on an idle 2-CPU host, more on a loaded one), so a count of 10,000 bounded nothing a
    failure could name. 15 s is more than those 10,000 tries took on that host."""
    import asyncio
    import time

    end = time.monotonic() + within_s
    while not condition():
        if time.monotonic() >= end:
            raise AssertionError(f"never within {within_s:g} s: {what}")
        await asyncio.sleep(0.001)


def _channelz_servers() -> list[dict]:
    """The gRPC core servers alive in this process (created, not yet destroyed), as channelz lists them."""
    from grpc._cython import cygrpc  # channelz: no public API lists them

    return json.loads(cygrpc.channelz_get_servers(0)).get("server", [])


def core_servers() -> int:
    """gRPC core servers alive in this process, as channelz lists them (created, not yet destroyed)."""
    return len(_channelz_servers())


def core_calls_started() -> int:
    """Calls the gRPC core servers alive in this process have started (channelz's callsStarted): the calls
    that reached a server, which a client whose deadline passed before it sent its call's headers did not."""
    return sum(int(s.get("data", {}).get("callsStarted", 0)) for s in _channelz_servers())


def write_python_model(folder: Path, model_py: str, max_batch_size: int | None = 4, **config) -> Path:
    """`folder` (made, with its parents) holding `model_py` as model.py and
    `python_model_config(max_batch_size, **config)` as config.toml."""
    folder.mkdir(parents=True)
    (folder / "model.py").write_text(model_py)
    (folder / "config.toml").write_text(python_model_config(max_batch_size, **config))
    return folder


def write_slow_model(
    root: Path, name="slow", *, sleep_ms=20.0, max_batch_size=4, delay_ms=1.0, max_queue_size=0, preferred=()
) -> Path:
    batching = {"max_queue_delay_ms": delay_ms, "max_queue_size": max_queue_size, "preferred_batch_sizes": preferred}
    write_python_model(
        root / name, SLOW_MODEL, max_batch_size, parameters={"sleep_ms": sleep_ms}, dynamic_batching=batching
    )
    return root


@contextmanager
def started_at_once(start, args: dict) -> Iterator[dict]:
    """`{key: start(*args[key])}`, the processes started at once (a start is mostly a process's
    imports). Each test stops its own; one still running on leaving (its test failed or never ran)
    is killed here."""
    servers: dict = {}
    try:
        with ThreadPoolExecutor(max(len(args), 1)) as pool:
            starts = {key: pool.submit(start, *a) for key, a in args.items()}
        servers = {key: started.result() for key, started in starts.items()}
        yield servers
    finally:
        for sp in servers.values():
            if sp.proc.poll() is None:
                sp.proc.kill()
                sp.proc.wait()


@pytest.fixture(scope="session")
def at_once():
    """`with at_once(start, {key: args}) as servers:` (`started_at_once`), for module fixtures."""
    return started_at_once


@pytest.fixture(scope="session")
def write_slow():
    """`write_slow(root, **options)`: `write_slow_model`, for a fixture wider than one test."""
    return write_slow_model


@pytest.fixture
def slow_repository(tmp_path):
    """`slow_repository(**options)` → a repository folder holding the slow model."""

    def make(**options) -> Path:
        return write_slow_model(tmp_path / "repo", **options)

    return make


@pytest.fixture(scope="module")
def start_server_module():
    """Like `start_server`, for a server shared by one test module; stopped with SIGTERM."""
    start, cleanup = _starter()
    yield start
    cleanup(graceful=True)


@pytest.fixture
def cpu_latency_before() -> int:
    """The machine's CPU wake-up latency bound (µs) as the test starts, for tests of wok.cpulatency.

    Skips where /dev/cpu_dma_latency cannot be opened for writing (it is root's by default, and a
    container may not have it), or where another process already holds a bound of 1 µs or less, so
    that a request of the test's own could not be told apart. Opening the device without writing
    adds no bound."""
    from wok.cpulatency import DEVICE, read_constraint

    try:
        os.close(os.open(DEVICE, os.O_WRONLY))
    except OSError as exc:
        pytest.skip(f"{DEVICE} cannot be opened for writing here: {exc.strerror}")
    before = read_constraint()
    if before <= 1:
        pytest.skip(f"another process holds the CPUs' wake-up bound at {before} µs")
    return before


@pytest.fixture
def wok_cli(capsys):
    """Run `wok ARGS...` in this process: (exit status, stdout, stderr).

    For commands that end before they start anything (option refusals): a `python -m wok` child
    costs seconds of imports each. Anything but an exit status, a traceback included, raises out
    of the call and fails the test. Not for `wok serve`, which picks the process's event loop.
    """
    from wok.__main__ import main

    def run(*args: str) -> tuple[int, str, str]:
        assert args and args[0] != "serve", "wok serve runs in a child process (start_server)"
        try:
            status = main(list(args))
        except SystemExit as exc:  # argparse's own refusals
            status = exc.code
        out, err = capsys.readouterr()
        return status, out, err

    return run


class ProcTree:
    """Linux /proc readings of a process tree, for tests about orphans and death signals."""

    @staticmethod
    def children(pid: int, tid: int | None = None) -> list[int]:
        """The child processes of `pid`, or of its thread `tid` only (the one that forked them)."""
        found = []
        for t in [tid] if tid is not None else os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{t}/children") as f:
                found += [int(c) for c in f.read().split()]
        return found

    @staticmethod
    def alive(pid: int) -> bool:
        """Whether `pid` runs; a zombie has ended."""
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] != "Z"
        except FileNotFoundError:
            return False


@pytest.fixture
def proc_tree() -> type[ProcTree]:
    return ProcTree


async def _raw_http(port: int, request: bytes) -> bytes:
    """Send raw bytes to 127.0.0.1:`port`; what comes back until the server closes (or 5 s pass)."""
    import asyncio

    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        return await asyncio.wait_for(reader.read(), 5)
    finally:
        writer.close()


@pytest.fixture
def raw_http():
    """An HTTP exchange in raw bytes, for requests a well-behaved client would not send."""
    return _raw_http
